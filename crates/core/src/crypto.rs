//! Hashes and MACs.
//!
//! PoWerStore names SHA-256 and HMAC-SHA256; we use BLAKE3 and keyed BLAKE3 instead, which give the
//! same properties (collision-resistant hash, PRF-based MAC) at several times the speed on the
//! fragment sizes we hash (crates.md). Every use is domain-separated so that a value hashed or
//! MACed for one purpose can never be replayed as another.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A 32-byte BLAKE3 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The hash of `data` under `domain`.
    pub fn of(domain: &str, data: &[u8]) -> Digest {
        let mut hasher = blake3::Hasher::new_derive_key(domain);
        hasher.update(data);
        Digest(*hasher.finalize().as_bytes())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &hex::encode(self.0)[..12])
    }
}

/// A secret 32-byte MAC key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacKey(pub [u8; 32]);

impl fmt::Debug for MacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacKey(..)")
    }
}

/// A 32-byte MAC tag.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tag(pub [u8; 32]);

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &hex::encode(self.0)[..8])
    }
}

impl MacKey {
    /// The tag of `parts` under this key and `domain`. Each part is length-prefixed, so distinct
    /// part lists never produce the same MAC input.
    pub fn mac(&self, domain: &str, parts: &[&[u8]]) -> Tag {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(&(domain.len() as u64).to_be_bytes());
        hasher.update(domain.as_bytes());
        for part in parts {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Tag(*hasher.finalize().as_bytes())
    }

    /// Checks `tag` in constant time.
    pub fn verify(&self, domain: &str, parts: &[&[u8]], tag: &Tag) -> bool {
        // blake3::Hash's equality is constant-time.
        blake3::Hash::from(self.mac(domain, parts).0) == blake3::Hash::from(tag.0)
    }

    /// Derives an independent key for `purpose`, so one configured secret can feed several MACs.
    pub fn derive(&self, purpose: &str) -> MacKey {
        let mut hasher = blake3::Hasher::new_derive_key(purpose);
        hasher.update(&self.0);
        MacKey(*hasher.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_verifies_only_its_own_input() {
        let key = MacKey([7; 32]);
        let tag = key.mac("d", &[b"ab", b"c"]);
        assert!(key.verify("d", &[b"ab", b"c"], &tag));
        assert!(
            !key.verify("d", &[b"a", b"bc"], &tag),
            "part boundaries are bound"
        );
        assert!(
            !key.verify("e", &[b"ab", b"c"], &tag),
            "domains are separated"
        );
        assert!(!MacKey([8; 32]).verify("d", &[b"ab", b"c"], &tag));
    }

    #[test]
    fn digest_is_domain_separated() {
        assert_ne!(Digest::of("a", b"x"), Digest::of("b", b"x"));
        assert_eq!(Digest::of("a", b"x"), Digest::of("a", b"x"));
    }
}
