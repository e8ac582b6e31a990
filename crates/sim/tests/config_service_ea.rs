//! The configuration service on A2M-PBFT-EA (`2f_cs+1` replicas, each with a trusted log that
//! survives its crashes) in the simulator: the same service, clients and checker as on PBFT
//! (`sim::protocols::cs`), with the catalogue of `byzantine::cs_ea` at the bound (one faulty of
//! three, two of five), every fault the world knows, and the negative control: replicas that do
//! not check attestations let an equivocating primary decide a number two ways, which the
//! checker must catch.

use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::byzantine::cs_ea::EaLiar;
use bulwark_sim::sim::protocols::cs::{
    ConfigServiceSim, Ea, KEY_PREFIX, replay_command_ea as replay_command,
};
use bulwark_sim::sim::{
    FaultSet, Mutations, RunResult, SimConfig, SweepSummary, first_failure_service, run_service,
    sweep_service,
};

type EaSim = ConfigServiceSim<Ea>;

const THREADS: usize = 2;

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

fn examined(result: &RunResult, property: &str) -> usize {
    let key = format!("{KEY_PREFIX}{property}").into_bytes();
    result
        .report
        .keys
        .iter()
        .find(|k| k.key == key)
        .map_or(0, |k| k.ops)
}

// Reference: A2M spec §3.4-§3.6 (EA safe and live with at most ⌊(N−1)/2⌋ faulty of N = 2f+1),
// Rosebud §3 for what the configuration service promises on top.
#[test]
fn ea_f1_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(1);
    let summary = sweep_service::<EaSim>(0..200, &config, THREADS);
    report("CS on EA f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 200);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(
        summary.ops_checked > 200 * 30,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn ea_f2_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(2);
    let summary = sweep_service::<EaSim>(100_000..100_050, &config, THREADS);
    report("CS on EA f=2 sweep", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(summary.ops_checked > 50 * 25, "{}", summary.ops_checked);
}

// T2, T6, T7: each behaviour on its own, f_cs of them at the bound, with every environment
// fault.
#[test]
fn ea_each_byzantine_behaviour_is_survived_at_the_bound() {
    for f in [1, 2] {
        for behaviour in EaLiar::BEHAVIOURS {
            let mut faults = FaultSet::all();
            faults.behaviours = [behaviour].into_iter().collect();
            let config = SimConfig {
                faults,
                byzantine_servers: Some(f),
                ..config(f)
            };
            let seeds = 1_000..1_000 + if f == 1 { 30 } else { 12 };
            let summary = sweep_service::<EaSim>(seeds, &config, THREADS);
            report(
                &format!("CS on EA f={f} with {f} {behaviour} replicas"),
                &config,
                &summary,
            );
            assert!(summary.violations.is_empty(), "{}", summary.render(&config));
            if f == 1
                && matches!(
                    behaviour,
                    Behaviour::EquivocatingPrimary | Behaviour::ForgedViewChange
                )
            {
                let refused: usize = (1_000..1_030)
                    .map(|seed| examined(&run_service::<EaSim>(seed, &config), "refused"))
                    .sum();
                println!("  correct replicas refused {refused} messages in 30 runs");
                assert!(refused > 0, "nothing {behaviour} sent was refused");
            }
        }
    }
}

#[test]
fn ea_runs_stop_the_epoch_change_views_and_restart_replicas() {
    let config = config(1);
    let (mut certified, mut changed_view, mut crashes, mut executed) = (0, 0, 0, 0);
    let runs = 30;
    for seed in 0..runs {
        let result = run_service::<EaSim>(seed, &config);
        assert!(result.passed(), "{}", result.render());
        certified += usize::from(examined(&result, "certified") > 0);
        changed_view += usize::from(examined(&result, "views") > 0);
        crashes += result.stats.server_crashes;
        executed += examined(&result, "executed");
    }
    println!(
        "CS on EA over {runs} runs: {certified} certified the next epoch, {changed_view} changed views, {crashes} replica crashes, {executed} batches executed"
    );
    assert!(certified >= runs as usize / 2, "only {certified} certified");
    assert!(
        changed_view >= runs as usize / 4,
        "only {changed_view} changed views"
    );
    assert!(crashes > 10 && executed > 200);
}

#[test]
fn an_ea_run_is_a_function_of_its_seed() {
    let config = SimConfig {
        trace: true,
        ..config(1)
    };
    for seed in [5, 77] {
        let first = run_service::<EaSim>(seed, &config);
        let second = run_service::<EaSim>(seed, &config);
        assert_eq!(first.trace, second.trace, "trace of seed {seed}");
        assert_eq!(first.stats, second.stats, "counters of seed {seed}");
    }
}

// T5's counterpart for EA: the same equivocating primary, against replicas that take messages
// without checking their attestations (2f+1 replicas, quorums of f+1, no trusted log in
// effect), must make the checker report a broken agreement.
#[test]
fn ea_without_attestation_checks_an_equivocating_primary_is_caught() {
    let mut faults = FaultSet::none();
    faults.behaviours = [Behaviour::EquivocatingPrimary].into_iter().collect();
    let reference = SimConfig {
        faults,
        byzantine_servers: Some(1),
        ..config(1)
    };
    let broken = SimConfig {
        mutations: "ea-unchecked-attestations".parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    let found = first_failure_service::<EaSim>(0..200, &broken, THREADS);
    let (seed, why) = found
        .failure
        .expect("the negative control must fail within 200 seeds");
    let failed = run_service::<EaSim>(seed, &broken);
    let agreement = format!("{KEY_PREFIX}agreement").into_bytes();
    assert!(
        failed.report.violations.iter().any(|v| v.key == agreement),
        "seed {seed} failed, but not on agreement: {why}"
    );
    assert!(
        run_service::<EaSim>(seed, &reference).passed(),
        "seed {seed} fails with the attestations checked too"
    );
    println!(
        "ea-unchecked-attestations: caught at seed {seed}: {why}\n  replay: {}",
        replay_command(&broken, seed)
    );
}
