//! The synthetic consumers' command-line side, shared by `loadgen`, `demo` and `bench chain`:
//! their common arguments and the live progress (a bar per rank on a terminal, a line per rank
//! and epoch otherwise). The consumers themselves are `sluice_testbed::consumers`.

use std::path::PathBuf;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use sluice_client::LoaderConfig;
use sluice_client::{EpochReport, StatsSnapshot};
use sluice_testbed::consumers::{ConsumerConfig, Observer};

/// The synthetic consumers `demo` and `bench chain` run.
#[derive(clap::Args, Clone)]
pub struct Consumers {
    /// Synthetic consumers (ranks).
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    #[arg(long, default_value_t = 3)]
    pub epochs: u64,
    #[arg(long, default_value_t = 64)]
    pub batch_size: u32,
    /// Simulated GPU step per batch, milliseconds (0: consume as fast as data comes).
    #[arg(long, default_value_t = 0.0)]
    pub step_ms: f64,
    #[arg(long, default_value = "decode | random_resized_crop 224 | hflip 0.5")]
    pub pipeline: String,
    /// Start each epoch only when the consumer asks for it, not while the one before drains.
    #[arg(long)]
    pub no_prefetch_next_epoch: bool,
    /// Threads per rank that receive samples and fill batches (the loader's `io_threads`; 0:
    /// one, or one per connection with `--connections-per-worker` above one).
    #[arg(long, default_value_t = 0)]
    pub io_threads: usize,
}

impl Consumers {
    /// These consumers of `dataset` on `workers`.
    pub fn config(
        &self,
        dataset: &std::path::Path,
        workers: Vec<String>,
        token: Option<String>,
        trust_cert: Option<PathBuf>,
    ) -> ConsumerConfig {
        let base = ConsumerConfig::new(dataset.display().to_string(), workers);
        ConsumerConfig {
            loader: LoaderConfig {
                batch_size: self.batch_size,
                pipeline: self.pipeline.clone(),
                prefetch_next_epoch: !self.no_prefetch_next_epoch,
                io_threads: self.io_threads,
                trust_cert,
                ..base.loader
            },
            ranks: self.ranks,
            epochs: self.epochs,
            step_ms: self.step_ms,
            token,
            ..base
        }
    }
}

/// ", starved N%" when consumers have a step time; with `--step-ms 0` they take batches as
/// fast as they come, so they are always waiting and the figure would mean nothing.
pub fn starved_note(step_ms: f64, fraction: f64) -> String {
    if step_ms > 0.0 {
        format!(", starved {:.0}%", fraction * 100.0)
    } else {
        String::new()
    }
}

/// Live progress: a bar per rank on a terminal; without one (CI, a pipe), a line per rank and
/// epoch.
pub struct Bars {
    bars: Vec<ProgressBar>,
    step_ms: f64,
    _multi: MultiProgress,
}

impl Bars {
    pub fn new(ranks: u32, step_ms: f64) -> Bars {
        let multi = MultiProgress::new();
        let bars = (0..ranks)
            .map(|rank| {
                let bar = multi.add(ProgressBar::new(0));
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} batches {msg}",
                ) {
                    bar.set_style(style);
                }
                bar.set_prefix(format!("rank {rank}"));
                bar
            })
            .collect();
        Bars {
            bars,
            step_ms,
            _multi: multi,
        }
    }

    pub fn finish(&self) {
        for bar in &self.bars {
            bar.finish();
        }
    }
}

impl Observer for Bars {
    fn epoch_started(&self, rank: u32, _epoch: u64, batches: u64) {
        if let Some(bar) = self.bars.get(rank as usize) {
            bar.set_length(batches);
            bar.set_position(0);
        }
    }

    fn batch(&self, rank: u32, epoch: u64, s: &StatsSnapshot) {
        if let Some(bar) = self.bars.get(rank as usize) {
            bar.inc(1);
            // Live workers, as the pool grows and shrinks (a workers file, DNS).
            let workers = s.workers.iter().filter(|w| w.alive && !w.left).count();
            bar.set_message(format!(
                "epoch {epoch}, {:.0} samples/s{}, {workers} worker{}",
                s.samples_per_s(),
                starved_note(self.step_ms, s.starved_fraction()),
                if workers == 1 { "" } else { "s" }
            ));
        }
    }

    fn epoch_done(&self, rank: u32, epoch: u64, r: &EpochReport, secs: f64) {
        let hidden = self.bars.get(rank as usize).is_none_or(|b| b.is_hidden());
        if hidden {
            let secs = secs.max(1e-9);
            eprintln!(
                "rank {rank} epoch {epoch}: {} batches, {} samples ({} skipped) in {secs:.1}s, \
                 {:.0} samples/s{}",
                r.batches,
                r.delivered,
                r.skipped,
                (r.delivered + r.skipped) as f64 / secs,
                starved_note(self.step_ms, r.starved.as_secs_f64() / secs)
            );
        }
    }
}

/// When every rank has finished its first epoch, and the samples of the epochs done by then:
/// what follows is a long run's steady pace, without the loader's start (connections, the
/// first pages of its buffers and segments, a plan-ordered epoch's first batches).
pub struct FirstEpochs {
    /// Ranks done with their first epoch, and the samples of the epochs done so far.
    state: std::sync::Mutex<(Vec<bool>, u64)>,
    at: std::sync::OnceLock<(std::time::Instant, u64)>,
}

impl FirstEpochs {
    pub fn new(ranks: u32) -> Self {
        FirstEpochs {
            state: std::sync::Mutex::new((vec![false; ranks as usize], 0)),
            at: std::sync::OnceLock::new(),
        }
    }

    /// Rank `rank` finished an epoch of `samples` (delivered and skipped): the samples done so
    /// far, the moment every rank has finished one (once), else `None`.
    pub fn epoch_done(&self, rank: u32, samples: u64) -> Option<u64> {
        let mut state = self.state.lock().ok()?;
        let (done, so_far) = &mut *state;
        *so_far += samples;
        if let Some(d) = done.get_mut(rank as usize) {
            *d = true;
        }
        let all = done.iter().all(|d| *d);
        (all && self.at.set((std::time::Instant::now(), *so_far)).is_ok()).then_some(*so_far)
    }

    /// Samples a second from then to `end`, when `total` (the run's samples) holds more than
    /// the first epochs did.
    pub fn rate_after(&self, end: std::time::Instant, total: u64) -> Option<f64> {
        let (at, before) = *self.at.get()?;
        let secs = end.saturating_duration_since(at).as_secs_f64();
        (total > before && secs > 0.0).then(|| (total - before) as f64 / secs)
    }
}

/// [`Bars`] that also note when every rank has finished its first epoch.
pub struct Paced<'a> {
    pub bars: &'a Bars,
    pub first: FirstEpochs,
}

impl Observer for Paced<'_> {
    fn epoch_started(&self, rank: u32, epoch: u64, batches: u64) {
        self.bars.epoch_started(rank, epoch, batches);
    }

    fn batch(&self, rank: u32, epoch: u64, stats: &StatsSnapshot) {
        self.bars.batch(rank, epoch, stats);
    }

    fn epoch_done(&self, rank: u32, epoch: u64, r: &EpochReport, secs: f64) {
        self.bars.epoch_done(rank, epoch, r, secs);
        self.first.epoch_done(rank, r.delivered + r.skipped);
    }
}
