//! Per-job series end with their jobs: a worker that served 2,000 short jobs shows the same
//! series once theirs expire (`timeouts.job_series_secs`), while a job that still runs keeps
//! its own however long it lasts; an ended job's demand gauges go to 0 at once. Its own test
//! binary: the expiry is the process's (both tests set the same).

mod quic_client;

use std::time::{Duration, Instant};

use quic_client::*;
use sluice_wire::Message;

/// The per-job series' names and labels, without values.
fn series() -> std::collections::BTreeSet<String> {
    sluice_daemon::job_series(None)
        .render()
        .lines()
        .filter(|l| l.starts_with("sluice_"))
        // The other test here runs a job of its own, `held`, in the same process.
        .filter(|l| !l.contains("job=\"held\""))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
        .collect()
}

fn named(job: u64, name: &str) -> Message {
    match job_n(job, "decode | resize 16 | center_crop 8") {
        Message::OpenJob(mut spec) => {
            spec.name = name.into();
            Message::OpenJob(spec)
        }
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_short_jobs_leave_no_series_once_they_expire() {
    const JOBS: u64 = 2000;
    let r = start_with(|c| c.timeouts.job_series_secs = 3.0).await;
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&named(1, "long"), &[]).await.unwrap();
    assert!(matches!(
        next(&mut c).await,
        Some(Message::JobOpened { job: 1, .. })
    ));
    let before = series();
    assert!(
        before.iter().any(|s| s.contains("job=\"long\"")),
        "{before:?}"
    );
    for job in 2..JOBS + 2 {
        c.1.send(&named(job, &format!("short-{job}")), &[])
            .await
            .unwrap();
        match next(&mut c).await {
            Some(Message::JobOpened { job: j, .. }) if j == job => {}
            other => panic!("job {job}: {other:?}"),
        }
        c.1.send(&Message::Cancel { job }, &[]).await.unwrap();
    }
    let during = series();
    let short = |s: &std::collections::BTreeSet<String>| {
        s.iter().filter(|l| l.contains("job=\"short-")).count()
    };
    assert!(
        short(&during) >= 1000,
        "the short jobs had no series: {}",
        short(&during)
    );
    // The client keeps talking (heartbeats), so the long job lives on throughout.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        c.1.send(&Message::Heartbeat { seq: 1 }, &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = series();
        if short(&now) == 0 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "{} series of ended jobs left",
            short(&now)
        );
    };
    assert_eq!(after, before, "the worker's per-job series changed");
    r.stop.cancel();
}

/// The value of job `name`'s series `metric`, if it is there.
fn value(metric: &str, name: &str) -> Option<f64> {
    let series = format!("{metric}{{job=\"{name}\"}}");
    sluice_daemon::job_series(None)
        .render()
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// An ended job's demand gauges go to 0 when it ends, not when its series expire: a job
/// cancelled with units waiting for credit showed them for minutes on an idle worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_job_s_gauges_go_to_zero_when_it_ends() {
    let r = start_with(|c| {
        c.timeouts.job_series_secs = 3.0;
        c.timeouts.heartbeat_secs = 0.2;
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&named(1, "held"), &[]).await.unwrap();
    assert!(matches!(
        next(&mut c).await,
        Some(Message::JobOpened { job: 1, .. })
    ));
    // Two units and no credit: both wait for their client.
    let mut assign = shard(dir.path(), 4, 1);
    for unit in 0..2 {
        assign.unit = unit;
        c.1.send(&Message::Assign(assign.clone()), &[])
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while value("sluice_cpu_job_units_starved", "held") != Some(2.0) {
        assert!(
            Instant::now() < deadline,
            "the units never waited for credit"
        );
        c.1.send(&Message::Heartbeat { seq: 1 }, &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.1.send(&Message::Cancel { job: 1 }, &[]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let gauges = [
            "sluice_cpu_job_units_starved",
            "sluice_cpu_job_units_running",
            "sluice_cpu_job_units_waiting",
        ]
        .map(|m| value(m, "held"));
        if gauges == [Some(0.0); 3] {
            break;
        }
        assert!(Instant::now() < deadline, "after the job ended: {gauges:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.stop.cancel();
}
