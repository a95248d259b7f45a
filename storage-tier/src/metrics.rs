//! Every metric a storage node exports (see `sluice_cpu::metrics`): all carry a label
//! (`mountpath`, or `method` and `status`), so none is shown before it moves but the
//! mountpaths' health, which the node sets at start.

/// Histograms, per mountpath or per request.
pub const HISTOGRAMS: &[&str] = &[
    "sluice_storage_queue_wait_seconds",
    "sluice_storage_read_seconds",
    "sluice_storage_request_seconds",
];

/// Counters and gauges with a label.
pub const LABELED: &[&str] = &[
    "sluice_storage_active_streams",
    "sluice_storage_bytes_sent_total",
    "sluice_storage_mountpath_healthy",
    "sluice_storage_requests_total",
    "sluice_storage_upload_token_reloads_total",
];
