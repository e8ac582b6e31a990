//! The logs themselves, as plain state: what each operation changes and what each question
//! answers (spec §2.2, §2.5). No key, no disk: [`crate::Component`] persists a [`Plan`] before it
//! applies it, and signs the statements.

use std::collections::BTreeMap;

use bulwark_core::a2m::{Attestation, ChainDigest, Kind, LogId, Nonce, Seq, Status, Value, chain};
use serde::{Deserialize, Serialize};

use bulwark_core::a2m::Refusal;

use crate::A2mError;

/// How much a component holds: a full log refuses appends (its host must stop, never drop
/// entries: spec §7.1 item 4), and a component refuses logs beyond the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Logs at most.
    pub logs_max: usize,
    /// Retained slots per log at most: the assigned slots from `low` to `high`, counting the
    /// virtual slot 0 while it is kept.
    pub entries_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            logs_max: 256,
            entries_max: 1 << 16,
        }
    }
}

/// An assigned slot: its value and the cumulative digest up to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// The digest chain at this slot.
    pub digest: ChainDigest,
}

impl Entry {
    /// Slot 0 of every log: a virtual entry, assigned, all zero (spec §8 item 1).
    pub const ZERO: Entry = Entry {
        value: [0; 32],
        digest: [0; 32],
    };
}

/// A log's bounds: slots below `low` are forgotten, slots above `high` unassigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// The lowest slot kept.
    pub low: Seq,
    /// The highest slot assigned.
    pub high: Seq,
}

#[derive(Clone, Debug)]
struct Log {
    head: Head,
    /// The assigned slots in `[low, high]`; skipped slots are the gaps between them. The entry at
    /// `high` is always here.
    entries: BTreeMap<Seq, Entry>,
}

impl Log {
    fn new() -> Log {
        Log {
            head: Head { low: 0, high: 0 },
            entries: BTreeMap::from([(0, Entry::ZERO)]),
        }
    }

    fn last(&self) -> Entry {
        // Invariant: the slot at `high` is assigned and never truncated away (truncate keeps
        // slot n ≤ high); restore refuses state without it.
        self.entries
            .get(&self.head.high)
            .copied()
            .unwrap_or(Entry::ZERO)
    }
}

/// One operation's effect, computed before anything changes: what to persist, then apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The log.
    pub log: LogId,
    /// Its bounds afterwards.
    pub head: Head,
    /// The slot assigned, if any.
    pub put: Option<(Seq, Entry)>,
    /// The slots forgotten, if any.
    pub forget: Vec<Seq>,
}

/// Every log of one component.
#[derive(Clone, Debug)]
pub struct Logs {
    limits: Limits,
    logs: BTreeMap<LogId, Log>,
}

impl Logs {
    /// No logs yet: every log reads as empty until its first append or advance.
    pub fn new(limits: Limits) -> Logs {
        Logs {
            limits,
            logs: BTreeMap::new(),
        }
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Each log's bounds, in log order.
    pub fn heads(&self) -> impl Iterator<Item = (LogId, Head)> + '_ {
        self.logs.iter().map(|(id, log)| (*id, log.head))
    }

    /// The bounds of a log about to change: an existing one's, or a new empty one's if the
    /// component may hold another log.
    fn head_for_change(&self, id: LogId) -> Result<Head, A2mError> {
        match self.logs.get(&id) {
            Some(log) => Ok(log.head),
            None if self.logs.len() < self.limits.logs_max => Ok(Head { low: 0, high: 0 }),
            None => Err(A2mError::Refused(Refusal::TooManyLogs {
                max: self.limits.logs_max as u64,
            })),
        }
    }

    fn retained(&self, id: LogId) -> usize {
        self.logs.get(&id).map_or(1, |log| log.entries.len())
    }

    /// `append(q, x)`: `x` fills slot `high + 1`, chained to slot `high`.
    pub fn plan_append(&self, id: LogId, value: Value) -> Result<Plan, A2mError> {
        let head = self.head_for_change(id)?;
        let seq = head
            .high
            .checked_add(1)
            .ok_or(A2mError::Refused(Refusal::Exhausted { log: id }))?;
        let previous = self.logs.get(&id).map_or(Entry::ZERO, Log::last);
        self.plan_fill(id, head, seq, previous.digest, value)
    }

    /// `advance(q, n, d, x)`: `x` fills slot `n > high`, chained to the caller's digest `d`; the
    /// slots between are skipped.
    pub fn plan_advance(
        &self,
        id: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<Plan, A2mError> {
        let head = self.head_for_change(id)?;
        if seq <= head.high {
            return Err(A2mError::Refused(Refusal::NotMonotone {
                log: id,
                seq,
                high: head.high,
            }));
        }
        self.plan_fill(id, head, seq, digest, value)
    }

    /// Slot `seq`, past the end of the log whose bounds are `head`, filled with `value` chained
    /// to `previous`: what an append and an advance both do once they know the slot.
    fn plan_fill(
        &self,
        id: LogId,
        head: Head,
        seq: Seq,
        previous: ChainDigest,
        value: Value,
    ) -> Result<Plan, A2mError> {
        self.check_room(id)?;
        let entry = Entry {
            value,
            digest: chain(seq, &value, &previous),
        };
        Ok(Plan {
            log: id,
            head: Head {
                low: head.low,
                high: seq,
            },
            put: Some((seq, entry)),
            forget: Vec::new(),
        })
    }

    /// `truncate(q, n)`: forget every slot below `n ∈ (low, high]`; slot `n` stays.
    pub fn plan_truncate(&self, id: LogId, seq: Seq) -> Result<Plan, A2mError> {
        let Some(log) = self.logs.get(&id) else {
            return Err(A2mError::Refused(Refusal::OutOfRange {
                log: id,
                seq,
                low: 0,
                high: 0,
            }));
        };
        if seq <= log.head.low || seq > log.head.high {
            return Err(A2mError::Refused(Refusal::OutOfRange {
                log: id,
                seq,
                low: log.head.low,
                high: log.head.high,
            }));
        }
        Ok(Plan {
            log: id,
            head: Head {
                low: seq,
                high: log.head.high,
            },
            put: None,
            forget: log.entries.range(..seq).map(|(seq, _)| *seq).collect(),
        })
    }

    fn check_room(&self, id: LogId) -> Result<(), A2mError> {
        if self.retained(id) >= self.limits.entries_max {
            return Err(A2mError::Refused(Refusal::Full {
                log: id,
                max: self.limits.entries_max as u64,
            }));
        }
        Ok(())
    }

    /// Makes `plan` the state. The caller persisted it first.
    pub fn apply(&mut self, plan: &Plan) {
        let log = self.logs.entry(plan.log).or_insert_with(Log::new);
        assert!(
            plan.head.low <= plan.head.high && plan.head.high >= log.head.high,
            "a plan never lowers a log's end"
        );
        log.head = plan.head;
        for seq in &plan.forget {
            log.entries.remove(seq);
        }
        if let Some((seq, entry)) = plan.put {
            log.entries.insert(seq, entry);
        }
        debug_assert!(log.entries.contains_key(&log.head.high));
        debug_assert!(log.entries.keys().all(|seq| *seq >= log.head.low));
    }

    /// What the log says of slot `seq`, as a LOOKUP answering `nonce` (spec §2.5's lookup).
    pub fn lookup(&self, id: LogId, seq: Seq, nonce: Nonce) -> Attestation {
        let empty = Log::new();
        let log = self.logs.get(&id).unwrap_or(&empty);
        let (status, ref_seq, entry) = if seq > log.head.high {
            (Status::Unassigned, log.head.high, None)
        } else if seq < log.head.low {
            (Status::Forgotten, log.head.low, None)
        } else {
            match log.entries.range(seq..).next() {
                Some((at, entry)) if *at == seq => (Status::Assigned, seq, Some(*entry)),
                Some((at, entry)) => (Status::Skipped, *at, Some(*entry)),
                // The entry at `high` is always there, and seq ≤ high.
                None => (Status::Unassigned, log.head.high, None),
            }
        };
        let entry = entry.unwrap_or(Entry {
            value: [0; 32],
            digest: [0; 32],
        });
        Attestation {
            kind: Kind::Lookup,
            log: id,
            seq,
            nonce,
            value: entry.value,
            status,
            ref_seq,
            digest: entry.digest,
        }
    }

    /// The last slot, as an END answering `nonce`.
    pub fn end(&self, id: LogId, nonce: Nonce) -> Attestation {
        let (high, entry) = self
            .logs
            .get(&id)
            .map_or((0, Entry::ZERO), |log| (log.head.high, log.last()));
        Attestation {
            kind: Kind::End,
            log: id,
            seq: high,
            nonce,
            value: entry.value,
            status: Status::Assigned,
            ref_seq: high,
            digest: entry.digest,
        }
    }

    /// Rebuilds the logs from stored heads and entries, refusing anything a component could not
    /// have written: an entry outside its log's bounds or of no log, a log without its last slot.
    pub fn restore(
        limits: Limits,
        heads: impl IntoIterator<Item = (LogId, Head)>,
        entries: impl IntoIterator<Item = (LogId, Seq, Entry)>,
    ) -> Result<Logs, String> {
        let mut logs = BTreeMap::new();
        for (id, head) in heads {
            if head.low > head.high {
                return Err(format!(
                    "log {id} keeps slots from {} but ends at {}",
                    head.low, head.high
                ));
            }
            let mut entries = BTreeMap::new();
            if head.low == 0 {
                entries.insert(0, Entry::ZERO);
            }
            logs.insert(id, Log { head, entries });
        }
        for (id, seq, entry) in entries {
            let Some(log) = logs.get_mut(&id) else {
                return Err(format!("slot {seq} belongs to log {id}, which has no head"));
            };
            if seq < log.head.low || seq > log.head.high || seq == 0 {
                return Err(format!(
                    "slot {seq} of log {id} lies outside its bounds [{}, {}]",
                    log.head.low, log.head.high
                ));
            }
            log.entries.insert(seq, entry);
        }
        for (id, log) in &logs {
            if !log.entries.contains_key(&log.head.high) {
                return Err(format!(
                    "log {id} ends at slot {} but that slot is missing",
                    log.head.high
                ));
            }
        }
        Ok(Logs { limits, logs })
    }
}
