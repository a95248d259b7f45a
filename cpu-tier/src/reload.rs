//! What a worker reads again while it serves, so that a rotation needs no restart: who may
//! connect (the tenants file and token files, [`crate::admission`]) and the certificate it
//! serves (its `cert` and `key` files, as cert-manager renews them). Both are read every
//! [`sluice_daemon::REREAD_EVERY`] and on SIGHUP; a set or certificate that differs from the one in force
//! replaces it for new handshakes, and one that is broken or half-written keeps the one in
//! force, said once. The certificate's expiry is watched too: warned about a week ahead, and
//! at once when it has passed, with the seconds left on `/metrics`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_daemon::Rereads;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admission::{describe, AdmissionSource, Reread, Rereader};
use crate::connection::State;
use crate::tls::{self, Identity, LiveCertificate};

/// How long before its certificate expires a worker says so.
const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// Reads the admission files again every [`sluice_daemon::REREAD_EVERY`] and on SIGHUP, and puts a set that
/// differs in force; a broken one keeps the set in force, said once.
pub(crate) async fn reread_admission(
    source: AdmissionSource,
    state: Arc<State>,
    share_scopes: Option<Arc<crate::share::Scopes>>,
    stop: CancellationToken,
) {
    let mut turns = Rereads::new();
    let mut rereader = Rereader::default();
    metrics::gauge!("sluice_cpu_admission_config_broken").set(0.0);
    while let Some(hup) = turns.next(&stop).await {
        if hup {
            info!("SIGHUP: reading the tenants and token files again");
        }
        let source = source.clone();
        let current = crate::connection::lock(&state.rules)
            .rules()
            .admission
            .clone();
        let Ok((found, back)) = tokio::task::spawn_blocking(move || {
            let found = rereader.reread(&source, &current);
            (found, rereader)
        })
        .await
        else {
            return;
        };
        rereader = back;
        match found {
            Reread::Same => {}
            Reread::Changed(new) => {
                info!(
                    admission = describe(&new),
                    "admission re-read: new handshakes use it; admitted clients keep theirs"
                );
                if let Some(scopes) = &share_scopes {
                    scopes.set(&new);
                }
                crate::connection::lock(&state.rules).set_admission(new);
                metrics::counter!("sluice_cpu_admission_reloads_total").increment(1);
                metrics::gauge!("sluice_cpu_admission_config_broken").set(0.0);
            }
            Reread::Broken { error, first } => {
                if first {
                    warn!("{error}: keeping the tenants and tokens in force until it is fixed");
                }
                metrics::counter!("sluice_cpu_admission_reload_failures_total").increment(1);
                metrics::gauge!("sluice_cpu_admission_config_broken").set(1.0);
            }
        }
    }
}

/// What the certificate watch last saw.
struct Watched {
    /// The bytes of the certificate and key files in force (a change is a renewal).
    files: Option<(Vec<u8>, Vec<u8>)>,
    not_after: Option<i64>,
    last_error: Option<String>,
    /// Said that it expires soon, or that it has expired (reset with a new certificate).
    warned_soon: bool,
    warned_expired: bool,
}

fn read_pair(cert: &PathBuf, key: &PathBuf) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    Ok((std::fs::read(cert)?, std::fs::read(key)?))
}

/// Watches the certificate served: every [`sluice_daemon::REREAD_EVERY`] (and on SIGHUP) its files, when it
/// was configured (`files`: cert and key), are read again and a changed pair is served from
/// then on once its key matches its certificate; a pair that does not load keeps the one in
/// force, said once. Whatever it is, its expiry is on `/metrics`, warned about a week ahead
/// and said at once when it has passed.
pub(crate) async fn watch_certificate(
    identity: Identity,
    files: Option<(PathBuf, PathBuf)>,
    live: LiveCertificate,
    stop: CancellationToken,
) {
    let mut turns = match files {
        Some(_) => Rereads::new(),
        None => Rereads::on_the_clock(),
    };
    let mut watched = Watched {
        files: files.as_ref().and_then(|(c, k)| read_pair(c, k).ok()),
        not_after: tls::not_after(&identity),
        last_error: None,
        warned_soon: false,
        warned_expired: false,
    };
    let shown = identity.cert_path.display().to_string();
    loop {
        check_expiry(&mut watched, &shown);
        let Some(_) = turns.next(&stop).await else {
            return;
        };
        let Some((cert, key)) = &files else {
            continue;
        };
        let (cert, key) = (cert.clone(), key.clone());
        let Ok(read) = tokio::task::spawn_blocking(move || {
            let bytes = read_pair(&cert, &key);
            (bytes, tls::load(&cert, &key))
        })
        .await
        else {
            return;
        };
        let (bytes, loaded) = read;
        let Ok(bytes) = bytes else {
            continue;
        };
        if watched.files.as_ref() == Some(&bytes) {
            continue;
        }
        let result = loaded.and_then(|identity| {
            live.replace(&identity)?;
            Ok(identity)
        });
        match result {
            Ok(new) => {
                watched.files = Some(bytes);
                watched.not_after = tls::not_after(&new);
                watched.last_error = None;
                watched.warned_soon = false;
                watched.warned_expired = false;
                info!(cert = %shown, valid_until = watched.not_after,
                    "certificate re-read: new handshakes get it");
                metrics::counter!("sluice_cpu_certificate_reloads_total").increment(1);
            }
            Err(e) => {
                let e = e.to_string();
                if watched.last_error.as_deref() != Some(e.as_str()) {
                    warn!("the certificate's files changed but do not load ({e}): serving the one in force");
                    watched.last_error = Some(e);
                }
                metrics::counter!("sluice_cpu_certificate_reload_failures_total").increment(1);
            }
        }
    }
}

/// Puts the seconds left on `/metrics` and says, once each, that the certificate expires
/// within [`EXPIRY_WARNING`] or has expired.
fn check_expiry(watched: &mut Watched, shown: &str) {
    let Some(not_after) = watched.not_after else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let left = not_after - now;
    metrics::gauge!("sluice_cpu_certificate_expiry_seconds").set(left as f64);
    if left <= 0 && !watched.warned_expired {
        watched.warned_expired = true;
        error!(cert = shown, "the certificate has expired: clients refuse this worker until it is renewed (its files are read again every 2 s)");
    } else if left > 0 && left < EXPIRY_WARNING.as_secs() as i64 && !watched.warned_soon {
        watched.warned_soon = true;
        warn!(cert = shown, hours_left = left / 3600,
            "the certificate expires within a week: renew its files (they are read again every 2 s)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(not_after: i64) -> Watched {
        Watched {
            files: None,
            not_after: Some(not_after),
            last_error: None,
            warned_soon: false,
            warned_expired: false,
        }
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn expiry_is_said_a_week_ahead_and_when_it_passes_once_each() {
        let mut far = watched(now() + 90 * 24 * 3600);
        check_expiry(&mut far, "c");
        assert!(!far.warned_soon && !far.warned_expired);
        let mut soon = watched(now() + 3600);
        check_expiry(&mut soon, "c");
        assert!(soon.warned_soon && !soon.warned_expired);
        let mut gone = watched(now() - 1);
        check_expiry(&mut gone, "c");
        assert!(gone.warned_expired && !gone.warned_soon);
    }

    #[test]
    fn a_certificate_s_expiry_is_read_from_it() {
        let d = tempfile::tempdir().unwrap();
        let id = tls::self_signed(d.path(), &["localhost".into()]).unwrap();
        let not_after = tls::not_after(&id).expect("a readable expiry");
        assert!(not_after > now(), "{not_after}");
    }
}
