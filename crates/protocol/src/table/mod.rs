//! Hardened tables (Friedman and Licher, "Hardening Cassandra against Byzantine failures"; notes
//! in `shared/specs/cassandra.md`): rows of cells, each cell signed by the client that wrote it,
//! written and read through a proxy (any member of the row's group) that talks to the row's
//! replicas for the client, with Byzantine quorums of `⌈(n+f+1)/2⌉` instead of majorities.
//!
//! What a client can rely on, with at most `f` faulty replicas in the group and any number of
//! faulty proxies (spec §2.13): a cell is only ever one its writer signed; at `QUORUM` a read
//! returns, per cell, a version at least as new as every write that completed before it, and
//! never an older one than an earlier read returned. Versions are ordered by the writer's clock
//! (greater timestamp, then a tombstone, then the greater value, then the writer: spec §5.1 item
//! 8 and its tie-break made total), so the guarantee holds up to clock skew (spec §2.16).
//!
//! The pieces, in the spec's terms:
//! - [`Cell`]: what a writer signs, covering the table, the row, the column, the timestamp and
//!   the value or tombstone (spec §2.11 [R]), so no cell can be moved or turned into a delete.
//! - Three statements replicas sign, each under its own context (spec §5.1 item 9): a
//!   [`WriteAck`] names the replica and the digests of the cells it made durable, so it counts for
//!   no other write; an [`Answer`] names the replica, the row, the reader's nonce and each cell's
//!   column, timestamp and digest (the empty answer is signed too), so it cannot be replayed to
//!   another read and the reader can order versions without verifying writers' signatures
//!   (items 1, 2, 4); a [`WriteBackAck`] binds a write-back to the read's nonce and the resolved
//!   cells.
//! - [`Server`]: the replica (stores only cells whose writer's signature verifies and whose
//!   timestamp is not beyond its clock plus the skew allowed; acknowledges once durable) and the
//!   proxy (Figures 5 and 7 for [`Variant::ProxyVerifies`], 19 and 20 for
//!   [`Variant::ProxyNoVerify`]): digest reads of a quorum first, full reads of every replica on
//!   a mismatch, per-cell resolution among versions whose writer's signature verifies, write-back
//!   until a quorum is current.
//! - [`WriteOp`] and [`ReadOp`]: the client, which counts only what it verified itself
//!   (signatures by the group's members, each once), checks a resolved read against the original
//!   answers (spec §3.6 [R]), re-asks the same proxy without the replicas whose signatures failed,
//!   and moves to another proxy when one fails it.
//!
//! Where Bulwark departs from the paper: the proxy is a member of the row's group (a client
//! picks among the group's members), so replicas only ever talk within their group; the client
//! keeps trying proxies, in turn, until its deadline rather than giving up after `f+1` (under
//! asynchrony a correct proxy can time out too); a replica keeps only the newest version of each
//! cell, acknowledging an older one it is sent (it holds a newer version, which is all a later
//! read needs, spec §5.1 item 7).

mod client;
pub mod local;
mod range;
mod server;
#[cfg(test)]
mod tests;

pub use client::{
    CreateOp, DescribeOp, RangeOp, RangeOutcome, ReadOp, ReadOutcome, ReadPath, WriteOp,
    WriteOutcome,
};
pub use range::{
    Listing, PAGE_BYTES, Page, Position, RANGE_ROWS_MAX, Range, RangeAnswer, RangeAnswered,
    RangeWriteBackAck, Resolution, check_page, listing_digest, listing_of, resolve,
};
pub use server::{Server, Settings, TableStats};

use bulwark_core::sign::{Context, PublicKey, SecretKey, Signable, Signed, Unverified};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, MacKey, Slot, Tag};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The longest table or column name.
pub const NAME_BYTES_MAX: usize = 48;
/// The longest partition key, and the longest clustering key.
pub const KEY_BYTES_MAX: usize = 512;
/// The largest cell value.
pub const VALUE_BYTES_MAX: usize = 64 * 1024;
/// The most columns a table has, so the most cells a row or a write holds.
pub const COLUMNS_MAX: usize = 64;
/// The longest encoding of a signed cell: its value and its row's names and keys.
const CELL_BYTES_MAX: usize = VALUE_BYTES_MAX + 2 * KEY_BYTES_MAX + 2 * NAME_BYTES_MAX + 64;
/// The longest encoding of a replica's statement: a row's address and one entry per column.
const STATEMENT_BYTES_MAX: usize =
    2 * KEY_BYTES_MAX + NAME_BYTES_MAX + COLUMNS_MAX * (NAME_BYTES_MAX + 48) + 128;

/// A read's nonce: fresh randomness from the reader, which every answer signs.
pub type Nonce = [u8; 16];

/// Where a row lives in its table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RowKey {
    /// The table.
    pub table: String,
    /// The partition key: what places the row on its group.
    pub partition: Vec<u8>,
    /// The clustering key within the partition (empty for a table without clustering columns).
    pub clustering: Vec<u8>,
}

impl RowKey {
    /// Whether every part is within its bound.
    pub fn is_well_formed(&self) -> bool {
        !self.table.is_empty()
            && self.table.len() <= NAME_BYTES_MAX
            && !self.partition.is_empty()
            && self.partition.len() <= KEY_BYTES_MAX
            && self.clustering.len() <= KEY_BYTES_MAX
    }
}

/// One cell as its writer signed it: a value, or a tombstone (`value: None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// The row.
    pub row: RowKey,
    /// The column.
    pub column: String,
    /// The writer's clock when it wrote, in microseconds since the Unix epoch.
    pub ts: u64,
    /// Who wrote it; its registered key must verify the signature.
    pub writer: ClientId,
    /// The value; `None` deletes.
    pub value: Option<Vec<u8>>,
}

impl Signable for Cell {
    const CONTEXT: Context = Context::new("bulwark/table/cell/v1");
    const BYTES_MAX: usize = CELL_BYTES_MAX;
}

/// A cell as it travels and is stored: the writer's bytes and signature.
pub type SignedCell = Unverified<Cell>;

/// Hash domain of a signed cell's digest.
const DOMAIN_CELL: &str = "bulwark/table/cell-digest/v1";

impl Cell {
    /// What answers and acknowledgements name a signed cell by: the hash of the bytes its writer
    /// signed (the signature is not part of it: one cell, one digest).
    pub fn digest(signed: &SignedCell) -> Digest {
        Digest::of(DOMAIN_CELL, signed.bytes())
    }

    /// The order of versions of one cell: greater timestamp, then a tombstone over a value, then
    /// the greater value, then the greater writer id (spec §5.1 item 8, made total).
    pub fn rank(&self) -> (u64, bool, &[u8], ClientId) {
        (
            self.ts,
            self.value.is_none(),
            self.value.as_deref().unwrap_or_default(),
            self.writer,
        )
    }

    /// The cell signed by its writer's `secret`; `None` when it is out of bounds.
    pub fn sign(self, secret: &SecretKey) -> Option<SignedCell> {
        if !self.is_well_formed() {
            return None;
        }
        Signed::sign(secret, self)
            .ok()
            .map(|signed| signed.to_unverified())
    }

    /// The cell with no signature, for the unsigned variants ([`Variant::signs`]).
    pub fn unsigned(self) -> Option<SignedCell> {
        self.is_well_formed().then(|| unsigned(&self))
    }

    /// Whether every field is within its bound.
    pub fn is_well_formed(&self) -> bool {
        self.row.is_well_formed()
            && !self.column.is_empty()
            && self.column.len() <= NAME_BYTES_MAX
            && self
                .value
                .as_ref()
                .is_none_or(|v| v.len() <= VALUE_BYTES_MAX)
    }
}

/// One cell as an answer names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Entry {
    /// The column.
    pub column: String,
    /// The cell's timestamp, signed by the replica so a reader can order without the writer's
    /// signature (spec §5.1 item 4).
    pub ts: u64,
    /// [`Cell::digest`].
    pub digest: Digest,
}

/// A replica's statement that the cells named are durable in it (spec §3.7 `StoreAck`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteAck {
    /// The replica.
    pub slot: Slot,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its group.
    pub group: GroupId,
    /// The write's cells, by digest, in the write's order.
    pub cells: Vec<Digest>,
}

impl Signable for WriteAck {
    const CONTEXT: Context = Context::new("bulwark/table/write-ack/v1");
    const BYTES_MAX: usize = COLUMNS_MAX * 40 + 64;
}

/// A replica's answer to a read: the newest cell it holds of each column asked for, bound to
/// the reader's nonce (spec §3.7 `ReadAns`). No entries: it holds none of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The replica.
    pub slot: Slot,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its group.
    pub group: GroupId,
    /// The row.
    pub row: RowKey,
    /// The reader's nonce.
    pub nonce: Nonce,
    /// One entry per column it holds of those asked for, in column order.
    pub entries: Vec<Entry>,
}

impl Signable for Answer {
    const CONTEXT: Context = Context::new("bulwark/table/read-answer/v1");
    const BYTES_MAX: usize = STATEMENT_BYTES_MAX;
}

/// A replica's statement that it holds cells at least as new as a read resolved, made in
/// answer to that read's write-back (spec §3.7 `WriteBackAck`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteBackAck {
    /// The replica.
    pub slot: Slot,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its group.
    pub group: GroupId,
    /// The row.
    pub row: RowKey,
    /// The read's nonce.
    pub nonce: Nonce,
    /// The resolved cells written back, in column order.
    pub entries: Vec<Entry>,
}

impl Signable for WriteBackAck {
    const CONTEXT: Context = Context::new("bulwark/table/write-back-ack/v1");
    const BYTES_MAX: usize = STATEMENT_BYTES_MAX;
}

/// A signed answer, with the cells it names when the replica was asked for data rather than a
/// digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    /// The signed statement.
    pub answer: Unverified<Answer>,
    /// The cells, in entry order, for a data read.
    pub cells: Option<Vec<SignedCell>>,
}

/// Who checks replicas' signatures on the way to the client (spec §2.8, §2.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Variant {
    /// The proxy verifies every acknowledgement and answer before it counts it (Figures 5, 7):
    /// fewest client retries, most proxy CPU.
    ProxyVerifies,
    /// Only the client verifies (Figures 19, 20): the proxy returns the first quorum of answers,
    /// and the client re-asks without the replicas whose signatures failed.
    ProxyNoVerify,
    /// Byzantine quorums and every message of Proxy-Verifies, with no signature made or checked
    /// (the paper's No-Sign, §4.3): the algorithm's cost without the cryptography's. For
    /// measurement only: it protects nothing.
    NoSign,
    /// Majority quorums and no signatures: plain Cassandra run by the same code, the baseline
    /// the others are measured against. For measurement only.
    Plain,
    /// Proxy-No-Verify with a MAC, keyed by what the client and the replica share, in place of
    /// each replica's signature on what it tells the client (spec §2.10, Half-Sym). Writers
    /// still sign every cell and replicas still verify each.
    HalfSym,
    /// Half-Sym, and the client also MACs each write to each replica (spec §2.10, Figure 8,
    /// Full-Sym): a replica whose own tag verifies keeps the cells on the write path without
    /// verifying their writer's signatures, and verifies them off it (spec §5.1 item 15); a
    /// missing or failing tag falls back to the signatures. One signature per cell and no
    /// public-key verification on the normal path.
    FullSym,
}

impl Variant {
    /// Whether cells and statements are authenticated and checked.
    pub fn signs(self) -> bool {
        !matches!(self, Variant::NoSign | Variant::Plain)
    }

    /// Whether replicas MAC what they tell the client instead of signing it.
    pub fn macs_to_client(self) -> bool {
        matches!(self, Variant::HalfSym | Variant::FullSym)
    }

    /// Whether the client MACs each write to each replica.
    pub fn macs_from_client(self) -> bool {
        self == Variant::FullSym
    }

    /// Replicas an operation at `level` waits for in a group of `n` tolerating `f`: a majority
    /// for `QUORUM` in the plain variant, the Byzantine quorum otherwise.
    pub fn threshold(self, level: Consistency, n: usize, f: usize) -> usize {
        match (self, level) {
            (Variant::Plain, Consistency::Quorum) => n / 2 + 1,
            (Variant::Plain, Consistency::One) => 1,
            _ => level.threshold(n, f),
        }
    }
}

/// Who resolves a read whose answers disagree (spec §2.9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolver {
    /// The proxy resolves and writes back (Figures 7 and 20); the client checks its work
    /// against the original answers.
    #[default]
    Proxy,
    /// The proxy returns a quorum of data answers as they are, and the client resolves and has
    /// the proxy write its resolution back (Figure 21): with Proxy-No-Verify, or Half-Sym and
    /// Full-Sym, a proxy then verifies no signature at all.
    Client,
}

/// How many replicas an operation waits for, chosen per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consistency {
    /// `f+1`: at least one correct replica. With `ONE` reads, only eventual consistency.
    One,
    /// The Byzantine quorum `⌈(n+f+1)/2⌉` (never a majority: from `f = 2` a majority of `3f+1`
    /// can meet another in faulty replicas alone).
    Quorum,
    /// Every replica: strongest, and not live with a faulty one.
    All,
}

impl Consistency {
    /// Replicas an operation at this level waits for in a group of `n` tolerating `f`.
    pub fn threshold(self, n: usize, f: usize) -> usize {
        match self {
            Consistency::One => f + 1,
            Consistency::Quorum => byzantine_quorum(n, f),
            Consistency::All => n,
        }
    }
}

/// The smallest symmetric Byzantine quorum: any two meet in `f+1` replicas (spec §2.2.1).
pub fn byzantine_quorum(n: usize, f: usize) -> usize {
    (n + f + 1).div_ceil(2)
}

/// What a pair of read and write thresholds gives on `n` replicas tolerating `f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarantee {
    /// Every read quorum meets every write quorum in a correct replica, and faulty replicas
    /// cannot block either: reads see every completed write.
    Strong,
    /// Reads and writes each reach a correct replica and cannot be blocked; anti-entropy brings
    /// the rest (spec §2.3).
    Eventual,
}

/// Why a pair of thresholds is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    /// A threshold above `n - f`: `f` silent replicas block it.
    #[error("a threshold of {threshold} on {n} replicas is not live with {f} faulty")]
    NotLive {
        /// The threshold.
        threshold: usize,
        /// Replicas.
        n: usize,
        /// Faults tolerated.
        f: usize,
    },
    /// A threshold below `f+1`: it may hear only faulty replicas.
    #[error("a threshold of {threshold} may hear only the {f} faulty replicas")]
    TooSmall {
        /// The threshold.
        threshold: usize,
        /// Faults tolerated.
        f: usize,
    },
}

/// Judges read and write thresholds on `n` replicas tolerating `f` (spec §5.1 item 11).
pub fn judge_quorums(
    n: usize,
    f: usize,
    read: usize,
    write: usize,
) -> Result<Guarantee, QuorumError> {
    for threshold in [read, write] {
        if threshold > n.saturating_sub(f) {
            return Err(QuorumError::NotLive { threshold, n, f });
        }
        if threshold <= f {
            return Err(QuorumError::TooSmall { threshold, f });
        }
    }
    if read + write > n + f {
        Ok(Guarantee::Strong)
    } else {
        Ok(Guarantee::Eventual)
    }
}

/// A table's shape (spec §1.5, §2.11): the names of its partition key, its clustering columns
/// and its regular columns, and the variant its proxies run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// The table.
    pub name: String,
    /// The partition key's name.
    pub partition_key: String,
    /// The clustering columns' names, in order.
    pub clustering: Vec<String>,
    /// The regular columns: the only ones cells may name.
    pub columns: Vec<String>,
    /// Who verifies replicas' signatures.
    pub variant: Variant,
    /// The GC grace, Cassandra's `gc_grace_seconds` (spec §2.14, §5.1 items 13-14): tombstones
    /// older than this are collected, and a version older than this is taken or read only if
    /// `f+1` members hold it, so that a deleted value cannot come back once its tombstone is
    /// gone. Anti-entropy must pass over every row well within it (a pass takes `rows / 100`
    /// seconds), and a node down for longer must be rebuilt, as in Cassandra.
    pub gc_grace_secs: u64,
    /// How many members of each group hold the table, and the quorums.
    pub replication: Replication,
}

/// How a table is replicated in each group (spec §2.2, §2.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Replication {
    /// Every member of the group (`n ≥ 3f+1`) holds the table, and `QUORUM` is the Byzantine
    /// quorum `⌈(n+f+1)/2⌉`: a read sees every write completed before it.
    #[default]
    Strong,
    /// `2f+1` members hold it and `ONE` and `QUORUM` wait for `f+1` of them (spec §2.3): a
    /// write reaches at least one correct replica, which hands it to the others by
    /// anti-entropy, so once writes stop every read agrees; until then a read may miss the
    /// newest write. Faulty members can withhold but never forge, as every cell carries its
    /// writer's signature. A third less storage and fewer messages than `Strong`.
    Eventual,
}

impl Replication {
    /// Replicas an operation at `level` waits for on a table of `variant` in a group of `n`
    /// tolerating `f`.
    pub fn threshold(
        self,
        mutations: &TableMutations,
        variant: Variant,
        level: Consistency,
        n: usize,
        f: usize,
    ) -> usize {
        match (self, level) {
            (Replication::Strong, _) => mutations.threshold(variant, level, n, f),
            (Replication::Eventual, Consistency::All) => 2 * f + 1,
            (Replication::Eventual, Consistency::One | Consistency::Quorum) => f + 1,
        }
    }
}

/// What a resolver knows of a table's GC grace: versions stamped before `line` that fewer than
/// `live` answers hold are passed over, as if absent (spec §2.14). Past the grace, every
/// correct member holds a live value (anti-entropy passed over it), so a value fewer than `f+1`
/// answers hold is one whose tombstone was collected: a faulty member's, or one that missed
/// the delete. Correct replicas refuse to take such a value back; a resolver that chose it
/// could never write it back, and the read would fail instead of returning nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grace {
    /// Microseconds on the cells' clock; 0: no version is past it.
    pub line: u64,
    /// Answers that must hold a version past the line, or by a revoked writer: `f+1`.
    pub live: usize,
    /// Writers the administrator revoked ([`Revocation`]): their versions count only where
    /// `f+1` answers hold them, as versions past the line do, so a write a colluder saved
    /// from before the revocation cannot come in through a read.
    pub revoked: std::collections::BTreeSet<ClientId>,
}

impl Grace {
    /// Whether a version `cell` is passed over; `holders` counts the answers that hold it.
    pub fn passes_over(&self, cell: &Cell, holders: impl FnOnce() -> usize) -> bool {
        (cell.ts < self.line || self.revoked.contains(&cell.writer)) && holders() < self.live
    }
}

/// The administrator's order that a client's cell signatures count no more (spec §2.13, §5.1
/// item 16), signed with the authority's key (`cluster.toml`'s
/// `configuration_service.authority`), so any member or client can check it and pass it on.
/// From the moment a replica holds it, the client's new writes are refused, and a cell of it
/// the replica does not already hold (a write a colluder saved for later, offered by write-back
/// or anti-entropy) is taken only once `f+1` other members say they hold exactly it. Cells the
/// replica held before stay and are served: the revocation voids what comes later, not what
/// was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// The client revoked.
    pub client: ClientId,
    /// When, in microseconds on the administrator's clock (for the record).
    pub at_micros: u64,
}

impl Signable for Revocation {
    const CONTEXT: Context = Context::new("bulwark/table/revocation/v1");
    const BYTES_MAX: usize = 64;
}

/// Revocations a replica keeps: past this, more are refused (an administrator who revokes
/// this many clients should change `cluster.toml`'s writers instead).
pub const REVOKED_MAX: usize = 1024;

/// `entries` without the versions passed over: what an answer says once those count as absent.
/// An answer is current if this is the resolution's entries (nothing can be written back over
/// a passed-over version: it stands where nothing stands).
pub fn without(entries: &[Entry], passed: &std::collections::BTreeSet<Digest>) -> Vec<Entry> {
    entries
        .iter()
        .filter(|entry| !passed.contains(&entry.digest))
        .cloned()
        .collect()
}

/// Cassandra's default GC grace: ten days.
pub const GC_GRACE_DEFAULT_SECS: u64 = 10 * 24 * 3600;
/// The shortest and longest GC grace a table may have: no shorter than replicas' freshness
/// window for new writes, so no new write is past it; no longer than ten years.
pub const GC_GRACE_SECS_RANGE: std::ops::RangeInclusive<u64> = 60..=10 * 365 * 24 * 3600;

impl Schema {
    /// Whether `column` is one of the table's regular columns.
    pub fn has_column(&self, column: &str) -> bool {
        self.columns.iter().any(|c| c == column)
    }

    /// The members of a group of `n` tolerating `f` that hold the table: all of them, or for an
    /// eventual table the `2f+1` from a slot its name picks, so tables spread over the group.
    pub fn replicas(&self, n: usize, f: usize) -> Vec<Slot> {
        match self.replication {
            Replication::Strong => (0..n as u32).map(Slot).collect(),
            Replication::Eventual => {
                let digest = Digest::of("bulwark/table/replicas", self.name.as_bytes());
                let mut first = [0u8; 8];
                first.copy_from_slice(&digest.0[..8]);
                let start = u64::from_le_bytes(first) % n as u64;
                (0..(2 * f + 1).min(n) as u64)
                    .map(|i| Slot(((start + i) % n as u64) as u32))
                    .collect()
            }
        }
    }

    /// Why the schema cannot be a table's, if it cannot.
    pub fn problem(&self) -> Option<String> {
        let name_ok = |n: &str| !n.is_empty() && n.len() <= NAME_BYTES_MAX;
        if !name_ok(&self.name) || !name_ok(&self.partition_key) {
            return Some("table and key names are 1 to 48 bytes".into());
        }
        if self.columns.is_empty() || self.columns.len() > COLUMNS_MAX {
            return Some(format!("a table has 1 to {COLUMNS_MAX} columns"));
        }
        if !GC_GRACE_SECS_RANGE.contains(&self.gc_grace_secs) {
            return Some(format!(
                "a GC grace is {} to {} seconds",
                GC_GRACE_SECS_RANGE.start(),
                GC_GRACE_SECS_RANGE.end()
            ));
        }
        let mut names: Vec<&str> = self.columns.iter().map(String::as_str).collect();
        names.extend(self.clustering.iter().map(String::as_str));
        names.push(&self.partition_key);
        if names.iter().any(|n| !name_ok(n)) {
            return Some("column names are 1 to 48 bytes".into());
        }
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        (names.len() != count).then(|| "a name appears twice".into())
    }
}

/// The longest encoding of a schema.
pub const SCHEMA_BYTES_MAX: usize = (COLUMNS_MAX * 2 + 2) * (NAME_BYTES_MAX + 8) + 16;

/// A schema as nodes stored it before tables had a replication mode (every table then was
/// [`Replication::Strong`]).
#[derive(Serialize, Deserialize)]
struct SchemaBeforeReplication {
    name: String,
    partition_key: String,
    clustering: Vec<String>,
    columns: Vec<String>,
    variant: Variant,
    gc_grace_secs: u64,
}

/// A schema as nodes stored it before tables had a GC grace (every table then kept the
/// default).
#[derive(Serialize, Deserialize)]
struct SchemaBeforeGrace {
    name: String,
    partition_key: String,
    clustering: Vec<String>,
    columns: Vec<String>,
    variant: Variant,
}

impl Schema {
    /// A stored schema: the current encoding, or one of the earlier ones read as the table it
    /// described, so a node that upgrades keeps its tables.
    pub fn decode_stored(bytes: &[u8]) -> Result<Schema, bulwark_core::wire::WireError> {
        use bulwark_core::wire::decode;
        let current = decode::<Schema>(bytes, SCHEMA_BYTES_MAX);
        if current.is_ok() {
            return current;
        }
        let older = || {
            decode::<SchemaBeforeGrace>(bytes, SCHEMA_BYTES_MAX).map(|old| {
                SchemaBeforeReplication {
                    name: old.name,
                    partition_key: old.partition_key,
                    clustering: old.clustering,
                    columns: old.columns,
                    variant: old.variant,
                    gc_grace_secs: GC_GRACE_DEFAULT_SECS,
                }
            })
        };
        match decode::<SchemaBeforeReplication>(bytes, SCHEMA_BYTES_MAX).or_else(|_| older()) {
            Ok(old) => Ok(Schema {
                name: old.name,
                partition_key: old.partition_key,
                clustering: old.clustering,
                columns: old.columns,
                variant: old.variant,
                gc_grace_secs: old.gc_grace_secs,
                replication: Replication::Strong,
            }),
            Err(_) => current,
        }
    }
}

/// The tables replicas serve, by name.
#[derive(Clone, Debug, Default)]
pub struct Catalog(BTreeMap<String, Schema>);

impl Catalog {
    /// Adds `schema`, refusing one that is malformed or already there.
    pub fn add(&mut self, schema: Schema) -> Result<(), String> {
        if let Some(problem) = schema.problem() {
            return Err(problem);
        }
        if self.0.contains_key(&schema.name) {
            return Err(format!("table {} exists", schema.name));
        }
        self.0.insert(schema.name.clone(), schema);
        Ok(())
    }

    /// The table named `name`.
    pub fn get(&self, name: &str) -> Option<&Schema> {
        self.0.get(name)
    }

    /// Tables known.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no table is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The most tables a replica keeps.
pub const TABLES_MAX: usize = 1024;

/// Clients' signing keys, by id: whose cells a replica accepts (the access list of spec §1.1).
#[derive(Clone, Debug, Default)]
pub struct Writers(HashMap<ClientId, PublicKey>);

impl FromIterator<(ClientId, PublicKey)> for Writers {
    fn from_iter<I: IntoIterator<Item = (ClientId, PublicKey)>>(keys: I) -> Writers {
        Writers(keys.into_iter().collect())
    }
}

impl Writers {
    /// Registers `writer`'s key.
    pub fn insert(&mut self, writer: ClientId, key: PublicKey) {
        self.0.insert(writer, key);
    }

    /// Whether `signed` verifies under its writer's key, decoded if it does.
    pub fn verify(&self, signed: &SignedCell) -> Option<Cell> {
        let cell = signed.peek().ok()?;
        let key = self.0.get(&cell.writer)?;
        let verified = signed.clone().verify(key).ok()?;
        verified
            .value()
            .is_well_formed()
            .then(|| verified.into_value())
    }
}

/// The MAC keys one client and one replica share, one per direction, so that a tag made for
/// one direction is never accepted in the other (spec §5.1 item 12: no reflection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairKeys {
    /// For what the replica tells the client.
    pub to_client: MacKey,
    /// For what the client tells the replica.
    pub to_replica: MacKey,
}

impl PairKeys {
    /// The keys `secret` shares with `peer` (a replica's with a client, or the reverse).
    pub fn between(secret: &SecretKey, peer: &PublicKey) -> PairKeys {
        let pair = secret.pair_key(peer);
        PairKeys {
            to_client: pair.derive("bulwark/table/replica-to-client/v1"),
            to_replica: pair.derive("bulwark/table/client-to-replica/v1"),
        }
    }

    /// A client's tag for a replica over the cells of one write, each with its signature: a
    /// replica that verifies it knows the client sent exactly these signed cells.
    pub fn write_tag(&self, cells: &[SignedCell]) -> Tag {
        let digests = write_tag_input(cells);
        let parts: Vec<&[u8]> = digests.iter().map(|d| d.as_slice()).collect();
        self.to_replica.mac(WRITE_TAG, &parts)
    }

    /// Whether `tag` is the client's [`PairKeys::write_tag`] over `cells`.
    pub fn verify_write_tag(&self, cells: &[SignedCell], tag: &Tag) -> bool {
        let digests = write_tag_input(cells);
        let parts: Vec<&[u8]> = digests.iter().map(|d| d.as_slice()).collect();
        self.to_replica.verify(WRITE_TAG, &parts, tag)
    }
}

/// What a write tag covers: each cell's digest and the digest of its signature.
fn write_tag_input(cells: &[SignedCell]) -> Vec<[u8; 32]> {
    cells
        .iter()
        .flat_map(|cell| {
            [
                Cell::digest(cell).0,
                Digest::of(DOMAIN_CELL_SIGNATURE, &cell.signature().0).0,
            ]
        })
        .collect()
}

/// Hash domain of a cell's signature in a write tag.
const DOMAIN_CELL_SIGNATURE: &str = "bulwark/table/cell-signature/v1";
/// Domain of a client's tag over a write.
const WRITE_TAG: &str = "bulwark/table/write-tag/v1";

/// The keys a replica holding `secret` shares with each client of `clients`.
pub fn replica_pair_keys(
    secret: &SecretKey,
    clients: impl IntoIterator<Item = (ClientId, PublicKey)>,
) -> HashMap<ClientId, PairKeys> {
    clients
        .into_iter()
        .map(|(client, key)| (client, PairKeys::between(secret, &key)))
        .collect()
}

/// One member's place: its slot and group, the group's size and fault bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// This replica's slot (for client machines: ignored).
    pub slot: Slot,
    /// Members of the group.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// The epoch.
    pub epoch: Epoch,
    /// The group.
    pub group: GroupId,
}

/// Deliberate breakage for the simulator's negative controls: each flag removes one thing the
/// protocol's safety argument needs. All off in every real machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableMutations {
    /// The client accepts a write with `f+1` valid acknowledgements (spec §2.8 scenario 2).
    pub accept_f_plus_one: bool,
    /// Thresholds are majorities of the group instead of Byzantine quorums.
    pub majority: bool,
    /// Resolvers take the newest version without checking its writer's signature.
    pub unverified_cells: bool,
    /// The proxy answers a resolved read without writing it back, and the client does not ask
    /// for a quorum of current replicas.
    pub skip_write_back: bool,
    /// Replicas take values older than the GC grace without asking whether `f+1` members hold
    /// them (spec §2.14 measure 4 left out).
    pub skip_liveness_check: bool,
    /// Replicas and resolvers take revoked writers' cells as any other (spec §5.1 item 16
    /// left out).
    pub ignore_revocations: bool,
    /// Replicas never run anti-entropy, which an eventual table needs to converge (spec §2.3).
    pub no_anti_entropy: bool,
}

impl TableMutations {
    /// The threshold for `level` in `variant`, broken when `majority` is on.
    pub fn threshold(&self, variant: Variant, level: Consistency, n: usize, f: usize) -> usize {
        if self.majority && level == Consistency::Quorum {
            n / 2 + 1
        } else {
            variant.threshold(level, n, f)
        }
    }
}

/// A client's request to a proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The operation.
    pub op: u64,
    /// The epoch the client believes in.
    pub epoch: Epoch,
    /// The group addressed.
    pub group: GroupId,
    /// What to do.
    pub body: RequestBody,
}

/// Writes and reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestBody {
    /// Store these cells of one row (spec §3.7 `Write`, and `AckMore` when `have` is not empty).
    Write {
        /// The cells, each signed by the client.
        cells: Vec<SignedCell>,
        /// How many acknowledgements the client needs.
        level: Consistency,
        /// Replicas whose acknowledgements the client holds already, or whose signatures failed:
        /// not to be asked again.
        skip: Vec<Slot>,
        /// Acknowledgements still wanted.
        want: u32,
        /// Full-Sym: the client's [`PairKeys::write_tag`] for each member, by slot (empty in
        /// the other variants).
        tags: Vec<Tag>,
    },
    /// Create a table on this replica (every member of every group is asked; spec §1.5's
    /// schema agreement is the administrator's here: a client with write access).
    Create {
        /// The table.
        schema: Schema,
    },
    /// Read these columns of one row (all of them when empty).
    Read {
        /// The row.
        row: RowKey,
        /// The columns.
        columns: Vec<String>,
        /// The reader's nonce.
        nonce: Nonce,
        /// How many replicas must vouch.
        level: Consistency,
        /// Replicas whose signatures failed: not to be asked (spec §3.5).
        blacklist: Vec<Slot>,
        /// Skip the digest round: every replica sends data.
        full: bool,
        /// Who resolves answers that disagree.
        resolver: Resolver,
    },
    /// The schema of a table (its columns and variant), for a client that did not create it.
    Describe {
        /// The table.
        table: String,
    },
    /// Read a page of rows: a range within a partition, or a scan in token order.
    Range {
        /// The query.
        range: Range,
        /// The reader's nonce.
        nonce: Nonce,
        /// How many replicas must vouch.
        level: Consistency,
        /// Replicas whose signatures failed: not to be asked (spec §3.5).
        blacklist: Vec<Slot>,
    },
    /// Bring replicas up to date with cells the client resolved from a read's original answers
    /// (spec §3.6, Figure 21): the proxy writes them back to every member not named current
    /// and returns the acknowledgements, which bind to the read's nonce.
    WriteBack {
        /// The row.
        row: RowKey,
        /// The read's nonce.
        nonce: Nonce,
        /// The resolved cells.
        cells: Vec<SignedCell>,
        /// The members whose original answers the client found current: not to be asked.
        current: Vec<Slot>,
        /// How many replicas must be current.
        level: Consistency,
    },
    /// Record the administrator's revocation of a client (every member is asked).
    Revoke {
        /// The revocation, signed by the authority.
        revocation: Unverified<Revocation>,
    },
}

/// A proxy's answer to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Echoes the request's operation.
    pub op: u64,
    /// The answer.
    pub body: ResponseBody,
}

/// What a proxy answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// Acknowledgements collected, by replica.
    Acks(Vec<(Slot, Unverified<WriteAck>)>),
    /// A read: on the fast path a quorum of matching answers (one with data); on the resolved
    /// path the resolved cells, the data answers they were resolved from, and the write-back
    /// acknowledgements of the replicas brought up to date.
    Read {
        /// Answers, by replica.
        answers: Vec<(Slot, Answered)>,
        /// The resolved cells, when the answers disagreed.
        resolved: Option<Vec<SignedCell>>,
        /// Write-back acknowledgements, by replica.
        write_backs: Vec<(Slot, Unverified<WriteBackAck>)>,
        /// The revocations of the writers of cells among the answers, so the client passes
        /// over what the proxy passed over.
        revocations: Vec<Unverified<Revocation>>,
    },
    /// A range read: the data answers of a quorum, and the write-back acknowledgements of the
    /// replicas brought up to date; the client resolves for itself.
    Range {
        /// Answers, by replica.
        answers: Vec<(Slot, RangeAnswered)>,
        /// Write-back acknowledgements, by replica.
        write_backs: Vec<(Slot, Unverified<RangeWriteBackAck>)>,
        /// The revocations of the writers of cells among the answers.
        revocations: Vec<Unverified<Revocation>>,
    },
    /// The table is created on this replica (it was already, with the same schema), or the
    /// revocation is recorded.
    Created,
    /// The table's schema, as this replica holds it.
    Schema(Schema),
    /// The proxy will not serve the request.
    Refused(Refusal),
}

/// What replicas of one group say to each other: a proxy to the replicas it asks, and their
/// answers. `pop` is the proxy's own number for the client operation it serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Store these cells.
    Store {
        /// The proxy's operation.
        pop: u64,
        /// The client it serves: whom the replica MACs its acknowledgement for (Half-Sym).
        client: ClientId,
        /// The cells.
        cells: Vec<SignedCell>,
        /// The client's tag for this replica (Full-Sym).
        tag: Option<Tag>,
    },
    /// They are durable.
    StoreAck {
        /// The proxy's operation.
        pop: u64,
        /// The signed acknowledgement.
        ack: Unverified<WriteAck>,
    },
    /// Answer for these columns of a row.
    Read {
        /// The proxy's operation.
        pop: u64,
        /// The client it serves.
        client: ClientId,
        /// The row.
        row: RowKey,
        /// The columns (all when empty).
        columns: Vec<String>,
        /// The reader's nonce.
        nonce: Nonce,
        /// Send the cells, not only their digests.
        data: bool,
    },
    /// The answer.
    Answer {
        /// The proxy's operation.
        pop: u64,
        /// The signed answer (with cells for a data read).
        answered: Answered,
    },
    /// Store these resolved cells and say so, bound to the read's nonce.
    WriteBack {
        /// The proxy's operation.
        pop: u64,
        /// The client it serves.
        client: ClientId,
        /// The row.
        row: RowKey,
        /// The read's nonce.
        nonce: Nonce,
        /// The resolved cells.
        cells: Vec<SignedCell>,
    },
    /// They are durable.
    WriteBackAck {
        /// The proxy's operation.
        pop: u64,
        /// The signed acknowledgement.
        ack: Unverified<WriteBackAck>,
    },
    /// Answer for a page of rows.
    RangeRead {
        /// The proxy's operation.
        pop: u64,
        /// The client it serves.
        client: ClientId,
        /// The query.
        range: Range,
        /// The reader's nonce.
        nonce: Nonce,
    },
    /// The page.
    RangeAnswer {
        /// The proxy's operation.
        pop: u64,
        /// The signed answer and its cells.
        answered: RangeAnswered,
    },
    /// Store these resolved cells (of several rows) and say so, bound to the read's nonce.
    RangeWriteBack {
        /// The proxy's operation.
        pop: u64,
        /// The client it serves.
        client: ClientId,
        /// The table.
        table: String,
        /// The read's nonce.
        nonce: Nonce,
        /// The resolved cells, row by row.
        cells: Vec<SignedCell>,
    },
    /// They are durable.
    RangeWriteBackAck {
        /// The proxy's operation.
        pop: u64,
        /// The signed acknowledgement.
        ack: Unverified<RangeWriteBackAck>,
    },
    /// Anti-entropy (spec §2.3, §2.7, §2.14): the newest cells the sender holds in a window of
    /// rows (after `after`, up to and with `until`; to the end when `None`), by entry. The
    /// receiver answers with what it lacks and what it holds newer.
    SyncOffer {
        /// The sender's round, echoed.
        round: u64,
        /// The window's start, exclusive (from the first row when `None`).
        after: Option<(String, Position)>,
        /// The window's end, inclusive.
        until: Option<(String, Position)>,
        /// The sender's rows in the window.
        listing: Listing,
    },
    /// The window compared: the cells wanted, and the cells the receiver holds newer (each
    /// signed by its writer, checked by whoever keeps it).
    SyncReply {
        /// The offer's round.
        round: u64,
        /// Rows and columns whose cells the receiver wants.
        want: Vec<(RowKey, String)>,
        /// Cells newer than, or missing from, the offer.
        cells: Vec<SignedCell>,
    },
    /// The cells a reply wanted.
    SyncCells {
        /// The offer's round.
        round: u64,
        /// The cells, row by row.
        cells: Vec<SignedCell>,
    },
    /// Liveness check (spec §2.14 measure 4): does the receiver hold exactly these versions,
    /// older than the GC grace, as its newest? Asked about cells the sender would otherwise
    /// take from one member's word.
    Live {
        /// The sender's round, echoed.
        round: u64,
        /// Row, column and the version's digest.
        cells: Vec<(RowKey, String, Digest)>,
    },
    /// The answer, cell by cell in the order asked.
    LiveReply {
        /// The round.
        round: u64,
        /// Whether the receiver holds each.
        held: Vec<bool>,
    },
    /// The schema of a table the replica refused as unknown: a replica takes it once `f+1`
    /// members offered the same, so at least one correct member holds it.
    Schema {
        /// The table.
        schema: Schema,
    },
    /// The replica refused.
    Refused {
        /// The proxy's operation.
        pop: u64,
        /// Why.
        refusal: Refusal,
    },
    /// Revocations the sender holds, passed on by anti-entropy so a member that missed one
    /// learns it (each is checked against the authority's key).
    Revocations {
        /// At most [`REVOKED_MAX`].
        revocations: Vec<Unverified<Revocation>>,
    },
}

/// Why a replica or a proxy refused.
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
    /// A group this replica does not serve.
    #[error("wrong replica group")]
    WrongGroup,
    /// No such table.
    #[error("no table {0:?}")]
    UnknownTable(String),
    /// The table has no such column.
    #[error("table {table:?} has no column {column:?}")]
    UnknownColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A cell's writer signature does not verify (or its writer is not registered).
    #[error("a cell's signature does not verify")]
    BadSignature,
    /// A cell's timestamp is beyond this replica's clock plus the skew allowed (spec §2.16).
    #[error("a cell's timestamp is {ahead_micros} µs in the future")]
    FromFuture {
        /// How far ahead.
        ahead_micros: u64,
    },
    /// A new write's timestamp is older than the freshness window (spec §5.1 item 13).
    #[error("a new write's timestamp is {behind_micros} µs old")]
    NotFresh {
        /// How far behind.
        behind_micros: u64,
    },
    /// Cells of more than one row, none, too many, or out of bounds.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A table of this name exists with another schema, or the schema is malformed.
    #[error("cannot create the table: {0}")]
    BadSchema(String),
    /// The proxy has too many operations in flight.
    #[error("busy")]
    Busy,
    /// A written-back value older than the GC grace that this replica lacks: it is taken only
    /// once `f+1` members say they hold it (spec §2.14), which it is now asking.
    #[error(
        "a written-back value is {behind_micros} µs old, past the GC grace: checking that it is live"
    )]
    PastGrace {
        /// How far behind.
        behind_micros: u64,
    },
    /// The writer's key is revoked.
    #[error("client {0} is revoked")]
    Revoked(ClientId),
    /// An eventual table this member does not hold: it never counts (spec §5.1 item 2).
    #[error("this member holds no replica of table {0:?}")]
    NotReplica(String),
}

/// A change to a replica's durable state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `cell` is now the newest version of its row and column.
    Put {
        /// The row.
        row: RowKey,
        /// The column.
        column: String,
        /// The cell as its writer signed it.
        cell: SignedCell,
    },
    /// A table the replica now serves.
    Schema(Schema),
    /// A client the administrator revoked.
    Revoke(Unverified<Revocation>),
    /// The cell of `row` and `column` is gone: it was kept on its writer's tag and its
    /// signature failed (Full-Sym).
    Remove {
        /// The row.
        row: RowKey,
        /// The column.
        column: String,
    },
}

/// `statement` with an empty signature: what the unsigned variants send where the others sign.
pub fn unsigned<T: Signable>(statement: &T) -> Unverified<T> {
    Unverified::new(
        bulwark_core::wire::encode(statement).into(),
        bulwark_core::sign::Signature([0; 64]),
    )
}

/// The entries naming `cells` (verified or peeked), in column order: what an answer or a
/// write-back acknowledgement signs.
pub fn entries_of<'a>(cells: impl IntoIterator<Item = (&'a Cell, &'a SignedCell)>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = cells
        .into_iter()
        .map(|(cell, signed)| Entry {
            column: cell.column.clone(),
            ts: cell.ts,
            digest: Cell::digest(signed),
        })
        .collect();
    entries.sort();
    entries
}
