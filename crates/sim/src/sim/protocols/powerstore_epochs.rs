//! M-PoWerStore registers across reconfigurations: the epochs of [`super::reconfig`]'s schedule
//! (joins, departures, one in and one out, a whole group replaced in one epoch), every node
//! hosting the real `EpochHost<powerstore::epochs::Registers>`, which takes each key whose group
//! changed over into its new incarnation by reading the previous one and confirming among the
//! new members, and every client operation a [`Routed`] M-PoWerStore read or write that starts in
//! the genesis epoch and follows the replicas' word into newer ones (a write cut after its nonce
//! was revealed ends "outcome unknown", step 4 of docs/state-transfer.md being unbuilt). Each
//! register's history is checked for linearizability.
//!
//! Not simulated yet: crashes (a restarted node must restore each incarnation's server from its
//! store, and a member restarted between carrying a version in and its confirmation must come
//! back holding the key back, which needs a durable mark; neither is built), faulty old members
//! that lie in their answers to take-overs, and two-faced new members; a faulty node here is
//! silent.

use super::powerstore::{describe_request, describe_response, request_kind};
use super::reconfig::{learned, learns, schedule};
use crate::byzantine::Behaviour;
use crate::durable::DurableState;
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::membership::{Arc as RingArc, Chain, Incarnation, RingPoint};
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Epoch, Key, MacKey, NodeId, Slot, Time};
use bulwark_protocol::machine::{Access, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::powerstore::epochs::{Peer, Registers, Stored, Stores};
use bulwark_protocol::powerstore::{
    ClientConfig, ClientMutations, OpId, Pid, ReadOp, Request, Response, ServerKeys, StoredKey,
    Timestamp, WriteOp, WriterIdentity,
};
use bulwark_protocol::transfer::{
    Change, EpochHost, KindChange, Message, Resume, Routed, Transfer, TransferMutations, keys_after,
};
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// One run's cluster: the chain of configurations, when each epoch starts, and the keys nodes
/// and writers agree.
pub struct PowerStoreReconfigSim {
    f: usize,
    chain: Arc<Chain>,
    /// When each epoch starts (the genesis at 0).
    starts: Vec<u64>,
    mutations: TransferMutations,
    client_mutations: ClientMutations,
    /// Each node's keys shared with the writers, by node id.
    node_keys: Vec<ServerKeys>,
    /// Each client's identity, by client index.
    writers: Vec<Arc<WriterIdentity>>,
    codec: Arc<dyn ErasureCodec>,
}

/// One node's disk: a store per incarnation, the newest epoch it entered and the arcs it
/// finished pulling.
#[derive(Default)]
pub struct EpochsDisk {
    stores: HashMap<Incarnation, DurableState>,
    /// Every key with state in some store.
    keys: BTreeSet<Key>,
    entered: Epoch,
    pulled: BTreeSet<(Epoch, RingArc)>,
}

/// A node: the real machine, and how it learns certified configurations in this world.
pub struct EpochsNode {
    inner: EpochHost<Registers>,
    behaviour: Behaviour,
    chain: Arc<Chain>,
    /// When this node learns each epoch by itself.
    learns: Vec<u64>,
    mutations: TransferMutations,
}

impl EpochsNode {
    /// Enters every epoch up to `epoch`, one at a time.
    fn catch_up(&mut self, epoch: Epoch) -> Output<EpochsNode> {
        let mut output = Output::none();
        while self.inner.epoch() < epoch.min(self.chain.latest()) {
            let next = Epoch(self.inner.epoch().0 + 1);
            let Some(ring) = self.chain.ring(next) else {
                break;
            };
            output = output.and(self.inner.enter(ring.clone()).retyped());
        }
        output
    }
}

impl Replica for EpochsNode {
    const SERVICE: bulwark_core::ServiceId = <EpochHost<Registers> as Replica>::SERVICE;
    type Request = Request;
    type Reply = Response;
    type Message = Message<Registers>;
    type Change = KindChange<Registers>;
    type View = dyn Stores;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        view: &Self::View,
    ) -> Output<EpochsNode> {
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        // A client's request names its epoch: the sender pushes the certificate (spec §4.5).
        let caught_up = self.catch_up(request.epoch);
        caught_up.and(
            self.inner
                .on_request(now, client, access, request, view)
                .retyped(),
        )
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<Registers>,
        view: &Self::View,
    ) -> Output<EpochsNode> {
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        let caught_up = match &message {
            Transfer::List { epoch, .. } if !self.mutations.answer_without_entering => {
                self.catch_up(*epoch)
            }
            Transfer::Peer { epoch, .. } => self.catch_up(*epoch),
            _ => Output::none(),
        };
        caught_up.and(self.inner.on_message(now, from, message, view).retyped())
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &Self::View) -> Output<EpochsNode> {
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        self.inner.on_timer(now, timer, view).retyped()
    }

    fn on_tick(&mut self, now: Time) -> Output<EpochsNode> {
        let caught_up = self.catch_up(learned(&self.learns, now));
        caught_up.and(self.inner.on_tick(now).retyped())
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}

impl PowerStoreReconfigSim {
    fn node(&self, inner: EpochHost<Registers>, index: usize, behaviour: Behaviour) -> EpochsNode {
        EpochsNode {
            inner: inner.with_mutations(self.mutations),
            behaviour,
            chain: self.chain.clone(),
            learns: learns(&self.starts, index),
            mutations: self.mutations,
        }
    }

    fn kind(&self, index: usize) -> Registers {
        Registers::new(
            NodeId(index as u32),
            self.chain.genesis().clone(),
            self.node_keys[index].clone(),
            self.codec.clone(),
        )
    }

    /// A client's view of `key`'s group at the genesis.
    fn genesis_config(&self, key: &Key) -> ClientConfig {
        let point = RingPoint::of_key(key.as_bytes());
        let genesis = self.chain.genesis().epoch();
        let (view, incarnation) = self
            .chain
            .incarnation(genesis, point)
            .unwrap_or_else(|| unreachable!("the genesis places every key"));
        ClientConfig {
            epoch: genesis,
            group: view.id(),
            incarnation,
            mutations: self.client_mutations,
            ..ClientConfig::new(self.f)
        }
    }
}

impl Protocol for PowerStoreReconfigSim {
    type Request = Request;
    type Response = Response;
    type Change = KindChange<Registers>;
    type Disk = EpochsDisk;
    type Server = EpochsNode;
    type Write = Routed<WriteOp>;
    type Read = Routed<ReadOp>;

    /// Long enough for the last epoch's take-overs to finish before the run is judged.
    const SETTLE_MILLIS: u64 = 10_000;

    /// Twice a group: room for nodes to join, leave, and for a whole group to be replaced.
    fn nodes(f: usize) -> usize {
        2 * (3 * f + 1)
    }

    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults
            .behaviours
            .retain(|behaviour| *behaviour == Behaviour::Silent);
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults.nemeses.remove(&Nemesis::Crashes);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Self {
        let nodes = Self::nodes(config.f);
        let (rings, starts) = schedule(rng, config.f, nodes);
        let node_secrets: Vec<SecretKey> = (0..nodes)
            .map(|_| SecretKey::from_seed(&rng.random()))
            .collect();
        let timestamp = MacKey(rng.random());
        let writers: Vec<Arc<WriterIdentity>> = (0..config.clients)
            .map(|_| {
                Arc::new(WriterIdentity {
                    signing: SecretKey::from_seed(&rng.random()),
                    timestamp: timestamp.clone(),
                })
            })
            .collect();
        let node_keys = node_secrets
            .iter()
            .map(|node| {
                let writers = writers.iter().enumerate();
                ServerKeys::derived(
                    node,
                    writers.map(|(i, w)| (ClientId(i as u32), w.signing.public_key())),
                )
            })
            .collect();
        let signing = node_secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| (NodeId(i as u32), secret.public_key()));
        let chain = Chain::new(rings.into_iter().map(Arc::new).collect()).with_keys(signing);
        PowerStoreReconfigSim {
            f: config.f,
            chain: Arc::new(chain),
            starts,
            mutations: config.mutations.transfer,
            client_mutations: config.mutations.client,
            node_keys,
            writers,
            codec: Arc::new(ReedSolomonSimd),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, _seed: u64) -> EpochsNode {
        let inner = EpochHost::new(
            NodeId(index as u32),
            self.chain.genesis().clone(),
            self.kind(index),
        );
        self.node(inner, index, behaviour)
    }

    fn restore(&self, index: usize, disk: &EpochsDisk, _now: u64) -> EpochsNode {
        let me = NodeId(index as u32);
        let kind = self.kind(index);
        let inner = EpochHost::resume(me, &self.chain, kind, disk.entered, &disk.pulled);
        self.node(inner, index, Behaviour::Honest)
    }

    fn view(storage: &Storage<Self>) -> &(dyn Stores + 'static) {
        storage
    }

    fn persist(disk: &mut EpochsDisk, change: &KindChange<Registers>) {
        match change {
            Change::Own(Stored::Server {
                incarnation,
                change,
            }) => {
                let key = match change {
                    bulwark_protocol::powerstore::Change::PutHist { key, .. }
                    | bulwark_protocol::powerstore::Change::DeleteHist { key, .. }
                    | bulwark_protocol::powerstore::Change::SetLc { key, .. } => key,
                };
                disk.keys.insert(key.clone());
                disk.stores.entry(*incarnation).or_default().apply(change);
            }
            Change::Entered(epoch) => disk.entered = disk.entered.max(*epoch),
            Change::Pulled { epoch, arc } => {
                disk.pulled.insert((*epoch, *arc));
            }
            Change::Put { entry, .. } | Change::Remove { entry, .. } => match *entry {},
            // Registers drop nothing yet.
            Change::Drop { .. } => {}
        }
    }

    fn disk_versions(disk: &EpochsDisk) -> usize {
        disk.stores.values().map(DurableState::versions).sum()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        rng: &mut ChaCha8Rng,
    ) -> Routed<WriteOp> {
        let point = RingPoint::of_key(key.as_bytes());
        let config = self.genesis_config(&key);
        let identity = self.writers[client].clone();
        let members = self.chain.genesis().group_at(point);
        let keys = identity
            .keys_for(members.members(), &self.chain)
            .unwrap_or_else(|| unreachable!("the chain certifies every node's key"));
        let write = WriteOp::new(
            config,
            Arc::new(keys),
            self.codec.clone(),
            key,
            op,
            Pid {
                writer: ClientId(client as u32),
                seq: op.0,
            },
            rng.random(),
            value,
        )
        .following(identity);
        Routed::new(
            write,
            point,
            self.chain.clone(),
            self.chain.genesis().epoch(),
        )
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> Routed<ReadOp> {
        let point = RingPoint::of_key(key.as_bytes());
        let config = self.genesis_config(&key);
        let read = ReadOp::new(config, self.codec.clone(), key, op);
        Routed::new(
            read,
            point,
            self.chain.clone(),
            self.chain.genesis().epoch(),
        )
    }

    fn response_op(response: &Response) -> OpId {
        response.op
    }

    fn request_name(request: &Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &Request) -> usize {
        request_kind(&request.body)
    }

    fn describe_request(request: &Request) -> String {
        format!("e{} {}", request.epoch.0, describe_request(request))
    }

    fn describe_response(response: &Response) -> String {
        describe_response(response)
    }

    fn describe_message(message: &Message<Registers>) -> String {
        match message {
            Transfer::List { epoch, after, .. } => {
                format!("list e{} after={}", epoch.0, after.is_some())
            }
            Transfer::Listed {
                epoch, keys, more, ..
            } => format!("listed e{} keys={} more={more}", epoch.0, keys.len()),
            Transfer::Peer {
                epoch,
                message: Peer::Ask { side, request },
            } => format!(
                "e{} ask {side:?} e{} {}",
                epoch.0,
                request.epoch.0,
                describe_request(request)
            ),
            Transfer::Peer {
                epoch,
                message:
                    Peer::Answer {
                        side,
                        key,
                        response,
                    },
            } => format!(
                "e{} answer {side:?} key={key} {}",
                epoch.0,
                describe_response(response)
            ),
            other => format!("{other:?}"),
        }
    }
}

/// A node's stores as its driver shows them: the disk, then the changes on their way to it.
impl Storage<PowerStoreReconfigSim> {
    fn pending_of<'a>(
        &'a self,
        incarnation: &'a Incarnation,
    ) -> impl DoubleEndedIterator<Item = &'a bulwark_protocol::powerstore::Change> {
        self.pending().filter_map(move |change| match change {
            Change::Own(Stored::Server {
                incarnation: at,
                change,
            }) if at == incarnation => Some(change),
            _ => None,
        })
    }
}

impl Stores for Storage<PowerStoreReconfigSim> {
    fn stored_key(&self, incarnation: &Incarnation, key: &Key) -> StoredKey {
        let pending = self.pending_of(incarnation);
        match self.durable.stores.get(incarnation) {
            Some(store) => store.key_after(pending, key),
            None => DurableState::new().key_after(pending, key),
        }
    }

    fn fragment(&self, incarnation: &Incarnation, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        let pending = self.pending_of(incarnation);
        match self.durable.stores.get(incarnation) {
            Some(store) => store.fragment_after(pending, key, ts),
            None => DurableState::new().fragment_after(pending, key, ts),
        }
    }

    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key> {
        let pending = self.pending().filter_map(|change| match change {
            Change::Own(Stored::Server { change, .. }) => Some(match change {
                bulwark_protocol::powerstore::Change::PutHist { key, .. }
                | bulwark_protocol::powerstore::Change::DeleteHist { key, .. }
                | bulwark_protocol::powerstore::Change::SetLc { key, .. } => key.clone(),
            }),
            _ => None,
        });
        let keys = self.durable.keys.iter().cloned().chain(pending);
        keys_after::<Registers>(keys, resume, limit)
    }
}
