//! The accepting side: serves one accepted connection from a configured node or client.
//!
//! The peer is known by the certificate it proved it holds, looked up in a table of pinned
//! fingerprints given at construction, so a node and a client are told apart by key, never by
//! anything they send. Each envelope read goes to a [`Handler`] together with a [`Replies`]
//! handle that queues frames back onto the same connection: a node's answers to a client, and a
//! node's answers to another node that dialled it (whose [`Link`](crate::Link) routes them by op).

use crate::frames::{self, BATCH_BYTES};
use crate::queue::{QueueSender, SendError, queue};
use crate::{Acceptor, Fingerprint, Identity, TransportError};
use bulwark_core::envelope::{Envelope, EnvelopeError};
use bulwark_core::{ClientId, NodeId};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Bytes of replies queued for one connection by default: a peer that stops reading loses
/// replies, not our memory.
pub const REPLIES_QUEUED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// How long, by default, replies may still go out after the peer stopped sending.
pub const LINGER: Duration = Duration::from_secs(5);

/// Who is on the other end of an accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// A storage node.
    Node(NodeId),
    /// A client.
    Client(ClientId),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Node(node) => node.fmt(f),
            Peer::Client(client) => client.fmt(f),
        }
    }
}

/// One envelope read from a peer.
#[derive(Debug)]
pub struct Incoming {
    /// Who sent it, by its pinned certificate.
    pub from: Peer,
    /// The frame; its body is a slice of the received buffer.
    pub envelope: Envelope,
    /// Queues frames back onto the connection it arrived on.
    pub replies: Replies,
}

/// Queues frames onto one accepted connection; cheap to clone. The connection's writer stops
/// once every clone is dropped (or the connection fails).
#[derive(Clone)]
pub struct Replies {
    queue: QueueSender,
    counters: Arc<Counters>,
}

impl Replies {
    /// Queues an encoded frame without waiting. Fails, queueing nothing, if the frame is over the
    /// frame limit, the peer has [`InboundLimits::replies_queued_bytes_max`] unread already
    /// (counted), or the connection is gone.
    pub fn send(&self, frame: Bytes) -> Result<(), SendError> {
        let sent = self.queue.push(frame);
        if sent == Err(SendError::Full) {
            self.counters
                .replies_dropped
                .fetch_add(1, Ordering::Relaxed);
            metrics::counter!("bulwark_transport_replies_dropped_total").increment(1);
        }
        sent
    }
}

impl fmt::Debug for Replies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replies")
            .field("queued_bytes", &self.queue.queued_bytes())
            .field("closed", &self.queue.is_closed())
            .finish()
    }
}

/// Takes what peers send.
pub trait Handler: Send + Sync + 'static {
    /// Takes one envelope; resolving to `false` closes the connection (the handler is shutting
    /// down). Waiting here slows this one peer, which is how a busy node pushes back.
    fn handle(&self, incoming: Incoming) -> impl Future<Output = bool> + Send;

    /// Told of each frame whose envelope header could not be read, after it is counted; for
    /// recording misbehaviour against the peer.
    fn malformed(&self, from: Peer, error: &EnvelopeError) {
        let _ = (from, error);
    }

    /// Told of a frame that broke the framing (oversized, or not decodable as a frame), just
    /// before the connection closes; for recording misbehaviour against the peer.
    fn bad_frame(&self, from: Peer, error: &std::io::Error) {
        let _ = (from, error);
    }
}

/// A channel is a handler: the connection waits for room in it and ends when it is closed.
impl Handler for mpsc::Sender<Incoming> {
    async fn handle(&self, incoming: Incoming) -> bool {
        self.send(incoming).await.is_ok()
    }
}

/// An accepted connection's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundLimits {
    /// Bytes of replies queued for one connection.
    pub replies_queued_bytes_max: usize,
    /// Undecodable envelopes tolerated on one connection before it is closed.
    pub malformed_max: u32,
    /// How long replies may still go out after the peer stopped sending (or was cut off), so a
    /// handler that never lets go of its [`Replies`] cannot hold the connection open.
    pub linger: Duration,
}

impl Default for InboundLimits {
    fn default() -> InboundLimits {
        InboundLimits {
            replies_queued_bytes_max: REPLIES_QUEUED_BYTES_MAX,
            malformed_max: crate::link::MALFORMED_MAX,
            linger: LINGER,
        }
    }
}

/// Counts over every connection an [`Inbound`] served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboundStats {
    /// Connections whose peer was identified.
    pub accepted: u64,
    /// Handshakes that failed, for any reason (including an unlisted certificate).
    pub handshakes_failed: u64,
    /// Certificates not in the table (refused during the handshake).
    pub unknown_peers: u64,
    /// Frames whose envelope header could not be read.
    pub malformed: u64,
    /// Frames over the limit or otherwise unframeable; each ends its connection.
    pub bad_frames: u64,
    /// Replies refused because their connection's queue was full.
    pub replies_dropped: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    handshakes_failed: AtomicU64,
    unknown_peers: AtomicU64,
    malformed: AtomicU64,
    bad_frames: AtomicU64,
    replies_dropped: AtomicU64,
}

/// Why a connection was not served.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The TLS handshake failed: an unlisted certificate, no certificate, a timeout, a reset.
    #[error("handshake: {0}")]
    Handshake(#[source] TransportError),
    /// The certificate was accepted but is in no table entry (only if the acceptor admits more
    /// than the table names, which [`Inbound::new`] never does).
    #[error("unknown peer certificate {0}")]
    UnknownPeer(Fingerprint),
}

/// How a served connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// The peer closed or dropped the connection.
    Closed,
    /// A frame could not be framed (over the limit, say): the stream cannot be trusted after it.
    BadFrame(String),
    /// More undecodable envelopes than [`InboundLimits::malformed_max`].
    Malformed(u32),
    /// The handler refused more.
    HandlerClosed,
    /// Writing to the peer failed.
    Send(String),
}

/// A served connection: who it was and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The peer.
    pub peer: Peer,
    /// Why it ended.
    pub reason: EndReason,
}

/// Accepts connections from the nodes and clients of a table of pinned fingerprints.
pub struct Inbound {
    acceptor: Acceptor,
    peers: RwLock<HashMap<Fingerprint, Peer>>,
    limits: InboundLimits,
    counters: Arc<Counters>,
}

impl Inbound {
    /// Presents `identity` and admits exactly the certificates in `peers`, each as the peer it
    /// maps to; the frame limit and handshake timeout are the [`Acceptor`]'s defaults.
    pub fn new(
        identity: &Identity,
        peers: HashMap<Fingerprint, Peer>,
    ) -> Result<Inbound, TransportError> {
        let acceptor = Acceptor::new(identity, peers.keys().copied().collect())?;
        Ok(Inbound {
            acceptor,
            peers: RwLock::new(peers),
            limits: InboundLimits::default(),
            counters: Arc::default(),
        })
    }

    /// Bounds frames, both ways, to `max_frame_bytes`.
    pub fn with_max_frame_bytes(mut self, max_frame_bytes: usize) -> Inbound {
        self.acceptor = self.acceptor.with_max_frame_bytes(max_frame_bytes);
        self
    }

    /// Limits the TLS handshake to `timeout`.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Inbound {
        self.acceptor = self.acceptor.with_handshake_timeout(timeout);
        self
    }

    /// Replaces the per-connection bounds.
    pub fn with_limits(mut self, limits: InboundLimits) -> Inbound {
        self.limits = limits;
        self
    }

    /// The peer a certificate fingerprint stands for, if any.
    pub fn peer(&self, fingerprint: &Fingerprint) -> Option<Peer> {
        self.peers.read().ok()?.get(fingerprint).copied()
    }

    /// Admits `fingerprint` as `peer` from the next connection on (a member certified after the
    /// node started). A fingerprint already admitted keeps the peer it stands for: a
    /// certificate never changes hands.
    pub fn admit(&self, fingerprint: Fingerprint, peer: Peer) {
        let Ok(mut peers) = self.peers.write() else {
            return;
        };
        if let std::collections::hash_map::Entry::Vacant(entry) = peers.entry(fingerprint) {
            entry.insert(peer);
            self.acceptor.admit(fingerprint);
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> InboundStats {
        let c = &self.counters;
        InboundStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            handshakes_failed: c.handshakes_failed.load(Ordering::Relaxed),
            unknown_peers: self.acceptor.unlisted() + c.unknown_peers.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            bad_frames: c.bad_frames.load(Ordering::Relaxed),
            replies_dropped: c.replies_dropped.load(Ordering::Relaxed),
        }
    }

    /// Authenticates the peer on `tcp` and serves it until the connection ends: every envelope
    /// goes to `handler`, every frame queued on its [`Replies`] goes back. Nothing the peer sends
    /// can make this panic; what it does wrong is counted.
    pub async fn serve<H: Handler>(
        &self,
        tcp: TcpStream,
        handler: H,
    ) -> Result<Ended, InboundError> {
        let (fingerprint, framed) = match self.acceptor.accept(tcp).await {
            Ok(accepted) => accepted,
            Err(error) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                metrics::counter!("bulwark_transport_handshakes_failed_total").increment(1);
                return Err(InboundError::Handshake(error));
            }
        };
        let Some(peer) = self.peer(&fingerprint) else {
            self.counters.unknown_peers.fetch_add(1, Ordering::Relaxed);
            return Err(InboundError::UnknownPeer(fingerprint));
        };
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, "peer connected");

        let (mut stream, mut writer) = frames::split(framed);
        let (sender, mut outgoing) = queue(
            self.limits.replies_queued_bytes_max,
            self.acceptor.max_frame_bytes,
        );
        let replies = Replies {
            queue: sender,
            counters: self.counters.clone(),
        };
        let reading = async {
            let mut malformed = 0u32;
            while let Some(frame) = stream.next().await {
                let bytes = match frame {
                    Ok(bytes) => bytes,
                    Err(error) if is_disconnect(&error) => break,
                    Err(error) => {
                        self.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("bulwark_transport_bad_frames_total").increment(1);
                        tracing::warn!(%peer, %error, "closing connection after a bad frame");
                        handler.bad_frame(peer, &error);
                        return EndReason::BadFrame(error.to_string());
                    }
                };
                match Envelope::decode(bytes.freeze()) {
                    Ok(envelope) => {
                        let incoming = Incoming {
                            from: peer,
                            envelope,
                            replies: replies.clone(),
                        };
                        if !handler.handle(incoming).await {
                            return EndReason::HandlerClosed;
                        }
                    }
                    Err(error) => {
                        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("bulwark_transport_malformed_total").increment(1);
                        tracing::debug!(%peer, %error, "malformed frame");
                        handler.malformed(peer, &error);
                        malformed += 1;
                        if malformed > self.limits.malformed_max {
                            return EndReason::Malformed(malformed);
                        }
                    }
                }
            }
            EndReason::Closed
        };
        let writing = async {
            while let Some(first) = outgoing.recv().await {
                // What else is waiting goes in the same write, so a burst of replies is one flush.
                let mut bytes = first.frame.len();
                let mut batch = vec![first];
                while bytes < BATCH_BYTES {
                    let Ok(next) = outgoing.try_recv() else { break };
                    bytes += next.frame.len();
                    batch.push(next);
                }
                let frames: Vec<&Bytes> = batch.iter().map(|queued| &queued.frame).collect();
                if let Err(error) = writer.send_all(&frames).await {
                    return Some(EndReason::Send(error.to_string()));
                }
            }
            None
        };
        tokio::pin!(writing);
        let (reason, writer_done) = tokio::select! {
            reason = reading => (reason, false),
            // Only a failed write ends the writer while `replies` (held by reading) lives.
            written = &mut writing => (written.unwrap_or(EndReason::Closed), true),
        };
        // The reader's handle is gone; replies already queued or still being computed by the
        // handler may go out until the handler lets go or the linger runs out.
        drop(replies);
        if !writer_done {
            let _ = tokio::time::timeout(self.limits.linger, &mut writing).await;
        }
        tracing::debug!(%peer, ?reason, "peer disconnected");
        Ok(Ended { peer, reason })
    }
}

impl fmt::Debug for Inbound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbound")
            .field("acceptor", &self.acceptor)
            .field("peers", &self.peers.read().map_or(0, |peers| peers.len()))
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A peer going away (even without a TLS close) is not misbehaviour.
pub fn is_disconnect(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}
