//! A causal volume on a node: the server member's [`Node`] behind the contract every hosted
//! replica keeps ([`Replica`]), and the client's one operation ([`Call`]).
//!
//! Clients reach a server by request and reply: each request carries one Depot message, and the
//! reply every message the server's node has for that client in answer, sent once what it
//! accepted is durable (so a `PutAck` means durable, §5.1). A server reaches the other servers
//! of the volume by peer messages and pulls from one of them, in turn, every
//! [`GOSSIP_EVERY_MS`] (§3.5). What a server's node would send to a client other than the one
//! asking cannot be sent (servers do not dial clients); clients pull what they need.
//!
//! Who a peer is comes from the transport, never from a message: a node's slot is its id
//! (the host names members by id), and each member's key names its node or client.

use super::hoard::Values;
use super::node::{Change, Message, Node};
use super::update::{VolumeConfig, VolumeId, Writer};
use crate::machine::{
    Access, OpError, Operation, Output, Progress, Replica, ReplicaStats, TimerId,
};
use bulwark_core::{ClientId, GroupId, NodeId, ServiceId, Slot, Time};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How often a server pulls from another server of the volume.
pub const GOSSIP_EVERY_MS: u64 = 1_000;

/// What a client asks of a server of a causal volume.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// Serve this volume: its configuration, whose number is the hash of the rest. Asking again
    /// with the same configuration is answered the same way.
    Open {
        /// The volume.
        config: VolumeConfig,
    },
    /// One message of the log exchange or of client access (§3, §5).
    Exchange {
        /// The volume.
        volume: VolumeId,
        /// The message.
        message: Message,
    },
}

/// A server's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Reply {
    /// The volume is served here, its configuration durable.
    Opened {
        /// The volume.
        volume: VolumeId,
    },
    /// The server node's messages for the client, in order, once what it accepted is durable.
    Exchange {
        /// The volume.
        volume: VolumeId,
        /// Its messages.
        messages: Vec<Message>,
    },
    /// Not served: why.
    Refused {
        /// Why.
        reason: String,
    },
}

/// What servers of one volume send each other.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerMessage {
    /// The volume.
    pub volume: VolumeId,
    /// The message.
    pub message: Message,
}

/// The group a volume's frames name: the low 32 bits of its number, never the node-wide
/// replica's `u32::MAX`. A node serves one volume per group; a second is refused.
pub fn group_of(volume: VolumeId) -> GroupId {
    let low = volume.0 as u32;
    GroupId(if low == u32::MAX { low - 1 } else { low })
}

/// Who the members of a volume are on the wire: the servers' nodes and the clients.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peers {
    /// The node of each server member.
    pub nodes: BTreeMap<Writer, NodeId>,
    /// The member each client is.
    pub clients: BTreeMap<ClientId, Writer>,
}

impl Peers {
    fn node_member(&self, node: NodeId) -> Option<Writer> {
        self.nodes
            .iter()
            .find(|(_, id)| **id == node)
            .map(|(writer, _)| *writer)
    }
}

/// Counters a server keeps beside its node's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServedStats {
    /// Requests and messages refused (not a member, another volume).
    pub refused: u64,
    /// Messages for clients other than the one asking, not sent.
    pub unsent: u64,
}

/// One volume on its server.
pub struct Served {
    node: Node,
    peers: Peers,
    /// Wall-clock milliseconds at the driver's time zero: Depot's clocks and beacons are in the
    /// time every member shares (§4.8, §6.4), the driver's is monotonic from its start.
    wall_at_zero_ms: u64,
    /// The next server to pull from, by position among the others.
    turn: usize,
    last_gossip: Option<Time>,
    stats: ServedStats,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Served {
    /// The volume's server `node`, reaching its peers as `peers`; `wall_at_zero_ms` is the
    /// wall clock when the driver's time was zero.
    pub fn new(node: Node, peers: Peers, wall_at_zero_ms: u64) -> Served {
        debug_assert!(peers.nodes.contains_key(&node.me()), "a server is a member");
        Served {
            node,
            peers,
            wall_at_zero_ms,
            turn: 0,
            last_gossip: None,
            stats: ServedStats::default(),
        }
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The volume's configuration.
    pub fn config(&self) -> &Arc<VolumeConfig> {
        self.node.log().config()
    }

    /// Counters.
    pub fn served_stats(&self) -> ServedStats {
        self.stats.clone()
    }

    /// What `bulwark status` shows of the volume here.
    pub fn status(&self) -> crate::service::CausalStatus {
        let log = self.node.log();
        let mut frontier: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (writer, clock, _) in log.frontier().flat() {
            frontier.entry(writer.0).or_default().push(clock);
        }
        let stats = self.node.stats();
        crate::service::CausalStatus {
            volume: self.config().volume.0,
            updates: log.len() as u64,
            pending: log.pending() as u64,
            frontier: frontier.into_iter().collect(),
            forks: log.forks().keys().map(|writer| writer.0).collect(),
            refused: stats.refused + stats.values_refused + stats.puts_refused + self.stats.refused,
            values: self.node.values_held() as u64,
            value_bytes: self.node.value_bytes(),
            names: Vec::new(),
            discarded: self.node.discarded() as u64,
            values_damaged: stats.values_damaged,
            pending_discards: self
                .node
                .discard_pending()
                .into_iter()
                .map(|pending| crate::service::PendingDiscardStatus {
                    proposer: pending.proposer.0,
                    turn: pending.turn,
                    versions: pending.versions as u64,
                    missing: pending.missing.into_iter().map(|w| w.0).collect(),
                })
                .collect(),
        }
    }

    /// Whether `member` is evicted (§4.7): this node holds a proof that it forked, so it is
    /// neither answered nor sent to. Its updates already accepted stay, as both branches do.
    fn evicted(&self, member: Writer) -> bool {
        self.node.log().forks().contains_key(&member)
    }

    fn micros(&self, now: Time) -> u64 {
        self.wall_at_zero_ms
            .saturating_add(now.0)
            .saturating_mul(1000)
    }

    fn refuse(&mut self, reason: String) -> Output<Self> {
        self.stats.refused += 1;
        Output {
            reply: Some(Reply::Refused {
                reason: reason.clone(),
            }),
            refused: Some(reason),
            ..Output::none()
        }
    }

    /// `out`'s changes and sends as this replica's: messages for `asking` into `replies`, for
    /// servers as peer messages, for other clients counted.
    fn absorb(
        &mut self,
        from_node: super::node::Output,
        asking: Option<Writer>,
        output: &mut Output<Self>,
        replies: &mut Vec<Message>,
    ) {
        if let Some(first) = from_node.refused.first() {
            // Counted against the peer that sent it, by the driver.
            output.refused = Some(match from_node.refused.len() {
                1 => first.clone(),
                n => format!("{first} (and {} more)", n - 1),
            });
        }
        output.changes.extend(from_node.changes);
        let volume = self.config().volume;
        for (to, message) in from_node.sends {
            if self.evicted(to) {
                self.stats.unsent += 1;
            } else if Some(to) == asking {
                replies.push(message);
            } else if let Some(node) = self.peers.nodes.get(&to) {
                output
                    .sends
                    .push((Slot(node.0), PeerMessage { volume, message }));
            } else {
                self.stats.unsent += 1;
            }
        }
    }
}

impl Replica for Served {
    const SERVICE: ServiceId = ServiceId::DEPOT;
    type Request = Request;
    type Reply = Reply;
    type Message = PeerMessage;
    type Change = Change;
    type View = dyn Values;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        _access: Access,
        request: Request,
        view: &dyn Values,
    ) -> Output<Self> {
        let volume = self.config().volume;
        match request {
            Request::Open { config } => {
                if config == **self.config() {
                    Output::reply(Vec::new(), Reply::Opened { volume })
                } else {
                    self.refuse(format!(
                        "another volume ({:016x}) is served under this one's group",
                        volume.0
                    ))
                }
            }
            Request::Exchange {
                volume: asked,
                message,
            } => {
                if asked != volume {
                    return self.refuse(format!("volume {:016x} is not served here", asked.0));
                }
                let Some(&member) = self.peers.clients.get(&client) else {
                    return self.refuse(format!(
                        "client {} is not a member of volume {:016x}",
                        client.0, volume.0
                    ));
                };
                if self.evicted(member) {
                    return self.refuse(format!(
                        "client {} is evicted from volume {:016x}: proven to have forked",
                        client.0, volume.0
                    ));
                }
                let micros = self.micros(now);
                let answers = self.node.on_message_with(member, message, micros, view);
                let mut output = Output::none();
                let mut replies = Vec::new();
                self.absorb(answers, Some(member), &mut output, &mut replies);
                output.reply = Some(Reply::Exchange {
                    volume,
                    messages: replies,
                });
                output
            }
        }
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: PeerMessage,
        view: &dyn Values,
    ) -> Output<Self> {
        let volume = self.config().volume;
        let Some(member) = self.peers.node_member(NodeId(from.0)) else {
            self.stats.refused += 1;
            return Output {
                refused: Some(format!(
                    "node {} serves no part of volume {:016x}",
                    from.0, volume.0
                )),
                ..Output::none()
            };
        };
        if message.volume != volume {
            self.stats.refused += 1;
            return Output {
                refused: Some(format!("a message of volume {:016x}", message.volume.0)),
                ..Output::none()
            };
        }
        if self.evicted(member) {
            self.stats.refused += 1;
            return Output {
                refused: Some(format!(
                    "node {} is evicted from volume {:016x}: proven to have forked",
                    from.0, volume.0
                )),
                ..Output::none()
            };
        }
        let micros = self.micros(now);
        let answers = self
            .node
            .on_message_with(member, message.message, micros, view);
        let mut output = Output::none();
        self.absorb(answers, None, &mut output, &mut Vec::new());
        output
    }

    fn on_timer(&mut self, _now: Time, _timer: TimerId, _view: &dyn Values) -> Output<Self> {
        Output::none()
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let micros = self.micros(now);
        let housekeeping = self.node.on_tick(micros);
        let mut output = Output::none();
        self.absorb(housekeeping, None, &mut output, &mut Vec::new());
        let due = self
            .last_gossip
            .is_none_or(|last| now.0.saturating_sub(last.0) >= GOSSIP_EVERY_MS);
        let me = self.node.me();
        let others: Vec<Writer> = self
            .peers
            .nodes
            .keys()
            .copied()
            .filter(|writer| *writer != me && !self.evicted(*writer))
            .collect();
        if due && !others.is_empty() {
            self.last_gossip = Some(now);
            let peer = others[self.turn % others.len()];
            self.turn = self.turn.wrapping_add(1);
            let pull = self.node.pull(peer);
            let sends = super::node::Output {
                sends: vec![(peer, pull)],
                ..super::node::Output::default()
            };
            self.absorb(sends, None, &mut output, &mut Vec::new());
        }
        output
    }

    fn stats(&self) -> ReplicaStats {
        let log = self.node.log();
        ReplicaStats {
            versions: log.len() as u64,
            keys: log.keys().count() as u64,
            bytes: self.node.value_bytes(),
            ..ReplicaStats::default()
        }
    }
}

/// A client's call to one server: one request, done at its reply.
#[derive(Debug)]
pub struct Call {
    op: u64,
    request: Request,
    answered: bool,
}

impl Call {
    /// Operation `op` sending `request`.
    pub fn new(op: u64, request: Request) -> Call {
        Call {
            op,
            request,
            answered: false,
        }
    }
}

impl Operation for Call {
    const SERVICE: ServiceId = ServiceId::DEPOT;
    type Request = Request;
    type Reply = Reply;
    type Output = Reply;

    fn op(&self) -> u64 {
        self.op
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        vec![(Slot(0), self.request.clone())]
    }

    fn on_reply(&mut self, from: Slot, reply: Reply) -> Progress<Self> {
        self.answered = true;
        match reply {
            Reply::Refused { reason } => Progress::Done(Err(OpError::Refused {
                reason,
                by: vec![from],
            })),
            reply => Progress::Done(Ok(reply)),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        // Every request is idempotent: a pull, push, put or get asked twice is answered alike.
        self.start()
    }

    fn answered(&self) -> Vec<Slot> {
        if self.answered {
            vec![Slot(0)]
        } else {
            Vec::new()
        }
    }

    fn quorum(&self) -> usize {
        1
    }
}
