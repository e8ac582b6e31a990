//! PBFT's messages and the checks that make each one evidence on its own.
//!
//! Every statement a replica makes about the order is a signed [`Vote`] naming the instance, the
//! phase, the view, the sequence number and the batch digest; the certificates built from votes
//! ([`PreparedProof`], [`CheckpointProof`], commit certificates in [`Committed`]) are checked
//! vote by vote against the replicas' keys, so a replica that forwards one cannot forge it.

use super::{App, Params};
use bulwark_core::sign::{Context, PublicKey, SecretKey, SignError, Signable, Signed, Unverified};
use bulwark_core::wire::{self, DeserializeOwned, Serialize};
use bulwark_core::{ClientId, Digest, Slot};
use bytes::Bytes;
use serde::Deserialize;
use std::collections::BTreeSet;

/// The largest encoded batch a primary proposes or a backup accepts. With the window this
/// bounds a VIEW-CHANGE, and `2f+1` of them a NEW-VIEW, below the frame size.
pub const BATCH_BYTES_MAX: usize = 64 * 1024;

/// The largest encoded VIEW-CHANGE: a prepared batch per number in the window, with its votes.
pub const VIEW_CHANGE_BYTES_MAX: usize = 3 * 1024 * 1024;

/// Who submitted a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Origin {
    /// An authenticated client.
    Client(ClientId),
    /// A replica of the instance, submitting for its application.
    Replica(u32),
}

/// What a client sends: its operation and an id its replies will echo.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Submitted<Op> {
    /// Unique among the submitter's requests.
    pub id: u64,
    /// The operation.
    pub op: Op,
}

/// A request as ordered: the submitter the receiving replica authenticated, the id, the
/// operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request<Op> {
    /// Who submitted it.
    pub origin: Origin,
    /// The submitter's id for it.
    pub id: u64,
    /// The operation.
    pub op: Op,
}

impl<Op: Serialize> Request<Op> {
    /// What identifies the request: two requests with one origin and id but different
    /// operations are different requests.
    pub fn digest(&self) -> Digest {
        Digest::of("bulwark.pbft.request.v1", &wire::encode(self))
    }
}

/// The requests one sequence number orders, with the primary's non-deterministic value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch<Op> {
    /// The primary's proposal (the application judges it).
    pub nondet: u64,
    /// In execution order; empty for the null batch a NEW-VIEW fills gaps with.
    pub requests: Vec<Request<Op>>,
}

impl<Op: Serialize> Batch<Op> {
    /// The empty batch that fills a number nothing was prepared for.
    pub fn null() -> Batch<Op> {
        Batch {
            nondet: 0,
            requests: Vec::new(),
        }
    }

    /// The digest votes name.
    pub fn digest(&self) -> Digest {
        Digest::of("bulwark.pbft.batch.v1", &wire::encode(self))
    }

    /// The encoded size, for [`BATCH_BYTES_MAX`].
    pub fn encoded_len(&self) -> usize {
        wire::encode(self).len()
    }
}

/// The phase a vote belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The primary's assignment of a batch to a number.
    PrePrepare,
    /// A backup's acceptance of the assignment.
    Prepare,
    /// A prepared replica's commitment.
    Commit,
    /// A replica's state digest after executing up to `seq` (`view` is 0).
    Checkpoint,
}

/// One signed statement about the order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vote {
    /// The instance (one configuration service epoch): votes never carry over to another.
    pub instance: Digest,
    /// Which statement.
    pub phase: Phase,
    /// The view it was made in.
    pub view: u64,
    /// The sequence number.
    pub seq: u64,
    /// The batch digest, or the state digest for a checkpoint.
    pub digest: Digest,
    /// The slot of the signer.
    pub replica: u32,
}

impl Signable for Vote {
    const CONTEXT: Context = Context::new("bulwark.pbft.vote.v1");
    const BYTES_MAX: usize = 128;
}

/// A signed value with the slot of its signer, whose key checks it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = "T: Signable"))]
pub struct Cast<T> {
    /// The signer's slot.
    pub slot: u32,
    /// The value and its signature.
    pub signed: Unverified<T>,
}

impl<T> Clone for Cast<T> {
    fn clone(&self) -> Self {
        Cast {
            slot: self.slot,
            signed: self.signed.clone(),
        }
    }
}

impl<T: Signable> Cast<T> {
    /// Signs `value` as the replica in `slot`.
    pub fn sign(secret: &SecretKey, slot: Slot, value: T) -> Result<Cast<T>, SignError> {
        let signed = Signed::sign(secret, value)?;
        Ok(Cast {
            slot: slot.0,
            signed: signed.to_unverified(),
        })
    }

    /// Checks the signature under the signer's key.
    pub fn open(&self, keys: &[PublicKey]) -> Result<T, String> {
        let key = keys
            .get(self.slot as usize)
            .ok_or_else(|| format!("signer slot {} is not a replica", self.slot))?;
        self.signed
            .clone()
            .verify(key)
            .map(Signed::into_value)
            .map_err(|e| format!("signature of slot {}: {e}", self.slot))
    }
}

impl Cast<Vote> {
    /// Checks the signature and that the vote is the signer's own, for `instance`.
    pub fn checked(&self, keys: &[PublicKey], instance: &Digest) -> Result<Vote, String> {
        let vote = self.open(keys)?;
        if vote.replica != self.slot {
            return Err(format!(
                "slot {} sent a vote naming slot {}",
                self.slot, vote.replica
            ));
        }
        if vote.instance != *instance {
            return Err(format!("slot {} voted in another instance", self.slot));
        }
        Ok(vote)
    }

    /// [`Cast::checked`], and that the vote is of `phase`.
    pub fn vote(
        &self,
        keys: &[PublicKey],
        instance: &Digest,
        phase: Phase,
    ) -> Result<Vote, String> {
        let vote = self.checked(keys, instance)?;
        if vote.phase != phase {
            return Err(format!(
                "slot {} sent a {:?} vote as a {phase:?}",
                self.slot, vote.phase
            ));
        }
        Ok(vote)
    }
}

/// Checks that `votes` hold at least `needed` valid votes of `phase` from distinct replicas for
/// exactly `(view, seq, digest)` (`view` ignored when `None`), none of them from `excluded`.
/// A certificate with any invalid or mismatched vote is refused whole: an honest replica only
/// forwards votes it checked.
fn certify(
    votes: &[Cast<Vote>],
    needed: usize,
    keys: &[PublicKey],
    instance: &Digest,
    phase: Phase,
    (view, seq, digest): (Option<u64>, u64, &Digest),
    excluded: Option<Slot>,
) -> Result<(), String> {
    if votes.len() > keys.len() {
        return Err(format!(
            "{} votes from {} replicas",
            votes.len(),
            keys.len()
        ));
    }
    let mut signers = BTreeSet::new();
    for cast in votes {
        let vote = cast.vote(keys, instance, phase)?;
        if view.is_some_and(|view| vote.view != view) || vote.seq != seq || vote.digest != *digest {
            return Err(format!(
                "slot {}'s {phase:?} vote is for another batch",
                cast.slot
            ));
        }
        if excluded == Some(Slot(cast.slot)) {
            return Err(format!("slot {} may not cast a {phase:?} here", cast.slot));
        }
        if !signers.insert(cast.slot) {
            return Err(format!("slot {} voted twice", cast.slot));
        }
    }
    if signers.len() < needed {
        return Err(format!(
            "{} {phase:?} votes, {needed} needed",
            signers.len()
        ));
    }
    Ok(())
}

/// Proof that a batch was prepared in a view: the primary's pre-prepare, the batch, and `2f`
/// matching prepares from other replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedProof<Op> {
    /// The primary's assignment.
    pub preprepare: Cast<Vote>,
    /// The batch it names.
    pub batch: Batch<Op>,
    /// `2f` prepares from backups.
    pub prepares: Vec<Cast<Vote>>,
}

impl<Op: Serialize> PreparedProof<Op> {
    /// Checks the proof; returns the pre-prepare's vote (view, number and digest).
    pub fn check(
        &self,
        params: &Params,
        keys: &[PublicKey],
        instance: &Digest,
    ) -> Result<Vote, String> {
        let preprepare = self.preprepare.vote(keys, instance, Phase::PrePrepare)?;
        let primary = params.primary(preprepare.view);
        if Slot(self.preprepare.slot) != primary {
            return Err(format!(
                "a pre-prepare by slot {} in view {}",
                self.preprepare.slot, preprepare.view
            ));
        }
        if self.batch.digest() != preprepare.digest {
            return Err("the batch does not match its pre-prepare".into());
        }
        certify(
            &self.prepares,
            2 * params.f,
            keys,
            instance,
            Phase::Prepare,
            (Some(preprepare.view), preprepare.seq, &preprepare.digest),
            Some(primary),
        )?;
        Ok(preprepare)
    }
}

/// Proof that the state after number `seq` had digest `digest`: `2f+1` checkpoint votes (none for
/// the initial state, number 0, which every replica knows).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointProof {
    /// The last number the state includes.
    pub seq: u64,
    /// The state digest.
    pub digest: Digest,
    /// The votes.
    pub votes: Vec<Cast<Vote>>,
}

impl CheckpointProof {
    /// Checks the proof against the keys, or against the initial state's digest for number 0.
    pub fn check(
        &self,
        params: &Params,
        keys: &[PublicKey],
        instance: &Digest,
        initial: &Digest,
    ) -> Result<(), String> {
        if self.seq == 0 {
            return if self.digest == *initial {
                Ok(())
            } else {
                Err("a checkpoint at 0 that is not the initial state".into())
            };
        }
        if !self.seq.is_multiple_of(params.checkpoint_interval) {
            return Err(format!("no checkpoint is taken at {}", self.seq));
        }
        certify(
            &self.votes,
            params.quorum(),
            keys,
            instance,
            Phase::Checkpoint,
            (None, self.seq, &self.digest),
            None,
        )
    }
}

/// A replica's move to `view`: its stable checkpoint and what it prepared above it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewChange<Op> {
    /// The instance.
    pub instance: Digest,
    /// The view moved to.
    pub view: u64,
    /// The sender's slot.
    pub replica: u32,
    /// Its stable checkpoint.
    pub stable: CheckpointProof,
    /// Its highest-view prepared certificate for each number above the checkpoint.
    pub prepared: Vec<PreparedProof<Op>>,
}

impl<Op: Serialize + DeserializeOwned> Signable for ViewChange<Op> {
    const CONTEXT: Context = Context::new("bulwark.pbft.view-change.v1");
    const BYTES_MAX: usize = VIEW_CHANGE_BYTES_MAX;
}

impl<Op: Serialize + DeserializeOwned> ViewChange<Op> {
    /// Checks every proof it carries: the checkpoint, and each prepared certificate (from an
    /// earlier view, above the checkpoint, inside the window, one per number).
    pub fn check(
        &self,
        params: &Params,
        keys: &[PublicKey],
        instance: &Digest,
        initial: &Digest,
    ) -> Result<(), String> {
        if self.instance != *instance {
            return Err("a view change of another instance".into());
        }
        self.stable.check(params, keys, instance, initial)?;
        let mut numbers = BTreeSet::new();
        for proof in &self.prepared {
            let vote = proof.check(params, keys, instance)?;
            if vote.view >= self.view {
                return Err(format!(
                    "a certificate of view {} in a change to {}",
                    vote.view, self.view
                ));
            }
            if vote.seq <= self.stable.seq || vote.seq > self.stable.seq + params.window {
                return Err(format!("a certificate for {} outside the window", vote.seq));
            }
            if !numbers.insert(vote.seq) {
                return Err(format!("two certificates for {}", vote.seq));
            }
        }
        Ok(())
    }
}

/// The new primary's start of a view: the `2f+1` view changes it chose, and the pre-prepares
/// (with batches) that follow from them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "Op: Serialize",
    deserialize = "Op: Serialize + DeserializeOwned"
))]
pub struct NewView<Op> {
    /// The view.
    pub view: u64,
    /// The view changes, each signed by its sender.
    pub view_changes: Vec<Cast<ViewChange<Op>>>,
    /// The re-proposals, signed by the new primary, one per number above the highest stable
    /// checkpoint among the view changes.
    pub preprepares: Vec<Cast<Vote>>,
    /// The batch of each re-proposal, in the same order.
    pub batches: Vec<Batch<Op>>,
}

/// A batch decided in `view` at `seq`, with `2f+1` commits: enough for a replica that missed the
/// agreement to execute it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Committed<Op> {
    /// The view the commits were cast in.
    pub view: u64,
    /// The number.
    pub seq: u64,
    /// The batch.
    pub batch: Batch<Op>,
    /// `2f+1` commits.
    pub commits: Vec<Cast<Vote>>,
}

impl<Op: Serialize> Committed<Op> {
    /// Checks the commit certificate against the batch.
    pub fn check(
        &self,
        params: &Params,
        keys: &[PublicKey],
        instance: &Digest,
    ) -> Result<(), String> {
        let digest = self.batch.digest();
        certify(
            &self.commits,
            params.quorum(),
            keys,
            instance,
            Phase::Commit,
            (Some(self.view), self.seq, &digest),
            None,
        )
    }
}

/// A stable checkpoint's state, for a replica that fell behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTransfer {
    /// Its proof.
    pub proof: CheckpointProof,
    /// The state (its digest is the proof's).
    pub snapshot: Bytes,
}

/// Where a replica stands, so that its peers can send what it lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Its view.
    pub view: u64,
    /// Whether the view has started (NEW-VIEW accepted) or is still being changed to.
    pub active: bool,
    /// The last number it executed.
    pub executed: u64,
    /// Its stable checkpoint.
    pub stable: u64,
}

/// A replica's answer to a request once it executed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply<R> {
    /// The view it executed in.
    pub view: u64,
    /// The request's id.
    pub id: u64,
    /// The digest of the request executed, so a reply to another request with the same id never
    /// counts.
    pub request: Digest,
    /// The result.
    pub result: R,
}

/// What PBFT replicas send each other.
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = ""))]
pub enum Message<A: App> {
    /// A request a replica submits for its application.
    Request(Submitted<A::Op>),
    /// A client's request a backup passes to the primary (the primary may not have heard it).
    Forward(Request<A::Op>),
    /// The primary's assignment, with the batch.
    PrePrepare(Box<(Cast<Vote>, Batch<A::Op>)>),
    /// A prepare, commit or checkpoint vote.
    Vote(Cast<Vote>),
    /// A move to a new view.
    ViewChange(Box<Cast<ViewChange<A::Op>>>),
    /// The start of a view.
    NewView(Box<NewView<A::Op>>),
    /// Where the sender stands.
    Status(Status),
    /// A decided batch for a replica that missed it.
    Committed(Box<Committed<A::Op>>),
    /// A stable checkpoint's state for a replica behind it.
    State(Box<StateTransfer>),
    /// The application's own message.
    App(A::Message),
}

impl<A: App> Clone for Message<A> {
    fn clone(&self) -> Self {
        match self {
            Message::Request(r) => Message::Request(r.clone()),
            Message::Forward(r) => Message::Forward(r.clone()),
            Message::PrePrepare(p) => Message::PrePrepare(p.clone()),
            Message::Vote(v) => Message::Vote(v.clone()),
            Message::ViewChange(v) => Message::ViewChange(v.clone()),
            Message::NewView(v) => Message::NewView(v.clone()),
            Message::Status(s) => Message::Status(*s),
            Message::Committed(c) => Message::Committed(c.clone()),
            Message::State(s) => Message::State(s.clone()),
            Message::App(m) => Message::App(m.clone()),
        }
    }
}

impl<A: App> std::fmt::Debug for Message<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Request(r) => write!(f, "Request(id {})", r.id),
            Message::Forward(r) => write!(f, "Forward({:?} id {})", r.origin, r.id),
            Message::PrePrepare(p) => write!(
                f,
                "PrePrepare(from {}, {} requests)",
                p.0.slot,
                p.1.requests.len()
            ),
            Message::Vote(v) => write!(f, "Vote(from {})", v.slot),
            Message::ViewChange(v) => write!(f, "ViewChange(from {})", v.slot),
            Message::NewView(v) => write!(f, "NewView({})", v.view),
            Message::Status(s) => write!(f, "{s:?}"),
            Message::Committed(c) => write!(f, "Committed({})", c.seq),
            Message::State(s) => write!(f, "State({})", s.proof.seq),
            Message::App(m) => write!(f, "App({m:?})"),
        }
    }
}
