use super::*;
use crate::{EpochPlanner, PlanConfig};

/// Two sources: A of 3,000 samples in 12 shards of 250, B of 800 in 8 shards of 100.
fn counts() -> Vec<u64> {
    let mut c = vec![250; 12];
    c.extend([100; 8]);
    c
}

fn planner(world: u32, weights: &[f64], policy: ShufflePolicy) -> EpochPlanner {
    EpochPlanner {
        counts: counts(),
        config: PlanConfig {
            max_unit_samples: 50,
            ..PlanConfig::new(11, world, policy)
        },
        mixing: Mixing::default(),
        batch_size: 64,
        last_batch: LastBatch::Partial,
        mixture: Some(Mixture {
            shards: vec![12, 8],
            weights: scale_weights(weights).unwrap(),
            epoch_samples: None,
            base: MixBase::default(),
            schedule: None,
            round_samples: DEFAULT_ROUND_SAMPLES,
        }),
    }
}

/// A sample as (shard, index in shard).
type Id = (u32, u64);

/// Each rank's samples of a segment in delivery order.
fn deliveries(p: &EpochPlanner, epoch: u64, resumed: &[Segment], world: u32) -> Vec<Vec<Id>> {
    (0..world)
        .map(|r| {
            let (units, _) = p.segment(epoch, resumed, world, r).unwrap();
            let seq = p.sequence(&units, epoch, resumed, r).unwrap();
            (0..seq.len())
                .map(|pos| {
                    let (u, i) = seq.at(pos).unwrap();
                    (units[u as usize].shard, i)
                })
                .collect()
        })
        .collect()
}

/// The samples of each step (batch `b` of every rank), in step order.
fn steps(ranks: &[Vec<Id>], batch: usize, first: usize, last: usize) -> Vec<Vec<Id>> {
    (first..last)
        .map(|b| {
            ranks
                .iter()
                .flat_map(|r| r.iter().skip(b * batch).take(batch).copied())
                .collect()
        })
        .collect()
}

fn source(shard: u32) -> usize {
    usize::from(shard >= 12)
}

/// Per source, nothing delivered again before its pass ends, nothing skipped.
fn assert_passes(steps: &[Vec<Id>]) {
    let tagged: Vec<Vec<(usize, Id)>> = steps
        .iter()
        .map(|step| step.iter().map(|&id| (source(id.0), id)).collect())
        .collect();
    if let Err(e) = check_passes(&tagged, &[3000, 800]) {
        panic!("{e}");
    }
}

fn share_of_a(ids: &[Id]) -> f64 {
    ids.iter().filter(|id| source(id.0) == 0).count() as f64 / ids.len().max(1) as f64
}

#[test]
fn weights_hold_in_every_window_of_four_batches_and_over_the_epoch() {
    for world in [1, 2, 3] {
        let p = planner(world, &[3.0, 1.0], ShufflePolicy::Global);
        let ranks = deliveries(&p, 0, &[], world);
        let n = ranks[0].len();
        assert!(ranks.iter().all(|r| r.len() == n), "ranks differ in length");
        for r in &ranks {
            for w in r.chunks(256).filter(|w| w.len() == 256) {
                let a = share_of_a(w);
                assert!(
                    (a - 0.75).abs() <= 0.10,
                    "world {world}: a window has {a:.3} of A"
                );
            }
            assert!((share_of_a(r) - 0.75).abs() <= 0.05);
        }
        // The epoch has all 3,800 samples' worth: 2,850 of A (no repeat) and 950 of B, which
        // is upsampled: all 800 once, then 150 of its second pass.
        let all: Vec<Id> = ranks.concat();
        let a: Vec<&Id> = all.iter().filter(|id| source(id.0) == 0).collect();
        let distinct_a: std::collections::HashSet<_> = a.iter().collect();
        let length = 3800 / u64::from(world) * u64::from(world);
        assert_eq!(a.len() as u64, apportion(length, &[3, 1])[0]);
        assert_eq!(
            distinct_a.len(),
            a.len(),
            "world {world}: a sample of A repeated"
        );
        assert_passes(&steps(&ranks, 64, 0, n.div_ceil(64)));
    }
}

#[test]
fn plans_are_pure_functions_and_passes_continue_across_epochs() {
    let p = planner(2, &[3.0, 1.0], ShufflePolicy::Global);
    let again = planner(2, &[3.0, 1.0], ShufflePolicy::Global);
    let mut all_steps = Vec::new();
    for epoch in 0..4 {
        let ranks = deliveries(&p, epoch, &[], 2);
        assert_eq!(ranks, deliveries(&again, epoch, &[], 2));
        let n = ranks[0].len();
        all_steps.extend(steps(&ranks, 64, 0, n.div_ceil(64)));
    }
    assert_passes(&all_steps);
    assert_ne!(deliveries(&p, 0, &[], 2), deliveries(&p, 1, &[], 2));
}

/// `none`: each source's shards in manifest order, pass after pass.
#[test]
fn sequential_mixtures_read_each_source_in_order() {
    let mut p = planner(1, &[1.0, 1.0], ShufflePolicy::Sequential);
    p.mixing = Mixing {
        window_units: 1,
        buffer_samples: 0,
    };
    let ranks = deliveries(&p, 0, &[], 1);
    let b: Vec<Id> = ranks[0]
        .iter()
        .copied()
        .filter(|id| source(id.0) == 1)
        .collect();
    let expected: Vec<Id> = (12..20)
        .flat_map(|s| (0..100).map(move |i| (s, i)))
        .cycle()
        .take(1900)
        .collect();
    assert!(
        b == expected,
        "source B is not read in manifest order, pass after pass"
    );
}

/// A checkpoint at 2 ranks after 10 batches resumes at 3: with the same weights the new
/// world delivers exactly what the old one had not (the rest divides by 3 here).
#[test]
fn a_resume_at_another_world_delivers_exactly_the_rest() {
    let two = planner(2, &[3.0, 1.0], ShufflePolicy::Global);
    let before = deliveries(&two, 0, &[], 2);
    let done = 10 * 64;
    let seg = Segment {
        world_size: 2,
        batches: 10,
        weights: two.mixture.as_ref().unwrap().weights.clone(),
    };
    let mut three = planner(3, &[3.0, 1.0], ShufflePolicy::Global);
    three.mixture.as_mut().unwrap().base.resumed = vec![seg.clone()];
    let after = deliveries(&three, 0, std::slice::from_ref(&seg), 3);
    let n = after[0].len();
    assert!(after.iter().all(|r| r.len() == n));
    let mut rest: Vec<Id> = before
        .iter()
        .flat_map(|r| r[done..].iter().copied())
        .collect();
    let mut got: Vec<Id> = after.concat();
    rest.sort_unstable();
    got.sort_unstable();
    assert_eq!((3800 - 2 * done) % 3, 0);
    assert_eq!(got, rest);
    for r in &after {
        for w in r.chunks(256).filter(|w| w.len() == 256) {
            assert!((share_of_a(w) - 0.75).abs() <= 0.10);
        }
    }
}

/// New weights at a checkpoint: each source's pass goes on (nothing repeated within a pass,
/// nothing skipped) through the rest of the epoch and the epochs after, and the rest follows
/// the new weights.
#[test]
fn new_weights_at_a_checkpoint_continue_each_source_s_pass() {
    for (world, new_world) in [(2, 2), (2, 3)] {
        let old = planner(world, &[3.0, 1.0], ShufflePolicy::Global);
        let before = deliveries(&old, 0, &[], world);
        let seg = Segment {
            world_size: world,
            batches: 12,
            weights: old.mixture.as_ref().unwrap().weights.clone(),
        };
        let mut all = steps(&before, 64, 0, 12);
        let mut new = planner(new_world, &[1.0, 1.0], ShufflePolicy::Global);
        new.mixture.as_mut().unwrap().base.resumed = vec![seg.clone()];
        let after = deliveries(&new, 0, std::slice::from_ref(&seg), new_world);
        let n = after[0].len();
        assert!(after.iter().all(|r| r.len() == n));
        let share = share_of_a(&after.concat());
        assert!(
            (share - 0.5).abs() <= 0.01,
            "{share:.3} of A after the change"
        );
        all.extend(steps(&after, 64, 0, n.div_ceil(64)));
        // The epoch keeps its length (rounded for the new world).
        let delivered: usize = all.iter().map(Vec::len).sum();
        assert!(
            3800 - delivered < new_world as usize,
            "{delivered} samples in the epoch"
        );
        for epoch in 1..4 {
            let ranks = deliveries(&new, epoch, &[], new_world);
            let n = ranks[0].len();
            all.extend(steps(&ranks, 64, 0, n.div_ceil(64)));
        }
        assert_passes(&all);
    }
}

#[test]
fn a_fixed_epoch_length_and_drop_last_round_to_whole_batches() {
    let mut p = planner(3, &[1.0, 4.0], ShufflePolicy::Global);
    p.last_batch = LastBatch::Drop;
    p.mixture.as_mut().unwrap().epoch_samples = Some(5000);
    let ranks = deliveries(&p, 0, &[], 3);
    assert_eq!(ranks[0].len(), 5000 / (3 * 64) * 64);
    let (_, plan) = p.segment(0, &[], 3, 0).unwrap();
    assert_eq!(plan.samples, ranks[0].len() as u64);
    assert!((share_of_a(&ranks.concat()) - 0.2).abs() < 0.01);
}

#[test]
fn apportion_and_weights() {
    assert_eq!(apportion(10, &[1, 1, 1]), vec![4, 3, 3]);
    assert_eq!(apportion(7, &[3, 1]), vec![5, 2]);
    assert_eq!(apportion(0, &[3, 1]), vec![0, 0]);
    assert_eq!(
        scale_weights(&[0.7, 0.3]).unwrap(),
        vec![700_000_000, 300_000_000]
    );
    assert!(scale_weights(&[0.0, 0.0]).is_err());
    assert!(scale_weights(&[1.0, f64::NAN]).is_err());
    assert!(scale_weights(&[1.0, -1.0]).is_err());
    assert_eq!(settle(&[10, 5], 12, &[1, 1]), vec![8, 4]);
    assert_eq!(settle(&[10, 0], 7, &[1, 1]), vec![7, 0]);
    assert_eq!(merge(vec![vec![0, 1, 2], vec![9]]), vec![0, 1, 9, 2]);
    assert_eq!(merge(vec![vec![0, 1], vec![8, 9]]), vec![0, 8, 1, 9]);
}

#[test]
fn local_shuffles_and_empty_sources_are_refused() {
    let p = planner(2, &[1.0, 1.0], ShufflePolicy::Local);
    let m = p.mixture.as_ref().unwrap();
    assert!(matches!(
        m.validate(&p.counts, &p.config),
        Err(PlanError::Policy(_))
    ));
    let mut c = counts();
    for x in &mut c[12..] {
        *x = 0;
    }
    let g = planner(2, &[1.0, 1.0], ShufflePolicy::Global);
    assert_eq!(
        g.mixture.as_ref().unwrap().validate(&c, &g.config),
        Err(PlanError::EmptySource { index: 1 })
    );
}

/// A's scheduled share at step `s`: 0.9 until step 4, then a line to 0.3 at step 20.
fn scheduled_share(s: u64) -> f64 {
    match s {
        0..=4 => 0.9,
        5..=19 => 0.9 - 0.6 * (s - 4) as f64 / 16.0,
        _ => 0.3,
    }
}

fn scheduled(world: u32) -> EpochPlanner {
    let mut p = planner(world, &[1.0, 1.0], ShufflePolicy::Global);
    let points = [(4, vec![0.9, 0.1]), (20, vec![0.3, 0.7])];
    p.mixture.as_mut().unwrap().schedule =
        Some(Schedule::new(&points, crate::Interpolate::Linear, 2).unwrap());
    p
}

#[test]
fn a_schedule_sets_each_steps_proportions_and_a_resume_keeps_them() {
    // 3,800 samples at 2 ranks of 64: 30 steps an epoch (the last short).
    let two = scheduled(2);
    let before = deliveries(&two, 0, &[], 2);
    let all = steps(&before, 64, 0, 30);
    for (s, step) in all.iter().enumerate().take(29) {
        let want = scheduled_share(s as u64);
        let got = share_of_a(step);
        assert!(
            (got - want).abs() <= 2.0 / 128.0 + 1e-9,
            "step {s}: {got:.3} for {want:.3}"
        );
    }
    assert_passes(&all);
    // Epoch 1 starts at step 30: the schedule's last weights.
    let next = steps(&deliveries(&two, 1, &[], 2), 64, 0, 29);
    assert!(next
        .iter()
        .all(|s| (share_of_a(s) - 0.3).abs() <= 2.0 / 128.0 + 1e-9));
    // Resumed at 3 ranks after step 10, recording the segment's summed weights: the
    // schedule's proportions go on from step 10, and every pass stays whole.
    let m = two.mixture.as_ref().unwrap();
    let length = Mixture::rounded(m.epoch_length(&two.counts), 2, &two.ctx());
    let weights = m.segment_weights(0, &[], 2, length / 2, &two.ctx());
    let seg = Segment {
        world_size: 2,
        batches: 10,
        weights,
    };
    let mut three = scheduled(3);
    three.mixture.as_mut().unwrap().base.resumed = vec![seg.clone()];
    let after = deliveries(&three, 0, std::slice::from_ref(&seg), 3);
    let resumed = steps(&after, 64, 0, after[0].len() / 64);
    for (k, step) in resumed.iter().enumerate() {
        let want = scheduled_share(10 + k as u64);
        let got = share_of_a(step);
        assert!(
            (got - want).abs() <= 3.0 / 192.0 + 1e-9,
            "step {}: {got:.3} for {want:.3}",
            10 + k
        );
    }
    let mut whole = steps(&before, 64, 0, 10);
    whole.extend(steps(&after, 64, 0, after[0].len().div_ceil(64)));
    assert_passes(&whole);
}

/// Each rank's samples of `epoch` read as a loader reads a mixture drawn in rounds: a round's
/// segment, then the segment after it, until no round is left.
fn rounds(p: &EpochPlanner, epoch: u64, mut resumed: Vec<Segment>, world: u32) -> Vec<Vec<Id>> {
    let mut ranks = vec![Vec::new(); world as usize];
    loop {
        for (r, got) in deliveries(p, epoch, &resumed, world)
            .into_iter()
            .enumerate()
        {
            ranks[r].extend(got);
        }
        let (_, plan, rest) = p.segment_and_rest(epoch, &resumed, world, 0).unwrap();
        if rest.samples <= plan.samples {
            return ranks;
        }
        resumed = p.after_round(epoch, &resumed, world).unwrap();
    }
}

/// A mixture whose rounds are 4 batches of 64 a rank, over an epoch of 20,000 samples (each
/// source read about five times).
fn in_rounds(world: u32) -> EpochPlanner {
    let mut p = planner(world, &[3.0, 1.0], ShufflePolicy::Global);
    let m = p.mixture.as_mut().unwrap();
    m.round_samples = 256;
    m.epoch_samples = Some(20_000);
    p
}

#[test]
fn an_epoch_in_rounds_keeps_every_pass_whole_and_the_weights_in_every_window() {
    let p = in_rounds(2);
    assert_eq!(
        p.rest_plan(0, &[], 2).unwrap().batches,
        10_000_u64.div_ceil(64)
    );
    let (units, plan) = p.segment(0, &[], 2, 0).unwrap();
    assert_eq!(plan.samples, 256, "a segment is one round");
    assert!(units.iter().map(|u| u.len()).sum::<u64>() == 256);
    let ranks = rounds(&p, 0, Vec::new(), 2);
    assert!(ranks.iter().all(|r| r.len() == 10_000));
    let mut all = steps(&ranks, 64, 0, 10_000_usize.div_ceil(64));
    for step in all.chunks(4) {
        let ids: Vec<Id> = step.concat();
        assert!((share_of_a(&ids) - 0.75).abs() <= 0.03);
    }
    // The same again: a pure function of the plan.
    assert_eq!(rounds(&p, 0, Vec::new(), 2), ranks);
    // The next epochs go on from where this one's last round left each source.
    for epoch in 1..3 {
        all.extend(steps(&rounds(&p, epoch, Vec::new(), 2), 64, 0, 157));
    }
    assert_passes(&all);
}

/// A checkpoint in the middle of a round at 2 ranks resumed at 3: the new world takes what
/// the round had left and the rounds not drawn, each pass still whole.
#[test]
fn a_resume_in_the_middle_of_a_round_delivers_exactly_the_rest() {
    let two = in_rounds(2);
    let mut resumed = Vec::new();
    let mut before = vec![Vec::new(); 2];
    for _ in 0..3 {
        let (_, plan) = two.segment(0, &resumed, 2, 0).unwrap();
        for (r, got) in deliveries(&two, 0, &resumed, 2).into_iter().enumerate() {
            before[r].extend(got);
        }
        let weights = two.mixture.as_ref().unwrap().weights.clone();
        resumed.push(Segment {
            world_size: 2,
            batches: plan.batches,
            weights,
        });
    }
    // Two batches into the fourth round.
    let fourth = deliveries(&two, 0, &resumed, 2);
    for (r, got) in fourth.iter().enumerate() {
        before[r].extend(got[..128].iter().copied());
    }
    resumed.push(Segment {
        world_size: 2,
        batches: 2,
        weights: two.mixture.as_ref().unwrap().weights.clone(),
    });
    let mut three = in_rounds(3);
    three.mixture.as_mut().unwrap().base.resumed = resumed.clone();
    let left = three.rest_plan(0, &resumed, 3).unwrap().batches;
    let after = rounds(&three, 0, resumed, 3);
    let delivered = 2 * before[0].len() + 3 * after[0].len();
    assert!(20_000 - delivered < 3, "{delivered} samples in the epoch");
    assert_eq!(left, (after[0].len() as u64).div_ceil(64));
    let mut all = steps(&before, 64, 0, before[0].len() / 64);
    all.extend(steps(&after, 64, 0, after[0].len().div_ceil(64)));
    assert_passes(&all);
}

/// An epoch of 10^9 samples (and of 10^12) plans one round at a time: the first round's plan
/// is as large as a round, and the epoch after it starts where 954 rounds leave the sources.
#[test]
fn an_epoch_of_a_billion_samples_plans_one_round() {
    let mut p = planner(1, &[3.0, 1.0], ShufflePolicy::Global);
    for samples in [1_000_000_000, 1_000_000_000_000] {
        p.mixture.as_mut().unwrap().epoch_samples = Some(samples);
        let (units, plan) = p.segment(0, &[], 1, 0).unwrap();
        assert_eq!(plan.samples, DEFAULT_ROUND_SAMPLES);
        assert!(units.len() as u64 <= 2 * DEFAULT_ROUND_SAMPLES / 50);
        assert_eq!(
            p.rest_plan(0, &[], 1).unwrap().batches,
            samples.div_ceil(64)
        );
    }
    p.mixture.as_mut().unwrap().epoch_samples = Some(1_000_000_000);
    let (state, step) = p.mixture_start(1).unwrap().unwrap();
    assert_eq!(step, 1_000_000_000_u64.div_ceil(64));
    let drawn: u64 = state.iter().map(|s| s.cursor).sum();
    assert_eq!(drawn, 1_000_000_000);
}
