//! The steps of a plan over sample ranges ("pieces"): cutting the line of shards into ranks,
//! the partial exchange, the remainder, and cutting pieces into ordered work units.
//!
//! Partial exchange in epoch e ≥ 1, from the fixed `local` assignment (each rank's *home*):
//! every rank gives away round(Q × its samples), taken as whole ranges in a seeded order for
//! the epoch (the last one split); the ranks are put in a seeded ring; the given ranges are
//! laid end to end in ring order and the line is rotated by at least the largest
//! contribution, so each rank receives exactly as many samples as it gave, none of them its
//! own (except for a possible single sample when two ranks' shares differ by one). Every
//! epoch starts again from the homes: a rank always holds 1 − Q of its home samples (a new
//! subset each epoch, so a node-local cache of the home shards keeps hitting) and Q from
//! other ranks, and planning costs one exchange, O(shards), whatever the epoch.

use crate::rng::{stream, Domain, Stream};
use crate::{PlanConfig, Remainder, ShufflePolicy, WorkUnit};

/// A range of samples of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub shard: u32,
    pub start: u64,
    pub end: u64,
    pub padding: bool,
}

impl Piece {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

pub fn total(pieces: &[Piece]) -> u64 {
    pieces.iter().map(Piece::len).sum()
}

/// The fixed shard order of `local`/`partial` uses this in place of an epoch.
const FIXED: u64 = u64::MAX;

fn shard_order(counts: &[u64], config: &PlanConfig, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..counts.len() as u32).collect();
    let key = match config.policy {
        ShufflePolicy::Global => epoch,
        ShufflePolicy::Local | ShufflePolicy::Partial(_) => FIXED,
        ShufflePolicy::Sequential => return order,
    };
    stream(config.seed, Domain::ShardOrder, key, 0).shuffle(&mut order);
    order
}

/// Lays the shards end to end in `order` and cuts the line into `world` runs; the first
/// `total % world` runs are one sample longer.
fn cut_into_ranks(counts: &[u64], order: &[u32], world: u32) -> Vec<Vec<Piece>> {
    let n: u64 = counts.iter().sum();
    let w = u64::from(world);
    let (base, rem) = (n / w, n % w);
    let mut ranks: Vec<Vec<Piece>> = vec![Vec::new(); world as usize];
    let mut r = 0usize;
    let mut room = base + u64::from(rem > 0);
    for &shard in order {
        let mut start = 0;
        let len = counts[shard as usize];
        while start < len {
            while room == 0 {
                r += 1;
                room = base + u64::from((r as u64) < rem);
            }
            let take = room.min(len - start);
            ranks[r].push(Piece {
                shard,
                start,
                end: start + take,
                padding: false,
            });
            start += take;
            room -= take;
        }
    }
    ranks
}

/// The pieces `rank` holds in `epoch`, before the remainder is settled.
pub fn rank_pieces(counts: &[u64], config: &PlanConfig, epoch: u64, rank: u32) -> Vec<Piece> {
    let order = shard_order(counts, config, epoch);
    let mut ranks = cut_into_ranks(counts, &order, config.world_size);
    if let ShufflePolicy::Partial(q) = config.policy {
        if epoch > 0 {
            exchange(&mut ranks, q, config.seed, epoch);
        }
    }
    std::mem::take(&mut ranks[rank as usize])
}

/// One epoch's partial exchange (see the module documentation).
fn exchange(ranks: &mut [Vec<Piece>], q: f64, seed: u64, epoch: u64) {
    let w = ranks.len();
    if w < 2 || q <= 0.0 {
        return;
    }
    let mut shares = Vec::with_capacity(w);
    let mut given: Vec<Vec<Piece>> = Vec::with_capacity(w);
    for (r, pieces) in ranks.iter_mut().enumerate() {
        let n = total(pieces);
        let share = ((q * n as f64).round() as u64).min(n);
        stream(seed, Domain::PartialTake, epoch, r as u64).shuffle(pieces);
        let (give, keep) = split_off_samples(std::mem::take(pieces), share);
        *pieces = keep;
        given.push(give);
        shares.push(share);
    }
    let line_len: u64 = shares.iter().sum();
    if line_len == 0 {
        return;
    }
    let mut ring: Vec<usize> = (0..w).collect();
    let mut rng = stream(seed, Domain::PartialRing, epoch, 0);
    rng.shuffle(&mut ring);
    let largest = shares.iter().copied().max().unwrap_or(0);
    let rotation = if line_len >= 2 * largest {
        largest + rng.below(line_len - 2 * largest + 1)
    } else {
        largest % line_len
    };
    let line: Vec<Piece> = ring
        .iter()
        .flat_map(|&r| given[r].iter().copied())
        .collect();
    let (head, tail) = split_off_samples(line, rotation);
    let mut rotated = tail.into_iter().chain(head);
    // One pass over the line: each rank in ring order takes its share, a piece split where a
    // share ends (splitting the rest off again and again made this quadratic in the ranks).
    let mut carry: Option<Piece> = None;
    for &r in &ring {
        let mut need = shares[r];
        while need > 0 {
            let Some(p) = carry.take().or_else(|| rotated.next()) else {
                break;
            };
            if p.len() <= need {
                need -= p.len();
                ranks[r].push(p);
            } else {
                let cut = p.start + need;
                ranks[r].push(Piece { end: cut, ..p });
                carry = Some(Piece { start: cut, ..p });
                need = 0;
            }
        }
    }
    for pieces in ranks.iter_mut() {
        normalize(pieces);
    }
}

/// Lays `pieces` end to end and cuts the line into `world` runs; the first `total % world`
/// runs are one sample longer.
pub fn cut_pieces(pieces: Vec<Piece>, world: u32) -> Vec<Vec<Piece>> {
    let n = total(&pieces);
    let w = u64::from(world.max(1));
    let (base, rem) = (n / w, n % w);
    let mut rest = pieces;
    let mut out = Vec::with_capacity(w as usize);
    for r in 0..w {
        let (mine, tail) = split_off_samples(rest, base + u64::from(r < rem));
        out.push(mine);
        rest = tail;
    }
    out
}

/// Splits a run of pieces after `n` samples: (the first `n` samples, the rest).
pub(crate) fn split_off_samples(pieces: Vec<Piece>, n: u64) -> (Vec<Piece>, Vec<Piece>) {
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut taken = 0;
    for p in pieces {
        if taken == n {
            tail.push(p);
        } else if taken + p.len() <= n {
            taken += p.len();
            head.push(p);
        } else {
            let cut = p.start + (n - taken);
            head.push(Piece { end: cut, ..p });
            tail.push(Piece { start: cut, ..p });
            taken = n;
        }
    }
    (head, tail)
}

/// Sorts pieces by position and merges adjacent ranges of a shard, so repeated exchanges do
/// not fragment a rank's reads.
fn normalize(pieces: &mut Vec<Piece>) {
    pieces.sort_by_key(|p| (p.shard, p.start));
    let mut merged: Vec<Piece> = Vec::with_capacity(pieces.len());
    for p in pieces.drain(..) {
        match merged.last_mut() {
            Some(last) if last.shard == p.shard && last.end == p.start && !last.padding => {
                last.end = p.end;
            }
            _ => merged.push(p),
        }
    }
    *pieces = merged;
}

/// Brings a rank to exactly `samples_per_rank` samples by dropping or repeating seeded
/// samples.
pub fn settle_remainder(
    pieces: Vec<Piece>,
    counts: &[u64],
    config: &PlanConfig,
    epoch: u64,
    rank: u32,
) -> Vec<Piece> {
    let target = crate::samples_per_rank(counts.iter().sum(), config.world_size, config.remainder);
    if !config.policy.shuffles() {
        return settle_in_order(pieces, target, counts, config.remainder);
    }
    let rng = stream(config.seed, Domain::Remainder, epoch, u64::from(rank));
    settle_to(pieces, target, counts, config.remainder, rng)
}

/// Brings `pieces` to exactly `target` samples under `remainder`, drawing from `rng`.
pub fn settle_to(
    mut pieces: Vec<Piece>,
    target: u64,
    counts: &[u64],
    remainder: Remainder,
    mut rng: Stream,
) -> Vec<Piece> {
    match remainder {
        Remainder::Drop => {
            while total(&pieces) > target {
                let at = rng.below(total(&pieces));
                let (head, tail) = split_off_samples(pieces, at);
                let (_dropped, tail) = split_off_samples(tail, 1);
                pieces = head;
                pieces.extend(tail);
            }
        }
        Remainder::Pad => {
            let real = total(&pieces);
            let source = padding_source(&pieces, counts);
            let mut added = Vec::new();
            for _ in real..target {
                let at = rng.below(total(&source));
                let (_, tail) = split_off_samples(source.clone(), at);
                if let Some(p) = tail.first() {
                    added.push(Piece {
                        shard: p.shard,
                        start: p.start,
                        end: p.start + 1,
                        padding: true,
                    });
                }
            }
            pieces.extend(added);
        }
    }
    pieces
}

/// What `pad` repeats from: the rank's own samples (cache-friendly), or every sample when
/// the dataset is smaller than the world and this rank has none.
fn padding_source(pieces: &[Piece], counts: &[u64]) -> Vec<Piece> {
    if total(pieces) > 0 {
        return pieces.to_vec();
    }
    counts
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(s, &n)| Piece {
            shard: s as u32,
            start: 0,
            end: n,
            padding: false,
        })
        .collect()
}

/// [`settle_to`] with nothing drawn, for `none`: `drop` removes the last samples, `pad`
/// repeats the first ones (the dataset's first ones for a rank that has none), in order.
pub fn settle_in_order(
    pieces: Vec<Piece>,
    target: u64,
    counts: &[u64],
    remainder: Remainder,
) -> Vec<Piece> {
    let real = total(&pieces);
    if real >= target {
        // `drop` (a `pad` rank is never longer than its target).
        return split_off_samples(pieces, target).0;
    }
    let source = padding_source(&pieces, counts);
    debug_assert_eq!(remainder, Remainder::Pad, "only pad lengthens a rank");
    let mut out = pieces;
    let mut missing = target - real;
    // Whole rounds of the source while it is shorter than what is missing (a dataset smaller
    // than the world), then its head.
    while missing > 0 && total(&source) > 0 {
        let (head, _) = split_off_samples(source.clone(), missing);
        missing -= total(&head);
        out.extend(head.into_iter().map(|p| Piece { padding: true, ..p }));
    }
    out
}

/// Cuts pieces into work units of at most `max_unit_samples` (near-equal parts) and puts
/// them in the rank's seeded order for the epoch (in the pieces' order under `none`).
pub fn into_units(pieces: Vec<Piece>, config: &PlanConfig, epoch: u64, rank: u32) -> Vec<WorkUnit> {
    if !config.policy.shuffles() {
        return cut_units(pieces, config.max_unit_samples);
    }
    let rng = stream(config.seed, Domain::UnitOrder, epoch, u64::from(rank));
    into_units_with(pieces, config.max_unit_samples, rng)
}

/// [`into_units`] with the unit order drawn from `rng`.
pub fn into_units_with(pieces: Vec<Piece>, max: u64, mut rng: Stream) -> Vec<WorkUnit> {
    let mut units = cut_units(pieces, max);
    rng.shuffle(&mut units);
    for (i, u) in units.iter_mut().enumerate() {
        u.id = i as u32;
    }
    units
}

/// Cuts pieces into work units of at most `max` samples (near-equal parts), in the pieces'
/// order, with ids in that order.
pub fn cut_units(pieces: Vec<Piece>, max: u64) -> Vec<WorkUnit> {
    let mut units = Vec::new();
    for p in pieces {
        let parts = p.len().div_ceil(max);
        for i in 0..parts {
            let start = p.start + p.len() * i / parts;
            let end = p.start + p.len() * (i + 1) / parts;
            units.push(WorkUnit {
                id: units.len() as u32,
                shard: p.shard,
                start,
                end,
                padding: p.padding,
                group: 0,
            });
        }
    }
    units
}
