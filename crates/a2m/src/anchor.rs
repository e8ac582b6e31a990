//! Where a component records how far its state has come, outside the state itself, so that a
//! state restored from an older copy is caught at start instead of attesting again slots it
//! already attested (spec §7.1 item 8).
//!
//! Every change raises the state's *generation* in the same durable commit, and the anchor
//! records that generation before any attestation about the change can leave. At start the two
//! must agree, except that the state may be one ahead (a crash between the commit and the
//! anchor's write, before anything was attested about it). State behind its anchor was rolled
//! back.
//!
//! What an anchor can catch depends on what can roll it back with the state. A [`FileAnchor`]
//! is a file outside the component's directory: it catches a directory restored from a copy or a
//! backup, not a restore of the whole disk that holds both (put it on another disk to catch
//! that). An anchor in a TPM's monotonic counter catches any rollback of the disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bulwark_core::Digest;
use bulwark_core::sign::PublicKey;

/// The record an anchor keeps: whose generation, and which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The component the generation belongs to.
    pub key: PublicKey,
    /// Raised by one with every change its state makes durable.
    pub generation: u64,
}

/// A place that holds a component's latest [`Mark`] durably, apart from its state.
pub trait Anchor: Send {
    /// The recorded mark, or `None` if nothing was ever recorded here.
    fn read(&mut self) -> Result<Option<Mark>, String>;
    /// Records `mark` durably before returning.
    fn record(&mut self, mark: Mark) -> Result<(), String>;
    /// Where it is, for messages.
    fn describe(&self) -> String;

    /// Takes the anchor for a new identity `key` and returns the generation its state starts
    /// at. Refuses an anchor that holds another record: it may be a live log's.
    fn claim(&mut self, _key: PublicKey) -> Result<u64, String> {
        match self.read()? {
            None => Ok(0),
            Some(mark) => Err(format!(
                "{} holds the record of trusted log {}; remove it only if that log is retired",
                self.describe(),
                mark.key
            )),
        }
    }

    /// What kind of anchor it is, as the component's store records it: the same state must
    /// always be opened with the same kind (a TPM-anchored state opened on a file would lose
    /// the TPM's protection without a word).
    fn kind(&self) -> AnchorKind;

    /// Keeps `seed`, the log's signing key, where only this anchor can open it, and returns what
    /// the store keeps instead; `None` for an anchor that keeps no keys (the store then keeps
    /// the seed itself).
    fn seal(&mut self, _seed: &[u8; 32]) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }

    /// Gives back what [`Anchor::claim`] took, for an identity that was never made (nothing was
    /// attested under it). Claiming a file anchor writes nothing, so there is nothing to give
    /// back.
    fn release(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Opens a key [`Anchor::seal`] sealed.
    fn unseal(&mut self, _sealed: &[u8]) -> Result<[u8; 32], String> {
        Err(format!("{} keeps no keys", self.describe()))
    }
}

/// The kinds of anchor, as a component's store records the one it was made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnchorKind {
    /// A [`FileAnchor`]; also every state made before kinds were recorded.
    File,
    /// A [`crate::TpmAnchor`]'s counter at this NV index.
    Tpm {
        /// The counter's NV index.
        index: u32,
    },
}

impl std::fmt::Display for AnchorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnchorKind::File => write!(f, "file"),
            AnchorKind::Tpm { index } => write!(f, "tpm {index:#010x}"),
        }
    }
}

impl std::str::FromStr for AnchorKind {
    type Err = String;

    fn from_str(text: &str) -> Result<AnchorKind, String> {
        if text == "file" {
            return Ok(AnchorKind::File);
        }
        text.strip_prefix("tpm 0x")
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .map(|index| AnchorKind::Tpm { index })
            .ok_or_else(|| format!("{text:?} is no kind of anchor"))
    }
}

/// An anchor in a small file: 32 bytes of key, 8 of generation, 32 of checksum, rewritten in
/// place and flushed with every change.
pub struct FileAnchor {
    path: PathBuf,
    file: Option<File>,
}

const FILE_BYTES: usize = 32 + 8 + 32;
const CHECKSUM_DOMAIN: &str = "bulwark a2m anchor v1";

impl FileAnchor {
    /// The anchor at `path` (created on the first record).
    pub fn new(path: &Path) -> FileAnchor {
        FileAnchor {
            path: path.to_path_buf(),
            file: None,
        }
    }

    /// The anchor beside directory `dir`: `<dir>.anchor` in its parent, so that a copy of the
    /// directory restored over it does not restore the anchor too. `None` for a directory
    /// named only by `.` or `..`, whose anchor would land inside it: name it, or give the
    /// anchor's path.
    pub fn beside(dir: &Path) -> Option<FileAnchor> {
        let absolute = std::path::absolute(dir).ok()?;
        let std::path::Component::Normal(name) = absolute.components().next_back()? else {
            return None;
        };
        let mut name = name.to_os_string();
        name.push(".anchor");
        Some(FileAnchor::new(&absolute.with_file_name(name)))
    }

    fn file(&mut self) -> Result<&mut File, String> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(|error| format!("opening {}: {error}", self.path.display()))?;
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| "the anchor file is not open".to_string())
    }
}

impl Anchor for FileAnchor {
    fn read(&mut self) -> Result<Option<Mark>, String> {
        if !self.path.exists() {
            return Ok(None);
        }
        let path = self.path.display().to_string();
        let mut bytes = Vec::new();
        let file = self.file()?;
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_end(&mut bytes))
            .map_err(|error| format!("reading {path}: {error}"))?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let damaged = || format!("{path} is damaged");
        if bytes.len() != FILE_BYTES {
            return Err(damaged());
        }
        let (record, checksum) = bytes.split_at(40);
        if Digest::of(CHECKSUM_DOMAIN, record).0 != checksum {
            return Err(damaged());
        }
        let key: [u8; 32] = record[..32].try_into().map_err(|_| damaged())?;
        let key = PublicKey::from_bytes(&key).map_err(|_| damaged())?;
        let generation = u64::from_be_bytes(record[32..40].try_into().map_err(|_| damaged())?);
        Ok(Some(Mark { key, generation }))
    }

    fn record(&mut self, mark: Mark) -> Result<(), String> {
        let path = self.path.display().to_string();
        let mut bytes = Vec::with_capacity(FILE_BYTES);
        bytes.extend_from_slice(mark.key.as_bytes());
        bytes.extend_from_slice(&mark.generation.to_be_bytes());
        let checksum = Digest::of(CHECKSUM_DOMAIN, &bytes).0;
        bytes.extend_from_slice(&checksum);
        let file = self.file()?;
        // 72 bytes in place: within one sector, so a crash leaves the old record or the new one;
        // the checksum catches anything else, and a damaged anchor stops the component.
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&bytes))
            .and_then(|()| file.sync_data())
            .map_err(|error| format!("writing {path}: {error}"))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn kind(&self) -> AnchorKind {
        AnchorKind::File
    }
}

/// How a component's state and its anchor compare at start.
pub(crate) fn judge(state: Mark, anchored: Option<Mark>) -> Result<(), String> {
    let Some(anchored) = anchored else {
        return Err(
            "its anchor holds no record, so a rollback could not be told apart".to_string(),
        );
    };
    if anchored.key != state.key {
        return Err(format!(
            "its anchor belongs to another trusted log (key {})",
            anchored.key
        ));
    }
    if state.generation < anchored.generation {
        return Err(format!(
            "its state is at generation {} but its anchor recorded generation {}: the state was \
             rolled back (restored from an older copy)",
            state.generation, anchored.generation
        ));
    }
    if state.generation > anchored.generation.saturating_add(1) {
        return Err(format!(
            "its state is at generation {} but its anchor only at {}: the anchor was rolled back \
             or replaced",
            state.generation, anchored.generation
        ));
    }
    Ok(())
}
