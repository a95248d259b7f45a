//! Every file in `configs/` parses and agrees with the code: TOML configs load into the
//! daemons' config types, systemd units carry the settings we promise (and pass
//! `systemd-analyze verify` where it exists), and the Kubernetes manifests parse, probe
//! `/healthz`, and reference the ports their configs listen on.

use sluice_daemon::DaemonConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs")
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn every_file_in_configs_is_checked() {
    let mut unchecked = Vec::new();
    let mut stack = vec![configs()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if !matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("toml" | "service" | "yaml")
            ) {
                unchecked.push(p);
            }
        }
    }
    assert!(unchecked.is_empty(), "no test checks {unchecked:?}");
}

#[test]
fn toml_configs_load() {
    let dir = tempfile::tempdir().unwrap();
    for path in files(&configs(), "toml") {
        let text = std::fs::read_to_string(&path).unwrap();
        match path.file_name().unwrap().to_str().unwrap() {
            "storage.toml" => {
                let text = text.replace("/srv/sluice/disk0", dir.path().to_str().unwrap());
                sluice_storage::StorageConfig::from_toml(&text, "storage.toml").unwrap();
            }
            "cpu.toml" => {
                sluice_cpu::config::CpuConfig::from_toml(&text, "cpu.toml").unwrap();
            }
            "mixture.toml" => {
                // Loaders read it (`loadgen --mixture`, Python); its datasets are examples.
                let spec = sluice_dataset::mixture::read_spec(&path).unwrap();
                assert_eq!(spec.sources.len(), 2);
            }
            other => panic!("configs/{other}: which program reads it?"),
        }
    }
}

/// `Key=value` lines of a unit, by section.
fn unit(path: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: {line}", path.display()));
        out.entry(section.clone())
            .or_default()
            .insert(k.to_string(), v.to_string());
    }
    out
}

#[test]
fn systemd_units_are_hardened_notify_services() {
    let units = files(&configs().join("systemd"), "service");
    assert_eq!(units.len(), 2);
    let verify_dir = tempfile::tempdir().unwrap();
    for path in &units {
        let u = unit(path);
        let s = &u["Service"];
        let name = path.display();
        for (k, v) in [
            ("Type", "notify"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("PrivateTmp", "yes"),
            ("Restart", "on-failure"),
            ("User", "sluice"),
            ("KillSignal", "SIGTERM"),
        ] {
            assert_eq!(s.get(k).map(String::as_str), Some(v), "{name}: {k}");
        }
        assert!(s.contains_key("WatchdogSec"), "{name}: WatchdogSec");
        let exec = &s["ExecStart"];
        assert!(exec.starts_with("/usr/local/bin/sluice "), "{name}: {exec}");
        let sub = exec.split_whitespace().nth(1).unwrap();
        assert!(matches!(sub, "storage" | "cpu"), "{name}: {sub}");
        if sub == "storage" {
            assert!(
                s.contains_key("ReadWritePaths"),
                "{name}: the data paths must be writable"
            );
        }
        assert!(u["Install"].contains_key("WantedBy"));
        // For systemd-analyze: the same unit, pointing at the binary we built.
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice"));
        std::fs::write(verify_dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(files(verify_dir.path(), "service"))
        .output()
    else {
        eprintln!("systemd-analyze is not installed: skipping `systemd-analyze verify`");
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A sandbox without systemd as PID 1 can still verify; only unit problems fail here.
    let problems: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("sluice-") && !l.contains("Failed to create") && !l.contains("bus"))
        .collect();
    assert!(problems.is_empty(), "systemd-analyze verify: {problems:?}");
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_yaml::from_str(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn port_of(toml_text: &str, key: &str) -> u16 {
    let v: toml::Value = toml::from_str(toml_text).unwrap();
    let addr: std::net::SocketAddr = v[key].as_str().unwrap().parse().unwrap();
    addr.port()
}

#[test]
fn kubernetes_manifests_parse_and_agree_on_ports() {
    let all: Vec<Value> = files(&configs().join("kubernetes"), "yaml")
        .iter()
        .flat_map(|p| docs(p))
        .collect();
    let kind = |k: &'static str| all.iter().filter(move |d| d["kind"] == k);
    let config_maps: BTreeMap<String, &Value> = kind("ConfigMap")
        .map(|d| (d["metadata"]["name"].as_str().unwrap().to_string(), d))
        .collect();
    let mut workloads = 0;
    for w in kind("Deployment").chain(kind("StatefulSet")) {
        workloads += 1;
        let name = w["metadata"]["name"].as_str().unwrap();
        let pod = &w["spec"]["template"];
        let container = &pod["spec"]["containers"][0];
        let ports: BTreeMap<&str, (u16, &str)> = container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    (
                        p["containerPort"].as_u64().unwrap() as u16,
                        p["protocol"].as_str().unwrap(),
                    ),
                )
            })
            .collect();
        // Probes hit /healthz on the metrics port; Prometheus scrapes that port.
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                container[probe]["httpGet"]["path"], "/healthz",
                "{name} {probe}"
            );
            assert_eq!(
                container[probe]["httpGet"]["port"], "metrics",
                "{name} {probe}"
            );
        }
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{name}");
        assert_eq!(
            annotations["prometheus.io/port"].as_str().unwrap(),
            ports["metrics"].0.to_string(),
            "{name}: scrape port"
        );
        // The daemon's config (from its ConfigMap) listens where the container says.
        let cm = config_maps[name];
        let (file, serving, protocol) = match name {
            "sluice-cpu" => ("cpu.toml", "quic", "UDP"),
            "sluice-storage" => ("storage.toml", "http", "TCP"),
            other => panic!("unknown workload {other}"),
        };
        let text = cm["data"][file].as_str().unwrap();
        assert_eq!(
            port_of(text, "listen"),
            ports[serving].0,
            "{name}: listen port"
        );
        assert_eq!(ports[serving].1, protocol, "{name}: protocol");
        assert_eq!(
            port_of(text, "metrics_listen"),
            ports["metrics"].0,
            "{name}: metrics port"
        );
        match name {
            "sluice-cpu" => {
                let c = sluice_cpu::config::CpuConfig::from_toml(text, "configmap").unwrap();
                assert!(
                    c.token_file.is_some() && c.cert.is_some(),
                    "workers need a token and TLS"
                );
            }
            _ => {
                let c: sluice_storage::StorageConfig = toml::from_str(text).unwrap();
                // One volume per disk, mounted where the config's mountpaths are.
                let mounts: Vec<&str> = container["volumeMounts"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|m| m["mountPath"].as_str().unwrap())
                    .collect();
                for m in &c.mountpaths {
                    assert!(
                        mounts.contains(&m.to_str().unwrap()),
                        "{name}: {m:?} not mounted"
                    );
                }
                assert_eq!(
                    w["spec"]["volumeClaimTemplates"]
                        .as_sequence()
                        .unwrap()
                        .len(),
                    c.mountpaths.len()
                );
                // The shape tests/cluster.rs measures node loss on: three nodes that list
                // each other as peers, every object on two of them.
                assert_eq!(c.replicas, 2, "{name}: replicas in the config");
                assert_eq!(
                    w["spec"]["replicas"].as_u64(),
                    Some(3),
                    "{name}: three nodes"
                );
                assert_eq!(c.peers.len(), 3, "{name}: every node a peer");
            }
        }
        // The Service in front exposes the same ports, headless so clients see every pod.
        let svc = kind("Service")
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Service for {name}"));
        assert_eq!(svc["spec"]["clusterIP"], "None", "{name}: headless");
        for p in svc["spec"]["ports"].as_sequence().unwrap() {
            let (port, proto) = ports[p["name"].as_str().unwrap()];
            assert_eq!(
                p["port"].as_u64().unwrap() as u16,
                port,
                "{name}: service port"
            );
            assert_eq!(p["protocol"].as_str().unwrap(), proto);
        }
    }
    assert_eq!(workloads, 2);
    // The CPU pool's autoscaler scales its Deployment on a gauge the worker exports.
    let hpa = kind("HorizontalPodAutoscaler")
        .find(|h| h["metadata"]["name"] == "sluice-cpu")
        .expect("an autoscaler for the CPU pool");
    let target = &hpa["spec"]["scaleTargetRef"];
    assert_eq!(
        (&target["kind"], &target["name"]),
        (&"Deployment".into(), &"sluice-cpu".into())
    );
    let metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        .as_str()
        .unwrap();
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("cpu-tier/src/connection.rs"),
    )
    .unwrap();
    assert!(
        source.contains(&format!("\"{metric}\"")),
        "the worker exports no {metric}"
    );
    assert!(
        hpa["spec"]["minReplicas"].as_u64().unwrap() >= 1
            && hpa["spec"]["maxReplicas"].as_u64() >= hpa["spec"]["minReplicas"].as_u64()
    );
}
