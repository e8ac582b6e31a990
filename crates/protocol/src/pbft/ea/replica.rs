//! One A2M-PBFT-EA replica (see the module docs of [`super`] for the protocol).

use super::msg::{
    Attested, Checkpoint, Committed, Message, NewView, Placed, Prepared, Reported, Stable,
    StateTransfer, Status, ViewChange, Want, body_hash, select, wants_nonce,
};
use super::{Logs, Params};
use crate::machine::{Access, Attest, Attested as Answers, Output, Replica, ReplicaStats};
use crate::pbft::msg::{
    BATCH_BYTES_MAX, Batch, Cast, Origin, Phase, Reply, Request, Submitted, Vote,
};
use crate::pbft::replica::{
    Answer, REPLY_STATE_SLACK, Replies, State, WAITING_MAX, encode_state, state_digest,
};
use crate::pbft::{App, AppOutput};
use bulwark_core::a2m::{
    self, Call, ChainDigest, LogId, Nonce, Outcome, Refusal, Seq, Status as SlotStatus,
};
use bulwark_core::sign::{PublicKey, SecretKey, Unverified};
use bulwark_core::{ClientId, Digest, Slot, Time, wire};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The longest view-change timeout, as a power of two of the base.
const BACKOFF_MAX: u32 = 6;
/// Own messages kept to ask the trusted log for again, at most (one number at a time keeps
/// them few).
const RETRY_MAX: usize = 64;

/// An own message body, recorded before the trusted log is asked to attest it: after a restart
/// the replica asks again (the log answers with the attestation it made, if it made one) and
/// knows never to say anything else at that slot.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "Op: Serialize", deserialize = "Op: Deserialize<'de>"))]
pub enum Said<Op> {
    /// A PRE-PREPARE, with its batch.
    PrePrepare(Bytes, Batch<Op>),
    /// A PREPARE or a COMMIT.
    Vote(Bytes),
    /// A CHECKPOINT.
    Checkpoint(Bytes),
    /// A VIEW-CHANGE.
    ViewChange(Bytes),
    /// A NEW-VIEW.
    NewView(Bytes),
}

impl<Op> Said<Op> {
    fn body(&self) -> &Bytes {
        match self {
            Said::PrePrepare(body, _)
            | Said::Vote(body)
            | Said::Checkpoint(body)
            | Said::ViewChange(body)
            | Said::NewView(body) => body,
        }
    }
}

/// A record a replica makes durable before the trusted log attests what it describes, or before
/// it acts on it. [`EaReplica::restore`] rebuilds the replica from them.
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "A::Change: Serialize",
    deserialize = "A::Change: Deserialize<'de>"
))]
pub enum Change<A: App> {
    /// The replica left `view` for a view change, or (`active`) entered it.
    View {
        /// The view.
        view: u64,
        /// Entered (not still being changed to).
        active: bool,
    },
    /// A message of its own, about to be attested.
    Said(Box<Said<A::Op>>),
    /// A prepared certificate, before its COMMIT.
    Prepared(Box<Prepared<A::Op>>),
    /// A committed certificate, before the batch executes.
    Committed(Box<Committed<A::Op>>),
    /// A stable checkpoint and its state.
    Checkpoint(Box<StateTransfer>),
    /// The NEW-VIEW the replica entered a view by.
    NewView(Box<Attested<NewView<A::Op>>>),
    /// The application's own record.
    App(A::Change),
}

impl<A: App> Clone for Change<A> {
    fn clone(&self) -> Self {
        match self {
            Change::View { view, active } => Change::View {
                view: *view,
                active: *active,
            },
            Change::Said(said) => Change::Said(said.clone()),
            Change::Prepared(p) => Change::Prepared(p.clone()),
            Change::Committed(c) => Change::Committed(c.clone()),
            Change::Checkpoint(c) => Change::Checkpoint(c.clone()),
            Change::NewView(n) => Change::NewView(n.clone()),
            Change::App(c) => Change::App(c.clone()),
        }
    }
}

impl<A: App> std::fmt::Debug for Change<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::View { view, active } => write!(f, "View({view}, active {active})"),
            Change::Said(said) => write!(f, "Said({} bytes)", said.body().len()),
            Change::Prepared(p) => write!(f, "Prepared({})", p.seq),
            Change::Committed(c) => write!(f, "Committed({})", c.seq),
            Change::Checkpoint(c) => write!(f, "Checkpoint({})", c.stable.seq),
            Change::NewView(_) => write!(f, "NewView"),
            Change::App(c) => write!(f, "App({c:?})"),
        }
    }
}

/// Counters for status and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EaStats {
    /// Batches executed.
    pub executed: u64,
    /// Requests executed.
    pub requests: u64,
    /// Views entered after the first.
    pub views: u64,
    /// State transfers installed.
    pub transfers: u64,
    /// Messages refused.
    pub refused: u64,
    /// Attestations the replica's own trusted log refused to make.
    pub trusted_refused: u64,
    /// A new view that re-decided a number this replica executed differently: impossible with
    /// at most `f` faulty replicas; counted (and never acted on) so that tests can see it.
    pub contradicted: u64,
}

/// A view change as checked, with the attested form to forward.
type Known<Op> = (ViewChange<Op>, Attested<ViewChange<Op>>);

/// A request waiting to execute.
struct Waiting<Op> {
    request: Request<Op>,
    /// When it arrived, or when the current view started if later: the view-change clock.
    since: Time,
}

/// What the replica knows about one number above the last it executed.
struct Entry<Op> {
    /// Batches seen for it (from an attested PRE-PREPARE, a NEW-VIEW's plan or a certificate).
    batches: BTreeMap<Digest, Batch<Op>>,
    /// The batch the current view proposes for it.
    proposed: Option<Digest>,
    /// PRE-PREPARE and PREPARE votes by (view, replica).
    prepares: BTreeMap<(u64, u32), (Vote, Attested<Vote>)>,
    /// COMMIT votes by (view, replica).
    commits: BTreeMap<(u64, u32), (Vote, Attested<Vote>)>,
    /// The highest-view prepared certificate.
    prepared: Option<(u64, Prepared<Op>)>,
    /// The committed certificate.
    decided: Option<Committed<Op>>,
}

impl<Op> Default for Entry<Op> {
    fn default() -> Self {
        Entry {
            batches: BTreeMap::new(),
            proposed: None,
            prepares: BTreeMap::new(),
            commits: BTreeMap::new(),
            prepared: None,
            decided: None,
        }
    }
}

/// How far an own message's attestation has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The advance-and-attest was asked for.
    Advance,
    /// The slot was taken already (the message was said before a restart): its lookup.
    Lookup,
    /// After a restart: the lookup first, and the advance only if the slot is still free.
    Recover,
}

/// Trusted-log calls in flight, by token: what to do with the answers.
enum Pending<Op> {
    /// An own message, at its log and slot.
    Said {
        said: Said<Op>,
        log: LogId,
        seq: Seq,
        step: Step,
    },
    /// The request history's slot for an executed number, and the checkpoint with it.
    History {
        expected: ChainDigest,
        checkpoint: Option<(Bytes, Checkpoint)>,
    },
    /// Calls whose answers only matter as done (abandonments, truncations).
    Housekeeping,
    /// The lookups of a view change under construction.
    Lookups(Box<Draft<Op>>),
}

/// A view change waiting for its lookups.
struct Draft<Op> {
    to: u64,
    stable: Stable,
    committed: Vec<Committed<Op>>,
    prepared: Vec<Prepared<Op>>,
    wants: Vec<Cast<Want>>,
    top: u64,
}

/// Everything one input produces, before it becomes the contract's [`Output`].
struct Effects<A: App> {
    changes: Vec<Change<A>>,
    sends: Vec<(Slot, Message<A>)>,
    notify: Vec<(ClientId, u64, Answer<A::Result>)>,
    attest: Vec<Attest>,
    refused: Option<String>,
}

impl<A: App> Default for Effects<A> {
    fn default() -> Self {
        Effects {
            changes: Vec::new(),
            sends: Vec::new(),
            notify: Vec::new(),
            attest: Vec::new(),
            refused: None,
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

/// The pieces a replica is built from.
pub struct Setup<A: App> {
    /// Sizes and timeouts.
    pub params: Params,
    /// This replica's slot.
    pub me: Slot,
    /// Its signing key (for its WANT-VIEW-CHANGEs, the one message not attested).
    pub secret: SecretKey,
    /// Every replica's signing key, by slot.
    pub keys: Vec<PublicKey>,
    /// Every replica's trusted-log key, by slot.
    pub trusted: Vec<PublicKey>,
    /// The logs each replica's trusted log keeps for this instance.
    pub logs: Logs,
    /// What distinguishes this instance's messages from any other's.
    pub instance: Digest,
    /// The application in its initial state.
    pub app: A,
}

/// One A2M-PBFT-EA replica ordering requests for `A`.
pub struct EaReplica<A: App> {
    params: Params,
    me: Slot,
    secret: SecretKey,
    keys: Vec<PublicKey>,
    trusted: Vec<PublicKey>,
    logs: Logs,
    instance: Digest,
    initial: Digest,
    app: A,
    replies: Replies<A::Result>,
    /// The last view entered.
    view: u64,
    /// Whether the replica is in `view` (not changing away from it).
    active: bool,
    /// The view it is changing to.
    target: u64,
    backoff: u32,
    changing_since: Time,
    /// The highest number the current view's NEW-VIEW re-decides: the primary proposes above it.
    plan_top: u64,
    log: BTreeMap<u64, Entry<A::Op>>,
    /// Own votes per number, to repeat (PRE-PREPAREs with their batch).
    own_votes: BTreeMap<u64, Vec<Message<A>>>,
    executed: u64,
    /// The request history's digest at `executed`.
    history: ChainDigest,
    /// Committed certificates above the stable checkpoint, for view changes and laggards.
    committed: BTreeMap<u64, Committed<A::Op>>,
    stable: Stable,
    stable_state: Bytes,
    /// Own checkpoint states above the stable one: digest, state, and the checkpoint sent.
    own_checkpoints: BTreeMap<u64, (Digest, Bytes)>,
    checkpoint_votes: BTreeMap<u64, BTreeMap<u32, (Checkpoint, Attested<Checkpoint>)>>,
    /// Its own checkpoints above the stable one, to repeat to a peer still below them: a lost
    /// one would leave the window closed for good when only `f+1` replicas are correct.
    own_checkpoint_messages: BTreeMap<u64, Attested<Checkpoint>>,
    waiting: BTreeMap<Digest, Waiting<A::Op>>,
    arrivals: VecDeque<Digest>,
    in_log: BTreeSet<Digest>,
    /// The highest slot of its PREPARE and COMMIT logs the replica has asked for: never again
    /// at or below (its trusted log would refuse, and one request at a time keeps them rising).
    prepare_high: Seq,
    commit_high: Seq,
    /// COMMIT bodies it had attested, by (view, number), for the disclosure of a view change.
    own_commits: BTreeMap<(u64, u64), Bytes>,
    wants: BTreeMap<u64, BTreeMap<u32, Cast<Want>>>,
    /// The view its own view change is (being) made for.
    changed_for: u64,
    view_changes: BTreeMap<u64, BTreeMap<u32, Known<A::Op>>>,
    /// The view its own NEW-VIEW was made for.
    new_view_for: u64,
    /// The NEW-VIEW of the current view, to relay.
    new_view: Option<Attested<NewView<A::Op>>>,
    pending: BTreeMap<u64, Pending<A::Op>>,
    next_token: u64,
    behind: bool,
    last_status: Option<Time>,
    next_own_id: u64,
    /// Trusted-log calls a restarted replica makes with its first output.
    resume: Vec<Attest>,
    /// Own messages whose attestation the trusted log could not be asked for (its process
    /// down): asked again, lookup first, at the next tick.
    retry: Vec<(Said<A::Op>, LogId, Seq)>,
    stats: EaStats,
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

impl<A: App> EaReplica<A> {
    /// A replica in view 0 at the application's initial state, with empty logs.
    pub fn new(setup: Setup<A>) -> Result<EaReplica<A>, String> {
        setup.params.validate()?;
        let n = setup.params.n;
        if setup.keys.len() != n || setup.trusted.len() != n || setup.me.index() >= n {
            return Err(format!(
                "{} keys, {} trusted-log keys and slot {} for {n} replicas",
                setup.keys.len(),
                setup.trusted.len(),
                setup.me
            ));
        }
        if setup.keys[setup.me.index()] != setup.secret.public_key() {
            return Err(format!("the signing key is not slot {}'s", setup.me));
        }
        let replies = Replies {
            by_origin: BTreeMap::new(),
        };
        let snapshot = encode_state(&setup.app, &replies);
        let initial = state_digest(&snapshot);
        Ok(EaReplica {
            params: setup.params,
            me: setup.me,
            secret: setup.secret,
            keys: setup.keys,
            trusted: setup.trusted,
            logs: setup.logs,
            instance: setup.instance,
            initial,
            app: setup.app,
            replies,
            view: 0,
            active: true,
            target: 0,
            backoff: 0,
            changing_since: Time(0),
            plan_top: 0,
            log: BTreeMap::new(),
            own_votes: BTreeMap::new(),
            executed: 0,
            history: [0; 32],
            committed: BTreeMap::new(),
            stable: Stable::initial(initial),
            stable_state: Bytes::from(snapshot),
            own_checkpoints: BTreeMap::new(),
            checkpoint_votes: BTreeMap::new(),
            own_checkpoint_messages: BTreeMap::new(),
            waiting: BTreeMap::new(),
            arrivals: VecDeque::new(),
            in_log: BTreeSet::new(),
            prepare_high: 0,
            commit_high: 0,
            own_commits: BTreeMap::new(),
            wants: BTreeMap::new(),
            changed_for: 0,
            view_changes: BTreeMap::new(),
            new_view_for: 0,
            new_view: None,
            pending: BTreeMap::new(),
            next_token: 0,
            behind: false,
            last_status: None,
            next_own_id: 1 << 63,
            resume: Vec::new(),
            retry: Vec::new(),
            stats: EaStats::default(),
        })
    }

    /// A replica rebuilt from its records, in the order they were made durable, every
    /// attestation and certificate checked again. It re-executes the committed batches above
    /// its checkpoint, and with its first output asks its trusted log again for each message
    /// it recorded in its current view and cannot know was sent: the log answers with what it
    /// attested, or attests it now, and never lets it say another thing there.
    pub fn restore(
        setup: Setup<A>,
        records: impl IntoIterator<Item = Change<A>>,
        now: Time,
    ) -> Result<EaReplica<A>, RestoreError> {
        let mut replica =
            EaReplica::new(setup).map_err(|reason| RestoreError::Record { index: 0, reason })?;
        let mut said = Vec::new();
        for (index, record) in records.into_iter().enumerate() {
            replica
                .replay(record, &mut said)
                .map_err(|reason| RestoreError::Record { index, reason })?;
        }
        let mut fx = Effects::default();
        while let Some(decided) = replica
            .log
            .get(&(replica.executed + 1))
            .and_then(|entry| entry.decided.clone())
        {
            replica.log.remove(&decided.seq);
            replica.execute(now, decided, &mut fx);
        }
        // Its own messages of the current view above what it executed, in the order said.
        for said in said {
            let keep = match &said {
                Said::PrePrepare(body, _) | Said::Vote(body) => {
                    wire::decode::<Vote>(body, Vote::BYTES_MAX)
                        .is_ok_and(|vote| vote.view == replica.view && vote.seq > replica.executed)
                }
                Said::ViewChange(body) => {
                    wire::decode::<ViewChange<A::Op>>(body, ViewChange::<A::Op>::BYTES_MAX)
                        .is_ok_and(|change| change.to > replica.view)
                }
                Said::NewView(body) => {
                    wire::decode::<NewView<A::Op>>(body, NewView::<A::Op>::BYTES_MAX)
                        .is_ok_and(|new_view| new_view.view > replica.view)
                }
                Said::Checkpoint(_) => false,
            };
            if !keep {
                continue;
            }
            let place = match &said {
                Said::PrePrepare(body, _) | Said::Vote(body) => {
                    wire::decode::<Vote>(body, Vote::BYTES_MAX).map(|v| v.place(&replica.logs))
                }
                Said::ViewChange(body) => {
                    wire::decode::<ViewChange<A::Op>>(body, ViewChange::<A::Op>::BYTES_MAX)
                        .map(|c| c.place(&replica.logs))
                }
                Said::NewView(body) => {
                    wire::decode::<NewView<A::Op>>(body, NewView::<A::Op>::BYTES_MAX)
                        .map(|n| n.place(&replica.logs))
                }
                Said::Checkpoint(_) => continue,
            };
            if let Ok((log, seq)) = place {
                replica.ask(said, log, seq, Step::Recover, &mut fx);
            }
        }
        replica.resume = fx.attest;
        replica.in_log = replica
            .log
            .values()
            .filter_map(|entry| entry.decided.as_ref())
            .flat_map(|decided| decided.batch.requests.iter().map(Request::digest))
            .collect();
        replica.changing_since = now;
        replica.behind = true;
        Ok(replica)
    }

    fn replay(&mut self, record: Change<A>, said: &mut Vec<Said<A::Op>>) -> Result<(), String> {
        match record {
            Change::View { view, active } => {
                self.view = self.view.max(view);
                self.active = active;
                self.target = self.target.max(view);
            }
            Change::Said(record) => {
                match &*record {
                    Said::PrePrepare(body, _) | Said::Vote(body) => {
                        let vote: Vote = wire::decode(body, Vote::BYTES_MAX)
                            .map_err(|e| format!("an own vote: {e}"))?;
                        self.note_vote(&vote);
                        if vote.phase == Phase::Commit {
                            self.own_commits.insert((vote.view, vote.seq), body.clone());
                        }
                    }
                    Said::ViewChange(body) => {
                        let change: ViewChange<A::Op> =
                            wire::decode(body, ViewChange::<A::Op>::BYTES_MAX)
                                .map_err(|e| format!("an own view change: {e}"))?;
                        self.changed_for = self.changed_for.max(change.to);
                        self.target = self.target.max(change.to);
                        // Its abandonments were made before it: the commit log is past them.
                        self.commit_high =
                            self.commit_high.max(self.logs.end_of_view(change.to - 1));
                    }
                    Said::NewView(body) => {
                        let new_view: NewView<A::Op> =
                            wire::decode(body, NewView::<A::Op>::BYTES_MAX)
                                .map_err(|e| format!("an own new view: {e}"))?;
                        self.new_view_for = self.new_view_for.max(new_view.view);
                    }
                    Said::Checkpoint(_) => {}
                }
                said.push(*record);
            }
            Change::Prepared(prepared) => {
                let view =
                    prepared.check(&self.params, &self.logs, &self.trusted, &self.instance)?;
                if prepared.seq > self.stable.seq {
                    let entry = self.log.entry(prepared.seq).or_default();
                    entry
                        .batches
                        .insert(prepared.batch.digest(), prepared.batch.clone());
                    if entry.prepared.as_ref().is_none_or(|(v, _)| *v <= view) {
                        entry.prepared = Some((view, *prepared));
                    }
                }
            }
            Change::Committed(committed) => {
                committed.check(&self.params, &self.logs, &self.trusted, &self.instance)?;
                if committed.seq > self.executed {
                    let entry = self.log.entry(committed.seq).or_default();
                    entry
                        .batches
                        .insert(committed.batch.digest(), committed.batch.clone());
                    entry.decided = Some(*committed);
                }
            }
            Change::Checkpoint(transfer) => {
                transfer.stable.check(
                    &self.params,
                    &self.logs,
                    &self.trusted,
                    &self.instance,
                    &self.initial,
                )?;
                if state_digest(&transfer.state) != transfer.stable.state {
                    return Err("a checkpoint whose state does not match it".into());
                }
                let seq = transfer.stable.seq;
                if seq > self.stable.seq {
                    if seq > self.executed {
                        let state: State<A::Result> = wire::decode(
                            &transfer.state,
                            A::SNAPSHOT_BYTES_MAX + REPLY_STATE_SLACK,
                        )
                        .map_err(|e| format!("state: {e}"))?;
                        self.app.restore(&state.app)?;
                        self.replies = state.replies;
                        self.executed = seq;
                        self.history = transfer.stable.history;
                    }
                    self.stable = transfer.stable;
                    self.stable_state = transfer.state;
                    self.log = self.log.split_off(&(seq + 1));
                    self.committed = self.committed.split_off(&(seq + 1));
                    self.own_checkpoints = self.own_checkpoints.split_off(&(seq + 1));
                }
            }
            Change::NewView(attested) => {
                let (new_view, stable, plan) = self.check_new_view(&attested)?;
                if new_view.view >= self.view {
                    self.view = new_view.view;
                    self.target = self.target.max(new_view.view);
                    self.plan_top = plan.last().map_or(stable.seq, |(seq, _)| *seq);
                    self.new_view = Some(*attested);
                    for (seq, batch) in plan {
                        if seq > self.executed {
                            let digest = batch.digest();
                            let entry = self.log.entry(seq).or_default();
                            entry.batches.insert(digest, batch);
                            entry.proposed = Some(digest);
                        }
                    }
                }
            }
            Change::App(change) => self.app.replay(&change),
        }
        Ok(())
    }

    /// Fresh effects, carrying the calls a restart left to make.
    fn effects(&mut self) -> Effects<A> {
        Effects {
            attest: std::mem::take(&mut self.resume),
            ..Effects::default()
        }
    }

    /// The application.
    pub fn app(&self) -> &A {
        &self.app
    }

    /// The last view entered, and whether the replica is in it.
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

    /// The request history's digest at the last number executed: equal on every correct
    /// replica that executed as far.
    pub fn history(&self) -> ChainDigest {
        self.history
    }

    /// The digest of the replicated state now.
    pub fn state_digest(&self) -> Digest {
        state_digest(&encode_state(&self.app, &self.replies))
    }

    /// Counters.
    pub fn ea_stats(&self) -> &EaStats {
        &self.stats
    }

    #[cfg(test)]
    pub(super) fn debug_target(&self) -> String {
        format!(
            "target {} changed_for {} nv_for {} plan_top {} vcs {:?} wants {:?} prepare_high {:x} commit_high {:x} log {:?}",
            self.target,
            self.changed_for,
            self.new_view_for,
            self.plan_top,
            self.view_changes
                .iter()
                .map(|(k, v)| (
                    *k,
                    v.values()
                        .map(|(c, _)| (c.replica, c.from))
                        .collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>(),
            self.wants
                .iter()
                .map(|(k, v)| (*k, v.keys().copied().collect::<Vec<_>>()))
                .collect::<Vec<_>>(),
            self.prepare_high,
            self.commit_high,
            self.log
                .iter()
                .map(|(k, e)| (
                    *k,
                    e.proposed.is_some(),
                    e.prepares.len(),
                    e.commits.len(),
                    e.prepared.as_ref().map(|p| p.0),
                    e.decided.is_some()
                ))
                .collect::<Vec<_>>()
        )
    }

    /// Requests waiting to execute.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Submits an operation of the application's own, as the application's `submit` would.
    pub fn submit_own(&mut self, now: Time, op: A::Op) -> Output<Self> {
        let mut fx = self.effects();
        let out = AppOutput {
            submit: vec![(0, op)],
            ..AppOutput::default()
        };
        self.app_effects(now, out, &mut fx);
        Self::output(fx)
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
            return Some(Answer::Executed(Reply {
                view: self.view,
                id: request.id,
                request: digest,
                result: result.clone(),
            }));
        }
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

    /// As primary of an entered view with nothing in flight: the next batch of waiting
    /// requests, one number at a time (spec §3.4.4).
    fn propose(&mut self, now: Time, fx: &mut Effects<A>) {
        let seq = self.executed + 1;
        if !self.active
            || self.primary() != self.me
            || seq <= self.plan_top
            || !self.in_window(seq)
            || self.prepare_high >= self.logs.slot(self.view, seq)
        {
            return;
        }
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
        for request in &batch.requests {
            self.in_log.insert(request.digest());
        }
        let vote = self.vote(Phase::PrePrepare, seq, batch.digest());
        self.say_vote(vote, Some(batch), fx);
    }

    fn in_window(&self, seq: u64) -> bool {
        seq > self.stable.seq && seq <= self.stable.seq + 2 * self.params.checkpoint_interval
    }

    fn vote(&self, phase: Phase, seq: u64, digest: Digest) -> Vote {
        Vote {
            instance: self.instance,
            phase,
            view: self.view,
            seq,
            digest,
            replica: self.me.0,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Saying things through the trusted log

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// Asks the trusted log to attest `body` at its place, once the record of it is durable.
    fn say<T: Placed>(
        &mut self,
        body: &T,
        kind: impl FnOnce(Bytes) -> Said<A::Op>,
        fx: &mut Effects<A>,
    ) -> Bytes {
        let bytes = Bytes::from(wire::encode(body));
        let (log, seq) = body.place(&self.logs);
        let said = kind(bytes.clone());
        fx.changes.push(Change::Said(Box::new(said.clone())));
        self.ask(said, log, seq, Step::Advance, fx);
        bytes
    }

    fn ask(&mut self, said: Said<A::Op>, log: LogId, seq: Seq, step: Step, fx: &mut Effects<A>) {
        let call = match step {
            Step::Advance => advance_attest(log, seq, said.body()),
            Step::Lookup | Step::Recover => Call::Lookup {
                log,
                seq,
                nonce: a2m::nonce_of(seq),
            },
        };
        let token = self.token();
        fx.attest.push(Attest {
            token,
            calls: vec![call],
        });
        self.pending.insert(
            token,
            Pending::Said {
                said,
                log,
                seq,
                step,
            },
        );
    }

    fn say_vote(&mut self, vote: Vote, batch: Option<Batch<A::Op>>, fx: &mut Effects<A>) {
        self.note_vote(&vote);
        let body = match batch {
            Some(batch) => self.say(&vote, |body| Said::PrePrepare(body, batch), fx),
            None => self.say(&vote, Said::Vote, fx),
        };
        if vote.phase == Phase::Commit {
            self.own_commits.insert((vote.view, vote.seq), body);
        }
    }

    /// The slots an own vote takes: never asked for again.
    fn note_vote(&mut self, vote: &Vote) {
        match vote.phase {
            Phase::PrePrepare | Phase::Prepare => {
                self.prepare_high = self.prepare_high.max(self.logs.slot(vote.view, vote.seq));
            }
            Phase::Commit => {
                self.commit_high = self.commit_high.max(self.logs.slot(vote.view, vote.seq));
            }
            Phase::Checkpoint => {}
        }
    }

    fn on_answers(&mut self, now: Time, token: u64, answers: Answers, fx: &mut Effects<A>) {
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        let refusal = answers.iter().find_map(|a| a.as_ref().err()).cloned();
        let attestations: Vec<Unverified<a2m::Attestation>> = answers
            .into_iter()
            .filter_map(|answer| match answer {
                Ok(Outcome::Attested(signed)) => Some(signed.to_unverified()),
                _ => None,
            })
            .collect();
        match pending {
            Pending::Said {
                said,
                log,
                seq,
                step,
            } => {
                if let Some(Refusal::NotMonotone { .. }) = &refusal
                    && step == Step::Advance
                {
                    // Said before a restart: the slot's lookup shows whether it holds this.
                    return self.ask(said, log, seq, Step::Lookup, fx);
                }
                if step == Step::Recover
                    && attestations
                        .first()
                        .and_then(|a| a.peek().ok())
                        .is_some_and(|a| a.status == SlotStatus::Unassigned)
                {
                    // Recorded, never attested: ask now.
                    return self.ask(said, log, seq, Step::Advance, fx);
                }
                if let Some(Refusal::Stopped(_)) = &refusal {
                    // The trusted log could not be reached: ask again once it may be back.
                    self.stats.trusted_refused += 1;
                    if self.retry.len() < RETRY_MAX {
                        self.retry.push((said, log, seq));
                    }
                    return;
                }
                let Some(attestation) = self.own_attestation(said.body(), attestations, refusal)
                else {
                    return;
                };
                self.said(now, said, attestation, fx);
            }
            Pending::History {
                expected,
                checkpoint,
            } => {
                if let Some(refusal) = refusal {
                    // After a restart the history may hold the slot already; its checkpoint is
                    // then asked for on its own (the log's answer if it made one).
                    if !matches!(refusal, Refusal::NotMonotone { .. }) {
                        self.trusted_refused(&refusal);
                    }
                    if let Some((body, checkpoint)) = checkpoint {
                        let (log, seq) = checkpoint.place(&self.logs);
                        self.ask(Said::Checkpoint(body), log, seq, Step::Recover, fx);
                    }
                    return;
                }
                let history = attestations.first().and_then(|a| a.peek().ok());
                debug_assert!(
                    history.is_none_or(|h| h.digest == expected),
                    "the request history diverged from the replica's own chain"
                );
                if let (Some((body, _)), Some(attestation)) =
                    (checkpoint, attestations.get(1).cloned())
                {
                    self.said(now, Said::Checkpoint(body), attestation, fx);
                }
            }
            Pending::Housekeeping => {}
            Pending::Lookups(draft) => {
                if let Some(refusal) = refusal {
                    self.trusted_refused(&refusal);
                    return;
                }
                self.finish_view_change(*draft, attestations, fx);
            }
        }
    }

    /// An own message, now attested: send it and act on it as on anyone's.
    fn said(
        &mut self,
        now: Time,
        said: Said<A::Op>,
        attestation: Unverified<a2m::Attestation>,
        fx: &mut Effects<A>,
    ) {
        match said {
            Said::PrePrepare(body, batch) => {
                let attested = Attested::new(body, attestation);
                if let Some(vote) = attested.peek() {
                    self.said_vote(now, vote, attested, Some(batch), fx);
                }
            }
            Said::Vote(body) => {
                let attested = Attested::new(body, attestation);
                if let Some(vote) = attested.peek() {
                    self.said_vote(now, vote, attested, None, fx);
                }
            }
            Said::Checkpoint(body) => {
                let attested = Attested::<Checkpoint>::new(body, attestation);
                if let Some(checkpoint) = attested.peek() {
                    self.broadcast(Message::Checkpoint(attested.clone()), fx);
                    self.own_checkpoint_messages
                        .insert(checkpoint.seq, attested.clone());
                    self.on_checkpoint(checkpoint, attested, fx);
                }
            }
            Said::ViewChange(body) => {
                let attested = Attested::new(body, attestation);
                self.broadcast(Message::ViewChange(Box::new(attested.clone())), fx);
                self.on_view_change(now, attested, fx);
            }
            Said::NewView(body) => {
                let attested = Attested::new(body, attestation);
                self.broadcast(Message::NewView(Box::new(attested.clone())), fx);
                self.on_new_view(now, attested, fx);
            }
        }
    }

    /// The attestation of an own body, if the log made it (and, after a lookup, for this body).
    fn own_attestation(
        &mut self,
        body: &Bytes,
        attestations: Vec<Unverified<a2m::Attestation>>,
        refusal: Option<Refusal>,
    ) -> Option<Unverified<a2m::Attestation>> {
        if let Some(refusal) = refusal {
            self.trusted_refused(&refusal);
            return None;
        }
        let attestation = attestations.into_iter().next()?;
        let said = attestation.peek().ok()?;
        if said.status != SlotStatus::Assigned || said.value != body_hash(body) {
            // The slot holds something else: this replica said another thing there before
            // (and lost the record of it). It must not say this one.
            self.stats.trusted_refused += 1;
            return None;
        }
        Some(attestation)
    }

    fn trusted_refused(&mut self, refusal: &Refusal) {
        self.stats.trusted_refused += 1;
        // A correct replica never asks for a slot at or below its log's end; a full log stops
        // it until a checkpoint truncates (spec §7.1 items 4 and 5).
        let _ = refusal;
    }

    /// An own vote, now attested: send it and count it.
    fn said_vote(
        &mut self,
        now: Time,
        vote: Vote,
        attested: Attested<Vote>,
        batch: Option<Batch<A::Op>>,
        fx: &mut Effects<A>,
    ) {
        let message = match (&vote.phase, batch) {
            (Phase::PrePrepare, Some(batch)) => {
                Message::PrePrepare(Box::new((attested.clone(), batch.clone())))
            }
            _ => Message::Vote(attested.clone()),
        };
        self.broadcast(message.clone(), fx);
        self.own_votes
            .entry(vote.seq)
            .or_default()
            .push(message.clone());
        match message {
            Message::PrePrepare(pre) => {
                let (attested, batch) = *pre;
                self.accept_preprepare(now, vote, attested, batch, fx);
            }
            _ => self.accept_vote(now, vote, attested, fx),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Normal case

    fn on_preprepare(
        &mut self,
        now: Time,
        attested: Attested<Vote>,
        batch: Batch<A::Op>,
        fx: &mut Effects<A>,
    ) {
        let vote = match attested.vote(
            &self.params,
            &self.logs,
            &self.trusted,
            &self.instance,
            Phase::PrePrepare,
        ) {
            Ok(vote) if vote.phase == Phase::PrePrepare => vote,
            Ok(_) => return fx.refuse("a PREPARE sent as a PRE-PREPARE".into()),
            Err(reason) => return fx.refuse(reason),
        };
        if vote.digest != batch.digest() {
            return fx.refuse("a PRE-PREPARE whose batch is not the one it names".into());
        }
        if let Err(reason) = self.check_batch(now, &batch) {
            return fx.refuse(reason);
        }
        self.accept_preprepare(now, vote, attested, batch, fx);
    }

    fn check_batch(&self, now: Time, batch: &Batch<A::Op>) -> Result<(), String> {
        if batch.requests.is_empty() || batch.requests.len() > self.params.batch_max {
            return Err(format!("a batch of {} requests", batch.requests.len()));
        }
        if batch.encoded_len() > BATCH_BYTES_MAX {
            return Err("a batch over the size bound".into());
        }
        let mut seen = BTreeSet::new();
        for request in &batch.requests {
            if !seen.insert(request.digest()) {
                return Err("a batch holding one request twice".into());
            }
            if let Origin::Replica(slot) = request.origin
                && slot as usize >= self.params.n
            {
                return Err(format!("a request from replica {slot}"));
            }
            self.app.check_op(&request.op)?;
        }
        let ops: Vec<&A::Op> = batch.requests.iter().map(|r| &r.op).collect();
        self.app.check_proposal(now, batch.nondet, &ops)
    }

    fn accept_preprepare(
        &mut self,
        now: Time,
        vote: Vote,
        attested: Attested<Vote>,
        batch: Batch<A::Op>,
        fx: &mut Effects<A>,
    ) {
        if vote.seq <= self.executed || !self.in_window(vote.seq) || vote.view < self.view {
            return;
        }
        if vote.view == self.view && vote.seq <= self.plan_top {
            return fx.refuse("a PRE-PREPARE for a number the new view decides".into());
        }
        for request in &batch.requests {
            self.in_log.insert(request.digest());
        }
        let entry = self.log.entry(vote.seq).or_default();
        entry.batches.insert(vote.digest, batch);
        if vote.view == self.view {
            entry.proposed = Some(vote.digest);
        }
        entry
            .prepares
            .insert((vote.view, vote.replica), (vote.clone(), attested));
        self.progress(now, vote.seq, fx);
    }

    fn on_vote(&mut self, now: Time, attested: Attested<Vote>, fx: &mut Effects<A>) {
        let phase = match attested.peek().map(|v| v.phase) {
            Some(Phase::Commit) => Phase::Commit,
            Some(Phase::Prepare) => Phase::Prepare,
            _ => return fx.refuse("a vote that is neither PREPARE nor COMMIT".into()),
        };
        match attested.vote(
            &self.params,
            &self.logs,
            &self.trusted,
            &self.instance,
            phase,
        ) {
            Ok(vote) if vote.phase == phase => self.accept_vote(now, vote, attested, fx),
            Ok(_) => fx.refuse("a PRE-PREPARE sent as a vote".into()),
            Err(reason) => fx.refuse(reason),
        }
    }

    fn accept_vote(
        &mut self,
        now: Time,
        vote: Vote,
        attested: Attested<Vote>,
        fx: &mut Effects<A>,
    ) {
        if vote.seq <= self.executed || !self.in_window(vote.seq) {
            return;
        }
        let entry = self.log.entry(vote.seq).or_default();
        let votes = if vote.phase == Phase::Commit {
            &mut entry.commits
        } else {
            if vote.view < self.view {
                return;
            }
            &mut entry.prepares
        };
        votes.insert((vote.view, vote.replica), (vote.clone(), attested));
        self.progress(now, vote.seq, fx);
    }

    /// Moves number `seq` on as far as what the replica holds allows: prepare, prepared,
    /// commit, committed, executed.
    fn progress(&mut self, now: Time, seq: u64, fx: &mut Effects<A>) {
        self.check_committed(seq, fx);
        if seq == self.executed + 1 && self.active {
            self.prepare_next(fx);
            self.check_prepared(seq, fx);
        }
        self.execute_ready(now, fx);
    }

    /// As a backup, PREPAREs the current view's proposal for the next number.
    fn prepare_next(&mut self, fx: &mut Effects<A>) {
        let seq = self.executed + 1;
        if self.primary() == self.me || self.prepare_high >= self.logs.slot(self.view, seq) {
            return;
        }
        let Some(digest) = self.log.get(&seq).and_then(|e| e.proposed) else {
            return;
        };
        let vote = self.vote(Phase::Prepare, seq, digest);
        self.say_vote(vote, None, fx);
    }

    fn check_prepared(&mut self, seq: u64, fx: &mut Effects<A>) {
        let view = self.view;
        let quorum = self.params.quorum();
        let Some(entry) = self.log.get_mut(&seq) else {
            return;
        };
        let Some(digest) = entry.proposed else {
            return;
        };
        let votes: Vec<Attested<Vote>> = entry
            .prepares
            .range((view, 0)..=(view, u32::MAX))
            .filter(|(_, (vote, _))| vote.digest == digest)
            .map(|(_, (_, attested))| attested.clone())
            .collect();
        if votes.len() < quorum || entry.prepared.as_ref().is_some_and(|(v, _)| *v >= view) {
            if entry.prepared.as_ref().is_some_and(|(v, _)| *v == view) {
                self.commit_next(fx);
            }
            return;
        }
        let Some(batch) = entry.batches.get(&digest).cloned() else {
            return;
        };
        let prepared = Prepared {
            seq,
            batch,
            votes: votes.into_iter().take(quorum).collect(),
        };
        entry.prepared = Some((view, prepared.clone()));
        fx.changes.push(Change::Prepared(Box::new(prepared)));
        self.commit_next(fx);
    }

    /// COMMITs the next number once prepared in the current view.
    fn commit_next(&mut self, fx: &mut Effects<A>) {
        let seq = self.executed + 1;
        if !self.active || self.commit_high >= self.logs.slot(self.view, seq) {
            return;
        }
        let Some((view, prepared)) = self.log.get(&seq).and_then(|e| e.prepared.as_ref()) else {
            return;
        };
        if *view != self.view {
            return;
        }
        let vote = self.vote(Phase::Commit, seq, prepared.batch.digest());
        self.say_vote(vote, None, fx);
    }

    fn check_committed(&mut self, seq: u64, fx: &mut Effects<A>) {
        let quorum = self.params.quorum();
        let Some(entry) = self.log.get_mut(&seq) else {
            return;
        };
        if entry.decided.is_some() {
            return;
        }
        let mut groups: BTreeMap<(u64, Digest), Vec<Attested<Vote>>> = BTreeMap::new();
        for ((view, _), (vote, attested)) in &entry.commits {
            groups
                .entry((*view, vote.digest))
                .or_default()
                .push(attested.clone());
        }
        let found = groups.into_iter().find(|((_, digest), votes)| {
            votes.len() >= quorum && entry.batches.contains_key(digest)
        });
        let Some(((_, digest), votes)) = found else {
            return;
        };
        let committed = Committed {
            seq,
            batch: entry.batches[&digest].clone(),
            votes: votes.into_iter().take(quorum).collect(),
        };
        entry.decided = Some(committed.clone());
        fx.changes.push(Change::Committed(Box::new(committed)));
    }

    fn on_committed(&mut self, now: Time, committed: Committed<A::Op>, fx: &mut Effects<A>) {
        if committed.seq <= self.executed || !self.in_window(committed.seq) {
            return;
        }
        if let Err(reason) =
            committed.check(&self.params, &self.logs, &self.trusted, &self.instance)
        {
            return fx.refuse(reason);
        }
        let entry = self.log.entry(committed.seq).or_default();
        if entry.decided.is_none() {
            for request in &committed.batch.requests {
                self.in_log.insert(request.digest());
            }
            fx.changes
                .push(Change::Committed(Box::new(committed.clone())));
            entry.decided = Some(committed);
        }
        self.execute_ready(now, fx);
    }

    fn execute_ready(&mut self, now: Time, fx: &mut Effects<A>) {
        loop {
            let seq = self.executed + 1;
            if !self.in_window(seq) {
                break;
            }
            let Some(decided) = self.log.get(&seq).and_then(|e| e.decided.clone()) else {
                break;
            };
            self.log.remove(&seq);
            self.own_votes.remove(&seq);
            self.execute(now, decided, fx);
        }
        if self.active {
            let next = self.executed + 1;
            if self.log.contains_key(&next) {
                self.prepare_next(fx);
                self.check_prepared(next, fx);
                self.check_committed(next, fx);
            }
            if self.log.get(&next).is_some_and(|e| e.decided.is_some()) {
                return self.execute_ready(now, fx);
            }
        }
        self.propose(now, fx);
    }

    fn execute(&mut self, now: Time, committed: Committed<A::Op>, fx: &mut Effects<A>) {
        let seq = committed.seq;
        debug_assert_eq!(seq, self.executed + 1, "batches execute in order");
        let batch = committed.batch.clone();
        let mut out = AppOutput::default();
        for request in &batch.requests {
            let digest = request.digest();
            self.waiting.remove(&digest);
            self.in_log.remove(&digest);
            let result = match self.replies.find(request.origin, request.id, &digest) {
                Some(result) => result.clone(),
                None => {
                    let result = self.app.execute(&request.op, batch.nondet, seq, &mut out);
                    self.replies
                        .insert(request.origin, request.id, digest, result.clone());
                    self.stats.requests += 1;
                    result
                }
            };
            if let Origin::Client(client) = request.origin {
                fx.notify.push((
                    client,
                    request.id,
                    Answer::Executed(Reply {
                        view: self.view,
                        id: request.id,
                        request: digest,
                        result,
                    }),
                ));
            }
        }
        self.executed = seq;
        self.stats.executed += 1;
        self.committed.insert(seq, committed);
        // The request history: slot `seq` holds the batch's digest, chained as every correct
        // replica chains it (an advance to the next slot is an append; after a restart it is
        // refused instead of filling the wrong slot).
        let request = batch.digest().0;
        let previous = self.history;
        self.history = a2m::chain(self.logs.at(seq), &request, &previous);
        let mut calls = vec![Call::AdvanceAttest {
            log: self.logs.requests,
            seq: self.logs.at(seq),
            digest: previous,
            value: request,
            nonce: a2m::nonce_of(self.logs.at(seq)),
        }];
        let mut checkpoint = None;
        if seq.is_multiple_of(self.params.checkpoint_interval) {
            let snapshot = encode_state(&self.app, &self.replies);
            let state = state_digest(&snapshot);
            self.own_checkpoints
                .insert(seq, (state, Bytes::from(snapshot)));
            let body = Checkpoint {
                instance: self.instance,
                seq,
                state,
                request,
                previous,
                replica: self.me.0,
            };
            let bytes = Bytes::from(wire::encode(&body));
            let (log, slot) = body.place(&self.logs);
            fx.changes
                .push(Change::Said(Box::new(Said::Checkpoint(bytes.clone()))));
            calls.push(advance_attest(log, slot, &bytes));
            checkpoint = Some((bytes, body));
        }
        let token = self.token();
        fx.attest.push(Attest { token, calls });
        self.pending.insert(
            token,
            Pending::History {
                expected: self.history,
                checkpoint,
            },
        );
        self.app_effects(now, out, fx);
    }

    // -----------------------------------------------------------------------------------------
    // Checkpoints and state transfer

    fn on_checkpoint(
        &mut self,
        checkpoint: Checkpoint,
        attested: Attested<Checkpoint>,
        fx: &mut Effects<A>,
    ) {
        if checkpoint.instance != self.instance {
            return fx.refuse("a checkpoint of another instance".into());
        }
        let seq = checkpoint.seq;
        if seq <= self.stable.seq
            || !seq.is_multiple_of(self.params.checkpoint_interval)
            || seq > self.stable.seq + 4 * self.params.checkpoint_interval
        {
            return;
        }
        let votes = self.checkpoint_votes.entry(seq).or_default();
        votes.insert(checkpoint.replica, (checkpoint.clone(), attested));
        let agreed = checkpoint.agreed(&self.logs);
        let matching: Vec<Attested<Checkpoint>> = votes
            .values()
            .filter(|(c, _)| c.agreed(&self.logs) == agreed)
            .map(|(_, a)| a.clone())
            .collect();
        if matching.len() < self.params.quorum() {
            return;
        }
        let stable = Stable {
            seq,
            state: checkpoint.state,
            history: checkpoint.history(&self.logs),
            request: checkpoint.request,
            previous: checkpoint.previous,
            checkpoints: matching.into_iter().take(self.params.quorum()).collect(),
        };
        match self.own_checkpoints.get(&seq) {
            Some((own, state)) if *own == stable.state => {
                let state = state.clone();
                self.make_stable(StateTransfer { stable, state }, fx);
            }
            // Its own state differs or it has not executed so far: it needs the state.
            _ => self.behind = true,
        }
    }

    fn make_stable(&mut self, transfer: StateTransfer, fx: &mut Effects<A>) {
        let seq = transfer.stable.seq;
        fx.changes
            .push(Change::Checkpoint(Box::new(transfer.clone())));
        self.stable = transfer.stable;
        self.stable_state = transfer.state;
        self.committed = self.committed.split_off(&(seq + 1));
        self.own_checkpoints = self.own_checkpoints.split_off(&(seq + 1));
        self.checkpoint_votes = self.checkpoint_votes.split_off(&(seq + 1));
        self.own_checkpoint_messages = self.own_checkpoint_messages.split_off(&(seq + 1));
        self.log = self.log.split_off(&(seq + 1));
        self.own_votes = self.own_votes.split_off(&(seq + 1));
        self.own_commits.retain(|(_, k), _| *k > seq);
        // The request history and checkpoint logs keep slot `seq` (the proof of this
        // checkpoint) and forget below it. Message logs are kept: their abandonment lookups
        // must find SKIPPED, never FORGOTTEN (spec §8 item 11).
        for log in [self.logs.requests, self.logs.checkpoint] {
            let token = self.token();
            fx.attest.push(Attest {
                token,
                calls: vec![Call::Truncate {
                    log,
                    seq: self.logs.at(seq),
                }],
            });
            self.pending.insert(token, Pending::Housekeeping);
        }
    }

    fn on_state(&mut self, now: Time, transfer: StateTransfer, fx: &mut Effects<A>) {
        if transfer.stable.seq <= self.stable.seq {
            return;
        }
        if let Err(reason) = transfer.stable.check(
            &self.params,
            &self.logs,
            &self.trusted,
            &self.instance,
            &self.initial,
        ) {
            return fx.refuse(reason);
        }
        if state_digest(&transfer.state) != transfer.stable.state {
            return fx.refuse("a state that does not match its checkpoint".into());
        }
        let seq = transfer.stable.seq;
        if seq > self.executed {
            let state: State<A::Result> =
                match wire::decode(&transfer.state, A::SNAPSHOT_BYTES_MAX + REPLY_STATE_SLACK) {
                    Ok(state) => state,
                    Err(e) => return fx.refuse(format!("state: {e}")),
                };
            if let Err(reason) = self.app.restore(&state.app) {
                return fx.refuse(reason);
            }
            self.replies = state.replies;
            self.executed = seq;
            self.history = transfer.stable.history;
            self.stats.transfers += 1;
            // Bring the request history to the checkpoint's slot (spec §3.3.5); a log already
            // past it refuses, and keeps what it has.
            let token = self.token();
            fx.attest.push(Attest {
                token,
                calls: vec![Call::Advance {
                    log: self.logs.requests,
                    seq: self.logs.at(seq),
                    digest: transfer.stable.previous,
                    value: transfer.stable.request,
                }],
            });
            self.pending.insert(token, Pending::Housekeeping);
        } else if self
            .own_checkpoints
            .get(&seq)
            .is_none_or(|(own, _)| *own != transfer.stable.state)
        {
            return fx.refuse("a checkpoint at a number this replica executed differently".into());
        }
        self.make_stable(transfer, fx);
        self.execute_ready(now, fx);
    }

    // -----------------------------------------------------------------------------------------
    // View change

    fn timeout(&self) -> u64 {
        self.params.view_change_ms << self.backoff.min(BACKOFF_MAX)
    }

    /// Step 1: asks for view `to`, with a nonce share no other replica can predict (the hash
    /// of its own signature over the instance and the view).
    fn want(&mut self, now: Time, to: u64, fx: &mut Effects<A>) {
        if to <= self.view || (!self.active && to <= self.target) || to > super::VIEW_MAX {
            return;
        }
        if self.active {
            fx.changes.push(Change::View {
                view: self.view,
                active: false,
            });
        }
        self.active = false;
        self.target = to;
        self.changing_since = now;
        self.backoff = (self.backoff + 1).min(BACKOFF_MAX);
        let mut seed = self.instance.0.to_vec();
        seed.extend_from_slice(&to.to_be_bytes());
        let share = self.secret.sign(
            bulwark_core::sign::Context::new("bulwark.ea.nonce-share.v1"),
            &seed,
        );
        let nonce: Nonce = Digest::of("bulwark.ea.nonce-share.v1", &share.0).0;
        let want = Want {
            instance: self.instance,
            to,
            nonce,
            replica: self.me.0,
        };
        let Ok(cast) = Cast::sign(&self.secret, self.me, want) else {
            return;
        };
        self.broadcast(Message::Want(cast.clone()), fx);
        self.on_want(now, cast, fx);
    }

    /// Step 2: with `f+1` wishes for a view, abandons every view up to it and builds its view
    /// change.
    fn on_want(&mut self, now: Time, cast: Cast<Want>, fx: &mut Effects<A>) {
        let want = match cast.open(&self.keys) {
            Ok(want) if want.replica == cast.slot && want.instance == self.instance => want,
            Ok(_) => return fx.refuse("a wish of another instance or replica".into()),
            Err(reason) => return fx.refuse(reason),
        };
        if want.to <= self.view
            || want.to > self.view + super::msg::VIEW_SPAN_MAX
            || want.to > super::VIEW_MAX
        {
            return;
        }
        let wants = self.wants.entry(want.to).or_default();
        wants.insert(want.replica, cast);
        if wants.len() < self.params.quorum() || self.changed_for >= want.to {
            return;
        }
        let to = want.to;
        if self.active || self.target < to {
            if self.active {
                fx.changes.push(Change::View {
                    view: self.view,
                    active: false,
                });
            }
            self.active = false;
            self.target = to;
            self.changing_since = now;
        }
        self.build_view_change(to, fx);
    }

    fn build_view_change(&mut self, to: u64, fx: &mut Effects<A>) {
        let wants: Vec<Cast<Want>> = self.wants[&to].values().cloned().collect();
        let Ok(z) = wants_nonce(&self.params, &self.keys, &self.instance, to, &wants) else {
            return;
        };
        self.changed_for = to;
        // Abandon each view from the last entered up to `to`, in order: the commit log's last
        // slot of each, so no commit of this replica can ever land in them.
        for view in self.view..to {
            let end = self.logs.end_of_view(view);
            if self.commit_high < end {
                self.commit_high = end;
                let token = self.token();
                fx.attest.push(Attest {
                    token,
                    calls: vec![Call::Advance {
                        log: self.logs.commit,
                        seq: end,
                        digest: [0; 32],
                        value: [0; 32],
                    }],
                });
                self.pending.insert(token, Pending::Housekeeping);
            }
        }
        let stable = self.stable.clone();
        let committed: Vec<Committed<A::Op>> = self.committed.values().cloned().collect();
        let prepared: Vec<Prepared<A::Op>> = self
            .log
            .iter()
            .filter(|(seq, entry)| **seq > self.executed && entry.decided.is_none())
            .filter_map(|(_, entry)| entry.prepared.as_ref().map(|(_, p)| p.clone()))
            .collect();
        let top = committed
            .iter()
            .map(|c| c.seq)
            .chain(prepared.iter().map(|p| p.seq))
            .max()
            .unwrap_or(stable.seq)
            .max(stable.seq);
        let mut calls = Vec::new();
        let lookup = |seq: Seq| Call::Lookup {
            log: self.logs.commit,
            seq,
            nonce: z,
        };
        for view in self.view..to {
            let first = if view == self.view {
                top + 1
            } else {
                stable.seq + 1
            };
            calls.push(lookup(self.logs.slot(view, first)));
        }
        for seq in stable.seq + 1..=top {
            calls.push(lookup(self.logs.slot(self.view, seq)));
        }
        let token = self.token();
        fx.attest.push(Attest { token, calls });
        self.pending.insert(
            token,
            Pending::Lookups(Box::new(Draft {
                to,
                stable,
                committed,
                prepared,
                wants,
                top,
            })),
        );
    }

    fn finish_view_change(
        &mut self,
        draft: Draft<A::Op>,
        attestations: Vec<Unverified<a2m::Attestation>>,
        fx: &mut Effects<A>,
    ) {
        if self.view >= draft.to || self.changed_for != draft.to {
            return;
        }
        let span = (draft.to - self.view) as usize;
        if attestations.len() != span + (draft.top - draft.stable.seq) as usize {
            return;
        }
        let mut attestations = attestations.into_iter();
        let abandoned: Vec<_> = attestations.by_ref().take(span).collect();
        let disclosed = (draft.stable.seq + 1..=draft.top)
            .zip(attestations)
            .map(|(seq, attestation)| {
                let assigned = attestation
                    .peek()
                    .is_ok_and(|a| a.status == SlotStatus::Assigned);
                let body = assigned
                    .then(|| self.own_commits.get(&(self.view, seq)).cloned())
                    .flatten();
                (attestation, body)
            })
            .collect();
        let change = ViewChange {
            instance: self.instance,
            replica: self.me.0,
            from: self.view,
            to: draft.to,
            stable: draft.stable,
            committed: draft.committed,
            prepared: draft.prepared,
            wants: draft.wants,
            top: draft.top,
            abandoned,
            disclosed,
        };
        self.say(&change, Said::ViewChange, fx);
    }

    /// Steps 4 and 5: checks a view change and, as the new view's primary, makes the NEW-VIEW
    /// once `f+1` agree on where they come from.
    fn on_view_change(
        &mut self,
        _now: Time,
        attested: Attested<ViewChange<A::Op>>,
        fx: &mut Effects<A>,
    ) {
        let change = match attested.open(&self.params, &self.logs, &self.trusted) {
            Ok(change) => change,
            Err(reason) => return fx.refuse(reason),
        };
        if change.to <= self.view {
            return;
        }
        if let Err(reason) = change.check(
            &self.params,
            &self.logs,
            &self.keys,
            &self.trusted,
            &self.instance,
            &self.initial,
        ) {
            return fx.refuse(reason);
        }
        if change.from > self.view {
            // Step 7: the sender entered a view this replica has not: fetch its NEW-VIEW.
            self.behind = true;
        }
        let to = change.to;
        let from = change.from;
        let replica = change.replica;
        // Its wishes count as this replica's too: they let it join the view change.
        for want in &change.wants {
            if let Ok(w) = want.open(&self.keys) {
                self.wants
                    .entry(to)
                    .or_default()
                    .insert(w.replica, want.clone());
            }
        }
        self.view_changes
            .entry(to)
            .or_default()
            .insert(replica, (change, attested));
        if self.changed_for < to
            && self
                .wants
                .get(&to)
                .is_some_and(|w| w.len() >= self.params.quorum())
        {
            if self.active || self.target < to {
                if self.active {
                    fx.changes.push(Change::View {
                        view: self.view,
                        active: false,
                    });
                }
                self.active = false;
                self.target = to;
                self.changing_since = _now;
            }
            self.build_view_change(to, fx);
        }
        if self.params.primary(to) != self.me || self.new_view_for >= to {
            return;
        }
        let mut by_from: BTreeMap<u64, Vec<Attested<ViewChange<A::Op>>>> = BTreeMap::new();
        for (change, attested) in self.view_changes[&to].values() {
            by_from
                .entry(change.from)
                .or_default()
                .push(attested.clone());
        }
        let Some(changes) = by_from
            .remove(&from)
            .filter(|c| c.len() >= self.params.quorum())
        else {
            return;
        };
        self.new_view_for = to;
        let new_view = NewView {
            instance: self.instance,
            view: to,
            replica: self.me.0,
            changes: changes.into_iter().take(self.params.quorum()).collect(),
        };
        self.say(&new_view, Said::NewView, fx);
    }

    /// Checks a NEW-VIEW: attested by the view's primary, `f+1` valid view changes from
    /// distinct replicas with one `from` and its `to`. Returns the plan.
    #[allow(clippy::type_complexity)]
    fn check_new_view(
        &self,
        attested: &Attested<NewView<A::Op>>,
    ) -> Result<(NewView<A::Op>, Stable, Vec<(u64, Batch<A::Op>)>), String> {
        let new_view = attested.open(&self.params, &self.logs, &self.trusted)?;
        if new_view.instance != self.instance {
            return Err("a NEW-VIEW of another instance".into());
        }
        if self.params.primary(new_view.view).0 != new_view.replica {
            return Err(format!(
                "a NEW-VIEW for view {} from replica {}, not its primary",
                new_view.view, new_view.replica
            ));
        }
        if new_view.changes.len() > self.params.n {
            return Err("a NEW-VIEW with more view changes than replicas".into());
        }
        let mut changes = Vec::new();
        for attested in &new_view.changes {
            changes.push(attested.open(&self.params, &self.logs, &self.trusted)?);
        }
        let mut reported: Vec<Reported<'_, A::Op>> = Vec::new();
        let mut senders = BTreeSet::new();
        let from = changes.first().map(|c| c.from);
        for change in &changes {
            if change.to != new_view.view || Some(change.from) != from {
                return Err(
                    "a NEW-VIEW whose view changes differ in where they go or come from".into(),
                );
            }
            if !senders.insert(change.replica) {
                return Err(format!("two view changes from replica {}", change.replica));
            }
            reported.push(change.check(
                &self.params,
                &self.logs,
                &self.keys,
                &self.trusted,
                &self.instance,
                &self.initial,
            )?);
        }
        if senders.len() < self.params.quorum() {
            return Err(format!(
                "a NEW-VIEW with {} view changes, {} needed",
                senders.len(),
                self.params.quorum()
            ));
        }
        let (stable, plan) = select(&reported);
        let stable = stable.clone();
        Ok((new_view.clone(), stable, plan))
    }

    /// Step 6: enters the new view and PREPAREs every number its plan re-decides.
    fn on_new_view(&mut self, now: Time, attested: Attested<NewView<A::Op>>, fx: &mut Effects<A>) {
        let Some(view) = attested.peek().map(|nv| nv.view) else {
            return fx.refuse("a NEW-VIEW that does not decode".into());
        };
        if view <= self.view {
            return;
        }
        let (_, stable, plan) = match self.check_new_view(&attested) {
            Ok(checked) => checked,
            Err(reason) => return fx.refuse(reason),
        };
        fx.changes.push(Change::NewView(Box::new(attested.clone())));
        fx.changes.push(Change::View { view, active: true });
        self.view = view;
        self.active = true;
        self.target = view;
        self.backoff = 0;
        self.stats.views += 1;
        self.new_view = Some(attested);
        self.wants = self.wants.split_off(&(view + 1));
        self.view_changes = self.view_changes.split_off(&(view + 1));
        self.plan_top = plan.last().map_or(stable.seq, |(seq, _)| *seq);
        for waiting in self.waiting.values_mut() {
            waiting.since = now;
        }
        if stable.seq > self.stable.seq {
            match self.own_checkpoints.get(&stable.seq) {
                Some((own, state)) if *own == stable.state => {
                    let state = state.clone();
                    self.make_stable(StateTransfer { stable, state }, fx);
                }
                _ => self.behind = true,
            }
        }
        // Forget the old view's proposals (their requests may be proposed again unless the
        // plan holds them); keep certificates, and a PRE-PREPARE of this view that arrived
        // before its NEW-VIEW, for a number above the plan.
        self.in_log.clear();
        let primary = self.params.primary(view).0;
        for (seq, entry) in self.log.iter_mut() {
            if let Some(decided) = &entry.decided {
                self.in_log
                    .extend(decided.batch.requests.iter().map(Request::digest));
            }
            entry.prepares.retain(|(v, _), _| *v >= view);
            entry.proposed = entry
                .prepares
                .get(&(view, primary))
                .filter(|(vote, _)| vote.phase == Phase::PrePrepare && *seq > self.plan_top)
                .map(|(vote, _)| vote.digest)
                .filter(|digest| entry.batches.contains_key(digest));
            if let Some(batch) = entry.proposed.and_then(|digest| entry.batches.get(&digest)) {
                self.in_log
                    .extend(batch.requests.iter().map(Request::digest));
            }
        }
        let mut prepares = Vec::new();
        for (seq, batch) in plan {
            if seq <= self.executed {
                let same = self
                    .committed
                    .get(&seq)
                    .is_none_or(|c| c.batch.digest() == batch.digest());
                if !same {
                    self.stats.contradicted += 1;
                }
                continue;
            }
            for request in &batch.requests {
                self.in_log.insert(request.digest());
            }
            let digest = batch.digest();
            let entry = self.log.entry(seq).or_default();
            entry.batches.insert(digest, batch);
            entry.proposed = Some(digest);
            prepares.push(self.vote(Phase::Prepare, seq, digest));
        }
        for vote in prepares {
            self.say_vote(vote, None, fx);
        }
        self.execute_ready(now, fx);
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
        if status.view < self.view
            && let Some(new_view) = &self.new_view
        {
            fx.sends
                .push((from, Message::NewView(Box::new(new_view.clone()))));
        }
        if status.view > self.view || (status.view == self.view && !status.active && self.active) {
            self.behind = true;
        }
        if status.stable < self.stable.seq && self.stable.seq > 0 {
            fx.sends.push((
                from,
                Message::State(Box::new(StateTransfer {
                    stable: self.stable.clone(),
                    state: self.stable_state.clone(),
                })),
            ));
        }
        for message in self.own_checkpoint_messages.range(status.stable + 1..) {
            fx.sends
                .push((from, Message::Checkpoint(message.1.clone())));
        }
        if status.executed < self.executed {
            for committed in self.committed.range(status.executed + 1..) {
                fx.sends
                    .push((from, Message::Committed(Box::new(committed.1.clone()))));
            }
        } else if status.executed > self.executed {
            self.behind = true;
        }
        // Votes in progress it may have missed.
        if status.view == self.view
            && status.executed == self.executed
            && let Some(own) = self.own_votes.get(&(self.executed + 1))
        {
            for message in own {
                fx.sends.push((from, message.clone()));
            }
        }
        // Its wish and view change, for a replica still in the view it left.
        if !self.active && status.view == self.view {
            if let Some(want) = self.wants.get(&self.target).and_then(|w| w.get(&self.me.0)) {
                fx.sends.push((from, Message::Want(want.clone())));
            }
            if let Some((_, own)) = self
                .view_changes
                .get(&self.target)
                .and_then(|v| v.get(&self.me.0))
            {
                fx.sends
                    .push((from, Message::ViewChange(Box::new(own.clone()))));
            }
        }
    }

    fn outstanding(&self) -> bool {
        self.behind || !self.active || !self.waiting.is_empty() || !self.log.is_empty()
    }

    fn tick(&mut self, now: Time, fx: &mut Effects<A>) {
        for (said, log, seq) in std::mem::take(&mut self.retry) {
            self.ask(said, log, seq, Step::Recover, fx);
        }
        let mut out = AppOutput::default();
        self.app.on_tick(now, &mut out);
        self.app_effects(now, out, fx);
        if self.active {
            let oldest = self.waiting.values().map(|w| w.since).min();
            if oldest.is_some_and(|since| now.0 >= since.0.saturating_add(self.timeout())) {
                self.want(now, self.view + 1, fx);
            }
        } else if now.0 >= self.changing_since.0.saturating_add(self.timeout()) {
            // Step 8: a view change that stalls moves on to the next view.
            let next = self.target + 1;
            self.want(now, next, fx);
        }
        if self.outstanding()
            && self
                .last_status
                .is_none_or(|last| now.0 >= last.0.saturating_add(self.params.status_ms))
        {
            self.last_status = Some(now);
            self.behind = false;
            self.broadcast(Message::Status(self.status()), fx);
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

    fn broadcast(&self, message: Message<A>, fx: &mut Effects<A>) {
        for slot in (0..self.params.n as u32)
            .map(Slot)
            .filter(|s| *s != self.me)
        {
            fx.sends.push((slot, message.clone()));
        }
    }

    fn handle(&mut self, now: Time, from: Slot, message: Message<A>, fx: &mut Effects<A>) {
        if from.index() >= self.params.n || from == self.me {
            return fx.refuse(format!("a message from slot {from}, not a peer"));
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
                let (attested, batch) = *pre;
                self.on_preprepare(now, attested, batch, fx);
            }
            Message::Vote(attested) => self.on_vote(now, attested, fx),
            Message::Checkpoint(attested) => {
                match attested.open(&self.params, &self.logs, &self.trusted) {
                    Ok(checkpoint) => self.on_checkpoint(checkpoint, attested, fx),
                    Err(reason) => fx.refuse(reason),
                }
            }
            Message::Want(cast) => self.on_want(now, cast, fx),
            Message::ViewChange(attested) => self.on_view_change(now, *attested, fx),
            Message::NewView(attested) => self.on_new_view(now, *attested, fx),
            Message::Status(status) => self.on_status(from, status, fx),
            Message::Committed(committed) => self.on_committed(now, *committed, fx),
            Message::State(transfer) => self.on_state(now, *transfer, fx),
            Message::App(message) => {
                let mut out = AppOutput::default();
                self.app.on_message(now, from, message, &mut out);
                self.app_effects(now, out, fx);
            }
        }
        if fx.refused.is_some() {
            self.stats.refused += 1;
        }
    }

    fn output(fx: Effects<A>) -> Output<Self> {
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
}

/// Advance `log` to `seq` with a message body's hash (its digest chain restarting, as each
/// slot of a message log stands alone) and attest the slot with its own nonce.
fn advance_attest(log: LogId, seq: Seq, body: &[u8]) -> Call {
    Call::AdvanceAttest {
        log,
        seq,
        digest: [0; 32],
        value: body_hash(body),
        nonce: a2m::nonce_of(seq),
    }
}

impl<A: App> Replica for EaReplica<A> {
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
        let mut fx = self.effects();
        let request = Request {
            origin: Origin::Client(client),
            id: request.id,
            op: request.op,
        };
        let known = self.waiting.contains_key(&request.digest());
        let answer = self.submit(now, request.clone(), &mut fx);
        if answer.is_none() && !known && self.primary() != self.me {
            let primary = self.primary();
            fx.sends.push((primary, Message::Forward(request)));
        }
        let mut output = Self::output(fx);
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
        let mut fx = self.effects();
        self.handle(now, from, message, &mut fx);
        Self::output(fx)
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Answers, _view: &()) -> Output<Self> {
        let mut fx = self.effects();
        self.on_answers(now, token, answers, &mut fx);
        Self::output(fx)
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let mut fx = self.effects();
        self.tick(now, &mut fx);
        Self::output(fx)
    }

    fn stats(&self) -> ReplicaStats {
        ReplicaStats {
            versions: self.executed,
            ..ReplicaStats::default()
        }
    }
}
