//! The tokens that may upload (`PUT`): those written in the config (`upload_tokens`, and the
//! binary's `$SLUICE_TOKEN`) and those in `upload_token_files` (a mounted Secret, the
//! binary's `--token-file`), the files read at start and again every [`sluice_daemon::REREAD_EVERY`] and on
//! SIGHUP, so a rotated Secret needs no restart. A file that cannot be read, or holds no
//! token, keeps the set in force: one WARN naming it, and
//! `sluice_storage_upload_token_reloads_total{result="broken"}`.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use sluice_daemon::Rereads;
use tokio_util::sync::CancellationToken;

/// The tokens in force, shared by every request.
#[derive(Debug, Default)]
pub(crate) struct UploadTokens(RwLock<Vec<String>>);

impl UploadTokens {
    pub(crate) fn new(tokens: Vec<String>) -> Self {
        UploadTokens(RwLock::new(tokens))
    }

    /// Whether `given` is one of them, compared in full (no early exit on the first byte).
    pub(crate) fn admits(&self, given: &str) -> bool {
        let held = match self.0.read() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        held.iter().fold(false, |acc, t| {
            let same = t.len() == given.len()
                && t.bytes()
                    .zip(given.bytes())
                    .fold(0u8, |d, (a, b)| d | (a ^ b))
                    == 0;
            acc | same
        })
    }

    fn replace(&self, tokens: Vec<String>) -> bool {
        let mut held = match self.0.write() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        let changed = *held != tokens;
        *held = tokens;
        changed
    }
}

/// `inline` and the token of each of `files`, or why one could not be read (naming it).
pub(crate) fn read(inline: &[String], files: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut tokens = inline.to_vec();
    for path in files {
        let token = sluice_wire::token::read(path)
            .map_err(|e| format!("upload token file {}: {e}", path.display()))?;
        tokens.push(token);
    }
    Ok(tokens)
}

/// Reads the token files again every [`sluice_daemon::REREAD_EVERY`] and on SIGHUP until `stop`.
pub(crate) async fn reread(
    tokens: Arc<UploadTokens>,
    inline: Vec<String>,
    files: Vec<PathBuf>,
    stop: CancellationToken,
) {
    let mut turns = Rereads::new();
    let mut last_error: Option<String> = None;
    while let Some(hup) = turns.next(&stop).await {
        if hup {
            tracing::info!("SIGHUP: reading the upload token files again");
        }
        let (inline, files) = (inline.clone(), files.clone());
        let Ok(found) = tokio::task::spawn_blocking(move || read(&inline, &files)).await else {
            return;
        };
        match found {
            Ok(new) => {
                last_error = None;
                if tokens.replace(new) {
                    tracing::info!("upload tokens re-read: new uploads use them");
                    metrics::counter!("sluice_storage_upload_token_reloads_total", "result" => "changed")
                        .increment(1);
                }
            }
            Err(e) => {
                if last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!("{e}: keeping the upload tokens in force until it is fixed");
                    last_error = Some(e);
                }
                metrics::counter!("sluice_storage_upload_token_reloads_total", "result" => "broken")
                    .increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_compared_whole_and_replaced_whole() {
        let t = UploadTokens::new(vec!["a-token-of-sixteen".into()]);
        assert!(t.admits("a-token-of-sixteen"));
        assert!(!t.admits("a-token-of-sixtee"));
        assert!(!t.replace(vec!["a-token-of-sixteen".into()]));
        assert!(t.replace(vec!["another-token-0123".into()]));
        assert!(!t.admits("a-token-of-sixteen"));
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("t");
        std::fs::write(&file, "\n").unwrap();
        let e = read(&[], std::slice::from_ref(&file)).unwrap_err();
        assert!(e.contains(&file.display().to_string()), "{e}");
    }
}
