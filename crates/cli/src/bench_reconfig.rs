//! `bulwark bench reconfig`: throughput and latency over time while the membership changes, on a
//! local cluster of node processes. Closed-loop clients read and write public-key objects
//! (half each) while a node joins (`bulwark node join`) and later an original member is revoked;
//! completions are counted per time bucket, so the dip a state transfer causes, and how soon the
//! cluster is back to its earlier rate, show in one table.
//!
//! Bounded in count and time: each client stops after `--seconds` or `--ops-per-client`, and every
//! node process is killed when the run ends, however it ends (`dev::Nodes`).

use super::cs::start_cluster;
use anyhow::{Context, Result, bail};
use bulwark_client::{Client, ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::configuration::Configuration;
use bulwark_core::sign::SecretKey;
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `bulwark bench reconfig`.
#[derive(clap::Args)]
pub struct ReconfigArgs {
    /// Nodes the cluster starts with (f = 1).
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// Closed-loop clients, each with its own connections.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Public-key objects, written once before the run.
    #[arg(long, default_value_t = 256)]
    pub objects: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Length of the run, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Operations per client at most.
    #[arg(long, default_value_t = 200_000)]
    pub ops_per_client: u64,
    /// When a node starts joining, in seconds from the start of the run.
    #[arg(long, default_value_t = 8.0)]
    pub join_at: f64,
    /// When node 0 is revoked, in seconds from the start of the run.
    #[arg(long, default_value_t = 18.0)]
    pub revoke_at: f64,
    /// How long an epoch lasts, in milliseconds (membership changes take effect when it ends).
    #[arg(long, default_value_t = 3_000)]
    pub epoch_ms: u64,
    /// Width of a time bucket, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub bucket_ms: u64,
    /// Where the cluster lives (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One completed operation: when it ended (µs since the run began) and how long it took.
#[derive(Clone, Copy)]
struct Done {
    at_us: u64,
    latency_us: u64,
    ok: bool,
}

/// A membership change as the run saw it, in µs since the run began.
#[derive(Default, Clone)]
struct Change {
    what: String,
    asked_us: u64,
    certified_us: Option<u64>,
    settled_us: Option<u64>,
    epoch: u64,
    moved_keys: u64,
}

fn owner(i: u32) -> SecretKey {
    let mut seed = [0x5a; 32];
    seed[..4].copy_from_slice(&i.to_be_bytes());
    SecretKey::from_seed(&seed)
}

pub async fn run(args: &ReconfigArgs) -> Result<()> {
    if args.nodes < 4 || args.clients == 0 || args.objects == 0 {
        bail!("--nodes must be at least 4, --clients and --objects at least 1");
    }
    if !(args.join_at < args.revoke_at && args.revoke_at < args.seconds) {
        bail!("--join-at < --revoke-at < --seconds");
    }
    let base = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("bulwark-bench-reconfig-{}", std::process::id())),
    };
    let result = tokio::select! {
        result = measure(args, &base) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; all nodes stopped")),
    };
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

async fn measure(args: &ReconfigArgs, dir: &Path) -> Result<()> {
    let clients: Vec<String> = (0..args.clients)
        .map(|i| format!("load{i}:rw"))
        .chain(["admin:rw".to_string()])
        .collect();
    let (mut nodes, admin) = start_cluster(
        dir,
        args.nodes,
        clients,
        args.epoch_ms,
        500,
        bulwark_core::configuration::CsProtocol::Pbft,
    )
    .await?;
    let value = Bytes::from(vec![b'v'; args.value_bytes]);
    for i in 0..args.objects {
        admin
            .put_owned(&owner(i), Some(value.clone()))
            .await
            .with_context(|| format!("writing object {i} before the run"))?;
    }
    eprintln!(
        "{} nodes up, {} objects of {} bytes written; running {} s",
        args.nodes, args.objects, args.value_bytes, args.seconds
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let done: Arc<Mutex<Vec<Done>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let client = Client::connect(dir, &format!("load{i}")).await?;
        let (done, value) = (done.clone(), value.clone());
        let (objects, ops) = (args.objects, args.ops_per_client);
        tasks.push(tokio::spawn(async move {
            // A fixed sequence per client: the same run, the same operations.
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
            for _ in 0..ops {
                if Instant::now() >= deadline {
                    break;
                }
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let object = owner((state % u64::from(objects)) as u32);
                let begun = Instant::now();
                let ok = if state & (1 << 40) == 0 {
                    client.put_owned(&object, Some(value.clone())).await.is_ok()
                } else {
                    client.get_owned(&object.public_key()).await.is_ok()
                };
                let end = Instant::now();
                if let Ok(mut done) = done.lock() {
                    done.push(Done {
                        at_us: end.duration_since(started).as_micros() as u64,
                        latency_us: end.duration_since(begun).as_micros() as u64,
                        ok,
                    });
                }
            }
        }));
    }

    let since = |at: Instant| at.duration_since(started).as_micros() as u64;
    tokio::time::sleep_until((started + Duration::from_secs_f64(args.join_at)).into()).await;
    let before = admin.configuration().await?;
    let exe = std::env::current_exe()?;
    let asked = Instant::now();
    let (port, _) = nodes.join(&exe)?;
    let mut join = Change {
        what: "node joins".into(),
        asked_us: since(asked),
        ..Change::default()
    };
    let grown = follow(&admin, &mut join, started, deadline, |config| {
        config.members.iter().any(|m| m.address.port() == port)
    })
    .await?;

    tokio::time::sleep_until((started + Duration::from_secs_f64(args.revoke_at)).into()).await;
    let asked = Instant::now();
    let (_, outcome) = admin.order(ConfigAction::Revoke(NodeId(0))).await?;
    if !matches!(outcome, ConfigOutcome::Accepted { .. }) {
        bail!("revoke of node 0: {outcome:?}");
    }
    let mut revoke = Change {
        what: "node 0 revoked".into(),
        asked_us: since(asked),
        ..Change::default()
    };
    follow(&admin, &mut revoke, started, deadline, |config| {
        config.member(NodeId(0)).is_none()
    })
    .await?;
    for task in tasks {
        task.await.context("a load client")?;
    }
    let done = done.lock().map(|d| d.clone()).unwrap_or_default();
    drop(nodes);
    print!("{}", report(args, &done, &[join, revoke], &before, &grown));
    Ok(())
}

/// Waits for the configuration `certified` describes, then for every member to finish its
/// transfers into it (or the deadline); fills in `change`.
async fn follow(
    admin: &Client,
    change: &mut Change,
    started: Instant,
    deadline: Instant,
    certified: impl Fn(&Configuration) -> bool,
) -> Result<Configuration> {
    let since = |at: Instant| at.duration_since(started).as_micros() as u64;
    let pulled_before = pulled(admin).await;
    let config = loop {
        let config = admin.configuration().await?;
        if certified(&config) {
            break config;
        }
        if Instant::now() >= deadline {
            bail!("{} was not certified within the run", change.what);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    change.certified_us = Some(since(Instant::now()));
    change.epoch = config.epoch.0;
    while Instant::now() < deadline {
        let statuses = admin.status().await;
        let settled = config.members.iter().all(|member| {
            statuses
                .iter()
                .find(|(node, _, _)| *node == member.id)
                .and_then(|(_, _, status)| pubkey_stats(status.as_ref().ok()?))
                .is_some_and(|stats| stats.epoch >= config.epoch.0 && stats.transfers_pending == 0)
        });
        if settled {
            change.settled_us = Some(since(Instant::now()));
            change.moved_keys = pulled(admin).await.saturating_sub(pulled_before);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(config)
}

fn pubkey_stats(
    status: &bulwark_protocol::service::NodeStatus,
) -> Option<&bulwark_protocol::machine::ReplicaStats> {
    status
        .replicas
        .iter()
        .find(|r| r.service == "pubkey")
        .map(|r| &r.stats)
}

/// Versions pulled so far by every node that answers, each counted since it started.
async fn pulled(admin: &Client) -> u64 {
    admin
        .status()
        .await
        .iter()
        .filter_map(|(_, _, status)| pubkey_stats(status.as_ref().ok()?))
        .map(|stats| stats.transferred_keys)
        .sum()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The Markdown report: a row per bucket, the changes marked, and a summary per change.
fn report(
    args: &ReconfigArgs,
    done: &[Done],
    changes: &[Change],
    before: &Configuration,
    grown: &Configuration,
) -> String {
    let bucket_us = args.bucket_ms * 1000;
    let buckets = (args.seconds * 1e6 / bucket_us as f64).ceil() as usize;
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); buckets];
    let mut failed = vec![0usize; buckets];
    for op in done {
        let Some(bucket) = per.get_mut((op.at_us / bucket_us) as usize) else {
            continue;
        };
        if op.ok {
            bucket.push(op.latency_us);
        } else {
            failed[(op.at_us / bucket_us) as usize] += 1;
        }
    }
    let rate = |bucket: &[u64]| bucket.len() as f64 * 1000.0 / args.bucket_ms as f64;
    let baseline_buckets: Vec<f64> = per
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            let start = *i as u64 * bucket_us;
            start >= 1_000_000 && start + bucket_us <= changes[0].asked_us
        })
        .map(|(_, b)| rate(b))
        .collect();
    let baseline = baseline_buckets.iter().sum::<f64>() / baseline_buckets.len().max(1) as f64;
    let mut text = format!(
        "{} nodes (f = 1), {} closed-loop clients, {} public-key objects of {} B, half reads and \
         half writes; epochs of {} ms; buckets of {} ms. Epoch {} has {} members; epoch {} {}.\n\n",
        args.nodes,
        args.clients,
        args.objects,
        args.value_bytes,
        args.epoch_ms,
        args.bucket_ms,
        before.epoch.0,
        before.members.len(),
        grown.epoch.0,
        grown.members.len()
    );
    text += "| t (s) | ops/s | vs before | p50 (ms) | p99 (ms) | failed | event |\n";
    text += "|---:|---:|---:|---:|---:|---:|---|\n";
    for (i, bucket) in per.iter_mut().enumerate() {
        bucket.sort_unstable();
        let (from, to) = (i as u64 * bucket_us, (i as u64 + 1) * bucket_us);
        let mut events = Vec::new();
        for change in changes {
            let marks = [
                (Some(change.asked_us), "asked"),
                (change.certified_us, "certified"),
                (change.settled_us, "transfers done"),
            ];
            for (at, what) in marks {
                if at.is_some_and(|at| (from..to).contains(&at)) {
                    events.push(format!("{}: {what}", change.what));
                }
            }
        }
        text += &format!(
            "| {:.1} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            from as f64 / 1e6,
            rate(bucket),
            rate(bucket) / baseline.max(1.0),
            percentile(bucket, 0.5) as f64 / 1000.0,
            percentile(bucket, 0.99) as f64 / 1000.0,
            failed[i],
            events.join("; ")
        );
    }
    text += &format!("\nBefore the first change: {baseline:.0} ops/s.\n");
    for change in changes {
        let (Some(certified), settled) = (change.certified_us, change.settled_us) else {
            continue;
        };
        let window = |from: u64, to: u64| -> Vec<f64> {
            per.iter()
                .enumerate()
                .filter(|(i, _)| {
                    let start = *i as u64 * bucket_us;
                    start + bucket_us > from && start < to
                })
                .map(|(_, b)| rate(b))
                .collect()
        };
        let end = settled.unwrap_or(certified) + 2 * bucket_us;
        let during = window(certified, end);
        let lowest = during.iter().copied().fold(f64::INFINITY, f64::min);
        let back = per
            .iter()
            .enumerate()
            .find(|(i, b)| *i as u64 * bucket_us >= certified && rate(b) >= 0.9 * baseline)
            .map(|(i, _)| (i as u64 * bucket_us).saturating_sub(certified));
        text += &format!(
            "{} (epoch {}): certified {:.1} s after it was asked; transfers done {} ({} versions \
             pulled by all members); lowest bucket from certification to 1 s after the transfers: {:.0} \
             ops/s ({:.2} of before); back to 90% of before {}.\n",
            change.what,
            change.epoch,
            (certified - change.asked_us) as f64 / 1e6,
            settled.map_or("not within the run".to_string(), |s| format!(
                "{:.2} s after certification",
                (s - certified) as f64 / 1e6
            )),
            change.moved_keys,
            lowest,
            lowest / baseline.max(1.0),
            back.map_or("not within the run".to_string(), |b| format!(
                "{:.1} s after certification",
                b as f64 / 1e6
            ))
        );
    }
    text
}
