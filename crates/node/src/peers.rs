//! Links to the other nodes of the configuration, each dialled the first time a replica sends to
//! that node: a node whose replicas never talk to their groups (the registers) keeps no
//! connections to other nodes, and a starting cluster does not dial peers that are not up yet.

use bulwark_core::NodeId;
use bulwark_core::config::NodeEntry;
use bulwark_transport::{Connector, Link, Router, SendError};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct Peers {
    nodes: HashMap<NodeId, NodeEntry>,
    /// Names to dial some nodes at instead of their configured addresses (containers).
    via: HashMap<NodeId, String>,
    connector: Arc<Connector>,
    /// Where what peers send back on these links goes.
    router: Router,
    links: Mutex<HashMap<NodeId, Link>>,
}

impl Peers {
    pub fn new<'a>(
        nodes: impl IntoIterator<Item = &'a NodeEntry>,
        via: HashMap<NodeId, String>,
        connector: Arc<Connector>,
        router: Router,
    ) -> Peers {
        Peers {
            nodes: nodes
                .into_iter()
                .map(|node| (NodeId(node.id), node.clone()))
                .collect(),
            via,
            connector,
            router,
            links: Mutex::new(HashMap::new()),
        }
    }

    /// Queues `frame` for node `to`, dialling it first if this is the first frame for it. Must be
    /// called within the runtime (a new link spawns its task).
    pub fn send(&self, to: NodeId, frame: Bytes) -> Result<(), String> {
        let Some(node) = self.nodes.get(&to) else {
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
