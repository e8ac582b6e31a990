//! Links to the other nodes of the configuration, each dialled the first time a replica sends to
//! that node: a node whose replicas never talk to their groups (the registers) keeps no
//! connections to other nodes, and a starting cluster does not dial peers that are not up yet.
//! The nodes of `cluster.toml` are known from the start; members certified later are learnt
//! from each configuration as it is verified.

use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::membership::Member;
use bulwark_transport::{Connector, Link, Router, SendError};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

/// Where a node is reached and the certificate it must present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    pub address: SocketAddr,
    pub fingerprint: Fingerprint,
}

/// Frames a replica of this node sends to this node, waiting to be delivered: at most this many.
pub const LOOPBACK_FRAMES_MAX: usize = 1024;

pub struct Peers {
    me: NodeId,
    /// Where frames for this node itself go: a replica that is an old and a new member of the
    /// same key range asks itself too, and with a member down its own answer can be the one
    /// that makes the quorum.
    loopback: tokio::sync::mpsc::Sender<Bytes>,
    nodes: RwLock<HashMap<NodeId, Reach>>,
    /// Names to dial some nodes at instead of their configured addresses (containers).
    via: HashMap<NodeId, String>,
    connector: Arc<Connector>,
    /// Where what peers send back on these links goes.
    router: Router,
    links: Mutex<HashMap<NodeId, Link>>,
}

impl Peers {
    pub fn new(
        me: NodeId,
        loopback: tokio::sync::mpsc::Sender<Bytes>,
        via: HashMap<NodeId, String>,
        connector: Arc<Connector>,
        router: Router,
    ) -> Peers {
        Peers {
            me,
            loopback,
            nodes: RwLock::new(HashMap::new()),
            via,
            connector,
            router,
            links: Mutex::new(HashMap::new()),
        }
    }

    /// Makes `node` reachable. A node's id is never reused for another certificate, so the first
    /// entry stays; an open link is never redirected by a later claim.
    pub fn learn(&self, node: NodeId, reach: Reach) {
        if node == self.me {
            return;
        }
        if let Ok(mut nodes) = self.nodes.write() {
            nodes.entry(node).or_insert(reach);
        }
    }

    /// Queues `frame` for node `to`, dialling it first if this is the first frame for it. Must be
    /// called within the runtime (a new link spawns its task).
    pub fn send(&self, to: NodeId, frame: Bytes) -> Result<(), String> {
        if to == self.me {
            // Full: dropped like a frame for a link whose queue is full; the sender retries.
            return self
                .loopback
                .try_send(frame)
                .map_err(|error| format!("to itself: {error}"));
        }
        let Some(node) = self
            .nodes
            .read()
            .ok()
            .and_then(|nodes| nodes.get(&to).copied())
        else {
            return Err(format!("{to} is not a peer in the configuration"));
        };
        let Ok(mut links) = self.links.lock() else {
            return Err("peer links poisoned".into());
        };
        let link = links.entry(to).or_insert_with(|| match self.via.get(&to) {
            Some(via) => Link::spawn_via(
                to,
                node.address,
                via.clone(),
                node.fingerprint,
                self.connector.clone(),
                self.router.clone(),
            ),
            None => Link::spawn(
                to,
                node.address,
                node.fingerprint,
                self.connector.clone(),
                self.router.clone(),
            ),
        });
        link.send(frame)
            .map_err(|error: SendError| error.to_string())
    }
}

/// What must know a member before it can talk to this node: the links this node dials, and the
/// certificates its listener admits.
pub struct Directory {
    pub peers: Arc<Peers>,
    pub inbound: Arc<bulwark_transport::Inbound>,
}

impl Directory {
    /// Makes every one of `members` reachable and admitted, as the node it is certified as.
    pub fn meet<'a>(&self, members: impl IntoIterator<Item = &'a Member>) {
        for member in members {
            self.peers.learn(
                member.id,
                Reach {
                    address: member.address,
                    fingerprint: member.fingerprint,
                },
            );
            self.inbound
                .admit(member.fingerprint, bulwark_transport::Peer::Node(member.id));
        }
    }
}
