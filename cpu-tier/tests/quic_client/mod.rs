//! A `sluice cpu` server in this process and a QUIC client that speaks to it with hand-made
//! frames, for the server's integration tests.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use sluice_cpu::config::CpuConfig;
use sluice_cpu::server::{self, Setup};
use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::{ErrorCode, Hello, JobSpec, Limits, Message};
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "server-test-token";

pub struct Running {
    pub addr: std::net::SocketAddr,
    pub client: quinn::ClientConfig,
    /// The worker's certificate, for clients of other settings.
    pub cert: rustls::pki_types::CertificateDer<'static>,
    pub stop: CancellationToken,
    _dir: tempfile::TempDir,
}

pub async fn start() -> Running {
    start_with(|_| {}).await
}

pub async fn start_with(tune: impl FnOnce(&mut CpuConfig)) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CpuConfig {
        state_dir: dir.path().to_path_buf(),
        threads: 1,
        ..CpuConfig::default()
    };
    tune(&mut config);
    config.listen = ([127, 0, 0, 1], 0).into();
    config.same_host.enabled = false;
    let socket = std::net::UdpSocket::bind(config.listen).unwrap();
    let addr = socket.local_addr().unwrap();
    // The blocking HTTP client behind the shard source must not be made on a runtime thread.
    let runtime = tokio::runtime::Handle::current();
    let setup = tokio::task::spawn_blocking(move || {
        Setup::from_config(config, Some(TOKEN.into()), addr.port(), &runtime).unwrap()
    })
    .await
    .unwrap();
    let cert = setup.identity.certs[0].clone();
    let client = client_config(&cert, sluice_wire::message::ALPN);
    let stop = CancellationToken::new();
    tokio::spawn(server::run(socket, None, setup, stop.clone()));
    Running {
        addr,
        client,
        cert,
        stop,
        _dir: dir,
    }
}

/// A QUIC client that trusts `cert` and offers protocol version `alpn`.
pub fn client_config(
    cert: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[u8],
) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ))
}

pub type Conn = (
    quinn::Connection,
    FrameWriter<quinn::SendStream>,
    FrameReader<quinn::RecvStream>,
);

pub async fn connect(r: &Running) -> Conn {
    connect_to(r.addr, r.client.clone()).await
}

pub async fn connect_to(addr: std::net::SocketAddr, client: quinn::ClientConfig) -> Conn {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(client);
    connect_from(&endpoint, addr).await
}

/// A connection from `endpoint` (with its default client config) and its stream.
pub async fn connect_from(endpoint: &quinn::Endpoint, addr: std::net::SocketAddr) -> Conn {
    let conn = endpoint.connect(addr, "localhost").unwrap().await.unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    (
        conn,
        FrameWriter::new(send, Limits::default()),
        FrameReader::new(recv, Limits::default()),
    )
}

pub async fn hello(c: &mut Conn) {
    let hello = Message::Hello(Hello {
        token: TOKEN.into(),
        client: "test".into(),
    });
    c.1.send(&hello, &[]).await.unwrap();
    match next(c).await {
        Some(Message::Welcome(w)) => assert_eq!(w.threads, 1),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

pub async fn next(c: &mut Conn) -> Option<Message> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), c.2.next()).await {
            Ok(Ok(Some(Message::Heartbeat { .. }))) => continue,
            Ok(Ok(m)) => return m,
            Ok(Err(_)) => return None,
            Err(_) => panic!("no answer from the server"),
        }
    }
}

/// Expects an error frame of `code` whose message contains `needle`, then a closed stream.
pub async fn expect_error(c: &mut Conn, code: ErrorCode, needle: &str) {
    match next(c).await {
        Some(Message::Error(e)) => {
            assert_eq!(e.code, code, "{e}");
            assert!(
                e.message.contains(needle),
                "{:?} lacks {needle:?}",
                e.message
            );
        }
        other => panic!("expected an error about {needle:?}, got {other:?}"),
    }
    assert!(
        next(c).await.is_none(),
        "the connection closes after an error"
    );
}

pub async fn raw(c: &mut Conn, bytes: &[u8]) {
    c.1.get_mut().write_all(bytes).await.unwrap();
}

pub fn job(pipeline: &str) -> Message {
    job_n(1, pipeline)
}

pub fn job_n(job: u64, pipeline: &str) -> Message {
    Message::OpenJob(JobSpec {
        job,
        dataset: "test".into(),
        pipeline: pipeline.into(),
        seed: 0,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: 4,
        fail_on_bad_sample: false,
        fields: sluice_wire::FieldSelection::None,
        // These shards carry images only.
        label: sluice_wire::LabelSource::None,
        max_field_bytes: 1 << 20,
        name: format!("job {job}"),
        weight: 1,
        share: true,
    })
}

/// A shard of `n` small JPEG samples, as an assignment of all of it.
pub fn shard(dir: &std::path::Path, n: u64, job: u64) -> sluice_wire::Assign {
    let mut w = sluice_shard::ShardWriter::new(sluice_shard::WriterConfig::new(format!(
        "{}/s-%02d.tar",
        dir.display()
    )))
    .unwrap();
    for i in 0..n {
        let mut jpeg = Vec::new();
        let img = image::RgbImage::from_fn(40, 30, |x, y| {
            image::Rgb([x as u8 * 6, y as u8 * 8, i as u8])
        });
        image::codecs::jpeg::JpegEncoder::new(&mut jpeg)
            .encode_image(&img)
            .unwrap();
        w.write(&format!("k{i:03}"), &[("jpg", &jpeg)]).unwrap();
    }
    let s = w.finish().unwrap().remove(0);
    sluice_wire::Assign {
        job,
        unit: 0,
        attempt: 0,
        shard: sluice_wire::ShardRef {
            index: 0,
            urls: vec![s.path.display().to_string()],
            size: s.info.size,
            samples: s.info.samples,
            checksum: s.info.checksum.0,
            gzip: false,
        },
        start: 0,
        end: n,
    }
}
