//! Tenants: the teams that share a worker pool, each known by its own token. A client's token
//! decides its tenant, and its tenant decides its jobs' names (`<tenant>/<job name>`, so one
//! team can never join or reweigh another's job), the largest weight they get and the credits
//! each may hold. The rules are `sluice_wire::session`'s ([`Admission::Tenants`]); this module
//! reads them from the config's `[[tenant]]` tables or a `--tenants` file, reading each
//! tenant's token from its own file, and checks them whole before the worker starts.
//!
//! Without tenants a worker keeps the simple default: one cluster token, and job names and
//! weights as clients give them.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sluice_wire::session::{Admission, Tenant};

/// One tenant as the config gives it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Prefixes the names of its jobs and their metrics: a DNS label (1 to 63 of `a-z 0-9 -`,
    /// a letter or digit at each end).
    pub name: String,
    /// The file whose first line is its token (relative: to the file that names it).
    pub token_file: PathBuf,
    /// The largest weight one of its jobs gets; unset: the worker's `limits.max_job_weight`.
    pub max_weight: Option<u32>,
    /// The most samples one of its jobs may have in flight; unset: `limits.max_credits`.
    pub max_credits: Option<u32>,
    /// Teams with the same group may share decodes between their jobs (a sweep read by two
    /// teams); unset: its own name, so its jobs share with its own alone. A DNS label.
    pub share_group: Option<String>,
}

/// A `--tenants` file: `[[tenant]]` tables and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantConfig>,
}

/// Why the tenants cannot be used; each names the tenant and the key or file.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("the tenants file: {0}")]
    File(#[from] sluice_daemon::ConfigError),
    #[error(
        "tenant {name:?}: the name must be a DNS label: 1 to 63 of a-z, 0-9 and '-', a letter \
         or digit at each end"
    )]
    Name { name: String },
    #[error(
        "tenant {name:?}: share_group {group:?} must be a DNS label: 1 to 63 of a-z, 0-9 and \
         '-', a letter or digit at each end"
    )]
    ShareGroup { name: String, group: String },
    #[error("tenant {name:?} is named twice")]
    DuplicateName { name: String },
    #[error("tenant {name:?}: {key} must be at least 1")]
    Zero { name: String, key: &'static str },
    #[error("tenant {name:?}: token_file {}: {source}", path.display())]
    Token {
        name: String,
        path: PathBuf,
        source: sluice_wire::token::TokenError,
    },
    #[error(
        "tenants {first:?} and {second:?} have the same token: a token must say which team it is"
    )]
    SharedToken { first: String, second: String },
    #[error("tenants are configured but none is listed")]
    Empty,
}

/// Reads a `--tenants` file; relative token paths are taken from the file's directory.
pub fn read_file(path: &Path) -> Result<Vec<TenantConfig>, TenantError> {
    let file: TenantsFile = sluice_daemon::read_config(path)?;
    Ok(relative_to(file.tenant, path))
}

/// `tenants` with relative token paths taken from the directory of `file`, which named them.
pub fn relative_to(tenants: Vec<TenantConfig>, file: &Path) -> Vec<TenantConfig> {
    let base = file.parent().unwrap_or(Path::new("."));
    tenants
        .into_iter()
        .map(|t| TenantConfig {
            token_file: base.join(&t.token_file),
            ..t
        })
        .collect()
}

/// The admission rule for `tenants`, with their tokens read and every rule checked: names
/// valid and distinct, limits at least 1, each token readable, non-empty and its own.
/// `max_weight` and `max_credits` are the worker's caps, which no tenant exceeds.
pub fn admission(
    tenants: &[TenantConfig],
    max_weight: u32,
    max_credits: u32,
) -> Result<Admission, TenantError> {
    if tenants.is_empty() {
        return Err(TenantError::Empty);
    }
    let mut names = HashSet::new();
    let mut out: Vec<Arc<Tenant>> = Vec::with_capacity(tenants.len());
    for t in tenants {
        if !Tenant::valid_name(&t.name) {
            return Err(TenantError::Name {
                name: t.name.clone(),
            });
        }
        if !names.insert(t.name.as_str()) {
            return Err(TenantError::DuplicateName {
                name: t.name.clone(),
            });
        }
        let zero = |key| TenantError::Zero {
            name: t.name.clone(),
            key,
        };
        if t.max_weight == Some(0) {
            return Err(zero("max_weight"));
        }
        if t.max_credits == Some(0) {
            return Err(zero("max_credits"));
        }
        if let Some(group) = t.share_group.as_ref().filter(|g| !Tenant::valid_name(g)) {
            return Err(TenantError::ShareGroup {
                name: t.name.clone(),
                group: group.clone(),
            });
        }
        let token =
            sluice_wire::token::read(&t.token_file).map_err(|source| TenantError::Token {
                name: t.name.clone(),
                path: t.token_file.clone(),
                source,
            })?;
        warn_if_readable(&t.name, &t.token_file);
        if let Some(other) = out.iter().find(|o| o.token == token) {
            return Err(TenantError::SharedToken {
                first: other.name.clone(),
                second: t.name.clone(),
            });
        }
        out.push(Arc::new(Tenant {
            name: t.name.clone(),
            token,
            max_weight: t.max_weight.unwrap_or(max_weight).min(max_weight),
            max_credits: t.max_credits.unwrap_or(max_credits).min(max_credits),
            share_group: t.share_group.clone().unwrap_or_else(|| t.name.clone()),
        }));
    }
    Ok(Admission::Tenants(out))
}

/// A token others can read lets them act as that tenant: said once per file while it stays so
/// (the files are read again every few seconds; a file fixed and then opened up again is said
/// again).
fn warn_if_readable(name: &str, path: &Path) {
    if readable_news(path) {
        tracing::warn!(tenant = name, file = %path.display(),
            "the tenant's token file is readable by every user: make it 0600 or 0640");
    }
}

/// Whether `path` is readable by every user and was not when last asked (or never asked).
fn readable_news(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    static SAID: std::sync::Mutex<BTreeSet<PathBuf>> = std::sync::Mutex::new(BTreeSet::new());
    let readable = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0);
    let Ok(mut said) = SAID.lock() else {
        return readable;
    };
    match readable {
        true => said.insert(path.to_path_buf()),
        false => {
            said.remove(path);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn tenant(d: &Path, name: &str, token: &str) -> TenantConfig {
        let path = d.join(format!("{}.token", name.replace('/', "_")));
        std::fs::write(&path, format!("{token}\n")).unwrap();
        TenantConfig {
            name: name.into(),
            token_file: path,
            max_weight: None,
            max_credits: None,
            share_group: None,
        }
    }

    #[test]
    fn a_token_file_every_user_reads_is_said_once_while_it_stays_so() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir();
        let t = tenant(d.path(), "team-a", "a-token-0123456789");
        let mode = |m: u32| {
            std::fs::set_permissions(&t.token_file, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(0o644);
        // Read at start and again at every reload: said the first time only.
        assert!(readable_news(&t.token_file));
        assert!(!readable_news(&t.token_file));
        assert!(!readable_news(&t.token_file));
        // Fixed, then opened up again: said again.
        mode(0o640);
        assert!(!readable_news(&t.token_file));
        mode(0o644);
        assert!(readable_news(&t.token_file));
    }

    #[test]
    fn tenants_get_their_tokens_and_the_workers_caps_at_most() {
        let d = dir();
        let mut a = tenant(d.path(), "team-a", "aaa");
        a.max_weight = Some(64);
        let mut b = tenant(d.path(), "team-b", "bbb");
        b.max_weight = Some(2);
        b.max_credits = Some(128);
        let Admission::Tenants(ts) = admission(&[a, b], 16, 4096).unwrap() else {
            panic!("tenants")
        };
        assert_eq!((ts[0].token.as_str(), ts[0].max_weight), ("aaa", 16));
        assert_eq!((ts[0].max_credits, ts[1].max_weight), (4096, 2));
        assert_eq!(ts[1].max_credits, 128);
    }

    #[test]
    fn every_mistake_is_named() {
        let d = dir();
        let e = |ts: &[TenantConfig]| admission(ts, 16, 4096).unwrap_err().to_string();
        assert!(e(&[]).contains("none is listed"));
        for name in [
            "Team/A",
            ".",
            "..",
            "a.b",
            "-a",
            "a-",
            "a_b",
            "a\u{202e}b",
            "a\tb",
            "",
        ] {
            let bad = tenant(d.path(), name, "x");
            let err = e(&[bad]);
            assert!(
                err.contains(&format!("{name:?}")) && err.contains("DNS label"),
                "{err}"
            );
        }
        let (a, a2) = (tenant(d.path(), "a", "x"), tenant(d.path(), "a", "y"));
        assert!(e(&[a, a2]).contains("named twice"));
        let (a, b) = (tenant(d.path(), "a", "same"), tenant(d.path(), "b", "same"));
        assert!(e(&[a, b]).contains("same token"));
        let mut z = tenant(d.path(), "z", "z");
        z.max_weight = Some(0);
        assert!(e(&[z]).contains("max_weight"));
        let missing = TenantConfig {
            token_file: d.path().join("nope"),
            ..tenant(d.path(), "m", "m")
        };
        let err = e(&[missing]);
        assert!(
            err.contains("tenant \"m\"") && err.contains("nope"),
            "{err}"
        );
    }

    #[test]
    fn a_tenants_file_reads_tokens_beside_it() {
        let d = dir();
        std::fs::write(d.path().join("a.token"), "tok-a\n").unwrap();
        let file = d.path().join("tenants.toml");
        let text = "[[tenant]]\nname = \"team-a\"\ntoken_file = \"a.token\"\nmax_weight = 3\n";
        std::fs::write(&file, text).unwrap();
        let ts = read_file(&file).unwrap();
        assert_eq!(ts[0].token_file, d.path().join("a.token"));
        assert!(admission(&ts, 16, 4096).is_ok());
        std::fs::write(&file, "[[tenant]]\nname = \"a\"\ncolour = 1\n").unwrap();
        let err = read_file(&file).unwrap_err().to_string();
        assert!(
            err.contains("tenants.toml") && err.contains("colour"),
            "{err}"
        );
    }
}
