//! One connection's life on the storage server, over real loopback sockets: pipelined GETs
//! and HEADs on one keep-alive connection (the sendfile path), the hand-off to hyper for an
//! upload mid-connection and for HTTP/1.0, an object many socket buffers long arriving whole,
//! and a client that stops reading being dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

mod common;

use common::start;
use sluice_storage::StorageConfig;

const TOKEN: &str = "secret-token-0123456789";

fn config(root: &Path) -> StorageConfig {
    StorageConfig {
        mountpaths: vec![root.to_path_buf()],
        upload_tokens: vec![TOKEN.into()],
        ..StorageConfig::default()
    }
}

/// Bytes that differ at every offset, so a misplaced range shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

/// Reads one response off a keep-alive connection: status, headers (lower-cased names) and
/// a body of `content-length` bytes (none for a HEAD).
fn response(r: &mut impl BufRead, head_only: bool) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; if head_only { 0 } else { len }];
    r.read_exact(&mut body).unwrap();
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn one_connection_serves_pipelined_requests_then_hands_off_to_hyper() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    std::fs::create_dir_all(root.join("b")).unwrap();
    let object = pattern(300_000);
    std::fs::write(root.join("b/o.bin"), &object).unwrap();
    let node = start(config(&root));

    let stream = TcpStream::connect(node.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    // Four requests in one write: whole, range, HEAD, missing.
    w.write_all(
        b"GET /v1/b/o.bin HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /v1/b/o.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=1000-1999\r\n\r\n\
          HEAD /v1/b/o.bin HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /v1/b/none.bin HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let (status, headers, body) = response(&mut r, false);
    assert_eq!(status, 200);
    assert!(body == object, "the whole object differs");
    assert!(header(&headers, "date").is_some());
    let (status, headers, body) = response(&mut r, false);
    assert_eq!(status, 206);
    assert_eq!(
        header(&headers, "content-range"),
        Some("bytes 1000-1999/300000")
    );
    assert_eq!(body, &object[1000..2000]);
    let (status, headers, _) = response(&mut r, true);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-length"), Some("300000"));
    let (status, _, body) = response(&mut r, false);
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("no such object"));

    // An upload on the same connection goes to hyper, which then serves the rest.
    let upload = pattern(5000);
    write!(
        w,
        "PUT /v1/b/up.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
        upload.len()
    )
    .unwrap();
    w.write_all(&upload).unwrap();
    let (status, _, _) = response(&mut r, false);
    assert_eq!(status, 201);
    w.write_all(b"GET /v1/b/up.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (status, _, body) = response(&mut r, false);
    assert_eq!(status, 200);
    assert_eq!(body, upload);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "the connection closes after Connection: close"
    );

    // HTTP/1.0 is hyper's from the first byte, and gets the same object.
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /v1/b/o.bin HTTP/1.0\r\n\r\n").unwrap();
    let mut r = BufReader::new(s);
    let (status, _, body) = response(&mut r, false);
    assert_eq!(status, 200);
    assert!(body == object);
    node.stop();
}

#[test]
fn a_long_object_arrives_whole_and_a_client_that_stops_reading_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    std::fs::create_dir_all(root.join("b")).unwrap();
    // Many read windows and many socket buffers long.
    let object = pattern(24 << 20);
    std::fs::write(root.join("b/big.bin"), &object).unwrap();
    let mut cfg = config(&root);
    cfg.limits.read_size = 1 << 20;
    cfg.timeouts.idle_secs = 1.0;
    let node = start(cfg);

    let got = reqwest::blocking::Client::new()
        .get(node.url("/v1/b/big.bin"))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    assert!(got.as_ref() == object.as_slice(), "the long object differs");
    let got = reqwest::blocking::Client::new()
        .get(node.url("/v1/b/big.bin"))
        .header("Range", "bytes=5000000-")
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    assert!(
        got.as_ref() == &object[5_000_000..],
        "the long range differs"
    );

    // Ask, then read nothing: once the socket buffers are full and the idle timeout has
    // passed, the server gives up and closes, so less than the whole object ever arrives.
    let mut s = TcpStream::connect(node.addr).unwrap();
    s.write_all(b"GET /v1/b/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut received = Vec::new();
    let _ = s.read_to_end(&mut received);
    assert!(
        received.len() < object.len(),
        "a stalled client got the whole object ({} bytes)",
        received.len()
    );
    // The server is still serving, and no stream is left counted as active.
    let metrics = reqwest::blocking::get(node.url("/metrics"))
        .unwrap()
        .text()
        .unwrap();
    let active: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_storage_active_streams"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(active, 0.0, "{metrics}");
    node.stop();
}
