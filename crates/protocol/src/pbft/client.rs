//! A client's request to a PBFT-replicated application: sent to every replica, done when `f+1`
//! replicas answer with the same result for exactly this request (at least one of them correct),
//! or when `f+1` refuse it. Under A2M-PBFT-E ([`Submit::attested`]) it needs `2f+1` answers
//! whose trusted logs attest the same number, batch and request history ([`super::history`]).

use super::history::{History, Position};
use super::msg::{Origin, Request, Submitted};
use super::replica::Answer;
use super::{App, Params};
use crate::machine::{OpError, Operation, Progress};
use crate::round::{Refusals, Replies};
use bulwark_core::{ClientId, Digest, ServiceId, Slot};

/// One request, from submission to an accepted result.
pub struct Submit<A: App> {
    /// Replicas.
    n: usize,
    /// Faults tolerated: `f+1` matching results include a correct replica's.
    f: usize,
    id: u64,
    op: A::Op,
    /// The request as replicas will order it, to match replies against.
    digest: Digest,
    /// Each replica's result, with where its trusted log says it executed under E.
    results: Replies<(A::Result, Option<Position>)>,
    refusals: Refusals<String>,
    /// A2M-PBFT-E: the replicas' request histories; `None` for PBFT and EA.
    history: Option<History>,
    /// Answers refused because their attestation did not check, for the caller's evidence.
    bad_attestations: Vec<(Slot, String)>,
}

impl<A: App> Submit<A> {
    /// `client`'s request `id` (unique among its requests) for `op`.
    pub fn new(params: Params, client: ClientId, id: u64, op: A::Op) -> Submit<A> {
        Submit::sized(params.n, params.f, client, id, op)
    }

    /// The same request to `n` replicas of an agreement core that tolerates `f` faults (PBFT's
    /// `3f+1`, A2M-PBFT-EA's `2f+1`): either way `f+1` matching results include a correct one.
    pub fn sized(n: usize, f: usize, client: ClientId, id: u64, op: A::Op) -> Submit<A> {
        let digest = Request {
            origin: Origin::Client(client),
            id,
            op: op.clone(),
        }
        .digest();
        Submit {
            n,
            f,
            id,
            op,
            digest,
            results: Replies::new(n),
            refusals: Refusals::new(n),
            history: None,
            bad_attestations: Vec::new(),
        }
    }

    /// The request to A2M-PBFT-E's `3f+1` replicas: done at `2f+1` answers with the same
    /// result and the same attested position in the request history, so it stays right with up
    /// to `2f` faulty replicas (spec §3.3.3).
    pub fn attested(
        params: Params,
        history: History,
        client: ClientId,
        id: u64,
        op: A::Op,
    ) -> Submit<A> {
        let mut submit = Submit::sized(params.n, params.f, client, id, op);
        submit.history = Some(history);
        submit
    }

    /// Matching answers needed.
    fn needed(&self) -> usize {
        match self.history {
            Some(_) => 2 * self.f + 1,
            None => self.f + 1,
        }
    }

    /// Replicas whose answer carried an attestation that did not check, and why.
    pub fn bad_attestations(&self) -> &[(Slot, String)] {
        &self.bad_attestations
    }

    /// The positions the answers so far claim, per replica (under E).
    pub fn positions(&self) -> Vec<(Slot, Position)> {
        self.results
            .present()
            .filter_map(|(slot, (_, position))| position.map(|p| (slot, p)))
            .collect()
    }

    fn to_all(&self, slots: impl Iterator<Item = Slot>) -> Vec<(Slot, Submitted<A::Op>)> {
        slots
            .map(|slot| {
                (
                    slot,
                    Submitted {
                        id: self.id,
                        op: self.op.clone(),
                    },
                )
            })
            .collect()
    }
}

impl<A: App> Operation for Submit<A> {
    const SERVICE: ServiceId = A::SERVICE;
    type Request = Submitted<A::Op>;
    type Reply = Answer<A::Result>;
    type Output = A::Result;

    fn op(&self) -> u64 {
        self.id
    }

    fn start(&mut self) -> Vec<(Slot, Self::Request)> {
        self.to_all((0..self.n as u32).map(Slot))
    }

    fn on_reply(&mut self, from: Slot, reply: Self::Reply) -> Progress<Self> {
        let (reply, position) = match reply {
            Answer::Executed(reply) => {
                if self.history.is_some() {
                    // Unattested: an E client counts only what a trusted log vouches for.
                    return Progress::Send(Vec::new());
                }
                (reply, None)
            }
            Answer::Attested { reply, history } => {
                let Some(histories) = &self.history else {
                    return Progress::Send(Vec::new());
                };
                if reply.id != self.id || reply.request != self.digest {
                    return Progress::Send(Vec::new());
                }
                match histories.check(from, history) {
                    Ok(position) => (reply, Some(position)),
                    Err(reason) => {
                        if self.bad_attestations.len() < self.n {
                            self.bad_attestations.push((from, reason));
                        }
                        return Progress::Send(Vec::new());
                    }
                }
            }
            Answer::Refused { id, reason } => {
                if id != self.id {
                    return Progress::Send(Vec::new());
                }
                // As many refusals as answers: under E, up to 2f of them may be faulty ones'.
                if let Some((reason, by)) = self.refusals.record(from, reason, self.needed() - 1) {
                    return Progress::Done(Err(OpError::Refused { reason, by }));
                }
                return Progress::Send(Vec::new());
            }
        };
        if reply.id != self.id || reply.request != self.digest {
            return Progress::Send(Vec::new());
        }
        let answer = (reply.result, position);
        if !self.results.record(from, answer.clone()) {
            return Progress::Send(Vec::new());
        }
        let matching = self
            .results
            .present()
            .filter(|(_, other)| **other == answer)
            .count();
        if matching >= self.needed() {
            return Progress::Done(Ok(answer.0));
        }
        Progress::Send(Vec::new())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Self::Request)> {
        let missing: Vec<Slot> = self.results.missing().collect();
        self.to_all(missing.into_iter())
    }

    fn answered(&self) -> Vec<Slot> {
        self.results.nodes()
    }

    fn quorum(&self) -> usize {
        self.needed()
    }
}
