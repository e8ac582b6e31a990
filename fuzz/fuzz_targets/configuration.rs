//! Configurations and their certificates as a client or a node receives them from another node
//! (or reads back from its own directory): decoded under their bounds, then verified as the
//! successor of a real genesis. A forged or malformed certificate must be refused, never panic.
#![no_main]

use bulwark_core::config::ClusterConfig;
use bulwark_core::configuration::{self, ConfigCert, Configuration};
use bulwark_fuzz::round_trip;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static GENESIS: LazyLock<Configuration> = LazyLock::new(|| {
    ClusterConfig::parse(include_str!("../fixtures/cluster.toml"), "cluster.toml")
        .expect("the fixture parses")
        .genesis()
        .expect("the fixture has a genesis")
        .expect("the fixture has a configuration service")
});

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    if kind % 2 == 0 {
        if let Ok(config) = Configuration::decode(bytes) {
            let again = Configuration::decode(&config.encode()).expect("an encoding decodes");
            assert!(
                again.encode() == config.encode(),
                "decode(encode(x)) differs from x"
            );
            let _ = config.ring();
            let _ = config.digest();
        }
    } else if let Some(cert) = round_trip::<ConfigCert>(bytes, configuration::CERT_BYTES_MAX) {
        let _ = configuration::verify_successor(&GENESIS, &cert);
    }
});
