//! The node's own service ([`ServiceId::SYSTEM`](bulwark_core::ServiceId::SYSTEM)): what a client
//! asks a node about itself rather than about data. Protocol frames carry their own service in
//! the envelope header; this module only holds the node's status.

use crate::machine::ReplicaStats;
use serde::{Deserialize, Serialize};

/// A request to the node itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SystemRequest {
    /// Asks for [`NodeStatus`].
    Status,
}

/// The node's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SystemReply {
    /// The node's self-description.
    Status(NodeStatus),
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
    /// The configuration epoch the node serves.
    pub epoch: u64,
    /// Totals over every replica the node hosts.
    pub server: ReplicaStats,
    /// Each replica: service, group and the node's slot in it.
    pub replicas: Vec<ReplicaStatus>,
    /// Requests served since start.
    pub requests: u64,
    /// Messages refused or dropped, by peer and reason.
    pub rejected: Vec<Rejected>,
}

/// One replica a node hosts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The service's name (`powerstore`, `abd`, `phalanx`).
    pub service: String,
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
