//! The change log: where a group commit becomes durable.
//!
//! A redb commit with `Durability::Immediate` costs page bookkeeping and more than one flush; a
//! log append costs one `write` and one `fdatasync`. So the committer appends each group to
//! `changes.log`, syncs it, applies the same bytes to redb without a flush (readers see them at
//! once), and only then acknowledges. Every so often a checkpoint (one durable redb commit, which
//! makes every earlier unflushed one durable) lets the log be emptied. On open, whatever the log
//! still holds is applied to redb again: applying a log entry is idempotent when the entries
//! after it are applied too, because every op puts or deletes a whole record.
//!
//! An entry is a 16-byte header (body length `u32`, CRC-32 `u32` of sequence number and body,
//! sequence number `u64`, all little-endian) and its body, the encoded ops ([`encode_op`]).
//! Sequence numbers count up by one from entry to entry, so an entry left from before a truncation
//! cannot pass as a new one.
//!
//! A crash can leave the last entry torn: a prefix of it, or its length with zeros where the
//! data did not reach the disk. That entry was never acknowledged (the acknowledgement waits for
//! the `fdatasync` of the whole append), so it is cut off with a warning. A bad entry with
//! anything but zeros after it cannot come from a crash, since nothing is appended before the
//! previous append is synced: that is damage, and the store refuses to open, saying where.

use crate::{RECORD_VERSION, StorageError, StorageOp};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub(crate) const LOG_FILE: &str = "changes.log";
/// Bytes of an entry's header.
pub(crate) const HEADER_BYTES: usize = 16;
/// Body bytes one entry may hold. A larger group fails to commit rather than write an entry that
/// the next open would refuse.
pub(crate) const ENTRY_BYTES_MAX: usize = 1 << 30;
/// A log this release writes never holds more than a checkpoint's worth and one more entry, far
/// below this; a larger file is not read into memory.
pub(crate) const FILE_BYTES_MAX: u64 = 2 << 30;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// One decoded op of an entry: the redb table's name, the key, and the stored record (version
/// byte included) or `None` for a delete. It borrows the entry's bytes.
#[derive(Debug, PartialEq)]
pub(crate) struct LoggedOp<'a> {
    pub table: &'a str,
    pub key: &'a [u8],
    pub record: Option<&'a [u8]>,
}

/// Appends `op` to an entry body: kind, the redb table name (length `u8`), the key (length
/// `u32`), and for a put the record with its [`RECORD_VERSION`] byte (length `u32`).
pub(crate) fn encode_op(op: &StorageOp, out: &mut Vec<u8>) -> Result<(), StorageError> {
    let (kind, table, key, value) = match op {
        StorageOp::Put { table, key, value } => (OP_PUT, table, key, Some(value)),
        StorageOp::Delete { table, key } => (OP_DELETE, table, key, None),
    };
    let name = table.redb_name()?;
    let too_long = || StorageError::Failed(format!("a record of table {table} is over 4 GiB"));
    out.push(kind);
    // A valid name is at most a few dozen bytes (`redb_table_name`), so it fits a `u8`.
    out.push(u8::try_from(name.len()).map_err(|_| too_long())?);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(
        &u32::try_from(key.len())
            .map_err(|_| too_long())?
            .to_le_bytes(),
    );
    out.extend_from_slice(key);
    if let Some(value) = value {
        let record = value.len().checked_add(1).ok_or_else(too_long)?;
        out.extend_from_slice(&u32::try_from(record).map_err(|_| too_long())?.to_le_bytes());
        out.push(RECORD_VERSION);
        out.extend_from_slice(value);
    }
    Ok(())
}

/// The ops of an entry body, in order. A body that does not decode exactly is an error: it passed
/// its checksum, so it was written that way, by a release that encodes differently.
pub(crate) fn decode_ops(mut body: &[u8]) -> Result<Vec<LoggedOp<'_>>, StorageError> {
    fn take<'a>(body: &mut &'a [u8], n: usize) -> Result<&'a [u8], StorageError> {
        if body.len() < n {
            return Err(StorageError::Failed(
                "a change log entry ends inside an op".into(),
            ));
        }
        let (taken, rest) = body.split_at(n);
        *body = rest;
        Ok(taken)
    }
    fn length(body: &mut &[u8]) -> Result<usize, StorageError> {
        let bytes = take(body, 4)?;
        let mut word = [0; 4];
        word.copy_from_slice(bytes);
        Ok(u32::from_le_bytes(word) as usize)
    }
    let mut ops = Vec::new();
    while let Some((&kind, rest)) = body.split_first() {
        body = rest;
        let name_bytes = take(&mut body, 1)?[0] as usize;
        let table = std::str::from_utf8(take(&mut body, name_bytes)?).map_err(|_| {
            StorageError::Failed("a change log entry names a table in invalid UTF-8".into())
        })?;
        let key_bytes = length(&mut body)?;
        let key = take(&mut body, key_bytes)?;
        let record = match kind {
            OP_PUT => {
                let record_bytes = length(&mut body)?;
                Some(take(&mut body, record_bytes)?)
            }
            OP_DELETE => None,
            other => {
                return Err(StorageError::Failed(format!(
                    "a change log entry holds an op of kind {other}, which this release does not \
                     write"
                )));
            }
        };
        ops.push(LoggedOp { table, key, record });
    }
    Ok(ops)
}

/// `changes.log`, open for appending.
pub(crate) struct ChangeLog {
    file: File,
    path: PathBuf,
    /// Where the next entry goes: the bytes of every entry so far.
    end: u64,
    /// The sequence number of the next entry.
    next: u64,
}

/// What [`ChangeLog::open`] found: the bodies of the entries the log holds, in order.
pub(crate) type Pending = Vec<Vec<u8>>;

impl ChangeLog {
    /// Opens (creating if needed) the log in `dir` and reads the entries it holds. A torn last
    /// entry is cut off; damage anywhere else is an error.
    pub(crate) fn open(dir: &Path) -> Result<(ChangeLog, Pending), StorageError> {
        let path = dir.join(LOG_FILE);
        let failed = |what: &'static str| {
            let path = path.clone();
            move |error: std::io::Error| {
                StorageError::Failed(format!("{what} {}: {error}", path.display()))
            }
        };
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed("opening"))?;
        if !existed {
            // The file's name must outlive a crash as much as its contents do.
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(failed("syncing the directory of"))?;
        }
        let size = file
            .metadata()
            .map_err(failed("reading the size of"))?
            .len();
        if size > FILE_BYTES_MAX {
            return Err(StorageError::Failed(format!(
                "{} holds {size} B, more than the {FILE_BYTES_MAX} B any log of this release                  reaches: it was not written by this release",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(failed("reading"))?;
        let (pending, valid, next) = parse(&bytes).map_err(|at| {
            StorageError::Failed(format!(
                "{} is damaged at byte {at}: an entry fails its checksum or sequence and is not \
                 the last one, which a crash cannot cause. Move the data directory aside and \
                 start this node empty; its group serves what it held, and a node started empty \
                 counts against the faults its group tolerates",
                path.display()
            ))
        })?;
        if valid < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                kept = valid,
                dropped = bytes.len() - valid,
                "cutting off a torn last entry of the change log (never acknowledged)"
            );
            metrics::counter!("bulwark_storage_log_torn_entries_total").increment(1);
            file.set_len(valid as u64).map_err(failed("truncating"))?;
            file.sync_all().map_err(failed("syncing"))?;
        }
        file.seek(SeekFrom::Start(valid as u64))
            .map_err(failed("seeking in"))?;
        let log = ChangeLog {
            file,
            path,
            end: valid as u64,
            next,
        };
        Ok((log, pending))
    }

    /// Whether the log holds no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.end == 0
    }

    /// Bytes the log holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.end
    }

    /// Makes `entry` durable: `entry` is [`HEADER_BYTES`] of room followed by the body, and the
    /// header is filled in here. Returns once the entry is synced to the disk.
    pub(crate) fn append(&mut self, entry: &mut [u8]) -> Result<(), StorageError> {
        let body_bytes = entry.len().saturating_sub(HEADER_BYTES);
        assert!(
            entry.len() >= HEADER_BYTES,
            "an entry has room for its header"
        );
        if body_bytes > ENTRY_BYTES_MAX {
            return Err(StorageError::Failed(format!(
                "a group of {body_bytes} B is over the {ENTRY_BYTES_MAX} B a change log entry holds"
            )));
        }
        let sequence = self.next.to_le_bytes();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&sequence);
        crc.update(&entry[HEADER_BYTES..]);
        entry[0..4].copy_from_slice(&(body_bytes as u32).to_le_bytes());
        entry[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
        entry[8..16].copy_from_slice(&sequence);
        let failed = |what: &str, error: std::io::Error| {
            StorageError::Failed(format!("{what} {}: {error}", self.path.display()))
        };
        self.file
            .write_all(entry)
            .map_err(|error| failed("appending to", error))?;
        self.file
            .sync_data()
            .map_err(|error| failed("syncing", error))?;
        self.end += entry.len() as u64;
        self.next += 1;
        Ok(())
    }

    /// Empties the log, once everything in it is durable elsewhere.
    pub(crate) fn clear(&mut self) -> Result<(), StorageError> {
        let failed = |what: &str, error: std::io::Error| {
            StorageError::Failed(format!("{what} {}: {error}", self.path.display()))
        };
        self.file
            .set_len(0)
            .map_err(|error| failed("truncating", error))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(|error| failed("seeking in", error))?;
        self.file
            .sync_all()
            .map_err(|error| failed("syncing", error))?;
        self.end = 0;
        Ok(())
    }
}

/// The entries of a log file's bytes, how many bytes they fill, and the next sequence number;
/// or the offset of damage.
fn parse(bytes: &[u8]) -> Result<(Pending, usize, u64), usize> {
    let mut pending = Vec::new();
    let mut at = 0;
    let mut expected: Option<u64> = None;
    while at < bytes.len() {
        let entry = bytes.get(at..).unwrap_or_default();
        let good = entry.get(..HEADER_BYTES).and_then(|header| {
            let word = |range: std::ops::Range<usize>| header.get(range).unwrap_or_default();
            let body_bytes = u32::from_le_bytes(word(0..4).try_into().ok()?) as usize;
            let crc = u32::from_le_bytes(word(4..8).try_into().ok()?);
            let sequence_bytes = word(8..16);
            let sequence = u64::from_le_bytes(sequence_bytes.try_into().ok()?);
            let body = entry.get(HEADER_BYTES..HEADER_BYTES.checked_add(body_bytes)?)?;
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(sequence_bytes);
            hasher.update(body);
            let in_order = expected.is_none_or(|expected| expected == sequence);
            (hasher.finalize() == crc && in_order && body_bytes <= ENTRY_BYTES_MAX)
                .then_some((sequence, body))
        });
        match good {
            Some((sequence, body)) => {
                pending.push(body.to_vec());
                at += HEADER_BYTES + body.len();
                expected = Some(sequence.wrapping_add(1));
            }
            None => {
                // Torn: what follows the bad entry's header is its own body running off the end,
                // or zeros. Anything else is damage.
                let declared = entry
                    .get(..4)
                    .and_then(|word| word.try_into().ok())
                    .map_or(0, |word| u32::from_le_bytes(word) as usize);
                let after = HEADER_BYTES.saturating_add(declared);
                let rest = entry.get(after..).unwrap_or_default();
                if rest.iter().all(|&b| b == 0) {
                    return Ok((pending, at, expected.unwrap_or(0)));
                }
                return Err(at);
            }
        }
    }
    Ok((pending, at, expected.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Namespace, Table};
    use bulwark_core::{GroupId, ServiceId};

    const HIST: Table = Namespace::new(ServiceId(0), GroupId(0)).table("hist");

    fn entry(ops: &[StorageOp]) -> Vec<u8> {
        let mut entry = vec![0; HEADER_BYTES];
        for op in ops {
            encode_op(op, &mut entry).unwrap();
        }
        entry
    }

    fn put(key: &str, value: &str) -> StorageOp {
        StorageOp::Put {
            table: HIST,
            key: key.as_bytes().to_vec(),
            value: bytes::Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    #[test]
    fn ops_round_trip_through_an_entry() {
        let ops = [
            put("a", "1"),
            StorageOp::Delete {
                table: HIST,
                key: b"b".to_vec(),
            },
            put("", ""),
        ];
        let entry = entry(&ops);
        let decoded = decode_ops(&entry[HEADER_BYTES..]).unwrap();
        let name = HIST.redb_name().unwrap();
        assert_eq!(
            decoded,
            vec![
                LoggedOp {
                    table: &name,
                    key: b"a",
                    record: Some(&[RECORD_VERSION, b'1'])
                },
                LoggedOp {
                    table: &name,
                    key: b"b",
                    record: None
                },
                LoggedOp {
                    table: &name,
                    key: b"",
                    record: Some(&[RECORD_VERSION])
                },
            ]
        );
        // A body cut anywhere but between ops does not decode.
        let body = &entry[HEADER_BYTES..];
        let mut boundaries = vec![0];
        for op in &ops {
            let mut alone = Vec::new();
            encode_op(op, &mut alone).unwrap();
            boundaries.push(boundaries.last().unwrap() + alone.len());
        }
        for cut in 0..body.len() {
            let decoded = decode_ops(&body[..cut]);
            match boundaries.iter().position(|&b| b == cut) {
                Some(ops) => assert_eq!(decoded.unwrap().len(), ops),
                None => assert!(decoded.is_err(), "cut at {cut}"),
            }
        }
    }

    fn written(entries: usize) -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, pending) = ChangeLog::open(dir.path()).unwrap();
        assert!(pending.is_empty() && log.is_empty());
        for i in 0..entries {
            log.append(&mut entry(&[put(&i.to_string(), "value")]))
                .unwrap();
        }
        let bytes = std::fs::read(dir.path().join(LOG_FILE)).unwrap();
        (dir, bytes)
    }

    #[test]
    fn entries_survive_reopening_in_order_and_clear_empties() {
        let (dir, _) = written(3);
        let (mut log, pending) = ChangeLog::open(dir.path()).unwrap();
        assert_eq!(pending.len(), 3);
        assert_eq!(decode_ops(&pending[2]).unwrap()[0].key, b"2");
        // Appending goes on after what was there, in sequence.
        log.append(&mut entry(&[put("3", "v")])).unwrap();
        drop(log);
        let (mut log, pending) = ChangeLog::open(dir.path()).unwrap();
        assert_eq!(pending.len(), 4);
        log.clear().unwrap();
        drop(log);
        let (log, pending) = ChangeLog::open(dir.path()).unwrap();
        assert!(pending.is_empty() && log.is_empty());
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_at_every_length() {
        let (dir, bytes) = written(2);
        // Both entries have the same size.
        let first = bytes.len() / 2;
        let path = dir.path().join(LOG_FILE);
        for cut in first..bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let (log, pending) = ChangeLog::open(dir.path()).unwrap();
            assert_eq!(pending.len(), 1, "cut at {cut}");
            assert_eq!(log.bytes(), first as u64);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), first as u64);
        }
        // The size reached the disk but the data did not: zeros in place of the last entry.
        let mut zeroed = bytes.clone();
        zeroed[first..].fill(0);
        std::fs::write(&path, &zeroed).unwrap();
        assert_eq!(ChangeLog::open(dir.path()).unwrap().1.len(), 1);
        // Its header arrived, part of its body did not.
        let mut holed = bytes.clone();
        let end = holed.len();
        holed[end - 3..].fill(0);
        std::fs::write(&path, &holed).unwrap();
        assert_eq!(ChangeLog::open(dir.path()).unwrap().1.len(), 1);
    }

    #[test]
    fn damage_before_the_last_entry_is_refused_saying_where() {
        let (dir, bytes) = written(3);
        let path = dir.path().join(LOG_FILE);
        let mut damaged = bytes.clone();
        damaged[HEADER_BYTES + 2] ^= 1;
        std::fs::write(&path, &damaged).unwrap();
        let error = ChangeLog::open(dir.path()).err().unwrap().to_string();
        assert!(error.contains("damaged at byte 0"), "{error}");
        // An entry out of sequence (here the first one twice) is damage too.
        let one = bytes.len() / 3;
        let mut repeated = bytes[..one].to_vec();
        repeated.extend_from_slice(&bytes[..one]);
        repeated.extend_from_slice(&bytes[one..]);
        std::fs::write(&path, &repeated).unwrap();
        let error = ChangeLog::open(dir.path()).err().unwrap().to_string();
        assert!(error.contains(&format!("damaged at byte {one}")), "{error}");
    }
}
