//! The S3 operations, on top of [`Engine`]: request fields in, response fields out. Everything
//! not listed here answers NotImplemented (s3s's default).

use crate::engine::{
    Algorithms, Engine, Integrity, ListedPart, OBJECT_TAGS_MAX, ObjectMeta, check_tags,
    check_version_id, now_ms, versioning_status,
};
use crate::index::{self, Page, Query};
use crate::layout::{Checksums, Headers, Manifest, PartChecksum, Tags, Versioning};
use crate::seal::{self, Asked, CustomerKey, Seal, SealMode};
use crate::store::Registers;
use base64::Engine as _;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The S3 service: each access key acts through its own Bulwark client.
pub struct BulwarkS3<R> {
    engine: Arc<Engine>,
    /// Access key → the registers (client) it acts through.
    clients: HashMap<String, Arc<R>>,
}

impl<R: Registers> BulwarkS3<R> {
    /// A service over `engine`, with one client per access key.
    pub fn new(engine: Arc<Engine>, clients: HashMap<String, Arc<R>>) -> Self {
        BulwarkS3 { engine, clients }
    }

    fn client<T>(&self, req: &S3Request<T>) -> S3Result<Arc<R>> {
        let credentials = req
            .credentials
            .as_ref()
            .ok_or_else(|| s3_error!(AccessDenied, "anonymous requests are not served"))?;
        self.clients
            .get(&credentials.access_key)
            .cloned()
            .ok_or_else(|| s3_error!(InvalidAccessKeyId))
    }
}

fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_owned())
}

/// What an object-creating request (PUT, copy, multipart create) says about the object beyond
/// its bytes; their inputs are distinct types that spell these fields alike.
macro_rules! object_meta {
    ($input:ident) => {
        ObjectMeta {
            content_type: $input.content_type,
            metadata: $input.metadata.unwrap_or_default().into_iter().collect(),
            headers: Headers {
                cache_control: $input.cache_control,
                content_disposition: $input.content_disposition,
                content_encoding: stored_encoding($input.content_encoding),
                content_language: $input.content_language,
                expires: $input.expires.as_ref().and_then(http_date),
            },
            tags: tagging_header($input.tagging.as_deref())?,
        }
    };
}

/// `x-amz-tagging`: tags as a URL query (`k1=v1&k2=v2`), checked.
fn tagging_header(header: Option<&str>) -> S3Result<Tags> {
    let tags = header
        .map(|text| {
            form_urlencoded::parse(text.as_bytes())
                .map(|(key, value)| (key.into_owned(), value.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    check_tags(tags, OBJECT_TAGS_MAX)
}

/// A tag set of a request body as tags; a tag without a key is refused.
fn tag_set(tagging: Tagging) -> S3Result<Tags> {
    tagging
        .tag_set
        .into_iter()
        .map(|tag| match (tag.key, tag.value) {
            (Some(key), value) => Ok((key, value.unwrap_or_default())),
            (None, _) => Err(s3_error!(MalformedXML, "a Tag without a Key")),
        })
        .collect()
}

/// Tags as S3 returns them.
fn to_tag_set(tags: Tags) -> TagSet {
    tags.into_iter()
        .map(|(key, value)| Tag {
            key: Some(key),
            value: Some(value),
        })
        .collect()
}

/// The `Content-Encoding` an object keeps: the client's own, without `aws-chunked`, which only
/// describes how the upload's body was framed.
fn stored_encoding(encoding: Option<String>) -> Option<String> {
    let kept: Vec<&str> = encoding
        .as_deref()?
        .split(',')
        .map(str::trim)
        .filter(|token| !token.is_empty() && !token.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!kept.is_empty()).then(|| kept.join(", "))
}

fn http_date(time: &Timestamp) -> Option<String> {
    let mut out = Vec::new();
    time.format(TimestampFormat::HttpDate, &mut out).ok()?;
    String::from_utf8(out).ok()
}

/// What GET and HEAD return of what the uploader set: the stored headers, and (in checksum
/// mode, for the whole object) the checksums verified at upload. Their outputs are distinct
/// types that spell these fields alike.
macro_rules! stored_fields {
    ($output:ident { $($field:ident: $value:expr),* $(,)? }, $manifest:expr, $checksums:expr) => {{
        let manifest: &Manifest = $manifest;
        let headers = &manifest.extra.headers;
        let checksums = $checksums.then_some(&manifest.extra.checksums);
        $output {
            $($field: $value,)*
            cache_control: headers.cache_control.clone(),
            content_disposition: headers.content_disposition.clone(),
            content_encoding: headers.content_encoding.clone(),
            content_language: headers.content_language.clone(),
            expires: headers
                .expires
                .as_deref()
                .and_then(|date| Timestamp::parse(TimestampFormat::HttpDate, date).ok()),
            checksum_crc32: checksums.and_then(|c| c.crc32.clone()),
            checksum_crc32c: checksums.and_then(|c| c.crc32c.clone()),
            checksum_crc64nvme: checksums.and_then(|c| c.crc64nvme.clone()),
            checksum_sha1: checksums.and_then(|c| c.sha1.clone()),
            checksum_sha256: checksums.and_then(|c| c.sha256.clone()),
            ..$output::default()
        }
    }};
}

/// The bytes part `number` of an object covers, as S3 answers a GET or HEAD with `partNumber`:
/// a single-part object is its own part 1.
fn part_range(
    manifest: &Manifest,
    number: i32,
    range_given: bool,
) -> S3Result<std::ops::Range<u64>> {
    if range_given {
        return Err(s3_error!(
            InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter"
        ));
    }
    if !(1..=10_000).contains(&number) {
        return Err(s3_error!(
            InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive"
        ));
    }
    let whole = [manifest.size];
    let sizes: &[u64] = if manifest.parts == 0 {
        &whole
    } else {
        &manifest.extra.part_sizes
    };
    if sizes.is_empty() {
        return Err(s3_error!(
            NotImplemented,
            "this object was stored before the gateway recorded where its parts end"
        ));
    }
    let index = (number - 1) as usize;
    let Some(size) = sizes.get(index) else {
        let mut error = S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        );
        error.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
        return Err(error);
    };
    let start: u64 = sizes[..index].iter().sum();
    Ok(start..start + size)
}

/// Whether a GET or HEAD asked for the object's checksums.
fn checksum_mode(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|mode| mode.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// `Content-Range` for `range` of an object of `size` bytes (none for an empty range).
fn content_range(range: &std::ops::Range<u64>, size: u64) -> Option<String> {
    (range.end > range.start).then(|| format!("bytes {}-{}/{size}", range.start, range.end - 1))
}

/// What S3 answers for an object stored without a Content-Type.
fn content_type(manifest: &Manifest) -> String {
    manifest
        .content_type
        .clone()
        .unwrap_or_else(|| "binary/octet-stream".into())
}

fn user_metadata(manifest: &Manifest) -> Option<Metadata> {
    (!manifest.metadata.is_empty()).then(|| manifest.metadata.iter().cloned().collect())
}

/// On an object of a causal bucket: how many current versions its key has, and the others.
fn name_versions<R>(headers: &mut http::HeaderMap, object: &crate::engine::Object<R>) {
    let Some((_, others)) = &object.causal else {
        return;
    };
    headers.insert(
        crate::causal::VERSIONS_HEADER,
        http::HeaderValue::from(others.len() + 1),
    );
    if !others.is_empty()
        && let Ok(value) =
            http::HeaderValue::from_str(&crate::causal::other_versions_header(others))
    {
        headers.insert(crate::causal::OTHER_VERSIONS_HEADER, value);
    }
}

/// A request body as the engine takes it: an error from the HTTP or signature layer stays an
/// S3 error (e.g. a payload that does not match its signed SHA-256).
///
/// The first piece is awaited at once: hyper answers `Expect: 100-continue` only when the body
/// is first read, and clients send the body anyway after waiting about a second, so a handler
/// that first spends a slow cluster round trip would race the client's own fallback.
async fn body(blob: Option<StreamingBlob>) -> impl Stream<Item = S3Result<Bytes>> + Unpin {
    let mut stream: futures::stream::BoxStream<'static, S3Result<Bytes>> = match blob {
        Some(blob) => blob
            .map(|piece| {
                piece.map_err(|error| match error.downcast::<S3Error>() {
                    Ok(error) => *error,
                    Err(error) => s3_error!(IncompleteBody, "request body: {error}"),
                })
            })
            .boxed(),
        None => futures::stream::empty().boxed(),
    };
    let first = stream.next().await;
    futures::stream::iter(first).chain(stream)
}

fn content_md5(value: Option<&str>) -> S3Result<Option<[u8; 16]>> {
    let Some(value) = value else { return Ok(None) };
    base64::engine::general_purpose::STANDARD
        .decode(value)
        .ok()
        .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
        .map(Some)
        .ok_or_else(|| s3_error!(InvalidDigest, "Content-MD5 is not a base64 MD5"))
}

/// What a PUT or UploadPart says its body hashes to: `Content-MD5`, and each
/// `x-amz-checksum-*` given in a header, named by the SDK (`x-amz-sdk-checksum-algorithm`) or
/// announced for the body's trailer (`x-amz-trailer`). Every one named is computed and checked;
/// one with a malformed value, or an algorithm S3 does not have, is refused.
fn integrity(
    md5: Option<&str>,
    algorithm: Option<&ChecksumAlgorithm>,
    given: Checksum,
    headers: &http::HeaderMap,
    trailer: Option<s3s::TrailingHeaders>,
) -> S3Result<Integrity> {
    let md5 = content_md5(md5)?;
    let announced: Vec<String> = headers
        .get_all("x-amz-trailer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    let named = |upper: &str| {
        algorithm.is_some_and(|a| a.as_str().eq_ignore_ascii_case(upper))
            || announced
                .iter()
                .any(|name| name == &format!("x-amz-checksum-{}", upper.to_ascii_lowercase()))
    };
    if let Some(algorithm) = algorithm
        && ![
            ChecksumAlgorithm::CRC32,
            ChecksumAlgorithm::CRC32C,
            ChecksumAlgorithm::CRC64NVME,
            ChecksumAlgorithm::SHA1,
            ChecksumAlgorithm::SHA256,
        ]
        .iter()
        .any(|known| algorithm.as_str().eq_ignore_ascii_case(known))
    {
        return Err(s3_error!(
            InvalidRequest,
            "Checksum algorithm provided is unsupported. Please try again with any of the valid \
             types: [CRC32, CRC32C, CRC64NVME, SHA1, SHA256]"
        ));
    }
    if let Some(name) = announced.iter().find(|name| {
        name.starts_with("x-amz-checksum-") && !KNOWN_TRAILERS.contains(&name.as_str())
    }) {
        return Err(s3_error!(
            InvalidRequest,
            "the trailer {name} is not a checksum S3 has"
        ));
    }
    let valid = |value: &Option<String>, header: &str, bytes: usize| -> S3Result<bool> {
        match value {
            None => Ok(false),
            Some(value) => base64::engine::general_purpose::STANDARD
                .decode(value)
                .ok()
                .filter(|decoded| decoded.len() == bytes)
                .map(|_| true)
                .ok_or_else(|| s3_error!(InvalidRequest, "Value for {header} header is invalid.")),
        }
    };
    let algorithms = Algorithms {
        crc32: valid(&given.checksum_crc32, "x-amz-checksum-crc32", 4)? || named("CRC32"),
        crc32c: valid(&given.checksum_crc32c, "x-amz-checksum-crc32c", 4)? || named("CRC32C"),
        crc64nvme: valid(&given.checksum_crc64nvme, "x-amz-checksum-crc64nvme", 8)?
            || named("CRC64NVME"),
        sha1: valid(&given.checksum_sha1, "x-amz-checksum-sha1", 20)? || named("SHA1"),
        sha256: valid(&given.checksum_sha256, "x-amz-checksum-sha256", 32)? || named("SHA256"),
    };
    let checksums_named = [
        &given.checksum_crc32,
        &given.checksum_crc32c,
        &given.checksum_crc64nvme,
        &given.checksum_sha1,
        &given.checksum_sha256,
    ]
    .iter()
    .filter(|value| value.is_some())
    .count()
        + announced
            .iter()
            .filter(|name| name.starts_with("x-amz-checksum-"))
            .count();
    if checksums_named > 1 {
        return Err(s3_error!(
            InvalidRequest,
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        ));
    }
    Ok(Integrity {
        md5,
        algorithms,
        given,
        trailer,
        announced,
    })
}

/// The checksum trailers S3 accepts.
const KNOWN_TRAILERS: [&str; 5] = [
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1",
    "x-amz-checksum-sha256",
];

fn max_keys(value: Option<i32>) -> S3Result<usize> {
    match value {
        None => Ok(index::MAX_KEYS_DEFAULT),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(index::MAX_KEYS_DEFAULT)),
    }
}

fn url_encoded(encoding: &Option<EncodingType>) -> S3Result<bool> {
    match encoding {
        None => Ok(false),
        Some(e) if e.as_str() == EncodingType::URL => Ok(true),
        Some(e) => Err(s3_error!(
            InvalidArgument,
            "unknown encoding-type {:?}",
            e.as_str()
        )),
    }
}

/// The listing's objects and prefixes as S3 returns them, URL-encoded when asked.
/// The one owner of every bucket and object: the gateway's keys act for one account.
fn owner() -> Owner {
    Owner {
        display_name: Some("bulwark".into()),
        id: Some("bulwark".into()),
    }
}

fn render(page: &Page, encode: bool, with_owner: bool) -> (ObjectList, CommonPrefixList) {
    let enc = |s: &str| {
        if encode {
            index::url_encode(s)
        } else {
            s.to_owned()
        }
    };
    let objects = page
        .objects
        .iter()
        .map(|(key, entry)| Object {
            key: Some(enc(key)),
            size: Some(entry.size as i64),
            e_tag: Some(etag(&entry.etag)),
            last_modified: Some(timestamp(entry.last_modified_ms)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            owner: with_owner.then(owner),
            ..Object::default()
        })
        .collect();
    let prefixes = page
        .prefixes
        .iter()
        .map(|p| CommonPrefix {
            prefix: Some(enc(p)),
        })
        .collect();
    (objects, prefixes)
}

/// GET and HEAD preconditions: on the ETag (If-Match, If-None-Match) and on the time of the last
/// change (If-Unmodified-Since, If-Modified-Since), each date heeded only without its ETag
/// counterpart (RFC 9110 §13.2.2). HTTP dates have whole seconds, so the object's time is cut to
/// its second. A 304 carries the ETag and Last-Modified a cache revalidates with.
fn check_conditions(
    manifest: &Manifest,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let matches = |condition: &ETagCondition| match condition {
        ETagCondition::Any => true,
        ETagCondition::ETag(etag) => etag.value() == manifest.etag,
    };
    let modified = timestamp(manifest.last_modified_ms / 1000 * 1000);
    match (if_match, if_unmodified_since) {
        (Some(condition), _) if !matches(condition) => {
            return Err(s3_error!(
                PreconditionFailed,
                "If-Match does not match the ETag"
            ));
        }
        (None, Some(since)) if modified > *since => {
            return Err(s3_error!(
                PreconditionFailed,
                "modified since the If-Unmodified-Since date"
            ));
        }
        _ => {}
    }
    let not_modified = match (if_none_match, if_modified_since) {
        (Some(condition), _) => matches(condition),
        (None, Some(since)) => modified <= *since,
        (None, None) => false,
    };
    if not_modified {
        let mut error = s3_error!(NotModified);
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_str(&format!("\"{}\"", manifest.etag)) {
            headers.insert(http::header::ETAG, value);
        }
        let mut date = Vec::new();
        if modified
            .format(s3s::dto::TimestampFormat::HttpDate, &mut date)
            .is_ok()
            && let Ok(value) = http::HeaderValue::from_bytes(&date)
        {
            headers.insert(http::header::LAST_MODIFIED, value);
        }
        error.set_headers(headers);
        return Err(error);
    }
    Ok(())
}

/// The checksum algorithm a multipart upload is created with. S3's composite checksums are
/// served; full-object ones (and CRC64NVME, which S3 has only as full-object) are refused, so
/// that no client believes its object's checksum was kept.
fn upload_checksum(
    algorithm: Option<&ChecksumAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<Option<PartChecksum>> {
    refuse_full_object(kind)?;
    let Some(algorithm) = algorithm else {
        return Ok(None);
    };
    match algorithm.as_str().to_ascii_uppercase().as_str() {
        "CRC32" => Ok(Some(PartChecksum::Crc32)),
        "CRC32C" => Ok(Some(PartChecksum::Crc32c)),
        "SHA1" => Ok(Some(PartChecksum::Sha1)),
        "SHA256" => Ok(Some(PartChecksum::Sha256)),
        "CRC64NVME" => Err(s3_error!(
            NotImplemented,
            "CRC64NVME multipart checksums (full-object only in S3) are not supported"
        )),
        other => Err(s3_error!(
            InvalidRequest,
            "Checksum algorithm {other:?} is not supported"
        )),
    }
}

fn refuse_full_object(kind: Option<&ChecksumType>) -> S3Result<()> {
    if kind.is_some_and(|kind| kind.as_str() == ChecksumType::FULL_OBJECT) {
        return Err(s3_error!(
            NotImplemented,
            "full-object checksums of multipart uploads are not supported (composite ones are)"
        ));
    }
    Ok(())
}

/// Conditional writes would need compare-and-swap, which registers do not have: refused
/// rather than ignored, so no client believes its write was conditional.
fn refuse_conditional_write(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if if_match.is_some() || if_none_match.is_some() {
        return Err(s3_error!(
            NotImplemented,
            "conditional writes (If-Match, If-None-Match) are not supported"
        ));
    }
    Ok(())
}

/// The encryption a request that creates an object asks for: SSE-S3 (`AES256`) or SSE-C (a
/// customer's key). SSE-KMS is refused, so that no client believes its object is encrypted
/// under a key management service the gateway does not have.
fn asked_encryption(
    server_side: Option<&ServerSideEncryption>,
    customer: Option<CustomerKey>,
    kms_key: Option<&str>,
) -> S3Result<Asked> {
    let server_side = server_side.map(ServerSideEncryption::as_str);
    if kms_key.is_some() || server_side.is_some_and(|s| s.starts_with("aws:kms")) {
        return Err(s3_error!(
            NotImplemented,
            "SSE-KMS is not supported (SSE-S3 and SSE-C are); nothing was stored"
        ));
    }
    match (server_side, customer) {
        (None, None) => Ok(Asked::Nothing),
        (None, Some(customer)) => Ok(Asked::Customer(customer)),
        (Some(seal::AES256), None) => Ok(Asked::Gateway),
        (Some(seal::AES256), Some(_)) => Err(s3_error!(
            InvalidArgument,
            "Server Side Encryption with Customer provided key is incompatible with the encryption method specified"
        )),
        (Some(other), _) => Err(s3_error!(
            InvalidArgument,
            "The encryption method specified is not supported: {other:?}"
        )),
    }
}

/// The customer key (SSE-C) a request's input gives, its three fields checked together.
macro_rules! customer_key {
    ($input:expr) => {{
        let input = &$input;
        CustomerKey::from_headers(
            input.sse_customer_algorithm.as_deref(),
            input.sse_customer_key.as_deref(),
            input.sse_customer_key_md5.as_deref(),
        )
    }};
}

/// An output with the encryption headers of the object it speaks of, when it is sealed.
macro_rules! sealed_output {
    ($output:expr, $seal:expr) => {{
        let mut output = $output;
        if let Some(seal) = $seal {
            output.server_side_encryption = seal.server_side();
            output.sse_customer_algorithm = seal.customer_algorithm();
            output.sse_customer_key_md5 = seal.customer_key_md5();
        }
        output
    }};
}

/// [`integrity`] of a PUT's or an UploadPart's input, distinct types that spell the fields alike.
macro_rules! integrity_of {
    ($input:expr, $headers:expr, $trailer:expr) => {{
        let input = &$input;
        integrity(
            input.content_md5.as_deref(),
            input.checksum_algorithm.as_ref(),
            Checksum {
                checksum_crc32: input.checksum_crc32.clone(),
                checksum_crc32c: input.checksum_crc32c.clone(),
                checksum_crc64nvme: input.checksum_crc64nvme.clone(),
                checksum_sha1: input.checksum_sha1.clone(),
                checksum_sha256: input.checksum_sha256.clone(),
                ..Checksum::default()
            },
            $headers,
            $trailer,
        )
    }};
}

/// An output of type `$output` with `$fields`, carrying the computed `$checksum` values.
macro_rules! with_checksum {
    ($output:ident { $($field:ident: $value:expr),* $(,)? }, $checksum:expr) => {{
        let checksum = $checksum;
        $output {
            $($field: $value,)*
            checksum_crc32: checksum.checksum_crc32,
            checksum_crc32c: checksum.checksum_crc32c,
            checksum_crc64nvme: checksum.checksum_crc64nvme,
            checksum_sha1: checksum.checksum_sha1,
            checksum_sha256: checksum.checksum_sha256,
            ..$output::default()
        }
    }};
}

/// What the requests that create an object (PUT, copy, multipart create) ask for: the seal
/// of their encryption (`$keys` are the gateway's), once ACLs other than private, which the
/// gateway does not do, are refused. Their inputs are distinct types that spell these fields
/// alike.
macro_rules! object_options {
    ($input:expr, $keys:expr) => {{
        let input = &$input;
        refuse_acl(
            input.acl.as_ref().map(ObjectCannedACL::as_str),
            &[
                input.grant_full_control.as_ref(),
                input.grant_read.as_ref(),
                input.grant_read_acp.as_ref(),
                input.grant_write_acp.as_ref(),
            ],
        )
        .and_then(|()| {
            asked_encryption(
                input.server_side_encryption.as_ref(),
                customer_key!(input)?,
                input.ssekms_key_id.as_deref(),
            )
        })
        .and_then(|asked| Seal::for_write(&asked, $keys))
    }};
}

/// The bucket, key and version a copy request (CopyObject, UploadPartCopy) reads, and the
/// customer key its source opens with, once what it asks of its source is known to be served:
/// no date conditions.
// Field by field, not through a reference to the whole input: the caller moves other fields
// out while the source's bucket and key are borrowed.
macro_rules! copy_source {
    ($input:expr) => {{
        match &$input.copy_source {
            CopySource::Bucket {
                bucket,
                key,
                version_id,
            } => check_version(version_id.as_deref())
                .and_then(|()| {
                    CustomerKey::from_headers(
                        $input.copy_source_sse_customer_algorithm.as_deref(),
                        $input.copy_source_sse_customer_key.as_deref(),
                        $input.copy_source_sse_customer_key_md5.as_deref(),
                    )
                })
                .and_then(|source_key| {
                    if $input.copy_source_if_modified_since.is_some()
                        || $input.copy_source_if_unmodified_since.is_some()
                    {
                        Err(s3_error!(
                            NotImplemented,
                            "date conditions on copies (x-amz-copy-source-if-[un]modified-since) are not supported"
                        ))
                    } else {
                        Ok((&**bucket, &**key, version_id.as_deref(), source_key))
                    }
                }),
            _ => Err(s3_error!(NotImplemented, "copy sources must be bucket/key")),
        }
    }};
}

/// `x-amz-copy-source-if-match` and `-if-none-match` on a copy's source: a failed one is 412
/// either way.
fn check_copy_conditions(
    src: &Manifest,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    check_conditions(src, if_match, if_none_match, None, None).map_err(|e| {
        if *e.code() == S3ErrorCode::NotModified {
            s3_error!(
                PreconditionFailed,
                "x-amz-copy-source-if-none-match matched"
            )
        } else {
            e
        }
    })
}

/// `x-amz-copy-source-range`: `bytes=first-last`, both inclusive offsets, both required.
fn copy_source_range(text: &str) -> S3Result<(u64, u64)> {
    let malformed = || {
        s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first \
             and last are the zero-based offsets of the first and last bytes to copy"
        )
    };
    let (first, last) = text
        .strip_prefix("bytes=")
        .and_then(|span| span.split_once('-'))
        .ok_or_else(malformed)?;
    let number = |text: &str| {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
            .ok_or_else(malformed)
    };
    Ok((number(first)?, number(last)?))
}

/// Every object and bucket is private to the gateway's keys; a request asking for anything
/// else is refused rather than stored private.
fn refuse_acl(canned: Option<&str>, grants: &[Option<&String>]) -> S3Result<()> {
    if canned.is_some_and(|acl| acl != "private") || grants.iter().any(Option::is_some) {
        return Err(s3_error!(
            NotImplemented,
            "access control lists other than private (canned ACLs, x-amz-grant-*) are not supported"
        ));
    }
    Ok(())
}

/// A version id a request names: one that no version can have is refused before anything is
/// read or changed.
fn check_version(version_id: Option<&str>) -> S3Result<()> {
    version_id.map_or(Ok(()), check_version_id)
}

/// Conditional deletes need the same compare-and-swap as conditional writes.
fn refuse_conditional_delete(conditional: bool) -> S3Result<()> {
    if conditional {
        return Err(s3_error!(
            NotImplemented,
            "conditional deletes (If-Match, ETag, size or time conditions) are not supported"
        ));
    }
    Ok(())
}

fn check_bucket_name(bucket: &str) -> S3Result<()> {
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && bucket.as_bytes()[0].is_ascii_alphanumeric()
        && bucket.as_bytes()[bucket.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(s3_error!(
            InvalidBucketName,
            "{bucket:?} is not a valid bucket name"
        ))
    }
}

#[async_trait::async_trait]
impl<R: Registers> S3 for BulwarkS3<R> {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let reg = self.client(&req)?;
        let input = &req.input;
        let bucket = &input.bucket;
        check_bucket_name(bucket)?;
        refuse_acl(
            input.acl.as_ref().map(BucketCannedACL::as_str),
            &[
                input.grant_full_control.as_ref(),
                input.grant_read.as_ref(),
                input.grant_read_acp.as_ref(),
                input.grant_write.as_ref(),
                input.grant_write_acp.as_ref(),
            ],
        )?;
        let causal = match req.headers.get(crate::causal::CONSISTENCY_HEADER) {
            None => false,
            Some(value) => match value.to_str().map(str::trim) {
                Ok(v) if v.eq_ignore_ascii_case("causal") => true,
                Ok(v) if v.eq_ignore_ascii_case("registers") => false,
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "{} is `causal` or `registers`",
                        crate::causal::CONSISTENCY_HEADER
                    ));
                }
            },
        };
        match self
            .engine
            .create_bucket(reg.as_ref(), bucket, causal)
            .await
        {
            Ok(()) => {}
            // GetBucketLocation reports us-east-1, where S3 answers re-creating a bucket one
            // owns with 200 and leaves it as it is.
            Err(error) if *error.code() == s3s::S3ErrorCode::BucketAlreadyOwnedByYou => {}
            Err(error) => return Err(error),
        }
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        }))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let reg = self.client(&req)?;
        let input = &req.input;
        let max_buckets = match input.max_buckets {
            None => usize::MAX,
            Some(max @ 1..=10_000) => max as usize,
            Some(max) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "max-buckets must be between 1 and 10000, not {max}"
                ));
            }
        };
        // The token is the hex of the last name of the page before: every name after it.
        let after = match input.continuation_token.as_deref() {
            None => None,
            Some(token) => Some(
                hex::decode(token)
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| s3_error!(InvalidArgument, "invalid continuation token"))?,
            ),
        };
        let prefix = input.prefix.as_deref().unwrap_or("");
        let list = self.engine.list_buckets(reg.as_ref()).await?;
        let mut matching = list.into_iter().filter(|(name, _)| {
            name.starts_with(prefix) && after.as_deref().is_none_or(|after| name.as_str() > after)
        });
        let page: Vec<(String, u64)> = matching.by_ref().take(max_buckets).collect();
        let more = matching.next().is_some();
        let continuation_token = more
            .then(|| page.last().map(|(name, _)| hex::encode(name)))
            .flatten();
        let buckets = page
            .into_iter()
            .map(|(name, created_ms)| Bucket {
                name: Some(name),
                creation_date: Some(timestamp(created_ms)),
                ..Bucket::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner()),
            continuation_token,
            prefix: input.prefix.clone(),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let reg = self.client(&req)?;
        self.engine
            .require_bucket(reg.as_ref(), &req.input.bucket)
            .await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let reg = self.client(&req)?;
        self.engine
            .require_bucket(reg.as_ref(), &req.input.bucket)
            .await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let reg = self.client(&req)?;
        self.engine
            .delete_bucket(reg.as_ref(), &req.input.bucket)
            .await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let integrity = integrity_of!(input, &req.headers, req.trailing_headers)?;
        if let Some(len) = input.content_length
            && u64::try_from(len).unwrap_or(u64::MAX) > self.engine.limits().object_bytes_max
        {
            return Err(s3_error!(
                EntityTooLarge,
                "{len} bytes; a single PUT is limited to {} bytes (use a multipart upload)",
                self.engine.limits().object_bytes_max
            ));
        }
        refuse_conditional_write(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let seal = object_options!(input, self.engine.gateway_keys())?;
        let (manifest, checksum) = self
            .engine
            .put_object(
                &reg,
                &input.bucket,
                &input.key,
                object_meta!(input),
                body(input.body).await,
                &integrity,
                seal.as_ref(),
            )
            .await?;
        Ok(S3Response::new(sealed_output!(
            with_checksum!(
                PutObjectOutput {
                    e_tag: Some(etag(&manifest.etag)),
                    version_id: manifest.version.clone(),
                },
                checksum
            ),
            seal.as_ref()
        )))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        check_version(input.version_id.as_deref())?;
        let customer = customer_key!(input)?;
        let object = self
            .engine
            .object_version(
                &reg,
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
                customer.as_ref(),
            )
            .await?;
        let manifest = &object.manifest;
        check_conditions(
            manifest,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let whole = input.range.is_none() && input.part_number.is_none();
        let range = match (input.part_number, input.range) {
            (Some(number), range) => part_range(manifest, number, range.is_some())?,
            (None, None) => 0..manifest.size,
            (None, Some(range)) => range.check(manifest.size).map_err(|_| {
                s3_error!(
                    InvalidRange,
                    "the object is {} bytes; the range is outside it",
                    manifest.size
                )
            })?,
        };
        let partial = !whole && range.end > range.start;
        let length = range.end - range.start;
        let checksums = whole && checksum_mode(input.checksum_mode.as_ref());
        let stream = self
            .engine
            .read_object(&reg, &object, range.clone())
            .await?;
        let output = stored_fields!(
            GetObjectOutput {
                body: Some(StreamingBlob::wrap(stream)),
                content_length: Some(length as i64),
                content_range: partial
                    .then(|| content_range(&range, manifest.size))
                    .flatten(),
                accept_ranges: Some("bytes".into()),
                content_type: Some(content_type(manifest)),
                e_tag: Some(etag(&manifest.etag)),
                last_modified: Some(timestamp(manifest.last_modified_ms)),
                metadata: user_metadata(manifest),
                parts_count: (manifest.parts > 0).then_some(manifest.parts as i32),
                tag_count: (!manifest.tags.is_empty()).then_some(manifest.tags.len() as i32),
                version_id: manifest.version.clone().or(input.version_id.clone()),
            },
            manifest,
            checksums
        );
        let mut response = S3Response::new(sealed_output!(output, object.seal.as_ref()));
        if response.output.content_range.is_some() {
            response.status = Some(http::StatusCode::PARTIAL_CONTENT);
        }
        name_versions(&mut response.headers, &object);
        Ok(response)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        check_version(input.version_id.as_deref())?;
        let customer = customer_key!(input)?;
        let object = self
            .engine
            .object_version(
                &reg,
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
                customer.as_ref(),
            )
            .await?;
        let manifest = &object.manifest;
        check_conditions(
            manifest,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let (range, partial) = match input.part_number {
            Some(number) => (part_range(manifest, number, input.range.is_some())?, true),
            None => (0..manifest.size, false),
        };
        let checksums = !partial && checksum_mode(input.checksum_mode.as_ref());
        let output = stored_fields!(
            HeadObjectOutput {
                content_length: Some((range.end - range.start) as i64),
                content_range: partial
                    .then(|| content_range(&range, manifest.size))
                    .flatten(),
                accept_ranges: Some("bytes".into()),
                content_type: Some(content_type(manifest)),
                e_tag: Some(etag(&manifest.etag)),
                last_modified: Some(timestamp(manifest.last_modified_ms)),
                metadata: user_metadata(manifest),
                parts_count: (manifest.parts > 0).then_some(manifest.parts as i32),
                version_id: manifest.version.clone().or(input.version_id.clone()),
            },
            manifest,
            checksums
        );
        let mut response = S3Response::new(sealed_output!(output, object.seal.as_ref()));
        if response.output.content_range.is_some() {
            response.status = Some(http::StatusCode::PARTIAL_CONTENT);
        }
        name_versions(&mut response.headers, &object);
        Ok(response)
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let reg = self.client(&req)?;
        let input = &req.input;
        check_version(input.version_id.as_deref())?;
        refuse_conditional_delete(
            input.if_match.is_some()
                || input.if_match_last_modified_time.is_some()
                || input.if_match_size.is_some(),
        )?;
        let deleted = self
            .engine
            .delete_version(&reg, &input.bucket, &input.key, input.version_id.as_deref())
            .await?;
        let mut response = S3Response::new(DeleteObjectOutput {
            delete_marker: deleted.marker.then_some(true),
            version_id: deleted.version,
            ..DeleteObjectOutput::default()
        });
        response.status = Some(http::StatusCode::NO_CONTENT);
        Ok(response)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        if input.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per request"));
        }
        self.engine
            .require_bucket(reg.as_ref(), &input.bucket)
            .await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let engine = &self.engine;
        let bucket = &input.bucket;
        let reg = &reg;
        let outcomes: Vec<(ObjectIdentifier, S3Result<crate::engine::Deleted>)> =
            futures::stream::iter(input.delete.objects)
                .map(|object| async move {
                    let checked = check_version(object.version_id.as_deref()).and_then(|()| {
                        refuse_conditional_delete(
                            object.e_tag.is_some()
                                || object.last_modified_time.is_some()
                                || object.size.is_some(),
                        )
                    });
                    let result = match checked {
                        Ok(()) => {
                            engine
                                .delete_version(
                                    reg,
                                    bucket,
                                    &object.key,
                                    object.version_id.as_deref(),
                                )
                                .await
                        }
                        Err(refused) => Err(refused),
                    };
                    (object, result)
                })
                .buffered(4)
                .collect()
                .await;
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for (object, result) in outcomes {
            match result {
                // S3 names the marker a delete made, or the version it deleted.
                Ok(done) if !quiet => deleted.push(match object.version_id {
                    None => DeletedObject {
                        key: Some(object.key),
                        delete_marker: done.marker.then_some(true),
                        delete_marker_version_id: done.version.filter(|_| done.marker),
                        ..DeletedObject::default()
                    },
                    Some(version) => DeletedObject {
                        key: Some(object.key),
                        version_id: Some(version),
                        delete_marker: done.marker.then_some(true),
                        delete_marker_version_id: done.version.filter(|_| done.marker),
                    },
                }),
                Ok(_) => {}
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_owned()),
                    key: Some(object.key),
                    message: e.message().map(str::to_owned),
                    version_id: object.version_id,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let (src_bucket, src_key, src_version, source_key) = copy_source!(input)?;
        let seal = object_options!(input, self.engine.gateway_keys())?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let reseals = seal.is_some() || source_key.is_some();
        if !replace
            && !reseals
            && src_version.is_none()
            && src_bucket == &*input.bucket
            && src_key == &*input.key
        {
            return Err(s3_error!(
                InvalidRequest,
                "copying an object onto itself needs the REPLACE metadata directive"
            ));
        }
        let new_tags = match &input.tagging_directive {
            Some(directive) if directive.as_str() == TaggingDirective::REPLACE => {
                Some(tagging_header(input.tagging.as_deref())?)
            }
            _ => None,
        };
        let new_meta = if replace {
            Some(object_meta!(input))
        } else {
            None
        };
        let manifest = self
            .engine
            .copy_object(
                &reg,
                (src_bucket, src_key, src_version),
                (&input.bucket, &input.key),
                (new_meta, new_tags),
                |src| {
                    check_copy_conditions(
                        src,
                        input.copy_source_if_match.as_ref(),
                        input.copy_source_if_none_match.as_ref(),
                    )
                },
                source_key.as_ref(),
                seal.as_ref(),
            )
            .await?;
        // A copy of an encrypted source that named no encryption was given SSE-S3.
        let seal = seal.or_else(|| {
            let mode = &manifest.sealed.as_ref()?.mode;
            Seal::for_read(Some(mode), None, self.engine.gateway_keys())
                .ok()
                .flatten()
        });
        let output = CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&manifest.etag)),
                last_modified: Some(timestamp(manifest.last_modified_ms)),
                ..CopyObjectResult::default()
            }),
            version_id: manifest.version.clone(),
            copy_source_version_id: src_version.map(str::to_owned),
            ..CopyObjectOutput::default()
        };
        Ok(S3Response::new(sealed_output!(output, seal.as_ref())))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let encode = url_encoded(&input.encoding_type)?;
        let max_keys = max_keys(input.max_keys)?;
        // An empty delimiter groups nothing: as if none were given, and not echoed.
        let delimiter = input.delimiter.as_deref().filter(|d| !d.is_empty());
        let query = Query {
            prefix: input.prefix.as_deref().unwrap_or(""),
            delimiter,
            marker: input.marker.as_deref().filter(|m| !m.is_empty()),
            max_keys,
        };
        let page = self
            .engine
            .list(reg.as_ref(), &input.bucket, &query)
            .await?;
        let (contents, prefixes) = render(&page, encode, true);
        let enc = |s: String| if encode { index::url_encode(&s) } else { s };
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(query.prefix.to_owned())),
            // S3 always says where the page began, empty for the first.
            marker: Some(enc(input.marker.clone().unwrap_or_default())),
            delimiter: delimiter.map(|d| enc(d.to_owned())),
            max_keys: Some(max_keys as i32),
            is_truncated: Some(page.truncated),
            next_marker: page.next_marker.clone().map(enc),
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectsOutput::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let encode = url_encoded(&input.encoding_type)?;
        let max_keys = max_keys(input.max_keys)?;
        let token = match input.continuation_token.as_deref() {
            None => None,
            Some(token) => Some(
                hex::decode(token)
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| s3_error!(InvalidArgument, "invalid continuation token"))?,
            ),
        };
        // The token, when given, supersedes start-after (it is always later).
        let marker = token
            .as_deref()
            .or(input.start_after.as_deref())
            .filter(|m| !m.is_empty());
        let delimiter = input.delimiter.as_deref().filter(|d| !d.is_empty());
        let query = Query {
            prefix: input.prefix.as_deref().unwrap_or(""),
            delimiter,
            marker,
            max_keys,
        };
        let page = self
            .engine
            .list(reg.as_ref(), &input.bucket, &query)
            .await?;
        // Version 2 names owners only when asked (fetch-owner).
        let (contents, prefixes) = render(&page, encode, input.fetch_owner == Some(true));
        let enc = |s: String| if encode { index::url_encode(&s) } else { s };
        let key_count = (contents.len() + prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(query.prefix.to_owned())),
            delimiter: delimiter.map(|d| enc(d.to_owned())),
            start_after: input.start_after.clone().map(enc),
            max_keys: Some(max_keys as i32),
            key_count: Some(key_count),
            continuation_token: input.continuation_token.clone(),
            next_continuation_token: page
                .truncated
                .then(|| page.next_marker.as_ref().map(hex::encode))
                .flatten(),
            is_truncated: Some(page.truncated),
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectsV2Output::default()
        }))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        check_version(input.version_id.as_deref())?;
        let tags = tag_set(input.tagging)?;
        let version_id = self
            .engine
            .set_version_tags(
                reg.as_ref(),
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
                tags,
            )
            .await?;
        Ok(S3Response::new(PutObjectTaggingOutput {
            version_id: version_id.or(input.version_id),
        }))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let reg = self.client(&req)?;
        let input = &req.input;
        check_version(input.version_id.as_deref())?;
        let (tags, version_id) = self
            .engine
            .version_tags(
                reg.as_ref(),
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
            )
            .await?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: to_tag_set(tags),
            version_id: version_id.or_else(|| input.version_id.clone()),
        }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let reg = self.client(&req)?;
        let input = &req.input;
        check_version(input.version_id.as_deref())?;
        let version_id = self
            .engine
            .set_version_tags(
                reg.as_ref(),
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
                Tags::new(),
            )
            .await?;
        let mut response = S3Response::new(DeleteObjectTaggingOutput {
            version_id: version_id.or_else(|| input.version_id.clone()),
        });
        response.status = Some(http::StatusCode::NO_CONTENT);
        Ok(response)
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let tags = tag_set(input.tagging)?;
        self.engine
            .set_bucket_tags(reg.as_ref(), &input.bucket, tags)
            .await?;
        Ok(S3Response::new(PutBucketTaggingOutput::default()))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let reg = self.client(&req)?;
        let tags = self
            .engine
            .bucket_tags(reg.as_ref(), &req.input.bucket)
            .await?;
        if tags.is_empty() {
            return Err(s3_error!(NoSuchTagSet, "The TagSet does not exist"));
        }
        Ok(S3Response::new(GetBucketTaggingOutput {
            tag_set: to_tag_set(tags),
        }))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        let reg = self.client(&req)?;
        self.engine
            .set_bucket_tags(reg.as_ref(), &req.input.bucket, Tags::new())
            .await?;
        let mut response = S3Response::new(DeleteBucketTaggingOutput::default());
        response.status = Some(http::StatusCode::NO_CONTENT);
        Ok(response)
    }

    /// A bucket's versions, in S3's shape: in a bucket never versioned every object is its one
    /// version, `null`, the latest, so that tools which empty a bucket through its versions work.
    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let encode = url_encoded(&input.encoding_type)?;
        let max_keys = max_keys(input.max_keys)?;
        let key_marker = input.key_marker.as_deref().filter(|m| !m.is_empty());
        let version_marker = input.version_id_marker.as_deref().filter(|m| !m.is_empty());
        if key_marker.is_none() && version_marker.is_some() {
            return Err(s3_error!(
                InvalidArgument,
                "A version-id marker cannot be specified without a key marker."
            ));
        }
        check_version(version_marker)?;
        let delimiter = input.delimiter.as_deref().filter(|d| !d.is_empty());
        let query = Query {
            prefix: input.prefix.as_deref().unwrap_or(""),
            delimiter,
            marker: key_marker,
            max_keys,
        };
        let page = self
            .engine
            .list_versions(reg.as_ref(), &input.bucket, &query, version_marker)
            .await?;
        let enc = |s: String| if encode { index::url_encode(&s) } else { s };
        let mut versions = Vec::new();
        let mut markers = Vec::new();
        for (key, version, latest) in page.versions {
            if version.marker {
                markers.push(DeleteMarkerEntry {
                    is_latest: Some(latest),
                    key: Some(enc(key)),
                    last_modified: Some(timestamp(version.last_modified_ms)),
                    owner: Some(owner()),
                    version_id: Some(version.id),
                });
            } else {
                versions.push(ObjectVersion {
                    e_tag: Some(etag(&version.etag)),
                    is_latest: Some(latest),
                    key: Some(enc(key)),
                    last_modified: Some(timestamp(version.last_modified_ms)),
                    owner: Some(owner()),
                    size: Some(version.size as i64),
                    storage_class: Some(ObjectVersionStorageClass::from_static(
                        ObjectVersionStorageClass::STANDARD,
                    )),
                    version_id: Some(version.id),
                    ..ObjectVersion::default()
                });
            }
        }
        let prefixes = page
            .prefixes
            .into_iter()
            .map(|prefix| CommonPrefix {
                prefix: Some(enc(prefix)),
            })
            .collect();
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(query.prefix.to_owned())),
            delimiter: delimiter.map(|d| enc(d.to_owned())),
            key_marker: Some(input.key_marker.clone().map(enc).unwrap_or_default()),
            version_id_marker: Some(input.version_id_marker.clone().unwrap_or_default()),
            max_keys: Some(max_keys as i32),
            is_truncated: Some(page.truncated),
            next_key_marker: page.next_key_marker.map(enc),
            next_version_id_marker: page.next_version_marker,
            versions: Some(versions),
            delete_markers: (!markers.is_empty()).then_some(markers),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectVersionsOutput::default()
        }))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let reg = self.client(&req)?;
        let versioning = self
            .engine
            .versioning(reg.as_ref(), &req.input.bucket)
            .await?;
        Ok(S3Response::new(GetBucketVersioningOutput {
            status: versioning_status(versioning).map(BucketVersioningStatus::from_static),
            ..GetBucketVersioningOutput::default()
        }))
    }

    /// Enables or suspends versioning. MFA delete needs hardware tokens the gateway does not
    /// know, so asking for it is refused.
    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let configuration = input.versioning_configuration;
        if input.mfa.is_some()
            || configuration
                .mfa_delete
                .as_ref()
                .is_some_and(|m| m.as_str() == MFADelete::ENABLED)
        {
            return Err(s3_error!(NotImplemented, "MFA delete is not supported"));
        }
        let versioning = match configuration.status.as_ref().map(|s| s.as_str()) {
            Some(BucketVersioningStatus::ENABLED) => Versioning::Enabled,
            Some(BucketVersioningStatus::SUSPENDED) => Versioning::Suspended,
            _ => {
                return Err(s3_error!(
                    MalformedXML,
                    "the versioning status must be Enabled or Suspended"
                ));
            }
        };
        self.engine
            .set_versioning(reg.as_ref(), &input.bucket, versioning)
            .await?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let seal = object_options!(input, self.engine.gateway_keys())?;
        let checksum = upload_checksum(
            input.checksum_algorithm.as_ref(),
            input.checksum_type.as_ref(),
        )?;
        let upload_id = self
            .engine
            .create_upload(
                reg.as_ref(),
                &input.bucket,
                &input.key,
                object_meta!(input),
                (seal.as_ref(), checksum),
            )
            .await?;
        let output = CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(upload_id),
            checksum_algorithm: input.checksum_algorithm.clone(),
            checksum_type: checksum.map(|_| ChecksumType::from_static(ChecksumType::COMPOSITE)),
            ..CreateMultipartUploadOutput::default()
        };
        Ok(S3Response::new(sealed_output!(output, seal.as_ref())))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let customer = customer_key!(input)?;
        if let Some(len) = input.content_length
            && u64::try_from(len).unwrap_or(u64::MAX) > self.engine.limits().part_bytes_max
        {
            return Err(s3_error!(
                EntityTooLarge,
                "{len} bytes; a part is limited to {} bytes",
                self.engine.limits().part_bytes_max
            ));
        }
        let integrity = integrity_of!(input, &req.headers, req.trailing_headers)?;
        let (written, seal) = self
            .engine
            .upload_part(
                &reg,
                &input.bucket,
                &input.key,
                &input.upload_id,
                input.part_number,
                body(input.body).await,
                &integrity,
                customer.as_ref(),
            )
            .await?;
        Ok(S3Response::new(sealed_output!(
            with_checksum!(
                UploadPartOutput {
                    e_tag: Some(etag(&hex::encode(written.etag_md5))),
                },
                written.checksum
            ),
            seal.as_ref()
        )))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let (src_bucket, src_key, src_version, source_key) = copy_source!(input)?;
        let customer = customer_key!(input)?;
        let range = input
            .copy_source_range
            .as_deref()
            .map(copy_source_range)
            .transpose()?;
        let (written, seal) = self
            .engine
            .upload_part_copy(
                &reg,
                (src_bucket, src_key, src_version),
                (&input.bucket, &input.key),
                &input.upload_id,
                input.part_number,
                range,
                |src| {
                    check_copy_conditions(
                        src,
                        input.copy_source_if_match.as_ref(),
                        input.copy_source_if_none_match.as_ref(),
                    )
                },
                (source_key.as_ref(), customer.as_ref()),
            )
            .await?;
        let output = UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&hex::encode(written.etag_md5))),
                last_modified: Some(timestamp(now_ms())),
                ..CopyPartResult::default()
            }),
            ..UploadPartCopyOutput::default()
        };
        Ok(S3Response::new(sealed_output!(output, seal.as_ref())))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        let marker = match input.part_number_marker {
            None => 0,
            Some(m) => u32::try_from(m)
                .map_err(|_| s3_error!(InvalidArgument, "invalid part-number-marker"))?,
        };
        let max = match input.max_parts {
            None => 1000,
            Some(n) if n < 0 => {
                return Err(s3_error!(InvalidArgument, "max-parts must not be negative"));
            }
            Some(n) => (n as usize).min(1000),
        };
        let (record, parts, truncated) = self
            .engine
            .list_parts(
                reg.as_ref(),
                &input.bucket,
                &input.key,
                &input.upload_id,
                marker,
                max,
            )
            .await?;
        let next = parts.last().map(|(n, _)| *n as i32);
        // An encrypted upload's part checksums open with its key: the gateway's, or the
        // customer's when the request gives it; without it, none are listed.
        let customer = customer_key!(input)?;
        let seal = record.more.sealed.as_ref().and_then(|sealed| {
            Seal::for_read(
                Some(&sealed.mode),
                customer.as_ref(),
                self.engine.gateway_keys(),
            )
            .ok()
            .flatten()
        });
        let parts = parts
            .into_iter()
            .map(|(number, stored)| {
                let checksums = stored.checksums_opened(seal.as_ref());
                let part = &stored.part;
                let value = |algorithm| checksums.get(algorithm).cloned();
                Part {
                    part_number: Some(number as i32),
                    size: Some(part.size as i64),
                    e_tag: Some(etag(&hex::encode(part.md5))),
                    last_modified: Some(timestamp(part.last_modified_ms)),
                    checksum_crc32: value(PartChecksum::Crc32),
                    checksum_crc32c: value(PartChecksum::Crc32c),
                    checksum_sha1: value(PartChecksum::Sha1),
                    checksum_sha256: value(PartChecksum::Sha256),
                    ..Part::default()
                }
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next,
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..ListPartsOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        refuse_conditional_write(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        refuse_full_object(input.checksum_type.as_ref())?;
        let customer = customer_key!(input)?;
        let listed: Vec<ListedPart> = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| ListedPart {
                number: p.part_number.unwrap_or(0),
                etag: p.e_tag.map(|e| e.value().to_owned()),
                checksums: Checksums {
                    crc32: p.checksum_crc32,
                    crc32c: p.checksum_crc32c,
                    crc64nvme: p.checksum_crc64nvme,
                    sha1: p.checksum_sha1,
                    sha256: p.checksum_sha256,
                },
            })
            .collect();
        let whole = Checksums {
            crc32: input.checksum_crc32,
            crc32c: input.checksum_crc32c,
            crc64nvme: input.checksum_crc64nvme,
            sha1: input.checksum_sha1,
            sha256: input.checksum_sha256,
        };
        let manifest = self
            .engine
            .complete_upload(
                &reg,
                &input.bucket,
                &input.key,
                &input.upload_id,
                &listed,
                (&whole, customer.as_ref()),
            )
            .await?;
        // The composite checksum; a sealed object's stays sealed.
        let checksums = &manifest.extra.checksums;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            e_tag: Some(etag(&manifest.etag)),
            version_id: manifest.version.clone(),
            checksum_crc32: checksums.crc32.clone(),
            checksum_crc32c: checksums.crc32c.clone(),
            checksum_sha1: checksums.sha1.clone(),
            checksum_sha256: checksums.sha256.clone(),
            checksum_type: (*checksums != Checksums::default())
                .then(|| ChecksumType::from_static(ChecksumType::COMPOSITE)),
            server_side_encryption: manifest
                .sealed
                .as_ref()
                .filter(|sealed| matches!(sealed.mode, SealMode::Gateway { .. }))
                .map(|_| ServerSideEncryption::from_static(seal::AES256)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        if input.delimiter.as_deref().is_some_and(|d| !d.is_empty()) {
            return Err(s3_error!(
                NotImplemented,
                "listing multipart uploads with a delimiter is not supported"
            ));
        }
        let encode = url_encoded(&input.encoding_type)?;
        let max = max_keys(input.max_uploads)?;
        let key_marker = input.key_marker.as_deref().filter(|m| !m.is_empty());
        // Without an upload-id marker, every upload of the marker key is skipped too.
        let after = key_marker.map(|k| {
            (
                k,
                input
                    .upload_id_marker
                    .as_deref()
                    .filter(|m| !m.is_empty())
                    .unwrap_or("~"),
            )
        });
        let prefix = input.prefix.clone().unwrap_or_default();
        let (uploads, truncated) = self
            .engine
            .list_uploads(reg.as_ref(), &input.bucket, &prefix, after, max)
            .await?;
        let enc = |s: &str| {
            if encode {
                index::url_encode(s)
            } else {
                s.to_owned()
            }
        };
        let next = truncated.then(|| uploads.last().cloned()).flatten();
        let uploads = uploads
            .into_iter()
            .map(|(key, upload_id, ms)| MultipartUpload {
                key: Some(enc(&key)),
                upload_id: Some(upload_id),
                initiated: Some(timestamp(ms)),
                ..MultipartUpload::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: Some(enc(&prefix)),
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next.as_ref().map(|(k, _, _)| enc(k)),
            next_upload_id_marker: next.map(|(_, id, _)| id),
            uploads: Some(uploads),
            encoding_type: input.encoding_type,
            ..ListMultipartUploadsOutput::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let reg = self.client(&req)?;
        let input = req.input;
        self.engine
            .abort_upload(&reg, &input.bucket, &input.key, &input.upload_id)
            .await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_source_ranges_are_both_offsets_or_refused() {
        assert_eq!(copy_source_range("bytes=0-0").unwrap(), (0, 0));
        assert_eq!(
            copy_source_range("bytes=5-10485759").unwrap(),
            (5, 10_485_759)
        );
        for bad in [
            "bytes=5-",
            "bytes=-5",
            "5-10",
            "bytes=a-b",
            "bytes=1-2-3",
            "bytes=+1-2",
            "",
            "bytes=99999999999999999999-1",
        ] {
            let e = copy_source_range(bad).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{bad}");
        }
    }
}
