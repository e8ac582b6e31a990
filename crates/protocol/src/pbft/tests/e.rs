//! A2M-PBFT-E's unit tests (spec §7.2 T3, T4, T5, T8, T9 and the recovery of §3.3.5): PBFT's
//! harness with an in-memory trusted log per replica.
//!
//! The split of T4 is two nets that share the faulty replicas' trusted logs: in one, replicas
//! 0, 1 and 2 run and 3 is cut off; in the other, 1, 2 and 3 run and 0 is cut off. Replicas 1 and
//! 2 are the faulty ones: each runs in both nets with the same keys and the same trusted log,
//! which is exactly an equivocating replica's power. Under plain PBFT (T5) the clients of the two
//! nets accept results of two different histories; under E they cannot.

use super::*;
use crate::pbft::history::{Attester, History};
use bulwark_a2m::{A2m, Component, Limits};
use bulwark_core::a2m::{self, Call, Outcome, Seq};

/// The request-history log every replica starts with.
const LOG: a2m::LogId = 7;

fn trusted_seed(slot: usize) -> [u8; 32] {
    [slot as u8 + 101; 32]
}

impl Net {
    /// `3f+1` replicas of A2M-PBFT-E, each with a trusted log of its own.
    fn e(f: usize) -> Net {
        let mut net = Net::new(f);
        net.components = (0..net.params.n)
            .map(|slot| {
                Rc::new(RefCell::new(Component::in_memory(
                    &trusted_seed(slot),
                    Limits::default(),
                )))
            })
            .collect();
        net.history = Some(History {
            attesters: (0..net.params.n)
                .map(|slot| Attester {
                    key: SecretKey::from_seed(&trusted_seed(slot)).public_key(),
                    log: LOG,
                })
                .collect(),
            base: Seq::from(2u32) << 96,
        });
        net.rebuild();
        net
    }

    /// Every replica anew from its setup, with empty disks.
    fn rebuild(&mut self) {
        self.replicas = (0..self.params.n)
            .map(|slot| Some(PbftReplica::new(self.setup(slot)).expect("a valid setup")))
            .collect();
        self.disks = (0..self.params.n).map(|_| Vec::new()).collect();
        self.durable = (0..self.params.n).map(|_| Durable::default()).collect();
    }

    /// A second net of the same replicas (keys, instance, histories) whose trusted logs are the
    /// same logs as this net's.
    fn twin(&self) -> Net {
        let mut twin = Net::new(self.params.f);
        twin.history = self.history.clone();
        twin.components = self.components.clone();
        twin.rebuild();
        twin
    }

    /// `slot`'s trusted log filling `seq` of `log` with a made-up value, and attesting it.
    fn advance_attest(
        &self,
        slot: usize,
        log: a2m::LogId,
        seq: Seq,
    ) -> Unverified<a2m::Attestation> {
        let answers = self.components[slot]
            .borrow_mut()
            .call_all(&[Call::AdvanceAttest {
                log,
                seq,
                digest: [0; 32],
                value: [1; 32],
                nonce: a2m::nonce_of(seq),
            }]);
        match answers.into_iter().next() {
            Some(Ok(Outcome::Attested(signed))) => signed.to_unverified(),
            other => panic!("an advance-attest answered {other:?}"),
        }
    }

    /// The history attestation `slot`'s trusted log makes of number `n`, as a reply carries it.
    fn lookup(&self, slot: usize, n: u64) -> Unverified<a2m::Attestation> {
        let history = self.history.as_ref().expect("an E net");
        let seq = history.at(n);
        let answers = self.components[slot].borrow_mut().call_all(&[Call::Lookup {
            log: history.attesters[slot].log,
            seq,
            nonce: a2m::nonce_of(seq),
        }]);
        match answers.into_iter().next() {
            Some(Ok(Outcome::Attested(signed))) => signed.to_unverified(),
            other => panic!("a lookup answered {other:?}"),
        }
    }
}

use bulwark_core::sign::Unverified;

/// Whether results accepted for `Add` requests on one counter that starts at 0 could all be true
/// of one sequence: of two, the later one's total includes the earlier one's and its own add.
fn counter_violation(accepted: &[(u64, u64)]) -> Option<String> {
    for (i, (add_x, total_x)) in accepted.iter().enumerate() {
        for (add_y, total_y) in &accepted[i + 1..] {
            let ((_, low), (add_high, high)) = if total_x <= total_y {
                ((add_x, total_x), (add_y, total_y))
            } else {
                ((add_y, total_y), (add_x, total_x))
            };
            if low == high || *high < low + add_high {
                return Some(format!(
                    "Add({add_x}) returned {total_x} and Add({add_y}) returned {total_y}: no \
                     order of one counter gives both"
                ));
            }
        }
    }
    None
}

#[test]
fn the_counter_checker_catches_two_first_writes_and_passes_one_order() {
    assert!(counter_violation(&[(5, 5), (7, 7)]).is_some());
    assert!(counter_violation(&[(5, 12), (7, 7)]).is_none());
    assert!(counter_violation(&[(5, 5), (7, 12), (1, 13)]).is_none());
    assert!(counter_violation(&[(5, 5), (7, 12), (1, 12)]).is_some());
}

#[test]
fn answers_carry_attested_history_slots_equal_on_every_replica() {
    let mut net = Net::e(1);
    assert_eq!(net.complete(Op::Add(5)), 5);
    assert_eq!(net.complete(Op::Add(2)), 7);
    net.run_for(500);
    let history = net.replica(0).history();
    assert!(history.is_some());
    for replica in net.live() {
        assert_eq!(replica.history(), history, "one chain on every replica");
        assert_eq!(replica.pbft_stats().attested, 2);
    }
    // Slot 2 of every log holds the same batch and cumulative digest.
    let positions: BTreeSet<_> = (0..4)
        .map(|slot| {
            let att = net.lookup(slot, 2).peek().expect("an attestation");
            (att.value, att.digest)
        })
        .collect();
    assert_eq!(positions.len(), 1);
}

#[test]
fn within_f_a_silent_primary_changes_nothing_and_certificates_still_form() {
    // T3: PBFT's behaviour within f is unchanged; the 2f+1 attested certificates still form
    // from the three correct replicas.
    let mut net = Net::e(1);
    assert_eq!(net.complete(Op::Add(3)), 3);
    net.silence(0);
    let client = net.submit(Op::Add(4));
    assert!(net.run_until(20_000, |net| net.result(client).is_some()));
    assert_eq!(net.ok(client), 7);
    assert!(net.live().skip(1).all(|r| r.view().0 >= 1));
}

#[test]
fn unattested_replayed_and_foreign_answers_do_not_count() {
    // T9: a client counts an answer only with its own replica's trusted-log lookup of a slot of
    // this instance; replays across replicas, logs and instances are refused.
    let mut net = Net::e(1);
    assert_eq!(net.complete(Op::Add(5)), 5);
    let history = net.history.clone().expect("an E net");
    let op = Op::Add(9);
    let digest = request(77, op.clone()).digest();
    let reply = Reply {
        view: 0,
        id: 77,
        request: digest,
        result: 14,
    };
    let mut submit: Submit<Counter> = Submit::attested(net.params, history.clone(), CLIENT, 77, op);
    let _ = submit.start();
    // Plain answers from everyone: nothing.
    for slot in 0..4 {
        let progress = submit.on_reply(Slot(slot), Answer::Executed(reply.clone()));
        assert!(matches!(progress, Progress::Send(_)));
    }
    // Replica 0's genuine attestation replayed as replicas 1, 2 and 3's.
    let genuine = net.lookup(0, 1);
    for slot in 1..4 {
        let progress = submit.on_reply(
            Slot(slot),
            Answer::Attested {
                reply: reply.clone(),
                history: genuine.clone(),
            },
        );
        assert!(matches!(progress, Progress::Send(_)));
    }
    assert_eq!(submit.bad_attestations().len(), 3);
    // Another log of replica 1's trusted log, and a slot of another instance.
    let other_log = net.advance_attest(1, LOG + 1, history.at(1));
    let other_instance = net.advance_attest(2, LOG + 2, history.base - 5);
    let mut fresh: Submit<Counter> = Submit::attested(net.params, history, CLIENT, 77, Op::Add(9));
    let _ = fresh.start();
    for (slot, history) in [(1, other_log), (2, other_instance)] {
        let progress = fresh.on_reply(
            Slot(slot),
            Answer::Attested {
                reply: reply.clone(),
                history,
            },
        );
        assert!(matches!(progress, Progress::Send(_)));
    }
    let reasons: Vec<&String> = fresh.bad_attestations().iter().map(|(_, r)| r).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[1].contains("not one of this instance's"),
        "{reasons:?}"
    );
}

#[test]
fn a_retransmission_after_the_history_was_truncated_gets_the_kept_attestation() {
    // T8: a retransmission is answered with the attestation made when its request executed,
    // whatever the log has done since: here every trusted log is down when it arrives.
    let mut net = Net::e(1);
    assert_eq!(net.complete(Op::Add(1)), 1);
    for _ in 0..8 {
        net.complete(Op::Add(1));
    }
    net.run_for(1_000);
    assert!(net.replica(0).stable_seq() >= 8);
    net.log_down.extend(0..4);
    let again = net.submit_as(1, Op::Add(1));
    net.run();
    assert_eq!(net.ok(again), 1, "the retransmission gets the first result");
    // Past the truncation lag the history's early slots are forgotten; the last ones below
    // the stable checkpoint are kept for replicas that restart.
    net.log_down.clear();
    let lag = crate::pbft::history::TRUNCATE_LAG;
    for _ in 0..lag + 16 {
        net.complete(Op::Add(1));
    }
    net.run_for(1_000);
    let stable = net.replica(0).stable_seq();
    assert!(stable > lag);
    let first = net.lookup(0, 1).peek().expect("an attestation");
    assert_eq!(first.status, a2m::Status::Forgotten);
    let kept = net.lookup(0, stable - lag).peek().expect("an attestation");
    assert_eq!(kept.status, a2m::Status::Assigned);
}

#[test]
fn a_restarted_replica_reads_its_history_back_instead_of_filling_it_again() {
    let mut net = Net::e(1);
    for add in 1..=3 {
        net.complete(Op::Add(add));
    }
    net.crash(1);
    net.restore(1);
    net.run_for(1_000);
    assert_eq!(net.replica(1).stopped(), None);
    assert_eq!(net.replica(1).history(), net.replica(0).history());
    // Its answers to a retransmission of request 3 carry the slot read back from the log.
    net.isolate(3);
    let again = net.submit_as(3, Op::Add(3));
    net.run();
    assert_eq!(net.ok(again), 6);
    net.unblock("isolate");
    assert_eq!(net.complete(Op::Add(4)), 10);
}

#[test]
fn a_replica_restarted_at_a_checkpoint_still_attests_what_executed_below_it() {
    // Where each request executed is part of the checkpointed state, so a replica restored
    // from a checkpoint (which re-executes nothing below it) asks its log for the slot.
    let mut net = Net::e(1);
    for _ in 0..9 {
        net.complete(Op::Add(1));
    }
    net.run_for(1_000);
    assert!(net.replica(1).stable_seq() >= 8);
    net.crash(1);
    net.restore(1);
    net.isolate(0);
    let again = net.submit_as(7, Op::Add(1));
    net.run_for(500);
    assert_eq!(net.ok(again), 7);
    assert_eq!(net.replica(1).stopped(), None);
}

#[test]
fn a_replica_that_catches_up_by_state_transfer_brings_its_history_to_the_checkpoint() {
    let mut net = Net::e(1);
    net.isolate(3);
    for _ in 0..36 {
        net.complete(Op::Add(2));
    }
    assert_eq!(net.replica(0).stable_seq(), 32);
    net.unblock("isolate");
    assert_eq!(net.complete(Op::Add(2)), 74);
    net.run_for(1_000);
    assert!(net.replica(3).pbft_stats().transfers >= 1);
    assert_eq!(net.replica(3).executed(), 37);
    assert_eq!(net.replica(3).history(), net.replica(0).history());
    // Its log was advanced to the checkpoint and filled on from there.
    let installed = net.lookup(3, 32).peek().expect("an attestation");
    assert_eq!(installed.status, a2m::Status::Assigned);
    assert_eq!(
        installed.digest,
        net.lookup(0, 32).peek().expect("an attestation").digest
    );
    // Its answers count: with replica 1 cut off, a certificate needs it.
    net.isolate(1);
    assert_eq!(net.complete(Op::Add(2)), 76);
    assert_eq!(net.replica(3).stopped(), None);
}

#[test]
fn a_trusted_log_that_is_down_holds_the_answers_and_f_plus_1_attested_ones_are_not_enough() {
    let mut net = Net::e(1);
    net.holding.insert(2);
    net.holding.insert(3);
    let client = net.submit(Op::Add(5));
    net.run_for(1_000);
    // Two attested answers (f+1, all PBFT's clients need) do not make a certificate.
    assert!(net.result(client).is_none(), "two logs silent: no 2f+1");
    net.release(3);
    net.run();
    assert_eq!(net.ok(client), 5);
    net.release(2);
    net.run_for(500);
    assert_eq!(net.replica(2).pbft_stats().attested, 1);
}

#[test]
fn numbers_executed_while_the_trusted_log_was_down_are_attested_in_order_once_it_is_back() {
    let mut net = Net::e(1);
    net.log_down.insert(3);
    assert_eq!(net.complete(Op::Add(1)), 1);
    assert_eq!(net.complete(Op::Add(2)), 3);
    assert_eq!(net.replica(3).pbft_stats().attested, 0);
    net.log_down.remove(&3);
    net.run_for(500);
    let stats = net.replica(3).pbft_stats();
    assert_eq!(stats.attested, 2, "{stats:?}");
    assert_eq!(net.replica(3).stopped(), None);
    // Nothing was jumped over: both slots hold their batches.
    for n in [1, 2] {
        let slot = net.lookup(3, n).peek().expect("an attestation");
        assert_eq!(slot.status, a2m::Status::Assigned);
        assert_eq!(slot.digest, net.lookup(0, n).peek().expect("one").digest);
    }
    // Replica 3's attested answer is needed once replica 0 is cut off.
    net.isolate(0);
    let again = net.submit_as(1, Op::Add(1));
    net.run();
    assert_eq!(net.ok(again), 1);
}

#[test]
fn a_replica_whose_trusted_log_is_full_stops_rather_than_drop_an_entry() {
    // T11: the log refuses to append past its bound; the replica stops, says why, and the
    // others go on.
    let mut net = Net::e(1);
    net.components[3] = Rc::new(RefCell::new(Component::in_memory(
        &trusted_seed(3),
        Limits {
            entries_max: 6,
            ..Limits::default()
        },
    )));
    for add in 1..=12 {
        assert_eq!(net.complete(Op::Add(1)), add);
    }
    let stopped = net.replica(3).stopped().expect("replica 3 stopped");
    assert!(stopped.contains("full"), "{stopped}");
    assert!(net.replica(3).pbft_stats().attested < 12);
    // It refuses what it is sent from then on, saying why.
    let refused = net.refusals_at(3);
    net.complete(Op::Add(1));
    assert!(net.refusals_at(3) > refused);
}

// ---------------------------------------------------------------------------------------------
// T4, T5 and recovery: 2 faulty replicas of 4 split the correct ones

/// How the two faulty replicas (1 and 2) use their trusted logs in the split.
#[derive(Clone, Copy, PartialEq)]
enum Faulty {
    /// Both attest the first net's batch first (the second net's replicas 1 and 2 then find
    /// their slot taken).
    SideWithFirst,
    /// Replica 1 attests the first net's batch, replica 2 the second's.
    Split,
}

struct SplitRun {
    first: Net,
    second: Net,
    a: usize,
    b: usize,
}

/// Replicas 0, 1, 2 order `Add(5)` while 3 is cut off; replicas 1, 2, 3 order `Add(7)` while
/// 0 is cut off (they change view away from the silent primary 0). Under E (`e`), replicas 1 and
/// 2 share one trusted log each across the two nets.
fn split(e: bool, faulty: Faulty) -> SplitRun {
    let mut first = if e { Net::e(1) } else { Net::new(1) };
    let mut second = first.twin();
    // The correct replica each net does not have is down there; the faulty ones run in both.
    first.crash(3);
    second.crash(0);
    if faulty == Faulty::Split {
        first.holding.insert(2);
        second.holding.insert(1);
    }
    let a = first.submit(Op::Add(5));
    first.run_for(2_000);
    let b = second.submit(Op::Add(7));
    second.run_for(20_000);
    if faulty == Faulty::Split {
        first.release(2);
        second.release(1);
        first.run_for(1_000);
        second.run_for(1_000);
    }
    first.run_for(5_000);
    second.run_for(5_000);
    SplitRun {
        first,
        second,
        a,
        b,
    }
}

fn accepted(run: &SplitRun) -> Vec<(u64, u64)> {
    let mut accepted = Vec::new();
    if let Some(Ok(total)) = run.first.result(run.a) {
        accepted.push((5, *total));
    }
    if let Some(Ok(total)) = run.second.result(run.b) {
        accepted.push((7, *total));
    }
    accepted
}

#[test]
fn plain_pbft_with_two_faulty_of_four_accepts_results_of_two_histories() {
    // T5, the negative control: the same schedule under PBFT. Both clients accept f+1 matching
    // results, each of a history in which its request came first, and the checker sees it.
    let run = split(false, Faulty::SideWithFirst);
    let accepted = accepted(&run);
    assert_eq!(accepted, vec![(5, 5), (7, 7)], "both clients accept");
    let violation = counter_violation(&accepted).expect("the checker catches the split");
    assert!(violation.contains("no order"), "{violation}");
    // The correct replicas 0 and 3 executed different batches at number 1.
    assert_ne!(
        run.first.replica(0).state_digest(),
        run.second.replica(3).state_digest()
    );
}

#[test]
fn under_e_the_same_split_never_gives_two_clients_conflicting_results() {
    // T4: the faulty replicas side with the first net. Its client accepts (three attested
    // answers); in the second net replicas 1 and 2 find slot 1 of their logs holding the other
    // batch and stop, so its client never gets three.
    let run = split(true, Faulty::SideWithFirst);
    let accepted = accepted(&run);
    assert_eq!(counter_violation(&accepted), None, "{accepted:?}");
    assert_eq!(accepted, vec![(5, 5)]);
    assert!(
        run.second.result(run.b).is_none(),
        "the second client stalls"
    );
    for slot in [1, 2] {
        let stopped = run.second.replica(slot).stopped().expect("stopped");
        assert!(stopped.contains("another batch"), "{stopped}");
    }
    // The correct replica 3 executed at number 1 what its peers' logs do not hold.
    assert_eq!(run.second.replica(3).stopped(), None);
    assert_ne!(
        run.first.replica(0).history(),
        run.second.replica(3).history()
    );
}

#[test]
fn under_e_a_split_of_the_faulty_logs_stalls_both_clients_and_shows_the_fork() {
    // T4 as the spec draws it: replica 1 attests the first batch, replica 2 the second. Neither
    // client gets three matching attested answers; both stall, and the answers they did get
    // show number 1 holding two batches.
    let mut run = split(true, Faulty::Split);
    assert_eq!(accepted(&run), Vec::<(u64, u64)>::new(), "both stall");
    let first = run.first.clients[run.a].submit.positions();
    let second = run.second.clients[run.b].submit.positions();
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(second.len(), 2, "{second:?}");
    let at_one: BTreeSet<_> = first
        .iter()
        .chain(&second)
        .filter(|(_, p)| p.seq == 1)
        .map(|(_, p)| p.batch)
        .collect();
    assert_eq!(at_one.len(), 2, "the fork is visible at number 1");

    // Recovery (spec §3.3.5). Offline, the operator finds the fork point (number 1), keeps the
    // history of replica 0's side, repairs the divergent replicas 1, 2 and 3 (their records
    // removed) and gives each a new request-history log, then restarts everything.
    let mut history = run.first.history.clone().expect("an E net");
    for slot in 1..4 {
        history.attesters[slot].log = LOG + 10;
    }
    let mut net = run.first.twin();
    net.history = Some(history.clone());
    net.rebuild();
    let kept = std::mem::take(&mut run.first.disks[0]);
    net.disks[0] = kept;
    net.restore(0);
    assert_eq!(net.replica(0).executed(), 1);
    // The second client asks again: its request executes after the kept one, and four
    // replicas answer with one history.
    let b = net.submit(Op::Add(7));
    assert!(net.run_until(20_000, |net| net.result(b).is_some()));
    assert_eq!(net.ok(b), 12);
    let mut all = accepted(&run);
    all.push((7, 12));
    assert_eq!(counter_violation(&all), None);
    net.run_for(1_000);
    for slot in 0..4 {
        assert_eq!(net.replica(slot).stopped(), None);
        assert_eq!(net.replica(slot).history(), net.replica(0).history());
    }
}

#[test]
fn a_replica_that_installs_the_other_sides_state_never_vouches_for_it_with_its_own_slots() {
    // Beyond f: replicas 1 and 2 order Add(7) at number 1 with replica 3 (their trusted logs
    // hold it), then sign replica 0's side of the split, where Add(5) executed at 1, through a
    // stable checkpoint that replica 3 installs. Replica 3's log holds Add(7)'s batch at 1: it
    // must never answer Add(5)'s retransmission with that slot (a client would then take
    // Add(5)'s result at the position where Add(7)'s was accepted), and stops instead.
    let mut second = Net::e(1);
    second.crash(0);
    let b = second.submit(Op::Add(7));
    second.run_for(20_000);
    assert_eq!(second.ok(b), 7, "the second side accepts");
    // The first side, where replicas 1 and 2 sign whatever they are asked: E's state, on
    // trusted logs of their own.
    let mut first_e = Net::e(1);
    first_e.crash(3);
    for _ in 0..9 {
        first_e.complete(Op::Add(5));
    }
    first_e.run_for(1_000);
    let transfer = first_e.disks[0]
        .iter()
        .rev()
        .find_map(|change| match change {
            Change::Checkpoint(transfer) if transfer.proof.seq == 8 => Some(transfer.clone()),
            _ => None,
        })
        .expect("a stable checkpoint at 8");
    let (refused, _) = second.inject(0, 3, Message::State(transfer));
    assert_eq!(refused, None);
    second.run();
    assert_eq!(
        second.replica(3).executed(),
        8,
        "replica 3 installed the first side's state"
    );
    // Add(5)'s first request retransmitted to the second side.
    let a = second.submit_as(1, Op::Add(5));
    second.run_for(1_000);
    let wrong: Vec<_> = second.clients[a]
        .submit
        .positions()
        .into_iter()
        .filter(|(slot, _)| *slot == Slot(3))
        .collect();
    assert!(
        wrong.is_empty(),
        "replica 3 vouched with its own slot: {wrong:?}"
    );
    let stopped = second.replica(3).stopped().expect("replica 3 stopped");
    assert!(stopped.contains("another batch"), "{stopped}");
}
