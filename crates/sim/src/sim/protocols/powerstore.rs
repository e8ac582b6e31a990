//! M-PoWerStore in the simulator: the real server (or a Byzantine wrapper from the catalogue)
//! over a simulated disk, the real writer and reader machines, and Byzantine readers.
//!
//! [`SoleWriterSim`] runs the same group with every key a register of one writer (the paper's
//! §4): key `i` belongs to writer `i mod writers`, which alone writes it and keeps its clock per
//! key between writes, so it skips CLOCK; a writer that crashes forgets its clocks.

use crate::byzantine::reader::{Attack, ReaderAttacker};
use crate::byzantine::{Behaviour, make_server};
use crate::durable::DurableState;
use crate::sim::RunStats;
use crate::sim::config::{FaultSet, SimConfig};
use crate::sim::protocol::{Attacker, Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_core::config::Protocol as ClusterProtocol;
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::{ClientId, Key, MacKey, Slot, Time};
use bulwark_protocol::powerstore::{
    Candidate, Change, ClientConfig, FilterAck, Fragments, OpId, Pid, ReadOp, ReadOutcome, Request,
    RequestBody, Response, ResponseBody, ServerConfig, ServerKeys, ServerLogic, StoredKey,
    Timestamp, WriteOp, WriteOutcome, WriterKeys, sole_writer, sole_writer_key,
};
use bytes::Bytes;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Collect operations a Byzantine reader remembers (to learn which key a reply was about).
const ATTACKER_COLLECTS_MAX: usize = 64;

/// One run's M-PoWerStore group: the keys each writer shares with each server, configurations.
/// `SOLE`: every register has one writer (see the module docs).
pub struct PowerStore<const SOLE: bool = false> {
    server_configs: Vec<ServerConfig>,
    /// Each server's keys, by slot.
    server_keys: Vec<ServerKeys>,
    client_config: ClientConfig,
    /// Each client's keys, by client index.
    writer_keys: Vec<Arc<WriterKeys>>,
    codec: Arc<dyn ErasureCodec>,
    /// Each sole writer's clock: the timestamp number of its last write, per key it wrote since
    /// it last crashed.
    clocks: RefCell<HashMap<(usize, Key), u64>>,
}

/// M-PoWerStore with one writer per register.
pub type SoleWriterSim = PowerStore<true>;

impl<const SOLE: bool> Protocol for PowerStore<SOLE> {
    type Request = Request;
    type Response = Response;
    type Change = Change;
    type Disk = DurableState;
    type Server = Box<dyn ServerLogic>;
    type Write = WriteOp;
    type Read = ReadOp;

    fn nodes(f: usize) -> usize {
        ClusterProtocol::PowerStore.nodes(f)
    }

    /// Everything but the configuration service's Byzantine behaviours.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| behaviour.is_storage());
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, swarm: &Swarm) -> Self {
        let f = config.f;
        let n = Self::nodes(f);
        // One random key per server, and from it one per writer, stand for the X25519
        // agreements; drawn as they were before writers had keys of their own, so that a seed
        // still names the same schedule.
        let bases: Vec<MacKey> = (0..n).map(|_| MacKey(rng.random())).collect();
        let timestamp = MacKey(rng.random());
        let pairs: Vec<Vec<MacKey>> = (0..config.clients)
            .map(|writer| {
                let purpose = format!("bulwark sim powerstore writer {writer}");
                bases.iter().map(|base| base.derive(&purpose)).collect()
            })
            .collect();
        let writer_keys = pairs
            .iter()
            .map(|servers| {
                Arc::new(WriterKeys {
                    timestamp: timestamp.clone(),
                    servers: servers.clone(),
                })
            })
            .collect();
        let server_keys = (0..n)
            .map(|slot| {
                ServerKeys::from_keys(
                    pairs
                        .iter()
                        .enumerate()
                        .map(|(writer, keys)| (ClientId(writer as u32), keys[slot].clone())),
                )
            })
            .collect();
        let server_configs = (0..n)
            .map(|index| {
                let mut server_config = ServerConfig::new(Slot(index as u32), f);
                server_config.grace_millis = swarm.grace_millis;
                server_config.superseded_max = swarm.superseded_max;
                server_config.cached_keys_max = swarm.cached_keys_max;
                server_config.mutations = config.mutations.server;
                server_config
            })
            .collect();
        let mut client_config = ClientConfig::new(f);
        client_config.mutations = config.mutations.client;
        PowerStore {
            server_configs,
            server_keys,
            client_config,
            writer_keys,
            codec: Arc::new(ReedSolomonSimd),
            clocks: RefCell::new(HashMap::new()),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> Box<dyn ServerLogic> {
        make_server(
            behaviour,
            self.server_configs[index].clone(),
            self.server_keys[index].clone(),
            seed,
        )
    }

    fn restore(&self, index: usize, disk: &DurableState, now: u64) -> Box<dyn ServerLogic> {
        Box::new(disk.restore(
            self.server_configs[index].clone(),
            self.server_keys[index].clone(),
            Time(now),
        ))
    }

    fn view(storage: &Storage<Self>) -> &(dyn Fragments + 'static) {
        storage
    }

    fn persist(disk: &mut DurableState, change: &Change) {
        disk.apply(change);
    }

    fn disk_versions(disk: &DurableState) -> usize {
        disk.versions()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        rng: &mut ChaCha8Rng,
    ) -> WriteOp {
        let write = WriteOp::new(
            self.client_config.clone(),
            self.writer_keys[client].clone(),
            self.codec.clone(),
            key.clone(),
            op,
            Pid {
                writer: ClientId(client as u32),
                seq: op.0,
            },
            rng.random(),
            value,
        );
        if !SOLE {
            return write;
        }
        let last = self.clocks.borrow().get(&(client, key)).copied();
        write
            .sole(last)
            .unwrap_or_else(|error| panic!("a write the simulator made cannot be encoded: {error}"))
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> ReadOp {
        // Fragments asked of a set drawn from the operation id, so that over a run any f+1
        // nodes are asked (faulty and lagging ones together, parity fragments), not only the
        // data fragments' nodes a client asks by default.
        let mut order: Vec<Slot> = (0..self.client_config.n).map(|i| Slot(i as u32)).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(op.0));
        ReadOp::new(self.client_config.clone(), self.codec.clone(), key, op)
            .asking_fragments_of(&order)
    }

    fn key(&self, index: usize, writers: usize) -> Key {
        let name = format!("key{index}");
        let bytes = if SOLE {
            let writer = ClientId((index % writers.max(1)) as u32);
            sole_writer_key(writer, name.as_bytes())
        } else {
            name.into_bytes()
        };
        Key::new(bytes).unwrap_or_else(|_| unreachable!("short keys are valid"))
    }

    fn may_write(&self, client: usize, key: &Key) -> bool {
        !SOLE || sole_writer(key) == Some(ClientId(client as u32))
    }

    fn wrote(&self, client: usize, key: &Key, output: &WriteOutcome) {
        if SOLE {
            let mut clocks = self.clocks.borrow_mut();
            let clock = clocks.entry((client, key.clone())).or_default();
            *clock = (*clock).max(output.ts.num);
        }
    }

    fn client_crashed(&self, client: usize) {
        self.clocks
            .borrow_mut()
            .retain(|(writer, _), _| *writer != client);
    }

    fn response_op(response: &Response) -> OpId {
        response.op
    }

    fn request_name(request: &Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &Request) -> usize {
        request_kind(&request.body)
    }

    fn describe_request(request: &Request) -> String {
        describe_request(request)
    }

    fn describe_response(response: &Response) -> String {
        describe_response(response)
    }

    fn count_round(first: &Request, stats: &mut RunStats) {
        if let RequestBody::Filter { candidates } = &first.body
            && carries_twin(candidates)
        {
            stats.twin_filters += 1;
        }
    }

    fn attacker(&self, seed: u64) -> Option<Box<dyn Attacker<Self>>> {
        Some(Box::new(ByzantineReader {
            attacker: ReaderAttacker::new(self.server_configs.len(), seed),
            collects: VecDeque::new(),
            client_config: self.client_config.clone(),
        }))
    }
}

/// A server reads fragments back from the disk, or from batches still on their way to it.
impl<const SOLE: bool> Fragments for Storage<PowerStore<SOLE>> {
    fn stored_key(&self, key: &Key) -> StoredKey {
        self.durable.key_after(self.pending(), key)
    }

    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        self.durable.fragment_after(self.pending(), key, ts)
    }
}

impl Finish for WriteOutcome {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: ts_label(&self.ts),
            evidence: Vec::new(),
            repaired: false,
            restarts: self.restarts,
            one_round: false,
        }
    }
}

impl Finish for ReadOutcome {
    fn finish(self) -> Finished {
        Finished {
            version: self.ts.as_ref().map_or("ts0".to_string(), ts_label),
            evidence: self
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            read: Some(self.value),
            repaired: self.repaired,
            restarts: self.restarts,
            one_round: self.one_round,
        }
    }
}

/// A Byzantine reader from the catalogue, with what it needs to address servers.
struct ByzantineReader {
    attacker: ReaderAttacker,
    /// Which key each of its COLLECTs asked about.
    collects: VecDeque<(OpId, Key)>,
    client_config: ClientConfig,
}

impl<const SOLE: bool> Attacker<PowerStore<SOLE>> for ByzantineReader {
    fn attack(&mut self, key: &Key, op: OpId, rng: &mut ChaCha8Rng) -> Vec<(usize, Request)> {
        let n = self.client_config.n;
        let (body, targets): (RequestBody, Vec<usize>) = match self.attacker.next_attack(key) {
            Attack::Collect => {
                if self.collects.len() >= ATTACKER_COLLECTS_MAX {
                    self.collects.pop_front();
                }
                self.collects.push_back((op, key.clone()));
                (RequestBody::Collect { fragment: true }, (0..n).collect())
            }
            Attack::Send(body) => {
                // Write back to an arbitrary subset: a Byzantine reader need not reach a quorum.
                let targets: Vec<usize> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
                (body, targets)
            }
        };
        targets
            .into_iter()
            .map(|server| {
                let request = Request {
                    op,
                    attempt: 0,
                    epoch: self.client_config.epoch,
                    group: self.client_config.group,
                    key: key.clone(),
                    body: body.clone(),
                };
                (server, request)
            })
            .collect()
    }

    fn heard(&mut self, response: Response) {
        let ResponseBody::CollectAck {
            lc: Some(candidate),
            ..
        } = response.body
        else {
            return;
        };
        let Some(key) = self
            .collects
            .iter()
            .find(|(op, _)| *op == response.op)
            .map(|(_, key)| key.clone())
        else {
            return;
        };
        self.attacker.observe(&key, candidate);
    }
}

/// Whether two candidates share a timestamp but not a nonce: a §4.8(a) twin is in play.
fn carries_twin(candidates: &[Candidate]) -> bool {
    candidates.iter().enumerate().any(|(i, a)| {
        candidates[i + 1..]
            .iter()
            .any(|b| a.ts == b.ts && a.nonce != b.nonce)
    })
}

/// The index of a request kind in [`Swarm::tail_by_request`].
pub(crate) fn request_kind(body: &RequestBody) -> usize {
    match body {
        RequestBody::Clock => 0,
        RequestBody::Store { .. } => 1,
        RequestBody::Complete { .. } => 2,
        RequestBody::Collect { .. } => 3,
        RequestBody::Filter { .. } => 4,
        RequestBody::Repair { .. } => 5,
        // A HOLD reads `lc`, as COLLECT does.
        RequestBody::Hold { .. } => 3,
    }
}

pub(crate) fn ts_label(ts: &Timestamp) -> String {
    format!("{}.w{}.{}", ts.num, ts.pid.writer.0, ts.pid.seq)
}

fn candidate_label(candidate: &Candidate) -> String {
    format!(
        "{}/N{:02x}{:02x}",
        ts_label(&candidate.ts),
        candidate.nonce.0[0],
        candidate.nonce.0[1]
    )
}

pub(crate) fn describe_request(request: &Request) -> String {
    let detail = match &request.body {
        RequestBody::Store { ts, fragment, .. } => {
            format!(" ts={} fragment={}B", ts_label(ts), fragment.len())
        }
        RequestBody::Complete { ts, .. } => format!(" ts={}", ts_label(ts)),
        RequestBody::Filter { candidates } => format!(
            " C=[{}]",
            candidates
                .iter()
                .map(candidate_label)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        RequestBody::Repair { candidate } => format!(" c={}", candidate_label(candidate)),
        RequestBody::Hold { ts } => {
            format!(" ts={}", ts.as_ref().map_or("0".to_string(), ts_label))
        }
        RequestBody::Clock | RequestBody::Collect { .. } => String::new(),
    };
    format!(
        "{} key={} op{}.{}{detail}",
        request.body.name(),
        request.key,
        request.op.0,
        request.attempt
    )
}

pub(crate) fn describe_response(response: &Response) -> String {
    let detail = match &response.body {
        ResponseBody::ClockAck { lc_ts } => format!(
            "clock-ack lc.ts={}",
            lc_ts.as_ref().map_or("ts0".to_string(), ts_label)
        ),
        ResponseBody::StoreAck { ts } => format!("store-ack ts={}", ts_label(ts)),
        ResponseBody::CompleteAck { ts } => format!("complete-ack ts={}", ts_label(ts)),
        ResponseBody::CollectAck { lc, entry } => format!(
            "collect-ack lc={}{}",
            lc.as_ref().map_or("c0".to_string(), candidate_label),
            entry
                .as_ref()
                .map_or(String::new(), |e| format!(" entry={}B", e.fragment.len()))
        ),
        ResponseBody::FilterAck(ack) => match ack {
            FilterAck::Initial => "filter-ack initial".to_string(),
            FilterAck::Entry { ts, fragment, .. } => {
                format!(
                    "filter-ack entry ts={} fragment={}B",
                    ts_label(ts),
                    fragment.len()
                )
            }
            FilterAck::MacOnly { ts } => format!("filter-ack mac-only ts={}", ts_label(ts)),
            FilterAck::Superseded { ts, newer } => format!(
                "filter-ack superseded ts={} offers {}",
                ts_label(ts),
                ts_label(&newer.ts)
            ),
        },
        ResponseBody::RepairAck => "repair-ack".to_string(),
        ResponseBody::HoldAck { lc_ts } => format!(
            "hold-ack lc={}",
            lc_ts.as_ref().map_or("0".to_string(), ts_label)
        ),
        ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
    };
    format!("{detail} op{}.{}", response.op.0, response.attempt)
}
