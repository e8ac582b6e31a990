//! PBFT's unit tests: a deterministic test application ([`Counter`]), a small network harness
//! ([`Net`]) that keeps persist-then-send and checks, for every message a replica sends, that it
//! recorded what the message vouches for and never said anything else at the same place, and
//! tests of the normal case, checkpoints, view changes, catching up, restarts and the refusal of
//! forged or malformed messages, with the mutations' negative controls.

use super::msg::VIEW_CHANGE_BYTES_MAX;
use super::*;
use crate::machine::{Access, OpError, Operation, Output, Progress, Replica};
use bulwark_core::sign::{PublicKey, SecretKey};
use bulwark_core::{ClientId, Digest, ServiceId, Slot, Time, wire};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

mod e;

// ---------------------------------------------------------------------------------------------
// The test application

/// An operation on the counter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) enum Op {
    Add(u64),
    /// Refused by `check_op`.
    Bad,
}

/// How far a proposed clock may be from a backup's.
const CLOCK_SLACK: u64 = 10_000;

/// A running total, plus a trace of everything executed (number, clock and operation), so that
/// two replicas that executed different batches at one number end with different state digests.
#[derive(Clone, Debug, Default)]
pub(super) struct Counter {
    total: u64,
    trace: u64,
}

impl App for Counter {
    const SERVICE: ServiceId = ServiceId(99);
    const OP_BYTES_MAX: usize = 64;
    const SNAPSHOT_BYTES_MAX: usize = 64;
    type Op = Op;
    type Result = u64;
    type Message = ();
    type Change = ();

    fn check_op(&self, op: &Op) -> Result<(), String> {
        match op {
            Op::Add(_) => Ok(()),
            Op::Bad => Err("a bad operation".into()),
        }
    }

    fn propose(&self, now: Time) -> u64 {
        now.0
    }

    fn check_proposal(&self, now: Time, nondet: u64, _ops: &[&Op]) -> Result<(), String> {
        if nondet.abs_diff(now.0) <= CLOCK_SLACK {
            Ok(())
        } else {
            Err(format!("a clock of {nondet} at {}", now.0))
        }
    }

    fn execute(&mut self, op: &Op, nondet: u64, seq: u64, _out: &mut AppOutput<Self>) -> u64 {
        let add = match op {
            Op::Add(add) => *add,
            Op::Bad => 0,
        };
        self.total += add;
        for word in [seq, nondet, add] {
            self.trace = (self.trace ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.total
    }

    fn snapshot(&self) -> Vec<u8> {
        wire::encode(&(self.total, self.trace))
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let (total, trace) = wire::decode::<(u64, u64)>(snapshot, Self::SNAPSHOT_BYTES_MAX)
            .map_err(|e| e.to_string())?;
        self.total = total;
        self.trace = trace;
        Ok(())
    }
}

type R = PbftReplica<Counter>;
type Msg = Message<Counter>;

pub(super) const CLIENT: ClientId = ClientId(1);
pub(super) const START: Time = Time(100_000);

// ---------------------------------------------------------------------------------------------
// The harness

/// Something in flight.
#[derive(Clone, Debug)]
enum Packet {
    /// Between replicas.
    Peer { from: Slot, to: Slot, message: Msg },
    /// From the client to a replica.
    Request { to: Slot, request: Submitted<Op> },
    /// From a replica to the client, for the request `id`.
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

/// Drops the packets it returns true for.
type Rule = Box<dyn Fn(&Packet) -> bool>;

/// What a replica has made durable, indexed for the checks on what it sends.
#[derive(Default)]
struct Durable {
    /// Accepted pre-prepares: (view, seq, digest).
    accepted: BTreeSet<(u64, u64, Digest)>,
    /// Prepared certificates: (view, seq, digest).
    prepared: BTreeSet<(u64, u64, Digest)>,
    /// Views recorded.
    views: BTreeSet<u64>,
    /// Requests in committed batches.
    committed: BTreeSet<Digest>,
}

struct Client {
    submit: Submit<Counter>,
    result: Option<Result<u64, OpError>>,
}

struct Net {
    params: Params,
    instance: Digest,
    secrets: Vec<SecretKey>,
    keys: Vec<PublicKey>,
    replicas: Vec<Option<R>>,
    /// Each replica's records, in the order it made them durable; they survive crashes.
    disks: Vec<Vec<Change<Counter>>>,
    durable: Vec<Durable>,
    /// Every vote each replica sent: (slot, phase, view, seq) -> digest.
    said: BTreeMap<(u32, u8, u64, u64), Digest>,
    /// Whether sending two digests at one (phase, view, seq) fails the test (off under mutations,
    /// whose negative controls diverge on purpose).
    strict: bool,
    queue: VecDeque<Packet>,
    rules: Vec<(&'static str, Rule)>,
    dropped: Vec<Packet>,
    /// STATUS messages sent, delivered or not.
    statuses: usize,
    refused: Vec<(Slot, String)>,
    clients: Vec<Client>,
    next_id: u64,
    now: Time,
    /// Delivery in a seeded random order instead of FIFO.
    rng: Option<ChaCha8Rng>,
    /// A2M-PBFT-E: the request histories, and each replica's trusted log (shared, so that two
    /// nets can model one faulty replica telling each a different story with one log).
    history: Option<History>,
    components: Vec<Rc<RefCell<bulwark_a2m::Component>>>,
    /// Replicas whose trusted-log calls wait in `held` until released.
    holding: BTreeSet<usize>,
    held: Vec<(Slot, crate::machine::Attest)>,
    /// Replicas whose trusted log is down: every call is answered as refused.
    log_down: BTreeSet<usize>,
}

fn vote_of(cast: &Cast<Vote>) -> Vote {
    wire::decode(cast.signed.bytes(), 128).expect("a vote")
}

fn phase_code(phase: Phase) -> u8 {
    match phase {
        Phase::PrePrepare => 0,
        Phase::Prepare => 1,
        Phase::Commit => 2,
        Phase::Checkpoint => 3,
    }
}

fn request(id: u64, op: Op) -> Request<Op> {
    Request {
        origin: Origin::Client(CLIENT),
        id,
        op,
    }
}

fn batch(nondet: u64, requests: Vec<Request<Op>>) -> Batch<Op> {
    Batch { nondet, requests }
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
        let mut net = Net {
            params,
            instance: Digest::of("bulwark.pbft.test.instance", b"counter"),
            secrets,
            keys,
            replicas: Vec::new(),
            disks: (0..params.n).map(|_| Vec::new()).collect(),
            durable: (0..params.n).map(|_| Durable::default()).collect(),
            said: BTreeMap::new(),
            strict: params.mutations == Mutations::default(),
            queue: VecDeque::new(),
            rules: Vec::new(),
            dropped: Vec::new(),
            statuses: 0,
            refused: Vec::new(),
            clients: Vec::new(),
            next_id: 1,
            now: START,
            rng: None,
            history: None,
            components: Vec::new(),
            holding: BTreeSet::new(),
            held: Vec::new(),
            log_down: BTreeSet::new(),
        };
        net.replicas = (0..params.n)
            .map(|slot| Some(PbftReplica::new(net.setup(slot)).expect("a valid setup")))
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
            instance: self.instance,
            app: Counter::default(),
            history: self.history.clone(),
        }
    }

    fn replica(&self, slot: usize) -> &R {
        self.replicas[slot].as_ref().expect("a live replica")
    }

    fn live(&self) -> impl Iterator<Item = &R> {
        self.replicas.iter().flatten()
    }

    // --- Faults ------------------------------------------------------------------------------

    fn block(&mut self, name: &'static str, rule: impl Fn(&Packet) -> bool + 'static) {
        self.rules.push((name, Box::new(rule)));
    }

    fn unblock(&mut self, name: &'static str) {
        self.rules.retain(|(n, _)| *n != name);
    }

    /// Nothing `slot` sends arrives (it still hears everything).
    fn silence(&mut self, slot: u32) {
        self.block("silence", move |p| p.from() == Some(Slot(slot)));
    }

    /// Nothing reaches or leaves `slot`, client traffic included.
    fn isolate(&mut self, slot: u32) {
        self.block("isolate", move |p| {
            p.from() == Some(Slot(slot)) || p.to() == Some(Slot(slot))
        });
    }

    /// The replica stops; its disk survives and what was in flight to it is lost.
    fn crash(&mut self, slot: usize) {
        self.replicas[slot] = None;
    }

    /// Restarts a crashed replica from its disk.
    fn restore(&mut self, slot: usize) {
        let replica = PbftReplica::restore(self.setup(slot), self.disks[slot].clone(), self.now)
            .expect("a replica's own records restore");
        self.replicas[slot] = Some(replica);
    }

    // --- Clients -----------------------------------------------------------------------------

    /// Starts a request with a fresh id; returns the client's index.
    fn submit(&mut self, op: Op) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        self.submit_as(id, op)
    }

    /// Starts a request with `id` (a retransmission when the id was used before).
    fn submit_as(&mut self, id: u64, op: Op) -> usize {
        let mut submit = match &self.history {
            Some(history) => Submit::attested(self.params, history.clone(), CLIENT, id, op),
            None => Submit::new(self.params, CLIENT, id, op),
        };
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

    /// Submits `op` and runs until its client is done (ticking if need be); returns the result.
    fn complete(&mut self, op: Op) -> u64 {
        let client = self.submit(op);
        self.run();
        for _ in 0..100 {
            if self.result(client).is_some() {
                break;
            }
            self.tick(100);
        }
        self.ok(client)
    }

    // --- Running -----------------------------------------------------------------------------

    /// Delivers until nothing is in flight.
    fn run(&mut self) {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            assert!(steps < 1_000_000, "the network does not quiesce");
        }
    }

    /// Delivers at most `steps` packets.
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
        if matches!(
            packet,
            Packet::Peer {
                message: Message::Status(_),
                ..
            }
        ) {
            self.statuses += 1;
        }
        if self.rules.iter().any(|(_, rule)| rule(&packet)) {
            self.dropped.push(packet);
        } else {
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
                let mut sends = Vec::new();
                for client in &mut self.clients {
                    if client.submit.op() != id || client.result.is_some() {
                        continue;
                    }
                    match client.submit.on_reply(from, answer.clone()) {
                        Progress::Send(more) => sends.extend(more),
                        Progress::Done(result) => client.result = Some(result),
                    }
                }
                for (to, request) in sends {
                    self.queue.push_back(Packet::Request { to, request });
                }
            }
        }
    }

    /// A replica's output: its changes go to its disk first, then what it sends is checked
    /// against its disk and queued.
    fn apply(&mut self, slot: Slot, out: Output<R>, request: Option<u64>) {
        assert!(out.timers.is_empty(), "PBFT sets no timers");
        for change in out.changes {
            self.record(slot, &change);
            self.disks[slot.index()].push(change);
        }
        if let Some(reason) = out.refused {
            self.refused.push((slot, reason));
        }
        if let Some(answer) = out.reply {
            let id = request.expect("a reply answers a request");
            assert_eq!(answer.id(), id);
            self.queue.push_back(Packet::Reply {
                from: slot,
                id,
                answer,
            });
        }
        for (client, id, answer) in out.notify {
            assert_eq!(client, CLIENT);
            if let Answer::Executed(reply) | Answer::Attested { reply, .. } = &answer {
                assert!(
                    self.durable[slot.index()]
                        .committed
                        .contains(&reply.request),
                    "{slot} answered a request before its commit certificate was durable"
                );
            }
            self.queue.push_back(Packet::Reply {
                from: slot,
                id,
                answer,
            });
        }
        for (to, message) in out.sends {
            assert_ne!(to, slot, "a replica sends to itself");
            self.check_send(slot, &message);
            self.queue.push_back(Packet::Peer {
                from: slot,
                to,
                message,
            });
        }
        for attest in out.attest {
            assert!(
                !self.components.is_empty(),
                "a PBFT replica without a trusted log asked for attestations"
            );
            if self.holding.contains(&slot.index()) {
                self.held.push((slot, attest));
            } else {
                self.attest(slot, attest);
            }
        }
    }

    /// Makes `slot`'s trusted-log calls and hands the answers back.
    fn attest(&mut self, slot: Slot, attest: crate::machine::Attest) {
        use bulwark_a2m::A2m;
        let answers = if self.log_down.contains(&slot.index()) {
            vec![Err(bulwark_core::a2m::Refusal::Stopped("down".into()))]
        } else {
            self.components[slot.index()]
                .borrow_mut()
                .call_all(&attest.calls)
        };
        let now = self.now;
        if let Some(replica) = self.replicas[slot.index()].as_mut() {
            let out = replica.on_attested(now, attest.token, answers, &());
            self.apply(slot, out, None);
        }
    }

    /// Makes the calls held for `slot` and stops holding them.
    fn release(&mut self, slot: usize) {
        self.holding.remove(&slot);
        let (mine, others): (Vec<_>, Vec<_>) =
            self.held.drain(..).partition(|(s, _)| s.index() == slot);
        self.held = others;
        for (slot, attest) in mine {
            self.attest(slot, attest);
        }
    }

    fn record(&mut self, slot: Slot, change: &Change<Counter>) {
        let durable = &mut self.durable[slot.index()];
        match change {
            Change::Accepted(accepted) => {
                let vote = vote_of(&accepted.0);
                durable.accepted.insert((vote.view, vote.seq, vote.digest));
            }
            Change::Prepared(proof) => {
                let vote = vote_of(&proof.preprepare);
                durable.prepared.insert((vote.view, vote.seq, vote.digest));
            }
            Change::Committed(committed) => {
                durable
                    .committed
                    .extend(committed.batch.requests.iter().map(Request::digest));
            }
            Change::View { view, .. } => {
                durable.views.insert(*view);
            }
            Change::Checkpoint(_) | Change::App(()) => {}
        }
    }

    /// A replica vouches only for what it recorded, and never for two things at one place.
    fn check_send(&mut self, slot: Slot, message: &Msg) {
        let durable = &self.durable[slot.index()];
        let vote = match message {
            Message::PrePrepare(pre) => {
                let vote = vote_of(&pre.0);
                assert!(
                    durable
                        .accepted
                        .contains(&(vote.view, vote.seq, vote.digest)),
                    "{slot} sent a pre-prepare for {} it has not recorded",
                    vote.seq
                );
                vote
            }
            Message::Vote(cast) => {
                let vote = vote_of(cast);
                let key = (vote.view, vote.seq, vote.digest);
                match vote.phase {
                    Phase::Prepare => assert!(
                        durable.accepted.contains(&key),
                        "{slot} prepared {} before recording the pre-prepare",
                        vote.seq
                    ),
                    Phase::Commit => assert!(
                        durable.prepared.contains(&key),
                        "{slot} committed {} before recording the prepared certificate",
                        vote.seq
                    ),
                    Phase::PrePrepare | Phase::Checkpoint => {}
                }
                vote
            }
            Message::ViewChange(cast) => {
                let change: ViewChange<Op> =
                    wire::decode(cast.signed.bytes(), VIEW_CHANGE_BYTES_MAX)
                        .expect("a view change");
                if cast.slot == slot.0 {
                    assert!(
                        durable.views.contains(&change.view),
                        "{slot} sent a view change to {} before recording the view",
                        change.view
                    );
                }
                return;
            }
            _ => return,
        };
        if vote.replica != slot.0 {
            return; // relayed
        }
        let key = (slot.0, phase_code(vote.phase), vote.view, vote.seq);
        let said = *self.said.entry(key).or_insert(vote.digest);
        if self.strict {
            assert_eq!(
                said, vote.digest,
                "{slot} sent two {:?} votes for {} in view {}",
                vote.phase, vote.seq, vote.view
            );
        }
    }

    /// Advances the clock by `ms` and ticks every replica, then delivers everything.
    fn tick(&mut self, ms: u64) {
        self.now = self.now.plus_millis(ms);
        let now = self.now;
        for slot in 0..self.params.n {
            if let Some(replica) = self.replicas[slot].as_mut() {
                let out = replica.on_tick(now);
                self.apply(Slot(slot as u32), out, None);
            }
        }
        self.run();
    }

    /// Ticks every 100 ms for `ms`.
    fn run_for(&mut self, ms: u64) {
        for _ in 0..ms / 100 {
            self.tick(100);
        }
    }

    /// Ticks every 100 ms until `done` holds, for at most `ms`; returns whether it did.
    fn run_until(&mut self, ms: u64, done: impl Fn(&Net) -> bool) -> bool {
        for _ in 0..ms / 100 {
            if done(self) {
                return true;
            }
            self.tick(100);
        }
        done(self)
    }

    /// Hands `message` to `to` as if `from` sent it (no rules apply); returns the refusal, if
    /// any, and what `to` sent in answer (also queued).
    fn inject(&mut self, from: u32, to: usize, message: Msg) -> (Option<String>, Vec<(Slot, Msg)>) {
        let now = self.now;
        let out = self.replicas[to]
            .as_mut()
            .expect("a live replica")
            .on_message(now, Slot(from), message, &());
        let refused = out.refused.clone();
        let sends = out.sends.clone();
        self.apply(Slot(to as u32), out, None);
        (refused, sends)
    }

    // --- Forging -----------------------------------------------------------------------------

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

    /// `vote` signed with `key`'s secret, claiming to be from `slot`.
    fn sign_as(&self, key: u32, slot: u32, vote: Vote) -> Cast<Vote> {
        Cast::sign(&self.secrets[key as usize], Slot(slot), vote).expect("a vote signs")
    }

    /// A pre-prepare for `batch` at (`view`, `seq`), signed by the view's primary.
    fn preprepare(&self, view: u64, seq: u64, batch: Batch<Op>) -> Msg {
        let primary = self.params.primary(view).0;
        let vote = self.vote(Phase::PrePrepare, view, seq, batch.digest(), primary);
        Message::PrePrepare(Box::new((self.sign_as(primary, primary, vote), batch)))
    }

    /// A genuine vote of `replica`.
    fn genuine(&self, phase: Phase, view: u64, seq: u64, digest: Digest, replica: u32) -> Msg {
        let vote = self.vote(phase, view, seq, digest, replica);
        Message::Vote(self.sign_as(replica, replica, vote))
    }

    /// A prepared certificate for `batch` at (`view`, `seq`), every signature genuine.
    fn prepared_proof(&self, view: u64, seq: u64, batch: Batch<Op>) -> PreparedProof<Op> {
        let primary = self.params.primary(view).0;
        let digest = batch.digest();
        let preprepare = self.vote(Phase::PrePrepare, view, seq, digest, primary);
        PreparedProof {
            preprepare: self.sign_as(primary, primary, preprepare),
            batch,
            prepares: (0..self.params.n as u32)
                .filter(|slot| *slot != primary)
                .take(2 * self.params.f)
                .map(|slot| {
                    self.sign_as(
                        slot,
                        slot,
                        self.vote(Phase::Prepare, view, seq, digest, slot),
                    )
                })
                .collect(),
        }
    }

    // --- Inspection --------------------------------------------------------------------------

    /// The batches `slot` recorded as committed, by number (with the view they committed in).
    fn committed(&self, slot: usize) -> BTreeMap<u64, (u64, Digest)> {
        let mut committed = BTreeMap::new();
        for change in &self.disks[slot] {
            if let Change::Committed(c) = change {
                let digest = c.batch.digest();
                let previous = committed.insert(c.seq, (c.view, digest));
                assert!(
                    previous.is_none_or(|(_, d)| d == digest),
                    "slot {slot} recorded two batches for {}",
                    c.seq
                );
            }
        }
        committed
    }

    /// Numbers at which two replicas recorded different committed batches.
    fn conflicts(&self) -> Vec<u64> {
        let mut decided: BTreeMap<u64, BTreeSet<Digest>> = BTreeMap::new();
        for slot in 0..self.params.n {
            for (seq, (_, digest)) in self.committed(slot) {
                decided.entry(seq).or_default().insert(digest);
            }
        }
        decided
            .into_iter()
            .filter(|(_, digests)| digests.len() > 1)
            .map(|(seq, _)| seq)
            .collect()
    }

    /// Every live replica executed the same numbers to the same state, and no two replicas ever
    /// committed different batches at one number.
    fn assert_agree(&self) {
        assert_eq!(
            self.conflicts(),
            Vec::<u64>::new(),
            "replicas committed different batches"
        );
        let first = self.live().next().expect("a live replica");
        for replica in self.live() {
            assert_eq!(replica.executed(), first.executed());
            assert_eq!(replica.state_digest(), first.state_digest());
            assert_eq!(replica.app().total, first.app().total);
        }
    }

    fn refusals_at(&self, slot: usize) -> usize {
        self.refused
            .iter()
            .filter(|(s, _)| s.index() == slot)
            .count()
    }
}

fn is_vote(message: &Msg, phase: Phase) -> bool {
    matches!(message, Message::Vote(cast) if vote_of(cast).phase == phase)
}

/// The digest of the prepare a replica sent among `sends`, if any.
fn prepared_digest(sends: &[(Slot, Msg)]) -> Option<Digest> {
    sends.iter().find_map(|(_, message)| match message {
        Message::Vote(cast) if vote_of(cast).phase == Phase::Prepare => Some(vote_of(cast).digest),
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// Parameters and records

#[test]
fn params_hold_pbft_relations() {
    let params = Params::new(1);
    assert_eq!(
        (params.n, params.quorum(), params.reply_quorum()),
        (4, 3, 2)
    );
    assert_eq!(params.primary(5), Slot(1));
    assert!(params.validate().is_ok());
    assert!(Params { n: 5, ..params }.validate().is_err());
    assert!(
        Params {
            window: 15,
            ..params
        }
        .validate()
        .is_err()
    );
    let mut broken = params;
    broken.mutations.quorum_2f = true;
    assert_eq!(broken.quorum(), 2);
    assert!(
        PbftReplica::<Counter>::new(Setup {
            me: Slot(1),
            ..Net::new(1).setup(0)
        })
        .is_err(),
        "a key that is not the slot's"
    );
}

#[test]
fn change_seq_names_the_number_of_agreement_records() {
    let mut net = Net::new(1);
    assert_eq!(net.complete(Op::Add(3)), 3);
    let disk = &net.disks[1];
    let kinds: Vec<(&str, Option<u64>)> = disk
        .iter()
        .map(|change| {
            let kind = match change {
                Change::View { .. } => "view",
                Change::Accepted(_) => "accepted",
                Change::Prepared(_) => "prepared",
                Change::Committed(_) => "committed",
                Change::Checkpoint(_) => "checkpoint",
                Change::App(()) => "app",
            };
            (kind, change.seq())
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("accepted", Some(1)),
            ("prepared", Some(1)),
            ("committed", Some(1))
        ]
    );
    assert_eq!(
        Change::<Counter>::View {
            view: 3,
            active: true
        }
        .seq(),
        None
    );

    // Past a checkpoint, the checkpoint record names no number.
    for add in 0..8 {
        net.complete(Op::Add(add));
    }
    let checkpoint = net.disks[1]
        .iter()
        .find(|change| matches!(change, Change::Checkpoint(_)))
        .expect("a checkpoint record after 8 batches");
    assert_eq!(checkpoint.seq(), None);
    // Later records keep numbering from where they are.
    let last = net.disks[1].iter().rev().find_map(Change::seq);
    assert_eq!(last, Some(9));
}

// ---------------------------------------------------------------------------------------------
// Normal case

#[test]
fn a_request_executes_everywhere_and_the_client_accepts_f_plus_1_replies() {
    let mut net = Net::new(1);
    let client = net.submit(Op::Add(5));
    net.run();
    assert_eq!(net.ok(client), 5);
    for replica in net.live() {
        assert_eq!(replica.executed(), 1);
        assert_eq!(replica.app().total, 5);
        assert_eq!(replica.pbft_stats().requests, 1);
        assert_eq!(replica.view(), (0, true));
        assert_eq!(replica.waiting(), 0);
    }
    net.assert_agree();
    assert!(net.refused.is_empty(), "{:?}", net.refused);

    // The client is done after f+1 = 2 matching replies, not before.
    let mut submit = Submit::<Counter>::new(net.params, CLIENT, 1, Op::Add(5));
    let digest = request(1, Op::Add(5)).digest();
    let reply = |result| {
        Answer::Executed(Reply {
            view: 0,
            id: 1,
            request: digest,
            result,
        })
    };
    assert!(matches!(submit.on_reply(Slot(0), reply(5)), Progress::Send(s) if s.is_empty()));
    assert!(
        matches!(submit.on_reply(Slot(0), reply(5)), Progress::Send(_)),
        "one slot, one vote"
    );
    assert!(
        matches!(submit.on_reply(Slot(1), reply(6)), Progress::Send(_)),
        "a different result"
    );
    // A reply for another request with the same id does not count.
    let other = Answer::Executed(Reply {
        view: 0,
        id: 1,
        request: request(1, Op::Add(6)).digest(),
        result: 5,
    });
    assert!(matches!(submit.on_reply(Slot(2), other), Progress::Send(_)));
    assert!(matches!(
        submit.on_reply(Slot(3), reply(5)),
        Progress::Done(Ok(5))
    ));
}

#[test]
fn concurrent_requests_are_batched_and_every_replica_executes_the_same_sequence() {
    let mut net = Net::new(1);
    let clients: Vec<usize> = (0..20).map(|_| net.submit(Op::Add(1))).collect();
    net.run();
    let results: BTreeSet<u64> = clients.iter().map(|c| net.ok(*c)).collect();
    assert_eq!(
        results,
        (1..=20).collect(),
        "each request saw its own total"
    );
    let batches = net.replica(0).executed();
    assert!(
        (2..20).contains(&batches),
        "{batches} batches for 20 requests with 4 in flight"
    );
    for replica in net.live() {
        assert_eq!(replica.pbft_stats().requests, 20);
        assert_eq!(replica.app().total, 20);
    }
    let sequence = net.committed(0);
    assert_eq!(sequence.len() as u64, batches);
    for slot in 1..4 {
        assert_eq!(
            net.committed(slot),
            sequence,
            "slot {slot} committed another sequence"
        );
    }
    net.assert_agree();
}

#[test]
fn batches_never_exceed_batch_max() {
    let mut net = Net::with(1, |p| p.batch_max = 3);
    let clients: Vec<usize> = (0..20).map(|_| net.submit(Op::Add(2))).collect();
    net.run();
    for client in clients {
        net.ok(client);
    }
    for change in &net.disks[2] {
        if let Change::Committed(c) = change {
            assert!(
                c.batch.requests.len() <= 3,
                "a batch of {}",
                c.batch.requests.len()
            );
        }
    }
    assert_eq!(net.replica(2).app().total, 40);
    net.assert_agree();
}

#[test]
fn shuffled_delivery_keeps_every_replica_in_agreement() {
    for seed in 0..6 {
        let mut net = Net::new(1).shuffled(seed);
        // Fewer requests of one client in flight than results are remembered per submitter:
        // see `a_late_copy_of_a_request_within_the_remembered_results_executes_once`.
        let clients: Vec<usize> = (1..=8).map(|add| net.submit(Op::Add(add))).collect();
        net.run();
        // Checkpoint votes that overtook a replica's own checkpoint are picked up by STATUS.
        net.run_for(1_000);
        for client in clients {
            net.ok(client);
        }
        net.assert_agree();
        assert_eq!(net.replica(3).app().total, 36, "seed {seed}");
    }
}

#[test]
fn a_retransmitted_request_executes_once_and_gets_the_same_result() {
    let mut net = Net::new(1);
    net.complete(Op::Add(2));
    let first = net.submit(Op::Add(5));
    let id = net.clients[first].submit.op();
    // A copy sent while the first is in flight.
    let copy = net.submit_as(id, Op::Add(5));
    net.run();
    assert_eq!(net.ok(first), 7);
    assert_eq!(net.ok(copy), 7);
    // A retransmission after execution is answered from the remembered results.
    let digest = net.replica(0).state_digest();
    let late = net.submit_as(id, Op::Add(5));
    net.run();
    assert_eq!(net.ok(late), 7);
    for replica in net.live() {
        assert_eq!(replica.pbft_stats().requests, 2);
        assert_eq!(replica.executed(), 2);
        assert_eq!(replica.app().total, 7);
        assert_eq!(replica.state_digest(), digest);
    }
    // The same id with another operation is another request.
    let other = net.submit_as(id, Op::Add(1));
    net.run();
    assert_eq!(net.ok(other), 8);
    net.assert_agree();
}

#[test]
fn a_late_copy_of_a_request_within_the_remembered_results_executes_once() {
    // A backup's forward of request 1 to the primary is delayed until the same client's next 8
    // requests executed; nothing is faulty, the network is only slow. Results of the last 32
    // requests per submitter are remembered (module docs: beyond that, an operation must be
    // harmless to repeat).
    let mut net = Net::new(1);
    net.block("slow forward", |p| {
        matches!(p, Packet::Peer { from: Slot(1), message: Message::Forward(r), .. } if r.id == 1)
    });
    for add in 1..=9 {
        net.complete(Op::Add(add));
    }
    assert_eq!(net.replica(0).app().total, 45);
    net.unblock("slow forward");
    let late = std::mem::take(&mut net.dropped);
    net.queue.extend(late.into_iter().filter(|p| {
        matches!(
            p,
            Packet::Peer {
                message: Message::Forward(_),
                ..
            }
        )
    }));
    net.run();
    net.run_for(3_000);
    for replica in net.live() {
        assert_eq!(replica.pbft_stats().requests, 9, "request 1 executed twice");
        assert_eq!(replica.app().total, 45);
    }
}

#[test]
fn a_backup_forwards_a_request_the_primary_missed() {
    let mut net = Net::new(1);
    net.block("client to primary", |p| {
        matches!(p, Packet::Request { to: Slot(0), .. })
    });
    let client = net.submit(Op::Add(3));
    net.run();
    assert_eq!(net.ok(client), 3, "executed without a view change");
    for replica in net.live() {
        assert_eq!((replica.view(), replica.executed()), ((0, true), 1));
    }
}

#[test]
fn a_request_ordered_twice_by_a_faulty_primary_executes_once() {
    let mut net = Net::new(1);
    net.silence(0);
    let now = net.now.0;
    let twice = request(1, Op::Add(5));
    for (seq, extra) in [(1, 10), (2, 20)] {
        let pre = net.preprepare(
            0,
            seq,
            batch(now, vec![twice.clone(), request(extra, Op::Add(extra))]),
        );
        for to in 1..4 {
            let (refused, _) = net.inject(0, to, pre.clone());
            assert_eq!(refused, None);
        }
    }
    net.run();
    for slot in 1..4 {
        let replica = net.replica(slot);
        assert_eq!(replica.executed(), 2);
        assert_eq!(replica.app().total, 5 + 10 + 20, "the request added once");
        assert_eq!(replica.pbft_stats().requests, 3);
    }
}

#[test]
fn an_invalid_operation_is_refused_by_every_replica() {
    let mut net = Net::new(1);
    let client = net.submit(Op::Bad);
    net.run();
    match net.result(client) {
        Some(Err(OpError::Refused { reason, by })) => {
            assert!(reason.contains("bad operation"), "{reason}");
            assert!(by.len() > net.params.f, "{by:?}");
        }
        other => panic!("{other:?}"),
    }
    for slot in 0..4 {
        assert_eq!(net.refusals_at(slot), 1, "slot {slot} marked its refusal");
        assert_eq!(net.replica(slot).executed(), 0);
        assert_eq!(net.replica(slot).waiting(), 0);
    }
    // Nothing was proposed.
    assert!(net.disks.iter().all(Vec::is_empty));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints and catching up

#[test]
fn checkpoints_become_stable_and_truncate_the_log() {
    let mut net = Net::new(1);
    for add in 1..=20 {
        net.complete(Op::Add(add));
    }
    let initial = PbftReplica::new(net.setup(0))
        .expect("a replica")
        .state_digest();
    for slot in 0..4 {
        let replica = net.replica(slot);
        assert_eq!(replica.executed(), 20);
        assert_eq!(replica.stable_seq(), 16, "slot {slot}");
        let proofs: Vec<u64> = net.disks[slot]
            .iter()
            .filter_map(|change| match change {
                Change::Checkpoint(transfer) => {
                    transfer
                        .proof
                        .check(&net.params, &net.keys, &net.instance, &initial)
                        .expect("a valid checkpoint proof");
                    Some(transfer.proof.seq)
                }
                _ => None,
            })
            .collect();
        assert_eq!(proofs, vec![8, 16]);
    }
    net.assert_agree();

    // A replica that knows nothing gets the stable state and only what follows it: the log
    // below the checkpoint is gone.
    let status = Status {
        view: 0,
        active: true,
        executed: 0,
        stable: 0,
    };
    let (refused, sends) = net.inject(3, 0, Message::Status(status));
    assert_eq!(refused, None);
    let mut committed = Vec::new();
    let mut state = None;
    for (to, message) in &sends {
        assert_eq!(*to, Slot(3));
        match message {
            Message::State(transfer) => state = Some(transfer.proof.seq),
            Message::Committed(c) => committed.push(c.seq),
            _ => {}
        }
    }
    assert_eq!(state, Some(16));
    assert_eq!(committed, vec![17, 18, 19, 20]);
    net.queue.clear();
}

#[test]
fn a_partitioned_replica_catches_up_by_state_transfer() {
    let mut net = Net::new(1);
    net.isolate(3);
    for add in 1..=36 {
        assert_eq!(net.complete(Op::Add(1)), add);
    }
    assert_eq!(net.replica(0).stable_seq(), 32);
    assert_eq!(net.replica(3).executed(), 0);
    net.unblock("isolate");
    // New traffic beyond the partitioned replica's window tells it that it is behind.
    assert_eq!(net.complete(Op::Add(1)), 37);
    net.run_for(1_000);
    let replica = net.replica(3);
    assert_eq!(replica.executed(), 37);
    assert!(replica.pbft_stats().transfers >= 1);
    assert!(replica.stable_seq() >= 32);
    net.assert_agree();
    // It takes part again: with another replica silent, it is needed for every quorum.
    net.isolate(2);
    assert_eq!(net.complete(Op::Add(1)), 38);
    assert_eq!(net.replica(3).executed(), 38);
}

#[test]
fn a_replica_that_missed_commits_catches_up_by_committed_certificates() {
    let mut net = Net::new(1);
    // Slot 2 hears no commits: it prepares but cannot decide on its own.
    net.block("commits", |p| {
        matches!(p, Packet::Peer { to: Slot(2), message, .. } if is_vote(message, Phase::Commit))
    });
    for _ in 0..3 {
        net.complete(Op::Add(4));
    }
    assert_eq!(net.replica(2).executed(), 0);
    net.unblock("commits");
    net.run_for(1_000);
    assert_eq!(net.replica(2).executed(), 3);
    assert_eq!(
        net.replica(2).pbft_stats().transfers,
        0,
        "no state transfer needed"
    );
    net.assert_agree();
}

#[test]
fn status_exchanges_are_paced_by_the_timer() {
    // Slot 2 hears no commits and no certificates: it prepares, never executes, and times out
    // alone into view 1, while the others executed in view 0. Each is ahead of the other in one
    // respect; what they send each other cannot close the gap.
    let mut net = Net::new(1);
    net.block("to 2", |p| {
        matches!(p, Packet::Peer { to: Slot(2), message, .. }
            if is_vote(message, Phase::Commit) || matches!(message, Message::Committed(_)))
    });
    net.complete(Op::Add(1));
    net.run_for(3_000);
    assert_eq!(net.replica(2).view(), (1, false));
    let before = net.statuses;
    net.run_for(3_000);
    // At most one STATUS per replica and peer every status_ms.
    let bound = 4 * 3 * (3_000 / net.params.status_ms as usize + 1);
    assert!(
        net.statuses - before <= bound,
        "{} STATUS in 3 s",
        net.statuses - before
    );
    net.unblock("to 2");
    net.run_for(1_000);
    assert_eq!(
        net.replica(2).executed(),
        1,
        "it catches up once certificates arrive"
    );
}

// ---------------------------------------------------------------------------------------------
// View changes

#[test]
fn a_silent_primary_is_replaced() {
    let mut net = Net::new(1);
    net.silence(0);
    let client = net.submit(Op::Add(5));
    net.run();
    assert!(net.result(client).is_none());
    let done = net.run_until(6_000, |net| net.result(client).is_some());
    assert!(done, "no new view");
    assert_eq!(net.ok(client), 5);
    for replica in net.live() {
        assert_eq!(replica.view(), (1, true));
        assert_eq!(replica.primary(), Slot(1));
        assert!(replica.pbft_stats().view_changes >= 1);
    }
    // Slot 0 hears everything, so it follows.
    net.run_for(1_000);
    net.assert_agree();
    // The new view keeps going.
    assert_eq!(net.complete(Op::Add(1)), 6);
}

#[test]
fn a_view_change_that_stalls_moves_on_to_the_next_view() {
    // f = 2: the primaries of views 0 and 1 are both silent.
    let mut net = Net::new(2);
    net.silence(0);
    net.block("silence 1", |p| p.from() == Some(Slot(1)));
    let client = net.submit(Op::Add(7));
    let done = net.run_until(20_000, |net| net.result(client).is_some());
    assert!(done, "no view started");
    assert_eq!(net.ok(client), 7);
    for slot in 2..7 {
        assert_eq!(net.replica(slot).view(), (2, true));
    }
    net.run_for(1_000);
    net.assert_agree();
    assert_eq!(net.complete(Op::Add(1)), 8);
}

#[test]
fn a_replica_that_timed_out_alone_waits_in_its_view_change_for_the_others() {
    // Slot 2 is cut off from its peers (not from the client) with a request that executes
    // elsewhere: it times out alone into view 1.
    let mut net = Net::new(1);
    net.block(
        "cut",
        |p| matches!(p, Packet::Peer { from, to, .. } if *from == Slot(2) || *to == Slot(2)),
    );
    assert_eq!(net.complete(Op::Add(1)), 1);
    net.run_for(60_000);
    let (view, active) = net.replica(2).view();
    assert!(!active);
    assert_eq!(
        view, 1,
        "with no other replica changing view, it stays in the first one"
    );
    net.unblock("cut");
    net.run_for(2_000);
    assert_eq!(net.replica(2).executed(), 1);
    // Then the primary fails: the others change view, and slot 2 is there to make a quorum.
    net.silence(0);
    let client = net.submit(Op::Add(1));
    let done = net.run_until(10_000, |net| net.result(client).is_some());
    assert!(
        done,
        "views {:?}",
        net.live().map(R::view).collect::<Vec<_>>()
    );
    assert_eq!(net.ok(client), 2);
    assert_eq!(net.replica(2).view(), (1, true));
}

/// Prepares request `Add(5)` at every backup in view 0 while commits reach only slot 3 (which
/// decides it), then silences the primary until the backups move on; returns the client and the
/// batch view 0 prepared.
fn prepared_then_primary_silent(net: &mut Net) -> (usize, Digest) {
    net.block("view-0 commits", |p| match p {
        Packet::Peer { to, message, .. } if *to != Slot(3) && is_vote(message, Phase::Commit) => {
            let Message::Vote(cast) = message else {
                return false;
            };
            vote_of(cast).view == 0
        }
        _ => false,
    });
    // Nor may slot 3 hand its commit certificate to the others.
    net.block("certificates", |p| {
        matches!(
            p,
            Packet::Peer {
                message: Message::Committed(_),
                ..
            }
        )
    });
    let client = net.submit(Op::Add(5));
    net.run();
    let (_, prepared) = net.committed(3)[&1];
    assert_eq!(net.replica(3).executed(), 1);
    for slot in 0..3 {
        assert_eq!(net.replica(slot).executed(), 0);
    }
    net.silence(0);
    net.run_for(6_000);
    (client, prepared)
}

#[test]
fn a_view_change_keeps_a_prepared_batch() {
    let mut net = Net::new(1);
    let (client, prepared) = prepared_then_primary_silent(&mut net);
    assert_eq!(net.ok(client), 5);
    for slot in 1..4 {
        assert_eq!(net.replica(slot).view(), (1, true));
        assert_eq!(net.replica(slot).executed(), 1);
        let (_, digest) = net.committed(slot)[&1];
        assert_eq!(digest, prepared, "slot {slot} decided another batch at 1");
    }
    // Slots 1 and 2 decided it in the new view: the batch crossed the view change.
    assert_eq!(net.committed(1)[&1].0, 1);
    assert_eq!(net.committed(2)[&1].0, 1);
    net.assert_agree();
}

#[test]
fn without_prepared_certificates_a_view_change_decides_a_number_twice() {
    // Negative control: the property the test above checks fails under the mutation.
    let mut net = Net::with(1, |p| p.mutations.drop_prepared = true);
    let (_, prepared) = prepared_then_primary_silent(&mut net);
    assert_eq!(net.replica(1).view(), (1, true));
    let (_, redecided) = net.committed(1)[&1];
    assert_ne!(redecided, prepared, "the new view re-decided number 1");
    assert_eq!(net.conflicts(), vec![1]);
    assert_ne!(net.replica(1).state_digest(), net.replica(3).state_digest());
}

/// In view 0, `Add(5)` prepares at slots 2 and 3 only and commits reach only slot 3; then slots
/// {0, 1} and {2, 3} are cut apart for a while, and the network heals. No commit certificate is
/// ever relayed, so what a replica decides it decides through its own quorums.
fn split_quorums(net: &mut Net) {
    net.block("view-0 votes", |p| match p {
        Packet::Peer {
            to,
            message: Message::Vote(cast),
            ..
        } => {
            let vote = vote_of(cast);
            vote.view == 0
                && match vote.phase {
                    Phase::Prepare => to.0 < 2,
                    Phase::Commit => *to != Slot(3),
                    _ => false,
                }
        }
        _ => false,
    });
    net.block("certificates", |p| {
        matches!(
            p,
            Packet::Peer {
                message: Message::Committed(_),
                ..
            }
        )
    });
    net.submit(Op::Add(5));
    net.run();
    net.block("split", |p| match p {
        Packet::Peer { from, to, .. } => (from.0 < 2) != (to.0 < 2),
        _ => false,
    });
    net.run_for(3_000);
    net.unblock("split");
    net.run_for(10_000);
}

#[test]
fn full_quorums_keep_a_partitioned_minority_from_deciding() {
    let mut net = Net::new(1);
    split_quorums(&mut net);
    assert_eq!(net.conflicts(), Vec::<u64>::new());
    for slot in 0..4 {
        assert_eq!(net.replica(slot).executed(), 1, "slot {slot}");
        assert_eq!(net.replica(slot).app().total, 5);
    }
    net.assert_agree();
}

#[test]
fn quorums_of_2f_decide_a_number_twice() {
    // Negative control: with quorums of 2f, slot 3 decides on two commits, and {0, 1} start a
    // view on their two view changes that knows nothing of it.
    let mut net = Net::with(1, |p| p.mutations.quorum_2f = true);
    split_quorums(&mut net);
    assert_eq!(
        net.committed(3)[&1].0,
        0,
        "slot 3 decided in view 0 with 2f commits"
    );
    assert_eq!(net.conflicts(), vec![1]);
}

#[test]
fn a_replica_decides_only_on_2f_plus_1_commits() {
    for quorum_2f in [false, true] {
        let mut net = Net::with(1, |p| p.mutations.quorum_2f = quorum_2f);
        // Slot 3 hears commits only from slot 2.
        net.block("commits", |p| {
            matches!(p, Packet::Peer { from, to: Slot(3), message } if *from != Slot(2) && is_vote(message, Phase::Commit))
        });
        net.submit(Op::Add(1));
        net.run();
        let decided = net.replica(3).executed() == 1;
        assert_eq!(decided, quorum_2f, "with quorum_2f = {quorum_2f}");
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals

#[test]
fn an_equivocating_primary_cannot_replace_an_accepted_batch() {
    let mut net = Net::new(1);
    net.silence(0);
    let now = net.now.0;
    let first = batch(now, vec![request(1, Op::Add(1))]);
    let second = batch(now, vec![request(2, Op::Add(2))]);
    for to in 1..4 {
        let (refused, sends) = net.inject(0, to, net.preprepare(0, 1, first.clone()));
        assert_eq!(refused, None);
        assert_eq!(prepared_digest(&sends), Some(first.digest()));
    }
    let (refused, sends) = net.inject(0, 1, net.preprepare(0, 1, second.clone()));
    assert!(refused.is_some_and(|r| r.contains("two batches")));
    assert!(sends.is_empty(), "{sends:?}");
    net.run();
    for slot in 1..4 {
        assert_eq!(
            net.replica(slot).app().total,
            1,
            "slot {slot} executed the first batch"
        );
    }
    assert_eq!(net.committed(1)[&1].1, first.digest());
}

#[test]
fn pre_prepares_that_break_the_rules_are_refused() {
    let mut net = Net::with(1, |p| p.batch_max = 4);
    net.silence(0);
    let now = net.now.0;
    let requests = |n: u64| {
        (1..=n)
            .map(|id| request(id, Op::Add(id)))
            .collect::<Vec<_>>()
    };
    let cases: Vec<(&str, Msg)> = vec![
        ("too large", net.preprepare(0, 1, batch(now, requests(5)))),
        (
            "clock",
            net.preprepare(0, 1, batch(now + 5 * CLOCK_SLACK, requests(2))),
        ),
        (
            "bad operation",
            net.preprepare(0, 1, batch(now, vec![request(9, Op::Bad)])),
        ),
        (
            "twice",
            net.preprepare(0, 1, batch(now, vec![request(1, Op::Add(1)); 2])),
        ),
        ("backup", {
            let b = batch(now, requests(1));
            let vote = net.vote(Phase::PrePrepare, 0, 1, b.digest(), 2);
            Message::PrePrepare(Box::new((net.sign_as(2, 2, vote), b)))
        }),
        ("does not match", {
            let b = batch(now, requests(1));
            let vote = net.vote(Phase::PrePrepare, 0, 1, b.digest(), 0);
            Message::PrePrepare(Box::new((net.sign_as(0, 0, vote), batch(now, requests(2)))))
        }),
        ("signature", {
            let b = batch(now, requests(1));
            let vote = net.vote(Phase::PrePrepare, 0, 1, b.digest(), 0);
            Message::PrePrepare(Box::new((net.sign_as(3, 0, vote), b)))
        }),
    ];
    for (what, message) in cases {
        let from = match &message {
            Message::PrePrepare(pre) => pre.0.slot,
            _ => 0,
        };
        let (refused, sends) = net.inject(from, 1, message);
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
        assert!(sends.is_empty(), "{what}: {sends:?}");
    }
    // Beyond the high watermark (the stable checkpoint plus the window), nothing is accepted.
    let window = net.params.window;
    let (_, sends) = net.inject(0, 1, net.preprepare(0, window + 1, batch(now, requests(1))));
    assert!(sends.is_empty(), "{sends:?}");
    assert!(net.disks[1].is_empty());
    // At the bound, the same primary's batch is fine.
    let (refused, sends) = net.inject(0, 1, net.preprepare(0, 1, batch(now, requests(4))));
    assert_eq!(refused, None);
    assert!(prepared_digest(&sends).is_some());
}

#[test]
fn forged_votes_are_refused_and_do_not_count() {
    let mut net = Net::new(1);
    net.silence(0);
    let a = batch(net.now.0, vec![request(1, Op::Add(1))]);
    let d = a.digest();
    let (_, sends) = net.inject(0, 1, net.preprepare(0, 1, a));
    assert_eq!(prepared_digest(&sends), Some(d));
    let other = Digest::of("bulwark.pbft.test.instance", b"another");
    let forged: Vec<(&str, u32, Cast<Vote>)> = vec![
        // Slot 2's prepare signed with slot 3's key.
        (
            "signature",
            2,
            net.sign_as(3, 2, net.vote(Phase::Prepare, 0, 1, d, 2)),
        ),
        // Slot 2 sending a prepare that names slot 3.
        (
            "naming slot",
            2,
            net.sign_as(2, 2, net.vote(Phase::Prepare, 0, 1, d, 3)),
        ),
        // Another instance's prepare.
        (
            "another instance",
            2,
            net.sign_as(
                2,
                2,
                Vote {
                    instance: other,
                    ..net.vote(Phase::Prepare, 0, 1, d, 2)
                },
            ),
        ),
        // A prepare from the primary.
        (
            "from primary",
            0,
            net.sign_as(0, 0, net.vote(Phase::Prepare, 0, 1, d, 0)),
        ),
        // A commit signed with the wrong key.
        (
            "signature",
            2,
            net.sign_as(3, 2, net.vote(Phase::Commit, 0, 1, d, 2)),
        ),
        // A signer outside the group.
        (
            "not a replica",
            2,
            Cast {
                slot: 9,
                ..net.sign_as(2, 2, net.vote(Phase::Prepare, 0, 1, d, 2))
            },
        ),
    ];
    for (what, from, cast) in forged {
        let (refused, sends) = net.inject(from, 1, Message::Vote(cast));
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
        assert!(sends.is_empty(), "{what}: {sends:?}");
    }
    // None of them made slot 1 prepared.
    assert!(
        !net.disks[1]
            .iter()
            .any(|c| matches!(c, Change::Prepared(_)))
    );
    // One genuine prepare does.
    let (refused, sends) = net.inject(2, 1, net.genuine(Phase::Prepare, 0, 1, d, 2));
    assert_eq!(refused, None);
    assert!(sends.iter().any(|(_, m)| is_vote(m, Phase::Commit)));
}

#[test]
fn forged_commit_certificates_and_states_are_refused() {
    let mut net = Net::new(1);
    net.isolate(3);
    for add in 1..=8 {
        net.complete(Op::Add(add));
    }
    let transfer = net.disks[0]
        .iter()
        .find_map(|change| match change {
            Change::Checkpoint(transfer) => Some((**transfer).clone()),
            _ => None,
        })
        .expect("a stable checkpoint at 8");
    let committed = net.disks[0]
        .iter()
        .find_map(|change| match change {
            Change::Committed(c) if c.seq == 1 => Some((**c).clone()),
            _ => None,
        })
        .expect("a commit certificate for 1");

    let mut states = Vec::new();
    let mut garbage = transfer.clone();
    garbage.snapshot = Bytes::from_static(b"not the state");
    states.push(("does not match its checkpoint", garbage));
    let mut thin = transfer.clone();
    thin.proof.votes.pop();
    states.push(("needed", thin));
    let mut later = transfer.clone();
    later.proof.seq = 16;
    states.push(("another batch", later));
    for (what, state) in states {
        let (refused, _) = net.inject(0, 3, Message::State(Box::new(state)));
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
    }
    let mut certificates = Vec::new();
    let mut thin = committed.clone();
    thin.commits.pop();
    certificates.push(("needed", thin));
    let mut swapped = committed.clone();
    swapped.batch.requests[0].op = Op::Add(1_000);
    certificates.push(("another batch", swapped));
    let mut forged = committed.clone();
    let vote = vote_of(&forged.commits[0]);
    forged.commits[0] = net.sign_as((vote.replica + 1) % 4, vote.replica, vote);
    certificates.push(("signature", forged));
    for (what, certificate) in certificates {
        let (refused, _) = net.inject(0, 3, Message::Committed(Box::new(certificate)));
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
    }
    assert_eq!(net.replica(3).executed(), 0);
    assert!(net.disks[3].is_empty());
    // The genuine ones, forwarded by any peer, are taken.
    let (refused, _) = net.inject(1, 3, Message::Committed(Box::new(committed)));
    assert_eq!(refused, None);
    assert_eq!(net.replica(3).app().total, 1);
    let (refused, _) = net.inject(2, 3, Message::State(Box::new(transfer)));
    assert_eq!(refused, None);
    assert_eq!(net.replica(3).executed(), 8);
    assert_eq!(net.replica(3).state_digest(), net.replica(0).state_digest());
}

#[test]
fn a_new_view_re_proposes_the_batch_prepared_in_the_highest_view() {
    let mut net = Net::new(1);
    let initial = net.replica(0).state_digest();
    let older = batch(net.now.0, vec![request(1, Op::Add(1))]);
    let newer = batch(net.now.0, vec![request(2, Op::Add(2))]);
    let stable = CheckpointProof {
        seq: 0,
        digest: initial,
        votes: Vec::new(),
    };
    // Slot 0 prepared `older` at 1 in view 0, slot 1 `newer` in view 1; slot 2 nothing.
    let prepared = [
        vec![net.prepared_proof(0, 1, older.clone())],
        vec![net.prepared_proof(1, 1, newer.clone())],
        Vec::new(),
    ];
    let view_changes: Vec<Cast<ViewChange<Op>>> = prepared
        .into_iter()
        .enumerate()
        .map(|(slot, prepared)| {
            let change = ViewChange {
                instance: net.instance,
                view: 2,
                replica: slot as u32,
                stable: stable.clone(),
                prepared,
            };
            Cast::sign(&net.secrets[slot], Slot(slot as u32), change).expect("signs")
        })
        .collect();
    let new_view = |chosen: &Batch<Op>| {
        let vote = net.vote(Phase::PrePrepare, 2, 1, chosen.digest(), 2);
        NewView {
            view: 2,
            view_changes: view_changes.clone(),
            preprepares: vec![net.sign_as(2, 2, vote)],
            batches: vec![chosen.clone()],
        }
    };
    let wrong = new_view(&older);
    let right = new_view(&newer);
    let (refused, _) = net.inject(2, 3, Message::NewView(Box::new(wrong)));
    assert!(refused.is_some_and(|r| r.contains("not the one")));
    let (refused, sends) = net.inject(2, 3, Message::NewView(Box::new(right)));
    assert_eq!(refused, None);
    assert_eq!(net.replica(3).view(), (2, true));
    assert_eq!(prepared_digest(&sends), Some(newer.digest()));
}

#[test]
fn view_changes_with_forged_certificates_are_refused() {
    let mut net = Net::new(1);
    net.complete(Op::Add(3));
    let initial = PbftReplica::new(net.setup(0))
        .expect("a replica")
        .state_digest();
    let proof = net.disks[2]
        .iter()
        .find_map(|change| match change {
            Change::Prepared(proof) => Some((**proof).clone()),
            _ => None,
        })
        .expect("slot 2 prepared");
    let change = ViewChange {
        instance: net.instance,
        view: 1,
        replica: 2,
        stable: CheckpointProof {
            seq: 0,
            digest: initial,
            votes: Vec::new(),
        },
        prepared: vec![proof.clone()],
    };
    let signed = |net: &Net, key: u32, change: ViewChange<Op>| {
        Message::ViewChange(Box::new(
            Cast::sign(&net.secrets[key as usize], Slot(2), change).expect("signs"),
        ))
    };
    let pre = vote_of(&proof.preprepare);
    let mut forged_prepare = proof.clone();
    forged_prepare.prepares[0] =
        net.sign_as(0, 3, net.vote(Phase::Prepare, 0, pre.seq, pre.digest, 3));
    let mut wrong_batch = proof.clone();
    wrong_batch.batch.nondet += 1;
    let mut short = proof.clone();
    short.prepares.pop();
    let mut bad_stable = change.stable.clone();
    bad_stable.digest = Digest::of("bulwark.pbft.test.instance", b"state");
    let cases: Vec<(&str, u32, ViewChange<Op>)> = vec![
        (
            "signature of slot 3",
            2,
            ViewChange {
                prepared: vec![forged_prepare],
                ..change.clone()
            },
        ),
        (
            "does not match",
            2,
            ViewChange {
                prepared: vec![wrong_batch],
                ..change.clone()
            },
        ),
        (
            "needed",
            2,
            ViewChange {
                prepared: vec![short],
                ..change.clone()
            },
        ),
        (
            "two certificates",
            2,
            ViewChange {
                prepared: vec![proof.clone(), proof.clone()],
                ..change.clone()
            },
        ),
        (
            "initial state",
            2,
            ViewChange {
                stable: bad_stable,
                ..change.clone()
            },
        ),
        (
            "another instance",
            2,
            ViewChange {
                instance: initial,
                ..change.clone()
            },
        ),
        (
            "slot 2 sent slot 1",
            2,
            ViewChange {
                replica: 1,
                ..change.clone()
            },
        ),
        ("signature of slot 2", 1, change.clone()),
    ];
    for (what, key, change) in cases {
        let (refused, _) = net.inject(2, 3, signed(&net, key, change));
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
    }
    // The genuine one is accepted (and alone does not move slot 3).
    let (refused, sends) = net.inject(2, 3, signed(&net, 2, change));
    assert_eq!(refused, None);
    assert!(sends.is_empty());
    assert_eq!(net.replica(3).view(), (0, true));
}

#[test]
fn a_new_view_that_does_not_follow_from_its_view_changes_is_refused() {
    let mut net = Net::new(1);
    // View 0 prepares everywhere but commits nowhere; slot 2 never hears a NEW-VIEW.
    net.block("commits", |p| match p {
        Packet::Peer {
            message: Message::Vote(cast),
            ..
        } => {
            let vote = vote_of(cast);
            vote.phase == Phase::Commit && vote.view == 0
        }
        _ => false,
    });
    net.block("new views to 2", |p| {
        matches!(
            p,
            Packet::Peer {
                to: Slot(2),
                message: Message::NewView(_),
                ..
            }
        )
    });
    net.submit(Op::Add(5));
    net.run();
    let prepared = net.durable[2]
        .prepared
        .iter()
        .next()
        .copied()
        .expect("slot 2 prepared");
    net.silence(0);
    let captured = |net: &Net| {
        net.dropped.iter().find_map(|p| match p {
            Packet::Peer {
                from: Slot(1),
                to: Slot(2),
                message: Message::NewView(nv),
            } => Some((**nv).clone()),
            _ => None,
        })
    };
    assert!(
        net.run_until(6_000, |net| captured(net).is_some()),
        "no NEW-VIEW"
    );
    let genuine = captured(&net).expect("captured");
    assert_eq!(net.replica(2).view(), (1, false));
    assert_eq!(
        genuine.batches.len(),
        1,
        "the prepared batch is re-proposed"
    );
    assert_eq!(genuine.batches[0].digest(), prepared.2);

    // Another batch at number 1, properly signed by the new primary.
    let other = batch(net.now.0, vec![request(7, Op::Add(7))]);
    let mut swapped = genuine.clone();
    swapped.preprepares[0] =
        net.sign_as(1, 1, net.vote(Phase::PrePrepare, 1, 1, other.digest(), 1));
    swapped.batches[0] = other;
    // The prepared batch dropped.
    let mut emptied = genuine.clone();
    emptied.preprepares.clear();
    emptied.batches.clear();
    // Too few view changes.
    let mut thin = genuine.clone();
    thin.view_changes.truncate(2);
    // One view change whose sender signed a false starting checkpoint.
    let mut false_stable = genuine.clone();
    let cast = &false_stable.view_changes[0];
    let mut change = cast.open(&net.keys).expect("a genuine view change");
    change.stable.digest = Digest::of("bulwark.pbft.test.instance", b"state");
    let slot = cast.slot;
    false_stable.view_changes[0] =
        Cast::sign(&net.secrets[slot as usize], Slot(slot), change).expect("signs");
    // The right batch, signed by a backup.
    let mut unsigned = genuine.clone();
    let vote = Vote {
        replica: 3,
        ..vote_of(&genuine.preprepares[0])
    };
    unsigned.preprepares[0] = net.sign_as(3, 3, vote);
    for (what, new_view) in [
        ("not the one", swapped),
        ("do not follow", emptied),
        ("needed", thin),
        ("initial state", false_stable),
        ("not the one", unsigned),
    ] {
        let (refused, sends) = net.inject(1, 2, Message::NewView(Box::new(new_view)));
        let reason = refused.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(reason.contains(what), "{what}: {reason}");
        assert!(sends.is_empty());
        assert_eq!(net.replica(2).view(), (1, false));
    }
    let (refused, sends) = net.inject(1, 2, Message::NewView(Box::new(genuine)));
    assert_eq!(refused, None);
    assert_eq!(net.replica(2).view(), (1, true));
    assert_eq!(prepared_digest(&sends), Some(prepared.2));
}

// ---------------------------------------------------------------------------------------------
// Crashes and restarts

#[test]
fn a_restored_replica_rebuilds_the_same_state() {
    let mut net = Net::new(1);
    for add in 1..=19 {
        net.complete(Op::Add(add));
    }
    for slot in 0..4 {
        let before = (
            net.replica(slot).state_digest(),
            net.replica(slot).executed(),
            net.replica(slot).stable_seq(),
        );
        net.crash(slot);
        net.restore(slot);
        let after = (
            net.replica(slot).state_digest(),
            net.replica(slot).executed(),
            net.replica(slot).stable_seq(),
        );
        assert_eq!(before, after, "slot {slot}");
        assert_eq!(net.replica(slot).view(), (0, true));
    }
    // Retransmissions are still answered from the remembered results, without executing again.
    let late = net.submit_as(19, Op::Add(19));
    net.run();
    assert_eq!(net.ok(late), 190);
    assert_eq!(net.complete(Op::Add(10)), 200);
    net.assert_agree();
}

#[test]
fn a_backup_crashed_mid_stream_catches_up_after_restart() {
    for seed in 0..4 {
        let mut net = Net::new(1).shuffled(seed);
        let mut clients: Vec<usize> = (0..8).map(|_| net.submit(Op::Add(1))).collect();
        net.run_steps(60);
        net.crash(2);
        net.run();
        clients.extend((0..8).map(|_| net.submit(Op::Add(1))));
        net.run();
        net.restore(2);
        clients.extend((0..8).map(|_| net.submit(Op::Add(1))));
        net.run();
        net.run_for(2_000);
        for client in &clients {
            net.ok(*client);
        }
        assert_eq!(net.replica(2).app().total, 24, "seed {seed}");
        net.assert_agree();
    }
}

#[test]
fn a_primary_crashed_mid_stream_is_replaced_and_catches_up_after_restart() {
    for seed in 0..4 {
        let mut net = Net::new(1).shuffled(seed);
        let clients: Vec<usize> = (0..10).map(|_| net.submit(Op::Add(1))).collect();
        net.run_steps(80);
        net.crash(0);
        net.run();
        let done = net.run_until(10_000, |net| {
            clients.iter().all(|c| net.result(*c).is_some())
        });
        assert!(
            done,
            "seed {seed}: requests did not complete without the primary"
        );
        net.restore(0);
        net.run_for(2_000);
        for client in &clients {
            net.ok(*client);
        }
        assert_eq!(net.replica(0).view(), net.replica(1).view(), "seed {seed}");
        assert_eq!(net.replica(0).app().total, 10, "seed {seed}");
        net.assert_agree();
        assert_eq!(net.complete(Op::Add(1)), 11);
    }
}

#[test]
fn a_restored_replica_never_prepares_another_batch_where_it_prepared_one() {
    let mut net = Net::new(1);
    net.silence(0);
    let now = net.now.0;
    let first = batch(now, vec![request(1, Op::Add(1))]);
    let second = batch(now, vec![request(2, Op::Add(2))]);
    let (_, sends) = net.inject(0, 1, net.preprepare(0, 1, first.clone()));
    assert_eq!(prepared_digest(&sends), Some(first.digest()));
    net.crash(1);
    net.restore(1);
    let (refused, sends) = net.inject(0, 1, net.preprepare(0, 1, second));
    assert!(
        refused.is_some(),
        "the equivocation is refused after the restart too"
    );
    assert_eq!(prepared_digest(&sends), None);
    // Nor a commit for another batch where it was prepared: prepare and commit the first at 1.
    for from in [2, 3] {
        net.inject(
            from,
            1,
            net.genuine(Phase::Prepare, 0, 1, first.digest(), from),
        );
    }
    assert_eq!(net.durable[1].prepared.len(), 1);
    net.crash(1);
    net.restore(1);
    let (refused, sends) = net.inject(
        0,
        1,
        net.preprepare(0, 1, batch(now, vec![request(3, Op::Add(3))])),
    );
    assert!(refused.is_some());
    assert!(sends.is_empty());
    for from in [0, 2, 3] {
        net.inject(
            from,
            1,
            net.genuine(Phase::Commit, 0, 1, first.digest(), from),
        );
    }
    assert_eq!(net.replica(1).app().total, 1);
}

#[test]
fn restore_refuses_tampered_records() {
    let mut net = Net::new(1);
    for add in 1..=3 {
        net.complete(Op::Add(add));
    }
    let disk = net.disks[1].clone();
    assert!(PbftReplica::restore(net.setup(1), disk.clone(), net.now).is_ok());
    let find =
        |wanted: fn(&Change<Counter>) -> bool| disk.iter().position(wanted).expect("such a record");
    let committed = find(|c| matches!(c, Change::Committed(_)));
    let accepted = find(|c| matches!(c, Change::Accepted(_)));
    let prepared = find(|c| matches!(c, Change::Prepared(_)));

    let mut tampered: Vec<(usize, Vec<Change<Counter>>)> = Vec::new();
    // A commit signature that does not verify.
    let mut records = disk.clone();
    if let Change::Committed(c) = &mut records[committed] {
        let vote = vote_of(&c.commits[0]);
        c.commits[0] = net.sign_as((vote.replica + 1) % 4, vote.replica, vote);
    }
    tampered.push((committed, records));
    // A committed batch other than the one the commits name.
    let mut records = disk.clone();
    if let Change::Committed(c) = &mut records[committed] {
        c.batch.requests[0].op = Op::Add(1_000);
    }
    tampered.push((committed, records));
    // A pre-prepare by a backup.
    let mut records = disk.clone();
    if let Change::Accepted(a) = &mut records[accepted] {
        let vote = Vote {
            replica: 2,
            ..vote_of(&a.0)
        };
        a.0 = net.sign_as(2, 2, vote);
    }
    tampered.push((accepted, records));
    // A prepared certificate short of a prepare.
    let mut records = disk.clone();
    if let Change::Prepared(p) = &mut records[prepared] {
        p.prepares.pop();
    }
    tampered.push((prepared, records));
    for (index, records) in tampered {
        match PbftReplica::restore(net.setup(1), records, net.now) {
            Err(RestoreError::Record { index: at, reason }) => assert_eq!(at, index, "{reason}"),
            Ok(_) => panic!("record {index} tampered, and restored"),
        }
    }
    // Another replica's records check, but not under another instance.
    let foreign = Setup {
        instance: Digest::of("bulwark.pbft.test.instance", b"other"),
        ..net.setup(1)
    };
    assert!(PbftReplica::restore(foreign, disk, net.now).is_err());
}
