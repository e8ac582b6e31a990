//! Registers across epochs (Rosebud §4.5, §4.7): a node's replica of one register service for
//! every group the configuration puts it in, that follows the certified configurations from
//! epoch to epoch and takes over the keys it becomes responsible for from their previous group,
//! and the client operation that follows the node into a newer epoch.
//!
//! The node keeps one store per service (a key's latest version), whatever group serves the key,
//! so a key that stays on the node across a reconfiguration stays where it is. What changes with
//! the epoch is which requests it serves: one of the current epoch, for a key whose group in
//! that epoch names this node, and which its transfer has brought in.
//!
//! # Entering an epoch
//!
//! When the driver hands over the certified ring of epoch `e+1` ([`EpochServer::enter`]) the
//! replica refuses every request of epoch `e` from then on, answering with its epoch so that the
//! client catches up (ERR_UPGRADE_CONFIG) and restarts only its current round there
//! ([`Routed`]). It then works out, arc by arc ([`Ring::arcs_since`]), the keys whose group now
//! names it but whose group in `e` was another set of nodes, and pulls each arc from that old
//! group:
//!
//! 1. LIST: every old member lists the keys it holds on the arc, a page at a time. An old member
//!    enters `e+1` before it answers (invariant 4 of the spec's §5.3), so what it lists can no
//!    longer change under an epoch-`e` write. The union of `2f+1` complete listings names every
//!    write completed in `e`: such a write reached `2f+1` old members while they were in `e`,
//!    and any `2f+1` listers share `f+1` of them, one correct.
//! 2. FETCH: each listed key is read from `2f+1` old members (again in `e+1` before they answer),
//!    keeping the highest version whose signature verifies, with no write-back. A key every
//!    valid answer denies (a bogus id of a faulty lister) is dropped.
//!
//! Until an arc's pull is done, the replica serves no request for a key on it: requests wait and
//! are answered when the pull ends (spec §4.7, "critical"), since a quorum of fresh replicas
//! would otherwise report nothing and a writer could pick a version below the existing one.
//!
//! An old member whose own pull of an overlapping arc is unfinished (it skipped part of an
//! epoch) does not answer LIST or FETCH for it yet: it would list an incomplete state.
//!
//! This machine addresses its peers by node: `Slot(id)` in its sends and messages is the node
//! with [`NodeId`] `id`, not a position in a group; the driver delivers accordingly.

use super::{
    Judged, Outbound, Policy, ReadOp, ReadPhase, Refusal, Refusals, Replies, Request, Response,
    ResponseBody, Server, Timestamp, WriteOp, WritePhase,
};
use crate::machine::{Access, Operation, Output, Progress, Replica, ReplicaStats};
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, Ring, RingPoint};
use bulwark_core::{ClientId, Epoch, GroupId, Key, NodeId, ServiceId, Slot, Time};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// Keys in one page of a listing.
pub const LIST_PAGE_KEYS: usize = 64;
/// Keys one old member may list for one arc in one epoch: a faulty member can make a new
/// member fetch at most this many bogus ids per arc (spec §8.14).
pub const LISTED_KEYS_MAX: usize = 100_000;
/// Keys fetched at once per arc (the paper's transfer window).
pub const FETCH_WINDOW: usize = 8;
/// Requests a replica holds while their keys are being transferred; more are refused.
pub const WAITING_MAX: usize = 1_024;
/// How long a pull waits for answers before it asks the old members that have not answered
/// again; doubled after each retry without progress, up to [`PULL_RETRY_MAX_MILLIS`]. Every
/// answer carries whole versions, so asking a slow member again on every tick would hand the
/// same data over many times.
pub const PULL_RETRY_MILLIS: u64 = 250;
/// The longest wait between two retries of a pull.
pub const PULL_RETRY_MAX_MILLIS: u64 = 2_000;
/// How long after its first tick in an epoch a node starts dropping the keys it no longer
/// serves: the new members' pulls are usually in by then, so the first round of asking finds
/// them holding what moved.
pub const DROP_START_MILLIS: u64 = 500;
/// Keys a node asks a group about at once, and the most one [`Transfer::Hold`] or
/// [`Transfer::Held`] may name.
pub const DROP_BATCH_KEYS: usize = 256;
/// Rounds of asking about one batch before the keys not yet confirmed wait for the next sweep.
pub const DROP_ROUNDS: u32 = 2;
/// The longest wait between two sweeps that kept keys. Such a sweep asks only about the keys
/// kept, so it costs little however many keys the node stores.
pub const DROP_RESWEEP_MAX_MILLIS: u64 = 4_000;

/// Deliberate breakage for the simulator's negative controls; none in real nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferMutations {
    /// Serve keys whose transfer has not finished.
    pub serve_before_transfer: bool,
    /// Take a listing and each key's version from `f+1` old members instead of `2f+1`.
    pub small_transfer_quorum: bool,
    /// Answer LIST and FETCH without entering the newer epoch first.
    pub answer_without_entering: bool,
    /// Pull every arc of the groups the node is in, also those whose group did not change.
    pub pull_unchanged_arcs: bool,
    /// Drop a key once `f+1` members of its group say they hold it, instead of `2f+1`.
    pub small_drop_quorum: bool,
    /// Never drop a key that moved away (for the check that moved keys are dropped).
    pub keep_moved_keys: bool,
}

/// What nodes send each other to move keys between epochs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum Transfer<P: Policy> {
    /// A new member of `epoch` asks an old member for the keys it holds on `arc`, after `after`.
    List {
        /// The epoch the asker entered.
        epoch: Epoch,
        /// The keys wanted.
        arc: RingArc,
        /// The last key of the previous page.
        after: Option<Key>,
    },
    /// One page of keys.
    Listed {
        /// As asked.
        epoch: Epoch,
        /// As asked.
        arc: RingArc,
        /// As asked.
        after: Option<Key>,
        /// At most [`LIST_PAGE_KEYS`], in key order, all after `after`.
        keys: Vec<Key>,
        /// Another page follows.
        more: bool,
    },
    /// The latest version of `key`, for a new member of `epoch`.
    Fetch {
        /// The epoch the asker entered.
        epoch: Epoch,
        /// The key.
        key: Key,
    },
    /// The answer; `None` when nothing is stored.
    Fetched {
        /// As asked.
        epoch: Epoch,
        /// As asked.
        key: Key,
        /// The stored version.
        entry: Option<P::Entry>,
    },
    /// A node that no longer serves these keys in `epoch` asks a member of their group there
    /// whether it holds each at the given version or a newer one.
    Hold {
        /// The epoch both are in.
        epoch: Epoch,
        /// At most [`DROP_BATCH_KEYS`] keys, each with the asker's version.
        versions: Vec<(Key, Timestamp)>,
    },
    /// The keys of a [`Transfer::Hold`] the member holds at the version asked or newer, in
    /// `epoch`, each with the version asked: an answer says nothing of a newer version the asker
    /// may hold by the time it arrives.
    Held {
        /// As asked.
        epoch: Epoch,
        /// At most [`DROP_BATCH_KEYS`].
        versions: Vec<(Key, Timestamp)>,
    },
    /// A version a member said it lacks, from a node that no longer serves the key in `epoch`
    /// and would drop it: stored if it verifies and is newer, as a write-back would be.
    Offer {
        /// The epoch both are in.
        epoch: Epoch,
        /// The key.
        key: Key,
        /// The version the sender holds.
        entry: P::Entry,
    },
}

/// A change to a node's durable state, made before anything it caused leaves.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<P: Policy> {
    /// The stored version of `key` is now `entry`.
    Put {
        /// The register.
        key: Key,
        /// The new version.
        entry: P::Entry,
    },
    /// The node entered `epoch`: no request of an earlier one is served again.
    Entered(Epoch),
    /// The node finished taking over `arc` for `epoch`.
    Pulled {
        /// The epoch it entered.
        epoch: Epoch,
        /// The arc.
        arc: RingArc,
    },
    /// The node no longer holds `key`: its group in the current epoch does (spec §4.8).
    Drop {
        /// The register.
        key: Key,
    },
}

/// Where a node is in dropping the keys its current epoch no longer has it serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    /// The epoch has not ticked yet.
    Unscheduled,
    /// The next sweep starts then.
    At(Time),
    /// Going through the keys found at its start.
    Running,
    /// Every key found is dropped: nothing more to do in this epoch unless a pull into an
    /// earlier one brings in more (a node stores no other key outside its groups).
    Done,
}

/// Dropping the versions of keys whose group in the current epoch does not name this node,
/// once `2f+1` members of that group say they hold the same version or a newer one. No state
/// survives a restart or an epoch: the keys to drop are those stored outside the node's groups,
/// found again by the next sweep.
struct Drops {
    sweep: Sweep,
    /// The wait before the sweep after one that kept keys.
    backoff: u64,
    /// Keys of the running sweep not asked about yet, in key order.
    queue: VecDeque<Key>,
    /// The keys being asked about: the version held, and the members that hold it or newer.
    batch: BTreeMap<Key, (Timestamp, BTreeSet<NodeId>)>,
    /// The members that answered about the batch.
    answered: BTreeSet<NodeId>,
    /// The kept keys offered to each member: once per epoch, so that a member that keeps
    /// answering without them costs one copy each.
    offered: BTreeSet<(Key, NodeId)>,
    /// Kept keys, with the members that confirmed them: asked about again, the key counts
    /// those members still, as long as the version held is the same.
    confirmed: BTreeMap<Key, (Timestamp, BTreeSet<NodeId>)>,
    /// When the batch is asked about again, and how many times it has been.
    retry_at: Time,
    rounds: u32,
    /// A key of the running sweep was kept.
    kept: bool,
    /// The next sweep looks through every stored key: the epoch's first, and the first after a
    /// pull into an earlier epoch ended (it may have stored keys outside the node's groups).
    /// Other sweeps ask again about the keys kept.
    rescan: bool,
}

impl Drops {
    fn new() -> Self {
        Drops {
            sweep: Sweep::Unscheduled,
            backoff: DROP_START_MILLIS,
            queue: VecDeque::new(),
            batch: BTreeMap::new(),
            answered: BTreeSet::new(),
            offered: BTreeSet::new(),
            confirmed: BTreeMap::new(),
            retry_at: Time(0),
            rounds: 0,
            kept: false,
            rescan: true,
        }
    }
}

/// One arc a node is taking over from its old group.
struct Pull<P: Policy> {
    epoch: Epoch,
    arc: RingArc,
    old: GroupView,
    /// Per old member: the keys listed so far, the last one, and whether the listing is complete.
    listings: Vec<Listing>,
    /// Once `2f+1` listings are complete: the keys still to fetch.
    queue: Option<VecDeque<Key>>,
    /// Keys being fetched, with the answers of each old member.
    fetching: BTreeMap<Key, Replies<Option<P::Entry>>>,
    /// When to ask again the old members that have not answered; set on the first tick after
    /// the requests went out, and again after each retry or progress.
    retry_at: Option<Time>,
    /// The wait before the next retry.
    backoff: u64,
}

#[derive(Default)]
struct Listing {
    keys: BTreeSet<Key>,
    after: Option<Key>,
    complete: bool,
    /// Sent more than it may, or keys off the arc: no longer heard.
    faulty: bool,
}

impl<P: Policy> Pull<P> {
    fn new(epoch: Epoch, arc: RingArc, old: GroupView) -> Self {
        let listings = (0..old.len()).map(|_| Listing::default()).collect();
        Pull {
            epoch,
            arc,
            old,
            listings,
            queue: None,
            fetching: BTreeMap::new(),
            retry_at: None,
            backoff: PULL_RETRY_MILLIS,
        }
    }

    /// An answer moved the pull on: the next retry waits the base interval from the next tick.
    fn progressed(&mut self) {
        self.retry_at = None;
        self.backoff = PULL_RETRY_MILLIS;
    }

    /// What to ask again at `now`: nothing until the retry is due.
    fn retry(&mut self, now: Time) -> Vec<(Slot, Transfer<P>)> {
        match self.retry_at {
            Some(at) if now >= at => {
                self.backoff = (self.backoff * 2).min(PULL_RETRY_MAX_MILLIS);
                self.retry_at = Some(Time(now.0 + self.backoff));
                self.requests()
            }
            Some(_) => Vec::new(),
            None => {
                self.retry_at = Some(Time(now.0 + self.backoff));
                Vec::new()
            }
        }
    }

    fn done(&self) -> bool {
        self.queue.as_ref().is_some_and(VecDeque::is_empty) && self.fetching.is_empty()
    }

    /// Every request this pull still waits on, to every old member that has not answered it.
    fn requests(&self) -> Vec<(Slot, Transfer<P>)> {
        let to = |slot: usize| Slot(self.old.members()[slot].0);
        let Some(_) = &self.queue else {
            return self
                .listings
                .iter()
                .enumerate()
                .filter(|(_, listing)| !listing.complete && !listing.faulty)
                .map(|(slot, listing)| {
                    let list = Transfer::List {
                        epoch: self.epoch,
                        arc: self.arc,
                        after: listing.after.clone(),
                    };
                    (to(slot), list)
                })
                .collect();
        };
        let mut sends = Vec::new();
        for (key, replies) in &self.fetching {
            for slot in replies.missing() {
                let fetch = Transfer::Fetch {
                    epoch: self.epoch,
                    key: key.clone(),
                };
                sends.push((to(slot.index()), fetch));
            }
        }
        sends
    }
}

/// An answer to a request held earlier: to its client, with its operation id.
type Answer<P> = (ClientId, u64, Response<P>);

/// A node's replica of one register service across epochs.
pub struct EpochServer<P: Policy> {
    me: NodeId,
    f: usize,
    /// The rings entered, from the genesis on.
    rings: Chain,
    server: Server<P>,
    pulls: Vec<Pull<P>>,
    waiting: VecDeque<(ClientId, Access, Request<P>)>,
    mutations: TransferMutations,
    /// Keys taken over from old groups since start, and the bytes of their values.
    pulled_keys: u64,
    pulled_bytes: u64,
    /// Requests held for a transfer since start.
    gated: u64,
    drops: Drops,
    /// Keys dropped since start.
    dropped: u64,
}

impl<P: Policy> EpochServer<P> {
    /// Node `me` at the genesis `ring` (nothing stored), checking versions with `context`.
    pub fn new(me: NodeId, ring: Arc<Ring>, context: P::Context) -> Self {
        let genesis = ring.epoch();
        let f = ring.params().f;
        EpochServer {
            me,
            f,
            server: Server::with_context(Slot(me.0), genesis, GroupId(0), context),
            rings: Chain::new(vec![ring]),
            pulls: Vec::new(),
            waiting: VecDeque::new(),
            mutations: TransferMutations::default(),
            pulled_keys: 0,
            pulled_bytes: 0,
            gated: 0,
            drops: Drops::new(),
            dropped: 0,
        }
    }

    /// The same node, deliberately broken.
    pub fn with_mutations(mut self, mutations: TransferMutations) -> Self {
        self.mutations = mutations;
        self
    }

    /// Rebuilds a node from what it made durable: its versions (the higher of two for one key),
    /// the epochs it entered (each ring from `chain`) and the arcs whose pull finished.
    /// Unfinished pulls start again. A version no correct node could have stored (damage on
    /// disk) is refused, named by its key: dropping it could lose an acknowledged write.
    pub fn restore(
        me: NodeId,
        chain: &Chain,
        context: P::Context,
        entries: impl IntoIterator<Item = (Key, P::Entry)>,
        entered: Epoch,
        pulled: &BTreeSet<(Epoch, RingArc)>,
    ) -> Result<Self, Key> {
        let mut node = EpochServer::new(me, chain.genesis().clone(), context);
        for (key, entry) in entries {
            if !node.server.restore(key.clone(), entry) {
                return Err(key);
            }
        }
        for epoch in chain.genesis().epoch().0 + 1..=entered.0 {
            let Some(ring) = chain.ring(Epoch(epoch)) else {
                break;
            };
            node.step_into(ring.clone());
            node.pulls
                .retain(|pull| !pulled.contains(&(pull.epoch, pull.arc)));
        }
        Ok(node)
    }

    /// The epoch the node is in.
    pub fn epoch(&self) -> Epoch {
        self.server.epoch
    }

    /// Whether every arc the node took over is in.
    pub fn settled(&self) -> bool {
        self.pulls.is_empty()
    }

    /// Keys taken over since start, and their value bytes.
    pub fn pulled(&self) -> (u64, u64) {
        (self.pulled_keys, self.pulled_bytes)
    }

    /// The stored version of `key`.
    pub fn stored(&self, key: &Key) -> Option<&P::Entry> {
        self.server.stored(key)
    }

    /// The keys stored whose group in the current epoch does not name this node, with their
    /// versions: what it has yet to drop.
    pub fn moved_keys(&self) -> Vec<(Key, Timestamp)> {
        self.server
            .stored
            .iter()
            .filter(|(key, _)| self.moved_away(key).is_some())
            .map(|(key, entry)| (key.clone(), P::ts(entry)))
            .collect()
    }

    /// The certified ring of the next epoch: the node enters it (refusing the previous epoch's
    /// requests from now on) and starts pulling what it takes over. A ring of another epoch than
    /// the next is ignored: the driver hands them over in order.
    pub fn enter(&mut self, ring: Arc<Ring>) -> Output<Self> {
        if ring.epoch().0 != self.epoch().0 + 1 {
            return Output::none();
        }
        let epoch = ring.epoch();
        self.step_into(ring);
        let mut sends = Vec::new();
        for pull in self.pulls.iter().filter(|pull| pull.epoch == epoch) {
            sends.extend(pull.requests());
        }
        let mut output = Output {
            changes: vec![Change::Entered(epoch)],
            sends,
            ..Output::none()
        };
        // Requests held for an earlier epoch's pulls are refused now: their epoch is over.
        let (changes, notify) = self.release();
        output.changes.extend(changes);
        output.notify = notify;
        output
    }

    /// Enters the next epoch with `ring`: the arcs this node now serves that another set of
    /// nodes served become pulls.
    fn step_into(&mut self, ring: Arc<Ring>) {
        let before = self.rings.newest().clone();
        for moved in ring.arcs_since(&before) {
            if moved.new.contains(self.me)
                && (moved.changed() || self.mutations.pull_unchanged_arcs)
            {
                self.pulls
                    .push(Pull::new(ring.epoch(), moved.arc, moved.old.clone()));
            }
        }
        self.server.epoch = ring.epoch();
        self.rings.push(ring);
        // What members said they held was said in the epoch before.
        self.drops = Drops::new();
    }

    /// Whether this node's state as of the epoch before `epoch` is still incomplete where
    /// `overlaps` says: a pull into an earlier epoch than `epoch` is unfinished there. Pulls into
    /// `epoch` itself do not count: they build the state that follows, and old members that are
    /// also new ones answer each other.
    fn incomplete_before(&self, epoch: Epoch, overlaps: impl Fn(&RingArc) -> bool) -> bool {
        self.pulls
            .iter()
            .any(|pull| pull.epoch < epoch && overlaps(&pull.arc))
    }

    /// The `2f+1` old members a pull hears, or new members a drop waits for; `f+1` when the
    /// negative control `small` breaks the rule.
    fn quorum(&self, small: bool) -> usize {
        if small { self.f + 1 } else { 2 * self.f + 1 }
    }

    /// The group of `key` in the current epoch, when it does not name this node.
    fn moved_away(&self, key: &Key) -> Option<GroupView> {
        let group = self.rings.newest().group_of(key.as_bytes());
        (!group.contains(self.me)).then_some(group)
    }

    /// Moves the dropping of moved keys on at `now`: asks again about the batch in flight, gives
    /// up on it, starts a sweep, or starts the next batch.
    fn drop_tick(&mut self, now: Time) -> Vec<(Slot, Transfer<P>)> {
        let drops = &mut self.drops;
        if !drops.batch.is_empty() {
            if now < drops.retry_at {
                return Vec::new();
            }
            if drops.rounds < DROP_ROUNDS {
                drops.rounds += 1;
                let wait = (PULL_RETRY_MILLIS << drops.rounds).min(PULL_RETRY_MAX_MILLIS);
                drops.retry_at = Time(now.0 + wait);
                return self.hold_requests();
            }
            // Members that lack these versions, or do not answer: the keys wait for the next
            // sweep. Those that answered without them are offered them: a version only some
            // members hold (a write its writer did not finish) would otherwise keep the key
            // here until the next write.
            drops.kept = true;
            let kept = std::mem::take(&mut drops.batch);
            let offers = self.offers(&kept);
            let drops = &mut self.drops;
            for (to, offer) in &offers {
                if let Transfer::Offer { key, .. } = offer {
                    drops.offered.insert((key.clone(), NodeId(to.0)));
                }
            }
            if !offers.is_empty() {
                drops.backoff = DROP_START_MILLIS;
            }
            drops.confirmed.extend(kept);
            // The sweep goes on (or ends) at the next tick.
            return offers;
        }
        if drops.rescan && drops.sweep == Sweep::Done {
            drops.sweep = Sweep::At(Time(now.0 + DROP_START_MILLIS));
        }
        match drops.sweep {
            Sweep::Unscheduled => {
                drops.sweep = Sweep::At(Time(now.0 + DROP_START_MILLIS));
                return Vec::new();
            }
            Sweep::At(at) if now >= at => {
                let mut found: Vec<Key> = if drops.rescan {
                    let moved = self.moved_keys();
                    moved.into_iter().map(|(key, _)| key).collect()
                } else {
                    drops.confirmed.keys().cloned().collect()
                };
                found.sort_unstable();
                let drops = &mut self.drops;
                drops.queue = found.into();
                drops.kept = false;
                drops.rescan = false;
                drops.sweep = Sweep::Running;
            }
            Sweep::At(_) | Sweep::Done => return Vec::new(),
            Sweep::Running => {}
        }
        self.next_batch(now)
    }

    /// Starts asking about the next keys of the running sweep, or ends it.
    fn next_batch(&mut self, now: Time) -> Vec<(Slot, Transfer<P>)> {
        debug_assert!(self.drops.batch.is_empty() && self.drops.sweep == Sweep::Running);
        while self.drops.batch.len() < DROP_BATCH_KEYS {
            let Some(key) = self.drops.queue.pop_front() else {
                break;
            };
            if let Some(entry) = self.server.stored(&key) {
                let ts = P::ts(entry);
                let holders = match self.drops.confirmed.remove(&key) {
                    Some((confirmed, holders)) if confirmed == ts => holders,
                    _ => BTreeSet::new(),
                };
                self.drops.batch.insert(key, (ts, holders));
            }
        }
        let drops = &mut self.drops;
        if drops.batch.is_empty() {
            drops.sweep = if drops.kept {
                let at = Time(now.0 + drops.backoff);
                drops.backoff = (drops.backoff * 2).min(DROP_RESWEEP_MAX_MILLIS);
                Sweep::At(at)
            } else if drops.rescan {
                Sweep::At(Time(now.0 + DROP_START_MILLIS))
            } else {
                Sweep::Done
            };
            // A pull into an earlier epoch still running may store more; it rescans when done.
            debug_assert!(
                drops.sweep != Sweep::Done
                    || self.pulls.iter().any(|pull| pull.epoch < self.epoch())
                    || self.moved_keys().is_empty(),
                "a sweep ended with keys outside the node's groups left"
            );
            return Vec::new();
        }
        drops.rounds = 0;
        drops.answered.clear();
        drops.retry_at = Time(now.0 + PULL_RETRY_MILLIS);
        self.hold_requests()
    }

    /// The versions of `kept` for the members that answered about them without holding them.
    fn offers(
        &self,
        kept: &BTreeMap<Key, (Timestamp, BTreeSet<NodeId>)>,
    ) -> Vec<(Slot, Transfer<P>)> {
        let mut sends = Vec::new();
        for (key, (_, holders)) in kept {
            let Some(entry) = self.server.stored(key) else {
                continue;
            };
            let group = self.rings.newest().group_of(key.as_bytes());
            for member in group.members() {
                let offered = self.drops.offered.contains(&(key.clone(), *member));
                if self.drops.answered.contains(member) && !holders.contains(member) && !offered {
                    let offer = Transfer::Offer {
                        epoch: self.epoch(),
                        key: key.clone(),
                        entry: entry.clone(),
                    };
                    sends.push((Slot(member.0), offer));
                }
            }
        }
        sends
    }

    /// One [`Transfer::Hold`] per member of the batch's groups, naming the keys it has not
    /// confirmed.
    fn hold_requests(&self) -> Vec<(Slot, Transfer<P>)> {
        let mut per_member: BTreeMap<NodeId, Vec<(Key, Timestamp)>> = BTreeMap::new();
        for (key, (ts, holders)) in &self.drops.batch {
            let group = self.rings.newest().group_of(key.as_bytes());
            for member in group.members() {
                if !holders.contains(member) {
                    per_member
                        .entry(*member)
                        .or_default()
                        .push((key.clone(), *ts));
                }
            }
        }
        let epoch = self.epoch();
        per_member
            .into_iter()
            .map(|(member, versions)| (Slot(member.0), Transfer::Hold { epoch, versions }))
            .collect()
    }

    /// Member `from` of the current epoch holds each key of `versions` at that version or
    /// newer: drops each key `2f+1` members of its group hold at the version this node holds.
    fn on_held(
        &mut self,
        now: Time,
        from: NodeId,
        versions: Vec<(Key, Timestamp)>,
    ) -> Output<Self> {
        let quorum = self.quorum(self.mutations.small_drop_quorum);
        let mut changes = Vec::new();
        self.drops.answered.insert(from);
        for (key, confirmed) in versions {
            let Some(group) = self.moved_away(&key) else {
                continue;
            };
            let Some((ts, holders)) = self.drops.batch.get_mut(&key) else {
                continue;
            };
            // An answer to an earlier question (a retry, a previous batch, or this node before
            // a restart) about an older version says nothing about the one held now.
            if !group.contains(from) || confirmed < *ts {
                continue;
            }
            holders.insert(from);
            if holders.len() < quorum || self.mutations.keep_moved_keys {
                continue;
            }
            let ts = *ts;
            self.drops.batch.remove(&key);
            // A pull into an earlier epoch may have stored a newer version since it was asked
            // about: that one waits for the next sweep.
            let held = self.server.stored.get(&key).map(|entry| P::ts(entry));
            if held == Some(ts) {
                self.server.stored.remove(&key);
                self.dropped += 1;
                changes.push(Change::Drop { key });
            } else if let Some(held) = held {
                self.drops.kept = true;
                self.drops.confirmed.insert(key, (held, BTreeSet::new()));
            }
        }
        let sends = if self.drops.batch.is_empty() && self.drops.sweep == Sweep::Running {
            self.next_batch(now)
        } else {
            Vec::new()
        };
        Output {
            changes,
            sends,
            ..Output::none()
        }
    }

    /// Serves one request now, or holds it while its key is transferred.
    fn handle(
        &mut self,
        client: ClientId,
        access: Access,
        request: Request<P>,
    ) -> (Vec<Change<P>>, Option<Response<P>>) {
        let epoch = self.epoch();
        let refuse = |refusal: Refusal| {
            let reply = Response {
                op: request.op,
                epoch,
                body: ResponseBody::Refused(refusal),
            };
            (Vec::new(), Some(reply))
        };
        if request.epoch != epoch {
            return refuse(Refusal::WrongEpoch { current: epoch });
        }
        let point = RingPoint::of_key(request.key.as_bytes());
        let group = self.rings.newest().group_at(point);
        if group.id() != request.group || !group.contains(self.me) {
            return refuse(Refusal::WrongGroup);
        }
        if !self.mutations.serve_before_transfer
            && self.incomplete_before(Epoch(epoch.0 + 1), |arc| arc.contains(point))
        {
            if self.waiting.len() >= WAITING_MAX {
                return refuse(Refusal::Transferring);
            }
            self.waiting.push_back((client, access, request));
            self.gated += 1;
            return (Vec::new(), None);
        }
        self.server.group = request.group;
        let handled = self
            .server
            .serve(client, access.write, access.read, request);
        let changes = handled
            .changes
            .into_iter()
            .map(|super::Change::Put { key, entry }| Change::Put { key, entry })
            .collect();
        (changes, Some(handled.reply))
    }

    /// Answers every held request that no longer waits on a pull: the changes they made, and
    /// the answers, which leave once those changes are durable.
    fn release(&mut self) -> (Vec<Change<P>>, Vec<Answer<P>>) {
        let mut changes = Vec::new();
        let mut notify = Vec::new();
        let held = std::mem::take(&mut self.waiting);
        for (client, access, request) in held {
            let op = request.op.0;
            let (made, reply) = self.handle(client, access, request);
            changes.extend(made);
            if let Some(reply) = reply {
                notify.push((client, op, reply));
            }
        }
        (changes, notify)
    }

    /// Sends the next page request, or the fetches, after a listing changed.
    fn after_listing(&mut self, at: usize) -> Output<Self> {
        let quorum = self.quorum(self.mutations.small_transfer_quorum);
        let pull = &mut self.pulls[at];
        let complete = pull.listings.iter().filter(|l| l.complete).count();
        if pull.queue.is_some() || complete < quorum {
            return Output::none();
        }
        // The union of the complete listings: every write completed in the old epoch is in it.
        let mut keys = BTreeSet::new();
        for listing in pull.listings.iter().filter(|l| l.complete) {
            keys.extend(listing.keys.iter().cloned());
        }
        pull.queue = Some(keys.into_iter().collect());
        self.fill(at)
    }

    /// Starts fetches up to the window, or finishes the pull when nothing is left.
    fn fill(&mut self, at: usize) -> Output<Self> {
        let pull = &mut self.pulls[at];
        let mut sends = Vec::new();
        while pull.fetching.len() < FETCH_WINDOW {
            let Some(key) = pull.queue.as_mut().and_then(VecDeque::pop_front) else {
                break;
            };
            for node in pull.old.members() {
                let fetch = Transfer::Fetch {
                    epoch: pull.epoch,
                    key: key.clone(),
                };
                sends.push((Slot(node.0), fetch));
            }
            pull.fetching.insert(key, Replies::new(pull.old.len()));
        }
        if !pull.done() {
            return Output {
                sends,
                ..Output::none()
            };
        }
        let pull = self.pulls.remove(at);
        if pull.epoch < self.epoch() {
            self.drops.rescan = true;
        }
        let mut changes = vec![Change::Pulled {
            epoch: pull.epoch,
            arc: pull.arc,
        }];
        let (released, notify) = self.release();
        changes.extend(released);
        Output {
            changes,
            notify,
            sends,
            ..Output::none()
        }
    }

    /// An old member's answer to LIST: the keys it holds on `arc` after `after`, one page.
    fn list(&self, arc: &RingArc, after: Option<&Key>) -> (Vec<Key>, bool) {
        let mut keys: Vec<&Key> = self
            .server
            .stored
            .keys()
            .filter(|key| after.is_none_or(|after| *key > after))
            .filter(|key| arc.contains(RingPoint::of_key(key.as_bytes())))
            .collect();
        keys.sort_unstable();
        let more = keys.len() > LIST_PAGE_KEYS;
        keys.truncate(LIST_PAGE_KEYS);
        (keys.into_iter().cloned().collect(), more)
    }

    /// Whether this node answers a transfer request of `epoch`: only once it is in that epoch,
    /// so nothing it reports can change under a write of the epoch before.
    fn answers(&self, epoch: Epoch) -> bool {
        epoch <= self.epoch() || self.mutations.answer_without_entering
    }

    fn on_transfer(&mut self, now: Time, from: NodeId, message: Transfer<P>) -> Output<Self> {
        match message {
            Transfer::Hold { epoch, versions } => {
                // Only a statement made in the asker's epoch counts: in it, this node keeps every
                // key of its groups.
                if epoch != self.epoch() {
                    return Output::none();
                }
                if versions.len() > DROP_BATCH_KEYS {
                    return Output::refused(format!("node {} asked about too many keys", from.0));
                }
                let versions = versions
                    .into_iter()
                    .filter(|(key, ts)| {
                        self.moved_away(key).is_none()
                            && self
                                .server
                                .stored(key)
                                .is_some_and(|entry| P::ts(entry) >= *ts)
                    })
                    .collect();
                let held = Transfer::Held { epoch, versions };
                Output {
                    sends: vec![(Slot(from.0), held)],
                    ..Output::none()
                }
            }
            Transfer::Held { epoch, versions } => {
                if epoch != self.epoch() {
                    return Output::none();
                }
                if versions.len() > DROP_BATCH_KEYS {
                    return Output::refused(format!("node {} confirmed too many keys", from.0));
                }
                self.on_held(now, from, versions)
            }
            Transfer::Offer { epoch, key, entry } => {
                if epoch != self.epoch() {
                    return Output::none();
                }
                let refused = |why: &str| Output::refused(format!("node {} offered {why}", from.0));
                let group = self.rings.newest().group_of(key.as_bytes());
                if !group.contains(self.me) {
                    return refused("a key outside this node's groups");
                }
                match P::judge(&self.server.context, group.id(), &key, &entry) {
                    Judged::Valid => {}
                    Judged::Ignored | Judged::Forged => return refused("a version that fails"),
                }
                if !self.server.adopt(key.clone(), entry.clone()) {
                    return Output::none();
                }
                Output {
                    changes: vec![Change::Put { key, entry }],
                    ..Output::none()
                }
            }
            Transfer::List { epoch, arc, after } => {
                // Two arcs overlap exactly when one contains the other's end.
                let overlaps =
                    |pulled: &RingArc| pulled.contains(arc.upto) || arc.contains(pulled.upto);
                if !self.answers(epoch) || self.incomplete_before(epoch, overlaps) {
                    return Output::none();
                }
                let (keys, more) = self.list(&arc, after.as_ref());
                let listed = Transfer::Listed {
                    epoch,
                    arc,
                    after,
                    keys,
                    more,
                };
                Output {
                    sends: vec![(Slot(from.0), listed)],
                    ..Output::none()
                }
            }
            Transfer::Listed {
                epoch,
                arc,
                after,
                keys,
                more,
            } => {
                let Some(at) = self
                    .pulls
                    .iter()
                    .position(|p| p.epoch == epoch && p.arc == arc && p.queue.is_none())
                else {
                    return Output::none();
                };
                let pull = &mut self.pulls[at];
                let Some(slot) = pull.old.slot_of(from) else {
                    return Output::none();
                };
                let listing = &mut pull.listings[slot.index()];
                if listing.complete || listing.faulty || listing.after != after {
                    // A duplicate, or a page asked for before.
                    return Output::none();
                }
                let ordered = keys.windows(2).all(|pair| pair[0] < pair[1])
                    && keys
                        .first()
                        .is_none_or(|first| after.as_ref().is_none_or(|after| first > after));
                let on_arc = keys
                    .iter()
                    .all(|key| arc.contains(RingPoint::of_key(key.as_bytes())));
                if keys.len() > LIST_PAGE_KEYS
                    || !ordered
                    || !on_arc
                    || listing.keys.len() + keys.len() > LISTED_KEYS_MAX
                    || (more && keys.is_empty())
                {
                    // No correct member sends this: its listing no longer counts.
                    listing.faulty = true;
                    return Output::refused(format!("node {} sent a malformed listing", from.0));
                }
                if let Some(last) = keys.last() {
                    listing.after = Some(last.clone());
                }
                listing.keys.extend(keys);
                listing.complete = !more;
                let after = listing.after.clone();
                pull.progressed();
                if more {
                    let next = Transfer::List { epoch, arc, after };
                    return Output {
                        sends: vec![(Slot(from.0), next)],
                        ..Output::none()
                    };
                }
                self.after_listing(at)
            }
            Transfer::Fetch { epoch, key } => {
                let point = RingPoint::of_key(key.as_bytes());
                if !self.answers(epoch) || self.incomplete_before(epoch, |arc| arc.contains(point))
                {
                    return Output::none();
                }
                let entry = self.server.stored(&key).cloned();
                let fetched = Transfer::Fetched { epoch, key, entry };
                Output {
                    sends: vec![(Slot(from.0), fetched)],
                    ..Output::none()
                }
            }
            Transfer::Fetched { epoch, key, entry } => {
                let Some(at) = self
                    .pulls
                    .iter()
                    .position(|p| p.epoch == epoch && p.fetching.contains_key(&key))
                else {
                    return Output::none();
                };
                let quorum = self.quorum(self.mutations.small_transfer_quorum);
                let pull = &mut self.pulls[at];
                let Some(slot) = pull.old.slot_of(from) else {
                    return Output::none();
                };
                let judged = entry.as_ref().map_or(Judged::Valid, |entry| {
                    P::judge(&self.server.context, pull.old.id(), &key, entry)
                });
                let entry = match judged {
                    Judged::Ignored => return Output::none(),
                    Judged::Forged => None,
                    Judged::Valid => entry,
                };
                let Some(replies) = pull.fetching.get_mut(&key) else {
                    return Output::none();
                };
                if !replies.record(slot, entry) || replies.count() < quorum {
                    return Output::none();
                }
                // The highest validly signed version; none when every answer denies the key.
                let highest: Option<P::Entry> = replies
                    .present()
                    .filter_map(|(_, entry)| entry.clone())
                    .max_by_key(|entry| P::ts(entry));
                pull.fetching.remove(&key);
                pull.progressed();
                let mut changes = Vec::new();
                if let Some(entry) = highest {
                    self.pulled_keys += 1;
                    self.pulled_bytes += P::value(&entry).map_or(0, |v| v.len() as u64);
                    if self.server.adopt(key.clone(), entry.clone()) {
                        changes.push(Change::Put { key, entry });
                    }
                }
                let mut output = self.fill(at);
                changes.append(&mut output.changes);
                output.changes = changes;
                output
            }
        }
    }
}

impl<P: Policy> Replica for EpochServer<P> {
    const SERVICE: ServiceId = P::SERVICE;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Message = Transfer<P>;
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
        let (changes, reply) = self.handle(client, access, request);
        // A client in another epoch is behind (or ahead), not misbehaving: its answer names
        // this node's epoch and it catches up. Only other refusals count against it.
        let refused = reply
            .as_ref()
            .and_then(Response::refusal)
            .filter(|refusal| !matches!(refusal, Refusal::WrongEpoch { .. }))
            .map(ToString::to_string);
        Output {
            changes,
            reply,
            refused,
            ..Output::none()
        }
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Transfer<P>,
        _view: &(),
    ) -> Output<Self> {
        self.on_transfer(now, NodeId(from.0), message)
    }

    fn on_epoch(&mut self, _now: Time, ring: Arc<Ring>) -> Output<Self> {
        self.enter(ring)
    }

    /// Asks again for whatever the pulls still wait on, once a retry is due (lost requests and
    /// slow old members), and moves the dropping of moved keys on.
    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let mut sends: Vec<_> = self
            .pulls
            .iter_mut()
            .flat_map(|pull| pull.retry(now))
            .collect();
        sends.extend(self.drop_tick(now));
        Output {
            sends,
            ..Output::none()
        }
    }

    fn stats(&self) -> ReplicaStats {
        ReplicaStats {
            epoch: self.epoch().0,
            transfers_pending: self.pulls.len() as u64,
            transferred_keys: self.pulled_keys,
            transferred_bytes: self.pulled_bytes,
            gated: self.gated,
            collected: self.dropped,
            ..Replica::stats(&self.server)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// A register operation that can move to another epoch mid-way.
pub trait Rebase<P: Policy>: Operation<Request = Request<P>, Reply = Response<P>> {
    /// The client moved to `epoch`, where the key belongs to `group`: the current round starts
    /// again there from no replies, so no round counts replies of two epochs (Rosebud §7.1.1).
    /// What earlier rounds decided (a write's timestamp, a read's version to write back) stands.
    fn rebase(&mut self, epoch: Epoch, group: GroupId) -> Vec<Outbound<P>>;
    /// The epoch the operation runs in.
    fn epoch(&self) -> Epoch;
}

impl<P: Policy> Rebase<P> for WriteOp<P> {
    fn rebase(&mut self, epoch: Epoch, group: GroupId) -> Vec<Outbound<P>> {
        self.config.epoch = epoch;
        self.config.group = group;
        let n = self.config.n;
        match &mut self.phase {
            WritePhase::Clock(replies) => *replies = Replies::new(n),
            WritePhase::Store(replies, _) => *replies = Replies::new(n),
            WritePhase::Done => {}
        }
        self.refusals = Refusals::new(n);
        self.retransmit()
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}

impl<P: Policy> Rebase<P> for ReadOp<P> {
    fn rebase(&mut self, epoch: Epoch, group: GroupId) -> Vec<Outbound<P>> {
        self.config.epoch = epoch;
        self.config.group = group;
        let n = self.config.n;
        match &mut self.phase {
            ReadPhase::Get(replies) => *replies = Replies::new(n),
            ReadPhase::WriteBack(replies, _) => *replies = Replies::new(n),
            ReadPhase::Done => {}
        }
        self.refusals = Refusals::new(n);
        self.retransmit()
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}

/// A register operation routed to its key's group of the client's epoch, that follows a
/// replica's word into a newer certified epoch (ERR_UPGRADE_CONFIG) by restarting only its
/// current round there. Its slots are nodes (`Slot(id)`), like [`EpochServer`]'s.
pub struct Routed<P: Policy, O: Rebase<P>> {
    inner: O,
    key: Key,
    chain: Arc<Chain>,
    epoch: Epoch,
    view: GroupView,
    /// The newest epoch a replica named that `chain` does not reach yet.
    needs: Option<Epoch>,
    _policy: std::marker::PhantomData<P>,
}

impl<P: Policy, O: Rebase<P>> Routed<P, O> {
    /// `inner` on `key`, starting in `epoch` of `chain`.
    pub fn new(inner: O, key: Key, chain: Arc<Chain>, epoch: Epoch) -> Self {
        let epoch = epoch.min(chain.latest());
        let Some(ring) = chain.ring(epoch) else {
            unreachable!("an epoch up to the latest is in the chain")
        };
        let view = ring.group_of(key.as_bytes());
        Routed {
            inner,
            key,
            chain,
            epoch,
            view,
            needs: None,
            _policy: std::marker::PhantomData,
        }
    }

    /// The epoch the operation runs in now.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The key's group in that epoch: what the inner operation's slots are positions in.
    pub fn view(&self) -> &GroupView {
        &self.view
    }

    fn to_nodes(&self, sends: Vec<Outbound<P>>) -> Vec<Outbound<P>> {
        sends
            .into_iter()
            .filter_map(|(slot, request)| Some((Slot(self.view.node(slot)?.0), request)))
            .collect()
    }

    /// Moves the current round to `epoch`, which `chain` reaches.
    fn move_to(&mut self, epoch: Epoch) -> Vec<Outbound<P>> {
        let Some(ring) = self.chain.ring(epoch) else {
            return Vec::new();
        };
        self.epoch = epoch;
        self.view = ring.group_of(self.key.as_bytes());
        let sends = self.inner.rebase(epoch, self.view.id());
        self.to_nodes(sends)
    }

    fn to_slots(&self, slots: Vec<Slot>) -> Vec<Slot> {
        slots
            .into_iter()
            .filter_map(|slot| Some(Slot(self.view.node(slot)?.0)))
            .collect()
    }
}

impl<P: Policy, O: Rebase<P>> Operation for Routed<P, O> {
    const SERVICE: ServiceId = P::SERVICE;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Output = O::Output;

    fn op(&self) -> u64 {
        self.inner.op()
    }

    fn start(&mut self) -> Vec<Outbound<P>> {
        let sends = self.inner.rebase(self.epoch, self.view.id());
        self.to_nodes(sends)
    }

    fn on_reply(&mut self, from: Slot, reply: Response<P>) -> Progress<Self> {
        match reply.body {
            ResponseBody::Refused(Refusal::WrongEpoch { current }) if current > self.epoch => {
                // Only certified epochs are in the chain: a replica can move the client to a
                // newer one, never to one that does not exist. One the chain does not reach
                // yet is asked of the driver (ERR_NEED_CONFIG), which fetches and verifies it.
                if self.chain.ring(current).is_none() {
                    self.needs = self.needs.max(Some(current));
                    return Progress::Send(Vec::new());
                }
                Progress::Send(self.move_to(current))
            }
            // Not an answer: the replica will serve the key once its transfer is in, and the
            // retransmission asks again.
            ResponseBody::Refused(Refusal::Transferring | Refusal::WrongEpoch { .. }) => {
                Progress::Send(Vec::new())
            }
            _ => {
                let Some(slot) = self.view.slot_of(NodeId(from.0)) else {
                    return Progress::Send(Vec::new());
                };
                match self.inner.on_reply(slot, reply) {
                    Progress::Send(sends) => Progress::Send(self.to_nodes(sends)),
                    Progress::Done(result) => Progress::Done(result),
                }
            }
        }
    }

    fn on_timeout(&mut self) -> Vec<Outbound<P>> {
        let sends = self.inner.on_timeout();
        self.to_nodes(sends)
    }

    fn answered(&self) -> Vec<Slot> {
        self.to_slots(self.inner.answered())
    }

    fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    fn stalled(&self) -> Option<String> {
        self.inner.stalled()
    }

    fn route(&self) -> Option<(Epoch, GroupId)> {
        Some((self.epoch, self.view.id()))
    }

    fn needs(&self) -> Option<Epoch> {
        self.needs
    }

    fn learn(&mut self, chain: Arc<Chain>) -> Vec<Outbound<P>> {
        let Some(wanted) = self.needs.take() else {
            return Vec::new();
        };
        if chain.latest() <= self.chain.latest() {
            return Vec::new();
        }
        self.chain = chain;
        // A replica may have named an epoch no one can prove (a faulty one lying): the round
        // moves only as far as the verified chain reaches.
        let target = wanted.min(self.chain.latest());
        if target <= self.epoch {
            return Vec::new();
        }
        self.move_to(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::pubkey::{self, PubKey};
    use crate::round::OpId;
    use bulwark_core::membership::PlacementParams;
    use bulwark_core::sign::SecretKey;
    use bytes::Bytes;

    fn ring(epoch: u64, ids: std::ops::Range<u32>) -> Arc<Ring> {
        let ring = Ring::new(Epoch(epoch), PlacementParams::new(1), ids.map(NodeId));
        Arc::new(ring.expect("enough members"))
    }

    /// A write started in epoch 0 of `chain`.
    fn write(chain: Arc<Chain>) -> Routed<PubKey, pubkey::WriteOp> {
        let owner = Arc::new(SecretKey::from_seed(&[1; 32]));
        let id = pubkey::object_id(&owner.public_key());
        let config = pubkey::ClientConfig::new(1);
        let inner = pubkey::WriteOp::new(
            config,
            OpId(7),
            ClientId(1),
            7,
            owner,
            Some(Bytes::from_static(b"v")),
        );
        Routed::new(inner, id, chain, Epoch(0))
    }

    fn moved_on(op: OpId, current: u64) -> Response<PubKey> {
        Response {
            op,
            epoch: Epoch(current),
            body: ResponseBody::Refused(Refusal::WrongEpoch {
                current: Epoch(current),
            }),
        }
    }

    /// The epochs the requests of `sends` name.
    fn epochs(sends: &[Outbound<PubKey>]) -> BTreeSet<u64> {
        sends.iter().map(|(_, request)| request.epoch.0).collect()
    }

    #[test]
    fn a_replica_in_an_epoch_the_client_lacks_makes_it_fetch_and_move_only_as_far_as_proven() {
        let genesis = ring(0, 0..4);
        let mut op = write(Arc::new(Chain::new(vec![genesis.clone()])));
        let first = op.start();
        assert_eq!(epochs(&first), BTreeSet::from([0]));
        assert_eq!(op.route(), Some((Epoch(0), op.view().id())));

        // Node 2 claims epoch 5; only epoch 1 is certified.
        let Progress::Send(sends) = op.on_reply(Slot(2), moved_on(OpId(7), 5)) else {
            panic!("a refusal does not end the write");
        };
        assert!(
            sends.is_empty(),
            "nothing to send before the configuration is known"
        );
        assert_eq!(op.needs(), Some(Epoch(5)));
        assert_eq!(op.epoch(), Epoch(0));

        let longer = Arc::new(Chain::new(vec![genesis, ring(1, 0..5)]));
        let sends = op.learn(longer);
        assert_eq!(op.epoch(), Epoch(1), "as far as the verified chain reaches");
        assert_eq!(op.needs(), None);
        assert_eq!(epochs(&sends), BTreeSet::from([1]));
        // Every request goes to the key's group of epoch 1, by node id.
        let group: BTreeSet<u32> = op.view().members().iter().map(|n| n.0).collect();
        let to: BTreeSet<u32> = sends.iter().map(|(slot, _)| slot.0).collect();
        assert_eq!(to, group);
        assert!(sends.iter().all(|(_, r)| r.group == op.view().id()));
    }

    #[test]
    fn a_request_of_another_epoch_is_answered_with_the_epoch_and_not_counted_as_refused() {
        let first = ring(1, 0..4);
        let mut node = EpochServer::<PubKey>::new(NodeId(0), first.clone(), ());
        node.enter(ring(2, 0..4));
        let key = Key::new(b"k".to_vec()).unwrap();
        let group = node
            .rings
            .newest()
            .group_at(RingPoint::of_key(key.as_bytes()))
            .id();
        let request = |epoch: u64, group: GroupId| Request::<PubKey> {
            op: OpId(7),
            epoch: Epoch(epoch),
            group,
            key: key.clone(),
            body: crate::register::RequestBody::Get,
        };
        let access = Access {
            write: true,
            read: true,
        };
        let behind = node.on_request(Time(0), ClientId(1), access, request(1, group), &());
        assert_eq!(
            behind.reply.as_ref().and_then(Response::refusal),
            Some(&Refusal::WrongEpoch { current: Epoch(2) })
        );
        assert_eq!(behind.refused, None, "a client behind is not misbehaving");
        let lost = node.on_request(
            Time(0),
            ClientId(1),
            access,
            request(2, GroupId(group.0 ^ 1)),
            &(),
        );
        assert_eq!(
            lost.reply.as_ref().and_then(Response::refusal),
            Some(&Refusal::WrongGroup)
        );
        assert!(
            lost.refused.is_some(),
            "a request sent to the wrong group is counted"
        );
    }

    #[test]
    fn a_chain_no_longer_than_held_moves_nothing() {
        let genesis = ring(0, 0..4);
        let chain = Arc::new(Chain::new(vec![genesis]));
        let mut op = write(chain.clone());
        op.start();
        let _ = op.on_reply(Slot(1), moved_on(OpId(7), 3));
        assert!(op.learn(chain).is_empty());
        assert_eq!(op.epoch(), Epoch(0));
    }

    /// Node `me` in epoch 1 of `chain`, holding `versions`.
    fn holding(me: u32, chain: &Chain, versions: &[(Key, pubkey::Entry)]) -> EpochServer<PubKey> {
        let pulled = chain
            .ring(Epoch(1))
            .expect("epoch 1")
            .arcs_since(chain.genesis())
            .into_iter()
            .map(|moved| (Epoch(1), moved.arc))
            .collect();
        EpochServer::restore(NodeId(me), chain, (), versions.to_vec(), Epoch(1), &pulled)
            .expect("signed versions")
    }

    fn held(output: &Output<EpochServer<PubKey>>) -> Vec<(u32, Vec<Key>)> {
        output
            .sends
            .iter()
            .filter_map(|(to, message)| match message {
                Transfer::Held { versions, .. } => {
                    Some((to.0, versions.iter().map(|(key, _)| key.clone()).collect()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_moved_key_is_dropped_once_2f_plus_1_members_of_its_new_group_hold_it_and_not_before() {
        // Epoch 1 replaces the whole group: nodes 0-3 hand over to nodes 4-7.
        let chain = Chain::new(vec![ring(0, 0..4), ring(1, 4..8)]);
        let owner = Arc::new(SecretKey::from_seed(&[1; 32]));
        let key = pubkey::object_id(&owner.public_key());
        let version = |num: u64| {
            let ts = Timestamp {
                num,
                writer: ClientId(1),
                seq: num,
            };
            PubKey::make(&owner, GroupId(0), &key, ts, Some(Bytes::from_static(b"v")))
        };
        let mut old = EpochServer::restore(
            NodeId(0),
            &Chain::new(vec![chain.genesis().clone()]),
            (),
            [(key.clone(), version(2))],
            Epoch(0),
            &BTreeSet::new(),
        )
        .expect("a signed version");
        let ring1 = chain.ring(Epoch(1)).expect("epoch 1").clone();
        let _ = old.enter(ring1);
        assert_eq!(old.moved_keys().len(), 1);

        // Nothing is asked before the sweep is due, then every new member is asked.
        assert!(Replica::on_tick(&mut old, Time(0)).sends.is_empty());
        assert!(Replica::on_tick(&mut old, Time(100)).sends.is_empty());
        let asked = Replica::on_tick(&mut old, Time(DROP_START_MILLIS));
        let to: BTreeSet<u32> = asked.sends.iter().map(|(to, _)| to.0).collect();
        assert_eq!(to, BTreeSet::from([4, 5, 6, 7]));
        let (_, hold) = asked.sends[0].clone();

        // New members answer from what they hold: the same version or newer counts, older not.
        let mut newer = holding(4, &chain, &[(key.clone(), version(3))]);
        let mut same = holding(5, &chain, &[(key.clone(), version(2))]);
        let mut older = holding(6, &chain, &[(key.clone(), version(1))]);
        let mut answers = Vec::new();
        for node in [&mut newer, &mut same, &mut older] {
            let answer = Replica::on_message(node, Time(1), Slot(0), hold.clone(), &());
            answers.extend(held(&answer));
        }
        let confirming = |keys: &Vec<Key>| keys.contains(&key);
        assert_eq!(
            answers
                .iter()
                .map(|(_, keys)| confirming(keys))
                .collect::<Vec<_>>(),
            [true, true, false]
        );
        // A member of another epoch does not answer at all.
        let mut behind = holding(7, &chain, &[(key.clone(), version(2))]);
        let stale_hold = Transfer::Hold {
            epoch: Epoch(0),
            versions: vec![(key.clone(), PubKey::ts(&version(2)))],
        };
        assert!(
            Replica::on_message(&mut behind, Time(1), Slot(0), stale_hold, &())
                .sends
                .is_empty()
        );

        let confirm = |old: &mut EpochServer<PubKey>, from: u32, num: u64| {
            let message = Transfer::Held {
                epoch: Epoch(1),
                versions: vec![(key.clone(), PubKey::ts(&version(num)))],
            };
            Replica::on_message(old, Time(2), Slot(from), message, &())
        };
        // Two members, one of them twice, a node outside the group, and a member confirming an
        // older version than the one held (an answer to an earlier question): not enough.
        for (from, num) in [(4, 2), (5, 2), (4, 2), (2, 2), (6, 1)] {
            assert!(confirm(&mut old, from, num).changes.is_empty());
        }
        assert!(old.stored(&key).is_some());
        // The third member of the new group.
        let dropped = confirm(&mut old, 7, 2);
        assert_eq!(dropped.changes, vec![Change::Drop { key: key.clone() }]);
        assert!(old.stored(&key).is_none());
        assert!(old.moved_keys().is_empty());
        assert_eq!(Replica::stats(&old).collected, 1);
        // And it is listed and fetched as a key the node never held.
        let list = Transfer::List {
            epoch: Epoch(1),
            arc: chain
                .ring(Epoch(1))
                .expect("epoch 1")
                .arcs_since(chain.genesis())[0]
                .arc,
            after: None,
        };
        let listed = Replica::on_message(&mut old, Time(3), Slot(4), list, &());
        assert!(matches!(
            &listed.sends[..],
            [(_, Transfer::Listed { keys, .. })] if keys.is_empty()
        ));
    }

    #[test]
    fn a_kept_key_is_offered_to_the_members_that_lack_it_and_then_dropped() {
        let chain = Chain::new(vec![ring(0, 0..4), ring(1, 4..8)]);
        let owner = Arc::new(SecretKey::from_seed(&[2; 32]));
        let key = pubkey::object_id(&owner.public_key());
        let ts = Timestamp {
            num: 5,
            writer: ClientId(1),
            seq: 5,
        };
        let entry = PubKey::make(&owner, GroupId(0), &key, ts, Some(Bytes::from_static(b"x")));
        let mut old = EpochServer::restore(
            NodeId(1),
            &Chain::new(vec![chain.genesis().clone()]),
            (),
            [(key.clone(), entry.clone())],
            Epoch(0),
            &BTreeSet::new(),
        )
        .expect("a signed version");
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let _ = Replica::on_tick(&mut old, Time(0));
        let _ = Replica::on_tick(&mut old, Time(DROP_START_MILLIS));
        // Members 4 and 5 hold it; 6 answers without it (the write reached only the old group);
        // 7 says nothing.
        let answer = |old: &mut EpochServer<PubKey>, from: u32, keys: Vec<Key>| {
            let message = Transfer::Held {
                epoch: Epoch(1),
                versions: keys.into_iter().map(|key| (key, ts)).collect(),
            };
            Replica::on_message(old, Time(1), Slot(from), message, &())
        };
        let _ = answer(&mut old, 4, vec![key.clone()]);
        let _ = answer(&mut old, 5, vec![key.clone()]);
        let _ = answer(&mut old, 6, Vec::new());
        // The rounds of asking again pass; the key is kept and offered to 6 only.
        let mut now = DROP_START_MILLIS;
        let mut offers = Vec::new();
        for _ in 0..20 {
            now += PULL_RETRY_MILLIS;
            let output = Replica::on_tick(&mut old, Time(now));
            offers.extend(
                output
                    .sends
                    .into_iter()
                    .filter_map(|(to, message)| match message {
                        Transfer::Offer { entry, .. } => Some((to.0, entry)),
                        _ => None,
                    }),
            );
            if !offers.is_empty() {
                break;
            }
        }
        assert_eq!(offers, vec![(6, entry.clone())]);
        assert!(old.stored(&key).is_some());

        // Member 6 stores the offered version; a forged one it refuses.
        let mut lacking = holding(6, &chain, &[]);
        let offer = Transfer::Offer {
            epoch: Epoch(1),
            key: key.clone(),
            entry: entry.clone(),
        };
        let stored = Replica::on_message(&mut lacking, Time(2), Slot(1), offer, &());
        assert_eq!(
            stored.changes,
            vec![Change::Put {
                key: key.clone(),
                entry: entry.clone()
            }]
        );
        let mut forged = entry.clone();
        forged.ts.num += 1;
        let other = pubkey::object_id(&SecretKey::from_seed(&[3; 32]).public_key());
        let refused = Replica::on_message(
            &mut holding(6, &chain, &[]),
            Time(2),
            Slot(1),
            Transfer::Offer {
                epoch: Epoch(1),
                key: other,
                entry: forged,
            },
            &(),
        );
        assert!(refused.changes.is_empty() && refused.refused.is_some());

        // The next sweep asks only 6 and 7 (4 and 5 still count) and drops on 6's answer.
        let mut asked = BTreeSet::new();
        for _ in 0..40 {
            now += PULL_RETRY_MILLIS;
            let output = Replica::on_tick(&mut old, Time(now));
            for (to, message) in output.sends {
                if let Transfer::Hold { .. } = message {
                    asked.insert(to.0);
                }
            }
            if !asked.is_empty() {
                break;
            }
        }
        assert_eq!(asked, BTreeSet::from([6, 7]));
        let dropped = answer(&mut old, 6, vec![key.clone()]);
        assert_eq!(dropped.changes, vec![Change::Drop { key: key.clone() }]);
    }
}
