//! Units of a sweep that read the same samples at the same time read them once.
//!
//! The jobs of a sweep ask for the same units ([`crate::share`]: one class, one plan), and on a
//! worker their units of the same samples run nearly in step. Each read them on its own: a copy out
//! of the page cache (or a download), the checksum and the tar parse again, for every job (`perf`
//! put them at a third of what each job beyond the first cost the worker once the decodes were
//! shared). A unit opened with [`ShardSource::open_unit_together`] joins the read of the same
//! samples by another unit of its group, if one is under way and still holds every sample from the
//! first: whichever of them needs the next sample first reads it (through
//! [`ShardSource::open_unit_with_repair`], replicas, cache and repair included) for all of them,
//! and each takes the same sample, shared (`Arc`), not copied (a copy into fresh pages costs about
//! what the read did).
//!
//! A unit never waits for another's pace, only for a read under way. The samples read are
//! kept until the last unit of the read is done with them, within one byte bound over all
//! reads (`ShardSource::with_together_bytes`): over it, the samples every unit took go
//! first, then a read's oldest. A unit behind the samples dropped, or whose read failed in
//! a way another reader should not inherit (anything but a damaged sample, which every unit
//! reports alike), reads the rest on its own from the first sample it has not taken: each
//! unit still takes every sample of its range once, in order. A read that ended is not kept
//! for units that start after its last unit is done: kept whole for them, the samples held
//! out of the reader's spare buffers cost as many page faults as the reads saved.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use sluice_shard::{Checksum, Sample, ShardError};

use super::{ShardLocation, ShardSource, SourceError, UnitSamples};

/// A unit's samples as a shared read hands them: the same samples, not copies, to every
/// unit that reads with it ([`ShardSource::open_unit_together`]).
pub type SharedSamples = Box<dyn Iterator<Item = Result<Arc<Sample>, ShardError>> + Send>;

/// Bytes of samples all reads together hold for the units that have not taken them yet.
pub(super) const TOGETHER_BYTES: u64 = 64 << 20;

/// The reads under way that units may join, by group and samples.
pub(super) struct Together {
    open: Mutex<HashMap<Key, Weak<Reading>>>,
    /// Bytes of samples held over every reading, and the most there may be.
    held: Arc<AtomicU64>,
    max_bytes: u64,
}

/// What a read is of: a group's units of the same samples of the same shard, from the same
/// replicas (a unit must not take another's report of damage its own replicas would have
/// repaired).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    group: u128,
    urls: Vec<String>,
    checksum: Checksum,
    start: u64,
    end: u64,
}

/// One read of a range, and the samples it read that a unit of it has not taken yet.
struct Reading {
    state: Mutex<State>,
    /// A sample was read (or the read ended, or failed).
    moved: Condvar,
    held: Arc<AtomicU64>,
    max_bytes: u64,
    /// Where the samples dropped go back.
    spares: Arc<sluice_shard::Spares>,
}

struct State {
    /// The samples read, from position `base` on.
    items: VecDeque<Item>,
    base: u64,
    /// Their bytes.
    bytes: u64,
    /// The read itself; `None` while a unit reads the next sample from it (or once it
    /// failed).
    inner: Option<UnitSamples>,
    ended: bool,
    /// The read failed: every unit goes on on its own from its next sample.
    broken: bool,
    /// Each unit's next position, by its id.
    at: HashMap<u64, u64>,
    next_id: u64,
}

/// A sample read for the units of a reading: each takes it.
#[derive(Clone)]
enum Item {
    Sample(Arc<Sample>),
    Damaged(Damaged),
}

/// A sample the read found damaged ([`ShardError::DamagedSample`]), reported by every unit.
#[derive(Clone)]
struct Damaged {
    shard: String,
    offset: u64,
    index: u64,
    key: String,
    detail: String,
}

impl Item {
    /// What the units of a read keep of what it read: `None` for an error that ends the read.
    fn of(item: &Result<Arc<Sample>, ShardError>) -> Option<Item> {
        match item {
            Ok(sample) => Some(Item::Sample(sample.clone())),
            Err(ShardError::DamagedSample {
                shard,
                offset,
                index,
                key,
                detail,
            }) => Some(Item::Damaged(Damaged {
                shard: shard.clone(),
                offset: *offset,
                index: *index,
                key: key.clone(),
                detail: detail.clone(),
            })),
            Err(_) => None,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Item::Sample(s) => s.fields.iter().map(|f| f.data.len() as u64).sum(),
            Item::Damaged(_) => 0,
        }
    }

    /// What a unit takes.
    fn taken(self) -> Result<Arc<Sample>, ShardError> {
        match self {
            Item::Sample(s) => Ok(s),
            Item::Damaged(d) => Err(ShardError::DamagedSample {
                shard: d.shard,
                offset: d.offset,
                index: d.index,
                key: d.key,
                detail: d.detail,
            }),
        }
    }

    fn give_back(self, spares: &sluice_shard::Spares) {
        if let Item::Sample(s) = self {
            spares.give_back_shared(s);
        }
    }
}

impl Together {
    pub(super) fn new(max_bytes: u64) -> Self {
        Together {
            open: Mutex::default(),
            held: Arc::default(),
            max_bytes,
        }
    }

    pub(super) fn set_max_bytes(&mut self, max_bytes: u64) {
        self.max_bytes = max_bytes;
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Weak<Reading>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ShardSource {
    /// [`ShardSource::open_unit_with_repair`] for a unit of `group` (the jobs of a sweep
    /// that read the same samples: [`crate::share`]'s class): it joins a read of the same
    /// samples by another unit of the group that is under way and still holds them all from
    /// the first, else starts one that later units may join (see the module documentation).
    pub fn open_unit_together(
        self: &Arc<Self>,
        loc: &ShardLocation,
        start: u64,
        end: u64,
        group: u128,
    ) -> Result<SharedSamples, SourceError> {
        let key = Key {
            group,
            urls: loc.urls.clone(),
            checksum: loc.info.checksum,
            start,
            end,
        };
        let joined = self.together.lock().get(&key).and_then(Weak::upgrade);
        if let Some(reading) = joined {
            if let Some(id) = reading.join() {
                metrics::counter!("sluice_cpu_share_reads_joined_total").increment(1);
                return Ok(Box::new(Joined::new(self, loc, (start, end), reading, id)));
            }
        }
        let inner = self.open_unit_with_repair(loc, start, end)?;
        let reading = Arc::new(Reading {
            state: Mutex::new(State {
                items: VecDeque::new(),
                base: 0,
                bytes: 0,
                inner: Some(inner),
                ended: false,
                broken: false,
                at: HashMap::new(),
                next_id: 0,
            }),
            moved: Condvar::new(),
            held: self.together.held.clone(),
            max_bytes: self.together.max_bytes,
            spares: self.spares.clone(),
        });
        let id = reading.join().unwrap_or_default();
        let mut open = self.together.lock();
        open.retain(|_, r| r.strong_count() > 0);
        open.insert(key, Arc::downgrade(&reading));
        drop(open);
        Ok(Box::new(Joined::new(self, loc, (start, end), reading, id)))
    }
}

impl Reading {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A unit joins at the first sample: its id, unless that sample is gone (or the read
    /// failed).
    fn join(&self) -> Option<u64> {
        let mut s = self.lock();
        if s.base > 0 || s.broken {
            return None;
        }
        let id = s.next_id;
        s.next_id += 1;
        s.at.insert(id, 0);
        Some(id)
    }

    /// Keeps a sample read for the units that have not taken it. Over the bound, what goes
    /// first: the samples every unit of this read took, then its oldest samples (a unit
    /// behind them reads on its own).
    fn push(&self, s: &mut State, item: Item) {
        let bytes = item.bytes();
        s.items.push_back(item);
        s.bytes += bytes;
        self.held.fetch_add(bytes, Ordering::Relaxed);
        self.trim(s);
        self.drop_front(s, |_| true);
    }

    /// Drops samples from the front while `drop(position)` says so and more than the
    /// bound is held.
    fn drop_front(&self, s: &mut State, drop: impl Fn(u64) -> bool) {
        while self.held.load(Ordering::Relaxed) > self.max_bytes && drop(s.base) {
            if !self.pop_front(s) {
                break;
            }
        }
    }

    /// Drops the samples every unit has taken, once no unit can join any more (one joins
    /// only while the first sample is held).
    fn trim(&self, s: &mut State) {
        let Some(&least) = s.at.values().min() else {
            return;
        };
        while s.base < least && s.base > 0 && self.pop_front(s) {}
        // Over the bound, what every unit has taken goes first, the first sample included.
        self.drop_front(s, |at| at < least);
    }

    /// Drops the oldest sample held, if there is one.
    fn pop_front(&self, s: &mut State) -> bool {
        let Some(item) = s.items.pop_front() else {
            return false;
        };
        s.base += 1;
        let bytes = item.bytes();
        s.bytes -= bytes;
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        item.give_back(&self.spares);
        true
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        self.held.fetch_sub(s.bytes, Ordering::Relaxed);
        for item in s.items.drain(..) {
            item.give_back(&self.spares);
        }
    }
}

/// Marks a reading failed if the unit reading its next sample unwinds, so the others stop
/// waiting for that sample and read on their own.
struct Pulling<'a> {
    reading: &'a Reading,
    done: bool,
}

impl Drop for Pulling<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.reading.lock().broken = true;
            self.reading.moved.notify_all();
        }
    }
}

/// A unit's samples taken from a reading, then, if it has to, read on its own.
struct Joined {
    source: Arc<ShardSource>,
    loc: ShardLocation,
    reading: Option<Arc<Reading>>,
    id: u64,
    /// Its next position in the reading.
    at: u64,
    /// The first sample of its range it has not taken.
    next: u64,
    end: u64,
    /// Its own read, once it left the reading.
    own: Option<UnitSamples>,
    /// It read an error that ends the read: nothing more comes (as from a read alone).
    failed: bool,
}

impl Joined {
    fn new(
        source: &Arc<ShardSource>,
        loc: &ShardLocation,
        (start, end): (u64, u64),
        reading: Arc<Reading>,
        id: u64,
    ) -> Self {
        Joined {
            source: source.clone(),
            loc: loc.clone(),
            reading: Some(reading),
            id,
            at: 0,
            next: start,
            end,
            own: None,
            failed: false,
        }
    }

    /// Leaves the reading and reads the rest of the range on its own.
    fn leave(&mut self) -> Option<Result<Arc<Sample>, ShardError>> {
        self.depart();
        if self.next >= self.end {
            return None;
        }
        metrics::counter!("sluice_cpu_share_reads_left_total").increment(1);
        match self
            .source
            .open_unit_with_repair(&self.loc, self.next, self.end)
        {
            Ok(own) => {
                self.own = Some(own);
                Some(self.own.as_mut()?.next()?.map(Arc::new))
            }
            Err(e) => {
                // Nothing more comes of this unit: it fails, as a read failing alone would.
                self.next = self.end;
                Some(Err(ShardError::Io {
                    shard: self.loc.name().into(),
                    offset: 0,
                    source: io::Error::other(format!(
                        "reading on after the sweep's shared read: {e}"
                    )),
                }))
            }
        }
    }

    fn depart(&mut self) {
        if let Some(reading) = self.reading.take() {
            let mut s = reading.lock();
            s.at.remove(&self.id);
            reading.trim(&mut s);
        }
    }

    fn taken(&mut self, item: &Result<Arc<Sample>, ShardError>) {
        match item {
            Ok(s) => self.next = s.index + 1,
            Err(ShardError::DamagedSample { index, .. }) => self.next = index + 1,
            Err(_) => {}
        }
    }
}

impl Iterator for Joined {
    type Item = Result<Arc<Sample>, ShardError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(own) = &mut self.own {
            return Some(own.next()?.map(Arc::new));
        }
        if self.failed {
            return None;
        }
        let reading = self.reading.clone()?;
        let mut s = reading.lock();
        loop {
            if self.at < s.base {
                drop(s);
                return self.leave();
            }
            if let Some(item) = s.items.get((self.at - s.base) as usize).cloned() {
                self.at += 1;
                s.at.insert(self.id, self.at);
                reading.trim(&mut s);
                drop(s);
                let sample = item.taken();
                metrics::counter!("sluice_cpu_share_read_samples_total").increment(1);
                self.taken(&sample);
                return Some(sample);
            }
            if s.ended {
                return None;
            }
            if s.broken {
                drop(s);
                return self.leave();
            }
            let Some(mut inner) = s.inner.take() else {
                // Another unit reads the next sample for all.
                s = reading.moved.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            drop(s);
            let mut pulling = Pulling {
                reading: &reading,
                done: false,
            };
            let item = inner.next().map(|read| read.map(Arc::new));
            pulling.done = true;
            s = reading.lock();
            match &item {
                None => s.ended = true,
                Some(read) => match Item::of(read) {
                    Some(kept) => {
                        s.inner = Some(inner);
                        reading.push(&mut s, kept);
                        self.at += 1;
                        s.at.insert(self.id, self.at);
                    }
                    // A read error: this unit reports it and ends; the others read on their
                    // own.
                    None => {
                        s.broken = true;
                        self.failed = true;
                    }
                },
            }
            drop(s);
            reading.moved.notify_all();
            if let Some(read) = &item {
                self.taken(read);
            }
            return item;
        }
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        self.depart();
    }
}
