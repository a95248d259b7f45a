//! The QUIC shell against quinn, as the workers run it, on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn_proto::{ConnectionError, TransportConfig};
use tokio::io::AsyncWriteExt;

use super::Endpoint;

/// A quinn server on loopback with a certificate for `localhost`, and the file that trusts it.
fn server() -> (quinn::Endpoint, tempfile::NamedTempFile) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    let cert = rustls::pki_types::CertificateDer::from(made.cert.der().to_vec());
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(made.key_pair.serialize_der());
    let provider = sluice_tls::provider().expect("TLS provider");
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key.into())
        .expect("server certificate");
    tls.alpn_protocols = vec![sluice_wire::message::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
    let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let endpoint = quinn::Endpoint::server(config, SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("server endpoint");
    let trust = tempfile::NamedTempFile::new().expect("trust file");
    std::fs::write(trust.path(), made.cert.pem()).expect("writing the trust file");
    (endpoint, trust)
}

fn client(
    trust: &tempfile::NamedTempFile,
    idle: Duration,
) -> (Endpoint, quinn_proto::ClientConfig) {
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(Some(idle.try_into().expect("idle timeout")));
    let config = crate::tls::client_config(trust.path(), transport).expect("client config");
    let socket = std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    let endpoint = Endpoint::new(quinn_proto::EndpointConfig::default(), socket).expect("endpoint");
    (endpoint, config)
}

/// Waits (up to 10 s) until the connection says why it ended.
async fn ended(conn: &super::Connection) -> ConnectionError {
    for _ in 0..1000 {
        if let Some(e) = conn.close_reason() {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the connection did not end in 10 s");
}

/// The worker's side of a connection: its first stream, once the client opens it.
async fn accepted(
    server: &quinn::Endpoint,
) -> (quinn::Connection, quinn::SendStream, quinn::RecvStream) {
    let incoming = server.accept().await.expect("incoming");
    let conn = incoming.await.expect("handshake");
    let (send, recv) = conn.accept_bi().await.expect("stream");
    (conn, send, recv)
}

async fn dialed(
    endpoint: &Endpoint,
    config: quinn_proto::ClientConfig,
    addr: SocketAddr,
) -> super::Connection {
    let connecting = endpoint
        .connect_with(config, addr, "localhost")
        .expect("connect");
    connecting.await.expect("handshake")
}

fn pattern(i: usize) -> u8 {
    (i * 31 % 251) as u8
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_carries_megabytes_in_order_and_the_worker_s_close_reason_arrives() {
    const BYTES: usize = 24 << 20;
    let (server, trust) = server();
    let addr = server.local_addr().expect("address");
    let serving = tokio::spawn(async move {
        let (conn, mut send, mut recv) = accepted(&server).await;
        let mut hello = [0u8; 5];
        recv.read_exact(&mut hello).await.expect("hello");
        let data: Vec<u8> = (0..BYTES).map(pattern).collect();
        send.write_all(&data).await.expect("write");
        send.finish().expect("finish");
        // The client says it has read it all, then the worker closes.
        let done = recv.read_to_end(64).await.expect("done");
        assert_eq!(done, b"!");
        conn.close(7u32.into(), b"bye");
        server.wait_idle().await;
        hello
    });
    let (endpoint, config) = client(&trust, Duration::from_secs(10));
    let conn = dialed(&endpoint, config, addr).await;
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    send.write_all(b"hello").await.expect("write");
    let mut at = 0;
    let mut chunks = 0;
    while let Some(chunk) = recv.read_chunk(1 << 20).await.expect("read") {
        assert_eq!(chunk.offset as usize, at, "chunks in order");
        for (i, b) in chunk.bytes.iter().enumerate() {
            assert_eq!(*b, pattern(at + i), "byte {}", at + i);
        }
        at += chunk.bytes.len();
        chunks += 1;
    }
    assert_eq!(at, BYTES);
    assert!(
        chunks > BYTES / 65536,
        "{chunks} chunks: packets, not one copy"
    );
    send.write_all(b"!").await.expect("write");
    send.shutdown().await.expect("finish");
    match ended(&conn).await {
        ConnectionError::ApplicationClosed(c) => {
            assert_eq!(u64::from(c.error_code), 7);
            assert_eq!(&c.reason[..], b"bye");
        }
        e => panic!("ended with {e}"),
    }
    assert_eq!(&serving.await.expect("server"), b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_times_the_handshake_out() {
    let (_server, trust) = server();
    let silent = std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    let (endpoint, config) = client(&trust, Duration::from_millis(300));
    let connecting = endpoint
        .connect_with(config, silent.local_addr().expect("address"), "localhost")
        .expect("connect");
    let result = tokio::time::timeout(Duration::from_secs(10), connecting).await;
    match result {
        Ok(Err(ConnectionError::TimedOut)) => {}
        Ok(Err(e)) => panic!("ended with {e}"),
        Ok(Ok(_)) => panic!("a silent socket completed a handshake"),
        Err(_) => panic!("no answer from the idle timeout in 10 s"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_the_connection_for_the_worker() {
    let (server, trust) = server();
    let addr = server.local_addr().expect("address");
    let serving = tokio::spawn(async move {
        let (conn, _send, mut recv) = accepted(&server).await;
        let mut byte = [0u8; 1];
        recv.read_exact(&mut byte).await.expect("a byte");
        tokio::time::timeout(Duration::from_secs(10), conn.closed())
            .await
            .expect("closed in 10 s")
    });
    let (endpoint, config) = client(&trust, Duration::from_secs(10));
    let conn = dialed(&endpoint, config, addr).await;
    let (mut send, recv) = conn.open_bi().await.expect("stream");
    send.write_all(b"x").await.expect("write");
    // Let the byte leave before the close does.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop((send, recv, conn));
    match serving.await.expect("server") {
        quinn::ConnectionError::ApplicationClosed(c) => assert_eq!(u64::from(c.error_code), 0),
        e => panic!("the worker saw {e}"),
    }
    drop(endpoint);
}
