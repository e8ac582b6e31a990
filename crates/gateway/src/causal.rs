//! Buckets on causal volumes (Depot): created with `x-bulwark-consistency: causal`, their objects
//! live in a causal volume of the bucket's name, which stays readable and writable with any
//! number of faulty servers, and concurrent writes to one key are all kept.
//!
//! | key of the volume | value |
//! |---|---|
//! | `o/<object key>` | the object's [`Manifest`], as in a register bucket |
//! | `c/<hex BLAKE3(chunk)>` | one chunk, named by its content alone |
//!
//! Object keys are the volume's keys themselves, so a listing is the volume's own key order,
//! with no index to keep. Chunks are content-addressed: two objects with a chunk in common share
//! it, no write ever replaces one with other bytes (a version that does not hash to its key is
//! passed over), and none is deleted when an object is replaced or deleted, since another object
//! or a concurrent version may name it; collecting them is the volume's garbage collection.
//!
//! The current version of a key, the one GET, HEAD and listings show, is the newest version that
//! is not a delete and whose manifest reads: the highest logical clock, then the writer's name,
//! then the update (the order [`CausalValues`] is in). GET and HEAD name the others in
//! [`OTHER_VERSIONS_HEADER`] and count all in [`VERSIONS_HEADER`]. A key is gone only when every
//! current version is a delete: a delete concurrent with a write does not hide that write.
//!
//! Served: PUT, GET, HEAD, DELETE (also multi-object), ListObjects v1 and v2, and deleting the
//! empty bucket (the volume stays, and a bucket re-created with the name adopts it). Copies and
//! multipart uploads answer NotImplemented.

use crate::engine::store_error;
use crate::index::{self, Page, Query};
use crate::layout::{self, ChunkRef, IndexEntry, Manifest};
use crate::store::{CausalValues, Registers, StoreError};
use bytes::Bytes;
use s3s::{S3Result, s3_error};
use std::collections::HashMap;
use std::sync::Arc;

/// The request header of CreateBucket that makes a causal bucket: `causal`, or `registers` (the
/// default).
pub const CONSISTENCY_HEADER: &str = "x-bulwark-consistency";
/// The response header of GET and HEAD on a causal bucket: how many current versions the key has.
pub const VERSIONS_HEADER: &str = "x-bulwark-versions";
/// The response header of GET and HEAD naming the current versions not returned, newest first:
/// `writer=<name>;clock=<n>;etag="<etag>"`, or `;deleted`, or `;unreadable`, comma-separated.
pub const OTHER_VERSIONS_HEADER: &str = "x-bulwark-other-versions";

/// Objects up to this size are stored inside their manifest. Smaller than a register bucket's:
/// a listing reads manifests.
pub const INLINE_BYTES_MAX: usize = 4 * 1024;
/// The largest object in a causal bucket: every member of a causal volume holds the values it
/// has in memory (docs/depot.md), so objects stay far below a register bucket's limit.
pub const OBJECT_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The longest object key: a key of the volume is at most 1024 bytes, `o/` included.
pub const KEY_BYTES_MAX: usize = bulwark_core::Key::BYTES_MAX - OBJECT_PREFIX.len();
/// The most keys a listing looks at for one page (many keys may roll up into one prefix).
const SCAN_MAX: usize = 10_000;

const OBJECT_PREFIX: &[u8] = b"o/";
const CHUNK_PREFIX: &[u8] = b"c/";

fn object_key(key: &str) -> Vec<u8> {
    [OBJECT_PREFIX, key.as_bytes()].concat()
}

/// Refuses an object key a causal bucket cannot hold.
pub fn check_key(key: &str) -> S3Result<()> {
    if key.len() > KEY_BYTES_MAX {
        return Err(s3_error!(
            KeyTooLongError,
            "object key is {} bytes; a causal bucket's limit is {KEY_BYTES_MAX}",
            key.len()
        ));
    }
    Ok(())
}

/// A current version of a key that GET did not return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Other {
    /// Its writer.
    pub writer: String,
    /// Its logical clock.
    pub clock: u64,
    /// What it is.
    pub kind: OtherKind,
}

/// What a version not returned is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OtherKind {
    /// An object, by its ETag.
    Object(String),
    /// A delete.
    Deleted,
    /// A value that is not a manifest of this key (a faulty writer's).
    Unreadable,
}

/// [`OTHER_VERSIONS_HEADER`]'s value.
pub fn other_versions_header(others: &[Other]) -> String {
    others
        .iter()
        .map(|other| {
            let kind = match &other.kind {
                OtherKind::Object(etag) => format!("etag=\"{etag}\""),
                OtherKind::Deleted => "deleted".into(),
                OtherKind::Unreadable => "unreadable".into(),
            };
            // Names come from cluster.toml; anything a header cannot carry is replaced.
            let writer: String = other
                .writer
                .chars()
                .map(|c| {
                    if c.is_ascii_graphic() && !";,=\"".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("writer={writer};clock={};{kind}", other.clock)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The current version of `key` among `values` (the module's rule) and the others; `None` when
/// every version is a delete or unreadable.
fn current(key: &str, values: &CausalValues) -> Option<(Manifest, Vec<Other>)> {
    let mut chosen = None;
    let mut others = Vec::new();
    for version in &values.versions {
        let manifest = version.value.as_ref().map(|bytes| {
            layout::decode_manifest(key, bytes).inspect_err(|error| {
                tracing::warn!(%key, writer = version.writer, %error, "an unreadable version");
            })
        });
        let kind = match manifest {
            Some(Ok(manifest)) if chosen.is_none() => {
                chosen = Some(manifest);
                continue;
            }
            Some(Ok(manifest)) => OtherKind::Object(manifest.etag),
            Some(Err(_)) => OtherKind::Unreadable,
            None => OtherKind::Deleted,
        };
        others.push(Other {
            writer: version.writer.clone(),
            clock: version.clock,
            kind,
        });
    }
    chosen.map(|manifest| (manifest, others))
}

/// A causal bucket's objects: its volume's keys seen as the registers the engine stores chunks
/// in, plus what only a causal bucket does.
pub struct CausalObjects<R> {
    reg: Arc<R>,
    volume: String,
}

impl<R: Registers> CausalObjects<R> {
    /// The objects of causal volume `volume`, reached through `reg`.
    pub fn new(reg: Arc<R>, volume: String) -> Self {
        CausalObjects { reg, volume }
    }

    /// The current version of object `key` and the other versions, or `None`.
    pub async fn current(&self, key: &str) -> S3Result<Option<(Manifest, Vec<Other>)>> {
        let values = self
            .reg
            .causal_get(&self.volume, &object_key(key))
            .await
            .map_err(store_error)?;
        if values.unavailable > 0 {
            tracing::warn!(
                volume = self.volume,
                %key,
                unavailable = values.unavailable,
                "versions whose manifests no member gave"
            );
        }
        Ok(current(key, &values))
    }

    /// Makes `manifest` its object's version, superseding every version this gateway has seen;
    /// its chunks must be written.
    pub async fn commit(&self, manifest: &Manifest) -> S3Result<()> {
        let encoded = layout::encode_manifest(manifest)
            .map_err(|error| s3_error!(InternalError, "{error}"))?;
        self.reg
            .causal_put(&self.volume, &object_key(&manifest.key), Some(encoded))
            .await
            .map_err(store_error)
    }

    /// Deletes object `key`: every version this gateway has seen.
    pub async fn delete_object(&self, key: &str) -> S3Result<()> {
        self.reg
            .causal_put(&self.volume, &object_key(key), None)
            .await
            .map_err(store_error)
    }
}

impl<R: Registers> Registers for CausalObjects<R> {
    async fn put(&self, key: &[u8], value: Bytes) -> Result<(), StoreError> {
        self.reg.causal_put(&self.volume, key, Some(value)).await
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let values = self.reg.causal_get(&self.volume, key).await?;
        let live: Vec<Bytes> = values
            .versions
            .into_iter()
            .filter_map(|v| v.value)
            .collect();
        match key.strip_prefix(CHUNK_PREFIX) {
            // A chunk is the version that hashes to its name; any other is a faulty writer's.
            // A lone version is returned unhashed: the reader verifies every chunk it fetches.
            Some(hash) if live.len() > 1 => Ok(live
                .into_iter()
                .find(|value| blake3::hash(value).to_hex().as_bytes() == hash)),
            _ => Ok(live.into_iter().next()),
        }
    }

    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        if key.starts_with(CHUNK_PREFIX) {
            // Shared by content (see the module's notes): never deleted for one object.
            return Ok(());
        }
        self.reg.causal_put(&self.volume, key, None).await
    }

    fn chunk_key(&self, chunk: &ChunkRef) -> Vec<u8> {
        [CHUNK_PREFIX, hex::encode(chunk.hash).as_bytes()].concat()
    }

    async fn create_causal(&self, volume: &str) -> Result<(), StoreError> {
        self.reg.create_causal(volume).await
    }

    async fn causal_put(
        &self,
        volume: &str,
        key: &[u8],
        value: Option<Bytes>,
    ) -> Result<(), StoreError> {
        self.reg.causal_put(volume, key, value).await
    }

    async fn causal_get(&self, volume: &str, key: &[u8]) -> Result<CausalValues, StoreError> {
        self.reg.causal_get(volume, key).await
    }

    async fn causal_list(
        &self,
        volume: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, CausalValues)>, StoreError> {
        self.reg.causal_list(volume, prefix, after, limit).await
    }
}

/// Whether causal volume `volume` holds no object.
pub async fn is_empty<R: Registers>(reg: &R, volume: &str) -> S3Result<bool> {
    let keys = reg
        .causal_list(volume, OBJECT_PREFIX, None, 1)
        .await
        .map_err(store_error)?;
    Ok(keys.is_empty())
}

/// One page of the listing of causal volume `volume`, in the volume's key order. Only the keys
/// shown as objects have their manifests read (from what this gateway holds, or fetched).
pub async fn list<R: Registers>(reg: &R, volume: &str, query: &Query<'_>) -> S3Result<Page> {
    let prefix = object_key(query.prefix);
    let after = query.marker.map(object_key);
    let scanned = reg
        .causal_list(volume, &prefix, after.as_deref(), SCAN_MAX)
        .await
        .map_err(store_error)?;
    let cut = scanned.len() == SCAN_MAX;
    let mut held: HashMap<String, CausalValues> = HashMap::new();
    let mut names = Vec::new();
    for (key, values) in scanned {
        // Only keys this gateway could have written are objects; others are skipped.
        let Some(name) = key
            .strip_prefix(OBJECT_PREFIX)
            .and_then(|name| String::from_utf8(name.to_vec()).ok())
        else {
            continue;
        };
        names.push(name.clone());
        held.insert(name, values);
    }
    let unknown = IndexEntry {
        size: 0,
        etag: String::new(),
        last_modified_ms: 0,
    };
    let mut page = index::list(names.iter().map(|name| (name, &unknown)), query);
    let mut shown = Vec::with_capacity(page.objects.len());
    for (name, _) in std::mem::take(&mut page.objects) {
        let mut values = held.remove(&name).unwrap_or_default();
        if values.unavailable > 0 {
            values = reg
                .causal_get(volume, &object_key(&name))
                .await
                .map_err(store_error)?;
        }
        if let Some((manifest, _)) = current(&name, &values) {
            let entry = IndexEntry {
                size: manifest.size,
                etag: manifest.etag,
                last_modified_ms: manifest.last_modified_ms,
            };
            shown.push((name, entry));
        }
    }
    page.objects = shown;
    if cut && !page.truncated {
        // The scan stopped before the volume's end: the next page starts after what this one saw.
        page.truncated = true;
        let last_shown = page
            .objects
            .last()
            .map(|(name, _)| name.clone())
            .max(page.prefixes.last().cloned());
        page.next_marker = last_shown.or_else(|| names.last().cloned());
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CausalValue, MemRegisters};

    fn manifest(key: &str, etag: &str) -> Bytes {
        let manifest = Manifest {
            version: None,
            key: key.into(),
            size: 1,
            etag: etag.into(),
            content_type: None,
            metadata: Vec::new(),
            last_modified_ms: 1,
            parts: 0,
            data: layout::Data::Inline(Bytes::from_static(b"x")),
            extra: layout::ObjectExtra::default(),
            sealed: None,
            tags: Vec::new(),
        };
        layout::encode_manifest(&manifest).unwrap()
    }

    fn version(writer: &str, clock: u64, value: Option<Bytes>) -> CausalValue {
        CausalValue {
            writer: writer.into(),
            clock,
            value,
        }
    }

    #[test]
    fn the_current_version_is_the_newest_that_is_an_object() {
        let values = CausalValues {
            versions: vec![
                version("bob", 9, None),
                version("mallory", 8, Some(Bytes::from_static(b"junk"))),
                version("alice", 7, Some(manifest("k", "a"))),
                version("carol", 6, Some(manifest("k", "c"))),
            ],
            unavailable: 0,
        };
        let (chosen, others) = current("k", &values).unwrap();
        assert_eq!(chosen.etag, "a");
        let kinds: Vec<&OtherKind> = others.iter().map(|o| &o.kind).collect();
        assert_eq!(
            kinds,
            vec![
                &OtherKind::Deleted,
                &OtherKind::Unreadable,
                &OtherKind::Object("c".into())
            ]
        );
        assert_eq!(
            other_versions_header(&others[..1]),
            "writer=bob;clock=9;deleted"
        );
        // Another key's manifest is not this key's version.
        let elsewhere = CausalValues {
            versions: vec![version("alice", 1, Some(manifest("other", "a")))],
            unavailable: 0,
        };
        assert!(current("k", &elsewhere).is_none());
        let deleted = CausalValues {
            versions: vec![version("alice", 1, None)],
            unavailable: 0,
        };
        assert!(current("k", &deleted).is_none());
    }

    #[test]
    fn header_values_carry_only_what_a_header_may() {
        let other = Other {
            writer: "member 3;x=\"y\",é".into(),
            clock: 1,
            kind: OtherKind::Deleted,
        };
        assert_eq!(
            other_versions_header(&[other]),
            "writer=member_3_x__y___;clock=1;deleted"
        );
    }

    #[tokio::test]
    async fn a_chunk_is_the_version_that_hashes_to_its_name() {
        let reg = Arc::new(MemRegisters::default());
        reg.create_causal("v").await.unwrap();
        let objects = CausalObjects::new(reg.clone(), "v".into());
        let chunk = ChunkRef::of([0; 16], b"real bytes");
        let key = objects.chunk_key(&chunk);
        reg.causal.lock().unwrap().insert(
            ("v".into(), key.clone()),
            CausalValues {
                versions: vec![
                    version("mallory", 2, Some(Bytes::from_static(b"forged bytes"))),
                    version("alice", 1, Some(Bytes::from_static(b"real bytes"))),
                ],
                unavailable: 0,
            },
        );
        assert_eq!(
            objects.get(&key).await.unwrap(),
            Some(Bytes::from_static(b"real bytes"))
        );
        // Deleting a chunk for one object leaves it for the others.
        objects.delete(&key).await.unwrap();
        assert!(objects.get(&key).await.unwrap().is_some());
    }
}
