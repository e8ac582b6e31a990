//! etcd as the crash-tolerant peer: a 3-member cluster (on loopback, or on shaped hosts) with its
//! default durability (every raft entry fsync'd before it is acknowledged), in a temporary
//! directory, driven through etcd's native gRPC API (`etcdserverpb.KV`, as etcd's own clients
//! speak it) over one HTTP/2 connection per member.
//!
//! Reads are etcd's default linearizable ranges (ReadIndex through the leader), so both systems
//! give the same guarantee to a single client. Clients are spread over the three members.

use crate::driver::Target;
use crate::links::Hosts;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

const MEMBERS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The install command the benchmark runs (as root) or prints.
pub const INSTALL: &str = "apt-get update && apt-get install -y etcd-server";

/// Finds `etcd` on PATH (or /usr/bin); installs Debian's etcd-server when it is missing and we
/// are root; otherwise says exactly what to run.
pub fn find_or_install() -> Result<PathBuf> {
    if let Some(found) = find() {
        return Ok(found);
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        bail!("etcd is not installed; run as root: {INSTALL}");
    }
    eprintln!("etcd not found; installing: {INSTALL}");
    let status = Command::new("sh").args(["-c", INSTALL]).status()?;
    match find() {
        Some(found) if status.success() => Ok(found),
        _ => bail!("installing etcd failed; run by hand: {INSTALL}"),
    }
}

fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub struct EtcdTarget {
    members: Members,
    /// One HTTP/2 connection per member, shared by every client task (gRPC multiplexes).
    channels: Vec<Channel>,
    next: AtomicUsize,
    /// Bytes written to the members' sockets: gRPC messages, HTTP/2 frames and headers.
    sent: Arc<AtomicU64>,
    revision: AtomicU64,
    compacted: AtomicU64,
    dir: PathBuf,
}

impl EtcdTarget {
    /// Starts a fresh 3-member cluster under `dir` (removed when the target is dropped), member
    /// `i` as server `i` of `hosts`.
    pub async fn start(program: &Path, dir: &Path, hosts: &Hosts) -> Result<EtcdTarget> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let url =
            |i: usize, port: u16| format!("http://{}", SocketAddr::new(hosts.server_ip(i), port));
        let peers: Vec<u16> = (0..MEMBERS).map(|_| hosts.port()).collect::<Result<_>>()?;
        let clients: Vec<u16> = (0..MEMBERS).map(|_| hosts.port()).collect::<Result<_>>()?;
        let initial = (0..MEMBERS)
            .map(|i| format!("m{i}={}", url(i, peers[i])))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Members(Vec::new());
        for i in 0..MEMBERS {
            let log = std::fs::File::create(dir.join(format!("m{i}.log")))?;
            let client_url = url(i, clients[i]);
            let peer_url = url(i, peers[i]);
            members.0.push(
                hosts
                    .command(i, program)
                    .arg("--name")
                    .arg(format!("m{i}"))
                    .arg("--data-dir")
                    .arg(dir.join(format!("m{i}")))
                    .args(["--listen-client-urls", &client_url])
                    .args(["--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url])
                    .args(["--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &initial])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", "bulwark-bench"])
                    // Room for the 16 MiB objects of the size sweep (default 1.5 MiB); this
                    // changes no durability setting.
                    .args(["--max-request-bytes", "33554432"])
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .with_context(|| format!("starting {}", program.display()))?,
            );
        }
        let sent = Arc::new(AtomicU64::new(0));
        let channels = (0..MEMBERS)
            .map(|i| {
                channel(
                    SocketAddr::new(hosts.server_ip(i), clients[i]),
                    sent.clone(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let target = EtcdTarget {
            members,
            channels,
            next: AtomicUsize::new(0),
            sent,
            revision: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            dir: dir.to_path_buf(),
        };
        // Healthy once every member serves a linearizable range (it has a leader and a quorum).
        let started = Instant::now();
        for member in 0..MEMBERS {
            while let Err(error) = target
                .unary_at::<_, kv::RangeResponse>(member, RANGE, kv::RangeRequest::key(b"health"))
                .await
            {
                if started.elapsed() > READY_TIMEOUT {
                    bail!(
                        "etcd did not become healthy within {READY_TIMEOUT:?} ({error:#}); see \
                         {}/m*.log",
                        dir.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        target.sent.store(0, Ordering::Relaxed);
        Ok(target)
    }

    /// One call, to the next member in turn.
    async fn unary<Req, Res>(&self, path: &'static str, request: Req) -> Result<Res>
    where
        Req: prost::Message + Send + Sync + 'static,
        Res: prost::Message + Default + Send + Sync + 'static + kv::Revisioned,
    {
        let member = self.next.fetch_add(1, Ordering::Relaxed) % MEMBERS;
        self.unary_at(member, path, request).await
    }

    async fn unary_at<Req, Res>(
        &self,
        member: usize,
        path: &'static str,
        request: Req,
    ) -> Result<Res>
    where
        Req: prost::Message + Send + Sync + 'static,
        Res: prost::Message + Default + Send + Sync + 'static + kv::Revisioned,
    {
        let mut grpc = tonic::client::Grpc::new(self.channels[member].clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        grpc.ready()
            .await
            .with_context(|| format!("etcd member {member}: not ready"))?;
        let reply: Res = grpc
            .unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .map_err(|status| anyhow::anyhow!("etcd {path}: {status}"))?
            .into_inner();
        if let Some(revision) = reply.revision() {
            self.revision.fetch_max(revision, Ordering::Relaxed);
        }
        Ok(reply)
    }
}

const PUT: &str = "/etcdserverpb.KV/Put";
const RANGE: &str = "/etcdserverpb.KV/Range";
const COMPACT: &str = "/etcdserverpb.KV/Compact";
/// The 16 MiB objects of the size sweep, with room (etcd is started with 32 MiB requests).
const MESSAGE_BYTES_MAX: usize = 64 << 20;

/// A lazily connected channel to `address` whose writes are counted in `sent`.
fn channel(address: SocketAddr, sent: Arc<AtomicU64>) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let sent = sent.clone();
            async move {
                let stream = TcpStream::connect(address).await?;
                stream.set_nodelay(true)?;
                Ok::<_, io::Error>(TokioIo::new(Counted { stream, sent }))
            }
        })),
    )
}

/// A socket that adds what it writes to a shared count.
struct Counted {
    stream: TcpStream,
    sent: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            self.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The few messages of etcd's `etcdserverpb` (rpc.proto, kv.proto) the benchmark sends and reads,
/// with etcd's field numbers; fields it never sets or reads are left out (protobuf skips them).
mod kv {
    /// Responses whose header names the store's revision.
    pub trait Revisioned {
        fn revision(&self) -> Option<u64>;
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(int64, tag = "3")]
        pub revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "5")]
        pub value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub limit: i64,
    }

    impl RangeRequest {
        pub fn key(key: &[u8]) -> RangeRequest {
            RangeRequest {
                key: key.to_vec(),
                range_end: Vec::new(),
                limit: 0,
            }
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "bytes", tag = "2")]
        pub value: bytes::Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompactionRequest {
        #[prost(int64, tag = "1")]
        pub revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompactionResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    fn of(header: &Option<ResponseHeader>) -> Option<u64> {
        header
            .as_ref()
            .and_then(|header| u64::try_from(header.revision).ok())
    }

    impl Revisioned for RangeResponse {
        fn revision(&self) -> Option<u64> {
            of(&self.header)
        }
    }

    impl Revisioned for PutResponse {
        fn revision(&self) -> Option<u64> {
            of(&self.header)
        }
    }

    impl Revisioned for CompactionResponse {
        fn revision(&self) -> Option<u64> {
            of(&self.header)
        }
    }
}

impl Drop for EtcdTarget {
    fn drop(&mut self) {
        std::mem::take(&mut self.members.0)
            .into_iter()
            .for_each(|mut c| {
                let _ = c.kill();
                let _ = c.wait();
            });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Target for EtcdTarget {
    fn name(&self) -> String {
        "etcd".into()
    }
    fn read(&self, key: String) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let reply: kv::RangeResponse = self
                .unary(RANGE, kv::RangeRequest::key(key.as_bytes()))
                .await?;
            Ok(!reply.kvs.is_empty())
        })
    }
    fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let _: kv::PutResponse = self
                .unary(
                    PUT,
                    kv::PutRequest {
                        key: key.into_bytes(),
                        value,
                    },
                )
                .await?;
            Ok(())
        })
    }
    fn can_scan(&self) -> bool {
        true
    }
    /// YCSB's scan: `count` records from `start` in key order (`range_end` "\0" means "to the
    /// end of the key space").
    fn scan(&self, start: String, count: usize) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move {
            let reply: kv::RangeResponse = self
                .unary(
                    RANGE,
                    kv::RangeRequest {
                        key: start.into_bytes(),
                        range_end: vec![0],
                        limit: i64::try_from(count).unwrap_or(i64::MAX),
                    },
                )
                .await?;
            Ok(reply.kvs.len())
        })
    }
    fn pids(&self) -> Vec<u32> {
        self.members.0.iter().map(Child::id).collect()
    }
    /// Counted by this client: every byte written to the members' sockets (HTTP/2 framing and
    /// headers included).
    fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async { Some(self.sent.load(Ordering::Relaxed)) })
    }
    /// Compacts the history up to the latest revision seen: etcd keeps every overwritten value
    /// until compaction, and the size sweep would otherwise fill its 2 GiB backend quota.
    fn between_runs(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let revision = self.revision.load(Ordering::Relaxed);
            if revision > self.compacted.swap(revision, Ordering::Relaxed) {
                let _: kv::CompactionResponse = self
                    .unary(
                        COMPACT,
                        kv::CompactionRequest {
                            revision: i64::try_from(revision).unwrap_or(i64::MAX),
                        },
                    )
                    .await?;
            }
            Ok(())
        })
    }
}
