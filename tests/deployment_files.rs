//! Every file in `configs/` parses and agrees with the code: TOML configs load into the
//! daemons' config types, systemd units carry the settings we promise (and pass
//! `systemd-analyze verify` where it exists), and the Kubernetes manifests validate against
//! the Kubernetes API's schemas (`kubernetes-validate`, offline), probe `/healthz` for
//! readiness and `/livez` for liveness, reference the ports their configs listen on, and keep
//! the rules that let them survive real use (disruption budgets, owners on distinct nodes, no
//! `replicas` under an autoscaler, a cache volume, network policies, scraping).

mod support;

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
            // configs/container/ is what tests/container.rs builds and runs (its
            // containers.conf is TOML, checked here too).
            let in_container = p.parent().is_some_and(|d| d.ends_with("container"));
            if p.is_dir() {
                stack.push(p);
            } else if in_container {
                if p.extension().is_some_and(|e| e == "conf") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    toml::from_str::<toml::Value>(&text)
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                }
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
            ("MemoryDenyWriteExecute", "yes"),
            ("UMask", "0077"),
            ("SystemCallErrorNumber", "EPERM"),
        ] {
            assert_eq!(s.get(k).map(String::as_str), Some(v), "{name}: {k}");
        }
        for k in [
            "WatchdogSec",
            "SystemCallFilter",
            "TasksMax",
            "MemoryMax",
            "LimitNOFILE",
        ] {
            assert!(s.contains_key(k), "{name}: {k}");
        }
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
        // Readiness is /healthz (503 while draining or with no disk), liveness /livez (the
        // process answers), both on the metrics port; Prometheus scrapes that port.
        for (probe, path) in [("readinessProbe", "/healthz"), ("livenessProbe", "/livez")] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{name} {probe}");
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
                    (c.token_file.is_some() || c.tenants_file.is_some()) && c.cert.is_some(),
                    "workers need tokens and TLS"
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

#[test]
fn kubernetes_manifests_validate_against_the_api_schemas() {
    // PyPI's `kubernetes-validate` ships the API's schemas.
    let Some(python) = support::python_with("kubernetes_validate") else {
        return;
    };
    // kustomization.yaml is kubectl's, not an API object: kubernetes_manifests_apply_as_one
    // checks it.
    let k8s = configs().join("kubernetes");
    let files: Vec<PathBuf> = files(&k8s, "yaml")
        .into_iter()
        .chain(files(&k8s.join("teams"), "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    let out = std::process::Command::new(python)
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .args(&files)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubernetes-validate:\n{said}");
    // Only the CRDs' kinds (Prometheus Operator, cert-manager) have no schema there; the
    // rules below check those.
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        let crd = ["ServiceMonitor", "Issuer", "Certificate"]
            .iter()
            .any(|k| line.contains(&format!("kind {k} ")));
        assert!(
            crd && line.contains("Couldn't find schema"),
            "kubernetes-validate: {line}"
        );
    }
}

/// Whether `selector` (a `matchLabels` map) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_mapping()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn kubernetes_manifests_survive_real_use() {
    let all: Vec<Value> = files(&configs().join("kubernetes"), "yaml")
        .iter()
        .flat_map(|p| docs(p))
        .collect();
    let kind = |k: &'static str| all.iter().filter(move |d| d["kind"] == k);
    let hpa_targets: Vec<&str> = kind("HorizontalPodAutoscaler")
        .map(|h| h["spec"]["scaleTargetRef"]["name"].as_str().unwrap())
        .collect();
    for w in kind("Deployment").chain(kind("StatefulSet")) {
        let name = w["metadata"]["name"].as_str().unwrap();
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        let pod = &w["spec"]["template"]["spec"];
        // An autoscaler's target carries no replicas: `kubectl apply` would reset the pool.
        if hpa_targets.contains(&name) {
            assert!(
                w["spec"]["replicas"].is_null(),
                "{name}: replicas under an autoscaler"
            );
        }
        // A voluntary disruption takes one pod at a time.
        let pdb = kind("PodDisruptionBudget")
            .find(|p| selects(&p["spec"]["selector"], labels))
            .unwrap_or_else(|| panic!("{name}: no PodDisruptionBudget"));
        assert_eq!(pdb["spec"]["maxUnavailable"].as_u64(), Some(1), "{name}");
        // Ingress only where a NetworkPolicy lets it in, and the serving port is let in.
        let policy = kind("NetworkPolicy")
            .find(|p| selects(&p["spec"]["podSelector"], labels))
            .unwrap_or_else(|| panic!("{name}: no NetworkPolicy"));
        let serving = pod["containers"][0]["ports"][0]["containerPort"]
            .as_u64()
            .unwrap();
        let opened: Vec<u64> = policy["spec"]["ingress"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|rule| rule["ports"].as_sequence().unwrap().iter())
            .filter_map(|p| p["port"].as_u64())
            .collect();
        assert!(
            opened.contains(&serving),
            "{name}: its policy keeps out its own clients"
        );
        // Scraped by the Prometheus Operator through its Service's metrics port.
        let monitor = kind("ServiceMonitor")
            .find(|m| selects(&m["spec"]["selector"], labels))
            .unwrap_or_else(|| panic!("{name}: no ServiceMonitor"));
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics", "{name}");
    }
    // Storage owners on distinct nodes: a node lost or drained leaves a copy of every shard.
    let storage = kind("StatefulSet").next().unwrap();
    let anti = &storage["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert!(selects(
        &anti["labelSelector"],
        &storage["spec"]["template"]["metadata"]["labels"]
    ));
    // Upload tokens come from a Secret, not the ConfigMap.
    let storage_toml = kind("ConfigMap")
        .find(|c| c["metadata"]["name"] == "sluice-storage")
        .unwrap()["data"]["storage.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let storage_config: sluice_storage::StorageConfig = toml::from_str(&storage_toml).unwrap();
    assert!(
        storage_config.upload_tokens.is_empty() && !storage_config.upload_token_files.is_empty()
    );
    // The workers' cache: the config's dir is a mounted volume with room for its size.
    let cpu = kind("Deployment")
        .find(|d| d["metadata"]["name"] == "sluice-cpu")
        .unwrap();
    let cpu_toml = kind("ConfigMap")
        .find(|c| c["metadata"]["name"] == "sluice-cpu")
        .unwrap()["data"]["cpu.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let cpu_config = sluice_cpu::config::CpuConfig::from_toml(&cpu_toml, "configmap").unwrap();
    let dir = cpu_config
        .cache
        .dir
        .clone()
        .expect("a cache dir in cpu.toml");
    let pod = &cpu["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == dir.to_str())
        .unwrap_or_else(|| panic!("the cache dir {dir:?} is not a mounted volume"));
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let limit = volume["emptyDir"]["sizeLimit"]
        .as_str()
        .expect("a sizeLimit on the cache");
    let bytes: u64 = limit.trim_end_matches('G').parse::<u64>().unwrap() * 1_000_000_000;
    assert!(
        cpu_config.cache.size_bytes < bytes,
        "the cache may outgrow its volume ({limit})"
    );
    // The autoscaler's metric reaches the custom metrics API through prometheus-adapter, whose
    // chart takes the rule as values.
    let values = &docs(&configs().join("kubernetes/helm/prometheus-adapter-values.yaml"))[0];
    let rules = serde_yaml::to_string(&values["rules"]["custom"]).unwrap();
    for hpa in kind("HorizontalPodAutoscaler") {
        let metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
            .as_str()
            .unwrap();
        assert!(rules.contains(metric), "no adapter rule for {metric}");
    }
    // cert-manager's certificate is the Secret the workers mount, for the Service's name.
    let cert = kind("Certificate")
        .next()
        .expect("a cert-manager Certificate");
    let mounted = cpu["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v["secret"]["secretName"] == cert["spec"]["secretName"]);
    assert!(mounted, "the workers do not mount the certificate's Secret");
}

/// The manifests as a cluster meets them: one `kubectl apply -k` of every object, the image
/// set in one place, pods the `restricted` Pod Security Standard admits in a namespace that
/// enforces it, the teams' tokens mounted where the tenants file says, training namespaces
/// let in to read manifests from storage, and the ServiceMonitors' selector label set once.
#[test]
fn kubernetes_manifests_apply_as_one_under_the_restricted_standard() {
    let dir = configs().join("kubernetes");
    let kustomization = &docs(&dir.join("kustomization.yaml"))[0];
    let listed: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for file in files(&dir, "yaml") {
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(
            name == "kustomization.yaml" || listed.contains(&name),
            "kustomization.yaml does not list {name}"
        );
    }
    let all: Vec<Value> = listed.iter().flat_map(|f| docs(&dir.join(f))).collect();
    let kind = |k: &'static str| all.iter().filter(move |d| d["kind"] == k);
    let ns = kind("Namespace").next().expect("the namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let images_of = |k: &Value| -> Vec<String> {
        k["images"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    };
    // The teams' folder (the loadgen Job each team runs in its namespace) is a kustomization
    // of its own, held to the same standard.
    let teams_dir = dir.join("teams");
    let teams = &docs(&teams_dir.join("kustomization.yaml"))[0];
    let team_files: Vec<&str> = teams["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for file in files(&teams_dir, "yaml") {
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(
            name == "kustomization.yaml" || team_files.contains(&name),
            "teams/kustomization.yaml does not list {name}"
        );
    }
    let team_docs: Vec<Value> = team_files
        .iter()
        .flat_map(|f| docs(&teams_dir.join(f)))
        .collect();
    let workloads = kind("Deployment")
        .chain(kind("StatefulSet"))
        .map(|w| (w, images_of(kustomization)))
        .chain(
            team_docs
                .iter()
                .filter(|d| d["kind"] == "Job")
                .map(|w| (w, images_of(teams))),
        );
    for (w, images) in workloads {
        let name = w["metadata"]["name"].as_str().unwrap();
        let pod = &w["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let sc = &pod["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        for volume in pod["volumes"].as_sequence().unwrap() {
            assert!(volume["hostPath"].is_null(), "{name}: hostPath");
        }
        for c in pod["containers"].as_sequence().unwrap() {
            let image = c["image"].as_str().unwrap();
            assert!(!image.starts_with("localhost/"), "{name}: {image}");
            let repo = image.split(':').next().unwrap();
            assert!(
                images.iter().any(|i| i == repo),
                "{name}: kustomization sets no {repo}"
            );
            let csc = &c["securityContext"];
            assert_eq!(csc["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(csc["capabilities"]["drop"][0], "ALL", "{name}");
            assert!(
                c["resources"]["limits"]["memory"].is_string(),
                "{name}: no memory limit"
            );
            assert!(
                c["volumeMounts"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .all(|m| m["subPath"].is_null() || name != "sluice-cpu"),
                "{name}: a subPath mount never sees a changed ConfigMap"
            );
        }
    }
    // The tenants file names tokens in the mounted tenants Secret, one key a team.
    let cm = kind("ConfigMap")
        .find(|c| c["metadata"]["name"] == "sluice-cpu")
        .unwrap();
    let cpu_toml = cm["data"]["cpu.toml"].as_str().unwrap();
    let cpu_config = sluice_cpu::config::CpuConfig::from_toml(cpu_toml, "configmap").unwrap();
    let tenants_file = cpu_config.tenants_file.expect("a tenants file");
    let cpu = kind("Deployment").next().unwrap();
    let pod = &cpu["spec"]["template"]["spec"];
    let mount_of = |volume: &str| -> String {
        pod["containers"][0]["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("no mount of {volume}"))["mountPath"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        tenants_file,
        Path::new(&mount_of("config")).join("tenants.toml")
    );
    let tenants: toml::Value =
        toml::from_str(cm["data"]["tenants.toml"].as_str().unwrap()).unwrap();
    let secret_volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "sluice-tenants")
        .expect("the tenants Secret as a volume");
    let at = mount_of(secret_volume["name"].as_str().unwrap());
    let teams = tenants["tenant"].as_array().unwrap();
    assert!(
        teams.len() >= 2,
        "two teams at least, as the walk-through makes"
    );
    for t in teams {
        let token = t["token_file"].as_str().unwrap();
        let team = t["name"].as_str().unwrap();
        assert_eq!(
            Path::new(token),
            Path::new(&at).join(team),
            "{team}'s token"
        );
    }
    // Training namespaces may read manifests (and shards) from storage.
    let storage_policy = kind("NetworkPolicy")
        .find(|p| p["metadata"]["name"] == "sluice-storage")
        .unwrap();
    let training = storage_policy["spec"]["ingress"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|rule| {
            rule["from"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|f| f["namespaceSelector"]["matchLabels"]["sluice.io/training"] == "true")
                && rule["ports"][0]["port"].as_u64() == Some(7000)
        });
    assert!(
        training,
        "training pods cannot read a manifest from storage"
    );
    // A team's clients: its NetworkPolicy selects the Job's pods and lets them reach the
    // workers' QUIC port and storage's HTTP port in the pool's namespace.
    let job = team_docs.iter().find(|d| d["kind"] == "Job").unwrap();
    let policy = team_docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("the teams' NetworkPolicy");
    assert!(selects(
        &policy["spec"]["podSelector"],
        &job["spec"]["template"]["metadata"]["labels"]
    ));
    let reaches = |app: &str, protocol: &str, port: u64| {
        policy["spec"]["egress"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|rule| {
                rule["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    == "sluice"
                    && rule["to"][0]["podSelector"]["matchLabels"]["app"] == app
                    && rule["ports"][0]["protocol"] == protocol
                    && rule["ports"][0]["port"].as_u64() == Some(port)
            })
    };
    assert!(
        reaches("sluice-cpu", "UDP", 7100),
        "clients cannot reach workers"
    );
    assert!(
        reaches("sluice-storage", "TCP", 7000),
        "clients cannot reach storage"
    );
    // The ServiceMonitors' selector label: added by one patch, named on none of them.
    for m in kind("ServiceMonitor") {
        assert!(m["metadata"]["labels"].is_null(), "a label set twice");
    }
    let patch = &kustomization["patches"][0];
    assert_eq!(patch["target"]["kind"], "ServiceMonitor");
    assert!(patch["patch"].as_str().unwrap().contains("release:"));
}

/// checkov, as a platform team runs it on manifests before a cluster sees them: every check
/// passes but the three skipped with their reasons beside them (image digest, pull policy,
/// CPU limits). Skips with a message unless `SLUICE_CHECKOV` names a checkov (.ci/run makes
/// one).
#[test]
fn checkov_passes_the_manifests() {
    let Some(checkov) = std::env::var_os("SLUICE_CHECKOV").filter(|c| !c.is_empty()) else {
        eprintln!("skipped: SLUICE_CHECKOV names no checkov");
        return;
    };
    let out = std::process::Command::new(checkov)
        .arg("-d")
        .arg(configs().join("kubernetes"))
        .args(["--framework", "kubernetes", "--compact", "--quiet"])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "checkov:\n{said}");
    assert!(said.contains("Failed checks: 0"), "{said}");
}
