//! Bulwark's benchmark harness: YCSB's CoreWorkload and object-size sweeps driven by closed-loop
//! clients against Bulwark and against etcd, side by side in one run, with HDR latency
//! histograms, CPU, bytes and memory per system, written as JSON, Markdown and PNG plots.

pub mod compare;
pub mod driver;
pub mod limits;
pub mod links;
pub mod metrics;
pub mod placement;
pub mod procstat;
pub mod report;
pub mod targets;
pub mod ycsb;
