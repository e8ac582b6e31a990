//! Rosebud's public-key objects (§4.4): mutable objects named by their owner's key. The id is
//! the hash of the owner's Ed25519 public key; every version carries the key, a version number
//! `(counter, writer, seq)` that no two writers share, and the owner's signature over
//! `(id, version, H(content))`. Only a holder of the private key can write; the protocol is the
//! two-round register (the paper's Figure 2: a read phase, then WRITE; reads write back unless
//! the whole quorum agreed), on `3f+1` replicas with `n - f` quorums.
//!
//! The paper's corrections as the spec lists them (§7.1): replicas verify before they
//! acknowledge and acknowledge a valid version even when they hold a newer one, but never lower
//! what they hold (the register core); read phases count only owner-signed versions, so a faulty
//! replica cannot inflate the version space ([`Policy::clock_ts`]); the signature binds the id,
//! so a version cannot be replayed under another object. It does not bind the replica group: an
//! object keeps its versions when reconfiguration moves it to another group.
//!
//! A delete is a signed tombstone (the paper's "null" value).

use super::{Clocked, Judged, Policy};
use bulwark_core::sign::{Context, PublicKey, SecretKey, Signature};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, OBJECT_BYTES_MAX, Slot};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use super::{OpId, ProtocolError, ReadOutcome, Refusal, ServerStats, Timestamp, WriteOutcome};

const DOMAIN_ID: &str = "bulwark/pubkey/id/v1";
const DOMAIN_VALUE: &str = "bulwark/pubkey/value/v1";
/// What an owner signs: a version of one object (`signed_bytes`), never anything else.
const SIGNED_VERSION: Context = Context::new("bulwark/pubkey/version/v1");

/// The public-key object policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PubKey;

/// The id of the object `owner` owns: `H(owner)`, as a register key.
pub fn object_id(owner: &PublicKey) -> Key {
    let digest = Digest::of(DOMAIN_ID, owner.as_bytes());
    Key::new(Bytes::copy_from_slice(&digest.0))
        .unwrap_or_else(|_| unreachable!("32 bytes make a valid key"))
}

fn value_digest(value: Option<&[u8]>) -> Digest {
    match value {
        Some(value) => Digest::of(DOMAIN_VALUE, value),
        None => Digest::of(DOMAIN_VALUE, b"tombstone"),
    }
}

/// The exact bytes an owner signs: the object's id, the version, whether it is a delete, and the
/// content's hash.
fn signed_bytes(id: &Key, ts: &Timestamp, tombstone: bool, digest: &Digest) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(2 + id.as_bytes().len() + 20 + 33);
    bytes.extend_from_slice(&(id.as_bytes().len() as u16).to_be_bytes());
    bytes.extend_from_slice(id.as_bytes());
    bytes.extend_from_slice(&ts.num.to_be_bytes());
    bytes.extend_from_slice(&ts.writer.0.to_be_bytes());
    bytes.extend_from_slice(&ts.seq.to_be_bytes());
    bytes.push(u8::from(!tombstone));
    bytes.extend_from_slice(&digest.0);
    bytes
}

/// A version's signed header: the owner's key, the version, the content's hash and the
/// signature. It is what a read phase returns to a writer (no content needed to check it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The owner's public key.
    pub owner: [u8; 32],
    /// The version.
    pub ts: Timestamp,
    /// Whether the version is a delete.
    pub tombstone: bool,
    /// `H(content)`.
    pub value_digest: Digest,
    /// The owner's signature over the version.
    pub signature: Bytes,
}

impl Header {
    /// Whether this header is a version of object `id` signed by its owner.
    pub fn verify(&self, id: &Key) -> bool {
        let Ok(owner) = PublicKey::from_bytes(&self.owner) else {
            return false;
        };
        let Ok(signature) = <[u8; 64]>::try_from(self.signature.as_ref()) else {
            return false;
        };
        self.ts.num >= 1
            && object_id(&owner) == *id
            && owner
                .verify(
                    SIGNED_VERSION,
                    &signed_bytes(id, &self.ts, self.tombstone, &self.value_digest),
                    &Signature(signature),
                )
                .is_ok()
    }
}

/// A version: the owner's key, the version number, the content (`None`: deleted) and the owner's
/// signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The owner's public key.
    pub owner: [u8; 32],
    /// The version.
    pub ts: Timestamp,
    /// The content; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Ed25519 by `owner` over `(id, ts, H(content))`: 64 bytes.
    pub signature: Bytes,
}

impl Entry {
    /// Signs a new version of the object `owner` owns.
    pub fn sign(ts: Timestamp, value: Option<Bytes>, owner: &SecretKey) -> Entry {
        let public = owner.public_key();
        let id = object_id(&public);
        let digest = value_digest(value.as_deref());
        let bytes = signed_bytes(&id, &ts, value.is_none(), &digest);
        let signature = owner.sign(SIGNED_VERSION, &bytes);
        Entry {
            owner: public.to_bytes(),
            ts,
            value,
            signature: Bytes::copy_from_slice(&signature.0),
        }
    }

    /// The header: what a read phase returns.
    pub fn header(&self) -> Header {
        Header {
            owner: self.owner,
            ts: self.ts,
            tombstone: self.value.is_none(),
            value_digest: value_digest(self.value.as_deref()),
            signature: self.signature.clone(),
        }
    }

    /// Whether this is a version of object `id` signed by its owner, within the size limit.
    pub fn verify(&self, id: &Key) -> bool {
        self.value
            .as_ref()
            .is_none_or(|v| v.len() <= OBJECT_BYTES_MAX)
            && self.header().verify(id)
    }
}

impl Policy for PubKey {
    const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::PUBKEY;
    const NAME: &'static str = "pubkey";
    const ROUND_NAMES: [&'static str; 4] = [
        "pubkey_read_version",
        "pubkey_write",
        "pubkey_read",
        "pubkey_write_back",
    ];
    type Entry = Entry;
    type Clock = Header;
    /// Nothing: a version carries the key it is checked against, and the id checks the key.
    type Context = ();
    type Signer = Arc<SecretKey>;

    fn n(f: usize) -> usize {
        3 * f + 1
    }

    fn ts(entry: &Entry) -> Timestamp {
        entry.ts
    }

    fn value(entry: &Entry) -> Option<&Bytes> {
        entry.value.as_ref()
    }

    fn into_value(entry: Entry) -> Option<Bytes> {
        entry.value
    }

    fn make(
        owner: &Arc<SecretKey>,
        _group: GroupId,
        _key: &Key,
        ts: Timestamp,
        value: Option<Bytes>,
    ) -> Entry {
        Entry::sign(ts, value, owner)
    }

    fn clock(entry: &Entry) -> Header {
        entry.header()
    }

    fn clock_ts(_: &(), _group: GroupId, key: &Key, clock: Option<Header>) -> Clocked {
        // Only an owner-signed version counts (spec §7.1.4): a faulty replica cannot push the
        // writer's version arbitrarily far ahead.
        Clocked::Counted(
            clock
                .filter(|header| header.verify(key))
                .map(|header| header.ts),
        )
    }

    fn admit(
        _: &(),
        _group: GroupId,
        key: &Key,
        from: ClientId,
        store: bool,
        entry: &Entry,
    ) -> Option<Refusal> {
        // A writer stores only versions it numbered itself, so no two writers' versions collide;
        // readers write back anyone's.
        if store && entry.ts.writer != from {
            return Some(Refusal::NotWriter);
        }
        (!entry.verify(key)).then_some(Refusal::BadSignature)
    }

    fn judge(_: &(), _group: GroupId, key: &Key, entry: &Entry) -> Judged {
        if entry.verify(key) {
            Judged::Valid
        } else {
            Judged::Forged
        }
    }
}

/// A client-to-server message.
pub type Request = super::Request<PubKey>;
/// The rounds.
pub type RequestBody = super::RequestBody<PubKey>;
/// A server-to-client message.
pub type Response = super::Response<PubKey>;
/// Replies.
pub type ResponseBody = super::ResponseBody<PubKey>;
/// A state change made durable before the reply.
pub type Change = super::Change<PubKey>;
/// A public-key object replica.
pub type Server = super::Server<PubKey>;
/// What operations know of the group.
pub type ClientConfig = super::ClientConfig<PubKey>;
/// One write.
pub type WriteOp = super::WriteOp<PubKey>;
/// One read.
pub type ReadOp = super::ReadOp<PubKey>;

impl Server {
    /// A replica with empty state.
    pub fn new(node: Slot, epoch: Epoch, group: GroupId) -> Server {
        Server::with_context(node, epoch, group, ())
    }
}

impl ClientConfig {
    /// A group of `3f+1` in epoch 0, group 0.
    pub fn new(f: usize) -> ClientConfig {
        ClientConfig::with_context(f, ())
    }
}

impl WriteOp {
    /// A write of `value` (`None` deletes) to the object `owner` owns, numbered by `writer`
    /// (the client's id) and `seq` (unique among its writes).
    pub fn new(
        config: ClientConfig,
        op: OpId,
        writer: ClientId,
        seq: u64,
        owner: Arc<SecretKey>,
        value: Option<Bytes>,
    ) -> WriteOp {
        let id = object_id(&owner.public_key());
        WriteOp::with_signer(config, id, op, writer, seq, owner, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(seed: u8) -> SecretKey {
        SecretKey::from_seed(&[seed; 32])
    }

    fn ts(num: u64) -> Timestamp {
        Timestamp {
            num,
            writer: ClientId(3),
            seq: 9,
        }
    }

    #[test]
    fn a_version_verifies_only_under_its_owners_id() {
        let alice = owner(1);
        let id = object_id(&alice.public_key());
        let entry = Entry::sign(ts(1), Some(Bytes::from_static(b"hello")), &alice);
        assert!(entry.verify(&id));
        assert_eq!(PubKey::judge(&(), GroupId(0), &id, &entry), Judged::Valid);
        // Moved to another group, it is still valid: the group is not signed.
        assert_eq!(PubKey::judge(&(), GroupId(9), &id, &entry), Judged::Valid);

        let bob_id = object_id(&owner(2).public_key());
        assert!(!entry.verify(&bob_id), "replayed under another object");
        let mut changed = entry.clone();
        changed.value = Some(Bytes::from_static(b"jello"));
        assert!(!changed.verify(&id), "other content");
        let mut renumbered = entry.clone();
        renumbered.ts.num = 2;
        assert!(!renumbered.verify(&id), "another version");
        // Bob signs a version of Alice's object with his own key, under her key or his.
        let mut forged = Entry::sign(ts(5), Some(Bytes::from_static(b"mine")), &owner(2));
        assert!(!forged.verify(&id));
        forged.owner = alice.public_key().to_bytes();
        assert!(!forged.verify(&id));
        assert_eq!(PubKey::judge(&(), GroupId(0), &id, &forged), Judged::Forged);
        let zero = Entry::sign(ts(0), None, &alice);
        assert!(!zero.verify(&id), "version 0 is no write");
        let tombstone = Entry::sign(ts(2), None, &alice);
        assert!(tombstone.verify(&id));
    }

    #[test]
    fn read_phases_count_only_owner_signed_versions() {
        let alice = owner(1);
        let id = object_id(&alice.public_key());
        let entry = Entry::sign(ts(7), Some(Bytes::from_static(b"x")), &alice);
        assert_eq!(
            PubKey::clock_ts(&(), GroupId(0), &id, Some(entry.header())),
            Clocked::Counted(Some(ts(7)))
        );
        let mut inflated = entry.header();
        inflated.ts.num = u64::MAX;
        assert_eq!(
            PubKey::clock_ts(&(), GroupId(0), &id, Some(inflated)),
            Clocked::Counted(None)
        );
        assert_eq!(
            PubKey::clock_ts(&(), GroupId(0), &id, None),
            Clocked::Counted(None)
        );
    }

    #[test]
    fn replicas_admit_valid_versions_and_only_their_writers_store_them() {
        let alice = owner(1);
        let id = object_id(&alice.public_key());
        let entry = Entry::sign(ts(1), Some(Bytes::from_static(b"v")), &alice);
        assert_eq!(
            PubKey::admit(&(), GroupId(0), &id, ClientId(3), true, &entry),
            None
        );
        assert_eq!(
            PubKey::admit(&(), GroupId(0), &id, ClientId(4), true, &entry),
            Some(Refusal::NotWriter),
            "a STORE numbered by another writer"
        );
        assert_eq!(
            PubKey::admit(&(), GroupId(0), &id, ClientId(4), false, &entry),
            None,
            "anyone writes back a valid version"
        );
        let mut bad = entry.clone();
        bad.signature = Bytes::from(vec![0; 64]);
        assert_eq!(
            PubKey::admit(&(), GroupId(0), &id, ClientId(3), true, &bad),
            Some(Refusal::BadSignature)
        );
    }
}
