//! Who the members are, apart from where they sit: identities ([`Member`]) and the placement of
//! keys on replica groups by consistent hashing (Rosebud §2.3).
//!
//! Every member has a position on a ring of 2^256 points, and so does every key. A key is stored
//! by the first `3f+1` members whose positions are equal to or follow the key's point, clockwise
//! and wrapping around, as in Chord. The members between two neighbours on the ring therefore
//! serve the same keys: each member starts exactly one group, so a placement of `N` members has
//! `N` groups, and each member belongs to `3f+1` of them.
//!
//! Positions are SHA-256 (Rosebud spec §8.18: SHA-1 is broken, so m = 256) of a domain string and
//! the member's [`NodeId`]. Node ids are assigned by whoever writes the configuration, never by
//! the node, so a node cannot pick its place on the ring (Rosebud §3.2). Everything here is a
//! pure function of the member list and the parameters, so every node and client that holds the
//! same configuration computes the same groups.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::config::Fingerprint;
use crate::ids::{Epoch, GroupId, NodeId, Slot};
use crate::sign::PublicKey;

/// The domain a member's ring position is hashed under. Changing it moves every key.
const NODE_DOMAIN: &[u8] = b"bulwark.placement.node.v1";
/// The domain a key's ring point is hashed under. Changing it moves every key.
const KEY_DOMAIN: &[u8] = b"bulwark.placement.key.v1";

/// A storage node as the configuration lists it: its stable identity, where to reach it, the TLS
/// certificate it must present, and the key it signs with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its id, stable for as long as it is a member, whatever groups it is in.
    pub id: NodeId,
    /// Where clients and peers reach it.
    pub address: SocketAddr,
    /// Its pinned TLS certificate.
    pub fingerprint: Fingerprint,
    /// The key its transferable statements (and proofs against it) verify under.
    pub signing_key: PublicKey,
    /// The key of its trusted log (A2M), if it has one: what its attestations verify under.
    pub trusted_key: Option<PublicKey>,
}

/// A point on the ring: 256 bits, compared as a big-endian number.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RingPoint(pub [u8; 32]);

impl RingPoint {
    /// The position of the member `node`: `SHA-256("bulwark.placement.node.v1" || id as u32 BE)`.
    pub fn of_node(node: NodeId) -> RingPoint {
        RingPoint::hash(NODE_DOMAIN, &node.0.to_be_bytes())
    }

    /// The point of `key`: `SHA-256("bulwark.placement.key.v1" || key)`. Hashing spreads keys
    /// evenly whatever their names, and one fixed domain per use keeps key points and node
    /// positions from being computed from the same input.
    pub fn of_key(key: &[u8]) -> RingPoint {
        RingPoint::hash(KEY_DOMAIN, key)
    }

    fn hash(domain: &[u8], data: &[u8]) -> RingPoint {
        let mut hasher = sha2::Sha256::new();
        hasher.update(domain);
        hasher.update(data);
        RingPoint(hasher.finalize().into())
    }
}

impl fmt::Debug for RingPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RingPoint({})", &hex::encode(self.0)[..12])
    }
}

/// How large the groups are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlacementParams {
    /// Faults tolerated per group: groups have `3f+1` members.
    pub f: usize,
}

impl PlacementParams {
    /// Groups of `3f+1` tolerating `f` Byzantine members each.
    pub fn new(f: usize) -> PlacementParams {
        PlacementParams { f }
    }

    /// Members per group. Saturates, so an absurd `f` asks for more members than any list has
    /// and is refused as such.
    pub fn group_size(&self) -> usize {
        self.f.saturating_mul(3).saturating_add(1)
    }
}

/// Why a member list or a group cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A group needs `3f+1` distinct members, so the ring must have at least that many.
    #[error("{members} members cannot form groups of {needed}")]
    TooFewMembers {
        /// Members offered.
        members: usize,
        /// The group size.
        needed: usize,
    },
    /// Two members with one id.
    #[error("{0} is listed twice")]
    DuplicateId(NodeId),
    /// Two members claim one identity (address, certificate or signing key). One principal in two
    /// places would count twice towards a group's `3f+1`, so a single fault could be two.
    #[error("{first} and {second} share {what}")]
    SharedIdentity {
        /// The lower id.
        first: NodeId,
        /// The higher id.
        second: NodeId,
        /// Which field they share.
        what: &'static str,
    },
    /// A group must have members.
    #[error("a group needs members")]
    EmptyGroup,
    /// A node listed twice in one group would hold two slots.
    #[error("{0} appears twice in the group")]
    DuplicateInGroup(NodeId),
}

/// Checks that the members of `by_id`, sorted by id, are distinct principals: no id twice, and no
/// address, certificate or signing key shared by two ids. Errors name the lowest offending ids,
/// so every node reports the same problem for the same list.
///
/// [`Placement::new`] and the certified configuration (`configuration::Configuration`) share it,
/// so both refuse the same lists with the same errors.
pub(crate) fn check_identities(by_id: &[Member]) -> Result<(), PlacementError> {
    let mut addresses = BTreeMap::new();
    let mut fingerprints = BTreeMap::new();
    let mut keys = BTreeMap::new();
    let mut trusted_keys = BTreeMap::new();
    for (i, member) in by_id.iter().enumerate() {
        if i > 0 && by_id[i - 1].id == member.id {
            return Err(PlacementError::DuplicateId(member.id));
        }
        let shared = |first, what| PlacementError::SharedIdentity {
            first,
            second: member.id,
            what,
        };
        if let Some(first) = addresses.insert(member.address, member.id) {
            return Err(shared(first, "an address"));
        }
        if let Some(first) = fingerprints.insert(member.fingerprint, member.id) {
            return Err(shared(first, "a certificate fingerprint"));
        }
        if let Some(first) = keys.insert(member.signing_key, member.id) {
            return Err(shared(first, "a signing key"));
        }
        if let Some(trusted) = member.trusted_key
            && let Some(first) = trusted_keys.insert(trusted, member.id)
        {
            return Err(shared(first, "a trusted-log key"));
        }
    }
    Ok(())
}

/// One replica group in one epoch: its members in slot order.
///
/// Protocol machines work in slots (`0..n`); drivers translate slots to nodes and back through
/// this view.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupView {
    id: GroupId,
    epoch: Epoch,
    members: Vec<NodeId>,
}

impl GroupView {
    /// A group with `members` in slot order, refusing an empty list or a node listed twice.
    pub fn new(
        id: GroupId,
        epoch: Epoch,
        members: Vec<NodeId>,
    ) -> Result<GroupView, PlacementError> {
        if members.is_empty() {
            return Err(PlacementError::EmptyGroup);
        }
        for (i, node) in members.iter().enumerate() {
            if members[..i].contains(node) {
                return Err(PlacementError::DuplicateInGroup(*node));
            }
        }
        Ok(GroupView { id, epoch, members })
    }

    /// Which group.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// The epoch of the configuration the view comes from.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The members, slot 0 first.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// `n`, the number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true: a view always has members. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `node` is a member.
    pub fn contains(&self, node: NodeId) -> bool {
        self.members.contains(&node)
    }

    /// `node`'s slot, if it is a member.
    pub fn slot_of(&self, node: NodeId) -> Option<Slot> {
        let index = self.members.iter().position(|&member| member == node)?;
        u32::try_from(index).ok().map(Slot)
    }

    /// The node in `slot`, if the slot exists.
    pub fn node(&self, slot: Slot) -> Option<NodeId> {
        self.members.get(slot.index()).copied()
    }
}

/// The groups of one configuration: members on the ring, and which of them serve each key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    ring: Ring,
    members: BTreeMap<NodeId, Member>,
}

impl Placement {
    /// Places `members` (in any order) for `epoch`.
    ///
    /// Refuses fewer than `3f+1` members, repeated ids, and two members sharing an address, a
    /// certificate or a signing key. Errors name the lowest offending ids, so every node reports
    /// the same problem for the same list.
    pub fn new(
        epoch: Epoch,
        params: PlacementParams,
        members: Vec<Member>,
    ) -> Result<Placement, PlacementError> {
        let needed = params.group_size();
        if members.len() < needed {
            return Err(PlacementError::TooFewMembers {
                members: members.len(),
                needed,
            });
        }
        let mut by_id = members;
        by_id.sort_by_key(|member| member.id);
        check_identities(&by_id)?;
        let ring = Ring::new(epoch, params, by_id.iter().map(|member| member.id))?;
        let members = by_id
            .into_iter()
            .map(|member| (member.id, member))
            .collect();
        Ok(Placement { ring, members })
    }

    /// The ring alone: who serves which keys, without addresses or keys.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The epoch whose configuration this is.
    pub fn epoch(&self) -> Epoch {
        self.ring.epoch
    }

    /// The group parameters.
    pub fn params(&self) -> PlacementParams {
        self.ring.params
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Never true: a placement has at least `3f+1` members. (For clippy's
    /// `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.ring.points.is_empty()
    }

    /// The members in ring order.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.ring
            .points
            .iter()
            .filter_map(|(_, id)| self.members.get(id))
    }

    /// The member `node`, if it is one.
    pub fn member(&self, node: NodeId) -> Option<&Member> {
        self.members.get(&node)
    }

    /// The group that serves `key`.
    pub fn group_of(&self, key: &[u8]) -> GroupView {
        self.ring.group_of(key)
    }

    /// The group that serves `point`.
    pub fn group_at(&self, point: RingPoint) -> GroupView {
        self.ring.group_at(point)
    }

    /// Every group, in ring order of their first members.
    pub fn groups(&self) -> Vec<GroupView> {
        self.ring.groups()
    }

    /// The group with `id`, if this placement has it.
    pub fn group(&self, id: GroupId) -> Option<GroupView> {
        self.ring.group(id)
    }

    /// The groups `node` is a member of.
    pub fn groups_of(&self, node: NodeId) -> Vec<GroupView> {
        self.ring.groups_of(node)
    }
}

/// The ring of one epoch's members, by id only: which group serves each key, and how the groups
/// of two epochs differ. Everything about placement that needs no address or key lives here, so
/// machines that move data between epochs compute it from ids alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    epoch: Epoch,
    params: PlacementParams,
    /// Members in ring order: by position, then id (two ids on one position would need a SHA-256
    /// collision, but the order must be total for every node to agree).
    points: Vec<(RingPoint, NodeId)>,
    /// Each member's index in `points`.
    index: BTreeMap<NodeId, usize>,
}

impl Ring {
    /// The ring of `members` for `epoch`: at least `3f+1` distinct ids.
    pub fn new(
        epoch: Epoch,
        params: PlacementParams,
        members: impl IntoIterator<Item = NodeId>,
    ) -> Result<Ring, PlacementError> {
        let mut ids: Vec<NodeId> = members.into_iter().collect();
        ids.sort_unstable();
        if let Some(pair) = ids.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(PlacementError::DuplicateId(pair[0]));
        }
        let needed = params.group_size();
        if ids.len() < needed {
            return Err(PlacementError::TooFewMembers {
                members: ids.len(),
                needed,
            });
        }
        let mut points: Vec<(RingPoint, NodeId)> = ids
            .into_iter()
            .map(|id| (RingPoint::of_node(id), id))
            .collect();
        points.sort_unstable();
        let index = points
            .iter()
            .enumerate()
            .map(|(i, (_, id))| (*id, i))
            .collect();
        Ok(Ring {
            epoch,
            params,
            points,
            index,
        })
    }

    /// The epoch whose configuration this is.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The group parameters.
    pub fn params(&self) -> PlacementParams {
        self.params
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Never true: a ring has at least `3f+1` members. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Whether `node` is a member.
    pub fn contains(&self, node: NodeId) -> bool {
        self.index.contains_key(&node)
    }

    /// The members in ring order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.points.iter().map(|(_, id)| *id)
    }

    /// The group that serves `key`.
    pub fn group_of(&self, key: &[u8]) -> GroupView {
        self.group_at(RingPoint::of_key(key))
    }

    /// The group that serves `point`: the first `3f+1` members at or after it, clockwise.
    pub fn group_at(&self, point: RingPoint) -> GroupView {
        let first = self
            .points
            .partition_point(|(position, _)| *position < point);
        // Past the last member the ring wraps to the first.
        self.group_starting_at(if first == self.points.len() { 0 } else { first })
    }

    /// Every group, in ring order of their first members: one per member, because the keys
    /// between a member and its predecessor are exactly the keys whose group starts there.
    pub fn groups(&self) -> Vec<GroupView> {
        if self.is_one_group() {
            return vec![self.group_starting_at(0)];
        }
        (0..self.points.len())
            .map(|start| self.group_starting_at(start))
            .collect()
    }

    /// The group with `id`, if this ring has it.
    pub fn group(&self, id: GroupId) -> Option<GroupView> {
        if self.is_one_group() {
            return Some(self.group_starting_at(0)).filter(|group| group.id == id);
        }
        self.index
            .get(&NodeId(id.0))
            .map(|&start| self.group_starting_at(start))
    }

    /// The groups `node` is a member of, in ring order of their first members: `3f+1` of them
    /// for a member (those starting at it and at each of its `3f` predecessors), none otherwise.
    pub fn groups_of(&self, node: NodeId) -> Vec<GroupView> {
        let Some(&at) = self.index.get(&node) else {
            return Vec::new();
        };
        if self.is_one_group() {
            return vec![self.group_starting_at(0)];
        }
        let ring = self.points.len();
        let mut starts: Vec<usize> = (0..self.params.group_size())
            .map(|back| (at + ring - back) % ring)
            .collect();
        starts.sort_unstable();
        starts
            .into_iter()
            .map(|start| self.group_starting_at(start))
            .collect()
    }

    /// How the ring changed from `before` to `self`, cut into the arcs on which neither ring has
    /// a member position: on each, one group of `before` and one of `self` serve every key.
    /// Arcs are in ring order of their ends; together they cover the ring exactly once.
    pub fn arcs_since(&self, before: &Ring) -> Vec<Moved> {
        let mut ends: Vec<RingPoint> = self
            .points
            .iter()
            .chain(&before.points)
            .map(|(point, _)| *point)
            .collect();
        ends.sort_unstable();
        ends.dedup();
        (0..ends.len())
            .map(|i| {
                let upto = ends[i];
                let after = ends[(i + ends.len() - 1) % ends.len()];
                Moved {
                    arc: Arc { after, upto },
                    old: before.group_at(upto),
                    new: self.group_at(upto),
                }
            })
            .collect()
    }

    /// With exactly `3f+1` members every rotation of the ring is the same set of nodes, so the
    /// configuration has one group, not `3f+1` that differ only in slot order.
    fn is_one_group(&self) -> bool {
        self.points.len() == self.params.group_size()
    }

    /// The one group of a configuration of exactly `3f+1` members: slots in id order, named by
    /// the lowest id, as a single-group cluster always was (node `i` in slot `i`).
    fn the_one_group(&self) -> GroupView {
        let mut members: Vec<NodeId> = self.members().collect();
        members.sort_unstable();
        GroupView {
            id: GroupId(members.first().map_or(0, |id| id.0)),
            epoch: self.epoch,
            members,
        }
    }

    /// The group whose slot 0 is `points[start]`.
    ///
    /// Its id is its first member's [`NodeId`]: unique within a ring (each member starts one
    /// group), computable by anyone from the configuration, and unchanged across epochs for as
    /// long as that member stays, even as members elsewhere on the ring come and go. The group's
    /// members may still change between epochs; `(id, epoch)` names one membership.
    fn group_starting_at(&self, start: usize) -> GroupView {
        if self.is_one_group() {
            return self.the_one_group();
        }
        let ring = self.points.len();
        let members = (0..self.params.group_size())
            .map(|offset| self.points[(start + offset) % ring].1)
            .collect();
        GroupView {
            id: GroupId(self.points[start].1.0),
            epoch: self.epoch,
            members,
        }
    }
}

/// The points after `after` up to and including `upto`, clockwise, wrapping past the top of the
/// ring; `after == upto` is the whole ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arc {
    /// Exclusive start.
    pub after: RingPoint,
    /// Inclusive end.
    pub upto: RingPoint,
}

impl Arc {
    /// Whether `point` lies on the arc.
    pub fn contains(&self, point: RingPoint) -> bool {
        match self.after.cmp(&self.upto) {
            std::cmp::Ordering::Less => self.after < point && point <= self.upto,
            std::cmp::Ordering::Greater => point > self.after || point <= self.upto,
            std::cmp::Ordering::Equal => true,
        }
    }
}

/// One arc of the ring and the groups that serve it before and after a reconfiguration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The keys.
    pub arc: Arc,
    /// Their group in the earlier epoch.
    pub old: GroupView,
    /// Their group in the later one.
    pub new: GroupView,
}

impl Moved {
    /// Whether the keys changed hands: the later group is not the same set of nodes.
    pub fn changed(&self) -> bool {
        let mut old = self.old.members.clone();
        let mut new = self.new.members.clone();
        old.sort_unstable();
        new.sort_unstable();
        old != new
    }
}

/// The hops of Rosebud §3.6's three-level multicast of a new configuration.
pub const MULTICAST_HOPS: u8 = 3;

/// Where a node at ring index `at` of `n` nodes (the new configuration's members in ring order)
/// sends a new configuration it received at hop `hop` (0: it is a CS replica starting the
/// multicast), as ring indices, itself included where the rule names it; `k = ⌈∛n⌉`. Hop 0 sends
/// to the nodes `i·k²` after `at`, hop 1 to those `i·k` after it, hop 2 to its `k` successors
/// (`i < k`), so the nodes `i·k² + j·k + l` after a starting replica, every node, hold it after
/// three hops, each node sending at most `k` copies per hop it takes part in.
pub fn multicast_targets(n: usize, at: usize, hop: u8) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let k = multicast_fanout(n);
    let offsets: Vec<usize> = match hop {
        0 => (0..k).map(|i| i * k * k).collect(),
        1 => (0..k).map(|i| i * k).collect(),
        2 => (1..=k).collect(),
        _ => Vec::new(),
    };
    let mut targets: Vec<usize> = Vec::with_capacity(offsets.len());
    for offset in offsets {
        let target = (at + offset % n) % n;
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    targets
}

/// `k = ⌈∛n⌉`, the multicast's fan-out per hop, for `n` nodes.
pub fn multicast_fanout(n: usize) -> usize {
    let mut k = (n as f64).cbrt().round() as usize;
    // Exact in integers: the smallest k with k³ >= n.
    while k.saturating_mul(k).saturating_mul(k) < n {
        k += 1;
    }
    while k > 1 && (k - 1) * (k - 1) * (k - 1) >= n {
        k -= 1;
    }
    k.max(1)
}

/// One life of a register group: its members in slot order and the epoch since which exactly
/// they, in that order, have been the group of the key's arc. A group unchanged across epochs
/// keeps its incarnation; one that changes, even in order only, begins a new one, also when it
/// becomes again a group it was before. What a writer authenticates for one incarnation is
/// checked by that incarnation's members only, so a version carried into the next is judged
/// there by what its members hold, never by a MAC made for nodes before them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Incarnation(pub crate::Digest);

impl Incarnation {
    /// The incarnation of `members`, in slot order, begun in `since`.
    pub fn new(members: &[NodeId], since: Epoch) -> Incarnation {
        let mut bytes = Vec::with_capacity(8 + 4 * members.len());
        bytes.extend_from_slice(&since.0.to_be_bytes());
        for member in members {
            bytes.extend_from_slice(&member.0.to_be_bytes());
        }
        Incarnation(crate::Digest::of(DOMAIN_INCARNATION, &bytes))
    }
}

impl fmt::Debug for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Incarnation({:02x}{:02x}..)", self.0.0[0], self.0.0[1])
    }
}

const DOMAIN_INCARNATION: &str = "bulwark 2026 register group incarnation";

/// The rings a party holds, verified: every epoch's from the first it knows (the genesis) on,
/// and the signing keys of the members they name, where the party knows them.
#[derive(Clone, Debug)]
pub struct Chain {
    rings: Vec<std::sync::Arc<Ring>>,
    keys: BTreeMap<NodeId, PublicKey>,
}

impl Chain {
    /// A chain of `rings`, the first the genesis, each the next epoch's.
    pub fn new(rings: Vec<std::sync::Arc<Ring>>) -> Chain {
        assert!(!rings.is_empty(), "a chain starts at the genesis");
        for pair in rings.windows(2) {
            assert_eq!(
                pair[1].epoch().0,
                pair[0].epoch().0 + 1,
                "a chain holds every epoch in order"
            );
        }
        Chain {
            rings,
            keys: BTreeMap::new(),
        }
    }

    /// The same chain, knowing `keys` too: each member's key, as the configuration that
    /// certified it says.
    pub fn with_keys(mut self, keys: impl IntoIterator<Item = (NodeId, PublicKey)>) -> Chain {
        self.keys.extend(keys);
        self
    }

    /// The signing key of member `node`, if the chain knows it.
    pub fn signing_key(&self, node: NodeId) -> Option<&PublicKey> {
        self.keys.get(&node)
    }

    /// The ring of `epoch`, if the chain reaches it.
    pub fn ring(&self, epoch: Epoch) -> Option<&std::sync::Arc<Ring>> {
        let at = epoch.0.checked_sub(self.genesis().epoch().0)?;
        usize::try_from(at).ok().and_then(|at| self.rings.get(at))
    }

    /// The first ring.
    pub fn genesis(&self) -> &std::sync::Arc<Ring> {
        &self.rings[0]
    }

    /// The newest epoch.
    pub fn latest(&self) -> Epoch {
        self.newest().epoch()
    }

    /// The newest ring.
    pub fn newest(&self) -> &std::sync::Arc<Ring> {
        let Some(ring) = self.rings.last() else {
            unreachable!("a chain starts at the genesis")
        };
        ring
    }

    /// The rings of the epochs after `epoch`, oldest first.
    pub fn after(&self, epoch: Epoch) -> impl Iterator<Item = &std::sync::Arc<Ring>> {
        self.rings.iter().filter(move |ring| ring.epoch() > epoch)
    }

    /// Appends the next epoch's ring.
    pub fn push(&mut self, ring: std::sync::Arc<Ring>) {
        assert_eq!(
            ring.epoch().0,
            self.latest().0 + 1,
            "epochs follow one another"
        );
        self.rings.push(ring);
    }

    /// The group serving `point` in `epoch` and its incarnation: the epoch is walked back while
    /// the same members, in the same order, served the point. Every party holds the chain from
    /// the genesis, so writers and nodes agree on it. `None` when the chain does not reach
    /// `epoch`.
    pub fn incarnation(&self, epoch: Epoch, point: RingPoint) -> Option<(GroupView, Incarnation)> {
        let group = self.ring(epoch)?.group_at(point);
        let mut since = epoch;
        while since > self.genesis().epoch() {
            let before = Epoch(since.0 - 1);
            match self.ring(before) {
                Some(ring) if ring.group_at(point).members() == group.members() => since = before,
                _ => break,
            }
        }
        let incarnation = Incarnation::new(group.members(), since);
        Some((group, incarnation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::SecretKey;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;
    use std::sync::LazyLock;

    /// Distinct public keys, made once: deriving one costs a scalar multiplication.
    static KEYS: LazyLock<Vec<PublicKey>> = LazyLock::new(|| {
        (0..64u8)
            .map(|i| SecretKey::from_seed(&[i; 32]).public_key())
            .collect()
    });

    fn member(id: u32, key: usize) -> Member {
        Member {
            trusted_key: None,
            id: NodeId(id),
            address: SocketAddr::from((Ipv4Addr::from(id), 7000)),
            fingerprint: Fingerprint(blake3::hash(&id.to_be_bytes()).into()),
            signing_key: KEYS[key],
        }
    }

    fn members(ids: impl IntoIterator<Item = u32>) -> Vec<Member> {
        ids.into_iter()
            .enumerate()
            .map(|(i, id)| member(id, i))
            .collect()
    }

    fn placement(f: usize, ids: impl IntoIterator<Item = u32>) -> Placement {
        Placement::new(Epoch(3), PlacementParams::new(f), members(ids)).unwrap()
    }

    /// The successors of `point` computed the slow, obvious way.
    fn successors(ids: &[u32], n: usize, point: RingPoint) -> Vec<NodeId> {
        let mut ring: Vec<(RingPoint, NodeId)> = ids
            .iter()
            .map(|&id| (RingPoint::of_node(NodeId(id)), NodeId(id)))
            .collect();
        ring.sort();
        let after: Vec<NodeId> = ring
            .iter()
            .filter(|(position, _)| *position >= point)
            .chain(ring.iter().filter(|(position, _)| *position < point))
            .map(|&(_, id)| id)
            .collect();
        after[..n].to_vec()
    }

    #[test]
    fn positions_are_pinned() {
        // Changing the derivation moves every key in every deployed cluster: do it on purpose.
        assert_eq!(
            hex::encode(RingPoint::of_node(NodeId(0)).0),
            "7bbbbb9ae4b13f8a325439318e08d0e5e1f218dfec51ba3719e7fcc401d014d0"
        );
        assert_eq!(
            hex::encode(RingPoint::of_node(NodeId(7)).0),
            "7f465b0bee46c5984d89cfb777066fddc2a741ecb619b769c85d705faac06dca"
        );
        assert_eq!(
            hex::encode(RingPoint::of_key(b"hello").0),
            "c98985cdd4770b2a109039d368df5c46b9cd3b2706916bf252d0cc689255d128"
        );
    }

    #[test]
    fn with_seven_members_and_f_1_every_member_is_in_four_groups() {
        let placement = placement(1, 0..7);
        let groups = placement.groups();
        assert_eq!(groups.len(), 7);
        for node in (0..7).map(NodeId) {
            let of = placement.groups_of(node);
            assert_eq!(of.len(), 4, "{node}");
            assert_eq!(
                of,
                groups
                    .iter()
                    .filter(|g| g.contains(node))
                    .cloned()
                    .collect::<Vec<_>>()
            );
            // One of them starts at the node, where it has slot 0; in the others it is further
            // round.
            let mut slots: Vec<Slot> = of.iter().map(|g| g.slot_of(node).unwrap()).collect();
            slots.sort();
            assert_eq!(slots, (0..4).map(Slot).collect::<Vec<_>>());
        }
        assert!(placement.groups_of(NodeId(99)).is_empty());
    }

    #[test]
    fn a_key_goes_to_the_members_at_or_after_its_point_wrapping_round() {
        let placement = placement(1, 0..7);
        let ring: Vec<NodeId> = placement.members().map(|m| m.id).collect();
        let ids: Vec<u32> = (0..7).collect();

        // After the last position: wraps to the first members.
        let top = placement.group_at(RingPoint([0xff; 32]));
        assert_eq!(top.members(), &ring[..4]);
        assert_eq!(top.members(), successors(&ids, 4, RingPoint([0xff; 32])));
        // Before the first position: the same group, without wrapping.
        assert_eq!(placement.group_at(RingPoint([0; 32])), top);

        // Exactly on a member's position: that member is first ("equal to or follow").
        for (i, &node) in ring.iter().enumerate() {
            let at = RingPoint::of_node(node);
            let group = placement.group_at(at);
            assert_eq!(group.node(Slot(0)), Some(node));
            assert_eq!(group.id(), GroupId(node.0));
            let expected: Vec<NodeId> = (0..4).map(|k| ring[(i + k) % 7]).collect();
            assert_eq!(group.members(), expected);
            // One past the previous member's position lands on the same group; for the first
            // member that point lies past the last member, and wraps.
            let mut after_previous = RingPoint::of_node(ring[(i + 6) % 7]).0;
            increment(&mut after_previous);
            assert_eq!(placement.group_at(RingPoint(after_previous)), group);
        }
        // The groups starting at the last three members wrap round the top of the ring.
        let last = placement.group(GroupId(ring[6].0)).unwrap();
        assert_eq!(last.members(), &[ring[6], ring[0], ring[1], ring[2]]);
    }

    fn increment(point: &mut [u8; 32]) {
        for byte in point.iter_mut().rev() {
            let (sum, carry) = byte.overflowing_add(1);
            *byte = sum;
            if !carry {
                return;
            }
        }
    }

    #[test]
    fn with_exactly_3f_plus_1_members_there_is_one_group_in_id_order() {
        let placement = placement(1, [40, 10, 30, 20]);
        let groups = placement.groups();
        assert_eq!(groups.len(), 1);
        let group = &groups[0];
        assert_eq!(group.id(), GroupId(10));
        assert_eq!(
            group.members(),
            &[NodeId(10), NodeId(20), NodeId(30), NodeId(40)]
        );
        assert_eq!(group.epoch(), Epoch(3));
        for key in [&b"a"[..], b"b", b"another key"] {
            assert_eq!(&placement.group_of(key), group);
        }
        assert_eq!(placement.groups_of(NodeId(30)), groups);
        assert_eq!(placement.group(GroupId(10)), Some(group.clone()));
        assert_eq!(placement.group(GroupId(20)), None);
    }

    #[test]
    fn unusable_member_lists_are_refused() {
        let params = PlacementParams::new(1);
        assert_eq!(
            Placement::new(Epoch(0), params, members(0..3)),
            Err(PlacementError::TooFewMembers {
                members: 3,
                needed: 4
            })
        );
        assert!(matches!(
            Placement::new(Epoch(0), PlacementParams::new(usize::MAX), members(0..4)),
            Err(PlacementError::TooFewMembers { .. })
        ));

        let mut twice = members(0..5);
        twice[4].id = NodeId(2);
        twice[4].address = SocketAddr::from(([10, 9, 9, 9], 1));
        assert_eq!(
            Placement::new(Epoch(0), params, twice),
            Err(PlacementError::DuplicateId(NodeId(2)))
        );

        let mut shared = members(0..5);
        shared[1].address = shared[3].address;
        assert_eq!(
            Placement::new(Epoch(0), params, shared),
            Err(PlacementError::SharedIdentity {
                first: NodeId(1),
                second: NodeId(3),
                what: "an address"
            })
        );
        let mut shared = members(0..5);
        shared[4].fingerprint = shared[0].fingerprint;
        assert!(matches!(
            Placement::new(Epoch(0), params, shared),
            Err(PlacementError::SharedIdentity {
                what: "a certificate fingerprint",
                ..
            })
        ));
        let mut shared = members(0..5);
        shared[2].signing_key = shared[0].signing_key;
        assert!(matches!(
            Placement::new(Epoch(0), params, shared),
            Err(PlacementError::SharedIdentity {
                what: "a signing key",
                ..
            })
        ));
    }

    #[test]
    fn group_views_translate_slots_and_nodes() {
        let view =
            GroupView::new(GroupId(5), Epoch(1), vec![NodeId(5), NodeId(9), NodeId(2)]).unwrap();
        assert_eq!(view.slot_of(NodeId(9)), Some(Slot(1)));
        assert_eq!(view.node(Slot(2)), Some(NodeId(2)));
        assert_eq!(view.slot_of(NodeId(4)), None);
        assert_eq!(view.node(Slot(3)), None);
        assert_eq!(view.len(), 3);
        assert!(!view.is_empty());
        assert_eq!(
            GroupView::new(GroupId(5), Epoch(1), vec![]),
            Err(PlacementError::EmptyGroup)
        );
        assert_eq!(
            GroupView::new(GroupId(5), Epoch(1), vec![NodeId(1), NodeId(2), NodeId(1)]),
            Err(PlacementError::DuplicateInGroup(NodeId(1)))
        );
    }

    #[test]
    fn members_round_trip_through_the_wire_and_toml() {
        let member = member(3, 3);
        assert_eq!(
            crate::wire::decode::<Member>(&crate::wire::encode(&member), 1024).unwrap(),
            member
        );
        let text = toml::to_string(&member).unwrap();
        assert_eq!(toml::from_str::<Member>(&text).unwrap(), member);
    }

    /// A member list of 1 to 40 distinct ids and an `f` it can serve.
    fn ring() -> impl Strategy<Value = (Vec<u32>, usize)> {
        prop::collection::btree_set(any::<u32>(), 1..40).prop_flat_map(|ids| {
            let max_f = (ids.len() - 1) / 3;
            (Just(ids.into_iter().collect::<Vec<u32>>()), 0..=max_f)
        })
    }

    proptest! {
        #[test]
        fn every_key_maps_to_its_3f_plus_1_successors(
            (ids, f) in ring(),
            keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 1..16),
        ) {
            // Exactly 3f+1 members make one group (its own test).
            prop_assume!(ids.len() > 3 * f + 1);
            let placement = placement(f, ids.iter().copied());
            let groups = placement.groups();
            prop_assert_eq!(groups.len(), ids.len());
            for key in &keys {
                let group = placement.group_of(key);
                prop_assert_eq!(group.len(), 3 * f + 1);
                let distinct: BTreeSet<NodeId> = group.members().iter().copied().collect();
                prop_assert_eq!(distinct.len(), 3 * f + 1);
                prop_assert!(distinct.iter().all(|&node| placement.member(node).is_some()));
                prop_assert_eq!(
                    group.members(),
                    successors(&ids, 3 * f + 1, RingPoint::of_key(key))
                );
                prop_assert!(groups.contains(&group));
                prop_assert_eq!(placement.group(group.id()), Some(group.clone()));
                prop_assert_eq!(group.epoch(), Epoch(3));
            }
        }

        #[test]
        fn every_member_is_in_exactly_3f_plus_1_groups((ids, f) in ring()) {
            prop_assume!(ids.len() > 3 * f + 1);
            let placement = placement(f, ids.iter().copied());
            let groups = placement.groups();
            let group_ids: BTreeSet<GroupId> = groups.iter().map(|g| g.id()).collect();
            prop_assert_eq!(group_ids.len(), groups.len());
            for &id in &ids {
                let node = NodeId(id);
                let of = placement.groups_of(node);
                prop_assert_eq!(of.len(), 3 * f + 1);
                let expected: Vec<GroupView> =
                    groups.iter().filter(|g| g.contains(node)).cloned().collect();
                prop_assert_eq!(&of, &expected);
                for group in &of {
                    let slot = group.slot_of(node).unwrap();
                    prop_assert_eq!(group.node(slot), Some(node));
                }
            }
        }

        #[test]
        fn placement_depends_on_the_members_not_their_order(
            ((ids, f), shuffled) in ring().prop_flat_map(|(ids, f)| {
                let shuffled = Just(ids.clone()).prop_shuffle();
                (Just((ids, f)), shuffled)
            }),
            key in prop::collection::vec(any::<u8>(), 0..48),
        ) {
            // The same members, with the same keys and addresses, listed in another order.
            let listed = members(ids.iter().copied());
            let mut reordered: Vec<Member> = shuffled
                .iter()
                .map(|id| listed.iter().find(|m| m.id.0 == *id).cloned().unwrap())
                .collect();
            let a = Placement::new(Epoch(3), PlacementParams::new(f), listed).unwrap();
            let b = Placement::new(Epoch(3), PlacementParams::new(f), reordered.clone()).unwrap();
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.group_of(&key), b.group_of(&key));
            prop_assert_eq!(a.groups(), b.groups());
            prop_assert_eq!(a.group_of(&key), a.group_of(&key));
            reordered.reverse();
            let c = Placement::new(Epoch(3), PlacementParams::new(f), reordered).unwrap();
            prop_assert_eq!(a.groups(), c.groups());
        }

        #[test]
        fn arcs_between_two_rings_cover_each_key_once_with_its_groups_in_both(
            (before, f) in ring(),
            joined in prop::collection::btree_set(any::<u32>(), 0..6),
            left in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 1..16),
        ) {
            let mut after: BTreeSet<u32> = before.iter().copied().collect();
            for index in &left {
                let gone = *index.get(&before);
                if after.len() > 3 * f + 1 {
                    after.remove(&gone);
                }
            }
            after.extend(joined);
            let params = PlacementParams::new(f);
            let old = Ring::new(Epoch(3), params, before.iter().map(|&id| NodeId(id))).unwrap();
            let new = Ring::new(Epoch(4), params, after.iter().map(|&id| NodeId(id))).unwrap();
            let arcs = new.arcs_since(&old);
            for key in &keys {
                let point = RingPoint::of_key(key);
                let holding: Vec<&Moved> = arcs.iter().filter(|m| m.arc.contains(point)).collect();
                prop_assert_eq!(holding.len(), 1, "each point lies on exactly one arc");
                prop_assert_eq!(&holding[0].old, &old.group_of(key));
                prop_assert_eq!(&holding[0].new, &new.group_of(key));
                // Every member position is some arc's inclusive end, where the groups change.
                for id in old.members().chain(new.members()) {
                    let end = RingPoint::of_node(id);
                    prop_assert_eq!(arcs.iter().filter(|m| m.arc.contains(end)).count(), 1);
                    prop_assert!(arcs.iter().any(|m| m.arc.upto == end));
                }
            }
            if before.iter().copied().collect::<BTreeSet<u32>>() == after {
                prop_assert!(arcs.iter().all(|m| !m.changed()), "same members, nothing moves");
            }
        }
    }

    #[test]
    fn a_group_keeps_its_incarnation_while_its_members_and_their_order_do() {
        let params = PlacementParams::new(1);
        let ring = |epoch: u64, ids: &[u32]| {
            std::sync::Arc::new(
                Ring::new(Epoch(epoch), params, ids.iter().map(|&id| NodeId(id))).unwrap(),
            )
        };
        let five: Vec<u32> = (1..=5).collect();
        let six: Vec<u32> = (1..=6).collect();
        // Epochs 0 and 1 alike, 2 adds node 6, 3 removes it again.
        let chain = Chain::new(vec![
            ring(0, &five),
            ring(1, &five),
            ring(2, &six),
            ring(3, &five),
        ]);
        let mut changed_at_two = 0;
        for key in 0..200u32 {
            let point = RingPoint::of_key(&key.to_be_bytes());
            let (group0, zero) = chain.incarnation(Epoch(0), point).unwrap();
            let (_, one) = chain.incarnation(Epoch(1), point).unwrap();
            let (group2, two) = chain.incarnation(Epoch(2), point).unwrap();
            let (group3, three) = chain.incarnation(Epoch(3), point).unwrap();
            assert_eq!(zero, Incarnation::new(group0.members(), Epoch(0)));
            assert_eq!(one, zero, "an unchanged group is the same incarnation");
            assert_eq!(group3.members(), group0.members());
            if group2.members() == group0.members() {
                assert_eq!(two, zero);
                assert_eq!(three, zero);
            } else {
                changed_at_two += 1;
                assert_eq!(two, Incarnation::new(group2.members(), Epoch(2)));
                // The same members as at the genesis, but a life of their own.
                assert_eq!(three, Incarnation::new(group3.members(), Epoch(3)));
                assert_ne!(three, zero);
            }
        }
        assert!(changed_at_two > 0, "some arcs moved to node 6");
        assert!(
            chain
                .incarnation(Epoch(4), RingPoint::of_key(b"k"))
                .is_none()
        );
    }

    #[test]
    fn the_multicast_reaches_every_node_in_three_hops_from_any_start() {
        for n in 1..=400usize {
            let k = multicast_fanout(n);
            assert!(
                k.pow(3) >= n && (k == 1 || (k - 1).pow(3) < n),
                "n {n}, k {k}"
            );
            for start in [0, n / 3, n - 1] {
                let mut holding = BTreeSet::from([start]);
                let mut hop_nodes = vec![start];
                for hop in 0..MULTICAST_HOPS {
                    let mut next = Vec::new();
                    for &at in &hop_nodes {
                        let targets = multicast_targets(n, at, hop);
                        assert!(targets.len() <= k);
                        next.extend(targets);
                    }
                    holding.extend(next.iter().copied());
                    hop_nodes = next;
                }
                assert_eq!(holding.len(), n, "n {n} from {start}");
            }
        }
        assert!(multicast_targets(10, 3, MULTICAST_HOPS).is_empty());
        assert_eq!(multicast_fanout(10_000), 22);
    }
}
