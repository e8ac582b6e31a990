//! The two-round quorum register both baselines and Rosebud's public-key objects share:
//! multi-writer ABD ([`abd`]), the Phalanx-style Byzantine register with writer signatures
//! ([`phalanx`]) and owner-signed public-key objects ([`pubkey`]) are one algorithm with three
//! [`Policy`]s, which differ only in the group size, how a stored version is made and checked,
//! and what CLOCK reveals of it.
//!
//! - A write asks `n - f` servers for their timestamps (CLOCK), then stores `(max.num + 1, writer,
//!   seq)` with the whole value at `n - f` servers (STORE).
//! - A read asks `n - f` servers for their version (GET), takes the highest valid one, writes it
//!   back to `n - f` servers (WRITE-BACK) unless every reply of the quorum already carried it,
//!   and returns it.
//!
//! A server keeps the highest-timestamped version per key and acknowledges a STORE only once that
//! version is durable (the driver persists [`Change`]s before the reply leaves). Deletes are
//! tombstone writes (`value: None`). `seq` makes timestamps unique per write operation, so two
//! concurrent writes of one client never share a timestamp.

pub mod abd;
pub mod phalanx;
pub mod pubkey;
pub mod reconfig;

use crate::machine::{Access, OpError, Operation, Output, Progress, Replica, ReplicaStats};
use crate::round::{Refusals, RegisterMutations, Replies};
use bulwark_core::wire::{DeserializeOwned, Serialize};
use bulwark_core::{ClientId, Epoch, GroupId, Key, ServiceId, Slot, Time};
use bytes::Bytes;
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt::Debug;

pub use crate::round::OpId;

/// A write's timestamp, ordered by `(num, writer, seq)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    /// The logical clock; at least 1 for any real write.
    pub num: u64,
    /// The writer's client index (in Phalanx, the key that must have signed).
    pub writer: ClientId,
    /// Unique per write operation of this writer.
    pub seq: u64,
}

pub use crate::round::Judged;

/// What a writer makes of a CLOCK reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clocked {
    /// The reply counts, vouching for this timestamp (`None`: nothing stored, or nothing a writer
    /// made).
    Counted(Option<Timestamp>),
    /// No correct server sends this: the reply is ignored, as if it never came.
    Ignored,
}

/// What distinguishes one register protocol from the other.
pub trait Policy: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The service registers of this kind are served as.
    const SERVICE: ServiceId;
    /// The protocol's name in status and metrics.
    const NAME: &'static str;
    /// The names of CLOCK, STORE, GET and WRITE-BACK in logs and metrics.
    const ROUND_NAMES: [&'static str; 4];

    /// A stored version.
    type Entry: Clone + Debug + PartialEq + Eq + Serialize + DeserializeOwned + Send + Sync;
    /// What CLOCK returns for a stored version.
    type Clock: Clone + Debug + PartialEq + Eq + Serialize + DeserializeOwned + Send + Sync;
    /// What servers and clients need to check versions (the writers' keys).
    type Context: Clone + Debug + Send + Sync;
    /// What a writer needs to make a version (its signing key).
    type Signer: Clone + Send + Sync;

    /// The group size for `f` faults.
    fn n(f: usize) -> usize;

    /// A version's timestamp.
    fn ts(entry: &Self::Entry) -> Timestamp;

    /// A version's value (`None`: a delete).
    fn value(entry: &Self::Entry) -> Option<&Bytes>;

    /// Takes a version's value.
    fn into_value(entry: Self::Entry) -> Option<Bytes>;

    /// A writer's new version.
    fn make(
        signer: &Self::Signer,
        group: GroupId,
        key: &Key,
        ts: Timestamp,
        value: Option<Bytes>,
    ) -> Self::Entry;

    /// What CLOCK reveals of a stored version.
    fn clock(entry: &Self::Entry) -> Self::Clock;

    /// What a writer makes of a CLOCK reply.
    fn clock_ts(
        context: &Self::Context,
        group: GroupId,
        key: &Key,
        clock: Option<Self::Clock>,
    ) -> Clocked;

    /// Whether a server may store `entry` (from a STORE when `store`, else a WRITE-BACK) for
    /// client `from`; `None` when it may.
    fn admit(
        context: &Self::Context,
        group: GroupId,
        key: &Key,
        from: ClientId,
        store: bool,
        entry: &Self::Entry,
    ) -> Option<Refusal>;

    /// How a reader judges a version a server offered.
    fn judge(context: &Self::Context, group: GroupId, key: &Key, entry: &Self::Entry) -> Judged;
}

/// A client-to-server message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Request<P: Policy> {
    /// The operation.
    pub op: OpId,
    /// The configuration the client believes in.
    pub epoch: Epoch,
    /// The replica group addressed.
    pub group: GroupId,
    /// The register.
    pub key: Key,
    /// The round's payload.
    pub body: RequestBody<P>,
}

/// The rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum RequestBody<P: Policy> {
    /// A writer asks for the stored timestamp.
    Clock,
    /// A writer stores a new version.
    Store(P::Entry),
    /// A reader asks for the stored version.
    Get,
    /// A reader writes the version it selected back.
    WriteBack(P::Entry),
}

impl<P: Policy> RequestBody<P> {
    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        let [clock, store, get, write_back] = P::ROUND_NAMES;
        match self {
            RequestBody::Clock => clock,
            RequestBody::Store(_) => store,
            RequestBody::Get => get,
            RequestBody::WriteBack(_) => write_back,
        }
    }
}

/// A server-to-client message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Response<P: Policy> {
    /// Echoes the request's operation.
    pub op: OpId,
    /// The epoch the server answered in: a phase counts only replies of the client's epoch.
    pub epoch: Epoch,
    /// The round's payload.
    pub body: ResponseBody<P>,
}

impl<P: Policy> Response<P> {
    /// Why the server refused, when it did.
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.body {
            ResponseBody::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// Replies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum ResponseBody<P: Policy> {
    /// What the stored version reveals to a writer; `None` for a key never written here.
    ClockAck(Option<P::Clock>),
    /// The stored version.
    Value(Option<P::Entry>),
    /// The version `ts` (or a newer one) is durable here.
    StoreAck(Timestamp),
    /// The server will not serve this request.
    Refused(Refusal),
}

/// Why a server refused a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The client may not write, or stored a version made for another writer.
    #[error("not a writer")]
    NotWriter,
    /// The client may not read.
    #[error("not a reader")]
    NotReader,
    /// Another epoch than the server's: it names its own, so a client behind can catch up.
    #[error("wrong epoch: the server is in epoch {}", current.0)]
    WrongEpoch {
        /// The server's epoch.
        current: Epoch,
    },
    /// The server is still taking over this key from its previous group.
    #[error("the key is still being transferred")]
    Transferring,
    /// A group this node does not serve.
    #[error("wrong replica group")]
    WrongGroup,
    /// The request was malformed; the text says how.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The signature does not verify under the writer's registered key.
    #[error("bad signature")]
    BadSignature,
}

// ---------------------------------------------------------------------------------------------
// Server

/// A state change the driver makes durable before sending the reply that came with it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<P: Policy> {
    /// The stored version of `key` is now `entry`.
    Put {
        /// The register.
        key: Key,
        /// The new version.
        entry: P::Entry,
    },
}

/// The outcome of one request: persist `changes`, then send `reply`.
#[derive(Debug)]
pub struct Handled<P: Policy> {
    /// Durable before the reply leaves.
    pub changes: Vec<Change<P>>,
    /// The reply.
    pub reply: Response<P>,
    /// Set when the request was refused, for metrics and logs.
    pub refused: Option<Refusal>,
}

/// Counters for `bulwark status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Keys whose stored version is a value.
    pub objects: u64,
    /// Keys with any state.
    pub keys: u64,
    /// Value bytes held.
    pub value_bytes: u64,
}

/// A register server: the highest-timestamped valid version of every key.
pub struct Server<P: Policy> {
    node: Slot,
    epoch: Epoch,
    group: GroupId,
    context: P::Context,
    stored: HashMap<Key, P::Entry>,
}

impl<P: Policy> Server<P> {
    /// A server with empty state that checks versions with `context`.
    pub fn with_context(node: Slot, epoch: Epoch, group: GroupId, context: P::Context) -> Self {
        Server {
            node,
            epoch,
            group,
            context,
            stored: HashMap::new(),
        }
    }

    /// This server's index.
    pub fn node(&self) -> Slot {
        self.node
    }

    /// Reloads one durable version at start-up, keeping the higher one if called twice; `false`
    /// (and nothing kept) when no correct server could have stored it, as after damage on disk.
    pub fn restore(&mut self, key: Key, entry: P::Entry) -> bool {
        if P::judge(&self.context, self.group, &key, &entry) != Judged::Valid {
            return false;
        }
        self.adopt(key, entry);
        true
    }

    /// The stored version of `key`.
    pub fn stored(&self, key: &Key) -> Option<&P::Entry> {
        self.stored.get(key)
    }

    /// Stores `entry` if it is newer; returns whether it was.
    fn adopt(&mut self, key: Key, entry: P::Entry) -> bool {
        match self.stored.get(&key) {
            Some(current) if P::ts(current) >= P::ts(&entry) => false,
            _ => {
                self.stored.insert(key, entry);
                true
            }
        }
    }

    /// Handles one authenticated request from client `from` with the given rights.
    pub fn serve(
        &mut self,
        from: ClientId,
        may_write: bool,
        may_read: bool,
        request: Request<P>,
    ) -> Handled<P> {
        let current = self.stored.get(&request.key).cloned();
        let handled = self.answer(from, may_write, may_read, request, current.as_ref());
        for Change::Put { key, entry } in &handled.changes {
            self.stored.insert(key.clone(), entry.clone());
        }
        handled
    }

    /// The answer to one authenticated request from client `from` with the given rights, where
    /// `current` is the stored version of its key; nothing is stored until the changes are
    /// (for a replica whose versions live in its driver's storage, not in this map).
    pub fn answer(
        &self,
        from: ClientId,
        may_write: bool,
        may_read: bool,
        request: Request<P>,
        current: Option<&P::Entry>,
    ) -> Handled<P> {
        let epoch = self.epoch;
        let refuse = |refusal: Refusal| Handled {
            changes: Vec::new(),
            reply: Response {
                op: request.op,
                epoch,
                body: ResponseBody::Refused(refusal.clone()),
            },
            refused: Some(refusal),
        };
        if request.epoch != self.epoch {
            return refuse(Refusal::WrongEpoch { current: epoch });
        }
        if request.group != self.group {
            return refuse(Refusal::WrongGroup);
        }
        if !request.key.is_valid() {
            return refuse(Refusal::Malformed("key length".into()));
        }
        let writes = matches!(request.body, RequestBody::Clock | RequestBody::Store(_));
        if writes && !may_write {
            return refuse(Refusal::NotWriter);
        }
        if !writes && !may_read {
            return refuse(Refusal::NotReader);
        }
        let mut changes = Vec::new();
        let body = match &request.body {
            RequestBody::Clock => ResponseBody::ClockAck(current.map(P::clock)),
            RequestBody::Get => ResponseBody::Value(current.cloned()),
            RequestBody::Store(entry) | RequestBody::WriteBack(entry) => {
                let store = matches!(request.body, RequestBody::Store(_));
                if let Some(refusal) =
                    P::admit(&self.context, self.group, &request.key, from, store, entry)
                {
                    return refuse(refusal);
                }
                // A retransmitted or older version is acknowledged without rewriting: what is
                // stored is at least as new, and durable before this reply leaves.
                if current.is_none_or(|current| P::ts(current) < P::ts(entry)) {
                    changes.push(Change::Put {
                        key: request.key.clone(),
                        entry: entry.clone(),
                    });
                }
                ResponseBody::StoreAck(P::ts(entry))
            }
        };
        Handled {
            changes,
            reply: Response {
                op: request.op,
                epoch,
                body,
            },
            refused: None,
        }
    }

    /// Current counters.
    pub fn stats(&self) -> ServerStats {
        let mut stats = ServerStats::default();
        for entry in self.stored.values() {
            stats.keys += 1;
            if let Some(value) = P::value(entry) {
                stats.objects += 1;
                stats.value_bytes += value.len() as u64;
            }
        }
        stats
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// What every client operation needs to know about the group.
#[derive(Clone, Debug)]
pub struct ClientConfig<P: Policy> {
    /// Group size.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// Configuration believed in.
    pub epoch: Epoch,
    /// Group addressed.
    pub group: GroupId,
    /// Deliberate breakage for the simulator's negative controls; none in real clients.
    pub mutations: RegisterMutations,
    /// What checks versions (the writers' keys).
    pub context: P::Context,
}

impl<P: Policy> ClientConfig<P> {
    /// A group for `f` faults in epoch 0, group 0.
    pub fn with_context(f: usize, context: P::Context) -> Self {
        ClientConfig {
            n: P::n(f),
            f,
            epoch: Epoch(0),
            group: GroupId(0),
            mutations: RegisterMutations::default(),
            context,
        }
    }

    /// `n - f`: every round's quorum (a majority when `n = 2f+1`).
    pub fn quorum(&self) -> usize {
        self.mutations.quorum(self.n - self.f)
    }

    /// One round's request to each of `to`.
    fn round(&self, op: OpId, key: &Key, to: Vec<Slot>, body: RequestBody<P>) -> Vec<Outbound<P>> {
        to.into_iter()
            .map(|slot| {
                let request = Request {
                    op,
                    epoch: self.epoch,
                    group: self.group,
                    key: key.clone(),
                    body: body.clone(),
                };
                (slot, request)
            })
            .collect()
    }

    fn judge(&self, key: &Key, entry: &P::Entry) -> Judged {
        if self.mutations.unverified {
            return Judged::Valid;
        }
        P::judge(&self.context, self.group, key, entry)
    }
}

/// A message to send.
pub type Outbound<P> = (Slot, Request<P>);

/// What a machine says after an input.
pub type Step<P, T> = crate::round::Step<T, Request<P>, ProtocolError>;

/// Why an operation ended without a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `f+1` nodes refused, so at least one correct node did.
    #[error("refused by {} nodes: {refusal}", nodes.len())]
    Refused {
        /// The first refusal.
        refusal: Refusal,
        /// Who refused.
        nodes: Vec<Slot>,
    },
}

/// A completed write.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// The write's timestamp.
    pub ts: Timestamp,
    /// Nodes whose STORE acks counted.
    pub acknowledged_by: Vec<Slot>,
}

/// A completed read.
#[derive(Clone, Debug)]
pub struct ReadOutcome {
    /// The value; `None` when never written or deleted.
    pub value: Option<Bytes>,
    /// The selected version; `None` when no node held a valid one.
    pub ts: Option<Timestamp>,
    /// Nodes whose replies completed the last round.
    pub answered_by: Vec<Slot>,
    /// Whether the read wrote its version back.
    pub wrote_back: bool,
    /// Nodes that served a version no writer made: provably faulty.
    pub forgers: Vec<Slot>,
}

/// `f+1` refusals end an operation; fewer change nothing.
fn refused<P: Policy, T>(
    refusals: &mut Refusals<Refusal>,
    from: Slot,
    refusal: Refusal,
    f: usize,
) -> Step<P, T> {
    match refusals.record(from, refusal, f) {
        Some((refusal, nodes)) => Step::Done(Err(ProtocolError::Refused { refusal, nodes })),
        None => Step::Continue(Vec::new()),
    }
}

enum WritePhase<P: Policy> {
    Clock(Replies<Option<Timestamp>>),
    Store(Replies<()>, P::Entry),
    Done,
}

/// One write (or delete) of one key.
pub struct WriteOp<P: Policy> {
    config: ClientConfig<P>,
    key: Key,
    op: OpId,
    writer: ClientId,
    seq: u64,
    signer: P::Signer,
    value: Option<Bytes>,
    phase: WritePhase<P>,
    refusals: Refusals<Refusal>,
}

impl<P: Policy> WriteOp<P> {
    /// A write of `value` (`None` deletes) by `writer`, made with `signer`; `seq` must be unique
    /// among its writes.
    pub fn with_signer(
        config: ClientConfig<P>,
        key: Key,
        op: OpId,
        writer: ClientId,
        seq: u64,
        signer: P::Signer,
        value: Option<Bytes>,
    ) -> Self {
        let n = config.n;
        WriteOp {
            config,
            key,
            op,
            writer,
            seq,
            signer,
            value,
            phase: WritePhase::Clock(Replies::new(n)),
            refusals: Refusals::new(n),
        }
    }

    /// The first round: CLOCK to every node.
    pub fn start(&mut self) -> Vec<Outbound<P>> {
        self.retransmit()
    }

    /// The current round to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound<P>> {
        let (missing, body): (Vec<Slot>, RequestBody<P>) = match &self.phase {
            WritePhase::Clock(replies) => (replies.missing().collect(), RequestBody::Clock),
            WritePhase::Store(replies, entry) => (
                replies.missing().collect(),
                RequestBody::Store(entry.clone()),
            ),
            WritePhase::Done => return Vec::new(),
        };
        self.config.round(self.op, &self.key, missing, body)
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<Slot> {
        match &self.phase {
            WritePhase::Clock(replies) => replies.nodes(),
            WritePhase::Store(replies, _) => replies.nodes(),
            WritePhase::Done => Vec::new(),
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: Slot, response: Response<P>) -> Step<P, WriteOutcome> {
        if response.op != self.op
            || response.epoch != self.config.epoch
            || from.index() >= self.config.n
        {
            return Step::Continue(Vec::new());
        }
        let quorum = self.config.quorum();
        match (&mut self.phase, response.body) {
            (WritePhase::Done, _) => Step::Continue(Vec::new()),
            (_, ResponseBody::Refused(refusal)) => {
                let step = refused(&mut self.refusals, from, refusal, self.config.f);
                if matches!(step, Step::Done(_)) {
                    self.phase = WritePhase::Done;
                }
                step
            }
            (WritePhase::Clock(replies), ResponseBody::ClockAck(clock)) => {
                let config = &self.config;
                let Clocked::Counted(ts) =
                    P::clock_ts(&config.context, config.group, &self.key, clock)
                else {
                    return Step::Continue(Vec::new());
                };
                if !replies.record(from, ts) || replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let highest = replies.present().filter_map(|(_, ts)| *ts).max();
                let ts = Timestamp {
                    num: highest.map_or(0, |ts| ts.num).saturating_add(1),
                    writer: self.writer,
                    seq: self.seq,
                };
                let entry = P::make(
                    &self.signer,
                    self.config.group,
                    &self.key,
                    ts,
                    self.value.take(),
                );
                self.phase = WritePhase::Store(Replies::new(self.config.n), entry);
                self.refusals = Refusals::new(self.config.n);
                Step::Continue(self.retransmit())
            }
            (WritePhase::Store(replies, entry), ResponseBody::StoreAck(ts)) => {
                if ts != P::ts(entry) || !replies.record(from, ()) || replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let outcome = WriteOutcome {
                    ts,
                    acknowledged_by: replies.nodes(),
                };
                self.phase = WritePhase::Done;
                Step::Done(Ok(outcome))
            }
            // A reply to another round (a late duplicate): ignored.
            _ => Step::Continue(Vec::new()),
        }
    }
}

enum ReadPhase<P: Policy> {
    Get(Replies<Option<P::Entry>>),
    WriteBack(Replies<()>, P::Entry),
    Done,
}

/// One read of one key.
pub struct ReadOp<P: Policy> {
    config: ClientConfig<P>,
    key: Key,
    op: OpId,
    phase: ReadPhase<P>,
    refusals: Refusals<Refusal>,
    forgers: Vec<Slot>,
}

impl<P: Policy> ReadOp<P> {
    /// A read of `key`.
    pub fn new(config: ClientConfig<P>, key: Key, op: OpId) -> Self {
        let n = config.n;
        ReadOp {
            config,
            key,
            op,
            phase: ReadPhase::Get(Replies::new(n)),
            refusals: Refusals::new(n),
            forgers: Vec::new(),
        }
    }

    /// The first round: GET to every node.
    pub fn start(&mut self) -> Vec<Outbound<P>> {
        self.retransmit()
    }

    /// The current round to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound<P>> {
        let (missing, body): (Vec<Slot>, RequestBody<P>) = match &self.phase {
            ReadPhase::Get(replies) => (replies.missing().collect(), RequestBody::Get),
            ReadPhase::WriteBack(replies, entry) => (
                replies.missing().collect(),
                RequestBody::WriteBack(entry.clone()),
            ),
            ReadPhase::Done => return Vec::new(),
        };
        self.config.round(self.op, &self.key, missing, body)
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<Slot> {
        match &self.phase {
            ReadPhase::Get(replies) => replies.nodes(),
            ReadPhase::WriteBack(replies, _) => replies.nodes(),
            ReadPhase::Done => Vec::new(),
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: Slot, response: Response<P>) -> Step<P, ReadOutcome> {
        if response.op != self.op
            || response.epoch != self.config.epoch
            || from.index() >= self.config.n
        {
            return Step::Continue(Vec::new());
        }
        let quorum = self.config.quorum();
        match (&mut self.phase, response.body) {
            (ReadPhase::Done, _) => Step::Continue(Vec::new()),
            (_, ResponseBody::Refused(refusal)) => {
                let step = refused(&mut self.refusals, from, refusal, self.config.f);
                if matches!(step, Step::Done(_)) {
                    self.phase = ReadPhase::Done;
                }
                step
            }
            (ReadPhase::Get(replies), ResponseBody::Value(entry)) => {
                let judged = entry
                    .as_ref()
                    .map_or(Judged::Valid, |e| self.config.judge(&self.key, e));
                // A malformed version is no answer at all; a forged one counts as "nothing" and
                // names the forger.
                let entry = match judged {
                    Judged::Ignored => return Step::Continue(Vec::new()),
                    Judged::Forged => None,
                    Judged::Valid => entry,
                };
                if !replies.record(from, entry) {
                    return Step::Continue(Vec::new());
                }
                if judged == Judged::Forged {
                    self.forgers.push(from);
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let highest = replies
                    .present()
                    .filter_map(|(_, e)| e.as_ref())
                    .max_by_key(|e| P::ts(e))
                    .cloned();
                let nodes = replies.nodes();
                let Some(highest) = highest else {
                    // No valid version among n - f: no write completed (it would leave a correct
                    // holder in every quorum) and no read returned one.
                    return self.finish(None, nodes, false);
                };
                // Every reply of the quorum holds it: every later quorum meets a correct holder,
                // so no write-back is needed.
                let everywhere = replies
                    .present()
                    .all(|(_, e)| e.as_ref().is_some_and(|e| P::ts(e) == P::ts(&highest)));
                if everywhere || self.config.mutations.no_write_back {
                    return self.finish(Some(highest), nodes, false);
                }
                self.phase = ReadPhase::WriteBack(Replies::new(self.config.n), highest);
                self.refusals = Refusals::new(self.config.n);
                Step::Continue(self.retransmit())
            }
            (ReadPhase::WriteBack(replies, entry), ResponseBody::StoreAck(ts)) => {
                if ts != P::ts(entry) || !replies.record(from, ()) || replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let entry = entry.clone();
                let nodes = replies.nodes();
                self.finish(Some(entry), nodes, true)
            }
            _ => Step::Continue(Vec::new()),
        }
    }

    fn finish(
        &mut self,
        entry: Option<P::Entry>,
        answered_by: Vec<Slot>,
        wrote_back: bool,
    ) -> Step<P, ReadOutcome> {
        self.phase = ReadPhase::Done;
        let ts = entry.as_ref().map(P::ts);
        Step::Done(Ok(ReadOutcome {
            value: entry.and_then(P::into_value),
            ts,
            answered_by,
            wrote_back,
            forgers: std::mem::take(&mut self.forgers),
        }))
    }
}

impl<P: Policy> Replica for Server<P> {
    const SERVICE: ServiceId = P::SERVICE;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Message = crate::machine::Never;
    type Change = Change<P>;
    type View = ();

    fn on_request(
        &mut self,
        _now: Time,
        client: ClientId,
        access: Access,
        request: Request<P>,
        _view: &(),
    ) -> Output<Self> {
        let handled = self.serve(client, access.write, access.read, request);
        Output {
            refused: handled.refused.map(|refusal| refusal.to_string()),
            ..Output::reply(handled.changes, handled.reply)
        }
    }

    fn stats(&self) -> ReplicaStats {
        let stats = Server::stats(self);
        // One whole version per key.
        ReplicaStats {
            objects: stats.objects,
            keys: stats.keys,
            versions: stats.keys,
            bytes: stats.value_bytes,
            ..ReplicaStats::default()
        }
    }
}

impl From<ProtocolError> for OpError {
    fn from(error: ProtocolError) -> Self {
        match error {
            ProtocolError::Refused { refusal, nodes } => OpError::Refused {
                reason: refusal.to_string(),
                by: nodes,
            },
        }
    }
}

fn progress<O, T, P: Policy>(step: Step<P, T>) -> Progress<O>
where
    O: Operation<Request = Request<P>, Output = T>,
{
    match step {
        crate::round::Step::Continue(sends) => Progress::Send(sends),
        crate::round::Step::Done(result) => Progress::Done(result.map_err(Into::into)),
    }
}

impl<P: Policy> Operation for WriteOp<P> {
    const SERVICE: ServiceId = P::SERVICE;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Output = WriteOutcome;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<Outbound<P>> {
        WriteOp::start(self)
    }

    fn on_reply(&mut self, from: Slot, reply: Response<P>) -> Progress<Self> {
        progress(self.on_response(from, reply))
    }

    fn on_timeout(&mut self) -> Vec<Outbound<P>> {
        self.retransmit()
    }

    fn answered(&self) -> Vec<Slot> {
        WriteOp::answered(self)
    }

    fn quorum(&self) -> usize {
        self.config.quorum()
    }
}

impl<P: Policy> Operation for ReadOp<P> {
    const SERVICE: ServiceId = P::SERVICE;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Output = ReadOutcome;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<Outbound<P>> {
        ReadOp::start(self)
    }

    fn on_reply(&mut self, from: Slot, reply: Response<P>) -> Progress<Self> {
        progress(self.on_response(from, reply))
    }

    fn on_timeout(&mut self) -> Vec<Outbound<P>> {
        self.retransmit()
    }

    fn answered(&self) -> Vec<Slot> {
        ReadOp::answered(self)
    }

    fn quorum(&self) -> usize {
        self.config.quorum()
    }
}
