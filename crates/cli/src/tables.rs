//! `bulwark table`: hardened tables from the command line.

use crate::ClientArgs;
use crate::objects::{connect, summary};
use anyhow::{Context, Result, bail};
use bulwark_protocol::table::{
    Consistency, GC_GRACE_DEFAULT_SECS, Replication, Resolver, RowKey, Schema, Variant,
};
use clap::{Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum TableCommand {
    /// Creates table NAME on every node.
    Create {
        /// The table's name.
        name: String,
        /// The partition key and clustering columns, a colon, then the regular columns:
        /// `user,ts: name,email` (the key first; no clustering columns: `user: name,email`).
        #[arg(long)]
        schema: String,
        /// Who checks the replicas' signatures: the proxy and the client, or the client alone.
        #[arg(long, value_enum, default_value_t = VariantArg::ProxyVerifies)]
        variant: VariantArg,
        /// Seconds a tombstone is kept (Cassandra's gc_grace_seconds): older ones are
        /// collected, and a version older than this counts only where f+1 members hold it.
        /// Anti-entropy must reach every row well within it, and a node down for longer must
        /// be rebuilt (its data directory removed) before it rejoins.
        #[arg(long, default_value_t = GC_GRACE_DEFAULT_SECS)]
        gc_grace: u64,
        /// `strong`: every member of a group holds the table, and quorum reads see every
        /// completed write. `eventual`: 2f+1 members hold it and quorums are f+1 (a third less
        /// storage); anti-entropy brings every write to all of them, so once writes stop all
        /// reads agree, but until then a read may miss the newest write.
        #[arg(long, value_enum, default_value = "strong", alias = "replication")]
        consistency: ReplicationArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revokes client CLIENT as a table writer on every node (as the administrator: the
    /// client must hold the authority key). Its new writes are refused from then on, and
    /// writes it signed earlier that someone kept cannot be played back; what it wrote before
    /// stays readable.
    Revoke {
        /// The client's name in cluster.toml.
        client_name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Writes COLUMN=VALUE cells of one row, signed by this client.
    Put {
        /// The table.
        name: String,
        /// The row's partition key.
        key: String,
        /// Cells to write, each `column=value`.
        #[arg(required = true)]
        cells: Vec<String>,
        #[command(flatten)]
        row: RowArgs,
    },
    /// Prints a row's live cells, one `column=value` a line.
    Get {
        /// The table.
        name: String,
        /// The row's partition key.
        key: String,
        /// Only these columns (comma-separated); every column when absent.
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
        /// Who resolves answers that disagree: the proxy, or this client (which then has the
        /// proxy write its resolution back, so no proxy checks a signature for it).
        #[arg(long, value_enum, default_value = "proxy")]
        resolve: ResolverArg,
        #[command(flatten)]
        row: RowArgs,
    },
    /// Prints rows in scan order, one a line: `key[/clustering] column=value ...`. With
    /// --partition, that partition's rows between --from and --to (clustering keys); without,
    /// every partition in token order.
    Scan {
        /// The table.
        name: String,
        /// Only this partition's rows.
        #[arg(long)]
        partition: Option<String>,
        /// Clustering keys from this one (with --partition).
        #[arg(long)]
        from: Option<String>,
        /// Clustering keys below this one (with --partition).
        #[arg(long)]
        to: Option<String>,
        /// The most rows printed.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only these columns (comma-separated); every column when absent.
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
        /// How many replicas must answer each page: one, quorum or all.
        #[arg(long, value_enum, default_value_t = Level::Quorum)]
        consistency: Level,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deletes cells of a row with signed tombstones: the --columns named, or every live one.
    Delete {
        /// The table.
        name: String,
        /// The row's partition key.
        key: String,
        /// Only these columns (comma-separated); every live column when absent.
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
        #[command(flatten)]
        row: RowArgs,
    },
}

/// What every row operation takes besides the table and key.
#[derive(clap::Args)]
pub struct RowArgs {
    /// The row's clustering key within its partition (empty for tables without one).
    #[arg(long, default_value = "")]
    clustering: String,
    /// How many replicas must answer: one (f+1), quorum (⌈(n+f+1)/2⌉) or all.
    #[arg(long, value_enum, default_value_t = Level::Quorum)]
    consistency: Level,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum VariantArg {
    /// The proxy verifies every replica's signature before it counts it.
    ProxyVerifies,
    /// Only the client verifies; it re-asks the proxy without replicas whose signatures fail.
    ProxyNoVerify,
    /// Proxy-No-Verify with replicas MACing what they tell the client instead of signing it.
    HalfSym,
    /// Half-Sym, and the client MACs each write to each replica, which then skips the cells'
    /// signatures on the write path (checking them soon after): no public-key verification on
    /// the normal path.
    FullSym,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ReplicationArg {
    /// Every member, Byzantine quorums.
    Strong,
    /// 2f+1 members, quorums of f+1, anti-entropy.
    Eventual,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ResolverArg {
    /// The proxy resolves and writes back; the client checks its work.
    Proxy,
    /// The client resolves from the replicas' answers.
    Client,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Level {
    One,
    Quorum,
    All,
}

impl From<Level> for Consistency {
    fn from(level: Level) -> Consistency {
        match level {
            Level::One => Consistency::One,
            Level::Quorum => Consistency::Quorum,
            Level::All => Consistency::All,
        }
    }
}

/// Parses `key,clustering..: column,column..`.
pub fn parse_schema(
    name: &str,
    text: &str,
    variant: Variant,
    gc_grace_secs: u64,
) -> Result<Schema> {
    let Some((keys, columns)) = text.split_once(':') else {
        bail!("--schema {text:?}: expected `key[,clustering..]: column[,column..]`");
    };
    let names = |list: &str| -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect()
    };
    let mut keys = names(keys);
    if keys.is_empty() {
        bail!("--schema {text:?}: name the partition key before the colon");
    }
    let partition_key = keys.remove(0);
    let schema = Schema {
        name: name.to_string(),
        partition_key,
        clustering: keys,
        columns: names(columns),
        variant,
        gc_grace_secs,
        replication: Replication::Strong,
    };
    if let Some(problem) = schema.problem() {
        bail!("--schema {text:?}: {problem}");
    }
    Ok(schema)
}

fn row(name: &str, key: &str, args: &RowArgs) -> RowKey {
    RowKey {
        table: name.to_string(),
        partition: key.as_bytes().to_vec(),
        clustering: args.clustering.as_bytes().to_vec(),
    }
}

pub async fn run(command: TableCommand) -> Result<()> {
    match command {
        TableCommand::Create {
            name,
            schema,
            variant,
            gc_grace,
            consistency,
            client,
        } => {
            let variant = match variant {
                VariantArg::ProxyVerifies => Variant::ProxyVerifies,
                VariantArg::ProxyNoVerify => Variant::ProxyNoVerify,
                VariantArg::HalfSym => Variant::HalfSym,
                VariantArg::FullSym => Variant::FullSym,
            };
            let mut schema = parse_schema(&name, &schema, variant, gc_grace)?;
            schema.replication = match consistency {
                ReplicationArg::Strong => Replication::Strong,
                ReplicationArg::Eventual => Replication::Eventual,
            };
            let client = connect(&client).await?;
            let created = client.create_table(&schema).await?;
            eprintln!("created table {name:?} on {created} replicas");
        }
        TableCommand::Revoke {
            client_name,
            client,
        } => {
            let client = connect(&client).await?;
            let recorded = client.revoke_table_writer(&client_name).await?;
            eprintln!("revoked {client_name:?} as a table writer on {recorded} replicas");
        }
        TableCommand::Put {
            name,
            key,
            cells,
            row: args,
        } => {
            let cells = cells
                .iter()
                .map(|cell| {
                    let (column, value) = cell
                        .split_once('=')
                        .with_context(|| format!("{cell:?}: expected column=value"))?;
                    Ok((column.to_string(), Some(value.as_bytes().to_vec())))
                })
                .collect::<Result<Vec<_>>>()?;
            let client = connect(&args.client).await?;
            let report = client
                .table_write(&row(&name, &key, &args), &cells, args.consistency.into())
                .await?;
            eprintln!(
                "wrote {} cells of {name}/{key}: {}",
                cells.len(),
                summary(&report)
            );
        }
        TableCommand::Get {
            name,
            key,
            columns,
            resolve,
            row: args,
        } => {
            let mut client = connect(&args.client).await?;
            client.table_resolver = match resolve {
                ResolverArg::Proxy => Resolver::Proxy,
                ResolverArg::Client => Resolver::Client,
            };
            let (found, report) = client
                .table_read(&row(&name, &key, &args), &columns, args.consistency.into())
                .await?;
            for cell in &found.cells {
                if let Some(value) = &cell.value {
                    println!("{}={}", cell.column, String::from_utf8_lossy(value));
                }
            }
            let live = found.cells.iter().filter(|c| c.value.is_some()).count();
            let resolved = if found.resolved {
                " (replicas disagreed; resolved and written back)"
            } else {
                ""
            };
            eprintln!(
                "read {live} live cells of {name}/{key}{resolved}: {} misbehaviour",
                report.evidence.len()
            );
        }
        TableCommand::Scan {
            name,
            partition,
            from,
            to,
            limit,
            columns,
            consistency,
            client,
        } => {
            let client = connect(&client).await?;
            let (rows, report) = client
                .table_scan(
                    &name,
                    partition.as_deref().map(str::as_bytes),
                    from.as_deref().map(str::as_bytes),
                    to.as_deref().map(str::as_bytes),
                    &columns,
                    limit,
                    consistency.into(),
                )
                .await?;
            for (row, found) in &rows {
                let mut line = String::from_utf8_lossy(&row.partition).into_owned();
                if !row.clustering.is_empty() {
                    line.push('/');
                    line.push_str(&String::from_utf8_lossy(&row.clustering));
                }
                for cell in &found.cells {
                    if let Some(value) = &cell.value {
                        line.push_str(&format!(
                            " {}={}",
                            cell.column,
                            String::from_utf8_lossy(value)
                        ));
                    }
                }
                println!("{line}");
            }
            let repaired = if report.repaired {
                " (stale replicas brought up to date)"
            } else {
                ""
            };
            eprintln!(
                "scanned {} rows of {name}{repaired}: {} misbehaviour",
                rows.len(),
                report.evidence.len()
            );
        }
        TableCommand::Delete {
            name,
            key,
            columns,
            row: args,
        } => {
            let client = connect(&args.client).await?;
            let at = row(&name, &key, &args);
            let columns = if columns.is_empty() {
                let (found, _) = client.table_read(&at, &[], args.consistency.into()).await?;
                found
                    .cells
                    .into_iter()
                    .filter(|cell| cell.value.is_some())
                    .map(|cell| cell.column)
                    .collect()
            } else {
                columns
            };
            if columns.is_empty() {
                eprintln!("{name}/{key} has no live cells");
                return Ok(());
            }
            let tombstones: Vec<(String, Option<Vec<u8>>)> =
                columns.iter().map(|c| (c.clone(), None)).collect();
            let report = client
                .table_write(&at, &tombstones, args.consistency.into())
                .await?;
            eprintln!(
                "deleted {} cells of {name}/{key}: {}",
                columns.len(),
                summary(&report)
            );
        }
    }
    Ok(())
}
