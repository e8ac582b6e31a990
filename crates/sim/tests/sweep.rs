//! Seed sweeps of the real M-PoWerStore machines under every fault the swarm knows, checked for
//! linearizability, wait-freedom, failed operations and false accusations (DESIGN.md §9.4 step 4).
//!
//! Each test prints what it saw (seeds per second, operations checked) so that a slowdown or a
//! drop in coverage shows up in the test log.
//!
//! Garbage collection is in every sweep: small grace periods and version caps make reads race
//! the collection of their own versions, which is where the server's "superseded" replies and the
//! reader's offers (see `powerstore::server`) must keep reads both linearizable and wait-free.

use bulwark_core::config::Protocol;
use bulwark_sim::sim::{FaultSet, SimConfig, SweepSummary, run, sweep};

const THREADS: usize = 2;

fn report(name: &str, config: &SimConfig, summary: &SweepSummary) {
    println!("{}", summary.headline(name));
    if !summary.violations.is_empty() {
        println!("{}", summary.render(config));
    }
}

// Reference: PoWerStore Th 5.9 (linearizable) and Th 5.10 (wait-free) with f Byzantine servers,
// any number of Byzantine readers, crashing writers and an asynchronous network.
#[test]
fn f1_every_fault_sweep_is_linearizable_and_wait_free() {
    let config = SimConfig {
        f: 1,
        faults: FaultSet::all(),
        ..SimConfig::default()
    };
    let summary = sweep(0..2_000, &config, THREADS);
    report("f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 2_000);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert_eq!(summary.inconclusive, 0);
    assert!(
        summary.ops_checked > 2_000 * 50,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_seeds_are_linearizable_and_wait_free() {
    let config = SimConfig {
        f: 2,
        faults: FaultSet::all(),
        ..SimConfig::default()
    };
    let summary = sweep(100_000..100_300, &config, THREADS);
    report("f=2 sweep", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert_eq!(summary.inconclusive, 0);
}

#[test]
fn a_reliable_network_with_honest_servers_is_clean_and_busy() {
    // The control for the controls: no faults at all, so every operation completes.
    let config = SimConfig {
        faults: FaultSet::none(),
        ..SimConfig::default()
    };
    let summary = sweep(0..20, &config, THREADS);
    report("no faults", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert_eq!(summary.ops_invoked, summary.ops_checked);
}

// The one-round read (docs/one-round-reads.md) is what reads take when nothing disagrees, and
// under faults both it and FILTER run, so the sweeps above check both paths.
#[test]
fn reads_end_in_one_round_unless_replies_disagree() {
    let count = |config: &SimConfig| {
        (0..20).fold((0, 0), |(one, all), seed| {
            let stats = run(seed, config).stats;
            (one + stats.one_round_reads, all + stats.reads_completed)
        })
    };
    let quiet = SimConfig {
        faults: FaultSet::none(),
        ..SimConfig::default()
    };
    let (one, all) = count(&quiet);
    println!("no faults: {one} of {all} reads ended after COLLECT");
    assert!(
        one * 10 >= all * 7,
        "only {one} of {all} reads took one round"
    );
    let faulty = SimConfig {
        faults: FaultSet::all(),
        ..SimConfig::default()
    };
    let (one, all) = count(&faulty);
    println!("every fault: {one} of {all} reads ended after COLLECT");
    assert!(
        one > 0 && one < all,
        "{one} of {all}: one path went untested"
    );
}

// The baselines run in the same world. ABD promises linearizability and wait-freedom with at most
// f crashed servers out of 2f+1 (and safety with more down); the swarm drops the Byzantine faults
// it is not built for.
#[test]
fn abd_under_crashes_partitions_and_loss_is_linearizable_and_wait_free() {
    baseline_sweeps(Protocol::Abd);
}

// Phalanx with up to f of the Byzantine catalogue's servers (silent, equivocating, stale,
// amnesiac, corrupting, forging, colluding) among 3f+1.
#[test]
fn phalanx_with_byzantine_servers_is_linearizable_and_wait_free() {
    baseline_sweeps(Protocol::Phalanx);
}

/// 500 seeds of `protocol` under every fault it is built to survive, for f = 1 and f = 2.
fn baseline_sweeps(protocol: Protocol) {
    for f in [1, 2] {
        let config = SimConfig {
            protocol,
            f,
            faults: FaultSet::all(),
            ..SimConfig::default()
        };
        let summary = sweep(0..500, &config, THREADS);
        report(&format!("{protocol} f={f} sweep"), &config, &summary);
        assert!(summary.violations.is_empty(), "{}", summary.render(&config));
        assert_eq!(summary.inconclusive, 0);
        assert!(summary.ops_checked > 500 * 50, "{}", summary.ops_checked);
    }
}

// A clean baseline sweep means something only if its nemeses fired: ABD servers crashed and
// restarted from their disks, and Phalanx readers caught the catalogue's forgeries.
#[test]
fn the_baselines_nemeses_fire() {
    let abd = SimConfig {
        protocol: Protocol::Abd,
        ..SimConfig::default()
    };
    let phalanx = SimConfig {
        protocol: Protocol::Phalanx,
        ..SimConfig::default()
    };
    let (mut crashes, mut partitions, mut lost, mut evidence, mut refusals) = (0, 0, 0, 0, 0);
    for seed in 0..40 {
        let run = bulwark_sim::sim::run(seed, &abd);
        assert!(run.passed(), "{}", run.render());
        crashes += run.stats.server_crashes;
        partitions += run.stats.partitions;
        lost += run.stats.lost;
        let run = bulwark_sim::sim::run(seed, &phalanx);
        assert!(run.passed(), "{}", run.render());
        evidence += run.stats.evidence;
        refusals += run.stats.refusals;
    }
    println!(
        "ABD: {crashes} server crashes, {partitions} partitions, {lost} messages lost; Phalanx: {evidence} forgeries caught by readers, {refusals} refusals"
    );
    assert!(crashes > 20 && partitions > 20 && lost > 100);
    assert!(evidence > 20, "Phalanx readers caught {evidence} forgeries");
}
