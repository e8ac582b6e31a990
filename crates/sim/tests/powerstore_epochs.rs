//! M-PoWerStore registers across reconfigurations: `2(3f+1)` nodes whose certified configuration
//! changes two to five times during the run (the schedule of the public-key objects'
//! simulation), every node hosting the real `EpochHost<powerstore::epochs::Registers>`, which
//! takes each key whose group changed over into its new incarnation by reading the previous one
//! and confirming among the new members; clients whose reads and writes start in the genesis
//! epoch and follow the replicas into newer ones; partitions, loss, duplication, reordering and
//! up to `f` silent nodes. Every register's history is checked for linearizability.
//!
//! Negative controls: a new member that serves before its take-over is confirmed, and old members
//! that answer a take-over's LIST before they entered the epoch it is for.

use bulwark_sim::sim::protocols::powerstore_epochs::PowerStoreReconfigSim;
use bulwark_sim::sim::{FaultSet, SimConfig, assert_caught_service, sweep_service};

const THREADS: usize = 2;

fn config(f: usize) -> SimConfig {
    SimConfig {
        f,
        faults: FaultSet::all(),
        ..SimConfig::default()
    }
}

/// The linearizability checker's word for a history no order explains.
const NOT_LINEARIZABLE: &str = "is explained by no order";

#[test]
fn f1_registers_reconfiguring_sweep_is_linearizable() {
    let config = config(1);
    let summary = sweep_service::<PowerStoreReconfigSim>(0..500, &config, THREADS);
    println!("{}", summary.headline("powerstore-reconfig f=1 sweep"));
    println!("{}", summary.render_service(&config, "powerstore-reconfig"));
    assert_eq!(summary.seeds_run, 500);
    summary.assert_clean(50, || {
        summary.render_service(&config, "powerstore-reconfig")
    });
}

#[test]
fn f2_registers_reconfiguring_sweep_is_linearizable() {
    let config = config(2);
    let summary = sweep_service::<PowerStoreReconfigSim>(100_000..100_100, &config, THREADS);
    println!("{}", summary.headline("powerstore-reconfig f=2 sweep"));
    summary.assert_clean(50, || {
        summary.render_service(&config, "powerstore-reconfig")
    });
}

// A new member that serves before its take-over is confirmed answers from nothing: a read
// quorum of such members returns an old value or none.
#[test]
fn serving_before_the_take_over_is_confirmed_is_caught() {
    assert_caught_service::<PowerStoreReconfigSim>(
        "powerstore-reconfig",
        "serve-before-transfer",
        config(1),
        500,
        NOT_LINEARIZABLE,
    );
}
