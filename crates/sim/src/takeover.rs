//! M-PoWerStore registers moving into their group's next incarnation, in a world of their own
//! (docs/state-transfer.md, "M-PoWerStore registers"): an old group of `3f+1` nodes serves the
//! keys until the epoch changes; from then on its members refuse clients and answer only the
//! reads of the new group's members, which take every key over with
//! `powerstore::takeover::TakeOver` and serve a key once its take-over is confirmed. Clients write
//! and read throughout, each operation against the group of the epoch it knows; one cut short by
//! the change is abandoned (its outcome unknown) and the client goes on in the new group.
//!
//! Each step delivers one message chosen at random from those in flight, so every interleaving
//! is possible; timers fire when nothing is in flight and now and then before. Up to `f` members
//! of each group are faulty: old ones from the storage catalogue of [`crate::byzantine`], new ones
//! silent or two-faced (taking keys over as a correct member does, serving at once, answering
//! half the clients from the first version it carried and the other half from its newest, and
//! claiming forged versions in HOLD). The history goes to the linearizability checker, with a
//! read of every key at the end; every confirmation is checked to leave `f+1` correct members
//! holding its version or newer.
//!
//! Not modelled: writes that cross the change (step 4 of the design: a write cut short is
//! abandoned, not stored again in the new incarnation), the listing of keys (every member takes
//! every key over), crashes, and the old incarnation's removal.

use crate::byzantine::{self, Behaviour};
use crate::checker::{self, History, OpKind, Outcome};
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::membership::Incarnation;
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Epoch, Key, MacKey, NodeId, Slot, Time};
use bulwark_protocol::powerstore::takeover::{Side, TakeOutcome, TakeOver, TakeStep};
use bulwark_protocol::powerstore::{
    Access, Change, ClientConfig, Fragments, MemoryFragments, OpId, Pid, ProtocolError, ReadOp,
    Refusal, Request, RequestBody, Response, ResponseBody, Server, ServerConfig, ServerKeys,
    ServerLogic, Step, Timestamp, WriteOp, WriterKeys, cmp_ts, pair_key,
};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A deliberate break of the take-over, for negative controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// A new member serves a key as soon as it carried a version in, unconfirmed, and never
    /// reads again. Random schedules have not reached the trap it opens (see
    /// docs/state-transfer.md); the protocol's unit tests build it.
    ServeAtCarry,
    /// A take-over reads from `f+1` old members (each new member its own, drawn at random),
    /// its rounds done at `f+1` replies, not `2f+1`. Not caught by random schedules: the HOLDs of
    /// the members it did not mislead repair the one it did (see docs/state-transfer.md).
    SmallReadQuorum,
    /// Old members go on serving clients after the epoch changed (they answer the new members
    /// without having entered the new epoch first).
    AnswerBeforeEntering,
    /// A take-over is confirmed once `f+1` members say they hold its version, not `2f+1`.
    SmallHoldQuorum,
}

/// How a faulty member of the new incarnation behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewFault {
    /// Answers nothing.
    Silent,
    /// Takes keys over, serves at once, answers odd clients' reads from the first version it
    /// carried, and claims forged versions in HOLD replies now and then.
    TwoFaced,
}

/// One run's shape.
#[derive(Clone, Debug)]
pub struct TakeoverConfig {
    /// The run's seed: everything else random is drawn from it.
    pub seed: u64,
    /// Faults tolerated per group.
    pub f: usize,
    /// Registers.
    pub keys: usize,
    /// Clients, each running one operation at a time.
    pub clients: usize,
    /// Operations per client.
    pub ops_per_client: usize,
    /// Deliberate breaks, usually none.
    pub mutations: Vec<Mutation>,
    /// `f` old members behave so, instead of up to `f` drawn from the catalogue.
    pub old_fault: Option<Behaviour>,
    /// `f` new members behave so, instead of up to `f` drawn.
    pub new_fault: Option<NewFault>,
}

impl TakeoverConfig {
    /// The default shape at `f = 1`.
    pub fn new(seed: u64) -> TakeoverConfig {
        TakeoverConfig {
            seed,
            f: 1,
            keys: 2,
            clients: 3,
            ops_per_client: 12,
            mutations: Vec::new(),
            old_fault: None,
            new_fault: None,
        }
    }
}

/// What a run did and what the checks found.
#[derive(Debug)]
pub struct TakeoverRun {
    /// The linearizability verdict on the history.
    pub report: checker::Report,
    /// Confirmations that did not leave `f+1` correct members holding their version or newer.
    pub unconfirmed_holders: Vec<String>,
    /// What did not finish within the step bound (liveness, not safety).
    pub stuck: Vec<String>,
    /// Operations recorded, the final reads included.
    pub ops: usize,
    /// Writes acknowledged.
    pub acknowledged: usize,
    /// Operations cut short (by the epoch change or the timeout).
    pub abandoned: usize,
    /// Versions carried into the new incarnation, over every member and key.
    pub carried: usize,
    /// Take-overs started again (stalled, or asked to hold more).
    pub rereads: usize,
    /// Keys whose correct members' first carries brought different versions in: the
    /// concurrent reads the confirmation is for.
    pub splits: usize,
    /// The faulty old members' behaviours, by slot (`Honest` for correct ones).
    pub old_faults: Vec<Behaviour>,
    /// The faulty new members, by slot.
    pub new_faults: Vec<Option<NewFault>>,
}

impl TakeoverRun {
    /// Whether the run found nothing wrong, liveness included.
    pub fn clean(&self) -> bool {
        self.report.ok && self.unconfirmed_holders.is_empty() && self.stuck.is_empty()
    }

    /// Whether a safety check failed.
    pub fn violated(&self) -> bool {
        !self.report.violations.is_empty() || !self.unconfirmed_holders.is_empty()
    }
}

const STEPS_MAX: u64 = 400_000;
/// Steps the armed epoch change waits for an old member to take a COMPLETE.
const CHANGE_WAITS_FOR_COMPLETE: u64 = 300;
/// Timers fire before everything in flight was delivered only while less is in flight.
const INFLIGHT_FOR_EARLY_TIMERS: usize = 64;
/// How often a message to or from a slow node waits when it is picked.
const SLOW_WAITS: f64 = 0.9;
/// Timer firings an operation survives before its client gives up on it.
const OP_TIMEOUTS_MAX: u32 = 40;
/// Reader ids of the new members when they read the old group or ask each other.
const MEMBER_IDS: u32 = 10_000;
const READ: Access = Access {
    write: false,
    read: true,
};
const WRITE: Access = Access {
    write: true,
    read: true,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Party {
    Client(usize),
    Member(usize),
}

enum Msg {
    Request {
        from: Party,
        side: Side,
        to: usize,
        request: Request,
    },
    Reply {
        to: Party,
        side: Side,
        from: usize,
        response: Response,
    },
}

enum Machine {
    Write(Box<WriteOp>),
    Read(Box<ReadOp>),
}

struct Running {
    machine: Machine,
    side: Side,
    index: usize,
    timeouts: u32,
}

struct ClientState {
    started: usize,
    knows_new: bool,
    learns_at: Option<u64>,
    running: Option<Running>,
    keys_old: Arc<WriterKeys>,
    keys_new: Arc<WriterKeys>,
}

#[derive(Clone, Debug, PartialEq)]
enum Gate {
    Closed,
    Open,
}

struct Member {
    server: Server,
    disk: MemoryFragments,
    /// A two-faced member's other face: the first version it carried of each key.
    first: Option<(Server, MemoryFragments)>,
    fault: Option<NewFault>,
    gates: BTreeMap<Key, Gate>,
    takes: BTreeMap<Key, TakeOver>,
    held: Vec<(Party, Request)>,
    starts_at: Option<u64>,
    /// When a two-faced member takes every key over once more, so that its faces differ.
    again_at: Option<u64>,
    /// The `f+1` old members its reads reach under [`Mutation::SmallReadQuorum`].
    reads_from: Vec<usize>,
    started: bool,
}

struct World {
    rng: ChaCha8Rng,
    config: TakeoverConfig,
    n: usize,
    keys: Vec<Key>,
    old_config: ClientConfig,
    new_config: ClientConfig,
    old: Vec<Box<dyn ServerLogic>>,
    old_disks: Vec<MemoryFragments>,
    members: Vec<Member>,
    /// Nodes whose messages mostly wait: an old member that misses what others store, a new
    /// member that takes keys over late.
    slow_old: Vec<bool>,
    slow_new: Vec<bool>,
    clients: Vec<ClientState>,
    inflight: Vec<Msg>,
    history: History,
    step: u64,
    next_op: u64,
    changed_at: Option<u64>,
    change_after_ops: usize,
    /// When the workload had started enough operations for the change.
    armed_at: Option<u64>,
    /// Whether an old member took a COMPLETE since the change was armed.
    complete_seen: bool,
    /// Per key, what each correct member's first take-over carried in.
    first_carried: BTreeMap<Key, Vec<(usize, Timestamp)>>,
    codec: Arc<dyn ErasureCodec>,
    run: TakeoverRun,
}

/// Runs one seeded world to its end and judges it.
pub fn run(config: TakeoverConfig) -> TakeoverRun {
    let mut world = World::new(config);
    world.run();
    world.finish()
}

impl World {
    fn new(config: TakeoverConfig) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0x7a4e_0c3e_0000_0001);
        let (f, n) = (config.f, 3 * config.f + 1);
        let writers = config.clients + 1;
        let writer_secrets: Vec<SecretKey> = (0..writers)
            .map(|w| SecretKey::from_seed(&[w as u8 + 100; 32]))
            .collect();
        let group = |first: usize| -> Vec<SecretKey> {
            (0..n)
                .map(|i| SecretKey::from_seed(&[(first + i) as u8 + 1; 32]))
                .collect()
        };
        let (old_nodes, new_nodes) = (group(0), group(n));
        let ids = |first: usize| -> Vec<NodeId> {
            (first..first + n).map(|i| NodeId(i as u32)).collect()
        };
        let old_inc = Incarnation::new(&ids(0), Epoch(1));
        let new_inc = Incarnation::new(&ids(n), Epoch(2));
        let server_keys = |node: &SecretKey| {
            ServerKeys::derived(
                node,
                (0..writers).map(|w| (ClientId(w as u32), writer_secrets[w].public_key())),
            )
        };
        let writer_keys = |writer: &SecretKey, nodes: &[SecretKey]| {
            Arc::new(WriterKeys {
                timestamp: MacKey([99; 32]),
                servers: nodes
                    .iter()
                    .map(|node| pair_key(writer, &node.public_key()))
                    .collect(),
            })
        };
        let faulty = |rng: &mut ChaCha8Rng, all: bool| -> Vec<bool> {
            let mut slots: Vec<usize> = (0..n).collect();
            let mut out = vec![false; n];
            let count = if all { f } else { rng.random_range(0..=f) };
            for _ in 0..count {
                let pick = slots.swap_remove(rng.random_range(0..slots.len()));
                out[pick] = true;
            }
            out
        };
        let old_faulty = faulty(&mut rng, config.old_fault.is_some());
        let new_faulty = faulty(&mut rng, config.new_fault.is_some());
        let slow_old: Vec<bool> = (0..n).map(|_| rng.random_bool(0.25)).collect();
        let slow_new: Vec<bool> = (0..n).map(|_| rng.random_bool(0.25)).collect();
        let mut old = Vec::new();
        let mut old_faults = Vec::new();
        for (i, node) in old_nodes.iter().enumerate() {
            let behaviour = if old_faulty[i] {
                let drawn = Behaviour::STORAGE[rng.random_range(0..Behaviour::STORAGE.len())];
                config.old_fault.unwrap_or(drawn)
            } else {
                Behaviour::Honest
            };
            let server_config = ServerConfig {
                epoch: Epoch(1),
                incarnation: old_inc,
                ..ServerConfig::new(Slot(i as u32), f)
            };
            old.push(byzantine::make_server(
                behaviour,
                server_config,
                server_keys(node),
                rng.random(),
            ));
            old_faults.push(behaviour);
        }
        let mut members = Vec::new();
        let mut new_faults = Vec::new();
        for (i, node) in new_nodes.iter().enumerate() {
            let mut slots: Vec<usize> = (0..n).collect();
            let reads_from: Vec<usize> = (0..=f)
                .map(|_| slots.swap_remove(rng.random_range(0..slots.len())))
                .collect();
            let fault = new_faulty[i].then(|| {
                let drawn = if rng.random_bool(0.7) {
                    NewFault::TwoFaced
                } else {
                    NewFault::Silent
                };
                config.new_fault.unwrap_or(drawn)
            });
            let server_config = ServerConfig {
                epoch: Epoch(2),
                incarnation: new_inc,
                ..ServerConfig::new(Slot(i as u32), f)
            };
            let first = (fault == Some(NewFault::TwoFaced)).then(|| {
                (
                    Server::new(server_config.clone(), server_keys(node)),
                    MemoryFragments::default(),
                )
            });
            members.push(Member {
                server: Server::new(server_config, server_keys(node)),
                disk: MemoryFragments::default(),
                first,
                fault,
                gates: BTreeMap::new(),
                takes: BTreeMap::new(),
                held: Vec::new(),
                starts_at: None,
                again_at: None,
                reads_from,
                started: false,
            });
            new_faults.push(fault);
        }
        let clients = (0..writers)
            .map(|c| ClientState {
                started: 0,
                knows_new: false,
                learns_at: None,
                running: None,
                keys_old: writer_keys(&writer_secrets[c], &old_nodes),
                keys_new: writer_keys(&writer_secrets[c], &new_nodes),
            })
            .collect();
        let keys = (0..config.keys)
            .map(|k| Key::new(format!("k{k}").into_bytes()).expect("short key"))
            .collect();
        let total = config.clients * config.ops_per_client;
        let change_after_ops = rng.random_range(total / 5..=total * 7 / 10).max(1);
        let old_config = ClientConfig {
            epoch: Epoch(1),
            incarnation: old_inc,
            ..ClientConfig::new(f)
        };
        let new_config = ClientConfig {
            epoch: Epoch(2),
            incarnation: new_inc,
            ..ClientConfig::new(f)
        };
        World {
            rng,
            config,
            n,
            keys,
            old_config,
            new_config,
            old,
            old_disks: vec![MemoryFragments::default(); n],
            members,
            slow_old,
            slow_new,
            clients,
            inflight: Vec::new(),
            history: History::new(),
            step: 0,
            next_op: 1,
            changed_at: None,
            change_after_ops,
            armed_at: None,
            complete_seen: false,
            first_carried: BTreeMap::new(),
            codec: Arc::new(ReedSolomonSimd),
            run: TakeoverRun {
                report: checker::Report::default(),
                unconfirmed_holders: Vec::new(),
                stuck: Vec::new(),
                ops: 0,
                acknowledged: 0,
                abandoned: 0,
                carried: 0,
                rereads: 0,
                splits: 0,
                old_faults,
                new_faults,
            },
        }
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    fn mutated(&self, mutation: Mutation) -> bool {
        self.config.mutations.contains(&mutation)
    }

    fn run(&mut self) {
        let workers = self.config.clients;
        // The workload, then a read of every key by the last client once everything settled.
        let mut final_reads = false;
        while self.step < STEPS_MAX {
            self.step += 1;
            self.maybe_change();
            self.start_takeovers();
            for c in 0..self.clients.len() {
                self.maybe_learn(c);
            }
            for c in 0..workers {
                if self.clients[c].running.is_none()
                    && self.clients[c].started < self.config.ops_per_client
                    && self.rng.random_bool(0.3)
                {
                    self.start_op(c, None);
                }
            }
            let busy = self.clients.iter().any(|c| c.running.is_some())
                || self.members.iter().any(|m| !m.takes.is_empty());
            let workload_done = (0..workers)
                .all(|c| self.clients[c].started == self.config.ops_per_client)
                && self.changed_at.is_some()
                && self.members.iter().all(|m| m.started || m.fault.is_some());
            if !busy && self.inflight.is_empty() && workload_done {
                if final_reads {
                    return;
                }
                final_reads = true;
                let reader = workers;
                self.clients[reader].knows_new = true;
                for k in 0..self.keys.len() {
                    // One at a time: the reader runs one operation.
                    self.start_op(reader, Some(k));
                    self.settle_client(reader);
                }
                continue;
            }
            self.deliver_one();
        }
        self.run
            .stuck
            .push(format!("the run did not end within {STEPS_MAX} steps"));
        let takes: Vec<String> = self
            .members
            .iter()
            .flat_map(|m| m.takes.values().map(TakeOver::describe))
            .collect();
        let held: Vec<usize> = self.members.iter().map(|m| m.held.len()).collect();
        let running: Vec<bool> = self.clients.iter().map(|c| c.running.is_some()).collect();
        let kinds: Vec<String> = self
            .inflight
            .iter()
            .take(12)
            .map(|msg| match msg {
                Msg::Request {
                    from,
                    side,
                    to,
                    request,
                } => {
                    format!("{from:?}->{side:?}{to} {}", request.body.name())
                }
                Msg::Reply { to, side, from, .. } => format!("{side:?}{from}->{to:?} reply"),
            })
            .collect();
        self.run.stuck.push(format!("in flight: {kinds:?}"));
        self.run.stuck.push(format!(
            "{} in flight, take-overs {takes:?}, held {held:?}, clients running {running:?}, slow old {:?} new {:?}, faults {:?} {:?}",
            self.inflight.len(), self.slow_old, self.slow_new, self.run.old_faults, self.run.new_faults
        ));
    }

    /// One step of the network: timers when nothing is in flight (and now and then before),
    /// then one message chosen at random, though one to or from a slow node mostly waits.
    fn deliver_one(&mut self) {
        // Early timers too, but not so often that retransmissions outgrow deliveries.
        let early = self.inflight.len() < INFLIGHT_FOR_EARLY_TIMERS && self.rng.random_bool(0.02);
        if self.inflight.is_empty() || early {
            self.fire_timers();
        }
        if self.inflight.is_empty() {
            return;
        }
        let pick = self.rng.random_range(0..self.inflight.len());
        let (party, side, node) = match &self.inflight[pick] {
            Msg::Request { from, side, to, .. } => (*from, *side, *to),
            Msg::Reply { to, side, from, .. } => (*to, *side, *from),
        };
        // A slow old member is slow for clients only: it misses writes others store, and
        // answers the new members' reads as promptly as the rest.
        let slow_node = match side {
            Side::Previous => self.slow_old[node] && matches!(party, Party::Client(_)),
            Side::New => self.slow_new[node],
        };
        let slow_member = matches!(party, Party::Member(m) if self.slow_new[m]);
        if (slow_node || slow_member) && self.rng.random_bool(SLOW_WAITS) {
            return;
        }
        let msg = self.inflight.swap_remove(pick);
        self.deliver(msg);
    }

    /// Runs the world until `client`'s operation ends (the final reads).
    fn settle_client(&mut self, client: usize) {
        let mut steps = 0u64;
        while self.clients[client].running.is_some() && steps < STEPS_MAX / 4 {
            steps += 1;
            self.step += 1;
            self.deliver_one();
        }
        if self.clients[client].running.is_some() {
            self.run.stuck.push("a final read did not end".to_string());
        }
    }

    fn maybe_change(&mut self) {
        if self.changed_at.is_some() {
            return;
        }
        let started: usize = self.clients.iter().map(|c| c.started).sum();
        if started < self.change_after_ops {
            return;
        }
        // The change lands just after an old member took a COMPLETE, when one came in time: a
        // write cut short between its COMPLETEs leaves a version proven and not complete.
        let armed = *self.armed_at.get_or_insert(self.step);
        if !self.complete_seen && self.step < armed + CHANGE_WAITS_FOR_COMPLETE {
            return;
        }
        self.changed_at = Some(self.step);
        for c in 0..self.clients.len() {
            let delay = self.rng.random_range(0..400);
            self.clients[c].learns_at = Some(self.step + delay);
        }
        for m in 0..self.n {
            let delay = self.rng.random_range(0..150);
            self.members[m].starts_at = Some(self.step + delay);
        }
    }

    fn maybe_learn(&mut self, c: usize) {
        if let Some(at) = self.clients[c].learns_at
            && at <= self.step
        {
            self.clients[c].knows_new = true;
        }
    }

    fn start_takeovers(&mut self) {
        for m in 0..self.n {
            if self.members[m].again_at.is_some_and(|at| at <= self.step) {
                self.members[m].again_at = Some(u64::MAX);
                for k in 0..self.keys.len() {
                    let key = self.keys[k].clone();
                    self.start_takeover(m, &key);
                }
            }
            let due = self.members[m].starts_at.is_some_and(|at| at <= self.step);
            if !due || self.members[m].started || self.members[m].fault == Some(NewFault::Silent) {
                continue;
            }
            self.members[m].started = true;
            for k in 0..self.keys.len() {
                let key = self.keys[k].clone();
                self.start_takeover(m, &key);
            }
        }
    }

    fn start_takeover(&mut self, m: usize, key: &Key) {
        if self.members[m].takes.contains_key(key) {
            return;
        }
        let mut previous = self.old_config.clone();
        if self.mutated(Mutation::SmallReadQuorum) {
            previous.mutations.quorum_f_plus_one = true;
        }
        let mut new = self.new_config.clone();
        if self.mutated(Mutation::SmallHoldQuorum) {
            new.mutations.quorum_f_plus_one = true;
        }
        let held = self.members[m].server.lc(key).map(|c| c.ts);
        let op = self.op();
        let mut take = TakeOver::new(
            previous,
            new,
            Slot(m as u32),
            self.codec.clone(),
            key.clone(),
            op,
            held,
        );
        let sends = take.start();
        self.members[m].takes.insert(key.clone(), take);
        self.send_all(Party::Member(m), sends);
    }

    fn send_all(&mut self, from: Party, sends: Vec<(Side, Slot, Request)>) {
        for (side, to, request) in sends {
            self.inflight.push(Msg::Request {
                from,
                side,
                to: to.index(),
                request,
            });
        }
    }

    fn start_op(&mut self, c: usize, key: Option<usize>) {
        let final_read = key.is_some();
        let k = key.unwrap_or_else(|| self.rng.random_range(0..self.keys.len()));
        let key = self.keys[k].clone();
        let side = if self.clients[c].knows_new {
            Side::New
        } else {
            Side::Previous
        };
        let config = match side {
            Side::Previous => self.old_config.clone(),
            Side::New => self.new_config.clone(),
        };
        let op = self.op();
        // Four operations in ten read; the final reads (`key` given) always do.
        let (machine, kind) = if final_read || self.rng.random_range(0..10) < 4 {
            let read = ReadOp::new(config, self.codec.clone(), key.clone(), op);
            (Machine::Read(Box::new(read)), OpKind::Read)
        } else if self.rng.random_bool(0.1) {
            (
                self.write_op(c, side, config, &key, op, None),
                OpKind::Write(None),
            )
        } else {
            let value = format!("c{c}-{}-{}", self.clients[c].started, op.0).into_bytes();
            let kind = OpKind::Write(Some(value.clone()));
            let machine = self.write_op(c, side, config, &key, op, Some(Bytes::from(value)));
            (machine, kind)
        };
        let index = self
            .history
            .invoke(c as u64, key.as_bytes().to_vec(), kind, self.step);
        let mut running = Running {
            machine,
            side,
            index,
            timeouts: 0,
        };
        let sends = match &mut running.machine {
            Machine::Write(w) => w.start(),
            Machine::Read(r) => r.start(),
        };
        self.clients[c].started += 1;
        self.clients[c].running = Some(running);
        self.send_from_client(c, side, sends);
    }

    fn send_from_client(&mut self, c: usize, side: Side, sends: Vec<(Slot, Request)>) {
        for (to, request) in sends {
            self.inflight.push(Msg::Request {
                from: Party::Client(c),
                side,
                to: to.index(),
                request,
            });
        }
    }

    fn write_op(
        &mut self,
        c: usize,
        side: Side,
        config: ClientConfig,
        key: &Key,
        op: OpId,
        value: Option<Bytes>,
    ) -> Machine {
        let keys = match side {
            Side::Previous => self.clients[c].keys_old.clone(),
            Side::New => self.clients[c].keys_new.clone(),
        };
        let mut nonce = [0u8; 32];
        self.rng.fill(&mut nonce);
        Machine::Write(Box::new(WriteOp::new(
            config,
            keys,
            self.codec.clone(),
            key.clone(),
            op,
            Pid {
                writer: ClientId(c as u32),
                seq: op.0,
            },
            nonce,
            value,
        )))
    }

    fn fire_timers(&mut self) {
        for c in 0..self.clients.len() {
            let Some(running) = self.clients[c].running.as_mut() else {
                continue;
            };
            running.timeouts += 1;
            if running.timeouts > OP_TIMEOUTS_MAX {
                self.clients[c].running = None;
                self.run.abandoned += 1;
                continue;
            }
            let side = running.side;
            let sends = match &mut running.machine {
                Machine::Write(w) => w.on_timeout(),
                Machine::Read(r) => r.on_timeout(),
            };
            self.send_from_client(c, side, sends);
        }
        for m in 0..self.n {
            let keys: Vec<Key> = self.members[m].takes.keys().cloned().collect();
            for key in keys {
                let Some(take) = self.members[m].takes.get_mut(&key) else {
                    continue;
                };
                let step = take.on_timeout();
                self.take_step(m, &key, step);
            }
        }
    }

    fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::Request {
                from,
                side: Side::Previous,
                to,
                request,
            } => self.at_old(from, to, request),
            Msg::Request {
                from,
                side: Side::New,
                to,
                request,
            } => self.at_member(from, to, request),
            Msg::Reply {
                to: Party::Client(c),
                side,
                from,
                response,
            } => self.at_client(c, side, from, response),
            Msg::Reply {
                to: Party::Member(m),
                side,
                from,
                response,
            } => {
                let Some(key) = self.members[m]
                    .takes
                    .iter()
                    .find(|(_, t)| t.op() == response.op)
                    .map(|(k, _)| k.clone())
                else {
                    return;
                };
                let take = self.members[m].takes.get_mut(&key).expect("found");
                let step = take.on_response(side, Slot(from as u32), response);
                self.take_step(m, &key, step);
            }
        }
    }

    fn reply(&mut self, to: Party, side: Side, from: usize, response: Option<Response>) {
        if let Some(response) = response {
            self.inflight.push(Msg::Reply {
                to,
                side,
                from,
                response,
            });
        }
    }

    fn at_old(&mut self, from: Party, to: usize, request: Request) {
        let (id, access) = match from {
            Party::Client(c) => (ClientId(c as u32), WRITE),
            Party::Member(m) => (ClientId(MEMBER_IDS + m as u32), READ),
        };
        if let Party::Member(m) = from
            && self.mutated(Mutation::SmallReadQuorum)
            && !self.members[m].reads_from.contains(&to)
        {
            return;
        }
        let entered = self.changed_at.is_some() && !self.mutated(Mutation::AnswerBeforeEntering);
        if matches!(from, Party::Client(_)) && entered {
            let response = Response {
                op: request.op,
                attempt: request.attempt,
                body: ResponseBody::Refused(Refusal::WrongEpoch { current: Epoch(2) }),
            };
            self.reply(from, Side::Previous, to, Some(response));
            return;
        }
        if self.armed_at.is_some() && matches!(request.body, RequestBody::Complete { .. }) {
            self.complete_seen = true;
        }
        let handled =
            self.old[to].handle(Time(self.step), id, access, request, &self.old_disks[to]);
        for change in &handled.changes {
            self.old_disks[to].apply(change);
        }
        self.reply(from, Side::Previous, to, handled.reply);
    }

    fn at_member(&mut self, from: Party, to: usize, request: Request) {
        let fault = self.members[to].fault;
        if fault == Some(NewFault::Silent) {
            return;
        }
        if let RequestBody::Hold { ts: asked } = request.body {
            let lc = self.members[to].server.lc(&request.key).map(|c| c.ts);
            let mut lc_ts = lc;
            if fault == Some(NewFault::TwoFaced) && self.rng.random_bool(0.3) {
                // A forged claim above what it holds.
                lc_ts = lc.map(|ts| Timestamp {
                    num: ts.num + self.rng.random_range(1..100),
                    ..ts
                });
            }
            let response = Response {
                op: request.op,
                attempt: request.attempt,
                body: ResponseBody::HoldAck { lc_ts },
            };
            self.reply(from, Side::New, to, Some(response));
            // Asked to hold more than it does: read the old incarnation again.
            let behind = cmp_ts(asked.as_ref(), lc.as_ref()) == Ordering::Greater;
            if behind
                && fault.is_none()
                && self.members[to].started
                && !self.mutated(Mutation::ServeAtCarry)
                && !self.members[to].takes.contains_key(&request.key)
            {
                self.run.rereads += 1;
                self.start_takeover(to, &request.key);
            }
            return;
        }
        let open = self.members[to].gates.get(&request.key) == Some(&Gate::Open);
        if fault.is_none() && !open {
            self.members[to].held.push((from, request));
            return;
        }
        self.serve(from, to, request);
    }

    fn serve(&mut self, from: Party, to: usize, request: Request) {
        let Party::Client(c) = from else {
            return;
        };
        let member = &mut self.members[to];
        let read = matches!(
            request.body,
            RequestBody::Collect { .. } | RequestBody::Filter { .. } | RequestBody::Repair { .. }
        );
        let now = Time(self.step);
        let id = ClientId(c as u32);
        let handled = match member.first.as_mut() {
            Some((server, disk)) if read && c % 2 == 1 => {
                let handled = server.handle(now, id, WRITE, request, &*disk as &dyn Fragments);
                for change in &handled.changes {
                    disk.apply(change);
                }
                handled
            }
            _ => {
                let handled = member.server.handle(now, id, WRITE, request, &member.disk);
                for change in &handled.changes {
                    member.disk.apply(change);
                }
                handled
            }
        };
        self.reply(from, Side::New, to, handled.reply);
    }

    fn take_step(&mut self, m: usize, key: &Key, step: TakeStep) {
        match step {
            TakeStep::Send(sends) => self.send_all(Party::Member(m), sends),
            TakeStep::Carry { carried, then } => {
                self.run.carried += 1;
                let ts = carried.ts;
                if self.members[m].fault.is_none() {
                    let firsts = self.first_carried.entry(key.clone()).or_default();
                    if !firsts.iter().any(|(member, _)| *member == m) {
                        if firsts
                            .iter()
                            .any(|(_, ts)| ts.cmp_order(&carried.ts) != Ordering::Equal)
                            && firsts
                                .iter()
                                .all(|(_, ts)| ts.cmp_order(&firsts[0].1) == Ordering::Equal)
                        {
                            self.run.splits += 1;
                        }
                        firsts.push((m, carried.ts));
                    }
                }
                let now = Time(self.step);
                let serve_at_carry = self.mutated(Mutation::ServeAtCarry);
                let member = &mut self.members[m];
                if let Some((server, disk)) = member.first.as_mut()
                    && server.lc(key).is_none()
                    && let Ok(changes) = server.carry(now, key, carried.clone(), &*disk)
                {
                    for change in &changes {
                        disk.apply(change);
                    }
                }
                let raised = match member.server.carry(now, key, carried, &member.disk) {
                    Ok(changes) => {
                        for change in &changes {
                            member.disk.apply(change);
                        }
                        changes.iter().any(|c| matches!(c, Change::SetLc { .. }))
                    }
                    Err(why) => {
                        member.takes.remove(key);
                        self.run
                            .stuck
                            .push(format!("member {m} refused to carry {key:?} in: {why}"));
                        return;
                    }
                };
                if member.fault.is_some() && member.again_at.is_none() {
                    member.again_at = Some(self.step + self.rng.random_range(1..400));
                    // Bogus HOLDs, above what it carried: each costs a correct member a read.
                    let bogus = Timestamp {
                        num: ts.num + self.rng.random_range(1..100),
                        ..ts
                    };
                    let holds: Vec<(Side, Slot, Request)> = (0..self.n)
                        .map(|to| {
                            let request = Request {
                                op: OpId(u64::MAX - m as u64),
                                attempt: 0,
                                epoch: self.new_config.epoch,
                                group: self.new_config.group,
                                key: key.clone(),
                                body: RequestBody::Hold { ts: Some(bogus) },
                            };
                            (Side::New, Slot(to as u32), request)
                        })
                        .collect();
                    self.send_all(Party::Member(m), holds);
                }
                let member = &mut self.members[m];
                if serve_at_carry || member.fault.is_some() {
                    member.takes.remove(key);
                    self.open(m, key, Some(ts));
                    return;
                }
                // A newer version than the one served waits for its own confirmation; a read
                // that brought nothing newer than `lc` (writes of the new incarnation passed
                // it) leaves the gate as it was.
                if raised {
                    member.gates.insert(key.clone(), Gate::Closed);
                }
                self.send_all(Party::Member(m), then);
            }
            TakeStep::Done(result) => {
                self.members[m].takes.remove(key);
                match result {
                    Ok(TakeOutcome::Confirmed { base }) => self.open(m, key, base),
                    Ok(TakeOutcome::Stalled { .. }) => {
                        self.run.rereads += 1;
                        self.start_takeover(m, key);
                    }
                    Err(error) => self
                        .run
                        .stuck
                        .push(format!("member {m}'s take-over of {key:?} failed: {error}")),
                }
            }
        }
    }

    /// The invariant the gate keeps: a correct member serves a version it carried in only once
    /// `f+1` correct members hold it or newer.
    fn check_holders(&mut self, m: usize, key: &Key, carried: Option<Timestamp>) {
        let base = carried.as_ref();
        let holding = self
            .members
            .iter()
            .filter(|m| m.fault.is_none())
            .filter(|m| cmp_ts(m.server.lc(key).map(|c| &c.ts), base) != Ordering::Less)
            .count();
        if holding <= self.config.f {
            self.run.unconfirmed_holders.push(format!(
                "step {}: member {m} serves {key:?} at {base:?} with {holding} correct holders",
                self.step
            ));
        }
    }

    /// Member `m` serves `key`, having carried `carried` in.
    fn open(&mut self, m: usize, key: &Key, carried: Option<Timestamp>) {
        if self.members[m].fault.is_none() {
            self.check_holders(m, key, carried);
        }
        self.members[m].gates.insert(key.clone(), Gate::Open);
        let held = std::mem::take(&mut self.members[m].held);
        let (ready, waiting): (Vec<_>, Vec<_>) = held
            .into_iter()
            .partition(|(_, request)| request.key == *key);
        self.members[m].held = waiting;
        for (from, request) in ready {
            self.serve(from, m, request);
        }
    }

    fn at_client(&mut self, c: usize, side: Side, from: usize, response: Response) {
        let Some(running) = self.clients[c].running.as_mut() else {
            return;
        };
        if running.side != side {
            return;
        }
        let step = match &mut running.machine {
            Machine::Write(w) => match w.on_response(Slot(from as u32), response) {
                Step::Continue(sends) => Ok(sends),
                Step::Done(result) => Err(result.map(|_| Outcome::Ok)),
            },
            Machine::Read(r) => match r.on_response(Slot(from as u32), response) {
                Step::Continue(sends) => Ok(sends),
                Step::Done(result) => {
                    Err(result.map(|outcome| Outcome::Read(outcome.value.map(|v| v.to_vec()))))
                }
            },
        };
        match step {
            Ok(sends) => self.send_from_client(c, side, sends),
            Err(result) => {
                let index = running.index;
                self.clients[c].running = None;
                match result {
                    Ok(outcome) => {
                        if outcome == Outcome::Ok {
                            self.run.acknowledged += 1;
                        }
                        self.history
                            .complete(index, self.step, outcome)
                            .expect("each operation completes once");
                    }
                    Err(error) => {
                        self.run.abandoned += 1;
                        if let ProtocolError::Refused {
                            refusal: Refusal::WrongEpoch { .. },
                            ..
                        } = error
                        {
                            self.clients[c].knows_new = true;
                        }
                    }
                }
            }
        }
    }

    fn finish(mut self) -> TakeoverRun {
        for (m, member) in self.members.iter().enumerate() {
            if member.fault.is_some() {
                continue;
            }
            for key in &self.keys {
                if member.gates.get(key) != Some(&Gate::Open) {
                    self.run
                        .stuck
                        .push(format!("member {m} never served {key:?}"));
                }
            }
        }
        self.run.ops = self.history.len();
        self.run.report = checker::check(&self.history);
        self.run
    }
}
