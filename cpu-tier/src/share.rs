//! Sweeps that share one decode: jobs of one team that read the same samples with the same
//! pipeline and seed (four learning rates, one data order) are served one decode of each.
//!
//! A sample's tensor is a pure function of the pipeline, the job's seed, the epoch, the
//! shard's place in the manifest, the sample's index there and the sample's image bytes
//! ([`crate::engine`]: every random draw comes from that stream). So the worker keys each
//! tensor by exactly those (`Sharing::key`; the bytes named by the checksum its reader
//! checked them against, where one did), hashed with the job's *class*: its *scope*
//! (its tenant's share group, [`Scopes`]), pipeline, seed, epoch, rank and world size. Jobs
//! whose keys match get the same bytes, whatever the rest of their settings (batch size,
//! fields, order); the rank and world size keep apart jobs that read different samples (the
//! ranks of one job), which would keep tensors for nobody. The key is made here from what the
//! job and its read of the shard say; nothing of it crosses the wire.
//!
//! Each job still runs its own units, spends its own credits and keeps its own order: only
//! the read ([`crate::source::ShardSource::open_unit_together`]: units of the same samples
//! that run at the same time read them once) and the decode are shared. Its engine looks
//! each sample up in the worker's [`Window`] before decoding it:
//! - a tensor already there was decoded for another job: it is copied out, not decoded (on
//!   the unit's own thread, which looks before it hands the sample to the pool);
//! - one being decoded right now (on another pool thread) is waited for: a decode, never a
//!   job's credits or pace, is all a job ever waits for;
//! - otherwise the job decodes it, and, while another job of its class is open on this
//!   worker, keeps a copy there for the others.
//!
//! The window is bounded in bytes (`limits.share_window_bytes`): the oldest tensors go
//! first, so a job that falls behind by more than the window decodes on its own, as does a
//! job that resumes mid-epoch until it reaches the others' position. A worker that dies
//! takes only its window with it; every job reassigns its units as it would alone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use sluice_shard::Sample;
use sluice_wire::session::Admission;
use sluice_wire::SampleGeometry;

use crate::tensor::Tensor;

/// How long a job waits for a tensor another pool thread is decoding before it decodes the
/// sample itself (a decode takes milliseconds; this only bounds a decoder gone wrong).
const WAIT_FOR_DECODE: Duration = Duration::from_secs(5);

/// Buffers of evicted tensors kept for reuse.
const SPARE_BUFFERS: usize = 64;

/// A decoded tensor kept for the other jobs of a sweep.
#[derive(Debug)]
pub(crate) struct Kept {
    pub(crate) tensor: Tensor,
    pub(crate) geometry: SampleGeometry,
}

enum Entry {
    /// A pool thread is decoding it now.
    Decoding,
    Ready(Arc<Kept>),
}

#[derive(Default)]
struct State {
    entries: HashMap<u128, Entry>,
    /// Ready entries, oldest first, with their bytes and class: the order they leave in.
    order: VecDeque<(u128, u64, u128)>,
    /// Ready entries per class.
    kept: HashMap<u128, u64>,
    bytes: u64,
    /// Buffers of tensors that left the window, for the next ones kept (fresh pages cost
    /// more than the copy into them).
    spare: Vec<Vec<u8>>,
    /// Jobs open on this worker per class: jobs of one class read the same samples with the
    /// same draws (a sweep's jobs, rank by rank), and nobody else could use their tensors.
    classes: HashMap<u128, u32>,
}

/// The worker's window of tensors decoded for sweeps: one for every job it serves.
pub struct Window {
    state: Mutex<State>,
    /// A decode under way ended (kept or given up).
    decoded: Condvar,
    max_bytes: u64,
}

/// What a job's engine does with a sample.
pub(crate) enum Lookup<'w> {
    /// Another job's decode of it: copy it.
    Hit(Arc<Kept>),
    /// Decode it, and keep the result with [`Claim::keep`] for the others.
    Decode(Claim<'w>),
    /// Decode it for this job alone (no other job of its class is open, or the window holds
    /// nothing).
    Alone,
}

/// What the unit's thread finds of a sample before it goes to the pool.
pub(crate) enum Peek {
    /// Another job's decode of it: copy it.
    Ready(Arc<Kept>),
    /// Not there now: the pool's task looks it up, with its key if one was made.
    NotYet(Option<u128>),
}

/// A sample this job decodes for its sweep; dropped without [`Claim::keep`] (the decode
/// failed, or panicked), the others waiting for it decode it themselves.
pub(crate) struct Claim<'w> {
    window: &'w Window,
    class: u128,
    key: u128,
    done: bool,
}

impl Window {
    /// A window of at most `max_bytes` of tensors (0: nothing is shared).
    pub fn new(max_bytes: u64) -> Arc<Window> {
        metrics::gauge!("sluice_cpu_share_window_bytes").set(0.0);
        Arc::new(Window {
            state: Mutex::default(),
            decoded: Condvar::new(),
            max_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes of tensors it holds now.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// A job of `class` opened: it counts toward its class until the returned member drops.
    pub(crate) fn join(self: &Arc<Self>, class: u128) -> Member {
        *self.lock().classes.entry(class).or_default() += 1;
        Member {
            window: self.clone(),
            class,
        }
    }

    /// Whether a job of `class` may find or keep anything: another job of its class is open,
    /// or one was and left tensors. A job alone skips hashing its samples.
    fn worth_looking(&self, class: u128) -> bool {
        let s = self.lock();
        self.max_bytes > 0
            && (s.classes.get(&class).copied().unwrap_or(0) >= 2
                || s.kept.get(&class).copied().unwrap_or(0) > 0)
    }

    /// Whether another job of `class` is open now.
    fn has_peers(&self, class: u128) -> bool {
        self.max_bytes > 0 && self.lock().classes.get(&class).copied().unwrap_or(0) >= 2
    }

    /// The tensor kept under `key`, if it is there now (never waits).
    fn ready(&self, key: u128) -> Option<Arc<Kept>> {
        match self.lock().entries.get(&key) {
            Some(Entry::Ready(kept)) => Some(kept.clone()),
            _ => None,
        }
    }

    fn lookup(&self, class: u128, key: u128) -> Lookup<'_> {
        let started = Instant::now();
        let mut s = self.lock();
        loop {
            match s.entries.get(&key) {
                Some(Entry::Ready(kept)) => return Lookup::Hit(kept.clone()),
                Some(Entry::Decoding) => {
                    let left = WAIT_FOR_DECODE.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Lookup::Alone;
                    }
                    s = self
                        .decoded
                        .wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None if s.classes.get(&class).copied().unwrap_or(0) >= 2 => {
                    s.entries.insert(key, Entry::Decoding);
                    return Lookup::Decode(Claim {
                        window: self,
                        class,
                        key,
                        done: false,
                    });
                }
                None => return Lookup::Alone,
            }
        }
    }

    /// A buffer holding a copy of `bytes`, from the spares when one fits.
    fn copy_of(&self, bytes: &[u8]) -> Vec<u8> {
        let spare = {
            let mut s = self.lock();
            let at = s.spare.iter().position(|b| b.len() == bytes.len());
            at.map(|i| s.spare.swap_remove(i))
        };
        match spare {
            Some(mut b) => {
                b.copy_from_slice(bytes);
                b
            }
            None => bytes.to_vec(),
        }
    }

    fn keep(&self, (class, key): (u128, u128), kept: Kept) {
        let bytes = kept.tensor.data.len() as u64;
        let mut s = self.lock();
        if bytes > self.max_bytes {
            s.entries.remove(&key);
        } else {
            s.entries.insert(key, Entry::Ready(Arc::new(kept)));
            s.order.push_back((key, bytes, class));
            *s.kept.entry(class).or_default() += 1;
            s.bytes += bytes;
            while s.bytes > self.max_bytes {
                let Some((old, b, old_class)) = s.order.pop_front() else {
                    break;
                };
                s.bytes -= b;
                if let Some(n) = s.kept.get_mut(&old_class) {
                    *n -= 1;
                    if *n == 0 {
                        s.kept.remove(&old_class);
                    }
                }
                if let Some(Entry::Ready(kept)) = s.entries.remove(&old) {
                    // Unless a job is copying it out right now.
                    if let Ok(kept) = Arc::try_unwrap(kept) {
                        if s.spare.len() < SPARE_BUFFERS {
                            s.spare.push(kept.tensor.data);
                        }
                    }
                }
            }
            metrics::counter!("sluice_cpu_share_kept_total").increment(1);
        }
        metrics::gauge!("sluice_cpu_share_window_bytes").set(s.bytes as f64);
        drop(s);
        self.decoded.notify_all();
    }

    fn give_up(&self, key: u128) {
        let mut s = self.lock();
        if matches!(s.entries.get(&key), Some(Entry::Decoding)) {
            s.entries.remove(&key);
        }
        drop(s);
        self.decoded.notify_all();
    }

    /// Drops every tensor of a class once no job of it is open: nobody else can want them.
    fn leave(&self, class: u128) {
        let mut s = self.lock();
        let Some(n) = s.classes.get_mut(&class) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        s.classes.remove(&class);
        // Keys do not say their class: drop what only a lone class could have kept once no
        // class is open at all, else leave the rest to age out of the window.
        if s.classes.is_empty() {
            s.order.clear();
            s.kept.clear();
            s.entries.retain(|_, e| matches!(e, Entry::Decoding));
            s.bytes = 0;
            metrics::gauge!("sluice_cpu_share_window_bytes").set(0.0);
        }
    }
}

impl Claim<'_> {
    /// Keeps the decoded `tensor` (bytes in `data`) and its geometry for the others.
    pub(crate) fn keep(mut self, tensor: &Tensor, geometry: &SampleGeometry) {
        self.done = true;
        let kept = Kept {
            tensor: Tensor {
                data: self.window.copy_of(&tensor.data),
                ..tensor.clone_header()
            },
            geometry: *geometry,
        };
        self.window.keep((self.class, self.key), kept);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.window.give_up(self.key);
        }
    }
}

/// A job's membership of its class; leaving when dropped.
pub(crate) struct Member {
    window: Arc<Window>,
    class: u128,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.window.leave(self.class);
    }
}

/// How one job shares: its window and class. The engine of a job that does not share has
/// none.
pub(crate) struct Sharing {
    member: Member,
}

impl Sharing {
    /// A job of `scope` (its tenant's share group; "" without tenants) running `pipeline`
    /// (the parsed spec's canonical form) at `coordinates` (seed, epoch, rank, world size),
    /// joining `window`. The class holds the rank and world size too: the ranks of one job,
    /// or one job's epoch and the next started early, read different samples, so they keep
    /// nothing for one another.
    pub(crate) fn join(
        window: &Arc<Window>,
        scope: &str,
        pipeline: &str,
        coordinates: [u64; 4],
    ) -> Sharing {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for part in [scope.as_bytes(), pipeline.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for c in coordinates {
            h.update(&c.to_le_bytes());
        }
        Sharing {
            member: window.join(h.digest128()),
        }
    }

    /// The key of `sample`, of the shard at `shard` in the manifest, whose image bytes are
    /// `image`: its contents are named by the checksum its reader checked its bytes against
    /// (no second pass over them: hashing a cold image was 6% of a sweep's worker CPU), or,
    /// where nothing checked them, by a hash of the image.
    fn key(&self, shard: u32, sample: &Sample, image: &[u8]) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.member.class.to_le_bytes());
        h.update(&shard.to_le_bytes());
        h.update(&sample.index.to_le_bytes());
        match sample.checksum {
            Some(checked) => {
                h.update(b"checked");
                h.update(&checked.to_le_bytes());
            }
            None => {
                h.update(b"image");
                h.update(&xxhash_rust::xxh3::xxh3_128(image).to_le_bytes());
            }
        }
        h.digest128()
    }

    /// What the job's engine does with this sample (`key`: its key, if [`Sharing::peek`]
    /// made it already).
    pub(crate) fn lookup(
        &self,
        shard: u32,
        sample: &Sample,
        image: &[u8],
        key: Option<u128>,
    ) -> Lookup<'_> {
        if !self.member.window.worth_looking(self.member.class) {
            return Lookup::Alone;
        }
        let key = key.unwrap_or_else(|| self.key(shard, sample, image));
        self.member.window.lookup(self.member.class, key)
    }

    /// The group whose units of the same samples read them once between them
    /// ([`crate::source::ShardSource::open_unit_together`]): the job's class, while another
    /// job of it is open (a job alone reads on its own: a shared read keeps a copy of each
    /// sample for units that may join).
    pub(crate) fn reads_together(&self) -> Option<u128> {
        let m = &self.member;
        m.window.has_peers(m.class).then_some(m.class)
    }

    /// Whether the window holds this sample's tensor now, looked at from the unit's thread
    /// before the sample goes to the pool: a tensor there is copied out on that thread (no
    /// pool task, no hand-off back); otherwise the pool's task looks again (and may wait
    /// for a decode under way), with the key made here.
    pub(crate) fn peek(&self, shard: u32, sample: &Sample, image: &[u8]) -> Peek {
        if !self.member.window.worth_looking(self.member.class) {
            return Peek::NotYet(None);
        }
        let key = self.key(shard, sample, image);
        match self.member.window.ready(key) {
            Some(kept) => Peek::Ready(kept),
            None => Peek::NotYet(Some(key)),
        }
    }
}

/// Which scope each job shares in: without tenants, one (every client holds the cluster
/// token); with tenants, each tenant's `share_group` (its own name unless the tenants file
/// puts several teams in one group). Re-read with the tenants file.
#[derive(Default)]
pub struct Scopes {
    /// Tenant name to share group; `None` without tenants.
    groups: RwLock<Option<HashMap<String, String>>>,
}

impl Scopes {
    /// The groups of `admission`'s tenants, from now on.
    pub fn set(&self, admission: &Admission) {
        let groups = match admission {
            Admission::Tenants(ts) => Some(
                ts.iter()
                    .map(|t| (t.name.clone(), t.share_group.clone()))
                    .collect(),
            ),
            Admission::Open | Admission::Token(_) => None,
        };
        *self.groups.write().unwrap_or_else(|e| e.into_inner()) = groups;
    }

    /// The scope of a job named `name`: with tenants, its name is `<tenant>/...` (the
    /// worker's rules named it so), and a tenant no longer listed shares with itself alone.
    pub(crate) fn of(&self, name: &str) -> String {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        match &*groups {
            None => String::new(),
            Some(groups) => {
                let tenant = name.split_once('/').map_or(name, |(t, _)| t);
                let group = groups.get(tenant).map_or(tenant, String::as_str);
                format!("group:{group}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::spec::DType;

    /// Sample `index`, its bytes unchecked (its key hashes its image).
    fn at(index: u64) -> Sample {
        Sample {
            shard: "t.tar".into(),
            key: format!("s{index}"),
            index,
            start: 0,
            end: 0,
            fields: Vec::new(),
            checksum: None,
        }
    }

    #[test]
    fn a_checked_sample_is_named_by_its_checksum_not_its_image() {
        let w = Window::new(1 << 20);
        let a = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        let b = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        let checked = |sum| Sample {
            checksum: Some(sum),
            ..at(0)
        };
        match a.lookup(0, &checked(42), b"jpeg", None) {
            Lookup::Decode(c) => c.keep(&tensor(1, 3), &SampleGeometry::default()),
            _ => panic!("a sweep's first look decodes"),
        }
        // The checksum names the bytes: the image is not hashed again.
        assert!(matches!(b.peek(0, &checked(42), b"other"), Peek::Ready(_)));
        assert!(matches!(
            b.peek(0, &checked(43), b"jpeg"),
            Peek::NotYet(Some(_))
        ));
        // An unchecked copy of the same image is keyed apart (nothing vouches for it).
        assert!(matches!(b.peek(0, &at(0), b"jpeg"), Peek::NotYet(Some(_))));
    }

    fn tensor(byte: u8, len: usize) -> Tensor {
        Tensor {
            frames: 1,
            height: 1,
            width: (len / 3) as u32,
            dtype: DType::U8,
            chw: false,
            data: vec![byte; len],
            placed: None,
        }
    }

    #[test]
    fn a_lone_job_keeps_nothing_and_a_sweep_decodes_once() {
        let w = Window::new(1 << 20);
        let a = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        assert!(matches!(a.lookup(0, &at(0), b"jpeg", None), Lookup::Alone));
        let b = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        match a.lookup(0, &at(0), b"jpeg", None) {
            Lookup::Decode(c) => c.keep(&tensor(7, 30), &SampleGeometry::default()),
            _ => panic!("the first of two decodes"),
        }
        match b.lookup(0, &at(0), b"jpeg", None) {
            Lookup::Hit(k) => assert_eq!(k.tensor.data, vec![7; 30]),
            _ => panic!("the second copies"),
        }
        assert_eq!(w.bytes(), 30);
        // Another seed is another class (alone, it keeps nothing); another shard, sample or
        // image is another tensor.
        let c = Sharing::join(&w, "", "decode", [2, 0, 0, 1]);
        assert!(matches!(c.lookup(0, &at(0), b"jpeg", None), Lookup::Alone));
        assert!(matches!(
            b.lookup(1, &at(0), b"jpeg", None),
            Lookup::Decode(_)
        ));
        assert!(matches!(
            b.lookup(0, &at(1), b"jpeg", None),
            Lookup::Decode(_)
        ));
        // Another epoch, or another rank of the same job, is another class: nothing kept.
        let next_epoch = Sharing::join(&w, "", "decode", [1, 1, 0, 1]);
        assert!(matches!(
            next_epoch.lookup(0, &at(0), b"jpeg", None),
            Lookup::Alone
        ));
        assert!(matches!(
            b.lookup(0, &at(0), b"jpeh", None),
            Lookup::Decode(_)
        ));
        drop((a, b, c, next_epoch));
        assert_eq!(
            w.bytes(),
            0,
            "the last job of the worker gone, the window empties"
        );
    }

    #[test]
    fn scopes_keep_teams_apart_unless_grouped() {
        let w = Window::new(1 << 20);
        let a = Sharing::join(&w, "group:a", "decode", [1, 0, 0, 1]);
        let _a2 = Sharing::join(&w, "group:a", "decode", [1, 0, 0, 1]);
        let b = Sharing::join(&w, "group:b", "decode", [1, 0, 0, 1]);
        let _b2 = Sharing::join(&w, "group:b", "decode", [1, 0, 0, 1]);
        if let Lookup::Decode(c) = a.lookup(0, &at(0), b"x", None) {
            c.keep(&tensor(1, 3), &SampleGeometry::default());
        }
        assert!(matches!(b.lookup(0, &at(0), b"x", None), Lookup::Decode(_)));
    }

    #[test]
    fn the_window_is_bounded_oldest_first() {
        let w = Window::new(100);
        let a = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        let _b = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        for i in 0..5 {
            if let Lookup::Decode(c) = a.lookup(0, &at(i), b"x", None) {
                c.keep(&tensor(i as u8, 30), &SampleGeometry::default());
            }
        }
        assert_eq!(w.bytes(), 90);
        assert!(
            matches!(a.lookup(0, &at(0), b"x", None), Lookup::Decode(_)),
            "evicted"
        );
        assert!(matches!(a.lookup(0, &at(4), b"x", None), Lookup::Hit(_)));
        // Larger than the window: never kept.
        if let Lookup::Decode(c) = a.lookup(0, &at(9), b"x", None) {
            c.keep(&tensor(9, 300), &SampleGeometry::default());
        }
        assert!(matches!(a.lookup(0, &at(9), b"x", None), Lookup::Decode(_)));
    }

    #[test]
    fn a_decode_given_up_frees_its_waiters() {
        let w = Window::new(1 << 20);
        let a = Sharing::join(&w, "", "decode", [1, 0, 0, 1]);
        let b = Arc::new(Sharing::join(&w, "", "decode", [1, 0, 0, 1]));
        let claim = match a.lookup(0, &at(0), b"x", None) {
            Lookup::Decode(c) => c,
            _ => panic!("decodes"),
        };
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || matches!(b.lookup(0, &at(0), b"x", None), Lookup::Decode(_)))
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(claim);
        assert!(waiter.join().unwrap(), "the waiter decodes it itself");
    }

    #[test]
    fn scopes_follow_tenants_and_their_groups() {
        let tenant = |name: &str, group: &str| {
            Arc::new(sluice_wire::session::Tenant {
                name: name.into(),
                token: format!("{name}-token"),
                max_weight: 1,
                max_credits: 1,
                share_group: group.into(),
            })
        };
        let open = Scopes::default();
        open.set(&Admission::Open);
        assert_eq!(open.of("a/x"), open.of("b/y"));
        let s = Scopes::default();
        s.set(&Admission::Tenants(vec![
            tenant("a", "a"),
            tenant("b", "b"),
            tenant("c", "vision"),
            tenant("d", "vision"),
        ]));
        assert_ne!(s.of("a/x"), s.of("b/x"));
        assert_eq!(s.of("a/x"), s.of("a/y"));
        assert_eq!(s.of("c/x"), s.of("d/x"));
        assert_eq!(s.of("gone/x"), "group:gone");
    }
}
