//! Public-key objects (Rosebud §4.4, the static-group scenarios of spec §7.2 that need no
//! Byzantine replica) in the simulator: the real replica and client machines of the register
//! core under concurrent writers (several clients holding one owner key), writers that crash
//! mid-write (a version on one replica, repaired by the next read's write-back), server crashes
//! with restart from disk, partitions, loss, duplication and reordering; every object's history
//! checked for linearizability. Negative control: reads without write-back must be caught.

use bulwark_sim::sim::protocols::registers::PubKeySim;
use bulwark_sim::sim::{
    FaultSet, Mutations, SimConfig, SweepSummary, first_failure_service, run_service, sweep_service,
};

const THREADS: usize = 2;

fn config(f: usize) -> SimConfig {
    SimConfig {
        f,
        faults: FaultSet::all(),
        ..SimConfig::default()
    }
}

fn report(name: &str, config: &SimConfig, summary: &SweepSummary) {
    println!("{}", summary.headline(name));
    println!("{}", summary.render_service(config, "pubkey"));
}

#[test]
fn f1_every_fault_sweep_is_linearizable_and_wait_free() {
    let config = config(1);
    let summary = sweep_service::<PubKeySim>(0..400, &config, THREADS);
    report("pubkey f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 400);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "pubkey")
    );
    assert_eq!(summary.inconclusive, 0);
    assert!(
        summary.ops_checked > 400 * 50,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_sweep_is_linearizable_and_wait_free() {
    let config = config(2);
    let summary = sweep_service::<PubKeySim>(100_000..100_100, &config, THREADS);
    report("pubkey f=2 sweep", &config, &summary);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "pubkey")
    );
    assert_eq!(summary.inconclusive, 0);
}

// A read that returns the highest version it saw without writing it back: a later read may
// miss a version an earlier one returned (new/old inversion), as soon as a writer dies after
// reaching one replica or a write is still in flight.
#[test]
fn reads_without_write_back_are_caught_inverting() {
    let reference = config(1);
    let broken = SimConfig {
        mutations: "register-no-write-back".parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    let found = first_failure_service::<PubKeySim>(0..2_000, &broken, THREADS);
    let (seed, why) = found
        .failure
        .expect("reads without write-back are caught within 2000 seeds");
    println!(
        "caught at seed {seed}: {why}\n  replay: {}",
        broken.service_replay_command(seed, "pubkey")
    );
    assert!(
        run_service::<PubKeySim>(seed, &reference).passed(),
        "the seed passes without the mutation"
    );
}
