//! `bulwark bench cs`: the configuration service (Rosebud §3, PBFT among the `3f_cs+1` CS
//! replicas) on local clusters of node processes, the baseline an A2M-ordered CS is compared with.
//!
//! 1. A 4-node cluster (f = 1, f_cs = 1: every node is a CS replica) with an epoch of an hour, so
//!    no STOP interferes: closed-loop no-op requests at several caller counts, through one shared
//!    `Client` and through a `Client` each, submitted to a configuration fetched once
//!    (`Client::submit_to`), beside the fetch itself, `configure` (fetch + submit) and the TLS
//!    round trip of a status request.
//! 2. On the same cluster, authority-signed ADD orders of distinct never-run identities,
//!    sequential and concurrent; each ADD executes an admissibility check over every pending
//!    ADD, so the number pending before and after each run is printed.
//! 3. A 16-node cluster with epochs of a few seconds: for each epoch, the time from the moment it
//!    may end to the moment the first node, then the last, holds the next configuration's
//!    certificate. Half the epochs are ended by a client's STOP sent as soon as the CS accepts
//!    one (`t_epoch - delta` after the epoch began); the others by the CS replicas themselves,
//!    which submit STOP on the first shard tick after `t_epoch`. Each node is polled
//!    (`certificates_from`) every `--poll-ms`; each node's log line "configuration certified"
//!    gives the same instants to the microsecond, as a check.
//!
//! Every run is bounded by a count and a time; every node process is killed when its cluster is
//! dropped (`dev::Nodes`), on success, error or Ctrl-C.

use crate::cluster_init::{self, InitArgs};
use crate::dev::{Nodes, wait_until_up};
use anyhow::{Context, Result, bail};
use bulwark_client::{Client, ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::configuration::{Configuration, CsProtocol, GENESIS_EPOCH, NewMember};
use bulwark_core::sign::SecretKey;
use bulwark_protocol::cs::Op;
use bulwark_protocol::service::CsStatus;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `bulwark bench cs`.
#[derive(clap::Args)]
pub struct CsArgs {
    /// Seconds per throughput run, at most.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Operations per throughput run, at most.
    #[arg(long, default_value_t = 3000)]
    pub ops: usize,
    /// Concurrent closed-loop callers of the no-op runs.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// ADD orders in each sequential run, at most.
    #[arg(long, default_value_t = 200)]
    pub adds: usize,
    /// ADD orders in the concurrent run, at most.
    #[arg(long, default_value_t = 1000)]
    pub concurrent_adds: usize,
    /// Callers of the concurrent ADD run.
    #[arg(long, default_value_t = 16)]
    pub add_concurrency: usize,
    /// Also run no-ops from 4 sessions of one client name (each its own `Client`).
    #[arg(long)]
    pub same_name_sessions: bool,
    /// Nodes of the dissemination cluster.
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// Epoch changes measured on it (alternately ended by a client and by the CS itself).
    #[arg(long, default_value_t = 12)]
    pub epochs: usize,
    /// Its epoch length, in milliseconds.
    #[arg(long, default_value_t = 3_000)]
    pub epoch_ms: u64,
    /// Its STOP tolerance (the CS accepts a STOP from `epoch_ms` less this), in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub stop_tolerance_ms: u64,
    /// How often each node is asked whether it holds the next certificate, in milliseconds.
    #[arg(long, default_value_t = 2)]
    pub poll_ms: u64,
    /// Which parts to run: noop, add, propagate, latency (the trusted log's latency swept for
    /// the cores on trusted logs among --cs-protocols, spec §7.2 T12; not in the default set).
    #[arg(long, value_delimiter = ',', default_value = "noop,add,propagate")]
    pub parts: Vec<String>,
    /// The latency part's delays added to every trusted-log call, in microseconds.
    #[arg(long, value_delimiter = ',', default_value = "0,1,10,50,250,1000")]
    pub a2m_latency_us: Vec<u64>,
    /// The latency part's ways of charging fused calls: fused (one delay) and unfused (two, as
    /// the separate append and lookup they replace).
    #[arg(long, value_delimiter = ',', default_value = "fused,unfused")]
    pub a2m_calls: Vec<String>,
    /// Where to put the clusters, kept afterwards with the nodes' logs (default: fresh
    /// directories under the system temp dir, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The agreement cores the no-op and ADD runs compare, each on a fresh 4-node cluster, in
    /// this order: pbft (4 CS replicas), a2m-pbft-ea (3, each node with its trusted log in its
    /// own process), a2m-pbft-e (4, likewise).
    #[arg(long, value_delimiter = ',', default_value = "pbft")]
    pub cs_protocols: Vec<CsProtocol>,
}

/// How long to wait for a cluster's configuration service to answer its first request.
const CS_READY: Duration = Duration::from_secs(60);
/// How long a node may take to hold a new certificate before the epoch counts as failed.
const PROPAGATION_MAX: Duration = Duration::from_secs(20);

pub async fn run(args: &CsArgs) -> Result<()> {
    for part in &args.parts {
        if !["noop", "add", "propagate", "latency"].contains(&part.as_str()) {
            bail!("no part {part:?}: choose among noop, add, propagate, latency");
        }
    }
    for calls in &args.a2m_calls {
        if !["fused", "unfused"].contains(&calls.as_str()) {
            bail!("no --a2m-calls {calls:?}: fused or unfused");
        }
    }
    let base = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("bulwark-bench-cs-{}", std::process::id())),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("# bulwark bench cs: configuration service, f_cs = 1, {cpus} CPUs");
    let wants = |part: &str| args.parts.iter().any(|p| p == part);
    // Ctrl-C ends the benchmark through the normal path, so every node process is stopped.
    let work = async {
        if wants("noop") || wants("add") {
            for protocol in &args.cs_protocols {
                let dir = base.join(format!("four-{}", protocol.name()));
                throughput(args, &dir, *protocol, wants("noop"), wants("add")).await?;
            }
        }
        if wants("propagate") {
            propagation(args, &base.join("sixteen")).await?;
        }
        if wants("latency") {
            latency_sweep(args, &base.join("latency")).await?;
        }
        Ok::<(), anyhow::Error>(())
    };
    let result = tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; all nodes stopped")),
    };
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

// ---------------------------------------------------------------------------------------------
// Clusters

/// A fresh local cluster of `n` node processes with a configuration service (f = f_cs = 1), and
/// the administrator's client, once every node answers and the CS orders a no-op.
pub(super) async fn start_cluster(
    dir: &Path,
    n: usize,
    clients: Vec<String>,
    epoch_ms: u64,
    stop_tolerance_ms: u64,
    protocol: CsProtocol,
) -> Result<(Nodes, Arc<Client>)> {
    start_cluster_with(dir, n, clients, epoch_ms, stop_tolerance_ms, protocol, &[]).await
}

/// [`start_cluster`], each trusted log served with `a2m_args` besides its own.
async fn start_cluster_with(
    dir: &Path,
    n: usize,
    clients: Vec<String>,
    epoch_ms: u64,
    stop_tolerance_ms: u64,
    protocol: CsProtocol,
    a2m_args: &[String],
) -> Result<(Nodes, Arc<Client>)> {
    let _ = std::fs::remove_dir_all(dir);
    let a2m = protocol.needs_trusted_logs();
    cluster_init::run(&InitArgs {
        nodes: Some(n),
        no_metrics: true,
        clients,
        force: true,
        epoch_ms,
        stop_tolerance_ms,
        a2m,
        cs_protocol: protocol,
        ..InitArgs::local(dir.to_path_buf())
    })?;
    let mut nodes = Nodes::new(dir.to_path_buf(), n);
    let exe = std::env::current_exe()?;
    for id in 0..n {
        if a2m {
            nodes.spawn_trusted_log_with(id, &exe, a2m_args)?;
        }
        nodes.spawn(id, &exe, &[])?;
    }
    let client = Arc::new(Client::connect(dir, "admin").await?);
    wait_until_up(&client, dir, (0..n).collect()).await?;
    let started = Instant::now();
    loop {
        match client.configure(|_| Ok(Op::Noop)).await {
            Ok((_, ConfigOutcome::Done)) => break,
            Ok((_, other)) => bail!("a no-op answered {other:?}"),
            Err(error) if started.elapsed() < CS_READY => {
                tracing::debug!(%error, "configuration service not ready yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => {
                return Err(error).context("the configuration service did not answer a no-op");
            }
        }
    }
    Ok((nodes, client))
}

/// What the CS replicas of `config` report: the view and primary most of them are in, and the
/// most batches any has executed.
async fn cs_state(client: &Client, config: &Configuration) -> (u64, u32, u64) {
    let mut views = BTreeMap::new();
    let mut executed = 0;
    for node in config.cs() {
        if let Ok(status) = client.status_of(node).await
            && let Some(CsStatus {
                view,
                primary,
                executed: done,
                ..
            }) = status.cs
        {
            *views.entry((view, primary)).or_insert(0) += 1;
            executed = executed.max(done);
        }
    }
    let (view, primary) = views
        .into_iter()
        .max_by_key(|(_, count)| *count)
        .map_or((u64::MAX, u32::MAX), |(key, _)| key);
    (view, primary, executed)
}

// ---------------------------------------------------------------------------------------------
// Closed-loop runs bounded by a count and a time

struct Run {
    latencies: Vec<Duration>,
    elapsed: Duration,
    failures: usize,
    first_error: Option<String>,
}

impl Run {
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

    fn mean(&self) -> Duration {
        let total: Duration = self.latencies.iter().sum();
        total / (self.latencies.len().max(1) as u32)
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// `callers` closed loops; `op(caller, i)` performs operation `i` (numbered across callers).
/// A caller starts no operation once `max_ops` have started or `limit` has passed.
async fn timed<F, Fut>(callers: usize, max_ops: usize, limit: Duration, op: F) -> Run
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..callers.max(1) {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0;
            let mut first_error = None;
            while started.elapsed() < limit {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max_ops {
                    break;
                }
                let begun = Instant::now();
                match op(caller, i).await {
                    Ok(()) => latencies.push(begun.elapsed()),
                    Err(error) => {
                        failures += 1;
                        first_error.get_or_insert(error);
                    }
                }
            }
            (latencies, failures, first_error)
        }));
    }
    let mut run = Run {
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
        failures: 0,
        first_error: None,
    };
    for task in tasks {
        if let Ok((mut latencies, failures, error)) = task.await {
            run.latencies.append(&mut latencies);
            run.failures += failures;
            if run.first_error.is_none() {
                run.first_error = error;
            }
        }
    }
    run.elapsed = started.elapsed();
    run.latencies.sort();
    run
}

/// Counters read before and after a run: batches the CS executed, CPU time of the node
/// processes and of this one (clock ticks of 10 ms, whole processes).
struct Mark {
    executed: u64,
    node_ticks: u64,
    own_ticks: u64,
}

/// CPU clock ticks a process has used (user + system, every thread), from `/proc`.
fn cpu_ticks(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(14) + field(15)
}

/// Linux's `USER_HZ`: clock ticks per second in `/proc/<pid>/stat`.
const TICKS_PER_SECOND: f64 = 100.0;

async fn mark(client: &Client, config: &Configuration, pids: &[u32]) -> Mark {
    let executed = cs_state(client, config).await.2;
    Mark {
        executed,
        node_ticks: pids.iter().map(|pid| cpu_ticks(&pid.to_string())).sum(),
        own_ticks: cpu_ticks("self"),
    }
}

/// One table row: the run's latencies, the PBFT batches the CS executed meanwhile (when `cs`),
/// and CPU per operation (all node processes; this process, the client).
fn row(name: &str, callers: usize, run: &Run, before: &Mark, after: &Mark, cs: bool) {
    let ops = run.latencies.len().max(1) as f64;
    let batches = after.executed.saturating_sub(before.executed);
    let per_batch = if !cs {
        "-".to_string()
    } else if batches > 0 {
        format!(
            "{batches} ({:.1})",
            run.latencies.len() as f64 / batches as f64
        )
    } else {
        batches.to_string()
    };
    let us_per_op = |ticks: u64| format!("{:.0}", ticks as f64 / TICKS_PER_SECOND * 1e6 / ops);
    println!(
        "| {name} | {callers} | {} | {:.0} | {} | {} | {} | {} | {per_batch} | {} | {} | {} |",
        run.latencies.len(),
        run.throughput(),
        ms(run.percentile(0.5)),
        ms(run.percentile(0.99)),
        ms(*run.latencies.last().unwrap_or(&Duration::ZERO)),
        ms(run.mean()),
        us_per_op(after.node_ticks.saturating_sub(before.node_ticks)),
        us_per_op(after.own_ticks.saturating_sub(before.own_ticks)),
        run.failures
    );
    if let Some(error) = &run.first_error {
        eprintln!("  {name} x{callers}: first failure: {error}");
    }
}

fn header() {
    println!(
        "| request | callers | ops | ops/s | p50 ms | p99 ms | max ms | mean ms | batches (ops per batch) | node CPU µs/op | client CPU µs/op | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
}

// ---------------------------------------------------------------------------------------------
// 1 and 2: no-ops and ADD orders on a 4-node cluster

/// Clients that each run their own session (and their own TLS links).
const OWN_CLIENTS: usize = 16;

async fn throughput(
    args: &CsArgs,
    dir: &Path,
    protocol: CsProtocol,
    noop: bool,
    add: bool,
) -> Result<()> {
    let mut names = vec!["admin:rw".to_string()];
    names.extend((0..OWN_CLIENTS).map(|i| format!("bench{i}:rw")));
    // An hour-long epoch: no STOP during the runs.
    let (nodes, admin) = start_cluster(dir, 4, names, 3_600_000, 5_000, protocol).await?;
    let pids: Vec<u32> = (0..4).filter_map(|id| nodes.pid(id)).collect();
    let config = Arc::new(admin.configuration().await?);
    let limit = Duration::from_secs_f64(args.seconds.clamp(0.1, 600.0));
    let (view, primary, _) = cs_state(&admin, &config).await;
    println!();
    println!(
        "## 4 nodes (f = 1), CS on {} of them with {} (f_cs = 1), epoch {} (1 h); CS view {view}, primary node {primary}",
        config.cs_size(),
        protocol.name(),
        config.epoch.0
    );
    println!();
    println!(
        "Each run: at most {} operations or {:.1} s, closed loop. \"submit_to\" submits to the \
         configuration fetched once before the runs; \"configure\" fetches it first on every call.",
        args.ops,
        limit.as_secs_f64()
    );
    println!();
    header();
    let mut own = Vec::new();
    if noop {
        for i in 0..OWN_CLIENTS {
            own.push(Arc::new(Client::connect(dir, &format!("bench{i}")).await?));
        }
        // Links up before anything is timed.
        for client in &own {
            let _ = client.submit_to(&config, Op::Noop).await;
        }
        noop_runs(args, &admin, &own, &config, limit, dir, &pids).await?;
    }
    if add {
        add_runs(args, &admin, &config, limit, &pids).await?;
    }
    let (view, primary, executed) = cs_state(&admin, &config).await;
    println!();
    println!(
        "CS after the runs: view {view}, primary node {primary}, {executed} batches executed."
    );
    drop(own);
    drop(nodes);
    Ok(())
}

async fn noop_runs(
    args: &CsArgs,
    admin: &Arc<Client>,
    own: &[Arc<Client>],
    config: &Arc<Configuration>,
    limit: Duration,
    dir: &Path,
    pids: &[u32],
) -> Result<()> {
    let ops = args.ops;
    // The floor: a status request's round trip to one node over the same TLS channel.
    let before = mark(admin, config, pids).await;
    let run = {
        let client = admin.clone();
        timed(1, ops, limit, move |_, _| {
            let client = client.clone();
            async move { client.status_of(NodeId(0)).await.map(|_| ()) }
        })
        .await
    };
    let after = mark(admin, config, pids).await;
    row(
        "status round trip (baseline)",
        1,
        &run,
        &before,
        &after,
        false,
    );
    let before = mark(admin, config, pids).await;
    let run = {
        let client = admin.clone();
        timed(1, ops.min(1000), limit, move |_, _| {
            let client = client.clone();
            async move {
                client
                    .configuration()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await
    };
    let after = mark(admin, config, pids).await;
    row(
        "fetch configuration (`configuration()`)",
        1,
        &run,
        &before,
        &after,
        false,
    );
    let before = mark(admin, config, pids).await;
    let run = {
        let client = admin.clone();
        timed(1, ops, limit, move |_, _| {
            let client = client.clone();
            async move {
                match client.configure(|_| Ok(Op::Noop)).await {
                    Ok((_, ConfigOutcome::Done)) => Ok(()),
                    Ok((_, other)) => Err(format!("{other:?}")),
                    Err(error) => Err(error.to_string()),
                }
            }
        })
        .await
    };
    let after = mark(admin, config, pids).await;
    row(
        "no-op, `configure` (fetch + submit)",
        1,
        &run,
        &before,
        &after,
        true,
    );
    for &callers in &args.concurrency {
        let before = mark(admin, config, pids).await;
        let run = {
            let (client, config) = (admin.clone(), config.clone());
            timed(callers, ops, limit, move |_, _| {
                let (client, config) = (client.clone(), config.clone());
                async move { noop(&client, &config).await }
            })
            .await
        };
        let after = mark(admin, config, pids).await;
        row(
            "no-op, `submit_to`, one shared Client",
            callers,
            &run,
            &before,
            &after,
            true,
        );
    }
    for &callers in args.concurrency.iter().filter(|c| **c > 1) {
        let callers = callers.min(own.len());
        let before = mark(admin, config, pids).await;
        let run = {
            let (clients, config) = (own.to_vec(), config.clone());
            timed(callers, ops, limit, move |caller, _| {
                let (client, config) = (clients[caller].clone(), config.clone());
                async move { noop(&client, &config).await }
            })
            .await
        };
        let after = mark(admin, config, pids).await;
        row(
            "no-op, `submit_to`, a Client each",
            callers,
            &run,
            &before,
            &after,
            true,
        );
    }
    if args.same_name_sessions {
        // Sessions of one client name share its ClientId.
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(Arc::new(Client::connect(dir, "bench0").await?));
        }
        for session in &sessions {
            let _ = session.submit_to(config, Op::Noop).await;
        }
        let before = mark(admin, config, pids).await;
        let run = {
            let config = config.clone();
            timed(4, ops, limit, move |caller, _| {
                let (client, config) = (sessions[caller].clone(), config.clone());
                async move { noop(&client, &config).await }
            })
            .await
        };
        let after = mark(admin, config, pids).await;
        row(
            "no-op, `submit_to`, 4 sessions of one client name",
            4,
            &run,
            &before,
            &after,
            true,
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. The trusted log's latency (A2M spec §7.2 T12, the paper's Table 2)

/// No-op throughput of each core on trusted logs as every trusted-log call is delayed, fused
/// calls charged once or twice; a PBFT cluster, which calls no trusted log, as the baseline.
async fn latency_sweep(args: &CsArgs, base: &Path) -> Result<()> {
    let limit = Duration::from_secs_f64(args.seconds.clamp(0.1, 600.0));
    println!();
    println!("## The trusted log's latency (T12)");
    println!();
    println!(
        "Each row a fresh 4-node cluster (f_cs = 1, 1 h epoch): no-ops through `submit_to`, at \
         most {} operations or {:.1} s, from 1 caller and from {OWN_CLIENTS} callers with a \
         Client each. Every trusted-log call of every node waits the given time while its log \
         is held; \"unfused\" charges a fused call (advance with its lookup) twice, as the two \
         calls it replaces.",
        args.ops,
        limit.as_secs_f64()
    );
    println!();
    println!(
        "| core | latency µs | calls | 1 caller ops/s | p50 ms | {OWN_CLIENTS} callers ops/s | p50 ms | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut cases: Vec<(CsProtocol, u64, bool)> = Vec::new();
    for protocol in &args.cs_protocols {
        if !protocol.needs_trusted_logs() {
            cases.push((*protocol, 0, false));
            continue;
        }
        for latency in &args.a2m_latency_us {
            for calls in &args.a2m_calls {
                cases.push((*protocol, *latency, calls == "unfused"));
            }
        }
    }
    for (i, (protocol, latency, unfused)) in cases.into_iter().enumerate() {
        let mut a2m_args = vec!["--inject-latency-us".to_string(), latency.to_string()];
        if unfused {
            a2m_args.push("--unfused".into());
        }
        let mut names = vec!["admin:rw".to_string()];
        names.extend((0..OWN_CLIENTS).map(|i| format!("bench{i}:rw")));
        let dir = base.join(format!("{i}"));
        let (nodes, admin) =
            start_cluster_with(&dir, 4, names, 3_600_000, 5_000, protocol, &a2m_args).await?;
        let config = Arc::new(admin.configuration().await?);
        let mut own = Vec::new();
        for i in 0..OWN_CLIENTS {
            own.push(Arc::new(Client::connect(&dir, &format!("bench{i}")).await?));
        }
        for client in &own {
            let _ = client.submit_to(&config, Op::Noop).await;
        }
        let one = {
            let (client, config) = (own[0].clone(), config.clone());
            timed(1, args.ops, limit, move |_, _| {
                let (client, config) = (client.clone(), config.clone());
                async move { noop(&client, &config).await }
            })
            .await
        };
        let many = {
            let (clients, config) = (own.clone(), config.clone());
            timed(OWN_CLIENTS, args.ops, limit, move |caller, _| {
                let (client, config) = (clients[caller].clone(), config.clone());
                async move { noop(&client, &config).await }
            })
            .await
        };
        let (latency, calls) = if protocol.needs_trusted_logs() {
            (
                latency.to_string(),
                if unfused { "unfused" } else { "fused" },
            )
        } else {
            ("-".to_string(), "-")
        };
        println!(
            "| {} | {latency} | {calls} | {:.0} | {} | {:.0} | {} | {} |",
            protocol.name(),
            one.throughput(),
            ms(one.percentile(0.5)),
            many.throughput(),
            ms(many.percentile(0.5)),
            one.failures + many.failures
        );
        drop(own);
        drop(nodes);
    }
    Ok(())
}

async fn noop(client: &Client, config: &Configuration) -> Result<(), String> {
    match client.submit_to(config, Op::Noop).await {
        Ok(ConfigOutcome::Done) => Ok(()),
        Ok(other) => Err(format!("{other:?}")),
        Err(error) => Err(error.to_string()),
    }
}

/// A node identity no process runs: a loopback address outside the cluster's, a random
/// certificate fingerprint and signing key, and a random trusted-log key where the CS needs one.
fn new_member(i: usize, protocol: CsProtocol) -> NewMember {
    let address = SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 1 + (i / 50_000) as u8, 1)),
        10_000 + (i % 50_000) as u16,
    );
    NewMember {
        trusted_key: protocol
            .needs_trusted_logs()
            .then(|| SecretKey::from_seed(&rand::random()).public_key()),
        address,
        fingerprint: Fingerprint(rand::random()),
        signing_key: SecretKey::from_seed(&rand::random()).public_key(),
    }
}

/// ADDed nodes pending for the next epoch, read through the CS.
async fn pending(client: &Client, config: &Configuration) -> Result<usize> {
    match client.submit_to(config, Op::Read).await? {
        ConfigOutcome::State(pending) => Ok(pending.added.len()),
        other => bail!("a read answered {other:?}"),
    }
}

async fn add_runs(
    args: &CsArgs,
    admin: &Arc<Client>,
    config: &Arc<Configuration>,
    limit: Duration,
    pids: &[u32],
) -> Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let plan = [
        ("ADD, sequential", 1, args.adds),
        (
            "ADD, concurrent",
            args.add_concurrency,
            args.concurrent_adds,
        ),
        ("ADD, sequential", 1, args.adds),
    ];
    for (name, callers, count) in plan {
        let pending_before = pending(admin, config).await?;
        let before = mark(admin, config, pids).await;
        let run = {
            let (client, config, next) = (admin.clone(), config.clone(), next.clone());
            timed(callers, count, limit, move |_, _| {
                let (client, config) = (client.clone(), config.clone());
                let member = new_member(next.fetch_add(1, Ordering::Relaxed), config.cs_protocol);
                async move {
                    let op = client
                        .signed_order(&config, &ConfigAction::Add(member))
                        .map_err(|e| e.to_string())?;
                    match client.submit_to(&config, op).await {
                        Ok(ConfigOutcome::Accepted { .. }) => Ok(()),
                        Ok(other) => Err(format!("{other:?}")),
                        Err(error) => Err(error.to_string()),
                    }
                }
            })
            .await
        };
        let after = mark(admin, config, pids).await;
        let pending_after = pending(admin, config).await?;
        let label = format!("{name} ({pending_before} -> {pending_after} pending)");
        row(&label, callers, &run, &before, &after, true);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3: certifying and disseminating a configuration to 16 nodes

/// Milliseconds since the Unix epoch, with a fraction: the clock configurations are dated by.
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Sleeps until the wall clock reads `at` (milliseconds since the Unix epoch).
async fn sleep_until_wall(at: f64) {
    let wait = at - wall_ms();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait / 1e3)).await;
    }
}

/// When each node first held a certificate of epoch `after + 1` (wall ms), polling each every
/// `poll`; `None` for a node that did not within [`PROPAGATION_MAX`].
async fn watch(client: &Arc<Client>, n: usize, after: u64, poll: Duration) -> Vec<Option<f64>> {
    let mut tasks = Vec::new();
    for node in 0..n {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            while started.elapsed() < PROPAGATION_MAX {
                if let Ok(certs) = client.certificates_from(NodeId(node as u32), after).await
                    && !certs.is_empty()
                {
                    return Some(wall_ms());
                }
                tokio::time::sleep(poll).await;
            }
            None
        }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.ok().flatten());
    }
    seen
}

/// One measured epoch change.
struct Change {
    epoch: u64,
    by_client: bool,
    /// When the epoch could end: `t_epoch - delta` after it began for a client's STOP, `t_epoch`
    /// for the replicas' own.
    t0: f64,
    /// The client's STOP: sent, answered.
    stop: Option<(f64, f64)>,
    /// The STOP's agreed time: the next epoch's start.
    agreed: f64,
    /// First and last node holding the certificate, polled.
    first: f64,
    last: f64,
    missing: usize,
}

async fn propagation(args: &CsArgs, dir: &Path) -> Result<()> {
    let n = args.nodes.max(4);
    let (nodes, client) = start_cluster(
        dir,
        n,
        vec!["admin:rw".into()],
        args.epoch_ms,
        args.stop_tolerance_ms,
        CsProtocol::Pbft,
    )
    .await?;
    let poll = Duration::from_millis(args.poll_ms.max(1));
    println!();
    println!(
        "## {n} nodes (f = 1), f_cs = 1, epochs of {} ms, STOP tolerance {} ms; each node polled every {} ms",
        args.epoch_ms,
        args.stop_tolerance_ms,
        poll.as_millis()
    );
    let mut changes: Vec<Change> = Vec::new();
    let mut attempts = 0;
    while changes.len() < args.epochs && attempts < 3 * args.epochs + 3 {
        attempts += 1;
        let config = client.configuration().await?;
        let epoch = config.epoch.0;
        // Every node holds this epoch before the next is measured.
        if epoch > GENESIS_EPOCH.0 && watch(&client, n, epoch - 1, poll).await.contains(&None) {
            bail!("not every node holds epoch {epoch}");
        }
        let by_client = changes.len().is_multiple_of(2);
        let began = config.started_at_ms as f64;
        let t0 = if by_client {
            began + (config.t_epoch_ms - config.stop_delta_ms) as f64
        } else {
            began + config.t_epoch_ms as f64
        };
        if wall_ms() > t0 - 200.0 {
            // Too late to watch this one from its start (the cluster was still starting).
            eprintln!("  epoch {epoch}: already ending, waiting for the next");
            client.await_epoch(epoch + 1).await?;
            continue;
        }
        sleep_until_wall(t0 - 20.0).await;
        let watcher = {
            let client = client.clone();
            tokio::spawn(async move { watch(&client, n, epoch, poll).await })
        };
        let stop = if by_client {
            sleep_until_wall(t0 + 2.0).await;
            let sent = wall_ms();
            match client.submit_to(&config, Op::Stop).await {
                Ok(ConfigOutcome::Stopped { epoch: next, .. }) if next.0 == epoch + 1 => {
                    Some((sent, wall_ms()))
                }
                other => {
                    eprintln!("  epoch {epoch}: the client's STOP answered {other:?}");
                    None
                }
            }
        } else {
            None
        };
        let seen = watcher.await.context("watching the nodes")?;
        let held: Vec<f64> = seen.iter().flatten().copied().collect();
        if held.is_empty() {
            bail!(
                "no node held epoch {} within {PROPAGATION_MAX:?}",
                epoch + 1
            );
        }
        let next = client.configuration().await?;
        let agreed = if next.epoch.0 == epoch + 1 {
            next.started_at_ms as f64
        } else {
            f64::NAN
        };
        let change = Change {
            epoch,
            by_client,
            t0,
            stop,
            agreed,
            first: held.iter().copied().fold(f64::INFINITY, f64::min),
            last: held.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            missing: n - held.len(),
        };
        eprintln!(
            "  epoch {} -> {} ({}): first node {:.1} ms, last {:.1} ms after t0{}",
            epoch,
            epoch + 1,
            if by_client { "client STOP" } else { "CS STOP" },
            change.first - t0,
            change.last - t0,
            if change.missing > 0 {
                format!(", {} nodes missing", change.missing)
            } else {
                String::new()
            }
        );
        changes.push(change);
    }
    let logged = certified_in_logs(dir, n);
    propagation_tables(&changes, &logged, n);
    drop(nodes);
    Ok(())
}

fn propagation_tables(changes: &[Change], logged: &BTreeMap<u64, Vec<f64>>, n: usize) {
    println!();
    println!(
        "Per epoch (ms; t0 = when the epoch may end: `t_epoch - delta` after it began for a \
         client's STOP, `t_epoch` for the CS replicas' own; polled):"
    );
    println!();
    println!(
        "| epoch | ended by | STOP sent -> result | t0 -> agreed STOP time | t0 -> first certified | first -> last of {n} | t0 -> last | logged: first -> last | missing |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for change in changes {
        let stop = change
            .stop
            .map_or("-".into(), |(sent, got)| format!("{:.1}", got - sent));
        let logs = logged
            .get(&(change.epoch + 1))
            .filter(|times| !times.is_empty())
            .map_or("-".into(), |times| {
                let first = times.iter().copied().fold(f64::INFINITY, f64::min);
                let last = times.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!(
                    "{:.1} -> {:.1} ({} nodes)",
                    first - change.t0,
                    last - change.t0,
                    times.len()
                )
            });
        println!(
            "| {} -> {} | {} | {stop} | {:.0} | {:.1} | {:.1} | {:.1} | {logs} | {} |",
            change.epoch,
            change.epoch + 1,
            if change.by_client {
                "client STOP"
            } else {
                "CS replicas' STOP"
            },
            change.agreed - change.t0,
            change.first - change.t0,
            change.last - change.first,
            change.last - change.t0,
            change.missing
        );
    }
    println!();
    println!("Summary (ms, p50 and max over the epochs; polled, then from the nodes' logs):");
    println!();
    println!(
        "| ended by | epochs | STOP sent -> result | STOP result (or t0) -> first certified | first -> last of {n} (polled) | first -> last of {n} (logged) | t0 -> last |"
    );
    println!("|---|---|---|---|---|---|---|");
    for by_client in [true, false] {
        let these: Vec<&Change> = changes
            .iter()
            .filter(|c| c.by_client == by_client)
            .collect();
        if these.is_empty() {
            continue;
        }
        let stop: Vec<f64> = these
            .iter()
            .filter_map(|c| c.stop.map(|(sent, got)| got - sent))
            .collect();
        let to_first: Vec<f64> = these
            .iter()
            .map(|c| c.first - c.stop.map_or(c.t0, |(_, got)| got))
            .collect();
        let spread: Vec<f64> = these.iter().map(|c| c.last - c.first).collect();
        let logged_spread: Vec<f64> = these
            .iter()
            .filter_map(|c| logged.get(&(c.epoch + 1)))
            .filter(|times| times.len() == n)
            .map(|times| {
                times.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    - times.iter().copied().fold(f64::INFINITY, f64::min)
            })
            .collect();
        let total: Vec<f64> = these.iter().map(|c| c.last - c.t0).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            if by_client {
                "client STOP"
            } else {
                "CS replicas' STOP"
            },
            these.len(),
            summary(&stop),
            summary(&to_first),
            summary(&spread),
            summary(&logged_spread),
            summary(&total)
        );
    }
}

/// "p50 / max" of `values`.
fn summary(values: &[f64]) -> String {
    if values.is_empty() {
        return "-".into();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p50 = sorted[(sorted.len() - 1) / 2];
    format!("{p50:.1} / {:.1}", sorted[sorted.len() - 1])
}

/// From each node's log, when it logged "configuration certified" for each epoch (wall ms).
fn certified_in_logs(dir: &Path, n: usize) -> BTreeMap<u64, Vec<f64>> {
    let mut by_epoch: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for node in 0..n {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("node-{node}/node.log"))) else {
            continue;
        };
        for line in text
            .lines()
            .filter(|l| l.contains("configuration certified"))
        {
            let Some(at) = line.split_whitespace().next().and_then(parse_rfc3339_ms) else {
                continue;
            };
            let Some(epoch) = line
                .split_whitespace()
                .find_map(|word| word.strip_prefix("epoch="))
                .and_then(|e| e.parse::<u64>().ok())
            else {
                continue;
            };
            by_epoch.entry(epoch).or_default().push(at);
        }
    }
    by_epoch
}

/// `2026-11-25T10:11:12.123456Z` as milliseconds since the Unix epoch.
fn parse_rfc3339_ms(text: &str) -> Option<f64> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let mut time = time.split(':');
    let (hours, minutes) = (
        time.next()?.parse::<i64>().ok()?,
        time.next()?.parse::<i64>().ok()?,
    );
    let seconds = time.next()?.parse::<f64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let whole = (days * 86_400 + hours * 3_600 + minutes * 60) as f64;
    Some((whole + seconds) * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_timestamps_parse() {
        assert_eq!(
            parse_rfc3339_ms("1970-01-01T00:00:01.500000Z"),
            Some(1500.0)
        );
        let at = parse_rfc3339_ms("2026-11-25T10:11:12.250000Z").unwrap();
        // 2026-11-25 is day 20_782 after the Unix epoch.
        assert!((at - (20_782.0 * 86_400_000.0 + 36_672_250.0)).abs() < 0.01);
    }
}
