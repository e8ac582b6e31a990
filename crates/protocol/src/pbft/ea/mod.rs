//! A2M-PBFT-EA (A2M paper §3.4 and Appendix A; ../shared/specs/a2m.md §3.4-§3.6): PBFT's
//! agreement among `n = 2f+1` replicas, each with a trusted log, ordering the same [`App`]s as
//! PBFT does.
//!
//! PBFT needs `3f+1` replicas because two quorums must share a *correct* replica. Here every
//! message a replica sends about the order is attested by its trusted log at the slot the
//! message's own `(view, number)` names ([`msg::Attested`]); the log signs one value per slot,
//! so even a faulty replica cannot say two things at one place, and two quorums of `f+1` need
//! only share *some* replica (spec §3.4.5).
//!
//! The protocol, as built here:
//!
//! - **Logs.** Each replica keeps six logs in its trusted log ([`Logs`]): the request history
//!   (`q`: the digest of batch `n` at slot `n`), PRE-PREPAREs and PREPAREs (`m_p`) and COMMITs
//!   (`m_c`) at `[v|n]` (view in the top 64 bits), CHECKPOINTs at `n`, VIEW-CHANGEs and
//!   NEW-VIEWs at the view they are for. A message is sent only with its attestation, which the
//!   driver gets from the trusted log once the record of the message is durable
//!   ([`crate::machine::Output::attest`]).
//! - **Normal case, one batch at a time** (spec §3.4.4). The primary proposes batch `n` only
//!   after executing `n - 1`; backups PREPARE it only as their next number; `f+1` attested
//!   PRE-PREPARE/PREPAREs make it prepared and the replica COMMITs; `f+1` attested COMMITs make
//!   it committed; it executes, its digest goes to slot `n` of the request history, and each
//!   request's submitter gets its result. A client accepts `f+1` matching results.
//! - **Checkpoints.** Every `checkpoint_interval` numbers a replica sends its state digest with
//!   where its request history stands, attested; `f+1` matching ones make it stable.
//! - **View change** (Appendix A). A replica whose request waited too long sends a signed
//!   WANT-VIEW-CHANGE with a fresh nonce share; `f+1` of them give the nonce `Z`. The replica then
//!   *abandons* every view it leaves: it advances its commit log to the last slot of each, so it
//!   can never commit there again, and its VIEW-CHANGE carries, all under `Z`, the lookups that
//!   prove it (slot `[from|top+1]` skipped: no commit above the highest number it reports), and
//!   what its commit log holds for each number it reports (a commit it hides makes its view
//!   change invalid). The new primary's NEW-VIEW holds `f+1` view changes with the same
//!   `from` and `to`; every replica computes the same plan from them (committed batches, else
//!   the highest view's prepared batch, else the null batch) and PREPAREs and COMMITs each
//!   number of it in the new view, executing when `f+1` COMMITs of the new view agree (the
//!   spec's conservative choice, §8 item 9).
//! - **Catching up.** A replica with work outstanding sends STATUS; peers answer with the
//!   NEW-VIEW of a later view, committed certificates, or a stable checkpoint's state.
//!
//! Clients accept `f+1` matching results, which include a correct replica's; the replies carry
//! no request-history attestation (A2M-PBFT-E's do: [`super::history`]).
//!
//! Durability: a replica records each message of its own before its trusted log is asked to
//! attest it ([`Change::Said`]), and its certificates before it acts on them.
//! [`EaReplica::restore`] rebuilds it from those records and asks its trusted log again for
//! what it may have said: a replica that crashed between the two never says something else at
//! the same slot, and the log itself refuses if it tries.

pub mod msg;
pub mod replica;
#[cfg(test)]
mod tests;

pub use msg::{
    Attested, Checkpoint, Committed, Message, NewView, Prepared, Stable, ViewChange, Want,
};
pub use replica::{Change, EaReplica, EaStats, RestoreError, Said, Setup};

use bulwark_core::Slot;
use bulwark_core::a2m::{self, LogId, Seq};

/// The sizes and timeouts of one EA instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Replicas: `2f+1`.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// A checkpoint every this many numbers.
    pub checkpoint_interval: u64,
    /// Requests in one batch at most.
    pub batch_max: usize,
    /// How long a request may wait before its replica asks for a view change, in milliseconds;
    /// doubled for each view change in a row that does not complete.
    pub view_change_ms: u64,
    /// How often a replica with work outstanding sends STATUS, in milliseconds.
    pub status_ms: u64,
    /// Deliberate breakage for negative controls; all off in every real replica.
    pub mutations: Mutations,
}

/// Ways to break EA on purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// Replicas believe a message without checking its attestation: `f+1` quorums of `2f+1`
    /// replicas without a trusted log, which an equivocating primary splits.
    pub unchecked_attestations: bool,
}

impl Params {
    /// The defaults for `f` faults: `2f+1` replicas, checkpoints every 8 numbers, batches of up
    /// to 64 requests, a 2 s view-change timeout, STATUS every 300 ms.
    pub fn new(f: usize) -> Params {
        Params {
            n: 2 * f + 1,
            f,
            checkpoint_interval: 8,
            batch_max: 64,
            view_change_ms: 2_000,
            status_ms: 300,
            mutations: Mutations::default(),
        }
    }

    /// Agreement, checkpoint, view-change and reply quorums: `f+1`.
    pub fn quorum(&self) -> usize {
        self.f + 1
    }

    /// The primary of `view`.
    pub fn primary(&self, view: u64) -> Slot {
        Slot((view % self.n as u64) as u32)
    }

    /// Checks the relations the protocol's proofs rest on.
    pub fn validate(&self) -> Result<(), String> {
        if self.n != 2 * self.f + 1 {
            return Err(format!(
                "A2M-PBFT-EA needs 2f+1 replicas, not {} for f = {}",
                self.n, self.f
            ));
        }
        if self.checkpoint_interval == 0
            || self.batch_max == 0
            || self.view_change_ms == 0
            || self.status_ms == 0
        {
            return Err("checkpoints, batches and timeouts need positive sizes".into());
        }
        Ok(())
    }
}

/// The trusted-log logs one replica of one instance uses: one per purpose, so that an
/// attestation of one kind of message is never taken for another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logs {
    /// The request history `q`.
    pub requests: LogId,
    /// PRE-PREPAREs and PREPAREs, `m_p`.
    pub prepare: LogId,
    /// COMMITs, `m_c`.
    pub commit: LogId,
    /// CHECKPOINTs, `m_cp`.
    pub checkpoint: LogId,
    /// VIEW-CHANGEs, `m_vc`.
    pub view_change: LogId,
    /// NEW-VIEWs, `m_nv`.
    pub new_view: LogId,
    /// Where this instance's slots start in every one of them: instances that share a trusted
    /// log's logs (one configuration-service instance per epoch) each get a range of their own,
    /// above every earlier instance's.
    pub base: Seq,
}

/// The highest view an instance may reach: `[v|n]` of every view up to it fits below the next
/// instance's range.
pub const VIEW_MAX: u64 = (1 << 32) - 1;

impl Logs {
    /// Six consecutive log ids from `first`, for instance number `instance` (each instance's
    /// slots lie in `[instance·2^96, (instance+1)·2^96)`).
    pub fn new(first: LogId, instance: u32) -> Logs {
        Logs {
            requests: first,
            prepare: first + 1,
            commit: first + 2,
            checkpoint: first + 3,
            view_change: first + 4,
            new_view: first + 5,
            base: Seq::from(instance) << 96,
        }
    }

    /// The slot of number `n` (or view `n`) in the request, checkpoint and view logs.
    pub fn at(&self, n: u64) -> Seq {
        self.base + Seq::from(n)
    }

    /// The slot of `(view, n)` in the PREPARE and COMMIT logs: `[v|n]` (spec §3.4.3).
    pub fn slot(&self, view: u64, n: u64) -> Seq {
        debug_assert!(view <= VIEW_MAX, "views are bounded by VIEW_MAX");
        self.base + a2m::flat(view, n)
    }

    /// The last slot of `view` in the PREPARE and COMMIT logs: `[v+1|0] - 1`.
    pub fn end_of_view(&self, view: u64) -> Seq {
        self.base + a2m::end_of_view(view)
    }
}
