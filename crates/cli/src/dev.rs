//! `bulwark dev`: a local cluster of separate node processes on loopback, under one directory, and
//! `--demo`, which shows the system working, including while one node lies.

use crate::cluster_init::{self, InitArgs};
use crate::objects::human_bytes;
use anyhow::{Context, Result, bail};
use bulwark_client::Client;
use bulwark_core::config::ClusterConfig;
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `bulwark dev` keeps its cluster, and where client commands look by default.
pub const DEFAULT_DIR: &str = ".bulwark-dev";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an epoch of a dev cluster lasts.
const DEV_EPOCH_MS: u64 = 10_000;

/// Node processes that are killed when this value is dropped, however `dev` ends.
pub(crate) struct Nodes {
    pub(crate) dir: PathBuf,
    pub(crate) children: Vec<Option<Child>>,
    /// Nodes started by `bulwark node join` (the demo's).
    pub(crate) joined: Vec<Child>,
    /// The nodes' trusted logs (`bulwark a2m serve`), for clusters made with `--a2m`.
    pub(crate) trusted_logs: Vec<Child>,
}

impl Nodes {
    /// Room for `n` node processes of the cluster in `dir`, none started yet.
    pub(crate) fn new(dir: PathBuf, n: usize) -> Nodes {
        Nodes {
            dir,
            children: (0..n).map(|_| None).collect(),
            joined: Vec::new(),
            trusted_logs: Vec::new(),
        }
    }

    /// Starts node `id`'s trusted log (`program a2m serve`, with `extra` arguments: a
    /// benchmark's delay) where `cluster init --a2m` made it, and waits until its socket accepts.
    pub(crate) fn spawn_trusted_log_with(
        &mut self,
        id: usize,
        program: &Path,
        extra: &[String],
    ) -> Result<()> {
        let node = self.dir.join(format!("node-{id}"));
        let socket = node.join(cluster_init::A2M_SOCKET);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.join("a2m.log"))?;
        let child = Command::new(program)
            .args(["a2m", "serve", "--dir"])
            .arg(node.join(cluster_init::A2M_DIR))
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        self.trusted_logs.push(child);
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if started.elapsed() > std::time::Duration::from_secs(10) {
                bail!(
                    "node {id}'s trusted log did not start; see {}",
                    node.join("a2m.log").display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    pub(crate) fn spawn(&mut self, id: usize, program: &Path, extra: &[&str]) -> Result<()> {
        self.spawn_with(id, program, extra, &[])
    }

    /// [`Nodes::spawn`], with `node_args` after `node` (its own options, such as
    /// `--cached-keys`) where `extra` goes before it.
    pub(crate) fn spawn_with(
        &mut self,
        id: usize,
        program: &Path,
        extra: &[&str],
        node_args: &[&str],
    ) -> Result<()> {
        // The old process goes first: the new one binds the same ports.
        self.kill(id);
        let log_path = self.dir.join(format!("node-{id}")).join("node.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let child = Command::new(program)
            .args(extra)
            .arg("node")
            .arg("--cluster")
            .arg(&self.dir)
            .arg("--id")
            .arg(id.to_string())
            .args(node_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        self.children[id] = Some(child);
        Ok(())
    }

    /// Starts `bulwark node join` (the binary `program`) for a new node at a free loopback port,
    /// logging to `join-<port>.log` in the cluster directory; returns the port, by which the
    /// certified configuration names it, and the log.
    pub(crate) fn join(&mut self, program: &Path) -> Result<(u16, PathBuf)> {
        let port = cluster_init::free_ports([127, 0, 0, 1].into(), 1)?
            .next()
            .context("finding a free port")?;
        let log_path = self.dir.join(format!("join-{port}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let child = Command::new(program)
            .args(["node", "join", "--address"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--cluster")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting bulwark node join")?;
        self.joined.push(child);
        Ok((port, log_path))
    }

    pub(crate) fn pid(&self, id: usize) -> Option<u32> {
        self.children[id].as_ref().map(Child::id)
    }

    fn kill(&mut self, id: usize) {
        if let Some(mut child) = self.children[id].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for id in 0..self.children.len() {
            self.kill(id);
        }
        for child in self.joined.iter_mut().chain(&mut self.trusted_logs) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the bulwark binary")?;
    Ok(exe.with_file_name(name))
}

pub async fn run(dir: &Path, nodes: usize, demo: bool) -> Result<()> {
    if !dir.join("cluster.toml").exists() {
        cluster_init::run(&InitArgs {
            nodes: Some(nodes),
            // Short, so that a membership change (the demo's join) takes effect within seconds.
            epoch_ms: DEV_EPOCH_MS,
            stop_tolerance_ms: 2_000,
            ..InitArgs::local(dir.to_path_buf())
        })?;
        eprintln!(
            "created a {nodes}-node cluster (f = 1) in {}",
            dir.display()
        );
    }
    let dir = std::fs::canonicalize(dir)?;
    let config = ClusterConfig::parse(
        &std::fs::read_to_string(dir.join("cluster.toml"))?,
        "cluster.toml",
    )?;
    let exe = std::env::current_exe()?;
    // The nodes of cluster.toml, and any that joined since (an earlier demo's): a certified
    // member left down would count against its groups' fault bound.
    let ids: Vec<usize> = (0..config.n())
        .chain(joined_ids(&dir, config.n()))
        .collect();
    let mut nodes = Nodes::new(dir.clone(), ids.iter().max().map_or(0, |id| id + 1));
    for id in &ids {
        nodes.spawn(*id, &exe, &[])?;
    }
    let client = Client::connect(&dir, "admin").await?;
    wait_until_up(&client, &dir, ids).await?;

    let groups = config.placement()?.groups().len();
    println!(
        "Bulwark dev cluster: {} nodes in {groups} replica group(s), tolerating f = {} Byzantine node(s) per group",
        config.n(),
        config.f
    );
    for node in &config.nodes {
        let metrics = node
            .metrics
            .map(|m| format!("http://{m}/metrics"))
            .unwrap_or_default();
        println!(
            "  node {}  {}  metrics {}  log {}",
            node.id,
            node.address,
            metrics,
            dir.join(format!("node-{}/node.log", node.id)).display()
        );
    }
    if demo {
        return run_demo(&client, &mut nodes, &dir).await;
    }
    let relative = dir
        .strip_prefix(std::env::current_dir()?)
        .map(Path::to_path_buf)
        .unwrap_or(dir.clone());
    println!();
    println!(
        "Try, from this directory (or with BULWARK_CLUSTER={}):",
        dir.display()
    );
    println!("  echo hello | bulwark put greeting");
    println!("  bulwark get greeting");
    println!("  bulwark status");
    println!(
        "  bulwark config show        # the certified membership (epochs of {} s here)",
        DEV_EPOCH_MS / 1000
    );
    println!(
        "Cluster files: {}. Press Ctrl-C to stop.",
        relative.display()
    );
    // SIGTERM too (a `kill`, a service manager): returning drops `Nodes`, which stops them.
    let signal = bulwark_node::stop_signal().await;
    eprintln!("{signal}: stopping nodes");
    Ok(())
}

/// The ids of nodes that joined after `cluster.toml` was written: their `node-<id>/` directories
/// (`bulwark node join` names them once certified).
fn joined_ids(dir: &Path, listed: usize) -> Vec<usize> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut ids: Vec<usize> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let id: usize = name.strip_prefix("node-")?.parse().ok()?;
            (id >= listed && dir.join(&name).join("node.toml").exists()).then_some(id)
        })
        .collect();
    ids.sort_unstable();
    ids
}

pub(crate) async fn wait_until_up(client: &Client, dir: &Path, ids: Vec<usize>) -> Result<()> {
    let started = Instant::now();
    loop {
        let statuses = client.status().await;
        let down: Vec<usize> = ids
            .iter()
            .copied()
            .filter(|id| {
                !statuses
                    .iter()
                    .any(|(node, _, status)| node.0 as usize == *id && status.is_ok())
            })
            .collect();
        if down.is_empty() {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "nodes {down:?} did not come up within {READY_TIMEOUT:?}; see {}/node-*/node.log",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_demo(client: &Client, nodes: &mut Nodes, dir: &Path) -> Result<()> {
    println!();
    println!("1. A small object, replicated on every node:");
    let report = client
        .put(b"demo/hello", Bytes::from_static(b"hello, Byzantine world"))
        .await?;
    let (value, _) = client.get(b"demo/hello").await?;
    println!(
        "   put demo/hello ({} of {} nodes acknowledged), get -> {:?}",
        report.answered.len(),
        report.n,
        String::from_utf8_lossy(value.as_deref().unwrap_or_default())
    );

    println!("2. A 1 MiB object, erasure-coded into 4 fragments of which any 2 rebuild it:");
    let big: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let started = Instant::now();
    client.put(b"demo/big", Bytes::from(big.clone())).await?;
    let put_time = started.elapsed();
    let started = Instant::now();
    let (value, _) = client.get(b"demo/big").await?;
    let get_time = started.elapsed();
    let same = value.as_deref() == Some(&big[..]);
    println!(
        "   put {:?}, get {:?}, {} back, identical: {same}",
        put_time,
        get_time,
        human_bytes(value.map_or(0, |v| v.len() as u64))
    );
    if !same {
        bail!("the 1 MiB object did not read back identically");
    }

    println!("3. Delete, then read:");
    client.delete(b"demo/hello").await?;
    let (value, _) = client.get(b"demo/hello").await?;
    println!(
        "   get demo/hello after delete -> {}",
        if value.is_none() {
            "not found"
        } else {
            "STILL THERE"
        }
    );

    let secret = Bytes::from_static(b"the value every correct client must see");
    client.put(b"demo/important", secret.clone()).await?;
    let byzantine = sibling("bulwark-byzantine")?;
    let liars: &[&str] = if byzantine.exists() {
        &["corrupting", "forging"]
    } else {
        println!(
            "4-5. (skipped: {} is not built; run `cargo build --release --bins`)",
            byzantine.display()
        );
        &[]
    };
    for (step, behaviour) in (4..).zip(liars) {
        println!(
            "{step}. Node 3 is replaced by a {behaviour} liar (same keys, same data, lies on \
             purpose):"
        );
        nodes.spawn(3, &byzantine, &["--behaviour", behaviour])?;
        wait_until_up(client, dir, vec![3]).await?;
        // A lie is seen only when the liar's reply is among the n - f a read uses: read until it
        // is caught (or 30 times), showing the first reads and the one that caught it.
        let mut caught = false;
        for attempt in 1..=30 {
            let (value, report) = client.get(b"demo/important").await?;
            let correct = value.as_ref() == Some(&secret);
            if !correct {
                bail!("a correct client read a wrong value with one lying node");
            }
            let blamed: Vec<String> = report
                .evidence
                .iter()
                .map(|e| format!("node {} ({:?})", e.node.0, e.kind))
                .collect();
            caught = !blamed.is_empty();
            if caught {
                println!(
                    "   read {attempt}: correct value -- caught: {}",
                    blamed.join(", ")
                );
                break;
            }
            if attempt <= 3 {
                println!("   read {attempt}: correct value (the lie was outvoted without a trace)");
            }
        }
        if !caught {
            println!("   30 reads: all correct; no lie among the replies they used was provable");
        }
    }
    let exe = std::env::current_exe()?;
    if !liars.is_empty() {
        nodes.spawn(3, &exe, &[])?;
        wait_until_up(client, dir, vec![3]).await?;
    }
    if client.cluster().configuration_service.is_some() {
        crate::demo_join::run(client, nodes, dir, &exe).await?;
    }
    println!("7. The cluster as `bulwark status` shows it:");
    for (id, address, status) in client.status().await {
        match status {
            Ok(s) => println!(
                "   node {} {address}: up, {} objects, {} requests",
                id.0, s.server.objects, s.requests
            ),
            Err(e) => println!("   node {} {address}: unreachable ({e})", id.0),
        }
    }
    println!(
        "Demo finished; stopping the cluster (its files stay in {}).",
        dir.display()
    );
    Ok(())
}
