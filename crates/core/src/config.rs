//! The cluster configuration: who the nodes are, how to reach them, which keys they hold, and
//! which clients may read or write.
//!
//! It is public (every node and client has the same `cluster.toml`); secrets live in per-node and
//! per-client files beside it. Parsing names the offending field, and validation rejects anything a
//! node could not safely serve (a wrong `n`, duplicate ids, unparsable addresses or keys).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::crypto::MacKey;
use crate::ids::{ClientId, NodeId};

/// The SHA-like fingerprint of a TLS certificate that pins an identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of_certificate(der: &[u8]) -> Fingerprint {
        Fingerprint(crate::crypto::Digest::of("bulwark.transport.cert", der).0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &hex::encode(self.0)[..12])
    }
}

impl FromStr for Fingerprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_hex32(s).map(Fingerprint)
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A 32-byte secret written as 64 hex digits.
pub fn parse_hex32(s: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(s.trim()).map_err(|e| format!("not hex: {e}"))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("expected 32 bytes (64 hex digits), got {}", b.len()))
}

/// Serde helper for MAC keys as hex strings.
pub mod hex_key {
    use super::*;
    /// Serialises as hex.
    pub fn serialize<S: serde::Serializer>(key: &MacKey, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(key.0))
    }
    /// Parses hex.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<MacKey, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_hex32(&text)
            .map(MacKey)
            .map_err(serde::de::Error::custom)
    }
}

/// A register protocol. A cluster serves all of them at once; each volume picks one, and the
/// cluster's default volume uses the one `cluster.toml` names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// M-PoWerStore: `3f+1` nodes, Byzantine faults.
    #[default]
    PowerStore,
    /// Multi-writer ABD, the crash-tolerant baseline: `2f+1` nodes, crash faults only.
    Abd,
    /// The Phalanx-style baseline with writer signatures: `3f+1` nodes, Byzantine faults.
    Phalanx,
}

impl Protocol {
    /// Every protocol, in the order they are listed to users.
    pub const ALL: [Protocol; 3] = [Protocol::PowerStore, Protocol::Abd, Protocol::Phalanx];

    /// The group size tolerating `f` faults.
    pub fn nodes(self, f: usize) -> usize {
        match self {
            Protocol::PowerStore | Protocol::Phalanx => 3 * f + 1,
            Protocol::Abd => 2 * f + 1,
        }
    }

    /// The name used in `cluster.toml` and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::PowerStore => "powerstore",
            Protocol::Abd => "abd",
            Protocol::Phalanx => "phalanx",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown protocol {s:?} (powerstore, abd or phalanx)"))
    }
}

/// Serde helper for 32-byte keys as hex strings.
pub mod hex32 {
    use super::*;
    /// Serialises as hex.
    pub fn serialize<S: serde::Serializer>(
        key: &[u8; 32],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(key))
    }
    /// Parses hex.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<[u8; 32], D::Error> {
        parse_hex32(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Serde helper for optional 32-byte keys as hex strings.
pub mod hex32_opt {
    use super::*;
    /// Serialises as hex.
    pub fn serialize<S: serde::Serializer>(
        key: &Option<[u8; 32]>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match key {
            Some(key) => serializer.serialize_some(&hex::encode(key)),
            None => serializer.serialize_none(),
        }
    }
    /// Parses hex.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<[u8; 32]>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| parse_hex32(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The most nodes one configuration may list.
pub const NODES_MAX: usize = 1024;

/// `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The protocol of the default volume (objects written without `--volume`); PoWerStore when
    /// absent.
    #[serde(default)]
    pub protocol: Protocol,
    /// Faults tolerated per replica group: each group has `3f+1` members (an ABD volume uses
    /// the first `2f+1` of them), and a cluster of more nodes has more groups.
    pub f: usize,
    /// The configuration epoch (Rosebud); 0 for static membership.
    #[serde(default)]
    pub epoch: u64,
    /// The storage nodes, in id order.
    pub nodes: Vec<NodeEntry>,
    /// The clients allowed to connect.
    pub clients: Vec<ClientEntry>,
    /// The configuration service and the genesis configuration it starts from; absent in a
    /// cluster with a fixed membership.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_service: Option<ConfigurationService>,
}

/// `[configuration_service]`: what the genesis configuration (epoch 1) holds beyond the nodes
/// (Rosebud §3): the CS's fault bound, the trusted authority, and the epoch's timing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigurationService {
    /// Faults the configuration service tolerates: it runs on `3 f_cs + 1` of the nodes.
    pub f_cs: u32,
    /// The Ed25519 public key of the trusted authority that signs ADD and REVOKE orders.
    #[serde(with = "hex32")]
    pub authority: [u8; 32],
    /// How long an epoch lasts, in milliseconds (`t_epoch`).
    pub epoch_ms: u64,
    /// How far CS replicas' clocks may disagree on when an epoch ends, in milliseconds (the STOP
    /// tolerance).
    pub stop_tolerance_ms: u64,
    /// When epoch 1 began, in milliseconds since the Unix epoch.
    pub genesis_ms: u64,
    /// How often each CS replica pings every member, in milliseconds (Rosebud §3.3).
    #[serde(default = "ping_cycle_default")]
    pub ping_cycle_ms: u64,
    /// Missed pings in a row before a CS replica proposes to evict a member.
    #[serde(default = "evict_after_default")]
    pub evict_after: u32,
    /// Missed pings in a row before a CS replica agrees to another's proposal (fewer than
    /// `evict_after`), and answered ones before a suspect is cleared.
    #[serde(default = "agree_after_default")]
    pub agree_after: u32,
    /// How often a client confirms with the CS that its configuration is current (`T_contact`),
    /// in milliseconds.
    #[serde(default = "contact_default")]
    pub contact_ms: u64,
    /// How long past that a client keeps trying before it stops serving operations
    /// (`δ_contact`), in milliseconds.
    #[serde(default = "contact_grace_default")]
    pub contact_grace_ms: u64,
    /// The agreement core: `"pbft"` (`3 f_cs + 1` replicas) or `"a2m-pbft-ea"` (`2 f_cs + 1`,
    /// every node with a trusted log).
    #[serde(default, with = "cs_protocol_name")]
    pub protocol: crate::configuration::CsProtocol,
}

/// [`crate::configuration::CsProtocol`] in `cluster.toml`, by name.
mod cs_protocol_name {
    use crate::configuration::CsProtocol;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(protocol: &CsProtocol, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(protocol.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<CsProtocol, D::Error> {
        let name = String::deserialize(from)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

fn contact_default() -> u64 {
    24 * 60 * 60 * 1000
}

fn contact_grace_default() -> u64 {
    60_000
}

fn ping_cycle_default() -> u64 {
    60_000
}

fn evict_after_default() -> u32 {
    5
}

fn agree_after_default() -> u32 {
    3
}

/// One node in `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// The node's id: global and stable, whatever its position in any group.
    pub id: u32,
    /// Where clients reach it.
    pub address: SocketAddr,
    /// Where it serves Prometheus metrics, if anywhere.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Its pinned TLS certificate.
    pub fingerprint: Fingerprint,
    /// The Ed25519 public key it signs with (proofs of what it said, configurations).
    #[serde(with = "hex32")]
    pub signing_key: [u8; 32],
    /// The public key of its trusted log (`bulwark a2m init` prints it), if it has one: the
    /// attestations its volumes' clients accept are signed by this key alone.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex32_opt")]
    pub a2m_key: Option<[u8; 32]>,
}

/// One client in `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// The client's id: global and stable (writers' timestamps are ordered by it).
    pub id: u32,
    /// A unique name.
    pub name: String,
    /// Its pinned TLS certificate.
    pub fingerprint: Fingerprint,
    /// May write.
    #[serde(default)]
    pub write: bool,
    /// May read.
    #[serde(default = "yes")]
    pub read: bool,
    /// The Ed25519 public key a Phalanx writer signs its versions with.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex32_opt")]
    pub signing_key: Option<[u8; 32]>,
}

fn yes() -> bool {
    true
}

/// A configuration that cannot be served, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// TOML or a field's value did not parse; the message names the field and line.
    #[error("{file}: {message}")]
    Parse {
        /// Which file.
        file: String,
        /// What toml said.
        message: String,
    },
    /// The configuration parsed but is not usable.
    #[error("{file}: field `{field}`: {problem}")]
    Invalid {
        /// Which file.
        file: String,
        /// The field.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

impl ClusterConfig {
    /// The Ed25519 keys `members` sign with, in order: what their signed statements are checked
    /// against. Fails naming the first member that is not here or whose key is not one.
    pub fn signing_keys(
        &self,
        members: &[NodeId],
    ) -> Result<std::sync::Arc<[crate::sign::PublicKey]>, String> {
        members
            .iter()
            .map(|node| {
                let entry = self
                    .nodes
                    .iter()
                    .find(|entry| entry.id == node.0)
                    .ok_or_else(|| format!("{node} is not in cluster.toml"))?;
                crate::sign::PublicKey::from_bytes(&entry.signing_key)
                    .map_err(|error| format!("{node}'s signing key: {error}"))
            })
            .collect()
    }

    /// Parses and validates `cluster.toml`'s text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ClusterConfig, ConfigError> {
        let config: ClusterConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        config.validate(file)?;
        Ok(config)
    }

    /// The TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| unreachable!("config serialises: {e}"))
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, problem: String| ConfigError::Invalid {
            file: file.to_string(),
            field: field.to_string(),
            problem,
        };
        if self.f == 0 {
            return Err(invalid("f", "must be at least 1".into()));
        }
        if self.f > 20 {
            return Err(invalid(
                "f",
                format!("{} is more than this version supports (20)", self.f),
            ));
        }
        let group = 3 * self.f + 1;
        if self.nodes.len() < group {
            return Err(invalid(
                "nodes",
                format!(
                    "f = {} needs at least {group} nodes (one replica group), found {}",
                    self.f,
                    self.nodes.len()
                ),
            ));
        }
        if self.nodes.len() > NODES_MAX {
            return Err(invalid(
                "nodes",
                format!(
                    "{} is more than this version supports ({NODES_MAX})",
                    self.nodes.len()
                ),
            ));
        }
        for (index, node) in self.nodes.iter().enumerate() {
            if self.nodes[..index].iter().any(|other| other.id == node.id) {
                return Err(invalid(
                    &format!("nodes[{index}].id"),
                    format!("{} is used twice", node.id),
                ));
            }
            if let Err(error) = crate::sign::PublicKey::from_bytes(&node.signing_key) {
                return Err(invalid(
                    &format!("nodes[{index}].signing_key"),
                    error.to_string(),
                ));
            }
        }
        for (i, a) in self.nodes.iter().enumerate() {
            if self.nodes[..i].iter().any(|b| b.address == a.address) {
                return Err(invalid(
                    &format!("nodes[{i}].address"),
                    format!("{} is used twice", a.address),
                ));
            }
            if self.nodes[..i]
                .iter()
                .any(|b| b.fingerprint == a.fingerprint)
            {
                return Err(invalid(
                    &format!("nodes[{i}].fingerprint"),
                    "used twice".into(),
                ));
            }
        }
        if self.clients.is_empty() {
            return Err(invalid("clients", "no client could connect".into()));
        }
        for (i, client) in self.clients.iter().enumerate() {
            if self.protocol == Protocol::Phalanx && client.write && client.signing_key.is_none() {
                return Err(invalid(
                    &format!("clients[{i}].signing_key"),
                    format!(
                        "writer {:?} of a phalanx cluster needs an Ed25519 public key",
                        client.name
                    ),
                ));
            }
        }
        if let Some(cs) = &self.configuration_service {
            self.genesis()?;
            if cs.agree_after == 0 || cs.agree_after >= cs.evict_after || cs.ping_cycle_ms == 0 {
                return Err(invalid(
                    "configuration_service.agree_after",
                    format!(
                        "must be at least 1 and below evict_after ({}), with a positive ping_cycle_ms",
                        cs.evict_after
                    ),
                ));
            }
        }
        for (i, client) in self.clients.iter().enumerate() {
            if client.name.is_empty() || client.name.len() > 64 {
                return Err(invalid(
                    &format!("clients[{i}].name"),
                    "must be 1 to 64 characters".into(),
                ));
            }
            if self.clients[..i].iter().any(|c| c.id == client.id) {
                return Err(invalid(
                    &format!("clients[{i}].id"),
                    format!("{} is used twice", client.id),
                ));
            }
            if self.clients[..i].iter().any(|c| c.name == client.name) {
                return Err(invalid(
                    &format!("clients[{i}].name"),
                    format!("{:?} is used twice", client.name),
                ));
            }
            if self.clients[..i]
                .iter()
                .any(|c| c.fingerprint == client.fingerprint)
            {
                return Err(invalid(
                    &format!("clients[{i}].fingerprint"),
                    "used twice".into(),
                ));
            }
        }
        Ok(())
    }

    /// `n`.
    pub fn n(&self) -> usize {
        self.nodes.len()
    }

    /// The client with `name`, and its id.
    pub fn client(&self, name: &str) -> Option<(ClientId, &ClientEntry)> {
        self.clients
            .iter()
            .find(|c| c.name == name)
            .map(|c| (ClientId(c.id), c))
    }

    /// The client with `fingerprint`, and its id.
    pub fn client_by_fingerprint(
        &self,
        fingerprint: &Fingerprint,
    ) -> Option<(ClientId, &ClientEntry)> {
        self.clients
            .iter()
            .find(|c| c.fingerprint == *fingerprint)
            .map(|c| (ClientId(c.id), c))
    }

    /// The node with `id`.
    pub fn node(&self, id: NodeId) -> Option<&NodeEntry> {
        self.nodes.iter().find(|node| node.id == id.0)
    }

    /// The node with `id` and its position in [`ClusterConfig::nodes`] (which orders per-node
    /// secrets such as a writer's MAC keys).
    pub fn node_position(&self, id: NodeId) -> Option<usize> {
        self.nodes.iter().position(|node| node.id == id.0)
    }

    /// The nodes as members: identity, address, certificate and signing key.
    pub fn members(&self) -> Result<Vec<crate::membership::Member>, ConfigError> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let signing_key =
                    crate::sign::PublicKey::from_bytes(&node.signing_key).map_err(|error| {
                        ConfigError::Invalid {
                            file: "cluster.toml".into(),
                            field: format!("nodes[{index}].signing_key"),
                            problem: error.to_string(),
                        }
                    })?;
                let trusted_key = node
                    .a2m_key
                    .map(|key| crate::sign::PublicKey::from_bytes(&key))
                    .transpose()
                    .map_err(|error| ConfigError::Invalid {
                        file: "cluster.toml".into(),
                        field: format!("nodes[{index}].a2m_key"),
                        problem: error.to_string(),
                    })?;
                Ok(crate::membership::Member {
                    id: NodeId(node.id),
                    address: node.address,
                    fingerprint: node.fingerprint,
                    signing_key,
                    trusted_key,
                })
            })
            .collect()
    }

    /// The trusted authority's key, if `[configuration_service]` names a valid one.
    pub fn authority(&self) -> Option<crate::sign::PublicKey> {
        let cs = self.configuration_service.as_ref()?;
        crate::sign::PublicKey::from_bytes(&cs.authority).ok()
    }

    /// The genesis configuration (epoch 1) the configuration service starts from: every node,
    /// with `[configuration_service]`'s parameters. `None` for a fixed membership.
    pub fn genesis(&self) -> Result<Option<crate::configuration::Configuration>, ConfigError> {
        let Some(cs) = &self.configuration_service else {
            return Ok(None);
        };
        let invalid = |field: &str, problem: String| ConfigError::Invalid {
            file: "cluster.toml".into(),
            field: format!("configuration_service.{field}"),
            problem,
        };
        let authority = crate::sign::PublicKey::from_bytes(&cs.authority)
            .map_err(|error| invalid("authority", error.to_string()))?;
        let f = u32::try_from(self.f).map_err(|_| invalid("f", "too large".into()))?;
        crate::configuration::Configuration::genesis(
            self.members()?,
            f,
            cs.f_cs,
            authority,
            cs.epoch_ms,
            cs.stop_tolerance_ms,
            cs.genesis_ms,
        )
        .and_then(|genesis| genesis.with_cs_protocol(cs.protocol))
        .map(Some)
        .map_err(|error| invalid("f_cs", error.to_string()))
    }

    /// Where every key is stored: the replica groups of this configuration, by consistent
    /// hashing of the members.
    pub fn placement(&self) -> Result<crate::membership::Placement, ConfigError> {
        crate::membership::Placement::new(
            crate::Epoch(self.epoch),
            crate::membership::PlacementParams::new(self.f),
            self.members()?,
        )
        .map_err(|error| ConfigError::Invalid {
            file: "cluster.toml".into(),
            field: "nodes".into(),
            problem: error.to_string(),
        })
    }
}

/// A node's secrets: `node.toml` in its own directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSecrets {
    /// Which node this is.
    pub id: u32,
    /// The seed of the node's Ed25519 signing key (its public half is in `cluster.toml`, or in
    /// the certified configuration that added it). The MAC keys it shares with PoWerStore
    /// writers are agreed from it and theirs.
    #[serde(with = "hex32")]
    pub signing_key: [u8; 32],
    /// Where a node that joined after the genesis listens (`bulwark node join`); the nodes of
    /// `cluster.toml` listen at their entry there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
    /// The socket of the node's trusted log (`bulwark a2m serve`), when `cluster.toml` names
    /// one for it; a relative path is taken from the node's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2m_socket: Option<std::path::PathBuf>,
}

/// A client's secrets: `client.toml` in its own directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSecrets {
    /// Which client this is.
    pub name: String,
    /// `k_W`: writers only. Readers hold no MAC keys (PoWerStore §1.3).
    #[serde(default)]
    pub writer: Option<WriterSecrets>,
    /// A writer's Ed25519 secret key; its public half is in `cluster.toml`. Phalanx writers sign
    /// with it, and PoWerStore writers agree the MAC key they share with each node from it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex32_opt")]
    pub signing_key: Option<[u8; 32]>,
    /// The seed of the trusted authority's key, for the administrator who orders ADD and REVOKE;
    /// its public half is `configuration_service.authority` in `cluster.toml`.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex32_opt")]
    pub authority_key: Option<[u8; 32]>,
}

/// The MAC key writers share, and nothing else: a writer's key with each node is agreed from
/// its signing key, so that nodes that join later need no secret from it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriterSecrets {
    /// `k_W`.
    #[serde(with = "hex_key")]
    pub timestamp_key: MacKey,
}

/// Parses a secrets file, naming the file and field on error.
pub fn parse_secrets<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClusterConfig {
        ClusterConfig {
            protocol: Protocol::PowerStore,
            f: 1,
            epoch: 0,
            nodes: (0..4)
                .map(|i| NodeEntry {
                    id: i,
                    address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                    metrics: None,
                    fingerprint: Fingerprint([i as u8; 32]),
                    signing_key: crate::sign::SecretKey::from_seed(&[i as u8 + 1; 32])
                        .public_key()
                        .to_bytes(),
                    a2m_key: None,
                })
                .collect(),
            clients: vec![ClientEntry {
                id: 0,
                name: "admin".into(),
                fingerprint: Fingerprint([9; 32]),
                write: true,
                read: true,
                signing_key: None,
            }],
            configuration_service: Some(ConfigurationService {
                f_cs: 1,
                authority: crate::sign::SecretKey::from_seed(&[42; 32])
                    .public_key()
                    .to_bytes(),
                epoch_ms: 60_000,
                stop_tolerance_ms: 1_000,
                genesis_ms: 1_700_000_000_000,
                ping_cycle_ms: 1_000,
                evict_after: 5,
                agree_after: 3,
                contact_ms: 60_000,
                contact_grace_ms: 5_000,
                protocol: crate::configuration::CsProtocol::Pbft,
            }),
        }
    }

    #[test]
    fn the_configuration_service_section_gives_the_genesis_and_is_checked() {
        let config = sample();
        let genesis = config.genesis().unwrap().expect("a configuration service");
        assert_eq!(genesis.epoch, crate::configuration::GENESIS_EPOCH);
        assert_eq!(genesis.members.len(), 4);
        assert_eq!(genesis.cs().len(), 4);
        assert_eq!(genesis.started_at_ms, 1_700_000_000_000);

        let mut too_many = sample();
        too_many.configuration_service.as_mut().unwrap().f_cs = 2;
        let error = ClusterConfig::parse(&too_many.to_toml(), "c").unwrap_err();
        assert!(
            error.to_string().contains("configuration_service.f_cs"),
            "{error}"
        );

        let mut short = sample();
        short.configuration_service.as_mut().unwrap().epoch_ms = 1_500;
        assert!(
            ClusterConfig::parse(&short.to_toml(), "c").is_err(),
            "an epoch within twice the tolerance"
        );

        let mut fixed = sample();
        fixed.configuration_service = None;
        assert!(fixed.genesis().unwrap().is_none());
        assert!(!fixed.to_toml().contains("configuration_service"));
    }

    #[test]
    fn round_trips_through_toml() {
        let config = sample();
        assert_eq!(
            ClusterConfig::parse(&config.to_toml(), "c").unwrap(),
            config
        );
    }

    #[test]
    fn errors_name_the_field() {
        let mut config = sample();
        config.nodes.pop();
        let error = ClusterConfig::parse(&config.to_toml(), "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("field `nodes`") && error.contains("needs at least 4"),
            "{error}"
        );

        let mut config = sample();
        config.nodes[2].id = 0;
        let error = ClusterConfig::parse(&config.to_toml(), "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains("nodes[2].id"), "{error}");

        let text = sample()
            .to_toml()
            .replacen("fingerprint = \"", "fingerprint = \"zz", 1);
        let error = ClusterConfig::parse(&text, "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("fingerprint") && error.contains("not hex"),
            "{error}"
        );

        let text = sample()
            .to_toml()
            .replace("protocol = \"powerstore\"", "protocol = \"paxos\"");
        let error = ClusterConfig::parse(&text, "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("protocol") && error.contains("paxos"),
            "{error}"
        );

        // Any protocol's default volume lives in groups of 3f+1 (ABD uses 2f+1 of each), and a
        // cluster may have more nodes than one group: it then has more groups.
        let mut abd = sample();
        abd.protocol = Protocol::Abd;
        assert_eq!(ClusterConfig::parse(&abd.to_toml(), "c").unwrap(), abd);
        let mut seven = sample();
        for i in 4..7 {
            let mut node = seven.nodes[0].clone();
            node.id = i;
            node.address = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
            node.fingerprint = Fingerprint([i as u8; 32]);
            seven.nodes.push(node);
        }
        assert!(
            ClusterConfig::parse(&seven.to_toml(), "c")
                .unwrap_err()
                .to_string()
                .contains("signing key"),
            "the genesis configuration refuses two nodes with one signing key"
        );
        seven.configuration_service = None;
        assert_eq!(ClusterConfig::parse(&seven.to_toml(), "c").unwrap(), seven);
        assert!(seven.placement().is_err(), "two nodes share a signing key");

        // A Phalanx writer must have a public key.
        let mut phalanx = sample();
        phalanx.protocol = Protocol::Phalanx;
        let error = ClusterConfig::parse(&phalanx.to_toml(), "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains("clients[0].signing_key"), "{error}");
        phalanx.clients[0].signing_key = Some([7; 32]);
        assert_eq!(
            ClusterConfig::parse(&phalanx.to_toml(), "c").unwrap(),
            phalanx
        );
        let text = phalanx.to_toml().replace(&hex::encode([7u8; 32]), "abcd");
        let error = ClusterConfig::parse(&text, "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains("signing_key"), "{error}");

        // A configuration written before protocols were selectable is PoWerStore.
        let text = sample()
            .to_toml()
            .replace("protocol = \"powerstore\"\n", "");
        assert_eq!(
            ClusterConfig::parse(&text, "c").unwrap().protocol,
            Protocol::PowerStore
        );

        let text = sample().to_toml().replace("f = 1", "f = 1\nreplicas = 3");
        let error = ClusterConfig::parse(&text, "cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains("replicas"), "{error}");
    }
}
