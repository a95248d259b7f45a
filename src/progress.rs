//! Progress bars for the dataset tools (`sluice_dataset::Progress`): samples/s and MB/s on a
//! terminal, nothing when stderr is not one (CI logs, pipes).

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar that counts samples and bytes.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    bytes: u64,
}

impl Progress {
    /// `total`: samples expected, when known.
    pub fn new(total: Option<u64>, what: &str) -> Self {
        let bar = match total {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::new_spinner(),
        };
        let template = match total {
            Some(_) => {
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} samples, {per_sec}, {msg}"
            }
            None => "{prefix} [{elapsed_precise}] {spinner} {pos} samples, {per_sec}, {msg}",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_prefix(what.to_string());
        Progress {
            bar,
            started: Instant::now(),
            bytes: 0,
        }
    }

    pub fn add(&mut self, samples: u64, bytes: u64) {
        self.bytes += bytes;
        self.bar.inc(samples);
        let secs = self.started.elapsed().as_secs_f64().max(1e-6);
        self.bar
            .set_message(format!("{:.1} MB/s", self.bytes as f64 / secs / 1e6));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Seconds since the bar started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl sluice_dataset::Progress for Progress {
    fn add(&mut self, samples: u64, bytes: u64) {
        Progress::add(self, samples, bytes);
    }

    fn note(&mut self, message: &str) {
        self.bar.suspend(|| eprintln!("note: {message}"));
    }
}
