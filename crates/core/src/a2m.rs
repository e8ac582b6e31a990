//! What a trusted log (A2M, attested append-only memory) says, and how anyone checks it.
//!
//! A node's A2M holds append-only logs of fixed-size values and signs *attestations* about them:
//! "in log `q`, slot `n` holds `x`, and the history up to it hashes to `d`" (a LOOKUP), or "slot
//! `n` is the last one, as of your nonce `z`" (an END). A faulty host can still lie or stay silent,
//! but it cannot get two different stories about one slot signed, so it must tell everyone the
//! same lie (A2M paper §2; ../shared/specs/a2m.md §2).
//!
//! This module is the vocabulary every party shares: the attestation, its exact signed encoding
//! (through [`Signed`], so it is never re-encoded to verify), the canonical digest chain, and
//! [`Expected`], the check a verifier makes of *every* field before it believes one (spec §7.1
//! item 1). The component itself (its state, its storage and its key) lives in the `bulwark-a2m`
//! crate.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::sign::{Context, PublicKey, SignError, Signable, Signed, Unverified};

/// A position in a log. The paper suggests 160 bits for long-lived logs; 128 bits, flattened as
/// `[view | sequence]` 64/64 by the agreement protocols ([`flat`]), never wrap in practice.
pub type Seq = u128;

/// A log's name within one component. Log ids are part of the component's identity: each purpose
/// (a request history, a protocol's message log) has its own, published to the verifiers.
pub type LogId = u64;

/// A fixed-size value: what a slot holds, normally the hash of the item committed.
pub type Value = [u8; 32];

/// A cumulative digest of a log up to a slot ([`chain`]).
pub type ChainDigest = [u8; 32];

/// The nonce an attestation answers: a verifier's fresh random bytes where freshness is the
/// point, or an encoding of the protocol step it is tied to ([`nonce_of`]).
pub type Nonce = [u8; 32];

/// Which question an attestation answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// What slot `seq` holds.
    Lookup,
    /// Which slot is the last one.
    End,
}

/// What the log says about the slot asked for (spec §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    /// Past the end: `ref_seq` is the last assigned slot; value and digest are zero.
    Unassigned,
    /// Truncated away: `ref_seq` is the lowest slot kept; value and digest are zero.
    Forgotten,
    /// Jumped over by an advance: `ref_seq` is the slot that advance filled, and value and digest
    /// are that slot's (spec §8 item 2).
    Skipped,
    /// Filled by an append or an advance: `ref_seq` is the slot itself.
    Assigned,
}

/// An attestation's statement, `⟨TYPE, q, n, z, x, w, n′, d⟩` of the paper, signed by the
/// component's key over its exact encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attestation {
    /// LOOKUP or END.
    pub kind: Kind,
    /// The log.
    pub log: LogId,
    /// The slot asked about; for an END, the last slot.
    pub seq: Seq,
    /// The nonce the question carried.
    pub nonce: Nonce,
    /// The slot's value (zero unless assigned or skipped).
    pub value: Value,
    /// What the log says about the slot.
    pub status: Status,
    /// The reference slot (see [`Status`]).
    pub ref_seq: Seq,
    /// The cumulative digest at `ref_seq` (zero unless assigned or skipped).
    pub digest: ChainDigest,
}

impl Signable for Attestation {
    const CONTEXT: Context = Context::new("bulwark.a2m.attestation");
    // Two varint u128s (19 bytes each at most), a u64, four 32-byte arrays, two tags.
    const BYTES_MAX: usize = 192;
}

/// The digest that follows `previous` when `value` fills slot `seq`: SHA-256 over the big-endian
/// 16-byte slot, the value and the previous digest. The encoding is fixed so that every correct
/// component computes the same chain, byte for byte, since verifiers compare digests across
/// replicas (spec §2.5, §7.1 item 2).
pub fn chain(seq: Seq, value: &Value, previous: &ChainDigest) -> ChainDigest {
    let mut hasher = sha2::Sha256::new();
    hasher.update(seq.to_be_bytes());
    hasher.update(value);
    hasher.update(previous);
    hasher.finalize().into()
}

/// The digest a log has after `values` were appended one by one from slot `first` on, starting
/// from `digest` at slot `first - 1`: what a verifier recomputes from a history it was handed.
pub fn chain_all<'a>(
    first: Seq,
    mut digest: ChainDigest,
    values: impl IntoIterator<Item = &'a Value>,
) -> ChainDigest {
    let mut seq = first;
    for value in values {
        digest = chain(seq, value, &digest);
        seq = seq.saturating_add(1);
    }
    digest
}

/// Slot `n` of view `v` in a message log shared by all views: `[v|n] = v·2^64 + n`.
pub const fn flat(view: u64, n: u64) -> Seq {
    ((view as u128) << 64) | n as u128
}

/// The last slot of view `v` in a flattened log: `[v+1|0] - 1`.
pub const fn end_of_view(view: u64) -> Seq {
    flat(view, u64::MAX)
}

/// A nonce that ties an attestation to a protocol step (a sequence number, `[v|n]`, a view)
/// instead of a verifier's random bytes: the slot number, big-endian, zero-padded.
pub fn nonce_of(seq: Seq) -> Nonce {
    let mut nonce = [0; 32];
    nonce[16..].copy_from_slice(&seq.to_be_bytes());
    nonce
}

/// Everything a verifier requires of an attestation before it believes it. Every field is
/// checked; `value` and `digest` only when the verifier knows what they must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// LOOKUP or END.
    pub kind: Kind,
    /// The log the signer registered for this purpose.
    pub log: LogId,
    /// The slot the protocol step implies (ignored for an END, whose slot is the answer).
    pub seq: Seq,
    /// The nonce the verifier sent or the protocol step fixes.
    pub nonce: Nonce,
    /// The status the step needs.
    pub status: Status,
    /// The reference slot the step needs (ignored for an END).
    pub ref_seq: Seq,
    /// The value, when the verifier knows it: the hash of the enclosed message or request.
    pub value: Option<Value>,
    /// The digest, when the verifier knows it.
    pub digest: Option<ChainDigest>,
}

impl Expected {
    /// A LOOKUP of slot `seq` of `log` that must say it holds `value`, with the nonce the
    /// protocol ties to the slot ([`nonce_of`]).
    pub fn assigned(log: LogId, seq: Seq, value: Value) -> Expected {
        Expected {
            kind: Kind::Lookup,
            log,
            seq,
            nonce: nonce_of(seq),
            status: Status::Assigned,
            ref_seq: seq,
            value: Some(value),
            digest: None,
        }
    }

    /// An END of `log` answering the verifier's fresh `nonce`.
    pub fn end(log: LogId, nonce: Nonce) -> Expected {
        Expected {
            kind: Kind::End,
            log,
            seq: 0,
            nonce,
            status: Status::Assigned,
            ref_seq: 0,
            value: None,
            digest: None,
        }
    }

    /// Verifies `attestation`'s signature under `signer`, then every field against this
    /// expectation. An END must describe an assigned last slot: `seq` = `ref_seq`.
    pub fn check(
        &self,
        signer: &PublicKey,
        attestation: Unverified<Attestation>,
    ) -> Result<Signed<Attestation>, AttestationError> {
        let signed = attestation
            .verify(signer)
            .map_err(AttestationError::Signature)?;
        let got = signed.value();
        let field = |name: &'static str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(AttestationError::Field(name))
            }
        };
        field("kind", got.kind == self.kind)?;
        field("log", got.log == self.log)?;
        field("nonce", got.nonce == self.nonce)?;
        field("status", got.status == self.status)?;
        match self.kind {
            Kind::Lookup => {
                field("seq", got.seq == self.seq)?;
                field("ref_seq", got.ref_seq == self.ref_seq)?;
            }
            Kind::End => field("ref_seq", got.ref_seq == got.seq)?,
        }
        field("value", self.value.is_none_or(|value| value == got.value))?;
        field(
            "digest",
            self.digest.is_none_or(|digest| digest == got.digest),
        )?;
        Ok(signed)
    }
}

/// What one attestation says about the log's slots, whenever it was made: facts no later
/// operation of an append-only log can undo (a truncation only makes them unaskable).
struct Facts {
    /// A slot assigned with this value and digest.
    assigned: Option<(Seq, Value, ChainDigest)>,
    /// A slot assigned, contents not said (the end an UNASSIGNED answer names).
    end: Option<Seq>,
    /// Slots `[from, by)` skipped by the advance that filled slot `by`.
    skipped: Option<(Seq, Seq)>,
}

fn facts(attestation: &Attestation) -> Facts {
    let content = (attestation.ref_seq, attestation.value, attestation.digest);
    match (attestation.kind, attestation.status) {
        (Kind::End, _) | (Kind::Lookup, Status::Assigned) => Facts {
            assigned: Some(content),
            end: None,
            skipped: None,
        },
        (Kind::Lookup, Status::Skipped) => Facts {
            assigned: Some(content),
            end: None,
            skipped: Some((attestation.seq, attestation.ref_seq)),
        },
        (Kind::Lookup, Status::Unassigned) => Facts {
            assigned: None,
            end: Some(attestation.ref_seq),
            skipped: None,
        },
        (Kind::Lookup, Status::Forgotten) => Facts {
            assigned: None,
            end: None,
            skipped: None,
        },
    }
}

/// Whether two attestations of one component contradict each other: no append-only log could
/// have made both, whatever the order. Signed by the same key, the pair is a proof, checkable by
/// anyone, that the component is faulty or its state was rolled back (a rolled-back log attests
/// again slots it had already attested, with other contents).
///
/// What a correct log says of a slot never changes once said: assigned with one content, or
/// skipped by one advance (every slot of a gap is skipped by the advance that ends it). So a
/// contradiction is one slot told two ways: two contents, assigned and skipped, or skipped by
/// two advances. A LOOKUP that found a slot unassigned and one that found it assigned are both
/// true at different times, and nothing in them says which came first.
pub fn contradicts(a: &Attestation, b: &Attestation) -> bool {
    if a.log != b.log {
        return false;
    }
    let (a, b) = (facts(a), facts(b));
    one_way(&a, &b) || one_way(&b, &a)
}

/// [`contradicts`], one direction: what `a` asserts against what `b` asserts.
fn one_way(a: &Facts, b: &Facts) -> bool {
    if let (Some(first), Some(second)) = (a.assigned, b.assigned)
        && first.0 == second.0
        && (first.1, first.2) != (second.1, second.2)
    {
        return true;
    }
    let Some((from, by)) = a.skipped else {
        return false;
    };
    let inside = |slot: Seq| from <= slot && slot < by;
    b.assigned.is_some_and(|(slot, ..)| inside(slot))
        || b.end.is_some_and(inside)
        || b.skipped.is_some_and(|(other_from, other_by)| {
            other_by != by && from.max(other_from) < by.min(other_by)
        })
}

/// One call to a trusted log (spec §2.2, with the fused forms of §2.5): what a host sends its
/// component, and what a protocol asks its driver to make ([`Outcome`] answers it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Call {
    /// Fill the slot after the log's end with `value`.
    Append {
        /// The log.
        log: LogId,
        /// The value.
        value: Value,
    },
    /// Fill slot `seq`, past the end, with `value`, chained to `digest`.
    Advance {
        /// The log.
        log: LogId,
        /// The slot.
        seq: Seq,
        /// The digest to chain to.
        digest: ChainDigest,
        /// The value.
        value: Value,
    },
    /// Attest what slot `seq` holds.
    Lookup {
        /// The log.
        log: LogId,
        /// The slot.
        seq: Seq,
        /// The nonce.
        nonce: Nonce,
    },
    /// Attest the log's last slot.
    End {
        /// The log.
        log: LogId,
        /// The nonce.
        nonce: Nonce,
    },
    /// Forget every slot below `seq`.
    Truncate {
        /// The log.
        log: LogId,
        /// The new lowest slot.
        seq: Seq,
    },
    /// [`Call::Append`], then [`Call::Lookup`] of the slot it filled.
    AppendAttest {
        /// The log.
        log: LogId,
        /// The value.
        value: Value,
        /// The nonce.
        nonce: Nonce,
    },
    /// [`Call::Advance`], then [`Call::Lookup`] of slot `seq`.
    AdvanceAttest {
        /// The log.
        log: LogId,
        /// The slot.
        seq: Seq,
        /// The digest to chain to.
        digest: ChainDigest,
        /// The value.
        value: Value,
        /// The nonce.
        nonce: Nonce,
    },
}

/// What a call achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The slot an append filled.
    Appended(Seq),
    /// A change made durable.
    Done,
    /// An attestation, checked against the component's key.
    Attested(Box<Signed<Attestation>>),
}

/// Why a trusted log refused a call, in a form that crosses a socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The log keeps as many slots as it may: its host must stop, or truncate at a stable
    /// checkpoint, never drop entries.
    #[error("log {log} is full ({max} slots kept); truncate it at a stable checkpoint")]
    Full {
        /// The log.
        log: LogId,
        /// Slots it may keep.
        max: u64,
    },
    /// The component holds as many logs as it may.
    #[error("the trusted log holds {max} logs already")]
    TooManyLogs {
        /// Logs it may hold.
        max: u64,
    },
    /// The log's last slot is the largest there is.
    #[error("log {log} has used every slot")]
    Exhausted {
        /// The log.
        log: LogId,
    },
    /// An advance to a slot at or below the end.
    #[error("log {log} ends at slot {high}: it cannot advance to slot {seq}")]
    NotMonotone {
        /// The log.
        log: LogId,
        /// The slot asked for.
        seq: Seq,
        /// The log's end.
        high: Seq,
    },
    /// A truncation to a slot outside `(low, high]`.
    #[error("log {log} keeps slots {low} to {high}: it cannot be truncated to slot {seq}")]
    OutOfRange {
        /// The log.
        log: LogId,
        /// The slot asked for.
        seq: Seq,
        /// The lowest slot kept.
        low: Seq,
        /// The log's end.
        high: Seq,
    },
    /// The component stopped or cannot be reached: nothing is attested until it is back.
    #[error("the trusted log stopped: {0}")]
    Stopped(String),
}

/// Why an attestation was not believed.
#[derive(Debug, thiserror::Error)]
pub enum AttestationError {
    /// The signature is not the registered component's, or the bytes are not an attestation.
    #[error("the attestation's signature does not verify: {0}")]
    Signature(SignError),
    /// A field differs from what the protocol step requires.
    #[error("the attestation's {0} is not what the step requires")]
    Field(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::SecretKey;
    use crate::wire;

    fn statement() -> Attestation {
        Attestation {
            kind: Kind::Lookup,
            log: 3,
            seq: flat(2, 7),
            nonce: nonce_of(flat(2, 7)),
            value: [5; 32],
            status: Status::Assigned,
            ref_seq: flat(2, 7),
            digest: [9; 32],
        }
    }

    #[test]
    fn the_largest_attestation_fits_its_bound() {
        let largest = Attestation {
            seq: Seq::MAX,
            ref_seq: Seq::MAX,
            log: LogId::MAX,
            ..statement()
        };
        assert!(wire::encode(&largest).len() <= Attestation::BYTES_MAX);
    }

    #[test]
    fn the_chain_is_the_fixed_encoding() {
        let mut input = Vec::new();
        input.extend_from_slice(&7u128.to_be_bytes());
        input.extend_from_slice(&[1; 32]);
        input.extend_from_slice(&[2; 32]);
        let expected: [u8; 32] = sha2::Sha256::digest(&input).into();
        assert_eq!(chain(7, &[1; 32], &[2; 32]), expected);
        assert_eq!(
            chain_all(1, [0; 32], [&[1; 32], &[2; 32]]),
            chain(2, &[2; 32], &chain(1, &[1; 32], &[0; 32]))
        );
    }

    #[test]
    fn flattened_views_order_after_every_slot_of_the_view_before() {
        assert_eq!(end_of_view(3) + 1, flat(4, 0));
        assert!(flat(3, u64::MAX) < flat(4, 1));
    }

    /// Every field of an attestation is bound: changing any one of them in the signed bytes, or
    /// expecting another value for it, makes the check fail (spec §7.2 T1, T9).
    #[test]
    fn every_field_is_checked() {
        let key = SecretKey::from_seed(&[1; 32]);
        let good = statement();
        let expected = Expected {
            digest: Some(good.digest),
            ..Expected::assigned(good.log, good.seq, good.value)
        };
        let signed = Signed::sign(&key, good).expect("fits");
        assert!(
            expected
                .check(&key.public_key(), signed.to_unverified())
                .is_ok()
        );

        // Another component's key.
        let other = SecretKey::from_seed(&[2; 32]);
        assert!(matches!(
            expected.check(&other.public_key(), signed.to_unverified()),
            Err(AttestationError::Signature(_))
        ));

        // Any flipped bit of the signed bytes.
        for byte in 0..signed.bytes().len() {
            let mut bytes = signed.bytes().to_vec();
            bytes[byte] ^= 1;
            let forged = Unverified::new(bytes.into(), *signed.signature());
            assert!(expected.check(&key.public_key(), forged).is_err());
        }

        // Each field signed with another value, by the right key: a replay from another log,
        // slot, view, request or question.
        let variants: [(&str, Attestation); 8] = [
            (
                "kind",
                Attestation {
                    kind: Kind::End,
                    ..good
                },
            ),
            ("log", Attestation { log: 4, ..good }),
            (
                "seq",
                Attestation {
                    seq: flat(3, 7),
                    ..good
                },
            ),
            (
                "nonce",
                Attestation {
                    nonce: [0; 32],
                    ..good
                },
            ),
            (
                "value",
                Attestation {
                    value: [6; 32],
                    ..good
                },
            ),
            (
                "status",
                Attestation {
                    status: Status::Skipped,
                    ..good
                },
            ),
            (
                "ref_seq",
                Attestation {
                    ref_seq: flat(2, 8),
                    ..good
                },
            ),
            (
                "digest",
                Attestation {
                    digest: [8; 32],
                    ..good
                },
            ),
        ];
        for (field, variant) in variants {
            let replayed = Signed::sign(&key, variant).expect("fits");
            assert!(
                matches!(
                    expected.check(&key.public_key(), replayed.to_unverified()),
                    Err(AttestationError::Field(f)) if f == field
                ),
                "{field}"
            );
        }
    }

    #[test]
    fn two_stories_about_one_slot_contradict() {
        let assigned = statement();
        let end = Attestation {
            kind: Kind::End,
            nonce: [1; 32],
            ..assigned
        };
        // The same story, asked twice or as an END: no contradiction.
        assert!(!contradicts(&assigned, &end));
        assert!(!contradicts(
            &assigned,
            &Attestation {
                nonce: [3; 32],
                ..assigned
            }
        ));
        // Another value or digest for the slot.
        assert!(contradicts(
            &assigned,
            &Attestation {
                value: [6; 32],
                ..assigned
            }
        ));
        assert!(contradicts(
            &end,
            &Attestation {
                digest: [1; 32],
                ..assigned
            }
        ));
        // The slot skipped by a later advance, while it was attested assigned.
        let skipped = Attestation {
            status: Status::Skipped,
            ref_seq: assigned.seq + 2,
            value: [7; 32],
            digest: [8; 32],
            ..assigned
        };
        assert!(contradicts(&assigned, &skipped));
        // The advancing slot's own contents, told differently in a SKIPPED answer.
        let advancing = Attestation {
            seq: skipped.ref_seq,
            ref_seq: skipped.ref_seq,
            value: [7; 32],
            digest: [8; 32],
            ..assigned
        };
        assert!(!contradicts(&skipped, &advancing));
        assert!(contradicts(
            &skipped,
            &Attestation {
                value: [9; 32],
                ..advancing
            }
        ));
        // Every slot of a gap is skipped by the same advance, whichever slot was asked.
        let same_gap = Attestation {
            seq: assigned.seq + 1,
            ..skipped
        };
        assert!(!contradicts(&skipped, &same_gap));
        // A slot inside a gap found assigned, or ending the log, or skipped by another advance:
        // what a log rolled back and refilled says.
        let inside = Attestation {
            seq: assigned.seq + 1,
            ref_seq: assigned.seq + 1,
            value: [1; 32],
            digest: [1; 32],
            ..assigned
        };
        assert!(contradicts(&skipped, &inside));
        assert!(contradicts(
            &Attestation {
                kind: Kind::End,
                ..inside
            },
            &skipped
        ));
        assert!(contradicts(
            &skipped,
            &Attestation {
                seq: assigned.seq + 1,
                ref_seq: assigned.seq + 5,
                ..skipped
            }
        ));
        let ended_inside = Attestation {
            seq: assigned.seq + 9,
            status: Status::Unassigned,
            ref_seq: assigned.seq + 1,
            value: [0; 32],
            digest: [0; 32],
            ..assigned
        };
        assert!(contradicts(&ended_inside, &skipped));
        // The gap's own end is the advance's slot: assigned, no contradiction.
        assert!(!contradicts(
            &skipped,
            &Attestation {
                seq: skipped.ref_seq + 3,
                status: Status::Unassigned,
                ref_seq: skipped.ref_seq,
                value: [0; 32],
                digest: [0; 32],
                ..assigned
            }
        ));
        // Unassigned then assigned is what time does; another log is another story.
        let unassigned = Attestation {
            status: Status::Unassigned,
            ref_seq: assigned.seq - 1,
            value: [0; 32],
            digest: [0; 32],
            ..assigned
        };
        assert!(!contradicts(&unassigned, &assigned));
        assert!(!contradicts(
            &assigned,
            &Attestation {
                log: 9,
                value: [6; 32],
                ..assigned
            }
        ));
    }

    #[test]
    fn an_end_must_describe_its_own_slot() {
        let key = SecretKey::from_seed(&[1; 32]);
        let end = Attestation {
            kind: Kind::End,
            nonce: [7; 32],
            ..statement()
        };
        let expected = Expected::end(end.log, [7; 32]);
        let signed = Signed::sign(&key, end).expect("fits");
        assert_eq!(
            expected
                .check(&key.public_key(), signed.to_unverified())
                .map(|s| s.value().seq)
                .ok(),
            Some(end.seq)
        );
        let lying = Signed::sign(
            &key,
            Attestation {
                ref_seq: end.seq - 1,
                ..end
            },
        )
        .expect("fits");
        assert!(matches!(
            expected.check(&key.public_key(), lying.to_unverified()),
            Err(AttestationError::Field("ref_seq"))
        ));
    }
}
