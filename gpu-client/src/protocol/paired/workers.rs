//! The paired simulation's worker processes: the real worker rules
//! (`sluice_wire::session::Worker`) with units that decode one output per step on the slots
//! it grants.

use std::collections::HashMap;
use std::time::Duration;

use sluice_plan::rng::Stream;
use sluice_wire::session::{ConnId, Rules, UnitId, Wake, Worker};
use sluice_wire::{Assign, Welcome};

use super::{HEARTBEAT, SILENCE};

/// A unit on a simulated worker thread: what the worker registered, and its next sample.
#[derive(Clone, Debug)]
pub(super) struct SimUnit {
    pub(super) id: UnitId,
    pub(super) conn: ConnId,
    pub(super) assign: Assign,
}

pub(super) struct Running {
    pub(super) unit: SimUnit,
    pub(super) next: u64,
    pub(super) stopped: bool,
    /// It holds a slot (a unit stopped while it waited holds none: it only ends).
    pub(super) holds: bool,
}

/// One worker process.
pub(super) struct SimWorker {
    pub(super) rules: Worker<SimUnit>,
    pub(super) slots: usize,
    pub(super) alive: bool,
    /// Frozen until then (no step, no frame, no heartbeat).
    pub(super) stalled_until: Option<Duration>,
    /// It left the pool (every job was told).
    pub(super) left: bool,
    /// Units holding a slot, and those waiting (parked) for a slot or a credit.
    pub(super) running: Vec<Running>,
    pub(super) parked: HashMap<UnitId, Running>,
}

impl SimWorker {
    pub(super) fn new(rng: &mut Stream) -> Self {
        let slots = 1 + rng.below(3) as usize;
        SimWorker {
            rules: Worker::new(rules(), slots),
            slots,
            alive: true,
            stalled_until: None,
            left: false,
            running: Vec::new(),
            parked: HashMap::new(),
        }
    }

    pub(super) fn active(&self, now: Duration) -> bool {
        self.alive && self.stalled_until.is_none_or(|t| now >= t)
    }

    /// Carries out the worker's wakes.
    pub(super) fn wake(&mut self) {
        for w in self.rules.take_wakes() {
            match w {
                Wake::Start(unit) => {
                    let next = unit.assign.start;
                    self.running.push(Running {
                        unit,
                        next,
                        stopped: false,
                        holds: true,
                    });
                }
                Wake::Resume(unit) => {
                    let mut r = self.parked.remove(&unit.id).expect("a resumed unit waited");
                    r.holds = true;
                    self.running.push(r);
                }
                Wake::Stop(unit) => {
                    if let Some(mut r) = self.parked.remove(&unit.id) {
                        r.stopped = true;
                        r.holds = false;
                        self.running.push(r);
                    }
                    for r in self.running.iter_mut().filter(|r| r.unit.id == unit.id) {
                        r.stopped = true;
                    }
                }
            }
        }
    }
}

fn rules() -> Rules {
    Rules {
        max_job_weight: 8,
        heartbeat: HEARTBEAT,
        client_silence: SILENCE,
        ..Rules::new(Some("t".into()), Welcome::named("sim"))
    }
}
