//! A client's request to a PBFT-replicated application: sent to every replica, done when `f+1`
//! replicas answer with the same result for exactly this request (at least one of them correct),
//! or when `f+1` refuse it.

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
    results: Replies<A::Result>,
    refusals: Refusals<String>,
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
        }
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
        match reply {
            Answer::Executed(reply) => {
                if reply.id != self.id || reply.request != self.digest {
                    return Progress::Send(Vec::new());
                }
                if !self.results.record(from, reply.result.clone()) {
                    return Progress::Send(Vec::new());
                }
                let matching = self
                    .results
                    .present()
                    .filter(|(_, result)| **result == reply.result)
                    .count();
                if matching > self.f {
                    return Progress::Done(Ok(reply.result));
                }
            }
            Answer::Refused { id, reason } => {
                if id != self.id {
                    return Progress::Send(Vec::new());
                }
                if let Some((reason, by)) = self.refusals.record(from, reason, self.f) {
                    return Progress::Done(Err(OpError::Refused { reason, by }));
                }
            }
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
        self.f + 1
    }
}
