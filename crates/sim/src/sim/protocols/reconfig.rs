//! Public-key objects across reconfigurations (Rosebud §4.5, §4.7, the reconfiguration scenarios
//! of spec §7.2): a cluster of `2(3f+1)` nodes, some of them members, whose certified
//! configuration changes several times during the run (nodes join, nodes leave, a whole group is
//! replaced in one epoch), every node hosting [`EpochServer`], the real machine that follows the
//! epochs and pulls the keys it takes over, and every client operation a [`Routed`] register
//! operation that starts in the genesis epoch and follows the replicas' word into newer ones.
//! Every object's history is checked for linearizability.
//!
//! The configuration service is not simulated here (it has its own simulation): the epochs are
//! a schedule drawn from the seed, certified by construction, that each node learns at its own
//! moment after the epoch starts (as certificates reach nodes at different times), or earlier
//! when a client's request or a peer's transfer request names it (the sender pushes the
//! certificate, spec §4.5).

use super::registers::{RegisterDisk, describe_request, describe_response, kind, owner_of};
use crate::byzantine::Behaviour;
use crate::checker::{self, History, OpKind, Outcome, Report, Violation};
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Protocol, Storage};
use crate::sim::swarm::Swarm;
use crate::sim::world::history_name;
use bulwark_core::membership::{Arc as RingArc, Chain, PlacementParams, Ring, RingPoint};
use bulwark_core::{ClientId, Digest, Epoch, Key, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::machine::{Access, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::pubkey::{self, PubKey};
use bulwark_protocol::register::reconfig::{
    self, EpochServer, FETCH_WINDOW, Held, LIST_PAGE_KEYS, MemoryVersions, Registers, Routed,
    TransferMutations, Versions, routed,
};
use bulwark_protocol::register::{Policy, Timestamp};
use bulwark_protocol::round::OpId;
use bulwark_protocol::transfer::{Change, Resume, Transfer, keys_after, ring_order};
use bytes::Bytes;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// How late after an epoch starts a node may learn of it, at most.
pub(crate) const LEARN_LATE_MAX_MILLIS: u64 = 1_500;

/// How long after every node learned the last epoch and finished its pulls a run must go on for
/// its checker to expect every moved key dropped whose new group holds it: the first sweep (a
/// pull that ends stores keys the next sweep looks for), the wait for members that do not
/// confirm ([`reconfig::DROP_GRACE_MILLIS`]), a kept batch's rounds and the next sweep
/// ([`reconfig::DROP_RESWEEP_MAX_MILLIS`]).
pub(crate) const DROPPED_AFTER_MILLIS: u64 = 16_000;

/// In reliable runs, how long after the epoch that first names it a joining node may start: a
/// new process fetching the chain and connecting to its peers. Shorter than
/// [`reconfig::DROP_GRACE_MILLIS`], so that old members still hold what it must take over.
const START_LATE_MAX_MILLIS: u64 = 3_000;
const _: () = assert!(START_LATE_MAX_MILLIS < reconfig::DROP_GRACE_MILLIS);

/// One run's cluster: the chain of configurations and when each epoch starts. `NODES` nodes in
/// all, members or not; 0 means twice a group, `2(3f+1)`.
pub struct ReconfigSim<const NODES: usize = 0> {
    f: usize,
    /// What correct nodes transferred, over the whole run (restarts included).
    transfers: Arc<Mutex<Transfers>>,
    chain: Arc<Chain>,
    /// When each epoch starts (the genesis at 0).
    starts: Vec<u64>,
    mutations: TransferMutations,
    /// No faulty node, crash, partition, loss or long delay: every pull finishes soon after its
    /// epoch starts, so a new member must take over every write completed before the epoch.
    reliable: bool,
}

/// The schedule of one run: the genesis members, then each epoch's change.
pub(crate) fn schedule(rng: &mut ChaCha8Rng, f: usize, nodes: usize) -> (Vec<Ring>, Vec<u64>) {
    let group = 3 * f + 1;
    let params = PlacementParams::new(f);
    let mut all: Vec<u32> = (0..nodes as u32).collect();
    all.shuffle(rng);
    let initial = rng.random_range(group..nodes);
    let mut members: BTreeSet<u32> = all[..initial].iter().copied().collect();
    let ring = |epoch: u64, members: &BTreeSet<u32>| {
        Ring::new(Epoch(epoch), params, members.iter().map(|&id| NodeId(id)))
            .unwrap_or_else(|error| unreachable!("schedules keep 3f+1 members: {error}"))
    };
    let mut rings = vec![ring(0, &members)];
    let mut starts = vec![0];
    let epochs = rng.random_range(2..=5u64);
    // Spread over the first part of the run, where the operations are: some epochs change while
    // the first writes land, some later, some in quick succession.
    let mut at = rng.random_range(100..3_000u64);
    for epoch in 1..=epochs {
        let outside: Vec<u32> = (0..nodes as u32)
            .filter(|id| !members.contains(id))
            .collect();
        let inside: Vec<u32> = members.iter().copied().collect();
        match rng.random_range(0..4) {
            // Joins.
            0 if !outside.is_empty() => {
                let count = rng.random_range(1..=outside.len().min(2));
                members.extend(outside.choose_multiple(rng, count));
            }
            // Departures, keeping a group's worth.
            1 if inside.len() > group => {
                let count = rng.random_range(1..=(inside.len() - group).min(2));
                for id in inside.choose_multiple(rng, count) {
                    members.remove(id);
                }
            }
            // One group's members all leave and as many newcomers join, when there are enough.
            2 if outside.len() >= group => {
                let ring = ring(epoch, &members);
                let groups = ring.groups();
                let Some(replaced) = groups.choose(rng) else {
                    unreachable!("a ring has groups")
                };
                for id in replaced.members() {
                    members.remove(&id.0);
                }
                members.extend(outside.choose_multiple(rng, group));
            }
            // One in, one out.
            _ => {
                if let Some(&joining) = outside.choose(rng) {
                    members.insert(joining);
                }
                if members.len() > group
                    && let Some(&leaving) = inside.choose(rng)
                {
                    members.remove(&leaving);
                }
            }
        }
        rings.push(ring(epoch, &members));
        starts.push(at);
        at += rng.random_range(150..6_000u64);
    }
    (rings, starts)
}

/// When node `index` learns each epoch by itself, given when each starts: at its own moment, as
/// certificates reach nodes at different times.
pub(crate) fn learns(starts: &[u64], index: usize) -> Vec<u64> {
    starts
        .iter()
        .enumerate()
        .map(|(epoch, start)| {
            let late = Digest::of(
                "bulwark/sim/reconfig/learn",
                &[index as u64, epoch as u64].map(u64::to_be_bytes).concat(),
            );
            let late = u64::from_be_bytes(late.0[..8].try_into().unwrap_or_default());
            start + late % LEARN_LATE_MAX_MILLIS
        })
        .collect()
}

/// The newest epoch a node whose learning times are `learns` knows of by itself at `now`.
pub(crate) fn learned(learns: &[u64], now: Time) -> Epoch {
    let known = learns.iter().take_while(|at| **at <= now.0).count();
    Epoch(known.saturating_sub(1) as u64)
}

/// One node's disk: its versions, the newest epoch it entered and the arcs it finished pulling.
#[derive(Default)]
pub struct NodeDisk {
    entries: RegisterDisk<pubkey::Entry>,
    entered: Epoch,
    pulled: BTreeSet<(Epoch, RingArc)>,
}

/// Fifty nodes: many groups, each reconfiguration moving a small part of the ring.
pub type ScaleReconfigSim = ReconfigSim<50>;

/// A node: the real machine, and how it learns certified configurations in this world.
pub struct SimNode {
    inner: EpochServer<PubKey>,
    /// The run's transfer counts, shared by every node.
    transfers: Arc<Mutex<Transfers>>,
    /// How it lies to the nodes that take keys over from it (clients it serves honestly, unless
    /// silent): a faulty old member of spec §7.2.
    behaviour: Behaviour,
    /// The first version it stored of each key: what a stale member hands over.
    first: BTreeMap<Key, pubkey::Entry>,
    /// What it stored, as its own changes said (rebuilt from the disk on restart): for the
    /// check that moved keys are dropped.
    stored: MemoryVersions<pubkey::Entry>,
    rng: ChaCha8Rng,
    chain: Arc<Chain>,
    /// When this node learns each epoch by itself.
    learns: Vec<u64>,
    /// The time of its last tick.
    ticked: u64,
    /// The last time it was seen with a pull unfinished, or started.
    unsettled: u64,
    mutations: TransferMutations,
    /// The arcs it finished pulling, into which epoch, since it started.
    pulled: BTreeSet<(Epoch, RingArc)>,
    /// Restarted from its disk: its pulls may have waited on its restart.
    restarted: bool,
    /// Before this moment the node has not started: it hears and does nothing.
    starts_at: u64,
}

impl SimNode {
    fn new<const NODES: usize>(
        inner: EpochServer<PubKey>,
        sim: &ReconfigSim<NODES>,
        index: usize,
        behaviour: Behaviour,
        seed: u64,
    ) -> SimNode {
        let learns = learns(&sim.starts, index);
        SimNode {
            inner: inner.with_mutations(sim.mutations),
            transfers: sim.transfers.clone(),
            behaviour,
            first: BTreeMap::new(),
            stored: MemoryVersions::default(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            chain: sim.chain.clone(),
            learns,
            ticked: 0,
            unsettled: 0,
            mutations: sim.mutations,
            pulled: BTreeSet::new(),
            restarted: false,
            starts_at: if sim.reliable {
                start_of(&sim.chain, &sim.starts, index)
            } else {
                0
            },
        }
    }

    /// Whether the node has started by `now`.
    fn started(&self, now: Time) -> bool {
        now.0 >= self.starts_at
    }

    /// Keeps the view of what it stored, and the arcs it finished pulling, up with `output`.
    fn record(&mut self, output: &Output<SimNode>) {
        self.stored.apply(&output.changes);
        for change in &output.changes {
            if let Change::Pulled { epoch, arc } = change {
                self.pulled.insert((*epoch, *arc));
            }
        }
    }

    /// Enters every epoch up to `epoch`, one at a time.
    fn catch_up(&mut self, epoch: Epoch) -> Output<SimNode> {
        let mut output = Output::none();
        while self.inner.epoch() < epoch.min(self.chain.latest()) {
            let next = Epoch(self.inner.epoch().0 + 1);
            let Some(ring) = self.chain.ring(next) else {
                break;
            };
            output = output.and(lift(self.inner.enter(ring.clone())));
        }
        output
    }

    /// What a faulty old member makes of its honest transfer answers, and a faulty new member of
    /// its answers to a node asking whether it holds what moved: `asked` is that question's keys.
    fn lie(&mut self, output: &mut Output<SimNode>, asked: &[(Key, Timestamp)]) {
        for (_, message) in &mut output.sends {
            let replaced = match (self.behaviour, &*message) {
                // Denies holding anything.
                (Behaviour::Amnesiac, Transfer::NoNewer { epoch, key }) => {
                    Some(Transfer::Fetched {
                        epoch: *epoch,
                        key: key.clone(),
                        entry: None,
                    })
                }
                // Says it holds nothing newer than the asker, whatever it holds, for half the
                // keys; hands over the oldest version it ever held for the others.
                (Behaviour::Stale, Transfer::Fetched { epoch, key, .. })
                    if key.as_bytes().first().is_some_and(|byte| byte % 2 == 0) =>
                {
                    Some(Transfer::NoNewer {
                        epoch: *epoch,
                        key: key.clone(),
                    })
                }
                (Behaviour::Stale, Transfer::NoNewer { epoch, key }) => {
                    self.first.get(key).map(|first| Transfer::Fetched {
                        epoch: *epoch,
                        key: key.clone(),
                        entry: Some(first.clone()),
                    })
                }
                _ => None,
            };
            if let Some(replaced) = replaced {
                *message = replaced;
                continue;
            }
            match (self.behaviour, message) {
                // Says it holds everything, so that the old members drop what it lacks.
                (
                    Behaviour::Amnesiac | Behaviour::Stale | Behaviour::Forging,
                    Transfer::Held {
                        versions, pending, ..
                    },
                ) => {
                    *versions = asked.to_vec();
                    pending.clear();
                }
                // Withholds: lists nothing, holds nothing.
                (Behaviour::Amnesiac, Transfer::Listed { keys, more, .. }) => {
                    keys.clear();
                    *more = false;
                }
                (Behaviour::Amnesiac, Transfer::Fetched { entry, .. }) => *entry = None,
                // Hands over the oldest version it ever held.
                (Behaviour::Stale, Transfer::Fetched { key, entry, .. }) => {
                    if let Some(first) = self.first.get(key) {
                        *entry = Some(first.clone());
                    }
                }
                // Lists ids nobody wrote, and answers with versions nobody signed.
                (
                    Behaviour::Forging,
                    Transfer::Listed {
                        arc, after, keys, ..
                    },
                ) => {
                    for _ in 0..16 {
                        let bytes: [u8; 32] = self.rng.random();
                        let Ok(bogus) = Key::new(Bytes::copy_from_slice(&bytes)) else {
                            continue;
                        };
                        let order = ring_order::<Registers<PubKey>>;
                        let fits = arc.contains(RingPoint::of_key(bogus.as_bytes()))
                            && after
                                .as_ref()
                                .is_none_or(|after| order(&bogus) > order(after))
                            && keys.last().is_none_or(|last| order(&bogus) < order(last))
                            && keys.len() < LIST_PAGE_KEYS;
                        if fits {
                            keys.push(bogus);
                            keys.sort_unstable_by(|a, b| order(a).cmp(&order(b)));
                        }
                    }
                }
                (
                    Behaviour::Forging,
                    Transfer::Fetched {
                        entry: Some(entry), ..
                    },
                ) => entry.ts.num = entry.ts.num.saturating_add(1_000),
                _ => {}
            }
        }
    }

    /// Counts the `pulled` bytes this node took over, and what it hands over in `output` if it
    /// is correct.
    fn count(&self, output: &Output<SimNode>, pulled: (u64, u64)) {
        let Ok(mut transfers) = self.transfers.lock() else {
            return;
        };
        transfers.pulled.0 += pulled.0;
        transfers.pulled.1 += pulled.1;
        if self.behaviour != Behaviour::Honest {
            return;
        }
        for (_, message) in &output.sends {
            let (epoch, key, entry) = match message {
                Transfer::Fetched {
                    epoch,
                    key,
                    entry: Some(entry),
                }
                | Transfer::Offer { epoch, key, entry } => (epoch, key, entry),
                _ => continue,
            };
            let size = PubKey::value(entry).map_or(0, |v| v.len() as u64);
            transfers.handed.0 += 1;
            transfers.handed.1 += size;
            let group = |epoch: u64| {
                let ring = self.chain.ring(Epoch(epoch))?;
                let mut members = ring.group_of(key.as_bytes()).members().to_vec();
                members.sort_unstable();
                Some(members)
            };
            // An offer goes to the key's current group from a node that left it, in whichever
            // epoch: not a pull of an arc that stayed.
            let offered = matches!(message, Transfer::Offer { .. });
            if !offered && epoch.0 > 0 && group(epoch.0 - 1) == group(epoch.0) {
                transfers.handed_unchanged += size;
            }
        }
    }

    /// The newest epoch this node has learned of by itself at `now`.
    fn learned(&self, now: Time) -> Epoch {
        learned(&self.learns, now)
    }
}

/// The same output, as the wrapper's.
fn lift(output: Output<EpochServer<PubKey>>) -> Output<SimNode> {
    output.retyped()
}

impl Replica for SimNode {
    const SERVICE: ServiceId = <PubKey as Policy>::SERVICE;
    type Request = pubkey::Request;
    type Reply = pubkey::Response;
    type Message = reconfig::Transfer<PubKey>;
    type Change = reconfig::Change<PubKey>;
    type View = dyn Versions<pubkey::Entry>;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: pubkey::Request,
        view: &Self::View,
    ) -> Output<SimNode> {
        if self.behaviour == Behaviour::Silent || !self.started(now) {
            return Output::none();
        }
        if let pubkey::RequestBody::Store(entry) | pubkey::RequestBody::WriteBack(entry) =
            &request.body
        {
            self.first
                .entry(request.key.clone())
                .or_insert_with(|| entry.clone());
        }
        let caught_up = self.catch_up(request.epoch);
        let output = caught_up.and(lift(
            self.inner.on_request(now, client, access, request, view),
        ));
        self.record(&output);
        output
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: reconfig::Transfer<PubKey>,
        view: &Self::View,
    ) -> Output<SimNode> {
        if !self.started(now) {
            return Output::none();
        }
        let caught_up = match &message {
            Transfer::List { epoch, .. } | Transfer::Fetch { epoch, .. }
                if !self.mutations.answer_without_entering =>
            {
                self.catch_up(*epoch)
            }
            Transfer::Hold { epoch, .. } => self.catch_up(*epoch),
            _ => Output::none(),
        };
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        let asked = match &message {
            Transfer::Hold { versions, .. } => versions.clone(),
            _ => Vec::new(),
        };
        let before = self.inner.pulled();
        let mut output = caught_up.and(lift(self.inner.on_message(now, from, message, view)));
        self.record(&output);
        self.lie(&mut output, &asked);
        // A faulty node lies only in its answers: what it takes over, it was handed.
        let after = self.inner.pulled();
        let pulled = (after.0 - before.0, after.1 - before.1);
        self.count(&output, pulled);
        output
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &Self::View) -> Output<SimNode> {
        if self.behaviour == Behaviour::Silent || !self.started(now) {
            return Output::none();
        }
        let output = lift(self.inner.on_timer(now, timer, view));
        self.record(&output);
        self.count(&output, (0, 0));
        output
    }

    fn on_tick(&mut self, now: Time) -> Output<SimNode> {
        if !self.started(now) {
            return Output::none();
        }
        if self.ticked == 0 {
            // Started or restarted: its sweep starts over.
            self.unsettled = now.0;
        }
        self.ticked = now.0;
        let caught_up = self.catch_up(self.learned(now));
        let output = caught_up.and(lift(self.inner.on_tick(now)));
        self.record(&output);
        if !self.inner.settled() {
            self.unsettled = now.0;
        }
        self.count(&output, (0, 0));
        output
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}

/// How many copies of each version a new member takes over the old members may hand over
/// before a run's transfers count as out of proportion: one from each of the `3f+1` old members
/// a pull asks, times [`TRANSFER_RETRIES_MAX`].
pub(crate) fn transfer_copies_max(f: usize) -> u64 {
    (3 * f as u64 + 1) * TRANSFER_RETRIES_MAX
}

/// Answers an old member may give one FETCH: the first, one to a retry that crossed it, and one
/// to a duplicate the network made or to the asker again after it restarted mid-pull.
const TRANSFER_RETRIES_MAX: u64 = 3;

/// What moved between nodes during a run. Versions, not bytes, bound the proportion: a late
/// answer may carry a newer version than the one the pull took (written in the new epoch to an
/// old member that is also a new one), as large as any value.
#[derive(Debug, Default)]
pub struct Transfers {
    /// Versions correct old members handed over in FETCH answers and offers, and their value
    /// bytes.
    handed: (u64, u64),
    /// Of which, value bytes of objects whose group did not change in the epoch asked about.
    handed_unchanged: u64,
    /// Versions new members took over from pulls, and their value bytes.
    pulled: (u64, u64),
}

/// When node `index` starts in a reliable run: at once if the genesis names it, otherwise at
/// its own moment after the epoch that first does.
pub(crate) fn start_of(chain: &Chain, starts: &[u64], index: usize) -> u64 {
    let me = NodeId(index as u32);
    let first = (0..=chain.latest().0).find(|&epoch| {
        chain
            .ring(Epoch(epoch))
            .is_some_and(|ring| ring.contains(me))
    });
    match first {
        Some(0) | None => 0,
        Some(epoch) => {
            let late = Digest::of("bulwark/sim/reconfig/start", &(index as u64).to_be_bytes());
            let late = u64::from_be_bytes(late.0[..8].try_into().unwrap_or_default());
            starts.get(epoch as usize).copied().unwrap_or(0) + late % START_LATE_MAX_MILLIS
        }
    }
}

/// Whether a run is reliable: no faulty node, crash, partition, loss or long delay, so every
/// pull finishes soon after its epoch starts and a new member must take over every write
/// completed before the epoch.
pub(crate) fn reliable(config: &SimConfig) -> bool {
    config.faults.behaviours.is_empty()
        && config.byzantine_servers.unwrap_or(0) == 0
        && [
            Nemesis::Crashes,
            Nemesis::Partitions,
            Nemesis::Loss,
            Nemesis::Reordering,
        ]
        .iter()
        .all(|nemesis| !config.faults.nemeses.contains(nemesis))
}

/// The nodes up at the end of a run, if it ended late enough to judge what they hold: each node
/// up (`state`: in the last epoch with its pulls done, last seen unsettled, last tick) has been
/// so for [`DROPPED_AFTER_MILLIS`], and the last epoch started long enough before for every node
/// to have learnt it and for what moved to be dropped.
pub(crate) fn settled_for_judging<'a, N>(
    servers: &[Option<&'a N>],
    last_start: u64,
    state: impl Fn(&N) -> (bool, u64, u64),
) -> Option<Vec<(usize, &'a N)>> {
    let up: Vec<(usize, &N)> = servers
        .iter()
        .enumerate()
        .filter_map(|(index, server)| server.map(|server| (index, server)))
        .collect();
    let states: Vec<(bool, u64, u64)> = up.iter().map(|(_, server)| state(server)).collect();
    let end = states
        .iter()
        .map(|&(_, _, ticked)| ticked)
        .max()
        .unwrap_or(0);
    let settled = states
        .iter()
        .all(|&(settled, unsettled, _)| settled && end >= unsettled + DROPPED_AFTER_MILLIS)
        && end >= last_start + LEARN_LATE_MAX_MILLIS + DROPPED_AFTER_MILLIS;
    settled.then_some(up)
}

impl<const NODES: usize> ReconfigSim<NODES> {
    /// The nodes up at the end, if every one of them has been in the last epoch, with its pulls
    /// finished, for [`DROPPED_AFTER_MILLIS`]: long enough for what moved to be dropped.
    fn quiet<'a>(&self, servers: &[Option<&'a SimNode>]) -> Option<Vec<(usize, &'a SimNode)>> {
        let latest = self.chain.latest();
        let last_start = self.starts.last().copied().unwrap_or(0);
        settled_for_judging(servers, last_start, |server: &SimNode| {
            let settled = server.inner.epoch() == latest && server.inner.settled();
            (settled, server.unsettled, server.ticked)
        })
    }

    /// In a reliable run, writes a new member lacks after its pull: for each arc a node that
    /// never restarted finished pulling into epoch `E`, and each object on it whose group names
    /// the node from `E` on, the node must hold the last write completed before `E` started, or
    /// a version no older (the value of a write not over before that one began). Old members
    /// that drop a moved object while a late new member has still to pull it leave a hole no
    /// later pull fills, though every member is correct.
    fn untaken(&self, history: &History, servers: &[Option<&SimNode>]) -> Vec<Violation> {
        if !self.reliable {
            return Vec::new();
        }
        let Some(up) = self.quiet(servers) else {
            return Vec::new();
        };
        let latest = self.chain.latest();
        let mut by_key: BTreeMap<&[u8], Vec<&checker::Op>> = BTreeMap::new();
        for op in &history.ops {
            if matches!(op.kind, OpKind::Write(_)) {
                by_key.entry(op.key.as_slice()).or_default().push(op);
            }
        }
        let mut violations = Vec::new();
        for (sim_key, writes) in by_key {
            let Ok(key) = Key::new(Bytes::copy_from_slice(sim_key)) else {
                continue;
            };
            let id = pubkey::object_id(&owner_of(&key).public_key());
            let point = RingPoint::of_key(id.as_bytes());
            for (index, server) in &up {
                if server.restarted || server.behaviour != Behaviour::Honest {
                    continue;
                }
                let me = NodeId(*index as u32);
                for (epoch, arc) in &server.pulled {
                    let stayed = (epoch.0..=latest.0).all(|e| {
                        self.chain
                            .ring(Epoch(e))
                            .is_some_and(|ring| ring.group_at(point).contains(me))
                    });
                    let Some(&start) = self.starts.get(epoch.0 as usize) else {
                        continue;
                    };
                    let last = writes
                        .iter()
                        .filter(|op| op.outcome == Outcome::Ok)
                        .filter(|op| op.complete.is_some_and(|at| at < start))
                        .max_by_key(|op| op.complete);
                    let (Some(last), true, true) = (last, arc.contains(point), stayed) else {
                        continue;
                    };
                    let held = server.inner.stored(&server.stored, &id);
                    let newer_or_same = held.as_ref().is_some_and(|entry| {
                        // A tombstone is `None`; bytes no write made match nothing.
                        let value = match PubKey::value(entry) {
                            Some(bytes) => match history_name(bytes) {
                                Some(name) => Some(name),
                                None => return false,
                            },
                            None => None,
                        };
                        writes.iter().any(|op| {
                            op.kind == OpKind::Write(value.clone())
                                && op.complete.is_none_or(|at| at >= last.invoke)
                        })
                    });
                    if !newer_or_same {
                        violations.push(Violation {
                            key: sim_key.to_vec(),
                            explanation: format!(
                                "node {index} finished pulling into epoch {} without the write \
                                 completed at {} before the epoch started (it holds {})",
                                epoch.0,
                                last.complete.unwrap_or(0),
                                held.map_or("nothing".to_string(), |e| format!("ts {}", e.ts.num))
                            ),
                            conflicting: vec![(*last).clone()],
                        });
                    }
                }
            }
        }
        violations
    }

    /// Versions a correct node still holds outside its groups although `2f+1` correct members
    /// of the key's group hold them or newer, once every correct node up is in the last epoch
    /// (spec §4.8: moved data is dropped once its new group holds it).
    fn undropped(&self, servers: &[Option<&SimNode>]) -> Vec<Violation> {
        let latest = self.chain.latest();
        let Some(up) = self.quiet(servers) else {
            return Vec::new();
        };
        let ring = self.chain.newest();
        let mut violations = Vec::new();
        for (index, server) in &up {
            for (key, ts) in server.inner.moved_keys(&server.stored) {
                let group = ring.group_of(key.as_bytes());
                let holders = group
                    .members()
                    .iter()
                    .filter_map(|member| servers.get(member.0 as usize).copied().flatten())
                    .filter(|member| {
                        member
                            .inner
                            .stored(&member.stored, &key)
                            .is_some_and(|entry| PubKey::ts(&entry) >= ts)
                    })
                    .count();
                if holders > 2 * self.f {
                    violations.push(Violation {
                        key: key.as_bytes().to_vec(),
                        explanation: format!(
                            "node {index} still holds a version its group in epoch {} holds at \
                             {holders} correct members",
                            latest.0
                        ),
                        conflicting: Vec::new(),
                    });
                }
            }
        }
        violations
    }
}

impl<const NODES: usize> Protocol for ReconfigSim<NODES> {
    type Request = pubkey::Request;
    type Response = pubkey::Response;
    type Change = reconfig::Change<PubKey>;
    type Disk = NodeDisk;
    type Server = SimNode;
    type Write = Routed<pubkey::WriteOp>;
    type Read = Routed<pubkey::ReadOp>;

    /// Long enough for the last epoch's pulls to finish, and for the keys that moved away from
    /// a node to be dropped (after [`reconfig::DROP_GRACE_MILLIS`] when a member does not
    /// confirm, and a sweep that kept keys is followed by another within
    /// [`reconfig::DROP_RESWEEP_MAX_MILLIS`]), before the run is judged: with epochs that start
    /// up to half a minute in, most runs are judged settled (187 of the first 200 reliable ones).
    const SETTLE_MILLIS: u64 = 30_000;

    /// Twice a group unless `NODES` says otherwise: room for nodes to join, leave, and for a
    /// whole group to be replaced.
    fn nodes(f: usize) -> usize {
        if NODES == 0 { 2 * (3 * f + 1) } else { NODES }
    }

    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| {
            matches!(
                behaviour,
                Behaviour::Silent | Behaviour::Amnesiac | Behaviour::Stale | Behaviour::Forging
            )
        });
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Self {
        let (rings, starts) = schedule(rng, config.f, Self::nodes(config.f));
        ReconfigSim {
            f: config.f,
            transfers: Arc::default(),
            chain: Arc::new(Chain::new(rings.into_iter().map(Arc::new).collect())),
            starts,
            mutations: config.mutations.transfer,
            reliable: reliable(config),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> SimNode {
        let inner = EpochServer::empty(NodeId(index as u32), self.chain.genesis().clone(), ());
        SimNode::new(inner, self, index, behaviour, seed)
    }

    fn restore(&self, index: usize, disk: &NodeDisk, _now: u64) -> SimNode {
        let mut held = Held::default();
        for (_, entry) in disk.entries.iter() {
            held.keys += 1;
            if let Some(value) = PubKey::value(entry) {
                held.objects += 1;
                held.bytes += value.len() as u64;
            }
        }
        let me = NodeId(index as u32);
        let inner = EpochServer::restore(me, &self.chain, (), held, disk.entered, &disk.pulled);
        let mut node = SimNode::new(inner, self, index, Behaviour::Honest, 0);
        node.restarted = true;
        let entries = disk.entries.iter();
        node.stored = MemoryVersions::holding(entries.map(|(key, e)| (key.clone(), e.clone())));
        node
    }

    fn view(storage: &Storage<Self>) -> &(dyn Versions<pubkey::Entry> + 'static) {
        storage
    }

    fn persist(disk: &mut NodeDisk, change: &reconfig::Change<PubKey>) {
        match change {
            Change::Put { key, entry } => disk.entries.put(key, entry),
            Change::Entered(epoch) => disk.entered = disk.entered.max(*epoch),
            Change::Pulled { epoch, arc } => {
                disk.pulled.insert((*epoch, *arc));
            }
            Change::Drop { key } | Change::Remove { key, .. } => disk.entries.remove(key),
            Change::Own(never) => match *never {},
        }
    }

    fn disk_versions(disk: &NodeDisk) -> usize {
        disk.entries.len()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> Self::Write {
        let owner = owner_of(&key);
        let id = pubkey::object_id(&owner.public_key());
        let inner = pubkey::WriteOp::new(
            pubkey::ClientConfig::new(self.f),
            op,
            ClientId(client as u32),
            op.0,
            owner,
            value,
        );
        routed(inner, &id, self.chain.clone(), Epoch(0))
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> Self::Read {
        let id = pubkey::object_id(&owner_of(&key).public_key());
        let inner = pubkey::ReadOp::new(pubkey::ClientConfig::new(self.f), id.clone(), op);
        routed(inner, &id, self.chain.clone(), Epoch(0))
    }

    fn response_op(response: &pubkey::Response) -> OpId {
        response.op
    }

    fn request_name(request: &pubkey::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &pubkey::Request) -> usize {
        kind(request)
    }

    fn describe_request(request: &pubkey::Request) -> String {
        format!("e{} {}", request.epoch.0, describe_request(request))
    }

    fn describe_response(response: &pubkey::Response) -> String {
        format!("e{} {}", response.epoch.0, describe_response(response))
    }

    /// Linearizability, and transfers in proportion to the data whose group changed: the
    /// correct nodes up at the end handed over at most [`transfer_copies_max`] copies of it.
    fn check(&self, history: &History, servers: &[Option<&SimNode>]) -> Report {
        let mut report = checker::check(history);
        report.violations.extend(self.undropped(servers));
        report.violations.extend(self.untaken(history, servers));
        report.ok &= report.violations.is_empty();
        let Ok(transfers) = self.transfers.lock() else {
            return report;
        };
        if transfers.handed_unchanged > 0 {
            report.ok = false;
            report.violations.push(Violation {
                key: b"(transfers)".to_vec(),
                explanation: format!(
                    "correct nodes handed over {} bytes of objects whose group did not change",
                    transfers.handed_unchanged
                ),
                conflicting: Vec::new(),
            });
        }
        let (handed, pulled) = (transfers.handed.0, transfers.pulled.0);
        // A new member that crashes mid-pull was handed the versions it was fetching (a
        // window's worth) without taking them over; it fetches them again after its restart.
        let bound = transfer_copies_max(self.f) * (pulled + FETCH_WINDOW as u64);
        if handed > bound {
            report.ok = false;
            report.violations.push(Violation {
                key: b"(transfers)".to_vec(),
                explanation: format!(
                    "correct nodes handed over {handed} versions ({} bytes) for {pulled} taken \
                     over ({} bytes): more than {bound}",
                    transfers.handed.1, transfers.pulled.1
                ),
                conflicting: Vec::new(),
            });
        }
        report
    }

    fn describe_message(message: &reconfig::Transfer<PubKey>) -> String {
        match message {
            Transfer::List { epoch, after, .. } => {
                format!("list e{} after={}", epoch.0, after.is_some())
            }
            Transfer::Listed {
                epoch, keys, more, ..
            } => format!("listed e{} keys={} more={more}", epoch.0, keys.len()),
            Transfer::Fetch { epoch, key, held } => {
                format!("fetch e{} key={key} held={}", epoch.0, held.is_some())
            }
            Transfer::NoNewer { epoch, key } => format!("no-newer e{} key={key}", epoch.0),
            Transfer::Undecided { epoch, key } => format!("undecided e{} key={key}", epoch.0),
            Transfer::Fetched { epoch, key, entry } => format!(
                "fetched e{} key={key} ts={}",
                epoch.0,
                entry.as_ref().map_or(0, |entry| entry.ts.num)
            ),
            Transfer::Hold { epoch, versions } => {
                format!("hold? e{} keys={}", epoch.0, versions.len())
            }
            Transfer::Held {
                epoch, versions, ..
            } => {
                format!("held e{} keys={}", epoch.0, versions.len())
            }
            Transfer::Offer { epoch, key, entry } => {
                format!("offer e{} key={key} ts={}", epoch.0, entry.ts.num)
            }
            Transfer::Peer { message, .. } => match *message {},
        }
    }
}

/// A node's versions as its driver shows them: the disk, then the changes on their way to it.
impl<const NODES: usize> Versions<pubkey::Entry> for Storage<ReconfigSim<NODES>> {
    fn version(&self, key: &Key) -> Option<pubkey::Entry> {
        let mut found = self.durable.entries.get(key).cloned();
        for change in self.pending() {
            match change {
                Change::Put { key: put, entry } if put == key => found = Some(entry.clone()),
                Change::Drop { key: gone } | Change::Remove { key: gone, .. } if gone == key => {
                    found = None;
                }
                _ => {}
            }
        }
        found
    }

    fn keys(&self, resume: Resume<'_>, limit: usize) -> Vec<Key> {
        let mut keys: BTreeSet<Key> = self
            .durable
            .entries
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        for change in self.pending() {
            match change {
                Change::Put { key, .. } => {
                    keys.insert(key.clone());
                }
                Change::Drop { key } | Change::Remove { key, .. } => {
                    keys.remove(key);
                }
                Change::Entered(_) | Change::Pulled { .. } => {}
                Change::Own(never) => match *never {},
            }
        }
        keys_after::<Registers<PubKey>>(keys, resume, limit)
    }
}
