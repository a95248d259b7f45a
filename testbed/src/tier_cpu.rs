//! CPU time by tier when the tiers share one process (`sluice bench chain` in process): each
//! thread's user + system time from `/proc/self/task/*/stat`, put to a tier by the thread's
//! name. Wall-clock rates on shared cores can say anything (another process, the other tiers);
//! the CPU a tier spends per delivered sample holds whatever else runs on the machine.
//!
//! Threads come and go (a loader's runtime ends with its epoch run), so the caller samples
//! every fraction of a second while the run goes on: a thread counts from its first sample
//! (from 0 if it started after the first) to its last.

use std::collections::{BTreeMap, HashMap};

/// The tiers, in the order they are printed.
pub const TIERS: [&str; 6] = [
    "storage",
    "worker decode",
    "worker transport",
    "client",
    "consumers",
    "other",
];

/// The decoders' tier, and the tiers whose work is not decoding (the non-decode CPU that
/// `sluice bench chain` sets beside the decoders').
pub const DECODE: &str = "worker decode";
pub const NOT_DECODING: [&str; 3] = ["storage", "worker transport", "client"];

/// The tier a thread works for, by the name its runtime or pool gives it.
///
/// reqwest's blocking client runs its requests on a thread of its own, which it names
/// `reqwest-internal-sync-runtime` (`reqwest-interna` in `/proc`, which keeps 15 bytes of a
/// name) whoever made the client. While the chain runs in process, that thread is the
/// workers' shard source reading from storage: the workers' work, not decoding, so it counts
/// with their transport. As "other" it had left 16-23 µs a sample of the non-decode work out
/// of `bench chain`'s share here.
pub fn tier(thread: &str) -> &'static str {
    if thread.starts_with("sluice-storage") {
        "storage"
    } else if thread.starts_with("sluice-decode") {
        "worker decode"
    } else if thread.starts_with("sluice-tiers")
        || thread.starts_with("sluice-cpu")
        || thread.starts_with("reqwest-")
    {
        "worker transport"
    } else if thread.starts_with("sluice-client") {
        "client"
    } else if thread.starts_with("sluice-rank") {
        "consumers"
    } else {
        "other"
    }
}

/// The process's threads' CPU time since the first [`ThreadCpu::sample`].
#[derive(Default)]
pub struct ThreadCpu {
    /// Per thread id: its tier, its CPU seconds when first seen (0 for a thread started
    /// after the first sample) and when last seen.
    threads: HashMap<u32, (&'static str, f64, f64)>,
    samples: u32,
}

impl ThreadCpu {
    /// A tally starting now.
    pub fn start() -> ThreadCpu {
        let mut t = ThreadCpu::default();
        t.sample();
        t
    }

    /// Reads every thread's CPU time once more.
    pub fn sample(&mut self) {
        let first = self.samples == 0;
        self.samples += 1;
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue; // the thread ended meanwhile
            };
            let Some((name, secs)) = parse_stat(&stat) else {
                continue;
            };
            let entry = self.threads.entry(tid).or_insert((
                tier(name),
                if first { secs } else { 0.0 },
                secs,
            ));
            entry.2 = secs;
        }
    }

    /// CPU seconds by tier (every one of [`TIERS`]) between the first sample and each
    /// thread's last.
    pub fn by_tier(&self) -> BTreeMap<&'static str, f64> {
        let mut out: BTreeMap<&'static str, f64> = TIERS.iter().map(|t| (*t, 0.0)).collect();
        for (tier, first, last) in self.threads.values() {
            *out.entry(tier).or_default() += (last - first).max(0.0);
        }
        out
    }
}

/// A thread's name and user + system CPU seconds from its `stat` line: `tid (name) state
/// ...`, utime and stime the 14th and 15th fields, in clock ticks. The name may hold spaces
/// and parentheses, so the fields are counted from its last `)`.
fn parse_stat(stat: &str) -> Option<(&str, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_ascii_whitespace();
    // After the name: state (3rd field) … utime (14th), stime (15th).
    let utime: f64 = rest.nth(11)?.parse().ok()?;
    let stime: f64 = rest.next()?.parse().ok()?;
    Some((name, (utime + stime) / ticks_per_second()))
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_the_name() {
        let line = "4242 (sluice-decode (1) x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        let (name, secs) = parse_stat(line).unwrap();
        assert_eq!(name, "sluice-decode (1) x");
        assert!((secs - 300.0 / ticks_per_second()).abs() < 1e-9);
        assert_eq!(tier(name), "worker decode");
        // The workers' shard reads (reqwest's blocking client names its thread so).
        assert_eq!(tier("reqwest-interna"), "worker transport");
    }

    #[test]
    fn a_busy_named_thread_is_counted_to_its_tier() {
        let mut cpu = ThreadCpu::start();
        let spin = std::thread::Builder::new()
            .name("sluice-client-test".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                let mut x = 0u64;
                while t.elapsed().as_millis() < 600 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            })
            .unwrap();
        // Read while it still runs: what a thread does after its last reading is not seen.
        std::thread::sleep(std::time::Duration::from_millis(300));
        cpu.sample();
        spin.join().unwrap();
        let by = cpu.by_tier();
        assert!(by["client"] > 0.01, "{by:?}");
        assert!(by["worker decode"] < 0.05, "{by:?}");
    }
}
