//! M-PoWerStore registers across epochs (docs/state-transfer.md, "M-PoWerStore registers"): the
//! [`transfer::Kind`] under which a node serves registers on the certified ring, and takes each
//! key whose group changed over into its new incarnation by [`TakeOver`]s, a read of the
//! previous incarnation and a confirmation among the new one's members, instead of from one
//! FETCH answer per old member (a version's MAC vector binds its incarnation, so no member of the
//! next could check one handed to it).
//!
//! A node keeps one [`Server`] per incarnation it is a member of, each over its own part of the
//! node's storage ([`Stores`]). Client requests of the current epoch go to the server of the
//! key's current incarnation; [`Peer`] messages carry the take-overs' requests, a read of the
//! previous incarnation's servers or a HOLD to the new one's, and their answers. Who answers
//! what:
//!
//! - A read of an incarnation as of epoch `e` is answered only by a member that has entered an
//!   epoch after `e` (so no write of `e` reaches it any more), whose own state of the key as of
//!   `e` is complete (no take-over into `e` or before is unfinished there), and that is not
//!   itself taking the key into that incarnation: what it answers is what it serves.
//! - A HOLD is answered by any member with its `lc`; a member asked above its `lc` by another
//!   member of the key's incarnation reads the previous incarnation again (a new take-over, the
//!   key held back from clients if the read carries in a newer version, until it is confirmed).
//!
//! Dropping the old incarnation (step 6 of the design) is not built: an old incarnation's server
//! and storage stay, and nothing is offered or dropped.

use super::server::{Change as ServerChange, Fragments, MemoryFragments, Server, ServerConfig};
use super::server::{ServerLogic, StoredKey};
use super::takeover::{Sends, Side, TakeOutcome, TakeOver, TakeStep};
use super::{ClientConfig, ClientMutations, OpId, Refusal, Request, RequestBody, Response};
use super::{ResponseBody, ServerKeys, Timestamp, cmp_ts};
use crate::machine::{Access, Never, ReplicaStats};
use crate::round::Judged;
use crate::transfer::{
    Change, Decided, Kind, KindChange, PULL_RETRY_MAX_MILLIS, PULL_RETRY_MILLIS, Resume, Route,
    Served, Taken, Turned, keys_after, list_arc,
};
use bulwark_core::erasure::ErasureCodec;
use bulwark_core::membership::{
    Arc as RingArc, Chain, GroupView, Incarnation, Moved, Ring, RingPoint,
};
use bulwark_core::{ClientId, Epoch, Key, NodeId, ServiceId, Slot, Time};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// A durable change of the registers' own.
#[derive(Clone, Debug, PartialEq)]
pub enum Stored {
    /// A change to the storage of one incarnation's server.
    Server {
        /// Whose storage.
        incarnation: Incarnation,
        /// The server's change.
        change: ServerChange,
    },
}

/// What nodes send each other in take-overs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Peer {
    /// A take-over's request: a read round of the key's previous incarnation, or a HOLD to the
    /// new one.
    Ask {
        /// Which incarnation it goes to.
        side: Side,
        /// The request, naming the epoch and group the incarnation was asked as.
        request: Request,
    },
    /// The answer to an [`Peer::Ask`].
    Answer {
        /// As asked.
        side: Side,
        /// The key asked about.
        key: Key,
        /// The answer.
        response: Response,
    },
}

/// A node's storage of registers, read back: one store per incarnation, pending changes
/// included (see [`Fragments`]).
pub trait Stores {
    /// `key`'s `lc` and `Hist` metadata in `incarnation`'s store.
    fn stored_key(&self, incarnation: &Incarnation, key: &Key) -> StoredKey;
    /// The fragment of `Hist[ts]` of `key` in `incarnation`'s store.
    fn fragment(&self, incarnation: &Incarnation, key: &Key, ts: &Timestamp) -> Option<Bytes>;
    /// Keys with any state in any incarnation, in ring order
    /// ([`crate::transfer::ring_order`]) after `resume`: at most `limit`, none only at the end.
    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key>;
}

/// One incarnation's store, as its server reads it.
struct Scoped<'a> {
    stores: &'a dyn Stores,
    incarnation: Incarnation,
}

impl Fragments for Scoped<'_> {
    fn stored_key(&self, key: &Key) -> StoredKey {
        self.stores.stored_key(&self.incarnation, key)
    }

    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        self.stores.fragment(&self.incarnation, key, ts)
    }
}

fn scoped(stores: &dyn Stores, incarnation: Incarnation) -> Scoped<'_> {
    Scoped {
        stores,
        incarnation,
    }
}

/// [`Stores`] in memory, for tests: apply every change the node makes.
#[derive(Default)]
pub struct MemoryStores {
    /// Per incarnation.
    pub stores: HashMap<Incarnation, MemoryFragments>,
}

impl MemoryStores {
    /// Applies one change, as a driver's storage would.
    pub fn apply(&mut self, change: &KindChange<Registers>) {
        if let Change::Own(Stored::Server {
            incarnation,
            change,
        }) = change
        {
            self.stores.entry(*incarnation).or_default().apply(change);
        }
    }
}

impl Stores for MemoryStores {
    fn stored_key(&self, incarnation: &Incarnation, key: &Key) -> StoredKey {
        self.stores
            .get(incarnation)
            .map(|store| store.stored_key(key))
            .unwrap_or_default()
    }

    fn fragment(&self, incarnation: &Incarnation, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        self.stores.get(incarnation)?.fragment(key, ts)
    }

    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key> {
        let mut keys = BTreeSet::new();
        for store in self.stores.values() {
            keys.extend(store.lcs.keys().cloned());
            keys.extend(store.entries.keys().map(|(key, _)| key.clone()));
        }
        keys_after::<Registers>(keys, resume, limit)
    }
}

/// Reads again (take-overs no pull waits for) a node runs at once; a HOLD above `lc` that finds
/// as many running starts none (its asker asks again).
pub const READS_AGAIN_MAX: usize = 64;

/// One running take-over of a key.
struct Taking {
    take: TakeOver,
    /// The epochs whose pulls wait for the key (a first take-over; more than one when the node
    /// entered the next epoch before the take-over of the last ended, and the key moved again).
    /// None for a read again.
    pulls: BTreeSet<Epoch>,
    /// The previous incarnation's members, in slot order.
    old: GroupView,
    /// The new one's.
    new: GroupView,
    /// When the take-over's timer fires next.
    timeout_at: Option<Time>,
}

/// A key's incarnation in an epoch, and the one before it.
struct Incarnations {
    previous: ClientConfig,
    old: GroupView,
    new: ClientConfig,
    view: GroupView,
}

/// A node's M-PoWerStore registers across epochs.
pub struct Registers {
    me: NodeId,
    f: usize,
    keys: ServerKeys,
    codec: Arc<dyn ErasureCodec>,
    /// The rings entered, from the genesis on.
    chain: Chain,
    servers: HashMap<Incarnation, Server>,
    /// By key and the incarnation taken into: a node may be taking a key into two incarnations
    /// at once (a read again into one while it takes the key into the next), and each waits on
    /// answers the other does not.
    takes: BTreeMap<(Key, Incarnation), Taking>,
    /// Take-overs that failed (a version that did not fit), started again at the time, into the
    /// incarnation of the epoch, with the pulls that wait for them.
    again: BTreeMap<(Key, Incarnation), (Time, Epoch, BTreeSet<Epoch>)>,
    /// Keys served before, by incarnation, whose read again carried in a newer version: held back
    /// until it is confirmed.
    closed: BTreeSet<(Key, Incarnation)>,
    /// The time of the input being handled.
    now: Time,
    next_op: u64,
}

impl Registers {
    /// Node `me`'s registers at the genesis `ring`, its servers sharing `keys` with the writers.
    pub fn new(
        me: NodeId,
        ring: Arc<Ring>,
        keys: ServerKeys,
        codec: Arc<dyn ErasureCodec>,
    ) -> Registers {
        Registers {
            me,
            f: ring.params().f,
            keys,
            codec,
            chain: Chain::new(vec![ring]),
            servers: HashMap::new(),
            takes: BTreeMap::new(),
            again: BTreeMap::new(),
            closed: BTreeSet::new(),
            now: Time(0),
            next_op: 0,
        }
    }

    /// Take-overs running.
    pub fn running(&self) -> usize {
        self.takes.len()
    }

    /// The server of `incarnation`, whose members are `view`'s, made when first asked for.
    fn server(&mut self, incarnation: Incarnation, view: &GroupView) -> Option<&mut Server> {
        let slot = view.slot_of(self.me)?;
        let (keys, f) = (&self.keys, self.f);
        let server = self.servers.entry(incarnation).or_insert_with(|| {
            let config = ServerConfig {
                group: view.id(),
                incarnation,
                ..ServerConfig::new(slot, f)
            };
            Server::new(config, keys.clone())
        });
        debug_assert_eq!(server.config().node, slot, "an incarnation keeps its order");
        Some(server)
    }

    /// The key's incarnation in `epoch` and the one before it, when its group changed since the
    /// genesis; `None` when the key has had one incarnation from the genesis on.
    fn incarnations(&self, epoch: Epoch, point: RingPoint) -> Option<Incarnations> {
        let (view, incarnation) = self.chain.incarnation(epoch, point)?;
        let mut since = epoch;
        while since > self.chain.genesis().epoch() {
            let before = Epoch(since.0 - 1);
            match self.chain.ring(before) {
                Some(ring) if ring.group_at(point).members() == view.members() => since = before,
                _ => break,
            }
        }
        if since == self.chain.genesis().epoch() {
            return None;
        }
        let last = Epoch(since.0 - 1);
        let (old, previous) = self.chain.incarnation(last, point)?;
        let config = |epoch: Epoch, view: &GroupView, incarnation: Incarnation| ClientConfig {
            n: view.len(),
            f: self.f,
            epoch,
            group: view.id(),
            incarnation,
            one_round: true,
            mutations: ClientMutations::default(),
        };
        Some(Incarnations {
            previous: config(last, &old, previous),
            old,
            new: config(epoch, &view, incarnation),
            view,
        })
    }

    /// Starts taking `key` over into its incarnation of `epoch`, for the pulls of `pulls` (none:
    /// as a read again). A take-over it replaces hands its pulls on.
    fn start(
        &mut self,
        key: &Key,
        epoch: Epoch,
        mut pulls: BTreeSet<Epoch>,
        stores: &dyn Stores,
    ) -> Taken<Self> {
        let point = RingPoint::of_key(key.as_bytes());
        let decided = |pulls: BTreeSet<Epoch>| {
            let mut taken = Taken::none();
            taken.decided = pulls
                .into_iter()
                .map(|epoch| (epoch, key.clone()))
                .collect();
            taken
        };
        let Some(found) = self.incarnations(epoch, point) else {
            // One incarnation from the genesis on: nothing to take over.
            return decided(pulls);
        };
        let Some(me) = found.view.slot_of(self.me) else {
            // Not a member there: no pull of this node waits for it.
            return decided(pulls);
        };
        if found.previous.n != found.new.n {
            // A change of `f` between configurations is not supported: the key stays held back.
            let mut taken = Taken::none();
            taken.refused = Some(format!("{key} moved between groups of different sizes"));
            return taken;
        }
        let into = found.new.incarnation;
        let at = (key.clone(), into);
        if let Some(replaced) = self.takes.remove(&at) {
            pulls.extend(replaced.pulls);
        }
        if let Some((_, _, waiting)) = self.again.remove(&at) {
            pulls.extend(waiting);
        }
        let now = self.now;
        let held = match self.server(into, &found.view) {
            Some(server) => server.held(now, key, &scoped(stores, into)),
            None => return decided(pulls),
        };
        // Fresh across restarts too: a late answer to a take-over before the restart must not
        // count in one after it.
        self.next_op = (self.next_op + 1).max(self.now.0 << 16);
        let op = OpId(self.next_op);
        let mut take = TakeOver::new(
            found.previous,
            found.new,
            me,
            self.codec.clone(),
            key.clone(),
            op,
            held,
        );
        let sends = take.start();
        let taking = Taking {
            take,
            pulls,
            old: found.old,
            new: found.view,
            timeout_at: None,
        };
        let mut taken = Taken::none();
        taken.sends = addressed(&taking, sends);
        self.takes.insert(at, taking);
        taken
    }

    /// What the step of the take-over at `at` (its key and the incarnation taken into) makes:
    /// its messages, its carry, its end.
    fn step(
        &mut self,
        at: &(Key, Incarnation),
        step: TakeStep,
        stores: &dyn Stores,
    ) -> Taken<Self> {
        let (key, into) = (&at.0, at.1);
        let mut taken = Taken::none();
        match step {
            TakeStep::Send(sends) => {
                if let Some(taking) = self.takes.get(at) {
                    taken.sends = addressed(taking, sends);
                }
            }
            TakeStep::Carry { carried, then } => {
                let Some(taking) = self.takes.get(at) else {
                    return taken;
                };
                let new = taking.new.clone();
                let bytes = carried.fragment.len() as u64;
                let now = self.now;
                let Some(server) = self.server(into, &new) else {
                    return taken;
                };
                match server.carry(now, key, carried, &scoped(stores, into)) {
                    Ok(changes) => {
                        if changes
                            .iter()
                            .any(|change| matches!(change, ServerChange::PutHist { .. }))
                        {
                            taken.moved = (1, bytes);
                        }
                        // A version newer than the one served waits for its own confirmation.
                        if changes
                            .iter()
                            .any(|change| matches!(change, ServerChange::SetLc { .. }))
                        {
                            self.closed.insert(at.clone());
                        }
                        taken.changes = own(into, changes);
                        if let Some(taking) = self.takes.get(at) {
                            taken.sends = addressed(taking, then);
                        }
                    }
                    // Holding nothing new, its HOLDs would name a version it lacks. Only a faulty
                    // writer's cross-checksum does not fit: no node answering is to blame.
                    Err(_) => self.failed(at),
                }
            }
            TakeStep::Done(Ok(TakeOutcome::Confirmed { .. })) => {
                let Some(taking) = self.takes.remove(at) else {
                    return taken;
                };
                taken.decided = taking.pulls.into_iter().map(|e| (e, key.clone())).collect();
                if self.closed.remove(at) {
                    taken.opened.push(key.clone());
                }
            }
            TakeStep::Done(Ok(TakeOutcome::Stalled { .. })) => {
                if let Some(taking) = self.takes.remove(at) {
                    let epoch = taking.take_epoch();
                    return self.start(key, epoch, taking.pulls, stores);
                }
            }
            TakeStep::Done(Err(_)) => self.failed(at),
        }
        // A read again that carried in nothing newer than `lc` leaves the key as it was: the
        // version served stays confirmed, and nobody waits for this take-over.
        let idle = self.takes.get(at).is_some_and(|taking| {
            taking.pulls.is_empty() && taking.take.confirming() && !self.closed.contains(at)
        });
        if let Some(taking) = idle.then(|| self.takes.remove(at)).flatten() {
            let op = taking.take.op();
            taken.sends.retain(|(_, message)| {
                !matches!(message, Peer::Ask { side: Side::New, request } if request.op == op)
            });
        }
        taken
    }

    /// The take-over at `at` ended without a version to serve: another starts later.
    fn failed(&mut self, at: &(Key, Incarnation)) {
        if let Some(taking) = self.takes.remove(at) {
            let when = Time(self.now.0 + PULL_RETRY_MAX_MILLIS);
            self.again
                .insert(at.clone(), (when, taking.take_epoch(), taking.pulls));
        }
    }

    /// A take-over's request from `from`, answered as this node's server of the incarnation asked
    /// answers it.
    fn ask(
        &mut self,
        from: NodeId,
        side: Side,
        request: Request,
        stores: &dyn Stores,
        settled: &dyn Fn(Epoch, &Key) -> bool,
    ) -> Taken<Self> {
        let key = request.key.clone();
        let refused = |why: &str| {
            let mut taken = Taken::none();
            taken.refused = Some(format!("node {} asked {why}", from.0));
            taken
        };
        if !key.is_valid() {
            return refused("about a malformed key");
        }
        let point = RingPoint::of_key(key.as_bytes());
        let Some((view, incarnation)) = self.chain.incarnation(request.epoch, point) else {
            // An epoch this node has not entered: the asker asks again.
            return Taken::none();
        };
        let mut asked = None;
        match (side, &request.body) {
            (
                Side::Previous,
                RequestBody::Collect { .. }
                | RequestBody::Filter { .. }
                | RequestBody::Repair { .. },
            ) => {
                // Only a take-over reads an incarnation, as of its last epoch, by a member of the
                // next one, and only once this node has left that epoch (the next one's ring is
                // known here only then): what it answers can no longer change under a client.
                let next = self.chain.incarnation(Epoch(request.epoch.0 + 1), point);
                let Some((group, next)) = next else {
                    return Taken::none();
                };
                if next == incarnation || !group.contains(from) {
                    return refused("to read an incarnation it does not take the key over from");
                }
                let taking = self.takes.contains_key(&(key.clone(), incarnation));
                if taking || !settled(request.epoch, &key) {
                    return Taken::none();
                }
            }
            (Side::New, RequestBody::Hold { ts }) => asked = Some(*ts),
            _ => return refused("a take-over round it does not run"),
        }
        let now = self.now;
        let fragments = scoped(stores, incarnation);
        let Some(server) = self.server(incarnation, &view) else {
            return refused("a group this node is not in");
        };
        server.serve_as(request.epoch, view.id());
        let epoch = request.epoch;
        let reader = Access {
            read: true,
            write: false,
        };
        let handled = server.handle(now, ClientId(from.0), reader, request, &fragments);
        let mut taken = Taken::none();
        taken.changes = own(incarnation, handled.changes);
        let Some(response) = handled.reply else {
            return taken;
        };
        // Asked to hold more than it does by a member of the key's incarnation: read the
        // previous one again.
        let lc = match &response.body {
            ResponseBody::HoldAck { lc_ts } => *lc_ts,
            _ => None,
        };
        let behind =
            asked.is_some_and(|asked| cmp_ts(asked.as_ref(), lc.as_ref()) == Ordering::Greater);
        let answer = Peer::Answer {
            side,
            key: key.clone(),
            response,
        };
        taken.sends.push((from, answer));
        let reading = self.takes.contains_key(&(key.clone(), incarnation));
        let reads_again = self.takes.values().filter(|t| t.pulls.is_empty()).count();
        // Bounded: a faulty member's HOLDs for made-up keys cost reads, never unbounded work.
        if behind
            && view.contains(from)
            && from != self.me
            && !reading
            && reads_again < READS_AGAIN_MAX
        {
            taken = taken.and(self.start(&key, epoch, BTreeSet::new(), stores));
        }
        taken
    }

    /// An answer to one of this node's take-overs.
    fn answer(
        &mut self,
        from: NodeId,
        side: Side,
        key: Key,
        response: Response,
        stores: &dyn Stores,
    ) -> Taken<Self> {
        // The take-over the answer is for: its operation id names it among the key's.
        let op = response.op;
        let found = self
            .takes
            .iter_mut()
            .find(|((taken, _), taking)| *taken == key && taking.take.op() == op);
        let Some((at, taking)) = found else {
            return Taken::none();
        };
        let at = at.clone();
        let members = match side {
            Side::Previous => &taking.old,
            Side::New => &taking.new,
        };
        let Some(slot) = members.slot_of(from) else {
            let mut taken = Taken::none();
            taken.refused = Some(format!("node {} answered for a group it is not in", from.0));
            return taken;
        };
        let step = taking.take.on_response(side, slot, response);
        self.step(&at, step, stores)
    }
}

impl Taking {
    /// The epoch of the incarnation taken into, as its HOLDs name it.
    fn take_epoch(&self) -> Epoch {
        self.take.epoch()
    }
}

/// A take-over's requests, to the nodes of the slots they name.
fn addressed(taking: &Taking, sends: Sends) -> Vec<(NodeId, Peer)> {
    sends
        .into_iter()
        .filter_map(|(side, slot, request)| {
            let members = match side {
                Side::Previous => &taking.old,
                Side::New => &taking.new,
            };
            Some((members.node(slot)?, Peer::Ask { side, request }))
        })
        .collect()
}

fn own(incarnation: Incarnation, changes: Vec<ServerChange>) -> Vec<KindChange<Registers>> {
    changes
        .into_iter()
        .map(|change| {
            Change::Own(Stored::Server {
                incarnation,
                change,
            })
        })
        .collect()
}

impl Kind for Registers {
    const SERVICE: ServiceId = ServiceId::POWERSTORE;
    // Nothing is dropped or offered until the old incarnation can be (step 6).
    const DROP_DENIED: bool = false;
    const TAKES: bool = true;
    // A carried version's fragment is read back from storage when served.
    const IN_STORAGE: bool = true;
    type Request = Request;
    type Reply = Response;
    type Entry = Never;
    type Version = ();
    type View = dyn Stores;
    type Peer = Peer;
    type Own = Stored;

    fn f(&self) -> usize {
        self.f
    }

    fn route(request: &Request) -> Route {
        Route {
            epoch: request.epoch,
            group: request.group,
            key: request.key.clone(),
        }
    }

    fn op(request: &Request) -> u64 {
        request.op.0
    }

    fn point(key: &Key) -> Option<RingPoint> {
        Some(RingPoint::of_key(key.as_bytes()))
    }

    fn turned(request: &Request, _epoch: Epoch, why: Turned) -> Response {
        let refusal = match why {
            Turned::WrongEpoch { current } => Refusal::WrongEpoch { current },
            Turned::WrongGroup => Refusal::WrongGroup,
            Turned::Transferring => Refusal::Transferring,
        };
        Response {
            op: request.op,
            attempt: request.attempt,
            body: ResponseBody::Refused(refusal),
        }
    }

    fn serve(
        &mut self,
        client: ClientId,
        access: Access,
        request: Request,
        group: &GroupView,
        _slot: Slot,
        stores: &dyn Stores,
    ) -> Served<Self> {
        let point = RingPoint::of_key(request.key.as_bytes());
        let epoch = request.epoch;
        let turned = |request: &Request| Served {
            changes: Vec::new(),
            reply: Self::turned(request, epoch, Turned::WrongGroup),
            refused: Some(Turned::WrongGroup.to_string()),
        };
        let Some((view, incarnation)) = self.chain.incarnation(epoch, point) else {
            return turned(&request);
        };
        let now = self.now;
        let fragments = scoped(stores, incarnation);
        let Some(server) = self.server(incarnation, &view) else {
            return turned(&request);
        };
        server.serve_as(epoch, group.id());
        let (op, attempt) = (request.op, request.attempt);
        let handled = server.handle(now, client, access, request, &fragments);
        // Only a faulty server leaves a request unanswered; this one is correct.
        debug_assert!(handled.reply.is_some(), "a correct server answers");
        let reply = handled.reply.unwrap_or_else(|| Response {
            op,
            attempt,
            body: ResponseBody::Refused(Refusal::Malformed("unanswered".to_string())),
        });
        Served {
            changes: own(incarnation, handled.changes),
            reply,
            refused: handled.refused.map(|refusal| refusal.to_string()),
        }
    }

    fn must_pull(moved: &Moved) -> bool {
        moved.old.members() != moved.new.members()
    }

    fn list(
        &self,
        stores: &dyn Stores,
        arc: &RingArc,
        after: Option<&Key>,
        limit: usize,
    ) -> (Vec<Key>, bool) {
        list_arc(arc, after, limit, Self::point, |resume, limit| {
            stores.keys(resume, limit)
        })
    }

    fn entered(&mut self, ring: &Arc<Ring>) {
        self.chain.push(ring.clone());
    }

    fn begin(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    fn entry(&self, _stores: &dyn Stores, _key: &Key) -> Option<Never> {
        None
    }

    fn version(entry: &Never) {
        match *entry {}
    }

    fn value_bytes(entry: &Never) -> u64 {
        match *entry {}
    }

    fn outside(&self, _stores: &dyn Stores, _ring: &Ring, _me: NodeId) -> Vec<Key> {
        Vec::new()
    }

    fn judge(&self, _group: &GroupView, _key: &Key, entry: &Never) -> Judged {
        match *entry {}
    }

    fn decide(
        &self,
        _stores: &dyn Stores,
        _key: &Key,
        _old: &GroupView,
        _new: &GroupView,
        _answers: &[(Slot, Option<&Never>)],
        _quorum: usize,
    ) -> Decided<Never> {
        Decided::Wait
    }

    fn adopt(&mut self, _stores: &dyn Stores, _key: &Key, entry: &Never) -> Vec<KindChange<Self>> {
        match *entry {}
    }

    fn remove(&mut self, _stores: &dyn Stores, _key: &Key) -> Vec<KindChange<Self>> {
        Vec::new()
    }

    fn offers(&self) -> bool {
        false
    }

    fn stats(&self) -> ReplicaStats {
        let mut stats = ReplicaStats::default();
        for server in self.servers.values() {
            let each = ServerLogic::stats(server);
            stats.objects += each.objects;
            stats.keys += each.keys;
            stats.versions += each.versions;
            stats.bytes += each.fragment_bytes;
            stats.collected += each.collected;
            stats.damaged += each.damaged_fragments;
        }
        stats
    }

    fn take(
        &mut self,
        stores: &dyn Stores,
        epoch: Epoch,
        key: &Key,
        _old: &GroupView,
        _new: &GroupView,
    ) -> Taken<Self> {
        self.start(key, epoch, BTreeSet::from([epoch]), stores)
    }

    fn on_peer(
        &mut self,
        now: Time,
        from: NodeId,
        _epoch: Epoch,
        message: Peer,
        stores: &dyn Stores,
        settled: &dyn Fn(Epoch, &Key) -> bool,
    ) -> Taken<Self> {
        self.now = self.now.max(now);
        match message {
            Peer::Ask { side, request } => self.ask(from, side, request, stores, settled),
            Peer::Answer {
                side,
                key,
                response,
            } => self.answer(from, side, key, response, stores),
        }
    }

    fn taking(&self) -> bool {
        !self.takes.is_empty() || !self.again.is_empty()
    }

    fn tick(&mut self, now: Time, stores: &dyn Stores) -> Taken<Self> {
        self.now = self.now.max(now);
        let mut taken = Taken::none();
        let due: Vec<(Key, Incarnation)> = self
            .takes
            .iter_mut()
            .filter_map(|(at, taking)| match taking.timeout_at {
                Some(when) if when <= now => Some(at.clone()),
                Some(_) => None,
                None => {
                    taking.timeout_at = Some(Time(now.0 + PULL_RETRY_MILLIS));
                    None
                }
            })
            .collect();
        for at in due {
            let Some(taking) = self.takes.get_mut(&at) else {
                continue;
            };
            taking.timeout_at = Some(Time(now.0 + PULL_RETRY_MILLIS));
            let step = taking.take.on_timeout();
            taken = taken.and(self.step(&at, step, stores));
        }
        let due: Vec<(Key, Incarnation)> = self
            .again
            .iter()
            .filter(|(_, (when, _, _))| *when <= now)
            .map(|(at, _)| at.clone())
            .collect();
        for at in due {
            if let Some((_, epoch, pulls)) = self.again.remove(&at) {
                taken = taken.and(self.start(&at.0, epoch, pulls, stores));
            }
        }
        taken
    }

    fn closed(&self, key: &Key) -> bool {
        let point = RingPoint::of_key(key.as_bytes());
        self.chain
            .incarnation(self.chain.latest(), point)
            .is_some_and(|(_, incarnation)| self.closed.contains(&(key.clone(), incarnation)))
    }
}
