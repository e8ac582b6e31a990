//! A service with node-to-node traffic and timers, written for this test, run in the same world
//! as the storage protocols: the world must carry replicas' messages to their peers through the
//! faulty network, fire their timers, kill timers with a crash, and hold every message until
//! what the replica changed before it is durable.
//!
//! The service: a client adds a value at one replica, which persists it and then acknowledges;
//! every replica periodically (a timer it re-arms) sends every value it knows to its peers, which
//! persist what they learn; a read asks one replica for the value it learned last. Its checker:
//! every value acknowledged to a client is known by every correct replica once the network has
//! healed and the service has settled (convergence), and no read returns a value nobody wrote.
//! A replica that acknowledges values it keeps only in memory must be caught.

use bulwark_core::{ClientId, Key, ServiceId, Slot, Time};
use bulwark_protocol::machine::{
    Access, Operation, Output, Progress, Replica, ReplicaStats, TimerId,
};
use bulwark_protocol::round::OpId;
use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::checker::{History, OpKind, Outcome, Report, Violation};
use bulwark_sim::sim::config::{FaultSet, Nemesis, SimConfig};
use bulwark_sim::sim::protocol::{Finish, Finished, Protocol, Storage};
use bulwark_sim::sim::swarm::Swarm;
use bulwark_sim::sim::{first_failure_service, sweep_service};
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

const GOSSIP: TimerId = TimerId(1);
const GOSSIP_EVERY_MILLIS: u64 = 40;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Request {
    /// `None` (what the world's deletes become) adds nothing but is acknowledged.
    Add {
        op: u64,
        value: Option<Bytes>,
    },
    Latest {
        op: u64,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Reply {
    Added { op: u64 },
    Latest { op: u64, value: Option<Bytes> },
}

/// Everything the sender knows.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Rumour(Vec<Bytes>);

/// A value learned, to make durable.
struct Learned(Bytes);

/// One replica. `PERSISTS = false` is the broken variant: it keeps what it learns in memory
/// only, so it acknowledges values a crash can take back.
struct GossipReplica<const PERSISTS: bool> {
    slot: Slot,
    n: usize,
    known: BTreeSet<Bytes>,
    latest: Option<Bytes>,
    /// Whether its gossip timer runs; a restarted replica has none until its first tick.
    armed: bool,
}

impl<const PERSISTS: bool> GossipReplica<PERSISTS> {
    fn new(slot: Slot, n: usize, known: BTreeSet<Bytes>) -> Self {
        GossipReplica {
            slot,
            n,
            known,
            latest: None,
            armed: false,
        }
    }

    /// Learns `values`; the changes that make the new ones durable.
    fn learn(&mut self, values: impl IntoIterator<Item = Bytes>) -> Vec<Learned> {
        let mut changes = Vec::new();
        for value in values {
            if self.known.insert(value.clone()) {
                self.latest = Some(value.clone());
                if PERSISTS {
                    changes.push(Learned(value));
                }
            }
        }
        changes
    }
}

impl<const PERSISTS: bool> Replica for GossipReplica<PERSISTS> {
    const SERVICE: ServiceId = ServiceId(1_000);
    type Request = Request;
    type Reply = Reply;
    type Message = Rumour;
    type Change = Learned;
    type View = ();

    fn on_request(
        &mut self,
        _now: Time,
        _client: ClientId,
        access: Access,
        request: Request,
        _view: &(),
    ) -> Output<Self> {
        match request {
            Request::Add { op, value } if access.write => {
                let changes = self.learn(value);
                Output::reply(changes, Reply::Added { op })
            }
            Request::Add { .. } => Output {
                refused: Some("not a writer".to_string()),
                ..Output::none()
            },
            Request::Latest { op } => Output::reply(
                Vec::new(),
                Reply::Latest {
                    op,
                    value: self.latest.clone(),
                },
            ),
        }
    }

    fn on_message(&mut self, _now: Time, _from: Slot, rumour: Rumour, _view: &()) -> Output<Self> {
        Output {
            changes: self.learn(rumour.0),
            ..Output::none()
        }
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, _view: &()) -> Output<Self> {
        if timer != GOSSIP {
            return Output::none();
        }
        let rumour: Vec<Bytes> = self.known.iter().cloned().collect();
        let sends = (0..self.n as u32)
            .map(Slot)
            .filter(|peer| *peer != self.slot)
            .map(|peer| (peer, Rumour(rumour.clone())))
            .collect();
        Output {
            sends,
            timers: vec![(GOSSIP, Time(now.0 + GOSSIP_EVERY_MILLIS))],
            ..Output::none()
        }
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        if self.armed {
            return Output::none();
        }
        self.armed = true;
        Output {
            timers: vec![(GOSSIP, Time(now.0 + GOSSIP_EVERY_MILLIS))],
            ..Output::none()
        }
    }

    fn stats(&self) -> ReplicaStats {
        ReplicaStats {
            keys: self.known.len() as u64,
            ..ReplicaStats::default()
        }
    }
}

/// Adds a value at one replica, retrying there until it acknowledges.
struct Add {
    op: u64,
    at: Slot,
    value: Option<Bytes>,
}

impl Operation for Add {
    const SERVICE: ServiceId = ServiceId(1_000);
    type Request = Request;
    type Reply = Reply;
    type Output = Added;

    fn op(&self) -> u64 {
        self.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.on_timeout()
    }

    fn on_reply(&mut self, from: Slot, reply: Reply) -> Progress<Self> {
        match reply {
            Reply::Added { op } if op == self.op && from == self.at => Progress::Done(Ok(Added)),
            _ => Progress::Send(Vec::new()),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let request = Request::Add {
            op: self.op,
            value: self.value.clone(),
        };
        vec![(self.at, request)]
    }

    fn answered(&self) -> Vec<Slot> {
        Vec::new()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// Asks one replica for the value it learned last.
struct Latest {
    op: u64,
    at: Slot,
}

impl Operation for Latest {
    const SERVICE: ServiceId = ServiceId(1_000);
    type Request = Request;
    type Reply = Reply;
    type Output = LatestValue;

    fn op(&self) -> u64 {
        self.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.on_timeout()
    }

    fn on_reply(&mut self, from: Slot, reply: Reply) -> Progress<Self> {
        match reply {
            Reply::Latest { op, value } if op == self.op && from == self.at => {
                Progress::Done(Ok(LatestValue(value)))
            }
            Reply::Added { .. } | Reply::Latest { .. } => Progress::Send(Vec::new()),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        vec![(self.at, Request::Latest { op: self.op })]
    }

    fn answered(&self) -> Vec<Slot> {
        Vec::new()
    }

    fn quorum(&self) -> usize {
        1
    }
}

struct Added;
struct LatestValue(Option<Bytes>);

impl Finish for Added {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: String::new(),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

impl Finish for LatestValue {
    fn finish(self) -> Finished {
        Finished {
            read: Some(self.0),
            version: String::new(),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

/// The service in the world: `2f+1` replicas that crash but never lie.
struct Gossip<const PERSISTS: bool> {
    n: usize,
}

impl<const PERSISTS: bool> Protocol for Gossip<PERSISTS> {
    type Request = Request;
    type Response = Reply;
    type Change = Learned;
    type Disk = BTreeSet<Bytes>;
    type Server = GossipReplica<PERSISTS>;
    type Write = Add;
    type Read = Latest;

    /// Long enough for many gossip rounds over the calm network of the liveness phase.
    const SETTLE_MILLIS: u64 = 1_000;

    fn nodes(f: usize) -> usize {
        2 * f + 1
    }

    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.clear();
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(_rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Self {
        Gossip {
            n: Self::nodes(config.f),
        }
    }

    fn server(&self, index: usize, _behaviour: Behaviour, _seed: u64) -> GossipReplica<PERSISTS> {
        GossipReplica::new(Slot(index as u32), self.n, BTreeSet::new())
    }

    fn restore(&self, index: usize, disk: &BTreeSet<Bytes>, _now: u64) -> GossipReplica<PERSISTS> {
        GossipReplica::new(Slot(index as u32), self.n, disk.clone())
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut BTreeSet<Bytes>, change: &Learned) {
        disk.insert(change.0.clone());
    }

    fn disk_versions(disk: &BTreeSet<Bytes>) -> usize {
        disk.len()
    }

    fn write(
        &self,
        _client: usize,
        _key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        rng: &mut ChaCha8Rng,
    ) -> Add {
        Add {
            op: op.0,
            at: Slot(rng.random_range(0..self.n as u32)),
            value,
        }
    }

    fn read(&self, _client: usize, _key: Key, op: OpId) -> Latest {
        Latest {
            op: op.0,
            at: Slot((op.0 % self.n as u64) as u32),
        }
    }

    fn response_op(reply: &Reply) -> OpId {
        match reply {
            Reply::Added { op } | Reply::Latest { op, .. } => OpId(*op),
        }
    }

    fn request_name(request: &Request) -> &'static str {
        match request {
            Request::Add { .. } => "add",
            Request::Latest { .. } => "latest",
        }
    }

    fn request_kind(request: &Request) -> usize {
        match request {
            Request::Add { .. } => 1,
            Request::Latest { .. } => 3,
        }
    }

    fn describe_request(request: &Request) -> String {
        match request {
            Request::Add { op, value } => {
                format!(
                    "add {} op{op}",
                    value.as_ref().map_or("nothing".into(), name)
                )
            }
            Request::Latest { op } => format!("latest op{op}"),
        }
    }

    fn describe_response(reply: &Reply) -> String {
        match reply {
            Reply::Added { op } => format!("added op{op}"),
            Reply::Latest { op, value } => {
                format!(
                    "latest {} op{op}",
                    value.as_ref().map_or("none".into(), name)
                )
            }
        }
    }

    fn describe_message(rumour: &Rumour) -> String {
        format!("rumour of {} values", rumour.0.len())
    }

    fn check(&self, history: &History, servers: &[Option<&GossipReplica<PERSISTS>>]) -> Report {
        let mut violations = Vec::new();
        let mut violation = |explanation: String| {
            violations.push(Violation {
                key: b"gossip".to_vec(),
                explanation,
                conflicting: Vec::new(),
            })
        };
        for op in &history.ops {
            match (&op.kind, &op.outcome) {
                (OpKind::Read, Outcome::Read(Some(value))) if value.starts_with(b"unwritten") => {
                    violation(format!(
                        "a read at {}ms returned {}, which nobody wrote",
                        op.invoke,
                        String::from_utf8_lossy(value)
                    ));
                }
                (OpKind::Write(Some(value)), Outcome::Ok) => {
                    let value = String::from_utf8_lossy(value).into_owned();
                    for (index, server) in servers.iter().enumerate() {
                        let Some(server) = server else {
                            violation(format!("replica {index} is not up at the end"));
                            continue;
                        };
                        if !server.known.iter().any(|known| name(known) == value) {
                            violation(format!(
                                "{value}, acknowledged at {}ms, never reached replica {index}",
                                op.complete.unwrap_or_default()
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        Report {
            ok: violations.is_empty(),
            ops_checked: history.ops.len(),
            keys_checked: 1,
            violations,
            ..Report::default()
        }
    }
}

/// The history's name for a value: the world starts every value with its write id.
fn name(value: &Bytes) -> String {
    match value.get(..8).and_then(|id| <[u8; 8]>::try_from(id).ok()) {
        Some(id) => format!("w{}", u64::from_be_bytes(id)),
        None => format!("{value:?}"),
    }
}

fn config() -> SimConfig {
    SimConfig {
        f: 1,
        faults: "partitions,crashes,loss,duplication,reordering,client-crashes"
            .parse()
            .unwrap(),
        ..SimConfig::default()
    }
}

#[test]
fn gossip_converges_under_partitions_crashes_and_loss() {
    for f in [1, 2] {
        let config = SimConfig { f, ..config() };
        let summary = sweep_service::<Gossip<true>>(0..300, &config, 2);
        println!(
            "gossip f={f}: {} seeds in {:.1?}, {} operations checked",
            summary.seeds_run, summary.elapsed, summary.ops_checked
        );
        assert!(summary.violations.is_empty(), "{}", summary.render(&config));
        assert!(summary.ops_checked > 300 * 50, "{}", summary.ops_checked);
    }
}

#[test]
fn replicas_talk_to_each_other_through_the_faulty_network() {
    let traced = SimConfig {
        trace: true,
        ..config()
    };
    // The first seed whose run lost peer messages, cut some by a partition and crashed a replica.
    let result = (0..200)
        .map(|seed| bulwark_sim::sim::run_service::<Gossip<true>>(seed, &traced))
        .find(|r| {
            r.stats.partitioned > 0
                && r.stats.server_crashes > 0
                && r.trace.iter().any(|line| peer_message(line, "lost "))
        })
        .expect("some seed has loss, partitions and crashes");
    assert!(result.passed(), "{}", result.render());
    let gossip = result.trace.iter().filter(|l| peer_message(l, "")).count();
    assert!(gossip > 100, "peers gossiped only {gossip} times");
    // A restarted replica has no timer until its first tick re-arms one: it must gossip again.
    let restart = result
        .trace
        .iter()
        .position(|line| line.contains(" restarted with "))
        .expect("a crashed replica restarts");
    let replica = result.trace[restart]
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(
        result.trace[restart..]
            .iter()
            .any(|line| peer_message(line, &format!("{replica} -> s"))),
        "{replica} never gossiped after its restart"
    );
}

/// Whether a trace line is a rumour between replicas whose event starts with `prefix`.
fn peer_message(line: &str, prefix: &str) -> bool {
    line.split_once("ms ")
        .and_then(|(_, event)| event.strip_prefix(prefix))
        .is_some_and(|rest| rest.contains("rumour of"))
}

#[test]
fn acknowledging_before_persisting_is_caught() {
    let config = config();
    let caught = first_failure_service::<Gossip<false>>(0..200, &config, 2);
    let (seed, why) = caught
        .failure
        .expect("a replica that acks values it never persists must be caught within 200 seeds");
    println!(
        "volatile gossip caught at seed {seed} after {} seeds: {why}",
        caught.seeds_run
    );
    assert!(
        why.contains("never reached") || why.contains("nobody wrote"),
        "{why}"
    );
}
