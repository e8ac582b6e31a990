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
//! offers that member its version, which it stores as a write-back. Versions live in memory.
//! docs/state-transfer.md has why each rule is there.

use super::{
    Judged, Outbound, Policy, ReadOp, ReadOutcome, ReadPhase, Refusal, Refusals, Replies, Request,
    Response, ResponseBody, Server, Timestamp, WriteOp, WriteOutcome, WritePhase,
};
use crate::machine::{Access, Replica, ReplicaStats};
use crate::transfer::{self, Decided, EpochHost, Kind, Route, Served, Turned};
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, Moved, Ring, RingPoint};
use bulwark_core::{ClientId, Epoch, GroupId, Key, NodeId, ServiceId, Slot};
use std::collections::BTreeSet;
use std::sync::Arc;

pub use crate::transfer::{
    DROP_BATCH_KEYS, DROP_RESWEEP_MAX_MILLIS, DROP_ROUNDS, DROP_START_MILLIS, DROP_TIMER,
    FETCH_WINDOW, LIST_PAGE_KEYS, LISTED_KEYS_MAX, PULL_RETRY_MAX_MILLIS, PULL_RETRY_MILLIS,
    Routed, TransferMutations, WAITING_MAX,
};

/// A node's replica of one register service across epochs.
pub type EpochServer<P> = EpochHost<Registers<P>>;
/// What nodes send each other to move registers between epochs.
pub type Transfer<P> = transfer::Transfer<<P as Policy>::Entry, Timestamp>;
/// A change to a node's durable registers.
pub type Change<P> = transfer::Change<<P as Policy>::Entry>;

/// What a node holds of one register service: the latest version of every key it stores.
pub struct Registers<P: Policy> {
    f: usize,
    server: Server<P>,
}

impl<P: Policy> EpochHost<Registers<P>> {
    /// Node `me` at the genesis `ring`, holding nothing, checking versions with `context`.
    pub fn empty(me: NodeId, ring: Arc<Ring>, context: P::Context) -> Self {
        let kind = Registers {
            f: ring.params().f,
            server: Server::with_context(Slot(me.0), ring.epoch(), GroupId(0), context),
        };
        EpochHost::new(me, ring, kind)
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
        let genesis = chain.genesis();
        let mut server = Server::with_context(Slot(me.0), genesis.epoch(), GroupId(0), context);
        for (key, entry) in entries {
            if !server.restore(key.clone(), entry) {
                return Err(key);
            }
        }
        let kind = Registers {
            f: genesis.params().f,
            server,
        };
        Ok(EpochHost::resume(me, chain, kind, entered, pulled))
    }

    /// The stored version of `key`.
    pub fn stored(&self, key: &Key) -> Option<&P::Entry> {
        self.kind().server.stored(key)
    }
}

impl<P: Policy> Kind for Registers<P> {
    const SERVICE: ServiceId = P::SERVICE;
    const DROP_DENIED: bool = false;
    type Request = Request<P>;
    type Reply = Response<P>;
    type Entry = P::Entry;
    type Version = Timestamp;
    type View = ();

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
        _view: &(),
    ) -> Served<Self> {
        self.server.epoch = request.epoch;
        self.server.group = group.id();
        let handled = self
            .server
            .serve(client, access.write, access.read, request);
        Served {
            changes: handled
                .changes
                .into_iter()
                .map(|super::Change::Put { key, entry }| transfer::Change::Put { key, entry })
                .collect(),
            reply: handled.reply,
            refused: handled.refused.map(|refusal| refusal.to_string()),
        }
    }

    fn must_pull(moved: &Moved) -> bool {
        moved.changed()
    }

    fn list(
        &self,
        _view: &(),
        arc: &RingArc,
        after: Option<&Key>,
        limit: usize,
    ) -> (Vec<Key>, bool) {
        let mut keys: Vec<&Key> = self
            .server
            .stored
            .keys()
            .filter(|key| after.is_none_or(|after| *key > after))
            .filter(|key| arc.contains(RingPoint::of_key(key.as_bytes())))
            .collect();
        keys.sort_unstable();
        let more = keys.len() > limit;
        keys.truncate(limit);
        (keys.into_iter().cloned().collect(), more)
    }

    fn entry(&self, _view: &(), key: &Key) -> Option<P::Entry> {
        self.server.stored(key).cloned()
    }

    fn version(entry: &P::Entry) -> Timestamp {
        P::ts(entry)
    }

    fn value_bytes(entry: &P::Entry) -> u64 {
        P::value(entry).map_or(0, |value| value.len() as u64)
    }

    fn outside(&self, _view: &(), ring: &Ring, me: NodeId) -> Vec<Key> {
        self.server
            .stored
            .keys()
            .filter(|key| !ring.group_of(key.as_bytes()).contains(me))
            .cloned()
            .collect()
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

    fn adopt(&mut self, _view: &(), key: &Key, entry: &P::Entry) -> Vec<Change<P>> {
        if !self.server.adopt(key.clone(), entry.clone()) {
            return Vec::new();
        }
        vec![transfer::Change::Put {
            key: key.clone(),
            entry: entry.clone(),
        }]
    }

    fn remove(&mut self, _view: &(), key: &Key) -> Vec<Change<P>> {
        self.server.stored.remove(key);
        vec![transfer::Change::Drop { key: key.clone() }]
    }

    fn offers(&self) -> bool {
        true
    }

    fn stats(&self) -> ReplicaStats {
        Replica::stats(&self.server)
    }
}

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

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Vec<Outbound<P>> {
        self.config.epoch = epoch;
        self.config.group = view.id();
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

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Vec<Outbound<P>> {
        self.config.epoch = epoch;
        self.config.group = view.id();
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
    use crate::machine::{Operation, Output, Progress};
    use crate::register::pubkey::{self, PubKey};
    use crate::round::OpId;
    use bulwark_core::Time;
    use bulwark_core::membership::PlacementParams;
    use bulwark_core::sign::SecretKey;
    use bytes::Bytes;

    /// A tick, and the dropping of moved keys it finds due.
    fn tick(node: &mut EpochServer<PubKey>, now: Time) -> Output<EpochServer<PubKey>> {
        let ticked = Replica::on_tick(node, now);
        let due = ticked.timers.iter().any(|(timer, _)| *timer == DROP_TIMER);
        let sends = ticked.sends;
        let mut output = if due {
            Replica::on_timer(node, now, DROP_TIMER, &())
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
        let mut node = EpochServer::<PubKey>::empty(NodeId(0), first.clone(), ());
        node.enter(ring(2, 0..4));
        let key = Key::new(b"k".to_vec()).unwrap();
        let group = node.ring().group_at(RingPoint::of_key(key.as_bytes())).id();
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
                transfer::Transfer::Held { versions, .. } => {
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
        assert_eq!(old.moved_keys(&()).len(), 1);

        // Nothing is asked before the sweep is due, then every new member is asked.
        assert!(tick(&mut old, Time(0)).sends.is_empty());
        assert!(tick(&mut old, Time(100)).sends.is_empty());
        let asked = tick(&mut old, Time(DROP_START_MILLIS));
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
        let stale_hold = transfer::Transfer::Hold {
            epoch: Epoch(0),
            versions: vec![(key.clone(), PubKey::ts(&version(2)))],
        };
        assert!(
            Replica::on_message(&mut behind, Time(1), Slot(0), stale_hold, &())
                .sends
                .is_empty()
        );

        let confirm = |old: &mut EpochServer<PubKey>, from: u32, num: u64| {
            let message = transfer::Transfer::Held {
                epoch: Epoch(1),
                versions: vec![(key.clone(), PubKey::ts(&version(num)))],
                denied: Vec::new(),
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
        assert_eq!(
            dropped.changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );
        assert!(old.stored(&key).is_none());
        assert!(old.moved_keys(&()).is_empty());
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
        let listed = Replica::on_message(&mut old, Time(3), Slot(4), list, &());
        assert!(matches!(
            &listed.sends[..],
            [(_, transfer::Transfer::Listed { keys, .. })] if keys.is_empty()
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
        let _ = tick(&mut old, Time(0));
        let _ = tick(&mut old, Time(DROP_START_MILLIS));
        // Members 4 and 5 hold it; 6 answers without it (the write reached only the old group);
        // 7 says nothing.
        let answer = |old: &mut EpochServer<PubKey>, from: u32, keys: Vec<Key>| {
            let message = transfer::Transfer::Held {
                epoch: Epoch(1),
                versions: keys.into_iter().map(|key| (key, ts)).collect(),
                denied: Vec::new(),
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
            let output = tick(&mut old, Time(now));
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
        assert!(old.stored(&key).is_some());

        // Member 6 stores the offered version; a forged one it refuses.
        let mut lacking = holding(6, &chain, &[]);
        let offer = transfer::Transfer::Offer {
            epoch: Epoch(1),
            key: key.clone(),
            entry: entry.clone(),
        };
        let stored = Replica::on_message(&mut lacking, Time(2), Slot(1), offer, &());
        assert_eq!(
            stored.changes,
            vec![transfer::Change::Put {
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
            transfer::Transfer::Offer {
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
            let output = tick(&mut old, Time(now));
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
        let dropped = answer(&mut old, 6, vec![key.clone()]);
        assert_eq!(
            dropped.changes,
            vec![transfer::Change::Drop { key: key.clone() }]
        );
    }
}
