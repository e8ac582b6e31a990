//! M-PoWerStore: the multi-writer, linearizable, wait-free, erasure-coded register of
//! "Proofs of Writing for Robust Storage" (Dobre et al.), §5, Algorithms 4–6, one register per key.
//!
//! A write takes three rounds (CLOCK, STORE, COMPLETE); a read takes two (COLLECT, FILTER) and a
//! third (REPAIR) only when a candidate's MAC vector was corrupted, or one when `n - f` COLLECT
//! replies name the same `lc` and `f+1` of them carry its version intact (our addition, argued in
//! docs/one-round-reads.md). Readers write back metadata only:
//! the nonce `N` revealed in COMPLETE is a proof of writing, because the writer reveals it only after
//! `n - f` servers stored the data under `H(N)`.
//!
//! Where we depart from the paper's pseudo-code, and why (see `shared/specs/powerstore.md`):
//! - §4.8(a): FILTER_ACK also carries `N̄ = H(N)`, `safe` requires `f+1` agreement on it, and the
//!   reader selects only a candidate whose nonce hashes to it. Without this a Byzantine server's
//!   twin candidate lets a read return a value no later read sees (a new-old inversion).
//! - §4.8(b): `Hist` is keyed by the whole timestamp, MAC tag included; timestamps are ordered by
//!   `(num, pid)` only.
//! - Every MAC binds the object key, so a candidate of one key can never be written back into
//!   another; a MAC vector also binds the group's incarnation (its members in order and the epoch
//!   they began in, [`Incarnation`]), and slot `i` is under the key server `i` shares with the
//!   writer alone ([`pair_key`]), so a vector checks only where it was made for.
//! - Garbage collection (the paper keeps `Hist` forever): see [`server`] for the rule and why reads
//!   stay correct.
//! - An empty candidate set after COLLECT returns "absent" at once: any completed write or read
//!   leaves `f+1` correct servers with a non-initial `lc`, and every `n-f` quorum meets one of them.
//!
//! Registers with one writer (the paper's §4, PoWerStore proper): a key that begins with
//! [`SOLE_WRITER_PREFIX`] names its only writer, nodes refuse every write round from anyone else,
//! and that writer, which knows the timestamp of its own last write, skips CLOCK: STORE, then
//! COMPLETE. A node refuses a STORE below its `lc` on such a register ([`Refusal::Stale`]), so a
//! writer that lost its clock (a second process under its identity, a restart with an old
//! counter) cannot complete a write that sorts below one already complete; the refusal names the
//! node's `lc`, and the writer stores again above it once its tag checks (see [`WriteOp::sole`]).

mod client;
pub mod epochs;
mod msg;
mod server;
pub mod takeover;
#[cfg(test)]
mod tests;

pub use client::{
    ClientConfig, ClientMutations, Evidence, EvidenceKind, Outbound, ProtocolError, Proven, ReadOp,
    ReadOutcome, Step, WriteOp, WriteOutcome,
};
pub use msg::{FilterAck, LcEntry, OpId, Refusal, Request, RequestBody, Response, ResponseBody};
pub use server::{
    Access, CACHED_KEYS_MAX, Change, EntryMeta, Fragments, Handled, MemoryFragments, Server,
    ServerConfig, ServerLogic, ServerMutations, ServerStats, StoredEntry, StoredKey,
};

use bulwark_core::erasure::Layout;
use bulwark_core::membership::{Chain, Incarnation};
use bulwark_core::sign::{PublicKey, SecretKey};
use bulwark_core::{ClientId, Digest, Key, MacKey, NodeId, Tag};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

/// The first bytes of a register key with one writer; the writer's client id follows, four bytes
/// big-endian, then the rest of the key.
pub const SOLE_WRITER_PREFIX: &[u8] = b"\0sw\0";

/// The only writer of `key`'s register, if it has one (see [`SOLE_WRITER_PREFIX`]).
pub fn sole_writer(key: &Key) -> Option<ClientId> {
    let rest = key.as_bytes().strip_prefix(SOLE_WRITER_PREFIX)?;
    let id: [u8; 4] = rest.get(..4)?.try_into().ok()?;
    Some(ClientId(u32::from_be_bytes(id)))
}

/// The key bytes of `name`'s register with `writer` as its only writer.
pub fn sole_writer_key(writer: ClientId, name: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(SOLE_WRITER_PREFIX.len() + 4 + name.len());
    key.extend_from_slice(SOLE_WRITER_PREFIX);
    key.extend_from_slice(&writer.0.to_be_bytes());
    key.extend_from_slice(name);
    key
}

const DOMAIN_TIMESTAMP: &str = "bulwark.powerstore.timestamp";
const DOMAIN_VEC: &str = "bulwark.powerstore.vec";
const DOMAIN_NONCE: &str = "bulwark 2026 powerstore nonce commitment";
const DOMAIN_FRAGMENT: &str = "bulwark 2026 powerstore fragment";
const DOMAIN_NONCE_RETRY: &str = "bulwark 2026 powerstore nonce of a retried write";
const DOMAIN_PAIR: &str = "bulwark 2026 powerstore writer-server key";

/// The writer part of a timestamp. `seq` is unique per write operation of a writer (a random
/// per-process prefix and a counter), so neither a restarted writer nor two concurrent writes of
/// one client can produce the same timestamp for different data (spec §7.1 item 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pid {
    /// The writer's client index.
    pub writer: ClientId,
    /// Unique per write operation of this writer.
    pub seq: u64,
}

/// A write timestamp `(num, pid, MAC_kW(num || pid))` (Alg. 4). Equality and hashing cover every
/// field, the tag included (§4.8(b)); ordering uses `(num, pid)` only, through [`Timestamp::cmp_order`].
/// It deliberately does not implement `Ord`, which would disagree with `Eq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Timestamp {
    /// The logical clock value; at least 1 for any real write.
    pub num: u64,
    /// Who wrote it.
    pub pid: Pid,
    /// `MAC_kW` over the key, `num` and `pid`: servers cannot make writers skip ahead.
    pub tag: Tag,
}

impl Timestamp {
    /// A timestamp authenticated under the writers' shared key `k_W`. It binds the key and not
    /// the group: a timestamp carried into a key's next group still orders the writes there.
    pub fn authenticated(key: &Key, num: u64, pid: Pid, k_w: &MacKey) -> Timestamp {
        let tag = k_w.mac(DOMAIN_TIMESTAMP, &Self::tag_parts(key, num, pid).each());
        Timestamp { num, pid, tag }
    }

    /// Whether the tag was made with `k_W` (Alg. 4, l. 100).
    pub fn verify(&self, key: &Key, k_w: &MacKey) -> bool {
        self.num >= 1
            && k_w.verify(
                DOMAIN_TIMESTAMP,
                &Self::tag_parts(key, self.num, self.pid).each(),
                &self.tag,
            )
    }

    fn tag_parts(key: &Key, num: u64, pid: Pid) -> Parts {
        Parts(vec![
            key.as_bytes().to_vec(),
            num.to_be_bytes().to_vec(),
            pid.writer.0.to_be_bytes().to_vec(),
            pid.seq.to_be_bytes().to_vec(),
        ])
    }

    /// The fixed-width encoding MACs and storage keys use: `num`, writer, seq, tag.
    pub fn canonical(&self) -> [u8; 52] {
        let mut out = [0u8; 52];
        out[..8].copy_from_slice(&self.num.to_be_bytes());
        out[8..12].copy_from_slice(&self.pid.writer.0.to_be_bytes());
        out[12..20].copy_from_slice(&self.pid.seq.to_be_bytes());
        out[20..].copy_from_slice(&self.tag.0);
        out
    }

    /// The protocol's order on timestamps: `(num, writer, seq)`, ignoring the tag.
    pub fn cmp_order(&self, other: &Timestamp) -> Ordering {
        self.order_key().cmp(&other.order_key())
    }

    fn order_key(&self) -> (u64, u32, u64) {
        (self.num, self.pid.writer.0, self.pid.seq)
    }
}

/// Compares optional timestamps, `None` being `ts_0`, lower than every real timestamp.
pub fn cmp_ts(a: Option<&Timestamp>, b: Option<&Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => a.cmp_order(b),
    }
}

struct Parts(Vec<Vec<u8>>);
impl Parts {
    fn each(&self) -> Vec<&[u8]> {
        self.0.iter().map(Vec::as_slice).collect()
    }
}

/// The secret `N` whose hash a writer stores with the data and which it reveals in COMPLETE.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Nonce(pub [u8; 32]);

impl std::fmt::Debug for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nonce({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

impl Nonce {
    /// `N̄ = H(N)`: the commitment stored with the data.
    pub fn commitment(&self) -> Digest {
        Digest::of(DOMAIN_NONCE, &self.0)
    }

    /// The nonce of attempt `attempt` of the write whose first nonce is `self`: as secret as
    /// `self`, and never the nonce of another attempt, so a timestamp an attempt abandoned can
    /// never be proven written by the nonce a later attempt reveals.
    pub fn for_attempt(&self, attempt: u32) -> Nonce {
        if attempt == 0 {
            return *self;
        }
        let mut input = [0u8; 36];
        input[..32].copy_from_slice(&self.0);
        input[32..].copy_from_slice(&attempt.to_be_bytes());
        Nonce(Digest::of(DOMAIN_NONCE_RETRY, &input).0)
    }
}

/// The hash a cross-checksum holds for one fragment.
pub fn fragment_digest(fragment: &[u8]) -> Digest {
    Digest::of(DOMAIN_FRAGMENT, fragment)
}

/// `vec`: one MAC per server over `ts || N̄` (Alg. 4), slot `i` under `k_{w,i}`, the key server `i`
/// shares with the writer `w` the timestamp names ([`pair_key`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MacVec(pub Vec<Tag>);

impl MacVec {
    /// Computes every server's MAC; only writers hold all the keys.
    pub fn compute(
        incarnation: &Incarnation,
        key: &Key,
        ts: &Timestamp,
        nonce_hash: &Digest,
        server_keys: &[MacKey],
    ) -> MacVec {
        MacVec(
            server_keys
                .iter()
                .map(|k| {
                    k.mac(
                        DOMAIN_VEC,
                        &vec_parts(incarnation, key, ts, nonce_hash).each(),
                    )
                })
                .collect(),
        )
    }

    /// The vector a version carried into a new incarnation holds there ([`takeover`]): no slot
    /// verifies, since the writer's MACs bind the incarnation it wrote in, so the version is
    /// valid at a member only through its own `Hist` entry, and every holder stores the same
    /// vector, as the readers' agreement on `(ts, cc, vec, N̄)` needs.
    pub fn carried(n: usize) -> MacVec {
        MacVec(vec![Tag([0; 32]); n])
    }

    /// Whether slot `index` is the MAC on `ts || N̄` under the key this server, holding `keys`,
    /// shares with the writer `ts` names (Alg. 5, l. 131, second disjunct). A writer the server
    /// shares no key with made no slot it can check.
    pub fn verify_slot(
        &self,
        index: usize,
        incarnation: &Incarnation,
        key: &Key,
        ts: &Timestamp,
        nonce_hash: &Digest,
        keys: &ServerKeys,
    ) -> bool {
        let Some(own_key) = keys.shared_with(ts.pid.writer) else {
            return false;
        };
        match self.0.get(index) {
            Some(tag) => own_key.verify(
                DOMAIN_VEC,
                &vec_parts(incarnation, key, ts, nonce_hash).each(),
                tag,
            ),
            None => false,
        }
    }
}

fn vec_parts(incarnation: &Incarnation, key: &Key, ts: &Timestamp, nonce_hash: &Digest) -> Parts {
    Parts(vec![
        incarnation.0.0.to_vec(),
        key.as_bytes().to_vec(),
        ts.canonical().to_vec(),
        nonce_hash.0.to_vec(),
    ])
}

/// A candidate `c = (ts, N, vec)`: the metadata readers collect and write back.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Candidate {
    /// The write's timestamp.
    pub ts: Timestamp,
    /// The revealed nonce: the proof of writing.
    pub nonce: Nonce,
    /// The per-server MACs over `ts || H(N)`.
    pub vec: MacVec,
}

/// The cross-checksum `cc`: the layout and one hash per fragment, plus whether the value is a
/// tombstone. Readers use only a `cc` that `f+1` servers agree on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CrossChecksum {
    /// How the value was cut.
    pub layout: Layout,
    /// A delete: the key reads as absent.
    pub tombstone: bool,
    /// `H(fr_i)` for every fragment `i`.
    pub hashes: Vec<Digest>,
}

impl CrossChecksum {
    /// Whether the structure fits a group of `n` and the object size limit.
    pub fn is_well_formed(&self, n: usize) -> bool {
        self.hashes.len() == n
            && self.layout.total() == n
            && self.layout.is_valid(bulwark_core::OBJECT_BYTES_MAX)
            && (!self.tombstone || self.layout.len == 0)
    }
}

/// The secrets a writer holds: `k_W` and the key it shares with each server (§1.3). Readers
/// hold none.
#[derive(Clone, Debug)]
pub struct WriterKeys {
    /// `k_W`, shared by writers only; no server can compute timestamp tags.
    pub timestamp: MacKey,
    /// `k_{w,i}` for every server `i` of the group, in slot order.
    pub servers: Vec<MacKey>,
}

/// A writer's own secrets, from which it derives the keys it shares with any node a certified
/// configuration names: what a write that follows its key into the next incarnation needs for
/// the members it has not written to before.
#[derive(Clone)]
pub struct WriterIdentity {
    /// The writer's signing key.
    pub signing: SecretKey,
    /// `k_W`.
    pub timestamp: MacKey,
}

impl WriterIdentity {
    /// The keys shared with `members`, in slot order; `None` when `chain` does not know the
    /// signing key of one of them.
    pub fn keys_for(&self, members: &[NodeId], chain: &Chain) -> Option<WriterKeys> {
        let servers = members
            .iter()
            .map(|node| Some(pair_key(&self.signing, chain.signing_key(*node)?)))
            .collect::<Option<Vec<_>>>()?;
        Some(WriterKeys {
            timestamp: self.timestamp.clone(),
            servers,
        })
    }
}

/// What the paper's per-server key `k_i` is here: the key writer `w` and a node share, from an
/// X25519 agreement on their Ed25519 keys. Each side derives it alone, so a node certified after
/// a writer's configuration was written checks its slot of that writer's vectors, and no
/// configuration file carries a server's MAC key. Readers, holding neither secret, cannot make a
/// slot verify; the slot a writer fills for server `i` verifies at `i` only.
pub fn pair_key(own: &SecretKey, peer: &PublicKey) -> MacKey {
    own.pair_key(peer).derive(DOMAIN_PAIR)
}

/// The keys one server shares with the writers it knows, by writer: `k_{w,i}` for its own `i`.
#[derive(Clone, Debug, Default)]
pub struct ServerKeys(Arc<HashMap<ClientId, MacKey>>);

impl ServerKeys {
    /// The keys `own`, a node's signing key, shares with each of `writers`.
    pub fn derived(
        own: &SecretKey,
        writers: impl IntoIterator<Item = (ClientId, PublicKey)>,
    ) -> ServerKeys {
        ServerKeys::from_keys(
            writers
                .into_iter()
                .map(|(writer, public)| (writer, pair_key(own, &public))),
        )
    }

    /// Keys given as they are (the simulator's and tests' random keys).
    pub fn from_keys(keys: impl IntoIterator<Item = (ClientId, MacKey)>) -> ServerKeys {
        ServerKeys(Arc::new(keys.into_iter().collect()))
    }

    /// The key shared with `writer`, if the server knows it.
    pub fn shared_with(&self, writer: ClientId) -> Option<&MacKey> {
        self.0.get(&writer)
    }
}
