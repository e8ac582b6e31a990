//! Registers with one writer (PoWerStore §4): the writer keeps its clock per key and writes in two
//! rounds, STORE and COMPLETE; nodes refuse every other client's writes and any STORE below their
//! `lc`. The real machines under every fault the swarm knows, checked for linearizability and
//! wait-freedom. The stale check is what stops a writer that lost its clock from completing a
//! write that sorts below one already complete: a writer that always starts from 1 stays
//! linearizable with it, and is caught without it.

use bulwark_sim::sim::protocols::powerstore::SoleWriterSim;
use bulwark_sim::sim::{
    FaultSet, Mutations, SimConfig, SweepSummary, first_failure_service, run_service, sweep_service,
};

const THREADS: usize = 2;

fn config(f: usize, mutations: &str) -> SimConfig {
    SimConfig {
        f,
        faults: FaultSet::all(),
        mutations: mutations.parse::<Mutations>().unwrap(),
        ..SimConfig::default()
    }
}

fn report(name: &str, config: &SimConfig, summary: &SweepSummary) {
    println!("{}", summary.headline(name));
    if !summary.violations.is_empty() {
        println!("{}", summary.render_service(config, "powerstore-sw"));
    }
}

#[test]
fn f1_every_fault_sweep_is_linearizable_and_wait_free() {
    let config = config(1, "none");
    let summary = sweep_service::<SoleWriterSim>(0..600, &config, THREADS);
    report("sole writer f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 600);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "powerstore-sw")
    );
    assert_eq!(summary.inconclusive, 0);
    assert!(
        summary.ops_checked > 600 * 50,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_seeds_are_linearizable_and_wait_free() {
    let config = config(2, "none");
    let summary = sweep_service::<SoleWriterSim>(100_000..100_150, &config, THREADS);
    report("sole writer f=2 sweep", &config, &summary);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "powerstore-sw")
    );
    assert_eq!(summary.inconclusive, 0);
}

#[test]
fn a_writer_that_forgets_its_clock_is_sent_above_and_stays_linearizable() {
    let config = config(1, "sole-writer-from-one");
    let mut restarts = 0;
    let mut writes = 0;
    for seed in 0..300 {
        let result = run_service::<SoleWriterSim>(seed, &config);
        assert!(result.passed(), "seed {seed}: {}", result.render());
        restarts += result.stats.write_restarts;
        writes += result.stats.writes_completed;
    }
    println!(
        "sole-writer-from-one: {writes} writes completed, {restarts} stored again above a stale refusal"
    );
    assert!(
        restarts > 30,
        "stale refusals were hardly exercised: {restarts} restarts in {writes} writes"
    );
}

#[test]
fn without_the_stale_check_a_writer_that_forgets_its_clock_is_caught() {
    let broken = config(1, "sole-writer-from-one,no-stale-check");
    let reference = config(1, "sole-writer-from-one");
    let bound = 200;
    let mut start = 0;
    while start < bound {
        let Some((seed, _)) =
            first_failure_service::<SoleWriterSim>(start..bound, &broken, THREADS).failure
        else {
            break;
        };
        start = seed + 1;
        let failed = run_service::<SoleWriterSim>(seed, &broken);
        if failed.violations().is_empty()
            || !run_service::<SoleWriterSim>(seed, &reference).passed()
        {
            continue;
        }
        println!(
            "no-stale-check: caught at seed {seed}: {}",
            failed.violations()[0]
        );
        return;
    }
    panic!("a writer behind its clock, without the stale check, was not caught in {bound} seeds");
}
