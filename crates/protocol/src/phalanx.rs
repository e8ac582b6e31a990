//! A Phalanx-style Byzantine-tolerant register with writer signatures (Malkhi and Reiter): the
//! signature-based baseline PoWerStore's evaluation compares against (spec §6.1, "M-Phalanx").
//! `n = 3f+1` servers, every quorum `n - f`; up to `f` servers may lie.
//!
//! - A write asks `n - f` servers for their timestamps (CLOCK), then stores `(max.num + 1, writer,
//!   seq)`, the whole value and the writer's Ed25519 signature over `(group, key, ts, H(value))`
//!   at `n - f` servers (STORE). Servers check the signature (`verify_strict`) before storing, so
//!   only what a registered writer signed is ever stored or served.
//! - A read asks `n - f` servers for their version (GET), takes the highest timestamp whose
//!   signature verifies, writes that signed version back to `n - f` servers (WRITE-BACK) unless
//!   every reply of the quorum carried it, and returns it. A Byzantine server cannot forge a
//!   version; it can only withhold or replay old ones, and a quorum of `n - f` meets every other
//!   quorum in `f + 1` servers, one of them correct.
//!
//! Writers' public keys come from the cluster configuration ([`Writers`]); weak keys are refused
//! when they are registered. Deletes are signed tombstones (`value: None`).

use crate::round::{Refusals, RegisterMutations, Replies};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, NodeId, OBJECT_BYTES_MAX};
use bytes::Bytes;
pub use ed25519_dalek::SigningKey;
use ed25519_dalek::{Signature, Signer, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

const DOMAIN_VALUE: &str = "bulwark.phalanx.value";
const DOMAIN_SIGNED: &[u8] = b"bulwark.phalanx.signed-version.v1";

pub use crate::round::OpId;

/// A write's timestamp, ordered by `(num, writer, seq)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    /// The logical clock; at least 1 for any real write.
    pub num: u64,
    /// The writer's client index: the key that must have signed.
    pub writer: ClientId,
    /// Unique per write operation of this writer.
    pub seq: u64,
}

/// The writers' public keys, by client index, from the cluster configuration.
#[derive(Clone, Debug, Default)]
pub struct Writers(HashMap<ClientId, VerifyingKey>);

/// Why a public key cannot be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not the encoding of a curve point.
    #[error("not an Ed25519 public key")]
    Invalid,
    /// A small-order key, for which signatures prove nothing.
    #[error("a weak (small-order) Ed25519 public key")]
    Weak,
}

impl Writers {
    /// Every writer's key from `cluster.toml`, refusing malformed and weak keys with an error
    /// naming the field.
    pub fn from_config(
        cluster: &bulwark_core::config::ClusterConfig,
        file: &str,
    ) -> Result<Writers, bulwark_core::config::ConfigError> {
        let mut writers = Writers::default();
        for (i, client) in cluster.clients.iter().enumerate() {
            let (true, Some(public)) = (client.write, client.signing_key) else {
                continue;
            };
            writers
                .register(ClientId(i as u32), &public)
                .map_err(|error| bulwark_core::config::ConfigError::Invalid {
                    file: file.to_string(),
                    field: format!("clients[{i}].signing_key"),
                    problem: error.to_string(),
                })?;
        }
        Ok(writers)
    }

    /// Registers `writer`'s public key, refusing malformed and weak keys.
    pub fn register(&mut self, writer: ClientId, public: &[u8; 32]) -> Result<(), KeyError> {
        let key = VerifyingKey::from_bytes(public).map_err(|_| KeyError::Invalid)?;
        if key.is_weak() {
            return Err(KeyError::Weak);
        }
        self.0.insert(writer, key);
        Ok(())
    }

    /// Whether `entry` carries a valid signature of its timestamp's writer.
    pub fn verify(&self, group: GroupId, key: &Key, entry: &Entry) -> bool {
        entry.is_well_formed() && self.verify_timestamp(group, key, &entry.signed_timestamp())
    }

    /// Whether a version's signed timestamp (its value replaced by the value's hash) verifies.
    pub fn verify_timestamp(&self, group: GroupId, key: &Key, signed: &SignedTimestamp) -> bool {
        let Some(public) = self.0.get(&signed.ts.writer) else {
            return false;
        };
        let Ok(signature) = <[u8; 64]>::try_from(signed.signature.as_ref()) else {
            return false;
        };
        signed.ts.num >= 1
            && public
                .verify_strict(
                    &signed_bytes(
                        group,
                        key,
                        &signed.ts,
                        signed.tombstone,
                        &signed.value_digest,
                    ),
                    &Signature::from_bytes(&signature),
                )
                .is_ok()
    }
}

/// What CLOCK returns: a stored version's timestamp with the hash of its value instead of the
/// value, so a writer can check the signature without fetching the data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedTimestamp {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// Whether the version is a delete.
    pub tombstone: bool,
    /// `H(value)`.
    pub value_digest: Digest,
    /// The writer's signature over the version.
    pub signature: Bytes,
}

fn value_digest(value: Option<&[u8]>) -> Digest {
    match value {
        Some(value) => Digest::of(DOMAIN_VALUE, value),
        None => Digest::of(DOMAIN_VALUE, b"tombstone"),
    }
}

/// The signing key made from a 32-byte secret, as `cluster init` draws it.
pub fn signing_key(secret: &[u8; 32]) -> SigningKey {
    SigningKey::from_bytes(secret)
}

/// The public half of a signing key's secret, as registered in `cluster.toml`.
pub fn public_key(secret: &[u8; 32]) -> [u8; 32] {
    signing_key(secret).verifying_key().to_bytes()
}

/// The exact bytes a writer signs: domain, group, key, timestamp, whether it is a delete, and the
/// value's hash.
fn signed_bytes(
    group: GroupId,
    key: &Key,
    ts: &Timestamp,
    tombstone: bool,
    digest: &Digest,
) -> Vec<u8> {
    let mut bytes =
        Vec::with_capacity(DOMAIN_SIGNED.len() + 8 + 2 + key.as_bytes().len() + 20 + 33);
    bytes.extend_from_slice(DOMAIN_SIGNED);
    bytes.extend_from_slice(&group.0.to_be_bytes());
    bytes.extend_from_slice(&(key.as_bytes().len() as u16).to_be_bytes());
    bytes.extend_from_slice(key.as_bytes());
    bytes.extend_from_slice(&ts.num.to_be_bytes());
    bytes.extend_from_slice(&ts.writer.0.to_be_bytes());
    bytes.extend_from_slice(&ts.seq.to_be_bytes());
    bytes.push(u8::from(!tombstone));
    bytes.extend_from_slice(&digest.0);
    bytes
}

/// A signed version: timestamp, value (`None`: a delete) and the writer's signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// The whole value; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Ed25519 by `ts.writer` over `(group, key, ts, H(value))`: 64 bytes.
    pub signature: Bytes,
}

impl Entry {
    /// Signs a new version.
    pub fn sign(
        group: GroupId,
        key: &Key,
        ts: Timestamp,
        value: Option<Bytes>,
        signing: &SigningKey,
    ) -> Entry {
        let digest = value_digest(value.as_deref());
        let signature = signing.sign(&signed_bytes(group, key, &ts, value.is_none(), &digest));
        Entry {
            ts,
            value,
            signature: Bytes::copy_from_slice(&signature.to_bytes()),
        }
    }

    /// The timestamp, the value's hash and the signature: what CLOCK returns.
    pub fn signed_timestamp(&self) -> SignedTimestamp {
        SignedTimestamp {
            ts: self.ts,
            tombstone: self.value.is_none(),
            value_digest: value_digest(self.value.as_deref()),
            signature: self.signature.clone(),
        }
    }

    /// Shape only: a real timestamp, a value within the limit, a 64-byte signature.
    pub fn is_well_formed(&self) -> bool {
        self.ts.num >= 1
            && self.signature.len() == 64
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
    /// A writer stores a version it signed.
    Store(Entry),
    /// A reader asks for the stored version.
    Get,
    /// A reader writes the signed version it selected back.
    WriteBack(Entry),
}

impl RequestBody {
    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            RequestBody::Clock => "phalanx_clock",
            RequestBody::Store(_) => "phalanx_store",
            RequestBody::Get => "phalanx_get",
            RequestBody::WriteBack(_) => "phalanx_write_back",
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
    /// The stored version's signed timestamp: writers need not trust the server, nor fetch the
    /// value.
    ClockAck(Option<SignedTimestamp>),
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
    /// The client may not write, or stored a version signed for another writer.
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
    /// The signature does not verify under the writer's registered key.
    #[error("bad signature")]
    BadSignature,
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

/// A Phalanx-style server: the highest-timestamped signed version of every key.
pub struct Server {
    node: NodeId,
    epoch: Epoch,
    group: GroupId,
    writers: Arc<Writers>,
    stored: HashMap<Key, Entry>,
}

impl Server {
    /// A server with empty state that accepts versions signed by `writers`.
    pub fn new(node: NodeId, epoch: Epoch, group: GroupId, writers: Arc<Writers>) -> Server {
        Server {
            node,
            epoch,
            group,
            writers,
            stored: HashMap::new(),
        }
    }

    /// This server's index.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Reloads one durable version at start-up; `false` (and nothing kept) when its signature
    /// does not verify, as after damage on disk.
    pub fn restore(&mut self, key: Key, entry: Entry) -> bool {
        if !self.writers.verify(self.group, &key, &entry) {
            return false;
        }
        self.adopt(key, entry);
        true
    }

    /// The stored version of `key`.
    pub fn stored(&self, key: &Key) -> Option<&Entry> {
        self.stored.get(key)
    }

    fn adopt(&mut self, key: Key, entry: Entry) -> bool {
        match self.stored.get(&key) {
            Some(current) if current.ts >= entry.ts => false,
            _ => {
                self.stored.insert(key, entry);
                true
            }
        }
    }

    /// Handles one authenticated request from client `from` with the given rights.
    pub fn handle(
        &mut self,
        from: ClientId,
        may_write: bool,
        may_read: bool,
        request: Request,
    ) -> Handled {
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
                ResponseBody::ClockAck(self.stored.get(&request.key).map(Entry::signed_timestamp))
            }
            RequestBody::Get => ResponseBody::Value(self.stored.get(&request.key).cloned()),
            RequestBody::Store(entry) | RequestBody::WriteBack(entry) => {
                if !entry.is_well_formed() {
                    return refuse(Refusal::Malformed(
                        "timestamp 0, value too large or signature length".into(),
                    ));
                }
                // A writer stores only versions it signed itself; readers write back anyone's.
                if matches!(request.body, RequestBody::Store(_)) && entry.ts.writer != from {
                    return refuse(Refusal::NotWriter);
                }
                if !self.writers.verify(self.group, &request.key, entry) {
                    return refuse(Refusal::BadSignature);
                }
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
    /// Group size `3f+1`.
    pub n: usize,
    /// Byzantine servers tolerated.
    pub f: usize,
    /// Configuration believed in.
    pub epoch: Epoch,
    /// Group addressed.
    pub group: GroupId,
    /// The writers' public keys.
    pub writers: Arc<Writers>,
    /// Deliberate breakage for the simulator's negative controls; none in real clients.
    pub mutations: RegisterMutations,
}

impl ClientConfig {
    /// A group of `3f+1` in epoch 0, group 0.
    pub fn new(f: usize, writers: Arc<Writers>) -> ClientConfig {
        ClientConfig {
            n: 3 * f + 1,
            f,
            epoch: Epoch(0),
            group: GroupId(0),
            writers,
            mutations: RegisterMutations::default(),
        }
    }

    /// `n - f`: every round's quorum.
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

    /// The entry, if its signature verifies.
    fn verified(&self, key: &Key, entry: Option<Entry>) -> Option<Entry> {
        entry.filter(|e| self.mutations.unverified || self.writers.verify(self.group, key, e))
    }
}

/// A message to send.
pub type Outbound = (NodeId, Request);

/// What a machine says after an input.
pub type Step<T> = crate::round::Step<T, Request, ProtocolError>;

/// Why an operation ended without a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `f+1` nodes refused, so at least one correct node did.
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
    /// The selected version; `None` when no node held a valid one.
    pub ts: Option<Timestamp>,
    /// Nodes whose replies completed the last round.
    pub answered_by: Vec<NodeId>,
    /// Whether the read wrote its version back.
    pub wrote_back: bool,
    /// Nodes that served a version whose signature did not verify: provably faulty.
    pub forgers: Vec<NodeId>,
}

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
    signing: Arc<SigningKey>,
    value: Option<Bytes>,
    phase: WritePhase,
    refusals: Refusals<Refusal>,
}

impl WriteOp {
    /// A write of `value` (`None` deletes) by `writer`, signed with its key; `seq` must be
    /// unique among its writes.
    pub fn new(
        config: ClientConfig,
        key: Key,
        op: OpId,
        writer: ClientId,
        seq: u64,
        signing: Arc<SigningKey>,
        value: Option<Bytes>,
    ) -> WriteOp {
        let n = config.n;
        WriteOp {
            config,
            key,
            op,
            writer,
            seq,
            signing,
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
            (WritePhase::Clock(replies), ResponseBody::ClockAck(signed)) => {
                // Only a signed timestamp counts: a Byzantine server cannot push writers
                // arbitrarily far ahead.
                let config = &self.config;
                let ts = signed
                    .filter(|s| config.writers.verify_timestamp(config.group, &self.key, s))
                    .map(|s| s.ts);
                if !replies.record(from, ts) || replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let highest = replies.present().filter_map(|(_, ts)| *ts).max();
                let ts = Timestamp {
                    num: highest.map_or(0, |ts| ts.num).saturating_add(1),
                    writer: self.writer,
                    seq: self.seq,
                };
                let entry = Entry::sign(
                    self.config.group,
                    &self.key,
                    ts,
                    self.value.take(),
                    &self.signing,
                );
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
    forgers: Vec<NodeId>,
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
            forgers: Vec::new(),
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
                let offered = entry.is_some();
                let entry = self.config.verified(&self.key, entry);
                // A version no writer signed: counts as "nothing", and names the forger.
                let forged = offered && entry.is_none();
                if !replies.record(from, entry) {
                    return Step::Continue(Vec::new());
                }
                if forged {
                    self.forgers.push(from);
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let highest = replies
                    .present()
                    .filter_map(|(_, e)| e.as_ref())
                    .max_by_key(|e| e.ts)
                    .cloned();
                let nodes = replies.nodes();
                let Some(highest) = highest else {
                    // No signed version among n - f: no write completed (it would leave f + 1
                    // correct holders, one in every quorum) and no read returned one.
                    return self.finish(None, nodes, false);
                };
                // All n - f hold it, so at least f + 1 correct ones do: every later quorum
                // meets one of them.
                let everywhere = replies
                    .present()
                    .all(|(_, e)| e.as_ref().is_some_and(|e| e.ts == highest.ts));
                if everywhere || self.config.mutations.no_write_back {
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
            forgers: std::mem::take(&mut self.forgers),
        }))
    }
}

#[cfg(test)]
mod tests;
