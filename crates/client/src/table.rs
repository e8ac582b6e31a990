//! Hardened tables from the client's side: rows placed on the group their partition key falls
//! in, cells signed with this client's key and stamped with its clock, every operation through
//! one member of the group as proxy and judged by the signatures it brings back
//! (`bulwark_protocol::table`).
//!
//! The request types are shaped for a CQL front end to map onto later: a row is (table,
//! partition key, clustering key), a write is a set of cells of one row, a read names the
//! columns it wants, and each carries its consistency level.

use crate::{Client, ClientError, OpReport, blame, in_view, nodes};
use bulwark_core::membership::GroupView;
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Slot};
use bulwark_protocol::table::{
    self, Cell, Consistency, CreateOp, DescribeOp, PairKeys, Place, Position, Range, RangeOp,
    ReadOp, ReadPath, RowKey, Schema, WriteOp,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A row as a read returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The newest cell of each column asked for that a quorum knows of, in column order;
    /// a deleted cell has no value.
    pub cells: Vec<Cell>,
    /// Whether the replicas disagreed and the read brought them up to date.
    pub resolved: bool,
}

impl Row {
    /// The live value of `column`, if any.
    pub fn value(&self, column: &str) -> Option<&[u8]> {
        self.cells
            .iter()
            .find(|cell| cell.column == column)
            .and_then(|cell| cell.value.as_deref())
    }
}

impl Client {
    /// Creates `schema` on every member of every group: done once `n - f` members of each
    /// created it (the others learn it from their first proxies). Returns how many members
    /// created it. Creating it again with the same schema changes nothing.
    pub async fn create_table(&self, schema: &Schema) -> Result<usize, ClientError> {
        if let Some(problem) = schema.problem() {
            return Err(ClientError::Protocol(format!("schema: {problem}")));
        }
        if !self.may_write {
            return Err(ClientError::NotWriter {
                name: self.name.clone(),
            });
        }
        self.fresh().await?;
        let mut created = 0;
        for view in self.placement.groups() {
            let place = self.table_place(&view);
            let mut machine = CreateOp::new(place, self.op_id(), schema.clone());
            let name = format!("table {}", schema.name);
            created += self
                .drive(&view, &name, self.cluster.f, &mut machine)
                .await?
                .len();
        }
        self.lock_schemas()
            .insert(schema.name.clone(), schema.clone());
        Ok(created)
    }

    /// Revokes the client named `name` as a table writer (spec `cassandra.md` §2.13): as the
    /// administrator, signs the order with the trusted authority's key and has it recorded on
    /// every member of every group (`n - f` of each; anti-entropy brings it to the rest). From
    /// then on members refuse the client's writes and take no cell of it they do not already
    /// hold unless `f+1` others hold it, so writes it signed earlier and someone kept cannot
    /// be played back. Returns how many members recorded it.
    pub async fn revoke_table_writer(&self, name: &str) -> Result<usize, ClientError> {
        let Some(seed) = self.authority else {
            return Err(ClientError::Protocol(format!(
                "client {:?} holds no authority key (only the administrator does)",
                self.name
            )));
        };
        let Some(entry) = self.cluster.clients.iter().find(|c| c.name == name) else {
            return Err(ClientError::Protocol(format!(
                "no client {name:?} in cluster.toml"
            )));
        };
        let order = table::Revocation {
            client: ClientId(entry.id),
            at_micros: wall_micros(),
        };
        let revocation = bulwark_core::sign::Signed::sign(&SecretKey::from_seed(&seed), order)
            .map_err(|error| ClientError::Protocol(format!("signing the revocation: {error}")))?
            .to_unverified();
        self.fresh().await?;
        let mut recorded = 0;
        for view in self.placement.groups() {
            let place = self.table_place(&view);
            let mut machine = CreateOp::revoke(place, self.op_id(), revocation.clone());
            let what = format!("revocation of {name}");
            recorded += self
                .drive(&view, &what, self.cluster.f, &mut machine)
                .await?
                .len();
        }
        Ok(recorded)
    }

    /// Writes `cells` (column, value; `None` deletes) of one row at `level`, each signed with
    /// this client's key and stamped with its clock (never below a stamp it used before).
    pub async fn table_write(
        &self,
        row: &RowKey,
        cells: &[(String, Option<Vec<u8>>)],
        level: Consistency,
    ) -> Result<OpReport, ClientError> {
        let signing = self.signing.clone().ok_or_else(|| ClientError::NotWriter {
            name: self.name.clone(),
        })?;
        if cells.is_empty() {
            return Err(ClientError::Protocol(
                "a write names at least one column".into(),
            ));
        }
        let schema = self.table_schema(&row.table, &row.partition).await?;
        let ts = self.table_clock();
        let signed = cells
            .iter()
            .map(|(column, value)| {
                let cell = Cell {
                    row: row.clone(),
                    column: column.clone(),
                    ts,
                    writer: self.id,
                    value: value.clone(),
                };
                let signed = if schema.variant.signs() {
                    cell.sign(&signing)
                } else {
                    cell.unsigned()
                };
                signed.ok_or_else(|| {
                    ClientError::Protocol(format!(
                        "column {column:?} of table {:?} is out of bounds (names \u{2264} {} \
                         bytes, keys \u{2264} {}, values \u{2264} {})",
                        row.table,
                        table::NAME_BYTES_MAX,
                        table::KEY_BYTES_MAX,
                        table::VALUE_BYTES_MAX
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.fresh().await?;
        let view = self.placement.group_of(&row.partition);
        let op = self.op_id();
        let first = self.table_proxy(op.0, &view, Kind::Write);
        let mut machine = WriteOp::new(
            self.table_place(&view),
            self.member_keys(&view)?,
            op,
            signed,
            level,
            first,
        )
        .for_table(&schema);
        if let Some(pairs) = self.table_pair_keys(&view)? {
            machine = machine.with_pair_keys(pairs);
        }
        let what = format!("table {} row", row.table);
        let started = std::time::Instant::now();
        let outcome = self
            .drive(&view, &what, self.cluster.f, &mut machine)
            .await?;
        let seen = Seen::new(Kind::Write, first, outcome.proxies, started);
        self.table_proxies_seen(&view, seen, &outcome.silent);
        let answered: Vec<Slot> = outcome.acks.iter().map(|(slot, _)| *slot).collect();
        let report = OpReport {
            answered: nodes(in_view(&view), &answered),
            // An eventual table lives on 2f+1 of the group: "2 of 3", not "2 of 4".
            n: schema.replicas(view.len(), self.cluster.f).len(),
            evidence: blame(in_view(&view), &what, &outcome.evidence),
            restarts: outcome.proxies.saturating_sub(1) as u32,
            repaired: false,
        };
        self.record(&report.evidence);
        Ok(report)
    }

    /// Reads `columns` (all when empty) of one row at `level`.
    pub async fn table_read(
        &self,
        row: &RowKey,
        columns: &[String],
        level: Consistency,
    ) -> Result<(Row, OpReport), ClientError> {
        self.fresh().await?;
        let schema = self.table_schema(&row.table, &row.partition).await?;
        let view = self.placement.group_of(&row.partition);
        let op = self.op_id();
        let writers: table::Writers = self.writers.keys().collect();
        let first = self.table_proxy(op.0, &view, Kind::Read);
        let mut machine = ReadOp::new(
            self.table_place(&view),
            self.member_keys(&view)?,
            Arc::new(writers),
            op,
            row.clone(),
            columns.to_vec(),
            rand::random(),
            level,
            first,
        )
        .for_table(&schema)
        .with_grace_line(self.table_grace_line(&schema))
        .with_resolver(self.table_resolver);
        if let Some(authority) = self.cluster.authority() {
            machine = machine.with_authority(authority);
        }
        if let Some(pairs) = self.table_pair_keys(&view)? {
            machine = machine.with_pair_keys(pairs);
        }
        let what = format!("table {} row", row.table);
        let started = std::time::Instant::now();
        let outcome = self
            .drive(&view, &what, self.cluster.f, &mut machine)
            .await?;
        let seen = Seen::new(Kind::Read, first, outcome.proxies, started);
        self.table_proxies_seen(&view, seen, &outcome.silent);
        let report = OpReport {
            answered: Vec::new(),
            n: view.len(),
            evidence: blame(in_view(&view), &what, &outcome.evidence),
            restarts: outcome.proxies.saturating_sub(1) as u32,
            repaired: matches!(outcome.path, ReadPath::Resolved { written_back } if written_back > 0),
        };
        self.record(&report.evidence);
        let row = Row {
            cells: outcome.cells,
            resolved: outcome.path != ReadPath::Fast,
        };
        Ok((row, report))
    }

    /// Reads up to `limit` live rows of `table` in scan order, `columns` of each (all when
    /// empty): of one partition between clustering keys `start` (inclusive) and `end`
    /// (exclusive) when `partition` is given, else of every partition in token order (the
    /// partition key's point on the placement ring), from every group. Rows whose cells are
    /// all deleted are left out. Each page is resolved by this client from a quorum of signed
    /// answers at `level` and written back before it is returned.
    #[allow(clippy::too_many_arguments)]
    pub async fn table_scan(
        &self,
        table: &str,
        partition: Option<&[u8]>,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        columns: &[String],
        limit: usize,
        level: Consistency,
    ) -> Result<(Vec<(RowKey, Row)>, OpReport), ClientError> {
        self.fresh().await?;
        let views = match partition {
            Some(partition) => vec![self.placement.group_of(partition)],
            None => self.placement.groups(),
        };
        let query = Range {
            partition: partition.map(<[u8]>::to_vec),
            start: start.map(<[u8]>::to_vec),
            end: end.map(<[u8]>::to_vec),
            columns: columns.to_vec(),
            // Pages no larger than the scan: a short scan moves only what it returns.
            ..Range::scan(table, limit.clamp(1, table::RANGE_ROWS_MAX) as u32)
        };
        self.walk(query, views, None, limit, level).await
    }

    /// Reads up to `limit` live rows of `table`, every column, in token order from the token of
    /// partition key `from` (the rows of that token included), from every group: YCSB-E's scan.
    pub async fn table_scan_from(
        &self,
        table: &str,
        from: &[u8],
        limit: usize,
        level: Consistency,
    ) -> Result<(Vec<(RowKey, Row)>, OpReport), ClientError> {
        self.fresh().await?;
        let query = Range::scan(table, limit.clamp(1, table::RANGE_ROWS_MAX) as u32);
        // Below every row of `from`'s token: a row's partition key is never empty.
        let first = Position {
            token: bulwark_core::membership::RingPoint::of_key(from),
            partition: Vec::new(),
            clustering: Vec::new(),
        };
        let views = self.placement.groups();
        self.walk(query, views, Some(first), limit, level).await
    }

    /// `query` walked page by page on each of `views`, from `first` on, merged in scan order.
    async fn walk(
        &self,
        query: Range,
        views: Vec<GroupView>,
        first: Option<Position>,
        limit: usize,
        level: Consistency,
    ) -> Result<(Vec<(RowKey, Row)>, OpReport), ClientError> {
        let table = query.table.clone();
        let partition = query.partition.clone().unwrap_or_default();
        if let Some(problem) = query.problem() {
            return Err(ClientError::Protocol(format!("range: {problem}")));
        }
        /// One group's walk: rows fetched and not yet returned, and where its next page starts.
        struct Walk {
            view: GroupView,
            rows: VecDeque<(RowKey, Vec<Cell>)>,
            after: Option<Position>,
            done: bool,
        }
        let mut walks: Vec<Walk> = views
            .into_iter()
            .map(|view| Walk {
                view,
                rows: VecDeque::new(),
                after: first.clone(),
                done: false,
            })
            .collect();
        let mut report = OpReport {
            answered: Vec::new(),
            n: walks.first().map_or(0, |walk| walk.view.len()),
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        };
        let schema = self.table_schema(&table, &partition).await?;
        let writers: Arc<table::Writers> = Arc::new(self.writers.keys().collect());
        let what = format!("table {table} range");
        let mut out: Vec<(RowKey, Row)> = Vec::new();
        while out.len() < limit {
            for walk in walks.iter_mut().filter(|w| w.rows.is_empty() && !w.done) {
                let op = self.op_id();
                let first = self.table_proxy(op.0, &walk.view, Kind::Scan);
                let range = Range {
                    after: walk.after.clone(),
                    ..query.clone()
                };
                let mut machine = RangeOp::new(
                    self.table_place(&walk.view),
                    self.member_keys(&walk.view)?,
                    writers.clone(),
                    op,
                    range,
                    rand::random(),
                    level,
                    first,
                )
                .for_table(&schema)
                .with_grace_line(self.table_grace_line(&schema));
                if let Some(authority) = self.cluster.authority() {
                    machine = machine.with_authority(authority);
                }
                if let Some(pairs) = self.table_pair_keys(&walk.view)? {
                    machine = machine.with_pair_keys(pairs);
                }
                let started = std::time::Instant::now();
                let page = self
                    .drive(&walk.view, &what, self.cluster.f, &mut machine)
                    .await?;
                let seen = Seen::new(Kind::Scan, first, page.proxies, started);
                self.table_proxies_seen(&walk.view, seen, &page.silent);
                let evidence = blame(in_view(&walk.view), &what, &page.evidence);
                self.record(&evidence);
                report.evidence.extend(evidence);
                report.restarts += page.proxies.saturating_sub(1) as u32;
                report.repaired |= page.written_back > 0;
                // A page's rows are after its start and its end is its last row or later.
                debug_assert!(page.next.is_none() || page.next > walk.after);
                walk.rows.extend(page.rows);
                walk.done = page.next.is_none();
                walk.after = page.next;
            }
            // No group still walking has a row before its next page's start: rows up to the
            // earliest such start are final, in order.
            let horizon = walks
                .iter()
                .filter(|walk| !walk.done)
                .filter_map(|walk| walk.after.clone())
                .min();
            let mut emitted = false;
            loop {
                let next = walks
                    .iter_mut()
                    .filter(|walk| !walk.rows.is_empty())
                    .min_by_key(|walk| walk.rows.front().map(|(row, _)| Position::of(row)));
                let Some(walk) = next else { break };
                let position = walk.rows.front().map(|(row, _)| Position::of(row));
                if horizon.is_some() && position > horizon {
                    break;
                }
                let Some((row, cells)) = walk.rows.pop_front() else {
                    break;
                };
                emitted = true;
                // A row of another group's partition is not this group's to answer for (a
                // faulty member could plant an old version of it): its own group's walk has it.
                let owned = self.placement.group_of(&row.partition).id() == walk.view.id();
                if owned && cells.iter().any(|cell| cell.value.is_some()) {
                    out.push((
                        row,
                        Row {
                            cells,
                            resolved: false,
                        },
                    ));
                    if out.len() == limit {
                        break;
                    }
                }
            }
            let finished = walks.iter().all(|walk| walk.done && walk.rows.is_empty());
            if finished || (!emitted && walks.iter().all(|w| !w.rows.is_empty() || w.done)) {
                break;
            }
        }
        Ok((out, report))
    }

    /// `table`'s schema: from this client's cache, else as `f+1` members of the group of
    /// `partition` describe it.
    async fn table_schema(&self, table: &str, partition: &[u8]) -> Result<Schema, ClientError> {
        if let Some(schema) = self.lock_schemas().get(table) {
            return Ok(schema.clone());
        }
        let view = self.placement.group_of(partition);
        let mut machine = DescribeOp::new(self.table_place(&view), self.op_id(), table.into());
        let what = format!("table {table}");
        let schema = self
            .drive(&view, &what, self.cluster.f, &mut machine)
            .await?;
        self.lock_schemas().insert(table.into(), schema.clone());
        Ok(schema)
    }

    fn lock_schemas(&self) -> std::sync::MutexGuard<'_, HashMap<String, Schema>> {
        self.table_schemas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The MAC keys this client shares with each member of `view`, by slot; none for a client
    /// without a signing key (replicas sign for it).
    fn table_pair_keys(&self, view: &GroupView) -> Result<Option<Arc<[PairKeys]>>, ClientError> {
        let Some(secret) = &self.signing else {
            return Ok(None);
        };
        let keys = self.member_keys(view)?;
        let mut cache = self.table_pairs.lock().unwrap_or_else(|e| e.into_inner());
        let pairs: Vec<PairKeys> = view
            .members()
            .iter()
            .zip(keys.iter())
            .map(|(node, key)| {
                cache
                    .entry(*node)
                    .or_insert_with(|| PairKeys::between(secret, key))
                    .clone()
            })
            .collect();
        Ok(Some(pairs.into()))
    }

    fn table_place(&self, view: &GroupView) -> Place {
        Place {
            slot: Slot(0),
            n: view.len(),
            f: self.cluster.f,
            epoch: self.epoch(),
            group: view.id(),
        }
    }

    /// Microseconds since the Unix epoch, strictly above every stamp this client handed out
    /// before, so its own writes never tie or go back when the clock does.
    fn table_clock(&self) -> u64 {
        let now = wall_micros();
        let mut last = self.last_stamp.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self.last_stamp.compare_exchange_weak(
                last,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// Where `schema`'s GC grace ends on this client's clock, for its reads to pass over what
    /// fewer than f+1 replicas hold before it (`table::Grace`): a little later than the
    /// replicas' line, by the clock skew they allow, so that the client lets pass what a
    /// proxy whose clock is ahead passed over.
    fn table_grace_line(&self, schema: &Schema) -> u64 {
        let grace = schema.gc_grace_secs.saturating_mul(1_000_000);
        wall_micros()
            .saturating_sub(grace)
            .saturating_add(table::Settings::default().skew_max_micros)
    }

    /// The member an operation asks first: spread by operation, so clients share the proxy
    /// work, passing over members that recently left an operation unanswered, and members whose
    /// answers to operations of `kind` usually come more than
    /// `SLOW_FACTOR` times slower than the fastest member's (spec `cassandra.md` §4.5: "favour
    /// the fastest-responding nodes"): a proxy that stalls each answer until just before the
    /// timeout is never silent, and would cost every operation it serves that wait. One
    /// operation in `EXPLORE_EVERY` asks the members in turn regardless, so a member that was
    /// slow is measured again.
    fn table_proxy(&self, op: u64, view: &GroupView, kind: Kind) -> Slot {
        let n = view.len().max(1) as u64;
        let asked_last = self.silent_now();
        let heard: Vec<Slot> = (0..n)
            .map(|i| Slot(((op + i) % n) as u32))
            .filter(|slot| {
                view.node(*slot)
                    .is_none_or(|node| !asked_last.contains(&node))
            })
            .collect();
        let latency = self.table_latency.lock().unwrap_or_else(|e| e.into_inner());
        let usual = |slot: &Slot| {
            view.node(*slot)
                .and_then(|node| latency.get(&node))
                .and_then(|kinds| kinds[kind as usize])
        };
        let fastest = heard.iter().filter_map(usual).reduce(f64::min);
        let fast_enough = |slot: &&Slot| match (usual(slot), fastest) {
            (Some(micros), Some(best)) => micros <= (best * SLOW_FACTOR).max(SLOW_FLOOR_MICROS),
            _ => true,
        };
        if op.is_multiple_of(EXPLORE_EVERY) && !heard.is_empty() {
            // Each member in turn, slow or not, so one that recovered is measured again.
            return heard[(op / EXPLORE_EVERY) as usize % heard.len()];
        }
        heard
            .iter()
            .find(fast_enough)
            .or(heard.first())
            .copied()
            .unwrap_or(Slot((op % n) as u32))
    }

    /// What an operation showed of its proxies: how long the first took when it answered (a
    /// moving average per member and kind, for `table_proxy`), and those that left it
    /// unanswered, asked last for a while.
    fn table_proxies_seen(&self, view: &GroupView, seen: Seen, silent: &[Slot]) {
        if seen.proxies == 1
            && let Some(node) = view.node(seen.first)
        {
            let micros = seen.elapsed.as_micros() as f64;
            let mut latency = self.table_latency.lock().unwrap_or_else(|e| e.into_inner());
            let usual = &mut latency.entry(node).or_default()[seen.kind as usize];
            *usual = Some(usual.map_or(micros, |usual| usual + (micros - usual) / 4.0));
        }
        self.mark_silent(silent.iter().filter_map(|slot| view.node(*slot)));
    }

    /// This client's id, as its cells name their writer.
    pub fn client_id(&self) -> ClientId {
        self.id
    }
}

/// How many times slower than the fastest member's a member's usual answer is slow: well above
/// a loaded cluster's spread between correct members (a moving average over 4 answers smooths
/// their p99 of 2-3 times the mean, docs/benchmarks.md).
const SLOW_FACTOR: f64 = 4.0;
/// No member whose answers usually come faster than this is slow.
const SLOW_FLOOR_MICROS: f64 = 5_000.0;
/// One operation in this many asks a member regardless of its speed, each member in turn: a
/// slow member costs one operation in `EXPLORE_EVERY * n` its wait.
const EXPLORE_EVERY: u64 = 1024;

/// The three kinds of table operation, which take different times.
#[derive(Clone, Copy)]
enum Kind {
    Write,
    Read,
    Scan,
}

/// One operation as its proxies served it.
struct Seen {
    kind: Kind,
    /// The proxy asked first.
    first: Slot,
    /// How many proxies it took: 1 when the first answered.
    proxies: usize,
    elapsed: std::time::Duration,
}

impl Seen {
    fn new(kind: Kind, first: Slot, proxies: usize, started: std::time::Instant) -> Seen {
        Seen {
            kind,
            first,
            proxies,
            elapsed: started.elapsed(),
        }
    }
}

/// Microseconds since the Unix epoch: the clock table cells are stamped with.
fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}
