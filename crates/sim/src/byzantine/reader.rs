//! Byzantine readers (spec §5.2, §7.2 "Byzantine readers"): clients with read access that write
//! back fabricated, replayed or damaged candidates.
//!
//! A reader holds no keys, so everything it sends is built from what it has collected plus random
//! bytes. The attacks, and what a correct system must make of them:
//! - a genuine candidate written back to a few servers: legal, it may finish a crashed writer's
//!   write (that write is then linearized);
//! - a replay of an older genuine candidate, for this key or another: no rollback, no cross-key
//!   effect (every MAC binds the key);
//! - random garbage, far-future timestamps: never reaches any correct `lc`;
//! - a genuine `(num, pid)` with a bad tag (§4.8(b)): never adopted;
//! - "BigMac", a genuine `(ts, N)` with a corrupted MAC vector: valid at some servers only, forcing
//!   the next correct read to REPAIR;
//! - oversized candidate lists: refused.
//!
//! This module only makes up messages; the simulator decides when and to whom they go.

use super::{corrupt_vec, flip_byte, flip_tag, forged_timestamp, random_nonce, random_vec};
use bulwark_core::Key;
use bulwark_protocol::powerstore::{Candidate, RequestBody};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Genuine candidates remembered per attacker; old ones are forgotten first.
const SEEN_CANDIDATES_MAX: usize = 64;

/// What an attacking reader does next.
#[derive(Clone, Debug)]
pub enum Attack {
    /// COLLECT from every server, to learn genuine candidates worth replaying.
    Collect,
    /// A request body to send to a subset of servers.
    Send(RequestBody),
}

/// One kind of made-up candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fabrication {
    /// The newest genuine candidate seen for the key, unchanged.
    Genuine,
    /// An older genuine candidate of the key.
    Replay,
    /// A genuine candidate of another key.
    CrossKey,
    /// Random bytes everywhere, sometimes with the wrong MAC-vector length.
    Garbage,
    /// A genuine `(num, pid)`, nonce and vector with a made-up tag (§4.8(b)).
    BadTag,
    /// A genuine `(ts, N)` with some MAC slots corrupted.
    BigMac,
    /// A genuine candidate with `num` bumped: its tag no longer verifies.
    Bumped,
}

/// Makes up a Byzantine reader's requests from what it has seen.
pub struct ReaderAttacker {
    rng: ChaCha8Rng,
    n: usize,
    /// Genuine (or at least collected) candidates, oldest first.
    seen: Vec<(Key, Candidate)>,
}

impl ReaderAttacker {
    /// An attacker for a group of `n` servers.
    pub fn new(n: usize, seed: u64) -> ReaderAttacker {
        ReaderAttacker {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0fba_d4ea_d5ed),
            n,
            seen: Vec::new(),
        }
    }

    /// Remembers a candidate a server offered in COLLECT.
    pub fn observe(&mut self, key: &Key, candidate: Candidate) {
        if self.seen.iter().any(|(k, c)| k == key && *c == candidate) {
            return;
        }
        if self.seen.len() >= SEEN_CANDIDATES_MAX {
            self.seen.remove(0);
        }
        self.seen.push((key.clone(), candidate));
    }

    /// The next attack on `key`.
    pub fn next_attack(&mut self, key: &Key) -> Attack {
        let roll = self.rng.random_range(0..10);
        if roll < 2 || self.seen.is_empty() && roll < 5 {
            return Attack::Collect;
        }
        if roll < 8 {
            let count = if self.rng.random_bool(0.05) {
                // More than a correct reader ever sends: servers must refuse it.
                self.n + 1 + self.rng.random_range(0..self.n)
            } else {
                self.rng.random_range(1..=self.n)
            };
            let candidates = (0..count).map(|_| self.fabricate(key).1).collect();
            return Attack::Send(RequestBody::Filter { candidates });
        }
        let (_, candidate) = self.fabricate(key);
        Attack::Send(RequestBody::Repair { candidate })
    }

    /// One made-up candidate for `key`, and how it was made.
    pub fn fabricate(&mut self, key: &Key) -> (Fabrication, Candidate) {
        let own: Vec<&Candidate> = self
            .seen
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, c)| c)
            .collect();
        let newest = own
            .iter()
            .max_by(|a, b| a.ts.cmp_order(&b.ts))
            .map(|c| (*c).clone());
        let kind = match self.rng.random_range(0..7) {
            0 => Fabrication::Genuine,
            1 => Fabrication::Replay,
            2 => Fabrication::CrossKey,
            3 => Fabrication::Garbage,
            4 => Fabrication::BadTag,
            5 => Fabrication::BigMac,
            _ => Fabrication::Bumped,
        };
        let pick_own = |rng: &mut ChaCha8Rng| -> Option<Candidate> {
            if own.is_empty() {
                None
            } else {
                Some(own[rng.random_range(0..own.len())].clone())
            }
        };
        let base = match kind {
            Fabrication::Genuine | Fabrication::BigMac | Fabrication::BadTag => newest,
            Fabrication::Replay | Fabrication::Bumped => pick_own(&mut self.rng),
            Fabrication::CrossKey => {
                let other: Vec<&Candidate> = self
                    .seen
                    .iter()
                    .filter(|(k, _)| k != key)
                    .map(|(_, c)| c)
                    .collect();
                (!other.is_empty()).then(|| other[self.rng.random_range(0..other.len())].clone())
            }
            Fabrication::Garbage => None,
        };
        let Some(mut candidate) = base else {
            return (Fabrication::Garbage, self.garbage());
        };
        match kind {
            Fabrication::BadTag => flip_tag(&mut candidate.ts.tag, &mut self.rng),
            Fabrication::BigMac => corrupt_vec(&mut candidate.vec, &mut self.rng),
            Fabrication::Bumped => {
                candidate.ts.num = candidate.ts.num.saturating_add(self.rng.random_range(1..3))
            }
            Fabrication::Genuine
            | Fabrication::Replay
            | Fabrication::CrossKey
            | Fabrication::Garbage => {}
        }
        (kind, candidate)
    }

    fn garbage(&mut self) -> Candidate {
        let above = if self.rng.random_bool(0.5) {
            0
        } else {
            1 << 40
        };
        let length = if self.rng.random_bool(0.1) {
            self.rng.random_range(0..2 * self.n)
        } else {
            self.n
        };
        let mut candidate = Candidate {
            ts: forged_timestamp(&mut self.rng, above),
            nonce: random_nonce(&mut self.rng),
            vec: random_vec(&mut self.rng, length),
        };
        if self.rng.random_bool(0.1) {
            flip_byte(&mut candidate.nonce.0, &mut self.rng);
        }
        candidate
    }
}
