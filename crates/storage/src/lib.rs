//! A node's durable state: redb tables of opaque records, and a group committer.
//!
//! "Durable" means a redb write transaction committed with `Durability::Immediate`: `commit()`
//! returns only after the data and the new root are fsync'd, so a crash (even SIGKILL or power
//! loss, with honest disks) keeps it. A node acknowledges a client only after the batch holding
//! the change is durable. One fsync per request would serialize every client behind the disk, so
//! the [`Committer`] thread takes every batch queued while the previous commit ran and commits
//! them together: one fsync for many acknowledgements, and batches still become durable in the
//! order they were submitted.
//!
//! A batch's receiver fires `Ok` only once that batch and every batch before it are durable. If
//! a commit fails (a failed fsync leaves the file in an unknown state), every batch in it and
//! every later batch gets the error and nothing more is written, so a later success can never
//! cover an earlier loss.
//!
//! This crate knows nothing of protocols: the node encodes protocol changes as records.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

use bytes::Bytes;
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Batches folded into one commit at most.
const BATCHES_PER_COMMIT_MAX: usize = 1024;
/// Key and value bytes folded into one commit at most, so one commit cannot hold unbounded
/// memory. A single batch larger than this is committed on its own.
const BYTES_PER_COMMIT_MAX: usize = 64 * 1024 * 1024;
/// redb's page cache. Its default (1 GiB) would dwarf everything else a node holds; the protocol
/// keeps what it serves in memory already, so the cache only has to speed up commits.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// The tables a node keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// PoWerStore `Hist` entries: fragments and their metadata.
    Hist,
    /// PoWerStore `lc`: one candidate per key.
    Lc,
    /// Node metadata.
    Meta,
    /// The baselines' (ABD, Phalanx) stored version: one record per key.
    Register,
}

impl Table {
    /// Every table, in [`Table::index`] order.
    const ALL: [Table; 4] = [Table::Hist, Table::Lc, Table::Meta, Table::Register];

    fn index(self) -> usize {
        match self {
            Table::Hist => 0,
            Table::Lc => 1,
            Table::Meta => 2,
            Table::Register => 3,
        }
    }

    fn definition(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        match self {
            Table::Hist => TableDefinition::new("hist"),
            Table::Lc => TableDefinition::new("lc"),
            Table::Meta => TableDefinition::new("meta"),
            Table::Register => TableDefinition::new("register"),
        }
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
    fn bytes(&self) -> usize {
        match self {
            StorageOp::Put { key, value, .. } => key.len() + value.len(),
            StorageOp::Delete { key, .. } => key.len(),
        }
    }
}

/// A storage failure. Cloneable so that every batch of a failed commit gets it.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct StorageError(String);

impl StorageError {
    /// An error of the caller's while it visits records (see [`Store::scan`]).
    pub fn other(message: impl std::fmt::Display) -> StorageError {
        StorageError(message.to_string())
    }

    fn from<E: std::fmt::Display>(context: &str) -> impl FnOnce(E) -> StorageError + '_ {
        move |e| StorageError(format!("{context}: {e}"))
    }
}

/// The node's database.
pub struct Store {
    database: redb::Database,
}

impl Store {
    /// Opens (creating if needed) `dir/state.redb`.
    pub fn open(dir: &Path) -> Result<Store, StorageError> {
        std::fs::create_dir_all(dir).map_err(StorageError::from("creating the data directory"))?;
        let path = dir.join("state.redb");
        let database = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(StorageError::from("opening state.redb"))?;
        let store = Store { database };
        // Create every table once, so readers never meet a missing one.
        let txn = store
            .database
            .begin_write()
            .map_err(StorageError::from("begin"))?;
        for table in Table::ALL {
            txn.open_table(table.definition())
                .map_err(StorageError::from("creating a table"))?;
        }
        txn.commit().map_err(StorageError::from("commit"))?;
        Ok(store)
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
    /// reads a store far larger than the node's memory this way.
    pub fn scan(
        &self,
        table: Table,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let txn = self
            .database
            .begin_read()
            .map_err(StorageError::from("begin read"))?;
        let opened = txn
            .open_table(table.definition())
            .map_err(StorageError::from("open table"))?;
        for entry in opened.iter().map_err(StorageError::from("scan"))? {
            let (key, value) = entry.map_err(StorageError::from("scan"))?;
            visit(key.value(), value.value())?;
        }
        Ok(())
    }

    /// One committed record.
    pub fn get(&self, table: Table, key: &[u8]) -> Result<Option<Bytes>, StorageError> {
        let txn = self
            .database
            .begin_read()
            .map_err(StorageError::from("begin read"))?;
        let opened = txn
            .open_table(table.definition())
            .map_err(StorageError::from("open table"))?;
        let value = opened.get(key).map_err(StorageError::from("get"))?;
        Ok(value.map(|v| Bytes::copy_from_slice(v.value())))
    }

    /// Number of records in `table`.
    pub fn count(&self, table: Table) -> Result<u64, StorageError> {
        let txn = self
            .database
            .begin_read()
            .map_err(StorageError::from("begin read"))?;
        let opened = txn
            .open_table(table.definition())
            .map_err(StorageError::from("open table"))?;
        opened.len().map_err(StorageError::from("count"))
    }

    /// Applies `ops` in one durable transaction.
    pub fn apply(&self, ops: &[StorageOp]) -> Result<(), StorageError> {
        self.apply_all(std::iter::once(ops))
    }

    fn apply_all<'a>(
        &self,
        batches: impl Iterator<Item = &'a [StorageOp]>,
    ) -> Result<(), StorageError> {
        let mut txn = self
            .database
            .begin_write()
            .map_err(StorageError::from("begin"))?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StorageError::from("durability"))?;
        {
            // Only the tables a group touches are opened: every opened table's root is flushed
            // at commit, and most groups touch one table (a STORE's `hist`, a COMPLETE's `lc`).
            let mut tables: [Option<redb::Table<&[u8], &[u8]>>; Table::ALL.len()] =
                Default::default();
            for batch in batches {
                for op in batch {
                    let (table, key) = match op {
                        StorageOp::Put { table, key, .. } | StorageOp::Delete { table, key } => {
                            (*table, key)
                        }
                    };
                    let opened = match &mut tables[table.index()] {
                        Some(opened) => opened,
                        slot => slot.insert(
                            txn.open_table(table.definition())
                                .map_err(StorageError::from("open table"))?,
                        ),
                    };
                    match op {
                        StorageOp::Put { value, .. } => {
                            opened
                                .insert(key.as_slice(), value.as_ref())
                                .map_err(StorageError::from("insert"))?;
                        }
                        StorageOp::Delete { .. } => {
                            opened
                                .remove(key.as_slice())
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
                commit_loop(&receiver, &counter, |batches| {
                    store.apply_all(batches.iter().map(Vec::as_slice))
                });
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
            let _ = done.send(Err(StorageError("the committer has stopped".into())));
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

/// Commits groups with `apply` until the channel is closed and drained.
fn commit_loop(
    receiver: &mpsc::Receiver<Submission>,
    commits: &AtomicU64,
    mut apply: impl FnMut(&[Vec<StorageOp>]) -> Result<(), StorageError>,
) {
    let mut carried = None;
    let mut failed: Option<StorageError> = None;
    while let Some(group) = next_group(receiver, &mut carried) {
        let (batches, waiting): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        let result = match &failed {
            Some(error) => Err(StorageError(format!(
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(table: Table, key: &str, value: &str) -> StorageOp {
        StorageOp::Put {
            table,
            key: key.as_bytes().to_vec(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    #[test]
    fn records_survive_reopening_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .apply(&[
                    put(Table::Hist, "a", "1"),
                    put(Table::Lc, "a", "x"),
                    put(Table::Hist, "b", "2"),
                ])
                .unwrap();
            store
                .apply(&[
                    StorageOp::Delete {
                        table: Table::Hist,
                        key: b"b".to_vec(),
                    },
                    put(Table::Hist, "c", "3"),
                ])
                .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let hist = store.load(Table::Hist).unwrap();
        assert_eq!(
            hist,
            vec![
                (b"a".to_vec(), Bytes::from("1")),
                (b"c".to_vec(), Bytes::from("3"))
            ]
        );
        assert_eq!(store.load(Table::Lc).unwrap().len(), 1);
        assert_eq!(store.count(Table::Meta).unwrap(), 0);
    }

    #[test]
    fn ops_in_one_batch_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .apply(&[
                put(Table::Hist, "k", "1"),
                StorageOp::Delete {
                    table: Table::Hist,
                    key: b"k".to_vec(),
                },
            ])
            .unwrap();
        assert!(store.load(Table::Hist).unwrap().is_empty());
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
                        .map(|i| committer.submit(vec![put(Table::Hist, &format!("{t}-{i}"), "v")]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            waits.extend(thread.join().unwrap());
        }
        // Later batches overwrite earlier ones of the same key.
        waits.push(committer.submit(vec![put(Table::Lc, "same", "first")]));
        waits.push(committer.submit(vec![put(Table::Lc, "same", "second")]));
        for wait in waits {
            wait.blocking_recv().unwrap().unwrap();
        }
        assert_eq!(store.count(Table::Hist).unwrap(), 200);
        assert_eq!(
            store.load(Table::Lc).unwrap(),
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
                table: Table::Hist,
                key: b"big".to_vec(),
                value: value.clone(),
            }])
            .unwrap();
        assert_eq!(store.load(Table::Hist).unwrap()[0].1, value);
    }

    #[test]
    fn every_table_round_trips_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            for table in Table::ALL {
                let name = format!("{table:?}");
                store
                    .apply(&[put(table, "shared", &name), put(table, &name, "own")])
                    .unwrap();
            }
        }
        let store = Store::open(dir.path()).unwrap();
        for (i, table) in Table::ALL.into_iter().enumerate() {
            assert_eq!(table.index(), i);
            let name = format!("{table:?}");
            let mut expected = vec![
                (b"shared".to_vec(), Bytes::from(name.clone())),
                (name.into_bytes(), Bytes::from("own")),
            ];
            expected.sort();
            assert_eq!(store.load(table).unwrap(), expected, "{table:?}");
            assert_eq!(store.count(table).unwrap(), 2);
        }
        store
            .apply(&[StorageOp::Delete {
                table: Table::Meta,
                key: b"shared".to_vec(),
            }])
            .unwrap();
        assert_eq!(store.count(Table::Meta).unwrap(), 1);
        assert_eq!(
            store.count(Table::Lc).unwrap(),
            2,
            "a delete touched another table"
        );
    }

    #[test]
    fn dropping_the_committer_finishes_queued_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let committer = Committer::start(store.clone());
        let waits: Vec<_> = (0..100)
            .map(|i| committer.submit(vec![put(Table::Meta, &format!("{i:03}"), "v")]))
            .collect();
        drop(committer);
        for wait in waits {
            wait.blocking_recv().unwrap().unwrap();
        }
        assert_eq!(store.count(Table::Meta).unwrap(), 100);
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
        commit_loop(&receiver, &commits, apply);
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
            .map(|i| vec![put(Table::Hist, &i.to_string(), "v")])
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
                    table: Table::Hist,
                    key: vec![i],
                    value: twenty.clone(),
                }]
            })
            .collect();
        batches.push(vec![StorageOp::Put {
            table: Table::Hist,
            key: vec![9],
            value: value(70),
        }]);
        batches.push(vec![put(Table::Hist, "small", "v")]);
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
            .map(|i| vec![put(Table::Hist, &i.to_string(), "v")])
            .collect();
        let mut calls = 0;
        let (commits, results) = run_loop(batches, |_| {
            calls += 1;
            if calls == 2 {
                Err(StorageError("disk on fire".into()))
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
        let committer = Committer::start(store);
        let started = Instant::now();
        let bound = std::time::Duration::from_secs(CHILD_SECONDS_MAX);
        let mut sequence = 0u64;
        while started.elapsed() < bound && sequence < limit.unwrap_or(100_000) {
            let waits: Vec<_> = (0..8)
                .map(|_| {
                    sequence += 1;
                    (
                        sequence,
                        committer.submit(vec![put(Table::Hist, &format!("{sequence:08}"), "v")]),
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
    fn kill_writer_and_check(limit: Option<u64>, kill_after: usize) {
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
            .load(Table::Hist)
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
        kill_writer_and_check(None, 300);
    }

    /// Killed once idle: catches any acknowledgement sent before its commit, every time (a kill
    /// while writing catches that only if it lands before the next commit).
    #[test]
    fn nothing_acknowledged_is_lost_when_killed_while_idle() {
        kill_writer_and_check(Some(200), 200);
    }
}
