//! The catalogue of Byzantine configuration-service replicas: wrappers around a real PBFT replica
//! of the configuration service ([`PbftReplica<ConfigService>`]) that bend what it sends.
//!
//! Unlike the storage catalogue, these replicas talk to their peers, and most of what they can
//! do wrong is said to them: a replica holds its own signing key and nothing else, so it may
//! sign anything as itself, replay or re-target what others signed, and claim others signed
//! what they did not (which their keys then refuse). Each behaviour keeps the honest replica
//! running underneath, so it follows the protocol closely enough to be taken seriously, and
//! lies in one way:
//!
//! - [`Behaviour::Silent`]: from a seeded moment on (often the start), says nothing at all.
//! - [`Behaviour::EquivocatingPrimary`]: as primary, sends one batch to some backups and another
//!   (a shifted clock reading, reordered or dropped requests, an empty batch, an extra request)
//!   to the others, for the same sequence number, both signed.
//! - [`Behaviour::ForgedViewChange`]: its VIEW-CHANGEs carry, for the highest view they may name,
//!   a prepared certificate with forged prepares (another replica's slot over its own signature),
//!   re-targeted ones (genuine prepares of another batch or number) or a genuine pre-prepare
//!   whose batch was swapped; or, just as often, no prepared certificates at all (a lie by
//!   omission nobody can detect, which PBFT must and does survive). As the new primary, its
//!   NEW-VIEW carries such a forged view change, or re-proposes a batch the view changes do not
//!   imply, or is a valid one chosen to lose as much as possible: its own view change stripped
//!   of certificates plus the others' that carry the fewest, no more than the quorum. Now and
//!   then it asks for a view change nobody else wants.
//! - [`Behaviour::EarlyStop`]: as primary, slips a STOP into its batches with a clock reading far
//!   in the future, at the epoch's due time while it is not, or early but within the tolerance;
//!   as any replica, submits STOP long before the epoch is due.
//! - [`Behaviour::ForgedEvict`]: submits EVICTs, and slips them into its batches as primary, with
//!   `2f_cs` genuine agreements (correct replicas may have agreed, on evidence, short of a
//!   quorum), or with a forged, duplicated, replayed or outsider's agreement added.
//! - [`Behaviour::SkewedClock`]: honest in every message, but its clock runs a seeded 1.5 to 6
//!   STOP tolerances fast or slow (Rosebud §7.2: "slow clocks delay STOP but stay safe"). As
//!   primary its STOP readings are refused by correct backups, so the epoch ends only after a
//!   view change; as a backup it refuses correct STOPs, which the other `2f_cs+1` carry alone.
//!
//! Correct replicas must refuse every one of these that breaks a rule (and survive the ones that
//! do not), and the configuration service's checker (`sim::protocols::cs`) must stay green with
//! up to `f_cs` of them. The valid-but-worst-case view changes are also what make the negative
//! control with quorums of `2f` fail: a Byzantine replica plus `f` correct ones that prepared
//! nothing then form a new view that forgets a committed batch.

use super::Behaviour;
use bulwark_core::configuration::Configuration;
use bulwark_core::sign::{PublicKey, SecretKey, Signable, Signed, Unverified};
use bulwark_core::{ClientId, Digest, Epoch, NodeId, ServiceId, Slot, Time, wire};
use bulwark_protocol::cs::{ConfigService, EvictVote, Op, Outcome};
use bulwark_protocol::machine::{Access, Attested, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::pbft::{
    Answer, Batch, Cast, Change, Message, NewView, Origin, Params, PbftReplica, Phase,
    PreparedProof, Request, Submitted, ViewChange, Vote,
};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};

/// A signed pre-prepare with its batch.
type Proposal = (Cast<Vote>, Batch<Op>);
/// The other batch an equivocating primary proposes, and the backups that get it.
type Equivocation = (Cast<Vote>, Batch<Op>, Vec<Slot>);

/// Another replica's view change as a NEW-VIEW candidate: how many prepared certificates it
/// carries, the highest number they name, the signed change and what it says.
type Candidate = (usize, u64, Cast<ViewChange<Op>>, ViewChange<Op>);

/// Genuine messages of others a forger keeps to re-target, at most.
const SNOOPED_MAX: usize = 32;
/// Ids of requests a Byzantine replica makes up start here, far above the honest replica's.
const OWN_IDS: u64 = 1 << 40;

/// What a Byzantine replica of the configuration service holds besides its honest replica: its
/// own key and what every replica knows (the parameters, the keys, the instance, the
/// configuration), and for [`Behaviour::ForgedEvict`] the agreements it gathered.
pub struct CsKit {
    /// The PBFT parameters of the instance.
    pub params: Params,
    /// Its slot.
    pub me: Slot,
    /// Its signing key (the same as its honest replica's).
    pub secret: SecretKey,
    /// Every replica's key, by slot.
    pub keys: Vec<PublicKey>,
    /// The instance (the configuration's digest).
    pub instance: Digest,
    /// The configuration the instance serves.
    pub config: Configuration,
    /// For [`Behaviour::ForgedEvict`]: agreements to evict someone.
    pub evict: Option<EvictKit>,
}

/// Agreements to evict `target`: `2f_cs` genuine ones, one short of a quorum.
pub struct EvictKit {
    /// The member to evict.
    pub target: NodeId,
    /// `2f_cs` agreements from distinct CS replicas (its own first), each genuinely signed.
    pub genuine: Vec<(NodeId, Unverified<EvictVote>)>,
    /// A member outside the CS, to claim as a voter.
    pub outsider: Option<NodeId>,
}

/// A configuration-service replica with `behaviour` wrapped around a real one.
pub struct CsLiar {
    behaviour: Behaviour,
    inner: PbftReplica<ConfigService>,
    kit: CsKit,
    rng: ChaCha8Rng,
    next_id: u64,
    /// Silent from this virtual time on.
    silent_from: u64,
    /// When it last attacked on its own (a STOP, an EVICT, a view change).
    last_attack: Option<u64>,
    attack_every: u64,
    /// Genuine prepares of others, to re-target.
    prepares: VecDeque<Cast<Vote>>,
    /// Genuine pre-prepares of others with their batches.
    preprepares: VecDeque<(Cast<Vote>, Batch<Op>)>,
    /// The latest view change of every replica (its own honest one included), to build on.
    view_changes: BTreeMap<u32, Cast<ViewChange<Op>>>,
    /// For [`Behaviour::SkewedClock`]: how far its clock is off, in milliseconds.
    skew: i64,
}

impl CsLiar {
    /// `replica` (fresh or restored) lying as `behaviour`, its choices seeded by `seed`.
    pub fn new(
        behaviour: Behaviour,
        replica: PbftReplica<ConfigService>,
        kit: CsKit,
        seed: u64,
    ) -> CsLiar {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc5c5_0b12_a47c_0001);
        let silent_from = if rng.random_bool(0.4) {
            0
        } else {
            rng.random_range(0..10_000)
        };
        let attack_every = rng.random_range(300..2_000);
        let skew = if behaviour == Behaviour::SkewedClock {
            let tolerance = kit.config.stop_delta_ms as i64;
            let off = rng.random_range(tolerance * 3 / 2..=tolerance * 6);
            if rng.random_bool(0.5) { off } else { -off }
        } else {
            0
        };
        CsLiar {
            behaviour,
            inner: replica,
            kit,
            rng,
            next_id: OWN_IDS,
            silent_from,
            last_attack: None,
            attack_every,
            prepares: VecDeque::new(),
            preprepares: VecDeque::new(),
            view_changes: BTreeMap::new(),
            skew,
        }
    }

    /// What its own clock reads at virtual time `now`.
    fn clock(&self, now: Time) -> Time {
        Time(now.0.saturating_add_signed(self.skew))
    }

    /// The honest replica underneath.
    pub fn replica(&self) -> &PbftReplica<ConfigService> {
        &self.inner
    }

    /// How it behaves.
    pub fn behaviour(&self) -> Behaviour {
        self.behaviour
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn sign_vote(&self, vote: Vote) -> Option<Cast<Vote>> {
        Cast::sign(&self.kit.secret, self.kit.me, vote).ok()
    }

    /// A statement claimed to be `slot`'s, signed with this replica's own key: refused by
    /// `slot`'s key unless `slot` is this replica.
    fn forge<T: Signable>(&self, slot: u32, value: T) -> Option<Cast<T>> {
        let signed = Signed::sign(&self.kit.secret, value).ok()?;
        Some(Cast {
            slot,
            signed: signed.to_unverified(),
        })
    }

    fn preprepare_vote(&self, view: u64, seq: u64, batch: &Batch<Op>) -> Vote {
        Vote {
            instance: self.kit.instance,
            phase: Phase::PrePrepare,
            view,
            seq,
            digest: batch.digest(),
            replica: self.kit.me.0,
        }
    }

    fn own_request(&mut self, op: Op) -> Request<Op> {
        Request {
            origin: Origin::Replica(self.kit.me.0),
            id: self.fresh_id(),
            op,
        }
    }

    /// Remembers genuine material from peers to re-target later.
    fn snoop(&mut self, message: &Message<ConfigService>) {
        if self.behaviour != Behaviour::ForgedViewChange {
            return;
        }
        match message {
            Message::Vote(cast)
                if vote_of(cast).is_some_and(|vote| vote.phase == Phase::Prepare) =>
            {
                push_bounded(&mut self.prepares, cast.clone());
            }
            Message::PrePrepare(pre) => push_bounded(&mut self.preprepares, (**pre).clone()),
            Message::ViewChange(cast) => {
                self.view_changes.insert(cast.slot, (**cast).clone());
            }
            _ => {}
        }
    }

    /// Bends what the honest replica said after one input.
    fn bend(&mut self, now: Time, mut out: Output<Self>) -> Output<Self> {
        match self.behaviour {
            Behaviour::Silent if now.0 >= self.silent_from => Output::none(),
            Behaviour::EquivocatingPrimary => {
                self.equivocate(now, &mut out);
                out
            }
            Behaviour::ForgedViewChange => {
                self.forge_view_changes(now, &mut out);
                out
            }
            Behaviour::EarlyStop => {
                self.rewrite_own_batches(now, &mut out, |liar, now, batch| {
                    liar.early_stop(now, batch)
                });
                out
            }
            Behaviour::ForgedEvict => {
                self.rewrite_own_batches(now, &mut out, |liar, _, batch| {
                    if !liar.rng.random_bool(0.3) {
                        return None;
                    }
                    let op = liar.forged_evict()?;
                    let mut batch = batch.clone();
                    let request = liar.own_request(op);
                    batch.requests.push(request);
                    Some(batch)
                });
                out
            }
            _ => out,
        }
    }

    /// Attacks of its own, on the replica's periodic tick.
    fn attack(&mut self, now: Time, out: &mut Output<Self>) {
        let due = self
            .last_attack
            .is_none_or(|last| now.0 >= last.saturating_add(self.attack_every));
        if !due {
            return;
        }
        self.last_attack = Some(now.0);
        let op = match self.behaviour {
            Behaviour::EarlyStop => Some(Op::Stop),
            Behaviour::ForgedEvict => self.forged_evict(),
            Behaviour::ForgedViewChange => {
                self.unwanted_view_change(now, out);
                None
            }
            _ => None,
        };
        if let Some(op) = op {
            let id = self.fresh_id();
            self.broadcast(out, Message::Request(Submitted { id, op }));
        }
    }

    fn broadcast(&self, out: &mut Output<Self>, message: Message<ConfigService>) {
        for slot in (0..self.kit.params.n as u32)
            .map(Slot)
            .filter(|s| *s != self.kit.me)
        {
            out.sends.push((slot, message.clone()));
        }
    }

    // -----------------------------------------------------------------------------------------
    // Equivocation

    /// Every pre-prepare of its own goes to a random part of the backups as sent, and to the
    /// rest as another batch for the same number.
    fn equivocate(&mut self, _now: Time, out: &mut Output<Self>) {
        // One plan per (view, seq) in this output: the other batch and who gets it.
        let mut plans: BTreeMap<(u64, u64), Option<Equivocation>> = BTreeMap::new();
        let me = self.kit.me;
        let n = self.kit.params.n as u32;
        for (to, message) in out.sends.iter_mut() {
            let Message::PrePrepare(pre) = message else {
                continue;
            };
            if pre.0.slot != me.0 {
                continue;
            }
            let Some(vote) = vote_of(&pre.0) else {
                continue;
            };
            let plan = match plans.get(&(vote.view, vote.seq)) {
                Some(plan) => plan.clone(),
                None => {
                    let plan = self.equivocation_plan(&vote, &pre.1, n);
                    plans.insert((vote.view, vote.seq), plan.clone());
                    plan
                }
            };
            if let Some((cast, batch, targets)) = plan
                && targets.contains(to)
            {
                *message = Message::PrePrepare(Box::new((cast, batch)));
            }
        }
    }

    fn equivocation_plan(
        &mut self,
        vote: &Vote,
        batch: &Batch<Op>,
        n: u32,
    ) -> Option<Equivocation> {
        let mut backups: Vec<Slot> = (0..n).map(Slot).filter(|s| *s != self.kit.me).collect();
        if backups.len() < 2 {
            return None;
        }
        backups.shuffle(&mut self.rng);
        let split = self.rng.random_range(1..backups.len());
        backups.truncate(split);
        let mut other = batch.clone();
        let delta = self.kit.config.stop_delta_ms.max(2);
        match self.rng.random_range(0..5) {
            // Another clock reading, still inside every correct replica's tolerance.
            0 => {
                other.nondet = other
                    .nondet
                    .saturating_add(self.rng.random_range(1..delta / 2 + 1))
            }
            1 if other.requests.len() >= 2 => other.requests.reverse(),
            2 if !other.requests.is_empty() => {
                let at = self.rng.random_range(0..other.requests.len());
                other.requests.remove(at);
            }
            3 => other.requests.clear(),
            _ => {
                let extra = self.own_request(Op::Noop);
                other.requests.push(extra);
            }
        }
        if other.digest() == batch.digest() {
            let extra = self.own_request(Op::Read);
            other.requests.push(extra);
        }
        let cast = self.sign_vote(self.preprepare_vote(vote.view, vote.seq, &other))?;
        Some((cast, other, backups))
    }

    // -----------------------------------------------------------------------------------------
    // Batches of its own, rewritten for every backup

    /// As primary, replaces each batch it proposes (to every backup alike) by what `rewrite`
    /// makes of it, signed anew.
    fn rewrite_own_batches(
        &mut self,
        now: Time,
        out: &mut Output<Self>,
        mut rewrite: impl FnMut(&mut Self, Time, &Batch<Op>) -> Option<Batch<Op>>,
    ) {
        let me = self.kit.me;
        let mut plans: BTreeMap<(u64, u64), Option<Proposal>> = BTreeMap::new();
        for (_, message) in out.sends.iter_mut() {
            let Message::PrePrepare(pre) = message else {
                continue;
            };
            if pre.0.slot != me.0 {
                continue;
            }
            let Some(vote) = vote_of(&pre.0) else {
                continue;
            };
            let plan = match plans.get(&(vote.view, vote.seq)) {
                Some(plan) => plan.clone(),
                None => {
                    let plan = rewrite(self, now, &pre.1).and_then(|batch| {
                        let cast =
                            self.sign_vote(self.preprepare_vote(vote.view, vote.seq, &batch))?;
                        Some((cast, batch))
                    });
                    plans.insert((vote.view, vote.seq), plan.clone());
                    plan
                }
            };
            if let Some((cast, batch)) = plan {
                *message = Message::PrePrepare(Box::new((cast, batch)));
            }
        }
    }

    /// A STOP slipped into `batch` with a clock reading no correct replica should accept, or one
    /// it accepts but that is before the epoch is due.
    fn early_stop(&mut self, now: Time, batch: &Batch<Op>) -> Option<Batch<Op>> {
        if !self.rng.random_bool(0.5) {
            return None;
        }
        let config = &self.kit.config;
        let due = config
            .started_at_ms
            .saturating_add(config.t_epoch_ms)
            .saturating_sub(config.stop_delta_ms);
        let nondet = match self.rng.random_range(0..4) {
            0 => now.0.saturating_add(config.t_epoch_ms.max(1) * 2),
            1 => due.max(now.0.saturating_add(config.stop_delta_ms * 3)),
            2 => now.0.saturating_add(config.stop_delta_ms / 2),
            _ => u64::MAX / 2,
        };
        let mut batch = batch.clone();
        batch.nondet = nondet;
        let stop = self.own_request(Op::Stop);
        batch.requests.push(stop);
        Some(batch)
    }

    /// An EVICT one agreement short of a quorum, or padded to a quorum with a bad agreement.
    fn forged_evict(&mut self) -> Option<Op> {
        let evict = self.kit.evict.as_ref()?;
        let target = evict.target;
        let mut votes = evict.genuine.clone();
        let own = self.kit.config.cs().get(self.kit.me.index()).copied()?;
        let cs = self.kit.config.cs();
        let epoch = self.kit.config.epoch;
        let sign = |vote: EvictVote| {
            Signed::sign(&self.kit.secret, vote)
                .ok()
                .map(|s| s.to_unverified())
        };
        match self.rng.random_range(0..6) {
            // Exactly 2f_cs genuine agreements.
            0 => {}
            // Another replica's agreement, signed with its own key.
            1 => {
                let voter = cs
                    .iter()
                    .copied()
                    .find(|id| !votes.iter().any(|(v, _)| v == id))?;
                let vote = sign(EvictVote {
                    epoch,
                    node: target,
                    voter,
                })?;
                votes.push((voter, vote));
            }
            // Its own agreement twice.
            2 => {
                let first = votes.first()?.clone();
                votes.push(first);
            }
            // An agreement of another epoch (a replay).
            3 => {
                let vote = sign(EvictVote {
                    epoch: Epoch(epoch.0 + 1),
                    node: target,
                    voter: own,
                })?;
                votes[0] = (own, vote);
                let voter = cs
                    .iter()
                    .copied()
                    .find(|id| !votes.iter().any(|(v, _)| v == id))?;
                let forged = sign(EvictVote {
                    epoch,
                    node: target,
                    voter,
                })?;
                votes.push((voter, forged));
            }
            // An agreement to evict someone else, re-targeted.
            4 => {
                let other = self
                    .kit
                    .config
                    .members
                    .iter()
                    .map(|m| m.id)
                    .find(|id| *id != target)?;
                let vote = sign(EvictVote {
                    epoch,
                    node: other,
                    voter: own,
                })?;
                votes[0] = (own, vote);
                let voter = cs
                    .iter()
                    .copied()
                    .find(|id| !votes.iter().any(|(v, _)| v == id))?;
                let forged = sign(EvictVote {
                    epoch,
                    node: target,
                    voter,
                })?;
                votes.push((voter, forged));
            }
            // A member outside the CS agreeing.
            _ => {
                let voter = evict.outsider?;
                let vote = sign(EvictVote {
                    epoch,
                    node: target,
                    voter,
                })?;
                votes.push((voter, vote));
            }
        }
        Some(Op::Evict {
            node: target,
            votes,
        })
    }

    // -----------------------------------------------------------------------------------------
    // Forged view changes

    fn forge_view_changes(&mut self, now: Time, out: &mut Output<Self>) {
        let me = self.kit.me.0;
        let sends = std::mem::take(&mut out.sends);
        let mut forged_change: BTreeMap<u64, Option<Cast<ViewChange<Op>>>> = BTreeMap::new();
        let mut forged_new_view: BTreeMap<u64, Option<NewView<Op>>> = BTreeMap::new();
        for (to, message) in sends {
            let message = match message {
                Message::ViewChange(cast) if cast.slot == me => {
                    let Ok(change) = cast.open(&self.kit.keys) else {
                        continue;
                    };
                    self.view_changes.insert(me, (*cast).clone());
                    let view = change.view;
                    let forged = match forged_change.get(&view) {
                        Some(forged) => forged.clone(),
                        None => {
                            let forged = if self.rng.random_bool(0.5) {
                                self.amnesiac_view_change(change)
                            } else {
                                self.forged_view_change(now, change)
                            };
                            forged_change.insert(view, forged.clone());
                            forged
                        }
                    };
                    match forged {
                        Some(forged) => Message::ViewChange(Box::new(forged)),
                        None => Message::ViewChange(cast),
                    }
                }
                Message::NewView(new_view) => {
                    let view = new_view.view;
                    let forged = match forged_new_view.get(&view) {
                        Some(forged) => forged.clone(),
                        None => {
                            let forged = self.forged_new_view(now, &new_view);
                            forged_new_view.insert(view, forged.clone());
                            forged
                        }
                    };
                    match forged {
                        Some(forged) => Message::NewView(Box::new(forged)),
                        None => Message::NewView(new_view),
                    }
                }
                other => other,
            };
            out.sends.push((to, message));
        }
    }

    /// `change` without any of its prepared certificates: a lie by omission that its signature
    /// cannot expose, which correct replicas accept (PBFT tolerates `f` of them, because `2f+1`
    /// view changes always include a correct replica that prepared whatever committed).
    fn amnesiac_view_change(&mut self, mut change: ViewChange<Op>) -> Option<Cast<ViewChange<Op>>> {
        change.prepared.clear();
        Cast::sign(&self.kit.secret, self.kit.me, change).ok()
    }

    /// `change` with a forged prepared certificate, for the highest view it may name, at a
    /// number that (if the certificate were believed) would displace what was really prepared.
    fn forged_view_change(
        &mut self,
        now: Time,
        mut change: ViewChange<Op>,
    ) -> Option<Cast<ViewChange<Op>>> {
        if change.view == 0 {
            return None;
        }
        let window = self.kit.params.window;
        let stable = change.stable.seq;
        let seq = match change.prepared.choose(&mut self.rng) {
            Some(proof) if self.rng.random_bool(0.7) => {
                vote_of(&proof.preprepare).map_or(stable + 1, |v| v.seq)
            }
            _ => stable + self.rng.random_range(1..=window.clamp(1, 4)),
        };
        let proof = self.forged_proof(now, change.view - 1, seq)?;
        change
            .prepared
            .retain(|p| vote_of(&p.preprepare).is_none_or(|v| v.seq != seq));
        change.prepared.push(proof);
        Cast::sign(&self.kit.secret, self.kit.me, change).ok()
    }

    /// A prepared certificate for `(view, seq)` that no correct replica should accept.
    fn forged_proof(&mut self, now: Time, view: u64, seq: u64) -> Option<PreparedProof<Op>> {
        let params = self.kit.params;
        let primary = params.primary(view);
        let stop = self.own_request(Op::Stop);
        let fabricated = Batch {
            nondet: now.0.saturating_add(self.kit.config.t_epoch_ms * 2),
            requests: vec![stop],
        };
        let method = self.rng.random_range(0..3);
        match method {
            // Re-targeted prepares: genuine votes of others, for another number or batch.
            0 if self.prepares.len() >= 2 * params.f => {
                let preprepare = if primary == self.kit.me {
                    self.sign_vote(self.preprepare_vote(view, seq, &fabricated))?
                } else {
                    self.forge(primary.0, self.preprepare_vote(view, seq, &fabricated))?
                };
                let mut prepares: Vec<Cast<Vote>> = self.prepares.iter().cloned().collect();
                prepares.shuffle(&mut self.rng);
                prepares.truncate(2 * params.f);
                Some(PreparedProof {
                    preprepare,
                    batch: fabricated,
                    prepares,
                })
            }
            // A genuine pre-prepare whose batch was swapped, with genuine-looking prepares.
            1 if !self.preprepares.is_empty() => {
                let at = self.rng.random_range(0..self.preprepares.len());
                let (preprepare, _) = self.preprepares[at].clone();
                let vote = vote_of(&preprepare)?;
                let prepares = self.forged_prepares(vote.view, vote.seq, &vote.digest);
                Some(PreparedProof {
                    preprepare,
                    batch: fabricated,
                    prepares,
                })
            }
            // Forged signatures: the primary's pre-prepare and the backups' prepares, all over
            // this replica's own key.
            _ => {
                let vote = self.preprepare_vote(view, seq, &fabricated);
                let preprepare = self.forge(
                    primary.0,
                    Vote {
                        replica: primary.0,
                        ..vote.clone()
                    },
                )?;
                let prepares = self.forged_prepares(view, seq, &vote.digest);
                Some(PreparedProof {
                    preprepare,
                    batch: fabricated,
                    prepares,
                })
            }
        }
    }

    /// `2f` prepares for `(view, seq, digest)` claimed to be the backups', over its own key
    /// (its own, if it is one of them, is genuine).
    fn forged_prepares(&mut self, view: u64, seq: u64, digest: &Digest) -> Vec<Cast<Vote>> {
        let params = self.kit.params;
        let primary = params.primary(view);
        (0..params.n as u32)
            .filter(|slot| Slot(*slot) != primary)
            .take(2 * params.f)
            .filter_map(|slot| {
                self.forge(
                    slot,
                    Vote {
                        instance: self.kit.instance,
                        phase: Phase::Prepare,
                        view,
                        seq,
                        digest: *digest,
                        replica: slot,
                    },
                )
            })
            .collect()
    }

    /// As the new primary: a NEW-VIEW with its forged view change in it, or one re-proposing a
    /// batch the view changes do not imply.
    fn forged_new_view(&mut self, now: Time, honest: &NewView<Op>) -> Option<NewView<Op>> {
        let mut forged = honest.clone();
        let variant = self.rng.random_range(0..3);
        if variant == 2 {
            return self.selective_new_view(honest.view).or(Some(forged));
        }
        if variant == 0 {
            let me = self.kit.me.0;
            let own = forged
                .view_changes
                .iter()
                .position(|cast| cast.slot == me)?;
            let change = forged.view_changes[own].open(&self.kit.keys).ok()?;
            forged.view_changes[own] = self.forged_view_change(now, change)?;
        } else {
            let stop = self.own_request(Op::Stop);
            let fabricated = Batch {
                nondet: now.0,
                requests: vec![stop],
            };
            let seq = match forged.preprepares.last().and_then(vote_of) {
                Some(vote) if self.rng.random_bool(0.5) => vote.seq,
                Some(vote) => vote.seq + 1,
                None => self.inner.stable_seq() + 1,
            };
            let cast = self.sign_vote(Vote {
                seq,
                ..self.preprepare_vote(forged.view, seq, &fabricated)
            })?;
            match forged
                .preprepares
                .iter()
                .position(|c| vote_of(c).is_some_and(|v| v.seq == seq))
            {
                Some(at) => {
                    forged.preprepares[at] = cast;
                    forged.batches[at] = fabricated;
                }
                None => {
                    forged.preprepares.push(cast);
                    forged.batches.push(fabricated);
                }
            }
        }
        Some(forged)
    }

    /// A NEW-VIEW correct replicas must accept, chosen to lose as much as the rules allow: its
    /// own view change stripped of every prepared certificate, and the other replicas' view
    /// changes that carry the fewest, as few as the quorum permits; the re-proposals are exactly
    /// what those view changes imply (the selection rule of `pbft::replica`, repeated here).
    fn selective_new_view(&mut self, view: u64) -> Option<NewView<Op>> {
        let me = self.kit.me.0;
        let keys = self.kit.keys.clone();
        let keys = &keys;
        let own = self.view_changes.get(&me)?.open(keys).ok()?;
        if own.view != view {
            return None;
        }
        let own = self.amnesiac_view_change(own)?;
        let mut others: Vec<Candidate> = self
            .view_changes
            .iter()
            .filter(|(slot, _)| **slot != me)
            .filter_map(|(_, cast)| {
                let change = cast.open(keys).ok()?;
                (change.view == view).then(|| {
                    let top = change
                        .prepared
                        .iter()
                        .filter_map(|p| vote_of(&p.preprepare))
                        .map(|v| v.seq)
                        .max();
                    (
                        change.prepared.len(),
                        top.unwrap_or(0),
                        cast.clone(),
                        change,
                    )
                })
            })
            .collect();
        let quorum = self.kit.params.quorum();
        if others.len() + 1 < quorum {
            return None;
        }
        others.sort_by_key(|(count, top, cast, _)| (*count, *top, cast.slot));
        others.truncate(quorum - 1);
        let own_change = own.open(keys).ok()?;
        let mut changes: Vec<&ViewChange<Op>> = vec![&own_change];
        changes.extend(others.iter().map(|(_, _, _, change)| change));
        let plan = select(&changes);
        let mut preprepares = Vec::new();
        let mut batches = Vec::new();
        for (seq, batch) in plan {
            preprepares.push(self.sign_vote(self.preprepare_vote(view, seq, &batch))?);
            batches.push(batch);
        }
        let mut view_changes = vec![own];
        view_changes.extend(others.into_iter().map(|(_, _, cast, _)| cast));
        Some(NewView {
            view,
            view_changes,
            preprepares,
            batches,
        })
    }

    /// A view change to the next view that nobody else asked for, with a forged certificate.
    fn unwanted_view_change(&mut self, now: Time, out: &mut Output<Self>) {
        let Some(base) = self
            .view_changes
            .get(&self.kit.me.0)
            .or_else(|| self.view_changes.values().next())
        else {
            return;
        };
        let Ok(base) = base.open(&self.kit.keys) else {
            return;
        };
        let (view, _) = self.inner.view();
        let change = ViewChange {
            instance: self.kit.instance,
            view: view + 1,
            replica: self.kit.me.0,
            stable: base.stable,
            prepared: Vec::new(),
        };
        if let Some(forged) = self.forged_view_change(now, change) {
            self.broadcast(out, Message::ViewChange(Box::new(forged)));
        }
    }
}

/// What a set of view changes implies for the new view, as every replica computes it: for every
/// number above the highest stable checkpoint among them up to the highest prepared one, the
/// batch prepared in the highest view (ties broken by the higher digest), or the null batch.
fn select(changes: &[&ViewChange<Op>]) -> Vec<(u64, Batch<Op>)> {
    let Some(stable) = changes
        .iter()
        .map(|change| &change.stable)
        .max_by_key(|proof| proof.seq)
    else {
        return Vec::new();
    };
    let mut best: BTreeMap<u64, (u64, Digest, &Batch<Op>)> = BTreeMap::new();
    for change in changes {
        for proof in &change.prepared {
            let Some(vote) = vote_of(&proof.preprepare) else {
                continue;
            };
            if vote.seq <= stable.seq {
                continue;
            }
            let better = best
                .get(&vote.seq)
                .is_none_or(|(view, digest, _)| (vote.view, vote.digest) > (*view, *digest));
            if better {
                best.insert(vote.seq, (vote.view, vote.digest, &proof.batch));
            }
        }
    }
    let top = best.keys().next_back().copied().unwrap_or(stable.seq);
    (stable.seq + 1..=top)
        .map(|seq| {
            let batch = best
                .get(&seq)
                .map_or_else(Batch::null, |(_, _, batch)| (*batch).clone());
            (seq, batch)
        })
        .collect()
}

/// The vote a cast carries, read without checking its signature.
fn vote_of(cast: &Cast<Vote>) -> Option<Vote> {
    wire::decode::<Vote>(cast.signed.bytes(), 128).ok()
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() >= SNOOPED_MAX {
        queue.pop_front();
    }
    queue.push_back(item);
}

impl Replica for CsLiar {
    const SERVICE: ServiceId = <PbftReplica<ConfigService> as Replica>::SERVICE;
    type Request = Submitted<Op>;
    type Reply = Answer<Outcome>;
    type Message = Message<ConfigService>;
    type Change = Change<ConfigService>;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Submitted<Op>,
        view: &(),
    ) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_request(now, client, access, request, view));
        self.bend(now, out)
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<ConfigService>,
        view: &(),
    ) -> Output<Self> {
        self.snoop(&message);
        let now = self.clock(now);
        let out = convert(self.inner.on_message(now, from, message, view));
        self.bend(now, out)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &()) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_timer(now, timer, view));
        self.bend(now, out)
    }

    /// A2M-PBFT-E: the request history's attestations, the answers they release.
    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, view: &()) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_attested(now, token, answers, view));
        self.bend(now, out)
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_tick(now));
        let mut out = self.bend(now, out);
        if self.behaviour.is_byzantine() && self.behaviour != Behaviour::Silent {
            self.attack(now, &mut out);
        }
        out
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}

/// The honest replica's output as the wrapper's (the same types).
fn convert(out: Output<PbftReplica<ConfigService>>) -> Output<CsLiar> {
    out.retyped()
}
