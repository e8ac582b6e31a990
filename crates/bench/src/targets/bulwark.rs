//! A local Bulwark cluster: `bulwark cluster init` and `bulwark node` processes started from the
//! running binary, driven through the client library.

use crate::driver::Target;
use crate::links::Hosts;
use crate::metrics;
use anyhow::{Context, Result, bail};
use bulwark_client::{Client, Volume};
use bulwark_core::config::{ClusterConfig, Protocol};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start the cluster.
#[derive(Clone, Debug)]
pub struct BulwarkOptions {
    /// The `bulwark` binary (normally the running one).
    pub program: PathBuf,
    /// Where the cluster lives; removed when the target is dropped.
    pub dir: PathBuf,
    /// Byzantine faults tolerated (n = 3f + 1 nodes).
    pub f: usize,
    /// Passed to `bulwark cluster init --protocol` when set (and shown in reports); `None`
    /// leaves init at its default protocol, M-PoWerStore.
    pub protocol: Option<String>,
    /// M-PoWerStore reads always take FILTER, as the paper's do (`Client::one_round_reads`).
    pub two_round_reads: bool,
    /// Objects live in a PoWerStore volume the benchmark's client alone writes, so its writes
    /// skip CLOCK (`bulwark volume create --writer`).
    pub sole_writer: bool,
    /// More arguments for every `bulwark node`.
    pub node_args: Vec<String>,
    /// Nodes, by id, started as `bulwark-byzantine` (found beside `program`) with these
    /// arguments before `node`: the faulty nodes of a fault run.
    pub byzantine: Vec<(u32, Vec<String>)>,
    /// The client's `retransmit_after`, when not its default.
    pub retransmit_after: Option<Duration>,
    /// Where node `i` runs.
    pub hosts: Hosts,
}

/// The lying node binary, beside `program`; built with it (`cargo build -p bulwark`), never
/// installed with it.
fn byzantine_program(program: &Path) -> Result<PathBuf> {
    let found = program.with_file_name("bulwark-byzantine");
    if !found.is_file() {
        bail!(
            "a fault run needs {} (built beside bulwark by `cargo build --release -p bulwark`)",
            found.display()
        );
    }
    Ok(found)
}

/// The comparison's name for M-PoWerStore whose reads always run FILTER.
pub const POWERSTORE_TWO_ROUND_READS: &str = "powerstore-2r";

/// The comparison's name for M-PoWerStore on a volume with one writer (two-round writes).
pub const POWERSTORE_SOLE_WRITER: &str = "powerstore-sw";

/// Node processes, killed when dropped, however the benchmark ends.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub struct BulwarkTarget {
    name: String,
    client: Client,
    /// The volume objects go to.
    volume: Volume,
    metrics: Vec<SocketAddr>,
    nodes: Nodes,
    dir: PathBuf,
}

impl BulwarkTarget {
    /// The client the benchmark drives the cluster with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Writes a fresh cluster, starts its nodes and waits until all of them answer.
    pub async fn start(options: &BulwarkOptions) -> Result<BulwarkTarget> {
        let _ = std::fs::remove_dir_all(&options.dir);
        let mut init = Command::new(&options.program);
        init.args(["cluster", "init", "--dir"])
            .arg(&options.dir)
            .args(["--f", &options.f.to_string()])
            .args(["--clients", "admin:rw", "--force"]);
        match &options.hosts {
            Hosts::Loopback => {
                init.args([
                    "--host",
                    "127.0.0.1",
                    "--base-port",
                    "0",
                    "--metrics-base-port",
                    "0",
                ]);
            }
            Hosts::Shaped(network) => {
                // One group, each node on a host of its own; metrics beside it on that host.
                let n = 3 * options.f + 1;
                let count = u16::try_from(n).context("too many nodes")?;
                let port = network.ports(count)?;
                let addresses: Vec<String> = (0..n)
                    .map(|i| SocketAddr::new(network.server_ip(i), port + i as u16).to_string())
                    .collect();
                init.args(["--addresses", &addresses.join(",")])
                    .args(["--metrics-base-port", &network.ports(count)?.to_string()]);
            }
        }
        if let Some(protocol) = &options.protocol {
            init.args(["--protocol", protocol]);
        }
        let output = init
            .output()
            .with_context(|| format!("running {} cluster init", options.program.display()))?;
        if !output.status.success() {
            bail!(
                "bulwark cluster init failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let config_path = options.dir.join("cluster.toml");
        let config = ClusterConfig::parse(
            &std::fs::read_to_string(&config_path)?,
            &config_path.display().to_string(),
        )?;
        // An ABD register lives on the first 2f+1 members of its group: the nodes that hold none
        // are not started, so the comparison counts only the servers each protocol needs.
        let serving: std::collections::BTreeSet<u32> = match config.protocol {
            Protocol::Abd => config
                .placement()?
                .groups()
                .iter()
                .flat_map(|group| group.members()[..Protocol::Abd.nodes(config.f)].to_vec())
                .map(|node| node.0)
                .collect(),
            _ => config.nodes.iter().map(|node| node.id).collect(),
        };
        let mut nodes = Nodes(Vec::new());
        for node in config
            .nodes
            .iter()
            .filter(|node| serving.contains(&node.id))
        {
            let log = std::fs::File::create(options.dir.join(format!("node-{}.log", node.id)))?;
            let lies = options.byzantine.iter().find(|(id, _)| *id == node.id);
            let host = node.id as usize;
            let mut command = match lies {
                Some((_, args)) => {
                    let mut command = options
                        .hosts
                        .command(host, &byzantine_program(&options.program)?);
                    command.args(args);
                    command
                }
                None => options.hosts.command(host, &options.program),
            };
            nodes.0.push(
                command
                    .args(["node", "--cluster"])
                    .arg(&options.dir)
                    .args(["--id", &node.id.to_string()])
                    .args(&options.node_args)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .context("starting a node")?,
            );
        }
        let mut client = Client::connect(&options.dir, "admin").await?;
        client.one_round_reads = !options.two_round_reads;
        if let Some(wait) = options.retransmit_after {
            client.retransmit_after = wait;
        }
        wait_until_up(&client, &options.dir, &serving).await?;
        let volume = if options.sole_writer {
            client
                .create_sole_writer_volume("bench", client.id())
                .await?
                .0
        } else {
            client.default_volume()
        };
        Ok(BulwarkTarget {
            name: match (&options.protocol, options.two_round_reads) {
                (Some(protocol), _) => protocol.clone(),
                (None, _) if options.sole_writer => POWERSTORE_SOLE_WRITER.into(),
                (None, false) => "powerstore".into(),
                (None, true) => POWERSTORE_TWO_ROUND_READS.into(),
            },
            client,
            volume,
            metrics: config
                .nodes
                .iter()
                .filter(|node| serving.contains(&node.id))
                .filter_map(|n| n.metrics)
                .collect(),
            nodes,
            dir: options.dir.clone(),
        })
    }
}

async fn wait_until_up(
    client: &Client,
    dir: &Path,
    serving: &std::collections::BTreeSet<u32>,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let statuses = client.status().await;
        if statuses
            .iter()
            .all(|(id, _, s)| s.is_ok() || !serving.contains(&id.0))
        {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "Bulwark nodes did not come up within {READY_TIMEOUT:?}; see {}/node-*.log",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for BulwarkTarget {
    fn drop(&mut self) {
        // Nodes first (their own Drop), then their files.
        std::mem::take(&mut self.nodes.0)
            .into_iter()
            .for_each(|mut c| {
                let _ = c.kill();
                let _ = c.wait();
            });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Target for BulwarkTarget {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn read(&self, key: String) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let (value, _) = self.client.get_in(&self.volume, key.as_bytes()).await?;
            Ok(value.is_some())
        })
    }
    fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.client
                .put_in(&self.volume, key.as_bytes(), value)
                .await?;
            Ok(())
        })
    }
    fn pids(&self) -> Vec<u32> {
        self.nodes.0.iter().map(Child::id).collect()
    }
    /// What the nodes received (`bulwark_node_request_bytes_total`: frames after TLS), which is
    /// what this client sent them; the client library keeps no byte counter of its own.
    fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async move {
            let mut total = 0.0;
            for &address in &self.metrics {
                total += metrics::scrape_sum(address, "bulwark_node_request_bytes_total")
                    .await
                    .ok()?;
            }
            Some(total as u64)
        })
    }
}
