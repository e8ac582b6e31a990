//! Depot's causal volumes (../shared/seeds/depot-minimal-trust.txt; notes in specs/depot.md):
//! storage that stays available and fork-join-causal (FJC) whatever number of its nodes are
//! faulty. Every update is signed by its writer and names, by hash, the updates it depends on;
//! a node accepts one only after everything it depends on; a writer that forks is caught by two
//! signed updates naming the same previous one, and both branches are kept and passed on as the
//! writes of two virtual nodes, so correct nodes can always exchange what they hold.
//!
//! - [`update`]: the volume's members and write rights, the signed update and its checks.
//! - [`log`]: one node's log: acceptance (§3.3), frontiers and heads (§3.7), forks (§4), what a
//!   peer lacks (§3.2) and a branch's ancestry by hash (§4.4).
//! - [`node`]: a node of either role: the log exchange, PUT, GET with its fast path, compact
//!   hash, slow path and fallback (§5), and what it makes durable before it speaks.
//! - [`discard`]: discard by unanimous consent (§6.6): proposals, consents, the backup ladder.
//! - [`hoard`]: the values a node holds, with the bytes of a bounded number in memory.
//! - [`records`]: a node's changes as storage records, and back.
//! - [`served`]: a server member behind the hosted-replica contract, and a client's call to it.

pub mod discard;
pub mod hoard;
pub mod log;
pub mod node;
pub mod records;
pub mod served;
pub mod update;

pub use hoard::Values;
pub use log::{ForkProof, Frontier, Log, Mutations, Offer, Refusal, Summary};
pub use node::{Change, Message, Node, Output, PendingDiscard, ReadResult, ReadStart, Version};
pub use update::{
    Member, Role, Staleness, Update, UpdateBody, UpdateId, ValueRef, VolumeConfig, VolumeId,
    WireUpdate, Writer,
};

#[cfg(test)]
mod tests;
