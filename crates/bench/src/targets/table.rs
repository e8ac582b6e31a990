//! Hardened tables as a comparison target: a local Bulwark cluster whose nodes let the
//! unprotected variants be created too, and one table of the variant measured. A YCSB record
//! is one row holding the record in one column (the bytes a register stores), reads and writes
//! are at `QUORUM`, and YCSB-E's scans run in token order from the start key's token.

use crate::driver::Target;
use crate::targets::bulwark::{BulwarkOptions, BulwarkTarget};
use anyhow::{Result, bail};
use bulwark_protocol::table::{Consistency, RowKey, Schema, Variant};
use bytes::Bytes;
use futures::future::BoxFuture;

/// What every table system's name starts with.
pub const PREFIX: &str = "table-";
const TABLE: &str = "usertable";
const COLUMN: &str = "record";

/// The systems this target runs, by the variant of their table.
pub const SYSTEMS: [(&str, Variant); 6] = [
    ("table-plain", Variant::Plain),
    ("table-nosign", Variant::NoSign),
    ("table-proxy-verifies", Variant::ProxyVerifies),
    ("table-proxy-no-verify", Variant::ProxyNoVerify),
    ("table-half-sym", Variant::HalfSym),
    ("table-full-sym", Variant::FullSym),
];

pub struct TableTarget {
    name: String,
    cluster: BulwarkTarget,
}

impl TableTarget {
    /// Starts the cluster of `options` and creates the table of `system`'s variant.
    pub async fn start(options: &BulwarkOptions, system: &str) -> Result<TableTarget> {
        let Some((_, variant)) = SYSTEMS.iter().find(|(name, _)| *name == system) else {
            let names: Vec<&str> = SYSTEMS.iter().map(|(name, _)| *name).collect();
            bail!(
                "no table system {system:?}: choose among {}",
                names.join(", ")
            );
        };
        let cluster = BulwarkTarget::start(options).await?;
        let schema = Schema {
            name: TABLE.into(),
            partition_key: "key".into(),
            clustering: Vec::new(),
            columns: vec![COLUMN.into()],
            variant: *variant,
        };
        cluster.client().create_table(&schema).await?;
        Ok(TableTarget {
            name: system.to_string(),
            cluster,
        })
    }
}

fn row(key: &str) -> RowKey {
    RowKey {
        table: TABLE.into(),
        partition: key.as_bytes().to_vec(),
        clustering: Vec::new(),
    }
}

impl Target for TableTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn read(&self, key: String) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let client = self.cluster.client();
            let (found, _) = client
                .table_read(&row(&key), &[], Consistency::Quorum)
                .await?;
            Ok(found.value(COLUMN).is_some())
        })
    }

    fn write(&self, key: String, value: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let cells = [(COLUMN.to_string(), Some(value.to_vec()))];
            self.cluster
                .client()
                .table_write(&row(&key), &cells, Consistency::Quorum)
                .await?;
            Ok(())
        })
    }

    fn can_scan(&self) -> bool {
        true
    }

    fn scan(&self, start: String, count: usize) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move {
            let client = self.cluster.client();
            let (rows, _) = client
                .table_scan_from(TABLE, start.as_bytes(), count, Consistency::Quorum)
                .await?;
            Ok(rows.len())
        })
    }

    fn pids(&self) -> Vec<u32> {
        self.cluster.pids()
    }

    fn bytes_sent(&self) -> BoxFuture<'_, Option<u64>> {
        self.cluster.bytes_sent()
    }
}
