//! The envelope clients and nodes exchange on an authenticated channel: one frame carries a
//! protocol message or an administrative request. New protocols (the baselines, Depot, tables)
//! become new variants here, so one node serves them all on one port.

use crate::{abd, phalanx, powerstore};
use serde::{Deserialize, Serialize};

/// A client-to-node frame.
// Decoded once per frame and consumed at once; boxing would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientFrame {
    /// An M-PoWerStore request.
    PowerStore(powerstore::Request),
    /// A multi-writer ABD request.
    Abd(abd::Request),
    /// A Phalanx-style request.
    Phalanx(phalanx::Request),
    /// Asks for [`NodeStatus`]; `nonce` is echoed.
    Status {
        /// Echoed in the reply.
        nonce: u64,
    },
}

/// A node-to-client frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeFrame {
    /// An M-PoWerStore reply.
    PowerStore(powerstore::Response),
    /// A multi-writer ABD reply.
    Abd(abd::Response),
    /// A Phalanx-style reply.
    Phalanx(phalanx::Response),
    /// The node's self-description.
    Status {
        /// Echo of the request's nonce.
        nonce: u64,
        /// The status.
        status: NodeStatus,
    },
}

/// What `bulwark status` shows for a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's index.
    pub node: u32,
    /// The software version.
    pub version: String,
    /// Seconds since start.
    pub uptime_seconds: u64,
    /// The protocol the node serves (`powerstore`, `abd`, `phalanx`).
    pub protocol: String,
    /// Protocol counters; a baseline fills `objects`, `keys`, `versions` and `fragment_bytes`
    /// (its whole values).
    pub server: powerstore::ServerStats,
    /// Requests served since start.
    pub requests: u64,
    /// Messages refused or dropped, by peer and reason.
    pub rejected: Vec<Rejected>,
}

/// A count of refused or dropped messages from one peer for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    /// The peer: a client name from the configuration, or an address when unauthenticated.
    pub peer: String,
    /// Why.
    pub reason: String,
    /// How many.
    pub count: u64,
}
