//! Which replica a source tries first: those that failed or stalled lately go last for a
//! while.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Replica origins (`http://host:port`) that failed or stalled lately. A hung node answers
/// nothing until the stall timeout; trying it last keeps every later unit from waiting on it
/// again, and it is tried first again once `suspect_for` has passed.
pub(super) struct Suspects {
    suspect_for: std::time::Duration,
    failed: Mutex<HashMap<String, Instant>>,
}

impl Suspects {
    pub(super) fn new(suspect_for: std::time::Duration) -> Self {
        Suspects {
            suspect_for,
            failed: Mutex::new(HashMap::new()),
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

    /// `urls`, those whose origin failed within `suspect_for` moved last (order kept).
    pub(super) fn order(&self, urls: &[String]) -> Vec<String> {
        let Ok(mut m) = self.failed.lock() else {
            return urls.to_vec();
        };
        m.retain(|_, at| at.elapsed() < self.suspect_for);
        if m.is_empty() {
            return urls.to_vec();
        }
        let suspect = |u: &String| Self::origin(u).is_some_and(|o| m.contains_key(o));
        let (mut good, bad): (Vec<String>, Vec<String>) =
            urls.iter().cloned().partition(|u| !suspect(u));
        good.extend(bad);
        good
    }
}
