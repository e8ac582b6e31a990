//! Content-hash objects (Rosebud §4.3, the static-group scenarios of spec §7.2) in the
//! simulator: the real replica and client machines under f Byzantine replicas of every kind,
//! crashes with restart from disk, partitions, loss, duplication and reordering, checked by
//! `sim::protocols::content`: a read returns the object or nothing, never other bytes, and
//! returns it whenever the write that created it completed before the read began. A negative
//! control: writes and "not found" at 2f instead of 2f+1 must be caught losing an object.

use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::sim::protocols::content::ContentSim;
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
    println!("{}", summary.render_service(config, "content"));
}

#[test]
fn f1_every_fault_sweep_never_loses_or_changes_a_created_object() {
    let config = config(1);
    let summary = sweep_service::<ContentSim>(0..300, &config, THREADS);
    report("content f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 300);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "content")
    );
    assert!(
        summary.ops_checked > 300 * 20,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_sweep_never_loses_or_changes_a_created_object() {
    let config = config(2);
    let summary = sweep_service::<ContentSim>(100_000..100_100, &config, THREADS);
    report("content f=2 sweep", &config, &summary);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "content")
    );
}

// Each Byzantine behaviour alone, f of them, with every environment fault; and the runs must
// both find created objects and report objects not yet created, or the check means little.
#[test]
fn each_byzantine_behaviour_is_survived_and_reads_see_both_answers() {
    for behaviour in Behaviour::STORAGE {
        let mut faults = FaultSet::all();
        faults.behaviours = [behaviour].into_iter().collect();
        let config = SimConfig {
            faults,
            byzantine_servers: Some(1),
            ..config(1)
        };
        let summary = sweep_service::<ContentSim>(5_000..5_040, &config, THREADS);
        report(&format!("content f=1 {behaviour}"), &config, &summary);
        assert!(
            summary.violations.is_empty(),
            "{}",
            summary.render_service(&config, "content")
        );
    }
    let (mut found, mut absent) = (0, 0);
    for seed in 0..20 {
        let result = run_service::<ContentSim>(seed, &config(1));
        for op in &result.history.ops {
            match &op.outcome {
                bulwark_sim::checker::Outcome::Read(Some(_)) => found += 1,
                bulwark_sim::checker::Outcome::Read(None) => absent += 1,
                _ => {}
            }
        }
    }
    println!("20 runs: {found} reads found their object, {absent} found none yet");
    assert!(found > 100 && absent > 10, "found {found}, absent {absent}");
}

// With acknowledgements and denials counted at 2f, a write can finish with only f correct
// holders (the rest acknowledged by a replica that stores nothing), and f denials from
// correct replicas that missed it plus one from a liar say "not found" for an object whose
// creation completed.
#[test]
fn quorums_of_2f_are_caught_losing_a_created_object() {
    let reference = config(1);
    let broken = SimConfig {
        mutations: "register-small-quorum".parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    let found = first_failure_service::<ContentSim>(0..2_000, &broken, THREADS);
    let (seed, why) = found
        .failure
        .expect("quorums of 2f are caught within 2000 seeds");
    println!("caught at seed {seed}: {why}");
    assert!(
        run_service::<ContentSim>(seed, &reference).passed(),
        "the seed passes without the mutation"
    );
}
