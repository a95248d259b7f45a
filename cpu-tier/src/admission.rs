//! Who may connect, read from the files that say it (the tenants file and each tenant's token
//! file, or the cluster token's file) at start and again while the worker runs: a rotated
//! Secret, a team added or removed, needs no restart. The rules themselves are
//! `sluice_wire::session`'s ([`Admission`]); this module only reads them, whole, and hands a
//! new set to the session core ([`sluice_wire::session::Worker::set_admission`]) when it
//! differs from the one in force.
//!
//! A file that is broken or half-written (unreadable, bad TOML, an empty token, two teams with
//! one token) keeps the last good set: said once with a WARN, counted in
//! `sluice_cpu_admission_reload_failures_total`, and shown as 0 in
//! `sluice_cpu_admission_config_broken` (1) until a good set is read. New handshakes use the new set
//! at once; connections already admitted keep their tenant, and their jobs run to their end (a
//! removed token ends only new handshakes).

use std::path::PathBuf;

use sluice_wire::session::Admission;

use crate::config::CpuConfig;
use crate::tenants::{self, TenantConfig, TenantError};

/// Why no admission set could be read.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error(transparent)]
    Tenants(#[from] TenantError),
    #[error("token_file {}: {source}", path.display())]
    Token {
        path: PathBuf,
        source: sluice_wire::token::TokenError,
    },
    #[error(
        "no cluster token: give --token-file FILE (or token_file in the config) or set \
         SLUICE_TOKEN, or give teams their own tokens with --tenants FILE; --no-auth runs \
         without one, on loopback only"
    )]
    NoToken,
}

/// Where the admission set comes from: what to read again.
#[derive(Clone, Debug)]
pub struct AdmissionSource {
    tenants_file: Option<PathBuf>,
    tenant_tables: Vec<TenantConfig>,
    token_file: Option<PathBuf>,
    /// `SLUICE_TOKEN`, read once (the environment does not change under a process).
    env_token: Option<String>,
    no_auth: bool,
    max_weight: u32,
    max_credits: u32,
}

impl AdmissionSource {
    /// The sources a (validated) config names; `env_token` is `SLUICE_TOKEN`.
    pub fn from_config(config: &CpuConfig, env_token: Option<String>) -> Self {
        AdmissionSource {
            tenants_file: config.tenants_file.clone(),
            tenant_tables: config.tenant.clone(),
            token_file: config.token_file.clone(),
            env_token,
            no_auth: config.no_auth,
            max_weight: config.limits.max_job_weight,
            max_credits: config.limits.max_credits,
        }
    }

    /// Whether anything here is a file, so worth reading again.
    pub fn has_files(&self) -> bool {
        self.tenants_file.is_some() || !self.tenant_tables.is_empty() || self.token_file.is_some()
    }

    /// Reads every file now and checks the set whole: its tenants (each by its token), else
    /// the cluster token from its file or `SLUICE_TOKEN`, else (`no_auth`) anyone.
    pub fn read(&self) -> Result<Admission, AdmissionError> {
        if self.tenants_file.is_some() || !self.tenant_tables.is_empty() {
            let tenants = match &self.tenants_file {
                Some(path) => tenants::read_file(path)?,
                None => self.tenant_tables.clone(),
            };
            return Ok(tenants::admission(
                &tenants,
                self.max_weight,
                self.max_credits,
            )?);
        }
        match (&self.token_file, &self.env_token) {
            (Some(path), _) => sluice_wire::token::read(path)
                .map(Admission::Token)
                .map_err(|source| AdmissionError::Token {
                    path: path.clone(),
                    source,
                }),
            (None, Some(t)) => Ok(Admission::Token(t.trim().to_string())),
            (None, None) if self.no_auth => Ok(Admission::Open),
            (None, None) => Err(AdmissionError::NoToken),
        }
    }
}

/// Whether two sets admit the same clients as the same tenants with the same limits.
pub fn same(a: &Admission, b: &Admission) -> bool {
    match (a, b) {
        (Admission::Open, Admission::Open) => true,
        (Admission::Token(x), Admission::Token(y)) => x == y,
        (Admission::Tenants(x), Admission::Tenants(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| **p == **q)
        }
        _ => false,
    }
}

/// The admission set in a few words, for logs (never a token).
pub fn describe(admission: &Admission) -> String {
    match admission {
        Admission::Open => "anyone (no_auth)".into(),
        Admission::Token(_) => "the cluster token".into(),
        Admission::Tenants(ts) => {
            let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
            format!("tenants {}", names.join(", "))
        }
    }
}

/// What a re-read found, for the shell to act on.
#[derive(Debug)]
pub enum Reread {
    /// The set in force is what the files say.
    Same,
    /// A new set to put in force.
    Changed(Admission),
    /// The files are broken: keep the set in force. `first` is whether this is news (a new
    /// error, so worth a WARN); the same error again is not.
    Broken { error: String, first: bool },
}

/// Re-reads `source` against the set in force, remembering the last error so that a file that
/// stays broken is said once.
#[derive(Debug, Default)]
pub struct Rereader {
    last_error: Option<String>,
}

impl Rereader {
    pub fn reread(&mut self, source: &AdmissionSource, current: &Admission) -> Reread {
        match source.read() {
            Ok(new) => {
                self.last_error = None;
                match same(&new, current) {
                    true => Reread::Same,
                    false => Reread::Changed(new),
                }
            }
            Err(e) => {
                let error = e.to_string();
                let first = self.last_error.as_deref() != Some(error.as_str());
                self.last_error = Some(error.clone());
                Reread::Broken { error, first }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &std::path::Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_changed_file_is_a_new_set_and_a_broken_one_is_said_once() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("a.token"), "token-a\n");
        write(&d.path().join("b.token"), "token-b\n");
        let file = d.path().join("tenants.toml");
        let table =
            |name: &str| format!("[[tenant]]\nname = \"{name}\"\ntoken_file = \"{name}.token\"\n");
        write(&file, &table("a"));
        let config = CpuConfig {
            tenants_file: Some(file.clone()),
            ..CpuConfig::default()
        };
        let source = AdmissionSource::from_config(&config, None);
        let current = source.read().unwrap();
        let mut r = Rereader::default();
        assert!(matches!(r.reread(&source, &current), Reread::Same));
        write(&file, &format!("{}\n{}", table("a"), table("b")));
        let Reread::Changed(new) = r.reread(&source, &current) else {
            panic!("a team was added")
        };
        assert_eq!(describe(&new), "tenants a, b");
        write(&d.path().join("b.token"), "token-b2\n");
        assert!(matches!(r.reread(&source, &new), Reread::Changed(_)));
        write(&file, "[[tenant]\nname = ");
        let Reread::Broken { first: true, error } = r.reread(&source, &new) else {
            panic!("a broken file")
        };
        assert!(error.contains("tenants.toml"), "{error}");
        assert!(matches!(
            r.reread(&source, &new),
            Reread::Broken { first: false, .. }
        ));
        write(&d.path().join("a.token"), "");
        write(&file, &table("a"));
        assert!(matches!(
            r.reread(&source, &new),
            Reread::Broken { first: true, .. }
        ));
    }
}
