//! Sans-IO protocol state machines.
//!
//! Each protocol is a module holding a server side (a handler from request to reply plus the state
//! changes that must be durable before the reply leaves) and a client side (one machine per
//! operation, fed replies until it yields a result). Nothing here opens a socket, reads a clock,
//! draws randomness or touches a file: the simulator, the real node and the client library all
//! drive the same code (DESIGN.md §2). Protocol modules never import one another; they share only
//! [`round`], the bookkeeping every client machine needs, and [`transfer`], how a node's objects
//! of any kind follow the configuration from epoch to epoch.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

pub mod a2m_storage;
pub mod content;
pub mod cs;
pub mod depot;
pub mod machine;
pub mod pbft;
pub mod powerstore;
pub mod register;
pub mod round;
pub mod service;
pub mod table;
pub mod transfer;

pub use register::{abd, phalanx, pubkey};
