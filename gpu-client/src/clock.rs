//! The clock the client's shells give their state machines: tokio's (the system's, except
//! under a paused test clock, where deadlines must agree with the sleeps that wait for them).

use std::time::Instant;

pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps until `deadline` (a core's `poll_timeout`); for ever when there is none.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The time to hand a core whose `deadline` just fired: now, and never before the deadline
/// (a timer may fire a hair early on the clock the core reads).
pub(crate) fn fired(deadline: Option<Instant>) -> Instant {
    deadline.map_or_else(now, |d| now().max(d))
}
