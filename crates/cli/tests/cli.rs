//! Every integration test of the `bulwark` command, in one binary: each test file used to be its
//! own binary, and linking fifteen copies of the client, node and tokio code cost minutes of CI.
//! nextest still runs each test in its own process.

mod common;

mod a2m_process;
mod baselines;
mod bench_links;
mod causal;
mod cluster_faults;
mod config_service;
mod config_service_ea;
mod content;
mod demo;
mod docker_faults;
mod gateway;
mod many_groups;
mod reconfiguration;
mod single_server;
mod tables;
