//! Placement and configuration dissemination at scale, computed rather than run: the per-node
//! load of Bulwark's ring (`core::membership::Ring`, one position per node) beside a model of
//! virtual positions (not built), what a node joining moves under each, and the three-level
//! multicast of Rosebud §3.6 of the delta, as nodes run it, beside the push of the certificate
//! to every member that nodes did before it.
//!
//! Load is each node's share of the key space (the arcs of the `3f+1` groups it is in), so it is
//! exact: sampling keys would add noise of its own (at 10,000 nodes and a million keys, about 400
//! keys per node, ±5%).

use bulwark_core::configuration::{ConfigDelta, Configuration, MEMBERS_MAX};
use bulwark_core::membership::{
    MULTICAST_HOPS, Member, PlacementParams, Ring, RingPoint, multicast_targets,
};
use bulwark_core::sign::{SecretKey, Signature};
use bulwark_core::{Digest, Epoch, NodeId, wire};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// A ring point's first 64 bits, as a fraction of the ring: exact enough for shares of 10^-6.
fn share_of(point: &RingPoint) -> u64 {
    u64::from_be_bytes(point.0[..8].try_into().unwrap_or_default())
}

/// Where `node`'s `j`-th virtual position would be (the model's hash; `j = 0` is its position
/// on the ring as built).
fn virtual_point(node: NodeId, j: u32) -> RingPoint {
    if j == 0 {
        return RingPoint::of_node(node);
    }
    let mut bytes = b"bulwark.placement.virtual.v1".to_vec();
    bytes.extend_from_slice(&node.0.to_be_bytes());
    bytes.extend_from_slice(&j.to_be_bytes());
    RingPoint::of_key(&bytes)
}

/// A ring of `v` positions per node: each arc between two positions is served by the first
/// `copies` distinct nodes at or after its end.
pub struct VirtualRing {
    copies: usize,
    /// Positions in ring order, with their node.
    points: Vec<(u64, NodeId)>,
}

impl VirtualRing {
    /// `nodes` with `v` positions each (`v = 1` is the ring as built).
    pub fn new(nodes: &[NodeId], v: u32, copies: usize) -> VirtualRing {
        let mut points: Vec<(u64, NodeId)> = nodes
            .iter()
            .flat_map(|&node| (0..v).map(move |j| (share_of(&virtual_point(node, j)), node)))
            .collect();
        points.sort_unstable();
        VirtualRing { copies, points }
    }

    /// The nodes serving the arc that ends at position `at`: the first `copies` distinct ones.
    fn group_from(&self, at: usize) -> Vec<NodeId> {
        let mut group = Vec::with_capacity(self.copies);
        let mut i = at;
        while group.len() < self.copies && group.len() < self.points.len() {
            let node = self.points[i % self.points.len()].1;
            if !group.contains(&node) {
                group.push(node);
            }
            i += 1;
            if i - at > self.points.len() {
                break;
            }
        }
        group
    }

    /// Each arc (its length as a share of 2^64) and its group.
    pub fn arcs(&self) -> Vec<(u64, Vec<NodeId>)> {
        (0..self.points.len())
            .map(|at| {
                let prev = self.points[(at + self.points.len() - 1) % self.points.len()].0;
                let length = self.points[at].0.wrapping_sub(prev);
                (length, self.group_from(at))
            })
            .collect()
    }

    /// Each node's share of the key space, as a fraction of one full copy of it.
    pub fn loads(&self) -> BTreeMap<NodeId, f64> {
        let mut loads: BTreeMap<NodeId, f64> = BTreeMap::new();
        for (length, group) in self.arcs() {
            for node in group {
                *loads.entry(node).or_default() += length as f64 / 2f64.powi(64);
            }
        }
        loads
    }

    /// The group of a key's ring point.
    pub fn group_of(&self, point: &RingPoint) -> Vec<NodeId> {
        let at = self.points.partition_point(|(p, _)| *p < share_of(point));
        self.group_from(at % self.points.len())
    }
}

/// How evenly one placement spreads the key space.
#[derive(Debug)]
pub struct Balance {
    /// Positions per node.
    pub v: u32,
    /// Nodes.
    pub nodes: usize,
    /// Every node's load over the ideal (`copies / nodes`): min, median, max.
    pub min: f64,
    pub median: f64,
    pub max: f64,
    /// Of the nodes, those within 10% of the ideal.
    pub within_10: f64,
    /// Positions the ring holds.
    pub positions: usize,
    /// Nanoseconds per key lookup, measured on this machine.
    pub lookup_ns: f64,
}

/// The balance of `nodes` at `v` positions each, groups of `copies`.
pub fn balance(nodes: &[NodeId], v: u32, copies: usize) -> Balance {
    let ring = VirtualRing::new(nodes, v, copies);
    let ideal = copies as f64 / nodes.len() as f64;
    let mut ratios: Vec<f64> = ring.loads().values().map(|load| load / ideal).collect();
    ratios.sort_by(f64::total_cmp);
    let within = ratios.iter().filter(|r| (**r - 1.0).abs() <= 0.10).count();
    let lookups = 200_000u32;
    let started = Instant::now();
    let mut touched = 0usize;
    for i in 0..lookups {
        let point = RingPoint::of_key(&i.to_be_bytes());
        touched += ring.group_of(&point).len();
    }
    let lookup_ns = started.elapsed().as_nanos() as f64 / f64::from(lookups);
    assert!(touched >= lookups as usize, "every key has a group");
    Balance {
        v,
        nodes: nodes.len(),
        min: ratios.first().copied().unwrap_or(0.0),
        median: ratios.get(ratios.len() / 2).copied().unwrap_or(0.0),
        max: ratios.last().copied().unwrap_or(0.0),
        within_10: within as f64 / ratios.len().max(1) as f64,
        positions: ring.points.len(),
        lookup_ns,
    }
}

/// What one node joining moves.
#[derive(Debug)]
pub struct Join {
    /// Positions per node.
    pub v: u32,
    /// Arcs whose group changed: the pulls the reconfiguration starts.
    pub arcs_changed: usize,
    /// Distinct old groups those arcs are pulled from.
    pub source_groups: usize,
    /// The key space whose group changed, as a fraction of one copy of it.
    pub moved: f64,
}

/// What `joining` moves when it joins `nodes` at `v` positions each.
pub fn join(nodes: &[NodeId], joining: NodeId, v: u32, copies: usize) -> Join {
    let before = VirtualRing::new(nodes, v, copies);
    let mut grown = nodes.to_vec();
    grown.push(joining);
    let after = VirtualRing::new(&grown, v, copies);
    // Cut the ring at every position of either ring; an arc's group in each is its end's.
    let mut ends: Vec<u64> = before
        .points
        .iter()
        .chain(&after.points)
        .map(|(p, _)| *p)
        .collect();
    ends.sort_unstable();
    ends.dedup();
    let mut arcs_changed = 0;
    let mut sources = BTreeSet::new();
    let mut moved = 0.0;
    for (i, end) in ends.iter().enumerate() {
        let prev = ends[(i + ends.len() - 1) % ends.len()];
        let mut point = RingPoint([0; 32]);
        point.0[..8].copy_from_slice(&end.to_be_bytes());
        let (mut old, mut new) = (before.group_of(&point), after.group_of(&point));
        old.sort_unstable();
        new.sort_unstable();
        if old != new {
            arcs_changed += 1;
            moved += end.wrapping_sub(prev) as f64 / 2f64.powi(64);
            sources.insert(old);
        }
    }
    Join {
        v,
        arcs_changed,
        source_groups: sources.len(),
        moved,
    }
}

/// One dissemination scheme's cost for one epoch.
#[derive(Debug)]
pub struct Dissemination {
    /// Communication steps until every node holds the configuration (no failures).
    pub rounds: usize,
    /// Messages the busiest node sends.
    pub max_sends: usize,
    /// Bytes the busiest node sends.
    pub max_bytes_sent: u64,
    /// Bytes an ordinary node receives (median).
    pub median_bytes_received: u64,
    /// Nodes reached, of those up, when `failed` of them are down (before any pull).
    pub reached: f64,
}

/// The multicast of Rosebud §3.6 among `n` nodes in ring order, as nodes run it
/// (`membership::multicast_targets`): each of the CS replicas (starting at ring indices `starts`)
/// sends hop 0, and each receiver the next hop. `down` nodes forward nothing. Returns the
/// messages each node sends and the copies each receives, by ring index.
fn multicast(n: usize, starts: &[usize], down: &BTreeSet<usize>) -> (Vec<usize>, Vec<usize>) {
    let mut sends = vec![0usize; n];
    let mut received = vec![0usize; n];
    for &start in starts {
        let mut holders = vec![start];
        for hop in 0..MULTICAST_HOPS {
            let mut next = Vec::new();
            for at in holders {
                let targets = multicast_targets(n, at, hop);
                sends[at] += targets.len();
                for &target in &targets {
                    received[target] += 1;
                    if !down.contains(&target) {
                        next.push(target);
                    }
                }
            }
            holders = next;
        }
    }
    (sends, received)
}

/// A configuration of `n` members, ids `0..n`, with distinct keys, addresses and fingerprints.
pub fn configuration(n: usize, f_cs: u32) -> Configuration {
    let members = (0..n as u32)
        .map(|id| {
            let key = SecretKey::from_seed(&Digest::of("bench/key", &id.to_be_bytes()).0);
            Member {
                trusted_key: None,
                id: NodeId(id),
                address: std::net::SocketAddr::from((
                    std::net::Ipv4Addr::from(0x0A00_0000 + id),
                    7100,
                )),
                fingerprint: bulwark_core::config::Fingerprint(
                    Digest::of("bench/fingerprint", &id.to_be_bytes()).0,
                ),
                signing_key: key.public_key(),
            }
        })
        .collect();
    let authority = SecretKey::from_seed(&[7; 32]).public_key();
    Configuration::genesis(members, 1, f_cs, authority, 3_600_000, 1_000, 0)
        .unwrap_or_else(|error| panic!("a valid configuration: {error}"))
}

/// The two schemes for a configuration of `n` members with `f_cs`, one member joining and one
/// leaving per epoch, `failed` members down: (the push of the full certificate to every member
/// that CS replicas made before they multicast, the three-level multicast of the delta).
///
/// A configuration holds at most [`MEMBERS_MAX`] members today: beyond that the certificate's
/// size is extrapolated from one of that many, and the CS replicas' starting points are spread
/// by hash rather than chosen from a configuration.
pub fn dissemination(n: usize, f_cs: u32, failed: f64) -> (Dissemination, Dissemination) {
    let config = configuration(n.min(MEMBERS_MAX), f_cs);
    let scale = n as f64 / config.members.len() as f64;
    let cs = 3 * f_cs as usize + 1;
    let quorum = 2 * f_cs as usize + 1;
    let signatures: Vec<(NodeId, Signature)> = (0..quorum as u32)
        .map(|i| (NodeId(i), Signature([0xAB; 64])))
        .collect();
    // A certificate is the whole configuration plus the signatures over it.
    let cert_bytes =
        (config.encode().len() as f64 * scale) as u64 + wire::encode(&signatures).len() as u64;
    let delta = ConfigDelta {
        epoch: Epoch(config.epoch.0 + 1),
        added: vec![config.members[0].clone()],
        dropped: vec![NodeId(1)],
        started_at_ms: 1,
        next_node_id: config.next_node_id + 1,
        signatures,
    };
    let delta_bytes = wire::encode(&delta).len() as u64;

    let down: BTreeSet<usize> = (0..n)
        .filter(|i| {
            let h = Digest::of("bench/down", &(*i as u64).to_be_bytes());
            (u64::from_be_bytes(h.0[..8].try_into().unwrap_or_default()) as f64)
                < failed * u64::MAX as f64
        })
        .collect();
    let up = n - down.len();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };

    // Today: every CS replica sends the certificate to every other member, in one step.
    let push = Dissemination {
        rounds: 1,
        max_sends: n - 1,
        max_bytes_sent: (n as u64 - 1) * cert_bytes,
        median_bytes_received: cs as u64 * cert_bytes,
        reached: 1.0,
    };

    // Each CS replica starts from its own index in ring order (chosen by the digest, §3.7).
    let order: Vec<NodeId> = config
        .ring()
        .map(|ring| ring.members().collect())
        .unwrap_or_default();
    let starts: Vec<usize> = if n <= MEMBERS_MAX {
        config
            .cs()
            .iter()
            .filter_map(|id| order.iter().position(|m| m == id))
            .collect()
    } else {
        (0..cs as u64)
            .map(|i| {
                let h = Digest::of("bench/cs-start", &i.to_be_bytes());
                u64::from_be_bytes(h.0[..8].try_into().unwrap_or_default()) as usize % n
            })
            .collect()
    };
    let (sends, received) = multicast(n, &starts, &down);
    let reached = (0..n)
        .filter(|i| !down.contains(i) && (received[*i] > 0 || starts.contains(i)))
        .count();
    let tree = Dissemination {
        rounds: 3,
        max_sends: sends.iter().copied().max().unwrap_or(0),
        max_bytes_sent: sends.iter().copied().max().unwrap_or(0) as u64 * delta_bytes,
        median_bytes_received: median(received.iter().map(|r| *r as u64 * delta_bytes).collect()),
        reached: reached as f64 / up.max(1) as f64,
    };
    (push, tree)
}

/// The ring as built gives the same groups as the model at one position per node.
pub fn check_model_matches_ring(nodes: &[NodeId], copies: usize, f: usize) -> bool {
    let Ok(ring) = Ring::new(Epoch(1), PlacementParams::new(f), nodes.iter().copied()) else {
        return false;
    };
    let model = VirtualRing::new(nodes, 1, copies);
    (0..2_000u32).all(|i| {
        let point = RingPoint::of_key(&i.to_be_bytes());
        let built: BTreeSet<NodeId> = ring.group_at(point).members().iter().copied().collect();
        let modelled: BTreeSet<NodeId> = model.group_of(&point).into_iter().collect();
        built == modelled
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u32) -> Vec<NodeId> {
        (0..n).map(NodeId).collect()
    }

    #[test]
    fn the_model_at_one_position_is_the_ring_as_built() {
        assert!(check_model_matches_ring(&nodes(200), 4, 1));
        assert!(check_model_matches_ring(&nodes(50), 7, 2));
    }

    #[test]
    fn loads_sum_to_every_copy_of_the_key_space() {
        for v in [1, 8] {
            let total: f64 = VirtualRing::new(&nodes(300), v, 4).loads().values().sum();
            assert!((total - 4.0).abs() < 1e-6, "v={v}: {total}");
        }
    }

    #[test]
    fn more_positions_spread_load_more_evenly() {
        let one = balance(&nodes(1_000), 1, 4);
        let many = balance(&nodes(1_000), 64, 4);
        assert!(many.max < one.max && many.within_10 > one.within_10);
    }

    #[test]
    fn a_join_moves_about_its_share_and_the_multicast_reaches_everyone() {
        let joined = join(&nodes(500), NodeId(10_000), 1, 4);
        assert!(joined.moved > 0.0 && joined.moved < 20.0 * 4.0 / 500.0);
        let (_, tree) = dissemination(1_000, 1, 0.0);
        assert_eq!(tree.reached, 1.0);
    }
}
