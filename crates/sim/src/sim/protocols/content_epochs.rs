//! Content-hash objects across reconfigurations (Rosebud §4.3, §4.7, §4.8): a cluster of
//! `2(3f+1)` nodes (or fifty), some of them members, whose certified configuration changes
//! several times during the run, every node hosting the real epoch-following content replica
//! ([`Contents`] on the transfer engine), and every client operation a [`Routed`] write or read
//! that starts in the genesis epoch and follows the replicas into newer ones. Each object's
//! history is checked as Rosebud promises ([`check_objects`]): once its creation completed,
//! every later read returns it, and no read returns other bytes.
//!
//! The schedule of epochs and the way nodes learn them are the register simulation's
//! ([`super::reconfig`]). Faulty nodes lie to clients as the static content simulation's do, and
//! to the nodes that take objects over from them or ask whether they hold them: they withhold
//! (list nothing, hand over nothing), list ids nobody wrote, hand over damaged fragments, deny
//! holding what they hold (a premature null), and say they hold whatever they are asked about.

use super::content::{check_objects, object_of};
use super::reconfig::{
    learned, learns, reliable, schedule, settled_for_judging, start_of, transfer_copies_max,
};
use crate::byzantine::Behaviour;
use crate::checker::{History, OpKind, Outcome, Report, Violation};
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::membership::{Arc as RingArc, Chain, RingPoint};
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Digest, Epoch, Key, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::content::epochs::{Contents, Piece, Pieces, id_of, key_of};
use bulwark_protocol::content::{
    ContentId, Encoded, ReadOp, Request, RequestBody, Response, ResponseBody, WriteOp,
};
use bulwark_protocol::machine::{Access, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::round::OpId;
use bulwark_protocol::transfer::{
    Change, EpochHost, FETCH_WINDOW, LIST_PAGE_KEYS, Message, Routed, Transfer, TransferMutations,
};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// One run's cluster: the chain of configurations (with every node's key) and when each epoch
/// starts. `NODES` nodes in all, members or not; 0 means twice a group, `2(3f+1)`.
pub struct ContentEpochsSim<const NODES: usize = 0> {
    f: usize,
    secrets: Vec<SecretKey>,
    chain: Arc<Chain>,
    starts: Vec<u64>,
    codec: Arc<dyn ErasureCodec>,
    mutations: TransferMutations,
    transfers: Arc<Mutex<Transfers>>,
    /// Each key's object, cut once.
    encoded: RefCell<BTreeMap<Key, Encoded>>,
    /// No faulty node, crash, partition, loss or long delay: nodes that join start late, and
    /// every new member must take over every object created before its epoch.
    reliable: bool,
}

/// Fifty nodes: many groups, each reconfiguration moving a small part of the ring.
pub type ScaleContentEpochsSim = ContentEpochsSim<50>;

/// One node's disk: every fragment it stored, by object and index; the newest epoch it entered;
/// the arcs it finished pulling.
#[derive(Default)]
pub struct EpochsDisk {
    pieces: BTreeMap<(Key, u32), Piece>,
    entered: Epoch,
    pulled: BTreeSet<(Epoch, RingArc)>,
}

/// What moved between nodes during a run.
#[derive(Debug, Default)]
pub struct Transfers {
    /// Fragments correct old members handed over, and their bytes.
    handed: (u64, u64),
    /// Of which, bytes of objects whose group kept its order in the epoch asked about.
    handed_unchanged: u64,
    /// Fragments new members took over, and their bytes.
    pulled: (u64, u64),
}

/// A node: the real machine, and how it lies and learns configurations in this world.
pub struct ContentNode {
    inner: EpochHost<Contents>,
    behaviour: Behaviour,
    rng: ChaCha8Rng,
    chain: Arc<Chain>,
    learns: Vec<u64>,
    ticked: u64,
    unsettled: u64,
    mutations: TransferMutations,
    transfers: Arc<Mutex<Transfers>>,
    /// What it stored, as its own changes said (rebuilt from the disk on restart): the indices
    /// of the fragments it holds of each object.
    stored: BTreeMap<Key, BTreeSet<u32>>,
    /// The arcs it finished pulling, into which epoch, since it started.
    pulled: BTreeSet<(Epoch, RingArc)>,
    /// Restarted from its disk: its pulls may have waited on its restart.
    restarted: bool,
    /// Before this moment the node has not started: it hears and does nothing.
    starts_at: u64,
}

impl ContentNode {
    /// Whether the node has started by `now`.
    fn started(&self, now: Time) -> bool {
        now.0 >= self.starts_at
    }

    /// Enters every epoch up to `epoch`, one at a time.
    fn catch_up(&mut self, epoch: Epoch) -> Output<ContentNode> {
        let mut output = Output::none();
        while self.inner.epoch() < epoch.min(self.chain.latest()) {
            let next = Epoch(self.inner.epoch().0 + 1);
            let Some(ring) = self.chain.ring(next) else {
                break;
            };
            output = output.and(self.inner.enter(ring.clone()).retyped());
        }
        output
    }

    /// Keeps the mirror of what it stores up to date with `output`'s changes.
    fn note(&mut self, output: &Output<ContentNode>) {
        for change in &output.changes {
            match change {
                Change::Put { key, entry } => {
                    self.stored
                        .entry(key.clone())
                        .or_default()
                        .insert(entry.index);
                }
                Change::Remove { key, entry } => {
                    if let Some(indices) = self.stored.get_mut(key) {
                        indices.remove(&entry.index);
                        if indices.is_empty() {
                            self.stored.remove(key);
                        }
                    }
                }
                Change::Drop { key } => {
                    self.stored.remove(key);
                }
                Change::Pulled { epoch, arc } => {
                    self.pulled.insert((*epoch, *arc));
                }
                Change::Entered(_) => {}
                Change::Own(never) => match *never {},
            }
        }
    }

    /// What a faulty node makes of its honest answers to clients.
    fn lie_to_client(&mut self, output: &mut Output<ContentNode>, fetch: bool) {
        match self.behaviour {
            // Acknowledges with a genuine signature without storing anything.
            Behaviour::Forging if !fetch => output.changes.clear(),
            Behaviour::Corrupting => {
                if let Some(Response {
                    body: ResponseBody::Fragment { fragment, .. },
                    ..
                }) = &mut output.reply
                    && !fragment.is_empty()
                {
                    *fragment = flipped(fragment, &mut self.rng);
                }
            }
            Behaviour::Amnesiac | Behaviour::Stale if fetch => {
                if let Some(reply) = &mut output.reply
                    && matches!(reply.body, ResponseBody::Fragment { .. })
                {
                    reply.body = ResponseBody::Missing;
                }
            }
            _ => {}
        }
    }

    /// What a faulty node makes of its honest answers to other nodes: `asked` is the keys of a
    /// question whether it holds what moved.
    fn lie_to_nodes(&mut self, output: &mut Output<ContentNode>, asked: &[(Key, ())]) {
        for (_, message) in &mut output.sends {
            // Says it is still taking over what it holds, so that a pull never decides from its
            // answer, and yet counts its asker as caught up.
            // A premature null, also where it holds nothing newer than the asker.
            if let (Behaviour::Amnesiac | Behaviour::Stale, Transfer::NoNewer { epoch, key }) =
                (self.behaviour, &*message)
            {
                *message = Transfer::Fetched {
                    epoch: *epoch,
                    key: key.clone(),
                    entry: None,
                };
                continue;
            }
            if let (Behaviour::Stale, Transfer::Fetched { epoch, key, .. }) =
                (self.behaviour, &*message)
                && key.as_bytes().first().is_some_and(|byte| byte % 2 == 1)
            {
                *message = Transfer::Undecided {
                    epoch: *epoch,
                    key: key.clone(),
                };
                continue;
            }
            match (self.behaviour, message) {
                // Says it holds everything, so that old members drop what it lacks.
                (
                    Behaviour::Amnesiac | Behaviour::Stale | Behaviour::Forging,
                    Transfer::Held {
                        versions,
                        denied,
                        pending,
                        ..
                    },
                ) => {
                    *versions = asked.to_vec();
                    denied.clear();
                    pending.clear();
                }
                // Withholds: lists nothing, hands nothing over.
                (Behaviour::Amnesiac, Transfer::Listed { keys, more, .. }) => {
                    keys.clear();
                    *more = false;
                }
                // A premature null: lists honestly, then denies holding.
                (Behaviour::Amnesiac | Behaviour::Stale, Transfer::Fetched { entry, .. }) => {
                    *entry = None;
                }

                (Behaviour::Corrupting | Behaviour::Forging, Transfer::Fetched { entry, .. }) => {
                    if let Some(piece) = entry
                        && !piece.fragment.is_empty()
                    {
                        piece.fragment = flipped(&piece.fragment, &mut self.rng);
                    }
                }
                // Lists ids nobody wrote.
                (
                    Behaviour::Forging,
                    Transfer::Listed {
                        arc, after, keys, ..
                    },
                ) => {
                    for _ in 0..16 {
                        let bogus = key_of(&ContentId(Digest(self.rng.random())));
                        let fits = id_of(&bogus)
                            .is_some_and(|id| arc.contains(RingPoint::of_key(id.as_bytes())))
                            && after.as_ref().is_none_or(|after| bogus > *after)
                            && keys.last().is_none_or(|last| bogus < *last)
                            && keys.len() < LIST_PAGE_KEYS;
                        if fits {
                            keys.push(bogus);
                            keys.sort_unstable();
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Counts what this node took over, and what it hands over in `output` if it is correct.
    fn count(&self, output: &Output<ContentNode>, pulled: (u64, u64)) {
        let Ok(mut transfers) = self.transfers.lock() else {
            return;
        };
        transfers.pulled.0 += pulled.0;
        transfers.pulled.1 += pulled.1;
        if self.behaviour != Behaviour::Honest {
            return;
        }
        for (_, message) in &output.sends {
            let Transfer::Fetched {
                epoch,
                key,
                entry: Some(piece),
            } = message
            else {
                continue;
            };
            let size = piece.fragment.len() as u64;
            transfers.handed.0 += 1;
            transfers.handed.1 += size;
            let group = |epoch: u64| {
                let ring = self.chain.ring(Epoch(epoch))?;
                Some(ring.group_at(RingPoint::of_key(id_of(key)?.as_bytes())))
            };
            if epoch.0 > 0
                && group(epoch.0 - 1).map(|g| g.members().to_vec())
                    == group(epoch.0).map(|g| g.members().to_vec())
            {
                transfers.handed_unchanged += size;
            }
        }
    }
}

/// `fragment` with one bit flipped.
fn flipped(fragment: &Bytes, rng: &mut ChaCha8Rng) -> Bytes {
    let mut bad = fragment.to_vec();
    let at = rng.random_range(0..bad.len());
    bad[at] ^= 1 << rng.random_range(0..8);
    Bytes::from(bad)
}

impl Replica for ContentNode {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Message = Message<Contents>;
    type Change = Change<Piece>;
    type View = dyn Pieces;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        view: &(dyn Pieces + 'static),
    ) -> Output<ContentNode> {
        if self.behaviour == Behaviour::Silent || !self.started(now) {
            return Output::none();
        }
        let fetch = matches!(request.body, RequestBody::Fetch);
        let caught_up = self.catch_up(request.epoch);
        let mut output = caught_up.and(
            self.inner
                .on_request(now, client, access, request, view)
                .retyped(),
        );
        self.lie_to_client(&mut output, fetch);
        self.note(&output);
        output
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<Contents>,
        view: &(dyn Pieces + 'static),
    ) -> Output<ContentNode> {
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
        let mut output = caught_up.and(self.inner.on_message(now, from, message, view).retyped());
        self.lie_to_nodes(&mut output, &asked);
        self.note(&output);
        let after = self.inner.pulled();
        self.count(&output, (after.0 - before.0, after.1 - before.1));
        output
    }

    fn on_timer(
        &mut self,
        now: Time,
        timer: TimerId,
        view: &(dyn Pieces + 'static),
    ) -> Output<ContentNode> {
        if self.behaviour == Behaviour::Silent || !self.started(now) {
            return Output::none();
        }
        let output: Output<ContentNode> = self.inner.on_timer(now, timer, view).retyped();
        self.note(&output);
        output
    }

    fn on_tick(&mut self, now: Time) -> Output<ContentNode> {
        if !self.started(now) {
            return Output::none();
        }
        if self.ticked == 0 {
            self.unsettled = now.0;
        }
        self.ticked = now.0;
        let caught_up = self.catch_up(learned(&self.learns, now));
        let output = caught_up.and(self.inner.on_tick(now).retyped());
        if !self.inner.settled() {
            self.unsettled = now.0;
        }
        output
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}

impl<const NODES: usize> ContentEpochsSim<NODES> {
    fn encoded(&self, key: &Key) -> Encoded {
        let n = 3 * self.f + 1;
        self.encoded
            .borrow_mut()
            .entry(key.clone())
            .or_insert_with(|| {
                Encoded::new(&*self.codec, n, self.f, &object_of(key.as_bytes())).unwrap_or_else(
                    |error| unreachable!("a simulated object is within bounds: {error}"),
                )
            })
            .clone()
    }

    fn node(
        &self,
        index: usize,
        behaviour: Behaviour,
        seed: u64,
        inner: EpochHost<Contents>,
    ) -> ContentNode {
        ContentNode {
            inner: inner.with_mutations(self.mutations),
            behaviour,
            rng: ChaCha8Rng::seed_from_u64(seed),
            chain: self.chain.clone(),
            learns: learns(&self.starts, index),
            ticked: 0,
            unsettled: 0,
            mutations: self.mutations,
            transfers: self.transfers.clone(),
            stored: BTreeMap::new(),
            pulled: BTreeSet::new(),
            restarted: false,
            starts_at: if self.reliable {
                start_of(&self.chain, &self.starts, index)
            } else {
                0
            },
        }
    }

    fn contents(&self, index: usize, objects: u64, bytes: u64) -> Contents {
        Contents::new(
            NodeId(index as u32),
            self.chain.genesis().clone(),
            self.secrets[index].clone(),
            self.codec.clone(),
            objects,
            bytes,
        )
        .with_mutations(self.mutations)
    }

    /// The nodes up at the end, if every one of them has been in the last epoch, with its pulls
    /// finished, long enough for what moved to be dropped.
    fn quiet<'a>(
        &self,
        servers: &[Option<&'a ContentNode>],
    ) -> Option<Vec<(usize, &'a ContentNode)>> {
        let latest = self.chain.latest();
        let last_start = self.starts.last().copied().unwrap_or(0);
        settled_for_judging(servers, last_start, |server: &ContentNode| {
            let settled = server.inner.epoch() == latest && server.inner.settled();
            (settled, server.unsettled, server.ticked)
        })
    }

    /// In a reliable run, objects a new member lacks after its pull: for each arc a node that
    /// never restarted finished pulling into epoch `E`, and each object on it whose group names
    /// the node from `E` on and whose creation completed before `E` started, the node must hold
    /// the fragment of its slot in the last epoch. Old members that drop a moved object while a
    /// late new member has still to pull it leave the object a fragment short for good, though
    /// every member is correct.
    fn untaken(&self, history: &History, servers: &[Option<&ContentNode>]) -> Vec<Violation> {
        if !self.reliable {
            return Vec::new();
        }
        let Some(up) = self.quiet(servers) else {
            return Vec::new();
        };
        let latest = self.chain.latest();
        let ring = self.chain.newest();
        let mut created: BTreeMap<&[u8], u64> = BTreeMap::new();
        for op in &history.ops {
            if let (OpKind::Write(_), Outcome::Ok, Some(at)) = (&op.kind, &op.outcome, op.complete)
            {
                let first = created.entry(op.key.as_slice()).or_insert(at);
                *first = (*first).min(at);
            }
        }
        let mut violations = Vec::new();
        for (sim_key, created) in created {
            let Ok(key) = Key::new(Bytes::copy_from_slice(sim_key)) else {
                continue;
            };
            let id = self.encoded(&key).id;
            let stored = key_of(&id);
            let point = RingPoint::of_key(id.as_bytes());
            for (index, server) in &up {
                let me = NodeId(*index as u32);
                let Some(slot) = ring.group_at(point).slot_of(me) else {
                    continue;
                };
                if server.restarted || server.behaviour != Behaviour::Honest {
                    continue;
                }
                for (epoch, arc) in &server.pulled {
                    let stayed = (epoch.0..=latest.0).all(|e| {
                        self.chain
                            .ring(Epoch(e))
                            .is_some_and(|ring| ring.group_at(point).contains(me))
                    });
                    let before = self
                        .starts
                        .get(epoch.0 as usize)
                        .is_some_and(|&start| created < start);
                    if !(arc.contains(point) && stayed && before) {
                        continue;
                    }
                    let held = server.stored.get(&stored);
                    if !held.is_some_and(|indices| indices.contains(&slot.0)) {
                        violations.push(Violation {
                            key: sim_key.to_vec(),
                            explanation: format!(
                                "node {index} finished pulling into epoch {} without its \
                                 fragment {} of an object created at {created}, before the \
                                 epoch started (it holds {held:?})",
                                epoch.0, slot.0
                            ),
                            conflicting: Vec::new(),
                        });
                    }
                }
            }
        }
        violations
    }

    /// Objects a correct node still holds (outside its groups, or of another slot than its
    /// own) that `2f+1` correct members of the object's group hold at their slots, once every
    /// correct node up is in the last epoch with its pulls done (spec §4.8).
    fn undropped(&self, servers: &[Option<&ContentNode>]) -> Vec<Violation> {
        let latest = self.chain.latest();
        let Some(up) = self.quiet(servers) else {
            return Vec::new();
        };
        let ring = self.chain.newest();
        let mut violations = Vec::new();
        for (index, server) in &up {
            for (key, indices) in &server.stored {
                let Some(id) = id_of(key) else {
                    continue;
                };
                let group = ring.group_at(RingPoint::of_key(id.as_bytes()));
                let slot = group.slot_of(NodeId(*index as u32));
                if slot.is_some_and(|slot| indices.iter().all(|index| *index == slot.0)) {
                    continue;
                }
                let holders = group
                    .members()
                    .iter()
                    .filter(|member| {
                        let Some(member_slot) = group.slot_of(**member) else {
                            return false;
                        };
                        servers
                            .get(member.0 as usize)
                            .copied()
                            .flatten()
                            .is_some_and(|node| {
                                node.stored
                                    .get(key)
                                    .is_some_and(|held| held.contains(&member_slot.0))
                            })
                    })
                    .count();
                if holders > 2 * self.f {
                    violations.push(Violation {
                        key: key.as_bytes().to_vec(),
                        explanation: format!(
                            "node {index} still holds fragments {indices:?} of an object its \
                             group in epoch {} holds at {holders} correct members",
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

impl<const NODES: usize> Protocol for ContentEpochsSim<NODES> {
    type Request = Request;
    type Response = Response;
    type Change = Change<Piece>;
    type Disk = EpochsDisk;
    type Server = ContentNode;
    type Write = Routed<WriteOp>;
    type Read = Routed<ReadOp>;

    /// Long enough for the last epoch's pulls to finish and for moved objects to be dropped
    /// (after the wait for members that do not confirm).
    const SETTLE_MILLIS: u64 = 12_000;

    fn nodes(f: usize) -> usize {
        if NODES == 0 { 2 * (3 * f + 1) } else { NODES }
    }

    /// Faulty nodes lie as old members, as new members and to clients; writers do not crash
    /// (a writer that dies having reached fewer than `f+1` members leaves an object no read can
    /// rebuild or deny, see the static simulation) and readers change nothing on a replica.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| {
            matches!(
                behaviour,
                Behaviour::Silent
                    | Behaviour::Amnesiac
                    | Behaviour::Stale
                    | Behaviour::Forging
                    | Behaviour::Corrupting
            )
        });
        faults.nemeses.remove(&Nemesis::ClientCrashes);
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Self {
        let nodes = Self::nodes(config.f);
        let (rings, starts) = schedule(rng, config.f, nodes);
        let secrets: Vec<SecretKey> = (0..nodes)
            .map(|_| SecretKey::from_seed(&rng.random()))
            .collect();
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| (NodeId(index as u32), secret.public_key()));
        let chain = Chain::new(rings.into_iter().map(Arc::new).collect()).with_keys(keys);
        ContentEpochsSim {
            f: config.f,
            secrets,
            chain: Arc::new(chain),
            starts,
            codec: Arc::new(ReedSolomonSimd),
            mutations: config.mutations.transfer,
            transfers: Arc::default(),
            encoded: RefCell::new(BTreeMap::new()),
            reliable: reliable(config),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> ContentNode {
        let inner = EpochHost::new(
            NodeId(index as u32),
            self.chain.genesis().clone(),
            self.contents(index, 0, 0),
        );
        self.node(index, behaviour, seed, inner)
    }

    fn restore(&self, index: usize, disk: &EpochsDisk, _now: u64) -> ContentNode {
        let objects = disk
            .pieces
            .keys()
            .map(|(key, _)| key)
            .collect::<BTreeSet<_>>()
            .len() as u64;
        let bytes = disk.pieces.values().map(|p| p.fragment.len() as u64).sum();
        let inner = EpochHost::resume(
            NodeId(index as u32),
            &self.chain,
            self.contents(index, objects, bytes),
            disk.entered,
            &disk.pulled,
        );
        let mut node = self.node(index, Behaviour::Honest, 0, inner);
        node.restarted = true;
        for (key, index) in disk.pieces.keys() {
            node.stored.entry(key.clone()).or_default().insert(*index);
        }
        node
    }

    fn view(storage: &Storage<Self>) -> &(dyn Pieces + 'static) {
        storage
    }

    fn persist(disk: &mut EpochsDisk, change: &Change<Piece>) {
        match change {
            Change::Put { key, entry } => {
                disk.pieces
                    .insert((key.clone(), entry.index), entry.clone());
            }
            Change::Remove { key, entry } => {
                disk.pieces.remove(&(key.clone(), entry.index));
            }
            Change::Drop { key } => disk.pieces.retain(|(held, _), _| held != key),
            Change::Entered(epoch) => disk.entered = disk.entered.max(*epoch),
            Change::Pulled { epoch, arc } => {
                disk.pulled.insert((*epoch, *arc));
            }
            Change::Own(never) => match *never {},
        }
    }

    fn disk_versions(disk: &EpochsDisk) -> usize {
        disk.pieces.len()
    }

    fn write(
        &self,
        _client: usize,
        key: Key,
        op: OpId,
        _value: Option<Bytes>,
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> Routed<WriteOp> {
        let encoded = self.encoded(&key);
        let point = RingPoint::of_key(encoded.id.as_bytes());
        let view = self.chain.genesis().group_at(point);
        let keys = view
            .members()
            .iter()
            .map(|node| self.secrets[node.0 as usize].public_key())
            .collect();
        let place = bulwark_protocol::content::Place {
            slot: Slot(0),
            n: view.len(),
            f: self.f,
            epoch: view.epoch(),
            group: view.id(),
        };
        let inner = WriteOp::new(place, keys, op, encoded)
            .unwrap_or_else(|error| unreachable!("keys and fragments fit the group: {error}"));
        Routed::new(inner, point, self.chain.clone(), Epoch(0))
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> Routed<ReadOp> {
        let id = self.encoded(&key).id;
        let point = RingPoint::of_key(id.as_bytes());
        let view = self.chain.genesis().group_at(point);
        let place = bulwark_protocol::content::Place {
            slot: Slot(0),
            n: view.len(),
            f: self.f,
            epoch: view.epoch(),
            group: view.id(),
        };
        let inner = ReadOp::new(place, self.codec.clone(), op, id);
        Routed::new(inner, point, self.chain.clone(), Epoch(0))
    }

    fn response_op(response: &Response) -> OpId {
        response.op
    }

    fn request_name(request: &Request) -> &'static str {
        match request.body {
            RequestBody::Store { .. } => "store-ch",
            RequestBody::Fetch => "fetch-ch",
            RequestBody::Delete => "delete-ch",
        }
    }

    fn request_kind(request: &Request) -> usize {
        match request.body {
            RequestBody::Store { .. } => 1,
            RequestBody::Fetch => 3,
            RequestBody::Delete => 2,
        }
    }

    fn describe_request(request: &Request) -> String {
        format!(
            "e{} {} id={:?} op{}",
            request.epoch.0,
            Self::request_name(request),
            request.id,
            request.op.0
        )
    }

    fn describe_response(response: &Response) -> String {
        let detail = match &response.body {
            ResponseBody::Stored(_) => "stored".to_string(),
            ResponseBody::Fragment { fragment, .. } => format!("fragment {}B", fragment.len()),
            ResponseBody::Missing => "missing".to_string(),
            ResponseBody::Deleted => "deleted".to_string(),
            ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
        };
        format!("{detail} op{}", response.op.0)
    }

    fn describe_message(message: &Message<Contents>) -> String {
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
                "fetched e{} key={key} index={:?}",
                epoch.0,
                entry.as_ref().map(|piece| piece.index)
            ),
            Transfer::Hold { epoch, versions } => {
                format!("hold? e{} keys={}", epoch.0, versions.len())
            }
            Transfer::Held {
                epoch,
                versions,
                denied,
                pending,
            } => format!(
                "held e{} keys={} denied={} pending={}",
                epoch.0,
                versions.len(),
                denied.len(),
                pending.len()
            ),
            Transfer::Offer { epoch, key, .. } => format!("offer e{} key={key}", epoch.0),
            Transfer::Peer { message, .. } => match *message {},
        }
    }

    /// Rosebud's promise for every object, moved objects dropped once their group holds them,
    /// and transfers in proportion to the objects whose group changed.
    fn check(&self, history: &History, servers: &[Option<&ContentNode>]) -> Report {
        let mut report = check_objects(history);
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
        let bound = transfer_copies_max(self.f) * (pulled + FETCH_WINDOW as u64);
        if handed > bound {
            report.ok = false;
            report.violations.push(Violation {
                key: b"(transfers)".to_vec(),
                explanation: format!(
                    "correct nodes handed over {handed} fragments ({} bytes) for {pulled} taken \
                     over ({} bytes): more than {bound}",
                    transfers.handed.1, transfers.pulled.1
                ),
                conflicting: Vec::new(),
            });
        }
        report
    }
}

/// A node reads what it stored back from the disk, or from batches still on their way.
impl<const NODES: usize> Pieces for Storage<ContentEpochsSim<NODES>> {
    fn pieces(&self, key: &Key) -> Vec<Piece> {
        let mut pieces: BTreeMap<u32, Option<Piece>> = self
            .durable
            .pieces
            .range((key.clone(), 0)..=(key.clone(), u32::MAX))
            .map(|((_, index), piece)| (*index, Some(piece.clone())))
            .collect();
        for change in self.pending() {
            match change {
                Change::Put { key: put, entry } if put == key => {
                    pieces.insert(entry.index, Some(entry.clone()));
                }
                Change::Remove {
                    key: removed,
                    entry,
                } if removed == key => {
                    pieces.insert(entry.index, None);
                }
                Change::Drop { key: dropped } if dropped == key => pieces.clear(),
                _ => {}
            }
        }
        pieces.into_values().flatten().collect()
    }

    fn objects_after(&self, after: Option<&Key>, limit: usize) -> Vec<(Key, Vec<u32>)> {
        let mut objects: BTreeMap<Key, BTreeSet<u32>> = BTreeMap::new();
        for (key, index) in self.durable.pieces.keys() {
            objects.entry(key.clone()).or_default().insert(*index);
        }
        for change in self.pending() {
            match change {
                Change::Put { key, entry } => {
                    objects.entry(key.clone()).or_default().insert(entry.index);
                }
                Change::Remove { key, entry } => {
                    if let Some(indices) = objects.get_mut(key) {
                        indices.remove(&entry.index);
                    }
                }
                Change::Drop { key } => {
                    objects.remove(key);
                }
                _ => {}
            }
        }
        objects
            .into_iter()
            .filter(|(key, indices)| after.is_none_or(|after| key > after) && !indices.is_empty())
            .take(limit)
            .map(|(key, indices)| (key, indices.into_iter().collect()))
            .collect()
    }
}
