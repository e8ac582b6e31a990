//! What every protocol's client machines share: operation ids, the step a machine reports after
//! each input, counting one reply per node per round, and the rule that `f+1` refusals end an
//! operation (fewer could all come from faulty nodes).

use bulwark_core::Slot;
use serde::{Deserialize, Serialize};

pub use bulwark_core::evidence::EvidenceKind;

/// Misbehaviour a client machine observed, with the node to blame by its slot (the driver names
/// the node through the group's view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The node.
    pub node: Slot,
    /// What it did.
    pub kind: EvidenceKind,
}

/// How a reader, writer or new member judges what a server offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// What a correct party could have made: it counts.
    Valid,
    /// Not even well-formed: the reply is ignored, as if it never came.
    Ignored,
    /// Well-formed but provably not what any writer made: the reply counts as "nothing", and the
    /// server that sent it is named.
    Forged,
}

/// Matches replies to the operation that asked. Chosen by the client, unique per client session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId(pub u64);

/// What a machine says after an input; each protocol names it with its own request and error.
#[derive(Debug)]
pub enum Step<T, Req, E> {
    /// Send these (possibly none) and keep feeding replies.
    Continue(Vec<(Slot, Req)>),
    /// The operation is over.
    Done(Result<T, E>),
}

/// The first reply of each node in one round. A node's later replies are ignored, so a faulty
/// node can neither vote twice nor change its vote.
#[derive(Clone, Debug)]
pub(crate) struct Replies<T>(Vec<Option<T>>);

impl<T> Replies<T> {
    pub(crate) fn new(n: usize) -> Self {
        Replies((0..n).map(|_| None).collect())
    }

    /// Records `value` unless `node` already answered or is out of range. Returns whether it counted.
    pub(crate) fn record(&mut self, node: Slot, value: T) -> bool {
        match self.0.get_mut(node.index()) {
            Some(slot @ None) => {
                *slot = Some(value);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.0.iter().filter(|s| s.is_some()).count()
    }

    /// The nodes that answered, in node order.
    pub(crate) fn nodes(&self) -> Vec<Slot> {
        self.present().map(|(n, _)| n).collect()
    }

    pub(crate) fn missing(&self) -> impl Iterator<Item = Slot> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| Slot(i as u32))
    }

    pub(crate) fn present(&self) -> impl Iterator<Item = (Slot, &T)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (Slot(i as u32), v)))
    }
}

/// Refusals over a whole operation: `f+1` of them mean at least one correct node refused.
#[derive(Clone, Debug)]
pub(crate) struct Refusals<R>(Replies<R>);

impl<R: Clone> Refusals<R> {
    pub(crate) fn new(n: usize) -> Self {
        Refusals(Replies::new(n))
    }

    /// Records one refusal; once `f+1` nodes refused, the first refusal and who refused.
    pub(crate) fn record(&mut self, node: Slot, refusal: R, f: usize) -> Option<(R, Vec<Slot>)> {
        self.0.record(node, refusal);
        if self.0.count() <= f {
            return None;
        }
        let first = self.0.present().map(|(_, r)| r.clone()).next()?;
        Some((first, self.0.nodes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_counts_once_and_out_of_range_nodes_not_at_all() {
        let mut replies = Replies::new(3);
        assert!(replies.record(Slot(1), "a"));
        assert!(!replies.record(Slot(1), "b"), "a second reply is ignored");
        assert!(!replies.record(Slot(7), "c"));
        assert_eq!(replies.count(), 1);
        assert_eq!(replies.present().collect::<Vec<_>>(), vec![(Slot(1), &"a")]);
        assert_eq!(
            replies.missing().collect::<Vec<_>>(),
            vec![Slot(0), Slot(2)]
        );
    }

    #[test]
    fn f_plus_one_refusals_end_an_operation() {
        let mut refusals = Refusals::new(4);
        assert_eq!(refusals.record(Slot(2), "no", 1), None);
        assert_eq!(
            refusals.record(Slot(2), "again", 1),
            None,
            "one node, one vote"
        );
        assert_eq!(
            refusals.record(Slot(0), "nope", 1),
            Some(("nope", vec![Slot(0), Slot(2)]))
        );
    }
}

/// Deliberate breakage of the two register baselines (ABD, Phalanx), for the simulator's negative
/// controls: each flag removes one thing the protocol's correctness argument needs. All off in
/// every real client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterMutations {
    /// Quorums one server smaller than `n - f`, so two of them need not share a correct server.
    pub quorum_minus_one: bool,
    /// A read returns the highest version it saw without writing it back first, so a later read
    /// may miss a version an earlier read returned.
    pub no_write_back: bool,
    /// Phalanx only: readers take versions whose writer signature does not verify.
    pub unverified: bool,
}

impl RegisterMutations {
    /// The quorum a client waits for in every round, given the protocol's `n - f`.
    pub fn quorum(&self, n_minus_f: usize) -> usize {
        if self.quorum_minus_one {
            n_minus_f.saturating_sub(1).max(1)
        } else {
            n_minus_f
        }
    }
}
