//! A Depot node for one volume, server or client (they run the same protocol, §3): its log, the
//! values it hoards, the log exchange with any other member (§3.2, §4.4 by hash), the client
//! access protocol (PUT §5.1; GET with the compact hash, fast and slow path, and the fallback from
//! server to server and then to the writer, §5.2-§5.6), and fork proofs passed on (§4.7).
//!
//! Sans-IO like every machine here: it answers inputs with changes to make durable and messages
//! to send, and the driver sends nothing before the changes before it are durable. Peers are
//! named by their [`Writer`] index in the volume.

use super::discard::{DISCARD_VALUE_BYTES_MAX, Discard, Ladder, PROPOSAL_IDS_MAX};
use super::hoard::{Hoard, Values};
use super::log::{ForkProof, Log, Summary};
use super::update::{
    DISCARD_PREFIX, Role, Update, UpdateId, ValueRef, VolumeConfig, WireUpdate, Writer,
    discard_key, value_hash,
};
use bulwark_core::sign::SecretKey;
use bulwark_core::{Digest, Key};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The most updates one push carries; the receiver asks again for the rest.
pub const PUSH_UPDATES_MAX: usize = 512;

/// The most value bytes one push or answer carries beyond its first value.
pub const PUSH_VALUE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The most signed update bytes one push or answer carries (a hostile writer's updates may be
/// [`super::update::UPDATE_BYTES_MAX`] each): with the values and proofs, a message stays well
/// inside one frame.
pub const PUSH_UPDATE_BYTES_MAX: usize = 2 * 1024 * 1024;

/// The most fork proofs one push carries; the puller asks again.
pub const PUSH_FORKS_MAX: usize = 16;

/// The largest value of a causal volume: every value travels whole in one message.
pub const VALUE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The most ids or hashes a peer may ask for in one pull.
pub const WANT_MAX: usize = 1024;

/// What nodes of a volume say to each other.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Message {
    /// Log exchange: "here is my frontier; send what I lack", with updates and values wanted by
    /// name (the fork point found by hash), and whether to send the values of what it sends.
    Pull {
        /// The puller's frontier.
        frontier: Summary,
        /// Updates it wants with their past, by id.
        want: Vec<UpdateId>,
        /// Values it wants, by hash.
        want_values: Vec<Digest>,
        /// Send the values of the updates too (a hoarding puller).
        values: bool,
    },
    /// The answer to a pull.
    Push {
        /// In log order: dependencies first.
        updates: Vec<WireUpdate>,
        /// Values of those updates, and those asked for.
        values: Vec<Bytes>,
        /// The sender's frontier: heads the puller does not hold are what to ask for next.
        frontier: Summary,
        /// Forks the sender knows of.
        forks: Vec<ForkProof>,
        /// The sender stopped at a bound: pull again.
        more: bool,
        /// Values the sender lacks: a puller that holds them sends them back (a server learns
        /// the values of updates that reached it without them from the clients that wrote them).
        want_values: Vec<Digest>,
    },
    /// A client's new update and its value (§5.1).
    Put {
        /// The client's operation id.
        op: u64,
        /// The update.
        update: WireUpdate,
        /// Its value (none for a delete).
        value: Option<Bytes>,
    },
    /// The update of `op` is accepted and durable here.
    PutAck {
        /// The operation.
        op: u64,
        /// The update.
        id: UpdateId,
    },
    /// A read (§5.2-§5.4): the key, the compact hash of the value hashes the reader holds for
    /// it, and the reader's frontier for the slow path.
    Get {
        /// The reader's operation id.
        op: u64,
        /// The key.
        key: Key,
        /// [`compact_hash`] of the reader's heads of the key.
        compact: u16,
        /// The reader's frontier.
        frontier: Summary,
    },
    /// The answer to a get: the values of the answerer's heads for the key and, when the compact
    /// hashes differ (the slow path), the updates the reader lacks.
    Got {
        /// The operation.
        op: u64,
        /// Values, each checked by the reader against the updates it verified itself.
        values: Vec<Bytes>,
        /// Updates the reader lacks, in log order.
        updates: Vec<WireUpdate>,
        /// More updates than one answer carries: the reader pulls the rest.
        more: bool,
        /// Fork proofs the reader's frontier does not show it holds (§4.7: proofs travel with
        /// every exchange, reads included).
        forks: Vec<ForkProof>,
    },
}

impl Message {
    /// A push nobody asked for, carrying `updates` and `values` alone: how a writer hands its
    /// updates to one node.
    pub fn push(updates: Vec<WireUpdate>, values: Vec<Bytes>) -> Message {
        Message::Push {
            updates,
            values,
            frontier: Vec::new(),
            forks: Vec::new(),
            more: false,
            want_values: Vec::new(),
        }
    }
}

/// A change a node makes durable before anything it sends after it.
#[derive(Clone, Debug)]
pub enum Change {
    /// An accepted update, in acceptance order (dependencies first), and when this node accepted
    /// it (unknown for updates stored before times were).
    Update(WireUpdate, Option<u64>),
    /// A value, named by its hash.
    Value(Bytes),
    /// A fork found or learned.
    Fork(Box<ForkProof>),
    /// A value every client agreed to drop (§6.6): gone from the store, never fetched again.
    Discard(Digest),
    /// A value the store holds, by hash and length, its bytes left there: what a restore reads
    /// from records that keep values on disk. A node never makes this change.
    Stored(Digest, u64),
}

/// What a node asks of its driver after one input.
#[derive(Debug, Default)]
pub struct Output {
    /// To make durable, in order, before any of `sends` leaves.
    pub changes: Vec<Change>,
    /// Messages to other members.
    pub sends: Vec<(Writer, Message)>,
    /// Reads that ended with this input.
    pub reads: Vec<(u64, ReadResult)>,
    /// What the sender passed on that this node refused, and why: what no correct node sends.
    pub refused: Vec<String>,
}

/// One version a read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// The update.
    pub id: UpdateId,
    /// Who wrote it.
    pub writer: Writer,
    /// Its logical clock.
    pub clock: u64,
    /// The value; `None` for a delete.
    pub value: Option<Bytes>,
}

/// What a read returns: every version of the key no other supersedes (concurrent writes, both
/// branches of a fork, all of them), in writer then clock order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadResult {
    /// The versions, with their values.
    pub versions: Vec<Version>,
    /// Values no node asked could give (the read tried every server and every writer).
    pub unavailable: Vec<UpdateId>,
    /// Clients whose recent updates this reader may be missing: it holds no beacon of theirs
    /// within the staleness bound (§6.4). Empty when the read is as fresh as Depot promises.
    pub suspects: Vec<Writer>,
}

/// How a read begins.
#[derive(Debug)]
pub enum ReadStart {
    /// Nobody to ask: the versions this node holds.
    Done(ReadResult),
    /// Send this to that member, then feed the answer to [`Node::on_message`] and, if none comes
    /// in time, call [`Node::read_timeout`].
    Ask(Writer, Box<Message>),
}

/// A read in progress: who to ask next.
#[derive(Debug)]
struct Reading {
    key: Key,
    /// Still to ask, in order: servers first (the primary first), then the writers of the heads.
    next: Vec<Writer>,
    asked: BTreeSet<Writer>,
}

/// Counters, for status and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Updates refused (bad signature, bad history, bad dependencies).
    pub refused: u64,
    /// Values refused (their hash matched no update's).
    pub values_refused: u64,
    /// Reads answered on the fast path (compact hashes matched).
    pub fast_gets: u64,
    /// Reads answered on the slow path.
    pub slow_gets: u64,
    /// Puts refused (a bad signature, or a value that is not the update's).
    pub puts_refused: u64,
    /// Values read back from the store that did not hash to their names: not served.
    pub values_damaged: u64,
}

/// One member's node for one volume.
pub struct Node {
    log: Log,
    role: Role,
    secret: SecretKey,
    values: Hoard,
    /// Puts acknowledged once their update is accepted: (client, op) per update.
    owed: BTreeMap<UpdateId, Vec<(Writer, u64)>>,
    /// Values of puts whose updates wait for dependencies, kept once the update is accepted.
    owed_values: BTreeMap<UpdateId, Bytes>,
    /// Values of accepted updates a hoarding node does not hold yet.
    missing_values: BTreeSet<Digest>,
    /// Per peer, what was asked of it by name without progress since (not asked twice).
    asked: BTreeMap<Writer, BTreeSet<UpdateId>>,
    reads: BTreeMap<u64, Reading>,
    /// Peers this node sent a pull and has not had the push answering it from yet: only such a
    /// push is pushed back to, so two nodes never push at each other for ever.
    pulled: BTreeSet<Writer>,
    stats: NodeStats,
    /// Discard by unanimous consent (§6.6).
    discard: Discards,
}

/// What a node knows of the volume's discard proposals and consents (§6.6).
#[derive(Debug, Default)]
struct Discards {
    /// Values dropped by every client's consent.
    discarded: BTreeSet<Digest>,
    /// Authorised updates to discard keys whose values this node does not hold yet.
    undecoded: Vec<UpdateId>,
    /// The values discard-key updates name: never dropped.
    values: BTreeSet<Digest>,
    /// Proposals not applied yet, with their proposer, and consents, by proposal.
    proposals: BTreeMap<UpdateId, (Writer, u64, Vec<UpdateId>)>,
    consents: BTreeMap<UpdateId, BTreeSet<Writer>>,
    /// Proposals applied, and the listed versions of each value hash they let go.
    applied: BTreeSet<UpdateId>,
    listed: BTreeMap<Digest, BTreeSet<UpdateId>>,
    /// Each client's latest proposal turn, and the proposals this node's client consented to.
    turns: BTreeMap<Writer, u64>,
    consented: BTreeSet<UpdateId>,
    /// Whether something arrived that may complete a proposal, and whether a unanimous proposal
    /// names updates this node does not hold yet (counted again on the tick).
    changed: bool,
    waiting: bool,
    /// Discarded values a newly accepted update names: kept dropped only while every version
    /// naming them is listed.
    recheck: BTreeSet<Digest>,
    /// What this node's ladder keeps (a client consents by it, and proposes by it).
    ladder: Ladder,
}

/// A discard proposal still short of a client's consent ([`Node::discard_pending`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingDiscard {
    /// The proposal: the proposer's update to its discard key.
    pub proposal: UpdateId,
    /// Who proposed it.
    pub proposer: Writer,
    /// The turn it was proposed in.
    pub turn: u64,
    /// How many versions it lists.
    pub versions: usize,
    /// The clients that have not consented to it, in writer order.
    pub missing: Vec<Writer>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("me", &self.log.me())
            .field("updates", &self.log.len())
            .finish_non_exhaustive()
    }
}

/// A 16-bit hash of value hashes, sent with a read so that the answerer can tell whether the
/// reader is current (§5.3). Insecure on purpose: the reader checks every value by its full hash.
pub fn compact_hash(mut hashes: Vec<Digest>) -> u16 {
    hashes.sort();
    let mut bytes = Vec::with_capacity(hashes.len() * 32);
    for hash in &hashes {
        bytes.extend_from_slice(&hash.0);
    }
    let digest = Digest::of("bulwark depot compact v1", &bytes);
    u16::from_le_bytes([digest.0[0], digest.0[1]])
}

/// `updates` as they travel, cut at [`PUSH_UPDATE_BYTES_MAX`] (at least one): whether any were
/// left out, or `more` already.
fn wire_bounded(updates: &[&Update], more: bool) -> (Vec<WireUpdate>, bool) {
    let mut out = Vec::with_capacity(updates.len());
    let mut bytes = 0;
    for update in updates {
        let size = update.bytes().len();
        if !out.is_empty() && bytes + size > PUSH_UPDATE_BYTES_MAX {
            return (out, true);
        }
        bytes += size;
        out.push(update.to_wire());
    }
    (out, more)
}

impl Node {
    /// This node with rules broken on purpose, for negative controls.
    pub fn mutate(&mut self, mutations: super::log::Mutations) {
        self.log.mutate(mutations);
    }

    /// A fresh node of member `me` with no state.
    pub fn new(config: Arc<VolumeConfig>, me: Writer, secret: SecretKey) -> Node {
        let role = config.member(me).map_or(Role::Client, |member| member.role);
        Node {
            log: Log::new(config, me),
            role,
            secret,
            values: Hoard::default(),
            owed: BTreeMap::new(),
            owed_values: BTreeMap::new(),
            missing_values: BTreeSet::new(),
            asked: BTreeMap::new(),
            reads: BTreeMap::new(),
            pulled: BTreeSet::new(),
            stats: NodeStats::default(),
            discard: Discards::default(),
        }
    }

    /// This node with another backup ladder than the paper's.
    pub fn set_ladder(&mut self, ladder: Ladder) {
        self.discard.ladder = ladder;
    }

    /// The backup ladder this node keeps versions by, and whose turns proposals take.
    pub fn ladder(&self) -> &Ladder {
        &self.discard.ladder
    }

    /// Keeps the bytes of at most `bytes` of values in memory from the end of the next input
    /// on, reading the others back through the view given to [`Node::on_message_with`]
    /// ([`super::hoard`]): what a server that holds more than its memory does.
    pub fn bound_resident_values(&mut self, bytes: u64) {
        self.values.bound(bytes);
    }

    /// A node rebuilt from what it made durable, in the order it did. Every update is verified
    /// and accepted again (a disk is not trusted more than a peer), every value checked against
    /// its name.
    pub fn restore(
        config: Arc<VolumeConfig>,
        me: Writer,
        secret: SecretKey,
        changes: &[Change],
        now_micros: u64,
    ) -> Node {
        Node::restore_with(config, me, secret, changes, now_micros, None, &())
    }

    /// [`Node::restore`] from changes that may name values by hash alone
    /// ([`Change::Stored`]), read back through `values` when needed, with the bytes of at most
    /// `resident` of them in memory ([`Node::bound_resident_values`]).
    pub fn restore_with(
        config: Arc<VolumeConfig>,
        me: Writer,
        secret: SecretKey,
        changes: &[Change],
        now_micros: u64,
        resident: Option<u64>,
        values: &dyn Values,
    ) -> Node {
        let mut node = Node::new(config, me, secret);
        if let Some(bytes) = resident {
            node.bound_resident_values(bytes);
        }
        let mut updates = Vec::new();
        for change in changes {
            match change {
                Change::Update(update, accepted) => updates.push((update.clone(), *accepted)),
                Change::Value(value) => {
                    // A value stored again after its discard (equal bytes written again).
                    node.discard.discarded.remove(&value_hash(value));
                    node.values.insert(value_hash(value), value.clone());
                }
                Change::Stored(hash, len) => {
                    node.discard.discarded.remove(hash);
                    node.values.insert_stored(*hash, *len);
                }
                Change::Fork(proof) => {
                    node.log.learn_fork((**proof).clone());
                }
                Change::Discard(hash) => {
                    node.discard.discarded.insert(*hash);
                }
            }
        }
        for hash in &node.discard.discarded {
            node.values.remove(hash);
        }
        node.log.receive_at(updates, now_micros);
        let mut out = Output::default();
        node.settle(0, &mut out, Some(values));
        node.evict();
        node
    }

    /// The log.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// The log, to change directly in tests.
    #[cfg(test)]
    pub(super) fn log_mut(&mut self) -> &mut Log {
        &mut self.log
    }

    /// The member this node is.
    pub fn me(&self) -> Writer {
        self.log.me()
    }

    /// Counters.
    pub fn stats(&self) -> NodeStats {
        NodeStats {
            refused: self.log.refused(),
            values_damaged: self.values.damaged(),
            ..self.stats.clone()
        }
    }

    /// How many values this node holds.
    pub fn values_held(&self) -> usize {
        self.values.len()
    }

    /// The bytes of the values this node holds.
    pub fn value_bytes(&self) -> u64 {
        self.values.bytes()
    }

    /// Whether this node holds the value named `hash`.
    pub fn has_value(&self, hash: &Digest) -> bool {
        self.values.holds(hash)
    }

    /// The value `hash` names, if this node holds it in memory (every value it holds, unless
    /// [`Node::bound_resident_values`] bounds them).
    pub fn value(&self, hash: &Digest) -> Option<&Bytes> {
        self.values.resident(hash)
    }

    /// Lets the bytes of the values handled longest ago leave memory, down to the bound, but
    /// those of discard proposals and consents still to be decoded.
    fn evict(&mut self) {
        let pinned: BTreeSet<Digest> = self
            .discard
            .undecoded
            .iter()
            .filter_map(|id| self.log.get(id)?.body().value)
            .map(|reference| reference.hash)
            .collect();
        self.values.evict(&pinned);
    }

    /// Whether the value `hash` was dropped by every client's consent (§6.6): no node that
    /// follows the protocol serves it any more.
    pub fn is_discarded(&self, hash: &Digest) -> bool {
        self.discard.discarded.contains(hash)
    }

    /// How many values this node dropped by unanimous consent.
    pub fn discarded(&self) -> usize {
        self.discard.discarded.len()
    }

    /// The changes for everything the log accepted since the last call, with the fork proofs new
    /// since, and the puts this acknowledges.
    /// `values`: the store lent to this input, if any.
    fn settle(&mut self, forks_before: usize, out: &mut Output, values: Option<&dyn Values>) {
        for (id, accepted) in self.log.take_fresh() {
            if let Some(update) = self.log.get(&id) {
                out.changes
                    .push(Change::Update(update.to_wire(), Some(accepted)));
                let body = update.body();
                let authorised = self.log.config().may_write(body.writer, &body.key);
                // Every node counts consents, so every node fetches the proposals and consents
                // clients may write; servers hoard every value.
                let discard = authorised
                    && body.key.as_bytes().starts_with(DISCARD_PREFIX)
                    && body
                        .value
                        .is_some_and(|r| r.len <= DISCARD_VALUE_BYTES_MAX as u64);
                if discard {
                    self.discard.undecoded.push(id);
                    self.discard.changed = true;
                    if let Some(reference) = body.value {
                        self.discard.values.insert(reference.hash);
                    }
                }
                if let Some(reference) = body.value {
                    if authorised && self.discard.discarded.contains(&reference.hash) {
                        self.discard.recheck.insert(reference.hash);
                    } else if !self.values.holds(&reference.hash)
                        && !self.discard.discarded.contains(&reference.hash)
                        && (self.role == Role::Server || discard)
                    {
                        self.missing_values.insert(reference.hash);
                    }
                }
            }
            if let Some(value) = self.owed_values.remove(&id) {
                self.keep_value(value, out);
            }
            for (client, op) in self.owed.remove(&id).unwrap_or_default() {
                out.sends.push((client, Message::PutAck { op, id }));
            }
        }
        if self.log.forks().len() > forks_before {
            // New proofs are few (one per writer); recording them all again is harmless.
            out.changes.extend(
                self.log
                    .forks()
                    .values()
                    .cloned()
                    .map(|p| Change::Fork(Box::new(p))),
            );
        }
        self.count_discards(out, values);
        // Values the store lost or damaged are fetched again like any value this node lacks.
        for hash in self.values.take_lost() {
            if self.role == Role::Server || self.discard.values.contains(&hash) {
                self.missing_values.insert(hash);
            }
        }
    }

    /// Counts proposals and consents again if any arrived since the last count, then takes back
    /// the discarded values a newly accepted version needs.
    fn count_discards(&mut self, out: &mut Output, values: Option<&dyn Values>) {
        // A listed update that arrived late is counted before its value is taken back.
        if self.discard.changed || (self.discard.waiting && !self.discard.recheck.is_empty()) {
            self.discard.changed = false;
            self.apply_discards(out, values);
        }
        for hash in std::mem::take(&mut self.discard.recheck) {
            let listed = self.discard.listed.get(&hash).map_or(0, BTreeSet::len);
            if listed as u32 != self.log.value_namers(&hash) {
                // Written again (equal bytes), or named by a version no proposal listed: the
                // value is needed again; its writer holds it, servers fetch it, and storing it
                // deletes the record of its discard.
                self.discard.discarded.remove(&hash);
                if self.role == Role::Server && !self.values.holds(&hash) {
                    self.missing_values.insert(hash);
                }
            }
        }
    }

    /// Takes in the proposals and consents whose values arrived, and drops the values of every
    /// proposal all the volume's clients consented to (§6.6): a value only when every authorised
    /// update naming it is listed (equal bytes share one value).
    fn apply_discards(&mut self, out: &mut Output, values: Option<&dyn Values>) {
        let me = self.me();
        // Consents first: a proposal every client agreed to is applied before a newer one of its
        // proposer's in the same batch could replace it (a restart decodes the whole log at once).
        let mut proposed = Vec::new();
        for id in std::mem::take(&mut self.discard.undecoded) {
            let Some(update) = self.log.get(&id) else {
                continue;
            };
            let (writer, reference) = (update.body().writer, update.body().value);
            let Some(value) = reference.and_then(|r| self.values.get(&r.hash, values)) else {
                if reference.is_some_and(|r| self.values.holds(&r.hash)) {
                    // Held, its bytes on the store, and no store lent to this input: decoded
                    // on the next input that lends one.
                    self.discard.changed = true;
                }
                self.discard.undecoded.push(id);
                continue;
            };
            match Discard::decode(&value) {
                Some(Discard::Propose { turn, ids }) => {
                    self.discard.consents.entry(id).or_default().insert(writer);
                    proposed.push((id, writer, turn, ids));
                }
                Some(Discard::Consent(proposal)) => {
                    if writer == me {
                        self.discard.consented.insert(proposal);
                    }
                    self.discard
                        .consents
                        .entry(proposal)
                        .or_default()
                        .insert(writer);
                }
                None => {}
            }
        }
        let clients = self.clients();
        for (id, writer, turn, ids) in proposed {
            let latest = self.discard.turns.entry(writer).or_default();
            *latest = (*latest).max(turn);
            let newer = self
                .discard
                .proposals
                .values()
                .any(|(proposer, later, _)| *proposer == writer && *later > turn);
            if newer {
                continue;
            }
            // A proposer's newer proposal replaces its older ones still waiting for consent: what
            // a faulty client writes cannot pile up here. One every client agreed to is applied.
            let older: Vec<UpdateId> = self
                .discard
                .proposals
                .iter()
                .filter(|(_, (proposer, _, _))| *proposer == writer)
                .map(|(older, _)| *older)
                .collect();
            for older in older {
                if self.unanimous(&older, &clients) {
                    self.apply_proposal(older, out);
                }
                self.discard.proposals.remove(&older);
            }
            self.discard.proposals.insert(id, (writer, turn, ids));
        }
        let unanimous: Vec<UpdateId> = self
            .discard
            .proposals
            .keys()
            .filter(|id| self.unanimous(id, &clients))
            .copied()
            .collect();
        for proposal in unanimous {
            self.apply_proposal(proposal, out);
        }
    }

    /// The volume's clients: the members whose consent a discard takes.
    fn clients(&self) -> BTreeSet<Writer> {
        let config = self.log.config();
        (0..config.members.len() as u32)
            .map(Writer)
            .filter(|w| config.member(*w).is_some_and(|m| m.role == Role::Client))
            .collect()
    }

    /// Whether every client consented to `proposal`.
    fn unanimous(&self, proposal: &UpdateId, clients: &BTreeSet<Writer>) -> bool {
        let consents = self.discard.consents.get(proposal);
        consents == Some(clients)
            || (self.log.mutations().discard_short_of_one
                && consents.map_or(0, BTreeSet::len) + 1 >= clients.len())
    }

    /// Drops the values of a proposal every client consented to: a value only when every
    /// authorised update naming it is listed (equal bytes share one value). A proposal naming
    /// updates this node does not hold yet stays, to be counted again on the tick.
    fn apply_proposal(&mut self, proposal: UpdateId, out: &mut Output) {
        let Some((_, _, ids)) = self.discard.proposals.get(&proposal) else {
            return;
        };
        let mut touched = BTreeSet::new();
        let mut held = true;
        for id in ids {
            match self.log.get(id) {
                Some(update) => {
                    if let Some(reference) = update.body().value {
                        self.discard
                            .listed
                            .entry(reference.hash)
                            .or_default()
                            .insert(*id);
                        touched.insert(reference.hash);
                    }
                }
                None => held = false,
            }
        }
        for hash in touched {
            let listed = self.discard.listed.get(&hash).map_or(0, BTreeSet::len);
            if listed as u32 == self.log.value_namers(&hash)
                && !self.discard.values.contains(&hash)
                && self.discard.discarded.insert(hash)
            {
                self.values.remove(&hash);
                self.missing_values.remove(&hash);
                out.changes.push(Change::Discard(hash));
            }
        }
        if held {
            self.discard.proposals.remove(&proposal);
            self.discard.applied.insert(proposal);
        } else {
            self.discard.waiting = true;
        }
    }

    /// The next proposal or consent this client should write to its discard key at `now`, if
    /// any (§6.6): a consent to another client's proposal its own ladder finds no version in that
    /// it keeps, else, on its turn and once in it, a proposal of the versions its ladder lets go
    /// whose values it could drop. Write it with [`Node::write_discard`] and put it like any write.
    pub fn discard_due(&self, now_micros: u64) -> Option<Discard> {
        if self.role != Role::Client {
            return None;
        }
        let me = self.me();
        let ladder = &self.discard.ladder;
        for (id, (writer, _, ids)) in &self.discard.proposals {
            if *writer != me
                && !self.discard.consented.contains(id)
                && (self.log.mutations().consent_unchecked
                    || self.log.check_discard(ids, ladder, now_micros).is_ok())
            {
                return Some(Discard::Consent(*id));
            }
        }
        let turn = ladder.turn(now_micros);
        if ladder.proposer(self.log.config(), now_micros) != Some(me)
            || self
                .discard
                .turns
                .get(&me)
                .is_some_and(|last| *last >= turn)
        {
            return None;
        }
        // Only versions whose values could go: every version naming the value is let go too.
        let candidates: Vec<(UpdateId, Digest)> = self
            .log
            .discardable(ladder, now_micros, usize::MAX)
            .into_iter()
            .filter_map(|id| Some((id, self.log.get(&id)?.body().value?.hash)))
            .filter(|(_, hash)| !self.discard.discarded.contains(hash))
            .collect();
        let mut per_value: BTreeMap<Digest, u32> = BTreeMap::new();
        for (_, hash) in &candidates {
            *per_value.entry(*hash).or_default() += 1;
        }
        let mut ids: Vec<UpdateId> = candidates
            .into_iter()
            .filter(|(_, hash)| per_value[hash] == self.log.value_namers(hash))
            .map(|(id, _)| id)
            .take(PROPOSAL_IDS_MAX)
            .collect();
        ids.sort();
        (!ids.is_empty()).then_some(Discard::Propose { turn, ids })
    }

    /// The discard proposals this node knows that do not have every client's consent yet, with
    /// the clients whose consent each lacks, oldest turn first: what an administrator looks at
    /// when discard stalls (§6.6: a client that never consents delays it for everyone).
    pub fn discard_pending(&self) -> Vec<PendingDiscard> {
        let clients = self.clients();
        let mut pending: Vec<PendingDiscard> = self
            .discard
            .proposals
            .iter()
            .map(|(id, (proposer, turn, ids))| {
                let consents = self.discard.consents.get(id);
                PendingDiscard {
                    proposal: *id,
                    proposer: *proposer,
                    turn: *turn,
                    versions: ids.len(),
                    missing: clients
                        .iter()
                        .copied()
                        .filter(|c| !consents.is_some_and(|set| set.contains(c)))
                        .collect(),
                }
            })
            .filter(|pending| !pending.missing.is_empty())
            .collect();
        pending.sort_by_key(|pending| (pending.turn, pending.proposal));
        pending
    }

    /// Writes `discard` to this client's discard key: [`Node::write`] for what
    /// [`Node::discard_due`] returned.
    pub fn write_discard(&mut self, discard: &Discard, now_micros: u64) -> (Update, Output) {
        let key = discard_key(self.me());
        self.write(key, Some(Bytes::from(discard.encode())), now_micros)
    }

    /// Stores `value` if an accepted update names it: `None` when none does (the sender passed
    /// on a value nobody wrote, or one whose update has not arrived), else whether it is new.
    fn keep_value(&mut self, value: Bytes, out: &mut Output) -> Option<bool> {
        let hash = value_hash(&value);
        if value.len() > VALUE_BYTES_MAX || !self.log.names_value(&hash) {
            return None;
        }
        if self.discard.discarded.contains(&hash) {
            if self.discard.listed.get(&hash).map_or(0, BTreeSet::len) as u32
                == self.log.value_namers(&hash)
            {
                // Dropped here by every client's consent: a peer that still holds it may send it.
                return Some(false);
            }
            // The bytes were written again since (a put or a push brings them with their
            // update): needed again.
            self.discard.discarded.remove(&hash);
        }
        if self.discard.values.contains(&hash) {
            self.discard.changed = true;
        }
        self.missing_values.remove(&hash);
        if self.values.holds(&hash) {
            return Some(false);
        }
        self.values.insert(hash, value.clone());
        out.changes.push(Change::Value(value));
        Some(true)
    }

    /// A local write (§3.1, §5.1 step 1): signed, accepted, and with its value kept (clients
    /// hoard their own writes). Send the update to a server with [`Node::put_message`] once the
    /// output's changes are durable.
    pub fn write(&mut self, key: Key, value: Option<Bytes>, now_micros: u64) -> (Update, Output) {
        let reference = value.as_ref().map(|value| ValueRef {
            hash: value_hash(value),
            len: value.len() as u64,
        });
        let forks = self.log.forks().len();
        let update = self.log.write(&self.secret, key, reference, now_micros);
        let mut out = Output::default();
        self.settle(forks, &mut out, None);
        if let Some(value) = value {
            self.keep_value(value, &mut out);
        }
        self.count_discards(&mut out, None);
        (update, out)
    }

    /// This node's beacon (§6.4), written every `announce_ms` by clients; it reaches servers in
    /// the next exchange.
    pub fn beacon(&mut self, now_micros: u64) -> (Update, Output) {
        let forks = self.log.forks().len();
        let update = self.log.write_beacon(&self.secret, now_micros);
        let mut out = Output::default();
        self.settle(forks, &mut out, None);
        (update, out)
    }

    /// The message that hands update `id` and its value to a server.
    pub fn put_message(&self, op: u64, id: &UpdateId) -> Option<Message> {
        let update = self.log.get(id)?;
        let value = update
            .body()
            .value
            .and_then(|reference| self.values.resident(&reference.hash).cloned());
        Some(Message::Put {
            op,
            update: update.to_wire(),
            value,
        })
    }

    /// A pull for `peer` (background gossip, §3.5).
    pub fn pull(&mut self, peer: Writer) -> Message {
        let want: Vec<UpdateId> = self.log.wanted().into_iter().take(WANT_MAX).collect();
        self.asked
            .entry(peer)
            .or_default()
            .extend(want.iter().copied());
        self.pulled.insert(peer);
        Message::Pull {
            frontier: self.log.frontier().flat(),
            want,
            want_values: self.values_missing(),
            values: self.role == Role::Server,
        }
    }

    /// The fork proofs for a peer whose frontier is `theirs`: of writers it does not hold two
    /// branches of (it found those forks itself), at most [`PUSH_FORKS_MAX`].
    fn forks_for(&self, theirs: &Summary) -> Vec<ForkProof> {
        let mut branches: BTreeMap<Writer, usize> = BTreeMap::new();
        for (writer, _, _) in theirs {
            *branches.entry(*writer).or_default() += 1;
        }
        self.log
            .forks()
            .iter()
            .filter(|(writer, _)| branches.get(writer).is_none_or(|count| *count < 2))
            .map(|(_, proof)| proof.clone())
            .take(PUSH_FORKS_MAX)
            .collect()
    }

    /// Values of accepted updates a hoarding node lacks (servers hoard every value, §5.7).
    fn values_missing(&self) -> Vec<Digest> {
        self.missing_values.iter().copied().take(WANT_MAX).collect()
    }

    /// The values named `hashes` this node holds, within [`PUSH_VALUE_BYTES_MAX`] (at least one),
    /// read back through `store` when not in memory.
    fn values_for(
        &mut self,
        hashes: impl IntoIterator<Item = Digest>,
        store: &dyn Values,
    ) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut seen = BTreeSet::new();
        for hash in hashes {
            // Within the budget before anything is read: a peer's ask costs at most a message's
            // worth of reads.
            let Some(len) = self.values.len_of(&hash) else {
                continue;
            };
            if !seen.insert(hash) {
                continue;
            }
            if !out.is_empty() && bytes + len as usize > PUSH_VALUE_BYTES_MAX {
                break;
            }
            if let Some(value) = self.values.get(&hash, Some(store)) {
                bytes += value.len();
                out.push(value);
            }
        }
        out
    }

    /// Starts a read of `key` (§5.2-§5.6): asks `servers[0]` first, then the other servers, then
    /// the writers of the versions it does not have the values of.
    pub fn start_read(
        &mut self,
        op: u64,
        key: Key,
        servers: &[Writer],
        now_micros: u64,
    ) -> ReadStart {
        let mut reading = Reading {
            key,
            next: servers.iter().rev().copied().collect(),
            asked: BTreeSet::new(),
        };
        match self.ask_next(op, &mut reading, false) {
            None => ReadStart::Done(self.held(&reading.key, now_micros)),
            Some((to, message)) => {
                self.reads.insert(op, reading);
                ReadStart::Ask(to, Box::new(message))
            }
        }
    }

    /// The versions of `key` this node holds at `now_micros`, with what it lacks: what a read
    /// would return without asking anyone (a listing shows this; a read first asks a member).
    pub fn held(&self, key: &Key, now_micros: u64) -> ReadResult {
        let mut versions = Vec::new();
        let mut unavailable = Vec::new();
        for head in self.log.heads(key) {
            let body = head.body();
            let value = match body.value {
                None => None,
                Some(reference) => match self.values.resident(&reference.hash) {
                    Some(value) => Some(value.clone()),
                    None => {
                        unavailable.push(head.id());
                        continue;
                    }
                },
            };
            versions.push(Version {
                id: head.id(),
                writer: body.writer,
                clock: body.clock,
                value,
            });
        }
        versions.sort_by_key(|v| (v.writer, v.clock, v.id));
        ReadResult {
            versions,
            unavailable,
            suspects: self.log.suspects(now_micros / 1000),
        }
    }

    /// The next member to ask for `reading`, and the request, or `None` when no one is left.
    /// `answered`: the member asked last answered (rather than timed out); only an answer can
    /// end a read that holds every value, since a member that withholds taught it nothing.
    fn ask_next(
        &mut self,
        op: u64,
        reading: &mut Reading,
        answered: bool,
    ) -> Option<(Writer, Message)> {
        let heads = self.log.heads(&reading.key);
        // The writers of heads whose values are missing hoard them (§5.7): last resort.
        for head in &heads {
            let writer = head.body().writer;
            if head
                .body()
                .value
                .is_some_and(|r| !self.values.holds(&r.hash))
                && !reading.asked.contains(&writer)
                && !reading.next.contains(&writer)
                && writer != self.me()
            {
                reading.next.insert(0, writer);
            }
        }
        let hashes: Vec<Digest> = heads
            .iter()
            .filter_map(|head| head.body().value.map(|r| r.hash))
            .collect();
        let first_ask = reading.asked.is_empty();
        let complete = hashes.iter().all(|hash| self.values.holds(hash));
        if complete && !first_ask && answered {
            return None;
        }
        while let Some(peer) = reading.next.pop() {
            if peer == self.me() || !reading.asked.insert(peer) {
                continue;
            }
            return Some((
                peer,
                Message::Get {
                    op,
                    key: reading.key.clone(),
                    compact: compact_hash(hashes),
                    frontier: self.log.frontier().flat(),
                },
            ));
        }
        None
    }

    /// The member asked for read `op` did not answer in time: asks the next, or ends the read
    /// with what this node holds.
    pub fn read_timeout(&mut self, op: u64, now_micros: u64) -> Output {
        let mut out = Output::default();
        self.continue_read(op, now_micros, false, &mut out);
        out
    }

    fn continue_read(&mut self, op: u64, now_micros: u64, answered: bool, out: &mut Output) {
        let Some(mut reading) = self.reads.remove(&op) else {
            return;
        };
        match self.ask_next(op, &mut reading, answered) {
            Some(send) => {
                out.sends.push(send);
                self.reads.insert(op, reading);
            }
            None => out.reads.push((op, self.held(&reading.key, now_micros))),
        }
    }

    /// A message from member `from`. `now_micros` is this node's time, for the clock bound.
    pub fn on_message(&mut self, from: Writer, message: Message, now_micros: u64) -> Output {
        self.on_message_with(from, message, now_micros, &())
    }

    /// [`Node::on_message`], reading the values whose bytes left memory back from `store`.
    pub fn on_message_with(
        &mut self,
        from: Writer,
        message: Message,
        now_micros: u64,
        store: &dyn Values,
    ) -> Output {
        let mut out = Output::default();
        let forks = self.log.forks().len();
        match message {
            Message::Pull {
                frontier,
                want,
                want_values,
                values,
            } => {
                let want: Vec<UpdateId> = want.into_iter().take(WANT_MAX).collect();
                let (updates, more) = if want.is_empty() {
                    self.log.missing_for(&frontier, PUSH_UPDATES_MAX)
                } else {
                    self.log.ancestry(&want, &frontier, PUSH_UPDATES_MAX)
                };
                let (wire, more) = wire_bounded(&updates, more);
                let mut hashes: Vec<Digest> = want_values.into_iter().take(WANT_MAX).collect();
                if values {
                    hashes.extend(
                        updates[..wire.len()]
                            .iter()
                            .filter_map(|update| update.body().value.map(|r| r.hash)),
                    );
                }
                let updates = wire;
                let push = Message::Push {
                    updates,
                    values: self.values_for(hashes, store),
                    frontier: self.log.frontier().flat(),
                    forks: self.forks_for(&frontier),
                    more,
                    want_values: self.values_missing(),
                };
                out.sends.push((from, push));
            }
            Message::Push {
                updates,
                values,
                frontier,
                forks: proofs,
                more,
                want_values: wanted_values,
            } => {
                let before = self.log.len();
                let received = self.log.receive(updates, now_micros);
                out.refused
                    .extend(received.refused.iter().map(ToString::to_string));
                let mut learned = 0;
                for value in values {
                    match self.keep_value(value, &mut out) {
                        Some(true) => learned += 1,
                        Some(false) => {}
                        None => {
                            self.stats.values_refused += 1;
                            out.refused.push("a value no accepted update names".into());
                        }
                    }
                }
                for proof in proofs.into_iter().take(self.log.config().members.len()) {
                    self.log.learn_fork(proof);
                }
                let progress = self.log.len() > before || learned > 0;
                if progress {
                    self.asked.remove(&from);
                }
                let mut want: BTreeSet<UpdateId> = self.log.wanted().into_iter().collect();
                // Heads of the sender's this node neither holds nor waits for: a branch its
                // pull did not bring (a fork), asked for by name.
                if !self.log.mutations().never_ask_by_name {
                    want.extend(
                        frontier
                            .iter()
                            .take(super::update::MEMBERS_MAX * 4)
                            .map(|(_, _, id)| *id)
                            .filter(|id| !self.log.holds(id)),
                    );
                }
                let asked_before = self.asked.get(&from);
                let want: Vec<UpdateId> = want
                    .into_iter()
                    .filter(|id| asked_before.is_none_or(|asked| !asked.contains(id)))
                    .take(WANT_MAX)
                    .collect();
                // The exchange runs both ways: what the sender lacks of this node's log goes back
                // (a client's updates reach servers this way too when its put was lost).
                let answered = self.pulled.remove(&from);
                let (back, _) = if answered {
                    self.log.missing_for(&frontier, PUSH_UPDATES_MAX)
                } else {
                    (Vec::new(), false)
                };
                let (back, _) = wire_bounded(&back, false);
                let mut hashes: Vec<Digest> = back
                    .iter()
                    .filter_map(|w| self.log.get(&w.id()).and_then(|u| u.body().value))
                    .map(|r| r.hash)
                    .collect();
                if answered {
                    hashes.extend(
                        wanted_values
                            .into_iter()
                            .take(WANT_MAX)
                            .filter(|hash| self.values.holds(hash)),
                    );
                }
                if !back.is_empty() || !hashes.is_empty() {
                    out.sends.push((
                        from,
                        Message::Push {
                            values: self.values_for(hashes, store),
                            updates: back,
                            frontier: self.log.frontier().flat(),
                            forks: self.forks_for(&frontier),
                            more: false,
                            want_values: Vec::new(),
                        },
                    ));
                }
                let asked = self.asked.entry(from).or_default();
                if !want.is_empty() || (more && progress) {
                    asked.extend(want.iter().copied());
                    self.pulled.insert(from);
                    out.sends.push((
                        from,
                        Message::Pull {
                            frontier: self.log.frontier().flat(),
                            want,
                            want_values: self.values_missing(),
                            values: self.role == Role::Server,
                        },
                    ));
                }
            }
            Message::Put { op, update, value } => match update.verify(self.log.config()) {
                Err(malformed) => {
                    self.stats.puts_refused += 1;
                    out.refused.push(format!("a put: {malformed}"));
                }
                Ok(update) => {
                    let id = update.id();
                    let reference = update.body().value;
                    let value_ok = match (&value, reference) {
                        (Some(value), Some(reference)) => value_hash(value) == reference.hash,
                        (None, None) => true,
                        // A put without the value of a value update: the client keeps it and a
                        // server fetches it like any other value.
                        (None, Some(_)) => true,
                        (Some(_), None) => false,
                    };
                    if value_ok {
                        if self.log.holds(&id) {
                            if let Some(value) = value {
                                self.keep_value(value, &mut out);
                            }
                            out.sends.push((from, Message::PutAck { op, id }));
                        } else {
                            if self.owed.len() < super::log::PENDING_MAX {
                                self.owed.entry(id).or_default().push((from, op));
                            }
                            if let Some(value) = value
                                && self.owed_values.len() < super::log::PENDING_MAX
                            {
                                self.owed_values.insert(id, value);
                            }
                            match self.log.offer(update, now_micros) {
                                super::log::Offer::Refused(refusal) => {
                                    self.owed.remove(&id);
                                    self.owed_values.remove(&id);
                                    self.stats.puts_refused += 1;
                                    out.refused.push(format!("a put: {refusal}"));
                                }
                                super::log::Offer::Missing(_) => {
                                    // It depends on updates this node lacks: the client has them.
                                    let pull = self.pull(from);
                                    out.sends.push((from, pull));
                                }
                                _ => {}
                            }
                        }
                    } else {
                        self.stats.puts_refused += 1;
                        out.refused
                            .push("a put whose value is not its update's".into());
                    }
                }
            },
            Message::PutAck { .. } => {}
            Message::Get {
                op,
                key,
                compact,
                frontier,
            } => {
                let heads = self.log.heads(&key);
                let hashes: Vec<Digest> = heads
                    .iter()
                    .filter_map(|head| head.body().value.map(|r| r.hash))
                    .collect();
                let values = self.values_for(hashes.iter().copied(), store);
                let (updates, more) = if compact_hash(hashes) == compact {
                    self.stats.fast_gets += 1;
                    (Vec::new(), false)
                } else {
                    self.stats.slow_gets += 1;
                    let (updates, more) = self.log.missing_for(&frontier, PUSH_UPDATES_MAX);
                    wire_bounded(&updates, more)
                };
                out.sends.push((
                    from,
                    Message::Got {
                        op,
                        values,
                        updates,
                        more,
                        forks: self.forks_for(&frontier),
                    },
                ));
                // The exchange runs both ways (§3.5): heads the reader holds and this node does
                // not (its own writes acknowledged only by a server since evicted, say) are
                // asked for, so a client that only reads still hands on what it wrote.
                let asked = self.asked.get(&from);
                let lacking: Vec<UpdateId> = frontier
                    .iter()
                    .take(super::update::MEMBERS_MAX * 4)
                    .map(|(_, _, id)| *id)
                    .filter(|id| !self.log.holds(id))
                    .filter(|id| asked.is_none_or(|asked| !asked.contains(id)))
                    .take(WANT_MAX)
                    .collect();
                if !lacking.is_empty() {
                    self.asked
                        .entry(from)
                        .or_default()
                        .extend(lacking.iter().copied());
                    self.pulled.insert(from);
                    out.sends.push((
                        from,
                        Message::Pull {
                            frontier: self.log.frontier().flat(),
                            want: lacking,
                            want_values: self.values_missing(),
                            values: self.role == Role::Server,
                        },
                    ));
                }
            }
            Message::Got {
                op,
                values,
                updates,
                more,
                forks: proofs,
            } => {
                if self.reads.contains_key(&op) {
                    for proof in proofs.into_iter().take(PUSH_FORKS_MAX) {
                        self.log.learn_fork(proof);
                    }
                    let received = self.log.receive(updates, now_micros);
                    out.refused
                        .extend(received.refused.iter().map(ToString::to_string));
                    // Only values of updates this node verified itself count (§5.2 step 3).
                    for value in values {
                        if self.keep_value(value, &mut out).is_none() {
                            self.stats.values_refused += 1;
                            out.refused.push("a value no accepted update names".into());
                        }
                    }
                    if more {
                        let pull = self.pull(from);
                        out.sends.push((from, pull));
                    }
                    // An answer carrying what does not check is no answer: the next member is
                    // asked, as if this one had not answered.
                    let trustworthy = out.refused.is_empty();
                    self.continue_read(op, now_micros, trustworthy, &mut out);
                }
            }
        }
        self.settle(forks, &mut out, Some(store));
        self.evict();
        out
    }

    /// Periodic housekeeping: updates whose clocks were too far ahead are offered again.
    pub fn on_tick(&mut self, now_micros: u64) -> Output {
        let forks = self.log.forks().len();
        if std::mem::take(&mut self.discard.waiting) {
            self.discard.changed = true;
        }
        self.log.retry(now_micros);
        let mut out = Output::default();
        self.settle(forks, &mut out, None);
        self.evict();
        out
    }
}
