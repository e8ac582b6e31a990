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
//!
//! # Metadata is a bounded cache of the disk
//!
//! A node may hold millions of registers, so the server keeps the metadata of at most
//! `cached_keys_max` of them. A key it does not hold is read back through the same view
//! ([`Fragments::stored_key`]: the driver's changes not yet durable over the disk) before its
//! request is handled, so the server decides on exactly the state it would have kept; evicting
//! only costs a read. Keys are evicted by the clock rule (one pass of second chances), never one
//! with superseded entries awaiting collection: their grace periods are in memory only, and a
//! reload would restart them, so such keys stay until collected. Counters (keys, versions, bytes,
//! objects) are kept as running totals, since no pass over every key is possible.

use super::msg::{FilterAck, LcEntry, Refusal, Request, RequestBody, Response, ResponseBody};
use super::takeover::Carried;
use super::{
    Candidate, CrossChecksum, MacVec, ServerKeys, Timestamp, cmp_ts, fragment_digest, sole_writer,
};
use bulwark_core::membership::Incarnation;
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, Slot, Time};
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
    /// The group's incarnation, which MAC vectors bind.
    pub incarnation: Incarnation,
    /// How long a superseded version stays readable.
    pub grace_millis: u64,
    /// The most superseded versions kept per key, whatever their age.
    pub superseded_max: usize,
    /// The most keys whose metadata stays in memory; others are read back from the driver's
    /// storage when asked for. At least 1.
    pub cached_keys_max: usize,
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
    /// Treat an evicted key as one never written instead of reading it back: a cache that loses
    /// what it evicts.
    pub forget_evicted: bool,
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
            incarnation: Incarnation::new(&[], Epoch(0)),
            grace_millis: 10_000,
            superseded_max: 8,
            cached_keys_max: CACHED_KEYS_MAX,
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

/// The default bound on keys whose metadata stays in memory. At `f = 1` a key's metadata (its `lc`
/// and one entry, each with its MAC vector, and the entry's cross-checksum) is under 1 KiB, so
/// this holds a node's memory for register metadata to tens of MiB per group, whatever it stores.
pub const CACHED_KEYS_MAX: usize = 32_768;

/// `Hist[ts]` without its fragment: what the server decides on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// The full timestamp, tag included.
    pub ts: Timestamp,
    /// The cross-checksum.
    pub cc: CrossChecksum,
    /// `N̄`.
    pub nonce_hash: Digest,
    /// The pre-written MAC vector.
    pub vec: MacVec,
}

impl From<&StoredEntry> for EntryMeta {
    fn from(entry: &StoredEntry) -> EntryMeta {
        EntryMeta {
            ts: entry.ts,
            cc: entry.cc.clone(),
            nonce_hash: entry.nonce_hash,
            vec: entry.vec.clone(),
        }
    }
}

/// One register as the driver's storage holds it: `lc` and the metadata of every `Hist` entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredKey {
    /// `lc`; `None` is `c_0`.
    pub lc: Option<Candidate>,
    /// Every `Hist` entry, in no particular order.
    pub hist: Vec<EntryMeta>,
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

/// Read access to what this server's changes put into the driver's storage: every `Hist` entry
/// `Change::PutHist` wrote and `Change::DeleteHist` has not removed, and the last `lc`
/// `Change::SetLc` set, durable or still pending.
pub trait Fragments {
    /// The `lc` and `Hist` metadata of `key`, for a key the server no longer holds in memory. It
    /// must reflect every change the server emitted, pending ones included: the server decides
    /// on it as on its own state. Entries that fail the driver's checks may be left out, as a
    /// server may always lack a version.
    fn stored_key(&self, key: &Key) -> StoredKey;

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
pub struct MemoryFragments {
    /// Every `Hist` entry, fragment included.
    pub entries: HashMap<(Key, Timestamp), StoredEntry>,
    /// Every `lc`.
    pub lcs: HashMap<Key, Candidate>,
}

impl MemoryFragments {
    /// Applies one change, as a driver's storage would.
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::PutHist { key, entry } => {
                self.entries.insert((key.clone(), entry.ts), entry.clone());
            }
            Change::DeleteHist { key, ts } => {
                self.entries.remove(&(key.clone(), *ts));
            }
            Change::SetLc { key, candidate } => {
                self.lcs.insert(key.clone(), candidate.clone());
            }
        }
    }
}

impl Fragments for MemoryFragments {
    fn stored_key(&self, key: &Key) -> StoredKey {
        StoredKey {
            lc: self.lcs.get(key).cloned(),
            hist: self
                .entries
                .iter()
                .filter(|((k, _), _)| k == key)
                .map(|(_, entry)| EntryMeta::from(entry))
                .collect(),
        }
    }

    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        self.entries
            .get(&(key.clone(), *ts))
            .map(|entry| entry.fragment.clone())
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
    /// Used since the clock hand last passed: spared once.
    referenced: bool,
}

/// What the counters of [`ServerStats`] sum over keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    keys: u64,
    versions: u64,
    fragment_bytes: u64,
    objects: u64,
}

impl Totals {
    fn of(
        lc: Option<&Candidate>,
        hist: &mut dyn Iterator<Item = (&Timestamp, &CrossChecksum)>,
    ) -> Totals {
        let mut totals = Totals::default();
        let mut lc_tombstone = None;
        for (ts, cc) in hist {
            totals.versions += 1;
            totals.fragment_bytes += cc.layout.fragment_len() as u64;
            if lc.is_some_and(|lc| lc.ts == *ts) {
                lc_tombstone = Some(cc.tombstone);
            }
        }
        if lc.is_some() || totals.versions > 0 {
            totals.keys = 1;
        }
        // A completed version this server holds no entry of counts as an object.
        if lc.is_some() && lc_tombstone != Some(true) {
            totals.objects = 1;
        }
        totals
    }

    fn of_state(state: Option<&KeyState>) -> Totals {
        match state {
            Some(state) => Totals::of(
                state.lc.as_ref(),
                &mut state.hist.values().map(|e| (&e.ts, &e.cc)),
            ),
            None => Totals::default(),
        }
    }

    /// `self - before + after`: one key's change applied to running totals.
    fn moved(self, before: Totals, after: Totals) -> Totals {
        let apply = |total: u64, before: u64, after: u64| {
            assert!(
                total >= before,
                "a key's contribution is part of the totals"
            );
            total - before + after
        };
        Totals {
            keys: apply(self.keys, before.keys, after.keys),
            versions: apply(self.versions, before.versions, after.versions),
            fragment_bytes: apply(
                self.fragment_bytes,
                before.fragment_bytes,
                after.fragment_bytes,
            ),
            objects: apply(self.objects, before.objects, after.objects),
        }
    }
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
    fn new(entry: EntryMeta) -> HistEntry {
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
    /// `k_{w,i}` for every writer `w` it knows: shared with that writer only.
    macs: ServerKeys,
    /// The cached keys: at most `cached_keys_max`, beyond those awaiting collection.
    keys: HashMap<Key, KeyState>,
    /// The clock's ring of cached keys, the hand at the front; each cached key once.
    clock: VecDeque<Key>,
    /// Keys with superseded entries awaiting collection; always cached.
    collectable: HashSet<Key>,
    /// Over every key, cached or not.
    totals: Totals,
    collected: u64,
    damaged_fragments: u64,
}

impl Server {
    /// A server with empty state.
    pub fn new(config: ServerConfig, keys: ServerKeys) -> Server {
        assert_eq!(config.n, 3 * config.f + 1, "n = 3f+1");
        assert!(config.node.index() < config.n);
        assert!(
            config.cached_keys_max >= 1,
            "the request's own key is cached"
        );
        Server {
            config,
            macs: keys,
            keys: HashMap::new(),
            clock: VecDeque::new(),
            collectable: HashSet::new(),
            totals: Totals::default(),
            collected: 0,
            damaged_fragments: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Stores `carried`, a version of `key` read from the key's previous incarnation, as this
    /// member's `Hist` entry and `lc` when it is newer than `lc` (see [`super::takeover`]):
    /// the changes to make durable before the member says it holds it. The entry's MAC vector is
    /// [`MacVec::carried`], so the version is valid here through `Hist` alone. Refuses a version
    /// whose fragment does not hash to this member's slot of its cross-checksum, or that names a
    /// timestamp `Hist` holds under another nonce.
    pub fn carry(
        &mut self,
        now: Time,
        key: &Key,
        carried: Carried,
        fragments: &dyn Fragments,
    ) -> Result<Vec<Change>, &'static str> {
        let (n, me) = (self.config.n, self.config.node.index());
        if carried.ts.num == 0 {
            return Err("timestamp 0");
        }
        if !carried.cc.is_well_formed(n) {
            return Err("cross-checksum does not fit the group");
        }
        if carried.fragment.len() != carried.cc.layout.fragment_len()
            || fragment_digest(&carried.fragment) != carried.cc.hashes[me]
        {
            return Err("fragment does not match its hash");
        }
        self.load(now, key, fragments);
        let nonce_hash = carried.nonce.commitment();
        let held = self
            .keys
            .get(key)
            .and_then(|state| state.hist.get(&carried.ts));
        if held.is_some_and(|entry| entry.nonce_hash != nonce_hash) {
            return Err("another version is held under this timestamp");
        }
        let mut changes = Vec::new();
        self.counted(key, |server| {
            let state = server.keys.entry(key.clone()).or_insert_with(KeyState::new);
            let newer =
                cmp_ts(Some(&carried.ts), state.lc.as_ref().map(|c| &c.ts)) == Ordering::Greater;
            if !newer {
                return;
            }
            let mut vec = MacVec::carried(n);
            // Held already under the same nonce: `lc` takes the entry's vector, as a write-back
            // would, so that `lc` and `Hist` agree.
            if let Some(entry) = state.hist.get(&carried.ts) {
                vec = entry.vec.clone();
            } else {
                let entry = StoredEntry {
                    ts: carried.ts,
                    fragment: carried.fragment,
                    cc: carried.cc,
                    nonce_hash,
                    vec: vec.clone(),
                };
                state
                    .hist
                    .insert(entry.ts, HistEntry::new(EntryMeta::from(&entry)));
                changes.push(Change::PutHist {
                    key: key.clone(),
                    entry,
                });
            }
            let candidate = Candidate {
                ts: carried.ts,
                nonce: carried.nonce,
                vec,
            };
            server.raise_lc(now, key, candidate, &mut changes);
        });
        self.evict();
        Ok(changes)
    }

    /// The incarnation served goes on in `epoch`, as `group` there: requests name them from now.
    pub fn serve_as(&mut self, epoch: Epoch, group: GroupId) {
        self.config.epoch = epoch;
        self.config.group = group;
    }

    /// The timestamp of `key`'s `lc` (`None` is `ts_0`), read back from `fragments` if needed.
    pub fn held(&mut self, now: Time, key: &Key, fragments: &dyn Fragments) -> Option<Timestamp> {
        self.load(now, key, fragments);
        let held = self.lc(key).map(|lc| lc.ts);
        self.evict();
        held
    }

    /// Counts one durable key at start-up, every key once; its fragments stay in the driver's
    /// storage. A key with entries older than its `lc` is cached, and their grace periods start
    /// at `now`; others are cached while there is room.
    pub fn restore_key(&mut self, key: Key, stored: StoredKey, now: Time) {
        assert!(!self.keys.contains_key(&key), "each key is restored once");
        let state = KeyState::from_stored(stored);
        self.totals = self
            .totals
            .moved(Totals::default(), Totals::of_state(Some(&state)));
        let superseded = state.lc.as_ref().is_some_and(|lc| {
            state
                .hist
                .keys()
                .any(|ts| ts.cmp_order(&lc.ts) == Ordering::Less)
        });
        if superseded || self.keys.len() < self.config.cached_keys_max {
            self.insert_cached(key.clone(), state);
            self.mark_superseded(&key, now);
        }
    }

    /// The `lc` of `key` if its metadata is in memory, for tests and fault injection.
    pub fn lc(&self, key: &Key) -> Option<&Candidate> {
        self.keys.get(key).and_then(|s| s.lc.as_ref())
    }

    /// Number of `Hist` entries held for `key`, if its metadata is in memory.
    pub fn versions(&self, key: &Key) -> usize {
        self.keys.get(key).map_or(0, |s| s.hist.len())
    }

    /// Number of keys whose metadata is in memory.
    pub fn cached_keys(&self) -> usize {
        self.keys.len()
    }

    fn insert_cached(&mut self, key: Key, state: KeyState) {
        let previous = self.keys.insert(key.clone(), state);
        assert!(previous.is_none(), "a key is cached once");
        self.clock.push_back(key);
    }

    /// Makes `key`'s metadata present, reading it back if it was evicted, and marks it used.
    fn load(&mut self, now: Time, key: &Key, stored: &dyn Fragments) {
        if let Some(state) = self.keys.get_mut(key) {
            state.referenced = true;
            return;
        }
        let state = if self.config.mutations.forget_evicted {
            KeyState::new()
        } else {
            KeyState::from_stored(stored.stored_key(key))
        };
        self.insert_cached(key.clone(), state);
        self.mark_superseded(key, now);
    }

    /// Evicts keys until at most `cached_keys_max` are cached, sparing each used one once and
    /// keeping those awaiting collection (so the bound may be passed by those alone).
    fn evict(&mut self) {
        let mut spared = 0;
        while self.keys.len() > self.config.cached_keys_max && spared <= self.clock.len() {
            let Some(key) = self.clock.pop_front() else {
                break;
            };
            let state = self
                .keys
                .get_mut(&key)
                .expect("the clock holds only cached keys");
            if state.referenced || self.collectable.contains(&key) {
                state.referenced = false;
                self.clock.push_back(key);
                spared += 1;
                continue;
            }
            self.keys.remove(&key);
            spared = 0;
        }
        debug_assert_eq!(self.keys.len(), self.clock.len());
    }

    /// Runs `step` on `key`'s cached state, keeping the running totals right.
    fn counted<T>(&mut self, key: &Key, step: impl FnOnce(&mut Self) -> T) -> T {
        let before = Totals::of_state(self.keys.get(key));
        let out = step(self);
        let after = Totals::of_state(self.keys.get(key));
        self.totals = self.totals.moved(before, after);
        out
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
            &self.config.incarnation,
            key,
            &candidate.ts,
            &nonce_hash,
            &self.macs,
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
            &self.config.incarnation,
            &request.key,
            ts,
            nonce_hash,
            &self.macs,
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
            state
                .hist
                .insert(*ts, HistEntry::new(EntryMeta::from(&entry)));
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

impl Server {
    /// `handle` once the request's key is cached.
    fn handle_loaded(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
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
            RequestBody::Hold { .. } => {
                let lc_ts = self.lc(&request.key).map(|c| c.ts);
                Self::reply(&request, Vec::new(), ResponseBody::HoldAck { lc_ts })
            }
        };
        if self.collectable.contains(&request.key) {
            self.collect_key(&request.key, now, &mut handled.changes);
        }
        handled
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
            let current = self.config.epoch;
            return Self::refuse(&request, Refusal::WrongEpoch { current });
        }
        if request.group != self.config.group {
            return Self::refuse(&request, Refusal::WrongGroup);
        }
        if !request.key.is_valid() {
            return Self::refuse(&request, Refusal::Malformed("key length".to_string()));
        }
        let key = request.key.clone();
        self.load(now, &key, fragments);
        let handled = self.counted(&key, |server| {
            server.handle_loaded(now, from, access, request, fragments)
        });
        self.evict();
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        let mut changes = Vec::new();
        let keys: Vec<Key> = self.collectable.iter().cloned().collect();
        for key in keys {
            self.counted(&key, |server| server.collect_key(&key, now, &mut changes));
        }
        self.evict();
        changes
    }

    fn stats(&self) -> ServerStats {
        ServerStats {
            objects: self.totals.objects,
            keys: self.totals.keys,
            versions: self.totals.versions,
            fragment_bytes: self.totals.fragment_bytes,
            collected: self.collected,
            damaged_fragments: self.damaged_fragments,
        }
    }
}

impl KeyState {
    fn new() -> KeyState {
        KeyState {
            lc: None,
            hist: HashMap::new(),
            superseded: VecDeque::new(),
            referenced: true,
        }
    }

    fn from_stored(stored: StoredKey) -> KeyState {
        let mut state = KeyState::new();
        state.lc = stored.lc;
        for entry in stored.hist {
            state.hist.insert(entry.ts, HistEntry::new(entry));
        }
        state
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
