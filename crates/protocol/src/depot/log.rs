//! One node's log of one causal volume (Depot §2.6, §3.3, §4): the updates it accepted, each only
//! after everything it depends on, its frontier (the version vector, with a head per branch of a
//! forked writer), the heads of every key, and the forks it found.
//!
//! The frontier is the expanded version vector of §4.5 kept by hash: for each writer, the latest
//! updates of that writer this node holds, one per branch. A correct writer has one branch; a
//! writer that forked has one head per branch, each the virtual node `writer + H(first update of
//! the branch)` of the paper, and both branches are accepted and passed on like the writes of two
//! nodes (fork join), so correct nodes can always exchange what they hold.

use super::update::{
    Dep, Malformed, Update, UpdateBody, UpdateId, ValueRef, VolumeConfig, WireUpdate, Writer,
    history_hash,
};
use bulwark_core::Key;
use bulwark_core::evidence::Proof;
use bulwark_core::sign::{SecretKey, Signed};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, hash_map};
use std::sync::Arc;

/// How far ahead of a node's own time (in microseconds) an update's clock may be before the node
/// defers it (§4.8): a faulty writer cannot drag every correct node's clock to the end of its
/// range.
pub const CLOCK_AHEAD_MAX_MICROS: u64 = 60_000_000;

/// Updates held while they wait for what they depend on. Beyond this the newest are dropped and
/// fetched again later, so a peer cannot fill a node's memory with updates it can never accept.
pub const PENDING_MAX: usize = 16_384;

/// The heads of one writer a peer's frontier may claim that a pull's answer looks at: a correct
/// peer has one per branch of the writer that it knows of.
pub const PEER_HEADS_MAX: usize = 64;

/// Deliberate breaks of Depot's rules, for the simulator's negative controls: each must be caught
/// by its checker. All off in every real node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// Accept an update once its writer's previous update is held, without the other updates it
    /// names and without checking its history hash (§3.3 steps 3 and 4 skipped).
    pub accept_without_deps: bool,
    /// Take an update as known when its writer's clock here has reached its clock: stamps
    /// compared instead of hashes (the pitfall of §8.1 item 2), which hides forks.
    pub skip_by_stamp: bool,
    /// Keep superseded updates among a key's heads (§3.7 not applied).
    pub keep_superseded: bool,
    /// Never ask a peer for updates by name: the fork point is not looked for (§4.4).
    pub never_ask_by_name: bool,
    /// Never suspect a silent client of hiding updates (§6.4 not applied).
    pub never_suspect: bool,
    /// Refuse a writer's second update after one previous update instead of joining the fork
    /// (§4.5 not applied): the branch seen first wins here, the other elsewhere.
    pub refuse_forks: bool,
    /// Take a beacon time from an update still waiting for what it names, before it is
    /// verified and accepted (the pitfall of T20): a staleness bound from an unverified branch.
    pub beacon_before_accept: bool,
    /// Consent to any discard proposal without asking the backup ladder (§6.6 rule (a) not
    /// applied): a faulty client's premature list then gets every signature.
    pub consent_unchecked: bool,
    /// Apply a discard proposal once every client but one consented (§6.6 (b) not applied):
    /// one refusing client no longer holds discard back.
    pub discard_short_of_one: bool,
}

/// A frontier: for each writer, its latest updates one holds (one per branch), by clock and id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier(BTreeMap<Writer, Vec<(u64, UpdateId)>>);

impl Frontier {
    /// Every head, in writer then id order: what the history hash covers.
    pub fn flat(&self) -> Vec<(Writer, u64, UpdateId)> {
        let mut flat = Vec::new();
        for (writer, heads) in &self.0 {
            let mut heads = heads.clone();
            heads.sort_by_key(|(_, id)| *id);
            flat.extend(heads.into_iter().map(|(clock, id)| (*writer, clock, id)));
        }
        flat
    }

    /// The heads of `writer`.
    pub fn heads(&self, writer: Writer) -> &[(u64, UpdateId)] {
        self.0.get(&writer).map_or(&[], Vec::as_slice)
    }

    /// The highest clock of any head.
    pub fn max_clock(&self) -> u64 {
        self.0
            .values()
            .flat_map(|heads| heads.iter().map(|(clock, _)| *clock))
            .max()
            .unwrap_or(0)
    }

    /// Writers with more than one head: forks this frontier has joined.
    pub fn forked(&self) -> impl Iterator<Item = Writer> + '_ {
        self.0
            .iter()
            .filter(|(_, heads)| heads.len() > 1)
            .map(|(writer, _)| *writer)
    }
}

/// A frontier as a peer sends it: unverified claims, bounded by the message that carries them.
pub type Summary = Vec<(Writer, u64, UpdateId)>;

/// What became of one offered update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Already in the log.
    Known,
    /// Accepted now.
    Accepted,
    /// Waits for these updates it depends on.
    Missing(Vec<UpdateId>),
    /// Its clock is too far ahead of this node's time (§4.8); offered again later.
    Deferred,
    /// Refused: no correct writer signs it.
    Refused(Refusal),
}

/// Why a verified update was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Its signature or shape.
    #[error(transparent)]
    Malformed(#[from] Malformed),
    /// A dependency's writer or clock is not the named update's.
    #[error("dependency {0:?} does not name the update it hashes to")]
    DepMismatch(UpdateId),
    /// `prev` names another writer's update.
    #[error("previous update {0:?} is not the writer's")]
    ForeignPrev(UpdateId),
    /// Its dependencies reach a newer update of its own writer than `prev`.
    #[error("its dependencies include the writer's updates after its previous one")]
    OwnPast,
    /// Its clock does not exceed every clock it depends on (§2.4).
    #[error("clock {clock} not above its dependencies' {max}")]
    Clock {
        /// Its clock.
        clock: u64,
        /// The highest clock in its past.
        max: u64,
    },
    /// Its history hash is not the hash of the past its dependencies name (§3.3 step 4).
    #[error("history hash does not match its dependencies")]
    History,
}

/// A proof that a writer forked: two updates it signed that name the same previous update
/// (§4.3, §4.7). Anyone holding the volume's configuration can check it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForkProof {
    /// Who forked.
    pub writer: Writer,
    /// Its two signed updates.
    pub proof: Proof,
}

impl ForkProof {
    /// The proof of `first` and `second`, if they are two different updates of one writer of
    /// `config`'s volume with the same previous update. Both are checked again under the
    /// writer's key (updates do not keep it): once per forked writer.
    pub fn of(first: &Update, second: &Update, config: &VolumeConfig) -> Option<ForkProof> {
        let (a, b) = (first.body(), second.body());
        if a.writer != b.writer || a.volume != b.volume || a.prev != b.prev {
            return None;
        }
        let size = bulwark_core::evidence::PROOF_MESSAGE_BYTES_MAX;
        if first.bytes().len() > size || second.bytes().len() > size {
            return None;
        }
        let key = &config.member(a.writer)?.key;
        let first = first.to_wire().signed.verify(key).ok()?;
        let second = second.to_wire().signed.verify(key).ok()?;
        Some(ForkProof {
            writer: a.writer,
            proof: Proof::conflicting(&first, &second)?,
        })
    }

    /// Whether it proves what it says to someone who trusts only `config`: the writer's key signed
    /// both, and both are this volume's updates of that writer naming one previous update.
    pub fn verify(&self, config: &VolumeConfig) -> bool {
        let Some(member) = config.member(self.writer) else {
            return false;
        };
        self.proof.signer() == &member.key
            && self.proof.verify_conflict::<UpdateBody>(|a, b| {
                a.volume == config.volume
                    && b.volume == config.volume
                    && a.writer == self.writer
                    && b.writer == self.writer
                    && a.prev == b.prev
            })
    }
}

/// An accepted update and its whole past.
#[derive(Debug)]
struct Entry {
    update: Update,
    /// The heads of the frontier of its causal past (itself not included), by id: a log holds
    /// one of these per update, so it keeps only what a merge reads.
    past: Box<[UpdateId]>,
    /// For a version a discard may list: when it began at the latest, its writer's last beacon
    /// before it less the clock skew allowed, in microseconds (0 when unknown); [`UNSET`]
    /// for other updates.
    born: u64,
    /// When its life as a version ended, at the earliest: when this node accepted the first
    /// authorised update of its key that covers it, by this node's clock; [`UNSET`] while it
    /// is a head.
    ended: u64,
    /// How many updates of its writer come before it on its branch.
    depth: u64,
    /// An update before it on its branch, chosen so that any one before it is found in a number
    /// of steps logarithmic in the distance (skew-binary jump pointers, Myers 1983): how a
    /// forked writer's branches are told apart without walking them. Itself for a first update.
    jump: UpdateId,
}

impl Entry {
    /// The heads of its past. Kept empty when they are its previous update alone (a writer
    /// that depends on no one else's new updates), which saves a box per update.
    fn past(&self) -> &[UpdateId] {
        if self.past.is_empty() {
            self.update.body().prev.as_slice()
        } else {
            &self.past
        }
    }
}

/// No time: an update that is not a listable version, or a version not yet superseded. Kept
/// in the entry rather than in maps of their own, where each would cost a slot per update.
const UNSET: u64 = u64::MAX;

/// One node's log of one volume.
#[derive(Debug)]
pub struct Log {
    config: Arc<VolumeConfig>,
    /// The node this log belongs to.
    me: Writer,
    entries: HashMap<UpdateId, Entry>,
    /// Each writer's accepted updates by clock, then id (forks give one stamp two updates): log
    /// order (§2.4: clock, then writer, then id) is their merge, and what a peer lacks of a
    /// writer is found from that writer's own updates, not from a scan of the whole log.
    by_writer: BTreeMap<Writer, BTreeSet<(u64, UpdateId)>>,
    /// Each writer's first update naming each previous update: a correct writer's have one each,
    /// and a second is a fork (proved from the first, so no more than one is kept).
    children: HashMap<(Writer, Option<UpdateId>), UpdateId>,
    /// Writers this log holds a fork of.
    forked: BTreeSet<Writer>,
    frontier: Frontier,
    /// Lamport clock: at least every accepted clock.
    clock: u64,
    /// Per key, the authorised updates no other accepted update supersedes (§3.7).
    heads: BTreeMap<Key, Vec<UpdateId>>,
    /// Proofs of forks, one per writer (the first found or received).
    forks: BTreeMap<Writer, ForkProof>,
    /// Verified updates waiting for dependencies, in log order.
    pending: BTreeMap<(u64, Writer, UpdateId), Update>,
    /// The ids of `pending`.
    waiting: std::collections::HashSet<UpdateId>,
    /// Refusals since start, for status.
    refused: u64,
    /// Accepted since the owner last took them, with when: what it must make durable.
    fresh: Vec<(UpdateId, u64)>,
    /// Each value hash some accepted update names, with how many authorised updates name it
    /// (the versions that may need it; an unauthorised update is never read).
    values: HashMap<bulwark_core::Digest, u32>,
    mutations: Mutations,
    /// The newest beacon time accepted from each member, over all its branches.
    beacons: BTreeMap<Writer, u64>,
}

impl Log {
    /// An empty log of `config`'s volume for member `me`.
    pub fn new(config: Arc<VolumeConfig>, me: Writer) -> Log {
        Log {
            config,
            me,
            entries: HashMap::new(),
            by_writer: BTreeMap::new(),
            children: HashMap::new(),
            forked: BTreeSet::new(),
            frontier: Frontier::default(),
            clock: 0,
            heads: BTreeMap::new(),
            forks: BTreeMap::new(),
            pending: BTreeMap::new(),
            waiting: std::collections::HashSet::new(),
            refused: 0,
            fresh: Vec::new(),
            values: HashMap::new(),
            mutations: Mutations::default(),
            beacons: BTreeMap::new(),
        }
    }

    /// This log with rules broken on purpose, for negative controls.
    pub fn mutate(&mut self, mutations: Mutations) {
        self.mutations = mutations;
    }

    /// The rules it breaks.
    pub fn mutations(&self) -> Mutations {
        self.mutations
    }

    /// The volume.
    pub fn config(&self) -> &Arc<VolumeConfig> {
        &self.config
    }

    /// The member this log belongs to.
    pub fn me(&self) -> Writer {
        self.me
    }

    /// The newest beacon time accepted from `writer`.
    pub fn beacon(&self, writer: Writer) -> Option<u64> {
        self.beacons.get(&writer).copied()
    }

    /// The clients a reader at `now_ms` suspects of updates it has not seen (§6.4): those whose
    /// newest beacon it holds is older than the bound, or that it has none of once the bound has
    /// passed since the volume began.
    pub fn suspects(&self, now_ms: u64) -> Vec<Writer> {
        if self.mutations.never_suspect {
            return Vec::new();
        }
        let bound = self.config.staleness.bound_ms();
        let Some(oldest) = now_ms.checked_sub(bound) else {
            return Vec::new();
        };
        self.config
            .members
            .iter()
            .enumerate()
            .map(|(index, member)| (Writer(index as u32), member))
            .filter(|(writer, member)| {
                member.role == super::update::Role::Client
                    && *writer != self.me
                    && self.beacon(*writer).is_none_or(|time| time < oldest)
            })
            .map(|(writer, _)| writer)
            .collect()
    }

    /// Whether an accepted update names the value `hash`: the only values a node keeps.
    pub fn names_value(&self, hash: &bulwark_core::Digest) -> bool {
        self.values.contains_key(hash)
    }

    /// Whether `id` is accepted.
    pub fn holds(&self, id: &UpdateId) -> bool {
        self.entries.contains_key(id)
    }

    /// The accepted update `id`.
    pub fn get(&self, id: &UpdateId) -> Option<&Update> {
        self.entries.get(id).map(|entry| &entry.update)
    }

    /// How many updates are accepted.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is accepted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Updates waiting for their dependencies.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Updates refused since start.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The frontier: this node's version vector, a head per branch.
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }

    /// The Lamport clock.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// The forks found, by writer.
    pub fn forks(&self) -> &BTreeMap<Writer, ForkProof> {
        &self.forks
    }

    /// How many steps back along its writer's chain a version's beacon is looked for.
    const BEACON_SEARCH_MAX: usize = 64;

    /// The time (ms) of the newest beacon its writer wrote before the update `body` describes,
    /// found within [`Self::BEACON_SEARCH_MAX`] steps back along the writer's own chain.
    fn last_beacon_before(&self, body: &UpdateBody) -> Option<u64> {
        let mut cursor = body.prev;
        for _ in 0..Self::BEACON_SEARCH_MAX {
            let previous = self.get(&cursor?)?.body();
            if let Some(time) = previous.beacon {
                return Some(time);
            }
            cursor = previous.prev;
        }
        None
    }

    /// When version `id` began at the latest and, once superseded, ended at the earliest, in
    /// this node's microseconds (§6.6); `None` for an update no discard may list.
    pub fn life(&self, id: &UpdateId) -> Option<(u64, Option<u64>)> {
        let entry = self.entries.get(id)?;
        (entry.born != UNSET).then(|| (entry.born, (entry.ended != UNSET).then_some(entry.ended)))
    }

    /// Whether `update` is a version a discard may list: an authorised write of a value to a key
    /// that is not the protocol's own.
    fn listable(&self, update: &Update) -> bool {
        let body = update.body();
        body.value.is_some()
            && !super::update::is_reserved(&body.key)
            && self.config.may_write(body.writer, &body.key)
    }

    /// The versions whose values `ladder` does not keep at `now`, in log order, at most `limit`:
    /// what a proposer lists (§6.6).
    pub fn discardable(
        &self,
        ladder: &super::discard::Ladder,
        now: u64,
        limit: usize,
    ) -> Vec<UpdateId> {
        self.in_order()
            .filter(|update| self.listable(update))
            .filter(|update| {
                self.life(&update.id())
                    .is_some_and(|(born, ended)| !ladder.keeps(born, ended, now))
            })
            .map(Update::id)
            .take(limit)
            .collect()
    }

    /// Whether a correct client may consent to discarding `ids` at `now` under `ladder`: it holds
    /// each, each is a version, and its ladder keeps none.
    pub fn check_discard(
        &self,
        ids: &[UpdateId],
        ladder: &super::discard::Ladder,
        now: u64,
    ) -> Result<(), super::discard::Withheld> {
        use super::discard::Withheld;
        for id in ids {
            let Some(update) = self.get(id) else {
                return Err(Withheld::Missing(*id));
            };
            if !self.listable(update) {
                return Err(Withheld::NotAVersion(*id));
            }
            let Some((born, ended)) = self.life(id) else {
                return Err(Withheld::NotAVersion(*id));
            };
            if ladder.keeps(born, ended, now) {
                return Err(Withheld::Kept(*id));
            }
        }
        Ok(())
    }

    /// How many accepted authorised updates name the value `hash`: the versions that may need
    /// it (an unauthorised update is never read).
    pub fn value_namers(&self, hash: &bulwark_core::Digest) -> u32 {
        self.values.get(hash).copied().unwrap_or(0)
    }

    /// Every accepted update in log order.
    pub fn in_order(&self) -> impl Iterator<Item = &Update> + '_ {
        LogOrder::new(
            self.by_writer
                .iter()
                .map(|(writer, ids)| (*writer, Box::new(ids.iter().copied()) as Stream<'_>))
                .collect(),
        )
        .filter_map(|id| self.entries.get(&id).map(|entry| &entry.update))
    }

    /// The updates a read of `key` returns: every authorised update to it that no accepted update
    /// supersedes, concurrent ones (both branches of a fork among them) all returned (§2.2).
    pub fn heads(&self, key: &Key) -> Vec<&Update> {
        self.heads
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|id| self.get(id))
            .collect()
    }

    /// Every authorised update to `key` this log holds, superseded ones too, in log order: the
    /// key's history as far as nothing was discarded (§6.6's versioning). A walk of the whole log.
    pub fn versions(&self, key: &Key) -> Vec<&Update> {
        self.in_order()
            .filter(|update| {
                let body = update.body();
                &body.key == key && self.config.may_write(body.writer, key)
            })
            .collect()
    }

    /// Keys with versions, in key order (their versions may all be deletes).
    pub fn keys(&self) -> impl Iterator<Item = &Key> + '_ {
        self.keys_after(None)
    }

    /// Keys with versions after `after` (all when `None`), in key order: a listing's next page.
    pub fn keys_after(&self, after: Option<&Key>) -> impl Iterator<Item = &Key> + '_ {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.heads
            .range::<Key, _>((from, Bound::Unbounded))
            .filter(|(_, heads)| !heads.is_empty())
            .map(|(key, _)| key)
    }

    /// Whether update `a` is `b` or in `b`'s past, both by one writer and both held.
    fn precedes_own(&self, a: UpdateId, b: UpdateId) -> bool {
        if a == b {
            return true;
        }
        let (Some(ea), Some(eb)) = (self.entries.get(&a), self.entries.get(&b)) else {
            return false;
        };
        let (ba, bb) = (ea.update.body(), eb.update.body());
        if ba.writer != bb.writer || ba.clock >= bb.clock {
            return false;
        }
        if !self.forked.contains(&ba.writer) {
            // Without a fork, a writer's held updates form one chain (each names its previous,
            // which is held), and clocks grow along it.
            return true;
        }
        self.before_on_branch(b, ea.depth) == Some(a)
    }

    /// The update of `id`'s branch `depth` updates from its writer's first, if held: a
    /// logarithmic number of steps along jump pointers and previous updates.
    fn before_on_branch(&self, mut id: UpdateId, depth: u64) -> Option<UpdateId> {
        let mut entry = self.entries.get(&id)?;
        while entry.depth > depth {
            let jump = self.entries.get(&entry.jump)?;
            id = if jump.depth >= depth && jump.depth < entry.depth {
                entry.jump
            } else {
                entry.update.body().prev?
            };
            entry = self.entries.get(&id)?;
        }
        (entry.depth == depth).then_some(id)
    }

    /// Where a new update `id` after `prev` sits on its branch, and its jump pointer: its
    /// previous update's jump's jump when the two jumps before it span equal distances, which
    /// keeps every jump a skew-binary length, and its previous update otherwise.
    fn depth_and_jump(&self, id: UpdateId, prev: Option<UpdateId>) -> (u64, UpdateId) {
        let Some((prev, parent)) = prev.and_then(|p| self.entries.get(&p).map(|e| (p, e))) else {
            debug_assert!(
                prev.is_none(),
                "an update is accepted after its previous one"
            );
            return (0, id);
        };
        let depth_of = |id: &UpdateId| self.entries.get(id).map_or(0, |e| e.depth);
        let once = parent.jump;
        let twice = self.entries.get(&once).map_or(once, |e| e.jump);
        let jump = if parent.depth - depth_of(&once) == depth_of(&once) - depth_of(&twice) {
            twice
        } else {
            prev
        };
        (parent.depth + 1, jump)
    }

    /// Whether held update `id` is in the past that `frontier` describes.
    fn covers(&self, frontier: &Frontier, id: UpdateId) -> bool {
        let Some(entry) = self.entries.get(&id) else {
            return false;
        };
        let body = entry.update.body();
        frontier
            .heads(body.writer)
            .iter()
            .any(|(clock, head)| *clock >= body.clock && self.precedes_own(id, *head))
    }

    /// Adds held update `id` to `frontier`, unless it is already in its past, dropping the heads
    /// it succeeds.
    fn extend(&self, frontier: &mut Frontier, id: UpdateId) {
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        let (writer, clock) = (entry.update.body().writer, entry.update.body().clock);
        let heads = frontier.0.entry(writer).or_default();
        if heads.iter().any(|(_, head)| self.precedes_own(id, *head)) {
            return;
        }
        heads.retain(|(_, head)| !self.precedes_own(*head, id));
        heads.push((clock, id));
        heads.sort();
    }

    /// Adds every head of `other` to `frontier`.
    fn merge(&self, frontier: &mut Frontier, other: &[UpdateId]) {
        for id in other {
            self.extend(frontier, *id);
        }
    }

    /// The past of an update naming `prev` and `deps`, all held.
    fn past_of(&self, prev: Option<UpdateId>, deps: &[Dep]) -> Frontier {
        let mut past = Frontier::default();
        for id in prev.into_iter().chain(deps.iter().map(|dep| dep.id)) {
            if let Some(entry) = self.entries.get(&id) {
                self.merge(&mut past, entry.past());
                self.extend(&mut past, id);
            }
        }
        past
    }

    /// Offers one verified update: accepted if everything it depends on is, refused if no correct
    /// writer could have signed it, else kept until its dependencies arrive. `now_micros` is this
    /// node's time, for the clock bound.
    pub fn offer(&mut self, update: Update, now_micros: u64) -> Offer {
        let outcome = self.try_accept(&update, now_micros);
        match &outcome {
            Offer::Missing(_) | Offer::Deferred => self.hold(update),
            Offer::Refused(_) => self.refused += 1,
            Offer::Accepted => self.drain(now_micros),
            Offer::Known => {}
        }
        outcome
    }

    /// Keeps a verified update until its dependencies arrive, within [`PENDING_MAX`].
    fn hold(&mut self, update: Update) {
        let body = update.body();
        let slot = (body.clock, body.writer, update.id());
        if self.pending.len() >= PENDING_MAX {
            // Keep the oldest: they are the ones the others wait for.
            match self.pending.last_key_value() {
                Some((last, _)) if *last > slot => {
                    let last = *last;
                    self.pending.remove(&last);
                    self.waiting.remove(&last.2);
                }
                _ => return,
            }
        }
        self.pending.insert(slot, update);
        self.waiting.insert(slot.2);
    }

    /// Accepts every held update whose dependencies have all arrived, in log order, until none
    /// is left that can be.
    fn drain(&mut self, now_micros: u64) {
        loop {
            let mut progress = false;
            let slots: Vec<_> = self.pending.keys().copied().collect();
            for slot in slots {
                let Some(update) = self.pending.get(&slot).cloned() else {
                    continue;
                };
                match self.try_accept(&update, now_micros) {
                    Offer::Missing(_) | Offer::Deferred => {}
                    Offer::Accepted => {
                        self.pending.remove(&slot);
                        self.waiting.remove(&slot.2);
                        progress = true;
                    }
                    Offer::Known => {
                        self.pending.remove(&slot);
                        self.waiting.remove(&slot.2);
                    }
                    Offer::Refused(_) => {
                        self.refused += 1;
                        self.pending.remove(&slot);
                        self.waiting.remove(&slot.2);
                    }
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Offers every held update again (a deferred clock may have come within bounds).
    pub fn retry(&mut self, now_micros: u64) {
        self.drain(now_micros);
    }

    /// The updates held ones wait for and that are not held themselves: what to fetch.
    pub fn wanted(&self) -> Vec<UpdateId> {
        if self.mutations.never_ask_by_name {
            return Vec::new();
        }
        let mut wanted = BTreeSet::new();
        let waiting = &self.waiting;
        for update in self.pending.values() {
            let body = update.body();
            for id in body
                .prev
                .into_iter()
                .chain(body.deps.iter().map(|dep| dep.id))
            {
                if !self.holds(&id) && !waiting.contains(&id) {
                    wanted.insert(id);
                }
            }
        }
        wanted.into_iter().collect()
    }

    /// Every check of §3.3 after the signature, and the acceptance itself.
    fn try_accept(&mut self, update: &Update, now_micros: u64) -> Offer {
        let id = update.id();
        if self.holds(&id) {
            return Offer::Known;
        }
        let body = update.body();
        if body.clock > now_micros.saturating_add(CLOCK_AHEAD_MAX_MICROS) {
            return Offer::Deferred;
        }
        if self.mutations.skip_by_stamp
            && self
                .frontier
                .heads(body.writer)
                .iter()
                .any(|(clock, _)| *clock >= body.clock)
        {
            return Offer::Known;
        }
        let named = body.deps.iter().map(|dep| dep.id);
        let missing: Vec<UpdateId> = if self.mutations.accept_without_deps {
            body.prev.into_iter().filter(|id| !self.holds(id)).collect()
        } else {
            body.prev
                .into_iter()
                .chain(named)
                .filter(|id| !self.holds(id))
                .collect()
        };
        if !missing.is_empty() {
            if self.mutations.beacon_before_accept
                && let Some(time) = body.beacon
            {
                let newest = self.beacons.entry(body.writer).or_default();
                *newest = (*newest).max(time);
            }
            return Offer::Missing(missing);
        }
        if self.mutations.refuse_forks && self.children.contains_key(&(body.writer, body.prev)) {
            return Offer::Refused(Refusal::OwnPast);
        }
        if let Some(prev) = body.prev
            && self.get(&prev).map(|p| p.body().writer) != Some(body.writer)
        {
            return Offer::Refused(Refusal::ForeignPrev(prev));
        }
        for dep in &body.deps {
            let named = self.get(&dep.id).map(|d| (d.body().writer, d.body().clock));
            if named != Some((dep.writer, dep.clock)) && !self.mutations.accept_without_deps {
                return Offer::Refused(Refusal::DepMismatch(dep.id));
            }
        }
        let past = self.past_of(body.prev, &body.deps);
        let own: Vec<UpdateId> = past.heads(body.writer).iter().map(|(_, id)| *id).collect();
        if own != body.prev.into_iter().collect::<Vec<_>>() {
            return Offer::Refused(Refusal::OwnPast);
        }
        let max = past.max_clock();
        if body.clock <= max {
            return Offer::Refused(Refusal::Clock {
                clock: body.clock,
                max,
            });
        }
        if history_hash(&past.flat()) != body.history && !self.mutations.accept_without_deps {
            return Offer::Refused(Refusal::History);
        }
        self.insert(update.clone(), past, now_micros);
        Offer::Accepted
    }

    /// Adds an update that passed every check.
    fn insert(&mut self, update: Update, past: Frontier, now_micros: u64) {
        let id = update.id();
        let body = update.body().clone();
        let sibling = match self.children.entry((body.writer, body.prev)) {
            hash_map::Entry::Occupied(first) => Some(*first.get()),
            hash_map::Entry::Vacant(slot) => {
                slot.insert(id);
                None
            }
        };
        if sibling.is_some() {
            self.forked.insert(body.writer);
        }
        // Unauthorised updates are kept and passed on, but neither become heads nor end any.
        let authorised = self.config.may_write(body.writer, &body.key);
        let supersedes: Vec<UpdateId> = if authorised {
            self.heads
                .get(&body.key)
                .into_iter()
                .flatten()
                .copied()
                .filter(|head| self.covers(&past, *head))
                .collect()
        } else {
            Vec::new()
        };
        let mut born = UNSET;
        if authorised && !super::update::is_reserved(&body.key) {
            // Update clocks count, they do not tell time. A version's life is bounded from
            // outside: it began no later than its writer's last beacon before it says (less the
            // skew allowed), and ended no earlier than this node accepted the first update of
            // its key covering it, which is when it stops being a head here. Both err towards a
            // longer life, so towards keeping more.
            for head in &supersedes {
                if let Some(entry) = self.entries.get_mut(head)
                    && entry.ended == UNSET
                {
                    entry.ended = now_micros;
                }
            }
            if body.value.is_some() {
                born = self.last_beacon_before(&body).map_or(0, |ms| {
                    ms.saturating_mul(1000)
                        .saturating_sub(CLOCK_AHEAD_MAX_MICROS)
                        .min(now_micros)
                });
            }
        }
        debug_assert!(born != UNSET || !self.listable(&update));
        let heads: Box<[UpdateId]> = past
            .0
            .values()
            .flat_map(|heads| heads.iter().map(|(_, head)| *head))
            .collect();
        let (depth, jump) = self.depth_and_jump(id, body.prev);
        let entry = Entry {
            depth,
            jump,
            past: if *heads == *body.prev.as_slice() {
                Box::default()
            } else {
                heads
            },
            update: update.clone(),
            born,
            ended: UNSET,
        };
        debug_assert!(
            entry
                .past()
                .iter()
                .eq(past.0.values().flatten().map(|(_, h)| h))
        );
        self.entries.insert(id, entry);
        self.by_writer
            .entry(body.writer)
            .or_default()
            .insert((body.clock, id));
        self.fresh.push((id, now_micros));
        if let Some(reference) = body.value {
            *self.values.entry(reference.hash).or_default() += u32::from(authorised);
        }
        if let Some(time) = body.beacon
            && authorised
        {
            let newest = self.beacons.entry(body.writer).or_default();
            *newest = (*newest).max(time);
        }
        let mut frontier = std::mem::take(&mut self.frontier);
        self.extend(&mut frontier, id);
        self.frontier = frontier;
        self.clock = self.clock.max(body.clock);
        if authorised {
            let keep_superseded = self.mutations.keep_superseded;
            let heads = self
                .heads
                .entry(body.key.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            heads.retain(|head| keep_superseded || !supersedes.contains(head));
            heads.push(id);
        }
        if let Some(sibling) = sibling
            && !self.forks.contains_key(&body.writer)
            && let Some(proof) = self
                .get(&sibling)
                .and_then(|first| ForkProof::of(first, &update, &self.config))
        {
            self.forks.insert(body.writer, proof);
        }
        debug_assert!(
            self.frontier
                .heads(body.writer)
                .iter()
                .any(|(_, h)| *h == id),
            "a newly accepted update is a head of its writer"
        );
    }

    /// Records a fork proof received from a peer, once checked.
    pub fn learn_fork(&mut self, proof: ForkProof) -> bool {
        if self.forks.contains_key(&proof.writer) || !proof.verify(&self.config) {
            return false;
        }
        self.forks.insert(proof.writer, proof);
        true
    }

    /// A new local write by this node (§3.1): the next clock, the previous own update, the
    /// frontier entries that moved since it, and the history hash of the whole frontier, signed.
    /// It is accepted into the log before it is returned; the caller makes it durable before
    /// sending it anywhere (a crash must never look like a fork, §8.1).
    pub fn write(
        &mut self,
        secret: &SecretKey,
        key: Key,
        value: Option<ValueRef>,
        now_micros: u64,
    ) -> Update {
        self.write_body(secret, key, value, None, now_micros)
    }

    /// This node's beacon (§6.4): an ordinary signed update to its beacon key carrying its time,
    /// so a reader that holds it holds everything this node wrote before.
    pub fn write_beacon(&mut self, secret: &SecretKey, now_micros: u64) -> Update {
        let key = super::update::beacon_key(self.me);
        self.write_body(secret, key, None, Some(now_micros / 1000), now_micros)
    }

    fn write_body(
        &mut self,
        secret: &SecretKey,
        key: Key,
        value: Option<ValueRef>,
        beacon: Option<u64>,
        now_micros: u64,
    ) -> Update {
        // A correct node has one branch of its own. Two mean its key signed an update it did not
        // make (a lost disk, or a stolen key); it continues from the newest, and peers refuse
        // the result if its past holds the other (`Refusal::OwnPast`).
        let prev = self.frontier.heads(self.me).iter().max().map(|(_, id)| *id);
        // The past of `prev` with `prev` itself: what receivers start from before the deltas.
        let base = self.past_of(prev, &[]);
        let deps: Vec<Dep> = self
            .frontier
            .flat()
            .into_iter()
            .filter(|(writer, _, id)| {
                *writer != self.me && !base.heads(*writer).iter().any(|(_, head)| head == id)
            })
            .map(|(writer, clock, id)| Dep { writer, clock, id })
            .collect();
        let body = UpdateBody {
            volume: self.config.volume,
            writer: self.me,
            clock: self.clock + 1,
            key,
            value,
            prev,
            deps,
            history: history_hash(&self.frontier.flat()),
            beacon,
        };
        let signed = Signed::sign(secret, body).unwrap_or_else(|e| {
            unreachable!("an update of at most DEPS_MAX dependencies fits its bound: {e}")
        });
        let update = Update::new(signed);
        let outcome = self.offer(update.clone(), now_micros.max(self.clock + 1));
        debug_assert!(
            outcome == Offer::Accepted || self.frontier.heads(self.me).len() > 1,
            "a node accepts its own write: {outcome:?}"
        );
        update
    }

    /// The updates a peer whose frontier is `theirs` lacks, in log order, at most `limit`.
    ///
    /// A head of theirs this log holds covers its whole past. A head it does not hold (the peer is
    /// ahead, or on another branch of a fork) covers this log's updates of that writer up to its
    /// clock when this log knows no fork of the writer; on a fork the peer finds what it misses
    /// by asking for it by hash ([`Log::ancestry`]).
    ///
    /// Each writer's updates are looked at on their own: of a writer without a fork, only those
    /// above the peer's clock for it, so a pull from a peer that is nearly current costs about
    /// what it returns however long the log and however long a writer has been idle; of a forked
    /// writer, those on the way back from each branch's head to what the peer holds.
    pub fn missing_for(&self, theirs: &Summary, limit: usize) -> (Vec<&Update>, bool) {
        let mut heads: BTreeMap<Writer, Vec<(u64, UpdateId)>> = BTreeMap::new();
        for (writer, clock, id) in theirs {
            heads.entry(*writer).or_default().push((*clock, *id));
        }
        let mut streams: Vec<(Writer, Stream<'_>)> = Vec::with_capacity(self.by_writer.len());
        for (writer, ids) in &self.by_writer {
            let theirs = heads.get(writer).map_or(&[][..], Vec::as_slice);
            if self.forked.contains(writer) {
                streams.push((
                    *writer,
                    Box::new(self.uncovered(*writer, theirs).into_iter()),
                ));
            } else {
                // Without a fork a writer's updates here are one chain, clocks growing along it:
                // a head of theirs at clock `c` covers every update of it up to `c` (up to the
                // head itself when this log holds that head and the peer claims more).
                let covered = theirs
                    .iter()
                    .map(|(clock, id)| match self.entries.get(id) {
                        Some(entry) => (*clock).min(entry.update.body().clock),
                        None => *clock,
                    })
                    .max();
                let above = match covered {
                    Some(clock) => std::ops::Bound::Excluded((
                        clock,
                        UpdateId(bulwark_core::Digest([0xff; 32])),
                    )),
                    None => std::ops::Bound::Unbounded,
                };
                streams.push((
                    *writer,
                    Box::new(ids.range((above, std::ops::Bound::Unbounded)).copied()),
                ));
            }
        }
        let mut out = Vec::new();
        for id in LogOrder::new(streams) {
            let Some(update) = self.get(&id) else {
                continue;
            };
            if out.len() == limit {
                return (out, true);
            }
            out.push(update);
        }
        (out, false)
    }

    /// The updates of forked `writer` that none of the peer's `heads` of it covers (a head
    /// this log holds covers itself and the updates before it on its branch, up to the clock
    /// the peer claims for it), in `(clock, id)` order.
    ///
    /// Whatever a head covers, it covers what comes before it too, so on the way from each of
    /// this log's own heads of the writer back to its first update the uncovered updates come
    /// first: each walk stops at the first covered update, or where another walk passed. A
    /// current peer costs a look at each head; one that lacks `k` updates, about `k` steps.
    /// Heads beyond [`PEER_HEADS_MAX`] are not looked at, which can only make the answer longer.
    fn uncovered(&self, writer: Writer, heads: &[(u64, UpdateId)]) -> Vec<(u64, UpdateId)> {
        let held: Vec<(u64, UpdateId)> = heads
            .iter()
            .copied()
            .filter(|(_, id)| self.holds(id))
            .take(PEER_HEADS_MAX)
            .collect();
        let covered = |id: UpdateId, clock: u64| {
            held.iter()
                .any(|(claimed, head)| clock <= *claimed && self.precedes_own(id, *head))
        };
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (_, head) in self.frontier.heads(writer) {
            let mut cursor = Some(*head);
            while let Some(id) = cursor {
                if !seen.insert(id) {
                    break;
                }
                let Some(entry) = self.entries.get(&id) else {
                    break;
                };
                let clock = entry.update.body().clock;
                if covered(id, clock) {
                    break;
                }
                out.push((clock, id));
                cursor = entry.update.body().prev;
            }
        }
        out.sort_unstable();
        out
    }

    /// `wanted` and every update in their past a peer whose frontier is `theirs` is not known to
    /// hold (judged by the heads of theirs this log holds only), in log order, at most `limit`:
    /// how a peer on another branch of a fork gets the branch.
    pub fn ancestry(
        &self,
        wanted: &[UpdateId],
        theirs: &Summary,
        limit: usize,
    ) -> (Vec<&Update>, bool) {
        let mut known = Frontier::default();
        for (writer, clock, id) in theirs {
            if self.holds(id) {
                known.0.entry(*writer).or_default().push((*clock, *id));
            }
        }
        let mut seen = BTreeSet::new();
        let mut stack: Vec<UpdateId> = wanted.iter().copied().filter(|id| self.holds(id)).collect();
        let mut found = BTreeSet::new();
        // Bounded by the log: each id is visited once.
        while let Some(id) = stack.pop() {
            if !seen.insert(id) || self.covers(&known, id) {
                continue;
            }
            let Some(update) = self.get(&id) else {
                continue;
            };
            let body = update.body();
            found.insert((body.clock, body.writer, id));
            stack.extend(body.prev);
            stack.extend(body.deps.iter().map(|dep| dep.id));
        }
        let more = found.len() > limit;
        let out = found
            .into_iter()
            .take(limit)
            .filter_map(|(_, _, id)| self.get(&id))
            .collect();
        (out, more)
    }

    /// Verifies and offers updates received from a peer, in the order given.
    pub fn receive(&mut self, updates: Vec<WireUpdate>, now_micros: u64) -> Received {
        self.receive_at(updates.into_iter().map(|u| (u, None)).collect(), now_micros)
    }

    /// [`Log::receive`] of updates each accepted before at the time given, for a restore: a
    /// version's end is when this node first accepted an update covering it, not when it
    /// restarted (updates without a time take `now_micros`).
    pub fn receive_at(
        &mut self,
        updates: Vec<(WireUpdate, Option<u64>)>,
        now_micros: u64,
    ) -> Received {
        let mut received = Received::default();
        for (wire, accepted) in updates {
            let now_micros = accepted.map_or(now_micros, |at| at.min(now_micros));
            // Held or waiting already: verified once, never again (a peer resending what this
            // node waits on costs it no signature checks).
            if self.holds(&wire.id()) || self.waiting.contains(&wire.id()) {
                continue;
            }
            match wire.verify(&self.config) {
                Err(reason) => {
                    self.refused += 1;
                    received.refused.push(Refusal::Malformed(reason));
                }
                Ok(update) => {
                    let id = update.id();
                    match self.offer(update, now_micros) {
                        Offer::Refused(reason) => received.refused.push(reason),
                        Offer::Accepted => received.accepted.push(id),
                        Offer::Known | Offer::Missing(_) | Offer::Deferred => {}
                    }
                }
            }
        }
        received
    }

    /// Every update accepted since the last call, in the order accepted (dependencies first):
    /// what the owner must make durable.
    pub fn take_fresh(&mut self) -> Vec<(UpdateId, u64)> {
        std::mem::take(&mut self.fresh)
    }
}

/// What a batch of received updates did.
#[derive(Debug, Default)]
pub struct Received {
    /// Offered in the batch and accepted at once (held updates the batch freed are in
    /// [`Log::take_fresh`]).
    pub accepted: Vec<UpdateId>,
    /// Refused, with why: the sender passed on what no correct writer signs.
    pub refused: Vec<Refusal>,
}

/// One writer's updates, `(clock, id)` ascending.
type Stream<'a> = Box<dyn Iterator<Item = (u64, UpdateId)> + 'a>;

/// The merge of writers' streams into log order (clock, then writer, then id).
struct LogOrder<'a> {
    streams: Vec<(Writer, Stream<'a>)>,
    next: std::collections::BinaryHeap<std::cmp::Reverse<(u64, Writer, UpdateId, usize)>>,
}

impl<'a> LogOrder<'a> {
    fn new(mut streams: Vec<(Writer, Stream<'a>)>) -> LogOrder<'a> {
        let mut next = std::collections::BinaryHeap::with_capacity(streams.len());
        for (index, (writer, stream)) in streams.iter_mut().enumerate() {
            if let Some((clock, id)) = stream.next() {
                next.push(std::cmp::Reverse((clock, *writer, id, index)));
            }
        }
        LogOrder { streams, next }
    }
}

impl Iterator for LogOrder<'_> {
    type Item = UpdateId;

    fn next(&mut self) -> Option<UpdateId> {
        let std::cmp::Reverse((_, writer, id, index)) = self.next.pop()?;
        if let Some((clock, next)) = self.streams[index].1.next() {
            self.next
                .push(std::cmp::Reverse((clock, writer, next, index)));
        }
        Some(id)
    }
}
