//! A2M-Storage (A2M paper §4.2; notes in specs/a2m.md §4.2 and §7.1 item 13): a volume served by
//! one untrusted server that holds a trusted log, linearizable for its clients. A server that
//! forks its clients (shows one of them a state without another's acknowledged write) or rolls
//! its state back is caught by the first client it lies to, with the attestation that shows it.
//!
//! The state is a key-value snapshot whose digest is the root of a sparse Merkle tree
//! (`bulwark_core::smt`). Each write makes a [`VersionBlock`] (volume, sequence number, root),
//! signed by the writer that computed it. The server's trusted log holds two logs: `requests`
//! (`q_h`, the hash of each write) and `versions` (`q_s`, the hash of each version block); write
//! `n` fills slot `n` of both.
//!
//! - A read sends a fresh nonce; the server answers with both logs' ENDs for that nonce, the
//!   version block the `versions` END names, the object and its proof. Only a server whose log
//!   ends at `n` with that block's hash can answer, and the log signs what it holds now: no older
//!   state can be shown with a fresh nonce.
//! - A write first reads the key (the state it is computed on, timestamp `T`), then sends the
//!   write, conditioned on `T`, with the version block after it. The server takes it only if `T`
//!   is its current state and the root is the one the write gives; its log then appends the
//!   write's hash and the block's hash and attests both slots with the writer's nonce. The writer
//!   accepts only slots `T.seq + 1` whose digests chain from `T`'s: its write came right after
//!   the state it was computed on. A write that lost the race gets the current state back and is
//!   computed again.
//!
//! What the paper leaves open and this module decides (spec §7.1 item 20): the server computes
//! proofs, the writer checks them and computes the new root; version blocks are signed by the
//! writer under its configured key, named by its index; the server takes one request at a time
//! through its trusted log, so that every END it gets describes the state it then answers with.

mod client;
#[cfg(test)]
mod tests;

pub use client::{Read, Write};

use crate::machine::{Access, Attest, Attested, Output, Replica, ReplicaStats};
use crate::round::OpId;
use bulwark_core::a2m::{self, Attestation, ChainDigest, LogId, Nonce, Outcome, Value};
use bulwark_core::sign::{Context, PublicKey, Signable, Unverified};
use bulwark_core::smt::{self, Proof, Tree};
use bulwark_core::{ClientId, Digest, Key, ServiceId, Time, wire};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The largest object: the same bound as a register's value.
pub const OBJECT_BYTES_MAX: usize = bulwark_core::OBJECT_BYTES_MAX;

/// Requests a server holds while its trusted log answers an earlier one; more are refused.
pub const QUEUE_MAX: usize = 1024;

/// Object bytes those queued requests may hold together; more are refused.
pub const QUEUE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Writes a server remembers (and its log keeps) so that a retransmitted write is answered as
/// the write it was, not taken twice: a writer whose write took longer than this many later
/// writes to be answered must not retry it blindly.
pub const RECENT_WRITES: u64 = 4096;

/// How often (in writes) the server lets its log forget slots older than [`RECENT_WRITES`].
pub const TRUNCATE_EVERY: u64 = 1024;

/// What every party of one volume agrees on.
#[derive(Clone, Debug)]
pub struct Volume {
    /// The volume's number: in every version block, so none is replayed across volumes.
    pub id: u64,
    /// The server's trusted-log key.
    pub log_key: PublicKey,
    /// The log of write hashes (`q_h`).
    pub requests: LogId,
    /// The log of version-block hashes (`q_s`).
    pub versions: LogId,
    /// The keys writers sign version blocks with, by writer index.
    pub writers: Arc<Vec<PublicKey>>,
}

/// Where a node's single-server volumes keep their logs in its trusted log: volume `v` uses
/// `LOGS_BASE + 2v` (`requests`) and the one after (`versions`), clear of any other protocol's.
pub const LOGS_BASE: LogId = 1 << 40;

impl Volume {
    /// Volume number `number` of the server whose trusted log has `log_key`, written by
    /// `writers` (by index, see [`writers`]).
    pub fn numbered(number: u32, log_key: PublicKey, writers: Arc<Vec<PublicKey>>) -> Volume {
        let requests = LOGS_BASE + 2 * LogId::from(number);
        Volume {
            id: u64::from(number),
            log_key,
            requests,
            versions: requests + 1,
            writers,
        }
    }
}

/// The writers of a cluster's single-server volumes: the clients of `cluster.toml` that may
/// write and hold a signing key, in its order; a writer's index is its position here. Keys that
/// are not valid Ed25519 keys are left out (the clients that hold them are refused at start).
pub fn writers(cluster: &bulwark_core::config::ClusterConfig) -> Vec<(ClientId, PublicKey)> {
    cluster
        .clients
        .iter()
        .filter(|client| client.write)
        .filter_map(|client| {
            let key = PublicKey::from_bytes(client.signing_key.as_ref()?).ok()?;
            Some((ClientId(client.id), key))
        })
        .collect()
}

/// The state after write `seq`, signed by the writer that computed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionBlock {
    /// The volume.
    pub volume: u64,
    /// The write that made this state.
    pub seq: u64,
    /// The snapshot's root.
    pub root: smt::Hash,
    /// The writer's index in [`Volume::writers`].
    pub writer: u32,
}

impl Signable for VersionBlock {
    const CONTEXT: Context = Context::new("bulwark.a2m-storage.version");
    // Three varints (10 bytes each at most) and a 32-byte root.
    const BYTES_MAX: usize = 64;
}

/// A version block as it travels: the writer index outside says which key verifies it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Version {
    /// The writer's index (checked against the block's own once verified).
    pub writer: u32,
    /// The signed block.
    pub block: Unverified<VersionBlock>,
}

impl Version {
    /// The hash the `versions` log holds for this block: over its exact signed bytes.
    pub fn hash(&self) -> Value {
        Digest::of(DOMAIN_VERSION, &wire::encode(self)).0
    }
}

/// Where a volume's history stands: the number of writes, and both logs' digests after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamp {
    /// Writes so far.
    pub seq: u64,
    /// The `requests` log's digest at slot `seq`.
    pub requests: ChainDigest,
    /// The `versions` log's digest at slot `seq`.
    pub versions: ChainDigest,
}

impl Timestamp {
    /// Before any write: slot 0 of both logs, all zero (spec §8 item 1).
    pub const GENESIS: Timestamp = Timestamp {
        seq: 0,
        requests: [0; 32],
        versions: [0; 32],
    };

    /// The timestamp after write `request` with version block `version` follows this one.
    pub fn next(&self, request: &Value, version: &Value) -> Timestamp {
        let seq = self.seq + 1;
        Timestamp {
            seq,
            requests: a2m::chain(u128::from(seq), request, &self.requests),
            versions: a2m::chain(u128::from(seq), version, &self.versions),
        }
    }
}

/// One write as the `requests` log records it: put (or, without a value, delete) `key`,
/// computed on the state at `after`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WriteRequest {
    /// The volume.
    pub volume: u64,
    /// The key.
    pub key: Key,
    /// The new value; `None` deletes.
    pub value: Option<Bytes>,
    /// The state it was computed on.
    pub after: Timestamp,
    /// The writer's fresh nonce: the attestations of this write answer it.
    pub nonce: Nonce,
}

impl WriteRequest {
    /// The hash the `requests` log holds for this write.
    pub fn hash(&self) -> Value {
        Digest::of(DOMAIN_REQUEST, &wire::encode(self)).0
    }
}

/// Where `key` lives in the snapshot's tree.
pub fn path(key: &Key) -> smt::Path {
    Digest::of(DOMAIN_KEY, key.as_bytes()).0
}

/// The leaf an object's bytes make.
pub fn leaf(value: &[u8]) -> smt::Hash {
    Digest::of(DOMAIN_OBJECT, value).0
}

const DOMAIN_VERSION: &str = "bulwark/a2m-storage/version/v1";
const DOMAIN_REQUEST: &str = "bulwark/a2m-storage/request/v1";
const DOMAIN_KEY: &str = "bulwark/a2m-storage/key/v1";
const DOMAIN_OBJECT: &str = "bulwark/a2m-storage/object/v1";

/// What a client sends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// The current state of `key`, attested for `nonce`.
    Read {
        /// The operation.
        op: OpId,
        /// The key.
        key: Key,
        /// A fresh nonce.
        nonce: Nonce,
    },
    /// A write with the version block after it.
    Write {
        /// The operation.
        op: OpId,
        /// The write.
        write: Box<WriteRequest>,
        /// The state after it, signed by the writer.
        version: Box<Version>,
    },
}

/// One key's state, attested fresh: what a read gets, and a write that lost its race.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// The `requests` log's END for the client's nonce.
    pub requests: Unverified<Attestation>,
    /// The `versions` log's END for the client's nonce.
    pub versions: Unverified<Attestation>,
    /// The version block the `versions` END holds (none before the first write).
    pub version: Option<Version>,
    /// The key's object, if any.
    pub value: Option<Bytes>,
    /// The key's path in the version block's tree.
    pub proof: Proof,
}

/// What the server answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Reply {
    /// The state of the key read.
    State {
        /// The operation.
        op: OpId,
        /// The nonce of the request it answers (a retransmitted request's answer may come late).
        nonce: Nonce,
        /// The state.
        snapshot: Box<Snapshot>,
    },
    /// The write is slot `after.seq + 1` of both logs, attested for the writer's nonce.
    Written {
        /// The operation.
        op: OpId,
        /// The nonce of the write it answers.
        nonce: Nonce,
        /// The `requests` slot.
        requests: Unverified<Attestation>,
        /// The `versions` slot.
        versions: Unverified<Attestation>,
    },
    /// The write was computed on an older state: the key's current one, attested for the
    /// write's nonce.
    Stale {
        /// The operation.
        op: OpId,
        /// The nonce of the write it answers.
        nonce: Nonce,
        /// The current state.
        snapshot: Box<Snapshot>,
    },
    /// Refused, and why.
    Refused {
        /// The operation.
        op: OpId,
        /// The nonce of the request refused.
        nonce: Nonce,
        /// Why.
        reason: String,
    },
}

impl Reply {
    /// The nonce of the request it answers.
    pub fn nonce(&self) -> Nonce {
        match self {
            Reply::State { nonce, .. }
            | Reply::Written { nonce, .. }
            | Reply::Stale { nonce, .. }
            | Reply::Refused { nonce, .. } => *nonce,
        }
    }

    /// The operation it answers.
    pub fn op(&self) -> OpId {
        match self {
            Reply::State { op, .. }
            | Reply::Written { op, .. }
            | Reply::Stale { op, .. }
            | Reply::Refused { op, .. } => *op,
        }
    }
}

/// A durable change: a write taken, with everything a restarted server needs to serve on.
#[derive(Clone, Debug)]
pub struct Change {
    /// The key.
    pub key: Key,
    /// Its new value (`None`: deleted).
    pub value: Option<Bytes>,
    /// The version block after it.
    pub version: Version,
    /// The write's hash, for a log that crashed before appending it.
    pub request: Value,
    /// The timestamp after it.
    pub timestamp: Timestamp,
}

/// What a server restores from: its changes, applied in order.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    /// Objects by key.
    pub objects: BTreeMap<Key, Bytes>,
    /// The last write's version block, write hash and timestamp.
    pub last: Option<(Version, Value, Timestamp)>,
    /// The last [`RECENT_WRITES`] writes' hashes and numbers, oldest first.
    pub recent: VecDeque<(Value, u64)>,
}

impl Disk {
    /// Applies one durable change.
    pub fn apply(&mut self, change: &Change) {
        match &change.value {
            Some(value) => self.objects.insert(change.key.clone(), value.clone()),
            None => self.objects.remove(&change.key),
        };
        self.last = Some((change.version.clone(), change.request, change.timestamp));
        remember(&mut self.recent, change.request, change.timestamp.seq);
    }
}

/// Remembers write `seq` with hash `request`, forgetting beyond [`RECENT_WRITES`].
fn remember(recent: &mut VecDeque<(Value, u64)>, request: Value, seq: u64) {
    recent.push_back((request, seq));
    while recent.len() as u64 > RECENT_WRITES {
        recent.pop_front();
    }
}

/// What the server is waiting for its trusted log to answer.
enum Busy {
    /// A read's two ENDs.
    Read {
        client: ClientId,
        op: OpId,
        key: Key,
        nonce: Nonce,
    },
    /// A write's two appends, or the ENDs a stale write gets.
    Write {
        client: ClientId,
        op: OpId,
        key: Key,
        nonce: Nonce,
        stale: bool,
    },
    /// After a restart: where the logs end, then (`appended`) the appends a crash may have cut
    /// off.
    Recover { appended: bool },
}

/// A request waiting for the trusted log to be free.
struct Queued {
    client: ClientId,
    access: Access,
    request: Request,
}

/// The one server of a volume.
pub struct Server {
    volume: Volume,
    objects: BTreeMap<Key, Bytes>,
    tree: Tree,
    /// The last write's version block and hash, and the timestamp after it.
    last: Option<(Version, Value)>,
    /// The recent writes' hashes and numbers (see [`Disk::recent`]).
    recent: VecDeque<(Value, u64)>,
    timestamp: Timestamp,
    busy: Option<(u64, Busy)>,
    queue: VecDeque<Queued>,
    /// Object bytes the queued writes hold.
    queued_bytes: usize,
    next_token: u64,
    /// Whether it has checked, since it started, that its trusted log holds its state.
    recovered: bool,
    /// Set when the trusted log and the state cannot be reconciled: nothing is served.
    stopped: Option<String>,
}

impl Server {
    /// A server of an empty volume.
    pub fn new(volume: Volume) -> Server {
        Server::restore(volume, &Disk::default())
    }

    /// A server restarted from its disk. Its trusted log may be a write behind (the server
    /// crashed between making the write durable and appending it): the first input finds out
    /// and appends what is missing before anything is served.
    pub fn restore(volume: Volume, disk: &Disk) -> Server {
        let mut tree = Tree::new();
        for (key, value) in &disk.objects {
            tree.set(path(key), Some(leaf(value)));
        }
        let (last, timestamp) = match &disk.last {
            Some((version, request, timestamp)) => (Some((version.clone(), *request)), *timestamp),
            None => (None, Timestamp::GENESIS),
        };
        Server {
            volume,
            objects: disk.objects.clone(),
            tree,
            last,
            recent: disk.recent.clone(),
            timestamp,
            busy: None,
            queue: VecDeque::new(),
            queued_bytes: 0,
            next_token: 1,
            recovered: false,
            stopped: None,
        }
    }

    /// The timestamp of the state it serves.
    pub fn timestamp(&self) -> Timestamp {
        self.timestamp
    }

    /// Asks the trusted log for `calls` and waits for its answer as `busy`.
    fn call_log(&mut self, busy: Busy, calls: Vec<a2m::Call>) -> Output<Self> {
        debug_assert!(self.busy.is_none(), "one request at a time through the log");
        let token = self.next_token;
        self.next_token += 1;
        self.busy = Some((token, busy));
        Output {
            attest: vec![Attest { token, calls }],
            ..Output::none()
        }
    }

    /// The calls that find where both logs end.
    fn ends(&self, nonce: Nonce) -> Vec<a2m::Call> {
        vec![
            a2m::Call::End {
                log: self.volume.requests,
                nonce,
            },
            a2m::Call::End {
                log: self.volume.versions,
                nonce,
            },
        ]
    }

    /// Queues `request` until the trusted log is free, or refuses it when the queue is full.
    fn hold(&mut self, client: ClientId, access: Access, request: Request) -> Output<Self> {
        let bytes = request_bytes(&request);
        if self.queue.len() >= QUEUE_MAX || self.queued_bytes + bytes > QUEUE_BYTES_MAX {
            return refuse(client, &request, "the server is busy".into());
        }
        self.queued_bytes += bytes;
        self.queue.push_back(Queued {
            client,
            access,
            request,
        });
        Output::none()
    }

    /// Takes `request` now if the trusted log is free; queues it otherwise.
    fn take(&mut self, client: ClientId, access: Access, request: Request) -> Output<Self> {
        if let Some(reason) = &self.stopped {
            return refuse(client, &request, reason.clone());
        }
        if self.busy.is_some() {
            return self.hold(client, access, request);
        }
        match request {
            Request::Read { op, nonce, .. } if !access.read => {
                notify_refused(client, op, nonce, "this client may not read".into())
            }
            Request::Read { op, key, nonce } => {
                let calls = self.ends(nonce);
                self.call_log(
                    Busy::Read {
                        client,
                        op,
                        key,
                        nonce,
                    },
                    calls,
                )
            }
            Request::Write { op, write, version } => {
                self.write(client, access, op, *write, *version)
            }
        }
    }

    fn write(
        &mut self,
        client: ClientId,
        access: Access,
        op: OpId,
        write: WriteRequest,
        version: Version,
    ) -> Output<Self> {
        let refused = |reason: &str| notify_refused(client, op, write.nonce, reason.to_string());
        if !access.write {
            return refused("this client may not write");
        }
        if write.volume != self.volume.id {
            return refused("a write for another volume");
        }
        if write
            .value
            .as_ref()
            .is_some_and(|v| v.len() > OBJECT_BYTES_MAX)
        {
            return refused("the object is larger than the limit");
        }
        let request = write.hash();
        if let Some(&(_, seq)) = self.recent.iter().rev().find(|(hash, _)| *hash == request) {
            // A retransmission of a write taken already: its slots, attested again for its nonce.
            let nonce = write.nonce;
            let lookup = |log| a2m::Call::Lookup {
                log,
                seq: u128::from(seq),
                nonce,
            };
            let calls = vec![lookup(self.volume.requests), lookup(self.volume.versions)];
            return self.call_log(Busy::write(client, op, write, false), calls);
        }
        let oldest = self.recent.front().map_or(0, |(_, seq)| *seq);
        if write.after.seq < self.timestamp.seq && write.after.seq.saturating_add(1) < oldest {
            // It may have been taken at slot `after.seq + 1`, which the server no longer
            // remembers: computing it again could take it twice.
            return refused(
                "the write was computed on a state too old to tell whether it was taken; \
                 read the key to find out",
            );
        }
        if write.after != self.timestamp {
            // Computed on another state: the current one, for the write's nonce.
            let calls = self.ends(write.nonce);
            return self.call_log(Busy::write(client, op, write, true), calls);
        }
        let Some(signer) = self.volume.writers.get(version.writer as usize) else {
            return refused("the version block names no writer");
        };
        let Ok(block) = version.block.clone().verify(signer) else {
            return refused("the version block's signature does not verify");
        };
        let block = *block.value();
        let path = path(&write.key);
        let value_leaf = write.value.as_deref().map(leaf);
        // The root after the write, from the key's proof: the tree changes only once the block
        // is known to be right.
        let root = self.tree.prove(&path).root(&path, value_leaf.as_ref());
        if block.volume != self.volume.id
            || block.writer != version.writer
            || Some(block.seq) != self.timestamp.seq.checked_add(1)
            || root.ok() != Some(block.root)
        {
            return refused("the version block is not the state this write makes");
        }
        let hash = version.hash();
        let timestamp = self.timestamp.next(&request, &hash);
        self.tree.set(path, value_leaf);
        match &write.value {
            Some(value) => self.objects.insert(write.key.clone(), value.clone()),
            None => self.objects.remove(&write.key),
        };
        self.last = Some((version.clone(), request));
        remember(&mut self.recent, request, timestamp.seq);
        self.timestamp = timestamp;
        let calls = self.appends(request, hash, write.nonce);
        let change = Change {
            key: write.key.clone(),
            value: write.value.clone(),
            version,
            request,
            timestamp,
        };
        Output {
            changes: vec![change],
            ..self.call_log(Busy::write(client, op, write, false), calls)
        }
    }

    /// The fused appends of write `request` with block `hash`, attested for `nonce`; every
    /// [`TRUNCATE_EVERY`] writes, the logs forget what is older than [`RECENT_WRITES`].
    fn appends(&self, request: Value, hash: Value, nonce: Nonce) -> Vec<a2m::Call> {
        let seq = self.timestamp.seq;
        let mut calls = vec![
            a2m::Call::AppendAttest {
                log: self.volume.requests,
                value: request,
                nonce,
            },
            a2m::Call::AppendAttest {
                log: self.volume.versions,
                value: hash,
                nonce,
            },
        ];
        if seq.is_multiple_of(TRUNCATE_EVERY) && seq > RECENT_WRITES {
            for log in [self.volume.requests, self.volume.versions] {
                calls.push(a2m::Call::Truncate {
                    log,
                    seq: u128::from(seq - RECENT_WRITES),
                });
            }
        }
        calls
    }

    /// The state of `key`, described by the two ENDs the log just gave.
    fn snapshot(&self, key: &Key, ends: Vec<Unverified<Attestation>>) -> Snapshot {
        let [requests, versions]: [Unverified<Attestation>; 2] = ends
            .try_into()
            .unwrap_or_else(|_| unreachable!("checked by the caller: two ENDs"));
        Snapshot {
            requests,
            versions,
            version: self.last.as_ref().map(|(version, _)| version.clone()),
            value: self.objects.get(key).cloned(),
            proof: self.tree.prove(&path(key)),
        }
    }

    /// The attestations the trusted log answered with (truncations answer nothing to pass on),
    /// or its refusal.
    fn attestations(answers: Attested) -> Result<Vec<Unverified<Attestation>>, String> {
        let mut attestations = Vec::new();
        for answer in answers {
            match answer {
                Ok(Outcome::Attested(signed)) => attestations.push(signed.to_unverified()),
                Ok(Outcome::Done) => {}
                Ok(other) => return Err(format!("the trusted log answered {other:?}")),
                Err(refusal) => return Err(refusal.to_string()),
            }
        }
        Ok(attestations)
    }

    /// Stops serving: the trusted log and the state no longer agree, or the log refused a write
    /// the state already holds. Only an operator can tell which is right.
    fn stop(&mut self, reason: String) -> Output<Self> {
        self.stopped = Some(reason.clone());
        let mut output = Output {
            refused: Some(reason.clone()),
            ..Output::none()
        };
        self.queued_bytes = 0;
        if let Some((_, busy)) = self.busy.take() {
            output = output.and(busy.refused(reason.clone()));
        }
        for queued in std::mem::take(&mut self.queue) {
            output = output.and(refuse(queued.client, &queued.request, reason.clone()));
        }
        output
    }

    /// The trusted log refused a call or could not be reached (its process restarting, say):
    /// whether it took the calls before is unknown, so the server checks where its logs end
    /// again before it serves, as after a restart (a write it already holds is then appended,
    /// or found appended). The write in hand is not answered: its writer retransmits it and
    /// gets the slots it was given. Reads and the requests waiting are refused; nothing of
    /// theirs was taken.
    fn pause(&mut self, busy: Busy, reason: String) -> Output<Self> {
        let reason = format!("the server's trusted log refused ({reason}); try again");
        self.recovered = false;
        self.queued_bytes = 0;
        let mut output = Output {
            refused: Some(reason.clone()),
            ..Output::none()
        };
        if let Busy::Read { .. } | Busy::Write { stale: true, .. } = busy {
            output = output.and(busy.refused(reason.clone()));
        }
        for queued in std::mem::take(&mut self.queue) {
            output = output.and(refuse(queued.client, &queued.request, reason.clone()));
        }
        output
    }

    /// Starts finding where the logs end after a restart, holding `queued` meanwhile.
    fn recover(&mut self) -> Output<Self> {
        self.recovered = true;
        let calls = self.ends([0; 32]);
        self.call_log(Busy::Recover { appended: false }, calls)
    }

    /// What the logs' ENDs say after a restart: each at the state's write, or one behind when
    /// the server crashed before its log took the write (then the log takes it now).
    fn recovered_ends(&mut self, ends: &[Attestation]) -> Output<Self> {
        let t = u128::from(self.timestamp.seq);
        let logs = [
            (self.volume.requests, self.timestamp.requests),
            (self.volume.versions, self.timestamp.versions),
        ];
        let mut calls = Vec::new();
        for (end, (log, digest)) in ends.iter().zip(logs) {
            let missing = match &self.last {
                Some((_, request)) if log == self.volume.requests => *request,
                Some((version, _)) => version.hash(),
                None => [0; 32],
            };
            if end.log != log || end.seq > t {
                return self.stop(format!(
                    "log {log} ends at slot {}, past the state's write {t}",
                    end.seq
                ));
            }
            if end.seq == t && end.digest != digest {
                return self.stop(format!(
                    "log {log} holds other writes than the state (digest at slot {t} differs)"
                ));
            }
            if end.seq + 1 == t && self.last.is_some() {
                if a2m::chain(t, &missing, &end.digest) != digest {
                    return self.stop(format!(
                        "log {log} ends a write behind the state, at another history"
                    ));
                }
                calls.push(a2m::Call::Append {
                    log,
                    value: missing,
                });
            } else if end.seq != t {
                return self.stop(format!(
                    "log {log} ends at slot {}, the state at write {t}",
                    end.seq
                ));
            }
        }
        if calls.is_empty() {
            return Output::none();
        }
        self.call_log(Busy::Recover { appended: true }, calls)
    }

    /// The next queued requests, now that the trusted log is free.
    fn next(&mut self, mut output: Output<Self>) -> Output<Self> {
        while self.busy.is_none() && self.stopped.is_none() {
            let Some(queued) = self.queue.pop_front() else {
                break;
            };
            self.queued_bytes -= request_bytes(&queued.request);
            output = output.and(self.take(queued.client, queued.access, queued.request));
        }
        output
    }
}

impl Replica for Server {
    const SERVICE: ServiceId = ServiceId::A2M_STORAGE;
    type Request = Request;
    type Reply = Reply;
    type Message = crate::machine::Never;
    type Change = Change;
    type View = ();

    fn on_request(
        &mut self,
        _now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        _view: &(),
    ) -> Output<Self> {
        if !self.recovered && self.stopped.is_none() {
            return self.hold(client, access, request).and(self.recover());
        }
        self.take(client, access, request)
    }

    fn on_attested(
        &mut self,
        _now: Time,
        token: u64,
        answers: Attested,
        _view: &(),
    ) -> Output<Self> {
        let Some((expected, _)) = &self.busy else {
            return Output::none();
        };
        if *expected != token {
            return Output::none();
        }
        let Some((_, busy)) = self.busy.take() else {
            return Output::none();
        };
        if let Busy::Recover { appended: true } = busy {
            let t = u128::from(self.timestamp.seq);
            if let Some(Err(refusal)) = answers.iter().find(|answer| answer.is_err()) {
                return self.pause(busy, refusal.to_string());
            }
            if answers.is_empty()
                || !answers
                    .iter()
                    .all(|answer| *answer == Ok(Outcome::Appended(t)))
            {
                return self.stop(format!(
                    "the trusted log did not take write {t} back after the restart: {answers:?}"
                ));
            }
            return self.next(Output::none());
        }
        let attestations = match Self::attestations(answers) {
            Ok(attestations) if attestations.len() == 2 => attestations,
            Ok(_) => {
                // Its client is told too, with the ones waiting.
                self.busy = Some((token, busy));
                return self.stop("the trusted log did not answer every call".into());
            }
            Err(reason) => return self.pause(busy, reason),
        };
        let output = match busy {
            Busy::Read {
                client,
                op,
                key,
                nonce,
            } => {
                let snapshot = Box::new(self.snapshot(&key, attestations));
                Output {
                    notify: vec![(
                        client,
                        op.0,
                        Reply::State {
                            op,
                            nonce,
                            snapshot,
                        },
                    )],
                    ..Output::none()
                }
            }
            Busy::Write {
                client,
                op,
                key,
                nonce,
                stale: true,
            } => {
                let snapshot = Box::new(self.snapshot(&key, attestations));
                Output {
                    notify: vec![(
                        client,
                        op.0,
                        Reply::Stale {
                            op,
                            nonce,
                            snapshot,
                        },
                    )],
                    ..Output::none()
                }
            }
            Busy::Write {
                client, op, nonce, ..
            } => {
                let [requests, versions]: [Unverified<Attestation>; 2] = attestations
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("two attestations, checked above"));
                Output {
                    notify: vec![(
                        client,
                        op.0,
                        Reply::Written {
                            op,
                            nonce,
                            requests,
                            versions,
                        },
                    )],
                    ..Output::none()
                }
            }
            Busy::Recover { appended: false } => {
                let key = self.volume.log_key;
                let ends: Result<Vec<Attestation>, _> = attestations
                    .into_iter()
                    .map(|a| a.verify(&key).map(|signed| *signed.value()))
                    .collect();
                match ends {
                    Ok(ends) => self.recovered_ends(&ends),
                    Err(error) => {
                        return self.stop(format!("the trusted log's ENDs do not verify: {error}"));
                    }
                }
            }
            Busy::Recover { appended: true } => Output::none(),
        };
        self.next(output)
    }

    fn on_tick(&mut self, _now: Time) -> Output<Self> {
        if !self.recovered && self.busy.is_none() && self.stopped.is_none() {
            return self.recover();
        }
        Output::none()
    }

    fn stats(&self) -> ReplicaStats {
        ReplicaStats {
            objects: self.objects.len() as u64,
            keys: self.objects.len() as u64,
            versions: self.timestamp.seq,
            bytes: self.objects.values().map(|v| v.len() as u64).sum(),
            ..ReplicaStats::default()
        }
    }
}

/// The object bytes a request holds while it waits.
fn request_bytes(request: &Request) -> usize {
    match request {
        Request::Read { .. } => 0,
        Request::Write { write, .. } => write.value.as_ref().map_or(0, Bytes::len),
    }
}

impl Busy {
    /// Waiting for the log on `write`'s behalf (`stale`: for the current state it was not
    /// computed on).
    fn write(client: ClientId, op: OpId, write: WriteRequest, stale: bool) -> Busy {
        Busy::Write {
            client,
            op,
            nonce: write.nonce,
            key: write.key,
            stale,
        }
    }

    /// The refusal its client gets when the server stops under it.
    fn refused(self, reason: String) -> Output<Server> {
        match self {
            Busy::Read {
                client, op, nonce, ..
            }
            | Busy::Write {
                client, op, nonce, ..
            } => notify_refused(client, op, nonce, reason),
            Busy::Recover { .. } => Output::none(),
        }
    }
}

fn notify_refused(client: ClientId, op: OpId, nonce: Nonce, reason: String) -> Output<Server> {
    Output {
        notify: vec![(
            client,
            op.0,
            Reply::Refused {
                op,
                nonce,
                reason: reason.clone(),
            },
        )],
        refused: Some(reason),
        ..Output::none()
    }
}

fn refuse(client: ClientId, request: &Request, reason: String) -> Output<Server> {
    let (op, nonce) = match request {
        Request::Read { op, nonce, .. } => (*op, *nonce),
        Request::Write { op, write, .. } => (*op, write.nonce),
    };
    notify_refused(client, op, nonce, reason)
}
