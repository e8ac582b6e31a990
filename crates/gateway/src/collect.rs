//! The collector of chunks no object names: the content-hash objects a body write left behind
//! when it never got as far as its manifest or part record (a gateway that crashed mid-upload,
//! a manifest write that timed out, a replaced version whose delayed deletion died with its
//! gateway).
//!
//! Every chunk object the gateway writes says when it was written and which object or upload
//! part it belongs to ([`crate::layout::ChunkHeader`]). A chunk belongs to one body write, so to
//! one object or part: once that no longer names it, nothing does. The collector:
//!
//! 1. gathers the objects every listed object and upload part names (cheap: manifests only), and
//!    passes over those;
//! 2. reads each other object the cluster's members list. One without the gateway's marker is
//!    not the gateway's (anyone's `bulwark content put`, or a chunk of a release before headers)
//!    and is never touched. One younger than `min_age` may belong to a write still in flight
//!    and is kept: the rule is that no body write lasts longer than `min_age`. The others become
//!    candidates unless their origin names them (an object whose index entry was never written
//!    is found so);
//! 3. waits `settle`, at least the gateway's chunk grace, so that a GET that read a replaced
//!    manifest just before the first pass has finished, then asks each candidate's origin
//!    again, and deletes those still named by nothing.
//!
//! A member's listing is a hint: a faulty member may list ids nobody wrote (a read finds
//! nothing) or someone else's objects (no marker, or an origin that names them). Whatever fails
//! to read is kept.
//!
//! What it trusts beyond that: a record write that failed more than `min_age` ago never takes
//! effect later. A register write that timed out after reaching a few nodes could (on an ABD
//! volume, through a later read quorum that includes one of them; or through frames a live
//! gateway kept queued to a node cut off that long); its object would then fail to read, its
//! chunks checked by hash, rather than return other bytes.

use crate::engine::{Engine, now_ms};
use crate::layout::{self, ChunkOrigin};
use crate::store::Registers;
use s3s::S3Result;
use std::sync::Arc;
use std::time::Duration;

/// Objects listed per page.
const PAGE: usize = 1024;

/// How a collection runs.
#[derive(Clone, Copy, Debug)]
pub struct Collect {
    /// Chunks written less than this long ago are kept: longer than any body write may last.
    pub min_age: Duration,
    /// The wait between finding a candidate and deleting it: at least the gateway's chunk grace.
    pub settle: Duration,
    /// Only count what would be deleted.
    pub dry_run: bool,
}

/// What a collection found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Objects the members listed.
    pub listed: u64,
    /// Of them, named by a listed object or upload part.
    pub named: u64,
    /// Not the gateway's chunks (no marker), gone by the time they were read, or unreadable.
    pub not_chunks: u64,
    /// Chunks younger than the minimum age.
    pub young: u64,
    /// Chunks their origin named although no listing did (an object not in its index).
    pub named_by_origin: u64,
    /// Chunks named by nothing, deleted (or, in a dry run, to be deleted).
    pub deleted: u64,
    /// Their bytes, as stored.
    pub deleted_bytes: u64,
}

/// Runs one collection over the cluster `reg` stores into.
pub async fn collect<R: Registers>(
    engine: &Engine,
    reg: &Arc<R>,
    options: Collect,
) -> S3Result<Collected> {
    let mut collected = Collected::default();
    let named = engine.named_objects(reg.as_ref()).await?;
    let mut candidates: Vec<([u8; 32], ChunkOrigin, u64)> = Vec::new();
    let mut after = None;
    loop {
        let (ids, more) = reg
            .content_objects(after, PAGE)
            .await
            .map_err(crate::engine::store_error)?;
        for id in &ids {
            collected.listed += 1;
            if named.contains(id) {
                collected.named += 1;
                continue;
            }
            let Some((origin, written_ms, bytes)) = chunk_origin(reg.as_ref(), *id).await else {
                collected.not_chunks += 1;
                continue;
            };
            let age = Duration::from_millis(now_ms().saturating_sub(written_ms));
            if age < options.min_age {
                collected.young += 1;
                continue;
            }
            if engine
                .origin_names(reg.as_ref(), &origin, *id)
                .await
                .unwrap_or(true)
            {
                collected.named_by_origin += 1;
                continue;
            }
            candidates.push((*id, origin, bytes));
        }
        match (more, ids.last()) {
            // Only forward: a store that names its cursor again ends the listing.
            (true, Some(last)) if after != Some(*last) => after = Some(*last),
            _ => break,
        }
    }
    if candidates.is_empty() {
        return Ok(collected);
    }
    tokio::time::sleep(options.settle).await;
    for (id, origin, bytes) in candidates {
        if engine
            .origin_names(reg.as_ref(), &origin, id)
            .await
            .unwrap_or(true)
        {
            collected.named_by_origin += 1;
            continue;
        }
        if !options.dry_run {
            if let Err(error) = reg.delete_content_object(id).await {
                tracing::warn!(object = %hex::encode(id), %error, "an unnamed chunk was not deleted");
                continue;
            }
            tracing::info!(
                object = %hex::encode(id),
                bucket = %origin.bucket,
                key = %origin.key,
                "deleted a chunk no object names"
            );
        }
        collected.deleted += 1;
        collected.deleted_bytes += bytes;
    }
    Ok(collected)
}

/// Where the gateway chunk `id` belongs, when it was written and its size; `None` for an object
/// that is not one (or cannot be read now).
async fn chunk_origin<R: Registers>(reg: &R, id: [u8; 32]) -> Option<(ChunkOrigin, u64, u64)> {
    let object = match reg.content_object(id).await {
        Ok(object) => object?,
        Err(error) => {
            tracing::debug!(object = %hex::encode(id), %error, "a listed object could not be read");
            return None;
        }
    };
    let (header, _, _) = layout::decode_chunk_object(&object)?;
    let header = header?;
    Some((header.origin, header.written_ms, object.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Integrity, Limits, ObjectMeta};
    use crate::layout::{CHUNK_BYTES, ChunkHeader, INDEX_SHARDS};
    use crate::store::MemRegisters;
    use bytes::Bytes;
    use futures::{StreamExt, stream};

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    fn body(data: &[u8]) -> impl futures::Stream<Item = S3Result<Bytes>> + Unpin {
        stream::iter(
            data.chunks(1 << 20)
                .map(|piece| Ok(Bytes::copy_from_slice(piece)))
                .collect::<Vec<_>>(),
        )
    }

    async fn put(engine: &Engine, reg: &Arc<MemRegisters>, key: &str, data: &[u8]) {
        engine
            .put_object(
                reg,
                "b",
                key,
                ObjectMeta::default(),
                body(data),
                &Integrity::default(),
                None,
            )
            .await
            .expect("put");
    }

    async fn read(engine: &Engine, reg: &Arc<MemRegisters>, key: &str) -> Vec<u8> {
        let manifest = engine
            .manifest(reg.as_ref(), "b", key)
            .await
            .expect("manifest");
        let mut stream = engine
            .read(reg, &manifest, 0..manifest.size, None)
            .await
            .expect("read");
        let mut out = Vec::new();
        while let Some(piece) = stream.next().await {
            out.extend_from_slice(&piece.expect("a chunk"));
        }
        out
    }

    /// Stores a chunk object of `origin` written `age` ago, as a write that never finished
    /// leaves one: its id.
    fn orphan(reg: &MemRegisters, key: &str, age: Duration, seed: u8) -> [u8; 32] {
        let header = ChunkHeader {
            written_ms: now_ms() - age.as_millis() as u64,
            origin: ChunkOrigin {
                bucket: "b".into(),
                key: key.into(),
                upload: None,
            },
        };
        let object = layout::encode_chunk_object(&header, &rand::random(), &pattern(1000, seed))
            .expect("a small header");
        let id = *blake3::hash(&object).as_bytes();
        reg.objects.lock().unwrap().insert(id, Bytes::from(object));
        id
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn options(dry_run: bool) -> Collect {
        Collect {
            min_age: HOUR,
            settle: Duration::from_millis(10),
            dry_run,
        }
    }

    /// A crashed write's old chunk goes; everything an object, an upload part or another client
    /// names stays, and so does a chunk a write may still be filling.
    #[tokio::test]
    async fn only_old_chunks_nothing_names_are_collected() {
        let engine = Engine::new(Limits {
            part_bytes_min: 1,
            ..Limits::default()
        });
        let reg = Arc::new(MemRegisters::with_content_chunks());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .expect("bucket");
        let big = pattern(CHUNK_BYTES + 5000, 1);
        put(&engine, &reg, "kept", &big).await;
        // An upload in progress: its part is named by its part record only.
        let upload = engine
            .create_upload(
                reg.as_ref(),
                "b",
                "parted",
                ObjectMeta::default(),
                (None, None),
            )
            .await
            .expect("upload");
        engine
            .upload_part(
                &reg,
                "b",
                "parted",
                &upload,
                1,
                body(&pattern(2000, 2)),
                &Integrity::default(),
                None,
            )
            .await
            .expect("part");
        let crashed = orphan(&reg, "kept", 2 * HOUR, 3);
        let in_flight = orphan(&reg, "coming", Duration::ZERO, 4);
        let someone_elses = *blake3::hash(b"a user's own content object").as_bytes();
        reg.objects.lock().unwrap().insert(
            someone_elses,
            Bytes::from_static(b"a user's own content object"),
        );
        let before = reg.objects.lock().unwrap().len();

        let dry = collect(&engine, &reg, options(true))
            .await
            .expect("dry run");
        assert_eq!(dry.deleted, 1);
        assert_eq!(
            reg.objects.lock().unwrap().len(),
            before,
            "a dry run deletes nothing"
        );

        let collected = collect(&engine, &reg, options(false))
            .await
            .expect("collect");
        assert_eq!(
            collected,
            Collected {
                listed: before as u64,
                named: 3,
                not_chunks: 1,
                young: 1,
                named_by_origin: 0,
                deleted: 1,
                deleted_bytes: collected.deleted_bytes,
            }
        );
        let objects = reg.objects.lock().unwrap().clone();
        assert!(!objects.contains_key(&crashed));
        assert!(objects.contains_key(&in_flight) && objects.contains_key(&someone_elses));
        assert_eq!(read(&engine, &reg, "kept").await, big);
        let (_, parts, _) = engine
            .list_parts(reg.as_ref(), "b", "parted", &upload, 0, 10)
            .await
            .expect("parts");
        assert!(
            parts[0]
                .1
                .part
                .chunks
                .iter()
                .all(|c| objects.contains_key(&c.object.unwrap()))
        );
    }

    /// A store whose listing names the same object again and again, as a faulty member could.
    struct Stuck(MemRegisters);

    impl Registers for Stuck {
        async fn put(&self, key: &[u8], value: Bytes) -> Result<(), crate::store::StoreError> {
            self.0.put(key, value).await
        }
        async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, crate::store::StoreError> {
            self.0.get(key).await
        }
        async fn delete(&self, key: &[u8]) -> Result<(), crate::store::StoreError> {
            self.0.delete(key).await
        }
        async fn content_objects(
            &self,
            _after: Option<[u8; 32]>,
            _limit: usize,
        ) -> Result<(Vec<[u8; 32]>, bool), crate::store::StoreError> {
            Ok((vec![[7; 32]], true))
        }
        async fn create_causal(&self, volume: &str) -> Result<(), crate::store::StoreError> {
            self.0.create_causal(volume).await
        }
        async fn causal_put(
            &self,
            volume: &str,
            key: &[u8],
            value: Option<Bytes>,
        ) -> Result<(), crate::store::StoreError> {
            self.0.causal_put(volume, key, value).await
        }
        async fn causal_get(
            &self,
            volume: &str,
            key: &[u8],
        ) -> Result<crate::store::CausalValues, crate::store::StoreError> {
            self.0.causal_get(volume, key).await
        }
        async fn causal_list(
            &self,
            volume: &str,
            prefix: &[u8],
            after: Option<&[u8]>,
            limit: usize,
        ) -> Result<Vec<(Vec<u8>, crate::store::CausalValues)>, crate::store::StoreError> {
            self.0.causal_list(volume, prefix, after, limit).await
        }
    }

    #[tokio::test]
    async fn a_listing_that_does_not_move_on_ends_the_collection() {
        let engine = Engine::new(Limits::default());
        let reg = Arc::new(Stuck(MemRegisters::with_content_chunks()));
        let collected = tokio::time::timeout(
            Duration::from_secs(10),
            collect(&engine, &reg, options(false)),
        )
        .await
        .expect("it ends")
        .expect("collect");
        assert_eq!((collected.listed, collected.deleted), (2, 0));
    }

    /// An object whose index entry was never written (the index update failed after its
    /// manifest) is found through the origin its chunks name: a collector that trusted the
    /// listings alone would delete a readable object's chunks.
    #[tokio::test]
    async fn an_object_missing_from_its_listing_keeps_its_chunks() {
        let engine = Engine::new(Limits::default());
        let reg = Arc::new(MemRegisters::with_content_chunks());
        engine
            .create_bucket(reg.as_ref(), "b", false)
            .await
            .expect("bucket");
        let big = pattern(2 * CHUNK_BYTES + 10, 5);
        put(&engine, &reg, "unlisted", &big).await;
        for shard in 0..INDEX_SHARDS {
            reg.map
                .lock()
                .unwrap()
                .remove(&layout::shard_key("b", shard));
        }
        // Its chunks are as old as any orphan.
        let aged: Vec<([u8; 32], Bytes)> = reg
            .objects
            .lock()
            .unwrap()
            .iter()
            .map(|(id, object)| (*id, object.clone()))
            .collect();
        assert_eq!(aged.len(), 3);
        let options = Collect {
            min_age: Duration::ZERO,
            ..options(false)
        };
        let collected = collect(&engine, &reg, options).await.expect("collect");
        assert_eq!((collected.named_by_origin, collected.deleted), (3, 0));
        assert_eq!(read(&engine, &reg, "unlisted").await, big);
    }
}
