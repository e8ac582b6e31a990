//! A node's durable state: redb tables of opaque records, a change log, and a group committer.
//!
//! "Durable" means that a crash (even SIGKILL or power loss, with honest disks) keeps it. A node
//! acknowledges a client only after the batch holding the change is durable. The [`Committer`]
//! makes a batch durable by appending it to the change log (`changes.log`, one `write` and one
//! `fdatasync`) and then applying it to redb without a flush, so that reads see it; a checkpoint
//! (one durable redb commit) now and then empties the log, and opening the store applies whatever
//! the log still holds (see [`log`]). [`Store::apply`] commits to redb durably at once. One fsync
//! per request would serialize every client behind the disk, so the committer thread takes every
//! batch queued while the previous commit ran and commits them together: one fsync for many
//! acknowledgements, and batches still become durable in the order they were submitted.
//!
//! A batch's receiver fires `Ok` only once that batch and every batch before it are durable. If
//! a commit fails (a failed fsync leaves the file in an unknown state), every batch in it and
//! every later batch gets the error and nothing more is written, so a later success can never
//! cover an earlier loss.
//!
//! One store holds the state of many replicas: every [`Table`] lives in a [`Namespace`], one per
//! (service, group) a node hosts, and is one redb table of its own, so replicas never see one
//! another's records and a replica's state can be scanned without reading anyone else's.
//!
//! The file says which format it has ([`FORMAT_VERSION`], checked by [`Store::open`]), and every
//! record says which record format it has ([`RECORD_VERSION`], checked on every read), so a
//! release never misreads what another release wrote: it refuses it, saying why.
//!
//! This crate knows nothing of protocols: the node encodes protocol changes as records.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

mod log;

use bulwark_core::{GroupId, ServiceId};
use bytes::Bytes;
use log::{ChangeLog, HEADER_BYTES};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition, TableHandle};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Batches folded into one commit at most.
const BATCHES_PER_COMMIT_MAX: usize = 1024;
/// Key and value bytes folded into one commit at most, so one commit cannot hold unbounded
/// memory. A single batch larger than this is committed on its own.
const BYTES_PER_COMMIT_MAX: usize = 64 * 1024 * 1024;
/// redb's page cache. Its default (1 GiB) would dwarf everything else a node holds; the protocol
/// keeps what it serves in memory already, so the cache only has to speed up commits.
const CACHE_BYTES: usize = 64 * 1024 * 1024;
/// A group of more key and value bytes than this is committed to redb durably at once instead of
/// going through the change log: its bytes, not the commit's bookkeeping, are most of its cost,
/// and the log would write them twice (1 MiB puts ran at 0.6x through the log, with checkpoint
/// stalls; docs/benchmarks.md). Small enough that a 64 KiB put's 32 KiB fragment is never logged
/// (at 64 KiB, groups of one fragment were and groups of two were not, and 64 KiB puts lost a
/// third); large enough for every group of metadata and small values.
const LOGGED_GROUP_BYTES_MAX: usize = 16 * 1024;
/// The change log is emptied by a checkpoint once it holds this many bytes...
const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;
/// ... or once the last checkpoint is this old: redb keeps what unflushed commits freed until a
/// durable one, and a restart replays the whole log.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
// A checkpoint follows the group that passed `CHECKPOINT_BYTES`, so a log never holds more than
// that and one more entry: every log this release writes, it can read back.
const _: () = assert!(
    CHECKPOINT_BYTES + (log::HEADER_BYTES + log::ENTRY_BYTES_MAX) as u64 <= log::FILE_BYTES_MAX
);

/// The layout of the file this release reads and writes: which tables exist and how they are
/// named. Version 1 is the layout from before versions were recorded (tables `hist`, `lc`,
/// `meta`, `register`, one replica per store); version 2 namespaces tables per replica and
/// prefixes every record with [`RECORD_VERSION`]; version 3 has the tables of version 2 and may
/// have changes in `changes.log` that are not in the file yet, which a release that reads version
/// 2 would not see.
pub const FORMAT_VERSION: u32 = 3;
/// What a file that records no format version but holds tables was written in.
const FORMAT_UNVERSIONED: u32 = 1;
/// The format before the change log: its tables are this format's, so opening it upgrades it.
const FORMAT_BEFORE_LOG: u32 = 2;
/// The layout version every redb table name starts with; the change log did not change it.
const TABLE_LAYOUT: u32 = 2;
/// The first byte of every record value: the encoding of what follows, so that a record written
/// by another release is refused rather than misread.
pub const RECORD_VERSION: u8 = 1;

/// The table outside every namespace that says which format the file has. Every format keeps it
/// `&[u8] -> &[u8]` with `format_version` a 4-byte big-endian `u32`, so that any release can tell
/// which format a file has, even one it cannot read.
const META: TableDefinition<'static, &'static [u8], &'static [u8]> = TableDefinition::new("meta");
const FORMAT_VERSION_KEY: &[u8] = b"format_version";
/// A table name's length in bytes at most; it is part of every redb table name.
pub const TABLE_NAME_BYTES_MAX: usize = 32;
/// Key bytes an error message shows at most.
const KEY_SHOWN_BYTES_MAX: usize = 32;

/// One replica's share of the store: the service it runs and the group it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace {
    /// The service (protocol) the replica runs.
    pub service: ServiceId,
    /// The replica group.
    pub group: GroupId,
}

impl Namespace {
    /// The namespace of `service` in `group`.
    pub const fn new(service: ServiceId, group: GroupId) -> Namespace {
        Namespace { service, group }
    }

    /// The table called `name` in this namespace.
    pub const fn table(self, name: &'static str) -> Table {
        Table {
            namespace: self,
            name,
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/group{}", self.service, self.group.0)
    }
}

/// A table of records: a name within a namespace. The name is 1 to [`TABLE_NAME_BYTES_MAX`]
/// bytes of `a-z`, `0-9`, `_` and `-`; reads and writes of any other name fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    /// The replica it belongs to.
    pub namespace: Namespace,
    /// Its name within the namespace, such as `hist`.
    pub name: &'static str,
}

impl Table {
    /// The redb table holding it.
    fn redb_name(&self) -> Result<String, StorageError> {
        redb_table_name(self.namespace, self.name)
    }
}

/// The redb table holding table `name` of `namespace`: `v2/<service>/<group>/<name>`, in decimal.
/// A valid name has no `/`, so every redb name maps back to one table ([`parse_table_name`]).
fn redb_table_name(namespace: Namespace, name: &str) -> Result<String, StorageError> {
    let valid = (1..=TABLE_NAME_BYTES_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !valid {
        return Err(StorageError::Failed(format!(
            "table name {name:.80?} is not 1 to {TABLE_NAME_BYTES_MAX} bytes of a-z, 0-9, _ and -"
        )));
    }
    Ok(format!(
        "v{TABLE_LAYOUT}/{}/{}/{name}",
        namespace.service.0, namespace.group.0
    ))
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The namespace of a redb table named by [`redb_table_name`], or `None` for `meta`. Only a name
/// [`redb_table_name`] could have written is accepted: anything else was not written by this
/// format.
fn parse_table_name(name: &str) -> Result<Option<Namespace>, StorageError> {
    if name == META.name() {
        return Ok(None);
    }
    let unknown = || {
        StorageError::Failed(format!(
            "the store holds a table {name:.80?} that format {FORMAT_VERSION} does not have"
        ))
    };
    let mut parts = name.splitn(4, '/');
    let (Some(_), Some(service), Some(group), Some(table)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(unknown());
    };
    let (Ok(service), Ok(group)) = (service.parse(), group.parse()) else {
        return Err(unknown());
    };
    let namespace = Namespace::new(ServiceId(service), GroupId(group));
    // Round-tripping rejects another version's prefix, leading zeros and invalid names at once.
    match redb_table_name(namespace, table) {
        Ok(expected) if expected == name => Ok(Some(namespace)),
        _ => Err(unknown()),
    }
}

/// One change to durable state.
#[derive(Clone, Debug, PartialEq)]
pub enum StorageOp {
    /// Insert or replace a record.
    Put {
        /// Which table.
        table: Table,
        /// The record's key.
        key: Vec<u8>,
        /// The record.
        value: Bytes,
    },
    /// Remove a record if present.
    Delete {
        /// Which table.
        table: Table,
        /// The record's key.
        key: Vec<u8>,
    },
}

impl StorageOp {
    /// Puts `value` under `key`, or deletes the record when there is no value.
    pub fn set(table: Table, key: Vec<u8>, value: Option<Bytes>) -> StorageOp {
        match value {
            Some(value) => StorageOp::Put { table, key, value },
            None => StorageOp::Delete { table, key },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            StorageOp::Put { key, value, .. } => key.len() + value.len(),
            StorageOp::Delete { key, .. } => key.len(),
        }
    }
}

/// A storage failure. Cloneable so that every batch of a failed commit gets it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StorageError {
    /// redb or the file system failed, or a visitor did (see [`Store::scan`]).
    #[error("{0}")]
    Failed(String),
    /// The file is in a format this release does not read. Nothing in it was read.
    #[error("{}", format_mismatch(*found, *expected))]
    Format {
        /// The format the file has.
        found: u32,
        /// [`FORMAT_VERSION`].
        expected: u32,
    },
    /// Another process holds the store open (its lock is taken): nothing was read, and nothing
    /// is wrong with the data.
    #[error("the store is in use by another process")]
    InUse,
    /// A record does not start with a [`RECORD_VERSION`] this release reads: it was written by
    /// another release, or damaged. Its bytes were not handed over.
    #[error(
        "record version {} of key {key} in table {table} is not one this release reads (it reads \
         record version {RECORD_VERSION})",
        found.map_or_else(|| "(none: the record is empty)".to_string(), |v| v.to_string())
    )]
    RecordVersion {
        /// The table.
        table: String,
        /// The record's key, in hex, shortened.
        key: String,
        /// The version byte, if the record has one.
        found: Option<u8>,
    },
}

fn format_mismatch(found: u32, expected: u32) -> String {
    let (age, other_release) = if found < expected {
        ("an older", "the release that wrote it".to_string())
    } else {
        ("a newer", format!("a release that reads format {found}"))
    };
    format!(
        "the store was written in {age} Bulwark storage format (format {found}; this release \
         reads only format {expected}) and this release cannot read it. Either run \
         {other_release}, or start this node on an empty data directory (move this one aside) \
         and let its group serve what it held: a node started empty counts against the faults \
         its group tolerates"
    )
}

impl StorageError {
    /// An error of the caller's while it visits records (see [`Store::scan`]).
    pub fn other(message: impl fmt::Display) -> StorageError {
        StorageError::Failed(message.to_string())
    }

    fn from<E: fmt::Display>(context: &str) -> impl FnOnce(E) -> StorageError + '_ {
        move |e| StorageError::Failed(format!("{context}: {e}"))
    }
}

/// `key` in hex, at most [`KEY_SHOWN_BYTES_MAX`] bytes of it.
fn key_text(key: &[u8]) -> String {
    let shown = key.get(..KEY_SHOWN_BYTES_MAX).unwrap_or(key);
    let mut text: String = shown.iter().map(|b| format!("{b:02x}")).collect();
    if shown.len() < key.len() {
        text.push_str(&format!("... ({} bytes)", key.len()));
    }
    text
}

/// The payload of a stored record, after its [`RECORD_VERSION`] byte.
fn payload<'a>(table: &Table, key: &[u8], record: &'a [u8]) -> Result<&'a [u8], StorageError> {
    match record.split_first() {
        Some((&RECORD_VERSION, payload)) => Ok(payload),
        found => Err(StorageError::RecordVersion {
            table: table.to_string(),
            key: key_text(key),
            found: found.map(|(version, _)| *version),
        }),
    }
}

/// The keys from `prefix` on that do not start with it: `prefix` with its trailing `0xff` bytes
/// dropped and its last byte raised. `None` when every key from `prefix` on starts with it.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b != 0xff)?;
    let mut end = prefix.get(..=last)?.to_vec();
    if let Some(byte) = end.last_mut() {
        *byte += 1;
    }
    Some(end)
}

type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The node's database.
pub struct Store {
    database: redb::Database,
    /// Held across every write, so that a log entry and its redb commit are one step to everyone
    /// else, and a checkpoint never clears an entry whose commit has not happened.
    log: Mutex<ChangeLog>,
}

impl Store {
    /// Opens (creating if needed) `dir/state.redb`. A file in another format than
    /// [`FORMAT_VERSION`] is refused with [`StorageError::Format`] before anything in it is read.
    pub fn open(dir: &Path) -> Result<Store, StorageError> {
        std::fs::create_dir_all(dir).map_err(StorageError::from("creating the data directory"))?;
        let path = dir.join("state.redb");
        // The file is the disk's to damage: should redb's own checks panic on some damage rather
        // than return an error, that is a store that cannot be opened, not a crashed node.
        let opened = std::panic::catch_unwind(|| -> Result<Store, StorageError> {
            if !path.exists() {
                create_stamped(dir, &path)?;
            }
            let database = redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .create(&path)
                .map_err(|error| match error {
                    redb::DatabaseError::DatabaseAlreadyOpen => StorageError::InUse,
                    error => StorageError::from("opening state.redb")(error),
                })?;
            check_format(&database)?;
            let (log, pending) = ChangeLog::open(dir)?;
            let store = Store {
                database,
                log: Mutex::new(log),
            };
            if !pending.is_empty() {
                tracing::info!(
                    entries = pending.len(),
                    "applying what the change log holds beyond the last checkpoint"
                );
                store.write_entries(
                    pending.iter().map(Vec::as_slice),
                    redb::Durability::Immediate,
                )?;
                store.locked_log()?.clear()?;
            }
            Ok(store)
        });
        opened.unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(StorageError::Failed(format!(
                "state.redb is damaged: reading it failed ({why})"
            )))
        })
    }

    fn locked_log(&self) -> Result<std::sync::MutexGuard<'_, ChangeLog>, StorageError> {
        self.log.lock().map_err(|_| {
            StorageError::Failed("a write panicked while it held the change log".into())
        })
    }
}

/// Makes `path` appear whole or not at all: a node killed while redb writes a new file's header
/// would otherwise leave a file that every later start refuses as not a database. The file is
/// made and stamped under a name of this process's own and then hard-linked into place, which,
/// unlike a rename, never replaces a store another process made meanwhile.
fn create_stamped(dir: &Path, path: &Path) -> Result<(), StorageError> {
    const FRESH: &str = "state.redb.new-";
    let fresh = dir.join(format!("{FRESH}{}", std::process::id()));
    let removed = |result: std::io::Result<()>| match result {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    };
    removed(std::fs::remove_file(&fresh)).map_err(StorageError::from("removing a new store"))?;
    {
        let database = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&fresh)
            .map_err(StorageError::from("creating a new store"))?;
        // Stamping commits with redb's immediate durability: the file is synced before the link.
        check_format(&database)?;
    }
    match std::fs::hard_link(&fresh, path) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(StorageError::from("putting a new store in place")(error));
        }
        // Another start on this directory made its store first; opening it says if it is in use.
        _ => {}
    }
    // This start's file, and any a start killed before its link left: never a store, only a name.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(FRESH))
            {
                removed(std::fs::remove_file(entry.path()))
                    .map_err(StorageError::from("removing a new store"))?;
            }
        }
    }
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(StorageError::from("syncing the data directory"))
}

/// Refuses a file in another format; stamps a file with no tables yet with this one, and
/// upgrades one of the format before the change log.
fn check_format(database: &redb::Database) -> Result<(), StorageError> {
    let txn = database
        .begin_read()
        .map_err(StorageError::from("begin read"))?;
    let found = match txn.open_table(META) {
        Ok(meta) => match meta
            .get(FORMAT_VERSION_KEY)
            .map_err(StorageError::from("reading the format version"))?
        {
            Some(value) => Some(
                <[u8; 4]>::try_from(value.value())
                    .map(u32::from_be_bytes)
                    .map_err(|_| {
                        StorageError::Failed(format!(
                            "the format version record is {} bytes, not 4: the file is damaged",
                            value.value().len()
                        ))
                    })?,
            ),
            None => None,
        },
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(error) => return Err(StorageError::from("opening the meta table")(error)),
    };
    let found = match found {
        Some(found) => found,
        None => {
            let tables = txn
                .list_tables()
                .map_err(StorageError::from("listing tables"))?
                .count();
            let multimap = txn
                .list_multimap_tables()
                .map_err(StorageError::from("listing tables"))?
                .count();
            if tables + multimap > 0 {
                FORMAT_UNVERSIONED
            } else {
                drop(txn);
                return stamp_format(database);
            }
        }
    };
    if found == FORMAT_BEFORE_LOG {
        drop(txn);
        tracing::info!(
            from = FORMAT_BEFORE_LOG,
            to = FORMAT_VERSION,
            "upgrading the store's format: same tables, and a change log beside them"
        );
        return stamp_format(database);
    }
    if found != FORMAT_VERSION {
        return Err(StorageError::Format {
            found,
            expected: FORMAT_VERSION,
        });
    }
    Ok(())
}

fn stamp_format(database: &redb::Database) -> Result<(), StorageError> {
    let mut txn = database
        .begin_write()
        .map_err(StorageError::from("begin"))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(StorageError::from("durability"))?;
    txn.open_table(META)
        .map_err(StorageError::from("creating the meta table"))?
        .insert(FORMAT_VERSION_KEY, FORMAT_VERSION.to_be_bytes().as_slice())
        .map_err(StorageError::from("writing the format version"))?;
    txn.commit().map_err(StorageError::from("commit"))
}

impl Store {
    /// Every namespace with a table, in order: the replicas this store holds state for. A table
    /// exists from its first write on (a delete included), even once emptied.
    pub fn namespaces(&self) -> Result<Vec<Namespace>, StorageError> {
        let txn = self
            .database
            .begin_read()
            .map_err(StorageError::from("begin read"))?;
        let mut namespaces = BTreeSet::new();
        for handle in txn
            .list_tables()
            .map_err(StorageError::from("listing tables"))?
        {
            if let Some(namespace) = parse_table_name(handle.name())? {
                namespaces.insert(namespace);
            }
        }
        Ok(namespaces.into_iter().collect())
    }

    /// `table` for reading, or `None` if nothing was ever written to it.
    fn read_table(&self, table: &Table) -> Result<Option<ReadTable>, StorageError> {
        let name = table.redb_name()?;
        let txn = self
            .database
            .begin_read()
            .map_err(StorageError::from("begin read"))?;
        match txn.open_table(TableDefinition::new(&name)) {
            Ok(opened) => Ok(Some(opened)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(error) => Err(StorageError::from("open table")(error)),
        }
    }

    /// Every record of `table`, for restart.
    pub fn load(&self, table: Table) -> Result<Vec<(Vec<u8>, Bytes)>, StorageError> {
        let mut records = Vec::new();
        self.scan(table, |key, value| {
            records.push((key.to_vec(), Bytes::copy_from_slice(value)));
            Ok(())
        })?;
        Ok(records)
    }

    /// Visits every record of `table` in key order without holding them all in memory: a restart
    /// reads a store far larger than the node's memory this way. A record of an unknown
    /// [`RECORD_VERSION`] stops the scan with [`StorageError::RecordVersion`].
    pub fn scan(
        &self,
        table: Table,
        visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        self.scan_bounds(table, (Bound::Unbounded, Bound::Unbounded), visit)
    }

    /// Visits the records of `table` whose keys start with `prefix`, in key order, as
    /// [`Store::scan`] does.
    pub fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let end = prefix_end(prefix);
        let upper = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.scan_bounds(table, (Bound::Included(prefix), upper), visit)
    }

    /// Visits the records of `table` with keys in `keys` (from `start`, up to but not including
    /// `end`), in key order, as [`Store::scan`] does. An empty or reversed range visits nothing.
    pub fn scan_range(
        &self,
        table: Table,
        keys: std::ops::Range<&[u8]>,
        visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        if keys.start >= keys.end {
            return Ok(());
        }
        self.scan_bounds(
            table,
            (Bound::Included(keys.start), Bound::Excluded(keys.end)),
            visit,
        )
    }

    /// Visits the records of `table` whose keys sort after `after` (all of them when `None`), in
    /// key order, for as long as `visit` says `true`: a page of records read without going
    /// through the rest of the table.
    pub fn scan_after(
        &self,
        table: Table,
        after: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StorageError>,
    ) -> Result<(), StorageError> {
        let Some(opened) = self.read_table(&table)? else {
            return Ok(());
        };
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        for entry in opened
            .range::<&[u8]>((lower, Bound::Unbounded))
            .map_err(StorageError::from("scan"))?
        {
            let (key, value) = entry.map_err(StorageError::from("scan"))?;
            if !visit(key.value(), payload(&table, key.value(), value.value())?)? {
                break;
            }
        }
        Ok(())
    }

    fn scan_bounds(
        &self,
        table: Table,
        bounds: (Bound<&[u8]>, Bound<&[u8]>),
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let Some(opened) = self.read_table(&table)? else {
            return Ok(());
        };
        for entry in opened
            .range::<&[u8]>(bounds)
            .map_err(StorageError::from("scan"))?
        {
            let (key, value) = entry.map_err(StorageError::from("scan"))?;
            visit(key.value(), payload(&table, key.value(), value.value())?)?;
        }
        Ok(())
    }

    /// One committed record. Its payload is copied once out of redb's page: sharing the page
    /// would keep the read transaction, and every page it pins, alive as long as the record.
    pub fn get(&self, table: Table, key: &[u8]) -> Result<Option<Bytes>, StorageError> {
        let Some(opened) = self.read_table(&table)? else {
            return Ok(None);
        };
        let Some(value) = opened.get(key).map_err(StorageError::from("get"))? else {
            return Ok(None);
        };
        Ok(Some(Bytes::copy_from_slice(payload(
            &table,
            key,
            value.value(),
        )?)))
    }

    /// Number of records in `table`.
    pub fn count(&self, table: Table) -> Result<u64, StorageError> {
        match self.read_table(&table)? {
            Some(opened) => opened.len().map_err(StorageError::from("count")),
            None => Ok(0),
        }
    }

    /// Applies `ops` in one durable transaction.
    pub fn apply(&self, ops: &[StorageOp]) -> Result<(), StorageError> {
        let mut body = Vec::new();
        for op in ops {
            log::encode_op(op, &mut body)?;
        }
        let mut log = self.locked_log()?;
        self.write_entries(
            std::iter::once(body.as_slice()),
            redb::Durability::Immediate,
        )?;
        // That commit made every earlier one durable, the log's included.
        if !log.is_empty() {
            log.clear()?;
        }
        Ok(())
    }

    /// Makes the ops of `batches` durable in the change log and then visible in redb, as one
    /// step; a large group goes to redb durably instead. `entry` is the committer's buffer,
    /// reused from group to group.
    fn commit_group(
        &self,
        batches: &[Vec<StorageOp>],
        entry: &mut Vec<u8>,
    ) -> Result<(), StorageError> {
        let bytes: usize = batches.iter().map(|batch| batch_bytes(batch)).sum();
        if bytes > LOGGED_GROUP_BYTES_MAX {
            return self.apply(&batches.concat());
        }
        entry.clear();
        entry.resize(HEADER_BYTES, 0);
        for op in batches.iter().flatten() {
            log::encode_op(op, entry)?;
        }
        let mut log = self.locked_log()?;
        log.append(entry)?;
        let body = entry.get(HEADER_BYTES..).unwrap_or_default();
        self.write_entries(std::iter::once(body), redb::Durability::None)?;
        drop(log);
        if entry.capacity() > 2 * BYTES_PER_COMMIT_MAX {
            // One outsized batch should not pin its size in memory for good.
            *entry = Vec::new();
        }
        Ok(())
    }

    /// Empties the change log once it is due (see [`CHECKPOINT_BYTES`]), or whenever it holds
    /// anything if `now`: one durable redb commit makes the log's entries redundant.
    fn checkpoint(&self, last: &mut Instant, now: bool) -> Result<(), StorageError> {
        let mut log = self.locked_log()?;
        let due = log.bytes() >= CHECKPOINT_BYTES || last.elapsed() >= CHECKPOINT_INTERVAL;
        if log.is_empty() || !(due || now) {
            return Ok(());
        }
        self.write_entries(std::iter::empty(), redb::Durability::Immediate)?;
        log.clear()?;
        *last = Instant::now();
        metrics::counter!("bulwark_storage_checkpoints_total").increment(1);
        Ok(())
    }

    /// Applies encoded entry bodies in one transaction of `durability`.
    fn write_entries<'a>(
        &self,
        bodies: impl Iterator<Item = &'a [u8]>,
        durability: redb::Durability,
    ) -> Result<(), StorageError> {
        let mut txn = self
            .database
            .begin_write()
            .map_err(StorageError::from("begin"))?;
        txn.set_durability(durability)
            .map_err(StorageError::from("durability"))?;
        {
            // Only the tables a group touches are opened: every opened table's root is flushed
            // at commit, and most groups touch one table (a STORE's `hist`, a COMPLETE's `lc`).
            let mut tables: HashMap<&str, redb::Table<&[u8], &[u8]>> = HashMap::new();
            for body in bodies {
                for op in log::decode_ops(body)? {
                    let opened = match tables.entry(op.table) {
                        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                        std::collections::hash_map::Entry::Vacant(entry) => {
                            // A log read back from disk names only tables this format has.
                            if parse_table_name(op.table)?.is_none() {
                                return Err(StorageError::Failed(
                                    "a change log entry writes to the meta table".into(),
                                ));
                            }
                            entry.insert(
                                txn.open_table(TableDefinition::new(op.table))
                                    .map_err(StorageError::from("open table"))?,
                            )
                        }
                    };
                    match op.record {
                        Some(record) => {
                            opened
                                .insert(op.key, record)
                                .map_err(StorageError::from("insert"))?;
                        }
                        None => {
                            opened
                                .remove(op.key)
                                .map_err(StorageError::from("remove"))?;
                        }
                    }
                }
            }
        }
        txn.commit().map_err(StorageError::from("commit"))
    }
}

type Submission = (Vec<StorageOp>, oneshot::Sender<Result<(), StorageError>>);

/// The group committer: one thread that owns all writes.
///
/// It blocks for the first queued batch, takes every batch already queued behind it (at most
/// 1024 batches or 64 MiB), writes them in one transaction with `Durability::Immediate`, and
/// then completes their receivers in submission order.
///
/// Ordering guarantee: a batch completes `Ok` only if it and every batch submitted before it
/// are durable. To keep that true, the committer is fail-stop: once a commit fails, that commit's
/// batches and every later batch get an error, and nothing more is written.
///
/// Dropping the committer commits whatever is still queued, then stops and joins the thread.
pub struct Committer {
    sender: Option<mpsc::Sender<Submission>>,
    thread: Option<std::thread::JoinHandle<()>>,
    commits: Arc<AtomicU64>,
}

impl Committer {
    /// Starts the committer thread.
    pub fn start(store: Arc<Store>) -> Committer {
        let (sender, receiver) = mpsc::channel::<Submission>();
        let commits = Arc::new(AtomicU64::new(0));
        let counter = commits.clone();
        let thread = std::thread::Builder::new()
            .name("bulwark-commit".into())
            .spawn(move || {
                let mut entry = Vec::new();
                let mut last_checkpoint = Instant::now();
                commit_loop(
                    &receiver,
                    &counter,
                    |batches| store.commit_group(batches, &mut entry),
                    |now| store.checkpoint(&mut last_checkpoint, now),
                );
            });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                // The receiver went with the closure, so every submit reports the failure.
                tracing::error!(%error, "cannot start the committer thread");
                None
            }
        };
        Committer {
            sender: Some(sender),
            thread,
            commits,
        }
    }

    /// Queues a batch; the receiver fires once it is durable. Batches become durable in order.
    ///
    /// The receiver yields `Err` if the commit failed, or if an earlier one did. If the
    /// committer thread died, the receiver is closed without a value. Only `Ok(Ok(()))` means
    /// durable.
    pub fn submit(&self, ops: Vec<StorageOp>) -> oneshot::Receiver<Result<(), StorageError>> {
        let (done, receiver) = oneshot::channel();
        let sent = match &self.sender {
            Some(sender) => sender.send((ops, done)),
            None => return receiver,
        };
        if let Err(mpsc::SendError((_, done))) = sent {
            let _ = done.send(Err(StorageError::Failed(
                "the committer has stopped".into(),
            )));
        }
        receiver
    }

    /// Commits tried so far (each one covers one or more batches).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish what is queued and stop.
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn batch_bytes(ops: &[StorageOp]) -> usize {
    ops.iter().map(StorageOp::bytes).sum()
}

/// The next group to commit: `carried` or the next queued batch (waiting for one), then every
/// batch already queued, within the bounds. A batch that would overflow the byte bound is left
/// in `carried` for the next group. `None` once the channel is closed and empty.
fn next_group(
    receiver: &mpsc::Receiver<Submission>,
    carried: &mut Option<Submission>,
) -> Option<Vec<Submission>> {
    let first = match carried.take() {
        Some(first) => first,
        None => receiver.recv().ok()?,
    };
    let mut bytes = batch_bytes(&first.0);
    let mut group = vec![first];
    while group.len() < BATCHES_PER_COMMIT_MAX {
        let Ok(next) = receiver.try_recv() else {
            break;
        };
        let more = batch_bytes(&next.0);
        if bytes.saturating_add(more) > BYTES_PER_COMMIT_MAX {
            *carried = Some(next);
            break;
        }
        bytes += more;
        group.push(next);
    }
    Some(group)
}

/// Commits groups with `apply` until the channel is closed and drained. After each group is
/// answered, `checkpoint(false)` may empty the change log; `checkpoint(true)` does at the end.
fn commit_loop(
    receiver: &mpsc::Receiver<Submission>,
    commits: &AtomicU64,
    mut apply: impl FnMut(&[Vec<StorageOp>]) -> Result<(), StorageError>,
    mut checkpoint: impl FnMut(bool) -> Result<(), StorageError>,
) {
    let mut carried = None;
    let mut failed: Option<StorageError> = None;
    while let Some(group) = next_group(receiver, &mut carried) {
        let (batches, waiting): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        let result = match &failed {
            Some(error) => Err(StorageError::Failed(format!(
                "not written: an earlier commit failed ({error})"
            ))),
            None => {
                let started = Instant::now();
                let result = apply(&batches);
                commits.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("bulwark_storage_commits_total").increment(1);
                metrics::histogram!("bulwark_storage_commit_batches").record(batches.len() as f64);
                metrics::histogram!("bulwark_storage_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                if let Err(error) = &result {
                    tracing::error!(%error, batches = batches.len(), "commit failed; no more writes");
                    failed = Some(error.clone());
                }
                result
            }
        };
        for done in waiting {
            let _ = done.send(result.clone());
        }
        if failed.is_none()
            && let Err(error) = checkpoint(false)
        {
            tracing::error!(%error, "checkpoint failed; no more writes");
            failed = Some(error);
        }
    }
    if failed.is_none()
        && let Err(error) = checkpoint(true)
    {
        // What the log holds is applied again on the next open.
        tracing::error!(%error, "the last checkpoint failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_after_a_key_reads_only_what_follows_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let table = Namespace::new(ServiceId(5), GroupId(1)).table("pieces");
        let ops: Vec<StorageOp> = (0..10u8)
            .map(|i| StorageOp::Put {
                table,
                key: vec![i],
                value: Bytes::from(vec![i; 3]),
            })
            .collect();
        store.apply(&ops).unwrap();
        let mut seen = Vec::new();
        store
            .scan_after(table, Some(&[3]), |key, value| {
                assert_eq!(value, [key[0]; 3]);
                seen.push(key[0]);
                Ok(seen.len() < 4)
            })
            .unwrap();
        assert_eq!(seen, [4, 5, 6, 7]);
        let mut all = 0;
        store
            .scan_after(table, None, |_, _| {
                all += 1;
                Ok(true)
            })
            .unwrap();
        assert_eq!(all, 10);
    }

    const NS: Namespace = Namespace::new(ServiceId(0), GroupId(0));
    const HIST: Table = NS.table("hist");
    const LC: Table = NS.table("lc");
    const REGISTER: Table = NS.table("register");

    fn put(table: Table, key: &str, value: &str) -> StorageOp {
        StorageOp::Put {
            table,
            key: key.as_bytes().to_vec(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    #[test]
    fn a_store_held_open_is_reported_in_use_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let held = Store::open(dir.path()).unwrap();
        assert!(matches!(Store::open(dir.path()), Err(StorageError::InUse)));
        drop(held);
        Store::open(dir.path()).unwrap();
    }

    /// What a start killed before its link leaves: a half-written file under a creating name.
    /// It is never taken for the store, and it is gone once the store exists.
    #[test]
    fn a_store_half_made_by_a_killed_start_is_dropped_and_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let leftover = dir.path().join("state.redb.new-4000000");
        std::fs::write(&leftover, vec![0x5a; 4096]).unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.apply(&[put(HIST, "k", "v")]).unwrap();
        }
        assert!(!leftover.exists());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|name| !name.starts_with("state.redb.new")),
            "{names:?}"
        );
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.load(HIST).unwrap(),
            vec![(b"k".to_vec(), Bytes::from("v"))]
        );
    }

    #[test]
    fn records_survive_reopening_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .apply(&[put(HIST, "a", "1"), put(LC, "a", "x"), put(HIST, "b", "2")])
                .unwrap();
            store
                .apply(&[
                    StorageOp::Delete {
                        table: HIST,
                        key: b"b".to_vec(),
                    },
                    put(HIST, "c", "3"),
                ])
                .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let hist = store.load(HIST).unwrap();
        assert_eq!(
            hist,
            vec![
                (b"a".to_vec(), Bytes::from("1")),
                (b"c".to_vec(), Bytes::from("3"))
            ]
        );
        assert_eq!(store.load(LC).unwrap().len(), 1);
        assert_eq!(store.count(REGISTER).unwrap(), 0);
    }

    #[test]
    fn ops_in_one_batch_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .apply(&[
                put(HIST, "k", "1"),
                StorageOp::Delete {
                    table: HIST,
                    key: b"k".to_vec(),
                },
            ])
            .unwrap();
        assert!(store.load(HIST).unwrap().is_empty());
    }

    #[test]
    fn group_commit_batches_and_keeps_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Arc::new(Committer::start(store.clone()));
        let mut waits = Vec::new();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let committer = committer.clone();
                std::thread::spawn(move || {
                    (0..50)
                        .map(|i| committer.submit(vec![put(HIST, &format!("{t}-{i}"), "v")]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            waits.extend(thread.join().unwrap());
        }
        // Later batches overwrite earlier ones of the same key.
        waits.push(committer.submit(vec![put(LC, "same", "first")]));
        waits.push(committer.submit(vec![put(LC, "same", "second")]));
        for wait in waits {
            wait.blocking_recv().unwrap().unwrap();
        }
        assert_eq!(store.count(HIST).unwrap(), 200);
        assert_eq!(
            store.load(LC).unwrap(),
            vec![(b"same".to_vec(), Bytes::from("second"))]
        );
        let commits = committer.commits();
        eprintln!("202 batches in {commits} commits");
        assert!(commits < 202, "batches were not grouped: {commits} commits");
    }

    #[test]
    fn large_values_store_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let value = Bytes::from(vec![0xabu8; 8 * 1024 * 1024]);
        store
            .apply(&[StorageOp::Put {
                table: HIST,
                key: b"big".to_vec(),
                value: value.clone(),
            }])
            .unwrap();
        assert_eq!(store.load(HIST).unwrap()[0].1, value);
    }

    #[test]
    fn every_table_round_trips_on_its_own() {
        let tables = [
            HIST,
            LC,
            REGISTER,
            Namespace::new(ServiceId(1), GroupId(0)).table("hist"),
            Namespace::new(ServiceId(0), GroupId(7)).table("hist"),
            Namespace::new(ServiceId(u16::MAX), GroupId(u32::MAX)).table("a-b_9"),
        ];
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            for table in tables {
                let name = table.to_string();
                store
                    .apply(&[put(table, "shared", &name), put(table, &name, "own")])
                    .unwrap();
            }
        }
        let store = Store::open(dir.path()).unwrap();
        for table in tables {
            let name = table.to_string();
            let mut expected = vec![
                (b"shared".to_vec(), Bytes::from(name.clone())),
                (name.into_bytes(), Bytes::from("own")),
            ];
            expected.sort();
            assert_eq!(store.load(table).unwrap(), expected, "{table}");
            assert_eq!(store.count(table).unwrap(), 2);
            assert_eq!(
                store.get(table, b"shared").unwrap(),
                Some(Bytes::from(table.to_string()))
            );
        }
        store
            .apply(&[StorageOp::Delete {
                table: REGISTER,
                key: b"shared".to_vec(),
            }])
            .unwrap();
        assert_eq!(store.count(REGISTER).unwrap(), 1);
        for table in tables.into_iter().filter(|t| *t != REGISTER) {
            assert_eq!(store.count(table).unwrap(), 2, "a delete touched {table}");
        }
        assert_eq!(
            store.namespaces().unwrap(),
            vec![
                NS,
                Namespace::new(ServiceId(0), GroupId(7)),
                Namespace::new(ServiceId(1), GroupId(0)),
                Namespace::new(ServiceId(u16::MAX), GroupId(u32::MAX)),
            ]
        );
    }

    #[test]
    fn tables_never_written_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.namespaces().unwrap().is_empty());
        store.apply(&[put(HIST, "k", "v")]).unwrap();
        let never = Namespace::new(ServiceId(3), GroupId(3)).table("hist");
        for table in [LC, never] {
            assert_eq!(store.get(table, b"k").unwrap(), None);
            assert_eq!(store.count(table).unwrap(), 0);
            assert!(store.load(table).unwrap().is_empty());
            let mut visited = 0;
            let mut count = |_: &[u8], _: &[u8]| {
                visited += 1;
                Ok(())
            };
            store.scan(table, &mut count).unwrap();
            store.scan_prefix(table, b"k", &mut count).unwrap();
            store
                .scan_range(table, b"a".as_slice()..b"z", &mut count)
                .unwrap();
            assert_eq!(visited, 0);
        }
        assert_eq!(
            store.namespaces().unwrap(),
            vec![NS],
            "reads created a table"
        );
    }

    #[test]
    fn tables_with_invalid_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let long: &'static str = "a".repeat(TABLE_NAME_BYTES_MAX + 1).leak();
        for name in ["", "a/b", "Hist", "h\u{e9}", long] {
            let table = NS.table(name);
            let error = store.apply(&[put(table, "k", "v")]).unwrap_err();
            assert!(
                error.to_string().contains("table name"),
                "{name:?}: {error}"
            );
            assert!(store.get(table, b"k").is_err());
        }
        let longest: &'static str = "a".repeat(TABLE_NAME_BYTES_MAX).leak();
        store.apply(&[put(NS.table(longest), "k", "v")]).unwrap();
        assert_eq!(store.namespaces().unwrap(), vec![NS]);
    }

    /// Keys around the edges of prefixes: empty-suffix matches, `0xff` runs, and neighbours
    /// just past a prefix.
    fn edge_keys() -> Vec<Vec<u8>> {
        let keys: [&[u8]; 14] = [
            b"\x00",
            b"\x01\xff",
            b"\x01\xff\xff",
            b"\x02",
            b"a",
            b"ab",
            b"ab\x00",
            b"ab\xff",
            b"abc",
            b"ac",
            b"\xff",
            b"\xff\x00",
            b"\xff\xff",
            b"\xff\xff\x01",
        ];
        let mut keys: Vec<_> = keys.iter().map(|k| k.to_vec()).collect();
        keys.sort();
        keys
    }

    fn store_with(keys: &[Vec<u8>]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let ops: Vec<_> = keys
            .iter()
            .map(|key| StorageOp::Put {
                table: HIST,
                key: key.clone(),
                value: Bytes::from(key.clone()),
            })
            .collect();
        store.apply(&ops).unwrap();
        (dir, store)
    }

    /// The keys a scan visited, checking each record is the one filed under its key.
    fn visited(
        scan: impl FnOnce(&mut dyn FnMut(&[u8], &[u8]) -> Result<(), StorageError>),
    ) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        scan(&mut |key, value| {
            assert_eq!(key, value);
            keys.push(key.to_vec());
            Ok(())
        });
        keys
    }

    #[test]
    fn prefix_scans_visit_exactly_the_keys_with_the_prefix_in_order() {
        let keys = edge_keys();
        let (_dir, store) = store_with(&keys);
        let prefixes: [&[u8]; 11] = [
            b"",
            b"a",
            b"ab",
            b"abc",
            b"abd",
            b"\x01",
            b"\x01\xff",
            b"\xff",
            b"\xff\xff",
            b"\xff\xff\xff",
            b"\x00",
        ];
        for prefix in prefixes {
            let expected: Vec<_> = keys
                .iter()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect();
            let got = visited(|visit| store.scan_prefix(HIST, prefix, visit).unwrap());
            assert_eq!(got, expected, "prefix {prefix:x?}");
        }
        assert_eq!(prefix_end(b"ab\xff\xff"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn range_scans_are_half_open_and_in_order() {
        let keys = edge_keys();
        let (_dir, store) = store_with(&keys);
        let mut bounds = keys.clone();
        bounds.extend([b"".to_vec(), b"aa".to_vec(), vec![0xff; 4]]);
        for start in &bounds {
            for end in &bounds {
                let expected: Vec<_> = keys
                    .iter()
                    .filter(|k| start.as_slice() <= k.as_slice() && k.as_slice() < end.as_slice())
                    .cloned()
                    .collect();
                let got = visited(|visit| {
                    store
                        .scan_range(HIST, start.as_slice()..end.as_slice(), visit)
                        .unwrap()
                });
                assert_eq!(got, expected, "{start:x?}..{end:x?}");
            }
        }
        let all = visited(|visit| store.scan(HIST, visit).unwrap());
        assert_eq!(all, keys, "a full scan is in key order");
    }

    #[test]
    fn records_carry_their_version_on_disk_and_reads_strip_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[put(HIST, "k", "value")]).unwrap();
        let txn = store.database.begin_read().unwrap();
        let name = HIST.redb_name().unwrap();
        let raw = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
            .unwrap();
        assert_eq!(
            raw.get(b"k".as_slice()).unwrap().unwrap().value(),
            b"\x01value"
        );
        assert_eq!(store.get(HIST, b"k").unwrap(), Some(Bytes::from("value")));
    }

    #[test]
    fn a_record_of_another_version_is_an_error_not_data() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.apply(&[put(HIST, "a", "fine")]).unwrap();
        let name = HIST.redb_name().unwrap();
        let txn = store.database.begin_write().unwrap();
        {
            let mut raw = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
                .unwrap();
            raw.insert(b"b".as_slice(), b"\x02from the future".as_slice())
                .unwrap();
            raw.insert(b"c".as_slice(), b"".as_slice()).unwrap();
        }
        txn.commit().unwrap();

        assert_eq!(store.get(HIST, b"a").unwrap(), Some(Bytes::from("fine")));
        let error = store.get(HIST, b"b").unwrap_err();
        assert!(
            matches!(&error, StorageError::RecordVersion { found: Some(2), key, .. } if key == "62"),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("record version 2"), "{text}");
        assert!(text.contains("service0/group0/hist"), "{text}");
        let empty = store.get(HIST, b"c").unwrap_err();
        assert!(
            matches!(empty, StorageError::RecordVersion { found: None, .. }),
            "{empty:?}"
        );
        assert!(empty.to_string().contains("record version"), "{empty}");

        let mut handed = Vec::new();
        let scanned = store.scan(HIST, |key, _| {
            handed.push(key.to_vec());
            Ok(())
        });
        assert!(matches!(scanned, Err(StorageError::RecordVersion { .. })));
        assert_eq!(
            handed,
            [b"a".to_vec()],
            "the unknown record was handed over"
        );
        assert!(store.load(HIST).is_err());
    }

    /// Writes `tables` (name, key, value) with plain redb, as a release with another layout would.
    fn write_raw(dir: &Path, tables: &[(&str, &[u8], &[u8])]) {
        let database = redb::Database::create(dir.join("state.redb")).unwrap();
        let txn = database.begin_write().unwrap();
        for (name, key, value) in tables {
            txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name))
                .unwrap()
                .insert(*key, *value)
                .unwrap();
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_store_of_the_unversioned_layout_is_refused_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        // What the release before format versions wrote: four tables, values without a version.
        write_raw(
            dir.path(),
            &[
                ("hist", b"h", b"\x01looks like a version byte"),
                ("lc", b"k", b"candidate"),
                ("register", b"k", b"entry"),
            ],
        );
        let database = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let txn = database.begin_write().unwrap();
        txn.open_table(META).unwrap();
        txn.commit().unwrap();
        drop(database);

        for _ in 0..2 {
            let error = Store::open(dir.path()).err().expect("an old store opened");
            assert!(
                matches!(
                    error,
                    StorageError::Format {
                        found: 1,
                        expected: 3
                    }
                ),
                "{error:?}"
            );
            let text = error.to_string();
            for needed in [
                "older",
                "format 1",
                "format 3",
                "cannot read",
                "empty data directory",
                "the release that wrote it",
            ] {
                assert!(text.contains(needed), "{needed:?} missing: {text}");
            }
        }
        // Refusing wrote nothing: the file still has only the old tables.
        let database = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let txn = database.begin_read().unwrap();
        let mut names: Vec<_> = txn
            .list_tables()
            .unwrap()
            .map(|t| t.name().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["hist", "lc", "meta", "register"]);
        assert!(txn.open_table(META).unwrap().is_empty().unwrap());
    }

    #[test]
    fn a_store_of_a_newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_raw(
            dir.path(),
            &[
                ("meta", FORMAT_VERSION_KEY, &4u32.to_be_bytes()),
                ("v4/0/0/hist", b"k", b"\x07v"),
            ],
        );
        let error = Store::open(dir.path()).err().expect("a newer store opened");
        assert!(
            matches!(
                error,
                StorageError::Format {
                    found: 4,
                    expected: 3
                }
            ),
            "{error:?}"
        );
        let text = error.to_string();
        for needed in [
            "newer",
            "format 4",
            "format 3",
            "cannot read",
            "empty data directory",
        ] {
            assert!(text.contains(needed), "{needed:?} missing: {text}");
        }
    }

    #[test]
    fn a_store_of_the_format_before_the_change_log_is_upgraded_and_read() {
        let dir = tempfile::tempdir().unwrap();
        write_raw(
            dir.path(),
            &[
                ("meta", FORMAT_VERSION_KEY, &2u32.to_be_bytes()),
                ("v2/0/0/hist", b"k", b"\x01v"),
            ],
        );
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.load(HIST).unwrap(),
            vec![(b"k".to_vec(), Bytes::from("v"))]
        );
        let txn = store.database.begin_read().unwrap();
        assert_eq!(
            txn.open_table(META)
                .unwrap()
                .get(FORMAT_VERSION_KEY)
                .unwrap()
                .unwrap()
                .value(),
            FORMAT_VERSION.to_be_bytes()
        );
    }

    #[test]
    fn a_fresh_store_records_its_format_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let store = Store::open(dir.path()).unwrap();
        let txn = store.database.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        assert_eq!(
            meta.get(FORMAT_VERSION_KEY).unwrap().unwrap().value(),
            FORMAT_VERSION.to_be_bytes()
        );
        assert!(store.namespaces().unwrap().is_empty());

        let damaged = tempfile::tempdir().unwrap();
        write_raw(damaged.path(), &[("meta", FORMAT_VERSION_KEY, b"\x00\x02")]);
        let error = Store::open(damaged.path())
            .err()
            .expect("a damaged version opened");
        assert!(matches!(error, StorageError::Failed(_)), "{error:?}");
        assert!(error.to_string().contains("format version"), "{error}");
    }

    #[test]
    fn tables_this_format_does_not_have_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let txn = store.database.begin_write().unwrap();
        txn.open_table(TableDefinition::<&[u8], &[u8]>::new("v2/00/0/hist"))
            .unwrap();
        txn.commit().unwrap();
        let error = store.namespaces().unwrap_err();
        assert!(error.to_string().contains("v2/00/0/hist"), "{error}");
        for name in [
            "v2/0/0",
            "v2/0/0/a/b",
            "v1/0/0/hist",
            "v2/0/-1/hist",
            "v2/65536/0/x",
            "hist",
        ] {
            assert!(parse_table_name(name).is_err(), "{name}");
        }
        assert_eq!(
            parse_table_name("v2/4/5/lc").unwrap(),
            Some(Namespace::new(ServiceId(4), GroupId(5)))
        );
        assert_eq!(parse_table_name("meta").unwrap(), None);
    }

    #[test]
    fn dropping_the_committer_finishes_queued_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Committer::start(store.clone());
        let waits: Vec<_> = (0..100)
            .map(|i| committer.submit(vec![put(REGISTER, &format!("{i:03}"), "v")]))
            .collect();
        drop(committer);
        for wait in waits {
            wait.blocking_recv().unwrap().unwrap();
        }
        assert_eq!(store.count(REGISTER).unwrap(), 100);
    }

    /// The change log's bytes in `dir`.
    fn log_bytes(dir: &Path) -> u64 {
        std::fs::metadata(dir.join(log::LOG_FILE)).unwrap().len()
    }

    #[test]
    fn a_commit_is_in_the_log_and_visible_before_any_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let mut entry = Vec::new();
        store
            .commit_group(
                &[vec![put(HIST, "a", "1")], vec![put(LC, "a", "x")]],
                &mut entry,
            )
            .unwrap();
        assert!(log_bytes(dir.path()) > 0);
        assert_eq!(store.count(HIST).unwrap(), 1);
        assert_eq!(store.count(LC).unwrap(), 1);
        // Not due yet: the log keeps it.
        let mut last = Instant::now();
        store.checkpoint(&mut last, false).unwrap();
        assert!(log_bytes(dir.path()) > 0);
        // A durable commit of its own empties the log too.
        store.apply(&[put(REGISTER, "r", "1")]).unwrap();
        assert_eq!(log_bytes(dir.path()), 0);
        store
            .commit_group(&[vec![put(HIST, "b", "2")]], &mut entry)
            .unwrap();
        store.checkpoint(&mut last, true).unwrap();
        assert_eq!(log_bytes(dir.path()), 0);
        // A large group skips the log and commits durably, which empties the log too.
        store
            .commit_group(&[vec![put(HIST, "c", "3")]], &mut entry)
            .unwrap();
        assert!(log_bytes(dir.path()) > 0);
        let large = "x".repeat(LOGGED_GROUP_BYTES_MAX);
        store
            .commit_group(&[vec![put(LC, "big", &large)]], &mut entry)
            .unwrap();
        assert_eq!(log_bytes(dir.path()), 0);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.count(HIST).unwrap(), 3);
        assert_eq!(store.count(LC).unwrap(), 2);
        assert_eq!(store.count(REGISTER).unwrap(), 1);
    }

    #[test]
    fn dropping_the_committer_leaves_an_empty_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Committer::start(store.clone());
        let wait = committer.submit(vec![put(HIST, "a", "1")]);
        drop(committer);
        wait.blocking_recv().unwrap().unwrap();
        assert_eq!(log_bytes(dir.path()), 0);
    }

    #[test]
    fn what_only_the_log_holds_is_applied_on_open_over_later_state() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .apply(&[put(HIST, "gone", "old"), put(HIST, "k", "0")])
                .unwrap();
        }
        // A crash after the log write and before redb saw it: only the log has these.
        {
            let (mut log, pending) = ChangeLog::open(dir.path()).unwrap();
            assert!(pending.is_empty());
            for ops in [
                vec![put(HIST, "k", "1"), put(LC, "k", "a")],
                vec![
                    StorageOp::Delete {
                        table: HIST,
                        key: b"gone".to_vec(),
                    },
                    put(HIST, "k", "2"),
                ],
            ] {
                let mut entry = vec![0; HEADER_BYTES];
                for op in &ops {
                    log::encode_op(op, &mut entry).unwrap();
                }
                log.append(&mut entry).unwrap();
            }
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.load(HIST).unwrap(),
            vec![(b"k".to_vec(), Bytes::from("2"))]
        );
        assert_eq!(store.count(LC).unwrap(), 1);
        assert_eq!(log_bytes(dir.path()), 0, "applied, so emptied");
    }

    /// Queues `batches`, closes the channel, and runs the commit loop over them with `apply`.
    fn run_loop(
        batches: Vec<Vec<StorageOp>>,
        apply: impl FnMut(&[Vec<StorageOp>]) -> Result<(), StorageError>,
    ) -> (u64, Vec<Result<(), StorageError>>) {
        let (sender, receiver) = mpsc::channel();
        let waits: Vec<_> = batches
            .into_iter()
            .map(|ops| {
                let (done, wait) = oneshot::channel();
                sender.send((ops, done)).unwrap();
                wait
            })
            .collect();
        drop(sender);
        let commits = AtomicU64::new(0);
        commit_loop(&receiver, &commits, apply, |_| Ok(()));
        let results = waits
            .into_iter()
            .map(|wait| wait.blocking_recv().unwrap())
            .collect();
        (commits.into_inner(), results)
    }

    #[test]
    fn groups_respect_the_batch_and_byte_bounds() {
        let mut sizes = Vec::new();
        let tiny: Vec<_> = (0..2 * BATCHES_PER_COMMIT_MAX + 5)
            .map(|i| vec![put(HIST, &i.to_string(), "v")])
            .collect();
        let (commits, results) = run_loop(tiny, |batches| {
            sizes.push(batches.len());
            Ok(())
        });
        assert_eq!(sizes, [BATCHES_PER_COMMIT_MAX, BATCHES_PER_COMMIT_MAX, 5]);
        assert_eq!(commits, 3);
        assert!(results.iter().all(Result::is_ok));

        // 20 MiB values: three fit under 64 MiB, a fourth would not. A batch over the bound
        // alone still commits, alone.
        let value = |mib: usize| Bytes::from(vec![7u8; mib << 20]);
        let twenty = value(20);
        let mut batches: Vec<_> = (0..5)
            .map(|i| {
                vec![StorageOp::Put {
                    table: HIST,
                    key: vec![i],
                    value: twenty.clone(),
                }]
            })
            .collect();
        batches.push(vec![StorageOp::Put {
            table: HIST,
            key: vec![9],
            value: value(70),
        }]);
        batches.push(vec![put(HIST, "small", "v")]);
        let mut shapes = Vec::new();
        run_loop(batches, |group| {
            shapes.push(
                group
                    .iter()
                    .map(|b| batch_bytes(b) >> 20)
                    .collect::<Vec<_>>(),
            );
            Ok(())
        });
        assert_eq!(shapes, [vec![20, 20, 20], vec![20, 20], vec![70], vec![0]]);
    }

    #[test]
    fn a_failed_commit_fails_its_batches_and_every_later_one() {
        let batches: Vec<_> = (0..2 * BATCHES_PER_COMMIT_MAX + 1)
            .map(|i| vec![put(HIST, &i.to_string(), "v")])
            .collect();
        let mut calls = 0;
        let (commits, results) = run_loop(batches, |_| {
            calls += 1;
            if calls == 2 {
                Err(StorageError::Failed("disk on fire".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(calls, 2, "the committer wrote after a failed commit");
        assert_eq!(commits, 2);
        let (first, rest) = results.split_at(BATCHES_PER_COMMIT_MAX);
        assert!(first.iter().all(Result::is_ok));
        assert!(rest.iter().all(Result::is_err));
        assert!(
            rest[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("disk on fire")
        );
        assert!(
            rest.last()
                .unwrap()
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("earlier")
        );
    }

    /// Set in a child process: the directory its writer uses.
    const CHILD: &str = "BULWARK_STORAGE_CHILD_DIR";
    /// Set in a child process, optionally: write this many records, then idle until killed.
    const CHILD_LIMIT: &str = "BULWARK_STORAGE_CHILD_LIMIT";
    /// Set in a child process, optionally: append to the change log only, never applying to
    /// redb, as a node killed between the two steps would have.
    const CHILD_LOG_ONLY: &str = "BULWARK_STORAGE_CHILD_LOG_ONLY";
    /// A child never runs longer than this, killed or not.
    const CHILD_SECONDS_MAX: u64 = 10;

    /// In a child process only: commit numbered records, 8 batches at a time, and print each
    /// once durable. A no-op test in a normal run.
    #[test]
    fn child_writer_process() {
        let Ok(dir) = std::env::var(CHILD) else {
            return;
        };
        let limit = std::env::var(CHILD_LIMIT)
            .ok()
            .map(|l| l.parse::<u64>().unwrap());
        let store = Arc::new(Store::open(Path::new(&dir)).unwrap());
        let log_only = std::env::var(CHILD_LOG_ONLY).is_ok();
        let committer = Committer::start(store.clone());
        let started = Instant::now();
        let bound = std::time::Duration::from_secs(CHILD_SECONDS_MAX);
        let mut sequence = 0u64;
        while started.elapsed() < bound && sequence < limit.unwrap_or(100_000) {
            if log_only {
                sequence += 1;
                let mut entry = vec![0; HEADER_BYTES];
                log::encode_op(&put(HIST, &format!("{sequence:08}"), "v"), &mut entry).unwrap();
                store.locked_log().unwrap().append(&mut entry).unwrap();
                println!("acked {sequence}");
                continue;
            }
            let waits: Vec<_> = (0..8)
                .map(|_| {
                    sequence += 1;
                    (
                        sequence,
                        committer.submit(vec![put(HIST, &format!("{sequence:08}"), "v")]),
                    )
                })
                .collect();
            for (sequence, wait) in waits {
                wait.blocking_recv().unwrap().unwrap();
                println!("acked {sequence}");
            }
        }
        if limit.is_some() {
            // Idle with the committer alive: what is on disk now is all the parent will find.
            std::thread::sleep(bound.saturating_sub(started.elapsed()));
        }
    }

    /// Runs [`child_writer_process`] in a child process, SIGKILLs it once `kill_after` acks are
    /// read, reopens its store and checks that every record it acknowledged is there.
    fn kill_writer_and_check(limit: Option<u64>, kill_after: usize, log_only: bool) {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "tests::child_writer_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        if let Some(limit) = limit {
            command.env(CHILD_LIMIT, limit.to_string());
        }
        if log_only {
            command.env(CHILD_LOG_ONLY, "1");
        }
        let mut child = command.spawn().unwrap();
        // Read on another thread so that a stuck child fails the test instead of hanging it.
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (lines, acks) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                // Not `strip_prefix`: the harness's "test ... " precedes the first ack unbroken.
                if let Some((_, n)) = line.split_once("acked ")
                    && lines.send(n.parse::<u64>().unwrap()).is_err()
                {
                    break;
                }
            }
        });
        let deadline = Instant::now() + std::time::Duration::from_secs(2 * CHILD_SECONDS_MAX);
        let mut acked = Vec::new();
        while acked.len() < kill_after {
            let left = deadline.saturating_duration_since(Instant::now());
            match acks.recv_timeout(left) {
                Ok(n) => acked.push(n),
                Err(_) => break, // the child exited or stalled
            }
        }
        child.kill().unwrap(); // SIGKILL: no destructors, no flush
        child.wait().unwrap();
        let before_kill = acked.len();
        // Every line the child printed before it died is in the pipe: check those acks too.
        acked.extend(acks.iter());
        assert!(
            before_kill >= kill_after,
            "the child acknowledged only {before_kill} records"
        );
        assert!(
            acked.iter().copied().eq(1..=acked.len() as u64),
            "acks out of order"
        );
        eprintln!(
            "killed after {before_kill} acks read; {} acked in all",
            acked.len()
        );
        let store = Store::open(dir.path()).unwrap();
        let present: std::collections::HashSet<Vec<u8>> = store
            .load(HIST)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for sequence in acked {
            assert!(
                present.contains(format!("{sequence:08}").as_bytes()),
                "acknowledged record {sequence} was lost"
            );
        }
    }

    /// Killed while writing, most likely mid-commit: redb must recover to a commit that holds
    /// every acknowledged record.
    #[test]
    fn nothing_acknowledged_is_lost_when_killed_while_writing() {
        kill_writer_and_check(None, 300, false);
    }

    /// Killed once idle: catches any acknowledgement sent before its commit, every time (a kill
    /// while writing catches that only if it lands before the next commit).
    #[test]
    fn nothing_acknowledged_is_lost_when_killed_while_idle() {
        kill_writer_and_check(Some(200), 200, false);
    }

    /// Killed after the change log has entries that redb never saw: opening applies them.
    #[test]
    fn nothing_acknowledged_is_lost_when_killed_between_the_log_and_redb() {
        kill_writer_and_check(None, 300, true);
    }
}
