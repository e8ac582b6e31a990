//! The two register baselines in the simulator: multi-writer ABD (crash faults only, `2f+1`
//! servers) and Phalanx (writer-signed versions, `3f+1` servers, the Byzantine catalogue of
//! [`crate::byzantine::phalanx`]). Both keep one version per key on disk, so they share the disk.

use crate::byzantine::Behaviour;
use crate::byzantine::phalanx::PhalanxLiar;
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finished, OpStep, Protocol, Served, SimOp, SimServer};
use crate::sim::swarm::Swarm;
use bulwark_core::config::Protocol as ClusterProtocol;
use bulwark_core::{ClientId, Epoch, GroupId, Key, Slot, Time};
use bulwark_protocol::round::{OpId, Step};
use bulwark_protocol::{abd, phalanx};
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One server's disk: the last committed version of every key. Ordered, so a restart reloads
/// keys in the same order every time.
pub(in crate::sim) struct RegisterDisk<E>(BTreeMap<Key, E>);

impl<E> Default for RegisterDisk<E> {
    fn default() -> Self {
        RegisterDisk(BTreeMap::new())
    }
}

/// What the two baselines' adapters share, written once over the module (`abd` or `phalanx`):
/// both have the same rounds (CLOCK, STORE, GET, WRITE-BACK), message shapes and machines. They
/// differ in what CLOCK returns (`$clock_ts` finds the timestamp in it) and in the evidence a read
/// reports (`$evidence`).
macro_rules! register_messages {
    ($name:ident, $module:ident, $protocol:ident, $clock_ts:expr, $evidence:expr) => {
        mod $name {
            use super::*;

            fn label(ts: Option<&$module::Timestamp>) -> String {
                ts.map_or("ts0".to_string(), |ts| {
                    format!("{}.w{}.{}", ts.num, ts.writer.0, ts.seq)
                })
            }

            /// The index of a round in the swarm's per-request tails: writes' rounds where
            /// PoWerStore has CLOCK and STORE, reads' where it has COLLECT and REPAIR.
            pub(super) fn kind(request: &$module::Request) -> usize {
                match request.body {
                    $module::RequestBody::Clock => 0,
                    $module::RequestBody::Store(_) => 1,
                    $module::RequestBody::Get => 3,
                    $module::RequestBody::WriteBack(_) => 5,
                }
            }

            pub(super) fn describe_request(request: &$module::Request) -> String {
                let detail = match &request.body {
                    $module::RequestBody::Store(entry) | $module::RequestBody::WriteBack(entry) => {
                        format!(" ts={}", label(Some(&entry.ts)))
                    }
                    $module::RequestBody::Clock | $module::RequestBody::Get => String::new(),
                };
                format!(
                    "{} key={} op{}{detail}",
                    request.body.name(),
                    request.key,
                    request.op.0
                )
            }

            pub(super) fn describe_response(response: &$module::Response) -> String {
                let detail = match &response.body {
                    $module::ResponseBody::ClockAck(clock) => {
                        format!("clock-ack ts={}", label(($clock_ts)(clock).as_ref()))
                    }
                    $module::ResponseBody::Value(entry) => {
                        format!("value ts={}", label(entry.as_ref().map(|entry| &entry.ts)))
                    }
                    $module::ResponseBody::StoreAck(ts) => {
                        format!("store-ack ts={}", label(Some(ts)))
                    }
                    $module::ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
                };
                format!("{detail} op{}", response.op.0)
            }

            /// How a round of the baseline's machine ended, in the world's terms.
            fn step<T>(
                step: $module::Step<T>,
                finish: impl FnOnce(T) -> Finished,
            ) -> OpStep<$module::Request> {
                match step {
                    Step::Continue(sends) => OpStep::Continue(sends),
                    Step::Done(result) => {
                        OpStep::Done(result.map(finish).map_err(|e| e.to_string()))
                    }
                }
            }

            impl SimOp<$protocol> for $module::WriteOp {
                fn start(&mut self) -> Vec<(Slot, $module::Request)> {
                    $module::WriteOp::start(self)
                }

                fn retransmit(&self) -> Vec<(Slot, $module::Request)> {
                    $module::WriteOp::retransmit(self)
                }

                fn on_response(
                    &mut self,
                    from: Slot,
                    response: $module::Response,
                ) -> OpStep<$module::Request> {
                    step(
                        $module::WriteOp::on_response(self, from, response),
                        |outcome| Finished {
                            read: None,
                            version: label(Some(&outcome.ts)),
                            evidence: Vec::new(),
                            repaired: false,
                            restarts: 0,
                        },
                    )
                }
            }

            impl SimOp<$protocol> for $module::ReadOp {
                fn start(&mut self) -> Vec<(Slot, $module::Request)> {
                    $module::ReadOp::start(self)
                }

                fn retransmit(&self) -> Vec<(Slot, $module::Request)> {
                    $module::ReadOp::retransmit(self)
                }

                fn on_response(
                    &mut self,
                    from: Slot,
                    response: $module::Response,
                ) -> OpStep<$module::Request> {
                    step(
                        $module::ReadOp::on_response(self, from, response),
                        |outcome| Finished {
                            evidence: ($evidence)(&outcome),
                            version: label(outcome.ts.as_ref()),
                            read: Some(outcome.value),
                            repaired: false,
                            restarts: 0,
                        },
                    )
                }
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// ABD

/// One run's ABD group.
pub(in crate::sim) struct Abd {
    client_config: abd::ClientConfig,
}

impl Protocol for Abd {
    type Request = abd::Request;
    type Response = abd::Response;
    type Change = abd::Change;
    type Disk = RegisterDisk<abd::Entry>;

    const KIND: ClusterProtocol = ClusterProtocol::Abd;

    /// ABD tolerates crashes, not lies: no Byzantine servers or readers.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.clear();
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(_rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Abd {
        let mut client_config = abd::ClientConfig::new(config.f);
        client_config.mutations = config.mutations.register;
        Abd { client_config }
    }

    fn server(&self, index: usize, _behaviour: Behaviour, _seed: u64) -> Box<dyn SimServer<Abd>> {
        Box::new(abd::Server::new(Slot(index as u32), Epoch(0), GroupId(0)))
    }

    fn restore(&self, index: usize, disk: &Self::Disk, _now: u64) -> Box<dyn SimServer<Abd>> {
        let mut server = abd::Server::new(Slot(index as u32), Epoch(0), GroupId(0));
        for (key, entry) in &disk.0 {
            server.restore(key.clone(), entry.clone());
        }
        Box::new(server)
    }

    fn persist(disk: &mut Self::Disk, change: &abd::Change) {
        let abd::Change::Put { key, entry } = change;
        disk.0.insert(key.clone(), entry.clone());
    }

    fn disk_versions(disk: &Self::Disk) -> usize {
        disk.0.len()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _rng: &mut ChaCha8Rng,
    ) -> Box<dyn SimOp<Abd>> {
        Box::new(abd::WriteOp::new(
            self.client_config.clone(),
            key,
            op,
            ClientId(client as u32),
            op.0,
            value,
        ))
    }

    fn read(&self, key: Key, op: OpId) -> Box<dyn SimOp<Abd>> {
        Box::new(abd::ReadOp::new(self.client_config.clone(), key, op))
    }

    fn response_op(response: &abd::Response) -> OpId {
        response.op
    }

    fn request_name(request: &abd::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &abd::Request) -> usize {
        abd_messages::kind(request)
    }

    fn describe_request(request: &abd::Request) -> String {
        abd_messages::describe_request(request)
    }

    fn describe_response(response: &abd::Response) -> String {
        abd_messages::describe_response(response)
    }
}

impl SimServer<Abd> for abd::Server {
    fn handle(
        &mut self,
        _now: u64,
        _client: usize,
        writer: bool,
        request: abd::Request,
        _disk: &RegisterDisk<abd::Entry>,
        _pending: Vec<&abd::Change>,
    ) -> Served<Abd> {
        let handled = abd::Server::handle(self, writer, true, request);
        Served {
            changes: handled.changes,
            reply: Some(handled.reply),
            refused: handled.refused.is_some(),
        }
    }
}

register_messages!(
    abd_messages,
    abd,
    Abd,
    |ts: &Option<abd::Timestamp>| *ts,
    |_outcome: &abd::ReadOutcome| Vec::new()
);

// ---------------------------------------------------------------------------------------------
// Phalanx

/// One run's Phalanx group: every client may write, each with its own signing key.
pub(in crate::sim) struct Phalanx {
    client_config: phalanx::ClientConfig,
    writers: Arc<phalanx::Writers>,
    signing: Vec<Arc<phalanx::SigningKey>>,
}

impl Protocol for Phalanx {
    type Request = phalanx::Request;
    type Response = phalanx::Response;
    type Change = phalanx::Change;
    type Disk = RegisterDisk<phalanx::Entry>;

    const KIND: ClusterProtocol = ClusterProtocol::Phalanx;

    /// Byzantine servers, but no catalogue of Byzantine readers: a reader can only write back a
    /// version some writer signed, which any correct reader might also do.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> Phalanx {
        let mut writers = phalanx::Writers::default();
        let signing = (0..config.clients.max(1))
            .map(|client| {
                let secret: [u8; 32] = rng.random();
                writers
                    .register(ClientId(client as u32), &phalanx::public_key(&secret))
                    .unwrap_or_else(|_| unreachable!("keys derived from secrets are not weak"));
                Arc::new(phalanx::signing_key(&secret))
            })
            .collect();
        let writers = Arc::new(writers);
        let mut client_config = phalanx::ClientConfig::new(config.f, writers.clone());
        client_config.mutations = config.mutations.register;
        Phalanx {
            client_config,
            writers,
            signing,
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> Box<dyn SimServer<Self>> {
        Box::new(PhalanxLiar::new(
            behaviour,
            Slot(index as u32),
            self.writers.clone(),
            seed,
        ))
    }

    fn restore(&self, index: usize, disk: &Self::Disk, _now: u64) -> Box<dyn SimServer<Self>> {
        let node = Slot(index as u32);
        let mut server = PhalanxLiar::new(Behaviour::Honest, node, self.writers.clone(), 0);
        for (key, entry) in &disk.0 {
            server.restore(key.clone(), entry.clone());
        }
        Box::new(server)
    }

    fn persist(disk: &mut Self::Disk, change: &phalanx::Change) {
        let phalanx::Change::Put { key, entry } = change;
        disk.0.insert(key.clone(), entry.clone());
    }

    fn disk_versions(disk: &Self::Disk) -> usize {
        disk.0.len()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _rng: &mut ChaCha8Rng,
    ) -> Box<dyn SimOp<Self>> {
        Box::new(phalanx::WriteOp::new(
            self.client_config.clone(),
            key,
            op,
            ClientId(client as u32),
            op.0,
            self.signing[client].clone(),
            value,
        ))
    }

    fn read(&self, key: Key, op: OpId) -> Box<dyn SimOp<Self>> {
        Box::new(phalanx::ReadOp::new(self.client_config.clone(), key, op))
    }

    fn response_op(response: &phalanx::Response) -> OpId {
        response.op
    }

    fn request_name(request: &phalanx::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &phalanx::Request) -> usize {
        phalanx_messages::kind(request)
    }

    fn describe_request(request: &phalanx::Request) -> String {
        phalanx_messages::describe_request(request)
    }

    fn describe_response(response: &phalanx::Response) -> String {
        phalanx_messages::describe_response(response)
    }
}

impl SimServer<Phalanx> for PhalanxLiar {
    fn handle(
        &mut self,
        now: u64,
        client: usize,
        writer: bool,
        request: phalanx::Request,
        _disk: &RegisterDisk<phalanx::Entry>,
        _pending: Vec<&phalanx::Change>,
    ) -> Served<Phalanx> {
        let (changes, reply) =
            PhalanxLiar::handle(self, Time(now), ClientId(client as u32), writer, request);
        let refused = matches!(
            reply.as_ref().map(|r| &r.body),
            Some(phalanx::ResponseBody::Refused(_))
        );
        Served {
            changes,
            reply,
            refused,
        }
    }
}

register_messages!(
    phalanx_messages,
    phalanx,
    Phalanx,
    |signed: &Option<phalanx::SignedTimestamp>| signed.as_ref().map(|s| s.ts),
    |outcome: &phalanx::ReadOutcome| outcome
        .forgers
        .iter()
        .map(|node| (*node, "ForgedSignature".to_string()))
        .collect()
);
