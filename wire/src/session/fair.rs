//! Fair sharing of a worker's decode slots among the teams and training jobs it serves.
//!
//! A worker decodes a few units at once (`limits.max_active_units`). Several jobs share it,
//! and one that asks for many units must not starve one that asks for few. [`FairQueue`] is
//! the rule, with no IO and no clock: stride scheduling in two levels. Jobs belong to a
//! group: their tenant (team), or, without tenants, each job its own group. Each sample
//! decoded charges its group `STRIDE / group weight` and its job `STRIDE / job weight`; a
//! freed slot goes to the waiting group charged least, and within it to the waiting job
//! charged least. So busy groups get slots in proportion to their weights however many jobs
//! each opens (a team cannot multiply its share by opening more jobs), a group's share is
//! split among its busy jobs by their weights, and one that waits for nothing takes none:
//! its share goes to the others. A group or job that starts asking again is charged at least
//! what the least-charged one still running or waiting was (among groups, or among its
//! group's jobs), so time spent idle earns no burst later.
//!
//! Jobs are known by the name their clients give (every rank and epoch of a training job says
//! the same).
//!
//! [`super::Worker`] drives the rule for the worker's units: a unit holds a slot while it
//! decodes, gives it back while it waits for credit, and yields it after a sample whenever
//! another job waits, so shares hold sample by sample, not unit by unit. Units of one job
//! take the job's slots first come, first served.

use std::collections::{HashMap, VecDeque};

/// The charge of one sample at weight 1 (a weight-`w` job is charged `STRIDE / w`).
const STRIDE: u128 = 1 << 32;

/// The charge of a sample served from a decode made for another job of its sweep: the copy
/// it costs, about a thirtieth of a decode (a 150 KB copy against decoding a JPEG).
const SHARED: u128 = STRIDE / 32;

/// The slots and who waits for them.
#[derive(Debug)]
pub struct FairQueue<W> {
    free: usize,
    groups: HashMap<String, Group>,
    jobs: HashMap<String, Tenant<W>>,
    /// Orders waiters: of jobs charged alike, the one waiting longest goes first.
    asked: u64,
}

/// A group of jobs (a tenant, or one job alone) and what its samples have been charged.
#[derive(Debug)]
struct Group {
    weight: u32,
    pass: u128,
    /// Its jobs known to the queue.
    jobs: usize,
}

#[derive(Debug)]
struct Tenant<W> {
    group: String,
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
    fn active(&self) -> bool {
        self.running > 0 || !self.waiting.is_empty()
    }
}

impl<W> FairQueue<W> {
    pub fn new(slots: usize) -> Self {
        FairQueue {
            free: slots,
            groups: HashMap::new(),
            jobs: HashMap::new(),
            asked: 0,
        }
    }

    /// A connection opened a job of `name`, a group of its own; `weight` (already capped) is
    /// its share from now.
    pub fn open(&mut self, name: &str, weight: u32) {
        self.open_in(name, weight, name, weight);
    }

    /// A connection opened a job of `name` in `group` (its tenant): `group_weight` is the
    /// group's share against other groups, `weight` the job's within its group.
    pub fn open_in(&mut self, group: &str, group_weight: u32, name: &str, weight: u32) {
        self.group(group).weight = group_weight.max(1);
        let t = self.tenant(name, group);
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
        self.wait(name, waiter);
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
        let t = self.tenant(name, name);
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

    /// Queues `waiter` of `name`, charging a job or group back from idle at least the least
    /// charge of those that run or wait beside it.
    fn wait(&mut self, name: &str, waiter: W) {
        self.asked += 1;
        let asked = self.asked;
        let group = self.jobs.get(name).map_or(name, |t| t.group.as_str());
        let group = group.to_string();
        if !self.group_active(&group) {
            if let Some(floor) = self.group_floor() {
                let g = self.group(&group);
                g.pass = g.pass.max(floor);
            }
        }
        let floor = self.job_floor(&group);
        let t = self.tenant(name, &group);
        if !t.active() {
            if let Some(floor) = floor {
                t.pass = t.pass.max(floor);
            }
        }
        t.waiting.push_back((asked, waiter));
    }

    fn hand_on(&mut self, alive: impl Fn(&W) -> bool) -> Option<W> {
        loop {
            let Some(name) = self.next_waiter() else {
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

    /// The job whose waiter goes next: of the groups with waiters, the one charged least
    /// (then the one waiting longest); of its jobs with waiters, likewise.
    fn next_waiter(&self) -> Option<String> {
        let mut best: HashMap<&str, (u64, &str)> = HashMap::new();
        for (n, t) in &self.jobs {
            let Some(&(asked, _)) = t.waiting.front() else {
                continue;
            };
            let e = best.entry(t.group.as_str()).or_insert((asked, n));
            e.0 = e.0.min(asked);
        }
        let group = best
            .iter()
            .map(|(g, (asked, _))| {
                let pass = self.groups.get(*g).map_or(0, |g| g.pass);
                ((pass, *asked), *g)
            })
            .min()?
            .1;
        self.jobs
            .iter()
            .filter(|(_, t)| t.group == group)
            .filter_map(|(n, t)| Some(((t.pass, t.waiting.front()?.0), n)))
            .min()
            .map(|(_, n)| n.clone())
    }

    fn group(&mut self, group: &str) -> &mut Group {
        new_group(&mut self.groups, group)
    }

    /// Job `name`, known in `group` when it is new.
    fn tenant(&mut self, name: &str, group: &str) -> &mut Tenant<W> {
        let groups = &mut self.groups;
        self.jobs.entry(name.to_string()).or_insert_with(|| {
            new_group(groups, group).jobs += 1;
            Tenant {
                group: group.to_string(),
                weight: 1,
                pass: 0,
                waiting: VecDeque::new(),
                running: 0,
                open: 0,
            }
        })
    }

    fn grant(&mut self, name: &str) {
        self.tenant(name, name).running += 1;
        self.charge(name);
    }

    /// A sample of `name`, charged as a decode when it was let go, was copied from a decode
    /// made for another job of its sweep: the difference is given back, so a sweep's jobs are
    /// charged, between them, about one decode a sample, as the worker spent.
    pub fn served_shared(&mut self, name: &str) {
        let Some(t) = self.jobs.get_mut(name) else {
            return;
        };
        t.pass = t
            .pass
            .saturating_sub((STRIDE - SHARED) / u128::from(t.weight));
        if let Some(g) = self.groups.get_mut(&t.group) {
            g.pass = g
                .pass
                .saturating_sub((STRIDE - SHARED) / u128::from(g.weight));
        }
    }

    /// A unit of `name` that holds a slot sends a sample copied from a decode made for another
    /// job of its sweep: it keeps the slot (a copy is no decode to take turns for) and its job
    /// is charged the copy.
    pub fn copied(&mut self, name: &str) {
        self.charge(name);
        self.served_shared(name);
    }

    fn charge(&mut self, name: &str) {
        let Some(t) = self.jobs.get_mut(name) else {
            return;
        };
        t.pass += STRIDE / u128::from(t.weight);
        if let Some(g) = self.groups.get_mut(&t.group) {
            g.pass += STRIDE / u128::from(g.weight);
        }
    }

    fn forget_if_done(&mut self, name: &str) {
        let Some(t) = self.jobs.get(name) else {
            return;
        };
        if t.open > 0 || t.active() {
            return;
        }
        let group = t.group.clone();
        self.jobs.remove(name);
        if let Some(g) = self.groups.get_mut(&group) {
            g.jobs = g.jobs.saturating_sub(1);
            if g.jobs == 0 {
                self.groups.remove(&group);
            }
        }
    }

    fn group_active(&self, group: &str) -> bool {
        self.jobs.values().any(|t| t.group == group && t.active())
    }

    /// The least charge among the groups that run or wait.
    fn group_floor(&self) -> Option<u128> {
        self.groups
            .iter()
            .filter(|(g, _)| self.group_active(g))
            .map(|(_, g)| g.pass)
            .min()
    }

    /// The least charge among `group`'s jobs that run or wait.
    fn job_floor(&self, group: &str) -> Option<u128> {
        self.jobs
            .values()
            .filter(|t| t.group == group && t.active())
            .map(|t| t.pass)
            .min()
    }
}

/// `group` of `groups`, made (weight 1, nothing charged) when it is new.
fn new_group<'a>(groups: &'a mut HashMap<String, Group>, group: &str) -> &'a mut Group {
    groups.entry(group.to_string()).or_insert(Group {
        weight: 1,
        pass: 0,
        jobs: 0,
    })
}

#[cfg(test)]
#[path = "fair_tests.rs"]
mod tests;
