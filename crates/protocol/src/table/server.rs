//! A table replica, which is also the proxy for the clients that pick it (spec §3.2-§3.5).
//!
//! As a replica it answers its group's proxies: it stores a cell only if its writer's signature
//! verifies, its row and column are the table's and its timestamp is not beyond the replica's
//! clock plus the skew allowed, keeps the newest version of each cell, and signs what it did
//! once the change is durable (the driver's persist-then-send rule). As a proxy it runs the
//! client's operation among the row's replicas: itself first (it is a replica of the row), then
//! the others by message, and answers the client when a quorum is in or its wait ends, with
//! whatever it has: the client judges.

use super::{
    Answer, Answered, COLUMNS_MAX, Catalog, Cell, Change, Consistency, Entry, Grace, Message,
    Nonce, PAGE_BYTES, Page, PairKeys, Place, Position, RANGE_ROWS_MAX, REVOKED_MAX, Range,
    RangeAnswer, RangeAnswered, RangeWriteBackAck, Refusal, Replication, Request, RequestBody,
    Resolver, Response, ResponseBody, Revocation, RowKey, Schema, SignedCell, TABLES_MAX,
    TableMutations, Variant, WriteAck, WriteBackAck, Writers, check_page, entries_of,
    listing_digest, listing_of, resolve, without,
};
use crate::machine::{Access, Output, Replica, ReplicaStats, TimerId};
use bulwark_core::sign::{PublicKey, SecretKey, Signable, Signed, Unverified};
use bulwark_core::{ClientId, Digest, ServiceId, Slot, Tag, Time};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Proxy operations in flight at one replica; more are refused as busy.
const PENDING_MAX: usize = 4096;

/// A replica's clock rules and its patience as a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How far ahead of this replica's clock a cell's timestamp may be (spec §2.16).
    pub skew_max_micros: u64,
    /// How far behind it a new write's timestamp may be (spec §5.1 item 13); write-backs of
    /// older cells are accepted, they are how replicas catch up.
    pub fresh_micros: u64,
    /// How long a proxy waits for replicas before it answers with what it has; a read in its
    /// digest round asks every replica after one such wait, and answers after a second.
    pub proxy_wait_millis: u64,
    /// The wall clock at the driver's time zero, in milliseconds since the Unix epoch: cells
    /// are stamped with the time clients and replicas share.
    pub wall_at_zero_millis: u64,
    /// How often a replica offers the next window of its rows to the next member (anti-entropy;
    /// 0: never). A full pass over `R` rows takes `R / 100` rounds.
    pub anti_entropy_millis: u64,
    /// Whether clients may create tables of the variants that protect nothing (Plain and
    /// No-Sign): only on clusters started to measure them (`bulwark bench compare`).
    pub unprotected_tables: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            skew_max_micros: 2_000_000,
            fresh_micros: 60_000_000,
            proxy_wait_millis: 500,
            wall_at_zero_millis: 0,
            anti_entropy_millis: 1_000,
            unprotected_tables: false,
        }
    }
}

/// What a table replica counts beyond the common counters, for `bulwark status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Signatures by other replicas that failed this proxy's checks, by slot.
    pub bad_signatures: BTreeMap<Slot, u64>,
    /// Cells refused because their writer's signature failed.
    pub forged_cells: u64,
    /// Reads this proxy resolved, and cells it wrote back.
    pub resolved_reads: u64,
    /// Write-backs it accepted as a replica.
    pub repairs: u64,
    /// Cells it took from other members' anti-entropy.
    pub synced: u64,
    /// Cells members sent it by anti-entropy that it refused (a bad writer's signature, a
    /// timestamp from the future, a cell it did not ask for), by slot.
    pub bad_syncs: BTreeMap<Slot, u64>,
    /// Full-Sym writes whose tag for this replica was missing or failed, so it verified the
    /// writer's signatures instead (a stale client view, or a proxy that altered the tags).
    pub mac_fallbacks: u64,
    /// Cells kept on their writer's tag whose signature then failed the check off the write
    /// path: removed, and evidence against the writer (spec §5.1 item 15).
    pub quarantined: u64,
    /// Tombstones collected after the GC grace.
    pub collected: u64,
    /// Cells older than the grace taken after `f+1` members said they hold them.
    pub confirmed_live: u64,
    /// Cells older than the grace dropped: too few members hold them (a deleted value
    /// offered again), or too many waited.
    pub not_live: u64,
    /// New writes refused because their writer is revoked.
    pub revoked_refused: u64,
}

/// Cells kept on a Full-Sym tag whose writer's signatures a replica verifies at each of its
/// check timer's turns, and how often those come while cells wait: small batches often, so no
/// input waits long behind them (about 2 ms of Ed25519 each) and ~3000 cells a second get
/// checked.
const UNCHECKED_PER_TURN: usize = 64;
const CHECK_EVERY_MILLIS: u64 = 20;
/// The check timer's id: above every proxy operation's.
const CHECK_TIMER: TimerId = TimerId(u64::MAX);
/// Cells kept on a Full-Sym tag still waiting for that check, at most; past it, writes are
/// checked on the write path.
const UNCHECKED_MAX: usize = 65_536;

/// Rows a window of anti-entropy holds.
const SYNC_ROWS: usize = 100;
/// Anti-entropy rounds between two passings-on of the revocations a member holds.
const REVOCATIONS_EVERY: u64 = 8;

/// Tombstones collected per tick at most, so a tick stays short.
const COLLECT_PER_TICK: usize = 1024;
/// Cells past the grace waiting for their liveness check, at most; more are dropped (and
/// offered again by anti-entropy).
const DOUBTFUL_MAX: usize = 4096;
/// Cells one liveness round asks about.
const LIVE_BATCH: usize = 256;
/// Rounds a cell waits for `f+1` holders before it is dropped as not live.
const LIVE_ROUNDS_MAX: u32 = 3;

/// Cells older than the GC grace this replica would keep, waiting until `f+1` members say they
/// hold them (spec §2.14 measure 4): by row and column.
#[derive(Debug, Default)]
struct Doubtful {
    cells: BTreeMap<(RowKey, String), Doubt>,
    /// The round in flight and what it asked, in order.
    round: u64,
    asked: Vec<(RowKey, String)>,
}

#[derive(Debug)]
struct Doubt {
    /// Unchecked until confirmed: a write-back's cells are parked before any signature check.
    signed: SignedCell,
    digest: Digest,
    /// Members that said they hold exactly this version.
    holders: BTreeSet<Slot>,
    rounds: u32,
}

/// A window of rows: after the first (exclusive), up to the second (inclusive; to the end when
/// `None`).
type Window = (Option<(String, Position)>, Option<(String, Position)>);

/// Where this replica's anti-entropy is.
#[derive(Default)]
struct Sync {
    round: u64,
    /// Its next window starts after this row (from the first when `None`).
    cursor: Option<(String, Position)>,
    /// Passes over every row completed.
    pass: u64,
    /// The window of the current pass that is next.
    window: u64,
    /// When the next offer is due.
    next_at: Option<Time>,
    /// Offers not answered yet, by member: the round and its window.
    offered: BTreeMap<Slot, (u64, Window)>,
    /// What this replica asked each member for, answering its offer of that round.
    wanted: BTreeMap<Slot, (u64, BTreeSet<(RowKey, String)>)>,
}

/// The newest version this replica holds of one cell.
#[derive(Clone, Debug)]
struct Held {
    cell: Cell,
    signed: SignedCell,
}

/// A client operation this replica is proxy for.
struct Pending {
    client: ClientId,
    op: u64,
    /// Replies it waits for.
    want: usize,
    /// Whether its wait ran out once (a read then asks everyone).
    waited: bool,
    /// The table's other replicas, in the order this proxy asks them.
    peers: Vec<Slot>,
    kind: Kind,
}

enum Kind {
    Write {
        cells: Vec<SignedCell>,
        digests: Vec<Digest>,
        acks: BTreeMap<Slot, Unverified<WriteAck>>,
        refused: BTreeMap<Slot, Refusal>,
        skip: Vec<Slot>,
    },
    Read(ReadState),
    Range(RangeState),
}

struct RangeState {
    client: ClientId,
    range: Range,
    nonce: Nonce,
    /// The client's blacklist, and the replicas found vouching for forged cells.
    blacklist: BTreeSet<Slot>,
    asked: BTreeSet<Slot>,
    /// Answers whose pages checked out, as received (for the client) and decoded.
    answers: BTreeMap<Slot, RangeAnswered>,
    pages: BTreeMap<Slot, Page>,
    /// Once written back: the resolved listing's digest.
    resolved: Option<bulwark_core::Digest>,
    current: BTreeSet<Slot>,
    write_backs: BTreeMap<Slot, Unverified<RangeWriteBackAck>>,
}

struct ReadState {
    client: ClientId,
    row: RowKey,
    columns: Vec<String>,
    nonce: Nonce,
    blacklist: Vec<Slot>,
    /// Replicas asked in the current round.
    asked: BTreeSet<Slot>,
    /// Answers of the current round (the digest round, then the data round).
    answers: BTreeMap<Slot, Answered>,
    /// Whether the current round asks for data from everyone.
    data_round: bool,
    /// Once resolved: the cells and their entries, the replicas current, and their acks.
    resolved: Option<(Vec<SignedCell>, Vec<Entry>)>,
    current: BTreeSet<Slot>,
    write_backs: BTreeMap<Slot, Unverified<WriteBackAck>>,
    /// Who resolves: with the client, the data round's answers go back as they are.
    resolver: Resolver,
}

/// A member of a table's replica group: replica and proxy.
pub struct Server {
    place: Place,
    secret: SecretKey,
    /// The group's keys, by slot.
    keys: Arc<[PublicKey]>,
    writers: Arc<Writers>,
    /// The MAC keys shared with each client (Half-Sym and Full-Sym).
    pairs: Arc<HashMap<ClientId, PairKeys>>,
    /// Cells kept on their writer's Full-Sym tag, by row, column and digest: their signatures
    /// are verified off the write path, a batch per tick.
    unchecked: VecDeque<(RowKey, String, Digest)>,
    /// Whether the timer that checks them is set.
    check_armed: bool,
    catalog: Catalog,
    /// Schemas members offered for tables this replica lacks, by table and member.
    offers: BTreeMap<String, BTreeMap<Slot, Schema>>,
    settings: Settings,
    mutations: TableMutations,
    /// By table and scan order, so a range read is a walk.
    rows: BTreeMap<(String, Position), BTreeMap<String, Held>>,
    pending: BTreeMap<u64, Pending>,
    /// The proxy operation serving each client's operation, so a retransmission joins it.
    serving: HashMap<(ClientId, u64), u64>,
    next_pop: u64,
    /// The clock reading of the input being handled.
    now: Time,
    /// By slot: waits that ran out since the member last answered this proxy. Digest rounds ask
    /// the members that answer first (spec §1.6's "fastest"), so a member that is down costs a
    /// read no wait.
    missed: Vec<u32>,
    stats: ReplicaStats,
    table_stats: TableStats,
    sync: Sync,
    /// Every tombstone held, by table, oldest first: (ts, position, column).
    tombstones: BTreeMap<String, BTreeSet<(u64, Position, String)>>,
    doubtful: Doubtful,
    /// The authority whose revocations count (none: revocations are refused).
    authority: Option<PublicKey>,
    /// Revoked writers, with the authority's order.
    revoked: BTreeMap<ClientId, Unverified<Revocation>>,
}

impl Server {
    /// A replica at `place` that signs with `secret`, checks its group by `keys` and cells by
    /// `writers`, and serves the tables of `catalog`.
    pub fn new(
        place: Place,
        secret: SecretKey,
        keys: Arc<[PublicKey]>,
        writers: Arc<Writers>,
        catalog: Catalog,
        settings: Settings,
    ) -> Server {
        assert!(place.slot.index() < place.n, "the slot is in the group");
        assert_eq!(keys.len(), place.n, "a key per member");
        assert!(place.n > place.f, "a group larger than its faults");
        Server {
            place,
            secret,
            keys,
            writers,
            pairs: Arc::new(HashMap::new()),
            unchecked: VecDeque::new(),
            check_armed: false,
            catalog,
            offers: BTreeMap::new(),
            settings,
            mutations: TableMutations::default(),
            rows: BTreeMap::new(),
            pending: BTreeMap::new(),
            serving: HashMap::new(),
            next_pop: 0,
            now: Time(0),
            missed: vec![0; place.n],
            stats: ReplicaStats::default(),
            table_stats: TableStats::default(),
            sync: Sync::default(),
            tombstones: BTreeMap::new(),
            doubtful: Doubtful::default(),
            authority: None,
            revoked: BTreeMap::new(),
        }
    }

    /// The same replica sharing `pairs` with clients, for the MAC variants; a client without a
    /// key here gets signatures.
    pub fn with_pair_keys(mut self, pairs: Arc<HashMap<ClientId, PairKeys>>) -> Server {
        self.pairs = pairs;
        self
    }

    /// The same replica with deliberate breakage (negative controls only).
    pub fn with_mutations(mut self, mutations: TableMutations) -> Server {
        self.mutations = mutations;
        self
    }

    /// The same replica taking revocations signed by `authority`.
    pub fn with_authority(mut self, authority: PublicKey) -> Server {
        self.authority = Some(authority);
        self
    }

    /// Takes back a revocation this replica recorded before a restart.
    pub fn restore_revocation(&mut self, revocation: Unverified<Revocation>) {
        if self.revoke(revocation).is_err() {
            self.stats.damaged += 1;
        }
    }

    /// Records `revocation` if the authority signed it: the change to make durable, if it is
    /// new here.
    fn revoke(&mut self, revocation: Unverified<Revocation>) -> Result<Option<Change>, Refusal> {
        let authority = self.authority.as_ref().ok_or(Refusal::BadSignature)?;
        if revocation
            .peek()
            .is_ok_and(|order| self.revoked.contains_key(&order.client))
        {
            // Revoked already: nothing to change, so nothing to check (a peer cannot make this
            // replica verify the same order again and again).
            return Ok(None);
        }
        let order = revocation
            .clone()
            .verify(authority)
            .map_err(|_| Refusal::BadSignature)?
            .into_value();
        if self.revoked.contains_key(&order.client) {
            return Ok(None);
        }
        if self.revoked.len() >= REVOKED_MAX {
            return Err(Refusal::Malformed(format!(
                "more than {REVOKED_MAX} revoked clients"
            )));
        }
        self.revoked.insert(order.client, revocation.clone());
        Ok(Some(Change::Revoke(revocation)))
    }

    /// The clients whose revocation this replica holds.
    pub fn revoked(&self) -> Vec<ClientId> {
        self.revoked.keys().copied().collect()
    }

    /// Whether `writer`'s signatures are revoked here.
    fn is_revoked(&self, writer: ClientId) -> bool {
        !self.mutations.ignore_revocations && self.revoked.contains_key(&writer)
    }

    /// The revocations of the writers of `cells`, for a client resolving from them.
    fn revocations_of<'a>(
        &self,
        cells: impl IntoIterator<Item = &'a SignedCell>,
    ) -> Vec<Unverified<Revocation>> {
        if self.revoked.is_empty() {
            return Vec::new();
        }
        let writers: BTreeSet<ClientId> = cells
            .into_iter()
            .filter_map(|signed| signed.peek().ok())
            .map(|cell| cell.writer)
            .filter(|writer| self.revoked.contains_key(writer))
            .collect();
        writers
            .iter()
            .filter_map(|writer| self.revoked.get(writer).cloned())
            .collect()
    }

    /// Takes back a cell this replica made durable before a restart. A cell that no longer
    /// verifies (a damaged disk) is dropped and counted.
    pub fn restore(&mut self, cell: SignedCell) {
        match self.genuine(&cell) {
            Some(decoded) => {
                self.keep(decoded, cell);
            }
            None => self.stats.damaged += 1,
        }
    }

    /// Takes back a table this replica created before a restart.
    pub fn restore_schema(&mut self, schema: Schema) {
        if self.catalog.add(schema).is_err() {
            self.stats.damaged += 1;
        }
    }

    /// Cells kept on their writer's Full-Sym tag whose signatures are not checked yet.
    pub fn unchecked(&self) -> usize {
        self.unchecked.len()
    }

    /// The tables this replica serves.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// CREATE: adds `schema` unless a table of its name exists with another one.
    fn create(&mut self, schema: Schema) -> Result<Vec<Change>, Refusal> {
        if let Some(problem) = schema.problem() {
            return Err(Refusal::BadSchema(problem));
        }
        if !schema.variant.signs() && !self.settings.unprotected_tables {
            // A table that signs nothing protects nothing: the bench builds its own replicas.
            return Err(Refusal::BadSchema(
                "the unsigned variants are for measurement only".into(),
            ));
        }
        match self.catalog.get(&schema.name) {
            Some(existing) if *existing == schema => return Ok(Vec::new()),
            Some(_) => {
                return Err(Refusal::BadSchema(format!(
                    "table {} exists with another schema",
                    schema.name
                )));
            }
            None if self.catalog.len() >= TABLES_MAX => {
                return Err(Refusal::BadSchema(format!(
                    "a replica serves at most {TABLES_MAX} tables"
                )));
            }
            None => {}
        }
        self.offers.remove(&schema.name);
        self.catalog
            .add(schema.clone())
            .map_err(Refusal::BadSchema)?;
        Ok(vec![Change::Schema(schema)])
    }

    /// A member's offer of a table this replica refused as unknown: taken once `f+1` members
    /// offered the same schema.
    fn offered(&mut self, from: Slot, schema: Schema) -> Output<Self> {
        if self.catalog.get(&schema.name).is_some()
            || schema.problem().is_some()
            || (!self.offers.contains_key(&schema.name) && self.offers.len() >= TABLES_MAX)
        {
            return Output::none();
        }
        let offers = self.offers.entry(schema.name.clone()).or_default();
        offers.insert(from, schema.clone());
        let agreeing = offers.values().filter(|offer| **offer == schema).count();
        if agreeing <= self.place.f {
            return Output::none();
        }
        match self.create(schema) {
            Ok(changes) => Output {
                changes,
                ..Output::none()
            },
            Err(_) => Output::none(),
        }
    }

    /// The table-specific counters.
    pub fn table_stats(&self) -> &TableStats {
        &self.table_stats
    }

    /// The newest cells this replica holds of `row`, in column order.
    pub fn cells(&self, row: &RowKey) -> Vec<Cell> {
        self.rows
            .get(&(row.table.clone(), Position::of(row)))
            .map(|cells| cells.values().map(|held| held.cell.clone()).collect())
            .unwrap_or_default()
    }

    /// Where this replica is.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Keeps `cell` if it is newer than what this replica holds; whether it was.
    fn keep(&mut self, cell: Cell, signed: SignedCell) -> bool {
        let key = key_of(&cell);
        let row = self.rows.entry(key.clone()).or_default();
        match row.get(&cell.column) {
            Some(held) if held.cell.rank() >= cell.rank() => false,
            previous => {
                let old_bytes = previous.map_or(0, |held| held.signed.bytes().len() as u64);
                if previous.is_none_or(|held| held.cell.value.is_none()) && cell.value.is_some() {
                    self.stats.objects += 1;
                } else if previous.is_some_and(|held| held.cell.value.is_some())
                    && cell.value.is_none()
                {
                    self.stats.objects = self.stats.objects.saturating_sub(1);
                }
                if previous.is_none() {
                    self.stats.keys += 1;
                    self.stats.versions += 1;
                }
                self.stats.bytes = self.stats.bytes - old_bytes.min(self.stats.bytes)
                    + signed.bytes().len() as u64;
                let (table, position) = key;
                let tombstones = self.tombstones.entry(table).or_default();
                if let Some(old) = previous.filter(|held| held.cell.value.is_none()) {
                    tombstones.remove(&(old.cell.ts, position.clone(), cell.column.clone()));
                }
                if cell.value.is_none() {
                    tombstones.insert((cell.ts, position, cell.column.clone()));
                }
                row.insert(cell.column.clone(), Held { cell, signed });
                true
            }
        }
    }

    /// `statement` for `client` signed; MACed instead in the variants that do, when this
    /// replica shares a key with `client`; bare in the unsigned variants.
    fn seal<T: Signable>(
        &self,
        table: &str,
        client: ClientId,
        statement: T,
    ) -> Option<Unverified<T>> {
        let variant = self.variant(table);
        if !variant.signs() {
            return Some(super::unsigned(&statement));
        }
        if variant.macs_to_client()
            && let Some(keys) = self.pairs.get(&client)
        {
            return Unverified::mac(&keys.to_client, &statement).ok();
        }
        // Signing fails only for a statement over its bound, which the bounds on rows exclude;
        // a replica that cannot sign says nothing rather than something unverifiable.
        Signed::sign(&self.secret, statement)
            .ok()
            .map(|signed| signed.to_unverified())
    }

    /// Checks every cell of a write and returns them decoded: one row, the table's columns,
    /// each signed by a registered writer, none from the future (nor, for a new write, too old).
    /// Cells `tagged` by their writer (a Full-Sym tag this replica verified) skip the
    /// signature: it is checked off the write path.
    fn check_cells(
        &mut self,
        now: Time,
        cells: &[SignedCell],
        fresh: bool,
        tagged: Option<ClientId>,
    ) -> Result<Vec<Cell>, Refusal> {
        if cells.is_empty() || cells.len() > COLUMNS_MAX {
            return Err(Refusal::Malformed(format!(
                "{} cells; a write has 1 to {COLUMNS_MAX}",
                cells.len()
            )));
        }
        let now_micros = self.micros(now);
        let mut decoded: Vec<Cell> = Vec::with_capacity(cells.len());
        for signed in cells {
            let cell = if self.mutations.unverified_cells {
                signed.peek().ok().filter(Cell::is_well_formed)
            } else if let Some(client) = tagged {
                signed
                    .peek()
                    .ok()
                    .filter(|cell| cell.is_well_formed() && cell.writer == client)
            } else {
                self.genuine(signed)
            };
            let Some(cell) = cell else {
                self.table_stats.forged_cells += 1;
                return Err(Refusal::BadSignature);
            };
            if decoded.first().is_some_and(|first| first.row != cell.row) {
                return Err(Refusal::Malformed("cells of more than one row".into()));
            }
            if decoded.iter().any(|other| other.column == cell.column) {
                return Err(Refusal::Malformed("a column written twice".into()));
            }
            let Some(schema) = self.catalog.get(&cell.row.table) else {
                return Err(Refusal::UnknownTable(cell.row.table.clone()));
            };
            if !self.holds(&cell.row.table, self.place.slot) {
                return Err(Refusal::NotReplica(cell.row.table.clone()));
            }
            if !schema.has_column(&cell.column) {
                return Err(Refusal::UnknownColumn {
                    table: cell.row.table.clone(),
                    column: cell.column.clone(),
                });
            }
            let horizon = now_micros.saturating_add(self.settings.skew_max_micros);
            if cell.ts > horizon {
                return Err(Refusal::FromFuture {
                    ahead_micros: cell.ts - now_micros,
                });
            }
            if fresh && self.is_revoked(cell.writer) {
                self.table_stats.revoked_refused += 1;
                return Err(Refusal::Revoked(cell.writer));
            }
            let oldest = now_micros.saturating_sub(self.settings.fresh_micros);
            if fresh && cell.ts < oldest {
                return Err(Refusal::NotFresh {
                    behind_micros: now_micros - cell.ts,
                });
            }
            decoded.push(cell);
        }
        Ok(decoded)
    }

    /// STORE as a replica: the changes to make durable and the acknowledgement for `client` to
    /// send after. `tag` is `client`'s Full-Sym tag for this replica, if it sent one.
    fn store(
        &mut self,
        now: Time,
        client: ClientId,
        cells: &[SignedCell],
        fresh: bool,
        tag: Option<&Tag>,
    ) -> Result<(Vec<Change>, Unverified<WriteAck>), Refusal> {
        let table = cells
            .first()
            .and_then(|cell| cell.peek().ok())
            .map(|cell| cell.row.table)
            .unwrap_or_default();
        let tagged = self.tagged(&table, client, cells, tag);
        let changes = self.accept(now, cells, fresh, tagged)?;
        let ack = WriteAck {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            cells: cells.iter().map(Cell::digest).collect(),
        };
        let ack = self
            .seal(&table, client, ack)
            .ok_or_else(|| Refusal::Malformed("unsignable".into()))?;
        Ok((changes, ack))
    }

    /// The check timer, set if cells wait for their check and it is not set already.
    fn arm_check(&mut self, now: Time) -> Output<Self> {
        if self.check_armed || self.unchecked.is_empty() {
            return Output::none();
        }
        self.check_armed = true;
        Output {
            timers: vec![(CHECK_TIMER, now.plus_millis(CHECK_EVERY_MILLIS))],
            ..Output::none()
        }
    }

    /// Verifies the writer's signature of up to `most` cells kept on their writer's tag, and
    /// removes each cell that fails (if still the one held): a Byzantine writer's, which
    /// evidence names (spec §5.1 item 15). The removals to make durable.
    fn check_tagged(&mut self, most: usize) -> Vec<Change> {
        let mut changes = Vec::new();
        for _ in 0..most {
            let Some((row, column, digest)) = self.unchecked.pop_front() else {
                break;
            };
            let key = (row.table.clone(), Position::of(&row));
            let Some(held) = self.rows.get(&key).and_then(|cells| cells.get(&column)) else {
                continue;
            };
            if Cell::digest(&held.signed) != digest || self.writers.verify(&held.signed).is_some() {
                continue;
            }
            self.table_stats.quarantined += 1;
            self.table_stats.forged_cells += 1;
            self.forget(&key, &column);
            changes.push(Change::Remove { row, column });
        }
        changes
    }

    /// Drops the cell held at `key` and `column`, and its row when that was its last.
    fn forget(&mut self, key: &(String, Position), column: &str) {
        let Some(cells) = self.rows.get_mut(key) else {
            return;
        };
        if let Some(held) = cells.remove(column) {
            if held.cell.value.is_some() {
                self.stats.objects = self.stats.objects.saturating_sub(1);
            } else if let Some(tombstones) = self.tombstones.get_mut(&key.0) {
                tombstones.remove(&(held.cell.ts, key.1.clone(), column.to_string()));
            }
            self.stats.keys = self.stats.keys.saturating_sub(1);
            self.stats.bytes = self
                .stats
                .bytes
                .saturating_sub(held.signed.bytes().len() as u64);
        }
        if cells.is_empty() {
            self.rows.remove(key);
        }
    }

    /// The writer whose Full-Sym `tag` for this replica covers `cells`, when `table` runs
    /// Full-Sym and it does: that writer's cells may skip their signatures on the write path.
    /// A missing or failing tag is no refusal: the signatures decide (spec §5.1 item 12).
    fn tagged(
        &mut self,
        table: &str,
        client: ClientId,
        cells: &[SignedCell],
        tag: Option<&Tag>,
    ) -> Option<ClientId> {
        if !self.variant(table).macs_from_client() {
            return None;
        }
        if self.unchecked.len() + cells.len() > UNCHECKED_MAX {
            // The check off the write path is behind: check on it until it catches up.
            return None;
        }
        let good = tag.is_some_and(|tag| {
            self.pairs
                .get(&client)
                .is_some_and(|keys| keys.verify_write_tag(cells, tag))
        });
        if good {
            Some(client)
        } else {
            self.table_stats.mac_fallbacks += 1;
            None
        }
    }

    /// Checks the cells of one row and keeps those newer than what this replica holds: the
    /// changes to make durable. Cells `tagged` by their writer wait for their signature check.
    fn accept(
        &mut self,
        now: Time,
        cells: &[SignedCell],
        fresh: bool,
        tagged: Option<ClientId>,
    ) -> Result<Vec<Change>, Refusal> {
        let decoded = self.check_cells(now, cells, fresh, tagged)?;
        let line = decoded
            .first()
            .map_or(0, |cell| self.grace_line(now, &cell.row.table));
        let mut changes = Vec::new();
        for (cell, signed) in decoded.into_iter().zip(cells) {
            if cell.ts < line && cell.value.is_none() {
                // A tombstone past its grace says what holding nothing says.
                continue;
            }
            if self.doubtful(line, &cell) {
                self.park(&cell, signed);
                continue;
            }
            let (row, column) = (cell.row.clone(), cell.column.clone());
            if self.keep(cell, signed.clone()) {
                if tagged.is_some() {
                    let digest = Cell::digest(signed);
                    self.unchecked
                        .push_back((row.clone(), column.clone(), digest));
                }
                changes.push(Change::Put {
                    row,
                    column,
                    cell: signed.clone(),
                });
            }
        }
        Ok(changes)
    }

    /// Cells of several rows, each row's checked and kept as a write of it would be; the
    /// changes, and the first refusal if any row's cells were refused (the others still count).
    fn accept_rows(&mut self, now: Time, cells: &[SignedCell]) -> (Vec<Change>, Option<Refusal>) {
        let mut changes = Vec::new();
        let mut refused = None;
        let rows: Vec<Option<RowKey>> = cells
            .iter()
            .map(|signed| signed.peek().ok().map(|cell| cell.row))
            .collect();
        let mut first = 0;
        while first < cells.len() {
            let end = first
                + rows[first..]
                    .iter()
                    .take_while(|row| **row == rows[first])
                    .count();
            let result = match rows[first] {
                Some(_) => self.accept(now, &cells[first..end], false, None),
                None => Err(Refusal::Malformed("an undecodable cell".into())),
            };
            match result {
                Ok(kept) => changes.extend(kept),
                Err(refusal) => {
                    refused.get_or_insert(refusal);
                }
            }
            first = end;
        }
        (changes, refused)
    }

    /// READ as a replica: the newest cell of each column asked for (all when none named),
    /// signed with the nonce; with the cells themselves for a data read.
    pub(super) fn answer(
        &self,
        client: ClientId,
        row: &RowKey,
        columns: &[String],
        nonce: Nonce,
        data: bool,
    ) -> Option<Answered> {
        let held: Vec<&Held> = self
            .rows
            .get(&(row.table.clone(), Position::of(row)))
            .map(|cells| {
                cells
                    .values()
                    .filter(|held| columns.is_empty() || columns.contains(&held.cell.column))
                    .collect()
            })
            .unwrap_or_default();
        let answer = Answer {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            row: row.clone(),
            nonce,
            entries: entries_of(held.iter().map(|h| (&h.cell, &h.signed))),
        };
        // Entries are in column order and so are the held cells (a BTreeMap by column).
        let cells = data.then(|| held.iter().map(|h| h.signed.clone()).collect());
        Some(Answered {
            answer: self.seal(&row.table, client, answer)?,
            cells,
        })
    }

    /// WRITE-BACK as a replica: keeps what is newer, and says it holds at least the resolved
    /// cells for this read.
    pub(super) fn write_back(
        &mut self,
        now: Time,
        client: ClientId,
        row: &RowKey,
        nonce: Nonce,
        cells: &[SignedCell],
    ) -> Result<(Vec<Change>, Unverified<WriteBackAck>), Refusal> {
        if let Some(refusal) = self.park_doubtful(now, cells) {
            return Err(refusal);
        }
        let changes = self.accept(now, cells, false, None)?;
        let decoded: Vec<Cell> = cells.iter().filter_map(|c| c.peek().ok()).collect();
        if decoded.iter().any(|cell| cell.row != *row) {
            return Err(Refusal::Malformed(
                "a written-back cell of another row".into(),
            ));
        }
        self.table_stats.repairs += 1;
        let ack = WriteBackAck {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            row: row.clone(),
            nonce,
            entries: entries_of(decoded.iter().zip(cells)),
        };
        let ack = self
            .seal(&row.table, client, ack)
            .ok_or_else(|| Refusal::Malformed("unsignable".into()))?;
        Ok((changes, ack))
    }

    fn refuse(&self, op: u64, refusal: Refusal) -> Output<Self> {
        Output {
            refused: Some(refusal.to_string()),
            ..Output::reply(
                Vec::new(),
                Response {
                    op,
                    body: ResponseBody::Refused(refusal),
                },
            )
        }
    }

    /// The variant `table` runs; the signing ones for a table this replica does not know.
    fn variant(&self, table: &str) -> Variant {
        self.catalog
            .get(table)
            .map_or(Variant::ProxyVerifies, |schema| schema.variant)
    }

    /// `signed` decoded if it is a cell its writer signed, or one of a table that signs nothing.
    fn genuine(&self, signed: &SignedCell) -> Option<Cell> {
        let cell = signed.peek().ok()?;
        if self.variant(&cell.row.table).signs() {
            self.writers.verify(signed)
        } else {
            cell.is_well_formed().then_some(cell)
        }
    }

    /// Whether the proxy checks replicas' signatures for `table`.
    fn verifies(&self, table: &str) -> bool {
        self.catalog
            .get(table)
            .is_some_and(|schema| schema.variant == Variant::ProxyVerifies)
    }

    /// Whether `signed` is slot `from`'s valid statement, when this proxy verifies; counts it
    /// against `from` when it is not.
    fn valid<T: Signable>(
        &mut self,
        verify: bool,
        from: Slot,
        signed: &Unverified<T>,
        check: impl FnOnce(&T) -> bool,
    ) -> bool {
        if !verify {
            return true;
        }
        let good = self.keys.get(from.index()).is_some_and(|key| {
            signed
                .clone()
                .verify(key)
                .is_ok_and(|verified| check(verified.value()))
        });
        if !good {
            *self.table_stats.bad_signatures.entry(from).or_default() += 1;
            // Asked last from now on, as a member that does not answer is.
            if let Some(missed) = self.missed.get_mut(from.index()) {
                *missed = missed.saturating_add(1);
            }
        }
        good
    }

    fn level_threshold(&self, table: &str, level: Consistency) -> usize {
        let variant = self.variant(table);
        let replication = self
            .catalog
            .get(table)
            .map_or(Replication::Strong, |schema| schema.replication);
        replication.threshold(&self.mutations, variant, level, self.place.n, self.place.f)
    }

    fn start(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
    ) -> Output<Self> {
        let op = request.op;
        if request.epoch != self.place.epoch {
            return self.refuse(op, Refusal::WrongEpoch);
        }
        if request.group != self.place.group {
            return self.refuse(op, Refusal::WrongGroup);
        }
        if let Some(pop) = self.serving.get(&(client, op))
            && self.pending.contains_key(pop)
        {
            // A retransmission of an operation under way: its answer is coming.
            return Output::none();
        }
        if self.pending.len() >= PENDING_MAX {
            return self.refuse(op, Refusal::Busy);
        }
        if let RequestBody::Create { schema } = request.body {
            if !access.write {
                return self.refuse(op, Refusal::NotWriter);
            }
            return match self.create(schema) {
                Ok(changes) => Output::reply(
                    changes,
                    Response {
                        op,
                        body: ResponseBody::Created,
                    },
                ),
                Err(refusal) => self.refuse(op, refusal),
            };
        }
        if let RequestBody::Revoke { revocation } = request.body {
            // Self-certifying: any client may pass on what the authority signed.
            return match self.revoke(revocation) {
                Ok(change) => Output::reply(
                    change.into_iter().collect(),
                    Response {
                        op,
                        body: ResponseBody::Created,
                    },
                ),
                Err(refusal) => self.refuse(op, refusal),
            };
        }
        if let RequestBody::Describe { table } = request.body {
            if !access.read {
                return self.refuse(op, Refusal::NotReader);
            }
            let Some(schema) = self.catalog.get(&table) else {
                return self.refuse(op, Refusal::UnknownTable(table));
            };
            let body = ResponseBody::Schema(schema.clone());
            return Output::reply(Vec::new(), Response { op, body });
        }
        self.next_pop += 1;
        let pop = self.next_pop;
        let me = self.place.slot;
        match request.body {
            RequestBody::Create { .. }
            | RequestBody::Describe { .. }
            | RequestBody::Revoke { .. } => Output::none(),
            RequestBody::WriteBack {
                row,
                nonce,
                cells,
                current,
                level,
            } => {
                if !access.read {
                    return self.refuse(op, Refusal::NotReader);
                }
                let Some(entries) = resolution_entries(&row, &cells) else {
                    let problem = "a resolution out of bounds or of another row".to_string();
                    return self.refuse(op, Refusal::Malformed(problem));
                };
                if self.catalog.get(&row.table).is_none() {
                    return self.refuse(op, Refusal::UnknownTable(row.table.clone()));
                }
                let n = self.place.n;
                let state = ReadState {
                    client,
                    row: row.clone(),
                    columns: Vec::new(),
                    nonce,
                    blacklist: Vec::new(),
                    asked: BTreeSet::new(),
                    answers: BTreeMap::new(),
                    data_round: true,
                    resolved: Some((cells, entries)),
                    current: current.into_iter().filter(|s| s.index() < n).collect(),
                    write_backs: BTreeMap::new(),
                    resolver: Resolver::Client,
                };
                let pending = Pending {
                    client,
                    op,
                    want: self.level_threshold(&row.table, level),
                    waited: false,
                    peers: self.peers(&row.table).1,
                    kind: Kind::Read(state),
                };
                self.track(now, pop, pending, Vec::new())
                    .and(self.write_back_stale(pop))
            }
            RequestBody::Range {
                range,
                nonce,
                level,
                blacklist,
            } => {
                if !access.read {
                    return self.refuse(op, Refusal::NotReader);
                }
                if let Some(problem) = range.problem() {
                    return self.refuse(op, Refusal::Malformed(problem));
                }
                let Some(schema) = self.catalog.get(&range.table) else {
                    return self.refuse(op, Refusal::UnknownTable(range.table.clone()));
                };
                if let Some(column) = range.columns.iter().find(|c| !schema.has_column(c)) {
                    let refusal = Refusal::UnknownColumn {
                        table: range.table.clone(),
                        column: column.clone(),
                    };
                    return self.refuse(op, refusal);
                }
                let wanted = self.level_threshold(&range.table, level);
                self.start_range(now, pop, client, op, wanted, range, nonce, blacklist)
            }
            RequestBody::Write {
                cells,
                level,
                skip,
                want,
                tags,
            } => {
                if !access.write {
                    return self.refuse(op, Refusal::NotWriter);
                }
                if !tags.is_empty() && tags.len() != self.place.n {
                    let problem = format!("{} tags for {} members", tags.len(), self.place.n);
                    return self.refuse(op, Refusal::Malformed(problem));
                }
                let table = cells
                    .first()
                    .and_then(|cell| cell.peek().ok())
                    .map(|cell| cell.row.table)
                    .unwrap_or_default();
                let wanted = (want as usize).clamp(1, self.level_threshold(&table, level));
                let mut acks = BTreeMap::new();
                let mut changes = Vec::new();
                let (own, peers) = self.peers(&table);
                if own && !skip.contains(&me) {
                    match self.store(now, client, &cells, true, tags.get(me.index())) {
                        Ok((stored, ack)) => {
                            changes = stored;
                            acks.insert(me, ack);
                        }
                        // A correct proxy refuses a write no correct replica would take.
                        Err(refusal) => return self.refuse(op, refusal),
                    }
                }
                let sends: Vec<(Slot, Message)> = peers
                    .iter()
                    .copied()
                    .filter(|slot| !skip.contains(slot))
                    .map(|slot| {
                        let message = Message::Store {
                            pop,
                            client,
                            cells: cells.clone(),
                            tag: tags.get(slot.index()).copied(),
                        };
                        (slot, message)
                    })
                    .collect();
                let digests = cells.iter().map(Cell::digest).collect();
                let pending = Pending {
                    client,
                    op,
                    want: wanted,
                    waited: false,
                    peers,
                    kind: Kind::Write {
                        cells,
                        digests,
                        acks,
                        refused: BTreeMap::new(),
                        skip,
                    },
                };
                // Its own store is durable before anything goes out.
                Output {
                    changes,
                    ..Output::none()
                }
                .and(self.track(now, pop, pending, sends))
            }
            RequestBody::Read {
                row,
                columns,
                nonce,
                level,
                blacklist,
                full,
                resolver,
            } => {
                if !access.read {
                    return self.refuse(op, Refusal::NotReader);
                }
                if !row.is_well_formed() || columns.len() > COLUMNS_MAX {
                    return self.refuse(op, Refusal::Malformed("a row out of bounds".into()));
                }
                let Some(schema) = self.catalog.get(&row.table) else {
                    return self.refuse(op, Refusal::UnknownTable(row.table.clone()));
                };
                if let Some(column) = columns.iter().find(|c| !schema.has_column(c)) {
                    let refusal = Refusal::UnknownColumn {
                        table: row.table.clone(),
                        column: column.clone(),
                    };
                    return self.refuse(op, refusal);
                }
                let wanted = self.level_threshold(&row.table, level);
                let mut state = ReadState {
                    client,
                    row,
                    columns,
                    nonce,
                    blacklist,
                    asked: BTreeSet::new(),
                    answers: BTreeMap::new(),
                    data_round: full,
                    resolved: None,
                    current: BTreeSet::new(),
                    write_backs: BTreeMap::new(),
                    resolver,
                };
                // The proxy is the data replica of the digest round (spec §1.6): its own answer,
                // if it holds the table.
                let (own, peers) = self.peers(&state.row.table);
                if own
                    && !state.blacklist.contains(&me)
                    && let Some(own) = self.answer(client, &state.row, &state.columns, nonce, true)
                {
                    state.answers.insert(me, own);
                    state.asked.insert(me);
                }
                let mut targets: Vec<Slot> = peers
                    .iter()
                    .copied()
                    .filter(|slot| !state.blacklist.contains(slot))
                    .collect();
                targets.sort_by_key(|slot| self.missed.get(slot.index()).copied());
                if !full {
                    targets.truncate(wanted.saturating_sub(state.answers.len()));
                }
                let mut sends = state.ask(pop, &targets);
                if state.answers.is_empty()
                    && let Some((_, Message::Read { data, .. })) = sends.first_mut()
                {
                    // A proxy outside an eventual table, or one its client passed over, holds
                    // no data answer of its own: the first member it asks sends one, else the
                    // digests alone could never agree and every read would take a data round.
                    *data = true;
                }
                let pending = Pending {
                    client,
                    op,
                    want: wanted,
                    waited: false,
                    peers,
                    kind: Kind::Read(state),
                };
                self.track(now, pop, pending, sends)
            }
        }
    }

    /// Takes on client operation `pending` as proxy operation `pop`: its first `sends`, the
    /// wait after which it answers with what it has, and whatever it can do already.
    fn track(
        &mut self,
        now: Time,
        pop: u64,
        pending: Pending,
        sends: Vec<(Slot, Message)>,
    ) -> Output<Self> {
        self.serving.insert((pending.client, pending.op), pop);
        self.pending.insert(pop, pending);
        let out = Output {
            sends,
            timers: vec![(
                TimerId(pop),
                now.plus_millis(self.settings.proxy_wait_millis),
            )],
            ..Output::none()
        };
        out.and(self.progress(pop))
    }

    /// The other members, starting after this one, so proxies spread their first choices.
    fn others(&self) -> impl Iterator<Item = Slot> + use<> {
        others(&self.place)
    }

    /// The members holding `table` (every member for a table unknown here).
    fn replicas(&self, table: &str) -> Vec<Slot> {
        match self.catalog.get(table) {
            Some(schema) => schema.replicas(self.place.n, self.place.f),
            None => (0..self.place.n as u32).map(Slot).collect(),
        }
    }

    /// Whether the member in `slot` holds `table` (a table unknown here: as if it did).
    fn holds(&self, table: &str, slot: Slot) -> bool {
        self.catalog.get(table).is_none_or(|schema| {
            schema.replication == Replication::Strong
                || schema.replicas(self.place.n, self.place.f).contains(&slot)
        })
    }

    /// Whether this member holds `table`; and the other members that do, in the order a
    /// proxy asks them.
    fn peers(&self, table: &str) -> (bool, Vec<Slot>) {
        let replicas = self.replicas(table);
        let peers = self.others().filter(|s| replicas.contains(s)).collect();
        (replicas.contains(&self.place.slot), peers)
    }
}

/// The members other than `place`'s, starting after it.
fn others(place: &Place) -> impl Iterator<Item = Slot> + use<> {
    let (n, me) = (place.n as u32, place.slot.0);
    (1..n).map(move |i| Slot((me + i) % n))
}

impl ReadState {
    /// Read requests to `targets` for the current round, recorded as asked.
    fn ask(&mut self, pop: u64, targets: &[Slot]) -> Vec<(Slot, Message)> {
        let state = self;
        targets
            .iter()
            .filter(|slot| state.asked.insert(**slot))
            .map(|slot| {
                let message = Message::Read {
                    pop,
                    client: state.client,
                    row: state.row.clone(),
                    columns: state.columns.clone(),
                    nonce: state.nonce,
                    data: state.data_round,
                };
                (*slot, message)
            })
            .collect()
    }
}

impl Server {
    /// Moves operation `pop` on as far as what it holds allows: answers the client when done.
    fn progress(&mut self, pop: u64) -> Output<Self> {
        let Some(pending) = self.pending.get_mut(&pop) else {
            return Output::none();
        };
        let want = pending.want;
        if matches!(pending.kind, Kind::Range(_)) {
            return self.progress_range(pop);
        }
        let done = match &mut pending.kind {
            Kind::Write { acks, refused, .. } => {
                if refused.len() > self.place.f {
                    let refusal = refused.values().next().cloned();
                    refusal.map(ResponseBody::Refused)
                } else if acks.len() >= want {
                    Some(ResponseBody::Acks(
                        acks.iter().map(|(s, a)| (*s, a.clone())).collect(),
                    ))
                } else {
                    None
                }
            }
            Kind::Range(_) => None,
            Kind::Read(state) => {
                if state.resolved.is_some() {
                    (state.current.len() >= want || self.mutations.skip_write_back)
                        .then(|| read_reply(state))
                } else if state.answers.len() < want {
                    None
                } else if (!state.data_round && agree(state))
                    || (state.data_round && state.resolver == Resolver::Client)
                {
                    // The client resolves data answers itself (spec §3.6).
                    Some(read_reply(state))
                } else if !state.data_round {
                    // The digests disagree: every replica sends data (spec §3.3, all of them).
                    state.data_round = true;
                    state.asked.clear();
                    state.answers.retain(|_, answered| answered.cells.is_some());
                    state.asked.extend(state.answers.keys().copied());
                    let targets: Vec<Slot> = pending
                        .peers
                        .iter()
                        .copied()
                        .filter(|slot| !state.blacklist.contains(slot))
                        .collect();
                    let sends = state.ask(pop, &targets);
                    return Output {
                        sends,
                        ..Output::none()
                    }
                    .and(self.progress_more(pop));
                } else {
                    return self.resolve(pop);
                }
            }
        };
        match done {
            Some(body) => self.finish(pop, body),
            None => Output::none(),
        }
    }

    /// `progress` again after a round changed, when the answers already in may suffice.
    fn progress_more(&mut self, pop: u64) -> Output<Self> {
        let enough = self.pending.get(&pop).is_some_and(|p| match &p.kind {
            Kind::Read(state) => state.answers.len() >= p.want,
            Kind::Write { .. } | Kind::Range(_) => false,
        });
        if enough {
            self.progress(pop)
        } else {
            Output::none()
        }
    }

    /// The data round has a quorum: resolves each cell among versions whose writer's signature
    /// verifies, then writes the result back to every replica not known to hold it.
    fn resolve(&mut self, pop: u64) -> Output<Self> {
        let Some(Pending {
            kind: Kind::Read(state),
            want,
            ..
        }) = self.pending.get(&pop)
        else {
            return Output::none();
        };
        let want = *want;
        let grace = self.grace(self.now, &state.row.table);
        let mut best: BTreeMap<String, (Cell, SignedCell)> = BTreeMap::new();
        let mut candidates: Vec<(Cell, SignedCell)> = state
            .answers
            .values()
            .flat_map(|answered| answered.cells.iter().flatten())
            .filter_map(|signed| Some((signed.peek().ok()?, signed.clone())))
            .filter(|(cell, _)| cell.row == state.row)
            .filter(|(cell, _)| state.columns.is_empty() || state.columns.contains(&cell.column))
            .collect();
        candidates.sort_by(|a, b| b.0.rank().cmp(&a.0.rank()));
        candidates.dedup_by(|a, b| a.1.bytes() == b.1.bytes());
        let mut forged = 0;
        let mut passed = BTreeSet::new();
        for (cell, signed) in candidates {
            if best.contains_key(&cell.column) {
                continue;
            }
            let holders = || {
                let holds = |a: &&Answered| {
                    a.cells
                        .iter()
                        .flatten()
                        .any(|c| c.bytes() == signed.bytes())
                };
                state.answers.values().filter(holds).count()
            };
            if grace.passes_over(&cell, holders) {
                passed.insert(Cell::digest(&signed));
                continue;
            }
            let genuine = self.mutations.unverified_cells || self.genuine(&signed).is_some();
            if genuine {
                best.insert(cell.column.clone(), (cell, signed));
            } else {
                forged += 1;
            }
        }
        self.table_stats.forged_cells += forged;
        self.table_stats.resolved_reads += 1;
        let cells: Vec<SignedCell> = best.values().map(|(_, signed)| signed.clone()).collect();
        let entries = entries_of(best.values().map(|(cell, signed)| (cell, signed)));
        let Some(Pending {
            kind: Kind::Read(state),
            ..
        }) = self.pending.get_mut(&pop)
        else {
            return Output::none();
        };
        state.current = state
            .answers
            .iter()
            .filter(|(_, answered)| {
                answered
                    .answer
                    .peek()
                    .is_ok_and(|answer| without(&answer.entries, &passed) == entries)
            })
            .map(|(slot, _)| *slot)
            .collect();
        state.resolved = Some((cells, entries));
        if state.current.len() >= want || self.mutations.skip_write_back {
            return self.progress(pop);
        }
        self.write_back_stale(pop)
    }

    /// Writes read `pop`'s resolution back to every member not known current, itself first.
    fn write_back_stale(&mut self, pop: u64) -> Output<Self> {
        let me = self.place.slot;
        let Some(Pending {
            kind: Kind::Read(state),
            peers,
            ..
        }) = self.pending.get_mut(&pop)
        else {
            return Output::none();
        };
        let Some((cells, _)) = state.resolved.clone() else {
            return Output::none();
        };
        let own = self
            .catalog
            .get(&state.row.table)
            .is_none_or(|schema| schema.replicas(self.place.n, self.place.f).contains(&me));
        let stale: Vec<Slot> = own
            .then_some(me)
            .into_iter()
            .chain(peers.iter().copied())
            .filter(|slot| !state.current.contains(slot) && !state.blacklist.contains(slot))
            .collect();
        let (client, row, nonce) = (state.client, state.row.clone(), state.nonce);
        let mut out = Output::none();
        for slot in stale {
            if slot == me {
                // Itself first: its own write-back, durable before anything it says after.
                if let Ok((changes, ack)) = self.write_back(self.now, client, &row, nonce, &cells) {
                    out.changes.extend(changes);
                    if let Some(Pending {
                        kind: Kind::Read(state),
                        ..
                    }) = self.pending.get_mut(&pop)
                    {
                        state.current.insert(me);
                        state.write_backs.insert(me, ack);
                    }
                }
            } else {
                let message = Message::WriteBack {
                    pop,
                    client,
                    row: row.clone(),
                    nonce,
                    cells: cells.clone(),
                };
                out.sends.push((slot, message));
            }
        }
        out.and(self.progress(pop))
    }

    /// Answers the client of `pop` and forgets the operation.
    fn finish(&mut self, pop: u64, body: ResponseBody) -> Output<Self> {
        let Some(pending) = self.pending.remove(&pop) else {
            return Output::none();
        };
        // The client passes over a revoked writer's versions as the proxy did.
        let body = match body {
            ResponseBody::Read {
                answers,
                resolved,
                write_backs,
                ..
            } => {
                let cells = answers.iter().flat_map(|(_, a)| a.cells.iter().flatten());
                ResponseBody::Read {
                    revocations: self.revocations_of(cells),
                    answers,
                    resolved,
                    write_backs,
                }
            }
            ResponseBody::Range {
                answers,
                write_backs,
                ..
            } => {
                let cells = answers.iter().flat_map(|(_, a)| a.cells.iter());
                ResponseBody::Range {
                    revocations: self.revocations_of(cells),
                    answers,
                    write_backs,
                }
            }
            other => other,
        };
        self.serving.remove(&(pending.client, pending.op));
        Output {
            notify: vec![(
                pending.client,
                pending.op,
                Response {
                    op: pending.op,
                    body,
                },
            )],
            ..Output::none()
        }
    }

    /// A replica's message to this proxy about operation `pop`.
    fn on_proxy_message(&mut self, from: Slot, message: Message) -> Output<Self> {
        if let Some(missed) = self.missed.get_mut(from.index()) {
            *missed = 0;
        }
        let pop = match &message {
            Message::StoreAck { pop, .. }
            | Message::Answer { pop, .. }
            | Message::WriteBackAck { pop, .. }
            | Message::RangeAnswer { pop, .. }
            | Message::RangeWriteBackAck { pop, .. }
            | Message::Refused { pop, .. } => *pop,
            _ => return Output::none(),
        };
        let teach = match &message {
            Message::Refused {
                refusal: Refusal::UnknownTable(name),
                ..
            } => self.catalog.get(name).cloned(),
            _ => None,
        };
        let taught = Output {
            sends: teach
                .map(|schema| (from, Message::Schema { schema }))
                .into_iter()
                .collect(),
            ..Output::none()
        };
        let Some(pending) = self.pending.get(&pop) else {
            return taught;
        };
        if !pending.peers.contains(&from) {
            // Only the table's replicas this proxy asks count (spec §5.1 item 2).
            return taught;
        }
        let (epoch, group) = (self.place.epoch, self.place.group);
        match (message, &pending.kind) {
            (Message::StoreAck { ack, .. }, Kind::Write { digests, cells, .. }) => {
                let verify = cells
                    .first()
                    .and_then(|c| c.peek().ok())
                    .is_some_and(|cell| self.verifies(&cell.row.table));
                let digests = digests.clone();
                let good = self.valid(verify, from, &ack, |ack| {
                    ack.slot == from
                        && ack.epoch == epoch
                        && ack.group == group
                        && ack.cells == digests
                });
                if let Some(Pending {
                    kind: Kind::Write { acks, skip, .. },
                    ..
                }) = self.pending.get_mut(&pop)
                    && good
                    && !skip.contains(&from)
                {
                    acks.entry(from).or_insert(ack);
                }
            }
            (Message::Refused { refusal, .. }, Kind::Write { .. }) => {
                if let Some(Pending {
                    kind: Kind::Write { refused, .. },
                    ..
                }) = self.pending.get_mut(&pop)
                {
                    refused.entry(from).or_insert(refusal);
                }
            }
            (Message::Answer { mut answered, .. }, Kind::Read(state)) => {
                if !state.asked.contains(&from) || state.resolved.is_some() {
                    return Output::none();
                }
                let verify = self.verifies(&state.row.table);
                let (row, nonce, data) = (state.row.clone(), state.nonce, state.data_round);
                // Cells that are not the ones the answer names count as no data: else a faulty
                // data replica of a digest round would end it in agreement without data the
                // client can use, and the client would leave a correct proxy.
                let named = answered.answer.peek().ok().map(|answer| answer.entries);
                if answered
                    .cells
                    .as_ref()
                    .is_some_and(|cells| resolution_entries(&row, cells) != named)
                {
                    answered.cells = None;
                }
                let good = self.valid(verify, from, &answered.answer, |answer| {
                    answer.slot == from
                        && answer.epoch == epoch
                        && answer.group == group
                        && answer.row == row
                        && answer.nonce == nonce
                }) && (!data || answered.cells.is_some());
                if let Some(Pending {
                    kind: Kind::Read(state),
                    peers,
                    ..
                }) = self.pending.get_mut(&pop)
                {
                    if good {
                        state.answers.entry(from).or_insert(answered);
                    } else {
                        // One answer short now: ask the members not asked yet rather than wait.
                        let targets: Vec<Slot> = peers
                            .iter()
                            .copied()
                            .filter(|slot| !state.blacklist.contains(slot))
                            .collect();
                        let sends = state.ask(pop, &targets);
                        return taught.and(Output {
                            sends,
                            ..Output::none()
                        });
                    }
                }
            }
            (Message::WriteBackAck { ack, .. }, Kind::Read(state)) => {
                let Some((_, entries)) = &state.resolved else {
                    return Output::none();
                };
                let verify = self.verifies(&state.row.table);
                let (row, nonce, entries) = (state.row.clone(), state.nonce, entries.clone());
                let good = self.valid(verify, from, &ack, |ack| {
                    ack.slot == from
                        && ack.epoch == epoch
                        && ack.group == group
                        && ack.row == row
                        && ack.nonce == nonce
                        && ack.entries == entries
                });
                if let Some(Pending {
                    kind: Kind::Read(state),
                    ..
                }) = self.pending.get_mut(&pop)
                    && good
                {
                    state.current.insert(from);
                    state.write_backs.entry(from).or_insert(ack);
                }
            }
            (Message::RangeAnswer { answered, .. }, Kind::Range(_)) => {
                return taught.and(self.on_range_answer(pop, from, answered));
            }
            (Message::RangeWriteBackAck { ack, .. }, Kind::Range(state)) => {
                let Some(listing) = state.resolved else {
                    return taught;
                };
                let verify = self.verifies(&state.range.table);
                let nonce = state.nonce;
                let good = self.valid(verify, from, &ack, |ack| {
                    ack.slot == from
                        && ack.epoch == epoch
                        && ack.group == group
                        && ack.nonce == nonce
                        && ack.listing == listing
                });
                if let Some(Pending {
                    kind: Kind::Range(state),
                    ..
                }) = self.pending.get_mut(&pop)
                    && good
                {
                    state.current.insert(from);
                    state.write_backs.entry(from).or_insert(ack);
                }
            }
            _ => return taught,
        }
        taught.and(self.progress(pop))
    }

    /// A proxy's request to this replica.
    fn on_replica_message(&mut self, now: Time, from: Slot, message: Message) -> Output<Self> {
        let (pop, result) = match message {
            Message::Store {
                pop,
                client,
                cells,
                tag,
            } => (
                pop,
                self.store(now, client, &cells, true, tag.as_ref())
                    .map(|(changes, ack)| (changes, Message::StoreAck { pop, ack })),
            ),
            Message::Read {
                pop,
                client,
                row,
                columns,
                nonce,
                data,
            } => {
                if !row.is_well_formed() || columns.len() > COLUMNS_MAX {
                    (pop, Err(Refusal::Malformed("a row out of bounds".into())))
                } else if self.catalog.get(&row.table).is_none() {
                    (pop, Err(Refusal::UnknownTable(row.table.clone())))
                } else if !self.holds(&row.table, self.place.slot) {
                    (pop, Err(Refusal::NotReplica(row.table.clone())))
                } else {
                    match self.answer(client, &row, &columns, nonce, data) {
                        Some(answered) => {
                            (pop, Ok((Vec::new(), Message::Answer { pop, answered })))
                        }
                        None => return Output::none(),
                    }
                }
            }
            Message::WriteBack {
                pop,
                client,
                row,
                nonce,
                cells,
            } => (
                pop,
                self.write_back(now, client, &row, nonce, &cells)
                    .map(|(changes, ack)| (changes, Message::WriteBackAck { pop, ack })),
            ),
            Message::RangeRead {
                pop,
                client,
                range,
                nonce,
            } => {
                if let Some(problem) = range.problem() {
                    (pop, Err(Refusal::Malformed(problem)))
                } else if self.catalog.get(&range.table).is_none() {
                    (pop, Err(Refusal::UnknownTable(range.table.clone())))
                } else if !self.holds(&range.table, self.place.slot) {
                    (pop, Err(Refusal::NotReplica(range.table.clone())))
                } else {
                    match self.range_answered(client, &range, nonce) {
                        Some(answered) => (
                            pop,
                            Ok((Vec::new(), Message::RangeAnswer { pop, answered })),
                        ),
                        None => return Output::none(),
                    }
                }
            }
            Message::RangeWriteBack {
                pop,
                client,
                table,
                nonce,
                cells,
            } => {
                let (changes, result) = self.range_write_back(now, client, &table, nonce, &cells);
                let (message, refused) = match result {
                    Ok(ack) => (Message::RangeWriteBackAck { pop, ack }, None),
                    Err(refusal) => {
                        let reason = refusal.to_string();
                        (Message::Refused { pop, refusal }, Some(reason))
                    }
                };
                return Output {
                    changes,
                    refused,
                    sends: vec![(from, message)],
                    ..Output::none()
                };
            }
            Message::Schema { schema } => return self.offered(from, schema),
            Message::Revocations { revocations } => {
                let (mut changes, mut refused) = (Vec::new(), None);
                for revocation in revocations.into_iter().take(REVOKED_MAX) {
                    match self.revoke(revocation) {
                        Ok(change) => changes.extend(change),
                        Err(refusal) => refused = Some(format!("a revocation: {refusal}")),
                    }
                }
                return Output {
                    changes,
                    refused,
                    ..Output::none()
                };
            }
            Message::SyncOffer {
                round,
                after,
                until,
                listing,
            } => return self.on_sync_offer(from, round, after, until, listing),
            Message::SyncReply { round, want, cells } => {
                return self.on_sync_reply(now, from, round, want, cells);
            }
            Message::SyncCells { round, cells } => {
                return self.on_sync_cells(now, from, round, cells);
            }
            Message::Live { round, cells } => return self.on_live(from, round, cells),
            Message::LiveReply { round, held } => {
                return self.on_live_reply(now, from, round, held);
            }
            other => return self.on_proxy_message(from, other),
        };
        match result {
            Ok((changes, answer)) => Output {
                changes,
                sends: vec![(from, answer)],
                ..Output::none()
            },
            Err(refusal) => Output {
                refused: Some(refusal.to_string()),
                sends: vec![(from, Message::Refused { pop, refusal })],
                ..Output::none()
            },
        }
    }
}

/// The entries of a client's resolution of `row`: one cell per column, each of the row, at
/// most a row's columns; `None` if it is not one.
fn resolution_entries(row: &RowKey, cells: &[SignedCell]) -> Option<Vec<Entry>> {
    if !row.is_well_formed() || cells.len() > COLUMNS_MAX {
        return None;
    }
    let decoded: Vec<Cell> = cells.iter().map(|c| c.peek().ok()).collect::<Option<_>>()?;
    let columns: BTreeSet<&str> = decoded.iter().map(|c| c.column.as_str()).collect();
    if columns.len() != decoded.len() || decoded.iter().any(|c| c.row != *row) {
        return None;
    }
    Some(entries_of(decoded.iter().zip(cells)))
}

/// Whether a digest round's answers all name the same cells, one of them with the data.
fn agree(state: &ReadState) -> bool {
    let entries: Vec<Option<Vec<Entry>>> = state
        .answers
        .values()
        .map(|answered| answered.answer.peek().ok().map(|answer| answer.entries))
        .collect();
    let has_data = state.answers.values().any(|a| a.cells.is_some());
    has_data
        && entries.windows(2).all(|pair| pair[0] == pair[1])
        && entries.first().is_some_and(Option::is_some)
}

fn read_reply(state: &ReadState) -> ResponseBody {
    ResponseBody::Read {
        answers: state
            .answers
            .iter()
            .map(|(slot, answered)| (*slot, answered.clone()))
            .collect(),
        resolved: state.resolved.as_ref().map(|(cells, _)| cells.clone()),
        write_backs: state
            .write_backs
            .iter()
            .map(|(slot, ack)| (*slot, ack.clone()))
            .collect(),
        revocations: Vec::new(),
    }
}

impl Replica for Server {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Message = Message;
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
        self.now = now;
        let out = self.start(now, client, access, request);
        out.and(self.arm_check(now))
    }

    fn on_message(&mut self, now: Time, from: Slot, message: Message, _view: &()) -> Output<Self> {
        self.now = now;
        if from.index() >= self.place.n || from == self.place.slot {
            return Output {
                refused: Some("a message from outside the group".into()),
                ..Output::none()
            };
        }
        let out = self.on_replica_message(now, from, message);
        out.and(self.arm_check(now))
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, _view: &()) -> Output<Self> {
        self.now = now;
        if timer == CHECK_TIMER {
            self.check_armed = false;
            let removed = Output {
                changes: self.check_tagged(UNCHECKED_PER_TURN),
                ..Output::none()
            };
            return removed.and(self.arm_check(now));
        }
        let pop = timer.0;
        let Some(pending) = self.pending.get_mut(&pop) else {
            return Output::none();
        };
        let silent: Vec<Slot> = match &pending.kind {
            Kind::Write {
                acks,
                refused,
                skip,
                ..
            } => pending
                .peers
                .iter()
                .copied()
                .filter(|s| !acks.contains_key(s) && !refused.contains_key(s) && !skip.contains(s))
                .collect(),
            Kind::Read(state) => state
                .asked
                .iter()
                .filter(|s| !state.answers.contains_key(s) && !state.current.contains(s))
                .copied()
                .collect(),
            Kind::Range(state) => state
                .asked
                .iter()
                .filter(|s| !state.answers.contains_key(s) && !state.current.contains(s))
                .copied()
                .collect(),
        };
        for slot in silent {
            if let Some(missed) = self.missed.get_mut(slot.index()) {
                *missed = missed.saturating_add(1);
            }
        }
        let retry = now.plus_millis(self.settings.proxy_wait_millis);
        if !pending.waited
            && let Kind::Read(state) = &mut pending.kind
            && state.resolved.is_none()
        {
            // The replicas asked first were slow: ask every other one too, and wait once more.
            pending.waited = true;
            let targets: Vec<Slot> = pending
                .peers
                .iter()
                .copied()
                .filter(|slot| !state.blacklist.contains(slot))
                .collect();
            let sends = state.ask(pop, &targets);
            return Output {
                sends,
                timers: vec![(timer, retry)],
                ..Output::none()
            };
        }
        if !pending.waited
            && let Kind::Range(state) = &mut pending.kind
            && state.resolved.is_none()
        {
            pending.waited = true;
            let targets: Vec<Slot> = pending
                .peers
                .iter()
                .copied()
                .filter(|slot| !state.blacklist.contains(slot))
                .collect();
            let sends = state.ask(pop, &targets);
            return Output {
                sends,
                timers: vec![(timer, retry)],
                ..Output::none()
            };
        }
        // The wait is over: the client gets what there is and judges it.
        let body = match &pending.kind {
            Kind::Write { acks, .. } => {
                ResponseBody::Acks(acks.iter().map(|(s, a)| (*s, a.clone())).collect())
            }
            Kind::Read(state) => read_reply(state),
            Kind::Range(state) => state.reply(),
        };
        self.finish(pop, body)
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        self.now = now;
        // A driver whose timers were lost (a restart) still checks, a batch per tick.
        Output {
            changes: self.check_tagged(UNCHECKED_PER_TURN),
            ..Output::none()
        }
        .and(self.anti_entropy(now))
        .and(self.collect_tombstones(now))
        .and(self.liveness_round())
        .and(self.arm_check(now))
    }

    fn stats(&self) -> ReplicaStats {
        let table = &self.table_stats;
        ReplicaStats {
            synced: table.synced,
            mac_fallbacks: table.mac_fallbacks,
            collected: table.collected,
            confirmed_live: table.confirmed_live,
            not_live: table.not_live,
            revoked_clients: self.revoked.len() as u64,
            revoked_refused: table.revoked_refused,
            bad_signatures: table.bad_signatures.values().sum(),
            forged_cells: table.forged_cells,
            resolved_reads: table.resolved_reads,
            repairs: table.repairs,
            bad_signers: table
                .bad_signatures
                .iter()
                .map(|(slot, count)| (slot.0, *count))
                .collect(),
            ..self.stats.clone()
        }
    }
}

impl RangeState {
    /// Range reads to `targets`, recorded as asked.
    fn ask(&mut self, pop: u64, targets: &[Slot]) -> Vec<(Slot, Message)> {
        let state = self;
        targets
            .iter()
            .filter(|slot| state.asked.insert(**slot))
            .map(|slot| {
                let message = Message::RangeRead {
                    pop,
                    client: state.client,
                    range: state.range.clone(),
                    nonce: state.nonce,
                };
                (*slot, message)
            })
            .collect()
    }

    fn reply(&self) -> ResponseBody {
        ResponseBody::Range {
            answers: self
                .answers
                .iter()
                .map(|(slot, answered)| (*slot, answered.clone()))
                .collect(),
            write_backs: self
                .write_backs
                .iter()
                .map(|(slot, ack)| (*slot, ack.clone()))
                .collect(),
            revocations: Vec::new(),
        }
    }
}

/// Range reads: the replica's walk and write-back, and the proxy's rounds.
impl Server {
    /// A page of `range` as this replica holds it: rows in scan order until the limit, the
    /// byte budget or the range's end, the newest cell of each column asked for.
    fn range_page(&self, range: &Range, nonce: Nonce) -> (RangeAnswer, Vec<SignedCell>) {
        let origin = Position {
            token: bulwark_core::membership::RingPoint([0; 32]),
            partition: Vec::new(),
            clustering: Vec::new(),
        };
        let lower = (range.table.clone(), range.first().unwrap_or(origin));
        let mut rows = Vec::new();
        let mut cells = Vec::new();
        let mut bytes = 0;
        let mut complete = true;
        for ((table, position), held) in self.rows.range(lower..) {
            if range.passed(table, position) {
                break;
            }
            let Some(row) = held.values().next().map(|h| &h.cell.row) else {
                continue;
            };
            let chosen: Vec<&Held> = held
                .values()
                .filter(|h| range.columns.is_empty() || range.columns.contains(&h.cell.column))
                .collect();
            if chosen.is_empty() || !range.contains(row, position) {
                continue;
            }
            if rows.len() == range.limit as usize || bytes >= PAGE_BYTES {
                complete = false;
                break;
            }
            rows.push((
                row.clone(),
                entries_of(chosen.iter().map(|h| (&h.cell, &h.signed))),
            ));
            // Entries are in column order and so are the held cells (a BTreeMap by column).
            for h in chosen {
                bytes += h.signed.bytes().len();
                cells.push(h.signed.clone());
            }
        }
        let answer = RangeAnswer {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            range: range.clone(),
            nonce,
            rows,
            complete,
        };
        (answer, cells)
    }

    /// RANGE-READ as a replica: its page, signed.
    fn range_answered(
        &self,
        client: ClientId,
        range: &Range,
        nonce: Nonce,
    ) -> Option<RangeAnswered> {
        let (answer, cells) = self.range_page(range, nonce);
        Some(RangeAnswered {
            answer: self.seal(&range.table, client, answer)?,
            cells,
        })
    }

    /// RANGE-WRITE-BACK as a replica: keeps what is newer, row by row, and says it holds at
    /// least the cells sent, by the digest of their listing.
    fn range_write_back(
        &mut self,
        now: Time,
        client: ClientId,
        table: &str,
        nonce: Nonce,
        cells: &[SignedCell],
    ) -> (Vec<Change>, Result<Unverified<RangeWriteBackAck>, Refusal>) {
        if cells.len() > RANGE_ROWS_MAX * COLUMNS_MAX {
            let refusal = Refusal::Malformed("a write-back over a page".into());
            return (Vec::new(), Err(refusal));
        }
        let Some(decoded) = cells
            .iter()
            .map(|signed| signed.peek().ok().filter(|cell| cell.row.table == table))
            .collect::<Option<Vec<Cell>>>()
        else {
            let refusal = Refusal::Malformed("an undecodable or foreign cell".into());
            return (Vec::new(), Err(refusal));
        };
        if let Some(refusal) = self.park_doubtful(now, cells) {
            return (Vec::new(), Err(refusal));
        }
        // What it kept stays kept, and durable (every cell verified), refused rows or not.
        let (changes, refused) = self.accept_rows(now, cells);
        if let Some(refusal) = refused {
            return (changes, Err(refusal));
        }
        self.table_stats.repairs += 1;
        let listing = listing_of(decoded.iter().zip(cells));
        let ack = RangeWriteBackAck {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            nonce,
            listing: listing_digest(&listing),
        };
        let ack = self
            .seal(table, client, ack)
            .ok_or_else(|| Refusal::Malformed("unsignable".into()));
        (changes, ack)
    }

    /// A range read as proxy: its own page, then the members that answer first until a quorum.
    #[allow(clippy::too_many_arguments)]
    fn start_range(
        &mut self,
        now: Time,
        pop: u64,
        client: ClientId,
        op: u64,
        wanted: usize,
        range: Range,
        nonce: Nonce,
        blacklist: Vec<Slot>,
    ) -> Output<Self> {
        let me = self.place.slot;
        let mut state = RangeState {
            client,
            range,
            nonce,
            blacklist: blacklist.into_iter().collect(),
            asked: BTreeSet::new(),
            answers: BTreeMap::new(),
            pages: BTreeMap::new(),
            resolved: None,
            current: BTreeSet::new(),
            write_backs: BTreeMap::new(),
        };
        let (own, peers) = self.peers(&state.range.table);
        if own
            && !state.blacklist.contains(&me)
            && let Some(own) = self.range_answered(client, &state.range, nonce)
            && let Some(page) = own.answer.peek().ok().and_then(|answer| {
                check_page(
                    &self.place,
                    me,
                    &state.range,
                    nonce,
                    answer,
                    own.cells.clone(),
                )
            })
        {
            state.asked.insert(me);
            state.pages.insert(me, page);
            state.answers.insert(me, own);
        }
        let mut targets: Vec<Slot> = peers
            .iter()
            .copied()
            .filter(|slot| !state.blacklist.contains(slot))
            .collect();
        targets.sort_by_key(|slot| self.missed.get(slot.index()).copied());
        targets.truncate(wanted.saturating_sub(state.pages.len()));
        let sends = state.ask(pop, &targets);
        let pending = Pending {
            client,
            op,
            want: wanted,
            waited: false,
            peers,
            kind: Kind::Range(state),
        };
        self.track(now, pop, pending, sends)
    }

    /// A member's page for range read `pop`: kept if it checks out, else the members not asked
    /// yet are asked.
    fn on_range_answer(&mut self, pop: u64, from: Slot, answered: RangeAnswered) -> Output<Self> {
        let Some(Pending {
            kind: Kind::Range(state),
            ..
        }) = self.pending.get(&pop)
        else {
            return Output::none();
        };
        if !state.asked.contains(&from)
            || state.resolved.is_some()
            || state.pages.contains_key(&from)
            || state.blacklist.contains(&from)
        {
            return Output::none();
        }
        let verify = self.verifies(&state.range.table);
        let (range, nonce) = (state.range.clone(), state.nonce);
        let signed = self.valid(verify, from, &answered.answer, |_| true);
        let place = self.place;
        let page = signed
            .then(|| answered.answer.peek().ok())
            .flatten()
            .and_then(|answer| {
                check_page(&place, from, &range, nonce, answer, answered.cells.clone())
            });
        if page.is_none()
            && let Some(missed) = self.missed.get_mut(from.index())
        {
            *missed = missed.saturating_add(1);
        }
        let Some(Pending {
            kind: Kind::Range(state),
            peers,
            ..
        }) = self.pending.get_mut(&pop)
        else {
            return Output::none();
        };
        match page {
            Some(page) => {
                state.pages.insert(from, page);
                state.answers.insert(from, answered);
                self.progress_range(pop)
            }
            None => {
                // One answer short now: ask the members not asked yet rather than wait.
                state.blacklist.insert(from);
                let targets: Vec<Slot> = peers
                    .iter()
                    .copied()
                    .filter(|slot| !state.blacklist.contains(slot))
                    .collect();
                Output {
                    sends: state.ask(pop, &targets),
                    ..Output::none()
                }
            }
        }
    }

    /// Moves range read `pop` on: resolves once a quorum of pages is in, answers at once when
    /// a quorum already holds the resolution, else writes it back to the others.
    fn progress_range(&mut self, pop: u64) -> Output<Self> {
        let Some(Pending {
            kind: Kind::Range(state),
            want,
            ..
        }) = self.pending.get_mut(&pop)
        else {
            return Output::none();
        };
        let want = *want;
        if state.resolved.is_some() {
            if state.current.len() >= want || self.mutations.skip_write_back {
                let body = state.reply();
                return self.finish(pop, body);
            }
            return Output::none();
        }
        if state.pages.len() < want {
            return Output::none();
        }
        let pages = std::mem::take(&mut state.pages);
        let range = state.range.clone();
        // Versions `f+1` answers vouch for are held by a correct replica, which stored only
        // what verified; the rest are checked here. A proxy that does not verify answers may
        // count forged ones: then it writes back what correct replicas refuse, and the client,
        // which resolves for itself from answers it verified, asks again. Safety is the
        // client's; this only spares the proxy a writer check per cell.
        let vouched = self.place.f + 1;
        let unverified = self.mutations.unverified_cells;
        let grace = self.grace(self.now, &range.table);
        let resolution = resolve(&range, &pages, vouched, &grace, |signed| {
            unverified || self.genuine(signed).is_some()
        });
        let own = self.peers(&range.table).0;
        let Some(Pending {
            kind: Kind::Range(state),
            peers,
            ..
        }) = self.pending.get_mut(&pop)
        else {
            return Output::none();
        };
        state.pages = pages;
        if !resolution.forged.is_empty() {
            // Whoever vouched for a forged cell is faulty: its answer goes, the others are asked.
            self.table_stats.forged_cells += resolution.forged.len() as u64;
            for (_, holders) in &resolution.forged {
                for slot in holders {
                    state.pages.remove(slot);
                    state.answers.remove(slot);
                    state.blacklist.insert(*slot);
                }
            }
            let targets: Vec<Slot> = peers
                .iter()
                .copied()
                .filter(|slot| !state.blacklist.contains(slot))
                .collect();
            let sends = state.ask(pop, &targets);
            return Output {
                sends,
                ..Output::none()
            }
            .and(self.progress_range(pop));
        }
        state.current = resolution.current.clone();
        if state.current.len() >= want || self.mutations.skip_write_back {
            let body = state.reply();
            return self.finish(pop, body);
        }
        self.table_stats.resolved_reads += 1;
        let cells = resolution.cells();
        state.resolved = Some(listing_digest(&resolution.listing()));
        let me = self.place.slot;
        let stale: Vec<Slot> = own
            .then_some(me)
            .into_iter()
            .chain(peers.iter().copied())
            .filter(|slot| !state.current.contains(slot) && !state.blacklist.contains(slot))
            .collect();
        let (client, nonce) = (state.client, state.nonce);
        let mut out = Output::none();
        for slot in stale {
            if slot == me {
                // Itself first: its own write-back, durable before anything it says after.
                let (changes, result) =
                    self.range_write_back(self.now, client, &range.table, nonce, &cells);
                out.changes.extend(changes);
                if let Ok(ack) = result
                    && let Some(Pending {
                        kind: Kind::Range(state),
                        ..
                    }) = self.pending.get_mut(&pop)
                {
                    state.current.insert(me);
                    state.write_backs.insert(me, ack);
                }
            } else {
                let message = Message::RangeWriteBack {
                    pop,
                    client,
                    table: range.table.clone(),
                    nonce,
                    cells: cells.clone(),
                };
                out.sends.push((slot, message));
            }
        }
        out.and(self.progress_range(pop))
    }
}

/// Anti-entropy: every member offers a window of its rows to the next member in turn, so a
/// member that missed writes (down, partitioned, or passed over by a proxy that stored a write
/// on a bare quorum, spec §2.7) catches up without a read, and a tombstone reaches every member
/// (spec §2.14). Every cell travels with its writer's signature and is checked by whoever
/// keeps it, so a member can only withhold through anti-entropy, never forge.
impl Server {
    /// The next round, when due: the window after the cursor, offered to the next member.
    fn anti_entropy(&mut self, now: Time) -> Output<Self> {
        let interval = self.settings.anti_entropy_millis;
        if interval == 0
            || self.mutations.no_anti_entropy
            || self.place.n < 2
            || self.catalog.is_empty()
        {
            return Output::none();
        }
        match self.sync.next_at {
            Some(at) if now >= at => {}
            Some(_) => return Output::none(),
            None => {
                self.sync.next_at = Some(now.plus_millis(interval));
                return Output::none();
            }
        }
        self.sync.next_at = Some(now.plus_millis(interval));
        // Window `w` of pass `p` goes to the other members in turn from the `p`-th: the windows
        // of a pass go to different members, and each window to every member over `n - 1`
        // passes (not always to the same one, which could be faulty). Stepping the last peer
        // instead skipped members: a pass of one window stepped by two, so of four members
        // each offered to only two of the others, and the two correct replicas of an eventual
        // table beside a faulty one and a non-replica never met.
        let others: Vec<Slot> = self.others().collect();
        let turn = (self.sync.pass + self.sync.window) % others.len() as u64;
        let peer = others[turn as usize].0;
        self.sync.round += 1;
        let after = self.sync.cursor.clone();
        let mut listing = Vec::new();
        let mut until = None;
        let walk = match &after {
            Some(key) => self.rows.range((
                std::ops::Bound::Excluded(key.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => self.rows.range(..),
        };
        // A window is the next `SYNC_ROWS` rows whoever the peer is (rows of eventual tables it
        // does not hold are walked, not listed), so windows are the same key ranges pass after
        // pass and the rotation above brings each to every member.
        for (key, held) in walk.take(SYNC_ROWS) {
            let Some(row) = held.values().next().map(|h| h.cell.row.clone()) else {
                continue;
            };
            until = Some(key.clone());
            if !self.holds(&key.0, Slot(peer)) {
                continue;
            }
            listing.push((row, entries_of(held.values().map(|h| (&h.cell, &h.signed)))));
        }
        let more = until.as_ref().is_some_and(|last| {
            self.rows
                .range((
                    std::ops::Bound::Excluded(last.clone()),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .is_some()
        });
        // The last window reaches the end, so the receiver offers back what lies after it too.
        let until = if more { until } else { None };
        if until.is_none() {
            self.sync.pass += 1;
            self.sync.window = 0;
        } else {
            self.sync.window += 1;
        }
        self.sync.cursor = until.clone();
        let (slot, round) = (Slot(peer), self.sync.round);
        self.sync
            .offered
            .insert(slot, (round, (after.clone(), until.clone())));
        let mut sends = vec![(
            slot,
            Message::SyncOffer {
                round,
                after,
                until,
                listing,
            },
        )];
        if !self.revoked.is_empty() && round.is_multiple_of(REVOCATIONS_EVERY) {
            // To every member, not the round's peer alone: rounds visit members in an order
            // that may bring the same one back at every multiple.
            let revocations: Vec<Unverified<Revocation>> = self.revoked.values().cloned().collect();
            for other in self.others() {
                let message = Message::Revocations {
                    revocations: revocations.clone(),
                };
                sends.push((other, message));
            }
        }
        Output {
            sends,
            ..Output::none()
        }
    }

    /// The cell this replica holds of `row` and `column`.
    fn held(&self, row: &RowKey, column: &str) -> Option<&Held> {
        self.rows
            .get(&(row.table.clone(), Position::of(row)))?
            .get(column)
    }

    /// An offer: what this replica lacks or holds older is wanted; what it holds newer, or the
    /// offer lacks within the window, goes back (up to a page of bytes).
    fn on_sync_offer(
        &mut self,
        from: Slot,
        round: u64,
        after: Option<(String, Position)>,
        until: Option<(String, Position)>,
        listing: super::Listing,
    ) -> Output<Self> {
        if listing.len() > SYNC_ROWS
            || listing
                .iter()
                .any(|(row, entries)| entries.len() > COLUMNS_MAX || !row.is_well_formed())
        {
            return Output {
                refused: Some("an anti-entropy offer out of bounds".into()),
                ..Output::none()
            };
        }
        let mut offered: BTreeMap<(RowKey, &str), &Entry> = BTreeMap::new();
        let mut want = Vec::new();
        let me = self.place.slot;
        for (row, entries) in listing.iter().filter(|(row, _)| self.holds(&row.table, me)) {
            for entry in entries {
                offered.insert((row.clone(), entry.column.as_str()), entry);
                let wanted = match self.held(row, &entry.column) {
                    None => self
                        .catalog
                        .get(&row.table)
                        .is_some_and(|s| s.has_column(&entry.column)),
                    Some(held) => {
                        held.cell.ts < entry.ts
                            || (held.cell.ts == entry.ts
                                && Cell::digest(&held.signed) != entry.digest)
                    }
                };
                if wanted {
                    want.push((row.clone(), entry.column.clone()));
                }
            }
        }
        let mut cells = Vec::new();
        let mut bytes = 0;
        let walk = match &after {
            Some(key) => self.rows.range((
                std::ops::Bound::Excluded(key.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => self.rows.range(..),
        };
        'rows: for (key, held) in walk {
            if until.as_ref().is_some_and(|until| key > until) {
                break;
            }
            if !self.holds(&key.0, from) {
                continue;
            }
            for h in held.values() {
                let newer = offered
                    .get(&(h.cell.row.clone(), h.cell.column.as_str()))
                    .is_none_or(|entry| {
                        h.cell.ts > entry.ts
                            || (h.cell.ts == entry.ts && Cell::digest(&h.signed) != entry.digest)
                    });
                if newer {
                    if bytes >= PAGE_BYTES {
                        break 'rows;
                    }
                    bytes += h.signed.bytes().len();
                    cells.push(h.signed.clone());
                }
            }
        }
        let wanted: BTreeSet<(RowKey, String)> = want.iter().cloned().collect();
        self.sync.wanted.insert(from, (round, wanted));
        // A table it lacks (it missed the create, or lost its disk): refused as a proxy's
        // request would be, so the member offers the schema, taken once f+1 offered the same.
        let unknown: BTreeSet<&str> = listing
            .iter()
            .map(|(row, _)| row.table.as_str())
            .filter(|table| self.catalog.get(table).is_none())
            .collect();
        let mut sends: Vec<(Slot, Message)> = unknown
            .into_iter()
            .map(|table| {
                let refusal = Refusal::UnknownTable(table.to_string());
                (from, Message::Refused { pop: 0, refusal })
            })
            .collect();
        sends.push((from, Message::SyncReply { round, want, cells }));
        Output {
            sends,
            ..Output::none()
        }
    }

    /// Cells from anti-entropy: kept where newer, each checked as a write of its row would be;
    /// what is refused is counted against the member that sent it.
    fn take_synced(&mut self, now: Time, from: Slot, cells: &[SignedCell]) -> Vec<Change> {
        let (changes, refused) = self.accept_rows(now, cells);
        self.table_stats.synced += changes.len() as u64;
        if refused.is_some() {
            *self.table_stats.bad_syncs.entry(from).or_default() += 1;
        }
        changes
    }

    /// The answer to this replica's offer: keep the newer cells, send the wanted ones.
    fn on_sync_reply(
        &mut self,
        now: Time,
        from: Slot,
        round: u64,
        want: Vec<(RowKey, String)>,
        cells: Vec<SignedCell>,
    ) -> Output<Self> {
        let Some((after, until)) = self
            .sync
            .offered
            .get(&from)
            .filter(|(offered, _)| *offered == round)
            .map(|(_, window)| window.clone())
        else {
            return Output::none();
        };
        self.sync.offered.remove(&from);
        // Only cells of the window offered, and no more than a window holds: anything else is
        // not an answer to the offer.
        let in_window = |cell: &Cell| {
            let key = (cell.row.table.clone(), Position::of(&cell.row));
            after.as_ref().is_none_or(|after| key > *after)
                && until.as_ref().is_none_or(|until| key <= *until)
        };
        let pushed: Vec<SignedCell> = cells
            .into_iter()
            .take(SYNC_ROWS * COLUMNS_MAX)
            .filter(|signed| signed.peek().is_ok_and(|cell| in_window(&cell)))
            .collect();
        let changes = self.take_synced(now, from, &pushed);
        let mut sent = Vec::new();
        let mut bytes = 0;
        for (row, column) in want.iter().take(SYNC_ROWS * COLUMNS_MAX) {
            if bytes >= PAGE_BYTES {
                break;
            }
            if let Some(held) = self.held(row, column) {
                bytes += held.signed.bytes().len();
                sent.push(held.signed.clone());
            }
        }
        // Row by row, as the receiver checks them.
        sent.sort_by_key(|signed| {
            signed
                .peek()
                .ok()
                .map(|cell| (Position::of(&cell.row), cell.row.table))
        });
        Output {
            changes,
            sends: vec![(from, Message::SyncCells { round, cells: sent })],
            ..Output::none()
        }
    }

    /// The cells this replica wanted from an offer: only those are taken.
    fn on_sync_cells(
        &mut self,
        now: Time,
        from: Slot,
        round: u64,
        cells: Vec<SignedCell>,
    ) -> Output<Self> {
        if self
            .sync
            .wanted
            .get(&from)
            .is_none_or(|(wanted, _)| *wanted != round)
        {
            // A late answer to an earlier round leaves the current one's wants alone.
            return Output::none();
        }
        let Some((_, wanted)) = self.sync.wanted.remove(&from) else {
            return Output::none();
        };
        let asked: Vec<SignedCell> = cells
            .into_iter()
            .filter(|signed| {
                signed
                    .peek()
                    .is_ok_and(|cell| wanted.contains(&(cell.row, cell.column)))
            })
            .collect();
        Output {
            changes: self.take_synced(now, from, &asked),
            ..Output::none()
        }
    }
}

/// The GC grace (spec §2.14): tombstones collected once older than it, and values older than it
/// taken only when `f+1` members hold them, so that a value whose tombstone is collected cannot
/// be brought back by a faulty member, or by one that missed the delete.
impl Server {
    /// `now` on the wall clock clients stamp cells with, in microseconds.
    fn micros(&self, now: Time) -> u64 {
        now.0
            .saturating_add(self.settings.wall_at_zero_millis)
            .saturating_mul(1000)
    }

    /// What a proxy resolving a read of `table` passes over.
    fn grace(&self, now: Time, table: &str) -> Grace {
        let revoked = if self.mutations.ignore_revocations {
            BTreeSet::new()
        } else {
            self.revoked.keys().copied().collect()
        };
        Grace {
            line: self.grace_line(now, table),
            live: self.place.f + 1,
            revoked,
        }
    }

    /// Cells of `table` stamped before this are past its grace (none of a table unknown here).
    fn grace_line(&self, now: Time, table: &str) -> u64 {
        let Some(schema) = self.catalog.get(table) else {
            return 0;
        };
        let grace = schema
            .gc_grace_secs
            .saturating_mul(1_000_000)
            .max(self.settings.fresh_micros);
        self.micros(now).saturating_sub(grace)
    }

    /// Whether `cell`, a value past the line or any cell of a revoked writer, would be kept
    /// here: then only a liveness check may let it in.
    fn doubtful(&self, line: u64, cell: &Cell) -> bool {
        let suspect = (cell.ts < line && cell.value.is_some()) || self.is_revoked(cell.writer);
        !self.mutations.skip_liveness_check
            && suspect
            && self
                .held(&cell.row, &cell.column)
                .is_none_or(|held| held.cell.rank() < cell.rank())
    }

    /// Parks `signed` for a liveness check (verified when confirmed).
    fn park(&mut self, cell: &Cell, signed: &SignedCell) {
        let key = (cell.row.clone(), cell.column.clone());
        let digest = Cell::digest(signed);
        if self
            .doubtful
            .cells
            .get(&key)
            .is_some_and(|doubt| doubt.digest == digest)
        {
            return;
        }
        if self.doubtful.cells.len() >= DOUBTFUL_MAX && !self.doubtful.cells.contains_key(&key) {
            self.table_stats.not_live += 1;
            return;
        }
        let doubt = Doubt {
            signed: signed.clone(),
            digest,
            holders: BTreeSet::new(),
            rounds: 0,
        };
        self.doubtful.cells.insert(key, doubt);
    }

    /// A write-back's cells past the grace that this replica would keep are parked, and the
    /// write-back refused whole, before anything changes: it cannot say it holds them yet.
    fn park_doubtful(&mut self, now: Time, cells: &[SignedCell]) -> Option<Refusal> {
        let (mut oldest, mut revoked) = (None, None);
        for signed in cells {
            let Ok(cell) = signed.peek() else {
                continue;
            };
            if self.doubtful(self.grace_line(now, &cell.row.table), &cell)
                && self.genuine(signed).is_some()
            {
                self.park(&cell, signed);
                if self.is_revoked(cell.writer) {
                    revoked = Some(cell.writer);
                } else {
                    oldest = Some(oldest.unwrap_or(u64::MAX).min(cell.ts));
                }
            }
        }
        let past = oldest.map(|ts| Refusal::PastGrace {
            behind_micros: self.micros(now).saturating_sub(ts),
        });
        past.or(revoked.map(Refusal::Revoked))
    }

    /// Tombstones past the grace, dropped: the changes to make durable.
    fn collect_tombstones(&mut self, now: Time) -> Output<Self> {
        let mut due = Vec::new();
        for (table, tombstones) in &self.tombstones {
            let line = self.grace_line(now, table);
            let room = COLLECT_PER_TICK - due.len();
            due.extend(
                tombstones
                    .iter()
                    .take_while(|(ts, ..)| *ts < line)
                    .take(room)
                    .map(|(ts, position, column)| {
                        (*ts, table.clone(), position.clone(), column.clone())
                    }),
            );
        }
        let mut changes = Vec::new();
        for (ts, table, position, column) in due {
            if let Some(tombstones) = self.tombstones.get_mut(&table) {
                tombstones.remove(&(ts, position.clone(), column.clone()));
            }
            let key = (table, position);
            let Some(held) = self.rows.get(&key).and_then(|cells| cells.get(&column)) else {
                continue;
            };
            debug_assert!(
                held.cell.value.is_none() && held.cell.ts == ts,
                "the index is true"
            );
            let row = held.cell.row.clone();
            self.forget(&key, &column);
            self.table_stats.collected += 1;
            changes.push(Change::Remove { row, column });
        }
        Output {
            changes,
            ..Output::none()
        }
    }

    /// Ends the round in flight (cells asked too often are dropped) and asks every other member
    /// whether it holds the next batch of doubtful cells.
    fn liveness_round(&mut self) -> Output<Self> {
        for key in std::mem::take(&mut self.doubtful.asked) {
            let Some(doubt) = self.doubtful.cells.get_mut(&key) else {
                continue;
            };
            doubt.rounds += 1;
            if doubt.rounds >= LIVE_ROUNDS_MAX {
                self.doubtful.cells.remove(&key);
                self.table_stats.not_live += 1;
            }
        }
        if self.doubtful.cells.is_empty() || self.place.n < 2 {
            return Output::none();
        }
        self.doubtful.round += 1;
        let mut asked = Vec::new();
        let mut cells = Vec::new();
        for (key, doubt) in self.doubtful.cells.iter().take(LIVE_BATCH) {
            asked.push(key.clone());
            cells.push((key.0.clone(), key.1.clone(), doubt.digest));
        }
        self.doubtful.asked = asked;
        let round = self.doubtful.round;
        let me = self.place.slot;
        Output {
            sends: (0..self.place.n as u32)
                .map(Slot)
                .filter(|slot| *slot != me)
                .map(|slot| {
                    let cells = cells.clone();
                    (slot, Message::Live { round, cells })
                })
                .collect(),
            ..Output::none()
        }
    }

    /// Which of these versions this replica holds as its newest.
    fn on_live(
        &mut self,
        from: Slot,
        round: u64,
        cells: Vec<(RowKey, String, Digest)>,
    ) -> Output<Self> {
        if cells.len() > LIVE_BATCH || cells.iter().any(|(row, _, _)| !row.is_well_formed()) {
            return Output {
                refused: Some("a liveness check out of bounds".into()),
                ..Output::none()
            };
        }
        let held = cells
            .iter()
            .map(|(row, column, digest)| {
                self.held(row, column)
                    .is_some_and(|held| Cell::digest(&held.signed) == *digest)
            })
            .collect();
        Output {
            sends: vec![(from, Message::LiveReply { round, held })],
            ..Output::none()
        }
    }

    /// A member's answer: each cell `f+1` members hold is checked as a write-back's would be,
    /// and kept.
    fn on_live_reply(
        &mut self,
        now: Time,
        from: Slot,
        round: u64,
        held: Vec<bool>,
    ) -> Output<Self> {
        if round != self.doubtful.round
            || held.len() != self.doubtful.asked.len()
            || from == self.place.slot
            || from.index() >= self.place.n
        {
            return Output::none();
        }
        let mut confirmed = Vec::new();
        for (key, holds) in self.doubtful.asked.iter().zip(held) {
            let Some(doubt) = self.doubtful.cells.get_mut(key).filter(|_| holds) else {
                continue;
            };
            doubt.holders.insert(from);
            if doubt.holders.len() > self.place.f {
                confirmed.push(key.clone());
            }
        }
        let mut changes = Vec::new();
        for key in confirmed {
            let Some(doubt) = self.doubtful.cells.remove(&key) else {
                continue;
            };
            let signed = [doubt.signed];
            let Ok(cells) = self.check_cells(now, &signed, false, None) else {
                self.table_stats.not_live += 1;
                continue;
            };
            for (cell, signed) in cells.into_iter().zip(signed) {
                let (row, column) = (cell.row.clone(), cell.column.clone());
                if self.keep(cell, signed.clone()) {
                    self.table_stats.confirmed_live += 1;
                    changes.push(Change::Put {
                        row,
                        column,
                        cell: signed,
                    });
                }
            }
        }
        Output {
            changes,
            ..Output::none()
        }
    }
}

/// The table and scan position of `cell`'s row: its key in `rows`.
fn key_of(cell: &Cell) -> (String, Position) {
    (cell.row.table.clone(), Position::of(&cell.row))
}
