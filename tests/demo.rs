//! `sluice demo` end to end: a small generated dataset through every tier, a report that
//! names the bottleneck, and the contract kept.

mod support;

use support::{path_str, sluice};

#[test]
fn the_demo_runs_every_tier_and_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("demo.json");
    let out = sluice(&[
        "demo",
        "--samples",
        "200",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--pipeline",
        "decode | random_resized_crop 96 | hflip 0.5",
        "--json",
        path_str(&json),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("bottleneck:"), "{stdout}");
    assert!(
        stdout.contains("contract: planned 400, delivered 400"),
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
}
