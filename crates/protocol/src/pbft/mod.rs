//! PBFT (Castro and Liskov; A2M spec §3.2): Byzantine agreement on a sequence of batches among
//! `n = 3f+1` replicas, as a sans-IO machine generic over the replicated state machine ([`App`]).
//!
//! The agreement core knows nothing about what it orders: the configuration service
//! (`crate::cs`) is one [`App`], and the cores on trusted logs order the same [`App`] without
//! the application changing: A2M-PBFT-EA ([`ea`], `2f+1` replicas) and A2M-PBFT-E (this replica
//! with a request history, [`history`], answering clients with its trusted log's attestation).
//!
//! The protocol, as built here:
//!
//! - **Requests.** A client sends its request to every replica ([`client::Submit`]); a replica
//!   may submit requests of its own (the configuration service's STOP and EVICT). Every replica
//!   remembers a request until it executes, so that a primary that sits on it is replaced.
//! - **Normal case.** The primary of view `v` (slot `v mod n`) assigns the next sequence number to
//!   a batch of waiting requests and a non-deterministic value (BASE: the configuration service's
//!   clock reading) and sends a signed PRE-PREPARE; backups that accept it (right view, inside the
//!   watermarks, every operation valid, the value acceptable to the application, no other batch
//!   accepted for that number in that view) send a signed PREPARE. A batch is *prepared* with the
//!   pre-prepare and `2f` matching prepares; prepared replicas send a signed COMMIT, and `2f+1`
//!   matching commits make it *committed*. Committed batches execute in sequence order; each
//!   request's result goes to its client, which accepts `f+1` matching replies.
//! - **Checkpoints.** Every `checkpoint_interval` batches a replica signs the digest of its state;
//!   `2f+1` matching signatures make the checkpoint stable and the log below it is dropped. The
//!   log holds at most `window` sequence numbers above the stable checkpoint.
//! - **View change.** A request that waits longer than the view-change timeout makes a replica
//!   move to the next view: it sends a signed VIEW-CHANGE carrying its stable checkpoint's proof
//!   and a prepared certificate for every batch above it. The new primary collects `2f+1`, and
//!   its NEW-VIEW re-proposes, for every number between the highest stable checkpoint and the
//!   highest prepared batch, the prepared batch of the highest view (or an empty batch); every
//!   backup recomputes that choice from the same view changes and refuses a NEW-VIEW that differs.
//!   A replica that sees `f+1` replicas in higher views joins the lowest of them; a view change
//!   that `2f+1` replicas are in and that does not complete moves on with a doubled timeout (one
//!   that a replica started alone waits for the others).
//! - **Catching up.** While it has work outstanding a replica sends its peers a STATUS; a peer
//!   answers with what the sender lacks: the NEW-VIEW of a later view, committed batches with
//!   their commit certificates, the stable checkpoint's state with its proof (state transfer), or
//!   its own votes for the batches in progress. Every message carries signatures the receiver
//!   checks itself, so forwarding needs no trust in the forwarder.
//!
//! Durability: a replica records what it is about to vouch for before it says so ([`Change`]):
//! the view it moves to before its VIEW-CHANGE, an accepted pre-prepare before its PREPARE, the
//! prepared certificate before its COMMIT, the commit certificate before executing (and so before
//! replying), and each stable checkpoint with its state. [`PbftReplica::restore`] rebuilds the
//! replica from those records alone, re-verifying every signature, and re-executes the committed
//! batches above the checkpoint, so a crash loses nothing decided and a restarted replica never
//! contradicts what it said before the crash.
//!
//! Requests are not signed by clients: the application's operations authenticate themselves
//! (the configuration service's orders carry the authority's signature, its evictions the
//! signatures of the replicas that agreed), so a Byzantine primary that invents a request can
//! only propose what its author would have been allowed to. Each request is identified by its
//! origin, its id and the digest of its operation, so an invented request never answers for a
//! real one.
//!
//! Replicas remember the results of each submitter's last few requests (replicated state, in
//! every checkpoint), so a retransmission is answered without executing again. A copy delivered
//! after that many later requests of the same submitter executed is new to them and executes
//! again: an application's operations must be harmless to repeat (the configuration service's
//! are: a second ADD of a node, REVOKE of a leaving one or STOP of an ended epoch changes nothing
//! and says so). Client-signed requests with per-client floors would close this; client ids are
//! per session today.

pub mod client;
pub mod ea;
pub mod history;
pub mod msg;
pub mod replica;
#[cfg(test)]
mod tests;

pub use client::Submit;
pub use history::{Attester, History, Position};
pub use msg::{
    Batch, Cast, CheckpointProof, Committed, Message, NewView, Origin, Phase, PreparedProof, Reply,
    Request, StateTransfer, Status, Submitted, ViewChange, Vote,
};
pub use replica::{Answer, Change, PbftReplica, PbftStats, RestoreError, Setup};

use bulwark_core::wire::{DeserializeOwned, Serialize};
use bulwark_core::{ServiceId, Slot, Time};
use std::fmt::Debug;

/// The sizes and timeouts of one PBFT instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Replicas: `3f+1`.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// A checkpoint every this many sequence numbers.
    pub checkpoint_interval: u64,
    /// Sequence numbers accepted above the stable checkpoint (the high watermark's distance).
    pub window: u64,
    /// Requests in one batch at most.
    pub batch_max: usize,
    /// Batches the primary has proposed beyond the last one executed, at most: while they are
    /// in flight, requests queue and the next batch carries them all.
    pub pipeline: u64,
    /// How long a request may wait before its replica starts a view change, in milliseconds;
    /// doubled for each view change in a row that does not complete.
    pub view_change_ms: u64,
    /// How often a replica with work outstanding sends STATUS, in milliseconds.
    pub status_ms: u64,
    /// Deliberate breakage for the simulator's negative controls; all off in every real replica.
    pub mutations: Mutations,
}

/// Ways to break PBFT on purpose, each removing one thing its safety argument needs; the
/// simulator's negative controls show that its checker catches each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// Agreement, view-change and checkpoint quorums of `2f` instead of `2f+1`: two quorums need
    /// not share a correct replica.
    pub quorum_2f: bool,
    /// View changes carry no prepared certificates, so a new view may re-decide a number.
    pub drop_prepared: bool,
}

impl Params {
    /// The defaults for `f` faults: `3f+1` replicas, checkpoints every 8 batches, a window of 32,
    /// batches of up to 64 requests with 4 in flight, a 2 s view-change timeout, STATUS every
    /// 300 ms.
    pub fn new(f: usize) -> Params {
        Params {
            n: 3 * f + 1,
            f,
            checkpoint_interval: 8,
            window: 32,
            batch_max: 64,
            pipeline: 4,
            view_change_ms: 2_000,
            status_ms: 300,
            mutations: Mutations::default(),
        }
    }

    /// Agreement, view-change and checkpoint quorums: `2f+1`.
    pub fn quorum(&self) -> usize {
        if self.mutations.quorum_2f {
            2 * self.f
        } else {
            2 * self.f + 1
        }
    }

    /// The replies a client needs: `f+1` matching ones include a correct replica's.
    pub fn reply_quorum(&self) -> usize {
        self.f + 1
    }

    /// The primary of `view`.
    pub fn primary(&self, view: u64) -> Slot {
        Slot((view % self.n as u64) as u32)
    }

    /// Checks the relations the protocol's proofs rest on.
    pub fn validate(&self) -> Result<(), String> {
        if self.n != 3 * self.f + 1 {
            return Err(format!(
                "PBFT needs 3f+1 replicas, not {} for f = {}",
                self.n, self.f
            ));
        }
        if self.checkpoint_interval == 0 || self.window < 2 * self.checkpoint_interval {
            return Err(format!(
                "the window ({}) must hold two checkpoint intervals ({})",
                self.window, self.checkpoint_interval
            ));
        }
        if self.batch_max == 0
            || self.pipeline == 0
            || self.view_change_ms == 0
            || self.status_ms == 0
        {
            return Err("batches, the view-change timeout and STATUS need positive sizes".into());
        }
        Ok(())
    }
}

/// The replicated state machine PBFT orders operations for.
///
/// Everything `execute` reads must be replicated state (what [`App::snapshot`] encodes) or its
/// arguments, so that every correct replica computes the same results and the same state digest.
/// What a replica does on the side (sign a result, talk to its peers) goes through
/// [`AppOutput`] and is not part of the state.
pub trait App: Sized {
    /// The service frames for this application carry.
    const SERVICE: ServiceId;
    /// The largest encoded operation accepted.
    const OP_BYTES_MAX: usize;
    /// The largest snapshot accepted in a state transfer.
    const SNAPSHOT_BYTES_MAX: usize;

    /// An operation clients (or replicas) submit.
    type Op: Clone + Debug + PartialEq + Serialize + DeserializeOwned;
    /// What executing an operation returns to its submitter.
    type Result: Clone + Debug + PartialEq + Serialize + DeserializeOwned;
    /// What replicas of the application tell each other outside agreement.
    type Message: Clone + Debug + Serialize + DeserializeOwned;
    /// A replica-local record the application keeps durable (outside the replicated state).
    type Change: Clone + Debug;

    /// Whether `op` may be ordered at all: well formed and authenticated. Checked by the primary
    /// before proposing and by every backup before preparing.
    fn check_op(&self, op: &Self::Op) -> Result<(), String>;

    /// The non-deterministic value the primary proposes with a batch (BASE's clock reading).
    fn propose(&self, now: Time) -> u64;

    /// Whether a backup accepts the primary's `nondet` for a batch of `ops`, judged at `now`.
    fn check_proposal(&self, now: Time, nondet: u64, ops: &[&Self::Op]) -> Result<(), String>;

    /// Executes one operation of batch `seq` with the batch's agreed `nondet`.
    fn execute(
        &mut self,
        op: &Self::Op,
        nondet: u64,
        seq: u64,
        out: &mut AppOutput<Self>,
    ) -> Self::Result;

    /// The replicated state, canonically encoded: equal states give equal bytes.
    fn snapshot(&self) -> Vec<u8>;

    /// Replaces the replicated state with a snapshot's (a state transfer or a restart).
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;

    /// A message from the application on another replica.
    fn on_message(
        &mut self,
        _now: Time,
        _from: Slot,
        _message: Self::Message,
        _out: &mut AppOutput<Self>,
    ) {
    }

    /// Housekeeping on the replica's STATUS timer: operations it wants to submit, messages to
    /// repeat.
    fn on_tick(&mut self, _now: Time, _out: &mut AppOutput<Self>) {}

    /// A record this application made durable earlier, replayed at restart in order.
    fn replay(&mut self, _change: &Self::Change) {}
}

/// What the application asks of its replica besides results.
pub struct AppOutput<A: App> {
    /// To make durable (before anything after it leaves).
    pub changes: Vec<A::Change>,
    /// Messages to the application on other replicas (`None`: to every other replica).
    pub sends: Vec<(Option<Slot>, A::Message)>,
    /// Operations to submit, each with an id: one the application chose (below 2^63; the same
    /// id and operation again are the same request, so a repeat does not pile up), or 0 for a
    /// fresh one.
    pub submit: Vec<(u64, A::Op)>,
}

impl<A: App> Default for AppOutput<A> {
    fn default() -> Self {
        AppOutput {
            changes: Vec::new(),
            sends: Vec::new(),
            submit: Vec::new(),
        }
    }
}
