//! Counts of refused and dropped messages by peer and reason, for `bulwark status` and metrics.

use bulwark_protocol::service::Rejected;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Distinct (peer, reason) pairs remembered; past this, new pairs are folded into one bucket so a
/// flood of made-up reasons cannot grow memory.
const PAIRS_MAX: usize = 1024;

/// Shared rejection counters.
#[derive(Clone, Default)]
pub struct Rejections(Arc<Mutex<BTreeMap<(String, String), u64>>>);

impl Rejections {
    /// Counts one rejection, logs it with the peer, and exports it as a metric.
    pub fn record(&self, peer: &str, reason: &str) {
        tracing::warn!(peer, reason, "rejected message");
        self.add(peer, reason, 1);
    }

    /// Counts `count` rejections of one kind at once and exports them; the caller logs them.
    pub fn add(&self, peer: &str, reason: &str, count: u64) {
        metrics::counter!("bulwark_node_rejected_total", "peer" => peer.to_string(), "reason" => reason.to_string())
            .increment(count);
        let Ok(mut map) = self.0.lock() else { return };
        let full = map.len() >= PAIRS_MAX;
        let pair = (peer.to_string(), reason.to_string());
        let pair = if full && !map.contains_key(&pair) {
            ("*".to_string(), "other".to_string())
        } else {
            pair
        };
        *map.entry(pair).or_insert(0) += count;
    }

    /// A snapshot.
    pub fn snapshot(&self) -> Vec<Rejected> {
        let Ok(map) = self.0.lock() else {
            return Vec::new();
        };
        map.iter()
            .map(|((peer, reason), count)| Rejected {
                peer: peer.clone(),
                reason: reason.clone(),
                count: *count,
            })
            .collect()
    }
}
