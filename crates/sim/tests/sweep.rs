//! Seed sweeps of the real M-PoWerStore machines under every fault the swarm knows, checked for
//! linearizability, wait-freedom, failed operations and false accusations (DESIGN.md §9.4 step 4).
//!
//! Each test prints what it saw (seeds per second, operations checked) so that a slowdown or a
//! drop in coverage shows up in the test log.
//!
//! FIXME(protocol): reads can wait forever once servers garbage-collect (spec §3.8 as implemented
//! in `powerstore::server`). A read's highest valid candidate can end with fewer than `f+1`
//! vouching FILTER replies and at most `f` `Superseded` ones, when its `Hist` holders are split
//! between servers that still hold the entry, correct servers that collected it because their
//! `lc` moved on (after the grace period, or past `superseded_max` newer versions), and Byzantine
//! servers that withhold their vote, while a correct server that never got the STORE answers
//! `MacOnly`. Nothing then excludes the candidate, makes it safe or restarts the read, and every
//! server has answered. The simulator labels exactly that state ([`KNOWN_GC_STALL`]); the sweeps
//! below are strict about everything else, and `small_gc_grace_is_safe_but_can_leave_a_read_waiting`
//! pins today's failure so that the fix flips it.

use bulwark_sim::sim::{FaultSet, KNOWN_GC_STALL, Nemesis, SimConfig, SweepSummary, sweep};

const THREADS: usize = 2;

/// Every behaviour and nemesis except small garbage-collection grace periods, which make the known
/// stall common (see the module docs); it still occurs, rarely, with the default grace.
fn every_fault_but_small_gc() -> FaultSet {
    let mut faults = FaultSet::all();
    faults.nemeses.remove(&Nemesis::Gc);
    faults
}

fn report(name: &str, config: &SimConfig, summary: &SweepSummary) {
    println!(
        "{name}: {} seeds in {:.1?} ({:.0} seeds/s), {} operations checked, {} failing seeds ({} only the known GC stall), {} inconclusive",
        summary.seeds_run,
        summary.elapsed,
        summary.seeds_per_second(),
        summary.ops_checked,
        summary.violations.len(),
        summary.violations.len() - summary.unexplained.len(),
        summary.inconclusive
    );
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
        faults: every_fault_but_small_gc(),
        ..SimConfig::default()
    };
    let summary = sweep(0..300, &config, THREADS);
    report("f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 300);
    assert!(
        summary.unexplained.is_empty(),
        "{}",
        summary.render(&config)
    );
    assert_eq!(summary.inconclusive, 0);
    assert!(
        summary.ops_checked > 300 * 50,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_seeds_are_linearizable_and_wait_free() {
    let config = SimConfig {
        f: 2,
        faults: every_fault_but_small_gc(),
        ..SimConfig::default()
    };
    let summary = sweep(1_000..1_040, &config, THREADS);
    report("f=2 sweep", &config, &summary);
    assert!(
        summary.unexplained.is_empty(),
        "{}",
        summary.render(&config)
    );
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

// FIXME(protocol): see the module docs. Safety holds with small grace periods; liveness does not
// yet. When the fix lands the last assertion fails: then make this sweep as strict as the others.
#[test]
fn small_gc_grace_is_safe_but_can_leave_a_read_waiting() {
    let config = SimConfig {
        f: 1,
        faults: FaultSet::all(),
        ..SimConfig::default()
    };
    let summary = sweep(0..300, &config, THREADS);
    report("f=1 sweep with small GC grace", &config, &summary);
    assert!(
        summary.unexplained.is_empty(),
        "{}",
        summary.render(&config)
    );
    assert_eq!(summary.inconclusive, 0);
    assert!(
        summary
            .violations
            .iter()
            .all(|(_, d)| d.contains(KNOWN_GC_STALL)),
        "{}",
        summary.render(&config)
    );
    assert!(
        !summary.violations.is_empty(),
        "no read got stuck any more: the protocol fix landed, so make this sweep strict"
    );
}
