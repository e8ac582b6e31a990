//! What the world needs of a protocol, so that one scheduler, one nemesis and one checker drive
//! every protocol Bulwark has (DESIGN.md §2): M-PoWerStore, the ABD and Phalanx baselines, and
//! the configuration service (`protocols::cs`, with a checker of its own). The trait is public so
//! that a service written elsewhere (the gossip service of the tests) runs in the same world,
//! with a checker of its own ([`Protocol::check`], through [`super::run_service`]). Replicas that
//! order requests answer them when they execute, not when they arrive: the world routes those
//! answers (`Output::notify`) to the client that sent the request, behind the same disk batch as
//! a reply.
//!
//! A [`Protocol`] is built once per run from the seed's generator (its keys and configuration),
//! then builds servers (honest or Byzantine), restores them from their simulated disk after a
//! crash, and starts client operations. Servers are [`Replica`]s and operations are
//! [`Operation`]s, the contract the node and the client drive too; the world drives them
//! generically. What stays here is what only the protocol knows: how to build its machines, what
//! its disk holds, how to describe its messages for the trace, and what a finished operation
//! means to the checker ([`Finish`]). Each implementation lives in `protocols/`.

use super::RunStats;
use super::config::{FaultSet, SimConfig};
use super::swarm::Swarm;
use crate::byzantine::Behaviour;
use crate::checker::{self, History, Report};
use bulwark_core::{Key, Slot};
use bulwark_protocol::machine::{Operation, Replica};
use bulwark_protocol::round::OpId;
use bytes::Bytes;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// One protocol under simulation.
pub trait Protocol: Sized {
    /// A client-to-server message.
    type Request: Clone + std::fmt::Debug;
    /// A server-to-client message.
    type Response: Clone + std::fmt::Debug;
    /// A state change a server makes durable before its reply leaves.
    type Change;
    /// One server's simulated disk: the changes whose persistence completed.
    type Disk: Default;
    /// A server, honest or Byzantine.
    type Server: Replica<
            Request = Self::Request,
            Reply = Self::Response,
            Change = Self::Change,
            Message: Clone,
        >;
    /// A correct client's write.
    type Write: Operation<Request = Self::Request, Reply = Self::Response, Output: Finish>;
    /// A correct client's read.
    type Read: Operation<Request = Self::Request, Reply = Self::Response, Output: Finish>;

    /// After the last operation, how long the world keeps running (timers, peer traffic) before
    /// it is judged: services that converge in the background need the time.
    const SETTLE_MILLIS: u64 = 0;

    /// How many servers a group tolerating `f` faults has.
    fn nodes(f: usize) -> usize;

    /// The faults of `wanted` this protocol is built to survive: the swarm never places others.
    /// A crash-only protocol drops every Byzantine behaviour and Byzantine readers.
    fn tolerated(wanted: &FaultSet) -> FaultSet;

    /// The run's shared setup (keys, configurations), drawn from the run's generator.
    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, swarm: &Swarm) -> Self;

    /// A fresh server `index` with `behaviour`, seeded with `seed` (shared by colluders).
    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> Self::Server;

    /// Server `index`'s trusted log (A2M), for protocols that call one: it lives beside the
    /// server's disk and, like a durable component, survives the server's crashes. A Byzantine
    /// server calls it too, since it cannot forge its attestations.
    fn trusted_log(&self, _index: usize) -> Option<bulwark_a2m::Component> {
        None
    }

    /// An honest server `index` rebuilt from its disk alone, as a restarted node is.
    fn restore(&self, index: usize, disk: &Self::Disk, now: u64) -> Self::Server;

    /// What the server sees of `storage`, as the node's actor shows it redb and its queue.
    fn view(storage: &Storage<Self>) -> &<Self::Server as Replica>::View;

    /// Applies one committed change to a disk, in commit order.
    fn persist(disk: &mut Self::Disk, change: &Self::Change);

    /// Versions on a disk, for the trace.
    fn disk_versions(disk: &Self::Disk) -> usize;

    /// A write by `client` of `value` (`None` deletes), invoked at `now` (virtual milliseconds,
    /// a clock every client shares). Writers that need randomness (nonces) draw it from `rng`.
    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        now: u64,
        rng: &mut ChaCha8Rng,
    ) -> Self::Write;

    /// A read of `key` by `client`.
    fn read(&self, client: usize, key: Key, op: OpId) -> Self::Read;

    /// The run's key number `index`, where the first `writers` clients write.
    fn key(&self, index: usize, _writers: usize) -> Key {
        Key::new(format!("key{index}").into_bytes())
            .unwrap_or_else(|_| unreachable!("short ASCII keys are valid"))
    }

    /// Whether writer `client` writes `key` (registers with one writer take only that writer's
    /// writes); when not, the client reads it instead.
    fn may_write(&self, _client: usize, _key: &Key) -> bool {
        true
    }

    /// A correct client's write of `key` completed with `output`: writers that keep state from one
    /// operation to the next (a sole writer's clock) learn it here.
    fn wrote(&self, _client: usize, _key: &Key, _output: &<Self::Write as Operation>::Output) {}

    /// Correct client `client` crashed: whatever it kept in memory is gone.
    fn client_crashed(&self, _client: usize) {}

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

    /// One line describing a message between servers, for the trace.
    fn describe_message(_message: &<Self::Server as Replica>::Message) -> String {
        String::new()
    }

    /// Counts what a new round of a correct client carries (PoWerStore counts §4.8(a) twins).
    fn count_round(_first: &Self::Request, _stats: &mut RunStats) {}

    /// Judges a finished run: the history of correct clients' operations, and every server that
    /// is correct and up at the end (`None` for the others). Registers must be linearizable.
    fn check(&self, history: &History, _servers: &[Option<&Self::Server>]) -> Report {
        checker::check(history)
    }

    /// A Byzantine reader, for protocols that have a catalogue of them; the world asks only when
    /// the swarm placed attackers, which it does only if [`Protocol::tolerated`] kept them.
    fn attacker(&self, _seed: u64) -> Option<Box<dyn Attacker<Self>>> {
        None
    }
}

/// One server's simulated storage: its disk, and the batches on their way to it.
pub struct Storage<P: Protocol> {
    /// What survives a crash.
    pub durable: P::Disk,
    /// Batches not yet durable, oldest first.
    committing: VecDeque<Commit<P>>,
}

/// A batch of changes on its way to the disk.
struct Commit<P: Protocol> {
    /// The sequencer's number for it.
    batch: u64,
    /// When its commit completes.
    at: u64,
    changes: Vec<P::Change>,
}

impl<P: Protocol> Default for Storage<P> {
    fn default() -> Self {
        Storage {
            durable: P::Disk::default(),
            committing: VecDeque::new(),
        }
    }
}

impl<P: Protocol> Storage<P> {
    /// Changes handled but not yet durable, oldest first.
    pub fn pending(&self) -> impl DoubleEndedIterator<Item = &P::Change> {
        self.committing.iter().flat_map(|commit| &commit.changes)
    }

    /// Queues batch `batch` to commit at `at` (never before an earlier batch).
    pub(in crate::sim) fn submit(&mut self, batch: u64, at: u64, changes: Vec<P::Change>) {
        self.committing.push_back(Commit { batch, at, changes });
    }

    /// Commits every batch due by `now`; returns the last one and the changes applied.
    pub(in crate::sim) fn commit_due(&mut self, now: u64) -> Option<(u64, u64)> {
        let mut done = None;
        let mut applied = 0;
        while let Some(commit) = self.committing.pop_front_if(|c| c.at <= now) {
            for change in &commit.changes {
                P::persist(&mut self.durable, change);
            }
            applied += commit.changes.len() as u64;
            done = Some(commit.batch);
        }
        done.map(|batch| (batch, applied))
    }

    /// A crash: every batch not yet durable is lost. Returns how many.
    pub(in crate::sim) fn crash(&mut self) -> usize {
        let lost = self.committing.len();
        self.committing.clear();
        lost
    }
}

/// A completed operation, as the history and the counters need it.
pub struct Finished {
    /// For a read, what it returned (`None`: not found); `None` for a write.
    pub read: Option<Option<Bytes>>,
    /// The version written or read, for the trace.
    pub version: String,
    /// Nodes the client convicted, with why.
    pub evidence: Vec<(Slot, String)>,
    /// The read repaired a version.
    pub repaired: bool,
    /// The read restarted (a version was collected under it), or the write stored again (a sole
    /// writer's STORE refused as stale).
    pub restarts: u32,
    /// The read ended after its first round.
    pub one_round: bool,
}

/// What an operation's result means to the history and the counters.
pub trait Finish {
    /// The result, in the world's terms.
    fn finish(self) -> Finished;
}

/// A Byzantine reader: makes up requests and learns from the replies it gets.
pub trait Attacker<P: Protocol> {
    /// The next attack on `key`, as `op`: the servers to send to and the request for each.
    fn attack(&mut self, key: &Key, op: OpId, rng: &mut ChaCha8Rng) -> Vec<(usize, P::Request)>;
    /// A reply to one of its requests.
    fn heard(&mut self, response: P::Response);
}
