//! Self-signed TLS identities and their fingerprints.

use crate::{Fingerprint, TransportError, provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::fmt;
use std::sync::Arc;

/// A TLS identity: a self-signed certificate and its private key.
///
/// Only the certificate's [`fingerprint`](Identity::fingerprint) matters to peers; its names and
/// validity dates are never checked. Loading checks that the key is one rustls can sign with and
/// that it belongs to the certificate, so a mismatched pair fails here rather than at the first
/// handshake.
#[derive(Clone)]
pub struct Identity {
    cert_pem: String,
    key_pem: String,
    certified: Arc<CertifiedKey>,
}

impl Identity {
    /// A fresh ECDSA P-256 identity whose certificate is named `name` (the name is informational).
    pub fn generate(name: &str) -> Result<Identity, TransportError> {
        let failed = |e: rcgen::Error| TransportError::Certificate(e.to_string());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(failed)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).map_err(failed)?;
        Identity::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// Reads a PEM certificate (the first one in `cert_pem`) and its PEM private key (PKCS#8,
    /// SEC1 or PKCS#1).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Identity, TransportError> {
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TransportError::Certificate(format!("certificate PEM: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TransportError::Certificate(format!("key PEM: {e}")))?;
        let signing_key = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| TransportError::Certificate(format!("private key: {e}")))?;
        let certified = CertifiedKey::new(vec![cert], signing_key);
        // Also parses the certificate, so a malformed one is refused here.
        certified.keys_match().map_err(|e| {
            TransportError::Certificate(format!("key does not belong to the certificate: {e}"))
        })?;
        Ok(Identity {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            certified: Arc::new(certified),
        })
    }

    /// The certificate and the private key as PEM text, in the form [`Identity::from_pem`] reads.
    pub fn to_pem(&self) -> (String, String) {
        (self.cert_pem.clone(), self.key_pem.clone())
    }

    /// The certificate in DER form.
    pub fn cert_der(&self) -> &[u8] {
        &self.certified.cert[0]
    }

    /// The fingerprint others pin: [`Fingerprint::of_certificate`] of the DER certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_certificate(self.cert_der())
    }

    pub(crate) fn certified(&self) -> Arc<CertifiedKey> {
        self.certified.clone()
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}
