//! What a node was caught doing, and the proof when there is one (DESIGN.md §2: evidence over
//! suspicion).
//!
//! Most misbehaviour is caught relative to other replies (a fragment that fails the checksum that
//! `f+1` nodes agreed on), and only the observer can weigh that: such evidence carries no proof.
//! Where the node signed what it did, the evidence carries a [`Proof`] that anyone can check
//! with nothing but the proof itself and the node's public key from the configuration, without
//! trusting whoever reports it.
//!
//! Evidence travels between nodes, clients and the configuration service, so every length in it
//! is bounded when it is decoded.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, de};

use crate::ids::NodeId;
use crate::sign::{self, PublicKey, Signable, Signature, Signed};
use crate::wire;

/// The longest free-text detail kept with evidence, in bytes.
pub const DETAIL_BYTES_MAX: usize = 1024;
/// The longest name of an [`EvidenceKind::Other`], in bytes.
pub const OTHER_BYTES_MAX: usize = 64;
/// The longest signed message a proof carries, in bytes. What nodes sign to commit themselves
/// (versions, votes, configurations' digests) is small; values travel as their hashes.
pub const PROOF_MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// Kinds of misbehaviour.
///
/// The first four are M-PoWerStore's, each established relative to `f+1` agreeing replies, at
/// least one from a correct node; the rest come with signatures.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EvidenceKind {
    /// Its fragment for the selected version does not hash to the agreed cross-checksum.
    CorruptFragment,
    /// It answered the selected timestamp with a different cross-checksum, `N̄` or MAC vector.
    ConflictingMetadata,
    /// Its reply could not be a correct server's (wrong vector lengths, impossible layout,
    /// undecodable bytes).
    MalformedReply,
    /// It answered "superseded" offering a newer version that `n - f` nodes then answered
    /// strictly lower than: no correct node holds that candidate, so a correct node could not
    /// have offered it.
    FalseSupersession,
    /// It served a version whose writer's signature does not verify: correct nodes check
    /// signatures before they store, so it made the version up or damaged it.
    ForgedVersion,
    /// It signed two messages that a correct node never signs both of (two different values for
    /// one position): provable to anyone with the [`Proof::Conflicting`].
    Equivocation,
    /// Misbehaviour without a kind of its own yet: a short name, at most [`OTHER_BYTES_MAX`]
    /// bytes.
    Other(#[serde(deserialize_with = "other_name")] String),
}

impl EvidenceKind {
    /// A stable snake-case name, for metrics labels and logs. Every [`EvidenceKind::Other`]
    /// shares one, so a peer cannot mint label values.
    pub fn name(&self) -> &'static str {
        match self {
            EvidenceKind::CorruptFragment => "corrupt_fragment",
            EvidenceKind::ConflictingMetadata => "conflicting_metadata",
            EvidenceKind::MalformedReply => "malformed_reply",
            EvidenceKind::FalseSupersession => "false_supersession",
            EvidenceKind::ForgedVersion => "forged_version",
            EvidenceKind::Equivocation => "equivocation",
            EvidenceKind::Other(_) => "other",
        }
    }

    /// An [`EvidenceKind::Other`], its name cut to [`OTHER_BYTES_MAX`] bytes.
    pub fn other(name: impl Into<String>) -> EvidenceKind {
        EvidenceKind::Other(truncated(name.into(), OTHER_BYTES_MAX))
    }
}

impl fmt::Display for EvidenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Quoted, so that a peer's name cannot inject separators or control characters into
            // line- and tab-separated logs.
            EvidenceKind::Other(name) => write!(f, "other({name:?})"),
            kind => f.write_str(kind.name()),
        }
    }
}

/// One node's misbehaviour: who, what, in words, and a proof when the node signed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The node to blame.
    pub node: NodeId,
    /// What it did.
    pub kind: EvidenceKind,
    /// What the observer saw, for people; at most [`DETAIL_BYTES_MAX`] bytes.
    #[serde(deserialize_with = "detail")]
    pub detail: String,
    /// A proof anyone can check, when there is one.
    pub proof: Option<Proof>,
}

impl Evidence {
    /// The longest encoding accepted: two proof messages and change.
    pub const BYTES_MAX: usize = 2 * PROOF_MESSAGE_BYTES_MAX + 4 * 1024;

    /// Evidence of `kind` against `node`, without detail or proof.
    pub fn new(node: NodeId, kind: EvidenceKind) -> Evidence {
        let kind = match kind {
            EvidenceKind::Other(name) => EvidenceKind::other(name),
            kind => kind,
        };
        Evidence {
            node,
            kind,
            detail: String::new(),
            proof: None,
        }
    }

    /// With `detail`, cut to [`DETAIL_BYTES_MAX`] bytes: recording evidence never fails.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Evidence {
        self.detail = truncated(detail.into(), DETAIL_BYTES_MAX);
        self
    }

    /// With `proof`.
    pub fn with_proof(mut self, proof: Proof) -> Evidence {
        self.proof = Some(proof);
        self
    }

    /// Whether the evidence carries a proof that verifies and was signed by `key`, the blamed
    /// node's key in the configuration: then the node is faulty whoever reported it.
    pub fn is_proven_against(&self, key: &PublicKey) -> bool {
        self.proof
            .as_ref()
            .is_some_and(|proof| proof.signer() == key && proof.verify())
    }

    /// Decodes evidence a peer sent, bounding every length.
    pub fn decode(bytes: &[u8]) -> Result<Evidence, wire::WireError> {
        wire::decode(bytes, Evidence::BYTES_MAX)
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.node, self.kind)?;
        if self.proof.is_some() {
            f.write_str(" (with proof)")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail.escape_debug())?;
        }
        Ok(())
    }
}

/// One message as its signer signed it: the exact bytes and the signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedMessage {
    /// The signed bytes, at most [`PROOF_MESSAGE_BYTES_MAX`].
    #[serde(deserialize_with = "message_bytes")]
    pub bytes: Bytes,
    /// The signature over them, under the proof's context.
    pub signature: Signature,
}

impl<T> From<&Signed<T>> for SignedMessage {
    fn from(signed: &Signed<T>) -> SignedMessage {
        SignedMessage {
            bytes: signed.bytes().clone(),
            signature: *signed.signature(),
        }
    }
}

/// Proof of misbehaviour that a third party can check without trusting the reporter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Proof {
    /// Two different messages, both validly signed by `signer` under `context`.
    ///
    /// [`Proof::verify`] establishes that the signer signed both. Whether the two conflict (say,
    /// two values for the same version) depends on what the context's messages mean; a checker
    /// that knows the kind uses [`Proof::verify_conflict`].
    Conflicting {
        /// The signing context both were signed under ([`sign::Context`]).
        #[serde(deserialize_with = "context")]
        context: String,
        /// Who signed both.
        signer: PublicKey,
        /// One message.
        first: SignedMessage,
        /// The other.
        second: SignedMessage,
    },
}

impl Proof {
    /// The proof that `first` and `second` were both signed by their signer, or `None` when they
    /// cannot make one: different signers, the same bytes, or too large to carry.
    ///
    /// The two are put in byte order, so the same pair always makes the same proof.
    pub fn conflicting<T: Signable>(first: &Signed<T>, second: &Signed<T>) -> Option<Proof> {
        if first.signer() != second.signer()
            || first.bytes() == second.bytes()
            || first.bytes().len() > PROOF_MESSAGE_BYTES_MAX
            || second.bytes().len() > PROOF_MESSAGE_BYTES_MAX
        {
            return None;
        }
        let (first, second) = if first.bytes() <= second.bytes() {
            (first, second)
        } else {
            (second, first)
        };
        Some(Proof::Conflicting {
            context: T::CONTEXT.name().to_string(),
            signer: *first.signer(),
            first: first.into(),
            second: second.into(),
        })
    }

    /// Who the proof incriminates.
    pub fn signer(&self) -> &PublicKey {
        match self {
            Proof::Conflicting { signer, .. } => signer,
        }
    }

    /// The context the proof's messages were signed under.
    pub fn context(&self) -> &str {
        match self {
            Proof::Conflicting { context, .. } => context,
        }
    }

    /// Whether the proof holds: both signatures verify strictly under the signer and context,
    /// and the two messages differ. Sizes are checked too, for proofs built locally rather than
    /// decoded.
    pub fn verify(&self) -> bool {
        match self {
            Proof::Conflicting {
                context,
                signer,
                first,
                second,
            } => {
                first.bytes != second.bytes
                    && [first, second].iter().all(|message| {
                        message.bytes.len() <= PROOF_MESSAGE_BYTES_MAX
                            && signer
                                .verify_under(context, &message.bytes, &message.signature)
                                .is_ok()
                    })
            }
        }
    }

    /// Whether the proof holds for messages of kind `T` and `conflicts` says the two decoded
    /// messages are ones a correct signer never signs both of. Messages that verify but do not
    /// decode as `T` prove nothing here.
    pub fn verify_conflict<T: Signable>(&self, conflicts: impl FnOnce(&T, &T) -> bool) -> bool {
        match self {
            Proof::Conflicting {
                context,
                first,
                second,
                ..
            } => {
                if context != T::CONTEXT.name() || !self.verify() {
                    return false;
                }
                let max = T::BYTES_MAX.min(PROOF_MESSAGE_BYTES_MAX);
                match (
                    wire::decode::<T>(&first.bytes, max),
                    wire::decode::<T>(&second.bytes, max),
                ) {
                    (Ok(first), Ok(second)) => conflicts(&first, &second),
                    _ => false,
                }
            }
        }
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
fn truncated(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn bounded_string<'de, D: Deserializer<'de>>(
    deserializer: D,
    max: usize,
    what: &str,
) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.len() > max {
        return Err(de::Error::custom(format_args!(
            "{what} of {} bytes exceeds the limit of {max}",
            text.len()
        )));
    }
    Ok(text)
}

fn detail<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    bounded_string(deserializer, DETAIL_BYTES_MAX, "detail")
}

fn other_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    bounded_string(deserializer, OTHER_BYTES_MAX, "evidence kind")
}

fn context<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if !sign::is_valid_context(&text) {
        return Err(de::Error::custom("not a signing context"));
    }
    Ok(text)
}

fn message_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
    let bytes = Bytes::deserialize(deserializer)?;
    if bytes.len() > PROOF_MESSAGE_BYTES_MAX {
        return Err(de::Error::custom(format_args!(
            "signed message of {} bytes exceeds the limit of {PROOF_MESSAGE_BYTES_MAX}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::{Context, SecretKey};

    /// A register version as a replica might sign it: the value at a timestamp.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Vote {
        ts: u64,
        digest: [u8; 32],
    }

    impl Signable for Vote {
        const CONTEXT: Context = Context::new("bulwark.test.vote");
        const BYTES_MAX: usize = 64;
    }

    /// Encodes like `Vote`, under another context.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Ping {
        nonce: u64,
        digest: [u8; 32],
    }

    impl Signable for Ping {
        const CONTEXT: Context = Context::new("bulwark.test.ping");
        const BYTES_MAX: usize = 64;
    }

    fn vote(secret: &SecretKey, ts: u64, value: u8) -> Signed<Vote> {
        Signed::sign(
            secret,
            Vote {
                ts,
                digest: [value; 32],
            },
        )
        .unwrap()
    }

    fn same_ts_different_value(a: &Vote, b: &Vote) -> bool {
        a.ts == b.ts && a.digest != b.digest
    }

    fn equivocation() -> (SecretKey, Proof) {
        let secret = SecretKey::from_seed(&[1; 32]);
        let proof = Proof::conflicting(&vote(&secret, 5, 1), &vote(&secret, 5, 2)).unwrap();
        (secret, proof)
    }

    #[test]
    fn an_equivocation_proof_is_checked_by_a_third_party_from_its_bytes_alone() {
        let (secret, proof) = equivocation();
        let evidence = Evidence::new(NodeId(3), EvidenceKind::Equivocation)
            .with_detail("two votes for ts 5")
            .with_proof(proof);
        let received = Evidence::decode(&wire::encode(&evidence)).unwrap();
        assert_eq!(received, evidence);
        let proof = received.proof.as_ref().unwrap();
        assert!(proof.verify());
        assert!(proof.verify_conflict::<Vote>(same_ts_different_value));
        assert!(received.is_proven_against(&secret.public_key()));
        assert!(!received.is_proven_against(&SecretKey::from_seed(&[2; 32]).public_key()));
        assert_eq!(proof.context(), "bulwark.test.vote");
    }

    #[test]
    fn the_same_pair_makes_the_same_proof_in_either_order() {
        let secret = SecretKey::from_seed(&[1; 32]);
        let (a, b) = (vote(&secret, 5, 1), vote(&secret, 5, 2));
        assert_eq!(Proof::conflicting(&a, &b), Proof::conflicting(&b, &a));
    }

    #[test]
    fn pairs_that_prove_nothing_are_not_made_into_proofs() {
        let secret = SecretKey::from_seed(&[1; 32]);
        let other = SecretKey::from_seed(&[2; 32]);
        let a = vote(&secret, 5, 1);
        assert_eq!(Proof::conflicting(&a, &a.clone()), None);
        assert_eq!(Proof::conflicting(&a, &vote(&other, 5, 2)), None);
    }

    #[test]
    fn forged_proofs_are_rejected() {
        let (secret, proof) = equivocation();
        let Proof::Conflicting {
            context,
            signer,
            first,
            second,
        } = proof;
        let with =
            |context: &str, signer: PublicKey, first: &SignedMessage, second: &SignedMessage| {
                Proof::Conflicting {
                    context: context.to_string(),
                    signer,
                    first: first.clone(),
                    second: second.clone(),
                }
            };
        assert!(with(&context, signer, &first, &second).verify());

        // The same message twice: both signatures verify, but there is no conflict.
        assert!(!with(&context, signer, &first, &first).verify());

        // A bad signature on either message.
        let mut bad = second.clone();
        bad.signature.0[0] ^= 1;
        assert!(!with(&context, signer, &first, &bad).verify());
        assert!(!with(&context, signer, &bad, &second).verify());

        // Messages the accused never signed: a forger signs them with its own key but names
        // the victim.
        let forger = SecretKey::from_seed(&[9; 32]);
        let forged = |bytes: &Bytes| SignedMessage {
            bytes: bytes.clone(),
            signature: forger.sign(Vote::CONTEXT, bytes),
        };
        assert!(
            !with(
                &context,
                signer,
                &forged(&first.bytes),
                &forged(&second.bytes)
            )
            .verify()
        );
        assert!(
            with(
                &context,
                forger.public_key(),
                &forged(&first.bytes),
                &forged(&second.bytes)
            )
            .verify(),
            "signed by the forger, it is proof against the forger"
        );

        // Under another context the signatures do not verify.
        assert!(!with("bulwark.test.ping", signer, &first, &second).verify());
        // A context no signature can be made under.
        assert!(!with("", signer, &first, &second).verify());

        // Too large to have been accepted.
        let mut huge = second.clone();
        huge.bytes = Bytes::from(vec![0; PROOF_MESSAGE_BYTES_MAX + 1]);
        huge.signature = secret.sign(Vote::CONTEXT, &huge.bytes);
        assert!(!with(&context, signer, &first, &huge).verify());
    }

    #[test]
    fn a_conflict_is_judged_by_the_kinds_own_rule() {
        let secret = SecretKey::from_seed(&[1; 32]);
        // Two votes for different timestamps: validly signed and different, but a correct node
        // signs both.
        let proof = Proof::conflicting(&vote(&secret, 5, 1), &vote(&secret, 6, 2)).unwrap();
        assert!(proof.verify());
        assert!(!proof.verify_conflict::<Vote>(same_ts_different_value));
        // A proof about one kind is not checked as another, even when the bytes would decode.
        let (_, proof) = equivocation();
        assert!(!proof.verify_conflict::<Ping>(|_, _| true));
        // Signed bytes that do not decode as the kind prove nothing about it.
        let garbage = |bytes: &'static [u8]| SignedMessage {
            bytes: Bytes::from_static(bytes),
            signature: secret.sign(Vote::CONTEXT, bytes),
        };
        let undecodable = Proof::Conflicting {
            context: Vote::CONTEXT.name().to_string(),
            signer: secret.public_key(),
            first: garbage(&[0xff]),
            second: garbage(&[0xfe]),
        };
        assert!(undecodable.verify());
        assert!(!undecodable.verify_conflict::<Vote>(|_, _| true));
    }

    #[test]
    fn decoding_bounds_every_length() {
        let (_, proof) = equivocation();
        let evidence = Evidence::new(NodeId(1), EvidenceKind::Equivocation).with_proof(proof);

        let mut long = evidence.clone();
        long.detail = "x".repeat(DETAIL_BYTES_MAX + 1);
        assert!(Evidence::decode(&wire::encode(&long)).is_err());
        long.detail.pop();
        assert!(Evidence::decode(&wire::encode(&long)).is_ok());

        let mut kind = evidence.clone();
        kind.kind = EvidenceKind::Other("y".repeat(OTHER_BYTES_MAX + 1));
        assert!(Evidence::decode(&wire::encode(&kind)).is_err());

        let mut bad_context = evidence.clone();
        if let Some(Proof::Conflicting { context, .. }) = &mut bad_context.proof {
            *context = "no spaces allowed".into();
        }
        assert!(Evidence::decode(&wire::encode(&bad_context)).is_err());

        let mut huge = evidence.clone();
        if let Some(Proof::Conflicting { first, .. }) = &mut huge.proof {
            first.bytes = Bytes::from(vec![0; PROOF_MESSAGE_BYTES_MAX + 1]);
        }
        assert!(Evidence::decode(&wire::encode(&huge)).is_err());

        let bytes = wire::encode(&evidence);
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            assert!(Evidence::decode(&bytes[..cut]).is_err());
        }
        assert!(Evidence::decode(&vec![0; Evidence::BYTES_MAX + 1]).is_err());
    }

    #[test]
    fn recording_cuts_long_text_instead_of_failing() {
        let evidence =
            Evidence::new(NodeId(1), EvidenceKind::MalformedReply).with_detail("é".repeat(600));
        assert!(evidence.detail.len() <= DETAIL_BYTES_MAX);
        assert_eq!(evidence.detail.len(), DETAIL_BYTES_MAX);
        let other = Evidence::new(NodeId(1), EvidenceKind::Other("ü".repeat(40)));
        let EvidenceKind::Other(name) = &other.kind else {
            unreachable!()
        };
        assert_eq!(name.len(), OTHER_BYTES_MAX);
        assert_eq!(Evidence::decode(&wire::encode(&other)).unwrap(), other);
    }

    #[test]
    fn kinds_print_for_people_logs_and_metrics() {
        assert_eq!(
            EvidenceKind::CorruptFragment.to_string(),
            "corrupt_fragment"
        );
        assert_eq!(EvidenceKind::Equivocation.name(), "equivocation");
        // powerstore's evidence log writes kinds with Debug; absorbing its enum keeps the lines.
        assert_eq!(
            format!("{:?}", EvidenceKind::FalseSupersession),
            "FalseSupersession"
        );
        let other = EvidenceKind::other("a\tb\nc");
        assert_eq!(other.name(), "other");
        assert_eq!(other.to_string(), r#"other("a\tb\nc")"#);
        let evidence = Evidence::new(NodeId(4), EvidenceKind::ForgedVersion).with_detail("x\ny");
        assert_eq!(evidence.to_string(), r"node4 forged_version: x\ny");
        let (_, proof) = equivocation();
        let proven = Evidence::new(NodeId(4), EvidenceKind::Equivocation).with_proof(proof);
        assert_eq!(proven.to_string(), "node4 equivocation (with proof)");
    }
}
