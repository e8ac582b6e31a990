//! The catalogue of Byzantine Phalanx servers: the same behaviours as the M-PoWerStore catalogue
//! (see the parent module), for a register whose versions the writer signs.
//!
//! A Phalanx server holds no key that signs versions, so every lie it can tell is one of: say
//! nothing, show an old (genuinely signed) state, forget, acknowledge a store it did not keep, or
//! serve bytes whose signature does not verify. Colluders share a seed: they freeze at the same
//! virtual time and forge the same version for the same key, so their lies agree.

use super::{Behaviour, honest_prefix};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, ServiceId, Slot, Time};
use bulwark_protocol::machine::{Access, Never, Output, Replica, ReplicaStats};
use bulwark_protocol::phalanx::{
    Change, Entry, Request, RequestBody, Response, ResponseBody, Server, SignedTimestamp,
    Timestamp, Writers,
};
use bytes::Bytes;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// What a liar does with one request: changes to persist (its own storage) and the reply, if any.
pub type Answer = (Vec<Change>, Option<Response>);

/// A Phalanx server with `behaviour` wrapped around a real one.
pub struct PhalanxLiar {
    behaviour: Behaviour,
    /// What it really stores (and, while honest, serves).
    real: Server,
    /// What some clients are shown: the state at the moment it turned (equivocating, stale and
    /// colluding servers stop feeding it).
    shadow: Server,
    node: Slot,
    writers: Arc<Writers>,
    rng: ChaCha8Rng,
    seed: u64,
    /// Requests served honestly before lying.
    honest_requests: u64,
    handled: u64,
    /// Colluders' shared moment to freeze, in virtual milliseconds.
    freeze_at: u64,
}

impl PhalanxLiar {
    /// A server of group 0, epoch 0, lying as `behaviour` from a seeded moment on.
    pub fn new(behaviour: Behaviour, node: Slot, writers: Arc<Writers>, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let honest_requests = honest_prefix(&mut rng);
        // Colluders share `seed`, so they freeze at the same moment.
        let freeze_at = ChaCha8Rng::seed_from_u64(seed ^ 0xc011_0de5).random_range(0..3_000);
        let server = || Server::new(node, Epoch(0), GroupId(0), writers.clone());
        PhalanxLiar {
            behaviour,
            real: server(),
            shadow: server(),
            node,
            writers: writers.clone(),
            rng,
            seed,
            honest_requests,
            handled: 0,
            freeze_at,
        }
    }

    /// Handles one request from `from`.
    pub fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        may_write: bool,
        request: Request,
    ) -> Answer {
        self.handled += 1;
        let lying = match self.behaviour {
            Behaviour::Colluding => now.0 >= self.freeze_at,
            _ => self.handled > self.honest_requests,
        };
        match self.behaviour {
            // The configuration service's behaviours have no Phalanx counterpart.
            Behaviour::Honest
            | Behaviour::EquivocatingPrimary
            | Behaviour::ForgedViewChange
            | Behaviour::EarlyStop
            | Behaviour::ForgedEvict
            | Behaviour::SkewedClock => self.honest(from, may_write, request),
            Behaviour::Silent if lying => (Vec::new(), None),
            Behaviour::Silent => self.honest(from, may_write, request),
            Behaviour::Amnesiac => {
                let first_lie = self.handled == self.honest_requests + 1;
                if lying && (first_lie || self.rng.random_bool(0.01)) {
                    // Forgets everything it acknowledged, and goes on acknowledging.
                    self.real = Server::new(self.node, Epoch(0), GroupId(0), self.writers.clone());
                }
                self.honest(from, may_write, request)
            }
            Behaviour::Stale | Behaviour::Equivocating | Behaviour::Colluding => {
                let shown_old = match self.behaviour {
                    Behaviour::Equivocating => self.shows_old(from),
                    _ => true,
                };
                if !lying {
                    let _ = self.shadow.handle(from, may_write, true, request.clone());
                    return self.honest(from, may_write, request);
                }
                if self.behaviour == Behaviour::Colluding && self.rng.random_bool(0.3) {
                    return (Vec::new(), self.forged_reply(&request, true));
                }
                if !shown_old {
                    return self.honest(from, may_write, request);
                }
                // The frozen state answers reads and clocks; stores are acknowledged unkept.
                let (_, reply) = self.shadow_answer(from, may_write, request);
                (Vec::new(), reply)
            }
            Behaviour::Corrupting => {
                let (changes, mut reply) = self.honest(from, may_write, request);
                if lying && let Some(reply) = reply.as_mut() {
                    self.corrupt(&mut reply.body);
                }
                (changes, reply)
            }
            Behaviour::Forging => {
                if lying && self.rng.random_bool(0.5) {
                    return (Vec::new(), self.forged_reply(&request, false));
                }
                self.honest(from, may_write, request)
            }
        }
    }

    /// Reloads one durable version at start-up (see [`Server::restore`]).
    pub fn restore(&mut self, key: Key, entry: Entry) -> bool {
        self.real.restore(key, entry)
    }

    fn honest(&mut self, from: ClientId, may_write: bool, request: Request) -> Answer {
        let handled = self.real.handle(from, may_write, true, request);
        (handled.changes, Some(handled.reply))
    }

    /// Answers from the frozen state, acknowledging stores without keeping them.
    fn shadow_answer(&mut self, from: ClientId, may_write: bool, request: Request) -> Answer {
        match &request.body {
            RequestBody::Store(entry) | RequestBody::WriteBack(entry) => (
                Vec::new(),
                Some(Response {
                    op: request.op,
                    epoch: request.epoch,
                    body: ResponseBody::StoreAck(entry.ts),
                }),
            ),
            RequestBody::Clock | RequestBody::Get => {
                let handled = self.shadow.handle(from, may_write, true, request);
                (Vec::new(), Some(handled.reply))
            }
        }
    }

    /// Equivocation splits clients by a seeded coin per client.
    fn shows_old(&self, client: ClientId) -> bool {
        let mixed = (u64::from(client.0) ^ self.seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        mixed >> 63 == 1
    }

    /// A made-up version of the request's key: a high timestamp, a value no one wrote, a
    /// signature that cannot verify. Colluders make the same one for the same key.
    fn forged_reply(&mut self, request: &Request, shared: bool) -> Option<Response> {
        let mut rng = if shared {
            story_rng(self.seed, &request.key)
        } else {
            ChaCha8Rng::seed_from_u64(self.rng.next_u64())
        };
        let ts = Timestamp {
            num: rng.random_range(1..1_000_000),
            writer: ClientId(rng.random_range(0..4)),
            seq: rng.random(),
        };
        let value_len = rng.random_range(0..64);
        let value: Vec<u8> = (0..value_len).map(|_| rng.random()).collect();
        let mut signature = [0u8; 64];
        rng.fill_bytes(&mut signature);
        let entry = Entry {
            ts,
            value: rng.random_bool(0.9).then(|| Bytes::from(value)),
            signature: Bytes::copy_from_slice(&signature),
        };
        let body = match &request.body {
            RequestBody::Get => ResponseBody::Value(Some(entry)),
            RequestBody::Clock => ResponseBody::ClockAck(Some(entry.signed_timestamp())),
            // Acknowledges without keeping anything.
            RequestBody::Store(entry) | RequestBody::WriteBack(entry) => {
                ResponseBody::StoreAck(entry.ts)
            }
        };
        Some(Response {
            op: request.op,
            epoch: request.epoch,
            body,
        })
    }

    fn corrupt(&mut self, body: &mut ResponseBody) {
        match body {
            ResponseBody::Value(Some(entry)) => corrupt_entry(entry, &mut self.rng),
            ResponseBody::ClockAck(Some(signed)) => corrupt_signed(signed, &mut self.rng),
            ResponseBody::StoreAck(ts) => ts.num = ts.num.wrapping_add(1),
            _ => {}
        }
    }
}

fn story_rng(seed: u64, key: &Key) -> ChaCha8Rng {
    let mut material = seed.to_be_bytes().to_vec();
    material.extend_from_slice(key.as_bytes());
    ChaCha8Rng::from_seed(Digest::of("bulwark phalanx collusion", &material).0)
}

fn flip(bytes: &Bytes, rng: &mut ChaCha8Rng) -> Bytes {
    let mut flipped = bytes.to_vec();
    if !flipped.is_empty() {
        let at = rng.random_range(0..flipped.len());
        flipped[at] ^= 1 << rng.random_range(0..8);
    }
    Bytes::from(flipped)
}

fn corrupt_entry(entry: &mut Entry, rng: &mut ChaCha8Rng) {
    match rng.random_range(0..4) {
        0 if entry.value.as_ref().is_some_and(|v| !v.is_empty()) => {
            entry.value = entry.value.as_ref().map(|v| flip(v, rng));
        }
        1 => entry.ts.num = entry.ts.num.wrapping_add(rng.random_range(1..10)),
        2 => entry.value = None,
        _ => entry.signature = flip(&entry.signature, rng),
    }
}

fn corrupt_signed(signed: &mut SignedTimestamp, rng: &mut ChaCha8Rng) {
    if rng.random_bool(0.5) {
        signed.ts.num = signed.ts.num.wrapping_add(rng.random_range(1..1_000));
    } else {
        signed.signature = flip(&signed.signature, rng);
    }
}

/// The simulator drives liars, like honest servers, through the one replica contract.
impl Replica for PhalanxLiar {
    const SERVICE: ServiceId = ServiceId::PHALANX;
    type Request = Request;
    type Reply = Response;
    type Message = Never;
    type Change = Change;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        _view: &(),
    ) -> Output<Self> {
        let (changes, reply) = self.handle(now, client, access.write, request);
        // A liar's refusal is a refusal as far as the counters go.
        let refused = reply
            .as_ref()
            .and_then(Response::refusal)
            .map(ToString::to_string);
        Output {
            changes,
            reply,
            refused,
            ..Output::none()
        }
    }

    fn stats(&self) -> ReplicaStats {
        Replica::stats(&self.real)
    }
}
