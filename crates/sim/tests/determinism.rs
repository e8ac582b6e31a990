//! A run is a function of its seed: replaying a seed must reproduce the failure it reported, event
//! for event (DESIGN.md §2, "a protocol bug found in simulation must be replayable from its seed
//! alone").

use bulwark_core::config::Protocol;
use bulwark_sim::sim::{SimConfig, run};

#[test]
fn the_same_seed_gives_the_same_history_trace_and_counters() {
    for (protocol, f) in Protocol::ALL.into_iter().flat_map(|p| [(p, 1), (p, 2)]) {
        let config = SimConfig {
            protocol,
            f,
            trace: true,
            ..SimConfig::default()
        };
        for seed in [3, 17, 4242] {
            let first = run(seed, &config);
            let second = run(seed, &config);
            assert!(!first.history.ops.is_empty(), "seed {seed} did something");
            assert_eq!(
                format!("{:?}", first.history),
                format!("{:?}", second.history),
                "history of seed {seed}, {protocol} f={f}"
            );
            assert_eq!(
                first.trace, second.trace,
                "trace of seed {seed}, {protocol} f={f}"
            );
            assert_eq!(
                first.stats, second.stats,
                "counters of seed {seed}, {protocol} f={f}"
            );
            assert_eq!(first.swarm, second.swarm);
        }
    }
}

#[test]
fn tracing_does_not_change_the_run() {
    // The trace only observes: recording it must draw no randomness and reorder nothing.
    let traced = run(
        11,
        &SimConfig {
            trace: true,
            ..SimConfig::default()
        },
    );
    let quiet = run(11, &SimConfig::default());
    assert_eq!(
        format!("{:?}", traced.history),
        format!("{:?}", quiet.history)
    );
    assert!(quiet.trace.is_empty());
    assert!(traced.trace.len() > 100);
}

#[test]
fn different_seeds_explore_different_schedules() {
    let config = SimConfig::default();
    let a = run(1, &config);
    let b = run(2, &config);
    assert_ne!(format!("{:?}", a.history), format!("{:?}", b.history));
}
