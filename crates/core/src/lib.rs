//! Vocabulary shared by every Bulwark crate: identities, object keys, time as a value, hashes and
//! MACs, signatures, evidence of misbehaviour, membership and placement, the certified
//! configuration of each epoch, the erasure-code trait and the bounded wire codec.
//!
//! Nothing here does I/O or reads a clock, so the protocol machines that build on it stay
//! deterministic (DESIGN.md §2).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

pub mod a2m;
pub mod config;
pub mod configuration;
pub mod crypto;
pub mod envelope;
pub mod erasure;
pub mod evidence;
pub mod ids;
pub mod membership;
pub mod sign;
pub mod smt;
pub mod wire;

pub use crypto::{Digest, MacKey, Tag};
pub use ids::{ClientId, Epoch, GroupId, Key, NodeId, ServiceId, Slot, Time};

/// The largest object the linearizable register stores in one piece.
/// Larger objects are refused before any node sees them (chunking comes with the gateway).
pub const OBJECT_BYTES_MAX: usize = 16 * 1024 * 1024;
