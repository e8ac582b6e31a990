//! The two register baselines in the simulator: multi-writer ABD (crash faults only, `2f+1`
//! servers) and Phalanx (writer-signed versions, `3f+1` servers, the Byzantine catalogue of
//! [`crate::byzantine::phalanx`]). Both keep one version per key on disk, so they share the disk,
//! and both are one register core, so they share how their messages and results read.

use crate::byzantine::Behaviour;
use crate::byzantine::phalanx::PhalanxLiar;
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_core::config::Protocol as ClusterProtocol;
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Epoch, GroupId, Key, Slot};
use bulwark_protocol::register::{
    Policy, ReadOutcome, Request, RequestBody, Response, ResponseBody, Timestamp, WriteOutcome,
};
use bulwark_protocol::round::OpId;
use bulwark_protocol::{abd, phalanx, pubkey};
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One server's disk: the last committed version of every key. Ordered, so a restart reloads
/// keys in the same order every time.
pub struct RegisterDisk<E>(BTreeMap<Key, E>);

impl<E> Default for RegisterDisk<E> {
    fn default() -> Self {
        RegisterDisk(BTreeMap::new())
    }
}

impl<E> RegisterDisk<E> {
    /// Versions held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true for a disk that holds a version. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every version, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &E)> {
        self.0.iter()
    }

    /// The version of `key`.
    pub fn get(&self, key: &Key) -> Option<&E> {
        self.0.get(key)
    }

    pub(crate) fn remove(&mut self, key: &Key) {
        self.0.remove(key);
    }

    pub(crate) fn put(&mut self, key: &Key, entry: &E)
    where
        E: Clone,
    {
        self.0.insert(key.clone(), entry.clone());
    }
}

/// What the trace needs of a register policy beyond the shared core: the timestamp its CLOCK
/// replies show.
pub(crate) trait Traced: Policy {
    fn clock_label(clock: &Self::Clock) -> Timestamp;
}

impl Traced for abd::Abd {
    fn clock_label(ts: &Timestamp) -> Timestamp {
        *ts
    }
}

impl Traced for phalanx::Phalanx {
    fn clock_label(signed: &phalanx::SignedTimestamp) -> Timestamp {
        signed.ts
    }
}

impl Traced for pubkey::PubKey {
    fn clock_label(header: &pubkey::Header) -> Timestamp {
        header.ts
    }
}

fn label(ts: Option<&Timestamp>) -> String {
    ts.map_or("ts0".to_string(), |ts| {
        format!("{}.w{}.{}", ts.num, ts.writer.0, ts.seq)
    })
}

/// The index of a round in the swarm's per-request tails: writes' rounds where PoWerStore has
/// CLOCK and STORE, reads' where it has COLLECT and REPAIR.
pub(crate) fn kind<P: Policy>(request: &Request<P>) -> usize {
    match request.body {
        RequestBody::Clock => 0,
        RequestBody::Store(_) => 1,
        RequestBody::Get => 3,
        RequestBody::WriteBack(_) => 5,
    }
}

pub(crate) fn describe_request<P: Policy>(request: &Request<P>) -> String {
    let detail = match &request.body {
        RequestBody::Store(entry) | RequestBody::WriteBack(entry) => {
            format!(" ts={}", label(Some(&P::ts(entry))))
        }
        RequestBody::Clock | RequestBody::Get => String::new(),
    };
    format!(
        "{} key={} op{}{detail}",
        request.body.name(),
        request.key,
        request.op.0
    )
}

pub(crate) fn describe_response<P: Traced>(response: &Response<P>) -> String {
    let detail = match &response.body {
        ResponseBody::ClockAck(clock) => {
            format!(
                "clock-ack ts={}",
                label(clock.as_ref().map(P::clock_label).as_ref())
            )
        }
        ResponseBody::Value(entry) => {
            format!("value ts={}", label(entry.as_ref().map(P::ts).as_ref()))
        }
        ResponseBody::StoreAck(ts) => format!("store-ack ts={}", label(Some(ts))),
        ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
    };
    format!("{detail} op{}", response.op.0)
}

impl Finish for WriteOutcome {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: label(Some(&self.ts)),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

impl Finish for ReadOutcome {
    fn finish(self) -> Finished {
        Finished {
            // Only Phalanx readers name forgers; an ABD read has none.
            evidence: self
                .forgers
                .iter()
                .map(|node| (*node, "ForgedSignature".to_string()))
                .collect(),
            version: label(self.ts.as_ref()),
            read: Some(self.value),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
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
    type Server = abd::Server;
    type Write = abd::WriteOp;
    type Read = abd::ReadOp;

    fn nodes(f: usize) -> usize {
        ClusterProtocol::Abd.nodes(f)
    }

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

    fn server(&self, index: usize, _behaviour: Behaviour, _seed: u64) -> abd::Server {
        abd::Server::new(Slot(index as u32), Epoch(0), GroupId(0))
    }

    fn restore(&self, index: usize, disk: &Self::Disk, _now: u64) -> abd::Server {
        let mut server = abd::Server::new(Slot(index as u32), Epoch(0), GroupId(0));
        for (key, entry) in &disk.0 {
            server.restore(key.clone(), entry.clone());
        }
        server
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut Self::Disk, change: &abd::Change) {
        let abd::Change::Put { key, entry } = change;
        disk.put(key, entry);
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
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> abd::WriteOp {
        abd::WriteOp::new(
            self.client_config.clone(),
            key,
            op,
            ClientId(client as u32),
            op.0,
            value,
        )
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> abd::ReadOp {
        abd::ReadOp::new(self.client_config.clone(), key, op)
    }

    fn response_op(response: &abd::Response) -> OpId {
        response.op
    }

    fn request_name(request: &abd::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &abd::Request) -> usize {
        kind(request)
    }

    fn describe_request(request: &abd::Request) -> String {
        describe_request(request)
    }

    fn describe_response(response: &abd::Response) -> String {
        describe_response(response)
    }
}

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
    type Server = PhalanxLiar;
    type Write = phalanx::WriteOp;
    type Read = phalanx::ReadOp;

    fn nodes(f: usize) -> usize {
        ClusterProtocol::Phalanx.nodes(f)
    }

    /// The storage catalogue's Byzantine servers, but no catalogue of Byzantine readers: a reader
    /// can only write back a version some writer signed, which any correct reader might also do.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| behaviour.is_storage());
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

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> PhalanxLiar {
        PhalanxLiar::new(behaviour, Slot(index as u32), self.writers.clone(), seed)
    }

    fn restore(&self, index: usize, disk: &Self::Disk, _now: u64) -> PhalanxLiar {
        let node = Slot(index as u32);
        let mut server = PhalanxLiar::new(Behaviour::Honest, node, self.writers.clone(), 0);
        for (key, entry) in &disk.0 {
            server.restore(key.clone(), entry.clone());
        }
        server
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut Self::Disk, change: &phalanx::Change) {
        let phalanx::Change::Put { key, entry } = change;
        disk.put(key, entry);
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
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> phalanx::WriteOp {
        phalanx::WriteOp::new(
            self.client_config.clone(),
            key,
            op,
            ClientId(client as u32),
            op.0,
            self.signing[client].clone(),
            value,
        )
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> phalanx::ReadOp {
        phalanx::ReadOp::new(self.client_config.clone(), key, op)
    }

    fn response_op(response: &phalanx::Response) -> OpId {
        response.op
    }

    fn request_name(request: &phalanx::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &phalanx::Request) -> usize {
        kind(request)
    }

    fn describe_request(request: &phalanx::Request) -> String {
        describe_request(request)
    }

    fn describe_response(response: &phalanx::Response) -> String {
        describe_response(response)
    }
}

// ---------------------------------------------------------------------------------------------
// Public-key objects

/// One run's public-key objects (Rosebud §4.4): each key of the workload stands for the object
/// of an owner key drawn from it, which every client holds and writes with. Replicas are honest
/// (the Byzantine catalogue is Phalanx's, whose lies a public-key replica tells alike: it holds
/// no owner key either); crashes of servers and clients, partitions, loss, duplication and
/// reordering apply, and every history must be linearizable per object.
pub struct PubKeySim {
    client_config: pubkey::ClientConfig,
}

/// The owner key the workload's `key` stands for.
pub(crate) fn owner_of(key: &Key) -> Arc<SecretKey> {
    let seed = bulwark_core::Digest::of("bulwark/sim/pubkey-owner", key.as_bytes());
    Arc::new(SecretKey::from_seed(&seed.0))
}

impl Protocol for PubKeySim {
    type Request = pubkey::Request;
    type Response = pubkey::Response;
    type Change = pubkey::Change;
    type Disk = RegisterDisk<pubkey::Entry>;
    type Server = pubkey::Server;
    type Write = pubkey::WriteOp;
    type Read = pubkey::ReadOp;

    fn nodes(f: usize) -> usize {
        3 * f + 1
    }

    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.clear();
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(_rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> PubKeySim {
        let mut client_config = pubkey::ClientConfig::new(config.f);
        client_config.mutations = config.mutations.register;
        PubKeySim { client_config }
    }

    fn server(&self, index: usize, _behaviour: Behaviour, _seed: u64) -> pubkey::Server {
        pubkey::Server::new(Slot(index as u32), Epoch(0), GroupId(0))
    }

    fn restore(&self, index: usize, disk: &Self::Disk, _now: u64) -> pubkey::Server {
        let mut server = pubkey::Server::new(Slot(index as u32), Epoch(0), GroupId(0));
        for (key, entry) in &disk.0 {
            server.restore(key.clone(), entry.clone());
        }
        server
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut Self::Disk, change: &pubkey::Change) {
        let pubkey::Change::Put { key, entry } = change;
        disk.put(key, entry);
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
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> pubkey::WriteOp {
        pubkey::WriteOp::new(
            self.client_config.clone(),
            op,
            ClientId(client as u32),
            op.0,
            owner_of(&key),
            value,
        )
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> pubkey::ReadOp {
        let id = pubkey::object_id(&owner_of(&key).public_key());
        pubkey::ReadOp::new(self.client_config.clone(), id, op)
    }

    fn response_op(response: &pubkey::Response) -> OpId {
        response.op
    }

    fn request_name(request: &pubkey::Request) -> &'static str {
        request.body.name()
    }

    fn request_kind(request: &pubkey::Request) -> usize {
        kind(request)
    }

    fn describe_request(request: &pubkey::Request) -> String {
        describe_request(request)
    }

    fn describe_response(response: &pubkey::Response) -> String {
        describe_response(response)
    }
}
