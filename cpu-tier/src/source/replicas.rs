//! Which replica a source tries first: those that failed or stalled lately go last for a
//! while, and those whose bytes or index disagreed with the manifest go last for good.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

/// Replica origins (`http://host:port`) that failed or stalled lately. A hung node answers
/// nothing until the stall timeout; trying it last keeps every later unit from waiting on it
/// again, and it is tried first again once `suspect_for` has passed.
///
/// A replica (a shard's URL) whose `.idx` describes another shard, or whose bytes failed the
/// manifest's checksum where another replica's passed, is *demoted*: tried after every other
/// replica of the shard for as long as the worker runs, logged once with its URL, and counted
/// in `sluice_cpu_replica_demotions_total{replica}`. A stale mirror listed first then costs
/// one unit's detour, not every unit's.
pub(super) struct Suspects {
    suspect_for: std::time::Duration,
    failed: Mutex<HashMap<String, Instant>>,
    demoted: Mutex<HashSet<String>>,
}

impl Suspects {
    pub(super) fn new(suspect_for: std::time::Duration) -> Self {
        Suspects {
            suspect_for,
            failed: Mutex::new(HashMap::new()),
            demoted: Mutex::new(HashSet::new()),
        }
    }

    /// Demotes the replica `url` (see the type's documentation).
    pub(super) fn demote(&self, url: &str, why: &str) {
        let Ok(mut d) = self.demoted.lock() else {
            return;
        };
        if d.insert(url.to_string()) {
            let replica = Self::origin(url).unwrap_or(url).to_string();
            metrics::counter!("sluice_cpu_replica_demotions_total", "replica" => replica)
                .increment(1);
            tracing::warn!(
                replica = url,
                "{why}: demoted, read after the shard's other replicas"
            );
        }
    }

    /// `http://host:port` of a URL; local paths have none.
    fn origin(url: &str) -> Option<&str> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))?;
        let end = rest
            .find('/')
            .map_or(url.len(), |i| url.len() - rest.len() + i);
        Some(&url[..end])
    }

    pub(super) fn failed(&self, url: &str, why: &str) {
        let Some(origin) = Self::origin(url) else {
            return;
        };
        if let Ok(mut m) = self.failed.lock() {
            let fresh = m.insert(origin.to_string(), Instant::now()).is_none();
            if fresh {
                tracing::warn!(
                    replica = origin,
                    "{why}: reading from its other replicas \
                    first for {:.0} s",
                    self.suspect_for.as_secs_f64()
                );
            }
        }
    }

    /// `urls`, those whose origin failed within `suspect_for` moved after the others, and
    /// demoted ones after those (order kept within each).
    pub(super) fn order(&self, urls: &[String]) -> Vec<String> {
        let demoted = self.demoted.lock().map(|d| d.clone()).unwrap_or_default();
        let (mut urls, last): (Vec<String>, Vec<String>) =
            urls.iter().cloned().partition(|u| !demoted.contains(u));
        if let Ok(mut m) = self.failed.lock() {
            m.retain(|_, at| at.elapsed() < self.suspect_for);
            if !m.is_empty() {
                let suspect = |u: &String| Self::origin(u).is_some_and(|o| m.contains_key(o));
                let (good, bad): (Vec<String>, Vec<String>) =
                    urls.into_iter().partition(|u| !suspect(u));
                urls = good;
                urls.extend(bad);
            }
        }
        urls.extend(last);
        urls
    }
}
