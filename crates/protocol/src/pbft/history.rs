//! A2M-PBFT-E (A2M paper §3.3; ../shared/specs/a2m.md §3.3): PBFT whose replicas keep the
//! sequence they executed in a trusted log and answer clients with it.
//!
//! Agreement is PBFT's, unchanged. What E adds is at execution: once batch `n` executes, slot
//! `n` of the replica's request-history log holds the batch's digest, chained to every slot
//! before it ([`a2m::chain`]), and each client's answer carries the log's LOOKUP of that slot
//! ([`super::Answer::Attested`]). A client accepts `2f+1` answers with the same result whose
//! attestations name the same number, batch and cumulative digest ([`History::check`]).
//!
//! Why that is worth it: with at most `f` faulty replicas it changes nothing (PBFT's safety holds
//! and `2f+1` correct replicas answer). With `f+1` to `2f` faulty ones PBFT's agreement can be
//! split (the faulty replicas tell one correct replica batch `a` at `n` and another batch `b`),
//! and PBFT's clients, taking `f+1` matching results, then accept results of two different
//! histories. Under E, two reply certificates for one `n` share a replica, and its log holds one
//! value per slot: the batches match, the cumulative digests make the histories before them
//! match, and determinism makes the results match. The system may stall; it does not lie.
//!
//! Checkpoints: a replica's checkpointed state includes the last slot of its history (the batch
//! digest and the cumulative digest before it), so the `2f+1` signatures that make a checkpoint
//! stable bind the history too, and a replica that installs it by state transfer brings its own
//! log to that slot (`advance`, spec §3.3.5) before it executes on. The paper attaches a LOOKUP
//! to each CHECKPOINT as well; with the history inside the signed state digest that lookup says
//! nothing the signatures do not.
//!
//! Recovery beyond `2f` faults, or after a split like the one above, is the operator's (spec
//! §3.3.5): the divergent replicas are repaired (their records removed), given new log ids
//! ([`Attester::log`]) in their trusted logs, and restarted; they catch up by state transfer from
//! the correct replicas and their new logs pick up at the number they install.

use super::msg::Reply;
use super::replica::Answer;
use bulwark_core::a2m::{self, Attestation, ChainDigest, Expected, LogId, Seq, Status, Value};
use bulwark_core::sign::{PublicKey, Unverified};
use bulwark_core::{ClientId, Slot};
use std::collections::{BTreeMap, VecDeque};

/// One replica's trusted log, as everyone who checks its answers knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attester {
    /// The trusted log's key.
    pub key: PublicKey,
    /// The replica's request-history log in it.
    pub log: LogId,
}

/// The request histories of one E instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History {
    /// Every replica's trusted log, by slot.
    pub attesters: Vec<Attester>,
    /// Where this instance's slots start: number `n` lives at `base + n`. Instances that share a
    /// trusted log (one per epoch) each take a range above the earlier ones'.
    pub base: Seq,
}

/// What one replica's verified answer says about where a request executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The number.
    pub seq: u64,
    /// The digest of the batch executed at it.
    pub batch: Value,
    /// The request history's cumulative digest at it.
    pub digest: ChainDigest,
}

impl History {
    /// The slot of number `n`.
    pub fn at(&self, n: u64) -> Seq {
        self.base + Seq::from(n)
    }

    /// The number slot `seq` stands for in this instance, if it is one of its slots.
    fn number(&self, seq: Seq) -> Option<u64> {
        let n = seq.checked_sub(self.base)?;
        u64::try_from(n).ok().filter(|n| *n > 0)
    }

    /// The cumulative digest at `n` when batch `batch` fills it after `previous` (zero at 0, as
    /// no slot of this instance is filled yet).
    pub fn digest_at(&self, n: u64, batch: &Value, previous: &ChainDigest) -> ChainDigest {
        if n == 0 {
            [0; 32]
        } else {
            a2m::chain(self.at(n), batch, previous)
        }
    }

    /// Checks replica `from`'s attestation of the slot its answer executed at: a LOOKUP of its
    /// own request-history log, signed by its trusted log, for a slot of this instance, with the
    /// nonce that slot fixes, saying the slot is assigned.
    pub fn check(
        &self,
        from: Slot,
        attestation: Unverified<Attestation>,
    ) -> Result<Position, String> {
        let attester = self
            .attesters
            .get(from.index())
            .ok_or_else(|| format!("no trusted log is known for slot {from}"))?;
        let claimed = attestation
            .peek()
            .map_err(|e| format!("not an attestation: {e}"))?;
        let seq = self
            .number(claimed.seq)
            .ok_or_else(|| format!("slot {} is not one of this instance's", claimed.seq))?;
        let expected = Expected {
            digest: None,
            value: None,
            ..Expected::assigned(attester.log, claimed.seq, [0; 32])
        };
        let signed = expected
            .check(&attester.key, attestation)
            .map_err(|e| e.to_string())?;
        Ok(Position {
            seq,
            batch: signed.value().value,
            digest: signed.value().digest,
        })
    }
}

/// Attestations a replica keeps to answer retransmissions: the newest this many.
pub(super) const PROOFS_MAX: usize = 4096;

/// Requests whose number the replicated state remembers, the first executed going first: a
/// replica that restarted, or that installed a state, still knows where they executed and can
/// ask its trusted log for that slot.
pub(super) const EXECUTED_MAX: usize = 1024;

/// Numbers below the stable checkpoint whose history slots the trusted log keeps, so that a
/// restarted replica can still attest them to clients that retransmit.
pub(super) const TRUNCATE_LAG: u64 = 256;

/// A number whose history slot the replica asked its trusted log for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Asked {
    pub(super) seq: u64,
    pub(super) batch: Value,
    /// The cumulative digest before it, and at it.
    pub(super) previous: ChainDigest,
    pub(super) digest: ChainDigest,
    /// The slot was found filled (a restart): asked by lookup instead.
    pub(super) looked_up: bool,
    /// Whether the batch and digests are known: false for a slot asked for again after a
    /// restart or a transfer, where the log's word is all the replica has.
    pub(super) known: bool,
}

/// A replica's side of E: its request history and what waits on its trusted log.
pub(super) struct Trail<R> {
    pub(super) history: History,
    pub(super) me: Slot,
    /// Batch digest at the last number executed, and the cumulative digest before it: the part
    /// of the replicated state E adds.
    pub(super) last: (Value, ChainDigest),
    /// The cumulative digest at the last number executed.
    pub(super) digest: ChainDigest,
    /// This replica's attestations of recent numbers.
    pub(super) proofs: BTreeMap<u64, Unverified<Attestation>>,
    /// The number each recent request first executed at, and the order they did: replicated
    /// state (in every checkpoint), evicted alike on every replica.
    pub(super) executed_at: BTreeMap<bulwark_core::Digest, u64>,
    pub(super) order: VecDeque<bulwark_core::Digest>,
    /// Answers waiting for their number's attestation.
    pub(super) answers: BTreeMap<u64, Vec<(ClientId, Reply<R>)>>,
    /// Calls made, by token.
    pub(super) asked: BTreeMap<u64, Vec<Asked>>,
    /// Numbers to ask for again at once (a slot found filled after a restart: by lookup).
    pub(super) again: Vec<Asked>,
    /// Numbers the trusted log could not be asked for (it was down), asked again at the tick.
    pub(super) later: Vec<Asked>,
    /// Housekeeping calls (advance after a state transfer, truncation) to make.
    pub(super) outbox: Vec<bulwark_core::a2m::Call>,
    pub(super) next_token: u64,
    /// Why the replica stopped: its trusted log holds another history than the one it
    /// executed, or is full. It answers nothing until an operator recovers it.
    pub(super) stopped: Option<String>,
}

impl<R> Trail<R> {
    pub(super) fn new(history: History, me: Slot) -> Trail<R> {
        Trail {
            history,
            me,
            last: ([0; 32], [0; 32]),
            digest: [0; 32],
            proofs: BTreeMap::new(),
            executed_at: BTreeMap::new(),
            order: VecDeque::new(),
            answers: BTreeMap::new(),
            asked: BTreeMap::new(),
            again: Vec::new(),
            later: Vec::new(),
            outbox: Vec::new(),
            next_token: 1,
            stopped: None,
        }
    }

    /// The replica's own trusted request-history log.
    pub(super) fn log(&self) -> LogId {
        self.history.attesters[self.me.index()].log
    }

    /// Batch `seq` executed: the history moves on, and the slot is to be asked for.
    pub(super) fn executed(&mut self, seq: u64, batch: Value) -> Asked {
        let previous = self.digest;
        self.digest = self.history.digest_at(seq, &batch, &previous);
        self.last = (batch, previous);
        Asked {
            seq,
            batch,
            previous,
            digest: self.digest,
            looked_up: false,
            known: true,
        }
    }

    /// Remembers that `request` executed at `seq`.
    pub(super) fn remember(&mut self, request: bulwark_core::Digest, seq: u64) {
        if self.executed_at.insert(request, seq).is_none() {
            self.order.push_back(request);
        }
        while self.order.len() > EXECUTED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.executed_at.remove(&old);
            }
        }
    }

    /// The remembered numbers in execution order, for a checkpoint.
    pub(super) fn executed_list(&self) -> Vec<(bulwark_core::Digest, u64)> {
        self.order
            .iter()
            .filter_map(|digest| Some((*digest, *self.executed_at.get(digest)?)))
            .collect()
    }

    /// Takes the remembered numbers of an installed state.
    pub(super) fn set_executed(&mut self, list: Vec<(bulwark_core::Digest, u64)>) {
        self.executed_at.clear();
        self.order.clear();
        for (digest, seq) in list.into_iter().take(EXECUTED_MAX) {
            self.remember(digest, seq);
        }
    }

    /// The call that fills (or, after a restart, reads) `asked`'s slot.
    pub(super) fn call(&self, asked: &Asked) -> bulwark_core::a2m::Call {
        let seq = self.history.at(asked.seq);
        if asked.looked_up {
            bulwark_core::a2m::Call::Lookup {
                log: self.log(),
                seq,
                nonce: a2m::nonce_of(seq),
            }
        } else {
            // An advance to the next slot is an append; one to a slot already filled is refused,
            // never filled again.
            bulwark_core::a2m::Call::AdvanceAttest {
                log: self.log(),
                seq,
                digest: asked.previous,
                value: asked.batch,
                nonce: a2m::nonce_of(seq),
            }
        }
    }

    /// The answer to a request that executed before (a retransmission, or a request ordered
    /// again): with the attestation of the number it first executed at; `None` while that
    /// attestation is being made (the answer then leaves with it); a plain answer, which E's
    /// clients pass over, when the replica no longer knows where it executed (too long ago, or
    /// in a state it installed by transfer).
    pub(super) fn answer_again(
        &mut self,
        client: ClientId,
        request: &bulwark_core::Digest,
        reply: Reply<R>,
    ) -> Option<Answer<R>> {
        let Some(seq) = self.executed_at.get(request).copied() else {
            return Some(Answer::Executed(reply));
        };
        if let Some(history) = self.proofs.get(&seq) {
            return Some(Answer::Attested {
                reply,
                history: history.clone(),
            });
        }
        if !self.in_flight(seq) {
            // Executed before a restart or in an installed state: the log may still hold the
            // slot (a state transfer jumps over it, a truncation forgets it).
            self.again.push(Asked {
                seq,
                batch: [0; 32],
                previous: [0; 32],
                digest: [0; 32],
                looked_up: true,
                known: false,
            });
        }
        self.answers.entry(seq).or_default().push((client, reply));
        None
    }

    /// Whether `seq`'s slot is still being asked of the trusted log.
    pub(super) fn in_flight(&self, seq: u64) -> bool {
        self.asked
            .values()
            .chain([&self.again, &self.later])
            .flatten()
            .any(|asked| asked.seq == seq)
    }

    pub(super) fn token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    /// Whether `attestation` is the one this replica needs for `asked`.
    pub(super) fn matches(&self, asked: &Asked, attestation: &Attestation) -> bool {
        let seq = self.history.at(asked.seq);
        attestation.kind == a2m::Kind::Lookup
            && attestation.log == self.log()
            && attestation.seq == seq
            && attestation.nonce == a2m::nonce_of(seq)
            && attestation.status == Status::Assigned
            && attestation.ref_seq == seq
            && (!asked.known
                || (attestation.value == asked.batch && attestation.digest == asked.digest))
    }

    /// Keeps the attestation of `seq`, the oldest going first.
    pub(super) fn keep(&mut self, seq: u64, attestation: Unverified<Attestation>) {
        self.proofs.insert(seq, attestation);
        while self.proofs.len() > PROOFS_MAX {
            self.proofs.pop_first();
        }
    }
}
