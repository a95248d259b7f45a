//! Shard affinity: which worker a shard's units go to, so a worker's shard cache serves them
//! epoch after epoch whatever the shuffle policy. It applies when a worker announces a cache
//! (its Welcome says so); without caches units go to whichever link is free.
//!
//! Every rank computes the same owners from the same manifest and worker list: rendezvous
//! hashing of each shard's content (checksum and size) against the workers' names, with
//! bounded loads ([`shard_owners`]), so equal workers own equal shares and a worker joining
//! or leaving moves few shards. The protocol's dispatch gives a free link the first queued
//! piece its worker owns; another worker takes a piece only when the consumer has waited
//! for it a short while (`AFFINITY_WAIT`) and its owner is connected with no free slot, or
//! when its owner is down (an owner still connecting is waited for). Where a unit runs never changes the batches.

use sluice_shard::Manifest;

/// Where a unit's owning worker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A link to it is up (its worker index).
    Up(usize),
    /// Its links have not connected yet, and none has failed.
    Coming(usize),
    /// Its links failed or it refused the job: anyone may take its shards.
    Down,
}

/// What the owners need to know of a link.
pub(crate) struct LinkView {
    pub up: bool,
    pub failed: bool,
    pub open: usize,
}

/// The owning worker of each unit, and the worker of each link.
pub(crate) struct Owners {
    /// The worker of each link (several connections to one worker share it).
    link_worker: Vec<usize>,
    /// The owning worker of each unit.
    unit_owner: Vec<usize>,
}

impl Owners {
    /// Owners for the units whose shards `unit_shards` lists (in unit order), over the
    /// workers behind `links` (see [`shard_owners`]); a link given as `None` (its worker
    /// left the pool) owns nothing.
    pub fn new<'a>(
        links: impl IntoIterator<Item = Option<&'a str>>,
        manifest: &Manifest,
        unit_shards: &[u32],
    ) -> Self {
        let mut workers: Vec<&str> = Vec::new();
        let link_worker = links
            .into_iter()
            .map(|l| {
                let Some(l) = l else {
                    return usize::MAX;
                };
                let w = worker_of(l);
                workers.iter().position(|x| *x == w).unwrap_or_else(|| {
                    workers.push(w);
                    workers.len() - 1
                })
            })
            .collect();
        let owners = shard_owners(manifest, &workers);
        let unit_owner = unit_shards
            .iter()
            .map(|&s| owners.get(s as usize).copied().unwrap_or(0))
            .collect();
        Owners {
            link_worker,
            unit_owner,
        }
    }

    /// The worker behind link `link`.
    pub fn worker(&self, link: usize) -> usize {
        self.link_worker.get(link).copied().unwrap_or(usize::MAX)
    }

    /// Where the owner of `unit` stands, given each link's state.
    pub fn owner(&self, unit: u64, links: &[LinkView]) -> Owner {
        let Some(&owner) = self.unit_owner.get(unit as usize) else {
            return Owner::Down;
        };
        let mine = || {
            self.link_worker
                .iter()
                .zip(links)
                .filter(move |(w, _)| **w == owner)
                .map(|(_, l)| l)
        };
        if mine().next().is_none() {
            Owner::Down // no link to it (it left the pool)
        } else if mine().any(|l| l.up) {
            Owner::Up(owner)
        } else if mine().all(|l| !l.failed) {
            Owner::Coming(owner)
        } else {
            Owner::Down
        }
    }

    /// Whether a live link to `worker` has fewer than `slots` units open.
    pub fn has_room(&self, worker: usize, links: &[LinkView], slots: usize) -> bool {
        self.link_worker
            .iter()
            .zip(links)
            .any(|(w, l)| *w == worker && l.up && l.open < slots)
    }
}

/// How much more than an equal share of the samples one worker may own.
const OWNER_SLACK: f64 = 1.1;

/// The owning worker (index in `workers`) of each shard of `manifest`: rendezvous hashing
/// with bounded loads. Shards are taken in manifest order; each goes to the worker that
/// ranks it highest among those owning fewer than [`OWNER_SLACK`] times an equal share of
/// the samples, so a pool of equal workers shares the work evenly (plain rendezvous over a
/// few hundred shards leaves one worker a fifth more than another, and the pool runs at
/// the busiest one's pace) while a worker joining or leaving still moves few shards.
pub(crate) fn shard_owners(manifest: &Manifest, workers: &[&str]) -> Vec<usize> {
    if workers.len() < 2 {
        return vec![0; manifest.shards.len()];
    }
    let total: u64 = manifest.shards.iter().map(|s| s.samples).sum();
    let cap = (total as f64 / workers.len() as f64 * OWNER_SLACK).ceil() as u64;
    let mut load = vec![0u64; workers.len()];
    manifest
        .shards
        .iter()
        .map(|s| {
            let mut ranked: Vec<(u64, usize)> = (0..workers.len())
                .map(|w| (rank(s.checksum.0, s.size, workers[w]), w))
                .collect();
            ranked.sort_unstable_by(|a, b| b.cmp(a));
            let w = ranked
                .iter()
                .map(|&(_, w)| w)
                .find(|&w| load[w] + s.samples <= cap)
                .unwrap_or(ranked[0].1);
            load[w] += s.samples;
            w
        })
        .collect()
}

/// How highly `worker` ranks a shard of this content (rendezvous hashing).
fn rank(checksum: u64, size: u64, worker: &str) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&checksum.to_le_bytes());
    h.update(&size.to_le_bytes());
    h.update(worker.as_bytes());
    h.digest()
}

/// The worker a link's name names: `cpu-0:7100 #2` (one of several connections) is
/// `cpu-0:7100`.
fn worker_of(link: &str) -> &str {
    match link.rsplit_once(" #") {
        Some((worker, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => worker,
        _ => link,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(shards: u64) -> Manifest {
        Manifest::new(
            (0..shards)
                .map(|s| sluice_shard::ShardInfo {
                    url: format!("s{s}.tar"),
                    size: 1000 + s,
                    samples: 100,
                    checksum: sluice_shard::Checksum(s * 7919),
                    compression: sluice_shard::Compression::None,
                    replicas: Vec::new(),
                })
                .collect(),
        )
    }

    #[test]
    fn owners_share_evenly_and_a_leaving_worker_moves_few_others() {
        let m = manifest(300);
        let three = ["a:1", "b:1", "c:1"];
        let owners = shard_owners(&m, &three);
        let mut per = [0usize; 3];
        for &o in &owners {
            per[o] += 1;
        }
        assert!(per.iter().all(|&n| n <= 110), "{per:?}");
        // Without b, a's and c's shards mostly stay where they were.
        let two = ["a:1", "c:1"];
        let after = shard_owners(&m, &two);
        let moved = owners
            .iter()
            .zip(&after)
            .filter(|(&o, &n)| o != 1 && three[o] != two[n])
            .count();
        assert!(moved <= 30, "{moved} of the staying workers' shards moved");
        // The order workers are listed in does not matter.
        let reversed = ["c:1", "b:1", "a:1"];
        let again = shard_owners(&m, &reversed);
        for (o, r) in owners.iter().zip(&again) {
            assert_eq!(three[*o], reversed[*r]);
        }
        assert_eq!(worker_of("cpu-0:7100 #2"), "cpu-0:7100");
        assert_eq!(worker_of("cpu-0:7100"), "cpu-0:7100");
    }
}
