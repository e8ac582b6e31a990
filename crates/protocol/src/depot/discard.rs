//! Discard by unanimous consent (Depot §6.6): the clients of a volume agree to drop the values of
//! old versions, and a node drops one only when every client agreed, so one correct client is
//! enough to keep whatever the backup ladder needs.
//!
//! A proposal and a consent are ordinary signed updates to the client's own discard key
//! ([`super::update::discard_key`]), so they are ordered, passed on and proven like any write.
//! Once a day the client whose turn it is proposes the versions its [`Ladder`] does not keep; every
//! other client consents only when it holds every listed update and its own ladder, at its own
//! time, keeps none of them. Update clocks count and do not tell time, so a version's life is
//! bounded from outside ([`super::log::Log::life`]): it began no later than its writer's last
//! beacon before it says, and ended no earlier than the node accepted the first update of its key
//! covering it. Both bounds err towards a longer life, so a node that learned late or restarted
//! keeps more, which can delay a discard and never hasten one.

use super::update::{UpdateId, VolumeConfig, Writer};
use serde::{Deserialize, Serialize};

/// The most versions one proposal lists: its value stays well under a causal volume's value bound.
pub const PROPOSAL_IDS_MAX: usize = 16_384;

/// One day, in the microseconds of update clocks.
pub const DAY_MICROS: u64 = 86_400_000_000;

/// The largest value of a discard-key update a node fetches: a full proposal.
pub const DISCARD_VALUE_BYTES_MAX: usize = PROPOSAL_IDS_MAX * 40 + 64;

/// What a client writes to its discard key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Discard {
    /// These versions' values may go (sorted, without repeats, at most [`PROPOSAL_IDS_MAX`]),
    /// proposed in this proposer's turn ([`Ladder::turn`]).
    Propose {
        /// The turn it was proposed in: one proposal per turn.
        turn: u64,
        /// The versions.
        ids: Vec<UpdateId>,
    },
    /// The writer agrees to the proposal this update names.
    Consent(UpdateId),
}

impl Discard {
    /// The value to write.
    pub fn encode(&self) -> Vec<u8> {
        bulwark_core::wire::encode(self)
    }

    /// A value read from a discard key; `None` when it is not one a correct client writes.
    pub fn decode(bytes: &[u8]) -> Option<Discard> {
        let discard: Discard = bulwark_core::wire::decode(bytes, DISCARD_VALUE_BYTES_MAX).ok()?;
        match &discard {
            Discard::Propose { ids, .. }
                if ids.is_empty()
                    || ids.len() > PROPOSAL_IDS_MAX
                    || ids.windows(2).any(|pair| pair[0] >= pair[1]) =>
            {
                None
            }
            _ => Some(discard),
        }
    }
}

/// The backup ladder: every version alive within `keep_all_micros` of now, and every version alive
/// at a boundary of one of the rungs (a multiple of its period within its span of now).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ladder {
    /// Every version alive this recently is kept.
    pub keep_all_micros: u64,
    /// `(period, span)`: a version alive at a multiple of `period` no older than `span` is kept.
    pub rungs: Vec<(u64, u64)>,
    /// How long a proposer's turn lasts: one proposal per client per turn.
    pub turn_micros: u64,
}

impl Default for Ladder {
    fn default() -> Self {
        Ladder::paper()
    }
}

impl Ladder {
    /// The paper's: every version for a day, daily versions for a week, weekly versions for a
    /// month, monthly (30-day) versions for a year.
    pub fn paper() -> Ladder {
        Ladder {
            keep_all_micros: DAY_MICROS,
            rungs: vec![
                (DAY_MICROS, 7 * DAY_MICROS),
                (7 * DAY_MICROS, 30 * DAY_MICROS),
                (30 * DAY_MICROS, 365 * DAY_MICROS),
            ],
            turn_micros: DAY_MICROS,
        }
    }

    /// Whether a version alive from `born` to `ended` (`None`: still current) is kept at `now`,
    /// all in one node's microseconds.
    pub fn keeps(&self, born: u64, ended: Option<u64>, now: u64) -> bool {
        let Some(ended) = ended else {
            return true;
        };
        if ended.saturating_add(self.keep_all_micros) > now {
            return true;
        }
        self.rungs.iter().any(|&(period, span)| {
            // The latest boundary before its end: if any boundary of its life is within the
            // span, this one is.
            let Some(last) = (ended.saturating_sub(1)).checked_div(period) else {
                return false;
            };
            let last = last * period;
            last >= born && last.saturating_add(span) >= now
        })
    }

    /// Whose turn it is to propose at `now`: the volume's clients in writer order, one turn each.
    pub fn proposer(&self, config: &VolumeConfig, now: u64) -> Option<Writer> {
        let clients: Vec<Writer> = (0..config.members.len() as u32)
            .map(Writer)
            .filter(|w| {
                config
                    .member(*w)
                    .is_some_and(|m| m.role == super::update::Role::Client)
            })
            .collect();
        if clients.is_empty() || self.turn_micros == 0 {
            return None;
        }
        let turn = now / self.turn_micros;
        Some(clients[(turn % clients.len() as u64) as usize])
    }

    /// The turn `now` falls in.
    pub fn turn(&self, now: u64) -> u64 {
        now.checked_div(self.turn_micros).unwrap_or(0)
    }
}

/// Why a correct client does not consent to a proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Withheld {
    /// It does not hold this listed update (yet): it asks again later.
    Missing(UpdateId),
    /// This listed update is no version a proposal may list: a delete, an unauthorised or
    /// reserved key's update.
    NotAVersion(UpdateId),
    /// The ladder keeps this listed version: the proposal is premature.
    Kept(UpdateId),
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = DAY_MICROS;

    #[test]
    fn the_paper_ladder_keeps_recent_versions_and_one_per_rung_boundary() {
        let ladder = Ladder::paper();
        let now = 400 * DAY + DAY / 2;
        assert!(ladder.keeps(0, None, now), "a current version is kept");
        assert!(
            ladder.keeps(now - 2 * DAY, Some(now - DAY / 2), now),
            "alive within a day"
        );
        // Alive at the midnight three days ago, for an hour on each side.
        let midnight = 397 * DAY;
        assert!(ladder.keeps(
            midnight - 3_600_000_000,
            Some(midnight + 3_600_000_000),
            now
        ));
        // Alive three days ago, but over no midnight: only the day's last version is kept.
        assert!(!ladder.keeps(
            midnight + 3_600_000_000,
            Some(midnight + 7_200_000_000),
            now
        ));
        // Over a midnight twenty days ago: kept only if that midnight starts a week.
        let weekly = 380 * DAY / (7 * DAY) * (7 * DAY);
        assert!(ladder.keeps(weekly - 1, Some(weekly + 1), now));
        let daily = weekly + DAY;
        assert!(!ladder.keeps(daily - 1, Some(daily + 1), now));
        // Over a 30-day boundary two years ago: past every rung.
        let old = 30 * DAY;
        assert!(!ladder.keeps(old - 1, Some(old + 1), now));
        assert!(
            ladder.keeps(old - 1, Some(old + 1), old + 100 * DAY),
            "within the year then"
        );
    }

    #[test]
    fn proposals_are_sorted_and_without_repeats() {
        let a = UpdateId(bulwark_core::Digest([1; 32]));
        let b = UpdateId(bulwark_core::Digest([2; 32]));
        let good = Discard::Propose {
            turn: 3,
            ids: vec![a, b],
        };
        assert_eq!(Discard::decode(&good.encode()), Some(good));
        for ids in [vec![b, a], vec![a, a], Vec::new()] {
            assert_eq!(
                Discard::decode(&Discard::Propose { turn: 3, ids }.encode()),
                None
            );
        }
        assert_eq!(
            Discard::decode(&Discard::Consent(a).encode()),
            Some(Discard::Consent(a))
        );
        assert_eq!(Discard::decode(b"garbage"), None);
    }
}
