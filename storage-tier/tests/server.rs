//! The storage server over real loopback sockets: objects, ranges, listings, uploads, hostile
//! paths, slow and greedy clients, concurrent streams, and the SIGTERM drain (cancelling the
//! shutdown token) with its deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::start;
use sluice_shard::{ShardWriter, WriterConfig};
use sluice_storage::{StorageConfig, CHECKSUM_HEADER};

/// A node serving [`data`] in a temporary directory, with `config`'s settings changed by
/// `tune`; and the data root.
fn serving(tune: impl FnOnce(&mut StorageConfig)) -> (tempfile::TempDir, PathBuf, common::Node) {
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = data(dir.path());
    let node = start_tuned(&root, tune);
    (dir, root, node)
}

/// A node on `root` with `config`'s settings, changed by `tune`.
fn start_tuned(root: &Path, tune: impl FnOnce(&mut StorageConfig)) -> common::Node {
    let mut cfg = config(root);
    tune(&mut cfg);
    start(cfg)
}

fn config(root: &Path) -> StorageConfig {
    StorageConfig {
        mountpaths: vec![root.to_path_buf()],
        upload_tokens: vec!["secret-token-0123456789".into()],
        ..StorageConfig::default()
    }
}

/// A data folder with bucket `b`: a shard (with its .idx), a nested object, and a secret
/// outside the data root reachable only through a symlink.
fn data(dir: &Path) -> (std::path::PathBuf, sluice_shard::WrittenShard) {
    let root = dir.join("data");
    std::fs::create_dir_all(root.join("b/nested")).unwrap();
    let mut w = ShardWriter::new(WriterConfig::new(format!(
        "{}/b/train-%06d.tar",
        root.display()
    )))
    .unwrap();
    for i in 0..20u32 {
        w.write(&format!("k{i}"), &[("bin", &vec![i as u8; 3000])])
            .unwrap();
    }
    let shard = w.finish().unwrap().remove(0);
    std::fs::write(root.join("b/nested/x.bin"), b"nested object").unwrap();
    std::fs::write(dir.join("secret.txt"), b"do not serve").unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("b/escape.bin")).unwrap();
    (root, shard)
}

/// The body of `GET url`.
fn text(http: &reqwest::blocking::Client, url: &str) -> String {
    http.get(url).send().unwrap().text().unwrap()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Sends raw bytes and returns the response's status line and body (URL libraries normalize
/// `..` away, so hostile paths go raw).
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[test]
fn serves_objects_ranges_heads_and_listings() {
    let dir = tempfile::tempdir().unwrap();
    let (root, shard) = data(dir.path());
    let node = start(config(&root));
    let http = client();
    let bytes = std::fs::read(&shard.path).unwrap();

    let r = http.get(node.url("/v1/b/train-000000.tar")).send().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()[CHECKSUM_HEADER],
        shard.info.checksum.to_string().as_str()
    );
    assert_eq!(r.headers()["accept-ranges"], "bytes");
    assert_eq!(r.bytes().unwrap().as_ref(), bytes.as_slice());

    let r = http
        .get(node.url("/v1/b/train-000000.tar"))
        .header("Range", "bytes=1000-1999")
        .send()
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 1000-1999/{}", bytes.len()).as_str()
    );
    assert_eq!(r.bytes().unwrap().as_ref(), &bytes[1000..2000]);
    let r = http
        .get(node.url("/v1/b/train-000000.tar"))
        .header("Range", "bytes=-100")
        .send()
        .unwrap();
    assert_eq!(r.bytes().unwrap().as_ref(), &bytes[bytes.len() - 100..]);
    let r = http
        .get(node.url("/v1/b/train-000000.tar"))
        .header("Range", format!("bytes={}-", bytes.len()))
        .send()
        .unwrap();
    assert_eq!(r.status(), 416);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes */{}", bytes.len()).as_str()
    );

    let r = http
        .head(node.url("/v1/b/train-000000.tar"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-length"],
        bytes.len().to_string().as_str()
    );

    let keys = |url: &str| -> Vec<String> {
        let list: serde_json::Value = serde_json::from_str(&text(&http, url)).unwrap();
        let objects = list["objects"].as_array().unwrap().iter();
        objects.map(|o| o["key"].as_str().unwrap().into()).collect()
    };
    let train = keys(&node.url("/v1/b?prefix=train"));
    assert_eq!(train, ["train-000000.tar", "train-000000.tar.idx"]);
    assert!(keys(&node.url("/v1/b")).contains(&"nested/x.bin".into()));

    let r = http.get(node.url("/v1/b/nested/x.bin")).send().unwrap();
    assert_eq!(r.text().unwrap(), "nested object");
    for (path, status) in [
        ("/v1/b/missing.tar", 404),
        ("/v1/nobucket", 404),
        ("/v1/Bad!", 400),
    ] {
        let r = http.get(node.url(path)).send().unwrap();
        assert_eq!(r.status(), status, "{path}");
        let body: serde_json::Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    // Outside /v1/ is the S3 read path: its errors are S3's XML.
    let r = http.get(node.url("/elsewhere")).send().unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().unwrap().contains("<Code>NoSuchBucket</Code>"));
    assert_eq!(
        text(&http, &node.url("/healthz")),
        "{\"status\":\"ok\"}\n",
        "the same health answer as the admin listener's and the CPU tier's"
    );
    let metrics = text(&http, &node.url("/metrics"));
    assert!(
        metrics.contains("sluice_storage_requests_total"),
        "{metrics}"
    );
    node.stop();
}

#[test]
fn hostile_paths_never_leave_the_data_root() {
    let (_dir, _, node) = serving(|_| {});
    for path in [
        "/v1/b/../../secret.txt",
        "/v1/b/%2e%2e/%2e%2e/secret.txt",
        "/v1/b/%2E%2E%2F%2E%2E%2Fsecret.txt",
        "/v1/b//etc/passwd",
        "/v1/b/nested/../../../secret.txt",
        "/v1/b/escape.bin",
        "/v1/%2e%2e/secret.txt",
        "/v1/b/a%00b",
    ] {
        let (status, text) = raw(
            node.addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert!(status == 400 || status == 404, "{path}: {status}");
        assert!(!text.contains("do not serve"), "{path} leaked the secret");
        assert!(text.contains("\"error\""), "{path}: {text}");
    }
    node.stop();
}

#[test]
fn uploads_need_a_token_and_land_whole() {
    let (_dir, root, node) = serving(|_| {});
    let http = client();
    let url = node.url("/v1/up/dir/new.tar");
    assert_eq!(http.put(&url).body("x").send().unwrap().status(), 401);
    assert_eq!(
        http.put(&url)
            .bearer_auth("wrong-token-0123456789")
            .body("x")
            .send()
            .unwrap()
            .status(),
        403
    );
    let body = vec![7u8; 3 << 20];
    let r = http
        .put(&url)
        .bearer_auth("secret-token-0123456789")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let sum = r.headers()[CHECKSUM_HEADER].to_str().unwrap().to_string();
    assert_eq!(
        sum,
        sluice_shard::Checksum(xxhash_rust::xxh3::xxh3_64(&body)).to_string()
    );
    let r = http.get(&url).send().unwrap();
    assert_eq!(r.headers()[CHECKSUM_HEADER], sum.as_str());
    assert_eq!(r.bytes().unwrap().len(), body.len());
    // No temporary file is left behind or listed.
    let leftovers: Vec<_> = std::fs::read_dir(root.join("up/dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["new.tar"]);
    node.stop();
}

#[test]
fn slow_and_oversized_request_heads_are_cut_off() {
    let (_dir, _, node) = serving(|cfg| {
        cfg.timeouts.header_read_secs = 1.0;
        cfg.limits.max_header_bytes = 8192;
    });
    // Slowloris: half a request head, then silence.
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "a slow head must not be served"
    );
    // An oversized head.
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let (status, _) = raw(node.addr, big.as_bytes());
    assert!(status == 431 || status == 0, "oversized head got {status}");
    // The server is still healthy.
    assert_eq!(
        client().get(node.url("/healthz")).send().unwrap().status(),
        200
    );
    node.stop();
}

#[test]
fn connections_beyond_the_limit_wait_for_a_slot() {
    let (_dir, _, node) = serving(|cfg| cfg.limits.max_connections = 1);
    let hold = TcpStream::connect(node.addr).unwrap(); // takes the only slot
    std::thread::sleep(Duration::from_millis(200));
    let mut waiting = TcpStream::connect(node.addr).unwrap();
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        waiting.read(&mut buf).is_err(),
        "served beyond max_connections"
    );
    drop(hold);
    waiting
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    waiting.read_to_end(&mut out).unwrap();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    node.stop();
}

/// Sends `request` on a fresh connection and reads the first bytes of its answer (at least
/// one): a stream now in flight, and what has arrived of it.
fn stream_in_flight(addr: SocketAddr, request: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request).unwrap();
    let mut first = [0u8; 4096];
    let n = s.read(&mut first).unwrap();
    assert!(n > 0);
    (s, first[..n].to_vec())
}

/// Where the body starts in the raw bytes of a response.
fn body_start(response: &[u8]) -> usize {
    response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4
}

#[test]
fn shutdown_lets_an_in_flight_stream_finish() {
    let dir = tempfile::tempdir().unwrap();
    let (root, big) = big_object(dir.path(), 24 << 20);
    let node = start_tuned(&root, |cfg| cfg.limits.read_size = 1 << 20);
    let (mut s, mut rest) = stream_in_flight(
        node.addr,
        b"GET /v1/b/big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    node.shutdown.cancel(); // SIGTERM
    s.read_to_end(&mut rest).unwrap();
    let body_at = body_start(&rest);
    assert_eq!(
        rest.len() - body_at,
        big.len(),
        "the stream was cut short by the drain"
    );
    assert!(rest[body_at..] == big[..]);
    let addr = node.addr;
    node.stop();
    // Stopped: the listener is closed.
    assert!(TcpStream::connect(addr).is_err());
}

/// A data folder whose bucket `b` holds one object of `len` patterned bytes, `big.bin`.
fn big_object(dir: &Path, len: u32) -> (std::path::PathBuf, Vec<u8>) {
    let root = dir.join("data");
    std::fs::create_dir_all(root.join("b")).unwrap();
    let big: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("b/big.bin"), &big).unwrap();
    (root, big)
}

#[test]
fn concurrent_streams_and_ranges_each_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (root, big) = big_object(dir.path(), 6 << 20);
    let node = start_tuned(&root, |cfg| cfg.limits.read_size = 1 << 20);
    let url = node.url("/v1/b/big.bin");
    // More concurrent streams than runtime workers, half of them ranges, on fresh connections.
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let request = client().get(&url);
                let request = if i % 2 == 1 {
                    request.header("Range", format!("bytes={}-", i * 100_000))
                } else {
                    request
                };
                (i, request.send().unwrap().bytes().unwrap())
            })
        })
        .collect();
    for c in clients {
        let (i, got) = c.join().unwrap();
        let from = if i % 2 == 1 { i * 100_000 } else { 0 };
        assert!(got.as_ref() == &big[from..], "stream {i} differs");
    }
    node.stop();
}

#[test]
fn run_returns_at_the_drain_deadline_with_a_stream_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let (root, big) = big_object(dir.path(), 24 << 20);
    let node = start_tuned(&root, |cfg| {
        cfg.timeouts.drain_secs = 0.5;
        cfg.timeouts.idle_secs = 3600.0;
    });
    let (mut s, mut received) =
        stream_in_flight(node.addr, b"GET /v1/b/big.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    // SIGTERM while the client reads nothing: the stream cannot finish, so `run` returns at
    // the drain deadline instead of waiting out the idle timeout (an hour), and the stream
    // ends with the runtime it was served on.
    let addr = node.addr;
    let (stopped, returned) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        node.stop();
        let _ = stopped.send(());
    });
    assert!(
        returned.recv_timeout(Duration::from_secs(60)).is_ok(),
        "run did not return after the drain deadline"
    );
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.read_to_end(&mut received);
    let body_at = body_start(&received);
    assert!(
        received.len() - body_at < big.len(),
        "a stream past the drain deadline was finished anyway"
    );
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}

#[test]
fn only_listed_buckets_are_served_and_metrics_can_have_their_own_address() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = data(dir.path());
    std::fs::create_dir_all(root.join("other")).unwrap();
    std::fs::write(root.join("other/x.bin"), b"x").unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let node = start_tuned(&root, |cfg| {
        cfg.buckets = vec!["b".into()];
        cfg.metrics_listen = Some(metrics_port);
        cfg.limits.max_list_keys = 1;
    });
    let http = client();
    let page: serde_json::Value = serde_json::from_str(&text(&http, &node.url("/v1/b"))).unwrap();
    assert_eq!(page["objects"].as_array().unwrap().len(), 1);
    assert_eq!(page["objects"][0]["key"], "nested/x.bin");
    assert_eq!(page["truncated"], true);
    assert_eq!(
        http.get(node.url("/v1/b/nested/x.bin"))
            .send()
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(node.url("/v1/other/x.bin"))
            .send()
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        http.get(node.url("/other/x.bin")).send().unwrap().status(),
        404
    );
    let m = http
        .get(format!("http://{metrics_port}/metrics"))
        .send()
        .unwrap();
    assert_eq!(m.status(), 200);
    assert_eq!(
        http.get(format!("http://{metrics_port}/v1/b/nested/x.bin"))
            .send()
            .unwrap()
            .status(),
        404
    );
    node.stop();
}

/// Unmounts what the test mounted, whatever happens.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Polls `/healthz` until its body contains `needle`; returns (status, body).
fn health_says(
    http: &reqwest::blocking::Client,
    node: &common::Node,
    needle: &str,
) -> (u16, String) {
    let mut last = (0, String::new());
    for _ in 0..100 {
        let r = http.get(node.url("/healthz")).send().unwrap();
        last = (r.status().as_u16(), r.text().unwrap());
        if last.1.contains(needle) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("/healthz never said {needle:?}: {last:?}");
}

/// A mountpath that changes under a running node (a disk mounted over it, the folder moved
/// away) is reported, not half-seen: /healthz says which and why ("degraded" while another
/// mountpath serves, 503 when none does), its objects and the listings answer 503 so readers
/// fail over to a replica (they were 404 beside a listing that showed the object), uploads
/// are refused, and everything serves again once it is back.
#[test]
fn a_mountpath_that_changes_under_the_node_is_reported_and_answered_503() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = data(dir.path());
    let spare = dir.path().join("spare");
    std::fs::create_dir_all(&spare).unwrap();
    let mut c = config(&root);
    c.mountpaths.push(spare.clone());
    c.timeouts.mountpath_check_secs = 0.05;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    c.metrics_listen = Some(admin);
    let node = start(c);
    // Probes go to the admin listener: it must say what the main port says.
    let admin_health = || {
        let r = client()
            .get(format!("http://{admin}/healthz"))
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let http = client();
    let get = |path: &str| http.get(node.url(path)).send().unwrap().status().as_u16();
    let put = || {
        http.put(node.url("/v1/b/new.bin"))
            .bearer_auth("secret-token-0123456789")
            .body(vec![1u8; 10])
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(get("/v1/b/train-000000.tar"), 200);
    health_says(&http, &node, "\"ok\"");

    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&root)
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let guard = Mounted(root.clone());
        let (status, body) = health_says(&http, &node, "degraded");
        assert_eq!(status, 200, "the other mountpath still serves: {body}");
        assert!(
            body.contains(&root.display().to_string()) && body.contains("mounted over"),
            "{body}"
        );
        assert_eq!(
            get("/v1/b/train-000000.tar"),
            503,
            "not a 404 its replica would not be asked for"
        );
        assert_eq!(
            get("/v1/b?prefix="),
            503,
            "a listing without its objects would be wrong"
        );
        assert_eq!(put(), 503);
        let metrics = text(&http, &node.url("/metrics"));
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sluice_storage_mountpath_healthy")
                    && l.contains(&root.display().to_string())
                    && l.ends_with(" 0")),
            "{metrics}"
        );
        drop(guard);
        health_says(&http, &node, "\"ok\"");
        assert_eq!(get("/v1/b/train-000000.tar"), 200);
    } else {
        eprintln!("skipping the mount case: mounting a tmpfs needs root");
    }

    // The folder moved away, then every mountpath gone: the node fails /healthz.
    let moved = dir.path().join("moved");
    std::fs::rename(&root, &moved).unwrap();
    let (status, body) = health_says(&http, &node, "degraded");
    assert_eq!(status, 200);
    assert!(body.contains("cannot stat it"), "{body}");
    assert_eq!(admin_health(), (status, body));
    assert_eq!(get("/v1/b/train-000000.tar"), 503);
    std::fs::rename(&spare, dir.path().join("spare-moved")).unwrap();
    let (status, _) = health_says(&http, &node, "failed");
    assert_eq!(status, 503);
    assert_eq!(admin_health().0, 503);
    std::fs::rename(&moved, &root).unwrap();
    std::fs::rename(dir.path().join("spare-moved"), &spare).unwrap();
    health_says(&http, &node, "\"ok\"");
    assert_eq!(get("/v1/b/train-000000.tar"), 200);
    assert_eq!(put(), 201);
}

/// A full disk is an answer the uploader reads, not a reset connection: an object larger
/// than the disk's free space is refused with 507 before a byte is written, one that fills
/// the disk while it is written (no Content-Length, as a stream is sent) gets 507 with the
/// system's reason once the node has read the rest of the body; nothing half-written is
/// left, and the node goes on serving and taking uploads that fit.
#[test]
fn a_full_disk_answers_507_to_the_uploader() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("small");
    std::fs::create_dir_all(&root).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&root)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping: mounting a 1 MiB tmpfs (the full disk) needs root");
        return;
    }
    let _guard = Mounted(root.clone());
    let node = start(config(&root));
    let http = client();
    let put = |key: &str, body: reqwest::blocking::Body| {
        let r = http
            .put(node.url(&format!("/v1/b/{key}")))
            .bearer_auth("secret-token-0123456789")
            .body(body)
            .send()
            .unwrap_or_else(|e| panic!("{key}: the upload saw no answer: {e:?}"));
        (r.status().as_u16(), r.text().unwrap())
    };
    let big = vec![3u8; 64 << 20];
    // As `sluice put` sends a file: a stream of known length.
    let sized = reqwest::blocking::Body::sized(std::io::Cursor::new(big.clone()), big.len() as u64);
    let (status, text) = put("sized.tar", sized);
    assert_eq!(status, 507, "{text}");
    assert!(
        text.contains("67108864 bytes") && text.contains("free"),
        "{text}"
    );
    // Streamed: the disk fills in the middle of the write.
    let (status, text) = put(
        "streamed.tar",
        reqwest::blocking::Body::new(std::io::Cursor::new(big)),
    );
    assert_eq!(status, 507, "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    let left: Vec<_> = std::fs::read_dir(root.join("b"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "half-written objects left: {left:?}");
    let (status, text) = put("fits.tar", vec![1u8; 1000].into());
    assert_eq!(status, 201, "{text}");
    assert_eq!(
        http.get(node.url("/v1/b/fits.tar"))
            .send()
            .unwrap()
            .bytes()
            .unwrap()
            .len(),
        1000
    );
    node.stop();
}
