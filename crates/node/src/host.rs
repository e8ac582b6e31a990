//! The replicas a node hosts, each seen alike by the shard that drives it: one generic
//! [`Hosting`] over the protocols' [`Replica`] contract, plus one small [`Adapter`] per service
//! that says how its changes become storage records and what the replica may read back.
//! Adding a service is an adapter here and a line in [`crate::build_replicas`]; nothing in the
//! shards, the dispatcher or the wire changes.

use crate::verified::Verified;
use bulwark_core::envelope::{self, Envelope, Header};
use bulwark_core::membership::{Arc as RingArc, Ring, RingPoint};
use bulwark_core::wire::{self, DeserializeOwned, FRAME_BYTES_MAX};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, NodeId, Slot, Time};
use bulwark_protocol::content::epochs;
use bulwark_protocol::machine::{Access, Attested, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::powerstore::{
    Candidate, Change, EntryMeta, Fragments, ServerConfig, ServerKeys, ServerLogic, StoredEntry,
    StoredKey, Timestamp, fragment_digest,
};
use bulwark_protocol::register::reconfig::{self, EpochServer};
use bulwark_protocol::register::{self, Policy};
use bulwark_protocol::transfer::EpochHost;
use bulwark_protocol::{table, transfer};
use bulwark_storage::{Namespace, StorageOp, Store, Table};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Table names within a replica's namespace.
pub const HIST: &str = "hist";
/// PoWerStore `lc`: one candidate per key.
pub const LC: &str = "lc";
/// A register baseline's one version per key.
pub const REGISTER: &str = "register";

/// What one input to a hosted replica asks of its shard.
#[derive(Default)]
pub struct Effects {
    /// To make durable, as one batch.
    pub ops: Vec<StorageOp>,
    /// The encoded reply to the requester, sent once `ops` (and all before) are durable.
    pub reply: Option<Bytes>,
    /// Encoded messages to peer nodes, sent under the same rule.
    pub sends: Vec<(NodeId, Bytes)>,
    /// Encoded answers to clients' earlier requests (client, operation, frame), sent under the
    /// same rule on the connection the request came in on.
    pub notify: Vec<(ClientId, u64, Bytes)>,
    /// Timers to set.
    pub timers: Vec<(TimerId, Time)>,
    /// Batches of calls to the node's trusted log, each with the replica's token, made in
    /// order once `ops` (and all before) are durable; answered through
    /// [`Hosted::on_attested`].
    pub attest: Vec<(u64, Vec<bulwark_core::a2m::Call>)>,
    /// Why the input was refused.
    pub refused: Option<String>,
}

impl Effects {
    /// Nothing to do but count a refusal.
    fn refused(why: String) -> Effects {
        Effects {
            refused: Some(why),
            ..Effects::default()
        }
    }
}

/// `more` after `effects`, as one input's effects.
pub(crate) fn merge(mut effects: Effects, more: Effects) -> Effects {
    effects.ops.extend(more.ops);
    effects.sends.extend(more.sends);
    effects.notify.extend(more.notify);
    effects.timers.extend(more.timers);
    effects.attest.extend(more.attest);
    effects.refused = effects.refused.or(more.refused);
    effects
}

/// A hosted replica, as a shard drives it: frames in, effects out.
pub trait Hosted: Send {
    /// The service's name, for status and metrics.
    fn service_name(&self) -> &'static str;
    /// This node's slot in the group.
    fn slot(&self) -> Slot;
    /// A client's request. `batch` is the number the shard will give the next batch of changes.
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        envelope: &Envelope,
        batch: u64,
    ) -> Effects;
    /// A message from a peer node of the group.
    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects;
    /// A timer the replica set.
    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects;
    /// Periodic housekeeping.
    fn on_tick(&mut self, now: Time, batch: u64) -> Effects;
    /// The certified ring of the next epoch.
    fn on_epoch(&mut self, _now: Time, _ring: Arc<Ring>, _batch: u64) -> Effects {
        Effects::default()
    }
    /// What the trusted log answered to the batch the replica gave `token`.
    fn on_attested(&mut self, _now: Time, _token: u64, _answers: Attested, _batch: u64) -> Effects {
        Effects::default()
    }
    /// Every batch up to `batch` is durable.
    fn durable(&mut self, batch: u64);
    /// Counters.
    fn stats(&self) -> ReplicaStats;
    /// A configuration-service replica's view and primary, for status.
    fn cs_status(&self) -> Option<bulwark_protocol::service::CsStatus> {
        None
    }
    /// Each causal volume's state, for status.
    fn causal_status(&self) -> Vec<bulwark_protocol::service::CausalStatus> {
        Vec::new()
    }
    /// An operation this node submits to its own configuration-service replica (encoded).
    fn submit_own(&mut self, _now: Time, _op: &[u8], _batch: u64) -> Effects {
        Effects::refused("only a configuration-service replica takes its node's operations".into())
    }
}

/// How one service's state meets the node's storage.
pub trait Adapter<R: Replica + ?Sized>: Send {
    /// The service's name.
    const NAME: &'static str;
    /// The storage records of one change, in batch `batch`, appended to `ops`.
    fn record(&mut self, change: &R::Change, batch: u64, ops: &mut Vec<StorageOp>);
    /// What the replica reads back.
    fn view(&self) -> &R::View;
    /// Every batch up to `batch` is durable.
    fn durable(&mut self, _batch: u64) {}
}

/// How a hosted replica's slots name nodes.
pub enum Members {
    /// Slot `i` is the `i`-th member of one group.
    Group(Vec<NodeId>),
    /// Slot `id` is node `id`: a node-wide replica that follows the configuration, whose peers
    /// change from epoch to epoch (it checks itself who may ask what).
    ById,
}

impl Members {
    /// The node in `slot`.
    pub fn node(&self, slot: Slot) -> Option<NodeId> {
        match self {
            Members::Group(members) => members.get(slot.index()).copied(),
            Members::ById => Some(NodeId(slot.0)),
        }
    }

    /// The slot of `node`.
    pub fn slot_of(&self, node: NodeId) -> Option<Slot> {
        match self {
            Members::Group(members) => members
                .iter()
                .position(|m| *m == node)
                .map(|at| Slot(at as u32)),
            Members::ById => Some(Slot(node.0)),
        }
    }
}

/// One replica, with its adapter and how its slots name nodes.
pub struct Hosting<R: Replica, A: Adapter<R>> {
    pub replica: R,
    pub adapter: A,
    /// Who its slots are, to address peer messages.
    pub members: Members,
    pub slot: Slot,
    /// The header this replica's own messages carry.
    pub header: Header,
}

impl<R, A> Hosting<R, A>
where
    R: Replica + Send,
    A: Adapter<R>,
{
    pub(crate) fn effects(
        &mut self,
        output: bulwark_protocol::machine::Output<R>,
        reply_to: Option<&Header>,
        batch: u64,
    ) -> Effects {
        let mut ops = Vec::with_capacity(output.changes.len());
        for change in &output.changes {
            self.adapter.record(change, batch, &mut ops);
        }
        let reply = match (output.reply, reply_to) {
            (Some(reply), Some(header)) => Some(envelope::frame(&header.reply(), &reply)),
            _ => None,
        };
        let notify = output
            .notify
            .into_iter()
            .map(|(client, op, reply)| {
                let header = Header {
                    kind: envelope::Kind::Reply,
                    op,
                    ..self.header
                };
                (client, op, envelope::frame(&header, &reply))
            })
            .collect();
        let sends = output
            .sends
            .into_iter()
            .filter_map(|(slot, message)| {
                let node = self.members.node(slot)?;
                let header = Header {
                    kind: envelope::Kind::Message,
                    ..self.header
                };
                Some((node, envelope::frame(&header, &message)))
            })
            .collect();
        Effects {
            ops,
            reply,
            sends,
            notify,
            timers: output.timers,
            attest: output
                .attest
                .into_iter()
                .map(|attest| (attest.token, attest.calls))
                .collect(),
            refused: output.refused,
        }
    }
}

impl<R, A> Hosted for Hosting<R, A>
where
    R: Replica + Send,
    A: Adapter<R>,
{
    fn service_name(&self) -> &'static str {
        A::NAME
    }

    fn slot(&self) -> Slot {
        self.slot
    }

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        envelope: &Envelope,
        batch: u64,
    ) -> Effects {
        let request = match envelope.body::<R::Request>(FRAME_BYTES_MAX) {
            Ok(request) => request,
            Err(error) => {
                return Effects::refused(format!("malformed request: {error}"));
            }
        };
        let output = self
            .replica
            .on_request(now, client, access, request, self.adapter.view());
        self.effects(output, Some(&envelope.header), batch)
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        let Some(slot) = self.members.slot_of(from) else {
            return Effects::refused("a message from a node outside the group".to_string());
        };
        let message = match envelope.body::<R::Message>(FRAME_BYTES_MAX) {
            Ok(message) => message,
            Err(error) => {
                return Effects::refused(format!("malformed message: {error}"));
            }
        };
        let output = self
            .replica
            .on_message(now, slot, message, self.adapter.view());
        self.effects(output, None, batch)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects {
        let output = self.replica.on_timer(now, timer, self.adapter.view());
        self.effects(output, None, batch)
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let output = self.replica.on_tick(now);
        self.effects(output, None, batch)
    }

    fn on_epoch(&mut self, now: Time, ring: Arc<Ring>, batch: u64) -> Effects {
        let output = self.replica.on_epoch(now, ring);
        self.effects(output, None, batch)
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, batch: u64) -> Effects {
        let output = self
            .replica
            .on_attested(now, token, answers, self.adapter.view());
        self.effects(output, None, batch)
    }

    fn durable(&mut self, batch: u64) {
        self.adapter.durable(batch);
    }

    fn stats(&self) -> ReplicaStats {
        self.replica.stats()
    }
}

// ---------------------------------------------------------------------------------------------
// PoWerStore

/// The storage record id of `Hist[ts]` of `key`: length-prefixed key, then the fixed-width ts.
pub fn hist_record(key: &Key, ts: &Timestamp) -> Vec<u8> {
    let mut record = hist_prefix(key);
    record.extend_from_slice(&ts.canonical());
    record
}

/// The storage op of one PoWerStore change in `namespace`.
pub fn powerstore_op(namespace: Namespace, change: &Change) -> StorageOp {
    match change {
        Change::PutHist { key, entry } => StorageOp::Put {
            table: namespace.table(HIST),
            key: hist_record(key, &entry.ts),
            value: Bytes::from(wire::encode(&(key, entry))),
        },
        Change::DeleteHist { key, ts } => StorageOp::Delete {
            table: namespace.table(HIST),
            key: hist_record(key, ts),
        },
        Change::SetLc { key, candidate } => StorageOp::Put {
            table: namespace.table(LC),
            key: key.as_bytes().to_vec(),
            value: Bytes::from(wire::encode(&(key, candidate))),
        },
    }
}

/// What a stored `Hist` entry must satisfy to be served: the checks its STORE passed, which a
/// flipped byte on disk breaks.
pub struct EntryChecks {
    pub config: ServerConfig,
    pub keys: ServerKeys,
}

impl EntryChecks {
    /// Why the entry stored under `record` must not be served, if it must not. `fragment` also
    /// hashes the fragment, which costs a pass over it; served fragments are hashed anyway.
    pub fn problem(
        &self,
        record: &[u8],
        key: &Key,
        entry: &StoredEntry,
        fragment: bool,
    ) -> Option<&'static str> {
        let config = &self.config;
        let me = config.node.index();
        if record != hist_record(key, &entry.ts).as_slice() {
            Some("record id does not match its entry")
        } else if entry.ts.num == 0 || !entry.cc.is_well_formed(config.n) {
            Some("malformed timestamp or cross-checksum")
        } else if entry.fragment.len() != entry.cc.layout.fragment_len() {
            Some("fragment length does not match its layout")
        } else if fragment && entry.cc.hashes.get(me) != Some(&fragment_digest(&entry.fragment)) {
            Some("fragment does not match its cross-checksum")
        } else if !entry.vec.verify_slot(
            me,
            &config.incarnation,
            key,
            &entry.ts,
            &entry.nonce_hash,
            &self.keys,
        ) {
            Some("MAC vector slot does not verify")
        } else {
            None
        }
    }
}

/// The changes to one key not yet durable: each `Hist` entry's last change (`None`: deleted) and
/// the last `lc`, with the newest batch carrying any of them.
#[derive(Default)]
pub struct PendingKey {
    batch: u64,
    hist: HashMap<Timestamp, Option<EntryMeta>>,
    lc: Option<Candidate>,
}

/// The `Hist` records of `key` share this prefix (and no other key's do: the length comes first).
fn hist_prefix(key: &Key) -> Vec<u8> {
    hist_prefix_of(key.as_bytes())
}

/// [`hist_prefix`] of a key's raw bytes.
pub fn hist_prefix_of(key: &[u8]) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(2 + key.len());
    prefix.extend_from_slice(&(key.len() as u16).to_be_bytes());
    prefix.extend_from_slice(key);
    prefix
}

/// The key a `Hist` record id names, if it is shaped as [`hist_record`] makes them.
pub fn hist_record_key(record: &[u8]) -> Option<Key> {
    let len = u16::from_be_bytes(record.get(..2)?.try_into().ok()?) as usize;
    let bytes = record.get(2..2 + len)?;
    (record.len() == 2 + len + 52).then_some(())?;
    Key::new(Bytes::copy_from_slice(bytes)).ok()
}

/// A PoWerStore replica's storage: the changes it handled that are not yet durable, then the
/// disk. Requests are handled in order, so what a request needs is either committed or here.
pub struct PowerStoreStorage {
    pub namespace: Namespace,
    pub store: Arc<Store>,
    /// `Hist` records queued for commit, with the batch carrying them.
    pub unsynced: HashMap<Vec<u8>, (u64, Bytes)>,
    /// Every change queued for commit, by key, for reading back a key the server evicted.
    pub pending: HashMap<Key, PendingKey>,
    /// What an entry read back must satisfy.
    pub checks: EntryChecks,
    /// Fragments already found intact: served again without a disk read or a re-hash. Shared
    /// by the node's PoWerStore replicas (keys belong to one group each, so records never meet).
    pub verified: Arc<Mutex<Verified>>,
}

impl PowerStoreStorage {
    fn hist(&self) -> Table {
        self.namespace.table(HIST)
    }

    fn forget_verified(&self, record: &[u8]) {
        if let Ok(mut verified) = self.verified.lock() {
            verified.remove(record);
        }
    }
}

impl Adapter<Box<dyn ServerLogic>> for PowerStoreStorage {
    const NAME: &'static str = "powerstore";

    fn record(&mut self, change: &Change, batch: u64, ops: &mut Vec<StorageOp>) {
        let key = match change {
            Change::PutHist { key, .. }
            | Change::DeleteHist { key, .. }
            | Change::SetLc { key, .. } => key,
        };
        let pending = self.pending.entry(key.clone()).or_default();
        debug_assert!(pending.batch <= batch, "batches are recorded in order");
        pending.batch = batch;
        match change {
            Change::PutHist { key, entry } => {
                pending.hist.insert(entry.ts, Some(EntryMeta::from(entry)));
                let record = hist_record(key, &entry.ts);
                self.forget_verified(&record);
                self.unsynced
                    .insert(record, (batch, entry.fragment.clone()));
            }
            Change::DeleteHist { key, ts } => {
                pending.hist.insert(*ts, None);
                let record = hist_record(key, ts);
                self.forget_verified(&record);
                self.unsynced.remove(&record);
            }
            Change::SetLc { candidate, .. } => pending.lc = Some(candidate.clone()),
        }
        ops.push(powerstore_op(self.namespace, change));
    }

    fn view(&self) -> &(dyn Fragments + 'static) {
        self
    }

    fn durable(&mut self, batch: u64) {
        self.unsynced
            .retain(|_, (carried_by, _)| *carried_by > batch);
        self.pending.retain(|_, pending| pending.batch > batch);
    }
}

impl Fragments for PowerStoreStorage {
    fn stored_key(&self, key: &Key) -> StoredKey {
        let mut hist: HashMap<Timestamp, EntryMeta> = HashMap::new();
        let mut rejected = 0u64;
        let scanned = self.store.scan_prefix(self.hist(), &hist_prefix(key), |record, value| {
            match wire::decode::<(Key, StoredEntry)>(value, usize::MAX) {
                Ok((stored, entry)) if stored == *key => {
                    match self.checks.problem(record, key, &entry, false) {
                        None => {
                            hist.insert(entry.ts, EntryMeta::from(&entry));
                        }
                        Some(problem) => {
                            tracing::error!(%key, ts = entry.ts.num, problem, "stored entry failed verification; not served");
                            rejected += 1;
                        }
                    }
                }
                Ok(_) | Err(_) => {
                    tracing::error!(%key, "a stored entry does not decode as this key's; not served");
                    rejected += 1;
                }
            }
            Ok(())
        });
        let mut lc = match self.store.get(self.namespace.table(LC), key.as_bytes()) {
            Ok(Some(value)) => match wire::decode::<(Key, Candidate)>(&value, usize::MAX) {
                Ok((stored, candidate)) if stored == *key => Some(candidate),
                _ => {
                    tracing::error!(%key, "a stored lc does not decode as this key's; not served");
                    rejected += 1;
                    None
                }
            },
            Ok(None) => None,
            Err(error) => {
                tracing::error!(%key, %error, "reading an lc failed");
                None
            }
        };
        if let Err(error) = scanned {
            tracing::error!(%key, %error, "reading a key's entries failed");
        }
        metrics::counter!("bulwark_node_corrupt_entries_dropped_total").increment(rejected);
        if let Some(pending) = self.pending.get(key) {
            for (ts, entry) in &pending.hist {
                match entry {
                    Some(entry) => hist.insert(*ts, entry.clone()),
                    None => hist.remove(ts),
                };
            }
            if pending.lc.is_some() {
                lc = pending.lc.clone();
            }
        }
        StoredKey {
            lc,
            hist: hist.into_values().collect(),
        }
    }

    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        let record = hist_record(key, ts);
        if let Some((_, fragment)) = self.unsynced.get(&record) {
            return Some(fragment.clone());
        }
        let value = match self.store.get(self.hist(), &record) {
            Ok(value) => value?,
            Err(error) => {
                tracing::error!(%error, "reading a fragment failed");
                return None;
            }
        };
        // The fragment is served as a slice of the record read from disk: no second copy.
        match wire::decode_shared::<(Key, StoredEntry)>(&value, usize::MAX) {
            Ok((_, entry)) => Some(entry.fragment),
            Err(error) => {
                tracing::error!(%error, "a stored fragment record does not decode");
                None
            }
        }
    }

    fn intact_fragment(&self, key: &Key, ts: &Timestamp, digest: &Digest) -> Option<Bytes> {
        let record = hist_record(key, ts);
        if let Some(fragment) = self
            .verified
            .lock()
            .ok()
            .and_then(|verified| verified.get(&record, digest))
        {
            return Some(fragment);
        }
        // Not yet durable: a slice of the STORE's receive buffer, which may be larger than the
        // fragment, so it is not kept; it is about to be on disk anyway.
        if let Some((_, fragment)) = self.unsynced.get(&record) {
            return Some(fragment.clone()).filter(|f| fragment_digest(f) == *digest);
        }
        let fragment = self.fragment(key, ts)?;
        if fragment_digest(&fragment) != *digest {
            return None;
        }
        if let Ok(mut verified) = self.verified.lock() {
            verified.insert(record, *digest, fragment.clone());
        }
        Some(fragment)
    }
}

/// A PoWerStore replica as the node hosts it.
pub type PowerStoreReplica = Hosting<Box<dyn ServerLogic>, PowerStoreStorage>;

// ---------------------------------------------------------------------------------------------
// Register baselines

/// The storage op of a baseline's stored version: the key's bytes, the value `(key, entry)`
/// encoded.
pub fn register_op<P: Policy>(namespace: Namespace, change: &register::Change<P>) -> StorageOp {
    match change {
        register::Change::Put { key, entry } => register_put::<P>(namespace, key, entry),
    }
}

/// The storage op that makes `entry` the stored version of `key`.
fn register_put<P: Policy>(namespace: Namespace, key: &Key, entry: &P::Entry) -> StorageOp {
    StorageOp::Put {
        table: namespace.table(REGISTER),
        key: key.as_bytes().to_vec(),
        value: Bytes::from(wire::encode(&(key, entry))),
    }
}

/// A register baseline's storage: one record per key, nothing read back.
pub struct RegisterStorage {
    pub namespace: Namespace,
}

impl<P: Policy> Adapter<register::Server<P>> for RegisterStorage {
    const NAME: &'static str = P::NAME;

    fn record(&mut self, change: &register::Change<P>, _batch: u64, ops: &mut Vec<StorageOp>) {
        ops.push(register_op(self.namespace, change));
    }

    fn view(&self) -> &() {
        &()
    }
}

// ---------------------------------------------------------------------------------------------
// Registers across epochs

/// The group id of a node-wide replica: one for every group the node is in, in any epoch.
/// Never a real group's: a group is named by its first member, and no member can have the
/// highest id (the configuration must always have a next one to give).
pub const NODE_WIDE: GroupId = GroupId(u32::MAX);
/// The epoch a node-wide replica entered last: one record, [`ENTERED_RECORD`].
pub const ENTERED: &str = "entered";
/// The record of [`ENTERED`].
pub const ENTERED_RECORD: &[u8] = b"epoch";
/// The arcs whose transfer into an epoch finished: one record each, [`pulled_record`].
pub const PULLED: &str = "pulled";

/// The record id of a finished pull of `arc` into `epoch`: the epoch, then the arc's ends.
pub fn pulled_record(epoch: Epoch, arc: &RingArc) -> Vec<u8> {
    let mut record = Vec::with_capacity(8 + 64);
    record.extend_from_slice(&epoch.0.to_be_bytes());
    record.extend_from_slice(&arc.after.0);
    record.extend_from_slice(&arc.upto.0);
    record
}

/// A node-wide register replica's versions: one record per key under its place on the ring
/// ([`placed_record`]), holding `(key, entry)` encoded as a baseline's record does, so that an
/// arc's keys are one or two ranges of the table.
pub const PLACED: &str = "placed";

/// The record id of `key`'s version in [`PLACED`]: the key's ring point, then its bytes.
pub fn placed_record(key: &Key) -> Vec<u8> {
    let point = RingPoint::of_key(key.as_bytes());
    let mut record = Vec::with_capacity(32 + key.as_bytes().len());
    record.extend_from_slice(&point.0);
    record.extend_from_slice(key.as_bytes());
    record
}

/// A node-wide register replica's storage (`reconfig::EpochServer`): one version per key on
/// disk in ring order, the versions not yet durable, the epoch it entered and the arcs it
/// finished pulling. Nothing per key stays in memory once it is durable.
pub struct EpochStorage<E> {
    pub namespace: Namespace,
    pub store: Arc<Store>,
    /// Versions queued for commit, with the batch carrying them (`None`: dropped).
    pub unsynced: std::collections::BTreeMap<Key, (u64, Option<E>)>,
}

impl<E: Clone + Send> EpochStorage<E> {
    /// Storage over the records of `namespace` in `store`.
    pub fn new(namespace: Namespace, store: Arc<Store>) -> Self {
        EpochStorage {
            namespace,
            store,
            unsynced: std::collections::BTreeMap::new(),
        }
    }
}

impl<P: Policy> Adapter<EpochServer<P>> for EpochStorage<P::Entry> {
    const NAME: &'static str = P::NAME;

    fn record(&mut self, change: &reconfig::Change<P>, batch: u64, ops: &mut Vec<StorageOp>) {
        let table = self.namespace.table(PLACED);
        let op = match change {
            transfer::Change::Put { key, entry } => {
                self.unsynced
                    .insert(key.clone(), (batch, Some(entry.clone())));
                StorageOp::Put {
                    table,
                    key: placed_record(key),
                    value: Bytes::from(wire::encode(&(key, entry))),
                }
            }
            transfer::Change::Drop { key } | transfer::Change::Remove { key, .. } => {
                self.unsynced.insert(key.clone(), (batch, None));
                StorageOp::Delete {
                    table,
                    key: placed_record(key),
                }
            }
            transfer::Change::Entered(epoch) => entered_op(self.namespace, *epoch),
            transfer::Change::Pulled { epoch, arc } => pulled_op(self.namespace, *epoch, arc),
            transfer::Change::Own(never) => match *never {},
        };
        ops.push(op);
    }

    fn view(&self) -> &(dyn reconfig::Versions<P::Entry> + 'static) {
        self
    }

    fn durable(&mut self, batch: u64) {
        self.unsynced
            .retain(|_, (carried_by, _)| *carried_by > batch);
    }
}

/// A store the node cannot read back: answering as if a version were missing could let an
/// older one replace it, and a listing cut short would leave keys behind. Stop, as a failed
/// commit does.
fn unreadable(error: &bulwark_storage::StorageError) -> ! {
    tracing::error!(%error, "reading stored versions failed; stopping the node");
    std::process::exit(70);
}

/// The `(key, entry)` of a [`PLACED`] record, checked to be filed where its key places it.
pub fn decode_placed<E: DeserializeOwned>(record: &[u8], value: &[u8]) -> Result<(Key, E), String> {
    let (key, entry): (Key, E) = wire::decode(value, usize::MAX).map_err(|e| e.to_string())?;
    if !key.is_valid() || record != placed_record(&key) {
        return Err("record id does not match its key".into());
    }
    Ok((key, entry))
}

impl<E: Clone + DeserializeOwned + 'static> reconfig::Versions<E> for EpochStorage<E> {
    fn version(&self, key: &Key) -> Option<E> {
        if let Some((_, pending)) = self.unsynced.get(key) {
            return pending.clone();
        }
        let record = placed_record(key);
        let value = match self.store.get(self.namespace.table(PLACED), &record) {
            Ok(value) => value?,
            Err(error) => unreadable(&error),
        };
        match decode_placed::<E>(&record, &value) {
            Ok((_, entry)) => Some(entry),
            Err(problem) => {
                // Damage: the node answers as one that missed the write.
                tracing::warn!(%problem, %key, "a stored version does not decode");
                None
            }
        }
    }

    fn keys(&self, resume: transfer::Resume<'_>, limit: usize) -> Vec<Key> {
        // Keys by their record ids, which sort in ring order.
        let after: Option<Vec<u8>> = match resume {
            transfer::Resume::Start => None,
            // After every key at the point: no key is longer than `Key::BYTES_MAX` bytes.
            transfer::Resume::AfterPoint(point) => {
                let mut bound = point.0.to_vec();
                bound.resize(32 + Key::BYTES_MAX + 1, 0xff);
                Some(bound)
            }
            transfer::Resume::AfterKey(key) => Some(placed_record(key)),
        };
        // Pending drops may hide durable keys of the page: read as many more.
        let wanted = limit + self.unsynced.len();
        let mut keys = std::collections::BTreeMap::new();
        let scanned = self.store.scan_after(
            self.namespace.table(PLACED),
            after.as_deref(),
            |record, _| {
                let key = record
                    .get(32..)
                    .and_then(|bytes| Key::new(Bytes::copy_from_slice(bytes)).ok())
                    .filter(|key| placed_record(key) == record);
                match key {
                    Some(key) => {
                        keys.insert(record.to_vec(), key);
                    }
                    // Filed where no key places it (damage): listing it would sort it elsewhere
                    // and cut the walk short. Its version reads as missing.
                    None => tracing::warn!(record = ?record, "a stored version is misfiled"),
                }
                Ok(keys.len() < wanted)
            },
        );
        if let Err(error) = scanned {
            unreadable(&error);
        }
        // Keys beyond the durable page's last are left to the next page, unless the page was
        // the table's end.
        let end = (keys.len() >= wanted)
            .then(|| keys.keys().next_back().cloned())
            .flatten();
        for (key, (_, pending)) in &self.unsynced {
            let at = placed_record(key);
            let before = after.as_ref().is_some_and(|after| at <= *after);
            if before || end.as_ref().is_some_and(|end| at > *end) {
                continue;
            }
            match pending {
                Some(_) => keys.insert(at, key.clone()),
                None => keys.remove(&at),
            };
        }
        keys.into_values().take(limit).collect()
    }
}

/// The storage op recording that a node-wide replica in `namespace` entered `epoch`.
fn entered_op(namespace: Namespace, epoch: Epoch) -> StorageOp {
    StorageOp::Put {
        table: namespace.table(ENTERED),
        key: ENTERED_RECORD.to_vec(),
        value: Bytes::copy_from_slice(&epoch.0.to_be_bytes()),
    }
}

/// The storage op recording that a node-wide replica in `namespace` finished pulling `arc`
/// into `epoch`.
fn pulled_op(namespace: Namespace, epoch: Epoch, arc: &RingArc) -> StorageOp {
    StorageOp::Put {
        table: namespace.table(PULLED),
        key: pulled_record(epoch, arc),
        value: Bytes::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Content-hash objects

/// Content-hash objects as a node stored them per group before it followed the configuration:
/// one record per object, its id's bytes, holding `(manifest, fragment)`; moved into
/// [`PIECES`] at start.
pub const CONTENT: &str = "content";

/// Content-hash objects across epochs: one record per fragment, the object's key (its ring point
/// and id) then the fragment's index, holding the fragment with its manifest.
pub const PIECES: &str = "pieces";

/// The record id of fragment `index` of the object under `key`.
pub fn piece_record(key: &Key, index: u32) -> Vec<u8> {
    let mut record = Vec::with_capacity(key.as_bytes().len() + 4);
    record.extend_from_slice(key.as_bytes());
    record.extend_from_slice(&index.to_be_bytes());
    record
}

/// The object key and fragment index of a [`piece_record`].
pub fn decode_piece_record(record: &[u8]) -> Option<(Key, u32)> {
    let (key, index) = record.split_last_chunk::<4>()?;
    Some((Key::new(key.to_vec()).ok()?, u32::from_be_bytes(*index)))
}

/// The ids of the content-hash objects `store` holds a durable fragment of (in the node-wide
/// store that follows the configuration), in key order after object `after`: at most `limit`
/// (and [`bulwark_protocol::service::CONTENT_OBJECTS_PER_ANSWER`]), and whether more follow.
pub fn content_objects(
    store: &Store,
    after: Option<[u8; 32]>,
    limit: usize,
) -> Result<(Vec<[u8; 32]>, bool), bulwark_storage::StorageError> {
    let limit = limit.min(bulwark_protocol::service::CONTENT_OBJECTS_PER_ANSWER);
    let table = Namespace::new(bulwark_core::ServiceId::CONTENT, NODE_WIDE).table(PIECES);
    let after = after.map(|id| epochs::key_of(&bulwark_protocol::content::ContentId(Digest(id))));
    let mut objects = std::collections::BTreeMap::new();
    let more = durable_objects(store, table, after.as_ref(), limit, &mut objects)?;
    let ids = objects
        .keys()
        .filter_map(epochs::id_of)
        .map(|id| id.0.0)
        .collect();
    Ok((ids, more))
}

/// Adds to `objects` the keys of the first `limit` objects `table` holds a fragment of after
/// `after`, each with the indices of the fragments durable there; whether more follow.
fn durable_objects(
    store: &Store,
    table: Table,
    after: Option<&Key>,
    limit: usize,
    objects: &mut std::collections::BTreeMap<Key, std::collections::BTreeSet<u32>>,
) -> Result<bool, bulwark_storage::StorageError> {
    // Past every fragment record of `after`.
    let start = after.map(|after| piece_record(after, u32::MAX));
    let mut more = false;
    store.scan_after(table, start.as_deref(), |record, _| {
        let Some((key, index)) = decode_piece_record(record) else {
            return Ok(true);
        };
        if !objects.contains_key(&key) && objects.len() >= limit {
            more = true;
            return Ok(false);
        }
        objects.entry(key).or_default().insert(index);
        Ok(true)
    })?;
    Ok(more)
}

/// What changed of one fragment and is not durable yet: stored, or gone.
type Pending = (u64, Option<epochs::Piece>);

/// The storage of a node's content-hash replica across epochs: fragments not yet durable, then
/// the disk. Nothing per object is kept in memory but what is on its way to the disk.
pub struct ContentEpochStorage {
    pub namespace: Namespace,
    pub store: Arc<Store>,
    /// A group's size: fragment indices are below it.
    pub n: usize,
    /// Fragments queued for commit, with the batch carrying them.
    pub unsynced: std::collections::BTreeMap<(Key, u32), Pending>,
}

impl ContentEpochStorage {
    fn pending(
        &mut self,
        key: &Key,
        index: u32,
        batch: u64,
        piece: Option<epochs::Piece>,
    ) -> StorageOp {
        let table = self.namespace.table(PIECES);
        let record = piece_record(key, index);
        let op = match &piece {
            Some(piece) => StorageOp::Put {
                table,
                key: record,
                value: Bytes::from(wire::encode(piece)),
            },
            None => StorageOp::Delete { table, key: record },
        };
        self.unsynced.insert((key.clone(), index), (batch, piece));
        op
    }

    fn decode(record: &[u8], value: &[u8]) -> Option<epochs::Piece> {
        match wire::decode_shared::<epochs::Piece>(&Bytes::copy_from_slice(value), usize::MAX) {
            Ok(piece) => Some(piece),
            Err(error) => {
                // Damage: the node answers as one that lacks the fragment, and readers and new
                // members rebuild from the others.
                let piece =
                    decode_piece_record(record).map(|(key, index)| format!("{key} #{index}"));
                tracing::warn!(%error, ?piece, "a stored fragment does not decode");
                None
            }
        }
    }
}

impl Adapter<EpochHost<epochs::Contents>> for ContentEpochStorage {
    const NAME: &'static str = "content";

    fn record(
        &mut self,
        change: &transfer::Change<epochs::Piece>,
        batch: u64,
        ops: &mut Vec<StorageOp>,
    ) {
        match change {
            transfer::Change::Put { key, entry } => {
                let op = self.pending(key, entry.index, batch, Some(entry.clone()));
                ops.push(op);
            }
            transfer::Change::Remove { key, entry } => {
                let op = self.pending(key, entry.index, batch, None);
                ops.push(op);
            }
            // Indices are slots: below the group's size.
            transfer::Change::Drop { key } => {
                for index in 0..self.n as u32 {
                    let op = self.pending(key, index, batch, None);
                    ops.push(op);
                }
            }
            transfer::Change::Entered(epoch) => ops.push(entered_op(self.namespace, *epoch)),
            transfer::Change::Pulled { epoch, arc } => {
                ops.push(pulled_op(self.namespace, *epoch, arc));
            }
            transfer::Change::Own(never) => match *never {},
        }
    }

    fn view(&self) -> &(dyn epochs::Pieces + 'static) {
        self
    }

    fn durable(&mut self, batch: u64) {
        self.unsynced
            .retain(|_, (carried_by, _)| *carried_by > batch);
    }
}

impl epochs::Pieces for ContentEpochStorage {
    fn pieces(&self, key: &Key) -> Vec<epochs::Piece> {
        let mut pieces: std::collections::BTreeMap<u32, Option<epochs::Piece>> =
            std::collections::BTreeMap::new();
        let scanned = self.store.scan_prefix(
            self.namespace.table(PIECES),
            key.as_bytes(),
            |record, value| {
                if let Some((held, index)) = decode_piece_record(record)
                    && held == *key
                {
                    pieces.insert(index, Self::decode(record, value));
                }
                Ok(())
            },
        );
        if let Err(error) = scanned {
            tracing::error!(%error, "reading an object's fragments failed");
        }
        for ((held, index), (_, piece)) in self
            .unsynced
            .range((key.clone(), 0)..=(key.clone(), u32::MAX))
        {
            debug_assert!(held == key);
            pieces.insert(*index, piece.clone());
        }
        pieces.into_values().flatten().collect()
    }

    fn objects_after(&self, after: Option<&Key>, limit: usize) -> Vec<(Key, Vec<u32>)> {
        let mut objects = std::collections::BTreeMap::new();
        let table = self.namespace.table(PIECES);
        if let Err(error) = durable_objects(&self.store, table, after, limit, &mut objects) {
            tracing::error!(%error, "listing stored objects failed");
        }
        for ((key, index), (_, piece)) in &self.unsynced {
            if after.is_some_and(|after| key <= after) {
                continue;
            }
            let indices = objects.entry(key.clone()).or_default();
            if piece.is_some() {
                indices.insert(*index);
            } else {
                indices.remove(index);
            }
        }
        objects
            .into_iter()
            .filter(|(_, indices)| !indices.is_empty())
            .take(limit)
            .map(|(key, indices)| (key, indices.into_iter().collect()))
            .collect()
    }
}

/// A content-hash replica as the node hosts it: every group it is in, in any epoch.
pub type ContentReplica = Hosting<EpochHost<epochs::Contents>, ContentEpochStorage>;

// ---------------------------------------------------------------------------------------------
// Hardened tables

/// A table replica's cells: one record per row and column, the newest version it holds.
pub const TABLE_CELLS: &str = "cells";
/// The tables it serves: one record per table, its schema.
pub const TABLE_SCHEMAS: &str = "schemas";
/// The clients the administrator revoked: one record per client, the authority's order.
pub const TABLE_REVOKED: &str = "revoked";

/// The storage record of one table change.
pub fn table_op(namespace: Namespace, change: &table::Change) -> StorageOp {
    match change {
        table::Change::Put { row, column, cell } => StorageOp::Put {
            table: namespace.table(TABLE_CELLS),
            key: wire::encode(&(row, column)),
            value: Bytes::from(wire::encode(cell)),
        },
        table::Change::Schema(schema) => StorageOp::Put {
            table: namespace.table(TABLE_SCHEMAS),
            key: schema.name.as_bytes().to_vec(),
            value: Bytes::from(wire::encode(schema)),
        },
        table::Change::Remove { row, column } => StorageOp::Delete {
            table: namespace.table(TABLE_CELLS),
            key: wire::encode(&(row, column)),
        },
        table::Change::Revoke(revocation) => StorageOp::Put {
            table: namespace.table(TABLE_REVOKED),
            key: revocation
                .peek()
                .map(|order| order.client.0.to_be_bytes().to_vec())
                .unwrap_or_default(),
            value: Bytes::from(wire::encode(revocation)),
        },
    }
}

/// A table replica's storage: it keeps its rows in memory and reads nothing back.
pub struct TableStorage {
    pub namespace: Namespace,
}

/// A table replica as the node hosts it: the honest one, or (in `bulwark-byzantine`) one that
/// lies around it. Its outputs are the honest replica's kind.
pub trait TableLogic: Send {
    /// A client's request.
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: table::Request,
    ) -> Output<table::Server>;
    /// A message from the member in `from`.
    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: table::Message,
    ) -> Output<table::Server>;
    /// A timer it set.
    fn on_timer(&mut self, now: Time, timer: TimerId) -> Output<table::Server>;
    /// Periodic work: anti-entropy.
    fn on_tick(&mut self, now: Time) -> Output<table::Server>;
    /// Counters.
    fn stats(&self) -> ReplicaStats;
}

impl TableLogic for table::Server {
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: table::Request,
    ) -> Output<table::Server> {
        Replica::on_request(self, now, client, access, request, &())
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: table::Message,
    ) -> Output<table::Server> {
        Replica::on_message(self, now, from, message, &())
    }

    fn on_timer(&mut self, now: Time, timer: TimerId) -> Output<table::Server> {
        Replica::on_timer(self, now, timer, &())
    }

    fn on_tick(&mut self, now: Time) -> Output<table::Server> {
        Replica::on_tick(self, now)
    }

    fn stats(&self) -> ReplicaStats {
        Replica::stats(self)
    }
}

impl Replica for Box<dyn TableLogic> {
    const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::TABLE;
    type Request = table::Request;
    type Reply = table::Response;
    type Message = table::Message;
    type Change = table::Change;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: table::Request,
        _view: &(),
    ) -> Output<Self> {
        (**self).on_request(now, client, access, request).retyped()
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: table::Message,
        _view: &(),
    ) -> Output<Self> {
        (**self).on_message(now, from, message).retyped()
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, _view: &()) -> Output<Self> {
        (**self).on_timer(now, timer).retyped()
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        (**self).on_tick(now).retyped()
    }

    fn stats(&self) -> ReplicaStats {
        (**self).stats()
    }
}

impl Adapter<Box<dyn TableLogic>> for TableStorage {
    const NAME: &'static str = "table";

    fn record(&mut self, change: &table::Change, _batch: u64, ops: &mut Vec<StorageOp>) {
        ops.push(table_op(self.namespace, change));
    }

    fn view(&self) -> &() {
        &()
    }
}
