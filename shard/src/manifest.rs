//! The dataset manifest: one JSON document listing a dataset's shards with their size, sample
//! count and checksum, made by `sluice index` or `sluice shard`. Everything that plans or
//! fetches (the planner, the CPU tier, the client) starts from it.
//!
//! ```json
//! {"format": "sluice-manifest", "version": 1,
//!  "shards": [{"url": "train-000000.tar", "size": 104857600, "samples": 1000,
//!              "checksum": "xxh3:9f0c3a1b2c3d4e5f"}]}
//! ```
//!
//! A relative `url` is resolved against the manifest's own location; each shard's sample
//! offsets live in the sidecar `<url>.idx` (see [`crate::index`]).

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Result, ShardError};

/// Identifies the document type, so a manifest is not mistaken for other JSON.
pub const MANIFEST_FORMAT: &str = "sluice-manifest";
/// The manifest version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// Default bound on the size of a manifest file (about 2.5 million shards).
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// An xxh3-64 checksum, written `xxh3:` + 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Checksum(pub u64);

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xxh3:{:016x}", self.0)
    }
}

impl FromStr for Checksum {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let hex = s
            .strip_prefix("xxh3:")
            .ok_or_else(|| format!("checksum {s:?} does not start with \"xxh3:\""))?;
        if hex.len() != 16 {
            return Err(format!("checksum {s:?} needs 16 hex digits"));
        }
        u64::from_str_radix(hex, 16)
            .map(Checksum)
            .map_err(|_| format!("checksum {s:?} is not hex"))
    }
}

impl Serialize for Checksum {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Checksum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How a shard file is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    /// The whole tar is gzip-compressed (`.tgz`); sample ranges cannot be range-read.
    Gzip,
}

impl Compression {
    fn is_none(&self) -> bool {
        *self == Compression::None
    }
}

/// One shard of a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardInfo {
    /// Path or URL; relative ones are resolved against the manifest's location.
    pub url: String,
    /// Size of the shard file in bytes.
    pub size: u64,
    /// Number of samples.
    pub samples: u64,
    /// Checksum of the shard file's bytes.
    pub checksum: Checksum,
    #[serde(default, skip_serializing_if = "Compression::is_none")]
    pub compression: Compression,
    /// Other URLs serving the same bytes (a storage cluster's other owners), tried in order
    /// when `url` fails, at open or part way through a unit. `sluice put --manifest` writes
    /// them; resolved like `url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
}

impl ShardInfo {
    /// `url`, then the replicas: every place the shard can be read from, in order.
    pub fn urls(&self) -> Vec<String> {
        std::iter::once(self.url.clone())
            .chain(self.replicas.iter().cloned())
            .collect()
    }

    /// The last component of the URL, for messages and metrics.
    pub fn name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or(&self.url)
    }
}

/// A dataset: its shards, in a fixed order that shard numbers refer to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub shards: Vec<ShardInfo>,
}

impl Manifest {
    pub fn new(shards: Vec<ShardInfo>) -> Self {
        Manifest {
            format: MANIFEST_FORMAT.to_string(),
            version: MANIFEST_VERSION,
            shards,
        }
    }

    /// Total samples across shards.
    pub fn total_samples(&self) -> u64 {
        self.shards.iter().map(|s| s.samples).sum()
    }

    /// Total bytes across shards.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.size).sum()
    }

    /// Parses and validates a manifest; `origin` names it in errors.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| ShardError::Manifest {
            path: origin.to_string(),
            detail: e.to_string(),
        })?;
        m.validate(origin)?;
        Ok(m)
    }

    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks what the types cannot: the format tag and version, non-empty unique URLs, and
    /// sample counts that add up without overflow.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let err = |detail: String| {
            Err(ShardError::Manifest {
                path: origin.to_string(),
                detail,
            })
        };
        if self.format != MANIFEST_FORMAT {
            return err(format!(
                "\"format\" is {:?}, expected {MANIFEST_FORMAT:?}",
                self.format
            ));
        }
        if self.version != MANIFEST_VERSION {
            return err(format!(
                "\"version\" is {}, this build reads version {MANIFEST_VERSION}",
                self.version
            ));
        }
        if u32::try_from(self.shards.len()).is_err() {
            return err(format!("{} shards is more than 2^32", self.shards.len()));
        }
        let mut seen = HashSet::with_capacity(self.shards.len());
        let mut total: u64 = 0;
        for (i, s) in self.shards.iter().enumerate() {
            if s.url.is_empty() {
                return err(format!("shards[{i}].url is empty"));
            }
            if !seen.insert(s.url.as_str()) {
                return err(format!("shards[{i}].url {:?} is listed twice", s.url));
            }
            if u32::try_from(s.samples).is_err() {
                return err(format!(
                    "shards[{i}].samples {} is more than 2^32",
                    s.samples
                ));
            }
            // Every sample is at least one 512-byte tar header, so a count the shard's size
            // cannot hold is a lie (a hand edit, a wrong server), and planning memory grows
            // with the count: refuse it before anything is allocated for it. A gzip shard
            // may shrink up to deflate's ratio (1032:1).
            let stored_max = match s.compression {
                Compression::None => s.size / 512,
                Compression::Gzip => s.size.saturating_mul(1032) / 512,
            };
            if s.samples > stored_max {
                return err(format!(
                    "shards[{i}] ({}) claims {} samples, but {} bytes hold at most {stored_max}",
                    s.url, s.samples, s.size
                ));
            }
            total = match total.checked_add(s.samples) {
                Some(t) => t,
                None => return err("total sample count overflows".into()),
            };
        }
        Ok(())
    }

    /// Loads a manifest file, refusing one over `max_bytes`.
    pub fn load(path: &Path, max_bytes: u64) -> Result<Self> {
        let (bytes, name) = crate::index::read_path_bounded(path, max_bytes)?;
        Self::from_json(&bytes, &name)
    }

    /// Writes the manifest atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::write::replace(path, (self.to_json() + "\n").as_bytes())
    }
}

/// Resolves a shard URL from a manifest against the manifest's own location (a path or an
/// `http(s)://` / `file://` URL): absolute URLs and paths stay as they are.
pub fn resolve_url(manifest_location: &str, url: &str) -> String {
    if url.contains("://") || url.starts_with('/') {
        return url.to_string();
    }
    match manifest_location.rfind('/') {
        Some(i) => format!("{}/{url}", &manifest_location[..i]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(url: &str, samples: u64) -> ShardInfo {
        ShardInfo {
            url: url.into(),
            size: samples * 1000,
            samples,
            checksum: Checksum(0x0123_4567_89ab_cdef),
            compression: Compression::None,
            replicas: Vec::new(),
        }
    }

    #[test]
    fn round_trips_through_json() {
        let m = Manifest::new(vec![shard("a.tar", 3), shard("b.tar", 4)]);
        let json = m.to_json();
        assert!(json.contains("\"xxh3:0123456789abcdef\""), "{json}");
        assert_eq!(Manifest::from_json(json.as_bytes(), "m.json").unwrap(), m);
        assert_eq!(m.total_samples(), 7);
    }

    #[test]
    fn refuses_bad_manifests_naming_the_key() {
        let dup = Manifest::new(vec![shard("a.tar", 3), shard("a.tar", 4)]);
        let msg = Manifest::from_json(dup.to_json().as_bytes(), "m.json")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shards[1].url") && msg.contains("m.json"),
            "{msg}"
        );

        let mut v2 = Manifest::new(vec![shard("a.tar", 1)]);
        v2.version = 2;
        let msg = Manifest::from_json(v2.to_json().as_bytes(), "m.json")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("version"), "{msg}");

        let unknown = br#"{"format":"sluice-manifest","version":1,"shards":[],"extra":1}"#;
        let msg = Manifest::from_json(unknown, "m.json")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("extra"), "{msg}");

        let bad_sum = br#"{"format":"sluice-manifest","version":1,"shards":[{"url":"a","size":1,"samples":1,"checksum":"md5:00"}]}"#;
        let msg = Manifest::from_json(bad_sum, "m.json")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("xxh3"), "{msg}");

        // A count the shard's bytes cannot hold (a memory bomb for the planner).
        let mut bomb = Manifest::new(vec![shard("a.tar", 3)]);
        bomb.shards[0].size = 6_000_000;
        bomb.shards[0].samples = 4_294_967_295;
        let msg = Manifest::from_json(bomb.to_json().as_bytes(), "m.json")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shards[0] (a.tar) claims 4294967295 samples")
                && msg.contains("at most 11718"),
            "{msg}"
        );
        bomb.shards[0].samples = 11_718;
        assert!(Manifest::from_json(bomb.to_json().as_bytes(), "m.json").is_ok());
    }

    #[test]
    fn resolves_relative_urls() {
        assert_eq!(resolve_url("/data/m.json", "a.tar"), "/data/a.tar");
        assert_eq!(
            resolve_url("http://h:7000/v1/b/m.json", "a.tar"),
            "http://h:7000/v1/b/a.tar"
        );
        assert_eq!(resolve_url("m.json", "a.tar"), "a.tar");
        assert_eq!(resolve_url("/data/m.json", "/abs/a.tar"), "/abs/a.tar");
        assert_eq!(resolve_url("/data/m.json", "s3://b/a.tar"), "s3://b/a.tar");
    }
}
