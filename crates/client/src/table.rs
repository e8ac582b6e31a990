//! Hardened tables from the client's side: rows placed on the group their partition key falls
//! in, cells signed with this client's key and stamped with its clock, every operation through
//! one member of the group as proxy and judged by the signatures it brings back
//! (`bulwark_protocol::table`).
//!
//! The request types are shaped for a CQL front end to map onto later: a row is (table,
//! partition key, clustering key), a write is a set of cells of one row, a read names the
//! columns it wants, and each carries its consistency level.

use crate::{Client, ClientError, OpReport, blame, nodes};
use bulwark_core::membership::GroupView;
use bulwark_core::{ClientId, Slot};
use bulwark_protocol::table::{
    self, Cell, Consistency, CreateOp, Place, ReadOp, ReadPath, RowKey, Schema, WriteOp,
};
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
        Ok(created)
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
                cell.sign(&signing).ok_or_else(|| {
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
        let mut machine = WriteOp::new(
            self.table_place(&view),
            self.content_keys(&view)?,
            op,
            signed,
            level,
            self.table_proxy(op.0, &view),
        );
        let what = format!("table {} row", row.table);
        let outcome = self
            .drive(&view, &what, self.cluster.f, &mut machine)
            .await?;
        self.table_silent(&view, &outcome.silent);
        let answered: Vec<Slot> = outcome.acks.iter().map(|(slot, _)| *slot).collect();
        let report = OpReport {
            answered: nodes(&view, &answered),
            n: view.len(),
            evidence: blame(&view, &what, &outcome.evidence),
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
        let view = self.placement.group_of(&row.partition);
        let op = self.op_id();
        let writers: table::Writers = self.writers.keys().collect();
        let mut machine = ReadOp::new(
            self.table_place(&view),
            self.content_keys(&view)?,
            Arc::new(writers),
            op,
            row.clone(),
            columns.to_vec(),
            rand::random(),
            level,
            self.table_proxy(op.0, &view),
        );
        let what = format!("table {} row", row.table);
        let outcome = self
            .drive(&view, &what, self.cluster.f, &mut machine)
            .await?;
        self.table_silent(&view, &outcome.silent);
        let report = OpReport {
            answered: Vec::new(),
            n: view.len(),
            evidence: blame(&view, &what, &outcome.evidence),
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
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
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

    /// The member an operation asks first: spread by operation, so clients share the proxy
    /// work, passing over members that recently left an operation unanswered.
    fn table_proxy(&self, op: u64, view: &GroupView) -> Slot {
        let n = view.len().max(1) as u64;
        let now = std::time::Instant::now();
        let mut avoid = self.table_avoid.lock().unwrap_or_else(|e| e.into_inner());
        avoid.retain(|_, until| *until > now);
        (0..n)
            .map(|i| Slot(((op + i) % n) as u32))
            .find(|slot| {
                view.node(*slot)
                    .is_none_or(|node| !avoid.contains_key(&node))
            })
            .unwrap_or(Slot((op % n) as u32))
    }

    /// Remembers the proxies that left an operation unanswered.
    fn table_silent(&self, view: &GroupView, silent: &[Slot]) {
        let until = std::time::Instant::now() + PROXY_AVOID;
        let mut avoid = self.table_avoid.lock().unwrap_or_else(|e| e.into_inner());
        for node in silent.iter().filter_map(|slot| view.node(*slot)) {
            avoid.insert(node, until);
        }
    }

    /// This client's id, as its cells name their writer.
    pub fn client_id(&self) -> ClientId {
        self.id
    }
}

/// How long a proxy that left an operation unanswered is asked last.
const PROXY_AVOID: std::time::Duration = std::time::Duration::from_secs(5);
