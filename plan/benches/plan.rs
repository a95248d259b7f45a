//! What planning costs one rank at cluster scale: 1,000,000 shards × 16,384 ranks under each
//! policy (epoch 7, so `partial` has history to cost), plus the rank's delivery order. The
//! goal is under 1 s and 100 MB per rank; the process's peak memory is printed at the end.
//!
//!     cargo bench -p sluice-plan --bench plan
//!
//! `cargo test --benches` runs each case once (CI does), so it cannot rot.

use criterion::{criterion_group, Criterion};
use sluice_plan::{plan_counts, Mixing, PlanConfig, Sequence, ShufflePolicy};

const SHARDS: usize = 1_000_000;
const RANKS: u32 = 16_384;

fn counts() -> Vec<u64> {
    // ImageNet-like shards: about 1,281 samples each, a little uneven.
    (0..SHARDS as u64)
        .map(|i| 1_200 + (i * 7_919) % 160)
        .collect()
}

fn plan_cost(c: &mut Criterion) {
    let counts = counts();
    let mut group = c.benchmark_group("plan one rank, 1M shards x 16384 ranks");
    group.sample_size(10);
    for (name, policy) in [
        ("global", ShufflePolicy::Global),
        ("local", ShufflePolicy::Local),
        ("partial:0.2", ShufflePolicy::Partial(0.2)),
    ] {
        let config = PlanConfig::new(42, RANKS, policy);
        group.bench_function(name, |b| {
            b.iter(|| plan_counts(&counts, &config, 7, 1_234).expect("plan"))
        });
    }
    let config = PlanConfig::new(42, RANKS, ShufflePolicy::Global);
    let units = plan_counts(&counts, &config, 7, 1_234).expect("plan");
    group.bench_function("sequence (delivery order)", |b| {
        b.iter(|| Sequence::new(&units, Mixing::default(), 42, 7, 1_234).expect("sequence"))
    });
    group.finish();
}

criterion_group!(benches, plan_cost);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0);
    eprintln!("peak memory of the whole process: {} MB", peak / 1024);
}
