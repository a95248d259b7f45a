//! The metrics an operator is told about are the ones the daemons export, and they are there
//! from the start: every name the code records is in a tier's catalog
//! (`sluice_cpu::metrics`, `sluice_storage::metrics`, `sluice_client::metrics`), every
//! catalogued name is in docs/operations.md's table and the table names nothing else; a fresh
//! worker shows its counters and gauges before any client came; `loadgen --metrics-listen`
//! serves the client's while it runs.

mod support;
mod system;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use system::{loadgen, metrics_text, scrape, start_worker, SMALL_BATCHES};

fn catalog() -> BTreeSet<&'static str> {
    [
        sluice_cpu::metrics::COUNTERS,
        sluice_cpu::metrics::GAUGES,
        sluice_cpu::metrics::HISTOGRAMS,
        sluice_cpu::metrics::LABELED,
        sluice_storage::metrics::HISTOGRAMS,
        sluice_storage::metrics::LABELED,
        sluice_client::metrics::COUNTERS,
        sluice_client::metrics::GAUGES,
        sluice_client::metrics::HISTOGRAMS,
    ]
    .concat()
    .into_iter()
    .collect()
}

/// `sluice_…` names after `marker` in `text` (a metric macro's or a job series' first
/// argument).
fn names_after(text: &str, marker: &str, out: &mut BTreeSet<String>) {
    for (at, _) in text.match_indices(marker) {
        let rest = text[at + marker.len()..].trim_start();
        let Some(rest) = rest.strip_prefix('"') else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if name.starts_with("sluice_") && rest[name.len()..].starts_with('"') {
            out.insert(name);
        }
    }
}

fn recorded_in(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            recorded_in(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for marker in [
                "counter!(",
                "gauge!(",
                "histogram!(",
                ".counter(",
                ".gauge(",
            ] {
                names_after(&text, marker, out);
            }
        }
    }
}

#[test]
fn the_code_the_catalogs_and_the_docs_table_name_the_same_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut recorded = BTreeSet::new();
    for crate_src in [
        "cpu-tier/src",
        "storage-tier/src",
        "gpu-client/src",
        "daemon/src",
        "src",
    ] {
        recorded_in(&root.join(crate_src), &mut recorded);
    }
    let catalog: BTreeSet<String> = catalog().into_iter().map(String::from).collect();
    same_names(("recorded", &recorded), ("catalogued", &catalog));

    let docs = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let table = &docs[docs.find("## Metrics to watch").unwrap()..];
    let table = &table[..table.find("\n## ").unwrap()];
    let mut documented = BTreeSet::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        for part in line.split('`').skip(1).step_by(2) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if name.starts_with("sluice_") {
                documented.insert(name);
            }
        }
    }
    same_names(
        ("in the docs' metrics table", &documented),
        ("catalogued", &catalog),
    );
}

/// Fails, naming the metrics, unless both sets hold the same names.
fn same_names((a, in_a): (&str, &BTreeSet<String>), (b, in_b): (&str, &BTreeSet<String>)) {
    let only_a: Vec<_> = in_a.difference(in_b).collect();
    let only_b: Vec<_> = in_b.difference(in_a).collect();
    assert!(only_a.is_empty(), "{a} but not {b}: {only_a:?}");
    assert!(only_b.is_empty(), "{b} but not {a}: {only_b:?}");
}

#[test]
fn a_fresh_worker_shows_every_counter_and_gauge_before_any_client() {
    let dir = tempfile::tempdir().unwrap();
    let worker = start_worker(dir.path(), "idle");
    let text = metrics_text(&worker);
    let shown = |name: &str| {
        text.lines()
            .any(|l| l.split([' ', '{']).next() == Some(name))
    };
    for name in sluice_cpu::metrics::COUNTERS
        .iter()
        .chain(sluice_cpu::metrics::GAUGES)
    {
        assert!(
            shown(name),
            "{name} is not on a fresh worker's /metrics:\n{text}"
        );
    }
    let value = |name: &str| {
        text.lines()
            .find(|l| l.split(' ').next() == Some(name))
            .and_then(|l| l.split(' ').next_back()?.parse::<f64>().ok())
    };
    assert_eq!(value("sluice_cpu_units_waiting_per_slot"), Some(0.0));
    assert!(
        value("sluice_cpu_unit_slots").is_some_and(|s| s >= 1.0),
        "{text}"
    );
}

#[test]
fn loadgen_serves_the_clients_metrics_while_it_runs() {
    let (dir, data, [worker], trust) = system::bed(20, ["w"]);
    let mut child = loadgen(
        &data.manifest_path,
        &["--workers", &worker.addr],
        &dir.path().join("token"),
        &trust,
    )
    .args(SMALL_BATCHES)
    .args([
        "--epochs",
        "3",
        "--step-ms",
        "40",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            let at = l.find("metrics=")?;
            Some(l[at + 8..].split_whitespace().next()?.to_string())
        })
        .expect("loadgen did not say where its metrics are");
    std::thread::spawn(move || lines.for_each(drop));
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(&addr);
        if text.contains("sluice_client_batches_total")
            && !text.contains("sluice_client_batches_total 0")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for name in sluice_client::metrics::COUNTERS
        .iter()
        .chain(sluice_client::metrics::GAUGES)
    {
        assert!(
            text.contains(name),
            "{name} is not on loadgen's /metrics:\n{text}"
        );
    }
    assert!(
        !text.contains("sluice_client_batches_total 0\n"),
        "no batch counted:\n{text}"
    );
    // Over QUIC (`loadgen` turns same-host off), the receive slots show as memory.
    let receive_bytes = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_client_quic_receive_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        receive_bytes.is_some_and(|b| b > 0.0),
        "no QUIC receive slots counted:\n{text}"
    );
    assert!(child.wait().unwrap().success());
}
