//! Taking a register over into its group's next incarnation (docs/state-transfer.md,
//! "M-PoWerStore registers", steps 2 and 3).
//!
//! A version's MAC vector binds the incarnation it was written in, so a member of a key's new
//! incarnation cannot check the vector of the version it is handed, and no single old member may
//! vouch for it. A new member *reads* the key from the previous incarnation instead, as any reader
//! does (its members entered the new epoch before they answer, so that incarnation takes no more
//! writes), and carries the result over ([`Carried`]): its own slot's fragment, re-encoded from
//! the value the read returned and checked against the cross-checksum `f+1` old members agreed
//! on, with the timestamp and the nonce that proves it. [`Server::carry`] stores it under
//! [`MacVec::carried`], a vector no slot of which verifies, so the version is valid at a member
//! through its own `Hist` entry alone: a member that does not hold it never adopts it from a
//! reader, and neither does anyone once its holders dropped it.
//!
//! The member serves the key only once `2f+1` members of the new incarnation say they hold that
//! version or a newer one (HOLD). Two members' reads of the previous incarnation may be
//! concurrent and return different versions (one whose COMPLETE reached a single old member is
//! proven without being complete); a member that served the newer one at once could vouch for it
//! with `f` faulty members while the correct members holding the older one let a later read return
//! that: a read going back. With the confirmation, a version a correct member vouches for is held
//! with `lc` at least as new by `f+1` correct members, which is what the read path rests on (a
//! read's write-back need not reach members that cannot validate the version).
//!
//! A member asked to HOLD a version above its `lc` reads the previous incarnation again, which
//! then returns at least that version (the asker's read had finished, and reads there are
//! linearizable). That is the driver's to start: one [`TakeOver`] is one read and one
//! confirmation. A member behind another needs no read of its own to be confirmed (a member
//! ahead of it holds its version or newer), and members ahead through writes of the new
//! incarnation hold nothing a read of the old one could bring, so a confirmation waits for
//! answers, never reads again itself. A member already serving the key keeps serving while it
//! reads again, and stops until confirmed again only if the read carries in a version newer than
//! its `lc` (the changes of [`Server::carry`] then set `lc`): the version it serves stays
//! confirmed, and a faulty member's bogus HOLD then costs a read, not the key.
//!
//! HOLD is answered to any reader (it says no more than COLLECT), but the driver reads again only
//! for a HOLD from a member of the key's new incarnation, or any client could make members read
//! the old one at will.
//!
//! PoWerStore trusts writers to make cross-checksums that name one codeword. A faulty writer's
//! cross-checksum that names none leaves the members whose slots do not match unable to carry the
//! version in (`TakeOver` ends with an error), and with more than `f` of them the key is served by
//! no one in the new incarnation.
//!
//! [`Server::carry`]: super::Server::carry
//! [`MacVec::carried`]: super::MacVec::carried

use super::client::{ClientConfig, ProtocolError, ReadOp, ReadOutcome, Step};
use super::msg::{OpId, Request, RequestBody, Response, ResponseBody};
use super::{CrossChecksum, Nonce, Timestamp, cmp_ts, fragment_digest};
use bulwark_core::erasure::ErasureCodec;
use bulwark_core::{Key, Slot};
use bytes::Bytes;
use std::cmp::Ordering;
use std::sync::Arc;

/// A version read from a key's previous incarnation, as one member of the new one stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Carried {
    /// The version's timestamp, the writer's tag included.
    pub ts: Timestamp,
    /// The nonce its COMPLETE revealed.
    pub nonce: Nonce,
    /// Its cross-checksum, as `f+1` old members held it.
    pub cc: CrossChecksum,
    /// The member's own slot's fragment, re-encoded from the value.
    pub fragment: Bytes,
}

/// Which incarnation of the key a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Side {
    /// The one taken over from: reads.
    Previous,
    /// The one this member joins: HOLDs, itself included.
    New,
}

/// Requests to send, each to a slot of one incarnation.
pub type Sends = Vec<(Side, Slot, Request)>;

/// What the take-over says after an input.
#[derive(Debug)]
pub enum TakeStep {
    /// Send these (possibly none) and keep feeding replies.
    Send(Sends),
    /// Store `carried` ([`super::Server::carry`]), make its changes durable, then send `then`.
    /// A member whose server refuses it holds nothing new: the driver drops this take-over
    /// (whose HOLDs would name a version the member lacks) and may start another.
    Carry {
        /// The version read.
        carried: Carried,
        /// The HOLDs that follow.
        then: Sends,
    },
    /// Over.
    Done(Result<TakeOutcome, ProtocolError>),
}

/// How a take-over ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TakeOutcome {
    /// `2f+1` members hold `base` or newer: the member serves the key.
    Confirmed {
        /// What the member holds; `None` is `ts_0` (the key was never written).
        base: Option<Timestamp>,
    },
    /// The read of the previous incarnation stalled: for three timer firings a quorum had
    /// answered and the answers left no version to select (see [`ReadOp::stalled`]; the
    /// members still silent might have decided it). The driver starts another take-over, whose
    /// read asks afresh.
    Stalled {
        /// Why, as the read says.
        why: String,
    },
}

/// What one member said it holds: nothing yet (`None`), or its `lc` (`Some(None)` is `ts_0`).
type Said = Option<Option<Timestamp>>;

enum Phase {
    /// Boxed: a read is large, and a take-over is one per key moved.
    Read(Box<ReadOp>),
    Confirm {
        /// The retransmission round: 0 for the first HOLDs, one more each time the timer asks
        /// again the members not yet at or above the base.
        attempt: u32,
        /// Per member, the newest `lc` it said it holds, whichever HOLD it answered: a correct
        /// member's `lc` never goes back, so an earlier answer stays true.
        held: Vec<Said>,
    },
    Done,
}

/// One member's take-over of one key: a read of the previous incarnation, the carry, and the
/// confirmation among the new incarnation's members.
pub struct TakeOver {
    new: ClientConfig,
    me: Slot,
    key: Key,
    op: OpId,
    codec: Arc<dyn ErasureCodec>,
    /// What the member holds of the key: its `lc` when the take-over began, then the version
    /// the read carried in if newer.
    base: Option<Timestamp>,
    phase: Phase,
    /// Timer firings in a row that found the read stalled.
    stalled_timeouts: u32,
}

/// Timer firings a stalled read of the previous incarnation is given before the take-over
/// ends [`TakeOutcome::Stalled`]: replies still missing may yet decide it.
const STALLED_TIMEOUTS: u32 = 3;

impl TakeOver {
    /// A take-over of `key` by slot `me` of the incarnation `new` describes, from the one
    /// `previous` describes, by a member that holds `held` already (`lc.ts`). `op` must be fresh:
    /// a second take-over must not count the first one's replies.
    pub fn new(
        previous: ClientConfig,
        new: ClientConfig,
        me: Slot,
        codec: Arc<dyn ErasureCodec>,
        key: Key,
        op: OpId,
        held: Option<Timestamp>,
    ) -> TakeOver {
        assert_eq!(previous.n, new.n, "both incarnations are groups of 3f+1");
        assert!(me.index() < new.n);
        let read = ReadOp::new(previous, codec.clone(), key.clone(), op);
        TakeOver {
            new,
            me,
            key,
            op,
            codec,
            base: held,
            phase: Phase::Read(Box::new(read)),
            stalled_timeouts: 0,
        }
    }

    /// The first requests: the read's.
    pub fn start(&mut self) -> Sends {
        match &mut self.phase {
            Phase::Read(read) => previous(read.start()),
            _ => Vec::new(),
        }
    }

    /// Feeds one reply from `from`, a slot of `side`.
    pub fn on_response(&mut self, side: Side, from: Slot, response: Response) -> TakeStep {
        match (&mut self.phase, side) {
            (Phase::Read(read), Side::Previous) => match read.on_response(from, response) {
                Step::Continue(more) => TakeStep::Send(previous(more)),
                Step::Done(Err(error)) => self.fail(error),
                Step::Done(Ok(outcome)) => self.read(outcome),
            },
            (Phase::Confirm { .. }, Side::New) => self.on_hold(from, response),
            _ => TakeStep::Send(Vec::new()),
        }
    }

    /// The retransmission timer fired: the read retransmits (or stops waiting for fragments, or
    /// ends [`TakeOutcome::Stalled`]); a confirmation asks again the members that have not said
    /// they hold the base or newer (members still reading answer later).
    pub fn on_timeout(&mut self) -> TakeStep {
        match &mut self.phase {
            Phase::Read(read) => match read.stalled() {
                Some(why) if self.stalled_timeouts >= STALLED_TIMEOUTS => {
                    self.phase = Phase::Done;
                    TakeStep::Done(Ok(TakeOutcome::Stalled { why }))
                }
                stalled => {
                    self.stalled_timeouts = if stalled.is_some() {
                        self.stalled_timeouts + 1
                    } else {
                        0
                    };
                    TakeStep::Send(previous(read.on_timeout()))
                }
            },
            Phase::Confirm { attempt, held } => {
                *attempt += 1;
                let (attempt, base) = (*attempt, self.base);
                let short: Vec<Slot> = held
                    .iter()
                    .enumerate()
                    .filter(|(_, said)| {
                        said.is_none_or(|lc| cmp_ts(lc.as_ref(), base.as_ref()) == Ordering::Less)
                    })
                    .map(|(i, _)| Slot(i as u32))
                    .collect();
                TakeStep::Send(self.holds(attempt, short))
            }
            Phase::Done => TakeStep::Send(Vec::new()),
        }
    }

    /// The operation id its requests carry and its replies echo.
    pub fn op(&self) -> OpId {
        self.op
    }

    /// Whether its read is over and it waits for the confirmation.
    pub fn confirming(&self) -> bool {
        matches!(self.phase, Phase::Confirm { .. })
    }

    /// The epoch of the incarnation it takes the key into, as its HOLDs name it.
    pub fn epoch(&self) -> bulwark_core::Epoch {
        self.new.epoch
    }

    /// Where it stands, for logs: the phase, the base, and in confirmation what each member
    /// said it holds.
    pub fn describe(&self) -> String {
        let ts = |ts: &Option<Timestamp>| ts.map_or("0".to_string(), |ts| ts.num.to_string());
        match &self.phase {
            Phase::Read(_) => format!("reading, holding {}", ts(&self.base)),
            Phase::Confirm { attempt, held } => {
                let said: Vec<String> = held
                    .iter()
                    .map(|said| said.as_ref().map_or("-".to_string(), ts))
                    .collect();
                format!(
                    "confirming {} (attempt {attempt}), members hold [{}]",
                    ts(&self.base),
                    said.join(" ")
                )
            }
            Phase::Done => "done".to_string(),
        }
    }

    fn read(&mut self, outcome: ReadOutcome) -> TakeStep {
        let mut carried = None;
        if cmp_ts(outcome.ts.as_ref(), self.base.as_ref()) == Ordering::Greater {
            match self.carried(&outcome) {
                Ok(version) => carried = Some(version),
                Err(error) => return self.fail(error),
            }
        }
        if let Some(carried) = &carried {
            self.base = Some(carried.ts);
        }
        self.phase = Phase::Confirm {
            attempt: 0,
            held: vec![None; self.new.n],
        };
        let then = self.holds(0, (0..self.new.n).map(|i| Slot(i as u32)).collect());
        match carried {
            Some(carried) => TakeStep::Carry { carried, then },
            None => TakeStep::Send(then),
        }
    }

    /// The member's slot of the version `outcome` selected, checked against its cross-checksum.
    fn carried(&self, outcome: &ReadOutcome) -> Result<Carried, ProtocolError> {
        let (Some(ts), Some(proven)) = (outcome.ts, outcome.proven.as_ref()) else {
            unreachable!("a read that selected a version says what proves it")
        };
        let me = self.me.index();
        let cc = &proven.cc;
        if !cc.is_well_formed(self.new.n) {
            return Err(ProtocolError::Coding(
                "the cross-checksum read does not fit the new group".to_string(),
            ));
        }
        let value = outcome.value.clone().unwrap_or_default();
        let mut fragments = self
            .codec
            .encode(&cc.layout, &value)
            .map_err(|e| ProtocolError::Coding(e.to_string()))?;
        let fragment = fragments.swap_remove(me);
        if fragment_digest(&fragment) != cc.hashes[me] {
            // Only a faulty writer's cross-checksum names fragments its value does not make.
            return Err(ProtocolError::Coding(format!(
                "the value read does not re-encode to its cross-checksum at slot {me}"
            )));
        }
        Ok(Carried {
            ts,
            nonce: proven.nonce,
            cc: cc.clone(),
            fragment,
        })
    }

    fn holds(&self, attempt: u32, to: Vec<Slot>) -> Sends {
        to.into_iter()
            .map(|slot| {
                let request = Request {
                    op: self.op,
                    attempt,
                    epoch: self.new.epoch,
                    group: self.new.group,
                    key: self.key.clone(),
                    body: RequestBody::Hold { ts: self.base },
                };
                (Side::New, slot, request)
            })
            .collect()
    }

    fn on_hold(&mut self, from: Slot, response: Response) -> TakeStep {
        let Phase::Confirm { held, .. } = &mut self.phase else {
            return TakeStep::Send(Vec::new());
        };
        let ResponseBody::HoldAck { lc_ts } = response.body else {
            // A refusal or a stray reply confirms nothing; the timer asks again.
            return TakeStep::Send(Vec::new());
        };
        let Some(said) = held.get_mut(from.index()) else {
            return TakeStep::Send(Vec::new());
        };
        if response.op != self.op {
            return TakeStep::Send(Vec::new());
        }
        // Any HOLD of this take-over counts, the newest claim of each member kept.
        if said.is_none_or(|before| cmp_ts(lc_ts.as_ref(), before.as_ref()) == Ordering::Greater) {
            *said = Some(lc_ts);
        }
        let base = self.base;
        let holding = held
            .iter()
            .flatten()
            .filter(|lc| cmp_ts(lc.as_ref(), base.as_ref()) != Ordering::Less)
            .count();
        // `2f+1`; `f+1` under the `quorum_f_plus_one` mutation of the new incarnation's config.
        if holding >= self.new.quorum() {
            self.phase = Phase::Done;
            return TakeStep::Done(Ok(TakeOutcome::Confirmed { base }));
        }
        TakeStep::Send(Vec::new())
    }

    fn fail(&mut self, error: ProtocolError) -> TakeStep {
        self.phase = Phase::Done;
        TakeStep::Done(Err(error))
    }
}

fn previous(sends: Vec<(Slot, Request)>) -> Sends {
    sends
        .into_iter()
        .map(|(slot, request)| (Side::Previous, slot, request))
        .collect()
}
