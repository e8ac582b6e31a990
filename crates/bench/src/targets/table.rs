//! Hardened tables as a comparison target: a local Bulwark cluster whose nodes let the
//! unprotected variants be created too, and one table of the variant measured. A YCSB record
//! is one row holding the record in one column (the bytes a register stores), reads and writes
//! are at `QUORUM`, and YCSB-E's scans run in token order from the start key's token.

use crate::driver::Target;
use crate::targets::bulwark::{BulwarkOptions, BulwarkTarget};
use anyhow::{Result, bail};
use bulwark_protocol::table::{Consistency, Replication, RowKey, Schema, Variant};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::time::Duration;

/// What every table system's name starts with.
pub const PREFIX: &str = "table-";
const TABLE: &str = "usertable";
const COLUMN: &str = "record";

/// The systems this target runs, by the variant and replication of their table.
pub const SYSTEMS: [(&str, Variant, Replication); 7] = [
    ("table-plain", Variant::Plain, Replication::Strong),
    ("table-nosign", Variant::NoSign, Replication::Strong),
    (
        "table-proxy-verifies",
        Variant::ProxyVerifies,
        Replication::Strong,
    ),
    (
        "table-proxy-no-verify",
        Variant::ProxyNoVerify,
        Replication::Strong,
    ),
    ("table-half-sym", Variant::HalfSym, Replication::Strong),
    ("table-full-sym", Variant::FullSym, Replication::Strong),
    // Spec §2.3: Proxy-Verifies on 2f+1 of the four nodes, quorums of f+1.
    (
        "table-eventual",
        Variant::ProxyVerifies,
        Replication::Eventual,
    ),
];

/// What goes wrong in a table system's run: its name's suffix after `+`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    None,
    /// `+bad-signer`: one node signs nothing validly, as replica and as proxy (spec
    /// `cassandra.md` §4.5, Fig 16).
    BadSigner,
    /// `+stall-<ms>`: clients move on from a proxy after `ms`, and one node, as proxy, holds
    /// every answer 90% of that (§4.5's stalling proxy).
    Stall { timeout_ms: u64 },
    /// `+timeout-<ms>`: clients move on from a proxy after `ms`, and no node misbehaves: the
    /// stall's baseline at the same timeout.
    Timeout { timeout_ms: u64 },
}

/// The faulty node of a fault run: the last of the four.
const FAULTY: u32 = 3;

impl Fault {
    /// The nodes to start lying, and their `bulwark-byzantine` arguments.
    pub fn byzantine(self) -> Vec<(u32, Vec<String>)> {
        match self {
            Fault::None | Fault::Timeout { .. } => Vec::new(),
            Fault::BadSigner => vec![(FAULTY, vec!["--table".into(), "corrupting".into()])],
            Fault::Stall { timeout_ms } => vec![(
                FAULTY,
                vec!["--stall-table-ms".into(), (timeout_ms * 9 / 10).to_string()],
            )],
        }
    }

    /// The client's wait before it moves to the next proxy, when not its default.
    pub fn retransmit_after(self) -> Option<Duration> {
        match self {
            Fault::None | Fault::BadSigner => None,
            Fault::Stall { timeout_ms } | Fault::Timeout { timeout_ms } => {
                Some(Duration::from_millis(timeout_ms))
            }
        }
    }
}

/// A table system's name taken apart: `table-<variant>[+bad-signer|+stall-<ms>|+timeout-<ms>]`.
pub fn parse(system: &str) -> Result<(Variant, Replication, Fault)> {
    let (base, suffix) = match system.split_once('+') {
        Some((base, suffix)) => (base, Some(suffix)),
        None => (system, None),
    };
    let Some((_, variant, replication)) = SYSTEMS.iter().find(|(name, ..)| *name == base) else {
        let names: Vec<&str> = SYSTEMS.iter().map(|(name, ..)| *name).collect();
        bail!(
            "no table system {base:?}: choose among {}, each optionally followed by \
             +bad-signer, +stall-<ms> or +timeout-<ms>",
            names.join(", ")
        );
    };
    let millis = |text: &str| -> Result<u64> {
        match text.parse::<u64>() {
            Ok(ms) if (10..=60_000).contains(&ms) => Ok(ms),
            _ => bail!("{system:?}: a timeout is 10 to 60000 milliseconds, not {text:?}"),
        }
    };
    let fault = match suffix {
        None => Fault::None,
        Some("bad-signer") => Fault::BadSigner,
        Some(other) => match (other.strip_prefix("stall-"), other.strip_prefix("timeout-")) {
            (Some(ms), _) => Fault::Stall {
                timeout_ms: millis(ms)?,
            },
            (_, Some(ms)) => Fault::Timeout {
                timeout_ms: millis(ms)?,
            },
            _ => bail!(
                "{system:?}: after + comes bad-signer, stall-<ms> or timeout-<ms>, not {other:?}"
            ),
        },
    };
    Ok((*variant, *replication, fault))
}

pub struct TableTarget {
    name: String,
    cluster: BulwarkTarget,
}

impl TableTarget {
    /// Starts the cluster of `options` and creates a table of `variant` and `replication`,
    /// named `system`.
    pub async fn start(
        options: &BulwarkOptions,
        system: &str,
        variant: Variant,
        replication: Replication,
    ) -> Result<TableTarget> {
        let cluster = BulwarkTarget::start(options).await?;
        let schema = Schema {
            name: TABLE.into(),
            partition_key: "key".into(),
            clustering: Vec::new(),
            columns: vec![COLUMN.into()],
            variant,
            gc_grace_secs: bulwark_protocol::table::GC_GRACE_DEFAULT_SECS,
            replication,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_names_name_a_variant_and_a_fault() {
        assert_eq!(
            parse("table-half-sym").unwrap(),
            (Variant::HalfSym, Replication::Strong, Fault::None)
        );
        assert_eq!(
            parse("table-plain+bad-signer").unwrap(),
            (Variant::Plain, Replication::Strong, Fault::BadSigner)
        );
        assert_eq!(
            parse("table-eventual").unwrap(),
            (Variant::ProxyVerifies, Replication::Eventual, Fault::None)
        );
        let (.., stall) = parse("table-full-sym+stall-200").unwrap();
        assert_eq!(stall, Fault::Stall { timeout_ms: 200 });
        assert_eq!(stall.retransmit_after(), Some(Duration::from_millis(200)));
        assert_eq!(
            stall.byzantine(),
            vec![(3, vec!["--stall-table-ms".to_string(), "180".to_string()])]
        );
        assert_eq!(
            parse("table-nosign+timeout-50").unwrap().2,
            Fault::Timeout { timeout_ms: 50 }
        );
        for bad in [
            "table-half",
            "table-plain+stall-5",
            "table-plain+stall-x",
            "table-plain+slow",
            "table-plain+",
        ] {
            assert!(parse(bad).is_err(), "{bad} parsed");
        }
    }
}
