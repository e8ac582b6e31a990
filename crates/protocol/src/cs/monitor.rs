//! Monitoring (Rosebud §3.3): each CS replica pings every member at a constant rate and keeps its
//! own record of who answered, so that it can both propose an eviction and judge others'
//! proposals.
//!
//! - Every `cycle_ms` each member gets one ping; one in `signed_every` asks for a signature over
//!   `(epoch, node, nonce)`, which only the member's key can give. A ping unanswered within
//!   `timeout_ms` (or answered with a bad signature) is a miss.
//! - Escalation: once a member misses a ping that asked for a signature, every later ping to it
//!   asks for one until a correctly signed answer arrives, so answers spoofed for a dead node
//!   cannot keep it in the system.
//! - After `n_evict` misses in a row the member is *suspected* and this replica proposes its
//!   eviction. A replica agrees to evict a member whose last `n_accept` pings it sent were missed
//!   (or that it suspects), with `n_accept < n_evict` so that most proposals succeed although
//!   replicas see slightly different histories. A suspected member is cleared only after
//!   `n_accept` answered pings in a row.
//!
//! Sans-IO like everything here: time comes in, nonces come from the caller's randomness, pings
//! go out as values.

use bulwark_core::configuration::Configuration;
use bulwark_core::sign::{Context, PublicKey, SecretKey, Signable, Signature};
use bulwark_core::{Epoch, NodeId, Time, wire};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a CS replica monitors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonitorParams {
    /// Each member is pinged once per cycle.
    pub cycle_ms: u64,
    /// An answer later than this is a miss.
    pub timeout_ms: u64,
    /// Misses in a row before this replica proposes an eviction.
    pub n_evict: u32,
    /// Misses in a row (of this replica's own pings) before it agrees to one; also the answers
    /// in a row that clear a suspect.
    pub n_accept: u32,
    /// One ping in this many asks for a signature (Rosebud's experiment: 1 in 20).
    pub signed_every: u32,
}

impl MonitorParams {
    /// Checks `n_accept < n_evict` and positive sizes.
    pub fn validate(&self) -> Result<(), String> {
        if self.n_accept == 0 || self.n_accept >= self.n_evict {
            return Err(format!(
                "agreeing after {} misses must take fewer than proposing after {}",
                self.n_accept, self.n_evict
            ));
        }
        if self.cycle_ms == 0 || self.timeout_ms == 0 || self.signed_every == 0 {
            return Err("monitoring needs a positive cycle, timeout and signing rate".into());
        }
        Ok(())
    }
}

/// A ping from a CS replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    /// The epoch of the pinging CS.
    pub epoch: Epoch,
    /// Echoed by the answer.
    pub nonce: u64,
    /// The answer must carry the member's signature.
    pub signed: bool,
}

/// A member's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// The ping's nonce.
    pub nonce: u64,
    /// The member's signature over [`Alive`], when asked.
    pub signature: Option<Signature>,
}

/// What a signed answer states: `node` was alive for `nonce` in `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alive {
    /// The epoch.
    pub epoch: Epoch,
    /// The member answering.
    pub node: NodeId,
    /// The ping's nonce.
    pub nonce: u64,
}

impl Signable for Alive {
    const CONTEXT: Context = Context::new("bulwark.cs.alive.v1");
    const BYTES_MAX: usize = 32;
}

impl Pong {
    /// `node`'s answer to `ping`, signed with `secret` when the ping asks.
    pub fn answer(ping: &Ping, node: NodeId, secret: &SecretKey) -> Pong {
        let signature = ping.signed.then(|| {
            let alive = Alive {
                epoch: ping.epoch,
                node,
                nonce: ping.nonce,
            };
            secret.sign(Alive::CONTEXT, &wire::encode(&alive))
        });
        Pong {
            nonce: ping.nonce,
            signature,
        }
    }
}

#[derive(Clone, Debug)]
struct Target {
    key: PublicKey,
    /// The ping in flight: nonce, when sent, whether it asked for a signature.
    outstanding: Option<(u64, Time, bool)>,
    last_sent: Option<Time>,
    misses: u32,
    answers: u32,
    suspected: bool,
    must_sign: bool,
    sent: u64,
}

/// One CS replica's liveness database.
#[derive(Clone, Debug)]
pub struct Monitor {
    epoch: Epoch,
    params: MonitorParams,
    targets: BTreeMap<NodeId, Target>,
}

impl Monitor {
    /// Monitors every member of `config` but `me`.
    pub fn new(config: &Configuration, me: NodeId, params: MonitorParams) -> Monitor {
        let targets = config
            .members
            .iter()
            .filter(|member| member.id != me)
            .map(|member| {
                (
                    member.id,
                    Target {
                        key: member.signing_key,
                        outstanding: None,
                        last_sent: None,
                        misses: 0,
                        answers: 0,
                        suspected: false,
                        must_sign: false,
                        sent: 0,
                    },
                )
            })
            .collect();
        Monitor {
            epoch: config.epoch,
            params,
            targets,
        }
    }

    /// Expires late pings, then the pings due at `now`, each with a nonce from `fresh`. The
    /// first ping to each member goes out at a point of the cycle set by its position, so the
    /// pings of one cycle are spread over it rather than sent in a burst.
    pub fn tick(&mut self, now: Time, fresh: &mut dyn FnMut() -> u64) -> Vec<(NodeId, Ping)> {
        let count = self.targets.len().max(1) as u64;
        let mut pings = Vec::new();
        for (index, (node, target)) in self.targets.iter_mut().enumerate() {
            if let Some((_, sent, signed)) = target.outstanding
                && now.0 >= sent.0.saturating_add(self.params.timeout_ms)
            {
                target.outstanding = None;
                miss(target, signed, &self.params);
            }
            if target.outstanding.is_some() {
                continue;
            }
            let due = match target.last_sent {
                Some(last) => last.0.saturating_add(self.params.cycle_ms),
                None => self.params.cycle_ms * index as u64 / count,
            };
            if now.0 < due && target.last_sent.is_some() {
                continue;
            }
            let signed = target.must_sign || target.sent % u64::from(self.params.signed_every) == 0;
            let nonce = fresh();
            target.outstanding = Some((nonce, now, signed));
            target.last_sent = Some(now);
            target.sent += 1;
            pings.push((
                *node,
                Ping {
                    epoch: self.epoch,
                    nonce,
                    signed,
                },
            ));
        }
        pings
    }

    /// An answer from `from`. A wrong nonce or an answer never asked for is ignored; a signed
    /// ping answered without a good signature is a miss (it may be spoofed).
    pub fn on_pong(&mut self, from: NodeId, pong: Pong) -> Result<(), String> {
        let epoch = self.epoch;
        let Some(target) = self.targets.get_mut(&from) else {
            return Err(format!("{from} is not monitored"));
        };
        let Some((nonce, _, signed)) = target.outstanding else {
            return Err(format!("an answer from {from} to no ping"));
        };
        if pong.nonce != nonce {
            return Err(format!("an answer from {from} to another ping"));
        }
        target.outstanding = None;
        if signed {
            let alive = Alive {
                epoch,
                node: from,
                nonce,
            };
            let good = pong.signature.is_some_and(|signature| {
                target
                    .key
                    .verify(Alive::CONTEXT, &wire::encode(&alive), &signature)
                    .is_ok()
            });
            if !good {
                miss(target, true, &self.params);
                return Err(format!(
                    "{from} answered a signed ping without its signature"
                ));
            }
            target.must_sign = false;
        }
        target.misses = 0;
        target.answers = target.answers.saturating_add(1);
        if target.answers >= self.params.n_accept {
            target.suspected = false;
        }
        Ok(())
    }

    /// Members this replica should propose to evict.
    pub fn suspects(&self) -> Vec<NodeId> {
        self.targets
            .iter()
            .filter(|(_, target)| target.suspected)
            .map(|(node, _)| *node)
            .collect()
    }

    /// Whether this replica agrees that `node` be evicted.
    pub fn agrees(&self, node: NodeId) -> bool {
        self.targets
            .get(&node)
            .is_some_and(|target| target.suspected || target.misses >= self.params.n_accept)
    }

    /// Why this replica does not agree that `node` be evicted, or `None` if it agrees: for an
    /// operator asking by hand (`bulwark node evict`), who needs to know what the CS saw.
    pub fn disagreement(&self, node: NodeId) -> Option<String> {
        if self.agrees(node) {
            return None;
        }
        let Some(target) = self.targets.get(&node) else {
            return Some(format!("{node} is not a member it monitors"));
        };
        Some(format!(
            "{node} missed {} ping(s) in a row ({} needed) and answered {} since",
            target.misses, self.params.n_accept, target.answers
        ))
    }

    /// Takes over what `previous`, this replica's monitor of an earlier epoch, saw of the members
    /// both watch: a member silent across an epoch boundary is as silent as one silent within an
    /// epoch, and epochs shorter than `n_evict` ping cycles must not shield it. A ping still in
    /// flight stays with the old epoch (an answer is signed for the epoch it was asked in); the
    /// next miss or answer needs a ping of this one.
    pub fn carry(&mut self, previous: &Monitor) {
        debug_assert!(previous.epoch <= self.epoch, "carried forward, never back");
        for (node, target) in &mut self.targets {
            if let Some(old) = previous.targets.get(node) {
                target.misses = old.misses;
                target.answers = old.answers;
                target.suspected = old.suspected;
                target.must_sign = old.must_sign;
                target.sent = old.sent;
            }
        }
    }

    /// Whether the next ping to `node` will ask for a signature.
    pub fn must_sign(&self, node: NodeId) -> bool {
        self.targets
            .get(&node)
            .is_some_and(|target| target.must_sign)
    }
}

fn miss(target: &mut Target, signed: bool, params: &MonitorParams) {
    target.answers = 0;
    target.misses = target.misses.saturating_add(1);
    if signed {
        target.must_sign = true;
    }
    if target.misses >= params.n_evict {
        target.suspected = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::config::Fingerprint;
    use bulwark_core::membership::Member;

    fn secret(i: u32) -> SecretKey {
        SecretKey::from_seed(&[i as u8 + 1; 32])
    }

    fn config() -> Configuration {
        let members = (0..5)
            .map(|i| Member {
                trusted_key: None,
                id: NodeId(i),
                address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                fingerprint: Fingerprint([i as u8; 32]),
                signing_key: secret(i).public_key(),
            })
            .collect();
        Configuration::genesis(members, 1, 1, secret(99).public_key(), 60_000, 1_000, 0).unwrap()
    }

    fn params() -> MonitorParams {
        MonitorParams {
            cycle_ms: 100,
            timeout_ms: 50,
            n_evict: 3,
            n_accept: 2,
            signed_every: 4,
        }
    }

    /// Runs `cycles` cycles of 100 ms in steps of 10 ms; `answer(node, ping)` gives the answer.
    fn run(
        monitor: &mut Monitor,
        cycles: u64,
        mut answer: impl FnMut(NodeId, &Ping) -> Option<Pong>,
    ) {
        let mut nonce = 0;
        for step in 0..cycles * 10 {
            let pings = monitor.tick(Time(step * 10), &mut || {
                nonce += 1;
                nonce
            });
            for (node, ping) in pings {
                if let Some(pong) = answer(node, &ping) {
                    let _ = monitor.on_pong(node, pong);
                }
            }
        }
    }

    #[test]
    fn misconfigured_thresholds_are_refused() {
        assert!(params().validate().is_ok());
        let mut equal = params();
        equal.n_accept = equal.n_evict;
        assert!(equal.validate().is_err(), "n_accept must be below n_evict");
    }

    #[test]
    fn a_silent_member_is_suspected_after_n_evict_misses_and_cleared_after_n_accept_answers() {
        let mut monitor = Monitor::new(&config(), NodeId(0), params());
        let mut silent = true;
        let mut misses_seen = 0;
        let mut nonce = 0u64;
        let mut fresh = || {
            nonce += 1;
            nonce
        };
        for step in 0..100u64 {
            let now = Time(step * 10);
            for (node, ping) in monitor.tick(now, &mut fresh) {
                if node == NodeId(3) && silent {
                    continue;
                }
                monitor
                    .on_pong(node, Pong::answer(&ping, node, &secret(node.0)))
                    .unwrap();
            }
            if monitor.agrees(NodeId(3)) && misses_seen == 0 {
                misses_seen = step;
                assert!(
                    monitor.suspects().is_empty(),
                    "agreeing comes before proposing"
                );
            }
            if step == 60 {
                assert_eq!(monitor.suspects(), vec![NodeId(3)]);
                assert!(monitor.agrees(NodeId(3)));
                assert!(
                    monitor.must_sign(NodeId(3)),
                    "a missed signed ping escalates"
                );
                silent = false;
            }
        }
        assert!(misses_seen > 0);
        assert!(
            monitor.suspects().is_empty(),
            "cleared after answering again"
        );
        assert!(!monitor.agrees(NodeId(3)));
        assert!(!monitor.agrees(NodeId(1)), "a member that always answered");
    }

    #[test]
    fn misses_carry_across_an_epoch_so_short_epochs_do_not_shield_a_silent_member() {
        // Ticks every 10 ms from `from` for at most `cycles` cycles, node 3 silent, until `done`;
        // returns the time reached.
        let mut nonce = 0;
        let mut step =
            |monitor: &mut Monitor, from: u64, cycles: u64, done: &dyn Fn(&Monitor) -> bool| {
                let mut now = from;
                while now < from + cycles * 100 && !done(monitor) {
                    let pings = monitor.tick(Time(now), &mut || {
                        nonce += 1;
                        nonce
                    });
                    for (node, ping) in pings {
                        if node != NodeId(3) {
                            monitor
                                .on_pong(node, Pong::answer(&ping, node, &secret(node.0)))
                                .unwrap();
                        }
                    }
                    now += 10;
                }
                now
            };
        let missed_enough_to_agree = |m: &Monitor| m.agrees(NodeId(3));
        let suspected = |m: &Monitor| !m.suspects().is_empty();
        // One epoch: silent long enough to be agreed on, not yet to be proposed.
        let mut before = Monitor::new(&config(), NodeId(0), params());
        let switched = step(&mut before, 0, 10, &missed_enough_to_agree);
        assert!(before.agrees(NodeId(3)) && before.suspects().is_empty());

        // The next epoch's monitor carries that: one more miss proposes the eviction.
        let mut carried = Monitor::new(&config(), NodeId(0), params());
        carried.carry(&before);
        let proposed = step(&mut carried, switched, 10, &suspected);
        assert_eq!(carried.suspects(), vec![NodeId(3)]);

        // Starting afresh, the same time is not enough: each epoch would start from nothing.
        let mut fresh = Monitor::new(&config(), NodeId(0), params());
        step(
            &mut fresh,
            switched,
            (proposed - switched).div_ceil(100),
            &suspected,
        );
        assert!(
            fresh.suspects().is_empty(),
            "a fresh monitor needs n_evict misses of its own"
        );
        assert!(
            !carried.agrees(NodeId(1)),
            "members that answered stay clear"
        );
    }

    #[test]
    fn spoofed_answers_for_a_dead_member_are_defeated_by_signed_pings() {
        // Someone answers for node 4 with the right nonce but cannot sign for it.
        let mut monitor = Monitor::new(&config(), NodeId(0), params());
        run(&mut monitor, 30, |node, ping| {
            if node == NodeId(4) {
                Some(Pong {
                    nonce: ping.nonce,
                    signature: ping
                        .signed
                        .then(|| secret(7).sign(Alive::CONTEXT, b"forged")),
                })
            } else {
                Some(Pong::answer(ping, node, &secret(node.0)))
            }
        });
        assert_eq!(
            monitor.suspects(),
            vec![NodeId(4)],
            "every ping asks for a signature after the first miss"
        );
        assert!(monitor.must_sign(NodeId(4)));
        // A signature over another epoch's ping does not count either.
        let mut monitor = Monitor::new(&config(), NodeId(0), params());
        run(&mut monitor, 30, |node, ping| {
            let mut replayed = *ping;
            if node == NodeId(4) {
                replayed.epoch = Epoch(ping.epoch.0 + 1);
            }
            Some(Pong::answer(&replayed, node, &secret(node.0)))
        });
        assert_eq!(monitor.suspects(), vec![NodeId(4)]);
    }

    #[test]
    fn an_answer_to_another_ping_is_ignored() {
        let mut monitor = Monitor::new(&config(), NodeId(0), params());
        let mut nonce = 10;
        let pings = monitor.tick(Time(1_000), &mut || {
            nonce += 1;
            nonce
        });
        let (node, ping) = pings[0];
        let wrong = Pong {
            nonce: ping.nonce + 1000,
            signature: None,
        };
        assert!(monitor.on_pong(node, wrong).is_err());
        assert!(
            monitor.on_pong(NodeId(0), wrong).is_err(),
            "itself is not monitored"
        );
        assert!(
            monitor
                .on_pong(node, Pong::answer(&ping, node, &secret(node.0)))
                .is_ok()
        );
        assert!(
            monitor
                .on_pong(node, Pong::answer(&ping, node, &secret(node.0)))
                .is_err(),
            "answered once"
        );
    }
}
