//! Client figures: what an epoch delivered, and live rates for loadgen and dashboards (also
//! exported through the `metrics` facade as `sluice_client_*`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters of one epoch, shared by the coordinator and the iterator.
#[derive(Debug, Default)]
pub(crate) struct EpochCounters {
    pub received: AtomicU64,
    pub duplicates: AtomicU64,
    pub unplanned: AtomicU64,
    pub reassigned: AtomicU64,
    pub delivered: AtomicU64,
    pub skipped: AtomicU64,
    pub padded: AtomicU64,
    pub batches: AtomicU64,
    pub starved_ns: AtomicU64,
    pub hedged: AtomicU64,
    /// Units run by a worker other than their shard's owner (shard affinity).
    pub elsewhere: AtomicU64,
    /// Shard bytes the finished units read from the storage tier and from worker caches.
    pub storage_bytes: AtomicU64,
    pub cached_bytes: AtomicU64,
    pub reorder_peak: AtomicU64,
    /// The coordinator is waiting for the consumer to release a ring buffer.
    pub ring_full: std::sync::atomic::AtomicBool,
    /// ... and the consumer holds every one of the ring's batches: nothing moves unless
    /// another thread of the consumer drops one.
    pub held_all: std::sync::atomic::AtomicBool,
    /// The consumer is waiting for this epoch's next batch.
    pub consumer_waiting: std::sync::atomic::AtomicBool,
    /// The epoch ended in an error (sent to the consumer as its last item).
    pub failed: std::sync::atomic::AtomicBool,
}

/// What an epoch delivered so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochReport {
    pub epoch: u64,
    /// Samples this rank's plan holds for the epoch (after the last-batch policy).
    pub planned: u64,
    /// Distinct planned samples handed to the consumer.
    pub delivered: u64,
    /// Planned samples the decoder rejected (named in each batch's `skipped`).
    pub skipped: u64,
    /// Copies that filled short batches (top-up policy); not counted in `delivered`.
    pub padded: u64,
    pub batches: u64,
    pub duplicates_dropped: u64,
    /// Frames for samples not in this rank's plan (dropped).
    pub unplanned_dropped: u64,
    /// Unit pieces moved to another worker after a failure.
    pub reassigned: u64,
    /// Time the consumer waited for a batch.
    pub starved: Duration,
    /// Units given to a second worker because the delivery order waited on them.
    pub hedged: u64,
    /// Most samples held at once for their turn (plan order) or in the shuffle buffer.
    pub reorder_peak: u64,
    /// Units run by a worker other than their shard's owner (with shard caches: units whose
    /// owner was busy or not connected when they were needed).
    pub elsewhere: u64,
    /// Shard bytes this epoch's finished units read from the storage tier, and from the
    /// workers' shard caches.
    pub storage_bytes: u64,
    pub cached_bytes: u64,
}

impl EpochCounters {
    pub(crate) fn report(&self, epoch: u64, planned: u64) -> EpochReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EpochReport {
            epoch,
            planned,
            delivered: get(&self.delivered),
            skipped: get(&self.skipped),
            padded: get(&self.padded),
            batches: get(&self.batches),
            duplicates_dropped: get(&self.duplicates),
            unplanned_dropped: get(&self.unplanned),
            reassigned: get(&self.reassigned),
            starved: Duration::from_nanos(get(&self.starved_ns)),
            hedged: get(&self.hedged),
            reorder_peak: get(&self.reorder_peak),
            elsewhere: get(&self.elsewhere),
            storage_bytes: get(&self.storage_bytes),
            cached_bytes: get(&self.cached_bytes),
        }
    }
}

/// One worker as the client sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    pub name: String,
    pub alive: bool,
    pub samples: u64,
    pub in_flight_units: usize,
    /// It left the pool (its workers file line or DNS record went): drained, then closed.
    pub left: bool,
}

/// Live figures of a loader across epochs.
#[derive(Clone, Debug, Default)]
pub struct StatsSnapshot {
    pub batches: u64,
    pub samples: u64,
    pub elapsed: Duration,
    /// Time the consumer waited for data.
    pub starved: Duration,
    /// Time the coordinator waited for the consumer to release a ring buffer.
    pub ring_wait: Duration,
    pub workers: Vec<WorkerStats>,
    /// Bytes of shard data the workers read for this loader's finished units from the
    /// storage tier, and from their shard caches.
    pub storage_bytes: u64,
    pub cached_bytes: u64,
    /// Workers that joined or left the pool while epochs ran (workers file, DNS).
    pub pool_changes: u64,
}

impl StatsSnapshot {
    pub fn samples_per_s(&self) -> f64 {
        self.samples as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    pub fn batches_per_s(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// The fraction of the time the consumer waited for data.
    pub fn starved_fraction(&self) -> f64 {
        self.starved.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The fraction of the shard bytes the workers read from their caches (`None` before
    /// any unit finished).
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        let all = self.storage_bytes + self.cached_bytes;
        (all > 0).then(|| self.cached_bytes as f64 / all as f64)
    }
}

#[derive(Debug)]
pub(crate) struct Stats {
    started: Instant,
    batches: AtomicU64,
    samples: AtomicU64,
    starved_ns: AtomicU64,
    ring_wait_ns: AtomicU64,
    storage_bytes: AtomicU64,
    cached_bytes: AtomicU64,
    workers: Mutex<Vec<WorkerStats>>,
    /// The workers in the pool as last seen, by address, with their labels (`None` before
    /// the first epoch's).
    pool: Mutex<Option<BTreeMap<SocketAddr, String>>>,
    pool_changes: AtomicU64,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Stats {
            started: Instant::now(),
            batches: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            starved_ns: AtomicU64::new(0),
            ring_wait_ns: AtomicU64::new(0),
            storage_bytes: AtomicU64::new(0),
            cached_bytes: AtomicU64::new(0),
            workers: Mutex::new(Vec::new()),
            pool: Mutex::new(None),
            pool_changes: AtomicU64::new(0),
        }
    }

    pub(crate) fn set_workers(&self, names: &[String]) {
        if let Ok(mut w) = self.workers.lock() {
            *w = names
                .iter()
                .map(|n| WorkerStats {
                    name: n.clone(),
                    ..WorkerStats::default()
                })
                .collect();
        }
    }

    /// Link `link` (joined while its epoch ran) goes to worker `name`.
    pub(crate) fn joined(&self, link: usize, name: &str) {
        if let Ok(mut w) = self.workers.lock() {
            if w.len() <= link {
                w.resize(link + 1, WorkerStats::default());
            }
            if w[link].name != name {
                w[link] = WorkerStats {
                    name: name.to_string(),
                    ..WorkerStats::default()
                };
            }
        }
    }

    /// Link `link`'s worker left the pool.
    pub(crate) fn left(&self, link: usize) {
        self.with_worker(link, |w| w.left = true);
    }

    /// The pool is now `workers` (address, label): the labels of those that joined and of
    /// those that left since it was last told (each change once, however many epochs'
    /// watchers report it; the first pool is no change). A worker is its address: the same
    /// one under another label (a name that gave several addresses when one epoch started
    /// and one when the next did) neither left nor joined.
    pub(crate) fn pool_is(&self, workers: &[(SocketAddr, String)]) -> (Vec<String>, Vec<String>) {
        let now: BTreeMap<SocketAddr, String> = workers.iter().cloned().collect();
        let Ok(mut pool) = self.pool.lock() else {
            return (Vec::new(), Vec::new());
        };
        let changes = match pool.as_ref() {
            None => (Vec::new(), Vec::new()),
            Some(was) => {
                let new_in = |a: &BTreeMap<SocketAddr, String>,
                              b: &BTreeMap<SocketAddr, String>| {
                    a.iter()
                        .filter(|(addr, _)| !b.contains_key(addr))
                        .map(|(_, label)| label.clone())
                        .collect::<Vec<_>>()
                };
                (new_in(&now, was), new_in(was, &now))
            }
        };
        let n = (changes.0.len() + changes.1.len()) as u64;
        self.pool_changes.fetch_add(n, Ordering::Relaxed);
        metrics::counter!("sluice_client_pool_changes_total").increment(n);
        metrics::gauge!("sluice_client_pool_workers").set(now.len() as f64);
        *pool = Some(now);
        changes
    }

    fn with_worker(&self, i: usize, f: impl FnOnce(&mut WorkerStats)) {
        if let Some(w) = self.workers.lock().ok().as_mut().and_then(|w| w.get_mut(i)) {
            f(w);
        }
    }

    pub(crate) fn sample_from(&self, link: usize) {
        self.with_worker(link, |w| w.samples += 1);
    }

    pub(crate) fn set_alive(&self, link: usize, alive: bool) {
        self.with_worker(link, |w| w.alive = alive);
    }

    pub(crate) fn set_in_flight(&self, link: usize, n: usize) {
        self.with_worker(link, |w| w.in_flight_units = n);
    }

    /// A unit finished having read `storage` bytes from the storage tier and `cached` from
    /// its worker's shard cache.
    pub(crate) fn shard_bytes(&self, storage: u64, cached: u64) {
        self.storage_bytes.fetch_add(storage, Ordering::Relaxed);
        self.cached_bytes.fetch_add(cached, Ordering::Relaxed);
        metrics::counter!("sluice_client_storage_bytes_total").increment(storage);
        metrics::counter!("sluice_client_cached_bytes_total").increment(cached);
    }

    pub(crate) fn ring_wait(&self, d: Duration) {
        self.ring_wait_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn batch(&self, samples: u64, starved: Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.samples.fetch_add(samples, Ordering::Relaxed);
        self.starved_ns
            .fetch_add(starved.as_nanos() as u64, Ordering::Relaxed);
        metrics::counter!("sluice_client_batches_total").increment(1);
        metrics::counter!("sluice_client_samples_total").increment(samples);
        // Its `_sum` is the total time the consumer was starved.
        metrics::histogram!("sluice_client_wait_seconds").record(starved.as_secs_f64());
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            batches: get(&self.batches),
            samples: get(&self.samples),
            elapsed: self.started.elapsed(),
            starved: Duration::from_nanos(get(&self.starved_ns)),
            ring_wait: Duration::from_nanos(get(&self.ring_wait_ns)),
            storage_bytes: get(&self.storage_bytes),
            cached_bytes: get(&self.cached_bytes),
            workers: self.workers.lock().map(|w| w.clone()).unwrap_or_default(),
            pool_changes: get(&self.pool_changes),
        }
    }
}
