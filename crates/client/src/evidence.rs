//! The cluster's evidence log: what clients proved about nodes. Nodes never report on themselves,
//! so this log, kept by the trusted client side in the cluster directory, is what `bulwark status`
//! shows. One line per observation: seconds since the epoch, client, node, kind, detail.

use bulwark_core::evidence::Evidence;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The log's file name in a cluster directory.
pub const LOG_FILE: &str = "evidence.log";
/// A summary reads at most this much of the end of the log.
const READ_BYTES_MAX: u64 = 4 * 1024 * 1024;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Appends `observed` to the log at `path`, and counts each in metrics.
pub fn append(path: &Path, client: &str, observed: &[Evidence]) {
    if observed.is_empty() {
        return;
    }
    let now = now();
    let mut lines = String::new();
    for evidence in observed {
        metrics::counter!("bulwark_client_evidence_total", "node" => evidence.node.0.to_string(), "kind" => evidence.kind.name())
            .increment(1);
        lines.push_str(&format!(
            "{now}\t{client}\t{}\t{}\t{}\n",
            evidence.node.0,
            evidence.kind.name(),
            // Tabs and line breaks would split the record; nothing else needs escaping.
            evidence.detail.replace(['\t', '\n', '\r'], " ")
        ));
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(lines.as_bytes()));
    if let Err(error) = written {
        tracing::warn!(%error, path = %path.display(), "cannot record evidence");
    }
}

/// What the log says about one node.
#[derive(Default)]
struct NodeEvidence {
    kinds: BTreeMap<String, u64>,
    /// The latest observation: time, client, detail.
    latest: (u64, String, String),
}

/// Per node: how often each kind of misbehaviour was observed, and the latest observation, one
/// line each.
pub fn summary(cluster_dir: &Path) -> Vec<String> {
    let path = cluster_dir.join(LOG_FILE);
    let Ok(mut file) = std::fs::File::open(&path) else {
        return Vec::new();
    };
    let length = file.metadata().map_or(0, |m| m.len());
    let skip = length.saturating_sub(READ_BYTES_MAX);
    let mut text = String::new();
    if file.seek(SeekFrom::Start(skip)).is_err() || file.read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    let mut nodes: BTreeMap<u32, NodeEvidence> = BTreeMap::new();
    // A partial first line after a skip does not parse and is ignored.
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [time, client, node, kind, detail] = fields[..] else {
            continue;
        };
        let (Ok(time), Ok(node)) = (time.parse::<u64>(), node.parse::<u32>()) else {
            continue;
        };
        let entry = nodes.entry(node).or_default();
        *entry.kinds.entry(kind.to_string()).or_insert(0) += 1;
        if time >= entry.latest.0 {
            entry.latest = (time, client.to_string(), detail.to_string());
        }
    }
    let now = now();
    nodes
        .into_iter()
        .map(|(node, NodeEvidence { kinds, latest: (time, client, detail) })| {
            let total: u64 = kinds.values().sum();
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            format!(
                "node {node} caught {total} {} ({}); latest by client {client} on {detail}, {} s ago",
                if total == 1 { "time" } else { "times" },
                kinds.join(", "),
                now.saturating_sub(time)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::NodeId;
    use bulwark_core::evidence::EvidenceKind;

    #[test]
    fn appended_evidence_is_summarised_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        append(
            &path,
            "admin",
            &[
                Evidence::new(NodeId(3), EvidenceKind::CorruptFragment).with_detail("key \"k\""),
                Evidence::new(NodeId(3), EvidenceKind::CorruptFragment),
                Evidence::new(NodeId(1), EvidenceKind::ForgedVersion).with_detail("tab\there"),
            ],
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"garbage line\n")
            .unwrap();
        let lines = summary(dir.path());
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("node 1 caught 1 time (forged_version 1)"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("node 3 caught 2 times (corrupt_fragment 2)"),
            "{lines:?}"
        );
    }
}
