//! A register's take-over into its group's next incarnation (`super::super::takeover`): the
//! members of a new group read the key from the old one, carry the version over, and serve it
//! once `2f+1` of them hold it.

use super::*;
use crate::machine::{OpError, Operation, Progress};
use crate::powerstore::takeover::{Side, TakeOutcome, TakeOver, TakeStep};
use crate::transfer::{Rebase, Routed};
use bulwark_core::NodeId;
use bulwark_core::membership::{Chain, GroupView, PlacementParams, Ring, RingPoint};
use std::collections::VecDeque;

/// The old group (nodes 0-3, epoch 1) and its next incarnation, four other nodes from epoch 2.
fn groups() -> (Harness, Harness) {
    let members = |first: u32| -> Vec<NodeId> { (first..first + 4).map(NodeId).collect() };
    let old = Harness::incarnation(1, 1, Incarnation::new(&members(0), Epoch(1)), Epoch(1));
    let new = Harness::incarnation(1, 41, Incarnation::new(&members(4), Epoch(2)), Epoch(2));
    (old, new)
}

/// How a member of the new incarnation stands.
#[derive(Clone, Debug, PartialEq)]
enum Gate {
    /// Not serving the key: never taken over, or taking over.
    Closed,
    /// Serving the key, having confirmed that `2f+1` members hold this version or newer.
    Open(Option<Timestamp>),
}

/// The new incarnation's side of a take-over, as a node drives it: each member's take-over, a
/// new one when the last stalled or when the member is asked to HOLD above its `lc`, and the gate
/// each member serves the key behind.
struct Drive {
    key: Key,
    /// Per member: which old members its reads reach.
    reaches: Vec<Vec<bool>>,
    takes: Vec<Option<TakeOver>>,
    gates: Vec<Gate>,
    /// Requests in flight: from which member, to which side and slot.
    queue: VecDeque<(usize, Side, Slot, Request)>,
    /// Take-overs started, per member.
    started: Vec<u32>,
    /// The broken variant: a member serves the version it carried at once, unconfirmed.
    serve_at_carry: bool,
}

impl Drive {
    fn new(key: &Key, n: usize) -> Drive {
        Drive {
            key: key.clone(),
            reaches: vec![vec![true; n]; n],
            takes: (0..n).map(|_| None).collect(),
            gates: vec![Gate::Closed; n],
            queue: VecDeque::new(),
            started: vec![0; n],
            serve_at_carry: false,
        }
    }

    /// Starts member `i`'s take-over, unless one runs.
    fn start(&mut self, old: &Harness, new: &mut Harness, i: usize) {
        if self.takes[i].is_some() {
            return;
        }
        let held = new.servers[i].lc(&self.key).map(|c| c.ts);
        let mut take = TakeOver::new(
            old.config.clone(),
            new.config.clone(),
            Slot(i as u32),
            Arc::new(ReedSolomonSimd),
            self.key.clone(),
            new.op(),
            held,
        );
        let sends = take.start();
        self.takes[i] = Some(take);
        self.started[i] += 1;
        self.queue
            .extend(sends.into_iter().map(|(side, to, r)| (i, side, to, r)));
    }

    /// Runs every take-over in flight until none is left, firing their timers whenever nothing
    /// is in flight; at most `rounds` times.
    fn run(&mut self, old: &mut Harness, new: &mut Harness, rounds: usize) {
        for _ in 0..rounds {
            while let Some((i, side, to, request)) = self.queue.pop_front() {
                let asked = match &request.body {
                    RequestBody::Hold { ts } => Some(*ts),
                    _ => None,
                };
                let response = match side {
                    Side::Previous if self.reaches[i][to.index()] => {
                        old.deliver(READER, to, request)
                    }
                    Side::Previous => None,
                    Side::New => new.deliver(READER, to, request),
                };
                let Some(response) = response else { continue };
                // A member asked to hold above its `lc` reads the old incarnation again.
                if let (Some(asked), ResponseBody::HoldAck { lc_ts }) = (asked, &response.body)
                    && cmp_ts(asked.as_ref(), lc_ts.as_ref()) == Ordering::Greater
                    && !self.serve_at_carry
                {
                    self.start(old, new, to.index());
                }
                let Some(take) = self.takes[i].as_mut() else {
                    continue;
                };
                let step = take.on_response(side, to, response);
                self.step(old, new, i, step);
            }
            let running: Vec<usize> = (0..self.takes.len())
                .filter(|i| self.takes[*i].is_some())
                .collect();
            if running.is_empty() {
                return;
            }
            for i in running {
                let step = self.takes[i].as_mut().expect("running").on_timeout();
                self.step(old, new, i, step);
            }
        }
    }

    fn step(&mut self, old: &Harness, new: &mut Harness, i: usize, step: TakeStep) {
        match step {
            TakeStep::Send(sends) => self
                .queue
                .extend(sends.into_iter().map(|(side, to, r)| (i, side, to, r))),
            TakeStep::Carry { carried, then } => {
                let ts = carried.ts;
                let changes = new.servers[i]
                    .carry(new.now, &self.key, carried, &new.disks[i])
                    .expect("a correct read carries a version that fits");
                for change in &changes {
                    new.disks[i].apply(change);
                }
                if self.serve_at_carry {
                    self.gates[i] = Gate::Open(Some(ts));
                    self.takes[i] = None;
                    return;
                }
                // A version newer than the one served waits for its own confirmation.
                if changes.iter().any(|c| matches!(c, Change::SetLc { .. })) {
                    self.gates[i] = Gate::Closed;
                }
                self.queue
                    .extend(then.into_iter().map(|(side, to, r)| (i, side, to, r)));
            }
            TakeStep::Done(result) => {
                self.takes[i] = None;
                match result.expect("a take-over among correct members does not fail") {
                    TakeOutcome::Confirmed { base } => {
                        // The invariant the gate keeps: 2f+1 members hold it or newer.
                        let holding = new
                            .servers
                            .iter()
                            .filter(|s| {
                                let lc = s.lc(&self.key).map(|c| &c.ts);
                                cmp_ts(lc, base.as_ref()) != Ordering::Less
                            })
                            .count();
                        let quorum = new.config.n - new.config.f;
                        assert!(holding >= quorum, "confirmed on {holding}");
                        self.gates[i] = Gate::Open(base);
                    }
                    TakeOutcome::Stalled { .. } => self.start(old, new, i),
                }
            }
        }
    }

    /// The members serving the key.
    fn serving(&self) -> Vec<bool> {
        self.gates.iter().map(|g| *g != Gate::Closed).collect()
    }
}

/// A read of the new incarnation that only `serving` members answer.
fn read_where(new: &mut Harness, key: &Key, serving: &[bool]) -> Option<ReadOutcome> {
    let serving = serving.to_vec();
    new.try_read_with(key, move |h, to, request| {
        serving[to.index()]
            .then(|| h.deliver(READER, to, request))
            .flatten()
    })
}

#[test]
fn a_new_incarnation_takes_a_register_over_by_reading_the_old_one() {
    let (mut old, mut new) = groups();
    let (k, gone, never) = (key("k"), key("gone"), key("never"));
    old.write(&k, Some(b"one"));
    let two = old.write(&k, Some(&[7u8; 5000])).ts;
    old.write(&gone, Some(b"soon deleted"));
    let deleted = old.write(&gone, None).ts;
    for (key, expected) in [(&k, Some(two)), (&gone, Some(deleted)), (&never, None)] {
        let mut drive = Drive::new(key, 4);
        for i in 0..4 {
            drive.start(&old, &mut new, i);
        }
        drive.run(&mut old, &mut new, 4);
        assert_eq!(drive.gates, vec![Gate::Open(expected); 4], "{key:?}");
        assert_eq!(drive.started, vec![1; 4], "one read each: they agree");
        for server in &new.servers {
            assert_eq!(server.lc(key).map(|c| c.ts), expected);
        }
    }
    // Reads of the new incarnation, in one round and through FILTER, return what moved.
    assert_eq!(new.read(&k).value.as_deref(), Some(&[7u8; 5000][..]));
    assert!(new.read(&k).one_round);
    new.config.one_round = false;
    let filtered = new.read(&k);
    assert_eq!(filtered.value.as_deref(), Some(&[7u8; 5000][..]));
    assert!(
        !filtered.repaired,
        "every holder keeps the same carried vector"
    );
    assert_eq!(new.read(&gone).value, None);
    assert_eq!(new.read(&never).value, None);
    // A writer of the new incarnation orders its write after the carried version, whose tag
    // it checks (the tag binds the key, not the group), and reads return it.
    let three = new.write(&k, Some(b"three")).ts;
    assert_eq!(three.cmp_order(&two), Ordering::Greater);
    assert_eq!(new.read(&k).value.as_deref(), Some(&b"three"[..]));
}

#[test]
fn a_carried_version_is_valid_only_where_it_is_held() {
    let (mut old, mut new) = groups();
    let k = key("k");
    let written = old.write(&k, Some(b"two")).ts;
    // The writer's own candidate, with the MAC vector it made for the old incarnation.
    let original = old.servers[0].lc(&k).expect("complete").clone();
    // Member 3 is down while the others take the key over, so none of their HOLDs makes it
    // read the old incarnation.
    new.down[3] = true;
    let mut drive = Drive::new(&k, 4);
    for i in 0..3 {
        drive.start(&old, &mut new, i);
    }
    drive.run(&mut old, &mut new, 4);
    assert_eq!(drive.gates[..3], vec![Gate::Open(Some(written)); 3]);
    new.down[3] = false;
    let carried = new.servers[0].lc(&k).expect("carried").clone();
    assert_eq!(carried.vec, MacVec::carried(4));
    assert_eq!((carried.ts, carried.nonce), (original.ts, original.nonce));
    // Member 3 never took the key over: neither the carried candidate nor the writer's own
    // (whose MACs bind the old incarnation) is valid there, so a reader cannot plant it.
    let filter = Request {
        epoch: Epoch(2),
        body: RequestBody::Filter {
            candidates: vec![carried.clone(), original.clone()],
        },
        ..collect_request(&k)
    };
    let reply = new.handle(Slot(3), READER, filter.clone());
    assert!(reply.changes.is_empty());
    assert_eq!(
        reply.reply.expect("answered").body,
        ResponseBody::FilterAck(FilterAck::Initial)
    );
    assert!(new.servers[3].lc(&k).is_none());
    // A holder vouches with its entry.
    let held = new.handle(Slot(0), READER, filter).reply.expect("answered");
    assert!(matches!(
        held.body,
        ResponseBody::FilterAck(FilterAck::Entry { ts, .. }) if ts == written
    ));
    // Reads find it among the three holders.
    assert_eq!(new.read(&k).value.as_deref(), Some(&b"two"[..]));
}

/// The state two members' concurrent reads leave: "one" complete; "two" stored everywhere but
/// completed at old node 0 only (proven, not complete). Members 1 and 2 read the old
/// incarnation through old nodes 1-3 before member 0 reads it through every old node.
fn concurrent_reads(serve_at_carry: bool) -> (Harness, Harness, Drive, Timestamp, Timestamp) {
    let (mut old, mut new) = groups();
    let k = key("k");
    let one = old.write(&k, Some(b"one")).ts;
    let incomplete = old.write_where(&k, Some(b"two"), |to, body| {
        !matches!(body, RequestBody::Complete { .. }) || to == Slot(0)
    });
    assert!(incomplete.is_none(), "one COMPLETE_ACK is no quorum");
    let two = old.servers[0].lc(&k).expect("completed at node 0").ts;
    let mut drive = Drive::new(&k, 4);
    drive.serve_at_carry = serve_at_carry;
    for member in [1, 2] {
        drive.reaches[member][0] = false;
    }
    drive.start(&old, &mut new, 1);
    drive.start(&old, &mut new, 2);
    // Their reads end, their confirmations wait for members still holding nothing.
    drive.run(&mut old, &mut new, 2);
    for member in [1, 2] {
        assert_eq!(new.servers[member].lc(&k).map(|c| c.ts), Some(one));
    }
    drive.start(&old, &mut new, 0);
    (old, new, drive, one, two)
}

#[test]
fn a_member_that_carried_an_older_version_reads_again_before_the_newer_one_is_served() {
    let (mut old, mut new, mut drive, one, two) = concurrent_reads(false);
    let k = key("k");
    assert_ne!(one, two);
    // Member 0's read finds "two" and writes it back; it does not serve it while members 1
    // and 2 hold "one": its HOLDs make them read again, and then all three hold "two".
    drive.start(&old, &mut new, 3);
    drive.run(&mut old, &mut new, 8);
    assert_eq!(drive.gates, vec![Gate::Open(Some(two)); 4]);
    assert!(
        drive.started[1] >= 2 && drive.started[2] >= 2,
        "{:?}",
        drive.started
    );
    assert_eq!(new.read(&k).value.as_deref(), Some(&b"two"[..]));
}

/// Member 3 is faulty and answers two readers differently: as a holder of "two" to the first,
/// as a holder of "one" to the second. What the two reads return, one after the other.
fn inversion_trace(serve_at_carry: bool) -> (Option<Bytes>, Option<Bytes>) {
    let (mut old, mut new, mut drive, _, _) = concurrent_reads(serve_at_carry);
    let k = key("k");
    // The faulty member's two faces: a take-over as member 3 of a second copy of the new
    // incarnation after member 0's read (so of "two"), and one in the real copy before it.
    let (_, mut shadow) = groups();
    let mut shadow_drive = Drive::new(&k, 4);
    drive.run(&mut old, &mut new, 8);
    shadow_drive.start(&old, &mut shadow, 3);
    shadow_drive.run(&mut old, &mut shadow, 2);
    let mut stale = Drive::new(&k, 4);
    stale.serve_at_carry = true;
    let (mut old_copy, _) = groups();
    old_copy.write(&k, Some(b"one"));
    stale.start(&old_copy, &mut new, 3);
    stale.run(&mut old_copy, &mut new, 2);
    let mut serving = drive.serving();
    serving[3] = false;
    // The first read: members 0 and 1 where serving, and the faulty member's "two" face.
    let first = new
        .try_read_with(&k, |h, to, request| match to.index() {
            3 => shadow.deliver(READER, to, request),
            i if i <= 1 && serving[i] => h.deliver(READER, to, request),
            _ => None,
        })
        .map(|outcome| outcome.value);
    // The second read, after it: members 1 and 2 where serving, and the "one" face.
    let second = read_where(&mut new, &k, &[false, serving[1], serving[2], true])
        .map(|outcome| outcome.value);
    (first.flatten(), second.flatten())
}

#[test]
fn serving_a_carried_version_before_2f_plus_1_members_hold_it_lets_a_read_go_back() {
    // Broken: member 0 serves "two" as soon as it carried it. The faulty member vouches for it
    // beside member 0, so the first read returns it; members 1 and 2 still hold "one", cannot
    // validate "two" from the first read's write-back, and the second read returns "one".
    let (first, second) = inversion_trace(true);
    assert_eq!(first.as_deref(), Some(&b"two"[..]));
    assert_eq!(second.as_deref(), Some(&b"one"[..]), "the read went back");
    // With the confirmation, members 1 and 2 hold "two" before member 0 serves it.
    let (first, second) = inversion_trace(false);
    assert_eq!(first.as_deref(), Some(&b"two"[..]));
    assert_eq!(second.as_deref(), Some(&b"two"[..]));
}

#[test]
fn a_bogus_hold_costs_a_read_and_not_the_key() {
    let (mut old, mut new) = groups();
    let k = key("k");
    let written = old.write(&k, Some(b"v")).ts;
    let mut drive = Drive::new(&k, 4);
    for i in 0..4 {
        drive.start(&old, &mut new, i);
    }
    drive.run(&mut old, &mut new, 4);
    // A faulty member asks member 1 to hold a version no one wrote.
    let bogus = Timestamp {
        num: written.num + 100,
        ..written
    };
    let hold = Request {
        op: OpId(9_999),
        attempt: 0,
        epoch: Epoch(2),
        group: GroupId(0),
        key: k.clone(),
        body: RequestBody::Hold { ts: Some(bogus) },
    };
    drive.queue.push_back((3, Side::New, Slot(1), hold));
    drive.run(&mut old, &mut new, 4);
    assert_eq!(drive.started[1], 2, "member 1 read again");
    assert_eq!(
        drive.gates[1],
        Gate::Open(Some(written)),
        "and kept serving"
    );
}

#[test]
fn a_carry_that_does_not_fit_is_refused() {
    let (mut old, mut new) = groups();
    let k = key("k");
    // Coded, so that every slot's fragment differs.
    let value: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    old.write(&k, Some(&value));
    let mut drive = Drive::new(&k, 4);
    drive.start(&old, &mut new, 0);
    drive.run(&mut old, &mut new, 1);
    let lc = new.servers[0].lc(&k).expect("carried").clone();
    let entry = new.disks[0].stored_key(&k).hist[0].clone();
    let fragment = new.disks[0].fragment(&k, &lc.ts).expect("stored");
    let carried = |fragment: Bytes, nonce: Nonce| crate::powerstore::takeover::Carried {
        ts: lc.ts,
        nonce,
        cc: entry.cc.clone(),
        fragment,
    };
    // Another slot's fragment, and a nonce the stored N̄ does not commit to.
    let server = &mut new.servers[1];
    assert!(
        server
            .carry(
                Time(0),
                &k,
                carried(fragment.clone(), lc.nonce),
                &new.disks[1]
            )
            .is_err()
    );
    let own = new.disks[0].fragment(&k, &lc.ts).expect("stored");
    assert!(
        new.servers[0]
            .carry(Time(0), &k, carried(own, Nonce([1; 32])), &new.disks[0])
            .is_err()
    );
}

// ---------------------------------------------------------------------------------------------
// Operations that follow the key into the next incarnation (`Rebase`, through `Routed`)

/// A key's group in epoch 1 (nodes 0-3) and in epoch 2 (nodes 4-7) of a certified chain, each
/// served by a harness whose slots are the ring's order for the key, and the nodes' words on
/// which epoch they are in, as a node's `EpochHost` turns requests away.
struct Epochs {
    key: Key,
    chain: Arc<Chain>,
    old: Harness,
    new: Harness,
    old_view: GroupView,
    new_view: GroupView,
    /// The old members have entered epoch 2: they turn epoch-1 requests away.
    entered: bool,
    /// Per new member: it serves the key (its take-over is confirmed).
    serving: Vec<bool>,
    identity: Arc<WriterIdentity>,
}

impl Epochs {
    fn new(key: &Key) -> Epochs {
        let ring = |epoch: u64, ids: std::ops::Range<u32>| {
            let ring = Ring::new(Epoch(epoch), PlacementParams::new(1), ids.map(NodeId));
            Arc::new(ring.expect("four members"))
        };
        let bare = Chain::new(vec![ring(1, 0..4), ring(2, 4..8)]);
        let point = RingPoint::of_key(key.as_bytes());
        let (old_view, old_inc) = bare.incarnation(Epoch(1), point).expect("epoch 1");
        let (new_view, new_inc) = bare.incarnation(Epoch(2), point).expect("epoch 2");
        let old = Harness::incarnation(1, 1, old_inc, Epoch(1)).named(old_view.id());
        let new = Harness::incarnation(1, 41, new_inc, Epoch(2)).named(new_view.id());
        // Each node signs with the key its harness slot derives its MAC keys from.
        let keys = |view: &GroupView, h: &Harness| -> Vec<(NodeId, PublicKey)> {
            let nodes = view.members().iter().copied();
            nodes
                .zip(h.node_secrets.iter().map(SecretKey::public_key))
                .collect()
        };
        let mut signing = keys(&old_view, &old);
        signing.extend(keys(&new_view, &new));
        let identity = Arc::new(WriterIdentity {
            signing: old.writer_secrets[0].clone(),
            timestamp: MacKey([99; 32]),
        });
        Epochs {
            key: key.clone(),
            chain: Arc::new(bare.with_keys(signing)),
            old,
            new,
            old_view,
            new_view,
            entered: false,
            serving: vec![false; 4],
            identity,
        }
    }

    /// The old members enter epoch 2 and every new member takes the key over.
    fn change(&mut self) {
        self.entered = true;
        let mut drive = Drive::new(&self.key, 4);
        for i in 0..4 {
            drive.start(&self.old, &mut self.new, i);
        }
        drive.run(&mut self.old, &mut self.new, 8);
        self.serving = drive.serving();
        assert_eq!(self.serving, vec![true; 4]);
    }

    /// Node `to`'s answer to `request`, as a node in its epoch answers it.
    fn deliver(&mut self, access: Access, to: NodeId, request: Request) -> Option<Response> {
        let refused = |refusal: Refusal| Response {
            op: request.op,
            attempt: request.attempt,
            body: ResponseBody::Refused(refusal),
        };
        let current = Epoch(if self.entered { 2 } else { 1 });
        if request.epoch != current {
            return Some(refused(Refusal::WrongEpoch { current }));
        }
        let (view, h) = if self.entered {
            (&self.new_view, &mut self.new)
        } else {
            (&self.old_view, &mut self.old)
        };
        let Some(slot) = view.slot_of(to) else {
            return Some(refused(Refusal::WrongGroup));
        };
        if self.entered && !self.serving[slot.index()] {
            return None;
        }
        h.deliver(access, slot, request)
    }

    /// A read of the key from epoch 1.
    fn read(&mut self) -> Routed<ReadOp> {
        let config = self.old.config.clone();
        let read = ReadOp::new(
            config,
            Arc::new(ReedSolomonSimd),
            self.key.clone(),
            self.old.op(),
        );
        let point = RingPoint::of_key(self.key.as_bytes());
        Routed::new(read, point, self.chain.clone(), Epoch(1))
    }

    /// A write of `value` to the key from epoch 1, by writer 0.
    fn write(&mut self, value: &[u8]) -> Routed<WriteOp> {
        let write = self
            .old
            .write_op(&self.key, Some(value))
            .following(self.identity.clone());
        let point = RingPoint::of_key(self.key.as_bytes());
        Routed::new(write, point, self.chain.clone(), Epoch(1))
    }

    /// Runs `op`'s requests in `queue` and every request that follows until it ends, firing its
    /// timer whenever nothing is in flight; `hook` sees each request first and may keep it back
    /// (`false`).
    fn run<O: Rebase<Request = Request, Reply = Response>>(
        &mut self,
        op: &mut Routed<O>,
        access: Access,
        mut queue: VecDeque<(Slot, Request)>,
        mut hook: impl FnMut(&mut Epochs, &Request) -> bool,
    ) -> Result<O::Output, OpError> {
        for _ in 0..=TIMEOUTS {
            while let Some((to, request)) = queue.pop_front() {
                if !hook(self, &request) {
                    continue;
                }
                let Some(reply) = self.deliver(access, NodeId(to.0), request) else {
                    continue;
                };
                match op.on_reply(to, reply) {
                    Progress::Send(more) => queue.extend(more),
                    Progress::Done(result) => return result,
                }
            }
            queue.extend(op.on_timeout());
        }
        panic!("the operation did not end");
    }
}

/// Slots of a routed operation's outcome name nodes of the new group.
fn in_new_group(w: &Epochs, slots: &[Slot]) -> bool {
    slots.iter().all(|slot| w.new_view.contains(NodeId(slot.0)))
}

#[test]
fn a_read_turned_away_by_the_old_incarnation_reads_the_new_one_from_the_start() {
    let k = key("k");
    let mut w = Epochs::new(&k);
    w.old.write(&k, Some(b"one"));
    let two = w.old.write(&k, Some(b"two")).ts;
    let mut read = w.read();
    let first: VecDeque<_> = read.start().into();
    // Two old members answer COLLECT in epoch 1; then the epoch changes under the read.
    let mut answered = 0;
    let outcome = w
        .run(&mut read, READER, first, |w, _| {
            answered += 1;
            if answered == 3 && !w.entered {
                w.change();
            }
            true
        })
        .expect("the read ends in the new group");
    assert_eq!(read.epoch(), Epoch(2));
    assert_eq!(outcome.value.as_deref(), Some(&b"two"[..]));
    assert_eq!(outcome.ts, Some(two));
    assert!(in_new_group(&w, &outcome.answered_by), "{outcome:?}");
    assert_eq!(outcome.restarts, 0, "a move is not a FILTER restart");
}

#[test]
fn a_reply_to_the_epoch_left_does_not_count_in_the_new_one() {
    let k = key("k");
    let mut w = Epochs::new(&k);
    w.old.write(&k, Some(b"one"));
    let mut read = w.read();
    let sends = read.start();
    let asked = sends[0].1.clone();
    w.change();
    let turned = w.deliver(READER, NodeId(sends[1].0.0), sends[1].1.clone());
    let Progress::Send(moved) = read.on_reply(sends[1].0, turned.expect("answered")) else {
        panic!("a turned request does not end the read");
    };
    assert_eq!(moved.len(), 4, "COLLECT to every member of the new group");
    assert!(
        moved
            .iter()
            .all(|(_, r)| r.epoch == Epoch(2) && r.attempt != asked.attempt)
    );
    // A new member's answer to a request of the epoch left (as a node in both groups could
    // send, or a liar replaying one) is not counted.
    let member = w.new_view.members()[0];
    let stale = w
        .new
        .deliver(
            READER,
            Slot(0),
            Request {
                epoch: Epoch(2),
                group: w.new_view.id(),
                ..asked
            },
        )
        .expect("answered");
    let _ = read.on_reply(Slot(member.0), stale);
    assert!(read.answered().is_empty(), "{:?}", read.answered());
}

#[test]
fn a_write_cut_before_its_nonce_was_revealed_completes_in_the_new_incarnation() {
    for cut_in in ["clock", "store"] {
        let k = key("k");
        let mut w = Epochs::new(&k);
        let one = w.old.write(&k, Some(b"one")).ts;
        let mut write = w.write(b"two");
        let first: VecDeque<_> = write.start().into();
        // The epoch changes once the first request of the round named has reached an old member.
        let mut sent = 0;
        let outcome = w
            .run(&mut write, WRITER, first, |w, request| {
                if request.body.name() == cut_in {
                    sent += 1;
                    if sent == 2 && !w.entered {
                        w.change();
                    }
                }
                true
            })
            .unwrap_or_else(|e| panic!("cut in {cut_in}: {e}"));
        assert_eq!(write.epoch(), Epoch(2));
        // Cut in STORE, an old member holds the version, unproven; cut in CLOCK, none does.
        let stored_before = w.old.servers.iter().any(|s| s.versions(&k) > 1);
        assert_eq!(stored_before, cut_in == "store");
        assert_eq!(outcome.ts.cmp_order(&one), Ordering::Greater, "{cut_in}");
        assert!(in_new_group(&w, &outcome.acknowledged_by), "{cut_in}");
        assert_eq!(outcome.restarts, 0);
        // Written in the new incarnation, under its MAC vector: reads there return it.
        assert_eq!(
            w.new.read(&k).value.as_deref(),
            Some(&b"two"[..]),
            "{cut_in}"
        );
        let lc = w.new.servers[0].lc(&k).expect("written").clone();
        assert_ne!(lc.vec, MacVec::carried(4), "{cut_in}: stored, not carried");
    }
}

#[test]
fn a_write_cut_after_its_nonce_was_revealed_ends_with_its_outcome_unknown() {
    let k = key("k");
    let mut w = Epochs::new(&k);
    w.old.write(&k, Some(b"one"));
    let mut write = w.write(b"two");
    let first: VecDeque<_> = write.start().into();
    // The first COMPLETE reaches an old member; the epoch changes before the others do.
    let mut completes = 0;
    let error = w
        .run(&mut write, WRITER, first, |w, request| {
            if request.body.name() == "complete" {
                completes += 1;
                if completes == 2 && !w.entered {
                    w.change();
                }
            }
            true
        })
        .expect_err("the write cannot go on");
    assert!(
        error.to_string().contains("decided by the transfer"),
        "{error}"
    );
    // Whichever version the take-over carried, every read of the new group returns it.
    let carried = w.new.read(&k).value;
    assert!(matches!(carried.as_deref(), Some(b"one" | b"two")));
    assert_eq!(w.new.read(&k).value, carried);
}
