use super::*;

/// Units of several jobs on `slots` slots, step by step: a running unit decodes a sample,
/// then keeps its slot or gives it back and queues again, as the worker's units do. Returns
/// the samples each job decoded.
struct Sim {
    queue: FairQueue<(String, u32)>,
    running: VecDeque<(String, u32)>,
    samples: HashMap<String, u64>,
    /// Jobs whose samples are copied from another job's decodes (a sweep's).
    shared: Vec<String>,
}

impl Sim {
    fn new(slots: usize) -> Self {
        Sim {
            queue: FairQueue::new(slots),
            running: VecDeque::new(),
            samples: HashMap::new(),
            shared: Vec::new(),
        }
    }

    /// `units` units of job `name` ask for slots.
    fn start(&mut self, name: &str, weight: u32, units: u32) {
        self.queue.open(name, weight);
        self.ask(name, units);
    }

    /// `units` units of job `name` of tenant `group` (weight `group_weight`) ask for slots.
    fn start_in(&mut self, group: &str, group_weight: u32, name: &str, weight: u32, units: u32) {
        self.queue.open_in(group, group_weight, name, weight);
        self.ask(name, units);
    }

    fn ask(&mut self, name: &str, units: u32) {
        for u in 0..units {
            if let Some(w) = self.queue.request(name, (name.to_string(), u)) {
                self.running.push_back(w);
            }
        }
    }

    fn run(&mut self, samples: u64) -> HashMap<String, u64> {
        let mut got = HashMap::new();
        for _ in 0..samples {
            let Some((name, u)) = self.running.pop_front() else {
                panic!("no unit runs: slots leaked");
            };
            *got.entry(name.clone()).or_insert(0) += 1;
            *self.samples.entry(name.clone()).or_insert(0) += 1;
            if self.shared.contains(&name) {
                self.queue.served_shared(&name);
            }
            if self.queue.keep(&name) {
                self.running.push_back((name, u));
                continue;
            }
            if let Some(next) = self.queue.requeue(&name.clone(), (name, u), |_| true) {
                self.running.push_back(next);
            }
        }
        got
    }
}

fn share(got: &HashMap<String, u64>, name: &str) -> f64 {
    let total: u64 = got.values().sum();
    got.get(name).copied().unwrap_or(0) as f64 / total as f64
}

#[test]
fn a_greedy_job_does_not_starve_a_light_one() {
    let mut sim = Sim::new(2);
    sim.start("greedy", 1, 16);
    sim.start("light", 1, 1);
    let got = sim.run(10_000);
    let light = share(&got, "light");
    assert!((0.49..=0.51).contains(&light), "light job's share {light}");
}

#[test]
fn weights_set_the_shares() {
    let mut sim = Sim::new(4);
    sim.start("three", 3, 4);
    sim.start("one", 1, 8);
    let got = sim.run(20_000);
    let three = share(&got, "three");
    assert!((0.74..=0.76).contains(&three), "weight 3 of 4: {three}");
}

#[test]
fn a_job_alone_takes_every_slot_and_a_later_one_gets_its_share_at_once() {
    let mut sim = Sim::new(2);
    sim.start("a", 1, 4);
    assert_eq!(share(&sim.run(1_000), "a"), 1.0);
    sim.start("b", 1, 4);
    // No burst for b (it was not owed the time it did not wait), and no wait either.
    let next = sim.run(60);
    let b = share(&next, "b");
    assert!(
        (0.4..=0.6).contains(&b),
        "the newcomer's share of the next 60: {b}"
    );
    sim.start("c", 2, 4);
    let got = sim.run(4_000);
    let c = share(&got, "c");
    assert!((0.48..=0.52).contains(&c), "weight 2 of 4: {c}");
}

#[test]
fn units_of_one_job_run_first_come_first_served() {
    let mut queue: FairQueue<u32> = FairQueue::new(1);
    queue.open("a", 1);
    assert_eq!(queue.request("a", 1), Some(1));
    assert_eq!(queue.request("a", 2), None);
    // Only its own job waits: unit 1 keeps the slot to its end.
    assert!(queue.keep("a"));
    assert!(queue.keep("a"));
    assert_eq!(queue.release("a", |_| true), Some(2));
    // Another job's waiter makes the running unit offer its slot.
    queue.open("b", 1);
    assert_eq!(queue.request("b", 3), None);
    assert!(!queue.keep("a"));
}

#[test]
fn a_job_that_stops_asking_leaves_its_share_to_the_others() {
    let mut queue: FairQueue<u32> = FairQueue::new(1);
    queue.open("a", 1);
    queue.open("b", 1);
    assert_eq!(queue.request("a", 1), Some(1));
    assert_eq!(queue.request("b", 2), None);
    assert_eq!(queue.request("a", 3), None);
    // b is charged least; a's next waiter after it.
    assert_eq!(queue.release("a", |_| true), Some(2));
    // A waiter that gave up is skipped, and with nobody left the slot is free.
    assert_eq!(queue.release("b", |&w| w != 3), None);
    assert_eq!(queue.waiting(), 0);
    assert_eq!(queue.request("b", 4), Some(4));
    assert_eq!(queue.release("b", |_| true), None);
    queue.close("a");
    queue.close("b");
    assert!(queue.jobs.is_empty(), "closed jobs are forgotten");
    assert!(queue.groups.is_empty(), "and their groups");
}

/// The sum of the shares of every job whose name starts with `prefix`.
fn share_of(got: &HashMap<String, u64>, prefix: &str) -> f64 {
    got.keys()
        .filter(|n| n.starts_with(prefix))
        .map(|n| share(got, n))
        .sum()
}

#[test]
fn a_tenant_gets_its_share_however_many_jobs_it_opens() {
    // alpha (weight 8) with one job, beta (weight 2) with four: 0.8 / 0.2, as with one each.
    let mut sim = Sim::new(1);
    sim.start_in("alpha", 8, "alpha/a", 8, 4);
    for j in 0..4 {
        sim.start_in("beta", 2, &format!("beta/{j}"), 2, 4);
    }
    let got = sim.run(20_000);
    let alpha = share_of(&got, "alpha/");
    assert!((0.79..=0.81).contains(&alpha), "alpha's share {alpha}");
    // Beta's share is split among its jobs by their weights (here alike).
    for j in 0..4 {
        let s = share(&got, &format!("beta/{j}"));
        assert!((0.045..=0.055).contains(&s), "beta/{j}: {s}");
    }
    // A third tenant joining at weight 10 takes half; the others keep their ratio.
    sim.start_in("gamma", 10, "gamma/x", 1, 4);
    let got = sim.run(20_000);
    let (alpha, beta, gamma) = (
        share_of(&got, "alpha/"),
        share_of(&got, "beta/"),
        share_of(&got, "gamma/"),
    );
    assert!((0.49..=0.51).contains(&gamma), "gamma {gamma}");
    assert!((0.39..=0.41).contains(&alpha), "alpha {alpha}");
    assert!((0.09..=0.11).contains(&beta), "beta {beta}");
}

#[test]
fn a_job_s_weight_orders_it_only_among_its_tenant_s_jobs() {
    let mut sim = Sim::new(2);
    sim.start_in("t", 4, "t/heavy", 3, 4);
    sim.start_in("t", 4, "t/light", 1, 4);
    sim.start_in("u", 4, "u/one", 1, 4);
    let got = sim.run(20_000);
    let (heavy, light, one) = (
        share(&got, "t/heavy"),
        share(&got, "t/light"),
        share(&got, "u/one"),
    );
    assert!(
        (0.49..=0.51).contains(&one),
        "u's one job keeps its tenant's half: {one}"
    );
    assert!((0.37..=0.38).contains(&heavy), "3 of t's 4: {heavy}");
    assert!((0.12..=0.13).contains(&light), "1 of t's 4: {light}");
}

#[test]
fn a_sweep_is_charged_the_decodes_it_cost_not_its_samples() {
    // Team sweep runs four jobs of one sweep: one decodes each sample, three copy it. Team
    // solo runs one job. Equal weights share the worker's time, so the sweep gets about one
    // decode for each of solo's, and four samples for it.
    let mut sim = Sim::new(1);
    for j in 0..4 {
        sim.start_in("sweep", 1, &format!("sweep/{j}"), 1, 2);
    }
    sim.start_in("solo", 1, "solo/x", 1, 2);
    sim.shared = (1..4).map(|j| format!("sweep/{j}")).collect();
    let got = sim.run(40_000);
    let n = |name: &str| got.get(name).copied().unwrap_or(0) as f64;
    let sweep_work = n("sweep/0") + (n("sweep/1") + n("sweep/2") + n("sweep/3")) / 32.0;
    let solo = n("solo/x") / (n("solo/x") + sweep_work);
    assert!(
        (0.45..=0.55).contains(&solo),
        "solo's share of the decodes: {solo}"
    );
    let samples = share_of(&got, "sweep/");
    assert!(samples > 0.7, "the sweep's share of the samples: {samples}");
}
