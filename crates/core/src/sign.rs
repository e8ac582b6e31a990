//! Ed25519 signatures, for what a third party must be able to check: configurations, proofs of
//! misbehaviour, causal updates, trusted-log attestations, signed values (DESIGN.md §2). MACs or
//! the authenticated channel cover everything else, at a fraction of the cost.
//!
//! Three rules hold for every signature made here:
//!
//! - **Domain separation.** A signature covers `len(context) || context || bytes`, where the
//!   context names what is signed. A signature on a configuration can therefore never be replayed
//!   as a signature on a register version, even if the two encodings happened to coincide. The
//!   length byte keeps a context that is a prefix of another from colliding with it.
//! - **Strict verification.** Only `verify_strict` is used, and public keys are refused when
//!   they are not canonical point encodings or have small order: for such keys a signature
//!   proves nothing, and batch verification (which skips those checks) would accept forgeries.
//! - **Sign the exact bytes, keep them.** [`Signed<T>`] holds the encoding it was signed or
//!   verified over, so it is never re-encoded to verify or to forward; serde versions or field
//!   order can then never turn a valid signature invalid, or an invalid one valid.
//!
//! Decoding is not verifying: received signed values arrive as [`Unverified<T>`] and become
//! [`Signed<T>`] only through [`Unverified::verify`].
//!
//! ```
//! use bulwark_core::sign::{Context, SecretKey, Signable, Signed, Unverified};
//! #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
//! struct Version(u64);
//! impl Signable for Version {
//!     const CONTEXT: Context = Context::new("doc.version");
//!     const BYTES_MAX: usize = 16;
//! }
//! let secret = SecretKey::from_seed(&[7; 32]);
//! let frame = bulwark_core::wire::encode(&Signed::sign(&secret, Version(3))?);
//! let received: Unverified<Version> = bulwark_core::wire::decode(&frame, 1024)?;
//! let version = received.verify(&secret.public_key())?;
//! assert_eq!(version.value(), &Version(3));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```compile_fail,E0277
//! // A Signed<T> cannot be deserialised: it exists only after a check.
//! use bulwark_core::sign::{Context, Signable, Signed};
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Version(u64);
//! impl Signable for Version {
//!     const CONTEXT: Context = Context::new("doc.version");
//!     const BYTES_MAX: usize = 16;
//! }
//! let _: Result<Signed<Version>, _> = postcard::from_bytes(&[1]);
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use bytes::Bytes;
use ed25519_dalek::Signer as _;
use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::crypto::{MacKey, Tag};
use crate::wire;

/// What a signature is over: a short, printable, static name such as `"bulwark.configuration"`.
///
/// Each kind of signed thing has its own context, so a signature made for one kind never verifies
/// as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context(&'static str);

impl Context {
    /// The longest context name, in bytes.
    pub const BYTES_MAX: usize = 64;

    /// The context `name`.
    ///
    /// # Panics
    ///
    /// If `name` is empty, longer than [`Context::BYTES_MAX`] or not printable ASCII without
    /// spaces. Contexts are constants, so in a `const` this fails the build instead.
    pub const fn new(name: &'static str) -> Context {
        assert!(
            is_valid_context(name),
            "a signing context is 1 to 64 printable ASCII characters without spaces"
        );
        Context(name)
    }

    /// The name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Whether `name` may be a context: contexts also arrive from peers inside proofs, so the rule is
/// checked at run time there and at compile time for constants.
pub(crate) const fn is_valid_context(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > Context::BYTES_MAX {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_graphic() {
            return false;
        }
        i += 1;
    }
    true
}

/// The exact message Ed25519 signs for `bytes` under `context`.
fn message(context: &str, bytes: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + context.len() + bytes.len());
    // is_valid_context bounds the length to 64, so it fits a byte.
    message.push(context.len() as u8);
    message.extend_from_slice(context.as_bytes());
    message.extend_from_slice(bytes);
    message
}

/// A kind of value that is signed as a whole: its context and the largest encoding accepted.
///
/// The context lives on the type, so a value can only be signed and verified under its own kind's
/// context; mixing them up is a type error rather than a failed check at run time.
pub trait Signable: Serialize + DeserializeOwned {
    /// The domain this kind of value is signed under.
    const CONTEXT: Context;
    /// The longest encoding accepted from a peer, checked before the signature and the decoding.
    const BYTES_MAX: usize;
}

/// Why a key, a signature or a signed value was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// Not the canonical encoding of a curve point.
    #[error("not an Ed25519 public key")]
    InvalidKey,
    /// A small-order key, for which signatures prove nothing.
    #[error("a weak (small-order) Ed25519 public key")]
    WeakKey,
    /// The signature does not verify under the key and context.
    #[error("bad signature")]
    BadSignature,
    /// The signed bytes exceed the limit of their kind.
    #[error("signed value of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Offered length.
        len: usize,
        /// [`Signable::BYTES_MAX`].
        max: usize,
    },
    /// The signature is valid but the bytes are not a value of the expected kind: the signer
    /// signed garbage.
    #[error("validly signed but undecodable: {0}")]
    Undecodable(wire::WireError),
}

/// An Ed25519 secret key.
///
/// Built from a 32-byte seed (RFC 8032's secret key) that the caller drew, so that nothing in
/// here needs a random number generator. It zeroises on drop and never prints its secret. A
/// node's key is cloned into each machine that signs for it (a CS replica signs votes in PBFT
/// and shares in its application); every copy zeroises on drop alike.
#[derive(Clone)]
pub struct SecretKey(ed25519_dalek::SigningKey);

impl SecretKey {
    /// The key whose RFC 8032 seed is `seed`.
    pub fn from_seed(seed: &[u8; 32]) -> SecretKey {
        SecretKey(ed25519_dalek::SigningKey::from_bytes(seed))
    }

    /// The public half.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `bytes` under `context`. For values, prefer [`Signed::sign`], which also keeps the
    /// bytes; this is for formats built by hand.
    pub fn sign(&self, context: Context, bytes: &[u8]) -> Signature {
        Signature(self.0.sign(&message(context.name(), bytes)).to_bytes())
    }

    /// The MAC key this party shares with `peer` and no one else: static Diffie-Hellman on
    /// the keys' Montgomery forms (X25519), hashed with both public keys. `peer` computes the
    /// same key from its secret and this party's public key, so no pairwise key is ever
    /// distributed. Reusing an Ed25519 key for X25519 agreement is sound when, as here, the
    /// agreement output only feeds a KDF (Thormarker, "On using the same key pair for Ed25519
    /// and an X25519 based KEM", 2021).
    pub fn pair_key(&self, peer: &PublicKey) -> MacKey {
        let shared = peer.0.to_montgomery().mul_clamped(self.0.to_scalar_bytes());
        // Large-order keys only (`PublicKey` checks it), so `shared` is never the identity.
        let mine = self.public_key();
        let (low, high) = if mine.as_bytes() <= peer.as_bytes() {
            (mine, *peer)
        } else {
            (*peer, mine)
        };
        let mut hasher = blake3::Hasher::new_derive_key("bulwark/pair-key/v1");
        hasher.update(shared.as_bytes());
        hasher.update(low.as_bytes());
        hasher.update(high.as_bytes());
        MacKey(*hasher.finalize().as_bytes())
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(public {:?})", self.public_key())
    }
}

/// An Ed25519 public key that is a canonical encoding of a point of large order.
///
/// Every way to make one (from bytes, from hex, by deserialising) checks both, so holding a
/// `PublicKey` means signatures under it mean something. Serialised as its 32 bytes (hex in
/// human-readable formats such as TOML).
#[derive(Clone, Copy)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl PublicKey {
    /// Checks and wraps a 32-byte encoding.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey, SignError> {
        let key =
            ed25519_dalek::VerifyingKey::from_bytes(bytes).map_err(|_| SignError::InvalidKey)?;
        // Decompression accepts some encodings with y >= p; a second spelling of a key would
        // defeat duplicate-key checks on a membership list, so only the canonical one is taken.
        if key.to_edwards().compress().to_bytes() != *bytes {
            return Err(SignError::InvalidKey);
        }
        if key.is_weak() {
            return Err(SignError::WeakKey);
        }
        Ok(PublicKey(key))
    }

    /// The 32-byte encoding.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The 32-byte encoding, borrowed.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// Checks `signature` over `bytes` under `context`, strictly.
    pub fn verify(
        &self,
        context: Context,
        bytes: &[u8],
        signature: &Signature,
    ) -> Result<(), SignError> {
        self.verify_under(context.name(), bytes, signature)
    }

    /// [`PublicKey::verify`] for a context that arrived from a peer (inside a proof).
    pub(crate) fn verify_under(
        &self,
        context: &str,
        bytes: &[u8],
        signature: &Signature,
    ) -> Result<(), SignError> {
        if !is_valid_context(context) {
            return Err(SignError::BadSignature);
        }
        self.0
            .verify_strict(
                &message(context, bytes),
                &ed25519_dalek::Signature::from_bytes(&signature.0),
            )
            .map_err(|_| SignError::BadSignature)
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for PublicKey {}

impl std::hash::Hash for PublicKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for PublicKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PublicKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", &hex::encode(self.as_bytes())[..12])
    }
}

impl FromStr for PublicKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = crate::config::parse_hex32(s)?;
        PublicKey::from_bytes(&bytes).map_err(|e| e.to_string())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fixed::serialize(self.as_bytes(), serializer)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes: [u8; 32] = fixed::deserialize(deserializer)?;
        PublicKey::from_bytes(&bytes).map_err(de::Error::custom)
    }
}

/// A 64-byte Ed25519 signature. Any 64 bytes decode; only verification says whether they mean
/// anything.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature(pub [u8; 64]);

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({})", &hex::encode(self.0)[..12])
    }
}

impl Serialize for Signature {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fixed::serialize(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for Signature {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        fixed::deserialize(deserializer).map(Signature)
    }
}

/// A value of kind `T` with the exact bytes its signer signed, the signature and the signer's
/// key: only made by signing or by verifying, so holding one means the signature is good.
///
/// Serialises as its [`Unverified<T>`] form (bytes and signature); it has no `Deserialize`,
/// because decoding is not checking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed<T> {
    bytes: Bytes,
    signature: Signature,
    signer: PublicKey,
    value: T,
}

impl<T: Signable> Signed<T> {
    /// Encodes `value` once and signs those bytes. Refuses a value whose encoding receivers would
    /// refuse as too large.
    pub fn sign(secret: &SecretKey, value: T) -> Result<Signed<T>, SignError> {
        let bytes = wire::encode(&value);
        if bytes.len() > T::BYTES_MAX {
            return Err(SignError::TooLarge {
                len: bytes.len(),
                max: T::BYTES_MAX,
            });
        }
        let signature = secret.sign(T::CONTEXT, &bytes);
        Ok(Signed {
            bytes: Bytes::from(bytes),
            signature,
            signer: secret.public_key(),
            value,
        })
    }
}

impl<T> Signed<T> {
    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, dropping the proof.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The exact bytes the signature covers (without the context).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Who signed.
    pub fn signer(&self) -> &PublicKey {
        &self.signer
    }

    /// The bytes, the signature and the value, dropping the signer's key: for a holder that
    /// keeps many values of one signer and knows it elsewhere. What it keeps is no longer a
    /// proof by itself; checking the parts again under the key makes one.
    pub fn into_parts(self) -> (Bytes, Signature, T) {
        (self.bytes, self.signature, self.value)
    }

    /// The form to send on: the same bytes and signature, for the receiver to verify.
    pub fn to_unverified(&self) -> Unverified<T> {
        Unverified::new(self.bytes.clone(), self.signature)
    }
}

impl<T> Serialize for Signed<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            bytes: &self.bytes,
            signature: &self.signature,
        }
        .serialize(serializer)
    }
}

/// A signed value as received: bytes and a signature, not yet checked and not yet decoded.
///
/// Deserialising one checks only its size; [`Unverified::verify`] checks the signature and then
/// decodes.
pub struct Unverified<T> {
    bytes: Bytes,
    signature: Signature,
    kind: PhantomData<fn() -> T>,
}

impl<T> Unverified<T> {
    /// Wraps received bytes and signature.
    pub fn new(bytes: Bytes, signature: Signature) -> Unverified<T> {
        Unverified {
            bytes,
            signature,
            kind: PhantomData,
        }
    }

    /// The bytes as received.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The signature as received.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }
}

impl<T: Signable> Unverified<T> {
    /// Decodes the bytes without checking the signature: for ordering candidates of which the
    /// caller then verifies the one it trusts before acting on it. Size-bounded like `verify`.
    pub fn peek(&self) -> Result<T, wire::WireError> {
        wire::decode(&self.bytes, T::BYTES_MAX)
    }

    /// Checks the size, then the signature under `signer` and `T`'s context, then decodes.
    ///
    /// The signature is checked before the bytes are decoded, so bytes that verify but do not
    /// decode are the signer's own doing ([`SignError::Undecodable`]), not the network's.
    pub fn verify(self, signer: &PublicKey) -> Result<Signed<T>, SignError> {
        if self.bytes.len() > T::BYTES_MAX {
            return Err(SignError::TooLarge {
                len: self.bytes.len(),
                max: T::BYTES_MAX,
            });
        }
        signer.verify(T::CONTEXT, &self.bytes, &self.signature)?;
        let value = wire::decode(&self.bytes, T::BYTES_MAX).map_err(SignError::Undecodable)?;
        Ok(Signed {
            bytes: self.bytes,
            signature: self.signature,
            signer: *signer,
            value,
        })
    }

    /// `value` authenticated by a MAC under `key` instead of a signature: for a statement meant
    /// for one party that shares `key`, which only it can check (and which proves nothing to a
    /// third). The tag travels in the signature's place, marked by an `S` half that no
    /// signature can have ([`Unverified::is_mac`]).
    pub fn mac(key: &MacKey, value: &T) -> Result<Unverified<T>, SignError> {
        let bytes = wire::encode(value);
        if bytes.len() > T::BYTES_MAX {
            return Err(SignError::TooLarge {
                len: bytes.len(),
                max: T::BYTES_MAX,
            });
        }
        let tag = key.mac(T::CONTEXT.name(), &[&bytes]);
        let mut signature = [MAC_MARK; 64];
        signature[..32].copy_from_slice(&tag.0);
        Ok(Unverified::new(bytes.into(), Signature(signature)))
    }

    /// Whether this carries a MAC tag rather than a signature.
    pub fn is_mac(&self) -> bool {
        self.signature.0[32..].iter().all(|byte| *byte == MAC_MARK)
    }

    /// Checks the size, then the MAC tag under `key` and `T`'s context, then decodes.
    pub fn verify_mac(&self, key: &MacKey) -> Result<T, SignError> {
        if self.bytes.len() > T::BYTES_MAX {
            return Err(SignError::TooLarge {
                len: self.bytes.len(),
                max: T::BYTES_MAX,
            });
        }
        let mut tag = [0; 32];
        tag.copy_from_slice(&self.signature.0[..32]);
        if !self.is_mac() || !key.verify(T::CONTEXT.name(), &[&self.bytes], &Tag(tag)) {
            return Err(SignError::BadSignature);
        }
        wire::decode(&self.bytes, T::BYTES_MAX).map_err(SignError::Undecodable)
    }
}

/// The byte filling the second half of a MAC-carrying [`Unverified`]: as an Ed25519 `S`,
/// `0xff..ff` exceeds the group order, so no valid signature is ever taken for a tag.
const MAC_MARK: u8 = 0xff;

impl<T> Clone for Unverified<T> {
    fn clone(&self) -> Self {
        Unverified::new(self.bytes.clone(), self.signature)
    }
}

impl<T> PartialEq for Unverified<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes && self.signature == other.signature
    }
}

impl<T> Eq for Unverified<T> {}

impl<T> fmt::Debug for Unverified<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unverified")
            .field("kind", &std::any::type_name::<T>())
            .field("bytes", &self.bytes.len())
            .field("signature", &self.signature)
            .finish()
    }
}

impl<T> Serialize for Unverified<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            bytes: &self.bytes,
            signature: &self.signature,
        }
        .serialize(serializer)
    }
}

impl<'de, T: Signable> Deserialize<'de> for Unverified<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireOwned::deserialize(deserializer)?;
        // Refused here already, so an oversized value is not even kept until verification.
        if wire.bytes.len() > T::BYTES_MAX {
            return Err(de::Error::custom(format_args!(
                "signed value of {} bytes exceeds the limit of {}",
                wire.bytes.len(),
                T::BYTES_MAX
            )));
        }
        Ok(Unverified::new(wire.bytes, wire.signature))
    }
}

/// The wire form of [`Signed`] and [`Unverified`], written from borrowed fields.
#[derive(Serialize)]
#[serde(rename = "Signed")]
struct WireRef<'a> {
    bytes: &'a Bytes,
    signature: &'a Signature,
}

/// The wire form of [`Signed`] and [`Unverified`], read.
#[derive(Deserialize)]
#[serde(rename = "Signed")]
struct WireOwned {
    bytes: Bytes,
    signature: Signature,
}

/// Serde for fixed-size byte arrays: raw in binary formats (postcard writes no length), hex in
/// human-readable ones.
mod fixed {
    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::fmt;

    pub fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return serializer.serialize_str(&hex::encode(bytes));
        }
        let mut tuple = serializer.serialize_tuple(N)?;
        for byte in bytes {
            tuple.serialize_element(byte)?;
        }
        tuple.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        deserializer: D,
    ) -> Result<[u8; N], D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            let bytes = hex::decode(text.trim()).map_err(de::Error::custom)?;
            return bytes.try_into().map_err(|b: Vec<u8>| {
                de::Error::custom(format_args!("expected {N} bytes, got {}", b.len()))
            });
        }
        deserializer.deserialize_tuple(N, ArrayVisitor::<N>)
    }

    struct ArrayVisitor<const N: usize>;

    impl<'de, const N: usize> Visitor<'de> for ArrayVisitor<N> {
        type Value = [u8; N];

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            write!(formatter, "{N} bytes")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; N], A::Error> {
            let mut bytes = [0u8; N];
            for (i, byte) in bytes.iter_mut().enumerate() {
                *byte = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(i, &self))?;
            }
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Version {
        num: u64,
        digest: [u8; 32],
    }

    impl Signable for Version {
        const CONTEXT: Context = Context::new("bulwark.test.version");
        const BYTES_MAX: usize = 64;
    }

    /// Encodes exactly like `Version`, signed under another context.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Configuration {
        epoch: u64,
        digest: [u8; 32],
    }

    impl Signable for Configuration {
        const CONTEXT: Context = Context::new("bulwark.test.configuration");
        const BYTES_MAX: usize = 64;
    }

    /// A kind that allows more bytes than `Version` does, to carry oversized payloads.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Blob(Vec<u8>);

    impl Signable for Blob {
        const CONTEXT: Context = Context::new("bulwark.test.version");
        const BYTES_MAX: usize = 1024;
    }

    fn secret(i: u8) -> SecretKey {
        SecretKey::from_seed(&[i; 32])
    }

    fn version(num: u64) -> Version {
        Version {
            num,
            digest: [num as u8; 32],
        }
    }

    /// The Ed25519 group order ℓ, little-endian.
    const L: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];

    #[test]
    fn signed_round_trips_over_the_wire_and_keeps_its_bytes() {
        let secret = secret(1);
        let signed = Signed::sign(&secret, version(7)).unwrap();
        assert_eq!(
            signed.bytes().as_ref(),
            wire::encode(&version(7)).as_slice()
        );
        assert_eq!(signed.signer(), &secret.public_key());

        let frame = wire::encode(&signed);
        // Signed and Unverified share one wire form.
        assert_eq!(frame, wire::encode(&signed.to_unverified()));
        let received: Unverified<Version> = wire::decode(&frame, 1024).unwrap();
        let verified = received.verify(&secret.public_key()).unwrap();
        assert_eq!(verified, signed);
        assert_eq!(verified.value(), &version(7));
        assert_eq!(verified.into_value(), version(7));
    }

    #[test]
    fn verification_uses_the_received_bytes_not_a_re_encoding() {
        // postcard reads a varint with a redundant continuation byte as the same number, so these
        // bytes decode to a value whose re-encoding differs. What was signed is what counts.
        let mut bytes = vec![0x87, 0x80, 0x00];
        bytes.extend_from_slice(&[7; 32]);
        let secret = secret(1);
        let signature = secret.sign(Version::CONTEXT, &bytes);
        match wire::decode::<Version>(&bytes, 64) {
            Ok(value) => {
                assert_ne!(wire::encode(&value), bytes);
                let signed = Unverified::<Version>::new(Bytes::from(bytes.clone()), signature)
                    .verify(&secret.public_key())
                    .unwrap();
                assert_eq!(signed.bytes().as_ref(), bytes.as_slice());
            }
            // A stricter codec refuses the redundant form: then it is the signer's garbage.
            Err(_) => assert!(matches!(
                Unverified::<Version>::new(Bytes::from(bytes), signature)
                    .verify(&secret.public_key()),
                Err(SignError::Undecodable(_))
            )),
        }
    }

    #[test]
    fn a_tampered_byte_or_signature_fails() {
        let secret = secret(1);
        let signed = Signed::sign(&secret, version(7)).unwrap();
        for i in 0..signed.bytes().len() {
            let mut bytes = signed.bytes().to_vec();
            bytes[i] ^= 1;
            let tampered = Unverified::<Version>::new(Bytes::from(bytes), *signed.signature());
            assert!(matches!(
                tampered.verify(&secret.public_key()),
                Err(SignError::BadSignature)
            ));
        }
        for i in [0, 31, 32, 63] {
            let mut signature = *signed.signature();
            signature.0[i] ^= 0x40;
            let tampered = Unverified::<Version>::new(signed.bytes().clone(), signature);
            assert!(tampered.verify(&secret.public_key()).is_err());
        }
        assert!(matches!(
            signed.to_unverified().verify(&self::secret(2).public_key()),
            Err(SignError::BadSignature)
        ));
    }

    #[test]
    fn a_signature_under_one_context_does_not_pass_under_another() {
        let secret = secret(1);
        let signed = Signed::sign(&secret, version(7)).unwrap();
        // Same bytes, offered as a configuration: they decode as one, but were not signed as one.
        let as_configuration =
            Unverified::<Configuration>::new(signed.bytes().clone(), *signed.signature());
        assert!(wire::decode::<Configuration>(signed.bytes(), 64).is_ok());
        assert!(matches!(
            as_configuration.verify(&secret.public_key()),
            Err(SignError::BadSignature)
        ));
        // The raw API separates the same way, and a context that is a prefix of another (plus
        // bytes that complete it) does not collide.
        const SHORT: Context = Context::new("a.b");
        const LONG: Context = Context::new("a.bc");
        let signature = secret.sign(SHORT, b"cx");
        assert!(secret.public_key().verify(SHORT, b"cx", &signature).is_ok());
        assert!(secret.public_key().verify(LONG, b"x", &signature).is_err());
    }

    #[test]
    fn weak_and_invalid_keys_are_refused() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(matches!(
            PublicKey::from_bytes(&identity),
            Err(SignError::WeakKey)
        ));
        // The point of order 2, (0, -1).
        let mut minus_one = [0xff; 32];
        minus_one[0] = 0xec;
        minus_one[31] = 0x7f;
        assert!(matches!(
            PublicKey::from_bytes(&minus_one),
            Err(SignError::WeakKey)
        ));
        // y = 2 has no x on the curve.
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2;
        assert!(matches!(
            PublicKey::from_bytes(&not_a_point),
            Err(SignError::InvalidKey)
        ));
        // The identity spelled with y = p + 1: a non-canonical encoding.
        let mut non_canonical = [0xff; 32];
        non_canonical[0] = 0xee;
        non_canonical[31] = 0x7f;
        assert!(PublicKey::from_bytes(&non_canonical).is_err());

        // Decoding a key checks it too.
        let encoded = wire::encode(&secret(1).public_key());
        assert_eq!(encoded.len(), 32, "a key is its 32 bytes on the wire");
        assert_eq!(
            wire::decode::<PublicKey>(&encoded, 32).unwrap(),
            secret(1).public_key()
        );
        assert!(wire::decode::<PublicKey>(&identity, 32).is_err());
    }

    #[test]
    fn non_canonical_encodings_of_valid_keys_are_refused() {
        // y in [p, 2^255) spells y - p; for every such y that decompresses, the key is refused
        // whether or not the point would be weak.
        for low in 0u8..19 {
            let mut bytes = [0xff; 32];
            bytes[0] = 0xed + low;
            for sign in [0u8, 0x80] {
                bytes[31] = 0x7f | sign;
                assert!(
                    PublicKey::from_bytes(&bytes).is_err(),
                    "y = p + {low}, sign {sign}"
                );
            }
        }
        // y = p + 3 is a valid point of large order that ed25519-dalek decompresses: only the
        // canonical-encoding check stands between it and a second spelling of the key y = 3.
        let mut bytes = [0xff; 32];
        bytes[0] = 0xf0;
        bytes[31] = 0x7f;
        let lax = ed25519_dalek::VerifyingKey::from_bytes(&bytes).unwrap();
        assert!(!lax.is_weak());
        assert!(matches!(
            PublicKey::from_bytes(&bytes),
            Err(SignError::InvalidKey)
        ));
        let canonical = PublicKey::from_bytes(&lax.to_edwards().compress().to_bytes()).unwrap();
        assert_eq!(canonical.as_bytes()[0], 3);
    }

    #[test]
    fn a_non_canonical_s_is_refused() {
        let secret = secret(1);
        let bytes = wire::encode(&version(7));
        let signature = secret.sign(Version::CONTEXT, &bytes);
        assert!(
            secret
                .public_key()
                .verify(Version::CONTEXT, &bytes, &signature)
                .is_ok()
        );
        // S + ℓ is the same scalar mod ℓ, so lax verifiers accept it; s < ℓ < 2^253, so the sum
        // still fits 32 bytes.
        let mut malleated = signature;
        let mut carry = 0u16;
        for (s, l) in malleated.0[32..].iter_mut().zip(L) {
            let sum = u16::from(*s) + u16::from(l) + carry;
            *s = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(carry, 0);
        assert_ne!(malleated, signature);
        assert!(matches!(
            secret
                .public_key()
                .verify(Version::CONTEXT, &bytes, &malleated),
            Err(SignError::BadSignature)
        ));
    }

    #[test]
    fn sizes_are_bounded_before_anything_else() {
        let secret = secret(1);
        let big = Signed::sign(&secret, Blob(vec![0; 100])).unwrap();
        // Valid signature, same context, but more bytes than Version accepts.
        let offered = Unverified::<Version>::new(big.bytes().clone(), *big.signature());
        assert!(matches!(
            offered.clone().verify(&secret.public_key()),
            Err(SignError::TooLarge { len: 101, max: 64 })
        ));
        assert!(wire::decode::<Unverified<Version>>(&wire::encode(&offered), 1024).is_err());
        // The signer is refused too, so it never sends what receivers would drop.
        #[derive(Debug, Serialize, Deserialize)]
        struct Tiny(Vec<u8>);
        impl Signable for Tiny {
            const CONTEXT: Context = Context::new("bulwark.test.tiny");
            const BYTES_MAX: usize = 4;
        }
        assert!(matches!(
            Signed::sign(&secret, Tiny(vec![0; 4])),
            Err(SignError::TooLarge { len: 5, max: 4 })
        ));
    }

    #[test]
    fn validly_signed_garbage_is_the_signers_fault() {
        let secret = secret(1);
        let garbage = Bytes::from_static(&[0xff, 0xff]);
        let signature = secret.sign(Version::CONTEXT, &garbage);
        assert!(matches!(
            Unverified::<Version>::new(garbage, signature).verify(&secret.public_key()),
            Err(SignError::Undecodable(_))
        ));
    }

    #[test]
    fn deserialising_is_not_verifying() {
        let secret = secret(1);
        let signed = Signed::sign(&secret, version(7)).unwrap();
        let mut forged = signed.to_unverified();
        forged.signature.0[5] ^= 1;
        let decoded: Unverified<Version> = wire::decode(&wire::encode(&forged), 1024).unwrap();
        assert_eq!(decoded, forged);
        assert!(decoded.verify(&secret.public_key()).is_err());
    }

    #[test]
    fn keys_and_signatures_read_as_hex_in_text_formats() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Entry {
            key: PublicKey,
            signature: Signature,
        }
        let secret = secret(3);
        let entry = Entry {
            key: secret.public_key(),
            signature: secret.sign(Version::CONTEXT, b"x"),
        };
        let text = toml::to_string(&entry).unwrap();
        assert!(text.contains(&secret.public_key().to_string()), "{text}");
        assert_eq!(toml::from_str::<Entry>(&text).unwrap(), entry);
        assert_eq!(
            secret
                .public_key()
                .to_string()
                .parse::<PublicKey>()
                .unwrap(),
            secret.public_key()
        );
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(hex::encode(identity).parse::<PublicKey>().is_err());
        let weak = toml::to_string(&Entry {
            key: secret.public_key(),
            signature: entry.signature,
        })
        .unwrap()
        .replace(&secret.public_key().to_string(), &hex::encode(identity));
        assert!(toml::from_str::<Entry>(&weak).is_err());
        assert_eq!(wire::encode(&entry.signature).len(), 64);
    }

    #[test]
    fn the_secret_never_prints() {
        let secret = secret(9);
        let printed = format!("{secret:?}");
        assert!(!printed.contains(&hex::encode([9u8; 32])), "{printed}");
        assert!(printed.contains("PublicKey"));
    }

    #[test]
    fn contexts_are_checked() {
        assert!(is_valid_context("bulwark.configuration"));
        assert!(!is_valid_context(""));
        assert!(!is_valid_context("has space"));
        assert!(!is_valid_context("tab\t"));
        assert!(!is_valid_context("é"));
        assert!(is_valid_context(&"x".repeat(64)));
        assert!(!is_valid_context(&"x".repeat(65)));
        let secret = secret(1);
        let signature = secret.sign(Version::CONTEXT, b"x");
        assert!(
            secret
                .public_key()
                .verify_under("", b"x", &signature)
                .is_err()
        );
    }

    #[test]
    fn a_pair_key_is_shared_by_exactly_its_two_parties() {
        let (a, b, c) = (secret(1), secret(2), secret(3));
        let ab = a.pair_key(&b.public_key());
        assert_eq!(ab, b.pair_key(&a.public_key()));
        assert_ne!(ab, a.pair_key(&c.public_key()));
        assert_ne!(ab, c.pair_key(&b.public_key()));
        assert_ne!(ab, c.pair_key(&a.public_key()));
    }

    #[test]
    fn a_mac_statement_opens_only_under_its_key_and_kind() {
        let key = secret(1).pair_key(&secret(2).public_key());
        let other = secret(1).pair_key(&secret(3).public_key());
        let tagged = Unverified::<Version>::mac(&key, &version(7)).unwrap();
        assert!(tagged.is_mac());
        assert_eq!(tagged.verify_mac(&key).unwrap(), version(7));
        assert!(tagged.verify_mac(&other).is_err());
        // Same bytes, another kind: the context is in the MAC input.
        let moved = Unverified::<Configuration>::new(tagged.bytes().clone(), *tagged.signature());
        assert!(moved.verify_mac(&key).is_err());
        // A changed byte fails; a tag never verifies as a signature, nor a signature as a tag.
        let mut bytes = tagged.bytes().to_vec();
        bytes[0] ^= 1;
        assert!(
            Unverified::<Version>::new(bytes.into(), *tagged.signature())
                .verify_mac(&key)
                .is_err()
        );
        assert!(tagged.clone().verify(&secret(1).public_key()).is_err());
        let signed = Signed::sign(&secret(1), version(7))
            .unwrap()
            .to_unverified();
        assert!(!signed.is_mac());
        assert!(signed.verify_mac(&key).is_err());
        assert!(Unverified::<Blob>::mac(&key, &Blob(vec![0; 2000])).is_err());
    }
}
