//! Values that belong to the process that made them.
//!
//! A loader owns threads (its runtime, its decode pool) and locks they may hold. A child
//! forked from the process that made it (a DataLoader worker under the "fork" start method,
//! `multiprocessing`, `os.fork`) has a copy of the loader's memory but none of those threads:
//! tearing the loader down there joins threads that do not exist and takes locks that nobody
//! will release. So in a forked child a [`ForkSafe`] value is never dropped (its memory goes
//! with the child), and using it is an error naming the fix.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

/// `T`, dropped only in the process that made it.
pub struct ForkSafe<T> {
    value: ManuallyDrop<T>,
    pid: u32,
}

impl<T> ForkSafe<T> {
    pub fn new(value: T) -> Self {
        ForkSafe {
            value: ManuallyDrop::new(value),
            pid: std::process::id(),
        }
    }

    /// The process that made the value, when this is another one (a forked child).
    pub fn forked_from(&self) -> Option<u32> {
        (std::process::id() != self.pid).then_some(self.pid)
    }
}

impl<T> Deref for ForkSafe<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for ForkSafe<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if self.forked_from().is_none() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}
