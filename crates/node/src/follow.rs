//! Replicas that follow the configuration from epoch to epoch (Rosebud §4.7): one per service
//! for the whole node, whatever groups it is in, keeping what it holds of each key across epochs
//! and pulling the keys of the arcs it takes over. Public-key and content-hash objects are
//! served this way; the manager of the configuration chain hands each one every newly certified
//! ring.

use crate::host::{self, EpochStorage, Hosting, Members, NODE_WIDE};
use crate::shard::ReplicaKey;
use crate::{NodeError, Rejections, decode_register};
use bulwark_core::envelope::Header;
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, RingPoint};
use bulwark_core::sign::SecretKey;
use bulwark_core::{Epoch, NodeId, ServiceId, Slot};
use bulwark_protocol::content::{self, epochs};
use bulwark_protocol::pubkey;
use bulwark_protocol::register::reconfig::{EpochServer, Held};
use bulwark_protocol::transfer::EpochHost;
use bulwark_storage::{Namespace, StorageError, StorageOp, Store};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A node's public-key replica for every group it is in, in any epoch.
pub type PubKeyReplica = Hosting<EpochServer<pubkey::PubKey>, EpochStorage<pubkey::Entry>>;

/// Node `me`'s public-key replica over its namespace, at the epoch it entered last (each ring
/// from `chain`). Versions stored by key, as releases before ring-ordered storage kept them (in
/// the node-wide namespace, or per group of `legacy`, the static placement), are moved into
/// ring order first, once. Versions stay on disk: the replica keeps only counts in memory.
pub fn pubkey_replica(
    me: NodeId,
    store: &Arc<Store>,
    chain: &Chain,
    legacy: &[GroupView],
    rejections: &Rejections,
) -> Result<(ReplicaKey, PubKeyReplica), NodeError> {
    let namespace = Namespace::new(ServiceId::PUBKEY, NODE_WIDE);
    let keyed = std::iter::once(namespace).chain(
        legacy
            .iter()
            .map(|view| Namespace::new(ServiceId::PUBKEY, view.id())),
    );
    let mut undecodable = 0;
    for from in keyed {
        let (moved, dropped) = move_keyed_versions(store, from.table(host::REGISTER), namespace)?;
        if moved > 0 {
            tracing::info!(
                node = me.0,
                versions = moved,
                "public-key versions moved into ring order"
            );
        }
        undecodable += dropped;
    }
    let (held, dropped) = count_placed(store, namespace)?;
    undecodable += dropped;
    if undecodable > 0 {
        // Each is dropped, as the other replicas drop theirs: the node lacks that version, as
        // one that missed the write does (see `restore_register`).
        tracing::error!(
            versions = undecodable,
            "stored public-key versions do not decode; dropped"
        );
        rejections.add(
            "disk",
            "stored version dropped at start-up: does not decode",
            undecodable,
        );
    }
    metrics::counter!("bulwark_node_corrupt_entries_dropped_total").increment(undecodable);
    let (entered, pulled) = followed(store, namespace, chain)?;
    let replica = EpochServer::restore(me, chain, (), held, entered, &pulled);
    tracing::debug!(
        node = me.0,
        versions = held.keys,
        epoch = replica.epoch().0,
        settled = replica.settled(),
        "public-key replica restored"
    );
    let hosting = Hosting {
        replica,
        adapter: EpochStorage::new(namespace, store.clone()),
        members: Members::ById,
        slot: Slot(me.0),
        header: Header::request(ServiceId::PUBKEY, NODE_WIDE, entered, 0),
    };
    Ok(((ServiceId::PUBKEY, NODE_WIDE), hosting))
}

/// Records moved or dropped per transaction while stored data is rewritten at start.
const MOVE_BATCH: usize = 256;

/// Empties `table` of records an earlier release kept there: `rewrite` adds the ops that keep
/// what one record held elsewhere (none for a record it cannot use), and the record is deleted
/// in the same transaction, a batch at a time, so a crash midway leaves everything in one place
/// or the other (in both, it is written again, the same bytes).
fn drain(
    store: &Store,
    table: bulwark_storage::Table,
    mut rewrite: impl FnMut(&[u8], &[u8], &mut Vec<StorageOp>) -> Result<(), StorageError>,
) -> Result<(), NodeError> {
    loop {
        let mut ops = Vec::new();
        store.scan_after(table, None, |record, value| {
            rewrite(record, value, &mut ops)?;
            ops.push(StorageOp::Delete {
                table,
                key: record.to_vec(),
            });
            Ok(ops.len() < 2 * MOVE_BATCH)
        })?;
        if ops.is_empty() {
            return Ok(());
        }
        store.apply(&ops)?;
    }
}

/// Moves the versions of `table`, filed by key, into `namespace`'s [`host::PLACED`] ([`drain`]).
/// A key already placed keeps the newer of the two versions (a key written before and after the
/// node followed the configuration has one per table). Returns how many moved and how many did
/// not decode (deleted).
fn move_keyed_versions(
    store: &Store,
    table: bulwark_storage::Table,
    namespace: Namespace,
) -> Result<(u64, u64), NodeError> {
    let (mut moved, mut dropped) = (0, 0);
    drain(store, table, |record, value, ops| {
        match decode_register::<pubkey::Entry>(record, value) {
            Ok((key, entry)) => {
                let placed = host::placed_record(&key);
                let held = store.get(namespace.table(host::PLACED), &placed)?;
                let newer = held
                    .and_then(|held| host::decode_placed::<pubkey::Entry>(&placed, &held).ok())
                    .is_some_and(|(_, held)| held.ts >= entry.ts);
                if !newer {
                    ops.push(StorageOp::Put {
                        table: namespace.table(host::PLACED),
                        key: placed,
                        value: bytes::Bytes::from(bulwark_core::wire::encode(&(&key, &entry))),
                    });
                }
                moved += 1;
            }
            Err(problem) => {
                tracing::warn!(%problem, "a stored public-key version does not decode");
                dropped += 1;
            }
        }
        Ok(())
    })?;
    Ok((moved, dropped))
}

/// What `namespace`'s [`host::PLACED`] holds, read through once without keeping it; records that
/// do not decode, or are filed where their key does not place them, are deleted and counted.
fn count_placed(store: &Store, namespace: Namespace) -> Result<(Held, u64), NodeError> {
    let table = namespace.table(host::PLACED);
    let mut held = Held::default();
    let mut rotten = Vec::new();
    store.scan(table, |record, value| {
        match host::decode_placed::<pubkey::Entry>(record, value) {
            Ok((_, entry)) => {
                held.keys += 1;
                if let Some(value) = &entry.value {
                    held.objects += 1;
                    held.bytes += value.len() as u64;
                }
            }
            Err(problem) => {
                tracing::warn!(%problem, "a stored public-key version does not decode");
                rotten.push(StorageOp::Delete {
                    table,
                    key: record.to_vec(),
                });
            }
        }
        Ok(())
    })?;
    let dropped = rotten.len() as u64;
    for ops in rotten.chunks(MOVE_BATCH) {
        store.apply(ops)?;
    }
    Ok((held, dropped))
}

/// Where a node-wide replica in `namespace` is: the epoch it entered last (the genesis before
/// its first), and the arcs whose pull finished.
fn followed(
    store: &Store,
    namespace: Namespace,
    chain: &Chain,
) -> Result<(Epoch, BTreeSet<(Epoch, RingArc)>), NodeError> {
    let corrupt = |table: &'static str, problem: String| NodeError::CorruptState { table, problem };
    let entered = match store.get(namespace.table(host::ENTERED), host::ENTERED_RECORD)? {
        Some(value) => <[u8; 8]>::try_from(value.as_ref())
            .map(|bytes| Epoch(u64::from_be_bytes(bytes)))
            .map_err(|_| corrupt(host::ENTERED, "not an epoch".into()))?,
        None => chain.genesis().epoch(),
    };
    let mut pulled = BTreeSet::new();
    for (record, _) in store.load(namespace.table(host::PULLED))? {
        pulled.insert(
            decode_pulled(&record).ok_or_else(|| corrupt(host::PULLED, "not an arc".into()))?,
        );
    }
    Ok((entered, pulled))
}

/// Node `me`'s content-hash replica, at the epoch it entered last (each ring from `chain`),
/// signing its acknowledgements with `secret`. Fragments it stored per group before it followed
/// the configuration (the namespaces of `legacy`, its groups of the static placement, where its
/// fragment was its slot's) are moved into its node-wide store first, once.
pub fn content_replica(
    me: NodeId,
    store: &Arc<Store>,
    chain: &Chain,
    legacy: &[GroupView],
    secret: SecretKey,
) -> Result<(ReplicaKey, host::ContentReplica), NodeError> {
    let namespace = Namespace::new(ServiceId::CONTENT, NODE_WIDE);
    let moved = move_legacy_content(me, store, namespace, legacy)?;
    if moved > 0 {
        tracing::info!(
            node = me.0,
            fragments = moved,
            "content fragments moved to the node-wide store"
        );
    }
    let (entered, pulled) = followed(store, namespace, chain)?;
    let fragments = store.count(namespace.table(host::PIECES))?;
    let params = chain.genesis().params();
    let contents = epochs::Contents::new(
        me,
        chain.genesis().clone(),
        secret,
        Arc::new(bulwark_core::erasure::ReedSolomonSimd),
        fragments,
        0,
    );
    let replica = EpochHost::resume(me, chain, contents, entered, &pulled);
    tracing::debug!(
        node = me.0,
        fragments,
        epoch = replica.epoch().0,
        settled = replica.settled(),
        "content-hash replica restored"
    );
    let hosting = Hosting {
        replica,
        adapter: host::ContentEpochStorage {
            namespace,
            store: store.clone(),
            n: params.group_size(),
            unsynced: Default::default(),
        },
        members: Members::ById,
        slot: Slot(me.0),
        header: Header::request(ServiceId::CONTENT, NODE_WIDE, entered, 0),
    };
    Ok(((ServiceId::CONTENT, NODE_WIDE), hosting))
}

/// Moves the fragments of the per-group content stores of `legacy` into `namespace`, each under
/// its object's key and this node's slot in that group ([`drain`]).
fn move_legacy_content(
    me: NodeId,
    store: &Store,
    namespace: Namespace,
    legacy: &[GroupView],
) -> Result<u64, NodeError> {
    let mut moved = 0;
    for view in legacy {
        let Some(slot) = view.slot_of(me) else {
            continue;
        };
        let table = Namespace::new(ServiceId::CONTENT, view.id()).table(host::CONTENT);
        drain(store, table, |record, value, ops| {
            let Ok(id) = <[u8; 32]>::try_from(record) else {
                return Ok(());
            };
            let id = content::ContentId(bulwark_core::Digest(id));
            let held = bulwark_core::wire::decode_shared::<content::Held>(
                &bytes::Bytes::copy_from_slice(value),
                usize::MAX,
            );
            if let Ok(held) = held {
                let key = epochs::key_of(&id);
                let piece = epochs::Piece {
                    manifest: held.manifest,
                    index: slot.0,
                    fragment: held.fragment,
                };
                ops.push(StorageOp::Put {
                    table: namespace.table(host::PIECES),
                    key: host::piece_record(&key, slot.0),
                    value: bytes::Bytes::from(bulwark_core::wire::encode(&piece)),
                });
                moved += 1;
            }
            Ok(())
        })?;
    }
    Ok(moved)
}

/// The `(epoch, arc)` of a [`host::pulled_record`].
fn decode_pulled(record: &[u8]) -> Option<(Epoch, RingArc)> {
    let (epoch, ends) = record.split_first_chunk::<8>()?;
    let (after, upto) = ends.split_first_chunk::<32>()?;
    let upto = <[u8; 32]>::try_from(upto).ok()?;
    Some((
        Epoch(u64::from_be_bytes(*epoch)),
        RingArc {
            after: RingPoint(*after),
            upto: RingPoint(upto),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::membership::{PlacementParams, Ring};
    use bulwark_protocol::content::epochs::Pieces;
    use bulwark_protocol::machine::Replica;

    #[test]
    fn fragments_stored_per_group_move_to_the_node_wide_store_under_the_nodes_slot() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let ring =
            Arc::new(Ring::new(Epoch(1), PlacementParams::new(1), (0..4).map(NodeId)).unwrap());
        let view = ring.groups().into_iter().next().unwrap();
        let me = NodeId(2);
        let slot = view.slot_of(me).unwrap();
        let codec = bulwark_core::erasure::ReedSolomonSimd;
        let legacy = Namespace::new(ServiceId::CONTENT, view.id()).table(host::CONTENT);
        let mut objects = Vec::new();
        for seed in 0..5u8 {
            let value = vec![seed; 3_000];
            let encoded = content::Encoded::new(&codec, 4, 1, &value).unwrap();
            let held = content::Held {
                manifest: encoded.manifest.clone(),
                fragment: encoded.fragments[slot.index()].clone(),
            };
            store
                .apply(&[StorageOp::Put {
                    table: legacy,
                    key: encoded.id.as_bytes().to_vec(),
                    value: bytes::Bytes::from(bulwark_core::wire::encode(&held)),
                }])
                .unwrap();
            objects.push(encoded);
        }
        let chain = Chain::new(vec![ring.clone()]);
        let secret = SecretKey::from_seed(&[2; 32]);
        let (_, hosting) = content_replica(
            me,
            &store,
            &chain,
            std::slice::from_ref(&view),
            secret.clone(),
        )
        .unwrap();
        assert_eq!(store.count(legacy).unwrap(), 0, "the old records are gone");
        for encoded in &objects {
            let pieces = hosting.adapter.pieces(&epochs::key_of(&encoded.id));
            assert_eq!(pieces.len(), 1);
            assert_eq!(pieces[0].index, slot.0);
            assert_eq!(pieces[0].fragment, encoded.fragments[slot.index()]);
        }
        assert_eq!(
            Replica::stats(&hosting.replica).versions,
            objects.len() as u64
        );
        // A second start finds nothing more to move, and the fragments where they are.
        let (_, again) =
            content_replica(me, &store, &chain, std::slice::from_ref(&view), secret).unwrap();
        assert_eq!(again.adapter.objects_after(None, 100).len(), objects.len());
    }

    #[test]
    fn a_pulled_record_decodes_to_what_was_recorded_and_nothing_else_does() {
        let arc = RingArc {
            after: RingPoint([7; 32]),
            upto: RingPoint([3; 32]),
        };
        let record = host::pulled_record(Epoch(9), &arc);
        assert_eq!(decode_pulled(&record), Some((Epoch(9), arc)));
        assert_eq!(decode_pulled(&record[1..]), None);
        let mut longer = record.clone();
        longer.push(0);
        assert_eq!(decode_pulled(&longer), None);
    }

    /// A signed version of the object of owner `seed`, numbered `num`, of `len` bytes.
    fn signed(seed: u8, num: u64, len: usize) -> (bulwark_core::Key, pubkey::Entry) {
        use bulwark_protocol::register::{Policy, Timestamp};
        let owner = Arc::new(SecretKey::from_seed(&[seed; 32]));
        let key = pubkey::object_id(&owner.public_key());
        let ts = Timestamp {
            num,
            writer: bulwark_core::ClientId(1),
            seq: num,
        };
        let value = Some(bytes::Bytes::from(vec![seed; len]));
        let entry = pubkey::PubKey::make(&owner, bulwark_core::GroupId(0), &key, ts, value);
        (key, entry)
    }

    #[test]
    fn public_key_versions_filed_by_key_move_into_ring_order_and_are_read_from_disk() {
        use bulwark_protocol::register::reconfig::Versions;
        use bulwark_protocol::transfer::{Resume, ring_order};
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let ring =
            Arc::new(Ring::new(Epoch(0), PlacementParams::new(1), (0..4).map(NodeId)).unwrap());
        let chain = Chain::new(vec![ring.clone()]);
        let view = ring.groups().into_iter().next().unwrap();
        let node_wide = Namespace::new(ServiceId::PUBKEY, NODE_WIDE).table(host::REGISTER);
        let per_group = Namespace::new(ServiceId::PUBKEY, view.id()).table(host::REGISTER);
        let versions: Vec<_> = (1..=40u8)
            .map(|seed| signed(seed, 3, seed as usize))
            .collect();
        let mut ops = Vec::new();
        for (at, (key, entry)) in versions.iter().enumerate() {
            ops.push(StorageOp::Put {
                table: if at % 2 == 0 { node_wide } else { per_group },
                key: key.as_bytes().to_vec(),
                value: bytes::Bytes::from(bulwark_core::wire::encode(&(key, entry))),
            });
        }
        // A key written before the node followed the configuration (filed per group) and again
        // after (node-wide): the newer version is the one kept, whichever table moves last.
        let (twice, older) = signed(1, 2, 1);
        assert_eq!(twice, versions[0].0);
        ops.push(StorageOp::Put {
            table: per_group,
            key: twice.as_bytes().to_vec(),
            value: bytes::Bytes::from(bulwark_core::wire::encode(&(&twice, &older))),
        });
        ops.push(StorageOp::Put {
            table: node_wide,
            key: b"rotten".to_vec(),
            value: bytes::Bytes::from_static(&[0xff; 7]),
        });
        store.apply(&ops).unwrap();

        let rejections = Rejections::default();
        let start = |store: &Arc<Store>| {
            pubkey_replica(
                NodeId(0),
                store,
                &chain,
                std::slice::from_ref(&view),
                &rejections,
            )
            .unwrap()
            .1
        };
        let mut hosting = start(&store);
        assert_eq!(
            store.count(node_wide).unwrap(),
            0,
            "the keyed records are gone"
        );
        assert_eq!(store.count(per_group).unwrap(), 0);
        let placed = Namespace::new(ServiceId::PUBKEY, NODE_WIDE).table(host::PLACED);
        assert_eq!(store.count(placed).unwrap(), 40);
        let stats = Replica::stats(&hosting.replica);
        let bytes: u64 = (1..=40).sum();
        assert_eq!((stats.keys, stats.objects, stats.bytes), (40, 40, bytes));
        let disk: u64 = rejections.snapshot().iter().map(|r| r.count).sum();
        assert_eq!(disk, 1, "the record that does not decode is counted");
        for (key, entry) in &versions {
            assert_eq!(hosting.adapter.version(key).as_ref(), Some(entry));
        }

        // Listing pages in ring order, with a version on its way to disk and a pending drop.
        let (new_key, new_entry) = signed(99, 1, 5);
        let gone = versions[7].0.clone();
        let mut pending = Vec::new();
        let put = bulwark_protocol::transfer::Change::Put {
            key: new_key.clone(),
            entry: new_entry.clone(),
        };
        let drop = bulwark_protocol::transfer::Change::<pubkey::Entry>::Drop { key: gone.clone() };
        use crate::host::Adapter;
        type Server = EpochServer<pubkey::PubKey>;
        Adapter::<Server>::record(&mut hosting.adapter, &put, 1, &mut pending);
        Adapter::<Server>::record(&mut hosting.adapter, &drop, 1, &mut pending);
        let order = ring_order::<bulwark_protocol::register::reconfig::Registers<pubkey::PubKey>>;
        let mut expected: Vec<_> = versions
            .iter()
            .map(|(key, _)| key.clone())
            .filter(|key| *key != gone)
            .chain([new_key.clone()])
            .collect();
        expected.sort_by(|a, b| order(a).cmp(&order(b)));
        let mut listed = Vec::new();
        loop {
            let resume = listed.last().map_or(Resume::Start, Resume::AfterKey);
            let page = hosting.adapter.keys(resume, 7);
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 7);
            listed.extend(page);
        }
        assert_eq!(listed, expected);
        assert_eq!(hosting.adapter.version(&new_key), Some(new_entry.clone()));
        assert_eq!(hosting.adapter.version(&gone), None);

        // Once durable, the same from disk alone, and again after a restart.
        store.apply(&pending).unwrap();
        Adapter::<Server>::durable(&mut hosting.adapter, 1);
        assert!(hosting.adapter.unsynced.is_empty());
        assert_eq!(hosting.adapter.version(&new_key), Some(new_entry.clone()));
        assert_eq!(hosting.adapter.version(&gone), None);
        let restarted = start(&store);
        let everything = restarted.adapter.keys(Resume::Start, 1_000);
        assert_eq!(everything, expected);
        let split = RingPoint::of_key(expected[20].as_bytes());
        let later = restarted.adapter.keys(Resume::AfterPoint(split), 1_000);
        assert_eq!(later, expected[21..].to_vec());
    }
}
