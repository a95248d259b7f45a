use super::*;

fn pool(window: u32, spare: u32, bytes: u64, buffers: &Arc<BufferPool>) -> Arc<SlotPool> {
    let home = Arc::new(Segments::new(2, None));
    Arc::new(SlotPool::create(window, spare, bytes, buffers.clone(), home).unwrap())
}

/// A pool of `window` slots of 4 bytes, granting at most `bound` at once.
fn bounded(window: u32, bound: u32) -> Arc<SlotPool> {
    let home = Arc::new(Segments::new(2, None));
    let buffers = Arc::new(BufferPool::new(4));
    let pool = SlotPool::create(window, 0, 4, buffers, home).unwrap();
    Arc::new(pool.granting_at_most(bound))
}

#[test]
fn slots_move_between_client_and_worker() {
    let pool = pool(3, 0, 8, &Arc::new(BufferPool::new(4)));
    let mut granted = pool.grant(2, 1).unwrap();
    assert_eq!(granted.len(), 2);
    assert!(
        pool.grant(5, 2).is_none(),
        "one slot free, two wanted in a frame"
    );
    assert_eq!(pool.grant(0, 1).unwrap().len(), 1, "only one slot left");
    assert!(
        pool.grant(0, 1).is_none(),
        "four credits owed, no free slot"
    );
    granted.sort();
    let a = pool.filled(granted[0]).unwrap();
    assert!(pool.filled(granted[0]).is_err(), "filled twice");
    assert!(pool.filled(9).is_err(), "outside the segment");
    let mut dst = [1u8; 8];
    Payload::Slot(a).copy_tensor(&mut dst);
    assert_eq!(dst, [0; 8]);
    // Dropping the payload freed its slot: it carries one owed credit.
    assert_eq!(pool.grant(0, 1), Some(vec![granted[0]]));
}

#[tokio::test]
async fn a_bound_grants_a_few_slots_at_a_time_and_more_as_they_fill() {
    let pool = bounded(8, 4);
    let first = pool.grant(8, 1).unwrap();
    assert_eq!(first.len(), 4, "the bound, not the window");
    assert_eq!(pool.grant(0, 1), None, "the other four credits stay owed");
    let populated = |p: &SlotPool| {
        let s = p.state.lock().unwrap();
        s.populated.iter().filter(|p| **p).count()
    };
    assert_eq!(populated(&pool), 4, "only the slots granted have pages");

    // One filled leaves three out: above half, no more yet.
    let a = pool.filled(first[0]).unwrap();
    let soon = std::time::Duration::from_millis(50);
    assert!(tokio::time::timeout(soon, pool.released()).await.is_err());
    // Two filled: half the bound is out, and credits are owed: the link is woken to
    // grant more, up to the bound again.
    let b = pool.filled(first[1]).unwrap();
    assert!(tokio::time::timeout(soon, pool.released()).await.is_ok());
    let more = pool.regrant().unwrap();
    assert_eq!(more.len(), 2);
    assert!(
        more.iter().all(|s| !first.contains(s)),
        "free slots: {more:?}"
    );
    assert_eq!(populated(&pool), 6);
    // Every credit reaches the worker in the end: filled slots freed, the rest granted.
    for slot in first[2..].iter().chain(&more) {
        drop(pool.filled(*slot).unwrap());
    }
    drop((a, b));
    assert_eq!(
        pool.regrant().map(|g| g.len()),
        Some(2),
        "the two still owed"
    );
    assert_eq!(pool.grant(0, 1), None, "nothing owed");
}

#[tokio::test]
async fn a_worker_that_fills_every_slot_before_more_come_gets_a_larger_bound() {
    let pool = bounded(16, 4);
    let soon = std::time::Duration::from_millis(50);
    let first = pool.grant(16, 1).unwrap();
    assert_eq!(first.len(), 4);
    // Its samples arrive before their places: all four filled (and held) before more came.
    let mut held: Vec<SlotRef> = first.iter().map(|s| pool.filled(*s).unwrap()).collect();
    assert!(tokio::time::timeout(soon, pool.released()).await.is_ok());
    let second = pool.regrant().unwrap();
    assert_eq!(second.len(), 8, "the bound doubled");
    held.extend(second.iter().map(|s| pool.filled(*s).unwrap()));
    assert!(tokio::time::timeout(soon, pool.released()).await.is_ok());
    assert_eq!(
        pool.regrant().map(|g| g.len()),
        Some(4),
        "the window's last four credits, the bound now the window"
    );
}

#[test]
fn a_waiting_sample_is_copied_out_and_frees_its_slot() {
    let buffers = Arc::new(BufferPool::new(4));
    let pool = pool(1, 0, 4, &buffers);
    let slot = pool.grant(1, 1).unwrap()[0];
    pool.segment.write(slot, &[1, 2, 3, 4]).unwrap();
    let waiting = Payload::Slot(pool.filled(slot).unwrap()).detach(4);
    let Payload::Bytes(b) = &waiting else {
        panic!("still in its slot")
    };
    assert_eq!(&b[..], [1, 2, 3, 4]);
    assert_eq!(pool.grant(1, 1), Some(vec![slot]), "the slot is free again");
    drop(waiting);
    assert_eq!(
        buffers.spares(4),
        1,
        "the copy's buffer goes back to the loader"
    );
}

#[test]
fn waiting_samples_keep_spare_slots_and_never_the_window() {
    let pool = pool(2, 1, 4, &Arc::new(BufferPool::new(4)));
    let slot = |p: &Payload| match p {
        Payload::Slot(s) => Some(s.slot),
        _ => None,
    };
    let mut granted = pool.grant(2, 1).unwrap();
    // The worker fills both; both samples wait for their turn.
    let a = Payload::Slot(pool.filled(granted.pop().unwrap()).unwrap()).detach(4);
    assert!(
        slot(&a).is_some(),
        "one spare slot: the first keeps its slot"
    );
    assert_eq!(
        pool.grant(1, 1).unwrap().len(),
        1,
        "its credit finds a slot"
    );
    let b = Payload::Slot(pool.filled(granted.pop().unwrap()).unwrap()).detach(4);
    assert_eq!(slot(&b), None, "no spare left: copied out, the slot freed");
    assert_eq!(
        pool.grant(1, 1).unwrap().len(),
        1,
        "the window is whole again"
    );
    drop(a);
    assert_eq!(pool.grant(0, 1), None, "nothing owed");
}

/// A connection's segment after its end: `running` units not reported, its worker
/// watched or not.
fn end(home: &Arc<Segments>, running: bool, watch: Option<ProcessWatch>) {
    let buffers = Arc::new(BufferPool::new(1));
    let pool = SlotPool::create(2, 2, 4, buffers, home.clone()).unwrap();
    let granted = pool.grant(2, 1).unwrap();
    pool.segment.write(granted[0], &[1, 2, 3, 4]).unwrap();
    pool.assigned(7, 0, 3);
    pool.assigned(8, 1, 2);
    pool.assigned(9, 0, 2);
    pool.unit_ended(7, 0);
    // A unit whose every sample arrived has ended, reported or not.
    pool.answered(9, 0);
    pool.answered(9, 0);
    pool.answered(8, 1);
    if !running {
        pool.answered(8, 1);
    }
    if let Some(w) = watch {
        pool.watch(w);
    }
}

#[test]
fn a_segment_is_used_again_only_when_no_worker_can_write_it() {
    let home = Arc::new(Segments::new(2, None));
    // Every unit reported its end: the next connection gets the same segment, its pages
    // already made.
    end(&home, false, None);
    assert_eq!(home.counts(), (1, 0, 1));
    let again = home.take(4, 4).unwrap();
    assert_eq!(home.counts(), (0, 0, 1), "kept, not made");
    assert!(
        again.populated[..2].iter().all(|p| *p),
        "granted slots have their pages"
    );
    assert_eq!(
        home.take(5, 4).unwrap().segment.slots(),
        5,
        "another size is made"
    );
    assert_eq!(home.counts().2, 2);

    // A unit still out and no way to tell when its worker is gone: dropped.
    end(&home, true, None);
    assert_eq!(home.counts(), (0, 0, 3));

    // A unit still out, its worker alive: quarantined until the process exits.
    let mut worker = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let watch = ProcessWatch::of_pid(worker.id() as i32).unwrap();
    end(&home, true, Some(watch));
    assert_eq!(home.counts(), (0, 1, 4));
    let fresh = home.take(4, 4).unwrap();
    assert_eq!(
        home.counts(),
        (0, 1, 5),
        "a live writer's segment is never handed out"
    );
    drop(fresh);
    worker.kill().unwrap();
    worker.wait().unwrap();
    home.take(4, 4).unwrap();
    assert_eq!(
        home.counts(),
        (0, 0, 5),
        "its process exited: the segment is kept"
    );

    // A worker that exited before the connection's end: kept at once.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let watch = ProcessWatch::of_pid(gone.id() as i32).unwrap();
    gone.wait().unwrap();
    end(&home, true, Some(watch));
    assert_eq!(home.counts(), (1, 0, 6));
}

#[test]
fn a_tensor_in_a_streams_chunks_is_copied_whole_and_waits_as_it_is() {
    let chunks = vec![
        bytes::Bytes::from_static(&[1, 2, 3]),
        bytes::Bytes::from_static(&[4]),
        bytes::Bytes::from_static(&[5, 6]),
    ];
    let waiting = Payload::Chunks(chunks).detach(6);
    assert!(
        matches!(&waiting, Payload::Chunks(c) if c.len() == 3),
        "not copied"
    );
    let mut dst = [0u8; 6];
    waiting.copy_tensor(&mut dst);
    assert_eq!(dst, [1, 2, 3, 4, 5, 6]);
}

#[test]
fn only_local_addresses_with_a_socket_are_same_host() {
    let dir = std::env::temp_dir().join(format!("sluice-sh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let addr: SocketAddr = "127.0.0.1:7345".parse().unwrap();
    let why = socket_for(&dir, addr).unwrap_err();
    assert!(
        why.contains("cpu-7345.sock") && why.contains("same_host_dir="),
        "no socket file: {why}"
    );
    std::fs::write(dir.join("cpu-7345.sock"), b"").unwrap();
    assert_eq!(socket_for(&dir, addr), Ok(dir.join("cpu-7345.sock")));
    let remote: SocketAddr = "192.0.2.1:7345".parse().unwrap();
    assert_eq!(
        socket_for(&dir, remote),
        Err("it runs on another machine".into()),
        "TEST-NET is not this machine"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
