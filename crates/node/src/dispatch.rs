//! Routes every envelope a peer sends to the shard that hosts its replica, reading only the
//! header: a frame for another epoch, a group this node does not serve or an unknown service is
//! refused with what the sender needs to catch up, before any replica decodes a byte of it.
//! Clients may send requests; nodes may send replica messages; each is counted against its peer
//! when refused.

use crate::Rejections;
use crate::cs;
use crate::host;
use crate::shard::{Job, ReplicaKey, ShardHandle, ShardStatus};
use bulwark_core::config::ClusterConfig;
use bulwark_core::envelope::{self, EnvelopeError, Header, Kind, Refusal};
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_core::{Epoch, NodeId, ServiceId};
use bulwark_protocol::machine::{Access, ReplicaStats};
use bulwark_protocol::service::{Certificate, NodeMessage, NodeStatus, SystemReply, SystemRequest};
use bulwark_transport::{Handler, Incoming, Peer, Replies};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::oneshot;

/// How long a client's request for an eviction agreement waits for the configuration manager.
const EVICT_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);

/// What every connection of the node shares.
pub struct Dispatcher {
    pub node: u32,
    pub epoch: Epoch,
    pub cluster: Arc<ClusterConfig>,
    /// Which shard hosts each replica.
    pub routes: HashMap<ReplicaKey, usize>,
    pub shards: Vec<ShardHandle>,
    pub rejections: Rejections,
    pub started: Instant,
    /// The configuration service, when the cluster has one: the chain, and the shard that hosts
    /// this node's CS replica.
    pub cs: Option<(Arc<cs::Shared>, ShardHandle)>,
    /// The node's trusted log, if it has one.
    pub trusted: Option<crate::trusted::TrustedLog>,
    /// The node's store, for listings read straight from the disk.
    pub store: Arc<bulwark_storage::Store>,
}

impl Dispatcher {
    /// How rejections name a peer: a client by its configured name, a node by its id.
    pub fn peer_name(&self, peer: Peer) -> String {
        match peer {
            Peer::Client(client) => self
                .cluster
                .clients
                .iter()
                .find(|c| c.id == client.0)
                .map_or_else(|| client.to_string(), |c| c.name.clone()),
            Peer::Node(node) => node.to_string(),
        }
    }

    /// Hands a storage replica's message from `node` (this node itself included, through
    /// [`crate::peers::Peers`]' loopback) to the replica its header names; false when the shard
    /// is gone.
    pub async fn replica_message(&self, node: NodeId, envelope: envelope::Envelope) -> bool {
        match self.route(&envelope.header) {
            Ok((shard, replica)) => {
                shard
                    .send(Job::Message {
                        replica,
                        from: node,
                        envelope,
                    })
                    .await
            }
            Err(refusal) => {
                self.rejections
                    .record(&node.to_string(), &format!("refused: {refusal}"));
                true
            }
        }
    }

    fn refuse(&self, peer: &str, header: &Header, refusal: Refusal, replies: &Replies) {
        self.rejections.record(peer, &format!("refused: {refusal}"));
        let _ = replies.send(envelope::frame(&header.refused(), &refusal));
    }

    async fn status(&self) -> NodeStatus {
        let mut status = NodeStatus {
            node: self.node,
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_seconds: self.started.elapsed().as_secs(),
            epoch: self.epoch.0,
            config_epoch: self.cs.as_ref().map_or(0, |(shared, _)| shared.epoch().0),
            cs: None,
            server: ReplicaStats::default(),
            replicas: Vec::new(),
            requests: 0,
            rejected: Vec::new(),
            trusted_log: match &self.trusted {
                Some(log) => Some(Box::new(log.status().await)),
                None => None,
            },
            causal: Vec::new(),
        };
        let cs_shard = self.cs.as_ref().map(|(_, shard)| shard);
        for shard in self.shards.iter().chain(cs_shard) {
            let (answer, answered) = oneshot::channel();
            if !shard.send(Job::Status(answer)).await {
                continue;
            }
            if let Ok(ShardStatus {
                requests,
                replicas,
                cs,
                causal,
            }) = answered.await
            {
                status.requests += requests;
                status.causal.extend(causal);
                if cs.is_some() {
                    status.cs = cs;
                }
                for replica in &replicas {
                    status.server.add(&replica.stats);
                }
                status.replicas.extend(replicas);
            }
        }
        status
            .replicas
            .sort_by(|a, b| (&a.service, a.group).cmp(&(&b.service, b.group)));
        status.causal.sort_by_key(|volume| volume.volume);
        status.rejected = self.rejections.snapshot();
        status
    }

    /// The configuration service's shard for a frame of epoch `header.epoch`, or the refusal:
    /// a frame of another epoch than the node's latest names the epoch the node is at (a sender
    /// behind fetches the configuration; one ahead makes the node pull it), and a node that is
    /// not a CS replica this epoch says so.
    fn route_cs(&self, header: &Header, from: Option<NodeId>) -> Result<&ShardHandle, Refusal> {
        let Some((shared, shard)) = &self.cs else {
            return Err(Refusal::UnknownService {
                service: header.service,
            });
        };
        let current = shared.epoch();
        if header.epoch != current {
            if header.epoch > current
                && let Some(peer) = from
            {
                let _ = shared.events.send(cs::Event::Behind { peer });
            }
            return Err(Refusal::WrongEpoch { current });
        }
        if shared.hosted.load(Ordering::Acquire) != current.0 {
            return Err(Refusal::NotAllowed(format!(
                "node {} is not a configuration-service replica of epoch {}",
                self.node, current.0
            )));
        }
        Ok(shard)
    }

    /// The replica a frame is for and the shard hosting it, or the refusal to send instead.
    fn route(&self, header: &Header) -> Result<(&ShardHandle, ReplicaKey), Refusal> {
        // A replica that follows the configuration serves every group of every epoch the node
        // is in, and judges a frame's epoch and group itself.
        let node_wide = (header.service, host::NODE_WIDE);
        if let Some(&shard) = self.routes.get(&node_wide) {
            let shard = self.shards.get(shard).ok_or(Refusal::UnknownService {
                service: header.service,
            })?;
            return Ok((shard, node_wide));
        }
        if header.epoch != self.epoch {
            return Err(Refusal::WrongEpoch {
                current: self.epoch,
            });
        }
        let replica = (header.service, header.group);
        match self.routes.get(&replica) {
            Some(&shard) => self.shards.get(shard).map(|shard| (shard, replica)).ok_or(
                Refusal::UnknownService {
                    service: header.service,
                },
            ),
            None if self
                .routes
                .keys()
                .any(|(service, _)| *service == header.service) =>
            {
                Err(Refusal::WrongGroup {
                    service: header.service,
                    group: header.group,
                })
            }
            None => Err(Refusal::UnknownService {
                service: header.service,
            }),
        }
    }
}

/// One connection's view of the dispatcher: the handler transport drives per frame.
#[derive(Clone)]
pub struct Connection(pub Arc<Dispatcher>);

impl Handler for Connection {
    async fn handle(&self, incoming: Incoming) -> bool {
        let dispatcher = &self.0;
        let Incoming {
            from,
            envelope,
            replies,
        } = incoming;
        let header = envelope.header;
        metrics::counter!("bulwark_node_request_bytes_total")
            .increment((envelope.body.len() + envelope::HEADER_BYTES) as u64);
        match (from, header.kind) {
            (Peer::Client(client), Kind::Request) => {
                let Some(entry) = dispatcher.cluster.clients.iter().find(|c| c.id == client.0)
                else {
                    return false;
                };
                let peer: Arc<str> = Arc::from(entry.name.as_str());
                if header.service == ServiceId::SYSTEM {
                    match envelope.body::<SystemRequest>(FRAME_BYTES_MAX) {
                        Ok(SystemRequest::Status) => {
                            let status = dispatcher.status().await;
                            let reply = SystemReply::Status(status);
                            let _ = replies.send(envelope::frame(&header.reply(), &reply));
                        }
                        Ok(SystemRequest::Configuration { after }) => {
                            let certs = dispatcher
                                .cs
                                .as_ref()
                                .and_then(|(shared, _)| {
                                    shared.chain.read().ok().map(|c| c.after(after))
                                })
                                .unwrap_or_default();
                            let reply = SystemReply::Configuration(certs);
                            let _ = replies.send(envelope::frame(&header.reply(), &reply));
                        }
                        Ok(SystemRequest::Fresh { nonce }) => {
                            let fresh = dispatcher
                                .cs
                                .as_ref()
                                .and_then(|(shared, _)| shared.fresh(nonce));
                            let reply = SystemReply::Fresh(fresh);
                            let _ = replies.send(envelope::frame(&header.reply(), &reply));
                        }
                        Ok(SystemRequest::Evict { epoch, node }) => {
                            let agreement = match &dispatcher.cs {
                                Some((shared, _)) => {
                                    let (answer, answered) = oneshot::channel();
                                    let asked = cs::Event::EvictAsked {
                                        epoch,
                                        node,
                                        answer,
                                    };
                                    if shared.events.send(asked).is_err() {
                                        Err("the node is stopping".to_string())
                                    } else {
                                        tokio::time::timeout(EVICT_ANSWER, answered)
                                            .await
                                            .map_err(|_| "no answer in time".to_string())
                                            .and_then(|answer| {
                                                answer.unwrap_or_else(|_| {
                                                    Err("the node is stopping".into())
                                                })
                                            })
                                    }
                                }
                                None => Err("this node runs no configuration service".into()),
                            };
                            let reply = SystemReply::Evict(agreement);
                            let _ = replies.send(envelope::frame(&header.reply(), &reply));
                        }
                        Ok(SystemRequest::ContentObjects { after, limit }) => {
                            let store = dispatcher.store.clone();
                            let listed = tokio::task::spawn_blocking(move || {
                                crate::host::content_objects(&store, after, limit as usize)
                            })
                            .await;
                            let (ids, more) = match listed {
                                Ok(Ok(listed)) => listed,
                                Ok(Err(error)) => {
                                    tracing::error!(%error, "listing content objects failed");
                                    (Vec::new(), true)
                                }
                                Err(_) => (Vec::new(), true),
                            };
                            let reply = SystemReply::ContentObjects { ids, more };
                            let _ = replies.send(envelope::frame(&header.reply(), &reply));
                        }
                        Err(error) => {
                            dispatcher.rejections.record(&peer, "malformed frame");
                            tracing::debug!(peer = %peer, %error, "malformed system request");
                        }
                    }
                    return true;
                }
                let routed = if header.service == ServiceId::CONFIG {
                    dispatcher
                        .route_cs(&header, None)
                        .map(|shard| (shard, (header.service, header.group)))
                } else {
                    dispatcher.route(&header)
                };
                let (shard, replica) = match routed {
                    Ok(routed) => routed,
                    Err(refusal) => {
                        dispatcher.refuse(&peer, &header, refusal, &replies);
                        return true;
                    }
                };
                let access = Access {
                    write: entry.write,
                    read: entry.read,
                };
                shard
                    .send(Job::Request {
                        replica,
                        client,
                        peer,
                        access,
                        envelope,
                        received: Instant::now(),
                        replies,
                    })
                    .await
            }
            (Peer::Node(node), Kind::Message) if header.service == ServiceId::SYSTEM => {
                match (
                    envelope.body::<NodeMessage>(FRAME_BYTES_MAX),
                    &dispatcher.cs,
                ) {
                    (Ok(message), Some((shared, _))) => {
                        let event = match message {
                            NodeMessage::Certified(certs) => cs::Event::Certified {
                                certs: certs.into_iter().map(Certificate::Full).collect(),
                                from: Some(node),
                                hop: None,
                            },
                            NodeMessage::Multicast { certs, hop } => cs::Event::Certified {
                                certs,
                                from: Some(node),
                                hop: Some(hop),
                            },
                            NodeMessage::Pull { after } => cs::Event::Pull { from: node, after },
                            message => cs::Event::Peer {
                                from: node,
                                message,
                            },
                        };
                        let _ = shared.events.send(event);
                    }
                    (Ok(_), None) => {}
                    (Err(error), _) => {
                        dispatcher
                            .rejections
                            .record(&node.to_string(), "malformed frame");
                        tracing::debug!(%node, %error, "malformed node message");
                    }
                }
                true
            }
            (Peer::Node(node), Kind::Message) if header.service == ServiceId::CONFIG => {
                match dispatcher.route_cs(&header, Some(node)) {
                    Ok(shard) => {
                        shard
                            .send(Job::Message {
                                replica: (header.service, header.group),
                                from: node,
                                envelope,
                            })
                            .await
                    }
                    // A peer's CS instance of another epoch: behind, it learns from the pulls
                    // and pushes of certificates; ahead, this node pulls (route_cs asked).
                    Err(_) => true,
                }
            }
            (Peer::Node(node), Kind::Message) => dispatcher.replica_message(node, envelope).await,
            (peer, kind) => {
                let name = peer.to_string();
                let refusal = Refusal::NotAllowed(format!("a {kind:?} frame from {name}"));
                dispatcher.refuse(&name, &header, refusal, &replies);
                true
            }
        }
    }

    fn malformed(&self, from: Peer, error: &EnvelopeError) {
        let peer = self.0.peer_name(from);
        self.0.rejections.record(&peer, "malformed frame");
        tracing::debug!(%peer, %error, "malformed frame");
    }

    fn bad_frame(&self, from: Peer, _error: &std::io::Error) {
        // An oversized or undecodable frame ends the stream: its framing can't be trusted.
        self.0
            .rejections
            .record(&self.0.peer_name(from), "bad frame");
    }
}
