use std::time::Duration;

use sluice_shard::{Checksum, Compression, ShardInfo};
use sluice_wire::{SampleHeader, SampleShape, UnitDone};

use super::*;
use crate::batch::{HeapAllocator, LastBatch};
use crate::config::LoaderConfig;
use crate::ledger::Ledger;

const SHAPE: SampleShape = SampleShape::image_u8(1, 1, 3);

fn sample(link: usize, unit: u64, attempt: u32, index: u64) -> Event {
    Event::Sample {
        link,
        header: SampleHeader {
            job: 9,
            unit,
            attempt,
            shard: 0,
            index,
            key: format!("{index}"),
            label: Some(index as i64),
            tensor_bytes: 3,
            fields: Vec::new(),
            geometry: Default::default(),
            has: Vec::new(),
        },
        payload: crate::same_host::Payload::Bytes(vec![index as u8; 3].into()),
        fields: Default::default(),
    }
}

/// An epoch of one 8-sample unit in batches of 4 over two links (`w0`, `w1`), with its
/// plan, the links' command queues and its counters.
type TwoLinks = (
    Coordinator,
    Arc<sluice_plan::Sequence>,
    [mpsc::Receiver<Command>; 2],
    Arc<EpochCounters>,
);

fn two_links() -> TwoLinks {
    let manifest = Arc::new(Manifest::new(vec![ShardInfo {
        url: "file:///s.tar".into(),
        size: 1,
        samples: 8,
        checksum: Checksum(0),
        compression: Compression::None,
        replicas: Vec::new(),
    }]));
    let units = vec![sluice_plan::WorkUnit {
        id: 0,
        shard: 0,
        start: 0,
        end: 8,
        padding: false,
        group: 0,
    }];
    let sequence = Arc::new(
        sluice_plan::Sequence::new(&units, sluice_plan::Mixing::default(), 1, 0, 0).unwrap(),
    );
    let (tx0, rx0) = mpsc::channel(16);
    let (tx1, rx1) = mpsc::channel(16);
    let counters = Arc::new(EpochCounters::default());
    let c = Coordinator::new(
        EpochSettings {
            config: Arc::new(LoaderConfig {
                short_batch: ShortBatch::Deliver,
                credits_per_worker: 4,
                receive_window: 1 << 20,
                units_per_worker: 1,
                ring_batches: 2,
                worker_wait: Duration::from_secs(5),
                max_unit_attempts: 3,
                lookahead: 8,
                hedge_after: Duration::from_secs(60),
                labels: Default::default(),
                ..LoaderConfig::default()
            }),
            job: 9,
            epoch: 0,
            batch_plan: BatchPlan::new(8, 4, LastBatch::Partial),
            first_batch: 0,
        },
        manifest,
        (Ledger::new(&units), Reorder::plan(sequence.clone(), 0)),
        vec![("w0".into(), tx0), ("w1".into(), tx1)],
        Arc::new(HeapAllocator),
        counters.clone(),
        Arc::new(Stats::new()),
    );
    (c, sequence, [rx0, rx1], counters)
}

fn ready(link: usize) -> Event {
    Event::Ready {
        link,
        generation: 1,
        shape: SHAPE,
        caches: false,
    }
}

/// Two links; link 0 is lost after some samples, a late frame of its attempt arrives
/// after the reassignment, and the reassigned piece repeats what was already delivered.
#[tokio::test]
async fn reassignment_delivers_each_sample_once_and_counts_duplicates() {
    let (c, sequence, [mut rx0, mut rx1], counters) = two_links();
    let (ev_tx, ev_rx) = mpsc::channel(64);
    let (out_tx, mut out_rx) = mpsc::channel(4);
    let task = tokio::spawn(c.run(ev_rx, out_tx, CancellationToken::new()));
    ev_tx.send(ready(0)).await.unwrap();
    // Link 0 gets its credits and the only piece.
    assert!(matches!(rx0.recv().await, Some(Command::Credit(1, 4))));
    let Some(Command::Assign(1, a)) = rx0.recv().await else {
        panic!("no assignment")
    };
    assert_eq!((a.start, a.end, a.attempt), (0, 8, 0));
    for i in 0..3 {
        ev_tx.send(sample(0, 0, 0, i)).await.unwrap();
    }
    ev_tx
        .send(Event::Lost {
            link: 0,
            generation: 1,
            error: "gone".into(),
            fatal: None,
        })
        .await
        .unwrap();
    // A frame link 0 sent before it died, read after the loss: still new, so kept.
    ev_tx.send(sample(0, 0, 0, 3)).await.unwrap();
    ev_tx.send(ready(1)).await.unwrap();
    assert!(matches!(rx1.recv().await, Some(Command::Credit(1, 4))));
    let Some(Command::Assign(1, b)) = rx1.recv().await else {
        panic!("no reassignment")
    };
    assert_eq!((b.start, b.end), (3, 8), "only what was not yet delivered");
    assert!(b.attempt > 0);
    // Link 1 repeats sample 3 (delivered meanwhile), then sends the rest.
    for i in 3..8 {
        ev_tx.send(sample(1, 0, b.attempt, i)).await.unwrap();
    }
    ev_tx
        .send(Event::UnitDone {
            link: 1,
            done: UnitDone {
                job: 9,
                unit: 0,
                attempt: b.attempt,
                sent: 5,
                skipped: 0,
                storage_bytes: 0,
                cached_bytes: 0,
            },
        })
        .await
        .unwrap();
    let mut ids = Vec::new();
    while let Some(batch) = out_rx.recv().await {
        let batch = batch.unwrap();
        assert_eq!(batch.labels().len(), batch.len());
        ids.extend(batch.ids().iter().map(|id| id.index));
    }
    task.await.unwrap();
    let planned: Vec<u64> = (0..8).map(|p| sequence.at(p).unwrap().1).collect();
    assert_eq!(ids, planned, "batches in the plan's order");
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    let r = counters.report(0, 8);
    assert_eq!((r.duplicates_dropped, r.reassigned), (1, 1));
}
