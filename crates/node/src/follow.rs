//! Replicas that follow the configuration from epoch to epoch (Rosebud §4.7): one per service
//! for the whole node, whatever groups it is in, keeping one version per key across epochs and
//! pulling the keys of the arcs it takes over. Public-key objects are served this way; the
//! manager of the configuration chain hands each one every newly certified ring.

use crate::host::{self, EpochStorage, Hosting, Members, NODE_WIDE};
use crate::shard::ReplicaKey;
use crate::{NodeError, Rejections, decode_register};
use bulwark_core::envelope::Header;
use bulwark_core::membership::{Arc as RingArc, Chain, GroupView, RingPoint};
use bulwark_core::{Epoch, Key, NodeId, ServiceId, Slot};
use bulwark_protocol::pubkey;
use bulwark_protocol::register::reconfig::EpochServer;
use bulwark_storage::{Namespace, StorageOp, Store};
use std::collections::BTreeSet;

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
