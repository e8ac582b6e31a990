//! `bulwark bench compare`: every system started once, loaded with the same records, then driven
//! with the same workloads, alternating systems run by run so that machine noise hits all alike.

use crate::driver::{self, LinkBytes, RunSpec, RunStats, Target, Work};
use crate::links::{Hosts, Rate, ShapedNetwork};
use crate::report::{self, Machine, Report, Unsupported};
use crate::targets::bulwark::{
    BulwarkOptions, BulwarkTarget, POWERSTORE_SOLE_WRITER, POWERSTORE_TWO_ROUND_READS,
};
use crate::targets::etcd::{self, EtcdTarget};
use crate::targets::table::{self, TableTarget};
use crate::ycsb::{CoreWorkload, WorkloadSpec};
use anyhow::{Result, bail};
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What to compare, and how long.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// "powerstore", "powerstore-2r" (its reads always in two rounds, as the paper's),
    /// "powerstore-sw" (a volume with one writer: two-round writes), "etcd",
    /// or another Bulwark protocol name (passed to `cluster init --protocol`).
    pub systems: Vec<String>,
    pub workloads: Vec<char>,
    /// Client counts for the YCSB runs: one point each on the throughput-latency curves.
    pub concurrency: Vec<usize>,
    /// Object sizes for the put/get sweep (empty: none).
    pub sizes: Vec<usize>,
    pub size_concurrency: usize,
    pub run_time: Duration,
    pub record_count: i64,
    /// Total YCSB operations per second to aim for; latencies then include coordinated
    /// omission.
    pub target_rate: Option<f64>,
    /// The `bulwark` binary whose `cluster init` and `node` commands start Bulwark.
    pub program: PathBuf,
    /// Where clusters live while they run.
    pub work_dir: PathBuf,
    /// Where the report goes.
    pub out: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// Every server and the client on a host of its own, links shaped to this rate
    /// ([`crate::links`]); `None`: everything on loopback.
    pub links: Option<Rate>,
}

impl CompareOptions {
    /// The full comparison (most of an hour on 2 cores with four systems) or `--quick`.
    pub fn preset(quick: bool) -> CompareOptions {
        let kib = 1024;
        CompareOptions {
            systems: ["powerstore", "abd", "phalanx", "etcd"]
                .map(String::from)
                .to_vec(),
            workloads: vec!['A', 'B', 'C', 'D', 'E', 'F'],
            concurrency: if quick {
                vec![1, 8, 32]
            } else {
                vec![1, 4, 16, 64]
            },
            sizes: vec![kib, 64 * kib, kib * kib, 16 * kib * kib],
            size_concurrency: 8,
            run_time: Duration::from_secs(if quick { 3 } else { 20 }),
            record_count: if quick { 1000 } else { 10_000 },
            target_rate: None,
            program: PathBuf::from("bulwark"),
            work_dir: std::env::temp_dir().join(format!("bulwark-bench-{}", std::process::id())),
            out: PathBuf::from("results"),
            command: String::new(),
            links: None,
        }
    }
}

/// Servers a shaped network holds: one group of 3f + 1 at f = 1, which also seats etcd's three.
const SHAPED_SERVERS: usize = 4;

async fn start(system: &str, options: &CompareOptions, hosts: &Hosts) -> Result<Arc<dyn Target>> {
    let dir = options.work_dir.join(system);
    Ok(if system == "etcd" {
        let program = etcd::find_or_install()?;
        Arc::new(EtcdTarget::start(&program, &dir, hosts).await?)
    } else if system.starts_with(table::PREFIX) {
        let (variant, replication, fault) = table::parse(system)?;
        let options = BulwarkOptions {
            program: options.program.clone(),
            dir,
            f: 1,
            protocol: None,
            two_round_reads: false,
            sole_writer: false,
            node_args: vec!["--unprotected-tables".into()],
            byzantine: fault.byzantine(),
            retransmit_after: fault.retransmit_after(),
            hosts: hosts.clone(),
        };
        Arc::new(TableTarget::start(&options, system, variant, replication).await?)
    } else {
        Arc::new(
            BulwarkTarget::start(&BulwarkOptions {
                program: options.program.clone(),
                dir,
                f: 1,
                protocol: (![
                    "powerstore",
                    POWERSTORE_TWO_ROUND_READS,
                    POWERSTORE_SOLE_WRITER,
                ]
                .contains(&system))
                .then(|| system.to_string()),
                two_round_reads: system == POWERSTORE_TWO_ROUND_READS,
                sole_writer: system == POWERSTORE_SOLE_WRITER,
                node_args: Vec::new(),
                byzantine: Vec::new(),
                retransmit_after: None,
                hosts: hosts.clone(),
            })
            .await?,
        )
    })
}

/// [`driver::run`], with what crossed the client's link when there is one.
async fn measured(
    hosts: &Hosts,
    target: Arc<dyn Target>,
    work: Work,
    spec: &RunSpec,
    label: &str,
    object_bytes: usize,
) -> RunStats {
    let before = hosts.client_link_bytes();
    let mut stats = driver::run(target, work, spec, label, object_bytes).await;
    if let (Some(before), Some(after)) = (before, hosts.client_link_bytes()) {
        let ops = stats.ops.max(1) as f64;
        stats.link_bytes_per_op = Some(LinkBytes {
            received: (after.received - before.received).max(0.0) / ops,
            sent: (after.sent - before.sent).max(0.0) / ops,
        });
    }
    stats
}

fn log(stats: &RunStats) {
    let link = stats.link_bytes_per_op.map_or(String::new(), |bytes| {
        format!(
            "  link in {} out {} per op",
            report::human_bytes(bytes.received),
            report::human_bytes(bytes.sent)
        )
    });
    eprintln!(
        "  {:<11} {:<7} {:>9} x{:<3} {:>8.0} ops/s  p50 {:>7.2} ms  p99 {:>8.2} ms  failed {}{link}",
        stats.system,
        stats.workload,
        report::human_bytes(stats.object_bytes as f64),
        stats.concurrency,
        stats.throughput_ops,
        stats.overall.p50_ms,
        stats.overall.p99_ms,
        stats.failures
    );
}

/// Runs the comparison and writes the report; returns the Markdown report's path.
///
/// With `links`, the servers and the client run on hosts of their own ([`ShapedNetwork`]): the
/// comparison runs on a thread that has entered the client's host, with a runtime of its own
/// (its threads, sockets and children are all there), and the network is removed once that
/// thread is done, however the run ends: also when this future is dropped (Ctrl-C), which waits
/// for the thread to stop its clusters first.
pub async fn run(options: &CompareOptions) -> Result<PathBuf> {
    let Some(rate) = options.links else {
        return run_on(options, &Hosts::Loopback).await;
    };
    let network = Arc::new(ShapedNetwork::create(SHAPED_SERVERS, rate)?);
    eprintln!(
        "shaped hosts: the client at {}, servers at {}-{}, every link {} each way (tbf)",
        network.client_ip(),
        network.server_ip(0),
        network.server_ip(SHAPED_SERVERS - 1),
        rate
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (done, result) = tokio::sync::oneshot::channel();
    let options = options.clone();
    let thread = std::thread::Builder::new()
        .name("compare-client".into())
        .spawn(move || {
            let result = (|| {
                network.enter_client()?;
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                let hosts = Hosts::Shaped(network.clone());
                runtime.block_on(async {
                    tokio::select! {
                        result = run_on(&options, &hosts) => result,
                        _ = stopped => bail!("stopped"),
                    }
                })
            })();
            // The clusters are stopped by now (their targets dropped inside run_on); the
            // namespaces go with the last reference to the network, this one.
            drop(network);
            let _ = done.send(result);
        })?;
    let guard = JoinOnDrop {
        stop: Some(stop),
        thread: Some(thread),
    };
    let result = result
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the comparison's thread panicked")));
    drop(guard);
    result
}

/// Stops the comparison's thread and waits for it, so that no node outlives the run and the
/// shaped network is gone before the caller goes on.
struct JoinOnDrop {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run_on(options: &CompareOptions, hosts: &Hosts) -> Result<PathBuf> {
    let mut notes = Vec::new();
    if let Hosts::Shaped(network) = hosts {
        notes.push(format!(
            "Links shaped to {} each way (tc tbf): the client and every server on a network \
             namespace of its own, joined by one switch (a Linux bridge); the servers of every \
             system share the same {} hosts, the idle systems' links carrying only their \
             heartbeats.",
            network.rate(),
            network.servers()
        ));
    }
    // Measured first, on a machine no system is loading yet.
    eprintln!("measuring the machine's own limits (decode, hashing, loopback)");
    let limits = match crate::limits::measure().await {
        Ok(limits) => Some(limits),
        Err(e) => {
            notes.push(format!("the machine's limits could not be measured: {e:#}"));
            None
        }
    };
    let mut targets: Vec<Arc<dyn Target>> = Vec::new();
    for system in &options.systems {
        eprintln!("starting {system}");
        match start(system, options, hosts).await {
            Ok(t) => targets.push(t),
            Err(e) => {
                eprintln!("  {system} not run: {e:#}");
                notes.push(format!("{system} was not run: {e:#}"));
            }
        }
    }
    if targets.is_empty() {
        bail!("no system could be started: {}", notes.join("; "));
    }
    let mut runs = Vec::new();
    let mut unsupported = Vec::new();
    let mut turn = 0usize;
    // Alternates which system goes first, so that none always runs on a warmer or quieter
    // machine.
    let mut order = |targets: &[Arc<dyn Target>]| {
        turn += 1;
        let mut v: Vec<Arc<dyn Target>> = targets.to_vec();
        v.rotate_left(turn % targets.len());
        v
    };
    let spec = |concurrency: usize, ops_max: u64, rate: Option<f64>, seed: u64| RunSpec {
        concurrency,
        ops_max,
        duration: options.run_time,
        target_rate: rate,
        seed,
    };
    let ycsb_runs = options.workloads.len() * options.concurrency.len();
    if ycsb_runs > 0 {
        // YCSB's load phase: every record, keys in hashed insert order.
        let record = WorkloadSpec::standard('A').map_or(1000, |s| s.record_bytes());
        let mut loaded = Vec::new();
        for target in targets {
            let load = RunSpec {
                duration: Duration::from_secs(600),
                ..spec(8, options.record_count as u64, None, 0)
            };
            let stats = driver::run(
                target.clone(),
                Work::Load {
                    record_bytes: record,
                },
                &load,
                "load",
                record,
            )
            .await;
            eprintln!(
                "  {} loaded {} records in {:.1} s ({} failed)",
                stats.system, stats.ops, stats.elapsed_s, stats.failures
            );
            if stats.failures > 0 {
                // A system that cannot store the records is left out, saying why, rather than
                // ending the comparison for the others.
                notes.push(format!(
                    "{} was not run: {} of the load phase's {} inserts failed: {}",
                    stats.system,
                    stats.failures,
                    options.record_count,
                    stats.errors.join("; ")
                ));
            } else {
                loaded.push(target);
            }
        }
        targets = loaded;
        if targets.is_empty() {
            bail!("no system completed the load phase: {}", notes.join("; "));
        }
    }
    for (w, &name) in options.workloads.iter().enumerate() {
        let Some(workload_spec) = WorkloadSpec::standard(name) else {
            bail!("no YCSB workload {name:?} (A-F)");
        };
        let label = format!("ycsb-{}", workload_spec.name);
        // One CoreWorkload per system, kept across its runs (inserts keep extending the keys).
        let expected_ops = 50_000;
        let workloads: Vec<Arc<CoreWorkload>> = targets
            .iter()
            .map(|_| {
                Arc::new(CoreWorkload::new(
                    workload_spec.clone(),
                    options.record_count,
                    expected_ops,
                ))
            })
            .collect();
        for &concurrency in &options.concurrency {
            for target in order(&targets) {
                let i = targets
                    .iter()
                    .position(|t| Arc::ptr_eq(t, &target))
                    .unwrap_or(0);
                if workload_spec.needs_scan() && !target.can_scan() {
                    if !unsupported
                        .iter()
                        .any(|u: &Unsupported| u.system == target.name() && u.workload == label)
                    {
                        eprintln!("  {} {label}: unsupported (no scans)", target.name());
                        unsupported.push(Unsupported {
                            system: target.name(),
                            workload: label.clone(),
                            reason: "a register store has no key order to scan; YCSB-E needs \
                                     range scans"
                                .into(),
                        });
                    }
                    continue;
                }
                let stats = measured(
                    hosts,
                    target.clone(),
                    Work::Ycsb(workloads[i].clone()),
                    &spec(concurrency, u64::MAX, options.target_rate, w as u64),
                    &label,
                    workload_spec.record_bytes(),
                )
                .await;
                log(&stats);
                runs.push(stats);
                if let Err(e) = target.between_runs().await {
                    eprintln!("  {}: housekeeping failed: {e:#}", target.name());
                }
            }
        }
    }
    for &size in &options.sizes {
        let value = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let keys = 16u64;
        let prefix = format!("size/{size}/");
        let mut written = vec![0u64; targets.len()];
        for kind in ["put", "get"] {
            for target in order(&targets) {
                let i = targets
                    .iter()
                    .position(|t| Arc::ptr_eq(t, &target))
                    .unwrap_or(0);
                if kind == "get" && written[i] == 0 {
                    notes.push(format!(
                        "{} get {}: not run, no put of that size succeeded.",
                        target.name(),
                        report::human_bytes(size as f64)
                    ));
                    continue;
                }
                let work = if kind == "put" {
                    Work::Put {
                        prefix: prefix.clone(),
                        keys,
                        value: value.clone(),
                    }
                } else {
                    Work::Get {
                        prefix: prefix.clone(),
                        keys: written[i].clamp(1, keys),
                    }
                };
                let stats = measured(
                    hosts,
                    target.clone(),
                    work,
                    &spec(options.size_concurrency, u64::MAX, None, 0),
                    kind,
                    size,
                )
                .await;
                if kind == "put" {
                    written[i] = stats.ops;
                }
                log(&stats);
                runs.push(stats);
                if let Err(e) = target.between_runs().await {
                    eprintln!("  {}: housekeeping failed: {e:#}", target.name());
                }
            }
        }
    }
    notes.push(
        "Records are stored whole (10 fields x 100 B in one value) on every system: an update \
         writes a full record, as a key-value binding without per-field storage must."
            .into(),
    );
    notes.push(
        "Bytes sent: Bulwark counts the frames its nodes received (after TLS); etcd counts every \
         byte this client wrote to the members' sockets (gRPC over HTTP/2, framing and headers \
         included)."
            .into(),
    );
    let systems: Vec<String> = targets.iter().map(|t| t.name()).collect();
    let report = Report {
        command: options.command.clone(),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: Machine::this(),
        systems,
        runs,
        unsupported,
        notes,
        limits,
    };
    drop(targets);
    let _ = std::fs::remove_dir_all(&options.work_dir);
    report::write(&options.out, &report)
}
