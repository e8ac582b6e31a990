//! An S3-compatible gateway over a Bulwark cluster.
//!
//! `bulwark gateway` serves the S3 REST API (path-style) with SigV4 authentication against the
//! access keys in its configuration; each access key acts as one Bulwark client of the cluster.
//!
//! - [`layout`]: which register holds what (buckets, manifests, content-hash chunks, the listing
//!   index, multipart uploads), and why a reader never sees a mix of two versions.
//! - [`engine`]: the operations over any [`store::Registers`]: streamed writes and reads with
//!   bounded memory, ordering and locking.
//! - [`causal`]: buckets whose objects live in a causal volume (`x-bulwark-consistency: causal`
//!   at creation): which keys hold what, the current version among concurrent ones, listings.
//! - [`collect`]: the collector of chunks no object names (left by crashed or failed writes).
//! - [`index`]: listing pages (prefix, delimiter, markers, max-keys).
//! - [`s3`]: the S3 operations, mapping requests and errors.
//! - [`seal`]: server-side encryption (SSE-C, SSE-S3): chunks sealed before they leave the
//!   gateway.
//! - [`config`] and [`server`]: the configuration file and the HTTP front end with its bounds.

pub mod causal;
pub mod collect;
pub mod config;
pub mod engine;
pub mod index;
pub mod layout;
pub mod s3;
pub mod seal;
pub mod server;
pub mod store;

pub use config::GatewayConfig;
pub use server::run;
