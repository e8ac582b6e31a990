//! Depot's causal volumes under simulation: servers and clients (all of them Depot nodes) in one
//! seeded world with loss, duplication, delay, partitions and crashes with restart from disk,
//! writers that fork, servers that tamper, withhold, reorder and fork their own updates, and a
//! checker of fork-join-causal consistency (Depot Appendix A) that knows every update anyone
//! signed.
//!
//! The register world (`sim::world`) drives stateless client operations against replica groups;
//! Depot's clients are nodes with logs of their own that exchange with any member, so they get a
//! world of their own here, driving the same [`Node`] the real node will. What it checks, at every
//! operation of a correct node (judged when its result is delivered, after what it depends on is
//! durable):
//! - the node's accepted set is causally closed: every update it holds, it holds everything that
//!   update names (dependencies strictly first), and it holds nothing nobody signed;
//! - a read returns exactly the authorised updates to its key in that set that no other in it
//!   supersedes (FJC condition 2), with each value the writer wrote;
//! - a read holds every durable write of another correct client older than the staleness bound
//!   (beacons, §6.4), or names that client among those it suspects;
//! - a write depends on everything its writer had accepted (serial order at a correct node);
//! - a correct node's accepted set never shrinks between its operations, crashes included;
//!
//! and at the end, after the network heals and everyone gossips for a while: every correct node
//! holds the same updates, among them every update a correct node wrote and both branches of
//! every fork; every correct node holds a proof against each writer that forked where it holds
//! both branches, and none against a correct writer; every correct server holds the value of
//! every correct writer's update.

use bulwark_core::Key;
use bulwark_core::sign::{SecretKey, Signed, Unverified};
use bulwark_protocol::depot::discard::{Discard, Ladder};
use bulwark_protocol::depot::update::{is_reserved, value_hash};
use bulwark_protocol::depot::{
    Member, Message, Mutations, Node, Output, ReadResult, ReadStart, Role, Staleness, Update,
    UpdateId, ValueRef, VolumeConfig, VolumeId, WireUpdate, Writer,
};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What a member does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Follows the protocol (and may crash and restart).
    Correct,
    /// A client that sometimes signs a second update after the same previous one and hands it
    /// to another server (an equivocating writer, T2).
    Forker,
    /// A server that corrupts, withholds, reorders and invents what it passes on, never
    /// acknowledges some puts, and writes and forks updates of its own it has no right to (T6,
    /// T7, T19).
    Tamperer,
    /// A client that never proposes a discard and never consents to one: it delays discard for
    /// everyone (T16).
    Refuser,
    /// A client that proposes to discard what the backup ladder keeps (current versions and
    /// recent ones among older ones) and consents to every proposal (T16).
    Hastener,
}

/// One run's shape, drawn from its seed.
#[derive(Clone, Debug)]
pub struct DepotConfig {
    /// Servers, then clients, in member order.
    pub kinds: Vec<Kind>,
    /// How many of the members are servers (the first ones).
    pub servers: usize,
    /// Operations per correct or forking client.
    pub ops_per_client: usize,
    /// Correct nodes crash and restart.
    pub crashes: bool,
    /// The network splits in two now and then.
    pub partitions: bool,
    /// Per-mille of messages lost.
    pub loss_per_mille: u32,
    /// Every server is down from the start until this many milliseconds in (T9, a cloud
    /// disaster): clients write, read and exchange among themselves meanwhile.
    pub servers_down_until: Option<u64>,
    /// Clients propose and consent to discards (§6.6) by a ladder of seconds instead of days.
    pub discard: bool,
    /// Servers keep the bytes of at most this many bytes of values in memory and read the rest
    /// back from their simulated disk, as nodes do (`None`: every value in memory).
    pub resident_values: Option<u64>,
    /// Rules broken on purpose in every correct node (negative controls).
    pub mutations: Mutations,
}

impl DepotConfig {
    /// A run drawn from `seed`: 2-4 servers of which up to all but one tamper, 3-6 clients of
    /// which up to two fork, crashes, partitions and loss or not; in half the runs, discard, with
    /// one client refusing or hastening it in half of those.
    pub fn from_seed(seed: u64, mutations: Mutations) -> DepotConfig {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xde90);
        let servers = rng.random_range(2..=4);
        let clients = rng.random_range(3..=6);
        let tamperers = rng.random_range(0..servers);
        let forkers = rng.random_range(0..=2usize).min(clients - 2);
        let mut kinds = Vec::new();
        for i in 0..servers {
            kinds.push(if i >= servers - tamperers {
                Kind::Tamperer
            } else {
                Kind::Correct
            });
        }
        for i in 0..clients {
            kinds.push(if i < forkers {
                Kind::Forker
            } else {
                Kind::Correct
            });
        }
        let ops_per_client = rng.random_range(10..=30);
        let crashes = rng.random_bool(0.5);
        let partitions = rng.random_bool(0.5);
        let loss_per_mille = if rng.random_bool(0.5) { 50 } else { 0 };
        let discard = rng.random_bool(0.5);
        // The last client is correct (at most all but two fork): one correct client stays.
        match rng.random_range(0..4) {
            0 if discard => kinds[servers + clients - 1] = Kind::Refuser,
            1 if discard => kinds[servers + clients - 1] = Kind::Hastener,
            _ => {}
        }
        DepotConfig {
            kinds,
            servers,
            ops_per_client,
            crashes,
            partitions,
            loss_per_mille,
            servers_down_until: None,
            discard,
            // Drawn from the seed alone, not the run's generator: a correct node behaves alike
            // either way, so the schedules of every seed stay as they were.
            resident_values: (!seed.is_multiple_of(4)).then_some(RESIDENT_VALUE_BYTES),
            mutations,
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct DepotRun {
    /// Every broken property, in words; empty when the run is correct.
    pub violations: Vec<String>,
    /// Updates anyone signed.
    pub updates: usize,
    /// Reads of correct clients delivered.
    pub reads: usize,
    /// Of them, reads that returned more than one version.
    pub concurrent_reads: usize,
    /// Writers proven to have forked, at the end, at correct nodes.
    pub forks_proven: usize,
    /// Forks that happened (a second update after one previous update reached a correct node).
    pub forks: usize,
    /// Updates refused by correct nodes.
    pub refused: u64,
    /// Fast-path answers by correct servers.
    pub fast_gets: u64,
    /// Slow-path answers by correct servers.
    pub slow_gets: u64,
    /// Crashes of correct nodes.
    pub crashes: usize,
    /// Values correct nodes dropped by every client's consent, at the end, added up.
    pub discarded: usize,
    /// Discard proposals that list what the ladder keeps (a hastening client's).
    pub premature_proposals: usize,
    /// Of the discards, those of a value several versions name (equal bytes written again).
    pub shared_discarded: usize,
    /// Proposals a correct client knows at the end that wait for a refusing client's consent:
    /// what its administrator is shown.
    pub awaiting_refuser: usize,
    /// Events the world ran.
    pub events: u64,
}

/// Everything anyone signed: the checker's ground truth.
#[derive(Default)]
struct Truth {
    updates: HashMap<UpdateId, Signedness>,
    /// Discard proposals anyone signed: proposer and listed updates, by proposal.
    proposals: HashMap<UpdateId, (Writer, Vec<UpdateId>)>,
    /// Consents anyone signed, by the proposal they name.
    consents: HashMap<UpdateId, BTreeSet<Writer>>,
    /// The updates that name each update: the way from a version to those that supersede it.
    named_by: HashMap<UpdateId, Vec<UpdateId>>,
}

struct Signedness {
    writer: Writer,
    key: Key,
    prev: Option<UpdateId>,
    named: Vec<UpdateId>,
    value: Option<Bytes>,
    authorised: bool,
    /// When it was signed, in the world's microseconds.
    at: u64,
}

impl Truth {
    fn record(&mut self, config: &VolumeConfig, update: &Update, value: Option<Bytes>, at: u64) {
        let body = update.body();
        if !self.updates.contains_key(&update.id()) {
            for named in body.prev.iter().chain(body.deps.iter().map(|d| &d.id)) {
                self.named_by.entry(*named).or_default().push(update.id());
            }
        }
        self.updates
            .entry(update.id())
            .or_insert_with(|| Signedness {
                writer: body.writer,
                key: body.key.clone(),
                prev: body.prev,
                named: body
                    .prev
                    .into_iter()
                    .chain(body.deps.iter().map(|d| d.id))
                    .collect(),
                value,
                authorised: config.may_write(body.writer, &body.key),
                at,
            });
    }

    /// Records a discard proposal or consent `update` carries.
    fn record_discard(&mut self, update: &Update, discard: &Discard) {
        let writer = update.body().writer;
        match discard {
            Discard::Propose { ids, .. } => {
                self.proposals.insert(update.id(), (writer, ids.clone()));
            }
            Discard::Consent(proposal) => {
                self.consents.entry(*proposal).or_default().insert(writer);
            }
        }
    }

    /// The authorised updates of `update`'s key that depend on it: the versions that supersede
    /// it, in id order.
    fn superseders(&self, update: &UpdateId) -> Vec<UpdateId> {
        let Some(u) = self.updates.get(update) else {
            return Vec::new();
        };
        let mut seen = BTreeSet::new();
        let mut stack: Vec<UpdateId> = self.named_by.get(update).cloned().unwrap_or_default();
        while let Some(next) = stack.pop() {
            if seen.insert(next) {
                stack.extend(self.named_by.get(&next).into_iter().flatten().copied());
            }
        }
        seen.into_iter()
            .filter(|id| {
                self.updates
                    .get(id)
                    .is_some_and(|later| later.authorised && later.key == u.key)
            })
            .collect()
    }

    /// Whether a version superseding `update` was signed at least `keep` before `now`.
    fn superseded_before(&self, update: &UpdateId, now: u64, keep: u64) -> bool {
        self.superseders(update).iter().any(|id| {
            self.updates
                .get(id)
                .is_some_and(|later| later.at.saturating_add(keep) <= now)
        })
    }

    /// Every update `id` depends on, itself excluded.
    fn past(&self, id: &UpdateId) -> BTreeSet<UpdateId> {
        let mut past = BTreeSet::new();
        let mut stack: Vec<UpdateId> = self
            .updates
            .get(id)
            .map(|u| u.named.clone())
            .unwrap_or_default();
        while let Some(next) = stack.pop() {
            if past.insert(next)
                && let Some(u) = self.updates.get(&next)
            {
                stack.extend(u.named.iter().copied());
            }
        }
        past
    }

    /// What a read of `key` must return from `set`: its authorised updates to `key` that no
    /// other such update in `set` depends on.
    fn heads(&self, set: &BTreeSet<UpdateId>, key: &Key) -> BTreeSet<UpdateId> {
        let candidates: Vec<UpdateId> = set
            .iter()
            .copied()
            .filter(|id| {
                self.updates
                    .get(id)
                    .is_some_and(|u| u.authorised && &u.key == key)
            })
            .collect();
        let mut superseded = BTreeSet::new();
        for c in &candidates {
            let past = self.past(c);
            superseded.extend(candidates.iter().copied().filter(|d| past.contains(d)));
        }
        candidates
            .into_iter()
            .filter(|c| !superseded.contains(c))
            .collect()
    }

    /// Violations of causal closure in `set`.
    fn closure(&self, set: &BTreeSet<UpdateId>) -> Option<String> {
        for id in set {
            let Some(u) = self.updates.get(id) else {
                return Some(format!("holds {id:?}, which nobody signed"));
            };
            if let Some(missing) = u.named.iter().find(|d| !set.contains(d)) {
                return Some(format!(
                    "holds {id:?} by {:?} without {missing:?}, which it depends on",
                    u.writer
                ));
            }
        }
        None
    }
}

/// The bytes of values a simulated server keeps in memory when bounded: a few of the swarm's
/// values, so that nearly every value a server serves is read back from its disk.
pub const RESIDENT_VALUE_BYTES: u64 = 64;

/// A simulated node's disk as its node reads values back: the batches on their way first, then
/// what is durable.
struct SimStore<'a> {
    committing: &'a [(u64, Vec<bulwark_protocol::depot::Change>)],
    stored: &'a HashMap<bulwark_core::Digest, Bytes>,
}

impl bulwark_protocol::depot::Values for SimStore<'_> {
    fn value(&self, hash: &bulwark_core::Digest) -> Option<Bytes> {
        use bulwark_protocol::depot::Change;
        // The newest record of `hash` decides: a value written again after its discard is back.
        for (_, changes) in self.committing.iter().rev() {
            for change in changes.iter().rev() {
                match change {
                    Change::Value(value) if value_hash(value) == *hash => {
                        return Some(value.clone());
                    }
                    Change::Discard(gone) if gone == hash => return None,
                    _ => {}
                }
            }
        }
        self.stored.get(hash).cloned()
    }
}

/// What waits for a batch of changes to be durable.
enum Held {
    Send(Writer, Message),
    /// A judged operation: its node's accepted set when it ran, and what was wrong with it.
    Op {
        snapshot: BTreeSet<UpdateId>,
        violations: Vec<String>,
        /// The update a write made, and when: durable once this is released.
        wrote: Option<(UpdateId, u64)>,
        /// The operation, for the history the FJC checker judges once it completes.
        op: crate::fjc::Op<UpdateId>,
    },
}

struct Proc {
    kind: Kind,
    node: Node,
    secret: SecretKey,
    up: bool,
    incarnation: u64,
    disk: Vec<bulwark_protocol::depot::Change>,
    /// The values on `disk`, by hash.
    stored: HashMap<bulwark_core::Digest, Bytes>,
    /// Batches on their way to the disk, oldest first.
    committing: Vec<(u64, Vec<bulwark_protocol::depot::Change>)>,
    batches: u64,
    held: Vec<(u64, Held)>,
    /// The accepted set at its last delivered operation.
    observed: BTreeSet<UpdateId>,
    primary: usize,
    next_op: u64,
    open_writes: BTreeMap<u64, (UpdateId, usize)>,
    open_reads: BTreeSet<u64>,
    ops_left: usize,
}

#[derive(Debug)]
enum Event {
    Deliver {
        to: usize,
        from: usize,
        message: Message,
    },
    Commit {
        node: usize,
        incarnation: u64,
        batch: u64,
    },
    Gossip(usize),
    Op(usize),
    PutRetry {
        client: usize,
        incarnation: u64,
        op: u64,
    },
    ReadTimeout {
        client: usize,
        incarnation: u64,
        op: u64,
    },
    Beacon(usize),
    /// A client looks at discard (§6.6): consents, proposes, or refuses.
    Discard(usize),
    Crash(usize),
    Restart(usize),
    Split,
    Heal,
}

/// Within this many milliseconds of the start, clients make their operations and faults strike.
const BUSY_MILLIS: u64 = 3_000;

/// Between two beacons of a client.
const ANNOUNCE_MILLIS: u64 = 100;

/// How long the world keeps gossiping after the last operation before it is judged.
const SETTLE_MILLIS: u64 = 30_000;

/// More events than this in one run is a message storm: nodes answering each other forever.
const EVENTS_MAX: u64 = 1_000_000;

/// The bytes some writes of runs with discard share.
const SHARED_BYTES: &[u8] = b"the same bytes, written again";

/// Clients stop looking at discard this long after the operations, so that what they wrote last
/// still reaches everyone before the world is judged.
const DISCARD_UNTIL_MILLIS: u64 = BUSY_MILLIS + 15_000;

/// The backup ladder of runs with discard: every version for 400 ms, no rungs, a turn a second,
/// so that a run's seconds see versions let go and proposers take turns.
fn sim_ladder() -> Ladder {
    Ladder {
        keep_all_micros: 400_000,
        rungs: Vec::new(),
        turn_micros: 1_000_000,
    }
}

struct World {
    config: Arc<VolumeConfig>,
    shape: DepotConfig,
    rng: ChaCha8Rng,
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    procs: Vec<Proc>,
    side: Vec<bool>,
    truth: Truth,
    run: DepotRun,
    settling: bool,
    /// Writes of correct nodes that became durable: every one must reach every correct node.
    written: BTreeSet<UpdateId>,
    /// The same writes with their writers and the times they were made, for bounded staleness.
    written_at: Vec<(UpdateId, usize, u64)>,
    /// Each correct node's completed operations, in order: the history judged for FJC.
    history: BTreeMap<u32, Vec<crate::fjc::Op<UpdateId>>>,
    /// When the run is judged.
    end: u64,
    /// When each correct node first accepted each update, in its microseconds: where its ladder
    /// starts counting a superseded version's age.
    accepted_at: HashMap<(usize, UpdateId), u64>,
}

fn key(text: String) -> Key {
    Key::new(Bytes::from(text)).unwrap_or_else(|e| unreachable!("short keys are valid: {e}"))
}

/// An update like `update` with another value, signed by the same writer: a fork.
fn twin(update: &Update, secret: &SecretKey, value: &Bytes) -> Update {
    let mut body = update.body().clone();
    body.value = Some(ValueRef {
        hash: value_hash(value),
        len: value.len() as u64,
    });
    Update::new(Signed::sign(secret, body).unwrap_or_else(|e| unreachable!("fits: {e}")))
}

impl World {
    fn new(seed: u64, shape: DepotConfig) -> World {
        let secrets: Vec<SecretKey> = (0..shape.kinds.len())
            .map(|i| {
                let mut bytes = [0u8; 32];
                bytes[..8].copy_from_slice(&seed.to_le_bytes());
                bytes[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                SecretKey::from_seed(&bytes)
            })
            .collect();
        let members = secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| Member {
                key: secret.public_key(),
                role: if i < shape.servers {
                    Role::Server
                } else {
                    Role::Client
                },
                writes: if i < shape.servers {
                    Vec::new()
                } else {
                    vec![format!("c{i}/").into_bytes(), b"shared/".to_vec()]
                },
            })
            .collect();
        let config = Arc::new(VolumeConfig {
            volume: VolumeId(seed),
            label: "sim".into(),
            members,
            staleness: Staleness {
                announce_ms: ANNOUNCE_MILLIS,
                propagate_ms: 100,
            },
        });
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let procs = secrets
            .into_iter()
            .enumerate()
            .map(|(i, secret)| {
                let mut node = Node::new(config.clone(), Writer(i as u32), secret.clone());
                if shape.kinds[i] == Kind::Correct {
                    node.mutate(shape.mutations);
                }
                if shape.discard {
                    node.set_ladder(sim_ladder());
                }
                if let Some(bytes) = shape.resident_values.filter(|_| i < shape.servers) {
                    node.bound_resident_values(bytes);
                }
                Proc {
                    kind: shape.kinds[i],
                    node,
                    secret,
                    up: true,
                    incarnation: 0,
                    disk: Vec::new(),
                    stored: HashMap::new(),
                    committing: Vec::new(),
                    batches: 0,
                    held: Vec::new(),
                    observed: BTreeSet::new(),
                    primary: rng.random_range(0..shape.servers),
                    next_op: 1,
                    open_writes: BTreeMap::new(),
                    open_reads: BTreeSet::new(),
                    ops_left: if i < shape.servers {
                        0
                    } else {
                        shape.ops_per_client
                    },
                }
            })
            .collect();
        let n = shape.kinds.len();
        World {
            config,
            rng,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            procs,
            side: vec![false; n],
            truth: Truth::default(),
            run: DepotRun::default(),
            settling: false,
            written: BTreeSet::new(),
            written_at: Vec::new(),
            history: BTreeMap::new(),
            end: BUSY_MILLIS + SETTLE_MILLIS,
            accepted_at: HashMap::new(),
            shape,
        }
    }

    fn at(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), event);
    }

    fn micros(&self) -> u64 {
        self.now * 1000
    }

    fn correct(&self, p: usize) -> bool {
        self.procs[p].kind == Kind::Correct
    }

    fn snapshot(&self, p: usize) -> BTreeSet<UpdateId> {
        self.procs[p]
            .node
            .log()
            .in_order()
            .map(|u| u.id())
            .collect()
    }

    /// Judges a read of `key` that returned `result` at correct node `p`, against its set now.
    fn judge_read(
        &self,
        p: usize,
        key: &Key,
        result: &ReadResult,
    ) -> (BTreeSet<UpdateId>, Vec<String>) {
        let snapshot = self.snapshot(p);
        let mut violations = Vec::new();
        if let Some(v) = self.truth.closure(&snapshot) {
            violations.push(format!("node {p}: {v}"));
        }
        let expected = self.truth.heads(&snapshot, key);
        let returned: BTreeSet<UpdateId> = result
            .versions
            .iter()
            .map(|v| v.id)
            .chain(result.unavailable.iter().copied())
            .collect();
        if returned != expected {
            violations.push(format!(
                "node {p}: read of {key} returned {returned:?}, but the latest writes it holds are {expected:?}"
            ));
        }
        // Bounded staleness (§6.4): a correct client's write older than the bound is held, or
        // its writer is suspected.
        let bound = self.config.staleness.bound_ms();
        for (id, writer, at) in &self.written_at {
            if *writer != p
                && at + bound < self.now
                && !snapshot.contains(id)
                && !result.suspects.contains(&Writer(*writer as u32))
            {
                violations.push(format!(
                    "node {p} at {} ms: a read misses {id:?}, written by node {writer} at {at} ms, \
                     without suspecting it (staleness bound {bound} ms)",
                    self.now
                ));
            }
        }
        for version in &result.versions {
            let written = self.truth.updates.get(&version.id).map(|u| &u.value);
            if written != Some(&version.value) {
                violations.push(format!(
                    "node {p}: read of {key} returned a value {:?} never wrote",
                    version.writer
                ));
            }
        }
        (snapshot, violations)
    }

    /// Every update a correct node accepts must come after everything it names (§3.3): judged
    /// as it is accepted, since a gap can close again before any read looks.
    fn judge_accepted(&mut self, p: usize, out: &Output) {
        for change in &out.changes {
            let bulwark_protocol::depot::Change::Update(update, accepted) = change else {
                continue;
            };
            let id = update.id();
            if let Some(accepted) = accepted {
                self.accepted_at.entry((p, id)).or_insert(*accepted);
            }
            let log = self.procs[p].node.log();
            match self.truth.updates.get(&id) {
                None => self
                    .run
                    .violations
                    .push(format!("node {p} accepted {id:?}, which nobody signed")),
                Some(u) => {
                    if let Some(missing) = u.named.iter().find(|d| !log.holds(d)) {
                        self.run.violations.push(format!(
                            "node {p} accepted {id:?} without {missing:?}, which it depends on"
                        ));
                    }
                }
            }
        }
    }

    /// A correct node drops a value only when, for every authorised version naming it that the
    /// node holds, every client signed a proposal listing that version (§6.6 (b)), and every
    /// correct client accepted a version superseding it longer ago than the ladder keeps
    /// everything (valid discard: no version a correct client's ladder keeps goes; a client's
    /// ladder counts from when it accepted the superseding version).
    fn judge_discards(&mut self, p: usize, out: &Output) {
        let now = self.micros();
        let keep = sim_ladder().keep_all_micros;
        let clients: BTreeSet<Writer> = (self.servers()..self.procs.len())
            .map(|c| Writer(c as u32))
            .collect();
        let correct_clients: Vec<usize> = (self.servers()..self.procs.len())
            .filter(|c| self.correct(*c))
            .collect();
        for change in &out.changes {
            let bulwark_protocol::depot::Change::Discard(hash) = change else {
                continue;
            };
            let log = self.procs[p].node.log();
            let mut namers: Vec<UpdateId> = self
                .truth
                .updates
                .iter()
                .filter(|(id, u)| {
                    u.authorised
                        && !is_reserved(&u.key)
                        && u.value.as_ref().is_some_and(|v| value_hash(v) == *hash)
                        && log.holds(id)
                })
                .map(|(id, _)| *id)
                .collect();
            namers.sort();
            if namers.len() > 1 {
                self.run.shared_discarded += 1;
            }
            for id in namers {
                let unanimous = self
                    .truth
                    .proposals
                    .iter()
                    .any(|(proposal, (proposer, ids))| {
                        let mut signed = self
                            .truth
                            .consents
                            .get(proposal)
                            .cloned()
                            .unwrap_or_default();
                        signed.insert(*proposer);
                        ids.contains(&id) && clients.is_subset(&signed)
                    });
                if !unanimous {
                    self.run.violations.push(format!(
                        "node {p} discarded value {hash:?} of {id:?} without every client's consent"
                    ));
                }
                let superseders = self.truth.superseders(&id);
                for c in &correct_clients {
                    let ended = superseders
                        .iter()
                        .filter_map(|s| self.accepted_at.get(&(*c, *s)))
                        .min();
                    if ended.is_none_or(|ended| ended.saturating_add(keep) > now) {
                        self.run.violations.push(format!(
                            "node {p} at {} ms discarded the value of {id:?}, which the ladder of \
                             correct client {c} keeps (current there, or superseded less than {} ms \
                             before)",
                            self.now,
                            keep / 1000
                        ));
                    }
                }
            }
        }
    }

    /// A client's turn to look at discard: a correct (or forking) client writes what its node
    /// says is due; a refusing one writes nothing; a hastening one consents to everything and
    /// now and then proposes every version it holds, current ones among them.
    fn discard(&mut self, p: usize) {
        if self.now > DISCARD_UNTIL_MILLIS {
            return;
        }
        let next = self.rng.random_range(150..250);
        self.at(next, Event::Discard(p));
        if !self.procs[p].up {
            return;
        }
        let now = self.micros();
        let me = Writer(p as u32);
        let due = match self.procs[p].kind {
            Kind::Refuser => None,
            Kind::Hastener => {
                let node = &self.procs[p].node;
                let consent = node
                    .discard_pending()
                    .into_iter()
                    .find(|pending| pending.proposer != me && pending.missing.contains(&me))
                    .map(|pending| Discard::Consent(pending.proposal));
                consent.or_else(|| {
                    let mut ids: Vec<UpdateId> = node
                        .log()
                        .in_order()
                        .filter(|u| u.body().value.is_some() && !is_reserved(&u.body().key))
                        .map(|u| u.id())
                        .collect();
                    // The newest, current versions among them.
                    ids.drain(..ids.len().saturating_sub(64));
                    ids.sort();
                    (!ids.is_empty() && self.rng.random_bool(0.3)).then(|| Discard::Propose {
                        turn: node.ladder().turn(now),
                        ids,
                    })
                })
            }
            _ => self.procs[p].node.discard_due(now),
        };
        let Some(discard) = due else {
            return;
        };
        let (update, mut out) = self.procs[p].node.write_discard(&discard, now);
        self.truth.record(
            &self.config,
            &update,
            Some(Bytes::from(discard.encode())),
            now,
        );
        self.truth.record_discard(&update, &discard);
        if let Discard::Propose { ids, .. } = &discard {
            let keep = sim_ladder().keep_all_micros;
            if ids
                .iter()
                .any(|id| !self.truth.superseded_before(id, now, keep))
            {
                self.run.premature_proposals += 1;
            }
        }
        let op = (self.procs[p].next_op << 8) | 0xff;
        self.procs[p].next_op += 1;
        let primary = self.server_order(p)[0];
        if let Some(put) = self.procs[p].node.put_message(op, &update.id()) {
            out.sends.push((primary, put));
        }
        self.procs[p].open_writes.insert(op, (update.id(), 0));
        let incarnation = self.procs[p].incarnation;
        self.apply(p, out, Vec::new());
        self.at(
            80,
            Event::PutRetry {
                client: p,
                incarnation,
                op,
            },
        );
    }

    /// Hands a node's output to the disk and the network: changes first, then what waits.
    fn apply(&mut self, p: usize, out: Output, mut extra: Vec<Held>) {
        if self.correct(p) {
            self.judge_accepted(p, &out);
            self.judge_discards(p, &out);
        }
        for (op, result) in &out.reads {
            self.procs[p].open_reads.remove(op);
            let _ = op;
            if self.correct(p) {
                let key = self.read_keys(p, *op);
                let (snapshot, violations) = self.judge_read(p, &key, result);
                self.run.reads += 1;
                if result.versions.len() + result.unavailable.len() > 1 {
                    self.run.concurrent_reads += 1;
                }
                let returned = result
                    .versions
                    .iter()
                    .map(|v| v.id)
                    .chain(result.unavailable.iter().copied())
                    .collect();
                extra.push(Held::Op {
                    snapshot,
                    violations,
                    wrote: None,
                    op: crate::fjc::Op::Read {
                        key: key.as_bytes().to_vec(),
                        returned,
                    },
                });
            }
        }
        let mut held: Vec<Held> = out
            .sends
            .into_iter()
            .map(|(to, message)| Held::Send(to, message))
            .collect();
        held.extend(extra);
        let proc = &mut self.procs[p];
        if out.changes.is_empty() && proc.committing.is_empty() {
            for item in held {
                self.release(p, item);
            }
            return;
        }
        if !out.changes.is_empty() {
            proc.batches += 1;
            let batch = proc.batches;
            proc.committing.push((batch, out.changes));
            let incarnation = proc.incarnation;
            let delay = self.rng.random_range(1..4);
            self.at(
                delay,
                Event::Commit {
                    node: p,
                    incarnation,
                    batch,
                },
            );
        }
        let proc = &mut self.procs[p];
        let batch = proc.batches;
        proc.held.extend(held.into_iter().map(|item| (batch, item)));
    }

    /// The key of read `op` of client `p`: reads remember it in the op number's low bits.
    fn read_keys(&self, _p: usize, op: u64) -> Key {
        self.key_of(op & 0xff)
    }

    fn key_of(&self, index: u64) -> Key {
        key(format!("shared/k{}", index % 4))
    }

    fn release(&mut self, p: usize, item: Held) {
        match item {
            Held::Send(to, message) => self.send(p, to.0 as usize, message),
            Held::Op {
                snapshot,
                mut violations,
                wrote,
                op,
            } => {
                self.history.entry(p as u32).or_default().push(op);
                if let Some((id, at)) = wrote {
                    self.written.insert(id);
                    self.written_at.push((id, p, at));
                }
                let proc = &mut self.procs[p];
                if let Some(lost) = proc.observed.difference(&snapshot).next() {
                    violations.push(format!(
                        "node {p}: {lost:?}, seen at an earlier operation, is gone"
                    ));
                }
                proc.observed = snapshot;
                self.run.violations.extend(violations);
            }
        }
    }

    fn send(&mut self, from: usize, to: usize, message: Message) {
        let message = if self.procs[from].kind == Kind::Tamperer {
            match self.tamper(message) {
                Some(message) => message,
                None => return,
            }
        } else {
            message
        };
        if self.side[from] != self.side[to] {
            return;
        }
        if self.rng.random_range(0..1000) < self.shape.loss_per_mille {
            return;
        }
        let copies = if self.rng.random_range(0..100) < 2 {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self.rng.random_range(1..15);
            self.at(
                delay,
                Event::Deliver {
                    to,
                    from,
                    message: message.clone(),
                },
            );
        }
    }

    /// What a tampering server does to what it passes on.
    fn tamper(&mut self, message: Message) -> Option<Message> {
        let roll = self.rng.random_range(0..10);
        match message {
            Message::Push {
                mut updates,
                mut values,
                mut frontier,
                forks,
                more,
                want_values,
            } => {
                match roll {
                    0 | 1 if !updates.is_empty() => {
                        let i = self.rng.random_range(0..updates.len());
                        updates[i] = self.corrupt(&updates[i]);
                    }
                    2 => values = vec![Bytes::from_static(b"not what anyone wrote")],
                    3 => updates.clear(),
                    4 => updates.reverse(),
                    5 => {
                        let mut made_up = [0u8; 32];
                        self.rng.fill(&mut made_up[..]);
                        frontier.push((
                            Writer(0),
                            u64::MAX / 2,
                            UpdateId(bulwark_core::Digest(made_up)),
                        ));
                    }
                    _ => {}
                }
                Some(Message::Push {
                    updates,
                    values,
                    frontier,
                    forks,
                    more,
                    want_values,
                })
            }
            Message::Got {
                op,
                mut values,
                mut updates,
                more,
                forks,
            } => {
                match roll {
                    0 => values = vec![Bytes::from_static(b"a lie")],
                    1 => updates.clear(),
                    2 if !updates.is_empty() => {
                        let i = self.rng.random_range(0..updates.len());
                        updates[i] = self.corrupt(&updates[i]);
                    }
                    _ => {}
                }
                Some(Message::Got {
                    op,
                    values,
                    updates,
                    more,
                    forks,
                })
            }
            Message::PutAck { .. } if roll < 5 => None,
            other => Some(other),
        }
    }

    fn corrupt(&mut self, update: &WireUpdate) -> WireUpdate {
        let mut bytes = update.signed.bytes().to_vec();
        let i = self.rng.random_range(0..bytes.len());
        bytes[i] ^= 1 << self.rng.random_range(0..8);
        WireUpdate {
            writer: update.writer,
            signed: Unverified::new(Bytes::from(bytes), *update.signed.signature()),
        }
    }

    fn servers(&self) -> usize {
        self.shape.servers
    }

    /// Servers in the order a client tries them: its primary first.
    fn server_order(&self, p: usize) -> Vec<Writer> {
        let n = self.servers();
        let primary = self.procs[p].primary;
        (0..n).map(|i| Writer(((primary + i) % n) as u32)).collect()
    }

    fn op(&mut self, p: usize) {
        if !self.procs[p].up || self.procs[p].ops_left == 0 {
            return;
        }
        self.procs[p].ops_left -= 1;
        let op_base = self.procs[p].next_op;
        self.procs[p].next_op += 1;
        let write = self.rng.random_bool(0.5);
        let index = self.rng.random_range(0..6u64);
        let op = (op_base << 8) | index;
        if write {
            let key = if index < 4 {
                self.key_of(index)
            } else {
                key(format!("c{p}/own"))
            };
            // With discard on, every tenth write of a client writes bytes others write too: a
            // value many versions name goes only when every one of them is let go.
            let value = if self.shape.discard && op_base % 10 == 3 {
                Bytes::from_static(SHARED_BYTES)
            } else {
                Bytes::from(format!("{p}:{op}"))
            };
            let before = self.snapshot(p);
            let now = self.micros();
            let (update, mut out) = self.procs[p].node.write(key, Some(value.clone()), now);
            self.truth.record(&self.config, &update, Some(value), now);
            let mut extra = Vec::new();
            if self.correct(p) {
                let past = self.truth.past(&update.id());
                let mut violations = Vec::new();
                if past != before {
                    violations.push(format!(
                        "node {p}: its write depends on {} updates but it had accepted {}",
                        past.len(),
                        before.len()
                    ));
                }
                let mut snapshot = before;
                snapshot.insert(update.id());
                extra.push(Held::Op {
                    snapshot,
                    violations,
                    wrote: Some((update.id(), self.now)),
                    op: crate::fjc::Op::Write(update.id()),
                });
            }
            let order = self.server_order(p);
            if let Some(put) = self.procs[p].node.put_message(op, &update.id()) {
                out.sends.push((order[0], put));
            }
            if self.procs[p].kind == Kind::Forker && self.rng.random_bool(0.4) {
                // A second update after the same previous one, to another server.
                let value = Bytes::from(format!("twin {p}:{op}"));
                let fork = twin(&update, &self.procs[p].secret, &value);
                self.truth
                    .record(&self.config, &fork, Some(value.clone()), now);
                let other = order[order.len() - 1];
                out.sends.push((
                    other,
                    Message::Put {
                        op: 0,
                        update: fork.to_wire(),
                        value: Some(value),
                    },
                ));
                if other == order[0] {
                    // One server: the twin goes to a client instead.
                    let client = self.rng.random_range(self.servers()..self.procs.len());
                    out.sends.push((
                        Writer(client as u32),
                        Message::push(vec![fork.to_wire()], Vec::new()),
                    ));
                }
            }
            self.procs[p].open_writes.insert(op, (update.id(), 0));
            let incarnation = self.procs[p].incarnation;
            self.apply(p, out, extra);
            self.at(
                80,
                Event::PutRetry {
                    client: p,
                    incarnation,
                    op,
                },
            );
        } else {
            let order = self.server_order(p);
            let key = self.key_of(index);
            let now = self.micros();
            match self.procs[p].node.start_read(op, key, &order, now) {
                ReadStart::Done(result) => {
                    let out = Output {
                        reads: vec![(op, result)],
                        ..Output::default()
                    };
                    self.apply(p, out, Vec::new());
                }
                ReadStart::Ask(to, message) => {
                    self.procs[p].open_reads.insert(op);
                    self.send(p, to.0 as usize, *message);
                    let incarnation = self.procs[p].incarnation;
                    self.at(
                        60,
                        Event::ReadTimeout {
                            client: p,
                            incarnation,
                            op,
                        },
                    );
                }
            }
        }
        let next = self.rng.random_range(5..60);
        self.at(next, Event::Op(p));
    }

    fn gossip(&mut self, p: usize) {
        let every = if p < self.servers() { 100 } else { 300 };
        let jitter = self.rng.random_range(0..20);
        self.at(every + jitter, Event::Gossip(p));
        if !self.procs[p].up {
            return;
        }
        let now = self.micros();
        let out = self.procs[p].node.on_tick(now);
        self.apply(p, out, Vec::new());
        let peers: Vec<usize> = if p < self.servers() {
            (0..self.servers()).filter(|q| *q != p).collect()
        } else {
            let mut peers = vec![self.procs[p].primary];
            if self.rng.random_bool(0.3) {
                let other = self.rng.random_range(0..self.procs.len());
                if other != p {
                    peers.push(other);
                }
            }
            peers
        };
        for q in peers {
            let pull = self.procs[p].node.pull(Writer(q as u32));
            self.send(p, q, pull);
        }
        if self.procs[p].kind == Kind::Tamperer && self.rng.random_bool(0.1) {
            self.tamperer_writes(p);
        }
    }

    /// A tampering server writes where it has no right, and sometimes forks it.
    fn tamperer_writes(&mut self, p: usize) {
        let value = Bytes::from(format!("server {p} at {}", self.now));
        let index = self.rng.random_range(0..4);
        let key = self.key_of(index);
        let now = self.micros();
        let (update, out) = self.procs[p].node.write(key, Some(value.clone()), now);
        self.truth.record(&self.config, &update, Some(value), now);
        self.apply(p, out, Vec::new());
        if self.rng.random_bool(0.5) {
            let value = Bytes::from(format!("server {p} twin at {}", self.now));
            let fork = twin(&update, &self.procs[p].secret, &value);
            self.truth
                .record(&self.config, &fork, Some(value.clone()), now);
            let to = self.rng.random_range(0..self.procs.len());
            if to != p {
                let push = Message::push(vec![fork.to_wire()], vec![value]);
                // Sent around its own tampering.
                self.at(
                    1,
                    Event::Deliver {
                        to,
                        from: p,
                        message: push,
                    },
                );
            }
        }
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::Deliver { to, from, message } => {
                if !self.procs[to].up {
                    return;
                }
                if let Message::PutAck { op, .. } = &message {
                    self.procs[to].open_writes.remove(op);
                }
                let now = self.micros();
                let proc = &mut self.procs[to];
                let store = SimStore {
                    committing: &proc.committing,
                    stored: &proc.stored,
                };
                let out = proc
                    .node
                    .on_message_with(Writer(from as u32), message, now, &store);
                self.apply(to, out, Vec::new());
            }
            Event::Commit {
                node,
                incarnation,
                batch,
            } => {
                let proc = &mut self.procs[node];
                if proc.incarnation != incarnation {
                    return;
                }
                let done: Vec<_> = proc
                    .committing
                    .extract_if(.., |(b, _)| *b <= batch)
                    .collect();
                for (_, changes) in done {
                    for change in &changes {
                        match change {
                            bulwark_protocol::depot::Change::Value(value) => {
                                proc.stored.insert(value_hash(value), value.clone());
                            }
                            bulwark_protocol::depot::Change::Discard(hash) => {
                                proc.stored.remove(hash);
                            }
                            _ => {}
                        }
                    }
                    proc.disk.extend(changes);
                }
                let ready: Vec<Held> = proc
                    .held
                    .extract_if(.., |(b, _)| *b <= batch)
                    .map(|(_, item)| item)
                    .collect();
                for item in ready {
                    self.release(node, item);
                }
            }
            Event::Gossip(p) => self.gossip(p),
            Event::Beacon(p) => {
                // Beacons stop once the reads are over (they cost every node a signature check
                // each), long before the world is judged.
                if self.now > BUSY_MILLIS + 500 {
                    return;
                }
                self.at(ANNOUNCE_MILLIS, Event::Beacon(p));
                if self.procs[p].up {
                    let now = self.micros();
                    let (update, out) = self.procs[p].node.beacon(now);
                    self.truth.record(&self.config, &update, None, now);
                    self.apply(p, out, Vec::new());
                }
            }
            Event::Op(p) => self.op(p),
            Event::Discard(p) => self.discard(p),
            Event::PutRetry {
                client,
                incarnation,
                op,
            } => {
                let proc = &mut self.procs[client];
                if proc.incarnation != incarnation || !proc.up {
                    return;
                }
                let Some((id, attempt)) = proc.open_writes.get_mut(&op) else {
                    return;
                };
                *attempt += 1;
                let (id, attempt) = (*id, *attempt);
                if attempt > 30 {
                    return;
                }
                let order = self.server_order(client);
                let to = order[attempt % order.len()];
                if let Some(put) = self.procs[client].node.put_message(op, &id) {
                    self.send(client, to.0 as usize, put);
                }
                self.at(
                    80,
                    Event::PutRetry {
                        client,
                        incarnation,
                        op,
                    },
                );
            }
            Event::ReadTimeout {
                client,
                incarnation,
                op,
            } => {
                let proc = &mut self.procs[client];
                if proc.incarnation != incarnation || !proc.up || !proc.open_reads.contains(&op) {
                    return;
                }
                let out = proc.node.read_timeout(op, self.now * 1000);
                let ended = !out.reads.is_empty();
                self.apply(client, out, Vec::new());
                if !ended {
                    self.at(
                        60,
                        Event::ReadTimeout {
                            client,
                            incarnation,
                            op,
                        },
                    );
                }
            }
            Event::Crash(p) => {
                if !self.procs[p].up || self.settling {
                    return;
                }
                self.run.crashes += 1;
                let proc = &mut self.procs[p];
                proc.up = false;
                proc.incarnation += 1;
                proc.committing.clear();
                proc.held.clear();
                proc.open_reads.clear();
                proc.open_writes.clear();
                let down = self.rng.random_range(20..300);
                self.at(down, Event::Restart(p));
            }
            Event::Restart(p) => {
                if self.procs[p].up {
                    return;
                }
                let proc = &self.procs[p];
                let resident = self
                    .shape
                    .resident_values
                    .filter(|_| p < self.shape.servers);
                // A bounded server reads its values' hashes and lengths, not their bytes.
                let disk: Vec<bulwark_protocol::depot::Change> = match resident {
                    None => proc.disk.clone(),
                    Some(_) => proc
                        .disk
                        .iter()
                        .map(|change| match change {
                            bulwark_protocol::depot::Change::Value(value) => {
                                bulwark_protocol::depot::Change::Stored(
                                    value_hash(value),
                                    value.len() as u64,
                                )
                            }
                            other => other.clone(),
                        })
                        .collect(),
                };
                let store = SimStore {
                    committing: &[],
                    stored: &proc.stored,
                };
                let mut node = Node::restore_with(
                    self.config.clone(),
                    Writer(p as u32),
                    proc.secret.clone(),
                    &disk,
                    self.micros(),
                    resident,
                    &store,
                );
                if self.correct(p) {
                    node.mutate(self.shape.mutations);
                }
                if self.shape.discard {
                    node.set_ladder(sim_ladder());
                }
                let proc = &mut self.procs[p];
                proc.node = node;
                proc.up = true;
                if proc.ops_left > 0 {
                    self.at(1, Event::Op(p));
                }
            }
            Event::Split => {
                if self.settling {
                    return;
                }
                for s in self.side.iter_mut() {
                    *s = self.rng.random_bool(0.5);
                }
                let heal = self.rng.random_range(100..1000);
                self.at(heal, Event::Heal);
            }
            Event::Heal => self.side.iter_mut().for_each(|s| *s = false),
        }
    }

    fn run(mut self) -> DepotRun {
        let n = self.procs.len();
        for p in 0..n {
            let start = self.rng.random_range(0..100);
            self.at(start, Event::Gossip(p));
            if p >= self.servers() {
                let start = self.rng.random_range(0..50);
                self.at(start, Event::Op(p));
                let first = self.rng.random_range(0..ANNOUNCE_MILLIS);
                self.at(first, Event::Beacon(p));
                if self.shape.discard {
                    let first = self.rng.random_range(0..200);
                    self.at(first, Event::Discard(p));
                }
            }
        }
        let busy = BUSY_MILLIS;
        if let Some(until) = self.shape.servers_down_until {
            for p in 0..self.servers() {
                let proc = &mut self.procs[p];
                proc.up = false;
                proc.incarnation += 1;
                self.at(until, Event::Restart(p));
            }
        }
        if self.shape.crashes {
            for _ in 0..self.rng.random_range(1..6) {
                let p = self.rng.random_range(0..n);
                if self.correct(p) {
                    let at = self.rng.random_range(0..busy);
                    self.at(at, Event::Crash(p));
                }
            }
        }
        if self.shape.partitions {
            for _ in 0..self.rng.random_range(1..4) {
                let at = self.rng.random_range(0..busy);
                self.at(at, Event::Split);
            }
        }
        let end = self.end;
        while let Some(((time, _), event)) = self.events.pop_first() {
            if time > end {
                break;
            }
            self.now = time;
            self.run.events += 1;
            if self.run.events > EVENTS_MAX {
                self.run.violations.push(format!(
                    "more than {EVENTS_MAX} events by {time} ms: the nodes never stop talking"
                ));
                return self.run;
            }
            if !self.settling && self.now > busy && self.procs.iter().all(|p| p.ops_left == 0) {
                self.settling = true;
                self.side.iter_mut().for_each(|s| *s = false);
                for p in 0..n {
                    if !self.procs[p].up {
                        self.at(1, Event::Restart(p));
                    }
                }
            }
            self.step(event);
        }
        self.judge_end();
        self.run
    }

    /// The end-of-run properties: convergence, both branches of every fork, proofs, values.
    fn judge_end(&mut self) {
        let correct: Vec<usize> = (0..self.procs.len()).filter(|p| self.correct(*p)).collect();
        self.run.updates = self.truth.updates.len();
        let execution = crate::fjc::Execution {
            updates: self
                .truth
                .updates
                .iter()
                .map(|(id, u)| {
                    let update = crate::fjc::Update {
                        node: u.writer.0,
                        key: u.key.as_bytes().to_vec(),
                        deps: u.named.clone(),
                        authorised: u.authorised,
                    };
                    (*id, update)
                })
                .collect(),
            correct: std::mem::take(&mut self.history),
        };
        for violation in crate::fjc::check(&execution) {
            self.run
                .violations
                .push(format!("FJC (Appendix A): {violation}"));
        }
        let sets: Vec<BTreeSet<UpdateId>> = correct.iter().map(|p| self.snapshot(*p)).collect();
        for (p, set) in correct.iter().zip(&sets) {
            if let Some(v) = self.truth.closure(set) {
                self.run
                    .violations
                    .push(format!("node {p} at the end: {v}"));
            }
            let node = &self.procs[*p].node;
            self.run.discarded += node.discarded();
            let refusers: Vec<Writer> = (0..self.procs.len())
                .filter(|q| self.procs[*q].kind == Kind::Refuser)
                .map(|q| Writer(q as u32))
                .collect();
            if *p >= self.servers() {
                self.run.awaiting_refuser += node
                    .discard_pending()
                    .iter()
                    .filter(|pending| pending.missing.iter().any(|m| refusers.contains(m)))
                    .count();
            }
            let stats = self.procs[*p].node.stats();
            self.run.refused += stats.refused;
            self.run.fast_gets += stats.fast_gets;
            self.run.slow_gets += stats.slow_gets;
        }
        let union: BTreeSet<UpdateId> = sets.iter().flatten().copied().collect();
        for (p, set) in correct.iter().zip(&sets) {
            if set != &union {
                let missing = union.difference(set).count();
                self.run.violations.push(format!(
                    "node {p} did not converge: it lacks {missing} of the {} updates correct nodes hold (pending {})",
                    union.len(),
                    self.procs[*p].node.log().pending()
                ));
            }
        }
        for id in &self.written {
            if !union.contains(id) {
                self.run.violations.push(format!(
                    "the durable write {id:?} of a correct writer reached no correct node's log"
                ));
            }
        }
        // Forks: writers with two held updates naming one previous update.
        let mut siblings: BTreeMap<(Writer, Option<UpdateId>), usize> = BTreeMap::new();
        for id in &union {
            if let Some(u) = self.truth.updates.get(id) {
                *siblings.entry((u.writer, u.prev)).or_default() += 1;
            }
        }
        let forked: BTreeSet<Writer> = siblings
            .iter()
            .filter(|(_, count)| **count > 1)
            .map(|((writer, _), _)| *writer)
            .collect();
        self.run.forks = forked.len();
        for p in &correct {
            let proofs = self.procs[*p].node.log().forks();
            for writer in &forked {
                match proofs.get(writer) {
                    Some(proof) if proof.verify(&self.config) => {}
                    _ => self.run.violations.push(format!(
                        "node {p} holds both branches of {writer:?}'s fork but no proof"
                    )),
                }
            }
            for writer in proofs.keys() {
                if self.correct(writer.0 as usize) {
                    self.run.violations.push(format!(
                        "node {p} holds a proof against correct writer {writer:?}"
                    ));
                }
            }
        }
        self.run.forks_proven = correct
            .first()
            .map_or(0, |p| self.procs[*p].node.log().forks().len());
        let servers = self.servers();
        for p in correct.iter().filter(|p| **p < servers) {
            // A simulated disk loses nothing it made durable, and the batches on their way are
            // read too: a server whose store lacked a value it held evicted it too early.
            let damaged = self.procs[*p].node.stats().values_damaged;
            if damaged > 0 {
                self.run.violations.push(format!(
                    "server {p} did not find {damaged} values it held in its store"
                ));
            }
            for id in &union {
                let Some(u) = self.truth.updates.get(id) else {
                    continue;
                };
                if self.correct(u.writer.0 as usize)
                    && let Some(value) = &u.value
                    && !self.procs[*p].node.is_discarded(&value_hash(value))
                    && !self.procs[*p].node.has_value(&value_hash(value))
                {
                    self.run.violations.push(format!(
                        "server {p} lacks the value of {id:?} by correct writer {:?}",
                        u.writer
                    ));
                }
            }
        }
    }
}

/// Runs seed `seed` of the swarm with `mutations` broken in every correct node.
pub fn run(seed: u64, mutations: Mutations) -> DepotRun {
    World::new(seed, DepotConfig::from_seed(seed, mutations)).run()
}

/// Runs one seed with a shape chosen by the caller.
pub fn run_shaped(seed: u64, shape: DepotConfig) -> DepotRun {
    World::new(seed, shape).run()
}
