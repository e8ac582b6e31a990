//! The node's own service ([`ServiceId::SYSTEM`](bulwark_core::ServiceId::SYSTEM)): what a client
//! asks a node about itself rather than about data. Protocol frames carry their own service in
//! the envelope header; this module only holds the node's status.

use crate::cs::EvictVote;
use crate::cs::monitor::{Ping, Pong};
use crate::machine::ReplicaStats;
use bulwark_core::configuration::{ConfigCert, ConfigDelta};
use bulwark_core::sign::Unverified;
use bulwark_core::{Epoch, NodeId};
use serde::{Deserialize, Serialize};

/// Certificates sent in one answer at most; a peer further behind asks again.
pub const CERTS_PER_ANSWER: usize = 16;

/// The encoded certificates one answer carries at most, beyond its first: what leaves room in a
/// frame for the envelope. Sixteen certificates of a large configuration would not fit one
/// frame; an answer stops at this many bytes (one certificate always fits alone).
pub const CERT_ANSWER_BYTES_MAX: usize = bulwark_core::wire::FRAME_BYTES_MAX - 64 * 1024;

const _: () = assert!(bulwark_core::configuration::CERT_BYTES_MAX <= CERT_ANSWER_BYTES_MAX);

/// Content-hash objects one listing names at most.
pub const CONTENT_OBJECTS_PER_ANSWER: usize = 1024;

/// A request to the node itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SystemRequest {
    /// Asks for [`NodeStatus`].
    Status,
    /// Asks for the certified configurations after epoch `after`, oldest first.
    Configuration {
        /// The last epoch the asker holds.
        after: u64,
    },
    /// A freshness challenge for a CS replica of the current epoch (Rosebud §3.8).
    Fresh {
        /// The client's nonce.
        nonce: u64,
    },
    /// Asks a CS replica of `epoch` for its signed agreement to evict `node`: given only if its
    /// own monitoring finds `node` unresponsive (Rosebud §3.3), so asking proves nothing.
    Evict {
        /// The epoch.
        epoch: Epoch,
        /// The member to evict.
        node: NodeId,
    },
    /// Asks for the ids of the content-hash objects the node holds a durable fragment of, in
    /// the order of their keys (ring point, then id), after the object `after`: at most `limit`
    /// (and [`CONTENT_OBJECTS_PER_ANSWER`]). What a collector of unreferenced objects starts
    /// from; a faulty node may list anything, so a listing is a hint, never proof.
    ContentObjects {
        /// The last object of the previous page.
        after: Option<[u8; 32]>,
        /// The most wanted.
        limit: u32,
    },
}

/// The node's answer.
// A status is the largest and rarest answer (one per `bulwark status`); boxing it would cost
// every caller an indirection for no saving that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SystemReply {
    /// The node's self-description.
    Status(NodeStatus),
    /// Certificates, each of the epoch after the one before, starting after the asked epoch (at
    /// most [`CERTS_PER_ANSWER`]); the asker verifies each from the genesis configuration.
    Configuration(Vec<ConfigCert>),
    /// The answer to a freshness challenge; `None` from a node that is not a CS replica of its
    /// current epoch.
    Fresh(Option<Unverified<bulwark_core::configuration::Fresh>>),
    /// The replica's signed agreement to evict, or why it does not agree.
    Evict(Result<Unverified<EvictVote>, String>),
    /// Object ids in key order, and whether more follow.
    ContentObjects {
        /// At most as many as asked and [`CONTENT_OBJECTS_PER_ANSWER`].
        ids: Vec<[u8; 32]>,
        /// More follow.
        more: bool,
    },
}

/// What nodes tell each other about configurations (Rosebud §3.6: a node that misses a new
/// configuration pulls it from any node that has it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeMessage {
    /// Newly certified configurations, oldest first.
    Certified(Vec<ConfigCert>),
    /// Asks for the certified configurations after epoch `after`.
    Pull {
        /// The last epoch the asker holds.
        after: u64,
    },
    /// A CS replica checks that the node is alive (Rosebud §3.3).
    Ping(Ping),
    /// The answer.
    Pong(Pong),
    /// A CS replica proposes to evict `node` and asks the other CS replicas to agree.
    EvictAsk {
        /// The epoch.
        epoch: Epoch,
        /// The node.
        node: NodeId,
    },
    /// A CS replica's signed agreement.
    EvictAgree(Unverified<EvictVote>),
    /// Newly certified configurations, oldest first, passed on by the three-level multicast
    /// (Rosebud §3.6): the receiver passes them on at hop `hop` (none from hop
    /// `membership::MULTICAST_HOPS` on).
    Multicast {
        /// The configurations, each as a delta from the one before where it can be.
        certs: Vec<Certificate>,
        /// The hop the receiver sends at.
        hop: u8,
    },
}

/// A certified configuration as the multicast carries it: whole, or as the change from the
/// configuration before it with the certificate's signatures over the whole (§3.6), which a node
/// holding that configuration rebuilds and verifies exactly as a whole one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Certificate {
    /// The whole certificate.
    Full(ConfigCert),
    /// The change from the epoch before.
    Delta(ConfigDelta),
}

/// A node's configuration-service replica, for `bulwark status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsStatus {
    /// The epoch whose CS it belongs to.
    pub epoch: u64,
    /// Its slot in the CS.
    pub slot: u32,
    /// Its PBFT view.
    pub view: u64,
    /// Whether the view has started (false during a view change).
    pub active: bool,
    /// The node that is the view's primary.
    pub primary: u32,
    /// The last batch executed.
    pub executed: u64,
    /// Requests waiting to execute.
    pub waiting: u64,
    /// On A2M-PBFT-E, why the replica stopped (its trusted log is full, or holds another
    /// history than it executed): it answers nothing until an operator recovers it.
    pub stopped: Option<String>,
}

/// What `bulwark status` shows for a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's id.
    pub node: u32,
    /// The software version.
    pub version: String,
    /// Seconds since start.
    pub uptime_seconds: u64,
    /// The storage epoch the node serves (placement; 0 for the static membership).
    pub epoch: u64,
    /// The latest certified configuration epoch the node holds (0: no configuration service).
    #[serde(default)]
    pub config_epoch: u64,
    /// Its configuration-service replica, if it is one in the current epoch.
    #[serde(default)]
    pub cs: Option<CsStatus>,
    /// Totals over every replica the node hosts.
    pub server: ReplicaStats,
    /// Each replica: service, group and the node's slot in it.
    pub replicas: Vec<ReplicaStatus>,
    /// Requests served since start.
    pub requests: u64,
    /// Messages refused or dropped, by peer and reason.
    pub rejected: Vec<Rejected>,
    /// Its trusted log, if it has one.
    #[serde(default)]
    pub trusted_log: Option<Box<TrustedLogStatus>>,
    /// Each causal volume it serves.
    #[serde(default)]
    pub causal: Vec<CausalStatus>,
}

/// One causal volume on a node, as `bulwark status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CausalStatus {
    /// The volume's number.
    pub volume: u64,
    /// Updates accepted.
    pub updates: u64,
    /// Updates waiting for what they depend on.
    pub pending: u64,
    /// The node's frontier: per member index, the clock of each branch's latest update (two
    /// or more: a fork).
    pub frontier: Vec<(u32, Vec<u64>)>,
    /// Members this node holds a checked proof of forking against.
    pub forks: Vec<u32>,
    /// Updates refused (bad signature, history, dependencies), and values and puts refused.
    pub refused: u64,
    /// Values it holds, and their bytes.
    pub values: u64,
    /// Their bytes.
    pub value_bytes: u64,
    /// Members' names (a node's or client's of `cluster.toml`) by index, where the node knows
    /// them.
    #[serde(default)]
    pub names: Vec<(u32, String)>,
    /// Values dropped by every client's consent (§6.6).
    #[serde(default)]
    pub discarded: u64,
    /// Discard proposals that lack a client's consent: what an administrator looks at when
    /// discard stalls.
    #[serde(default)]
    pub pending_discards: Vec<PendingDiscardStatus>,
    /// Values the node's store did not give back intact: fetched again from peers.
    #[serde(default)]
    pub values_damaged: u64,
}

/// A discard proposal of a causal volume waiting for consent, as `bulwark status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDiscardStatus {
    /// The proposer's member index.
    pub proposer: u32,
    /// The turn it was proposed in.
    pub turn: u64,
    /// How many versions it lists.
    pub versions: u64,
    /// The member indexes of the clients that have not consented.
    pub missing: Vec<u32>,
}

/// A node's trusted log (A2M), as `bulwark status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustedLogStatus {
    /// Which backend, and where its generation is anchored (a file, or a TPM's counter).
    pub backend: String,
    /// The component's public key: what its attestations verify under.
    pub key: [u8; 32],
    /// The socket the node reaches it on.
    pub socket: String,
    /// Each log's `(id, low, high)`.
    pub heads: Vec<(u64, u128, u128)>,
    /// Batches of calls made since the node started.
    pub batches: u64,
    /// Attestations the node received, each verified under `key`.
    pub attestations: u64,
    /// Batches refused (by the component, or because it could not be reached, or because an
    /// attestation it returned did not verify).
    pub refused: u64,
    /// The last refusal.
    pub last_refusal: Option<String>,
    /// Why the component did not answer the status request, when it did not.
    pub unreachable: Option<String>,
}

/// One replica a node hosts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The service's name (`powerstore`, `abd`, `phalanx`).
    pub service: String,
    /// The service's id: node-wide replicas of several services share one group.
    #[serde(default)]
    pub service_id: u16,
    /// The replica group.
    pub group: u32,
    /// The node's position in the group.
    pub slot: u32,
    /// Its counters.
    pub stats: ReplicaStats,
}

/// A count of refused or dropped messages from one peer for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    /// The peer: a client or node name from the configuration, or an address when
    /// unauthenticated.
    pub peer: String,
    /// Why.
    pub reason: String,
    /// How many.
    pub count: u64,
}
