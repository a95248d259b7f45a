//! The `sluice cpu` server in-process, spoken to over real QUIC with hand-made frames: every
//! malformed or out-of-turn frame closes that connection with an error that says why, and
//! the daemon goes on serving the next client.

use std::sync::Arc;
use std::time::Duration;

use sluice_cpu::config::CpuConfig;
use sluice_cpu::server::{self, Setup};
use sluice_cpu::{CpuWorker, EngineConfig, ShardSource, SourceConfig};
use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::{encode_frame, ErrorCode, Hello, JobSpec, Limits, Message};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "server-test-token";

struct Running {
    addr: std::net::SocketAddr,
    client: quinn::ClientConfig,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let config = CpuConfig {
        state_dir: dir.path().to_path_buf(),
        threads: 1,
        ..CpuConfig::default()
    };
    let identity = sluice_cpu::tls::self_signed(dir.path(), &["localhost".into()]).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.certs[0].clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![sluice_wire::message::ALPN.to_vec()];
    let client = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    // The blocking HTTP client behind the shard source must not be made on a runtime thread.
    let worker = tokio::task::spawn_blocking(|| {
        CpuWorker::new(
            EngineConfig {
                threads: 1,
                ..Default::default()
            },
            ShardSource::new(SourceConfig::default()).unwrap(),
        )
        .unwrap()
    })
    .await
    .unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let stop = CancellationToken::new();
    let setup = Setup {
        config,
        identity,
        token: Some(TOKEN.into()),
        runner: Arc::new(worker),
    };
    tokio::spawn(server::run(socket, None, setup, stop.clone()));
    Running {
        addr,
        client,
        stop,
        _dir: dir,
    }
}

type Conn = (
    quinn::Connection,
    FrameWriter<quinn::SendStream>,
    FrameReader<quinn::RecvStream>,
);

async fn connect(r: &Running) -> Conn {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(r.client.clone());
    let conn = endpoint
        .connect(r.addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    (
        conn,
        FrameWriter::new(send, Limits::default()),
        FrameReader::new(recv, Limits::default()),
    )
}

async fn hello(c: &mut Conn) {
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

async fn next(c: &mut Conn) -> Option<Message> {
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
async fn expect_error(c: &mut Conn, code: ErrorCode, needle: &str) {
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

async fn raw(c: &mut Conn, bytes: &[u8]) {
    c.1.get_mut().write_all(bytes).await.unwrap();
}

fn job(pipeline: &str) -> Message {
    Message::OpenJob(JobSpec {
        job: 1,
        dataset: "test".into(),
        pipeline: pipeline.into(),
        seed: 0,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: 4,
        fail_on_bad_sample: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_one_connection_and_the_server_goes_on() {
    let r = start().await;

    // Garbage where a frame should be.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    raw(&mut c, b"GET / HTTP/1.1\r\n\r\n").await;
    expect_error(&mut c, ErrorCode::BadRequest, "not a Sluice frame").await;

    // A frame of a protocol version this build does not speak.
    let mut c = connect(&r).await;
    let mut frame = Vec::new();
    encode_frame(
        &Message::Heartbeat { seq: 1 },
        &[],
        &Limits::default(),
        &mut frame,
    )
    .unwrap();
    frame[3] = 9;
    raw(&mut c, &frame).await;
    expect_error(
        &mut c,
        ErrorCode::BadRequest,
        "unsupported protocol version 9",
    )
    .await;

    // A header longer than the server accepts: refused before anything is allocated.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    let mut frame = Vec::new();
    encode_frame(
        &Message::Heartbeat { seq: 1 },
        &[],
        &Limits::default(),
        &mut frame,
    )
    .unwrap();
    frame[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    raw(&mut c, &frame).await;
    expect_error(&mut c, ErrorCode::BadRequest, "exceeds the limit").await;

    // Anything before Hello, and no token.
    let mut c = connect(&r).await;
    c.1.send(&job("decode | center_crop 8"), &[]).await.unwrap();
    expect_error(&mut c, ErrorCode::BadRequest, "expected Hello first").await;
    let mut c = connect(&r).await;
    let anonymous = Message::Hello(Hello {
        token: String::new(),
        client: "x".into(),
    });
    c.1.send(&anonymous, &[]).await.unwrap();
    expect_error(&mut c, ErrorCode::Unauthorized, "no cluster token").await;

    // Out-of-turn and nonsensical requests.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode"), &[]).await.unwrap();
    expect_error(&mut c, ErrorCode::BadRequest, "output size is not fixed").await;
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode | sharpen 3"), &[]).await.unwrap();
    expect_error(&mut c, ErrorCode::BadRequest, "sharpen").await;
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&Message::Credit { job: 5, samples: 1 }, &[])
        .await
        .unwrap();
    c.1.send(
        &Message::Welcome(sluice_wire::Welcome {
            worker: "me".into(),
            threads: 1,
        }),
        &[],
    )
    .await
    .unwrap();
    expect_error(
        &mut c,
        ErrorCode::BadRequest,
        "a client does not send Welcome",
    )
    .await;

    // After all that, a well-behaved client is served.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode | resize 16 | center_crop 8"), &[])
        .await
        .unwrap();
    match next(&mut c).await {
        Some(Message::JobOpened { job: 1, shape }) => assert_eq!(shape.bytes(), 8 * 8 * 3),
        other => panic!("expected JobOpened, got {other:?}"),
    }
    r.stop.cancel();
}
