//! Single-server volumes (A2M-Storage, A2M §4.2) on the node that serves them: one
//! `a2m_storage::Server` per volume, each restored from its own storage namespace the first time
//! a client asks for it, all under one node-wide replica (`(A2M_STORAGE, NODE_WIDE)`) so that
//! the dispatcher needs no table of volumes. A frame's group is the volume's number.
//!
//! A volume's logs in the node's trusted log are `LOGS_BASE + 2v` and the next; its changes are
//! records like any replica's: the objects, the last write (version block, write hash,
//! timestamp) and the hashes of the last `RECENT_WRITES` writes. What a server lends the node
//! back is restored from exactly those.

use crate::host::{Adapter, Effects, Hosted, Hosting, Members, NODE_WIDE, merge};
use bulwark_core::envelope::{Envelope, Header};
use bulwark_core::sign::PublicKey;
use bulwark_core::wire::{self, FRAME_BYTES_MAX};
use bulwark_core::{ClientId, Epoch, GroupId, Key, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::a2m_storage::{self, Change, Disk, RECENT_WRITES, Server, Version, Volume};
use bulwark_protocol::machine::{Access, Attested, ReplicaStats, TimerId};
use bulwark_storage::{Namespace, StorageOp, Store};
use bytes::Bytes;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Volumes one node serves at most: two logs each, within the trusted log's 256.
pub const VOLUMES_MAX: usize = 100;
/// A volume's objects: key bytes to value.
pub const OBJECTS: &str = "objects";
/// A volume's last write: one record, [`LAST_RECORD`].
pub const LAST: &str = "last";
/// The record of [`LAST`].
pub const LAST_RECORD: &[u8] = b"last";
/// The hashes of a volume's recent writes, by write number (8 bytes, big-endian).
pub const RECENT: &str = "recent";

/// One volume's records.
pub struct VolumeStorage {
    pub namespace: Namespace,
}

impl Adapter<Server> for VolumeStorage {
    const NAME: &'static str = "a2m-storage";

    fn record(&mut self, change: &Change, _batch: u64, ops: &mut Vec<StorageOp>) {
        let seq = change.timestamp.seq;
        ops.push(match &change.value {
            Some(value) => StorageOp::Put {
                table: self.namespace.table(OBJECTS),
                key: change.key.as_bytes().to_vec(),
                value: value.clone(),
            },
            None => StorageOp::Delete {
                table: self.namespace.table(OBJECTS),
                key: change.key.as_bytes().to_vec(),
            },
        });
        ops.push(StorageOp::Put {
            table: self.namespace.table(LAST),
            key: LAST_RECORD.to_vec(),
            value: Bytes::from(wire::encode(&(
                &change.version,
                &change.request,
                &change.timestamp,
            ))),
        });
        ops.push(StorageOp::Put {
            table: self.namespace.table(RECENT),
            key: seq.to_be_bytes().to_vec(),
            value: Bytes::copy_from_slice(&change.request),
        });
        if seq > RECENT_WRITES {
            ops.push(StorageOp::Delete {
                table: self.namespace.table(RECENT),
                key: (seq - RECENT_WRITES).to_be_bytes().to_vec(),
            });
        }
    }

    fn view(&self) -> &() {
        &()
    }
}

/// What the records of `namespace` say, or why they cannot be a volume's.
pub fn restore(store: &Store, namespace: Namespace) -> Result<Disk, String> {
    let mut disk = Disk::default();
    let failed = |error: bulwark_storage::StorageError| error.to_string();
    for (record, value) in store.load(namespace.table(OBJECTS)).map_err(failed)? {
        let key = Key::new(record).map_err(|error| format!("an object's key: {error}"))?;
        disk.objects.insert(key, value);
    }
    if let Some(value) = store
        .get(namespace.table(LAST), LAST_RECORD)
        .map_err(failed)?
    {
        let last: (Version, [u8; 32], a2m_storage::Timestamp) =
            wire::decode(&value, FRAME_BYTES_MAX)
                .map_err(|error| format!("the last write's record: {error}"))?;
        disk.last = Some(last);
    }
    let mut recent = VecDeque::new();
    for (record, value) in store.load(namespace.table(RECENT)).map_err(failed)? {
        let seq = <[u8; 8]>::try_from(record.as_slice())
            .map(u64::from_be_bytes)
            .map_err(|_| "a recent write's number is not 8 bytes".to_string())?;
        let hash = <[u8; 32]>::try_from(value.as_ref())
            .map_err(|_| format!("recent write {seq}'s hash is not 32 bytes"))?;
        recent.push_back((hash, seq));
    }
    // Records are in key order, which is write order; any beyond the window are from a crash
    // between a write and its window's delete.
    while recent.len() as u64 > RECENT_WRITES {
        recent.pop_front();
    }
    disk.recent = recent;
    let at = disk
        .last
        .as_ref()
        .map_or(0, |(_, _, timestamp)| timestamp.seq);
    if disk.last.is_none() && !disk.objects.is_empty() {
        return Err("objects are stored but no write is".into());
    }
    if disk.recent.back().map(|(_, seq)| *seq) != disk.last.as_ref().map(|_| at) {
        return Err(format!(
            "the recent writes do not end at the last write ({at})"
        ));
    }
    Ok(disk)
}

type VolumeReplica = Hosting<Server, VolumeStorage>;

/// Every single-server volume this node serves.
pub struct Volumes {
    me: NodeId,
    log_key: PublicKey,
    writers: Arc<Vec<PublicKey>>,
    store: Arc<Store>,
    epoch: Epoch,
    servers: HashMap<u32, VolumeReplica>,
    /// Volumes whose records could not be restored, and why: refused, never served empty.
    damaged: HashMap<u32, String>,
    /// The token this host gave each batch in flight: its volume and the server's own token.
    tokens: HashMap<u64, (u32, u64)>,
    next_token: u64,
}

impl Volumes {
    /// The volumes of node `me`, whose trusted log has `log_key`; the cluster's `writers`.
    pub fn new(
        me: NodeId,
        log_key: PublicKey,
        writers: Vec<PublicKey>,
        store: Arc<Store>,
        epoch: Epoch,
    ) -> Volumes {
        Volumes {
            me,
            log_key,
            writers: Arc::new(writers),
            store,
            epoch,
            servers: HashMap::new(),
            damaged: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 1,
        }
    }

    /// Volume `number`'s server, restored from its records the first time it is asked for.
    fn server(&mut self, number: u32) -> Result<&mut VolumeReplica, String> {
        if let Some(why) = self.damaged.get(&number) {
            return Err(why.clone());
        }
        if number == NODE_WIDE.0 {
            return Err(format!("{number} is no volume's number"));
        }
        let count = self.servers.len();
        let entry = match self.servers.entry(number) {
            Entry::Occupied(served) => return Ok(served.into_mut()),
            Entry::Vacant(entry) => entry,
        };
        if count >= VOLUMES_MAX {
            return Err(format!(
                "node {} serves {VOLUMES_MAX} volumes already",
                self.me.0
            ));
        }
        let namespace = Namespace::new(ServiceId::A2M_STORAGE, GroupId(number));
        let disk = match restore(&self.store, namespace) {
            Ok(disk) => disk,
            Err(problem) => {
                let why = format!("volume {number}'s stored state is damaged: {problem}");
                tracing::error!(volume = number, %problem, "a volume's records do not restore");
                self.damaged.insert(number, why.clone());
                return Err(why);
            }
        };
        let volume = Volume::numbered(number, self.log_key, self.writers.clone());
        tracing::info!(
            volume = number,
            writes = disk.last.as_ref().map_or(0, |(_, _, t)| t.seq),
            objects = disk.objects.len(),
            "volume restored"
        );
        Ok(entry.insert(Hosting {
            replica: Server::restore(volume, &disk),
            adapter: VolumeStorage { namespace },
            members: Members::ById,
            slot: Slot(self.me.0),
            header: Header::request(ServiceId::A2M_STORAGE, GroupId(number), self.epoch, 0),
        }))
    }

    /// `effects` of volume `number`, its batches for the trusted log renamed with this host's
    /// tokens.
    fn own(&mut self, number: u32, mut effects: Effects) -> Effects {
        for (token, _) in &mut effects.attest {
            let ours = self.next_token;
            self.next_token += 1;
            self.tokens.insert(ours, (number, *token));
            *token = ours;
        }
        effects
    }
}

impl Hosted for Volumes {
    fn service_name(&self) -> &'static str {
        <VolumeStorage as Adapter<Server>>::NAME
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
        let number = envelope.header.group.0;
        let effects = match self.server(number) {
            Ok(server) => server.on_request(now, client, access, envelope, batch),
            Err(why) => {
                // The client is told why, as the protocol's own refusals are.
                let Ok(request) = envelope.body::<a2m_storage::Request>(FRAME_BYTES_MAX) else {
                    return Effects {
                        refused: Some("malformed request".into()),
                        ..Effects::default()
                    };
                };
                let (op, nonce) = match &request {
                    a2m_storage::Request::Read { op, nonce, .. } => (*op, *nonce),
                    a2m_storage::Request::Write { op, write, .. } => (*op, write.nonce),
                };
                let reply = a2m_storage::Reply::Refused {
                    op,
                    nonce,
                    reason: why.clone(),
                };
                return Effects {
                    reply: Some(bulwark_core::envelope::frame(
                        &envelope.header.reply(),
                        &reply,
                    )),
                    refused: Some(why),
                    ..Effects::default()
                };
            }
        };
        self.own(number, effects)
    }

    fn on_message(
        &mut self,
        _now: Time,
        _from: NodeId,
        _envelope: &Envelope,
        _batch: u64,
    ) -> Effects {
        Effects {
            refused: Some("single-server volumes take no messages from nodes".into()),
            ..Effects::default()
        }
    }

    fn on_timer(&mut self, _now: Time, _timer: TimerId, _batch: u64) -> Effects {
        Effects::default()
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let numbers: Vec<u32> = self.servers.keys().copied().collect();
        let mut effects = Effects::default();
        for number in numbers {
            if let Some(server) = self.servers.get_mut(&number) {
                let more = server.on_tick(now, batch);
                let more = self.own(number, more);
                effects = merge(effects, more);
            }
        }
        effects
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, batch: u64) -> Effects {
        let Some((number, theirs)) = self.tokens.remove(&token) else {
            return Effects::default();
        };
        let Some(server) = self.servers.get_mut(&number) else {
            return Effects::default();
        };
        let effects = server.on_attested(now, theirs, answers, batch);
        self.own(number, effects)
    }

    fn durable(&mut self, batch: u64) {
        for server in self.servers.values_mut() {
            server.durable(batch);
        }
    }

    fn stats(&self) -> ReplicaStats {
        let mut totals = ReplicaStats::default();
        for server in self.servers.values() {
            totals.add(&server.stats());
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_restore_to_the_disk_they_came_from_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let namespace = Namespace::new(ServiceId::A2M_STORAGE, GroupId(3));
        assert!(
            restore(&store, namespace).unwrap().last.is_none(),
            "an empty volume"
        );
        let mut adapter = VolumeStorage { namespace };
        let writer = bulwark_core::sign::SecretKey::from_seed(&[4; 32]);
        let mut disk = Disk::default();
        let mut timestamp = a2m_storage::Timestamp::GENESIS;
        let mut ops = Vec::new();
        for seq in 1..=RECENT_WRITES + 3 {
            let request = [seq as u8; 32];
            let block = a2m_storage::VersionBlock {
                volume: 3,
                seq,
                root: [0; 32],
                writer: 0,
            };
            let version = Version {
                writer: 0,
                block: bulwark_core::sign::Signed::sign(&writer, block)
                    .unwrap()
                    .to_unverified(),
            };
            timestamp = timestamp.next(&request, &version.hash());
            let key = Key::new(format!("k{}", seq % 5).into_bytes()).unwrap();
            let value = (seq % 7 != 0).then(|| Bytes::from(seq.to_string()));
            let change = Change {
                key,
                value,
                version,
                request,
                timestamp,
            };
            disk.apply(&change);
            adapter.record(&change, seq, &mut ops);
        }
        store.apply(&ops).unwrap();
        let restored = restore(&store, namespace).unwrap();
        assert_eq!(restored.objects, disk.objects);
        assert_eq!(restored.recent, disk.recent);
        assert_eq!(restored.last.map(|l| l.2), disk.last.map(|l| l.2));
        // A damaged record is named, never served as an empty or older volume.
        store
            .apply(&[StorageOp::Put {
                table: namespace.table(LAST),
                key: LAST_RECORD.to_vec(),
                value: Bytes::from_static(b"\x01garbage"),
            }])
            .unwrap();
        let problem = restore(&store, namespace).unwrap_err();
        assert!(problem.contains("last write"), "{problem}");
    }
}
