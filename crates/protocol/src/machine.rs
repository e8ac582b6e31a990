//! The one contract every protocol's machines keep, so that the node, the client library and the
//! simulator each drive all of them with one generic driver (DESIGN.md §2).
//!
//! - A [`Replica`] is one member of one replica group for one service. It takes a client's
//!   request, a peer replica's message, or a timer, and answers with an [`Output`]: changes to make
//!   durable, then a reply, messages to peers, timers to set, evidence to report.
//! - An [`Operation`] is one client operation: it starts, takes replies and timeouts, and ends.
//!
//! Machines live in slot space: they know their group's members only by [`Slot`] and never see
//! other groups. Drivers translate slots to nodes through the group's view. Nothing here does
//! I/O; time comes in as [`Time`].
//!
//! The rule every driver keeps, and the simulator checks: a reply or message leaves only once
//! every change the replica emitted before it (in the same output or an earlier one) is durable.
//! [`Sequencer`] is that rule, written once for every driver.

use bulwark_core::a2m::{Call, Outcome, Refusal};
use bulwark_core::membership::{Chain, Ring};
use bulwark_core::wire::{DeserializeOwned, Serialize};
use bulwark_core::{ClientId, Epoch, GroupId, ServiceId, Slot, Time};
use std::collections::VecDeque;

/// What an authenticated client may do, from the configuration's access list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// May write (and start any write round).
    pub write: bool,
    /// May read.
    pub read: bool,
}

/// A timer a replica set; the replica names it, the driver only hands it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// A replica's counters, for `bulwark status` and metrics; services fill what applies to them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaStats {
    /// Keys whose latest version is a value.
    pub objects: u64,
    /// Keys with any state.
    pub keys: u64,
    /// Versions held.
    pub versions: u64,
    /// Value or fragment bytes held.
    pub bytes: u64,
    /// Versions garbage-collected since start.
    pub collected: u64,
    /// Stored data found damaged when it was read back.
    pub damaged: u64,
    /// A replica that follows the configuration: the epoch it is in (0 for the others).
    pub epoch: u64,
    /// Arcs it is still taking over from their previous group and has not yet heard `2f+1`
    /// old members about in full.
    pub transfers_pending: u64,
    /// Objects of those arcs that `2f+1` old members answered about without deciding them (a
    /// creation a faulty writer never completed): their requests wait, their fetches are
    /// retried, and they do not count as a transfer the node is slow with.
    pub transfers_undecided: u64,
    /// Keys taken over from previous groups since start whose version the node did not hold
    /// already (a member that kept a key across the change is not handed it again).
    pub transferred_keys: u64,
    /// Their value bytes.
    pub transferred_bytes: u64,
    /// Requests held until their key's transfer finished, since start.
    pub gated: u64,
    /// Tables: signatures of other members this replica, as proxy, refused to count.
    pub bad_signatures: u64,
    /// Tables: cells refused or passed over because their writer's signature failed.
    pub forged_cells: u64,
    /// Tables: reads this replica, as proxy, resolved because the answers disagreed.
    pub resolved_reads: u64,
    /// Tables: write-backs this replica took from a proxy's resolution.
    pub repairs: u64,
    /// Tables: cells this replica took from other members' anti-entropy.
    pub synced: u64,
    /// Tables: Full-Sym writes whose tag for this replica was missing or failed, so it checked
    /// their signatures instead (a proxy that altered the tags, or a client that did not know
    /// this replica).
    pub mac_fallbacks: u64,
    /// Tables: cells older than the GC grace taken once `f+1` members said they hold them.
    pub confirmed_live: u64,
    /// Tables: cells older than the GC grace refused as not live (a deleted value offered
    /// again, by a faulty member or one that missed the delete).
    pub not_live: u64,
    /// Tables: clients the administrator revoked, as this replica holds it (a node's total is
    /// the most any of its replicas holds: every group gets the same revocations).
    pub revoked_clients: u64,
    /// Tables: writes refused because their writer is revoked.
    pub revoked_refused: u64,
    /// Tables: by slot of this replica's group, the signatures this replica, as proxy, refused
    /// from that member. Per group: [`ReplicaStats::add`] leaves it out of totals.
    pub bad_signers: Vec<(u32, u64)>,
}

impl ReplicaStats {
    /// Adds `other` into `self`, for a node's totals over its replicas (counters only: what is
    /// counted per slot belongs to one group).
    pub fn add(&mut self, other: &ReplicaStats) {
        self.objects += other.objects;
        self.keys += other.keys;
        self.versions += other.versions;
        self.bytes += other.bytes;
        self.collected += other.collected;
        self.damaged += other.damaged;
        self.epoch = self.epoch.max(other.epoch);
        self.transfers_pending += other.transfers_pending;
        self.transfers_undecided += other.transfers_undecided;
        self.transferred_keys += other.transferred_keys;
        self.transferred_bytes += other.transferred_bytes;
        self.gated += other.gated;
        self.bad_signatures += other.bad_signatures;
        self.forged_cells += other.forged_cells;
        self.resolved_reads += other.resolved_reads;
        self.repairs += other.repairs;
        self.synced += other.synced;
        self.mac_fallbacks += other.mac_fallbacks;
        self.confirmed_live += other.confirmed_live;
        self.not_live += other.not_live;
        self.revoked_clients = self.revoked_clients.max(other.revoked_clients);
        self.revoked_refused += other.revoked_refused;
    }
}

/// What a replica asks of its driver after one input. Everything in `reply` and `sends` leaves
/// only after `changes` (and every change before them) are durable.
pub struct Output<R: Replica + ?Sized> {
    /// To make durable, in order.
    pub changes: Vec<R::Change>,
    /// The answer to the request that caused this output, if any.
    pub reply: Option<R::Reply>,
    /// Answers to earlier requests, each to its client with the request's operation id (a
    /// replica that orders requests answers once they execute, not when they arrive).
    pub notify: Vec<(ClientId, u64, R::Reply)>,
    /// Messages to replicas of the same group.
    pub sends: Vec<(Slot, R::Message)>,
    /// Timers to set: `on_timer(id)` at or after the time. Setting an id again moves it.
    pub timers: Vec<(TimerId, Time)>,
    /// Why the input was refused, for metrics and the node's rejection counts.
    pub refused: Option<String>,
    /// Calls to the node's trusted log (A2M), made in order once every change before them is
    /// durable: a log must never commit to state its server could still lose. Their answers come
    /// back through [`Replica::on_attested`].
    pub attest: Vec<Attest>,
}

/// Calls to the trusted log whose answers go back to the replica together, under `token`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attest {
    /// The replica's name for this batch of calls; the driver only hands it back.
    pub token: u64,
    /// Made one after the other; the first refusal ends the batch.
    pub calls: Vec<Call>,
}

/// What the trusted log answered to one [`Attest`]: an answer per call made, in order, the last
/// one the refusal if there was one.
pub type Attested = Vec<Result<Outcome, Refusal>>;

impl<R: Replica + ?Sized> Output<R> {
    /// Nothing to do.
    pub fn none() -> Self {
        Output {
            changes: Vec::new(),
            reply: None,
            notify: Vec::new(),
            sends: Vec::new(),
            timers: Vec::new(),
            refused: None,
            attest: Vec::new(),
        }
    }

    /// Nothing to do but count a refusal of a peer's input, saying why.
    pub fn refused(why: String) -> Self {
        Output {
            refused: Some(why),
            ..Output::none()
        }
    }

    /// Persist `changes`, then send `reply`.
    pub fn reply(changes: Vec<R::Change>, reply: R::Reply) -> Self {
        Output {
            changes,
            reply: Some(reply),
            ..Output::none()
        }
    }

    /// The same output as another replica's with the same changes, replies and messages: what a
    /// wrapper around a replica hands on.
    pub fn retyped<S>(self) -> Output<S>
    where
        S: Replica<Change = R::Change, Reply = R::Reply, Message = R::Message> + ?Sized,
    {
        Output {
            changes: self.changes,
            reply: self.reply,
            notify: self.notify,
            sends: self.sends,
            timers: self.timers,
            refused: self.refused,
            attest: self.attest,
        }
    }

    /// This output, then `later`: every change of this one comes first, so whatever `later`
    /// sends waits for both. `later`'s reply and refusal win, an input has one of each.
    pub fn and(mut self, later: Output<R>) -> Self {
        self.changes.extend(later.changes);
        self.reply = later.reply.or(self.reply);
        self.notify.extend(later.notify);
        self.sends.extend(later.sends);
        self.timers.extend(later.timers);
        self.refused = later.refused.or(self.refused);
        self.attest.extend(later.attest);
        self
    }
}

/// One member of one replica group for one service.
pub trait Replica {
    /// The service this replica serves: what frames for it say in their header.
    const SERVICE: ServiceId;
    /// A client's request.
    type Request: DeserializeOwned;
    /// The answer to a client.
    type Reply: Serialize;
    /// What replicas of one group send each other (`Never` for services that need none).
    type Message: Serialize + DeserializeOwned;
    /// A change to durable state.
    type Change;
    /// Read access to what this replica's changes put into the driver's storage, durable or
    /// pending (a PoWerStore replica reads fragments back through it; most need nothing).
    type View: ?Sized;

    /// A client's request.
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Self::Request,
        view: &Self::View,
    ) -> Output<Self>;

    /// A message from the replica in `from` of the same group.
    fn on_message(
        &mut self,
        _now: Time,
        _from: Slot,
        _message: Self::Message,
        _view: &Self::View,
    ) -> Output<Self> {
        Output::none()
    }

    /// A timer this replica set.
    fn on_timer(&mut self, _now: Time, _timer: TimerId, _view: &Self::View) -> Output<Self> {
        Output::none()
    }

    /// What the trusted log answered to the calls of [`Output::attest`] named `token`. Calls
    /// made before a crash may never be answered: a restarted replica finds out from the log.
    fn on_attested(
        &mut self,
        _now: Time,
        _token: u64,
        _answers: Attested,
        _view: &Self::View,
    ) -> Output<Self> {
        Output::none()
    }

    /// Periodic housekeeping (garbage collection); the driver calls it every few hundred ms.
    fn on_tick(&mut self, _now: Time) -> Output<Self> {
        Output::none()
    }

    /// The certified ring of the next epoch (Rosebud §4.7), handed over in order, once each:
    /// replicas that follow the configuration enter it; the others are bound to one group of one
    /// epoch and ignore it.
    fn on_epoch(&mut self, _now: Time, _ring: std::sync::Arc<Ring>) -> Output<Self> {
        Output::none()
    }

    /// Current counters.
    fn stats(&self) -> ReplicaStats;
}

/// A message type with no values, for replicas that never talk to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Never {}

/// Why an operation ended without a result. Timeouts are the driver's, not the protocol's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// `f+1` replicas refused, so at least one correct replica did.
    #[error("refused by {} replicas: {reason}", by.len())]
    Refused {
        /// The first refusal.
        reason: String,
        /// Who refused.
        by: Vec<Slot>,
    },
    /// The operation failed for a reason of its own; the text says which.
    #[error("{0}")]
    Failed(String),
    /// The operation ended without learning whether it took effect (a write cut by a change of
    /// its key's group after it revealed its nonce); the text says why. Reading the key tells.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

/// What an operation says after an input.
pub enum Progress<O: Operation + ?Sized> {
    /// Send these (possibly none) and keep feeding replies.
    Send(Vec<(Slot, O::Request)>),
    /// The operation is over.
    Done(Result<O::Output, OpError>),
}

/// One client operation on one group.
pub trait Operation {
    /// The service whose replicas it talks to.
    const SERVICE: ServiceId;
    /// What it sends.
    type Request: Serialize;
    /// What replicas answer.
    type Reply: DeserializeOwned;
    /// What it returns.
    type Output;

    /// The operation id replies must echo: what drivers route replies by.
    fn op(&self) -> u64;

    /// The first round.
    fn start(&mut self) -> Vec<(Slot, Self::Request)>;

    /// One reply from the replica in `from`.
    fn on_reply(&mut self, from: Slot, reply: Self::Reply) -> Progress<Self>;

    /// No progress for a while: the current round again, to every replica that has not answered,
    /// or, for an operation that waits past its quorum for more (a PoWerStore read waiting for
    /// fragments), its next round.
    fn on_timeout(&mut self) -> Vec<(Slot, Self::Request)>;

    /// Replicas that have answered the current round, to name the others when a deadline passes.
    fn answered(&self) -> Vec<Slot>;

    /// The replies each round waits for.
    fn quorum(&self) -> usize;

    /// Why the current round cannot finish although a quorum answered it (their answers do not
    /// agree, say): what the error a deadline ends the operation with says was missing. `None`
    /// (the default) when replies alone are missing.
    fn stalled(&self) -> Option<String> {
        None
    }

    /// Where the current round runs, for operations that follow the configuration: its epoch
    /// and group, with slots naming nodes (`Slot(id)`) rather than positions in one group.
    /// `None` (the default) for operations bound to one group of one epoch.
    fn route(&self) -> Option<(Epoch, GroupId)> {
        None
    }

    /// A replica named a newer epoch than the configurations this operation holds
    /// (ERR_NEED_CONFIG): the driver fetches them and hands them over with [`Operation::learn`].
    fn needs(&self) -> Option<Epoch> {
        None
    }

    /// The verified configurations the driver fetched after [`Operation::needs`]: the current
    /// round moves to the newest epoch the replicas named that they reach (or the operation
    /// ends, when it cannot go on there).
    fn learn(&mut self, _chain: std::sync::Arc<Chain>) -> Progress<Self> {
        Progress::Send(Vec::new())
    }
}

/// Persist-then-send, once for every driver: sends are held until every change submitted before
/// them is durable. Batches are numbered in submission order and become durable in that order.
#[derive(Debug)]
pub struct Sequencer<T> {
    /// The last batch number handed out; 0 before any.
    submitted: u64,
    /// Every batch up to this one is durable.
    durable: u64,
    /// Sends waiting, each with the batch it waits for, in order.
    held: VecDeque<(u64, T)>,
}

impl<T> Default for Sequencer<T> {
    fn default() -> Self {
        Sequencer {
            submitted: 0,
            durable: 0,
            held: VecDeque::new(),
        }
    }
}

impl<T> Sequencer<T> {
    /// The number the next non-empty batch will get.
    pub fn next_batch(&self) -> u64 {
        self.submitted + 1
    }

    /// Records that a non-empty batch of changes goes to the disk now; returns its number.
    pub fn submit(&mut self) -> u64 {
        self.submitted += 1;
        self.submitted
    }

    /// Queues `send` behind every batch submitted so far; returns it at once when they are all
    /// durable already.
    pub fn send(&mut self, send: T) -> Option<T> {
        if self.durable >= self.submitted {
            debug_assert!(self.held.is_empty(), "nothing waits once all is durable");
            return Some(send);
        }
        self.held.push_back((self.submitted, send));
        None
    }

    /// Batch `batch` (and so every batch before it) is durable: the sends this releases, in order.
    pub fn durable(&mut self, batch: u64) -> Vec<T> {
        assert!(
            batch <= self.submitted,
            "batch {batch} reported durable but only {} submitted",
            self.submitted
        );
        self.durable = self.durable.max(batch);
        let mut released = Vec::new();
        while let Some((needed, _)) = self.held.front() {
            if *needed > self.durable {
                break;
            }
            if let Some((_, send)) = self.held.pop_front() {
                released.push(send);
            }
        }
        released
    }

    /// Every batch up to this one is durable.
    pub fn durable_up_to(&self) -> u64 {
        self.durable
    }

    /// Sends still waiting for the disk.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_wait_for_every_batch_before_them_and_leave_in_order() {
        let mut sequencer = Sequencer::default();
        assert_eq!(
            sequencer.send("early"),
            Some("early"),
            "nothing to wait for"
        );
        let first = sequencer.submit();
        assert_eq!(sequencer.send("a"), None);
        let second = sequencer.submit();
        assert_eq!(sequencer.send("b"), None);
        assert_eq!(sequencer.send("c"), None);
        assert_eq!(sequencer.durable(first), vec!["a"]);
        assert_eq!(sequencer.held(), 2);
        assert_eq!(sequencer.durable(second), vec!["b", "c"]);
        assert_eq!(sequencer.send("d"), Some("d"));
        // A late report of an older batch changes nothing.
        assert!(sequencer.durable(first).is_empty());
        assert_eq!(sequencer.durable_up_to(), second);
    }

    #[test]
    #[should_panic(expected = "reported durable")]
    fn a_batch_never_submitted_cannot_become_durable() {
        let mut sequencer: Sequencer<()> = Sequencer::default();
        sequencer.durable(1);
    }
}
