//! The workspace's dependency rules, checked from `cargo metadata` so that a new dependency
//! that breaks the architecture fails CI instead of growing unnoticed:
//! - the pure crates (planner, wire protocol) pull in no runtime, network, clock or metrics
//!   crate, even transitively; the shard format and wire crates may use tokio only through an
//!   optional feature (IO traits for their async shells);
//! - tier crates do not depend on each other;
//! - the GPU client links no image decoder;
//! - daemon support (`sluice-daemon`: config files, the recorder, the admin listener) is shared
//!   by the two daemon tiers and depends on no Sluice crate; the client does not use it;
//! - the dataset tools sit beside the shard format and depend on no tier;
//! - `anyhow` is for the binary's edge only;
//! - no library installs the process's metrics recorder: the binary (or the test bed) does,
//!   and hands the tiers its handle;
//! - inside the client and the CPU tier, modules stand on floors (ARCHITECTURE.md): each
//!   imports only from its own floor or those below, and no floor holds a circle;
//! - the sans-IO cores (the client's session, protocol and assembly, the worker's session)
//!   use no runtime, socket, file or clock.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use support::succeed;

use serde_json::Value;

const TIERS: [&str; 3] = ["sluice-storage", "sluice-cpu", "sluice-client"];
const PURE: [&str; 2] = ["sluice-plan", "sluice-wire"];
const IMPURE: [&str; 8] = [
    "tokio", "quinn", "hyper", "reqwest", "metrics", "mio", "axum", "rustls",
];
const DECODERS: [&str; 5] = ["image", "zune-jpeg", "jpeg-decoder", "turbojpeg", "mozjpeg"];

struct Graph {
    /// package name → names of its normal (non-dev, non-build) dependencies, resolved.
    deps: HashMap<String, BTreeSet<String>>,
    /// workspace package name → [(dependency name, optional)] as declared.
    declared: HashMap<String, Vec<(String, bool, String)>>,
}

fn graph() -> Graph {
    let out = succeed(
        Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")),
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut names = HashMap::new();
    let mut declared = HashMap::new();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for p in meta["packages"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let name = p["name"].as_str().unwrap().to_string();
        names.insert(id.to_string(), name.clone());
        if members.contains(id) {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["name"].as_str().unwrap().to_string(),
                        d["optional"].as_bool().unwrap_or(false),
                        d["kind"].as_str().unwrap_or("normal").to_string(),
                    )
                })
                .collect();
            declared.insert(name, deps);
        }
    }
    let mut deps = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let name = names[node["id"].as_str().unwrap()].clone();
        let normal: BTreeSet<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| names[d["pkg"].as_str().unwrap()].clone())
            .collect();
        deps.entry(name)
            .or_insert_with(BTreeSet::new)
            .extend(normal);
    }
    Graph { deps, declared }
}

impl Graph {
    fn transitive(&self, root: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![root.to_string()];
        while let Some(p) = stack.pop() {
            for d in self.deps.get(&p).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    }
}

/// Normal dependencies of `krate`, transitively, with features resolved as a build of that
/// crate alone resolves them (`cargo metadata` unifies features across the workspace).
fn tree(krate: &str) -> BTreeSet<String> {
    let out = succeed(
        Command::new(env!("CARGO"))
            .args([
                "tree",
                "-e",
                "normal",
                "--prefix",
                "none",
                "-f",
                "{p}",
                "-p",
                krate,
                "--manifest-path",
            ])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn pure_crates_pull_in_no_runtime_network_or_metrics() {
    for krate in PURE {
        let all = tree(krate);
        let bad: Vec<_> = IMPURE.iter().filter(|i| all.contains(**i)).collect();
        assert!(bad.is_empty(), "{krate} depends on {bad:?}");
    }
    let g = graph();
    // The wire codec's async shell is an optional feature that brings tokio's IO traits and
    // nothing else; the shard format has no async side at all.
    for krate in ["sluice-shard", "sluice-wire"] {
        for (dep, optional, kind) in &g.declared[krate] {
            if kind == "normal" && IMPURE.contains(&dep.as_str()) {
                assert!(
                    dep == "tokio" && *optional,
                    "{krate} depends on {dep} (only an optional tokio is allowed)"
                );
            }
        }
    }
    let shard_alone = tree("sluice-shard");
    assert!(
        !shard_alone.contains("tokio")
            || g.declared["sluice-shard"]
                .iter()
                .any(|(d, o, _)| d == "tokio" && *o)
    );
}

/// Fails unless `krate` depends on none of `banned`, even transitively.
fn links_none(g: &Graph, krate: &str, banned: &[&str]) {
    let all = g.transitive(krate);
    let bad: Vec<_> = banned.iter().filter(|d| all.contains(**d)).collect();
    assert!(bad.is_empty(), "{krate} depends on {bad:?}");
}

#[test]
fn tiers_do_not_depend_on_each_other() {
    let g = graph();
    for tier in TIERS {
        let all = g.transitive(tier);
        for other in TIERS.iter().filter(|t| **t != tier) {
            assert!(!all.contains(*other), "{tier} depends on {other}");
        }
    }
}

#[test]
fn gpu_client_links_no_image_decoder() {
    links_none(&graph(), "sluice-client", &DECODERS);
}

#[test]
fn anyhow_only_in_the_binary() {
    let g = graph();
    for (krate, deps) in &g.declared {
        if krate != "sluice" {
            assert!(
                !deps
                    .iter()
                    .any(|(d, _, kind)| d == "anyhow" && kind == "normal"),
                "{krate} depends on anyhow: libraries use thiserror enums"
            );
        }
    }
}

#[test]
fn daemon_support_is_shared_by_the_daemon_tiers_only() {
    let g = graph();
    let support = g.transitive("sluice-daemon");
    let ours: Vec<_> = support.iter().filter(|d| d.starts_with("sluice")).collect();
    assert!(ours.is_empty(), "sluice-daemon depends on {ours:?}");
    for tier in ["sluice-storage", "sluice-cpu"] {
        assert!(
            g.deps[tier].contains("sluice-daemon"),
            "{tier} should read its config and serve /metrics and /healthz through sluice-daemon"
        );
    }
    assert!(
        !g.transitive("sluice-client").contains("sluice-daemon"),
        "the client links no daemon support"
    );
}

#[test]
fn dataset_tools_depend_on_no_tier() {
    links_none(&graph(), "sluice-dataset", &TIERS);
}

#[test]
fn only_the_binary_and_the_test_bed_install_the_metrics_recorder() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let libraries = [
        "storage-tier",
        "cpu-tier",
        "gpu-client",
        "wire",
        "plan",
        "shard",
        "dataset",
        "python",
    ];
    let mut found = Vec::new();
    for lib in libraries {
        let mut dirs = vec![root.join(lib).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains("metrics_handle(") || text.contains("set_global_recorder") {
                        found.push(path.strip_prefix(root).unwrap().display().to_string());
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "libraries that install the metrics recorder (take a PrometheusHandle instead): {found:?}"
    );
}

/// Every `.rs` file under `dir`, with the module of the crate it belongs to (its first path
/// component under `src/`).
fn modules(dir: &std::path::Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                let module = rel
                    .split('/')
                    .next()
                    .unwrap()
                    .trim_end_matches(".rs")
                    .to_string();
                out.push((module, rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out
}

/// The modules each module names through `crate::` (in code, not in comments), with the file.
fn imports(dir: &std::path::Path) -> Vec<(String, String, String)> {
    let mut edges = Vec::new();
    for (module, file, text) in modules(dir) {
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut named = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for part in group.split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    named.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                named.insert(name);
            }
        }
        for name in named {
            if !name.is_empty() && name != module {
                edges.push((module.clone(), name, file.clone()));
            }
        }
    }
    edges
}

/// Checks `dir`'s imports against `floors` (lowest first).
fn check_floors(dir: &str, floors: &[&[&str]]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let floor = |m: &str| floors.iter().position(|f| f.contains(&m));
    let mut wrong = Vec::new();
    let mut same: HashMap<String, BTreeSet<String>> = HashMap::new();
    for (from, to, file) in imports(&root) {
        let (Some(a), b) = (floor(&from), floor(&to)) else {
            wrong.push(format!("{file}: module {from} is on no floor"));
            continue;
        };
        match b {
            // Not a module: an item `lib.rs` re-exports. Import it by its module's path.
            None => wrong.push(format!(
                "{file}: crate::{to} (import it by its module's path)"
            )),
            Some(b) if b > a => wrong.push(format!(
                "{file}: {from} (floor {a}) imports {to} (floor {b})"
            )),
            Some(b) if b == a => {
                same.entry(from).or_default().insert(to);
            }
            Some(_) => {}
        }
    }
    // No circle within a floor: follow each module's same-floor imports back to itself.
    for start in same.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = same[start].iter().collect();
        while let Some(m) = stack.pop() {
            if m == start {
                wrong.push(format!("{dir}: {start} imports itself through its floor"));
                break;
            }
            if seen.insert(m.clone()) {
                stack.extend(same.get(m).into_iter().flatten());
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports running back up in {dir}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn client_modules_import_only_down_their_floors() {
    check_floors(
        "gpu-client/src",
        &[
            &[
                "error",
                "config",
                "batch",
                "buffers",
                "ledger",
                "reorder",
                "arena",
                "same_host",
                "affinity",
                "stats",
                "tls",
                "quic",
                "metrics",
                "nvrtc",
                "testing",
                "clock",
                "lib",
            ],
            &["session", "protocol", "assembly"],
            &["link", "local", "coordinator", "membership"],
            &["loader", "cuda"],
        ],
    );
}

#[test]
fn cpu_tier_modules_import_only_down_their_floors() {
    check_floors(
        "cpu-tier/src",
        &[
            &[
                "source",
                "geometry",
                "restart",
                "metrics",
                "tls",
                "tenants",
                "slots",
                "clip",
                "error",
                "jpeg",
                "fields",
                "engine",
                "share",
                "tensor",
                "mappings",
                "key_files",
                "lib",
            ],
            &["worker", "config", "admission"],
            &["connection", "same_host", "reload", "server"],
        ],
    );
}

/// The state machines the shells drive do no IO and read no clock: time comes in as an
/// argument, so the simulations can drive them with no runtime at all.
#[test]
fn the_sans_io_cores_use_no_runtime_socket_file_or_clock() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cores = [
        "gpu-client/src/session.rs",
        "gpu-client/src/assembly.rs",
        "gpu-client/src/protocol.rs",
        "gpu-client/src/protocol/places.rs",
        "gpu-client/src/protocol/hedge.rs",
        "wire/src/session.rs",
        "wire/src/session/fair.rs",
    ];
    let banned = [
        "tokio",
        "quinn",
        "std::net",
        "std::fs",
        "std::os",
        "Instant::now",
        "SystemTime",
    ];
    let mut found = Vec::new();
    for core in cores {
        let text = std::fs::read_to_string(root.join(core)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for b in banned.iter().filter(|b| line.contains(*b)) {
                found.push(format!("{core}:{}: {b}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "IO or a clock in a sans-IO core: {found:?}"
    );
}
