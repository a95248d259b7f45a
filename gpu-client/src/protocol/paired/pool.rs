//! The paired simulation's pool as it changes: workers join, leave (drained), are killed and
//! restart, stall, drain for SIGTERM, and connections are cut on the client's side.

use std::time::Duration;

use super::workers::SimWorker;
use super::{Link, Sim, MAX_WORKERS};

impl Sim {
    /// Now and then: a worker joins, leaves (drained), is killed (and restarts later),
    /// stalls, or drains for SIGTERM and exits.
    pub(super) fn change_pool(&mut self) {
        let live = |s: &Sim| s.workers.iter().filter(|w| w.alive && !w.left).count();
        let event = self.rng.below(3000);
        match event {
            0 if self.workers.len() < MAX_WORKERS => {
                let worker = SimWorker::new(&mut self.rng);
                self.workers.push(worker);
                let w = self.workers.len() - 1;
                for j in 0..self.jobs.len() {
                    let l = self.jobs[j].protocol.join(format!("w{w}"));
                    assert_eq!(l, self.jobs[j].links.len());
                    self.jobs[j].links.push(Link::new(w));
                }
                self.tally.joined += 1;
            }
            1..=4 if live(self) > 1 => {
                let w = self.pick(|w| w.alive && !w.left);
                match event {
                    1 => self.tally.left += 1,
                    2 => self.tally.drained += 1,
                    3 => self.tally.killed += 1,
                    _ => self.tally.stalled += 1,
                }
                match event {
                    1 => self.leave(w),
                    2 => {
                        // SIGTERM on a worker leaving the pool: it drains, then exits.
                        self.leave(w);
                        self.workers[w].rules.drain();
                        let draining = (0..self.conns.len()).filter(|&c| self.conns[c].worker == w);
                        for c in draining.collect::<Vec<_>>() {
                            if !self.conns[c].worker_closed {
                                self.worker_effects(c);
                            }
                        }
                    }
                    3 => self.kill(w),
                    _ => {
                        let pause = Duration::from_millis(self.rng.below(15_000));
                        self.workers[w].stalled_until = Some(self.now + pause);
                    }
                }
            }
            5..=7 => {
                // The client's side of a connection fails (a reset, a read error) while its
                // worker runs on: the worker notices when it next reads.
                let live: Vec<(usize, usize)> = (0..self.jobs.len())
                    .flat_map(|j| (0..self.jobs[j].links.len()).map(move |l| (j, l)))
                    .filter(|&(j, l)| self.jobs[j].links[l].conn.is_some())
                    .collect();
                if !live.is_empty() {
                    let (j, l) = live[self.rng.below(live.len() as u64) as usize];
                    self.tally.cut += 1;
                    self.lose(j, l, "the connection was cut".into());
                }
            }
            8..=12 => {
                // A killed worker still in the pool comes back (a restarted process).
                if let Some(w) = (0..self.workers.len())
                    .find(|&w| !self.workers[w].alive && !self.workers[w].left)
                {
                    let fresh = SimWorker::new(&mut self.rng);
                    self.workers[w] = fresh;
                }
            }
            _ => {}
        }
    }

    fn pick(&mut self, f: impl Fn(&SimWorker) -> bool) -> usize {
        let eligible: Vec<usize> = (0..self.workers.len())
            .filter(|&w| f(&self.workers[w]))
            .collect();
        eligible[self.rng.below(eligible.len() as u64) as usize]
    }

    /// Worker `w` leaves the pool: every job drains its link to it.
    fn leave(&mut self, w: usize) {
        self.workers[w].left = true;
        let now = self.at();
        for j in 0..self.jobs.len() {
            let l = self.jobs[j]
                .links
                .iter()
                .position(|l| l.worker == w)
                .expect("a link to every worker");
            self.jobs[j].protocol.leave(l, now);
            self.act(j);
        }
    }

    /// Worker `w`'s process dies: nothing it had in flight arrives, and its clients hear
    /// nothing more (they notice by silence).
    fn kill(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        worker.alive = false;
        worker.running.clear();
        worker.parked.clear();
        for conn in self.conns.iter_mut().filter(|c| c.worker == w) {
            conn.to_client.clear();
            conn.to_worker.clear();
            conn.worker_closed = true;
            conn.client_closed = false;
        }
    }
}
