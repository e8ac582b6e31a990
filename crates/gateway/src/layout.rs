//! How S3 state maps onto Bulwark registers.
//!
//! Every piece of gateway state is one register value, so each is read and replaced atomically:
//!
//! | register key | value |
//! |---|---|
//! | `s3/buckets` | [`BucketList`]: every bucket's name and creation time |
//! | `s3/b/<bucket>` | [`BucketRecord`]: the bucket exists |
//! | `s3/o/<bucket>/<hex BLAKE3(object key)>` | [`Manifest`]: the object's current version |
//! | `s3/c/<hex write id>/<hex BLAKE3(chunk)>` | one chunk of object data, at most [`CHUNK_BYTES`] (gateways before format 4) |
//! | `s3/i/<bucket>/<shard>` | [`IndexShard`]: the listing index, one of [`INDEX_SHARDS`] |
//! | `s3/u/<upload id>` | [`UploadRecord`]: a multipart upload in progress, and which parts it has |
//! | `s3/u/<upload id>/p/<n>` | [`StoredPart`]: its part `n` |
//! | `s3/ul/<bucket>` | [`UploadList`]: the bucket's uploads in progress, for listing them |
//! | `s3/vl/<bucket>/<hex BLAKE3(object key)>` | [`VersionList`]: the object's noncurrent versions, newest first (versioned buckets) |
//! | `s3/v/<bucket>/<hex BLAKE3(object key)>/<version id>` | one noncurrent version's record, as the object's register held it |
//! | `s3/im/<bucket>/<shard>` | [`MarkerShard`]: keys whose current version is a delete marker, one of [`INDEX_SHARDS`] |
//!
//! A bucket created with `x-bulwark-consistency: causal` keeps its objects in a causal volume
//! of the same name instead (its record, [`BucketRecord`] in format 2, names the volume; the
//! bucket list stays in registers); see `crate::causal` for its keys.
//! Object keys are hashed into the register key because S3 allows 1024-byte keys and a register
//! key is bounded by the same number; the manifest repeats the full object key and a reader
//! checks it.
//!
//! Data is written before the manifest that names it: a chunk is immutable once written and
//! named by its content hash, so a reader re-hashes every chunk against the manifest and a node
//! (or anyone) cannot substitute one. The manifest is one register write, so a reader sees the
//! old object or the new one, never a mix. Chunk keys carry the id of the body write that created
//! them (a fresh random id per PUT, per uploaded part, per copy), so two objects never share a
//! chunk and deleting one object's chunks cannot touch another's, even for identical content.
//!
//! Every record starts with its format. Manifests, upload and bucket records are written in format 2
//! ([`Extended`]): format 1's fields, then what was added (part sizes, the response headers
//! given at upload, checksums); format-1 records written by earlier gateways still read, but a
//! gateway from before format 2 refuses format-2 records: upgrade every gateway of a cluster
//! before writing through any upgraded one, and do not go back. Records with what format 3 added
//! (an object's encryption and tags, a bucket's tags) are in format 3: format 2, then those
//! fields. Only such records use it, and a gateway from before it refuses them (rather than
//! serving ciphertext as an object's bytes).
//!
//! Versioning (S3's, per bucket): the object's register always holds its current version, so
//! "the latest version" is what a linearizable read of that register returns. A bucket whose
//! versioning was ever set keeps the versions a write replaces: before the new current version
//! is written, the old one's record is copied to its own register and listed, newest first, in
//! the object's [`VersionList`]. A version id is [`new_version_id`]: a sequence number one above
//! every version the key has, then random bits, so ids sort in the order the register took the
//! versions, and versions written through different gateways never share one. A delete marker is
//! a record of its own ([`DeleteMarker`], format 6) in the object's register. Records carrying a
//! version id are in format 5: the id, then the record in its earlier format; records of buckets
//! never versioned stay as they were, so gateways from before versioning read them.
//!
//! An encrypted object's chunks (and inline body) are sealed ([`crate::seal`]): a chunk's
//! reference keeps the plaintext's length and the hash of the sealed bytes, which are
//! [`OVERHEAD`] longer.
//!
//! Chunks are stored as content-hash objects where the store offers them (a cluster does): one
//! write of `2f+1` acknowledgements per chunk instead of a register's three rounds. The object
//! holds a header ([`ChunkHeader`]: when it was written, and the object or upload part it
//! belongs to, for the collector), the body write's id, then the chunk's bytes, so no two
//! objects share one and a chunk is deleted with the object that owns it (objects written before
//! headers hold the write id and the bytes alone, and still read); its id goes into the record
//! beside the chunk's
//! reference, in format 4, which wraps the record's own format ([`encode_manifest`],
//! [`encode_part`]). Chunks in registers (records before format 4) still read.

pub use crate::seal::{OVERHEAD, Sealed};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Object data is cut into chunks of this size (the last may be shorter); well below the
/// register's 16 MiB limit so erasure coding and retransmission stay cheap.
pub const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Objects up to this size are stored inside their manifest: one register write per PUT.
pub const INLINE_BYTES_MAX: usize = 1024 * 1024;
/// The listing index of a bucket is split into this many registers, by hash of the object key.
pub const INDEX_SHARDS: u8 = 16;
/// S3's limit on an object key, in bytes.
pub const OBJECT_KEY_BYTES_MAX: usize = 1024;
/// S3's limit on user metadata (names and values together), in bytes.
pub const METADATA_BYTES_MAX: usize = 2048;
/// A manifest, upload record or index shard must fit in one register, with room for framing.
pub const RECORD_BYTES_MAX: usize = bulwark_core::OBJECT_BYTES_MAX - 64 * 1024;

/// Identifies one body write (a PUT, an uploaded part, a copy); scopes the chunks it created.
pub type WriteId = [u8; 16];

/// A fresh random write id.
pub fn new_write_id() -> WriteId {
    rand::random()
}

/// The register holding the list of buckets.
pub fn bucket_list_key() -> Vec<u8> {
    b"s3/buckets".to_vec()
}

/// The register saying that `bucket` exists.
pub fn bucket_key(bucket: &str) -> Vec<u8> {
    [b"s3/b/", bucket.as_bytes()].concat()
}

/// The register holding the manifest of `key` in `bucket`.
pub fn object_key(bucket: &str, key: &str) -> Vec<u8> {
    let hash = blake3::hash(key.as_bytes());
    [b"s3/o/", bucket.as_bytes(), b"/", hash.to_hex().as_bytes()].concat()
}

/// The register holding one chunk.
pub fn chunk_key(chunk: &ChunkRef) -> Vec<u8> {
    [
        b"s3/c/".as_slice(),
        hex::encode(chunk.write).as_bytes(),
        b"/",
        hex::encode(chunk.hash).as_bytes(),
    ]
    .concat()
}

/// Which index shard lists `key`.
pub fn shard_of(key: &str) -> u8 {
    blake3::hash(key.as_bytes()).as_bytes()[0] % INDEX_SHARDS
}

/// The register holding index shard `shard` of `bucket`.
pub fn shard_key(bucket: &str, shard: u8) -> Vec<u8> {
    [
        b"s3/i/",
        bucket.as_bytes(),
        b"/",
        shard.to_string().as_bytes(),
    ]
    .concat()
}

/// The register holding multipart upload `upload_id`.
pub fn upload_key(upload_id: &str) -> Vec<u8> {
    [b"s3/u/", upload_id.as_bytes()].concat()
}

/// The register holding part `number` of multipart upload `upload_id`.
pub fn part_key(upload_id: &str, number: u32) -> Vec<u8> {
    [
        b"s3/u/".as_slice(),
        upload_id.as_bytes(),
        b"/p/",
        number.to_string().as_bytes(),
    ]
    .concat()
}

/// The register listing `bucket`'s multipart uploads in progress.
pub fn upload_list_key(bucket: &str) -> Vec<u8> {
    [b"s3/ul/", bucket.as_bytes()].concat()
}

/// The register listing the noncurrent versions of `key` in `bucket`.
pub fn version_list_key(bucket: &str, key: &str) -> Vec<u8> {
    let hash = blake3::hash(key.as_bytes());
    [b"s3/vl/", bucket.as_bytes(), b"/", hash.to_hex().as_bytes()].concat()
}

/// The register holding noncurrent version `version` of `key` in `bucket`.
pub fn version_key(bucket: &str, key: &str, version: &str) -> Vec<u8> {
    let hash = blake3::hash(key.as_bytes());
    [
        b"s3/v/",
        bucket.as_bytes(),
        b"/",
        hash.to_hex().as_bytes(),
        b"/",
        version.as_bytes(),
    ]
    .concat()
}

/// The register listing the keys of `bucket` in index shard `shard` whose current version is a
/// delete marker.
pub fn marker_shard_key(bucket: &str, shard: u8) -> Vec<u8> {
    [
        b"s3/im/",
        bucket.as_bytes(),
        b"/",
        shard.to_string().as_bytes(),
    ]
    .concat()
}

/// A bucket's uploads in progress: (object key, upload id) → when started, in ms since the epoch.
pub type UploadList = BTreeMap<(String, String), u64>;

/// One chunk of an object: who wrote it, its BLAKE3 hash and length, and, for a chunk stored
/// as a content-hash object, that object's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkRef {
    /// The body write that created it.
    pub write: WriteId,
    /// BLAKE3 of its bytes as stored (sealed, for an encrypted object).
    pub hash: [u8; 32],
    /// The length of its plaintext in bytes.
    pub len: u32,
    /// The content-hash object holding the write id, then the chunk's bytes as stored; `None`
    /// for a chunk in its own register ([`chunk_key`]). Kept beside the record's fields, in
    /// format 4 ([`encode_manifest`]), so records without such chunks read as they always did.
    #[serde(skip)]
    pub object: Option<[u8; 32]>,
}

impl ChunkRef {
    /// Describes `data` as a chunk of write `write`.
    pub fn of(write: WriteId, data: &[u8]) -> ChunkRef {
        ChunkRef {
            write,
            hash: *blake3::hash(data).as_bytes(),
            len: u32::try_from(data.len()).unwrap_or(u32::MAX),
            object: None,
        }
    }

    /// Describes `stored`, the sealed form of `plain_len` bytes, as a chunk of write `write`.
    pub fn sealed(write: WriteId, plain_len: usize, stored: &[u8]) -> ChunkRef {
        debug_assert_eq!(stored.len(), plain_len + OVERHEAD);
        ChunkRef {
            write,
            hash: *blake3::hash(stored).as_bytes(),
            len: u32::try_from(plain_len).unwrap_or(u32::MAX),
            object: None,
        }
    }

    /// Whether `data` is exactly this chunk as stored, `overhead` bytes longer than its
    /// plaintext (0, or [`OVERHEAD`] when sealed).
    pub fn verify(&self, data: &[u8], overhead: usize) -> bool {
        data.len().checked_sub(overhead).map(u32::try_from) == Some(Ok(self.len))
            && *blake3::hash(data).as_bytes() == self.hash
    }
}

/// What a chunk's content-hash object says of where the chunk belongs, so that the collector
/// (`crate::collect`) can ask that object or part whether it still names the chunk, whatever
/// the listing index says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkOrigin {
    /// The bucket.
    pub bucket: String,
    /// The object's key.
    pub key: String,
    /// For a part of a multipart upload: the upload's id and the part's number.
    pub upload: Option<(String, u32)>,
}

/// What begins every chunk object the gateway writes, before its [`ChunkHeader`]: an object
/// without it is not the gateway's (a chunk of an older release, or anyone's content object),
/// and the collector never deletes it.
pub const CHUNK_MARKER: [u8; 8] = *b"bwgwchk1";

/// The header of a chunk object: when it was written and where it belongs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkHeader {
    /// Milliseconds since the Unix epoch, on the writing gateway's clock.
    pub written_ms: u64,
    /// Where it belongs.
    pub origin: ChunkOrigin,
}

/// A chunk's content-hash object: [`CHUNK_MARKER`], the header's length (2 bytes, big endian),
/// the [`ChunkHeader`], the body write's id, then the chunk's bytes as stored. The write id
/// makes the same bytes written twice two objects, each deleted with its own.
/// `None` when the header does not encode in 64 KiB (keys are at most
/// [`OBJECT_KEY_BYTES_MAX`], so a header is far smaller).
pub fn encode_chunk_object(header: &ChunkHeader, write: &WriteId, data: &[u8]) -> Option<Vec<u8>> {
    let encoded = postcard::to_stdvec(header).ok()?;
    let len = u16::try_from(encoded.len()).ok()?;
    let mut object = Vec::with_capacity(CHUNK_MARKER.len() + 2 + encoded.len() + 16 + data.len());
    object.extend_from_slice(&CHUNK_MARKER);
    object.extend_from_slice(&len.to_be_bytes());
    object.extend_from_slice(&encoded);
    object.extend_from_slice(write);
    object.extend_from_slice(data);
    Some(object)
}

/// A chunk object read back: its header (`None` for one written before headers, the write id
/// then the bytes), its write id and the chunk's bytes.
pub fn decode_chunk_object(object: &Bytes) -> Option<(Option<ChunkHeader>, WriteId, Bytes)> {
    let headed = object.strip_prefix(&CHUNK_MARKER[..]).and_then(|rest| {
        let (len, rest) = rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        let header: ChunkHeader = postcard::from_bytes(rest.get(..len)?).ok()?;
        let rest = rest.get(len..)?;
        let (write, _) = rest.split_first_chunk::<16>()?;
        let start = object.len() - rest.len() + 16;
        Some((Some(header), *write, object.slice(start..)))
    });
    headed.or_else(|| {
        let (write, _) = object.split_first_chunk::<16>()?;
        Some((None, *write, object.slice(16..)))
    })
}

/// Where an object's bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Data {
    /// In the manifest itself.
    Inline(Bytes),
    /// In chunk registers, in order.
    Chunks(Vec<ChunkRef>),
}

impl Data {
    /// The chunks this data owns (none when inline).
    pub fn chunks(&self) -> &[ChunkRef] {
        match self {
            Data::Inline(_) => &[],
            Data::Chunks(chunks) => chunks,
        }
    }
}

/// An object's current version: everything but its chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The full object key (the register key holds only its hash).
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The S3 ETag, without quotes.
    pub etag: String,
    /// `Content-Type` as given at upload.
    pub content_type: Option<String>,
    /// User metadata (`x-amz-meta-*`), sorted by name.
    pub metadata: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
    /// Number of multipart parts, 0 for a single-part object.
    pub parts: u32,
    /// The bytes.
    pub data: Data,
    /// What format 2 added (a format-1 manifest reads with none of it).
    #[serde(skip)]
    pub extra: ObjectExtra,
    /// How the object is encrypted, if it is (format 3).
    #[serde(skip)]
    pub sealed: Option<Sealed>,
    /// Its tags (format 3).
    #[serde(skip)]
    pub tags: Tags,
    /// Its version id in a bucket whose versioning was ever set (format 5); `None` in a bucket
    /// never versioned, where it is S3's `null` version.
    #[serde(skip)]
    pub version: Option<String>,
}

impl Manifest {
    /// Its version id, `null` when it has none.
    pub fn version_id(&self) -> &str {
        self.version.as_deref().unwrap_or(NULL_VERSION)
    }

    /// Bytes each stored chunk (or the inline body) has beyond its plaintext.
    pub fn overhead(&self) -> usize {
        if self.sealed.is_some() { OVERHEAD } else { 0 }
    }
}

/// What an object keeps beyond format 1: where its parts end, the response headers given at
/// upload, and the checksums it was stored with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectExtra {
    /// Each part's size, in order (empty for a single-part object, and for a multipart object
    /// written in format 1, whose part boundaries were not recorded).
    pub part_sizes: Vec<u64>,
    /// The response headers given at upload.
    pub headers: Headers,
    /// The `x-amz-checksum-*` values verified at upload, base64.
    pub checksums: Checksums,
}

/// Response headers an uploader sets and S3 returns on GET and HEAD.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    /// `Cache-Control`.
    pub cache_control: Option<String>,
    /// `Content-Disposition`.
    pub content_disposition: Option<String>,
    /// `Content-Encoding`, without the upload's own `aws-chunked`.
    pub content_encoding: Option<String>,
    /// `Content-Language`.
    pub content_language: Option<String>,
    /// `Expires`, as an HTTP date.
    pub expires: Option<String>,
}

/// A whole object's checksums, base64, for the algorithms its uploader asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksums {
    /// CRC-32.
    pub crc32: Option<String>,
    /// CRC-32C.
    pub crc32c: Option<String>,
    /// CRC-64/NVME.
    pub crc64nvme: Option<String>,
    /// SHA-1.
    pub sha1: Option<String>,
    /// SHA-256.
    pub sha256: Option<String>,
}

/// A record whose format 2 appends fields to format 1, and whose format 3 appends more: the
/// record is encoded as before, then its extra fields, then (in format 3) the further ones.
/// Format-1 and format-2 records still read, with the fields they lack at their defaults, and a
/// record whose format-3 fields are all at their defaults is still written in format 2, so that
/// gateways from before format 3 read it.
pub trait Extended: Serialize + for<'de> Deserialize<'de> {
    /// The fields format 2 added.
    type Extra: Serialize + for<'de> Deserialize<'de> + Default;
    /// The fields format 3 added.
    type More: Serialize + for<'de> Deserialize<'de> + Default + PartialEq;
    /// The extra fields, to encode.
    fn extra(&self) -> &Self::Extra;
    /// Sets the extra fields after decoding.
    fn set_extra(&mut self, extra: Self::Extra);
    /// The format-3 fields, to encode.
    fn more(&self) -> Self::More;
    /// Sets the format-3 fields after decoding.
    fn set_more(&mut self, more: Self::More);
}

/// What an object's (or a multipart upload's) record keeps in format 3.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMore {
    /// How the object is encrypted, if it is.
    pub sealed: Option<Sealed>,
    /// Its tags.
    pub tags: Tags,
}

/// What a bucket record keeps in format 3.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketMore {
    /// The bucket's tags.
    pub tags: Tags,
}

/// Tags (S3's object and bucket tagging): (key, value) pairs, keys unique, in the order given.
pub type Tags = Vec<(String, String)>;

impl Extended for Manifest {
    type Extra = ObjectExtra;
    type More = ObjectMore;
    fn extra(&self) -> &ObjectExtra {
        &self.extra
    }
    fn set_extra(&mut self, extra: ObjectExtra) {
        self.extra = extra;
    }
    fn more(&self) -> ObjectMore {
        ObjectMore {
            sealed: self.sealed.clone(),
            tags: self.tags.clone(),
        }
    }
    fn set_more(&mut self, more: ObjectMore) {
        self.sealed = more.sealed;
        self.tags = more.tags;
    }
}

/// What a multipart upload's record keeps in format 3.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadMore {
    /// How the parts and the final object are encrypted, if they are.
    pub sealed: Option<Sealed>,
    /// The final object's tags.
    pub tags: Tags,
    /// The checksum the upload was created with (`x-amz-checksum-algorithm`): every part is
    /// hashed with it, and the object gets S3's composite checksum of the parts'.
    pub checksum: Option<PartChecksum>,
    /// Which parts are uploaded, each in its own register ([`part_key`], a [`StoredPart`]), so
    /// that the record does not grow with the number of parts.
    pub uploaded: PartSet,
}

/// A set of part numbers, 1 to 10,000, as a bitmap of fixed size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartSet(Bytes);

impl PartSet {
    /// Bytes of a set that can hold every part number.
    const BYTES: usize = 10_000 / 8;

    /// Whether part `number` is in the set.
    pub fn contains(&self, number: u32) -> bool {
        let Some(bit) = number.checked_sub(1).map(|b| b as usize) else {
            return false;
        };
        self.0
            .get(bit / 8)
            .is_some_and(|byte| byte & (1 << (bit % 8)) != 0)
    }

    /// Adds part `number` (1 to 10,000); whether it was new.
    pub fn insert(&mut self, number: u32) -> bool {
        assert!(
            (1..=10_000).contains(&number),
            "part numbers are 1 to 10,000"
        );
        if self.contains(number) {
            return false;
        }
        let mut bits = if self.0.len() == Self::BYTES {
            self.0.to_vec()
        } else {
            vec![0u8; Self::BYTES]
        };
        let bit = (number - 1) as usize;
        bits[bit / 8] |= 1 << (bit % 8);
        self.0 = Bytes::from(bits);
        true
    }

    /// The part numbers in the set, in order; a set that is not [`PartSet::BYTES`] long (from a
    /// damaged record) holds what its bytes say, never a number above 10,000.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (1..=10_000u32).filter(|n| self.contains(*n))
    }
}

/// One uploaded part of a multipart upload, in its own register.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPart {
    /// The part.
    pub part: PartRecord,
    /// The checksums it was stored with (an unencrypted upload's).
    pub checksums: Checksums,
    /// The same, sealed with the upload's key (an encrypted upload's,
    /// [`crate::seal::Seal::seal_checksums`]).
    pub sealed_checksums: Bytes,
}

/// A checksum algorithm of a multipart upload, whose object's checksum is S3's composite one:
/// the algorithm over the concatenated binary checksums of the parts, then `-` and their count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartChecksum {
    /// CRC-32.
    Crc32,
    /// CRC-32C.
    Crc32c,
    /// SHA-1.
    Sha1,
    /// SHA-256.
    Sha256,
}

impl PartChecksum {
    /// The algorithm's name in S3's headers (`x-amz-checksum-<name>`, lower case).
    pub fn name(self) -> &'static str {
        match self {
            PartChecksum::Crc32 => "CRC32",
            PartChecksum::Crc32c => "CRC32C",
            PartChecksum::Sha1 => "SHA1",
            PartChecksum::Sha256 => "SHA256",
        }
    }
}

impl Checksums {
    /// The value for `algorithm`, base64.
    pub fn get(&self, algorithm: PartChecksum) -> Option<&String> {
        match algorithm {
            PartChecksum::Crc32 => self.crc32.as_ref(),
            PartChecksum::Crc32c => self.crc32c.as_ref(),
            PartChecksum::Sha1 => self.sha1.as_ref(),
            PartChecksum::Sha256 => self.sha256.as_ref(),
        }
    }

    /// Sets the value for `algorithm`.
    pub fn set(&mut self, algorithm: PartChecksum, value: String) {
        let field = match algorithm {
            PartChecksum::Crc32 => &mut self.crc32,
            PartChecksum::Crc32c => &mut self.crc32c,
            PartChecksum::Sha1 => &mut self.sha1,
            PartChecksum::Sha256 => &mut self.sha256,
        };
        *field = Some(value);
    }
}

impl Extended for UploadRecord {
    type Extra = Headers;
    type More = UploadMore;
    fn extra(&self) -> &Headers {
        &self.headers
    }
    fn set_extra(&mut self, headers: Headers) {
        self.headers = headers;
    }
    fn more(&self) -> UploadMore {
        self.more.clone()
    }
    fn set_more(&mut self, more: UploadMore) {
        self.more = more;
    }
}

/// A version tag in front of every record, so the format can change without guessing.
const FORMAT: u8 = 1;

/// The format of [`Extended`] records: format 1's fields, then the extra ones.
const FORMAT_EXTENDED: u8 = 2;

/// The format of [`Extended`] records with format-3 fields: format 2, then those.
const FORMAT_MORE: u8 = 3;

/// The format of records with chunks stored as content-hash objects: the tag, the object of each
/// chunk in order (`None` for a chunk in its own register), then the record in its own format.
/// A gateway from before it refuses such records rather than look for their chunks in registers.
const FORMAT_OBJECTS: u8 = 4;

/// Records that name chunks: what format 4 records the objects of.
pub trait Chunked {
    /// The chunks, in order.
    fn chunk_list(&self) -> Vec<&ChunkRef>;
    /// The same, to set their objects after decoding.
    fn chunk_list_mut(&mut self) -> Vec<&mut ChunkRef>;
}

impl Chunked for Manifest {
    fn chunk_list(&self) -> Vec<&ChunkRef> {
        self.data.chunks().iter().collect()
    }
    fn chunk_list_mut(&mut self) -> Vec<&mut ChunkRef> {
        match &mut self.data {
            Data::Inline(_) => Vec::new(),
            Data::Chunks(chunks) => chunks.iter_mut().collect(),
        }
    }
}

impl Chunked for StoredPart {
    fn chunk_list(&self) -> Vec<&ChunkRef> {
        self.part.chunks.iter().collect()
    }
    fn chunk_list_mut(&mut self) -> Vec<&mut ChunkRef> {
        self.part.chunks.iter_mut().collect()
    }
}

/// The content-hash object of each chunk of a format-4 record, in chunk order (none for a chunk
/// kept in a register).
type ChunkObjects = Vec<Option<[u8; 32]>>;

/// `inner`, the encoding of `value`, in format 4 when any of its chunks is a content-hash object.
fn with_objects<T: Chunked>(
    what: &'static str,
    value: &T,
    inner: Bytes,
) -> Result<Bytes, LayoutError> {
    let objects: ChunkObjects = value.chunk_list().iter().map(|c| c.object).collect();
    if objects.iter().all(Option::is_none) {
        return Ok(inner);
    }
    let mut out = encoded(what, vec![FORMAT_OBJECTS], &objects)?;
    out.extend_from_slice(&inner);
    bounded(what, out)
}

/// The objects a format-4 record names, and the record in its own format; no objects for any
/// other format.
fn without_objects<'a>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<(Option<ChunkObjects>, &'a [u8]), LayoutError> {
    match bytes.split_first() {
        Some((&FORMAT_OBJECTS, rest)) => {
            let (objects, inner) =
                postcard::take_from_bytes::<ChunkObjects>(rest).map_err(|e| {
                    LayoutError::Malformed {
                        what,
                        problem: e.to_string(),
                    }
                })?;
            if inner.first() == Some(&FORMAT_OBJECTS) {
                return Err(LayoutError::Malformed {
                    what,
                    problem: "format 4 inside format 4".into(),
                });
            }
            Ok((Some(objects), inner))
        }
        _ => Ok((None, bytes)),
    }
}

/// Sets the objects of `value`'s chunks from a format-4 record's list, which names one per chunk.
fn set_objects<T: Chunked>(
    what: &'static str,
    value: &mut T,
    objects: Option<ChunkObjects>,
) -> Result<(), LayoutError> {
    let Some(objects) = objects else {
        return Ok(());
    };
    let mut chunks = value.chunk_list_mut();
    if chunks.len() != objects.len() {
        return Err(LayoutError::Malformed {
            what,
            problem: format!("{} objects for {} chunks", objects.len(), chunks.len()),
        });
    }
    for (chunk, object) in chunks.iter_mut().zip(objects) {
        chunk.object = object;
    }
    Ok(())
}

/// The format of records with a version id: the id, then the record in an earlier format.
const FORMAT_VERSIONED: u8 = 5;

/// The format of a delete marker in an object's register.
const FORMAT_MARKER: u8 = 6;

/// `inner` preceded by `version`, in format 5, when there is one.
fn with_version(
    what: &'static str,
    version: Option<&str>,
    inner: Bytes,
) -> Result<Bytes, LayoutError> {
    let Some(id) = version else {
        return Ok(inner);
    };
    assert!(
        is_version_id(id),
        "a record is stamped with a well-formed version id"
    );
    let mut out = encoded(what, vec![FORMAT_VERSIONED], id)?;
    out.extend_from_slice(&inner);
    bounded(what, out)
}

/// The version id of a format-5 record and the record in its own format; no id for another.
fn without_version<'a>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<(Option<String>, &'a [u8]), LayoutError> {
    let Some((&FORMAT_VERSIONED, rest)) = bytes.split_first() else {
        return Ok((None, bytes));
    };
    let malformed = |problem: String| LayoutError::Malformed { what, problem };
    let (id, inner) =
        postcard::take_from_bytes::<String>(rest).map_err(|e| malformed(e.to_string()))?;
    if !is_version_id(&id) {
        return Err(malformed(format!("version id {id:?}")));
    }
    if inner.first() == Some(&FORMAT_VERSIONED) {
        return Err(malformed("format 5 inside format 5".into()));
    }
    Ok((Some(id), inner))
}

/// Encodes a manifest: format 2 or 3, inside format 4 when its chunks are objects, inside
/// format 5 when it has a version id.
pub fn encode_manifest(manifest: &Manifest) -> Result<Bytes, LayoutError> {
    let inner = encode_extended("manifest", manifest)?;
    let inner = with_objects("manifest", manifest, inner)?;
    with_version("manifest", manifest.version.as_deref(), inner)
}

/// Encodes what an object's register holds.
pub fn encode_head(head: &Head) -> Result<Bytes, LayoutError> {
    match head {
        Head::Object(manifest) => encode_manifest(manifest),
        Head::Marker(marker) => {
            assert!(is_version_id(&marker.version), "a marker has a version id");
            bounded(
                "delete marker",
                encoded("delete marker", vec![FORMAT_MARKER], marker)?,
            )
        }
    }
}

/// Encodes a bucket record: format 2 or 3, inside format 5 once its versioning was set.
pub fn encode_bucket(record: &BucketRecord) -> Result<Bytes, LayoutError> {
    let inner = encode_extended("bucket", record)?;
    if record.versioning == Versioning::Unversioned {
        return Ok(inner);
    }
    let mut out = encoded("bucket", vec![FORMAT_VERSIONED], &record.versioning)?;
    out.extend_from_slice(&inner);
    bounded("bucket", out)
}

/// Decodes what [`encode_bucket`] (or a gateway from before it) wrote.
pub fn decode_bucket(bytes: &[u8]) -> Result<BucketRecord, LayoutError> {
    let Some((&FORMAT_VERSIONED, rest)) = bytes.split_first() else {
        return decode_extended("bucket", bytes);
    };
    let malformed = |problem: String| LayoutError::Malformed {
        what: "bucket",
        problem,
    };
    let (versioning, inner) =
        postcard::take_from_bytes::<Versioning>(rest).map_err(|e| malformed(e.to_string()))?;
    if versioning == Versioning::Unversioned {
        return Err(malformed("format 5 without versioning".into()));
    }
    let mut record: BucketRecord = decode_extended("bucket", inner)?;
    record.versioning = versioning;
    Ok(record)
}

/// Encodes an uploaded part: format 1, inside format 4 when its chunks are objects.
pub fn encode_part(part: &StoredPart) -> Result<Bytes, LayoutError> {
    let inner = encode("part", part)?;
    with_objects("part", part, inner)
}

/// Decodes what [`encode_part`] wrote.
pub fn decode_part(bytes: &[u8]) -> Result<StoredPart, LayoutError> {
    let (objects, inner) = without_objects("part", bytes)?;
    let mut part: StoredPart = decode("part", inner)?;
    set_objects("part", &mut part, objects)?;
    Ok(part)
}

/// Why a stored record could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The bytes are not a record of this format.
    #[error("malformed {what} record: {problem}")]
    Malformed {
        /// The kind of record.
        what: &'static str,
        /// What was wrong.
        problem: String,
    },
    /// The record would not fit in a register.
    #[error("{what} record would be {len} bytes; a register holds at most {max}")]
    TooLarge {
        /// The kind of record.
        what: &'static str,
        /// Its encoded size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A chunk's bytes do not hash to what the manifest says.
    #[error("chunk {} of write {} failed verification", hex::encode(.hash), hex::encode(.write))]
    ChunkMismatch {
        /// The write that created it.
        write: WriteId,
        /// Its expected hash.
        hash: [u8; 32],
    },
    /// A manifest for a different object key sits in this object's register.
    #[error("manifest names key {found:?}, expected {expected:?}")]
    WrongKey {
        /// The key asked for.
        expected: String,
        /// The key in the manifest.
        found: String,
    },
}

/// Encodes a record with its format tag, refusing anything a register cannot hold.
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Bytes, LayoutError> {
    bounded(what, encoded(what, vec![FORMAT], value)?)
}

/// Encodes an [`Extended`] record in format 2, or in format 3 when it has format-3 fields.
pub fn encode_extended<T: Extended>(what: &'static str, value: &T) -> Result<Bytes, LayoutError> {
    let more = value.more();
    let has_more = more != T::More::default();
    let format = if has_more {
        FORMAT_MORE
    } else {
        FORMAT_EXTENDED
    };
    let out = encoded(what, vec![format], value)?;
    let out = encoded(what, out, value.extra())?;
    if has_more {
        bounded(what, encoded(what, out, &more)?)
    } else {
        bounded(what, out)
    }
}

/// `out` with `value` appended.
fn encoded<T: Serialize + ?Sized>(
    what: &'static str,
    mut out: Vec<u8>,
    value: &T,
) -> Result<Vec<u8>, LayoutError> {
    postcard::to_io(value, &mut out).map_err(|e| LayoutError::Malformed {
        what,
        problem: e.to_string(),
    })?;
    Ok(out)
}

/// `out`, unless a register cannot hold it.
fn bounded(what: &'static str, out: Vec<u8>) -> Result<Bytes, LayoutError> {
    if out.len() > RECORD_BYTES_MAX {
        return Err(LayoutError::TooLarge {
            what,
            len: out.len(),
            max: RECORD_BYTES_MAX,
        });
    }
    Ok(Bytes::from(out))
}

/// Decodes a record written by [`encode`].
pub fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, LayoutError> {
    match bytes.split_first() {
        Some((&FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| LayoutError::Malformed {
            what,
            problem: e.to_string(),
        }),
        Some((tag, _)) => Err(LayoutError::Malformed {
            what,
            problem: format!("unknown format {tag}"),
        }),
        None => Err(LayoutError::Malformed {
            what,
            problem: "empty".into(),
        }),
    }
}

/// Decodes an [`Extended`] record of format 1, 2 or 3.
pub fn decode_extended<T: Extended>(what: &'static str, bytes: &[u8]) -> Result<T, LayoutError> {
    let malformed = |e: postcard::Error| LayoutError::Malformed {
        what,
        problem: e.to_string(),
    };
    match bytes.split_first() {
        Some((&FORMAT, _)) => decode(what, bytes),
        Some((&format @ (FORMAT_EXTENDED | FORMAT_MORE), rest)) => {
            let (mut value, rest) = postcard::take_from_bytes::<T>(rest).map_err(malformed)?;
            let (extra, mut rest) =
                postcard::take_from_bytes::<T::Extra>(rest).map_err(malformed)?;
            if format == FORMAT_MORE {
                let (more, after) =
                    postcard::take_from_bytes::<T::More>(rest).map_err(malformed)?;
                value.set_more(more);
                rest = after;
            }
            if !rest.is_empty() {
                return Err(LayoutError::Malformed {
                    what,
                    problem: format!("{} bytes after the record", rest.len()),
                });
            }
            value.set_extra(extra);
            Ok(value)
        }
        Some((tag, _)) => Err(LayoutError::Malformed {
            what,
            problem: format!("unknown format {tag}"),
        }),
        None => Err(LayoutError::Malformed {
            what,
            problem: "empty".into(),
        }),
    }
}

/// Decodes the manifest in `key`'s register and checks it is `key`'s; a delete marker there is
/// refused as malformed (readers of registers that may hold one use [`decode_head`]).
pub fn decode_manifest(key: &str, bytes: &[u8]) -> Result<Manifest, LayoutError> {
    match decode_head(key, bytes)? {
        Head::Object(manifest) => Ok(manifest),
        Head::Marker(_) => Err(LayoutError::Malformed {
            what: "manifest",
            problem: "a delete marker".into(),
        }),
    }
}

/// Decodes what `key`'s register holds, an object's manifest or a delete marker, and checks it
/// is `key`'s.
pub fn decode_head(key: &str, bytes: &[u8]) -> Result<Head, LayoutError> {
    if let Some((&FORMAT_MARKER, rest)) = bytes.split_first() {
        let marker: DeleteMarker =
            postcard::from_bytes(rest).map_err(|e| LayoutError::Malformed {
                what: "delete marker",
                problem: e.to_string(),
            })?;
        if marker.key != key {
            return Err(LayoutError::WrongKey {
                expected: key.to_owned(),
                found: marker.key,
            });
        }
        if !is_version_id(&marker.version) {
            return Err(LayoutError::Malformed {
                what: "delete marker",
                problem: format!("version id {:?}", marker.version),
            });
        }
        return Ok(Head::Marker(marker));
    }
    let (version, bytes) = without_version("manifest", bytes)?;
    let (objects, inner) = without_objects("manifest", bytes)?;
    let mut manifest: Manifest = decode_extended("manifest", inner)?;
    manifest.version = version;
    set_objects("manifest", &mut manifest, objects)?;
    if manifest.key != key {
        return Err(LayoutError::WrongKey {
            expected: key.to_owned(),
            found: manifest.key,
        });
    }
    let total: Option<u64> = match &manifest.data {
        Data::Inline(bytes) => (bytes.len() as u64).checked_sub(manifest.overhead() as u64),
        Data::Chunks(chunks) => Some(chunks.iter().map(|c| u64::from(c.len)).sum()),
    };
    let Some(total) = total else {
        return Err(LayoutError::Malformed {
            what: "manifest",
            problem: "an encrypted inline body shorter than its seal".into(),
        });
    };
    if total != manifest.size {
        return Err(LayoutError::Malformed {
            what: "manifest",
            problem: format!("size {} but data holds {total} bytes", manifest.size),
        });
    }
    let sizes = &manifest.extra.part_sizes;
    if !sizes.is_empty()
        && (sizes.len() != manifest.parts as usize
            || sizes
                .iter()
                .try_fold(0u64, |sum, size| sum.checked_add(*size))
                != Some(manifest.size))
    {
        return Err(LayoutError::Malformed {
            what: "manifest",
            problem: format!(
                "{} part sizes for {} parts of {} bytes",
                sizes.len(),
                manifest.parts,
                manifest.size
            ),
        });
    }
    Ok(Head::Object(manifest))
}

/// Checks a fetched chunk against its reference; `overhead` as for [`ChunkRef::verify`].
pub fn verify_chunk(chunk: &ChunkRef, data: &[u8], overhead: usize) -> Result<(), LayoutError> {
    if chunk.verify(data, overhead) {
        Ok(())
    } else {
        Err(LayoutError::ChunkMismatch {
            write: chunk.write,
            hash: chunk.hash,
        })
    }
}

/// A bucket's existence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRecord {
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// What format 2 added.
    #[serde(skip)]
    pub extra: BucketExtra,
    /// What format 3 added.
    #[serde(skip)]
    pub more: BucketMore,
    /// Its versioning (format 5).
    #[serde(skip)]
    pub versioning: Versioning,
}

/// A bucket's versioning, as S3 has it: once set, it is enabled or suspended, never unset again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Versioning {
    /// Never set: every object is its one `null` version, and a write replaces it.
    #[default]
    Unversioned,
    /// Every write makes a new version, and a delete a delete marker; old versions are kept.
    Enabled,
    /// Writes make the `null` version, replacing the one there was; other versions are kept.
    Suspended,
}

/// The version id S3 gives objects written while a bucket's versioning was not enabled.
pub const NULL_VERSION: &str = "null";

/// The length of the version ids this gateway makes: 16 hex digits of sequence, 16 of chance.
pub const VERSION_ID_LEN: usize = 32;

/// The most noncurrent versions one key keeps; a write that would keep more is refused, so that
/// the key's [`VersionList`] always fits its register.
pub const NONCURRENT_VERSIONS_MAX: usize = 50_000;

/// A new version id with sequence number `seq`: ids sort as their sequence numbers do.
pub fn new_version_id(seq: u64) -> String {
    format!("{seq:016x}{:016x}", rand::random::<u64>())
}

/// The sequence number of a version id this gateway made; `None` for `null` (and anything else).
pub fn version_seq(id: &str) -> Option<u64> {
    if !is_version_id(id) || id == NULL_VERSION {
        return None;
    }
    u64::from_str_radix(&id[..16], 16).ok()
}

/// Whether `id` is a version id this gateway could have made: `null`, or [`VERSION_ID_LEN`]
/// lowercase hex digits.
pub fn is_version_id(id: &str) -> bool {
    id == NULL_VERSION
        || (id.len() == VERSION_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// What the object's register holds when its current version is a delete marker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteMarker {
    /// The full object key.
    pub key: String,
    /// The marker's version id (`null` under suspended versioning).
    pub version: String,
    /// When it was made, in milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
}

/// What an object's register holds: its current version, an object or a delete marker.
// One lives per request, briefly; boxing the manifest would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Head {
    /// An object.
    Object(Manifest),
    /// A delete marker.
    Marker(DeleteMarker),
}

impl Head {
    /// Its version id.
    pub fn version_id(&self) -> &str {
        match self {
            Head::Object(manifest) => manifest.version_id(),
            Head::Marker(marker) => &marker.version,
        }
    }

    /// How a listing of versions shows it.
    pub fn listed(&self) -> ListedVersion {
        match self {
            Head::Object(m) => ListedVersion {
                id: m.version_id().to_owned(),
                marker: false,
                size: m.size,
                etag: m.etag.clone(),
                last_modified_ms: m.last_modified_ms,
            },
            Head::Marker(d) => ListedVersion {
                id: d.version.clone(),
                marker: true,
                size: 0,
                etag: String::new(),
                last_modified_ms: d.last_modified_ms,
            },
        }
    }
}

/// An object's noncurrent versions, newest first. A gateway stopped between writing this list and
/// the object's register can leave the current version listed here too: readers skip it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionList {
    /// The full object key.
    pub key: String,
    /// The versions.
    pub versions: Vec<ListedVersion>,
}

/// What a listing of versions shows of one, kept in the [`VersionList`] so it reads no record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedVersion {
    /// Its version id.
    pub id: String,
    /// Whether it is a delete marker (whose record is this entry: it has no register).
    pub marker: bool,
    /// Size in bytes (0 for a marker).
    pub size: u64,
    /// ETag without quotes (empty for a marker).
    pub etag: String,
    /// Milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
}

impl ListedVersion {
    /// The delete marker this entry is, for `key`.
    pub fn as_marker(&self, key: &str) -> DeleteMarker {
        DeleteMarker {
            key: key.to_owned(),
            version: self.id.clone(),
            last_modified_ms: self.last_modified_ms,
        }
    }
}

/// One shard of the keys of a bucket whose current version is a delete marker: listed among
/// versions, not among objects.
pub type MarkerShard = std::collections::BTreeSet<String>;

/// What a bucket record keeps beyond format 1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketExtra {
    /// The causal volume holding the bucket's objects; `None`: registers (format 1's only kind).
    pub causal: Option<String>,
}

impl Extended for BucketRecord {
    type Extra = BucketExtra;
    type More = BucketMore;
    fn extra(&self) -> &BucketExtra {
        &self.extra
    }
    fn set_extra(&mut self, extra: BucketExtra) {
        self.extra = extra;
    }
    fn more(&self) -> BucketMore {
        self.more.clone()
    }
    fn set_more(&mut self, more: BucketMore) {
        self.more = more;
    }
}

/// Every bucket, by name, with its creation time.
pub type BucketList = BTreeMap<String, u64>;

/// What a listing shows of an object, kept in the index so listing reads no manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Size in bytes.
    pub size: u64,
    /// ETag without quotes.
    pub etag: String,
    /// Milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
}

/// One shard of a bucket's listing index: the objects whose keys hash into it.
pub type IndexShard = BTreeMap<String, IndexEntry>;

/// One uploaded part of a multipart upload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// Size in bytes.
    pub size: u64,
    /// MD5 of the part's bytes.
    pub md5: [u8; 16],
    /// Milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
    /// Its chunks.
    pub chunks: Vec<ChunkRef>,
}

/// A multipart upload in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    /// Target bucket.
    pub bucket: String,
    /// Target object key.
    pub key: String,
    /// Content type for the final object.
    pub content_type: Option<String>,
    /// User metadata for the final object.
    pub metadata: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Parts uploaded so far, by part number, as gateways before format 3 kept them; newer
    /// parts are in their own registers (`more.uploaded`).
    pub parts: BTreeMap<u32, PartRecord>,
    /// Response headers for the final object (format 2).
    #[serde(skip)]
    pub headers: Headers,
    /// What format 3 added: encryption (its checksums empty), tags, checksums.
    #[serde(skip)]
    pub more: UploadMore,
}

/// Hex MD5 of a single-part object: the ETag S3 clients compare with their own MD5.
pub fn single_part_etag(md5: &[u8; 16]) -> String {
    hex::encode(md5)
}

/// S3's multipart ETag: hex MD5 of the concatenated binary MD5s of the parts, `-`, part count.
pub fn multipart_etag(part_md5s: &[[u8; 16]]) -> String {
    use md5::Digest;
    let mut hasher = md5::Md5::new();
    for md5 in part_md5s {
        hasher.update(md5);
    }
    format!("{}-{}", hex::encode(hasher.finalize()), part_md5s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(key: &str, data: Data, size: u64) -> Manifest {
        Manifest {
            version: None,
            key: key.into(),
            size,
            etag: "e".into(),
            content_type: Some("text/plain".into()),
            metadata: vec![("a".into(), "b".into())],
            last_modified_ms: 1,
            parts: 0,
            data,
            extra: ObjectExtra::default(),
            sealed: None,
            tags: Vec::new(),
        }
    }

    #[test]
    fn a_substituted_chunk_is_detected() {
        let write = new_write_id();
        let chunk = ChunkRef::of(write, b"the real bytes");
        assert!(verify_chunk(&chunk, b"the real bytes", 0).is_ok());
        assert!(matches!(
            verify_chunk(&chunk, b"the fake bytes", 0),
            Err(LayoutError::ChunkMismatch { .. })
        ));
        assert!(verify_chunk(&chunk, b"the real byte", 0).is_err());
        assert!(verify_chunk(&chunk, b"", 0).is_err());
    }

    #[test]
    fn manifests_round_trip_and_are_bound_to_their_key() {
        let write = new_write_id();
        let chunks = vec![ChunkRef::of(write, &[1; 10]), ChunkRef::of(write, &[2; 5])];
        let m = manifest("a/b", Data::Chunks(chunks), 15);
        let bytes = encode_extended("manifest", &m).unwrap();
        assert_eq!(decode_manifest("a/b", &bytes).unwrap(), m);
        assert!(matches!(
            decode_manifest("a/c", &bytes),
            Err(LayoutError::WrongKey { .. })
        ));
        let lying = manifest("a/b", Data::Inline(Bytes::from_static(b"abc")), 4);
        let bytes = encode("manifest", &lying).unwrap();
        assert!(decode_manifest("a/b", &bytes).is_err());
    }

    #[test]
    fn format_1_manifests_still_read_and_format_2_keeps_parts_headers_and_checksums() {
        let write = new_write_id();
        let chunks = vec![ChunkRef::of(write, &[1; 10]), ChunkRef::of(write, &[2; 5])];
        let mut m = manifest("a/b", Data::Chunks(chunks), 15);
        m.parts = 2;
        // Written before format 2: no extras, read as before.
        let old = encode("manifest", &m).unwrap();
        assert_eq!(decode_manifest("a/b", &old).unwrap(), m);
        m.extra = ObjectExtra {
            part_sizes: vec![10, 5],
            headers: Headers {
                cache_control: Some("no-cache".into()),
                expires: Some("Thu, 01 Dec 1994 16:00:00 GMT".into()),
                ..Headers::default()
            },
            checksums: Checksums {
                crc32: Some("AAAAAA==".into()),
                ..Checksums::default()
            },
        };
        let new = encode_extended("manifest", &m).unwrap();
        assert_eq!(decode_manifest("a/b", &new).unwrap(), m);
        let trailing = [&new[..], &[0]].concat();
        assert!(
            decode_manifest("a/b", &trailing).is_err(),
            "bytes after the record"
        );
        // Part sizes that do not add up to the object are refused.
        m.extra.part_sizes = vec![10, 6];
        let lying = encode_extended("manifest", &m).unwrap();
        assert!(decode_manifest("a/b", &lying).is_err());
        m.extra.part_sizes = vec![15];
        let lying = encode_extended("manifest", &m).unwrap();
        assert!(decode_manifest("a/b", &lying).is_err());
        // Upload records too.
        let mut record = UploadRecord {
            bucket: "b".into(),
            key: "k".into(),
            content_type: None,
            metadata: Vec::new(),
            created_ms: 1,
            parts: BTreeMap::new(),
            headers: Headers::default(),
            more: UploadMore::default(),
        };
        let old = encode("upload", &record).unwrap();
        assert_eq!(
            decode_extended::<UploadRecord>("upload", &old).unwrap(),
            record
        );
        record.headers.content_language = Some("en".into());
        let new = encode_extended("upload", &record).unwrap();
        assert_eq!(
            decode_extended::<UploadRecord>("upload", &new).unwrap(),
            record
        );
    }

    #[test]
    fn encrypted_and_tagged_records_are_format_3_and_others_stay_format_2() {
        let sealed = Sealed {
            mode: crate::seal::SealMode::Gateway { key: "k1".into() },
            checksums: Bytes::from_static(b"sealed checksums"),
        };
        let mut m = manifest("k", Data::Inline(Bytes::from(vec![0u8; 5 + OVERHEAD])), 5);
        m.sealed = Some(sealed.clone());
        let bytes = encode_extended("manifest", &m).unwrap();
        assert_eq!(bytes[0], FORMAT_MORE);
        assert_eq!(decode_manifest("k", &bytes).unwrap(), m);
        // Read as format 2 (a gateway from before format 3), the record has bytes after it.
        let mut as_two = bytes.to_vec();
        as_two[0] = FORMAT_EXTENDED;
        assert!(decode_manifest("k", &as_two).is_err());
        // An unencrypted manifest stays in format 2.
        m.sealed = None;
        assert_eq!(encode_extended("manifest", &m).unwrap()[0], FORMAT_EXTENDED);
        // A sealed inline body must hold its seal.
        let mut short = manifest("k", Data::Inline(Bytes::from(vec![0u8; 3])), 0);
        short.sealed = Some(sealed.clone());
        let bytes = encode_extended("manifest", &short).unwrap();
        assert!(decode_manifest("k", &bytes).is_err());
        // Tags alone are format 3 too, for objects and buckets.
        let mut tagged = manifest("k", Data::Inline(Bytes::from_static(b"hello")), 5);
        tagged.tags = vec![("team".into(), "blue".into())];
        let bytes = encode_extended("manifest", &tagged).unwrap();
        assert_eq!(bytes[0], FORMAT_MORE);
        assert_eq!(decode_manifest("k", &bytes).unwrap(), tagged);
        let mut record = BucketRecord {
            versioning: Versioning::Unversioned,
            created_ms: 1,
            extra: BucketExtra::default(),
            more: BucketMore::default(),
        };
        assert_eq!(
            encode_extended("bucket", &record).unwrap()[0],
            FORMAT_EXTENDED
        );
        record.more.tags = vec![("a".into(), "".into())];
        let bytes = encode_extended("bucket", &record).unwrap();
        assert_eq!(bytes[0], FORMAT_MORE);
        assert_eq!(
            decode_extended::<BucketRecord>("bucket", &bytes).unwrap(),
            record
        );
    }

    #[test]
    fn garbage_records_are_errors_not_panics() {
        for bytes in [
            &[][..],
            &[0],
            &[1],
            &[1, 255, 255, 255, 255, 15],
            &[9, 1, 2],
        ] {
            assert!(decode::<Manifest>("manifest", bytes).is_err());
            assert!(decode::<UploadRecord>("upload", bytes).is_err());
        }
    }

    #[test]
    fn chunks_of_different_writes_never_share_a_register() {
        let a = ChunkRef::of(new_write_id(), b"same");
        let b = ChunkRef::of(new_write_id(), b"same");
        assert_eq!(a.hash, b.hash);
        assert_ne!(chunk_key(&a), chunk_key(&b));
    }

    #[test]
    fn register_keys_fit_the_register_bound() {
        let long_bucket = "b".repeat(63);
        let long_key = "k".repeat(OBJECT_KEY_BYTES_MAX);
        assert!(object_key(&long_bucket, &long_key).len() <= bulwark_core::Key::BYTES_MAX);
        assert!(shard_key(&long_bucket, INDEX_SHARDS - 1).len() <= bulwark_core::Key::BYTES_MAX);
        assert!(chunk_key(&ChunkRef::of([0; 16], b"")).len() <= bulwark_core::Key::BYTES_MAX);
    }

    #[test]
    fn etags_match_what_s3_clients_compute() {
        use md5::Digest;
        // Any S3 client checks a single-part ETag against its own MD5 of the body.
        let md5: [u8; 16] = md5::Md5::digest(b"hello").into();
        assert_eq!(single_part_etag(&md5), "5d41402abc4b2a76b9719d911017c592");
        // Two parts "a" and "b": MD5 of the two binary digests, then the part count.
        let a: [u8; 16] = md5::Md5::digest(b"a").into();
        let b: [u8; 16] = md5::Md5::digest(b"b").into();
        let joined: [u8; 16] = md5::Md5::digest([a, b].concat()).into();
        assert_eq!(
            multipart_etag(&[a, b]),
            format!("{}-2", hex::encode(joined))
        );
    }

    #[test]
    fn oversized_records_are_refused() {
        let m = manifest(
            "k",
            Data::Inline(Bytes::from(vec![0; RECORD_BYTES_MAX])),
            RECORD_BYTES_MAX as u64,
        );
        assert!(matches!(
            encode("manifest", &m),
            Err(LayoutError::TooLarge { .. })
        ));
    }

    #[test]
    fn chunks_stored_as_objects_are_named_in_format_4_around_the_records_own_format() {
        let chunk = |i: u8, object: Option<[u8; 32]>| ChunkRef {
            write: [i; 16],
            hash: [i; 32],
            len: 10,
            object,
        };
        let manifest = |chunks: Vec<ChunkRef>| {
            let size = 10 * chunks.len() as u64;
            manifest("k", Data::Chunks(chunks), size)
        };
        // No chunk an object: the record's own format, as before.
        let plain = manifest(vec![chunk(1, None), chunk(2, None)]);
        let bytes = encode_manifest(&plain).unwrap();
        assert_ne!(bytes[0], FORMAT_OBJECTS);
        assert_eq!(decode_manifest("k", &bytes).unwrap(), plain);
        // Objects, mixed with registers (a multipart upload begun before the upgrade).
        let mixed = manifest(vec![chunk(1, Some([9; 32])), chunk(2, None)]);
        let bytes = encode_manifest(&mixed).unwrap();
        assert_eq!(bytes[0], FORMAT_OBJECTS);
        assert_eq!(decode_manifest("k", &bytes).unwrap(), mixed);
        // A gateway that only knows formats 1 to 3 refuses it.
        assert!(decode_extended::<Manifest>("manifest", &bytes).is_err());
        // A list that does not name one object per chunk, or format 4 twice, is refused.
        let short = [
            &[FORMAT_OBJECTS][..],
            &postcard::to_allocvec(&vec![Some([9u8; 32])]).unwrap(),
            &encode_extended("manifest", &mixed).unwrap(),
        ]
        .concat();
        assert!(decode_manifest("k", &short).is_err());
        let twice = [&[FORMAT_OBJECTS][..], &bytes].concat();
        assert!(decode_manifest("k", &twice).is_err());
        // Parts likewise.
        let part = StoredPart {
            part: PartRecord {
                size: 10,
                md5: [0; 16],
                last_modified_ms: 1,
                chunks: vec![chunk(3, Some([7; 32]))],
            },
            checksums: Checksums::default(),
            sealed_checksums: Bytes::new(),
        };
        let bytes = encode_part(&part).unwrap();
        assert_eq!(bytes[0], FORMAT_OBJECTS);
        assert_eq!(decode_part(&bytes).unwrap(), part);
        let old = encode("part", &part).unwrap();
        assert_eq!(decode_part(&old).unwrap().part.chunks[0].object, None);
    }

    #[test]
    fn versioned_records_carry_their_id_and_unversioned_ones_keep_their_format() {
        let plain = manifest("k", Data::Inline(Bytes::from_static(b"hello")), 5);
        let bytes = encode_manifest(&plain).unwrap();
        assert_eq!(
            bytes[0], FORMAT_EXTENDED,
            "a bucket never versioned writes as before"
        );
        let mut versioned = plain.clone();
        versioned.version = Some(new_version_id(7));
        let bytes = encode_manifest(&versioned).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSIONED);
        assert_eq!(decode_manifest("k", &bytes).unwrap(), versioned);
        assert_eq!(version_seq(versioned.version_id()), Some(7));
        assert!(decode_manifest("other", &bytes).is_err());
        // The id is checked, and one stamp only.
        let mut forged = vec![FORMAT_VERSIONED];
        postcard::to_io("../../s3/b/x", &mut forged).unwrap();
        forged.extend_from_slice(&encode_manifest(&plain).unwrap());
        assert!(decode_head("k", &forged).is_err());
        let mut twice = vec![FORMAT_VERSIONED];
        postcard::to_io(NULL_VERSION, &mut twice).unwrap();
        twice.extend_from_slice(&bytes);
        assert!(decode_head("k", &twice).is_err());

        let marker = Head::Marker(DeleteMarker {
            key: "k".into(),
            version: new_version_id(8),
            last_modified_ms: 9,
        });
        let bytes = encode_head(&marker).unwrap();
        assert_eq!(decode_head("k", &bytes).unwrap(), marker);
        assert!(decode_head("other", &bytes).is_err());
        assert!(
            decode_manifest("k", &bytes).is_err(),
            "a marker is no manifest"
        );
        for cut in 0..bytes.len() {
            assert!(decode_head("k", &bytes[..cut]).is_err());
        }

        let mut record = BucketRecord {
            versioning: Versioning::Unversioned,
            created_ms: 1,
            extra: BucketExtra::default(),
            more: BucketMore::default(),
        };
        assert_eq!(encode_bucket(&record).unwrap()[0], FORMAT_EXTENDED);
        for versioning in [Versioning::Enabled, Versioning::Suspended] {
            record.versioning = versioning;
            let bytes = encode_bucket(&record).unwrap();
            assert_eq!(bytes[0], FORMAT_VERSIONED);
            assert_eq!(decode_bucket(&bytes).unwrap(), record);
        }
        let mut unset = vec![FORMAT_VERSIONED];
        postcard::to_io(&Versioning::Unversioned, &mut unset).unwrap();
        unset.extend_from_slice(&encode_extended("bucket", &record).unwrap());
        assert!(decode_bucket(&unset).is_err());
        assert!(!is_version_id("0123456789abcdef0123456789ABCDEF"));
        assert!(!is_version_id("0123456789abcdef"));
        assert!(is_version_id(&new_version_id(u64::MAX)));
    }
}
