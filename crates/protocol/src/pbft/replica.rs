//! One PBFT replica (see the module docs of [`super`] for the protocol).

use super::history::{Executed, History, Trail};
use super::msg::{
    BATCH_BYTES_MAX, Batch, Cast, CheckpointProof, Committed, Message, NewView, Origin, Phase,
    PreparedProof, Reply, Request, StateTransfer, Status, Submitted, ViewChange, Vote,
};
use super::{App, AppOutput, Params};
use crate::machine::{Access, Attest, Attested, Output, Replica, ReplicaStats};
use bulwark_core::a2m::Attestation;
use bulwark_core::sign::{PublicKey, SecretKey, Unverified};
use bulwark_core::wire;
use bulwark_core::{ClientId, Digest, Slot, Time};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Requests a replica keeps waiting at most; more are refused until some execute.
pub(super) const WAITING_MAX: usize = 4096;
/// Results remembered per submitter, to answer retransmissions.
const REPLIES_PER_ORIGIN: usize = 32;
/// Submitters whose results are remembered.
const ORIGINS_MAX: usize = 4096;
/// The longest view-change timeout, as a power of two of the base.
const BACKOFF_MAX: u32 = 6;

/// A record a replica makes durable before it acts on it. Replaying a replica's records in order
/// through [`PbftReplica::restore`] gives back everything it vouched for.
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "A::Change: Serialize",
    deserialize = "A::Change: Deserialize<'de>"
))]
pub enum Change<A: App> {
    /// The replica is in `view`; `active` once the view started.
    View {
        /// The view.
        view: u64,
        /// Started (not still being changed to).
        active: bool,
    },
    /// A pre-prepare the replica accepted (or, as primary, made), before its prepare.
    Accepted(Box<(Cast<Vote>, Batch<A::Op>)>),
    /// A prepared certificate, before the replica's commit.
    Prepared(Box<PreparedProof<A::Op>>),
    /// A commit certificate, before the batch executes.
    Committed(Box<Committed<A::Op>>),
    /// A stable checkpoint and its state: every record about numbers up to it may go.
    Checkpoint(Box<StateTransfer>),
    /// The application's own record.
    App(A::Change),
}

impl<A: App> Change<A> {
    /// The sequence number the record is about, if any: a store may drop records at or below a
    /// later [`Change::Checkpoint`]'s number.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Change::Accepted(accepted) => Some(accepted_seq(&accepted.0)),
            Change::Prepared(proof) => Some(accepted_seq(&proof.preprepare)),
            Change::Committed(committed) => Some(committed.seq),
            Change::View { .. } | Change::Checkpoint(_) | Change::App(_) => None,
        }
    }
}

/// The number a pre-prepare names, read without checking its signature (for bookkeeping only).
fn accepted_seq(cast: &Cast<Vote>) -> u64 {
    wire::decode::<Vote>(cast.signed.bytes(), 128)
        .map(|vote| vote.seq)
        .unwrap_or(0)
}

impl<A: App> Clone for Change<A> {
    fn clone(&self) -> Self {
        match self {
            Change::View { view, active } => Change::View {
                view: *view,
                active: *active,
            },
            Change::Accepted(a) => Change::Accepted(a.clone()),
            Change::Prepared(p) => Change::Prepared(p.clone()),
            Change::Committed(c) => Change::Committed(c.clone()),
            Change::Checkpoint(c) => Change::Checkpoint(c.clone()),
            Change::App(c) => Change::App(c.clone()),
        }
    }
}

impl<A: App> std::fmt::Debug for Change<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::View { view, active } => write!(f, "View({view}, active {active})"),
            Change::Accepted(a) => write!(f, "Accepted({})", accepted_seq(&a.0)),
            Change::Prepared(p) => write!(f, "Prepared({})", accepted_seq(&p.preprepare)),
            Change::Committed(c) => write!(f, "Committed({})", c.seq),
            Change::Checkpoint(c) => write!(f, "Checkpoint({})", c.proof.seq),
            Change::App(c) => write!(f, "App({c:?})"),
        }
    }
}

/// Why a replica's records could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A record failed its checks: the store is damaged or was written by someone else.
    #[error("record {index}: {reason}")]
    Record {
        /// Its position.
        index: usize,
        /// What was wrong.
        reason: String,
    },
}

/// What a client gets back: the reply once the request executed, or a refusal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Answer<R> {
    /// Executed.
    Executed(Reply<R>),
    /// Refused before ordering (malformed or unauthenticated operation, replica busy).
    Refused {
        /// The request's id.
        id: u64,
        /// Why.
        reason: String,
    },
    /// Executed, under A2M-PBFT-E: with the replica's trusted-log LOOKUP of the number it
    /// executed at ([`super::history`]).
    Attested {
        /// The reply.
        reply: Reply<R>,
        /// Slot `n` of the replica's request history: the batch and the cumulative digest.
        history: Unverified<Attestation>,
    },
}

impl<R> Answer<R> {
    /// The request id the answer is for.
    pub fn id(&self) -> u64 {
        match self {
            Answer::Executed(reply) | Answer::Attested { reply, .. } => reply.id,
            Answer::Refused { id, .. } => *id,
        }
    }
}

/// The results of executed requests, per submitter: replicated state (it is in every snapshot),
/// so that every replica answers a retransmission the same way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "R: Serialize", deserialize = "R: Deserialize<'de>"))]
pub(super) struct Replies<R> {
    pub(super) by_origin: BTreeMap<Origin, VecDeque<(u64, Digest, R)>>,
}

impl<R: Clone> Replies<R> {
    pub(super) fn find(&self, origin: Origin, id: u64, digest: &Digest) -> Option<&R> {
        self.by_origin
            .get(&origin)?
            .iter()
            .find(|(i, d, _)| *i == id && d == digest)
            .map(|(_, _, r)| r)
    }

    pub(super) fn insert(&mut self, origin: Origin, id: u64, digest: Digest, result: R) {
        if !self.by_origin.contains_key(&origin) && self.by_origin.len() >= ORIGINS_MAX {
            // Deterministic on every replica: the lowest submitter loses its memory first.
            self.by_origin.pop_first();
        }
        let results = self.by_origin.entry(origin).or_default();
        if results.len() >= REPLIES_PER_ORIGIN {
            results.pop_front();
        }
        results.push_back((id, digest, result));
    }
}

/// Under A2M-PBFT-E, what the application's part of the replicated state holds besides the
/// application: the last slot of the request history, so that a checkpoint's signatures bind it.
#[derive(Serialize, Deserialize)]
struct Tail {
    /// The digest of the last batch executed.
    batch: [u8; 32],
    /// The request history's cumulative digest before it.
    previous: [u8; 32],
    /// The application's own snapshot.
    app: Bytes,
    /// Where each recent request first executed, in execution order.
    executed: Vec<(Digest, Executed)>,
}

/// The replicated state a checkpoint covers: the application's and the remembered results.
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "R: Serialize", deserialize = "R: Deserialize<'de>"))]
pub(super) struct State<R> {
    pub(super) app: Bytes,
    pub(super) replies: Replies<R>,
}

/// The digest of a checkpoint's state bytes.
pub(super) fn state_digest(snapshot: &[u8]) -> Digest {
    Digest::of("bulwark.pbft.state.v1", snapshot)
}

/// A view change as checked, with the signed form to forward.
type Known<Op> = (ViewChange<Op>, Cast<ViewChange<Op>>);

/// A request waiting to execute.
struct Waiting<Op> {
    request: Request<Op>,
    /// When it arrived, or when the current view started if later: the view-change clock.
    since: Time,
}

/// What the replica knows about one sequence number.
struct Entry<Op> {
    /// The pre-prepare accepted in the current view (`vote.view`), with its batch.
    accepted: Option<(Cast<Vote>, Vote, Batch<Op>)>,
    /// Prepares and commits seen, the latest per replica.
    prepares: BTreeMap<u32, (Vote, Cast<Vote>)>,
    commits: BTreeMap<u32, (Vote, Cast<Vote>)>,
    /// The replica's highest-view prepared certificate.
    prepared: Option<(u64, PreparedProof<Op>)>,
    /// The view the replica sent its commit in.
    committed_in: Option<u64>,
    /// The commit certificate.
    decided: Option<Committed<Op>>,
}

impl<Op> Default for Entry<Op> {
    fn default() -> Self {
        Entry {
            accepted: None,
            prepares: BTreeMap::new(),
            commits: BTreeMap::new(),
            prepared: None,
            committed_in: None,
            decided: None,
        }
    }
}

/// Everything one input produces, before it becomes the contract's [`Output`].
struct Effects<A: App> {
    changes: Vec<Change<A>>,
    sends: Vec<(Slot, Message<A>)>,
    notify: Vec<(ClientId, u64, Answer<A::Result>)>,
    refused: Option<String>,
    attest: Vec<Attest>,
}

impl<A: App> Default for Effects<A> {
    fn default() -> Self {
        Effects {
            changes: Vec::new(),
            sends: Vec::new(),
            notify: Vec::new(),
            refused: None,
            attest: Vec::new(),
        }
    }
}

impl<A: App> Effects<A> {
    fn refuse(&mut self, reason: String) {
        if self.refused.is_none() {
            self.refused = Some(reason);
        }
    }
}

/// Counters for status and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PbftStats {
    /// Batches executed.
    pub executed: u64,
    /// Requests executed.
    pub requests: u64,
    /// View changes this replica started or joined.
    pub view_changes: u64,
    /// State transfers this replica installed.
    pub transfers: u64,
    /// Messages refused.
    pub refused: u64,
    /// A2M-PBFT-E: numbers whose request-history slot the trusted log attested.
    pub attested: u64,
    /// A2M-PBFT-E: calls the trusted log refused (down, full, or holding another history).
    pub attest_refused: u64,
}

/// One PBFT replica ordering requests for `A`.
pub struct PbftReplica<A: App> {
    params: Params,
    me: Slot,
    secret: SecretKey,
    keys: Vec<PublicKey>,
    instance: Digest,
    /// The digest of the initial state: the checkpoint at 0.
    initial: Digest,
    app: A,
    replies: Replies<A::Result>,
    view: u64,
    /// The view started; false while changing to it.
    active: bool,
    /// View changes in a row without a view starting: the timeout doubles with each.
    backoff: u32,
    /// When the current view change started.
    changing_since: Time,
    log: BTreeMap<u64, Entry<A::Op>>,
    stable: CheckpointProof,
    stable_state: Bytes,
    executed: u64,
    /// This replica's own checkpoint states above the stable one.
    own_checkpoints: BTreeMap<u64, (Digest, Bytes)>,
    checkpoint_votes: BTreeMap<u64, BTreeMap<u32, (Digest, Cast<Vote>)>>,
    waiting: BTreeMap<Digest, Waiting<A::Op>>,
    /// Arrival order of waiting requests (digests may have left `waiting` since).
    arrivals: VecDeque<Digest>,
    /// Requests in accepted batches not yet executed: the primary does not propose them again.
    in_log: BTreeSet<Digest>,
    /// The primary's next number.
    next_seq: u64,
    /// The latest view change from each replica.
    view_changes: BTreeMap<u32, Known<A::Op>>,
    /// The NEW-VIEW that started the current view (to relay to replicas that missed it).
    new_view: Option<NewView<A::Op>>,
    /// Evidence that others are ahead: send STATUS at the next tick even with nothing waiting.
    behind: bool,
    last_status: Option<Time>,
    /// The last id given to a request this replica submitted without naming one.
    next_own_id: u64,
    stats: PbftStats,
    /// A2M-PBFT-E: the request history in the replica's trusted log, when it keeps one.
    trail: Option<Trail<A::Result>>,
}

/// The pieces a replica is built from.
pub struct Setup<A: App> {
    /// Sizes and timeouts.
    pub params: Params,
    /// This replica's slot.
    pub me: Slot,
    /// Its signing key.
    pub secret: SecretKey,
    /// Every replica's key, by slot.
    pub keys: Vec<PublicKey>,
    /// What distinguishes this instance's votes from any other's.
    pub instance: Digest,
    /// The application in its initial state.
    pub app: A,
    /// A2M-PBFT-E's request histories, or `None` for plain PBFT.
    pub history: Option<History>,
}

impl<A: App> PbftReplica<A> {
    /// A replica in view 0 at the application's initial state.
    pub fn new(setup: Setup<A>) -> Result<PbftReplica<A>, String> {
        setup.params.validate()?;
        if setup.keys.len() != setup.params.n || setup.me.index() >= setup.params.n {
            return Err(format!(
                "{} keys and slot {} for {} replicas",
                setup.keys.len(),
                setup.me,
                setup.params.n
            ));
        }
        if setup.keys[setup.me.index()] != setup.secret.public_key() {
            return Err(format!("the signing key is not slot {}'s", setup.me));
        }
        if let Some(history) = &setup.history
            && history.attesters.len() != setup.params.n
        {
            return Err(format!(
                "{} trusted logs for {} replicas",
                history.attesters.len(),
                setup.params.n
            ));
        }
        let trail = setup.history.map(|history| Trail::new(history, setup.me));
        let replies = Replies {
            by_origin: BTreeMap::new(),
        };
        let snapshot = snapshot_of(&setup.app, &replies, trail.as_ref());
        let initial = state_digest(&snapshot);
        Ok(PbftReplica {
            params: setup.params,
            me: setup.me,
            secret: setup.secret,
            keys: setup.keys,
            instance: setup.instance,
            initial,
            app: setup.app,
            replies,
            view: 0,
            active: true,
            backoff: 0,
            changing_since: Time(0),
            log: BTreeMap::new(),
            stable: CheckpointProof {
                seq: 0,
                digest: initial,
                votes: Vec::new(),
            },
            stable_state: Bytes::from(snapshot),
            executed: 0,
            own_checkpoints: BTreeMap::new(),
            checkpoint_votes: BTreeMap::new(),
            waiting: BTreeMap::new(),
            arrivals: VecDeque::new(),
            in_log: BTreeSet::new(),
            next_seq: 1,
            view_changes: BTreeMap::new(),
            new_view: None,
            behind: false,
            last_status: None,
            // Fresh ids live above the ids applications choose themselves.
            next_own_id: 1 << 63,
            stats: PbftStats::default(),
            trail,
        })
    }

    /// A replica rebuilt from its records (in the order they were made durable), every signature
    /// checked again. It re-executes the committed batches above its checkpoint and asks its
    /// peers where they stand at the first tick.
    pub fn restore(
        setup: Setup<A>,
        records: impl IntoIterator<Item = Change<A>>,
        now: Time,
    ) -> Result<PbftReplica<A>, RestoreError> {
        let mut replica =
            PbftReplica::new(setup).map_err(|reason| RestoreError::Record { index: 0, reason })?;
        for (index, record) in records.into_iter().enumerate() {
            replica
                .replay(record)
                .map_err(|reason| RestoreError::Record { index, reason })?;
        }
        let mut scratch = Effects::default();
        replica.execute_ready(now, &mut scratch);
        replica.next_seq = replica
            .log
            .iter()
            .filter(|(_, entry)| {
                entry
                    .accepted
                    .as_ref()
                    .is_some_and(|(_, vote, _)| vote.view == replica.view)
            })
            .map(|(seq, _)| *seq)
            .max()
            .unwrap_or(0)
            .max(replica.stable.seq)
            + 1;
        replica.in_log = replica.live_requests();
        replica.changing_since = now;
        replica.behind = true;
        if !replica.active {
            // Its view change, rebuilt from what it recorded, for peers that ask.
            let _ = replica.own_view_change(&mut scratch);
        }
        if let Some(trail) = replica.trail.as_mut() {
            // The batches it executed again may be in its log already: read back first.
            trail.restored();
        }
        Ok(replica)
    }

    fn replay(&mut self, record: Change<A>) -> Result<(), String> {
        match record {
            Change::View { view, active } => {
                self.view = view;
                self.active = active;
            }
            Change::Accepted(accepted) => {
                let (cast, batch) = *accepted;
                let vote = cast.vote(&self.keys, &self.instance, Phase::PrePrepare)?;
                if Slot(cast.slot) != self.params.primary(vote.view)
                    || batch.digest() != vote.digest
                {
                    return Err(format!("pre-prepare for {} does not check", vote.seq));
                }
                if vote.seq > self.stable.seq {
                    let entry = self.log.entry(vote.seq).or_default();
                    entry.accepted = Some((cast, vote, batch));
                }
            }
            Change::Prepared(proof) => {
                let vote = proof.check(&self.params, &self.keys, &self.instance)?;
                if vote.seq > self.stable.seq {
                    let entry = self.log.entry(vote.seq).or_default();
                    if entry.prepared.as_ref().is_none_or(|(v, _)| *v <= vote.view) {
                        entry.prepared = Some((vote.view, *proof));
                        entry.committed_in = Some(vote.view);
                    }
                }
            }
            Change::Committed(committed) => {
                committed.check(&self.params, &self.keys, &self.instance)?;
                if committed.seq > self.stable.seq {
                    let seq = committed.seq;
                    self.log.entry(seq).or_default().decided = Some(*committed);
                }
            }
            Change::Checkpoint(transfer) => {
                self.install(*transfer)?;
            }
            Change::App(change) => self.app.replay(&change),
        }
        Ok(())
    }

    /// The application.
    pub fn app(&self) -> &A {
        &self.app
    }

    /// The current view and whether it has started.
    pub fn view(&self) -> (u64, bool) {
        (self.view, self.active)
    }

    /// The primary of the current view.
    pub fn primary(&self) -> Slot {
        self.params.primary(self.view)
    }

    /// The last number executed.
    pub fn executed(&self) -> u64 {
        self.executed
    }

    /// The stable checkpoint's number.
    pub fn stable_seq(&self) -> u64 {
        self.stable.seq
    }

    /// The digest of the replicated state at the last executed number.
    pub fn state_digest(&self) -> Digest {
        state_digest(&self.snapshot())
    }

    /// The replicated state at the last executed number, encoded.
    fn snapshot(&self) -> Vec<u8> {
        snapshot_of(&self.app, &self.replies, self.trail.as_ref())
    }

    /// A2M-PBFT-E: the request history's cumulative digest at the last number executed (equal
    /// on every correct replica that executed the same sequence), if this replica keeps one.
    pub fn history(&self) -> Option<[u8; 32]> {
        self.trail.as_ref().map(|trail| trail.digest)
    }

    /// A2M-PBFT-E: why this replica stopped answering (its trusted log holds another history,
    /// or is full), if it did.
    pub fn stopped(&self) -> Option<&str> {
        self.trail
            .as_ref()
            .and_then(|trail| trail.stopped.as_deref())
    }

    /// Counters.
    pub fn pbft_stats(&self) -> &PbftStats {
        &self.stats
    }

    /// Requests waiting to execute.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Submits `op` as this replica's own request (the configuration service's evictions are
    /// proposed by the replica whose monitoring suspects a node).
    pub fn submit_own(&mut self, now: Time, op: A::Op) -> Output<Self> {
        let mut fx = Effects::default();
        let out = AppOutput {
            submit: vec![(0, op)],
            ..AppOutput::default()
        };
        self.app_effects(now, out, &mut fx);
        self.output(fx)
    }

    // -----------------------------------------------------------------------------------------
    // Requests

    fn submit(
        &mut self,
        now: Time,
        request: Request<A::Op>,
        fx: &mut Effects<A>,
    ) -> Option<Answer<A::Result>> {
        let digest = request.digest();
        if let Some(result) = self.replies.find(request.origin, request.id, &digest) {
            let reply = Reply {
                view: self.view,
                id: request.id,
                request: digest,
                result: result.clone(),
            };
            return match (self.trail.as_mut(), request.origin) {
                (Some(trail), Origin::Client(client)) => trail.answer_again(client, &digest, reply),
                _ => Some(Answer::Executed(reply)),
            };
        }
        // Known already: its checks passed when it arrived (a retransmission, or the copy a
        // backup forwarded), and verifying an authority's signature again costs as much.
        if self.waiting.contains_key(&digest) {
            return None;
        }
        if let Err(reason) = self.app.check_op(&request.op) {
            fx.refuse(reason.clone());
            return Some(Answer::Refused {
                id: request.id,
                reason,
            });
        }
        if self.waiting.len() >= WAITING_MAX {
            let reason = "the replica is busy: too many requests waiting to execute".to_string();
            fx.refuse(reason.clone());
            return Some(Answer::Refused {
                id: request.id,
                reason,
            });
        }
        self.waiting.insert(
            digest,
            Waiting {
                request,
                since: now,
            },
        );
        self.arrivals.push_back(digest);
        self.propose(now, fx);
        None
    }

    /// As primary of a started view: batches of waiting requests, while the window and the
    /// pipeline allow.
    fn propose(&mut self, now: Time, fx: &mut Effects<A>) {
        if !self.active || self.primary() != self.me {
            return;
        }
        while self.next_seq <= self.stable.seq + self.params.window
            && self.next_seq <= self.executed + self.params.pipeline
        {
            let mut requests = Vec::new();
            let mut bytes = 0;
            let mut kept = VecDeque::new();
            while let Some(digest) = self.arrivals.pop_front() {
                let Some(waiting) = self.waiting.get(&digest) else {
                    continue;
                };
                kept.push_back(digest);
                if self.in_log.contains(&digest) || requests.len() >= self.params.batch_max {
                    continue;
                }
                let size = wire::encode(&waiting.request).len();
                if bytes + size > BATCH_BYTES_MAX - 64 && !requests.is_empty() {
                    continue;
                }
                bytes += size;
                requests.push(waiting.request.clone());
            }
            self.arrivals = kept;
            if requests.is_empty() {
                return;
            }
            let batch = Batch {
                nondet: self.app.propose(now),
                requests,
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let vote = Vote {
                instance: self.instance,
                phase: Phase::PrePrepare,
                view: self.view,
                seq,
                digest: batch.digest(),
                replica: self.me.0,
            };
            let Some(cast) = self.sign(vote.clone()) else {
                return;
            };
            self.accept(cast, vote, batch, fx);
        }
    }

    /// Records an accepted pre-prepare (made or received) and, as a backup, prepares it.
    fn accept(&mut self, cast: Cast<Vote>, vote: Vote, batch: Batch<A::Op>, fx: &mut Effects<A>) {
        for request in &batch.requests {
            self.in_log.insert(request.digest());
        }
        fx.changes
            .push(Change::Accepted(Box::new((cast.clone(), batch.clone()))));
        let seq = vote.seq;
        let view = vote.view;
        let digest = vote.digest;
        let entry = self.log.entry(seq).or_default();
        entry.accepted = Some((cast.clone(), vote, batch.clone()));
        if self.primary() == self.me {
            self.broadcast(Message::PrePrepare(Box::new((cast, batch))), fx);
        } else {
            let prepare = Vote {
                instance: self.instance,
                phase: Phase::Prepare,
                view,
                seq,
                digest,
                replica: self.me.0,
            };
            if let Some(cast) = self.sign(prepare.clone()) {
                self.log
                    .entry(seq)
                    .or_default()
                    .prepares
                    .insert(self.me.0, (prepare, cast.clone()));
                self.broadcast(Message::Vote(cast), fx);
            }
        }
        self.advance(seq, fx);
    }

    // -----------------------------------------------------------------------------------------
    // Agreement

    fn on_preprepare(
        &mut self,
        now: Time,
        cast: Cast<Vote>,
        batch: Batch<A::Op>,
        fx: &mut Effects<A>,
    ) {
        let vote = match cast.vote(&self.keys, &self.instance, Phase::PrePrepare) {
            Ok(vote) => vote,
            Err(reason) => return fx.refuse(format!("pre-prepare: {reason}")),
        };
        if vote.view > self.view {
            self.behind = true;
            return;
        }
        if vote.view < self.view || !self.active {
            return;
        }
        if Slot(cast.slot) != self.params.primary(vote.view) {
            return fx.refuse(format!("a pre-prepare from backup {}", cast.slot));
        }
        if cast.slot == self.me.0 {
            return;
        }
        if !self.in_window(vote.seq) {
            if vote.seq > self.stable.seq {
                self.behind = true;
            }
            return;
        }
        if batch.digest() != vote.digest {
            return fx.refuse("a pre-prepare whose batch does not match its digest".into());
        }
        if let Err(reason) = self.check_batch(now, &batch) {
            return fx.refuse(format!("pre-prepare for {}: {reason}", vote.seq));
        }
        if let Some((_, accepted, _)) = self.log.get(&vote.seq).and_then(|e| e.accepted.as_ref())
            && accepted.view == vote.view
        {
            if accepted.digest != vote.digest {
                fx.refuse(format!(
                    "primary {} proposed two batches for {} in view {}",
                    cast.slot, vote.seq, vote.view
                ));
            }
            return;
        }
        self.accept(cast, vote, batch, fx);
    }

    /// A batch a backup may prepare: bounded, submitters that exist, operations the
    /// application accepts, and a non-deterministic value it agrees with.
    fn check_batch(&self, now: Time, batch: &Batch<A::Op>) -> Result<(), String> {
        if batch.requests.len() > self.params.batch_max || batch.encoded_len() > BATCH_BYTES_MAX {
            return Err(format!(
                "a batch of {} requests is too large",
                batch.requests.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for request in &batch.requests {
            if let Origin::Replica(slot) = request.origin
                && slot as usize >= self.params.n
            {
                return Err(format!(
                    "a request from replica {slot}, which does not exist"
                ));
            }
            if !seen.insert(request.digest()) {
                return Err("a request twice in one batch".into());
            }
            self.app.check_op(&request.op)?;
        }
        if batch.requests.is_empty() {
            return Ok(());
        }
        let ops: Vec<&A::Op> = batch.requests.iter().map(|r| &r.op).collect();
        self.app.check_proposal(now, batch.nondet, &ops)
    }

    fn in_window(&self, seq: u64) -> bool {
        seq > self.stable.seq && seq <= self.stable.seq + self.params.window
    }

    fn on_vote(&mut self, cast: Cast<Vote>, fx: &mut Effects<A>) {
        let vote = match cast.checked(&self.keys, &self.instance) {
            Ok(vote) => vote,
            Err(reason) => return fx.refuse(format!("vote: {reason}")),
        };
        let phase = vote.phase;
        match phase {
            Phase::Checkpoint => return self.on_checkpoint(cast, vote, fx),
            Phase::PrePrepare => return fx.refuse("a pre-prepare without its batch".into()),
            Phase::Prepare | Phase::Commit => {}
        }
        if vote.view > self.view {
            self.behind = true;
            return;
        }
        if vote.view < self.view || !self.in_window(vote.seq) {
            if vote.seq > self.stable.seq + self.params.window {
                self.behind = true;
            }
            return;
        }
        if phase == Phase::Prepare && Slot(vote.replica) == self.params.primary(vote.view) {
            return fx.refuse(format!("a prepare from primary {}", vote.replica));
        }
        let seq = vote.seq;
        let entry = self.log.entry(seq).or_default();
        let votes = if phase == Phase::Prepare {
            &mut entry.prepares
        } else {
            &mut entry.commits
        };
        votes.insert(vote.replica, (vote, cast));
        self.advance(seq, fx);
    }

    /// Moves `seq` on as far as its votes allow: prepared, then committed (execution follows in
    /// [`Self::execute_ready`]).
    fn advance(&mut self, seq: u64, fx: &mut Effects<A>) {
        if !self.active {
            return;
        }
        let view = self.view;
        let quorum = self.params.quorum();
        let f = self.params.f;
        let Some(entry) = self.log.get_mut(&seq) else {
            return;
        };
        let Some((pre_cast, pre_vote, batch)) = entry.accepted.as_ref() else {
            return;
        };
        if pre_vote.view != view {
            return;
        }
        let digest = pre_vote.digest;
        let matching = |votes: &BTreeMap<u32, (Vote, Cast<Vote>)>| -> Vec<Cast<Vote>> {
            votes
                .values()
                .filter(|(vote, _)| vote.view == view && vote.digest == digest)
                .map(|(_, cast)| cast.clone())
                .collect()
        };
        if entry.committed_in != Some(view) {
            let prepares = matching(&entry.prepares);
            if prepares.len() < 2 * f {
                return;
            }
            let proof = PreparedProof {
                preprepare: pre_cast.clone(),
                batch: batch.clone(),
                prepares: prepares.into_iter().take(2 * f).collect(),
            };
            fx.changes.push(Change::Prepared(Box::new(proof.clone())));
            entry.prepared = Some((view, proof));
            entry.committed_in = Some(view);
            let commit = Vote {
                instance: self.instance,
                phase: Phase::Commit,
                view,
                seq,
                digest,
                replica: self.me.0,
            };
            if let Some(cast) = sign(&self.secret, self.me, commit.clone()) {
                entry.commits.insert(self.me.0, (commit, cast.clone()));
                broadcast(self.params.n, self.me, Message::Vote(cast), fx);
            }
        }
        if entry.decided.is_some() {
            return;
        }
        let commits = matching(&entry.commits);
        if commits.len() < quorum {
            return;
        }
        let Some((_, _, batch)) = entry.accepted.as_ref() else {
            return;
        };
        let decided = Committed {
            view,
            seq,
            batch: batch.clone(),
            commits: commits.into_iter().take(quorum).collect(),
        };
        fx.changes
            .push(Change::Committed(Box::new(decided.clone())));
        entry.decided = Some(decided);
    }

    /// A decided batch from a peer, for a number this replica missed.
    fn on_committed(&mut self, committed: Committed<A::Op>, fx: &mut Effects<A>) {
        if committed.seq <= self.executed || !self.in_window(committed.seq) {
            return;
        }
        if self
            .log
            .get(&committed.seq)
            .is_some_and(|entry| entry.decided.is_some())
        {
            return;
        }
        if let Err(reason) = committed.check(&self.params, &self.keys, &self.instance) {
            return fx.refuse(format!(
                "commit certificate for {}: {reason}",
                committed.seq
            ));
        }
        fx.changes
            .push(Change::Committed(Box::new(committed.clone())));
        let seq = committed.seq;
        self.log.entry(seq).or_default().decided = Some(committed);
    }

    // -----------------------------------------------------------------------------------------
    // Execution and checkpoints

    fn execute_ready(&mut self, now: Time, fx: &mut Effects<A>) {
        while let Some(decided) = self
            .log
            .get(&(self.executed + 1))
            .and_then(|entry| entry.decided.as_ref())
        {
            let seq = decided.seq;
            let batch = decided.batch.clone();
            let batch_digest = batch.digest();
            let position = self
                .trail
                .as_ref()
                .map(|trail| trail.position(seq, batch_digest.0));
            let mut out = AppOutput::default();
            let mut answers = Vec::new();
            for request in batch.requests {
                let digest = request.digest();
                self.waiting.remove(&digest);
                self.in_log.remove(&digest);
                let (result, again) = match self.replies.find(request.origin, request.id, &digest) {
                    Some(result) => (result.clone(), true),
                    None => {
                        let result = self.app.execute(&request.op, batch.nondet, seq, &mut out);
                        self.replies
                            .insert(request.origin, request.id, digest, result.clone());
                        self.stats.requests += 1;
                        (result, false)
                    }
                };
                let Origin::Client(client) = request.origin else {
                    if let (Some(trail), Some(at), false) = (self.trail.as_mut(), position, again) {
                        trail.remember(digest, at);
                    }
                    continue;
                };
                let reply = Reply {
                    view: self.view,
                    id: request.id,
                    request: digest,
                    result,
                };
                match self.trail.as_mut() {
                    // Ordered again (a faulty primary, or a view change re-proposing it): under E
                    // the answer names where it first executed, as every other answer does.
                    Some(trail) if again => {
                        if let Some(answer) = trail.answer_again(client, &digest, reply) {
                            fx.notify.push((client, request.id, answer));
                        }
                    }
                    Some(trail) => {
                        if let Some(at) = position {
                            trail.remember(digest, at);
                        }
                        answers.push((client, reply));
                    }
                    None => answers.push((client, reply)),
                }
            }
            self.executed = seq;
            self.stats.executed += 1;
            match self.trail.as_mut() {
                None => fx.notify.extend(
                    answers
                        .into_iter()
                        .map(|(client, reply)| (client, reply.id, Answer::Executed(reply))),
                ),
                Some(trail) => {
                    // The answers leave with slot `seq` of the request history, once the
                    // trusted log holds it (after the commit certificate is durable).
                    if let Err(reason) = trail.executed(seq, batch_digest.0, answers) {
                        fx.refuse(reason);
                    }
                }
            }
            self.app_effects(now, out, fx);
            if seq.is_multiple_of(self.params.checkpoint_interval) {
                self.take_checkpoint(seq, fx);
            }
        }
        self.propose(now, fx);
    }

    fn take_checkpoint(&mut self, seq: u64, fx: &mut Effects<A>) {
        let snapshot = self.snapshot();
        let digest = state_digest(&snapshot);
        self.own_checkpoints
            .insert(seq, (digest, Bytes::from(snapshot)));
        let vote = Vote {
            instance: self.instance,
            phase: Phase::Checkpoint,
            view: 0,
            seq,
            digest,
            replica: self.me.0,
        };
        if let Some(cast) = self.sign(vote.clone()) {
            self.broadcast(Message::Vote(cast.clone()), fx);
            self.on_checkpoint(cast, vote, fx);
        }
    }

    fn on_checkpoint(&mut self, cast: Cast<Vote>, vote: Vote, fx: &mut Effects<A>) {
        if vote.seq <= self.stable.seq || !vote.seq.is_multiple_of(self.params.checkpoint_interval)
        {
            return;
        }
        if vote.seq > self.stable.seq + 2 * self.params.window {
            // Far ahead: remember only that this replica is behind, not the vote.
            self.behind = true;
            return;
        }
        let seq = vote.seq;
        self.checkpoint_votes
            .entry(seq)
            .or_default()
            .insert(vote.replica, (vote.digest, cast));
        let votes = &self.checkpoint_votes[&seq];
        let mut counts: BTreeMap<Digest, usize> = BTreeMap::new();
        for (digest, _) in votes.values() {
            *counts.entry(*digest).or_default() += 1;
        }
        let Some((digest, _)) = counts.into_iter().find(|(_, n)| *n >= self.params.quorum()) else {
            return;
        };
        let proof = CheckpointProof {
            seq,
            digest,
            votes: votes
                .values()
                .filter(|(d, _)| *d == digest)
                .map(|(_, cast)| cast.clone())
                .take(self.params.quorum())
                .collect(),
        };
        match self.own_checkpoints.get(&seq) {
            Some((own, snapshot)) if *own == digest => {
                let transfer = StateTransfer {
                    proof,
                    snapshot: snapshot.clone(),
                };
                fx.changes
                    .push(Change::Checkpoint(Box::new(transfer.clone())));
                self.make_stable(transfer);
            }
            // Behind the quorum, or (worse) at a different state: fetch the proven one.
            _ => self.behind = true,
        }
    }

    /// Adopts a proven checkpoint whose state this replica holds (its own or transferred).
    fn make_stable(&mut self, transfer: StateTransfer) {
        let seq = transfer.proof.seq;
        self.stable = transfer.proof;
        self.stable_state = transfer.snapshot;
        self.log = self.log.split_off(&(seq + 1));
        self.checkpoint_votes = self.checkpoint_votes.split_off(&(seq + 1));
        self.own_checkpoints = self.own_checkpoints.split_off(&(seq + 1));
        self.next_seq = self.next_seq.max(seq + 1);
        if let Some(trail) = self.trail.as_mut() {
            // The attestations already made stay with the replica for retransmissions (spec
            // §7.2 T8), whatever the log forgets.
            trail.truncate(seq);
        }
    }

    /// Installs a proven checkpoint's state, replacing this replica's if it is ahead of it.
    fn install(&mut self, transfer: StateTransfer) -> Result<bool, String> {
        transfer
            .proof
            .check(&self.params, &self.keys, &self.instance, &self.initial)?;
        if state_digest(&transfer.snapshot) != transfer.proof.digest {
            return Err("a state that does not match its checkpoint".into());
        }
        if transfer.proof.seq <= self.stable.seq {
            return Ok(false);
        }
        if transfer.proof.seq > self.executed
            || self
                .own_checkpoints
                .get(&transfer.proof.seq)
                .is_none_or(|(own, _)| *own != transfer.proof.digest)
        {
            let state: State<A::Result> = wire::decode(
                &transfer.snapshot,
                A::SNAPSHOT_BYTES_MAX + REPLY_STATE_SLACK,
            )
            .map_err(|e| format!("state: {e}"))?;
            let seq = transfer.proof.seq;
            match self.trail.as_mut() {
                None => self.app.restore(&state.app)?,
                Some(trail) => {
                    let tail: Tail = wire::decode(&state.app, A::SNAPSHOT_BYTES_MAX + TAIL_SLACK)
                        .map_err(|e| format!("state: {e}"))?;
                    self.app.restore(&tail.app)?;
                    // The request history moves to the installed number (spec §3.3.5).
                    trail.installed(seq, tail.batch, tail.previous, tail.executed);
                }
            }
            self.replies = state.replies;
            self.executed = seq;
        }
        self.make_stable(transfer);
        Ok(true)
    }

    fn on_state(&mut self, now: Time, transfer: StateTransfer, fx: &mut Effects<A>) {
        if transfer.proof.seq <= self.stable.seq {
            return;
        }
        match self.install(transfer.clone()) {
            Ok(true) => {
                self.stats.transfers += 1;
                fx.changes.push(Change::Checkpoint(Box::new(transfer)));
                // Requests the transferred state executed no longer wait.
                let replies = &self.replies;
                self.waiting.retain(|digest, waiting| {
                    replies
                        .find(waiting.request.origin, waiting.request.id, digest)
                        .is_none()
                });
                self.execute_ready(now, fx);
            }
            Ok(false) => {}
            Err(reason) => fx.refuse(format!("state transfer: {reason}")),
        }
    }

    // -----------------------------------------------------------------------------------------
    // View changes

    fn timeout(&self) -> u64 {
        self.params.view_change_ms << self.backoff.min(BACKOFF_MAX)
    }

    fn start_view_change(&mut self, now: Time, view: u64, fx: &mut Effects<A>) {
        debug_assert!(view > self.view || (view == self.view && self.active));
        self.view = view;
        self.active = false;
        self.backoff = self.backoff.saturating_add(1);
        self.changing_since = now;
        self.stats.view_changes += 1;
        fx.changes.push(Change::View {
            view,
            active: false,
        });
        if let Some(cast) = self.own_view_change(fx) {
            self.broadcast(Message::ViewChange(Box::new(cast)), fx);
        }
        self.try_new_view(now, fx);
    }

    /// Signs and keeps this replica's view change for its current view.
    fn own_view_change(&mut self, fx: &mut Effects<A>) -> Option<Cast<ViewChange<A::Op>>> {
        let view = self.view;
        let drop_prepared = self.params.mutations.drop_prepared;
        let prepared = self
            .log
            .iter()
            .filter(|(seq, _)| **seq > self.stable.seq && !drop_prepared)
            .filter_map(|(_, entry)| entry.prepared.as_ref().map(|(_, proof)| proof.clone()))
            .collect();
        let change = ViewChange {
            instance: self.instance,
            view,
            replica: self.me.0,
            stable: self.stable.clone(),
            prepared,
        };
        match Cast::sign(&self.secret, self.me, change.clone()) {
            Ok(cast) => {
                self.view_changes.insert(self.me.0, (change, cast.clone()));
                Some(cast)
            }
            Err(error) => {
                fx.refuse(format!("own view change: {error}"));
                None
            }
        }
    }

    fn on_view_change(&mut self, now: Time, cast: Cast<ViewChange<A::Op>>, fx: &mut Effects<A>) {
        let change = match cast.open(&self.keys) {
            Ok(change) => change,
            Err(reason) => return fx.refuse(format!("view change: {reason}")),
        };
        if change.replica != cast.slot {
            return fx.refuse(format!(
                "slot {} sent slot {}'s view change",
                cast.slot, change.replica
            ));
        }
        if change.view < self.view || (change.view == self.view && self.active) {
            return;
        }
        if self
            .view_changes
            .get(&cast.slot)
            .is_some_and(|(known, _)| known.view >= change.view)
        {
            return;
        }
        if let Err(reason) = change.check(&self.params, &self.keys, &self.instance, &self.initial) {
            return fx.refuse(format!("view change from {}: {reason}", cast.slot));
        }
        let view = change.view;
        self.view_changes.insert(cast.slot, (change, cast));
        if !self.active && view == self.view && self.view_changes_for_view() == self.params.quorum()
        {
            // 2f+1 replicas are changing to this view: its timeout runs from now (PBFT).
            self.changing_since = now;
        }
        // f+1 replicas beyond this view include a correct one: follow them, to the lowest view
        // such a set names.
        let mut ahead: Vec<u64> = self
            .view_changes
            .iter()
            .filter(|(slot, (change, _))| **slot != self.me.0 && change.view > self.view)
            .map(|(_, (change, _))| change.view)
            .collect();
        if ahead.len() > self.params.f {
            ahead.sort_unstable_by(|a, b| b.cmp(a));
            let target = ahead[self.params.f];
            self.start_view_change(now, target, fx);
        } else {
            self.try_new_view(now, fx);
        }
    }

    /// View changes held for the current view, this replica's own included.
    fn view_changes_for_view(&self) -> usize {
        self.view_changes
            .values()
            // At this view or beyond: a replica whose latest view change is for a later view has
            // left this one too, and must still count, or the others wait for it forever.
            .filter(|(change, _)| change.view >= self.view)
            .count()
    }

    /// As the primary of a view being changed to: with `2f+1` view changes, start it.
    fn try_new_view(&mut self, now: Time, fx: &mut Effects<A>) {
        if self.active || self.primary() != self.me {
            return;
        }
        let chosen: Vec<Known<A::Op>> = self
            .view_changes
            .values()
            .filter(|(change, _)| change.view == self.view)
            .take(self.params.quorum())
            .cloned()
            .collect();
        if chosen.len() < self.params.quorum() {
            return;
        }
        let changes: Vec<&ViewChange<A::Op>> = chosen.iter().map(|(c, _)| c).collect();
        let (_, plan) = select(&changes);
        let mut preprepares = Vec::new();
        let mut batches = Vec::new();
        for (seq, batch) in plan {
            let vote = Vote {
                instance: self.instance,
                phase: Phase::PrePrepare,
                view: self.view,
                seq,
                digest: batch.digest(),
                replica: self.me.0,
            };
            let Some(cast) = self.sign(vote) else {
                return;
            };
            preprepares.push(cast);
            batches.push(batch);
        }
        let new_view = NewView {
            view: self.view,
            view_changes: chosen.into_iter().map(|(_, cast)| cast).collect(),
            preprepares,
            batches,
        };
        self.broadcast(Message::NewView(Box::new(new_view.clone())), fx);
        self.on_new_view(now, new_view, fx);
    }

    fn on_new_view(&mut self, now: Time, new_view: NewView<A::Op>, fx: &mut Effects<A>) {
        if new_view.view < self.view || (new_view.view == self.view && self.active) {
            return;
        }
        let (stable, plan) = match self.check_new_view(&new_view) {
            Ok(checked) => checked,
            Err(reason) => return fx.refuse(format!("new view {}: {reason}", new_view.view)),
        };
        self.view = new_view.view;
        self.active = true;
        self.backoff = 0;
        fx.changes.push(Change::View {
            view: self.view,
            active: true,
        });
        self.view_changes
            .retain(|_, (change, _)| change.view > new_view.view);
        // Catch up to the view's starting checkpoint: adopt it if this replica computed the same
        // state, otherwise ask for it.
        if stable.seq > self.stable.seq {
            match self.own_checkpoints.get(&stable.seq) {
                Some((own, snapshot)) if *own == stable.digest => {
                    let transfer = StateTransfer {
                        proof: stable,
                        snapshot: snapshot.clone(),
                    };
                    fx.changes
                        .push(Change::Checkpoint(Box::new(transfer.clone())));
                    self.make_stable(transfer);
                }
                _ => self.behind = true,
            }
        }
        let mut last = stable_seq_of(&plan, self.stable.seq);
        for ((seq, batch), cast) in plan.into_iter().zip(new_view.preprepares.iter().cloned()) {
            last = last.max(seq);
            if !self.in_window(seq) {
                continue;
            }
            let vote = Vote {
                instance: self.instance,
                phase: Phase::PrePrepare,
                view: self.view,
                seq,
                digest: batch.digest(),
                replica: self.params.primary(self.view).0,
            };
            self.accept(cast, vote, batch, fx);
        }
        self.next_seq = last.max(self.stable.seq) + 1;
        for waiting in self.waiting.values_mut() {
            waiting.since = waiting.since.max(now);
        }
        self.new_view = Some(new_view);
        // Requests that were in batches of the old view but not re-proposed wait again.
        self.in_log = self.live_requests();
        self.execute_ready(now, fx);
    }

    /// Requests in batches accepted in the current view and not yet decided.
    fn live_requests(&self) -> BTreeSet<Digest> {
        self.log
            .values()
            .filter(|entry| entry.decided.is_none())
            .filter_map(|entry| entry.accepted.as_ref())
            .filter(|(_, vote, _)| vote.view == self.view)
            .flat_map(|(_, _, batch)| batch.requests.iter().map(Request::digest))
            .collect()
    }

    /// Checks a NEW-VIEW: `2f+1` valid view changes for its view from distinct replicas, and
    /// re-proposals, signed by the view's primary, that are exactly what those view changes
    /// imply. Returns the starting checkpoint and the plan.
    #[allow(clippy::type_complexity)]
    fn check_new_view(
        &self,
        new_view: &NewView<A::Op>,
    ) -> Result<(CheckpointProof, Vec<(u64, Batch<A::Op>)>), String> {
        if new_view.view_changes.len() > self.params.n {
            return Err("more view changes than replicas".into());
        }
        let mut changes = Vec::new();
        let mut senders = BTreeSet::new();
        for cast in &new_view.view_changes {
            let change = cast.open(&self.keys)?;
            if change.replica != cast.slot || change.view != new_view.view {
                return Err(format!(
                    "slot {}'s view change is for another view",
                    cast.slot
                ));
            }
            change.check(&self.params, &self.keys, &self.instance, &self.initial)?;
            if !senders.insert(cast.slot) {
                return Err(format!("two view changes from slot {}", cast.slot));
            }
            changes.push(change);
        }
        if senders.len() < self.params.quorum() {
            return Err(format!(
                "{} view changes, {} needed",
                senders.len(),
                self.params.quorum()
            ));
        }
        let refs: Vec<&ViewChange<A::Op>> = changes.iter().collect();
        let (stable, plan) = select(&refs);
        if new_view.preprepares.len() != plan.len() || new_view.batches.len() != plan.len() {
            return Err("re-proposals that do not follow from the view changes".into());
        }
        let primary = self.params.primary(new_view.view);
        for ((seq, batch), (cast, sent)) in plan
            .iter()
            .zip(new_view.preprepares.iter().zip(&new_view.batches))
        {
            let vote = cast.vote(&self.keys, &self.instance, Phase::PrePrepare)?;
            if Slot(cast.slot) != primary
                || vote.view != new_view.view
                || vote.seq != *seq
                || vote.digest != batch.digest()
                || sent != batch
            {
                return Err(format!(
                    "the re-proposal for {seq} is not the one the view changes imply"
                ));
            }
        }
        Ok((stable.clone(), plan))
    }

    // -----------------------------------------------------------------------------------------
    // Catching up

    fn status(&self) -> Status {
        Status {
            view: self.view,
            active: self.active,
            executed: self.executed,
            stable: self.stable.seq,
        }
    }

    fn on_status(&mut self, from: Slot, status: Status, fx: &mut Effects<A>) {
        // Ahead of this replica: say where it stands at the next tick, so the peer sends what it
        // lacks. Not in answer to this STATUS: two replicas each ahead of the other in one
        // respect (one in view, the other in numbers executed) would answer each other's answers
        // for as long as what they send cannot close the gap.
        if status.executed > self.executed
            || status.view > self.view
            || status.stable > self.executed
        {
            self.behind = true;
        }
        if status.view < self.view || (status.view == self.view && !status.active) {
            if self.active {
                if let Some(new_view) = &self.new_view {
                    fx.sends
                        .push((from, Message::NewView(Box::new(new_view.clone()))));
                }
            } else if let Some((_, cast)) = self.view_changes.get(&self.me.0) {
                fx.sends
                    .push((from, Message::ViewChange(Box::new(cast.clone()))));
            }
        }
        if status.executed < self.stable.seq && self.stable.seq > 0 {
            fx.sends.push((
                from,
                Message::State(Box::new(StateTransfer {
                    proof: self.stable.clone(),
                    snapshot: self.stable_state.clone(),
                })),
            ));
        }
        let from_seq = status.executed.max(self.stable.seq) + 1;
        for (seq, entry) in self.log.range(from_seq..) {
            if let Some(decided) = &entry.decided {
                fx.sends
                    .push((from, Message::Committed(Box::new(decided.clone()))));
                continue;
            }
            if status.view != self.view || !self.active {
                continue;
            }
            if let Some((cast, vote, batch)) = &entry.accepted
                && vote.view == self.view
            {
                fx.sends.push((
                    from,
                    Message::PrePrepare(Box::new((cast.clone(), batch.clone()))),
                ));
            }
            for votes in [&entry.prepares, &entry.commits] {
                if let Some((vote, cast)) = votes.get(&self.me.0)
                    && vote.view == self.view
                {
                    fx.sends.push((from, Message::Vote(cast.clone())));
                }
            }
            let _ = seq;
        }
        if status.view == self.view && status.active && self.active {
            // Checkpoint votes it may have missed.
            for votes in self.checkpoint_votes.values() {
                if let Some((_, cast)) = votes.get(&self.me.0) {
                    fx.sends.push((from, Message::Vote(cast.clone())));
                }
            }
        }
    }

    fn outstanding(&self) -> bool {
        self.behind
            || !self.active
            || !self.waiting.is_empty()
            || self
                .log
                .values()
                .any(|entry| entry.decided.is_none() && entry.accepted.is_some())
    }

    fn tick(&mut self, now: Time, fx: &mut Effects<A>) {
        if let Some(trail) = self.trail.as_mut() {
            if trail.stopped.is_some() {
                return;
            }
            trail.tick();
        }
        let mut out = AppOutput::default();
        self.app.on_tick(now, &mut out);
        self.app_effects(now, out, fx);
        // View-change deadlines.
        if self.active {
            let oldest = self.waiting.values().map(|w| w.since).min();
            if oldest.is_some_and(|since| now.0 >= since.0.saturating_add(self.timeout())) {
                let next = self.view + 1;
                self.start_view_change(now, next, fx);
            }
        } else if self.view_changes_for_view() >= self.params.quorum()
            && now.0 >= self.changing_since.0.saturating_add(self.timeout())
        {
            // Only a view change 2f+1 replicas are in moves on: one that timed out alone waits
            // for the others (or a later view's f+1) instead of running ahead of them, where
            // they could never reach it again.
            let next = self.view + 1;
            self.start_view_change(now, next, fx);
        }
        if self.outstanding()
            && self
                .last_status
                .is_none_or(|last| now.0 >= last.0.saturating_add(self.params.status_ms))
        {
            self.last_status = Some(now);
            self.behind = false;
            self.broadcast(Message::Status(self.status()), fx);
            // Own requests the primary may not have heard.
            for waiting in self.waiting.values() {
                if waiting.request.origin == Origin::Replica(self.me.0) {
                    let submitted = Submitted {
                        id: waiting.request.id,
                        op: waiting.request.op.clone(),
                    };
                    self.broadcast(Message::Request(submitted), fx);
                }
            }
        }
    }

    fn app_effects(&mut self, now: Time, out: AppOutput<A>, fx: &mut Effects<A>) {
        fx.changes.extend(out.changes.into_iter().map(Change::App));
        for (to, message) in out.sends {
            match to {
                Some(slot) if slot != self.me => fx.sends.push((slot, Message::App(message))),
                Some(_) => {}
                None => self.broadcast(Message::App(message), fx),
            }
        }
        for (id, op) in out.submit {
            // The application names a request it may submit again (STOP, once per epoch) so
            // that a repeat is the same request, not one more; 0 asks for a fresh id.
            let id = if id == 0 {
                self.next_own_id += 1;
                self.next_own_id
            } else {
                id
            };
            let request = Request {
                origin: Origin::Replica(self.me.0),
                id,
                op,
            };
            let submitted = Submitted {
                id,
                op: request.op.clone(),
            };
            self.broadcast(Message::Request(submitted), fx);
            let _ = self.submit(now, request, fx);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Helpers

    fn sign(&self, vote: Vote) -> Option<Cast<Vote>> {
        sign(&self.secret, self.me, vote)
    }

    fn broadcast(&self, message: Message<A>, fx: &mut Effects<A>) {
        broadcast(self.params.n, self.me, message, fx);
    }

    fn handle(&mut self, now: Time, from: Slot, message: Message<A>, fx: &mut Effects<A>) {
        if from.index() >= self.params.n || from == self.me {
            return fx.refuse(format!("a message from slot {from}, not a peer"));
        }
        if let Some(reason) = self.stopped() {
            return fx.refuse(reason.to_string());
        }
        match message {
            Message::Request(submitted) => {
                let request = Request {
                    origin: Origin::Replica(from.0),
                    id: submitted.id,
                    op: submitted.op,
                };
                let _ = self.submit(now, request, fx);
            }
            Message::Forward(request) => {
                if let Origin::Replica(slot) = request.origin
                    && slot as usize >= self.params.n
                {
                    return fx.refuse(format!("a request forwarded from replica {slot}"));
                }
                let _ = self.submit(now, request, fx);
            }
            Message::PrePrepare(pre) => {
                let (cast, batch) = *pre;
                self.on_preprepare(now, cast, batch, fx);
            }
            Message::Vote(cast) => self.on_vote(cast, fx),
            Message::ViewChange(cast) => self.on_view_change(now, *cast, fx),
            Message::NewView(new_view) => self.on_new_view(now, *new_view, fx),
            Message::Status(status) => self.on_status(from, status, fx),
            Message::Committed(committed) => self.on_committed(*committed, fx),
            Message::State(transfer) => self.on_state(now, *transfer, fx),
            Message::App(message) => {
                let mut out = AppOutput::default();
                self.app.on_message(now, from, message, &mut out);
                self.app_effects(now, out, fx);
            }
        }
        self.execute_ready(now, fx);
        if fx.refused.is_some() {
            self.stats.refused += 1;
        }
    }

    fn output(&mut self, mut fx: Effects<A>) -> Output<Self> {
        if let Some(trail) = self.trail.as_mut() {
            trail.flush(&mut fx.attest);
        }
        Output {
            changes: fx.changes,
            reply: None,
            notify: fx.notify,
            sends: fx.sends,
            timers: Vec::new(),
            refused: fx.refused,
            attest: fx.attest,
        }
    }

    // -----------------------------------------------------------------------------------------
    // A2M-PBFT-E: the trusted log's answers

    fn on_answers(&mut self, token: u64, answers: Attested, fx: &mut Effects<A>) {
        let Some(trail) = self.trail.as_mut() else {
            return;
        };
        let released = trail.on_answers(token, answers);
        self.stats.attested += released.attested;
        self.stats.attest_refused += released.refused.len() as u64;
        fx.notify.extend(released.notify);
        for reason in released.refused {
            fx.refuse(reason);
        }
    }
}

/// Slack above the application's snapshot bound for the remembered results.
pub(super) const REPLY_STATE_SLACK: usize = 4 * 1024 * 1024;

pub(super) fn encode_state<A: App>(app: &A, replies: &Replies<A::Result>) -> Vec<u8> {
    wire::encode(&State {
        app: Bytes::from(app.snapshot()),
        replies: replies.clone(),
    })
}

/// Room above the application's snapshot bound for E's [`Tail`]: two digests and
/// [`super::history::EXECUTED_MAX`] remembered numbers.
const TAIL_SLACK: usize = 128 + super::history::EXECUTED_MAX * 128;

/// The replicated state: PBFT's, or under E the same with the request history's last slot in
/// the application's part ([`Tail`]).
fn snapshot_of<A: App, R: Clone + Serialize>(
    app: &A,
    replies: &Replies<A::Result>,
    trail: Option<&Trail<R>>,
) -> Vec<u8> {
    let Some(trail) = trail else {
        return encode_state(app, replies);
    };
    let tail = Tail {
        batch: trail.last.0,
        previous: trail.last.1,
        app: Bytes::from(app.snapshot()),
        executed: trail.executed_list(),
    };
    wire::encode(&State {
        app: Bytes::from(wire::encode(&tail)),
        replies: replies.clone(),
    })
}

/// Sends `message` to every replica but `me`.
fn broadcast<A: App>(n: usize, me: Slot, message: Message<A>, fx: &mut Effects<A>) {
    for slot in (0..n as u32).map(Slot).filter(|slot| *slot != me) {
        fx.sends.push((slot, message.clone()));
    }
}

fn sign(secret: &SecretKey, me: Slot, vote: Vote) -> Option<Cast<Vote>> {
    // A vote is a fixed-size value far below its bound, so signing cannot fail.
    Cast::sign(secret, me, vote).ok()
}

fn stable_seq_of<Op>(plan: &[(u64, Batch<Op>)], stable: u64) -> u64 {
    plan.last().map_or(stable, |(seq, _)| *seq)
}

/// What a set of view changes implies for the new view: the highest stable checkpoint among
/// them, and for every number above it up to the highest prepared one, the batch prepared in the
/// highest view (the null batch where none was).
pub(crate) fn select<'a, Op: Clone + Serialize + 'a>(
    changes: &[&'a ViewChange<Op>],
) -> (&'a CheckpointProof, Vec<(u64, Batch<Op>)>) {
    let stable = changes
        .iter()
        .map(|change| &change.stable)
        .max_by_key(|proof| proof.seq)
        .unwrap_or_else(|| unreachable!("a new view is chosen from 2f+1 view changes"));
    let mut best: BTreeMap<u64, (u64, Digest, &Batch<Op>)> = BTreeMap::new();
    for change in changes {
        for proof in &change.prepared {
            let Ok(vote) = wire::decode::<Vote>(proof.preprepare.signed.bytes(), 128) else {
                continue;
            };
            if vote.seq <= stable.seq {
                continue;
            }
            let candidate = (vote.view, vote.digest, &proof.batch);
            let better = best
                .get(&vote.seq)
                .is_none_or(|(view, digest, _)| (vote.view, vote.digest) > (*view, *digest));
            if better {
                best.insert(vote.seq, candidate);
            }
        }
    }
    let top = best.keys().next_back().copied().unwrap_or(stable.seq);
    let plan = (stable.seq + 1..=top)
        .map(|seq| {
            let batch = best
                .get(&seq)
                .map_or_else(Batch::null, |(_, _, batch)| (*batch).clone());
            (seq, batch)
        })
        .collect();
    (stable, plan)
}

impl<A: App> Replica for PbftReplica<A> {
    const SERVICE: bulwark_core::ServiceId = A::SERVICE;
    type Request = Submitted<A::Op>;
    type Reply = Answer<A::Result>;
    type Message = Message<A>;
    type Change = Change<A>;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        _access: Access,
        request: Submitted<A::Op>,
        _view: &(),
    ) -> Output<Self> {
        let mut fx = Effects::default();
        if let Some(reason) = self.stopped() {
            fx.refuse(reason.to_string());
            return self.output(fx);
        }
        let request = Request {
            origin: Origin::Client(client),
            id: request.id,
            op: request.op,
        };
        let known = self.waiting.contains_key(&request.digest());
        let answer = self.submit(now, request.clone(), &mut fx);
        if answer.is_none() && !known && self.primary() != self.me {
            // The primary may not have it (the client's copy lost, or sent only here); once is
            // enough, the client's own retransmissions reach the primary too.
            let primary = self.primary();
            fx.sends.push((primary, Message::Forward(request)));
        }
        let mut output = self.output(fx);
        output.reply = answer;
        output
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<A>,
        _view: &(),
    ) -> Output<Self> {
        let mut fx = Effects::default();
        self.handle(now, from, message, &mut fx);
        self.output(fx)
    }

    fn on_attested(
        &mut self,
        _now: Time,
        token: u64,
        answers: Attested,
        _view: &(),
    ) -> Output<Self> {
        let mut fx = Effects::default();
        self.on_answers(token, answers, &mut fx);
        self.output(fx)
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let mut fx = Effects::default();
        self.tick(now, &mut fx);
        self.output(fx)
    }

    fn stats(&self) -> ReplicaStats {
        ReplicaStats {
            versions: self.executed,
            ..ReplicaStats::default()
        }
    }
}
