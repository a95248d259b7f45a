use std::sync::Arc;

use sluice_wire::SampleShape;

use super::*;
use crate::batch::{HeapAllocator, HostAllocator, Ring};

const SHAPE: SampleShape = SampleShape::image_u8(1, 1, 2);

/// A batch of `size` samples bound to a buffer of `ring`.
fn bound(ring: &Arc<Ring>, index: u64, size: usize, first: Option<u32>) -> Bound {
    let buf = ring.try_acquire().expect("a free buffer");
    let filling = Filling::new(buf, ring.clone(), SHAPE, (0, index), size, Arc::from([]));
    Bound::new(filling, first)
}

fn sample(i: u64) -> (SampleId, u64, SampleMeta) {
    let id = SampleId { shard: 0, index: i };
    (id, 0, SampleMeta::default())
}

#[test]
fn batches_are_bound_ahead_only_as_far_as_samples_arrive_early() {
    let mut a = Assembly::new(10, 3, 0);
    assert_eq!(a.ring_buffers(), 3);
    // No arena: nothing is bound ahead, and the ring alone bounds the consumer.
    assert_eq!(a.bind_ahead(100), None);
    assert_eq!(a.hold_limit(), None);
    a.in_arena(4);
    assert_eq!(a.ring_buffers(), 7);
    assert_eq!(a.hold_limit(), Some(3));
    let ring = Ring::new(&HeapAllocator, 7, 4).unwrap();
    // Nothing early yet: one ahead of the batch being filled (batch 0, not bound yet).
    assert_eq!(a.bind_ahead(0), Some(Step::BindAhead(0)));
    a.bound(bound(&ring, 0, 2, Some(0)));
    assert!(
        a.filling().is_ok(),
        "the next batch is the one being filled"
    );
    assert_eq!(a.bind_ahead(0), Some(Step::BindAhead(1)));
    a.bound(bound(&ring, 1, 2, Some(2)));
    assert_eq!(a.bind_ahead(0), None);
    // Samples reached two batches on: up to three ahead, never past the arena's bound.
    assert_eq!(a.bind_ahead(2), Some(Step::BindAhead(2)));
    a.bound(bound(&ring, 2, 2, Some(4)));
    a.bound(bound(&ring, 3, 2, None));
    assert_eq!(a.bind_ahead(2), None);
    assert_eq!(a.bind_ahead(100), Some(Step::BindAhead(4)));
    assert_eq!(a.bound_batches(), [(0, 0), (1, 2), (2, 4)]);
    assert!(a.is_last(9) && !a.is_last(8));
}

#[test]
fn a_closed_batch_goes_out_in_place_or_fresh_as_its_places_say() {
    let mut a = Assembly::new(4, 2, 0);
    a.in_arena(1);
    let ring = Ring::new(&HeapAllocator, 3, 4).unwrap();
    assert_eq!(a.filling().err(), Some(Step::Reserve(0)));
    a.bound(bound(&ring, 0, 2, Some(10)));
    // Place 11 may still be written by a worker: its sample waits, the batch goes out in
    // place once nothing is owned, with the sample written at its position.
    let owned = |p: u32| p == 11;
    let arena = None;
    for i in 0..2 {
        let f = a.filling().expect("bound");
        let at = f.filling.len();
        assert_eq!(
            landing(f.first, at, None, owned),
            [Landing::Copy, Landing::Defer][i as usize]
        );
        let payload = Payload::Bytes(vec![i as u8 + 1; 2].into());
        f.push(payload, sample(i), arena);
    }
    let (b, settle) = a.close(2, |_| false).expect("a batch");
    assert_eq!(settle, Settle::InPlace);
    let filling = b.settle(None);
    assert_eq!(filling.buffer(), Some(&[1u8, 1, 2, 2][..]));
    // The next batch is filled next; one whose places are owned is copied into a fresh one.
    assert_eq!(a.filling().err(), Some(Step::Reserve(1)));
    a.bound(bound(&ring, 1, 1, Some(12)));
    let f = a.filling().expect("bound");
    f.push(Payload::Bytes(vec![7; 2].into()), sample(2), None);
    let (b, settle) = a.close(1, |r| r.contains(&12)).expect("a batch");
    assert_eq!(settle, Settle::Fresh);
    let fresh = HeapAllocator.allocate(2).unwrap();
    assert_eq!(b.settle(Some(fresh)).buffer(), Some(&[7u8, 7][..]));
}

#[test]
fn only_a_shared_ring_grows_and_only_while_its_consumer_waits() {
    let mut a = Assembly::new(4, 2, 0);
    a.in_arena(2);
    assert!(!a.growth().may_grow() && !a.growth().grow(true));
    assert_eq!(a.hold_limit(), Some(2));
    a.share_ring();
    assert!(a.growth().may_grow() && a.growth().grow(true) && !a.growth().grow(false));
    assert_eq!(a.hold_limit(), Some(2 * SHARED_RING_GROWTH));
}

#[test]
fn a_sample_waits_only_where_a_worker_may_still_write_its_place() {
    let owned = |p: u32| p == 12;
    assert_eq!(landing(None, 2, None, owned), Landing::Copy);
    assert_eq!(landing(Some(10), 2, Some(12), owned), Landing::Copy);
    assert_eq!(landing(Some(10), 2, None, owned), Landing::Defer);
    assert_eq!(landing(Some(10), 2, Some(40), owned), Landing::Defer);
    assert_eq!(landing(Some(10), 3, None, owned), Landing::Copy);
    let owned_range = |r: std::ops::Range<u32>| r.contains(&12);
    assert_eq!(settle(Some(10), 4, owned_range), Settle::Fresh);
    assert_eq!(settle(Some(20), 4, owned_range), Settle::InPlace);
    assert_eq!(settle(None, 4, owned_range), Settle::InPlace);
}
