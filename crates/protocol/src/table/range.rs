//! Range reads: the rows of one partition between two clustering keys, or every partition of a
//! table in token order (a scan, what YCSB's workload E runs), a page of rows at a time.
//!
//! Every answer carries data and names the query and the reader's nonce, so it answers nothing
//! else. A page from a quorum of answers is complete up to a bound: the last row of the answer
//! that stopped earliest (a correct replica stops only at the row limit, at the byte budget or
//! at the end of the range, which the reader checks from the cells themselves). Any row a
//! completed write reached is on a correct replica of every read quorum (they meet in `f+1`),
//! and that replica's answer covers everything up to the bound, so the union of the answers up
//! to the bound holds every such row. Each cell is then resolved as a single row's is, and the
//! result written back until a quorum holds it, so no later read returns less.
//!
//! A faulty replica can only slow a scan: it cannot name a cell its writer did not sign (the
//! newest version of each cell is checked unless `f+1` verified answers vouch for it, and a
//! replica that vouched for a forged one is blamed), and an answer cut short without reason
//! fails the page rule.

use super::{
    COLUMNS_MAX, Cell, Entry, KEY_BYTES_MAX, NAME_BYTES_MAX, Nonce, Place, RowKey,
    STATEMENT_BYTES_MAX, SignedCell, entries_of,
};
use bulwark_core::membership::RingPoint;
use bulwark_core::sign::{Context, Signable, Unverified};
use bulwark_core::{Digest, Epoch, GroupId, Slot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The most rows one page returns.
pub const RANGE_ROWS_MAX: usize = 100;
/// A replica ends a page once its cells pass this many bytes (the row that passes it is in).
pub const PAGE_BYTES: usize = 1024 * 1024;

/// Where a row sits in scan order: its partition's token (the partition key's point on the
/// placement ring, so a scan walks the ring), the partition key, the clustering key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Position {
    /// `RingPoint::of_key(partition)`.
    pub token: RingPoint,
    /// The partition key.
    pub partition: Vec<u8>,
    /// The clustering key.
    pub clustering: Vec<u8>,
}

impl Position {
    /// The position of `row`.
    pub fn of(row: &RowKey) -> Position {
        Position {
            token: RingPoint::of_key(&row.partition),
            partition: row.partition.clone(),
            clustering: row.clustering.clone(),
        }
    }

    fn is_well_formed(&self) -> bool {
        self.partition.len() <= KEY_BYTES_MAX && self.clustering.len() <= KEY_BYTES_MAX
    }
}

/// A range read as the client asks it, echoed in every answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// The table.
    pub table: String,
    /// Only this partition's rows (a range over clustering keys); every partition when `None`.
    pub partition: Option<Vec<u8>>,
    /// Rows whose clustering key is at least this (with a partition only).
    pub start: Option<Vec<u8>>,
    /// Rows whose clustering key is below this (with a partition only).
    pub end: Option<Vec<u8>>,
    /// Rows after this position only: where the previous page ended.
    pub after: Option<Position>,
    /// The columns (all when empty).
    pub columns: Vec<String>,
    /// The most rows in the page, 1 to [`RANGE_ROWS_MAX`].
    pub limit: u32,
}

impl Range {
    /// Every row of `table`, every column, `limit` rows a page: a scan from the start.
    pub fn scan(table: &str, limit: u32) -> Range {
        Range {
            table: table.to_string(),
            partition: None,
            start: None,
            end: None,
            after: None,
            columns: Vec::new(),
            limit,
        }
    }

    /// Every row of one partition of `table`, every column, `limit` rows a page.
    pub fn partition(table: &str, partition: &[u8], limit: u32) -> Range {
        Range {
            partition: Some(partition.to_vec()),
            ..Range::scan(table, limit)
        }
    }

    /// Why the range cannot be read, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.table.is_empty() || self.table.len() > NAME_BYTES_MAX {
            return Some("a table name is 1 to 48 bytes".into());
        }
        if self.limit == 0 || self.limit as usize > RANGE_ROWS_MAX {
            return Some(format!("a page holds 1 to {RANGE_ROWS_MAX} rows"));
        }
        if self.columns.len() > COLUMNS_MAX {
            return Some(format!("at most {COLUMNS_MAX} columns"));
        }
        let key_ok = |key: &Option<Vec<u8>>| key.as_ref().is_none_or(|k| k.len() <= KEY_BYTES_MAX);
        if !key_ok(&self.partition) || !key_ok(&self.start) || !key_ok(&self.end) {
            return Some(format!("keys are at most {KEY_BYTES_MAX} bytes"));
        }
        if self.partition.as_ref().is_some_and(Vec::is_empty) {
            return Some("an empty partition key".into());
        }
        if self.partition.is_none() && (self.start.is_some() || self.end.is_some()) {
            return Some("clustering bounds need a partition".into());
        }
        if self
            .after
            .as_ref()
            .is_some_and(|after| !after.is_well_formed())
        {
            return Some(format!("keys are at most {KEY_BYTES_MAX} bytes"));
        }
        None
    }

    /// Whether `row`, at `position`, is one this range reads.
    pub fn contains(&self, row: &RowKey, position: &Position) -> bool {
        row.table == self.table
            && self.partition.as_ref().is_none_or(|p| *p == row.partition)
            && self.start.as_ref().is_none_or(|s| row.clustering >= *s)
            && self.end.as_ref().is_none_or(|e| row.clustering < *e)
            && self.after.as_ref().is_none_or(|after| position > after)
    }

    /// The first position the range can hold, for a replica's walk.
    pub fn first(&self) -> Option<Position> {
        let start = self.partition.as_ref().map(|partition| Position {
            token: RingPoint::of_key(partition),
            partition: partition.clone(),
            clustering: self.start.clone().unwrap_or_default(),
        });
        match (start, &self.after) {
            (Some(start), Some(after)) => Some(start.max(after.clone())),
            (start, after) => start.or_else(|| after.clone()),
        }
    }

    /// Whether a walk in scan order that reached `position` has passed every row of the range.
    pub fn passed(&self, table: &str, position: &Position) -> bool {
        if table != self.table {
            return true;
        }
        // A partition's rows are contiguous in scan order, and the walk starts in it.
        self.partition.as_ref().is_some_and(|partition| {
            position.partition != *partition
                || self
                    .end
                    .as_ref()
                    .is_some_and(|end| position.clustering >= *end)
        })
    }
}

/// A replica's answer to a range read: the rows it holds in the range, in scan order, each
/// with the newest cell of each column asked for, bound to the query and the reader's nonce.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeAnswer {
    /// The replica.
    pub slot: Slot,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its group.
    pub group: GroupId,
    /// The query.
    pub range: Range,
    /// The reader's nonce.
    pub nonce: Nonce,
    /// The rows, each with one entry per column it holds, in column order.
    pub rows: Vec<(RowKey, Vec<Entry>)>,
    /// Whether the range holds nothing after the last row (else the page stopped at its
    /// limit or byte budget).
    pub complete: bool,
}

impl Signable for RangeAnswer {
    const CONTEXT: Context = Context::new("bulwark/table/range-answer/v1");
    const BYTES_MAX: usize = (RANGE_ROWS_MAX + 1) * STATEMENT_BYTES_MAX + 4 * KEY_BYTES_MAX;
}

/// A signed range answer and its cells, row by row in entry order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeAnswered {
    /// The signed statement.
    pub answer: Unverified<RangeAnswer>,
    /// The cells it names.
    pub cells: Vec<SignedCell>,
}

/// A replica's statement that it holds cells at least as new as a range read resolved, named
/// by [`listing_digest`], made in answer to that read's write-back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeWriteBackAck {
    /// The replica.
    pub slot: Slot,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its group.
    pub group: GroupId,
    /// The read's nonce.
    pub nonce: Nonce,
    /// The resolved rows written back.
    pub listing: Digest,
}

impl Signable for RangeWriteBackAck {
    const CONTEXT: Context = Context::new("bulwark/table/range-write-back-ack/v1");
    const BYTES_MAX: usize = 128;
}

/// Rows named by their entries, in scan order: what an answer lists and a write-back names.
pub type Listing = Vec<(RowKey, Vec<Entry>)>;

const DOMAIN_LISTING: &str = "bulwark/table/range-listing/v1";

/// What a range write-back acknowledgement names.
pub fn listing_digest(listing: &Listing) -> Digest {
    Digest::of(DOMAIN_LISTING, &bulwark_core::wire::encode(listing))
}

/// `cells` (decoded) grouped by row in scan order, each row's entries in column order.
pub fn listing_of<'a>(cells: impl IntoIterator<Item = (&'a Cell, &'a SignedCell)>) -> Listing {
    type Cells<'a> = Vec<(&'a Cell, &'a SignedCell)>;
    let mut rows: BTreeMap<Position, (RowKey, Cells)> = BTreeMap::new();
    for (cell, signed) in cells {
        rows.entry(Position::of(&cell.row))
            .or_insert_with(|| (cell.row.clone(), Vec::new()))
            .1
            .push((cell, signed));
    }
    rows.into_values()
        .map(|(row, cells)| (row, entries_of(cells)))
        .collect()
}

/// One answer that checked out against the query: its rows' cells decoded, parallel to the
/// answer's rows.
#[derive(Clone, Debug)]
pub struct Page {
    /// The statement.
    pub answer: RangeAnswer,
    /// Each row's position.
    pub positions: Vec<Position>,
    /// Each row's cells, in entry order.
    pub cells: Vec<Vec<(Cell, SignedCell)>>,
}

/// `answer` (its signature checked already, or not checked by choice) as slot `slot`'s page
/// for `range` and `nonce` at `place`: rows strictly in scan order, each in the range with the
/// columns asked for, cells that match their entries, and a page that ended for a reason.
pub fn check_page(
    place: &Place,
    slot: Slot,
    range: &Range,
    nonce: Nonce,
    answer: RangeAnswer,
    cells: Vec<SignedCell>,
) -> Option<Page> {
    if answer.slot != slot
        || answer.epoch != place.epoch
        || answer.group != place.group
        || answer.range != *range
        || answer.nonce != nonce
        || answer.rows.len() > range.limit as usize
    {
        return None;
    }
    let total: usize = answer.rows.iter().map(|(_, entries)| entries.len()).sum();
    if total != cells.len() {
        return None;
    }
    let mut cells = cells.into_iter();
    let mut positions: Vec<Position> = Vec::with_capacity(answer.rows.len());
    let mut decoded = Vec::with_capacity(answer.rows.len());
    let mut bytes = 0;
    for (row, entries) in &answer.rows {
        let position = Position::of(row);
        let ordered = positions.last().is_none_or(|last| *last < position);
        let columns_ok = !entries.is_empty()
            && entries
                .windows(2)
                .all(|pair| pair[0].column < pair[1].column)
            && entries
                .iter()
                .all(|e| range.columns.is_empty() || range.columns.contains(&e.column));
        if !ordered || !range.contains(row, &position) || !columns_ok {
            return None;
        }
        let mut row_cells = Vec::with_capacity(entries.len());
        for entry in entries {
            let signed = cells.next()?;
            let cell = signed.peek().ok()?;
            let matches = cell.row == *row
                && cell.column == entry.column
                && cell.ts == entry.ts
                && Cell::digest(&signed) == entry.digest;
            if !matches {
                return None;
            }
            bytes += signed.bytes().len();
            row_cells.push((cell, signed));
        }
        positions.push(position);
        decoded.push(row_cells);
    }
    let ended = answer.complete || answer.rows.len() == range.limit as usize || bytes >= PAGE_BYTES;
    ended.then_some(Page {
        answer,
        positions,
        cells: decoded,
    })
}

/// A page resolved from a quorum of answers.
#[derive(Clone, Debug, Default)]
pub struct Resolution {
    /// The rows, in scan order, each with the newest genuine version of each column any answer
    /// held (a deleted cell is a tombstone; a row of tombstones is still a row here).
    pub rows: Vec<(RowKey, Vec<(Cell, SignedCell)>)>,
    /// Where the next page starts, unless the range is done.
    pub next: Option<Position>,
    /// The replicas whose answers held exactly the resolution up to its bound.
    pub current: BTreeSet<Slot>,
    /// Versions newer than the one resolved whose writer's signature failed, with the replicas
    /// that vouched for them.
    pub forged: Vec<(SignedCell, Vec<Slot>)>,
}

impl Resolution {
    /// The resolved rows by their entries.
    pub fn listing(&self) -> Listing {
        self.rows
            .iter()
            .map(|(row, cells)| (row.clone(), entries_of(cells.iter().map(|(c, s)| (c, s)))))
            .collect()
    }

    /// The resolved cells, row by row: what a write-back carries.
    pub fn cells(&self) -> Vec<SignedCell> {
        self.rows
            .iter()
            .flat_map(|(_, cells)| cells.iter().map(|(_, signed)| signed.clone()))
            .collect()
    }
}

/// Resolves `pages` (answers that checked out, each from a distinct replica) for `range`: the
/// union of their rows up to the earliest bound, each cell's newest version that `vouched`
/// answers hold or whose writer's signature `genuine` accepts. A version past the `grace`
/// line that fewer than `grace.live` answers hold is passed over ([`Grace`]).
pub fn resolve(
    range: &Range,
    pages: &BTreeMap<Slot, Page>,
    vouched: usize,
    grace: &super::Grace,
    mut genuine: impl FnMut(&SignedCell) -> bool,
) -> Resolution {
    let mut bound: Option<Position> = pages
        .values()
        .filter(|page| !page.answer.complete)
        .filter_map(|page| page.positions.last().cloned())
        .min();
    type Versions<'a> = Vec<(&'a Cell, &'a SignedCell, Vec<Slot>)>;
    let mut rows: BTreeMap<&Position, (&RowKey, BTreeMap<&str, Versions>)> = BTreeMap::new();
    for (slot, page) in pages {
        for ((position, (row, _)), cells) in page
            .positions
            .iter()
            .zip(&page.answer.rows)
            .zip(&page.cells)
        {
            if bound.as_ref().is_some_and(|bound| position > bound) {
                break;
            }
            let columns = &mut rows.entry(position).or_insert((row, BTreeMap::new())).1;
            for (cell, signed) in cells {
                let versions = columns.entry(cell.column.as_str()).or_default();
                match versions
                    .iter_mut()
                    .find(|(_, s, _)| s.bytes() == signed.bytes())
                {
                    Some((_, _, holders)) => holders.push(*slot),
                    None => versions.push((cell, signed, vec![*slot])),
                }
            }
        }
    }
    let mut resolution = Resolution::default();
    let mut passed = BTreeSet::new();
    for (position, (row, columns)) in rows {
        let mut resolved = Vec::new();
        for (_, mut versions) in columns {
            versions.sort_by(|a, b| b.0.rank().cmp(&a.0.rank()));
            for (cell, signed, holders) in versions {
                if grace.passes_over(cell, || holders.len()) {
                    passed.insert(Cell::digest(signed));
                    continue;
                }
                if holders.len() >= vouched || genuine(signed) {
                    resolved.push((cell.clone(), signed.clone()));
                    break;
                }
                resolution.forged.push((signed.clone(), holders));
            }
        }
        if resolved.is_empty() {
            continue;
        }
        if resolution.rows.len() == range.limit as usize {
            // More rows up to the bound than a page holds: this page ends earlier.
            bound = resolution.rows.last().map(|(row, _)| Position::of(row));
            break;
        }
        resolved.sort_by(|a, b| a.0.column.cmp(&b.0.column));
        debug_assert!(bound.as_ref().is_none_or(|bound| position <= bound));
        resolution.rows.push((row.clone(), resolved));
    }
    let listing = resolution.listing();
    resolution.current = pages
        .iter()
        .filter(|(_, page)| {
            let within = page
                .positions
                .iter()
                .take_while(|position| bound.as_ref().is_none_or(|bound| *position <= bound))
                .count();
            let answered = &page.answer.rows[..within];
            if passed.is_empty() {
                return answered == &listing[..];
            }
            // Rows whose every version was passed over count as absent.
            let rows = answered
                .iter()
                .map(|(row, entries)| (row.clone(), super::without(entries, &passed)))
                .filter(|(_, entries)| !entries.is_empty());
            rows.eq(listing.iter().cloned())
        })
        .map(|(slot, _)| *slot)
        .collect();
    resolution.next = bound;
    resolution
}
