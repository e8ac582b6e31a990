//! The test scenarios of the Depot notes (`specs/depot.md` §8.2), each as a shape of the
//! simulated world (`bulwark_sim::depot::run_shaped`) over a few seeds. Every run is judged by
//! the world's checks and by the fork-join-causal checker on its history, so each scenario
//! asserts only what makes it that scenario: that the faults it names happened and were
//! handled as the notes expect. The swarm (`tests/depot.rs`) mixes all of them; which scenario
//! is checked where, including those covered by unit tests in `bulwark_protocol::depot`, is in
//! docs/depot.md.

use bulwark_protocol::depot::Mutations;
use bulwark_sim::depot::{DepotConfig, DepotRun, Kind, run_shaped};

const SEEDS: std::ops::Range<u64> = 0..12;

fn shape(servers: &[Kind], clients: &[Kind]) -> DepotConfig {
    DepotConfig {
        kinds: servers.iter().chain(clients).copied().collect(),
        servers: servers.len(),
        ops_per_client: 20,
        crashes: false,
        partitions: false,
        loss_per_mille: 0,
        servers_down_until: None,
        discard: false,
        resident_values: Some(bulwark_sim::depot::RESIDENT_VALUE_BYTES),
        mutations: Mutations::default(),
    }
}

/// The runs of `SEEDS` with `shape`, none violating anything, added up.
fn runs(shape: &DepotConfig) -> DepotRun {
    let mut total = DepotRun::default();
    for seed in SEEDS {
        let run = run_shaped(seed, shape.clone());
        assert!(
            run.violations.is_empty(),
            "seed {seed}: {:#?}",
            &run.violations[..run.violations.len().min(8)]
        );
        total.updates += run.updates;
        total.reads += run.reads;
        total.concurrent_reads += run.concurrent_reads;
        total.forks += run.forks;
        total.forks_proven += run.forks_proven;
        total.refused += run.refused;
        total.fast_gets += run.fast_gets;
        total.slow_gets += run.slow_gets;
        total.crashes += run.crashes;
        total.discarded += run.discarded;
        total.premature_proposals += run.premature_proposals;
        total.awaiting_refuser += run.awaiting_refuser;
    }
    eprintln!("{total:?}");
    total
}

use Kind::{Correct, Forker, Hastener, Refuser, Tamperer};

/// T1 (and T14): concurrent writers on the same keys, nobody faulty. Reads of contended keys
/// return every concurrent head; both the fast path and the slow path (a stale compact hash)
/// serve reads; nothing is refused and no fork is seen.
#[test]
fn t1_a_benign_run_returns_every_concurrent_head() {
    let total = runs(&shape(&[Correct; 3], &[Correct; 4]));
    assert!(
        total.concurrent_reads > 0,
        "contended keys have concurrent heads"
    );
    assert!(
        total.fast_gets > 0 && total.slow_gets > 0,
        "both read paths"
    );
    assert_eq!((total.forks, total.refused), (0, 0));
}

/// T2, T3: clients that sign a second update after one previous update, again and again, each
/// branch to another server. Every fork is detected, joined and proven at every correct node
/// (the world's end checks), and no correct writer is accused.
#[test]
fn t2_t3_equivocating_clients_are_joined_and_proven() {
    let total = runs(&shape(&[Correct; 3], &[Forker, Forker, Correct, Correct]));
    assert!(total.forks > 10, "forks happen");
    assert!(total.forks_proven >= total.forks, "every fork is proven");
}

/// T5, T6, T7, T19: three of four servers withhold, tamper with values and fields, invent
/// updates of honest clients and fork updates of their own; one server stays correct. What
/// they alter is refused, and correct clients keep reading and converge.
#[test]
fn t5_t6_t7_t19_three_lying_servers_of_four_change_nothing_a_client_reads() {
    let total = runs(&shape(
        &[Correct, Tamperer, Tamperer, Tamperer],
        &[Correct; 3],
    ));
    assert!(total.refused > 0, "tampered updates are refused");
    assert!(total.reads > 0);
}

/// T9: every server down for the first two seconds of a three-second run (a cloud disaster).
/// Clients keep writing and reading, exchange among themselves, and converge with the servers
/// once they return.
#[test]
fn t9_clients_carry_on_while_every_server_is_down() {
    let total = runs(&DepotConfig {
        servers_down_until: Some(2_000),
        ..shape(&[Correct; 3], &[Correct; 4])
    });
    assert!(total.updates > 0 && total.reads > 0);
}

/// T11: correct nodes crash at any point of their puts and restart from disk: no fork, and no
/// proof against anyone.
#[test]
fn t11_a_crashed_node_never_looks_like_a_forker() {
    let total = runs(&DepotConfig {
        crashes: true,
        ..shape(&[Correct; 3], &[Correct; 4])
    });
    assert!(total.crashes > 0, "nodes crash");
    assert_eq!((total.forks, total.forks_proven), (0, 0));
}

/// T12: partitions among servers and clients, with loss, then healing: FJC throughout, one
/// state at the end.
#[test]
fn t12_partitions_heal_into_one_state() {
    let total = runs(&DepotConfig {
        partitions: true,
        loss_per_mille: 50,
        ..shape(&[Correct; 3], &[Correct, Correct, Forker, Correct])
    });
    assert!(total.reads > 0);
}

/// T16, and discard by unanimous consent at work: with every client correct, old versions'
/// values go (judged as each goes: every client signed, and the ladder keeps none of the
/// versions naming it), with crashes on the way.
#[test]
fn t16_discard_goes_ahead_when_every_client_consents() {
    let total = runs(&DepotConfig {
        discard: true,
        crashes: true,
        ..shape(&[Correct; 2], &[Correct; 3])
    });
    assert!(total.discarded > 0, "old values are discarded");
}

/// T16: a client proposes to discard current and recent versions and consents to everything;
/// no correct client consents to its lists, so nothing the ladder keeps goes, while what the
/// correct clients propose still goes.
#[test]
fn t16_a_hastening_client_discards_nothing_early() {
    let total = runs(&DepotConfig {
        discard: true,
        ..shape(&[Correct; 2], &[Correct, Correct, Hastener])
    });
    assert!(
        total.premature_proposals > 0,
        "premature lists are proposed"
    );
    assert!(total.discarded > 0, "valid proposals still go");
}

/// T16: a client never consents: nothing is discarded anywhere, and every correct client is
/// left showing the proposals that wait for that client, for its administrator.
#[test]
fn t16_a_refusing_client_delays_discard_and_is_named() {
    let total = runs(&DepotConfig {
        discard: true,
        ..shape(&[Correct; 2], &[Correct, Correct, Refuser])
    });
    assert_eq!(total.discarded, 0, "one refusal keeps everything");
    assert!(
        total.awaiting_refuser > 0,
        "the proposals waiting for the refuser are shown"
    );
}
