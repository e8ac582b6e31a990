//! A real cluster of `bulwark` node processes on loopback for integration tests. Every process is
//! killed when the [`TestCluster`] is dropped, including after a failed assertion.
#![allow(dead_code)]

use bulwark_client::Client;
use bulwark_sim::checker::{History, Op, OpKind, Outcome};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BULWARK: &str = env!("CARGO_BIN_EXE_bulwark");
pub const BYZANTINE: &str = env!("CARGO_BIN_EXE_bulwark-byzantine");

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub n: usize,
    children: Vec<Option<Child>>,
    grace_ms: u64,
}

impl TestCluster {
    /// Writes a fresh PoWerStore cluster (free loopback ports) and starts every node honestly.
    pub fn start(f: usize, grace_ms: u64) -> TestCluster {
        Self::start_protocol("powerstore", f, grace_ms)
    }

    /// Writes a fresh cluster running `protocol` and starts every node honestly.
    pub fn start_protocol(protocol: &str, f: usize, grace_ms: u64) -> TestCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new(BULWARK)
            .args([
                "cluster",
                "init",
                "--base-port",
                "0",
                "--metrics-base-port",
                "0",
                "--protocol",
                protocol,
                "--f",
            ])
            .arg(f.to_string())
            .arg("--clients")
            .arg("admin:rw,writer2:rw,reader:r,mallory:r")
            .arg("--dir")
            .arg(dir.path())
            .status()
            .expect("run cluster init");
        assert!(status.success(), "cluster init failed");
        let n = if protocol == "abd" {
            2 * f + 1
        } else {
            3 * f + 1
        };
        let mut cluster = TestCluster {
            dir,
            n,
            children: (0..n).map(|_| None).collect(),
            grace_ms,
        };
        for id in 0..n {
            cluster.spawn(id, None);
        }
        cluster
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self, id: usize) -> PathBuf {
        self.path().join(format!("node-{id}/node.log"))
    }

    /// Starts node `id`, honest or with a Byzantine behaviour; kills any previous process first.
    pub fn spawn(&mut self, id: usize, behaviour: Option<&str>) {
        self.kill(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(id))
            .expect("log");
        let mut command = match behaviour {
            Some(behaviour) => {
                let mut c = Command::new(BYZANTINE);
                c.args(["--behaviour", behaviour]);
                c
            }
            None => Command::new(BULWARK),
        };
        let child = command
            .arg("node")
            .arg("--cluster")
            .arg(self.path())
            .arg("--id")
            .arg(id.to_string())
            .arg("--grace-ms")
            .arg(self.grace_ms.to_string())
            .env("BULWARK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn node");
        self.children[id] = Some(child);
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
        }
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
}
