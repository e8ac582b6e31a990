//! The M-PoWerStore server (Alg. 5), one register per key, with garbage collection.
//!
//! # Garbage collection
//!
//! The paper keeps every version's fragment forever (spec §3.8). Deleting `Hist[ts]` as soon as
//! `lc` passes `ts` would be unsafe: a slow reader holding candidate `ts` would get `c_0` answers,
//! exclude it and return a stale value. Our rule keeps every proof intact instead:
//!
//! 1. Only entries strictly older than this server's `lc` are ever deleted, and only after they
//!    have been superseded for `grace_millis` (or when more than `superseded_max` superseded
//!    entries pile up for one key).
//! 2. A FILTER reply never says "lower" than a candidate older than this server's `lc`: when the
//!    request holds candidates below `lc` and none of them (nor anything above them) can be
//!    answered from `Hist`, the reply is [`FilterAck::Superseded`] for the highest of them,
//!    carrying `lc`. A valid candidate's `f+1` correct `Hist` holders therefore answer either its
//!    entry or "superseded", never lower, even after collecting it and even when its MAC vector
//!    was corrupted at their slot: no valid candidate is ever excluded (L5.6 still holds). Such a
//!    reply only withholds a fragment, which a Byzantine server could do anyway.
//! 3. A reader whose candidates cannot become safe adds the `lc`s offered by "superseded" replies
//!    to its FILTER set and asks again (`client::judge`). A correct server's `lc` is valid, so an
//!    offer that is then excluded convicts whoever made it; each node may have one offer
//!    outstanding, so Byzantine offers cost a bounded number of rounds, and every other offer
//!    raises the read's highest valid candidate, which only finitely many writes can do.
//!
//! Reads therefore stay linearizable whatever the timing; only a read slower than the grace period
//! under continuous overwrites of its key may have to ask again. Storage per key is bounded by the
//! newest completed version, the writes in flight, and at most `superseded_max` older versions.
//!
//! # Fragments stay with the driver
//!
//! The server keeps `Hist` metadata in memory and never the fragments: a STORE's fragment leaves in
//! its `Change::PutHist`, and a FILTER reply reads it back through the [`Fragments`] view the
//! driver lends to `handle` (the node: its not-yet-durable changes, then the disk; the simulator:
//! its simulated disk). A fragment that is missing, or no longer hashes to its cross-checksum slot
//! (bit rot), is never served: the server answers as if it held no entry, and counts it.

use super::msg::{FilterAck, LcEntry, Refusal, Request, RequestBody, Response, ResponseBody};
use super::{Candidate, CrossChecksum, MacVec, Timestamp, cmp_ts, fragment_digest, sole_writer};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, MacKey, Slot, Time};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet, VecDeque};

/// What the server needs to know about itself.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This server's index `i`.
    pub node: Slot,
    /// Group size `n = 3f+1`.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// The configuration served.
    pub epoch: Epoch,
    /// The group served.
    pub group: GroupId,
    /// How long a superseded version stays readable.
    pub grace_millis: u64,
    /// The most superseded versions kept per key, whatever their age.
    pub superseded_max: usize,
    /// Deliberate protocol breakage for the simulator's negative controls; all off in production.
    pub mutations: ServerMutations,
}

/// Deliberately broken server variants, for the simulator's negative controls only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerMutations {
    /// FILTER answers but never raises `lc` (no metadata write-back): reads lose atomicity.
    pub no_write_back: bool,
    /// Treat every written-back candidate as valid: no proof of writing is checked.
    pub accept_unproven: bool,
    /// Delete superseded versions at once and answer `c_0` for them: the naive GC of spec §3.8.
    pub naive_gc: bool,
    /// Store a written-back candidate's own MAC vector in `lc` even when `Hist` vouched for it
    /// (the paper's literal l. 124/128, without spec §4.8(c)), so a corrupted vector can sit in
    /// the `lc` of a server that holds the version.
    pub candidate_vec_in_lc: bool,
    /// Store below `lc` on a register with one writer ([`Refusal::Stale`] never sent): a writer
    /// that lost its clock completes a write that sorts below one already complete.
    pub no_stale_check: bool,
}

impl ServerConfig {
    /// Defaults for node `node` of a group tolerating `f` faults.
    pub fn new(node: Slot, f: usize) -> ServerConfig {
        ServerConfig {
            node,
            n: 3 * f + 1,
            f,
            epoch: Epoch(0),
            group: GroupId(0),
            grace_millis: 10_000,
            superseded_max: 8,
            mutations: ServerMutations::default(),
        }
    }
}

pub use crate::machine::Access;

/// One `Hist` entry as stored: `(fr, cc, N̄, vec)` under its full timestamp.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredEntry {
    /// The full timestamp, tag included (§4.8(b)).
    pub ts: Timestamp,
    /// This server's fragment.
    #[serde(with = "bulwark_core::wire::shared_bytes")]
    pub fragment: Bytes,
    /// The cross-checksum.
    pub cc: CrossChecksum,
    /// `N̄`.
    pub nonce_hash: Digest,
    /// The pre-written MAC vector.
    pub vec: MacVec,
}

/// A state change the driver must make durable before it sends the reply that came with it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// `Hist[ts] := entry`.
    PutHist {
        /// The register.
        key: Key,
        /// The entry.
        entry: StoredEntry,
    },
    /// Garbage-collects `Hist[ts]`.
    DeleteHist {
        /// The register.
        key: Key,
        /// The entry's timestamp.
        ts: Timestamp,
    },
    /// `lc := candidate`.
    SetLc {
        /// The register.
        key: Key,
        /// The new last-completed candidate.
        candidate: Candidate,
    },
}

/// The outcome of one request: persist `changes`, then send `reply` to the requester.
#[derive(Debug)]
pub struct Handled {
    /// Durable before the reply leaves (spec §7.1 item 16).
    pub changes: Vec<Change>,
    /// The reply. `None` means drop the request silently.
    pub reply: Option<Response>,
    /// Set when the request was refused, for metrics and logs.
    pub refused: Option<Refusal>,
}

/// Read access to the fragments this server's changes put into the driver's storage: everything
/// `Change::PutHist` wrote and `Change::DeleteHist` has not removed, durable or still pending.
pub trait Fragments {
    /// The fragment stored with `Hist[ts]` of `key`, if the storage holds one.
    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes>;

    /// The fragment of `Hist[ts]` of `key` only if it hashes to `digest` (this server's slot of
    /// the entry's `cc`): what a FILTER reply may serve. By default every call re-hashes what
    /// [`Fragments::fragment`] returns. A driver may answer from fragments it has already checked
    /// against the same digest since they left its disk, but must check anything it reads from
    /// the disk: that is where damage enters.
    fn intact_fragment(&self, key: &Key, ts: &Timestamp, digest: &Digest) -> Option<Bytes> {
        self.fragment(key, ts)
            .filter(|fragment| fragment_digest(fragment) == *digest)
    }
}

/// [`Fragments`] kept in memory, for tests: apply every change the server emits.
#[derive(Clone, Debug, Default)]
pub struct MemoryFragments(pub HashMap<(Key, Timestamp), Bytes>);

impl MemoryFragments {
    /// Applies one change, as a driver's storage would.
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::PutHist { key, entry } => {
                self.0
                    .insert((key.clone(), entry.ts), entry.fragment.clone());
            }
            Change::DeleteHist { key, ts } => {
                self.0.remove(&(key.clone(), *ts));
            }
            Change::SetLc { .. } => {}
        }
    }
}

impl Fragments for MemoryFragments {
    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        self.0.get(&(key.clone(), *ts)).cloned()
    }
}

/// Counters for `bulwark status` and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Keys whose latest completed version is a value.
    pub objects: u64,
    /// Keys with any state.
    pub keys: u64,
    /// `Hist` entries held.
    pub versions: u64,
    /// Fragment bytes held.
    pub fragment_bytes: u64,
    /// Entries garbage-collected since start.
    pub collected: u64,
    /// FILTER replies withheld because the stored fragment was missing or did not hash to its
    /// cross-checksum slot (a damaged disk).
    pub damaged_fragments: u64,
}

/// The server side as the node and the simulator drive it. Byzantine test servers implement it too.
pub trait ServerLogic: Send {
    /// Handles one authenticated request; `fragments` is read, never written (writes leave as
    /// changes).
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled;
    /// Garbage-collects what has expired; the driver persists the changes.
    fn tick(&mut self, now: Time) -> Vec<Change>;
    /// Current counters.
    fn stats(&self) -> ServerStats;
}

struct KeyState {
    /// `lc`: the last completed (or validated written-back) candidate; `None` is `c_0`.
    lc: Option<Candidate>,
    hist: HashMap<Timestamp, HistEntry>,
    /// Superseded entries, oldest supersession first.
    superseded: VecDeque<(Time, Timestamp)>,
}

/// `Hist[ts]` as the server keeps it: everything but the fragment, which stays with the driver.
struct HistEntry {
    ts: Timestamp,
    cc: CrossChecksum,
    nonce_hash: Digest,
    vec: MacVec,
    superseded: bool,
}

impl HistEntry {
    fn new(entry: StoredEntry) -> HistEntry {
        HistEntry {
            ts: entry.ts,
            cc: entry.cc,
            nonce_hash: entry.nonce_hash,
            vec: entry.vec,
            superseded: false,
        }
    }
}

/// An honest M-PoWerStore server.
pub struct Server {
    config: ServerConfig,
    /// `k_i`: shared with writers only.
    own_key: MacKey,
    keys: HashMap<Key, KeyState>,
    /// Keys with superseded entries awaiting collection.
    collectable: HashSet<Key>,
    collected: u64,
    damaged_fragments: u64,
}

impl Server {
    /// A server with empty state.
    pub fn new(config: ServerConfig, own_key: MacKey) -> Server {
        assert_eq!(config.n, 3 * config.f + 1, "n = 3f+1");
        assert!(config.node.index() < config.n);
        Server {
            config,
            own_key,
            keys: HashMap::new(),
            collectable: HashSet::new(),
            collected: 0,
            damaged_fragments: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Reloads one durable `Hist` entry at start-up; the fragment stays in the driver's storage.
    pub fn restore_hist(&mut self, key: Key, entry: StoredEntry) {
        let state = self.keys.entry(key).or_insert_with(KeyState::new);
        state.hist.insert(entry.ts, HistEntry::new(entry));
    }

    /// Reloads a durable `lc` at start-up.
    pub fn restore_lc(&mut self, key: Key, candidate: Candidate) {
        self.keys.entry(key).or_insert_with(KeyState::new).lc = Some(candidate);
    }

    /// Finishes start-up: entries older than `lc` start their grace period now.
    pub fn finish_restore(&mut self, now: Time) {
        let keys: Vec<Key> = self.keys.keys().cloned().collect();
        for key in keys {
            self.mark_superseded(&key, now);
        }
    }

    /// The current `lc` of `key`, for tests and status.
    pub fn lc(&self, key: &Key) -> Option<&Candidate> {
        self.keys.get(key).and_then(|s| s.lc.as_ref())
    }

    /// Number of `Hist` entries held for `key`.
    pub fn versions(&self, key: &Key) -> usize {
        self.keys.get(key).map_or(0, |s| s.hist.len())
    }

    /// `valid(c)` (Alg. 5, l. 131): `H(c.N) = Hist[c.ts].N̄` or `c.vec[i]` verifies under `k_i`.
    /// Returns the `vec` to store in `lc`: the `Hist` one when the entry vouches (spec §4.8(c)).
    fn validate(
        &self,
        key: &Key,
        state: Option<&KeyState>,
        candidate: &Candidate,
    ) -> Option<MacVec> {
        if candidate.vec.0.len() != self.config.n {
            return None;
        }
        if self.config.mutations.accept_unproven {
            return Some(candidate.vec.clone());
        }
        let nonce_hash = candidate.nonce.commitment();
        if let Some(entry) = state.and_then(|s| s.hist.get(&candidate.ts))
            && entry.nonce_hash == nonce_hash
        {
            if self.config.mutations.candidate_vec_in_lc {
                return Some(candidate.vec.clone());
            }
            return Some(entry.vec.clone());
        }
        let verified = candidate.vec.verify_slot(
            self.config.node.index(),
            self.config.group,
            key,
            &candidate.ts,
            &nonce_hash,
            &self.own_key,
        );
        verified.then(|| candidate.vec.clone())
    }

    /// Raises `lc` to `candidate` if newer (l. 118, 124, 128); `lc` never goes back.
    fn raise_lc(&mut self, now: Time, key: &Key, candidate: Candidate, changes: &mut Vec<Change>) {
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        let newer =
            cmp_ts(Some(&candidate.ts), state.lc.as_ref().map(|c| &c.ts)) == Ordering::Greater;
        if !newer {
            return;
        }
        state.lc = Some(candidate.clone());
        changes.push(Change::SetLc {
            key: key.clone(),
            candidate,
        });
        self.mark_superseded(key, now);
    }

    fn mark_superseded(&mut self, key: &Key, now: Time) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let Some(lc_ts) = state.lc.as_ref().map(|c| c.ts) else {
            return;
        };
        let mut newly: Vec<Timestamp> = state
            .hist
            .iter_mut()
            .filter(|(ts, entry)| !entry.superseded && ts.cmp_order(&lc_ts) == Ordering::Less)
            .map(|(ts, entry)| {
                entry.superseded = true;
                *ts
            })
            .collect();
        newly.sort_by(|a, b| a.cmp_order(b));
        if !newly.is_empty() {
            state
                .superseded
                .extend(newly.into_iter().map(|ts| (now, ts)));
            self.collectable.insert(key.clone());
        }
    }

    fn collect_key(&mut self, key: &Key, now: Time, changes: &mut Vec<Change>) {
        let (grace, max) = if self.config.mutations.naive_gc {
            (0, 0)
        } else {
            (self.config.grace_millis, self.config.superseded_max)
        };
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        while let Some(&(since, ts)) = state.superseded.front() {
            let expired = since.plus_millis(grace) <= now;
            if !expired && state.superseded.len() <= max {
                break;
            }
            state.superseded.pop_front();
            // Rule 1: only entries strictly older than `lc` are ever queued.
            debug_assert!(
                state
                    .lc
                    .as_ref()
                    .is_some_and(|lc| ts.cmp_order(&lc.ts) == Ordering::Less)
            );
            if state.hist.remove(&ts).is_some() {
                self.collected += 1;
                changes.push(Change::DeleteHist {
                    key: key.clone(),
                    ts,
                });
            }
        }
        if state.superseded.is_empty() {
            self.collectable.remove(key);
        }
    }

    fn refuse(request: &Request, refusal: Refusal) -> Handled {
        Handled {
            changes: Vec::new(),
            reply: Some(Response {
                op: request.op,
                attempt: request.attempt,
                body: ResponseBody::Refused(refusal.clone()),
            }),
            refused: Some(refusal),
        }
    }

    fn reply(request: &Request, changes: Vec<Change>, body: ResponseBody) -> Handled {
        Handled {
            changes,
            reply: Some(Response {
                op: request.op,
                attempt: request.attempt,
                body,
            }),
            refused: None,
        }
    }

    fn handle_store(&mut self, now: Time, request: &Request) -> Handled {
        let RequestBody::Store {
            ts,
            fragment,
            cc,
            nonce_hash,
            vec,
        } = &request.body
        else {
            unreachable!("dispatched on Store")
        };
        let me = self.config.node.index();
        let problem = if ts.num == 0 {
            Some("timestamp 0")
        } else if !cc.is_well_formed(self.config.n) {
            Some("cross-checksum does not fit the group")
        } else if vec.0.len() != self.config.n {
            Some("MAC vector length")
        } else if fragment.len() != cc.layout.fragment_len() {
            Some("fragment length does not match layout")
        } else if fragment_digest(fragment) != cc.hashes[me] {
            Some("fragment does not match its hash")
        } else if !vec.verify_slot(
            me,
            self.config.group,
            &request.key,
            ts,
            nonce_hash,
            &self.own_key,
        ) {
            Some("MAC vector slot does not verify")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Self::refuse(request, Refusal::Malformed(problem.to_string()));
        }
        if let Some(writer) = sole_writer(&request.key) {
            if ts.pid.writer != writer {
                return Self::refuse(
                    request,
                    Refusal::Malformed("the timestamp names another writer".to_string()),
                );
            }
            // A retransmitted STORE of a version this node still holds is acknowledged again.
            if let Some(state) = self.keys.get(&request.key)
                && let Some(lc) = &state.lc
                && ts.cmp_order(&lc.ts) == Ordering::Less
                && !state.hist.contains_key(ts)
                && !self.config.mutations.no_stale_check
            {
                return Self::refuse(request, Refusal::Stale { lc: lc.ts });
            }
        }
        let key = request.key.clone();
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        let mut changes = Vec::new();
        // A retransmitted STORE carries the same data: ack again without rewriting.
        if !state.hist.contains_key(ts) {
            let entry = StoredEntry {
                ts: *ts,
                fragment: fragment.clone(),
                cc: cc.clone(),
                nonce_hash: *nonce_hash,
                vec: vec.clone(),
            };
            state.hist.insert(*ts, HistEntry::new(entry.clone()));
            changes.push(Change::PutHist {
                key: key.clone(),
                entry,
            });
            // A late STORE for a version `lc` already passed is collectable at once.
            self.mark_superseded(&key, now);
        }
        Self::reply(request, changes, ResponseBody::StoreAck { ts: *ts })
    }

    fn handle_complete(&mut self, now: Time, request: &Request) -> Handled {
        let RequestBody::Complete { ts, nonce, vec } = &request.body else {
            unreachable!("dispatched on Complete")
        };
        if vec.0.len() != self.config.n || ts.num == 0 {
            return Self::refuse(request, Refusal::Malformed("COMPLETE shape".to_string()));
        }
        let state = self.keys.get(&request.key);
        // The paper trusts writers here (l. 118). We still refuse a nonce that contradicts a stored
        // `N̄`: such an `lc` could never be proven to readers.
        if let Some(entry) = state.and_then(|s| s.hist.get(ts))
            && entry.nonce_hash != nonce.commitment()
        {
            return Self::refuse(
                request,
                Refusal::Malformed("nonce does not match N̄".to_string()),
            );
        }
        let mut changes = Vec::new();
        let candidate = Candidate {
            ts: *ts,
            nonce: *nonce,
            vec: vec.clone(),
        };
        self.raise_lc(now, &request.key, candidate, &mut changes);
        Self::reply(request, changes, ResponseBody::CompleteAck { ts: *ts })
    }

    fn handle_filter(
        &mut self,
        now: Time,
        request: &Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        let RequestBody::Filter { candidates } = &request.body else {
            unreachable!("dispatched on Filter")
        };
        // A correct reader sends one candidate per COLLECT reply and at most one offer per
        // node (see `client::judge`).
        if candidates.len() > 2 * self.config.n {
            return Self::refuse(
                request,
                Refusal::Malformed("more candidates than twice the servers".to_string()),
            );
        }
        let key = &request.key;
        let state = self.keys.get(key);
        // c_hv := max_ts({c ∈ C : valid(c)} ∪ {c_0})  (Alg. 5, l. 122)
        let mut best: Option<Candidate> = None;
        for candidate in candidates {
            let newer =
                cmp_ts(Some(&candidate.ts), best.as_ref().map(|c| &c.ts)) == Ordering::Greater;
            if !newer {
                continue;
            }
            if let Some(vec) = self.validate(key, state, candidate) {
                best = Some(Candidate {
                    ts: candidate.ts,
                    nonce: candidate.nonce,
                    vec,
                });
            }
        }
        let mut changes = Vec::new();
        // Eager metadata write-back (l. 124).
        if let Some(best) = &best
            && !self.config.mutations.no_write_back
        {
            self.raise_lc(now, key, best.clone(), &mut changes);
        }
        let state = self.keys.get(key);
        let lc = state.and_then(|s| s.lc.as_ref());
        // The highest candidate strictly below `lc`: rule 2 of the module docs.
        let below_lc = lc.and_then(|lc| {
            candidates
                .iter()
                .filter(|c| c.ts.cmp_order(&lc.ts) == Ordering::Less)
                .max_by(|a, b| a.ts.cmp_order(&b.ts))
        });
        let me = self.config.node.index();
        let mut damaged = false;
        // `Hist[c_hv]` with its fragment, which must still hash to our slot of its `cc`.
        let entry = best
            .as_ref()
            .and_then(|b| state.and_then(|s| s.hist.get(&b.ts)))
            .and_then(|entry| {
                let fragment = fragments.intact_fragment(key, &entry.ts, &entry.cc.hashes[me]);
                damaged = fragment.is_none();
                fragment.map(|fragment| (entry, fragment))
            });
        let best_ts = best.as_ref().map(|b| &b.ts);
        let ack = match (entry, below_lc, lc) {
            (Some((entry, fragment)), below, _)
                if below.is_none_or(|c| cmp_ts(Some(&c.ts), best_ts) != Ordering::Greater) =>
            {
                FilterAck::Entry {
                    ts: entry.ts,
                    fragment,
                    cc: entry.cc.clone(),
                    nonce_hash: entry.nonce_hash,
                    vec: entry.vec.clone(),
                }
            }
            (_, Some(_), _) if self.config.mutations.naive_gc => FilterAck::Initial,
            (_, Some(below), Some(lc)) => FilterAck::Superseded {
                ts: below.ts,
                newer: lc.clone(),
            },
            _ => match best {
                Some(best) => FilterAck::MacOnly { ts: best.ts },
                None => FilterAck::Initial,
            },
        };
        if damaged {
            self.damaged_fragments += 1;
        }
        Self::reply(request, changes, ResponseBody::FilterAck(ack))
    }

    /// COLLECT_ACK: `lc` and, when asked (`fragments`), `Hist` proves it here (the stored `N̄` is
    /// `H(lc.N)`) and its fragment is intact, that entry, so a read may end in one round.
    fn collect_reply(&mut self, key: &Key, fragments: Option<&dyn Fragments>) -> ResponseBody {
        let me = self.config.node.index();
        let state = self.keys.get(key);
        let lc = state.and_then(|s| s.lc.clone());
        let mut damaged = false;
        let entry = lc.as_ref().zip(fragments).and_then(|(lc, fragments)| {
            let entry = state?.hist.get(&lc.ts)?;
            if entry.nonce_hash != lc.nonce.commitment() {
                return None;
            }
            let fragment = fragments.intact_fragment(key, &entry.ts, &entry.cc.hashes[me]);
            damaged = fragment.is_none();
            Some(LcEntry {
                fragment: fragment?,
                cc: entry.cc.clone(),
                nonce_hash: entry.nonce_hash,
            })
        });
        if damaged {
            self.damaged_fragments += 1;
        }
        ResponseBody::CollectAck { lc, entry }
    }

    fn handle_repair(&mut self, now: Time, request: &Request) -> Handled {
        let RequestBody::Repair { candidate } = &request.body else {
            unreachable!("dispatched on Repair")
        };
        let mut changes = Vec::new();
        let state = self.keys.get(&request.key);
        let newer = cmp_ts(
            Some(&candidate.ts),
            state.and_then(|s| s.lc.as_ref()).map(|c| &c.ts),
        ) == Ordering::Greater;
        // l. 128: adopt only if newer and valid; ack either way.
        if newer && let Some(vec) = self.validate(&request.key, state, candidate) {
            let adopted = Candidate {
                ts: candidate.ts,
                nonce: candidate.nonce,
                vec,
            };
            self.raise_lc(now, &request.key, adopted, &mut changes);
        }
        Self::reply(request, changes, ResponseBody::RepairAck)
    }
}

impl ServerLogic for Server {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        if request.epoch != self.config.epoch {
            return Self::refuse(&request, Refusal::WrongEpoch);
        }
        if request.group != self.config.group {
            return Self::refuse(&request, Refusal::WrongGroup);
        }
        if !request.key.is_valid() {
            return Self::refuse(&request, Refusal::Malformed("key length".to_string()));
        }
        let writes = matches!(
            request.body,
            RequestBody::Clock | RequestBody::Store { .. } | RequestBody::Complete { .. }
        );
        if writes && !access.write {
            return Self::refuse(&request, Refusal::NotWriter);
        }
        if !writes && !access.read {
            return Self::refuse(&request, Refusal::NotReader);
        }
        if writes
            && let Some(writer) = sole_writer(&request.key)
            && from != writer
        {
            return Self::refuse(&request, Refusal::NotSoleWriter { writer });
        }
        let mut handled = match &request.body {
            RequestBody::Clock => {
                let lc_ts = self.lc(&request.key).map(|c| c.ts);
                Self::reply(&request, Vec::new(), ResponseBody::ClockAck { lc_ts })
            }
            RequestBody::Store { .. } => self.handle_store(now, &request),
            RequestBody::Complete { .. } => self.handle_complete(now, &request),
            RequestBody::Collect { fragment } => {
                let body = self.collect_reply(&request.key, fragment.then_some(fragments));
                Self::reply(&request, Vec::new(), body)
            }
            RequestBody::Filter { .. } => self.handle_filter(now, &request, fragments),
            RequestBody::Repair { .. } => self.handle_repair(now, &request),
        };
        if self.collectable.contains(&request.key) {
            self.collect_key(&request.key, now, &mut handled.changes);
        }
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        let mut changes = Vec::new();
        let keys: Vec<Key> = self.collectable.iter().cloned().collect();
        for key in keys {
            self.collect_key(&key, now, &mut changes);
        }
        changes
    }

    fn stats(&self) -> ServerStats {
        let mut stats = ServerStats {
            collected: self.collected,
            damaged_fragments: self.damaged_fragments,
            ..ServerStats::default()
        };
        for state in self.keys.values() {
            stats.keys += 1;
            stats.versions += state.hist.len() as u64;
            stats.fragment_bytes += state
                .hist
                .values()
                .map(|e| e.cc.layout.fragment_len() as u64)
                .sum::<u64>();
            let live = state
                .lc
                .as_ref()
                .and_then(|lc| state.hist.get(&lc.ts))
                .is_none_or(|entry| !entry.cc.tombstone);
            if state.lc.is_some() && live {
                stats.objects += 1;
            }
        }
        stats
    }
}

impl KeyState {
    fn new() -> KeyState {
        KeyState {
            lc: None,
            hist: HashMap::new(),
            superseded: VecDeque::new(),
        }
    }
}

/// The node and the simulator drive every PoWerStore server (honest or, in tests, Byzantine)
/// through the one replica contract.
impl crate::machine::Replica for Box<dyn ServerLogic> {
    const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::POWERSTORE;
    type Request = Request;
    type Reply = Response;
    type Message = crate::machine::Never;
    type Change = Change;
    type View = dyn Fragments;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> crate::machine::Output<Self> {
        let handled = self.handle(now, client, access, request, fragments);
        crate::machine::Output {
            changes: handled.changes,
            reply: handled.reply,
            refused: handled.refused.map(|refusal| refusal.to_string()),
            ..crate::machine::Output::none()
        }
    }

    fn on_tick(&mut self, now: Time) -> crate::machine::Output<Self> {
        crate::machine::Output {
            changes: self.tick(now),
            ..crate::machine::Output::none()
        }
    }

    fn stats(&self) -> crate::machine::ReplicaStats {
        let stats = ServerLogic::stats(self.as_ref());
        crate::machine::ReplicaStats {
            objects: stats.objects,
            keys: stats.keys,
            versions: stats.versions,
            bytes: stats.fragment_bytes,
            collected: stats.collected,
            damaged: stats.damaged_fragments,
            ..crate::machine::ReplicaStats::default()
        }
    }
}
