//! The deterministic simulator for Bulwark's protocols and the checkers that judge the histories
//! it (or a real cluster) produces.
//!
//! - [`checker`]: the per-key linearizability checker for read/write/delete registers.
//! - [`byzantine`]: the catalogue of Byzantine servers (wrappers around the real server),
//!   Byzantine readers, and Byzantine configuration-service replicas ([`byzantine::cs`]); also
//!   linked by the `bulwark-byzantine` node binary.
//! - [`sim`]: the seeded discrete-event simulator, its swarm of faults, and seed sweeps.
//! - [`durable`]: a server's simulated disk, replayed on restart.
//! - [`depot`]: Depot's causal volumes in a world of their own, with the fork-join-causal checker.
//! - [`takeover`]: M-PoWerStore registers moving into their group's next incarnation, in a world
//!   of their own, under the linearizability checker.
pub mod byzantine;
pub mod checker;
pub mod depot;
pub mod durable;
pub mod fjc;
pub mod sim;
pub mod takeover;
