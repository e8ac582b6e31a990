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
use bulwark_core::{Epoch, Key, NodeId, ServiceId, Slot};
use bulwark_protocol::content::{self, epochs};
use bulwark_protocol::pubkey;
use bulwark_protocol::register::reconfig::EpochServer;
use bulwark_protocol::transfer::EpochHost;
use bulwark_storage::{Namespace, StorageOp, Store};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A node's public-key replica for every group it is in, in any epoch.
pub type PubKeyReplica = Hosting<EpochServer<pubkey::PubKey>, EpochStorage>;

/// Node `me`'s public-key replica, restored from its namespace, at the epoch it entered last
/// (each ring from `chain`); what it had stored per group before it followed the configuration
/// (the namespaces of `legacy`, its groups of the static placement) is read in too.
pub fn pubkey_replica(
    me: NodeId,
    store: &Store,
    chain: &Chain,
    legacy: &[GroupView],
    rejections: &Rejections,
) -> Result<(ReplicaKey, PubKeyReplica), NodeError> {
    let namespace = Namespace::new(ServiceId::PUBKEY, NODE_WIDE);
    let corrupt = |table: &'static str, problem: String| NodeError::CorruptState { table, problem };
    let mut entries: Vec<(Key, pubkey::Entry)> = Vec::new();
    let legacy: Vec<Namespace> = legacy
        .iter()
        .map(|view| Namespace::new(ServiceId::PUBKEY, view.id()))
        .collect();
    let namespaces = std::iter::once(namespace).chain(legacy.iter().copied());
    // A record that does not decode is dropped, as the other replicas drop theirs: the node
    // lacks that version, as one that missed the write does (see `restore_register`).
    let mut undecodable = Vec::new();
    for from in namespaces {
        let table = from.table(host::REGISTER);
        for (record, value) in store.load(table)? {
            match decode_register(&record, &value) {
                Ok(entry) => entries.push(entry),
                Err(problem) => {
                    tracing::error!(%problem, "stored public-key version does not decode; dropped");
                    rejections.add(
                        "disk",
                        &format!("stored version dropped at start-up: {problem}"),
                        1,
                    );
                    undecodable.push(StorageOp::Delete { table, key: record });
                }
            }
        }
    }
    metrics::counter!("bulwark_node_corrupt_entries_dropped_total")
        .increment(undecodable.len() as u64);
    if !undecodable.is_empty() {
        store.apply(&undecodable)?;
    }
    let (entered, pulled) = followed(store, namespace, chain)?;
    let count = entries.len();
    let replica =
        EpochServer::restore(me, chain, (), entries, entered, &pulled).map_err(|key| {
            corrupt(
                host::REGISTER,
                format!("the stored version of {key:?} has no valid owner signature"),
            )
        })?;
    tracing::debug!(
        node = me.0,
        versions = count,
        epoch = replica.epoch().0,
        settled = replica.settled(),
        "public-key replica restored"
    );
    let hosting = Hosting {
        replica,
        adapter: EpochStorage { namespace, legacy },
        members: Members::ById,
        slot: Slot(me.0),
        header: Header::request(ServiceId::PUBKEY, NODE_WIDE, entered, 0),
    };
    Ok(((ServiceId::PUBKEY, NODE_WIDE), hosting))
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
/// its object's key and this node's slot in that group, and deletes the old records: a few at a
/// time, each batch one durable transaction, so a crash midway leaves every fragment in one
/// store or the other (a fragment in both is written again, the same bytes).
fn move_legacy_content(
    me: NodeId,
    store: &Store,
    namespace: Namespace,
    legacy: &[GroupView],
) -> Result<u64, NodeError> {
    const BATCH: usize = 256;
    let mut moved = 0;
    for view in legacy {
        let Some(slot) = view.slot_of(me) else {
            continue;
        };
        let table = Namespace::new(ServiceId::CONTENT, view.id()).table(host::CONTENT);
        loop {
            let mut ops = Vec::new();
            store.scan_after(table, None, |record, value| {
                let Ok(id) = <[u8; 32]>::try_from(record) else {
                    ops.push(StorageOp::Delete {
                        table,
                        key: record.to_vec(),
                    });
                    return Ok(ops.len() < 2 * BATCH);
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
                ops.push(StorageOp::Delete {
                    table,
                    key: record.to_vec(),
                });
                Ok(ops.len() < 2 * BATCH)
            })?;
            if ops.is_empty() {
                break;
            }
            store.apply(&ops)?;
        }
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
}
