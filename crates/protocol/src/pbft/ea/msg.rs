//! A2M-PBFT-EA's messages and the checks that make each one evidence on its own.
//!
//! An attested message ([`Attested`]) is its body's exact bytes and the sender's trusted-log
//! LOOKUP of the body's hash, at the slot the body's own fields imply, in the log the sender
//! keeps for that kind of message (spec §3.4.2). The trusted log signs one value per slot and
//! never another, so a body with its attestation is both authenticated and unique: a primary
//! cannot pre-prepare two batches for one `[v|n]`, a replica cannot commit two, send two view
//! changes to one view or two new views. Receivers check every field (spec §7.1 item 1): the
//! signer is the sender's component, the log is the one for this kind, the slot and the nonce are
//! the ones the body implies, the value is the body's hash. Anyone holding the components' keys
//! can check a forwarded message, so certificates travel without trust in their carrier.

use super::{Logs, Params};
use crate::pbft::App;
use crate::pbft::msg::{Batch, Cast, Phase, Request, Submitted, Vote};
use bulwark_core::Digest;
use bulwark_core::a2m::Status as SlotStatus;
use bulwark_core::a2m::{self, Attestation, ChainDigest, Expected, LogId, Nonce, Seq, Value};
use bulwark_core::sign::{Context, PublicKey, Signable, Unverified};
use bulwark_core::wire::{self, DeserializeOwned, Serialize};
use bytes::Bytes;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::marker::PhantomData;

/// The largest encoded VIEW-CHANGE body: its certificates hold at most two checkpoint intervals
/// of batches, each with `f+1` attested votes.
pub const VIEW_CHANGE_BYTES_MAX: usize = 2 * 1024 * 1024;
/// The largest encoded NEW-VIEW body: `f+1` view changes.
pub const NEW_VIEW_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Views one view change may abandon at once: each costs the sender a trusted-log call and the
/// receiver an attestation to check.
pub const VIEW_SPAN_MAX: u64 = 256;

/// The hash a trusted log holds for a message body.
pub fn body_hash(body: &[u8]) -> Value {
    Digest::of("bulwark.ea.message.v1", body).0
}

/// A body whose trusted-log slot its own fields name.
pub trait Placed: Serialize + DeserializeOwned {
    /// The largest encoded body accepted.
    const BYTES_MAX: usize;
    /// The sender's slot (its replica number) as the body names it.
    fn sender(&self) -> u32;
    /// The log (of `logs`) and the slot this body must be attested at.
    fn place(&self, logs: &Logs) -> (LogId, Seq);
}

impl Placed for Vote {
    const BYTES_MAX: usize = 128;

    fn sender(&self) -> u32 {
        self.replica
    }

    fn place(&self, logs: &Logs) -> (LogId, Seq) {
        match self.phase {
            Phase::PrePrepare | Phase::Prepare => (logs.prepare, logs.slot(self.view, self.seq)),
            Phase::Commit => (logs.commit, logs.slot(self.view, self.seq)),
            Phase::Checkpoint => (logs.checkpoint, logs.at(self.seq)),
        }
    }
}

/// A message body with its sender's attestation.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = ""))]
pub struct Attested<T> {
    /// The body's exact encoding.
    pub body: Bytes,
    /// The sender's trusted-log LOOKUP of `body_hash(body)`.
    pub attestation: Unverified<Attestation>,
    #[serde(skip)]
    kind: PhantomData<fn() -> T>,
}

impl<T> Clone for Attested<T> {
    fn clone(&self) -> Self {
        Attested {
            body: self.body.clone(),
            attestation: self.attestation.clone(),
            kind: PhantomData,
        }
    }
}

impl<T> PartialEq for Attested<T> {
    fn eq(&self, other: &Self) -> bool {
        self.body == other.body && self.attestation == other.attestation
    }
}

impl<T: Placed> Attested<T> {
    /// A body and the attestation its sender's log made of it.
    pub fn new(body: Bytes, attestation: Unverified<Attestation>) -> Attested<T> {
        Attested {
            body,
            attestation,
            kind: PhantomData,
        }
    }

    /// The body, decoded but not checked: for bookkeeping on what was checked before.
    pub fn peek(&self) -> Option<T> {
        wire::decode(&self.body, T::BYTES_MAX).ok()
    }

    /// Decodes the body and checks the attestation: signed by the component of the replica the
    /// body names, in the log and at the slot the body implies, with the slot's nonce, holding
    /// the body's hash. `unchecked` (a negative control's mutation) skips the attestation.
    pub fn open(&self, params: &Params, logs: &Logs, trusted: &[PublicKey]) -> Result<T, String> {
        let body: T = wire::decode(&self.body, T::BYTES_MAX)
            .map_err(|e| format!("an attested body that does not decode: {e}"))?;
        let sender = body.sender();
        let key = trusted
            .get(sender as usize)
            .ok_or_else(|| format!("a body naming replica {sender}, not a replica"))?;
        if params.mutations.unchecked_attestations {
            return Ok(body);
        }
        let (log, seq) = body.place(logs);
        Expected::assigned(log, seq, body_hash(&self.body))
            .check(key, self.attestation.clone())
            .map_err(|e| format!("replica {sender}'s attestation: {e}"))?;
        Ok(body)
    }
}

impl Attested<Vote> {
    /// [`Attested::open`] for a vote of `instance` in `phase`.
    pub fn vote(
        &self,
        params: &Params,
        logs: &Logs,
        trusted: &[PublicKey],
        instance: &Digest,
        phase: Phase,
    ) -> Result<Vote, String> {
        let vote = self.open(params, logs, trusted)?;
        if vote.instance != *instance {
            return Err(format!(
                "replica {} voted in another instance",
                vote.replica
            ));
        }
        let same =
            vote.phase == phase || (phase == Phase::Prepare && vote.phase == Phase::PrePrepare);
        if !same {
            return Err(format!(
                "replica {} sent a {:?} vote as a {phase:?}",
                vote.replica, vote.phase
            ));
        }
        if vote.phase == Phase::PrePrepare && params.primary(vote.view).0 != vote.replica {
            return Err(format!(
                "replica {} pre-prepared in view {}, whose primary it is not",
                vote.replica, vote.view
            ));
        }
        Ok(vote)
    }
}

/// `f+1` attested votes of one phase from distinct replicas on one `(view, seq, digest)`: what
/// a prepared or committed certificate holds. Returns the view.
#[allow(clippy::too_many_arguments)]
fn check_votes(
    params: &Params,
    logs: &Logs,
    trusted: &[PublicKey],
    instance: &Digest,
    phase: Phase,
    seq: u64,
    digest: &Digest,
    votes: &[Attested<Vote>],
) -> Result<u64, String> {
    if votes.len() > params.n {
        return Err(format!("{} votes from {} replicas", votes.len(), params.n));
    }
    let mut view = None;
    let mut voters = BTreeSet::new();
    for attested in votes {
        let vote = attested.vote(params, logs, trusted, instance, phase)?;
        if vote.seq != seq || vote.digest != *digest {
            return Err(format!("a {phase:?} vote for another number or batch"));
        }
        if *view.get_or_insert(vote.view) != vote.view {
            return Err(format!("{phase:?} votes from different views"));
        }
        if !voters.insert(vote.replica) {
            return Err(format!("two {phase:?} votes from replica {}", vote.replica));
        }
    }
    if voters.len() < params.quorum() {
        return Err(format!(
            "{} {phase:?} votes, {} needed",
            voters.len(),
            params.quorum()
        ));
    }
    view.ok_or_else(|| "no votes".to_string())
}

/// A batch prepared at `(view, seq)`: `f+1` attested PRE-PREPARE or PREPARE votes for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prepared<Op> {
    /// The number.
    pub seq: u64,
    /// The batch.
    pub batch: Batch<Op>,
    /// The votes.
    pub votes: Vec<Attested<Vote>>,
}

impl<Op: Serialize> Prepared<Op> {
    /// Checks the votes; returns the view they were cast in.
    pub fn check(
        &self,
        params: &Params,
        logs: &Logs,
        trusted: &[PublicKey],
        instance: &Digest,
    ) -> Result<u64, String> {
        check_votes(
            params,
            logs,
            trusted,
            instance,
            Phase::Prepare,
            self.seq,
            &self.batch.digest(),
            &self.votes,
        )
    }
}

/// A batch committed at `seq`: `f+1` attested COMMIT votes for it from one view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Committed<Op> {
    /// The number.
    pub seq: u64,
    /// The batch.
    pub batch: Batch<Op>,
    /// The votes.
    pub votes: Vec<Attested<Vote>>,
}

impl<Op: Serialize> Committed<Op> {
    /// Checks the votes; returns the view they were cast in.
    pub fn check(
        &self,
        params: &Params,
        logs: &Logs,
        trusted: &[PublicKey],
        instance: &Digest,
    ) -> Result<u64, String> {
        check_votes(
            params,
            logs,
            trusted,
            instance,
            Phase::Commit,
            self.seq,
            &self.batch.digest(),
            &self.votes,
        )
    }
}

/// A replica's checkpoint at `seq` (spec §3.3.4 with EA's attestation): the state digest, and
/// where its request history stands: slot `seq` of its request log holds `request` (the digest
/// of batch `seq`) chained from `previous`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The instance.
    pub instance: Digest,
    /// The last number the state reflects.
    pub seq: u64,
    /// The state's digest.
    pub state: Digest,
    /// Batch `seq`'s digest, as the request log holds it.
    pub request: Value,
    /// The request log's digest at `seq - 1`.
    pub previous: ChainDigest,
    /// The sender.
    pub replica: u32,
}

impl Placed for Checkpoint {
    const BYTES_MAX: usize = 192;

    fn sender(&self) -> u32 {
        self.replica
    }

    fn place(&self, logs: &Logs) -> (LogId, Seq) {
        (logs.checkpoint, logs.at(self.seq))
    }
}

impl Checkpoint {
    /// The request log's digest at `seq` this checkpoint implies.
    pub fn history(&self, logs: &Logs) -> ChainDigest {
        a2m::chain(logs.at(self.seq), &self.request, &self.previous)
    }

    /// What two checkpoints must agree on to make one stable.
    pub fn agreed(&self, logs: &Logs) -> (u64, Digest, ChainDigest) {
        (self.seq, self.state, self.history(logs))
    }
}

/// A stable checkpoint: `f+1` attested checkpoints from distinct replicas that agree on the
/// number, the state and the request history (the initial state at 0 needs none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stable {
    /// The number.
    pub seq: u64,
    /// The state digest.
    pub state: Digest,
    /// The request log's digest at `seq` (zero at 0).
    pub history: ChainDigest,
    /// Batch `seq`'s digest and the request log's digest before it, for a replica that installs
    /// the state and must bring its own request log there (spec §3.3.5).
    pub request: Value,
    /// See `request`.
    pub previous: ChainDigest,
    /// The checkpoints.
    pub checkpoints: Vec<Attested<Checkpoint>>,
}

impl Stable {
    /// The checkpoint at 0: the initial state.
    pub fn initial(state: Digest) -> Stable {
        Stable {
            seq: 0,
            state,
            history: [0; 32],
            request: [0; 32],
            previous: [0; 32],
            checkpoints: Vec::new(),
        }
    }

    /// Checks the certificate against the initial state's digest.
    pub fn check(
        &self,
        params: &Params,
        logs: &Logs,
        trusted: &[PublicKey],
        instance: &Digest,
        initial: &Digest,
    ) -> Result<(), String> {
        if self.seq == 0 {
            return if self.state == *initial && self.history == [0; 32] {
                Ok(())
            } else {
                Err("a checkpoint at 0 that is not the initial state".into())
            };
        }
        if self.checkpoints.len() > params.n {
            return Err("more checkpoints than replicas".into());
        }
        if a2m::chain(logs.at(self.seq), &self.request, &self.previous) != self.history {
            return Err("a stable checkpoint whose request digests do not chain".into());
        }
        let mut voters = BTreeSet::new();
        for attested in &self.checkpoints {
            let checkpoint = attested.open(params, logs, trusted)?;
            if checkpoint.instance != *instance {
                return Err("a checkpoint of another instance".into());
            }
            if checkpoint.agreed(logs) != (self.seq, self.state, self.history) {
                return Err(format!(
                    "replica {}'s checkpoint differs from the certificate's",
                    checkpoint.replica
                ));
            }
            voters.insert(checkpoint.replica);
        }
        if voters.len() < params.quorum() {
            return Err(format!(
                "{} checkpoints, {} needed",
                voters.len(),
                params.quorum()
            ));
        }
        Ok(())
    }
}

/// A replica's wish to leave its view for `to`, with its share of the view change's nonce
/// (spec §3.5 step 1). Signed with the replica's own key, not attested.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    /// The instance.
    pub instance: Digest,
    /// The view asked for.
    pub to: u64,
    /// The sender's share of `Z`: unpredictable to the others.
    pub nonce: Nonce,
    /// The sender.
    pub replica: u32,
}

impl Signable for Want {
    const CONTEXT: Context = Context::new("bulwark.ea.want.v1");
    const BYTES_MAX: usize = 128;
}

/// Checks `wants` as a certificate for view `to`: `f+1` genuine WANT-VIEW-CHANGEs from distinct
/// replicas. Returns the view change's nonce `Z`: the hash of their nonces in slot order.
pub fn wants_nonce(
    params: &Params,
    keys: &[PublicKey],
    instance: &Digest,
    to: u64,
    wants: &[Cast<Want>],
) -> Result<Nonce, String> {
    if wants.len() > params.n {
        return Err("more wishes than replicas".into());
    }
    let mut nonces = std::collections::BTreeMap::new();
    for cast in wants {
        let want = cast.open(keys)?;
        if want.replica != cast.slot || want.instance != *instance || want.to != to {
            return Err(format!("replica {}'s wish is not for view {to}", cast.slot));
        }
        if nonces.insert(want.replica, want.nonce).is_some() {
            return Err(format!("two wishes from replica {}", want.replica));
        }
    }
    if nonces.len() < params.quorum() {
        return Err(format!(
            "{} wishes to change the view, {} needed",
            nonces.len(),
            params.quorum()
        ));
    }
    let mut all = Vec::with_capacity(32 * nonces.len());
    for nonce in nonces.values() {
        all.extend_from_slice(nonce);
    }
    Ok(Digest::of("bulwark.ea.view-change-nonce.v1", &all).0)
}

/// A replica's VIEW-CHANGE (spec §3.5 step 3): its stable checkpoint, a certificate for every
/// number above it it took part in (committed where it has one, prepared otherwise), the
/// wishes that gave `Z`, and what its commit log says, under `Z`, about the views it abandons.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "Op: Serialize", deserialize = "Op: Deserialize<'de>"))]
pub struct ViewChange<Op> {
    /// The instance.
    pub instance: Digest,
    /// The sender.
    pub replica: u32,
    /// The last view it entered.
    pub from: u64,
    /// The view it moves to.
    pub to: u64,
    /// Its stable checkpoint.
    pub stable: Stable,
    /// Committed certificates above the checkpoint (`Q`).
    pub committed: Vec<Committed<Op>>,
    /// Prepared certificates for numbers above the checkpoint without a committed one (`P`).
    pub prepared: Vec<Prepared<Op>>,
    /// The wishes (`W`).
    pub wants: Vec<Cast<Want>>,
    /// `n_max`: the highest number of `Q` and `P`, or the checkpoint's.
    pub top: u64,
    /// Abandonment (`B`): for `from`, the LOOKUP of commit-log slot `[from|top+1]`; for each
    /// later view `v < to`, of `[v|stable+1]`; each SKIPPED by the advance to the view's last
    /// slot, with nonce `Z`.
    pub abandoned: Vec<Unverified<Attestation>>,
    /// Disclosure (`A`): the LOOKUP, nonce `Z`, of commit-log slot `[from|k]` for each `k` in
    /// `stable+1 ..= top`, with the COMMIT body where the slot holds one.
    pub disclosed: Vec<(Unverified<Attestation>, Option<Bytes>)>,
}

impl<Op: Serialize + DeserializeOwned> Placed for ViewChange<Op> {
    const BYTES_MAX: usize = VIEW_CHANGE_BYTES_MAX;

    fn sender(&self) -> u32 {
        self.replica
    }

    fn place(&self, logs: &Logs) -> (LogId, Seq) {
        (logs.view_change, logs.at(self.to))
    }
}

/// What a checked view change contributes to the new view: per number above its checkpoint,
/// the view and batch of its best certificate, and whether it is a committed one.
pub struct Reported<'a, Op> {
    /// The view change.
    pub change: &'a ViewChange<Op>,
    /// `seq -> (committed, view, batch)`.
    pub entries: std::collections::BTreeMap<u64, (bool, u64, &'a Batch<Op>)>,
}

impl<Op: Serialize + DeserializeOwned> ViewChange<Op> {
    /// Every check of spec §3.5 step 4, given the sender's attestation was checked already:
    /// the wishes and `Z`, the checkpoint, every certificate, the abandonment of every view
    /// from `from` to `to`, and that nothing its commit log holds in `from` is left out.
    #[allow(clippy::too_many_arguments)]
    pub fn check<'a>(
        &'a self,
        params: &Params,
        logs: &Logs,
        keys: &[PublicKey],
        trusted: &[PublicKey],
        instance: &Digest,
        initial: &Digest,
    ) -> Result<Reported<'a, Op>, String> {
        if self.instance != *instance {
            return Err("a view change of another instance".into());
        }
        if self.to <= self.from || self.to - self.from > VIEW_SPAN_MAX || self.to > super::VIEW_MAX
        {
            return Err(format!(
                "a view change from view {} to view {}",
                self.from, self.to
            ));
        }
        let z = wants_nonce(params, keys, instance, self.to, &self.wants)?;
        self.stable
            .check(params, logs, trusted, instance, initial)?;
        let stable = self.stable.seq;
        let mut entries = std::collections::BTreeMap::new();
        for committed in &self.committed {
            let view = committed.check(params, logs, trusted, instance)?;
            if committed.seq <= stable || view > self.from {
                return Err(format!("a committed certificate for {}", committed.seq));
            }
            if entries
                .insert(committed.seq, (true, view, &committed.batch))
                .is_some()
            {
                return Err(format!("two certificates for {}", committed.seq));
            }
        }
        for prepared in &self.prepared {
            let view = prepared.check(params, logs, trusted, instance)?;
            if prepared.seq <= stable || view > self.from {
                return Err(format!("a prepared certificate for {}", prepared.seq));
            }
            if entries
                .insert(prepared.seq, (false, view, &prepared.batch))
                .is_some()
            {
                return Err(format!("two certificates for {}", prepared.seq));
            }
        }
        let top = entries.keys().next_back().copied().unwrap_or(stable);
        if self.top != top || top - stable > 2 * params.checkpoint_interval + 1 {
            return Err(format!(
                "a view change whose highest number is not {}",
                self.top
            ));
        }
        let key = trusted
            .get(self.replica as usize)
            .ok_or("a view change from no replica")?;
        // Abandonment: no commit above `top` in `from`, none above the checkpoint after it.
        let views = self.from..self.to;
        if self.abandoned.len() as u64 != self.to - self.from {
            return Err("a view change that does not abandon every view it leaves".into());
        }
        for (view, attestation) in views.zip(&self.abandoned) {
            let first = if view == self.from {
                top + 1
            } else {
                stable + 1
            };
            let expected = Expected {
                kind: a2m::Kind::Lookup,
                log: logs.commit,
                seq: logs.slot(view, first),
                nonce: z,
                status: SlotStatus::Skipped,
                ref_seq: logs.end_of_view(view),
                value: Some([0; 32]),
                digest: None,
            };
            if !params.mutations.unchecked_attestations {
                expected
                    .check(key, attestation.clone())
                    .map_err(|e| format!("the abandonment of view {view}: {e}"))?;
            }
        }
        // Disclosure: every commit the sender's log holds in `from` above the checkpoint is
        // one its certificates account for.
        if self.disclosed.len() as u64 != top - stable {
            return Err("a view change that does not disclose its commits".into());
        }
        for (seq, (attestation, body)) in (stable + 1..=top).zip(&self.disclosed) {
            if params.mutations.unchecked_attestations {
                break;
            }
            let slot = logs.slot(self.from, seq);
            let signed = attestation
                .clone()
                .verify(key)
                .map_err(|e| format!("the disclosure of {seq}: {e}"))?;
            let said = signed.value();
            let right = said.kind == a2m::Kind::Lookup
                && said.log == logs.commit
                && said.seq == slot
                && said.nonce == z;
            if !right {
                return Err(format!(
                    "the disclosure of {seq} is not the lookup asked for"
                ));
            }
            match said.status {
                SlotStatus::Assigned => {
                    let body = body.as_ref().ok_or("a disclosed commit without its body")?;
                    if body_hash(body) != said.value {
                        return Err(format!("the disclosed commit of {seq} is not its body"));
                    }
                    let vote: Vote = wire::decode(body, 128).map_err(|e| e.to_string())?;
                    if vote.phase != Phase::Commit
                        || vote.seq != seq
                        || vote.view != self.from
                        || vote.instance != *instance
                    {
                        return Err(format!("the disclosed commit of {seq} is another vote"));
                    }
                    // A committed certificate settles the number whatever view it is from; a
                    // prepared one accounts for a commit of its own view or an earlier one.
                    let accounted = entries.get(&seq).is_some_and(|(committed, view, batch)| {
                        let same = batch.digest() == vote.digest;
                        (*committed && same) || *view > vote.view || (*view == vote.view && same)
                    });
                    if !accounted {
                        return Err(format!(
                            "replica {} committed {seq} in view {} and reports otherwise",
                            self.replica, vote.view
                        ));
                    }
                }
                // Never filled in `from`: nothing to account for. (Below the log's low end
                // is impossible above a checkpoint the log keeps.)
                SlotStatus::Skipped | SlotStatus::Unassigned => {}
                SlotStatus::Forgotten => {
                    return Err(format!("the disclosure of {seq} is forgotten"));
                }
            }
        }
        Ok(Reported {
            change: self,
            entries,
        })
    }
}

/// The new primary's NEW-VIEW (spec §3.5 step 5): `f+1` view changes with the same `from` and
/// `to`. What the view re-decides is computed from them by every replica alike ([`select`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = ""))]
pub struct NewView<Op> {
    /// The instance.
    pub instance: Digest,
    /// The new view.
    pub view: u64,
    /// The primary.
    pub replica: u32,
    /// The view changes.
    pub changes: Vec<Attested<ViewChange<Op>>>,
}

impl<Op: Serialize + DeserializeOwned> Placed for NewView<Op> {
    const BYTES_MAX: usize = NEW_VIEW_BYTES_MAX;

    fn sender(&self) -> u32 {
        self.replica
    }

    fn place(&self, logs: &Logs) -> (LogId, Seq) {
        (logs.new_view, logs.at(self.view))
    }
}

/// What a new view starts from: the highest stable checkpoint among its view changes, and for
/// each number above it up to the highest reported, the batch to decide: a committed
/// certificate's where one is reported, else the prepared batch of the highest view, else the
/// null batch.
pub fn select<'a, Op: Clone + Serialize + 'a>(
    reported: &[Reported<'a, Op>],
) -> (&'a Stable, Vec<(u64, Batch<Op>)>) {
    let stable = reported
        .iter()
        .map(|r| &r.change.stable)
        .max_by_key(|stable| stable.seq)
        .unwrap_or_else(|| unreachable!("a new view is chosen from f+1 view changes"));
    let mut best: std::collections::BTreeMap<u64, (bool, u64, Digest, &Batch<Op>)> =
        std::collections::BTreeMap::new();
    for r in reported {
        for (seq, (committed, view, batch)) in &r.entries {
            if *seq <= stable.seq {
                continue;
            }
            let candidate = (*committed, *view, batch.digest(), *batch);
            let better = best
                .get(seq)
                .is_none_or(|(c, v, d, _)| (candidate.0, candidate.1, candidate.2) > (*c, *v, *d));
            if better {
                best.insert(*seq, candidate);
            }
        }
    }
    let top = best.keys().next_back().copied().unwrap_or(stable.seq);
    let plan = (stable.seq + 1..=top)
        .map(|seq| {
            let batch = best
                .get(&seq)
                .map_or_else(Batch::null, |(_, _, _, batch)| (*batch).clone());
            (seq, batch)
        })
        .collect();
    (stable, plan)
}

/// Where a replica stands, for peers to send it what it lacks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Its view.
    pub view: u64,
    /// Whether the view started.
    pub active: bool,
    /// The last number it executed.
    pub executed: u64,
    /// Its stable checkpoint.
    pub stable: u64,
}

/// A stable checkpoint with the state it certifies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateTransfer {
    /// The certificate.
    pub stable: Stable,
    /// The state's bytes.
    pub state: Bytes,
}

/// What EA replicas send each other.
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "", deserialize = ""))]
pub enum Message<A: App> {
    /// A request, from the replica that submits it for its application.
    Request(Submitted<A::Op>),
    /// A client's request, forwarded to the primary.
    Forward(Request<A::Op>),
    /// The primary's assignment of a batch to a number.
    PrePrepare(Box<(Attested<Vote>, Batch<A::Op>)>),
    /// A PREPARE or a COMMIT.
    Vote(Attested<Vote>),
    /// A checkpoint.
    Checkpoint(Attested<Checkpoint>),
    /// A wish to change the view.
    Want(Cast<Want>),
    /// A view change.
    ViewChange(Box<Attested<ViewChange<A::Op>>>),
    /// A new view, sent by its primary or relayed.
    NewView(Box<Attested<NewView<A::Op>>>),
    /// Where the sender stands.
    Status(Status),
    /// A committed batch, for a replica that missed it.
    Committed(Box<Committed<A::Op>>),
    /// A stable checkpoint's state, for a replica behind it.
    State(Box<StateTransfer>),
    /// The application's own.
    App(A::Message),
}

impl<A: App> Clone for Message<A> {
    fn clone(&self) -> Self {
        match self {
            Message::Request(r) => Message::Request(r.clone()),
            Message::Forward(r) => Message::Forward(r.clone()),
            Message::PrePrepare(p) => Message::PrePrepare(p.clone()),
            Message::Vote(v) => Message::Vote(v.clone()),
            Message::Checkpoint(c) => Message::Checkpoint(c.clone()),
            Message::Want(w) => Message::Want(w.clone()),
            Message::ViewChange(v) => Message::ViewChange(v.clone()),
            Message::NewView(n) => Message::NewView(n.clone()),
            Message::Status(s) => Message::Status(s.clone()),
            Message::Committed(c) => Message::Committed(c.clone()),
            Message::State(s) => Message::State(s.clone()),
            Message::App(m) => Message::App(m.clone()),
        }
    }
}

impl<A: App> std::fmt::Debug for Message<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vote = |attested: &Attested<Vote>| {
            attested
                .peek()
                .map(|v| format!("{:?} v{} n{} by {}", v.phase, v.view, v.seq, v.replica))
                .unwrap_or_else(|| "undecodable vote".into())
        };
        match self {
            Message::Request(r) => write!(f, "Request({})", r.id),
            Message::Forward(r) => write!(f, "Forward({})", r.id),
            Message::PrePrepare(p) => write!(f, "PrePrepare({})", vote(&p.0)),
            Message::Vote(v) => write!(f, "Vote({})", vote(v)),
            Message::Checkpoint(c) => {
                write!(f, "Checkpoint({:?})", c.peek().map(|c| (c.seq, c.replica)))
            }
            Message::Want(w) => write!(f, "Want(from slot {})", w.slot),
            Message::ViewChange(v) => write!(
                f,
                "ViewChange({:?})",
                v.peek().map(|v| (v.replica, v.from, v.to))
            ),
            Message::NewView(n) => write!(f, "NewView({:?})", n.peek().map(|n| n.view)),
            Message::Status(s) => write!(f, "Status({s:?})"),
            Message::Committed(c) => write!(f, "Committed({})", c.seq),
            Message::State(s) => write!(f, "State({})", s.stable.seq),
            Message::App(m) => write!(f, "App({m:?})"),
        }
    }
}
