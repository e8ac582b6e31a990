//! What the world needs of a protocol, so that one scheduler, one nemesis and one checker drive
//! every protocol Bulwark has (DESIGN.md §2): M-PoWerStore, and the ABD and Phalanx baselines.
//!
//! A [`Protocol`] is built once per run from the seed's generator (its keys and configuration),
//! then builds servers (honest or Byzantine), restores them from their simulated disk after a
//! crash, and starts client operations. The world knows nothing of rounds or messages beyond
//! what this trait exposes: it carries requests and responses, persists changes in order,
//! releases replies only once their changes are durable, and records what each operation returned.
//! Each implementation lives in `protocols/`.

use super::RunStats;
use super::config::{FaultSet, SimConfig};
use super::swarm::Swarm;
use crate::byzantine::Behaviour;
use bulwark_core::config::Protocol as ClusterProtocol;
use bulwark_core::{Key, Slot};
use bulwark_protocol::round::OpId;
use bytes::Bytes;
use rand_chacha::ChaCha8Rng;

/// One protocol under simulation.
pub(super) trait Protocol: Sized {
    /// A client-to-server message.
    type Request: Clone + std::fmt::Debug;
    /// A server-to-client message.
    type Response: Clone + std::fmt::Debug;
    /// A state change a server makes durable before its reply leaves.
    type Change;
    /// One server's simulated disk: the changes whose persistence completed.
    type Disk: Default;

    /// Which protocol this is: names it, and says how many servers a group of `f` has.
    const KIND: ClusterProtocol;

    /// The faults of `wanted` this protocol is built to survive: the swarm never places others.
    /// A crash-only protocol drops every Byzantine behaviour and Byzantine readers.
    fn tolerated(wanted: &FaultSet) -> FaultSet;

    /// The run's shared setup (keys, configurations), drawn from the run's generator.
    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, swarm: &Swarm) -> Self;

    /// A fresh server `index` with `behaviour`, seeded with `seed` (shared by colluders).
    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> Box<dyn SimServer<Self>>;

    /// An honest server `index` rebuilt from its disk alone, as a restarted node is.
    fn restore(&self, index: usize, disk: &Self::Disk, now: u64) -> Box<dyn SimServer<Self>>;

    /// Applies one committed change to a disk, in commit order.
    fn persist(disk: &mut Self::Disk, change: &Self::Change);

    /// Versions on a disk, for the trace.
    fn disk_versions(disk: &Self::Disk) -> usize;

    /// A write by `client` of `value` (`None` deletes). Writers that need randomness (nonces)
    /// draw it from `rng`.
    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        rng: &mut ChaCha8Rng,
    ) -> Box<dyn SimOp<Self>>;

    /// A read of `key`.
    fn read(&self, key: Key, op: OpId) -> Box<dyn SimOp<Self>>;

    /// The operation a response answers.
    fn response_op(response: &Self::Response) -> OpId;

    /// The request's round name, for the trace.
    fn request_name(request: &Self::Request) -> &'static str;

    /// The index of the request's kind in [`Swarm::tail_by_request`] (below 6).
    fn request_kind(request: &Self::Request) -> usize;

    /// One line describing a request, for the trace.
    fn describe_request(request: &Self::Request) -> String;

    /// One line describing a response, for the trace.
    fn describe_response(response: &Self::Response) -> String;

    /// Counts what a new round of a correct client carries (PoWerStore counts §4.8(a) twins).
    fn count_round(_first: &Self::Request, _stats: &mut RunStats) {}

    /// A Byzantine reader, for protocols that have a catalogue of them; the world asks only when
    /// the swarm placed attackers, which it does only if [`Protocol::tolerated`] kept them.
    fn attacker(&self, _seed: u64) -> Option<Box<dyn Attacker<Self>>> {
        None
    }
}

/// What a server (honest or not) did with one request.
pub(super) struct Served<P: Protocol> {
    /// Durable before `reply` leaves.
    pub changes: Vec<P::Change>,
    /// The reply, if any.
    pub reply: Option<P::Response>,
    /// The server refused the request.
    pub refused: bool,
}

/// A server as the world drives it.
pub(super) trait SimServer<P: Protocol> {
    /// Handles one request from `client`. `disk` and `pending` (oldest first) are what the node's
    /// storage would hold: committed changes, then those waiting for their commit.
    fn handle(
        &mut self,
        now: u64,
        client: usize,
        writer: bool,
        request: P::Request,
        disk: &P::Disk,
        pending: Vec<&P::Change>,
    ) -> Served<P>;

    /// Periodic work (garbage collection); the changes are persisted like a request's.
    fn tick(&mut self, _now: u64) -> Vec<P::Change> {
        Vec::new()
    }
}

/// What a client operation says after an input.
pub(super) enum OpStep<R> {
    /// Send these (possibly nothing) and keep waiting.
    Continue(Vec<(Slot, R)>),
    /// The operation ended.
    Done(Result<Finished, String>),
}

/// A completed operation, as the history and the counters need it.
pub(super) struct Finished {
    /// For a read, what it returned (`None`: not found); `None` for a write.
    pub read: Option<Option<Bytes>>,
    /// The version written or read, for the trace.
    pub version: String,
    /// Nodes the client convicted, with why.
    pub evidence: Vec<(Slot, String)>,
    /// The read repaired a version.
    pub repaired: bool,
    /// The read restarted (a version was collected under it).
    pub restarts: u32,
}

/// A correct client's operation as the world drives it.
pub(super) trait SimOp<P: Protocol> {
    /// The first round.
    fn start(&mut self) -> Vec<(Slot, P::Request)>;
    /// The current round again, to every server that has not answered it.
    fn retransmit(&self) -> Vec<(Slot, P::Request)>;
    /// Feeds one response.
    fn on_response(&mut self, from: Slot, response: P::Response) -> OpStep<P::Request>;
}

/// A Byzantine reader: makes up requests and learns from the replies it gets.
pub(super) trait Attacker<P: Protocol> {
    /// The next attack on `key`, as `op`: the servers to send to and the request for each.
    fn attack(&mut self, key: &Key, op: OpId, rng: &mut ChaCha8Rng) -> Vec<(usize, P::Request)>;
    /// A reply to one of its requests.
    fn heard(&mut self, response: P::Response);
}
