//! What Depot nodes sign and exchange: a volume's members and who may write what, and the update
//! (Depot §2.3), `dVV, {key, H(value), clock@writer, H(history)}σ_writer`.
//!
//! We take the option of the notes (depot.md §2.3 [impl]): every dependency the update names
//! carries the hash of the update it means, and the writer's previous update is named by hash
//! (`prev`). Dependencies are then found by hash, never by searching branches (§4.6), the fork
//! point between two nodes is found by walking back from a hash rather than by a binary search
//! over version vectors (§4.4), and two signed updates of one writer naming the same `prev` are a
//! fork that anyone holding the writer's key can check (§4.7). The dependency delta is inside
//! the signed bytes, so a relay cannot change it and a signed update is evidence on its own.

use bulwark_core::sign::{Context, PublicKey, Signable, Signature, Signed, Unverified};
use bulwark_core::wire;
use bulwark_core::{Digest, Key};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The signing context of every update: its signatures mean nothing anywhere else.
pub const UPDATE_CONTEXT: Context = Context::new("bulwark.depot.update.v1");

/// The most dependencies one update names: one per other writer whose frontier moved, twice for
/// a writer seen forked. Bounds what a hostile writer can make every node walk.
pub const DEPS_MAX: usize = 1024;

/// The most members a volume has (writers' indices are below it).
pub const MEMBERS_MAX: usize = 512;

/// The longest signed update accepted: a key, a value reference and [`DEPS_MAX`] dependencies.
pub const UPDATE_BYTES_MAX: usize = 64 * 1024;

/// A causal volume's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VolumeId(pub u64);

/// A member of a volume, by its index in the volume's configuration. Clients and servers alike
/// are members: in Depot both are nodes that write, keep logs and exchange them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Writer(pub u32);

/// What a member is for. Servers hoard every value of the volume; clients hoard what they wrote
/// and keep every update's metadata (§5.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Stores the volume for its clients.
    Server,
    /// Writes and reads.
    Client,
}

/// One member: its key, its role, and the key prefixes it may write (§6.5: a range of lookup
/// keys bound to the key of the node allowed to write it; prefixes are our ranges).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Verifies its updates.
    pub key: PublicKey,
    /// Server or client.
    pub role: Role,
    /// It may write a key that starts with one of these (an empty prefix: every key).
    pub writes: Vec<Vec<u8>>,
}

/// A volume as it was created: fixed for its life (§1.4, §6.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeConfig {
    /// Its number.
    pub volume: VolumeId,
    /// Its name where it was created (at most [`LABEL_BYTES_MAX`] bytes): part of the number, so
    /// that two volumes of the same members never share one, and their keys never mix.
    pub label: String,
    /// Every node that may take part, indexed by [`Writer`].
    pub members: Vec<Member>,
    /// How often clients announce themselves, and how long it takes to hear (§6.4).
    pub staleness: Staleness,
}

/// Bounded staleness (§6.4): every client writes a beacon with its time every `announce_ms`;
/// a reader that has no beacon from a client newer than `2 * announce_ms + propagate_ms` suspects
/// it has missed that client's updates, and says so with what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staleness {
    /// `T_announce`: between two beacons of one client.
    pub announce_ms: u64,
    /// `T_prop`: how long a beacon is expected to take to reach every node.
    pub propagate_ms: u64,
}

impl Default for Staleness {
    /// The notes' defaults: 10 s and 20 s.
    fn default() -> Self {
        Staleness {
            announce_ms: 10_000,
            propagate_ms: 20_000,
        }
    }
}

impl Staleness {
    /// How old a client's newest beacon may be before a reader suspects it missed its updates.
    pub fn bound_ms(&self) -> u64 {
        self.announce_ms
            .saturating_mul(2)
            .saturating_add(self.propagate_ms)
    }
}

/// Where every member's beacon lives: `BEACON_PREFIX` and its index. No prefix of a member's
/// write rights reaches another member's beacon.
pub const BEACON_PREFIX: &[u8] = b"\0depot/beacon/";

/// The key of `writer`'s beacon.
pub fn beacon_key(writer: Writer) -> Key {
    let mut bytes = BEACON_PREFIX.to_vec();
    bytes.extend_from_slice(writer.0.to_string().as_bytes());
    Key::new(bytes).unwrap_or_else(|e| unreachable!("a beacon key is short: {e}"))
}

/// Where every client's discard proposals and consents live (§6.6): `DISCARD_PREFIX` and its
/// index. Only that client writes there; no prefix of a member's write rights reaches it.
pub const DISCARD_PREFIX: &[u8] = b"\0depot/discard/";

/// The key of `writer`'s discard proposals and consents.
pub fn discard_key(writer: Writer) -> Key {
    let mut bytes = DISCARD_PREFIX.to_vec();
    bytes.extend_from_slice(writer.0.to_string().as_bytes());
    Key::new(bytes).unwrap_or_else(|e| unreachable!("a discard key is short: {e}"))
}

/// Keys the protocol itself writes (beacons, discard proposals and consents): never listed for
/// discard, and not the users' to write.
pub fn is_reserved(key: &Key) -> bool {
    key.as_bytes().starts_with(b"\0depot/")
}

/// The longest label a volume has (a volume name's bound).
pub const LABEL_BYTES_MAX: usize = 63;

/// The most write prefixes one member holds.
pub const PREFIXES_MAX: usize = 64;

/// Why a volume configuration cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadConfig {
    /// Its number is not the hash of the rest.
    #[error("its number is not the hash of its label, members and staleness")]
    Number,
    /// A label longer than [`LABEL_BYTES_MAX`].
    #[error("a volume's label is at most {LABEL_BYTES_MAX} bytes")]
    Label,
    /// No members, more than [`MEMBERS_MAX`], or no server among them.
    #[error("a volume has 1 to {MEMBERS_MAX} members, at least one a server")]
    Members,
    /// One key named twice: the two members could fork each other's updates.
    #[error("a member's key is named twice")]
    DuplicateKey,
    /// More than [`PREFIXES_MAX`] prefixes, or one longer than a key.
    #[error("a member has more than {PREFIXES_MAX} write prefixes or one longer than a key")]
    Prefixes,
    /// An announce interval below 100 ms or a bound that overflows.
    #[error("beacons are announced every 100 ms at the most often")]
    Staleness,
}

impl VolumeConfig {
    /// Volume `label` of `members`: its number is the hash of the label, the members and
    /// `staleness`, so that two configurations never share a number and a server handed one can
    /// check it.
    pub fn new(label: &str, members: Vec<Member>, staleness: Staleness) -> VolumeConfig {
        let volume = Self::number_of(label, &members, &staleness);
        VolumeConfig {
            volume,
            label: label.to_string(),
            members,
            staleness,
        }
    }

    fn number_of(label: &str, members: &[Member], staleness: &Staleness) -> VolumeId {
        let digest = Digest::of(
            "bulwark depot volume v2",
            &wire::encode(&(label, members, staleness)),
        );
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&digest.0[..8]);
        VolumeId(u64::from_be_bytes(bytes))
    }

    /// Whether this configuration can be served as it says: every bound, and its number.
    pub fn check(&self) -> Result<(), BadConfig> {
        if self.members.is_empty()
            || self.members.len() > MEMBERS_MAX
            || self.servers().next().is_none()
        {
            return Err(BadConfig::Members);
        }
        let keys: std::collections::BTreeSet<[u8; 32]> =
            self.members.iter().map(|m| m.key.to_bytes()).collect();
        if keys.len() != self.members.len() {
            return Err(BadConfig::DuplicateKey);
        }
        if self.members.iter().any(|m| {
            m.writes.len() > PREFIXES_MAX || m.writes.iter().any(|p| p.len() > Key::BYTES_MAX)
        }) {
            return Err(BadConfig::Prefixes);
        }
        if self.staleness.announce_ms < 100 || self.staleness.announce_ms > u64::MAX / 4 {
            return Err(BadConfig::Staleness);
        }
        if self.label.len() > LABEL_BYTES_MAX {
            return Err(BadConfig::Label);
        }
        if Self::number_of(&self.label, &self.members, &self.staleness) != self.volume {
            return Err(BadConfig::Number);
        }
        Ok(())
    }

    /// The member whose key is `key`.
    pub fn member_with(&self, key: &PublicKey) -> Option<Writer> {
        self.members
            .iter()
            .position(|m| m.key == *key)
            .map(|index| Writer(index as u32))
    }

    /// The member behind `writer`, if there is one.
    pub fn member(&self, writer: Writer) -> Option<&Member> {
        self.members.get(writer.0 as usize)
    }

    /// Whether `writer` may change what reads of `key` return. An update by anyone else is kept
    /// and passed on (others may depend on it) but is a no-op for reads (§3.3 step 7).
    pub fn may_write(&self, writer: Writer, key: &Key) -> bool {
        if key.as_bytes().starts_with(BEACON_PREFIX) {
            return self.member(writer).is_some() && *key == beacon_key(writer);
        }
        if key.as_bytes().starts_with(DISCARD_PREFIX) {
            return self
                .member(writer)
                .is_some_and(|member| member.role == Role::Client)
                && *key == discard_key(writer);
        }
        self.member(writer).is_some_and(|member| {
            member
                .writes
                .iter()
                .any(|prefix| key.as_bytes().starts_with(prefix))
        })
    }

    /// The servers, in index order.
    pub fn servers(&self) -> impl Iterator<Item = Writer> + '_ {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.role == Role::Server)
            .map(|(index, _)| Writer(index as u32))
    }
}

/// The value an update binds its key to, by hash: values travel and are stored apart from the
/// log (§2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueRef {
    /// [`value_hash`] of the value.
    pub hash: Digest,
    /// Its length in bytes.
    pub len: u64,
}

/// The hash an update names its value by.
pub fn value_hash(value: &[u8]) -> Digest {
    Digest::of("bulwark depot value v1", value)
}

/// An update the writer depends on: one entry of the dependency version vector, with the hash
/// of the update it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dep {
    /// Whose update.
    pub writer: Writer,
    /// Its logical clock.
    pub clock: u64,
    /// Its [`UpdateId`].
    pub id: UpdateId,
}

/// An update's name: the hash of its signed bytes (§2.3 [impl]). Two signatures over the same
/// bytes are one update; accept stamps are not names, since a fork gives one stamp two updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateId(pub Digest);

impl UpdateId {
    /// The id of the update signed as `bytes`.
    pub fn of(bytes: &[u8]) -> UpdateId {
        UpdateId(Digest::of("bulwark depot update v1", bytes))
    }
}

/// The signed part of an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateBody {
    /// The volume it belongs to.
    pub volume: VolumeId,
    /// Who wrote it.
    pub writer: Writer,
    /// Its logical clock: above every clock it depends on.
    pub clock: u64,
    /// The key it writes.
    pub key: Key,
    /// The value, or `None` for a delete.
    pub value: Option<ValueRef>,
    /// The writer's previous update; `None` for its first.
    pub prev: Option<UpdateId>,
    /// The dependency delta: the writer's frontier entries that changed since `prev`, sorted by
    /// writer then id, at most [`DEPS_MAX`].
    pub deps: Vec<Dep>,
    /// [`history_hash`] of the update's whole frontier.
    pub history: Digest,
    /// A beacon's time, in the writer's milliseconds (§6.4): only on the writer's
    /// [`beacon_key`].
    pub beacon: Option<u64>,
}

impl Signable for UpdateBody {
    const CONTEXT: Context = UPDATE_CONTEXT;
    const BYTES_MAX: usize = UPDATE_BYTES_MAX;
}

/// A verified update: the writer's signature checked over these exact bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// The exact bytes the writer signed.
    bytes: Bytes,
    signature: Signature,
    body: UpdateBody,
    id: UpdateId,
}

impl Update {
    /// Wraps a signed body and names it. The writer's key is not kept (a log holds many updates
    /// of each writer, and the volume's configuration names the key): the signature was checked
    /// to make `signed`, and a proof checks it again.
    pub fn new(signed: Signed<UpdateBody>) -> Update {
        let id = UpdateId::of(signed.bytes());
        let (bytes, signature, body) = signed.into_parts();
        Update {
            bytes,
            signature,
            body,
            id,
        }
    }

    /// Its name.
    pub fn id(&self) -> UpdateId {
        self.id
    }

    /// What the writer signed.
    pub fn body(&self) -> &UpdateBody {
        &self.body
    }

    /// The exact bytes the writer signed.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The form to send on.
    pub fn to_wire(&self) -> WireUpdate {
        WireUpdate {
            writer: self.body.writer,
            signed: Unverified::new(self.bytes.clone(), self.signature),
        }
    }
}

/// An update as it travels and is stored: the writer it claims (to find the key that checks
/// it), bytes and a signature, checked by [`WireUpdate::verify`].
#[derive(Clone, Serialize, Deserialize)]
pub struct WireUpdate {
    /// Whose key verifies it; the signed body must name the same writer.
    pub writer: Writer,
    /// The writer's signed body.
    pub signed: Unverified<UpdateBody>,
}

impl WireUpdate {
    /// The id the update has if it verifies.
    pub fn id(&self) -> UpdateId {
        UpdateId::of(self.signed.bytes())
    }
}

impl std::fmt::Debug for WireUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WireUpdate({:?} by {:?})", self.id(), self.writer)
    }
}

/// Why a received update was refused before it reached the log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Not a member of this volume.
    #[error("writer {0:?} is not a member of the volume")]
    NotMember(Writer),
    /// For another volume.
    #[error("update of volume {0:?}")]
    OtherVolume(VolumeId),
    /// The signature does not verify under the writer's key, or the signed bytes do not decode.
    #[error("bad signature or encoding: {0}")]
    Signature(String),
    /// More dependencies than any update may name, or not in canonical order.
    #[error("dependencies not sorted, repeated or more than {DEPS_MAX}")]
    Deps,
    /// A dependency on the writer itself (its own past is `prev`), or on a non-member.
    #[error("a dependency on {0:?} no correct writer names")]
    BadDep(Writer),
    /// A beacon time on a key other than the writer's beacon.
    #[error("a beacon time outside the writer's beacon key")]
    Beacon,
}

impl WireUpdate {
    /// Checks the signature of the member it claims, then the body's shape.
    pub fn verify(self, config: &VolumeConfig) -> Result<Update, Malformed> {
        let writer = self.writer;
        let member = config.member(writer).ok_or(Malformed::NotMember(writer))?;
        let signed = self
            .signed
            .verify(&member.key)
            .map_err(|e| Malformed::Signature(e.to_string()))?;
        let body = signed.value();
        if body.volume != config.volume {
            return Err(Malformed::OtherVolume(body.volume));
        }
        if body.writer != writer {
            return Err(Malformed::Signature("writer changed under decoding".into()));
        }
        if body.deps.len() > DEPS_MAX
            || !body
                .deps
                .windows(2)
                .all(|pair| (pair[0].writer, pair[0].id) < (pair[1].writer, pair[1].id))
        {
            return Err(Malformed::Deps);
        }
        if body.beacon.is_some() && body.key != beacon_key(writer) {
            return Err(Malformed::Beacon);
        }
        if let Some(dep) = body
            .deps
            .iter()
            .find(|dep| dep.writer == writer || config.member(dep.writer).is_none())
        {
            return Err(Malformed::BadDep(dep.writer));
        }
        Ok(Update::new(signed))
    }
}

/// The history hash (§2.3 [impl]) over an update's whole frontier: for every writer in its causal
/// past, the ids and clocks of that writer's latest updates it includes, in writer then id order.
/// Each named update carries its own history hash, so this covers the whole past.
pub fn history_hash(frontier: &[(Writer, u64, UpdateId)]) -> Digest {
    Digest::of("bulwark depot history v1", &wire::encode(&frontier))
}
