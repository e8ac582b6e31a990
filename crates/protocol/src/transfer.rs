//! Objects across epochs (Rosebud §4.5, §4.7, §4.8), whatever their kind: the part of a node's
//! replica that follows the certified configuration from epoch to epoch, takes over the keys it
//! becomes responsible for from their previous group, drops the keys it no longer serves once
//! their new group holds them, and the client operation that follows a replica into a newer
//! epoch. What differs between kinds of object (how a request is served, what an old member
//! hands over, how a new member decides from the answers) is a [`Kind`]; registers
//! (`register::reconfig`) and content-hash objects (`content::epochs`) are two.
//!
//! The node keeps one store per service, whatever group serves each key, so a key that stays on
//! the node across a reconfiguration stays where it is. What changes with the epoch is which
//! requests it serves: one of the current epoch, for a key whose group in that epoch names this
//! node, and which its transfer has brought in.
//!
//! # Entering an epoch
//!
//! When the driver hands over the certified ring of epoch `e+1` ([`EpochHost::enter`]) the
//! replica refuses every request of epoch `e` from then on, answering with its epoch so that the
//! client catches up (ERR_UPGRADE_CONFIG) and restarts only its current round there
//! ([`Routed`]). It then works out, arc by arc ([`Ring::arcs_since`]), the keys it must take over
//! ([`Kind::must_pull`]: for registers, those whose group now names it but was another set of
//! nodes) and pulls each arc from its old group:
//!
//! 1. LIST: every old member lists the keys it holds on the arc, a page at a time. An old member
//!    enters `e+1` before it answers (invariant 4 of the spec's §5.3), so what it lists can no
//!    longer change under an epoch-`e` write. The union of `2f+1` complete listings names every
//!    write completed in `e`: such a write reached `2f+1` old members while they were in `e`,
//!    and any `2f+1` listers share `f+1` of them, one correct.
//! 2. FETCH: each listed key is asked of every old member (again in `e+1` before they answer),
//!    and the kind decides from the answers ([`Kind::decide`]): a register keeps the highest
//!    version whose signature verifies among `2f+1`, with no write-back; a content-hash object is
//!    rebuilt from `f+1` fragments that check against its id.
//!
//! Until an arc's pull is done, the replica serves no request for a key on it: requests wait and
//! are answered when the pull ends (spec §4.7, "critical"), since a quorum of fresh replicas
//! would otherwise report nothing and a writer could pick a version below the existing one.
//!
//! An old member whose own pull of an overlapping arc is unfinished (it skipped part of an
//! epoch) does not answer LIST or FETCH for it yet: it would list an incomplete state.
//!
//! # Dropping what moved
//!
//! A node sweeps its store for keys outside its groups in its current epoch and asks each key's
//! group whether its members hold it ([`Transfer::Hold`]); it drops the key once every member
//! says so, or `2f+1` do and none of the others says, for [`DROP_GRACE_MILLIS`], that it is still
//! pulling (so that a late member does not find the old members emptied), and, for kinds that
//! allow it ([`Kind::DROP_DENIED`]), once `2f+1` members that
//! finished taking the key's arc over say they do not (then at most `f` correct members hold
//! it, which no completed write leaves behind). docs/state-transfer.md has the argument.
//!
//! This machine addresses its peers by node: `Slot(id)` in its sends and messages is the node
//! with [`NodeId`] `id`, not a position in a group; the driver delivers accordingly.

use crate::machine::{Access, Never, Operation, Output, Progress, Replica, ReplicaStats, TimerId};
use crate::round::{Judged, Replies};
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, Moved, Ring, RingPoint};
use bulwark_core::wire::{DeserializeOwned, Serialize};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, NodeId, ServiceId, Slot, Time};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Debug;
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
pub const DROP_RESWEEP_MAX_MILLIS: u64 = 2_000;
/// How long a node keeps a moved key that `2f+1` members of its new group hold but the others
/// have not confirmed: a member that entered the epoch late, or whose pull is slow, would find
/// the old members already dropped it and lack it for good. Every member's confirmation drops it
/// at once; after this wait, `2f+1` do (a crashed or faulty member cannot keep it here forever).
pub const DROP_GRACE_MILLIS: u64 = 5_000;
/// The longest a moved key is kept for members that say they are still taking it over, after
/// `2f+1` members hold it: a pull of many keys takes a while, but a faulty member that says so
/// for ever does not keep the key on its old members for ever.
pub const DROP_PENDING_MAX_MILLIS: u64 = 120_000;

// A member still pulling is asked again (after a batch's last round and the wait to the next
// sweep), and says so, with time to spare before the grace runs out.
const _: () = assert!(
    (PULL_RETRY_MILLIS << DROP_ROUNDS) + DROP_RESWEEP_MAX_MILLIS + 1_000 < DROP_GRACE_MILLIS
);

/// The timer under which the dropping of moved keys moves on: set from the tick when something
/// is due, since dropping reads the store, which only timers and messages are lent.
pub const DROP_TIMER: TimerId = TimerId(1);
/// The timer under which the requests held for a finished pull are served.
pub const RELEASE_TIMER: TimerId = TimerId(2);
/// The timer under which a kind that takes keys over itself ([`Kind::TAKES`]) moves its
/// take-overs on: set from the tick while any runs, since they read the store.
pub const TAKE_TIMER: TimerId = TimerId(3);

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
    /// Drop a key once `f+1` members of its group say they hold it, instead of `2f+1`, and
    /// without waiting for the others.
    pub small_drop_quorum: bool,
    /// Never drop a key that moved away (for the check that moved keys are dropped).
    pub keep_moved_keys: bool,
    /// Drop a key once `2f+1` members of its group hold it, without waiting for the others.
    pub drop_without_grace: bool,
    /// Content-hash objects: a fragment taken over replaces every other one the node holds of
    /// the object, before the object's group holds it.
    pub displace_fragments: bool,
    /// Count an old member's "still taking it over myself" as a denial of the key.
    pub undecided_denies: bool,
    /// Hand an entry over although the asker named it as held (never [`Transfer::NoNewer`]).
    pub hand_over_held: bool,
}

/// Why a replica that follows the configuration turned a request away before its kind saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turned {
    /// The request names another epoch than the replica's, `current`.
    WrongEpoch {
        /// The replica's epoch.
        current: Epoch,
    },
    /// The key's group in the request's epoch is not the one named, or does not name this node.
    WrongGroup,
    /// Too many requests already wait for transfers.
    Transferring,
}

impl std::fmt::Display for Turned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Turned::WrongEpoch { current } => {
                write!(f, "wrong epoch: the server is in epoch {}", current.0)
            }
            Turned::WrongGroup => f.write_str("wrong replica group"),
            Turned::Transferring => f.write_str("the key is still being transferred"),
        }
    }
}

/// Where a request says it goes.
#[derive(Clone, Debug)]
pub struct Route {
    /// The epoch the client believes in.
    pub epoch: Epoch,
    /// The group it addressed.
    pub group: GroupId,
    /// The key.
    pub key: Key,
}

/// Where `key` of kind `K` sorts in a listing: by its point on the ring, then by its bytes, so
/// that an arc's keys are one or two ranges of a store kept in that order.
pub fn ring_order<K: Kind>(key: &Key) -> (Option<RingPoint>, &Key) {
    (K::point(key), key)
}

/// Where a walk over stored keys in ring order resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume<'a> {
    /// At the first key.
    Start,
    /// After every key placed at this point or before it.
    AfterPoint(RingPoint),
    /// After this key (and every key before it in ring order).
    AfterKey(&'a Key),
}

/// The keys on `arc` after `after`, in ring order: at most `limit`, and whether more follow.
/// `next` pages through what is stored: the keys after a position, in ring order, at most as
/// many as asked for and none only at the end; `point` places each (`None` for a key no correct
/// node stores, which is passed over).
pub fn list_arc(
    arc: &RingArc,
    after: Option<&Key>,
    limit: usize,
    point: impl Fn(&Key) -> Option<RingPoint>,
    mut next: impl FnMut(Resume<'_>, usize) -> Vec<Key>,
) -> (Vec<Key>, bool) {
    // An arc that does not wrap is one range of points, one that wraps two, the lower first;
    // each range is an exclusive start (`None`: the ring's first point) and its last point.
    let ranges = match arc.after.cmp(&arc.upto) {
        std::cmp::Ordering::Equal => vec![(None, None)],
        std::cmp::Ordering::Greater => vec![(None, Some(arc.upto)), (Some(arc.after), None)],
        std::cmp::Ordering::Less => vec![(Some(arc.after), Some(arc.upto))],
    };
    let after = after.and_then(|key| point(key).map(|at| (at, key)));
    let mut keys = Vec::new();
    for (start, last) in ranges {
        let past = |at: RingPoint| last.is_some_and(|last| at > last);
        if after.is_some_and(|(at, _)| past(at)) {
            continue;
        }
        let mut from: Option<Key> = None;
        'range: loop {
            let resume = match (&from, after, start) {
                (Some(key), _, _) => Resume::AfterKey(key),
                (None, Some((at, _)), Some(start)) if at <= start => Resume::AfterPoint(start),
                (None, Some((_, key)), _) => Resume::AfterKey(key),
                (None, None, Some(start)) => Resume::AfterPoint(start),
                (None, None, None) => Resume::Start,
            };
            let batch = next(resume, limit + 1 - keys.len());
            if batch.is_empty() {
                break;
            }
            for key in batch {
                from = Some(key.clone());
                let Some(at) = point(&key) else {
                    continue;
                };
                if past(at) {
                    break 'range;
                }
                if keys.len() == limit {
                    return (keys, true);
                }
                keys.push(key);
            }
        }
    }
    (keys, false)
}

/// Of `keys`, those after `resume` in ring order ([`ring_order`]), at most `limit`: what a kind's
/// storage that holds its keys as a set answers when an arc is listed.
pub fn keys_after<K: Kind>(
    keys: impl IntoIterator<Item = Key>,
    resume: Resume<'_>,
    limit: usize,
) -> Vec<Key> {
    let order = ring_order::<K>;
    let mut keys: Vec<Key> = keys
        .into_iter()
        .filter(|key| match resume {
            Resume::Start => true,
            Resume::AfterPoint(point) => K::point(key).is_some_and(|at| at > point),
            Resume::AfterKey(after) => order(key) > order(after),
        })
        .collect();
    keys.sort_unstable_by(|a, b| order(a).cmp(&order(b)));
    keys.dedup();
    keys.truncate(limit);
    keys
}

/// A bounded set that forgets its oldest entries first: what a replica remembers having checked
/// (a fragment found intact, a version whose signature verified), so that reading it back again
/// costs no second check while memory stays bounded whatever the node stores.
pub struct Recent<T> {
    set: BTreeSet<T>,
    order: VecDeque<T>,
    capacity: usize,
}

impl<T: Ord + Clone> Recent<T> {
    /// An empty set that holds at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Recent {
            set: BTreeSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Whether `entry` is remembered.
    pub fn contains(&self, entry: &T) -> bool {
        self.set.contains(entry)
    }

    /// Remembers `entry`, forgetting the oldest beyond the capacity.
    pub fn insert(&mut self, entry: T) {
        if self.set.insert(entry.clone()) {
            self.order.push_back(entry);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        debug_assert_eq!(self.set.len(), self.order.len());
    }
}

/// What one key's pull decided from the old members' answers so far.
#[derive(Clone, Debug, PartialEq)]
pub enum Decided<E> {
    /// Not yet: more answers are needed.
    Wait,
    /// Nothing to take over: no old member holds the key (or what they hold fails its checks).
    Absent,
    /// Store this.
    Take(E),
}

/// What serving one request made: changes durable before the reply leaves, and why it was
/// refused, for the node's counts.
pub struct Served<K: Kind> {
    /// Durable before the reply.
    pub changes: Vec<KindChange<K>>,
    /// The reply.
    pub reply: K::Reply,
    /// Why the request was refused, when it was and the client is to blame.
    pub refused: Option<String>,
}

/// A kind of object that moves between epochs: what it stores per key and how it serves,
/// hands over, takes over and drops it. Its methods see the driver's storage through `View`
/// (what it made durable, and what it has not yet).
pub trait Kind: Sized + 'static {
    /// The service objects of this kind are served as.
    const SERVICE: ServiceId;
    /// Whether a node drops a moved key once `2f+1` members of its new group that finished
    /// taking its arc over say they do not hold it (a key at most `f` correct members hold is no
    /// completed write's); kinds that offer what they hold instead say `false`.
    const DROP_DENIED: bool;
    /// Whether taking a key over may leave the node holding a part of it to drop later (a
    /// fragment of its earlier slot): every finished pull then makes the next sweep look again.
    const KEEPS_EARLIER: bool = false;
    /// Whether a pull holds back only the requests for the keys it has not decided yet, once
    /// its listing is in, rather than every request for its arc; requests for a key that no
    /// correct old member listed are then served at once.
    const GATES_KEYS: bool = false;
    /// Whether the kind keeps its objects in the driver's storage, which shows what an output
    /// changed only once the driver has taken the output: requests held for a pull are then
    /// served from a timer, after the pull's changes, rather than with them.
    const IN_STORAGE: bool = false;
    /// A client's request.
    type Request: DeserializeOwned;
    /// The answer.
    type Reply: Serialize;
    /// What a node stores of one key and hands over: a register's version, or a content-hash
    /// object's fragment with its manifest.
    type Entry: Clone + Debug + PartialEq + Serialize + DeserializeOwned;
    /// What is compared to decide that a moved key may be dropped: a version, or `()` for an
    /// immutable object.
    type Version: Copy + Ord + Debug + Serialize + DeserializeOwned;
    /// The driver's storage, read back.
    type View: ?Sized;
    /// What nodes send each other in the kind's own take-overs ([`Kind::TAKES`]); `Never` for
    /// kinds that decide a key from FETCH answers.
    type Peer: Clone + Debug + PartialEq + Serialize + DeserializeOwned;
    /// A durable change only the kind describes; `Never` for kinds whose changes are
    /// [`Change::Put`] of one entry per key.
    type Own: Clone + Debug + PartialEq;
    /// Whether the kind takes each listed key over by a protocol of its own ([`Kind::take`],
    /// [`Kind::on_peer`], [`Kind::tick`]) instead of deciding it from one FETCH answer per old
    /// member: a key whose entries cannot be handed from node to node (a PoWerStore register,
    /// whose MAC vector binds its incarnation).
    const TAKES: bool = false;

    /// Faults tolerated per group.
    fn f(&self) -> usize;
    /// Where `request` goes.
    fn route(request: &Self::Request) -> Route;
    /// The operation id `request` carries, which a held request's answer echoes.
    fn op(request: &Self::Request) -> u64;
    /// The point of the ring `key` is placed at; `None` for a key no correct node stores.
    fn point(key: &Key) -> Option<RingPoint>;
    /// The answer to a request turned away.
    fn turned(request: &Self::Request, epoch: Epoch, why: Turned) -> Self::Reply;
    /// Serves a request of the current epoch for a key of `group`, where this node is `slot`.
    fn serve(
        &mut self,
        client: ClientId,
        access: Access,
        request: Self::Request,
        group: &GroupView,
        slot: Slot,
        view: &Self::View,
    ) -> Served<Self>;
    /// Whether `request` is served even while its key is being taken over: it brings what the
    /// pull is after (a fragment of this node's slot), and serving it decides the key; or what
    /// this node holds already answers it as the finished pull would (a fragment of its slot,
    /// which checks against the object's id).
    fn passes(&self, _request: &Self::Request, _view: &Self::View) -> bool {
        false
    }
    /// Whether `reply`, to a request that [`Kind::passes`], brought what the pull is after.
    fn settles(_reply: &Self::Reply) -> bool {
        false
    }
    /// Whether a node of `moved.new` must take `moved.arc` over from `moved.old`.
    fn must_pull(moved: &Moved) -> bool;
    /// The keys stored on `arc` after `after`, in ring order ([`ring_order`]): at most `limit`,
    /// and whether more follow ([`list_arc`] walks an arc for a kind that can page through its
    /// keys in ring order).
    fn list(
        &self,
        view: &Self::View,
        arc: &RingArc,
        after: Option<&Key>,
        limit: usize,
    ) -> (Vec<Key>, bool);
    /// The ring the node entered: the kind learns where it is now.
    fn entered(&mut self, _ring: &Arc<Ring>) {}
    /// A new input begins: every change of the outputs before it is in the view now. A kind
    /// that reads back in one input what it changed earlier in the same input keeps those
    /// changes itself until then (see [`Kind::IN_STORAGE`] for the other way).
    fn begin(&mut self, _now: Time) {}
    /// What is stored of `key`, checked: what a node outside the key's group would drop, or
    /// offer.
    fn entry(&self, view: &Self::View, key: &Key) -> Option<Self::Entry>;
    /// The version of `key` a member of its group can serve, as it answers a node asking
    /// whether it holds what moved.
    fn holds(&self, view: &Self::View, key: &Key) -> Option<Self::Version> {
        self.entry(view, key).map(|entry| Self::version(&entry))
    }
    /// What is handed over of `key` to a new member pulling it from `old`, where this node was
    /// a member.
    fn hand_over(&self, view: &Self::View, key: &Key, _old: &GroupView) -> Option<Self::Entry> {
        self.entry(view, key)
    }
    /// Whether a pull into `new` must fetch `key`, which an old member listed: not when what is
    /// held already serves.
    fn needs(&self, _view: &Self::View, _key: &Key, _new: &GroupView) -> bool {
        true
    }
    /// An entry's version.
    fn version(entry: &Self::Entry) -> Self::Version;
    /// An entry's value bytes, for the transfer counters.
    fn value_bytes(entry: &Self::Entry) -> u64;
    /// Every stored key whose group in `ring` does not name `me`.
    fn outside(&self, view: &Self::View, ring: &Ring, me: NodeId) -> Vec<Key>;
    /// How an entry handed over for `key` by a member of `group` is judged.
    fn judge(&self, group: &GroupView, key: &Key, entry: &Self::Entry) -> Judged;
    /// What the answers of `old`'s members so far decide for `key`, for this node as a member of
    /// `new`, beside what it holds in `view`; `quorum` is how many answers the transfer rule
    /// waits for.
    fn decide(
        &self,
        view: &Self::View,
        key: &Key,
        old: &GroupView,
        new: &GroupView,
        answers: &[(Slot, Option<&Self::Entry>)],
        quorum: usize,
    ) -> Decided<Self::Entry>;
    /// Stores `entry` unless what is stored is as new: the changes that make it so.
    fn adopt(&mut self, view: &Self::View, key: &Key, entry: &Self::Entry)
    -> Vec<KindChange<Self>>;
    /// Forgets what this node need not hold of `key`, now that its group holds it.
    fn remove(&mut self, view: &Self::View, key: &Key) -> Vec<KindChange<Self>>;
    /// Whether a kept key's entry is offered to the members that lack it, who store it as a
    /// write-back (registers); kinds whose entries cannot be taken from one node do not.
    fn offers(&self) -> bool;
    /// Current counters.
    fn stats(&self) -> ReplicaStats;
    /// Starts taking `key` over into `new`, this node's group for it in `epoch`, from `old`, its
    /// group in the epoch before (kinds that [`Kind::TAKES`]; called once per listed key a
    /// pull needs, and again only after the kind said the key is decided).
    fn take(
        &mut self,
        _view: &Self::View,
        _epoch: Epoch,
        _key: &Key,
        _old: &GroupView,
        _new: &GroupView,
    ) -> Taken<Self> {
        Taken::none()
    }
    /// A message of the kind's own from `from`, a node in `epoch`. `settled` says whether this
    /// node's state of a key as of an epoch is complete: no pull into that epoch or an earlier
    /// one over the key is unfinished (what an old member must know before it answers for it).
    fn on_peer(
        &mut self,
        _now: Time,
        _from: NodeId,
        _epoch: Epoch,
        _message: Self::Peer,
        _view: &Self::View,
        _settled: &dyn Fn(Epoch, &Key) -> bool,
    ) -> Taken<Self> {
        Taken::none()
    }
    /// Whether take-overs are running that the next [`Kind::tick`] moves on.
    fn taking(&self) -> bool {
        false
    }
    /// Time passed: take-overs waiting for answers ask again.
    fn tick(&mut self, _now: Time, _view: &Self::View) -> Taken<Self> {
        Taken::none()
    }
    /// Whether requests for `key`, decided already, wait again: the kind is taking over a newer
    /// version of it than the one it served.
    fn closed(&self, _key: &Key) -> bool {
        false
    }
}

/// What a kind's own take-overs made of an input.
pub struct Taken<K: Kind> {
    /// Durable before the sends leave.
    pub changes: Vec<KindChange<K>>,
    /// To other nodes (and this one), by node.
    pub sends: Vec<(NodeId, K::Peer)>,
    /// Keys whose take-over into an epoch is over, with that epoch: its pull no longer waits
    /// for them.
    pub decided: Vec<(Epoch, Key)>,
    /// Versions taken over that this node did not hold, and their value bytes.
    pub moved: (u64, u64),
    /// Keys [`Kind::closed`] no longer holds back.
    pub opened: Vec<Key>,
    /// Why the input was refused, for the node's counts.
    pub refused: Option<String>,
}

impl<K: Kind> Taken<K> {
    /// Nothing.
    pub fn none() -> Self {
        Taken {
            changes: Vec::new(),
            sends: Vec::new(),
            decided: Vec::new(),
            moved: (0, 0),
            opened: Vec::new(),
            refused: None,
        }
    }

    /// Both, in order.
    pub fn and(mut self, other: Taken<K>) -> Self {
        self.changes.extend(other.changes);
        self.sends.extend(other.sends);
        self.decided.extend(other.decided);
        self.moved = (self.moved.0 + other.moved.0, self.moved.1 + other.moved.1);
        self.opened.extend(other.opened);
        self.refused = self.refused.or(other.refused);
        self
    }
}

/// What nodes send each other to move keys between epochs; `P` is what a kind that takes keys
/// over itself sends ([`Kind::Peer`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Transfer<E, V, P = Never> {
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
        /// At most [`LIST_PAGE_KEYS`], in ring order ([`ring_order`]), all after `after`.
        keys: Vec<Key>,
        /// Another page follows.
        more: bool,
    },
    /// What the old member holds of `key`, for a new member of `epoch`.
    Fetch {
        /// The epoch the asker entered.
        epoch: Epoch,
        /// The key.
        key: Key,
        /// What the asker holds of the key already: its version and the digest of its entry
        /// ([`entry_digest`]). An old member that holds nothing newer, nor another entry of the
        /// same version, answers [`Transfer::NoNewer`] instead of sending the entry back.
        held: Option<(V, Digest)>,
    },
    /// The answer; `None` when nothing is stored.
    Fetched {
        /// As asked.
        epoch: Epoch,
        /// As asked.
        key: Key,
        /// What is stored.
        entry: Option<E>,
    },
    /// The old member holds nothing newer of `key` than the entry the asker named in its
    /// [`Transfer::Fetch`], and no other entry of that version: the asker counts its own entry
    /// as this member's answer. A member that kept its keys across the change (most members of
    /// a group that changed) is then handed only what it lacks.
    NoNewer {
        /// As asked.
        epoch: Epoch,
        /// As asked.
        key: Key,
    },
    /// The old member asked for `key` is itself still taking it over from an earlier group
    /// (sent by kinds that gate keys, [`Kind::GATES_KEYS`]):
    /// an answer, which counts toward the `2f+1` old members a pull must hear about each key
    /// before its node counts as having caught up, but never a denial.
    Undecided {
        /// As asked.
        epoch: Epoch,
        /// As asked.
        key: Key,
    },
    /// A node that no longer serves these keys in `epoch` asks a member of their group there
    /// whether it holds each at the given version or a newer one.
    Hold {
        /// The epoch both are in.
        epoch: Epoch,
        /// At most [`DROP_BATCH_KEYS`] keys, each with the asker's version.
        versions: Vec<(Key, V)>,
    },
    /// The keys of a [`Transfer::Hold`] the member holds at the version asked or newer, in
    /// `epoch`, each with the version asked: an answer says nothing of a newer version the asker
    /// may hold by the time it arrives.
    Held {
        /// As asked.
        epoch: Epoch,
        /// At most [`DROP_BATCH_KEYS`].
        versions: Vec<(Key, V)>,
        /// Keys asked about that the member does not hold although its pull of their arc is in
        /// (sent only for kinds that drop on denials, [`Kind::DROP_DENIED`]).
        denied: Vec<Key>,
        /// Keys asked about that the member does not hold yet, its pull of their arc still
        /// running: the asker keeps them for it a while longer.
        pending: Vec<Key>,
    },
    /// A version a member said it lacks, from a node that no longer serves the key in `epoch`
    /// and would drop it: stored if it verifies and is newer, as a write-back would be.
    Offer {
        /// The epoch both are in.
        epoch: Epoch,
        /// The key.
        key: Key,
        /// What the sender holds.
        entry: E,
    },
    /// A message of a kind's own take-overs ([`Kind::on_peer`]), from a node in `epoch`. The
    /// kind decides what it answers in which epoch: these are answers as well as requests.
    Peer {
        /// The sender's epoch.
        epoch: Epoch,
        /// The kind's message.
        message: P,
    },
}

/// The digest a [`Transfer::Fetch`] names an entry by.
pub fn entry_digest<E: Serialize>(entry: &E) -> Digest {
    Digest::of(DOMAIN_ENTRY, &bulwark_core::wire::encode(entry))
}

const DOMAIN_ENTRY: &str = "bulwark 2026 transfer entry";

/// An old member's answer to FETCH about a key it holds.
enum FetchAnswer<E> {
    /// Its entry.
    Sent(E),
    /// Nothing newer than the entry the asker named.
    NoNewer,
}

/// What nodes send each other to move objects of kind `K` between epochs.
pub type Message<K> = Transfer<<K as Kind>::Entry, <K as Kind>::Version, <K as Kind>::Peer>;

/// A change to the durable state of a node holding objects of kind `K`.
pub type KindChange<K> = Change<<K as Kind>::Entry, <K as Kind>::Own>;

/// A change to a node's durable state, made before anything it caused leaves; `C` is a change
/// of a kind's own ([`Kind::Own`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Change<E, C = Never> {
    /// What is stored of `key` is now `entry`.
    Put {
        /// The key.
        key: Key,
        /// What to store.
        entry: E,
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
        /// The key.
        key: Key,
    },
    /// The node no longer holds this part of what it stored of `key` (a kind whose entries are
    /// parts of an object: a fragment made for an earlier slot).
    Remove {
        /// The key.
        key: Key,
        /// What is forgotten.
        entry: E,
    },
    /// A change only the kind describes (one whose entries are not one value per key).
    Own(C),
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

/// The members of a key's group that answered about the version asked.
#[derive(Clone, Debug)]
struct Asked<V> {
    version: V,
    holders: BTreeSet<NodeId>,
    deniers: BTreeSet<NodeId>,
    /// When a quorum of holders was first counted, in this epoch.
    quorum_at: Option<Time>,
}

impl<V> Asked<V> {
    fn new(version: V) -> Self {
        Asked {
            version,
            holders: BTreeSet::new(),
            deniers: BTreeSet::new(),
            quorum_at: None,
        }
    }

    /// Whether the key may be dropped at `now`: every member of `group` holds it, or `quorum`
    /// deny it, or `quorum` hold it and have for `grace` milliseconds while none of the others
    /// said in that time that it is still taking keys over (`pulling`: when each member last
    /// did), or for [`DROP_PENDING_MAX_MILLIS`] whatever they say (a faulty member cannot keep
    /// the key here for good).
    fn droppable(
        &mut self,
        now: Time,
        quorum: usize,
        group: &GroupView,
        grace: u64,
        pulling: &BTreeMap<NodeId, Time>,
    ) -> bool {
        if self.holders.len() >= quorum && self.quorum_at.is_none() {
            self.quorum_at = Some(now);
        }
        let since = |at: Time, wait: u64| now.0 >= at.0.saturating_add(wait);
        let still_pulling = group.members().iter().any(|member| {
            !self.holders.contains(member)
                && pulling.get(member).is_some_and(|at| !since(*at, grace))
        });
        let waited = self.quorum_at.is_some_and(|at| {
            since(at, grace) && (!still_pulling || since(at, DROP_PENDING_MAX_MILLIS))
        });
        group.members().iter().all(|m| self.holders.contains(m))
            || waited
            || self.deniers.len() >= quorum
    }
}

/// Dropping the keys whose group in the current epoch does not name this node, once the members
/// of that group say they hold the same version or a newer one (every member, or `2f+1` and a
/// grace: [`Asked::droppable`]), or, for kinds that drop on denials, `2f+1` say they do not hold
/// it. No state survives a restart or an epoch: the keys to drop are those stored outside the
/// node's groups, found again by the next sweep.
struct Drops<V> {
    sweep: Sweep,
    /// The wait before the sweep after one that kept keys.
    backoff: u64,
    /// Keys of the running sweep not asked about yet, in key order.
    queue: VecDeque<Key>,
    /// The keys being asked about.
    batch: BTreeMap<Key, Asked<V>>,
    /// The members that answered about the batch.
    answered: BTreeSet<NodeId>,
    /// The kept keys offered to each member: once per epoch, so that a member that keeps
    /// answering without them costs one copy each.
    offered: BTreeSet<(Key, NodeId)>,
    /// Kept keys, with the members that answered about them: asked about again, the key counts
    /// those members still, as long as the version held is the same.
    confirmed: BTreeMap<Key, Asked<V>>,
    /// When each member last said it is still taking over a key asked about: one entry per
    /// member asked.
    pulling: BTreeMap<NodeId, Time>,
    /// Members that answered nothing during a whole batch, until they answer again: batches
    /// no longer wait for them.
    silent: BTreeSet<NodeId>,
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

impl<V: Copy + Ord> Drops<V> {
    fn new() -> Self {
        Drops {
            sweep: Sweep::Unscheduled,
            backoff: DROP_START_MILLIS,
            queue: VecDeque::new(),
            batch: BTreeMap::new(),
            answered: BTreeSet::new(),
            offered: BTreeSet::new(),
            confirmed: BTreeMap::new(),
            pulling: BTreeMap::new(),
            silent: BTreeSet::new(),
            retry_at: Time(0),
            rounds: 0,
            kept: false,
            rescan: true,
        }
    }

    /// Whether something is due at `now`: a round of asking again, or a sweep to start or go on.
    /// An unscheduled sweep is scheduled here, on the epoch's first tick.
    fn due(&mut self, now: Time) -> bool {
        if !self.batch.is_empty() {
            return now >= self.retry_at;
        }
        if self.rescan && self.sweep == Sweep::Done {
            self.sweep = Sweep::At(Time(now.0 + DROP_START_MILLIS));
        }
        match self.sweep {
            Sweep::Unscheduled => {
                self.sweep = Sweep::At(Time(now.0 + DROP_START_MILLIS));
                false
            }
            Sweep::At(at) => now >= at,
            Sweep::Running => true,
            Sweep::Done => false,
        }
    }
}

/// One arc a node is taking over from its old group.
struct Pull<K: Kind> {
    epoch: Epoch,
    arc: RingArc,
    old: GroupView,
    /// Per old member: the keys listed so far, the last one, and whether the listing is complete.
    listings: Vec<Listing>,
    /// Once `2f+1` listings are complete: the keys still to fetch, in key order.
    queue: Option<BTreeSet<Key>>,
    /// Keys being fetched, with the answers of each old member.
    fetching: BTreeMap<Key, Fetching<K::Entry, K::Version>>,
    /// When to ask again the old members that have not answered; set on the first tick after
    /// the requests went out, and again after each retry or progress.
    retry_at: Option<Time>,
    /// The wait before the next retry.
    backoff: u64,
}

/// The answers of the old members about one key.
struct Fetching<E, V> {
    /// Each member's fragment or version, or its denial.
    replies: Replies<Option<E>>,
    /// The members that said they are still taking the key over themselves, and have not
    /// answered otherwise since.
    undecided: Vec<bool>,
    /// What this node held of the key when the fetch began, named in every FETCH: the answer
    /// of an old member that says it holds nothing newer.
    held: Option<Held<E, V>>,
}

/// An entry a node held when it began fetching its key, as its FETCH names it.
struct Held<E, V> {
    entry: E,
    version: V,
    digest: Digest,
}

impl<E, V: Copy> Fetching<E, V> {
    fn new(n: usize, held: Option<Held<E, V>>) -> Self {
        Fetching {
            replies: Replies::new(n),
            undecided: vec![false; n],
            held,
        }
    }

    /// What the FETCHes for the key name as held.
    fn named(&self) -> Option<(V, Digest)> {
        self.held.as_ref().map(|held| (held.version, held.digest))
    }

    /// Old members that answered, either way or undecided.
    fn answered(&self) -> usize {
        let silent = self
            .replies
            .missing()
            .filter(|slot| !self.undecided[slot.index()])
            .count();
        self.undecided.len() - silent
    }
}

#[derive(Default)]
struct Listing {
    keys: BTreeSet<Key>,
    after: Option<Key>,
    complete: bool,
    /// Sent more than it may, or keys off the arc: no longer heard.
    faulty: bool,
}

impl<K: Kind> Pull<K> {
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
    fn retry(&mut self, now: Time) -> Vec<(Slot, Message<K>)> {
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
        self.queue.as_ref().is_some_and(BTreeSet::is_empty) && self.fetching.is_empty()
    }

    /// Whether the pull still waits to hear from `quorum` old members about some key. A key
    /// that `quorum` answered without deciding it (a creation a faulty writer left on fewer
    /// than `f+1` correct members, with a faulty member silent) may never be decided; its
    /// requests stay held and its fetches are retried, but the node has caught up as far as
    /// the old group lets it, and the liveness record (§4.9) must not count it slow.
    fn waiting(&self, quorum: usize) -> bool {
        self.queue.as_ref().is_none_or(|queue| !queue.is_empty())
            || self.fetching.values().any(|key| key.answered() < quorum)
    }

    /// Keys `quorum` old members answered about without the pull deciding them.
    fn undecided(&self, quorum: usize) -> usize {
        self.fetching
            .values()
            .filter(|key| key.answered() >= quorum)
            .count()
    }

    /// Whether `key` is still to be taken over: the listing is not in, or the key is listed
    /// and not decided yet.
    fn pending(&self, key: &Key) -> bool {
        self.queue.as_ref().is_none_or(|queue| queue.contains(key))
            || self.fetching.contains_key(key)
    }

    /// Every request this pull still waits on, to every old member that has not answered it.
    fn requests(&self) -> Vec<(Slot, Message<K>)> {
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
        // A kind that takes keys over itself asks again from its own tick.
        if K::TAKES {
            return sends;
        }
        for (key, fetching) in &self.fetching {
            for slot in fetching.replies.missing() {
                let fetch = Transfer::Fetch {
                    epoch: self.epoch,
                    key: key.clone(),
                    held: fetching.named(),
                };
                sends.push((to(slot.index()), fetch));
            }
        }
        sends
    }
}

/// [`EpochHost::unsettled`], over `pulls`.
fn unsettled_in<K: Kind>(pulls: &[Pull<K>], epoch: Epoch, point: RingPoint, key: &Key) -> bool {
    pulls.iter().any(|pull| {
        pull.epoch < epoch && pull.arc.contains(point) && (!K::GATES_KEYS || pull.pending(key))
    })
}

/// An answer to a request held earlier: to its client, with its operation id.
type Answer<K> = (ClientId, u64, <K as Kind>::Reply);

/// A node's replica of one service across epochs: the objects of kind `K` it holds, whatever
/// group serves each.
pub struct EpochHost<K: Kind> {
    me: NodeId,
    f: usize,
    /// The rings entered, from the genesis on.
    rings: Chain,
    kind: K,
    pulls: Vec<Pull<K>>,
    waiting: VecDeque<(ClientId, Access, K::Request)>,
    mutations: TransferMutations,
    /// Keys taken over from other nodes since start (by a pull or an offer) whose version this
    /// node did not hold already, and the bytes of their values.
    pulled_keys: u64,
    pulled_bytes: u64,
    /// Requests held for a transfer since start.
    gated: u64,
    drops: Drops<K::Version>,
    /// Keys dropped since start.
    dropped: u64,
    /// Keys a request decided while pulls waited for them: the pulls learn it once the request
    /// is served.
    settling: Vec<(Key, RingPoint)>,
}

impl<K: Kind> EpochHost<K> {
    /// Node `me` holding `kind` at the genesis `ring`.
    pub fn new(me: NodeId, ring: Arc<Ring>, kind: K) -> Self {
        let f = kind.f();
        EpochHost {
            me,
            f,
            kind,
            rings: Chain::new(vec![ring]),
            pulls: Vec::new(),
            waiting: VecDeque::new(),
            mutations: TransferMutations::default(),
            pulled_keys: 0,
            pulled_bytes: 0,
            gated: 0,
            drops: Drops::new(),
            dropped: 0,
            settling: Vec::new(),
        }
    }

    /// The same node, deliberately broken.
    pub fn with_mutations(mut self, mutations: TransferMutations) -> Self {
        self.mutations = mutations;
        self
    }

    /// Node `me` holding `kind` as it was made durable, having entered `entered` (each ring from
    /// `chain`) and finished the pulls of `pulled`. Unfinished pulls start again.
    pub fn resume(
        me: NodeId,
        chain: &Chain,
        kind: K,
        entered: Epoch,
        pulled: &BTreeSet<(Epoch, RingArc)>,
    ) -> Self {
        let mut node = EpochHost::new(me, chain.genesis().clone(), kind);
        for epoch in chain.genesis().epoch().0 + 1..=entered.0 {
            let Some(ring) = chain.ring(Epoch(epoch)) else {
                break;
            };
            node.step_into(ring.clone());
            node.pulls
                .retain(|pull| !pulled.contains(&(pull.epoch, pull.arc)));
        }
        node
    }

    /// The epoch the node is in.
    pub fn epoch(&self) -> Epoch {
        self.rings.latest()
    }

    /// Whether every arc the node took over is in.
    pub fn settled(&self) -> bool {
        self.pulls.is_empty()
    }

    /// Keys taken over since start whose version this node did not hold already, and their
    /// value bytes.
    pub fn pulled(&self) -> (u64, u64) {
        (self.pulled_keys, self.pulled_bytes)
    }

    /// The objects held.
    pub fn kind(&self) -> &K {
        &self.kind
    }

    /// The newest ring entered.
    pub fn ring(&self) -> &Arc<Ring> {
        self.rings.newest()
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
        // Requests held for an earlier epoch's pulls are turned away now: their epoch is over.
        // Every held request is of the epoch left (a request is held only in its own epoch), so
        // none reaches the kind.
        let held = std::mem::take(&mut self.waiting);
        output.notify = held
            .into_iter()
            .map(|(client, _, request)| {
                debug_assert!(K::route(&request).epoch < epoch);
                let current = self.epoch();
                let reply = K::turned(&request, current, Turned::WrongEpoch { current });
                (client, K::op(&request), reply)
            })
            .collect();
        output
    }

    /// Enters the next epoch with `ring`: the arcs this node takes over become pulls.
    fn step_into(&mut self, ring: Arc<Ring>) {
        let before = self.rings.newest().clone();
        for moved in ring.arcs_since(&before) {
            if moved.new.contains(self.me)
                && (K::must_pull(&moved) || self.mutations.pull_unchanged_arcs)
            {
                self.pulls
                    .push(Pull::new(ring.epoch(), moved.arc, moved.old.clone()));
            }
        }
        self.kind.entered(&ring);
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

    /// Whether what this node holds of `key`, at `point`, as of the epoch before `epoch` is
    /// still incomplete: a pull into an earlier epoch than `epoch` over it has not decided it
    /// (for kinds that gate keys), or is unfinished (for the others).
    fn unsettled(&self, epoch: Epoch, point: RingPoint, key: &Key) -> bool {
        unsettled_in(&self.pulls, epoch, point, key)
    }

    /// `key` is decided, by a request that brought what the pulls over it were after: they no
    /// longer wait for it, and those left with nothing to wait for are done.
    fn settle(&mut self, key: &Key, point: RingPoint, view: &K::View) -> Output<Self> {
        let epoch = Epoch(self.epoch().0 + 1);
        // What the request stored may sit beside what the node held before.
        if K::KEEPS_EARLIER {
            self.drops.rescan = true;
        }
        let mut output = Output::none();
        let mut at = 0;
        while at < self.pulls.len() {
            let pull = &mut self.pulls[at];
            let covers = pull.epoch < epoch && pull.arc.contains(point);
            let listed = pull.queue.as_mut().is_some_and(|queue| queue.remove(key));
            let fetching = pull.fetching.remove(key).is_some();
            if covers && (listed || fetching) && pull.done() {
                output = output.and(self.finish(at, view));
                continue;
            }
            at += 1;
        }
        output
    }

    /// The `2f+1` old members a pull hears, or new members a drop waits for; `f+1` when the
    /// negative control `small` breaks the rule.
    fn quorum(&self, small: bool) -> usize {
        if small { self.f + 1 } else { 2 * self.f + 1 }
    }

    /// How long a quorum of holders waits for the rest of a moved key's group.
    fn drop_grace(&self) -> u64 {
        if self.mutations.drop_without_grace || self.mutations.small_drop_quorum {
            0
        } else {
            DROP_GRACE_MILLIS
        }
    }

    /// The group of `key` in the current epoch, when it does not name this node.
    fn moved_away(&self, key: &Key) -> Option<GroupView> {
        let group = self.rings.newest().group_at(K::point(key)?);
        (!group.contains(self.me)).then_some(group)
    }

    /// The version of `key` stored.
    fn stored_version(&self, view: &K::View, key: &Key) -> Option<K::Version> {
        self.kind.entry(view, key).map(|entry| K::version(&entry))
    }

    /// The keys stored whose group in the current epoch does not name this node, with their
    /// versions: what it has yet to drop.
    pub fn moved_keys(&self, view: &K::View) -> Vec<(Key, K::Version)> {
        self.kind
            .outside(view, self.rings.newest(), self.me)
            .into_iter()
            .filter_map(|key| {
                let version = self.stored_version(view, &key)?;
                Some((key, version))
            })
            .collect()
    }

    /// Moves the dropping of moved keys on at `now`: asks again about the batch in flight, gives
    /// up on it, starts a sweep, or starts the next batch.
    fn drop_tick(&mut self, now: Time, view: &K::View) -> Output<Self> {
        if !self.drops.due(now) {
            return Output::none();
        }
        let drops = &mut self.drops;
        if !drops.batch.is_empty() {
            if drops.rounds < DROP_ROUNDS {
                drops.rounds += 1;
                let wait = (PULL_RETRY_MILLIS << drops.rounds).min(PULL_RETRY_MAX_MILLIS);
                drops.retry_at = Time(now.0 + wait);
                return Output {
                    sends: self.hold_requests(),
                    ..Output::none()
                };
            }
            // Members asked that never answered this batch: the next batches of the sweep do
            // not wait for them.
            let silent: Vec<NodeId> = self.waited_for().into_iter().collect();
            self.drops.silent.extend(silent);
            return self.end_batch(now, view);
        }
        if let Sweep::At(_) = drops.sweep {
            let mut found: Vec<Key> = if drops.rescan {
                self.kind.outside(view, self.rings.newest(), self.me)
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
        Output {
            sends: self.next_batch(now, view, &[]),
            ..Output::none()
        }
    }

    /// Ends the batch in flight: drops the keys whose quorum of holders has waited long enough
    /// for the others ([`Asked::droppable`]; judged here, when every member was asked in this
    /// batch, so that a member still pulling had its say), and keeps the rest for the next sweep.
    /// Members that answered without a kept key are offered it: a version only some members
    /// hold (a write its writer did not finish) would otherwise keep the key here until the next
    /// write. The sweep goes on (or ends) at the next tick.
    fn end_batch(&mut self, now: Time, view: &K::View) -> Output<Self> {
        let drops = &mut self.drops;
        drops.kept = true;
        let mut kept = std::mem::take(&mut drops.batch);
        let mut changes = Vec::new();
        let mut dropped = Vec::new();
        if !self.mutations.keep_moved_keys {
            let quorum = self.quorum(self.mutations.small_drop_quorum);
            let grace = self.drop_grace();
            let ring = self.rings.newest().clone();
            let pulling = &self.drops.pulling;
            let due: Vec<(Key, K::Version)> = kept
                .iter_mut()
                .filter_map(|(key, asked)| {
                    let group = ring.group_at(K::point(key)?);
                    asked
                        .droppable(now, quorum, &group, grace, pulling)
                        .then(|| (key.clone(), asked.version))
                })
                .collect();
            for (key, version) in due {
                kept.remove(&key);
                changes.extend(self.drop_key(view, key, version, &mut dropped));
            }
        }
        let offers = if self.kind.offers() {
            self.offers(view, &kept)
        } else {
            Vec::new()
        };
        let drops = &mut self.drops;
        for (to, offer) in &offers {
            if let Transfer::Offer { key, .. } = offer {
                drops.offered.insert((key.clone(), NodeId(to.0)));
            }
        }
        if !offers.is_empty() {
            drops.backoff = DROP_START_MILLIS;
        }
        drops
            .confirmed
            .extend(kept.into_iter().map(|(key, mut asked)| {
                asked.deniers.clear();
                (key, asked)
            }));
        Output {
            changes,
            sends: offers,
            ..Output::none()
        }
    }

    /// The members of the batch's groups that have neither confirmed every key of theirs nor
    /// answered in this batch, and are not known silent: those the batch still waits for.
    fn waited_for(&self) -> BTreeSet<NodeId> {
        let drops = &self.drops;
        let mut waiting = BTreeSet::new();
        for (key, asked) in &drops.batch {
            let Some(point) = K::point(key) else {
                continue;
            };
            for member in self.rings.newest().group_at(point).members() {
                if !asked.holders.contains(member)
                    && !drops.answered.contains(member)
                    && !drops.silent.contains(member)
                {
                    waiting.insert(*member);
                }
            }
        }
        waiting
    }

    /// Starts asking about the next keys of the running sweep, or ends it; `dropped` were
    /// dropped by changes the view does not show yet.
    fn next_batch(
        &mut self,
        now: Time,
        view: &K::View,
        dropped: &[Key],
    ) -> Vec<(Slot, Message<K>)> {
        debug_assert!(self.drops.batch.is_empty() && self.drops.sweep == Sweep::Running);
        while self.drops.batch.len() < DROP_BATCH_KEYS {
            let Some(key) = self.drops.queue.pop_front() else {
                break;
            };
            if let Some(version) = self.stored_version(view, &key) {
                let asked = match self.drops.confirmed.remove(&key) {
                    Some(asked) if asked.version == version => asked,
                    _ => Asked::new(version),
                };
                self.drops.batch.insert(key, asked);
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
            // A pull into an earlier epoch still running may store more (and, for kinds that
            // keep what they held before, any pull); it rescans when done.
            debug_assert!(
                drops.sweep != Sweep::Done
                    || self
                        .pulls
                        .iter()
                        .any(|pull| pull.epoch < self.epoch() || K::KEEPS_EARLIER)
                    || self
                        .moved_keys(view)
                        .iter()
                        .all(|(key, _)| dropped.contains(key)),
                "a sweep ended with keys outside the node's groups left"
            );
            return Vec::new();
        }
        drops.rounds = 0;
        drops.answered.clear();
        drops.retry_at = Time(now.0 + PULL_RETRY_MILLIS);
        self.hold_requests()
    }

    /// What is stored of each key of `kept` for the members that answered about it without
    /// holding it.
    fn offers(
        &self,
        view: &K::View,
        kept: &BTreeMap<Key, Asked<K::Version>>,
    ) -> Vec<(Slot, Message<K>)> {
        let mut sends = Vec::new();
        for (key, asked) in kept {
            let (Some(entry), Some(point)) = (self.kind.entry(view, key), K::point(key)) else {
                continue;
            };
            let group = self.rings.newest().group_at(point);
            for member in group.members() {
                let offered = self.drops.offered.contains(&(key.clone(), *member));
                if self.drops.answered.contains(member)
                    && !asked.holders.contains(member)
                    && !offered
                {
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
    /// answered about.
    fn hold_requests(&self) -> Vec<(Slot, Message<K>)> {
        let mut per_member: BTreeMap<NodeId, Vec<(Key, K::Version)>> = BTreeMap::new();
        for (key, asked) in &self.drops.batch {
            let Some(point) = K::point(key) else {
                continue;
            };
            let group = self.rings.newest().group_at(point);
            for member in group.members() {
                if !asked.holders.contains(member) {
                    per_member
                        .entry(*member)
                        .or_default()
                        .push((key.clone(), asked.version));
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
    /// newer, does not hold those of `denied`, and is still pulling those of `pending`: drops
    /// each key every member of its group holds at the version this node holds (or, for kinds
    /// that drop on denials, `2f+1` do not hold), and ends the batch early once each key has
    /// `2f+1` holders and every member has answered.
    fn on_held(
        &mut self,
        now: Time,
        from: NodeId,
        versions: Vec<(Key, K::Version)>,
        denied: Vec<Key>,
        pending: &[Key],
        view: &K::View,
    ) -> Output<Self> {
        let quorum = self.quorum(self.mutations.small_drop_quorum);
        // Here a key goes on every member's word (or on denials); the grace is judged when the
        // batch ends, once every member has been asked in it.
        let grace = match self.drop_grace() {
            0 => 0,
            _ => u64::MAX,
        };
        let mut changes = Vec::new();
        let mut dropped = Vec::new();
        self.drops.answered.insert(from);
        self.drops.silent.remove(&from);
        let asked_about = |key: &Key| {
            (self.drops.batch.contains_key(key) || self.drops.confirmed.contains_key(key))
                && K::point(key)
                    .is_some_and(|point| self.rings.newest().group_at(point).contains(from))
        };
        if pending.iter().any(asked_about) {
            self.drops.pulling.insert(from, now);
        }
        let said = versions
            .into_iter()
            .map(|(key, version)| (key, Some(version)))
            .chain(
                denied
                    .into_iter()
                    .filter(|_| K::DROP_DENIED)
                    .map(|key| (key, None)),
            );
        for (key, confirmed) in said {
            // The key's group now, which this node may be a member of (a kind that keeps what
            // it held before drops that part only).
            let Some(group) = K::point(&key).map(|point| self.rings.newest().group_at(point))
            else {
                continue;
            };
            // A key of the batch, or one kept earlier in this epoch: a late answer counts too.
            let drops = &mut self.drops;
            let in_batch = drops.batch.contains_key(&key);
            let asked = if in_batch {
                drops.batch.get_mut(&key)
            } else {
                drops.confirmed.get_mut(&key)
            };
            let Some(asked) = asked else {
                continue;
            };
            if !group.contains(from) {
                continue;
            }
            match confirmed {
                // An answer to an earlier question (a retry, a previous batch, or this node
                // before a restart) about an older version says nothing about the one held now.
                Some(version) if version < asked.version => continue,
                Some(_) => {
                    asked.deniers.remove(&from);
                    asked.holders.insert(from);
                }
                // A denial holds for the round it answers: the member may come to hold the key
                // (a write in the new epoch), so it is asked again.
                None if !asked.holders.contains(&from) => {
                    asked.deniers.insert(from);
                }
                None => {}
            }
            let enough = asked.droppable(now, quorum, &group, grace, &drops.pulling);
            if !enough || self.mutations.keep_moved_keys {
                continue;
            }
            let version = asked.version;
            if in_batch {
                self.drops.batch.remove(&key);
            } else {
                self.drops.confirmed.remove(&key);
            }
            changes.extend(self.drop_key(view, key, version, &mut dropped));
        }
        let running = self.drops.sweep == Sweep::Running;
        if running && self.drops.batch.is_empty() {
            let sends = self.next_batch(now, view, &dropped);
            return Output {
                changes,
                sends,
                ..Output::none()
            };
        }
        // Every key has its quorum and every member has had its say: nothing more to wait for
        // in this batch (the rounds would only hold the sweep up while the grace runs).
        let quorate = self
            .drops
            .batch
            .values()
            .all(|asked| asked.holders.len() >= quorum);
        if running && quorate && self.waited_for().is_empty() {
            let ended = self.end_batch(now, view);
            return Output {
                changes,
                ..Output::none()
            }
            .and(ended);
        }
        Output {
            changes,
            ..Output::none()
        }
    }

    /// Drops `key`, asked about at `version`, unless a pull into an earlier epoch stored a newer
    /// version since (that one waits for the next sweep).
    fn drop_key(
        &mut self,
        view: &K::View,
        key: Key,
        version: K::Version,
        dropped: &mut Vec<Key>,
    ) -> Vec<KindChange<K>> {
        let held = self.stored_version(view, &key);
        if held == Some(version) {
            self.dropped += 1;
            let changes = self.kind.remove(view, &key);
            dropped.push(key);
            return changes;
        }
        if let Some(held) = held {
            self.drops.kept = true;
            self.drops.confirmed.insert(key, Asked::new(held));
        }
        Vec::new()
    }

    /// Serves one request now (`None` when it is held while its key is transferred).
    fn handle(
        &mut self,
        client: ClientId,
        access: Access,
        request: K::Request,
        view: &K::View,
    ) -> Option<Served<K>> {
        let epoch = self.epoch();
        let route = K::route(&request);
        let turn = |why: Turned| {
            Some(Served {
                changes: Vec::new(),
                reply: K::turned(&request, epoch, why),
                // A client in another epoch is behind (or ahead), not misbehaving: its answer
                // names this node's epoch and it catches up. Only other refusals count.
                refused: (why != Turned::WrongEpoch { current: epoch }).then(|| why.to_string()),
            })
        };
        if route.epoch != epoch {
            return turn(Turned::WrongEpoch { current: epoch });
        }
        let Some(point) = K::point(&route.key) else {
            return turn(Turned::WrongGroup);
        };
        let group = self.rings.newest().group_at(point);
        let Some(slot) = group.slot_of(self.me) else {
            return turn(Turned::WrongGroup);
        };
        if group.id() != route.group {
            return turn(Turned::WrongGroup);
        }
        let unsettled = self.unsettled(Epoch(epoch.0 + 1), point, &route.key);
        if unsettled && self.kind.passes(&request, view) {
            let served = self.kind.serve(client, access, request, &group, slot, view);
            if K::settles(&served.reply) {
                self.settling.push((route.key, point));
            }
            return Some(served);
        }
        let closed = unsettled || K::TAKES && self.kind.closed(&route.key);
        if !self.mutations.serve_before_transfer && closed {
            if self.waiting.len() >= WAITING_MAX {
                return turn(Turned::Transferring);
            }
            self.waiting.push_back((client, access, request));
            self.gated += 1;
            return None;
        }
        Some(self.kind.serve(client, access, request, &group, slot, view))
    }

    /// Answers every held request that no longer waits on a pull: the changes they made, and
    /// the answers, which leave once those changes are durable.
    fn release(&mut self, view: &K::View) -> (Vec<KindChange<K>>, Vec<Answer<K>>) {
        let mut changes = Vec::new();
        let mut notify = Vec::new();
        let held = std::mem::take(&mut self.waiting);
        for (client, access, request) in held {
            let op = K::op(&request);
            if let Some(served) = self.handle(client, access, request, view) {
                changes.extend(served.changes);
                notify.push((client, op, served.reply));
            }
        }
        (changes, notify)
    }

    /// Sends the next page request, or the fetches, after a listing changed.
    fn after_listing(&mut self, at: usize, view: &K::View) -> Output<Self> {
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
        let mut output = self.fill(at, view);
        // Requests for keys no correct old member listed wait no longer.
        if K::GATES_KEYS && !self.waiting.is_empty() {
            output.timers.push((RELEASE_TIMER, Time(0)));
        }
        output
    }

    /// Starts fetches up to the window, or finishes the pull when nothing is left. Keys a
    /// quorum answered without a decision leave the window: they may wait for good.
    fn fill(&mut self, at: usize, view: &K::View) -> Output<Self> {
        let quorum = self.quorum(self.mutations.small_transfer_quorum);
        let pull = &mut self.pulls[at];
        let mut sends = Vec::new();
        let mut taken = Taken::none();
        let new = self.rings.ring(pull.epoch).cloned();
        let mut open = pull
            .fetching
            .values()
            .filter(|key| key.answered() < quorum)
            .count();
        while open < FETCH_WINDOW {
            let Some(key) = pull.queue.as_mut().and_then(BTreeSet::pop_first) else {
                break;
            };
            let held = new
                .as_ref()
                .zip(K::point(&key))
                .is_some_and(|(ring, point)| !self.kind.needs(view, &key, &ring.group_at(point)));
            if held {
                continue;
            }
            if K::TAKES {
                let new = new.as_ref().zip(K::point(&key));
                let Some(group) = new.map(|(ring, point)| ring.group_at(point)) else {
                    continue;
                };
                taken = taken.and(self.kind.take(view, pull.epoch, &key, &pull.old, &group));
                pull.fetching
                    .insert(key, Fetching::new(pull.old.len(), None));
                open += 1;
                continue;
            }
            let held = self.kind.entry(view, &key).map(|entry| Held {
                version: K::version(&entry),
                digest: entry_digest(&entry),
                entry,
            });
            let fetching = Fetching::new(pull.old.len(), held);
            for node in pull.old.members() {
                let fetch = Transfer::Fetch {
                    epoch: pull.epoch,
                    key: key.clone(),
                    held: fetching.named(),
                };
                sends.push((Slot(node.0), fetch));
            }
            pull.fetching.insert(key, fetching);
            open += 1;
        }
        if !pull.done() {
            let output = Output {
                sends,
                ..Output::none()
            };
            return output.and(self.apply_taken(taken, view));
        }
        let mut output = self.finish(at, view);
        output.sends = sends;
        output.and(self.apply_taken(taken, view))
    }

    /// What a kind's own take-overs made of an input, as the driver's output: their messages
    /// under this node's epoch, and the pulls moved on by the keys they decided.
    fn apply_taken(&mut self, taken: Taken<K>, view: &K::View) -> Output<Self> {
        let epoch = self.epoch();
        self.pulled_keys += taken.moved.0;
        self.pulled_bytes += taken.moved.1;
        let sends = taken.sends.into_iter().map(|(to, message)| {
            let message = Transfer::Peer { epoch, message };
            (Slot(to.0), message)
        });
        let mut output = Output {
            changes: taken.changes,
            sends: sends.collect(),
            refused: taken.refused,
            ..Output::none()
        };
        if !taken.opened.is_empty() && !self.waiting.is_empty() {
            output.timers.push((RELEASE_TIMER, Time(0)));
        }
        for (epoch, key) in taken.decided {
            let pulling = |pull: &Pull<K>| pull.epoch == epoch && pull.fetching.contains_key(&key);
            if let Some(at) = self.pulls.iter().position(pulling) {
                self.pulls[at].fetching.remove(&key);
                self.pulls[at].progressed();
                output = output.and(self.fill(at, view));
            }
        }
        output
    }

    /// Ends the pull at `at`, whose every key is decided, and serves the requests it held.
    fn finish(&mut self, at: usize, view: &K::View) -> Output<Self> {
        let pull = self.pulls.remove(at);
        debug_assert!(pull.done());
        if pull.epoch < self.epoch() || K::KEEPS_EARLIER {
            self.drops.rescan = true;
        }
        let mut output = Output {
            changes: vec![Change::Pulled {
                epoch: pull.epoch,
                arc: pull.arc,
            }],
            ..Output::none()
        };
        if K::IN_STORAGE {
            // Served once what the pull stored is in the view the kind reads (the driver holds
            // this output's changes by the time the timer fires), not from before the pull.
            output.timers.push((RELEASE_TIMER, Time(0)));
        } else {
            let (released, notify) = self.release(view);
            output.changes.extend(released);
            output.notify = notify;
        }
        output
    }

    /// One page of what this node holds on `arc` as of the epoch before `epoch`, after `after`,
    /// and whether more follows. A node whose own pull into an earlier epoch over the arc is
    /// unfinished has no such state yet (`None`), except, for kinds that gate keys, once that
    /// pull's listing is in: the keys it has yet to decide are then listed beside those it holds,
    /// since it may come to hold them (a key listed that no one holds costs its puller a fetch
    /// that every member denies).
    fn listing(
        &self,
        epoch: Epoch,
        arc: &RingArc,
        after: Option<&Key>,
        view: &K::View,
    ) -> Option<(Vec<Key>, bool)> {
        let overlaps = |pulled: &RingArc| pulled.contains(arc.upto) || arc.contains(pulled.upto);
        let earlier: Vec<&Pull<K>> = self
            .pulls
            .iter()
            .filter(|pull| pull.epoch < epoch && overlaps(&pull.arc))
            .collect();
        if earlier.iter().any(|pull| pull.queue.is_none()) {
            return None;
        }
        let (held, more) = self.kind.list(view, arc, after, LIST_PAGE_KEYS);
        if earlier.is_empty() {
            return Some((held, more));
        }
        // Pending keys up to where the kind's page ends (when more follows), merged in order.
        let end = more.then(|| held.last().cloned()).flatten();
        let after = after.map(ring_order::<K>);
        let end = end.as_ref().map(ring_order::<K>);
        let mut keys: BTreeSet<(Option<RingPoint>, Key)> =
            held.into_iter().map(|key| (K::point(&key), key)).collect();
        for pull in earlier {
            let pending = pull.queue.iter().flatten().chain(pull.fetching.keys());
            keys.extend(
                pending
                    .filter(|key| after.is_none_or(|after| ring_order::<K>(key) > after))
                    .filter(|key| end.is_none_or(|end| ring_order::<K>(key) <= end))
                    .filter(|key| K::point(key).is_some_and(|point| arc.contains(point)))
                    .map(|key| (K::point(key), key.clone())),
            );
        }
        let more = more || keys.len() > LIST_PAGE_KEYS;
        let keys = keys.into_iter().take(LIST_PAGE_KEYS).map(|(_, key)| key);
        Some((keys.collect(), more))
    }

    /// Whether this node answers a transfer request of `epoch`: only once it is in that epoch,
    /// so nothing it reports can change under a write of the epoch before.
    fn answers(&self, epoch: Epoch) -> bool {
        epoch <= self.epoch() || self.mutations.answer_without_entering
    }

    /// A member's answer to [`Transfer::Hold`]: the keys it holds at the version asked or newer,
    /// and, for kinds that drop on denials, those it does not hold although its pull of their
    /// arc is in.
    fn held(&self, epoch: Epoch, versions: Vec<(Key, K::Version)>, view: &K::View) -> Message<K> {
        let mut held = Vec::new();
        let mut denied = Vec::new();
        let mut pending = Vec::new();
        for (key, version) in versions {
            let Some(point) = K::point(&key) else {
                continue;
            };
            if self.moved_away(&key).is_some() {
                continue;
            }
            let unsettled = self.unsettled(Epoch(epoch.0 + 1), point, &key);
            match self.kind.holds(view, &key) {
                Some(stored) if stored >= version => held.push((key, version)),
                _ if unsettled => pending.push(key),
                _ if K::DROP_DENIED => denied.push(key),
                _ => {}
            }
        }
        Transfer::Held {
            epoch,
            versions: held,
            denied,
            pending,
        }
    }

    fn on_transfer(
        &mut self,
        now: Time,
        from: NodeId,
        message: Message<K>,
        view: &K::View,
    ) -> Output<Self> {
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
                Output {
                    sends: vec![(Slot(from.0), self.held(epoch, versions, view))],
                    ..Output::none()
                }
            }
            Transfer::Held {
                epoch,
                versions,
                denied,
                pending,
            } => {
                if epoch != self.epoch() {
                    return Output::none();
                }
                if versions.len() + denied.len() + pending.len() > DROP_BATCH_KEYS {
                    return Output::refused(format!("node {} confirmed too many keys", from.0));
                }
                self.on_held(now, from, versions, denied, &pending, view)
            }
            Transfer::Offer { epoch, key, entry } => {
                if epoch != self.epoch() {
                    return Output::none();
                }
                let refused = |why: &str| Output::refused(format!("node {} offered {why}", from.0));
                if !self.kind.offers() {
                    return refused("what this kind never offers");
                }
                let Some(point) = K::point(&key) else {
                    return refused("a malformed key");
                };
                let group = self.rings.newest().group_at(point);
                if !group.contains(self.me) {
                    return refused("a key outside this node's groups");
                }
                match self.kind.judge(&group, &key, &entry) {
                    Judged::Valid => {}
                    Judged::Ignored | Judged::Forged => return refused("a version that fails"),
                }
                let changes = self.kind.adopt(view, &key, &entry);
                // A version this node lacked, taken from another node: it counts as taken over
                // whether an offer or the pull brought it first (the pull then names it as held
                // and is answered NO-NEWER).
                if !changes.is_empty() {
                    self.pulled_keys += 1;
                    self.pulled_bytes += K::value_bytes(&entry);
                }
                Output {
                    changes,
                    ..Output::none()
                }
            }
            Transfer::List { epoch, arc, after } => {
                // Two arcs overlap exactly when one contains the other's end.
                let overlaps =
                    |pulled: &RingArc| pulled.contains(arc.upto) || arc.contains(pulled.upto);
                if !self.answers(epoch) || self.incomplete_before(epoch, overlaps) && !K::GATES_KEYS
                {
                    return Output::none();
                }
                let Some((keys, more)) = self.listing(epoch, &arc, after.as_ref(), view) else {
                    return Output::none();
                };
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
            } => self.on_listed(from, epoch, arc, after, keys, more, view),
            Transfer::Fetch { epoch, key, held } => {
                let Some(point) = K::point(&key) else {
                    return Output::refused(format!("node {} fetched a malformed key", from.0));
                };
                if !self.answers(epoch) {
                    return Output::none();
                }
                if self.unsettled(epoch, point, &key) {
                    // Only a kind that gates keys can leave a key undecided for good; the
                    // others decide at any 2f+1 answers, so their askers just wait.
                    if !K::GATES_KEYS {
                        return Output::none();
                    }
                    return Output {
                        sends: vec![(Slot(from.0), Transfer::Undecided { epoch, key })],
                        ..Output::none()
                    };
                }
                let before = Epoch(epoch.0.saturating_sub(1));
                let Some(old) = self.rings.ring(before).map(|ring| ring.group_at(point)) else {
                    return Output::none();
                };
                let entry = self.kind.hand_over(view, &key, &old);
                let no_newer = match (&entry, held) {
                    (Some(entry), Some((version, digest))) => match K::version(entry).cmp(&version)
                    {
                        std::cmp::Ordering::Less => true,
                        std::cmp::Ordering::Equal => entry_digest(entry) == digest,
                        std::cmp::Ordering::Greater => false,
                    },
                    _ => false,
                };
                let answer = if no_newer && !self.mutations.hand_over_held {
                    Transfer::NoNewer { epoch, key }
                } else {
                    Transfer::Fetched { epoch, key, entry }
                };
                Output {
                    sends: vec![(Slot(from.0), answer)],
                    ..Output::none()
                }
            }
            Transfer::Fetched { epoch, key, entry } => {
                self.on_fetched(from, epoch, key, entry.map(FetchAnswer::Sent), view)
            }
            Transfer::NoNewer { epoch, key } => {
                self.on_fetched(from, epoch, key, Some(FetchAnswer::NoNewer), view)
            }
            Transfer::Undecided { epoch, key } if self.mutations.undecided_denies => {
                self.on_fetched(from, epoch, key, None, view)
            }
            Transfer::Undecided { epoch, key } => self.on_undecided(from, epoch, key, view),
            // The kind decides what it answers in which epoch: its messages are answers as well
            // as requests, and an answer from a node further on must not wait for this one.
            Transfer::Peer { epoch, message } => {
                let pulls = &self.pulls;
                let settled = |epoch: Epoch, key: &Key| {
                    K::point(key)
                        .is_some_and(|point| !unsettled_in(pulls, Epoch(epoch.0 + 1), point, key))
                };
                let taken = self.kind.on_peer(now, from, epoch, message, view, &settled);
                self.apply_taken(taken, view)
            }
        }
    }

    /// One page of an old member's listing.
    #[allow(clippy::too_many_arguments)]
    fn on_listed(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        arc: RingArc,
        after: Option<Key>,
        keys: Vec<Key>,
        more: bool,
        view: &K::View,
    ) -> Output<Self> {
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
        let ordered = keys
            .windows(2)
            .all(|pair| ring_order::<K>(&pair[0]) < ring_order::<K>(&pair[1]))
            && keys.first().is_none_or(|first| {
                after
                    .as_ref()
                    .is_none_or(|after| ring_order::<K>(first) > ring_order::<K>(after))
            });
        let on_arc = keys
            .iter()
            .all(|key| K::point(key).is_some_and(|point| arc.contains(point)));
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
        self.after_listing(at, view)
    }

    /// The pull into `epoch` that is fetching `key`.
    fn fetching_pull(&self, epoch: Epoch, key: &Key) -> Option<usize> {
        self.pulls
            .iter()
            .position(|p| p.epoch == epoch && p.fetching.contains_key(key))
    }

    /// An old member's answer to FETCH: an entry, nothing newer than the one this node named,
    /// or (`None`) a denial.
    fn on_fetched(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        key: Key,
        answer: Option<FetchAnswer<K::Entry>>,
        view: &K::View,
    ) -> Output<Self> {
        let Some(at) = self.fetching_pull(epoch, &key) else {
            return Output::none();
        };
        let quorum = self.quorum(self.mutations.small_transfer_quorum);
        let pull = &self.pulls[at];
        let Some(slot) = pull.old.slot_of(from) else {
            return Output::none();
        };
        let entry = match answer {
            None => None,
            Some(FetchAnswer::Sent(entry)) => match self.kind.judge(&pull.old, &key, &entry) {
                Judged::Ignored => return Output::none(),
                Judged::Forged => None,
                Judged::Valid => Some(entry),
            },
            // This node's own entry, checked when the fetch began.
            Some(FetchAnswer::NoNewer) => {
                match pull.fetching.get(&key).and_then(|f| f.held.as_ref()) {
                    Some(held) => Some(held.entry.clone()),
                    None => {
                        return Output::refused(format!(
                            "node {} said it holds nothing newer than an entry never named",
                            from.0
                        ));
                    }
                }
            }
        };
        let Some(point) = K::point(&key) else {
            return Output::none();
        };
        let new = self.rings.ring(epoch).map(|ring| ring.group_at(point));
        let pull = &mut self.pulls[at];
        let Some(fetching) = pull.fetching.get_mut(&key) else {
            return Output::none();
        };
        let before = fetching.answered();
        if !fetching.replies.record(slot, entry) {
            return Output::none();
        }
        fetching.undecided[slot.index()] = false;
        let answered = fetching.answered();
        let answers: Vec<(Slot, Option<&K::Entry>)> = fetching
            .replies
            .present()
            .map(|(slot, entry)| (slot, entry.as_ref()))
            .collect();
        let Some(new) = new else {
            unreachable!("a pull's epoch is one the node entered")
        };
        let decided = self
            .kind
            .decide(view, &key, &pull.old, &new, &answers, quorum);
        let taken = match decided {
            // Heard out but undecided: the window moves on past it.
            Decided::Wait if before < quorum && answered >= quorum => return self.fill(at, view),
            Decided::Wait => return Output::none(),
            Decided::Absent => None,
            Decided::Take(entry) => Some(entry),
        };
        let held = pull
            .fetching
            .remove(&key)
            .and_then(|fetching| fetching.held);
        pull.progressed();
        let mut changes = Vec::new();
        if let Some(entry) = taken {
            // Only what this node did not hold already moved.
            if held.is_none_or(|held| held.entry != entry) {
                self.pulled_keys += 1;
                self.pulled_bytes += K::value_bytes(&entry);
            }
            changes = self.kind.adopt(view, &key, &entry);
        }
        let mut output = self.fill(at, view);
        changes.append(&mut output.changes);
        output.changes = changes;
        // Requests for this key wait no longer.
        if K::GATES_KEYS && !self.waiting.is_empty() {
            output.timers.push((RELEASE_TIMER, Time(0)));
        }
        output
    }

    /// An old member's word that it is still taking `key` over itself: it counts as heard, not
    /// as a denial, until it answers otherwise.
    fn on_undecided(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        key: Key,
        view: &K::View,
    ) -> Output<Self> {
        let quorum = self.quorum(self.mutations.small_transfer_quorum);
        let Some(at) = self.fetching_pull(epoch, &key) else {
            return Output::none();
        };
        let pull = &mut self.pulls[at];
        let Some(slot) = pull.old.slot_of(from) else {
            return Output::none();
        };
        let Some(fetching) = pull.fetching.get_mut(&key) else {
            return Output::none();
        };
        if fetching.replies.missing().all(|missing| missing != slot) {
            // It answered already; a later "undecided" takes nothing back.
            return Output::none();
        }
        let before = fetching.answered();
        fetching.undecided[slot.index()] = true;
        if before < quorum && fetching.answered() >= quorum {
            return self.fill(at, view);
        }
        Output::none()
    }
}

impl<K: Kind> Replica for EpochHost<K> {
    const SERVICE: ServiceId = K::SERVICE;
    type Request = K::Request;
    type Reply = K::Reply;
    type Message = Message<K>;
    type Change = KindChange<K>;
    type View = K::View;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: K::Request,
        view: &K::View,
    ) -> Output<Self> {
        self.kind.begin(now);
        let output = match self.handle(client, access, request, view) {
            Some(served) => Output {
                changes: served.changes,
                reply: Some(served.reply),
                refused: served.refused,
                ..Output::none()
            },
            None => Output::none(),
        };
        let settled = std::mem::take(&mut self.settling);
        settled.into_iter().fold(output, |output, (key, point)| {
            output.and(self.settle(&key, point, view))
        })
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<K>,
        view: &K::View,
    ) -> Output<Self> {
        self.kind.begin(now);
        self.on_transfer(now, NodeId(from.0), message, view)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &K::View) -> Output<Self> {
        self.kind.begin(now);
        match timer {
            DROP_TIMER => self.drop_tick(now, view),
            TAKE_TIMER => {
                let taken = self.kind.tick(now, view);
                self.apply_taken(taken, view)
            }
            RELEASE_TIMER => {
                let (changes, notify) = self.release(view);
                let output = Output {
                    changes,
                    notify,
                    ..Output::none()
                };
                let settled = std::mem::take(&mut self.settling);
                settled.into_iter().fold(output, |output, (key, point)| {
                    output.and(self.settle(&key, point, view))
                })
            }
            _ => Output::none(),
        }
    }

    fn on_epoch(&mut self, _now: Time, ring: Arc<Ring>) -> Output<Self> {
        self.enter(ring)
    }

    /// Asks again for whatever the pulls still wait on, once a retry is due (lost requests and
    /// slow old members), and moves the dropping of moved keys on.
    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let sends: Vec<_> = self
            .pulls
            .iter_mut()
            .flat_map(|pull| pull.retry(now))
            .collect();
        let mut timers = if self.drops.due(now) {
            vec![(DROP_TIMER, now)]
        } else {
            Vec::new()
        };
        if K::TAKES && self.kind.taking() {
            timers.push((TAKE_TIMER, now));
        }
        Output {
            sends,
            timers,
            ..Output::none()
        }
    }

    fn stats(&self) -> ReplicaStats {
        let quorum = self.quorum(self.mutations.small_transfer_quorum);
        ReplicaStats {
            epoch: self.epoch().0,
            transfers_pending: self.pulls.iter().filter(|p| p.waiting(quorum)).count() as u64,
            transfers_undecided: self.pulls.iter().map(|p| p.undecided(quorum) as u64).sum(),
            transferred_keys: self.pulled_keys,
            transferred_bytes: self.pulled_bytes,
            gated: self.gated,
            collected: self.dropped,
            ..self.kind.stats()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// An operation that can move to another epoch mid-way.
pub trait Rebase: Operation {
    /// What a reply says when its replica turned the request away before serving it (another
    /// epoch, or a transfer in progress); `None` for every other reply.
    fn turned(reply: &Self::Reply) -> Option<Turned>;
    /// The client moved to `epoch`, where the object belongs to `view` (its slots are
    /// positions in `view`): the current round starts again there from no replies, so no round
    /// counts replies of two epochs (Rosebud §7.1.1). What earlier rounds decided (a write's
    /// timestamp, a read's version to write back) stands. `chain` is every epoch the client has
    /// verified, for what an operation needs to know of the members it now talks to. An
    /// operation that cannot go on there ends instead (a PoWerStore write that revealed its
    /// nonce in the epoch left: the transfer decides whether it took effect).
    fn rebase(&mut self, epoch: Epoch, view: &GroupView, chain: &Chain) -> Progress<Self>;
    /// The epoch the operation runs in.
    fn epoch(&self) -> Epoch;
    /// `output` with the slots it names (who answered, whom it blames) turned into nodes
    /// (`Slot(id)`): positions in `view`, the group its last round ran in.
    fn named(output: Self::Output, view: &GroupView) -> Self::Output;
}

/// `slot` of `view` as the node it is (`Slot(id)`); a slot outside the group stays as it is.
pub fn node_slot(view: &GroupView, slot: Slot) -> Slot {
    view.node(slot).map_or(slot, |node| Slot(node.0))
}

/// An operation routed to its object's group of the client's epoch, that follows a replica's
/// word into a newer certified epoch (ERR_UPGRADE_CONFIG) by restarting only its current round
/// there. Its slots are nodes (`Slot(id)`), like [`EpochHost`]'s.
pub struct Routed<O: Rebase> {
    inner: O,
    point: RingPoint,
    chain: Arc<Chain>,
    epoch: Epoch,
    view: GroupView,
    /// The newest epoch a replica named that `chain` does not reach yet.
    needs: Option<Epoch>,
}

impl<O: Rebase> Routed<O> {
    /// `inner` on the object placed at `point`, starting in `epoch` of `chain`.
    pub fn new(inner: O, point: RingPoint, chain: Arc<Chain>, epoch: Epoch) -> Self {
        let epoch = epoch.min(chain.latest());
        let Some(ring) = chain.ring(epoch) else {
            unreachable!("an epoch up to the latest is in the chain")
        };
        let view = ring.group_at(point);
        Routed {
            inner,
            point,
            chain,
            epoch,
            view,
            needs: None,
        }
    }

    /// The epoch the operation runs in now.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The object's group in that epoch: what the inner operation's slots are positions in.
    pub fn view(&self) -> &GroupView {
        &self.view
    }

    /// The operation inside.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    fn to_nodes(&self, sends: Vec<(Slot, O::Request)>) -> Vec<(Slot, O::Request)> {
        sends
            .into_iter()
            .filter_map(|(slot, request)| Some((Slot(self.view.node(slot)?.0), request)))
            .collect()
    }

    /// The inner operation's progress, its slots as nodes.
    fn progress(&self, progress: Progress<O>) -> Progress<Self> {
        match progress {
            Progress::Send(sends) => Progress::Send(self.to_nodes(sends)),
            Progress::Done(result) => {
                Progress::Done(result.map(|output| O::named(output, &self.view)))
            }
        }
    }

    /// Moves the current round to `epoch`, which `chain` reaches.
    fn move_to(&mut self, epoch: Epoch) -> Progress<Self> {
        let Some(ring) = self.chain.ring(epoch) else {
            return Progress::Send(Vec::new());
        };
        self.epoch = epoch;
        self.view = ring.group_at(self.point);
        let moved = self.inner.rebase(epoch, &self.view, &self.chain);
        self.progress(moved)
    }

    fn to_slots(&self, slots: Vec<Slot>) -> Vec<Slot> {
        slots
            .into_iter()
            .filter_map(|slot| Some(Slot(self.view.node(slot)?.0)))
            .collect()
    }
}

impl<O: Rebase> Operation for Routed<O> {
    const SERVICE: ServiceId = O::SERVICE;
    type Request = O::Request;
    type Reply = O::Reply;
    type Output = O::Output;

    fn op(&self) -> u64 {
        self.inner.op()
    }

    fn start(&mut self) -> Vec<(Slot, O::Request)> {
        match self.inner.rebase(self.epoch, &self.view, &self.chain) {
            Progress::Send(sends) => self.to_nodes(sends),
            // Only an operation that has sent something can have to end on moving.
            Progress::Done(_) => unreachable!("an operation does not end before it starts"),
        }
    }

    fn on_reply(&mut self, from: Slot, reply: O::Reply) -> Progress<Self> {
        match O::turned(&reply) {
            Some(Turned::WrongEpoch { current }) if current > self.epoch => {
                // Only certified epochs are in the chain: a replica can move the client to a
                // newer one, never to one that does not exist. One the chain does not reach
                // yet is asked of the driver (ERR_NEED_CONFIG), which fetches and verifies it.
                if self.chain.ring(current).is_none() {
                    self.needs = self.needs.max(Some(current));
                    return Progress::Send(Vec::new());
                }
                self.move_to(current)
            }
            // Not an answer: the replica will serve the key once its transfer is in, and the
            // retransmission asks again.
            Some(Turned::Transferring | Turned::WrongEpoch { .. }) => Progress::Send(Vec::new()),
            _ => {
                let Some(slot) = self.view.slot_of(NodeId(from.0)) else {
                    return Progress::Send(Vec::new());
                };
                let progress = self.inner.on_reply(slot, reply);
                self.progress(progress)
            }
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, O::Request)> {
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

    fn learn(&mut self, chain: Arc<Chain>) -> Progress<Self> {
        let Some(wanted) = self.needs.take() else {
            return Progress::Send(Vec::new());
        };
        if chain.latest() <= self.chain.latest() {
            return Progress::Send(Vec::new());
        }
        self.chain = chain;
        // A replica may have named an epoch no one can prove (a faulty one lying): the round
        // moves only as far as the verified chain reaches.
        let target = wanted.min(self.chain.latest());
        if target <= self.epoch {
            return Progress::Send(Vec::new());
        }
        self.move_to(target)
    }
}
