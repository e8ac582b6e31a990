//! Authenticated, encrypted channels between clients and storage nodes, and between nodes, with
//! the links and routing both sides build on.
//!
//! Both ends present self-signed certificates and each accepts exactly the certificates whose
//! fingerprints the cluster configuration lists: no certificate authority, no host names. A dialler
//! expects the fingerprint of the node it dials; a node accepts only configured peers and learns
//! which one it is talking to. The TLS 1.3 handshake signatures are still verified, so presenting a
//! pinned certificate requires holding its private key. Session resumption is off, so every
//! connection is verified afresh.
//!
//! Frames are a big-endian `u32` length followed by that many bytes, bounded (by default) by
//! [`FRAME_BYTES_MAX`]. The bound is checked on the length prefix before anything is allocated, so
//! a peer claiming a larger frame gets an error on the receiving side, never a buffer that size;
//! the caller should then drop the connection.
//!
//! Every frame is a [`bulwark_core::envelope::Envelope`]. Above the raw channels:
//!
//! - a [`Link`] keeps one node dialled, queues frames (bounded in bytes) while it is down, and
//!   hands what the node sends to a [`Router`];
//! - a [`Router`] routes replies to the operation registered for their op and requests to one
//!   request handler, reading the header alone;
//! - an [`Inbound`] serves accepted connections, naming each peer as a [`Peer`] by its pinned
//!   certificate and handing its envelopes to a [`Handler`] with a way to answer on the same
//!   connection.
//!
//! Note that with TLS 1.3 the client finishes its side of the handshake before the node has
//! checked the client's certificate: a client the node refuses sees [`Connector::connect`] succeed
//! and learns of the refusal only on its first read (an error or end of stream).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

mod frames;
mod identity;
mod inbound;
mod link;
mod pin;
mod queue;
mod router;

pub use bulwark_core::config::Fingerprint;
pub use bulwark_core::wire::FRAME_BYTES_MAX;
pub use identity::Identity;
pub use inbound::{
    EndReason, Ended, Handler, Inbound, InboundError, InboundLimits, InboundStats, Incoming,
    LINGER, Peer, REPLIES_QUEUED_BYTES_MAX, Replies, is_disconnect,
};
pub use link::{Link, LinkLimits, LinkStats, MALFORMED_MAX, QUEUED_BYTES_MAX, links_to};
pub use queue::SendError;
pub use router::{Delivery, OpTaken, Registration, RouteSender, Router, RouterStats};

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::server::NoServerSessionStorage;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// How long, by default, a peer may take to finish the TLS handshake (and, when dialling, the TCP
/// connect before it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server name a client sends. Nodes are identified by their pinned certificate, not by name.
const SERVER_NAME: &str = "bulwark";

/// A framed, encrypted, authenticated connection: a `Stream` of `io::Result<BytesMut>` frames and
/// a `Sink<Bytes>`; use `futures::StreamExt::split` for separate read and write halves.
pub type FramedStream = Framed<tokio_rustls::TlsStream<TcpStream>, LengthDelimitedCodec>;

/// Why a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TLS refused (wrong pinned identity, bad signature, protocol error).
    #[error("tls: {0}")]
    Tls(#[from] rustls::Error),
    /// The socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A certificate or key could not be made or read.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The peer did not finish the handshake in time.
    #[error("handshake timed out")]
    Timeout,
    /// The peer finished the handshake without a certificate.
    #[error("peer presented no certificate")]
    NoCertificate,
}

impl TransportError {
    /// Surfaces a TLS refusal that tokio-rustls wrapped in an I/O error as [`TransportError::Tls`].
    fn from_handshake(error: std::io::Error) -> TransportError {
        match error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(tls) => TransportError::Tls(tls.clone()),
            None => TransportError::Io(error),
        }
    }
}

/// The codec both ends use: a big-endian `u32` length prefix, frames of at most `max_frame_bytes`
/// (checked on decode before allocating, and on encode).
pub fn frame_codec(max_frame_bytes: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .big_endian()
        .max_frame_length(max_frame_bytes)
        .new_codec()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(
    provider: Arc<CryptoProvider>,
    certified: Arc<CertifiedKey>,
    expect: Fingerprint,
) -> Result<rustls::ClientConfig, TransportError> {
    let verifier = pin::PinnedNode {
        expected: expect,
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    // A resumed session skips certificate verification; always do the full handshake.
    config.resumption = Resumption::disabled();
    Ok(config)
}

fn server_config(
    provider: Arc<CryptoProvider>,
    certified: Arc<CertifiedKey>,
    allowed: Arc<RwLock<HashSet<Fingerprint>>>,
    unlisted: Arc<AtomicU64>,
) -> Result<rustls::ServerConfig, TransportError> {
    let verifier = pin::PinnedClients {
        allowed,
        algorithms: provider.signature_verification_algorithms,
        unlisted,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// The client side: dials nodes, each pinned to its own fingerprint.
pub struct Connector {
    provider: Arc<CryptoProvider>,
    certified: Arc<CertifiedKey>,
    max_frame_bytes: usize,
    handshake_timeout: Duration,
}

impl Connector {
    /// A connector presenting `identity`, with frames bounded by [`FRAME_BYTES_MAX`] and the
    /// [`HANDSHAKE_TIMEOUT`].
    pub fn new(identity: &Identity) -> Result<Connector, TransportError> {
        let connector = Connector {
            provider: provider(),
            certified: identity.certified(),
            max_frame_bytes: FRAME_BYTES_MAX,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        };
        // Fail now, not on the first connect, if the configuration cannot be built.
        client_config(
            connector.provider.clone(),
            connector.certified.clone(),
            Fingerprint([0; 32]),
        )?;
        Ok(connector)
    }

    /// Bounds the frames of connections made from now on to `max_frame_bytes`.
    pub fn with_max_frame_bytes(mut self, max_frame_bytes: usize) -> Connector {
        self.max_frame_bytes = max_frame_bytes;
        self
    }

    /// Limits TCP connect plus TLS handshake to `timeout`.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Connector {
        self.handshake_timeout = timeout;
        self
    }

    /// Connects to `address`, accepting only a node whose certificate has fingerprint `expect`.
    ///
    /// Fails with [`TransportError::Tls`] if the node presents another certificate or cannot
    /// prove it holds the key, and with [`TransportError::Timeout`] if connecting and the
    /// handshake together take longer than the handshake timeout.
    pub async fn connect(
        &self,
        address: impl tokio::net::ToSocketAddrs,
        expect: Fingerprint,
    ) -> Result<FramedStream, TransportError> {
        let config = client_config(self.provider.clone(), self.certified.clone(), expect)?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(SERVER_NAME)
            .map_err(|e| TransportError::Certificate(e.to_string()))?;
        let dial = async {
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            connector
                .connect(name, tcp)
                .await
                .map_err(TransportError::from_handshake)
        };
        let tls = tokio::time::timeout(self.handshake_timeout, dial)
            .await
            .map_err(|_| TransportError::Timeout)??;
        Ok(Framed::new(
            tokio_rustls::TlsStream::Client(tls),
            frame_codec(self.max_frame_bytes),
        ))
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// The node side: completes handshakes with configured peers (clients or nodes) only.
pub struct Acceptor {
    acceptor: tokio_rustls::TlsAcceptor,
    /// The certificates admitted: the configuration's at start, and members certified since.
    allowed: Arc<RwLock<HashSet<Fingerprint>>>,
    max_frame_bytes: usize,
    handshake_timeout: Duration,
    unlisted: Arc<AtomicU64>,
}

impl Acceptor {
    /// An acceptor presenting `identity` and admitting only clients whose certificate fingerprint
    /// is in `allowed_clients`, with frames bounded by [`FRAME_BYTES_MAX`] and the
    /// [`HANDSHAKE_TIMEOUT`].
    pub fn new(
        identity: &Identity,
        allowed_clients: Vec<Fingerprint>,
    ) -> Result<Acceptor, TransportError> {
        Acceptor::from_certified(identity.certified(), allowed_clients)
    }

    fn from_certified(
        certified: Arc<CertifiedKey>,
        allowed_clients: Vec<Fingerprint>,
    ) -> Result<Acceptor, TransportError> {
        let unlisted = Arc::new(AtomicU64::new(0));
        let allowed = Arc::new(RwLock::new(allowed_clients.into_iter().collect()));
        let config = server_config(
            provider(),
            certified,
            Arc::clone(&allowed),
            unlisted.clone(),
        )?;
        Ok(Acceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            allowed,
            max_frame_bytes: FRAME_BYTES_MAX,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            unlisted,
        })
    }

    /// Admits `fingerprint` from the next handshake on: a member certified after this acceptor
    /// was made. Nothing is ever removed: a member that left may still answer what its last
    /// epoch owes, and the protocols judge whether it is a member of an epoch.
    pub fn admit(&self, fingerprint: Fingerprint) {
        if let Ok(mut allowed) = self.allowed.write() {
            allowed.insert(fingerprint);
        }
    }

    /// Handshakes refused so far because the peer's certificate is not listed.
    pub fn unlisted(&self) -> u64 {
        self.unlisted.load(Ordering::Relaxed)
    }

    /// Bounds the frames of connections accepted from now on to `max_frame_bytes`.
    pub fn with_max_frame_bytes(mut self, max_frame_bytes: usize) -> Acceptor {
        self.max_frame_bytes = max_frame_bytes;
        self
    }

    /// Limits the TLS handshake to `timeout`.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Acceptor {
        self.handshake_timeout = timeout;
        self
    }

    /// Completes the TLS handshake on an accepted TCP stream and returns the peer's verified
    /// fingerprint.
    ///
    /// Fails with [`TransportError::Tls`] if the client presents no certificate, an unlisted one,
    /// or cannot prove it holds the key, and with [`TransportError::Timeout`] if it does not
    /// finish the handshake within the handshake timeout.
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> Result<(Fingerprint, FramedStream), TransportError> {
        tcp.set_nodelay(true)?;
        let tls = tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp))
            .await
            .map_err(|_| TransportError::Timeout)?
            .map_err(TransportError::from_handshake)?;
        let fingerprint = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|cert| Fingerprint::of_certificate(cert))
            .ok_or(TransportError::NoCertificate)?;
        Ok((
            fingerprint,
            Framed::new(
                tokio_rustls::TlsStream::Server(tls),
                frame_codec(self.max_frame_bytes),
            ),
        ))
    }
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod link_tests;
#[cfg(test)]
mod tests;
