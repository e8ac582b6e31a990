//! Certificate verifiers that accept exactly the pinned fingerprints.
//!
//! They replace chain building and name checks, nothing else: the handshake signatures are checked
//! against the presented certificate's key with the ring provider's algorithms, so presenting a
//! pinned certificate proves possession of its private key.

use crate::Fingerprint;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The client side: accepts a node's certificate only if it is the one pinned for the node being
/// dialled. The server name is ignored.
#[derive(Debug)]
pub(crate) struct PinnedNode {
    pub(crate) expected: Fingerprint,
    pub(crate) algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedNode {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of_certificate(end_entity);
        if presented == self.expected {
            Ok(ServerCertVerified::assertion())
        } else {
            tracing::debug!(expected = %self.expected, %presented, "node certificate not pinned");
            Err(rustls::Error::General(format!(
                "node presented certificate {presented}, but the configuration pins {}",
                self.expected
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The node side: requires a client certificate and accepts it only if its fingerprint is allowed.
#[derive(Debug)]
pub(crate) struct PinnedClients {
    /// Shared with the [`crate::Acceptor`], which admits members certified after it started.
    pub(crate) allowed: Arc<RwLock<HashSet<Fingerprint>>>,
    pub(crate) algorithms: WebPkiSupportedAlgorithms,
    /// Counts refusals of unlisted certificates, told apart here from other handshake failures.
    pub(crate) unlisted: Arc<AtomicU64>,
}

impl ClientCertVerifier for PinnedClients {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let presented = Fingerprint::of_certificate(end_entity);
        // A poisoned table admits no one: a writer panicked mid-update.
        let listed = self
            .allowed
            .read()
            .is_ok_and(|allowed| allowed.contains(&presented));
        if listed {
            Ok(ClientCertVerified::assertion())
        } else {
            self.unlisted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%presented, "client certificate not listed");
            Err(rustls::Error::General(format!(
                "client certificate {presented} is not listed in the configuration"
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
