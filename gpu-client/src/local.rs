//! The in-process worker: a loader with no daemons runs its units on blocking threads of its
//! own process, under the same worker rules as `sluice cpu` (`sluice_wire::session`): the
//! same credits, the same unit slots, the same unit loop ([`UnitThread`]). Only the transport
//! differs: what a unit produces goes to the coordinator as link events, not frames.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_wire::session::{
    ConnId, Effect, End, Parker, Rules, Transport, UnitId, UnitThread, Wake, Worker,
};
use sluice_wire::{
    Assign, Hello, JobRunner, JobSpec, Message, Output, SampleFields, SamplePayload, UnitRunner,
    Welcome,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::link::Event;
use crate::same_host::Payload;
use crate::session::Command;

/// A unit of the in-process worker, as its rules know it.
struct Unit {
    id: UnitId,
    assign: Assign,
    /// Where its thread waits; stopped once its job is gone.
    parker: Parker,
}

/// What the in-process worker's units share.
struct Local {
    rules: Mutex<Worker<Arc<Unit>>>,
    conn: ConnId,
    link: usize,
    runner: Arc<dyn JobRunner>,
    events: mpsc::Sender<Event>,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, Worker<Arc<Unit>>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Carries out the rules' wakes: a unit given a slot starts on a blocking thread.
fn wake(local: &Arc<Local>, wakes: Vec<Wake<Arc<Unit>>>) {
    for unit in wakes.into_iter().filter_map(|w| w.carry_out(|u| &u.parker)) {
        let local = local.clone();
        tokio::task::spawn_blocking(move || run_unit(&local, &unit));
    }
}

fn run_unit(local: &Arc<Local>, unit: &Unit) {
    let link = local.link;
    let forward = |output: Output| -> bool {
        let event = match output {
            Output::Sample(mut header, mut payload) => {
                let fields = SamplePayload::split(&mut header, &mut payload).unwrap_or_else(|e| {
                    tracing::error!(key = %header.key, "in-process sample: {e}");
                    SampleFields::default()
                });
                Event::Sample {
                    link,
                    header,
                    payload: Payload::Bytes(payload.into()),
                    fields,
                }
            }
            Output::Skipped(skipped) => Event::Skipped { skipped },
            // In process there are no places to claim (`share_places` is never called): a
            // runner that says otherwise fails the unit, which is then reassigned.
            Output::Placed(header, ..) => {
                tracing::error!(key = %header.key, "an in-process sample claims a batch place");
                return false;
            }
            // `drive_unit` hands on the sample inside, never this.
            Output::Shared(_) => {
                tracing::error!("an in-process sample shared twice over");
                return false;
            }
        };
        !unit.parker.stopped() && local.events.blocking_send(event).is_ok()
    };
    let started = Instant::now();
    let thread = UnitThread {
        worker: &local.rules,
        id: unit.id,
        parker: &unit.parker,
        runner: &*local.runner,
        assign: &unit.assign,
    };
    let end = thread.run(forward, |wakes| wake(local, wakes), |_, _| {});
    tracing::debug!(
        unit = unit.assign.unit,
        "in-process unit took {:?}",
        started.elapsed()
    );
    let event = match end {
        Some(Message::UnitDone(done)) => Some(Event::UnitDone { link, done }),
        Some(Message::UnitFailed(failed)) => Some(Event::UnitFailed { link, failed }),
        _ => None,
    };
    if let Some(event) = event {
        let _ = local.events.blocking_send(event);
    }
    local.lock().finished(local.conn);
}

/// The rules of a worker serving one job in this process: credits as the protocol grants
/// them, units as many at once as a daemon with `threads` decode threads runs by default.
fn rules(threads: u32) -> Rules {
    let never = Duration::from_secs(365 * 24 * 3600);
    Rules {
        admission: sluice_wire::session::Admission::Open,
        welcome: Welcome {
            worker: "in-process".into(),
            threads,
            caches: false,
        },
        max_credits: u32::MAX,
        max_units_per_connection: usize::MAX,
        max_job_weight: 1,
        // Nothing crosses a network: no heartbeats, and no silence to detect.
        heartbeat: never,
        client_silence: never,
        handshake: never,
        // No same-host connection: it speaks frames only.
        max_segment_bytes: 0,
    }
}

/// Refuses the epoch: what the in-process worker said is fatal (retrying changes nothing).
async fn refuse(events: &mpsc::Sender<Event>, link: usize, message: String) {
    let fatal = crate::error::ClientError::Refused {
        worker: "in-process".into(),
        message,
    };
    let _ = events
        .send(Event::Lost {
            link,
            generation: 1,
            error: fatal.to_string(),
            fatal: Some(fatal),
        })
        .await;
}

/// A worker in this process, as link `link`: opens `job`, then runs what the coordinator
/// commands until it stops or `cancel`.
pub(crate) async fn run_local(
    link: usize,
    runner: Arc<dyn UnitRunner>,
    job: JobSpec,
    mut commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,
) {
    let threads = runner.threads();
    let mut worker = Worker::new(rules(threads), (threads as usize * 2).max(2));
    let now = Instant::now();
    let conn = worker.connect(Transport::Frames, now);
    let hello = Hello {
        token: String::new(),
        client: "in-process".into(),
    };
    worker.handle(conn, Message::Hello(hello), now, |_, _| {
        unreachable!("a handshake starts no unit")
    });
    worker.handle(conn, Message::OpenJob(job.clone()), now, |_, _| {
        unreachable!("a handshake starts no unit")
    });
    if let Some(Effect::Close(End::Error(_, why))) =
        std::iter::from_fn(|| worker.poll_effect(conn)).find(|e| matches!(e, Effect::Close(_)))
    {
        return refuse(&events, link, why).await;
    }
    let opened: Result<Arc<dyn JobRunner>, String> = {
        let job = job.clone();
        tokio::task::spawn_blocking(move || {
            runner
                .open_job(&job)
                .map(Arc::from)
                .map_err(|e| sluice_wire::error_chain(&e))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    };
    let job_runner = match opened {
        Ok(r) => r,
        Err(message) => return refuse(&events, link, message).await,
    };
    let shape = job_runner.shape();
    worker.opened(conn, &job, Ok(shape));
    while worker.poll_effect(conn).is_some() {}
    let local = Arc::new(Local {
        rules: Mutex::new(worker),
        conn,
        link,
        runner: job_runner,
        events: events.clone(),
    });
    // Dropped in any way, the worker stops its units (one waiting for credit would otherwise
    // hold a blocking thread, and the runtime's shutdown with it).
    let _disconnect = Disconnect(local.clone());
    let ready = Event::Ready {
        link,
        generation: 1,
        shape,
        caches: false,
    };
    if events.send(ready).await.is_err() {
        return;
    }
    loop {
        let command = tokio::select! {
            c = commands.recv() => c,
            _ = cancel.cancelled() => None,
        };
        let message = match command {
            None => return,
            Some(Command::Credit(_, n)) => Message::Credit {
                job: job.job,
                samples: n,
            },
            // No shared memory in process: a grant dropped gives its places back.
            Some(Command::Drain | Command::Places(..)) => continue,
            Some(Command::Assign(_, assign)) => Message::Assign(assign),
        };
        let (wakes, refused) = {
            let mut w = local.lock();
            w.handle(conn, message, Instant::now(), |id, assign| {
                Arc::new(Unit {
                    id,
                    assign: assign.clone(),
                    parker: Parker::new(),
                })
            });
            let refused = std::iter::from_fn(|| w.poll_effect(conn)).find_map(|e| match e {
                Effect::Close(End::Error(_, why)) => Some(why),
                _ => None,
            });
            (w.take_wakes(), refused)
        };
        wake(&local, wakes);
        if let Some(why) = refused {
            return refuse(&events, link, why).await;
        }
    }
}

struct Disconnect(Arc<Local>);

impl Drop for Disconnect {
    fn drop(&mut self) {
        let wakes = {
            let mut w = self.0.lock();
            w.disconnect(self.0.conn);
            w.take_wakes()
        };
        wake(&self.0, wakes);
    }
}
