//! Depot's causal volumes against the fork-join-causal checker: a swarm of seeds with forking
//! writers, tampering servers, crashes, partitions and loss finds no violation, and each rule of
//! the protocol broken on purpose is caught. (Asking for a fork's other branch by name, the rule
//! the swarm rarely needs because some node usually holds both branches first, has its control in
//! `bulwark_protocol::depot`'s tests.)

use bulwark_protocol::depot::Mutations;
use bulwark_sim::depot::{DepotConfig, DepotRun, Kind, run, run_shaped};

#[test]
fn the_swarm_finds_no_violation_and_exercises_every_fault() {
    let (mut updates, mut reads, mut concurrent, mut forks, mut proven) = (0, 0, 0, 0, 0);
    let (mut refused, mut fast, mut slow, mut crashes) = (0, 0, 0, 0);
    let (mut discarded, mut premature, mut shared) = (0, 0, 0);
    for seed in 0..120 {
        let run = run(seed, Mutations::default());
        assert!(
            run.violations.is_empty(),
            "seed {seed}: {:#?}",
            &run.violations[..run.violations.len().min(8)]
        );
        updates += run.updates;
        reads += run.reads;
        concurrent += run.concurrent_reads;
        forks += run.forks;
        proven += run.forks_proven;
        refused += run.refused;
        fast += run.fast_gets;
        slow += run.slow_gets;
        crashes += run.crashes;
        discarded += run.discarded;
        premature += run.premature_proposals;
        shared += run.shared_discarded;
    }
    eprintln!(
        "{updates} updates, {reads} reads ({concurrent} with concurrent versions), {forks} forks \
         ({proven} proven), {refused} updates refused, {fast} fast and {slow} slow gets, \
         {crashes} crashes, {discarded} values discarded ({shared} named by several versions), \
         {premature} premature discard lists"
    );
    // The swarm is not vacuous: it forks, tampers, crashes and reads both ways.
    assert!(forks > 30 && proven >= forks, "forks happen and are proven");
    assert!(concurrent > 60, "reads see concurrent versions");
    assert!(refused > 60, "tampered updates are refused");
    assert!(fast > 60 && slow > 60, "both read paths run");
    assert!(crashes > 30, "correct nodes crash and restart");
    assert!(
        discarded > 30 && premature > 5 && shared > 5,
        "discards go through (values several versions name among them), and premature ones \
         are proposed"
    );
}

/// Seed `seed` of the swarm without discard (and so with no client refusing or hastening it):
/// the controls of rules other than discard's run the schedules they were tuned on.
fn run_without_discard(seed: u64, mutations: Mutations) -> DepotRun {
    let mut shape = DepotConfig::from_seed(seed, mutations);
    shape.discard = false;
    for kind in &mut shape.kinds {
        if matches!(kind, Kind::Refuser | Kind::Hastener) {
            *kind = Kind::Correct;
        }
    }
    run_shaped(seed, shape)
}

/// Asserts that a run of one of the first 20 seeds with `mutations` breaks a property, and that
/// the first violation found says `expected`.
fn caught(mutations: Mutations, expected: &str) {
    let found = (0..20).find_map(|seed| {
        let run = run_without_discard(seed, mutations);
        run.violations.first().map(|v| (seed, v.clone()))
    });
    let (seed, violation) = found.expect("the checker catches it");
    assert!(violation.contains(expected), "seed {seed}: {violation}");
}

#[test]
fn accepting_before_the_dependencies_is_caught() {
    let accept_without_deps = true;
    caught(
        Mutations {
            accept_without_deps,
            ..Mutations::default()
        },
        "without",
    );
}

#[test]
fn comparing_stamps_instead_of_hashes_is_caught() {
    let skip_by_stamp = true;
    caught(
        Mutations {
            skip_by_stamp,
            ..Mutations::default()
        },
        "did not converge",
    );
}

#[test]
fn returning_superseded_versions_is_caught() {
    let keep_superseded = true;
    caught(
        Mutations {
            keep_superseded,
            ..Mutations::default()
        },
        "latest writes",
    );
}

#[test]
fn reading_stale_data_without_suspicion_is_caught() {
    let never_suspect = true;
    caught(
        Mutations {
            never_suspect,
            ..Mutations::default()
        },
        "without suspecting",
    );
}

/// A node that refuses a fork's second branch instead of joining it as a virtual node keeps
/// whichever branch reached it first: correct nodes end on different branches.
#[test]
fn not_joining_a_fork_is_caught() {
    let refuse_forks = true;
    caught(
        Mutations {
            refuse_forks,
            ..Mutations::default()
        },
        "did not converge",
    );
}

/// Correct clients that consent to any discard proposal without asking their ladder let a
/// hastening client's list of current versions through: the discard is judged premature.
#[test]
fn consenting_without_the_ladder_is_caught() {
    let found = (0..20).find_map(|seed| {
        let mut shape = DepotConfig::from_seed(
            seed,
            Mutations {
                consent_unchecked: true,
                ..Mutations::default()
            },
        );
        shape.discard = true;
        *shape.kinds.last_mut().expect("clients") = Kind::Hastener;
        let run = run_shaped(seed, shape);
        run.violations.first().map(|v| (seed, v.clone()))
    });
    let (seed, violation) = found.expect("the checker catches it");
    assert!(
        violation.contains("which the ladder of correct client"),
        "seed {seed}: {violation}"
    );
}

/// Nodes that apply a discard proposal short of one client's consent drop values a refusing
/// client never agreed to let go.
#[test]
fn discarding_without_every_consent_is_caught() {
    let found = (0..20).find_map(|seed| {
        let mut shape = DepotConfig::from_seed(
            seed,
            Mutations {
                discard_short_of_one: true,
                ..Mutations::default()
            },
        );
        shape.discard = true;
        *shape.kinds.last_mut().expect("clients") = Kind::Refuser;
        let run = run_shaped(seed, shape);
        run.violations.first().map(|v| (seed, v.clone()))
    });
    let (seed, violation) = found.expect("the checker catches it");
    assert!(
        violation.contains("without every client's consent"),
        "seed {seed}: {violation}"
    );
}

/// The history checker (Appendix A's observer graphs, `bulwark_sim::fjc`, run on every run's
/// completed operations) catches broken reads on its own, beside the world's state checks.
#[test]
fn the_history_checker_alone_catches_broken_reads() {
    let broken = [
        Mutations {
            keep_superseded: true,
            ..Mutations::default()
        },
        Mutations {
            accept_without_deps: true,
            ..Mutations::default()
        },
    ];
    for mutations in broken {
        let found = (0..40).find_map(|seed| {
            run_without_discard(seed, mutations)
                .violations
                .into_iter()
                .find(|v| v.starts_with("FJC"))
        });
        let violation = found.unwrap_or_else(|| panic!("{mutations:?}: no FJC violation"));
        assert!(violation.contains("condition"), "{violation}");
    }
}
