//! The registers the gateway stores into: a Bulwark client, or a map in tests.

use crate::layout::{ChunkHeader, ChunkOrigin, ChunkRef};
use bulwark_client::{Client, ClientError, ContentId, OpReport, Serving};
use bytes::Bytes;
use std::future::Future;

/// Why a register operation failed, in the terms the S3 front end answers with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not enough nodes answered in time.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The Bulwark client this access key maps to may not write.
    #[error("not permitted: {0}")]
    Denied(String),
    /// Anything else (a refusal, a protocol failure, a bad key).
    #[error("storage error: {0}")]
    Internal(String),
}

impl From<ClientError> for StoreError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Unavailable { .. } => StoreError::Unavailable(error.to_string()),
            ClientError::NotWriter { .. } => StoreError::Denied(error.to_string()),
            _ => StoreError::Internal(error.to_string()),
        }
    }
}

/// One version of a key of a causal volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalValue {
    /// Its writer's name.
    pub writer: String,
    /// Its logical clock.
    pub clock: u64,
    /// The value; `None` for a delete.
    pub value: Option<Bytes>,
}

/// What a causal volume holds of one key: every version no other supersedes, newest first (the
/// highest clock, then the writer's name, then the update), and how many more there are whose
/// values could not be had.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CausalValues {
    /// The versions.
    pub versions: Vec<CausalValue>,
    /// Versions whose values no member gave.
    pub unavailable: usize,
}

impl From<bulwark_client::causal::CausalRead> for CausalValues {
    fn from(read: bulwark_client::causal::CausalRead) -> Self {
        CausalValues {
            versions: read
                .versions
                .into_iter()
                .map(|version| CausalValue {
                    writer: version.writer,
                    clock: version.clock,
                    value: version.value,
                })
                .collect(),
            unavailable: read.unavailable,
        }
    }
}

/// Where the gateway stores: linearizable registers, one value per key, replaced whole; and
/// causal volumes (Depot), where concurrent writes are all kept.
pub trait Registers: Send + Sync + 'static {
    /// Replaces `key`'s value.
    fn put(&self, key: &[u8], value: Bytes) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Reads `key`'s value; `None` when never written or deleted.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;
    /// Deletes `key`.
    fn delete(&self, key: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The key a chunk of object data is stored under, when it is in a register.
    fn chunk_key(&self, chunk: &ChunkRef) -> Vec<u8> {
        crate::layout::chunk_key(chunk)
    }
    /// Stores `data` as `chunk` of the object or part `origin` names and returns the reference
    /// to keep: naming the content-hash object that holds it, for stores that keep chunks so
    /// (the default keeps them in registers, under [`Registers::chunk_key`]).
    fn put_chunk(
        &self,
        chunk: ChunkRef,
        data: Bytes,
        origin: &ChunkOrigin,
    ) -> impl Future<Output = Result<ChunkRef, StoreError>> + Send {
        let _ = origin;
        async move {
            self.put(&self.chunk_key(&chunk), data).await?;
            Ok(chunk)
        }
    }
    /// The bytes stored as `chunk`, unchecked; `None` when they are gone.
    fn get_chunk(
        &self,
        chunk: &ChunkRef,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        let key = self.chunk_key(chunk);
        async move { self.get(&key).await }
    }
    /// Deletes `chunk`.
    fn delete_chunk(
        &self,
        chunk: &ChunkRef,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = self.chunk_key(chunk);
        async move { self.delete(&key).await }
    }
    /// The content-hash objects the cluster holds, in the cluster's order, after `after`: at
    /// most `limit`, and whether more follow. Stores that keep chunks in registers hold none.
    fn content_objects(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<[u8; 32]>, bool), StoreError>> + Send {
        let _ = (after, limit);
        async { Ok((Vec::new(), false)) }
    }
    /// What content-hash object `object` holds; `None` when it is gone or never was.
    fn content_object(
        &self,
        object: [u8; 32],
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        let _ = object;
        async { Ok(None) }
    }
    /// Deletes content-hash object `object`.
    fn delete_content_object(
        &self,
        object: [u8; 32],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = object;
        async { Ok(()) }
    }
    /// Creates causal volume `volume` on every node, or adopts it if it is one already.
    fn create_causal(&self, volume: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Writes `value` (`None`: deletes) under `key` of causal volume `volume`, superseding every
    /// version this client has seen.
    fn causal_put(
        &self,
        volume: &str,
        key: &[u8],
        value: Option<Bytes>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Reads every current version of `key` of causal volume `volume`.
    fn causal_get(
        &self,
        volume: &str,
        key: &[u8],
    ) -> impl Future<Output = Result<CausalValues, StoreError>> + Send;
    /// The keys of causal volume `volume` that start with `prefix`, come after `after` and are
    /// not only deleted, in key order, at most `limit`: each with what this client holds of it
    /// (values it lacks counted as unavailable; [`Registers::causal_get`] fetches them).
    fn causal_list(
        &self,
        volume: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, CausalValues)>, StoreError>> + Send;
}

/// The operation succeeded; what it proved about lying nodes goes to the log, so an operator
/// sees a misbehaving node even though every S3 request was answered correctly.
fn log_evidence(key: &[u8], report: &OpReport) {
    for evidence in &report.evidence {
        tracing::warn!(
            node = evidence.node.0,
            kind = ?evidence.kind,
            key = %String::from_utf8_lossy(key),
            "node misbehaviour proven"
        );
    }
}

/// What a chunk's content-hash object holds ([`crate::layout::encode_chunk_object`]), written
/// now.
fn chunk_object(
    chunk: &ChunkRef,
    data: &[u8],
    origin: &ChunkOrigin,
) -> Result<Vec<u8>, StoreError> {
    let header = ChunkHeader {
        written_ms: crate::engine::now_ms(),
        origin: origin.clone(),
    };
    crate::layout::encode_chunk_object(&header, &chunk.write, data)
        .ok_or_else(|| StoreError::Internal("a chunk's header does not encode".into()))
}

/// The chunk's bytes of what its object holds, if the object is the chunk's write's.
fn chunk_of(chunk: &ChunkRef, object: Bytes) -> Option<Bytes> {
    let (_, write, data) = crate::layout::decode_chunk_object(&object)?;
    (write == chunk.write).then_some(data)
}

impl Registers for Client {
    async fn put_chunk(
        &self,
        chunk: ChunkRef,
        data: Bytes,
        origin: &ChunkOrigin,
    ) -> Result<ChunkRef, StoreError> {
        let (id, report) = self
            .put_content(&chunk_object(&chunk, &data, origin)?)
            .await?;
        log_evidence(id.to_hex().as_bytes(), &report);
        Ok(ChunkRef {
            object: Some(id.0.0),
            ..chunk
        })
    }

    async fn get_chunk(&self, chunk: &ChunkRef) -> Result<Option<Bytes>, StoreError> {
        let Some(object) = chunk.object else {
            return Registers::get(self, &self.chunk_key(chunk)).await;
        };
        let id = ContentId(bulwark_core::Digest(object));
        let (value, report) = self.get_content(&id).await?;
        log_evidence(id.to_hex().as_bytes(), &report);
        Ok(value.and_then(|value| chunk_of(chunk, value)))
    }

    async fn delete_chunk(&self, chunk: &ChunkRef) -> Result<(), StoreError> {
        let Some(object) = chunk.object else {
            return Registers::delete(self, &self.chunk_key(chunk)).await;
        };
        let id = ContentId(bulwark_core::Digest(object));
        let report = self.delete_content(&id).await?;
        log_evidence(id.to_hex().as_bytes(), &report);
        Ok(())
    }

    async fn content_objects(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<(Vec<[u8; 32]>, bool), StoreError> {
        let after = after.map(|id| ContentId(bulwark_core::Digest(id)));
        let (ids, more) = self.list_content(after.as_ref(), limit).await?;
        Ok((ids.into_iter().map(|id| id.0.0).collect(), more))
    }

    async fn content_object(&self, object: [u8; 32]) -> Result<Option<Bytes>, StoreError> {
        let id = ContentId(bulwark_core::Digest(object));
        let (value, report) = self.get_content(&id).await?;
        log_evidence(id.to_hex().as_bytes(), &report);
        Ok(value)
    }

    async fn delete_content_object(&self, object: [u8; 32]) -> Result<(), StoreError> {
        let id = ContentId(bulwark_core::Digest(object));
        let report = self.delete_content(&id).await?;
        log_evidence(id.to_hex().as_bytes(), &report);
        Ok(())
    }

    async fn put(&self, key: &[u8], value: Bytes) -> Result<(), StoreError> {
        let report = Client::put(self, key, value).await?;
        log_evidence(key, &report);
        Ok(())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let (value, report) = Client::get(self, key).await?;
        log_evidence(key, &report);
        Ok(value)
    }

    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        let report = Client::delete(self, key).await?;
        log_evidence(key, &report);
        Ok(())
    }

    async fn create_causal(&self, volume: &str) -> Result<(), StoreError> {
        let (_, report) = self.create_causal_volume(volume, &[]).await?;
        log_evidence(volume.as_bytes(), &report);
        Ok(())
    }

    async fn causal_put(
        &self,
        volume: &str,
        key: &[u8],
        value: Option<Bytes>,
    ) -> Result<(), StoreError> {
        let number = causal_number(self, volume).await?;
        let written = self.causal_write(volume, number, key, value).await?;
        if written.acknowledged_by.is_none() {
            // Durable in this gateway's own log, a member of the volume: it reaches the servers
            // with the gateway's next exchange (Depot's writes stay available without servers).
            tracing::warn!(
                volume,
                key = %String::from_utf8_lossy(key),
                "no server acknowledged a causal write; it is in the gateway's own log"
            );
        }
        Ok(())
    }

    async fn causal_get(&self, volume: &str, key: &[u8]) -> Result<CausalValues, StoreError> {
        let number = causal_number(self, volume).await?;
        let read = self.causal_read(volume, number, key).await?;
        log_causal_warnings(volume, key, &read);
        Ok(read.into())
    }

    async fn causal_list(
        &self,
        volume: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, CausalValues)>, StoreError> {
        let number = causal_number(self, volume).await?;
        let (keys, _) = Client::causal_list(self, volume, number, prefix, after, limit).await?;
        Ok(keys
            .into_iter()
            .map(|(key, held)| (key.as_bytes().to_vec(), held.into()))
            .collect())
    }
}

/// The number of causal volume `volume`, or why it is not one.
async fn causal_number(
    client: &Client,
    volume: &str,
) -> Result<bulwark_client::causal::VolumeId, StoreError> {
    match client.volume(volume).await?.serving {
        Serving::Causal { volume } => Ok(volume),
        other => Err(StoreError::Internal(format!(
            "volume {volume:?} is {other}, not causal"
        ))),
    }
}

/// What a causal read says beyond its versions goes to the log: forks proven, servers that
/// relayed what did not check, clients that may hold writes not seen.
fn log_causal_warnings(volume: &str, key: &[u8], read: &bulwark_client::causal::CausalRead) {
    let key = String::from_utf8_lossy(key);
    for writer in &read.forked {
        tracing::warn!(volume, %key, writer, "writer proven to have forked");
    }
    for (node, count) in &read.refused_from {
        tracing::warn!(volume, %key, node = node.0, count, "server relayed updates that do not check");
    }
    if !read.suspects.is_empty() {
        tracing::info!(volume, %key, suspects = ?read.suspects, "writers not heard from within the staleness bound");
    }
}

/// Registers and causal volumes in memory, for tests and fuzzing: writes can be made to fail,
/// and concurrent causal versions added by hand.
#[derive(Default)]
pub struct MemRegisters {
    /// Every register.
    pub map: std::sync::Mutex<std::collections::BTreeMap<Vec<u8>, Bytes>>,
    /// Writes to keys starting with this fail as a cluster without quorum would.
    pub fail_puts: std::sync::Mutex<Option<Vec<u8>>>,
    /// Every key of every causal volume, by (volume, key): a test adds concurrent versions here.
    pub causal: std::sync::Mutex<std::collections::BTreeMap<(String, Vec<u8>), CausalValues>>,
    /// The causal volumes created.
    pub causal_volumes: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Whether chunks are kept as content-hash objects (in `objects`), as a cluster keeps them,
    /// rather than in registers.
    pub content_chunks: bool,
    /// Content-hash objects, by id (here the BLAKE3 of what they hold).
    pub objects: std::sync::Mutex<std::collections::BTreeMap<[u8; 32], Bytes>>,
}

impl MemRegisters {
    /// A store that keeps chunks as content-hash objects.
    pub fn with_content_chunks() -> MemRegisters {
        MemRegisters {
            content_chunks: true,
            ..MemRegisters::default()
        }
    }
}

impl Registers for MemRegisters {
    async fn put_chunk(
        &self,
        chunk: ChunkRef,
        data: Bytes,
        origin: &ChunkOrigin,
    ) -> Result<ChunkRef, StoreError> {
        if !self.content_chunks {
            self.put(&self.chunk_key(&chunk), data).await?;
            return Ok(chunk);
        }
        let object = Bytes::from(chunk_object(&chunk, &data, origin)?);
        let id = *blake3::hash(&object).as_bytes();
        self.objects.lock().unwrap().insert(id, object);
        Ok(ChunkRef {
            object: Some(id),
            ..chunk
        })
    }

    async fn get_chunk(&self, chunk: &ChunkRef) -> Result<Option<Bytes>, StoreError> {
        match chunk.object {
            Some(id) => {
                let object = self.objects.lock().unwrap().get(&id).cloned();
                Ok(object.and_then(|object| chunk_of(chunk, object)))
            }
            None => self.get(&self.chunk_key(chunk)).await,
        }
    }

    async fn delete_chunk(&self, chunk: &ChunkRef) -> Result<(), StoreError> {
        match chunk.object {
            Some(id) => {
                self.objects.lock().unwrap().remove(&id);
                Ok(())
            }
            None => self.delete(&self.chunk_key(chunk)).await,
        }
    }

    async fn content_objects(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<(Vec<[u8; 32]>, bool), StoreError> {
        let objects = self.objects.lock().unwrap();
        let mut ids: Vec<[u8; 32]> = objects
            .keys()
            .filter(|id| after.is_none_or(|after| **id > after))
            .take(limit.saturating_add(1))
            .copied()
            .collect();
        let more = ids.len() > limit;
        ids.truncate(limit);
        Ok((ids, more))
    }

    async fn content_object(&self, object: [u8; 32]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.objects.lock().unwrap().get(&object).cloned())
    }

    async fn delete_content_object(&self, object: [u8; 32]) -> Result<(), StoreError> {
        self.objects.lock().unwrap().remove(&object);
        Ok(())
    }

    async fn put(&self, key: &[u8], value: Bytes) -> Result<(), StoreError> {
        if let Some(prefix) = self.fail_puts.lock().unwrap().as_deref()
            && key.starts_with(prefix)
        {
            return Err(StoreError::Unavailable("no quorum (test)".into()));
        }
        self.map.lock().unwrap().insert(key.to_vec(), value);
        Ok(())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.map.lock().unwrap().get(key).cloned())
    }

    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.map.lock().unwrap().remove(key);
        Ok(())
    }

    async fn create_causal(&self, volume: &str) -> Result<(), StoreError> {
        self.causal_volumes
            .lock()
            .unwrap()
            .insert(volume.to_owned());
        Ok(())
    }

    async fn causal_put(
        &self,
        volume: &str,
        key: &[u8],
        value: Option<Bytes>,
    ) -> Result<(), StoreError> {
        if !self.causal_volumes.lock().unwrap().contains(volume) {
            return Err(StoreError::Internal(format!("no causal volume {volume:?}")));
        }
        let mut causal = self.causal.lock().unwrap();
        let values = causal.entry((volume.to_owned(), key.to_vec())).or_default();
        let clock = values.versions.iter().map(|v| v.clock).max().unwrap_or(0) + 1;
        *values = CausalValues {
            versions: vec![CausalValue {
                writer: "test".into(),
                clock,
                value,
            }],
            unavailable: 0,
        };
        Ok(())
    }

    async fn causal_get(&self, volume: &str, key: &[u8]) -> Result<CausalValues, StoreError> {
        let causal = self.causal.lock().unwrap();
        Ok(causal
            .get(&(volume.to_owned(), key.to_vec()))
            .cloned()
            .unwrap_or_default())
    }

    async fn causal_list(
        &self,
        volume: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, CausalValues)>, StoreError> {
        let causal = self.causal.lock().unwrap();
        Ok(causal
            .iter()
            .filter(|((of, key), _)| {
                of == volume && key.starts_with(prefix) && after.is_none_or(|after| **key > *after)
            })
            .filter(|(_, values)| {
                values.unavailable > 0 || values.versions.iter().any(|v| v.value.is_some())
            })
            .take(limit)
            .map(|((_, key), values)| (key.clone(), values.clone()))
            .collect())
    }
}
