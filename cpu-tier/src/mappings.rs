//! Clients' segments as the worker maps them, kept a while after their connection ends.
//!
//! A loader keeps its segments (sample slots, batch arena) across its connections and sends
//! the same memfds again for its next epoch. A fresh mapping of a file whose pages exist
//! costs a page fault per page at first touch: for a 224² sample, 37 of them, more than the
//! copy they guard (`sluice bench transport` spent 30% of the worker's time in them). So a
//! segment a connection mapped stays mapped for [`KEEP_IDLE`] after its last user is gone,
//! and a later attach of the same file (the same inode, which the kept descriptor keeps from
//! being reused) and the same layout takes that mapping again. Nothing kept outlives
//! `KEEP_IDLE` idle, and a segment whose client process has exited goes at the first sweep
//! after its last connection: a client that left does not keep its memory alive through the
//! worker.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_wire::shm::{ProcessWatch, Segment, ShmError};

/// How long a segment no connection uses stays mapped.
pub(crate) const KEEP_IDLE: Duration = Duration::from_secs(10);

/// A mapped segment's file and layout: (device, inode, slots, slot bytes).
type Key = (u64, u64, u32, u64);

struct Kept {
    key: Key,
    segment: Arc<Segment>,
    /// When the last connection using it ended, as a sweep saw it.
    idle_since: Option<Instant>,
    /// The client process that attached it last (`None`: it could not be watched).
    owner: Option<ProcessWatch>,
}

/// The segments this worker has mapped (see the module documentation).
#[derive(Default)]
pub(crate) struct Mappings {
    kept: Mutex<Vec<Kept>>,
}

impl Mappings {
    /// The segment in `fd` laid out as `slots` of `slot_bytes`, sent by process `pid`: a
    /// kept mapping of the same file and layout, or `map(fd)`'s (which checks seals and
    /// size), kept from now on.
    pub(crate) fn open(
        &self,
        fd: OwnedFd,
        (slots, slot_bytes): (u32, u64),
        pid: i32,
        map: impl FnOnce(OwnedFd) -> Result<Segment, ShmError>,
    ) -> Result<Arc<Segment>, ShmError> {
        let stat = rustix::fs::fstat(fd.as_fd()).map_err(|e| ShmError::Os {
            what: "fstat of the segment",
            source: e.into(),
        })?;
        let key = (stat.st_dev, stat.st_ino, slots, slot_bytes);
        let owner = ProcessWatch::of_pid(pid).ok();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.iter_mut().find(|k| k.key == key) {
            k.idle_since = None;
            k.owner = owner;
            return Ok(k.segment.clone());
        }
        let segment = Arc::new(map(fd)?);
        kept.push(Kept {
            key,
            segment: segment.clone(),
            idle_since: None,
            owner,
        });
        Ok(segment)
    }

    /// Unmaps what no connection uses and either has been idle for `idle` (the caller's
    /// clock says `now`) or belongs to a client process that has exited.
    pub(crate) fn sweep(&self, now: Instant, idle: Duration) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain_mut(|k| {
            if Arc::strong_count(&k.segment) > 1 {
                k.idle_since = None;
                return true;
            }
            let since = *k.idle_since.get_or_insert(now);
            let gone = k.owner.as_ref().is_none_or(ProcessWatch::exited);
            !gone && now.duration_since(since) < idle
        });
    }

    /// Segments mapped now, in use or kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().map_or(0, |k| k.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(m: &Mappings, seg: &Segment) -> Arc<Segment> {
        let fd = seg.fd().try_clone_to_owned().unwrap();
        let attach = seg.attach(1, None);
        m.open(
            fd,
            (seg.slots(), seg.slot_bytes()),
            std::process::id() as i32,
            |fd| Segment::open(fd, &attach),
        )
        .unwrap()
    }

    #[test]
    fn the_same_file_is_mapped_once_until_it_is_idle_long_enough() {
        let m = Mappings::default();
        let client = Segment::create("sluice-test", 2, 4096).unwrap();
        let other = Segment::create("sluice-test", 2, 4096).unwrap();
        let a = opened(&m, &client);
        a.write(1, b"kept").unwrap();
        let again = opened(&m, &client);
        assert!(Arc::ptr_eq(&a, &again), "a second attach maps it again");
        assert!(!Arc::ptr_eq(&a, &opened(&m, &other)));
        let t0 = Instant::now();
        m.sweep(t0, KEEP_IDLE);
        assert_eq!(m.len(), 2, "one in use, one idle since now");
        drop((a, again));
        m.sweep(t0 + Duration::from_secs(1), KEEP_IDLE);
        assert_eq!(m.len(), 2, "idle, but not long enough");
        // A connection takes it again: no longer idle.
        let back = opened(&m, &client);
        let mut bytes = [0u8; 4];
        back.read(1, &mut bytes).unwrap();
        assert_eq!(&bytes, b"kept");
        drop(back);
        m.sweep(t0 + Duration::from_secs(2), KEEP_IDLE);
        m.sweep(t0 + Duration::from_secs(11), KEEP_IDLE);
        assert_eq!(m.len(), 1, "the other segment went after 10 s idle");
        m.sweep(t0 + Duration::from_secs(13), KEEP_IDLE);
        assert_eq!(m.len(), 0);
    }
}
