//! Starting an epoch: its plan (or the rest of a loaded checkpoint's), a link to every worker
//! (QUIC, same-host shared memory, or the engine in this process), and its coordinator on
//! the loader's runtime; and starting the next epoch early, behind the one being read.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use sluice_plan::{Segment, ShuffleBuffer};
use sluice_wire::JobSpec;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::checkpoint::Pending;
use super::epoch::{Epoch, Parts, Progress, Rounds};
use super::{Loader, Workers};
use crate::config::{EpochSettings, Order};
use crate::coordinator::{handoff, Coordinator, Predecessor};
use crate::error::ClientError;
use crate::ledger::Ledger;
use crate::link::Event;
use crate::local::run_local;
use crate::membership::{self, Dialer, Source, Task, Watcher};
use crate::reorder::Reorder;
use crate::session::Command;
use crate::stats::EpochCounters;

/// An epoch planned and started, not yet handed to the consumer.
pub(super) struct Started {
    pub(super) epoch: Epoch,
    /// What the consumer will have been handed once it takes the epoch.
    pub(super) progress: Option<Progress>,
    links: Vec<String>,
    /// The gate of the epoch after this one, to start it early (`prefetch_next_epoch`).
    next: Option<Predecessor>,
}

/// The next epoch, started early behind `earlier` (its `Epoch`'s cancel token and its
/// coordinator's end).
pub(super) struct Early {
    pub(super) started: Started,
    earlier: (CancellationToken, CancellationToken),
}

impl Early {
    /// The consumer is done with the earlier epoch: it ran to its end or was dropped. (An
    /// earlier epoch still being read keeps the ring buffers it needs, so a consumer that
    /// reads two epochs at once gets this one started afresh, with a ring of its own.)
    fn earlier_ended(&self) -> bool {
        self.earlier.0.is_cancelled() || self.earlier.1.is_cancelled()
    }

    /// It can be taken over: it is `epoch`, the earlier one is done, and it has not failed
    /// (say, no worker answered it while the earlier one ran: asked for now, it tries anew).
    fn takes_over(&self, epoch: u64) -> bool {
        self.started.epoch.epoch == epoch
            && self.earlier_ended()
            && !self.started.epoch.counters.failed.load(Relaxed)
    }
}

/// An epoch's plan for this rank, ready to run: where it starts and what it has delivered.
struct Run {
    settings: EpochSettings,
    /// The rest of the epoch from this segment on (its rounds after it included).
    rest: sluice_plan::BatchPlan,
    ledger: Ledger,
    reorder: Reorder<crate::same_host::Payload>,
    progress: Progress,
}

impl Run {
    /// The segment is a mixture's round with rounds after it.
    fn rounds_after(&self) -> bool {
        self.rest.samples > self.settings.batch_plan.samples
    }
}

/// The links of one epoch: each one's name and command queue, and the tasks that run them.
#[derive(Default)]
struct Links {
    links: Vec<(String, mpsc::Sender<Command>)>,
    tasks: Vec<Task>,
}

/// What starting a run of an epoch (its plan, links and coordinator) takes, cloned from the
/// loader when an epoch starts, so the epoch can start its next round itself (a mixture
/// drawn in rounds, see `sluice_plan::mixture`) under the plan it started with.
#[derive(Clone)]
pub(super) struct Runner {
    config: Arc<crate::config::LoaderConfig>,
    manifest: Arc<sluice_shard::Manifest>,
    fingerprint: u64,
    source_bounds: Arc<[u32]>,
    planner: Arc<sluice_plan::EpochPlanner>,
    workers: Workers,
    token: Option<String>,
    quic: Option<(crate::quic::Endpoint, quinn_proto::ClientConfig)>,
    runtime: tokio::runtime::Handle,
    allocator: Arc<dyn crate::batch::HostAllocator>,
    buffers: Arc<sluice_wire::BufferPool>,
    segments: Arc<crate::same_host::Segments>,
    last_pool: Arc<crate::membership::LastGood>,
    progress: Arc<std::sync::Mutex<Option<Progress>>>,
    stats: Arc<crate::stats::Stats>,
}

impl Loader {
    /// What starting a run of an epoch takes, with the plan as it is now.
    fn runner(&self) -> Result<Runner, ClientError> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| ClientError::Runtime("the loader is shutting down".into()))?;
        Ok(Runner {
            config: self.config.clone(),
            manifest: self.manifest.clone(),
            fingerprint: self.fingerprint,
            source_bounds: self.source_bounds.clone(),
            planner: self.planner(),
            workers: self.workers.clone(),
            token: self.token.clone(),
            quic: self.quic.clone(),
            runtime: runtime.handle().clone(),
            allocator: self.allocator.clone(),
            buffers: self.buffers.clone(),
            segments: self.segments.clone(),
            last_pool: self.last_pool.clone(),
            progress: self.progress.clone(),
            stats: self.stats.clone(),
        })
    }

    /// Starts epoch `epoch` (or resumes it from a loaded checkpoint) and returns its batches.
    ///
    /// With `prefetch_next_epoch` (the default), epoch `epoch + 1` is started behind it: its
    /// first units go to the workers once this epoch has handed out all of its own, so the
    /// workers do not idle while the last batches drain. A later `epoch(epoch + 1)` takes it
    /// over when this epoch has ended or been dropped; any other call (another epoch, a loaded
    /// checkpoint) cancels it. It is started on the first call and on a call for the epoch
    /// after the one before, not when the same epoch is asked for again.
    pub fn epoch(&self, epoch: u64) -> Result<Epoch, ClientError> {
        // From here `state_dict()` is this read's, no longer the checkpoint loaded.
        if let Ok(mut l) = self.loaded.lock() {
            l.take();
        }
        let resume = self.resume.lock().ok().and_then(|mut r| r.take());
        let resume = resume.filter(|p| p.epoch == epoch);
        let resuming = resume.is_some();
        let early = self.next.lock().ok().and_then(|mut n| n.take());
        let mut started = match early {
            Some(early) if resume.is_none() && early.takes_over(epoch) => {
                tracing::debug!(epoch, "taking over the epoch started early");
                early.started
            }
            // Dropping an epoch started early cancels it.
            _ => self.runner()?.start(epoch, resume, None, None)?,
        };
        let pass = 1 + self.passes.fetch_add(1, Relaxed);
        started.epoch.pass = pass;
        self.record_pass(&mut started, epoch, pass, resuming);
        self.stats.set_workers(&started.links);
        // Only a consumer that goes epoch after epoch gets the next one started early: one that
        // reads the same epoch again and again (an evaluation loop) would waste it each time.
        let previous = self
            .last_epoch
            .lock()
            .ok()
            .and_then(|mut l| l.replace(epoch));
        let in_order = previous.is_none_or(|p| epoch == p + 1);
        if let Some(after) = started.next.take().filter(|_| in_order) {
            let earlier = (started.epoch.cancel.clone(), after.ended_token());
            match self
                .runner()
                .and_then(|r| r.start(epoch + 1, None, Some(after), None))
            {
                Ok(next) => {
                    if let Ok(mut n) = self.next.lock() {
                        *n = Some(Early {
                            started: next,
                            earlier,
                        });
                    }
                }
                // The same error comes back if the consumer asks for that epoch.
                Err(e) => tracing::debug!(epoch = epoch + 1, "not started early: {e}"),
            }
        }
        Ok(started.epoch)
    }

    /// Makes `started` the recorded pass, unless it is a peek at the epoch being read.
    fn record_pass(&self, started: &mut Started, epoch: u64, pass: u64, resuming: bool) {
        let Ok(mut p) = self.progress.lock() else {
            return;
        };
        let peek = !resuming && p.as_ref().is_some_and(|p| p.open && p.epoch == epoch);
        if peek {
            tracing::debug!(
                epoch,
                "another pass of the epoch is being read: this one is not checkpointed"
            );
        } else {
            *p = started.progress.take().map(|mut progress| {
                progress.pass = pass;
                progress
            });
        }
    }
}

impl Runner {
    /// Plans epoch `epoch` (or the rest of it, `resume`) and starts its links and coordinator;
    /// `after`: started early, behind the epoch before (see `Coordinator::after`); `round`:
    /// the next round of an epoch being read, counted in its counters.
    pub(super) fn start(
        &self,
        epoch: u64,
        resume: Option<Pending>,
        after: Option<Predecessor>,
        round: Option<Arc<EpochCounters>>,
    ) -> Result<Started, ClientError> {
        let runtime = &self.runtime;
        let c = &self.config;
        let run = self.plan_run(epoch, resume, round.is_some())?;
        let spec = self.job_spec(&run.settings);
        let cancel = CancellationToken::new();
        let counters = round.unwrap_or_default();
        // Room for every credit of every link, so a reader waits only on a slow consumer.
        let links_max = match &self.workers {
            Workers::InProcess(_) => 1,
            // A pool that may grow is sized for a few more workers than it starts with.
            Workers::Remote(w) => (w.len() + 4) * 4 * c.connections_per_worker as usize,
        };
        let (event_tx, event_rx) = mpsc::channel(links_max * c.credits_per_worker as usize + 64);
        let (out_tx, out_rx) = mpsc::channel(c.ring_batches);
        let Links { links, tasks } = self.links(&spec, &event_tx, &cancel)?;
        drop(event_tx);
        let names: Vec<String> = links.iter().map(|l| l.0.clone()).collect();
        // An epoch with rounds after this one starts the next epoch from none of them.
        let rounds_after = run.rounds_after();
        let early =
            c.prefetch_next_epoch && c.epochs.is_none_or(|n| epoch + 1 < n) && !rounds_after;
        let (before, next) = match early {
            true => {
                let (successor, predecessor) = handoff();
                (Some(successor), Some(predecessor))
            }
            false => (None, None),
        };
        let (batch_plan, first_batch) = (run.settings.batch_plan, run.settings.first_batch);
        let rounds = rounds_after.then(|| Box::new(self.clone()) as Box<dyn Rounds>);
        let rest = run.rest;
        let resumed = run.progress.resumed.clone();
        let mut coordinator = Coordinator::new(
            run.settings,
            self.manifest.clone(),
            (run.ledger, run.reorder),
            links,
            self.allocator.clone(),
            counters.clone(),
            self.stats.clone(),
        );
        coordinator = coordinator.with_arena(self.segments.clone());
        if let Some(earlier) = after {
            coordinator = coordinator.after(earlier);
        }
        if let Some(successor) = before {
            coordinator = coordinator.before(successor);
        }
        let _guard = runtime.enter();
        for t in tasks {
            runtime.spawn(t);
        }
        runtime.spawn(coordinator.run(event_rx, out_tx, cancel.clone()));
        let handle = Epoch::new(Parts {
            runtime: runtime.clone(),
            epoch,
            batch_plan,
            rest,
            resumed,
            rounds,
            first_batch,
            rx: out_rx,
            cancel,
            counters,
            progress: self.progress.clone(),
            stats: self.stats.clone(),
            ring_batches: c.ring_batches,
            source_bounds: self.source_bounds.clone(),
        });
        Ok(Started {
            epoch: handle,
            progress: Some(run.progress),
            links: names,
            next,
        })
    }

    /// This rank's part of `epoch` (the rest of it after `resume`): its units, what of them
    /// was delivered, the order they fill batches in.
    fn plan_run(
        &self,
        epoch: u64,
        resume: Option<Pending>,
        round: bool,
    ) -> Result<Run, ClientError> {
        let c = &self.config;
        let resumed = resume
            .as_ref()
            .map(|p| p.resumed.clone())
            .unwrap_or_default();
        let planner = &self.planner;
        let (units, batch_plan, rest) =
            planner.segment_and_rest(epoch, &resumed, c.world_size, c.rank)?;
        let rounds_after = rest.samples > batch_plan.samples;
        let mut ledger = Ledger::new(&units);
        let mut first_batch = 0;
        if let Some(p) = &resume {
            if let Some(record) = &p.ledger {
                ledger.apply(record).map_err(ClientError::Checkpoint)?;
            }
            first_batch = p.batches;
            if round {
                tracing::info!(
                    epoch,
                    round = resumed.len(),
                    samples = batch_plan.samples,
                    "the epoch goes on with its next round"
                );
            } else {
                tracing::info!(
                    epoch,
                    batches = p.batches,
                    samples = ledger.accounted(),
                    earlier_worlds = ?p.resumed,
                    "resuming"
                );
            }
        }
        let reorder = match c.order {
            Order::Plan => Reorder::plan(
                Arc::new(planner.sequence(&units, epoch, &resumed, c.rank)?),
                first_batch * u64::from(c.batch_size),
            ),
            Order::Arrival => Reorder::arrival(ShuffleBuffer::new(
                c.mixing.buffer_samples as usize,
                c.seed,
                epoch,
                c.rank,
            )),
        };
        let progress = Progress {
            epoch,
            resumed,
            batches: first_batch,
            samples: batch_plan.samples,
            ledger: ledger.clone(),
            pass: 0,
            open: first_batch < batch_plan.batches || rounds_after,
        };
        let job = (epoch << 32) ^ (u64::from(c.rank) << 16) ^ (self.fingerprint & 0xffff);
        Ok(Run {
            settings: EpochSettings {
                config: self.config.clone(),
                job,
                epoch,
                batch_plan,
                first_batch,
            },
            rest,
            ledger,
            reorder,
            progress,
        })
    }

    /// What every worker is asked to run for this epoch.
    fn job_spec(&self, run: &EpochSettings) -> JobSpec {
        let c = &self.config;
        JobSpec {
            job: run.job,
            dataset: c.dataset_name.clone(),
            pipeline: c.pipeline.clone(),
            seed: c.seed,
            epoch: run.epoch,
            rank: c.rank,
            world_size: c.world_size,
            batch_size: c.batch_size,
            fail_on_bad_sample: c.fail_on_bad_sample,
            fields: c.fields.clone(),
            label: c.label.clone(),
            max_field_bytes: c.max_field_bytes,
            name: c.job_name(),
            weight: c.job_weight,
            share: c.share,
        }
    }

    /// A link to every worker (or the engine in this process), not yet running; and, where
    /// the pool can change while the epoch runs, the task that watches it.
    fn links(
        &self,
        spec: &JobSpec,
        events: &mpsc::Sender<Event>,
        cancel: &CancellationToken,
    ) -> Result<Links, ClientError> {
        let mut out = Links::default();
        if let Workers::InProcess(runner) = &self.workers {
            let (tx, rx) = mpsc::channel(64);
            out.links.push(("in-process".to_string(), tx));
            let run = run_local(
                0,
                runner.clone(),
                spec.clone(),
                rx,
                events.clone(),
                cancel.clone(),
            );
            out.tasks.push(Box::pin(run));
            return Ok(out);
        }
        let source = Source::new(&self.config);
        let changes = source.changes();
        // A fixed list must resolve now; a pool that changes starts with what it has (none
        // at all: the epoch waits `worker_wait` for one to join).
        // A source that cannot be read now starts the epoch on what it gave last.
        let members = self.last_pool.start(&source, changes)?;
        let dialer = Dialer {
            config: self.config.clone(),
            quic: self.quic.clone(),
            token: self.token.clone(),
            buffers: self.buffers.clone(),
            segments: self.segments.clone(),
            spare_slots: self
                .config
                .waiting_bound()
                .div_ceil(members.len().max(1) as u64)
                .min(u64::from(u32::MAX)) as u32,
            spec: spec.clone(),
            events: events.clone(),
            cancel: cancel.clone(),
            last: self.last_pool.clone(),
        };
        let mut pool = Vec::new();
        for m in members {
            let first = out.links.len();
            for (label, tx, task) in dialer.dial(first, &m)? {
                out.links.push((label, tx));
                out.tasks.push(task);
            }
            pool.push((m, (first..out.links.len()).collect()));
        }
        // A change since the epoch before is reported as one while an epoch runs is.
        membership::report(&self.stats, &pool);
        if changes {
            let watcher = Watcher {
                source,
                every: self.config.workers_refresh,
                next_link: out.links.len(),
                dialer,
                pool,
                stats: self.stats.clone(),
                last: self.last_pool.clone(),
            };
            out.tasks.push(Box::pin(watcher.run()));
        }
        Ok(out)
    }
}

impl Rounds for Runner {
    /// The round after the one `epoch` is reading after the segments `resumed`, which every
    /// rank took whole: the segments so far and that round are the earlier ones, and
    /// nothing is handed back.
    fn next_round(
        &self,
        epoch: u64,
        resumed: &[Segment],
        counters: Arc<EpochCounters>,
    ) -> Result<(Epoch, Option<Progress>), ClientError> {
        let resumed = self
            .planner
            .after_round(epoch, resumed, self.config.world_size)?;
        let pending = Pending {
            epoch,
            resumed,
            batches: 0,
            ledger: None,
        };
        let started = self.start(epoch, Some(pending), None, Some(counters))?;
        Ok((started.epoch, started.progress))
    }
}
