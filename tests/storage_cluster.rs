//! Three storage nodes on loopback with `replicas = 2`: `sluice put` writes each object to its
//! two rendezvous owners, a non-owner answers 307 to an owner, and a reader with both owners'
//! URLs still gets every sample when one owner is stopped.

mod support;
mod system;

use std::time::Duration;

use sluice_cpu::{ShardLocation, ShardSource, SourceConfig};
use sluice_storage::StorageConfig;
use support::{path_str, sluice_ok};

const TOKEN: &str = "cluster-token-0123456789";

struct Cluster {
    urls: Vec<String>,
    nodes: Vec<system::Storage>,
}

fn start_cluster(root: &std::path::Path, n: usize) -> Cluster {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let urls: Vec<String> = listeners
        .iter()
        .map(|l| format!("http://{}", l.local_addr().unwrap()))
        .collect();
    let nodes = listeners
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let dir = root.join(format!("node{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let config = StorageConfig {
                mountpaths: vec![dir],
                upload_tokens: vec![TOKEN.into()],
                peers: urls.clone(),
                advertise: Some(urls[i].clone()),
                replicas: 2,
                ..StorageConfig::default()
            };
            system::run_storage(listener, config)
        })
        .collect();
    Cluster { urls, nodes }
}

#[test]
fn replicated_puts_redirects_and_failover() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(&dir.path().join("nodes"), 3);
    let images = support::synth_images(dir.path(), 3, 4);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 2, None);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let shards = format!("{}/out/s-{{00..05}}.tar", dir.path().display());
    let out = sluice_ok(&[
        "put",
        &shards,
        "--to",
        &format!("{}/v1/train/", cluster.urls[0]),
        "--token-file",
        path_str(&token_file),
    ]);
    assert!(out.contains("(2 copies each)"), "{out}");

    let http = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let follow = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in 0..6 {
        let name = format!("s-{i:02}.tar");
        let owners = sluice_storage::placement::owners(&format!("train/{name}"), &cluster.urls, 2);
        // Exactly the two owners hold it.
        let held: Vec<bool> = (0..3)
            .map(|n| {
                dir.path()
                    .join(format!("nodes/node{n}/train/{name}"))
                    .exists()
            })
            .collect();
        for (n, url) in cluster.urls.iter().enumerate() {
            assert_eq!(
                held[n],
                owners.contains(&url.as_str()),
                "{name} on node {n}"
            );
        }
        // The non-owner redirects to the first owner; following the redirect gets the bytes.
        let other = cluster
            .urls
            .iter()
            .find(|u| !owners.contains(&u.as_str()))
            .unwrap();
        let r = http.get(format!("{other}/v1/train/{name}")).send().unwrap();
        assert_eq!(r.status(), 307);
        assert_eq!(
            r.headers()["location"],
            format!("{}/v1/train/{name}", owners[0]).as_str()
        );
        let body = follow
            .get(format!("{other}/v1/train/{name}"))
            .send()
            .unwrap()
            .bytes()
            .unwrap();
        assert_eq!(
            body.as_ref(),
            std::fs::read(dir.path().join(format!("out/{name}")))
                .unwrap()
                .as_slice()
        );
    }

    // Stop the first owner of s-00.tar: a reader with both owners still reads every sample.
    let name = "s-00.tar";
    let owners: Vec<String> =
        sluice_storage::placement::owners(&format!("train/{name}"), &cluster.urls, 2)
            .into_iter()
            .map(str::to_string)
            .collect();
    let first = cluster.urls.iter().position(|u| *u == owners[0]).unwrap();
    cluster.nodes[first].stop();
    std::thread::sleep(Duration::from_millis(300));
    let (info, _) = sluice_shard::scan_shard(
        std::fs::File::open(dir.path().join("out").join(name)).unwrap(),
        name,
        &Default::default(),
        |_| {},
    )
    .unwrap();
    let loc = ShardLocation {
        urls: owners
            .iter()
            .map(|o| format!("{o}/v1/train/{name}"))
            .collect(),
        info,
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let keys: Vec<String> = source
        .open_unit(&loc, 0, 2)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(keys.len(), 2);
    // A manifest that names another version of the object: the checksum header gives the
    // stale replica away before a byte of it is read.
    let mut stale = loc.clone();
    stale.info.checksum = sluice_shard::Checksum(stale.info.checksum.0 ^ 1);
    let lax = ShardSource::new(SourceConfig {
        verify: false,
        ..SourceConfig::default()
    })
    .unwrap();
    let err = lax
        .open_unit(&stale, 0, 2)
        .err()
        .expect("stale object refused")
        .to_string();
    assert!(err.contains("stale object"), "{err}");
    drop(cluster);
}
