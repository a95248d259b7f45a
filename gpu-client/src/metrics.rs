//! Every metric the client library records (see `sluice_cpu::metrics`). They reach
//! `/metrics` where the process installed a recorder: `sluice loadgen --metrics-listen`, or
//! `sluice.serve_metrics()` in Python.

/// Counters without labels.
pub const COUNTERS: &[&str] = &[
    "sluice_client_batches_total",
    "sluice_client_cached_bytes_total",
    "sluice_client_duplicates_dropped_total",
    "sluice_client_hedged_units_total",
    "sluice_client_pool_changes_total",
    "sluice_client_reassigned_units_total",
    "sluice_client_samples_total",
    "sluice_client_skipped_total",
    "sluice_client_storage_bytes_total",
    "sluice_client_unplanned_dropped_total",
    "sluice_client_workers_unanswered_total",
];

/// Gauges without labels.
pub const GAUGES: &[&str] = &[
    "sluice_client_pool_workers",
    "sluice_client_quic_receive_bytes",
    "sluice_client_reorder_held_samples",
];

/// Histograms (shown once they have a value).
pub const HISTOGRAMS: &[&str] = &["sluice_client_wait_seconds"];

/// Shows every counter and gauge (at 0 where nothing moved it yet); call it once the
/// recorder is installed.
pub fn register() {
    for name in COUNTERS {
        metrics::counter!(*name).increment(0);
    }
    for name in GAUGES {
        metrics::gauge!(*name).increment(0.0);
    }
}
