//! Versions of objects in buckets whose versioning was ever set (S3's bucket versioning); the
//! registers are in [`crate::layout`].
//!
//! The object's register holds its current version, so the latest version is what a
//! linearizable read returns. Every change of a key's versions runs under the key's lock, in an
//! order that leaves every acknowledged version reachable if the gateway stops between writes:
//!
//! - a new current version (a write, or a delete marker): the replaced version's record is copied
//!   to its own register, then listed, then the object's register is written. Stopped in
//!   between, the list names the version still current, which readers skip;
//! - deleting the current version by id: the newest listed version is written into the object's
//!   register, then the list loses it (its own register stays, a stale copy that is rewritten when
//!   it is replaced again and deleted with it);
//! - deleting a noncurrent version: the list loses it, then its register is deleted;
//! - under suspended versioning, the `null` version replaced stays in the list (a list entry with
//!   the current version's id is skipped) until a later write replaces it there; its chunks are
//!   retired only once the new current version is written.
//!
//! Registers are deleted under the key's lock, never after it, so a later write of the same
//! register cannot be overtaken. A stop can leave a version's own register behind unlisted;
//! nothing reads it, and its chunks, named by no listed version, are the collector's. Readers
//! by id read the object's register, then the list, then the version's own register, each
//! written in the opposite order by writers, and look at the object's register again before
//! they answer that a version does not exist.

use super::{Engine, forget_chunks, get_record, layout_error, now_ms, put_record, store_error};
use crate::index::{self, Query};
use crate::layout::{
    self, DeleteMarker, Head, INDEX_SHARDS, IndexEntry, ListedVersion, Manifest, MarkerShard,
    NONCURRENT_VERSIONS_MAX, NULL_VERSION, VersionList, Versioning,
};
use crate::store::Registers;
use bytes::Bytes;
use futures::StreamExt;
use s3s::{S3Error, S3Result, s3_error};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What deleting an object, or one version of it, did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// The version deleted, or the delete marker made; `None` in a bucket never versioned.
    pub version: Option<String>,
    /// Whether that version is a delete marker.
    pub marker: bool,
}

/// One page of a listing of versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionPage {
    /// Versions in key order, each key's newest first, with whether it is the latest.
    pub versions: Vec<(String, ListedVersion, bool)>,
    /// Common prefixes, in order.
    pub prefixes: Vec<String>,
    /// Whether more follows.
    pub truncated: bool,
    /// The key marker for the next page, when truncated.
    pub next_key_marker: Option<String>,
    /// The version-id marker for the next page, when truncated.
    pub next_version_marker: Option<String>,
}

/// What making room for a new current version did: the new version's id, and the versions it
/// replaces for good (a `null` version under suspended versioning), to retire once the new
/// version is written.
struct PushedDown {
    id: String,
    retired: Vec<Manifest>,
}

/// The answer to a request for a version that is a delete marker: `status`, saying so.
fn marker_error(mut error: S3Error, version: &str) -> S3Error {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-amz-delete-marker",
        http::HeaderValue::from_static("true"),
    );
    if let Ok(value) = http::HeaderValue::from_str(version) {
        headers.insert("x-amz-version-id", value);
    }
    error.set_headers(headers);
    error
}

/// The current version of a key is a delete marker: GET and HEAD answer NoSuchKey, saying so.
pub fn current_marker_error(bucket: &str, key: &str, version: &str) -> S3Error {
    marker_error(
        s3_error!(
            NoSuchKey,
            "the current version of {key:?} in bucket {bucket:?} is a delete marker"
        ),
        version,
    )
}

/// A version asked for by id is a delete marker: it has no body, and S3 answers 405.
fn marker_version_error(key: &str, version: &str) -> S3Error {
    let mut error = s3_error!(
        MethodNotAllowed,
        "version {version:?} of {key:?} is a delete marker"
    );
    error.set_status_code(http::StatusCode::METHOD_NOT_ALLOWED);
    marker_error(error, version)
}

/// A version id given by a request: `null` or one this gateway makes; anything else names no
/// version and must act on none.
pub fn check_version_id(id: &str) -> S3Result<()> {
    if layout::is_version_id(id) {
        Ok(())
    } else {
        Err(s3_error!(InvalidArgument, "Invalid version id specified"))
    }
}

impl Engine {
    /// A register bucket's versioning.
    pub async fn versioning<R: Registers>(&self, reg: &R, bucket: &str) -> S3Result<Versioning> {
        Ok(self.require_bucket(reg, bucket).await?.versioning)
    }

    /// Enables or suspends a bucket's versioning (it cannot be unset again).
    pub async fn set_versioning<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        versioning: Versioning,
    ) -> S3Result<()> {
        assert_ne!(
            versioning,
            Versioning::Unversioned,
            "versioning is never unset"
        );
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).write().await;
        let mut record = self
            .require_register_bucket(reg, bucket, "versioning")
            .await?;
        if record.versioning == versioning {
            return Ok(());
        }
        record.versioning = versioning;
        let encoded = layout::encode_bucket(&record).map_err(layout_error)?;
        reg.put(&layout::bucket_key(bucket), encoded)
            .await
            .map_err(store_error)
    }

    /// What `key`'s register holds, and its bytes; an unreadable record is an error.
    pub(super) async fn head<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Option<(Head, Bytes)>> {
        match self.raw_head(reg, bucket, key).await? {
            Some(bytes) => {
                let head = layout::decode_head(key, &bytes).map_err(layout_error)?;
                Ok(Some((head, bytes)))
            }
            None => Ok(None),
        }
    }

    /// The bytes of `key`'s register.
    async fn raw_head<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Option<Bytes>> {
        reg.get(&layout::object_key(bucket, key))
            .await
            .map_err(store_error)
    }

    /// What `key`'s register holds, for a write about to replace it: an unreadable record is
    /// replaced (and logged), as a bucket never versioned always did.
    pub(super) async fn head_to_replace<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Option<(Head, Bytes)>> {
        let bytes = self.raw_head(reg, bucket, key).await?;
        Ok(
            bytes.and_then(|bytes| match layout::decode_head(key, &bytes) {
                Ok(head) => Some((head, bytes)),
                Err(error) => {
                    tracing::warn!(%bucket, %key, %error, "replacing an unreadable object record");
                    None
                }
            }),
        )
    }

    /// `key`'s noncurrent versions (none listed: an empty list).
    async fn version_list<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<VersionList> {
        let list: Option<VersionList> =
            get_record(reg, "version list", &layout::version_list_key(bucket, key)).await?;
        match list {
            Some(list) if list.key == key => {
                let mut ids = std::collections::HashSet::new();
                if let Some(bad) = list
                    .versions
                    .iter()
                    .find(|v| !layout::is_version_id(&v.id) || !ids.insert(v.id.as_str()))
                {
                    return Err(layout_error(layout::LayoutError::Malformed {
                        what: "version list",
                        problem: format!("version id {:?} malformed or listed twice", bad.id),
                    }));
                }
                Ok(list)
            }
            Some(list) => Err(layout_error(layout::LayoutError::WrongKey {
                expected: key.to_owned(),
                found: list.key,
            })),
            None => Ok(VersionList {
                key: key.to_owned(),
                versions: Vec::new(),
            }),
        }
    }

    async fn put_version_list<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        list: &VersionList,
    ) -> S3Result<()> {
        let register = layout::version_list_key(bucket, &list.key);
        if list.versions.is_empty() {
            return reg.delete(&register).await.map_err(store_error);
        }
        put_record(reg, "version list", &register, list).await
    }

    /// The record of noncurrent version `id` of `key`, from its own register.
    async fn archived<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        id: &str,
    ) -> S3Result<Option<(Head, Bytes)>> {
        let bytes = reg
            .get(&layout::version_key(bucket, key, id))
            .await
            .map_err(store_error)?;
        match bytes {
            Some(bytes) => {
                let head = layout::decode_head(key, &bytes).map_err(layout_error)?;
                if head.version_id() != id {
                    return Err(layout_error(layout::LayoutError::Malformed {
                        what: "version",
                        problem: format!("version {:?} under id {id:?}", head.version_id()),
                    }));
                }
                Ok(Some((head, bytes)))
            }
            None => Ok(None),
        }
    }

    /// Deletes the registers of versions no list names any more, under the key's lock (a later
    /// write of one must not be overtaken by its delete). Best effort: one left behind is named
    /// by no list.
    async fn drop_versions<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        ids: Vec<String>,
    ) {
        for id in ids {
            let register = layout::version_key(bucket, key, &id);
            if let Err(error) = reg.delete(&register).await {
                tracing::warn!(%bucket, %key, version = %id, %error, "version record not deleted; nothing lists it");
            }
        }
    }

    /// Retires the chunks of versions deleted for good, after the grace.
    fn retire<R: Registers>(&self, reg: &Arc<R>, versions: Vec<Manifest>) {
        let chunks: Vec<_> = versions
            .iter()
            .flat_map(|m| m.data.chunks().iter().copied())
            .collect();
        forget_chunks(reg, chunks, self.limits.chunk_grace);
    }

    /// Makes room, under `key`'s lock, for a new current version in a bucket whose versioning
    /// was set: the one it replaces (`old`) is kept as a noncurrent version, except a `null` one
    /// under suspended versioning, which is replaced for good (wherever it is: a listed one stays
    /// listed, hidden behind the new `null` current version, until a later write replaces it
    /// there). Writes the old version's register and the list; the caller then writes the
    /// object's register, and only then retires what this returns.
    async fn push_down<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        versioning: Versioning,
        old: Option<&(Head, Bytes)>,
    ) -> S3Result<PushedDown> {
        assert_ne!(versioning, Versioning::Unversioned);
        let mut list = self.version_list(reg, bucket, key).await?;
        let mut changed = false;
        let mut retired = Vec::new();
        if let Some((head, _)) = old {
            let listed = list.versions.len();
            list.versions.retain(|v| v.id != head.version_id());
            changed |= list.versions.len() != listed;
        }
        if versioning == Versioning::Suspended
            && list
                .versions
                .iter()
                .any(|v| v.id == NULL_VERSION && !v.marker)
            && let Some((Head::Object(manifest), _)) =
                self.archived(reg, bucket, key, NULL_VERSION).await?
        {
            retired.push(manifest);
        }
        let newest = list
            .versions
            .iter()
            .map(|v| v.id.as_str())
            .chain(old.map(|(head, _)| head.version_id()))
            .filter_map(layout::version_seq)
            .max()
            .unwrap_or(0);
        let id = match versioning {
            Versioning::Enabled => {
                let Some(seq) = newest.checked_add(1) else {
                    return Err(s3_error!(
                        InternalError,
                        "{key:?} names a version whose sequence number has no successor"
                    ));
                };
                layout::new_version_id(seq)
            }
            _ => NULL_VERSION.to_owned(),
        };
        if let Some((head, bytes)) = old {
            if versioning == Versioning::Suspended && head.version_id() == NULL_VERSION {
                if let Head::Object(manifest) = head {
                    retired.push(manifest.clone());
                }
            } else {
                if list.versions.len() >= NONCURRENT_VERSIONS_MAX {
                    return Err(s3_error!(
                        InvalidRequest,
                        "{key:?} has {} noncurrent versions, the most this gateway keeps of one key; delete some first",
                        list.versions.len()
                    ));
                }
                if let Head::Object(_) = head {
                    reg.put(
                        &layout::version_key(bucket, key, head.version_id()),
                        bytes.clone(),
                    )
                    .await
                    .map_err(store_error)?;
                }
                list.versions.insert(0, head.listed());
                changed = true;
            }
        }
        if changed {
            self.put_version_list(reg, bucket, &list).await?;
        }
        Ok(PushedDown { id, retired })
    }

    /// Records whether `key`'s current version is a delete marker, for listings of versions.
    async fn update_markers<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        marker: bool,
    ) -> S3Result<()> {
        let shard = layout::shard_of(key);
        let _lock = self
            .shards
            .get(&[bucket.as_bytes(), b"/markers", &[shard]])
            .lock()
            .await;
        let register = layout::marker_shard_key(bucket, shard);
        let mut markers: MarkerShard = get_record(reg, "marker shard", &register)
            .await?
            .unwrap_or_default();
        let changed = if marker {
            markers.insert(key.to_owned())
        } else {
            markers.remove(key)
        };
        if changed {
            put_record(reg, "marker shard", &register, &markers).await?;
        }
        Ok(())
    }

    /// Every key of `bucket` whose current version is a delete marker.
    pub(super) async fn marker_keys<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
    ) -> S3Result<MarkerShard> {
        let reads = (0..INDEX_SHARDS).map(|shard| async move {
            get_record::<R, MarkerShard>(
                reg,
                "marker shard",
                &layout::marker_shard_key(bucket, shard),
            )
            .await
            .map(Option::unwrap_or_default)
        });
        let shards = futures::future::try_join_all(reads).await?;
        Ok(shards.into_iter().flatten().collect())
    }

    /// Updates both indexes for `key`'s new current version (`None`: it has no versions left).
    async fn index_head<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        head: Option<&Head>,
    ) -> S3Result<()> {
        let entry = match head {
            Some(Head::Object(m)) => Some(IndexEntry {
                size: m.size,
                etag: m.etag.clone(),
                last_modified_ms: m.last_modified_ms,
            }),
            _ => None,
        };
        let marker = matches!(head, Some(Head::Marker(_)));
        // The key is added to one index before it leaves the other: stopped in between, it is
        // still found (a bucket with versions must not look empty).
        if marker {
            self.update_markers(reg, bucket, key, true).await?;
            self.update_index(reg, bucket, key, None).await
        } else {
            self.update_index(reg, bucket, key, entry).await?;
            self.update_markers(reg, bucket, key, false).await
        }
    }

    /// The locked part of writing `manifest` as `key`'s new current version in a bucket whose
    /// versioning was set: stamps it with its version id, writes it, and returns the versions
    /// it replaced for good. Sets `started` once the object's register write has been sent.
    pub(super) async fn switch_versioned<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        versioning: Versioning,
        manifest: &mut Manifest,
        old: Option<(Head, Bytes)>,
        started: &mut bool,
    ) -> S3Result<Vec<Manifest>> {
        let key = manifest.key.clone();
        let pushed = self
            .push_down(reg.as_ref(), bucket, &key, versioning, old.as_ref())
            .await?;
        manifest.version = Some(pushed.id);
        let encoded = layout::encode_manifest(manifest).map_err(layout_error)?;
        *started = true;
        reg.put(&layout::object_key(bucket, &key), encoded)
            .await
            .map_err(store_error)?;
        let head = Head::Object(manifest.clone());
        self.index_head(reg.as_ref(), bucket, &key, Some(&head))
            .await?;
        Ok(pushed.retired)
    }

    /// Deletes `key`, or one version of it. Without a version: in a bucket never versioned the
    /// object goes; otherwise a delete marker becomes the current version (the `null` one under
    /// suspended versioning). With one: that version goes for good, and when it was the current
    /// one, the newest left becomes current. A version that does not exist is nothing to do.
    pub async fn delete_version<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<Deleted> {
        super::check_object_key(key)?;
        if let Some(id) = version {
            check_version_id(id)?;
        }
        let _bucket = self.buckets.get(&[bucket.as_bytes()]).read().await;
        let record = self.require_bucket(reg.as_ref(), bucket).await?;
        if let Some(volume) = record.extra.causal {
            if version.is_some_and(|id| id != NULL_VERSION) {
                return Ok(Deleted::default());
            }
            crate::causal::check_key(key)?;
            crate::causal::CausalObjects::new(reg.clone(), volume)
                .delete_object(key)
                .await?;
            return Ok(Deleted::default());
        }
        let _object = self
            .objects
            .get(&[bucket.as_bytes(), key.as_bytes()])
            .lock()
            .await;
        let versioned = record.versioning != Versioning::Unversioned;
        if !versioned {
            // Every object of a bucket never versioned is its `null` version.
            if version.is_none_or(|id| id == NULL_VERSION) {
                self.delete_unversioned(reg, bucket, key).await?;
            }
            return Ok(Deleted {
                version: version.map(str::to_owned),
                marker: false,
            });
        }
        let old = self.head(reg.as_ref(), bucket, key).await?;
        let Some(id) = version else {
            let pushed = self
                .push_down(reg.as_ref(), bucket, key, record.versioning, old.as_ref())
                .await?;
            let marker = Head::Marker(DeleteMarker {
                key: key.to_owned(),
                version: pushed.id.clone(),
                last_modified_ms: now_ms(),
            });
            let encoded = layout::encode_head(&marker).map_err(layout_error)?;
            reg.put(&layout::object_key(bucket, key), encoded)
                .await
                .map_err(store_error)?;
            self.retire(reg, pushed.retired);
            self.index_head(reg.as_ref(), bucket, key, Some(&marker))
                .await?;
            return Ok(Deleted {
                version: Some(pushed.id),
                marker: true,
            });
        };
        let deleted = |marker| Deleted {
            version: Some(id.to_owned()),
            marker,
        };
        let mut list = self.version_list(reg.as_ref(), bucket, key).await?;
        if let Some((head, _)) = old.as_ref().filter(|(head, _)| head.version_id() == id) {
            list.versions.retain(|v| v.id != id);
            // The newest listed version whose record is there becomes current. Its own register
            // stays, a stale copy the next write over it replaces.
            let mut promoted = None;
            while !list.versions.is_empty() {
                let next = list.versions.remove(0);
                if next.marker {
                    let marker = Head::Marker(next.as_marker(key));
                    let bytes = layout::encode_head(&marker).map_err(layout_error)?;
                    promoted = Some((marker, bytes));
                    break;
                }
                match self.archived(reg.as_ref(), bucket, key, &next.id).await? {
                    Some(found) => {
                        promoted = Some(found);
                        break;
                    }
                    None => {
                        tracing::warn!(%bucket, %key, version = %next.id, "a listed version has no record; it is dropped from the list");
                    }
                }
            }
            let object_key = layout::object_key(bucket, key);
            match &promoted {
                Some((_, bytes)) => reg.put(&object_key, bytes.clone()).await,
                None => reg.delete(&object_key).await,
            }
            .map_err(store_error)?;
            self.put_version_list(reg.as_ref(), bucket, &list).await?;
            // A stale copy of the deleted version, from when it was promoted.
            self.drop_versions(reg.as_ref(), bucket, key, vec![id.to_owned()])
                .await;
            if let Head::Object(manifest) = head {
                self.retire(reg, vec![manifest.clone()]);
            }
            self.index_head(
                reg.as_ref(),
                bucket,
                key,
                promoted.as_ref().map(|(head, _)| head),
            )
            .await?;
            return Ok(deleted(matches!(head, Head::Marker(_))));
        }
        let Some(at) = list.versions.iter().position(|v| v.id == id) else {
            return Ok(deleted(false));
        };
        let gone = list.versions.remove(at);
        let record = if gone.marker {
            None
        } else {
            self.archived(reg.as_ref(), bucket, key, id).await?
        };
        self.put_version_list(reg.as_ref(), bucket, &list).await?;
        if !gone.marker {
            self.drop_versions(reg.as_ref(), bucket, key, vec![id.to_owned()])
                .await;
        }
        if let Some((Head::Object(manifest), _)) = record {
            self.retire(reg, vec![manifest]);
        }
        if old.is_none() && list.versions.is_empty() {
            // Nothing of the key is left: a crashed promotion's index entries go too.
            self.index_head(reg.as_ref(), bucket, key, None).await?;
        }
        Ok(deleted(gone.marker))
    }

    /// Deletes `key` of a bucket never versioned, under its lock: its register, whatever it
    /// holds, and its index entry (also when there was no register: that repairs an entry a
    /// crashed gateway left).
    async fn delete_unversioned<R: Registers>(
        &self,
        reg: &Arc<R>,
        bucket: &str,
        key: &str,
    ) -> S3Result<()> {
        let old = self.raw_head(reg.as_ref(), bucket, key).await?;
        if old.is_some() {
            reg.delete(&layout::object_key(bucket, key))
                .await
                .map_err(store_error)?;
        }
        self.update_index(reg.as_ref(), bucket, key, None).await?;
        if let Some(Ok(Head::Object(manifest))) = old.map(|bytes| layout::decode_head(key, &bytes))
        {
            self.retire(reg, vec![manifest]);
        }
        Ok(())
    }

    /// Version `id` of `key`: the current one when it has that id, else a listed noncurrent one;
    /// `None` when there is no such version.
    pub(super) async fn version_of<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        id: &str,
    ) -> S3Result<Option<Head>> {
        check_version_id(id)?;
        // In the order opposite to the writers' (see the module's doc), so that a version being
        // pushed down or promoted is found in one place or the other.
        let current =
            |head: Option<(Head, Bytes)>| head.map(|(h, _)| h).filter(|h| h.version_id() == id);
        if let Some(head) = current(self.head(reg, bucket, key).await?) {
            return Ok(Some(head));
        }
        let listed = |list: VersionList| list.versions.into_iter().find(|v| v.id == id);
        let Some(found) = listed(self.version_list(reg, bucket, key).await?) else {
            // Promoted since the first read?
            return Ok(current(self.head(reg, bucket, key).await?));
        };
        if found.marker {
            return Ok(Some(Head::Marker(found.as_marker(key))));
        }
        if let Some((head, _)) = self.archived(reg, bucket, key, id).await? {
            return Ok(Some(head));
        }
        // Deleted since the list was read?
        if listed(self.version_list(reg, bucket, key).await?).is_none() {
            return Ok(None);
        }
        Err(s3_error!(
            InternalError,
            "version {id:?} of {key:?} is listed but its record is gone"
        ))
    }

    /// The manifest of version `version` of `key` (the current one when `None`), or the error
    /// S3 gives: NoSuchKey, NoSuchVersion, or a delete marker's.
    pub(super) async fn manifest_at<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<Option<Manifest>> {
        let Some(id) = version else {
            return match self.head(reg, bucket, key).await? {
                Some((Head::Object(manifest), _)) => Ok(Some(manifest)),
                Some((Head::Marker(marker), _)) => {
                    Err(current_marker_error(bucket, key, &marker.version))
                }
                None => Ok(None),
            };
        };
        match self.version_of(reg, bucket, key, id).await? {
            Some(Head::Object(manifest)) => Ok(Some(manifest)),
            Some(Head::Marker(marker)) => Err(marker_version_error(key, &marker.version)),
            None if id == NULL_VERSION => Ok(None),
            None => {
                self.require_bucket(reg, bucket).await?;
                Err(s3_error!(
                    NoSuchVersion,
                    "no version {id:?} of {key:?} in bucket {bucket:?}"
                ))
            }
        }
    }

    /// Replaces the record of version `id` of `key` with `manifest` (its tags changed), under
    /// the key's lock: in the object's register when it is the current version, else in its
    /// own.
    pub(super) async fn rewrite_version<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        manifest: &Manifest,
    ) -> S3Result<()> {
        let key = &manifest.key;
        let encoded = layout::encode_manifest(manifest).map_err(layout_error)?;
        let current = match self.head(reg, bucket, key).await? {
            Some((head, _)) => head.version_id() == manifest.version_id(),
            None => false,
        };
        let register = if current {
            layout::object_key(bucket, key)
        } else {
            layout::version_key(bucket, key, manifest.version_id())
        };
        reg.put(&register, encoded).await.map_err(store_error)
    }

    /// Every version of `key`, newest first, with whether it is the latest.
    async fn key_versions<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
    ) -> S3Result<Vec<(ListedVersion, bool)>> {
        let (head, list) = futures::future::join(
            self.head(reg, bucket, key),
            self.version_list(reg, bucket, key),
        )
        .await;
        let head = head?.map(|(head, _)| head.listed());
        let mut versions: Vec<(ListedVersion, bool)> = Vec::new();
        if let Some(head) = &head {
            versions.push((head.clone(), true));
        }
        versions.extend(
            list?
                .versions
                .into_iter()
                .filter(|v| head.as_ref().is_none_or(|h| h.id != v.id))
                .map(|v| (v, false)),
        );
        Ok(versions)
    }

    /// One page of the listing of `bucket`'s versions: keys after `query.marker` (and, with
    /// `version_marker`, the versions of that key after it), at most `query.max_keys` versions
    /// and common prefixes. In a bucket never versioned (and a causal one), each object is its
    /// one version, `null`, the latest.
    pub async fn list_versions<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        query: &Query<'_>,
        version_marker: Option<&str>,
    ) -> S3Result<VersionPage> {
        if let Some(id) = version_marker {
            check_version_id(id)?;
        }
        let record = self.require_bucket(reg, bucket).await?;
        if record.extra.causal.is_some() || record.versioning == Versioning::Unversioned {
            let page = self.list(reg, bucket, query).await?;
            let null = |entry: IndexEntry| ListedVersion {
                id: NULL_VERSION.to_owned(),
                marker: false,
                size: entry.size,
                etag: entry.etag,
                last_modified_ms: entry.last_modified_ms,
            };
            let next_version_marker = page.truncated.then(|| NULL_VERSION.to_owned());
            return Ok(VersionPage {
                versions: page
                    .objects
                    .into_iter()
                    .map(|(key, entry)| (key, null(entry), true))
                    .collect(),
                prefixes: page.prefixes,
                truncated: page.truncated,
                next_key_marker: page.next_marker,
                next_version_marker,
            });
        }
        let (shards, markers) =
            futures::future::join(self.read_shards(reg, bucket), self.marker_keys(reg, bucket))
                .await;
        let placeholder = IndexEntry {
            size: 0,
            etag: String::new(),
            last_modified_ms: 0,
        };
        let mut keys: BTreeMap<String, IndexEntry> = markers?
            .into_iter()
            .map(|key| (key, placeholder.clone()))
            .collect();
        keys.extend(shards?.into_iter().flatten());
        let mut page = VersionPage::default();
        let max = query.max_keys;
        // The last version or prefix put in the page, to continue after.
        let mut last: Option<(String, Option<String>)> = None;
        let full = |page: &mut VersionPage, last: &Option<(String, Option<String>)>| {
            page.truncated = true;
            page.next_key_marker = last.as_ref().map(|(key, _)| key.clone());
            page.next_version_marker = last.as_ref().and_then(|(_, id)| id.clone());
        };
        if max == 0 {
            return Ok(page);
        }
        // The rest of the marker key's versions first.
        if let (Some(key), Some(after)) = (query.marker, version_marker)
            && keys.contains_key(key)
            && key.starts_with(query.prefix)
            && index::common_prefix(key, query.prefix, query.delimiter).is_none()
        {
            let versions = self.key_versions(reg, bucket, key).await?;
            let after_seq = layout::version_seq(after);
            let start = match versions.iter().position(|(v, _)| v.id == after) {
                Some(at) => at + 1,
                // Gone since the last page: continue with the older versions.
                None => versions
                    .iter()
                    .position(|(v, _)| {
                        matches!((layout::version_seq(&v.id), after_seq), (Some(s), Some(a)) if s < a)
                    })
                    .unwrap_or(versions.len()),
            };
            for (version, latest) in versions.into_iter().skip(start) {
                if page.versions.len() >= max {
                    full(&mut page, &last);
                    return Ok(page);
                }
                last = Some((key.to_owned(), Some(version.id.clone())));
                page.versions.push((key.to_owned(), version, latest));
            }
        }
        let room = max - page.versions.len();
        // With no room left, a page of one says whether anything follows.
        let keys_page = index::list(
            &keys,
            &Query {
                max_keys: room.max(1),
                ..query.clone()
            },
        );
        if room == 0 {
            if !keys_page.objects.is_empty() || !keys_page.prefixes.is_empty() {
                full(&mut page, &last);
            }
            return Ok(page);
        }
        // Keys and prefixes in order; a few keys' versions fetched ahead, and no more once the
        // page is full, so a page holds at most a few version lists besides itself.
        let mut items: Vec<(String, bool)> = keys_page
            .objects
            .into_iter()
            .map(|(key, _)| (key, false))
            .chain(keys_page.prefixes.into_iter().map(|prefix| (prefix, true)))
            .collect();
        items.sort();
        let mut fetched = std::pin::pin!(
            futures::stream::iter(items)
                .map(|(name, prefix)| async move {
                    if prefix {
                        return Ok((name, None));
                    }
                    let versions = self.key_versions(reg, bucket, &name).await?;
                    Ok::<_, S3Error>((name, Some(versions)))
                })
                .buffered(4)
        );
        while let Some(item) = fetched.next().await {
            let (name, versions) = item?;
            let Some(versions) = versions else {
                if page.versions.len() + page.prefixes.len() >= max {
                    full(&mut page, &last);
                    return Ok(page);
                }
                last = Some((name.clone(), None));
                page.prefixes.push(name);
                continue;
            };
            for (version, latest) in versions {
                if page.versions.len() + page.prefixes.len() >= max {
                    full(&mut page, &last);
                    return Ok(page);
                }
                last = Some((name.clone(), Some(version.id.clone())));
                page.versions.push((name.clone(), version, latest));
            }
        }
        if keys_page.truncated {
            full(&mut page, &last);
        }
        Ok(page)
    }

    /// The chunks every listed noncurrent version of `bucket` names, for the collector.
    pub(super) async fn noncurrent_chunks<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        add: &mut impl FnMut(&[crate::layout::ChunkRef]),
    ) -> S3Result<()> {
        let (shards, markers) =
            futures::future::join(self.read_shards(reg, bucket), self.marker_keys(reg, bucket))
                .await;
        let mut keys: std::collections::BTreeSet<String> = markers?;
        keys.extend(shards?.into_iter().flat_map(|s| s.into_keys()));
        for key in keys {
            self.version_chunks(reg, bucket, &key, add).await?;
        }
        Ok(())
    }

    /// The chunks `key`'s listed noncurrent versions name.
    pub(super) async fn version_chunks<R: Registers>(
        &self,
        reg: &R,
        bucket: &str,
        key: &str,
        add: &mut impl FnMut(&[crate::layout::ChunkRef]),
    ) -> S3Result<()> {
        for version in self.version_list(reg, bucket, key).await?.versions {
            if version.marker {
                continue;
            }
            if let Some((Head::Object(manifest), _)) =
                self.archived(reg, bucket, key, &version.id).await?
            {
                add(manifest.data.chunks());
            }
        }
        Ok(())
    }
}

/// S3's name for a versioning state, for GetBucketVersioning; none when never set.
pub fn versioning_status(versioning: Versioning) -> Option<&'static str> {
    match versioning {
        Versioning::Unversioned => None,
        Versioning::Enabled => Some("Enabled"),
        Versioning::Suspended => Some("Suspended"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{body, chunk_registers, pattern, read_all, setup, setup_objects};
    use super::*;
    use crate::engine::{Integrity, ObjectMeta};
    use crate::layout::CHUNK_BYTES;
    use crate::store::MemRegisters;
    use s3s::S3ErrorCode;
    use std::time::Duration;

    async fn try_put(
        engine: &Engine,
        reg: &Arc<MemRegisters>,
        key: &str,
        data: &[u8],
    ) -> S3Result<Manifest> {
        let stored = engine
            .put_object(
                reg,
                "b",
                key,
                ObjectMeta::default(),
                body(data, 1 << 20),
                &Integrity::default(),
                None,
            )
            .await?;
        Ok(stored.0)
    }

    async fn put(engine: &Engine, reg: &Arc<MemRegisters>, key: &str, data: &[u8]) -> Manifest {
        try_put(engine, reg, key, data).await.unwrap()
    }

    async fn set(engine: &Engine, reg: &MemRegisters, versioning: Versioning) {
        engine.set_versioning(reg, "b", versioning).await.unwrap();
    }

    async fn bytes_of(
        engine: &Engine,
        reg: &Arc<MemRegisters>,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<Vec<u8>> {
        let object = engine.object_version(reg, "b", key, version, None).await?;
        read_all(engine, reg, &object.manifest, 0..object.manifest.size).await
    }

    async fn all_versions(
        engine: &Engine,
        reg: &MemRegisters,
    ) -> Vec<(String, String, bool, bool)> {
        let query = Query {
            max_keys: 1000,
            ..Query::default()
        };
        let page = engine.list_versions(reg, "b", &query, None).await.unwrap();
        assert!(!page.truncated);
        page.versions
            .into_iter()
            .map(|(key, v, latest)| (key, v.id, v.marker, latest))
            .collect()
    }

    #[tokio::test]
    async fn a_versioned_bucket_keeps_every_version_in_the_order_its_register_took_them() {
        // The grace is zero: a chunk retired by mistake is gone at once, and the reads fail.
        let (engine, reg) = setup(Duration::ZERO).await;
        put(&engine, &reg, "k", b"before versioning").await;
        set(&engine, &reg, Versioning::Enabled).await;
        let big = pattern(CHUNK_BYTES + 10, 1);
        let v1 = put(&engine, &reg, "k", &big).await.version.unwrap();
        let v2 = put(&engine, &reg, "k", b"second").await.version.unwrap();
        let v3 = put(&engine, &reg, "k", b"third").await.version.unwrap();
        assert!(
            v1 < v2 && v2 < v3,
            "ids sort in write order: {v1} {v2} {v3}"
        );
        assert_eq!(
            chunk_registers(&reg),
            2,
            "the replaced version keeps its chunks"
        );

        assert_eq!(bytes_of(&engine, &reg, "k", None).await.unwrap(), b"third");
        assert_eq!(bytes_of(&engine, &reg, "k", Some(&v1)).await.unwrap(), big);
        assert_eq!(
            bytes_of(&engine, &reg, "k", Some(&v2)).await.unwrap(),
            b"second"
        );
        assert_eq!(
            bytes_of(&engine, &reg, "k", Some(NULL_VERSION))
                .await
                .unwrap(),
            b"before versioning"
        );
        let missing = layout::new_version_id(1);
        let e = bytes_of(&engine, &reg, "k", Some(&missing))
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchVersion);
        let e = bytes_of(&engine, &reg, "k", Some("not-an-id"))
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidArgument);
        let k = |id: &str, marker, latest| ("k".to_owned(), id.to_owned(), marker, latest);
        assert_eq!(
            all_versions(&engine, &reg).await,
            vec![
                k(&v3, false, true),
                k(&v2, false, false),
                k(&v1, false, false),
                k(NULL_VERSION, false, false)
            ]
        );

        // A delete makes a marker: the key is gone from GET and from the listing of objects,
        // and every version stays.
        let deleted = engine.delete_object(&reg, "b", "k").await.unwrap();
        assert!(deleted.marker);
        let marker = deleted.version.unwrap();
        assert!(marker > v3);
        let e = bytes_of(&engine, &reg, "k", None).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchKey);
        let headers = e.headers().unwrap();
        assert_eq!(headers["x-amz-delete-marker"], "true");
        assert_eq!(headers["x-amz-version-id"], marker.as_str());
        let e = bytes_of(&engine, &reg, "k", Some(&marker))
            .await
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::MethodNotAllowed);
        let objects = engine
            .list(
                reg.as_ref(),
                "b",
                &Query {
                    max_keys: 10,
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        assert!(objects.objects.is_empty());
        assert_eq!(all_versions(&engine, &reg).await[0], k(&marker, true, true));
        let e = engine.delete_bucket(reg.as_ref(), "b").await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::BucketNotEmpty);

        // Deleting the marker by id brings the newest version back.
        let undone = engine
            .delete_version(&reg, "b", "k", Some(&marker))
            .await
            .unwrap();
        assert_eq!(
            undone,
            Deleted {
                version: Some(marker.clone()),
                marker: true
            }
        );
        assert_eq!(bytes_of(&engine, &reg, "k", None).await.unwrap(), b"third");
        // Deleting the current version by id makes the one before it current.
        engine
            .delete_version(&reg, "b", "k", Some(&v3))
            .await
            .unwrap();
        assert_eq!(bytes_of(&engine, &reg, "k", None).await.unwrap(), b"second");
        // A noncurrent version goes for good, and its chunks with it.
        engine
            .delete_version(&reg, "b", "k", Some(&v1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(chunk_registers(&reg), 0);
        let e = bytes_of(&engine, &reg, "k", Some(&v1)).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NoSuchVersion);
        // An id no version has deletes nothing.
        engine
            .delete_version(&reg, "b", "k", Some(&missing))
            .await
            .unwrap();
        assert_eq!(
            all_versions(&engine, &reg).await,
            vec![k(&v2, false, true), k(NULL_VERSION, false, false)]
        );
        // The last versions gone, the key is gone, and so may the bucket be.
        engine
            .delete_version(&reg, "b", "k", Some(&v2))
            .await
            .unwrap();
        engine
            .delete_version(&reg, "b", "k", Some(NULL_VERSION))
            .await
            .unwrap();
        assert!(all_versions(&engine, &reg).await.is_empty());
        engine.delete_bucket(reg.as_ref(), "b").await.unwrap();
        let left: Vec<String> = reg
            .map
            .lock()
            .unwrap()
            .keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .filter(|k| k.starts_with("s3/v") || k.starts_with("s3/o/"))
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let left: Vec<String> = left
            .into_iter()
            .filter(|k| reg.map.lock().unwrap().contains_key(k.as_bytes()))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[tokio::test]
    async fn suspended_versioning_replaces_the_null_version_and_keeps_the_others() {
        let (engine, reg) = setup(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        let kept = put(&engine, &reg, "k", &pattern(CHUNK_BYTES + 1, 2)).await;
        set(&engine, &reg, Versioning::Suspended).await;
        assert_eq!(
            engine.versioning(reg.as_ref(), "b").await.unwrap(),
            Versioning::Suspended
        );
        let null = put(&engine, &reg, "k", &pattern(CHUNK_BYTES + 1, 3)).await;
        assert_eq!(null.version.as_deref(), Some(NULL_VERSION));
        assert_eq!(chunk_registers(&reg), 4);
        // The null version is replaced, its chunks retired; the enabled-era version stays.
        put(&engine, &reg, "k", b"small").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(chunk_registers(&reg), 2);
        let id = kept.version.unwrap();
        assert_eq!(
            bytes_of(&engine, &reg, "k", Some(&id)).await.unwrap(),
            pattern(CHUNK_BYTES + 1, 2)
        );
        // A delete makes a null marker, which replaces the null version too.
        let deleted = engine.delete_object(&reg, "b", "k").await.unwrap();
        assert_eq!(
            deleted,
            Deleted {
                version: Some(NULL_VERSION.to_owned()),
                marker: true
            }
        );
        assert_eq!(
            all_versions(&engine, &reg).await,
            vec![
                ("k".to_owned(), NULL_VERSION.to_owned(), true, true),
                ("k".to_owned(), id, false, false)
            ]
        );
    }

    #[tokio::test]
    async fn a_listing_of_versions_pages_through_keys_and_versions_without_repeating_any() {
        let (engine, reg) = setup(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        for key in ["a", "d/1", "d/2", "z"] {
            for round in 0..3u8 {
                put(&engine, &reg, key, &[round]).await;
            }
        }
        engine.delete_object(&reg, "b", "z").await.unwrap();
        let everything = all_versions(&engine, &reg).await;
        assert_eq!(everything.len(), 13);
        for max_keys in 1..=5 {
            let mut seen = Vec::new();
            let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
            loop {
                let query = Query {
                    max_keys,
                    marker: key_marker.as_deref(),
                    ..Query::default()
                };
                let page = engine
                    .list_versions(reg.as_ref(), "b", &query, version_marker.as_deref())
                    .await
                    .unwrap();
                assert!(page.versions.len() <= max_keys);
                seen.extend(
                    page.versions
                        .into_iter()
                        .map(|(key, v, latest)| (key, v.id, v.marker, latest)),
                );
                if !page.truncated {
                    break;
                }
                key_marker = page.next_key_marker;
                version_marker = page.next_version_marker;
            }
            assert_eq!(seen, everything, "pages of {max_keys}");
        }
        // With a delimiter, "d/" is one common prefix, counted once.
        let query = Query {
            max_keys: 100,
            delimiter: Some("/"),
            ..Query::default()
        };
        let page = engine
            .list_versions(reg.as_ref(), "b", &query, None)
            .await
            .unwrap();
        assert_eq!(page.prefixes, vec!["d/".to_owned()]);
        assert_eq!(page.versions.len(), 7);
    }

    #[tokio::test]
    async fn a_version_list_naming_the_current_version_is_not_listed_twice() {
        // What a gateway stopped between writing the list and the object's register leaves.
        let (engine, reg) = setup(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        let first = put(&engine, &reg, "k", b"1").await;
        let second = put(&engine, &reg, "k", b"2").await;
        let mut list = engine.version_list(reg.as_ref(), "b", "k").await.unwrap();
        list.versions
            .insert(0, Head::Object(second.clone()).listed());
        engine
            .put_version_list(reg.as_ref(), "b", &list)
            .await
            .unwrap();
        let ids: Vec<String> = all_versions(&engine, &reg)
            .await
            .into_iter()
            .map(|(_, id, _, _)| id)
            .collect();
        assert_eq!(
            ids,
            vec![second.version.clone().unwrap(), first.version.unwrap()]
        );
        // The next write repairs the list.
        put(&engine, &reg, "k", b"3").await;
        assert_eq!(all_versions(&engine, &reg).await.len(), 3);
    }

    #[tokio::test]
    async fn the_collector_sees_the_chunks_of_noncurrent_versions() {
        let (engine, reg) = setup_objects(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        let old = put(&engine, &reg, "k", &pattern(CHUNK_BYTES + 1, 4)).await;
        put(&engine, &reg, "k", b"new").await;
        engine.delete_object(&reg, "b", "k").await.unwrap();
        let named = engine.named_objects(reg.as_ref()).await.unwrap();
        let objects: Vec<[u8; 32]> = old.data.chunks().iter().filter_map(|c| c.object).collect();
        assert_eq!(objects.len(), 2);
        for object in &objects {
            assert!(
                named.contains(object),
                "a noncurrent version's chunk is named"
            );
        }
        let origin = crate::layout::ChunkOrigin {
            bucket: "b".into(),
            key: "k".into(),
            upload: None,
        };
        assert!(
            engine
                .origin_names(reg.as_ref(), &origin, objects[0])
                .await
                .unwrap()
        );
        let id = old.version.unwrap();
        engine
            .delete_version(&reg, "b", "k", Some(&id))
            .await
            .unwrap();
        assert!(
            !engine
                .origin_names(reg.as_ref(), &origin, objects[0])
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn a_promoted_version_pushed_down_again_keeps_its_record_and_its_chunks() {
        let (engine, reg) = setup_objects(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        let big = pattern(CHUNK_BYTES + 1, 5);
        let v1 = put(&engine, &reg, "k", &big).await;
        let v2 = put(&engine, &reg, "k", b"2").await.version.unwrap();
        engine
            .delete_version(&reg, "b", "k", Some(&v2))
            .await
            .unwrap();
        put(&engine, &reg, "k", b"3").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let id = v1.version.clone().unwrap();
        assert_eq!(bytes_of(&engine, &reg, "k", Some(&id)).await.unwrap(), big);
        let named = engine.named_objects(reg.as_ref()).await.unwrap();
        assert!(
            v1.data
                .chunks()
                .iter()
                .all(|c| named.contains(&c.object.unwrap()))
        );
    }

    #[tokio::test]
    async fn a_failed_write_under_suspended_versioning_loses_no_version() {
        let (engine, reg) = setup(Duration::ZERO).await;
        let null = pattern(CHUNK_BYTES + 1, 6);
        put(&engine, &reg, "k", &null).await;
        set(&engine, &reg, Versioning::Enabled).await;
        put(&engine, &reg, "k", b"enabled").await;
        set(&engine, &reg, Versioning::Suspended).await;
        // The object's register refuses the write: the PUT fails after the list was written.
        *reg.fail_puts.lock().unwrap() = Some(layout::object_key("b", "k"));
        let refused = try_put(&engine, &reg, "k", b"lost").await;
        assert!(refused.is_err());
        assert!(engine.delete_object(&reg, "b", "k").await.is_err());
        *reg.fail_puts.lock().unwrap() = None;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            bytes_of(&engine, &reg, "k", Some(NULL_VERSION))
                .await
                .unwrap(),
            null
        );
        assert_eq!(
            bytes_of(&engine, &reg, "k", None).await.unwrap(),
            b"enabled"
        );
        // Written at last, the null version is replaced for good, and hidden from listings.
        put(&engine, &reg, "k", b"new null").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            chunk_registers(&reg),
            0,
            "the old null version's chunks are retired"
        );
        let ids: Vec<String> = all_versions(&engine, &reg)
            .await
            .into_iter()
            .map(|(_, id, _, _)| id)
            .collect();
        assert_eq!(ids.len(), 2);
        assert_eq!(ids[0], NULL_VERSION);
        assert_eq!(
            bytes_of(&engine, &reg, "k", Some(NULL_VERSION))
                .await
                .unwrap(),
            b"new null"
        );
    }

    #[tokio::test]
    async fn stored_version_lists_that_lie_are_errors_not_panics() {
        let (engine, reg) = setup(Duration::ZERO).await;
        set(&engine, &reg, Versioning::Enabled).await;
        let current = put(&engine, &reg, "k", b"1").await.version.unwrap();
        let bogus = |id: &str| ListedVersion {
            id: id.to_owned(),
            marker: true,
            size: 0,
            etag: String::new(),
            last_modified_ms: 0,
        };
        let max = format!("{:016x}{:016x}", u64::MAX, 0);
        for versions in [vec![bogus("bogus")], vec![bogus(&max), bogus(&max)]] {
            let list = VersionList {
                key: "k".into(),
                versions,
            };
            put_record(
                reg.as_ref(),
                "version list",
                &layout::version_list_key("b", "k"),
                &list,
            )
            .await
            .unwrap();
            let e = engine
                .delete_version(&reg, "b", "k", Some(&current))
                .await
                .unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InternalError);
        }
        // A sequence number with no successor refuses the write instead of wrapping.
        let list = VersionList {
            key: "k".into(),
            versions: vec![bogus(&max)],
        };
        put_record(
            reg.as_ref(),
            "version list",
            &layout::version_list_key("b", "k"),
            &list,
        )
        .await
        .unwrap();
        let refused = try_put(&engine, &reg, "k", b"2").await;
        assert!(refused.is_err());
        assert_eq!(bytes_of(&engine, &reg, "k", None).await.unwrap(), b"1");
    }

    #[tokio::test]
    async fn an_unreadable_record_of_a_bucket_never_versioned_is_an_error_and_deletes() {
        let (engine, reg) = setup(Duration::ZERO).await;
        put(&engine, &reg, "k", b"1").await;
        reg.map
            .lock()
            .unwrap()
            .insert(layout::object_key("b", "k"), Bytes::from_static(&[9, 9, 9]));
        let e = bytes_of(&engine, &reg, "k", None).await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InternalError);
        engine.delete_object(&reg, "b", "k").await.unwrap();
        assert!(
            !reg.map
                .lock()
                .unwrap()
                .contains_key(&layout::object_key("b", "k"))
        );
    }
}
