//! A linearizability checker for per-key read/write/delete registers.
//!
//! Every key is an independent register whose initial value is absent. A history is linearizable
//! when each operation can be given a point between its invocation and its completion such that
//! every read returns the value of the latest write before it (Herlihy and Wing). Keys are checked
//! separately because a register's linearizability does not depend on other registers.
//!
//! The search is Wing and Gong's: repeatedly pick an operation that no pending operation must
//! precede, apply it to the register, backtrack when a read cannot be explained. Lowe's
//! memoisation keeps it tractable: a search state (the set of placed operations, the register's
//! value, the unknown writes spent) is explored once. On top of that:
//!
//! - A key's history is cut into segments wherever every earlier operation completed before every
//!   later one was invoked; only the register's state crosses a cut. Segments are searched depth
//!   first and lazily: the first way through a segment starts the next one, and a segment is
//!   asked for another way out only when a later one is stuck, so a linearizable history costs
//!   about one pass.
//! - Moves that can never hurt are made without branching: a read that matches the register, and
//!   a write when neither the value it replaces nor the one it writes is read again. Of several
//!   writes of equal value that may go next, only the one completing first is tried.
//! - An unknown write is only tried right before a read of its value (anywhere earlier it could
//!   be moved up to that read), and is dropped when no read could ever return its value.
//! - Values that no remaining read returns are indistinguishable and share one stand-in, and a
//!   state that overwrote a value some remaining read needs, with no write of it left, is dropped.
//! - A read whose every possible source is certainly overwritten before it (or that returns a
//!   value nobody wrote) is refuted without search.
//! - Every search is bounded ([`STEPS_PER_KEY_MAX`]); a key that exhausts it is reported as
//!   inconclusive rather than holding up the caller.
//!
//! An operation's outcome decides what it may do: an acknowledged write must take effect inside its
//! interval; a write with an unknown outcome (or no completion, or a read's outcome) may take
//! effect at any point after its invocation, including after the end of the history, or never; a
//! read without a returned value constrains nothing and is dropped. A completion recorded before
//! its invocation is taken to be the invocation.
//!
//! When a key is not linearizable, the explanation names the first response that no order can
//! explain (found by bisecting over completion times, which is sound because linearizability is
//! closed under taking prefixes) together with the writes and reads that conflict with it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};

/// A value as the checker sees it: `None` is absent (never written, or deleted).
pub type Value = Option<Vec<u8>>;

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A put (`Some`) or a delete (`None`).
    Write(Value),
    /// A get.
    Read,
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A write was acknowledged.
    Ok,
    /// A read returned this.
    Read(Value),
    /// No answer (a crashed client, a timeout): the operation may or may not have taken effect.
    Unknown,
}

/// One client operation on one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// Who invoked it; only used in explanations.
    pub client: u64,
    /// The register.
    pub key: Vec<u8>,
    /// What it did.
    pub kind: OpKind,
    /// When it was invoked.
    pub invoke: u64,
    /// When it completed; `None` if it never did.
    pub complete: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
}

impl Op {
    /// An acknowledged write (`Some`) or delete (`None`) that ran from `invoke` to `complete`.
    pub fn write(
        client: u64,
        key: impl Into<Vec<u8>>,
        value: Value,
        invoke: u64,
        complete: u64,
    ) -> Op {
        Op {
            client,
            key: key.into(),
            kind: OpKind::Write(value),
            invoke,
            complete: Some(complete),
            outcome: Outcome::Ok,
        }
    }

    /// A write or delete invoked at `invoke` whose outcome never became known.
    pub fn unknown_write(client: u64, key: impl Into<Vec<u8>>, value: Value, invoke: u64) -> Op {
        Op {
            client,
            key: key.into(),
            kind: OpKind::Write(value),
            invoke,
            complete: None,
            outcome: Outcome::Unknown,
        }
    }

    /// A read that ran from `invoke` to `complete` and returned `returned`.
    pub fn read(
        client: u64,
        key: impl Into<Vec<u8>>,
        returned: Value,
        invoke: u64,
        complete: u64,
    ) -> Op {
        Op {
            client,
            key: key.into(),
            kind: OpKind::Read,
            invoke,
            complete: Some(complete),
            outcome: Outcome::Read(returned),
        }
    }

    fn written(&self) -> Option<&Value> {
        match &self.kind {
            OpKind::Write(value) => Some(value),
            OpKind::Read => None,
        }
    }

    /// What a read returned, for a read that returned.
    pub fn returned(&self) -> Option<&Value> {
        match (&self.kind, &self.outcome) {
            (OpKind::Read, Outcome::Read(value)) => Some(value),
            _ => None,
        }
    }

    fn is_acknowledged_write(&self) -> bool {
        matches!(self.kind, OpKind::Write(_))
            && self.outcome == Outcome::Ok
            && self.complete.is_some()
    }
}

/// Why [`History::complete`] refused to record a completion.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// No operation was recorded at this index.
    #[error("no operation {index} in the history")]
    NoSuchOp {
        /// The index passed in.
        index: usize,
    },
    /// The operation already has a completion.
    #[error("operation {index} already completed")]
    AlreadyComplete {
        /// The index passed in.
        index: usize,
    },
    /// A read given a write's outcome or the other way round.
    #[error("operation {index} cannot end with {outcome:?}")]
    MismatchedOutcome {
        /// The index passed in.
        index: usize,
        /// The outcome refused.
        outcome: Outcome,
    },
}

/// A recorded history: operations on any number of keys, in any order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The operations, in any order.
    pub ops: Vec<Op>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records a finished (or abandoned) operation and returns its index.
    pub fn push(&mut self, op: Op) -> usize {
        self.ops.push(op);
        self.ops.len() - 1
    }

    /// Records the invocation of an operation that has not answered yet and returns its index
    /// for [`History::complete`]. Until completed it counts as [`Outcome::Unknown`], which is
    /// exactly right if the client never hears back.
    pub fn invoke(&mut self, client: u64, key: impl Into<Vec<u8>>, kind: OpKind, at: u64) -> usize {
        self.push(Op {
            client,
            key: key.into(),
            kind,
            invoke: at,
            complete: None,
            outcome: Outcome::Unknown,
        })
    }

    /// Records the answer to the operation `index` returned by [`History::invoke`]: `Ok` for a
    /// write, `Read(value)` for a read. `Unknown` records a give-up time (a timeout), which the
    /// checker treats like no answer.
    pub fn complete(&mut self, index: usize, at: u64, outcome: Outcome) -> Result<(), RecordError> {
        let op = self
            .ops
            .get_mut(index)
            .ok_or(RecordError::NoSuchOp { index })?;
        if op.complete.is_some() {
            return Err(RecordError::AlreadyComplete { index });
        }
        let fits = matches!(
            (&op.kind, &outcome),
            (OpKind::Write(_), Outcome::Ok)
                | (OpKind::Read, Outcome::Read(_))
                | (_, Outcome::Unknown)
        );
        if !fits {
            return Err(RecordError::MismatchedOutcome { index, outcome });
        }
        op.complete = Some(at);
        op.outcome = outcome;
        Ok(())
    }

    /// The operations.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Number of operations recorded.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Why a key's history is not linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The register.
    pub key: Vec<u8>,
    /// For humans: the first response no order explains, and what conflicts with it.
    pub explanation: String,
    /// The operations the explanation names, the unexplainable one first.
    pub conflicting: Vec<Op>,
}

/// The verdict on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyVerdict {
    /// Some order explains every response.
    Linearizable,
    /// No order does; see the matching [`Violation`].
    Violation,
    /// The search ran out of steps before deciding.
    Inconclusive,
}

/// What the checker found for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyReport {
    /// The register.
    pub key: Vec<u8>,
    /// The verdict.
    pub verdict: KeyVerdict,
    /// Operations examined (reads without a returned value excluded).
    pub ops: usize,
    /// Independent segments the key's history was cut into.
    pub segments: usize,
    /// Search steps spent, explanation included.
    pub steps: u64,
}

/// The verdict on a history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// No violation and nothing inconclusive.
    pub ok: bool,
    /// Keys examined.
    pub keys_checked: usize,
    /// Operations examined (reads without a returned value excluded).
    pub ops_checked: usize,
    /// Keys proven not linearizable.
    pub violations: Vec<Violation>,
    /// Keys whose search exceeded the step budget: neither proven nor refuted.
    pub inconclusive: Vec<Vec<u8>>,
    /// Every key's verdict, in key order.
    pub keys: Vec<KeyReport>,
}

impl Report {
    /// The verdict on `key`, if the history touched it.
    pub fn verdict(&self, key: &[u8]) -> Option<KeyVerdict> {
        self.keys
            .iter()
            .find(|report| report.key == key)
            .map(|report| report.verdict)
    }
}

/// Search steps allowed per key before it is reported as inconclusive.
pub const STEPS_PER_KEY_MAX: u64 = 5_000_000;

/// Checks every key of `history` with the default budget.
pub fn check(history: &History) -> Report {
    check_with_budget(history, STEPS_PER_KEY_MAX)
}

/// Checks every key of `history`, giving up on a key after `steps_per_key` search steps.
pub fn check_with_budget(history: &History, steps_per_key: u64) -> Report {
    let mut by_key: BTreeMap<&[u8], Vec<&Op>> = BTreeMap::new();
    for op in &history.ops {
        if op.kind == OpKind::Read && op.returned().is_none() {
            continue;
        }
        by_key.entry(op.key.as_slice()).or_default().push(op);
    }
    let mut report = Report {
        keys_checked: by_key.len(),
        ..Report::default()
    };
    for (key, ops) in by_key {
        report.ops_checked += ops.len();
        let mut budget = Budget::new(steps_per_key);
        let (result, segments) = check_key(key, &ops, &mut budget);
        let verdict = match result {
            KeyResult::Linearizable => KeyVerdict::Linearizable,
            KeyResult::Violation { violation, .. } => {
                report.violations.push(violation);
                KeyVerdict::Violation
            }
            KeyResult::Inconclusive => {
                report.inconclusive.push(key.to_vec());
                KeyVerdict::Inconclusive
            }
        };
        report.keys.push(KeyReport {
            key: key.to_vec(),
            verdict,
            ops: ops.len(),
            segments,
            steps: budget.spent,
        });
    }
    report.ok = report.violations.is_empty() && report.inconclusive.is_empty();
    report
}

// ---------------------------------------------------------------------------------------------
// Preparation: values interned, operations split into those that must take effect and those
// that may.

/// Completion time of operations that never complete.
const NEVER: u64 = u64::MAX;

/// The stand-in for every value no remaining read returns; no read ever matches it.
const UNREAD: u32 = u32::MAX;

/// The interned absent value, which is also the register's initial value.
const ABSENT: u32 = 0;

/// The slot of a value no read of a problem returns.
const NO_SLOT: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
enum Action {
    Write(u32),
    Read(u32),
}

/// An operation that must take effect inside its interval.
#[derive(Clone, Copy, Debug)]
struct Event {
    invoke: u64,
    complete: u64,
    action: Action,
    /// Index into the key's operations.
    source: usize,
    /// Inside a [`Problem`]: the slot of the value's counters, or [`NO_SLOT`] for a write of a
    /// value no read of the problem returns.
    slot: u32,
}

/// A write that may take effect at any point after `invoke`, or never.
#[derive(Clone, Copy, Debug)]
struct Floating {
    invoke: u64,
    value: u32,
    source: usize,
}

enum KeyResult {
    Linearizable,
    /// `isolated` tells whether the explanation names the first unexplainable response.
    Violation {
        violation: Violation,
        isolated: bool,
    },
    Inconclusive,
}

/// A run of a key's required operations with no operation concurrent across its ends.
struct Segment {
    range: std::ops::Range<usize>,
    end: u64,
}

/// What explanations need to know about a key.
struct KeyContext<'a> {
    key: &'a [u8],
    ops: &'a [&'a Op],
    /// Value bytes by interned id.
    values: Vec<Option<&'a [u8]>>,
}

fn check_key(key: &[u8], ops: &[&Op], budget: &mut Budget) -> (KeyResult, usize) {
    // Equal bytes get equal ids: readers cannot tell two writes of the same bytes apart.
    let mut ids: HashMap<Option<&[u8]>, u32> = HashMap::new();
    let mut values: Vec<Option<&[u8]>> = vec![None];
    ids.insert(None, ABSENT);
    let mut required = Vec::new();
    let mut floating = Vec::new();
    for (source, op) in ops.iter().enumerate() {
        let (is_read, value) = match (op.returned(), op.written()) {
            (Some(value), _) => (true, value),
            (None, Some(value)) => (false, value),
            (None, None) => continue,
        };
        let id = *ids.entry(value.as_deref()).or_insert_with(|| {
            values.push(value.as_deref());
            (values.len() - 1) as u32
        });
        // A completion before the invocation is a recording slip; the invocation is trusted.
        let complete = op.complete.map_or(NEVER, |c| c.max(op.invoke));
        if is_read || op.is_acknowledged_write() {
            required.push(Event {
                invoke: op.invoke,
                complete,
                action: if is_read {
                    Action::Read(id)
                } else {
                    Action::Write(id)
                },
                source,
                slot: NO_SLOT,
            });
        } else {
            // Unknown, never completed, or a malformed outcome: assume the least.
            floating.push(Floating {
                invoke: op.invoke,
                value: id,
                source,
            });
        }
    }
    let context = KeyContext { key, ops, values };
    required.sort_by_key(|e| (e.invoke, e.complete, e.source));
    floating.sort_by_key(|f| (f.invoke, f.source));

    // A read refuted without search proves a violation, but possibly not the first one: the
    // search still runs on the history up to that read, and the quick refutation is the answer
    // only if the search gives up.
    let Some(refuted) = precheck(&context, &required, &floating) else {
        return analyze(&context, required, floating, budget);
    };
    let (required, floating) = truncate(&required, &floating, refuted.complete);
    // The key is decided already; finding an earlier failure only refines the explanation, so
    // it gets a fraction of the budget.
    let mut refinement = Budget::new(budget.left / REFINEMENT_SHARE);
    let (result, segments) = analyze(&context, required, floating, &mut refinement);
    budget.spent = budget.spent.saturating_add(refinement.spent);
    match result {
        KeyResult::Violation {
            violation,
            isolated: true,
        } => (
            KeyResult::Violation {
                violation,
                isolated: true,
            },
            segments,
        ),
        _ => {
            let mut text = format!("key {}: ", show_value(&Some(key.to_vec())));
            let mut conflicting = Vec::new();
            explain_read(
                &context,
                ops[refuted.source],
                refuted.complete,
                &mut text,
                &mut conflicting,
            );
            let violation = Violation {
                key: key.to_vec(),
                explanation: text,
                conflicting,
            };
            (
                KeyResult::Violation {
                    violation,
                    isolated: false,
                },
                segments,
            )
        }
    }
}

/// The share of the remaining budget spent looking for an earlier failure once a read has been
/// refuted without search.
const REFINEMENT_SHARE: u64 = 5;

/// The history as it stood at `time`: operations invoked by then, with those that had not
/// answered yet treated as unanswered (reads dropped, writes optional).
fn truncate(required: &[Event], floating: &[Floating], time: u64) -> (Vec<Event>, Vec<Floating>) {
    let mut kept = Vec::new();
    let mut optional: Vec<Floating> = floating
        .iter()
        .filter(|f| f.invoke <= time)
        .copied()
        .collect();
    for event in required.iter().filter(|e| e.invoke <= time) {
        match event.action {
            _ if event.complete <= time => kept.push(*event),
            Action::Read(_) => {}
            Action::Write(value) => optional.push(Floating {
                invoke: event.invoke,
                value,
                source: event.source,
            }),
        }
    }
    optional.sort_by_key(|f| (f.invoke, f.source));
    (kept, optional)
}

/// Cuts a prepared key history into segments and searches it.
fn analyze(
    context: &KeyContext<'_>,
    required: Vec<Event>,
    mut floating: Vec<Floating>,
    budget: &mut Budget,
) -> (KeyResult, usize) {
    let mut last_read_complete = vec![None::<u64>; context.values.len()];
    for event in &required {
        if let Action::Read(value) = event.action {
            let last = &mut last_read_complete[value as usize];
            *last = Some(last.map_or(event.complete, |l| l.max(event.complete)));
        }
    }
    // An unknown write nobody could have read is never needed: placing a value no read returns
    // only matters until the next write, and no read lies in between.
    floating.retain(|f| last_read_complete[f.value as usize].is_some_and(|last| f.invoke <= last));

    let mut segments: Vec<Segment> = Vec::new();
    let mut start = 0;
    let mut end = 0;
    for (index, event) in required.iter().enumerate() {
        if index > start && end < event.invoke {
            segments.push(Segment {
                range: start..index,
                end,
            });
            start = index;
        }
        end = if index == start {
            event.complete
        } else {
            end.max(event.complete)
        };
    }
    if start < required.len() {
        segments.push(Segment {
            range: start..required.len(),
            end,
        });
    }

    let mut last_read_segment = vec![None::<usize>; context.values.len()];
    for (k, segment) in segments.iter().enumerate() {
        for event in &required[segment.range.clone()] {
            if let Action::Read(value) = event.action {
                last_read_segment[value as usize] = Some(k);
            }
        }
    }
    // A floating write joins the first segment that has not ended when it is invoked; one
    // invoked after the last segment can no longer be read (and was pruned above).
    let mut introduced_in = vec![usize::MAX; floating.len()];
    let mut segment_index = 0;
    for (index, f) in floating.iter().enumerate() {
        while segment_index < segments.len() && segments[segment_index].end < f.invoke {
            segment_index += 1;
        }
        introduced_in[index] = segment_index;
    }

    let key_shape = KeyShape {
        required: &required,
        floating: &floating,
        segments: &segments,
        introduced_in: &introduced_in,
        last_read_segment: &last_read_segment,
    };
    let result = search_segments(context, &key_shape, budget);
    (result, segments.len())
}

/// A key's history, prepared and cut.
struct KeyShape<'a> {
    /// Sorted by invocation.
    required: &'a [Event],
    /// Sorted by invocation; only those some read may observe.
    floating: &'a [Floating],
    segments: &'a [Segment],
    /// Per floating write: the segment from which it may take effect.
    introduced_in: &'a [usize],
    /// Per value: the last segment with a read returning it.
    last_read_segment: &'a [Option<usize>],
}

impl KeyShape<'_> {
    /// Whether a read in a segment after `k` returns `value`.
    fn read_after(&self, value: u32, k: usize) -> bool {
        value != UNREAD
            && self
                .last_read_segment
                .get(value as usize)
                .copied()
                .flatten()
                .is_some_and(|last| last > k)
    }
}

/// The search over one segment, resumable so that the next segment can be tried as soon as one
/// way through this one is found.
struct SegmentRun<'a> {
    exploration: Exploration<'a>,
    /// Which floating writes (indices into [`KeyShape::floating`]) the segment's problem offers.
    local: Vec<usize>,
    /// The start states fed so far, canonical, with a witness value each.
    fed: Vec<Carried>,
    tried: HashSet<(u32, BitSet)>,
}

/// Walks the segments depth first: the first end state of a segment starts the next segment,
/// and a segment is asked for another end state only when every later one is stuck. The key is
/// not linearizable exactly when the deepest segment reached has no end state from any start
/// the earlier segments can produce.
fn search_segments(
    context: &KeyContext<'_>,
    shape: &KeyShape<'_>,
    budget: &mut Budget,
) -> KeyResult {
    if shape.segments.is_empty() {
        return KeyResult::Linearizable;
    }
    let mut runs: Vec<SegmentRun<'_>> = Vec::new();
    let initial = Carried {
        value: ABSENT,
        used: BitSet::new(shape.floating.len()),
        witness: ABSENT,
    };
    feed(shape, &mut runs, 0, initial);
    let mut k = 0;
    loop {
        let next = match runs[k].exploration.next_end(budget) {
            Ok(next) => next,
            Err(OutOfBudget) => return KeyResult::Inconclusive,
        };
        match next {
            Some(end) => {
                if k + 1 == shape.segments.len() {
                    return KeyResult::Linearizable;
                }
                let carried = carry(shape, &runs[k].local, k, &end);
                if feed(shape, &mut runs, k + 1, carried) {
                    k += 1;
                }
            }
            None if k > 0 => k -= 1,
            None => break,
        }
    }
    let failed = runs.len() - 1;
    let run = &runs[failed];
    let segment = &shape.segments[failed];
    let entering: Vec<(u32, u32)> = if failed > 0 {
        run.fed.iter().map(|c| (c.value, c.witness)).collect()
    } else {
        Vec::new()
    };
    let starts: Vec<RegisterState> = run.fed.iter().map(|c| localize(c, &run.local)).collect();
    let (violation, isolated) = explain(
        context, shape, segment, &run.local, &starts, &entering, budget,
    );
    KeyResult::Violation {
        violation,
        isolated,
    }
}

/// Offers segment `k` a start state; false if it was offered that state before.
fn feed<'a>(
    shape: &KeyShape<'a>,
    runs: &mut Vec<SegmentRun<'a>>,
    k: usize,
    start: Carried,
) -> bool {
    if runs.len() == k {
        let events = &shape.required[shape.segments[k].range.clone()];
        let local: Vec<usize> = (0..shape.floating.len())
            .filter(|&g| {
                let value = shape.floating[g].value;
                shape.introduced_in[g] <= k
                    && (shape.read_after(value, k)
                        || shape.last_read_segment[value as usize] == Some(k))
            })
            .collect();
        let problem = Problem::new(
            events.to_vec(),
            local.iter().map(|&g| shape.floating[g]).collect(),
            Later::Segments {
                last_read_segment: shape.last_read_segment,
                segment: k,
            },
        );
        runs.push(SegmentRun {
            exploration: Exploration::new(problem),
            local,
            fed: Vec::new(),
            tried: HashSet::new(),
        });
    }
    let Some(run) = runs.get_mut(k) else {
        return false;
    };
    if !run.tried.insert((start.value, start.used.clone())) {
        return false;
    }
    run.exploration.add_start(localize(&start, &run.local));
    run.fed.push(start);
    true
}

/// A carried state in the terms of one segment's problem.
fn localize(carried: &Carried, local: &[usize]) -> RegisterState {
    let mut used = BitSet::new(local.len());
    for (j, &g) in local.iter().enumerate() {
        if carried.used.contains(g) {
            used.insert(j);
        }
    }
    // The actual value behaves exactly like its canonical stand-in (no read in this segment or
    // later returns it) and lets an explanation say what the register held.
    RegisterState {
        value: carried.witness,
        used,
    }
}

/// A register state between segments: its value and which floating writes are spent.
#[derive(Clone, Debug)]
struct Carried {
    /// [`UNREAD`] if no later read returns it.
    value: u32,
    /// Indexed like [`KeyShape::floating`].
    used: BitSet,
    /// The value the register actually held, for explanations.
    witness: u32,
}

/// Turns an end state of segment `k` into the canonical start state of the next one, so that
/// states no later read can tell apart are explored once.
fn carry(shape: &KeyShape<'_>, local: &[usize], k: usize, end: &End) -> Carried {
    let floating = shape.floating;
    let value = if shape.read_after(end.state.value, k) {
        end.state.value
    } else {
        UNREAD
    };
    let mut used = BitSet::new(floating.len());
    for (j, &g) in local.iter().enumerate() {
        if end.state.used.contains(j) {
            used.insert(g);
        }
    }
    for (g, f) in floating.iter().enumerate() {
        if shape.introduced_in[g] <= k && !shape.read_after(f.value, k) {
            used.insert(g);
        }
    }
    // Floating writes of equal value invoked before the next segment are interchangeable there,
    // so only how many remain matters; keep the earliest ones unused.
    let mut unused_by_value: HashMap<u32, usize> = HashMap::new();
    for (g, f) in floating.iter().enumerate() {
        if shape.introduced_in[g] <= k && !used.contains(g) {
            *unused_by_value.entry(f.value).or_default() += 1;
        }
    }
    for (g, f) in floating.iter().enumerate() {
        if shape.introduced_in[g] <= k {
            let left = unused_by_value.entry(f.value).or_default();
            if *left > 0 {
                *left -= 1;
                used.remove(g);
            } else {
                used.insert(g);
            }
        }
    }
    Carried {
        value,
        used,
        witness: end.witness,
    }
}

// ---------------------------------------------------------------------------------------------
// Cheap refutations that need no search: a read whose value no write could have supplied, or
// whose every possible source was certainly overwritten before the read began.

/// The earliest-completing read refuted this way, if any.
fn precheck<'e>(
    context: &KeyContext<'_>,
    required: &'e [Event],
    floating: &[Floating],
) -> Option<&'e Event> {
    let value_count = context.values.len();
    // Per value: its writes as (invoke, complete), by invocation, with a running maximum of the
    // completion (an unknown write never completes).
    let mut sources: Vec<Vec<(u64, u64)>> = vec![Vec::new(); value_count];
    let mut acknowledged: Vec<(u64, u64, u32)> = Vec::new();
    for event in required {
        if let Action::Write(value) = event.action {
            sources[value as usize].push((event.invoke, event.complete));
            acknowledged.push((event.invoke, event.complete, value));
        }
    }
    for f in floating {
        sources[f.value as usize].push((f.invoke, NEVER));
    }
    for writes in &mut sources {
        writes.sort_unstable();
        let mut latest = 0;
        for write in writes.iter_mut() {
            latest = latest.max(write.1);
            write.1 = latest;
        }
    }
    acknowledged.sort_unstable();
    // From each position on: the acknowledged write completing first, and the first completing
    // among those of any other value, so "the earliest completion of a write of a value other
    // than v invoked after t" is one lookup.
    let mut suffix: Vec<[(u64, u32); 2]> = vec![[(NEVER, UNREAD); 2]; acknowledged.len() + 1];
    for index in (0..acknowledged.len()).rev() {
        let (_, complete, value) = acknowledged[index];
        let [mut best, mut other] = suffix[index + 1];
        if complete < best.0 {
            if value != best.1 {
                other = best;
            }
            best = (complete, value);
        } else if value != best.1 && complete < other.0 {
            other = (complete, value);
        }
        suffix[index] = [best, other];
    }
    let overwritten_by = |after: Option<u64>, value: u32| -> u64 {
        let from = after.map_or(0, |t| acknowledged.partition_point(|w| w.0 <= t));
        let [best, other] = suffix[from];
        if best.1 != value { best.0 } else { other.0 }
    };

    let mut culprit: Option<&Event> = None;
    for read in required {
        let Action::Read(value) = read.action else {
            continue;
        };
        let writes = &sources[value as usize];
        let possible = writes.partition_point(|w| w.0 <= read.complete);
        // The latest completion among possible sources; the initial absent value counts as a
        // source that "completed" before everything.
        let latest_source = match possible.checked_sub(1) {
            Some(last) => Some(writes[last].1),
            None if value == ABSENT => None,
            None => {
                culprit = earliest(culprit, read);
                continue;
            }
        };
        if latest_source == Some(NEVER) {
            continue;
        }
        // Some write of another value began after every possible source had completed and
        // completed before the read began, so it sits between them in any order.
        if overwritten_by(latest_source, value) < read.invoke {
            culprit = earliest(culprit, read);
        }
    }
    culprit
}

fn earliest<'e>(current: Option<&'e Event>, candidate: &'e Event) -> Option<&'e Event> {
    match current {
        Some(known) if (known.complete, known.invoke) <= (candidate.complete, candidate.invoke) => {
            Some(known)
        }
        _ => Some(candidate),
    }
}

// ---------------------------------------------------------------------------------------------
// The search.

/// Where reads beyond a problem's own are to be found.
#[derive(Clone, Copy)]
enum Later<'a> {
    /// Nowhere: the problem is the whole history (an explanation's prefix).
    Nothing,
    /// In segments after `segment`.
    Segments {
        last_read_segment: &'a [Option<usize>],
        segment: usize,
    },
}

/// One search: required events that must all be placed, and optional writes that may be.
struct Problem<'a> {
    /// Sorted by invocation; each carries its slot.
    required: Vec<Event>,
    /// Sorted by invocation.
    optional: Vec<Floating>,
    /// Value id to slot, for values some required read returns.
    slot_of: HashMap<u32, u32, BuildHasherDefault<WordHasher>>,
    /// Per slot: the number of required reads returning it.
    reads_per_slot: Vec<u32>,
    /// Per slot: the number of required writes of it.
    writes_per_slot: Vec<u32>,
    /// Per optional write: the slot of its value, or [`NO_SLOT`].
    optional_slot: Vec<u32>,
    later: Later<'a>,
}

impl<'a> Problem<'a> {
    fn new(mut required: Vec<Event>, optional: Vec<Floating>, later: Later<'a>) -> Problem<'a> {
        let mut slot_of: HashMap<u32, u32, BuildHasherDefault<WordHasher>> = HashMap::default();
        let mut reads_per_slot = Vec::new();
        for event in &mut required {
            if let Action::Read(value) = event.action {
                let slot = *slot_of.entry(value).or_insert_with(|| {
                    reads_per_slot.push(0);
                    (reads_per_slot.len() - 1) as u32
                });
                reads_per_slot[slot as usize] += 1;
                event.slot = slot;
            }
        }
        let mut writes_per_slot = vec![0; reads_per_slot.len()];
        for event in &mut required {
            if let Action::Write(value) = event.action
                && let Some(&slot) = slot_of.get(&value)
            {
                writes_per_slot[slot as usize] += 1;
                event.slot = slot;
            }
        }
        let optional_slot = optional
            .iter()
            .map(|f| slot_of.get(&f.value).copied().unwrap_or(NO_SLOT))
            .collect();
        Problem {
            required,
            optional,
            slot_of,
            reads_per_slot,
            writes_per_slot,
            optional_slot,
            later,
        }
    }

    fn read_later(&self, value: u32) -> bool {
        match self.later {
            Later::Nothing => false,
            Later::Segments {
                last_read_segment,
                segment,
            } => last_read_segment
                .get(value as usize)
                .copied()
                .flatten()
                .is_some_and(|last| last > segment),
        }
    }
}

/// A register state at the edge of a problem; `used` indexes `Problem::optional`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RegisterState {
    value: u32,
    used: BitSet,
}

/// A state a linearization can end in, with the register's actual value (the state's value may
/// be [`UNREAD`]), for explanations.
#[derive(Clone, Debug)]
struct End {
    state: RegisterState,
    witness: u32,
}

#[derive(Debug)]
struct OutOfBudget;

struct Budget {
    left: u64,
    spent: u64,
}

impl Budget {
    fn new(steps: u64) -> Budget {
        Budget {
            left: steps,
            spent: 0,
        }
    }

    fn spend(&mut self, steps: u64) -> Result<(), OutOfBudget> {
        self.spent = self.spent.saturating_add(steps);
        if steps > self.left {
            self.left = 0;
            return Err(OutOfBudget);
        }
        self.left -= steps;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Move {
    Required(usize),
    Optional(usize),
}

struct Undo {
    applied: Move,
    value: u32,
    frontier: usize,
}

struct Frame {
    moves: Vec<Move>,
    next: usize,
    /// How the search got here; `None` for a start state.
    undo: Option<Undo>,
}

/// Scanning a wide window of concurrent operations costs this many candidates per step, so the
/// step bound also bounds time.
const CANDIDATES_PER_STEP: u64 = 32;

/// A depth-first search over one problem that hands out end states one at a time and can be
/// given more start states later; the memo is shared by all of them.
struct Exploration<'a> {
    problem: Problem<'a>,
    state: SearchState,
    stack: Vec<Frame>,
    pending: std::collections::VecDeque<RegisterState>,
}

impl<'a> Exploration<'a> {
    fn new(problem: Problem<'a>) -> Exploration<'a> {
        let state = SearchState::new(&problem);
        Exploration {
            problem,
            state,
            stack: Vec::new(),
            pending: std::collections::VecDeque::new(),
        }
    }

    fn add_start(&mut self, start: RegisterState) {
        self.pending.push_back(start);
    }

    /// The next end state not handed out before, or `None` once every start is exhausted.
    fn next_end(&mut self, budget: &mut Budget) -> Result<Option<End>, OutOfBudget> {
        let problem = &self.problem;
        let state = &mut self.state;
        let total = problem.required.len();
        loop {
            let Some(frame) = self.stack.last_mut() else {
                let Some(start) = self.pending.pop_front() else {
                    return Ok(None);
                };
                // Every earlier start was explored to the end, so everything else is undone.
                state.start(problem, start);
                budget.spend(1)?;
                if !state.remember(problem) {
                    continue;
                }
                if state.placed_count == total {
                    return Ok(Some(state.end_state(problem)));
                }
                let (moves, cost) = state.moves(problem);
                budget.spend(cost)?;
                self.stack.push(Frame {
                    moves,
                    next: 0,
                    undo: None,
                });
                continue;
            };
            let Some(&next) = frame.moves.get(frame.next) else {
                if let Some(undo) = self.stack.pop().and_then(|frame| frame.undo) {
                    state.undo(problem, undo);
                }
                continue;
            };
            frame.next += 1;
            budget.spend(1)?;
            let (undo, alive) = state.apply(problem, next);
            if !alive || !state.remember(problem) {
                state.undo(problem, undo);
                continue;
            }
            if state.placed_count == total {
                let end = state.end_state(problem);
                state.undo(problem, undo);
                return Ok(Some(end));
            }
            let (moves, cost) = state.moves(problem);
            budget.spend(cost)?;
            self.stack.push(Frame {
                moves,
                next: 0,
                undo: Some(undo),
            });
        }
    }
}

/// Whether some complete linearization of `problem` exists from one of `starts`.
fn solvable(
    problem: Problem<'_>,
    starts: Vec<RegisterState>,
    budget: &mut Budget,
) -> Result<bool, OutOfBudget> {
    let mut exploration = Exploration::new(problem);
    for start in starts {
        exploration.add_start(start);
    }
    Ok(exploration.next_end(budget)?.is_some())
}

struct SearchState {
    placed: BitSet,
    placed_count: usize,
    /// Every required event before it is placed; it is not.
    frontier: usize,
    /// Placed required events after the frontier, ascending. Few: each had to be concurrent
    /// with the frontier event when placed.
    ahead: Vec<usize>,
    value: u32,
    used: BitSet,
    /// Per read slot: reads not placed yet.
    unplaced_reads: Vec<u32>,
    /// Per read slot: writes (required, or optional and unused) not placed yet.
    unplaced_writes: Vec<u32>,
    memo: HashSet<MemoKey, BuildHasherDefault<WordHasher>>,
    scratch: Vec<u32>,
}

/// Words a memo key holds without a heap allocation: enough for the frontier, the value, up to
/// 64 optional writes and 64 places ahead of the frontier, the common case by far.
const INLINE_KEY_WORDS: usize = 7;

/// A search state as remembered: exact, and compact because the memo may hold millions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum MemoKey {
    Inline {
        len: u8,
        words: [u32; INLINE_KEY_WORDS],
    },
    Spilled(Box<[u32]>),
}

impl MemoKey {
    fn new(words: &[u32]) -> MemoKey {
        if words.len() <= INLINE_KEY_WORDS {
            let mut inline = [0; INLINE_KEY_WORDS];
            inline[..words.len()].copy_from_slice(words);
            MemoKey::Inline {
                len: words.len() as u8,
                words: inline,
            }
        } else {
            MemoKey::Spilled(words.into())
        }
    }
}

impl SearchState {
    fn new(problem: &Problem<'_>) -> SearchState {
        SearchState {
            placed: BitSet::new(problem.required.len()),
            placed_count: 0,
            frontier: 0,
            ahead: Vec::new(),
            value: ABSENT,
            used: BitSet::new(problem.optional.len()),
            unplaced_reads: problem.reads_per_slot.clone(),
            unplaced_writes: problem.writes_per_slot.clone(),
            memo: HashSet::default(),
            scratch: Vec::new(),
        }
    }

    /// Takes up a start state; nothing may be placed.
    fn start(&mut self, problem: &Problem<'_>, start: RegisterState) {
        self.value = start.value;
        self.used = start.used;
        self.unplaced_writes.clone_from(&problem.writes_per_slot);
        for (index, &slot) in problem.optional_slot.iter().enumerate() {
            if slot != NO_SLOT && !self.used.contains(index) {
                self.unplaced_writes[slot as usize] += 1;
            }
        }
    }

    /// Whether overwriting the current value with `value` leaves a read of the current value
    /// that no remaining write can satisfy.
    fn starves(&self, problem: &Problem<'_>, value: u32) -> bool {
        value != self.value
            && problem.slot_of.get(&self.value).is_some_and(|&slot| {
                self.unplaced_reads[slot as usize] > 0 && self.unplaced_writes[slot as usize] == 0
            })
    }

    /// Whether some read not placed yet, here or later, returns `value`.
    fn observable(&self, problem: &Problem<'_>, value: u32) -> bool {
        if value == UNREAD {
            return false;
        }
        problem
            .slot_of
            .get(&value)
            .is_some_and(|&slot| self.unplaced_reads[slot as usize] > 0)
            || problem.read_later(value)
    }

    /// Whether an optional write is spent for every purpose that remains.
    fn spent(&self, problem: &Problem<'_>, index: usize) -> bool {
        self.used.contains(index) || !self.observable(problem, problem.optional[index].value)
    }

    /// Records the current state; false if it was explored before.
    fn remember(&mut self, problem: &Problem<'_>) -> bool {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(self.frontier as u32);
        key.push(if self.observable(problem, self.value) {
            self.value
        } else {
            UNREAD
        });
        let optional = problem.optional.len();
        let mut word = 0u64;
        for index in 0..optional {
            if self.spent(problem, index) {
                word |= 1 << (index % 64);
            }
            if index % 64 == 63 || index + 1 == optional {
                key.push(word as u32);
                key.push((word >> 32) as u32);
                word = 0;
            }
        }
        // Places ahead of the frontier as a bitmask relative to it: they are few and near.
        let first_word = key.len();
        for &index in &self.ahead {
            let offset = index - self.frontier - 1;
            let at = first_word + 2 * (offset / 64);
            if key.len() <= at {
                key.resize(at + 2, 0);
            }
            let bit = offset % 64;
            key[at + bit / 32] |= 1 << (bit % 32);
        }
        let fresh = self.memo.insert(MemoKey::new(&key));
        self.scratch = key;
        fresh
    }

    fn end_state(&self, problem: &Problem<'_>) -> End {
        let mut used = BitSet::new(problem.optional.len());
        for index in 0..problem.optional.len() {
            if self.spent(problem, index) {
                used.insert(index);
            }
        }
        End {
            state: RegisterState {
                value: if self.observable(problem, self.value) {
                    self.value
                } else {
                    UNREAD
                },
                used,
            },
            witness: self.value,
        }
    }

    /// The moves worth trying from here, and the steps that finding them cost.
    fn moves(&self, problem: &Problem<'_>) -> (Vec<Move>, u64) {
        let required = &problem.required;
        // An event may go next only if no unplaced event completed before it was invoked.
        let mut horizon = NEVER;
        let mut urgent = None;
        let mut end = self.frontier;
        while end < required.len() && required[end].invoke <= horizon {
            if !self.placed.contains(end) && required[end].complete < horizon {
                horizon = required[end].complete;
                urgent = Some(end);
            }
            end += 1;
        }
        let mut moves = Vec::new();
        let mut readable: Vec<u32> = Vec::new();
        let holding_observable = self.observable(problem, self.value);
        for index in self.frontier..end {
            let event = &required[index];
            if event.invoke > horizon {
                break;
            }
            if self.placed.contains(index) {
                continue;
            }
            match event.action {
                Action::Read(value) if value == self.value => {
                    return (vec![Move::Required(index)], 1);
                }
                Action::Read(value) => readable.push(value),
                // Overwriting a value nobody will read with another such value changes nothing
                // anyone observes, and placing an eligible event early never violates real
                // time; doing it later could only leave a more useful value behind, which an
                // unobservable one never is.
                Action::Write(value) if !holding_observable && !self.observable(problem, value) => {
                    return (vec![Move::Required(index)], 1);
                }
                // Of eligible writes of equal value, the one completing first can always go
                // first: swapping it with a twin placed earlier changes no value and keeps
                // real time, since everything between them started before it completed.
                Action::Write(value) => {
                    let twin = moves.iter().position(|candidate| match *candidate {
                        Move::Required(other) => {
                            matches!(required[other].action, Action::Write(v) if v == value)
                        }
                        Move::Optional(_) => false,
                    });
                    match twin {
                        Some(at) => {
                            if let Move::Required(other) = moves[at]
                                && event.complete < required[other].complete
                            {
                                moves[at] = Move::Required(index);
                            }
                        }
                        None => moves.push(Move::Required(index)),
                    }
                }
            }
        }
        // An optional write need only ever go right before a read of its value: anywhere
        // earlier it can be moved up to that read without changing what any read sees. Of
        // several eligible ones with the same value, which one is spent does not matter, and an
        // eligible required write of that value can always take its place.
        let mut offered: Vec<u32> = moves
            .iter()
            .filter_map(|candidate| match *candidate {
                Move::Required(index) => match required[index].action {
                    Action::Write(value) => Some(value),
                    Action::Read(_) => None,
                },
                Move::Optional(_) => None,
            })
            .collect();
        for (index, floating) in problem.optional.iter().enumerate() {
            if floating.invoke > horizon {
                break;
            }
            if self.used.contains(index)
                || floating.value == self.value
                || !readable.contains(&floating.value)
                || offered.contains(&floating.value)
            {
                continue;
            }
            offered.push(floating.value);
            moves.push(Move::Optional(index));
        }
        // The event that bounds the horizon is a read of a value no eligible write provides,
        // and no other write can become eligible before it is placed: a dead end.
        if let Some(Action::Read(needed)) = urgent.map(|index| required[index].action) {
            let provides = |candidate: &Move| match *candidate {
                Move::Required(index) => {
                    matches!(required[index].action, Action::Write(value) if value == needed)
                }
                Move::Optional(index) => problem.optional[index].value == needed,
            };
            if !moves.iter().any(provides) {
                moves.clear();
            }
        }
        let scanned = (end - self.frontier + problem.optional.len()) as u64;
        (moves, 1 + scanned / CANDIDATES_PER_STEP)
    }

    /// Places a move; the flag says whether the state can still be completed as far as a
    /// cheap look can tell.
    fn apply(&mut self, problem: &Problem<'_>, applied: Move) -> (Undo, bool) {
        let undo = Undo {
            applied,
            value: self.value,
            frontier: self.frontier,
        };
        let mut alive = true;
        match applied {
            Move::Required(index) => {
                self.placed.insert(index);
                self.placed_count += 1;
                let event = &problem.required[index];
                match event.action {
                    Action::Read(_) => self.unplaced_reads[event.slot as usize] -= 1,
                    Action::Write(value) => {
                        alive = !self.starves(problem, value);
                        if event.slot != NO_SLOT {
                            self.unplaced_writes[event.slot as usize] -= 1;
                        }
                        self.value = value;
                    }
                }
                if index == self.frontier {
                    self.frontier += 1;
                    let drained = self
                        .ahead
                        .iter()
                        .zip(self.frontier..)
                        .take_while(|(placed, expected)| *placed == expected)
                        .count();
                    self.frontier += drained;
                    self.ahead.drain(..drained);
                } else {
                    let at = self.ahead.partition_point(|&placed| placed < index);
                    self.ahead.insert(at, index);
                }
            }
            Move::Optional(index) => {
                let value = problem.optional[index].value;
                alive = !self.starves(problem, value);
                let slot = problem.optional_slot[index];
                if slot != NO_SLOT {
                    self.unplaced_writes[slot as usize] -= 1;
                }
                self.used.insert(index);
                self.value = value;
            }
        }
        (undo, alive)
    }

    fn undo(&mut self, problem: &Problem<'_>, undo: Undo) {
        match undo.applied {
            Move::Required(index) => {
                self.placed.remove(index);
                self.placed_count -= 1;
                let event = &problem.required[index];
                if event.slot != NO_SLOT {
                    match event.action {
                        Action::Read(_) => self.unplaced_reads[event.slot as usize] += 1,
                        Action::Write(_) => self.unplaced_writes[event.slot as usize] += 1,
                    }
                }
                if index == undo.frontier {
                    // Everything between it and the frontier it advanced to was placed ahead.
                    self.ahead.splice(0..0, index + 1..self.frontier);
                    self.frontier = index;
                } else if let Ok(at) = self.ahead.binary_search(&index) {
                    self.ahead.remove(at);
                }
            }
            Move::Optional(index) => {
                self.used.remove(index);
                let slot = problem.optional_slot[index];
                if slot != NO_SLOT {
                    self.unplaced_writes[slot as usize] += 1;
                }
            }
        }
        self.value = undo.value;
    }
}

// ---------------------------------------------------------------------------------------------
// Explanations.

/// Explains why `segment` has no linearization from `starts`: bisects for the earliest
/// completion time by which the history can no longer be explained, then names the reads that
/// completed then and the operations that contradict them. `entering` lists the states
/// (canonical value, actual value) the segment could start in, or nothing for the first segment.
fn explain(
    context: &KeyContext<'_>,
    shape: &KeyShape<'_>,
    segment: &Segment,
    local: &[usize],
    starts: &[RegisterState],
    entering: &[(u32, u32)],
    budget: &mut Budget,
) -> (Violation, bool) {
    let events = &shape.required[segment.range.clone()];
    let mut times: Vec<u64> = events
        .iter()
        .filter(|event| matches!(event.action, Action::Read(_)))
        .map(|event| event.complete)
        .collect();
    times.sort_unstable();
    times.dedup();

    let mut fails = |time: u64| -> Option<bool> {
        let (trial, trial_starts) = prefix(shape, events, local, starts, time);
        solvable(trial, trial_starts, budget)
            .ok()
            .map(|found| !found)
    };
    let mut first_failure = None;
    if let Some(&last) = times.last()
        && fails(last) == Some(true)
    {
        let (mut low, mut high) = (0, times.len() - 1);
        let mut decided = true;
        while low < high {
            let middle = (low + high) / 2;
            match fails(times[middle]) {
                Some(true) => high = middle,
                Some(false) => low = middle + 1,
                None => {
                    decided = false;
                    break;
                }
            }
        }
        if decided {
            first_failure = Some(times[high]);
        }
    }

    let mut text = format!("key {}: ", show_value(&Some(context.key.to_vec())));
    let mut conflicting: Vec<Op> = Vec::new();
    match first_failure {
        Some(time) => {
            let culprits = events
                .iter()
                .filter(|e| matches!(e.action, Action::Read(_)) && e.complete == time);
            for (index, read) in culprits.enumerate() {
                if index > 0 {
                    text.push_str(" Also: ");
                }
                explain_read(
                    context,
                    context.ops[read.source],
                    time,
                    &mut text,
                    &mut conflicting,
                );
            }
        }
        None => {
            let _ = write!(
                text,
                "no order of the {} operations between times {} and {} explains their results \
                 (the step budget ran out before the first unexplainable response was isolated)",
                events.len(),
                events.first().map_or(0, |e| e.invoke),
                segment.end,
            );
            conflicting.extend(events.iter().map(|e| context.ops[e.source].clone()));
        }
    }
    if !entering.is_empty() {
        let mut shown: Vec<String> = Vec::new();
        for &(value, witness) in entering {
            let mut held = show_value(&value_bytes(context, witness));
            if value == UNREAD {
                held.push_str(" (which no later read returns)");
            }
            if !shown.contains(&held) {
                shown.push(held);
            }
        }
        let _ = write!(
            text,
            " The history before time {} is linearizable and can leave the register holding {}.",
            events.first().map_or(0, |e| e.invoke),
            shown.join(" or ")
        );
    }
    let violation = Violation {
        key: context.key.to_vec(),
        explanation: text,
        conflicting,
    };
    (violation, first_failure.is_some())
}

/// The segment as it stood at `time`: operations invoked by then, with those that had not
/// answered yet treated as unanswered (reads dropped, writes optional). Linearizability is
/// closed under such prefixes, so whether they fail is monotone in `time`.
fn prefix<'a>(
    shape: &KeyShape<'_>,
    events: &[Event],
    local: &[usize],
    starts: &[RegisterState],
    time: u64,
) -> (Problem<'a>, Vec<RegisterState>) {
    let mut required = Vec::new();
    let mut optional: Vec<(Floating, Option<usize>)> = Vec::new();
    for event in events.iter().filter(|e| e.invoke <= time) {
        match event.action {
            Action::Read(_) | Action::Write(_) if event.complete <= time => required.push(*event),
            Action::Read(_) => {}
            Action::Write(value) => optional.push((
                Floating {
                    invoke: event.invoke,
                    value,
                    source: event.source,
                },
                None,
            )),
        }
    }
    for (j, &g) in local.iter().enumerate() {
        let floating = shape.floating[g];
        if floating.invoke <= time {
            optional.push((floating, Some(j)));
        }
    }
    optional.sort_by_key(|(f, _)| (f.invoke, f.source));
    let trial_starts = starts
        .iter()
        .map(|start| {
            let mut used = BitSet::new(optional.len());
            for (index, (_, origin)) in optional.iter().enumerate() {
                if origin.is_some_and(|j| start.used.contains(j)) {
                    used.insert(index);
                }
            }
            RegisterState {
                value: start.value,
                used,
            }
        })
        .collect();
    let trial = Problem::new(
        required,
        optional.into_iter().map(|(f, _)| f).collect(),
        Later::Nothing,
    );
    (trial, trial_starts)
}

fn value_bytes(context: &KeyContext<'_>, id: u32) -> Value {
    context
        .values
        .get(id as usize)
        .copied()
        .flatten()
        .map(<[u8]>::to_vec)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    fn new(len: usize) -> BitSet {
        BitSet {
            words: vec![0; len.div_ceil(64)],
        }
    }

    fn contains(&self, index: usize) -> bool {
        self.words
            .get(index / 64)
            .is_some_and(|word| word & (1 << (index % 64)) != 0)
    }

    fn insert(&mut self, index: usize) {
        if let Some(word) = self.words.get_mut(index / 64) {
            *word |= 1 << (index % 64);
        }
    }

    fn remove(&mut self, index: usize) {
        if let Some(word) = self.words.get_mut(index / 64) {
            *word &= !(1 << (index % 64));
        }
    }
}

/// A fast hasher for memo keys, which are short runs of small integers; a keyed hasher buys
/// nothing here since the input is not adversarial.
#[derive(Default)]
struct WordHasher {
    hash: u64,
}

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        // Mix the high bits down: hash tables pick buckets from the low ones.
        let mut hash = self.hash;
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^ (hash >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
}

// ---------------------------------------------------------------------------------------------
// Text.

/// Appends why `read`, which completed at `time`, cannot be explained.
fn explain_read(
    context: &KeyContext<'_>,
    read: &Op,
    time: u64,
    text: &mut String,
    conflicting: &mut Vec<Op>,
) {
    let Some(returned) = read.returned() else {
        return;
    };
    conflicting.push(read.clone());
    let _ = write!(
        text,
        "{} is explained by no order of the operations up to time {time}",
        describe(read),
    );
    let sources: Vec<&Op> = context
        .ops
        .iter()
        .copied()
        .filter(|op| op.written() == Some(returned))
        .collect();
    let started_before = |op: &&Op| op.invoke <= time;
    if returned.is_some() && sources.is_empty() {
        text.push_str("; no write of this key ever wrote that value");
    } else if !sources.is_empty() && !sources.iter().any(started_before) {
        text.push_str("; every write of that value began after the read returned: ");
        text.push_str(&list(&sources, 3));
        conflicting.extend(sources.iter().take(3).map(|op| (*op).clone()));
    } else if !sources.is_empty() {
        let _ = write!(text, "; that value was written by {}", list(&sources, 3));
        conflicting.extend(sources.iter().take(3).map(|op| (*op).clone()));
    } else {
        text.push_str("; absent is the initial value, and no delete was issued");
    }

    // The writes that certainly took effect before the read began, latest first: any of them
    // may be what the read should have seen instead.
    let before = |op: &Op| op.complete.is_some_and(|c| c < read.invoke);
    // Writes of the returned value itself are listed above already.
    let preceding: Vec<&Op> = context
        .ops
        .iter()
        .copied()
        .filter(|op| op.is_acknowledged_write() && before(op) && op.written() != Some(returned))
        .collect();
    let latest: Vec<&Op> = latest_first(
        preceding
            .iter()
            .copied()
            .filter(|w| {
                // Keep only writes not certainly overwritten by another preceding write.
                !preceding.iter().any(|other| {
                    other.invoke > w.complete.unwrap_or(NEVER) && other.written() != w.written()
                })
            })
            .collect(),
    );
    if !latest.is_empty() {
        let _ = write!(
            text,
            "; writes completed before it began (the latest): {}",
            list(&latest, 3)
        );
        conflicting.extend(latest.iter().take(3).map(|op| (*op).clone()));
    }
    let other_reads: Vec<&Op> = latest_first(
        context
            .ops
            .iter()
            .copied()
            .filter(|op| before(op) && op.returned().is_some_and(|value| value != returned))
            .collect(),
    );
    if !other_reads.is_empty() {
        let _ = write!(
            text,
            "; reads completed before it began that saw other values: {}",
            list(&other_reads, 2)
        );
        conflicting.extend(other_reads.iter().take(2).map(|op| (*op).clone()));
    }
    text.push('.');
    let mut seen = HashSet::new();
    conflicting.retain(|op| seen.insert(op.clone()));
}

fn latest_first(mut ops: Vec<&Op>) -> Vec<&Op> {
    ops.sort_by_key(|op| std::cmp::Reverse((op.complete, op.invoke)));
    ops
}

fn list(ops: &[&Op], at_most: usize) -> String {
    let mut shown: Vec<String> = ops.iter().take(at_most).map(|op| describe(op)).collect();
    if ops.len() > at_most {
        shown.push(format!("and {} more", ops.len() - at_most));
    }
    shown.join(", ")
}

fn show_value(value: &Value) -> String {
    match value {
        None => "absent".to_string(),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if text.chars().count() <= 40 && !text.chars().any(char::is_control) => {
                format!("{text:?}")
            }
            _ => {
                let mut hex = String::new();
                for byte in bytes.iter().take(8) {
                    let _ = write!(hex, "{byte:02x}");
                }
                format!("{} bytes 0x{hex}..", bytes.len())
            }
        },
    }
}

fn describe(op: &Op) -> String {
    let interval = match op.complete {
        Some(complete) => format!("[{}, {complete}]", op.invoke),
        None => format!("[{}, no answer]", op.invoke),
    };
    let unknown = if op.outcome == Outcome::Unknown {
        " (outcome unknown)"
    } else {
        ""
    };
    match (&op.kind, &op.outcome) {
        (OpKind::Write(None), _) => format!("client {} delete {interval}{unknown}", op.client),
        (OpKind::Write(value), _) => format!(
            "client {} write {} {interval}{unknown}",
            op.client,
            show_value(value)
        ),
        (OpKind::Read, Outcome::Read(value)) => {
            format!(
                "client {} read {interval} -> {}",
                op.client,
                show_value(value)
            )
        }
        (OpKind::Read, _) => format!("client {} read {interval}{unknown}", op.client),
    }
}

#[cfg(test)]
mod tests;
