//! A Phalanx-style Byzantine-tolerant register with writer signatures (Malkhi and Reiter): the
//! signature-based baseline PoWerStore's evaluation compares against (spec §6.1, "M-Phalanx").
//! `n = 3f+1` servers, every quorum `n - f`; up to `f` servers may lie.
//!
//! A version carries the writer's Ed25519 signature over `(group, key, ts, H(value))`. Servers
//! check it (`verify_strict`) before storing, so only what a registered writer signed is ever
//! stored or served; CLOCK returns the signed timestamp with the value's hash instead of the
//! value, so a writer need neither trust the server nor fetch the data. A Byzantine server cannot
//! forge a version; it can only withhold or replay old ones, and a quorum of `n - f` meets every
//! other quorum in `f + 1` servers, one of them correct.
//!
//! Writers' public keys come from the cluster configuration ([`Writers`]); weak keys are refused
//! when they are registered. Deletes are signed tombstones (`value: None`).

use super::{Clocked, Judged, Policy};
use bulwark_core::sign::{Context, PublicKey, SecretKey, SignError, Signature};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, OBJECT_BYTES_MAX, Slot};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

pub use super::{OpId, ProtocolError, ReadOutcome, Refusal, ServerStats, Timestamp, WriteOutcome};

const DOMAIN_VALUE: &str = "bulwark.phalanx.value";
/// What a writer signs: a version of one register (`signed_bytes`), never anything else.
const SIGNED_VERSION: Context = Context::new("bulwark.phalanx.signed-version.v1");

/// A writer's signing key.
pub type SigningKey = SecretKey;

/// The Phalanx policy: `3f+1` servers, versions signed by their writers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phalanx;

/// The writers' public keys, by client index, from the cluster configuration.
#[derive(Clone, Debug, Default)]
pub struct Writers(HashMap<ClientId, PublicKey>);

impl Writers {
    /// Every writer's key from `cluster.toml`, refusing malformed and weak keys with an error
    /// naming the field.
    pub fn from_config(
        cluster: &bulwark_core::config::ClusterConfig,
        file: &str,
    ) -> Result<Writers, bulwark_core::config::ConfigError> {
        let mut writers = Writers::default();
        for (i, client) in cluster.clients.iter().enumerate() {
            let (true, Some(public)) = (client.write, client.signing_key) else {
                continue;
            };
            writers
                .register(ClientId(client.id), &public)
                .map_err(|error| bulwark_core::config::ConfigError::Invalid {
                    file: file.to_string(),
                    field: format!("clients[{i}].signing_key"),
                    problem: error.to_string(),
                })?;
        }
        Ok(writers)
    }

    /// Every writer with its key.
    pub fn keys(&self) -> impl Iterator<Item = (ClientId, PublicKey)> + '_ {
        self.0.iter().map(|(writer, key)| (*writer, *key))
    }

    /// Registers `writer`'s public key, refusing malformed, non-canonical and weak keys.
    pub fn register(&mut self, writer: ClientId, public: &[u8; 32]) -> Result<(), SignError> {
        self.0.insert(writer, PublicKey::from_bytes(public)?);
        Ok(())
    }

    /// Whether `entry` carries a valid signature of its timestamp's writer.
    pub fn verify(&self, group: GroupId, key: &Key, entry: &Entry) -> bool {
        entry.is_well_formed() && self.verify_timestamp(group, key, &entry.signed_timestamp())
    }

    /// Whether a version's signed timestamp (its value replaced by the value's hash) verifies.
    pub fn verify_timestamp(&self, group: GroupId, key: &Key, signed: &SignedTimestamp) -> bool {
        let Some(public) = self.0.get(&signed.ts.writer) else {
            return false;
        };
        let Ok(signature) = <[u8; 64]>::try_from(signed.signature.as_ref()) else {
            return false;
        };
        signed.ts.num >= 1
            && public
                .verify(
                    SIGNED_VERSION,
                    &signed_bytes(
                        group,
                        key,
                        &signed.ts,
                        signed.tombstone,
                        &signed.value_digest,
                    ),
                    &Signature(signature),
                )
                .is_ok()
    }
}

/// What CLOCK returns: a stored version's timestamp with the hash of its value instead of the
/// value, so a writer can check the signature without fetching the data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedTimestamp {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// Whether the version is a delete.
    pub tombstone: bool,
    /// `H(value)`.
    pub value_digest: Digest,
    /// The writer's signature over the version.
    pub signature: Bytes,
}

fn value_digest(value: Option<&[u8]>) -> Digest {
    match value {
        Some(value) => Digest::of(DOMAIN_VALUE, value),
        None => Digest::of(DOMAIN_VALUE, b"tombstone"),
    }
}

/// The signing key made from a 32-byte secret, as `cluster init` draws it.
pub fn signing_key(secret: &[u8; 32]) -> SigningKey {
    SecretKey::from_seed(secret)
}

/// The public half of a signing key's secret, as registered in `cluster.toml`.
pub fn public_key(secret: &[u8; 32]) -> [u8; 32] {
    signing_key(secret).public_key().to_bytes()
}

/// The exact bytes a writer signs: domain, group, key, timestamp, whether it is a delete, and the
/// value's hash.
fn signed_bytes(
    group: GroupId,
    key: &Key,
    ts: &Timestamp,
    tombstone: bool,
    digest: &Digest,
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(4 + 2 + key.as_bytes().len() + 20 + 33);
    bytes.extend_from_slice(&group.0.to_be_bytes());
    bytes.extend_from_slice(&(key.as_bytes().len() as u16).to_be_bytes());
    bytes.extend_from_slice(key.as_bytes());
    bytes.extend_from_slice(&ts.num.to_be_bytes());
    bytes.extend_from_slice(&ts.writer.0.to_be_bytes());
    bytes.extend_from_slice(&ts.seq.to_be_bytes());
    bytes.push(u8::from(!tombstone));
    bytes.extend_from_slice(&digest.0);
    bytes
}

/// A signed version: timestamp, value (`None`: a delete) and the writer's signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// The whole value; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Ed25519 by `ts.writer` over `(group, key, ts, H(value))`: 64 bytes.
    pub signature: Bytes,
}

impl Entry {
    /// Signs a new version.
    pub fn sign(
        group: GroupId,
        key: &Key,
        ts: Timestamp,
        value: Option<Bytes>,
        signing: &SigningKey,
    ) -> Entry {
        let digest = value_digest(value.as_deref());
        let bytes = signed_bytes(group, key, &ts, value.is_none(), &digest);
        let signature = signing.sign(SIGNED_VERSION, &bytes);
        Entry {
            ts,
            value,
            signature: Bytes::copy_from_slice(&signature.0),
        }
    }

    /// The timestamp, the value's hash and the signature: what CLOCK returns.
    pub fn signed_timestamp(&self) -> SignedTimestamp {
        SignedTimestamp {
            ts: self.ts,
            tombstone: self.value.is_none(),
            value_digest: value_digest(self.value.as_deref()),
            signature: self.signature.clone(),
        }
    }

    /// Shape only: a real timestamp, a value within the limit, a 64-byte signature.
    pub fn is_well_formed(&self) -> bool {
        self.ts.num >= 1
            && self.signature.len() == 64
            && self
                .value
                .as_ref()
                .is_none_or(|v| v.len() <= OBJECT_BYTES_MAX)
    }
}

impl Policy for Phalanx {
    const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::PHALANX;
    const NAME: &'static str = "phalanx";
    const ROUND_NAMES: [&'static str; 4] = [
        "phalanx_clock",
        "phalanx_store",
        "phalanx_get",
        "phalanx_write_back",
    ];
    type Entry = Entry;
    type Clock = SignedTimestamp;
    type Context = Arc<Writers>;
    type Signer = Arc<SigningKey>;

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
        signer: &Arc<SigningKey>,
        group: GroupId,
        key: &Key,
        ts: Timestamp,
        value: Option<Bytes>,
    ) -> Entry {
        Entry::sign(group, key, ts, value, signer)
    }

    fn clock(entry: &Entry) -> SignedTimestamp {
        entry.signed_timestamp()
    }

    fn clock_ts(
        writers: &Arc<Writers>,
        group: GroupId,
        key: &Key,
        clock: Option<SignedTimestamp>,
    ) -> Clocked {
        // Only a signed timestamp counts: a Byzantine server cannot push writers arbitrarily far
        // ahead.
        Clocked::Counted(
            clock
                .filter(|signed| writers.verify_timestamp(group, key, signed))
                .map(|signed| signed.ts),
        )
    }

    fn admit(
        writers: &Arc<Writers>,
        group: GroupId,
        key: &Key,
        from: ClientId,
        store: bool,
        entry: &Entry,
    ) -> Option<Refusal> {
        if !entry.is_well_formed() {
            return Some(Refusal::Malformed(
                "timestamp 0, value too large or signature length".into(),
            ));
        }
        // A writer stores only versions it signed itself; readers write back anyone's.
        if store && entry.ts.writer != from {
            return Some(Refusal::NotWriter);
        }
        (!writers.verify(group, key, entry)).then_some(Refusal::BadSignature)
    }

    fn judge(writers: &Arc<Writers>, group: GroupId, key: &Key, entry: &Entry) -> Judged {
        if writers.verify(group, key, entry) {
            Judged::Valid
        } else {
            Judged::Forged
        }
    }
}

/// A client-to-server message.
pub type Request = super::Request<Phalanx>;
/// The rounds.
pub type RequestBody = super::RequestBody<Phalanx>;
/// A server-to-client message.
pub type Response = super::Response<Phalanx>;
/// Replies.
pub type ResponseBody = super::ResponseBody<Phalanx>;
/// A state change made durable before the reply.
pub type Change = super::Change<Phalanx>;
/// The outcome of one request.
pub type Handled = super::Handled<Phalanx>;
/// A Phalanx server.
pub type Server = super::Server<Phalanx>;
/// What Phalanx operations know of the group.
pub type ClientConfig = super::ClientConfig<Phalanx>;
/// One write.
pub type WriteOp = super::WriteOp<Phalanx>;
/// One read.
pub type ReadOp = super::ReadOp<Phalanx>;
/// A message to send.
pub type Outbound = super::Outbound<Phalanx>;
/// What a machine says after an input.
pub type Step<T> = super::Step<Phalanx, T>;

impl Server {
    /// A server with empty state that accepts versions signed by `writers`.
    pub fn new(node: Slot, epoch: Epoch, group: GroupId, writers: Arc<Writers>) -> Server {
        Server::with_context(node, epoch, group, writers)
    }

    /// Handles one authenticated request from client `from` with the given rights.
    pub fn handle(
        &mut self,
        from: ClientId,
        may_write: bool,
        may_read: bool,
        request: Request,
    ) -> Handled {
        self.serve(from, may_write, may_read, request)
    }
}

impl ClientConfig {
    /// A group of `3f+1` in epoch 0, group 0.
    pub fn new(f: usize, writers: Arc<Writers>) -> ClientConfig {
        ClientConfig::with_context(f, writers)
    }
}

impl WriteOp {
    /// A write of `value` (`None` deletes) by `writer`, signed with its key; `seq` must be
    /// unique among its writes.
    pub fn new(
        config: ClientConfig,
        key: Key,
        op: OpId,
        writer: ClientId,
        seq: u64,
        signing: Arc<SigningKey>,
        value: Option<Bytes>,
    ) -> WriteOp {
        WriteOp::with_signer(config, key, op, writer, seq, signing, value)
    }
}

#[cfg(test)]
mod tests;
