//! The client session's rules, frame by frame, on a made-up clock. (The paired simulation
//! drives it against real worker sessions over thousands of seeds.)

use std::time::{Duration, Instant};

use sluice_wire::{
    Assign, ErrorCode, ErrorMessage, Hello, JobSpec, Message, SampleHeader, SampleShape, ShardRef,
    Welcome,
};

use super::*;

const SHAPE: SampleShape = SampleShape::image_u8(2, 2, 3);

fn settings(transport: Transport) -> Settings {
    Settings {
        worker: "cpu-0:7100".into(),
        hello: Hello {
            token: "t".into(),
            client: "test".into(),
        },
        job: JobSpec {
            job: 7,
            ..JobSpec::default()
        },
        transport,
        heartbeat: Duration::from_secs(1),
        silence: Duration::from_secs(10),
        handshake: Duration::from_secs(5),
    }
}

fn sent(s: &mut Session) -> Vec<&'static str> {
    std::iter::from_fn(|| s.poll_transmit())
        .map(|m| m.kind())
        .collect()
}

/// A session past its handshake, at `t0`.
fn running(transport: Transport, t0: Instant) -> Session {
    let mut s = Session::new(settings(transport), 1, t0);
    s.handle(Message::Welcome(Welcome::default()), t0);
    let opened = s.handle(
        Message::JobOpened {
            job: 7,
            shape: SHAPE,
            weight: 1,
        },
        t0,
    );
    if transport == Transport::SameHost {
        assert!(matches!(opened, Received::Attach(SHAPE)));
        s.attach_sent(true, t0);
        assert!(matches!(
            s.handle(Message::ShmAttached { job: 7 }, t0),
            Received::Ready { .. }
        ));
    }
    sent(&mut s);
    s
}

fn header(job: u64, tensor_bytes: u64) -> SampleHeader {
    SampleHeader {
        job,
        unit: 1,
        attempt: 0,
        shard: 0,
        index: 0,
        key: "s0".into(),
        label: None,
        tensor_bytes,
        fields: Vec::new(),
        geometry: Default::default(),
        has: Vec::new(),
    }
}

fn fatal(s: &mut Session) -> String {
    match s.take_end() {
        Some(Ended::Fatal(e)) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_handshake_goes_in_order_and_each_answer_has_its_time() {
    let t0 = Instant::now();
    let mut s = Session::new(settings(Transport::Frames), 1, t0);
    assert_eq!(sent(&mut s), ["Hello"]);
    // A heartbeat is no answer; OpenJob waits for Welcome.
    s.handle(Message::Heartbeat { seq: 1 }, t0);
    assert!(sent(&mut s).is_empty());
    let welcome = Welcome {
        caches: true,
        ..Welcome::default()
    };
    assert!(matches!(
        s.handle(Message::Welcome(welcome), t0),
        Received::Nothing
    ));
    assert_eq!(sent(&mut s), ["OpenJob"]);
    let t1 = t0 + Duration::from_secs(4);
    let got = s.handle(
        Message::JobOpened {
            job: 7,
            shape: SHAPE,
            weight: 1,
        },
        t1,
    );
    assert!(matches!(
        got,
        Received::Ready {
            shape: SHAPE,
            caches: true
        }
    ));

    let mut late = Session::new(settings(Transport::Frames), 2, t0);
    late.handle_timeout(t0 + Duration::from_secs(4));
    assert!(late.take_end().is_none());
    assert_eq!(late.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    late.handle_timeout(t0 + Duration::from_secs(5));
    assert!(matches!(late.take_end(), Some(Ended::Lost(e)) if e.starts_with("no answer in")));

    let mut wrong = Session::new(settings(Transport::Frames), 3, t0);
    wrong.handle(
        Message::JobOpened {
            job: 7,
            shape: SHAPE,
            weight: 1,
        },
        t0,
    );
    assert!(fatal(&mut wrong).contains("expected Welcome, got JobOpened"));
}

#[test]
fn refusals_end_for_good_and_a_busy_worker_is_tried_again() {
    let t0 = Instant::now();
    let refuse = |code| {
        let mut s = Session::new(settings(Transport::Frames), 1, t0);
        let e = ErrorMessage {
            code,
            message: "no".into(),
        };
        s.handle(Message::Error(e), t0);
        s.take_end()
    };
    assert!(matches!(
        refuse(ErrorCode::Unauthorized),
        Some(Ended::Fatal(_))
    ));
    assert!(matches!(
        refuse(ErrorCode::BadRequest),
        Some(Ended::Fatal(_))
    ));
    assert!(matches!(
        refuse(ErrorCode::Unavailable),
        Some(Ended::Lost(_))
    ));
    assert!(matches!(refuse(ErrorCode::Internal), Some(Ended::Lost(_))));
    assert!(matches!(
        closed_by_worker("w", 3, "worker is draining".into()),
        Ended::Left(_)
    ));
    assert!(matches!(
        closed_by_worker("w", 1, "token".into()),
        Ended::Fatal(_)
    ));
    assert!(matches!(
        closed_by_worker("w", 0, "bye".into()),
        Ended::Lost(_)
    ));
}

#[test]
fn heartbeats_go_out_and_silence_ends_the_connection_but_a_waiting_reader_is_not_silence() {
    let t0 = Instant::now();
    let mut s = running(Transport::Frames, t0);
    let sec = |n: u64| t0 + Duration::from_secs(n);
    assert_eq!(s.poll_timeout(), Some(sec(1)));
    s.handle_timeout(sec(1));
    assert_eq!(sent(&mut s), ["Heartbeat"]);
    // The reader waits for the coordinator for a long time: no silence.
    s.waiting(true, sec(2));
    for n in 3..30 {
        s.handle_timeout(sec(n));
    }
    assert!(s.take_end().is_none());
    s.waiting(false, sec(30));
    s.handle(Message::Heartbeat { seq: 9 }, sec(35));
    s.handle_timeout(sec(45));
    assert!(s.take_end().is_none());
    s.handle_timeout(sec(46));
    assert!(matches!(s.take_end(), Some(Ended::Lost(e)) if e.contains("no frame from the worker")));
    // Nothing more comes out of an ended session.
    assert!(s.poll_timeout().is_none());
}

#[test]
fn a_drained_worker_is_declared_lost_after_three_heartbeats() {
    let t0 = Instant::now();
    let mut s = running(Transport::Frames, t0);
    assert!(matches!(s.command(Command::Drain), Commanded::Nothing));
    s.handle_timeout(t0 + Duration::from_secs(3));
    assert!(s.take_end().is_none());
    s.handle_timeout(t0 + Duration::from_millis(3001));
    assert!(matches!(s.take_end(), Some(Ended::Lost(_))));
}

#[test]
fn commands_for_an_earlier_connection_are_void_and_credits_follow_the_transport() {
    let t0 = Instant::now();
    let assign = |g| {
        let a = Assign {
            job: 7,
            unit: 1,
            attempt: 0,
            shard: ShardRef {
                index: 0,
                urls: Vec::new(),
                size: 0,
                samples: 20,
                checksum: 0,
                gzip: false,
            },
            start: 10,
            end: 14,
        };
        Command::Assign(g, a)
    };
    let mut quic = running(Transport::Frames, t0);
    quic.command(assign(0));
    quic.command(Command::Credit(0, 5));
    assert!(sent(&mut quic).is_empty());
    quic.command(assign(1));
    quic.command(Command::Credit(1, 5));
    assert_eq!(sent(&mut quic), ["Assign", "Credit"]);

    let mut shm = running(Transport::SameHost, t0);
    assert!(matches!(
        shm.command(assign(1)),
        Commanded::Assigned {
            unit: 1,
            attempt: 0,
            samples: 4
        }
    ));
    assert!(matches!(
        shm.command(Command::Credit(1, 5)),
        Commanded::Grant(5)
    ));
    assert_eq!(sent(&mut shm), ["Assign"]);
    shm.slots(vec![0, 1, 2]);
    assert_eq!(sent(&mut shm), ["SlotCredit"]);
}

#[test]
fn frame_headers_are_checked_against_the_transport_job_and_shape() {
    let t0 = Instant::now();
    let bytes = SHAPE.bytes();
    let mut s = running(Transport::Frames, t0);
    assert!(matches!(
        s.handle(Message::Sample(header(7, bytes)), t0),
        Received::Sample {
            at: TensorAt::Stream,
            ..
        }
    ));
    // A late frame of another job is passed over; a wrong size is not.
    assert!(matches!(
        s.handle(Message::Sample(header(6, bytes)), t0),
        Received::SkipPayload
    ));
    s.handle(Message::Sample(header(7, bytes + 1)), t0);
    assert!(fatal(&mut s).contains("tensor bytes"));

    let mut s = running(Transport::Frames, t0);
    s.handle(slot_sample(header(7, bytes)), t0);
    assert!(fatal(&mut s).contains("shared-memory sample over QUIC"));

    let mut s = running(Transport::SameHost, t0);
    s.handle(Message::Sample(header(7, bytes)), t0);
    assert!(fatal(&mut s).contains("in the frame over the same-host socket"));

    let mut s = running(Transport::SameHost, t0);
    let placed = Message::ShmPlaced {
        place: 2,
        header: header(7, bytes),
    };
    assert!(matches!(
        s.handle(placed, t0),
        Received::Sample {
            at: TensorAt::Placed { place: 2 },
            ..
        }
    ));
    s.handle(slot_sample(header(6, bytes)), t0);
    assert!(fatal(&mut s).contains("of job 6"));

    let mut s = running(Transport::Frames, t0);
    s.handle(Message::OpenJob(JobSpec::default()), t0);
    assert!(fatal(&mut s).contains("a worker does not send OpenJob"));

    let h = SampleHeader {
        fields: vec![("cls".into(), 3)],
        ..header(7, bytes)
    };
    assert!(Session::check_fields(&h, 3).is_ok());
    assert!(matches!(Session::check_fields(&h, 4), Err(Ended::Lost(_))));
}

#[test]
fn an_epoch_that_ends_with_places_owned_cancels_and_waits_for_the_release() {
    let t0 = Instant::now();
    let mut s = running(Transport::SameHost, t0);
    s.close(true, t0);
    assert_eq!(sent(&mut s), ["Cancel"]);
    assert!(s.take_end().is_none());
    // Commands after the end are void; answers still settle places.
    assert!(matches!(
        s.command(Command::Credit(1, 4)),
        Commanded::Nothing
    ));
    assert!(matches!(
        s.handle(Message::ShmReleased { job: 7 }, t0),
        Received::Released
    ));
    assert!(matches!(s.take_end(), Some(Ended::Cancelled)));

    // A worker that does not answer is waited for a bounded time.
    let mut s = running(Transport::SameHost, t0);
    s.close(true, t0);
    s.handle_timeout(t0 + RELEASE_WAIT);
    assert!(matches!(s.take_end(), Some(Ended::Cancelled)));

    // Nothing owned, or no arena: the connection ends at once.
    let mut s = running(Transport::SameHost, t0);
    s.close(false, t0);
    assert!(sent(&mut s).is_empty());
    assert!(matches!(s.take_end(), Some(Ended::Cancelled)));
}

#[test]
fn redialing_backs_off_to_two_seconds_and_stops_at_a_refusal() {
    let mut r = Redial::default();
    assert_eq!(r.dial(), 1);
    let waits: Vec<_> = (0..6)
        .map(|_| r.ended(Ended::Lost("x".into())).and_then(|l| l.retry_in))
        .collect();
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(
        waits,
        [ms(100), ms(200), ms(400), ms(800), ms(1600), ms(2000)]
    );
    let left = r.ended(Ended::Left("draining".into())).map(|l| l.tone);
    assert_eq!(left, Some(Tone::Left));
    let not_back = r
        .ended(Ended::Lost("connect: refused".into()))
        .map(|l| l.tone);
    assert_eq!(not_back, Some(Tone::NotBack));
    let refused = ClientError::Refused {
        worker: "w".into(),
        message: "token".into(),
    };
    let fatal = r.ended(Ended::Fatal(refused)).expect("reported");
    assert!(fatal.fatal.is_some() && fatal.retry_in.is_none());
    assert!(r.ended(Ended::Cancelled).is_none());
}

#[test]
fn a_worker_that_never_answered_is_told_apart_from_one_lost() {
    let mut r = Redial::default();
    let tone = |r: &mut Redial| {
        r.ended(Ended::Lost("no answer in 5s".into()))
            .map(|l| l.tone)
    };
    assert_eq!(tone(&mut r), Some(Tone::NeverAnswered));
    assert_eq!(tone(&mut r), Some(Tone::NeverAnswered));
    r.answered();
    assert_eq!(tone(&mut r), Some(Tone::Lost));
    assert_eq!(tone(&mut r), Some(Tone::Lost));
}

#[test]
fn credits_and_so_same_host_slots_follow_the_receive_window() {
    assert_eq!(credit_window(128, 64 << 20, 150_528), 128);
    assert_eq!(credit_window(128, 1 << 20, 150_528), 6);
    assert_eq!(credit_window(128, 10, 150_528), 1);
}

#[test]
fn the_weight_a_job_runs_at_is_kept_and_a_cap_is_told() {
    let t0 = Instant::now();
    let mut asked = settings(Transport::Frames);
    asked.job.weight = 16;
    for (given, capped) in [(16, None), (2, Some((16, 2)))] {
        let mut s = Session::new(asked.clone(), 1, t0);
        s.handle(Message::Welcome(Welcome::default()), t0);
        let opened = Message::JobOpened {
            job: asked.job.job,
            shape: SHAPE,
            weight: given,
        };
        s.handle(opened, t0);
        assert_eq!(s.capped(), capped);
    }
}

#[test]
fn a_connection_sharing_the_batch_arena_grants_few_slots_at_once() {
    assert_eq!(super::slot_bound(false, 100), 100);
    assert_eq!(super::slot_bound(true, 100), 32);
    assert_eq!(super::slot_bound(true, 8), 8, "never past the window");
}

/// A sample in slot 0.
fn slot_sample(header: SampleHeader) -> Message {
    Message::ShmSample { slot: 0, header }
}
