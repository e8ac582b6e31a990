//! The M-PoWerStore writer (Alg. 4) and reader (Alg. 6) as one machine per operation.
//!
//! A machine is fed every reply it gets and says what to send next; at each tick of its timer the
//! driver calls `on_timeout`, which retransmits the current round to nodes that have not answered
//! (or ends a read's wait for fragments), and gives up at its own deadline.
//! Safety never depends on when either happens. Each node's first reply per round is the only one
//! counted (spec §7.1 item 10): a Byzantine node cannot vote twice.

use super::msg::{FilterAck, LcEntry, OpId, Refusal, Request, RequestBody, Response, ResponseBody};
use super::{
    Candidate, CrossChecksum, MacVec, Nonce, Pid, Timestamp, WriterIdentity, WriterKeys, cmp_ts,
    fragment_digest,
};
use crate::machine::{OpError, Progress};
use crate::round::{Refusals, Replies};
use crate::transfer::{Rebase, Turned, node_slot};
use bulwark_core::erasure::{ErasureCodec, Layout};
use bulwark_core::membership::{Chain, GroupView, Incarnation, RingPoint};
use bulwark_core::{Digest, Epoch, GroupId, Key, Slot};
use bytes::Bytes;
use std::cmp::Ordering;

/// What every client operation needs to know about the group.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Group size.
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// Configuration believed in.
    pub epoch: Epoch,
    /// Group addressed.
    pub group: GroupId,
    /// The group's incarnation, which MAC vectors bind.
    pub incarnation: Incarnation,
    /// Whether a read may end after COLLECT (the one-round read, see [`ReadOp`]). Off, every
    /// read runs FILTER as the paper's does: for tests of FILTER and for comparisons.
    pub one_round: bool,
    /// Deliberate protocol breakage for the simulator's negative controls; all off in production.
    pub mutations: ClientMutations,
}

/// Deliberately broken client variants. The simulator must catch each one, which proves it can
/// fail. Nothing outside `bulwark sim` sets them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientMutations {
    /// Wait for `f+1` replies per round instead of `n-f`: quorums no longer meet in a correct node.
    pub quorum_f_plus_one: bool,
    /// Select the highest safe candidate without checking its nonce against the agreed `N̄`
    /// (the paper's literal line 143, spec §4.8(a)).
    pub any_twin: bool,
    /// Never add the `lc`s that "superseded" replies offer: a read whose version was collected
    /// under it waits forever.
    pub no_offers: bool,
    /// End a read in one round when `f+1` COLLECT replies (instead of `n - f`) name the same
    /// `lc`: a version only `f+1` nodes hold need not be the newest completed one.
    pub one_round_small_agreement: bool,
    /// End a read in one round with `f` vouching entries (instead of `f+1`): the cross-checksum
    /// may be a liar's.
    pub one_round_f_vouchers: bool,
    /// A sole writer that does not know its clock for a key skips CLOCK anyway and stores at 1,
    /// as a writer restarted with a fresh counter would. Safe only while nodes refuse STOREs
    /// below their `lc` (the server's stale check).
    pub sole_writer_from_one: bool,
}

impl ClientConfig {
    /// A group of `3f+1` in epoch 0, group 0.
    pub fn new(f: usize) -> ClientConfig {
        ClientConfig {
            n: 3 * f + 1,
            f,
            epoch: Epoch(0),
            group: GroupId(0),
            incarnation: Incarnation::new(&[], Epoch(0)),
            one_round: true,
            mutations: ClientMutations::default(),
        }
    }

    /// `n - f`: every round's quorum.
    pub fn quorum(&self) -> usize {
        if self.mutations.quorum_f_plus_one {
            self.f + 1
        } else {
            self.n - self.f
        }
    }

    /// The key's group of `epoch` in `chain` is `view`: requests go there, and MAC vectors bind
    /// its incarnation. `false` when the chain does not place `key` there or the group is not
    /// of this size.
    fn follow(
        &mut self,
        key: &Key,
        epoch: Epoch,
        view: &GroupView,
        chain: &Chain,
    ) -> Result<(), OpError> {
        let point = RingPoint::of_key(key.as_bytes());
        match chain.incarnation(epoch, point) {
            Some((group, incarnation)) if group == *view && view.len() == self.n => {
                self.epoch = epoch;
                self.group = view.id();
                self.incarnation = incarnation;
                Ok(())
            }
            _ => Err(OpError::Failed(format!(
                "the configuration of epoch {} does not place the key in a group of {}",
                epoch.0, self.n
            ))),
        }
    }

    fn request(&self, op: OpId, attempt: u32, key: &Key, body: RequestBody) -> Request {
        Request {
            op,
            attempt,
            epoch: self.epoch,
            group: self.group,
            key: key.clone(),
            body,
        }
    }
}

/// A message to send.
pub type Outbound = (Slot, Request);

/// What a machine says after an input.
pub type Step<T> = crate::round::Step<T, Request, ProtocolError>;

/// Why an operation ended without a result. Timeouts are the driver's, not the protocol's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `f+1` nodes refused, so at least one correct node did.
    #[error("refused by {} nodes: {refusal}", nodes.len())]
    Refused {
        /// The refusal most nodes gave.
        refusal: Refusal,
        /// Who refused.
        nodes: Vec<Slot>,
    },
    /// The value could not be encoded or decoded (a bug: agreed fragments always decode).
    #[error("erasure coding failed: {0}")]
    Coding(String),
}

pub use crate::round::{Evidence, EvidenceKind};

/// A completed write.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// The write's timestamp.
    pub ts: Timestamp,
    /// Nodes whose COMPLETE_ACK counted.
    pub acknowledged_by: Vec<Slot>,
    /// Times a sole writer's STORE was refused as stale and stored again above.
    pub restarts: u32,
}

/// Attempts of one write at most. A sole writer's STORE is redone only above a timestamp the
/// writer itself made and did not know of (a concurrent write, an abandoned one, a second process
/// under its name), each attempt above the last.
const WRITE_ATTEMPTS_MAX: u32 = 16;

/// A completed read.
#[derive(Clone, Debug)]
pub struct ReadOutcome {
    /// The value; `None` when the key was never written or was deleted.
    pub value: Option<Bytes>,
    /// The selected version; `None` for `ts_0`.
    pub ts: Option<Timestamp>,
    /// What proves the selected version, beside `ts`; `None` with it.
    pub proven: Option<Proven>,
    /// Nodes whose FILTER replies counted in the final attempt.
    pub answered_by: Vec<Slot>,
    /// Whether REPAIR ran.
    pub repaired: bool,
    /// Whether the read ended after COLLECT (the one-round read; also every read of a key no
    /// one has written).
    pub one_round: bool,
    /// FILTER rounds beyond the first: each added newer candidates that "superseded" replies
    /// offered, because nothing the read had could become safe (a version garbage-collected
    /// under it, or a Byzantine node's bait).
    pub restarts: u32,
    /// Misbehaviour seen along the way.
    pub evidence: Vec<Evidence>,
    /// Nodes asked for fragments that did not help the read end in one round: silent until the
    /// timer ended the wait, or naming the `lc` the others agreed on without an intact entry for
    /// it. The caller asks others for fragments first for a while.
    pub unhelpful: Vec<Slot>,
}

/// The nonce and cross-checksum of a version a read selected: with its timestamp and value, what
/// a member of the key's next incarnation carries over (see [`super::takeover`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Proven {
    /// The revealed nonce, which hashes to the `N̄` that `f+1` holders agreed on.
    pub nonce: Nonce,
    /// The cross-checksum `f+1` holders agreed on, each with a fragment matching its slot.
    pub cc: CrossChecksum,
}

/// `f+1` refusals end an operation.
fn refused(
    refusals: &mut Refusals<Refusal>,
    from: Slot,
    refusal: Refusal,
    f: usize,
) -> Option<ProtocolError> {
    let (refusal, nodes) = refusals.record(from, refusal, f)?;
    Some(ProtocolError::Refused { refusal, nodes })
}

// ---------------------------------------------------------------------------------------------
// Writer

enum WritePhase {
    Clock {
        replies: Replies<()>,
        highest: Option<Timestamp>,
    },
    Store {
        replies: Replies<()>,
    },
    Complete {
        replies: Replies<()>,
    },
    Done,
}

/// One write (or delete) of one key (Alg. 4).
pub struct WriteOp {
    config: ClientConfig,
    keys: std::sync::Arc<WriterKeys>,
    key: Key,
    op: OpId,
    pid: Pid,
    /// The nonce of the current attempt, revealed in its COMPLETE.
    nonce: Nonce,
    /// The first attempt's nonce, from which every attempt's is derived.
    first_nonce: Nonce,
    value: Option<Bytes>,
    codec: std::sync::Arc<dyn ErasureCodec>,
    phase: WritePhase,
    refusals: Refusals<Refusal>,
    /// Set once CLOCK finished: the timestamp, fragments, cross-checksum and MAC vector.
    prepared: Option<Prepared>,
    /// Which attempt this is: 0, then one more each time a stale refusal sends a sole writer's
    /// STORE above the timestamp it names, or the write moves to another incarnation. Requests
    /// carry it; replies to another attempt are ignored.
    attempt: u32,
    /// Attempts that were moves to another incarnation, not restarts.
    moved: u32,
    /// What derives the keys shared with another incarnation's members, for a write that
    /// follows its key there ([`WriteOp::following`]).
    identity: Option<std::sync::Arc<WriterIdentity>>,
}

struct Prepared {
    ts: Timestamp,
    fragments: Vec<Bytes>,
    cc: CrossChecksum,
    nonce_hash: Digest,
    vec: MacVec,
}

impl WriteOp {
    /// A write of `value` (`None` deletes). `nonce` must come from a CSPRNG and never be reused;
    /// `pid.seq` must be unique among this writer's operations.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: ClientConfig,
        keys: std::sync::Arc<WriterKeys>,
        codec: std::sync::Arc<dyn ErasureCodec>,
        key: Key,
        op: OpId,
        pid: Pid,
        nonce: [u8; 32],
        value: Option<Bytes>,
    ) -> WriteOp {
        assert_eq!(keys.servers.len(), config.n, "one MAC key per server");
        let refusals = Refusals::new(config.n);
        let phase = WritePhase::Clock {
            replies: Replies::new(config.n),
            highest: None,
        };
        WriteOp {
            config,
            keys,
            key,
            op,
            pid,
            nonce: Nonce(nonce),
            first_nonce: Nonce(nonce),
            value,
            codec,
            phase,
            refusals,
            prepared: None,
            attempt: 0,
            moved: 0,
            identity: None,
        }
    }

    /// This write, able to follow its key into the group's next incarnation (see
    /// [`Rebase`]): `identity` derives the keys shared with that incarnation's members.
    pub fn following(mut self, identity: std::sync::Arc<WriterIdentity>) -> WriteOp {
        self.identity = Some(identity);
        self
    }

    /// This write on a register with one writer (see [`super::sole_writer`]), by that writer,
    /// whose own last write of the key had timestamp number `last`. With `last`, the write skips
    /// CLOCK and stores at `last + 1` (the paper's §4 write: STORE, then COMPLETE); without, it
    /// runs CLOCK as every write does. A node that refuses the STORE as stale names its `lc`; if
    /// that timestamp carries the writers' tag and is above this attempt's, the write stores
    /// again above it.
    pub fn sole(mut self, last: Option<u64>) -> Result<WriteOp, ProtocolError> {
        let last = match last {
            None if self.config.mutations.sole_writer_from_one => Some(0),
            last => last,
        };
        if let Some(last) = last {
            self.prepare(last.saturating_add(1))?;
            self.phase = WritePhase::Store {
                replies: Replies::new(self.config.n),
            };
        }
        Ok(self)
    }

    /// The first round: CLOCK to every node, or STORE for a sole writer that knows its clock.
    pub fn start(&mut self) -> Vec<Outbound> {
        match self.phase {
            WritePhase::Store { .. } => self.stores(),
            _ => self.broadcast(RequestBody::Clock),
        }
    }

    fn broadcast(&self, body: RequestBody) -> Vec<Outbound> {
        (0..self.config.n)
            .map(|i| {
                (
                    Slot(i as u32),
                    self.config
                        .request(self.op, self.attempt, &self.key, body.clone()),
                )
            })
            .collect()
    }

    fn stores(&self) -> Vec<Outbound> {
        (0..self.config.n)
            .filter_map(|i| Some((Slot(i as u32), self.store_for(Slot(i as u32))?)))
            .collect()
    }

    fn store_for(&self, node: Slot) -> Option<Request> {
        let p = self.prepared.as_ref()?;
        let body = RequestBody::Store {
            ts: p.ts,
            fragment: p.fragments.get(node.index())?.clone(),
            cc: p.cc.clone(),
            nonce_hash: p.nonce_hash,
            vec: p.vec.clone(),
        };
        Some(self.config.request(self.op, self.attempt, &self.key, body))
    }

    fn complete_body(&self) -> Option<RequestBody> {
        let p = self.prepared.as_ref()?;
        Some(RequestBody::Complete {
            ts: p.ts,
            nonce: self.nonce,
            vec: p.vec.clone(),
        })
    }

    /// A write's rounds finish on a quorum of acknowledgements: replies alone can be missing.
    pub fn stalled(&self) -> Option<String> {
        None
    }

    /// The retransmission timer fired: the current round goes again.
    pub fn on_timeout(&mut self) -> Vec<Outbound> {
        self.retransmit()
    }

    /// The current round's request to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound> {
        match &self.phase {
            WritePhase::Clock { replies, .. } => replies
                .missing()
                .map(|n| {
                    (
                        n,
                        self.config
                            .request(self.op, self.attempt, &self.key, RequestBody::Clock),
                    )
                })
                .collect(),
            WritePhase::Store { replies } => replies
                .missing()
                .filter_map(|n| Some((n, self.store_for(n)?)))
                .collect(),
            WritePhase::Complete { replies } => match self.complete_body() {
                Some(body) => replies
                    .missing()
                    .map(|n| {
                        let request =
                            self.config
                                .request(self.op, self.attempt, &self.key, body.clone());
                        (n, request)
                    })
                    .collect(),
                None => Vec::new(),
            },
            WritePhase::Done => Vec::new(),
        }
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<Slot> {
        match &self.phase {
            WritePhase::Clock { replies, .. }
            | WritePhase::Store { replies }
            | WritePhase::Complete { replies } => replies.present().map(|(n, _)| n).collect(),
            WritePhase::Done => Vec::new(),
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: Slot, response: Response) -> Step<WriteOutcome> {
        if response.op != self.op
            || response.attempt != self.attempt
            || from.index() >= self.config.n
        {
            return Step::Continue(Vec::new());
        }
        if let ResponseBody::Refused(Refusal::Stale { lc }) = response.body {
            return self.on_stale(lc);
        }
        if let ResponseBody::Refused(refusal) = response.body {
            return match refused(&mut self.refusals, from, refusal, self.config.f) {
                Some(error) => {
                    self.phase = WritePhase::Done;
                    Step::Done(Err(error))
                }
                None => Step::Continue(Vec::new()),
            };
        }
        let quorum = self.config.quorum();
        match (&mut self.phase, response.body) {
            (WritePhase::Clock { replies, highest }, ResponseBody::ClockAck { lc_ts }) => {
                if !replies.record(from, ()) {
                    return Step::Continue(Vec::new());
                }
                // l. 100: adopt only timestamps that carry a genuine k_W tag.
                if let Some(ts) = lc_ts {
                    let verified = ts.verify(&self.key, &self.keys.timestamp);
                    if verified && cmp_ts(Some(&ts), highest.as_ref()) == Ordering::Greater {
                        *highest = Some(ts);
                    }
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let num = highest.map_or(0, |ts| ts.num).saturating_add(1);
                match self.prepare(num) {
                    Ok(()) => {
                        self.phase = WritePhase::Store {
                            replies: Replies::new(self.config.n),
                        };
                        Step::Continue(self.stores())
                    }
                    Err(error) => {
                        self.phase = WritePhase::Done;
                        Step::Done(Err(error))
                    }
                }
            }
            (WritePhase::Store { replies }, ResponseBody::StoreAck { ts }) => {
                if self.prepared.as_ref().map(|p| p.ts) != Some(ts) || !replies.record(from, ()) {
                    return Step::Continue(Vec::new());
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                // Invariant 1 (spec §7.1): N is revealed only now, after n - f STORE_ACKs.
                let Some(body) = self.complete_body() else {
                    return Step::Continue(Vec::new());
                };
                self.phase = WritePhase::Complete {
                    replies: Replies::new(self.config.n),
                };
                Step::Continue(self.broadcast(body))
            }
            (WritePhase::Complete { replies }, ResponseBody::CompleteAck { ts }) => {
                let Some(prepared_ts) = self.prepared.as_ref().map(|p| p.ts) else {
                    return Step::Continue(Vec::new());
                };
                if prepared_ts != ts || !replies.record(from, ()) {
                    return Step::Continue(Vec::new());
                }
                if replies.count() < quorum {
                    return Step::Continue(Vec::new());
                }
                let acknowledged_by = replies.present().map(|(n, _)| n).collect();
                self.phase = WritePhase::Done;
                Step::Done(Ok(WriteOutcome {
                    ts: prepared_ts,
                    acknowledged_by,
                    restarts: self.attempt - self.moved,
                }))
            }
            _ => Step::Continue(Vec::new()),
        }
    }

    /// A STORE refused as stale by a node whose `lc` is `lc`. Only the writer makes timestamps
    /// with the writers' tag for its register, so a tagged `lc` above this attempt's timestamp is
    /// one of its own writes this attempt did not know of: store again above it, with a fresh
    /// nonce, at once. Anything else (an untagged or lower `lc`: a liar) counts as no answer.
    fn on_stale(&mut self, lc: Timestamp) -> Step<WriteOutcome> {
        let Some(current) = self.prepared.as_ref().map(|p| p.ts) else {
            return Step::Continue(Vec::new());
        };
        if !matches!(self.phase, WritePhase::Store { .. })
            || lc.cmp_order(&current) != Ordering::Greater
            || !lc.verify(&self.key, &self.keys.timestamp)
        {
            return Step::Continue(Vec::new());
        }
        if self.attempt + 1 >= WRITE_ATTEMPTS_MAX {
            self.phase = WritePhase::Done;
            return Step::Done(Err(ProtocolError::Refused {
                refusal: Refusal::Stale { lc },
                nodes: Vec::new(),
            }));
        }
        self.attempt += 1;
        // The abandoned attempt's nonce is never revealed, so its timestamp stays unproven.
        self.nonce = self.first_nonce.for_attempt(self.attempt);
        self.refusals = Refusals::new(self.config.n);
        if let Err(error) = self.prepare(lc.num.saturating_add(1)) {
            self.phase = WritePhase::Done;
            return Step::Done(Err(error));
        }
        self.phase = WritePhase::Store {
            replies: Replies::new(self.config.n),
        };
        Step::Continue(self.stores())
    }

    /// Builds the timestamp, fragments, cross-checksum and MAC vector (l. 85–88, 103).
    fn prepare(&mut self, num: u64) -> Result<(), ProtocolError> {
        let ts = Timestamp::authenticated(&self.key, num, self.pid, &self.keys.timestamp);
        let (layout, tombstone, value) = match &self.value {
            Some(value) => (
                Layout::for_value(value.len(), self.config.n, self.config.f),
                false,
                value.clone(),
            ),
            None => (
                Layout::for_value(0, self.config.n, self.config.f),
                true,
                Bytes::new(),
            ),
        };
        let fragments = self
            .codec
            .encode(&layout, &value)
            .map_err(|e| ProtocolError::Coding(e.to_string()))?;
        let cc = CrossChecksum {
            layout,
            tombstone,
            hashes: fragments.iter().map(|f| fragment_digest(f)).collect(),
        };
        let nonce_hash = self.nonce.commitment();
        let vec = MacVec::compute(
            &self.config.incarnation,
            &self.key,
            &ts,
            &nonce_hash,
            &self.keys.servers,
        );
        self.prepared = Some(Prepared {
            ts,
            fragments,
            cc,
            nonce_hash,
            vec,
        });
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Reader

// One phase value per operation in flight; boxing would add an allocation per round for nothing.
#[allow(clippy::large_enum_variant)]
enum ReadPhase {
    Collect {
        replies: Replies<Collected>,
        candidates: Vec<Candidate>,
    },
    Filter {
        /// What COLLECT gathered, less what FILTER replies excluded.
        candidates: Vec<Candidate>,
        /// Newer candidates "superseded" replies offered, not yet shown valid.
        offers: Vec<Offer>,
        replies: Replies<FilterAck>,
        /// Per node: its reply is an entry whose fragment hashes to the entry's own `cc` slot.
        /// Hashed once when the reply arrives; judging and restoring only read it.
        intact: Vec<bool>,
    },
    Repair {
        candidate: Candidate,
        replies: Replies<()>,
        outcome: ReadOutcome,
    },
    Done,
}

/// One read of one key (Alg. 6).
pub struct ReadOp {
    config: ClientConfig,
    key: Key,
    op: OpId,
    attempt: u32,
    codec: std::sync::Arc<dyn ErasureCodec>,
    phase: ReadPhase,
    refusals: Refusals<Refusal>,
    evidence: Vec<Evidence>,
    /// Nodes whose offers were excluded: their "superseded" replies offer nothing any more.
    suspects: Vec<Slot>,
    /// Per node: whether COLLECT asks it for its entry of `lc`, fragment included.
    fragments_from: Vec<bool>,
    /// See [`ReadOutcome::unhelpful`].
    unhelpful: Vec<Slot>,
    /// Attempts that were moves to another incarnation, not FILTER restarts.
    moved: u32,
}

/// One COLLECT reply, kept for the one-round rule.
struct Collected {
    /// The node's `lc`, if well-formed.
    lc: Option<Candidate>,
    /// Its `Hist` entry for that `lc`.
    entry: Option<LcEntry>,
}

/// A candidate some nodes offered in "superseded" replies, carried into the next FILTER round.
#[derive(Clone, Debug)]
struct Offer {
    candidate: Candidate,
    by: Vec<Slot>,
}

/// The verdict on a FILTER round so far.
#[allow(clippy::large_enum_variant)]
enum Verdict {
    Wait,
    Empty,
    /// Ask again with these new offers.
    Advance(Vec<Offer>),
    Selected {
        candidate: Candidate,
        agreed: Agreed,
    },
}

/// The `(ts, cc, vec, N̄)` that `f+1` nodes agree on, with fragments matching their own slots.
#[derive(Clone)]
struct Agreed {
    ts: Timestamp,
    cc: CrossChecksum,
    vec: MacVec,
    nonce_hash: Digest,
}

impl ReadOp {
    /// A read of `key`.
    pub fn new(
        config: ClientConfig,
        codec: std::sync::Arc<dyn ErasureCodec>,
        key: Key,
        op: OpId,
    ) -> ReadOp {
        let refusals = Refusals::new(config.n);
        let phase = ReadPhase::Collect {
            replies: Replies::new(config.n),
            candidates: Vec::new(),
        };
        ReadOp {
            config,
            key,
            op,
            attempt: 0,
            codec,
            phase,
            refusals,
            evidence: Vec::new(),
            suspects: Vec::new(),
            fragments_from: Vec::new(),
            unhelpful: Vec::new(),
            moved: 0,
        }
        .asking_fragments_of(&[])
    }

    /// COLLECT asks `nodes` for their entries of `lc`, fragments included, and the others for
    /// `lc` alone; the first `f+1` of `nodes` in the group, topped up with the lowest other slots
    /// (the data fragments' nodes: decoding from them is a copy). `f+1` intact fragments are
    /// what the one-round rule needs and what the value is decoded from, so a read moves `f+1`
    /// fragments, not `n - f`. The caller passes over nodes it knows to be down or silent: the
    /// read waits for the nodes it asked (or a timeout) before it falls back to FILTER.
    pub fn asking_fragments_of(mut self, nodes: &[Slot]) -> ReadOp {
        self.ask_fragments_of(nodes);
        self
    }

    fn ask_fragments_of(&mut self, nodes: &[Slot]) {
        let (n, f) = (self.config.n, self.config.f);
        let wanted = (f + 1).min(n);
        let mut asked = vec![false; n];
        let mut count = 0;
        let lowest = (0..n).map(|i| Slot(i as u32));
        for node in nodes.iter().copied().chain(lowest) {
            if count == wanted {
                break;
            }
            if let Some(slot) = asked.get_mut(node.index())
                && !*slot
            {
                *slot = true;
                count += 1;
            }
        }
        debug_assert_eq!(count, wanted);
        self.fragments_from = asked;
    }

    /// The first round: COLLECT to every node.
    pub fn start(&mut self) -> Vec<Outbound> {
        self.to_each((0..self.config.n).map(|i| Slot(i as u32)))
    }

    /// The current round's request to each of `nodes`.
    fn to_each(&self, nodes: impl Iterator<Item = Slot>) -> Vec<Outbound> {
        nodes
            .filter_map(|node| {
                let body = self.body(node)?;
                Some((
                    node,
                    self.config.request(self.op, self.attempt, &self.key, body),
                ))
            })
            .collect()
    }

    fn broadcast(&self, body: RequestBody) -> Vec<Outbound> {
        (0..self.config.n)
            .map(|i| {
                (
                    Slot(i as u32),
                    self.config
                        .request(self.op, self.attempt, &self.key, body.clone()),
                )
            })
            .collect()
    }

    /// The current round's request to `to`. COLLECT asks the nodes of
    /// [`ReadOp::asking_fragments_of`] for their entries of `lc` and the others for `lc` alone.
    fn body(&self, to: Slot) -> Option<RequestBody> {
        match &self.phase {
            ReadPhase::Collect { .. } => Some(RequestBody::Collect {
                fragment: self.config.one_round
                    && self
                        .fragments_from
                        .get(to.index())
                        .copied()
                        .unwrap_or(false),
            }),
            ReadPhase::Filter {
                candidates, offers, ..
            } => Some(RequestBody::Filter {
                candidates: filter_set(candidates, offers),
            }),
            ReadPhase::Repair { candidate, .. } => Some(RequestBody::Repair {
                candidate: candidate.clone(),
            }),
            ReadPhase::Done => None,
        }
    }

    /// The current round's request to every node that has not answered it.
    pub fn retransmit(&self) -> Vec<Outbound> {
        let missing: Vec<Slot> = match &self.phase {
            ReadPhase::Collect { replies, .. } => replies.missing().collect(),
            ReadPhase::Repair { replies, .. } => replies.missing().collect(),
            ReadPhase::Filter { replies, .. } => replies.missing().collect(),
            ReadPhase::Done => Vec::new(),
        };
        self.to_each(missing.into_iter())
    }

    /// Nodes that have answered the current round.
    pub fn answered(&self) -> Vec<Slot> {
        match &self.phase {
            ReadPhase::Collect { replies, .. } => replies.nodes(),
            ReadPhase::Repair { replies, .. } => replies.nodes(),
            ReadPhase::Filter { replies, .. } => replies.nodes(),
            ReadPhase::Done => Vec::new(),
        }
    }

    /// Why FILTER cannot pick a version although a quorum answered it: the answers disagree
    /// beyond what `f` faulty nodes can explain.
    pub fn stalled(&self) -> Option<String> {
        match &self.phase {
            ReadPhase::Filter { replies, .. } if replies.count() >= self.config.quorum() => {
                Some(format!(
                    "their answers did not agree: no version was vouched for by {} nodes with \
                     intact fragments and left standing by the others (more than f = {} faulty?)",
                    self.config.f + 1,
                    self.config.f
                ))
            }
            _ => None,
        }
    }

    fn blame(&mut self, node: Slot, kind: EvidenceKind) {
        let evidence = Evidence { node, kind };
        if !self.evidence.contains(&evidence) {
            self.evidence.push(evidence);
        }
    }

    /// Feeds one reply.
    pub fn on_response(&mut self, from: Slot, response: Response) -> Step<ReadOutcome> {
        if response.op != self.op
            || response.attempt != self.attempt
            || from.index() >= self.config.n
        {
            return Step::Continue(Vec::new());
        }
        if let ResponseBody::Refused(refusal) = response.body {
            return match refused(&mut self.refusals, from, refusal, self.config.f) {
                Some(error) => {
                    self.phase = ReadPhase::Done;
                    Step::Done(Err(error))
                }
                None => Step::Continue(Vec::new()),
            };
        }
        match response.body {
            ResponseBody::CollectAck { lc, entry } => self.on_collect(from, lc, entry),
            ResponseBody::FilterAck(ack) => self.on_filter(from, ack),
            ResponseBody::RepairAck => self.on_repair(from),
            _ => Step::Continue(Vec::new()),
        }
    }

    fn on_collect(
        &mut self,
        from: Slot,
        lc: Option<Candidate>,
        entry: Option<LcEntry>,
    ) -> Step<ReadOutcome> {
        let n = self.config.n;
        let quorum = self.config.quorum();
        let ReadPhase::Collect {
            replies,
            candidates,
        } = &mut self.phase
        else {
            return Step::Continue(Vec::new());
        };
        // l. 150: keep candidates above ts_0; a correct server's has one MAC per server.
        let well_formed = lc
            .as_ref()
            .is_none_or(|c| c.vec.0.len() == n && c.ts.num >= 1);
        let lc = lc.filter(|_| well_formed);
        let entry = entry.filter(|_| lc.is_some());
        if !replies.record(
            from,
            Collected {
                lc: lc.clone(),
                entry,
            },
        ) {
            return Step::Continue(Vec::new());
        }
        match lc {
            Some(c) if !candidates.contains(&c) => candidates.push(c),
            _ => {}
        }
        let enough = replies.count() >= quorum;
        if !well_formed {
            self.blame(from, EvidenceKind::MalformedReply);
        }
        if !enough {
            return Step::Continue(Vec::new());
        }
        let ReadPhase::Collect { candidates, .. } = &self.phase else {
            return Step::Continue(Vec::new());
        };
        if candidates.is_empty() {
            // No completed write or read precedes us (see the module docs): absent.
            return self.finish(ReadOutcome {
                value: None,
                ts: None,
                proven: None,
                answered_by: self.answered(),
                repaired: false,
                one_round: true,
                restarts: self.attempt - self.moved,
                evidence: Vec::new(),
                unhelpful: Vec::new(),
            });
        }
        match self.one_round() {
            Some(Ok(outcome)) => return self.finish(outcome),
            Some(Err(error)) => {
                self.phase = ReadPhase::Done;
                return Step::Done(Err(error));
            }
            None => {}
        }
        if self.may_yet_end_in_one_round() {
            // A node asked for its fragment has not answered, and its answer could complete the
            // one-round rule. The timer ends the wait (`on_timeout`).
            return Step::Continue(Vec::new());
        }
        self.unhelpful = self.unhelpful_fragment_nodes(false);
        Step::Continue(self.begin_filter())
    }

    /// `n - f` replies that name one `lc` make the one-round read's agreement; a mutation lowers
    /// it to `f + 1`.
    fn agreement(&self) -> usize {
        if self.config.mutations.one_round_small_agreement {
            self.config.f + 1
        } else {
            self.config.n - self.config.f
        }
    }

    /// `f + 1` intact entries vouch for a version; a mutation lowers it to `f`.
    fn vouchers(&self) -> usize {
        if self.config.mutations.one_round_f_vouchers {
            self.config.f.max(1)
        } else {
            self.config.f + 1
        }
    }

    fn asked(&self, node: Slot) -> bool {
        self.fragments_from.get(node.index()) == Some(&true)
    }

    /// The `lc` (timestamp and nonce) most COLLECT replies name, and how many name it.
    fn leading_lc(&self) -> Option<(&Candidate, usize)> {
        let ReadPhase::Collect { replies, .. } = &self.phase else {
            return None;
        };
        let mut named: Vec<(&Candidate, usize)> = Vec::new();
        for (_, reply) in replies.present() {
            let Some(lc) = &reply.lc else { continue };
            match named
                .iter_mut()
                .find(|(c, _)| c.ts == lc.ts && c.nonce == lc.nonce)
            {
                Some((_, count)) => *count += 1,
                None => named.push((lc, 1)),
            }
        }
        named.into_iter().max_by_key(|(_, count)| *count)
    }

    /// Whether waiting for the nodes asked for fragments that have not answered COLLECT could
    /// still end the read in one round: enough replies are missing for the agreement, and enough
    /// asked ones for the vouchers. An entry already blamed vouches for nothing.
    fn may_yet_end_in_one_round(&self) -> bool {
        let ReadPhase::Collect { replies, .. } = &self.phase else {
            return false;
        };
        if !self.config.one_round {
            return false;
        }
        let asked_missing = replies.missing().filter(|node| self.asked(*node)).count();
        if asked_missing == 0 {
            return false;
        }
        let missing = self.config.n - replies.count();
        let leading = self.leading_lc().map_or(0, |(_, count)| count);
        let entries = replies
            .present()
            .filter(|(node, reply)| reply.entry.is_some() && !self.blamed(*node))
            .count();
        leading + missing >= self.agreement() && entries + asked_missing >= self.vouchers()
    }

    fn blamed(&self, node: Slot) -> bool {
        self.evidence.iter().any(|evidence| evidence.node == node)
    }

    /// See [`ReadOutcome::unhelpful`]: nodes asked for fragments that answered COLLECT naming
    /// the `lc` that `n - f` replies agree on without an intact entry for it, and, when the timer
    /// ended the wait (`silent`), those that did not answer at all. Nodes naming another `lc` are
    /// not counted: under concurrent writes that is no fault.
    fn unhelpful_fragment_nodes(&self, silent: bool) -> Vec<Slot> {
        let ReadPhase::Collect { replies, .. } = &self.phase else {
            return Vec::new();
        };
        if !self.config.one_round {
            return Vec::new();
        }
        let agreed = self
            .leading_lc()
            .filter(|(_, count)| *count >= self.agreement())
            .map(|(lc, _)| (lc.ts, lc.nonce));
        let answered = replies.present().filter(|(node, reply)| {
            let names_agreed = reply.lc.as_ref().is_some_and(|lc| {
                agreed
                    .as_ref()
                    .is_some_and(|(ts, nonce)| lc.ts == *ts && lc.nonce == *nonce)
            });
            names_agreed && (reply.entry.is_none() || self.blamed(*node))
        });
        let mut unhelpful: Vec<Slot> = answered.map(|(node, _)| node).collect();
        if silent {
            unhelpful.extend(replies.missing());
        }
        unhelpful.retain(|node| self.asked(*node));
        unhelpful.sort();
        unhelpful
    }

    /// COLLECT's candidates go to FILTER, the paper's second round.
    fn begin_filter(&mut self) -> Vec<Outbound> {
        let n = self.config.n;
        let ReadPhase::Collect { candidates, .. } = &mut self.phase else {
            return Vec::new();
        };
        let candidates = std::mem::take(candidates);
        self.phase = ReadPhase::Filter {
            candidates: candidates.clone(),
            offers: Vec::new(),
            replies: Replies::new(n),
            intact: vec![false; n],
        };
        self.broadcast(RequestBody::Filter { candidates })
    }

    /// The retransmission timer fired: a COLLECT that a quorum answered stops waiting for the
    /// fragments it asked for and goes on to FILTER; otherwise the current round goes again to
    /// the nodes that have not answered it.
    pub fn on_timeout(&mut self) -> Vec<Outbound> {
        if let ReadPhase::Collect { replies, .. } = &self.phase
            && replies.count() >= self.config.quorum()
        {
            self.unhelpful = self.unhelpful_fragment_nodes(true);
            return self.begin_filter();
        }
        self.retransmit()
    }

    /// The one-round read: `n - f` COLLECT replies name the same `lc` (timestamp and nonce),
    /// and `f+1` of them hold its version under one cross-checksum with fragments that hash to
    /// it. `None` when that is not so: the read goes on to FILTER as the paper's does.
    ///
    /// Why this is safe (docs/one-round-reads.md): of `n - f` nodes naming `lc`, at least `f+1`
    /// are correct and hold `lc` or newer from then on, exactly what a completed write or
    /// FILTER write-back leaves; and any write completed before this read began left `f+1`
    /// correct nodes at or above it, one of which is among the `n - f`, so `lc` is at least that
    /// write. `f+1` vouchers include a correct one, so the cross-checksum is the writer's, and
    /// its nonce `N` with `H(N) = N̄` proves the write's STORE round finished.
    fn one_round(&mut self) -> Option<Result<ReadOutcome, ProtocolError>> {
        if !self.config.one_round {
            return None;
        }
        let n = self.config.n;
        let (agreement, vouchers) = (self.agreement(), self.vouchers());
        let ReadPhase::Collect { replies, .. } = &self.phase else {
            return None;
        };
        let (lc, count) = self.leading_lc()?;
        if count < agreement {
            return None;
        }
        let lc = lc.clone();
        let commitment = lc.nonce.commitment();
        let mut groups: Vec<(&CrossChecksum, Vec<(usize, Bytes)>)> = Vec::new();
        let mut blamed = Vec::new();
        for (node, reply) in replies.present() {
            let (Some(theirs), Some(entry)) = (&reply.lc, &reply.entry) else {
                continue;
            };
            if theirs.ts != lc.ts || theirs.nonce != lc.nonce {
                continue;
            }
            // A correct node sends an entry only for its `lc`'s version, as it stored it.
            if entry.nonce_hash != commitment
                || !entry.cc.is_well_formed(n)
                || entry.fragment.len() != entry.cc.layout.fragment_len()
            {
                blamed.push((node, EvidenceKind::MalformedReply));
                continue;
            }
            let group = groups.iter().position(|(cc, _)| **cc == entry.cc);
            // Enough fragments under this cross-checksum already: do not hash another.
            if group.is_some_and(|g| groups[g].1.len() >= vouchers) {
                continue;
            }
            if fragment_digest(&entry.fragment) != entry.cc.hashes[node.index()] {
                blamed.push((node, EvidenceKind::CorruptFragment));
                continue;
            }
            let fragment = (node.index(), entry.fragment.clone());
            match group {
                Some(g) => groups[g].1.push(fragment),
                None => groups.push((&entry.cc, vec![fragment])),
            }
        }
        let agreed = groups
            .into_iter()
            .find(|(cc, fragments)| {
                fragments.len() >= vouchers && fragments.len() >= cc.layout.needed()
            })
            .map(|(cc, fragments)| (cc.clone(), fragments));
        for (node, kind) in blamed {
            self.blame(node, kind);
        }
        let (cc, fragments) = agreed?;
        let value = if cc.tombstone {
            None
        } else {
            match self.codec.decode(&cc.layout, &fragments) {
                Ok(value) => Some(value),
                Err(error) => return Some(Err(ProtocolError::Coding(error.to_string()))),
            }
        };
        Some(Ok(ReadOutcome {
            value,
            ts: Some(lc.ts),
            proven: Some(Proven {
                nonce: lc.nonce,
                cc,
            }),
            answered_by: self.answered(),
            repaired: false,
            one_round: true,
            restarts: 0,
            evidence: Vec::new(),
            unhelpful: Vec::new(),
        }))
    }

    fn on_filter(&mut self, from: Slot, ack: FilterAck) -> Step<ReadOutcome> {
        let n = self.config.n;
        let ReadPhase::Filter {
            replies, intact, ..
        } = &mut self.phase
        else {
            return Step::Continue(Vec::new());
        };
        let well_formed = match &ack {
            FilterAck::Entry {
                cc, vec, fragment, ..
            } => {
                cc.is_well_formed(n)
                    && vec.0.len() == n
                    && fragment.len() == cc.layout.fragment_len()
            }
            FilterAck::Superseded { ts, newer } => {
                newer.vec.0.len() == n && newer.ts.cmp_order(ts) == Ordering::Greater
            }
            _ => true,
        };
        // A malformed reply still speaks for its timestamp (it is "not lower"), but never vouches
        // and offers nothing.
        let ack = match ack {
            FilterAck::Entry { ts, .. } | FilterAck::Superseded { ts, .. } if !well_formed => {
                FilterAck::MacOnly { ts }
            }
            other => other,
        };
        // Only a first reply is hashed: a retransmitted one is dropped by `record` anyway.
        let fragment_intact = replies.missing().any(|node| node == from)
            && match &ack {
                FilterAck::Entry { fragment, cc, .. } => cc
                    .hashes
                    .get(from.index())
                    .is_some_and(|slot| fragment_digest(fragment) == *slot),
                _ => false,
            };
        if !replies.record(from, ack) {
            return Step::Continue(Vec::new());
        }
        if let Some(slot) = intact.get_mut(from.index()) {
            *slot = fragment_intact;
        }
        if !well_formed {
            self.blame(from, EvidenceKind::MalformedReply);
        }
        self.evaluate_filter()
    }

    fn evaluate_filter(&mut self) -> Step<ReadOutcome> {
        let (n, f, quorum) = (self.config.n, self.config.f, self.config.quorum());
        let ReadPhase::Filter {
            candidates,
            offers,
            replies,
            intact,
        } = &mut self.phase
        else {
            return Step::Continue(Vec::new());
        };
        // l. 153: drop c once n - f nodes answered strictly lower than c.ts.
        let excluded = |c: &Candidate| lower_count(replies, c) >= quorum;
        candidates.retain(|c| !excluded(c));
        // A correct node's `lc` is valid and so never excluded: an excluded offer convicts.
        let mut convicted = Vec::new();
        offers.retain(|offer| {
            let out = excluded(&offer.candidate);
            if out {
                convicted.extend(offer.by.iter().copied());
            }
            !out
        });
        let verdict = judge(
            &filter_set(candidates, offers),
            offers,
            replies,
            intact,
            &self.suspects,
            &convicted,
            &self.config,
        );
        for node in convicted {
            if !self.suspects.contains(&node) {
                self.suspects.push(node);
            }
            self.blame(node, EvidenceKind::FalseSupersession);
        }
        match verdict {
            Verdict::Wait => Step::Continue(Vec::new()),
            Verdict::Advance(new_offers) => {
                let ReadPhase::Filter {
                    candidates,
                    offers,
                    replies,
                    ..
                } = &mut self.phase
                else {
                    return Step::Continue(Vec::new());
                };
                let candidates = std::mem::take(candidates);
                // Offers shown valid are beaten by the new ones; undecided ones stay to be judged,
                // so every node stands behind at most one offer and FILTER sets stay within 2n.
                let mut offers = std::mem::take(offers);
                offers.retain(|offer| not_lower_count(replies, &offer.candidate) <= f);
                offers.extend(new_offers);
                self.attempt += 1;
                let request = filter_set(&candidates, &offers);
                self.phase = ReadPhase::Filter {
                    candidates,
                    offers,
                    replies: Replies::new(n),
                    intact: vec![false; n],
                };
                Step::Continue(self.broadcast(RequestBody::Filter {
                    candidates: request,
                }))
            }
            Verdict::Empty => {
                let answered_by = self.answered();
                self.finish(ReadOutcome {
                    value: None,
                    ts: None,
                    proven: None,
                    answered_by,
                    repaired: false,
                    one_round: false,
                    restarts: self.attempt - self.moved,
                    evidence: Vec::new(),
                    unhelpful: Vec::new(),
                })
            }
            Verdict::Selected { candidate, agreed } => self.restore_and_repair(candidate, agreed),
        }
    }

    /// RESTORE (l. 155) and, if the selected MAC vector is not the agreed one, REPAIR (l. 156–159).
    fn restore_and_repair(
        &mut self,
        mut candidate: Candidate,
        agreed: Agreed,
    ) -> Step<ReadOutcome> {
        let n = self.config.n;
        let ReadPhase::Filter {
            replies, intact, ..
        } = &self.phase
        else {
            return Step::Continue(Vec::new());
        };
        let mut fragments = Vec::new();
        let mut blamed = Vec::new();
        for (node, ack) in replies.present() {
            let FilterAck::Entry {
                ts,
                fragment,
                cc,
                nonce_hash,
                vec,
            } = ack
            else {
                continue;
            };
            if *ts != agreed.ts {
                continue;
            }
            if *cc != agreed.cc || *vec != agreed.vec || *nonce_hash != agreed.nonce_hash {
                blamed.push((node, EvidenceKind::ConflictingMetadata));
            } else if !intact[node.index()] {
                // `cc` is the agreed one, so this is the agreed slot the fragment missed.
                blamed.push((node, EvidenceKind::CorruptFragment));
            } else {
                fragments.push((node.index(), fragment.clone()));
            }
        }
        let answered_by: Vec<Slot> = replies.present().map(|(n, _)| n).collect();
        for (node, kind) in blamed {
            self.blame(node, kind);
        }
        let value = if agreed.cc.tombstone {
            None
        } else {
            match self.codec.decode(&agreed.cc.layout, &fragments) {
                Ok(value) => Some(value),
                Err(error) => {
                    self.phase = ReadPhase::Done;
                    return Step::Done(Err(ProtocolError::Coding(error.to_string())));
                }
            }
        };
        let repaired = candidate.vec != agreed.vec;
        let outcome = ReadOutcome {
            value,
            ts: Some(agreed.ts),
            proven: Some(Proven {
                nonce: candidate.nonce,
                cc: agreed.cc.clone(),
            }),
            answered_by,
            repaired,
            one_round: false,
            restarts: self.attempt - self.moved,
            evidence: Vec::new(),
            unhelpful: Vec::new(),
        };
        if !repaired {
            return self.finish(outcome);
        }
        candidate.vec = agreed.vec;
        self.phase = ReadPhase::Repair {
            candidate: candidate.clone(),
            replies: Replies::new(n),
            outcome,
        };
        Step::Continue(self.broadcast(RequestBody::Repair { candidate }))
    }

    fn on_repair(&mut self, from: Slot) -> Step<ReadOutcome> {
        let quorum = self.config.quorum();
        let ReadPhase::Repair {
            replies, outcome, ..
        } = &mut self.phase
        else {
            return Step::Continue(Vec::new());
        };
        if !replies.record(from, ()) || replies.count() < quorum {
            return Step::Continue(Vec::new());
        }
        let outcome = outcome.clone();
        self.finish(outcome)
    }

    fn finish(&mut self, mut outcome: ReadOutcome) -> Step<ReadOutcome> {
        outcome.evidence.append(&mut self.evidence);
        outcome.unhelpful.append(&mut self.unhelpful);
        self.phase = ReadPhase::Done;
        Step::Done(Ok(outcome))
    }
}

/// The FILTER termination rule (l. 152) with the §4.8(a) selection, and our rule for reads whose
/// candidates cannot become safe (garbage collection, see `server`'s module docs).
///
/// With `n - f` replies and nothing selectable, a "superseded" reply's `lc` that is newer than
/// every candidate is added and FILTER asked again. An offer is kept until `f+1` nodes answered
/// not lower than it (so a correct one holds something at least as new: it was valid) or until it
/// is excluded (then it was never a correct node's `lc`, and its makers are suspects whose offers
/// count no more). A node with an offer still undecided cannot offer again, so each Byzantine node
/// baits a read at most once, and every other offer raises the read's highest valid candidate.
fn judge(
    set: &[Candidate],
    offers: &[Offer],
    replies: &Replies<FilterAck>,
    intact: &[bool],
    suspects: &[Slot],
    convicted: &[Slot],
    config: &ClientConfig,
) -> Verdict {
    let (n, f, quorum) = (config.n, config.f, config.quorum());
    if replies.count() < quorum {
        return Verdict::Wait;
    }
    if set.is_empty() {
        return Verdict::Empty;
    }
    if let Some(selected) = select(set, replies, intact, n, f, config.mutations.any_twin) {
        return selected;
    }
    let undecided: Vec<&Offer> = offers
        .iter()
        .filter(|offer| not_lower_count(replies, &offer.candidate) <= f)
        .collect();
    let Some(highest) = set.iter().map(|c| &c.ts).max_by(|a, b| a.cmp_order(b)) else {
        return Verdict::Wait;
    };
    let mut fresh: Vec<Offer> = Vec::new();
    for (node, ack) in replies.present() {
        let FilterAck::Superseded { newer, .. } = ack else {
            continue;
        };
        let barred = suspects.contains(&node)
            || convicted.contains(&node)
            || undecided.iter().any(|offer| offer.by.contains(&node));
        if barred || newer.ts.cmp_order(highest) != Ordering::Greater {
            continue;
        }
        match fresh.iter_mut().find(|offer| offer.candidate == *newer) {
            Some(offer) => offer.by.push(node),
            None => fresh.push(Offer {
                candidate: newer.clone(),
                by: vec![node],
            }),
        }
    }
    if fresh.is_empty() || config.mutations.no_offers {
        Verdict::Wait
    } else {
        Verdict::Advance(fresh)
    }
}

/// FILTER replies strictly lower than `candidate`.
fn lower_count(replies: &Replies<FilterAck>, candidate: &Candidate) -> usize {
    replies
        .present()
        .filter(|(_, ack)| cmp_ts(ack.ts(), Some(&candidate.ts)) == Ordering::Less)
        .count()
}

/// FILTER replies not lower than `candidate`.
fn not_lower_count(replies: &Replies<FilterAck>, candidate: &Candidate) -> usize {
    replies.count() - lower_count(replies, candidate)
}

/// The candidates a FILTER round sends: what COLLECT found and what was offered, once each.
fn filter_set(candidates: &[Candidate], offers: &[Offer]) -> Vec<Candidate> {
    let mut set = candidates.to_vec();
    for offer in offers {
        if !set.contains(&offer.candidate) {
            set.push(offer.candidate.clone());
        }
    }
    set
}

/// `∃c ∈ C: highcand(c) ∧ safe(c)`, choosing only a candidate whose nonce hashes to the agreed `N̄`,
/// and among those one whose MAC vector already matches (no needless REPAIR).
fn select(
    candidates: &[Candidate],
    replies: &Replies<FilterAck>,
    intact: &[bool],
    n: usize,
    f: usize,
    any_twin: bool,
) -> Option<Verdict> {
    let highest = candidates
        .iter()
        .map(|c| &c.ts)
        .max_by(|a, b| a.cmp_order(b))?;
    let high: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.ts.cmp_order(highest) == Ordering::Equal)
        .collect();
    // Group the vouching replies: same (ts, cc, vec, N̄) and a fragment matching its own slot.
    let mut groups: Vec<(Agreed, usize)> = Vec::new();
    for (node, ack) in replies.present() {
        let FilterAck::Entry {
            ts,
            cc,
            nonce_hash,
            vec,
            ..
        } = ack
        else {
            continue;
        };
        if ts.cmp_order(highest) != Ordering::Equal || cc.hashes.len() != n {
            continue;
        }
        if !intact[node.index()] {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| {
            g.ts == *ts && g.cc == *cc && g.vec == *vec && g.nonce_hash == *nonce_hash
        }) {
            Some((_, count)) => *count += 1,
            None => groups.push((
                Agreed {
                    ts: *ts,
                    cc: cc.clone(),
                    vec: vec.clone(),
                    nonce_hash: *nonce_hash,
                },
                1,
            )),
        }
    }
    let mut fallback = None;
    for (agreed, count) in groups {
        if count < f + 1 {
            continue;
        }
        for candidate in &high {
            let nonce_ok = any_twin || candidate.nonce.commitment() == agreed.nonce_hash;
            if candidate.ts != agreed.ts || !nonce_ok {
                continue;
            }
            if candidate.vec == agreed.vec {
                return Some(Verdict::Selected {
                    candidate: (*candidate).clone(),
                    agreed,
                });
            }
            if fallback.is_none() {
                fallback = Some(Verdict::Selected {
                    candidate: (*candidate).clone(),
                    agreed: agreed.clone(),
                });
            }
        }
    }
    fallback
}

impl From<ProtocolError> for crate::machine::OpError {
    fn from(error: ProtocolError) -> Self {
        match error {
            ProtocolError::Refused { refusal, nodes } => crate::machine::OpError::Refused {
                reason: refusal.to_string(),
                by: nodes,
            },
            ProtocolError::Coding(text) => crate::machine::OpError::Failed(text),
        }
    }
}

fn progress<O, T>(step: Step<T>) -> crate::machine::Progress<O>
where
    O: crate::machine::Operation<Request = Request, Output = T>,
{
    match step {
        Step::Continue(sends) => crate::machine::Progress::Send(sends),
        Step::Done(result) => crate::machine::Progress::Done(result.map_err(Into::into)),
    }
}

/// Both PoWerStore operations keep the one operation contract; their inherent methods are that
/// contract under the paper's names.
macro_rules! powerstore_operation {
    ($op:ty, $output:ty) => {
        impl crate::machine::Operation for $op {
            const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::POWERSTORE;
            type Request = Request;
            type Reply = Response;
            type Output = $output;

            fn op(&self) -> u64 {
                self.op.0
            }

            fn start(&mut self) -> Vec<Outbound> {
                <$op>::start(self)
            }

            fn on_reply(&mut self, from: Slot, reply: Response) -> crate::machine::Progress<Self> {
                progress(self.on_response(from, reply))
            }

            fn on_timeout(&mut self) -> Vec<Outbound> {
                <$op>::on_timeout(self)
            }

            fn answered(&self) -> Vec<Slot> {
                <$op>::answered(self)
            }

            fn quorum(&self) -> usize {
                self.config.quorum()
            }

            fn stalled(&self) -> Option<String> {
                <$op>::stalled(self)
            }
        }
    };
}

powerstore_operation!(WriteOp, WriteOutcome);
powerstore_operation!(ReadOp, ReadOutcome);

// ---------------------------------------------------------------------------------------------
// Following a key into its group's next incarnation

/// Which refusals are not answers: the node is in another epoch, or still taking the key over.
fn turned(reply: &Response) -> Option<Turned> {
    match &reply.body {
        ResponseBody::Refused(Refusal::WrongEpoch { current }) => {
            Some(Turned::WrongEpoch { current: *current })
        }
        ResponseBody::Refused(Refusal::Transferring) => Some(Turned::Transferring),
        _ => None,
    }
}

/// Why a write moved to another incarnation ends there: its outcome is not the writer's to know.
const CUT_AFTER_NONCE: &str = "the key's group changed after the write revealed its nonce: \
     whether it took effect is decided by the transfer to the new group (read the key to learn)";

/// A write follows its key into the group's next incarnation (docs/state-transfer.md, "Writers
/// across an epoch change"). The timestamp CLOCK chose stands: a CLOCK in the old epoch took its
/// quorum before `2f+1` old members entered the new one, hence before any write of the new
/// incarnation completed, so the write is concurrent with every such write and ordering it by
/// its timestamp is linearizable. Its tag binds the key alone, so the new members check it.
///
/// - In CLOCK, the round starts again there.
/// - In STORE, the write stores again there under the same timestamp and nonce, with a MAC
///   vector for the new members: its nonce was never revealed, so no old member could prove
///   the version and no new member carried it over.
/// - After it revealed its nonce (COMPLETE), it ends: some old member may hold it proven and the
///   take-over decides whether it is carried. Storing it again would need a twin (step 4); the
///   same nonce again would let anyone who saw it prove a version the new members have not
///   stored.
///
/// A move needs the keys shared with the new members: a write without a [`WriterIdentity`]
/// ([`WriteOp::following`]) ends when its incarnation changes. An epoch that leaves the key's
/// group as it was starts the current round again there. Either way, replies to the requests of
/// the epoch left are not counted (a new attempt): no round completes on replies of two epochs.
impl Rebase for WriteOp {
    fn turned(reply: &Response) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: WriteOutcome, view: &GroupView) -> WriteOutcome {
        for slot in &mut output.acknowledged_by {
            *slot = node_slot(view, *slot);
        }
        output
    }

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, chain: &Chain) -> Progress<Self> {
        let (before, incarnation) = (self.config.epoch, self.config.incarnation);
        if let Err(error) = self.config.follow(&self.key, epoch, view, chain) {
            self.phase = WritePhase::Done;
            return Progress::Done(Err(error));
        }
        if epoch == before {
            return Progress::Send(self.retransmit());
        }
        if self.config.incarnation == incarnation {
            // The same members in the same order: the current round starts again, counting only
            // replies from the new epoch (a new attempt), and goes on as it was.
            self.attempt += 1;
            self.moved += 1;
            self.refusals = Refusals::new(self.config.n);
            let n = self.config.n;
            match &mut self.phase {
                WritePhase::Clock { replies, .. }
                | WritePhase::Store { replies }
                | WritePhase::Complete { replies } => *replies = Replies::new(n),
                WritePhase::Done => {}
            }
            return Progress::Send(self.retransmit());
        }
        let keys = self
            .identity
            .as_ref()
            .and_then(|identity| identity.keys_for(view.members(), chain));
        let Some(keys) = keys else {
            self.phase = WritePhase::Done;
            return Progress::Done(Err(OpError::Failed(format!(
                "the key moved to another group in epoch {} and the writer holds no keys for it",
                epoch.0
            ))));
        };
        self.keys = std::sync::Arc::new(keys);
        // Replies to the requests sent to the members before are not counted: a node in both
        // incarnations answers for the one it was asked about.
        self.attempt += 1;
        self.moved += 1;
        self.refusals = Refusals::new(self.config.n);
        let n = self.config.n;
        match &mut self.phase {
            WritePhase::Clock { .. } => {
                self.phase = WritePhase::Clock {
                    replies: Replies::new(n),
                    highest: None,
                };
                Progress::Send(self.broadcast(RequestBody::Clock))
            }
            WritePhase::Store { replies } => {
                *replies = Replies::new(n);
                let Some(prepared) = self.prepared.as_mut() else {
                    unreachable!("STORE follows a prepared timestamp")
                };
                prepared.vec = MacVec::compute(
                    &self.config.incarnation,
                    &self.key,
                    &prepared.ts,
                    &prepared.nonce_hash,
                    &self.keys.servers,
                );
                Progress::Send(self.stores())
            }
            WritePhase::Complete { .. } => {
                self.phase = WritePhase::Done;
                Progress::Done(Err(OpError::Unknown(CUT_AFTER_NONCE.to_string())))
            }
            WritePhase::Done => Progress::Send(Vec::new()),
        }
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}

/// A read follows its key into another epoch by reading there from the start, under a new
/// attempt: candidates and fragments of one incarnation say nothing in another (their MAC
/// vectors bind the old members, and a version carried over is valid only where it is held), and
/// a read has no effect anyone relies on until it returns. Evidence gathered in the epoch left is
/// not kept: it names slots of a group the read no longer talks to.
impl Rebase for ReadOp {
    fn turned(reply: &Response) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: ReadOutcome, view: &GroupView) -> ReadOutcome {
        for slot in output.answered_by.iter_mut().chain(&mut output.unhelpful) {
            *slot = node_slot(view, *slot);
        }
        for evidence in &mut output.evidence {
            evidence.node = node_slot(view, evidence.node);
        }
        output
    }

    fn rebase(&mut self, epoch: Epoch, view: &GroupView, chain: &Chain) -> Progress<Self> {
        let before = self.config.epoch;
        if let Err(error) = self.config.follow(&self.key, epoch, view, chain) {
            self.phase = ReadPhase::Done;
            return Progress::Done(Err(error));
        }
        if epoch == before {
            return Progress::Send(self.retransmit());
        }
        self.attempt += 1;
        self.moved += 1;
        let n = self.config.n;
        self.phase = ReadPhase::Collect {
            replies: Replies::new(n),
            candidates: Vec::new(),
        };
        self.refusals = Refusals::new(n);
        self.evidence.clear();
        self.suspects.clear();
        self.unhelpful.clear();
        self.ask_fragments_of(&[]);
        Progress::Send(self.start())
    }

    fn epoch(&self) -> Epoch {
        self.config.epoch
    }
}
