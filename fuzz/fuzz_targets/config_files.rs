//! The files a user writes or edits: `cluster.toml`, a node's `node.toml`, a client's
//! `client.toml` and the gateway's configuration. A mistake in one must be an error that names
//! it, never a panic. The first byte picks the file.
#![no_main]

use bulwark_core::config::{ClientSecrets, ClusterConfig, NodeSecrets, parse_secrets};
use bulwark_gateway::GatewayConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    match kind % 4 {
        0 => {
            if let Ok(cluster) = ClusterConfig::parse(text, "cluster.toml") {
                // What a node, client and the CLI derive from an accepted file.
                let _ = cluster.placement();
                let _ = cluster.genesis();
            }
        }
        1 => drop(parse_secrets::<NodeSecrets>(text, "node.toml")),
        2 => drop(parse_secrets::<ClientSecrets>(text, "client.toml")),
        _ => drop(GatewayConfig::parse(text, "gateway.toml")),
    }
});
