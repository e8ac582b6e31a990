//! M-PoWerStore registers taken over into their group's next incarnation under random schedules,
//! with faulty members in the old group (the storage catalogue) and the new one (silent or
//! two-faced): every history linearizable, every confirmation leaving `f+1` correct members
//! holding its version, and the breaks the world can reach caught (`bulwark_sim::takeover`;
//! docs/state-transfer.md, "M-PoWerStore registers").

use bulwark_sim::takeover::{self, Mutation, NewFault, TakeoverConfig, TakeoverRun};

fn assert_clean(seed: u64, run: &TakeoverRun) {
    assert!(
        run.clean(),
        "seed {seed}: violations {:?}, confirmations short of f+1 correct holders {:?}, stuck {:?}",
        run.report.violations,
        run.unconfirmed_holders,
        run.stuck
    );
}

#[test]
fn registers_taken_over_into_the_next_incarnation_stay_linearizable() {
    let (mut carried, mut rereads, mut splits, mut abandoned, mut acknowledged) = (0, 0, 0, 0, 0);
    let (mut two_faced, mut old_liars) = (0, 0);
    for seed in 0..500 {
        let run = takeover::run(TakeoverConfig::new(seed));
        assert_clean(seed, &run);
        carried += run.carried;
        rereads += run.rereads;
        splits += run.splits;
        abandoned += run.abandoned;
        acknowledged += run.acknowledged;
        two_faced += usize::from(run.new_faults.contains(&Some(NewFault::TwoFaced)));
        old_liars += usize::from(run.old_faults.iter().any(|b| b.is_byzantine()));
    }
    // The runs reached what the take-over is for: writes cut short by the change, members
    // whose first reads carried different versions in, members reading again, liars on both sides.
    assert!(
        acknowledged > 0 && abandoned > 0 && carried > 0,
        "{carried} {abandoned}"
    );
    assert!(
        splits > 10 && rereads > 20,
        "splits {splits}, rereads {rereads}"
    );
    assert!(two_faced > 50 && old_liars > 50, "{two_faced} {old_liars}");
}

#[test]
fn registers_taken_over_at_f_2_stay_linearizable() {
    for seed in 1_000_000..1_000_060 {
        let run = takeover::run(TakeoverConfig {
            f: 2,
            ..TakeoverConfig::new(seed)
        });
        assert_clean(seed, &run);
    }
}

/// The first of `seeds` in which `mutations` break a check, and the run.
fn caught(mutations: &[Mutation], seeds: std::ops::Range<u64>) -> Option<(u64, TakeoverRun)> {
    seeds.into_iter().find_map(|seed| {
        let run = takeover::run(TakeoverConfig {
            mutations: mutations.to_vec(),
            ..TakeoverConfig::new(seed)
        });
        run.violated().then_some((seed, run))
    })
}

#[test]
fn old_members_that_answer_before_entering_the_new_epoch_lose_acknowledged_writes() {
    let (seed, run) = caught(&[Mutation::AnswerBeforeEntering], 0..100).expect("caught");
    assert!(
        !run.report.violations.is_empty(),
        "seed {seed} was caught by the holders check alone, not the linearizability checker"
    );
}

/// `mutation` makes a correct member serve a carried version fewer than `f+1` correct members
/// hold, and the holders check says so.
fn caught_by_the_holders_check(mutation: Mutation) {
    let (seed, run) = caught(&[mutation], 0..100).expect("caught");
    assert!(
        !run.unconfirmed_holders.is_empty(),
        "{mutation:?}: seed {seed} was caught, but not by the holders check"
    );
}

#[test]
fn confirming_a_take_over_at_f_plus_1_members_is_caught() {
    caught_by_the_holders_check(Mutation::SmallHoldQuorum);
}

#[test]
fn serving_a_carried_version_before_its_confirmation_is_caught() {
    caught_by_the_holders_check(Mutation::ServeAtCarry);
}
