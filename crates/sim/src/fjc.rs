//! Fork-join-causal consistency judged on a history, as Depot's Appendix A defines it (notes in
//! `../shared/specs/depot.md` §6.1): an execution is FJC iff some edge assignment over its
//! operations gives an observer graph in which (1) each correct node's operations are a path in
//! their order, and (2) a correct node's read of a key returns exactly the writes to the key that
//! precede it with no other write to the key between.
//!
//! The edge assignment checked is the one Depot's own data flow gives: each update's named
//! dependencies (its previous update and the updates it depends on, as signed), each correct
//! node's program order, and an edge from every write a read returns to that read. Writes by
//! faulty nodes are vertices with their signed dependencies only: FJC puts no order on a faulty
//! node's operations, so a fork, or a write that omits what its writer read, is no violation.
//! Only authorised updates count as writes to their key (an unauthorised one is kept and passed
//! on, but reads ignore it); their dependencies still carry order.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

/// One update anyone signed: a write vertex.
#[derive(Clone, Debug)]
pub struct Update<Id> {
    /// Its writer.
    pub node: u32,
    /// The key it writes.
    pub key: Vec<u8>,
    /// What it names: its writer's previous update and its dependencies.
    pub deps: Vec<Id>,
    /// Whether its writer may write its key, so that reads return it.
    pub authorised: bool,
}

/// A completed operation of a correct node, in the node's order.
#[derive(Clone, Debug)]
pub enum Op<Id> {
    /// A write that made update `Id`.
    Write(Id),
    /// A read of a key that returned these updates.
    Read {
        /// The key.
        key: Vec<u8>,
        /// What it returned (`wl`).
        returned: BTreeSet<Id>,
    },
}

/// An execution: every update signed, and the operations of each correct node in order.
#[derive(Clone, Debug)]
pub struct Execution<Id> {
    /// Every update, by id.
    pub updates: BTreeMap<Id, Update<Id>>,
    /// Each correct node's operations, oldest first.
    pub correct: BTreeMap<u32, Vec<Op<Id>>>,
}

impl<Id> Default for Execution<Id> {
    fn default() -> Self {
        Execution {
            updates: BTreeMap::new(),
            correct: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Vertex<Id> {
    Write(Id),
    /// A read: its node and its place in the node's operations.
    Read(u32, usize),
}

/// Every way `execution` breaks FJC under Depot's edge assignment, in words; empty when none.
pub fn check<Id: Copy + Ord + Debug>(execution: &Execution<Id>) -> Vec<String> {
    let mut violations = Vec::new();
    let mut preds: BTreeMap<Vertex<Id>, Vec<Vertex<Id>>> = BTreeMap::new();
    for (id, update) in &execution.updates {
        let named = update
            .deps
            .iter()
            .filter(|dep| execution.updates.contains_key(dep))
            .map(|dep| Vertex::Write(*dep));
        preds.entry(Vertex::Write(*id)).or_default().extend(named);
    }
    for (node, ops) in &execution.correct {
        let mut previous: Option<Vertex<Id>> = None;
        for (at, op) in ops.iter().enumerate() {
            let vertex = match op {
                Op::Write(id) => {
                    if !execution.updates.contains_key(id) {
                        violations.push(format!(
                            "node {node}: operation {at} wrote {id:?}, which nobody signed"
                        ));
                        continue;
                    }
                    Vertex::Write(*id)
                }
                Op::Read { key, returned } => {
                    let vertex = Vertex::Read(*node, at);
                    let entry = preds.entry(vertex).or_default();
                    for id in returned {
                        match execution.updates.get(id) {
                            Some(u) if u.authorised && &u.key == key => {
                                entry.push(Vertex::Write(*id))
                            }
                            _ => violations.push(format!(
                                "node {node}: read {at} returned {id:?}, not a write to its key"
                            )),
                        }
                    }
                    vertex
                }
            };
            if let Some(previous) = previous {
                preds.entry(vertex).or_default().push(previous);
            }
            previous = Some(vertex);
        }
    }
    if let Some(cycle) = cycle(&preds) {
        // Condition 1: a correct node's later operation would precede an earlier one.
        violations.push(format!(
            "the operations cannot be ordered (condition 1): a cycle through {cycle:?}"
        ));
        return violations;
    }
    for (node, ops) in &execution.correct {
        for (at, op) in ops.iter().enumerate() {
            let Op::Read { key, returned } = op else {
                continue;
            };
            let before = ancestors(&preds, Vertex::Read(*node, at));
            let writes: BTreeSet<Id> = before
                .iter()
                .filter_map(|v| match v {
                    Vertex::Write(id) => Some(*id),
                    Vertex::Read(..) => None,
                })
                .filter(|id| execution.updates[id].authorised && &execution.updates[id].key == key)
                .collect();
            // What precedes any of them, found in one walk from all of them at once.
            let mut superseded = BTreeSet::new();
            let mut seen = BTreeSet::new();
            let mut stack: Vec<Vertex<Id>> = writes
                .iter()
                .flat_map(|id| preds.get(&Vertex::Write(*id)).into_iter().flatten())
                .copied()
                .collect();
            while let Some(next) = stack.pop() {
                if !seen.insert(next) {
                    continue;
                }
                if let Vertex::Write(id) = next
                    && writes.contains(&id)
                {
                    superseded.insert(id);
                }
                stack.extend(preds.get(&next).into_iter().flatten().copied());
            }
            let latest: BTreeSet<Id> = writes.difference(&superseded).copied().collect();
            if &latest != returned {
                // Condition 2.
                violations.push(format!(
                    "node {node}: read {at} of {} returned {returned:?}, but the latest writes \
                     before it are {latest:?} (condition 2)",
                    String::from_utf8_lossy(key)
                ));
            }
        }
    }
    violations
}

/// Every vertex with a path to `from`, `from` excluded.
fn ancestors<Id: Copy + Ord>(
    preds: &BTreeMap<Vertex<Id>, Vec<Vertex<Id>>>,
    from: Vertex<Id>,
) -> BTreeSet<Vertex<Id>> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<Vertex<Id>> = preds.get(&from).cloned().unwrap_or_default();
    while let Some(next) = stack.pop() {
        if seen.insert(next)
            && let Some(more) = preds.get(&next)
        {
            stack.extend(more.iter().copied());
        }
    }
    seen
}

/// Some vertex on a cycle, if the graph has one (Kahn's algorithm: what never frees is cyclic).
fn cycle<Id: Copy + Ord>(preds: &BTreeMap<Vertex<Id>, Vec<Vertex<Id>>>) -> Option<Vertex<Id>> {
    let mut waiting: BTreeMap<Vertex<Id>, usize> = BTreeMap::new();
    let mut succs: BTreeMap<Vertex<Id>, Vec<Vertex<Id>>> = BTreeMap::new();
    for (vertex, before) in preds {
        waiting.entry(*vertex).or_insert(0);
        for pred in before {
            *waiting.entry(*vertex).or_insert(0) += 1;
            waiting.entry(*pred).or_insert(0);
            succs.entry(*pred).or_default().push(*vertex);
        }
    }
    let mut free: Vec<Vertex<Id>> = waiting
        .iter()
        .filter(|(_, count)| **count == 0)
        .map(|(v, _)| *v)
        .collect();
    while let Some(vertex) = free.pop() {
        waiting.remove(&vertex);
        for next in succs.get(&vertex).into_iter().flatten() {
            if let Some(count) = waiting.get_mut(next) {
                *count -= 1;
                if *count == 0 {
                    free.push(*next);
                }
            }
        }
    }
    waiting.keys().next().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(node: u32, key: &str, deps: &[u32]) -> Update<u32> {
        Update {
            node,
            key: key.as_bytes().to_vec(),
            deps: deps.to_vec(),
            authorised: true,
        }
    }

    fn read(key: &str, returned: &[u32]) -> Op<u32> {
        Op::Read {
            key: key.as_bytes().to_vec(),
            returned: returned.iter().copied().collect(),
        }
    }

    fn execution(
        updates: &[(u32, Update<u32>)],
        correct: &[(u32, Vec<Op<u32>>)],
    ) -> Execution<u32> {
        Execution {
            updates: updates.iter().cloned().collect(),
            correct: correct.iter().cloned().collect(),
        }
    }

    #[test]
    fn a_causal_chain_across_nodes_is_fjc() {
        // p writes 1; q reads it and writes 2 over it; p then reads 2 alone.
        let e = execution(
            &[(1, update(0, "x", &[])), (2, update(1, "x", &[1]))],
            &[
                (0, vec![Op::Write(1), read("x", &[2])]),
                (1, vec![read("x", &[1]), Op::Write(2)]),
            ],
        );
        assert_eq!(check(&e), Vec::<String>::new());
    }

    #[test]
    fn concurrent_writes_are_both_returned_or_not_yet_seen() {
        let updates = [(1, update(0, "x", &[])), (2, update(1, "x", &[]))];
        let both = execution(
            &updates,
            &[
                (0, vec![Op::Write(1)]),
                (1, vec![Op::Write(2)]),
                (2, vec![read("x", &[1]), read("x", &[1, 2])]),
            ],
        );
        assert_eq!(check(&both), Vec::<String>::new());
        // Having seen both, a correct reader cannot go back to one.
        let back = execution(
            &updates,
            &[
                (0, vec![Op::Write(1)]),
                (1, vec![Op::Write(2)]),
                (2, vec![read("x", &[1, 2]), read("x", &[1])]),
            ],
        );
        assert!(
            check(&back)[0].contains("condition 2"),
            "{:?}",
            check(&back)
        );
    }

    #[test]
    fn a_stale_or_forgetful_read_by_a_correct_node_is_caught() {
        // Its own write superseded by its next one, then a read of the first.
        let stale = execution(
            &[(1, update(0, "x", &[])), (2, update(0, "x", &[1]))],
            &[(0, vec![Op::Write(1), Op::Write(2), read("x", &[1])])],
        );
        assert!(check(&stale)[0].contains("condition 2"));
        // Its own write, then a read that misses it.
        let forgot = execution(
            &[(1, update(0, "x", &[]))],
            &[(0, vec![Op::Write(1), read("x", &[])])],
        );
        assert!(check(&forgot)[0].contains("condition 2"));
        // A dependency of what it read, on another key, then missed.
        let gap = execution(
            &[(1, update(0, "y", &[])), (2, update(0, "x", &[1]))],
            &[
                (0, vec![Op::Write(1), Op::Write(2)]),
                (1, vec![read("x", &[2]), read("y", &[])]),
            ],
        );
        assert!(check(&gap)[0].contains("condition 2"));
    }

    #[test]
    fn a_faulty_writer_may_fork_and_omit_what_it_read() {
        // Figure 19: faulty node 9's two writes, neither naming the other, are concurrent to
        // correct readers; had node 9 been correct, its order would make the second supersede.
        let updates = [(1, update(9, "x", &[])), (2, update(9, "x", &[]))];
        let faulty = execution(&updates, &[(0, vec![read("x", &[1, 2])])]);
        assert_eq!(check(&faulty), Vec::<String>::new());
        let correct = execution(
            &updates,
            &[
                (0, vec![read("x", &[1, 2])]),
                (9, vec![Op::Write(1), Op::Write(2)]),
            ],
        );
        assert!(check(&correct)[0].contains("condition 2"));
        // T17: a faulty node reads 1 and writes 3 without it: a reader of 3 need not see 1.
        let omits = execution(
            &[(1, update(0, "y", &[])), (3, update(9, "x", &[]))],
            &[
                (0, vec![Op::Write(1)]),
                (5, vec![read("x", &[3]), read("y", &[])]),
            ],
        );
        assert_eq!(check(&omits), Vec::<String>::new());
    }

    #[test]
    fn what_nobody_wrote_and_impossible_orders_are_caught() {
        let invented = execution(&[], &[(0, vec![read("x", &[7])])]);
        assert!(check(&invented)[0].contains("not a write to its key"));
        let unauthorised = Update {
            authorised: false,
            ..update(9, "x", &[])
        };
        let ignored = execution(&[(1, unauthorised)], &[(0, vec![read("x", &[1])])]);
        assert!(check(&ignored)[0].contains("not a write to its key"));
        // Node 0 reads what depends on its own later write.
        let cycle = execution(
            &[(1, update(0, "y", &[])), (2, update(1, "x", &[1]))],
            &[(0, vec![read("x", &[2]), Op::Write(1)])],
        );
        assert!(check(&cycle)[0].contains("condition 1"));
    }
}
