//! `sluice cpu` configuration: TOML with every key documented in `configs/cpu.toml`. Unknown
//! keys are errors (serde), and [`CpuConfig::validate`] names the key of any invalid value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::engine::EngineConfig;
use crate::jpeg::DecodeLimits;
use crate::source::{CacheConfig, S3Config, SourceConfig};
use crate::tenants::TenantConfig;

pub use sluice_daemon::ConfigError;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuConfig {
    /// UDP address of the QUIC endpoint.
    pub listen: SocketAddr,
    /// TCP address serving `/metrics` and `/healthz`; unset: none.
    pub metrics_listen: Option<SocketAddr>,
    /// Decode threads; 0 = one per core.
    pub threads: usize,
    /// Where a generated self-signed certificate is kept (`cert.pem`, `key.pem`).
    pub state_dir: PathBuf,
    /// TLS certificate chain and key (PEM); unset: a self-signed pair in `state_dir`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// File holding the cluster token clients must present.
    pub token_file: Option<PathBuf>,
    /// Accept clients without a token (then only on a loopback address).
    pub no_auth: bool,
    /// Teams sharing the worker, each with its own token (instead of `token_file`): a file
    /// of `[[tenant]]` tables, or the tables here (`crate::tenants`).
    pub tenants_file: Option<PathBuf>,
    pub tenant: Vec<TenantConfig>,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub source: Source,
    pub decode: Decode,
    pub same_host: SameHost,
    pub cache: Cache,
}

/// The shard cache: ranges of shards this worker read, kept on local disk for later epochs
/// (clients send a shard's units to the worker that owns it, so a pool's caches together
/// hold the dataset whatever the shuffle policy).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    /// Where to keep it (a local disk); unset: no cache.
    pub dir: Option<PathBuf>,
    /// The most bytes it holds; the shards used least recently are evicted first.
    pub size_bytes: u64,
}

/// The same-host transport: a Unix socket where training processes on this machine attach
/// shared memory that tensors are written into.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SameHost {
    /// Serve it (clients on this host pick it over QUIC by themselves).
    pub enabled: bool,
    /// Where the socket `cpu-<QUIC port>.sock` is made; clients look there.
    pub socket_dir: PathBuf,
    /// The socket file's permission bits: who may connect at all.
    pub socket_mode: u32,
    /// Users and groups that may attach besides root and the worker's own user.
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
    /// Largest shared-memory segment a client may attach, bytes.
    pub max_segment_bytes: u64,
}

impl CpuConfig {
    /// The same-host settings with the socket in `dir` (tests, benchmarks, the demo).
    pub fn same_host_in(&self, dir: &std::path::Path) -> SameHost {
        SameHost {
            enabled: true,
            socket_dir: dir.to_path_buf(),
            ..self.same_host.clone()
        }
    }
}

impl Default for SameHost {
    fn default() -> Self {
        SameHost {
            enabled: true,
            socket_dir: PathBuf::from("/run/sluice"),
            socket_mode: 0o660,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
            max_segment_bytes: 4 << 30,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Client connections at most; further ones are refused ("unavailable").
    pub max_connections: usize,
    /// Assignments being processed at once over all clients; 0 = 2 per decode thread.
    /// Jobs share them fairly by weight, sample by sample (see `sluice_cpu::fair`).
    pub max_active_units: usize,
    /// The largest weight a job may ask for (its share of a busy worker against a weight-1
    /// job's); larger asks are capped to it.
    pub max_job_weight: u32,
    /// Assignments one connection may have queued or running.
    pub max_units_per_connection: usize,
    /// Most credits (samples in flight) a client may grant one job.
    pub max_credits: u32,
    /// Largest frame header and payload accepted, bytes.
    pub max_header_bytes: u32,
    pub max_payload_bytes: u32,
    /// Bytes of decoded tensors kept for sweeps (jobs of one team reading the same samples
    /// with the same pipeline and seed, `crate::share`): a job that far behind the others is
    /// still served their decodes. 0: every job decodes alone.
    pub share_window_bytes: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Seconds between heartbeats sent to each client.
    pub heartbeat_secs: f64,
    /// Seconds without any frame from a client before its jobs are cancelled.
    pub client_silence_secs: f64,
    /// Seconds a new connection has to complete TLS and say hello.
    pub handshake_secs: f64,
    /// Seconds running assignments get to finish after SIGTERM.
    pub drain_secs: f64,
    /// Seconds a job's series (`{job="..."}`) stay on `/metrics` after the job ends.
    pub job_series_secs: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Source {
    /// Check per-sample and whole-shard checksums.
    pub verify: bool,
    pub connect_timeout_secs: f64,
    /// An HTTP read (response head or body) that makes no progress for this long fails over
    /// to the shard's next replica: a hung storage node costs this much, not its whole hang.
    pub stall_timeout_secs: f64,
    /// How long a replica that failed or stalled is read from only after the others.
    pub suspect_secs: f64,
    /// The least progress a shard read must make, in bytes a second of waiting over
    /// `slow_window_secs` of waiting; a replica that drips fails over like one that stalls
    /// (0 turns the check off).
    pub min_bytes_per_sec: u64,
    pub slow_window_secs: f64,
    /// How long a unit whose every replica is unavailable (503, connection refused: a storage
    /// node restarting) is tried again, with exponential backoff, before it fails.
    pub unavailable_secs: f64,
    /// Shard indexes (`.idx`) kept in memory.
    pub index_cache: usize,
    /// S3 endpoint for `s3://` shards (unset: AWS, or `AWS_ENDPOINT_URL`).
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub s3_allow_http: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Decode {
    /// Largest image accepted, in pixels (checked from the header, before decoding).
    pub max_pixels: u64,
    pub max_progressive_scans: u32,
    /// The most frames a clip (an `mjpeg` field) may hold.
    pub max_clip_frames: u32,
    /// Decode only the crop window.
    pub roi_decode: bool,
    /// Decode at a reduced DCT scale when the output is smaller than the crop.
    pub dct_scaling: bool,
    /// Samples parsed ahead of the decoders per assignment.
    pub readahead: usize,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7100)),
            metrics_listen: None,
            threads: 0,
            state_dir: PathBuf::from("/var/lib/sluice"),
            cert: None,
            key: None,
            token_file: None,
            no_auth: false,
            tenants_file: None,
            tenant: Vec::new(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            source: Source::default(),
            decode: Decode::default(),
            same_host: SameHost::default(),
            cache: Cache::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_active_units: 0,
            max_units_per_connection: 16,
            max_job_weight: 16,
            max_credits: 4096,
            max_header_bytes: 1 << 20,
            max_payload_bytes: 256 << 20,
            share_window_bytes: 256 << 20,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            heartbeat_secs: 1.0,
            client_silence_secs: 10.0,
            handshake_secs: 10.0,
            drain_secs: 30.0,
            job_series_secs: 300.0,
        }
    }
}

impl Default for Source {
    fn default() -> Self {
        Source {
            verify: true,
            connect_timeout_secs: 5.0,
            stall_timeout_secs: 10.0,
            suspect_secs: 60.0,
            min_bytes_per_sec: 64 << 10,
            slow_window_secs: 10.0,
            unavailable_secs: 30.0,
            index_cache: 1024,
            s3_endpoint: None,
            s3_region: None,
            s3_allow_http: false,
        }
    }
}

impl Default for Decode {
    fn default() -> Self {
        let e = EngineConfig::default();
        Decode {
            max_pixels: e.limits.max_pixels,
            max_progressive_scans: e.limits.max_progressive_scans,
            max_clip_frames: e.limits.max_clip_frames,
            roi_decode: e.roi_decode,
            dct_scaling: e.dct_scaling,
            readahead: e.readahead,
        }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

impl Timeouts {
    pub fn heartbeat(&self) -> Duration {
        secs(self.heartbeat_secs)
    }
    pub fn client_silence(&self) -> Duration {
        secs(self.client_silence_secs)
    }
    pub fn handshake(&self) -> Duration {
        secs(self.handshake_secs)
    }
    pub fn drain(&self) -> Duration {
        secs(self.drain_secs)
    }
    pub fn job_series(&self) -> Duration {
        secs(self.job_series_secs)
    }
}

impl sluice_daemon::DaemonConfig for CpuConfig {
    fn relative_to(&mut self, dir: &std::path::Path) {
        use sluice_daemon::rebase;
        rebase(dir, &mut self.state_dir);
        rebase(dir, &mut self.same_host.socket_dir);
        for p in [
            &mut self.cert,
            &mut self.key,
            &mut self.token_file,
            &mut self.tenants_file,
            &mut self.cache.dir,
        ]
        .into_iter()
        .flatten()
        {
            rebase(dir, p);
        }
        for t in &mut self.tenant {
            rebase(dir, &mut t.token_file);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.validate()
    }
}

impl CpuConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, detail: &str| {
            Err(ConfigError::Invalid {
                key,
                detail: detail.to_string(),
            })
        };
        let t = &self.timeouts;
        for (key, v) in [
            ("timeouts.heartbeat_secs", t.heartbeat_secs),
            ("timeouts.client_silence_secs", t.client_silence_secs),
            ("timeouts.handshake_secs", t.handshake_secs),
            ("timeouts.drain_secs", t.drain_secs),
            ("timeouts.job_series_secs", t.job_series_secs),
            (
                "source.connect_timeout_secs",
                self.source.connect_timeout_secs,
            ),
            ("source.stall_timeout_secs", self.source.stall_timeout_secs),
            ("source.suspect_secs", self.source.suspect_secs),
            ("source.slow_window_secs", self.source.slow_window_secs),
            ("source.unavailable_secs", self.source.unavailable_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v < 1e6) {
                return invalid(key, "must be a positive number of seconds");
            }
        }
        if t.job_series_secs <= 2.0 * t.heartbeat_secs {
            return invalid(
                "timeouts.job_series_secs",
                "must exceed twice timeouts.heartbeat_secs, or running jobs' series expire",
            );
        }
        if t.client_silence_secs <= 2.0 * t.heartbeat_secs {
            return invalid(
                "timeouts.client_silence_secs",
                "must exceed twice timeouts.heartbeat_secs, or live clients are dropped",
            );
        }
        let l = &self.limits;
        if l.max_connections == 0 {
            return invalid("limits.max_connections", "must be at least 1");
        }
        if l.max_job_weight == 0 {
            return invalid("limits.max_job_weight", "must be at least 1");
        }
        if l.max_units_per_connection == 0 {
            return invalid("limits.max_units_per_connection", "must be at least 1");
        }
        if l.max_credits == 0 {
            return invalid("limits.max_credits", "must be at least 1");
        }
        if l.max_header_bytes < 4096 {
            return invalid("limits.max_header_bytes", "must be at least 4096");
        }
        if self.decode.max_pixels == 0 {
            return invalid("decode.max_pixels", "must be at least 1");
        }
        if self.decode.max_clip_frames == 0 {
            return invalid("decode.max_clip_frames", "must be at least 1");
        }
        let sh = &self.same_host;
        if sh.enabled && sh.socket_dir.as_os_str().is_empty() {
            return invalid("same_host.socket_dir", "must name a directory");
        }
        if sh.socket_mode > 0o777 {
            return invalid(
                "same_host.socket_mode",
                "must be permission bits (0o000..0o777)",
            );
        }
        if sh.max_segment_bytes == 0 {
            return invalid("same_host.max_segment_bytes", "must be at least 1");
        }
        if self.cert.is_some() != self.key.is_some() {
            return invalid("cert", "cert and key go together");
        }
        if self.cache.dir.is_some() && self.cache.size_bytes == 0 {
            return invalid("cache.size_bytes", "must be at least 1 with cache.dir");
        }
        if self.no_auth && self.token_file.is_some() {
            return invalid("no_auth", "contradicts token_file");
        }
        if self.tenants_file.is_some() && !self.tenant.is_empty() {
            return invalid(
                "tenants_file",
                "give tenants in a file or as [[tenant]], not both",
            );
        }
        if self.has_tenants() && self.token_file.is_some() {
            return invalid(
                "token_file",
                "with tenants only their tokens are accepted: drop the cluster token",
            );
        }
        if self.has_tenants() && self.no_auth {
            return invalid("no_auth", "contradicts the tenants' tokens");
        }
        if self.no_auth && !self.listen.ip().is_loopback() {
            return invalid(
                "listen",
                "without a token (no_auth) the worker listens on loopback only",
            );
        }
        Ok(())
    }

    /// Whether teams are configured (`tenants_file` or `[[tenant]]`).
    pub fn has_tenants(&self) -> bool {
        self.tenants_file.is_some() || !self.tenant.is_empty()
    }

    /// The engine settings this config asks for.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            threads: self.threads,
            limits: DecodeLimits {
                max_pixels: self.decode.max_pixels,
                max_progressive_scans: self.decode.max_progressive_scans,
                max_clip_frames: self.decode.max_clip_frames,
            },
            dct_scaling: self.decode.dct_scaling,
            roi_decode: self.decode.roi_decode,
            readahead: self.decode.readahead.max(1),
            ..EngineConfig::default()
        }
    }

    /// The shard source settings this config asks for.
    pub fn source(&self) -> SourceConfig {
        SourceConfig {
            verify: self.source.verify,
            index_cache: self.source.index_cache,
            connect_timeout: secs(self.source.connect_timeout_secs),
            stall_timeout: secs(self.source.stall_timeout_secs),
            suspect_for: secs(self.source.suspect_secs),
            min_bytes_per_sec: self.source.min_bytes_per_sec,
            slow_window: secs(self.source.slow_window_secs),
            unavailable_for: secs(self.source.unavailable_secs),
            s3: S3Config {
                endpoint: self.source.s3_endpoint.clone(),
                region: self.source.s3_region.clone(),
                allow_http: self.source.s3_allow_http,
                ..S3Config::default()
            },
            cache: self.cache.dir.clone().map(|dir| CacheConfig {
                dir,
                capacity: self.cache.size_bytes,
            }),
            ..SourceConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_daemon::DaemonConfig;

    use super::*;

    #[test]
    fn the_commented_example_loads() {
        let example = include_str!("../../configs/cpu.toml");
        let c = CpuConfig::from_toml(example, "configs/cpu.toml").unwrap();
        let d = CpuConfig::default();
        assert_eq!(c.limits.max_credits, d.limits.max_credits);
        assert_eq!(c.decode.max_pixels, d.decode.max_pixels);
        assert_eq!(
            c.decode.max_progressive_scans,
            d.decode.max_progressive_scans
        );
        assert_eq!(
            c.timeouts.client_silence_secs,
            d.timeouts.client_silence_secs
        );
        assert_eq!(c.engine().readahead, EngineConfig::default().readahead);
    }

    #[test]
    fn errors_name_the_key() {
        let e = |text: &str| {
            CpuConfig::from_toml(text, "c.toml")
                .unwrap_err()
                .to_string()
        };
        assert!(e("colour = 1\n").contains("colour"));
        assert!(e("[limits]\nmax_credits = 0\n").contains("limits.max_credits"));
        assert!(e("[timeouts]\nheartbeat_secs = -1\n").contains("timeouts.heartbeat_secs"));
        assert!(e("[timeouts]\nclient_silence_secs = 1.5\n").contains("client_silence_secs"));
        assert!(e("no_auth = true\nlisten = \"0.0.0.0:7100\"\n").contains("listen"));
        assert!(e("cert = \"/a.pem\"\n").contains("cert"));
        assert!(e("[decode]\nmax_pixels = 0\n").contains("decode.max_pixels"));
        assert!(e("[same_host]\nsocket_mode = 0o1777\n").contains("same_host.socket_mode"));
        assert!(e("[same_host]\nsocket_dir = \"\"\n").contains("same_host.socket_dir"));
        assert!(e("[cache]\ndir = \"/var/cache/sluice\"\n").contains("cache.size_bytes"));
        let tenant = "[[tenant]]\nname = \"a\"\ntoken_file = \"a.token\"\n";
        assert!(e(&format!("token_file = \"/t\"\n{tenant}")).contains("token_file"));
        assert!(e(&format!("tenants_file = \"/t\"\n{tenant}")).contains("tenants_file"));
        assert!(e(&format!("{tenant}oops = 1\n")).contains("oops"));
    }

    #[test]
    fn every_relative_path_in_a_config_file_is_the_file_s() {
        use sluice_daemon::DaemonConfig;
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("cpu.toml");
        std::fs::write(
            &file,
            "token_file = \"secrets/token\"\ncert = \"/abs/cert.pem\"\nkey = \"tls/key.pem\"\n\
             state_dir = \"state\"\n[cache]\ndir = \"cache\"\n[same_host]\nsocket_dir = \"run\"\n",
        )
        .unwrap();
        let c = CpuConfig::read(&file).unwrap();
        let at = |p: &str| d.path().join(p);
        assert_eq!(c.token_file, Some(at("secrets/token")));
        assert_eq!(c.cert, Some(PathBuf::from("/abs/cert.pem")));
        assert_eq!(c.key, Some(at("tls/key.pem")));
        assert_eq!(c.state_dir, at("state"));
        assert_eq!(c.cache.dir, Some(at("cache")));
        assert_eq!(c.same_host.socket_dir, at("run"));
    }
}
