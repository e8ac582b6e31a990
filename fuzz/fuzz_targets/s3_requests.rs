//! The S3 gateway under an authenticated client that sends whatever the input holds: up to eight
//! requests through the very service `bulwark gateway` serves (s3s routing, SigV4, headers,
//! XML bodies, then Bulwark's handlers) over registers and causal volumes kept in memory (a
//! bucket created with `x-bulwark-consistency: causal` is one). Most are signed with a
//! configured key so they reach the handlers; the rest test the refusals. Nothing may panic,
//! and no request may end in an internal error.
#![no_main]

use arbitrary::{Result, Unstructured};
use bulwark_gateway::engine::Limits;
use bulwark_gateway::store::MemRegisters;
use bytes::Bytes;
use hmac::{KeyInit, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

const ACCESS_KEY: &str = "fuzzer";
const SECRET_KEY: &str = "fuzzer-secret";
const REGION: &str = "us-east-1";

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
});

const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];
const BUCKETS: [&str; 3] = ["bkt", "bkt2", "no-such-bucket"];
const KEYS: [&str; 5] = ["", "k", "a/b", "a/c", "dir/"];
const PARAMS: [&str; 24] = [
    "uploads",
    "uploadId",
    "partNumber",
    "delete",
    "list-type",
    "prefix",
    "delimiter",
    "max-keys",
    "marker",
    "continuation-token",
    "location",
    "versioning",
    "versionId",
    "acl",
    "tagging",
    "encoding-type",
    "start-after",
    "key-marker",
    "upload-id-marker",
    "max-uploads",
    "max-parts",
    "part-number-marker",
    "x-id",
    "fetch-owner",
];
const HEADERS: [&str; 21] = [
    "content-md5",
    "content-type",
    "x-amz-meta-a",
    "range",
    "if-match",
    "if-none-match",
    "x-amz-copy-source",
    "x-amz-checksum-crc32",
    "x-amz-checksum-sha256",
    "x-amz-server-side-encryption",
    "x-amz-acl",
    "if-modified-since",
    "if-unmodified-since",
    "x-amz-copy-source-range",
    "x-amz-metadata-directive",
    "content-encoding",
    "x-amz-sdk-checksum-algorithm",
    "cache-control",
    "x-amz-copy-source-if-match",
    "x-amz-server-side-encryption-customer-key",
    "x-bulwark-consistency",
];

/// Letters S3 names may use without percent-encoding: the canonical request is then the
/// request as written.
fn safe(u: &mut Unstructured, max: usize) -> Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_./";
    let len = u.int_in_range(0..=max)?;
    (0..len)
        .map(|_| Ok(ALPHABET[u.choose_index(ALPHABET.len())?] as char))
        .collect()
}

fn value(u: &mut Unstructured) -> Result<String> {
    Ok(match u.int_in_range(0..=4u8)? {
        0 => u.int_in_range(0..=10_001u32)?.to_string(),
        1 => safe(u, 12)?,
        // Causal buckets take their own paths through the gateway.
        2 => ["causal", "registers"][u.choose_index(2)?].to_owned(),
        _ => {
            let len = u.int_in_range(0..=64)?;
            String::from_utf8_lossy(u.bytes(len)?).into_owned()
        }
    })
}

fn body(u: &mut Unstructured) -> Result<Vec<u8>> {
    let inner = value(u)?;
    Ok(match u.int_in_range(0..=4u8)? {
        0 => format!("<Delete><Object><Key>{inner}</Key></Object><Quiet>true</Quiet></Delete>")
            .into_bytes(),
        1 => format!(
            "<CompleteMultipartUpload><Part><PartNumber>{}</PartNumber><ETag>{inner}</ETag></Part></CompleteMultipartUpload>",
            u.int_in_range(0..=10_001u32)?
        )
        .into_bytes(),
        2 => format!(
            "<CreateBucketConfiguration><LocationConstraint>{inner}</LocationConstraint></CreateBucketConfiguration>"
        )
        .into_bytes(),
        _ => {
            let len = u.int_in_range(0..=4096)?;
            u.bytes(len)?.to_vec()
        }
    })
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// `YYYYMMDDTHHMMSSZ` for now: s3s refuses signatures dated far from its clock.
fn amz_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Signs `request` (SigV4, header form) with the configured key, as an SDK would.
fn sign(
    request: &mut http::Request<s3s::Body>,
    path: &str,
    query: &str,
    body: &[u8],
    unsigned_payload: bool,
) {
    let method = request.method().as_str().to_owned();
    let date = amz_date();
    let payload = if unsigned_payload {
        "UNSIGNED-PAYLOAD".to_owned()
    } else {
        hex_sha256(body)
    };
    let canonical = format!(
        "{method}\n{path}\n{query}\nhost:127.0.0.1\nx-amz-content-sha256:{payload}\nx-amz-date:{date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}"
    );
    let scope = format!("{}/{REGION}/s3/aws4_request", &date[..8]);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex_sha256(canonical.as_bytes())
    );
    let mut signing = hmac(format!("AWS4{SECRET_KEY}").as_bytes(), &date[..8]);
    for part in [REGION, "s3", "aws4_request"] {
        signing = hmac(&signing, part);
    }
    let signature = hex::encode(hmac(&signing, &to_sign));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}"
    );
    let headers = request.headers_mut();
    headers.insert("x-amz-date", date.parse().expect("a header value"));
    headers.insert(
        "x-amz-content-sha256",
        payload.parse().expect("a header value"),
    );
    headers.insert(
        http::header::AUTHORIZATION,
        authorization.parse().expect("a header value"),
    );
}

/// A signed request with no query, headers or body: the buckets every input starts with.
fn plain(method: &str, path: &str) -> http::Request<s3s::Body> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "127.0.0.1")
        .header(http::header::CONTENT_LENGTH, 0)
        .body(s3s::Body::empty())
        .expect("a valid request");
    sign(&mut request, path, "", b"", false);
    request
}

fn request(u: &mut Unstructured) -> Result<http::Request<s3s::Body>> {
    let method = METHODS[u.choose_index(METHODS.len())?];
    let bucket = BUCKETS[u.choose_index(BUCKETS.len())?];
    let key = if u.ratio(1, 4)? {
        safe(u, 16)?
    } else {
        KEYS[u.choose_index(KEYS.len())?].to_owned()
    };
    let path = if key.is_empty() {
        format!("/{bucket}")
    } else {
        format!("/{bucket}/{key}")
    };
    let mut query: Vec<(String, String)> = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let name = PARAMS[u.choose_index(PARAMS.len())?].to_owned();
        let value = if u.ratio(1, 3)? {
            String::new()
        } else {
            safe(u, 12)?
        };
        query.push((name, value));
    }
    query.sort();
    let query = query
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join("&");
    let uri = if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{query}")
    };
    let body = body(u)?;
    let mut builder = http::Request::builder().method(method).uri(&uri);
    for _ in 0..u.int_in_range(0..=4)? {
        let name = HEADERS[u.choose_index(HEADERS.len())?];
        if let Ok(value) = http::HeaderValue::from_str(&value(u)?) {
            builder = builder.header(name, value);
        }
    }
    let mut request = builder
        .body(s3s::Body::from(Bytes::from(body.clone())))
        .map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let headers = request.headers_mut();
    headers.insert(
        http::header::HOST,
        http::HeaderValue::from_static("127.0.0.1"),
    );
    headers.insert(http::header::CONTENT_LENGTH, body.len().into());
    if u.ratio(7, 8)? {
        let unsigned_payload = u.ratio(1, 2)?;
        sign(&mut request, &path, &query, &body, unsigned_payload);
    } else if u.ratio(1, 2)? {
        // An Authorization header as the input spells it: the SigV4 parser's input.
        if let Ok(value) = http::HeaderValue::from_str(&value(u)?) {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
        }
    }
    Ok(request)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let clients = HashMap::from([(ACCESS_KEY.to_owned(), Arc::new(MemRegisters::default()))]);
    let secrets = HashMap::from([(ACCESS_KEY.to_owned(), SECRET_KEY.to_owned())]);
    let service = bulwark_gateway::server::service(
        Limits::default(),
        bulwark_gateway::seal::GatewayKeys::new([("fuzz".to_owned(), [7; 32])]),
        clients,
        secrets,
    );
    RUNTIME.block_on(async {
        for bucket in &BUCKETS[..2] {
            let response = service.call(plain("PUT", &format!("/{bucket}"))).await;
            assert!(
                response.is_ok_and(|r| r.status().is_success()),
                "bucket {bucket} made"
            );
        }
        for _ in 0..8 {
            let Ok(request) = request(&mut u) else {
                return;
            };
            let described = format!("{} {}", request.method(), request.uri());
            let Ok(mut response) = service.call(request).await else {
                continue;
            };
            let status = response.status();
            let body = response.body_mut().store_all_limited(64 << 20).await;
            assert!(
                status != http::StatusCode::INTERNAL_SERVER_ERROR,
                "{described}: internal error {:?}",
                body.map(|b| String::from_utf8_lossy(&b).into_owned())
            );
        }
    });
});
