//! Registers across epochs (Rosebud §4.5, §4.7, §4.8): the register core as a [`Kind`] of the
//! shared transfer engine ([`crate::transfer`]), so that a node holds one version per key for
//! every group the configuration puts it in, follows the certified configurations from epoch to
//! epoch and takes over the keys it becomes responsible for, and the client's register
//! operations follow it into newer epochs. Public-key objects are served this way.
//!
//! What is particular to registers: a node pulls every arc whose group changed as a set of
//! nodes (each new member holds whole versions, so the order of the group does not matter); a
//! pull keeps, of each listed key, the highest version whose signature verifies among `2f+1` old
//! members, with no write-back; a key every valid answer denies (a bogus id of a faulty lister)
//! is dropped; and a node that keeps a moved key because some member of its new group lacks it
//! offers that member its version, which it stores as a write-back. Versions live in the driver's
//! storage, kept in ring order so that an arc's keys are read as one or two ranges, and are
//! checked as they are read back (a bounded set remembers which verified).
//! docs/state-transfer.md has why each rule is there.

use super::{
    Judged, Policy, ReadOp, ReadOutcome, ReadPhase, Refusal, Refusals, Replies, Request, Response,
    ResponseBody, Server, Timestamp, WriteOp, WriteOutcome, WritePhase,
};
use crate::machine::{Access, Never, Progress, ReplicaStats};
use crate::transfer::{self, Decided, EpochHost, Kind, Recent, Resume, Route, Served, Turned};
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, Moved, Ring, RingPoint};
use bulwark_core::{ClientId, Epoch, GroupId, Key, NodeId, ServiceId, Slot, Time};
use bulwark_core::{Digest, wire};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

pub use crate::transfer::{
    DROP_BATCH_KEYS, DROP_GRACE_MILLIS, DROP_PENDING_MAX_MILLIS, DROP_RESWEEP_MAX_MILLIS,
    DROP_ROUNDS, DROP_START_MILLIS, DROP_TIMER, FETCH_WINDOW, LIST_PAGE_KEYS, LISTED_KEYS_MAX,
    PULL_RETRY_MAX_MILLIS, PULL_RETRY_MILLIS, Routed, TransferMutations, WAITING_MAX,
};

/// A node's replica of one register service across epochs.
pub type EpochServer<P> = EpochHost<Registers<P>>;
/// What nodes send each other to move registers between epochs.
pub type Transfer<P> = transfer::Transfer<<P as Policy>::Entry, Timestamp>;
/// A change to a node's durable registers.
pub type Change<P> = transfer::Change<<P as Policy>::Entry>;

/// What a node's registers read back from its driver's storage: every version the replica's
/// changes put there and no later change removed, durable or still on its way. Nothing per key
/// lives in the replica's memory, so a node holds as many keys as its disk does.
pub trait Versions<E> {
    /// The stored version of `key`; `None` also for one that does not decode (damage: the node
    /// lacks that version, as one that missed its write does).
    fn version(&self, key: &Key) -> Option<E>;
    /// The stored keys after `resume`, in ring order ([`transfer::ring_order`]), at most `limit`
    /// (none only at the end).
    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key>;
}

/// [`Versions`] kept in memory, for tests: apply every change the replica emits.
#[derive(Clone, Debug)]
pub struct MemoryVersions<E> {
    /// Every version, by ring position.
    pub entries: BTreeMap<(RingPoint, Key), E>,
}

impl<E> Default for MemoryVersions<E> {
    fn default() -> Self {
        MemoryVersions {
            entries: BTreeMap::new(),
        }
    }
}

impl<E: Clone> MemoryVersions<E> {
    /// Holding `versions`.
    pub fn holding(versions: impl IntoIterator<Item = (Key, E)>) -> Self {
        let entries = versions
            .into_iter()
            .map(|(key, entry)| ((RingPoint::of_key(key.as_bytes()), key), entry))
            .collect();
        MemoryVersions { entries }
    }

    /// Applies what a replica changed.
    pub fn apply(&mut self, changes: &[transfer::Change<E>]) {
        for change in changes {
            match change {
                transfer::Change::Put { key, entry } => {
                    let at = (RingPoint::of_key(key.as_bytes()), key.clone());
                    self.entries.insert(at, entry.clone());
                }
                transfer::Change::Drop { key } | transfer::Change::Remove { key, .. } => {
                    self.entries
                        .remove(&(RingPoint::of_key(key.as_bytes()), key.clone()));
                }
                transfer::Change::Entered(_) | transfer::Change::Pulled { .. } => {}
                transfer::Change::Own(never) => match *never {},
            }
        }
    }
}

impl<E: Clone> Versions<E> for MemoryVersions<E> {
    fn version(&self, key: &Key) -> Option<E> {
        let at = (RingPoint::of_key(key.as_bytes()), key.clone());
        self.entries.get(&at).cloned()
    }

    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key> {
        let start = match resume {
            Resume::Start => Bound::Unbounded,
            Resume::AfterPoint(point) => match point_after(point) {
                // No key is shorter than one byte: `\0` is the first a point can hold.
                Some(next) => match Key::new(vec![0]) {
                    Ok(first) => Bound::Included((next, first)),
                    Err(_) => unreachable!("a one-byte key is valid"),
                },
                None => return Vec::new(),
            },
            Resume::AfterKey(key) => {
                Bound::Excluded((RingPoint::of_key(key.as_bytes()), key.clone()))
            }
        };
        self.entries
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|((_, key), _)| key.clone())
            .collect()
    }
}

/// The point right after `point` on the ring, read as a 256-bit number; `None` after the last.
fn point_after(point: RingPoint) -> Option<RingPoint> {
    let mut bytes = point.0;
    for byte in bytes.iter_mut().rev() {
        let (raised, carried) = byte.overflowing_add(1);
        *byte = raised;
        if !carried {
            return Some(RingPoint(bytes));
        }
    }
    None
}

/// Versions whose signature a node remembers having checked, so that serving them again costs a
/// hash rather than a verification: each a key of up to a few hundred bytes and a digest.
pub const VERIFIED_MAX: usize = 16_384;

/// What a node holds of one register service: counts, and the versions it checked lately. The
/// versions themselves are in the driver's storage ([`Versions`]).
pub struct Registers<P: Policy> {
    f: usize,
    /// Checks and answers requests; its own map stays empty.
    server: Server<P>,
    /// Versions, by key and digest, whose signature verified since they last left the disk
    /// (a cell: answers to peers, which read through `&self`, remember too).
    verified: RefCell<Recent<(Key, Digest)>>,
    /// What this input changed so far (`None`: dropped), which the view shows only from the
    /// next input on: requests a finished pull held are served in the input that finished it,
    /// from what it stored.
    fresh: BTreeMap<Key, Option<P::Entry>>,
    stats: ReplicaStats,
}

/// What a node's registers held when it restarted, for its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Keys stored.
    pub keys: u64,
    /// Of which, keys whose version is a value.
    pub objects: u64,
    /// Their value bytes.
    pub bytes: u64,
}

impl<P: Policy> EpochHost<Registers<P>> {
    /// Node `me` at the genesis `ring`, holding nothing, checking versions with `context`.
    pub fn empty(me: NodeId, ring: Arc<Ring>, context: P::Context) -> Self {
        let kind = Registers::new(
            Server::with_context(Slot(me.0), ring.epoch(), GroupId(0), context),
            ring.params().f,
            Held::default(),
        );
        EpochHost::new(me, ring, kind)
    }

    /// Rebuilds a node from what it made durable: its versions stay in its storage (`held`
    /// counts them), the epochs it entered (each ring from `chain`) and the arcs whose pull
    /// finished. Unfinished pulls start again. A stored version is checked when it is first read
    /// back: one that fails (damage on disk) is served as missing, never as a version.
    pub fn restore(
        me: NodeId,
        chain: &Chain,
        context: P::Context,
        held: Held,
        entered: Epoch,
        pulled: &BTreeSet<(Epoch, RingArc)>,
    ) -> Self {
        let genesis = chain.genesis();
        let server = Server::with_context(Slot(me.0), genesis.epoch(), GroupId(0), context);
        let kind = Registers::new(server, genesis.params().f, held);
        EpochHost::resume(me, chain, kind, entered, pulled)
    }

    /// The stored version of `key`, if it checks.
    pub fn stored(&self, view: &dyn Versions<P::Entry>, key: &Key) -> Option<P::Entry> {
        self.kind().checked(view, key)
    }
}

impl<P: Policy> Registers<P> {
    fn new(server: Server<P>, f: usize, held: Held) -> Self {
        Registers {
            f,
            server,
            verified: RefCell::new(Recent::new(VERIFIED_MAX)),
            fresh: BTreeMap::new(),
            stats: ReplicaStats {
                objects: held.objects,
                keys: held.keys,
                versions: held.keys,
                bytes: held.bytes,
                ..ReplicaStats::default()
            },
        }
    }

    /// The version of `key` as stored, with what this input changed.
    fn read(&self, view: &dyn Versions<P::Entry>, key: &Key) -> Option<P::Entry> {
        match self.fresh.get(key) {
            Some(changed) => changed.clone(),
            None => view.version(key),
        }
    }

    fn digest(entry: &P::Entry) -> Digest {
        Digest::of("bulwark register version", &wire::encode(entry))
    }

    /// The stored version of `key` if its signature verifies (or verified since it was read
    /// from the disk), remembering that it did.
    fn checked(&self, view: &dyn Versions<P::Entry>, key: &Key) -> Option<P::Entry> {
        let entry = self.read(view, key)?;
        self.verifies(key, &entry).then_some(entry)
    }

    /// Whether `entry`, read back as the version of `key`, verifies; remembered when it does.
    fn verifies(&self, key: &Key, entry: &P::Entry) -> bool {
        let seen = (key.clone(), Self::digest(entry));
        if self.verified.borrow().contains(&seen) {
            return true;
        }
        let valid = P::judge(&self.server.context, GroupId(0), key, entry) == Judged::Valid;
        if valid {
            self.verified.borrow_mut().insert(seen);
        }
        valid
    }

    /// `stored`, the version of `key` read back, if it checks; one that does not is counted
    /// as damaged and served as missing.
    fn check(&mut self, key: &Key, stored: Option<&P::Entry>) -> Option<P::Entry> {
        let entry = stored?.clone();
        if !self.verifies(key, &entry) {
            self.stats.damaged += 1;
            return None;
        }
        Some(entry)
    }

    /// Counts `entry` replacing `previous` (what was stored, damaged or not), and remembers it
    /// as checked: every version stored was verified as it came in.
    fn stored(&mut self, key: &Key, previous: Option<&P::Entry>, entry: &P::Entry) {
        self.forget(previous);
        self.fresh.insert(key.clone(), Some(entry.clone()));
        self.stats.keys += 1;
        self.stats.versions += 1;
        if let Some(value) = P::value(entry) {
            self.stats.objects += 1;
            self.stats.bytes += value.len() as u64;
        }
        self.verified
            .borrow_mut()
            .insert((key.clone(), Self::digest(entry)));
    }

    /// Counts `previous` gone.
    fn forget(&mut self, previous: Option<&P::Entry>) {
        let Some(previous) = previous else {
            return;
        };
        self.stats.keys = self.stats.keys.saturating_sub(1);
        self.stats.versions = self.stats.versions.saturating_sub(1);
        if let Some(value) = P::value(previous) {
            self.stats.objects = self.stats.objects.saturating_sub(1);
            self.stats.bytes = self.stats.bytes.saturating_sub(value.len() as u64);
        }
    }
}

impl<P: Policy> Kind for Registers<P> {
    const SERVICE: ServiceId = P::SERVICE;
    const DROP_DENIED: bool = false;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Entry = P::Entry;
    type Version = Timestamp;
    type View = dyn Versions<P::Entry>;
    type Peer = Never;
    type Own = Never;

    fn f(&self) -> usize {
        self.f
    }

    fn route(request: &Request<P>) -> Route {
        Route {
            epoch: request.epoch,
            group: request.group,
            key: request.key.clone(),
        }
    }

    fn op(request: &Request<P>) -> u64 {
        request.op.0
    }

    fn point(key: &Key) -> Option<RingPoint> {
        Some(RingPoint::of_key(key.as_bytes()))
    }

    fn turned(request: &Request<P>, epoch: Epoch, why: Turned) -> Response<P> {
        let refusal = match why {
            Turned::WrongEpoch { current } => Refusal::WrongEpoch { current },
            Turned::WrongGroup => Refusal::WrongGroup,
            Turned::Transferring => Refusal::Transferring,
        };
        Response {
            op: request.op,
            epoch,
            body: ResponseBody::Refused(refusal),
        }
    }

    fn serve(
        &mut self,
        client: ClientId,
        access: Access,
        request: Request<P>,
        group: &GroupView,
        _slot: Slot,
        view: &Self::View,
    ) -> Served<Self> {
        self.server.epoch = request.epoch;
        self.server.group = group.id();
        let previous = self.read(view, &request.key);
        let current = self.check(&request.key, previous.as_ref());
        let handled =
            self.server
                .answer(client, access.write, access.read, request, current.as_ref());
        let mut changes = Vec::with_capacity(handled.changes.len());
        for super::Change::Put { key, entry } in handled.changes {
            self.stored(&key, previous.as_ref(), &entry);
            changes.push(transfer::Change::Put { key, entry });
        }
        Served {
            changes,
            reply: handled.reply,
            refused: handled.refused.map(|refusal| refusal.to_string()),
        }
    }

    fn must_pull(moved: &Moved) -> bool {
        moved.changed()
    }

    fn list(
        &self,
        view: &Self::View,
        arc: &RingArc,
        after: Option<&Key>,
        limit: usize,
    ) -> (Vec<Key>, bool) {
        transfer::list_arc(arc, after, limit, Self::point, |resume, wanted| {
            view.keys(resume, wanted)
        })
    }

    fn entry(&self, view: &Self::View, key: &Key) -> Option<P::Entry> {
        self.checked(view, key)
    }

    fn version(entry: &P::Entry) -> Timestamp {
        P::ts(entry)
    }

    fn value_bytes(entry: &P::Entry) -> u64 {
        P::value(entry).map_or(0, |value| value.len() as u64)
    }

    /// Pages through every stored key: a sweep's cost grows with what the node stores, its
    /// memory does not.
    fn outside(&self, view: &Self::View, ring: &Ring, me: NodeId) -> Vec<Key> {
        let mut found = Vec::new();
        let mut after: Option<Key> = None;
        loop {
            let resume = after.as_ref().map_or(Resume::Start, Resume::AfterKey);
            let page = view.keys(resume, OUTSIDE_PAGE_KEYS);
            let Some(last) = page.last().cloned() else {
                return found;
            };
            found.extend(
                page.into_iter()
                    .filter(|key| !ring.group_of(key.as_bytes()).contains(me)),
            );
            after = Some(last);
        }
    }

    fn judge(&self, group: &GroupView, key: &Key, entry: &P::Entry) -> Judged {
        P::judge(&self.server.context, group.id(), key, entry)
    }

    /// The highest validly signed version among `quorum` answers; nothing when every answer
    /// denies the key.
    fn decide(
        &self,
        _view: &Self::View,
        _key: &Key,
        _old: &GroupView,
        _new: &GroupView,
        answers: &[(Slot, Option<&P::Entry>)],
        quorum: usize,
    ) -> Decided<P::Entry> {
        if answers.len() < quorum {
            return Decided::Wait;
        }
        answers
            .iter()
            .filter_map(|(_, entry)| *entry)
            .max_by_key(|entry| P::ts(entry))
            .map_or(Decided::Absent, |entry| Decided::Take(entry.clone()))
    }

    fn adopt(&mut self, view: &Self::View, key: &Key, entry: &P::Entry) -> Vec<Change<P>> {
        let previous = self.read(view, key);
        let current = self.check(key, previous.as_ref());
        if current
            .as_ref()
            .is_some_and(|current| P::ts(current) >= P::ts(entry))
        {
            return Vec::new();
        }
        self.stored(key, previous.as_ref(), entry);
        vec![transfer::Change::Put {
            key: key.clone(),
            entry: entry.clone(),
        }]
    }

    fn remove(&mut self, view: &Self::View, key: &Key) -> Vec<Change<P>> {
        let previous = self.read(view, key);
        self.forget(previous.as_ref());
        self.fresh.insert(key.clone(), None);
        vec![transfer::Change::Drop { key: key.clone() }]
    }

    fn offers(&self) -> bool {
        true
    }

    fn begin(&mut self, _now: Time) {
        self.fresh.clear();
    }

    fn stats(&self) -> ReplicaStats {
        self.stats.clone()
    }
}

/// Keys read per page while looking for those outside the node's groups.
const OUTSIDE_PAGE_KEYS: usize = 1_024;

// ---------------------------------------------------------------------------------------------
// Client

/// Which refusals a register reply carries that are not answers.
fn turned<P: Policy>(reply: &Response<P>) -> Option<Turned> {
    match reply.refusal()? {
        Refusal::WrongEpoch { current } => Some(Turned::WrongEpoch { current: *current }),
        Refusal::Transferring => Some(Turned::Transferring),
        _ => None,
    }
}

impl<P: Policy> transfer::Rebase for WriteOp<P> {
    fn turned(reply: &Response<P>) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: WriteOutcome, view: &GroupView) -> WriteOutcome {
        for slot in &mut output.acknowledged_by {
            *slot = transfer::node_slot(view, *slot);
        }
        output
    }

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Progress<Self> {
        self.config.epoch = epoch;
        self.config.group = view.id();
        let n = self.config.n;
        match &mut self.phase {
            WritePhase::Clock(replies) => *replies = Replies::new(n),
            WritePhase::Store(replies, _) => *replies = Replies::new(n),
            WritePhase::Done => {}
        }
        self.refusals = Refusals::new(n);
        Progress::Send(self.retransmit())
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}

impl<P: Policy> transfer::Rebase for ReadOp<P> {
    fn turned(reply: &Response<P>) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: ReadOutcome, view: &GroupView) -> ReadOutcome {
        for slot in output.answered_by.iter_mut().chain(&mut output.forgers) {
            *slot = transfer::node_slot(view, *slot);
        }
        output
    }

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Progress<Self> {
        self.config.epoch = epoch;
        self.config.group = view.id();
        let n = self.config.n;
        match &mut self.phase {
            ReadPhase::Get(replies) => *replies = Replies::new(n),
            ReadPhase::WriteBack(replies, _) => *replies = Replies::new(n),
            ReadPhase::Done => {}
        }
        self.refusals = Refusals::new(n);
        Progress::Send(self.retransmit())
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}

/// A register operation on `key`, routed to its group of `epoch` in `chain`.
pub fn routed<O: transfer::Rebase>(
    inner: O,
    key: &Key,
    chain: Arc<Chain>,
    epoch: Epoch,
) -> Routed<O> {
    Routed::new(inner, RingPoint::of_key(key.as_bytes()), chain, epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Operation, Output, Progress, Replica};
    use crate::register::pubkey::{self, PubKey};
    use crate::round::OpId;
    use bulwark_core::Time;
    use bulwark_core::membership::PlacementParams;
    use bulwark_core::sign::SecretKey;
    use bytes::Bytes;

    type Stored = MemoryVersions<pubkey::Entry>;

    /// A tick, and the dropping of moved keys it finds due.
    fn tick(
        node: &mut EpochServer<PubKey>,
        view: &Stored,
        now: Time,
    ) -> Output<EpochServer<PubKey>> {
        let ticked = Replica::on_tick(node, now);
        let due = ticked.timers.iter().any(|(timer, _)| *timer == DROP_TIMER);
        let sends = ticked.sends;
        let mut output = if due {
            Replica::on_timer(node, now, DROP_TIMER, view)
        } else {
            Output::none()
        };
        output.sends.splice(0..0, sends);
        output
    }

    fn ring(epoch: u64, ids: std::ops::Range<u32>) -> Arc<Ring> {
        let ring = Ring::new(Epoch(epoch), PlacementParams::new(1), ids.map(NodeId));
        Arc::new(ring.expect("enough members"))
    }

    /// A write started in epoch 0 of `chain`.
    fn write(chain: Arc<Chain>) -> Routed<pubkey::WriteOp> {
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
        routed(inner, &id, chain, Epoch(0))
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

    /// Rights to read and write.
    const ANY: Access = Access {
        write: true,
        read: true,
    };

    /// Request `op` of `epoch` for `key` of `group`.
    fn request(
        op: u64,
        epoch: u64,
        group: GroupId,
        key: &Key,
        body: crate::register::RequestBody<PubKey>,
    ) -> Request<PubKey> {
        Request {
            op: OpId(op),
            epoch: Epoch(epoch),
            group,
            key: key.clone(),
            body,
        }
    }

    /// The epochs the requests of `sends` name.
    fn epochs(sends: &[super::super::Outbound<PubKey>]) -> BTreeSet<u64> {
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
        let Progress::Send(sends) = op.learn(longer) else {
            panic!("a write that revealed nothing goes on in the newer epoch");
        };
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
        let mut node = EpochServer::<PubKey>::empty(NodeId(0), first.clone(), ());
        let view = Stored::default();
        node.enter(ring(2, 0..4));
        let key = Key::new(b"k".to_vec()).unwrap();
        let group = node.ring().group_at(RingPoint::of_key(key.as_bytes())).id();
        let request = |epoch: u64, group: GroupId| {
            request(7, epoch, group, &key, crate::register::RequestBody::Get)
        };
        let behind = node.on_request(Time(0), ClientId(1), ANY, request(1, group), &view);
        assert_eq!(
            behind.reply.as_ref().and_then(Response::refusal),
            Some(&Refusal::WrongEpoch { current: Epoch(2) })
        );
        assert_eq!(behind.refused, None, "a client behind is not misbehaving");
        let lost = node.on_request(
            Time(0),
            ClientId(1),
            ANY,
            request(2, GroupId(group.0 ^ 1)),
            &view,
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
        assert!(matches!(op.learn(chain), Progress::Send(sends) if sends.is_empty()));
        assert_eq!(op.epoch(), Epoch(0));
    }

    /// What `versions` count as.
    fn counts(versions: &[(Key, pubkey::Entry)]) -> Held {
        let bytes = |entry: &pubkey::Entry| entry.value.as_ref().map_or(0, |v| v.len() as u64);
        Held {
            keys: versions.len() as u64,
            objects: versions.iter().filter(|(_, e)| e.value.is_some()).count() as u64,
            bytes: versions.iter().map(|(_, entry)| bytes(entry)).sum(),
        }
    }

    /// Node `me` in epoch 1 of `chain`, holding `versions`.
    fn holding(
        me: u32,
        chain: &Chain,
        versions: &[(Key, pubkey::Entry)],
    ) -> (EpochServer<PubKey>, Stored) {
        let pulled = chain
            .ring(Epoch(1))
            .expect("epoch 1")
            .arcs_since(chain.genesis())
            .into_iter()
            .map(|moved| (Epoch(1), moved.arc))
            .collect();
        let held = counts(versions);
        let node = EpochServer::restore(NodeId(me), chain, (), held, Epoch(1), &pulled);
        (node, Stored::holding(versions.iter().cloned()))
    }

    /// Node `me`, in the genesis of `chain` and never moved on, holding `versions`.
    fn genesis_holding(
        me: u32,
        chain: &Chain,
        versions: &[(Key, pubkey::Entry)],
    ) -> (EpochServer<PubKey>, Stored) {
        let genesis = Chain::new(vec![chain.genesis().clone()]);
        let held = counts(versions);
        let node = EpochServer::restore(NodeId(me), &genesis, (), held, Epoch(0), &BTreeSet::new());
        (node, Stored::holding(versions.iter().cloned()))
    }

    fn held(output: &Output<EpochServer<PubKey>>) -> Vec<(u32, Vec<Key>)> {
        output
            .sends
            .iter()
            .filter_map(|(to, message)| match message {
                transfer::Transfer::Held { versions, .. } => {
                    Some((to.0, versions.iter().map(|(key, _)| key.clone()).collect()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_old_member_hands_over_only_what_is_newer_than_the_version_the_asker_holds() {
        // Epoch 1 replaces the whole group: nodes 0-3 hand over to nodes 4-7.
        let chain = Chain::new(vec![ring(0, 0..4), ring(1, 4..8)]);
        let owner = Arc::new(SecretKey::from_seed(&[1; 32]));
        let key = pubkey::object_id(&owner.public_key());
        let version = |num: u64, value: &'static [u8]| {
            let ts = Timestamp {
                num,
                writer: ClientId(1),
                seq: num,
            };
            PubKey::make(
                &owner,
                GroupId(0),
                &key,
                ts,
                Some(Bytes::from_static(value)),
            )
        };
        let stored_version = version(2, b"v");
        let (mut old, stored) =
            genesis_holding(0, &chain, &[(key.clone(), stored_version.clone())]);
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let mut ask = |held: Option<&pubkey::Entry>| {
            let held = held.map(|entry| (PubKey::ts(entry), transfer::entry_digest(entry)));
            let fetch = transfer::Transfer::Fetch {
                epoch: Epoch(1),
                key: key.clone(),
                held,
            };
            let output = Replica::on_message(&mut old, Time(0), Slot(4), fetch, &stored);
            match &output.sends[..] {
                [(Slot(4), transfer::Transfer::NoNewer { .. })] => None,
                [(Slot(4), transfer::Transfer::Fetched { entry, .. })] => Some(entry.clone()),
                other => panic!("{other:?}"),
            }
        };
        let sent = Some(Some(stored_version.clone()));
        assert_eq!(
            ask(None),
            sent,
            "an asker that holds nothing is sent the version"
        );
        assert_eq!(ask(Some(&version(1, b"v"))), sent, "an older one: sent");
        assert_eq!(
            ask(Some(&stored_version)),
            None,
            "the same one: nothing newer"
        );
        assert_eq!(
            ask(Some(&version(3, b"v"))),
            None,
            "a newer one: nothing newer"
        );
        // Another entry under the same version (a writer that signed two) is sent: the asker
        // decides between them as between any two answers.
        assert_eq!(ask(Some(&version(2, b"w"))), sent);
    }

    #[test]
    fn a_moved_key_goes_once_2f_plus_1_members_of_its_new_group_hold_it_and_the_grace_is_over() {
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
        let (mut old, mut stored) = genesis_holding(0, &chain, &[(key.clone(), version(2))]);
        let ring1 = chain.ring(Epoch(1)).expect("epoch 1").clone();
        let _ = old.enter(ring1);
        assert_eq!(old.moved_keys(&stored).len(), 1);

        // Nothing is asked before the sweep is due, then every new member is asked.
        assert!(tick(&mut old, &stored, Time(0)).sends.is_empty());
        assert!(tick(&mut old, &stored, Time(100)).sends.is_empty());
        let asked = tick(&mut old, &stored, Time(DROP_START_MILLIS));
        let to: BTreeSet<u32> = asked.sends.iter().map(|(to, _)| to.0).collect();
        assert_eq!(to, BTreeSet::from([4, 5, 6, 7]));
        let (_, hold) = asked.sends[0].clone();

        // New members answer from what they hold: the same version or newer counts, older not.
        let mut newer = holding(4, &chain, &[(key.clone(), version(3))]);
        let mut same = holding(5, &chain, &[(key.clone(), version(2))]);
        let mut older = holding(6, &chain, &[(key.clone(), version(1))]);
        let mut answers = Vec::new();
        for (node, view) in [&mut newer, &mut same, &mut older] {
            let answer = Replica::on_message(node, Time(1), Slot(0), hold.clone(), &*view);
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
        let (mut behind, behind_view) = holding(7, &chain, &[(key.clone(), version(2))]);
        let stale_hold = transfer::Transfer::Hold {
            epoch: Epoch(0),
            versions: vec![(key.clone(), PubKey::ts(&version(2)))],
        };
        assert!(
            Replica::on_message(&mut behind, Time(1), Slot(0), stale_hold, &behind_view)
                .sends
                .is_empty()
        );

        let confirm = |old: &mut EpochServer<PubKey>, stored: &Stored, from: u32, num: u64| {
            let message = transfer::Transfer::Held {
                epoch: Epoch(1),
                versions: vec![(key.clone(), PubKey::ts(&version(num)))],
                denied: Vec::new(),
                pending: Vec::new(),
            };
            Replica::on_message(old, Time(2), Slot(from), message, stored)
        };
        // Two members, one of them twice, a node outside the group, and a member confirming an
        // older version than the one held (an answer to an earlier question): not enough.
        for (from, num) in [(4, 2), (5, 2), (4, 2), (2, 2), (6, 1)] {
            assert!(confirm(&mut old, &stored, from, num).changes.is_empty());
        }
        assert!(old.stored(&stored, &key).is_some());
        // The third member of the new group makes 2f+1, but the fourth may still be taking the
        // key over: the key waits for it.
        assert!(confirm(&mut old, &stored, 7, 2).changes.is_empty());
        // It says nothing: the key is dropped once the grace is over, not before.
        let quorum_at = 2;
        let mut now = DROP_START_MILLIS;
        let dropped = loop {
            now += PULL_RETRY_MILLIS;
            assert!(now < quorum_at + DROP_GRACE_MILLIS + 4 * DROP_RESWEEP_MAX_MILLIS);
            let output = tick(&mut old, &stored, Time(now));
            if !output.changes.is_empty() {
                break output;
            }
        };
        assert!(now >= quorum_at + DROP_GRACE_MILLIS, "dropped at {now}");
        assert_eq!(
            dropped.changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );
        stored.apply(&dropped.changes);
        assert!(old.stored(&stored, &key).is_none());
        assert!(old.moved_keys(&stored).is_empty());
        assert_eq!(Replica::stats(&old).collected, 1);
        // And it is listed and fetched as a key the node never held.
        let list = transfer::Transfer::List {
            epoch: Epoch(1),
            arc: chain
                .ring(Epoch(1))
                .expect("epoch 1")
                .arcs_since(chain.genesis())[0]
                .arc,
            after: None,
        };
        let listed = Replica::on_message(&mut old, Time(3), Slot(4), list, &stored);
        assert!(matches!(
            &listed.sends[..],
            [(_, transfer::Transfer::Listed { keys, .. })] if keys.is_empty()
        ));
    }

    #[test]
    fn a_moved_key_waits_for_a_member_still_pulling_it_and_goes_once_every_member_holds_it() {
        let chain = Chain::new(vec![ring(0, 0..4), ring(1, 4..8)]);
        let owner = Arc::new(SecretKey::from_seed(&[3; 32]));
        let key = pubkey::object_id(&owner.public_key());
        let ts = Timestamp {
            num: 4,
            writer: ClientId(1),
            seq: 4,
        };
        let entry = PubKey::make(&owner, GroupId(0), &key, ts, Some(Bytes::from_static(b"p")));
        let (mut old, stored) = genesis_holding(2, &chain, &[(key.clone(), entry.clone())]);
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let _ = tick(&mut old, &stored, Time(0));
        let _ = tick(&mut old, &stored, Time(DROP_START_MILLIS));
        let answer = |old: &mut EpochServer<PubKey>, now: u64, from: u32, holds: bool| {
            let message = transfer::Transfer::Held {
                epoch: Epoch(1),
                versions: if holds {
                    vec![(key.clone(), ts)]
                } else {
                    Vec::new()
                },
                denied: Vec::new(),
                pending: if holds { Vec::new() } else { vec![key.clone()] },
            };
            Replica::on_message(old, Time(now), Slot(from), message, &stored)
        };
        for from in [4, 5, 7] {
            assert!(
                answer(&mut old, DROP_START_MILLIS, from, true)
                    .changes
                    .is_empty()
            );
        }
        // Member 6 is still pulling, and says so each time it is asked: the key stays well
        // past the grace.
        let mut now = DROP_START_MILLIS;
        let _ = answer(&mut old, now, 6, false);
        while now < DROP_START_MILLIS + 3 * DROP_GRACE_MILLIS {
            now += PULL_RETRY_MILLIS;
            let output = tick(&mut old, &stored, Time(now));
            assert!(output.changes.is_empty(), "dropped at {now}");
            if output.sends.iter().any(|(to, message)| {
                to.0 == 6 && matches!(message, transfer::Transfer::Hold { .. })
            }) {
                assert!(answer(&mut old, now, 6, false).changes.is_empty());
            }
        }
        assert!(old.stored(&stored, &key).is_some());
        // Its pull is in: the last member's word drops the key at once.
        let asked = loop {
            now += PULL_RETRY_MILLIS;
            let output = tick(&mut old, &stored, Time(now));
            if output.sends.iter().any(|(to, _)| to.0 == 6) {
                break now;
            }
        };
        assert_eq!(
            answer(&mut old, asked, 6, true).changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );

        // A member that says it is pulling for ever keeps the key no longer than the cap.
        let (mut old, stored) = genesis_holding(3, &chain, &[(key.clone(), entry.clone())]);
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let _ = tick(&mut old, &stored, Time(0));
        let _ = tick(&mut old, &stored, Time(DROP_START_MILLIS));
        for from in [4, 5, 7] {
            let _ = answer(&mut old, DROP_START_MILLIS, from, true);
        }
        let mut now = DROP_START_MILLIS;
        let dropped = loop {
            now += PULL_RETRY_MILLIS;
            assert!(now <= DROP_START_MILLIS + 2 * DROP_PENDING_MAX_MILLIS);
            let mut output = tick(&mut old, &stored, Time(now));
            if output.sends.iter().any(|(to, _)| to.0 == 6) {
                output = output.and(answer(&mut old, now, 6, false));
            }
            if !output.changes.is_empty() {
                break output;
            }
        };
        assert!(
            now >= DROP_START_MILLIS + DROP_PENDING_MAX_MILLIS,
            "dropped at {now}"
        );
        assert_eq!(
            dropped.changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );
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
        let (mut old, stored) = genesis_holding(1, &chain, &[(key.clone(), entry.clone())]);
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let _ = tick(&mut old, &stored, Time(0));
        let _ = tick(&mut old, &stored, Time(DROP_START_MILLIS));
        // Members 4 and 5 hold it; 6 answers without it (the write reached only the old group);
        // 7 says nothing.
        let answer = |old: &mut EpochServer<PubKey>, from: u32, keys: Vec<Key>| {
            let message = transfer::Transfer::Held {
                epoch: Epoch(1),
                versions: keys.into_iter().map(|key| (key, ts)).collect(),
                denied: Vec::new(),
                pending: Vec::new(),
            };
            Replica::on_message(old, Time(1), Slot(from), message, &stored)
        };
        let _ = answer(&mut old, 4, vec![key.clone()]);
        let _ = answer(&mut old, 5, vec![key.clone()]);
        let _ = answer(&mut old, 6, Vec::new());
        // The rounds of asking again pass; the key is kept and offered to 6 only.
        let mut now = DROP_START_MILLIS;
        let mut offers = Vec::new();
        for _ in 0..20 {
            now += PULL_RETRY_MILLIS;
            let output = tick(&mut old, &stored, Time(now));
            offers.extend(
                output
                    .sends
                    .into_iter()
                    .filter_map(|(to, message)| match message {
                        transfer::Transfer::Offer { entry, .. } => Some((to.0, entry)),
                        _ => None,
                    }),
            );
            if !offers.is_empty() {
                break;
            }
        }
        assert_eq!(offers, vec![(6, entry.clone())]);
        assert!(old.stored(&stored, &key).is_some());

        // Member 6 stores the offered version; a forged one it refuses.
        let (mut lacking, lacking_view) = holding(6, &chain, &[]);
        let offer = transfer::Transfer::Offer {
            epoch: Epoch(1),
            key: key.clone(),
            entry: entry.clone(),
        };
        let taken = Replica::on_message(&mut lacking, Time(2), Slot(1), offer, &lacking_view);
        assert_eq!(
            taken.changes,
            vec![transfer::Change::Put {
                key: key.clone(),
                entry: entry.clone()
            }]
        );
        let mut forged = entry.clone();
        forged.ts.num += 1;
        let other = pubkey::object_id(&SecretKey::from_seed(&[3; 32]).public_key());
        let (mut fresh, fresh_view) = holding(6, &chain, &[]);
        let refused = Replica::on_message(
            &mut fresh,
            Time(2),
            Slot(1),
            transfer::Transfer::Offer {
                epoch: Epoch(1),
                key: other,
                entry: forged,
            },
            &fresh_view,
        );
        assert!(refused.changes.is_empty() && refused.refused.is_some());

        // The next sweep asks only 6 and 7 (4 and 5 still count).
        let mut asked = BTreeSet::new();
        for _ in 0..40 {
            now += PULL_RETRY_MILLIS;
            let output = tick(&mut old, &stored, Time(now));
            for (to, message) in output.sends {
                if let transfer::Transfer::Hold { .. } = message {
                    asked.insert(to.0);
                }
            }
            if !asked.is_empty() {
                break;
            }
        }
        assert_eq!(asked, BTreeSet::from([6, 7]));
        // 6's answer makes 2f+1; 7 may still be pulling, and its word drops the key at once.
        assert!(answer(&mut old, 6, vec![key.clone()]).changes.is_empty());
        let dropped = answer(&mut old, 7, vec![key.clone()]);
        assert_eq!(
            dropped.changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );
    }

    /// A version of the object of owner `seed`, numbered `num`.
    fn signed(seed: u8, num: u64) -> (Key, pubkey::Entry) {
        let owner = SecretKey::from_seed(&[seed; 32]);
        let key = pubkey::object_id(&owner.public_key());
        let ts = Timestamp {
            num,
            writer: ClientId(1),
            seq: num,
        };
        let entry = PubKey::make(
            &Arc::new(owner),
            GroupId(0),
            &key,
            ts,
            Some(Bytes::from(vec![seed; 10])),
        );
        (key, entry)
    }

    #[test]
    fn an_arc_is_listed_page_by_page_in_ring_order_from_storage() {
        // 300 objects on a node of a 4-node genesis; epoch 1 adds four nodes, so some arcs move.
        let chain = Chain::new(vec![ring(0, 0..4), ring(1, 0..8)]);
        let versions: Vec<(Key, pubkey::Entry)> = (0..=255u8)
            .chain(0..44)
            .enumerate()
            .map(|(at, seed)| signed(seed, at as u64 + 1))
            .collect();
        let (mut old, stored) = genesis_holding(0, &chain, &versions);
        let _ = old.enter(chain.ring(Epoch(1)).expect("epoch 1").clone());
        let moved = chain
            .ring(Epoch(1))
            .expect("epoch 1")
            .arcs_since(chain.genesis());
        assert!(moved.len() > 1, "the ring changed in several places");
        let mut most_pages = 0;
        let mut wrapped = false;
        for arc in moved.iter().map(|moved| moved.arc) {
            wrapped |= arc.after >= arc.upto;
            let mut listed = Vec::new();
            let mut after = None;
            let mut pages = 0;
            loop {
                let list = transfer::Transfer::List {
                    epoch: Epoch(1),
                    arc,
                    after: after.clone(),
                };
                let answer = Replica::on_message(&mut old, Time(1), Slot(5), list, &stored);
                let [(_, transfer::Transfer::Listed { keys, more, .. })] = &answer.sends[..] else {
                    panic!("one page answers a listing");
                };
                assert!(keys.len() <= LIST_PAGE_KEYS);
                listed.extend(keys.iter().cloned());
                pages += 1;
                after = keys.last().cloned();
                if !more {
                    break;
                }
            }
            let mut expected: Vec<Key> = stored
                .entries
                .keys()
                .filter(|(point, _)| arc.contains(*point))
                .map(|(_, key)| key.clone())
                .collect();
            expected.sort_by(|a, b| {
                transfer::ring_order::<Registers<PubKey>>(a)
                    .cmp(&transfer::ring_order::<Registers<PubKey>>(b))
            });
            assert_eq!(
                listed, expected,
                "every key on the arc, once, in ring order"
            );
            assert!(pages >= expected.len().div_ceil(LIST_PAGE_KEYS));
            most_pages = most_pages.max(pages);
        }
        assert!(most_pages > 1, "an arc took several pages");
        assert!(wrapped, "an arc wrapped past the ring's last point");
    }

    #[test]
    fn a_version_damaged_on_disk_is_served_as_missing_and_counted() {
        let chain = Chain::new(vec![ring(0, 0..4)]);
        let (key, entry) = signed(9, 4);
        let (mut node, mut stored) = genesis_holding(0, &chain, &[(key.clone(), entry.clone())]);
        assert_eq!(node.stored(&stored, &key), Some(entry.clone()));
        let group = chain
            .genesis()
            .group_at(RingPoint::of_key(key.as_bytes()))
            .id();
        let get = request(1, 0, group, &key, crate::register::RequestBody::Get);
        let served = node.on_request(Time(0), ClientId(2), ANY, get.clone(), &stored);
        assert_eq!(
            served.reply.map(|reply| reply.body),
            Some(ResponseBody::Value(Some(entry.clone())))
        );
        // A bit flips in the stored value.
        let mut damaged = entry.clone();
        if let Some(value) = damaged.value.as_mut() {
            let mut bytes = value.to_vec();
            bytes[0] ^= 1;
            *value = Bytes::from(bytes);
        }
        stored = Stored::holding([(key.clone(), damaged)]);
        let served = node.on_request(Time(1), ClientId(2), ANY, get, &stored);
        assert_eq!(
            served.reply.map(|reply| reply.body),
            Some(ResponseBody::Value(None)),
            "served as a node that missed the write"
        );
        assert_eq!(Replica::stats(&node).damaged, 1);
        assert_eq!(node.stored(&stored, &key), None);

        // A write of a newer version replaces it, and is counted once.
        let (_, newer) = signed(9, 5);
        let body = crate::register::RequestBody::Store(newer.clone());
        let store = request(2, 0, group, &key, body);
        let written = node.on_request(Time(2), ClientId(1), ANY, store, &stored);
        stored.apply(&written.changes);
        assert_eq!(node.stored(&stored, &key), Some(newer));
        let stats = Replica::stats(&node);
        assert_eq!((stats.keys, stats.objects, stats.bytes), (1, 1, 10));
    }
}
