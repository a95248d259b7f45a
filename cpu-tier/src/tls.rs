//! The worker's TLS identity: a configured certificate and key, or a self-signed pair made once
//! and kept in the state directory, so clients can pin it (`--trust-cert state_dir/cert.pem`).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;

use crate::key_files::{read_private, KeyDir};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
    #[error("generating a self-signed certificate: {0}")]
    Generate(String),
    #[error("TLS setup: {0}")]
    Setup(String),
    #[error(transparent)]
    KeyFile(#[from] crate::key_files::KeyFileError),
    #[error("--san {name:?}: {why}")]
    Name { name: String, why: String },
    #[error("the state directory holds {present} but not {missing}: refusing to make a new identity, which would replace the certificate clients pin; restore {missing}, or remove {present} to start a new identity")]
    HalfIdentity { present: String, missing: String },
}

/// A certificate chain and its key.
pub struct Identity {
    pub certs: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Where the certificate is, for logs and for clients to pin.
    pub cert_path: PathBuf,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

fn file_error(path: &Path, detail: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Reads a PEM certificate chain and key.
pub fn load(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert, e))?;
    if certs.is_empty() {
        return Err(file_error(cert, "no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    Ok(Identity {
        certs,
        key: key_der,
        cert_path: cert.to_path_buf(),
    })
}

/// The pair in `state_dir` (`cert.pem`, `key.pem`), generated on first use for `names`
/// (host names and IP addresses the certificate is valid for). One file without the other is
/// an error: making a new pair would silently replace the certificate clients pinned.
pub fn self_signed(state_dir: &Path, names: &[String]) -> Result<Identity, TlsError> {
    let cert = state_dir.join("cert.pem");
    let key = state_dir.join("key.pem");
    match (cert.exists(), key.exists()) {
        (true, true) => return load(&cert, &key),
        (false, false) => {}
        (has_cert, _) => {
            let (present, missing) = if has_cert {
                (&cert, &key)
            } else {
                (&key, &cert)
            };
            return Err(TlsError::HalfIdentity {
                present: present.display().to_string(),
                missing: missing.display().to_string(),
            });
        }
    }
    let dir = KeyDir::open(state_dir)?;
    let made = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    dir.write_new("key.pem", made.key_pair.serialize_pem().as_bytes(), 0o600)?;
    dir.write_new("cert.pem", made.cert.pem().as_bytes(), 0o644)?;
    load(&cert, &key)
}

/// The subject of every CA `sluice cert ca` makes. A certificate's issuer is matched to its
/// CA by this name and checked with the CA's key, so issuing needs only `ca.key`; a client
/// that trusts several pools' CAs at once tries each.
pub const CA_NAME: &str = "Sluice CA";

/// The files `make_ca` writes in its folder: the certificate clients trust and its key.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";

/// The CA's certificate parameters: the same for making it and for signing with it.
fn ca_params() -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, CA_NAME);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// `sluice cert ca`: a certificate authority for a pool of workers in `out` (`ca.pem`, which
/// clients trust, and `ca.key`, owner-only). Returns the certificate's path.
pub fn make_ca(out: &Path) -> Result<PathBuf, TlsError> {
    let dir = KeyDir::open(out)?;
    dir.refuse_existing(CA_CERT)?;
    dir.refuse_existing(CA_KEY)?;
    let key_pair = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let made = ca_params()
        .self_signed(&key_pair)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    dir.write_new(CA_KEY, key_pair.serialize_pem().as_bytes(), 0o600)?;
    dir.write_new(CA_CERT, made.pem().as_bytes(), 0o644)?;
    Ok(dir.path_of(CA_CERT))
}

/// `sluice cert issue`: a worker certificate for `names` (host names and IP addresses the
/// clients dial) signed by the CA in `ca_dir`, written to `out` as `cert.pem` and `key.pem`
/// (owner-only), what `sluice cpu --cert --key` serves. Returns the certificate's path.
pub fn issue(
    ca_dir: &Path,
    common_name: &str,
    names: &[String],
    out: &Path,
) -> Result<PathBuf, TlsError> {
    check_names(names)?;
    let ca_key_path = ca_dir.join(CA_KEY);
    let ca_pem = read_private(&ca_key_path)?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_pem).map_err(|e| file_error(&ca_key_path, e))?;
    let ca = ca_params()
        .self_signed(&ca_key)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let dir = KeyDir::open(out)?;
    dir.refuse_existing("cert.pem")?;
    dir.refuse_existing("key.pem")?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())
        .map_err(|e| TlsError::Generate(format!("--san {}: {e}", names.join(","))))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key_pair = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let made = params
        .signed_by(&key_pair, &ca, &ca_key)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    dir.write_new("key.pem", key_pair.serialize_pem().as_bytes(), 0o600)?;
    dir.write_new("cert.pem", made.pem().as_bytes(), 0o644)?;
    Ok(dir.path_of("cert.pem"))
}

/// Checks a certificate's names (`--san`): each an IP address, or a DNS name of RFC 1123
/// labels (1 to 63 of letters, digits and '-', not starting or ending with '-'; 253 at most
/// in all; a leading `*.` for a wildcard), whose last label is not all digits (that is an IP
/// address written wrong, such as `300.1.1.1`). Each refusal names the value.
pub fn check_names(names: &[String]) -> Result<(), TlsError> {
    let bad = |name: &str, why: &str| TlsError::Name {
        name: name.to_string(),
        why: why.to_string(),
    };
    if names.is_empty() {
        return Err(bad(
            "",
            "a worker certificate needs at least one name: the host names or IP addresses \
             clients dial",
        ));
    }
    for name in names {
        if name.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        if name.is_empty() {
            return Err(bad(
                name,
                "an empty name (two commas in a row, or one at an end?)",
            ));
        }
        if name.len() > 253 {
            return Err(bad(name, "longer than 253 characters"));
        }
        let host = name.strip_prefix("*.").unwrap_or(name);
        let labels: Vec<&str> = host.split('.').collect();
        for label in &labels {
            let ok = (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(bad(
                    name,
                    "neither an IP address nor a DNS name (labels of 1 to 63 letters, digits \
                     and '-', not at a label's ends, joined by '.')",
                ));
            }
        }
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad(
                name,
                "not an IP address, and a DNS name cannot end in a label of digits",
            ));
        }
    }
    Ok(())
}

/// What a worker says of a client whose offered protocol versions (TLS ALPN) do not include
/// its own: both versions, and the fix. `None` when they do (or the client offered none).
pub fn alpn_mismatch<'a>(offered: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let ours = sluice_wire::message::ALPN;
    let offered: Vec<String> = offered
        .into_iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    if offered.is_empty() || offered.iter().any(|p| p.as_bytes() == ours) {
        return None;
    }
    Some(format!(
        "a client offered protocol version {} (TLS ALPN), and this worker speaks {}: upgrade \
         workers and clients together",
        offered.join(", "),
        String::from_utf8_lossy(ours)
    ))
}

/// The certificate a worker serves, replaceable while it runs: each handshake takes the one
/// in force ([`LiveCertificate::replace`] swaps it; handshakes under way keep theirs).
#[derive(Clone, Debug)]
pub struct LiveCertificate(
    std::sync::Arc<std::sync::RwLock<std::sync::Arc<rustls::sign::CertifiedKey>>>,
);

impl LiveCertificate {
    /// Serves `identity` from now on, once its key is checked against its certificate (a
    /// mismatch, such as a certificate renewed before its key, keeps the one in force).
    pub fn replace(&self, identity: &Identity) -> Result<(), TlsError> {
        let key = certified_key(identity)?;
        match self.0.write() {
            Ok(mut held) => *held = std::sync::Arc::new(key),
            Err(poisoned) => *poisoned.into_inner() = std::sync::Arc::new(key),
        }
        Ok(())
    }

    fn current(&self) -> std::sync::Arc<rustls::sign::CertifiedKey> {
        match self.0.read() {
            Ok(held) => held.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// The worker's certificate, and a look at each ClientHello's protocol versions: a
/// mismatch fails the handshake (alert 120), and the log says which versions met.
#[derive(Debug)]
struct WatchAlpn(LiveCertificate);

impl rustls::server::ResolvesServerCert for WatchAlpn {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        if let Some(why) = hello.alpn().and_then(alpn_mismatch) {
            tracing::warn!("{why}");
        }
        Some(self.0.current())
    }
}

/// `identity` as rustls serves it, its key checked against its certificate.
fn certified_key(identity: &Identity) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let provider = sluice_tls::provider().map_err(|e| TlsError::Setup(e.to_string()))?;
    rustls::sign::CertifiedKey::from_der(
        identity.certs.clone(),
        identity.key.clone_key(),
        &provider,
    )
    .map_err(|e| TlsError::Setup(format!("{}: {e}", identity.cert_path.display())))
}

/// When the leaf certificate of `identity` stops being valid, in seconds since the Unix
/// epoch; `None` when it cannot be read (the handshake check is rustls's, not this).
pub fn not_after(identity: &Identity) -> Option<i64> {
    let leaf = identity.certs.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The QUIC server configuration for an identity (TLS 1.3 only, no 0-RTT), and the handle
/// that replaces its certificate while it serves.
pub fn server_config(
    identity: &Identity,
    transport: quinn::TransportConfig,
) -> Result<(quinn::ServerConfig, LiveCertificate), TlsError> {
    let provider = sluice_tls::provider().map_err(|e| TlsError::Setup(e.to_string()))?;
    let live = LiveCertificate(std::sync::Arc::new(std::sync::RwLock::new(
        std::sync::Arc::new(certified_key(identity)?),
    )));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(std::sync::Arc::new(WatchAlpn(live.clone())));
    tls.alpn_protocols = vec![sluice_wire::message::ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(std::sync::Arc::new(crypto));
    config.transport_config(std::sync::Arc::new(transport));
    Ok((config, live))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alpn_mismatch_names_both_versions() {
        let why = alpn_mismatch([b"sluice/1".as_slice()]).unwrap();
        assert!(
            why.contains("sluice/1") && why.contains("sluice/9"),
            "{why}"
        );
        assert_eq!(alpn_mismatch([sluice_wire::message::ALPN]), None);
        assert_eq!(alpn_mismatch(Vec::<&[u8]>::new()), None);
    }

    #[test]
    fn names_are_ip_addresses_or_dns_names() {
        let ok = |n: &[&str]| check_names(&n.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        ok(&[
            "127.0.0.1",
            "::1",
            "localhost",
            "cpu-0.sluice-cpu.svc",
            "*.pool.example",
        ])
        .unwrap();
        for junk in [
            "",
            "foo bar",
            "300.1.1.1",
            "-a.b",
            "a..b",
            "a_b.c",
            "é.example",
        ] {
            let e = ok(&["localhost", junk]).unwrap_err().to_string();
            assert!(e.contains(&format!("{junk:?}")), "{junk}: {e}");
        }
        assert!(ok(&[]).is_err());
        assert!(ok(&[&"a".repeat(64)]).is_err());
    }

    #[test]
    fn a_half_present_identity_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let made = self_signed(dir.path(), &["localhost".into()]).unwrap();
        let cert = std::fs::read(&made.cert_path).unwrap();
        // The same pair comes back while both files are there.
        let again = self_signed(dir.path(), &["localhost".into()]).unwrap();
        assert_eq!(again.certs, made.certs);
        for (gone, kept) in [("key.pem", "cert.pem"), ("cert.pem", "key.pem")] {
            let saved = std::fs::read(dir.path().join(gone)).unwrap();
            std::fs::remove_file(dir.path().join(gone)).unwrap();
            let e = self_signed(dir.path(), &["localhost".into()]).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(gone) && msg.contains(kept), "{msg}");
            assert!(!dir.path().join(gone).exists(), "nothing was made");
            std::fs::write(dir.path().join(gone), saved).unwrap();
        }
        assert_eq!(
            std::fs::read(&made.cert_path).unwrap(),
            cert,
            "never overwritten"
        );
    }
}
