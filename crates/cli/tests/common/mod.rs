//! A real cluster of `bulwark` node processes on loopback for integration tests. Every process is
//! killed when the [`TestCluster`] is dropped, including after a failed assertion.
#![allow(dead_code)]

use bulwark_client::Client;
use bulwark_core::NodeId;
use bulwark_sim::checker::{self, History, Op, OpKind, Outcome};
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BULWARK: &str = env!("CARGO_BIN_EXE_bulwark");
pub const BYZANTINE: &str = env!("CARGO_BIN_EXE_bulwark-byzantine");

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub n: usize,
    children: Vec<Option<Child>>,
    /// Each node's `bulwark a2m serve`, for clusters made with `--a2m`.
    trusted_logs: Vec<Option<Child>>,
    /// The TPM the trusted logs keep their generations in (`--a2m-tpm`).
    tpm: Option<String>,
    /// `bulwark node join` processes by the port they asked to serve at: their ids are known
    /// only once the configuration service certified them.
    joined: Vec<(u16, Child)>,
    /// The ports this test holds: nodes, then metrics, then those for nodes that join.
    ports: Ports,
    grace_ms: u64,
    /// More `node` arguments for every node started from now on.
    pub node_args: Vec<String>,
    /// Made with `--a2m`: every node has a trusted log to start first.
    a2m: bool,
}

impl TestCluster {
    /// Writes a fresh PoWerStore cluster (free loopback ports) and starts every node honestly.
    pub fn start(f: usize, grace_ms: u64) -> TestCluster {
        Self::start_protocol("powerstore", f, grace_ms)
    }

    /// Writes a fresh cluster running `protocol` and starts every node honestly.
    pub fn start_protocol(protocol: &str, f: usize, grace_ms: u64) -> TestCluster {
        Self::start_nodes(protocol, f, 3 * f + 1, grace_ms)
    }

    /// Writes a fresh cluster of `n` nodes (several groups when `n > 3f+1`) whose default volume
    /// runs `protocol`, and starts every node honestly.
    pub fn start_nodes(protocol: &str, f: usize, n: usize, grace_ms: u64) -> TestCluster {
        Self::start_with(protocol, f, n, grace_ms, &[])
    }

    /// [`TestCluster::start_nodes`] with more `cluster init` arguments.
    pub fn start_with(
        protocol: &str,
        f: usize,
        n: usize,
        grace_ms: u64,
        init: &[&str],
    ) -> TestCluster {
        let mut cluster = Self::init(protocol, f, n, grace_ms, init);
        cluster.spawn_all();
        cluster
    }

    /// Writes a fresh cluster and starts nothing, so that `node_args` can be set before any node
    /// runs: a node killed and respawned while it creates its store tests start-up, not the run.
    pub fn init(protocol: &str, f: usize, n: usize, grace_ms: u64, init: &[&str]) -> TestCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = Ports::reserve(2 * n + JOINS_MAX);
        let status = Command::new(BULWARK)
            .args(["cluster", "init", "--base-port"])
            .arg(ports.base.to_string())
            .arg("--metrics-base-port")
            .arg((ports.base + n as u16).to_string())
            .args(["--protocol", protocol, "--f"])
            .arg(f.to_string())
            .arg("--nodes")
            .arg(n.to_string())
            .arg("--clients")
            .arg("admin:rw,writer2:rw,reader:r,mallory:r")
            .arg("--dir")
            .arg(dir.path())
            .args(init)
            .status()
            .expect("run cluster init");
        assert!(status.success(), "cluster init failed");
        TestCluster {
            dir,
            n,
            children: (0..n).map(|_| None).collect(),
            trusted_logs: (0..n).map(|_| None).collect(),
            tpm: init
                .iter()
                .position(|arg| *arg == "--a2m-tpm")
                .and_then(|at| init.get(at + 1))
                .map(|tcti| tcti.to_string()),
            joined: Vec::new(),
            ports,
            grace_ms,
            node_args: Vec::new(),
            a2m: init.contains(&"--a2m"),
        }
    }

    /// Starts every node honestly, each after its trusted log when the cluster has them.
    pub fn spawn_all(&mut self) {
        for id in 0..self.n {
            if self.a2m {
                self.spawn_trusted_log(id);
            }
        }
        for id in 0..self.n {
            self.spawn(id, None);
        }
    }

    /// Starts node `id`'s trusted log (`bulwark a2m serve`) on the socket its `node.toml`
    /// names; kills any previous process first.
    pub fn spawn_trusted_log(&mut self, id: usize) {
        self.kill_trusted_log(id);
        let node = self.path().join(format!("node-{id}"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.join("a2m.log"))
            .expect("log");
        let mut command = self.trusted_log_command(id);
        let child = command
            .env("BULWARK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn a2m serve");
        self.trusted_logs[id] = Some(child);
        // Serving once its socket accepts (the killed process's socket file refuses until then).
        let socket = node.join("a2m.sock");
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "node {id}'s trusted log did not serve: {}",
                std::fs::read_to_string(node.join("a2m.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `bulwark a2m serve` for node `id`'s trusted log, with its TPM if it has one.
    pub fn trusted_log_command(&self, id: usize) -> Command {
        let node = self.path().join(format!("node-{id}"));
        let mut command = Command::new(BULWARK);
        command
            .args(["a2m", "serve", "--dir"])
            .arg(node.join("a2m"))
            .arg("--socket")
            .arg(node.join("a2m.sock"));
        if let Some(tcti) = &self.tpm {
            command.args(["--tpm", tcti]);
        }
        command
    }

    /// SIGKILL to node `id`'s trusted log.
    pub fn kill_trusted_log(&mut self, id: usize) {
        if let Some(mut child) = self.trusted_logs[id].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs the `bulwark` command line against this cluster with `args`, `stdin` on its standard
    /// input, and waits for it.
    pub fn cli(&self, args: &[&str], stdin: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(BULWARK)
            .args(args)
            .arg("--cluster")
            .arg(self.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run bulwark");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin)
            .expect("write stdin");
        child.wait_with_output().expect("bulwark output")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self, id: usize) -> PathBuf {
        self.path().join(format!("node-{id}/node.log"))
    }

    /// Starts node `id`, honest or with a Byzantine behaviour; kills any previous process first.
    pub fn spawn(&mut self, id: usize, behaviour: Option<&str>) {
        self.spawn_seeded(id, behaviour, 1);
    }

    /// [`TestCluster::spawn`], with `seed` for the Byzantine behaviour's choices (how long it
    /// serves honestly first, among them).
    pub fn spawn_seeded(&mut self, id: usize, behaviour: Option<&str>, seed: u64) {
        match behaviour {
            Some(behaviour) => {
                self.spawn_byzantine(id, &["--behaviour", behaviour, "--seed", &seed.to_string()])
            }
            None => self.spawn_program(id, BULWARK, &[]),
        }
    }

    /// Starts node `id` as `bulwark-byzantine ARGS node …`; kills any previous process first.
    pub fn spawn_byzantine(&mut self, id: usize, args: &[&str]) {
        self.spawn_program(id, BYZANTINE, args);
    }

    fn spawn_program(&mut self, id: usize, program: &str, args: &[&str]) {
        self.kill(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(id))
            .expect("log");
        let child = Command::new(program)
            .args(args)
            .arg("node")
            .arg("--cluster")
            .arg(self.path())
            .arg("--id")
            .arg(id.to_string())
            .arg("--grace-ms")
            .arg(self.grace_ms.to_string())
            .args(&self.node_args)
            .env("BULWARK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn node");
        self.children[id] = Some(child);
    }

    /// Runs `bulwark node join` for a new node at a free loopback port, as the administrator:
    /// it is added in the next epoch and then serves. Returns the port (its address names it in
    /// the certified configuration).
    pub fn join(&mut self) -> u16 {
        self.join_as("admin")
    }

    /// [`TestCluster::join`] as client `client`: one without the authority key waits for the
    /// administrator's `node add`.
    pub fn join_as(&mut self, client: &str) -> u16 {
        assert!(self.joined.len() < JOINS_MAX, "more joins than ports held");
        let port = self.ports.base + (2 * self.n + self.joined.len()) as u16;
        let log = std::fs::File::create(self.path().join(format!("join-{port}.log"))).expect("log");
        let child = Command::new(BULWARK)
            .args(["node", "join", "--client", client, "--address"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--cluster")
            .arg(self.path())
            .env("BULWARK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn node join");
        self.joined.push((port, child));
        port
    }

    /// The log of the node that joined at `port`.
    pub fn join_log(&self, port: u16) -> String {
        std::fs::read_to_string(self.path().join(format!("join-{port}.log"))).unwrap_or_default()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self, id: usize) {
        if let Some(mut child) = self.children[id].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn client(&self, name: &str) -> Client {
        let mut client = Client::connect(self.path(), name)
            .await
            .expect("client connects");
        client.deadline = Duration::from_secs(20);
        client
    }

    /// Waits until the given nodes answer status.
    pub async fn wait_up(&self, ids: &[usize]) {
        let client = self.client("admin").await;
        let started = Instant::now();
        loop {
            let statuses = client.status().await;
            if ids.iter().all(|id| statuses[*id].2.is_ok()) {
                return;
            }
            if started.elapsed() > Duration::from_secs(30) {
                for id in ids {
                    eprintln!(
                        "--- node {id} log ---\n{}",
                        std::fs::read_to_string(self.log(*id)).unwrap_or_default()
                    );
                }
                panic!("nodes {ids:?} did not come up");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for id in 0..self.n {
            self.kill(id);
            self.kill_trusted_log(id);
        }
        for (_, child) in &mut self.joined {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Nodes a test may add with [`TestCluster::join`].
const JOINS_MAX: usize = 8;

/// Consecutive loopback ports for one test's cluster. Tests run at once as separate processes,
/// and ports one of them was given but has not bound yet (or frees while a node restarts) are
/// free to any other: so each test nextest runs at the same time (its global slot) picks from a
/// window of its own, below the kernel's ephemeral range, and only tests that ran one after the
/// other share a window. A random base inside it keeps them apart too.
struct Ports {
    base: u16,
}

impl Ports {
    const LOW: u16 = 20_000;
    const WINDOW: u16 = 750;
    const WINDOWS: u16 = 16;

    fn reserve(count: usize) -> Ports {
        let count = u16::try_from(count).expect("ports");
        assert!(count < Self::WINDOW, "a cluster too large for its window");
        let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
            .ok()
            .and_then(|slot| slot.parse::<u16>().ok())
            .unwrap_or_else(|| rand::random_range(0..Self::WINDOWS));
        let window = Self::LOW + (slot % Self::WINDOWS) * Self::WINDOW;
        for _ in 0..64 {
            let base = window + rand::random_range(0..Self::WINDOW - count);
            let free = (base..base + count)
                .map(|port| std::net::TcpListener::bind(("127.0.0.1", port)))
                .collect::<Result<Vec<_>, _>>();
            if free.is_ok() {
                return Ports { base };
            }
        }
        panic!("no {count} free consecutive ports in the window from {window}");
    }
}

/// Records client operations with real-time intervals for the linearizability checker.
#[derive(Clone)]
pub struct Recorder {
    started: Instant,
    history: Arc<Mutex<History>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            started: Instant::now(),
            history: Arc::new(Mutex::new(History::default())),
        }
    }
}

impl Recorder {
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    pub fn record(&self, client: u64, key: &[u8], kind: OpKind, invoke: u64, outcome: Outcome) {
        let complete = match outcome {
            Outcome::Unknown => None,
            _ => Some(self.now()),
        };
        let op = Op {
            client,
            key: key.to_vec(),
            kind,
            invoke,
            complete,
            outcome,
        };
        self.history.lock().unwrap().push(op);
    }

    pub fn history(&self) -> History {
        self.history.lock().unwrap().clone()
    }

    /// Checks the history so far and fails, naming `what`, unless it is linearizable.
    pub fn assert_linearizable(&self, what: &str) -> checker::Report {
        let report = checker::check(&self.history());
        assert!(
            report.ok,
            "{what}: history is not linearizable: {:#?} (inconclusive keys: {:?})",
            report.violations, report.inconclusive
        );
        report
    }
}

/// Copies the directory tree `from` to `to` (made if missing).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Unique per write; every third is large enough to be erasure-coded rather than replicated.
pub fn value_for(writer: u64, sequence: u64) -> Vec<u8> {
    let len = if sequence.is_multiple_of(3) {
        9_000
    } else {
        24
    };
    let mut value = format!("w{writer}-s{sequence}-").into_bytes();
    value.resize(len, b'.');
    value
}

/// Concurrent writers and readers on three keys; one node SIGKILLed and restarted mid-run. `n` is
/// how many of the group's members hold the protocol's registers (ABD: the first `2f+1`).
pub async fn survives_a_sigkilled_node(protocol: &str, n: usize) {
    const OPS_PER_CLIENT_MAX: u64 = 1_500;
    let mut cluster = TestCluster::init(protocol, 1, 4, 1_000, &[]);
    if protocol == "powerstore" {
        // One key's metadata in memory: nearly every request reads its key back from the store
        // (changes not yet committed included), and the restart counts keys it does not cache.
        cluster.node_args = vec!["--cached-keys".into(), "1".into()];
    }
    cluster.spawn_all();
    let all: Vec<usize> = (0..n).collect();
    cluster.wait_up(&all).await;
    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let keys: Vec<Vec<u8>> = (0..3).map(|k| format!("key-{k}").into_bytes()).collect();
    let mut tasks = Vec::new();
    for writer in 0..3u64 {
        let client = cluster
            .client(if writer == 0 { "admin" } else { "writer2" })
            .await;
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((writer + sequence) % 3) as usize];
                let value = value_for(writer, sequence);
                let invoke = recorder.now();
                let outcome = match client.put(key, Bytes::from(value.clone())).await {
                    Ok(_) => Outcome::Ok,
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(writer, key, OpKind::Write(Some(value)), invoke, outcome);
            }
        }));
    }
    for reader in 0..2u64 {
        let client = cluster.client("reader").await;
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((reader + sequence) % 3) as usize];
                let invoke = recorder.now();
                let outcome = match client.get(key).await {
                    Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(100 + reader, key, OpKind::Read, invoke, outcome);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let killed_at = recorder.now();
    cluster.kill(1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let restarted_at = recorder.now();
    cluster.spawn(1, None);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }
    cluster.wait_up(&[1]).await;
    let client = cluster.client("reader").await;
    for key in &keys {
        let invoke = recorder.now();
        let (value, _) = client.get(key).await.expect("final read");
        assert!(value.is_some(), "an acknowledged write to {key:?} vanished");
        recorder.record(
            999,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(value.map(|v| v.to_vec())),
        );
    }
    let report = recorder.assert_linearizable(protocol);
    let history = recorder.history();
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let during_outage = ops
        .iter()
        .filter(|op| {
            op.outcome != Outcome::Unknown
                && op.invoke > killed_at
                && op.complete.is_some_and(|c| c < restarted_at)
        })
        .count();
    eprintln!(
        "{protocol}: checked {} operations ({acknowledged} acknowledged writes, {during_outage} completed while node 1 was down) on {} keys",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 60,
        "too few writes completed ({acknowledged})"
    );
    assert!(
        during_outage >= 20,
        "operations must continue while a node is down ({during_outage})"
    );

    // Node 1 recovered its acknowledged state from disk: with the last node down too, every
    // quorum needs node 1, and every key still reads its latest value.
    let last = n - 1;
    cluster.kill(last);
    for key in &keys {
        let (value, report) = client.get(key).await.expect("read with another node down");
        assert!(value.is_some());
        assert!(report.answered.contains(&NodeId(1)));
    }
}
