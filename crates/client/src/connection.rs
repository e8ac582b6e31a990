//! One background task per node keeps an authenticated connection open, re-dialling with backoff
//! when it drops, and routes each reply to the operation that is waiting for it.

use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::wire::{self, FRAME_BYTES_MAX};
use bulwark_protocol::service::{ClientFrame, NodeFrame, NodeStatus};
use bulwark_protocol::{abd, phalanx, powerstore};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Bytes queued for one node; past this, messages are dropped and retransmission resends them.
/// A slow node must not make the client buffer every fragment it is sent.
const QUEUED_BYTES_MAX: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A protocol reply from a node, whichever protocol the cluster runs.
#[derive(Debug)]
pub enum Reply {
    PowerStore(powerstore::Response),
    Abd(abd::Response),
    Phalanx(phalanx::Response),
}

impl Reply {
    /// The operation id it answers.
    fn op(&self) -> u64 {
        match self {
            Reply::PowerStore(response) => response.op.0,
            Reply::Abd(response) => response.op.0,
            Reply::Phalanx(response) => response.op.0,
        }
    }
}

/// Routes replies to waiting operations by operation id.
#[derive(Clone, Default)]
pub struct Router(Arc<Mutex<HashMap<u64, ReplySender>>>);

/// Where one operation's replies go, tagged with the node that sent each.
pub type ReplySender = mpsc::Sender<(NodeId, Reply)>;

/// Removes an operation's route when the operation ends.
pub struct Registration {
    router: Router,
    op: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.router.0.lock() {
            routes.remove(&self.op);
        }
    }
}

impl Router {
    pub fn register(&self, op: u64, sender: ReplySender) -> Registration {
        if let Ok(mut routes) = self.0.lock() {
            routes.insert(op, sender);
        }
        Registration {
            router: self.clone(),
            op,
        }
    }

    fn deliver(&self, from: NodeId, response: Reply) {
        let sender = self
            .0
            .lock()
            .ok()
            .and_then(|routes| routes.get(&response.op()).cloned());
        // Replies for finished operations are simply dropped.
        if let Some(sender) = sender {
            let _ = sender.try_send((from, response));
        }
    }
}

type StatusWaiters = Arc<Mutex<HashMap<u64, oneshot::Sender<NodeStatus>>>>;

/// The client's side of one node.
pub struct NodeLink {
    outgoing: mpsc::UnboundedSender<(Bytes, tokio::sync::OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    connected: Arc<AtomicBool>,
    last_error: Arc<Mutex<String>>,
    status_waiters: StatusWaiters,
    next_nonce: AtomicU64,
}

impl NodeLink {
    pub fn spawn(
        node: NodeId,
        address: SocketAddr,
        fingerprint: Fingerprint,
        connector: Arc<bulwark_transport::Connector>,
        router: Router,
    ) -> NodeLink {
        let (outgoing, queue) = mpsc::unbounded_channel();
        let link = NodeLink {
            outgoing,
            budget: Arc::new(Semaphore::new(QUEUED_BYTES_MAX)),
            connected: Arc::new(AtomicBool::new(false)),
            last_error: Arc::new(Mutex::new("not connected yet".to_string())),
            status_waiters: StatusWaiters::default(),
            next_nonce: AtomicU64::new(1),
        };
        let task = LinkTask {
            node,
            address,
            fingerprint,
            connector,
            router,
            connected: link.connected.clone(),
            last_error: link.last_error.clone(),
            status_waiters: link.status_waiters.clone(),
        };
        tokio::spawn(task.run(queue));
        link
    }

    /// Queues a frame if the node is connected and the queue has room; otherwise drops it.
    pub fn send(&self, frame: &ClientFrame) {
        if !self.connected.load(Ordering::Acquire) {
            return;
        }
        let bytes = Bytes::from(wire::encode(frame));
        let Ok(permit) = self
            .budget
            .clone()
            .try_acquire_many_owned(bytes.len().min(QUEUED_BYTES_MAX) as u32)
        else {
            tracing::debug!("send queue full; relying on retransmission");
            return;
        };
        let _ = self.outgoing.send((bytes, permit));
    }

    /// Asks the node for its status.
    pub async fn status(&self, wait: Duration) -> Result<NodeStatus, String> {
        let deadline = tokio::time::Instant::now() + wait;
        while !self.connected.load(Ordering::Acquire) {
            if tokio::time::Instant::now() >= deadline {
                return Err(self
                    .last_error
                    .lock()
                    .map(|e| e.clone())
                    .unwrap_or_default());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let nonce = self.next_nonce.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        if let Ok(mut waiters) = self.status_waiters.lock() {
            waiters.insert(nonce, sender);
        }
        self.send(&ClientFrame::Status { nonce });
        let result = tokio::time::timeout_at(deadline, receiver).await;
        if let Ok(mut waiters) = self.status_waiters.lock() {
            waiters.remove(&nonce);
        }
        match result {
            Ok(Ok(status)) => Ok(status),
            _ => Err("no status reply".to_string()),
        }
    }
}

struct LinkTask {
    node: NodeId,
    address: SocketAddr,
    fingerprint: Fingerprint,
    connector: Arc<bulwark_transport::Connector>,
    router: Router,
    connected: Arc<AtomicBool>,
    last_error: Arc<Mutex<String>>,
    status_waiters: StatusWaiters,
}

impl LinkTask {
    async fn run(
        self,
        mut queue: mpsc::UnboundedReceiver<(Bytes, tokio::sync::OwnedSemaphorePermit)>,
    ) {
        let mut backoff = BACKOFF_MIN;
        loop {
            // The client was dropped: stop re-dialling.
            if queue.is_closed() {
                return;
            }
            let connected = tokio::time::timeout(
                CONNECT_TIMEOUT,
                self.connector.connect(self.address, self.fingerprint),
            )
            .await;
            let framed = match connected {
                Ok(Ok(framed)) => framed,
                Ok(Err(error)) => {
                    self.failed(format!("{error}"));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                Err(_) => {
                    self.failed("connect timed out".to_string());
                    continue;
                }
            };
            backoff = BACKOFF_MIN;
            // Anything queued while disconnected is stale; retransmission sends what still matters.
            while queue.try_recv().is_ok() {}
            self.connected.store(true, Ordering::Release);
            tracing::debug!(node = %self.node, address = %self.address, "connected");
            let (mut sink, mut stream) = framed.split();
            let reading = async {
                while let Some(frame) = stream.next().await {
                    let bytes = match frame {
                        Ok(bytes) => bytes,
                        Err(error) => return format!("receive: {error}"),
                    };
                    // A FILTER reply's fragment stays in the frame's buffer, not copied out of it.
                    let bytes = bytes.freeze();
                    match wire::decode_shared::<NodeFrame>(&bytes, FRAME_BYTES_MAX) {
                        Ok(NodeFrame::PowerStore(response)) => {
                            self.router.deliver(self.node, Reply::PowerStore(response))
                        }
                        Ok(NodeFrame::Abd(response)) => {
                            self.router.deliver(self.node, Reply::Abd(response))
                        }
                        Ok(NodeFrame::Phalanx(response)) => {
                            self.router.deliver(self.node, Reply::Phalanx(response))
                        }
                        Ok(NodeFrame::Status { nonce, status }) => {
                            let waiter = self
                                .status_waiters
                                .lock()
                                .ok()
                                .and_then(|mut w| w.remove(&nonce));
                            if let Some(waiter) = waiter {
                                let _ = waiter.send(status);
                            }
                        }
                        Err(error) => {
                            tracing::warn!(node = %self.node, %error, "malformed frame from node")
                        }
                    }
                }
                "closed by node".to_string()
            };
            let writing = async {
                while let Some((bytes, permit)) = queue.recv().await {
                    let sent = sink.send(bytes).await;
                    drop(permit);
                    if let Err(error) = sent {
                        return format!("send: {error}");
                    }
                }
                "client dropped".to_string()
            };
            let reason = tokio::select! {
                reason = reading => reason,
                reason = writing => reason,
            };
            self.connected.store(false, Ordering::Release);
            if reason == "client dropped" {
                return;
            }
            self.failed(reason);
            tokio::time::sleep(BACKOFF_MIN).await;
        }
    }

    fn failed(&self, reason: String) {
        tracing::debug!(node = %self.node, address = %self.address, %reason, "link down");
        if let Ok(mut last) = self.last_error.lock() {
            *last = reason;
        }
    }
}
