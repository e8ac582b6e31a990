//! The configuration service (PBFT ordering `ConfigService`, Rosebud §3 and §7.2) in the
//! simulator: seed sweeps with every fault the world knows and the Byzantine replicas of
//! `byzantine::cs`, checked by the service's own checker (`sim::protocols::cs`): one certified
//! configuration per epoch, built only from what clients ordered and holding every change they
//! were told was accepted; one pending state at every correct replica that executed STOP; no
//! number committed twice; reads that grow with the order; operations that complete once the
//! network heals. And negative controls: PBFT with quorums of `2f`, and PBFT whose view changes
//! forget their prepared certificates, must both be caught breaking agreement.
//!
//! Each test prints what it saw, so a slowdown or a drop in coverage shows in the test log.

use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::sim::protocols::cs::{
    ConfigServiceSim, KEY_PREFIX, Pbft, caught_on_safety, replay_command,
};
use bulwark_sim::sim::{
    FaultSet, Mutations, RunResult, SimConfig, SweepSummary, run_service, sweep_service,
};

const THREADS: usize = 2;

/// Every fault, with shorter runs than the storage sweeps: each operation is a PBFT agreement
/// among `3f_cs+1` replicas, signatures and all.
fn config(f: usize) -> SimConfig {
    SimConfig {
        f,
        faults: FaultSet::all(),
        ops: 40,
        liveness_ops: 8,
        keys: 1,
        ..SimConfig::default()
    }
}

fn report(name: &str, config: &SimConfig, summary: &SweepSummary) {
    println!("{}", summary.headline(name));
    for (seed, description) in &summary.violations {
        println!(
            "  seed {seed}: {description}\n    replay: {}",
            replay_command(config, *seed)
        );
    }
}

/// How much the checker examined for `property` in one run (see `sim::protocols::cs`).
fn examined(result: &RunResult, property: &str) -> usize {
    let key = format!("{KEY_PREFIX}{property}").into_bytes();
    result
        .report
        .keys
        .iter()
        .find(|k| k.key == key)
        .map_or(0, |k| k.ops)
}

// Reference: PBFT's safety with at most f_cs Byzantine replicas among 3f_cs+1 and an asynchronous
// network, its liveness once the network is synchronous again (A2M spec §3.2); Rosebud §3 for
// what the configuration service promises on top.
#[test]
fn f1_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(1);
    let summary = sweep_service::<ConfigServiceSim>(0..250, &config, THREADS);
    report("CS f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 250);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(
        summary.ops_checked > 250 * 30,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(2);
    let summary = sweep_service::<ConfigServiceSim>(100_000..100_050, &config, THREADS);
    report("CS f=2 sweep", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(summary.ops_checked > 50 * 25, "{}", summary.ops_checked);
}

// Each behaviour of the catalogue on its own, f_cs of them, with every environment fault: the
// correct replicas must refuse what breaks a rule, and the service must stay correct and live.
#[test]
fn each_byzantine_behaviour_is_refused_and_survived() {
    for behaviour in Behaviour::CONFIG_SERVICE {
        let mut faults = FaultSet::all();
        faults.behaviours = [behaviour].into_iter().collect();
        let config = SimConfig {
            faults,
            byzantine_servers: Some(1),
            ..config(1)
        };
        let summary = sweep_service::<ConfigServiceSim>(1_000..1_030, &config, THREADS);
        report(
            &format!("CS f=1 with one {behaviour} replica"),
            &config,
            &summary,
        );
        assert!(summary.violations.is_empty(), "{}", summary.render(&config));
        // A few runs looked at closely: what the correct replicas refused.
        let refused: usize = (1_000..1_006)
            .map(|seed| examined(&run_service::<ConfigServiceSim>(seed, &config), "refused"))
            .sum();
        println!("  correct replicas refused {refused} messages in 6 runs");
        if matches!(
            behaviour,
            Behaviour::ForgedViewChange | Behaviour::ForgedEvict
        ) {
            assert!(refused > 0, "nothing {behaviour} sent was refused");
        }
    }
}

// Rosebud §7.2: "slow clocks delay STOP but stay safe". One replica's clock runs 1.5 to 6 STOP
// tolerances fast or slow, on an otherwise reliable network so that its effect shows: as
// primary its STOP readings are refused by the correct backups (the refusals counted below) and
// the epoch ends only after a view change; as a backup it refuses correct STOPs. Every run must
// stay correct, and the epoch must still be certified in every run that lasts past it.
#[test]
fn a_replica_with_a_skewed_clock_delays_stop_but_never_breaks_it() {
    let mut faults = FaultSet::none();
    faults.behaviours = [Behaviour::SkewedClock].into_iter().collect();
    let config = SimConfig {
        faults,
        byzantine_servers: Some(1),
        ..config(1)
    };
    let seeds = 2_000..2_040;
    let summary = sweep_service::<ConfigServiceSim>(seeds.clone(), &config, THREADS);
    report("CS f=1 with one skewed-clock replica", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    // The same seeds with every clock right: which runs last past the epoch's end at all.
    let honest = SimConfig {
        faults: FaultSet::none(),
        ..config.clone()
    };
    let (mut certified, mut baseline, mut refusing) = (0, 0, 0);
    for seed in seeds {
        let result = run_service::<ConfigServiceSim>(seed, &config);
        certified += usize::from(examined(&result, "certified") > 0);
        refusing += usize::from(examined(&result, "refused") > 0);
        let result = run_service::<ConfigServiceSim>(seed, &honest);
        baseline += usize::from(examined(&result, "certified") > 0);
    }
    println!(
        "  {certified} of 40 runs certified epoch 2 ({baseline} with every clock right); in {refusing} a skewed STOP was refused"
    );
    assert!(certified > 0, "no run certified epoch 2");
    assert!(refusing > 0, "no run put the skewed clock to the test");
}

// A clean sweep means something only if the runs did what the checks look at: STOPs that
// certified a next configuration, view changes, crashes restored from disk, reads.
#[test]
fn runs_stop_the_epoch_change_views_and_restart_replicas() {
    let config = config(1);
    let (mut certified, mut changed_view, mut crashes, mut reads, mut executed) = (0, 0, 0, 0, 0);
    let runs = 40;
    for seed in 0..runs {
        let result = run_service::<ConfigServiceSim>(seed, &config);
        assert!(result.passed(), "{}", result.render());
        certified += usize::from(examined(&result, "certified") > 0);
        changed_view += usize::from(examined(&result, "views") > 0);
        crashes += result.stats.server_crashes;
        reads += examined(&result, "reads");
        executed += examined(&result, "executed");
    }
    println!(
        "CS coverage over {runs} runs: {certified} certified the next epoch, {changed_view} changed views, {crashes} replica crashes, {reads} reads checked, {executed} batches executed (highest per run, summed)"
    );
    assert!(
        certified >= runs as usize / 2,
        "only {certified} runs certified epoch 2"
    );
    assert!(
        changed_view >= runs as usize / 4,
        "only {changed_view} runs changed views"
    );
    assert!(crashes > 20 && reads > 200 && executed > 400);
}

#[test]
fn a_configuration_service_run_is_a_function_of_its_seed() {
    let config = SimConfig {
        trace: true,
        ..config(1)
    };
    for seed in [5, 77] {
        let first = run_service::<ConfigServiceSim>(seed, &config);
        let second = run_service::<ConfigServiceSim>(seed, &config);
        assert!(!first.history.ops.is_empty());
        assert_eq!(first.trace, second.trace, "trace of seed {seed}");
        assert_eq!(first.stats, second.stats, "counters of seed {seed}");
        assert_eq!(
            format!("{:?}", first.report),
            format!("{:?}", second.report)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Negative controls

/// The first seed below `bound` on which PBFT with `mutation` breaks a safety promise of the
/// configuration service while the real PBFT passes the same seed; panics if there is none.
fn caught_within(mutation: &str, f: usize, bound: u64) -> (u64, String) {
    let reference = config(f);
    let broken = SimConfig {
        mutations: mutation.parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    let Some((seed, why)) = caught_on_safety::<Pbft>(&reference, &broken, bound, THREADS) else {
        panic!("{mutation} was not caught within {bound} seeds");
    };
    println!(
        "{mutation}: caught at seed {seed}: {why}\n  replay: {}",
        replay_command(&broken, seed)
    );
    (seed, why)
}

// Agreement, view-change and checkpoint quorums of 2f: two quorums need not share a correct
// replica, so a new view formed by the Byzantine replica and f correct ones that prepared nothing
// forgets a batch the others committed, and re-decides its number.
#[test]
fn pbft_with_quorums_of_2f_is_caught_committing_a_number_twice() {
    let (_, why) = caught_within("pbft-quorum-2f", 1, 300);
    assert!(
        why.contains("committed as two different batches")
            || why.contains("different states")
            || why.contains("acknowledged")
            || why.contains("accepted"),
        "{why}"
    );
}

// View changes without prepared certificates: a new view re-proposes numbers that were already
// committed, and correct replicas commit other batches there.
#[test]
fn pbft_whose_view_changes_forget_what_was_prepared_is_caught() {
    let (_, why) = caught_within("pbft-drop-prepared", 1, 100);
    assert!(
        why.contains("committed as two different batches")
            || why.contains("different states")
            || why.contains("acknowledged")
            || why.contains("accepted"),
        "{why}"
    );
}
