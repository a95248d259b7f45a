//! Every metric a CPU worker exports, by kind: what `/metrics` shows from its first second
//! (counters and gauges without labels, at 0 until they move), what docs/operations.md's
//! table lists, and what `tests/metrics_catalog.rs` checks both against.

/// Counters without labels.
pub const COUNTERS: &[&str] = &[
    "sluice_cpu_admission_reload_failures_total",
    "sluice_cpu_admission_reloads_total",
    "sluice_cpu_auth_failures_total",
    "sluice_cpu_bytes_sent_total",
    "sluice_cpu_cache_damaged_total",
    "sluice_cpu_cache_errors_total",
    "sluice_cpu_cache_evictions_total",
    "sluice_cpu_cache_foreign_files_total",
    "sluice_cpu_cache_hit_bytes_total",
    "sluice_cpu_cache_miss_bytes_total",
    "sluice_cpu_certificate_reload_failures_total",
    "sluice_cpu_certificate_reloads_total",
    "sluice_cpu_changed_shards_total",
    "sluice_cpu_connections_refused_total",
    "sluice_cpu_damaged_samples_total",
    "sluice_cpu_fetch_nanoseconds_total",
    "sluice_cpu_fetched_bytes_total",
    "sluice_cpu_handshake_failures_total",
    "sluice_cpu_index_unavailable_total",
    "sluice_cpu_placed_samples_total",
    "sluice_cpu_repaired_samples_total",
    "sluice_cpu_resized_in_place_total",
    "sluice_cpu_same_host_samples_total",
    "sluice_cpu_samples_sent_total",
    "sluice_cpu_samples_skipped_total",
    "sluice_cpu_shard_checksum_mismatches_total",
    "sluice_cpu_share_hits_total",
    "sluice_cpu_share_kept_total",
    "sluice_cpu_share_read_samples_total",
    "sluice_cpu_share_reads_joined_total",
    "sluice_cpu_share_reads_left_total",
    "sluice_cpu_source_failovers_total",
    "sluice_cpu_source_resumes_total",
    "sluice_cpu_source_stalls_total",
    "sluice_cpu_source_unavailable_waits_total",
];

/// Gauges without labels.
pub const GAUGES: &[&str] = &[
    "sluice_cpu_admission_config_broken",
    "sluice_cpu_cache_bytes",
    "sluice_cpu_certificate_expiry_seconds",
    "sluice_cpu_connections",
    "sluice_cpu_share_window_bytes",
    "sluice_cpu_unit_slots",
    "sluice_cpu_units_waiting",
    "sluice_cpu_units_waiting_per_slot",
];

/// Histograms (shown once they have a value).
pub const HISTOGRAMS: &[&str] = &[
    "sluice_cpu_credit_wait_seconds",
    "sluice_cpu_decode_seconds",
    "sluice_cpu_sample_seconds",
    "sluice_cpu_transform_seconds",
    "sluice_cpu_unit_queue_seconds",
];

/// Series with a label, made as they first move: per job (`job`, expiring after the job),
/// per replica (`replica`), per unit result (`result`).
pub const LABELED: &[&str] = &[
    "sluice_cpu_job_samples_total",
    "sluice_cpu_job_units_running",
    "sluice_cpu_job_units_starved",
    "sluice_cpu_job_units_waiting",
    "sluice_cpu_job_weight",
    "sluice_cpu_replica_demotions_total",
    "sluice_cpu_units_total",
];

/// Shows every counter and gauge (at 0 where nothing moved it yet), and the worker's `slots` (an autoscaler reading
/// `sluice_cpu_units_waiting_per_slot` finds it on an idle or new worker).
pub fn register(slots: usize) {
    for name in COUNTERS {
        metrics::counter!(*name).increment(0);
    }
    for name in GAUGES {
        metrics::gauge!(*name).increment(0.0);
    }
    metrics::gauge!("sluice_cpu_unit_slots").set(slots as f64);
}
