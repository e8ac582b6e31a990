//! The HTTP front end: SigV4 against the configured keys, bounded headers and bodies, a bounded
//! number of connections, and one Bulwark client per configured client name.

use crate::config::GatewayConfig;
use crate::engine::{Engine, Limits};
use crate::s3::BulwarkS3;
use crate::seal::GatewayKeys;
use crate::store::Registers;
use bulwark_client::Client;
use hyper_util::rt::{TokioIo, TokioTimer};
use s3s::auth::{S3Auth, SecretKey};
use s3s::config::{S3Config, StaticConfigProvider};
use s3s::service::S3ServiceBuilder;
use s3s::{S3Result, s3_error};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Request headers together may not exceed this (hyper's read buffer; a larger head is refused
/// with 431 and the connection closed).
pub const HEADER_BYTES_MAX: usize = 64 * 1024;
/// Most header fields in one request.
pub const HEADERS_MAX: usize = 100;
/// XML request bodies (multi-object delete, complete-multipart) are read whole; this bounds them.
/// 10 000 parts or 1000 keys of 1024 bytes fit.
pub const XML_BODY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// A client that has not sent its whole request head by then is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

struct KeyAuth(HashMap<String, String>);

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        self.0
            .get(access_key)
            .map(|secret| SecretKey::from(secret.as_str()))
            .ok_or_else(|| s3_error!(InvalidAccessKeyId, "the access key is not configured"))
    }
}

/// Runs the collector of unnamed chunks every `collect_every_secs`, for as long as the gateway
/// serves; each run's counts go to the log.
fn collect_periodically(config: &GatewayConfig, chunk_grace: Duration, client: Arc<Client>) {
    let every = Duration::from_secs(config.collect_every_secs);
    let options = crate::collect::Collect {
        min_age: Duration::from_secs(config.collect_min_age_secs),
        settle: chunk_grace + Duration::from_secs(1),
        dry_run: false,
    };
    let engine = Engine::new(Limits {
        chunk_grace,
        ..Limits::default()
    });
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match crate::collect::collect(&engine, &client, options).await {
                Ok(collected) => tracing::info!(?collected, "chunks no object names collected"),
                Err(error) => tracing::warn!(%error, "the collection of unnamed chunks failed"),
            }
        }
    });
}

/// Connects to the cluster and serves S3 until Ctrl-C; `ready` learns the bound address.
pub async fn run(config: GatewayConfig, ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let mut by_name: HashMap<String, Arc<Client>> = HashMap::new();
    let mut clients = HashMap::new();
    let mut secrets = HashMap::new();
    for key in &config.access_keys {
        let client = match by_name.get(&key.client) {
            Some(client) => client.clone(),
            None => {
                let client = Arc::new(
                    Client::connect(&config.cluster, &key.client)
                        .await
                        .map_err(|e| anyhow::anyhow!("client {:?}: {e}", key.client))?,
                );
                by_name.insert(key.client.clone(), client.clone());
                client
            }
        };
        clients.insert(key.access_key.clone(), client);
        secrets.insert(key.access_key.clone(), key.secret_key.clone());
    }
    let limits = Limits {
        object_bytes_max: config.object_bytes_max,
        chunk_buffers: config.chunk_buffers,
        chunk_grace: Duration::from_secs(config.chunk_grace_secs),
        ..Limits::default()
    };
    let mut keys = Vec::new();
    for key in &config.sse_s3_keys {
        keys.push((key.id.clone(), key.read(&config.base)?));
    }
    if config.collect_every_secs > 0
        && let Some(first) = config.access_keys.first()
        && let Some(client) = by_name.get(&first.client)
    {
        collect_periodically(&config, limits.chunk_grace, client.clone());
    }
    let service = service(limits, GatewayKeys::new(keys), clients, secrets);

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    ready(listener.local_addr()?);
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(HEADER_BYTES_MAX)
        .max_header_size(HEADER_BYTES_MAX)
        .max_headers(HEADERS_MAX)
        .keep_alive(true);
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        // Waiting for a free slot before accepting leaves excess connections in the backlog.
        let permit = connections.clone().acquire_owned().await?;
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        let service = service.clone();
        let service = hyper::service::service_fn(move |request| {
            let service = service.clone();
            closing_after_continue(request, service)
        });
        let http = http.clone();
        tokio::spawn(async move {
            if let Err(error) = http.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            drop(permit);
        });
    }
}

/// The S3 service over `clients` (each access key's registers), checking SigV4 against
/// `secrets` (access key → secret key): what [`run`] serves on each connection.
pub fn service<R: Registers>(
    limits: Limits,
    keys: GatewayKeys,
    clients: HashMap<String, Arc<R>>,
    secrets: HashMap<String, String>,
) -> s3s::service::S3Service {
    let engine = Arc::new(Engine::new(limits).with_gateway_keys(keys));
    let mut builder = S3ServiceBuilder::new(BulwarkS3::new(engine, clients));
    builder.set_auth(KeyAuth(secrets));
    let mut s3_config = S3Config::default();
    s3_config.xml_max_body_size = XML_BODY_BYTES_MAX;
    // Browser-form POST uploads are not served; keep what s3s would buffer for them small.
    s3_config.post_object_max_file_size = 0;
    s3_config.form_max_field_size = 64 * 1024;
    s3_config.form_max_fields_size = 256 * 1024;
    s3_config.form_max_parts = 100;
    builder.set_config(Arc::new(StaticConfigProvider::new(Arc::new(s3_config))));
    builder.build()
}

/// Serves one request, and ends the connection after any request that asked for `100 Continue`.
///
/// Such a client may give up waiting for the interim response and send its body anyway (botocore
/// waits one second), so a late `100 Continue` can reach it after it has already read the final
/// response; on a kept-alive connection it is then taken as the start of the next reply, and the
/// next upload sees a response with no headers (seen as aws-cli's "upload failed: 'ETag'" on a
/// loaded machine). A fresh connection per such upload costs one handshake next to a body of
/// MiBs, and leaves nothing from one exchange to be misread in the next.
async fn closing_after_continue(
    request: hyper::Request<hyper::body::Incoming>,
    service: s3s::service::S3Service,
) -> Result<s3s::HttpResponse, s3s::HttpError> {
    let expects_continue = request.headers().contains_key(hyper::header::EXPECT);
    if is_form_upload(&request) {
        return Ok(with_request_id(form_uploads_refused()));
    }
    if let Some(why) = presigned_expiry_refused(request.uri().query()) {
        return Ok(with_request_id(refusal(
            hyper::StatusCode::FORBIDDEN,
            "AuthorizationQueryParametersError",
            why,
        )));
    }
    let mut response = service.call(request.map(s3s::Body::from)).await?;
    if expects_continue {
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    Ok(with_request_id(response))
}

/// Names the response as S3 does: an `x-amz-request-id` header on every response, and the same
/// id in the `RequestId` of an error document (s3s writes none), which S3 clients expect.
fn with_request_id(mut response: s3s::HttpResponse) -> s3s::HttpResponse {
    let id = format!("{:016X}", rand::random::<u64>());
    if let Ok(value) = hyper::header::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-amz-request-id", value);
    }
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let Some(body) = response.body().bytes() else {
        return response;
    };
    let text = String::from_utf8_lossy(&body);
    let Some(end) = text.rfind("</Error>") else {
        return response;
    };
    if text.contains("<RequestId>") {
        return response;
    }
    let named = format!(
        "{}<RequestId>{id}</RequestId>{}",
        &text[..end],
        &text[end..]
    );
    if response
        .headers()
        .contains_key(hyper::header::CONTENT_LENGTH)
    {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, named.len().into());
    }
    *response.body_mut() = s3s::Body::from(named);
    response
}

/// A browser-form upload (POST Object): a POST whose body is a multipart form.
fn is_form_upload<B>(request: &hyper::Request<B>) -> bool {
    request.method() == hyper::Method::POST
        && request
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                value
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("multipart/form-data")
            })
}

/// The longest a presigned URL may be valid, as S3 allows: a week.
const PRESIGNED_EXPIRY_SECONDS_MAX: i64 = 7 * 24 * 3600;

/// Why a presigned URL's `X-Amz-Expires` is refused, as S3 refuses it: negative, not a number, or
/// more than a week. (s3s would serve a longer one, and call a negative one malformed.)
fn presigned_expiry_refused(query: Option<&str>) -> Option<&'static str> {
    // Decoded as s3s decodes it (and signs it), so no encoding of the name slips past.
    form_urlencoded::parse(query?.as_bytes())
        .filter(|(name, _)| name == "X-Amz-Expires")
        .find_map(|(_, value)| match value.parse::<i64>() {
            Ok(seconds) if seconds < 0 => Some("X-Amz-Expires must be non-negative"),
            Ok(seconds) if seconds > PRESIGNED_EXPIRY_SECONDS_MAX => {
                Some("X-Amz-Expires must be less than a week (in seconds) that is 604800")
            }
            Ok(_) => None,
            Err(_) => Some("X-Amz-Expires should be a number"),
        })
}

/// An S3 error document with `status`, written before s3s sees the request.
fn refusal(status: hyper::StatusCode, code: &str, message: &str) -> s3s::HttpResponse {
    let mut response = hyper::Response::new(s3s::Body::from(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error>"
    )));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    response
}

/// Form uploads are not served: said as S3 says it, before any of the form is read (s3s would
/// buffer its file part), and the connection closed rather than drained.
fn form_uploads_refused() -> s3s::HttpResponse {
    let mut response = refusal(
        hyper::StatusCode::NOT_IMPLEMENTED,
        "NotImplemented",
        "browser form uploads (POST Object) are not supported",
    );
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn presigned_urls_valid_for_more_than_a_week_or_less_than_nothing_are_refused() {
        use super::presigned_expiry_refused as refused;
        assert_eq!(refused(None), None);
        assert_eq!(refused(Some("X-Amz-Expires=604800&X-Amz-Date=x")), None);
        assert_eq!(refused(Some("a=b&X-Amz-Expires=0")), None);
        assert!(refused(Some("X-Amz-Date=x&X-Amz-Expires=604801")).is_some());
        assert!(refused(Some("X-Amz-Expires=-1")).is_some());
        assert!(refused(Some("X-Amz-Expires=soon")).is_some());
        // Another parameter of a similar name is not the expiry; an encoded name is the same one.
        assert_eq!(refused(Some("x-amz-expires-note=-1")), None);
        assert!(refused(Some("X-Amz-Expire%73=9999999")).is_some());
        assert_eq!(refused(Some("X-Amz-Expires=%33%30%30")), None);
        assert!(refused(Some("X-Amz-Expires=60&X-Amz-Expires=9999999")).is_some());
    }
}
