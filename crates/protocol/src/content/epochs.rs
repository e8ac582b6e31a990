//! Content-hash objects across epochs (Rosebud §4.3, §4.7, §4.8): a node's content-hash
//! replica for every group the configuration puts it in, as a [`Kind`] of the shared transfer
//! engine ([`crate::transfer`]).
//!
//! An object's fragments belong to slots: the member in slot `i` of the object's group holds
//! fragment `i`, which it checks against the object's id alone. When the group changes, slots
//! change with it, for the members that stay as much as for those that join, so every member of
//! a group whose order changed takes the object over again: it asks the old members for what
//! they hold, takes its own slot's fragment as it is when an old member hands that one over, and
//! otherwise rebuilds the object from `f+1` fragments that check, encodes it again and keeps its
//! fragment (the same rebuild a reader makes, so a faulty writer's manifest is refused the same
//! way). A member that already holds its new slot's fragment fetches nothing.
//!
//! A node keeps the fragments of its earlier slots beside the new one (one per index, so at most
//! `n` of an object) and hands them over to the new members still pulling: were it to replace
//! one, two members could hold fragments of one index, and a new member could find fewer than
//! `f+1` distinct ones of an object whose creation completed. A fragment a pull into an earlier
//! epoch brings late is kept too: it is a fragment of the object all the same, which the node
//! hands over and rebuilds from. It forgets the fragments of other slots than its own, as a
//! node that left the group forgets the object, once `2f+1` members of the group say they hold
//! their own fragment; and an object `2f+1` members that finished their pulls say they do not
//! hold is one no creation completed ([`Kind::DROP_DENIED`]), forgotten as well.
//!
//! Objects are stored under [`key_of`] their id: its ring point first, so the keys of an arc
//! are a range of the store and a listing reads only them.

use super::{
    ContentId, Held, Manifest, Place, Refusal, Request, RequestBody, Response, ResponseBody,
    rebuild, serve_at,
};
use crate::machine::{Access, Never, ReplicaStats};
use crate::round::Judged;
use crate::transfer::{
    self, Change, Decided, Kind, Recent, Resume, Route, Served, TransferMutations, Turned,
};
use bulwark_core::erasure::ErasureCodec;
use bulwark_core::membership::{Arc as RingArc, GroupView, Moved, Ring, RingPoint};
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Epoch, Key, NodeId, ServiceId, Slot};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// One fragment of an object as a node stores it and hands it over: the manifest it was
/// accepted under, and the index (the slot) it is the fragment of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// The object's manifest.
    pub manifest: Manifest,
    /// Which of the manifest's fragments this is.
    pub index: u32,
    /// The fragment.
    #[serde(with = "bulwark_core::wire::shared_bytes")]
    pub fragment: Bytes,
}

impl Piece {
    /// Whether this is a fragment of `id` as a correct writer made it for a group of `n`
    /// tolerating `f`.
    pub fn checks(&self, id: &ContentId, n: usize, f: usize) -> bool {
        self.manifest.is_canonical(n, f)
            && ContentId::of(&self.manifest) == *id
            && self.manifest.holds(Slot(self.index), &self.fragment)
    }
}

/// The key object `id` is stored and transferred under: its ring point, then the id.
pub fn key_of(id: &ContentId) -> Key {
    let point = RingPoint::of_key(id.as_bytes());
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(&point.0);
    bytes.extend_from_slice(id.as_bytes());
    match Key::new(Bytes::from(bytes)) {
        Ok(key) => key,
        Err(_) => unreachable!("64 bytes are a valid key"),
    }
}

/// The object a key names, when it is one [`key_of`] makes.
pub fn id_of(key: &Key) -> Option<ContentId> {
    let bytes = key.as_bytes();
    let (point, id) = bytes.split_first_chunk::<32>()?;
    let id = ContentId(bulwark_core::Digest(<[u8; 32]>::try_from(id).ok()?));
    (RingPoint::of_key(id.as_bytes()).0 == *point).then_some(id)
}

/// What an epoch-following content-hash replica reads back from its driver's storage (what it
/// stored, durable or not yet).
pub trait Pieces {
    /// Every fragment stored of the object under `key`.
    fn pieces(&self, key: &Key) -> Vec<Piece>;
    /// The objects stored under keys after `after` (from the first when `None`), in key order,
    /// each with the indices of the fragments stored: at most `limit` objects.
    fn objects_after(&self, after: Option<&Key>, limit: usize) -> Vec<(Key, Vec<u32>)>;
}

/// A node's content-hash objects, whatever group serves each.
pub struct Contents {
    me: NodeId,
    n: usize,
    f: usize,
    secret: SecretKey,
    codec: Arc<dyn ErasureCodec>,
    /// The ring of the current epoch: where this node's slots are.
    ring: Arc<Ring>,
    /// Fragments that checked against their id when last read, by key and index.
    found_intact: Recent<(Key, u32)>,
    stats: ReplicaStats,
    /// The negative control [`TransferMutations::displace_fragments`].
    displaces: bool,
}

/// At most this many fragments are remembered as found intact (each entry is a key of 64 bytes
/// and an index).
const FOUND_INTACT_MAX: usize = 16_384;

impl Contents {
    /// Node `me` at `ring`, signing its acknowledgements with `secret`, rebuilding objects with
    /// `codec`; `objects` and `bytes` are what it stored before a restart.
    pub fn new(
        me: NodeId,
        ring: Arc<Ring>,
        secret: SecretKey,
        codec: Arc<dyn ErasureCodec>,
        objects: u64,
        bytes: u64,
    ) -> Contents {
        let params = ring.params();
        Contents {
            me,
            n: params.group_size(),
            f: params.f,
            secret,
            codec,
            ring,
            found_intact: Recent::new(FOUND_INTACT_MAX),
            displaces: false,
            stats: ReplicaStats {
                objects,
                keys: objects,
                versions: objects,
                bytes,
                ..ReplicaStats::default()
            },
        }
    }

    /// The same replica, deliberately broken as `mutations` say.
    pub fn with_mutations(mut self, mutations: TransferMutations) -> Contents {
        self.displaces = mutations.displace_fragments;
        self
    }

    /// This node's slot for the object at `point` in `ring`, if it is a member of its group.
    fn slot_in(&self, ring: &Ring, point: RingPoint) -> Option<Slot> {
        ring.group_at(point).slot_of(self.me)
    }

    /// The fragments stored of the object under `key` that still check.
    fn intact(&self, view: &dyn Pieces, key: &Key) -> Vec<Piece> {
        let Some(id) = id_of(key) else {
            return Vec::new();
        };
        view.pieces(key)
            .into_iter()
            .filter(|piece| piece.checks(&id, self.n, self.f))
            .collect()
    }

    /// [`Contents::current`] for a client's request: a fragment found intact before is not
    /// hashed again (the bytes of a slot's fragment of one id never change), and one that no
    /// longer checks is counted as damage.
    fn served_piece(&mut self, view: &dyn Pieces, key: &Key) -> Option<Piece> {
        let piece = self.own_piece(view, key)?;
        if !self.own_intact(key, &piece) {
            self.stats.damaged += 1;
            return None;
        }
        self.found_intact.insert((key.clone(), piece.index));
        Some(piece)
    }

    /// Whether this node's own fragment `piece` of the object under `key` checks: found intact
    /// before, or hashed now.
    fn own_intact(&self, key: &Key, piece: &Piece) -> bool {
        self.found_intact.contains(&(key.clone(), piece.index))
            || id_of(key).is_some_and(|id| piece.checks(&id, self.n, self.f))
    }

    /// The fragment of the slot this node has now, if it holds it and it still checks.
    fn current(&self, view: &dyn Pieces, key: &Key) -> Option<Piece> {
        let id = id_of(key)?;
        self.own_piece(view, key)
            .filter(|piece| piece.checks(&id, self.n, self.f))
    }

    /// The fragment stored for the slot this node has now, unchecked.
    fn own_piece(&self, view: &dyn Pieces, key: &Key) -> Option<Piece> {
        let slot = self.slot_in(&self.ring, Self::point(key)?)?;
        view.pieces(key)
            .into_iter()
            .find(|piece| piece.index == slot.0)
    }
}

impl Kind for Contents {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    const DROP_DENIED: bool = true;
    const KEEPS_EARLIER: bool = true;
    const GATES_KEYS: bool = true;
    const IN_STORAGE: bool = true;
    type Request = Request;
    type Reply = Response;
    type Entry = Piece;
    type Version = ();
    type View = dyn Pieces;
    type Peer = Never;
    type Own = Never;

    fn f(&self) -> usize {
        self.f
    }

    fn route(request: &Request) -> Route {
        Route {
            epoch: request.epoch,
            group: request.group,
            key: key_of(&request.id),
        }
    }

    fn op(request: &Request) -> u64 {
        request.op.0
    }

    fn point(key: &Key) -> Option<RingPoint> {
        id_of(key).map(|id| RingPoint::of_key(id.as_bytes()))
    }

    fn turned(request: &Request, epoch: Epoch, why: Turned) -> Response {
        let refusal = match why {
            Turned::WrongEpoch { current } => Refusal::WrongEpoch { current },
            Turned::WrongGroup => Refusal::WrongGroup,
            Turned::Transferring => Refusal::Transferring,
        };
        Response {
            op: request.op,
            epoch,
            body: ResponseBody::Refused(refusal),
        }
    }

    fn serve(
        &mut self,
        _client: ClientId,
        access: Access,
        request: Request,
        group: &GroupView,
        slot: Slot,
        view: &Self::View,
    ) -> Served<Self> {
        let op = request.op;
        let key = key_of(&request.id);
        let place = Place {
            slot,
            n: self.n,
            f: self.f,
            epoch: request.epoch,
            group: group.id(),
        };
        let held = self.served_piece(view, &key).map(|piece| Held {
            manifest: piece.manifest,
            fragment: piece.fragment,
        });
        match serve_at(&place, &self.secret, access, request, held, true) {
            Ok(served) => {
                self.stats.damaged += u64::from(served.damaged);
                let changes = match served.store {
                    Some(held) => {
                        self.stats.objects += 1;
                        self.stats.keys += 1;
                        self.stats.versions += 1;
                        self.stats.bytes += held.fragment.len() as u64;
                        let piece = Piece {
                            manifest: held.manifest,
                            index: slot.0,
                            fragment: held.fragment,
                        };
                        self.adopt(view, &key, &piece)
                    }
                    // Every fragment goes, those of earlier slots too: a new member pulling the
                    // object from this node finds it gone.
                    None if served.forget => {
                        if !view.pieces(&key).is_empty() {
                            self.stats.objects = self.stats.objects.saturating_sub(1);
                            self.stats.keys = self.stats.keys.saturating_sub(1);
                            self.stats.versions = self.stats.versions.saturating_sub(1);
                        }
                        vec![Change::Drop { key: key.clone() }]
                    }
                    None => Vec::new(),
                };
                Served {
                    changes,
                    reply: Response {
                        op,
                        epoch: place.epoch,
                        body: served.body,
                    },
                    refused: None,
                }
            }
            Err(refusal) => Served {
                changes: Vec::new(),
                refused: Some(refusal.to_string()),
                reply: Response {
                    op,
                    epoch: place.epoch,
                    body: ResponseBody::Refused(refusal),
                },
            },
        }
    }

    /// A STORE brings this node's fragment: an object whose writer is writing it again in the
    /// new epoch is taken over by that write, whatever the old members still say of it. A FETCH
    /// is answered once this node holds its slot's fragment, however it came (that STORE, say,
    /// while a pull into an earlier epoch still waits on old members): a fragment that checks
    /// against the id is the answer the finished pull would give. Only a denial must wait.
    fn passes(&self, request: &Request, view: &dyn Pieces) -> bool {
        match request.body {
            RequestBody::Store { .. } => true,
            RequestBody::Fetch => {
                let key = key_of(&request.id);
                self.own_piece(view, &key)
                    .is_some_and(|piece| self.own_intact(&key, &piece))
            }
            RequestBody::Delete => false,
        }
    }

    fn settles(reply: &Response) -> bool {
        matches!(reply.body, ResponseBody::Stored(_))
    }

    /// Every member of a group whose order changed: a member whose slot moved needs the
    /// fragment of its new slot as much as one that joined.
    fn must_pull(moved: &Moved) -> bool {
        moved.old.members() != moved.new.members()
    }

    fn list(
        &self,
        view: &Self::View,
        arc: &RingArc,
        after: Option<&Key>,
        limit: usize,
    ) -> (Vec<Key>, bool) {
        // Keys start with their point, so ring order is key order and a point's floor is the
        // key after every object placed there.
        let floor = |point: RingPoint| {
            let mut bytes = point.0.to_vec();
            bytes.extend_from_slice(&[0xff; 32]);
            Key::new(Bytes::from(bytes)).ok()
        };
        transfer::list_arc(arc, after, limit, Self::point, |resume, wanted| {
            let from = match resume {
                Resume::Start => None,
                Resume::AfterPoint(point) => floor(point),
                Resume::AfterKey(key) => Some(key.clone()),
            };
            let page = view.objects_after(from.as_ref(), wanted);
            page.into_iter().map(|(key, _)| key).collect()
        })
    }

    /// The fragment of this node's current slot, or, outside the object's group, any fragment
    /// it still holds: what it would drop.
    fn entry(&self, view: &Self::View, key: &Key) -> Option<Piece> {
        self.current(view, key)
            .or_else(|| self.intact(view, key).into_iter().next())
    }

    fn holds(&self, view: &Self::View, key: &Key) -> Option<()> {
        self.current(view, key).map(|_| ())
    }

    /// The fragment of the slot this node had in `old`, kept for the new members; any other it
    /// holds otherwise (a new member checks each against the id, whatever its index).
    fn hand_over(&self, view: &Self::View, key: &Key, old: &GroupView) -> Option<Piece> {
        let pieces = self.intact(view, key);
        let slot = old.slot_of(self.me).map(|slot| slot.0);
        pieces
            .iter()
            .find(|piece| Some(piece.index) == slot)
            .or(pieces.first())
            .cloned()
    }

    fn needs(&self, view: &Self::View, key: &Key, new: &GroupView) -> bool {
        let Some(slot) = new.slot_of(self.me) else {
            return false;
        };
        !self
            .intact(view, key)
            .iter()
            .any(|piece| piece.index == slot.0)
    }

    fn version(_entry: &Piece) {}

    fn value_bytes(entry: &Piece) -> u64 {
        entry.fragment.len() as u64
    }

    /// Objects outside this node's groups, and objects of its groups of which it still holds a
    /// fragment of another slot than its own.
    fn outside(&self, view: &Self::View, ring: &Ring, me: NodeId) -> Vec<Key> {
        let mut found = Vec::new();
        let mut after: Option<Key> = None;
        loop {
            let page = view.objects_after(after.as_ref(), 1_024);
            let Some((last, _)) = page.last() else {
                return found;
            };
            after = Some(last.clone());
            for (key, indices) in page {
                let Some(point) = Self::point(&key) else {
                    continue;
                };
                let group = ring.group_at(point);
                let extra = match group.slot_of(me) {
                    None => true,
                    Some(slot) => indices.iter().any(|index| *index != slot.0),
                };
                if extra {
                    found.push(key);
                }
            }
        }
    }

    fn judge(&self, _group: &GroupView, key: &Key, entry: &Piece) -> Judged {
        match id_of(key) {
            Some(id) if entry.checks(&id, self.n, self.f) => Judged::Valid,
            Some(_) => Judged::Forged,
            None => Judged::Ignored,
        }
    }

    /// This node's slot's fragment as an old member handed it over, or the object rebuilt from
    /// `f+1` distinct fragments (those handed over and those this node holds already, of other
    /// slots or epochs, since each checks against the id whoever kept it) and encoded again;
    /// nothing once `quorum` old members deny holding it, or every one answered and too few
    /// fragments came (an object whose creation did not complete, or whose writer's manifest no
    /// value fits).
    fn decide(
        &self,
        view: &Self::View,
        key: &Key,
        old: &GroupView,
        new: &GroupView,
        answers: &[(Slot, Option<&Piece>)],
        quorum: usize,
    ) -> Decided<Piece> {
        let Some(slot) = new.slot_of(self.me) else {
            return Decided::Absent;
        };
        let handed: Vec<&Piece> = answers.iter().filter_map(|(_, piece)| *piece).collect();
        let denied = answers.len() - handed.len();
        let held = self.intact(view, key);
        let pieces: Vec<&Piece> = handed.into_iter().chain(&held).collect();
        if let Some(own) = pieces.iter().find(|piece| piece.index == slot.0) {
            return Decided::Take((*own).clone());
        }
        let mut indices = BTreeSet::new();
        let distinct: Vec<(usize, Bytes)> = pieces
            .iter()
            .filter(|piece| indices.insert(piece.index))
            .map(|piece| (piece.index as usize, piece.fragment.clone()))
            .collect();
        // Every piece checked against the id, so they share one manifest.
        if let Some(first) = pieces.first()
            && distinct.len() >= first.manifest.layout.needed()
        {
            return match rebuild(&*self.codec, &first.manifest, &distinct) {
                Ok((_, fragments)) => match fragments.get(slot.index()) {
                    Some(fragment) => Decided::Take(Piece {
                        manifest: first.manifest.clone(),
                        index: slot.0,
                        fragment: fragment.clone(),
                    }),
                    None => Decided::Absent,
                },
                Err(()) => Decided::Absent,
            };
        }
        if denied >= quorum || answers.len() == old.len() {
            return Decided::Absent;
        }
        Decided::Wait
    }

    /// Stores a fragment beside every other one this node holds of the object (one per index,
    /// so at most `n`), replacing only a stored fragment of the same index. Fragments of other
    /// slots than this node's are forgotten only once the group holds the object
    /// ([`Kind::remove`]): were a late pull into an earlier epoch to displace the fragment of a
    /// slot this node had two epochs ago, say, two correct nodes could be left with one index,
    /// and a new member with fewer than `f+1` distinct fragments of an object whose creation
    /// completed.
    fn adopt(&mut self, view: &Self::View, key: &Key, entry: &Piece) -> Vec<Change<Piece>> {
        let held = view.pieces(key);
        if held.iter().any(|piece| piece == entry) {
            return Vec::new();
        }
        let mut changes: Vec<Change<Piece>> = held
            .into_iter()
            .filter(|piece| piece.index == entry.index || self.displaces)
            .map(|piece| Change::Remove {
                key: key.clone(),
                entry: piece,
            })
            .collect();
        changes.push(Change::Put {
            key: key.clone(),
            entry: entry.clone(),
        });
        changes
    }

    /// Forgets the object outside its group, or the fragments of other slots than this node's
    /// within it.
    fn remove(&mut self, view: &Self::View, key: &Key) -> Vec<Change<Piece>> {
        let slot = Self::point(key).and_then(|point| self.slot_in(&self.ring, point));
        let Some(slot) = slot else {
            self.stats.objects = self.stats.objects.saturating_sub(1);
            return vec![Change::Drop { key: key.clone() }];
        };
        view.pieces(key)
            .into_iter()
            .filter(|piece| piece.index != slot.0)
            .map(|piece| Change::Remove {
                key: key.clone(),
                entry: piece,
            })
            .collect()
    }

    fn entered(&mut self, ring: &Arc<Ring>) {
        self.ring = ring.clone();
    }

    fn offers(&self) -> bool {
        false
    }

    fn stats(&self) -> ReplicaStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::Encoded;
    use crate::machine::Replica;
    use crate::transfer::{EpochHost, Transfer};
    use bulwark_core::Time;
    use bulwark_core::erasure::ReedSolomonSimd;
    use bulwark_core::membership::PlacementParams;
    use std::collections::BTreeMap;

    /// A store of pieces, read back as the driver would.
    #[derive(Default)]
    struct Store(BTreeMap<(Key, u32), Piece>);

    impl Pieces for Store {
        fn pieces(&self, key: &Key) -> Vec<Piece> {
            self.0
                .range((key.clone(), 0)..=(key.clone(), u32::MAX))
                .map(|(_, piece)| piece.clone())
                .collect()
        }

        fn objects_after(&self, after: Option<&Key>, limit: usize) -> Vec<(Key, Vec<u32>)> {
            let mut objects: BTreeMap<Key, Vec<u32>> = BTreeMap::new();
            for (key, index) in self.0.keys() {
                objects.entry(key.clone()).or_default().push(*index);
            }
            objects
                .into_iter()
                .filter(|(key, _)| after.is_none_or(|after| key > after))
                .take(limit)
                .collect()
        }
    }

    fn ring(epoch: u64, ids: &[u32]) -> Arc<Ring> {
        let ring = Ring::new(
            Epoch(epoch),
            PlacementParams::new(1),
            ids.iter().map(|id| NodeId(*id)),
        );
        Arc::new(ring.expect("enough members"))
    }

    fn contents(me: u32, ring: Arc<Ring>) -> Contents {
        Contents::new(
            NodeId(me),
            ring,
            SecretKey::from_seed(&[me as u8; 32]),
            Arc::new(ReedSolomonSimd),
            0,
            0,
        )
    }

    fn object(seed: u8) -> Encoded {
        let value: Vec<u8> = (0..5_000u32).map(|i| (i as u8) ^ seed).collect();
        Encoded::new(&ReedSolomonSimd, 4, 1, &value).expect("within bounds")
    }

    fn piece(encoded: &Encoded, index: u32) -> Piece {
        Piece {
            manifest: encoded.manifest.clone(),
            index,
            fragment: encoded.fragments[index as usize].clone(),
        }
    }

    #[test]
    fn an_objects_key_sorts_by_its_ring_point_and_names_only_its_object() {
        let id = object(1).id;
        let key = key_of(&id);
        assert_eq!(id_of(&key), Some(id));
        assert_eq!(
            Contents::point(&key),
            Some(RingPoint::of_key(id.as_bytes()))
        );
        // Another point before the same id, or a key of another length, names nothing.
        let mut bytes = key.as_bytes().to_vec();
        bytes[0] ^= 1;
        assert_eq!(id_of(&Key::new(bytes).expect("a key")), None);
        assert_eq!(
            id_of(&Key::new(id.as_bytes().to_vec()).expect("a key")),
            None
        );
    }

    #[test]
    fn a_listing_pages_through_an_arc_in_key_order_whether_or_not_it_wraps() {
        let mut store = Store::default();
        let mut keys = Vec::new();
        for seed in 0..40u8 {
            let encoded = object(seed);
            let key = key_of(&encoded.id);
            store.0.insert((key.clone(), 0), piece(&encoded, 0));
            keys.push(key);
        }
        keys.sort();
        let node = contents(0, ring(0, &[0, 1, 2, 3]));
        let point = |key: &Key| Contents::point(key).expect("a valid key");
        let cut = |at: usize| point(&keys[at]);
        let arcs = [
            RingArc {
                after: cut(5),
                upto: cut(5),
            },
            RingArc {
                after: cut(3),
                upto: cut(30),
            },
            RingArc {
                after: cut(30),
                upto: cut(3),
            },
            RingArc {
                after: cut(39),
                upto: cut(0),
            },
        ];
        for arc in arcs {
            let expected: Vec<Key> = keys
                .iter()
                .filter(|key| arc.contains(point(key)))
                .cloned()
                .collect();
            let mut listed = Vec::new();
            let mut after: Option<Key> = None;
            loop {
                let (page, more) = node.list(&store, &arc, after.as_ref(), 3);
                assert!(page.len() <= 3);
                assert!(
                    !more || page.len() == 3,
                    "a page short of the limit is the last"
                );
                after = page.last().cloned().or(after);
                listed.extend(page);
                if !more {
                    break;
                }
            }
            assert_eq!(listed, expected, "arc {arc:?}");
        }
    }

    #[test]
    fn a_new_member_takes_its_fragment_or_rebuilds_it_and_gives_up_only_when_it_may() {
        let old = ring(0, &[0, 1, 2, 3]);
        let new = ring(1, &[0, 1, 2, 3, 4]);
        let encoded = object(7);
        let key = key_of(&encoded.id);
        let point = Contents::point(&key).expect("a valid key");
        let (old_view, new_view) = (old.group_at(point), new.group_at(point));
        let joiner = new_view
            .members()
            .iter()
            .copied()
            .find(|node| !old_view.contains(*node))
            .expect("a member that joined");
        let node = contents(joiner.0, new.clone());
        let mine = new_view.slot_of(joiner).expect("a member").0;
        let others: Vec<u32> = (0..4).filter(|index| *index != mine).collect();
        let empty = Store::default();
        let decide_holding = |held: &Store, answers: &[(Slot, Option<&Piece>)]| {
            node.decide(held, &key, &old_view, &new_view, answers, 3)
        };
        let decide = |answers: &[(Slot, Option<&Piece>)]| decide_holding(&empty, answers);
        // Its own slot's fragment as an old member hands it over.
        let own = piece(&encoded, mine);
        assert_eq!(decide(&[(Slot(0), Some(&own))]), Decided::Take(own.clone()));
        // One other fragment is not enough; two rebuild the object and encode its own.
        let (a, b) = (piece(&encoded, others[0]), piece(&encoded, others[1]));
        assert_eq!(decide(&[(Slot(0), Some(&a))]), Decided::Wait);
        assert_eq!(
            decide(&[(Slot(0), Some(&a)), (Slot(1), Some(&b))]),
            Decided::Take(own.clone())
        );
        // Two copies of one index are one fragment.
        assert_eq!(
            decide(&[(Slot(0), Some(&a)), (Slot(1), Some(&a))]),
            Decided::Wait
        );
        // A fragment and two denials: a slow member may hold the second fragment.
        assert_eq!(
            decide(&[(Slot(0), Some(&a)), (Slot(1), None), (Slot(2), None)]),
            Decided::Wait
        );
        // Three denials, or every member answered and too little came: nothing to take.
        assert_eq!(
            decide(&[(Slot(0), None), (Slot(1), None), (Slot(2), None)]),
            Decided::Absent
        );
        assert_eq!(
            decide(&[
                (Slot(0), Some(&a)),
                (Slot(1), None),
                (Slot(2), None),
                (Slot(3), None)
            ]),
            Decided::Absent
        );
        // A fragment it holds already (of another slot, or an earlier epoch's) counts beside
        // those handed over: it checks against the id whoever kept it.
        let mut holding = Store::default();
        holding.0.insert((key.clone(), b.index), b.clone());
        assert_eq!(
            decide_holding(&holding, &[(Slot(0), Some(&a))]),
            Decided::Take(own.clone())
        );
        assert_eq!(
            decide_holding(&holding, &[(Slot(0), Some(&b))]),
            Decided::Wait
        );
        // A damaged fragment is forged, whatever its index.
        let mut damaged = a.clone();
        damaged.fragment = Bytes::from(vec![0; damaged.fragment.len()]);
        assert_eq!(node.judge(&old_view, &key, &damaged), Judged::Forged);
        assert_eq!(node.judge(&old_view, &key, &a), Judged::Valid);
    }

    #[test]
    fn a_member_keeps_every_fragment_it_took_over_until_its_group_holds_the_object() {
        let first = ring(0, &[0, 1, 2, 3]);
        let second = ring(1, &[0, 1, 2, 3, 4]);
        let encoded = object(9);
        let key = key_of(&encoded.id);
        let point = Contents::point(&key).expect("a valid key");
        // A member of both groups whose slot changed.
        let member = (0..4)
            .map(NodeId)
            .find(|node| {
                let (a, b) = (first.group_at(point), second.group_at(point));
                a.slot_of(*node).is_some()
                    && b.slot_of(*node).is_some()
                    && a.slot_of(*node) != b.slot_of(*node)
            })
            .expect("a member whose slot moved");
        let (then, now) = (
            first.group_at(point).slot_of(member).expect("a member").0,
            second.group_at(point).slot_of(member).expect("a member").0,
        );
        let mut node = contents(member.0, first);
        node.entered(&second);
        let mut store = Store::default();
        store.0.insert((key.clone(), then), piece(&encoded, then));
        let stray = (0..4)
            .find(|index| *index != then && *index != now)
            .expect("a third");
        store.0.insert((key.clone(), stray), piece(&encoded, stray));
        // Today's fragment goes in beside yesterday's and the one a late pull brought: any of
        // them may be the distinct fragment a new member still needs.
        let changes = node.adopt(&store, &key, &piece(&encoded, now));
        assert_eq!(
            changes,
            vec![Change::Put {
                key: key.clone(),
                entry: piece(&encoded, now)
            }]
        );
        store.0.insert((key.clone(), now), piece(&encoded, now));
        // The same fragment again changes nothing.
        assert_eq!(node.adopt(&store, &key, &piece(&encoded, now)), Vec::new());
        assert_eq!(node.holds(&store, &key), Some(()));
        assert_eq!(node.outside(&store, &second, member), vec![key.clone()]);
        // Once the group holds it, the fragments of other slots go.
        let gone = node.remove(&store, &key);
        let mut removed: Vec<u32> = gone
            .iter()
            .filter_map(|change| match change {
                Change::Remove { key: of, entry }
                    if *of == key && *entry == piece(&encoded, entry.index) =>
                {
                    Some(entry.index)
                }
                _ => None,
            })
            .collect();
        removed.sort_unstable();
        let mut expected = vec![then, stray];
        expected.sort_unstable();
        assert_eq!((gone.len(), removed), (2, expected));
    }

    #[test]
    fn a_read_passes_a_pull_in_progress_only_when_the_member_holds_its_fragment() {
        let ring = ring(0, &[0, 1, 2, 3]);
        let encoded = object(5);
        let key = key_of(&encoded.id);
        let group = ring.group_at(Contents::point(&key).expect("a valid key"));
        let me = group.members()[2];
        let slot = group.slot_of(me).expect("a member");
        let node = contents(me.0, ring.clone());
        let fetch = Request {
            op: crate::round::OpId(1),
            epoch: ring.epoch(),
            group: group.id(),
            id: encoded.id,
            body: RequestBody::Fetch,
        };
        let mut store = Store::default();
        // Holding nothing, or another slot's fragment, it would deny: the read waits.
        assert!(!node.passes(&fetch, &store));
        let other = (slot.0 + 1) % 4;
        store.0.insert((key.clone(), other), piece(&encoded, other));
        assert!(!node.passes(&fetch, &store));
        // A damaged fragment of its slot is no answer either.
        let mut damaged = piece(&encoded, slot.0);
        damaged.fragment = Bytes::from(vec![0; damaged.fragment.len()]);
        store.0.insert((key.clone(), slot.0), damaged);
        assert!(!node.passes(&fetch, &store));
        // Its own slot's fragment answers the read as the finished pull would.
        store
            .0
            .insert((key.clone(), slot.0), piece(&encoded, slot.0));
        assert!(node.passes(&fetch, &store));
        let delete = Request {
            body: RequestBody::Delete,
            ..fetch
        };
        assert!(!node.passes(&delete, &store));
    }

    /// A joiner of epoch 1 pulling `encoded`'s arc, its listings in: the host, the object's
    /// key, the old group and the joiner's slot in the new one.
    fn pulling(
        encoded: &Encoded,
        mutations: TransferMutations,
    ) -> (EpochHost<Contents>, Key, GroupView) {
        let (first, second) = (ring(0, &[0, 1, 2, 3]), ring(1, &[0, 1, 2, 3, 4]));
        let key = key_of(&encoded.id);
        let point = Contents::point(&key).expect("a valid key");
        let old = first.group_at(point);
        let joiner = second
            .group_at(point)
            .members()
            .iter()
            .copied()
            .find(|node| !old.contains(*node))
            .expect("a member that joined");
        let mut host = EpochHost::new(joiner, first, contents(joiner.0, second.clone()))
            .with_mutations(mutations);
        let store = Store::default();
        let entered = host.enter(second);
        let mut fetches = 0;
        for (to, message) in entered.sends {
            let Transfer::List { epoch, arc, after } = message else {
                continue;
            };
            let keys = if arc.contains(point) {
                vec![key.clone()]
            } else {
                Vec::new()
            };
            let listed = Transfer::Listed {
                epoch,
                arc,
                after,
                keys,
                more: false,
            };
            let output = Replica::on_message(&mut host, Time(1), to, listed, &store);
            fetches += output
                .sends
                .iter()
                .filter(
                    |(_, message)| matches!(message, Transfer::Fetch { key: k, .. } if *k == key),
                )
                .count();
        }
        assert_eq!(fetches, 4, "every old member is asked for the object");
        (host, key, old)
    }

    #[test]
    fn a_pull_heard_out_without_a_decision_stops_counting_as_slow_and_keeps_holding_reads() {
        let encoded = object(11);
        let (mut host, key, old) = pulling(&encoded, TransferMutations::default());
        let store = Store::default();
        let member = |slot: usize| Slot(old.members()[slot].0);
        let fetched = |entry| Transfer::Fetched {
            epoch: Epoch(1),
            key: key.clone(),
            entry,
        };
        let undecided = Transfer::Undecided {
            epoch: Epoch(1),
            key: key.clone(),
        };
        // A creation a faulty writer left on one correct member (slot 0) and a faulty one
        // (slot 3, silent); the other two deny.
        let _ = Replica::on_message(
            &mut host,
            Time(2),
            member(0),
            fetched(Some(piece(&encoded, 0))),
            &store,
        );
        let _ = Replica::on_message(&mut host, Time(2), member(1), fetched(None), &store);
        assert_eq!(Replica::stats(&host).transfers_pending, 1);
        // "Undecided" is an answer: three old members heard, and the node has caught up.
        let _ = Replica::on_message(&mut host, Time(2), member(2), undecided.clone(), &store);
        let stats = Replica::stats(&host);
        assert_eq!((stats.transfers_pending, stats.transfers_undecided), (0, 1));
        // But not a denial: a fragment and two denials decide nothing either.
        let _ = Replica::on_message(&mut host, Time(3), member(2), fetched(None), &store);
        let stats = Replica::stats(&host);
        assert_eq!((stats.transfers_pending, stats.transfers_undecided), (0, 1));
        assert!(!host.settled());
        // A read of the object is still held: the answer may yet be the object.
        let group = host
            .ring()
            .group_at(Contents::point(&key).expect("a valid key"));
        let read = Request {
            op: crate::round::OpId(1),
            epoch: Epoch(1),
            group: group.id(),
            id: encoded.id,
            body: RequestBody::Fetch,
        };
        let reader = Access {
            write: false,
            read: true,
        };
        let held = Replica::on_request(&mut host, Time(3), ClientId(1), reader, read, &store);
        assert!(held.reply.is_none());
        // Its fetch is asked again, of the silent member only.
        let mut asked = BTreeSet::new();
        for now in (4..40).map(|step| Time(step * crate::transfer::PULL_RETRY_MILLIS)) {
            for (to, message) in Replica::on_tick(&mut host, now).sends {
                if matches!(message, Transfer::Fetch { .. }) {
                    asked.insert(to);
                }
            }
        }
        assert_eq!(asked, BTreeSet::from([member(3)]));
        // Once the fourth answers with its fragment, the pull rebuilds and ends.
        let done = Replica::on_message(
            &mut host,
            Time(50_000),
            member(3),
            fetched(Some(piece(&encoded, 3))),
            &store,
        );
        assert!(
            done.changes
                .iter()
                .any(|change| matches!(change, Change::Put { .. }))
        );
        assert!(host.settled());

        // A member still pulling the object answers a pull into the next epoch "undecided",
        // neither silence nor a denial.
        let (mut host, key, _) = pulling(&encoded, TransferMutations::default());
        let _ = host.enter(ring(2, &[0, 1, 2, 3, 4, 5]));
        let fetch = Transfer::Fetch {
            epoch: Epoch(2),
            key: key.clone(),
            held: None,
        };
        let answer = Replica::on_message(&mut host, Time(5), Slot(5), fetch, &store);
        assert!(matches!(
            &answer.sends[..],
            [(Slot(5), Transfer::Undecided { epoch: Epoch(2), key: k })] if *k == key
        ));
    }

    // The mutation that counts "undecided" as a denial drops an object two denials and an
    // undecided member leave open; the rule keeps waiting.
    #[test]
    fn an_undecided_answer_is_never_a_denial() {
        let encoded = object(11);
        for (mutations, settles) in [
            (TransferMutations::default(), false),
            (
                TransferMutations {
                    undecided_denies: true,
                    ..TransferMutations::default()
                },
                true,
            ),
        ] {
            let (mut host, key, old) = pulling(&encoded, mutations);
            let store = Store::default();
            let member = |slot: usize| Slot(old.members()[slot].0);
            let denial = Transfer::Fetched {
                epoch: Epoch(1),
                key: key.clone(),
                entry: None,
            };
            let undecided = Transfer::Undecided {
                epoch: Epoch(1),
                key: key.clone(),
            };
            let _ = Replica::on_message(&mut host, Time(2), member(0), denial.clone(), &store);
            let _ = Replica::on_message(&mut host, Time(2), member(1), denial, &store);
            let _ = Replica::on_message(&mut host, Time(2), member(2), undecided, &store);
            assert_eq!(host.settled(), settles);
        }
    }

    #[test]
    fn a_delete_forgets_every_fragment_a_member_holds_of_the_object() {
        let ring = ring(0, &[0, 1, 2, 3]);
        let encoded = object(3);
        let key = key_of(&encoded.id);
        let point = Contents::point(&key).expect("a valid key");
        let group = ring.group_at(point);
        let me = group.members()[1];
        let slot = group.slot_of(me).expect("a member");
        let mut node = contents(me.0, ring.clone());
        let mut store = Store::default();
        for index in [slot.0, (slot.0 + 1) % 4] {
            store.0.insert((key.clone(), index), piece(&encoded, index));
        }
        let request = |body| Request {
            op: crate::round::OpId(1),
            epoch: ring.epoch(),
            group: group.id(),
            id: encoded.id,
            body,
        };
        let writer = Access {
            write: true,
            read: true,
        };
        let served = node.serve(
            ClientId(1),
            writer,
            request(RequestBody::Delete),
            &group,
            slot,
            &store,
        );
        assert_eq!(served.reply.body, ResponseBody::Deleted);
        assert_eq!(served.changes, vec![Change::Drop { key: key.clone() }]);
        let reader = Access {
            write: false,
            read: true,
        };
        let refused = node.serve(
            ClientId(2),
            reader,
            request(RequestBody::Delete),
            &group,
            slot,
            &store,
        );
        assert!(refused.changes.is_empty() && refused.refused.is_some());
    }
}
