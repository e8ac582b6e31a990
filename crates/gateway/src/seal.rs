//! Server-side encryption at the gateway, the trusted side: SSE-C (the customer's key, sent with
//! every request that writes or reads the object) and SSE-S3 (keys from the gateway's
//! configuration). Storage nodes are the untrusted side; what they hold of an encrypted object
//! is ciphertext only.
//!
//! Every chunk (and an inline body) is sealed on its own with AES-256-GCM under a key of its
//! own, derived from the root key (the customer's, or the configured one) and a fresh random
//! 128-bit salt by HKDF-SHA256, with a fresh random 96-bit nonce: `salt ‖ nonce ‖ ciphertext ‖
//! tag`, [`OVERHEAD`] bytes more than the plaintext. No two seals share a key, so no nonce
//! budget is shared between chunks, objects or gateways. A chunk's reference keeps the plaintext length and the BLAKE3 hash of the
//! sealed bytes, so a reader checks what a node returned before opening it, and the nodes never
//! see a hash of the plaintext. The object's checksums (CRC, SHA) are sealed too, and its ETag is
//! the MD5 of the sealed bytes, as S3's ETag of an SSE-C object is not the plaintext's MD5.
//!
//! The record keeps which key sealed the object ([`SealMode`]): for SSE-C a 16-byte check value
//! derived from the customer's key and a random salt of the object's, so that a wrong key is told
//! apart from damaged data (it reveals nothing of a 256-bit key, and two objects under one key
//! cannot be linked by it); for SSE-S3 the configured key's id, so keys can be rotated
//! (new objects take the first configured key, older ones open with theirs). User metadata,
//! sizes, times and content types stay readable by the nodes, as in S3.
//!
//! An SSE-S3 object's ETag stays the MD5 of its bytes, as in S3, since tools compare it with
//! their own; so the nodes can read that MD5. SSE-C objects (ETag not the plaintext's MD5, as in
//! S3) leave the nodes nothing derived from the plaintext.

use crate::layout::Checksums;
use base64::Engine as _;
use bytes::Bytes;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use s3s::{S3Result, s3_error};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Bytes a sealed chunk has beyond its plaintext: the nonce and the GCM tag.
pub const OVERHEAD: usize = SALT_LEN + NONCE_LEN + 16;

/// The random salt in front of every seal, from which its key is derived.
const SALT_LEN: usize = 16;

/// The algorithm S3 names for both kinds of server-side encryption.
pub const AES256: &str = "AES256";

const HKDF_SALT: &[u8] = b"bulwark 2026 s3 server-side encryption";
const INFO_CHUNKS: &[u8] = b"chunk key";
const INFO_CHECK: &[u8] = b"customer key check";
const AAD_CHUNK: &[u8] = b"bulwark s3 sealed chunk";
const AAD_CHECKSUMS: &[u8] = b"bulwark s3 sealed checksums";

/// Which key sealed an object, as its record keeps it: nothing secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SealMode {
    /// SSE-C. The customer's key is never stored; `check` is derived from it.
    Customer {
        /// Random, the object's own.
        salt: [u8; 16],
        /// HKDF of the key and `salt`: tells a wrong key from damaged data.
        check: [u8; 16],
    },
    /// SSE-S3, under the gateway's configured key of this id.
    Gateway {
        /// The key's id in the gateway's configuration.
        key: String,
    },
}

/// What a sealed object's or upload's record adds: how it was sealed, and its checksums sealed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// The key.
    pub mode: SealMode,
    /// The object's [`Checksums`], sealed; empty when it keeps none (and in upload records).
    pub checksums: Bytes,
}

/// A customer's key from the `x-amz-server-side-encryption-customer-*` headers, checked against
/// its MD5.
#[derive(Clone)]
pub struct CustomerKey {
    key: [u8; 32],
    md5: String,
}

impl std::fmt::Debug for CustomerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomerKey(md5 {})", self.md5)
    }
}

impl CustomerKey {
    /// The key a request gives, if it gives one: all three headers, algorithm AES256, a 32-byte
    /// key whose MD5 is the one given. S3's errors otherwise.
    pub fn from_headers(
        algorithm: Option<&str>,
        key: Option<&str>,
        key_md5: Option<&str>,
    ) -> S3Result<Option<CustomerKey>> {
        let (algorithm, key, key_md5) = match (algorithm, key, key_md5) {
            (None, None, None) => return Ok(None),
            (Some(a), Some(k), Some(m)) => (a, k, m),
            (None, _, _) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "Requests specifying Server Side Encryption with Customer provided keys must provide a valid encryption algorithm."
                ));
            }
            (_, None, _) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "Requests specifying Server Side Encryption with Customer provided keys must provide an appropriate secret key."
                ));
            }
            (_, _, None) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "Requests specifying Server Side Encryption with Customer provided keys must provide the client calculated MD5 of the secret key."
                ));
            }
        };
        if algorithm != AES256 {
            return Err(s3_error!(
                InvalidEncryptionAlgorithmError,
                "The encryption request you specified is not valid. The valid value is AES256."
            ));
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let key: [u8; 32] = b64
            .decode(key)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| {
                s3_error!(
                    InvalidArgument,
                    "The secret key was invalid for the specified algorithm."
                )
            })?;
        use md5::Digest as _;
        let md5 = b64.encode(md5::Md5::digest(key));
        if md5 != key_md5 {
            return Err(s3_error!(
                InvalidArgument,
                "The calculated MD5 hash of the key did not match the hash that was provided."
            ));
        }
        Ok(Some(CustomerKey { key, md5 }))
    }

    /// The key's MD5, base64, as responses echo it.
    pub fn md5(&self) -> &str {
        &self.md5
    }

    fn check(&self, salt: &[u8; 16]) -> [u8; 16] {
        let mut out = [0u8; 16];
        let info = [INFO_CHECK, salt.as_slice()];
        prk(&self.key)
            .expand(&info, Len(16))
            .and_then(|okm| okm.fill(&mut out))
            .expect("16 bytes is a valid HKDF-SHA256 output");
        out
    }
}

/// The SSE-S3 keys of the gateway's configuration, by id; the first seals new objects.
#[derive(Clone, Default)]
pub struct GatewayKeys {
    current: Option<String>,
    keys: BTreeMap<String, [u8; 32]>,
}

impl std::fmt::Debug for GatewayKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayKeys")
            .field("current", &self.current)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl GatewayKeys {
    /// Keys in order of preference: the first seals new objects, every one opens its own.
    pub fn new(keys: impl IntoIterator<Item = (String, [u8; 32])>) -> GatewayKeys {
        let mut out = GatewayKeys::default();
        for (id, key) in keys {
            out.current.get_or_insert_with(|| id.clone());
            out.keys.entry(id).or_insert(key);
        }
        out
    }
}

/// What a request that creates an object asks for.
#[derive(Clone, Debug, Default)]
pub enum Asked {
    /// No encryption.
    #[default]
    Nothing,
    /// SSE-C with this key.
    Customer(CustomerKey),
    /// SSE-S3.
    Gateway,
}

/// The key of one object, ready to seal and open its chunks, with the mode its record keeps.
#[derive(Clone)]
pub struct Seal {
    mode: SealMode,
    root: Arc<hkdf::Prk>,
    customer_md5: Option<String>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seal({:?})", self.mode)
    }
}

impl Seal {
    /// The seal a new object gets from what its request asked for.
    pub fn for_write(asked: &Asked, keys: &GatewayKeys) -> S3Result<Option<Seal>> {
        match asked {
            Asked::Nothing => Ok(None),
            Asked::Customer(customer) => {
                let salt: [u8; 16] = rand::random();
                let mode = SealMode::Customer {
                    salt,
                    check: customer.check(&salt),
                };
                Ok(Some(Seal::customer(customer, mode)))
            }
            Asked::Gateway => {
                let id = keys.current.as_ref().ok_or_else(|| {
                    s3_error!(
                        NotImplemented,
                        "SSE-S3 needs a key in the gateway's configuration (sse_s3_keys); none is configured, so nothing was stored"
                    )
                })?;
                Ok(Some(Seal::gateway(id, &keys.keys[id])))
            }
        }
    }

    /// The seal that opens an object (or continues an upload) sealed as `sealed`, with the
    /// customer's key the request gave. S3's errors when the key is missing, not needed or wrong.
    pub fn for_read(
        sealed: Option<&SealMode>,
        customer: Option<&CustomerKey>,
        keys: &GatewayKeys,
    ) -> S3Result<Option<Seal>> {
        match (sealed, customer) {
            (None, None) => Ok(None),
            (None | Some(SealMode::Gateway { .. }), Some(_)) => Err(s3_error!(
                InvalidRequest,
                "The encryption parameters are not applicable to this object."
            )),
            (Some(SealMode::Customer { .. }), None) => Err(s3_error!(
                InvalidRequest,
                "The object was stored using a form of Server Side Encryption. The correct parameters must be provided to retrieve the object."
            )),
            (Some(mode @ SealMode::Customer { salt, check }), Some(customer)) => {
                if !constant_time_eq(check, &customer.check(salt)) {
                    return Err(s3_error!(
                        AccessDenied,
                        "The provided customer key does not match the key the object was stored with."
                    ));
                }
                Ok(Some(Seal::customer(customer, mode.clone())))
            }
            (Some(SealMode::Gateway { key: id }), None) => {
                let key = keys.keys.get(id).ok_or_else(|| {
                    s3_error!(
                        InternalError,
                        "the object is sealed with SSE-S3 key {id:?}, which is not in the gateway's configuration"
                    )
                })?;
                Ok(Some(Seal::gateway(id, key)))
            }
        }
    }

    fn customer(customer: &CustomerKey, mode: SealMode) -> Seal {
        Seal {
            mode,
            root: Arc::new(prk(&customer.key)),
            customer_md5: Some(customer.md5.clone()),
        }
    }

    fn gateway(id: &str, key: &[u8; 32]) -> Seal {
        Seal {
            mode: SealMode::Gateway { key: id.to_owned() },
            root: Arc::new(prk(key)),
            customer_md5: None,
        }
    }

    /// Whether the object's ETag must say nothing of its plaintext: SSE-C's. An SSE-S3 object's
    /// ETag is its MD5, as in S3.
    pub fn hides_md5(&self) -> bool {
        matches!(self.mode, SealMode::Customer { .. })
    }

    /// `checksums` sealed (empty when there are none), for a record.
    pub fn seal_checksums(&self, checksums: &Checksums) -> Bytes {
        if *checksums == Checksums::default() {
            return Bytes::new();
        }
        let plain = postcard::to_stdvec(checksums).expect("checksums encode");
        self.seal_with(&plain, AAD_CHECKSUMS)
    }

    /// Checksums [`Seal::seal_checksums`] made, or none if they do not open: a record a node
    /// damaged fails its own checks first, so this only loses checksums, never data.
    pub fn open_checksums(&self, sealed: &[u8]) -> Checksums {
        if sealed.is_empty() {
            return Checksums::default();
        }
        self.open_with(sealed, AAD_CHECKSUMS)
            .ok()
            .and_then(|plain| postcard::from_bytes(&plain).ok())
            .unwrap_or_default()
    }

    /// How the record names this seal.
    pub fn mode(&self) -> &SealMode {
        &self.mode
    }

    /// The record's [`Sealed`] for an object with `checksums`.
    pub fn record(&self, checksums: &Checksums) -> Sealed {
        Sealed {
            mode: self.mode.clone(),
            checksums: self.seal_checksums(checksums),
        }
    }

    /// The checksums a record sealed (see [`Seal::open_checksums`]).
    pub fn checksums(&self, sealed: &Sealed) -> Checksums {
        self.open_checksums(&sealed.checksums)
    }

    /// `plain` sealed: `salt ‖ nonce ‖ ciphertext ‖ tag`.
    pub fn seal(&self, plain: &[u8]) -> Bytes {
        self.seal_with(plain, AAD_CHUNK)
    }

    /// A sealed chunk opened, or an error if it was not sealed under this key as a chunk.
    pub fn open(&self, stored: &[u8]) -> S3Result<Bytes> {
        self.open_with(stored, AAD_CHUNK)
    }

    /// The key of one seal: HKDF of the root key and the seal's salt.
    fn key(&self, salt: &[u8]) -> LessSafeKey {
        let info = [INFO_CHUNKS, salt];
        let okm = self
            .root
            .expand(&info, &AES_256_GCM)
            .expect("an AES-256 key is a valid HKDF-SHA256 output");
        LessSafeKey::new(UnboundKey::from(okm))
    }

    fn seal_with(&self, plain: &[u8], aad: &'static [u8]) -> Bytes {
        let salt: [u8; SALT_LEN] = rand::random();
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
        out.extend_from_slice(&salt);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .key(&salt)
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[SALT_LEN + NONCE_LEN..],
            )
            .expect("a chunk is far below AES-GCM's length limit");
        out.extend_from_slice(tag.as_ref());
        Bytes::from(out)
    }

    fn open_with(&self, stored: &[u8], aad: &'static [u8]) -> S3Result<Bytes> {
        let damaged = || s3_error!(InternalError, "a sealed chunk did not open: damaged data");
        if stored.len() < OVERHEAD {
            return Err(damaged());
        }
        let (salt, rest) = stored.split_at(SALT_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| damaged())?;
        let mut buffer = sealed.to_vec();
        let len = self
            .key(salt)
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buffer,
            )
            .map_err(|_| damaged())?
            .len();
        buffer.truncate(len);
        Ok(Bytes::from(buffer))
    }

    /// The `x-amz-server-side-encryption` header of responses: AES256 for SSE-S3.
    pub fn server_side(&self) -> Option<s3s::dto::ServerSideEncryption> {
        matches!(self.mode, SealMode::Gateway { .. })
            .then(|| s3s::dto::ServerSideEncryption::from_static(AES256))
    }

    /// The `x-amz-server-side-encryption-customer-algorithm` header of responses.
    pub fn customer_algorithm(&self) -> Option<String> {
        self.customer_md5.as_ref().map(|_| AES256.to_owned())
    }

    /// The `x-amz-server-side-encryption-customer-key-MD5` header of responses.
    pub fn customer_key_md5(&self) -> Option<String> {
        self.customer_md5.clone()
    }
}

impl crate::layout::StoredPart {
    /// The checksums the part was stored with: opened with `seal` for an encrypted upload's
    /// part (none if there is no seal to open them), as they are otherwise.
    pub fn checksums_opened(&self, seal: Option<&Seal>) -> Checksums {
        match seal {
            Some(seal) => seal.open_checksums(&self.sealed_checksums),
            None => self.checksums.clone(),
        }
    }
}

/// Constant-time equality of two check values.
fn constant_time_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn prk(root: &[u8; 32]) -> hkdf::Prk {
    hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn customer(byte: u8) -> CustomerKey {
        let key = [byte; 32];
        use md5::Digest as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        CustomerKey::from_headers(
            Some(AES256),
            Some(&b64.encode(key)),
            Some(&b64.encode(md5::Md5::digest(key))),
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn chunks_round_trip_and_hold_no_plaintext() {
        let seal = Seal::for_write(&Asked::Customer(customer(7)), &GatewayKeys::default())
            .unwrap()
            .unwrap();
        let plain = b"the plaintext of a chunk, long enough to look for".repeat(20);
        let sealed = seal.seal(&plain);
        assert_eq!(sealed.len(), plain.len() + OVERHEAD);
        assert!(!sealed.windows(16).any(|w| w == &plain[..16]));
        assert_eq!(&seal.open(&sealed).unwrap()[..], &plain[..]);
        // Two seals of one plaintext differ (fresh nonces).
        assert_ne!(seal.seal(&plain), sealed);
    }

    #[test]
    fn a_changed_byte_a_wrong_key_or_a_swapped_purpose_does_not_open() {
        let seal = Seal::for_write(&Asked::Customer(customer(7)), &GatewayKeys::default())
            .unwrap()
            .unwrap();
        let sealed = seal.seal(b"data");
        for i in 0..sealed.len() {
            let mut bad = sealed.to_vec();
            bad[i] ^= 1;
            assert!(seal.open(&bad).is_err(), "byte {i}");
        }
        assert!(seal.open(&sealed[..OVERHEAD - 1]).is_err());
        let other = Seal::for_write(&Asked::Customer(customer(8)), &GatewayKeys::default())
            .unwrap()
            .unwrap();
        assert!(other.open(&sealed).is_err());
        // Sealed checksums are not a chunk.
        let checksums = Checksums {
            crc32: Some("AAAAAA==".into()),
            ..Checksums::default()
        };
        let record = seal.record(&checksums);
        assert!(seal.open(&record.checksums).is_err());
        assert_eq!(seal.checksums(&record), checksums);
        assert_eq!(other.checksums(&record), Checksums::default());
    }

    #[test]
    fn reads_need_the_key_the_object_was_sealed_with() {
        let keys = GatewayKeys::default();
        let mode = Seal::for_write(&Asked::Customer(customer(1)), &keys)
            .unwrap()
            .unwrap()
            .mode()
            .clone();
        assert!(Seal::for_read(Some(&mode), Some(&customer(1)), &keys).is_ok());
        let wrong = Seal::for_read(Some(&mode), Some(&customer(2)), &keys).unwrap_err();
        assert_eq!(*wrong.code(), s3s::S3ErrorCode::AccessDenied);
        let missing = Seal::for_read(Some(&mode), None, &keys).unwrap_err();
        assert_eq!(*missing.code(), s3s::S3ErrorCode::InvalidRequest);
        let needless = Seal::for_read(None, Some(&customer(1)), &keys).unwrap_err();
        assert_eq!(*needless.code(), s3s::S3ErrorCode::InvalidRequest);
        assert!(Seal::for_read(None, None, &keys).unwrap().is_none());
    }

    #[test]
    fn gateway_keys_rotate_and_a_missing_one_is_named() {
        let old = GatewayKeys::new([("k1".to_owned(), [1; 32])]);
        let sealed = Seal::for_write(&Asked::Gateway, &old).unwrap().unwrap();
        let chunk = sealed.seal(b"data");
        let rotated = GatewayKeys::new([("k2".to_owned(), [2; 32]), ("k1".to_owned(), [1; 32])]);
        assert_eq!(
            *Seal::for_write(&Asked::Gateway, &rotated)
                .unwrap()
                .unwrap()
                .mode(),
            SealMode::Gateway { key: "k2".into() }
        );
        let opened = Seal::for_read(Some(sealed.mode()), None, &rotated)
            .unwrap()
            .unwrap();
        assert_eq!(&opened.open(&chunk).unwrap()[..], b"data");
        let gone = GatewayKeys::new([("k2".to_owned(), [2; 32])]);
        let e = Seal::for_read(Some(sealed.mode()), None, &gone).unwrap_err();
        assert!(e.message().unwrap().contains("k1"), "{e:?}");
        let none = Seal::for_write(&Asked::Gateway, &GatewayKeys::default()).unwrap_err();
        assert_eq!(*none.code(), s3s::S3ErrorCode::NotImplemented);
    }

    #[test]
    fn customer_headers_are_checked_as_s3_does() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64.encode([3u8; 32]);
        let bad_md5 = b64.encode([0u8; 16]);
        let e = CustomerKey::from_headers(Some(AES256), Some(&key), Some(&bad_md5)).unwrap_err();
        assert!(e.message().unwrap().contains("MD5"), "{e:?}");
        let e = CustomerKey::from_headers(Some("AES128"), Some(&key), Some(&bad_md5)).unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidEncryptionAlgorithmError);
        let short = b64.encode([3u8; 16]);
        let e = CustomerKey::from_headers(Some(AES256), Some(&short), Some(&bad_md5)).unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidArgument);
        assert!(CustomerKey::from_headers(Some(AES256), None, None).is_err());
        assert!(
            CustomerKey::from_headers(None, None, None)
                .unwrap()
                .is_none()
        );
    }
}
