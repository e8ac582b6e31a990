//! Every integration test of the `bulwark` command, in one binary: as fifteen binaries, each
//! linking its own copy of the client, node and tokio code, they took 163 s of compile CPU; one takes 60 s.
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
