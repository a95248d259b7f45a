//! A unit on a thread of its own, driven by a [`Worker`] behind a lock: the loop the daemon's
//! and the client's in-process units share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Gate, UnitId, Waiting, Wake, Worker};
use crate::message::{Assign, Message, UnitFailed};
use crate::runner::{drive_unit, Charge, Output, Turn, UnitEnd};

/// Where a unit's thread waits for its [`Wake::Resume`] or [`Wake::Stop`]. A wake that comes
/// before the wait is kept, so none is lost; a spurious one only makes the unit ask again.
#[derive(Debug, Default)]
pub struct Parker {
    woken: Mutex<bool>,
    signal: Condvar,
    /// The unit's job is gone: it sends nothing more.
    stopped: AtomicBool,
}

impl Parker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The unit's job is gone: wakes it to end.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.unpark();
    }

    /// Whether [`Parker::stop`] was called: forward nothing more.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn unpark(&self) {
        *self.woken.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.signal.notify_one();
    }

    pub fn park(&self) {
        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        while !*woken {
            woken = self.signal.wait(woken).unwrap_or_else(|e| e.into_inner());
        }
        *woken = false;
    }
}

fn lock<L>(worker: &Mutex<Worker<L>>) -> MutexGuard<'_, Worker<L>> {
    worker.lock().unwrap_or_else(|e| e.into_inner())
}

/// A unit to run on this thread: `runner` decodes `assign` as unit `id` of `worker`.
pub struct UnitThread<'a, L> {
    pub worker: &'a Mutex<Worker<L>>,
    pub id: UnitId,
    /// Unparked by the shell on the unit's [`Wake::Resume`] and [`Wake::Stop`].
    pub parker: &'a Parker,
    pub runner: &'a dyn crate::runner::JobRunner,
    pub assign: &'a Assign,
}

impl<L: Clone> UnitThread<'_, L> {
    /// Runs the unit, blocking. Before each sample the worker's gate says whether it may go
    /// (the thread waits on the parker until it may, and `waited` hears for how long and
    /// why); `forward` hands each output on (`false` stops the unit); `wake` carries out the
    /// wakes each call made (other units given the slot this one let go). Returns the frame
    /// that ends the unit if its job is still open: send it, then report
    /// [`Worker::finished`].
    pub fn run(
        self,
        forward: impl FnMut(Output) -> bool,
        wake: impl Fn(Vec<Wake<L>>),
        waited: impl Fn(Waiting, Duration),
    ) -> Option<Message> {
        let UnitThread {
            worker,
            id,
            parker,
            runner,
            assign,
        } = self;
        // The unit's turn on the decode slots, for a runner that decodes ahead: paused while
        // it waits for a slot.
        let turn = Turn::default();
        let take_credit = |charge: Charge| loop {
            let (gate, wakes) = {
                let mut w = lock(worker);
                let gate = match charge {
                    Charge::Decoded => w.next_sample(id),
                    Charge::Shared => w.next_shared(id),
                };
                (gate, w.take_wakes())
            };
            wake(wakes);
            match gate {
                Gate::Go => {
                    turn.resume();
                    return true;
                }
                Gate::Stop => {
                    turn.resume();
                    return false;
                }
                Gate::Wait(why) => {
                    if why == Waiting::Slot {
                        turn.pause();
                    }
                    let since = Instant::now();
                    parker.park();
                    waited(why, since.elapsed());
                }
            }
        };
        // A runner that panics fails its unit, not the worker: the slot it holds goes back and
        // the client moves the unit elsewhere.
        let run = std::panic::AssertUnwindSafe(|| {
            drive_unit(runner, assign, &turn, take_credit, forward)
        });
        let end = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            UnitEnd::Failed(UnitFailed {
                job: assign.job,
                unit: assign.unit,
                attempt: assign.attempt,
                error: format!("the worker's decoder panicked on this unit: {why}"),
            })
        });
        let (frame, wakes) = {
            let mut w = lock(worker);
            (w.unit_ended(id, end), w.take_wakes())
        };
        wake(wakes);
        frame
    }
}
