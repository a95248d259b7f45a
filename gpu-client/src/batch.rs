//! Batches: a bounded ring of reusable host buffers (from a pluggable allocator, so the CUDA
//! path can make them page-locked), and the assembly rule that gives every rank the same
//! number of batches per epoch whatever the decoder skips.
//!
//! Batch `k` of an epoch has a target of `batch_size` samples (the last one the remainder,
//! unless it is dropped). It closes when its delivered plus skipped samples reach the target;
//! skips make it short, or, with [`ShortBatch::TopUp`], its empty slots are filled with copies
//! of its own samples, marked as padding. So a step never waits for a sample that will not
//! come, and the count of batches depends only on the plan.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_wire::{SampleFields, SampleGeometry, SampleShape};

/// How much a ring taken over from the epoch before may grow while the consumer still holds
/// that epoch's batches: to this many times its size (what a ring of this epoch's own would
/// have cost beside it). The consumer may hold as many more batches
/// (`crate::assembly::Assembly::hold_limit`).
pub(crate) const SHARED_RING_GROWTH: usize = 2;

/// Host memory for one batch.
pub trait HostMemory: Send {
    fn as_slice(&self) -> &[u8];
    fn as_mut_slice(&mut self) -> &mut [u8];
}

/// Makes batch buffers. The default gives plain heap memory; the CUDA path gives page-locked.
pub trait HostAllocator: Send + Sync {
    fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String>;

    /// Makes `len` bytes at `ptr`, shared memory this allocator did not make (the same-host
    /// batch arena, where workers write samples straight into batches), fit to hold batches
    /// as its own buffers are: the CUDA allocator page-locks it. Returns what undoes that when
    /// dropped (before the memory is unmapped), or why it failed; `None` when batches must
    /// stay in this allocator's own buffers (the default, for an allocator the loader does
    /// not know: those batches are then filled by copies).
    fn adopt(&self, _ptr: *mut u8, _len: usize) -> Option<Result<Adopted, String>> {
        None
    }
}

/// What [`HostAllocator::adopt`] did to shared memory, undone when dropped.
pub type Adopted = Box<dyn std::any::Any + Send + Sync>;

/// Zeroed heap memory.
pub struct HeapAllocator;

impl HostMemory for Vec<u8> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

impl HostAllocator for HeapAllocator {
    fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String> {
        Ok(Box::new(vec![0u8; bytes]))
    }

    /// Plain memory needs nothing.
    fn adopt(&self, _ptr: *mut u8, _len: usize) -> Option<Result<Adopted, String>> {
        Some(Ok(Box::new(())))
    }
}

/// Keeps the ring buffers of finished epochs for the next ones: page-locked memory is slow to
/// make (the driver pins every page), and every epoch's ring has the same size. A buffer goes
/// back to the spares when its ring is gone; at most `keep` are kept.
pub(crate) struct Recycling {
    inner: Arc<dyn HostAllocator>,
    spares: Arc<Mutex<Vec<Box<dyn HostMemory>>>>,
    keep: usize,
}

impl Recycling {
    pub(crate) fn new(inner: Arc<dyn HostAllocator>, keep: usize) -> Self {
        Recycling {
            inner,
            spares: Arc::new(Mutex::new(Vec::new())),
            keep,
        }
    }

    #[cfg(test)]
    fn spares(&self) -> usize {
        self.spares.lock().map(|s| s.len()).unwrap_or(0)
    }
}

impl HostAllocator for Recycling {
    fn adopt(&self, ptr: *mut u8, len: usize) -> Option<Result<Adopted, String>> {
        self.inner.adopt(ptr, len)
    }

    fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String> {
        let spare = self.spares.lock().ok().and_then(|mut s| {
            let i = s.iter().position(|m| m.as_slice().len() == bytes)?;
            Some(s.swap_remove(i))
        });
        let memory = match spare {
            Some(m) => m,
            None => self.inner.allocate(bytes)?,
        };
        Ok(Box::new(Recycled {
            memory: Some(memory),
            spares: Arc::downgrade(&self.spares),
            keep: self.keep,
        }))
    }
}

/// A buffer that returns to its allocator's spares when dropped.
struct Recycled {
    /// Always `Some` until drop.
    memory: Option<Box<dyn HostMemory>>,
    spares: std::sync::Weak<Mutex<Vec<Box<dyn HostMemory>>>>,
    keep: usize,
}

impl HostMemory for Recycled {
    fn as_slice(&self) -> &[u8] {
        self.memory.as_ref().map_or(&[][..], |m| m.as_slice())
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.memory
            .as_mut()
            .map_or(&mut [][..], |m| m.as_mut_slice())
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let (Some(memory), Some(spares)) = (self.memory.take(), self.spares.upgrade()) else {
            return;
        };
        if let Ok(mut s) = spares.lock() {
            if s.len() < self.keep {
                s.push(memory);
            }
        };
    }
}

/// What happens to a batch that lost samples to the decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShortBatch {
    /// Deliver it with fewer samples.
    #[default]
    Deliver,
    /// Fill the empty slots with copies of the batch's own samples (marked as padding).
    TopUp,
}

pub use sluice_plan::{BatchPlan, LastBatch};

/// A sample's identity: its shard's index in the manifest and its index in the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleId {
    pub shard: u32,
    pub index: u64,
}

/// What comes with a sample's tensor into its batch.
#[derive(Debug, Default)]
pub(crate) struct SampleMeta {
    /// It repeats a sample to even out ranks (remainder `pad`): marked in `Batch::padding`.
    pub padding: bool,
    pub label: Option<i64>,
    pub key: String,
    pub fields: SampleFields,
    pub geometry: SampleGeometry,
}

/// The free buffers of the ring. A batch returns its buffer when dropped.
pub(crate) struct Ring {
    free: Mutex<Vec<Box<dyn HostMemory>>>,
    notify: tokio::sync::Notify,
    buffers: usize,
    bytes: usize,
    /// Buffers made for this ring, [`Ring::grow`]'s included.
    made: AtomicUsize,
}

/// An epoch's batches that its consumer holds (handed out, not yet dropped). With a batch
/// arena the ring has more buffers than `ring_batches` (those bound ahead), so this, not the
/// ring's free list, bounds what a consumer may keep ([`Held::until_below`]).
#[derive(Default)]
pub(crate) struct Held {
    count: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Held {
    pub(crate) fn now(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Returns once the consumer holds fewer than `limit` of the epoch's batches.
    pub(crate) async fn until_below(&self, limit: usize) {
        loop {
            let notified = self.notify.notified();
            if self.now() < limit {
                return;
            }
            notified.await;
        }
    }

    fn back(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }
}

impl Ring {
    pub(crate) fn new(
        allocator: &dyn HostAllocator,
        buffers: usize,
        bytes: usize,
    ) -> Result<Arc<Self>, String> {
        let free = (0..buffers)
            .map(|_| allocator.allocate(bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Ring {
            free: Mutex::new(free),
            notify: tokio::sync::Notify::new(),
            buffers,
            bytes,
            made: AtomicUsize::new(buffers),
        }))
    }

    /// One more buffer for this ring, from `allocator` (it joins the ring when released), as
    /// long as the ring has fewer than [`SHARED_RING_GROWTH`] times the buffers it was made
    /// with; `None` beyond.
    pub(crate) fn grow(
        &self,
        allocator: &dyn HostAllocator,
    ) -> Option<Result<Box<dyn HostMemory>, String>> {
        let made = self
            .made
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                (m < SHARED_RING_GROWTH * self.buffers).then_some(m + 1)
            });
        made.ok().map(|_| allocator.allocate(self.bytes))
    }

    /// Whether this ring has `buffers` buffers of `bytes`.
    pub(crate) fn fits(&self, buffers: usize, bytes: usize) -> bool {
        self.buffers == buffers && self.bytes == bytes
    }

    fn take(&self) -> Option<Box<dyn HostMemory>> {
        self.free.lock().ok()?.pop()
    }

    /// A free buffer, if there is one now.
    pub(crate) fn try_acquire(&self) -> Option<Box<dyn HostMemory>> {
        self.take()
    }

    /// A free buffer, waiting for the consumer to release one.
    pub(crate) async fn acquire(&self) -> Box<dyn HostMemory> {
        loop {
            let notified = self.notify.notified();
            if let Some(b) = self.take() {
                return b;
            }
            notified.await;
        }
    }

    /// Returns once the ring has a free buffer, without taking it (its waiter then takes it
    /// with [`Ring::try_acquire`]).
    pub(crate) async fn until_free(&self) {
        loop {
            let notified = self.notify.notified();
            if self.free.lock().is_ok_and(|f| !f.is_empty()) {
                return;
            }
            notified.await;
        }
    }

    fn release(&self, buf: Box<dyn HostMemory>) {
        if let Ok(mut free) = self.free.lock() {
            free.push(buf);
        }
        self.notify.notify_one();
    }
}

/// A batch of samples in host memory: uint8 (or the pipeline's dtype) tensors back to back,
/// with labels and sample ids. Its buffer goes back to the ring when it is dropped.
pub struct Batch {
    buf: Option<Box<dyn HostMemory>>,
    ring: Arc<Ring>,
    pub(crate) shape: SampleShape,
    pub(crate) epoch: u64,
    pub(crate) index: u64,
    pub(crate) labels: Vec<i64>,
    pub(crate) ids: Vec<SampleId>,
    pub(crate) keys: Vec<String>,
    /// Each sample's requested fields (empty when the job asked for none).
    pub(crate) fields: Vec<SampleFields>,
    /// The fields the loader asked for by name (none for `all` or none).
    pub(crate) requested: Arc<[String]>,
    pub(crate) geometry: Vec<SampleGeometry>,
    pub(crate) padding: Vec<bool>,
    pub(crate) skipped: Vec<(SampleId, String)>,
    /// The (unit, index) of each real sample and skip, for the checkpoint.
    pub(crate) accounted: Vec<(u64, u32, u64)>,
    /// Each sample's source in a mixture (all 0 for a single dataset).
    pub(crate) sources: Vec<u32>,
    /// Counted among its epoch's batches held by the consumer ([`Filling::finish`]).
    held: Option<Arc<Held>>,
}

impl Batch {
    /// The tensors of the batch's samples, `len() × shape` elements.
    pub fn images(&self) -> &[u8] {
        let n = self.ids.len() * self.shape.bytes() as usize;
        self.buf.as_ref().map_or(&[][..], |b| &b.as_slice()[..n])
    }

    /// The raw pointer of [`Batch::images`], valid while the batch lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.images().as_ptr()
    }

    pub fn shape(&self) -> SampleShape {
        self.shape
    }

    /// The batch's dimensions: (N, H, W, C), or (N, C, H, W) for a channels-first pipeline.
    pub fn dims(&self) -> Vec<usize> {
        let s = self.shape;
        let (h, w, c) = (s.height as usize, s.width as usize, s.channels as usize);
        let sample = match s.chw {
            true => [c, h, w],
            false => [h, w, c],
        };
        let mut dims = vec![self.len()];
        // A clip: N×T×H×W×C (N×T×C×H×W channels first).
        if s.frames > 1 {
            dims.push(s.frames as usize);
        }
        dims.extend(sample);
        dims
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Labels, from the field the loader names (`-1` for every sample of a loader with
    /// `label(None)`; a sample whose label field is missing or not an integer is skipped).
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Each sample's requested fields, in batch order: the raw bytes by field name
    /// (`fields()[i].get("txt")`); a field the sample lacks is absent.
    pub fn fields(&self) -> &[SampleFields] {
        &self.fields
    }

    /// Field `name` of sample `i`, if the sample has it.
    pub fn field(&self, i: usize, name: &str) -> Option<&[u8]> {
        self.fields.get(i).and_then(|f| f.get(name))
    }

    /// The fields the loader asked for by name, whether or not any sample has them.
    pub fn requested_fields(&self) -> &[String] {
        &self.requested
    }

    /// The fields asked for by name, then every other field name some sample of the batch
    /// has, in first-seen order: what a consumer can look up.
    pub fn field_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.requested.iter().map(String::as_str).collect();
        for name in self.present_fields() {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Every field name some sample of the batch has, in first-seen order.
    pub fn present_fields(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for (name, _) in self.fields.iter().flat_map(SampleFields::iter) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Every field name the batch's samples have, as far as the workers said: the fields
    /// sent, and where a field asked for by name was missing, all of that sample's (its
    /// image field included). In first-seen order.
    pub fn names_samples_have(&self) -> Vec<&str> {
        let mut names = self.present_fields();
        for name in self.fields.iter().flat_map(|f| f.names_it_has()) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        names
    }

    /// Each sample's geometry: the crop box in source pixels that became its tensor, the
    /// source and output sizes, and whether it was flipped.
    pub fn geometry(&self) -> &[SampleGeometry] {
        &self.geometry
    }

    pub fn ids(&self) -> &[SampleId] {
        &self.ids
    }

    /// The samples' keys in their shards.
    /// Each sample's source: its place in the mixture's list of sources (0 for a single
    /// dataset).
    pub fn sources(&self) -> &[u32] {
        &self.sources
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// True for rows that repeat a sample: to even out ranks (remainder `pad`, so every
    /// sample is scored once when these are left out) or to fill a batch that lost samples
    /// (top-up policy).
    pub fn padding(&self) -> &[bool] {
        &self.padding
    }

    /// Samples of this batch the decoder rejected, with the reason; from an `Epoch`, also
    /// those of the batches just before it that were not handed out (every sample skipped).
    pub fn skipped(&self) -> &[(SampleId, String)] {
        &self.skipped
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batch's step in the epoch, from 0, as a training loop counts it: after a resume
    /// at another world size (or in a mixture's later round), the batches each rank took
    /// before plus its place in the rest.
    pub fn index(&self) -> u64 {
        self.index
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        give_back(&mut self.held, &mut self.buf, &self.ring);
    }
}

/// A batch (or its buffer) the consumer let go of: no longer counted among those it holds,
/// and its buffer back in its ring.
fn give_back(held: &mut Option<Arc<Held>>, buf: &mut Option<Box<dyn HostMemory>>, ring: &Ring) {
    if let Some(held) = held.take() {
        held.back();
    }
    if let Some(buf) = buf.take() {
        ring.release(buf);
    }
}

/// A batch's buffer taken out of it ([`Batch::detach_buffer`]): it goes back to the ring when
/// dropped.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct DetachedBuffer {
    buf: Option<Box<dyn HostMemory>>,
    ring: Arc<Ring>,
    /// Counted among its epoch's batches held by the consumer.
    held: Option<Arc<Held>>,
}

impl Drop for DetachedBuffer {
    fn drop(&mut self) {
        give_back(&mut self.held, &mut self.buf, &self.ring);
    }
}

impl Batch {
    /// Takes the buffer out of the batch, whose images are empty from then on; the buffer
    /// returns to the ring when the result is dropped. The device path does this once its
    /// copy has read the buffer, so the ring refills while the consumer still holds the
    /// device batch.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn detach_buffer(&mut self) -> Option<DetachedBuffer> {
        let buf = self.buf.take()?;
        Some(DetachedBuffer {
            buf: Some(buf),
            ring: self.ring.clone(),
            held: self.held.take(),
        })
    }
}

/// The batch being filled.
pub(crate) struct Filling {
    batch: Batch,
    target: usize,
}

impl Filling {
    pub(crate) fn new(
        buf: Box<dyn HostMemory>,
        ring: Arc<Ring>,
        shape: SampleShape,
        (epoch, index): (u64, u64),
        target: usize,
        requested: Arc<[String]>,
    ) -> Self {
        Filling {
            batch: Batch {
                buf: Some(buf),
                ring,
                shape,
                epoch,
                index,
                requested,
                labels: Vec::with_capacity(target),
                ids: Vec::with_capacity(target),
                keys: Vec::with_capacity(target),
                fields: Vec::with_capacity(target),
                geometry: Vec::with_capacity(target),
                padding: Vec::with_capacity(target),
                skipped: Vec::new(),
                accounted: Vec::with_capacity(target),
                sources: Vec::new(),
                held: None,
            },
            target,
        }
    }

    /// Puts a sample in the next slot: `fill` copies its tensor into it.
    pub(crate) fn push(
        &mut self,
        fill: impl FnOnce(&mut [u8]),
        id: SampleId,
        unit: u64,
        meta: SampleMeta,
    ) {
        let b = &mut self.batch;
        let n = b.shape.bytes() as usize;
        let at = b.ids.len() * n;
        if let Some(buf) = b.buf.as_mut() {
            fill(&mut buf.as_mut_slice()[at..at + n]);
        }
        b.labels.push(meta.label.unwrap_or(-1));
        b.ids.push(id);
        b.keys.push(meta.key);
        b.fields.push(meta.fields);
        b.geometry.push(meta.geometry);
        b.padding.push(meta.padding);
        b.accounted.push((unit, id.shard, id.index));
    }

    /// Samples in the batch so far: where the next one goes.
    pub(crate) fn len(&self) -> usize {
        self.batch.ids.len()
    }

    /// Bytes of one sample's tensor.
    pub(crate) fn sample_bytes(&self) -> usize {
        self.batch.shape.bytes() as usize
    }

    /// The batch's position in the epoch.
    pub(crate) fn index(&self) -> u64 {
        self.batch.index
    }

    /// The batch's buffer.
    pub(crate) fn buffer(&self) -> Option<&[u8]> {
        self.batch.buf.as_ref().map(|b| b.as_slice())
    }

    /// The batch's buffer, to write samples the coordinator put off.
    pub(crate) fn buffer_mut(&mut self) -> Option<&mut [u8]> {
        self.batch.buf.as_mut().map(|b| b.as_mut_slice())
    }

    /// Puts `buf` in place of the batch's buffer, which is returned.
    pub(crate) fn replace_buffer(
        &mut self,
        buf: Box<dyn HostMemory>,
    ) -> Option<Box<dyn HostMemory>> {
        self.batch.buf.replace(buf)
    }

    pub(crate) fn skip(&mut self, id: SampleId, reason: String, unit: u64) {
        self.batch.skipped.push((id, reason));
        self.batch.accounted.push((unit, id.shard, id.index));
    }

    pub(crate) fn is_full(&self) -> bool {
        self.batch.ids.len() + self.batch.skipped.len() >= self.target
    }

    /// The finished batch, counted in `held` until it is dropped; with `TopUp`, skipped slots
    /// repeat the batch's samples in order.
    pub(crate) fn finish(mut self, policy: ShortBatch, held: &Arc<Held>) -> Batch {
        let b = &mut self.batch;
        let real = b.ids.len();
        if policy == ShortBatch::TopUp && real > 0 {
            let n = b.shape.bytes() as usize;
            for k in 0..b.skipped.len() {
                let src = k % real;
                if let Some(buf) = b.buf.as_mut() {
                    let dst = b.ids.len() * n;
                    buf.as_mut_slice().copy_within(src * n..src * n + n, dst);
                }
                b.labels.push(b.labels[src]);
                b.ids.push(b.ids[src]);
                b.keys.push(b.keys[src].clone());
                b.fields.push(b.fields[src].clone());
                b.geometry.push(b.geometry[src]);
                b.padding.push(true);
            }
        }
        held.count.fetch_add(1, Ordering::AcqRel);
        self.batch.held = Some(held.clone());
        self.batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what the inner allocator was asked for.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl HostAllocator for Counting {
        fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            HeapAllocator.allocate(bytes)
        }
    }

    #[test]
    fn a_later_ring_reuses_the_buffers_of_a_finished_one() {
        let inner = Arc::new(Counting(Default::default()));
        let recycling = Recycling::new(inner.clone(), 3);
        let made = || inner.0.load(std::sync::atomic::Ordering::Relaxed);
        let first = Ring::new(&recycling, 3, 64).unwrap();
        assert_eq!(made(), 3);
        // A ring still alive keeps its buffers: a second one makes its own.
        let second = Ring::new(&recycling, 3, 64).unwrap();
        assert_eq!(made(), 6);
        drop(first);
        drop(second);
        // Only `keep` spares are kept; the rest are freed.
        assert_eq!(recycling.spares(), 3);
        let third = Ring::new(&recycling, 3, 64).unwrap();
        assert_eq!(made(), 6);
        assert_eq!(third.take().map(|b| b.as_slice().len()), Some(64));
        // A different size is never handed a spare of the wrong length.
        let _other = Ring::new(&recycling, 1, 32).unwrap();
        assert_eq!(made(), 7);
    }

    fn shape() -> SampleShape {
        SampleShape::image_u8(1, 2, 1)
    }

    #[test]
    fn batch_counts_follow_the_last_batch_policy() {
        let p = BatchPlan::new(10, 4, LastBatch::Partial);
        assert_eq!((p.batches, p.target(0), p.target(2)), (3, 4, 2));
        let d = BatchPlan::new(10, 4, LastBatch::Drop);
        assert_eq!((d.batches, d.samples, d.target(1)), (2, 8, 4));
    }

    #[test]
    fn short_batches_are_delivered_or_topped_up_and_buffers_return() {
        let ring = Ring::new(&HeapAllocator, 1, 8).unwrap();
        let id = |i| SampleId { shard: 0, index: i };
        let buf = ring.take().unwrap();
        let mut f = Filling::new(buf, ring.clone(), shape(), (0, 0), 4, Arc::from([]));
        let put = |t: [u8; 2]| move |slot: &mut [u8]| slot.copy_from_slice(&t);
        let meta = |label, key: &str, txt: &[u8]| SampleMeta {
            padding: false,
            label,
            key: key.into(),
            fields: SampleFields::new(vec![("txt".into(), txt.len() as u64)], txt.to_vec())
                .unwrap(),
            geometry: SampleGeometry {
                source: (txt.len() as u32, 1),
                ..SampleGeometry::default()
            },
        };
        f.push(put([1, 2]), id(0), 0, meta(Some(7), "a", b"one"));
        f.skip(id(1), "corrupt".into(), 0);
        f.push(put([3, 4]), id(2), 0, meta(None, "c", b"three"));
        assert!(!f.is_full());
        f.skip(id(3), "truncated".into(), 0);
        assert!(f.is_full());
        let b = f.finish(ShortBatch::TopUp, &Arc::default());
        assert_eq!(b.images(), &[1, 2, 3, 4, 1, 2, 3, 4]);
        assert_eq!(b.labels(), &[7, -1, 7, -1]);
        assert_eq!(b.padding(), &[false, false, true, true]);
        let txt: Vec<_> = (0..4).map(|i| b.field(i, "txt").unwrap()).collect();
        assert_eq!(
            txt,
            [&b"one"[..], b"three", b"one", b"three"],
            "padding repeats fields"
        );
        let heights: Vec<u32> = b.geometry().iter().map(|g| g.source.0).collect();
        assert_eq!(heights, [3, 5, 3, 5]);
        assert_eq!(b.field_names(), ["txt"]);
        assert_eq!(b.dims(), [4, 1, 2, 1]);
        let mut b = b;
        b.shape.frames = 3;
        assert_eq!(b.dims(), [4, 3, 1, 2, 1], "a batch of clips");
        assert!(ring.take().is_none());
        drop(b);
        let buf = ring.take().expect("returned on drop");
        let mut f = Filling::new(buf, ring.clone(), shape(), (0, 1), 2, Arc::from([]));
        f.push(put([5, 6]), id(4), 1, SampleMeta::default());
        f.skip(id(5), "x".into(), 1);
        let b = f.finish(ShortBatch::Deliver, &Arc::default());
        assert_eq!((b.len(), b.images()), (1, &[5u8, 6][..]));
    }
}
