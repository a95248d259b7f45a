//! `sluice demo` end to end: a small generated dataset through every tier, a report that
//! names the bottleneck, and the contract kept.

mod support;

use support::{path_str, sluice_ok};

#[test]
fn the_demo_runs_every_tier_and_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("demo.json");
    let stdout = sluice_ok(&[
        "demo",
        "--samples",
        "200",
        "--epochs",
        "3",
        "--batch-size",
        "16",
        "--pipeline",
        "decode | random_resized_crop 96 | hflip 0.5",
        "--json",
        path_str(&json),
    ]);
    assert!(stdout.contains("bottleneck:"), "{stdout}");
    assert!(
        stdout.contains("contract: planned 600, delivered 600"),
        "{stdout}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["contract_kept"], true);
    assert_eq!(report["lost"], 0);
    assert_eq!(report["duplicated"], 0);
    let tiers: Vec<&str> = report["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tier"].as_str().unwrap())
        .collect();
    assert_eq!(tiers, ["storage", "cpu", "transport"]);
    assert!(tiers.contains(&report["bottleneck"].as_str().unwrap()));
    assert!(report["chain_samples_per_s"].as_f64().unwrap() > 0.0);
    // The last epoch's shards came from the workers' caches, not the storage node (the
    // second one starts while the first still fills them: this dataset is read in a second).
    let epochs = report["epochs"].as_array().unwrap();
    let second = &epochs[2];
    let (storage, cached) = (
        second["storage_bytes"].as_f64().unwrap(),
        second["cached_bytes"].as_f64().unwrap(),
    );
    assert!(
        storage <= 0.1 * (storage + cached),
        "epoch 2 read {storage} bytes from storage, {cached} from caches\n{stdout}"
    );
    assert!(stdout.contains("MB from the workers' caches"), "{stdout}");
}

#[test]
fn bench_chain_writes_a_report_and_a_picture() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    sluice_ok(&[
        "bench",
        "chain",
        "--samples",
        "100",
        "--epochs",
        "2",
        "--seconds",
        "0.3",
        "--pipeline",
        "decode | random_resized_crop 64",
        "--json",
        path_str(&json),
        "--svg",
        path_str(&svg),
    ]);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["tiers"].as_array().unwrap().len(), 3);
    assert!(report["timeline"].as_array().is_some());
    assert!(report["contract_broken"].as_array().unwrap().is_empty());
    // In process the chain runs over both transports, each kept exactly once.
    let chains = report["chains"].as_array().unwrap();
    let names: Vec<&str> = chains
        .iter()
        .map(|c| c["transport"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["quic", "same-host"]);
    for c in chains {
        assert!(c["samples_per_s"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["vs_cpu_alone"].as_f64().unwrap() > 0.0, "{c}");
        // The second epoch's pace, without the loader's start.
        let later = c["samples_per_s_after_first_epoch"].as_f64();
        assert!(later.is_some_and(|s| s > 0.0), "{c}");
    }
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("throughput by tier"));
}

#[test]
fn bench_host_cost_prints_each_transports_client_cpu_beside_its_floor() {
    let stdout = sluice_ok(&[
        "bench",
        "host-cost",
        "--samples",
        "600",
        "--side",
        "64",
        "--repeat",
        "1",
    ]);
    // A row per transport: the client's µs per sample, the floor and what its parts are.
    for (transport, floor) in [("quic", "AES-256-GCM"), ("same-host", "copy")] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("host-cost\t{transport}\t")))
            .unwrap_or_else(|| panic!("no {transport} row:\n{stdout}"));
        let cells: Vec<&str> = row.split('\t').collect();
        let us: f64 = cells[2].trim_end_matches(" µs/sample").parse().unwrap();
        assert!(us > 0.0, "{row}");
        assert!(
            cells[3].starts_with("floor ") && cells[3].contains(floor),
            "{row}"
        );
        assert!(row.contains("GPUs:") && row.contains("cores"), "{row}");
    }
}
