//! A2M-PBFT-EA's unit tests: replicas of PBFT's test counter, each with its own in-memory
//! trusted log that survives everything, in a small network harness; a record of every
//! committed certificate a replica made durable, so that any number decided two ways is seen;
//! and the attacks of spec §7.2 T2, T6, T7 and T9 made with a faulty replica's real trusted log
//! (it can say anything, but only one thing per slot), with the negative control that shows
//! what the attestations stop.

use super::msg::{Attested, Checkpoint, NewView, Placed, Want, body_hash, wants_nonce};
use super::*;
use crate::machine::{Access, OpError, Operation, Output, Progress, Replica};
use crate::pbft::Submit;
use crate::pbft::msg::{Batch, Cast, Origin, Phase, Request, Submitted, Vote};
use crate::pbft::replica::Answer;
use crate::pbft::tests::{CLIENT, Counter, Op, START};
use bulwark_a2m::{A2m, Component, Limits};
use bulwark_core::a2m::{self, Call, Outcome, Refusal};
use bulwark_core::sign::{PublicKey, SecretKey, Unverified};
use bulwark_core::{Digest, Slot, wire};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

type R = EaReplica<Counter>;
type Msg = Message<Counter>;

#[derive(Clone, Debug)]
enum Packet {
    Peer {
        from: Slot,
        to: Slot,
        message: Msg,
    },
    Request {
        to: Slot,
        request: Submitted<Op>,
    },
    Reply {
        from: Slot,
        id: u64,
        answer: Answer<u64>,
    },
}

impl Packet {
    fn from(&self) -> Option<Slot> {
        match self {
            Packet::Peer { from, .. } | Packet::Reply { from, .. } => Some(*from),
            Packet::Request { .. } => None,
        }
    }

    fn to(&self) -> Option<Slot> {
        match self {
            Packet::Peer { to, .. } | Packet::Request { to, .. } => Some(*to),
            Packet::Reply { .. } => None,
        }
    }
}

type Rule = Box<dyn Fn(&Packet) -> bool>;

struct Client {
    submit: Submit<Counter>,
    result: Option<Result<u64, OpError>>,
}

struct Net {
    params: Params,
    instance: Digest,
    logs: Logs,
    secrets: Vec<SecretKey>,
    keys: Vec<PublicKey>,
    trusted: Vec<PublicKey>,
    replicas: Vec<Option<R>>,
    /// Each replica's trusted log: it outlives the replica.
    components: Vec<Component>,
    /// The batch each replica made a committed certificate durable for, per number.
    decided: BTreeMap<u64, BTreeMap<u32, Digest>>,
    /// Each replica's records, in the order it made them durable; they survive crashes.
    disks: Vec<Vec<Change<Counter>>>,
    /// Replicas whose trusted-log calls are lost (they crash before making them).
    unattested: BTreeSet<usize>,
    /// Replicas whose trusted log is down: every call is answered as refused.
    log_down: BTreeSet<usize>,
    queue: VecDeque<Packet>,
    rules: Vec<(&'static str, Rule)>,
    refused: Vec<(Slot, String)>,
    clients: Vec<Client>,
    next_id: u64,
    now: bulwark_core::Time,
    rng: Option<ChaCha8Rng>,
}

impl Net {
    fn new(f: usize) -> Net {
        Net::with(f, |_| {})
    }

    fn with(f: usize, adjust: impl FnOnce(&mut Params)) -> Net {
        let mut params = Params::new(f);
        adjust(&mut params);
        let secrets: Vec<SecretKey> = (0..params.n)
            .map(|slot| SecretKey::from_seed(&[slot as u8 + 1; 32]))
            .collect();
        let keys = secrets.iter().map(SecretKey::public_key).collect();
        let seeds: Vec<[u8; 32]> = (0..params.n).map(|slot| [slot as u8 + 101; 32]).collect();
        let components: Vec<Component> = seeds
            .iter()
            .map(|seed| Component::in_memory(seed, Limits::default()))
            .collect();
        let trusted = seeds
            .iter()
            .map(|seed| SecretKey::from_seed(seed).public_key())
            .collect();
        let mut net = Net {
            params,
            instance: Digest::of("bulwark.ea.test.instance", b"counter"),
            logs: Logs::new(10, 3),
            secrets,
            keys,
            trusted,
            replicas: Vec::new(),
            components,
            decided: BTreeMap::new(),
            disks: (0..params.n).map(|_| Vec::new()).collect(),
            unattested: BTreeSet::new(),
            log_down: BTreeSet::new(),
            queue: VecDeque::new(),
            rules: Vec::new(),
            refused: Vec::new(),
            clients: Vec::new(),
            next_id: 1,
            now: START,
            rng: None,
        };
        net.replicas = (0..params.n)
            .map(|slot| Some(R::new(net.setup(slot)).expect("a valid setup")))
            .collect();
        net
    }

    fn shuffled(mut self, seed: u64) -> Net {
        self.rng = Some(ChaCha8Rng::seed_from_u64(seed));
        self
    }

    fn setup(&self, slot: usize) -> Setup<Counter> {
        Setup {
            params: self.params,
            me: Slot(slot as u32),
            secret: self.secrets[slot].clone(),
            keys: self.keys.clone(),
            trusted: self.trusted.clone(),
            logs: self.logs,
            instance: self.instance,
            app: Counter::default(),
        }
    }

    fn crash(&mut self, slot: usize) {
        self.replicas[slot] = None;
        self.unattested.remove(&slot);
    }

    fn restore(&mut self, slot: usize) {
        let replica = R::restore(self.setup(slot), self.disks[slot].clone(), self.now)
            .expect("a replica's own records restore");
        self.replicas[slot] = Some(replica);
    }

    fn replica(&self, slot: usize) -> &R {
        self.replicas[slot].as_ref().expect("a live replica")
    }

    fn block(&mut self, name: &'static str, rule: impl Fn(&Packet) -> bool + 'static) {
        self.rules.push((name, Box::new(rule)));
    }

    fn unblock(&mut self, name: &'static str) {
        self.rules.retain(|(n, _)| *n != name);
    }

    /// Nothing `slot` sends arrives.
    fn silence(&mut self, slot: u32) {
        self.block("silence", move |p| p.from() == Some(Slot(slot)));
    }

    /// Nothing reaches or leaves `slot`.
    fn isolate(&mut self, slot: u32) {
        self.block("isolate", move |p| {
            p.from() == Some(Slot(slot)) || p.to() == Some(Slot(slot))
        });
    }

    fn submit(&mut self, op: Op) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let mut submit = Submit::sized(self.params.n, self.params.f, CLIENT, id, op);
        for (to, request) in submit.start() {
            self.queue.push_back(Packet::Request { to, request });
        }
        self.clients.push(Client {
            submit,
            result: None,
        });
        self.clients.len() - 1
    }

    fn result(&self, client: usize) -> Option<&Result<u64, OpError>> {
        self.clients[client].result.as_ref()
    }

    fn ok(&self, client: usize) -> u64 {
        match self.result(client) {
            Some(Ok(total)) => *total,
            other => panic!("client {client} ended with {other:?}"),
        }
    }

    /// Submits `op` and runs (ticking) until its client is done, for at most a minute.
    fn complete(&mut self, op: Op) -> u64 {
        let client = self.submit(op);
        self.run();
        self.run_until(60_000, |net| net.result(client).is_some());
        self.ok(client)
    }

    fn run(&mut self) {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            assert!(steps < 2_000_000, "the network does not quiesce");
        }
    }

    fn run_steps(&mut self, steps: usize) {
        for _ in 0..steps {
            if !self.step() {
                break;
            }
        }
    }

    fn step(&mut self) -> bool {
        let packet = match &mut self.rng {
            Some(rng) if !self.queue.is_empty() => {
                let index = rng.random_range(0..self.queue.len());
                self.queue.swap_remove_back(index)
            }
            _ => self.queue.pop_front(),
        };
        let Some(packet) = packet else {
            return false;
        };
        if !self.rules.iter().any(|(_, rule)| rule(&packet)) {
            self.deliver(packet);
        }
        true
    }

    fn deliver(&mut self, packet: Packet) {
        let now = self.now;
        match packet {
            Packet::Peer { from, to, message } => {
                if let Some(replica) = self.replicas[to.index()].as_mut() {
                    let out = replica.on_message(now, from, message, &());
                    self.apply(to, out, None);
                }
            }
            Packet::Request { to, request } => {
                if let Some(replica) = self.replicas[to.index()].as_mut() {
                    let id = request.id;
                    let access = Access {
                        write: true,
                        read: true,
                    };
                    let out = replica.on_request(now, CLIENT, access, request, &());
                    self.apply(to, out, Some(id));
                }
            }
            Packet::Reply { from, id, answer } => {
                for client in &mut self.clients {
                    if client.submit.op() != id || client.result.is_some() {
                        continue;
                    }
                    if let Progress::Done(result) = client.submit.on_reply(from, answer.clone()) {
                        client.result = Some(result);
                    }
                }
            }
        }
    }

    /// A replica's output: changes are durable at once; then its trusted-log calls are made
    /// on its own component and the answers handed back; then what it sends is queued.
    fn apply(&mut self, slot: Slot, out: Output<R>, request: Option<u64>) {
        self.disks[slot.index()].extend(out.changes.iter().cloned());
        for change in &out.changes {
            if let Change::Committed(committed) = change {
                self.decided
                    .entry(committed.seq)
                    .or_default()
                    .insert(slot.0, committed.batch.digest());
            }
        }
        if let Some(reason) = out.refused {
            self.refused.push((slot, reason));
        }
        if let Some(answer) = out.reply {
            let id = request.expect("a reply answers a request");
            self.queue.push_back(Packet::Reply {
                from: slot,
                id,
                answer,
            });
        }
        for (_, id, answer) in out.notify {
            self.queue.push_back(Packet::Reply {
                from: slot,
                id,
                answer,
            });
        }
        for (to, message) in out.sends {
            assert_ne!(to, slot, "a replica sends to itself");
            self.queue.push_back(Packet::Peer {
                from: slot,
                to,
                message,
            });
        }
        for attest in out.attest {
            if self.unattested.contains(&slot.index()) {
                continue;
            }
            let answers = if self.log_down.contains(&slot.index()) {
                vec![Err(Refusal::Stopped(
                    "the trusted log's process is down".into(),
                ))]
            } else {
                self.components[slot.index()].call_all(&attest.calls)
            };
            let now = self.now;
            if let Some(replica) = self.replicas[slot.index()].as_mut() {
                let out = replica.on_attested(now, attest.token, answers, &());
                self.apply(slot, out, None);
            }
        }
    }

    fn tick(&mut self, ms: u64) {
        self.now = self.now.plus_millis(ms);
        let now = self.now;
        // Clients send again to the replicas that have not answered, every 2 s.
        if (now.0 - START.0).is_multiple_of(2_000) {
            for client in &mut self.clients {
                if client.result.is_none() {
                    for (to, request) in client.submit.on_timeout() {
                        self.queue.push_back(Packet::Request { to, request });
                    }
                }
            }
        }
        for slot in 0..self.params.n {
            if let Some(replica) = self.replicas[slot].as_mut() {
                let out = replica.on_tick(now);
                self.apply(Slot(slot as u32), out, None);
            }
        }
        self.run();
    }

    fn run_until(&mut self, ms: u64, done: impl Fn(&Net) -> bool) -> bool {
        for _ in 0..ms / 100 {
            if done(self) {
                return true;
            }
            self.tick(100);
        }
        done(self)
    }

    /// Hands `message` to `to` as if `from` sent it; returns the refusal, if any.
    fn inject(&mut self, from: u32, to: usize, message: Msg) -> Option<String> {
        let now = self.now;
        let out = self.replicas[to]
            .as_mut()
            .expect("a live replica")
            .on_message(now, Slot(from), message, &());
        let refused = out.refused.clone();
        self.apply(Slot(to as u32), out, None);
        refused
    }

    /// Numbers decided as two different batches by the replicas in `correct`.
    fn conflicts(&self, correct: &[u32]) -> Vec<u64> {
        self.decided
            .iter()
            .filter(|(_, by)| {
                let digests: BTreeSet<&Digest> = by
                    .iter()
                    .filter(|(slot, _)| correct.contains(slot))
                    .map(|(_, d)| d)
                    .collect();
                digests.len() > 1
            })
            .map(|(seq, _)| *seq)
            .collect()
    }

    fn all(&self) -> Vec<u32> {
        (0..self.params.n as u32).collect()
    }

    /// Every live replica in `slots` executed as far and is in the same state with the same
    /// request history.
    fn assert_same(&self, slots: &[usize]) {
        let first = self.replica(slots[0]);
        for slot in &slots[1..] {
            let other = self.replica(*slot);
            assert_eq!(other.executed(), first.executed(), "slot {slot} executed");
            assert_eq!(
                other.state_digest(),
                first.state_digest(),
                "slot {slot} state"
            );
            assert_eq!(other.history(), first.history(), "slot {slot} history");
        }
    }

    // --- A faulty replica's voice: its own trusted log, which says one thing per slot ---------

    /// `slot`'s trusted log attests `body` at its place, if that slot is still free.
    fn attest_as<T: Placed>(&mut self, slot: usize, body: &T) -> Result<Attested<T>, Refusal> {
        let bytes = Bytes::from(wire::encode(body));
        let (log, seq) = body.place(&self.logs);
        let answers = self.components[slot].call_all(&[Call::AdvanceAttest {
            log,
            seq,
            digest: [0; 32],
            value: body_hash(&bytes),
            nonce: a2m::nonce_of(seq),
        }]);
        match answers.into_iter().next() {
            Some(Ok(Outcome::Attested(signed))) => Ok(Attested::new(bytes, signed.to_unverified())),
            Some(Err(refusal)) => Err(refusal),
            other => panic!("an advance-attest answered {other:?}"),
        }
    }

    fn vote(&self, phase: Phase, view: u64, seq: u64, digest: Digest, replica: u32) -> Vote {
        Vote {
            instance: self.instance,
            phase,
            view,
            seq,
            digest,
            replica,
        }
    }
}

fn request(id: u64, add: u64) -> Request<Op> {
    Request {
        origin: Origin::Client(CLIENT),
        id,
        op: Op::Add(add),
    }
}

fn batch(nondet: u64, requests: Vec<Request<Op>>) -> Batch<Op> {
    Batch { nondet, requests }
}

// ---------------------------------------------------------------------------------------------
// Sizes

#[test]
fn params_hold_ea_relations() {
    for f in 1..4 {
        let params = Params::new(f);
        assert_eq!(params.n, 2 * f + 1);
        assert_eq!(params.quorum(), f + 1);
        params.validate().expect("the defaults validate");
        // Two quorums of f+1 among 2f+1 share a replica.
        assert!(2 * params.quorum() > params.n);
    }
    let mut wrong = Params::new(1);
    wrong.n = 4;
    assert!(
        wrong.validate().is_err(),
        "EA with an even n has disjoint quorums"
    );
}

// ---------------------------------------------------------------------------------------------
// Normal case

#[test]
fn a_request_executes_on_every_replica_and_the_client_accepts_f_plus_1_results() {
    for f in [1, 2] {
        let mut net = Net::new(f);
        assert_eq!(net.complete(Op::Add(5)), 5);
        assert_eq!(net.complete(Op::Add(7)), 12);
        net.run_until(1_000, |_| false);
        let all: Vec<usize> = (0..net.params.n).collect();
        net.assert_same(&all);
        assert_eq!(net.replica(0).executed(), 2);
        assert!(net.refused.is_empty(), "{:?}", net.refused);
        assert!(net.conflicts(&net.all()).is_empty());
    }
}

#[test]
fn shuffled_delivery_keeps_every_replica_in_agreement_and_checkpoints_become_stable() {
    for seed in 0..6 {
        let mut net = Net::new(1 + (seed as usize % 2)).shuffled(seed);
        let clients: Vec<usize> = (0..30).map(|i| net.submit(Op::Add(i + 1))).collect();
        net.run();
        assert!(net.run_until(60_000, |net| {
            clients.iter().all(|c| net.result(*c).is_some())
        }));
        for client in &clients {
            net.ok(*client);
        }
        net.run_until(2_000, |_| false);
        assert!(net.conflicts(&net.all()).is_empty(), "seed {seed}");
        let all: Vec<usize> = (0..net.params.n).collect();
        net.assert_same(&all);
        let executed = net.replica(0).executed();
        if executed >= 2 * net.params.checkpoint_interval {
            assert!(
                net.replica(0).stable_seq() > 0,
                "seed {seed}: no stable checkpoint"
            );
        }
    }
}

#[test]
fn many_requests_pass_many_checkpoints_one_number_at_a_time() {
    let mut net = Net::new(1);
    let mut expected = 0;
    for i in 1..=40 {
        expected += i;
        assert_eq!(net.complete(Op::Add(i)), expected);
    }
    let replica = net.replica(1);
    assert_eq!(replica.executed(), 40);
    assert!(
        replica.stable_seq() >= 32,
        "stable at {}",
        replica.stable_seq()
    );
    // The request history was truncated to the checkpoint: slot 1 is forgotten.
    let answers = net.components[1].call_all(&[Call::Lookup {
        log: net.logs.requests,
        seq: net.logs.at(1),
        nonce: [0; 32],
    }]);
    match &answers[0] {
        Ok(Outcome::Attested(signed)) => {
            assert_eq!(signed.value().status, a2m::Status::Forgotten)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_invalid_operation_is_refused_by_every_replica() {
    let mut net = Net::new(1);
    let client = net.submit(Op::Bad);
    net.run();
    assert!(matches!(
        net.result(client),
        Some(Err(OpError::Refused { .. }))
    ));
    assert_eq!(net.replica(0).executed(), 0);
}

// ---------------------------------------------------------------------------------------------
// Equivocation (T2, T9)

/// Prepares an equivocation in view 0 by the primary (slot 0), silenced: returns two batches.
fn two_batches(net: &mut Net) -> (Batch<Op>, Batch<Op>) {
    let now = net.now.0;
    (
        batch(now, vec![request(1, 1)]),
        batch(now, vec![request(2, 2)]),
    )
}

#[test]
fn a_primary_cannot_get_two_pre_prepares_attested_for_one_number() {
    let mut net = Net::new(1);
    net.silence(0);
    let (a, b) = two_batches(&mut net);
    let vote_a = net.vote(Phase::PrePrepare, 0, 1, a.digest(), 0);
    let vote_b = net.vote(Phase::PrePrepare, 0, 1, b.digest(), 0);
    let pre_a = net.attest_as(0, &vote_a).expect("the first is attested");
    let refused = net.attest_as(0, &vote_b).expect_err("the second is not");
    assert!(
        matches!(refused, Refusal::NotMonotone { .. }),
        "{refused:?}"
    );
    // With the first's attestation borrowed, the second is refused by every backup.
    let borrowed = Attested::<Vote>::new(
        Bytes::from(wire::encode(&vote_b)),
        pre_a.attestation.clone(),
    );
    for backup in [1, 2] {
        let refusal = net.inject(
            0,
            backup,
            Message::PrePrepare(Box::new((borrowed.clone(), b.clone()))),
        );
        assert!(
            refusal.expect("refused").contains("value"),
            "backup {backup}"
        );
    }
    // The genuine one goes through.
    net.inject(
        0,
        1,
        Message::PrePrepare(Box::new((pre_a.clone(), a.clone()))),
    );
    net.inject(0, 2, Message::PrePrepare(Box::new((pre_a, a.clone()))));
    net.run();
    assert_eq!(net.replica(1).executed(), 1);
    assert_eq!(net.replica(2).executed(), 1);
    assert!(net.conflicts(&[1, 2]).is_empty());
}

#[test]
fn attestations_of_another_log_slot_replica_or_instance_are_refused() {
    let mut net = Net::new(1);
    net.silence(0);
    let (a, _) = two_batches(&mut net);
    // A COMMIT's attestation (another log) passed off as a PRE-PREPARE.
    let commit = net.vote(Phase::Commit, 0, 1, a.digest(), 0);
    let commit = net.attest_as(0, &commit).expect("attested");
    let as_pre = Attested::<Vote>::new(
        Bytes::from(wire::encode(&net.vote(
            Phase::PrePrepare,
            0,
            1,
            a.digest(),
            0,
        ))),
        commit.attestation.clone(),
    );
    assert!(
        net.inject(0, 1, Message::PrePrepare(Box::new((as_pre, a.clone()))))
            .is_some()
    );
    // Attested at another number.
    let other = net.vote(Phase::PrePrepare, 0, 2, a.digest(), 0);
    let other = net.attest_as(0, &other).expect("attested");
    let moved = Attested::<Vote>::new(
        Bytes::from(wire::encode(&net.vote(
            Phase::PrePrepare,
            0,
            1,
            a.digest(),
            0,
        ))),
        other.attestation,
    );
    assert!(
        net.inject(0, 1, Message::PrePrepare(Box::new((moved, a.clone()))))
            .is_some()
    );
    // Attested by another replica's trusted log (slot 2's) in slot 0's name.
    let vote = net.vote(Phase::PrePrepare, 0, 1, a.digest(), 0);
    let by_two = net.attest_as(2, &vote).expect("attested");
    assert!(
        net.inject(0, 1, Message::PrePrepare(Box::new((by_two, a.clone()))))
            .is_some()
    );
    // A PRE-PREPARE of view 0 from a replica that is not its primary.
    let not_primary = net.vote(Phase::PrePrepare, 0, 2, a.digest(), 2);
    let not_primary = net.attest_as(2, &not_primary).expect("attested");
    assert!(
        net.inject(
            2,
            1,
            Message::PrePrepare(Box::new((not_primary, a.clone())))
        )
        .is_some()
    );
    // Another instance's.
    let mut foreign = net.vote(Phase::PrePrepare, 0, 3, a.digest(), 0);
    foreign.instance = Digest::of("another", b"instance");
    let foreign = net.attest_as(0, &foreign).expect("attested");
    assert!(
        net.inject(0, 1, Message::PrePrepare(Box::new((foreign, a))))
            .is_some()
    );
    net.run();
    assert_eq!(net.replica(1).executed(), 0);
    assert_eq!(net.replica(1).ea_stats().refused, 5);
}

/// The primary equivocates: batch `a` to slot 1 and `b` to slot 2, in PRE-PREPARE and COMMIT,
/// with whatever attestations its trusted log gives (or, if it refuses, the first one again).
fn equivocate(net: &mut Net) {
    net.silence(0);
    let (a, b) = two_batches(net);
    for (to, batch) in [(1, a), (2, b)] {
        let pre = net.vote(Phase::PrePrepare, 0, 1, batch.digest(), 0);
        let commit = net.vote(Phase::Commit, 0, 1, batch.digest(), 0);
        let (pre, commit) = match (net.attest_as(0, &pre), net.attest_as(0, &commit)) {
            (Ok(pre), Ok(commit)) => (pre, commit),
            _ => {
                // The log refused a second statement: reuse the attestations it gave the
                // first, on the second's bodies.
                let first = net.replicas[to].as_ref().map(|_| ());
                let _ = first;
                let old_pre = net.components[0].call_all(&[Call::Lookup {
                    log: net.logs.prepare,
                    seq: net.logs.slot(0, 1),
                    nonce: a2m::nonce_of(net.logs.slot(0, 1)),
                }]);
                let old_commit = net.components[0].call_all(&[Call::Lookup {
                    log: net.logs.commit,
                    seq: net.logs.slot(0, 1),
                    nonce: a2m::nonce_of(net.logs.slot(0, 1)),
                }]);
                let take = |answers: Vec<Result<Outcome, Refusal>>| match answers.into_iter().next()
                {
                    Some(Ok(Outcome::Attested(signed))) => signed.to_unverified(),
                    other => panic!("{other:?}"),
                };
                (
                    Attested::new(Bytes::from(wire::encode(&pre)), take(old_pre)),
                    Attested::new(Bytes::from(wire::encode(&commit)), take(old_commit)),
                )
            }
        };
        net.inject(0, to, Message::PrePrepare(Box::new((pre, batch))));
        net.inject(0, to, Message::Vote(commit));
    }
    net.run();
}

#[test]
fn an_equivocating_primary_splits_no_correct_replicas() {
    let mut net = Net::new(1);
    equivocate(&mut net);
    assert!(net.conflicts(&[1, 2]).is_empty());
    // Slot 1 may execute `a` (the primary's genuine statements and its own); slot 2 refused `b`.
    assert_eq!(net.replica(2).executed(), 0);
    assert!(net.replica(2).ea_stats().refused >= 2);
    // The view changes away from the faulty primary and both end in one state.
    let client = net.submit(Op::Add(10));
    net.run();
    assert!(net.run_until(60_000, |net| net.result(client).is_some()));
    net.run_until(2_000, |_| false);
    assert!(net.conflicts(&[1, 2]).is_empty());
    net.assert_same(&[1, 2]);
}

#[test]
fn without_attestation_checks_an_equivocating_primary_splits_correct_replicas() {
    let mut net = Net::with(1, |p| p.mutations.unchecked_attestations = true);
    equivocate(&mut net);
    assert_eq!(
        net.conflicts(&[1, 2]),
        vec![1],
        "the negative control must decide number 1 two ways"
    );
}

// ---------------------------------------------------------------------------------------------
// View changes (T6, T7)

#[test]
fn a_silent_primary_is_replaced_at_the_bound() {
    // n = 3 with one faulty, n = 5 with two: the primaries of views 0 and 1 are silent, so the
    // replicas must change view twice.
    for f in [1, 2] {
        let mut net = Net::new(f);
        net.silence(0);
        if f == 2 {
            net.block("silence 1", |p| p.from() == Some(Slot(1)));
        }
        let client = net.submit(Op::Add(3));
        net.run();
        assert!(
            net.run_until(120_000, |net| net.result(client).is_some()),
            "f = {f}"
        );
        assert_eq!(net.ok(client), 3);
        let correct: Vec<usize> = (f..net.params.n).collect();
        net.run_until(2_000, |_| false);
        net.assert_same(&correct);
        let (view, active) = net.replica(f).view();
        assert!(view >= f as u64 && active, "f = {f}: view {view}");
        assert!(net.conflicts(&net.all()).is_empty());
    }
}

#[test]
fn repeated_view_changes_under_load_keep_agreement() {
    for seed in 0..4 {
        let mut net = Net::new(2).shuffled(seed);
        let mut clients = Vec::new();
        for round in 0..4u64 {
            // Each round silences a different primary for a while.
            let slot = (round % 5) as u32;
            net.block("round", move |p| p.from() == Some(Slot(slot)));
            for i in 0..5 {
                clients.push(net.submit(Op::Add(round * 10 + i)));
            }
            net.run();
            net.run_until(8_000, |_| false);
            net.unblock("round");
        }
        assert!(net.run_until(120_000, |net| {
            clients.iter().all(|c| net.result(*c).is_some())
        }));
        net.run_until(3_000, |_| false);
        assert!(net.conflicts(&net.all()).is_empty(), "seed {seed}");
        let all: Vec<usize> = (0..5).collect();
        net.assert_same(&all);
    }
}

#[test]
fn a_view_change_keeps_a_batch_committed_by_a_quorum_the_new_primary_missed() {
    let mut net = Net::new(1);
    // Slot 2 hears nothing in view 0: slots 0 and 1 commit number 1 alone.
    net.isolate(2);
    let client = net.submit(Op::Add(4));
    net.run();
    assert_eq!(net.replica(0).executed(), 1);
    assert_eq!(net.replica(1).executed(), 1);
    assert_eq!(net.replica(2).executed(), 0);
    let committed = net.decided[&1][&0];
    // The primary stops; slot 2 comes back. Views 1 (slot 1) and on must keep number 1.
    net.unblock("isolate");
    net.silence(0);
    let later = net.submit(Op::Add(6));
    net.run();
    assert!(net.run_until(60_000, |net| net.result(later).is_some()));
    assert_eq!(net.ok(later), 10);
    assert_eq!(net.decided[&1][&2], committed);
    assert!(net.conflicts(&net.all()).is_empty());
    let _ = client;
}

/// Slots 0 and 1 commit number 1 in view 0 (slot 2 isolated); then everyone wishes for view 1.
/// Returns the wishes and slot 1's commit-log high slot.
fn committed_then_wishes(net: &mut Net) -> Vec<Cast<Want>> {
    net.isolate(2);
    net.submit(Op::Add(4));
    net.run();
    assert_eq!(net.replica(1).executed(), 1);
    (0..3)
        .map(|slot| {
            let want = Want {
                instance: net.instance,
                to: 1,
                nonce: [slot as u8; 32],
                replica: slot as u32,
            };
            Cast::sign(&net.secrets[slot], Slot(slot as u32), want).expect("signs")
        })
        .collect()
}

/// Slot `slot`'s trusted-log calls, answered as attestations.
fn lookups(net: &mut Net, slot: usize, calls: &[Call]) -> Vec<Unverified<a2m::Attestation>> {
    net.components[slot]
        .call_all(calls)
        .into_iter()
        .map(|answer| match answer {
            Ok(Outcome::Attested(signed)) => signed.to_unverified(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_replica_cannot_hide_a_commit_in_its_view_change() {
    let mut net = Net::new(1);
    let wants = committed_then_wishes(&mut net);
    let z = wants_nonce(&net.params, &net.keys, &net.instance, 1, &wants[..2]).expect("z");
    // Slot 1 committed number 1 at [0|1]. It abandons view 0 and claims it reached nothing.
    let commit_log = net.logs.commit;
    let logs = net.logs;
    let _ = net.components[1].call_all(&[Call::Advance {
        log: net.logs.commit,
        seq: net.logs.end_of_view(0),
        digest: [0; 32],
        value: [0; 32],
    }]);
    let hidden = lookups(
        &mut net,
        1,
        &[Call::Lookup {
            log: commit_log,
            seq: logs.slot(0, 1),
            nonce: z,
        }],
    );
    assert_eq!(
        hidden[0].peek().expect("decodes").status,
        a2m::Status::Assigned,
        "its log shows the commit, not a skipped slot"
    );
    let change = ViewChange::<Op> {
        instance: net.instance,
        replica: 1,
        from: 0,
        to: 1,
        stable: Stable::initial(net.replica(2).state_digest()),
        committed: Vec::new(),
        prepared: Vec::new(),
        wants: wants[..2].to_vec(),
        top: 0,
        abandoned: hidden,
        disclosed: Vec::new(),
    };
    let initial = net.replica(2).state_digest();
    let error = change
        .check(
            &net.params,
            &net.logs,
            &net.keys,
            &net.trusted,
            &net.instance,
            &initial,
        )
        .map(|_| ())
        .expect_err("a hidden commit is caught");
    assert!(error.contains("abandonment"), "{error}");
}

#[test]
fn view_changes_missing_a_view_with_too_few_wishes_or_another_nonce_are_refused() {
    let mut net = Net::new(1);
    let wants = committed_then_wishes(&mut net);
    let initial = Digest::of("x", b"y");
    let _ = initial;
    let initial = {
        let fresh = R::new(net.setup(0)).expect("setup");
        fresh.state_digest()
    };
    let z = wants_nonce(&net.params, &net.keys, &net.instance, 2, &[]).err();
    assert!(z.is_some(), "no wishes, no nonce");
    // Slot 2 never committed: an honest view change from 0 to 2 built by hand.
    let wants2: Vec<Cast<Want>> = (0..2)
        .map(|slot| {
            let want = Want {
                instance: net.instance,
                to: 2,
                nonce: [slot as u8 + 7; 32],
                replica: slot as u32,
            };
            Cast::sign(&net.secrets[slot], Slot(slot as u32), want).expect("signs")
        })
        .collect();
    let z2 = wants_nonce(&net.params, &net.keys, &net.instance, 2, &wants2).expect("z");
    for view in 0..2 {
        let _ = net.components[2].call_all(&[Call::Advance {
            log: net.logs.commit,
            seq: net.logs.end_of_view(view),
            digest: [0; 32],
            value: [0; 32],
        }]);
    }
    let commit_log = net.logs.commit;
    let logs = net.logs;
    let abandoned = lookups(
        &mut net,
        2,
        &[
            Call::Lookup {
                log: commit_log,
                seq: logs.slot(0, 1),
                nonce: z2,
            },
            Call::Lookup {
                log: commit_log,
                seq: logs.slot(1, 1),
                nonce: z2,
            },
        ],
    );
    let honest = ViewChange::<Op> {
        instance: net.instance,
        replica: 2,
        from: 0,
        to: 2,
        stable: Stable::initial(initial),
        committed: Vec::new(),
        prepared: Vec::new(),
        wants: wants2.clone(),
        top: 0,
        abandoned: abandoned.clone(),
        disclosed: Vec::new(),
    };
    let check = |change: &ViewChange<Op>| {
        change
            .check(
                &net.params,
                &net.logs,
                &net.keys,
                &net.trusted,
                &net.instance,
                &initial,
            )
            .map(|_| ())
    };
    check(&honest).expect("the honest view change passes");
    let mut missing = honest.clone();
    missing.abandoned.pop();
    assert!(check(&missing).is_err(), "a view left out");
    let mut few = honest.clone();
    few.wants.pop();
    assert!(check(&few).is_err(), "one wish is not f+1");
    let mut other_nonce = honest.clone();
    other_nonce.wants = wants.iter().take(2).cloned().collect();
    assert!(check(&other_nonce).is_err(), "wishes for another view");
    let mut swapped = honest.clone();
    swapped.abandoned.reverse();
    assert!(check(&swapped).is_err(), "abandonments out of place");
}

#[test]
fn a_new_view_of_mixed_origins_or_a_second_one_is_refused() {
    let mut net = Net::new(1);
    net.silence(0);
    let client = net.submit(Op::Add(1));
    net.run();
    assert!(net.run_until(60_000, |net| net.result(client).is_some()));
    let (view, _) = net.replica(1).view();
    assert!(view >= 1);
    // The primary of the view that was entered cannot get a second NEW-VIEW attested for it.
    let primary = net.params.primary(view).index();
    let again = NewView::<Op> {
        instance: net.instance,
        view,
        replica: primary as u32,
        changes: Vec::new(),
    };
    assert!(matches!(
        net.attest_as(primary, &again),
        Err(Refusal::NotMonotone { .. })
    ));
    // A NEW-VIEW for a later view with too few view changes is refused.
    let next = view + 3;
    let primary = net.params.primary(next).index();
    let thin = NewView::<Op> {
        instance: net.instance,
        view: next,
        replica: primary as u32,
        changes: Vec::new(),
    };
    let thin = net.attest_as(primary, &thin).expect("attested");
    let other = (primary + 1) % 3;
    let refusal = net.inject(primary as u32, other, Message::NewView(Box::new(thin)));
    assert!(refusal.expect("refused").contains("view changes"));
}

// ---------------------------------------------------------------------------------------------
// Catching up

#[test]
fn a_partitioned_replica_catches_up_by_certificates_and_state_transfer() {
    let mut net = Net::new(1);
    net.isolate(2);
    for i in 1..=30 {
        net.complete(Op::Add(i));
    }
    assert_eq!(net.replica(2).executed(), 0);
    assert!(net.replica(0).stable_seq() >= 16);
    net.unblock("isolate");
    // The next request sets it asking where the others stand.
    assert_eq!(net.complete(Op::Add(1)), 466);
    assert!(net.run_until(30_000, |net| net.replica(2).executed() == 31));
    net.assert_same(&[0, 1, 2]);
    assert!(net.replica(2).ea_stats().transfers >= 1);
    // It takes part again: with slot 0 silent, 1 and 2 are the quorum.
    net.silence(0);
    assert_eq!(net.complete(Op::Add(2)), 468);
    assert!(net.conflicts(&net.all()).is_empty());
}

#[test]
fn a_forged_checkpoint_or_state_is_refused() {
    let mut net = Net::new(1);
    for i in 1..=8 {
        net.complete(Op::Add(i));
    }
    // Slot 0 lies about its state at 8 with its real log: alone it makes nothing stable.
    let lie = Checkpoint {
        instance: net.instance,
        seq: 16,
        state: Digest::of("a", b"lie"),
        request: [1; 32],
        previous: [2; 32],
        replica: 0,
    };
    let lie = net.attest_as(0, &lie).expect("attested");
    assert!(net.inject(0, 1, Message::Checkpoint(lie)).is_none());
    assert_eq!(net.replica(1).stable_seq(), 8);
    let stolen = Attested::<Checkpoint>::new(Bytes::from_static(b"not a checkpoint"), {
        let answers = net.components[0].call_all(&[Call::End {
            log: net.logs.checkpoint,
            nonce: [0; 32],
        }]);
        match answers.into_iter().next() {
            Some(Ok(Outcome::Attested(signed))) => signed.to_unverified(),
            other => panic!("{other:?}"),
        }
    });
    assert!(net.inject(0, 1, Message::Checkpoint(stolen)).is_some());
}

#[test]
fn a_view_change_must_disclose_every_commit_its_log_holds() {
    let mut net = Net::new(1);
    // Slots 0 and 1 commit number 1; the primary goes silent and slot 2 hears again.
    net.isolate(2);
    net.submit(Op::Add(4));
    net.run();
    net.unblock("isolate");
    net.silence(0);
    // Capture slot 1's view change on its way.
    let captured = std::rc::Rc::new(std::cell::RefCell::new(None));
    let sink = captured.clone();
    net.block("capture", move |p| {
        if let Packet::Peer {
            from: Slot(1),
            message: Message::ViewChange(change),
            ..
        } = p
        {
            sink.borrow_mut().get_or_insert_with(|| (**change).clone());
        }
        false
    });
    let later = net.submit(Op::Add(1));
    net.run();
    assert!(net.run_until(60_000, |net| net.result(later).is_some()));
    let attested = captured
        .borrow()
        .clone()
        .expect("slot 1 sent a view change");
    let honest: ViewChange<Op> = attested.peek().expect("decodes");
    let initial = R::new(net.setup(0)).expect("setup").state_digest();
    let check = |change: &ViewChange<Op>| {
        change
            .check(
                &net.params,
                &net.logs,
                &net.keys,
                &net.trusted,
                &net.instance,
                &initial,
            )
            .map(|_| ())
    };
    check(&honest).expect("its own view change passes");
    assert_eq!(honest.top, 1);
    assert!(
        honest.disclosed[0].1.is_some(),
        "it committed number 1 and says so"
    );
    let mut silent = honest.clone();
    silent.disclosed[0].1 = None;
    assert!(check(&silent).is_err(), "a commit without its body");
    let mut dropped = honest.clone();
    dropped.disclosed.clear();
    assert!(check(&dropped).is_err(), "no disclosure at all");
    let mut unaccounted = honest.clone();
    unaccounted.committed.clear();
    unaccounted.prepared.clear();
    assert!(
        check(&unaccounted).is_err(),
        "a commit its certificates do not cover"
    );
}

/// Omission faults on up to `f` replicas, partitions of the others that heal, shuffled
/// delivery, at both bounds: every number is decided one way and the survivors converge.
#[test]
fn random_omissions_and_partitions_never_split_agreement() {
    for seed in 0..40u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let f = 1 + (seed as usize % 2);
        let mut net = Net::new(f).shuffled(seed);
        let n = net.params.n as u32;
        let mut faulty: Vec<u32> = (0..n).collect();
        while faulty.len() > f {
            faulty.swap_remove(rng.random_range(0..faulty.len()));
        }
        let correct: Vec<u32> = (0..n).filter(|s| !faulty.contains(s)).collect();
        let mut clients = Vec::new();
        for round in 0..6 {
            let silent: Vec<u32> = faulty
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.6))
                .collect();
            net.block("faulty", move |p| {
                p.from().is_some_and(|s| silent.contains(&s.0))
            });
            if round % 2 == 1 {
                let cut = correct[rng.random_range(0..correct.len())];
                net.block("cut", move |p| {
                    p.from() == Some(Slot(cut)) || p.to() == Some(Slot(cut))
                });
            }
            for _ in 0..rng.random_range(1..8) {
                clients.push(net.submit(Op::Add(rng.random_range(1..100))));
            }
            // Some rounds a replica crashes, sometimes with trusted-log calls lost, and
            // restarts from its records at the end of the round.
            let crashed = (round % 3 == 2).then(|| rng.random_range(0..n as usize));
            if let Some(slot) = crashed {
                net.run_steps(rng.random_range(0..200));
                if rng.random_bool(0.5) {
                    net.unattested.insert(slot);
                    net.run_steps(rng.random_range(0..50));
                }
                net.crash(slot);
            }
            net.run();
            net.run_until(rng.random_range(1..8) * 1_000, |_| false);
            if let Some(slot) = crashed {
                net.restore(slot);
            }
            net.unblock("cut");
            net.unblock("faulty");
        }
        // Faulty replicas stay silent; the rest must finish every request.
        let silent = faulty.clone();
        net.block("faulty", move |p| {
            p.from().is_some_and(|s| silent.contains(&s.0))
        });
        let done = net.run_until(300_000, |net| {
            clients.iter().all(|c| net.result(*c).is_some())
        });
        if !done {
            for slot in 0..n as usize {
                let r = net.replica(slot);
                eprintln!(
                    "slot {slot}: view {:?} executed {} stable {} waiting {} stats {:?} target {}",
                    r.view(),
                    r.executed(),
                    r.stable_seq(),
                    r.waiting(),
                    r.ea_stats(),
                    r.debug_target()
                );
            }
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            for (_, reason) in &net.refused {
                *reasons.entry(reason.clone()).or_default() += 1;
            }
            eprintln!("faulty {faulty:?} refused {reasons:#?}");
        }
        assert!(done, "seed {seed}: requests did not finish");
        // One more request needs every correct replica (the faulty ones stay silent): a
        // replica left behind catches up first.
        let last = net.submit(Op::Add(1));
        net.run();
        assert!(
            net.run_until(120_000, |net| net.result(last).is_some()),
            "seed {seed}: the last request did not finish"
        );
        net.run_until(3_000, |_| false);
        assert!(net.conflicts(&correct).is_empty(), "seed {seed}");
        let survivors: Vec<usize> = correct.iter().map(|s| *s as usize).collect();
        net.assert_same(&survivors);
    }
}

// ---------------------------------------------------------------------------------------------
// Restarts

#[test]
fn a_restarted_replica_rebuilds_from_its_records_and_goes_on() {
    let mut net = Net::new(1);
    for i in 1..=12 {
        net.complete(Op::Add(i));
    }
    net.crash(1);
    net.restore(1);
    assert_eq!(net.replica(1).executed(), 12);
    assert_eq!(net.replica(1).state_digest(), net.replica(0).state_digest());
    assert_eq!(net.replica(1).history(), net.replica(0).history());
    // With slot 2 silent, the restarted replica is needed for every quorum.
    net.silence(2);
    assert_eq!(net.complete(Op::Add(100)), 178);
    net.run_until(1_000, |_| false);
    net.assert_same(&[0, 1]);
    assert!(net.conflicts(&net.all()).is_empty());
}

#[test]
fn a_replica_that_crashed_before_its_log_attested_says_the_same_thing_after() {
    let mut net = Net::new(1);
    net.complete(Op::Add(1));
    // The primary records its PRE-PREPARE of number 2 and crashes before attesting it.
    net.unattested.insert(0);
    let client = net.submit(Op::Add(2));
    net.run();
    let recorded = net.disks[0]
        .iter()
        .rev()
        .find_map(|change| match change {
            Change::Said(said) => match &**said {
                Said::PrePrepare(body, batch) => Some((body.clone(), batch.clone())),
                _ => None,
            },
            _ => None,
        })
        .expect("the pre-prepare was recorded");
    net.crash(0);
    net.restore(0);
    // Its first output asks the log again: the slot was free, so it is attested now, and it is
    // the recorded batch that the others execute.
    net.tick(100);
    assert!(net.run_until(60_000, |net| net.result(client).is_some()));
    assert_eq!(net.ok(client), 3);
    assert_eq!(net.decided[&2][&1], recorded.1.digest());
    let held = net.components[0].call_all(&[Call::Lookup {
        log: net.logs.prepare,
        seq: net.logs.slot(0, 2),
        nonce: [0; 32],
    }]);
    match &held[0] {
        Ok(Outcome::Attested(signed)) => {
            assert_eq!(signed.value().value, body_hash(&recorded.0))
        }
        other => panic!("{other:?}"),
    }
    assert!(net.conflicts(&net.all()).is_empty());
}

#[test]
fn a_replica_restarted_in_a_view_change_finishes_it() {
    let mut net = Net::new(1);
    net.complete(Op::Add(1));
    net.silence(0);
    net.block("hold", |p| p.from() == Some(Slot(2)));
    let client = net.submit(Op::Add(2));
    net.run();
    // Slot 1 starts changing view (slot 2 unheard, it cannot finish), crashes, comes back.
    assert!(net.run_until(30_000, |net| !net.replica(1).view().1));
    net.crash(1);
    net.restore(1);
    assert!(!net.replica(1).view().1, "it restarts in its view change");
    net.unblock("hold");
    assert!(net.run_until(120_000, |net| net.result(client).is_some()));
    assert_eq!(net.ok(client), 3);
    net.run_until(1_000, |_| false);
    net.assert_same(&[1, 2]);
    assert!(net.conflicts(&net.all()).is_empty());
}

#[test]
fn a_replica_whose_trusted_log_was_down_says_its_part_once_it_is_back() {
    let mut net = Net::new(1);
    net.complete(Op::Add(1));
    // Slot 2 hears nothing; slot 1's trusted log is down: no quorum can form.
    net.isolate(2);
    net.log_down.insert(1);
    let client = net.submit(Op::Add(2));
    net.run();
    net.tick(100);
    assert!(net.result(client).is_none());
    assert!(net.replica(1).ea_stats().trusted_refused > 0);
    // The log is back: slot 1's PREPARE and COMMIT are asked for again, and number 2 decides
    // in view 0, without a view change.
    net.log_down.clear();
    assert!(net.run_until(1_500, |net| net.result(client).is_some()));
    assert_eq!(net.ok(client), 3);
    assert_eq!(net.replica(1).view(), (0, true));
}

#[test]
fn a_pre_prepare_that_overtakes_its_new_view_is_kept_for_it() {
    let mut net = Net::new(1);
    net.complete(Op::Add(1));
    // The primary of view 0 goes silent; slot 2 gets view 1's NEW-VIEW only after its
    // PRE-PREPARE.
    net.silence(0);
    let held = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = held.clone();
    net.block("hold new views", move |p| match p {
        Packet::Peer {
            to: Slot(2),
            message: Message::NewView(new_view),
            ..
        } => {
            sink.borrow_mut().push((**new_view).clone());
            true
        }
        _ => false,
    });
    let client = net.submit(Op::Add(2));
    net.run();
    assert!(
        net.run_until(30_000, |net| net.replica(1).view() == (1, true)
            && !held.borrow().is_empty()
            && net.replica(1).executed() == 1)
    );
    net.unblock("hold new views");
    let new_views: Vec<_> = held.borrow_mut().drain(..).collect();
    for new_view in new_views {
        net.inject(1, 2, Message::NewView(Box::new(new_view)));
    }
    net.run();
    // Decided in view 1 at once: no STATUS exchange needed to repeat the PRE-PREPARE.
    assert!(
        net.result(client).is_some(),
        "the pre-prepare was dropped with its view"
    );
    assert_eq!(net.ok(client), 3);
    assert_eq!(net.replica(2).view(), (1, true));
}

#[test]
fn lost_checkpoints_are_repeated_so_the_window_opens_again() {
    // With slot 0 silent, a checkpoint is stable only with both others' messages: losing them
    // would close the window above the last stable checkpoint for good.
    let mut net = Net::new(1);
    net.silence(0);
    net.block("lose checkpoints", |p| {
        matches!(
            p,
            Packet::Peer {
                message: Message::Checkpoint(_),
                ..
            }
        )
    });
    for i in 1..=16 {
        net.complete(Op::Add(i));
    }
    assert_eq!(net.replica(1).stable_seq(), 0);
    net.unblock("lose checkpoints");
    let mut total = (1..=16).sum::<u64>();
    for i in 17..=20 {
        total += i;
        assert_eq!(net.complete(Op::Add(i)), total);
    }
    assert!(net.replica(1).stable_seq() >= 16);
}
