//! The catalogue of Byzantine configuration-service replicas on A2M-PBFT-EA: wrappers around a
//! real [`EaReplica<ConfigService>`] that bend what it sends, with its own trusted log.
//!
//! A faulty replica can sign anything as itself, but its trusted log attests one body per slot
//! and checks nothing else: it may ask for any attestation at any free slot. The lies:
//!
//! - [`Behaviour::Silent`]: from a seeded moment on (often the start), says nothing at all.
//! - [`Behaviour::EquivocatingPrimary`]: as primary, sends some backups another batch for the
//!   number it proposed (a shifted clock reading, or a request dropped), with the attestation of
//!   the genuine one, since its log refuses to attest a second (the wrapper asks, and counts the
//!   refusal); and its COMMITs for that batch likewise.
//! - [`Behaviour::ForgedViewChange`]: replaces its view changes with ones that report nothing
//!   above its checkpoint (no committed or prepared certificates, nothing disclosed), attested
//!   through its own log in place of the honest one, with the abandonment lookup such a report
//!   needs. Its log gives it that lookup only if it committed nothing above the checkpoint in
//!   the view it leaves; otherwise the lookup shows the commit and every correct replica
//!   refuses the view change (spec §7.2 T7).
//! - [`Behaviour::EarlyStop`]: submits STOP long before the epoch is due.
//! - [`Behaviour::SkewedClock`]: honest in every message, its clock a seeded 1.5 to 6 STOP
//!   tolerances off.

use super::Behaviour;
use bulwark_core::a2m::{self, Call, Outcome};
use bulwark_core::sign::Unverified;
use bulwark_core::{ClientId, Slot, Time, wire};
use bulwark_protocol::cs::{ConfigService, Op, Outcome as CsOutcome};
use bulwark_protocol::machine::{Access, Attest, Attested, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::pbft::ea::msg::{self as ea_msg, Placed};
use bulwark_protocol::pbft::ea::{self, Change, EaReplica, Message, Said, ViewChange};
use bulwark_protocol::pbft::{Answer, Batch, Phase, Submitted};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// Tokens the wrapper's own trusted-log calls carry: far above the honest replica's.
const OWN_TOKENS: u64 = 1 << 62;

/// What the wrapper's own calls were for.
enum Own {
    /// A second PRE-PREPARE asked of its log (refused: counted).
    SecondPreprepare,
    /// The lookups of a view change reporting nothing, then its attestation.
    Lookups(Box<ViewChange<Op>>),
    Attest(Bytes),
}

/// A configuration-service replica on A2M-PBFT-EA with `behaviour` wrapped around a real one.
pub struct EaLiar {
    behaviour: Behaviour,
    inner: EaReplica<ConfigService>,
    setup: ea::Setup<ConfigService>,
    rng: ChaCha8Rng,
    silent_from: u64,
    skew: i64,
    last_attack: Option<u64>,
    attack_every: u64,
    next_id: u64,
    own: BTreeMap<u64, Own>,
    next_token: u64,
    /// For each (view, number) it equivocates on: the backups that get the other batch, and it.
    splits: BTreeMap<(u64, u64), (Vec<Slot>, Batch<Op>)>,
    /// Second attestations its log refused it.
    pub refused_by_log: u64,
}

impl EaLiar {
    /// The behaviours this catalogue has.
    pub const BEHAVIOURS: [Behaviour; 5] = [
        Behaviour::Silent,
        Behaviour::EquivocatingPrimary,
        Behaviour::ForgedViewChange,
        Behaviour::EarlyStop,
        Behaviour::SkewedClock,
    ];

    /// `replica` (fresh or restored) lying as `behaviour`, its choices seeded by `seed`.
    pub fn new(
        behaviour: Behaviour,
        replica: EaReplica<ConfigService>,
        setup: ea::Setup<ConfigService>,
        seed: u64,
    ) -> EaLiar {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xea5e_0b12_a47c_0002);
        let silent_from = if rng.random_bool(0.4) {
            0
        } else {
            rng.random_range(0..10_000)
        };
        let attack_every = rng.random_range(300..2_000);
        let skew = if behaviour == Behaviour::SkewedClock {
            let tolerance = setup.app.config().stop_delta_ms as i64;
            let off = rng.random_range(tolerance * 3 / 2..=tolerance * 6);
            if rng.random_bool(0.5) { off } else { -off }
        } else {
            0
        };
        EaLiar {
            behaviour,
            inner: replica,
            setup,
            rng,
            silent_from,
            skew,
            last_attack: None,
            attack_every,
            next_id: 1 << 40,
            own: BTreeMap::new(),
            next_token: OWN_TOKENS,
            splits: BTreeMap::new(),
            refused_by_log: 0,
        }
    }

    /// The honest replica underneath.
    pub fn replica(&self) -> &EaReplica<ConfigService> {
        &self.inner
    }

    fn clock(&self, now: Time) -> Time {
        Time(now.0.saturating_add_signed(self.skew))
    }

    fn peers(&self) -> impl Iterator<Item = Slot> + use<> {
        let me = self.setup.me;
        (0..self.setup.params.n as u32)
            .map(Slot)
            .filter(move |slot| *slot != me)
    }

    fn own_call(&mut self, calls: Vec<Call>, what: Own, out: &mut Output<Self>) {
        self.next_token += 1;
        let token = self.next_token;
        self.own.insert(token, what);
        out.attest.push(Attest { token, calls });
    }

    fn bend(&mut self, now: Time, mut out: Output<Self>) -> Output<Self> {
        match self.behaviour {
            Behaviour::Silent if now.0 >= self.silent_from => Output::none(),
            Behaviour::EquivocatingPrimary => {
                self.equivocate(&mut out);
                out
            }
            Behaviour::ForgedViewChange => {
                self.hide_view_changes(&mut out);
                out
            }
            _ => out,
        }
    }

    /// Sends some backups another batch for each number it proposes, and its COMMITs for that
    /// batch, under the genuine attestations; the same backups for one number throughout.
    fn equivocate(&mut self, out: &mut Output<Self>) {
        let mut extra = Vec::new();
        let peers: Vec<Slot> = self.peers().collect();
        for (to, message) in &mut out.sends {
            match message {
                Message::PrePrepare(pre) => {
                    let (attested, batch) = &**pre;
                    let Some(vote) = attested.peek() else {
                        continue;
                    };
                    let key = (vote.view, vote.seq);
                    if !self.splits.contains_key(&key) {
                        let mut other: Batch<Op> = batch.clone();
                        if other.requests.len() > 1 && self.rng.random_bool(0.5) {
                            other.requests.pop();
                        } else {
                            other.nondet = other.nondet.wrapping_add(1);
                        }
                        let split: Vec<Slot> = peers
                            .iter()
                            .copied()
                            .filter(|_| self.rng.random_bool(0.5))
                            .collect();
                        self.splits.insert(key, (split, other));
                    }
                    let (split, other) = &self.splits[&key];
                    if !split.contains(to) {
                        continue;
                    }
                    let mut forged = vote.clone();
                    forged.digest = other.digest();
                    let body = Bytes::from(wire::encode(&forged));
                    // Its log will not attest it; ask anyway, once per number.
                    let (log, seq) = forged.place(&self.setup.logs);
                    extra.push((log, seq, body.clone()));
                    *message = Message::PrePrepare(Box::new((
                        ea_msg::Attested::new(body, attested.attestation.clone()),
                        other.clone(),
                    )));
                }
                Message::Vote(attested) => {
                    let Some(mut vote) = attested.peek() else {
                        continue;
                    };
                    let Some((split, other)) = self.splits.get(&(vote.view, vote.seq)) else {
                        continue;
                    };
                    if vote.phase != Phase::Commit || !split.contains(to) {
                        continue;
                    }
                    vote.digest = other.digest();
                    let body = Bytes::from(wire::encode(&vote));
                    *message =
                        Message::Vote(ea_msg::Attested::new(body, attested.attestation.clone()));
                }
                _ => {}
            }
        }
        extra.sort_by_key(|(_, seq, _)| *seq);
        extra.dedup_by_key(|(_, seq, _)| *seq);
        for (log, seq, body) in extra {
            let call = Call::AdvanceAttest {
                log,
                seq,
                digest: [0; 32],
                value: ea_msg::body_hash(&body),
                nonce: a2m::nonce_of(seq),
            };
            self.own_call(vec![call], Own::SecondPreprepare, out);
        }
        if self.splits.len() > 64 {
            self.splits.pop_first();
        }
    }

    /// Replaces its honest view change, before its log attests it, with one that reports
    /// nothing above the checkpoint.
    fn hide_view_changes(&mut self, out: &mut Output<Self>) {
        let honest: Vec<ViewChange<Op>> = out
            .changes
            .iter()
            .filter_map(|change| match change {
                Change::Said(said) => match &**said {
                    Said::ViewChange(body) => {
                        wire::decode(body, <ViewChange<Op> as Placed>::BYTES_MAX).ok()
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        for change in honest {
            let (log, slot) = change.place(&self.setup.logs);
            // The honest attestation is never asked for.
            out.attest.retain(|attest| {
                !attest.calls.iter().any(|call| {
                    matches!(call, Call::AdvanceAttest { log: l, seq, .. } if *l == log && *seq == slot)
                })
            });
            let Ok(z) = ea_msg::wants_nonce(
                &self.setup.params,
                &self.setup.keys,
                &self.setup.instance,
                change.to,
                &change.wants,
            ) else {
                continue;
            };
            let stable = change.stable.seq;
            let mut hidden = change.clone();
            hidden.committed.clear();
            hidden.prepared.clear();
            hidden.disclosed.clear();
            hidden.top = stable;
            let calls = (change.from..change.to)
                .map(|view| Call::Lookup {
                    log: self.setup.logs.commit,
                    seq: self.setup.logs.slot(view, stable + 1),
                    nonce: z,
                })
                .collect();
            self.own_call(calls, Own::Lookups(Box::new(hidden)), out);
        }
    }

    fn on_own(&mut self, token: u64, answers: Attested, out: &mut Output<Self>) {
        let Some(what) = self.own.remove(&token) else {
            return;
        };
        let attestations: Vec<Unverified<a2m::Attestation>> = answers
            .iter()
            .filter_map(|answer| match answer {
                Ok(Outcome::Attested(signed)) => Some(signed.to_unverified()),
                _ => None,
            })
            .collect();
        match what {
            Own::SecondPreprepare => {
                if answers.iter().any(Result::is_err) {
                    self.refused_by_log += 1;
                }
            }
            Own::Lookups(mut hidden) => {
                hidden.abandoned = attestations;
                let body = Bytes::from(wire::encode(&*hidden));
                let (log, seq) = hidden.place(&self.setup.logs);
                let call = Call::AdvanceAttest {
                    log,
                    seq,
                    digest: [0; 32],
                    value: ea_msg::body_hash(&body),
                    nonce: a2m::nonce_of(seq),
                };
                self.own_call(vec![call], Own::Attest(body), out);
            }
            Own::Attest(body) => {
                if let Some(attestation) = attestations.into_iter().next() {
                    let message =
                        Message::ViewChange(Box::new(ea_msg::Attested::new(body, attestation)));
                    for slot in self.peers() {
                        out.sends.push((slot, message.clone()));
                    }
                }
            }
        }
    }

    fn attack(&mut self, now: Time, out: &mut Output<Self>) {
        if self.behaviour != Behaviour::EarlyStop {
            return;
        }
        let due = self
            .last_attack
            .is_none_or(|last| now.0 >= last.saturating_add(self.attack_every));
        if !due {
            return;
        }
        self.last_attack = Some(now.0);
        self.next_id += 1;
        let message = Message::Request(Submitted {
            id: self.next_id,
            op: Op::Stop,
        });
        for slot in self.peers() {
            out.sends.push((slot, message.clone()));
        }
    }
}

/// The honest replica's output as the wrapper's (the same types).
fn convert(out: Output<EaReplica<ConfigService>>) -> Output<EaLiar> {
    out.retyped()
}

impl Replica for EaLiar {
    const SERVICE: bulwark_core::ServiceId = <EaReplica<ConfigService> as Replica>::SERVICE;
    type Request = Submitted<Op>;
    type Reply = Answer<CsOutcome>;
    type Message = Message<ConfigService>;
    type Change = Change<ConfigService>;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Submitted<Op>,
        view: &(),
    ) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_request(now, client, access, request, view));
        self.bend(now, out)
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: Message<ConfigService>,
        view: &(),
    ) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_message(now, from, message, view));
        self.bend(now, out)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &()) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_timer(now, timer, view));
        self.bend(now, out)
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, view: &()) -> Output<Self> {
        let now = self.clock(now);
        if token > OWN_TOKENS {
            let mut out = Output::none();
            self.on_own(token, answers, &mut out);
            return out;
        }
        let out = convert(self.inner.on_attested(now, token, answers, view));
        self.bend(now, out)
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let now = self.clock(now);
        let out = convert(self.inner.on_tick(now));
        let mut out = self.bend(now, out);
        if self.behaviour.is_byzantine() && self.behaviour != Behaviour::Silent {
            self.attack(now, &mut out);
        }
        out
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}
