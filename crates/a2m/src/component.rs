//! The software backend: the logs in memory, every change durable in the component's own store
//! and recorded by its anchor before the call that made it returns.

use std::path::Path;

use bulwark_core::a2m::{Attestation, ChainDigest, LogId, Nonce, Seq, Value};
use bulwark_core::ids::{GroupId, ServiceId};
use bulwark_core::sign::{PublicKey, SecretKey, Signed};
use bulwark_core::wire;
use bulwark_storage::{Namespace, StorageError, StorageOp, Store, Table};
use bytes::Bytes;

use crate::anchor::{Anchor, AnchorKind, Mark, judge};
use crate::logs::{Entry, Head, Limits, Logs, Plan};
use bulwark_core::a2m::Refusal;

use crate::{A2m, A2mError};

/// The namespace of a component's own store (a store of its own, in its own directory).
const NAMESPACE: Namespace = Namespace::new(ServiceId::A2M, GroupId(0));
/// `secret` → the key's 32-byte seed, or `sealed` → the seed as the anchor sealed it;
/// `generation` and `anchor` (below).
pub(crate) const IDENTITY: Table = NAMESPACE.table("identity");
/// Big-endian log id → its [`Head`].
const HEADS: Table = NAMESPACE.table("heads");
/// Big-endian log id, then big-endian slot → its [`Entry`].
pub(crate) const ENTRIES: Table = NAMESPACE.table("entries");
pub(crate) const SECRET: &[u8] = b"secret";
pub(crate) const SEALED: &[u8] = b"sealed";
/// `anchor` → the kind of anchor the identity was made with ([`Anchor::kind`]).
const ANCHOR_KIND: &[u8] = b"anchor";
/// `generation` → how many changes were made durable, big-endian.
const GENERATION: &[u8] = b"generation";

pub(crate) fn generation_op(generation: u64) -> StorageOp {
    StorageOp::Put {
        table: IDENTITY,
        key: GENERATION.to_vec(),
        value: Bytes::copy_from_slice(&generation.to_be_bytes()),
    }
}

/// The software backend: logs in memory, each change durable in the component's store, and its
/// generation in the anchor, before the call that made it returns.
pub struct Component {
    key: SecretKey,
    logs: Logs,
    /// `None` for a component that keeps nothing (the simulator's, tests').
    durable: Option<Durable>,
    stopped: Option<String>,
    attestations: u64,
}

/// Where a durable component keeps its state, and how far it has come.
struct Durable {
    store: Store,
    anchor: Box<dyn Anchor>,
    generation: u64,
}

impl Component {
    /// A component that keeps its state in memory only, with the key from `seed`: for the
    /// simulator, whose crashes model what a durable component keeps.
    pub fn in_memory(seed: &[u8; 32], limits: Limits) -> Component {
        Component {
            key: SecretKey::from_seed(seed),
            logs: Logs::new(limits),
            durable: None,
            stopped: None,
            attestations: 0,
        }
    }

    /// Makes a new identity (a fresh key, empty logs) in `dir`, which must hold no component yet,
    /// recorded by `anchor`, which must hold no other component's record.
    pub fn create(
        dir: &Path,
        mut anchor: Box<dyn Anchor>,
        limits: Limits,
    ) -> Result<Component, A2mError> {
        if dir.join(STATE_FILE).exists() {
            return Err(identity(
                dir,
                "it already holds a trusted log; a new identity needs an empty directory"
                    .to_string(),
            ));
        }
        let seed: [u8; 32] = rand::random();
        let key = SecretKey::from_seed(&seed);
        // An anchor that can keep keys (a TPM) seals the seed; the store keeps only the sealed
        // form, which no other TPM can open.
        let kept = match anchor.seal(&seed).map_err(|reason| identity(dir, reason))? {
            Some(sealed) => (SEALED, Bytes::from(sealed)),
            None => (SECRET, Bytes::copy_from_slice(&seed)),
        };
        let generation = anchor
            .claim(key.public_key())
            .map_err(|reason| identity(dir, reason))?;
        let made = open_store(dir).and_then(|store| {
            store
                .apply(&[
                    StorageOp::Put {
                        table: IDENTITY,
                        key: kept.0.to_vec(),
                        value: kept.1,
                    },
                    StorageOp::Put {
                        table: IDENTITY,
                        key: ANCHOR_KIND.to_vec(),
                        value: Bytes::from(anchor.kind().to_string()),
                    },
                    generation_op(generation),
                ])
                .map_err(|error| identity(dir, format!("storing the new key failed: {error}")))?;
            anchor
                .record(Mark {
                    key: key.public_key(),
                    generation,
                })
                .map_err(|reason| identity(dir, reason))?;
            Ok(store)
        });
        let store = match made {
            Ok(store) => store,
            Err(error) => {
                // Nothing was attested under the new key, so what the claim took can go back,
                // and a retry on a fixed directory finds the anchor free.
                if let Err(reason) = anchor.release() {
                    tracing::warn!(%reason, "the anchor of a trusted log that was never made stays claimed");
                }
                return Err(error);
            }
        };
        Ok(Component {
            key,
            logs: Logs::new(limits),
            durable: Some(Durable {
                store,
                anchor,
                generation,
            }),
            stopped: None,
            attestations: 0,
        })
    }

    /// Opens the identity in `dir`, with its logs as they were last made durable. Refuses a
    /// directory without one, any state it could not have written, and state older than what
    /// `anchor` recorded.
    pub fn open(
        dir: &Path,
        mut anchor: Box<dyn Anchor>,
        limits: Limits,
    ) -> Result<Component, A2mError> {
        if !dir.join(STATE_FILE).exists() {
            return Err(identity(
                dir,
                "it holds no trusted log (`bulwark a2m init` makes one)".to_string(),
            ));
        }
        let store = open_store(dir)?;
        let damaged = |what: &str, error: StorageError| lost(dir, format!("{what}: {error}"));
        let kind = made_with(dir, &store)?;
        if kind != anchor.kind() {
            return Err(identity(
                dir,
                format!(
                    "it was made with its generation anchored in {kind}, not in {}: open it with \
                     the anchor it was made with",
                    anchor.describe()
                ),
            ));
        }
        let seed = match store
            .get(IDENTITY, SECRET)
            .map_err(|error| damaged("reading the key failed", error))?
        {
            Some(seed) => seed
                .as_ref()
                .try_into()
                .map_err(|_| lost(dir, "its key is damaged".to_string()))?,
            None => {
                let sealed = store
                    .get(IDENTITY, SEALED)
                    .map_err(|error| damaged("reading the sealed key failed", error))?
                    .ok_or_else(|| lost(dir, "its key is missing".to_string()))?;
                anchor
                    .unseal(&sealed)
                    .map_err(|reason| identity(dir, reason))?
            }
        };
        let key = SecretKey::from_seed(&seed);
        let generation = store
            .get(IDENTITY, GENERATION)
            .map_err(|error| damaged("reading the generation failed", error))?
            .and_then(|bytes| bytes.as_ref().try_into().ok().map(u64::from_be_bytes))
            .ok_or_else(|| lost(dir, "its generation is missing".to_string()))?;
        let state = Mark {
            key: key.public_key(),
            generation,
        };
        let anchored = anchor.read().map_err(|reason| lost(dir, reason))?;
        judge(state, anchored)
            .map_err(|reason| lost(dir, format!("{reason} (anchor {})", anchor.describe())))?;
        if anchored.map(|mark| mark.generation) != Some(generation) {
            // The last change was committed but not yet anchored: nothing about it was attested.
            anchor
                .record(state)
                .map_err(|reason| identity(dir, reason))?;
        }
        let mut heads = Vec::new();
        store
            .scan(HEADS, |key, value| {
                let id = key
                    .try_into()
                    .map(LogId::from_be_bytes)
                    .map_err(|_| StorageError::other("a head's key is not a log id"))?;
                heads.push((id, decode::<Head>(value)?));
                Ok(())
            })
            .map_err(|error| damaged("its log heads are damaged", error))?;
        let mut entries = Vec::new();
        store
            .scan(ENTRIES, |key, value| {
                let (id, seq) = split_entry_key(key)
                    .ok_or_else(|| StorageError::other("an entry's key is not a log and slot"))?;
                entries.push((id, seq, decode::<Entry>(value)?));
                Ok(())
            })
            .map_err(|error| damaged("its log entries are damaged", error))?;
        let logs = Logs::restore(limits, heads, entries)
            .map_err(|reason| lost(dir, format!("its logs are inconsistent: {reason}")))?;
        Ok(Component {
            key,
            logs,
            durable: Some(Durable {
                store,
                anchor,
                generation,
            }),
            stopped: None,
            attestations: 0,
        })
    }

    /// The kind of anchor the trusted log in `dir` was made with, which [`Component::open`]
    /// must be given.
    pub fn anchor_kind(dir: &Path) -> Result<AnchorKind, A2mError> {
        if !dir.join(STATE_FILE).exists() {
            return Err(identity(
                dir,
                "it holds no trusted log (`bulwark a2m init` makes one)".to_string(),
            ));
        }
        made_with(dir, &open_store(dir)?)
    }

    /// Its generation: raised by one with every change made durable, from where its anchor
    /// started it (0 in a file, the counter's first value in a TPM).
    pub fn generation(&self) -> Option<u64> {
        self.durable.as_ref().map(|durable| durable.generation)
    }

    /// The logs, for status: each log's bounds.
    pub fn heads(&self) -> Vec<(LogId, Head)> {
        self.logs.heads().collect()
    }

    /// Where its generation is anchored, for status.
    pub fn anchor(&self) -> String {
        match &self.durable {
            Some(durable) => durable.anchor.describe(),
            None => "none (kept in memory only)".to_string(),
        }
    }

    /// Attestations signed since start.
    pub fn attestations(&self) -> u64 {
        self.attestations
    }

    /// Makes `plan` durable and anchored, then the state. A failed commit or anchor write stops
    /// the component: it cannot tell what reached the disk, so attesting either way could
    /// contradict it later.
    fn run(&mut self, plan: Plan) -> Result<(), A2mError> {
        self.running()?;
        if let Some(durable) = &mut self.durable {
            let generation = durable.generation + 1;
            let mut ops = Vec::with_capacity(3 + plan.forget.len());
            ops.push(generation_op(generation));
            ops.push(StorageOp::Put {
                table: HEADS,
                key: plan.log.to_be_bytes().to_vec(),
                value: Bytes::from(wire::encode(&plan.head)),
            });
            if let Some((seq, entry)) = plan.put {
                ops.push(StorageOp::Put {
                    table: ENTRIES,
                    key: entry_key(plan.log, seq),
                    value: Bytes::from(wire::encode(&entry)),
                });
            }
            for seq in &plan.forget {
                ops.push(StorageOp::Delete {
                    table: ENTRIES,
                    key: entry_key(plan.log, *seq),
                });
            }
            let mark = Mark {
                key: self.key.public_key(),
                generation,
            };
            let written = durable
                .store
                .apply(&ops)
                .map_err(|error| error.to_string())
                .and_then(|()| durable.anchor.record(mark));
            if let Err(error) = written {
                tracing::error!(%error, "the trusted log's store failed; it stops attesting");
                self.stopped = Some(error.clone());
                return Err(A2mError::Refused(Refusal::Stopped(error)));
            }
            durable.generation = generation;
        }
        self.logs.apply(&plan);
        Ok(())
    }

    fn running(&self) -> Result<(), A2mError> {
        match &self.stopped {
            Some(reason) => Err(A2mError::Refused(Refusal::Stopped(reason.clone()))),
            None => Ok(()),
        }
    }

    fn sign(&mut self, statement: Attestation) -> Result<Signed<Attestation>, A2mError> {
        self.running()?;
        self.attestations += 1;
        Signed::sign(&self.key, statement)
            .map_err(|error| A2mError::Refused(Refusal::Stopped(error.to_string())))
    }
}

impl A2m for Component {
    fn public_key(&self) -> PublicKey {
        self.key.public_key()
    }

    fn append(&mut self, log: LogId, value: Value) -> Result<Seq, A2mError> {
        let plan = self.logs.plan_append(log, value)?;
        let seq = plan.head.high;
        self.run(plan)?;
        Ok(seq)
    }

    fn advance(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<(), A2mError> {
        let plan = self.logs.plan_advance(log, seq, digest, value)?;
        self.run(plan)
    }

    fn lookup(
        &mut self,
        log: LogId,
        seq: Seq,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        let statement = self.logs.lookup(log, seq, nonce);
        self.sign(statement)
    }

    fn end(&mut self, log: LogId, nonce: Nonce) -> Result<Signed<Attestation>, A2mError> {
        let statement = self.logs.end(log, nonce);
        self.sign(statement)
    }

    fn truncate(&mut self, log: LogId, seq: Seq) -> Result<(), A2mError> {
        let plan = self.logs.plan_truncate(log, seq)?;
        self.run(plan)
    }
}

/// The store's file in a component's directory (the storage crate's name for it).
const STATE_FILE: &str = "state.redb";

fn open_store(dir: &Path) -> Result<Store, A2mError> {
    Store::open(dir).map_err(|error| match error {
        StorageError::InUse => identity(
            dir,
            "another process holds this trusted log open (a component already runs on it)"
                .to_string(),
        ),
        error => identity(dir, format!("its store cannot be opened: {error}")),
    })
}

/// The anchor kind the store recorded; a store from before kinds were recorded was anchored in a
/// file.
fn made_with(dir: &Path, store: &Store) -> Result<AnchorKind, A2mError> {
    let recorded = store
        .get(IDENTITY, ANCHOR_KIND)
        .map_err(|error| lost(dir, format!("reading the anchor's kind failed: {error}")))?;
    let Some(recorded) = recorded else {
        return Ok(AnchorKind::File);
    };
    std::str::from_utf8(&recorded)
        .map_err(|_| "not text".to_string())
        .and_then(str::parse)
        .map_err(|reason| lost(dir, format!("the anchor's kind is damaged: {reason}")))
}

fn identity(dir: &Path, reason: String) -> A2mError {
    A2mError::Identity {
        dir: dir.to_path_buf(),
        reason,
    }
}

/// The component's state cannot be trusted: say what must happen instead of a repair.
fn lost(dir: &Path, reason: String) -> A2mError {
    identity(
        dir,
        format!(
            "{reason}. A trusted log whose state is lost, damaged or rolled back must not come \
             back under its old identity: make a new one (`bulwark a2m init` on an empty \
             directory, a new key) and have the cluster learn it"
        ),
    )
}

pub(crate) fn entry_key(log: LogId, seq: Seq) -> Vec<u8> {
    let mut key = Vec::with_capacity(24);
    key.extend_from_slice(&log.to_be_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn split_entry_key(key: &[u8]) -> Option<(LogId, Seq)> {
    let log = LogId::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let seq = Seq::from_be_bytes(key.get(8..)?.try_into().ok()?);
    Some((log, seq))
}

/// A head or an entry is a few dozen bytes.
const RECORD_BYTES_MAX: usize = 128;

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StorageError> {
    wire::decode(bytes, RECORD_BYTES_MAX)
        .map_err(|error| StorageError::other(format!("undecodable: {error}")))
}
