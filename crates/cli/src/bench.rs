//! `bulwark bench`: `compare` runs the side-by-side comparison of the `bulwark-bench` crate (YCSB
//! A-F and object sizes, Bulwark against etcd, report with plots); `sizes` measures put and get
//! on a fresh local 4-node cluster beside the transport's own round trip; `memory` watches node
//! memory under endless overwrites (garbage collection must keep it flat); `cs` measures the
//! configuration service (`bench_cs.rs`).
//!
//! `sizes` and `memory` use closed-loop clients: each issues its next operation when the previous
//! one returns, so there is no coordinated omission to correct for.

use crate::cluster_init::{self, InitArgs};
use crate::dev::{Nodes, wait_until_up};
use crate::objects::human_bytes;
use anyhow::{Context, Result};
use bulwark_bench::compare::CompareOptions;
use bulwark_client::Client;
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "bench_a2m.rs"]
mod a2m;
#[path = "bench_cli.rs"]
mod cli;
#[path = "bench_cs.rs"]
pub mod cs;
#[path = "bench_depot.rs"]
mod depot;
#[path = "bench_reconfig.rs"]
mod reconfig;
#[path = "bench_table.rs"]
pub mod table;

/// `bulwark bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Bulwark against etcd (and other Bulwark protocols): YCSB A-F and object sizes, side by
    /// side, written as JSON, Markdown and PNG plots.
    Compare(CompareArgs),
    /// Put and get latency and throughput per object size, beside the TLS round trip.
    Sizes(SizesArgs),
    /// Node memory under endless overwrites of the same keys.
    Memory(MemoryArgs),
    /// The configuration service (PBFT, f_cs = 1): no-op and ADD requests per second and their
    /// latency on 4 nodes, and the time to certify and disseminate a configuration to 16.
    Cs(cs::CsArgs),
    /// Placement and dissemination at scale, computed: per-node load of the ring beside virtual
    /// positions (a model), what a join moves, and the three-level multicast of configurations
    /// beside today's push.
    Placement(PlacementArgs),
    /// Throughput and latency over time on public-key objects while a node joins and a member
    /// is revoked: the dip each state transfer causes and how soon the rate is back.
    Reconfig(reconfig::ReconfigArgs),
    /// Whole-process latency of `put`, `get` and `status` against a local cluster, beside the
    /// process start-up alone: what a user waits for at the command line.
    Cli(cli::CliArgs),
    /// The cost of one trusted-log (A2M) call: in memory, durable in the node's process, and in
    /// its own process behind the local socket, fused and unfused; and of verifying one.
    A2m(a2m::A2mArgs),
    /// A causal volume's PUT and GET beside Depot's baseline family built from the same code
    /// (Plain, +Hash, +Hash+Sig): CPU per operation on each side and bytes per message.
    Depot(depot::DepotArgs),
    /// YCSB workloads on hardened tables, every variant beside Plain (majority quorums, no
    /// signatures, the same code): CPU per operation for every party together, and bytes.
    Table(table::TableArgs),
}

/// `bulwark bench compare`.
#[derive(clap::Args)]
pub struct CompareArgs {
    /// Minutes instead of most of an hour: 3 client counts, 3 s per run, 1000 records.
    #[arg(long)]
    pub quick: bool,
    /// Systems to compare: powerstore, powerstore-2r (reads always in two rounds, as the
    /// paper's), powerstore-sw (a volume with one writer, whose writes take two rounds), etcd, any protocol `bulwark cluster init --protocol` accepts, or a hardened
    /// table of one variant: table-plain, table-nosign, table-proxy-verifies,
    /// table-proxy-no-verify, table-half-sym, table-full-sym, or table-eventual (Proxy-Verifies
    /// on 2f+1 of the nodes, quorums of f+1). A table system may end in a fault
    /// run (needs bulwark-byzantine beside bulwark): +bad-signer (one node signs nothing
    /// validly), +stall-<ms> (clients leave a proxy after <ms>; one node holds its answers as
    /// proxy 90% of that), +timeout-<ms> (the same timeout, no fault).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "powerstore,abd,phalanx,etcd"
    )]
    pub systems: Vec<String>,
    /// YCSB workloads to run (A-F; none: `--workloads ''`).
    #[arg(long, value_delimiter = ',', default_value = "A,B,C,D,E,F")]
    pub workloads: Vec<String>,
    /// Client counts for the YCSB runs (default 1,8,32 with --quick, else 1,4,16,64).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Object sizes for the put/get sweep (suffixes k and m are binary; none: `--sizes ''`).
    #[arg(long, value_delimiter = ',', default_value = "1k,64k,1m,16m")]
    pub sizes: Vec<String>,
    /// Clients in the object-size sweep.
    #[arg(long, default_value_t = 8)]
    pub size_concurrency: usize,
    /// Seconds per run (default 3 with --quick, else 20).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// YCSB records loaded before the runs (default 1000 with --quick, else 10000).
    #[arg(long)]
    pub records: Option<i64>,
    /// Total YCSB operations per second to aim for; latencies are then corrected for
    /// coordinated omission.
    #[arg(long)]
    pub target_rate: Option<f64>,
    /// Where the report goes.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Run every server and the client on a host of its own (a network namespace), each joined
    /// to one switch by a link shaped to this rate both ways with tc's tbf: 1gbit is the
    /// paper's testbed. Needs root and iproute2; removes everything when the run ends.
    #[arg(long, value_name = "RATE")]
    pub links: Option<bulwark_bench::links::Rate>,
}

/// `bulwark bench memory`.
#[derive(clap::Args)]
pub struct MemoryArgs {
    /// Overwrites.
    #[arg(long, default_value_t = 100_000)]
    pub overwrites: usize,
    /// Keys the overwrites cycle through (as many as --overwrites: every put a new key).
    #[arg(long, default_value_t = 100)]
    pub keys: usize,
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// The nodes' bound on registers whose metadata stays in memory (`bulwark node
    /// --cached-keys`); a bound above --keys keeps every key's, as nodes did before the bound.
    #[arg(long)]
    pub cached_keys: Option<usize>,
    /// What the memory test writes.
    #[command(flatten)]
    pub writes: MemoryWrites,
    /// Where to put the cluster (default: a fresh directory under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// What the memory test writes, and the nodes' bound on causal values in memory.
#[derive(clap::Args, Clone)]
pub struct MemoryWrites {
    /// Write public-key objects (one owner key per object) instead of M-PoWerStore registers.
    #[arg(long)]
    pub public_key: bool,
    /// Write to a causal volume instead of M-PoWerStore registers.
    #[arg(long, conflicts_with = "public_key")]
    pub causal: bool,
    /// The nodes' bound on the bytes of values each causal volume keeps in memory (`bulwark
    /// node --causal-cache-bytes`; default: the node's).
    #[arg(long)]
    pub causal_cache_bytes: Option<u64>,
    /// The size of every value written (suffixes k and m are binary).
    #[arg(long, default_value = "1k")]
    pub value_size: String,
}

/// `bulwark bench sizes`.
#[derive(clap::Args)]
pub struct SizesArgs {
    /// Object sizes, in bytes (suffixes k and m are binary).
    #[arg(long, value_delimiter = ',', default_value = "1k,64k,1m")]
    pub sizes: Vec<String>,
    /// Operations per size and kind.
    #[arg(long, default_value_t = 2000)]
    pub ops: usize,
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Overwrites for the memory test afterwards (0 skips it).
    #[arg(long, default_value_t = 0)]
    pub overwrites: usize,
    /// Keys the overwrites cycle through.
    #[arg(long, default_value_t = 100)]
    pub keys: usize,
    /// The nodes' bound on registers whose metadata stays in memory (`bulwark node
    /// --cached-keys`; default: the node's).
    #[arg(long)]
    pub cached_keys: Option<usize>,
    /// What the memory test writes.
    #[command(flatten)]
    pub writes: MemoryWrites,
    /// Where to put the cluster (default: a fresh directory under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub(crate) fn parse_size(text: &str) -> Result<usize> {
    let lower = text.trim().to_ascii_lowercase();
    let (digits, scale) = match lower
        .strip_suffix('m')
        .or_else(|| lower.strip_suffix("mib"))
    {
        Some(d) => (d, 1024 * 1024),
        None => match lower
            .strip_suffix('k')
            .or_else(|| lower.strip_suffix("kib"))
        {
            Some(d) => (d, 1024),
            None => (lower.as_str(), 1),
        },
    };
    Ok(digits
        .parse::<usize>()
        .with_context(|| format!("size {text:?}"))?
        * scale)
}

/// Latencies of one phase.
struct Phase {
    latencies: Vec<Duration>,
    elapsed: Duration,
    failures: usize,
}

impl Phase {
    fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[index]
    }
    fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn row(&self, name: &str, size: usize) -> String {
        let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
        format!(
            "| {name} | {} | {:.0} | {}/s | {} | {} | {} | {} | {} |",
            human_bytes(size as u64),
            self.throughput(),
            human_bytes((self.throughput() * size as f64) as u64),
            ms(self.percentile(0.5)),
            ms(self.percentile(0.9)),
            ms(self.percentile(0.99)),
            ms(*self.latencies.last().unwrap_or(&Duration::ZERO)),
            self.failures
        )
    }
}

/// Runs `total` operations over `concurrency` closed loops; `op(i)` performs operation `i`.
async fn closed_loop<F, Fut>(total: usize, concurrency: usize, op: F) -> Phase
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let begun = Instant::now();
                if op(i).await {
                    latencies.push(begun.elapsed());
                } else {
                    failures += 1;
                }
            }
            (latencies, failures)
        }));
    }
    let mut latencies = Vec::new();
    let mut failures = 0;
    for task in tasks {
        if let Ok((mut l, f)) = task.await {
            latencies.append(&mut l);
            failures += f;
        }
    }
    latencies.sort();
    Phase {
        latencies,
        elapsed: started.elapsed(),
        failures,
    }
}

fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `bulwark bench placement`.
#[derive(clap::Args)]
pub struct PlacementArgs {
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub nodes: Vec<usize>,
    /// Positions per node (1 is the ring as built; more are a model).
    #[arg(long = "virtual", value_delimiter = ',', default_value = "1,4,16,64")]
    pub virtual_positions: Vec<u32>,
    /// Faults per group (groups of 3f+1).
    #[arg(long, default_value_t = 1)]
    pub f: usize,
    /// Fraction of nodes down while a configuration is disseminated.
    #[arg(long, default_value_t = 0.01)]
    pub failed: f64,
}

/// Joins averaged per cluster size and position count.
const JOINS: u32 = 8;

fn run_placement(args: &PlacementArgs) {
    use bulwark_bench::placement;
    use bulwark_core::NodeId;
    let copies = 3 * args.f + 1;
    println!(
        "## Load per node (groups of {copies}), exact shares of the key space
"
    );
    println!(
        "| nodes | positions per node | min / ideal | median / ideal | max / ideal | nodes within 10% | ring entries | lookup (ns) | join: arcs changed | join: source groups | join: moved (x ideal share) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in &args.nodes {
        let nodes: Vec<NodeId> = (0..n as u32).map(NodeId).collect();
        for &v in &args.virtual_positions {
            let b = placement::balance(&nodes, v, copies);
            // A join's cost depends on where the newcomer lands: the mean of several.
            let joins: Vec<placement::Join> = (0..JOINS)
                .map(|i| placement::join(&nodes, NodeId(u32::MAX - 1 - i), v, copies))
                .collect();
            let mean = |f: &dyn Fn(&placement::Join) -> f64| {
                joins.iter().map(f).sum::<f64>() / joins.len() as f64
            };
            let ideal_move = copies as f64 / (n + 1) as f64;
            println!(
                "| {n} | {v}{} | {:.2} | {:.2} | {:.2} | {:.1}% | {} | {:.0} | {:.1} | {:.1} | {:.2} |",
                if v == 1 { " (built)" } else { "" },
                b.min,
                b.median,
                b.max,
                b.within_10 * 100.0,
                b.positions,
                b.lookup_ns,
                mean(&|j| j.arcs_changed as f64),
                mean(&|j| j.source_groups as f64),
                mean(&|j| j.moved) / ideal_move,
            );
        }
    }
    println!(
        "
## Configuration dissemination per epoch (f_cs = 1, one join and one leave, {:.0}% of nodes down)
",
        args.failed * 100.0
    );
    println!(
        "| nodes | scheme | rounds | busiest node: messages | busiest node: bytes sent | median node: bytes received | nodes up reached without a pull |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &args.nodes {
        let (push, tree) = placement::dissemination(n, 1, args.failed);
        for (name, d) in [
            ("push of the certificate (before 2026-12-05)", push),
            ("three-level multicast of the delta (§3.6)", tree),
        ] {
            println!(
                "| {n} | {name} | {} | {} | {} | {} | {:.2}% |",
                d.rounds,
                d.max_sends,
                d.max_bytes_sent,
                d.median_bytes_received,
                d.reached * 100.0
            );
        }
    }
}

pub async fn run(args: &BenchArgs) -> Result<()> {
    match &args.command {
        BenchCommand::Placement(placement) => {
            run_placement(placement);
            Ok(())
        }
        BenchCommand::Compare(compare) => run_compare(compare).await,
        BenchCommand::Sizes(sizes) => run_sizes(sizes).await,
        BenchCommand::Cs(args) => cs::run(args).await,
        BenchCommand::Reconfig(args) => reconfig::run(args).await,
        BenchCommand::Cli(args) => cli::run(args).await,
        BenchCommand::A2m(args) => a2m::run(args).await,
        BenchCommand::Depot(args) => depot::run(args),
        BenchCommand::Table(args) => table::run(args),
        BenchCommand::Memory(memory) => {
            run_sizes(&SizesArgs {
                sizes: Vec::new(),
                ops: 500,
                concurrency: memory.concurrency,
                overwrites: memory.overwrites,
                keys: memory.keys,
                cached_keys: memory.cached_keys,
                writes: memory.writes.clone(),
                dir: memory.dir.clone(),
            })
            .await
        }
    }
}

async fn run_compare(args: &CompareArgs) -> Result<()> {
    let mut options = CompareOptions::preset(args.quick);
    options.systems = args.systems.clone();
    options.workloads = args
        .workloads
        .iter()
        .filter(|w| !w.trim().is_empty())
        .map(|w| match w.trim().to_ascii_uppercase().as_str() {
            one if one.len() == 1 && ("A"..="F").contains(&one) => {
                Ok(one.chars().next().unwrap_or('A'))
            }
            other => anyhow::bail!("no YCSB workload {other:?}: choose among A-F"),
        })
        .collect::<Result<_>>()?;
    if !args.concurrency.is_empty() {
        options.concurrency = args.concurrency.clone();
    }
    options.sizes = args
        .sizes
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_size(s))
        .collect::<Result<_>>()?;
    options.size_concurrency = args.size_concurrency;
    if let Some(seconds) = args.seconds {
        options.run_time = Duration::from_secs_f64(seconds.clamp(0.1, 3600.0));
    }
    if let Some(records) = args.records {
        options.record_count = records.max(1);
    }
    options.target_rate = args.target_rate;
    options.links = args.links;
    options.program = std::env::current_exe()?;
    options.out = args.out.clone();
    options.command = std::iter::once("bulwark".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let run = bulwark_bench::compare::run(&options);
    // Ctrl-C or SIGTERM ends the comparison through the normal path, so every cluster is
    // stopped (and a shaped network removed).
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let path = tokio::select! {
        result = run => result?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; all clusters stopped"),
        _ = terminate.recv() => anyhow::bail!("terminated; all clusters stopped"),
    };
    println!("report: {}", path.display());
    Ok(())
}

async fn run_sizes(args: &SizesArgs) -> Result<()> {
    let sizes: Vec<usize> = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<_>>()?;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("bulwark-bench-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&dir);
    cluster_init::run(&InitArgs {
        no_metrics: true,
        clients: vec!["admin:rw".into()],
        force: true,
        no_configuration_service: true,
        ..InitArgs::local(dir.clone())
    })?;
    let mut nodes = Nodes::new(dir.clone(), 4);
    let exe = std::env::current_exe()?;
    let mut cached: Vec<String> = args
        .cached_keys
        .map(|n| vec!["--cached-keys".to_string(), n.to_string()])
        .unwrap_or_default();
    if let Some(bytes) = args.writes.causal_cache_bytes {
        cached.extend(["--causal-cache-bytes".to_string(), bytes.to_string()]);
    }
    let cached: Vec<&str> = cached.iter().map(String::as_str).collect();
    for id in 0..4 {
        nodes.spawn_with(id, &exe, &[], &cached)?;
    }
    let client = Arc::new(Client::connect(&dir, "admin").await?);
    wait_until_up(&client, &dir, vec![0, 1, 2, 3]).await?;
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "# bulwark bench: 4 local node processes (f = 1), {} closed-loop clients, {cpus} CPUs",
        args.concurrency
    );
    if !sizes.is_empty() {
        sizes_table(&client, args, &sizes).await;
    }
    if args.overwrites > 0 {
        memory_table(&client, &nodes, args, &sizes).await?;
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn sizes_table(client: &Arc<Client>, args: &SizesArgs, sizes: &[usize]) {
    println!();
    println!(
        "| operation | size | ops/s | throughput | p50 ms | p90 ms | p99 ms | max ms | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    // The floor: one round trip over the same authenticated channel, no protocol and no disk.
    let floor = {
        let client = client.clone();
        closed_loop(args.ops, args.concurrency, move |_| {
            let client = client.clone();
            async move { client.status_of(bulwark_core::NodeId(0)).await.is_ok() }
        })
        .await
    };
    println!("{}", floor.row("round trip (baseline)", 0));
    for &size in sizes {
        let value = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let put = {
            let (client, value) = (client.clone(), value.clone());
            closed_loop(args.ops, args.concurrency, move |i| {
                let (client, value) = (client.clone(), value.clone());
                async move {
                    client
                        .put(format!("bench/{size}/{}", i % 100).as_bytes(), value)
                        .await
                        .is_ok()
                }
            })
            .await
        };
        let get = {
            let client = client.clone();
            closed_loop(args.ops, args.concurrency, move |i| {
                let client = client.clone();
                async move {
                    matches!(
                        client
                            .get(format!("bench/{size}/{}", i % 100).as_bytes())
                            .await,
                        Ok((Some(_), _))
                    )
                }
            })
            .await
        };
        let (content_put, content_get) = content_phases(client, args, &value).await;
        let (owned_put, owned_get) = owned_phases(client, args, &value).await;
        println!("{}", put.row("put", size));
        println!("{}", get.row("get", size));
        println!("{}", content_put.row("content put", size));
        println!("{}", content_get.row("content get", size));
        println!("{}", owned_put.row("public-key put", size));
        println!("{}", owned_get.row("public-key get", size));
        let ratio = |phase: &Phase, base: &Phase| {
            phase.percentile(0.5).as_secs_f64() / base.percentile(0.5).as_secs_f64().max(1e-9)
        };
        eprintln!(
            "  {}: put p50 = {:.1}x the round trip, get p50 = {:.1}x; content put p50 = {:.2}x \
             the register put's, content get p50 = {:.2}x the register get's",
            human_bytes(size as u64),
            ratio(&put, &floor),
            ratio(&get, &floor),
            ratio(&content_put, &put),
            ratio(&content_get, &get)
        );
        eprintln!(
            "  {}: public-key put p50 = {:.2}x the register put's, get p50 = {:.2}x the register get's",
            human_bytes(size as u64),
            ratio(&owned_put, &put),
            ratio(&owned_get, &get)
        );
    }
}

/// Public-key objects of `value`'s size beside the register rows: 100 owners, as the register
/// rows use 100 keys.
async fn owned_phases(client: &Arc<Client>, args: &SizesArgs, value: &Bytes) -> (Phase, Phase) {
    let owners: Arc<Vec<bulwark_core::sign::SecretKey>> = Arc::new(
        (0..100u8)
            .map(|i| bulwark_core::sign::SecretKey::from_seed(&[i; 32]))
            .collect(),
    );
    let put = {
        let (client, value, owners) = (client.clone(), value.clone(), owners.clone());
        closed_loop(args.ops, args.concurrency, move |i| {
            let (client, value, owners) = (client.clone(), value.clone(), owners.clone());
            async move {
                client
                    .put_owned(&owners[i % owners.len()], Some(value))
                    .await
                    .is_ok()
            }
        })
        .await
    };
    let get = {
        let client = client.clone();
        closed_loop(args.ops, args.concurrency, move |i| {
            let (client, owners) = (client.clone(), owners.clone());
            async move {
                let owner = owners[i % owners.len()].public_key();
                matches!(client.get_owned(&owner).await, Ok((Some(_), _)))
            }
        })
        .await
    };
    (put, get)
}

/// Content-hash objects of `value`'s size beside the register rows: every put stores a distinct
/// object (its first bytes are the operation's number), every get reads one of them back.
async fn content_phases(client: &Arc<Client>, args: &SizesArgs, value: &Bytes) -> (Phase, Phase) {
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let put = {
        let (client, value, ids) = (client.clone(), value.clone(), ids.clone());
        closed_loop(args.ops, args.concurrency, move |i| {
            let (client, ids) = (client.clone(), ids.clone());
            let mut object = value.to_vec();
            let mark = (i as u64).to_be_bytes();
            let marked = object.len().min(mark.len());
            object[..marked].copy_from_slice(&mark[..marked]);
            async move {
                match client.put_content(&object).await {
                    Ok((id, _)) => {
                        if let Ok(mut ids) = ids.lock() {
                            ids.push(id);
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
        })
        .await
    };
    let ids: Arc<Vec<_>> = Arc::new(ids.lock().map(|ids| ids.clone()).unwrap_or_default());
    let get = {
        let client = client.clone();
        closed_loop(args.ops, args.concurrency, move |i| {
            let (client, ids) = (client.clone(), ids.clone());
            async move {
                let Some(id) = ids.get(i % ids.len().max(1)) else {
                    return false;
                };
                matches!(client.get_content(id).await, Ok((Some(_), _)))
            }
        })
        .await
    };
    (put, get)
}

async fn memory_table(
    client: &Arc<Client>,
    nodes: &Nodes,
    args: &SizesArgs,
    sizes: &[usize],
) -> Result<()> {
    {
        println!();
        let kind = if args.writes.public_key {
            "public-key objects"
        } else if args.writes.causal {
            "keys of a causal volume"
        } else {
            "registers"
        };
        let value_size = parse_size(&args.writes.value_size)?;
        println!(
            "## Node memory under {} overwrites of {} {kind} ({} values)",
            args.overwrites,
            args.keys,
            human_bytes(value_size as u64)
        );
        println!();
        println!("| overwrites done | node 0 RSS | node 1 RSS | node 2 RSS | node 3 RSS |");
        println!("|---|---|---|---|---|");
        let volume = if args.writes.causal {
            Some(Arc::new(
                client.create_causal_volume("memory", &[]).await?.0,
            ))
        } else {
            None
        };
        let value = Bytes::from(vec![7u8; value_size]);
        let steps = 4;
        let per_step = args.overwrites / steps;
        let keys = args.keys.max(1);
        for step in 0..=steps {
            if step > 0 {
                let (client, value) = (client.clone(), value.clone());
                let base = (step - 1) * per_step;
                let public_key = args.writes.public_key;
                let volume = volume.clone();
                let phase = closed_loop(per_step, args.concurrency, move |i| {
                    let (client, value, volume) = (client.clone(), value.clone(), volume.clone());
                    let name = format!("churn/{}", (base + i) % keys);
                    async move {
                        if let Some(volume) = volume {
                            // Values of equal bytes are one value in a causal volume: each write's
                            // own, so that every one is stored.
                            let mut value = value.to_vec();
                            let at = value.len().min(8);
                            value[..at].copy_from_slice(&((base + i) as u64).to_le_bytes()[..at]);
                            let value = Bytes::from(value);
                            client.put_in(&volume, name.as_bytes(), value).await.is_ok()
                        } else if public_key {
                            // One owner per key: the object's id is its owner's key's hash.
                            let seed = blake3::hash(name.as_bytes());
                            let owner = bulwark_core::sign::SecretKey::from_seed(seed.as_bytes());
                            client.put_owned(&owner, Some(value)).await.is_ok()
                        } else {
                            client.put(name.as_bytes(), value).await.is_ok()
                        }
                    }
                })
                .await;
                if phase.failures > 0 {
                    eprintln!("  {} overwrites failed", phase.failures);
                }
            }
            let rss: Vec<String> = (0..4)
                .map(|id| {
                    nodes
                        .pid(id)
                        .and_then(resident_kib)
                        .map_or("?".into(), |k| human_bytes(k * 1024))
                })
                .collect();
            println!("| {} | {} |", step * per_step, rss.join(" | "));
        }
        let statuses = client.status().await;
        let held = |pick: fn(&bulwark_protocol::machine::ReplicaStats) -> u64| -> String {
            statuses
                .iter()
                .map(|(_, _, s)| {
                    s.as_ref()
                        .map_or("?".into(), |s| pick(&s.server).to_string())
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!();
        println!(
            "Versions held per node after the churn: {}; keys held: {} (written: {}).",
            held(|s| s.versions),
            held(|s| s.keys),
            args.keys.min(args.overwrites) + sizes.len() * 100
        );
        if args.writes.causal {
            let causal: Vec<String> = statuses
                .iter()
                .map(|(_, _, s)| {
                    s.as_ref()
                        .ok()
                        .and_then(|s| s.causal.first())
                        .map_or("?".into(), |volume| {
                            format!(
                                "{} updates, {} values of {}",
                                volume.updates,
                                volume.values,
                                human_bytes(volume.value_bytes)
                            )
                        })
                })
                .collect();
            println!("The causal volume per node: {}.", causal.join("; "));
        }
    }
    Ok(())
}
