//! `bulwark put`, `get`, `delete` and `status`.

use crate::ClientArgs;
use anyhow::{Context, Result};
use bulwark_client::{Client, OpReport};
use bytes::Bytes;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Objects at least this large get a progress indicator on a terminal.
const PROGRESS_BYTES_MIN: usize = 1024 * 1024;
/// Where client commands record the misbehaviour they observed, in the cluster directory.
const EVIDENCE_LOG: &str = "evidence.log";
/// `bulwark status` reads at most this much of the end of the evidence log.
const EVIDENCE_READ_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// Appends what `report` proves about nodes to the cluster's evidence log, one line per
/// observation: seconds since the epoch, client, node, kind, key. Nodes never report on
/// themselves, so this log (kept by the trusted client side) is what `bulwark status` shows.
fn record_evidence(args: &ClientArgs, key: &str, report: &OpReport) {
    if report.evidence.is_empty() {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut lines = String::new();
    for evidence in &report.evidence {
        lines.push_str(&format!(
            "{now}\t{}\t{}\t{:?}\t{}\n",
            args.client,
            evidence.node.0,
            evidence.kind,
            key.escape_default()
        ));
    }
    let path = args.cluster.join(EVIDENCE_LOG);
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(lines.as_bytes()));
    if let Err(error) = written {
        tracing::warn!(%error, path = %path.display(), "cannot record evidence");
    }
}

/// What the evidence log says about one node.
#[derive(Default)]
struct NodeEvidence {
    /// Observations by kind.
    kinds: std::collections::BTreeMap<String, u64>,
    /// The latest observation: time, client, key.
    latest: (u64, String, String),
}

/// Per node: how often each kind of misbehaviour was observed, and the latest observation.
fn evidence_summary(args: &ClientArgs) -> Vec<String> {
    use std::io::{Seek, SeekFrom};
    let path = args.cluster.join(EVIDENCE_LOG);
    let Ok(mut file) = std::fs::File::open(&path) else {
        return Vec::new();
    };
    let length = file.metadata().map_or(0, |m| m.len());
    let skip = length.saturating_sub(EVIDENCE_READ_BYTES_MAX);
    let mut text = String::new();
    if file.seek(SeekFrom::Start(skip)).is_err() || file.read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    let mut nodes: std::collections::BTreeMap<u32, NodeEvidence> = Default::default();
    // A partial first line after a skip does not parse and is ignored.
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [time, client, node, kind, key] = fields[..] else {
            continue;
        };
        let (Ok(time), Ok(node)) = (time.parse::<u64>(), node.parse::<u32>()) else {
            continue;
        };
        let entry = nodes.entry(node).or_default();
        *entry.kinds.entry(kind.to_string()).or_insert(0) += 1;
        if time >= entry.latest.0 {
            entry.latest = (time, client.to_string(), key.to_string());
        }
    }
    nodes
        .into_iter()
        .map(|(node, NodeEvidence { kinds, latest: (time, client, key) })| {
            let total: u64 = kinds.values().sum();
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            format!(
                "node {node} caught {total} {} ({}); latest by client {client} on key \"{key}\", {} s ago",
                if total == 1 { "time" } else { "times" },
                kinds.join(", "),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
                    .saturating_sub(time)
            )
        })
        .collect()
}

pub async fn connect(args: &ClientArgs) -> Result<Client> {
    let mut client = Client::connect(&args.cluster, &args.client)
        .await
        .with_context(|| {
            format!(
                "connecting as {:?} with {}",
                args.client,
                args.cluster.display()
            )
        })?;
    client.deadline = Duration::from_secs(args.timeout);
    Ok(client)
}

/// A spinner on standard error while a large transfer runs, only when a person is watching.
fn progress(what: &str, bytes: usize) -> Option<indicatif::ProgressBar> {
    if bytes < PROGRESS_BYTES_MIN || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("{what} {}", human_bytes(bytes as u64)));
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

fn finish(bar: Option<indicatif::ProgressBar>, bytes: usize, started: Instant) {
    if let Some(bar) = bar {
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        bar.finish_with_message(format!(
            "{} in {:.2}s ({}/s)",
            human_bytes(bytes as u64),
            seconds,
            human_bytes((bytes as f64 / seconds) as u64)
        ));
    }
}

pub fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

fn summary(report: &OpReport) -> String {
    let nodes: Vec<String> = report.answered.iter().map(|n| n.0.to_string()).collect();
    let mut text = format!(
        "{} of {} nodes answered (nodes {})",
        report.answered.len(),
        report.n,
        nodes.join(",")
    );
    for evidence in &report.evidence {
        text.push_str(&format!(
            "; node {} misbehaved: {:?}",
            evidence.node.0, evidence.kind
        ));
    }
    text
}

pub async fn put(args: &ClientArgs, key: &str, file: Option<PathBuf>) -> Result<()> {
    let value = match file.as_deref() {
        None => read_stdin()?,
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    };
    let client = connect(args).await?;
    let len = value.len();
    let started = Instant::now();
    let bar = progress("storing", len);
    let report = client.put(key.as_bytes(), Bytes::from(value)).await?;
    finish(bar, len, started);
    record_evidence(args, key, &report);
    eprintln!(
        "stored {key:?} ({}): {}",
        human_bytes(len as u64),
        summary(&report)
    );
    Ok(())
}

fn read_stdin() -> Result<Vec<u8>> {
    let mut value = Vec::new();
    // Read one byte past the limit so an oversized input is refused without buffering it all.
    std::io::stdin()
        .take(bulwark_core::OBJECT_BYTES_MAX as u64 + 1)
        .read_to_end(&mut value)
        .context("reading standard input")?;
    Ok(value)
}

pub async fn get(
    args: &ClientArgs,
    key: &str,
    output: Option<PathBuf>,
) -> Result<std::process::ExitCode> {
    let client = connect(args).await?;
    let started = Instant::now();
    let (value, report) = client.get(key.as_bytes()).await?;
    record_evidence(args, key, &report);
    let Some(value) = value else {
        eprintln!("not found: {key:?} ({})", summary(&report));
        return Ok(std::process::ExitCode::from(2));
    };
    finish(progress("fetched", value.len()), value.len(), started);
    match output {
        Some(path) => {
            std::fs::write(&path, &value).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout()
            .write_all(&value)
            .context("writing standard output")?,
    }
    eprintln!(
        "fetched {key:?} ({}): {}",
        human_bytes(value.len() as u64),
        summary(&report)
    );
    Ok(std::process::ExitCode::SUCCESS)
}

pub async fn delete(args: &ClientArgs, key: &str) -> Result<()> {
    let client = connect(args).await?;
    let report = client.delete(key.as_bytes()).await?;
    record_evidence(args, key, &report);
    eprintln!("deleted {key:?}: {}", summary(&report));
    Ok(())
}

pub async fn status(args: &ClientArgs) -> Result<std::process::ExitCode> {
    let client = connect(args).await?;
    let statuses = client.status().await;
    let mut reachable = 0;
    println!(
        "{:<6} {:<22} {:<10} {:<8} {:>8} {:>9} {:>10} {:>9}",
        "node", "address", "state", "version", "objects", "versions", "requests", "rejected"
    );
    for (id, address, status) in &statuses {
        match status {
            Ok(status) => {
                reachable += 1;
                let rejected: u64 = status.rejected.iter().map(|r| r.count).sum();
                println!(
                    "{:<6} {:<22} {:<10} {:<8} {:>8} {:>9} {:>10} {:>9}",
                    id.0,
                    address.to_string(),
                    "up",
                    status.version,
                    status.server.objects,
                    status.server.versions,
                    status.requests,
                    rejected
                );
                for r in &status.rejected {
                    println!(
                        "         rejected {} from {}: {}",
                        r.count, r.peer, r.reason
                    );
                }
                if status.server.damaged_fragments > 0 {
                    println!(
                        "         damaged disk: {} reads found a stored fragment missing or not matching its checksum (withheld, not served)",
                        status.server.damaged_fragments
                    );
                }
            }
            Err(error) => println!(
                "{:<6} {:<22} {:<10} {error}",
                id.0,
                address.to_string(),
                "unreachable"
            ),
        }
    }
    let caught = evidence_summary(args);
    if !caught.is_empty() {
        println!(
            "misbehaviour observed by clients (from {}):",
            args.cluster.join(EVIDENCE_LOG).display()
        );
        for line in caught {
            println!("  {line}");
        }
    }
    let n = statuses.len();
    let f = client.cluster().f;
    println!(
        "{reachable} of {n} nodes reachable; operations need {} (f = {f}, protocol {})",
        n - f,
        client.cluster().protocol
    );
    Ok(if reachable >= n - f {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(3)
    })
}
