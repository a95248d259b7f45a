//! The `sluice cpu` server in-process, spoken to over real QUIC with hand-made frames: every
//! malformed or out-of-turn frame closes that connection with an error that says why, and
//! the daemon goes on serving the next client.

use std::sync::Arc;
use std::time::Duration;

use sluice_wire::ErrorCode::{BadRequest, Unauthorized};
use sluice_wire::{encode_frame, Hello, Limits, Message};

mod quic_client;

use quic_client::*;

/// A heartbeat (`seq` 1) as a whole frame, to be spoiled byte by byte.
fn heartbeat_frame() -> Vec<u8> {
    let mut frame = Vec::new();
    let heartbeat = Message::Heartbeat { seq: 1 };
    encode_frame(&heartbeat, &[], &Limits::default(), &mut frame).unwrap();
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_one_connection_and_the_server_goes_on() {
    let r = start().await;

    // Garbage where a frame should be.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    raw(&mut c, b"GET / HTTP/1.1\r\n\r\n").await;
    expect_error(&mut c, BadRequest, "not a Sluice frame").await;

    // A frame of a protocol version this build does not speak.
    let mut c = connect(&r).await;
    let mut frame = heartbeat_frame();
    frame[3] = sluice_wire::VERSION + 1;
    raw(&mut c, &frame).await;
    let wrong = format!("unsupported protocol version {}", sluice_wire::VERSION + 1);
    expect_error(&mut c, BadRequest, &wrong).await;

    // A header longer than the server accepts: refused before anything is allocated.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    let mut frame = heartbeat_frame();
    frame[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    raw(&mut c, &frame).await;
    expect_error(&mut c, BadRequest, "exceeds the limit").await;

    // Anything before Hello, and no token.
    let mut c = connect(&r).await;
    c.1.send(&job("decode | center_crop 8"), &[]).await.unwrap();
    expect_error(&mut c, BadRequest, "expected Hello first").await;
    let mut c = connect(&r).await;
    let anonymous = Message::Hello(Hello {
        token: String::new(),
        client: "x".into(),
    });
    c.1.send(&anonymous, &[]).await.unwrap();
    expect_error(&mut c, Unauthorized, "no cluster token").await;

    // Out-of-turn and nonsensical requests.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode"), &[]).await.unwrap();
    expect_error(&mut c, BadRequest, "output size is not fixed").await;
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode | sharpen 3"), &[]).await.unwrap();
    expect_error(&mut c, BadRequest, "sharpen").await;
    // A tensor no frame can carry (805 MB, over 256 MiB) is refused when the job opens, not
    // sent until the transport refuses it and the client reconnects forever.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode | resize 16384x16384"), &[])
        .await
        .unwrap();
    expect_error(&mut c, BadRequest, "over the largest frame").await;
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&Message::Credit { job: 5, samples: 1 }, &[])
        .await
        .unwrap();
    c.1.send(
        &Message::Welcome(sluice_wire::Welcome {
            worker: "me".into(),
            threads: 1,
            caches: false,
        }),
        &[],
    )
    .await
    .unwrap();
    expect_error(&mut c, BadRequest, "a client does not send Welcome").await;

    // After all that, a well-behaved client is served.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job("decode | resize 16 | center_crop 8"), &[])
        .await
        .unwrap();
    match next(&mut c).await {
        Some(Message::JobOpened { job: 1, shape, .. }) => assert_eq!(shape.bytes(), 8 * 8 * 3),
        other => panic!("expected JobOpened, got {other:?}"),
    }
    r.stop.cancel();
}

/// A client that vanishes (no close, no more packets) while its unit waits for credits: the
/// worker notices its silence, cancels the job and frees the only unit slot for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_client_frees_what_it_held() {
    let r = start_with(|c| {
        c.limits.max_active_units = 1;
        c.timeouts.heartbeat_secs = 0.2;
        c.timeouts.client_silence_secs = 3.0;
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let assign = shard(dir.path(), 4, 1);
    let (addr, client, first) = (r.addr, r.client.clone(), assign.clone());
    // The vanishing client lives on its own runtime, shut down without a goodbye.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut c = connect_to(addr, client).await;
            hello(&mut c).await;
            c.1.send(&job("decode | center_crop 16"), &[])
                .await
                .unwrap();
            assert!(matches!(
                next(&mut c).await,
                Some(Message::JobOpened { .. })
            ));
            c.1.send(&Message::Assign(first), &[]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            std::mem::forget(c);
        });
        rt.shutdown_background();
    })
    .join()
    .unwrap();
    // The second client's unit can only run once the first one's slot is free.
    let mut c = connect(&r).await;
    hello(&mut c).await;
    c.1.send(&job_n(2, "decode | center_crop 16"), &[])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut c).await,
        Some(Message::JobOpened { job: 2, .. })
    ));
    let mut second = assign;
    second.job = 2;
    c.1.send(&Message::Assign(second), &[]).await.unwrap();
    c.1.send(&Message::Credit { job: 2, samples: 4 }, &[])
        .await
        .unwrap();
    assert_eq!(finish_unit(&mut c, 2, 4).await, 4, "the slot was freed");
    r.stop.cancel();
}

/// A job whose consumer reads nothing (a paused trainer, the next epoch opened early) holds no
/// unit slot while its unit waits for credit: another job on the same worker runs meanwhile,
/// and the waiting unit finishes once its credits come. With the slot held, the second job
/// waited for good (a same-host epoch stopped at its last unit that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_out_of_credit_leaves_the_slots_to_the_others() {
    let r = start_with(|c| c.limits.max_active_units = 1).await;
    let dir = tempfile::tempdir().unwrap();
    let first = shard(dir.path(), 4, 1);
    let mut idle = connect(&r).await;
    hello(&mut idle).await;
    idle.1
        .send(&job("decode | center_crop 16"), &[])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut idle).await,
        Some(Message::JobOpened { job: 1, .. })
    ));
    idle.1
        .send(&Message::Assign(first.clone()), &[])
        .await
        .unwrap();
    idle.1
        .send(&Message::Credit { job: 1, samples: 1 }, &[])
        .await
        .unwrap();
    assert!(matches!(next(&mut idle).await, Some(Message::Sample(_))));

    // The only slot's unit now waits for credit; the other job's unit runs all the same.
    let mut busy = connect(&r).await;
    hello(&mut busy).await;
    busy.1
        .send(&job_n(2, "decode | center_crop 16"), &[])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut busy).await,
        Some(Message::JobOpened { job: 2, .. })
    ));
    let mut second = first;
    second.job = 2;
    busy.1.send(&Message::Assign(second), &[]).await.unwrap();
    busy.1
        .send(&Message::Credit { job: 2, samples: 4 }, &[])
        .await
        .unwrap();
    assert_eq!(finish_unit(&mut busy, 2, 4).await, 4);

    // Credit back: the waiting unit takes a slot again and finishes.
    idle.1
        .send(&Message::Credit { job: 1, samples: 3 }, &[])
        .await
        .unwrap();
    assert_eq!(finish_unit(&mut idle, 1, 3).await, 3);
    r.stop.cancel();
}

/// Reads a four-sample `center_crop 16` unit of `job` to its end, within 30 s: how many
/// samples came (at most `credits`).
async fn finish_unit(c: &mut Conn, job: u64, credits: u64) -> u64 {
    let mut samples = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job}: the unit never finished (no slot freed?)"
        );
        match next(c).await {
            Some(Message::Sample(h)) => {
                assert_eq!((h.job, h.tensor_bytes), (job, 16 * 16 * 3));
                samples += 1;
                assert!(samples <= credits, "job {job}: more samples than credits");
            }
            Some(Message::UnitDone(d)) => {
                assert_eq!((d.job, d.sent), (job, 4));
                return samples;
            }
            other => panic!("job {job}: unexpected {other:?}"),
        }
    }
}

/// Tensors leave in the largest packets one GSO send can carry: over loopback the server's
/// path MTU discovery climbs to `MAX_UDP_PAYLOAD` and stays there. A ceiling above what ten
/// packets per GSO send allow loses every full-size batch, and black-hole detection then
/// drops the connection to 1,200-byte packets: this test sees that as small datagrams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_travel_in_the_largest_datagrams_one_gso_send_carries() {
    use sluice_wire::quic::MAX_UDP_PAYLOAD;
    let r = start().await;
    let dir = tempfile::tempdir().unwrap();
    let assign = shard(dir.path(), 48, 1);
    // The client accepts any size, so the server's own ceiling is what is tested.
    let mut config = quinn::EndpointConfig::default();
    config.max_udp_payload_size(65_527).unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // As the loader does: a small buffer's drops would look like a black hole.
    let _capped = sluice_wire::quic::grow_buffer(&socket, sluice_wire::quic::Buffer::Receive);
    let mut endpoint =
        quinn::Endpoint::new(config, None, socket, Arc::new(quinn::TokioRuntime)).unwrap();
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window((64u32 << 20).into());
    transport.receive_window((64u32 << 20).into());
    let mut client = r.client.clone();
    client.transport_config(Arc::new(transport));
    endpoint.set_default_client_config(client);
    let mut c = connect_from(&endpoint, r.addr).await;
    hello(&mut c).await;
    c.1.send(&job("decode | resize 224x224"), &[])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut c).await,
        Some(Message::JobOpened { .. })
    ));
    c.1.send(
        &Message::Credit {
            job: 1,
            samples: 1 << 20,
        },
        &[],
    )
    .await
    .unwrap();
    // The first unit lets discovery finish; a later one must arrive in large datagrams. Up
    // to four chances, so a loaded machine cannot fail the test; the old 65,527 ceiling
    // never gets there.
    let mut averages = Vec::new();
    for unit in 0..5 {
        let mut a = assign.clone();
        a.unit = unit;
        c.1.send(&Message::Assign(a), &[]).await.unwrap();
        let before = c.0.stats().udp_rx;
        loop {
            match next(&mut c).await {
                Some(Message::Sample(h)) => assert_eq!(h.tensor_bytes, 224 * 224 * 3),
                Some(Message::UnitDone(d)) => {
                    assert_eq!(d.sent, 48);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let after = c.0.stats().udp_rx;
        let average = (after.bytes - before.bytes) / (after.datagrams - before.datagrams).max(1);
        averages.push(average);
        if unit > 0 && average > 4_000 {
            break;
        }
    }
    assert!(
        averages[1..].iter().any(|&a| a > 4_000),
        "datagrams of {averages:?} bytes on average per unit, not up to {MAX_UDP_PAYLOAD}"
    );
    r.stop.cancel();
}

/// Log lines written by the process's subscriber, for a test to read.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A client of another protocol version (another TLS ALPN) is refused in the handshake with
/// alert 120, which the client names as a version mismatch ("error 120" is what it reads),
/// and the worker's log names both versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_another_protocol_version_is_named_with_both_versions() {
    let logs = Captured::default();
    let sink = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .try_init();
    let r = start().await;
    let client = client_config(&r.cert, b"sluice/1");
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(client);
    let err = endpoint
        .connect(r.addr, "localhost")
        .unwrap()
        .await
        .expect_err("another protocol version connected");
    assert!(err.to_string().contains("error 120"), "{err}");
    let mut text = String::new();
    for _ in 0..50 {
        text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        if text.contains("sluice/1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        text.contains("offered protocol version sluice/1") && text.contains("speaks sluice/9"),
        "{text}"
    );
    r.stop.cancel();
}
