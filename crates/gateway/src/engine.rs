//! The object store the S3 operations run on: buckets, streamed objects, multipart uploads and
//! the listing index, over any [`Registers`].
//!
//! Ordering rules that make the layout safe (see [`crate::layout`] for the registers):
//!
//! - A PUT writes all of its chunks, then the manifest, then the index entry; only then does it
//!   answer. So a reader that finds the manifest finds every chunk it names, and a listing made
//!   after the answer shows the object.
//! - Within this gateway, mutations of one object are serialised by a striped lock taken around
//!   read-old-manifest / write-manifest / update-index, so the index records the outcome of the
//!   last manifest write. The body is streamed before that lock is taken, so slow uploads of the
//!   same key do not wait for each other.
//! - Chunks of a replaced or deleted version are deleted after a grace period, so that a GET
//!   that read the old manifest just before the switch can still stream it.
//! - Lock order is upload → bucket → object → index shard; nothing takes them in another order.

mod versions;

pub use versions::{
    Deleted, VersionPage, check_version_id, current_marker_error, versioning_status,
};

use crate::causal::CausalObjects;
use crate::index::{self, Page, Query};
use crate::layout::{
    self, BucketList, BucketRecord, CHUNK_BYTES, Checksums, ChunkOrigin, ChunkRef, Data, Headers,
    INDEX_SHARDS, INLINE_BYTES_MAX, IndexEntry, IndexShard, LayoutError, Manifest, ObjectExtra,
    PartChecksum, PartRecord, StoredPart, Tags, UploadList, UploadRecord, WriteId,
};
use crate::seal::{CustomerKey, GatewayKeys, Seal};
use crate::store::{Registers, StoreError};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, stream};
use md5::Digest;
use s3s::checksum::ChecksumHasher;
use s3s::dto::Checksum;
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};
use std::collections::BTreeMap;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, OwnedSemaphorePermit, RwLock, Semaphore, mpsc};
use tokio::task::JoinSet;

/// What the gateway accepts and how much it keeps in memory.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest single PUT or copy (S3: 5 GiB).
    pub object_bytes_max: u64,
    /// Largest uploaded part (S3: 5 GiB).
    pub part_bytes_max: u64,
    /// Smallest part other than the last (S3: 5 MiB).
    pub part_bytes_min: u64,
    /// Chunk writes one request keeps in flight.
    pub chunk_writes_per_request: usize,
    /// Chunks one GET fetches ahead of what its connection has taken.
    pub chunk_reads_per_request: usize,
    /// Chunk buffers (each up to [`CHUNK_BYTES`]) all writing requests together may hold: the
    /// bound on the gateway's memory for incoming data. A request waits for a buffer, and stops reading its body
    /// meanwhile, so a fast sender is slowed to the cluster's pace.
    pub chunk_buffers: usize,
    /// Chunks all GETs together may have fetched and not yet handed to their connections: the
    /// bound on the gateway's memory for outgoing data. Separate from `chunk_buffers` so slow
    /// readers cannot stall writes.
    pub read_buffers: usize,
    /// How long the chunks of a replaced or deleted version stay readable.
    pub chunk_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            object_bytes_max: 5 << 30,
            part_bytes_max: 5 << 30,
            part_bytes_min: 5 << 20,
            chunk_writes_per_request: 4,
            chunk_reads_per_request: 4,
            chunk_buffers: 32,
            read_buffers: 64,
            chunk_grace: Duration::from_secs(60),
        }
    }
}

/// S3's largest part number.
pub const PART_NUMBER_MAX: u32 = 10_000;

/// A set of locks selected by hash, so the lock table stays fixed-size whatever the key space.
struct Stripes<T>(Vec<T>);

impl<T: Default> Stripes<T> {
    fn new(n: usize) -> Self {
        Stripes((0..n).map(|_| T::default()).collect())
    }

    fn get(&self, parts: &[&[u8]]) -> &T {
        let mut hasher = blake3::Hasher::new();
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        let hash = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash.as_bytes()[..8]);
        &self.0[(u64::from_le_bytes(first) % self.0.len() as u64) as usize]
    }
}

/// The object store.
pub struct Engine {
    limits: Limits,
    buffers: Arc<Semaphore>,
    read_buffers: Arc<Semaphore>,
    bucket_list: Mutex<()>,
    buckets: Stripes<RwLock<()>>,
    objects: Stripes<Mutex<()>>,
    shards: Stripes<Mutex<()>>,
    uploads: Stripes<Mutex<()>>,
    upload_lists: Stripes<Mutex<()>>,
    /// The SSE-S3 keys.
    keys: GatewayKeys,
}

/// The bytes of a body write, once durable.
#[derive(Debug)]
pub struct Written {
    /// Size in bytes.
    pub size: u64,
    /// MD5 of the bytes.
    pub md5: [u8; 16],
    /// What the ETag is made of: `md5`, or for a sealed body [`sealed_digest`] of its data.
    pub etag_md5: [u8; 16],
    /// The `x-amz-checksum-*` values computed, base64, for the algorithms asked for.
    pub checksum: Checksum,
    /// Where they are.
    pub data: Data,
}

/// What a request says its body must hash to (`Content-MD5`, `x-amz-checksum-*`), checked
/// before anything refers to the body: a mismatch stores nothing.
#[derive(Debug, Default)]
pub struct Integrity {
    /// `Content-MD5`.
    pub md5: Option<[u8; 16]>,
    /// The checksum algorithms to compute: those a value was given for, in a header or a
    /// trailer, and the one the SDK named.
    pub algorithms: Algorithms,
    /// Values given in headers, base64.
    pub given: Checksum,
    /// The body's trailer, whose `x-amz-checksum-*` values are known only once it has been read.
    pub trailer: Option<s3s::TrailingHeaders>,
    /// The checksum headers `x-amz-trailer` announced: each must arrive in the trailer.
    pub announced: Vec<String>,
}

/// Which checksums to compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Algorithms {
    /// CRC-32.
    pub crc32: bool,
    /// CRC-32C.
    pub crc32c: bool,
    /// CRC-64/NVME.
    pub crc64nvme: bool,
    /// SHA-1.
    pub sha1: bool,
    /// SHA-256.
    pub sha256: bool,
}

impl Algorithms {
    /// These and `checksum`.
    pub fn add(&mut self, checksum: PartChecksum) {
        match checksum {
            PartChecksum::Crc32 => self.crc32 = true,
            PartChecksum::Crc32c => self.crc32c = true,
            PartChecksum::Sha1 => self.sha1 = true,
            PartChecksum::Sha256 => self.sha256 = true,
        }
    }

    fn hasher(self) -> ChecksumHasher {
        use s3s::crypto::Checksum as _;
        ChecksumHasher {
            crc32: self.crc32.then(s3s::crypto::Crc32::new),
            crc32c: self.crc32c.then(s3s::crypto::Crc32c::new),
            crc64nvme: self.crc64nvme.then(s3s::crypto::Crc64Nvme::new),
            sha1: self.sha1.then(s3s::crypto::Sha1::new),
            sha256: self.sha256.then(s3s::crypto::Sha256::new),
        }
    }
}

impl Integrity {
    /// Refuses `written` if it does not hash to what was given, naming what differed.
    fn check(&self, written: &Written) -> S3Result<()> {
        if let Some(expected) = self.md5
            && expected != written.md5
        {
            return Err(s3_error!(BadDigest, "Content-MD5 does not match the body"));
        }
        let trailer = |name: &str| {
            self.trailer.as_ref().and_then(|trailer| {
                trailer
                    .read(|headers| {
                        headers
                            .get(name)
                            .and_then(|value| value.to_str().ok())
                            .map(str::to_owned)
                    })
                    .flatten()
            })
        };
        let pairs = [
            (
                "CRC32",
                "x-amz-checksum-crc32",
                &self.given.checksum_crc32,
                &written.checksum.checksum_crc32,
            ),
            (
                "CRC32C",
                "x-amz-checksum-crc32c",
                &self.given.checksum_crc32c,
                &written.checksum.checksum_crc32c,
            ),
            (
                "CRC64NVME",
                "x-amz-checksum-crc64nvme",
                &self.given.checksum_crc64nvme,
                &written.checksum.checksum_crc64nvme,
            ),
            (
                "SHA1",
                "x-amz-checksum-sha1",
                &self.given.checksum_sha1,
                &written.checksum.checksum_sha1,
            ),
            (
                "SHA256",
                "x-amz-checksum-sha256",
                &self.given.checksum_sha256,
                &written.checksum.checksum_sha256,
            ),
        ];
        for (algorithm, header, given, computed) in pairs {
            let trailed = trailer(header);
            let announced = self.announced.iter().any(|name| name == header);
            match (&trailed, announced, given) {
                (None, true, _) => {
                    return Err(s3_error!(
                        InvalidRequest,
                        "x-amz-trailer announced {header}, but the body carried no such trailer"
                    ));
                }
                (Some(_), false, _) => {
                    return Err(s3_error!(
                        InvalidRequest,
                        "the body's trailer carried {header}, which x-amz-trailer did not announce"
                    ));
                }
                (Some(_), true, Some(_)) => {
                    return Err(s3_error!(
                        InvalidRequest,
                        "Expecting a single x-amz-checksum- header: {header} came both as a \
                         header and in the trailer"
                    ));
                }
                _ => {}
            }
            let Some(expected) = given.clone().or(trailed) else {
                continue;
            };
            if computed.as_deref() != Some(expected.as_str()) {
                return Err(s3_error!(
                    BadDigest,
                    "The {algorithm} you specified did not match the calculated checksum."
                ));
            }
        }
        Ok(())
    }
}

/// What a new object carries besides its bytes.
#[derive(Clone, Debug, Default)]
pub struct ObjectMeta {
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// User metadata, sorted by name.
    pub metadata: Vec<(String, String)>,
    /// The response headers to store with the object.
    pub headers: Headers,
    /// Its tags, checked ([`check_tags`]).
    pub tags: Tags,
}

/// The checksums an upload computed, as an object keeps them.
fn stored_checksums(checksum: &Checksum) -> Checksums {
    Checksums {
        crc32: checksum.checksum_crc32.clone(),
        crc32c: checksum.checksum_crc32c.clone(),
        crc64nvme: checksum.checksum_crc64nvme.clone(),
        sha1: checksum.checksum_sha1.clone(),
        sha256: checksum.checksum_sha256.clone(),
    }
}

/// What a new object keeps of `checksums`: in the clear when it is not sealed, else sealed in
/// its record.
fn sealed_checksums(
    seal: Option<&Seal>,
    checksums: Checksums,
) -> (Checksums, Option<layout::Sealed>) {
    match seal {
        Some(seal) => (Checksums::default(), Some(seal.record(&checksums))),
        None => (checksums, None),
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A register failure as the S3 error a client can act on, naming the cause.
pub fn store_error(error: StoreError) -> S3Error {
    tracing::warn!(%error, "cluster operation failed");
    match error {
        StoreError::Unavailable(cause) => {
            S3Error::with_message(S3ErrorCode::ServiceUnavailable, cause)
        }
        StoreError::Denied(cause) => S3Error::with_message(S3ErrorCode::AccessDenied, cause),
        StoreError::Internal(cause) => S3Error::with_message(S3ErrorCode::InternalError, cause),
    }
}

fn layout_error(error: LayoutError) -> S3Error {
    match error {
        LayoutError::TooLarge { .. } => {
            S3Error::with_message(S3ErrorCode::EntityTooLarge, error.to_string())
        }
        _ => {
            tracing::warn!(%error, "stored data rejected");
            S3Error::with_message(S3ErrorCode::InternalError, error.to_string())
        }
    }
}

async fn get_record<R: Registers, T: for<'de> serde::Deserialize<'de>>(
    reg: &R,
    what: &'static str,
    key: &[u8],
) -> S3Result<Option<T>> {
    match reg.get(key).await.map_err(store_error)? {
        None => Ok(None),
        Some(bytes) => layout::decode(what, &bytes).map(Some).map_err(layout_error),
    }
}

async fn put_record<R: Registers, T: serde::Serialize>(
    reg: &R,
    what: &'static str,
    key: &[u8],
    value: &T,
) -> S3Result<()> {
    let bytes = layout::encode(what, value).map_err(layout_error)?;
    reg.put(key, bytes).await.map_err(store_error)
}

/// S3's answer to a copy whose source names a delete marker by id.
fn copy_source_error(error: S3Error) -> S3Error {
    if *error.code() == S3ErrorCode::MethodNotAllowed {
        return s3_error!(
            InvalidRequest,
            "The source of a copy request may not specifically refer to a delete marker by version id."
        );
    }
    error
}

/// Validates an object key against S3's rules and this layout's bounds.
pub fn check_object_key(key: &str) -> S3Result<()> {
    if key.is_empty() {
        return Err(s3_error!(InvalidArgument, "empty object key"));
    }
    if key.len() > layout::OBJECT_KEY_BYTES_MAX {
        return Err(s3_error!(
            KeyTooLongError,
            "object key is {} bytes; the limit is {}",
            key.len(),
            layout::OBJECT_KEY_BYTES_MAX
        ));
    }
    Ok(())
}

/// Validates user metadata against S3's size limit, and sorts it.
pub fn check_metadata(metadata: Vec<(String, String)>) -> S3Result<Vec<(String, String)>> {
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > layout::METADATA_BYTES_MAX {
        return Err(s3_error!(
            MetadataTooLarge,
            "user metadata is {size} bytes; the limit is {}",
            layout::METADATA_BYTES_MAX
        ));
    }
    let mut metadata = metadata;
    metadata.sort();
    Ok(metadata)
}

/// A part a CompleteMultipartUpload lists: its number, and the ETag and checksums it gives.
#[derive(Clone, Debug, Default)]
pub struct ListedPart {
    /// The part number.
    pub number: i32,
    /// The ETag as the client saw it.
    pub etag: Option<String>,
    /// The checksums given for it.
    pub checksums: Checksums,
}

/// Checks what a completion says of part `number`'s checksums against what it was stored
/// with: each given value must be the stored one, and an upload created with an algorithm must
/// be given that algorithm's value for every part, as S3 requires.
fn check_part_checksums(
    number: i32,
    given: &Checksums,
    stored: Option<&Checksums>,
    algorithm: Option<PartChecksum>,
) -> S3Result<()> {
    use PartChecksum::*;
    for each in [Crc32, Crc32c, Sha1, Sha256] {
        let (given, stored) = (given.get(each), stored.and_then(|s| s.get(each)));
        match (given, stored) {
            (Some(given), Some(stored)) if given != stored => {
                return Err(s3_error!(
                    InvalidPart,
                    "part {number}: its {} checksum does not match the part uploaded",
                    each.name()
                ));
            }
            (Some(_), None) => {
                return Err(s3_error!(
                    InvalidPart,
                    "part {number} was not uploaded with a {} checksum",
                    each.name()
                ));
            }
            (None, _) if algorithm == Some(each) => {
                return Err(s3_error!(
                    InvalidRequest,
                    "The upload was created using a {} checksum. The complete request must include the checksum for each part. It was missing for part {number} in the request.",
                    each.name()
                ));
            }
            _ => {}
        }
    }
    if given.crc64nvme.is_some() {
        return Err(s3_error!(
            InvalidPart,
            "part {number}: CRC64NVME part checksums are not kept"
        ));
    }
    Ok(())
}

/// S3's composite checksum of a multipart object: `algorithm` over the parts' binary checksums
/// in order, base64, `-` and the part count; checked against the one the completion gave, if
/// it gave one. No algorithm: no checksum, and a whole-object value given cannot be checked.
fn composite_checksum(
    algorithm: Option<PartChecksum>,
    parts: &[Option<&Checksums>],
    whole: &Checksums,
) -> S3Result<Checksums> {
    let Some(algorithm) = algorithm else {
        if *whole != Checksums::default() {
            return Err(s3_error!(
                InvalidRequest,
                "a whole-object checksum was given for an upload created without a checksum algorithm"
            ));
        }
        return Ok(Checksums::default());
    };
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut algorithms = Algorithms::default();
    algorithms.add(algorithm);
    let mut hasher = algorithms.hasher();
    for part in parts {
        let value = part
            .and_then(|p| p.get(algorithm))
            .and_then(|v| b64.decode(v).ok())
            .ok_or_else(|| s3_error!(InternalError, "a part's stored checksum is missing"))?;
        hasher.update(&value);
    }
    let checksum = stored_checksums(&hasher.finalize());
    let value = format!(
        "{}-{}",
        checksum.get(algorithm).cloned().unwrap_or_default(),
        parts.len()
    );
    let mut out = Checksums::default();
    if let Some(given) = whole.get(algorithm)
        && *given != value
    {
        return Err(s3_error!(
            BadDigest,
            "The {} you specified did not match the calculated checksum.",
            algorithm.name()
        ));
    }
    if *whole != Checksums::default() && whole.get(algorithm).is_none() {
        return Err(s3_error!(
            InvalidRequest,
            "the upload was created with {}; a whole-object checksum of another algorithm cannot be checked",
            algorithm.name()
        ));
    }
    out.set(algorithm, value);
    Ok(out)
}

/// Tags an object may have.
pub const OBJECT_TAGS_MAX: usize = 10;
/// Tags a bucket may have.
pub const BUCKET_TAGS_MAX: usize = 50;

/// Whether S3 allows `c` in a tag: letters, numbers, spaces and `+ - = . _ : / @`.
fn tag_char(c: char) -> bool {
    c.is_alphanumeric() || c.is_whitespace() || "+-=._:/@".contains(c)
}

/// Checks tags against S3's limits: at most `max`, keys of 1 to 128 characters and unique,
/// values of at most 256, each of the characters S3 allows.
pub fn check_tags(tags: Tags, max: usize) -> S3Result<Tags> {
    if tags.len() > max {
        return Err(s3_error!(
            InvalidTag,
            "{} tags; at most {max} are allowed",
            tags.len()
        ));
    }
    let mut keys = std::collections::HashSet::new();
    for (key, value) in &tags {
        if key.is_empty() || key.chars().count() > 128 {
            return Err(s3_error!(
                InvalidTag,
                "The TagKey you have provided is invalid: 1 to 128 characters"
            ));
        }
        if value.chars().count() > 256 {
            return Err(s3_error!(
                InvalidTag,
                "The TagValue you have provided is invalid: at most 256 characters"
            ));
        }
        if !key.chars().chain(value.chars()).all(tag_char) {
            return Err(s3_error!(
                InvalidTag,
                "A tag may hold letters, numbers, spaces and + - = . _ : / @ only"
            ));
        }
        if !keys.insert(key) {
            return Err(s3_error!(
                InvalidTag,
                "Cannot provide multiple Tags with the same key"
            ));
        }
    }
    Ok(tags)
}

/// The outcome of one chunk write task: the chunk's place in its body and its reference as
/// stored.
fn stored_chunk(
    done: Result<S3Result<(usize, ChunkRef)>, tokio::task::JoinError>,
) -> S3Result<(usize, ChunkRef)> {
    done.unwrap_or_else(|e| Err(s3_error!(InternalError, "chunk write task: {e}")))
}

/// Deletes chunks in the background, after `delay`. Best effort: a crash or a failure leaves
/// them unreferenced in the cluster (logged), never a manifest pointing at a missing chunk.
/// A chunk whose write did not come back has no object named yet: the register it would
/// otherwise be in is deleted, which is nothing.
fn forget_chunks<R: Registers>(reg: &Arc<R>, mut chunks: Vec<ChunkRef>, delay: Duration) {
    chunks.sort_by_key(|chunk| (chunk.object, chunk.write, chunk.hash));
    chunks.dedup_by_key(|chunk| (chunk.object, chunk.write, chunk.hash));
    if chunks.is_empty() {
        return;
    }
    let reg = reg.clone();
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let reg = &reg;
        stream::iter(chunks)
            .for_each_concurrent(4, |chunk| async move {
                if let Err(error) = reg.delete_chunk(&chunk).await {
                    tracing::warn!(write = %hex::encode(chunk.write), hash = %hex::encode(chunk.hash), %error, "chunk not deleted; it stays unreferenced");
                }
            })
            .await;
    });
}

/// Deletes the part registers of an upload that is gone (completed or aborted), in the
/// background. Best effort, as for chunks: one left behind names only chunks already handled.
fn forget_parts<R: Registers>(
    reg: &Arc<R>,
    upload_id: &str,
    record: &UploadRecord,
    parts: &BTreeMap<u32, StoredPart>,
) {
    let keys: Vec<Vec<u8>> = parts
        .keys()
        .filter(|n| record.more.uploaded.contains(**n))
        .map(|n| layout::part_key(upload_id, *n))
        .collect();
    if keys.is_empty() {
        return;
    }
    let reg = reg.clone();
    tokio::spawn(async move {
        let reg = &reg;
        stream::iter(keys)
            .for_each_concurrent(4, |key| async move {
                if let Err(error) = reg.delete(&key).await {
                    tracing::warn!(key = %String::from_utf8_lossy(&key), %error, "part record not deleted");
                }
            })
            .await;
    });
}

/// Where a causal bucket's object is, and the versions beside the one returned.
type CausalFound<R> = (Arc<CausalObjects<R>>, Vec<crate::causal::Other>);

/// An object GET or HEAD answers with.
pub struct Object<R> {
    /// Its manifest; an encrypted object's checksums opened into `extra`.
    pub manifest: Manifest,
    /// The key that opens it, when it is encrypted.
    pub seal: Option<Seal>,
    /// In a causal bucket: where its chunks are, and the versions beside the one returned.
    pub causal: Option<CausalFound<R>>,
}

/// A fetched piece of an object and the read buffer it occupies until handed to the client.
type Piece = S3Result<(Bytes, Option<OwnedSemaphorePermit>)>;

/// Object bytes streamed out of the cluster: chunks fetched ahead while the client reads, each
/// holding a read buffer until it is handed to the connection.
pub struct ObjectStream {
    first: Option<Bytes>,
    rx: mpsc::Receiver<Piece>,
}

impl Stream for ObjectStream {
    type Item = Result<Bytes, S3Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        self.rx
            .poll_recv(cx)
            .map(|piece| piece.map(|piece| piece.map(|(bytes, _permit)| bytes)))
    }
}

/// The MD5 an encrypted body's ETag is made of: over the hashes of its sealed chunks, or its
/// sealed inline bytes. It says nothing of the plaintext, as the nodes that store it may see it.
pub fn sealed_digest(data: &Data) -> [u8; 16] {
    let mut md5 = md5::Md5::new();
    match data {
        Data::Inline(stored) => md5.update(stored),
        Data::Chunks(chunks) => chunks.iter().for_each(|chunk| md5.update(chunk.hash)),
    }
    md5.finalize().into()
}

/// A chunk fetched, checked against its reference and, when `seal` is given, opened.
async fn fetch_chunk<R: Registers>(
    reg: &R,
    chunk: &ChunkRef,
    seal: Option<&Seal>,
) -> S3Result<Bytes> {
    let data = reg
        .get_chunk(chunk)
        .await
        .map_err(store_error)?
        .ok_or_else(|| {
            s3_error!(
                InternalError,
                "chunk {} of write {} is missing (object replaced or deleted meanwhile?)",
                hex::encode(chunk.hash),
                hex::encode(chunk.write)
            )
        })?;
    let overhead = if seal.is_some() { layout::OVERHEAD } else { 0 };
    layout::verify_chunk(chunk, &data, overhead).map_err(layout_error)?;
    match seal {
        Some(seal) => seal.open(&data),
        None => Ok(data),
    }
}

/// The part of each chunk that `range` covers.
pub fn chunk_spans(chunks: &[ChunkRef], range: &Range<u64>) -> Vec<(ChunkRef, Range<usize>)> {
    let mut spans = Vec::new();
    let mut offset = 0u64;
    for chunk in chunks {
        let end = offset + u64::from(chunk.len);
        if end > range.start && offset < range.end {
            let from = range.start.saturating_sub(offset) as usize;
            let to = (range.end.min(end) - offset) as usize;
            spans.push((*chunk, from..to));
        }
        if end >= range.end {
            break;
        }
        offset = end;
    }
    spans
}

impl Engine {
    /// An engine with these limits.
    pub fn new(limits: Limits) -> Engine {
        Engine {
            buffers: Arc::new(Semaphore::new(limits.chunk_buffers.max(1))),
            read_buffers: Arc::new(Semaphore::new(limits.read_buffers.max(1))),
            limits,
            bucket_list: Mutex::new(()),
            buckets: Stripes::new(64),
            objects: Stripes::new(1024),
            shards: Stripes::new(256),
            uploads: Stripes::new(256),
            upload_lists: Stripes::new(64),
            keys: GatewayKeys::default(),
        }
    }

    /// The same engine sealing SSE-S3 objects with `keys`.
    pub fn with_gateway_keys(mut self, keys: GatewayKeys) -> Engine {
        self.keys = keys;
        self
    }

    /// The SSE-S3 keys.
    pub fn gateway_keys(&self) -> &GatewayKeys {
        &self.keys
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    // ---- buckets ----

    /// The bucket's record, or NoSuchBucket.
    pub async fn require_bucket<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
    ) -> S3Result<BucketRecord> {
        let record = match reg
            .get(&layout::bucket_key(bucket))
            .await
            .map_err(store_error)?
        {
            Some(bytes) => layout::decode_bucket(&bytes).map_err(layout_error)?,
            None => return Err(s3_error!(NoSuchBucket, "no bucket named {bucket:?}")),
        };
        Ok(record)
    }

    /// The bucket's record, or NoSuchBucket, or NotImplemented when `what` is not served on
    /// causal buckets.
    async fn require_register_bucket<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        what: &str,
    ) -> S3Result<BucketRecord> {
        let record = self.require_bucket(reg, bucket).await?;
        if record.extra.causal.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "{what} is not served on causal buckets ({bucket:?} is one)"
            ));
        }
        Ok(record)
    }

    /// Creates a bucket; `causal`: its objects in a causal volume of the same name, created
    /// (or adopted) first. Re-creating a bucket as it is answers BucketAlreadyOwnedByYou; as the
    /// other kind, a conflict.
    pub async fn create_bucket<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        causal: bool,
    ) -> S3Result<()> {
        let _list = self.bucket_list.lock().await;
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).write().await;
        let key = layout::bucket_key(bucket);
        match self.require_bucket(reg, bucket).await {
            Ok(existing) if existing.extra.causal.is_some() == causal => {
                return Err(s3_error!(
                    BucketAlreadyOwnedByYou,
                    "bucket {bucket:?} exists"
                ));
            }
            Ok(_) => {
                let mut error = s3_error!(
                    BucketAlreadyExists,
                    "bucket {bucket:?} exists, {} causal",
                    if causal { "not" } else { "and is" }
                );
                error.set_status_code(http::StatusCode::CONFLICT);
                return Err(error);
            }
            Err(error) if *error.code() == S3ErrorCode::NoSuchBucket => {}
            Err(error) => return Err(error),
        }
        let created_ms = now_ms();
        let record = if causal {
            reg.create_causal(bucket).await.map_err(store_error)?;
            let record = BucketRecord {
                created_ms,
                extra: layout::BucketExtra {
                    causal: Some(bucket.to_owned()),
                },
                more: layout::BucketMore::default(),
                versioning: layout::Versioning::Unversioned,
            };
            layout::encode_bucket(&record)
        } else {
            // Format 1, which every gateway reads.
            layout::encode(
                "bucket",
                &BucketRecord {
                    created_ms,
                    extra: layout::BucketExtra::default(),
                    more: layout::BucketMore::default(),
                    versioning: layout::Versioning::Unversioned,
                },
            )
        };
        reg.put(&key, record.map_err(layout_error)?)
            .await
            .map_err(store_error)?;
        let list_key = layout::bucket_list_key();
        let mut list: BucketList = get_record(reg, "bucket list", &list_key)
            .await?
            .unwrap_or_default();
        list.insert(bucket.to_owned(), created_ms);
        put_record(reg, "bucket list", &list_key, &list).await
    }

    /// A bucket's tags.
    pub async fn bucket_tags<R: Registers>(&self, reg: &R, bucket: &str) -> S3Result<Tags> {
        Ok(self.require_bucket(reg, bucket).await?.more.tags)
    }

    /// Replaces a bucket's tags (none: deletes them).
    pub async fn set_bucket_tags<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        tags: Tags,
    ) -> S3Result<()> {
        let tags = check_tags(tags, BUCKET_TAGS_MAX)?;
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).write().await;
        let mut record = self.require_bucket(reg, bucket).await?;
        record.more.tags = tags;
        let encoded = layout::encode_bucket(&record).map_err(layout_error)?;
        reg.put(&layout::bucket_key(bucket), encoded)
            .await
            .map_err(store_error)
    }

    /// Every bucket with its creation time.
    pub async fn list_buckets<R: Registers>(&self, reg: &R) -> S3Result<BucketList> {
        Ok(get_record(reg, "bucket list", &layout::bucket_list_key())
            .await?
            .unwrap_or_default())
    }

    /// Deletes an empty bucket.
    pub async fn delete_bucket<R: Registers>(&self, reg: &R, bucket: &str) -> S3Result<()> {
        let _list = self.bucket_list.lock().await;
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).write().await;
        let record = self.require_bucket(reg, bucket).await?;
        let empty = match &record.extra.causal {
            Some(volume) => crate::causal::is_empty(reg, volume).await?,
            None => {
                // A key whose current version is a delete marker still has versions.
                let (shards, markers) = futures::future::join(
                    self.read_shards(reg, bucket),
                    self.marker_keys(reg, bucket),
                )
                .await;
                shards?.iter().all(|s| s.is_empty()) && markers?.is_empty()
            }
        };
        if !empty {
            return Err(s3_error!(BucketNotEmpty, "bucket {bucket:?} is not empty"));
        }
        let uploads: UploadList = get_record(reg, "upload list", &layout::upload_list_key(bucket))
            .await?
            .unwrap_or_default();
        if !uploads.is_empty() {
            return Err(s3_error!(
                BucketNotEmpty,
                "bucket {bucket:?} has {} multipart uploads in progress",
                uploads.len()
            ));
        }
        reg.delete(&layout::bucket_key(bucket))
            .await
            .map_err(store_error)?;
        let list_key = layout::bucket_list_key();
        let mut list: BucketList = get_record(reg, "bucket list", &list_key)
            .await?
            .unwrap_or_default();
        list.remove(bucket);
        put_record(reg, "bucket list", &list_key, &list).await?;
        for shard in 0..INDEX_SHARDS {
            reg.delete(&layout::shard_key(bucket, shard))
                .await
                .map_err(store_error)?;
            if record.versioning != layout::Versioning::Unversioned {
                reg.delete(&layout::marker_shard_key(bucket, shard))
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }

    // ---- the index ----

    async fn read_shards<R: Registers>(&self, reg: &R, bucket: &str) -> S3Result<Vec<IndexShard>> {
        let reads = (0..INDEX_SHARDS).map(|shard| async move {
            get_record::<R, IndexShard>(reg, "index shard", &layout::shard_key(bucket, shard))
                .await
                .map(Option::unwrap_or_default)
        });
        futures::future::try_join_all(reads).await
    }

    async fn update_index<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        entry: Option<IndexEntry>,
    ) -> S3Result<()> {
        let shard = layout::shard_of(key);
        let _lock = self.shards.get(&[bucket.as_bytes(), &[shard]]).lock().await;
        let shard_key = layout::shard_key(bucket, shard);
        let mut index: IndexShard = get_record(reg, "index shard", &shard_key)
            .await?
            .unwrap_or_default();
        let changed = match entry {
            Some(entry) => index.insert(key.to_owned(), entry.clone()).as_ref() != Some(&entry),
            None => index.remove(key).is_some(),
        };
        if !changed {
            return Ok(());
        }
        put_record(reg, "index shard", &shard_key, &index)
            .await
            .map_err(|mut e| {
                if *e.code() == S3ErrorCode::EntityTooLarge {
                    e = s3_error!(
                        ServiceUnavailable,
                        "the listing index shard of bucket {bucket:?} is full; the object was stored but is not listed"
                    );
                }
                e
            })
    }

    /// One page of the listing of `bucket`.
    pub async fn list<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        query: &Query<'_>,
    ) -> S3Result<Page> {
        let record = self.require_bucket(reg, bucket).await?;
        if let Some(volume) = &record.extra.causal {
            return crate::causal::list(reg, volume, query).await;
        }
        let shards = self.read_shards(reg, bucket).await?;
        let merged: BTreeMap<&String, &IndexEntry> = shards.iter().flat_map(|s| s.iter()).collect();
        Ok(index::list(merged, query))
    }

    // ---- object bodies ----

    /// Streams a body into chunks of the object or part `origin` names, at most `max` bytes,
    /// keeping at most a few chunks in memory, each sealed with `seal` when given. Bodies of at
    /// most `inline_max` bytes are returned inline. On failure, chunks already written are
    /// deleted.
    #[allow(clippy::too_many_arguments)]
    pub async fn write_body<R: Registers, S>(
        &self,
        reg: &Arc<R>,
        mut body: S,
        max: u64,
        inline_max: usize,
        algorithms: Algorithms,
        seal: Option<&Seal>,
        origin: ChunkOrigin,
    ) -> S3Result<Written>
    where
        S: Stream<Item = S3Result<Bytes>> + Unpin,
    {
        let write = layout::new_write_id();
        let origin = Arc::new(origin);
        let mut chunks: Vec<ChunkRef> = Vec::new();
        let mut inflight: JoinSet<S3Result<(usize, ChunkRef)>> = JoinSet::new();
        let result = self
            .fill_chunks(
                reg,
                &mut body,
                max,
                inline_max,
                algorithms,
                (write, seal, &origin),
                &mut chunks,
                &mut inflight,
            )
            .await;
        let result = match result {
            Ok(mut written) => {
                let mut outcome = Ok(());
                while let Some(done) = inflight.join_next().await {
                    match stored_chunk(done) {
                        Ok((at, stored)) => chunks[at] = stored,
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
                // The references as stored, naming the objects that hold the chunks.
                if let Data::Chunks(listed) = &mut written.data {
                    listed.clone_from(&chunks);
                }
                outcome.map(|()| written)
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            inflight.abort_all();
            forget_chunks(reg, chunks, Duration::ZERO);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn fill_chunks<R: Registers, S>(
        &self,
        reg: &Arc<R>,
        body: &mut S,
        max: u64,
        inline_max: usize,
        algorithms: Algorithms,
        (write, seal, origin): (WriteId, Option<&Seal>, &Arc<ChunkOrigin>),
        chunks: &mut Vec<ChunkRef>,
        inflight: &mut JoinSet<S3Result<(usize, ChunkRef)>>,
    ) -> S3Result<Written>
    where
        S: Stream<Item = S3Result<Bytes>> + Unpin,
    {
        let mut md5 = md5::Md5::new();
        let mut checksums = algorithms.hasher();
        let mut size = 0u64;
        let mut buffer: Option<(BytesMut, OwnedSemaphorePermit)> = None;
        while let Some(piece) = body.next().await {
            let mut piece = piece?;
            size += piece.len() as u64;
            if size > max {
                return Err(s3_error!(
                    EntityTooLarge,
                    "body exceeds the limit of {max} bytes"
                ));
            }
            md5.update(&piece);
            checksums.update(&piece);
            while !piece.is_empty() {
                if buffer.is_none() {
                    let permit = self
                        .buffers
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| s3_error!(InternalError, "gateway shutting down"))?;
                    buffer = Some((BytesMut::new(), permit));
                }
                let Some((buf, _)) = buffer.as_mut() else {
                    continue;
                };
                let take = piece.len().min(CHUNK_BYTES - buf.len());
                buf.extend_from_slice(&piece.split_to(take));
                if buf.len() == CHUNK_BYTES
                    && let Some((buf, permit)) = buffer.take()
                {
                    self.spawn_chunk(
                        reg,
                        (write, seal, origin),
                        buf.freeze(),
                        permit,
                        chunks,
                        inflight,
                    )
                    .await?;
                }
            }
        }
        let md5: [u8; 16] = md5.finalize().into();
        let checksum = checksums.finalize();
        let written = |data: Data| {
            let etag_md5 = match seal {
                Some(seal) if seal.hides_md5() => sealed_digest(&data),
                _ => md5,
            };
            Written {
                size,
                md5,
                etag_md5,
                checksum,
                data,
            }
        };
        if chunks.is_empty() && size <= inline_max as u64 {
            let data: Bytes = buffer.map(|(buf, _)| buf.freeze()).unwrap_or_default();
            let data = match seal {
                Some(seal) => seal.seal(&data),
                None => data,
            };
            return Ok(written(Data::Inline(data)));
        }
        if let Some((buf, permit)) = buffer.take() {
            self.spawn_chunk(
                reg,
                (write, seal, origin),
                buf.freeze(),
                permit,
                chunks,
                inflight,
            )
            .await?;
        }
        Ok(written(Data::Chunks(chunks.clone())))
    }

    async fn spawn_chunk<R: Registers>(
        &self,
        reg: &Arc<R>,
        (write, seal, origin): (WriteId, Option<&Seal>, &Arc<ChunkOrigin>),
        data: Bytes,
        permit: OwnedSemaphorePermit,
        chunks: &mut Vec<ChunkRef>,
        inflight: &mut JoinSet<S3Result<(usize, ChunkRef)>>,
    ) -> S3Result<()> {
        while inflight.len() >= self.limits.chunk_writes_per_request.max(1) {
            if let Some(done) = inflight.join_next().await {
                let (at, stored) = stored_chunk(done)?;
                chunks[at] = stored;
            }
        }
        let (chunk, data) = match seal {
            Some(seal) => {
                let stored = seal.seal(&data);
                (ChunkRef::sealed(write, data.len(), &stored), stored)
            }
            None => (ChunkRef::of(write, &data), data),
        };
        let at = chunks.len();
        chunks.push(chunk);
        let reg = reg.clone();
        let origin = origin.clone();
        inflight.spawn(async move {
            let result = reg
                .put_chunk(chunk, data, &origin)
                .await
                .map_err(store_error);
            drop(permit);
            result.map(|stored| (at, stored))
        });
        Ok(())
    }

    // ---- objects ----

    /// The manifest of `key`, or NoSuchKey / NoSuchBucket.
    pub async fn manifest<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Manifest> {
        self.manifest_version(reg, bucket, key, None).await
    }

    /// The manifest of version `version` of `key` (the current one when `None`), or the error
    /// S3 gives: NoSuchKey, NoSuchVersion, NoSuchBucket, or a delete marker's.
    pub async fn manifest_version<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<Manifest> {
        check_object_key(key)?;
        match self.manifest_at(reg, bucket, key, version).await? {
            Some(manifest) => Ok(manifest),
            None => {
                self.require_register_bucket(reg, bucket, "copying").await?;
                Err(s3_error!(
                    NoSuchKey,
                    "no object {key:?} in bucket {bucket:?}"
                ))
            }
        }
    }

    /// The object GET and HEAD answer with: in a register bucket its manifest; in a causal
    /// bucket the current version by [`crate::causal`]'s rule, with the others it has. An
    /// encrypted one is opened with `customer`'s key, or the gateway's, and refused when that
    /// is not the key it was sealed with.
    pub async fn object<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        customer: Option<&CustomerKey>,
    ) -> S3Result<Object<R>> {
        self.object_version(reg, bucket, key, None, customer).await
    }

    /// [`Engine::object`] for version `version` of the object (the current one when `None`).
    pub async fn object_version<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        customer: Option<&CustomerKey>,
    ) -> S3Result<Object<R>> {
        let (mut manifest, causal) = self.find_object(reg, bucket, key, version).await?;
        let seal = self.open_manifest(&mut manifest, customer)?;
        Ok(Object {
            manifest,
            seal,
            causal,
        })
    }

    /// The seal that opens `manifest`, with its checksums opened into `extra`.
    fn open_manifest(
        &self,
        manifest: &mut Manifest,
        customer: Option<&CustomerKey>,
    ) -> S3Result<Option<Seal>> {
        let sealed = manifest.sealed.as_ref();
        let seal = Seal::for_read(sealed.map(|s| &s.mode), customer, &self.keys)?;
        if let (Some(seal), Some(sealed)) = (&seal, sealed) {
            manifest.extra.checksums = seal.checksums(sealed);
        }
        Ok(seal)
    }

    async fn find_object<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<(Manifest, Option<CausalFound<R>>)> {
        check_object_key(key)?;
        if let Some(manifest) = self.manifest_at(reg.as_ref(), bucket, key, version).await? {
            return Ok((manifest, None));
        }
        let record = self.require_bucket(reg.as_ref(), bucket).await?;
        let missing = || s3_error!(NoSuchKey, "no object {key:?} in bucket {bucket:?}");
        let Some(volume) = record.extra.causal else {
            return Err(missing());
        };
        crate::causal::check_key(key)?;
        let objects = Arc::new(CausalObjects::new(reg.clone(), volume));
        let (manifest, others) = objects.current(key).await?.ok_or_else(missing)?;
        Ok((manifest, Some((objects, others))))
    }

    /// Streams `range` of an object found by [`Engine::object`].
    pub async fn read_object<R: Registers>(
        &self,
        reg: &Arc<R>,
        object: &Object<R>,
        range: Range<u64>,
    ) -> S3Result<ObjectStream> {
        let seal = object.seal.as_ref();
        match &object.causal {
            None => self.read(reg, &object.manifest, range, seal).await,
            Some((objects, _)) => self.read(objects, &object.manifest, range, seal).await,
        }
    }

    /// Makes `manifest` the object's current version, updates the index, and retires the old
    /// version's chunks, unless the bucket's versioning keeps it. Sets the manifest's version
    /// id. The new chunks must already be durable. When `owns_chunks`, a failure before the
    /// manifest write deletes them; after the write has started they are kept, since a write
    /// that timed out may still take effect and must not point at deleted chunks.
    pub async fn commit<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        manifest: &mut Manifest,
        owns_chunks: bool,
    ) -> S3Result<()> {
        let mut started = false;
        match self.switch(reg, bucket, manifest, &mut started).await {
            Ok(replaced) => {
                let keep: std::collections::HashSet<ChunkRef> =
                    manifest.data.chunks().iter().copied().collect();
                let retired = replaced
                    .iter()
                    .flat_map(|old| old.data.chunks())
                    .filter(|c| !keep.contains(c))
                    .copied()
                    .collect();
                forget_chunks(reg, retired, self.limits.chunk_grace);
                Ok(())
            }
            Err(e) => {
                if owns_chunks && !started {
                    forget_chunks(reg, manifest.data.chunks().to_vec(), Duration::ZERO);
                }
                Err(e)
            }
        }
    }

    /// The locked part of [`Engine::commit`]; returns the versions replaced for good. Sets
    /// `started` once the manifest write has been sent.
    async fn switch<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        manifest: &mut Manifest,
        started: &mut bool,
    ) -> S3Result<Vec<Manifest>> {
        let key = manifest.key.clone();
        let object_key = layout::object_key(bucket, &key);
        // Refused before anything is locked or written: a record no register can hold.
        layout::encode_manifest(manifest).map_err(layout_error)?;
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).read().await;
        let _object = self
            .objects
            .get(&[bucket.as_bytes(), key.as_bytes()])
            .lock()
            .await;
        // Both reads happen under the locks, so neither can be overtaken; side by side they cost
        // one round trip instead of two.
        let (record, old) = futures::future::join(
            self.require_register_bucket(
                reg.as_ref(),
                bucket,
                "copying or completing a multipart upload",
            ),
            self.head_to_replace(reg.as_ref(), bucket, &key),
        )
        .await;
        let record = record?;
        let old = old?;
        if record.versioning != layout::Versioning::Unversioned {
            return self
                .switch_versioned(reg, bucket, record.versioning, manifest, old, started)
                .await;
        }
        manifest.version = None;
        let encoded = layout::encode_manifest(manifest).map_err(layout_error)?;
        let entry = IndexEntry {
            size: manifest.size,
            etag: manifest.etag.clone(),
            last_modified_ms: manifest.last_modified_ms,
        };
        *started = true;
        reg.put(&object_key, encoded).await.map_err(store_error)?;
        self.update_index(reg.as_ref(), bucket, &key, Some(entry))
            .await?;
        Ok(match old {
            Some((layout::Head::Object(old), _)) => vec![old],
            _ => Vec::new(),
        })
    }

    /// An object's tags.
    pub async fn object_tags<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Tags> {
        Ok(self.version_tags(reg, bucket, key, None).await?.0)
    }

    /// The tags of version `version` of an object (the current one when `None`).
    pub async fn version_tags<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<(Tags, Option<String>)> {
        self.require_register_bucket(reg, bucket, "tagging").await?;
        let manifest = self.manifest_version(reg, bucket, key, version).await?;
        Ok((manifest.tags, manifest.version))
    }

    /// Replaces an object's tags (none: deletes them). Nothing else of it changes, its time
    /// included, as in S3.
    pub async fn set_object_tags<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        tags: Tags,
    ) -> S3Result<()> {
        self.set_version_tags(reg, bucket, key, None, tags)
            .await
            .map(|_| ())
    }

    /// [`Engine::set_object_tags`] for version `version` of the object (the current one when
    /// `None`).
    pub async fn set_version_tags<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        tags: Tags,
    ) -> S3Result<Option<String>> {
        let tags = check_tags(tags, OBJECT_TAGS_MAX)?;
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).read().await;
        self.require_register_bucket(reg, bucket, "tagging").await?;
        let _object = self
            .objects
            .get(&[bucket.as_bytes(), key.as_bytes()])
            .lock()
            .await;
        let mut manifest = self.manifest_version(reg, bucket, key, version).await?;
        manifest.tags = tags;
        self.rewrite_version(reg, bucket, &manifest).await?;
        Ok(manifest.version)
    }

    /// Stores a whole object from a body stream, sealed with `seal` when given.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_object<R: Registers, S>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        body: S,
        integrity: &Integrity,
        seal: Option<&Seal>,
    ) -> S3Result<(Manifest, Checksum)>
    where
        S: Stream<Item = S3Result<Bytes>> + Unpin,
    {
        check_object_key(key)?;
        let record = self.require_bucket(reg.as_ref(), bucket).await?;
        if let Some(volume) = record.extra.causal {
            if !meta.tags.is_empty() {
                return Err(s3_error!(
                    NotImplemented,
                    "tagging is not served on causal buckets ({bucket:?} is one)"
                ));
            }
            let objects = Arc::new(CausalObjects::new(reg.clone(), volume));
            crate::causal::check_key(key)?;
            let (manifest, checksum) = self
                .store_object(
                    &objects,
                    (bucket, key),
                    meta,
                    body,
                    integrity,
                    crate::causal::INLINE_BYTES_MAX,
                    crate::causal::OBJECT_BYTES_MAX.min(self.limits.object_bytes_max),
                    seal,
                )
                .await?;
            objects.commit(&manifest).await?;
            return Ok((manifest, checksum));
        }
        let (mut manifest, checksum) = self
            .store_object(
                reg,
                (bucket, key),
                meta,
                body,
                integrity,
                INLINE_BYTES_MAX,
                self.limits.object_bytes_max,
                seal,
            )
            .await?;
        self.commit(reg, bucket, &mut manifest, true).await?;
        Ok((manifest, checksum))
    }

    /// A body's data stored and checked, and the manifest that would name it.
    #[allow(clippy::too_many_arguments)]
    async fn store_object<R: Registers, S>(
        &self,
        reg: &Arc<R>,
        (bucket, key): (&str, &str),
        meta: ObjectMeta,
        body: S,
        integrity: &Integrity,
        inline_max: usize,
        max: u64,
        seal: Option<&Seal>,
    ) -> S3Result<(Manifest, Checksum)>
    where
        S: Stream<Item = S3Result<Bytes>> + Unpin,
    {
        let metadata = check_metadata(meta.metadata)?;
        let written = self
            .write_body(
                reg,
                body,
                max,
                inline_max,
                integrity.algorithms,
                seal,
                ChunkOrigin {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                    upload: None,
                },
            )
            .await?;
        if let Err(refused) = integrity.check(&written) {
            forget_chunks(reg, written.data.chunks().to_vec(), Duration::ZERO);
            return Err(refused);
        }
        let (checksums, sealed) = sealed_checksums(seal, stored_checksums(&written.checksum));
        let manifest = Manifest {
            version: None,
            key: key.to_owned(),
            size: written.size,
            etag: layout::single_part_etag(&written.etag_md5),
            content_type: meta.content_type,
            metadata,
            last_modified_ms: now_ms(),
            parts: 0,
            data: written.data,
            extra: ObjectExtra {
                part_sizes: Vec::new(),
                headers: meta.headers,
                checksums,
            },
            sealed,
            tags: meta.tags,
        };
        Ok((manifest, written.checksum))
    }

    /// Streams `range` of an object, opening each chunk with `seal` when it is encrypted. The
    /// first piece is fetched before this returns, so a missing or corrupt first chunk is an S3
    /// error rather than a cut-off response.
    pub async fn read<R: Registers>(
        &self,
        reg: &Arc<R>,
        manifest: &Manifest,
        range: Range<u64>,
        seal: Option<&Seal>,
    ) -> S3Result<ObjectStream> {
        assert_eq!(
            seal.is_some(),
            manifest.sealed.is_some(),
            "an object is read with a seal exactly when it is sealed"
        );
        let (tx, mut rx) = mpsc::channel(1);
        match &manifest.data {
            Data::Inline(bytes) => {
                let bytes = match seal {
                    Some(seal) => seal.open(bytes)?,
                    None => bytes.clone(),
                };
                let slice = bytes.slice(range.start as usize..range.end as usize);
                return Ok(ObjectStream {
                    first: Some(slice),
                    rx,
                });
            }
            Data::Chunks(chunks) => {
                let spans = chunk_spans(chunks, &range);
                let reg = reg.clone();
                let seal = seal.cloned();
                let buffers = self.read_buffers.clone();
                let ahead = self.limits.chunk_reads_per_request.max(1);
                tokio::spawn(async move {
                    let (reg, buffers, seal) = (&reg, &buffers, seal.as_ref());
                    let mut pieces = stream::iter(spans)
                        .map(|(chunk, span)| async move {
                            let permit =
                                buffers.clone().acquire_owned().await.map_err(|_| {
                                    s3_error!(InternalError, "gateway shutting down")
                                })?;
                            let data = fetch_chunk(reg.as_ref(), &chunk, seal).await?;
                            Ok((data.slice(span), Some(permit)))
                        })
                        .buffered(ahead);
                    while let Some(piece) = pieces.next().await {
                        let failed = piece.is_err();
                        if tx.send(piece).await.is_err() || failed {
                            break;
                        }
                    }
                });
            }
        }
        match rx.recv().await {
            Some(Ok((first, _permit))) => Ok(ObjectStream {
                first: Some(first),
                rx,
            }),
            Some(Err(e)) => Err(e),
            None => Ok(ObjectStream { first: None, rx }),
        }
    }

    /// Deletes an object (no error when it does not exist); in a bucket whose versioning was
    /// set, makes a delete marker its current version.
    pub async fn delete_object<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
    ) -> S3Result<Deleted> {
        self.delete_version(reg, bucket, key, None).await
    }

    /// Copies an object's bytes into a new object (its own chunks), with new or copied metadata.
    /// `precondition` sees the source's manifest before anything is copied. An encrypted source
    /// opens with `source_key` (SSE-C) or the gateway's key; the copy is sealed with `seal`.
    /// `meta` replaces the source's metadata and `tags` its tags when given (S3's metadata and
    /// tagging directives, each on its own). A copy of an encrypted source that names no
    /// encryption is sealed with SSE-S3.
    #[allow(clippy::too_many_arguments)]
    pub async fn copy_object<R: Registers>(
        &self,
        reg: &Arc<R>,
        source: (&str, &str, Option<&str>),
        target: (&str, &str),
        (meta, tags): (Option<ObjectMeta>, Option<Tags>),
        precondition: impl FnOnce(&Manifest) -> S3Result<()>,
        source_key: Option<&CustomerKey>,
        seal: Option<&Seal>,
    ) -> S3Result<Manifest> {
        check_object_key(target.1)?;
        let mut src = self
            .manifest_version(reg.as_ref(), source.0, source.1, source.2)
            .await
            .map_err(copy_source_error)?;
        precondition(&src)?;
        let src_seal = self.open_manifest(&mut src, source_key)?;
        // A copy of an encrypted object that names no encryption is not stored in the clear: it
        // takes SSE-S3, as S3's default bucket encryption gives it.
        let inherited;
        let seal = match (seal, &src_seal) {
            (None, Some(_)) => {
                inherited = Seal::for_write(&crate::seal::Asked::Gateway, &self.keys).map_err(|_| {
                    s3_error!(
                        InvalidRequest,
                        "the source is encrypted and this gateway has no SSE-S3 key: name the copy's encryption (SSE-C)"
                    )
                })?;
                inherited.as_ref()
            }
            (seal, _) => seal,
        };
        self.require_register_bucket(reg.as_ref(), target.0, "copying")
            .await?;
        if src.size > self.limits.object_bytes_max {
            return Err(s3_error!(
                InvalidRequest,
                "the source is {} bytes; copies are limited to {} bytes",
                src.size,
                self.limits.object_bytes_max
            ));
        }
        let origin = ChunkOrigin {
            bucket: target.0.to_owned(),
            key: target.1.to_owned(),
            upload: None,
        };
        // Encrypted on either side: the bytes go through the gateway in the clear, as a new body.
        let (data, etag) = if src_seal.is_some() || seal.is_some() {
            let body = self.read(reg, &src, 0..src.size, src_seal.as_ref()).await?;
            let written = self
                .write_body(
                    reg,
                    body,
                    src.size,
                    INLINE_BYTES_MAX,
                    Algorithms::default(),
                    seal,
                    origin,
                )
                .await?;
            (written.data, layout::single_part_etag(&written.etag_md5))
        } else {
            (
                self.copy_chunks(reg, &src.data, &origin).await?,
                src.etag.clone(),
            )
        };
        // The same bytes: their part boundaries and checksums stay.
        let tags = tags.unwrap_or_else(|| src.tags.clone());
        let (content_type, metadata, headers) = match meta {
            Some(meta) => (
                meta.content_type,
                check_metadata(meta.metadata)?,
                meta.headers,
            ),
            None => (
                src.content_type.clone(),
                src.metadata.clone(),
                src.extra.headers.clone(),
            ),
        };
        let (checksums, sealed) = sealed_checksums(seal, src.extra.checksums.clone());
        let mut manifest = Manifest {
            version: None,
            key: target.1.to_owned(),
            size: src.size,
            etag,
            content_type,
            metadata,
            last_modified_ms: now_ms(),
            parts: src.parts,
            data,
            extra: ObjectExtra {
                part_sizes: src.extra.part_sizes.clone(),
                headers,
                checksums,
            },
            sealed,
            tags,
        };
        self.commit(reg, target.0, &mut manifest, true).await?;
        Ok(manifest)
    }

    /// `data`'s chunks copied as they are stored, under a new write id, as chunks of `origin`.
    async fn copy_chunks<R: Registers>(
        &self,
        reg: &Arc<R>,
        data: &Data,
        origin: &ChunkOrigin,
    ) -> S3Result<Data> {
        Ok(match data {
            Data::Inline(bytes) => Data::Inline(bytes.clone()),
            Data::Chunks(chunks) => {
                let write = layout::new_write_id();
                let copied: Vec<S3Result<ChunkRef>> = stream::iter(chunks.iter().copied())
                    .map(|chunk| async move {
                        let _permit = self
                            .buffers
                            .acquire()
                            .await
                            .map_err(|_| s3_error!(InternalError, "gateway shutting down"))?;
                        let data = fetch_chunk(reg.as_ref(), &chunk, None).await?;
                        let new = ChunkRef {
                            write,
                            object: None,
                            ..chunk
                        };
                        reg.put_chunk(new, data, origin).await.map_err(store_error)
                    })
                    .buffered(self.limits.chunk_writes_per_request.max(1))
                    .collect()
                    .await;
                let (ok, failed): (Vec<_>, Vec<_>) = copied.into_iter().partition(Result::is_ok);
                let ok: Vec<ChunkRef> = ok.into_iter().filter_map(Result::ok).collect();
                if let Some(Err(e)) = failed.into_iter().next() {
                    forget_chunks(reg, ok, Duration::ZERO);
                    return Err(e);
                }
                Data::Chunks(ok)
            }
        })
    }

    // ---- multipart ----

    async fn upload<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> S3Result<UploadRecord> {
        let missing = || s3_error!(NoSuchUpload, "no upload {upload_id:?} for {bucket}/{key}");
        if upload_id.is_empty()
            || upload_id.len() > 64
            || !upload_id.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(missing());
        }
        let record: UploadRecord = match reg
            .get(&layout::upload_key(upload_id))
            .await
            .map_err(store_error)?
        {
            Some(bytes) => layout::decode_extended("upload", &bytes).map_err(layout_error)?,
            None => return Err(missing()),
        };
        if record.bucket != bucket || record.key != key {
            return Err(missing());
        }
        Ok(record)
    }

    /// Starts a multipart upload whose parts are sealed with `seal` when given, and hashed with
    /// `checksum` when given; returns its id.
    pub async fn create_upload<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        (seal, checksum): (Option<&Seal>, Option<PartChecksum>),
    ) -> S3Result<String> {
        check_object_key(key)?;
        let metadata = check_metadata(meta.metadata)?;
        self.require_register_bucket(reg, bucket, "a multipart upload")
            .await?;
        let upload_id = hex::encode(layout::new_write_id());
        let record = UploadRecord {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            content_type: meta.content_type,
            metadata,
            created_ms: now_ms(),
            parts: BTreeMap::new(),
            headers: meta.headers,
            more: layout::UploadMore {
                sealed: seal.map(|seal| seal.record(&Checksums::default())),
                tags: meta.tags,
                checksum,
                uploaded: layout::PartSet::default(),
            },
        };
        let encoded = layout::encode_extended("upload", &record).map_err(layout_error)?;
        reg.put(&layout::upload_key(&upload_id), encoded)
            .await
            .map_err(store_error)?;
        self.track_upload(reg, bucket, key, &upload_id, Some(record.created_ms))
            .await?;
        Ok(upload_id)
    }

    async fn track_upload<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        upload_id: &str,
        started_ms: Option<u64>,
    ) -> S3Result<()> {
        let _lock = self.upload_lists.get(&[bucket.as_bytes()]).lock().await;
        let list_key = layout::upload_list_key(bucket);
        let mut list: UploadList = get_record(reg, "upload list", &list_key)
            .await?
            .unwrap_or_default();
        let id = (key.to_owned(), upload_id.to_owned());
        match started_ms {
            Some(ms) => {
                list.insert(id, ms);
            }
            None => {
                if list.remove(&id).is_none() {
                    return Ok(());
                }
            }
        }
        put_record(reg, "upload list", &list_key, &list).await
    }

    /// Uploads in progress under `prefix`, after the markers, at most `max`; and whether more
    /// follow. Each is (object key, upload id, started in ms since the epoch).
    pub async fn list_uploads<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        prefix: &str,
        after: Option<(&str, &str)>,
        max: usize,
    ) -> S3Result<(Vec<(String, String, u64)>, bool)> {
        self.require_bucket(reg, bucket).await?;
        let list: UploadList = get_record(reg, "upload list", &layout::upload_list_key(bucket))
            .await?
            .unwrap_or_default();
        let mut uploads: Vec<(String, String, u64)> = list
            .into_iter()
            .filter(|((key, id), _)| {
                key.starts_with(prefix)
                    && after.is_none_or(|(k, i)| (key.as_str(), id.as_str()) > (k, i))
            })
            .map(|((key, id), ms)| (key, id, ms))
            .take(max.saturating_add(1))
            .collect();
        let truncated = uploads.len() > max;
        uploads.truncate(max);
        Ok((uploads, truncated))
    }

    /// Stores one part, once it hashes to what `integrity` says; returns what was written, and
    /// the seal it was written with: the upload's, opened with `customer`'s key for SSE-C.
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_part<R: Registers, S>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: S,
        integrity: &Integrity,
        customer: Option<&CustomerKey>,
    ) -> S3Result<(Written, Option<Seal>)>
    where
        S: Stream<Item = S3Result<Bytes>> + Unpin,
    {
        let part_number = u32::try_from(part_number)
            .ok()
            .filter(|n| (1..=PART_NUMBER_MAX).contains(n))
            .ok_or_else(|| {
                s3_error!(
                    InvalidArgument,
                    "part number must be 1 to {PART_NUMBER_MAX}"
                )
            })?;
        let record = self.upload(reg.as_ref(), bucket, key, upload_id).await?;
        let seal = Seal::for_read(
            record.more.sealed.as_ref().map(|s| &s.mode),
            customer,
            &self.keys,
        )?;
        // Every part is hashed with the upload's algorithm, whether or not its request said so.
        let mut algorithms = integrity.algorithms;
        if let Some(checksum) = record.more.checksum {
            algorithms.add(checksum);
        }
        let written = self
            .write_body(
                reg,
                body,
                self.limits.part_bytes_max,
                0,
                algorithms,
                seal.as_ref(),
                ChunkOrigin {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                    upload: Some((upload_id.to_owned(), part_number)),
                },
            )
            .await?;
        if let Err(refused) = integrity.check(&written) {
            forget_chunks(reg, written.data.chunks().to_vec(), Duration::ZERO);
            return Err(refused);
        }
        let part = PartRecord {
            size: written.size,
            md5: written.etag_md5,
            last_modified_ms: now_ms(),
            chunks: written.data.chunks().to_vec(),
        };
        let checksums = stored_checksums(&written.checksum);
        let stored = match &seal {
            Some(seal) => StoredPart {
                part: part.clone(),
                checksums: Checksums::default(),
                sealed_checksums: seal.seal_checksums(&checksums),
            },
            None => StoredPart {
                part: part.clone(),
                checksums,
                sealed_checksums: Bytes::new(),
            },
        };
        let mut started = false;
        let result = async {
            let _upload = self.uploads.get(&[upload_id.as_bytes()]).lock().await;
            let mut record = self.upload(reg.as_ref(), bucket, key, upload_id).await?;
            let old = self
                .stored_parts(reg.as_ref(), upload_id, &record, [part_number])
                .await?
                .remove(&part_number);
            // The part first, then the record that names it: a part the record names is there.
            started = true;
            let encoded = layout::encode_part(&stored).map_err(layout_error)?;
            reg.put(&layout::part_key(upload_id, part_number), encoded)
                .await
                .map_err(store_error)?;
            let moved = record.parts.remove(&part_number).is_some();
            if record.more.uploaded.insert(part_number) || moved {
                let encoded = layout::encode_extended("upload", &record).map_err(layout_error)?;
                reg.put(&layout::upload_key(upload_id), encoded)
                    .await
                    .map_err(store_error)?;
            }
            Ok::<_, S3Error>(old)
        }
        .await;
        match result {
            Ok(old) => {
                if let Some(old) = old {
                    forget_chunks(reg, old.part.chunks, Duration::ZERO);
                }
                Ok((written, seal))
            }
            Err(e) => {
                // A record write that timed out may still take effect: keep what it names.
                if !started {
                    forget_chunks(reg, part.chunks, Duration::ZERO);
                }
                Err(e)
            }
        }
    }

    /// UploadPartCopy: bytes `range` of `source` (all of it when `None`) become part
    /// `part_number` of `upload_id`, written afresh under a new write id like any uploaded part,
    /// so the part owns its chunks whatever later happens to the source. `range` is the header's
    /// inclusive `(first, last)`. An encrypted source opens with `source_key` (SSE-C) or the
    /// gateway's key; the part is sealed as the upload's parts are, with `customer`'s key.
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_part_copy<R: Registers>(
        &self,
        reg: &Arc<R>,
        source: (&str, &str, Option<&str>),
        target: (&str, &str),
        upload_id: &str,
        part_number: i32,
        range: Option<(u64, u64)>,
        precondition: impl FnOnce(&Manifest) -> S3Result<()>,
        (source_key, customer): (Option<&CustomerKey>, Option<&CustomerKey>),
    ) -> S3Result<(Written, Option<Seal>)> {
        self.upload(reg.as_ref(), target.0, target.1, upload_id)
            .await?;
        let mut src = self
            .manifest_version(reg.as_ref(), source.0, source.1, source.2)
            .await
            .map_err(copy_source_error)?;
        precondition(&src)?;
        let src_seal = self.open_manifest(&mut src, source_key)?;
        let range = match range {
            None => 0..src.size,
            Some((first, last)) if first <= last && last < src.size => first..last + 1,
            Some(_) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "Range specified is not valid for source object of size: {}",
                    src.size
                ));
            }
        };
        if range.end - range.start > self.limits.part_bytes_max {
            return Err(s3_error!(
                InvalidRequest,
                "{} bytes to copy; a part is limited to {} bytes",
                range.end - range.start,
                self.limits.part_bytes_max
            ));
        }
        let data = self.read(reg, &src, range, src_seal.as_ref()).await?;
        self.upload_part(
            reg,
            target.0,
            target.1,
            upload_id,
            part_number,
            data,
            &Integrity::default(),
            customer,
        )
        .await
    }

    // ---- what names a chunk (for `crate::collect`) ----

    /// The content-hash objects holding chunks that the objects and the uploads in progress of
    /// every register bucket name, as their listings find them. An object stored whose index
    /// entry was never written is not among them: [`Engine::origin_names`] asks it directly.
    pub async fn named_objects<R: Registers>(
        &self,
        reg: &R,
    ) -> S3Result<std::collections::HashSet<[u8; 32]>> {
        let mut named = std::collections::HashSet::new();
        let mut add = |chunks: &[ChunkRef]| named.extend(chunks.iter().filter_map(|c| c.object));
        for bucket in self.list_buckets(reg).await?.into_keys() {
            let record = match self.require_bucket(reg, &bucket).await {
                Ok(record) => record,
                Err(e) if *e.code() == S3ErrorCode::NoSuchBucket => continue,
                Err(e) => return Err(e),
            };
            if record.extra.causal.is_some() {
                continue;
            }
            let mut marker: Option<String> = None;
            loop {
                let query = Query {
                    prefix: "",
                    delimiter: None,
                    marker: marker.as_deref(),
                    max_keys: index::MAX_KEYS_DEFAULT,
                };
                let page = self.list(reg, &bucket, &query).await?;
                for (key, _) in &page.objects {
                    match self.manifest_at(reg, &bucket, key, None).await {
                        Ok(Some(manifest)) => add(manifest.data.chunks()),
                        Ok(None) => {}
                        Err(e) if *e.code() == S3ErrorCode::NoSuchKey => {}
                        Err(e) => return Err(e),
                    }
                }
                match (page.truncated, page.objects.last()) {
                    (true, Some((last, _))) => marker = Some(last.clone()),
                    _ => break,
                }
            }
            if record.versioning != layout::Versioning::Unversioned {
                self.noncurrent_chunks(reg, &bucket, &mut add).await?;
            }
            let mut after: Option<(String, String)> = None;
            loop {
                let (uploads, truncated) = self
                    .list_uploads(
                        reg,
                        &bucket,
                        "",
                        after.as_ref().map(|(k, i)| (k.as_str(), i.as_str())),
                        index::MAX_KEYS_DEFAULT,
                    )
                    .await?;
                for (key, id, _) in &uploads {
                    for number in self.upload_part_numbers(reg, &bucket, key, id).await? {
                        add(&self.part_chunks(reg, &bucket, key, id, number).await?);
                    }
                }
                match (truncated, uploads.last()) {
                    (true, Some((key, id, _))) => after = Some((key.clone(), id.clone())),
                    _ => break,
                }
            }
        }
        Ok(named)
    }

    /// Whether the object or upload part `origin` names content-hash object `object` now. A
    /// chunk belongs to one body write, so to one object or part: when it no longer names the
    /// chunk, nothing does (a completed upload's object names its parts' chunks, and is asked
    /// too). An answer that cannot be read counts as naming it.
    pub async fn origin_names<R: Registers>(
        &self,
        reg: &R,
        origin: &ChunkOrigin,
        object: [u8; 32],
    ) -> S3Result<bool> {
        let names = |chunks: &[ChunkRef]| chunks.iter().any(|c| c.object == Some(object));
        let manifest = reg
            .get(&layout::object_key(&origin.bucket, &origin.key))
            .await
            .map_err(store_error)?;
        if let Some(bytes) = manifest {
            match layout::decode_head(&origin.key, &bytes) {
                Ok(layout::Head::Object(manifest)) if names(manifest.data.chunks()) => {
                    return Ok(true);
                }
                Ok(_) => {}
                Err(_) => return Ok(true),
            }
        }
        // Versions the key keeps (only a bucket whose versioning was set has any).
        let mut named = false;
        match self
            .version_chunks(reg, &origin.bucket, &origin.key, &mut |chunks| {
                named |= names(chunks)
            })
            .await
        {
            Ok(()) if named => return Ok(true),
            Ok(()) => {}
            Err(_) => return Ok(true),
        }
        let Some((upload_id, number)) = &origin.upload else {
            return Ok(false);
        };
        Ok(names(
            &self
                .part_chunks(reg, &origin.bucket, &origin.key, upload_id, *number)
                .await?,
        ))
    }

    /// The part numbers of upload `upload_id` of `bucket`/`key`; none once it is gone.
    async fn upload_part_numbers<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> S3Result<std::collections::BTreeSet<u32>> {
        match self.upload(reg, bucket, key, upload_id).await {
            Ok(record) => Ok(Self::part_numbers(&record)),
            Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => Ok(Default::default()),
            Err(e) => Err(e),
        }
    }

    /// The chunks part `number` of upload `upload_id` names: in its own register, or in the
    /// upload's record for a part an older gateway kept there. None once the upload is gone.
    async fn part_chunks<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: u32,
    ) -> S3Result<Vec<ChunkRef>> {
        if let Some(bytes) = reg
            .get(&layout::part_key(upload_id, number))
            .await
            .map_err(store_error)?
        {
            return Ok(layout::decode_part(&bytes)
                .map_err(layout_error)?
                .part
                .chunks);
        }
        match self.upload(reg, bucket, key, upload_id).await {
            Ok(record) => Ok(record
                .parts
                .get(&number)
                .map(|part| part.chunks.clone())
                .unwrap_or_default()),
            Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The numbers of the parts `record` has: in their own registers, or (written by a
    /// gateway before format 3) in the record itself.
    fn part_numbers(record: &UploadRecord) -> std::collections::BTreeSet<u32> {
        let mut numbers: std::collections::BTreeSet<u32> = record.more.uploaded.iter().collect();
        numbers.extend(record.parts.keys().copied());
        numbers
    }

    /// The parts of `record` among `numbers` that it has, read from their registers (or from
    /// the record, for parts an older gateway kept there), 16 at a time.
    async fn stored_parts<R: Registers>(
        &self,
        reg: &R,
        upload_id: &str,
        record: &UploadRecord,
        numbers: impl IntoIterator<Item = u32>,
    ) -> S3Result<BTreeMap<u32, StoredPart>> {
        let fetched: Vec<S3Result<Option<(u32, StoredPart)>>> = stream::iter(numbers)
            .map(|number| async move {
                if !record.more.uploaded.contains(number) {
                    return Ok(record.parts.get(&number).map(|part| {
                        let stored = StoredPart {
                            part: part.clone(),
                            checksums: Checksums::default(),
                            sealed_checksums: Bytes::new(),
                        };
                        (number, stored)
                    }));
                }
                let key = layout::part_key(upload_id, number);
                let stored = match reg.get(&key).await.map_err(store_error)? {
                    Some(bytes) => Some(layout::decode_part(&bytes).map_err(layout_error)?),
                    None => None,
                };
                match stored {
                    Some(stored) => Ok(Some((number, stored))),
                    None => Err(s3_error!(
                        InternalError,
                        "part {number} of upload {upload_id} is named by its record but missing"
                    )),
                }
            })
            .buffered(16)
            .collect()
            .await;
        let mut parts = BTreeMap::new();
        for part in fetched {
            if let Some((number, stored)) = part? {
                parts.insert(number, stored);
            }
        }
        Ok(parts)
    }

    /// The upload's parts after `marker`, at most `max`; and whether more follow.
    pub async fn list_parts<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        upload_id: &str,
        marker: u32,
        max: usize,
    ) -> S3Result<(UploadRecord, Vec<(u32, StoredPart)>, bool)> {
        let record = self.upload(reg, bucket, key, upload_id).await?;
        let numbers: Vec<u32> = Self::part_numbers(&record)
            .range(marker.saturating_add(1)..)
            .copied()
            .take(max.saturating_add(1))
            .collect();
        let truncated = numbers.len() > max;
        let parts = self
            .stored_parts(reg, upload_id, &record, numbers.into_iter().take(max))
            .await?
            .into_iter()
            .collect();
        Ok((record, parts, truncated))
    }

    /// Completes an upload from the listed parts (number, ETag as the client saw it).
    /// The object a completion listing exactly `listed` made, if it is still the key's current
    /// version: S3 answers a completion repeated after it succeeded (a client retrying after a
    /// lost answer) with the same result. The parts' ETags fix the object's ETag, so the same
    /// ETag and part count mean the same listing; an unlisted ETag cannot be matched.
    async fn completed<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        listed: &[ListedPart],
    ) -> Option<Manifest> {
        let md5s = listed
            .iter()
            .map(|ListedPart { etag, .. }| {
                let hex = etag.as_deref()?.trim_matches('"');
                <[u8; 16]>::try_from(hex::decode(hex).ok()?).ok()
            })
            .collect::<Option<Vec<[u8; 16]>>>()?;
        let manifest = self.manifest(reg, bucket, key).await.ok()?;
        (manifest.parts as usize == listed.len() && manifest.etag == layout::multipart_etag(&md5s))
            .then_some(manifest)
    }

    pub async fn complete_upload<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        listed: &[ListedPart],
        (whole, customer): (&Checksums, Option<&CustomerKey>),
    ) -> S3Result<Manifest> {
        let _upload = self.uploads.get(&[upload_id.as_bytes()]).lock().await;
        let record = match self.upload(reg.as_ref(), bucket, key, upload_id).await {
            Ok(record) => record,
            Err(gone) if *gone.code() == s3s::S3ErrorCode::NoSuchUpload => {
                return self
                    .completed(reg.as_ref(), bucket, key, listed)
                    .await
                    .ok_or(gone);
            }
            Err(error) => return Err(error),
        };
        if listed.is_empty() {
            return Err(s3_error!(MalformedXML, "no parts listed"));
        }
        if listed.len() > PART_NUMBER_MAX as usize {
            return Err(s3_error!(
                InvalidArgument,
                "more than {PART_NUMBER_MAX} parts listed"
            ));
        }
        // An encrypted upload's part checksums open with its key: the gateway's, or the
        // customer's if the completion gives it. Without it (SSE-C) they cannot be checked, so
        // a completion that needs them is refused.
        let sealed_mode = record.more.sealed.as_ref().map(|s| &s.mode);
        let seal = match (sealed_mode, customer) {
            (Some(crate::seal::SealMode::Customer { .. }), None) => None,
            (mode, customer) => Seal::for_read(mode, customer, &self.keys)?,
        };
        let needs_key = record.more.checksum.is_some()
            || listed.iter().any(|p| p.checksums != Checksums::default())
            || *whole != Checksums::default();
        if sealed_mode.is_some() && seal.is_none() && needs_key {
            return Err(s3_error!(
                InvalidRequest,
                "the upload is encrypted with SSE-C and has checksums: the completion must give the customer key to check them"
            ));
        }
        let all = self
            .stored_parts(
                reg.as_ref(),
                upload_id,
                &record,
                Self::part_numbers(&record),
            )
            .await?;
        let opened: BTreeMap<u32, Checksums> = all
            .iter()
            .map(|(n, stored)| (*n, stored.checksums_opened(seal.as_ref())))
            .collect();
        let mut previous = 0i64;
        let mut used = Vec::with_capacity(listed.len());
        let mut part_checksums = Vec::with_capacity(listed.len());
        for (
            i,
            ListedPart {
                number,
                etag,
                checksums,
            },
        ) in listed.iter().enumerate()
        {
            if i64::from(*number) <= previous {
                return Err(s3_error!(
                    InvalidPartOrder,
                    "parts must be listed in ascending order"
                ));
            }
            previous = i64::from(*number);
            let part = u32::try_from(*number)
                .ok()
                .and_then(|n| all.get(&n))
                .map(|stored| &stored.part)
                .ok_or_else(|| s3_error!(InvalidPart, "part {number} was not uploaded"))?;
            if let Some(etag) = etag {
                let given = etag.trim_matches('"');
                if given != hex::encode(part.md5) {
                    return Err(s3_error!(
                        InvalidPart,
                        "part {number}: ETag {given} does not match"
                    ));
                }
            }
            let stored = u32::try_from(*number).ok().and_then(|n| opened.get(&n));
            check_part_checksums(*number, checksums, stored, record.more.checksum)?;
            part_checksums.push(stored);
            if i + 1 < listed.len() && part.size < self.limits.part_bytes_min {
                return Err(s3_error!(
                    EntityTooSmall,
                    "part {number} is {} bytes; every part but the last must be at least {}",
                    part.size,
                    self.limits.part_bytes_min
                ));
            }
            used.push(part);
        }
        let mut manifest = Manifest {
            version: None,
            key: key.to_owned(),
            size: used.iter().map(|p| p.size).sum(),
            etag: layout::multipart_etag(&used.iter().map(|p| p.md5).collect::<Vec<_>>()),
            content_type: record.content_type.clone(),
            metadata: record.metadata.clone(),
            last_modified_ms: now_ms(),
            parts: used.len() as u32,
            data: Data::Chunks(used.iter().flat_map(|p| p.chunks.iter().copied()).collect()),
            extra: ObjectExtra {
                part_sizes: used.iter().map(|p| p.size).collect(),
                headers: record.headers.clone(),
                checksums: composite_checksum(record.more.checksum, &part_checksums, whole)?,
            },
            sealed: record.more.sealed.clone(),
            tags: record.more.tags.clone(),
        };
        // A sealed object keeps its checksums sealed, as a single-part one does; the manifest
        // returned has them in the clear.
        let mut stored = match &seal {
            Some(seal) => Manifest {
                extra: ObjectExtra {
                    checksums: Checksums::default(),
                    ..manifest.extra.clone()
                },
                sealed: Some(seal.record(&manifest.extra.checksums)),
                ..manifest.clone()
            },
            None => manifest.clone(),
        };
        self.commit(reg, bucket, &mut stored, false).await?;
        manifest.version = stored.version.clone();
        if let Err(error) = reg.delete(&layout::upload_key(upload_id)).await {
            tracing::warn!(%upload_id, %error, "completed upload record not deleted");
        }
        if let Err(error) = self
            .track_upload(reg.as_ref(), bucket, key, upload_id, None)
            .await
        {
            tracing::warn!(%upload_id, %error, "completed upload still listed");
        }
        forget_parts(reg, upload_id, &record, &all);
        let kept: std::collections::HashSet<ChunkRef> =
            manifest.data.chunks().iter().copied().collect();
        let unused = all
            .values()
            .flat_map(|p| p.part.chunks.iter().copied())
            .filter(|c| !kept.contains(c))
            .collect();
        forget_chunks(reg, unused, Duration::ZERO);
        Ok(manifest)
    }

    /// Abandons an upload and its parts.
    pub async fn abort_upload<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> S3Result<()> {
        let _upload = self.uploads.get(&[upload_id.as_bytes()]).lock().await;
        let record = self.upload(reg.as_ref(), bucket, key, upload_id).await?;
        let all = self
            .stored_parts(
                reg.as_ref(),
                upload_id,
                &record,
                Self::part_numbers(&record),
            )
            .await?;
        reg.delete(&layout::upload_key(upload_id))
            .await
            .map_err(store_error)?;
        self.track_upload(reg.as_ref(), bucket, key, upload_id, None)
            .await?;
        forget_parts(reg, upload_id, &record, &all);
        let chunks = all.into_values().flat_map(|p| p.part.chunks).collect();
        forget_chunks(reg, chunks, Duration::ZERO);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemRegisters;

    pub(super) fn engine(grace: Duration) -> Engine {
        Engine::new(Limits {
            object_bytes_max: 20 << 20,
            part_bytes_min: 1,
            chunk_grace: grace,
            ..Limits::default()
        })
    }

    pub(super) fn body(data: &[u8], piece: usize) -> impl Stream<Item = S3Result<Bytes>> + Unpin {
        let pieces: Vec<S3Result<Bytes>> = data
            .chunks(piece.max(1))
            .map(|p| Ok(Bytes::copy_from_slice(p)))
            .collect();
        stream::iter(pieces)
    }

    pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    pub(super) async fn read_all(
        engine: &Engine,
        reg: &Arc<MemRegisters>,
        m: &Manifest,
        range: Range<u64>,
    ) -> S3Result<Vec<u8>> {
        let mut stream = engine.read(reg, m, range, None).await?;
        let mut out = Vec::new();
        while let Some(piece) = stream.next().await {
            out.extend_from_slice(&piece?);
        }
        Ok(out)
    }

    pub(super) async fn setup(grace: Duration) -> (Engine, Arc<MemRegisters>) {
        let engine = engine(grace);
        let reg = Arc::new(MemRegisters::default());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .unwrap();
        (engine, reg)
    }

    pub(super) fn chunk_registers(reg: &MemRegisters) -> usize {
        reg.map
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(b"s3/c/"))
            .count()
    }

    #[tokio::test]
    async fn large_objects_round_trip_in_chunks_and_ranges_fetch_only_what_they_need() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let data = pattern(2 * CHUNK_BYTES + 12345, 7);
        let m = engine
            .put_object(
                &reg,
                "b",
                "big",
                ObjectMeta::default(),
                body(&data, 65536),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0;
        assert_eq!(m.data.chunks().len(), 3);
        let md5: [u8; 16] = md5::Md5::digest(&data).into();
        assert_eq!(m.etag, hex::encode(md5));
        let m = engine.manifest(reg.as_ref(), "b", "big").await.unwrap();
        assert_eq!(read_all(&engine, &reg, &m, 0..m.size).await.unwrap(), data);
        let across = (CHUNK_BYTES as u64 - 10)..(CHUNK_BYTES as u64 + 10);
        assert_eq!(
            read_all(&engine, &reg, &m, across.clone()).await.unwrap(),
            &data[across.start as usize..across.end as usize]
        );
        assert_eq!(chunk_spans(m.data.chunks(), &across).len(), 2);
        assert_eq!(chunk_spans(m.data.chunks(), &(0..1)).len(), 1);
        assert_eq!(chunk_spans(m.data.chunks(), &(m.size - 1..m.size)).len(), 1);
    }

    /// A checksum that does not match refuses the PUT or the part and stores nothing; one that
    /// matches is computed and returned, as is one only named (to be computed).
    #[tokio::test]
    async fn checksums_are_checked_before_anything_refers_to_the_body() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let crc32 = |given: &str| Integrity {
            algorithms: Algorithms {
                crc32: true,
                ..Algorithms::default()
            },
            given: Checksum {
                checksum_crc32: Some(given.to_owned()),
                ..Checksum::default()
            },
            ..Integrity::default()
        };
        // CRC-32 of "hello" is 0x3610a686.
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(b"hello", 2),
                &crc32("AAAAAA=="),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BadDigest);
        assert!(engine.manifest(reg.as_ref(), "b", "k").await.is_err());
        let big = pattern(CHUNK_BYTES + 10, 3);
        let e = engine
            .put_object(
                &reg,
                "b",
                "big",
                ObjectMeta::default(),
                body(&big, 65536),
                &crc32("AAAAAA=="),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BadDigest);
        assert!(engine.manifest(reg.as_ref(), "b", "big").await.is_err());
        let (_, checksum) = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(b"hello", 2),
                &crc32("NhCmhg=="),
                None,
            )
            .await
            .unwrap();
        assert_eq!(checksum.checksum_crc32.as_deref(), Some("NhCmhg=="));
        let sha256 = Integrity {
            algorithms: Algorithms {
                sha256: true,
                ..Algorithms::default()
            },
            ..Integrity::default()
        };
        let (_, checksum) = engine
            .put_object(
                &reg,
                "b",
                "k2",
                ObjectMeta::default(),
                body(b"hello", 2),
                &sha256,
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            checksum.checksum_sha256.as_deref(),
            Some("LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=")
        );
        assert_eq!(checksum.checksum_crc32, None);

        // A part whose checksum does not match leaves the part it would replace in place.
        let id = engine
            .create_upload(reg.as_ref(), "b", "mp", ObjectMeta::default(), (None, None))
            .await
            .unwrap();
        engine
            .upload_part(
                &reg,
                "b",
                "mp",
                &id,
                1,
                body(b"hello", 2),
                &crc32("NhCmhg=="),
                None,
            )
            .await
            .unwrap();
        let e = engine
            .upload_part(
                &reg,
                "b",
                "mp",
                &id,
                1,
                body(b"other", 2),
                &crc32("NhCmhg=="),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BadDigest);
        let (_, parts, _) = engine
            .list_parts(reg.as_ref(), "b", "mp", &id, 0, 10)
            .await
            .unwrap();
        let hello: [u8; 16] = md5::Md5::digest(b"hello").into();
        assert_eq!(parts[0].1.part.md5, hello);
    }

    #[tokio::test]
    async fn small_objects_are_inline() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let m = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(b"hello", 2),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0;
        assert!(matches!(m.data, Data::Inline(_)));
        assert_eq!(m.etag, "5d41402abc4b2a76b9719d911017c592");
        assert_eq!(chunk_registers(&reg), 0);
        assert_eq!(read_all(&engine, &reg, &m, 1..4).await.unwrap(), b"ell");
    }

    #[tokio::test]
    async fn a_substituted_chunk_fails_the_read() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let data = pattern(CHUNK_BYTES + 100, 1);
        let m = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0;
        let victim = layout::chunk_key(&m.data.chunks()[1]);
        reg.map
            .lock()
            .unwrap()
            .insert(victim, Bytes::from(vec![0u8; 100]));
        let mut stream = engine.read(&reg, &m, 0..m.size, None).await.unwrap();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.len(), CHUNK_BYTES);
        let second = stream.next().await.unwrap();
        let error = second.unwrap_err();
        assert_eq!(*error.code(), S3ErrorCode::InternalError);
        assert!(
            error.message().unwrap().contains("failed verification"),
            "{error}"
        );
        // Substituting the first chunk fails before any byte is sent.
        let victim = layout::chunk_key(&m.data.chunks()[0]);
        reg.map
            .lock()
            .unwrap()
            .insert(victim, Bytes::from(vec![0u8; CHUNK_BYTES]));
        assert!(engine.read(&reg, &m, 0..10, None).await.is_err());
    }

    #[tokio::test]
    async fn readers_see_one_version_or_the_other_never_a_mix() {
        let (engine, reg) = setup(Duration::from_secs(3600)).await;
        let a = pattern(CHUNK_BYTES + 5000, 1);
        let b = pattern(CHUNK_BYTES + 5000, 2);
        let engine = Arc::new(engine);
        let writer = {
            let (engine, reg, a, b) = (engine.clone(), reg.clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                for i in 0..6 {
                    let data = if i % 2 == 0 { &a } else { &b };
                    engine
                        .put_object(
                            &reg,
                            "b",
                            "k",
                            ObjectMeta::default(),
                            body(data, 1 << 20),
                            &Integrity::default(),
                            None,
                        )
                        .await
                        .unwrap();
                }
            })
        };
        let mut reads = 0;
        while !writer.is_finished() || reads == 0 {
            if let Ok(m) = engine.manifest(reg.as_ref(), "b", "k").await {
                let got = read_all(&engine, &reg, &m, 0..m.size).await.unwrap();
                assert!(got == a || got == b, "a read mixed two versions");
                reads += 1;
            }
            tokio::task::yield_now().await;
        }
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn overwrite_and_delete_retire_the_old_chunks() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let data = pattern(CHUNK_BYTES + 1, 3);
        engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(chunk_registers(&reg), 2);
        engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        // Same bytes, new write: the new chunks are distinct registers and survive.
        for _ in 0..100 {
            if chunk_registers(&reg) == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(chunk_registers(&reg), 2);
        let m = engine.manifest(reg.as_ref(), "b", "k").await.unwrap();
        assert_eq!(read_all(&engine, &reg, &m, 0..m.size).await.unwrap(), data);
        engine.delete_object(&reg, "b", "k").await.unwrap();
        for _ in 0..100 {
            if chunk_registers(&reg) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(chunk_registers(&reg), 0);
        let e = engine.manifest(reg.as_ref(), "b", "k").await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchKey);
    }

    #[tokio::test]
    async fn the_index_reflects_every_completed_put_and_delete() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let all = Query {
            max_keys: 1000,
            ..Query::default()
        };
        for i in 0..40 {
            engine
                .put_object(
                    &reg,
                    "b",
                    &format!("k{i:02}"),
                    ObjectMeta::default(),
                    body(b"x", 1),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap();
        }
        let page = engine.list(reg.as_ref(), "b", &all).await.unwrap();
        assert_eq!(page.objects.len(), 40);
        assert!(page.objects.windows(2).all(|w| w[0].0 < w[1].0));
        for i in (0..40).step_by(2) {
            engine
                .delete_object(&reg, "b", &format!("k{i:02}"))
                .await
                .unwrap();
        }
        let page = engine.list(reg.as_ref(), "b", &all).await.unwrap();
        assert_eq!(page.objects.len(), 20);
        assert!(
            page.objects
                .iter()
                .all(|(k, e)| k.ends_with(['1', '3', '5', '7', '9']) && e.size == 1)
        );
        let e = engine.delete_bucket(reg.as_ref(), "b").await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketNotEmpty);
        let e = engine.list(reg.as_ref(), "nope", &all).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchBucket);
    }

    #[tokio::test]
    async fn buckets_are_created_listed_and_deleted_when_empty() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let e = engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketAlreadyOwnedByYou);
        engine
            .create_bucket(reg.as_ref(), "c", false)
            .await
            .unwrap();
        let list = engine.list_buckets(reg.as_ref()).await.unwrap();
        assert_eq!(list.keys().collect::<Vec<_>>(), ["b", "c"]);
        engine.delete_bucket(reg.as_ref(), "c").await.unwrap();
        assert!(engine.require_bucket(reg.as_ref(), "c").await.is_err());
        let e = engine
            .put_object(
                &reg,
                "c",
                "k",
                ObjectMeta::default(),
                body(b"x", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchBucket);
    }

    #[tokio::test]
    async fn bounds_are_enforced_and_leave_nothing_behind() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let too_big = vec![0u8; (20 << 20) + 1];
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&too_big, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::EntityTooLarge);
        for _ in 0..100 {
            if chunk_registers(&reg) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(chunk_registers(&reg), 0);
        let long = "k".repeat(1025);
        let e = engine
            .put_object(
                &reg,
                "b",
                &long,
                ObjectMeta::default(),
                body(b"x", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::KeyTooLongError);
        let meta = ObjectMeta {
            content_type: None,
            metadata: vec![("m".into(), "v".repeat(3000))],
            headers: Headers::default(),
            tags: Vec::new(),
        };
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                meta,
                body(b"x", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::MetadataTooLarge);
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(b"x", 1),
                &Integrity {
                    md5: Some([0; 16]),
                    ..Integrity::default()
                },
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BadDigest);
        let broken = stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(s3_error!(IncompleteBody)),
        ]);
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                broken,
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::IncompleteBody);
        assert!(engine.manifest(reg.as_ref(), "b", "k").await.is_err());
    }

    fn listed_parts(listed: &[(i32, Option<String>)]) -> Vec<ListedPart> {
        listed
            .iter()
            .map(|(number, etag)| ListedPart {
                number: *number,
                etag: etag.clone(),
                checksums: Checksums::default(),
            })
            .collect()
    }

    fn customer(byte: u8) -> CustomerKey {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = [byte; 32];
        CustomerKey::from_headers(
            Some(crate::seal::AES256),
            Some(&b64.encode(key)),
            Some(&b64.encode(md5::Md5::digest(key))),
        )
        .unwrap()
        .unwrap()
    }

    /// Whether any register holds 72 consecutive bytes of `plain`, a pattern of period 256.
    fn registers_hold(reg: &MemRegisters, plain: &[u8]) -> bool {
        let map = reg.map.lock().unwrap();
        // 72 stored bytes of the pattern hold a 64-byte window of it at an offset that is a
        // multiple of 8; its first 8 bytes are one of the pattern's 256 windows of 8.
        let prefixes: std::collections::HashSet<&[u8]> =
            (0..256).map(|at| &plain[at..at + 8]).collect();
        map.values().any(|value| {
            value
                .windows(64)
                .step_by(8)
                .any(|w| prefixes.contains(&w[..8]) && plain.windows(64).take(256).any(|p| p == w))
        })
    }

    async fn read_sealed(
        engine: &Engine,
        reg: &Arc<MemRegisters>,
        key: &str,
        customer: Option<&CustomerKey>,
        range: Option<Range<u64>>,
    ) -> S3Result<Vec<u8>> {
        let object = engine.object(reg, "b", key, customer).await?;
        let range = range.unwrap_or(0..object.manifest.size);
        let mut stream = engine.read_object(reg, &object, range).await?;
        let mut out = Vec::new();
        while let Some(piece) = stream.next().await {
            out.extend_from_slice(&piece?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn encrypted_objects_round_trip_and_leave_no_plaintext_in_the_registers() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let engine = engine.with_gateway_keys(GatewayKeys::new([("k1".to_owned(), [9; 32])]));
        let big = pattern(2 * CHUNK_BYTES + 4321, 3);
        let small = pattern(3000, 5);
        let alice = customer(1);
        let integrity = Integrity {
            algorithms: Algorithms {
                sha256: true,
                ..Algorithms::default()
            },
            ..Integrity::default()
        };
        for (asked, tag) in [
            (crate::seal::Asked::Customer(alice.clone()), "c"),
            (crate::seal::Asked::Gateway, "g"),
        ] {
            let seal = Seal::for_write(&asked, engine.gateway_keys()).unwrap();
            let key_given = matches!(asked, crate::seal::Asked::Customer(_)).then_some(&alice);
            for (name, data) in [("big", &big), ("small", &small)] {
                let key = format!("{tag}-{name}");
                let (manifest, checksum) = engine
                    .put_object(
                        &reg,
                        "b",
                        &key,
                        ObjectMeta::default(),
                        body(data, 100_000),
                        &integrity,
                        seal.as_ref(),
                    )
                    .await
                    .unwrap();
                assert!(manifest.sealed.is_some());
                assert_eq!(manifest.extra.checksums, Checksums::default());
                // SSE-C's ETag is not the plaintext's MD5; SSE-S3's is, as in S3.
                let md5: [u8; 16] = md5::Md5::digest(data).into();
                assert_eq!(manifest.etag == hex::encode(md5), tag == "g", "{key}");
                let got = read_sealed(&engine, &reg, &key, key_given, None)
                    .await
                    .unwrap();
                assert!(got == **data, "{key} reads back");
                let span = CHUNK_BYTES as u64 - 10..CHUNK_BYTES as u64 + 10;
                if data.len() > CHUNK_BYTES {
                    let got = read_sealed(&engine, &reg, &key, key_given, Some(span.clone()))
                        .await
                        .unwrap();
                    assert_eq!(got, data[span.start as usize..span.end as usize]);
                }
                // The checksums come back opened.
                let object = engine.object(&reg, "b", &key, key_given).await.unwrap();
                assert_eq!(
                    object.manifest.extra.checksums.sha256,
                    checksum.checksum_sha256
                );
            }
        }
        // SSE-C: the key is needed, and the wrong one is refused as such.
        let e = read_sealed(&engine, &reg, "c-small", None, None)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
        let e = read_sealed(&engine, &reg, "c-small", Some(&customer(2)), None)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::AccessDenied);
        let e = read_sealed(&engine, &reg, "g-small", Some(&alice), None)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
        assert!(!registers_hold(&reg, &big) && !registers_hold(&reg, &small));
        // The check can fail: the same bytes stored in the clear are found.
        engine
            .put_object(
                &reg,
                "b",
                "clear",
                ObjectMeta::default(),
                body(&small, 1000),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        assert!(registers_hold(&reg, &small));
    }

    #[tokio::test]
    async fn encrypted_uploads_and_copies_keep_their_bytes_under_the_right_key() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let engine = engine.with_gateway_keys(GatewayKeys::new([("k1".to_owned(), [9; 32])]));
        let alice = customer(1);
        let bob = customer(2);
        let sse_c = Seal::for_write(
            &crate::seal::Asked::Customer(alice.clone()),
            engine.gateway_keys(),
        )
        .unwrap();
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "mp",
                ObjectMeta::default(),
                (sse_c.as_ref(), None),
            )
            .await
            .unwrap();
        let p1 = pattern(CHUNK_BYTES + 7, 11);
        let p2 = pattern(5000, 13);
        let upload = |number: i32, data: Vec<u8>, key: Option<CustomerKey>| {
            let (engine, reg, id) = (&engine, &reg, &id);
            async move {
                engine
                    .upload_part(
                        reg,
                        "b",
                        "mp",
                        id,
                        number,
                        body(&data, 1 << 20),
                        &Integrity::default(),
                        key.as_ref(),
                    )
                    .await
            }
        };
        // A part of an SSE-C upload needs the upload's key.
        let e = upload(1, p1.clone(), None).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
        let e = upload(1, p1.clone(), Some(bob.clone())).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::AccessDenied);
        let (w1, seal1) = upload(1, p1.clone(), Some(alice.clone())).await.unwrap();
        assert!(seal1.is_some());
        let (w2, _) = upload(2, p2.clone(), Some(alice.clone())).await.unwrap();
        let listed = [
            (1, Some(hex::encode(w1.etag_md5))),
            (2, Some(hex::encode(w2.etag_md5))),
        ];
        let m = engine
            .complete_upload(
                &reg,
                "b",
                "mp",
                &id,
                &listed_parts(&listed),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        assert!(m.sealed.is_some());
        let whole = [p1.clone(), p2.clone()].concat();
        assert_eq!(
            read_sealed(&engine, &reg, "mp", Some(&alice), None)
                .await
                .unwrap(),
            whole
        );
        assert!(!registers_hold(&reg, &p1) && !registers_hold(&reg, &p2));

        // Copies: SSE-C to SSE-S3, SSE-S3 to the clear, the clear to SSE-C under another key.
        let gateway = Seal::for_write(&crate::seal::Asked::Gateway, engine.gateway_keys()).unwrap();
        let e = engine
            .copy_object(
                &reg,
                ("b", "mp", None),
                ("b", "g"),
                (None, None),
                |_| Ok(()),
                None,
                gateway.as_ref(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            *e.code(),
            S3ErrorCode::InvalidRequest,
            "the source's key is needed"
        );
        let g = engine
            .copy_object(
                &reg,
                ("b", "mp", None),
                ("b", "g"),
                (None, None),
                |_| Ok(()),
                Some(&alice),
                gateway.as_ref(),
            )
            .await
            .unwrap();
        assert_eq!(g.extra.part_sizes, m.extra.part_sizes);
        assert_eq!(
            read_sealed(&engine, &reg, "g", None, None).await.unwrap(),
            whole
        );
        let clear = engine
            .copy_object(
                &reg,
                ("b", "g", None),
                ("b", "clear"),
                (None, None),
                |_| Ok(()),
                None,
                None,
            )
            .await
            .unwrap();
        // A copy that names no encryption of an encrypted source is not stored in the clear.
        assert_eq!(
            clear.sealed.as_ref().map(|s| &s.mode),
            Some(&crate::seal::SealMode::Gateway { key: "k1".into() })
        );
        let md5: [u8; 16] = md5::Md5::digest(&whole).into();
        assert_eq!(clear.etag, hex::encode(md5), "SSE-S3 keeps the MD5 ETag");
        assert_eq!(
            read_sealed(&engine, &reg, "clear", None, None)
                .await
                .unwrap(),
            whole
        );
        let for_bob = Seal::for_write(
            &crate::seal::Asked::Customer(bob.clone()),
            engine.gateway_keys(),
        )
        .unwrap();
        engine
            .copy_object(
                &reg,
                ("b", "clear", None),
                ("b", "bob"),
                (None, None),
                |_| Ok(()),
                None,
                for_bob.as_ref(),
            )
            .await
            .unwrap();
        assert_eq!(
            read_sealed(&engine, &reg, "bob", Some(&bob), None)
                .await
                .unwrap(),
            whole
        );
        // UploadPartCopy from an SSE-C source into an SSE-S3 upload.
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "mp2",
                ObjectMeta::default(),
                (gateway.as_ref(), None),
            )
            .await
            .unwrap();
        let (part, _) = engine
            .upload_part_copy(
                &reg,
                ("b", "bob", None),
                ("b", "mp2"),
                &id,
                1,
                Some((10, 20)),
                |_| Ok(()),
                (Some(&bob), None),
            )
            .await
            .unwrap();
        let m2 = engine
            .complete_upload(
                &reg,
                "b",
                "mp2",
                &id,
                &listed_parts(&[(1, Some(hex::encode(part.etag_md5)))]),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        assert!(m2.sealed.is_some());
        assert_eq!(
            read_sealed(&engine, &reg, "mp2", None, None).await.unwrap(),
            whole[10..21]
        );
    }

    #[tokio::test]
    async fn tags_are_set_replaced_copied_and_kept_with_an_encrypted_object() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let engine = engine.with_gateway_keys(GatewayKeys::new([("k1".to_owned(), [9; 32])]));
        let tags = |pairs: &[(&str, &str)]| -> Tags {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let alice = customer(1);
        let seal = Seal::for_write(
            &crate::seal::Asked::Customer(alice.clone()),
            engine.gateway_keys(),
        )
        .unwrap();
        let meta = ObjectMeta {
            tags: tags(&[("team", "blue")]),
            ..ObjectMeta::default()
        };
        let data = pattern(CHUNK_BYTES + 5, 2);
        engine
            .put_object(
                &reg,
                "b",
                "k",
                meta,
                body(&data, 1 << 20),
                &Integrity::default(),
                seal.as_ref(),
            )
            .await
            .unwrap();
        assert_eq!(
            engine.object_tags(reg.as_ref(), "b", "k").await.unwrap(),
            tags(&[("team", "blue")])
        );
        // Tagging needs no key and changes nothing else.
        let before = engine
            .object(&reg, "b", "k", Some(&alice))
            .await
            .unwrap()
            .manifest;
        engine
            .set_object_tags(reg.as_ref(), "b", "k", tags(&[("a", "1"), ("b", "")]))
            .await
            .unwrap();
        let after = engine
            .object(&reg, "b", "k", Some(&alice))
            .await
            .unwrap()
            .manifest;
        assert_eq!(after.tags, tags(&[("a", "1"), ("b", "")]));
        assert_eq!(
            Manifest {
                tags: Vec::new(),
                ..after.clone()
            },
            Manifest {
                tags: Vec::new(),
                ..before
            }
        );
        assert_eq!(
            read_sealed(&engine, &reg, "k", Some(&alice), None)
                .await
                .unwrap(),
            data
        );
        // A copy keeps the source's tags unless told to replace them.
        engine
            .copy_object(
                &reg,
                ("b", "k", None),
                ("b", "kept"),
                (None, None),
                |_| Ok(()),
                Some(&alice),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            engine.object_tags(reg.as_ref(), "b", "kept").await.unwrap(),
            after.tags
        );
        engine
            .copy_object(
                &reg,
                ("b", "k", None),
                ("b", "replaced"),
                (None, Some(tags(&[("x", "y")]))),
                |_| Ok(()),
                Some(&alice),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            engine
                .object_tags(reg.as_ref(), "b", "replaced")
                .await
                .unwrap(),
            tags(&[("x", "y")])
        );
        // An overwrite brings its own tags; deleting them leaves none.
        engine
            .put_object(
                &reg,
                "b",
                "kept",
                ObjectMeta::default(),
                body(b"v", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        assert!(
            engine
                .object_tags(reg.as_ref(), "b", "kept")
                .await
                .unwrap()
                .is_empty()
        );
        engine
            .set_object_tags(reg.as_ref(), "b", "k", Tags::new())
            .await
            .unwrap();
        assert!(
            engine
                .object_tags(reg.as_ref(), "b", "k")
                .await
                .unwrap()
                .is_empty()
        );
        // S3's limits, and a missing object.
        let many: Tags = (0..11).map(|i| (format!("k{i}"), String::new())).collect();
        for bad in [
            many,
            tags(&[("", "v")]),
            tags(&[("a", "1"), ("a", "2")]),
            tags(&[("a", "x&y")]),
        ] {
            let e = engine
                .set_object_tags(reg.as_ref(), "b", "k", bad)
                .await
                .unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidTag);
        }
        let e = engine
            .set_object_tags(reg.as_ref(), "b", "none", tags(&[("a", "1")]))
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchKey);
        // Bucket tags.
        assert!(
            engine
                .bucket_tags(reg.as_ref(), "b")
                .await
                .unwrap()
                .is_empty()
        );
        engine
            .set_bucket_tags(reg.as_ref(), "b", tags(&[("cost", "7")]))
            .await
            .unwrap();
        assert_eq!(
            engine.bucket_tags(reg.as_ref(), "b").await.unwrap(),
            tags(&[("cost", "7")])
        );
        assert!(
            engine
                .list(
                    reg.as_ref(),
                    "b",
                    &crate::index::Query {
                        prefix: "",
                        delimiter: None,
                        marker: None,
                        max_keys: 10,
                    }
                )
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn an_upload_with_a_checksum_checks_every_part_and_gets_the_composite_one() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "mp",
                ObjectMeta::default(),
                (None, Some(PartChecksum::Sha256)),
            )
            .await
            .unwrap();
        let mut listed = Vec::new();
        for (number, data) in [(1, pattern(3000, 1)), (2, pattern(100, 2))] {
            // The part's request names no checksum: the upload's is computed anyway.
            let (written, _) = engine
                .upload_part(
                    &reg,
                    "b",
                    "mp",
                    &id,
                    number,
                    body(&data, 700),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap();
            let sha = written
                .checksum
                .checksum_sha256
                .clone()
                .expect("hashed with the upload's algorithm");
            listed.push(ListedPart {
                number,
                etag: Some(hex::encode(written.etag_md5)),
                checksums: Checksums {
                    sha256: Some(sha),
                    ..Checksums::default()
                },
            });
        }
        let complete = |listed: Vec<ListedPart>, whole: Checksums| {
            let (engine, reg, id) = (&engine, &reg, &id);
            async move {
                engine
                    .complete_upload(reg, "b", "mp", id, &listed, (&whole, None))
                    .await
            }
        };
        let mut wrong = listed.clone();
        wrong[1].checksums.sha256 = listed[0].checksums.sha256.clone();
        assert_eq!(
            *complete(wrong, Checksums::default())
                .await
                .unwrap_err()
                .code(),
            S3ErrorCode::InvalidPart
        );
        let mut missing = listed.clone();
        missing[0].checksums = Checksums::default();
        assert_eq!(
            *complete(missing, Checksums::default())
                .await
                .unwrap_err()
                .code(),
            S3ErrorCode::InvalidRequest
        );
        let mut other = listed.clone();
        other[0].checksums.crc32 = Some("AAAAAA==".into());
        assert_eq!(
            *complete(other, Checksums::default())
                .await
                .unwrap_err()
                .code(),
            S3ErrorCode::InvalidPart
        );
        let bad_whole = Checksums {
            sha256: Some("AAAA-2".into()),
            ..Checksums::default()
        };
        assert_eq!(
            *complete(listed.clone(), bad_whole)
                .await
                .unwrap_err()
                .code(),
            S3ErrorCode::BadDigest
        );
        // SHA-256 over the two binary part digests, then -2.
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut digests = Vec::new();
        for part in &listed {
            digests.extend(b64.decode(part.checksums.sha256.as_ref().unwrap()).unwrap());
        }
        let mut hasher = Algorithms {
            sha256: true,
            ..Algorithms::default()
        }
        .hasher();
        hasher.update(&digests);
        let expected = format!("{}-2", hasher.finalize().checksum_sha256.unwrap());
        let whole = Checksums {
            sha256: Some(expected.clone()),
            ..Checksums::default()
        };
        let m = complete(listed, whole).await.unwrap();
        assert_eq!(m.extra.checksums.sha256.as_deref(), Some(expected.as_str()));
    }

    #[tokio::test]
    async fn encrypted_uploads_keep_their_part_checksums_sealed() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let engine = engine.with_gateway_keys(GatewayKeys::new([("k1".to_owned(), [9; 32])]));
        let alice = customer(1);
        let data = pattern(3000, 7);
        let sha = |data: &[u8]| {
            let mut hasher = Algorithms {
                sha256: true,
                ..Algorithms::default()
            }
            .hasher();
            hasher.update(data);
            hasher.finalize().checksum_sha256.unwrap()
        };
        let upload_bytes = |id: &str| reg.map.lock().unwrap()[&layout::upload_key(id)].clone();
        let part_bytes = |id: &str| reg.map.lock().unwrap()[&layout::part_key(id, 1)].clone();
        for asked in [
            crate::seal::Asked::Nothing,
            crate::seal::Asked::Gateway,
            crate::seal::Asked::Customer(alice.clone()),
        ] {
            let seal = Seal::for_write(&asked, engine.gateway_keys()).unwrap();
            let key_given = matches!(asked, crate::seal::Asked::Customer(_)).then_some(&alice);
            let id = engine
                .create_upload(
                    reg.as_ref(),
                    "b",
                    "mp",
                    ObjectMeta::default(),
                    (seal.as_ref(), Some(PartChecksum::Sha256)),
                )
                .await
                .unwrap();
            let (written, _) = engine
                .upload_part(
                    &reg,
                    "b",
                    "mp",
                    &id,
                    1,
                    body(&data, 500),
                    &Integrity::default(),
                    key_given,
                )
                .await
                .unwrap();
            assert_eq!(
                written.checksum.checksum_sha256.as_deref(),
                Some(sha(&data).as_str())
            );
            // The part's record names its SHA-256 only when the upload is not encrypted.
            let holds = String::from_utf8_lossy(&part_bytes(&id)).contains(&sha(&data));
            assert_eq!(holds, seal.is_none(), "{asked:?}");
            let listed = vec![ListedPart {
                number: 1,
                etag: Some(hex::encode(written.etag_md5)),
                checksums: Checksums {
                    sha256: Some(sha(&data)),
                    ..Checksums::default()
                },
            }];
            if key_given.is_some() {
                // SSE-C: the part checksums open only with the key.
                let e = engine
                    .complete_upload(&reg, "b", "mp", &id, &listed, (&Checksums::default(), None))
                    .await
                    .unwrap_err();
                assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
            }
            let m = engine
                .complete_upload(
                    &reg,
                    "b",
                    "mp",
                    &id,
                    &listed,
                    (&Checksums::default(), key_given),
                )
                .await
                .unwrap();
            let composite = m
                .extra
                .checksums
                .sha256
                .clone()
                .expect("the composite checksum");
            assert!(composite.ends_with("-1"));
            let object = engine.object(&reg, "b", "mp", key_given).await.unwrap();
            assert_eq!(
                object.manifest.extra.checksums.sha256,
                Some(composite.clone())
            );
            let stored = reg.map.lock().unwrap()[&layout::object_key("b", "mp")].clone();
            assert_eq!(
                String::from_utf8_lossy(&stored).contains(&composite),
                seal.is_none(),
                "{asked:?}"
            );
        }
        // An upload with no checksum and no parts is in format 2.
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "plain",
                ObjectMeta::default(),
                (None, None),
            )
            .await
            .unwrap();
        assert_eq!(upload_bytes(&id)[0], 2, "format 2");
        engine
            .upload_part(
                &reg,
                "b",
                "plain",
                &id,
                1,
                body(&data, 500),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(upload_bytes(&id)[0], 3, "format 3: it names its parts");
        // The record does not grow with its parts.
        let one = upload_bytes(&id).len();
        for number in 2..=60 {
            engine
                .upload_part(
                    &reg,
                    "b",
                    "plain",
                    &id,
                    number,
                    body(b"p", 1),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap();
        }
        assert_eq!(upload_bytes(&id).len(), one);
        let (_, parts, truncated) = engine
            .list_parts(reg.as_ref(), "b", "plain", &id, 10, 20)
            .await
            .unwrap();
        assert_eq!(
            parts.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            (11..=30).collect::<Vec<_>>()
        );
        assert!(truncated);
        // Aborting removes the parts' registers and chunks with the record.
        engine.abort_upload(&reg, "b", "plain", &id).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let left = reg
            .map
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(&layout::upload_key(&id)))
            .count();
        assert_eq!(left, 0);
        // Two objects under one customer key cannot be linked by their records.
        let modes: Vec<_> = (0..2)
            .map(|_| {
                Seal::for_write(
                    &crate::seal::Asked::Customer(alice.clone()),
                    engine.gateway_keys(),
                )
                .unwrap()
                .unwrap()
                .mode()
                .clone()
            })
            .collect();
        assert_ne!(modes[0], modes[1]);
    }

    #[tokio::test]
    async fn an_upload_begun_by_an_older_gateway_completes() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "old",
                ObjectMeta::default(),
                (None, None),
            )
            .await
            .unwrap();
        let (p1, p2) = (pattern(2000, 3), pattern(1000, 4));
        let (w1, _) = engine
            .upload_part(
                &reg,
                "b",
                "old",
                &id,
                1,
                body(&p1, 300),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        // What a gateway before format 3 wrote: the part inside a format-2 record.
        let mut record = engine.upload(reg.as_ref(), "b", "old", &id).await.unwrap();
        let stored: Option<StoredPart> = reg
            .get(&layout::part_key(&id, 1))
            .await
            .unwrap()
            .map(|bytes| layout::decode_part(&bytes).unwrap());
        let stored: StoredPart = stored.unwrap();
        record.parts.insert(1, stored.part);
        record.more = layout::UploadMore::default();
        reg.put(
            &layout::upload_key(&id),
            layout::encode_extended("upload", &record).unwrap(),
        )
        .await
        .unwrap();
        reg.delete(&layout::part_key(&id, 1)).await.unwrap();
        assert_eq!(reg.map.lock().unwrap()[&layout::upload_key(&id)][0], 2);
        let (w2, _) = engine
            .upload_part(
                &reg,
                "b",
                "old",
                &id,
                2,
                body(&p2, 300),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        let (_, parts, _) = engine
            .list_parts(reg.as_ref(), "b", "old", &id, 0, 10)
            .await
            .unwrap();
        assert_eq!(parts.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2]);
        let listed = listed_parts(&[
            (1, Some(hex::encode(w1.etag_md5))),
            (2, Some(hex::encode(w2.etag_md5))),
        ]);
        let m = engine
            .complete_upload(
                &reg,
                "b",
                "old",
                &id,
                &listed,
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        assert_eq!(
            read_all(&engine, &reg, &m, 0..m.size).await.unwrap(),
            [p1, p2].concat()
        );
    }

    #[tokio::test]
    async fn multipart_uploads_concatenate_parts_with_s3_etags() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let id = engine
            .create_upload(reg.as_ref(), "b", "mp", ObjectMeta::default(), (None, None))
            .await
            .unwrap();
        let p1 = pattern(CHUNK_BYTES + 3, 1);
        let p2 = pattern(1000, 2);
        let (listed, _) = engine
            .list_uploads(reg.as_ref(), "b", "", None, 10)
            .await
            .unwrap();
        assert_eq!(listed, [("mp".to_owned(), id.clone(), listed[0].2)]);
        let e = engine.delete_bucket(reg.as_ref(), "b").await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketNotEmpty);
        let md1 = engine
            .upload_part(
                &reg,
                "b",
                "mp",
                &id,
                1,
                body(&p1, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0
            .md5;
        // A part uploaded twice: the second one counts.
        engine
            .upload_part(
                &reg,
                "b",
                "mp",
                &id,
                2,
                body(b"old", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        let md2 = engine
            .upload_part(
                &reg,
                "b",
                "mp",
                &id,
                2,
                body(&p2, 100),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0
            .md5;
        for bad in [0, 10_001, -1] {
            let e = engine
                .upload_part(
                    &reg,
                    "b",
                    "mp",
                    &id,
                    bad,
                    body(b"x", 1),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument);
        }
        let (_, parts, truncated) = engine
            .list_parts(reg.as_ref(), "b", "mp", &id, 0, 1)
            .await
            .unwrap();
        assert_eq!((parts.len(), truncated), (1, true));
        let e = engine
            .complete_upload(
                &reg,
                "b",
                "mp",
                &id,
                &listed_parts(&[(2, None), (1, None)]),
                (&Checksums::default(), None),
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidPartOrder);
        let e = engine
            .complete_upload(
                &reg,
                "b",
                "mp",
                &id,
                &listed_parts(&[(1, Some("\"00\"".into()))]),
                (&Checksums::default(), None),
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidPart);
        let listed = [
            (1, Some(format!("\"{}\"", hex::encode(md1)))),
            (2, Some(hex::encode(md2))),
        ];
        let m = engine
            .complete_upload(
                &reg,
                "b",
                "mp",
                &id,
                &listed_parts(&listed),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        assert_eq!(m.etag, layout::multipart_etag(&[md1, md2]));
        assert!(m.etag.ends_with("-2"));
        let got = read_all(&engine, &reg, &m, 0..m.size).await.unwrap();
        assert_eq!(got, [p1, p2].concat());
        let (listed, _) = engine
            .list_uploads(reg.as_ref(), "b", "", None, 10)
            .await
            .unwrap();
        assert!(listed.is_empty());
        let e = engine.abort_upload(&reg, "b", "mp", &id).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchUpload);
        let e = engine
            .upload_part(
                &reg,
                "b",
                "mp",
                "zz",
                1,
                body(b"x", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchUpload);
    }

    #[tokio::test]
    async fn upload_part_copy_copies_a_range_that_outlives_its_source() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let source = pattern(2 * CHUNK_BYTES + 10, 7);
        engine
            .put_object(
                &reg,
                "b",
                "src",
                ObjectMeta::default(),
                body(&source, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        let id = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "dst",
                ObjectMeta::default(),
                (None, None),
            )
            .await
            .unwrap();
        let copy = |part: i32, range: Option<(u64, u64)>| {
            let (engine, reg, id) = (&engine, &reg, id.clone());
            async move {
                engine
                    .upload_part_copy(
                        reg,
                        ("b", "src", None),
                        ("b", "dst"),
                        &id,
                        part,
                        range,
                        |_| Ok(()),
                        (None, None),
                    )
                    .await
            }
        };
        // Across a chunk boundary, then the whole object.
        let first = (CHUNK_BYTES as u64 - 5, CHUNK_BYTES as u64 + 4);
        let p1 = copy(1, Some(first)).await.unwrap();
        let p2 = copy(2, None).await.unwrap();
        for (range, code) in [
            ((5, 4), S3ErrorCode::InvalidArgument),
            ((0, source.len() as u64), S3ErrorCode::InvalidArgument),
        ] {
            let e = copy(3, Some(range)).await.unwrap_err();
            assert_eq!(*e.code(), code, "{range:?}");
        }
        let e = engine
            .upload_part_copy(
                &reg,
                ("b", "none", None),
                ("b", "dst"),
                &id,
                3,
                None,
                |_| Ok(()),
                (None, None),
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchKey);
        let e = engine
            .upload_part_copy(
                &reg,
                ("b", "src", None),
                ("b", "dst"),
                "abcd",
                3,
                None,
                |_| Ok(()),
                (None, None),
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchUpload);
        // The source goes away; the parts own their bytes.
        engine.delete_object(&reg, "b", "src").await.unwrap();
        let listed = [
            (1, Some(hex::encode(p1.0.md5))),
            (2, Some(hex::encode(p2.0.md5))),
        ];
        let m = engine
            .complete_upload(
                &reg,
                "b",
                "dst",
                &id,
                &listed_parts(&listed),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        let got = read_all(&engine, &reg, &m, 0..m.size).await.unwrap();
        let expected = [&source[first.0 as usize..=first.1 as usize], &source[..]].concat();
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn parts_below_the_minimum_are_refused_except_the_last() {
        let engine = Engine::new(Limits {
            part_bytes_min: 10,
            ..Limits::default()
        });
        let reg = Arc::new(MemRegisters::default());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .unwrap();
        let id = engine
            .create_upload(reg.as_ref(), "b", "k", ObjectMeta::default(), (None, None))
            .await
            .unwrap();
        engine
            .upload_part(
                &reg,
                "b",
                "k",
                &id,
                1,
                body(b"short", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        engine
            .upload_part(
                &reg,
                "b",
                "k",
                &id,
                2,
                body(b"short", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap();
        let e = engine
            .complete_upload(
                &reg,
                "b",
                "k",
                &id,
                &listed_parts(&[(1, None), (2, None)]),
                (&Checksums::default(), None),
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::EntityTooSmall);
        engine
            .complete_upload(
                &reg,
                "b",
                "k",
                &id,
                &listed_parts(&[(2, None)]),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn copies_own_their_chunks() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let data = pattern(CHUNK_BYTES + 9, 4);
        let meta = ObjectMeta {
            content_type: Some("text/x".into()),
            metadata: vec![("a".into(), "1".into())],
            headers: Headers::default(),
            tags: Vec::new(),
        };
        let src = engine
            .put_object(
                &reg,
                "b",
                "src",
                meta,
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0;
        let copy = engine
            .copy_object(
                &reg,
                ("b", "src", None),
                ("b", "dst"),
                (None, None),
                |_| Ok(()),
                None,
                None,
            )
            .await
            .unwrap();
        assert_eq!(copy.etag, src.etag);
        assert_eq!(copy.content_type.as_deref(), Some("text/x"));
        assert_eq!(copy.metadata, src.metadata);
        engine.delete_object(&reg, "b", "src").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let m = engine.manifest(reg.as_ref(), "b", "dst").await.unwrap();
        assert_eq!(read_all(&engine, &reg, &m, 0..m.size).await.unwrap(), data);
    }

    #[tokio::test]
    async fn a_failed_index_write_never_costs_the_object_its_chunks() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let data = pattern(CHUNK_BYTES + 77, 5);
        *reg.fail_puts.lock().unwrap() = Some(b"s3/i/".to_vec());
        let e = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::ServiceUnavailable);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The manifest was written, so its chunks must still be there.
        let m = engine.manifest(reg.as_ref(), "b", "k").await.unwrap();
        assert_eq!(read_all(&engine, &reg, &m, 0..m.size).await.unwrap(), data);
        // A manifest write that fails may still take effect later: its chunks stay too.
        *reg.fail_puts.lock().unwrap() = Some(b"s3/o/".to_vec());
        let before = chunk_registers(&reg);
        engine
            .put_object(
                &reg,
                "b",
                "k2",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(chunk_registers(&reg), before + 2);
    }

    #[test]
    fn cluster_failures_map_to_s3_errors_naming_the_cause() {
        let unavailable = bulwark_client::ClientError::Unavailable {
            deadline: Duration::from_secs(30),
            answered: 2,
            quorum: 3,
            n: 4,
            unreachable: vec![],
            stalled: None,
        };
        let e = store_error(StoreError::from(unavailable));
        assert_eq!(*e.code(), S3ErrorCode::ServiceUnavailable);
        assert!(
            e.message().unwrap().contains("2 of 4 nodes answered"),
            "{e}"
        );
        let denied = bulwark_client::ClientError::NotWriter {
            name: "reader".into(),
        };
        let e = store_error(StoreError::from(denied));
        assert_eq!(*e.code(), S3ErrorCode::AccessDenied);
        assert!(e.message().unwrap().contains("reader"), "{e}");
        let bug = bulwark_client::ClientError::Protocol("oops".into());
        assert_eq!(
            *store_error(StoreError::from(bug)).code(),
            S3ErrorCode::InternalError
        );
        let e = layout_error(LayoutError::ChunkMismatch {
            write: [0; 16],
            hash: [1; 32],
        });
        assert_eq!(*e.code(), S3ErrorCode::InternalError);
    }

    #[tokio::test]
    async fn reads_stream_through_a_single_buffer() {
        let engine = Engine::new(Limits {
            read_buffers: 1,
            chunk_buffers: 1,
            ..Limits::default()
        });
        let reg = Arc::new(MemRegisters::default());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .unwrap();
        let data = pattern(3 * CHUNK_BYTES + 1, 6);
        let m = engine
            .put_object(
                &reg,
                "b",
                "k",
                ObjectMeta::default(),
                body(&data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap()
            .0;
        let (a, b) = tokio::join!(
            read_all(&engine, &reg, &m, 0..m.size),
            read_all(&engine, &reg, &m, 1..m.size - 1)
        );
        assert_eq!(a.unwrap(), data);
        assert_eq!(b.unwrap(), &data[1..data.len() - 1]);
    }

    /// A causal bucket: objects are keys of its volume (no register holds any), listed in the
    /// volume's key order with no index, concurrent versions all kept, the newest object
    /// returned and the others named, and what it does not serve refused.
    #[tokio::test]
    async fn causal_buckets_keep_concurrent_versions_and_list_from_the_volume() {
        use crate::causal::OtherKind;
        use crate::store::{CausalValue, CausalValues};
        let engine = engine(Duration::ZERO);
        let reg = Arc::new(MemRegisters::default());
        engine.create_bucket(reg.as_ref(), "c", true).await.unwrap();
        assert!(reg.causal_volumes.lock().unwrap().contains("c"));
        let e = engine
            .create_bucket(reg.as_ref(), "c", false)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketAlreadyExists);
        let e = engine
            .create_bucket(reg.as_ref(), "c", true)
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketAlreadyOwnedByYou);

        let big = pattern(CHUNK_BYTES + 100, 3);
        let objects: [(&str, &[u8]); 3] = [("a/1", b"one"), ("a/2", &big), ("b", b"bee")];
        for (key, data) in objects {
            engine
                .put_object(
                    &reg,
                    "c",
                    key,
                    ObjectMeta::default(),
                    body(data, 4096),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap();
        }
        assert!(
            reg.map
                .lock()
                .unwrap()
                .keys()
                .all(|k| k.starts_with(b"s3/b/") || k.as_slice() == b"s3/buckets"),
            "nothing but the bucket's record in registers"
        );
        let object = engine.object(&reg, "c", "a/2", None).await.unwrap();
        assert_eq!(object.manifest.data.chunks().len(), 2);
        let mut stream = engine
            .read_object(&reg, &object, 0..object.manifest.size)
            .await
            .unwrap();
        let mut read = Vec::new();
        while let Some(piece) = stream.next().await {
            read.extend_from_slice(&piece.unwrap());
        }
        assert_eq!(read, big);

        let query = |prefix, delimiter, marker, max_keys| Query {
            prefix,
            delimiter,
            marker,
            max_keys,
        };
        let page = engine
            .list(reg.as_ref(), "c", &query("", Some("/"), None, 10))
            .await
            .unwrap();
        assert_eq!(page.prefixes, vec!["a/".to_string()]);
        assert_eq!(page.objects.len(), 1);
        assert_eq!(
            (page.objects[0].0.as_str(), page.objects[0].1.size),
            ("b", 3)
        );
        let page = engine
            .list(reg.as_ref(), "c", &query("a/", None, None, 1))
            .await
            .unwrap();
        assert_eq!(page.objects[0].0, "a/1");
        assert!(page.truncated);
        assert_eq!(page.next_marker.as_deref(), Some("a/1"));
        let page = engine
            .list(reg.as_ref(), "c", &query("a/", None, Some("a/1"), 1))
            .await
            .unwrap();
        assert_eq!(page.objects[0].0, "a/2");
        assert_eq!(page.objects[0].1.size, big.len() as u64);
        assert!(!page.truncated);

        // Another writer's concurrent version, and a concurrent delete: all kept; the newest
        // object is returned, the others named, the delete hides nothing.
        let theirs = Manifest {
            version: None,
            key: "b".into(),
            size: 3,
            etag: "theirs".into(),
            content_type: None,
            metadata: Vec::new(),
            last_modified_ms: 1,
            parts: 0,
            data: Data::Inline(Bytes::from_static(b"zzz")),
            extra: ObjectExtra::default(),
            sealed: None,
            tags: Vec::new(),
        };
        let theirs = layout::encode_extended("manifest", &theirs).unwrap();
        let ours = engine.object(&reg, "c", "b", None).await.unwrap().manifest;
        {
            let mut causal = reg.causal.lock().unwrap();
            let values: &mut CausalValues = causal.get_mut(&("c".into(), b"o/b".to_vec())).unwrap();
            let clock = values.versions[0].clock;
            values.versions.insert(
                0,
                CausalValue {
                    writer: "zed".into(),
                    clock,
                    value: Some(theirs),
                },
            );
            values.versions.insert(
                0,
                CausalValue {
                    writer: "eve".into(),
                    clock: clock + 1,
                    value: None,
                },
            );
        }
        let object = engine.object(&reg, "c", "b", None).await.unwrap();
        assert_eq!(object.manifest.etag, "theirs");
        let (_, others) = object.causal.as_ref().unwrap();
        let kinds: Vec<&OtherKind> = others.iter().map(|o| &o.kind).collect();
        assert_eq!(
            kinds,
            vec![&OtherKind::Deleted, &OtherKind::Object(ours.etag.clone())]
        );
        let page = engine
            .list(reg.as_ref(), "c", &query("b", None, None, 10))
            .await
            .unwrap();
        assert_eq!(
            page.objects[0].1.etag, "theirs",
            "a listing shows what GET returns"
        );

        // Deleting supersedes every version seen.
        engine.delete_object(&reg, "c", "b").await.unwrap();
        let e = engine.object(&reg, "c", "b", None).await.err().unwrap();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchKey);

        // What a causal bucket does not serve is refused, not half done.
        let e = engine
            .copy_object(
                &reg,
                ("c", "a/1", None),
                ("c", "copy"),
                (None, None),
                |_| Ok(()),
                None,
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NotImplemented);
        let e = engine
            .create_upload(reg.as_ref(), "c", "k", ObjectMeta::default(), (None, None))
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NotImplemented);
        let long = "k".repeat(crate::causal::KEY_BYTES_MAX + 1);
        let e = engine
            .put_object(
                &reg,
                "c",
                &long,
                ObjectMeta::default(),
                body(b"x", 1),
                &Integrity::default(),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::KeyTooLongError);

        // Empty only once every object is deleted.
        let e = engine.delete_bucket(reg.as_ref(), "c").await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketNotEmpty);
        engine.delete_object(&reg, "c", "a/1").await.unwrap();
        engine.delete_object(&reg, "c", "a/2").await.unwrap();
        engine.delete_bucket(reg.as_ref(), "c").await.unwrap();
        assert!(engine.require_bucket(reg.as_ref(), "c").await.is_err());
    }

    /// A bucket on a store that keeps chunks as content-hash objects, as a cluster does.
    pub(super) async fn setup_objects(grace: Duration) -> (Engine, Arc<MemRegisters>) {
        let engine = engine(grace);
        let reg = Arc::new(MemRegisters::with_content_chunks());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .unwrap();
        (engine, reg)
    }

    #[tokio::test]
    async fn chunks_kept_as_content_objects_round_trip_and_go_with_their_object() {
        let (engine, reg) = setup_objects(Duration::ZERO).await;
        let data = pattern(2 * CHUNK_BYTES + 777, 3);
        let put = |data: Vec<u8>| {
            let (engine, reg) = (&engine, &reg);
            async move {
                engine
                    .put_object(
                        reg,
                        "b",
                        "big",
                        ObjectMeta::default(),
                        body(&data, 65536),
                        &Integrity::default(),
                        None,
                    )
                    .await
                    .unwrap()
                    .0
            }
        };
        let m = put(data.clone()).await;
        // Every chunk is an object, none in a register; chunks of one write with the same bytes
        // (the pattern repeats) are one object.
        let objects = |m: &Manifest| -> std::collections::BTreeSet<[u8; 32]> {
            m.data
                .chunks()
                .iter()
                .filter_map(|chunk| chunk.object)
                .collect()
        };
        assert_eq!(chunk_registers(&reg), 0);
        assert_eq!(m.data.chunks().len(), 3);
        assert!(m.data.chunks().iter().all(|chunk| chunk.object.is_some()));
        assert_eq!(reg.objects.lock().unwrap().len(), objects(&m).len());
        // The record names the objects (format 4) and reads back with them.
        let stored = reg.map.lock().unwrap()[&layout::object_key("b", "big")].clone();
        assert_eq!(stored[0], 4);
        let m = engine.manifest(reg.as_ref(), "b", "big").await.unwrap();
        assert!(m.data.chunks().iter().all(|chunk| chunk.object.is_some()));
        assert_eq!(read_all(&engine, &reg, &m, 0..m.size).await.unwrap(), data);
        let across = (CHUNK_BYTES as u64 - 5)..(CHUNK_BYTES as u64 + 5);
        assert_eq!(
            read_all(&engine, &reg, &m, across.clone()).await.unwrap(),
            &data[across.start as usize..across.end as usize]
        );
        // An object whose bytes are not the chunk's fails the chunk's check.
        let victim = m.data.chunks()[1].object.unwrap();
        let tampered = {
            let mut objects = reg.objects.lock().unwrap();
            let original = objects[&victim].clone();
            let mut bad = original.to_vec();
            *bad.last_mut().unwrap() ^= 1;
            objects.insert(victim, Bytes::from(bad));
            original
        };
        assert!(read_all(&engine, &reg, &m, 0..m.size).await.is_err());
        reg.objects.lock().unwrap().insert(victim, tampered);
        // The same bytes written again are other objects; the replaced ones are deleted.
        let again = put(data.clone()).await;
        let old: Vec<[u8; 32]> = m.data.chunks().iter().filter_map(|c| c.object).collect();
        let new: Vec<[u8; 32]> = again
            .data
            .chunks()
            .iter()
            .filter_map(|c| c.object)
            .collect();
        assert!(old.iter().all(|id| !new.contains(id)));
        let gone = async {
            while old
                .iter()
                .any(|id| reg.objects.lock().unwrap().contains_key(id))
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the replaced version's objects are deleted");
        assert_eq!(reg.objects.lock().unwrap().len(), objects(&again).len());
        // A copy has objects of its own, and outlives its source.
        let copy = engine
            .copy_object(
                &reg,
                ("b", "big", None),
                ("b", "copy"),
                (None, None),
                |_| Ok(()),
                None,
                None,
            )
            .await
            .unwrap();
        assert!(
            copy.data
                .chunks()
                .iter()
                .all(|chunk| chunk.object.is_some())
        );
        engine.delete_object(&reg, "b", "big").await.unwrap();
        let copy = engine.manifest(reg.as_ref(), "b", "copy").await.unwrap();
        assert_eq!(
            read_all(&engine, &reg, &copy, 0..copy.size).await.unwrap(),
            data
        );
    }

    #[tokio::test]
    async fn parts_kept_as_content_objects_complete_into_one_object() {
        let (engine, reg) = setup_objects(Duration::ZERO).await;
        let id = engine
            .create_upload(reg.as_ref(), "b", "mp", ObjectMeta::default(), (None, None))
            .await
            .unwrap();
        let p1 = pattern(CHUNK_BYTES + 10, 1);
        let p2 = pattern(5_000, 2);
        let mut listed = Vec::new();
        for (number, data) in [(1, &p1), (2, &p2)] {
            let (written, _) = engine
                .upload_part(
                    &reg,
                    "b",
                    "mp",
                    &id,
                    number,
                    body(data, 1 << 20),
                    &Integrity::default(),
                    None,
                )
                .await
                .unwrap();
            listed.push((number, Some(hex::encode(written.etag_md5))));
        }
        let part = reg.map.lock().unwrap()[&layout::part_key(&id, 1)].clone();
        assert_eq!(part[0], 4, "a part whose chunks are objects is in format 4");
        let m = engine
            .complete_upload(
                &reg,
                "b",
                "mp",
                &id,
                &listed_parts(&listed),
                (&Checksums::default(), None),
            )
            .await
            .unwrap();
        assert!(m.data.chunks().iter().all(|chunk| chunk.object.is_some()));
        let m = engine.manifest(reg.as_ref(), "b", "mp").await.unwrap();
        assert_eq!(
            read_all(&engine, &reg, &m, 0..m.size).await.unwrap(),
            [p1, p2].concat()
        );
    }
}
