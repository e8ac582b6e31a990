//! The demo's membership step: a node joins a running cluster through `bulwark node join` while
//! clients write and read public-key objects; the demo shows which key ranges changed hands, what
//! each node took over, and checks that every acknowledged value is still there and that the
//! whole history of the load is linearizable.

use crate::dev::Nodes;
use anyhow::{Context, Result, bail};
use bulwark_client::Client;
use bulwark_core::NodeId;
use bulwark_core::configuration::Configuration;
use bulwark_core::membership::Moved;
use bulwark_core::sign::SecretKey;
use bulwark_sim::checker::{self, History, Op, OpKind, Outcome};
use bytes::Bytes;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Objects written before the join and read back after it.
const SETTLED: u8 = 24;
/// Objects written and read while the node joins.
const BUSY: u8 = 3;
/// Operations per load client at most: the load is bounded in count as well as time.
const OPS_PER_CLIENT_MAX: u64 = 3_000;
/// How long the moved key ranges may take to be transferred once the epoch is certified.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The demo's owners: fixed keys, so a second run overwrites the same objects.
fn owner(i: u8) -> SecretKey {
    SecretKey::from_seed(&[0xd0 ^ i; 32])
}

/// The history of the load, with real-time intervals for the linearizability checker.
#[derive(Clone)]
struct Recorder {
    started: Instant,
    history: Arc<Mutex<History>>,
}

impl Recorder {
    fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn record(&self, client: u64, object: u8, kind: OpKind, invoke: u64, outcome: Outcome) {
        let complete = (outcome != Outcome::Unknown).then(|| self.now());
        if let Ok(mut history) = self.history.lock() {
            history.push(Op {
                client,
                key: vec![object],
                kind,
                invoke,
                complete,
                outcome,
            });
        }
    }
}

pub(crate) async fn run(client: &Client, nodes: &mut Nodes, dir: &Path, exe: &Path) -> Result<()> {
    let before = client.configuration().await?;
    println!(
        "6. A node joins (`bulwark node join`) while two clients write and read public-key objects:"
    );
    let settled: Vec<Bytes> = (0..SETTLED)
        .map(|i| Bytes::from(format!("object {i}, written before the join")))
        .collect();
    for (i, value) in (0..SETTLED).zip(&settled) {
        client.put_owned(&owner(i), Some(value.clone())).await?;
    }
    let recorder = Recorder {
        started: Instant::now(),
        history: Arc::default(),
    };
    // Values unique to this run, and a first write of each busy object recorded before the load:
    // an earlier run's values are not in this history.
    let run: u32 = rand::random();
    for object in SETTLED..SETTLED + BUSY {
        let value = format!("run {run:08x} first write").into_bytes();
        let invoke = recorder.now();
        client
            .put_owned(&owner(object), Some(Bytes::from(value.clone())))
            .await?;
        recorder.record(2, object, OpKind::Write(Some(value)), invoke, Outcome::Ok);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(dir, &recorder, &stop, run).await?;

    let (port, log_path) = nodes.join(exe)?;
    let asked = Instant::now();
    let wait =
        Duration::from_millis(2 * before.t_epoch_ms + 2 * before.stop_delta_ms) + SETTLE_TIMEOUT;
    let after = loop {
        let config = client.configuration().await?;
        if config.members.iter().any(|m| m.address.port() == port) {
            break config;
        }
        if asked.elapsed() > wait {
            stop.store(true, Ordering::Relaxed);
            bail!(
                "the new node was not certified within {wait:?}; see {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let joined = after
        .members
        .iter()
        .find(|m| m.address.port() == port)
        .map(|m| m.id)
        .context("the new member")?;
    println!(
        "   epoch {} certified with {joined} at 127.0.0.1:{port}, {:.1} s after it asked \
         (epochs last {} s); its log: {}",
        after.epoch.0,
        asked.elapsed().as_secs_f64(),
        after.t_epoch_ms / 1000,
        log_path.display()
    );
    describe_moves(&before, &after)?;

    let settling = Instant::now();
    let statuses = settle(client, &after).await?;
    println!(
        "   every member entered epoch {} and pulled the ranges it serves in a changed group \
         {:.1} s after it was certified (from 2f+1 old members, each version checked against \
         its owner's signature; a member of the old group pulls too, for writes it missed):",
        after.epoch.0,
        settling.elapsed().as_secs_f64()
    );
    for (node, keys, bytes) in statuses {
        if keys > 0 {
            let objects = if keys == 1 { "object" } else { "objects" };
            println!("     {node} pulled {keys} {objects} ({bytes} bytes)");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.context("a load client")?;
    }

    for (i, value) in (0..SETTLED).zip(&settled) {
        let (read, _) = client.get_owned(&owner(i).public_key()).await?;
        if read.as_ref() != Some(value) {
            bail!("object {i} lost its acknowledged value when it moved");
        }
    }
    let history = recorder
        .history
        .lock()
        .map(|h| h.clone())
        .unwrap_or_default();
    let report = checker::check(&history);
    if !report.ok {
        bail!(
            "the history of the load is not linearizable: {:?}",
            report.violations
        );
    }
    println!(
        "   all {SETTLED} objects written before the join read back intact; the {} operations \
         of the load, before, during and after the change, are linearizable",
        report.ops_checked
    );
    Ok(())
}

/// Two clients, a writer and a reader, on the busy objects until `stop`.
async fn start_load(
    dir: &Path,
    recorder: &Recorder,
    stop: &Arc<AtomicBool>,
    run: u32,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let writer = Client::connect(dir, "admin").await?;
    let reader = Client::connect(dir, "reader").await?;
    let mut tasks = Vec::new();
    let (recorder_w, stop_w) = (recorder.clone(), stop.clone());
    tasks.push(tokio::spawn(async move {
        for sequence in 0..OPS_PER_CLIENT_MAX {
            if stop_w.load(Ordering::Relaxed) {
                break;
            }
            let object = SETTLED + (sequence % u64::from(BUSY)) as u8;
            let value = format!("run {run:08x} write {sequence}").into_bytes();
            let invoke = recorder_w.now();
            let outcome = match writer
                .put_owned(&owner(object), Some(Bytes::from(value.clone())))
                .await
            {
                Ok(_) => Outcome::Ok,
                Err(_) => Outcome::Unknown,
            };
            recorder_w.record(0, object, OpKind::Write(Some(value)), invoke, outcome);
        }
    }));
    let (recorder_r, stop_r) = (recorder.clone(), stop.clone());
    tasks.push(tokio::spawn(async move {
        for sequence in 0..OPS_PER_CLIENT_MAX {
            if stop_r.load(Ordering::Relaxed) {
                break;
            }
            let object = SETTLED + (sequence % u64::from(BUSY)) as u8;
            let invoke = recorder_r.now();
            let outcome = match reader.get_owned(&owner(object).public_key()).await {
                Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                Err(_) => Outcome::Unknown,
            };
            recorder_r.record(1, object, OpKind::Read, invoke, outcome);
        }
    }));
    Ok(tasks)
}

/// Prints the key ranges whose group changed from `before` to `after`.
fn describe_moves(before: &Configuration, after: &Configuration) -> Result<()> {
    let old = before.ring().map_err(anyhow::Error::msg)?;
    let new = after.ring().map_err(anyhow::Error::msg)?;
    let moved: Vec<Moved> = new
        .arcs_since(&old)
        .into_iter()
        .filter(Moved::changed)
        .collect();
    let names = |members: &[NodeId]| {
        members
            .iter()
            .map(|node| node.0.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "   {} key ranges (arcs of the ring, by key hash) changed group:",
        moved.len()
    );
    const SHOWN: usize = 8;
    if moved.len() > SHOWN {
        println!("     (the first {SHOWN})");
    }
    for arc in moved.iter().take(SHOWN) {
        println!(
            "     ({}.., {}..]: nodes {} -> {}",
            hex_prefix(&arc.arc.after.0),
            hex_prefix(&arc.arc.upto.0),
            names(arc.old.members()),
            names(arc.new.members())
        );
    }
    Ok(())
}

fn hex_prefix(point: &[u8; 32]) -> String {
    point[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Waits until every member of `after` entered its epoch and finished taking over its key
/// ranges; returns what each took over since it started (keys, bytes).
async fn settle(client: &Client, after: &Configuration) -> Result<Vec<(NodeId, u64, u64)>> {
    let started = Instant::now();
    loop {
        let statuses = client.status().await;
        let mut settled = Vec::new();
        for member in &after.members {
            let stats = statuses
                .iter()
                .find(|(node, _, _)| *node == member.id)
                .and_then(|(_, _, status)| status.as_ref().ok())
                .and_then(|status| status.replicas.iter().find(|r| r.service == "pubkey"))
                .map(|replica| &replica.stats);
            if let Some(stats) =
                stats.filter(|s| s.epoch >= after.epoch.0 && s.transfers_pending == 0)
            {
                settled.push((member.id, stats.transferred_keys, stats.transferred_bytes));
            }
        }
        if settled.len() == after.members.len() {
            return Ok(settled);
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            bail!(
                "{} of {} members finished their transfers within {SETTLE_TIMEOUT:?}",
                settled.len(),
                after.members.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
