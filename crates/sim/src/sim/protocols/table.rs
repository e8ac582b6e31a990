//! Hardened tables (spec `cassandra.md`) in the simulator: the real replica, proxy and client
//! machines on one group of `3f+1`, under every network and server fault and up to `f` lying
//! members, each of which lies both as a replica and as a proxy.
//!
//! The world's workload writes and reads whole values of one key; here each key is the row of
//! its name in a table with one column, and each write is one cell signed by its client, stamped
//! with the clock every simulated client shares (virtual milliseconds, plus the client's index
//! in the microseconds so no two clients' cells tie). With a synchronised clock the paper's
//! per-cell guarantee at `QUORUM` (a read returns a version at least as new as every write that
//! completed before it, and reads never go back) makes a cell a linearizable register: writes
//! take effect in timestamp order, which is their real-time order, and a read writes back what
//! it returns before it returns. So the world's linearizability checker judges these runs, and a
//! broken variant is caught as a history no order explains.

use crate::byzantine::Behaviour;
use crate::checker::{self, History, KeyReport, KeyVerdict, OpKind, Outcome, Report, Violation};
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use crate::sim::world::history_name;
use bulwark_core::sign::{PublicKey, SecretKey, Signature, Signed, Unverified};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, ServiceId, Slot, Time};
use bulwark_protocol::machine::{Access, Operation, Output, Progress, Replica, ReplicaStats};
use bulwark_protocol::round::OpId;
use bulwark_protocol::table::{
    Answered, Catalog, Cell, Change, Consistency, Message, PairKeys, Place, Range, RangeAnswered,
    RangeOp, RangeOutcome, ReadOp, ReadOutcome, ReadPath, Replication, Request, RequestBody,
    Resolver, Response, ResponseBody, Revocation, RowKey, Schema, Server, Settings, SignedCell,
    TableMutations, Variant, WriteAck, WriteOp, WriteOutcome, Writers, entries_of,
    replica_pair_keys,
};
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;

/// The one table and column every run uses.
const TABLE: &str = "sim";
const COLUMN: &str = "v";

/// How the run's table is replicated: the strong tables the linearizability checker judges, or
/// the eventual ones (spec §2.3) judged on validity and convergence.
pub trait Mode: Send + Sync + 'static {
    const REPLICATION: Replication;
}

/// Strong tables: every member a replica, Byzantine quorums.
pub struct Strong;

/// Eventual tables: `2f+1` replicas, quorums of `f+1`.
pub struct Eventual;

impl Mode for Strong {
    const REPLICATION: Replication = Replication::Strong;
}

impl Mode for Eventual {
    const REPLICATION: Replication = Replication::Eventual;
}

/// A run on a strong table.
pub type TableSim = Tables<Strong>;

/// A run on an eventual table: reads return only what was written, and once the run settles
/// (anti-entropy with every fault healed) the correct replicas hold the same cells, none older
/// than an acknowledged write.
pub type EventualTableSim = Tables<Eventual>;

/// One run's group of table replicas and its clients' keys.
pub struct Tables<M: Mode> {
    f: usize,
    secrets: Vec<SecretKey>,
    keys: Arc<[PublicKey]>,
    clients: Vec<SecretKey>,
    writers: Arc<Writers>,
    catalog: Catalog,
    mutations: TableMutations,
    /// The MAC keys each replica shares with the clients, by replica.
    replica_pairs: Vec<Arc<HashMap<ClientId, PairKeys>>>,
    /// The MAC keys each client shares with the replicas, by client and slot.
    client_pairs: Vec<Arc<[PairKeys]>>,
    /// The administrator's key, which signed `revocation`.
    authority: PublicKey,
    /// A writer revoked before the run began (spec §2.13): a Byzantine client whose key the
    /// forging members hold, so they answer with writes it signed and saved for later.
    revoked: (ClientId, SecretKey),
    revocation: Unverified<Revocation>,
    schema: Schema,
    mode: PhantomData<M>,
}

fn row(key: &Key) -> RowKey {
    RowKey {
        table: TABLE.into(),
        partition: key.as_bytes().to_vec(),
        clustering: Vec::new(),
    }
}

fn settings() -> Settings {
    Settings {
        skew_max_micros: 1_000_000,
        // Runs last minutes of virtual time at most: every write is fresh.
        fresh_micros: 3_600_000_000,
        proxy_wait_millis: 300,
        // Virtual time is the clock clients and replicas share.
        wall_at_zero_millis: 0,
        anti_entropy_millis: 500,
        unprotected_tables: false,
    }
}

impl<M: Mode> Tables<M> {
    fn place(&self, slot: usize) -> Place {
        Place {
            slot: Slot(slot as u32),
            n: self.secrets.len(),
            f: self.f,
            epoch: Epoch(0),
            group: GroupId(0),
        }
    }

    fn honest(&self, index: usize) -> Server {
        let mut server = Server::new(
            self.place(index),
            self.secrets[index].clone(),
            self.keys.clone(),
            self.writers.clone(),
            self.catalog.clone(),
            settings(),
        )
        .with_mutations(self.mutations)
        .with_pair_keys(self.replica_pairs[index].clone())
        .with_authority(self.authority);
        server.restore_revocation(self.revocation.clone());
        server
    }

    /// Each operation starts at a proxy its id picks, so proxies (lying ones too) share the load.
    fn proxy(&self, op: OpId) -> Slot {
        Slot((op.0 % self.secrets.len() as u64) as u32)
    }
}

/// One server's disk: the newest cell of each row and column, and the tables it learned after
/// the run's own.
#[derive(Default)]
pub struct TableDisk {
    cells: BTreeMap<(RowKey, String), SignedCell>,
    schemas: BTreeMap<String, Schema>,
    revocations: Vec<Unverified<Revocation>>,
}

impl<M: Mode> Protocol for Tables<M> {
    type Request = Request;
    type Response = Response;
    type Change = Change;
    type Disk = TableDisk;
    type Server = TableNode;
    type Write = WriteOp;
    type Read = TableRead;

    fn nodes(f: usize) -> usize {
        3 * f + 1
    }

    /// The storage catalogue and every network and server fault; no catalogue of Byzantine
    /// readers (a read changes what a replica holds only through a write-back of a cell its
    /// writer signed, which a reader cannot make up).
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| behaviour.is_storage());
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    /// Anti-entropy offers a window of rows every 500 ms to the next member in turn: some
    /// passes to bring every replica every row once the faults heal.
    const SETTLE_MILLIS: u64 = match M::REPLICATION {
        Replication::Strong => 0,
        Replication::Eventual => 10_000,
    };

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Tables<M> {
        let n = Self::nodes(config.f);
        let secrets: Vec<SecretKey> = (0..n)
            .map(|_| SecretKey::from_seed(&rng.random()))
            .collect();
        let keys = secrets.iter().map(SecretKey::public_key).collect();
        let clients: Vec<SecretKey> = (0..config.clients)
            .map(|_| SecretKey::from_seed(&rng.random()))
            .collect();
        let mut writers = Writers::default();
        for (i, secret) in clients.iter().enumerate() {
            writers.insert(ClientId(i as u32), secret.public_key());
        }
        let revoked = (
            ClientId(clients.len() as u32),
            SecretKey::from_seed(&rng.random()),
        );
        writers.insert(revoked.0, revoked.1.public_key());
        let authority = SecretKey::from_seed(&rng.random());
        let order = Revocation {
            client: revoked.0,
            at_micros: 0,
        };
        let Ok(revocation) = Signed::sign(&authority, order) else {
            unreachable!("a revocation is within its bounds");
        };
        let variant = [
            Variant::ProxyVerifies,
            Variant::ProxyNoVerify,
            Variant::HalfSym,
            Variant::FullSym,
        ][rng.random_range(0..4)];
        let replica_pairs = secrets
            .iter()
            .map(|secret| {
                let clients = clients
                    .iter()
                    .enumerate()
                    .map(|(i, client)| (ClientId(i as u32), client.public_key()));
                Arc::new(replica_pair_keys(secret, clients))
            })
            .collect();
        let client_pairs = clients
            .iter()
            .map(|client| {
                secrets
                    .iter()
                    .map(|secret| PairKeys::between(client, &secret.public_key()))
                    .collect()
            })
            .collect();
        let mut catalog = Catalog::default();
        let schema = Schema {
            name: TABLE.into(),
            partition_key: "key".into(),
            clustering: Vec::new(),
            columns: vec![COLUMN.into()],
            variant,
            gc_grace_secs: bulwark_protocol::table::GC_GRACE_DEFAULT_SECS,
            replication: M::REPLICATION,
        };
        if let Err(problem) = catalog.add(schema.clone()) {
            unreachable!("the simulated table is well formed: {problem}");
        }
        Tables {
            f: config.f,
            secrets,
            keys,
            clients,
            writers: Arc::new(writers),
            catalog,
            mutations: config.mutations.table,
            replica_pairs,
            client_pairs,
            authority: authority.public_key(),
            revoked,
            revocation: revocation.to_unverified(),
            schema,
            mode: PhantomData,
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, _seed: u64) -> TableNode {
        TableNode::lying(self.honest(index), behaviour, self.secrets[index].clone())
            .with_saved_writes(self.revoked.clone())
    }

    fn restore(&self, index: usize, disk: &TableDisk, _now: u64) -> TableNode {
        let mut node = self.server(index, Behaviour::Honest, 0);
        for schema in disk.schemas.values() {
            if self.catalog.get(&schema.name).is_none() {
                node.honest.restore_schema(schema.clone());
            }
        }
        for cell in disk.cells.values() {
            node.honest.restore(cell.clone());
        }
        for revocation in &disk.revocations {
            node.honest.restore_revocation(revocation.clone());
        }
        node
    }

    fn view(_storage: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut TableDisk, change: &Change) {
        match change {
            Change::Put { row, column, cell } => {
                disk.cells
                    .insert((row.clone(), column.clone()), cell.clone());
            }
            Change::Schema(schema) => {
                disk.schemas.insert(schema.name.clone(), schema.clone());
            }
            Change::Remove { row, column } => {
                disk.cells.remove(&(row.clone(), column.clone()));
            }
            Change::Revoke(revocation) => disk.revocations.push(revocation.clone()),
        }
    }

    fn disk_versions(disk: &TableDisk) -> usize {
        disk.cells.len()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> WriteOp {
        let cell = Cell {
            row: row(&key),
            column: COLUMN.into(),
            ts: now * 1000 + client as u64,
            writer: ClientId(client as u32),
            value: value.map(|v| v.to_vec()),
        };
        let Some(signed) = cell.sign(&self.clients[client]) else {
            unreachable!("simulated values are within a cell's bounds");
        };
        WriteOp::new(
            self.place(0),
            self.keys.clone(),
            op,
            vec![signed],
            Consistency::Quorum,
            self.proxy(op),
        )
        .with_mutations(self.mutations)
        .for_table(&self.schema)
        .with_pair_keys(self.client_pairs[client].clone())
    }

    /// Every third read is a range read of the key's partition: the same cell through the
    /// page path (a walk, a bound, client-side resolution, a listing written back); of the
    /// others, every second is resolved by its client (spec §3.6).
    fn read(&self, client: usize, key: Key, op: OpId) -> TableRead {
        // Unique per operation, which is all a nonce must be against replicas that do not see
        // the reader's generator.
        let mut seed = op.0.to_le_bytes().to_vec();
        seed.extend((client as u64).to_le_bytes());
        let digest = Digest::of("bulwark/sim/table-nonce", &seed);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&digest.0[..16]);
        if op.0.is_multiple_of(3) {
            let range = Range {
                columns: vec![COLUMN.into()],
                ..Range::partition(TABLE, key.as_bytes(), 1)
            };
            return TableRead::Range(
                RangeOp::new(
                    self.place(0),
                    self.keys.clone(),
                    self.writers.clone(),
                    op,
                    range,
                    nonce,
                    Consistency::Quorum,
                    self.proxy(op),
                )
                .with_mutations(self.mutations)
                .for_table(&self.schema)
                .with_pair_keys(self.client_pairs[client].clone())
                .with_authority(self.authority),
            );
        }
        let resolver = if op.0 % 3 == 1 {
            Resolver::Client
        } else {
            Resolver::Proxy
        };
        TableRead::Point(
            ReadOp::new(
                self.place(0),
                self.keys.clone(),
                self.writers.clone(),
                op,
                row(&key),
                vec![COLUMN.into()],
                nonce,
                Consistency::Quorum,
                self.proxy(op),
            )
            .with_mutations(self.mutations)
            .for_table(&self.schema)
            .with_pair_keys(self.client_pairs[client].clone())
            .with_authority(self.authority)
            .with_resolver(resolver),
        )
    }

    fn response_op(response: &Response) -> OpId {
        OpId(response.op)
    }

    fn request_name(request: &Request) -> &'static str {
        match request.body {
            RequestBody::Write { .. } => "write",
            RequestBody::Read { .. } => "read",
            RequestBody::WriteBack { .. } => "write-back",
            RequestBody::Range { .. } => "range",
            RequestBody::Create { .. } => "create",
            RequestBody::Describe { .. } => "describe",
            RequestBody::Revoke { .. } => "revoke",
        }
    }

    fn request_kind(request: &Request) -> usize {
        match request.body {
            RequestBody::Write { .. } => 1,
            RequestBody::Read { .. }
            | RequestBody::Range { .. }
            | RequestBody::WriteBack { .. } => 3,
            RequestBody::Create { .. }
            | RequestBody::Describe { .. }
            | RequestBody::Revoke { .. } => 0,
        }
    }

    fn describe_request(request: &Request) -> String {
        let detail = match &request.body {
            RequestBody::Write { skip, want, .. } => format!(" want={want} skip={skip:?}"),
            RequestBody::Read {
                blacklist, full, ..
            } => format!(" blacklist={blacklist:?} full={full}"),
            RequestBody::Range { blacklist, .. } => format!(" blacklist={blacklist:?}"),
            RequestBody::WriteBack { current, .. } => format!(" current={current:?}"),
            RequestBody::Create { schema } => format!(" {}", schema.name),
            RequestBody::Describe { table } => format!(" {table}"),
            RequestBody::Revoke { .. } => String::new(),
        };
        format!("{} op{}{detail}", Self::request_name(request), request.op)
    }

    fn describe_response(response: &Response) -> String {
        let detail = match &response.body {
            ResponseBody::Acks(acks) => format!("{} acks", acks.len()),
            ResponseBody::Read {
                answers, resolved, ..
            } => format!(
                "{} answers{}",
                answers.len(),
                if resolved.is_some() { ", resolved" } else { "" }
            ),
            ResponseBody::Range {
                answers,
                write_backs,
                ..
            } => format!(
                "{} pages, {} written back",
                answers.len(),
                write_backs.len()
            ),
            ResponseBody::Created => "created".to_string(),
            ResponseBody::Schema(schema) => format!("schema {}", schema.name),
            ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
        };
        format!("{detail} op{}", response.op)
    }

    fn describe_message(message: &Message) -> String {
        match message {
            Message::Store { pop, .. } => format!("store p{pop}"),
            Message::StoreAck { pop, .. } => format!("store-ack p{pop}"),
            Message::Read { pop, data, .. } => format!("read p{pop} data={data}"),
            Message::Answer { pop, .. } => format!("answer p{pop}"),
            Message::WriteBack { pop, .. } => format!("write-back p{pop}"),
            Message::WriteBackAck { pop, .. } => format!("write-back-ack p{pop}"),
            Message::Refused { pop, refusal } => format!("refused p{pop}: {refusal}"),
            Message::RangeRead { pop, .. } => format!("range p{pop}"),
            Message::RangeAnswer { pop, .. } => format!("page p{pop}"),
            Message::RangeWriteBack { pop, .. } => format!("range-write-back p{pop}"),
            Message::RangeWriteBackAck { pop, .. } => format!("range-write-back-ack p{pop}"),
            Message::SyncOffer { round, listing, .. } => {
                format!("sync-offer r{round} {} rows", listing.len())
            }
            Message::SyncReply { round, want, cells } => {
                format!(
                    "sync-reply r{round} want {} cells {}",
                    want.len(),
                    cells.len()
                )
            }
            Message::SyncCells { round, cells } => format!("sync-cells r{round} {}", cells.len()),
            Message::Schema { schema } => format!("schema {}", schema.name),
            Message::Revocations { revocations } => format!("revocations {}", revocations.len()),
            Message::Live { round, cells } => format!("live r{round} {}", cells.len()),
            Message::LiveReply { round, held } => {
                let holds = held.iter().filter(|h| **h).count();
                format!("live-reply r{round} {holds}/{}", held.len())
            }
        }
    }

    fn check(&self, history: &History, servers: &[Option<&TableNode>]) -> Report {
        match M::REPLICATION {
            Replication::Strong => checker::check(history),
            Replication::Eventual => self.check_eventual(history, servers),
        }
    }
}

impl<M: Mode> Tables<M> {
    /// Spec §5.2 "eventual mode": every read returned a value some write wrote (or none), and
    /// after the run settled, the correct replicas that are up hold the same version of every
    /// key, one at least as new as every acknowledged write of it.
    fn check_eventual(&self, history: &History, servers: &[Option<&TableNode>]) -> Report {
        let replicas = self.schema.replicas(self.secrets.len(), self.f);
        let correct: Vec<&TableNode> = replicas
            .iter()
            .filter_map(|slot| servers.get(slot.index()).copied().flatten())
            .collect();
        let mut by_key: BTreeMap<&[u8], Vec<&checker::Op>> = BTreeMap::new();
        for op in &history.ops {
            by_key.entry(&op.key).or_default().push(op);
        }
        let mut report = Report::default();
        for (key, ops) in by_key {
            let mut problems = Vec::new();
            // A write's cell timestamp, as `Protocol::write` stamps it: the history names a
            // client as its index times 1000 plus its incarnation.
            let stamp = |op: &checker::Op| op.invoke * 1000 + op.client / 1000;
            let written: Vec<(u64, &checker::Value)> = ops
                .iter()
                .filter_map(|op| match &op.kind {
                    OpKind::Write(value) => Some((stamp(op), value)),
                    OpKind::Read => None,
                })
                .collect();
            for op in &ops {
                if let Some(Some(value)) = op.returned()
                    && !written.iter().any(|(_, v)| v.as_ref() == Some(value))
                {
                    problems.push(format!(
                        "client {} read [{}, {:?}] returned a value no write of this key wrote",
                        op.client, op.invoke, op.complete
                    ));
                }
            }
            let row = RowKey {
                table: TABLE.into(),
                partition: key.to_vec(),
                clustering: Vec::new(),
            };
            let held: Vec<Option<(u64, checker::Value)>> = correct
                .iter()
                .map(|node| {
                    node.honest
                        .cells(&row)
                        .into_iter()
                        .find(|cell| cell.column == COLUMN)
                        .map(|cell| {
                            let name = cell.value.map(|value| {
                                history_name(&value).unwrap_or_else(|| b"unwritten".to_vec())
                            });
                            (cell.ts, name)
                        })
                })
                .collect();
            if held.windows(2).any(|pair| pair[0] != pair[1]) {
                let versions: Vec<Option<u64>> =
                    held.iter().map(|h| h.as_ref().map(|(ts, _)| *ts)).collect();
                problems.push(format!(
                    "after settling, the correct replicas {replicas:?} hold different versions: \
                     {versions:?}"
                ));
            }
            let acknowledged = ops
                .iter()
                .filter(|op| matches!(op.kind, OpKind::Write(_)) && op.outcome == Outcome::Ok)
                .map(|op| stamp(op))
                .max();
            if let (Some(newest), Some(first)) = (acknowledged, held.first()) {
                match first {
                    Some((ts, value)) if *ts >= newest => {
                        if !written.iter().any(|(at, v)| at == ts && *v == value) {
                            problems.push(format!("the replicas hold version {ts}, never written"));
                        }
                    }
                    other => problems.push(format!(
                        "an acknowledged write (version {newest}) is lost: the correct replicas \
                         hold {:?}",
                        other.as_ref().map(|(ts, _)| ts)
                    )),
                }
            }
            report.keys_checked += 1;
            report.ops_checked += ops.len();
            report.keys.push(KeyReport {
                key: key.to_vec(),
                verdict: if problems.is_empty() {
                    KeyVerdict::Linearizable
                } else {
                    KeyVerdict::Violation
                },
                ops: ops.len(),
                segments: 0,
                steps: 0,
            });
            if !problems.is_empty() {
                report.violations.push(Violation {
                    key: key.to_vec(),
                    explanation: problems.join("; "),
                    conflicting: Vec::new(),
                });
            }
        }
        report.ok = report.violations.is_empty();
        report
    }
}

impl Finish for WriteOutcome {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: format!("{} acks via {} proxies", self.acks.len(), self.proxies),
            evidence: self
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            repaired: false,
            restarts: self.proxies.saturating_sub(1) as u32,
            one_round: false,
        }
    }
}

impl Finish for ReadOutcome {
    fn finish(self) -> Finished {
        let value = self
            .cells
            .iter()
            .find(|cell| cell.column == COLUMN)
            .and_then(|cell| cell.value.clone())
            .map(Bytes::from);
        Finished {
            version: format!("{:?}", self.cells.first().map(|cell| cell.ts)),
            evidence: self
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            read: Some(value),
            repaired: matches!(self.path, ReadPath::Resolved { written_back } if written_back > 0),
            restarts: self.proxies.saturating_sub(1) as u32,
            one_round: self.path == ReadPath::Fast,
        }
    }
}

/// A read of one key: of its row, or of its partition as a range.
pub enum TableRead {
    /// A row read.
    Point(ReadOp),
    /// A range read of the key's partition.
    Range(RangeOp),
}

/// How a [`TableRead`] ended.
pub enum TableReadOutcome {
    /// A row read's outcome.
    Point(ReadOutcome),
    /// A range read's page.
    Range(RangeOutcome),
}

fn lift<O: Operation<Request = Request>>(
    progress: Progress<O>,
    wrap: impl FnOnce(O::Output) -> TableReadOutcome,
) -> Progress<TableRead> {
    match progress {
        Progress::Send(sends) => Progress::Send(sends),
        Progress::Done(result) => Progress::Done(result.map(wrap)),
    }
}

impl Operation for TableRead {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Output = TableReadOutcome;

    fn op(&self) -> u64 {
        match self {
            TableRead::Point(op) => op.op(),
            TableRead::Range(op) => op.op(),
        }
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        match self {
            TableRead::Point(op) => op.start(),
            TableRead::Range(op) => op.start(),
        }
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        match self {
            TableRead::Point(op) => lift(op.on_reply(from, reply), TableReadOutcome::Point),
            TableRead::Range(op) => lift(op.on_reply(from, reply), TableReadOutcome::Range),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        match self {
            TableRead::Point(op) => op.on_timeout(),
            TableRead::Range(op) => op.on_timeout(),
        }
    }

    fn answered(&self) -> Vec<Slot> {
        match self {
            TableRead::Point(op) => op.answered(),
            TableRead::Range(op) => op.answered(),
        }
    }

    fn quorum(&self) -> usize {
        1
    }
}

impl Finish for TableReadOutcome {
    fn finish(self) -> Finished {
        let page = match self {
            TableReadOutcome::Point(outcome) => return outcome.finish(),
            TableReadOutcome::Range(page) => page,
        };
        // A page of the key's partition: its one row, or none.
        let cell = page
            .rows
            .iter()
            .flat_map(|(_, cells)| cells)
            .find(|cell| cell.column == COLUMN);
        Finished {
            version: format!("{:?} (page)", cell.map(|cell| cell.ts)),
            evidence: page
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            read: Some(cell.and_then(|cell| cell.value.clone()).map(Bytes::from)),
            repaired: page.written_back > 0,
            restarts: page.proxies.saturating_sub(1) as u32,
            one_round: false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lying members

/// A table member: honest, or lying as a replica and as a proxy.
///
/// - Silent: never answers anyone.
/// - Stale, Amnesiac, Equivocating: acknowledges every store without storing it, and answers
///   reads from what it holds (nothing new): the replica that drops writes.
/// - Corrupting: signs nothing validly, and as a proxy spoils every signature it relays, framing
///   correct replicas.
/// - Forging: answers reads with a cell newer than any write, whose writer's signature it made
///   up or (half the time, [`TableNode::with_saved_writes`]) that a revoked writer signed and
///   it saved, vouching for it with its own valid signature, and as a proxy it keeps the
///   writer's revocation from its clients.
/// - Colluding: acknowledges stores without storing; as a proxy it plays spec §2.8 scenario 2,
///   storing a write on one other replica only and relaying that acknowledgement with its own
///   and `f` made-up ones.
pub struct TableNode {
    honest: Server,
    behaviour: Behaviour,
    secret: SecretKey,
    place: Place,
    /// Writes it is proxy for as a colluder: the client, its operation and the acks so far.
    collusions: HashMap<u64, Collusion>,
    next_collusion: u64,
    /// A revoked writer whose key it holds: it forges with writes that writer signed.
    saved: Option<(ClientId, SecretKey)>,
}

/// A colluding proxy's write: its client, the client's operation and the acks so far.
type Collusion = (ClientId, u64, Vec<(Slot, Unverified<WriteAck>)>);

/// Colluders number their own writes from here, apart from the honest proxy's numbers.
const COLLUSION_BASE: u64 = 1 << 62;

fn spoil<T>(signed: &mut Unverified<T>) {
    let mut bytes = signed.signature().0;
    bytes[0] ^= 0x40;
    *signed = Unverified::new(signed.bytes().clone(), Signature(bytes));
}

impl TableNode {
    /// `honest` lying as `behaviour`, signing its lies with `secret` (its own key: a lying
    /// member cannot sign as another). For real processes, `bulwark-byzantine --table`.
    pub fn lying(honest: Server, behaviour: Behaviour, secret: SecretKey) -> TableNode {
        let place = honest.place();
        TableNode {
            honest,
            behaviour,
            secret,
            place,
            collusions: HashMap::new(),
            next_collusion: 0,
            saved: None,
        }
    }

    /// The same member holding the key of `writer`, revoked: half of its forgeries are then
    /// writes that writer signed before its revocation and this member saved (spec §5.2
    /// "Revocation"), whose signatures verify.
    pub fn with_saved_writes(mut self, writer: (ClientId, SecretKey)) -> TableNode {
        self.saved = Some(writer);
        self
    }

    fn drops_writes(&self) -> bool {
        matches!(
            self.behaviour,
            Behaviour::Stale | Behaviour::Amnesiac | Behaviour::Equivocating | Behaviour::Colluding
        )
    }

    fn ack(&self, cells: &[SignedCell]) -> Option<Unverified<WriteAck>> {
        let ack = WriteAck {
            slot: self.place.slot,
            epoch: self.place.epoch,
            group: self.place.group,
            cells: cells.iter().map(Cell::digest).collect(),
        };
        Signed::sign(&self.secret, ack)
            .ok()
            .map(|s| s.to_unverified())
    }

    /// An answer naming a forged cell of `row`, validly signed by this member: newer than any
    /// write so far, and within the skew replicas allow, so only its signature gives it away.
    fn forged_answer(&self, now: Time, answered: &mut Answered, row: &RowKey) {
        let Ok(mut answer) = answered.answer.peek() else {
            return;
        };
        let forged = self.forged_cell(now, row);
        let Ok(cell) = forged.peek() else {
            return;
        };
        answer.entries = entries_of([(&cell, &forged)]);
        if let Ok(signed) = Signed::sign(&self.secret, answer) {
            answered.answer = signed.to_unverified();
            if answered.cells.is_some() {
                answered.cells = Some(vec![forged]);
            }
        }
    }

    /// A cell of `row` newer than any write so far and within the skew replicas allow: one
    /// whose writer's signature is made up, so only its signature gives it away; or, on odd
    /// milliseconds when it holds a revoked writer's key, one that writer signed, so only the
    /// revocation gives it away.
    fn forged_cell(&self, now: Time, row: &RowKey) -> SignedCell {
        let ts = now.0 * 1000 + settings().skew_max_micros / 2;
        if let Some((writer, secret)) = &self.saved
            && now.0 % 2 == 1
        {
            let cell = Cell {
                row: row.clone(),
                column: COLUMN.into(),
                ts,
                writer: *writer,
                value: Some(b"saved by a revoked writer".to_vec()),
            };
            if let Some(signed) = cell.sign(secret) {
                return signed;
            }
        }
        let cell = Cell {
            row: row.clone(),
            column: COLUMN.into(),
            ts,
            writer: ClientId(0),
            value: Some(b"forged by a replica".to_vec()),
        };
        Unverified::<Cell>::new(
            Bytes::from(bulwark_core::wire::encode(&cell)),
            Signature([0x5a; 64]),
        )
    }

    /// A page of `partition` holding only a forged cell, validly signed by this member.
    fn forged_page(&self, now: Time, answered: &mut RangeAnswered, partition: &[u8]) {
        let Ok(mut answer) = answered.answer.peek() else {
            return;
        };
        let row = RowKey {
            table: TABLE.into(),
            partition: partition.to_vec(),
            clustering: Vec::new(),
        };
        let forged = self.forged_cell(now, &row);
        let Ok(cell) = forged.peek() else {
            return;
        };
        answer.rows = vec![(row, entries_of([(&cell, &forged)]))];
        answer.complete = true;
        if let Ok(signed) = Signed::sign(&self.secret, answer) {
            answered.answer = signed.to_unverified();
            answered.cells = vec![forged];
        }
    }

    /// A colluding proxy's write: stored on the next member only.
    fn collude(&mut self, client: ClientId, request: Request) -> Output<Self> {
        let RequestBody::Write { cells, .. } = request.body else {
            return Output::none();
        };
        let Some(own) = self.ack(&cells) else {
            return Output::none();
        };
        self.next_collusion += 1;
        let pop = COLLUSION_BASE + self.next_collusion;
        self.collusions
            .insert(pop, (client, request.op, vec![(self.place.slot, own)]));
        let next = Slot((self.place.slot.0 + 1) % self.place.n as u32);
        Output {
            sends: vec![(
                next,
                Message::Store {
                    pop,
                    client,
                    cells,
                    tag: None,
                },
            )],
            ..Output::none()
        }
    }

    /// The one acknowledgement a colluding write waited for: relayed with the colluder's own and
    /// `f` made up for replicas that never saw the write.
    fn collusion_acked(&mut self, from: Slot, pop: u64, ack: Unverified<WriteAck>) -> Output<Self> {
        let Some((client, op, mut acks)) = self.collusions.remove(&pop) else {
            return Output::none();
        };
        let Ok(genuine) = ack.peek() else {
            return Output::none();
        };
        acks.push((from, ack));
        let strangers = (0..self.place.n as u32)
            .map(Slot)
            .filter(|slot| acks.iter().all(|(s, _)| s != slot))
            .take(self.place.f);
        let made_up: Vec<(Slot, Unverified<WriteAck>)> = strangers
            .map(|slot| {
                let statement = WriteAck {
                    slot,
                    ..genuine.clone()
                };
                let bytes = Bytes::from(bulwark_core::wire::encode(&statement));
                (slot, Unverified::new(bytes, Signature([0x33; 64])))
            })
            .collect();
        acks.extend(made_up);
        Output {
            notify: vec![(
                client,
                op,
                Response {
                    op,
                    body: ResponseBody::Acks(acks),
                },
            )],
            ..Output::none()
        }
    }

    /// What a corrupting member does to everything it says or relays.
    fn corrupt(out: &mut Output<Self>) {
        for (_, message) in &mut out.sends {
            match message {
                Message::StoreAck { ack, .. } => spoil(ack),
                Message::Answer { answered, .. } => spoil(&mut answered.answer),
                Message::WriteBackAck { ack, .. } => spoil(ack),
                Message::RangeAnswer { answered, .. } => spoil(&mut answered.answer),
                Message::RangeWriteBackAck { ack, .. } => spoil(ack),
                _ => {}
            }
        }
        for (_, _, response) in &mut out.notify {
            match &mut response.body {
                ResponseBody::Acks(acks) => acks.iter_mut().for_each(|(_, ack)| spoil(ack)),
                ResponseBody::Read {
                    answers,
                    write_backs,
                    ..
                } => {
                    answers.iter_mut().for_each(|(_, a)| spoil(&mut a.answer));
                    write_backs.iter_mut().for_each(|(_, ack)| spoil(ack));
                }
                ResponseBody::Range {
                    answers,
                    write_backs,
                    ..
                } => {
                    answers.iter_mut().for_each(|(_, a)| spoil(&mut a.answer));
                    write_backs.iter_mut().for_each(|(_, ack)| spoil(ack));
                }
                ResponseBody::Refused(_) | ResponseBody::Created | ResponseBody::Schema(_) => {}
            }
        }
    }
}

impl TableNode {
    /// What the member says to its clients: spoiled when it corrupts; without the revocations
    /// the honest proxy attaches when it forges, so clients judge saved writes as current ones.
    fn lie_to_clients(&self, out: &mut Output<Self>) {
        match self.behaviour {
            Behaviour::Corrupting => Self::corrupt(out),
            Behaviour::Forging => {
                for (_, _, response) in &mut out.notify {
                    if let ResponseBody::Read { revocations, .. }
                    | ResponseBody::Range { revocations, .. } = &mut response.body
                    {
                        revocations.clear();
                    }
                }
            }
            _ => {}
        }
    }
}

impl Replica for TableNode {
    const SERVICE: ServiceId = ServiceId::TABLE;
    type Request = Request;
    type Reply = Response;
    type Message = Message;
    type Change = Change;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        view: &(),
    ) -> Output<Self> {
        match self.behaviour {
            Behaviour::Silent => return Output::none(),
            Behaviour::Colluding if matches!(request.body, RequestBody::Write { .. }) => {
                return self.collude(client, request);
            }
            _ => {}
        }
        let mut out = self
            .honest
            .on_request(now, client, access, request, view)
            .retyped();
        self.lie_to_clients(&mut out);
        out
    }

    fn on_message(&mut self, now: Time, from: Slot, message: Message, view: &()) -> Output<Self> {
        match (&self.behaviour, &message) {
            (Behaviour::Silent, _) => return Output::none(),
            (Behaviour::Colluding, Message::StoreAck { pop, ack }) if *pop >= COLLUSION_BASE => {
                return self.collusion_acked(from, *pop, ack.clone());
            }
            // It takes nothing by anti-entropy either, staying as stale as it chooses.
            (_, Message::SyncReply { .. } | Message::SyncCells { .. }) if self.drops_writes() => {
                return Output::none();
            }
            (_, Message::Store { pop, cells, .. }) if self.drops_writes() => {
                let Some(ack) = self.ack(cells) else {
                    return Output::none();
                };
                return Output {
                    sends: vec![(from, Message::StoreAck { pop: *pop, ack })],
                    ..Output::none()
                };
            }
            _ => {}
        }
        let forge_row = match (&self.behaviour, &message) {
            (Behaviour::Forging, Message::Read { row, .. }) => Some(row.clone()),
            _ => None,
        };
        let forge_sync = match (&self.behaviour, &message) {
            (Behaviour::Forging, Message::SyncOffer { listing, .. }) => {
                listing.first().map(|(row, _)| row.clone())
            }
            _ => None,
        };
        let forge_partition = match (&self.behaviour, &message) {
            (Behaviour::Forging, Message::RangeRead { range, .. }) => range.partition.clone(),
            _ => None,
        };
        let mut out: Output<Self> = self.honest.on_message(now, from, message, view).retyped();
        self.lie_to_clients(&mut out);
        // Only a forging member has anything to forge (the three are `None` otherwise).
        if let Some(row) = forge_row {
            for (_, message) in &mut out.sends {
                if let Message::Answer { answered, .. } = message {
                    self.forged_answer(now, answered, &row);
                }
            }
        }
        if let Some(row) = forge_sync {
            // A forged newer version of the first row offered, pushed as anti-entropy.
            let forged = self.forged_cell(now, &row);
            for (_, message) in &mut out.sends {
                if let Message::SyncReply { cells, .. } = message {
                    cells.insert(0, forged.clone());
                }
            }
        }
        if let Some(partition) = forge_partition {
            for (_, message) in &mut out.sends {
                if let Message::RangeAnswer { answered, .. } = message {
                    self.forged_page(now, answered, &partition);
                }
            }
        }
        out
    }

    fn on_timer(
        &mut self,
        now: Time,
        timer: bulwark_protocol::machine::TimerId,
        view: &(),
    ) -> Output<Self> {
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        let mut out: Output<Self> = self.honest.on_timer(now, timer, view).retyped();
        self.lie_to_clients(&mut out);
        out
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        if self.behaviour == Behaviour::Silent {
            return Output::none();
        }
        self.honest.on_tick(now).retyped()
    }

    fn stats(&self) -> ReplicaStats {
        self.honest.stats()
    }
}
