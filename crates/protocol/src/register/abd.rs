//! Multi-writer ABD (Attiya, Bar-Noy, Dolev; the multi-writer form of Lynch and Shvartsman): the
//! crash-tolerant linearizable register PoWerStore's evaluation compares against (spec §6.1,
//! "M-ABD"). `n = 2f+1` servers, every quorum a majority `f+1`; servers may crash, never lie, so
//! a version is just a timestamp and a value and CLOCK returns the timestamp.

use super::{Clocked, Judged, Policy};
use bulwark_core::{ClientId, Epoch, GroupId, Key, OBJECT_BYTES_MAX, Slot};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use super::{OpId, ProtocolError, ReadOutcome, Refusal, ServerStats, Timestamp, WriteOutcome};

/// The ABD policy: `2f+1` servers, unsigned versions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Abd;

/// A stored version: its timestamp and value (`None`: a delete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The version's timestamp.
    pub ts: Timestamp,
    /// The whole value; `None` is a tombstone.
    pub value: Option<Bytes>,
}

impl Entry {
    /// Whether a correct party could have made it: a real timestamp, a value within the limit.
    pub fn is_well_formed(&self) -> bool {
        self.ts.num >= 1
            && self
                .value
                .as_ref()
                .is_none_or(|v| v.len() <= OBJECT_BYTES_MAX)
    }
}

impl Policy for Abd {
    const SERVICE: bulwark_core::ServiceId = bulwark_core::ServiceId::ABD;
    const NAME: &'static str = "abd";
    const ROUND_NAMES: [&'static str; 4] = ["abd_clock", "abd_store", "abd_get", "abd_write_back"];
    type Entry = Entry;
    type Clock = Timestamp;
    type Context = ();
    type Signer = ();

    fn n(f: usize) -> usize {
        2 * f + 1
    }

    fn ts(entry: &Entry) -> Timestamp {
        entry.ts
    }

    fn value(entry: &Entry) -> Option<&Bytes> {
        entry.value.as_ref()
    }

    fn into_value(entry: Entry) -> Option<Bytes> {
        entry.value
    }

    fn make(_: &(), _: GroupId, _: &Key, ts: Timestamp, value: Option<Bytes>) -> Entry {
        Entry { ts, value }
    }

    fn clock(entry: &Entry) -> Timestamp {
        entry.ts
    }

    fn clock_ts(_: &(), _: GroupId, _: &Key, clock: Option<Timestamp>) -> Clocked {
        // No correct server stores timestamp 0.
        match clock {
            Some(ts) if ts.num == 0 => Clocked::Ignored,
            clock => Clocked::Counted(clock),
        }
    }

    fn admit(_: &(), _: GroupId, _: &Key, _: ClientId, _: bool, entry: &Entry) -> Option<Refusal> {
        (!entry.is_well_formed())
            .then(|| Refusal::Malformed("timestamp 0 or value too large".into()))
    }

    fn judge(_: &(), _: GroupId, _: &Key, entry: &Entry) -> Judged {
        if entry.is_well_formed() {
            Judged::Valid
        } else {
            Judged::Ignored
        }
    }
}

/// A client-to-server message.
pub type Request = super::Request<Abd>;
/// The rounds.
pub type RequestBody = super::RequestBody<Abd>;
/// A server-to-client message.
pub type Response = super::Response<Abd>;
/// Replies.
pub type ResponseBody = super::ResponseBody<Abd>;
/// A state change made durable before the reply.
pub type Change = super::Change<Abd>;
/// The outcome of one request.
pub type Handled = super::Handled<Abd>;
/// An ABD server.
pub type Server = super::Server<Abd>;
/// What ABD operations know of the group.
pub type ClientConfig = super::ClientConfig<Abd>;
/// One write.
pub type WriteOp = super::WriteOp<Abd>;
/// One read.
pub type ReadOp = super::ReadOp<Abd>;
/// A message to send.
pub type Outbound = super::Outbound<Abd>;
/// What a machine says after an input.
pub type Step<T> = super::Step<Abd, T>;

impl Server {
    /// A server with empty state.
    pub fn new(node: Slot, epoch: Epoch, group: GroupId) -> Server {
        Server::with_context(node, epoch, group, ())
    }

    /// Handles one authenticated request from a client with the given rights.
    pub fn handle(&mut self, may_write: bool, may_read: bool, request: Request) -> Handled {
        // ABD servers do not care who wrote a version: writers are trusted not to lie.
        self.serve(ClientId(u32::MAX), may_write, may_read, request)
    }
}

impl ClientConfig {
    /// A group of `2f+1` in epoch 0, group 0.
    pub fn new(f: usize) -> ClientConfig {
        ClientConfig::with_context(f, ())
    }
}

impl WriteOp {
    /// A write of `value` (`None` deletes) by `writer`; `seq` must be unique among its writes.
    pub fn new(
        config: ClientConfig,
        key: Key,
        op: OpId,
        writer: ClientId,
        seq: u64,
        value: Option<Bytes>,
    ) -> WriteOp {
        WriteOp::with_signer(config, key, op, writer, seq, (), value)
    }
}

#[cfg(test)]
mod tests;
