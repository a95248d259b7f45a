//! Fair sharing of a worker's decode slots among the training jobs it serves.
//!
//! A worker decodes a few units at once (`limits.max_active_units`). Several jobs share it,
//! and one that asks for many units must not starve one that asks for few. [`FairQueue`] is
//! the rule, with no IO and no clock: stride scheduling over jobs, by the name their clients
//! give (every rank and epoch of a training job says the same). Each sample decoded charges
//! its job `STRIDE / weight`; a freed slot goes to the waiting job charged least, so busy
//! jobs get slots in proportion to their weights, and a job that waits for nothing takes
//! none: its share goes to the others. A job that starts asking again is charged at least
//! what the least-charged job still running or waiting was, so time spent idle earns no
//! burst later.
//!
//! [`super::Worker`] drives the rule for the worker's units: a unit holds a slot while it
//! decodes, gives it back while it waits for credit, and yields it after a sample whenever
//! another job waits, so shares hold sample by sample, not unit by unit. Units of one job
//! take the job's slots first come, first served.

use std::collections::{HashMap, VecDeque};

/// The charge of one sample at weight 1 (a weight-`w` job is charged `STRIDE / w`).
const STRIDE: u128 = 1 << 32;

/// The slots and who waits for them.
#[derive(Debug)]
pub struct FairQueue<W> {
    free: usize,
    jobs: HashMap<String, Tenant<W>>,
    /// Orders waiters: of jobs charged alike, the one waiting longest goes first.
    asked: u64,
}

#[derive(Debug)]
struct Tenant<W> {
    weight: u32,
    /// What its samples have been charged (stride scheduling's "pass").
    pass: u128,
    waiting: VecDeque<(u64, W)>,
    /// Slots its units hold.
    running: usize,
    /// Its jobs open on this worker's connections.
    open: usize,
}

impl<W> Tenant<W> {
    fn new(weight: u32) -> Self {
        Tenant {
            weight: weight.max(1),
            pass: 0,
            waiting: VecDeque::new(),
            running: 0,
            open: 0,
        }
    }

    fn active(&self) -> bool {
        self.running > 0 || !self.waiting.is_empty()
    }
}

impl<W> FairQueue<W> {
    pub fn new(slots: usize) -> Self {
        FairQueue {
            free: slots,
            jobs: HashMap::new(),
            asked: 0,
        }
    }

    /// A connection opened a job of `name`; `weight` (already capped) is its share from now.
    pub fn open(&mut self, name: &str, weight: u32) {
        let t = self.tenant(name);
        t.weight = weight.max(1);
        t.open += 1;
    }

    /// A job of `name` closed; the name is forgotten with its last job, unit and waiter.
    pub fn close(&mut self, name: &str) {
        if let Some(t) = self.jobs.get_mut(name) {
            t.open = t.open.saturating_sub(1);
        }
        self.forget_if_done(name);
    }

    /// `waiter` of job `name` asks for a slot: handed back when one is free now (and the job
    /// charged), else queued for [`FairQueue::release`].
    pub fn request(&mut self, name: &str, waiter: W) -> Option<W> {
        if self.free > 0 {
            // Free slots mean nobody waits: release hands a slot to a waiter before it frees it.
            self.free -= 1;
            self.grant(name);
            return Some(waiter);
        }
        let floor = self.floor();
        self.asked += 1;
        let asked = self.asked;
        let t = self.tenant(name);
        if !t.active() {
            // Back from idle: no credit for the time it asked for nothing.
            if let Some(floor) = floor {
                t.pass = t.pass.max(floor);
            }
        }
        t.waiting.push_back((asked, waiter));
        None
    }

    /// A unit of `name` gave its slot back: the waiter the slot goes to (its job charged),
    /// skipping waiters that gave up (`alive` false); `None` leaves the slot free.
    pub fn release(&mut self, name: &str, alive: impl Fn(&W) -> bool) -> Option<W> {
        if let Some(t) = self.jobs.get_mut(name) {
            t.running = t.running.saturating_sub(1);
        }
        self.forget_if_done(name);
        self.hand_on(alive)
    }

    /// A unit of `name` that holds a slot is about to decode another sample: it keeps the
    /// slot (and is charged) unless another job's waiter is queued, in which case it should
    /// [`FairQueue::requeue`] (`false`). Within a job, units run first come, first served:
    /// taking turns sample by sample would only finish each later, the one the client waits
    /// for included.
    pub fn keep(&mut self, name: &str) -> bool {
        if self
            .jobs
            .iter()
            .any(|(n, t)| n != name && !t.waiting.is_empty())
        {
            return false;
        }
        self.charge(name);
        true
    }

    /// A unit of `name` holding a slot offers it to whoever is charged least, itself
    /// (`waiter`) included: the waiter the slot goes to.
    pub fn requeue(&mut self, name: &str, waiter: W, alive: impl Fn(&W) -> bool) -> Option<W> {
        self.asked += 1;
        let asked = self.asked;
        let t = self.tenant(name);
        t.waiting.push_back((asked, waiter));
        t.running = t.running.saturating_sub(1);
        self.hand_on(alive)
    }

    /// Waiters queued, over every job.
    pub fn waiting(&self) -> usize {
        self.jobs.values().map(|t| t.waiting.len()).sum()
    }

    /// Waiters queued for job `name`.
    pub fn waiting_for(&self, name: &str) -> usize {
        self.jobs.get(name).map_or(0, |t| t.waiting.len())
    }

    /// Every job it knows of: its name, weight, slots its units hold and units waiting for
    /// one (what a job asks of the worker beside what it gets).
    pub fn jobs(&self) -> impl Iterator<Item = (&str, u32, usize, usize)> + '_ {
        self.jobs
            .iter()
            .map(|(n, t)| (n.as_str(), t.weight, t.running, t.waiting.len()))
    }

    /// The jobs with waiters queued, with their weights.
    pub fn backlogged(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.jobs
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty())
            .map(|(n, t)| (n.as_str(), t.weight))
    }

    fn hand_on(&mut self, alive: impl Fn(&W) -> bool) -> Option<W> {
        loop {
            let Some(name) = self
                .jobs
                .iter()
                .filter_map(|(n, t)| Some(((t.pass, t.waiting.front()?.0), n)))
                .min()
                .map(|(_, n)| n.clone())
            else {
                self.free += 1;
                return None;
            };
            let Some((_, waiter)) = self.jobs.get_mut(&name).and_then(|t| t.waiting.pop_front())
            else {
                continue;
            };
            if alive(&waiter) {
                self.grant(&name);
                return Some(waiter);
            }
            self.forget_if_done(&name);
        }
    }

    fn tenant(&mut self, name: &str) -> &mut Tenant<W> {
        self.jobs
            .entry(name.to_string())
            .or_insert_with(|| Tenant::new(1))
    }

    fn grant(&mut self, name: &str) {
        self.tenant(name).running += 1;
        self.charge(name);
    }

    fn charge(&mut self, name: &str) {
        if let Some(t) = self.jobs.get_mut(name) {
            t.pass += STRIDE / u128::from(t.weight);
        }
    }

    fn forget_if_done(&mut self, name: &str) {
        if self
            .jobs
            .get(name)
            .is_some_and(|t| t.open == 0 && !t.active())
        {
            self.jobs.remove(name);
        }
    }

    /// The least charge among the jobs that run or wait.
    fn floor(&self) -> Option<u128> {
        self.jobs
            .values()
            .filter(|t| t.active())
            .map(|t| t.pass)
            .min()
    }
}

#[cfg(test)]
#[path = "fair_tests.rs"]
mod tests;
