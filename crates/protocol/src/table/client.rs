//! The client of a table: it trusts no proxy and no replica, only signatures it checked itself
//! (spec §3.2-§3.6). A write succeeds with a quorum of valid acknowledgements from distinct
//! members of the row's group; a read with a quorum of valid answers that agree, or with a
//! resolution it re-derives from the original answers and a quorum of replicas known current.
//!
//! When a reply falls short, the client re-asks the same proxy (for acknowledgements from
//! replicas not heard yet, or for a read without the replicas whose signatures failed) while
//! that brings new valid signatures, at most `f` times; then it moves to the next member of the
//! group as proxy. Replies from every proxy it asked count: signatures are what it checks, not
//! who relayed them.

use super::{
    Answer, Answered, Cell, Consistency, Grace, Nonce, Page, PairKeys, Place, Position, Range,
    RangeAnswered, RangeWriteBackAck, Refusal, Replication, Request, RequestBody, Resolver,
    Response, ResponseBody, Revocation, RowKey, Schema, SignedCell, TableMutations, Variant,
    WriteAck, WriteBackAck, Writers, check_page, entries_of, listing_digest, resolve, without,
};
use crate::machine::{OpError, Operation, Progress};
use crate::round::{Evidence, EvidenceKind, OpId, Refusals, Replies};
use bulwark_core::sign::{PublicKey, Signable, Unverified};
use bulwark_core::{Digest, ServiceId, Slot, Tag};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Retransmissions to one proxy that hear nothing before the client moves to the next: the
/// first, since a proxy answers within its own wait, shorter than the driver's retransmission.
const SILENT_TIMEOUTS_MAX: u32 = 1;

/// What both operations share: the group, the proxy in use and the bookkeeping of moving on.
struct Proxies {
    place: Place,
    keys: Arc<[PublicKey]>,
    op: u64,
    /// The proxy asked now.
    proxy: Slot,
    /// Proxies asked so far, counting re-asks of one as one.
    tried: usize,
    /// Re-asks of the current proxy.
    retries: usize,
    /// Timeouts since the current proxy last answered.
    silent: u32,
    answered: BTreeSet<Slot>,
    /// Every proxy sent a request.
    asked: BTreeSet<Slot>,
    refusals: Refusals<Refusal>,
    evidence: Vec<Evidence>,
    mutations: TableMutations,
    /// The table's variant: what is signed, and the quorums.
    variant: Variant,
    /// The MAC keys this client shares with each member, by slot (Half-Sym and Full-Sym).
    pairs: Option<Arc<[PairKeys]>>,
    /// How the table is replicated, and the members that hold it: only theirs count.
    replication: Replication,
    replicas: Vec<Slot>,
}

impl Proxies {
    fn new(place: Place, keys: Arc<[PublicKey]>, op: OpId, proxy: Slot) -> Proxies {
        assert_eq!(keys.len(), place.n, "a key per member");
        Proxies {
            place,
            keys,
            op: op.0,
            proxy: Slot(proxy.0 % place.n as u32),
            tried: 1,
            retries: 0,
            silent: 0,
            answered: BTreeSet::new(),
            asked: BTreeSet::new(),
            refusals: Refusals::new(place.n),
            evidence: Vec::new(),
            mutations: TableMutations::default(),
            variant: Variant::ProxyVerifies,
            pairs: None,
            replication: Replication::Strong,
            replicas: (0..place.n as u32).map(Slot).collect(),
        }
    }

    fn quorum(&self, level: Consistency) -> usize {
        let (n, f) = (self.place.n, self.place.f);
        self.replication
            .threshold(&self.mutations, self.variant, level, n, f)
    }

    /// Whether `slot`'s statements may count: a member holding the table (spec §5.1 item 2).
    fn counts(&self, slot: Slot) -> bool {
        self.replicas.contains(&slot)
    }

    fn request(&mut self, body: RequestBody) -> Vec<(Slot, Request)> {
        self.asked.insert(self.proxy);
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            body,
        };
        vec![(self.proxy, request)]
    }

    fn next(&mut self) {
        self.proxy = Slot((self.proxy.0 + 1) % self.place.n as u32);
        self.tried += 1;
        self.retries = 0;
        self.silent = 0;
    }

    /// `signed` decoded, if it is slot `slot`'s valid statement satisfying `check` (in the
    /// unsigned variants, any statement satisfying it).
    fn verify<T: Signable>(
        &self,
        slot: Slot,
        signed: &Unverified<T>,
        check: impl FnOnce(&T) -> bool,
    ) -> Option<T> {
        let statement = if !self.variant.signs() {
            signed.peek().ok()?
        } else if signed.is_mac() {
            if !self.variant.macs_to_client() {
                return None;
            }
            let keys = self.pairs.as_ref()?.get(slot.index())?;
            signed.verify_mac(&keys.to_client).ok()?
        } else {
            let key = self.keys.get(slot.index())?;
            signed.clone().verify(key).ok()?.into_value()
        };
        check(&statement).then_some(statement)
    }

    /// Evidence that `node` vouched for a cell whose writer's signature fails. Not under
    /// Full-Sym, where a correct replica keeps a Byzantine writer's cell on its tag until it
    /// checks the signature (spec §5.1 item 15): there it proves nothing against the node.
    fn vouched_for_forgery(&mut self, node: Slot) {
        if !self.variant.macs_from_client() {
            self.evidence.push(Evidence {
                node,
                kind: EvidenceKind::ForgedVersion,
            });
        }
    }

    /// Whether `signed` is a cell its writer signed (in the unsigned variants, any cell).
    fn genuine(&self, writers: &Writers, signed: &SignedCell) -> bool {
        self.mutations.unverified_cells
            || if self.variant.signs() {
                writers.verify(signed).is_some()
            } else {
                signed.peek().is_ok()
            }
    }

    /// A refusal from `from`: the operation ends once `f+1` proxies refused.
    fn refused(&mut self, from: Slot, refusal: Refusal) -> Option<OpError> {
        let (reason, by) = self.refusals.record(from, refusal, self.place.f)?;
        Some(OpError::Refused {
            reason: reason.to_string(),
            by,
        })
    }

    /// A proxy's refusal: the operation's end once `f+1` proxies refused; else whether the
    /// current proxy refused, so the client moved to the next and asks it.
    fn on_refusal(&mut self, from: Slot, refusal: Refusal) -> Result<bool, OpError> {
        if let Some(error) = self.refused(from, refusal) {
            return Err(error);
        }
        if from == self.proxy {
            self.next();
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether to re-ask the current proxy after a reply from it that fell short of `want`
    /// with `valid` statements that verify: when the rest could be `f` faulty replicas' (`f+1`
    /// of the `2f+1` a quorum of `3f+1` needs; one of the `f+1` an eventual table needs, all a
    /// correct proxy that asked one faulty replica can show).
    fn retry_here(&mut self, from: Slot, progress: bool, valid: usize, want: usize) -> bool {
        if from != self.proxy {
            return false;
        }
        if progress && valid + self.place.f >= want && self.retries < self.place.f {
            self.retries += 1;
            true
        } else {
            self.next();
            false
        }
    }

    fn on_timeout(&mut self) {
        self.silent += 1;
        if self.silent >= SILENT_TIMEOUTS_MAX {
            self.next();
        }
    }

    /// Proxies asked that never answered: the client's driver avoids them for a while.
    fn silent(&self) -> Vec<Slot> {
        self.asked.difference(&self.answered).copied().collect()
    }

    fn heard(&mut self, from: Slot) {
        self.answered.insert(from);
        if from == self.proxy {
            self.silent = 0;
        }
    }
}

/// `with_mutations` and `with_variant` for an operation that goes through [`Proxies`].
macro_rules! through_proxies {
    ($($op:ty),*) => {$(
        impl $op {
            /// The same operation with deliberate breakage (negative controls only).
            pub fn with_mutations(mut self, mutations: TableMutations) -> $op {
                self.proxies.mutations = mutations;
                self
            }

            /// The same operation for a table of `variant` (a signing one unless told).
            pub fn with_variant(mut self, variant: Variant) -> $op {
                self.proxies.variant = variant;
                self
            }

            /// The same operation for `schema`'s table: its variant, and the members that
            /// hold it and the quorums they make.
            pub fn for_table(mut self, schema: &Schema) -> $op {
                let place = self.proxies.place;
                self.proxies.variant = schema.variant;
                self.proxies.replication = schema.replication;
                self.proxies.replicas = schema.replicas(place.n, place.f);
                self
            }

            /// The same operation with the MAC keys this client shares with each member of the
            /// group, by slot: what Half-Sym and Full-Sym need.
            pub fn with_pair_keys(mut self, pairs: Arc<[PairKeys]>) -> $op {
                if pairs.len() == self.proxies.place.n {
                    self.proxies.pairs = Some(pairs);
                }
                self
            }
        }
    )*};
}

through_proxies!(WriteOp, ReadOp, RangeOp);

/// A completed write: the acknowledgements that prove it.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// Valid acknowledgements as received, by replica: a quorum of distinct members. Anyone
    /// holding the group's keys can check them again.
    pub acks: Vec<(Slot, Unverified<WriteAck>)>,
    /// Proxies asked, counting re-asks of one as one.
    pub proxies: usize,
    /// Proxies asked that never answered.
    pub silent: Vec<Slot>,
    /// Misbehaviour proven along the way.
    pub evidence: Vec<Evidence>,
}

/// A hardened write (Figures 5 and 19): the cells go to a proxy, which stores them on the row's
/// replicas; done at a quorum of acknowledgements the client verified, each bound to these
/// cells' digests.
pub struct WriteOp {
    proxies: Proxies,
    cells: Vec<SignedCell>,
    digests: Vec<Digest>,
    level: Consistency,
    acks: BTreeMap<Slot, Unverified<WriteAck>>,
    /// Replicas whose acknowledgements failed: not asked again.
    bad: BTreeSet<Slot>,
    /// Full-Sym: this client's tag over the cells for each member, by slot.
    tags: Vec<Tag>,
}

impl WriteOp {
    /// A write of `cells` (one row's, each signed by this client) to the group at `place`,
    /// checking acknowledgements against the group's `keys`, through `proxy` first.
    pub fn new(
        place: Place,
        keys: Arc<[PublicKey]>,
        op: OpId,
        cells: Vec<SignedCell>,
        level: Consistency,
        proxy: Slot,
    ) -> WriteOp {
        let digests = cells.iter().map(Cell::digest).collect();
        WriteOp {
            proxies: Proxies::new(place, keys, op, proxy),
            cells,
            digests,
            level,
            acks: BTreeMap::new(),
            bad: BTreeSet::new(),
            tags: Vec::new(),
        }
    }

    fn needed(&self) -> usize {
        if self.proxies.mutations.accept_f_plus_one {
            self.proxies.place.f + 1
        } else {
            self.proxies.quorum(self.level)
        }
    }

    fn request(&mut self) -> Vec<(Slot, Request)> {
        let skip: Vec<Slot> = self.acks.keys().chain(&self.bad).copied().collect();
        let want = self.needed().saturating_sub(self.acks.len()).max(1);
        if self.proxies.variant.macs_from_client()
            && self.tags.is_empty()
            && let Some(pairs) = &self.proxies.pairs
        {
            self.tags = pairs
                .iter()
                .map(|keys| keys.write_tag(&self.cells))
                .collect();
        }
        self.proxies.request(RequestBody::Write {
            cells: self.cells.clone(),
            level: self.level,
            skip,
            want: want as u32,
            tags: self.tags.clone(),
        })
    }

    /// A bad acknowledgement blames proxy or replica alike, so a new proxy starts with a clean
    /// slate (spec §3.4): only acknowledgements already verified carry over.
    fn moved_on(&mut self, tried: usize) {
        if self.proxies.tried != tried {
            self.bad.clear();
        }
    }

    fn done(&mut self) -> Progress<Self> {
        Progress::Done(Ok(WriteOutcome {
            acks: std::mem::take(&mut self.acks).into_iter().collect(),
            proxies: self.proxies.tried,
            silent: self.proxies.silent(),
            evidence: std::mem::take(&mut self.proxies.evidence),
        }))
    }
}

impl Operation for WriteOp {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Output = WriteOutcome;

    fn op(&self) -> u64 {
        self.proxies.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.request()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.proxies.op {
            return Progress::Send(Vec::new());
        }
        self.proxies.heard(from);
        let acks = match reply.body {
            ResponseBody::Acks(acks) => acks,
            ResponseBody::Refused(refusal) => {
                let tried = self.proxies.tried;
                return match self.proxies.on_refusal(from, refusal) {
                    Err(error) => Progress::Done(Err(error)),
                    Ok(true) => {
                        self.moved_on(tried);
                        Progress::Send(self.request())
                    }
                    Ok(false) => Progress::Send(Vec::new()),
                };
            }
            ResponseBody::Read { .. }
            | ResponseBody::Range { .. }
            | ResponseBody::Created
            | ResponseBody::Schema(_) => {
                return Progress::Send(Vec::new());
            }
        };
        let (epoch, group) = (self.proxies.place.epoch, self.proxies.place.group);
        let mut new = 0;
        for (slot, ack) in acks {
            if !self.proxies.counts(slot) || self.acks.contains_key(&slot) {
                continue;
            }
            let digests = &self.digests;
            let verified = self.proxies.verify(slot, &ack, |ack| {
                ack.slot == slot
                    && ack.epoch == epoch
                    && ack.group == group
                    && ack.cells == *digests
            });
            match verified {
                Some(_) => {
                    self.acks.insert(slot, ack);
                    self.bad.remove(&slot);
                    new += 1;
                }
                // Proxy or replica: either could have made it bad (spec §2.8), so no blame.
                None => {
                    self.bad.insert(slot);
                }
            }
        }
        if self.acks.len() >= self.needed() {
            return self.done();
        }
        if from != self.proxies.proxy {
            // A late reply from a proxy asked before; the current one is still at work.
            return Progress::Send(Vec::new());
        }
        let tried = self.proxies.tried;
        self.proxies
            .retry_here(from, new > 0, self.acks.len(), self.needed());
        self.moved_on(tried);
        Progress::Send(self.request())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let tried = self.proxies.tried;
        self.proxies.on_timeout();
        self.moved_on(tried);
        self.request()
    }

    fn answered(&self) -> Vec<Slot> {
        self.proxies.answered.iter().copied().collect()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// How a read ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPath {
    /// A quorum of answers agreed.
    Fast,
    /// They did not: the proxy resolved, and brought stale replicas up to date.
    Resolved {
        /// Replicas that acknowledged the write-back.
        written_back: usize,
    },
}

/// A completed read.
#[derive(Clone, Debug)]
pub struct ReadOutcome {
    /// The newest cell of each column asked for that any replica of the quorum holds, in
    /// column order; a tombstone is a cell with no value.
    pub cells: Vec<Cell>,
    /// How it ended.
    pub path: ReadPath,
    /// Proxies asked, counting re-asks of one as one.
    pub proxies: usize,
    /// Proxies asked that never answered.
    pub silent: Vec<Slot>,
    /// Misbehaviour proven along the way: replicas that signed answers holding forged cells.
    pub evidence: Vec<Evidence>,
}

/// One version of a cell among the original answers, with the replicas that answered it.
type Version<'a> = (&'a Cell, &'a SignedCell, Vec<Slot>);

/// One valid answer, decoded, with its cells when it carried them and they match it.
struct Valid {
    answer: Answer,
    cells: Option<Vec<(Cell, SignedCell)>>,
}

/// A hardened read (Figures 7 and 20, with spec §3.6's check of a resolution).
pub struct ReadOp {
    proxies: Proxies,
    writers: Arc<Writers>,
    row: RowKey,
    columns: Vec<String>,
    nonce: Nonce,
    level: Consistency,
    /// Replicas whose signatures failed (spec §3.5): it only grows.
    blacklist: BTreeSet<Slot>,
    /// Ask every replica for data on the next request.
    full: bool,
    /// Cells already found forged, so each is blamed once.
    forged: BTreeSet<Vec<u8>>,
    grace: Grace,
    authority: Option<PublicKey>,
    resolver: Resolver,
    /// With the client resolving: the current proxy's data answers, and the resolution being
    /// written back with the members found current.
    writing_back: Option<WritingBack>,
}

/// A client's own resolution on its way back to the replicas (spec §3.6).
struct WritingBack {
    originals: Vec<(Slot, Answered)>,
    cells: Vec<SignedCell>,
    current: Vec<Slot>,
}

/// `with_grace_line` for the reads that resolve versions.
macro_rules! resolves_versions {
    ($($op:ty),*) => {$(
        impl $op {
            /// The same read, passing over versions stamped before `line` (microseconds on the
            /// cells' clock: now less the table's GC grace) that fewer than `f+1` answers hold
            /// ([`Grace`]). Set it a little later than the replicas' line (by the clock skew
            /// allowed): a version passed over by either is never written back by correct
            /// replicas, so the read would fail rather than return it.
            pub fn with_grace_line(mut self, line: u64) -> $op {
                self.grace.line = line;
                self
            }

            /// The same read, taking the revocations `authority` signed that a proxy sends
            /// with its answers: their writers' versions are passed over where fewer than
            /// `f+1` answers hold them, as the proxy did ([`Revocation`]).
            pub fn with_authority(mut self, authority: PublicKey) -> $op {
                self.authority = Some(authority);
                self
            }

            /// Takes the revocations among `revocations` that the authority signed.
            fn learn(&mut self, revocations: Vec<Unverified<Revocation>>) {
                let Some(authority) = &self.authority else {
                    return;
                };
                if self.proxies.mutations.ignore_revocations {
                    return;
                }
                for revocation in revocations.into_iter().take(super::REVOKED_MAX) {
                    let known = revocation
                        .peek()
                        .is_ok_and(|order| self.grace.revoked.contains(&order.client));
                    if known {
                        continue;
                    }
                    if let Ok(order) = revocation.verify(authority) {
                        self.grace.revoked.insert(order.value().client);
                    }
                }
            }
        }
    )*};
}

resolves_versions!(ReadOp, RangeOp);

impl ReadOp {
    /// A read of `columns` (all when empty) of `row` in the group at `place`, checking answers
    /// against the group's `keys` and cells against `writers`, with a fresh `nonce`, through
    /// `proxy` first.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        place: Place,
        keys: Arc<[PublicKey]>,
        writers: Arc<Writers>,
        op: OpId,
        row: RowKey,
        columns: Vec<String>,
        nonce: Nonce,
        level: Consistency,
        proxy: Slot,
    ) -> ReadOp {
        ReadOp {
            proxies: Proxies::new(place, keys, op, proxy),
            writers,
            row,
            columns,
            nonce,
            level,
            blacklist: BTreeSet::new(),
            full: false,
            forged: BTreeSet::new(),
            grace: Grace {
                live: place.f + 1,
                ..Grace::default()
            },
            authority: None,
            resolver: Resolver::Proxy,
            writing_back: None,
        }
    }

    /// The same read, resolving disagreeing answers itself (spec §2.9, Figure 21): no proxy
    /// then verifies a writer's signature for it.
    pub fn with_resolver(mut self, resolver: Resolver) -> ReadOp {
        self.resolver = resolver;
        self
    }

    fn request(&mut self) -> Vec<(Slot, Request)> {
        let body = match &self.writing_back {
            Some(back) => RequestBody::WriteBack {
                row: self.row.clone(),
                nonce: self.nonce,
                cells: back.cells.clone(),
                current: back.current.clone(),
                level: self.level,
            },
            None => RequestBody::Read {
                row: self.row.clone(),
                columns: self.columns.clone(),
                nonce: self.nonce,
                level: self.level,
                blacklist: self.blacklist.iter().copied().collect(),
                full: self.full,
                resolver: self.resolver,
            },
        };
        self.proxies.request(body)
    }

    /// The client's own resolution of a quorum of data answers (spec §3.6): per column, the
    /// newest version whose writer's signature verifies, passing over one past the grace that
    /// too few answers hold; with the members whose answers already hold exactly it.
    fn resolve_here(&self, valid: &BTreeMap<Slot, Valid>) -> Option<(Vec<SignedCell>, Vec<Slot>)> {
        let originals: Vec<&Vec<(Cell, SignedCell)>> =
            valid.values().filter_map(|v| v.cells.as_ref()).collect();
        if originals.len() < self.proxies.quorum(self.level) {
            return None;
        }
        let mut versions: Vec<(&Cell, &SignedCell, usize)> = Vec::new();
        for (cell, signed) in originals.iter().copied().flatten() {
            match versions
                .iter_mut()
                .find(|(_, s, _)| s.bytes() == signed.bytes())
            {
                Some((_, _, holders)) => *holders += 1,
                None => versions.push((cell, signed, 1)),
            }
        }
        versions.sort_by(|a, b| b.0.rank().cmp(&a.0.rank()));
        let mut best: BTreeMap<&str, (&Cell, &SignedCell)> = BTreeMap::new();
        let mut passed = BTreeSet::new();
        for (cell, signed, holders) in versions {
            let wanted = self.columns.is_empty() || self.columns.contains(&cell.column);
            if !wanted || cell.row != self.row || best.contains_key(cell.column.as_str()) {
                continue;
            }
            if self.grace.passes_over(cell, || holders) {
                passed.insert(Cell::digest(signed));
            } else if self.proxies.genuine(&self.writers, signed) {
                best.insert(cell.column.as_str(), (cell, signed));
            }
        }
        let entries = entries_of(best.values().copied());
        let current = valid
            .iter()
            .filter(|(_, v)| without(&v.answer.entries, &passed) == entries)
            .map(|(slot, _)| *slot)
            .collect();
        let cells = best
            .into_values()
            .map(|(_, signed)| signed.clone())
            .collect();
        Some((cells, current))
    }

    /// The answers that verify as their slot's, for this row and nonce; the others blacklisted.
    fn valid_answers(&mut self, answers: Vec<(Slot, Answered)>) -> BTreeMap<Slot, Valid> {
        let (epoch, group) = (self.proxies.place.epoch, self.proxies.place.group);
        let mut valid = BTreeMap::new();
        for (slot, answered) in answers {
            if !self.proxies.counts(slot)
                || self.blacklist.contains(&slot)
                || valid.contains_key(&slot)
            {
                continue;
            }
            let (row, nonce) = (&self.row, self.nonce);
            let verified = self.proxies.verify(slot, &answered.answer, |answer| {
                answer.slot == slot
                    && answer.epoch == epoch
                    && answer.group == group
                    && answer.row == *row
                    && answer.nonce == nonce
            });
            let Some(verified) = verified else {
                self.blacklist.insert(slot);
                continue;
            };
            let answer = verified;
            // Cells that are not the ones the answer names were swapped by someone: the answer
            // still counts, as a digest.
            let cells = answered.cells.and_then(|cells| {
                let decoded: Vec<(Cell, SignedCell)> = cells
                    .into_iter()
                    .map(|signed| Some((signed.peek().ok()?, signed)))
                    .collect::<Option<_>>()?;
                let matches = decoded.iter().all(|(cell, _)| cell.row == self.row)
                    && entries_of(decoded.iter().map(|(c, s)| (c, s))) == answer.entries;
                matches.then_some(decoded)
            });
            valid.insert(slot, Valid { answer, cells });
        }
        valid
    }

    /// Judges a fast-path reply: a quorum of matching answers, one carrying the cells.
    fn fast(&self, valid: &BTreeMap<Slot, Valid>) -> Option<Vec<Cell>> {
        let first = valid.values().next()?;
        let agree = valid
            .values()
            .all(|v| v.answer.entries == first.answer.entries);
        if !agree || valid.len() < self.proxies.quorum(self.level) {
            return None;
        }
        let cells = valid.values().find_map(|v| v.cells.as_ref())?;
        Some(cells.iter().map(|(cell, _)| cell.clone()).collect())
    }

    /// Judges a resolved reply (spec §3.6 [R]): the resolution must be the newest genuine
    /// version of each cell among a quorum of original data answers, and a quorum of replicas
    /// must hold it (their original answer, or a write-back acknowledgement for this read).
    fn resolved(
        &mut self,
        valid: &BTreeMap<Slot, Valid>,
        resolved: Vec<SignedCell>,
        write_backs: Vec<(Slot, Unverified<WriteBackAck>)>,
    ) -> Option<(Vec<Cell>, usize)> {
        let quorum = self.proxies.quorum(self.level);
        let mut decoded: Vec<(Cell, SignedCell)> = Vec::new();
        for signed in resolved {
            let cell = signed.peek().ok()?;
            let wanted = self.columns.is_empty() || self.columns.contains(&cell.column);
            if cell.row != self.row
                || !wanted
                || decoded.iter().any(|(c, _)| c.column == cell.column)
            {
                return None;
            }
            decoded.push((cell, signed));
        }
        let entries = entries_of(decoded.iter().map(|(c, s)| (c, s)));
        let originals: Vec<(Slot, &Vec<(Cell, SignedCell)>)> = valid
            .iter()
            .filter_map(|(slot, v)| Some((*slot, v.cells.as_ref()?)))
            .collect();
        if originals.len() < quorum {
            return None;
        }
        // Every version of every column the originals hold, newest first.
        let mut candidates: BTreeMap<&str, Vec<Version>> = BTreeMap::new();
        for (slot, cells) in &originals {
            for (cell, signed) in cells.iter() {
                let versions = candidates.entry(cell.column.as_str()).or_default();
                match versions
                    .iter_mut()
                    .find(|(_, s, _)| s.bytes() == signed.bytes())
                {
                    Some((_, _, holders)) => holders.push(*slot),
                    None => versions.push((cell, signed, vec![*slot])),
                }
            }
        }
        if decoded
            .iter()
            .any(|(cell, _)| !candidates.contains_key(cell.column.as_str()))
        {
            return None;
        }
        let mut forged = Vec::new();
        let mut passed = BTreeSet::new();
        for (column, versions) in &mut candidates {
            versions.sort_by(|a, b| b.0.rank().cmp(&a.0.rank()));
            let chosen = decoded.iter().find(|(cell, _)| cell.column == *column);
            let mut matched = false;
            for (cell, signed, holders) in versions.iter() {
                let genuine = self.proxies.genuine(&self.writers, signed);
                let is_chosen = chosen.is_some_and(|(_, c)| c.bytes() == signed.bytes());
                if genuine {
                    // The newest genuine version must be the one resolved; one past the grace
                    // that too few hold may be passed over (the proxy's clock may be ahead).
                    if is_chosen {
                        matched = true;
                        break;
                    }
                    if self.grace.passes_over(cell, || holders.len()) {
                        passed.insert(Cell::digest(signed));
                        continue;
                    }
                    return None;
                }
                if is_chosen {
                    return None;
                }
                forged.push((signed.bytes().to_vec(), holders.clone()));
            }
            if !matched && chosen.is_some() {
                return None;
            }
        }
        for (bytes, holders) in forged {
            if self.forged.insert(bytes) {
                for node in holders {
                    self.proxies.vouched_for_forgery(node);
                }
            }
        }
        let (epoch, group) = (self.proxies.place.epoch, self.proxies.place.group);
        let mut current: BTreeSet<Slot> = valid
            .iter()
            .filter(|(_, v)| without(&v.answer.entries, &passed) == entries)
            .map(|(slot, _)| *slot)
            .collect();
        let mut written_back = 0;
        for (slot, ack) in write_backs {
            if !self.proxies.counts(slot) || current.contains(&slot) {
                continue;
            }
            let (row, nonce) = (&self.row, self.nonce);
            let good = self.proxies.verify(slot, &ack, |ack| {
                ack.slot == slot
                    && ack.epoch == epoch
                    && ack.group == group
                    && ack.row == *row
                    && ack.nonce == nonce
                    && ack.entries == entries
            });
            if good.is_some() {
                current.insert(slot);
                written_back += 1;
            }
        }
        if current.len() < quorum && !self.proxies.mutations.skip_write_back {
            return None;
        }
        Some((
            decoded.into_iter().map(|(cell, _)| cell).collect(),
            written_back,
        ))
    }

    /// The blacklist is the current proxy's (spec §3.5): a bad signature blames proxy or
    /// replica alike, so a new proxy starts with a clean slate.
    fn moved_on(&mut self, tried: usize) {
        if self.proxies.tried != tried {
            self.blacklist.clear();
            self.full = false;
            self.writing_back = None;
        }
    }

    fn done(&mut self, cells: Vec<Cell>, path: ReadPath) -> Progress<Self> {
        Progress::Done(Ok(ReadOutcome {
            cells,
            path,
            proxies: self.proxies.tried,
            silent: self.proxies.silent(),
            evidence: std::mem::take(&mut self.proxies.evidence),
        }))
    }
}

impl Operation for ReadOp {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Output = ReadOutcome;

    fn op(&self) -> u64 {
        self.proxies.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.request()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.proxies.op {
            return Progress::Send(Vec::new());
        }
        self.proxies.heard(from);
        let (answers, resolved, write_backs) = match reply.body {
            ResponseBody::Read {
                answers,
                resolved,
                write_backs,
                revocations,
            } => {
                self.learn(revocations);
                (answers, resolved, write_backs)
            }
            ResponseBody::Refused(refusal) => {
                let tried = self.proxies.tried;
                return match self.proxies.on_refusal(from, refusal) {
                    Err(error) => Progress::Done(Err(error)),
                    Ok(true) => {
                        self.moved_on(tried);
                        Progress::Send(self.request())
                    }
                    Ok(false) => Progress::Send(Vec::new()),
                };
            }
            ResponseBody::Acks(_)
            | ResponseBody::Range { .. }
            | ResponseBody::Created
            | ResponseBody::Schema(_) => {
                return Progress::Send(Vec::new());
            }
        };
        let blacklisted = self.blacklist.len();
        // The answer to a write-back of the client's own resolution carries no answers: the
        // original ones are the client's.
        let writing_back = self.writing_back.take();
        let was_writing_back = writing_back.is_some();
        let (answers, kept, written_back) = match writing_back {
            Some(back)
                if from == self.proxies.proxy && answers.is_empty() && resolved.is_some() =>
            {
                (back.originals, None, true)
            }
            back => (answers, back, false),
        };
        self.writing_back = kept;
        // Resolve here only from the answers to a read: a write-back that fell short, or a
        // proxy that answers one with anything else, is a failed try (no loop it can hold).
        let originals = (self.resolver == Resolver::Client && !written_back && !was_writing_back)
            .then(|| answers.clone());
        let valid = self.valid_answers(answers);
        let outcome = match resolved {
            None => self.fast(&valid).map(|cells| (cells, ReadPath::Fast)),
            Some(resolved) => self
                .resolved(&valid, resolved, write_backs)
                .map(|(cells, written_back)| (cells, ReadPath::Resolved { written_back })),
        };
        if outcome.is_none()
            && from == self.proxies.proxy
            && let Some(originals) = originals
            && let Some((cells, current)) = self.resolve_here(&valid)
        {
            if let Some((cells, _)) = self.resolved(&valid, cells.clone(), Vec::new()) {
                // A quorum holds the resolution already (it differs from the others only by
                // versions passed over): nothing to write back.
                return self.done(cells, ReadPath::Resolved { written_back: 0 });
            }
            self.writing_back = Some(WritingBack {
                originals,
                cells,
                current,
            });
            return Progress::Send(self.request());
        }
        if let Some((cells, path)) = outcome {
            return self.done(cells, path);
        }
        let grew = self.blacklist.len() > blacklisted;
        if grew {
            // Without the replicas that failed, every remaining one sends data (spec §3.5).
            self.full = true;
        }
        if from != self.proxies.proxy {
            return Progress::Send(Vec::new());
        }
        let tried = self.proxies.tried;
        let want = self.proxies.quorum(self.level);
        self.proxies.retry_here(from, grew, valid.len(), want);
        self.moved_on(tried);
        Progress::Send(self.request())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let tried = self.proxies.tried;
        self.proxies.on_timeout();
        self.moved_on(tried);
        self.request()
    }

    fn answered(&self) -> Vec<Slot> {
        self.proxies.answered.iter().copied().collect()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// A completed page of a range read.
#[derive(Clone, Debug)]
pub struct RangeOutcome {
    /// The rows in scan order, each with the newest cell of each column asked for that any
    /// replica of the quorum holds; a tombstone is a cell with no value, and a row of
    /// tombstones is a deleted row.
    pub rows: Vec<(RowKey, Vec<Cell>)>,
    /// Where the next page starts; `None` when the range is done (in this group).
    pub next: Option<Position>,
    /// Replicas that acknowledged the write-back of this page.
    pub written_back: usize,
    /// Proxies asked, counting re-asks of one as one.
    pub proxies: usize,
    /// Proxies asked that never answered.
    pub silent: Vec<Slot>,
    /// Misbehaviour proven along the way: replicas that signed answers holding forged cells.
    pub evidence: Vec<Evidence>,
}

/// A page of a range read: the client resolves for itself from a quorum of signed pages (the
/// proxy only relays them and runs the write-back), so what it checks is what it returns.
pub struct RangeOp {
    proxies: Proxies,
    writers: Arc<Writers>,
    range: Range,
    nonce: Nonce,
    level: Consistency,
    /// Replicas whose signatures or pages failed (spec §3.5).
    blacklist: BTreeSet<Slot>,
    /// Cells already found forged, so each is blamed once.
    forged: BTreeSet<Vec<u8>>,
    grace: Grace,
    authority: Option<PublicKey>,
}

impl RangeOp {
    /// A page of `range` from the group at `place`, checking answers against the group's
    /// `keys` and cells against `writers`, with a fresh `nonce`, through `proxy` first.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        place: Place,
        keys: Arc<[PublicKey]>,
        writers: Arc<Writers>,
        op: OpId,
        range: Range,
        nonce: Nonce,
        level: Consistency,
        proxy: Slot,
    ) -> RangeOp {
        RangeOp {
            proxies: Proxies::new(place, keys, op, proxy),
            writers,
            range,
            nonce,
            level,
            blacklist: BTreeSet::new(),
            forged: BTreeSet::new(),
            grace: Grace {
                live: place.f + 1,
                ..Grace::default()
            },
            authority: None,
        }
    }

    fn request(&mut self) -> Vec<(Slot, Request)> {
        let body = RequestBody::Range {
            range: self.range.clone(),
            nonce: self.nonce,
            level: self.level,
            blacklist: self.blacklist.iter().copied().collect(),
        };
        self.proxies.request(body)
    }

    /// The pages that verify as their slot's and check out for this query; the others'
    /// replicas blacklisted.
    fn pages(&mut self, answers: Vec<(Slot, RangeAnswered)>) -> BTreeMap<Slot, Page> {
        let place = self.proxies.place;
        let mut pages = BTreeMap::new();
        for (slot, answered) in answers {
            if !self.proxies.counts(slot)
                || self.blacklist.contains(&slot)
                || pages.contains_key(&slot)
            {
                continue;
            }
            let page = self
                .proxies
                .verify(slot, &answered.answer, |_| true)
                .and_then(|answer| {
                    check_page(
                        &place,
                        slot,
                        &self.range,
                        self.nonce,
                        answer,
                        answered.cells,
                    )
                });
            match page {
                Some(page) => {
                    pages.insert(slot, page);
                }
                // A bad signature or a page that does not match its signed entries: proxy or
                // replica may be at fault, so no blame, but not asked again.
                None => {
                    self.blacklist.insert(slot);
                }
            }
        }
        pages
    }

    /// Resolves a quorum of pages, and returns the outcome if a quorum of replicas holds the
    /// resolution (their pages, or a write-back acknowledgement for this read and listing).
    fn judge(
        &mut self,
        pages: &BTreeMap<Slot, Page>,
        write_backs: Vec<(Slot, Unverified<RangeWriteBackAck>)>,
    ) -> Option<(super::Resolution, usize)> {
        let quorum = self.proxies.quorum(self.level);
        if pages.len() < quorum {
            return None;
        }
        let vouched = if self.proxies.variant.signs() {
            self.proxies.place.f + 1
        } else {
            usize::MAX
        };
        let proxies = &self.proxies;
        let writers = &self.writers;
        let resolution = resolve(&self.range, pages, vouched, &self.grace, |signed| {
            proxies.genuine(writers, signed)
        });
        if !resolution.forged.is_empty() {
            for (signed, holders) in &resolution.forged {
                self.blacklist.extend(holders.iter().copied());
                if self.forged.insert(signed.bytes().to_vec()) {
                    for node in holders {
                        self.proxies.vouched_for_forgery(*node);
                    }
                }
            }
            return None;
        }
        let listing = listing_digest(&resolution.listing());
        let (epoch, group, nonce) = (
            self.proxies.place.epoch,
            self.proxies.place.group,
            self.nonce,
        );
        let mut current = resolution.current.clone();
        let mut written_back = 0;
        for (slot, ack) in write_backs {
            if !self.proxies.counts(slot) || current.contains(&slot) {
                continue;
            }
            let good = self.proxies.verify(slot, &ack, |ack| {
                ack.slot == slot
                    && ack.epoch == epoch
                    && ack.group == group
                    && ack.nonce == nonce
                    && ack.listing == listing
            });
            if good.is_some() {
                current.insert(slot);
                written_back += 1;
            }
        }
        (current.len() >= quorum || self.proxies.mutations.skip_write_back)
            .then_some((resolution, written_back))
    }

    /// The blacklist is the current proxy's: a new proxy starts with a clean slate.
    fn moved_on(&mut self, tried: usize) {
        if self.proxies.tried != tried {
            self.blacklist.clear();
        }
    }
}

impl Operation for RangeOp {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Output = RangeOutcome;

    fn op(&self) -> u64 {
        self.proxies.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.request()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.proxies.op {
            return Progress::Send(Vec::new());
        }
        self.proxies.heard(from);
        let (answers, write_backs) = match reply.body {
            ResponseBody::Range {
                answers,
                write_backs,
                revocations,
            } => {
                self.learn(revocations);
                (answers, write_backs)
            }
            ResponseBody::Refused(refusal) => {
                let tried = self.proxies.tried;
                return match self.proxies.on_refusal(from, refusal) {
                    Err(error) => Progress::Done(Err(error)),
                    Ok(true) => {
                        self.moved_on(tried);
                        Progress::Send(self.request())
                    }
                    Ok(false) => Progress::Send(Vec::new()),
                };
            }
            ResponseBody::Acks(_)
            | ResponseBody::Read { .. }
            | ResponseBody::Created
            | ResponseBody::Schema(_) => {
                return Progress::Send(Vec::new());
            }
        };
        let blacklisted = self.blacklist.len();
        let pages = self.pages(answers);
        if let Some((resolution, written_back)) = self.judge(&pages, write_backs) {
            return Progress::Done(Ok(RangeOutcome {
                rows: resolution
                    .rows
                    .into_iter()
                    .map(|(row, cells)| (row, cells.into_iter().map(|(cell, _)| cell).collect()))
                    .collect(),
                next: resolution.next,
                written_back,
                proxies: self.proxies.tried,
                silent: self.proxies.silent(),
                evidence: std::mem::take(&mut self.proxies.evidence),
            }));
        }
        if from != self.proxies.proxy {
            return Progress::Send(Vec::new());
        }
        let grew = self.blacklist.len() > blacklisted;
        let tried = self.proxies.tried;
        let want = self.proxies.quorum(self.level);
        self.proxies.retry_here(from, grew, pages.len(), want);
        self.moved_on(tried);
        Progress::Send(self.request())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let tried = self.proxies.tried;
        self.proxies.on_timeout();
        self.moved_on(tried);
        self.request()
    }

    fn answered(&self) -> Vec<Slot> {
        self.proxies.answered.iter().copied().collect()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// Creating a table on one group: every member is asked, and the table exists once `n - f`
/// created it. At least `f+1` of those are correct, enough for the rest to learn it from the
/// proxies they refuse (a replica takes a schema `f+1` members offered). The same round
/// records a revocation (`CreateOp::revoke`), which members pass on by anti-entropy.
pub struct CreateOp {
    place: Place,
    op: u64,
    body: RequestBody,
    created: Replies<()>,
    refusals: Refusals<Refusal>,
}

impl CreateOp {
    /// Creates `schema` on the group at `place`.
    pub fn new(place: Place, op: OpId, schema: Schema) -> CreateOp {
        CreateOp::asking(place, op, RequestBody::Create { schema })
    }

    /// Records `revocation` on the group at `place`: the same round as a creation, every
    /// member asked and `n - f` enough (anti-entropy brings it to the others).
    pub fn revoke(place: Place, op: OpId, revocation: Unverified<Revocation>) -> CreateOp {
        CreateOp::asking(place, op, RequestBody::Revoke { revocation })
    }

    fn asking(place: Place, op: OpId, body: RequestBody) -> CreateOp {
        CreateOp {
            place,
            op: op.0,
            body,
            created: Replies::new(place.n),
            refusals: Refusals::new(place.n),
        }
    }

    fn create(&self, slot: Slot) -> (Slot, Request) {
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            body: self.body.clone(),
        };
        (slot, request)
    }
}

impl Operation for CreateOp {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    /// The members that created it.
    type Output = Vec<Slot>;

    fn op(&self) -> u64 {
        self.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        (0..self.place.n as u32)
            .map(|slot| self.create(Slot(slot)))
            .collect()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.op {
            return Progress::Send(Vec::new());
        }
        match reply.body {
            ResponseBody::Created => {
                self.created.record(from, ());
            }
            ResponseBody::Refused(refusal) => {
                if let Some((reason, by)) = self.refusals.record(from, refusal, self.place.f) {
                    return Progress::Done(Err(OpError::Refused {
                        reason: reason.to_string(),
                        by,
                    }));
                }
            }
            ResponseBody::Acks(_)
            | ResponseBody::Read { .. }
            | ResponseBody::Range { .. }
            | ResponseBody::Schema(_) => {}
        }
        if self.created.count() >= self.quorum() {
            return Progress::Done(Ok(self.created.nodes()));
        }
        Progress::Send(Vec::new())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let missing: Vec<Slot> = self.created.missing().collect();
        missing.into_iter().map(|slot| self.create(slot)).collect()
    }

    fn answered(&self) -> Vec<Slot> {
        self.created.nodes()
    }

    fn quorum(&self) -> usize {
        self.place.n - self.place.f
    }
}

/// Learning a table's schema (its columns and variant) from one group: every member is asked,
/// and the answer is the schema `f+1` members gave alike, so at least one correct member
/// holds it.
pub struct DescribeOp {
    place: Place,
    op: u64,
    table: String,
    schemas: Replies<Schema>,
    refusals: Refusals<Refusal>,
}

impl DescribeOp {
    /// Asks the group at `place` for `table`'s schema.
    pub fn new(place: Place, op: OpId, table: String) -> DescribeOp {
        DescribeOp {
            place,
            op: op.0,
            table,
            schemas: Replies::new(place.n),
            refusals: Refusals::new(place.n),
        }
    }

    fn describe(&self, slot: Slot) -> (Slot, Request) {
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            body: RequestBody::Describe {
                table: self.table.clone(),
            },
        };
        (slot, request)
    }
}

impl Operation for DescribeOp {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Output = Schema;

    fn op(&self) -> u64 {
        self.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        (0..self.place.n as u32)
            .map(|slot| self.describe(Slot(slot)))
            .collect()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.op {
            return Progress::Send(Vec::new());
        }
        match reply.body {
            ResponseBody::Schema(schema) if schema.name == self.table => {
                self.schemas.record(from, schema);
            }
            ResponseBody::Refused(refusal) => {
                if let Some((reason, by)) = self.refusals.record(from, refusal, self.place.f) {
                    return Progress::Done(Err(OpError::Refused {
                        reason: reason.to_string(),
                        by,
                    }));
                }
            }
            _ => {}
        }
        let schemas: Vec<&Schema> = self.schemas.present().map(|(_, schema)| schema).collect();
        for schema in &schemas {
            let alike = schemas.iter().filter(|other| *other == schema).count();
            if alike > self.place.f {
                return Progress::Done(Ok((*schema).clone()));
            }
        }
        Progress::Send(Vec::new())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let missing: Vec<Slot> = self.schemas.missing().collect();
        missing
            .into_iter()
            .map(|slot| self.describe(slot))
            .collect()
    }

    fn answered(&self) -> Vec<Slot> {
        self.schemas.nodes()
    }

    fn quorum(&self) -> usize {
        self.place.f + 1
    }
}
