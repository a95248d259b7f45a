//! Property tests of the resume arithmetic: for any plan, world sizes and cut points, the
//! rest of an epoch re-split across a new world is exactly the samples not yet handed out,
//! each new rank takes the same number of steps, and the split is a pure function.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::{Remainder, ShufflePolicy};

type Id = (u32, u64);

/// The samples a world of `world` ranks hands out in its first `batches` batches (after the
/// segments `earlier`), each with whether it is padding.
fn handed_out(
    p: &EpochPlanner,
    epoch: u64,
    earlier: &[Segment],
    world: u32,
    batches: Option<u64>,
) -> Vec<(Id, bool)> {
    let mut out = Vec::new();
    for rank in 0..world {
        let (units, plan) = p.segment(epoch, earlier, world, rank).unwrap();
        let sequence = p.sequence(&units, epoch, earlier, rank).unwrap();
        let done = p.delivered(&sequence, batches.unwrap_or(plan.batches));
        for pos in 0..done {
            let (u, i) = sequence.at(pos).unwrap();
            let unit = units[u as usize];
            out.push(((unit.shard, i), unit.padding));
        }
    }
    out
}

/// How many times each real (not padding) sample occurs.
fn real_counts(samples: &[(Id, bool)]) -> HashMap<Id, u32> {
    let mut counts = HashMap::new();
    for (id, padding) in samples {
        if !padding {
            *counts.entry(*id).or_insert(0) += 1;
        }
    }
    counts
}

fn arb_planner() -> impl Strategy<Value = EpochPlanner> {
    let counts = proptest::collection::vec(prop_oneof![1 => Just(0u64), 8 => 1u64..60], 1..8);
    let policy = prop_oneof![
        Just(ShufflePolicy::Global),
        Just(ShufflePolicy::Local),
        Just(ShufflePolicy::Partial(0.25)),
        Just(ShufflePolicy::Sequential),
    ];
    let remainder = prop_oneof![Just(Remainder::Drop), Just(Remainder::Pad)];
    let last = prop_oneof![Just(LastBatch::Partial), Just(LastBatch::Drop)];
    (
        counts,
        policy,
        remainder,
        last,
        (1u64..10, 1u64..12, any::<u64>()),
        (1u32..5, 0u32..24),
    )
        .prop_filter("a dataset with samples", |(c, ..)| {
            c.iter().sum::<u64>() > 0
        })
        .prop_map(
            |(counts, policy, remainder, last, (batch, unit, seed), (window, buffer))| {
                let sequential = !policy.shuffles();
                EpochPlanner {
                    counts,
                    config: PlanConfig {
                        seed,
                        world_size: 1,
                        policy,
                        remainder,
                        max_unit_samples: unit,
                    },
                    mixing: Mixing {
                        window_units: if sequential { 1 } else { window },
                        buffer_samples: if sequential { 0 } else { buffer },
                    },
                    batch_size: batch,
                    last_batch: last,
                    mixture: None,
                }
            },
        )
}

/// Whether every rank of a world of `world` has samples to plan (remainder "drop" needs at
/// least one sample per rank).
fn plannable(p: &EpochPlanner, samples: u64, world: u32) -> bool {
    p.config.remainder == Remainder::Pad || samples >= u64::from(world)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// One resume: the new world hands out exactly what the old one had not, each new rank
    /// in as many steps as every other, and the same split every time it is computed.
    #[test]
    fn the_rest_resplit_is_exactly_the_unseen_samples_in_equal_steps(
        p in arb_planner(), epoch in 0u64..3, old in 1u32..5, new in 1u32..6, cut in 0.0f64..1.0,
    ) {
        let total: u64 = p.counts.iter().sum();
        prop_assume!(plannable(&p, total, old));
        let (_, plan) = p.segment(epoch, &[], old, 0).unwrap();
        let stop = Segment { world_size: old, batches: (plan.batches as f64 * cut) as u64, weights: vec![] };
        let seen = handed_out(&p, epoch, &[], old, Some(stop.batches));
        let everything = handed_out(&p, epoch, &[], old, None);
        let rest = p.rest(epoch, &[], &stop).unwrap();
        prop_assert_eq!(assign::total(&rest) as usize, everything.len() - seen.len());
        prop_assume!(plannable(&p, assign::total(&rest), new));

        let after = handed_out(&p, epoch, std::slice::from_ref(&stop), new, None);
        let (seen_real, after_real) = (real_counts(&seen), real_counts(&after));
        prop_assert!(seen_real.values().chain(after_real.values()).all(|n| *n == 1),
            "a sample is handed out twice");
        prop_assert!(after_real.keys().all(|id| !seen_real.contains_key(id)),
            "a sample handed out before the stop is handed out again");
        let unseen = real_counts(&everything);
        prop_assert!(after_real.keys().all(|id| unseen.contains_key(id)),
            "the new world hands out a sample the epoch did not plan");

        // Equal steps: every new rank has the same batch plan, and units for all of it.
        let plans: Vec<BatchPlan> =
            (0..new).map(|r| p.segment(epoch, std::slice::from_ref(&stop), new, r).unwrap().1).collect();
        prop_assert!(plans.windows(2).all(|w| w[0] == w[1]), "ranks take different steps");
        for r in 0..new {
            let (units, plan) = p.segment(epoch, std::slice::from_ref(&stop), new, r).unwrap();
            prop_assert_eq!(units.iter().map(WorkUnit::len).sum::<u64>(), plan.samples);
            prop_assert_eq!(&units, &p.segment(epoch, std::slice::from_ref(&stop), new, r).unwrap().0);
        }

        // Nothing is lost where no policy drops samples: the old world's handed-out and
        // the new world's real samples are the epoch's real samples, once each.
        let keeps_all = p.config.remainder == Remainder::Pad && p.last_batch == LastBatch::Partial;
        if keeps_all {
            let mut union = seen_real.clone();
            union.extend(after_real);
            prop_assert_eq!(union.len(), unseen.len());
            prop_assert_eq!(union.len() as u64, total);
        } else if p.last_batch == LastBatch::Partial {
            let rest_len = assign::total(&rest);
            let expected = u64::from(new) * crate::samples_per_rank(rest_len, new, Remainder::Drop);
            prop_assert_eq!(after.len() as u64, expected);
        }
    }

    /// A resume of a resume: three worlds in one epoch still hand out every sample once.
    #[test]
    fn a_resume_of_a_resume_hands_out_every_sample_once(
        p in arb_planner(), worlds in (1u32..4, 1u32..5, 1u32..6), cuts in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        let p = EpochPlanner {
            config: PlanConfig { remainder: Remainder::Pad, ..p.config },
            last_batch: LastBatch::Partial,
            ..p
        };
        let (a, b, c) = worlds;
        let (_, plan) = p.segment(2, &[], a, 0).unwrap();
        let first = Segment { world_size: a, batches: (plan.batches as f64 * cuts.0) as u64, weights: vec![] };
        let (_, plan) = p.segment(2, std::slice::from_ref(&first), b, 0).unwrap();
        let second = Segment { world_size: b, batches: (plan.batches as f64 * cuts.1) as u64, weights: vec![] };
        let mut all = handed_out(&p, 2, &[], a, Some(first.batches));
        all.extend(handed_out(&p, 2, std::slice::from_ref(&first), b, Some(second.batches)));
        all.extend(handed_out(&p, 2, &[first.clone(), second], c, None));
        let real = real_counts(&all);
        prop_assert!(real.values().all(|n| *n == 1), "a sample is handed out twice");
        prop_assert_eq!(real.len() as u64, p.counts.iter().sum::<u64>());
    }
}

#[test]
fn first_samples_cuts_the_last_unit_and_renumbers() {
    let unit = |id, shard, start, end| WorkUnit {
        id,
        shard,
        start,
        end,
        padding: false,
        group: 0,
    };
    let units = vec![unit(0, 3, 0, 5), unit(1, 1, 10, 14), unit(2, 0, 0, 9)];
    let cut = first_samples(units, 7);
    assert_eq!(cut, vec![unit(0, 3, 0, 5), unit(1, 1, 10, 12)]);
}
