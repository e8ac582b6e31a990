//! The discrete-event world: servers, clients, a network and a nemesis, driven one event at a time
//! from a single seeded generator.
//!
//! Everything that happens is an [`Event`] in one priority queue ordered by virtual time and, for
//! equal times, by insertion order, so a run depends on nothing but its seed. The real sans-IO
//! machines of the protocol under test ([`Protocol`]) do the protocol work: its honest servers (or
//! Byzantine wrappers around them) and its client operations. The world only carries their
//! messages, with delays, losses, duplicates and partitions; persists servers' changes; crashes
//! and restarts processes; and records what every correct client invoked and observed.
//!
//! Durability follows the node's rule, "persist, then reply", through the very
//! [`Sequencer`] the node uses: every handled input's changes go to the simulated disk as one
//! batch with a random commit delay (batches commit in order), and its reply waits in the
//! sequencer until every batch submitted before it is durable. So replies leave in handling
//! order, because a later reply may reveal state an earlier request created (a COLLECT answered
//! from an `lc` that a COMPLETE just raised): releasing it before that change is durable would
//! let a crash take back what a client already saw. A crash drops every pending batch and reply.
//!
//! Unlike the node, an input with no changes is a batch too: its reply waits for a commit delay
//! of its own. That models the actor's queueing latency, and keeps schedules of fixed seeds as
//! they were before the sequencer was shared.

use super::RunStats;
use super::config::SimConfig;
use super::protocol::{Attacker, Finish, Finished, Protocol, Storage};
use super::swarm::Swarm;
use crate::byzantine::Behaviour;
use crate::checker::{History, Op, OpKind, Outcome as OpOutcome, Report};
use bulwark_a2m::A2m;
use bulwark_core::a2m::Refusal;
use bulwark_core::{ClientId, Key, Slot, Time};
use bulwark_protocol::machine::{
    Access, Attest, OpError, Operation, Output, Progress, Replica, Sequencer, TimerId,
};
use bulwark_protocol::round::OpId;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

/// How often the nemesis considers injecting a fault, and the watchdog checks deadlines.
const NEMESIS_TICK_MILLIS: u64 = 20;
/// The common delay of the liveness phase: the network is calm, not instantaneous.
const LIVENESS_DELAY_MAX_MILLIS: u64 = 20;
/// Upper end of ordinary value sizes; the codec replicates anything up to 4 KiB whole.
const SMALL_VALUE_BYTES_MAX: usize = 200;
/// Upper end of large value sizes (from 4 KiB + 1, so they are erasure-coded): big enough to code,
/// small enough to keep runs fast.
const LARGE_VALUE_BYTES_MAX: usize = 12_000;

/// What the world hands back to [`super::run`].
pub(super) struct Outcome {
    pub history: History,
    pub report: Report,
    pub liveness_violations: Vec<String>,
    pub other_violations: Vec<String>,
    pub stats: RunStats,
    pub trace: Vec<String>,
}

/// Runs one seed to completion.
pub(super) fn simulate<P: Protocol>(seed: u64, config: &SimConfig) -> (Swarm, Outcome) {
    let mut world = World::<P>::new(seed, config);
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

/// A process: servers and clients share one address space, so any may send to any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Process {
    Server(usize),
    Client(usize),
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Process::Server(index) => write!(f, "s{index}"),
            Process::Client(index) => write!(f, "c{index}"),
        }
    }
}

/// What a packet carries.
enum Body<P: Protocol> {
    /// A client's request to a server.
    Request(P::Request),
    /// A server's reply to a client.
    Response(P::Response),
    /// A message between servers of the group.
    Message(Message<P>),
    /// Calls a server makes to its own trusted log once its changes are durable; never on the
    /// network.
    Attest(Attest),
}

type Message<P> = <<P as Protocol>::Server as Replica>::Message;

/// A message in flight.
struct Packet<P: Protocol> {
    from: Process,
    to: Process,
    body: Body<P>,
}

impl<P: Protocol> Clone for Packet<P> {
    fn clone(&self) -> Self {
        let body = match &self.body {
            Body::Request(request) => Body::Request(request.clone()),
            Body::Response(response) => Body::Response(response.clone()),
            Body::Message(message) => Body::Message(message.clone()),
            Body::Attest(attest) => Body::Attest(attest.clone()),
        };
        Packet {
            from: self.from,
            to: self.to,
            body,
        }
    }
}

impl<P: Protocol> Packet<P> {
    fn to_server(client: usize, server: usize, request: P::Request) -> Self {
        Packet {
            from: Process::Client(client),
            to: Process::Server(server),
            body: Body::Request(request),
        }
    }

    /// The server at one end (the sender when both are), whose behaviour may bend delays.
    fn server(&self) -> Option<usize> {
        match (self.from, self.to) {
            (Process::Server(server), _) | (_, Process::Server(server)) => Some(server),
            (Process::Client(_), Process::Client(_)) => None,
        }
    }
}

enum Event<P: Protocol> {
    Deliver(Box<Packet<P>>),
    /// A timer a server set; `generation` tells a moved timer's stale event from its live one.
    Timer {
        server: usize,
        incarnation: u32,
        timer: TimerId,
        generation: u64,
    },
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

struct Scheduled<P: Protocol> {
    at: u64,
    seq: u64,
    event: Event<P>,
}

impl<P: Protocol> PartialEq for Scheduled<P> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<P: Protocol> Eq for Scheduled<P> {}
impl<P: Protocol> PartialOrd for Scheduled<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<P: Protocol> Ord for Scheduled<P> {
    /// Reversed, so the max-heap pops the earliest event, and the first scheduled among equals.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct ServerSlot<P: Protocol> {
    behaviour: Behaviour,
    /// `None` while crashed.
    logic: Option<P::Server>,
    storage: Storage<P>,
    /// Changes that became durable so far, for statistics.
    applied: u64,
    /// What waits for `storage` to become durable before it leaves.
    sequencer: Sequencer<Packet<P>>,
    /// When the last submitted batch commits; later ones never overtake it.
    release_at: u64,
    /// Timers set and not yet fired, with the generation of their latest setting. A crash
    /// clears them: a restarted replica starts with none.
    timers: BTreeMap<TimerId, u64>,
    incarnation: u32,
    /// Its trusted log, if the protocol gives it one; crashes leave it as it was.
    trusted: Option<bulwark_a2m::Component>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Writer,
    Reader,
    Attacker,
}

/// A correct client's operation: the world drives both kinds through [`Operation`].
enum ClientOp<P: Protocol> {
    Write(P::Write),
    Read(P::Read),
}

/// What an operation says after a reply, in the world's terms.
enum OpStep<R> {
    Continue(Vec<(Slot, R)>),
    Done(Result<Finished, Ended>),
}

/// How an operation ended without a result.
enum Ended {
    /// It failed: only `f+1` refusals or a decoding failure end one.
    Failed(String),
    /// It does not know whether it took effect (`OpError::Unknown`): its record stays open, as
    /// a crashed client's does, and the checker lets it take effect or not.
    Unknown(String),
}

impl<P: Protocol> ClientOp<P> {
    fn start(&mut self) -> Vec<(Slot, P::Request)> {
        match self {
            ClientOp::Write(op) => op.start(),
            ClientOp::Read(op) => op.start(),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, P::Request)> {
        match self {
            ClientOp::Write(op) => op.on_timeout(),
            ClientOp::Read(op) => op.on_timeout(),
        }
    }

    /// Feeds one reply; a write that completes is shown to `wrote` before the world sees it.
    fn on_reply(
        &mut self,
        from: Slot,
        reply: P::Response,
        wrote: impl FnOnce(&<P::Write as Operation>::Output),
    ) -> OpStep<P::Request> {
        match self {
            ClientOp::Write(op) => match op.on_reply(from, reply) {
                Progress::Done(Ok(output)) => {
                    wrote(&output);
                    OpStep::Done(Ok(output.finish()))
                }
                progress => step(progress),
            },
            ClientOp::Read(op) => step(op.on_reply(from, reply)),
        }
    }
}

fn step<O: Operation<Output: Finish>>(progress: Progress<O>) -> OpStep<O::Request> {
    match progress {
        Progress::Send(sends) => OpStep::Continue(sends),
        Progress::Done(result) => {
            OpStep::Done(result.map(Finish::finish).map_err(|error| match error {
                OpError::Unknown(why) => Ended::Unknown(why),
                error => Ended::Failed(error.to_string()),
            }))
        }
    }
}

struct Running<P: Protocol> {
    machine: ClientOp<P>,
    key: Key,
    writes: bool,
    op: OpId,
    record: usize,
    /// Set once the liveness phase applies to this operation.
    deadline: Option<u64>,
    /// Already reported as a liveness violation.
    flagged: bool,
}

struct ClientSlot<P: Protocol> {
    role: Role,
    up: bool,
    incarnation: u32,
    running: Option<Running<P>>,
    attacker: Option<Box<dyn Attacker<P>>>,
}

/// `servers` are cut off from `clients` and from every server outside `servers`.
struct Partition {
    id: u64,
    servers: Vec<bool>,
    clients: Vec<bool>,
}

impl Partition {
    fn cuts(&self, a: Process, b: Process) -> bool {
        let server = |i: usize| self.servers.get(i) == Some(&true);
        let client = |i: usize| self.clients.get(i) == Some(&true);
        match (a, b) {
            (Process::Server(s), Process::Client(c)) | (Process::Client(c), Process::Server(s)) => {
                server(s) && client(c)
            }
            (Process::Server(x), Process::Server(y)) => server(x) != server(y),
            (Process::Client(_), Process::Client(_)) => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Safety,
    Liveness { since: u64 },
}

struct World<'a, P: Protocol> {
    config: &'a SimConfig,
    protocol: P,
    swarm: Swarm,
    rng: ChaCha8Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled<P>>,
    servers: Vec<ServerSlot<P>>,
    clients: Vec<ClientSlot<P>>,
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

impl<'a, P: Protocol> World<'a, P> {
    fn new(seed: u64, config: &'a SimConfig) -> World<'a, P> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = P::nodes(config.f);
        let faults = P::tolerated(&config.faults);
        let swarm = Swarm::choose(&mut rng, config, n, &faults);
        let protocol = P::new(&mut rng, config, &swarm);
        let servers = (0..n)
            .map(|index| {
                let behaviour = swarm
                    .byzantine
                    .iter()
                    .find(|(node, _)| *node == index)
                    .map_or(Behaviour::Honest, |(_, b)| *b);
                let behaviour_seed = if behaviour == Behaviour::Colluding {
                    swarm.collusion_seed
                } else {
                    rng.random()
                };
                let logic = protocol.server(index, behaviour, behaviour_seed);
                ServerSlot {
                    behaviour,
                    logic: Some(logic),
                    storage: Storage::default(),
                    applied: 0,
                    sequencer: Sequencer::default(),
                    release_at: 0,
                    timers: BTreeMap::new(),
                    incarnation: 0,
                    trusted: protocol.trusted_log(index),
                }
            })
            .collect();
        let mut clients = Vec::new();
        let roles = std::iter::repeat_n(Role::Writer, swarm.writers)
            .chain(std::iter::repeat_n(Role::Reader, swarm.readers))
            .chain(std::iter::repeat_n(Role::Attacker, swarm.attackers));
        for role in roles {
            let attacker = if role == Role::Attacker {
                protocol.attacker(rng.random())
            } else {
                None
            };
            clients.push(ClientSlot {
                role,
                up: true,
                incarnation: 0,
                running: None,
                attacker,
            });
        }
        let keys = (0..config.keys.max(1))
            .map(|i| protocol.key(i, swarm.writers))
            .collect();
        World {
            config,
            protocol,
            swarm,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            servers,
            clients,
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

    fn schedule(&mut self, delay: u64, event: Event<P>) {
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

    fn finished(&mut self) -> bool {
        if self.now >= self.hard_stop {
            return true;
        }
        let Phase::Liveness { .. } = self.phase else {
            return false;
        };
        let done = self.issued_liveness >= self.config.liveness_ops
            && self.clients.iter().all(|client| {
                client.role == Role::Attacker
                    || client
                        .running
                        .as_ref()
                        .is_none_or(|running| running.flagged)
            });
        if done && P::SETTLE_MILLIS > 0 {
            // Settle, then stop: the hard stop is the end either way.
            self.hard_stop = self.hard_stop.min(self.now + P::SETTLE_MILLIS);
            return false;
        }
        done
    }

    fn dispatch(&mut self, event: Event<P>) {
        match event {
            Event::Deliver(packet) => self.deliver(*packet),
            Event::Timer {
                server,
                incarnation,
                timer,
                generation,
            } => self.fire(server, incarnation, timer, generation),
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
    fn delay(&mut self, packet: &Packet<P>) -> u64 {
        if let Phase::Liveness { .. } = self.phase {
            let max = self.swarm.delay_max.min(LIVENESS_DELAY_MAX_MILLIS);
            return self.rng.random_range(1..=max.max(1));
        }
        let mut delay = self.rng.random_range(1..=self.swarm.delay_max.max(1));
        let favoured = self.swarm.favour_byzantine
            && packet
                .server()
                .is_some_and(|server| self.servers[server].behaviour.is_byzantine());
        let tail = match (&packet.body, self.swarm.tail_by_request) {
            _ if favoured => 0.0,
            (Body::Request(request), Some(tails)) => {
                tails[P::request_kind(request).min(tails.len() - 1)]
            }
            _ => self.swarm.tail_probability,
        };
        if tail > 0.0 && self.rng.random_bool(tail) {
            delay += self.rng.random_range(0..=self.swarm.tail_max);
        }
        delay
    }

    fn transmit(&mut self, packet: Packet<P>) {
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

    fn send_requests(&mut self, client: usize, sends: Vec<(Slot, P::Request)>) {
        for (node, request) in sends {
            self.transmit(Packet::to_server(client, node.index(), request));
        }
    }

    fn deliver(&mut self, packet: Packet<P>) {
        if self
            .partitions
            .iter()
            .any(|p| p.cuts(packet.from, packet.to))
        {
            self.stats.partitioned += 1;
            return;
        }
        match (packet.from, packet.to, packet.body) {
            (Process::Client(client), Process::Server(server), Body::Request(request)) => {
                self.deliver_request(server, client, request)
            }
            (Process::Server(server), Process::Client(client), Body::Response(response)) => {
                self.deliver_response(client, server, response)
            }
            (Process::Server(from), Process::Server(to), Body::Message(message)) => {
                self.deliver_message(to, from, message)
            }
            // The world only builds the three shapes above.
            _ => {}
        }
    }

    fn deliver_request(&mut self, server: usize, client: usize, request: P::Request) {
        let writer = self.clients[client].role == Role::Writer;
        let now = self.now;
        let description = self.trace.is_some().then(|| P::describe_request(&request));
        let slot = &mut self.servers[server];
        let Some(logic) = slot.logic.as_mut() else {
            self.stats.to_crashed += 1;
            return;
        };
        self.stats.delivered += 1;
        let access = Access {
            write: writer,
            read: true,
        };
        let from = ClientId(client as u32);
        let handled = logic.on_request(Time(now), from, access, request, P::view(&slot.storage));
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
        // A request is always a batch, even one that changed and said nothing: the server
        // took it in, and that takes the actor a commit's time.
        self.effects(server, handled, Some(client), true);
    }

    fn deliver_message(&mut self, server: usize, from: usize, message: Message<P>) {
        let now = self.now;
        let description = self.trace.is_some().then(|| P::describe_message(&message));
        let slot = &mut self.servers[server];
        let Some(logic) = slot.logic.as_mut() else {
            self.stats.to_crashed += 1;
            return;
        };
        self.stats.delivered += 1;
        let handled = logic.on_message(
            Time(now),
            Slot(from as u32),
            message,
            P::view(&slot.storage),
        );
        self.log(|| format!("s{from} -> s{server} {}", description.unwrap_or_default()));
        self.effects(server, handled, None, false);
    }

    fn fire(&mut self, server: usize, incarnation: u32, timer: TimerId, generation: u64) {
        let now = self.now;
        let slot = &mut self.servers[server];
        if slot.incarnation != incarnation || slot.timers.get(&timer) != Some(&generation) {
            return;
        }
        slot.timers.remove(&timer);
        let Some(logic) = slot.logic.as_mut() else {
            return;
        };
        let handled = logic.on_timer(Time(now), timer, P::view(&slot.storage));
        self.effects(server, handled, None, false);
    }

    /// Carries out what a server asked for after one input: timers at once; its changes as one
    /// batch, with the reply (to `client`), the answers to earlier requests (`notify`, each to the
    /// client that sent the request) and peer messages held until it is durable. An input other
    /// than a request that has nothing to persist or send costs no batch.
    fn effects(
        &mut self,
        server: usize,
        output: Output<P::Server>,
        client: Option<usize>,
        request: bool,
    ) {
        let incarnation = self.servers[server].incarnation;
        for (timer, at) in output.timers {
            // The sequence number `schedule` is about to give the event: unique, so a timer set
            // again makes its earlier event stale.
            let generation = self.seq + 1;
            self.servers[server].timers.insert(timer, generation);
            self.schedule(
                at.0.saturating_sub(self.now),
                Event::Timer {
                    server,
                    incarnation,
                    timer,
                    generation,
                },
            );
        }
        let quiet = output.changes.is_empty()
            && output.reply.is_none()
            && output.notify.is_empty()
            && output.sends.is_empty()
            && output.attest.is_empty();
        if quiet && !request {
            return;
        }
        let reply = output.reply.zip(client).map(|(response, client)| Packet {
            from: Process::Server(server),
            to: Process::Client(client),
            body: Body::Response(response),
        });
        // Answers to earlier requests go to the client process the request came from: the world
        // names client `c` as `ClientId(c)` when it hands a request to `on_request`. A client id
        // that names no process goes nowhere.
        let clients = self.clients.len();
        let notify = output
            .notify
            .into_iter()
            .filter(|(client, _, _)| (client.0 as usize) < clients)
            .map(|(client, _, response)| Packet {
                from: Process::Server(server),
                to: Process::Client(client.0 as usize),
                body: Body::Response(response),
            });
        let n = self.servers.len();
        // A slot outside the group names nobody: the message goes nowhere.
        let sends = output
            .sends
            .into_iter()
            .filter(|(slot, _)| slot.index() < n)
            .map(|(slot, message)| Packet {
                from: Process::Server(server),
                to: Process::Server(slot.index()),
                body: Body::Message(message),
            });
        let attest = output.attest.into_iter().map(|attest| Packet {
            from: Process::Server(server),
            to: Process::Server(server),
            body: Body::Attest(attest),
        });
        self.enqueue(
            server,
            output.changes,
            reply.into_iter().chain(notify).chain(sends).chain(attest),
        );
    }

    /// Submits changes as one batch and queues `packets` behind it (see the module docs).
    fn enqueue(
        &mut self,
        server: usize,
        changes: Vec<P::Change>,
        packets: impl Iterator<Item = Packet<P>>,
    ) {
        let persist = self.rng.random_range(0..=self.swarm.persist_max);
        let slot = &mut self.servers[server];
        let at = (self.now + persist).max(slot.release_at);
        slot.release_at = at;
        let batch = slot.sequencer.submit();
        slot.storage.submit(batch, at, changes);
        if self.config.mutations.driver.send_before_durable {
            for packet in packets {
                self.emit(packet);
            }
        } else {
            for packet in packets {
                // Never ready at once: the batch just submitted is not durable yet.
                let ready = slot.sequencer.send(packet);
                debug_assert!(ready.is_none(), "a send overtook its batch");
            }
        }
        let slot = &self.servers[server];
        let incarnation = slot.incarnation;
        self.schedule(
            at - self.now,
            Event::Release {
                server,
                incarnation,
            },
        );
    }

    /// Completes every commit due by now, then sends what they were holding back.
    fn release(&mut self, server: usize, incarnation: u32) {
        let slot = &mut self.servers[server];
        if slot.incarnation != incarnation || slot.logic.is_none() {
            return;
        }
        let Some((batch, applied)) = slot.storage.commit_due(self.now) else {
            return;
        };
        slot.applied += applied;
        let released = slot.sequencer.durable(batch);
        for packet in released {
            self.emit(packet);
        }
    }

    /// What a server's changes held back, now on its way: a packet to the network, trusted-log
    /// calls to the server's own log.
    fn emit(&mut self, packet: Packet<P>) {
        match (packet.from, packet.body) {
            (Process::Server(server), Body::Attest(attest)) => self.attest(server, attest),
            (from, body) => self.transmit(Packet {
                from,
                to: packet.to,
                body,
            }),
        }
    }

    /// Makes a server's trusted-log calls and hands it the answers.
    fn attest(&mut self, server: usize, attest: Attest) {
        let now = self.now;
        let slot = &mut self.servers[server];
        let answers = match slot.trusted.as_mut() {
            Some(trusted) => trusted.call_all(&attest.calls),
            None => vec![Err(Refusal::Stopped(
                "this server has no trusted log".into(),
            ))],
        };
        self.stats.attested += answers.len() as u64;
        let Some(logic) = slot.logic.as_mut() else {
            return;
        };
        let handled = logic.on_attested(Time(now), attest.token, answers, P::view(&slot.storage));
        self.effects(server, handled, None, false);
    }

    fn tick(&mut self, server: usize) {
        let now = self.now;
        if let Some(logic) = self.servers[server].logic.as_mut() {
            let output = logic.on_tick(Time(now));
            if !output.changes.is_empty() {
                let changes = output.changes.len();
                self.log(|| format!("s{server} gc: {changes} changes"));
            }
            self.effects(server, output, None, false);
        }
        let interval = self.swarm.tick_millis.max(1);
        self.schedule(interval, Event::Tick { server });
    }

    // -----------------------------------------------------------------------------------------
    // Correct clients

    fn deliver_response(&mut self, client: usize, server: usize, response: P::Response) {
        if !self.clients[client].up {
            self.stats.to_crashed += 1;
            return;
        }
        self.stats.delivered += 1;
        if self.trace.is_some() {
            let description = P::describe_response(&response);
            self.log(|| format!("s{server} -> c{client} {description}"));
        }
        if self.clients[client].role == Role::Attacker {
            if let Some(attacker) = self.clients[client].attacker.as_mut() {
                attacker.heard(response);
            }
            return;
        }
        let node = Slot(server as u32);
        let Some(running) = self.clients[client].running.as_mut() else {
            return;
        };
        if running.op != P::response_op(&response) {
            return;
        }
        let key = running.key.clone();
        let protocol = &self.protocol;
        let wrote = |output: &_| protocol.wrote(client, &key, output);
        match running.machine.on_reply(node, response, wrote) {
            OpStep::Continue(sends) if sends.is_empty() => {}
            OpStep::Continue(sends) => self.next_round(client, sends),
            OpStep::Done(result) => self.completed(client, result),
        }
    }

    /// A new round begins: send it, unless the client crashes at this boundary, possibly in the
    /// middle of the broadcast (so, say, COMPLETE reaches a single server).
    fn next_round(&mut self, client: usize, mut sends: Vec<(Slot, P::Request)>) {
        if let Some((_, request)) = sends.first() {
            P::count_round(request, &mut self.stats);
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
                .map_or("nothing", |(_, request)| P::request_name(request));
            self.log(|| format!("c{client} crashes after sending {round} to {kept} servers"));
            self.send_requests(client, sends);
            self.crash_client(client);
            return;
        }
        self.send_requests(client, sends);
    }

    fn completed(&mut self, client: usize, result: Result<Finished, Ended>) {
        let Some(running) = self.clients[client].running.take() else {
            return;
        };
        match result {
            Ok(finished) => {
                let kind = if running.writes {
                    self.stats.writes_completed += 1;
                    "write"
                } else {
                    self.stats.reads_completed += 1;
                    "read"
                };
                self.stats.repairs += u64::from(finished.repaired);
                self.stats.one_round_reads += u64::from(finished.one_round);
                if running.writes {
                    self.stats.write_restarts += u64::from(finished.restarts);
                } else {
                    self.stats.read_restarts += u64::from(finished.restarts);
                }
                self.stats.evidence += finished.evidence.len() as u64;
                for (node, why) in &finished.evidence {
                    let blamed = node.index();
                    let honest = self
                        .servers
                        .get(blamed)
                        .is_none_or(|s| s.behaviour == Behaviour::Honest);
                    if honest && !self.config.mutations.any() {
                        self.other_violations.push(format!(
                            "client {client} blamed correct node {blamed} ({why}) in {kind} op {} at {}ms",
                            running.op.0, self.now
                        ));
                    }
                }
                let outcome = match &finished.read {
                    Some(value) => OpOutcome::Read(self.canonical_value(value.as_ref())),
                    None => OpOutcome::Ok,
                };
                let record = &mut self.history.ops[running.record];
                record.complete = Some(self.now);
                record.outcome = outcome;
                let Finished {
                    version,
                    repaired,
                    restarts,
                    ..
                } = finished;
                self.log(|| {
                    if running.writes {
                        format!("c{client} write op{} done ts={version}", running.op.0)
                    } else {
                        format!(
                            "c{client} read op{} done ts={version} repaired={repaired} restarts={restarts}",
                            running.op.0
                        )
                    }
                });
            }
            Err(Ended::Failed(error)) => self.failed(client, running.op, error),
            Err(Ended::Unknown(why)) => {
                self.stats.unknown += 1;
                self.log(|| format!("c{client} op{} outcome unknown: {why}", running.op.0));
            }
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
            && self.rng.random_bool(self.swarm.write_ratio)
            && self.protocol.may_write(client, &key);
        let incarnation = self.clients[client].incarnation;
        let history_client = client as u64 * 1_000 + u64::from(incarnation);
        let (mut machine, kind) = if writes {
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
            let write =
                self.protocol
                    .write(client, key.clone(), op, value, self.now, &mut self.rng);
            (ClientOp::Write(write), kind)
        } else {
            (
                ClientOp::Read(self.protocol.read(client, key.clone(), op)),
                OpKind::Read,
            )
        };
        let sends = machine.start();
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
            key,
            writes,
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
        let value = Bytes::from(value_of(id, len));
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
        Some(unwritten_name(value))
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
        let Some(running) = self.clients[client].running.as_mut().filter(|r| r.op == op) else {
            return;
        };
        let sends = running.machine.on_timeout();
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
        self.protocol.client_crashed(client);
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
        let op = OpId(self.next_op);
        self.next_op += 1;
        let sends = match self.clients[client].attacker.as_mut() {
            Some(attacker) => attacker.attack(&key, op, &mut self.rng),
            None => return,
        };
        self.stats.attacks += 1;
        for (server, request) in sends {
            self.transmit(Packet::to_server(client, server, request));
        }
        let pause = self.rng.random_range(5..=150);
        self.schedule(pause, Event::Attack { client });
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
        let lost = slot.storage.crash();
        slot.logic = None;
        slot.timers.clear();
        slot.sequencer = Sequencer::default();
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
        slot.logic = Some(self.protocol.restore(server, &slot.storage.durable, now));
        let versions = P::disk_versions(&slot.storage.durable);
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
        self.stats.durable_changes = self.servers.iter().map(|s| s.applied).sum();
        let correct: Vec<Option<&P::Server>> = self
            .servers
            .iter()
            .map(|s| {
                s.logic
                    .as_ref()
                    .filter(|_| s.behaviour == Behaviour::Honest)
            })
            .collect();
        let report = self.protocol.check(&self.history, &correct);
        Outcome {
            history: self.history,
            report,
            liveness_violations: self.liveness_violations,
            other_violations: self.other_violations,
            stats: self.stats,
            trace: self.trace.unwrap_or_default(),
        }
    }
}

/// The history's name for the value of write `id`.
fn value_name(id: u64) -> Vec<u8> {
    format!("w{id}").into_bytes()
}

/// The value of write `id`, `len` bytes long: the id, then deterministic filler.
fn value_of(id: u64, len: usize) -> Vec<u8> {
    let mut value = id.to_be_bytes().to_vec();
    value.extend((8..len).map(|i| (i as u64 ^ id.wrapping_mul(0x9e37)) as u8));
    value
}

/// The history's name of `value` (`w<id>`) if it is a value the world's writes make, for
/// checkers that read values out of servers' state rather than clients' answers.
pub(crate) fn history_name(value: &[u8]) -> Option<Vec<u8>> {
    let id = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    (value_of(id, value.len()) == value).then(|| value_name(id))
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

fn describe_packet<P: Protocol>(packet: &Packet<P>) -> String {
    let description = match &packet.body {
        Body::Request(request) => P::describe_request(request),
        Body::Response(response) => P::describe_response(response),
        Body::Message(message) => P::describe_message(message),
        Body::Attest(attest) => format!("{} trusted-log calls", attest.calls.len()),
    };
    format!("{} -> {} {description}", packet.from, packet.to)
}

/// How the history names a value read that no client of the workload wrote (a services' own
/// values, such as content-hash objects, or a corrupted one): its first bytes and its length.
pub(in crate::sim) fn unwritten_name(value: &[u8]) -> Vec<u8> {
    let prefix: String = value.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("unwritten:{prefix}..:{}B", value.len()).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_cuts_its_servers_from_its_clients_and_from_the_other_servers() {
        let partition = Partition {
            id: 0,
            servers: vec![true, false, false],
            clients: vec![true, false],
        };
        let (s, c) = (Process::Server, Process::Client);
        assert!(partition.cuts(s(0), c(0)) && partition.cuts(c(0), s(0)));
        assert!(
            !partition.cuts(s(0), c(1)),
            "a client outside the partition still reaches it"
        );
        assert!(!partition.cuts(s(1), c(0)));
        assert!(partition.cuts(s(0), s(1)) && partition.cuts(s(2), s(0)));
        assert!(!partition.cuts(s(1), s(2)), "servers on the same side talk");
    }
}
