//! Multi-writer ABD (Attiya, Bar-Noy, Dolev; the multi-writer form of Lynch and Shvartsman): the
//! crash-tolerant linearizable register PoWerStore's evaluation compares against (spec §6.1,
//! "M-ABD"). `n = 2f+1` servers, every quorum a majority `f+1`; servers may crash, never lie.
//!
//! - A write asks a majority for their timestamps (CLOCK), then stores `(max.num + 1, writer,
//!   seq)` with the whole value at a majority (STORE).
//! - A read asks a majority for their `(ts, value)` (GET), takes the highest, writes it back to a
//!   majority (WRITE-BACK) unless every reply of the quorum already carried that timestamp, and
//!   returns it.
//!
//! A server keeps the highest-timestamped value per key and acknowledges a STORE only once that
//! value is durable (the driver persists [`Change`]s before the reply leaves). Deletes are
//! tombstone writes (`value: None`). `seq` makes timestamps unique per write operation, so two
//! concurrent writes of one client never share a timestamp.

use crate::round::{Refusals, RegisterMutations, Replies};
use bulwark_core::{ClientId, Epoch, GroupId, Key, NodeId, OBJECT_BYTES_MAX};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub use crate::round::OpId;

/// A write's timestamp, ordered by `(num, writer, seq)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    /// The logical clock; at least 1 for any real write.
    pub num: u64,
    /// The writer's client index.
    pub writer: ClientId,
    /// Unique per write operation of this writer.
    pub seq: u64,
}

/// A stored version: its timestamp and value (`None`: a delete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// The whole value; `None` is a tombstone.
    pub value: Option<Bytes>,
}

impl Entry {
    /// Whether a correct party could have made it: a real timestamp, a value within the limit.
    pub fn is_well_formed(&self) -> bool {
        self.ts.num >= 1
            && self
                .value
                .as_ref()
                .is_none_or(|v| v.len() <= OBJECT_BYTES_MAX)
    }
}

/// A client-to-server message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The operation.
    pub op: OpId,
    /// The configuration the client believes in.
    pub epoch: Epoch,
    /// The replica group addressed.
    pub group: GroupId,
    /// The register.
    pub key: Key,
    /// The round's payload.
    pub body: RequestBody,
}

/// The rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RequestBody {
    /// A writer asks for the stored timestamp.
    Clock,
    /// A writer stores a new version.
    Store(Entry),
    /// A reader asks for the stored version.
    Get,
    /// A reader writes the version it selected back.
    WriteBack(Entry),
}

impl RequestBody {
    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            RequestBody::Clock => "abd_clock",
            RequestBody::Store(_) => "abd_store",
            RequestBody::Get => "abd_get",
            RequestBody::WriteBack(_) => "abd_write_back",
        }
    }
}

/// A server-to-client message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Echoes the request's operation.
    pub op: OpId,
    /// The round's payload.
    pub body: ResponseBody,
}

/// Replies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// The stored timestamp; `None` for a key never written here.
    ClockAck(Option<Timestamp>),
    /// The stored version.
    Value(Option<Entry>),
    /// The version `ts` (or a newer one) is durable here.
    StoreAck(Timestamp),
    /// The server will not serve this request.
    Refused(Refusal),
}

/// Why a server refused a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The client may not write.
    #[error("not a writer")]
    NotWriter,
    /// The client may not read.
    #[error("not a reader")]
    NotReader,
    /// Another epoch.
    #[error("wrong epoch")]
    WrongEpoch,
    /// A group this node does not serve.
    #[error("wrong replica group")]
    WrongGroup,
    /// The request was malformed; the text says how.
    #[error("malformed request: {0}")]
    Malformed(String),
}

// ---------------------------------------------------------------------------------------------
// Server

/// A state change the driver makes durable before sending the reply that came with it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The stored version of `key` is now `entry`.
    Put {
        /// The register.
        key: Key,
        /// The new version.
        entry: Entry,
    },
}

/// The outcome of one request: persist `changes`, then send `reply`.
#[derive(Debug)]
pub struct Handled {
    /// Durable before the reply leaves.
    pub changes: Vec<Change>,
    /// The reply.
    pub reply: Response,
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

/// An ABD server: the highest-timestamped version of every key.
pub struct Server {
    node: NodeId,
    epoch: Epoch,
    group: GroupId,
    stored: HashMap<Key, Entry>,
}

impl Server {
    /// A server with empty state.
    pub fn new(node: NodeId, epoch: Epoch, group: GroupId) -> Server {
        Server {
            node,
            epoch,
            group,
            stored: HashMap::new(),
        }
    }

    /// This server's index.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Reloads one durable version at start-up; keeps the higher one if called twice.
    pub fn restore(&mut self, key: Key, entry: Entry) {
        self.adopt(key, entry);
    }

    /// The stored version of `key`.
    pub fn stored(&self, key: &Key) -> Option<&Entry> {
        self.stored.get(key)
    }

    /// Stores `entry` if it is newer; returns whether it was.
    fn adopt(&mut self, key: Key, entry: Entry) -> bool {
        match self.stored.get(&key) {
            Some(current) if current.ts >= entry.ts => false,
            _ => {
                self.stored.insert(key, entry);
                true
            }
        }
    }

    /// Handles one authenticated request from a client with the given rights.
    pub fn handle(&mut self, may_write: bool, may_read: bool, request: Request) -> Handled {
        let refuse = |refusal: Refusal| Handled {
            changes: Vec::new(),
            reply: Response {
                op: request.op,
                body: ResponseBody::Refused(refusal.clone()),
            },
            refused: Some(refusal),
        };
        if request.epoch != self.epoch {
            return refuse(Refusal::WrongEpoch);
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
            RequestBody::Clock => {
                ResponseBody::ClockAck(self.stored.get(&request.key).map(|e| e.ts))
            }
            RequestBody::Get => ResponseBody::Value(self.stored.get(&request.key).cloned()),
            RequestBody::Store(entry) | RequestBody::WriteBack(entry) => {
                if !entry.is_well_formed() {
                    return refuse(Refusal::Malformed("timestamp 0 or value too large".into()));
                }
                // A retransmitted or older version is acknowledged without rewriting: what is
                // stored is at least as new, and durable before this reply leaves.
                if self.adopt(request.key.clone(), entry.clone()) {
                    changes.push(Change::Put {
                        key: request.key.clone(),
                        entry: entry.clone(),
                    });
                }
                ResponseBody::StoreAck(entry.ts)
            }
        };
        Handled {
            changes,
            reply: Response {
                op: request.op,
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
            if let Some(value) = &entry.value {
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
pub struct ClientConfig {
    /// Group size `2f+1`.
    pub n: usize,
    /// Crashes tolerated.
    pub f: usize,
    /// Configuration believed in.
    pub epoch: Epoch,
    /// Group addressed.
    pub group: GroupId,
    /// Deliberate breakage for the simulator's negative controls; none in real clients.
    pub mutations: RegisterMutations,
}

impl ClientConfig {
    /// A group of `2f+1` in epoch 0, group 0.
    pub fn new(f: usize) -> ClientConfig {
        ClientConfig {
            n: 2 * f + 1,
            f,
            epoch: Epoch(0),
            group: GroupId(0),
            mutations: RegisterMutations::default(),
        }
    }

    /// A majority: every round's quorum.
    pub fn quorum(&self) -> usize {
        self.mutations.quorum(self.n - self.f)
    }

    fn request(&self, op: OpId, key: &Key, body: RequestBody) -> Request {
        Request {
            op,
            epoch: self.epoch,
            group: self.group,
            key: key.clone(),
            body,
        }
    }
}

/// A message to send.
pub type Outbound = (NodeId, Request);

/// What a machine says after an input.
pub type Step<T> = crate::round::Step<T, Request, ProtocolError>;

/// Why an operation ended without a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `f+1` nodes refused.
    #[error("refused by {} nodes: {refusal}", nodes.len())]
    Refused {
        /// The first refusal.
        refusal: Refusal,
        /// Who refused.
        nodes: Vec<NodeId>,
    },
}

/// A completed write.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// The write's timestamp.
    pub ts: Timestamp,
    /// Nodes whose STORE acks counted.
    pub acknowledged_by: Vec<NodeId>,
}

/// A completed read.
#[derive(Clone, Debug)]
pub struct ReadOutcome {
    /// The value; `None` when never written or deleted.
    pub value: Option<Bytes>,
    /// The selected version; `None` when no node held one.
    pub ts: Option<Timestamp>,
    /// Nodes whose replies completed the last round.
    pub answered_by: Vec<NodeId>,
    /// Whether the read wrote its version back.
    pub wrote_back: bool,
}

/// `f+1` refusals end an operation.
fn refused(
    refusals: &mut Refusals<Refusal>,
    from: NodeId,
    refusal: Refusal,
    f: usize,
) -> Option<ProtocolError> {
    let (refusal, nodes) = refusals.record(from, refusal, f)?;
    Some(ProtocolError::Refused { refusal, nodes })
}

enum WritePhase {
    Clock(Replies<Option<Timestamp>>),
    Store(Replies<()>, Entry),
    Done,
}

/// One write (or delete) of one key.
pub struct WriteOp {
    config: ClientConfig,
    key: Key,
    op: OpId,
    writer: ClientId,
    seq: u64,
    value: Option<Bytes>,
    phase: WritePhase,
    refusals: Refusals<Refusal>,
}

impl WriteOp {
    /// A write of `value` (`None` deletes) by `writer`; `seq` must be unique among its writes.
    pub fn new(
        config: ClientConfig,
        key: Key,
        op: OpId,
        writer: ClientId,
        seq: u64,
        value: Option<Bytes>,
    ) -> WriteOp {
        let n = config.n;
        WriteOp {
            config,
            key,
            op,
            writer,
            seq,
            value,
            phase: WritePhase::Clock(Replies::new(n)),
            refusals: Refusals::new(n),
        }
    }

    /// The first round: CLOCK to every node.
    pub fn start(&mut self) -> Vec<Outbound> {
        self.retransmit()
    }

    /// The current round to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound> {
        let (missing, body): (Vec<NodeId>, RequestBody) = match &self.phase {
            WritePhase::Clock(replies) => (replies.missing().collect(), RequestBody::Clock),
            WritePhase::Store(replies, entry) => (
                replies.missing().collect(),
                RequestBody::Store(entry.clone()),
            ),
            WritePhase::Done => return Vec::new(),
        };
        missing
            .into_iter()
            .map(|n| (n, self.config.request(self.op, &self.key, body.clone())))
            .collect()
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<NodeId> {
        match &self.phase {
            WritePhase::Clock(replies) => replies.nodes(),
            WritePhase::Store(replies, _) => replies.nodes(),
            WritePhase::Done => Vec::new(),
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: NodeId, response: Response) -> Step<WriteOutcome> {
        if response.op != self.op || from.index() >= self.config.n {
            return Step::Continue(Vec::new());
        }
        let quorum = self.config.quorum();
        match (&mut self.phase, response.body) {
            (WritePhase::Done, _) => Step::Continue(Vec::new()),
            (_, ResponseBody::Refused(refusal)) => {
                match refused(&mut self.refusals, from, refusal, self.config.f) {
                    Some(error) => {
                        self.phase = WritePhase::Done;
                        Step::Done(Err(error))
                    }
                    None => Step::Continue(Vec::new()),
                }
            }
            (WritePhase::Clock(replies), ResponseBody::ClockAck(ts)) => {
                if ts.is_some_and(|ts| ts.num == 0) || !replies.record(from, ts) {
                    return Step::Continue(Vec::new());
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let highest = replies.present().filter_map(|(_, ts)| *ts).max();
                let entry = Entry {
                    ts: Timestamp {
                        num: highest.map_or(0, |ts| ts.num).saturating_add(1),
                        writer: self.writer,
                        seq: self.seq,
                    },
                    value: self.value.take(),
                };
                self.phase = WritePhase::Store(Replies::new(self.config.n), entry);
                self.refusals = Refusals::new(self.config.n);
                Step::Continue(self.retransmit())
            }
            (WritePhase::Store(replies, entry), ResponseBody::StoreAck(ts)) => {
                if ts != entry.ts || !replies.record(from, ()) || replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let outcome = WriteOutcome {
                    ts: entry.ts,
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

enum ReadPhase {
    Get(Replies<Option<Entry>>),
    WriteBack(Replies<()>, Entry),
    Done,
}

/// One read of one key.
pub struct ReadOp {
    config: ClientConfig,
    key: Key,
    op: OpId,
    phase: ReadPhase,
    refusals: Refusals<Refusal>,
}

impl ReadOp {
    /// A read of `key`.
    pub fn new(config: ClientConfig, key: Key, op: OpId) -> ReadOp {
        let n = config.n;
        ReadOp {
            config,
            key,
            op,
            phase: ReadPhase::Get(Replies::new(n)),
            refusals: Refusals::new(n),
        }
    }

    /// The first round: GET to every node.
    pub fn start(&mut self) -> Vec<Outbound> {
        self.retransmit()
    }

    /// The current round to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound> {
        let (missing, body): (Vec<NodeId>, RequestBody) = match &self.phase {
            ReadPhase::Get(replies) => (replies.missing().collect(), RequestBody::Get),
            ReadPhase::WriteBack(replies, entry) => (
                replies.missing().collect(),
                RequestBody::WriteBack(entry.clone()),
            ),
            ReadPhase::Done => return Vec::new(),
        };
        missing
            .into_iter()
            .map(|n| (n, self.config.request(self.op, &self.key, body.clone())))
            .collect()
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<NodeId> {
        match &self.phase {
            ReadPhase::Get(replies) => replies.nodes(),
            ReadPhase::WriteBack(replies, _) => replies.nodes(),
            ReadPhase::Done => Vec::new(),
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: NodeId, response: Response) -> Step<ReadOutcome> {
        if response.op != self.op || from.index() >= self.config.n {
            return Step::Continue(Vec::new());
        }
        let quorum = self.config.quorum();
        match (&mut self.phase, response.body) {
            (ReadPhase::Done, _) => Step::Continue(Vec::new()),
            (_, ResponseBody::Refused(refusal)) => {
                match refused(&mut self.refusals, from, refusal, self.config.f) {
                    Some(error) => {
                        self.phase = ReadPhase::Done;
                        Step::Done(Err(error))
                    }
                    None => Step::Continue(Vec::new()),
                }
            }
            (ReadPhase::Get(replies), ResponseBody::Value(entry)) => {
                if entry.as_ref().is_some_and(|e| !e.is_well_formed())
                    || !replies.record(from, entry)
                    || replies.count() < quorum
                {
                    return Step::Continue(Vec::new());
                }
                let highest = replies
                    .present()
                    .filter_map(|(_, e)| e.as_ref())
                    .max_by_key(|e| e.ts)
                    .cloned();
                let Some(highest) = highest else {
                    // No node of a majority holds anything: no write has completed, and no read
                    // returned a value (both leave a majority holding it).
                    let nodes = replies.nodes();
                    return self.finish(None, nodes, false);
                };
                // Every reply already holds the version: a majority stores it, no write-back.
                let everywhere = replies
                    .present()
                    .all(|(_, e)| e.as_ref().is_some_and(|e| e.ts == highest.ts));
                if everywhere || self.config.mutations.no_write_back {
                    let nodes = replies.nodes();
                    return self.finish(Some(highest), nodes, false);
                }
                self.phase = ReadPhase::WriteBack(Replies::new(self.config.n), highest);
                self.refusals = Refusals::new(self.config.n);
                Step::Continue(self.retransmit())
            }
            (ReadPhase::WriteBack(replies, entry), ResponseBody::StoreAck(ts)) => {
                if ts != entry.ts || !replies.record(from, ()) || replies.count() < quorum {
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
        entry: Option<Entry>,
        answered_by: Vec<NodeId>,
        wrote_back: bool,
    ) -> Step<ReadOutcome> {
        self.phase = ReadPhase::Done;
        let ts = entry.as_ref().map(|e| e.ts);
        Step::Done(Ok(ReadOutcome {
            value: entry.and_then(|e| e.value),
            ts,
            answered_by,
            wrote_back,
        }))
    }
}

#[cfg(test)]
mod tests;
