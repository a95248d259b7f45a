//! `sluice storage` configuration: TOML with every key documented in `configs/storage.toml`.
//! Unknown keys are errors (serde), and [`StorageConfig::validate`] names the key of any
//! invalid value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Why a configuration is unusable.
pub use sluice_daemon::ConfigError;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// One folder per disk; each holds one subfolder per bucket.
    pub mountpaths: Vec<PathBuf>,
    /// Buckets served; empty serves every bucket folder.
    pub buckets: Vec<String>,
    /// A second address serving only `/metrics` and `/healthz` (for a scrape network); unset
    /// serves them on `listen` too.
    pub metrics_listen: Option<SocketAddr>,
    pub limits: Limits,
    pub timeouts: Timeouts,
    /// Bearer tokens allowed to upload (`PUT`); empty: uploads are refused. Prefer
    /// `upload_token_files` (or `--token-file`, `$SLUICE_TOKEN`): a config file is often a
    /// ConfigMap that anyone reading the deployment can read.
    pub upload_tokens: Vec<String>,
    /// Files each holding one upload token (first line), read at start and again every 2 s
    /// and on SIGHUP (a rotated Secret needs no restart; a broken file keeps the tokens in
    /// force); relative paths are the config file's. A Secret mounted as files, in Kubernetes.
    pub upload_token_files: Vec<PathBuf>,
    /// Every storage node's base URL (this one included); empty for a single node.
    pub peers: Vec<String>,
    /// This node's URL as it appears in `peers`.
    pub advertise: Option<String>,
    /// Copies of each object, placed on the top `replicas` peers by rendezvous hashing.
    pub replicas: usize,
    /// S3 read path credentials: with both set, S3 requests must be SigV4-signed with them;
    /// with neither, the S3 read path is anonymous.
    pub s3_access_key: Option<String>,
    pub s3_secret_key: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open connections at most; further ones wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Largest request head (request line + headers), bytes.
    pub max_header_bytes: usize,
    /// Concurrent disk reads (one `read_size` window each) per mountpath; 0 picks 2 for a
    /// rotational disk, 16 for SSD.
    pub streams_per_mountpath: usize,
    /// Size of each sequential read, bytes.
    pub read_size: usize,
    /// Largest upload, bytes.
    pub max_upload_bytes: u64,
    /// Most keys in one listing.
    pub max_list_keys: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Seconds a client has to send its request head (the slowloris guard).
    pub header_read_secs: f64,
    /// Seconds of no progress before a response stream is abandoned.
    pub idle_secs: f64,
    /// Seconds in-flight streams get to finish after SIGTERM.
    pub drain_secs: f64,
    /// Seconds between checks that each mountpath is still the directory opened at start and
    /// readable (a disk mounted over it, unmounted, removed, made unreadable).
    pub mountpath_check_secs: f64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7000)),
            mountpaths: Vec::new(),
            buckets: Vec::new(),
            metrics_listen: None,
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            upload_tokens: Vec::new(),
            upload_token_files: Vec::new(),
            peers: Vec::new(),
            advertise: None,
            replicas: 1,
            s3_access_key: None,
            s3_secret_key: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_header_bytes: 16 << 10,
            streams_per_mountpath: 0,
            read_size: 4 << 20,
            max_upload_bytes: 64 << 30,
            max_list_keys: 100_000,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read_secs: 10.0,
            idle_secs: 60.0,
            drain_secs: 30.0,
            mountpath_check_secs: 2.0,
        }
    }
}

impl Timeouts {
    pub fn header_read(&self) -> Duration {
        Duration::from_secs_f64(self.header_read_secs)
    }
    pub fn idle(&self) -> Duration {
        Duration::from_secs_f64(self.idle_secs)
    }
    pub fn drain(&self) -> Duration {
        Duration::from_secs_f64(self.drain_secs)
    }
    pub fn mountpath_check(&self) -> Duration {
        Duration::from_secs_f64(self.mountpath_check_secs)
    }
}

impl sluice_daemon::DaemonConfig for StorageConfig {
    fn relative_to(&mut self, dir: &std::path::Path) {
        for p in self
            .mountpaths
            .iter_mut()
            .chain(&mut self.upload_token_files)
        {
            sluice_daemon::rebase(dir, p);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl StorageConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, detail: &str| {
            Err(ConfigError::Invalid {
                key,
                detail: detail.to_string(),
            })
        };
        if self.mountpaths.is_empty() {
            return invalid("mountpaths", "at least one mountpath is needed");
        }
        for m in &self.mountpaths {
            if !m.is_dir() {
                return Err(ConfigError::Invalid {
                    key: "mountpaths",
                    detail: format!("{} is not a folder", m.display()),
                });
            }
        }
        if let Some(b) = self
            .buckets
            .iter()
            .find(|b| !crate::mountpath::valid_bucket(b))
        {
            return Err(ConfigError::Invalid {
                key: "buckets",
                detail: format!("{b:?} is not a bucket name (1-63 of a-z 0-9 . _ -)"),
            });
        }
        let l = &self.limits;
        if l.max_connections == 0 {
            return invalid("limits.max_connections", "must be at least 1");
        }
        if !(1024..=1 << 20).contains(&l.max_header_bytes) {
            return invalid("limits.max_header_bytes", "must be 1024..1048576");
        }
        if !(4096..=64 << 20).contains(&l.read_size) {
            return invalid("limits.read_size", "must be 4096..67108864");
        }
        if l.max_list_keys == 0 {
            return invalid("limits.max_list_keys", "must be at least 1");
        }
        let t = &self.timeouts;
        for (key, v) in [
            ("timeouts.header_read_secs", t.header_read_secs),
            ("timeouts.idle_secs", t.idle_secs),
            ("timeouts.drain_secs", t.drain_secs),
            ("timeouts.mountpath_check_secs", t.mountpath_check_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return invalid(key, "must be a number of seconds in (0, 86400]");
            }
        }
        if !self.peers.is_empty() {
            match &self.advertise {
                Some(a) if self.peers.contains(a) => {}
                _ => return invalid("advertise", "must be set to this node's entry in peers"),
            }
            if self
                .peers
                .iter()
                .any(|p| !(p.starts_with("http://") || p.starts_with("https://")))
            {
                return invalid("peers", "each peer is a base URL such as http://node1:7000");
            }
        }
        if self.replicas == 0 || (!self.peers.is_empty() && self.replicas > self.peers.len()) {
            return invalid("replicas", "must be between 1 and the number of peers");
        }
        if self.s3_access_key.is_some() != self.s3_secret_key.is_some() {
            return invalid(
                "s3_access_key",
                "set both s3_access_key and s3_secret_key, or neither",
            );
        }
        if self.upload_tokens.iter().any(|t| t.len() < 16) {
            return invalid("upload_tokens", "each token needs at least 16 characters");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sluice_daemon::DaemonConfig;

    use super::*;

    fn with_mountpath(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let text = text.replace("/srv/sluice/disk0", &dir.path().display().to_string());
        (dir, text)
    }

    #[test]
    fn the_commented_example_loads() {
        let example = include_str!("../../configs/storage.toml");
        let (_dir, text) = with_mountpath(example);
        let c = StorageConfig::from_toml(&text, "configs/storage.toml").unwrap();
        assert_eq!(c.limits.read_size, 4 << 20);
        assert_eq!(c.timeouts.header_read_secs, 10.0);
    }

    #[test]
    fn errors_name_the_key() {
        let (_dir, base) = with_mountpath("mountpaths = [\"/srv/sluice/disk0\"]\n");
        let e = StorageConfig::from_toml(&format!("{base}colour = 1\n"), "s.toml").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = StorageConfig::from_toml(&format!("{base}[limits]\nread_size = 1\n"), "s.toml")
            .unwrap_err();
        assert!(e.to_string().contains("limits.read_size"), "{e}");
        let e = StorageConfig::from_toml(&format!("{base}[timeouts]\nidle_secs = -1\n"), "s.toml")
            .unwrap_err();
        assert!(e.to_string().contains("timeouts.idle_secs"), "{e}");
        let e = StorageConfig::from_toml(&format!("{base}upload_tokens = [\"short\"]\n"), "s.toml")
            .unwrap_err();
        assert!(e.to_string().contains("upload_tokens"), "{e}");
        let e = StorageConfig::from_toml("mountpaths = [\"/nonexistent/disk\"]\n", "s.toml")
            .unwrap_err();
        assert!(e.to_string().contains("mountpaths"), "{e}");
    }
}
