//! `sluice storage` as a real process: `sluice put` uploads shards with a token, `sluice index`
//! reads them back over HTTP, and SIGTERM lets an in-flight download finish before a clean exit.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{path_str, signal, sluice, sluice_ok};

struct Daemon {
    child: Child,
    addr: String,
    /// Its stderr, line by line, as it comes.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Daemon {
    /// Whether the log shows `needle` within `wait`.
    fn log_shows(&self, needle: &str, wait: Duration) -> bool {
        let deadline = std::time::Instant::now() + wait;
        while !self.log.lock().unwrap().iter().any(|l| l.contains(needle)) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `sluice storage --config FILE --listen 127.0.0.1:0` and reads the bound address
/// from its log.
fn start(config: &std::path::Path) -> Daemon {
    start_with(config, &[], None)
}

/// [`start`] with more arguments and `$SLUICE_TOKEN` set to `token`.
fn start_with(config: &std::path::Path, extra: &[&str], token: Option<&str>) -> Daemon {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.env_remove("SLUICE_TOKEN");
    if let Some(t) = token {
        command.env("SLUICE_TOKEN", t);
    }
    let mut child = command
        .args([
            "storage",
            "--config",
            path_str(config),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let lines = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line.clone());
            if let Some(at) = line.find("listen=") {
                let addr: String = line[at + 7..]
                    .chars()
                    .take_while(|c| !c.is_whitespace())
                    .collect();
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr);
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("sluice storage did not log its address");
    Daemon { child, addr, log }
}

/// `dir/storage.toml`: a node on the mountpath `data`, with `rest` of the settings.
fn storage_toml(dir: &Path, data: &Path, rest: &str) -> PathBuf {
    let toml = format!("mountpaths = [\"{}\"]\n{rest}", data.display());
    support::write_file(&dir.join("storage.toml"), &toml)
}

#[test]
fn put_index_and_a_graceful_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("train")).unwrap();
    let token = "test-upload-token-0123456789";
    let extra = format!("upload_tokens = [\"{token}\"]\n[limits]\nread_size = 65536\n");
    let config = storage_toml(dir.path(), &data, &extra);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let node = start(&config);

    let images = support::synth_images(dir.path(), 2, 5);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 5, None);
    let shards = format!("{}/out/s-{{00..01}}.tar", dir.path().display());
    let to = format!("http://{}/v1/train/", node.addr);
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-token-0123456789").unwrap();
    let refused = sluice(&[
        "put",
        &shards,
        "--to",
        &to,
        "--token-file",
        path_str(&wrong),
    ]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("403"), "{err}");
    let out = sluice_ok(&[
        "put",
        &shards,
        "--to",
        &to,
        "--token-file",
        path_str(&token_file),
    ]);
    assert!(out.contains("uploaded 4 objects (1 copies each)"), "{out}");
    assert!(data.join("train/s-01.tar.idx").exists());

    let manifest = dir.path().join("m.json");
    let indexed = sluice_ok(&[
        "index",
        &format!("{to}s-{{00..01}}.tar"),
        "--output",
        path_str(&manifest),
    ]);
    assert!(indexed.contains("10 samples"), "{indexed}");

    // A big object, read slowly, while SIGTERM arrives.
    let big: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(data.join("train/big.bin"), &big).unwrap();
    let mut s = TcpStream::connect(&node.addr).unwrap();
    s.write_all(b"GET /v1/train/big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 1024];
    let n = s.read(&mut head).unwrap();
    signal(node.child.id(), "-TERM");
    let mut all = head[..n].to_vec();
    s.read_to_end(&mut all).unwrap();
    let body_at = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(
        all.len() - body_at,
        big.len(),
        "the download was cut by SIGTERM"
    );
    let mut node = node;
    let status = node.child.wait().unwrap();
    assert!(status.success(), "sluice storage exited with {status}");
}

/// Upload tokens kept out of the config file (often a ConfigMap): a file the config names
/// (relative to it), `--token-file`, and `$SLUICE_TOKEN` each let `sluice put` upload; any
/// other token is refused, and a token file that cannot be read stops the node by name.
#[test]
fn upload_tokens_come_from_files_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("train")).unwrap();
    let tokens = [
        "from-config-file-0123456789",
        "from-flag-file-0123456789",
        "from-env-0123456789",
    ];
    std::fs::write(dir.path().join("team.token"), format!("{}\n", tokens[0])).unwrap();
    std::fs::write(dir.path().join("flag.token"), format!("{}\n", tokens[1])).unwrap();
    let config = storage_toml(dir.path(), &data, "upload_token_files = [\"team.token\"]\n");
    let flag = dir.path().join("flag.token");
    let node = start_with(&config, &["--token-file", path_str(&flag)], Some(tokens[2]));
    let images = support::synth_images(dir.path(), 1, 3);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 3, None);
    let shard = format!("{}/out/s-00.tar", dir.path().display());
    let to = format!("http://{}/v1/train/", node.addr);
    for (i, token) in tokens
        .iter()
        .chain(["not-any-of-them-0123456789"].iter())
        .enumerate()
    {
        let file = dir.path().join(format!("put-{i}.token"));
        std::fs::write(&file, token).unwrap();
        let put = sluice(&["put", &shard, "--to", &to, "--token-file", path_str(&file)]);
        assert_eq!(
            put.status.success(),
            i < 3,
            "token {i}: {}",
            String::from_utf8_lossy(&put.stderr)
        );
    }
    drop(node);
    // A token file that is not there: the node does not start, and says which file.
    std::fs::write(
        &config,
        format!(
            "mountpaths = [\"{}\"]\nupload_token_files = [\"gone.token\"]\n",
            data.display()
        ),
    )
    .unwrap();
    let out = sluice(&[
        "storage",
        "--config",
        path_str(&config),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("gone.token"), "{said}");
}

/// An upload token file rotated while the node runs (a Secret swapped, nothing restarted):
/// the new token uploads and the old is refused once the node re-reads it; an empty file
/// keeps the token in force, said once.
#[test]
fn an_upload_token_rotated_while_the_node_runs_takes_effect_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("train")).unwrap();
    let file = dir.path().join("team.token");
    let swap = |text: &str| {
        let tmp = dir.path().join("team.token.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    let (old, new) = ("the-old-upload-token-0123", "the-new-upload-token-4567");
    swap(&format!("{old}\n"));
    let config = storage_toml(dir.path(), &data, "upload_token_files = [\"team.token\"]\n");
    let node = start_with(&config, &[], None);
    let images = support::synth_images(dir.path(), 1, 3);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 3, None);
    let shard = format!("{}/out/s-00.tar", dir.path().display());
    let to = format!("http://{}/v1/train/", node.addr);
    let put = |token: &str| {
        let f = dir.path().join("put.token");
        std::fs::write(&f, token).unwrap();
        sluice(&["put", &shard, "--to", &to, "--token-file", path_str(&f)])
            .status
            .success()
    };
    assert!(put(old));
    swap(&format!("{new}\n"));
    assert!(
        node.log_shows("upload tokens re-read", Duration::from_secs(30)),
        "the node never read the new token"
    );
    assert!(put(new), "the new token was refused");
    assert!(!put(old), "the old token still uploads");
    swap("\n");
    assert!(
        node.log_shows("keeping the upload tokens", Duration::from_secs(30)),
        "an empty token file went unsaid"
    );
    assert!(put(new), "an empty token file dropped the token in force");
}
