//! `bulwark bench table`: YCSB workloads on hardened tables, each variant beside **Plain**
//! (majority quorums, no signatures, the same code: plain Cassandra's algorithm) in one run, as
//! the paper's §6 lays them out (spec `cassandra.md` §4.7): Plain on 3 and 4 replicas, No-Sign
//! (Byzantine quorums and every message, no cryptography: the algorithm's price), and
//! Proxy-Verifies and Proxy-No-Verify with Ed25519 (the cryptography's price on top).
//!
//! One process, every member of the group and the client driven synchronously
//! (`table::local::LocalGroup`): no network, no disk, one core. What it measures is the CPU an
//! operation costs the whole system, client, proxy and replicas together, which is what bounds
//! throughput on a cluster whose nodes are CPU-bound, and the bytes its messages carry.

use anyhow::{Context, Result, bail};
use bulwark_bench::ycsb::{CoreWorkload, Op, WorkloadSpec, key_name};
use bulwark_core::membership::RingPoint;
use bulwark_core::sign::{PublicKey, SecretKey};
use bulwark_core::{ClientId, Epoch, GroupId, Slot, Time};
use bulwark_protocol::round::OpId;
use bulwark_protocol::table::local::LocalGroup;
use bulwark_protocol::table::{
    Catalog, Cell, Consistency, PairKeys, Place, Position, RANGE_ROWS_MAX, Range, RangeOp, ReadOp,
    Replication, RowKey, Schema, Server, Settings, SignedCell, Variant, WriteOp, Writers,
    replica_pair_keys,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `bulwark bench table`.
#[derive(clap::Args)]
pub struct TableArgs {
    /// Operations per workload and variant.
    #[arg(long, default_value_t = 2000)]
    pub ops: usize,
    /// Rows loaded before each run.
    #[arg(long, default_value_t = 1000)]
    pub records: usize,
    /// YCSB workloads.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,e,f")]
    pub workloads: Vec<char>,
    /// Only these configurations (plain4, plain3, nosign, verifies, noverify, halfsym, fullsym,
    /// eventual): one per process, for counting instructions under callgrind with
    /// `--toggle-collect=*table*timed*`.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

const TABLE: &str = "usertable";
const WRITER: ClientId = ClientId(1);
/// The group's clock: fixed, as the local group's time stands still.
const NOW: Time = Time(1_800_000_000_000);

/// One configuration measured.
#[derive(Clone, Copy)]
pub struct Setup {
    /// What `--only` calls it.
    pub short: &'static str,
    pub name: &'static str,
    pub variant: Variant,
    pub replication: Replication,
    pub n: usize,
}

/// Every configuration of one run, the baseline first.
pub const SETUPS: [Setup; 8] = [
    Setup {
        short: "plain4",
        name: "Plain 4 nodes",
        variant: Variant::Plain,
        replication: Replication::Strong,
        n: 4,
    },
    Setup {
        short: "plain3",
        name: "Plain 3 nodes",
        variant: Variant::Plain,
        replication: Replication::Strong,
        n: 3,
    },
    Setup {
        short: "nosign",
        name: "No-Sign BFT 4 nodes",
        variant: Variant::NoSign,
        replication: Replication::Strong,
        n: 4,
    },
    Setup {
        short: "verifies",
        name: "Proxy-Verifies 4 nodes",
        variant: Variant::ProxyVerifies,
        replication: Replication::Strong,
        n: 4,
    },
    Setup {
        short: "noverify",
        name: "Proxy-No-Verify 4 nodes",
        variant: Variant::ProxyNoVerify,
        replication: Replication::Strong,
        n: 4,
    },
    Setup {
        short: "halfsym",
        name: "Half-Sym 4 nodes",
        variant: Variant::HalfSym,
        replication: Replication::Strong,
        n: 4,
    },
    Setup {
        short: "fullsym",
        name: "Full-Sym 4 nodes",
        variant: Variant::FullSym,
        replication: Replication::Strong,
        n: 4,
    },
    // Spec §2.3: on 2f+1 of the 4 members, quorums of f+1; its peer is Plain on 3.
    Setup {
        short: "eventual",
        name: "Eventual Proxy-Verifies 3 of 4 nodes",
        variant: Variant::ProxyVerifies,
        replication: Replication::Eventual,
        n: 4,
    },
];

/// What one run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    /// Wall time of the operations (one core, CPU-bound).
    pub elapsed: Duration,
    /// Encoded bytes of every message, per operation.
    pub bytes_per_op: f64,
    /// Operations.
    pub ops: usize,
}

impl Measured {
    pub fn micros_per_op(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e6 / self.ops.max(1) as f64
    }
}

/// A group of `setup`'s replicas holding one YCSB table, and the client's keys.
struct Bench {
    setup: Setup,
    schema: Schema,
    group: LocalGroup,
    keys: Arc<[PublicKey]>,
    writers: Arc<Writers>,
    secret: SecretKey,
    /// The MAC keys the client shares with each replica, by slot.
    pairs: Arc<[PairKeys]>,
    columns: Vec<String>,
    next_op: u64,
    stamp: u64,
    rng: ChaCha8Rng,
}

impl Bench {
    fn new(setup: Setup, spec: &WorkloadSpec) -> Result<Bench> {
        let f = (setup.n - 1) / 3;
        let secrets: Vec<SecretKey> = (0..setup.n)
            .map(|i| SecretKey::from_seed(&[i as u8 + 1; 32]))
            .collect();
        let keys: Arc<[PublicKey]> = secrets.iter().map(SecretKey::public_key).collect();
        let secret = SecretKey::from_seed(&[42; 32]);
        let client_key = secret.public_key();
        let writers: Arc<Writers> = Arc::new([(WRITER, client_key)].into_iter().collect());
        let columns: Vec<String> = (0..spec.field_count).map(|i| format!("field{i}")).collect();
        let schema = Schema {
            name: TABLE.into(),
            partition_key: "ycsb_key".into(),
            clustering: Vec::new(),
            columns: columns.clone(),
            variant: setup.variant,
            gc_grace_secs: bulwark_protocol::table::GC_GRACE_DEFAULT_SECS,
            replication: setup.replication,
        };
        let mut catalog = Catalog::default();
        catalog.add(schema.clone()).map_err(anyhow::Error::msg)?;
        let settings = Settings {
            fresh_micros: u64::MAX,
            ..Settings::default()
        };
        let servers = secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| {
                Server::new(
                    place(i, setup.n, f),
                    secret.clone(),
                    keys.clone(),
                    writers.clone(),
                    catalog.clone(),
                    settings,
                )
                .with_pair_keys(Arc::new(replica_pair_keys(secret, [(WRITER, client_key)])))
            })
            .collect();
        let pairs = secrets
            .iter()
            .map(|replica| PairKeys::between(&secret, &replica.public_key()))
            .collect();
        Ok(Bench {
            setup,
            schema,
            group: LocalGroup::new(servers, NOW, WRITER),
            keys,
            writers,
            secret,
            pairs,
            columns,
            next_op: 0,
            stamp: NOW.0 * 1000 - 1_000_000_000,
            rng: ChaCha8Rng::seed_from_u64(7),
        })
    }

    fn place(&self) -> Place {
        place(0, self.setup.n, (self.setup.n - 1) / 3)
    }

    /// Ticks the replicas until each has checked every cell it kept on a Full-Sym tag.
    fn drain(&mut self) {
        while self
            .group
            .servers
            .iter()
            .any(|server| server.unchecked() > 0)
        {
            self.group.tick(1);
        }
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    /// The proxy an operation asks first, spread as clients spread them.
    fn proxy(&self) -> Slot {
        Slot((self.next_op % self.setup.n as u64) as u32)
    }

    fn write(&mut self, key: &str, fields: &[usize], len: usize) -> Result<()> {
        let row = row(key);
        let mut cells: Vec<SignedCell> = Vec::with_capacity(fields.len());
        self.stamp += 1;
        for field in fields {
            let value: Vec<u8> = (0..len)
                .map(|_| self.rng.random_range(b' '..=b'~'))
                .collect();
            let cell = Cell {
                row: row.clone(),
                column: self.columns[*field].clone(),
                ts: self.stamp,
                writer: WRITER,
                value: Some(value),
            };
            let signed = if self.setup.variant.signs() {
                cell.sign(&self.secret)
            } else {
                cell.unsigned()
            };
            cells.push(signed.context("a YCSB cell is within bounds")?);
        }
        let op = self.op();
        let mut machine = WriteOp::new(
            self.place(),
            self.keys.clone(),
            op,
            cells,
            Consistency::Quorum,
            self.proxy(),
        )
        .for_table(&self.schema)
        .with_pair_keys(self.pairs.clone());
        self.group
            .run(&mut machine, 20)
            .map_err(|error| anyhow::anyhow!("a write failed: {error}"))?;
        Ok(())
    }

    fn read(&mut self, key: &str) -> Result<usize> {
        let op = self.op();
        let nonce: [u8; 16] = self.rng.random();
        let mut machine = ReadOp::new(
            self.place(),
            self.keys.clone(),
            self.writers.clone(),
            op,
            row(key),
            Vec::new(),
            nonce,
            Consistency::Quorum,
            self.proxy(),
        )
        .for_table(&self.schema)
        .with_pair_keys(self.pairs.clone());
        let read = self
            .group
            .run(&mut machine, 20)
            .map_err(|error| anyhow::anyhow!("a read failed: {error}"))?;
        Ok(read.cells.len())
    }

    /// A scan of `count` rows (every field) in token order from `start`'s token, as YCSB's
    /// Cassandra binding runs it: pages until `count` rows or the table's end.
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        // Below every row of `start`'s token: real rows have a partition key.
        let mut after = Some(Position {
            token: RingPoint::of_key(start.as_bytes()),
            partition: Vec::new(),
            clustering: Vec::new(),
        });
        let mut rows = 0;
        while rows < count {
            let op = self.op();
            let nonce: [u8; 16] = self.rng.random();
            let range = Range {
                after: after.take(),
                ..Range::scan(TABLE, (count - rows).min(RANGE_ROWS_MAX) as u32)
            };
            let mut machine = RangeOp::new(
                self.place(),
                self.keys.clone(),
                self.writers.clone(),
                op,
                range,
                nonce,
                Consistency::Quorum,
                self.proxy(),
            )
            .for_table(&self.schema)
            .with_pair_keys(self.pairs.clone());
            let page = self
                .group
                .run(&mut machine, 20)
                .map_err(|error| anyhow::anyhow!("a scan failed: {error}"))?;
            rows += page.rows.len();
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(rows)
    }

    /// One YCSB operation: reads take every field, updates and read-modify-writes write one,
    /// inserts the whole row (YCSB's defaults).
    fn run(&mut self, op: &Op, spec: &WorkloadSpec, workload: &CoreWorkload) -> Result<()> {
        let field = self.rng.random_range(0..spec.field_count);
        match op {
            Op::Read { key } => {
                self.read(key)?;
            }
            Op::Update { key } => self.write(key, &[field], spec.field_length)?,
            Op::Insert { key, keynum } => {
                let all: Vec<usize> = (0..spec.field_count).collect();
                self.write(key, &all, spec.field_length)?;
                workload.acknowledge_insert(*keynum);
            }
            Op::ReadModifyWrite { key } => {
                self.read(key)?;
                self.write(key, &[field], spec.field_length)?;
            }
            Op::Scan { start, count } => {
                self.scan(start, *count)?;
            }
        }
        Ok(())
    }
}

fn place(slot: usize, n: usize, f: usize) -> Place {
    Place {
        slot: Slot(slot as u32),
        n,
        f,
        epoch: Epoch(0),
        group: GroupId(0),
    }
}

fn row(key: &str) -> RowKey {
    RowKey {
        table: TABLE.into(),
        partition: key.as_bytes().to_vec(),
        clustering: Vec::new(),
    }
}

/// Loads `records` rows into a fresh group of `setup`, then runs `ops` operations of `spec`:
/// timed, then again (fewer) with every message encoded to count its bytes.
pub fn measure(setup: Setup, spec: &WorkloadSpec, records: usize, ops: usize) -> Result<Measured> {
    let mut bench = Bench::new(setup, spec)?;
    let all: Vec<usize> = (0..spec.field_count).collect();
    for keynum in 0..records as i64 {
        bench.write(&key_name(keynum), &all, spec.field_length)?;
    }
    bench.drain();
    let workload = CoreWorkload::new(spec.clone(), records as i64, ops as i64);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let planned: Vec<Op> = (0..ops).map(|_| workload.next_op(&mut rng)).collect();
    let elapsed = timed(&mut bench, &planned, spec, &workload)?;
    let counted = (ops / 4).max(1);
    bench.group.count_bytes = true;
    for op in planned.iter().take(counted) {
        bench.run(op, spec, &workload)?;
    }
    Ok(Measured {
        elapsed,
        bytes_per_op: bench.group.bytes as f64 / counted as f64,
        ops,
    })
}

/// Operations between two ticks of the replicas (a millisecond of their clock each): how
/// often their periodic work runs.
const TICK_EVERY: usize = 64;

/// The measured operations, in a function of their own so callgrind can count just them.
#[inline(never)]
fn timed(
    bench: &mut Bench,
    planned: &[Op],
    spec: &WorkloadSpec,
    workload: &CoreWorkload,
) -> Result<Duration> {
    let started = Instant::now();
    for (i, op) in planned.iter().enumerate() {
        bench.run(op, spec, workload)?;
        if i % TICK_EVERY == TICK_EVERY - 1 {
            bench.group.tick(1);
        }
    }
    // Full-Sym's signature checks off the write path are part of what its writes cost.
    bench.drain();
    Ok(started.elapsed())
}

pub fn run(args: &TableArgs) -> Result<()> {
    if let Some(unknown) = args
        .only
        .iter()
        .find(|name| !SETUPS.iter().any(|setup| setup.short == name.as_str()))
    {
        bail!(
            "--only {unknown:?}: expected plain4, plain3, nosign, verifies, noverify, halfsym, \
             fullsym or eventual"
        );
    }
    if args.ops == 0 || args.records == 0 {
        bail!("--ops and --records must be at least 1");
    }
    println!(
        "| workload | variant | µs per operation (one core, every party) | ops/s | × Plain 4 nodes | bytes per operation | × Plain 4 nodes |"
    );
    println!("|---|---|---|---|---|---|---|");
    for name in &args.workloads {
        let Some(spec) = WorkloadSpec::standard(*name) else {
            bail!("no YCSB workload {name:?}");
        };
        let mut baseline: Option<Measured> = None;
        let chosen = SETUPS
            .into_iter()
            .filter(|setup| args.only.is_empty() || args.only.iter().any(|o| o == setup.short));
        for setup in chosen {
            let measured = measure(setup, &spec, args.records, args.ops)?;
            let base = *baseline.get_or_insert(measured);
            println!(
                "| {} | {} | {:.1} | {:.0} | {:.2} | {:.0} | {:.2} |",
                spec.name,
                setup.name,
                measured.micros_per_op(),
                1e6 / measured.micros_per_op(),
                measured.micros_per_op() / base.micros_per_op(),
                measured.bytes_per_op,
                measured.bytes_per_op / base.bytes_per_op,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every variant runs every workload the bench offers to the end, and what the variants
    // should differ by, they do: three replicas move less than four.
    #[test]
    fn every_variant_runs_every_workload() {
        for name in ['a', 'b', 'c', 'd', 'e', 'f'] {
            let spec = WorkloadSpec::standard(name).unwrap();
            let measured: Vec<Measured> = SETUPS
                .iter()
                .map(|setup| measure(*setup, &spec, 20, 40).unwrap())
                .collect();
            assert!(measured.iter().all(|m| m.ops == 40 && m.bytes_per_op > 0.0));
            assert!(
                measured[1].bytes_per_op < measured[0].bytes_per_op,
                "{name}: 3 replicas move less than 4"
            );
            assert!(
                measured[7].bytes_per_op < measured[3].bytes_per_op,
                "{name}: an eventual table asks 3 of the 4 members"
            );
        }
    }
}
