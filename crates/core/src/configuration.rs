//! The certified configuration of Rosebud (§2.4, §3.4–§3.7): what the configuration service
//! (CS) decides at the end of every epoch, and what every node and client checks, one epoch after
//! another, starting from a genesis configuration it trusts.
//!
//! A [`Configuration`] is the whole membership of one epoch plus the parameters everyone derives
//! the rest from: the storage groups ([`Configuration::placement`]) and the CS replicas of the
//! epoch ([`Configuration::cs`]).
//!
//! Three rules hold throughout:
//!
//! - **One configuration, one encoding.** Members are sorted by id and the struct is encoded with
//!   postcard; [`Configuration::decode`] re-encodes what it decoded and refuses the bytes unless
//!   they are exactly that encoding. A node that hashes the bytes it received and one that
//!   rebuilt the configuration from a delta therefore hash and verify the same bytes, and derive
//!   the same CS bit for bit (Rosebud §7.1 item 13).
//! - **The CS of epoch `e` certifies epoch `e+1`.** The spec's threshold signature is replaced,
//!   as in the paper's prototype and as the spec recommends (§3.5), by a vector of Ed25519
//!   signatures: a [`ConfigCert`] needs at least `2f_cs+1` of them, from distinct CS replicas of
//!   the *previous* configuration, each over the exact bytes of the new one. Trust therefore
//!   chains back to the genesis configuration ([`verify_chain`]).
//! - **Strict certificates.** A certificate is refused if any entry in it is wrong (a signer
//!   outside the CS, a signer listed twice, a signature that does not verify), not only when too
//!   few good ones remain: correct CS replicas never produce such entries, so there is nothing to
//!   gain from tolerating them, and "every entry is good" is easier to reason about than "enough
//!   entries are good".
//!
//! Deltas ([`ConfigDelta`], §3.5) carry only what changed; the receiver rebuilds the full
//! configuration from its copy of the previous one and checks the signatures over the result, so
//! a delta applied to the wrong base fails like a forged one.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::config::Fingerprint;
use crate::crypto::Digest;
use crate::ids::{Epoch, NodeId};
use crate::membership::{
    self, Member, Placement, PlacementError, PlacementParams, Ring, RingPoint,
};
use crate::sign::{Context, PublicKey, SecretKey, Signature};
use crate::wire::{self, WireError};

/// The most members a configuration may list. Every node and client holds the whole
/// configuration (§2.4), so its size is bounded before anything is decoded. Rosebud's design
/// point is 10,000 nodes (§3.6); at this bound a configuration encodes in at most 2.54 MB and its
/// certificate, a delta and the configuration service's snapshot each fit one frame (checked
/// below).
pub const MEMBERS_MAX: usize = 16_384;

/// The longest canonical encoding of one [`Member`]: its id (a `u32` varint, at most 5 bytes),
/// its address (the variant byte, 16 bytes of IPv6, a port varint of at most 3), its fingerprint
/// (postcard writes it as 64 hex digits after a one-byte length), its 32-byte key and its
/// trusted log's (an option tag and 32 bytes).
const MEMBER_BYTES_MAX: usize = 5 + (1 + 16 + 3) + (1 + 64) + 32 + (1 + 32);

/// The longest encoding of everything in a [`Configuration`] but its members: the epoch (a `u64`
/// varint, at most 10 bytes), `f` and `f_cs` (5 each), the CS protocol (1), the member count (3),
/// the authority's key (32), the three `u64` times (10 each) and `next_node_id` (5).
const HEADER_BYTES_MAX: usize = 10 + 5 + 5 + 1 + 3 + 32 + 10 + 10 + 10 + 5;

/// The longest encoding of a valid configuration: longer input is refused before it is decoded.
pub const BYTES_MAX: usize = HEADER_BYTES_MAX + MEMBERS_MAX * MEMBER_BYTES_MAX;

/// The longest encoding of a [`ConfigCert`]: the configuration's bytes with their length (a
/// varint of 4 bytes: [`BYTES_MAX`] is below 2^28), and at most one signature (a node id and 64
/// bytes) per member, since a CS never has more replicas than the configuration has members.
/// For callers that decode a certificate on its own.
pub const CERT_BYTES_MAX: usize = 4 + BYTES_MAX + 3 + MEMBERS_MAX * (5 + 64);

/// The longest encoding of a [`ConfigDelta`]: the epoch, at most [`MEMBERS_MAX`] added members
/// and as many dropped ids, the two scalars, and at most one signature per member. For callers
/// that decode a delta on its own.
pub const DELTA_BYTES_MAX: usize = 10
    + (3 + MEMBERS_MAX * MEMBER_BYTES_MAX)
    + (3 + MEMBERS_MAX * 5)
    + 10
    + 5
    + (3 + MEMBERS_MAX * (5 + 64));

// Whatever carries a whole configuration carries it in one frame: a certificate, a delta, and
// the configuration service's snapshot (two configurations).
const _: () = assert!(
    BYTES_MAX < 1 << 28
        && MEMBERS_MAX < 1 << 21
        && CERT_BYTES_MAX <= wire::FRAME_BYTES_MAX
        && DELTA_BYTES_MAX <= wire::FRAME_BYTES_MAX
        && 2 * BYTES_MAX <= wire::FRAME_BYTES_MAX
);

/// The context CS replicas sign configurations under, so such a signature is never valid as
/// any other kind of statement.
pub const CONTEXT: Context = Context::new("bulwark.configuration");

/// The epoch of the genesis configuration. Epoch 0 is the static membership that predates
/// reconfiguration (`ids::Epoch`), so certified configurations start at 1.
pub const GENESIS_EPOCH: Epoch = Epoch(1);

/// A CS replica's answer to a client's freshness challenge (Rosebud §3.8, with the spec's binding
/// of epoch and configuration): `node`, a CS replica of `epoch`, holds `epoch` as current, whose
/// configuration has `digest`, as it answers `nonce`. `f_cs+1` of them from the epoch's CS
/// include a correct replica's, so the client's configuration was current when it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fresh {
    /// The client's nonce.
    pub nonce: u64,
    /// The replica's current epoch.
    pub epoch: Epoch,
    /// Its configuration's digest.
    pub digest: Digest,
    /// The replica.
    pub node: NodeId,
}

impl crate::sign::Signable for Fresh {
    const CONTEXT: Context = Context::new("bulwark.cs.fresh.v1");
    const BYTES_MAX: usize = 64;
}

/// The replica group id the configuration service of `epoch` is addressed by: one PBFT instance
/// per epoch, so frames of one epoch's CS never reach another's.
pub fn cs_group(epoch: Epoch) -> crate::GroupId {
    crate::GroupId(u32::try_from(epoch.0).unwrap_or(u32::MAX))
}

/// The domain of [`Configuration::digest`]. Changing it moves every CS.
const DIGEST_DOMAIN: &str = "bulwark.configuration.v1";

/// The domain of the points that choose CS replicas (Rosebud §3.7). Changing it moves every CS.
const CS_DOMAIN: &[u8] = b"bulwark.cs.v1";

/// A node the trusted authority ADDs: everything a [`Member`] has but its id, which the CS
/// assigns (Rosebud §3.2: a node must not choose its own id, or it could choose its place on the
/// ring).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMember {
    /// Where clients and peers will reach it.
    pub address: SocketAddr,
    /// Its pinned TLS certificate.
    pub fingerprint: Fingerprint,
    /// The key its statements will verify under, assigned by the authority.
    pub signing_key: PublicKey,
    /// Its trusted log's key, if it has one (a configuration service on A2M-PBFT-EA needs it).
    pub trusted_key: Option<PublicKey>,
}

impl NewMember {
    /// The member it becomes under `id`.
    pub fn with_id(self, id: NodeId) -> Member {
        Member {
            id,
            address: self.address,
            fingerprint: self.fingerprint,
            signing_key: self.signing_key,
            trusted_key: self.trusted_key,
        }
    }
}

/// The agreement core the configuration service runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CsProtocol {
    /// PBFT: `3f_cs+1` replicas, `2f_cs+1` sign the next configuration.
    #[default]
    Pbft,
    /// A2M-PBFT-EA: `2f_cs+1` replicas, each with a trusted log, `f_cs+1` sign the next
    /// configuration. Every member has a trusted log (any member may be chosen for the CS).
    A2mPbftEa,
    /// A2M-PBFT-E: PBFT's `3f_cs+1` replicas and `2f_cs+1` signatures, each replica answering
    /// with its trusted log's request history, so clients accept no result of a split history
    /// with up to `2f_cs` faulty replicas. Every member has a trusted log.
    A2mPbftE,
}

impl CsProtocol {
    /// The name `cluster init --cs-protocol` takes.
    pub fn name(self) -> &'static str {
        match self {
            CsProtocol::Pbft => "pbft",
            CsProtocol::A2mPbftEa => "a2m-pbft-ea",
            CsProtocol::A2mPbftE => "a2m-pbft-e",
        }
    }

    /// Whether its replicas need a trusted log.
    pub fn needs_trusted_logs(self) -> bool {
        match self {
            CsProtocol::Pbft => false,
            CsProtocol::A2mPbftEa | CsProtocol::A2mPbftE => true,
        }
    }
}

impl std::str::FromStr for CsProtocol {
    type Err = String;

    fn from_str(name: &str) -> Result<CsProtocol, String> {
        match name {
            "pbft" => Ok(CsProtocol::Pbft),
            "a2m-pbft-ea" => Ok(CsProtocol::A2mPbftEa),
            "a2m-pbft-e" => Ok(CsProtocol::A2mPbftE),
            other => Err(format!(
                "no configuration-service protocol {other:?}: pbft, a2m-pbft-ea or a2m-pbft-e"
            )),
        }
    }
}

/// The configuration of one epoch: the full membership and the parameters every node and client
/// derives groups, the CS and the epoch's timing from.
///
/// The fields are encoded in the order they are declared: reordering them changes every
/// encoding, every digest and every CS, and invalidates every certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Configuration {
    /// Which epoch this is; [`GENESIS_EPOCH`] for the first.
    pub epoch: Epoch,
    /// Faults tolerated per storage group: groups have `3f+1` members.
    pub f: u32,
    /// Faults the configuration service tolerates: it has `3f_cs+1` replicas, or `2f_cs+1` on
    /// A2M-PBFT-EA.
    pub f_cs: u32,
    /// The agreement core the configuration service runs on.
    pub cs_protocol: CsProtocol,
    /// Every member, sorted by id, each a distinct principal (id, address, certificate and
    /// signing key all unique).
    pub members: Vec<Member>,
    /// The trusted authority whose signature ADD and REVOKE orders need (Rosebud §3.1).
    pub authority: PublicKey,
    /// How long an epoch lasts, in milliseconds (`t_epoch`).
    pub t_epoch_ms: u64,
    /// How far a CS replica's measure of the elapsed epoch may differ from the primary's for it
    /// to accept a STOP, in milliseconds (Rosebud §3.4's delta).
    pub stop_delta_ms: u64,
    /// When this epoch began, as the CS agreed: the STOP's agreed time, or the genesis time.
    pub started_at_ms: u64,
    /// The id the next ADDed node receives. Ids are never reused, so it is above every id ever
    /// assigned, and in particular above every member's.
    pub next_node_id: u32,
}

/// Why a configuration is unusable, or cannot be decoded or computed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigurationError {
    /// Epoch 0 is the static membership; certified configurations start at [`GENESIS_EPOCH`].
    #[error("epoch 0 is the static membership; certified configurations start at epoch 1")]
    EpochZero,
    /// More members than [`MEMBERS_MAX`].
    #[error("{members} members exceed the limit of {max}")]
    TooManyMembers {
        /// Members listed.
        members: usize,
        /// [`MEMBERS_MAX`].
        max: usize,
    },
    /// Members must be listed in increasing id order, so the configuration has one encoding.
    #[error("members are not sorted by id: {before} is listed before {after}")]
    NotSorted {
        /// The member listed first.
        before: NodeId,
        /// The lower id listed after it.
        after: NodeId,
    },
    /// Two members with one id, or sharing an address, a certificate or a signing key.
    #[error("{0}")]
    Members(#[from] PlacementError),
    /// An IPv6 address with a flow label or a scope id: the encoding drops both, so the member
    /// that was signed would not be the member that is decoded.
    #[error("{0}'s address has an IPv6 flow label or scope id, which the encoding does not keep")]
    ScopedAddress(NodeId),
    /// Fewer members than one storage group needs.
    #[error("{members} members cannot form storage groups of {needed} (f = {f})")]
    TooFewForGroups {
        /// Members listed.
        members: usize,
        /// The configuration's `f`.
        f: u32,
        /// `3f+1`.
        needed: usize,
    },
    /// Fewer members than the configuration service has replicas.
    #[error("{members} members cannot host a configuration service of {needed} (f_cs = {f_cs})")]
    TooFewForCs {
        /// Members listed.
        members: usize,
        /// The configuration's `f_cs`.
        f_cs: u32,
        /// `3f_cs+1`.
        needed: usize,
    },
    /// `next_node_id` is not above every member's id, so the next ADD would reuse an id.
    #[error("the next node id {next_node_id} is not above {member}'s")]
    NextNodeIdTaken {
        /// The configuration's `next_node_id`.
        next_node_id: u32,
        /// The member with the highest id.
        member: NodeId,
    },
    /// The epoch must last more than twice the STOP tolerance: a STOP is accepted from
    /// `t_epoch − delta` on, and that must lie more than `delta` after the epoch began, or a
    /// faulty primary could end an epoch within the clock error of its start.
    #[error(
        "an epoch of {t_epoch_ms} ms must exceed twice the STOP tolerance of {stop_delta_ms} ms"
    )]
    EpochTooShort {
        /// The configuration's `t_epoch_ms`.
        t_epoch_ms: u64,
        /// The configuration's `stop_delta_ms`.
        stop_delta_ms: u64,
    },
    /// A node to drop is not a member, or is named twice.
    #[error("{0} cannot be dropped: it is not a member, or is named twice")]
    NotAMember(NodeId),
    /// No id is left for an ADDed node: ids are never reused.
    #[error("node ids are exhausted")]
    NodeIdsExhausted,
    /// The epoch number cannot grow.
    #[error("epoch numbers are exhausted")]
    EpochsExhausted,
    /// The bytes are too long, or not a configuration at all.
    #[error("undecodable: {0}")]
    Undecodable(#[from] WireError),
    /// A member without a trusted log in a configuration whose CS runs on A2M-PBFT-EA.
    #[error("member {0} has no trusted log, and the configuration service runs on A2M-PBFT-EA")]
    NoTrustedLog(NodeId),
    /// The bytes decode to a valid configuration, but are not its one encoding (an overlong
    /// varint, upper-case hex in a fingerprint, ...).
    #[error("not the configuration's canonical encoding")]
    NonCanonical,
}

impl Configuration {
    /// The first configuration, at [`GENESIS_EPOCH`], of `members` listed in any order.
    ///
    /// `next_node_id` starts just above the highest member id. Refuses anything
    /// [`Configuration::validate`] refuses.
    pub fn genesis(
        mut members: Vec<Member>,
        f: u32,
        f_cs: u32,
        authority: PublicKey,
        t_epoch_ms: u64,
        stop_delta_ms: u64,
        started_at_ms: u64,
    ) -> Result<Configuration, ConfigurationError> {
        members.sort_by_key(|member| member.id);
        let next_node_id = match members.last() {
            Some(last) => last
                .id
                .0
                .checked_add(1)
                .ok_or(ConfigurationError::NodeIdsExhausted)?,
            // No members: validate refuses it below, with the reason.
            None => 0,
        };
        let genesis = Configuration {
            epoch: GENESIS_EPOCH,
            f,
            f_cs,
            cs_protocol: CsProtocol::Pbft,
            members,
            authority,
            t_epoch_ms,
            stop_delta_ms,
            started_at_ms,
            next_node_id,
        };
        genesis.validate()?;
        Ok(genesis)
    }

    /// This genesis with its configuration service on `protocol` instead, validated again.
    pub fn with_cs_protocol(
        mut self,
        protocol: CsProtocol,
    ) -> Result<Configuration, ConfigurationError> {
        self.cs_protocol = protocol;
        self.validate()?;
        Ok(self)
    }

    /// Checks that the configuration is usable: a non-zero epoch; at most [`MEMBERS_MAX`]
    /// members, sorted by id, each a distinct principal with an address the encoding keeps;
    /// enough members for groups of `3f+1` and a CS of `3f_cs+1`; `next_node_id` above every id;
    /// and an epoch longer than twice the STOP tolerance.
    ///
    /// Errors name the lowest offending ids, so every node reports the same problem.
    pub fn validate(&self) -> Result<(), ConfigurationError> {
        if self.epoch == Epoch(0) {
            return Err(ConfigurationError::EpochZero);
        }
        let members = self.members.len();
        if members > MEMBERS_MAX {
            return Err(ConfigurationError::TooManyMembers {
                members,
                max: MEMBERS_MAX,
            });
        }
        if let Some(pair) = self.members.windows(2).find(|pair| pair[0].id > pair[1].id) {
            return Err(ConfigurationError::NotSorted {
                before: pair[0].id,
                after: pair[1].id,
            });
        }
        // The same checks as Placement::new, so a configuration that validates always places.
        membership::check_identities(&self.members)?;
        if let Some(member) = self.members.iter().find(|m| !keeps_address(&m.address)) {
            return Err(ConfigurationError::ScopedAddress(member.id));
        }
        let needed = three_f_plus_one(self.f);
        if members < needed {
            return Err(ConfigurationError::TooFewForGroups {
                members,
                f: self.f,
                needed,
            });
        }
        let needed = self.cs_size();
        if members < needed {
            return Err(ConfigurationError::TooFewForCs {
                members,
                f_cs: self.f_cs,
                needed,
            });
        }
        if self.cs_protocol.needs_trusted_logs()
            && let Some(member) = self.members.iter().find(|m| m.trusted_key.is_none())
        {
            return Err(ConfigurationError::NoTrustedLog(member.id));
        }
        if let Some(last) = self.members.last()
            && last.id.0 >= self.next_node_id
        {
            return Err(ConfigurationError::NextNodeIdTaken {
                next_node_id: self.next_node_id,
                member: last.id,
            });
        }
        if self.t_epoch_ms <= self.stop_delta_ms.saturating_mul(2) {
            return Err(ConfigurationError::EpochTooShort {
                t_epoch_ms: self.t_epoch_ms,
                stop_delta_ms: self.stop_delta_ms,
            });
        }
        Ok(())
    }

    /// The canonical encoding: postcard of the configuration with its members sorted by id.
    ///
    /// A configuration built with unsorted members encodes as its sorted form, so the encoding
    /// (and the digest and the CS) depends on the membership, not on the order it was listed in.
    pub fn encode(&self) -> Vec<u8> {
        if self.members.is_sorted_by_key(|member| member.id) {
            return wire::encode(self);
        }
        let mut sorted = self.clone();
        sorted.members.sort_by_key(|member| member.id);
        wire::encode(&sorted)
    }

    /// Decodes, validates and checks that `bytes` are the configuration's canonical encoding.
    ///
    /// The length is bounded by [`BYTES_MAX`] before anything is decoded. Canonical bytes only:
    /// otherwise two nodes could hold one configuration as two byte strings, and a signature over
    /// one would not verify over the other.
    pub fn decode(bytes: &[u8]) -> Result<Configuration, ConfigurationError> {
        let config: Configuration = wire::decode(bytes, BYTES_MAX)?;
        config.validate()?;
        if config.encode() != bytes {
            return Err(ConfigurationError::NonCanonical);
        }
        Ok(config)
    }

    /// The configuration's hash, `h(c)` of Rosebud §3.7: BLAKE3 of the canonical encoding under
    /// the domain `"bulwark.configuration.v1"`.
    pub fn digest(&self) -> Digest {
        Digest::of(DIGEST_DOMAIN, &self.encode())
    }

    /// The member `id`, if it is one.
    pub fn member(&self, id: NodeId) -> Option<&Member> {
        // Sorted by id in every configuration that validates; for one that does not, a miss is
        // the worst that can happen.
        let at = self
            .members
            .binary_search_by_key(&id, |member| member.id)
            .ok()?;
        self.members.get(at)
    }

    /// How many replicas the CS of this epoch has: `3f_cs+1` on PBFT and A2M-PBFT-E, `2f_cs+1`
    /// on A2M-PBFT-EA.
    pub fn cs_size(&self) -> usize {
        match self.cs_protocol {
            CsProtocol::Pbft | CsProtocol::A2mPbftE => three_f_plus_one(self.f_cs),
            CsProtocol::A2mPbftEa => self.f_cs_usize().saturating_mul(2).saturating_add(1),
        }
    }

    /// How many CS replicas must sign the next configuration: `2f_cs+1` on PBFT and A2M-PBFT-E,
    /// `f_cs+1` on A2M-PBFT-EA (either way a quorum of its agreement, which includes a correct
    /// replica that executed the agreed STOP).
    pub fn cs_quorum(&self) -> usize {
        match self.cs_protocol {
            CsProtocol::Pbft | CsProtocol::A2mPbftE => {
                self.f_cs_usize().saturating_mul(2).saturating_add(1)
            }
            CsProtocol::A2mPbftEa => self.f_cs_usize().saturating_add(1),
        }
    }

    fn f_cs_usize(&self) -> usize {
        usize::try_from(self.f_cs).unwrap_or(usize::MAX)
    }

    /// The configuration-service replicas of this epoch, in slot order (Rosebud §3.7).
    ///
    /// Replica `i`, for `i` in `1..=3f_cs+1`, is the member whose ring position
    /// ([`RingPoint::of_node`]) is equal to or follows the point
    /// `SHA-256("bulwark.cs.v1" || i as u32 BE || epoch as u64 BE || digest)`, wrapping round the
    /// ring; when that member is already chosen, the next member clockwise not yet chosen (as the
    /// spec recommends for collisions, §3.7). Folding in the digest moves the CS unpredictably
    /// every epoch. A pure function of the configuration: every node must compute the same list,
    /// since nodes decide by it which pings to answer and whose signatures certify the next epoch.
    ///
    /// A configuration with fewer members than `3f_cs+1` (one that does not validate) gets all
    /// of them.
    pub fn cs(&self) -> Vec<NodeId> {
        let digest = self.digest();
        // Ring order as in Placement: by position, then by id, so the order is total.
        let mut ring: Vec<(RingPoint, NodeId)> = self
            .members
            .iter()
            .map(|member| (RingPoint::of_node(member.id), member.id))
            .collect();
        ring.sort_unstable();
        let size = self.cs_size().min(ring.len());
        let mut taken = vec![false; ring.len()];
        let mut chosen = Vec::with_capacity(size);
        for i in (1..=u32::MAX).take(size) {
            let point = cs_point(i, self.epoch, &digest);
            let mut at = ring.partition_point(|(position, _)| *position < point);
            // Fewer than ring.len() members are taken, so an untaken one lies ahead: this ends
            // within one turn of the ring.
            loop {
                if at == ring.len() {
                    at = 0;
                }
                if !taken[at] {
                    break;
                }
                at += 1;
            }
            taken[at] = true;
            chosen.push(ring[at].1);
        }
        chosen
    }

    /// The storage groups of this epoch.
    pub fn placement(&self) -> Result<Placement, PlacementError> {
        Placement::new(
            self.epoch,
            PlacementParams::new(usize::try_from(self.f).unwrap_or(usize::MAX)),
            self.members.clone(),
        )
    }

    /// Where this epoch places keys, by member ids alone.
    pub fn ring(&self) -> Result<Ring, PlacementError> {
        Ring::new(
            self.epoch,
            PlacementParams::new(usize::try_from(self.f).unwrap_or(usize::MAX)),
            self.members.iter().map(|member| member.id),
        )
    }

    /// The successor configuration, as the CS computes it when STOP executes (Rosebud §3.4):
    /// the next epoch, whose members are the current ones minus `dropped` (EVICTed and REVOKEd)
    /// plus `added` (ADDed), beginning at `started_at_ms` (the STOP's agreed time).
    ///
    /// Added members receive the ids `next_node_id`, `next_node_id + 1`, … in the order given, and
    /// `next_node_id` moves past them, so no id is ever given twice, even to a node that left and
    /// is added again. Everything else is carried over. Refuses dropping a non-member or one node
    /// twice, and a result that does not validate (too few members left, an added node sharing a
    /// member's address, certificate or key).
    pub fn next(
        &self,
        added: Vec<NewMember>,
        dropped: &[NodeId],
        started_at_ms: u64,
    ) -> Result<Configuration, ConfigurationError> {
        let epoch = self
            .epoch
            .0
            .checked_add(1)
            .map(Epoch)
            .ok_or(ConfigurationError::EpochsExhausted)?;
        let mut members = self
            .without(dropped)
            .map_err(ConfigurationError::NotAMember)?;
        let total = members.len().saturating_add(added.len());
        if total > MEMBERS_MAX {
            return Err(ConfigurationError::TooManyMembers {
                members: total,
                max: MEMBERS_MAX,
            });
        }
        let mut next_node_id = self.next_node_id;
        for new in added {
            let id = NodeId(next_node_id);
            next_node_id = next_node_id
                .checked_add(1)
                .ok_or(ConfigurationError::NodeIdsExhausted)?;
            members.push(new.with_id(id));
        }
        // New ids are above every old one, so this is already sorted when self was; sorting
        // anyway keeps the result canonical whatever self was.
        members.sort_by_key(|member| member.id);
        let next = Configuration {
            epoch,
            f: self.f,
            f_cs: self.f_cs,
            cs_protocol: self.cs_protocol,
            members,
            authority: self.authority,
            t_epoch_ms: self.t_epoch_ms,
            stop_delta_ms: self.stop_delta_ms,
            started_at_ms,
            next_node_id,
        };
        next.validate()?;
        Ok(next)
    }

    /// The members minus `dropped`, or the first id of `dropped` that is not a member or that
    /// `dropped` names twice.
    fn without(&self, dropped: &[NodeId]) -> Result<Vec<Member>, NodeId> {
        let mut gone = BTreeSet::new();
        for &id in dropped {
            if self.member(id).is_none() || !gone.insert(id) {
                return Err(id);
            }
        }
        Ok(self
            .members
            .iter()
            .filter(|member| !gone.contains(&member.id))
            .cloned()
            .collect())
    }
}

/// `3f+1`, saturating: an absurd `f` asks for more members than any list has, and is refused
/// as such rather than overflowing.
fn three_f_plus_one(f: u32) -> usize {
    usize::try_from(f)
        .unwrap_or(usize::MAX)
        .saturating_mul(3)
        .saturating_add(1)
}

/// Whether the encoding keeps all of `address`: postcard writes an IPv6 socket address as its
/// address and port only.
fn keeps_address(address: &SocketAddr) -> bool {
    match address {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.flowinfo() == 0 && v6.scope_id() == 0,
    }
}

/// The point that chooses CS replica `i` of `epoch` (Rosebud §3.7's `h(i, e, h(c))`).
fn cs_point(i: u32, epoch: Epoch, digest: &Digest) -> RingPoint {
    let mut hasher = sha2::Sha256::new();
    hasher.update(CS_DOMAIN);
    hasher.update(i.to_be_bytes());
    hasher.update(epoch.0.to_be_bytes());
    hasher.update(digest.0);
    RingPoint(hasher.finalize().into())
}

/// Why a certificate or a delta does not establish the next configuration.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The certified bytes are too long, undecodable, not canonical, or not a valid
    /// configuration.
    #[error("the certified configuration is malformed: {0}")]
    Malformed(#[from] ConfigurationError),
    /// The configuration is not for the epoch after the one verified last: a replayed old
    /// certificate, or one from further ahead.
    #[error("a configuration for epoch {} where epoch {} was due", got.0, expected.0)]
    WrongEpoch {
        /// The epoch after the previous configuration's.
        expected: Epoch,
        /// The epoch the certificate or delta names.
        got: Epoch,
    },
    /// More signatures than the previous CS has replicas.
    #[error("{got} signatures, but the configuration service has {max} replicas")]
    TooManySignatures {
        /// Signatures in the certificate.
        got: usize,
        /// The previous configuration's `3f_cs+1`.
        max: usize,
    },
    /// A signer who is not a CS replica of the previous epoch.
    #[error("{signer} is not a configuration-service replica of epoch {}", epoch.0)]
    NotInCs {
        /// The signer.
        signer: NodeId,
        /// The previous configuration's epoch, whose CS certifies the next.
        epoch: Epoch,
    },
    /// One signer listed twice: it counts once, and a correct CS never lists it twice.
    #[error("{0} signs twice")]
    DuplicateSigner(NodeId),
    /// Fewer than `2f_cs+1` signers.
    #[error("{got} signatures, but {needed} are needed")]
    TooFewSignatures {
        /// Distinct signers in the certificate.
        got: usize,
        /// The previous configuration's `2f_cs+1`.
        needed: usize,
    },
    /// A signature that does not verify over the configuration's bytes under its signer's key:
    /// forged, over other bytes, or over a configuration rebuilt from a delta on the wrong base.
    #[error("{signer}'s signature does not verify")]
    BadSignature {
        /// Whose signature.
        signer: NodeId,
    },
    /// A delta drops a node its base does not list, or drops one twice: it was made for another
    /// configuration.
    #[error("the delta drops {0}, which its base does not list (once)")]
    NotInBase(NodeId),
    /// A delta with more changes than a configuration has members.
    #[error("a delta adding {added} and dropping {dropped} members exceeds the limit of {max}")]
    DeltaTooLarge {
        /// Members added.
        added: usize,
        /// Members dropped.
        dropped: usize,
        /// [`MEMBERS_MAX`] each.
        max: usize,
    },
}

/// A configuration as certified by the CS of the epoch before: its exact bytes and the CS
/// replicas' signatures over them.
///
/// Holding one proves nothing; [`verify_successor`] checks it against the previous
/// configuration. The signature vector stands where Rosebud's threshold signature would be (spec
/// §3.5 recommendation); a threshold scheme could replace it behind the same functions.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigCert {
    /// The canonical encoding of the new configuration, exactly as signed.
    #[serde(with = "wire::shared_bytes")]
    pub bytes: Bytes,
    /// Each signing CS replica of the previous epoch, with its signature over `bytes` under
    /// [`CONTEXT`].
    pub signatures: Vec<(NodeId, Signature)>,
}

impl ConfigCert {
    /// One CS replica's share: its signature over the configuration's exact bytes under
    /// [`CONTEXT`].
    pub fn share(secret: &SecretKey, config_bytes: &[u8]) -> Signature {
        secret.sign(CONTEXT, config_bytes)
    }

    /// Whether `signature` is a good share from `signer` for the successor of `prev`: `signer` is
    /// one of `prev`'s CS replicas, and the signature verifies over `config_bytes` under its key.
    ///
    /// For the replica collecting shares. It does not look inside the bytes; the finished
    /// certificate goes through [`verify_successor`] like any other. Each call derives `prev`'s
    /// CS afresh (an encoding, a hash and a sort of the ring).
    pub fn verify_share(
        prev: &Configuration,
        signer: NodeId,
        config_bytes: &[u8],
        signature: &Signature,
    ) -> bool {
        if config_bytes.len() > BYTES_MAX || !prev.cs().contains(&signer) {
            return false;
        }
        prev.member(signer).is_some_and(|member| {
            member
                .signing_key
                .verify(CONTEXT, config_bytes, signature)
                .is_ok()
        })
    }
}

impl fmt::Debug for ConfigCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Up to half a megabyte of configuration is no use in a log line; its length and the
        // signers are.
        let signers: Vec<NodeId> = self.signatures.iter().map(|(signer, _)| *signer).collect();
        f.debug_struct("ConfigCert")
            .field("bytes", &self.bytes.len())
            .field("signers", &signers)
            .finish()
    }
}

/// Checks `cert` as the successor of `prev`, a configuration already trusted (the genesis, or
/// one verified before), and returns the new configuration.
///
/// The new configuration must decode canonically and validate, be for exactly the epoch after
/// `prev`'s, and carry signatures from at least `2f_cs+1` distinct CS replicas of `prev` (the CS
/// of epoch `e` certifies epoch `e+1`), each verifying under that replica's key in `prev`. Any
/// entry that is wrong refuses the whole certificate (module docs). The cheap checks run first,
/// and signatures, the expensive part, only once everything else holds.
pub fn verify_successor(
    prev: &Configuration,
    cert: &ConfigCert,
) -> Result<Configuration, CertError> {
    let max = prev.cs_size();
    if cert.signatures.len() > max {
        return Err(CertError::TooManySignatures {
            got: cert.signatures.len(),
            max,
        });
    }
    let next = Configuration::decode(&cert.bytes)?;
    check_epoch(prev, next.epoch)?;
    let cs = prev.cs();
    let mut signers = BTreeSet::new();
    for &(signer, _) in &cert.signatures {
        if !cs.contains(&signer) {
            return Err(CertError::NotInCs {
                signer,
                epoch: prev.epoch,
            });
        }
        if !signers.insert(signer) {
            return Err(CertError::DuplicateSigner(signer));
        }
    }
    let needed = prev.cs_quorum();
    if signers.len() < needed {
        return Err(CertError::TooFewSignatures {
            got: signers.len(),
            needed,
        });
    }
    for (signer, signature) in &cert.signatures {
        let good = prev.member(*signer).is_some_and(|member| {
            member
                .signing_key
                .verify(CONTEXT, &cert.bytes, signature)
                .is_ok()
        });
        if !good {
            return Err(CertError::BadSignature { signer: *signer });
        }
    }
    Ok(next)
}

/// Checks `certs` one after another from `genesis`, each the successor of the one before, and
/// returns the last configuration (`genesis` itself when there are none).
///
/// `genesis` is trusted as given, but must validate.
pub fn verify_chain(
    genesis: &Configuration,
    certs: &[ConfigCert],
) -> Result<Configuration, CertError> {
    genesis.validate()?;
    let mut current = genesis.clone();
    for cert in certs {
        current = verify_successor(&current, cert)?;
    }
    Ok(current)
}

/// Refuses `got` unless it is the epoch right after `prev`'s.
fn check_epoch(prev: &Configuration, got: Epoch) -> Result<(), CertError> {
    if prev.epoch.0.checked_add(1) == Some(got.0) {
        return Ok(());
    }
    Err(CertError::WrongEpoch {
        // Saturates only after 2^64 epochs, where no successor exists anyway.
        expected: Epoch(prev.epoch.0.saturating_add(1)),
        got,
    })
}

/// The next configuration as a change to the previous one (Rosebud §3.5): what is disseminated
/// each epoch, far smaller than the configuration when few members change.
///
/// The signatures are the [`ConfigCert`]'s, over the *whole* new configuration, not over the
/// delta: the receiver rebuilds the configuration from its own copy of the previous one
/// ([`ConfigDelta::apply`]) and verifies the result, so a delta for another base, or a forged one,
/// fails verification. On failure the receiver fetches the full certificate instead (§7.1
/// item 13).
///
/// A delta carries the members and the two scalars that change at every STOP; a successor that
/// changes `f`, `f_cs`, the authority or the timing cannot be sent as a delta
/// ([`ConfigDelta::between`] says so).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigDelta {
    /// The new configuration's epoch.
    pub epoch: Epoch,
    /// Members of the new configuration that the previous one does not list as they are (ADDed
    /// nodes), with their ids.
    pub added: Vec<Member>,
    /// Members of the previous configuration that the new one does not list as they are
    /// (EVICTed and REVOKEd nodes).
    pub dropped: Vec<NodeId>,
    /// The new configuration's `started_at_ms`.
    pub started_at_ms: u64,
    /// The new configuration's `next_node_id`.
    pub next_node_id: u32,
    /// The certificate's signatures, over the whole new configuration.
    pub signatures: Vec<(NodeId, Signature)>,
}

impl ConfigDelta {
    /// The delta that turns `prev` into `next`, carrying `signatures` (those of `next`'s
    /// certificate), or `None` when `next` changes something a delta does not carry (`f`,
    /// `f_cs`, the authority, `t_epoch_ms` or `stop_delta_ms`): send the full certificate then.
    ///
    /// A member whose id is in both but whose entry differs is dropped and added again, so
    /// applying the delta to `prev` always rebuilds `next` exactly.
    pub fn between(
        prev: &Configuration,
        next: &Configuration,
        signatures: Vec<(NodeId, Signature)>,
    ) -> Option<ConfigDelta> {
        // Destructured so that a new field cannot be added without deciding whether deltas
        // carry it.
        let Configuration {
            epoch,
            f,
            f_cs,
            cs_protocol,
            members: _,
            authority,
            t_epoch_ms,
            stop_delta_ms,
            started_at_ms,
            next_node_id,
        } = next;
        let carried = *f == prev.f
            && *f_cs == prev.f_cs
            && *cs_protocol == prev.cs_protocol
            && *authority == prev.authority
            && *t_epoch_ms == prev.t_epoch_ms
            && *stop_delta_ms == prev.stop_delta_ms;
        if !carried {
            return None;
        }
        let dropped = prev
            .members
            .iter()
            .filter(|member| next.member(member.id) != Some(member))
            .map(|member| member.id)
            .collect();
        let added = next
            .members
            .iter()
            .filter(|member| prev.member(member.id) != Some(member))
            .cloned()
            .collect();
        Some(ConfigDelta {
            epoch: *epoch,
            added,
            dropped,
            started_at_ms: *started_at_ms,
            next_node_id: *next_node_id,
            signatures,
        })
    }

    /// Rebuilds the full new configuration from `prev` and this delta, and returns it as the
    /// certificate to check with [`verify_successor`] (or use [`ConfigDelta::verify`]).
    ///
    /// Refuses a delta with more changes than a configuration has members, for another epoch, or
    /// dropping a node `prev` does not list; any other mismatch with the base shows up as
    /// signatures that do not verify over the rebuilt bytes.
    pub fn apply(&self, prev: &Configuration) -> Result<ConfigCert, CertError> {
        if self.added.len() > MEMBERS_MAX || self.dropped.len() > MEMBERS_MAX {
            return Err(CertError::DeltaTooLarge {
                added: self.added.len(),
                dropped: self.dropped.len(),
                max: MEMBERS_MAX,
            });
        }
        // Before copying anything: verify_successor would refuse it anyway.
        let max = prev.cs_size();
        if self.signatures.len() > max {
            return Err(CertError::TooManySignatures {
                got: self.signatures.len(),
                max,
            });
        }
        check_epoch(prev, self.epoch)?;
        let mut members = prev.without(&self.dropped).map_err(CertError::NotInBase)?;
        members.extend(self.added.iter().cloned());
        members.sort_by_key(|member| member.id);
        let next = Configuration {
            epoch: self.epoch,
            f: prev.f,
            f_cs: prev.f_cs,
            cs_protocol: prev.cs_protocol,
            members,
            authority: prev.authority,
            t_epoch_ms: prev.t_epoch_ms,
            stop_delta_ms: prev.stop_delta_ms,
            started_at_ms: self.started_at_ms,
            next_node_id: self.next_node_id,
        };
        Ok(ConfigCert {
            bytes: Bytes::from(next.encode()),
            signatures: self.signatures.clone(),
        })
    }

    /// [`ConfigDelta::apply`], then [`verify_successor`]: the new configuration, if the delta
    /// rebuilds one that `prev`'s CS certified.
    pub fn verify(&self, prev: &Configuration) -> Result<Configuration, CertError> {
        verify_successor(prev, &self.apply(prev)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};
    use std::sync::LazyLock;

    /// Node secrets, made once: deriving a key costs a scalar multiplication.
    static SECRETS: LazyLock<Vec<SecretKey>> =
        LazyLock::new(|| (0..64u8).map(|i| SecretKey::from_seed(&[i; 32])).collect());

    const T_EPOCH_MS: u64 = 3_600_000;
    const STOP_DELTA_MS: u64 = 5_000;

    fn authority() -> PublicKey {
        SecretKey::from_seed(&[200; 32]).public_key()
    }

    /// Principal `i`: its own address, certificate and key (from `SECRETS[i]`).
    fn joiner(i: u32) -> NewMember {
        NewMember {
            trusted_key: None,
            address: SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + i), 7000)),
            fingerprint: Fingerprint(blake3::hash(&i.to_be_bytes()).into()),
            signing_key: SECRETS[i as usize].public_key(),
        }
    }

    /// Principal `i` as member `i`.
    fn members(ids: impl IntoIterator<Item = u32>) -> Vec<Member> {
        ids.into_iter()
            .map(|i| joiner(i).with_id(NodeId(i)))
            .collect()
    }

    /// A genesis of members `0..n`.
    fn genesis(n: u32, f: u32, f_cs: u32) -> Configuration {
        Configuration::genesis(
            members(0..n),
            f,
            f_cs,
            authority(),
            T_EPOCH_MS,
            STOP_DELTA_MS,
            1_000,
        )
        .unwrap()
    }

    /// The secret of member `id` of `config`, found by its key.
    fn secret_of(config: &Configuration, id: NodeId) -> &'static SecretKey {
        let key = config.member(id).unwrap().signing_key;
        SECRETS.iter().find(|s| s.public_key() == key).unwrap()
    }

    /// `next` certified by `signers`, signing as members of `prev`.
    fn certify(prev: &Configuration, next: &Configuration, signers: &[NodeId]) -> ConfigCert {
        let bytes = next.encode();
        let signatures = signers
            .iter()
            .map(|&id| (id, ConfigCert::share(secret_of(prev, id), &bytes)))
            .collect();
        ConfigCert {
            bytes: Bytes::from(bytes),
            signatures,
        }
    }

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }

    /// The CS computed the slow, obvious way: for each point, the members at or after it in ring
    /// order followed by those before it, and the first of them not yet chosen.
    fn reference_cs(config: &Configuration) -> Vec<NodeId> {
        let mut ring: Vec<(RingPoint, NodeId)> = config
            .members
            .iter()
            .map(|m| (RingPoint::of_node(m.id), m.id))
            .collect();
        ring.sort();
        let digest = config.digest();
        let mut chosen: Vec<NodeId> = Vec::new();
        for i in 1..=(3 * config.f_cs + 1) {
            let point = cs_point(i, config.epoch, &digest);
            let next = ring
                .iter()
                .filter(|(position, _)| *position >= point)
                .chain(ring.iter().filter(|(position, _)| *position < point))
                .map(|&(_, id)| id)
                .find(|id| !chosen.contains(id))
                .unwrap();
            chosen.push(next);
        }
        chosen
    }

    #[test]
    fn the_format_and_the_cs_points_are_pinned() {
        // Changing either moves every CS and invalidates every certificate: do it on purpose.
        assert_eq!(
            hex::encode(cs_point(1, Epoch(1), &Digest([0; 32])).0),
            "4db9b4d3cf0565f68dd5231225a9eb89caa1bf240be46330e4a93544815d0f0b"
        );
        assert_eq!(
            hex::encode(genesis(4, 1, 1).digest().0),
            "0c019eddc40c85c9a91873ae161051df557f71881bc320f23856dd6b7781e93c"
        );
    }

    #[test]
    fn a_configuration_service_on_ea_has_2f_cs_plus_1_replicas_each_with_a_trusted_log() {
        let pbft = genesis(7, 1, 2);
        assert_eq!((pbft.cs_size(), pbft.cs_quorum()), (7, 5));
        // Without trusted logs, EA is refused, naming the first member that lacks one.
        assert!(matches!(
            pbft.clone().with_cs_protocol(CsProtocol::A2mPbftEa),
            Err(ConfigurationError::NoTrustedLog(NodeId(0)))
        ));
        let mut with_logs = members(0..7);
        for (i, member) in with_logs.iter_mut().enumerate() {
            member.trusted_key = Some(SecretKey::from_seed(&[0x90 + i as u8; 32]).public_key());
        }
        let ea = Configuration::genesis(
            with_logs.clone(),
            1,
            2,
            authority(),
            T_EPOCH_MS,
            STOP_DELTA_MS,
            1_000,
        )
        .unwrap()
        .with_cs_protocol(CsProtocol::A2mPbftEa)
        .unwrap();
        assert_eq!((ea.cs_size(), ea.cs_quorum()), (5, 3));
        assert_eq!(ea.cs().len(), 5);
        assert_ne!(
            ea.digest(),
            pbft.digest(),
            "the protocol is part of the configuration"
        );
        assert_eq!(Configuration::decode(&ea.encode()).unwrap(), ea);
        // Two members may not share a trusted log.
        with_logs[1].trusted_key = with_logs[0].trusted_key;
        assert!(
            Configuration::genesis(with_logs, 1, 2, authority(), T_EPOCH_MS, STOP_DELTA_MS, 0)
                .is_err()
        );
        // A successor that changes the protocol cannot travel as a delta.
        let mut switched = ea.clone();
        switched.epoch = Epoch(2);
        assert!(ConfigDelta::between(&pbft, &switched, Vec::new()).is_none());
        assert_eq!(
            "a2m-pbft-ea".parse::<CsProtocol>(),
            Ok(CsProtocol::A2mPbftEa)
        );
        assert!("raft".parse::<CsProtocol>().is_err());
    }

    #[test]
    fn genesis_sorts_and_the_encoding_round_trips_in_one_form() {
        let mut listed = members(0..7);
        listed.reverse();
        let config =
            Configuration::genesis(listed, 1, 1, authority(), T_EPOCH_MS, STOP_DELTA_MS, 1_000)
                .unwrap();
        assert_eq!(config.epoch, GENESIS_EPOCH);
        assert_eq!(config.members, members(0..7));
        assert_eq!(config.next_node_id, 7);
        let bytes = config.encode();
        assert_eq!(bytes, wire::encode(&config));
        assert_eq!(Configuration::decode(&bytes).unwrap(), config);

        // The same membership listed out of order encodes, hashes and elects the same.
        let mut unsorted = config.clone();
        unsorted.members.swap(0, 3);
        assert_eq!(unsorted.encode(), bytes);
        assert_eq!(unsorted.digest(), config.digest());
        assert_eq!(unsorted.cs(), config.cs());

        // Any change of any field changes the digest.
        let mut later = config.clone();
        later.started_at_ms += 1;
        assert_ne!(later.digest(), config.digest());
        let mut moved = config.clone();
        moved.members[2].address = SocketAddr::from(([192, 0, 2, 1], 7000));
        assert_ne!(moved.digest(), config.digest());

        // The placement is the configuration's.
        let placement = config.placement().unwrap();
        assert_eq!(placement.epoch(), GENESIS_EPOCH);
        assert_eq!(placement.params(), PlacementParams::new(1));
        assert_eq!(placement.len(), 7);
    }

    #[test]
    fn non_canonical_truncated_and_oversized_bytes_are_refused() {
        let config = genesis(7, 1, 1);
        let bytes = config.encode();

        // The epoch, 1, as an overlong varint: postcard reads it, the re-encoding check refuses.
        assert_eq!(bytes[0], 1);
        let mut overlong = vec![0x81, 0x00];
        overlong.extend_from_slice(&bytes[1..]);
        assert!(matches!(
            Configuration::decode(&overlong),
            Err(ConfigurationError::NonCanonical)
        ));

        // A fingerprint in upper-case hex parses as the same fingerprint.
        let lower = hex::encode(config.members[0].fingerprint.0);
        assert!(lower.bytes().any(|b| b.is_ascii_lowercase()));
        let at = find(&bytes, lower.as_bytes()).unwrap();
        let mut upper = bytes.clone();
        upper[at..at + 64].make_ascii_uppercase();
        assert_ne!(upper, bytes);
        assert!(matches!(
            Configuration::decode(&upper),
            Err(ConfigurationError::NonCanonical)
        ));

        // Unsorted members, encoded by hand, are refused as such.
        let mut unsorted = config.clone();
        unsorted.members.swap(1, 4);
        assert!(matches!(
            Configuration::decode(&wire::encode(&unsorted)),
            Err(ConfigurationError::NotSorted {
                before: NodeId(4),
                after: NodeId(2)
            })
        ));

        // Well-formed but unusable.
        let mut invalid = config.clone();
        invalid.f = 3;
        assert!(matches!(
            Configuration::decode(&invalid.encode()),
            Err(ConfigurationError::TooFewForGroups {
                members: 7,
                f: 3,
                needed: 10
            })
        ));

        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Configuration::decode(&bytes[..len]),
                    Err(ConfigurationError::Undecodable(_))
                ),
                "{len}"
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            Configuration::decode(&trailing),
            Err(ConfigurationError::Undecodable(_))
        ));
        let mut oversized = bytes.clone();
        oversized.resize(BYTES_MAX + 1, 0);
        assert!(matches!(
            Configuration::decode(&oversized),
            Err(ConfigurationError::Undecodable(WireError::TooLarge {
                len,
                max: BYTES_MAX
            })) if len == BYTES_MAX + 1
        ));
    }

    #[test]
    fn the_largest_configuration_fits_the_bound() {
        // The longest encoding of every field: IPv6 addresses, the highest ports, ids, epoch
        // and times, and the most members.
        let count = u32::try_from(MEMBERS_MAX).unwrap();
        let members: Vec<Member> = (0..count)
            .map(|i| {
                let mut seed = [0xa5; 32];
                seed[..4].copy_from_slice(&i.to_be_bytes());
                let mut trusted = seed;
                trusted[31] = 0x5a;
                Member {
                    trusted_key: Some(SecretKey::from_seed(&trusted).public_key()),
                    id: NodeId(u32::MAX - count + i),
                    address: SocketAddr::from((Ipv6Addr::from(u128::MAX - u128::from(i)), 65535)),
                    fingerprint: Fingerprint(blake3::hash(&i.to_be_bytes()).into()),
                    signing_key: SecretKey::from_seed(&seed).public_key(),
                }
            })
            .collect();
        let largest = Configuration {
            cs_protocol: CsProtocol::A2mPbftEa,
            epoch: Epoch(u64::MAX),
            f: (count - 1) / 3,
            f_cs: (count - 1) / 3,
            members,
            authority: authority(),
            t_epoch_ms: u64::MAX,
            stop_delta_ms: u64::MAX / 2 - 1,
            started_at_ms: u64::MAX,
            next_node_id: u32::MAX,
        };
        largest.validate().unwrap();
        let bytes = largest.encode();
        assert!(bytes.len() <= BYTES_MAX, "{} > {BYTES_MAX}", bytes.len());
        // And the bound is not loose: only the header's varints leave room.
        assert!(
            bytes.len() + 16 > BYTES_MAX,
            "{} vs {BYTES_MAX}",
            bytes.len()
        );
        assert_eq!(Configuration::decode(&bytes).unwrap(), largest);
        // The successor of the last epoch cannot exist.
        assert!(matches!(
            largest.next(vec![], &[], 0),
            Err(ConfigurationError::EpochsExhausted)
        ));

        // The largest certificate fits its bound too.
        let cert = ConfigCert {
            bytes: Bytes::from(vec![0xff; BYTES_MAX]),
            signatures: vec![(NodeId(u32::MAX), Signature([0xff; 64])); MEMBERS_MAX],
        };
        let encoded = wire::encode(&cert);
        assert!(encoded.len() <= CERT_BYTES_MAX);
        assert_eq!(
            wire::decode::<ConfigCert>(&encoded, CERT_BYTES_MAX).unwrap(),
            cert
        );

        // And the largest delta: every member replaced.
        let delta = ConfigDelta {
            epoch: Epoch(u64::MAX),
            added: largest.members.clone(),
            dropped: largest.members.iter().map(|m| m.id).collect(),
            started_at_ms: u64::MAX,
            next_node_id: u32::MAX,
            signatures: vec![(NodeId(u32::MAX), Signature([0xff; 64])); MEMBERS_MAX],
        };
        assert!(wire::encode(&delta).len() <= DELTA_BYTES_MAX);

        // One member too many is refused before anything else is looked at.
        let mut crowded = largest;
        crowded.members.push(crowded.members[0].clone());
        assert!(matches!(
            crowded.validate(),
            Err(ConfigurationError::TooManyMembers {
                members,
                max: MEMBERS_MAX
            }) if members == MEMBERS_MAX + 1
        ));
    }

    #[test]
    fn unusable_configurations_are_refused_by_name() {
        let valid = genesis(7, 1, 1);
        valid.validate().unwrap();
        let refused = |change: &dyn Fn(&mut Configuration)| {
            let mut config = valid.clone();
            change(&mut config);
            config.validate().unwrap_err()
        };
        assert!(matches!(
            refused(&|c| c.epoch = Epoch(0)),
            ConfigurationError::EpochZero
        ));
        assert!(matches!(
            refused(&|c| c.members.swap(5, 6)),
            ConfigurationError::NotSorted {
                before: NodeId(6),
                after: NodeId(5)
            }
        ));
        assert!(matches!(
            refused(&|c| c.members[3].id = NodeId(2)),
            ConfigurationError::Members(PlacementError::DuplicateId(NodeId(2)))
        ));
        assert!(matches!(
            refused(&|c| c.members[4].address = c.members[1].address),
            ConfigurationError::Members(PlacementError::SharedIdentity {
                first: NodeId(1),
                second: NodeId(4),
                what: "an address"
            })
        ));
        assert!(matches!(
            refused(&|c| c.members[6].signing_key = c.members[0].signing_key),
            ConfigurationError::Members(PlacementError::SharedIdentity {
                first: NodeId(0),
                second: NodeId(6),
                what: "a signing key"
            })
        ));
        assert!(matches!(
            refused(&|c| {
                c.members[2].address =
                    SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 7000, 0, 3));
            }),
            ConfigurationError::ScopedAddress(NodeId(2))
        ));
        assert!(matches!(
            refused(&|c| c.f = 3),
            ConfigurationError::TooFewForGroups {
                members: 7,
                f: 3,
                needed: 10
            }
        ));
        assert!(matches!(
            refused(&|c| c.f = u32::MAX),
            ConfigurationError::TooFewForGroups { f: u32::MAX, .. }
        ));
        assert!(matches!(
            refused(&|c| c.f_cs = 3),
            ConfigurationError::TooFewForCs {
                members: 7,
                f_cs: 3,
                needed: 10
            }
        ));
        assert!(matches!(
            refused(&|c| c.next_node_id = 6),
            ConfigurationError::NextNodeIdTaken {
                next_node_id: 6,
                member: NodeId(6)
            }
        ));
        assert!(matches!(
            refused(&|c| c.t_epoch_ms = 2 * c.stop_delta_ms),
            ConfigurationError::EpochTooShort {
                t_epoch_ms: 10_000,
                stop_delta_ms: 5_000
            }
        ));
        assert!(matches!(
            refused(&|c| c.stop_delta_ms = u64::MAX),
            ConfigurationError::EpochTooShort { .. }
        ));
        let mut longer = valid.clone();
        longer.t_epoch_ms = 2 * longer.stop_delta_ms + 1;
        longer.validate().unwrap();
        assert!(matches!(
            Configuration::genesis(vec![], 0, 0, authority(), 10, 1, 0),
            Err(ConfigurationError::TooFewForGroups {
                members: 0,
                needed: 1,
                ..
            })
        ));
    }

    #[test]
    fn the_cs_is_3f_cs_plus_1_distinct_members_chosen_by_the_configuration() {
        let config = genesis(20, 1, 2);
        let cs = config.cs();
        assert_eq!(cs.len(), 7);
        let distinct: BTreeSet<NodeId> = cs.iter().copied().collect();
        assert_eq!(distinct.len(), 7);
        assert!(cs.iter().all(|&id| config.member(id).is_some()));
        assert_eq!(cs, reference_cs(&config));
        // A pure function of the configuration, however it was obtained.
        assert_eq!(config.cs(), cs);
        assert_eq!(Configuration::decode(&config.encode()).unwrap().cs(), cs);

        // The same members in another epoch, or with another digest, elect another CS.
        let mut other_epoch = config.clone();
        other_epoch.epoch = Epoch(2);
        assert_ne!(other_epoch.cs(), cs);
        assert_eq!(other_epoch.cs(), reference_cs(&other_epoch));
        let mut other_digest = config.clone();
        other_digest.started_at_ms += 1;
        assert_ne!(other_digest.cs(), cs);
        assert_eq!(other_digest.cs(), reference_cs(&other_digest));
    }

    #[test]
    fn with_exactly_3f_cs_plus_1_members_collisions_elect_everyone() {
        let mut collided = false;
        for epoch in 1..20 {
            let mut config = genesis(4, 1, 1);
            config.epoch = Epoch(epoch);
            let cs = config.cs();
            let mut sorted = cs.clone();
            sorted.sort();
            assert_eq!(sorted, (0..4).map(NodeId).collect::<Vec<_>>(), "{epoch}");
            assert_eq!(cs, reference_cs(&config));
            // Whether two points landed on one member: then a later slot took the next free one.
            let mut ring: Vec<(RingPoint, NodeId)> = config
                .members
                .iter()
                .map(|m| (RingPoint::of_node(m.id), m.id))
                .collect();
            ring.sort();
            let digest = config.digest();
            let landed: BTreeSet<NodeId> = (1..=4)
                .map(|i| {
                    let point = cs_point(i, config.epoch, &digest);
                    ring.iter()
                        .find(|(position, _)| *position >= point)
                        .unwrap_or(&ring[0])
                        .1
                })
                .collect();
            collided |= landed.len() < 4;
        }
        assert!(collided, "no epoch exercised a collision");

        // A CS as large as the membership in a bigger ring, too.
        let all = genesis(7, 1, 2);
        let mut cs = all.cs();
        cs.sort();
        assert_eq!(cs, (0..7).map(NodeId).collect::<Vec<_>>());
    }

    #[test]
    fn next_assigns_fresh_ids_and_never_reuses_one() {
        let first = genesis(7, 1, 1);
        let second = first
            .next(vec![joiner(10), joiner(11)], &[NodeId(2)], 3_601_000)
            .unwrap();
        assert_eq!(second.epoch, Epoch(2));
        let ids: Vec<u32> = second.members.iter().map(|m| m.id.0).collect();
        assert_eq!(ids, [0, 1, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            second.member(NodeId(7)).unwrap().address,
            joiner(10).address
        );
        assert_eq!(
            second.member(NodeId(8)).unwrap().address,
            joiner(11).address
        );
        assert_eq!(second.next_node_id, 9);
        assert_eq!(second.started_at_ms, 3_601_000);
        assert_eq!(
            (
                second.f,
                second.f_cs,
                second.authority,
                second.t_epoch_ms,
                second.stop_delta_ms
            ),
            (
                first.f,
                first.f_cs,
                first.authority,
                first.t_epoch_ms,
                first.stop_delta_ms
            )
        );

        // Node 2's principal comes back: under a new id, never under 2.
        let third = second.next(vec![joiner(2)], &[], 7_201_000).unwrap();
        assert!(third.member(NodeId(2)).is_none());
        assert_eq!(third.member(NodeId(9)).unwrap().address, joiner(2).address);
        assert_eq!(third.next_node_id, 10);
        // Even within one epoch: dropped and added again, it gets a new id.
        let again = first.next(vec![joiner(3)], &[NodeId(3)], 0).unwrap();
        assert!(again.member(NodeId(3)).is_none());
        assert_eq!(again.member(NodeId(7)).unwrap().address, joiner(3).address);

        assert!(matches!(
            first.next(vec![], &[NodeId(99)], 0),
            Err(ConfigurationError::NotAMember(NodeId(99)))
        ));
        assert!(matches!(
            first.next(vec![], &[NodeId(1), NodeId(1)], 0),
            Err(ConfigurationError::NotAMember(NodeId(1)))
        ));
        assert!(matches!(
            first.next(vec![], &(0..4).map(NodeId).collect::<Vec<_>>(), 0),
            Err(ConfigurationError::TooFewForGroups { members: 3, .. })
        ));
        assert!(matches!(
            first.next(vec![joiner(3)], &[], 0),
            Err(ConfigurationError::Members(
                PlacementError::SharedIdentity {
                    first: NodeId(3),
                    second: NodeId(7),
                    what: "an address"
                }
            ))
        ));
        let mut last_ids = first.clone();
        last_ids.next_node_id = u32::MAX;
        assert!(matches!(
            last_ids.next(vec![joiner(10)], &[], 0),
            Err(ConfigurationError::NodeIdsExhausted)
        ));
    }

    #[test]
    fn a_successor_with_2f_cs_plus_1_good_shares_verifies() {
        let prev = genesis(10, 1, 1);
        let next = prev
            .next(vec![joiner(20)], &[NodeId(3)], 3_601_000)
            .unwrap();
        let cs = prev.cs();
        assert_eq!(cs.len(), 4);
        assert_eq!(prev.cs_quorum(), 3);

        let cert = certify(&prev, &next, &cs[..3]);
        assert_eq!(verify_successor(&prev, &cert).unwrap(), next);
        let all = certify(&prev, &next, &cs);
        assert_eq!(verify_successor(&prev, &all).unwrap(), next);
        let mut reversed = all.clone();
        reversed.signatures.reverse();
        assert_eq!(verify_successor(&prev, &reversed).unwrap(), next);

        // It crosses the wire unchanged.
        let frame = wire::encode(&cert);
        assert_eq!(
            wire::decode::<ConfigCert>(&frame, CERT_BYTES_MAX).unwrap(),
            cert
        );
        assert!(!format!("{cert:?}").contains("\\x"), "{cert:?}");

        // Shares, one at a time.
        for &(signer, signature) in &all.signatures {
            assert!(ConfigCert::verify_share(
                &prev, signer, &all.bytes, &signature
            ));
            assert!(!ConfigCert::verify_share(
                &prev, signer, b"other", &signature
            ));
        }
        let outsider = prev
            .members
            .iter()
            .map(|m| m.id)
            .find(|id| !cs.contains(id))
            .unwrap();
        let share = ConfigCert::share(secret_of(&prev, outsider), &all.bytes);
        assert!(!ConfigCert::verify_share(
            &prev, outsider, &all.bytes, &share
        ));
        let (signer, signature) = all.signatures[0];
        let (other, _) = all.signatures[1];
        assert!(!ConfigCert::verify_share(
            &prev, other, &all.bytes, &signature
        ));
        assert!(ConfigCert::verify_share(
            &prev, signer, &all.bytes, &signature
        ));
    }

    #[test]
    fn too_few_duplicated_or_foreign_signers_are_refused() {
        let prev = genesis(10, 1, 1);
        let next = prev.next(vec![], &[NodeId(0)], 3_601_000).unwrap();
        let cs = prev.cs();
        let outsider = prev
            .members
            .iter()
            .map(|m| m.id)
            .find(|id| !cs.contains(id))
            .unwrap();

        assert!(matches!(
            verify_successor(&prev, &certify(&prev, &next, &cs[..2])),
            Err(CertError::TooFewSignatures { got: 2, needed: 3 })
        ));
        assert!(matches!(
            verify_successor(&prev, &certify(&prev, &next, &[])),
            Err(CertError::TooFewSignatures { got: 0, needed: 3 })
        ));
        // A signer counted twice would make a quorum of two.
        assert!(matches!(
            verify_successor(&prev, &certify(&prev, &next, &[cs[0], cs[1], cs[0]])),
            Err(CertError::DuplicateSigner(signer)) if signer == cs[0]
        ));
        // A member outside this epoch's CS, with a signature that is good in itself.
        assert!(matches!(
            verify_successor(&prev, &certify(&prev, &next, &[cs[0], cs[1], outsider])),
            Err(CertError::NotInCs { signer, epoch: Epoch(1) }) if signer == outsider
        ));
        // Even beside a full quorum: every entry must be good.
        assert!(matches!(
            verify_successor(&prev, &certify(&prev, &next, &[outsider, cs[0], cs[1], cs[2]])),
            Err(CertError::NotInCs { signer, .. }) if signer == outsider
        ));
        // Not a member at all.
        let mut stranger = certify(&prev, &next, &cs[..3]);
        stranger.signatures[1].0 = NodeId(999);
        assert!(matches!(
            verify_successor(&prev, &stranger),
            Err(CertError::NotInCs {
                signer: NodeId(999),
                ..
            })
        ));
        // More entries than the CS has replicas is refused before anything is decoded.
        let mut crowded = certify(&prev, &next, &cs);
        crowded.signatures.push(crowded.signatures[0]);
        crowded.bytes = Bytes::from_static(b"not even a configuration");
        assert!(matches!(
            verify_successor(&prev, &crowded),
            Err(CertError::TooManySignatures { got: 5, max: 4 })
        ));
    }

    #[test]
    fn a_forged_signature_is_refused_even_beside_a_quorum() {
        let prev = genesis(10, 1, 1);
        let next = prev.next(vec![joiner(20)], &[], 3_601_000).unwrap();
        let cs = prev.cs();
        let outsider = prev
            .members
            .iter()
            .map(|m| m.id)
            .find(|id| !cs.contains(id))
            .unwrap();

        // cs[3]'s slot signed by someone else's key.
        let mut forged = certify(&prev, &next, &cs);
        forged.signatures[3].1 = ConfigCert::share(secret_of(&prev, outsider), &forged.bytes);
        assert!(matches!(
            verify_successor(&prev, &forged),
            Err(CertError::BadSignature { signer }) if signer == cs[3]
        ));
        // A real signature by cs[1], over other bytes.
        let mut elsewhere = certify(&prev, &next, &cs);
        elsewhere.signatures[1].1 = ConfigCert::share(secret_of(&prev, cs[1]), b"other bytes");
        assert!(matches!(
            verify_successor(&prev, &elsewhere),
            Err(CertError::BadSignature { signer }) if signer == cs[1]
        ));
        // A real signature over the same bytes under another context.
        let mut context = certify(&prev, &next, &cs);
        context.signatures[2].1 =
            secret_of(&prev, cs[2]).sign(Context::new("bulwark.test.other"), &context.bytes);
        assert!(matches!(
            verify_successor(&prev, &context),
            Err(CertError::BadSignature { signer }) if signer == cs[2]
        ));
        // Bytes changed after signing (another valid configuration).
        let mut tampered = certify(&prev, &next, &cs[..3]);
        let mut other = next.clone();
        other.started_at_ms += 1;
        tampered.bytes = Bytes::from(other.encode());
        assert!(matches!(
            verify_successor(&prev, &tampered),
            Err(CertError::BadSignature { signer }) if signer == cs[0]
        ));
        // Garbage that the CS never signed is malformed before any signature is checked.
        let mut garbage = certify(&prev, &next, &cs[..3]);
        garbage.bytes = Bytes::from_static(&[0xff; 16]);
        assert!(matches!(
            verify_successor(&prev, &garbage),
            Err(CertError::Malformed(ConfigurationError::Undecodable(_)))
        ));
    }

    #[test]
    fn certificates_for_the_wrong_epoch_are_refused() {
        let first = genesis(10, 1, 1);
        let second = first.next(vec![joiner(20)], &[], 3_601_000).unwrap();
        let third = second.next(vec![], &[NodeId(4)], 7_201_000).unwrap();
        let to_second = certify(&first, &second, &first.cs()[..3]);
        let to_third = certify(&second, &third, &second.cs()[..3]);
        verify_successor(&first, &to_second).unwrap();
        verify_successor(&second, &to_third).unwrap();

        // Skipping an epoch: e+2 offered on e.
        assert!(matches!(
            verify_successor(&first, &to_third),
            Err(CertError::WrongEpoch {
                expected: Epoch(2),
                got: Epoch(3)
            })
        ));
        // Replaying the certificate of epoch e on e.
        assert!(matches!(
            verify_successor(&second, &to_second),
            Err(CertError::WrongEpoch {
                expected: Epoch(3),
                got: Epoch(2)
            })
        ));
        // A configuration certified as its own successor.
        let itself = certify(&first, &first, &first.cs()[..3]);
        assert!(matches!(
            verify_successor(&first, &itself),
            Err(CertError::WrongEpoch {
                expected: Epoch(2),
                got: Epoch(1)
            })
        ));
    }

    #[test]
    fn a_certificate_signed_by_the_cs_of_another_epoch_is_refused() {
        let first = genesis(10, 1, 1);
        let second = first.next(vec![joiner(20)], &[], 3_601_000).unwrap();
        let (old, new) = (first.cs(), second.cs());
        // Epoch 2's CS certifies epoch 3, not epoch 2: its members outside epoch 1's CS do not
        // count for epoch 2.
        let mut signers: Vec<NodeId> = new.clone();
        signers.sort_by_key(|id| old.contains(id));
        let stranger = signers[0];
        assert!(
            !old.contains(&stranger),
            "the CS did not move: {old:?} {new:?}"
        );
        let bytes = Bytes::from(second.encode());
        let cert = ConfigCert {
            signatures: signers[..3]
                .iter()
                .map(|&id| (id, ConfigCert::share(secret_of(&second, id), &bytes)))
                .collect(),
            bytes,
        };
        assert!(matches!(
            verify_successor(&first, &cert),
            Err(CertError::NotInCs { signer, epoch: Epoch(1) }) if signer == stranger
        ));
    }

    #[test]
    fn a_chain_verifies_epoch_by_epoch_as_the_cs_moves() {
        let c1 = genesis(10, 1, 1);
        let c2 = c1.next(vec![joiner(20)], &[NodeId(0)], 3_601_000).unwrap();
        let c3 = c2.next(vec![], &[NodeId(5)], 7_201_000).unwrap();
        let c4 = c3
            .next(vec![joiner(21), joiner(22)], &[NodeId(1)], 10_801_000)
            .unwrap();
        let chain = [&c1, &c2, &c3, &c4];
        let certs: Vec<ConfigCert> = chain
            .windows(2)
            .map(|pair| {
                let cs = pair[0].cs();
                // A different 2f_cs+1 of each CS: the last three.
                certify(pair[0], pair[1], &cs[1..])
            })
            .collect();
        let css: Vec<BTreeSet<NodeId>> =
            chain.iter().map(|c| c.cs().into_iter().collect()).collect();
        assert!(
            css.windows(2).all(|pair| pair[0] != pair[1]),
            "the CS stayed put: {css:?}"
        );

        assert_eq!(verify_chain(&c1, &certs).unwrap(), c4);
        assert_eq!(verify_chain(&c1, &certs[..2]).unwrap(), c3);
        assert_eq!(verify_chain(&c1, &[]).unwrap(), c1);
        // A missing link.
        assert!(matches!(
            verify_chain(&c1, &[certs[0].clone(), certs[2].clone()]),
            Err(CertError::WrongEpoch {
                expected: Epoch(3),
                got: Epoch(4)
            })
        ));
        // Out of order.
        assert!(matches!(
            verify_chain(&c1, &[certs[1].clone(), certs[0].clone()]),
            Err(CertError::WrongEpoch {
                expected: Epoch(2),
                got: Epoch(3)
            })
        ));
        // A genesis that does not validate trusts nothing.
        let mut broken = c1.clone();
        broken.epoch = Epoch(0);
        assert!(matches!(
            verify_chain(&broken, &certs),
            Err(CertError::Malformed(ConfigurationError::EpochZero))
        ));
    }

    #[test]
    fn a_delta_rebuilds_the_signed_configuration_on_its_own_base_only() {
        let prev = genesis(10, 1, 1);
        let next = prev
            .next(
                vec![joiner(20), joiner(21)],
                &[NodeId(3), NodeId(7)],
                3_601_000,
            )
            .unwrap();
        let cert = certify(&prev, &next, &prev.cs()[..3]);
        let delta = ConfigDelta::between(&prev, &next, cert.signatures.clone()).unwrap();
        assert_eq!(delta.epoch, Epoch(2));
        assert_eq!(delta.dropped, [NodeId(3), NodeId(7)]);
        let added: Vec<NodeId> = delta.added.iter().map(|m| m.id).collect();
        assert_eq!(added, [NodeId(10), NodeId(11)]);
        assert_eq!(delta.apply(&prev).unwrap(), cert);
        assert_eq!(delta.verify(&prev).unwrap(), next);
        assert!(wire::encode(&delta).len() * 2 < wire::encode(&cert).len());
        let frame = wire::encode(&delta);
        assert_eq!(
            wire::decode::<ConfigDelta>(&frame, DELTA_BYTES_MAX).unwrap(),
            delta
        );

        // Applied to its own result: the wrong epoch.
        assert!(matches!(
            delta.apply(&next),
            Err(CertError::WrongEpoch {
                expected: Epoch(3),
                got: Epoch(2)
            })
        ));
        // A base without a node the delta drops.
        let mut without = prev.clone();
        without.members.retain(|m| m.id != NodeId(7));
        assert!(matches!(
            delta.apply(&without),
            Err(CertError::NotInBase(NodeId(7)))
        ));
        // Too large to look at.
        let mut huge = delta.clone();
        huge.dropped = vec![NodeId(0); MEMBERS_MAX + 1];
        assert!(matches!(
            huge.apply(&prev),
            Err(CertError::DeltaTooLarge { .. })
        ));

        // A successor that changes what deltas do not carry goes as a full certificate.
        let mut reparametrised = next.clone();
        reparametrised.f_cs = 2;
        assert!(ConfigDelta::between(&prev, &reparametrised, vec![]).is_none());
        // A member whose entry changed is dropped and added again, so the delta still rebuilds.
        let mut readdressed = next.clone();
        readdressed.members[0].address = SocketAddr::from(([192, 0, 2, 1], 7000));
        let delta = ConfigDelta::between(&prev, &readdressed, vec![]).unwrap();
        assert!(delta.dropped.contains(&NodeId(0)));
        assert_eq!(delta.apply(&prev).unwrap().bytes, readdressed.encode());
    }

    #[test]
    fn a_delta_on_a_wrong_base_or_forged_fails_its_signatures() {
        // With exactly 3f_cs+1 members every base of these ids has the same CS, so a wrong base
        // gets past the signer checks and fails on the signatures themselves.
        let prev = genesis(4, 1, 1);
        let next = prev.next(vec![joiner(20)], &[], 3_601_000).unwrap();
        let cs = prev.cs();
        let cert = certify(&prev, &next, &cs[..3]);
        let delta = ConfigDelta::between(&prev, &next, cert.signatures.clone()).unwrap();
        assert_eq!(delta.verify(&prev).unwrap(), next);

        let mut wrong = prev.clone();
        wrong.members[2].address = SocketAddr::from(([192, 0, 2, 1], 7000));
        let mut wrong_cs = wrong.cs();
        wrong_cs.sort();
        assert_eq!(wrong_cs, (0..4).map(NodeId).collect::<Vec<_>>());
        let rebuilt = delta.apply(&wrong).unwrap();
        assert_ne!(rebuilt.bytes, cert.bytes);
        assert!(matches!(
            verify_successor(&wrong, &rebuilt),
            Err(CertError::BadSignature { signer }) if signer == cs[0]
        ));

        // A forged delta on the right base: an extra member, or another start time.
        let mut smuggled = delta.clone();
        smuggled.added.push(joiner(30).with_id(NodeId(5)));
        smuggled.next_node_id = 6;
        assert!(matches!(
            smuggled.verify(&prev),
            Err(CertError::BadSignature { .. })
        ));
        let mut early = delta.clone();
        early.started_at_ms -= 1;
        assert!(matches!(
            early.verify(&prev),
            Err(CertError::BadSignature { .. })
        ));
        // Adding an id the base still holds rebuilds a configuration no one could sign.
        let mut clash = delta;
        clash.added[0].id = NodeId(1);
        assert!(matches!(
            clash.verify(&prev),
            Err(CertError::Malformed(ConfigurationError::Members(
                PlacementError::DuplicateId(NodeId(1))
            )))
        ));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..2048),
        ) {
            if let Ok(config) = Configuration::decode(&bytes) {
                prop_assert_eq!(config.encode(), bytes);
            }
        }

        #[test]
        fn a_damaged_encoding_is_refused_or_canonical(
            flips in prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..4),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = genesis(7, 1, 1).encode();
            for (at, mask) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= mask;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len()));
            }
            if let Ok(config) = Configuration::decode(&bytes) {
                prop_assert!(config.validate().is_ok());
                prop_assert_eq!(config.encode(), bytes);
            }
        }

        #[test]
        fn verifying_arbitrary_certificates_and_deltas_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            signatures in prop::collection::vec((0..12u32, any::<[u8; 32]>()), 0..6),
            dropped in prop::collection::vec(0..12u32, 0..4),
            epoch in 0..4u64,
        ) {
            let prev = genesis(10, 1, 1);
            let signatures: Vec<(NodeId, Signature)> = signatures
                .into_iter()
                .map(|(id, half)| {
                    let mut signature = [0; 64];
                    signature[..32].copy_from_slice(&half);
                    (NodeId(id), Signature(signature))
                })
                .collect();
            let cert = ConfigCert { bytes: Bytes::from(bytes), signatures: signatures.clone() };
            prop_assert!(verify_successor(&prev, &cert).is_err());
            prop_assert!(verify_chain(&prev, &[cert]).is_err());
            let delta = ConfigDelta {
                epoch: Epoch(epoch),
                added: vec![],
                dropped: dropped.into_iter().map(NodeId).collect(),
                started_at_ms: 0,
                next_node_id: 10,
                signatures,
            };
            prop_assert!(delta.verify(&prev).is_err());
        }
    }
}
