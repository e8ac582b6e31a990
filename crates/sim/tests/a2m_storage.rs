//! A2M-Storage (A2M §4.2, spec T10) in the simulator: one server with its trusted log, writers
//! racing on shared keys, the server crashing and restarting from its disk (its log survives),
//! partitions, loss, duplication and reordering; every key must stay linearizable. A negative
//! control: a driver that makes the trusted-log calls (and sends) before the server's changes
//! are durable must be caught.

use bulwark_sim::sim::protocols::a2m_storage::A2mStorageSim;
use bulwark_sim::sim::{FaultSet, Mutations, SimConfig, run_service, sweep_service};

const THREADS: usize = 2;

fn config() -> SimConfig {
    SimConfig {
        faults: FaultSet::all(),
        ..SimConfig::default()
    }
}

#[test]
fn every_fault_sweep_stays_linearizable_through_server_crashes() {
    let config = config();
    let summary = sweep_service::<A2mStorageSim>(0..300, &config, THREADS);
    println!("{}", summary.headline("a2m-storage sweep"));
    println!("{}", summary.render_service(&config, "a2m-storage"));
    assert_eq!(summary.seeds_run, 300);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "a2m-storage")
    );
    assert!(
        summary.ops_checked > 300 * 20,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn the_trusted_log_is_called_and_crashes_are_survived() {
    let config = config();
    let (mut attested, mut crashes, mut writes) = (0, 0, 0);
    for seed in 0..40 {
        let result = run_service::<A2mStorageSim>(seed, &config);
        assert!(result.passed(), "seed {seed}: {:?}", result.violations());
        attested += result.stats.attested;
        crashes += result.stats.server_crashes;
        writes += result.stats.writes_completed;
    }
    assert!(writes > 40 * 5, "too few writes completed: {writes}");
    assert!(
        attested >= 2 * writes,
        "every completed write took two trusted-log calls: {attested} calls, {writes} writes"
    );
    assert!(crashes > 0, "no seed crashed the server");
}

// The rule the driver keeps for every protocol, here for the trusted log too: a log that took a
// write its server then lost in a crash is ahead of the state, and the restarted server must stop
// (its replies sent before the disk had the write are lost with it). Under a mutation the world
// does not count failed operations as broken promises, so the control counts them itself: the
// correct driver never fails one on the same seed.
#[test]
fn trusted_log_calls_before_durability_are_caught() {
    let reference = SimConfig {
        faults: "crashes".parse::<FaultSet>().unwrap(),
        ..SimConfig::default()
    };
    let broken = SimConfig {
        mutations: "send-before-durable".parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    for seed in 0..200 {
        let failed = run_service::<A2mStorageSim>(seed, &broken);
        if failed.stats.failed == 0 {
            continue;
        }
        let correct = run_service::<A2mStorageSim>(seed, &reference);
        if correct.passed() && correct.stats.failed == 0 {
            println!(
                "send-before-durable (a2m-storage): caught at seed {seed}: {} operations failed",
                failed.stats.failed
            );
            return;
        }
    }
    panic!("send-before-durable was not caught within 200 seeds");
}
