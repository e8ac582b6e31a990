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
use crate::machine::{Attest, Attested};
use bulwark_core::a2m::{
    self, Attestation, Call, ChainDigest, Expected, LogId, Outcome, Refusal, Seq, Status, Value,
};
use bulwark_core::sign::{PublicKey, Unverified};
use bulwark_core::{ClientId, Slot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

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

/// Requests whose position the replicated state remembers, the first executed going first: a
/// replica that restarted, or that installed a state, still knows where they executed (number,
/// batch and cumulative digest) and can ask its trusted log for that slot.
pub(super) const EXECUTED_MAX: usize = 1024;

/// Numbers below the stable checkpoint whose history slots the trusted log keeps, so that a
/// restarted replica can still attest them to clients that retransmit.
pub(super) const TRUNCATE_LAG: u64 = 256;

/// Numbers whose slot may wait for the trusted log at most: past that (the log unreachable
/// all the while) the replica stops rather than hold answers without bound.
pub(super) const PENDING_MAX: usize = 4096;

/// Answers one number may hold while its slot is asked for.
const ANSWERS_PER_NUMBER_MAX: usize = 4096;

/// Where a request executed, as the replicated state remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Executed {
    pub(super) seq: u64,
    pub(super) batch: Value,
    pub(super) digest: ChainDigest,
}

/// A number whose history slot the replica asks its trusted log for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Asked {
    at: Executed,
    /// The cumulative digest before it, when known: only then may the replica fill the slot
    /// (after a restart or a transfer it knows the slot's contents, not always what preceded).
    previous: Option<ChainDigest>,
    /// Ask by lookup (the slot may be filled already: after a restart, or found so).
    lookup: bool,
}

/// What the trusted log's answers released: answers for clients, and refusals to count.
pub(super) struct Released<R> {
    pub(super) notify: Vec<(ClientId, u64, Answer<R>)>,
    pub(super) refused: Vec<String>,
    pub(super) attested: u64,
}

/// A replica's side of E: its request history and what waits on its trusted log. History slots
/// are asked for in one ordered stream, one batch of calls at a time (lowest number first), so
/// the log never fills a slot above one still to be filled; numbers executed meanwhile join the
/// next batch.
pub(super) struct Trail<R> {
    pub(super) history: History,
    me: Slot,
    /// Batch digest at the last number executed, and the cumulative digest before it: the part
    /// of the replicated state E adds.
    pub(super) last: (Value, ChainDigest),
    /// The cumulative digest at the last number executed.
    pub(super) digest: ChainDigest,
    /// This replica's attestations of recent numbers.
    proofs: BTreeMap<u64, Unverified<Attestation>>,
    /// Where each recent request first executed, and the order they did: replicated state (in
    /// every checkpoint), evicted alike on every replica.
    executed_at: BTreeMap<bulwark_core::Digest, Executed>,
    order: VecDeque<bulwark_core::Digest>,
    /// Answers waiting for their number's attestation.
    answers: BTreeMap<u64, Vec<(ClientId, Reply<R>)>>,
    /// Numbers to ask for, lowest first.
    queue: BTreeMap<u64, Asked>,
    /// The batch of calls being made: its token and numbers.
    in_flight: Option<(u64, Vec<Asked>)>,
    /// The log was down: the queue waits for the next tick.
    hold: bool,
    /// Housekeeping calls (truncations) to make, each in a batch of its own.
    outbox: Vec<Call>,
    /// Tokens of housekeeping calls made.
    housekeeping: BTreeSet<u64>,
    next_token: u64,
    /// Why the replica stopped: its trusted log holds another history than the one it
    /// executed, is full, or stayed unreachable too long. It answers nothing until an operator
    /// recovers it.
    pub(super) stopped: Option<String>,
}

impl<R: Clone> Trail<R> {
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
            queue: BTreeMap::new(),
            in_flight: None,
            hold: false,
            outbox: Vec::new(),
            housekeeping: BTreeSet::new(),
            next_token: 1,
            stopped: None,
        }
    }

    /// The replica's own trusted request-history log.
    fn log(&self) -> LogId {
        self.history.attesters[self.me.index()].log
    }

    /// Where batch `batch` executing at `seq` puts the history.
    pub(super) fn position(&self, seq: u64, batch: Value) -> Executed {
        Executed {
            seq,
            batch,
            digest: self.history.digest_at(seq, &batch, &self.digest),
        }
    }

    /// Batch `seq` executed with `answers` for its clients: the history moves on, and the slot
    /// joins the queue.
    pub(super) fn executed(
        &mut self,
        seq: u64,
        batch: Value,
        answers: Vec<(ClientId, Reply<R>)>,
    ) -> Result<(), String> {
        let at = self.position(seq, batch);
        let previous = self.digest;
        self.digest = at.digest;
        self.last = (batch, previous);
        if !answers.is_empty() {
            self.answers.entry(seq).or_default().extend(answers);
        }
        self.enqueue(Asked {
            at,
            previous: Some(previous),
            lookup: false,
        })
    }

    fn enqueue(&mut self, asked: Asked) -> Result<(), String> {
        if self.queue.len() >= PENDING_MAX {
            let reason = format!(
                "{PENDING_MAX} numbers wait for the trusted log: the replica stopped rather than \
                 hold their answers without bound"
            );
            self.stop(reason.clone());
            return Err(reason);
        }
        self.queue.insert(asked.at.seq, asked);
        Ok(())
    }

    fn stop(&mut self, reason: String) {
        self.stopped.get_or_insert(reason);
        self.answers.clear();
        self.queue.clear();
    }

    /// Remembers where `request` executed (replicated state: every replica calls this alike).
    pub(super) fn remember(&mut self, request: bulwark_core::Digest, at: Executed) {
        if self.executed_at.insert(request, at).is_none() {
            self.order.push_back(request);
        }
        while self.order.len() > EXECUTED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.executed_at.remove(&old);
            }
        }
    }

    /// The remembered positions in execution order, for a checkpoint.
    pub(super) fn executed_list(&self) -> Vec<(bulwark_core::Digest, Executed)> {
        self.order
            .iter()
            .filter_map(|digest| Some((*digest, *self.executed_at.get(digest)?)))
            .collect()
    }

    /// Takes the state a replica installed (a transfer or its own checkpoint at restart) at
    /// number `seq`. What it held of another state goes: its answers and the attestations of
    /// its own log are not the installed history's. The installed number's slot is asked for
    /// at once: filled if the log is behind (spec §3.3.5), read back if it is there already,
    /// and the replica stops if its log holds something else there.
    pub(super) fn installed(
        &mut self,
        seq: u64,
        batch: Value,
        previous: ChainDigest,
        executed: Vec<(bulwark_core::Digest, Executed)>,
    ) {
        self.last = (batch, previous);
        self.digest = self.history.digest_at(seq, &batch, &previous);
        self.executed_at.clear();
        self.order.clear();
        for (request, at) in executed.into_iter().take(EXECUTED_MAX) {
            self.remember(request, at);
        }
        self.proofs.clear();
        self.answers.clear();
        self.queue.clear();
        self.in_flight = None;
        if seq > 0 {
            let at = Executed {
                seq,
                batch,
                digest: self.digest,
            };
            let _ = self.enqueue(Asked {
                at,
                previous: Some(previous),
                lookup: false,
            });
        }
    }

    /// After a restart: the numbers executed again may be in the log already, so every queued
    /// one is read back first (a slot found empty is then filled).
    pub(super) fn restored(&mut self) {
        for asked in self.queue.values_mut() {
            asked.lookup = true;
        }
        self.answers.clear();
    }

    /// The trusted log's history may forget below `seq` (a stable checkpoint), less the lag.
    pub(super) fn truncate(&mut self, seq: u64) {
        if seq > 0 {
            // A truncation to where the log already starts is refused, harmlessly; earlier
            // instances' slots all go at an instance's first one.
            let slot = self.history.at(seq.saturating_sub(TRUNCATE_LAG).max(1));
            self.outbox.push(Call::Truncate {
                log: self.log(),
                seq: slot,
            });
        }
    }

    /// The answer to a request that executed before (a retransmission, or a request ordered
    /// again): with the attestation of the number it first executed at, once the replica holds
    /// one that says what the replicated state says of that number; `None` while it is being
    /// asked for (the answer then leaves with it); a plain answer, which E's clients pass over,
    /// when the replica no longer knows where it executed.
    pub(super) fn answer_again(
        &mut self,
        client: ClientId,
        request: &bulwark_core::Digest,
        reply: Reply<R>,
    ) -> Option<Answer<R>> {
        let Some(at) = self.executed_at.get(request).copied() else {
            return Some(Answer::Executed(reply));
        };
        if self.stopped.is_some() {
            return None;
        }
        if let Some(history) = self.proofs.get(&at.seq)
            && history.peek().is_ok_and(|said| self.matches(&at, &said))
        {
            return Some(Answer::Attested {
                reply,
                history: history.clone(),
            });
        }
        if !self.asking(at.seq)
            && self
                .enqueue(Asked {
                    at,
                    previous: None,
                    lookup: true,
                })
                .is_err()
        {
            return None;
        }
        let waiting = self.answers.entry(at.seq).or_default();
        let known = waiting
            .iter()
            .any(|(c, r)| *c == client && r.id == reply.id && r.request == reply.request);
        if !known && waiting.len() < ANSWERS_PER_NUMBER_MAX {
            waiting.push((client, reply));
        }
        None
    }

    /// Whether `seq`'s slot is queued or being asked for.
    fn asking(&self, seq: u64) -> bool {
        self.queue.contains_key(&seq)
            || self
                .in_flight
                .as_ref()
                .is_some_and(|(_, asked)| asked.iter().any(|a| a.at.seq == seq))
    }

    fn token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    /// The calls to make now: housekeeping, then the queued numbers in one batch, lowest first,
    /// unless a batch is being made or the log was down since the last tick.
    pub(super) fn flush(&mut self, attest: &mut Vec<Attest>) {
        let mut first = Vec::new();
        for call in std::mem::take(&mut self.outbox) {
            let token = self.token();
            self.housekeeping.insert(token);
            first.push(Attest {
                token,
                calls: vec![call],
            });
        }
        if self.in_flight.is_none() && !self.hold && self.stopped.is_none() {
            let asked: Vec<Asked> = std::mem::take(&mut self.queue).into_values().collect();
            if !asked.is_empty() {
                let token = self.token();
                let calls = asked.iter().map(|asked| self.call(asked)).collect();
                first.push(Attest { token, calls });
                self.in_flight = Some((token, asked));
            }
        }
        attest.splice(0..0, first);
    }

    /// The tick: a log that was down is asked again.
    pub(super) fn tick(&mut self) {
        self.hold = false;
    }

    fn call(&self, asked: &Asked) -> Call {
        let seq = self.history.at(asked.at.seq);
        match asked.previous {
            // An advance to the next slot is an append; one to a slot already filled is
            // refused, never filled again.
            Some(previous) if !asked.lookup => Call::AdvanceAttest {
                log: self.log(),
                seq,
                digest: previous,
                value: asked.at.batch,
                nonce: a2m::nonce_of(seq),
            },
            _ => Call::Lookup {
                log: self.log(),
                seq,
                nonce: a2m::nonce_of(seq),
            },
        }
    }

    /// Whether `attestation` says this replica's log holds `at`.
    fn matches(&self, at: &Executed, attestation: &Attestation) -> bool {
        let seq = self.history.at(at.seq);
        attestation.kind == a2m::Kind::Lookup
            && attestation.log == self.log()
            && attestation.seq == seq
            && attestation.nonce == a2m::nonce_of(seq)
            && attestation.status == Status::Assigned
            && attestation.ref_seq == seq
            && attestation.value == at.batch
            && attestation.digest == at.digest
    }

    /// The trusted log's answers to the calls of `token`.
    pub(super) fn on_answers(&mut self, token: u64, answers: Attested) -> Released<R> {
        let mut released = Released {
            notify: Vec::new(),
            refused: Vec::new(),
            attested: 0,
        };
        if self.housekeeping.remove(&token) {
            return released;
        }
        let asked = match self.in_flight.take() {
            Some((mine, asked)) if mine == token => asked,
            other => {
                self.in_flight = other;
                return released;
            }
        };
        if self.stopped.is_some() {
            return released;
        }
        let mut answers = answers.into_iter();
        for asked in asked {
            // The batch ends at the first refusal: the rest were never asked, and go back.
            let Some(answer) = answers.next() else {
                let _ = self.enqueue(asked);
                continue;
            };
            let said = match answer {
                Ok(Outcome::Attested(signed)) => signed,
                Err(Refusal::NotMonotone { .. }) if !asked.lookup => {
                    // Filled already (a restart): read it back instead.
                    let _ = self.enqueue(Asked {
                        lookup: true,
                        ..asked
                    });
                    continue;
                }
                Err(Refusal::Stopped(reason)) => {
                    released
                        .refused
                        .push(format!("the trusted log is down: {reason}"));
                    self.hold = true;
                    let _ = self.enqueue(asked);
                    continue;
                }
                Err(refusal) => {
                    // A full log stops its host rather than drop entries (spec §2.2).
                    let reason = format!(
                        "the trusted log refused number {}'s history slot ({refusal}): the \
                         replica stopped",
                        asked.at.seq
                    );
                    self.stop(reason.clone());
                    released.refused.push(reason);
                    return released;
                }
                Ok(other) => {
                    released.refused.push(format!(
                        "the trusted log answered {other:?} to a history call"
                    ));
                    self.answers.remove(&asked.at.seq);
                    continue;
                }
            };
            let value = *said.value();
            if self.matches(&asked.at, &value) {
                released.attested += 1;
                let history = said.to_unverified();
                for (client, reply) in self.answers.remove(&asked.at.seq).unwrap_or_default() {
                    released.notify.push((
                        client,
                        reply.id,
                        Answer::Attested {
                            reply,
                            history: history.clone(),
                        },
                    ));
                }
                self.proofs.insert(asked.at.seq, history);
                while self.proofs.len() > PROOFS_MAX {
                    self.proofs.pop_first();
                }
                continue;
            }
            match value.status {
                // Past the log's end: fill it, if the replica knows what precedes it.
                Status::Unassigned if asked.previous.is_some() => {
                    let _ = self.enqueue(Asked {
                        lookup: false,
                        ..asked
                    });
                }
                // Jumped over by a transfer, truncated, or not reached: this number's answers
                // go without an attestation from this replica, which lies to no one.
                Status::Unassigned | Status::Skipped | Status::Forgotten => {
                    self.answers.remove(&asked.at.seq);
                    released.refused.push(format!(
                        "number {}'s history slot is {:?} in the trusted log: its answers go \
                         unattested",
                        asked.at.seq, value.status
                    ));
                }
                // Another batch or another history before it: the log will never say what
                // this replica executed, and answering on would be answering from a fork.
                Status::Assigned => {
                    let reason = format!(
                        "the trusted request history holds another batch or history at number \
                         {} than this replica executed: it stopped (recover it with a new log, \
                         spec §3.3.5)",
                        asked.at.seq
                    );
                    self.stop(reason.clone());
                    released.refused.push(reason);
                    return released;
                }
            }
        }
        released
    }
}
