//! Rust's log events (the client's `tracing` events, which reach the `log` facade when no
//! `tracing` subscriber is set) delivered to Python `logging`, under loggers named `sluice.`
//! and the Rust module (`sluice.sluice_client.protocol`): a skipped sample, a worker lost, the
//! same-host transport falling back.
//!
//! Rust threads never call into Python here: a thread that waited for the GIL while the
//! thread holding it waited on a lock the first one holds would deadlock. Records go into a
//! bounded queue instead (what a full queue drops is counted and said), and the thread that
//! holds the GIL hands them to `logging` where the binding already passes: every wake of a
//! batch wait (each 100 ms at most) and every `Loader` call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;

/// Records kept for Python at most; beyond it they are counted and dropped.
const QUEUED: usize = 1024;

struct Record {
    level: log::Level,
    target: String,
    message: String,
}

struct Bridge {
    queue: Mutex<VecDeque<Record>>,
    dropped: AtomicU64,
}

impl log::Log for Bridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let Ok(mut q) = self.queue.lock() else { return };
        if q.len() >= QUEUED {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(Record {
            level: record.level(),
            target: record.target().replace("::", "."),
            message: record.args().to_string(),
        });
    }

    fn flush(&self) {}
}

static BRIDGE: OnceLock<&'static Bridge> = OnceLock::new();

/// Installs the bridge (once per process; a logger someone else installed first wins).
pub fn install() {
    BRIDGE.get_or_init(|| {
        let bridge: &'static Bridge = Box::leak(Box::new(Bridge {
            queue: Mutex::new(VecDeque::new()),
            dropped: AtomicU64::new(0),
        }));
        if log::set_logger(bridge).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
        bridge
    });
}

/// Hands the queued records to Python `logging`; call it holding the GIL.
pub fn deliver(py: Python<'_>) {
    let Some(bridge) = BRIDGE.get() else { return };
    let records: Vec<Record> = match bridge.queue.lock() {
        Ok(mut q) if !q.is_empty() => q.drain(..).collect(),
        _ => Vec::new(),
    };
    let dropped = bridge.dropped.swap(0, Ordering::Relaxed);
    if records.is_empty() && dropped == 0 {
        return;
    }
    let Ok(logging) = py.import("logging") else {
        return;
    };
    let emit = |name: &str, level: i32, message: &str| -> PyResult<()> {
        let logger = logging.call_method1("getLogger", (name,))?;
        if logger
            .call_method1("isEnabledFor", (level,))?
            .extract::<bool>()?
        {
            logger.call_method1("log", (level, message))?;
        }
        Ok(())
    };
    for r in records {
        let level = match r.level {
            log::Level::Error => 40,
            log::Level::Warn => 30,
            log::Level::Info => 20,
            log::Level::Debug => 10,
            log::Level::Trace => 5,
        };
        let _ = emit(&format!("sluice.{}", r.target), level, &r.message);
    }
    if dropped > 0 {
        let _ = emit(
            "sluice",
            30,
            &format!("{dropped} log records dropped: they came faster than Python took them"),
        );
    }
}
