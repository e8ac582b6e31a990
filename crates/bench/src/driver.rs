//! The load driver: closed-loop client tasks against a [`Target`], with an optional target
//! throughput, HDR latency histograms (corrected for coordinated omission when a rate is set),
//! and the cost of the run read from the target's processes.

use crate::procstat;
use crate::ycsb::{CoreWorkload, Op, OpKind};
use anyhow::Result;
use bytes::Bytes;
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A system under test, seen as a key-value store of whole records.
pub trait Target: Send + Sync {
    /// The name reports use ("powerstore", "etcd", ...).
    fn name(&self) -> String;
    /// Reads `key`; `Ok(false)` when it does not exist.
    fn read(&self, key: String) -> BoxFuture<'_, Result<bool>>;
    /// Stores `value` under `key`, replacing what was there.
    fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>>;
    /// Whether [`Target::scan`] works. A register store cannot scan; YCSB-E is then reported as
    /// unsupported, never emulated.
    fn can_scan(&self) -> bool {
        false
    }
    /// Reads up to `count` records in key order from `start`; returns how many came back.
    fn scan(&self, _start: String, _count: usize) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async { anyhow::bail!("this target cannot scan") })
    }
    /// The server processes whose CPU time and memory the run is charged with.
    fn pids(&self) -> Vec<u32>;
    /// Bytes the client has sent to the servers so far, if the target can tell.
    fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>>;
    /// Housekeeping between runs (etcd: compact old revisions so its quota is not exhausted).
    fn between_runs(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// What each operation of a run does.
#[derive(Clone)]
pub enum Work {
    /// A YCSB CoreWorkload.
    Ycsb(Arc<CoreWorkload>),
    /// Puts of `value` over `keys` keys named `prefix` + index.
    Put {
        prefix: String,
        keys: u64,
        value: Bytes,
    },
    /// Gets over the keys a `Put` run wrote.
    Get { prefix: String, keys: u64 },
    /// YCSB's load phase: record `i` under `key_name(i)`, for each operation index `i`.
    Load { record_bytes: usize },
}

/// How long and how hard to drive.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub concurrency: usize,
    /// At most this many operations...
    pub ops_max: u64,
    /// ...and for at most this long.
    pub duration: Duration,
    /// Total operations per second to aim for (spread over the clients); `None`: as fast as
    /// each closed loop goes.
    pub target_rate: Option<f64>,
    pub seed: u64,
}

/// Latency of one kind of operation.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyStats {
    pub ops: u64,
    pub failures: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunStats {
    pub system: String,
    /// "ycsb-A" ... or "put"/"get".
    pub workload: String,
    pub object_bytes: usize,
    pub concurrency: usize,
    pub target_rate: Option<f64>,
    pub elapsed_s: f64,
    pub ops: u64,
    pub failures: u64,
    pub throughput_ops: f64,
    pub overall: LatencyStats,
    pub by_op: BTreeMap<String, LatencyStats>,
    /// Server CPU time (all server processes) per successful operation, microseconds.
    pub server_cpu_us_per_op: f64,
    /// This process's CPU time per successful operation, microseconds.
    pub client_cpu_us_per_op: f64,
    pub bytes_sent_per_op: Option<f64>,
    /// What crossed the client host's link per successful operation, each way, under
    /// `--links` (none on loopback).
    pub link_bytes_per_op: Option<LinkBytes>,
    /// Resident memory of the server processes at the end of the run: sum and largest.
    pub server_rss_bytes: u64,
    pub server_rss_max_bytes: u64,
    /// The first few error messages, to say why operations failed.
    pub errors: Vec<String>,
}

/// Bytes through one host's link, as its interface counts them (IP headers and TLS included).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LinkBytes {
    pub received: f64,
    pub sent: f64,
}

const LATENCY_US_MAX: u64 = 3_600_000_000;

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).unwrap_or_else(|_| Histogram::new(3).unwrap())
}

fn latency_stats(h: &Histogram<u64>, failures: u64) -> LatencyStats {
    let ms = |us: u64| us as f64 / 1000.0;
    LatencyStats {
        ops: h.len(),
        failures,
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// What one client task saw.
struct Tally {
    histograms: BTreeMap<OpKind, Histogram<u64>>,
    failures: BTreeMap<OpKind, u64>,
    errors: Vec<String>,
}

impl Tally {
    fn record(&mut self, kind: OpKind, latency: Duration, expected_interval: Option<u64>) {
        let h = self.histograms.entry(kind).or_insert_with(new_histogram);
        let us = (latency.as_micros() as u64).clamp(1, LATENCY_US_MAX);
        let _ = match expected_interval {
            // Coordinated omission: a response slower than the schedule hid the requests that
            // would have been sent meanwhile; record_correct adds them back.
            Some(interval) => h.record_correct(us, interval),
            None => h.record(us),
        };
    }
}

async fn execute(
    target: &dyn Target,
    work: &Work,
    rng: &mut StdRng,
    index: u64,
) -> (OpKind, Result<()>) {
    match work {
        Work::Put {
            prefix,
            keys,
            value,
        } => (
            OpKind::Update,
            target
                .write(format!("{prefix}{}", index % keys), value.clone())
                .await,
        ),
        Work::Load { record_bytes } => {
            let record: Vec<u8> = (0..*record_bytes)
                .map(|_| rng.random_range(b' '..=b'~'))
                .collect();
            (
                OpKind::Insert,
                target
                    .write(crate::ycsb::key_name(index as i64), Bytes::from(record))
                    .await,
            )
        }
        Work::Get { prefix, keys } => {
            let r = target.read(format!("{prefix}{}", index % keys)).await;
            (OpKind::Read, found(r))
        }
        Work::Ycsb(workload) => {
            let op = workload.next_op(rng);
            let kind = op.kind();
            let result = match op {
                Op::Read { key } => found(target.read(key).await),
                Op::Update { key } => {
                    let record = Bytes::from(workload.record(rng));
                    target.write(key, record).await
                }
                Op::Insert { key, keynum } => {
                    let record = Bytes::from(workload.record(rng));
                    let r = target.write(key, record).await;
                    if r.is_ok() {
                        workload.acknowledge_insert(keynum);
                    }
                    r
                }
                Op::Scan { start, count } => target.scan(start, count).await.map(|_| ()),
                Op::ReadModifyWrite { key } => match found(target.read(key.clone()).await) {
                    Ok(()) => {
                        let record = Bytes::from(workload.record(rng));
                        target.write(key, record).await
                    }
                    Err(e) => Err(e),
                },
            };
            (kind, result)
        }
    }
}

fn found(r: Result<bool>) -> Result<()> {
    match r {
        Ok(true) => Ok(()),
        Ok(false) => anyhow::bail!("not found"),
        Err(e) => Err(e),
    }
}

/// Drives `target` with `work` as `spec` says, showing a progress bar when stderr is a terminal.
pub async fn run(
    target: Arc<dyn Target>,
    work: Work,
    spec: &RunSpec,
    workload: &str,
    object_bytes: usize,
) -> RunStats {
    let progress = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let bar = indicatif::ProgressBar::new(spec.ops_max);
        bar.set_message(format!(
            "{} {workload} x{}",
            target.name(),
            spec.concurrency
        ));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:40} {bar:30} {pos}/{len} {per_sec}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let pids = target.pids();
    let server_cpu_before = procstat::total_cpu_seconds(&pids);
    let client_cpu_before = procstat::own_cpu_seconds().unwrap_or(0.0);
    let bytes_before = target.bytes_sent().await;
    let concurrency = spec.concurrency.max(1);
    let interval = spec
        .target_rate
        .map(|rate| Duration::from_secs_f64(concurrency as f64 / rate.max(1e-3)));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (target, work, next, progress) =
            (target.clone(), work.clone(), next.clone(), progress.clone());
        let ops_max = spec.ops_max;
        let mut rng = StdRng::seed_from_u64(spec.seed.wrapping_add(worker as u64));
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally {
                histograms: BTreeMap::new(),
                failures: BTreeMap::new(),
                errors: Vec::new(),
            };
            let expected_us = interval.map(|i| (i.as_micros() as u64).max(1));
            // Each client's schedule starts at a different offset so that they do not fire
            // together.
            let mut scheduled =
                interval.map(|i| started + i.mul_f64(worker as f64 / concurrency as f64));
            loop {
                if let Some(at) = scheduled {
                    if at >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                }
                if Instant::now() >= deadline {
                    break;
                }
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= ops_max {
                    break;
                }
                let begun = Instant::now();
                let (kind, result) = execute(target.as_ref(), &work, &mut rng, index).await;
                let latency = begun.elapsed();
                match result {
                    Ok(()) => tally.record(kind, latency, expected_us),
                    Err(e) => {
                        *tally.failures.entry(kind).or_default() += 1;
                        if tally.errors.len() < 3 {
                            tally.errors.push(format!("{}: {e:#}", kind.name()));
                        }
                    }
                }
                progress.inc(1);
                if let (Some(at), Some(i)) = (scheduled.as_mut(), interval) {
                    *at += i;
                }
            }
            tally
        }));
    }
    let mut histograms: BTreeMap<OpKind, Histogram<u64>> = BTreeMap::new();
    let mut failures: BTreeMap<OpKind, u64> = BTreeMap::new();
    let mut errors = Vec::new();
    for task in tasks {
        let Ok(tally) = task.await else { continue };
        for (kind, h) in tally.histograms {
            let _ = histograms.entry(kind).or_insert_with(new_histogram).add(&h);
        }
        for (kind, f) in tally.failures {
            *failures.entry(kind).or_default() += f;
        }
        for e in tally.errors {
            if errors.len() < 5 && !errors.contains(&e) {
                errors.push(e);
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish_and_clear();
    let server_cpu = procstat::total_cpu_seconds(&pids) - server_cpu_before;
    let client_cpu = procstat::own_cpu_seconds().unwrap_or(0.0) - client_cpu_before;
    let bytes_after = target.bytes_sent().await;
    let mut overall = new_histogram();
    for h in histograms.values() {
        let _ = overall.add(h);
    }
    let kinds: Vec<OpKind> = histograms
        .keys()
        .chain(failures.keys())
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let by_op = kinds
        .iter()
        .map(|k| {
            let h = histograms.get(k).cloned().unwrap_or_else(new_histogram);
            (
                k.name().to_string(),
                latency_stats(&h, failures.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    let failed: u64 = failures.values().sum();
    // Operations actually performed: with coordinated-omission correction the histograms also
    // hold the synthesised samples, so count completions separately.
    let performed = next.load(Ordering::Relaxed).min(spec.ops_max);
    let succeeded = performed.saturating_sub(failed).max(1);
    let rss: Vec<u64> = pids
        .iter()
        .filter_map(|&p| procstat::resident_bytes(p))
        .collect();
    RunStats {
        system: target.name(),
        workload: workload.to_string(),
        object_bytes,
        concurrency,
        target_rate: spec.target_rate,
        elapsed_s: elapsed,
        ops: performed.saturating_sub(failed),
        failures: failed,
        throughput_ops: performed.saturating_sub(failed) as f64 / elapsed.max(1e-9),
        overall: latency_stats(&overall, failed),
        by_op,
        server_cpu_us_per_op: server_cpu * 1e6 / succeeded as f64,
        client_cpu_us_per_op: client_cpu * 1e6 / succeeded as f64,
        bytes_sent_per_op: match (bytes_before, bytes_after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / succeeded as f64),
            _ => None,
        },
        link_bytes_per_op: None,
        server_rss_bytes: rss.iter().sum(),
        server_rss_max_bytes: rss.iter().copied().max().unwrap_or(0),
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::WorkloadSpec;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// An in-process map that takes `delay` per operation and can scan.
    struct FakeTarget {
        map: Mutex<HashMap<String, Bytes>>,
        delay: Duration,
        sent: AtomicU64,
    }

    impl Target for FakeTarget {
        fn name(&self) -> String {
            "fake".into()
        }
        fn read(&self, key: String) -> BoxFuture<'_, Result<bool>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                Ok(self.map.lock().unwrap().contains_key(&key))
            })
        }
        fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                self.sent.fetch_add(value.len() as u64, Ordering::Relaxed);
                self.map.lock().unwrap().insert(key, value);
                Ok(())
            })
        }
        fn can_scan(&self) -> bool {
            true
        }
        fn scan(&self, _start: String, count: usize) -> BoxFuture<'_, Result<usize>> {
            Box::pin(async move { Ok(count) })
        }
        fn pids(&self) -> Vec<u32> {
            vec![std::process::id()]
        }
        fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>> {
            Box::pin(async { Some(self.sent.load(Ordering::Relaxed)) })
        }
    }

    fn fake(delay: Duration) -> Arc<FakeTarget> {
        Arc::new(FakeTarget {
            map: Mutex::new(HashMap::new()),
            delay,
            sent: AtomicU64::new(0),
        })
    }

    #[tokio::test]
    async fn driver_smoke_test_on_a_fake_target_counts_ops_latency_and_bytes() {
        let target = fake(Duration::from_millis(1));
        let workload = Arc::new(CoreWorkload::new(
            WorkloadSpec::standard('A').unwrap(),
            100,
            400,
        ));
        let mut rng = StdRng::seed_from_u64(0);
        for k in 0..100 {
            target
                .write(
                    crate::ycsb::key_name(k),
                    Bytes::from(workload.record(&mut rng)),
                )
                .await
                .unwrap();
        }
        let spec = RunSpec {
            concurrency: 4,
            ops_max: 400,
            duration: Duration::from_secs(20),
            target_rate: None,
            seed: 1,
        };
        let stats = run(target.clone(), Work::Ycsb(workload), &spec, "ycsb-A", 1000).await;
        assert_eq!(stats.ops, 400);
        assert_eq!(stats.failures, 0, "{:?}", stats.errors);
        assert_eq!(stats.by_op.len(), 2, "reads and updates");
        assert!(stats.overall.p50_ms >= 1.0, "{:?}", stats.overall);
        assert!(stats.overall.p99_ms <= stats.overall.max_ms);
        assert!(stats.throughput_ops > 0.0);
        // About half the operations are updates of 1000-byte records.
        let per_op = stats.bytes_sent_per_op.unwrap();
        assert!((300.0..700.0).contains(&per_op), "{per_op}");
        assert!(stats.server_rss_bytes > 0);
    }

    #[tokio::test]
    async fn driver_smoke_test_corrects_for_coordinated_omission_at_a_target_rate() {
        // 2 clients at 400 ops/s want one operation every 5 ms each; every operation takes 20 ms,
        // so the corrected histogram holds the requests the stall delayed.
        let target = fake(Duration::from_millis(20));
        let spec = RunSpec {
            concurrency: 2,
            ops_max: 40,
            duration: Duration::from_secs(10),
            target_rate: Some(400.0),
            seed: 1,
        };
        let work = Work::Put {
            prefix: "k".into(),
            keys: 10,
            value: Bytes::from_static(b"v"),
        };
        let stats = run(target, work, &spec, "put", 1).await;
        assert_eq!(stats.ops, 40);
        let put = &stats.by_op["update"];
        assert!(
            put.ops > 40,
            "record_correct adds the omitted samples: {put:?}"
        );
        assert!(put.p50_ms < put.max_ms);
        assert!(put.max_ms >= 20.0);
    }

    #[tokio::test]
    async fn driver_smoke_test_reports_failures_with_their_cause() {
        let target = fake(Duration::ZERO);
        let spec = RunSpec {
            concurrency: 2,
            ops_max: 10,
            duration: Duration::from_secs(5),
            target_rate: None,
            seed: 1,
        };
        let work = Work::Get {
            prefix: "missing".into(),
            keys: 3,
        };
        let stats = run(target, work, &spec, "get", 1).await;
        assert_eq!(stats.failures, 10);
        assert_eq!(stats.ops, 0);
        assert!(stats.errors[0].contains("not found"), "{:?}", stats.errors);
    }
}
