//! Hardened tables (spec `cassandra.md` §5.2) in the simulator: the real replica, proxy and
//! client machines of the four signing variants (Proxy-Verifies, Proxy-No-Verify, Half-Sym and
//! Full-Sym, one per run) under up to f lying members (each lying as replica and
//! as proxy: dropping writes, signing badly and framing others, forging cells, saving a revoked
//! writer's cells and hiding its revocation, spec §2.8's scenario 2), crashes with restart from disk, partitions, loss, duplication and reordering.
//! With the clock every simulated client shares, the paper's per-cell guarantee makes a cell a
//! linearizable register, so the world's linearizability checker judges every run; each broken
//! variant the spec names must be caught by it.

use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::sim::protocols::table::{EventualTableSim, TableSim};
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
    let service = if name.starts_with("eventual") {
        "table-eventual"
    } else {
        "table"
    };
    println!("{}", summary.headline(name));
    println!("{}", summary.render_service(config, service));
}

#[test]
fn f1_every_fault_sweep_is_linearizable_per_cell() {
    let config = config(1);
    let summary = sweep_service::<TableSim>(0..200, &config, THREADS);
    report("table f=1 sweep", &config, &summary);
    assert_eq!(summary.seeds_run, 200);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "table")
    );
    assert!(
        summary.ops_checked > 200 * 20,
        "the sweep checked too little: {}",
        summary.ops_checked
    );
}

#[test]
fn f2_every_fault_sweep_is_linearizable_per_cell() {
    let config = config(2);
    let summary = sweep_service::<TableSim>(100_000..100_060, &config, THREADS);
    report("table f=2 sweep", &config, &summary);
    assert!(
        summary.violations.is_empty(),
        "{}",
        summary.render_service(&config, "table")
    );
}

// Each lying behaviour alone, f of them, with every environment fault.
#[test]
fn each_lying_member_is_survived() {
    for behaviour in Behaviour::STORAGE {
        let mut faults = FaultSet::all();
        faults.behaviours = [behaviour].into_iter().collect();
        let config = SimConfig {
            faults,
            byzantine_servers: Some(1),
            ..config(1)
        };
        let summary = sweep_service::<TableSim>(5_000..5_030, &config, THREADS);
        report(&format!("table f=1 {behaviour}"), &config, &summary);
        assert!(
            summary.violations.is_empty(),
            "{}",
            summary.render_service(&config, "table")
        );
    }
}

/// Finds a seed `mutation` breaks within `seeds` under `base`, and checks the same seed passes
/// without it.
fn caught(mutation: &str, base: SimConfig, seeds: std::ops::Range<u64>) {
    let broken = SimConfig {
        mutations: mutation.parse::<Mutations>().unwrap(),
        ..base.clone()
    };
    let found = first_failure_service::<TableSim>(seeds.clone(), &broken, THREADS);
    let (seed, why) = found
        .failure
        .unwrap_or_else(|| panic!("{mutation} is caught within seeds {seeds:?}"));
    println!("{mutation} caught at seed {seed}: {why}");
    assert!(
        run_service::<TableSim>(seed, &base).passed(),
        "seed {seed} passes without {mutation}"
    );
}

fn lying(behaviour: Behaviour, f: usize) -> SimConfig {
    let mut faults = FaultSet::all();
    faults.behaviours = [behaviour].into_iter().collect();
    SimConfig {
        faults,
        byzantine_servers: Some(f),
        ..config(f)
    }
}

// Spec §2.8 scenario 2: a colluding proxy relays f+1 valid acknowledgements for a write that
// one correct replica holds; a client that takes them as a write loses it to a later read.
#[test]
fn accepting_f_plus_one_acknowledgements_is_caught() {
    caught(
        "table-accept-f-plus-one",
        lying(Behaviour::Colluding, 1),
        0..400,
    );
}

// Majorities of 3f+1 meet in f replicas only from f = 2: faulty replicas that drop writes
// then hide a completed write from a read.
#[test]
fn majority_quorums_are_caught_at_f_2() {
    caught("table-majority", lying(Behaviour::Stale, 2), 0..400);
}

// A resolver that does not check writers' signatures returns a cell a replica forged.
#[test]
fn unverified_cells_are_caught() {
    caught(
        "table-unverified-cells",
        lying(Behaviour::Forging, 1),
        0..400,
    );
}

// Spec §5.2 "Revocation": members and readers that ignore the administrator's revocation take
// a write the revoked client signed earlier and a forging member saved, newer than any since.
#[test]
fn ignoring_revocations_is_caught() {
    caught(
        "table-ignore-revocations",
        lying(Behaviour::Forging, 1),
        0..400,
    );
}

// A read that returns a resolution without writing it back lets a later read go back in time.
#[test]
fn skipping_the_write_back_is_caught() {
    caught("table-skip-write-back", config(1), 0..2_000);
}

// Spec §5.2 "eventual mode": on 2f+1 replicas with quorums of f+1, under every fault and f
// lying members, reads return only written values and, once the run settles, the correct
// replicas hold the same version of every key, none older than an acknowledged write.
#[test]
fn eventual_tables_converge_and_lose_no_acknowledged_write() {
    for f in [1, 2] {
        let config = config(f);
        let seeds = if f == 1 { 0..150 } else { 200_000..200_040 };
        let summary = sweep_service::<EventualTableSim>(seeds, &config, THREADS);
        report(&format!("eventual table f={f} sweep"), &config, &summary);
        assert!(
            summary.violations.is_empty(),
            "{}",
            summary.render_service(&config, "table-eventual")
        );
        assert!(summary.ops_checked > 1_000, "{}", summary.ops_checked);
    }
}

// Without anti-entropy a replica that missed a write (lost, partitioned, crashed, or a proxy's
// minimal write) never learns it: the replicas stay apart.
#[test]
fn eventual_tables_without_anti_entropy_are_caught() {
    let broken = SimConfig {
        mutations: "table-no-anti-entropy".parse::<Mutations>().unwrap(),
        ..config(1)
    };
    let found = first_failure_service::<EventualTableSim>(0..400, &broken, THREADS);
    let (seed, why) = found
        .failure
        .expect("table-no-anti-entropy is caught within seeds 0..400");
    println!("table-no-anti-entropy caught at seed {seed}: {why}");
    assert!(
        run_service::<EventualTableSim>(seed, &config(1)).passed(),
        "seed {seed} passes with anti-entropy"
    );
}
