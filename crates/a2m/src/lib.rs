//! Bulwark's trusted log: A2M, attested append-only memory (the A2M paper §2;
//! ../shared/specs/a2m.md §2.2, §2.5).
//!
//! Each node has one component. It holds append-only logs of 32-byte values and answers questions
//! about them with attestations signed by its own key ([`bulwark_core::a2m::Attestation`]), which
//! anyone holding the public key checks. No operation overwrites a slot, so a host cannot have
//! two different values attested for one slot, whoever asks: that is what stops equivocation.
//!
//! [`A2m`] is the interface every backend offers, with the fused `append_attest` and
//! `advance_attest` of the paper's batching (§5.4) so that a backend across a process boundary
//! or inside a TPM answers in one call. [`Component`] is the software backend: the logs in memory,
//! every change durable in its own store before the call returns (and so before any attestation
//! about it can leave), the key beside the logs, refusing to start on lost or damaged state.
//!
//! A component that lost its state must never come back under its old identity: after a reset it
//! could attest different contents for slots it already attested (spec §2.5, §7.1 item 8). So
//! [`Component::open`] refuses a directory without state, and only [`Component::create`] makes an
//! identity, on an empty directory.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

mod anchor;
mod component;
mod logs;
pub mod socket;
pub mod swtpm;
#[cfg(test)]
mod tests;
pub mod tpm;

use std::path::PathBuf;

use bulwark_core::a2m::{
    Attestation, Call, ChainDigest, LogId, Nonce, Outcome, Refusal, Seq, Value,
};
use bulwark_core::sign::{PublicKey, Signed};

pub use anchor::{Anchor, AnchorKind, FileAnchor, Mark};
pub use component::Component;
pub use logs::{Entry, Head, Limits, Logs, Plan};
pub use tpm::TpmAnchor;

/// What a backend refused, or why it could not start.
#[derive(Debug, thiserror::Error)]
pub enum A2mError {
    /// A call was refused, or the component stopped (it cannot tell what reached its disk, so it
    /// attests nothing more until restarted).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The component cannot start on the directory: it holds no identity, another process holds
    /// it, or its state is lost, damaged or rolled back (then the component must take a new
    /// identity, and its verifiers must be told; the reason says so).
    #[error("{}: {reason}", dir.display())]
    Identity {
        /// The component's directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The interface of every trusted-log backend (spec §2.2 and the appendix's suggested surface).
/// Attestations come back signed; a caller that forwards one sends
/// [`Signed::to_unverified`], and verifiers check it with
/// [`bulwark_core::a2m::Expected::check`].
pub trait A2m {
    /// The key its attestations verify under: the component's identity.
    fn public_key(&self) -> PublicKey;

    /// Assigns `value` to the slot after the log's end and returns that slot.
    fn append(&mut self, log: LogId, value: Value) -> Result<Seq, A2mError>;

    /// Assigns `value` to slot `seq`, past the log's end, chained to `digest` instead of the
    /// previous slot's digest; the slots between are skipped.
    fn advance(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<(), A2mError>;

    /// Attests what slot `seq` of `log` holds, answering `nonce`.
    fn lookup(
        &mut self,
        log: LogId,
        seq: Seq,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError>;

    /// Attests which slot is the log's last, answering `nonce`.
    fn end(&mut self, log: LogId, nonce: Nonce) -> Result<Signed<Attestation>, A2mError>;

    /// Forgets every slot below `seq`, which must lie in `(low, high]`; slot `seq` stays.
    fn truncate(&mut self, log: LogId, seq: Seq) -> Result<(), A2mError>;

    /// [`A2m::append`], then [`A2m::lookup`] of the slot it filled, in one call.
    fn append_attest(
        &mut self,
        log: LogId,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        let seq = self.append(log, value)?;
        self.lookup(log, seq, nonce)
    }

    /// Makes `calls` one after the other, as a driver does for a protocol's batch: an answer per
    /// call made, and the first refusal ends the batch (later calls may depend on it). A
    /// component that cannot go on answers that it stopped.
    fn call_all(&mut self, calls: &[Call]) -> Vec<Result<Outcome, Refusal>> {
        let mut answers = Vec::with_capacity(calls.len());
        for call in calls {
            match self.call(call) {
                Ok(outcome) => answers.push(Ok(outcome)),
                Err(A2mError::Refused(refusal)) => {
                    answers.push(Err(refusal));
                    break;
                }
                Err(error) => {
                    answers.push(Err(Refusal::Stopped(error.to_string())));
                    break;
                }
            }
        }
        answers
    }

    /// Makes `call`: what a driver does with the calls a protocol asks for.
    fn call(&mut self, call: &Call) -> Result<Outcome, A2mError> {
        Ok(match *call {
            Call::Append { log, value } => Outcome::Appended(self.append(log, value)?),
            Call::Advance {
                log,
                seq,
                digest,
                value,
            } => {
                self.advance(log, seq, digest, value)?;
                Outcome::Done
            }
            Call::Lookup { log, seq, nonce } => {
                Outcome::Attested(Box::new(self.lookup(log, seq, nonce)?))
            }
            Call::End { log, nonce } => Outcome::Attested(Box::new(self.end(log, nonce)?)),
            Call::Truncate { log, seq } => {
                self.truncate(log, seq)?;
                Outcome::Done
            }
            Call::AppendAttest { log, value, nonce } => {
                Outcome::Attested(Box::new(self.append_attest(log, value, nonce)?))
            }
            Call::AdvanceAttest {
                log,
                seq,
                digest,
                value,
                nonce,
            } => Outcome::Attested(Box::new(
                self.advance_attest(log, seq, digest, value, nonce)?,
            )),
        })
    }

    /// [`A2m::advance`], then [`A2m::lookup`] of slot `seq`, in one call.
    fn advance_attest(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        self.advance(log, seq, digest, value)?;
        self.lookup(log, seq, nonce)
    }
}

impl From<A2mError> for Refusal {
    fn from(error: A2mError) -> Refusal {
        match error {
            A2mError::Refused(refusal) => refusal,
            error => Refusal::Stopped(error.to_string()),
        }
    }
}
