//! The same-host transport, client side: which workers it applies to, the slots of the
//! shared-memory segment a connection's samples are written into, and the segments the loader
//! keeps for its next connections.
//!
//! A slot is in one of three hands: free (the client's, empty), granted (the worker's, to
//! write one tensor into), or filled (the client's again: a `ShmSample` named it, and a
//! [`SlotRef`] holds it until the tensor is copied into its batch). Dropping the `SlotRef`
//! frees the slot, and the link grants free slots as the coordinator returns credits.
//!
//! A segment has more slots than credits: a sample that arrived before its turn keeps its
//! slot while it waits (no copy), as long as the slots neither filled nor held can still
//! carry the whole credit window; past that it is copied out into one of the loader's reused
//! buffers and its slot freed, so held samples can never starve the worker of slots.
//!
//! Segments outlive their connections ([`Segments`]): a new segment's pages are faulted and
//! zeroed on first touch, which cost more than the spare slots saved when every epoch's
//! connection made its own. A segment is used again only when nothing but this process can
//! still write it:
//! - its connection ended with every unit it was assigned reported done or failed (a worker
//!   writes a slot only while one of those units runs), or
//! - the worker's process has exited (a pidfd opened from the socket's `SO_PEERCRED` right
//!   after connecting, [`ProcessWatch`]).
//!
//! Any other segment (its worker stalled, was declared lost or was cut off mid-unit, and
//! lives) waits in quarantine until its process exits, and is dropped when the quarantine is
//! full or no pidfd could be opened; a later connection gets a fresh one.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_wire::copy::copy_tensor;
use sluice_wire::shm::{ProcessWatch, Segment, ShmError};
use sluice_wire::BufferPool;
use tokio::sync::Notify;

use crate::arena::Arena;
use crate::batch::HostAllocator;
use crate::buffers::TensorBuf;

/// Whether a worker on this machine is reached through shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SameHost {
    /// Shared memory for a worker on this machine whose socket is found, QUIC otherwise
    /// (and when the socket refuses this process).
    #[default]
    Auto,
    /// QUIC always.
    Off,
    /// Shared memory for every worker: one that is not on this machine, or that refuses,
    /// is an error.
    Require,
}

/// Where workers put their same-host sockets unless told otherwise: `$SLUICE_SAME_HOST_DIR`,
/// else `/run/sluice` (the systemd unit's runtime directory).
pub fn default_socket_dir() -> PathBuf {
    std::env::var_os("SLUICE_SAME_HOST_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/run/sluice"), PathBuf::from)
}

/// The socket of the worker at `addr`, when that worker runs on this machine and serves one;
/// else why not, in words for a log line.
pub(crate) fn socket_for(dir: &Path, addr: SocketAddr) -> Result<PathBuf, String> {
    if !is_local(addr.ip()) {
        return Err("it runs on another machine".into());
    }
    let path = sluice_wire::shm::socket_path(dir, addr.port());
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "it runs on this machine but serves no socket at {} (start it with \
             --same-host-dir DIR and give the client the same DIR: same_host_dir= in Python, \
             --same-host-dir on loadgen, or SLUICE_SAME_HOST_DIR)",
            path.display()
        ))
    }
}

/// Checks, before anything is sent, that the process behind `stream` (connected through
/// `socket`) is the worker this client means to trust with its token and memory: its socket
/// file is a socket, not a link, owned by a trusted user, in a directory others cannot
/// replace it in (nor any folder above it), and the kernel says (`SO_PEERCRED`) the listening
/// process runs as a trusted user. Trusted: `worker_uid` (the loader's `same_host_uid`) when
/// given; else this process's own user, and the owner of a directory only its owner can
/// write (`/run/sluice`, 0755, the worker's: nobody else could have put a socket there) when
/// it lies in a folder only root (or a trusted user) can make folders in: under a folder
/// every user can write (`/tmp`), whoever made the directory first owns it, so its owner
/// vouches for nothing; and root, which could read this process's memory anyway. Else why
/// not, naming the file and the users, for a log line.
pub(crate) fn check_worker(
    socket: &Path,
    stream: &tokio::net::UnixStream,
    worker_uid: Option<u32>,
) -> Result<(), String> {
    use sluice_wire::shm::{check_parents, socket_dir, SocketDir};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let own = sluice_wire::shm::current_user().0;
    let mut owner_of_private_dir = None;
    if let Some(dir) = socket.parent() {
        let vouched: Vec<u32> = std::iter::once(own).chain(worker_uid).collect();
        let shared = check_parents(dir, &vouched)
            .map_err(|e| format!("the socket directory {}: {e}", dir.display()))?;
        match socket_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            SocketDir::Unsafe { mode } => {
                return Err(format!(
                    "the directory {} is writable by other users (mode {mode:o}) and not \
                     sticky, so anyone could put a socket there: make it 0755, or 1777",
                    dir.display(),
                ))
            }
            SocketDir::Private { owner } => match shared {
                None => owner_of_private_dir = Some(owner),
                Some(parent) if owner != 0 && owner != own && Some(owner) != worker_uid => {
                    return Err(format!(
                        "the directory {} is owned by uid {owner} and lies in {}, where every \
                         user can make folders: whoever made it first owns it; give \
                         same_host_uid (the workers' user), or use a directory only root \
                         makes, such as /run/sluice",
                        dir.display(),
                        parent.display()
                    ));
                }
                Some(_) => {}
            },
            SocketDir::Sticky { .. } => {}
        }
    }
    let trusted = |uid: u32| match worker_uid {
        Some(expected) => uid == expected || uid == 0,
        None => uid == own || uid == 0 || Some(uid) == owner_of_private_dir,
    };
    let expect = match worker_uid {
        Some(uid) => format!("uid {uid} (same_host_uid) or root"),
        None => format!(
            "uid {own} (this process's), the directory's owner, or root; same_host_uid names \
             another"
        ),
    };
    let meta = std::fs::symlink_metadata(socket).map_err(|e| e.to_string())?;
    if !meta.file_type().is_socket() {
        return Err("it is not a socket (a link or a file put in its place)".into());
    }
    if !trusted(meta.uid()) {
        return Err(format!(
            "the socket file is owned by uid {}, not {expect}",
            meta.uid()
        ));
    }
    let peer = sluice_wire::shm::peer(stream).map_err(|e| e.to_string())?;
    if !trusted(peer.uid) {
        return Err(format!(
            "the process listening (pid {}) runs as uid {}, not {expect}",
            peer.pid, peer.uid
        ));
    }
    Ok(())
}

/// An address of this machine: loopback, or one a socket can be bound to here.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The same-host segments of a loader's finished connections, kept for its next ones, and
/// the batch arena its connections share.
pub(crate) struct Segments {
    state: Mutex<Kept>,
    /// Most segments kept, ready and quarantined each.
    keep: usize,
    /// How the batch arena is sized, when the loader's batches may live in one, and the
    /// loader's allocator, which must adopt it.
    arena_plan: Option<(ArenaPlan, Arc<dyn HostAllocator>)>,
    /// The arena; `Some(None)` once the allocator would not take one.
    arena: Mutex<Option<Option<Arc<Arena>>>>,
}

/// What sizes the batch arena: the loader's ring, how far ahead of the batch being filled a
/// sample may arrive (`LoaderConfig::waiting_bound`), and the batch size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArenaPlan {
    pub(crate) ring: u32,
    pub(crate) waiting: u64,
    pub(crate) batch: u32,
}

/// The most bytes the batches bound ahead take, beyond two batches: the bound spare slots
/// have (`crate::link`). Every place of a batch bound ahead gets its pages by the time the
/// batch is filled, and early samples spread thin over the batches ahead (units interleave),
/// so a same-host loader whose samples arrive far ahead holds more memory than the samples
/// waiting in slots did; 64 MiB lost the gain where samples arrive far ahead (`bench
/// host-cost`: 27–30 against 27 µs).
const ARENA_AHEAD_BYTES: u64 = 1 << 30;

impl ArenaPlan {
    /// Batches bound ahead of the one being filled, so that a sample arriving early finds its
    /// batch: every batch a sample may arrive for, within `ARENA_AHEAD_BYTES` (at least two).
    fn ahead(&self, sample_bytes: u64) -> u32 {
        let batch_bytes = u64::from(self.batch).saturating_mul(sample_bytes).max(1);
        let wanted = self.waiting.div_ceil(u64::from(self.batch.max(1))) + 1;
        wanted.min((ARENA_AHEAD_BYTES / batch_bytes).max(2)).max(1) as u32
    }
}

#[derive(Default)]
struct Kept {
    /// Nothing but this process can write these.
    ready: Vec<Reusable>,
    /// A worker process that may still write them lives.
    quarantined: Vec<(Reusable, ProcessWatch)>,
    /// Segments made, for tests and logs.
    made: u64,
}

/// A segment and which of its slots already have their pages.
struct Reusable {
    segment: Segment,
    populated: Vec<bool>,
}

impl Segments {
    pub(crate) fn new(
        keep: usize,
        arena_plan: Option<(ArenaPlan, Arc<dyn HostAllocator>)>,
    ) -> Self {
        Segments {
            state: Mutex::new(Kept::default()),
            keep,
            arena_plan,
            arena: Mutex::new(None),
        }
    }

    /// The batch arena a same-host connection has already made for samples of `sample_bytes`
    /// (an epoch whose workers are all reached over QUIC binds no batches ahead).
    pub(crate) fn made_arena(&self, sample_bytes: u64) -> Option<Arc<Arena>> {
        let (plan, _) = self.arena_plan.as_ref()?;
        let a = self.arena.lock().ok()?;
        a.as_ref()?
            .as_ref()
            .filter(|a| a.fits(plan.batch, sample_bytes))
            .cloned()
    }

    /// The batch arena for samples of `sample_bytes`, made on first use; `None` when the
    /// loader's batches do not live in one (or it could not be made: batches are then
    /// filled by copies, as over QUIC).
    pub(crate) fn arena(&self, sample_bytes: u64) -> Option<Arc<Arena>> {
        let (plan, allocator) = self.arena_plan.as_ref()?;
        let mut a = self.arena.lock().ok()?;
        match a.as_ref() {
            Some(Some(arena)) if arena.fits(plan.batch, sample_bytes) => {
                return Some(arena.clone())
            }
            Some(None) => return None,
            _ => {}
        }
        // The ring, the batches bound ahead, and a few for buffers retired while a stalled
        // worker may still write them.
        let ahead = plan.ahead(sample_bytes);
        let buffers = plan.ring + ahead + (ahead / 4).max(2);
        let made = Arena::create((buffers, plan.batch, sample_bytes, ahead), &**allocator);
        let arena = match made {
            Ok(Some(arena)) => {
                tracing::debug!(buffers, ahead, "same-host batch arena made");
                Some(arena)
            }
            Ok(None) => {
                tracing::debug!("the loader's allocator keeps batches in its own buffers");
                None
            }
            Err(e) => {
                tracing::warn!("no same-host batch arena ({e}): batches are filled by copies");
                None
            }
        };
        *a = Some(arena.clone());
        arena
    }

    /// A segment of `slots` slots of `slot_bytes`: a kept one nobody else can write, else a
    /// new one.
    fn take(&self, slots: u32, slot_bytes: u64) -> Result<Reusable, ShmError> {
        if let Ok(mut k) = self.state.lock() {
            k.release_exited(self.keep);
            let fits =
                |r: &Reusable| r.segment.slots() == slots && r.segment.slot_bytes() == slot_bytes;
            if let Some(i) = k.ready.iter().position(fits) {
                tracing::debug!(slots, "same-host segment kept from an earlier connection");
                return Ok(k.ready.swap_remove(i));
            }
            k.made += 1;
            tracing::debug!(slots, made = k.made, "same-host segment made");
        }
        Ok(Reusable {
            segment: Segment::create("sluice-slots", slots, slot_bytes)?,
            populated: vec![false; slots as usize],
        })
    }

    /// A connection's segment comes back: ready for the next one when no worker can write it
    /// any more, quarantined while its worker's process lives, dropped when neither can be
    /// told.
    fn give_back(&self, segment: Reusable, writers_done: bool, watch: Option<ProcessWatch>) {
        let Ok(mut k) = self.state.lock() else { return };
        k.release_exited(self.keep);
        tracing::debug!(
            writers_done,
            watched = watch.is_some(),
            "same-host segment back from its connection"
        );
        let nobody_writes = writers_done || watch.as_ref().is_some_and(ProcessWatch::exited);
        if nobody_writes {
            if k.ready.len() < self.keep {
                k.ready.push(segment);
            }
        } else if let Some(w) = watch {
            if k.quarantined.len() >= self.keep {
                // The oldest goes: its memory lives on only in the worker's mapping.
                k.quarantined.remove(0);
            }
            k.quarantined.push((segment, w));
        }
    }

    /// (ready, quarantined, made so far).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize, u64) {
        self.state
            .lock()
            .map(|k| (k.ready.len(), k.quarantined.len(), k.made))
            .unwrap_or_default()
    }
}

impl Kept {
    /// Quarantined segments whose worker has exited become ready (up to `keep`).
    fn release_exited(&mut self, keep: usize) {
        let mut i = 0;
        while i < self.quarantined.len() {
            if self.quarantined[i].1.exited() {
                let (segment, _) = self.quarantined.swap_remove(i);
                if self.ready.len() < keep {
                    self.ready.push(segment);
                }
            } else {
                i += 1;
            }
        }
    }
}

struct PoolState {
    free: Vec<u32>,
    /// Whether each slot is granted to the worker.
    granted: Vec<bool>,
    /// How many are.
    granted_count: usize,
    /// Whether each slot's pages were made by this process (charged to it), before its first
    /// grant.
    populated: Vec<bool>,
    /// Credits the coordinator returned that no free slot has carried yet.
    owed: u32,
    /// Most slots granted and not yet filled at once: the window, or fewer on a connection
    /// sharing the batch arena ([`SlotPool::granting_at_most`], as `crate::session::slot_bound` says).
    bound: u32,
    /// Units assigned on this connection that have not ended, with the samples each still
    /// owes: while any has not, the worker may still write a slot. A unit ends with its
    /// report (done or failed) or with its last sample or skip, whichever comes first (at an
    /// epoch's end the connection may close before the report arrives).
    running: std::collections::HashMap<(u64, u32), u64>,
}

/// A connection's segment and who holds which slot.
pub(crate) struct SlotPool {
    /// Taken out only in `Drop`, to go home.
    segment: std::mem::ManuallyDrop<Segment>,
    state: Mutex<PoolState>,
    released: Notify,
    /// Where a sample that must wait for its turn is copied to, freeing its slot.
    buffers: Arc<BufferPool>,
    /// The connection's credit window: slots free or granted never drop below it.
    window: u32,
    /// Where the segment goes when the connection and its samples are done.
    home: Arc<Segments>,
    /// The worker's process.
    watch: Mutex<Option<ProcessWatch>>,
}

impl SlotPool {
    /// A segment of `window` slots for the credits plus `spare` for samples waiting for their
    /// turn, one that `home` kept if it has one.
    pub(crate) fn create(
        window: u32,
        spare: u32,
        slot_bytes: u64,
        buffers: Arc<BufferPool>,
        home: Arc<Segments>,
    ) -> Result<Self, ShmError> {
        let slots = window.saturating_add(spare);
        let Reusable { segment, populated } = home.take(slots, slot_bytes)?;
        Ok(SlotPool {
            segment: std::mem::ManuallyDrop::new(segment),
            buffers,
            window,
            home,
            watch: Mutex::new(None),
            state: Mutex::new(PoolState {
                // Granted from the end: the lowest slots first, and the most recently freed
                // again, so the pages touched stay about as many as are in use.
                free: (0..slots).rev().collect(),
                granted: vec![false; slots as usize],
                granted_count: 0,
                populated,
                owed: 0,
                bound: window,
                running: Default::default(),
            }),
            released: Notify::new(),
        })
    }

    /// Grants at first at most `bound` slots not yet filled at a time (never more than the
    /// window), the rest of the credits owed until the worker fills some; for a connection
    /// sharing the batch arena, where a sample takes a slot only when it arrives before its
    /// place. Every slot granted first gets its pages from this process (2.3 µs a page on
    /// this project's VMs, 37 pages for a 224² tensor), and a grant of the whole window gave
    /// a connection 128 slots of pages while it filled 24 (loadgen, 196 samples, its first
    /// epoch; about 8 an epoch after). The worker is granted more as it fills them, once half
    /// the bound is filled ([`SlotPool::filled`]); one that fills every slot it has before
    /// more come (its samples mostly arrive before their places) doubles the bound, up to
    /// the window, so a worker that needs the slots is not held to the few.
    pub(crate) fn granting_at_most(self, bound: u32) -> Self {
        if let Ok(mut s) = self.state.lock() {
            s.bound = bound.clamp(1, self.window.max(1));
        }
        self
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// The worker's process, watched so the segment can be used again once it has exited.
    pub(crate) fn watch(&self, watch: ProcessWatch) {
        if let Ok(mut w) = self.watch.lock() {
            *w = Some(watch);
        }
    }

    /// Unit `(unit, attempt)` of `samples` samples was assigned on this connection: until it
    /// ends, the worker may write.
    pub(crate) fn assigned(&self, unit: u64, attempt: u32, samples: u64) {
        if let Ok(mut s) = self.state.lock() {
            if samples > 0 {
                s.running.insert((unit, attempt), samples);
            }
        }
    }

    /// A sample or skip of unit `(unit, attempt)` arrived: after its last, the unit has
    /// nothing left to write.
    pub(crate) fn answered(&self, unit: u64, attempt: u32) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(left) = s.running.get_mut(&(unit, attempt)) {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    s.running.remove(&(unit, attempt));
                }
            }
        }
    }

    /// Unit `(unit, attempt)` reported its end (done or failed): it writes no more.
    pub(crate) fn unit_ended(&self, unit: u64, attempt: u32) {
        if let Ok(mut s) = self.state.lock() {
            s.running.remove(&(unit, attempt));
        }
    }

    /// Adds `credits` to what is owed and grants as many free slots as it can (up to the
    /// bound of slots granted at once), once at least `at_least` (or all that is owed) can go
    /// in one frame: the slots to send, or `None` for now.
    pub(crate) fn grant(&self, credits: u32, at_least: u32) -> Option<Vec<u32>> {
        let mut s = self.state.lock().ok()?;
        s.owed = s.owed.saturating_add(credits);
        let room = (s.bound as usize).saturating_sub(s.granted_count);
        let n = (s.owed as usize).min(s.free.len()).min(room);
        if n == 0 || n < (at_least.min(s.owed)) as usize {
            return None;
        }
        let at = s.free.len() - n;
        let slots: Vec<u32> = s.free.split_off(at);
        let mut fresh = Vec::new();
        for &slot in &slots {
            s.granted[slot as usize] = true;
            if !std::mem::replace(&mut s.populated[slot as usize], true) {
                fresh.push(slot);
            }
        }
        s.granted_count += n;
        s.owed -= n as u32;
        drop(s);
        // The segment is the client's memory (its waiting samples live there): its pages are
        // made here, charged to this process, not by the worker's first write. A kept
        // segment's slots have theirs already. Outside the lock (a slot's pages take a
        // fraction of a millisecond, and the reader marks slots filled meanwhile); the worker
        // learns of these slots only from the frame sent after this returns.
        for slot in fresh {
            if let Err(e) = self.segment.populate(slot) {
                tracing::debug!("same-host slot {slot}: {e}");
            }
        }
        Some(slots)
    }

    /// The worker says `slot` holds a sample: it becomes the client's until the returned
    /// reference is dropped. A slot that was not granted is a protocol error. Under a bound
    /// of slots granted at once, the worker is granted more (through [`SlotPool::released`]
    /// and [`SlotPool::regrant`]) once half of it is filled and credits are owed; the bound
    /// doubles (up to the window) when every slot granted was filled before more came.
    pub(crate) fn filled(self: &Arc<Self>, slot: u32) -> Result<SlotRef, String> {
        let mut s = self.state.lock().map_err(|_| "slot state poisoned")?;
        match s.granted.get_mut(slot as usize) {
            Some(g @ true) => {
                *g = false;
                s.granted_count -= 1;
                if s.bound < self.window && s.owed > 0 {
                    if s.granted_count == 0 {
                        s.bound = s.bound.saturating_mul(2).min(self.window);
                    }
                    if s.granted_count <= (s.bound / 2) as usize {
                        self.released.notify_one();
                    }
                }
            }
            Some(false) => return Err(format!("sample in slot {slot}, which was not granted")),
            None => {
                return Err(format!(
                    "sample in slot {slot}; the segment has {}",
                    self.segment.slots()
                ))
            }
        }
        Ok(SlotRef {
            pool: self.clone(),
            slot,
        })
    }

    /// Whether one more filled slot may stay with a sample waiting for its turn: the slots
    /// free or granted still cover the credit window, so every credit the coordinator
    /// returns finds a slot.
    fn may_hold(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.free.len() + s.granted_count >= self.window as usize)
    }

    /// Grants slots freed by the consumer (or owed under the bound of slots granted at once)
    /// once an eighth of that bound (or all that is owed) can go in one frame, rather than a
    /// frame per slot.
    pub(crate) fn regrant(&self) -> Option<Vec<u32>> {
        let bound = self.state.lock().map_or(self.window, |s| s.bound);
        self.grant(0, (bound / 8).max(1))
    }

    /// Waits until a slot is freed, or the worker filled half the slots it may be granted at
    /// once while credits are owed.
    pub(crate) async fn released(&self) {
        self.released.notified().await;
    }

    fn free(&self, slot: u32) {
        if let Ok(mut s) = self.state.lock() {
            s.free.push(slot);
        }
        self.released.notify_one();
    }
}

impl Drop for SlotPool {
    /// The connection and every sample it brought are done: the segment goes home, for the
    /// next connection when its worker can no longer write it.
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never touched again.
        let segment = unsafe { std::mem::ManuallyDrop::take(&mut self.segment) };
        // A poisoned state says nothing sure: the segment is dropped, not kept.
        let Ok(s) = self.state.get_mut() else { return };
        let (writers_done, populated) = (s.running.is_empty(), std::mem::take(&mut s.populated));
        let watch = self.watch.get_mut().ok().and_then(Option::take);
        self.home
            .give_back(Reusable { segment, populated }, writers_done, watch);
    }
}

/// A filled slot, the client's until dropped.
pub(crate) struct SlotRef {
    pool: Arc<SlotPool>,
    slot: u32,
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        self.pool.free(self.slot);
    }
}

/// Where a sample's tensor is.
pub(crate) enum Payload {
    /// Handed over in process: the tensor, then the fields.
    Bytes(TensorBuf),
    /// Read off a QUIC stream: the tensor as the stream's own chunks (its decrypted packets,
    /// not copied again before the batch).
    Chunks(Vec<bytes::Bytes>),
    /// In a same-host slot.
    Slot(SlotRef),
    /// Written by the worker straight into its place in a batch of the arena.
    Placed { arena: Arc<Arena>, place: u32 },
}

impl Payload {
    /// The payload of a sample that must wait for its turn: its tensor (`tensor_bytes` of
    /// it) alone, and a same-host slot kept only while the segment can spare it (else the
    /// tensor is copied out into a reused buffer and the slot freed: a waiting sample may
    /// not hold a credit's slot).
    pub(crate) fn detach(self, tensor_bytes: usize) -> Payload {
        match self {
            Payload::Bytes(mut b) => {
                b.truncate(tensor_bytes);
                Payload::Bytes(b)
            }
            // The chunks hold the tensor alone, in their own buffers.
            Payload::Chunks(c) => Payload::Chunks(c),
            // Already where its batch will be.
            Payload::Placed { arena, place } => Payload::Placed { arena, place },
            Payload::Slot(s) if s.pool.may_hold() => Payload::Slot(s),
            Payload::Slot(ref s) => {
                let mut b = crate::buffers::take(&s.pool.buffers, tensor_bytes);
                self.copy_tensor(&mut b);
                Payload::Bytes(b)
            }
        }
    }

    /// Copies the sample's tensor (`dst.len()` bytes) into `dst`.
    pub(crate) fn copy_tensor(&self, dst: &mut [u8]) {
        match self {
            Payload::Bytes(b) => copy_tensor(dst, &b[..dst.len()]),
            // QUIC packets, decrypted in place by the QUIC driver: a plain copy. Streaming
            // stores measured no cheaper (`bench host-cost` and loadgen beside a real worker),
            // the packets' ends falling mid-line.
            Payload::Chunks(chunks) => {
                let mut at = 0;
                for c in chunks {
                    let n = c.len().min(dst.len() - at);
                    dst[at..at + n].copy_from_slice(&c[..n]);
                    at += n;
                }
            }
            // In its place: nothing to copy. Elsewhere (its batch lost a sample before it,
            // and closes the gap), from its settled place.
            Payload::Placed { arena, place } => {
                if arena.place_ptr(*place) != dst.as_ptr() {
                    arena.read(*place, dst);
                }
            }
            Payload::Slot(s) => {
                // Bounded by the slot size, which the link checked against the shape.
                if let Err(e) = s.pool.segment.read(s.slot, dst) {
                    tracing::error!("same-host slot {}: {e}", s.slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
