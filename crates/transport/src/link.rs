//! A link to one node: a background task keeps an authenticated connection open, re-dialling
//! with backoff when it drops, writes the frames given to [`Link::send`] and routes every frame
//! it reads through a [`Router`].
//!
//! Frames sent while the node is unreachable wait in a queue bounded in bytes and go out, in
//! order, as soon as a connection is up: an operation started before the first handshake finishes
//! is not delayed until its retransmission timer fires. The link never discards a queued frame.
//! One whose write fails is written again, first, on the next connection, so it may arrive twice
//! (protocols already tolerate retransmitted requests). One the socket accepted just before the
//! connection broke may be lost: TCP gives no receipt, and only the protocol's retransmission can
//! cover that.

use crate::frames::{self, BATCH_BYTES};
use crate::queue::{QueueSender, Queued, SendError, queue};
use crate::router::Router;
use crate::{Connector, Fingerprint, FramedStream};
use bulwark_core::NodeId;
use bulwark_core::envelope::Envelope;
use bytes::Bytes;
use futures::StreamExt;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Bytes queued for one node by default: a slow node must not make us buffer every fragment.
pub const QUEUED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Malformed frames tolerated from one connection by default before it is dropped.
pub const MALFORMED_MAX: u32 = 64;

/// A link's bounds and timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkLimits {
    /// Bytes of frames the link holds while it cannot write them (see [`Link::send`]).
    pub queued_bytes_max: usize,
    /// Undecodable envelopes tolerated on one connection; past this it is dropped and re-dialled.
    pub malformed_max: u32,
    /// The first wait before re-dialling.
    pub backoff_min: Duration,
    /// The longest wait between dials; waits double up to it while dials keep failing.
    pub backoff_max: Duration,
}

impl Default for LinkLimits {
    fn default() -> LinkLimits {
        LinkLimits {
            queued_bytes_max: QUEUED_BYTES_MAX,
            malformed_max: MALFORMED_MAX,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// What a link has done since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Connections established.
    pub connects: u64,
    /// Frames written and flushed (not necessarily read by the node).
    pub frames_sent: u64,
    /// Frames read, well-formed or not.
    pub frames_received: u64,
    /// Frames [`Link::send`] refused because the queue was full.
    pub queue_full: u64,
    /// Received frames whose envelope header could not be read.
    pub malformed: u64,
    /// Frames written again after their connection failed.
    pub resent: u64,
    /// Bytes waiting now, including a small charge per frame.
    pub queued_bytes: usize,
}

/// The sending side of a link to one node. Dropping it stops the task and abandons whatever is
/// still queued.
pub struct Link {
    node: NodeId,
    address: SocketAddr,
    queue: QueueSender,
    state: Arc<State>,
    task: JoinHandle<()>,
}

struct State {
    connected: watch::Sender<bool>,
    last_error: Mutex<Option<String>>,
    connects: AtomicU64,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    queue_full: AtomicU64,
    malformed: AtomicU64,
    resent: AtomicU64,
}

impl Link {
    /// Starts a link to `node` at `address`, accepting only a certificate with `fingerprint`, with
    /// the default [`LinkLimits`]. Must be called within a tokio runtime.
    pub fn spawn(
        node: NodeId,
        address: SocketAddr,
        fingerprint: Fingerprint,
        connector: Arc<Connector>,
        router: Router,
    ) -> Link {
        Link::spawn_with(
            node,
            address,
            fingerprint,
            connector,
            router,
            LinkLimits::default(),
        )
    }

    /// Starts a link to `node` dialled at `via` (a `host:port` name resolved again at every
    /// dial, as containers reach each other by name and may change address on restart) instead
    /// of its configured `address`; the certificate must still have `fingerprint`.
    pub fn spawn_via(
        node: NodeId,
        address: SocketAddr,
        via: String,
        fingerprint: Fingerprint,
        connector: Arc<Connector>,
        router: Router,
    ) -> Link {
        Link::spawn_inner(
            node,
            address,
            Some(via),
            fingerprint,
            connector,
            router,
            LinkLimits::default(),
        )
    }

    /// Starts a link with the given limits.
    pub fn spawn_with(
        node: NodeId,
        address: SocketAddr,
        fingerprint: Fingerprint,
        connector: Arc<Connector>,
        router: Router,
        limits: LinkLimits,
    ) -> Link {
        Link::spawn_inner(node, address, None, fingerprint, connector, router, limits)
    }

    fn spawn_inner(
        node: NodeId,
        address: SocketAddr,
        via: Option<String>,
        fingerprint: Fingerprint,
        connector: Arc<Connector>,
        router: Router,
        limits: LinkLimits,
    ) -> Link {
        let (queue, frames) = queue(limits.queued_bytes_max, connector.max_frame_bytes);
        let state = Arc::new(State {
            connected: watch::Sender::new(false),
            last_error: Mutex::new(None),
            connects: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            resent: AtomicU64::new(0),
        });
        let task = LinkTask {
            node,
            address,
            via,
            fingerprint,
            connector,
            router,
            limits,
            state: state.clone(),
        };
        Link {
            node,
            address,
            queue,
            state,
            task: tokio::spawn(task.run(frames)),
        }
    }

    /// The node this link reaches.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Where the node is dialled.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Queues an encoded frame ([`bulwark_core::envelope::frame`]) for the node, connected or
    /// not; it goes out after every frame queued before it.
    ///
    /// Fails, queueing nothing, when the frame exceeds the connector's frame limit or the queue
    /// holds [`LinkLimits::queued_bytes_max`] already; the second is counted in
    /// [`LinkStats::queue_full`].
    pub fn send(&self, frame: Bytes) -> Result<(), SendError> {
        let sent = self.queue.push(frame);
        if sent == Err(SendError::Full) {
            self.state.queue_full.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("bulwark_transport_link_queue_full_total").increment(1);
            tracing::debug!(node = %self.node, "link queue full; frame refused");
        }
        sent
    }

    /// Whether a connection is up now.
    pub fn connected(&self) -> bool {
        *self.state.connected.borrow()
    }

    /// Resolves once a connection is up (at once if one is).
    pub async fn wait_connected(&self) {
        let mut connected = self.state.connected.subscribe();
        // The sender lives in `self.state`, so it outlives this wait.
        let _ = connected.wait_for(|up| *up).await;
    }

    /// Why the last connection attempt or connection failed; `None` if none has.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The counts so far.
    pub fn stats(&self) -> LinkStats {
        let s = &self.state;
        LinkStats {
            connects: s.connects.load(Ordering::Relaxed),
            frames_sent: s.frames_sent.load(Ordering::Relaxed),
            frames_received: s.frames_received.load(Ordering::Relaxed),
            queue_full: s.queue_full.load(Ordering::Relaxed),
            malformed: s.malformed.load(Ordering::Relaxed),
            resent: s.resent.load(Ordering::Relaxed),
            queued_bytes: self.queue.queued_bytes(),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("node", &self.node)
            .field("address", &self.address)
            .field("connected", &self.connected())
            .field("closed", &self.queue.is_closed())
            .finish_non_exhaustive()
    }
}

struct LinkTask {
    node: NodeId,
    address: SocketAddr,
    /// A name dialled instead of `address`, resolved at every dial.
    via: Option<String>,
    fingerprint: Fingerprint,
    connector: Arc<Connector>,
    router: Router,
    limits: LinkLimits,
    state: Arc<State>,
}

/// Why a connection ended.
enum Down {
    Failed(String),
    /// The [`Link`] is gone; nobody can send or wants replies.
    Dropped,
}

impl LinkTask {
    async fn run(self, mut frames: mpsc::UnboundedReceiver<Queued>) {
        // Frames taken from the queue whose write has not been confirmed by a flush.
        let mut unflushed = VecDeque::new();
        // Nothing is dialled before there is something to send: a command refused before it
        // sends (not a writer, too large) leaves no aborted handshake on any node.
        match frames.recv().await {
            Some(first) => unflushed.push_back(first),
            None => return,
        }
        let mut backoff = self.limits.backoff_min;
        loop {
            let dialled = match &self.via {
                Some(name) => {
                    self.connector
                        .connect(name.as_str(), self.fingerprint)
                        .await
                }
                None => self.connector.connect(self.address, self.fingerprint).await,
            };
            let framed = match dialled {
                Ok(framed) => framed,
                Err(error) => {
                    self.failed(error.to_string());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.limits.backoff_max);
                    continue;
                }
            };
            let up = Instant::now();
            self.state.connects.fetch_add(1, Ordering::Relaxed);
            self.state.connected.send_replace(true);
            tracing::debug!(node = %self.node, address = %self.address, "link up");
            // After a reconnect, what was written but not confirmed goes again; before the
            // first connection nothing has been written yet.
            if self.state.connects.load(Ordering::Relaxed) > 1 && !unflushed.is_empty() {
                self.state
                    .resent
                    .fetch_add(unflushed.len() as u64, Ordering::Relaxed);
            }
            let down = self.drive(framed, &mut frames, &mut unflushed).await;
            self.state.connected.send_replace(false);
            match down {
                Down::Dropped => return,
                Down::Failed(reason) => self.failed(reason),
            }
            // A node that accepts and then drops us at once (refusing our certificate, say) must
            // not be re-dialled every few milliseconds forever.
            if up.elapsed() >= self.limits.backoff_max {
                backoff = self.limits.backoff_min;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.limits.backoff_max);
        }
    }

    /// Reads and writes one connection until it fails.
    async fn drive(
        &self,
        framed: FramedStream,
        frames: &mut mpsc::UnboundedReceiver<Queued>,
        unflushed: &mut VecDeque<Queued>,
    ) -> Down {
        let (mut stream, mut writer) = frames::split(framed);
        let reading = async {
            let mut malformed = 0u32;
            while let Some(frame) = stream.next().await {
                let bytes = match frame {
                    Ok(bytes) => bytes,
                    Err(error) => return Down::Failed(format!("receive: {error}")),
                };
                self.state.frames_received.fetch_add(1, Ordering::Relaxed);
                match Envelope::decode(bytes.freeze()) {
                    Ok(envelope) => {
                        self.router.deliver(self.node, envelope).await;
                    }
                    Err(error) => {
                        self.state.malformed.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("bulwark_transport_malformed_total").increment(1);
                        tracing::warn!(node = %self.node, %error, "malformed frame from node");
                        malformed += 1;
                        if malformed > self.limits.malformed_max {
                            return Down::Failed(format!(
                                "closed after {malformed} malformed frames"
                            ));
                        }
                    }
                }
            }
            Down::Failed("closed by node".to_string())
        };
        let writing = async {
            loop {
                if unflushed.is_empty() {
                    let Some(first) = frames.recv().await else {
                        return Down::Dropped;
                    };
                    let mut bytes = first.frame.len();
                    unflushed.push_back(first);
                    while bytes < BATCH_BYTES {
                        let Ok(next) = frames.try_recv() else { break };
                        bytes += next.frame.len();
                        unflushed.push_back(next);
                    }
                }
                // Cancelling here (the read side failed) keeps the batch for the next connection.
                let batch: Vec<&Bytes> = unflushed.iter().map(|queued| &queued.frame).collect();
                if let Err(error) = writer.send_all(&batch).await {
                    return Down::Failed(format!("send: {error}"));
                }
                self.state
                    .frames_sent
                    .fetch_add(unflushed.len() as u64, Ordering::Relaxed);
                unflushed.clear();
            }
        };
        tokio::select! {
            down = reading => down,
            down = writing => down,
        }
    }

    fn failed(&self, reason: String) {
        tracing::debug!(node = %self.node, address = %self.address, %reason, "link down");
        *self
            .state
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }
}

/// A link to each of `nodes`, all delivering to `router`: what a client, or a node talking to its
/// peers, keeps for the nodes of a configuration.
pub fn links_to<'a>(
    nodes: impl IntoIterator<Item = &'a bulwark_core::config::NodeEntry>,
    connector: &Arc<Connector>,
    router: &Router,
) -> std::collections::HashMap<NodeId, Link> {
    nodes
        .into_iter()
        .map(|node| {
            let id = NodeId(node.id);
            let link = Link::spawn(
                id,
                node.address,
                node.fingerprint,
                connector.clone(),
                router.clone(),
            );
            (id, link)
        })
        .collect()
}
