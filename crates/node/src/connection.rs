//! One client connection: authenticate, decode frames under the size limit, forward to the actor.
//! Nothing a peer sends can panic this task; every refusal is counted against the peer.

use crate::Rejections;
use crate::actor::{ActorHandle, Job, ProtocolRequest};
use bulwark_core::config::ClusterConfig;
use bulwark_core::wire::{self, FRAME_BYTES_MAX};
use bulwark_protocol::powerstore::Access;
use bulwark_protocol::service::ClientFrame;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Replies queued for one connection; a client that stops reading loses replies, not our memory.
const REPLIES_QUEUED_MAX: usize = 1024;
/// Malformed frames tolerated from one connection before it is closed.
const MALFORMED_MAX: u32 = 64;

pub struct ConnectionContext {
    pub cluster: Arc<ClusterConfig>,
    pub acceptor: Arc<bulwark_transport::Acceptor>,
    pub actor: ActorHandle,
    pub rejections: Rejections,
}

pub async fn serve(context: ConnectionContext, tcp: TcpStream, address: SocketAddr) {
    let (fingerprint, framed) = match context.acceptor.accept(tcp).await {
        Ok(accepted) => accepted,
        Err(error) => {
            context
                .rejections
                .record(&address.to_string(), "unauthenticated");
            tracing::debug!(%address, %error, "handshake refused");
            return;
        }
    };
    let Some((client, entry)) = context.cluster.client_by_fingerprint(&fingerprint) else {
        context
            .rejections
            .record(&address.to_string(), "unknown client key");
        return;
    };
    let peer: Arc<str> = Arc::from(entry.name.as_str());
    let access = Access {
        write: entry.write,
        read: entry.read,
    };
    tracing::debug!(%address, peer = %peer, "client connected");
    let (mut sink, mut stream) = framed.split();
    let (replies, mut outgoing) = mpsc::channel::<Bytes>(REPLIES_QUEUED_MAX);
    let writer = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if sink.send(frame).await.is_err() {
                break;
            }
        }
    });
    let mut malformed = 0u32;
    while let Some(frame) = stream.next().await {
        let bytes = match frame {
            Ok(bytes) => bytes,
            Err(error) if is_disconnect(&error) => {
                tracing::debug!(peer = %peer, %error, "client disconnected");
                break;
            }
            Err(error) => {
                // An oversized or undecodable frame ends the stream: its framing can't be trusted.
                context.rejections.record(&peer, "bad frame");
                tracing::warn!(peer = %peer, %error, "closing connection after a bad frame");
                break;
            }
        };
        metrics::counter!("bulwark_node_request_bytes_total").increment(bytes.len() as u64);
        let request = |request| Job::Request {
            from: client,
            peer: peer.clone(),
            access,
            request,
            received: Instant::now(),
            reply: replies.clone(),
        };
        // A STORE's fragment stays in the frame's buffer rather than being copied out of it.
        let bytes = bytes.freeze();
        let job = match wire::decode_shared::<ClientFrame>(&bytes, FRAME_BYTES_MAX) {
            Ok(ClientFrame::PowerStore(r)) => request(ProtocolRequest::PowerStore(r)),
            Ok(ClientFrame::Abd(r)) => request(ProtocolRequest::Abd(r)),
            Ok(ClientFrame::Phalanx(r)) => request(ProtocolRequest::Phalanx(r)),
            Ok(ClientFrame::Status { nonce }) => Job::Status {
                nonce,
                reply: replies.clone(),
            },
            Err(error) => {
                context.rejections.record(&peer, "malformed frame");
                tracing::debug!(peer = %peer, %error, "malformed frame");
                malformed += 1;
                if malformed > MALFORMED_MAX {
                    break;
                }
                continue;
            }
        };
        if !context.actor.send(job).await {
            break;
        }
    }
    drop(replies);
    let _ = writer.await;
}

/// A peer going away (even without a TLS close) is not misbehaviour.
fn is_disconnect(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}
