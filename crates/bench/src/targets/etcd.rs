//! etcd as the crash-tolerant peer: a 3-member cluster (on loopback, or on shaped hosts) with its default durability
//! (every raft entry fsync'd before it is acknowledged), in a temporary directory, driven through
//! etcd's JSON gateway (`/v3/kv/*`, keys and values base64) over kept-alive HTTP/1.1.
//!
//! Reads are etcd's default linearizable ranges (ReadIndex through the leader), so both systems
//! give the same guarantee to a single client. Clients are spread over the three members.

use crate::driver::Target;
use crate::http::HttpConnection;
use crate::links::Hosts;
use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
    clients: Vec<SocketAddr>,
    pools: Vec<Mutex<Vec<HttpConnection>>>,
    next: AtomicUsize,
    sent: AtomicU64,
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
        let target = EtcdTarget {
            members,
            clients: clients
                .iter()
                .enumerate()
                .map(|(i, &port)| SocketAddr::new(hosts.server_ip(i), port))
                .collect(),
            pools: (0..MEMBERS).map(|_| Mutex::new(Vec::new())).collect(),
            next: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            revision: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            dir: dir.to_path_buf(),
        };
        let started = Instant::now();
        for &address in &target.clients {
            loop {
                let mut c = HttpConnection::new(address);
                if let Ok((200, body)) = c.request("GET", "/health", b"").await
                    && String::from_utf8_lossy(&body).contains("true")
                {
                    break;
                }
                if started.elapsed() > READY_TIMEOUT {
                    bail!(
                        "etcd did not become healthy within {READY_TIMEOUT:?}; see {}/m*.log",
                        dir.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(target)
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value> {
        let member = self.next.fetch_add(1, Ordering::Relaxed) % MEMBERS;
        let pooled = self.pools[member]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let mut connection = pooled.unwrap_or_else(|| HttpConnection::new(self.clients[member]));
        let before = connection.bytes_sent;
        let result = connection
            .request("POST", path, &serde_json::to_vec(&body)?)
            .await;
        self.sent
            .fetch_add(connection.bytes_sent - before, Ordering::Relaxed);
        self.pools[member]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(connection);
        let (status, reply) = result?;
        let reply: Value = serde_json::from_slice(&reply)
            .with_context(|| format!("etcd {path}: status {status}, not JSON"))?;
        if status != 200 {
            bail!("etcd {path}: status {status}: {}", reply["message"]);
        }
        if let Some(revision) = reply["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
        {
            self.revision.fetch_max(revision, Ordering::Relaxed);
        }
        Ok(reply)
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
            let reply = self
                .call("/v3/kv/range", json!({ "key": B64.encode(key) }))
                .await?;
            Ok(reply["kvs"].as_array().is_some_and(|kvs| !kvs.is_empty()))
        })
    }
    fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.call(
                "/v3/kv/put",
                json!({ "key": B64.encode(key), "value": B64.encode(&value) }),
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
            let reply = self
                .call(
                    "/v3/kv/range",
                    json!({ "key": B64.encode(start), "range_end": B64.encode([0u8]), "limit": count }),
                )
                .await?;
            Ok(reply["kvs"].as_array().map_or(0, Vec::len))
        })
    }
    fn pids(&self) -> Vec<u32> {
        self.members.0.iter().map(Child::id).collect()
    }
    /// Counted by this client: HTTP request bytes, headers included.
    fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async { Some(self.sent.load(Ordering::Relaxed)) })
    }
    /// Compacts the history up to the latest revision seen: etcd keeps every overwritten value
    /// until compaction, and the size sweep would otherwise fill its 2 GiB backend quota.
    fn between_runs(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let revision = self.revision.load(Ordering::Relaxed);
            if revision > self.compacted.swap(revision, Ordering::Relaxed) {
                self.call(
                    "/v3/kv/compaction",
                    json!({ "revision": revision.to_string() }),
                )
                .await?;
            }
            Ok(())
        })
    }
}
