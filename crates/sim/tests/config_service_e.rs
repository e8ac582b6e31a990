//! The configuration service on A2M-PBFT-E (PBFT's `3f_cs+1` replicas, each keeping its request
//! history in a trusted log that survives its crashes and answering clients with it; clients
//! accept `2f_cs+1` attested answers) in the simulator: the same service, clients and checker as
//! on PBFT, PBFT's Byzantine catalogue, every fault the world knows, and the checker shown to see
//! a broken agreement on this core too.
//!
//! Within `f_cs` faults E must behave as PBFT does (spec §7.2 T3): every run safe and live, with
//! the larger reply certificates still forming. What E adds beyond `f_cs` (no client accepts a
//! result of a split history with up to `2f_cs` faulty replicas, T4, and PBFT's failure at the
//! same schedule, T5) is shown in `bulwark_protocol`'s `pbft::tests::e`, where the split is built
//! exactly.

use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::sim::protocols::cs::{
    ConfigServiceSim, KEY_PREFIX, PbftE, caught_on_safety, replay_command_e as replay_command,
};
use bulwark_sim::sim::{
    FaultSet, Mutations, RunResult, SimConfig, SweepSummary, run_service, sweep_service,
};

type ESim = ConfigServiceSim<PbftE>;

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

// Reference: A2M spec §3.3 (E's agreement is PBFT's; its clients' certificates are 2f+1 attested
// answers), §7.2 T3.
#[test]
fn e_f1_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(1);
    let summary = sweep_service::<ESim>(0..120, &config, THREADS);
    report("CS on E f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 120);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(
        summary.ops_checked > 120 * 30,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn e_f2_every_fault_sweep_keeps_the_configuration_service_safe_and_live() {
    let config = config(2);
    let summary = sweep_service::<ESim>(100_000..100_025, &config, THREADS);
    report("CS on E f=2 sweep", &config, &summary);
    assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    assert!(summary.ops_checked > 25 * 25, "{}", summary.ops_checked);
}

// Each behaviour of PBFT's catalogue at the bound: E's clients need three attested answers of
// four, so a faulty replica plus any one unlucky correct one must not stall them for good.
#[test]
fn e_each_byzantine_behaviour_is_survived_at_the_bound() {
    for behaviour in Behaviour::CONFIG_SERVICE {
        let mut faults = FaultSet::all();
        faults.behaviours = [behaviour].into_iter().collect();
        let config = SimConfig {
            faults,
            byzantine_servers: Some(1),
            ..config(1)
        };
        let summary = sweep_service::<ESim>(1_000..1_015, &config, THREADS);
        report(
            &format!("CS on E f=1 with one {behaviour} replica"),
            &config,
            &summary,
        );
        assert!(summary.violations.is_empty(), "{}", summary.render(&config));
    }
}

#[test]
fn e_runs_stop_the_epoch_change_views_and_restart_replicas() {
    let config = config(1);
    let (mut certified, mut changed_view, mut crashes, mut executed) = (0, 0, 0, 0);
    let runs = 24;
    for seed in 0..runs {
        let result = run_service::<ESim>(seed, &config);
        assert!(result.passed(), "{}", result.render());
        certified += usize::from(examined(&result, "certified") > 0);
        changed_view += usize::from(examined(&result, "views") > 0);
        crashes += result.stats.server_crashes;
        executed += examined(&result, "executed");
    }
    println!(
        "CS on E over {runs} runs: {certified} certified the next epoch, {changed_view} changed \
         views, {crashes} replica crashes, {executed} batches executed"
    );
    assert!(certified >= runs as usize / 2, "only {certified} certified");
    assert!(
        changed_view >= runs as usize / 4,
        "only {changed_view} changed views"
    );
    assert!(crashes > 5 && executed > 150);
}

#[test]
fn an_e_run_is_a_function_of_its_seed() {
    let config = SimConfig {
        trace: true,
        ..config(1)
    };
    for seed in [5, 77] {
        let first = run_service::<ESim>(seed, &config);
        let second = run_service::<ESim>(seed, &config);
        assert_eq!(first.trace, second.trace, "trace of seed {seed}");
        assert_eq!(first.stats, second.stats, "counters of seed {seed}");
    }
}

// The checker sees E's runs: PBFT's agreement broken under it (quorums of 2f) is caught. E
// guards what clients accept, not agreement (spec §3.3.6's limitation), so the service's own
// checker, which judges certified configurations, must still see the split.
#[test]
fn e_with_quorums_of_2f_is_caught() {
    let reference = config(1);
    let broken = SimConfig {
        mutations: "pbft-quorum-2f".parse::<Mutations>().unwrap(),
        ..reference.clone()
    };
    let (seed, why) = caught_on_safety::<PbftE>(&reference, &broken, 300, THREADS)
        .expect("the negative control must break a safety promise within 300 seeds");
    println!(
        "pbft-quorum-2f on E: caught at seed {seed}: {why}\n  replay: {}",
        replay_command(&broken, seed)
    );
}
