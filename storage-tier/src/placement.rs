//! Where objects live among storage nodes: rendezvous (highest random weight) hashing. Every
//! party that places or finds objects (storage nodes routing and redirecting, `sluice put`
//! uploading to every owner) computes the same owners for a key from the same peer list, with
//! no coordinator, and removing a node moves only the objects it owned. It lives with the
//! storage tier because only the storage cluster's own parties use it: workers and clients
//! follow the nodes' redirects and the manifest's replica URLs.

use xxhash_rust::xxh3::xxh3_64;

/// The weight of `node` for `key`.
fn weight(node: &str, key: &str) -> u64 {
    let mut buf = Vec::with_capacity(node.len() + key.len() + 1);
    buf.extend_from_slice(node.as_bytes());
    buf.push(0);
    buf.extend_from_slice(key.as_bytes());
    xxh3_64(&buf)
}

/// Indexes of `nodes` in order of preference for `key` (highest weight first).
pub fn preference(key: &str, nodes: &[String]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse((weight(&nodes[i], key), i)));
    order
}

/// The `replicas` owners of `key` among `nodes`, most preferred first.
pub fn owners<'n>(key: &str, nodes: &'n [String], replicas: usize) -> Vec<&'n str> {
    preference(key, nodes)
        .into_iter()
        .take(replicas)
        .map(|i| nodes[i].as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_stable_spread_and_move_little() {
        let nodes: Vec<String> = (0..4).map(|i| format!("http://n{i}:7000")).collect();
        let mut first = [0u32; 4];
        let mut moved = 0;
        let without_last = &nodes[..3];
        for i in 0..4000 {
            let key = format!("train/s-{i:06}.tar");
            let o = owners(&key, &nodes, 2);
            assert_eq!(o, owners(&key, &nodes, 2));
            assert_ne!(o[0], o[1]);
            first[nodes.iter().position(|n| n == o[0]).unwrap()] += 1;
            // Dropping node 3 changes the first owner only for keys it owned.
            let o3 = owners(&key, without_last, 1)[0];
            if o3 != o[0] {
                assert_eq!(o[0], nodes[3]);
                moved += 1;
            }
        }
        assert!(first.iter().all(|&c| c > 800), "{first:?}");
        assert!(moved > 800 && moved < 1200, "{moved}");
    }
}
