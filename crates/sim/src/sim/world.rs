//! The discrete-event world: servers, clients, a network and a nemesis, driven one event at a time
//! from a single seeded generator.
//!
//! Everything that happens is an [`Event`] in one priority queue ordered by virtual time and, for
//! equal times, by insertion order, so a run depends on nothing but its seed. The real sans-IO
//! machines do the protocol work: honest `Server`s (or Byzantine wrappers around them),
//! `WriteOp`s and `ReadOp`s. The world only carries their messages, with delays, losses,
//! duplicates and partitions; persists servers' changes; crashes and restarts processes; and
//! records what every correct client invoked and observed.
//!
//! Durability follows the node's rule, "persist, then reply": a handled request's changes and its
//! reply wait in a per-server FIFO for a random persistence delay; the changes become durable
//! exactly when the reply is released. Replies leave in handling order, because a later reply may
//! reveal state an earlier request created (a COLLECT answered from an `lc` that a COMPLETE just
//! raised): releasing it before that change is durable would let a crash take back what a client
//! already saw. A crash drops every pending change and reply.

use super::RunStats;
use super::config::SimConfig;
use super::swarm::Swarm;
use crate::byzantine::reader::{Attack, ReaderAttacker};
use crate::byzantine::{Behaviour, make_server};
use crate::checker::{History, Op, OpKind, Outcome as OpOutcome};
use crate::durable::{DurableState, StorageView};
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::{ClientId, Key, MacKey, NodeId, Time};
use bulwark_protocol::powerstore::{
    Access, Candidate, Change, ClientConfig, FilterAck, OpId, Outbound, Pid, ReadOp, ReadOutcome,
    Request, RequestBody, Response, ResponseBody, ServerConfig, ServerLogic, Step, Timestamp,
    WriteOp, WriteOutcome, WriterKeys,
};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

/// How often the nemesis considers injecting a fault, and the watchdog checks deadlines.
const NEMESIS_TICK_MILLIS: u64 = 20;
/// The common delay of the liveness phase: the network is calm, not instantaneous.
const LIVENESS_DELAY_MAX_MILLIS: u64 = 20;
/// Upper end of ordinary value sizes; the codec replicates anything up to 4 KiB whole.
const SMALL_VALUE_BYTES_MAX: usize = 200;
/// Upper end of large value sizes (from 4 KiB + 1, so they are erasure-coded): big enough to code,
/// small enough to keep runs fast.
const LARGE_VALUE_BYTES_MAX: usize = 12_000;
/// Collect operations a Byzantine reader remembers (to learn which key a reply was about).
const ATTACKER_COLLECTS_MAX: usize = 64;

/// What the world hands back to [`super::run`].
pub(super) struct Outcome {
    pub history: History,
    pub liveness_violations: Vec<String>,
    pub other_violations: Vec<String>,
    pub stats: RunStats,
    pub trace: Vec<String>,
}

/// Runs one seed to completion.
pub(super) fn simulate(seed: u64, config: &SimConfig) -> (Swarm, Outcome) {
    let mut world = World::new(seed, config);
    world.start();
    while let Some(scheduled) = world.queue.pop() {
        world.now = scheduled.at;
        if world.finished() {
            break;
        }
        world.dispatch(scheduled.event);
    }
    let swarm = world.swarm.clone();
    (swarm, world.finish())
}

/// A message in flight.
#[derive(Clone, Debug)]
enum Packet {
    ToServer {
        server: usize,
        client: usize,
        request: Request,
    },
    ToClient {
        client: usize,
        server: usize,
        response: Response,
    },
}

#[derive(Debug)]
enum Event {
    Deliver(Box<Packet>),
    /// The head of a server's persistence queue may be durable now.
    Release {
        server: usize,
        incarnation: u32,
    },
    Retransmit {
        client: usize,
        incarnation: u32,
        op: OpId,
    },
    Wake {
        client: usize,
        incarnation: u32,
    },
    Attack {
        client: usize,
    },
    Tick {
        server: usize,
    },
    Nemesis,
    RestartServer {
        server: usize,
        incarnation: u32,
    },
    RestartClient {
        client: usize,
        incarnation: u32,
    },
    Heal {
        partition: u64,
    },
    Liveness,
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed, so the max-heap pops the earliest event, and the first scheduled among equals.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Changes and a reply waiting to become durable.
struct Pending {
    at: u64,
    changes: Vec<Change>,
    reply: Option<(usize, Response)>,
}

struct ServerSlot {
    behaviour: Behaviour,
    config: ServerConfig,
    key: MacKey,
    /// `None` while crashed.
    logic: Option<Box<dyn ServerLogic>>,
    durable: DurableState,
    pending: VecDeque<Pending>,
    /// When the last queued reply is released; later ones never overtake it.
    release_at: u64,
    incarnation: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Writer,
    Reader,
    Attacker,
}

enum Machine {
    Write(WriteOp),
    Read(ReadOp),
}

struct Running {
    machine: Machine,
    op: OpId,
    record: usize,
    /// Set once the liveness phase applies to this operation.
    deadline: Option<u64>,
    /// Already reported as a liveness violation.
    flagged: bool,
}

struct ClientSlot {
    role: Role,
    up: bool,
    incarnation: u32,
    running: Option<Running>,
    attacker: Option<ReaderAttacker>,
    /// For an attacker: which key each of its COLLECTs asked about.
    collects: VecDeque<(OpId, Key)>,
}

struct Partition {
    id: u64,
    servers: Vec<bool>,
    clients: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Safety,
    Liveness { since: u64 },
}

struct World<'a> {
    config: &'a SimConfig,
    swarm: Swarm,
    rng: ChaCha8Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    servers: Vec<ServerSlot>,
    clients: Vec<ClientSlot>,
    client_config: ClientConfig,
    writer_keys: Arc<WriterKeys>,
    codec: Arc<dyn ErasureCodec>,
    keys: Vec<Key>,
    partitions: Vec<Partition>,
    next_partition: u64,
    next_op: u64,
    /// Every value written, by write id: a read's bytes map back to the write that produced them.
    written: Vec<Bytes>,
    history: History,
    phase: Phase,
    issued_safety: usize,
    issued_liveness: usize,
    liveness_scheduled: bool,
    hard_stop: u64,
    liveness_violations: Vec<String>,
    other_violations: Vec<String>,
    stats: RunStats,
    trace: Option<Vec<String>>,
}

impl<'a> World<'a> {
    fn new(seed: u64, config: &'a SimConfig) -> World<'a> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let swarm = Swarm::choose(&mut rng, config);
        let f = config.f;
        let n = 3 * f + 1;
        let server_keys: Vec<MacKey> = (0..n).map(|_| MacKey(rng.random())).collect();
        let writer_keys = Arc::new(WriterKeys {
            timestamp: MacKey(rng.random()),
            servers: server_keys.clone(),
        });
        let servers = (0..n)
            .map(|index| {
                let behaviour = swarm
                    .byzantine
                    .iter()
                    .find(|(node, _)| *node == index)
                    .map_or(Behaviour::Honest, |(_, b)| *b);
                let mut server_config = ServerConfig::new(NodeId(index as u32), f);
                server_config.grace_millis = swarm.grace_millis;
                server_config.superseded_max = swarm.superseded_max;
                server_config.mutations = config.mutations.server;
                let behaviour_seed = if behaviour == Behaviour::Colluding {
                    swarm.collusion_seed
                } else {
                    rng.random()
                };
                let logic = make_server(
                    behaviour,
                    server_config.clone(),
                    server_keys[index].clone(),
                    behaviour_seed,
                );
                ServerSlot {
                    behaviour,
                    config: server_config,
                    key: server_keys[index].clone(),
                    logic: Some(logic),
                    durable: DurableState::new(),
                    pending: VecDeque::new(),
                    release_at: 0,
                    incarnation: 0,
                }
            })
            .collect();
        let mut clients = Vec::new();
        let roles = std::iter::repeat_n(Role::Writer, swarm.writers)
            .chain(std::iter::repeat_n(Role::Reader, swarm.readers))
            .chain(std::iter::repeat_n(Role::Attacker, swarm.attackers));
        for role in roles {
            let attacker = (role == Role::Attacker).then(|| ReaderAttacker::new(n, rng.random()));
            clients.push(ClientSlot {
                role,
                up: true,
                incarnation: 0,
                running: None,
                attacker,
                collects: VecDeque::new(),
            });
        }
        let keys = (0..config.keys.max(1))
            .map(|i| {
                Key::new(format!("key{i}").into_bytes())
                    .unwrap_or_else(|_| unreachable!("short ASCII keys are valid"))
            })
            .collect();
        let mut client_config = ClientConfig::new(f);
        client_config.mutations = config.mutations.client;
        World {
            config,
            swarm,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            servers,
            clients,
            client_config,
            writer_keys,
            codec: Arc::new(ReedSolomonSimd),
            keys,
            partitions: Vec::new(),
            next_partition: 0,
            next_op: 1,
            written: Vec::new(),
            history: History::default(),
            phase: Phase::Safety,
            issued_safety: 0,
            issued_liveness: 0,
            liveness_scheduled: false,
            hard_stop: u64::MAX,
            liveness_violations: Vec::new(),
            other_violations: Vec::new(),
            stats: RunStats::default(),
            trace: config.trace.then(Vec::new),
        }
    }

    fn schedule(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at: self.now.saturating_add(delay),
            seq: self.seq,
            event,
        });
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = self.trace.as_mut() {
            trace.push(format!("{:>8}ms {}", self.now, line()));
        }
    }

    fn start(&mut self) {
        let swarm = self.swarm.describe();
        self.log(|| format!("swarm {swarm}"));
        for client in 0..self.clients.len() {
            let delay = self.rng.random_range(0..=20);
            match self.clients[client].role {
                Role::Attacker => self.schedule(delay, Event::Attack { client }),
                Role::Writer | Role::Reader => self.schedule(
                    delay,
                    Event::Wake {
                        client,
                        incarnation: 0,
                    },
                ),
            }
        }
        for server in 0..self.servers.len() {
            let delay = self.rng.random_range(0..self.swarm.tick_millis.max(1));
            self.schedule(delay, Event::Tick { server });
        }
        self.schedule(0, Event::Nemesis);
        // The safety phase ends when its operations have all been invoked, or at this cap if
        // clients are stuck (more crashes than `f`, long partitions).
        let cap = 5_000 + 300 * self.config.ops as u64;
        self.schedule(cap, Event::Liveness);
    }

    fn finished(&self) -> bool {
        if self.now >= self.hard_stop {
            return true;
        }
        let Phase::Liveness { .. } = self.phase else {
            return false;
        };
        self.issued_liveness >= self.config.liveness_ops
            && self.clients.iter().all(|client| {
                client.role == Role::Attacker
                    || client
                        .running
                        .as_ref()
                        .is_none_or(|running| running.flagged)
            })
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::Deliver(packet) => match *packet {
                Packet::ToServer {
                    server,
                    client,
                    request,
                } => self.deliver_request(server, client, request),
                Packet::ToClient {
                    client,
                    server,
                    response,
                } => self.deliver_response(client, server, response),
            },
            Event::Release {
                server,
                incarnation,
            } => self.release(server, incarnation),
            Event::Retransmit {
                client,
                incarnation,
                op,
            } => self.retransmit(client, incarnation, op),
            Event::Wake {
                client,
                incarnation,
            } => self.wake(client, incarnation),
            Event::Attack { client } => self.attack(client),
            Event::Tick { server } => self.tick(server),
            Event::Nemesis => self.nemesis(),
            Event::RestartServer {
                server,
                incarnation,
            } => self.restart_server(server, incarnation),
            Event::RestartClient {
                client,
                incarnation,
            } => self.restart_client(client, incarnation),
            Event::Heal { partition } => {
                self.partitions.retain(|p| p.id != partition);
                self.log(|| format!("heal partition {partition}"));
            }
            Event::Liveness => self.begin_liveness(),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Network

    /// A one-way delay for `packet`: calm in the liveness phase; in the safety phase the common
    /// delay plus, sometimes, the long tail (per request kind when the swarm targets rounds).
    fn delay(&mut self, packet: &Packet) -> u64 {
        if let Phase::Liveness { .. } = self.phase {
            let max = self.swarm.delay_max.min(LIVENESS_DELAY_MAX_MILLIS);
            return self.rng.random_range(1..=max.max(1));
        }
        let mut delay = self.rng.random_range(1..=self.swarm.delay_max.max(1));
        let server = match packet {
            Packet::ToServer { server, .. } | Packet::ToClient { server, .. } => *server,
        };
        let favoured = self.swarm.favour_byzantine && self.servers[server].behaviour.is_byzantine();
        let tail = match (packet, self.swarm.tail_by_request) {
            _ if favoured => 0.0,
            (Packet::ToServer { request, .. }, Some(tails)) => tails[request_kind(&request.body)],
            _ => self.swarm.tail_probability,
        };
        if tail > 0.0 && self.rng.random_bool(tail) {
            delay += self.rng.random_range(0..=self.swarm.tail_max);
        }
        delay
    }

    fn transmit(&mut self, packet: Packet) {
        self.stats.messages += 1;
        let safety = self.phase == Phase::Safety;
        if safety && self.swarm.loss > 0.0 && self.rng.random_bool(self.swarm.loss) {
            self.stats.lost += 1;
            self.log(|| format!("lost {}", describe_packet(&packet)));
            return;
        }
        if self.swarm.duplication > 0.0 && self.rng.random_bool(self.swarm.duplication) {
            self.stats.duplicated += 1;
            let delay = self.delay(&packet);
            self.schedule(delay, Event::Deliver(Box::new(packet.clone())));
        }
        let delay = self.delay(&packet);
        self.schedule(delay, Event::Deliver(Box::new(packet)));
    }

    fn send_requests(&mut self, client: usize, sends: Vec<Outbound>) {
        for (node, request) in sends {
            let server = node.index();
            self.transmit(Packet::ToServer {
                server,
                client,
                request,
            });
        }
    }

    fn cut(&self, server: usize, client: usize) -> bool {
        self.partitions
            .iter()
            .any(|p| p.servers.get(server) == Some(&true) && p.clients.get(client) == Some(&true))
    }

    fn access(&self, client: usize) -> Access {
        Access {
            write: self.clients[client].role == Role::Writer,
            read: true,
        }
    }

    fn deliver_request(&mut self, server: usize, client: usize, request: Request) {
        if self.cut(server, client) {
            self.stats.partitioned += 1;
            return;
        }
        let access = self.access(client);
        let now = self.now;
        let description = self.trace.is_some().then(|| describe_request(&request));
        let slot = &mut self.servers[server];
        let Some(logic) = slot.logic.as_mut() else {
            self.stats.to_crashed += 1;
            return;
        };
        self.stats.delivered += 1;
        let storage = StorageView {
            durable: &slot.durable,
            pending: slot.pending.iter().flat_map(|p| &p.changes).collect(),
        };
        let handled = logic.handle(
            Time(now),
            ClientId(client as u32),
            access,
            request,
            &storage,
        );
        if handled.refused.is_some() {
            self.stats.refusals += 1;
        }
        let replied = handled.reply.is_some();
        self.log(|| {
            format!(
                "c{client} -> s{server} {}{}",
                description.unwrap_or_default(),
                if replied { "" } else { " (no reply)" }
            )
        });
        let reply = handled.reply.map(|response| (client, response));
        self.enqueue(server, handled.changes, reply);
    }

    /// Queues changes and a reply behind the server's earlier ones (see the module docs).
    fn enqueue(&mut self, server: usize, changes: Vec<Change>, reply: Option<(usize, Response)>) {
        let persist = self.rng.random_range(0..=self.swarm.persist_max);
        let slot = &mut self.servers[server];
        let at = (self.now + persist).max(slot.release_at);
        slot.release_at = at;
        slot.pending.push_back(Pending { at, changes, reply });
        let incarnation = slot.incarnation;
        self.schedule(
            at - self.now,
            Event::Release {
                server,
                incarnation,
            },
        );
    }

    fn release(&mut self, server: usize, incarnation: u32) {
        let mut replies = Vec::new();
        {
            let slot = &mut self.servers[server];
            if slot.incarnation != incarnation || slot.logic.is_none() {
                return;
            }
            while slot.pending.front().is_some_and(|p| p.at <= self.now) {
                let Some(pending) = slot.pending.pop_front() else {
                    break;
                };
                for change in &pending.changes {
                    slot.durable.apply(change);
                }
                if let Some(reply) = pending.reply {
                    replies.push(reply);
                }
            }
        }
        for (client, response) in replies {
            self.transmit(Packet::ToClient {
                client,
                server,
                response,
            });
        }
    }

    fn tick(&mut self, server: usize) {
        let now = self.now;
        if let Some(logic) = self.servers[server].logic.as_mut() {
            let changes = logic.tick(Time(now));
            if !changes.is_empty() {
                self.log(|| format!("s{server} gc: {} changes", changes.len()));
                self.enqueue(server, changes, None);
            }
        }
        let interval = self.swarm.tick_millis.max(1);
        self.schedule(interval, Event::Tick { server });
    }

    // -----------------------------------------------------------------------------------------
    // Correct clients

    fn deliver_response(&mut self, client: usize, server: usize, response: Response) {
        if self.cut(server, client) {
            self.stats.partitioned += 1;
            return;
        }
        if !self.clients[client].up {
            self.stats.to_crashed += 1;
            return;
        }
        self.stats.delivered += 1;
        if self.trace.is_some() {
            let description = describe_response(&response);
            self.log(|| format!("s{server} -> c{client} {description}"));
        }
        if self.clients[client].role == Role::Attacker {
            self.attacker_heard(client, response);
            return;
        }
        let node = NodeId(server as u32);
        let Some(running) = self.clients[client].running.as_mut() else {
            return;
        };
        if running.op != response.op {
            return;
        }
        let progress = match &mut running.machine {
            Machine::Write(write) => match write.on_response(node, response) {
                Step::Continue(sends) => Progress::Continue(sends),
                Step::Done(result) => Progress::Wrote(result.map_err(|e| e.to_string())),
            },
            Machine::Read(read) => match read.on_response(node, response) {
                Step::Continue(sends) => Progress::Continue(sends),
                Step::Done(result) => Progress::Read(result.map_err(|e| e.to_string())),
            },
        };
        match progress {
            Progress::Continue(sends) if sends.is_empty() => {}
            Progress::Continue(sends) => self.next_round(client, sends),
            Progress::Wrote(result) => self.wrote(client, result),
            Progress::Read(result) => self.read(client, result),
        }
    }

    /// A new round begins: send it, unless the client crashes at this boundary, possibly in the
    /// middle of the broadcast (so, say, COMPLETE reaches a single server).
    fn next_round(&mut self, client: usize, mut sends: Vec<Outbound>) {
        if let Some((_, request)) = sends.first()
            && let RequestBody::Filter { candidates } = &request.body
            && carries_twin(candidates)
        {
            self.stats.twin_filters += 1;
        }
        let crash = self.phase == Phase::Safety
            && self.swarm.client_crash_rate > 0.0
            && self.rng.random_bool(self.swarm.client_crash_rate);
        if crash {
            let kept = self.rng.random_range(0..=sends.len());
            // Shuffle so the partial broadcast reaches an arbitrary subset.
            for i in (1..sends.len()).rev() {
                let j = self.rng.random_range(0..=i);
                sends.swap(i, j);
            }
            sends.truncate(kept);
            let round = sends
                .first()
                .map_or("nothing", |(_, request)| request.body.name());
            self.log(|| format!("c{client} crashes after sending {round} to {kept} servers"));
            self.send_requests(client, sends);
            self.crash_client(client);
            return;
        }
        self.send_requests(client, sends);
    }

    fn wrote(&mut self, client: usize, result: Result<WriteOutcome, String>) {
        let Some(running) = self.clients[client].running.take() else {
            return;
        };
        match result {
            Ok(outcome) => {
                self.stats.writes_completed += 1;
                let record = &mut self.history.ops[running.record];
                record.complete = Some(self.now);
                record.outcome = OpOutcome::Ok;
                let ts = ts_label(&outcome.ts);
                self.log(|| format!("c{client} write op{} done ts={ts}", running.op.0));
            }
            Err(error) => self.failed(client, running.op, error),
        }
        self.schedule_wake(client);
    }

    fn read(&mut self, client: usize, result: Result<ReadOutcome, String>) {
        let Some(running) = self.clients[client].running.take() else {
            return;
        };
        match result {
            Ok(outcome) => {
                self.stats.reads_completed += 1;
                self.stats.repairs += u64::from(outcome.repaired);
                self.stats.read_restarts += u64::from(outcome.restarts);
                self.stats.evidence += outcome.evidence.len() as u64;
                for evidence in &outcome.evidence {
                    let blamed = evidence.node.index();
                    let honest = self
                        .servers
                        .get(blamed)
                        .is_none_or(|s| s.behaviour == Behaviour::Honest);
                    if honest && !self.config.mutations.any() {
                        self.other_violations.push(format!(
                            "client {client} blamed correct node {blamed} ({:?}) in read op {} at {}ms",
                            evidence.kind, running.op.0, self.now
                        ));
                    }
                }
                let value = self.canonical_value(outcome.value.as_ref());
                let record = &mut self.history.ops[running.record];
                record.complete = Some(self.now);
                record.outcome = OpOutcome::Read(value);
                let ts = outcome.ts.as_ref().map_or("ts0".to_string(), ts_label);
                let repaired = outcome.repaired;
                let restarts = outcome.restarts;
                self.log(|| {
                    format!(
                        "c{client} read op{} done ts={ts} repaired={repaired} restarts={restarts}",
                        running.op.0
                    )
                });
            }
            Err(error) => self.failed(client, running.op, error),
        }
        self.schedule_wake(client);
    }

    /// A correct client's operation ended in a protocol error. Only `f+1` refusals or a decoding
    /// failure end one, and neither can happen against at most `f` liars.
    fn failed(&mut self, client: usize, op: OpId, error: String) {
        self.stats.failed += 1;
        self.log(|| format!("c{client} op{} failed: {error}", op.0));
        if !self.config.mutations.any() && self.byzantine_count() <= self.config.f {
            self.other_violations.push(format!(
                "client {client} op {} failed at {}ms: {error}",
                op.0, self.now
            ));
        }
    }

    fn byzantine_count(&self) -> usize {
        self.servers
            .iter()
            .filter(|s| s.behaviour.is_byzantine())
            .count()
    }

    fn schedule_wake(&mut self, client: usize) {
        let think = self.rng.random_range(0..=self.swarm.think_max);
        let incarnation = self.clients[client].incarnation;
        self.schedule(
            think,
            Event::Wake {
                client,
                incarnation,
            },
        );
    }

    fn wake(&mut self, client: usize, incarnation: u32) {
        let slot = &self.clients[client];
        if !slot.up || slot.incarnation != incarnation || slot.running.is_some() {
            return;
        }
        match self.phase {
            Phase::Safety if self.issued_safety < self.config.ops => {
                self.issued_safety += 1;
                self.invoke(client);
                if self.issued_safety >= self.config.ops && !self.liveness_scheduled {
                    // Let the last safety operations run into the liveness phase sometimes.
                    let delay = self.rng.random_range(0..=500);
                    self.liveness_scheduled = true;
                    self.schedule(delay, Event::Liveness);
                }
            }
            Phase::Liveness { .. } if self.issued_liveness < self.config.liveness_ops => {
                self.issued_liveness += 1;
                self.invoke(client);
            }
            // Idle until the liveness phase wakes everyone.
            _ => {}
        }
    }

    fn invoke(&mut self, client: usize) {
        let key = self.keys[self.rng.random_range(0..self.keys.len())].clone();
        let op = OpId(self.next_op);
        self.next_op += 1;
        let writes = self.clients[client].role == Role::Writer
            && self.rng.random_bool(self.swarm.write_ratio);
        let incarnation = self.clients[client].incarnation;
        let history_client = client as u64 * 1_000 + u64::from(incarnation);
        let (machine, sends, kind) = if writes {
            let value = if self.rng.random_bool(self.swarm.delete_probability) {
                None
            } else {
                Some(self.new_value())
            };
            let kind = OpKind::Write(
                value
                    .as_ref()
                    .map(|_| value_name(self.written.len() as u64 - 1)),
            );
            let mut write = WriteOp::new(
                self.client_config.clone(),
                self.writer_keys.clone(),
                self.codec.clone(),
                key.clone(),
                op,
                Pid {
                    writer: ClientId(client as u32),
                    seq: op.0,
                },
                self.rng.random(),
                value,
            );
            let sends = write.start();
            (Machine::Write(write), sends, kind)
        } else {
            let mut read = ReadOp::new(
                self.client_config.clone(),
                self.codec.clone(),
                key.clone(),
                op,
            );
            let sends = read.start();
            (Machine::Read(read), sends, OpKind::Read)
        };
        self.stats.ops_invoked += 1;
        let kind_name = if writes { "write" } else { "read" };
        self.log(|| format!("c{client} invokes {kind_name} op{} on {key}", op.0));
        self.history.push(Op {
            client: history_client,
            key: key.as_bytes().to_vec(),
            kind,
            invoke: self.now,
            complete: None,
            outcome: OpOutcome::Unknown,
        });
        let deadline = match self.phase {
            Phase::Liveness { .. } => Some(self.now + self.config.liveness_bound_millis),
            Phase::Safety => None,
        };
        self.clients[client].running = Some(Running {
            machine,
            op,
            record: self.history.ops.len() - 1,
            deadline,
            flagged: false,
        });
        self.send_requests(client, sends);
        let interval = self.retransmit_interval();
        self.schedule(
            interval,
            Event::Retransmit {
                client,
                incarnation,
                op,
            },
        );
    }

    /// A fresh value: its write id (so every value is unique and maps back to its write), then
    /// deterministic filler, sometimes long enough to be erasure-coded.
    fn new_value(&mut self) -> Bytes {
        let id = self.written.len() as u64;
        let len = if self.rng.random_bool(self.swarm.large_probability) {
            self.rng.random_range(4_097..=LARGE_VALUE_BYTES_MAX)
        } else {
            self.rng.random_range(8..=SMALL_VALUE_BYTES_MAX)
        };
        let mut value = id.to_be_bytes().to_vec();
        value.extend((8..len).map(|i| (i as u64 ^ id.wrapping_mul(0x9e37)) as u8));
        let value = Bytes::from(value);
        self.written.push(value.clone());
        value
    }

    /// The history's name for a value read: `w<id>` when the bytes are exactly a written value,
    /// otherwise `unwritten:` with a hex prefix and the length, which no write can equal (so the
    /// checker reports it).
    fn canonical_value(&self, value: Option<&Bytes>) -> Option<Vec<u8>> {
        let value = value?;
        if value.len() >= 8 {
            let mut id = [0u8; 8];
            id.copy_from_slice(&value[..8]);
            let id = u64::from_be_bytes(id);
            let written = usize::try_from(id).ok().and_then(|i| self.written.get(i));
            if written.is_some_and(|written| written == value) {
                return Some(value_name(id));
            }
        }
        let prefix: String = value.iter().take(12).map(|b| format!("{b:02x}")).collect();
        Some(format!("unwritten:{prefix}..:{}B", value.len()).into_bytes())
    }

    fn retransmit_interval(&mut self) -> u64 {
        let base = self.swarm.retransmit_millis;
        base + self.rng.random_range(0..=base / 2)
    }

    fn retransmit(&mut self, client: usize, incarnation: u32, op: OpId) {
        let slot = &self.clients[client];
        if !slot.up || slot.incarnation != incarnation {
            return;
        }
        let Some(running) = slot.running.as_ref().filter(|r| r.op == op) else {
            return;
        };
        let sends = match &running.machine {
            Machine::Write(write) => write.retransmit(),
            Machine::Read(read) => read.retransmit(),
        };
        self.stats.retransmitted += sends.len() as u64;
        self.send_requests(client, sends);
        let interval = self.retransmit_interval();
        self.schedule(
            interval,
            Event::Retransmit {
                client,
                incarnation,
                op,
            },
        );
    }

    fn crash_client(&mut self, client: usize) {
        self.stats.client_crashes += 1;
        let slot = &mut self.clients[client];
        // The abandoned operation stays in the history with no completion: it may or may not
        // take effect, at any time after its invocation.
        slot.running = None;
        slot.up = false;
        slot.incarnation += 1;
        let incarnation = slot.incarnation;
        self.log(|| format!("c{client} crashed"));
        let downtime = self.rng.random_range(20..=1_000);
        self.schedule(
            downtime,
            Event::RestartClient {
                client,
                incarnation,
            },
        );
    }

    fn restart_client(&mut self, client: usize, incarnation: u32) {
        let slot = &mut self.clients[client];
        if slot.up || slot.incarnation != incarnation {
            return;
        }
        slot.up = true;
        self.log(|| format!("c{client} restarted"));
        self.schedule(
            0,
            Event::Wake {
                client,
                incarnation,
            },
        );
    }

    // -----------------------------------------------------------------------------------------
    // Byzantine readers

    fn attack(&mut self, client: usize) {
        if self.phase != Phase::Safety && self.finished() {
            return;
        }
        let key = self.keys[self.rng.random_range(0..self.keys.len())].clone();
        let attack = match self.clients[client].attacker.as_mut() {
            Some(attacker) => attacker.next_attack(&key),
            None => return,
        };
        let op = OpId(self.next_op);
        self.next_op += 1;
        let n = self.servers.len();
        let (body, targets): (RequestBody, Vec<usize>) = match attack {
            Attack::Collect => {
                let slot = &mut self.clients[client];
                if slot.collects.len() >= ATTACKER_COLLECTS_MAX {
                    slot.collects.pop_front();
                }
                slot.collects.push_back((op, key.clone()));
                (RequestBody::Collect, (0..n).collect())
            }
            Attack::Send(body) => {
                // Write back to an arbitrary subset: a Byzantine reader need not reach a quorum.
                let targets: Vec<usize> = (0..n).filter(|_| self.rng.random_bool(0.5)).collect();
                (body, targets)
            }
        };
        self.stats.attacks += 1;
        for server in targets {
            let request = Request {
                op,
                attempt: 0,
                epoch: self.client_config.epoch,
                group: self.client_config.group,
                key: key.clone(),
                body: body.clone(),
            };
            self.transmit(Packet::ToServer {
                server,
                client,
                request,
            });
        }
        let pause = self.rng.random_range(5..=150);
        self.schedule(pause, Event::Attack { client });
    }

    fn attacker_heard(&mut self, client: usize, response: Response) {
        let slot = &mut self.clients[client];
        let ResponseBody::CollectAck {
            lc: Some(candidate),
        } = response.body
        else {
            return;
        };
        let Some(key) = slot
            .collects
            .iter()
            .find(|(op, _)| *op == response.op)
            .map(|(_, key)| key.clone())
        else {
            return;
        };
        if let Some(attacker) = slot.attacker.as_mut() {
            attacker.observe(&key, candidate);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Nemesis and phases

    fn nemesis(&mut self) {
        match self.phase {
            Phase::Safety => {
                self.maybe_partition();
                self.maybe_crash_server();
                self.maybe_crash_client();
            }
            Phase::Liveness { .. } => self.watch_deadlines(),
        }
        self.schedule(NEMESIS_TICK_MILLIS, Event::Nemesis);
    }

    fn maybe_partition(&mut self) {
        if self.swarm.partition_rate <= 0.0 || !self.rng.random_bool(self.swarm.partition_rate) {
            return;
        }
        let n = self.servers.len();
        let mut servers: Vec<bool> = (0..n).map(|_| self.rng.random_bool(0.5)).collect();
        if !servers.contains(&true) {
            let pick = self.rng.random_range(0..n);
            servers[pick] = true;
        }
        let everyone = self.rng.random_bool(0.5);
        let mut clients: Vec<bool> = (0..self.clients.len())
            .map(|_| everyone || self.rng.random_bool(0.5))
            .collect();
        if !clients.contains(&true) {
            let pick = self.rng.random_range(0..clients.len());
            clients[pick] = true;
        }
        let id = self.next_partition;
        self.next_partition += 1;
        let duration = self.rng.random_range(20..=2_000);
        self.stats.partitions += 1;
        if self.trace.is_some() {
            let servers_cut = indexes(&servers, "s");
            let clients_cut = indexes(&clients, "c");
            self.log(|| {
                format!("partition {id}: [{servers_cut}] cut from [{clients_cut}] for {duration}ms")
            });
        }
        self.partitions.push(Partition {
            id,
            servers,
            clients,
        });
        self.schedule(duration, Event::Heal { partition: id });
    }

    fn maybe_crash_server(&mut self) {
        if self.swarm.crash_rate <= 0.0 || !self.rng.random_bool(self.swarm.crash_rate) {
            return;
        }
        let f = self.config.f;
        let down = self.servers.iter().filter(|s| s.logic.is_none()).count();
        // Wait-freedom needs at most f servers faulty (Byzantine or down) at once; an overload
        // seed lets more correct servers go down, which must still be safe.
        let limit = if self.swarm.crash_overload {
            2 * f
        } else {
            f.saturating_sub(self.byzantine_count())
        };
        if down + 1 > limit {
            return;
        }
        let candidates: Vec<usize> = (0..self.servers.len())
            .filter(|&i| {
                self.servers[i].behaviour == Behaviour::Honest && self.servers[i].logic.is_some()
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let server = candidates[self.rng.random_range(0..candidates.len())];
        let slot = &mut self.servers[server];
        let lost = slot.pending.len();
        slot.logic = None;
        slot.pending.clear();
        slot.release_at = 0;
        slot.incarnation += 1;
        let incarnation = slot.incarnation;
        self.stats.server_crashes += 1;
        self.log(|| format!("s{server} crashed, {lost} unpersisted replies lost"));
        let downtime = self.rng.random_range(10..=2_000);
        self.schedule(
            downtime,
            Event::RestartServer {
                server,
                incarnation,
            },
        );
    }

    fn restart_server(&mut self, server: usize, incarnation: u32) {
        let now = self.now;
        let slot = &mut self.servers[server];
        if slot.logic.is_some() || slot.incarnation != incarnation {
            return;
        }
        let restored = slot
            .durable
            .restore(slot.config.clone(), slot.key.clone(), Time(now));
        slot.logic = Some(Box::new(restored));
        let versions = slot.durable.versions();
        self.log(|| format!("s{server} restarted with {versions} durable versions"));
    }

    fn maybe_crash_client(&mut self) {
        let rate = self.swarm.client_crash_rate / 4.0;
        if rate <= 0.0 || !self.rng.random_bool(rate) {
            return;
        }
        let busy: Vec<usize> = (0..self.clients.len())
            .filter(|&c| {
                self.clients[c].role != Role::Attacker
                    && self.clients[c].up
                    && self.clients[c].running.is_some()
            })
            .collect();
        if busy.is_empty() {
            return;
        }
        let client = busy[self.rng.random_range(0..busy.len())];
        self.log(|| format!("c{client} crashes mid-round"));
        self.crash_client(client);
    }

    fn begin_liveness(&mut self) {
        if self.phase != Phase::Safety {
            return;
        }
        let now = self.now;
        self.phase = Phase::Liveness { since: now };
        self.hard_stop = now + 3 * self.config.liveness_bound_millis;
        self.log(|| "liveness phase: heal, restart, no loss".to_string());
        self.partitions.clear();
        for server in 0..self.servers.len() {
            let incarnation = self.servers[server].incarnation;
            self.restart_server(server, incarnation);
        }
        let bound = self.config.liveness_bound_millis;
        for client in 0..self.clients.len() {
            let slot = &mut self.clients[client];
            if slot.role == Role::Attacker {
                continue;
            }
            if !slot.up {
                let incarnation = slot.incarnation;
                self.restart_client(client, incarnation);
                continue;
            }
            match slot.running.as_mut() {
                Some(running) => running.deadline = Some(now + bound),
                None => {
                    let incarnation = slot.incarnation;
                    self.schedule(
                        0,
                        Event::Wake {
                            client,
                            incarnation,
                        },
                    );
                }
            }
        }
    }

    fn watch_deadlines(&mut self) {
        let now = self.now;
        for client in 0..self.clients.len() {
            let Some(running) = self.clients[client].running.as_mut() else {
                continue;
            };
            let overdue = running.deadline.is_some_and(|deadline| deadline < now);
            if !overdue || running.flagged {
                continue;
            }
            running.flagged = true;
            let record = &self.history.ops[running.record];
            let kind = match record.kind {
                OpKind::Write(_) => "write",
                OpKind::Read => "read",
            };
            let line = format!(
                "client {client} {kind} op {} on {} invoked at {}ms has not completed by {now}ms (bound {}ms from the liveness phase or its invocation)",
                running.op.0,
                String::from_utf8_lossy(&record.key),
                record.invoke,
                self.config.liveness_bound_millis
            );
            self.log(|| line.clone());
            self.liveness_violations.push(line);
        }
    }

    fn finish(mut self) -> Outcome {
        self.watch_deadlines();
        self.stats.virtual_millis = self.now;
        if let Phase::Liveness { since } = self.phase {
            self.stats.liveness_started_millis = since;
        }
        self.stats.durable_changes = self.servers.iter().map(|s| s.durable.applied()).sum();
        Outcome {
            history: self.history,
            liveness_violations: self.liveness_violations,
            other_violations: self.other_violations,
            stats: self.stats,
            trace: self.trace.unwrap_or_default(),
        }
    }
}

/// Whether two candidates share a timestamp but not a nonce: a §4.8(a) twin is in play.
fn carries_twin(candidates: &[Candidate]) -> bool {
    candidates.iter().enumerate().any(|(i, a)| {
        candidates[i + 1..]
            .iter()
            .any(|b| a.ts == b.ts && a.nonce != b.nonce)
    })
}

/// The index of a request kind in [`Swarm::tail_by_request`].
fn request_kind(body: &RequestBody) -> usize {
    match body {
        RequestBody::Clock => 0,
        RequestBody::Store { .. } => 1,
        RequestBody::Complete { .. } => 2,
        RequestBody::Collect => 3,
        RequestBody::Filter { .. } => 4,
        RequestBody::Repair { .. } => 5,
    }
}

/// The history's name for the value of write `id`.
fn value_name(id: u64) -> Vec<u8> {
    format!("w{id}").into_bytes()
}

enum Progress {
    Continue(Vec<Outbound>),
    Wrote(Result<WriteOutcome, String>),
    Read(Result<ReadOutcome, String>),
}

fn indexes(members: &[bool], prefix: &str) -> String {
    members
        .iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(i, _)| format!("{prefix}{i}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn ts_label(ts: &Timestamp) -> String {
    format!("{}.w{}.{}", ts.num, ts.pid.writer.0, ts.pid.seq)
}

fn candidate_label(candidate: &Candidate) -> String {
    format!(
        "{}/N{:02x}{:02x}",
        ts_label(&candidate.ts),
        candidate.nonce.0[0],
        candidate.nonce.0[1]
    )
}

fn describe_request(request: &Request) -> String {
    let detail = match &request.body {
        RequestBody::Store { ts, fragment, .. } => {
            format!(" ts={} fragment={}B", ts_label(ts), fragment.len())
        }
        RequestBody::Complete { ts, .. } => format!(" ts={}", ts_label(ts)),
        RequestBody::Filter { candidates } => format!(
            " C=[{}]",
            candidates
                .iter()
                .map(candidate_label)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        RequestBody::Repair { candidate } => format!(" c={}", candidate_label(candidate)),
        RequestBody::Clock | RequestBody::Collect => String::new(),
    };
    format!(
        "{} key={} op{}.{}{detail}",
        request.body.name(),
        request.key,
        request.op.0,
        request.attempt
    )
}

fn describe_response(response: &Response) -> String {
    let detail = match &response.body {
        ResponseBody::ClockAck { lc_ts } => format!(
            "clock-ack lc.ts={}",
            lc_ts.as_ref().map_or("ts0".to_string(), ts_label)
        ),
        ResponseBody::StoreAck { ts } => format!("store-ack ts={}", ts_label(ts)),
        ResponseBody::CompleteAck { ts } => format!("complete-ack ts={}", ts_label(ts)),
        ResponseBody::CollectAck { lc } => format!(
            "collect-ack lc={}",
            lc.as_ref().map_or("c0".to_string(), candidate_label)
        ),
        ResponseBody::FilterAck(ack) => match ack {
            FilterAck::Initial => "filter-ack initial".to_string(),
            FilterAck::Entry { ts, fragment, .. } => {
                format!(
                    "filter-ack entry ts={} fragment={}B",
                    ts_label(ts),
                    fragment.len()
                )
            }
            FilterAck::MacOnly { ts } => format!("filter-ack mac-only ts={}", ts_label(ts)),
            FilterAck::Superseded { ts, newer } => format!(
                "filter-ack superseded ts={} offers {}",
                ts_label(ts),
                ts_label(&newer.ts)
            ),
        },
        ResponseBody::RepairAck => "repair-ack".to_string(),
        ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
    };
    format!("{detail} op{}.{}", response.op.0, response.attempt)
}

fn describe_packet(packet: &Packet) -> String {
    match packet {
        Packet::ToServer {
            server,
            client,
            request,
        } => format!("c{client} -> s{server} {}", describe_request(request)),
        Packet::ToClient {
            client,
            server,
            response,
        } => format!("s{server} -> c{client} {}", describe_response(response)),
    }
}
