//! Property tests of the plan's invariants: exactly-once coverage, equal ranks, determinism,
//! locality, and the partial exchange rate (Q of each rank's samples from other ranks).

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use crate::*;

type Id = (u32, u64);

fn samples(units: &[WorkUnit]) -> Vec<(Id, bool)> {
    units
        .iter()
        .flat_map(|u| (u.start..u.end).map(move |i| ((u.shard, i), u.padding)))
        .collect()
}

fn all_ids(counts: &[u64]) -> HashSet<Id> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).map(move |i| (s as u32, i)))
        .collect()
}

fn arb_policy() -> impl Strategy<Value = ShufflePolicy> {
    prop_oneof![
        Just(ShufflePolicy::Global),
        Just(ShufflePolicy::Local),
        (0.0f64..=1.0).prop_map(ShufflePolicy::Partial),
        Just(ShufflePolicy::Sequential),
    ]
}

fn arb_counts() -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(prop_oneof![1 => Just(0u64), 8 => 1u64..400], 1..30)
}

fn config(
    seed: u64,
    world: u32,
    policy: ShufflePolicy,
    remainder: Remainder,
    unit: u64,
) -> PlanConfig {
    PlanConfig {
        seed,
        world_size: world,
        policy,
        remainder,
        max_unit_samples: unit,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `none`: rank after rank, the ranks' samples are the manifest's in order (the last
    /// ones of longer ranks dropped, or each short rank's first ones repeated as padding),
    /// whatever the seed and epoch.
    #[test]
    fn none_reads_the_manifest_in_order_across_ranks(
        counts in arb_counts(), world in 1u32..9, seed in any::<u64>(), epoch in 0u64..5,
        unit in 1u64..100, pad in any::<bool>(),
    ) {
        let total: u64 = counts.iter().sum();
        let remainder = if pad { Remainder::Pad } else { Remainder::Drop };
        prop_assume!(total >= u64::from(world) || (pad && total > 0));
        let cfg = config(seed, world, ShufflePolicy::Sequential, remainder, unit);
        let other = config(seed ^ 1, world, ShufflePolicy::Sequential, remainder, unit);
        let in_order: Vec<Id> = counts
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| (0..n).map(move |i| (s as u32, i)))
            .collect();
        let (base, rem) = (total / u64::from(world), total % u64::from(world));
        let mut at = 0usize;
        for rank in 0..world {
            let units = plan_counts(&counts, &cfg, epoch, rank).unwrap();
            prop_assert_eq!(&units, &plan_counts(&counts, &other, epoch + 1, rank).unwrap());
            let s = samples(&units);
            let real: Vec<Id> = s.iter().filter(|(_, p)| !p).map(|(id, _)| *id).collect();
            let run = (base + u64::from(u64::from(rank) < rem)) as usize;
            prop_assert_eq!(&real[..], &in_order[at..at + real.len()], "rank {} out of order", rank);
            let padded: Vec<Id> = s.iter().filter(|(_, p)| *p).map(|(id, _)| *id).collect();
            if pad {
                // The repeats come after the real samples and are its first ones.
                prop_assert!(s.iter().skip(real.len()).all(|(_, p)| *p));
                let source = if real.is_empty() { &in_order[..] } else { &real[..] };
                for (i, id) in padded.iter().enumerate() {
                    prop_assert_eq!(*id, source[i % source.len()]);
                }
            } else {
                prop_assert!(padded.is_empty());
                prop_assert_eq!(real.len() as u64, base);
            }
            at += run;
        }
        prop_assert_eq!(at as u64, total);
    }

    #[test]
    fn drop_covers_each_sample_at_most_once_with_equal_ranks(
        counts in arb_counts(), world in 1u32..9, seed in any::<u64>(),
        epoch in 0u64..5, policy in arb_policy(), unit in 1u64..300,
    ) {
        let total: u64 = counts.iter().sum();
        prop_assume!(total >= u64::from(world));
        let cfg = config(seed, world, policy, Remainder::Drop, unit);
        let per_rank = samples_per_rank(total, world, Remainder::Drop);
        let mut seen: HashMap<Id, u32> = HashMap::new();
        for rank in 0..world {
            let units = plan_counts(&counts, &cfg, epoch, rank).unwrap();
            prop_assert!(units.iter().all(|u| u.len() <= unit && !u.is_empty() && !u.padding));
            prop_assert!(units.iter().enumerate().all(|(i, u)| u.id == i as u32));
            let s = samples(&units);
            prop_assert_eq!(s.len() as u64, per_rank, "rank {} count", rank);
            for (id, _) in s {
                prop_assert!((id.1) < counts[id.0 as usize], "sample {:?} out of its shard", id);
                *seen.entry(id).or_default() += 1;
            }
        }
        let repeated: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
        prop_assert!(repeated.is_empty(), "repeated samples: {:?}", repeated);
        let missing = all_ids(&counts).len() - seen.len();
        prop_assert_eq!(missing as u64, total - per_rank * u64::from(world), "dropped samples");
    }

    #[test]
    fn pad_covers_each_sample_once_and_repeats_only_padding(
        counts in arb_counts(), world in 1u32..9, seed in any::<u64>(),
        epoch in 0u64..5, policy in arb_policy(),
    ) {
        let total: u64 = counts.iter().sum();
        prop_assume!(total > 0);
        let cfg = config(seed, world, policy, Remainder::Pad, 64);
        let per_rank = samples_per_rank(total, world, Remainder::Pad);
        let mut real: HashMap<Id, u32> = HashMap::new();
        let mut padding = 0u64;
        for rank in 0..world {
            let s = samples(&plan_counts(&counts, &cfg, epoch, rank).unwrap());
            prop_assert_eq!(s.len() as u64, per_rank);
            for (id, pad) in s {
                if pad { padding += 1 } else { *real.entry(id).or_default() += 1 }
            }
        }
        prop_assert!(real.values().all(|&n| n == 1), "a real sample repeated");
        prop_assert_eq!(real.len(), all_ids(&counts).len(), "a sample missing");
        prop_assert_eq!(padding, per_rank * u64::from(world) - total);
    }

    #[test]
    fn plans_are_deterministic(
        counts in arb_counts(), world in 1u32..9, seed in any::<u64>(), epoch in 0u64..5,
        policy in arb_policy(),
    ) {
        prop_assume!(counts.iter().sum::<u64>() >= u64::from(world));
        let cfg = config(seed, world, policy, Remainder::Drop, 50);
        for rank in 0..world {
            prop_assert_eq!(
                plan_counts(&counts, &cfg, epoch, rank).unwrap(),
                plan_counts(&counts, &cfg.clone(), epoch, rank).unwrap()
            );
        }
    }

    #[test]
    fn local_keeps_each_ranks_samples_across_epochs(
        counts in arb_counts(), world in 1u32..9, seed in any::<u64>(), remainder in prop_oneof![Just(Remainder::Drop), Just(Remainder::Pad)],
    ) {
        let total: u64 = counts.iter().sum();
        prop_assume!(total >= u64::from(world));
        let cfg = config(seed, world, ShufflePolicy::Local, remainder, 32);
        for rank in 0..world {
            let mut union = HashSet::new();
            for epoch in 0..6 {
                union.extend(samples(&plan_counts(&counts, &cfg, epoch, rank).unwrap()).into_iter().map(|(id, _)| id));
            }
            // The rank's fixed run: base or base + 1 samples, whatever the remainder dropped.
            prop_assert!(union.len() as u64 <= total / u64::from(world) + 1);
        }
    }

    #[test]
    fn partial_moves_q_of_each_rank_per_epoch(
        shards in 4usize..40, world in 2u32..9, seed in any::<u64>(), q in 0.0f64..=1.0,
        epoch in 1u64..6,
    ) {
        // At least 100 samples per rank, so rounding and the dropped remainder stay small.
        let counts: Vec<u64> = (0..shards).map(|i| 40 + (i as u64 * 37) % 90).collect();
        let total: u64 = counts.iter().sum();
        prop_assume!(total >= 100 * u64::from(world));
        let cfg = config(seed, world, ShufflePolicy::Partial(q), Remainder::Drop, 64);
        for rank in 0..world {
            let ids = |e| -> HashSet<Id> {
                samples(&plan_counts(&counts, &cfg, e, rank).unwrap()).into_iter().map(|(id, _)| id).collect()
            };
            let (home, now) = (ids(0), ids(epoch));
            let moved = now.difference(&home).count() as f64 / now.len() as f64;
            prop_assert!((moved - q).abs() <= 0.05, "rank {rank}: moved {moved:.3}, Q {q:.3}");
        }
    }
}

#[test]
fn global_reshuffles_shards_across_ranks_every_epoch() {
    let counts = vec![100u64; 64];
    let cfg = config(9, 4, ShufflePolicy::Global, Remainder::Drop, 100);
    let shards = |epoch| -> HashSet<u32> {
        plan_counts(&counts, &cfg, epoch, 0)
            .unwrap()
            .iter()
            .map(|u| u.shard)
            .collect()
    };
    assert_ne!(shards(0), shards(1));
    let order = |epoch| plan_counts(&counts, &cfg, epoch, 0).unwrap();
    assert_ne!(order(0), order(1));
}

#[test]
fn partial_draws_a_new_exchange_every_epoch() {
    let counts = vec![100u64; 64];
    let cfg = config(9, 4, ShufflePolicy::Partial(0.2), Remainder::Drop, 100);
    let ids = |epoch| -> HashSet<Id> {
        samples(&plan_counts(&counts, &cfg, epoch, 0).unwrap())
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    let epochs: Vec<HashSet<Id>> = (0..4).map(ids).collect();
    for e in 1..4 {
        assert_ne!(
            epochs[e],
            epochs[e - 1],
            "epoch {e} repeats epoch {}",
            e - 1
        );
        // Always 1 - Q of the rank's home samples, whatever the epoch.
        let kept = epochs[e].intersection(&epochs[0]).count() as f64 / epochs[0].len() as f64;
        assert!(
            (kept - 0.8).abs() <= 0.02,
            "epoch {e}: kept {kept:.3} of home"
        );
    }
}

#[test]
fn uneven_shards_are_split_to_balance_ranks() {
    let counts = vec![1000, 10, 10, 10];
    let cfg = config(1, 4, ShufflePolicy::Local, Remainder::Drop, 10_000);
    for rank in 0..4 {
        let n: u64 = plan_counts(&counts, &cfg, 0, rank)
            .unwrap()
            .iter()
            .map(WorkUnit::len)
            .sum();
        assert_eq!(n, 257);
    }
}

#[test]
fn impossible_plans_are_clear_errors() {
    let cfg = config(1, 4, ShufflePolicy::Global, Remainder::Drop, 10);
    assert_eq!(
        plan_counts(&[10], &cfg, 0, 4),
        Err(PlanError::RankOutOfRange {
            rank: 4,
            world_size: 4
        })
    );
    assert_eq!(
        plan_counts(&[0, 0], &cfg, 0, 0),
        Err(PlanError::EmptyDataset)
    );
    let e = plan_counts(&[3], &cfg, 0, 0).unwrap_err();
    assert!(e.to_string().contains("pad"), "{e}");
    let padded = PlanConfig {
        remainder: Remainder::Pad,
        ..cfg.clone()
    };
    assert_eq!(samples(&plan_counts(&[3], &padded, 0, 3).unwrap()).len(), 1);
    assert_eq!(
        plan_counts(
            &[10],
            &PlanConfig {
                world_size: 0,
                ..cfg.clone()
            },
            0,
            0
        ),
        Err(PlanError::NoRanks)
    );
    assert_eq!(
        plan_counts(
            &[10],
            &PlanConfig {
                max_unit_samples: 0,
                ..cfg
            },
            0,
            0
        ),
        Err(PlanError::NoUnitSize)
    );
}

#[test]
fn policies_parse_from_their_names() {
    assert_eq!(
        "global".parse::<ShufflePolicy>().unwrap(),
        ShufflePolicy::Global
    );
    assert_eq!(
        "local".parse::<ShufflePolicy>().unwrap(),
        ShufflePolicy::Local
    );
    assert_eq!(
        "partial:0.2".parse::<ShufflePolicy>().unwrap(),
        ShufflePolicy::Partial(0.2)
    );
    assert_eq!(
        "none".parse::<ShufflePolicy>().unwrap(),
        ShufflePolicy::Sequential
    );
    assert_eq!(ShufflePolicy::Sequential.to_string(), "none");
    for bad in ["partial:1.5", "partial:", "partial:x", "random", ""] {
        assert!(bad.parse::<ShufflePolicy>().is_err(), "{bad}");
    }
    assert_eq!("pad".parse::<Remainder>().unwrap(), Remainder::Pad);
    assert!("keep".parse::<Remainder>().is_err());
}
