use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

const KEY: &[u8] = b"k";

fn bytes(value: &str) -> Value {
    Some(value.as_bytes().to_vec())
}

fn write(client: u64, value: &str, invoke: u64, complete: u64) -> Op {
    Op::write(client, KEY, bytes(value), invoke, complete)
}

fn delete(client: u64, invoke: u64, complete: u64) -> Op {
    Op::write(client, KEY, None, invoke, complete)
}

fn unknown_write(client: u64, value: &str, invoke: u64) -> Op {
    Op::unknown_write(client, KEY, bytes(value), invoke)
}

fn read(client: u64, returned: Option<&str>, invoke: u64, complete: u64) -> Op {
    Op::read(client, KEY, returned.and_then(bytes), invoke, complete)
}

fn history(ops: Vec<Op>) -> History {
    History { ops }
}

#[test]
fn linearizable_histories_pass() {
    let cases: Vec<(&str, Vec<Op>)> = vec![
        ("empty", vec![]),
        (
            "sequential",
            vec![
                read(1, None, 0, 1),
                write(1, "a", 2, 3),
                read(2, Some("a"), 4, 5),
                write(2, "b", 6, 7),
                read(1, Some("b"), 8, 9),
            ],
        ),
        (
            "concurrent writes, later reads agree on a-then-b",
            vec![
                write(1, "a", 0, 10),
                write(2, "b", 1, 11),
                read(3, Some("b"), 12, 13),
                read(4, Some("b"), 14, 15),
            ],
        ),
        (
            "concurrent writes, later reads agree on b-then-a",
            vec![
                write(1, "a", 0, 10),
                write(2, "b", 1, 11),
                read(3, Some("a"), 12, 13),
                read(4, Some("a"), 14, 15),
            ],
        ),
        (
            "reads during concurrent writes see both orders over time",
            vec![
                write(1, "a", 0, 10),
                write(2, "b", 0, 10),
                read(3, Some("a"), 1, 2),
                read(3, Some("b"), 3, 4),
            ],
        ),
        (
            "read concurrent with a write sees the old value",
            vec![
                write(1, "a", 0, 1),
                write(1, "b", 2, 10),
                read(2, Some("a"), 3, 4),
            ],
        ),
        (
            "read concurrent with a write sees the new value",
            vec![
                write(1, "a", 0, 1),
                write(1, "b", 2, 10),
                read(2, Some("b"), 3, 4),
                read(3, Some("b"), 5, 6),
            ],
        ),
        (
            "delete then read absent",
            vec![write(1, "a", 0, 1), delete(1, 2, 3), read(2, None, 4, 5)],
        ),
        (
            "unknown write shows up in a later read",
            vec![
                write(1, "a", 0, 1),
                unknown_write(2, "b", 2),
                read(3, Some("a"), 10, 11),
                read(3, Some("b"), 50, 51),
            ],
        ),
        (
            "unknown write never shows up",
            vec![
                write(1, "a", 0, 1),
                unknown_write(2, "b", 2),
                read(3, Some("a"), 50, 51),
                read(3, Some("a"), 60, 61),
            ],
        ),
        (
            "unknown write takes effect after a later completed write",
            vec![
                unknown_write(1, "a", 0),
                write(2, "b", 10, 11),
                read(3, Some("b"), 12, 13),
                read(3, Some("a"), 14, 15),
            ],
        ),
        (
            "unknown read imposes nothing",
            vec![
                write(1, "a", 0, 1),
                Op {
                    outcome: Outcome::Unknown,
                    complete: None,
                    ..read(2, Some("zz"), 2, 3)
                },
                read(3, Some("a"), 4, 5),
            ],
        ),
        (
            "the same bytes written twice may reappear",
            vec![
                write(1, "a", 0, 1),
                write(1, "b", 2, 3),
                write(2, "a", 4, 5),
                read(3, Some("a"), 6, 7),
            ],
        ),
        (
            "equal times are concurrent, not ordered",
            vec![write(1, "a", 0, 5), read(2, None, 5, 6)],
        ),
    ];
    for (name, ops) in cases {
        let report = check(&history(ops));
        assert!(report.ok, "{name}: {:#?}", report.violations);
        assert!(report.inconclusive.is_empty(), "{name}");
    }
}

#[test]
fn violations_are_caught_and_explained() {
    let cases: Vec<(&str, Vec<Op>, &str)> = vec![
        (
            "stale read after a completed write",
            vec![
                write(1, "a", 0, 1),
                write(1, "b", 2, 3),
                read(2, Some("a"), 4, 5),
            ],
            "writes completed before it began",
        ),
        (
            "new-old inversion",
            vec![
                write(1, "a", 0, 1),
                write(1, "b", 2, 20),
                read(2, Some("b"), 3, 4),
                read(3, Some("a"), 5, 6),
            ],
            "reads completed before it began that saw other values",
        ),
        (
            "value never written",
            vec![write(1, "a", 0, 1), read(2, Some("zz"), 2, 3)],
            "no write of this key ever wrote that value",
        ),
        (
            "deleted value returned after a completed delete",
            vec![
                write(1, "a", 0, 1),
                delete(1, 2, 3),
                read(2, Some("a"), 4, 5),
            ],
            "client 1 delete [2, 3]",
        ),
        (
            "sequential reads contradict the order of two concurrent writes",
            vec![
                write(1, "a", 0, 10),
                write(2, "b", 0, 10),
                read(3, Some("a"), 11, 12),
                read(3, Some("b"), 13, 14),
            ],
            "client 3 read [13, 14] -> \"b\" is explained by no order",
        ),
        (
            "two readers observe two concurrent writes in opposite orders",
            vec![
                write(1, "a", 0, 100),
                write(2, "b", 0, 100),
                read(3, Some("a"), 1, 2),
                read(3, Some("b"), 3, 4),
                read(4, Some("b"), 1, 2),
                read(4, Some("a"), 3, 4),
            ],
            "no order of the operations up to time 4",
        ),
        (
            "read of a value before its write began",
            vec![read(2, Some("a"), 0, 1), write(1, "a", 2, 3)],
            "every write of that value began after the read returned",
        ),
        (
            "absent read after a completed write",
            vec![write(1, "a", 0, 1), read(2, None, 2, 3)],
            "absent is the initial value",
        ),
        (
            "unknown write seen, then the older value again",
            vec![
                write(1, "a", 0, 1),
                unknown_write(2, "b", 2),
                read(3, Some("b"), 10, 11),
                read(3, Some("a"), 12, 13),
            ],
            "client 3 read [12, 13] -> \"a\"",
        ),
    ];
    for (name, ops, expected) in cases {
        let report = check(&history(ops));
        assert!(!report.ok, "{name} was not caught");
        assert_eq!(report.violations.len(), 1, "{name}");
        assert_eq!(report.verdict(KEY), Some(KeyVerdict::Violation), "{name}");
        let violation = &report.violations[0];
        assert_eq!(violation.key, KEY.to_vec(), "{name}");
        assert!(
            violation.explanation.starts_with("key \"k\": "),
            "{name}: {}",
            violation.explanation
        );
        assert!(
            violation.explanation.contains(expected),
            "{name}: expected {expected:?} in {}",
            violation.explanation
        );
        assert!(!violation.conflicting.is_empty(), "{name}");
        eprintln!("{name}: {}", violation.explanation);
    }
}

#[test]
fn the_first_unexplainable_read_is_named_even_after_a_cut() {
    let report = check(&history(vec![
        write(1, "a", 0, 1),
        read(2, Some("a"), 2, 3),
        // A cut: nothing is concurrent across time 3..10.
        write(1, "b", 10, 20),
        read(2, Some("b"), 11, 12),
        read(3, Some("a"), 13, 14),
        read(3, Some("zz"), 30, 31),
    ]));
    assert!(!report.ok);
    let violation = &report.violations[0];
    assert!(
        violation
            .explanation
            .contains("client 3 read [13, 14] -> \"a\""),
        "{}",
        violation.explanation
    );
    assert!(
        violation.explanation.contains(
            "The history before time 10 is linearizable and can leave the register holding \"a\""
        ),
        "{}",
        violation.explanation
    );
    assert_eq!(violation.conflicting[0], read(3, Some("a"), 13, 14));
    assert_eq!(report.keys[0].segments, 4);
}

#[test]
fn keys_are_checked_independently() {
    let mut history = History::new();
    history.push(write(1, "a", 0, 1));
    history.push(Op::write(1, b"other", bytes("x"), 0, 1));
    history.push(read(2, Some("a"), 2, 3));
    history.push(Op::read(2, b"other", bytes("a"), 2, 3));
    let report = check(&history);
    assert!(!report.ok);
    assert_eq!(report.keys_checked, 2);
    assert_eq!(report.ops_checked, 4);
    assert_eq!(report.verdict(KEY), Some(KeyVerdict::Linearizable));
    assert_eq!(report.verdict(b"other"), Some(KeyVerdict::Violation));
    assert_eq!(report.violations.len(), 1);
    assert_eq!(report.violations[0].key, b"other".to_vec());
    assert!(report.violations[0].explanation.contains("key \"other\""));
}

#[test]
fn recording_helpers_follow_an_operation_through_its_life() {
    let mut history = History::new();
    let put = history.invoke(1, KEY, OpKind::Write(bytes("a")), 0);
    let get = history.invoke(2, KEY, OpKind::Read, 1);
    let lost = history.invoke(3, KEY, OpKind::Write(bytes("b")), 1);
    assert_eq!(history.len(), 3);
    assert_eq!(history.complete(put, 2, Outcome::Ok), Ok(()));
    assert_eq!(history.complete(get, 3, Outcome::Read(bytes("a"))), Ok(()));
    assert_eq!(
        history.complete(put, 4, Outcome::Ok),
        Err(RecordError::AlreadyComplete { index: put })
    );
    assert_eq!(
        history.complete(lost, 4, Outcome::Read(None)),
        Err(RecordError::MismatchedOutcome {
            index: lost,
            outcome: Outcome::Read(None)
        })
    );
    assert_eq!(
        history.complete(9, 4, Outcome::Ok),
        Err(RecordError::NoSuchOp { index: 9 })
    );
    assert_eq!(history.ops()[lost].outcome, Outcome::Unknown);
    assert!(check(&history).ok);
    history.push(read(4, Some("a"), 10, 11));
    history.push(read(4, Some("b"), 12, 13));
    history.push(read(4, Some("a"), 14, 15));
    assert!(!check(&history).ok);
}

#[test]
fn a_tiny_budget_is_inconclusive_not_a_verdict() {
    // Many concurrent writes of the same two values with no reads to pin them down until the end:
    // the search has real work to do.
    let mut ops = Vec::new();
    for client in 0..12 {
        let value = if client % 2 == 0 { "a" } else { "b" };
        ops.push(write(client, value, client, 100 + client));
    }
    ops.push(read(20, Some("c"), 200, 201));
    ops.push(write(21, "c", 0, 300));
    let history = history(ops);
    let report = check_with_budget(&history, 5);
    assert!(!report.ok);
    assert!(report.violations.is_empty());
    assert_eq!(report.inconclusive, vec![KEY.to_vec()]);
    assert_eq!(report.verdict(KEY), Some(KeyVerdict::Inconclusive));
    // With the real budget the same history is decided.
    assert!(check(&history).ok);
}

// ---------------------------------------------------------------------------------------------
// Randomised: histories generated from an atomic register must pass; a corrupted read must not.

struct Shape {
    clients: u64,
    ops: usize,
    /// Longest operation.
    duration_max: u64,
    /// Longest pause between a client's operations; small pauses leave few cuts.
    pause_max: u64,
    write_probability: f64,
    delete_probability: f64,
    /// Chance that a write reuses an earlier value instead of a fresh one.
    reuse_probability: f64,
    /// Chance that an operation never answers (its client then restarts under a new id).
    unknown_probability: f64,
}

impl Shape {
    fn typical() -> Shape {
        Shape {
            clients: 4,
            ops: 60,
            duration_max: 30,
            pause_max: 20,
            write_probability: 0.4,
            delete_probability: 0.1,
            reuse_probability: 0.1,
            unknown_probability: 0.05,
        }
    }
}

/// Simulates an atomic register: every operation takes effect at a random point of its interval
/// (an unanswered write at any point after its invocation, or never), and reads return what the
/// register held at their point.
fn linearizable_history(seed: u64, shape: &Shape) -> History {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    struct Planned {
        op: Op,
        point: Option<u64>,
    }
    let mut planned: Vec<Planned> = Vec::new();
    let mut clock = vec![0u64; shape.clients as usize];
    let mut incarnation = vec![0u64; shape.clients as usize];
    let mut written: Vec<Value> = Vec::new();
    for index in 0..shape.ops {
        let slot = rng.random_range(0..shape.clients as usize);
        let invoke = clock[slot] + rng.random_range(1..=shape.pause_max.max(1));
        let complete = invoke + rng.random_range(0..=shape.duration_max);
        let client = slot as u64 * 1_000 + incarnation[slot];
        let unknown = rng.random_bool(shape.unknown_probability);
        let point = if unknown {
            rng.random_bool(0.5)
                .then(|| invoke + rng.random_range(0..=shape.duration_max * 4))
        } else {
            Some(rng.random_range(invoke..=complete))
        };
        let kind = if rng.random_bool(shape.write_probability) {
            let value = if rng.random_bool(shape.delete_probability) {
                None
            } else if !written.is_empty() && rng.random_bool(shape.reuse_probability) {
                written[rng.random_range(0..written.len())].clone()
            } else {
                Some(format!("v{index}").into_bytes())
            };
            written.push(value.clone());
            OpKind::Write(value)
        } else {
            OpKind::Read
        };
        let (complete, outcome) = if unknown {
            incarnation[slot] += 1;
            clock[slot] = invoke;
            (None, Outcome::Unknown)
        } else {
            clock[slot] = complete;
            (Some(complete), Outcome::Ok)
        };
        planned.push(Planned {
            op: Op {
                client,
                key: KEY.to_vec(),
                kind,
                invoke,
                complete,
                outcome,
            },
            point,
        });
    }
    let mut order: Vec<usize> = (0..planned.len())
        .filter(|&i| planned[i].point.is_some())
        .collect();
    order.sort_by_key(|&i| planned[i].point);
    let mut register: Value = None;
    for index in order {
        let op = &mut planned[index].op;
        match &op.kind {
            OpKind::Write(value) => register = value.clone(),
            OpKind::Read if op.outcome == Outcome::Ok => {
                op.outcome = Outcome::Read(register.clone())
            }
            OpKind::Read => {}
        }
    }
    History {
        ops: planned.into_iter().map(|p| p.op).collect(),
    }
}

/// Changes one completed read so that no linearization can explain it, if the history has one:
/// either to a value never written, or to the value of a write that was certainly overwritten by
/// an acknowledged write of a fresh value before the read began.
fn corrupt(history: &mut History, rng: &mut ChaCha8Rng) -> bool {
    let reads: Vec<usize> = (0..history.ops.len())
        .filter(|&i| history.ops[i].returned().is_some())
        .collect();
    if reads.is_empty() {
        return false;
    }
    let target = reads[rng.random_range(0..reads.len())];
    let ops = &history.ops;
    let count = |value: &Value| ops.iter().filter(|op| op.written() == Some(value)).count();
    let stale = rng.random_bool(0.5).then(|| {
        let read_invoke = ops[target].invoke;
        // old: a value written exactly once, by an acknowledged write `old`; newer: an
        // acknowledged write of another value written exactly once, invoked after `old`
        // completed and completed before the read began.
        ops.iter().find_map(|old| {
            let old_value = old.written()?;
            if !old.is_acknowledged_write() || count(old_value) != 1 {
                return None;
            }
            let old_complete = old.complete?;
            ops.iter()
                .any(|newer| {
                    newer.is_acknowledged_write()
                        && newer
                            .written()
                            .is_some_and(|v| v != old_value && count(v) == 1)
                        && newer.invoke > old_complete
                        && newer.complete.is_some_and(|c| c < read_invoke)
                })
                .then(|| old_value.clone())
        })
    });
    let replacement = stale
        .flatten()
        .unwrap_or_else(|| Some(b"never written".to_vec()));
    history.ops[target].outcome = Outcome::Read(replacement);
    true
}

#[test]
fn random_linearizable_histories_pass_and_a_corrupted_read_is_caught() {
    let mut caught = 0;
    for seed in 0..300u64 {
        let mut shape = Shape::typical();
        shape.clients = 1 + seed % 6;
        shape.pause_max = [1, 5, 20][(seed % 3) as usize];
        shape.reuse_probability = [0.0, 0.1, 0.5][(seed / 3 % 3) as usize];
        let mut history = linearizable_history(seed, &shape);
        let report = check(&history);
        assert!(report.ok, "seed {seed}: {:#?}", report.violations);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        if corrupt(&mut history, &mut rng) {
            let report = check(&history);
            assert!(!report.ok, "seed {seed}: corrupted read not caught");
            assert_eq!(report.violations.len(), 1, "seed {seed}");
            caught += 1;
        }
    }
    assert!(
        caught > 250,
        "only {caught} histories had a read to corrupt"
    );
}

// ---------------------------------------------------------------------------------------------
// Differential: on small arbitrary histories, the checker agrees with the definition applied
// by brute force.

/// Linearizable by the definition: some sequence of all required operations and any subset of
/// optional writes, respecting real-time order, in which every read returns the latest write.
fn linearizable_by_brute_force(ops: &[Op]) -> bool {
    let ops: Vec<&Op> = ops
        .iter()
        .filter(|op| op.returned().is_some() || op.written().is_some())
        .collect();
    let required: Vec<bool> = ops
        .iter()
        .map(|op| op.returned().is_some() || op.is_acknowledged_write())
        .collect();
    let ends: Vec<u64> = ops
        .iter()
        .zip(&required)
        .map(|(op, &required)| {
            if required {
                op.complete.unwrap_or(NEVER)
            } else {
                NEVER
            }
        })
        .collect();
    fn extend(
        ops: &[&Op],
        required: &[bool],
        ends: &[u64],
        sequence: &mut Vec<usize>,
        taken: &mut Vec<bool>,
    ) -> bool {
        if (0..ops.len()).all(|i| taken[i] || !required[i]) && valid(ops, ends, sequence) {
            return true;
        }
        for next in 0..ops.len() {
            if taken[next] {
                continue;
            }
            taken[next] = true;
            sequence.push(next);
            let found = extend(ops, required, ends, sequence, taken);
            sequence.pop();
            taken[next] = false;
            if found {
                return true;
            }
        }
        false
    }
    fn valid(ops: &[&Op], ends: &[u64], sequence: &[usize]) -> bool {
        for (position, &earlier) in sequence.iter().enumerate() {
            for &later in &sequence[position + 1..] {
                if ends[later] < ops[earlier].invoke {
                    return false;
                }
            }
        }
        // Only optional writes are ever left out (the caller checks), and they constrain nothing.
        let mut register: Value = None;
        for &index in sequence {
            if let Some(value) = ops[index].written() {
                register = value.clone();
            } else if ops[index].returned() != Some(&register) {
                return false;
            }
        }
        true
    }
    let mut taken = vec![false; ops.len()];
    extend(&ops, &required, &ends, &mut Vec::new(), &mut taken)
}

fn small_op() -> impl Strategy<Value = Op> {
    (0u8..6, 0usize..4, 0u64..12, 0u64..6, 0u64..3).prop_map(
        |(shape, value, invoke, duration, client)| {
            let value = [None, bytes("a"), bytes("b"), bytes("c")][value].clone();
            let complete = invoke + duration;
            match shape {
                0 | 1 => Op::write(client, KEY, value, invoke, complete),
                2 => Op::unknown_write(client, KEY, value, invoke),
                // A timed-out write: it has a give-up time but may still take effect.
                3 => Op {
                    complete: Some(complete),
                    ..Op::unknown_write(client, KEY, value, invoke)
                },
                _ => Op::read(client, KEY, value, invoke, complete),
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn agrees_with_brute_force_on_small_histories(ops in prop::collection::vec(small_op(), 1..7)) {
        let expected = linearizable_by_brute_force(&ops);
        let report = check(&History { ops: ops.clone() });
        prop_assert_eq!(report.ok, expected, "{:#?}\n{:#?}", ops, report);
        prop_assert_eq!(report.violations.len(), usize::from(!expected));
    }
}

/// The Wing–Gong search in its plainest form, with no pruning beyond remembering failed states:
/// an independent reference for histories too long to enumerate.
fn linearizable_by_reference(ops: &[Op]) -> bool {
    let ops: Vec<&Op> = ops
        .iter()
        .filter(|op| op.returned().is_some() || op.written().is_some())
        .collect();
    assert!(
        ops.len() <= 64,
        "the reference handles at most 64 operations"
    );
    let required: u64 = (0..ops.len())
        .filter(|&i| ops[i].returned().is_some() || ops[i].is_acknowledged_write())
        .fold(0, |mask, i| mask | 1 << i);
    let end = |i: usize| {
        if required & (1 << i) != 0 {
            ops[i].complete.unwrap_or(NEVER)
        } else {
            NEVER
        }
    };
    fn search(
        ops: &[&Op],
        required: u64,
        end: &dyn Fn(usize) -> u64,
        placed: u64,
        value: &Value,
        failed: &mut HashSet<(u64, Value)>,
    ) -> bool {
        if placed & required == required {
            return true;
        }
        if failed.contains(&(placed, value.clone())) {
            return false;
        }
        for next in 0..ops.len() {
            if placed & (1 << next) != 0 {
                continue;
            }
            let blocked = (0..ops.len()).any(|other| {
                other != next && placed & (1 << other) == 0 && end(other) < ops[next].invoke
            });
            if blocked {
                continue;
            }
            let after = match (ops[next].written(), ops[next].returned()) {
                (Some(written), _) => written.clone(),
                (None, Some(returned)) if returned == value => value.clone(),
                _ => continue,
            };
            if search(ops, required, end, placed | 1 << next, &after, failed) {
                return true;
            }
        }
        failed.insert((placed, value.clone()));
        false
    }
    search(&ops, required, &end, 0, &None, &mut HashSet::new())
}

#[test]
fn agrees_with_a_plain_reference_on_medium_histories() {
    let mut outcomes = [0usize; 2];
    for seed in 0..3_000u64 {
        let shape = Shape {
            clients: 2 + seed % 3,
            ops: 8 + (seed % 9) as usize,
            duration_max: 12,
            pause_max: 1 + seed % 4,
            write_probability: 0.5,
            delete_probability: 0.15,
            reuse_probability: 0.6,
            unknown_probability: 0.15,
        };
        let mut history = linearizable_history(seed, &shape);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfeed);
        if rng.random_bool(0.7) {
            let written: Vec<Value> = history
                .ops
                .iter()
                .filter_map(|op| op.written().cloned())
                .collect();
            let reads: Vec<usize> = (0..history.ops.len())
                .filter(|&i| history.ops[i].returned().is_some())
                .collect();
            if !reads.is_empty() && !written.is_empty() {
                let target = reads[rng.random_range(0..reads.len())];
                let value = written[rng.random_range(0..written.len())].clone();
                history.ops[target].outcome = Outcome::Read(value);
            }
        }
        let expected = linearizable_by_reference(&history.ops);
        let report = check(&history);
        assert_eq!(
            report.ok, expected,
            "seed {seed}: {history:#?}\n{report:#?}"
        );
        outcomes[usize::from(expected)] += 1;
    }
    // Both verdicts must be well represented for the comparison to mean anything.
    assert!(outcomes.iter().all(|&count| count > 600), "{outcomes:?}");
}

// ---------------------------------------------------------------------------------------------
// Performance-shaped: long single-key histories must finish quickly; elapsed time is printed,
// not asserted.

fn timed(name: &str, history: &History) -> Report {
    let started = std::time::Instant::now();
    let report = check(history);
    let key = report.keys.first();
    eprintln!(
        "{name}: {} ops in {} segments, {} steps, {:?}",
        report.ops_checked,
        key.map_or(0, |k| k.segments),
        key.map_or(0, |k| k.steps),
        started.elapsed()
    );
    report
}

#[test]
fn two_thousand_operations_on_one_key() {
    let shape = Shape {
        ops: 2_000,
        unknown_probability: 0.0,
        reuse_probability: 0.02,
        ..Shape::typical()
    };
    let history = linearizable_history(7, &shape);
    let report = timed("2000 ops, 4 clients", &history);
    assert!(report.ok, "{:#?}", report.violations);
    assert_eq!(report.ops_checked, 2_000);
}

#[test]
fn two_thousand_operations_without_quiescence_or_with_unknown_writes() {
    // Clients never pause, so the history has almost no cuts.
    let busy = Shape {
        ops: 2_000,
        pause_max: 1,
        unknown_probability: 0.0,
        ..Shape::typical()
    };
    let report = timed("2000 ops, never quiet", &linearizable_history(11, &busy));
    assert!(report.ok, "{:#?}", report.violations);

    // Unanswered writes that never complete stay concurrent with everything after them.
    let crashing = Shape {
        ops: 2_000,
        unknown_probability: 0.02,
        ..Shape::typical()
    };
    let mut history = linearizable_history(13, &crashing);
    let report = timed("2000 ops, 2% unanswered", &history);
    assert!(report.ok, "{:#?}", report.violations);

    let mut rng = ChaCha8Rng::seed_from_u64(13);
    assert!(corrupt(&mut history, &mut rng));
    let report = timed("2000 ops, 2% unanswered, one read corrupted", &history);
    assert!(!report.ok);
    assert_eq!(report.violations.len(), 1);
}
