//! Causal volumes (Depot) on the node that serves them: one [`Served`] per volume this node is a
//! server member of, all under one node-wide replica (`(DEPOT, NODE_WIDE)`), a frame's group the
//! low bits of the volume's number ([`depot::served::group_of`]).
//!
//! A volume is opened by a client with its configuration, whose number is the hash of the rest:
//! the node checks that it is a server of it and that every member's key is a node's or a
//! client's of `cluster.toml`, records the configuration, and serves it from then on, restored
//! at every start. A volume's changes are records of its own namespace: accepted updates by
//! acceptance number (so they are accepted again in the same order), values by hash, fork
//! proofs by writer. Restoring verifies every update again: a disk is not trusted more than a
//! peer.

use crate::host::{Adapter, Effects, Hosted, Hosting, Members, NODE_WIDE, merge};
use bulwark_core::config::ClusterConfig;
use bulwark_core::envelope::{Envelope, Header};
use bulwark_core::sign::SecretKey;
use bulwark_core::wire::{self, FRAME_BYTES_MAX};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::depot::records::{self, Recorder};
use bulwark_protocol::depot::served::{self, Peers, Request, Served};
use bulwark_protocol::depot::{self, Change, Node, Role, Values, VolumeConfig};
use bulwark_protocol::machine::{Access, Replica, ReplicaStats, TimerId};
use bulwark_storage::{Namespace, StorageOp, Store};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;

/// Causal volumes one node serves at most.
pub const VOLUMES_MAX: usize = 256;
/// The node-wide table of the configurations of the volumes served, by group (4 bytes,
/// big-endian).
pub const CONFIGS: &str = "configs";

/// The bytes of values one volume keeps in memory by default; the rest are read back from the
/// store when asked for ([`depot::hoard`]).
pub const RESIDENT_VALUE_BYTES: u64 = 32 * 1024 * 1024;

/// One volume's records, and its values as the replica reads them back: those recorded and not
/// yet durable, then the store.
pub struct DepotStorage {
    namespace: Namespace,
    recorder: Recorder,
    store: Arc<Store>,
    /// Values recorded in batches not yet durable, with the batch carrying each.
    unsynced: HashMap<Digest, (u64, Bytes)>,
}

impl Adapter<Served> for DepotStorage {
    const NAME: &'static str = "depot";

    fn record(&mut self, change: &Change, batch: u64, ops: &mut Vec<StorageOp>) {
        match change {
            Change::Value(value) => {
                self.unsynced
                    .insert(depot::update::value_hash(value), (batch, value.clone()));
            }
            Change::Discard(hash) => {
                self.unsynced.remove(hash);
            }
            _ => {}
        }
        for record in self.recorder.record(change) {
            let table = self.namespace.table(record.table);
            ops.push(StorageOp::set(table, record.key, record.value));
        }
    }

    fn view(&self) -> &(dyn Values + 'static) {
        self
    }

    fn durable(&mut self, batch: u64) {
        self.unsynced
            .retain(|_, (carried_by, _)| *carried_by > batch);
    }
}

impl Values for DepotStorage {
    fn value(&self, hash: &Digest) -> Option<Bytes> {
        if let Some((_, value)) = self.unsynced.get(hash) {
            return Some(value.clone());
        }
        let table = self.namespace.table(records::VALUES);
        match self.store.get(table, &hash.0) {
            Ok(value) => value,
            Err(error) => {
                tracing::error!(%error, "a causal volume's value does not read back");
                None
            }
        }
    }
}

/// What the records of `namespace` say, in the order to restore them, values named by hash and
/// length with their bytes left in the store; or why they cannot be a volume's.
pub fn restore(store: &Store, namespace: Namespace) -> Result<(Vec<Change>, Recorder), String> {
    let load = |table| {
        store
            .load(namespace.table(table))
            .map_err(|error| error.to_string())
    };
    let lengths = |table| {
        let mut lengths = Vec::new();
        store
            .scan(namespace.table(table), |hash, value| {
                lengths.push((hash.to_vec(), value.len() as u64));
                Ok(())
            })
            .map_err(|error| error.to_string())?;
        Ok(lengths)
    };
    records::restore(records::Tables::load_leaving_values(load, lengths)?)
}

type VolumeReplica = Hosting<Served, DepotStorage>;

/// Every causal volume this node serves.
pub struct Depots {
    me: NodeId,
    secret: SecretKey,
    cluster: Arc<ClusterConfig>,
    store: Arc<Store>,
    epoch: Epoch,
    wall_at_zero_ms: u64,
    /// The bytes of values each volume keeps in memory.
    resident_bytes: u64,
    volumes: HashMap<u32, VolumeReplica>,
    /// Volumes whose records could not be restored, and why: refused, never served empty.
    damaged: HashMap<u32, String>,
}

/// Which node or client of `cluster` holds each member's key; an error names a member that
/// none does, or whose role is not what holds its key.
pub fn peers(cluster: &ClusterConfig, config: &VolumeConfig) -> Result<Peers, String> {
    let mut peers = Peers::default();
    for (index, member) in config.members.iter().enumerate() {
        let writer = depot::Writer(index as u32);
        let key = member.key.to_bytes();
        match member.role {
            Role::Server => {
                let node = cluster
                    .nodes
                    .iter()
                    .find(|node| node.signing_key == key)
                    .ok_or_else(|| format!("server member {index}'s key is no node's"))?;
                peers.nodes.insert(writer, NodeId(node.id));
            }
            Role::Client => {
                let client = cluster
                    .clients
                    .iter()
                    .find(|client| client.signing_key == Some(key))
                    .ok_or_else(|| format!("client member {index}'s key is no client's"))?;
                peers.clients.insert(ClientId(client.id), writer);
            }
        }
    }
    Ok(peers)
}

/// Each member's name in `cluster`: its client's name, or `node N`.
fn member_names(cluster: &ClusterConfig, config: &VolumeConfig) -> Vec<(u32, String)> {
    config
        .members
        .iter()
        .enumerate()
        .filter_map(|(index, member)| {
            let key = member.key.to_bytes();
            let name = match member.role {
                Role::Server => cluster
                    .nodes
                    .iter()
                    .find(|node| node.signing_key == key)
                    .map(|node| format!("node {}", node.id)),
                Role::Client => cluster
                    .clients
                    .iter()
                    .find(|client| client.signing_key == Some(key))
                    .map(|client| client.name.clone()),
            }?;
            Some((index as u32, name))
        })
        .collect()
}

impl Depots {
    /// The causal volumes of node `me`, restored from `store`: `secret` is the node's signing
    /// key; `wall_at_zero_ms` the wall clock at its shards' time zero; each volume keeps the
    /// bytes of at most `resident_bytes` of values in memory.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        me: NodeId,
        secret: SecretKey,
        cluster: Arc<ClusterConfig>,
        store: Arc<Store>,
        epoch: Epoch,
        wall_at_zero_ms: u64,
        resident_bytes: u64,
        now: Time,
    ) -> Result<Depots, String> {
        let mut depots = Depots {
            me,
            secret,
            cluster,
            store,
            epoch,
            wall_at_zero_ms,
            resident_bytes,
            volumes: HashMap::new(),
            damaged: HashMap::new(),
        };
        let table = Namespace::new(ServiceId::DEPOT, NODE_WIDE).table(CONFIGS);
        let records = depots.store.load(table).map_err(|e| e.to_string())?;
        for (group, record) in records {
            let group = <[u8; 4]>::try_from(group.as_slice())
                .map(u32::from_be_bytes)
                .map_err(|_| "a causal volume's group is not 4 bytes".to_string())?;
            let config: VolumeConfig = wire::decode(&record, FRAME_BYTES_MAX)
                .map_err(|error| format!("causal volume {group}'s configuration: {error}"))?;
            if let Err(problem) = depots.open(group, config, now) {
                tracing::error!(group, %problem, "a causal volume does not restore");
                depots.damaged.insert(group, problem);
            }
        }
        Ok(depots)
    }

    /// Serves `config` under `group` from its records.
    fn open(&mut self, group: u32, config: VolumeConfig, now: Time) -> Result<(), String> {
        config.check().map_err(|problem| problem.to_string())?;
        let me = config
            .member_with(&self.secret.public_key())
            .filter(|writer| config.member(*writer).map(|m| m.role) == Some(Role::Server))
            .ok_or_else(|| format!("node {} is not a server of the volume", self.me.0))?;
        let peers = peers(&self.cluster, &config)?;
        let namespace = Namespace::new(ServiceId::DEPOT, GroupId(group));
        let (changes, recorder) = restore(&self.store, namespace)
            .map_err(|problem| format!("the volume's stored state is damaged: {problem}"))?;
        let volume = config.volume;
        let adapter = DepotStorage {
            namespace,
            recorder,
            store: self.store.clone(),
            unsynced: HashMap::new(),
        };
        let node = Node::restore_with(
            Arc::new(config),
            me,
            self.secret.clone(),
            &changes,
            self.wall_at_zero_ms
                .saturating_add(now.0)
                .saturating_mul(1000),
            Some(self.resident_bytes),
            &adapter,
        );
        tracing::info!(
            volume = format!("{:016x}", volume.0),
            updates = node.log().len(),
            "causal volume served"
        );
        self.volumes.insert(
            group,
            Hosting {
                replica: Served::new(node, peers, self.wall_at_zero_ms),
                adapter,
                members: Members::ById,
                slot: Slot(self.me.0),
                header: Header::request(ServiceId::DEPOT, GroupId(group), self.epoch, 0),
            },
        );
        Ok(())
    }

    /// A client's request to serve `config`: checked, recorded, then served.
    fn open_asked(
        &mut self,
        now: Time,
        access: Access,
        config: VolumeConfig,
        header: &Header,
    ) -> Effects {
        let group = served::group_of(config.volume).0;
        let volume = config.volume;
        let answer = |reply: served::Reply, refused: Option<String>, ops: Vec<StorageOp>| Effects {
            ops,
            reply: Some(bulwark_core::envelope::frame(&header.reply(), &reply)),
            refused,
            ..Effects::default()
        };
        let refuse = |reason: String| {
            answer(
                served::Reply::Refused {
                    reason: reason.clone(),
                },
                Some(reason),
                Vec::new(),
            )
        };
        if let Some(served) = self.volumes.get(&group) {
            return if **served.replica.config() == config {
                answer(served::Reply::Opened { volume }, None, Vec::new())
            } else {
                refuse(format!(
                    "group {group} serves another volume on node {}",
                    self.me.0
                ))
            };
        }
        if let Some(why) = self.damaged.get(&group) {
            return refuse(why.clone());
        }
        if !access.write {
            return refuse("only clients that may write open volumes".into());
        }
        if self.volumes.len() >= VOLUMES_MAX {
            return refuse(format!(
                "node {} serves {VOLUMES_MAX} causal volumes already",
                self.me.0
            ));
        }
        let record = Bytes::from(wire::encode(&config));
        if let Err(problem) = self.open(group, config, now) {
            return refuse(problem);
        }
        let ops = vec![StorageOp::Put {
            table: Namespace::new(ServiceId::DEPOT, NODE_WIDE).table(CONFIGS),
            key: group.to_be_bytes().to_vec(),
            value: record,
        }];
        answer(served::Reply::Opened { volume }, None, ops)
    }

    /// The volume served under `group`, or why there is none.
    fn volume(&mut self, group: u32) -> Result<&mut VolumeReplica, String> {
        if let Some(why) = self.damaged.get(&group) {
            return Err(why.clone());
        }
        self.volumes
            .get_mut(&group)
            .ok_or_else(|| format!("no causal volume of group {group} is served here"))
    }

    /// Each volume's configuration and node, for status.
    pub fn served(&self) -> impl Iterator<Item = &Served> + '_ {
        self.volumes.values().map(|hosting| &hosting.replica)
    }
}

impl Hosted for Depots {
    fn service_name(&self) -> &'static str {
        <DepotStorage as Adapter<Served>>::NAME
    }

    fn slot(&self) -> Slot {
        Slot(self.me.0)
    }

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        envelope: &Envelope,
        batch: u64,
    ) -> Effects {
        let request = match envelope.body::<Request>(FRAME_BYTES_MAX) {
            Ok(request) => request,
            Err(error) => {
                return Effects {
                    refused: Some(format!("malformed request: {error}")),
                    ..Effects::default()
                };
            }
        };
        let group = match &request {
            Request::Open { config } => {
                return self.open_asked(now, access, config.clone(), &envelope.header);
            }
            Request::Exchange { volume, .. } => served::group_of(*volume).0,
        };
        match self.volume(group) {
            Ok(hosting) => {
                let output = hosting.replica.on_request(
                    now,
                    client,
                    access,
                    request,
                    hosting.adapter.view(),
                );
                hosting.effects(output, Some(&envelope.header), batch)
            }
            Err(reason) => Effects {
                reply: Some(bulwark_core::envelope::frame(
                    &envelope.header.reply(),
                    &served::Reply::Refused {
                        reason: reason.clone(),
                    },
                )),
                refused: Some(reason),
                ..Effects::default()
            },
        }
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        match self.volume(envelope.header.group.0) {
            Ok(hosting) => hosting.on_message(now, from, envelope, batch),
            Err(reason) => Effects {
                refused: Some(reason),
                ..Effects::default()
            },
        }
    }

    fn on_timer(&mut self, _now: Time, _timer: TimerId, _batch: u64) -> Effects {
        Effects::default()
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let mut effects = Effects::default();
        for hosting in self.volumes.values_mut() {
            effects = merge(effects, hosting.on_tick(now, batch));
        }
        effects
    }

    fn durable(&mut self, batch: u64) {
        for hosting in self.volumes.values_mut() {
            hosting.durable(batch);
        }
    }

    fn causal_status(&self) -> Vec<bulwark_protocol::service::CausalStatus> {
        self.served()
            .map(|served| {
                let mut status = served.status();
                status.names = member_names(&self.cluster, served.config());
                status
            })
            .collect()
    }

    fn stats(&self) -> ReplicaStats {
        let mut totals = ReplicaStats::default();
        for hosting in self.volumes.values() {
            totals.add(&hosting.replica.stats());
        }
        totals
    }
}
