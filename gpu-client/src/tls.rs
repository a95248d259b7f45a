//! Whom the client trusts: the certificates in a PEM file, each either pinned (a worker's
//! self-signed `cert.pem`: accepted when the worker presents exactly it) or a CA that signed
//! the workers' certificates (verified the usual way, names included).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::ClientError;

#[derive(Debug)]
struct Trust {
    pinned: Vec<CertificateDer<'static>>,
    ca: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Trust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref())
        {
            return Ok(ServerCertVerified::assertion());
        }
        match &self.ca {
            Some(ca) => ca.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A QUIC client configuration trusting the certificates in `trust_pem` (TLS 1.3, no 0-RTT).
pub(crate) fn client_config(
    trust_pem: &Path,
    transport: quinn_proto::TransportConfig,
) -> Result<quinn_proto::ClientConfig, ClientError> {
    let bad = |detail: String| ClientError::Config {
        key: "trust_cert",
        detail: format!("{}: {detail}", trust_pem.display()),
    };
    let pinned = CertificateDer::pem_file_iter(trust_pem)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if pinned.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let provider = sluice_tls::provider().map_err(|e| ClientError::Config {
        key: "SLUICE_AES_GCM",
        detail: e.to_string(),
    })?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(pinned.iter().cloned());
    let ca = if roots.is_empty() {
        None
    } else {
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .ok()
    };
    let verifier = Arc::new(Trust {
        pinned,
        ca,
        provider: provider.clone(),
    });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| bad(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![sluice_wire::message::ALPN.to_vec()];
    tls.enable_early_data = false;
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| bad(e.to_string()))?;
    let mut config = quinn_proto::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}
