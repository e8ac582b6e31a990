//! Records as a node or the gateway reads them back from storage: a damaged disk must never
//! panic the reader. The first byte picks the record kind.
#![no_main]

use bulwark_core::Key;
use bulwark_core::configuration::{self, ConfigCert};
use bulwark_core::evidence::Evidence;
use bulwark_fuzz::round_trip;
use bulwark_gateway::layout::{self, BucketRecord, IndexShard, UploadRecord};
use bulwark_protocol::cs::ConfigService;
use bulwark_protocol::powerstore::{Candidate, StoredEntry};
use bulwark_protocol::register::Policy;
use bulwark_protocol::{abd, content, depot, pbft, phalanx, pubkey, table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, record)) = data.split_first() else {
        return;
    };
    let max = usize::MAX;
    match kind % 15 {
        0 => drop(round_trip::<(Key, StoredEntry)>(record, max)),
        1 => drop(round_trip::<(Key, Candidate)>(record, max)),
        2 => drop(round_trip::<content::Held>(record, max)),
        3 => drop(round_trip::<(Key, <abd::Abd as Policy>::Entry)>(
            record, max,
        )),
        4 => drop(round_trip::<(Key, <phalanx::Phalanx as Policy>::Entry)>(
            record, max,
        )),
        5 => drop(round_trip::<(Key, <pubkey::PubKey as Policy>::Entry)>(
            record, max,
        )),
        6 => {
            // A CS replica's records, on either agreement core.
            drop(round_trip::<pbft::Change<ConfigService>>(
                record,
                2 * bulwark_core::wire::FRAME_BYTES_MAX,
            ));
            drop(round_trip::<pbft::ea::Change<ConfigService>>(
                record,
                2 * bulwark_core::wire::FRAME_BYTES_MAX,
            ));
        }
        7 => drop(round_trip::<ConfigCert>(
            record,
            configuration::CERT_BYTES_MAX,
        )),
        8 => drop(Evidence::decode(record)),
        9 => {
            let _ = layout::decode_manifest("bucket/key", record);
            let _ = layout::decode_head("bucket/key", record);
        }
        12 => {
            // A causal volume's records, split three ways at the first two bytes.
            let (cut, rest) = record.split_at(record.len().min(2));
            let cut = cut
                .iter()
                .map(|b| *b as usize)
                .sum::<usize>()
                .min(rest.len());
            let (values, updates) = rest.split_at(cut);
            let one =
                |bytes: &[u8], key: Vec<u8>| vec![(key, bytes::Bytes::copy_from_slice(bytes))];
            let _ = depot::records::restore(depot::records::Tables {
                values: one(values, depot::update::value_hash(values).0.to_vec()),
                stored: vec![(updates.to_vec(), values.len() as u64)],
                forks: one(updates, vec![0; 4]),
                updates: one(updates, 0u64.to_be_bytes().to_vec()),
                discarded: one(&[], values.to_vec()),
                accepted: one(values, 0u64.to_be_bytes().to_vec()),
            });
        }
        13 => drop(round_trip::<depot::VolumeConfig>(record, max)),
        14 => {
            // A table replica's records: a schema, a signed cell, or a revocation.
            drop(round_trip::<table::Schema>(record, table::SCHEMA_BYTES_MAX));
            drop(round_trip::<table::SignedCell>(record, max));
            drop(round_trip::<
                bulwark_core::sign::Unverified<table::Revocation>,
            >(record, 1024));
        }
        10 => {
            let _ = layout::decode::<BucketRecord>("bucket", record);
            let _ = layout::decode_extended::<UploadRecord>("upload", record);
            let _ = layout::decode_extended::<BucketRecord>("bucket", record);
            let _ = layout::decode_bucket(record);
            let _ = layout::decode::<layout::VersionList>("version list", record);
            let _ = layout::decode::<layout::MarkerShard>("marker shard", record);
            let _ = layout::decode::<layout::StoredPart>("part", record);
            let _ = layout::decode_part(record);
        }
        _ => {
            let _ = layout::decode::<IndexShard>("index shard", record);
        }
    }
});
