//! M-PoWerStore messages (spec §4.3), each wrapped with the operation id, the epoch and the
//! replica group so that reconfiguration and many groups per node need no new wire format.

use super::{Candidate, CrossChecksum, MacVec, Nonce, Timestamp};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use crate::round::OpId;

/// A client-to-server message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The operation.
    pub op: OpId,
    /// Which attempt of a read (`tsr` in the paper): a restarted read ignores older replies.
    pub attempt: u32,
    /// The configuration the client believes in.
    pub epoch: Epoch,
    /// The replica group addressed.
    pub group: GroupId,
    /// The register.
    pub key: Key,
    /// The round's payload.
    pub body: RequestBody,
}

/// The payload of a request, named as in the paper.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RequestBody {
    /// CLOCK (Alg. 4, l. 94).
    Clock,
    /// STORE⟨ts, fr_i, cc, N̄, vec⟩ (Alg. 4, l. 104).
    Store {
        /// The write's timestamp.
        ts: Timestamp,
        /// This server's fragment.
        #[serde(with = "bulwark_core::wire::shared_bytes")]
        fragment: Bytes,
        /// The cross-checksum.
        cc: CrossChecksum,
        /// `N̄ = H(N)`.
        nonce_hash: Digest,
        /// The pre-written MAC vector.
        vec: MacVec,
    },
    /// COMPLETE⟨ts, N, vec⟩ (Alg. 4, l. 107).
    Complete {
        /// The write's timestamp.
        ts: Timestamp,
        /// The nonce, revealed only now.
        nonce: Nonce,
        /// The MAC vector.
        vec: MacVec,
    },
    /// COLLECT⟨tsr⟩ (Alg. 6).
    Collect {
        /// Whether to send this node's `Hist` entry for its `lc`, fragment included (the
        /// one-round read asks `f + 1` nodes for it).
        fragment: bool,
    },
    /// FILTER⟨tsr, C⟩ (Alg. 6): the reader's candidates, written back.
    Filter {
        /// At most `n` candidates: one per COLLECT reply.
        candidates: Vec<Candidate>,
    },
    /// REPAIR⟨tsr, c⟩ (Alg. 6, l. 158).
    Repair {
        /// The candidate with its MAC vector repaired.
        candidate: Candidate,
    },
    /// HOLD⟨ts⟩, between members of a key's new incarnation taking it over: the asker holds
    /// `ts` as carried over and serves the key once `2f+1` members hold it or newer (see
    /// [`super::takeover`]). The server answers with its `lc`; the driver of a member that holds
    /// less starts reading the previous incarnation again.
    Hold {
        /// The asker's version of the key; `None` is `ts_0`.
        ts: Option<Timestamp>,
    },
}

impl RequestBody {
    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            RequestBody::Clock => "clock",
            RequestBody::Store { .. } => "store",
            RequestBody::Complete { .. } => "complete",
            RequestBody::Collect { .. } => "collect",
            RequestBody::Filter { .. } => "filter",
            RequestBody::Repair { .. } => "repair",
            RequestBody::Hold { .. } => "hold",
        }
    }
}

/// A server-to-client message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Echoes the request's operation.
    pub op: OpId,
    /// Echoes the request's attempt.
    pub attempt: u32,
    /// The round's payload.
    pub body: ResponseBody,
}

/// The payload of a reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// CLOCK_ACK⟨ts, lc.ts⟩.
    ClockAck {
        /// The server's `lc.ts`; `None` is `ts_0`.
        lc_ts: Option<Timestamp>,
    },
    /// STORE_ACK⟨ts⟩, sent only once `Hist[ts]` is durable.
    StoreAck {
        /// Echo.
        ts: Timestamp,
    },
    /// COMPLETE_ACK⟨ts⟩, sent only once `lc` is durable.
    CompleteAck {
        /// Echo.
        ts: Timestamp,
    },
    /// COLLECT_ACK⟨tsr, lc⟩, with what the server holds of `lc`'s version for the one-round
    /// read (see `client`'s module docs).
    CollectAck {
        /// The server's `lc`; `None` is `c_0`.
        lc: Option<Candidate>,
        /// `Hist[lc.ts]` when the server holds it with `N̄ = H(lc.N)` and a fragment that still
        /// hashes to its slot of `cc`; `None` otherwise.
        entry: Option<LcEntry>,
    },
    /// FILTER_ACK.
    FilterAck(FilterAck),
    /// REPAIR_ACK⟨tsr⟩, whether or not the candidate was adopted.
    RepairAck,
    /// HOLD_ACK: what this member holds of the key.
    HoldAck {
        /// The member's `lc.ts`; `None` is `ts_0`.
        lc_ts: Option<Timestamp>,
    },
    /// The server will not serve this request, and says why.
    Refused(Refusal),
}

/// A server's `Hist` entry for its own `lc`, sent with COLLECT_ACK: what lets a read that finds
/// `n - f` servers agreeing on `lc` return after one round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LcEntry {
    /// This server's fragment of `lc`'s version.
    #[serde(with = "bulwark_core::wire::shared_bytes")]
    pub fragment: Bytes,
    /// The cross-checksum stored with it.
    pub cc: CrossChecksum,
    /// The stored `N̄`.
    pub nonce_hash: Digest,
}

/// FILTER_ACK⟨tsr, c_hv.ts, fr, cc, vec⟩ with the §4.8(a) `N̄`, split by what the server could say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FilterAck {
    /// No candidate of the request was valid here: `c_hv = c_0`.
    Initial,
    /// `Hist[c_hv.ts]`.
    Entry {
        /// `c_hv.ts`.
        ts: Timestamp,
        /// This server's fragment.
        #[serde(with = "bulwark_core::wire::shared_bytes")]
        fragment: Bytes,
        /// The cross-checksum stored with it.
        cc: CrossChecksum,
        /// The stored `N̄`.
        nonce_hash: Digest,
        /// The pre-written MAC vector.
        vec: MacVec,
    },
    /// `c_hv` was valid by its MAC only; this server never stored its fragment. Not lower than
    /// `c_hv`, and no help towards `safe` (spec §7.1 item 5).
    MacOnly {
        /// `c_hv.ts`.
        ts: Timestamp,
    },
    /// This server's `lc` is newer than `ts`, the highest candidate of the request below `lc`,
    /// and it holds no fragment it can vouch with for that candidate (garbage-collected, never
    /// stored, or not validatable here). Not lower than `ts`, so it never helps exclude a valid
    /// candidate whose fragment was collected; `newer` is its `lc`, which the reader may add to
    /// its candidates when nothing it has can become safe (see `client::judge`).
    Superseded {
        /// The highest candidate timestamp of the request below this server's `lc`.
        ts: Timestamp,
        /// This server's `lc`: strictly newer than `ts`.
        newer: Candidate,
    },
}

impl FilterAck {
    /// The timestamp this reply speaks for; `None` is `ts_0`.
    pub fn ts(&self) -> Option<&Timestamp> {
        match self {
            FilterAck::Initial => None,
            FilterAck::Entry { ts, .. }
            | FilterAck::MacOnly { ts }
            | FilterAck::Superseded { ts, .. } => Some(ts),
        }
    }
}

/// Why a server refused a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The client's key is not a writer in the configuration.
    #[error("not a writer")]
    NotWriter,
    /// The client's key is not a reader in the configuration.
    #[error("not a reader")]
    NotReader,
    /// The request named another epoch than the node's, `current`: a client behind moves its
    /// current round there (ERR_UPGRADE_CONFIG).
    #[error("wrong epoch: the node is in epoch {}", current.0)]
    WrongEpoch {
        /// The node's epoch.
        current: Epoch,
    },
    /// The request named a group this node does not serve.
    #[error("wrong replica group")]
    WrongGroup,
    /// The key is still being taken over into its new incarnation here, and too many requests
    /// already wait for that: not an answer, the client asks again.
    #[error("the key is still being taken over")]
    Transferring,
    /// The request was malformed; the text says how.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The register has one writer, and it is another client.
    #[error("the register's only writer is {writer}")]
    NotSoleWriter {
        /// Its writer.
        writer: ClientId,
    },
    /// A STORE on a register with one writer sorts below this node's `lc`, which it names: the
    /// writer's clock is behind. One whose `lc` carries the writers' tag sends the writer above it.
    #[error("the timestamp is below the register's newest version here, {}", lc.num)]
    Stale {
        /// This node's `lc.ts`.
        lc: Timestamp,
    },
}
