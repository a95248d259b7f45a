use super::*;
use crate::message::Welcome;
use crate::message::{Hello, ShardRef, UnitDone};
use std::time::Duration;

fn rules() -> Rules {
    Rules {
        max_credits: 100,
        max_units_per_connection: 4,
        max_job_weight: 8,
        ..Rules::new(Some("secret".into()), Welcome::named("w"))
    }
}

fn hello(token: &str) -> Message {
    Message::Hello(Hello {
        token: token.into(),
        client: "test".into(),
    })
}

fn spec(job: u64, name: &str, weight: u32) -> JobSpec {
    JobSpec {
        job,
        dataset: "d".into(),
        name: name.into(),
        weight,
        ..JobSpec::default()
    }
}

fn assign(job: u64, unit: u64) -> Assign {
    Assign {
        job,
        unit,
        attempt: 0,
        shard: ShardRef {
            index: 0,
            urls: vec![],
            size: 0,
            samples: 100,
            checksum: 0,
            gzip: false,
        },
        start: 0,
        end: 10,
    }
}

const SHAPE: SampleShape = SampleShape::image_u8(1, 1, 1);

/// The launch handle the tests register units with: the unit's number.
type W = Worker<u64>;

fn effects(w: &mut W, conn: ConnId) -> Vec<Effect> {
    std::iter::from_fn(|| w.poll_effect(conn)).collect()
}

/// A connection with job `job` open under `name`.
fn open(w: &mut W, job: u64, name: &str, weight: u32, now: Instant) -> ConnId {
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("secret"), now, |_, _| 0);
    w.handle(
        conn,
        Message::OpenJob(spec(job, name, weight)),
        now,
        |_, _| 0,
    );
    assert!(matches!(
        effects(w, conn)[..],
        [Effect::Send(Message::Welcome(_)), Effect::Open(_)]
    ));
    w.opened(conn, &spec(job, name, weight), Ok(SHAPE));
    assert!(matches!(
        effects(w, conn)[..],
        [Effect::Send(Message::JobOpened { .. })]
    ));
    conn
}

fn send(w: &mut W, conn: ConnId, m: Message, now: Instant) {
    let unit = match &m {
        Message::Assign(a) => a.unit,
        _ => 0,
    };
    w.handle(conn, m, now, |_, _| unit);
}

fn closed(w: &mut W, conn: ConnId) -> Option<End> {
    effects(w, conn).into_iter().find_map(|e| match e {
        Effect::Close(end) => Some(end),
        _ => None,
    })
}

/// A one-slot worker with job 1 ("a") open on a connection.
fn one_job() -> (W, ConnId, Instant) {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let a = open(&mut w, 1, "a", 1, now);
    (w, a, now)
}

/// Asserts that `conn` was closed with an error that says `why`.
#[track_caller]
fn assert_closed(w: &mut W, conn: ConnId, why: &str) {
    match closed(w, conn) {
        Some(End::Error(_, m)) => assert!(m.contains(why), "closed with {m:?}, not {why:?}"),
        other => panic!("{other:?}, not closed with {why:?}"),
    }
}

#[test]
fn admission_checks_the_token_the_first_frame_and_the_drain() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let cases = [
        (hello("wrong"), "wrong cluster token"),
        (hello(""), "no cluster token given"),
        (
            Message::Heartbeat { seq: 1 },
            "expected Hello first, got Heartbeat",
        ),
    ];
    for (first, why) in cases {
        let conn = w.connect(Transport::Frames, now);
        w.handle(conn, first, now, |_, _| 0);
        assert_closed(&mut w, conn, why);
    }
    let late = w.connect(Transport::Frames, now);
    w.handle_timeout(late, now + Duration::from_secs(5));
    assert_eq!(
        closed(&mut w, late),
        Some(End::Error(
            ErrorCode::Unavailable,
            "no Hello in time".into()
        ))
    );
    w.drain();
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("secret"), now, |_, _| 0);
    assert!(matches!(
        closed(&mut w, conn),
        Some(End::Error(ErrorCode::Unavailable, _))
    ));
}

#[test]
fn jobs_are_checked_and_their_weight_capped() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("secret"), now, |_, _| 0);
    w.handle(conn, Message::OpenJob(spec(1, "a", 50)), now, |_, _| 0);
    assert_eq!(w.opened(conn, &spec(1, "a", 50), Ok(SHAPE)), Some(8));
    w.handle(conn, Message::OpenJob(spec(1, "a", 1)), now, |_, _| 0);
    assert_closed(&mut w, conn, "already open");
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("secret"), now, |_, _| 0);
    w.handle(conn, Message::OpenJob(spec(2, "", 1)), now, |_, _| 0);
    assert_closed(&mut w, conn, "printable");
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("secret"), now, |_, _| 0);
    w.handle(conn, Message::OpenJob(spec(3, "c", 1)), now, |_, _| 0);
    assert_eq!(
        w.opened(conn, &spec(3, "c", 1), Err("no such pipeline".into())),
        None
    );
    assert_closed(&mut w, conn, "no such pipeline");
}

/// A worker shared by two teams: team-a (weight at most 3) and team-b (at most 2, 10
/// credits a job).
fn tenants() -> W {
    let tenant = |name: &str, token: &str, max_weight, max_credits| {
        Arc::new(Tenant {
            name: name.into(),
            token: token.into(),
            max_weight,
            max_credits,
            share_group: name.into(),
        })
    };
    let admission = Admission::Tenants(vec![
        tenant("team-a", "tok-a", 3, 100),
        tenant("team-b", "tok-b", 2, 10),
    ]);
    W::new(Rules::new(admission, Welcome::default()), 1)
}

/// The name and weight a job asked for as `name` at `weight` on `token` runs under.
fn opened_as(w: &mut W, token: &str, name: &str, weight: u32) -> (String, Option<u32>) {
    let now = Instant::now();
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello(token), now, |_, _| 0);
    w.handle(conn, Message::OpenJob(spec(1, name, weight)), now, |_, _| 0);
    let spec = effects(w, conn)
        .into_iter()
        .find_map(|e| match e {
            Effect::Open(spec) => Some(spec),
            _ => None,
        })
        .expect("the job is opened");
    let weight = w.opened(conn, &spec, Ok(SHAPE));
    (spec.name, weight)
}

#[test]
fn a_tenants_token_decides_its_jobs_names_and_caps() {
    let mut w = tenants();
    assert_eq!(
        opened_as(&mut w, "tok-a", "resnet", 3),
        ("team-a/resnet".into(), Some(3))
    );
    // Team B names its job like team A's and asks for weight 16: it stays team B's, at 2.
    assert_eq!(
        opened_as(&mut w, "tok-b", "team-a/resnet", 16),
        ("team-b/team-a/resnet".into(), Some(2))
    );
    assert_eq!(
        opened_as(&mut w, "tok-b", "resnet", 16),
        ("team-b/resnet".into(), Some(2))
    );
    // A name already under the client's own tenant is not prefixed twice.
    assert_eq!(opened_as(&mut w, "tok-a", "team-a/vit", 1).0, "team-a/vit");
    let now = Instant::now();
    for (token, why) in [("secret", "wrong tenant token"), ("", "no tenant token")] {
        let conn = w.connect(Transport::Frames, now);
        w.handle(conn, hello(token), now, |_, _| 0);
        assert_closed(&mut w, conn, why);
    }
}

#[test]
fn a_tenants_credits_are_capped_per_job() {
    let mut w = tenants();
    let now = Instant::now();
    let conn = w.connect(Transport::Frames, now);
    w.handle(conn, hello("tok-b"), now, |_, _| 0);
    w.handle(conn, Message::OpenJob(spec(1, "j", 1)), now, |_, _| 0);
    let _ = effects(&mut w, conn);
    w.opened(conn, &spec(1, "team-b/j", 1), Ok(SHAPE));
    let _ = effects(&mut w, conn);
    send(
        &mut w,
        conn,
        Message::Credit {
            job: 1,
            samples: 500,
        },
        now,
    );
    send(&mut w, conn, Message::Assign(assign(1, 1)), now);
    let _ = w.take_wakes();
    let id = w.units.keys().copied().next().expect("the unit");
    let mut sent = 0;
    while w.next_sample(id) == Gate::Go {
        sent += 1;
    }
    assert_eq!(sent, 10, "team-b's jobs hold at most 10 credits");
}

#[test]
fn assignments_are_checked() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let bad = [
        (assign(9, 0), "which is not open"),
        (
            Assign {
                start: 5,
                end: 5,
                ..assign(1, 0)
            },
            "samples 5..5",
        ),
        (
            Assign {
                end: 101,
                ..assign(1, 0)
            },
            "of a 100-sample shard",
        ),
    ];
    for (a, why) in bad {
        let conn = open(&mut w, 1, "a", 1, now);
        send(&mut w, conn, Message::Assign(a), now);
        assert_closed(&mut w, conn, why);
    }
    let conn = open(&mut w, 1, "a", 1, now);
    for u in 0..5 {
        send(&mut w, conn, Message::Assign(assign(1, u)), now);
    }
    assert_closed(&mut w, conn, "max_units_per_connection");
}

/// The regression of aaaf27c: a unit out of credit gives its slot to another job's unit.
#[test]
fn a_unit_out_of_credit_gives_its_slot_to_another_job() {
    let (mut w, a, now) = one_job();
    let b = open(&mut w, 2, "b", 1, now);
    send(&mut w, a, Message::Assign(assign(1, 10)), now);
    let started = w.take_wakes();
    assert!(matches!(started[..], [Wake::Start(10)]));
    send(&mut w, b, Message::Assign(assign(2, 20)), now);
    assert!(w.take_wakes().is_empty(), "one slot, held by a's unit");
    let (ua, ub) = (UnitId(1), UnitId(2));
    // No credit for a: its unit waits, and b's unit gets the slot.
    assert_eq!(w.next_sample(ua), Gate::Wait(Waiting::Credit));
    assert!(matches!(w.take_wakes()[..], [Wake::Start(20)]));
    send(&mut w, b, Message::Credit { job: 2, samples: 2 }, now);
    assert_eq!(w.next_sample(ub), Gate::Go);
    // a's credit comes: its unit queues for the slot, which b's unit yields at its next sample.
    send(&mut w, a, Message::Credit { job: 1, samples: 1 }, now);
    assert!(w.take_wakes().is_empty());
    assert_eq!(w.next_sample(ub), Gate::Wait(Waiting::Slot));
    assert!(matches!(w.take_wakes()[..], [Wake::Resume(10)]));
    assert_eq!(
        w.next_sample(ua),
        Gate::Go,
        "its credit was taken while it queued"
    );
    assert_eq!(w.next_sample(ua), Gate::Wait(Waiting::Credit));
    assert!(matches!(w.take_wakes()[..], [Wake::Resume(20)]));
    assert_eq!(w.next_sample(ub), Gate::Go);
    let done = UnitEnd::Done(UnitDone {
        job: 2,
        unit: 20,
        attempt: 0,
        sent: 2,
        skipped: 0,
        storage_bytes: 0,
        cached_bytes: 0,
    });
    assert!(matches!(w.unit_ended(ub, done), Some(Message::UnitDone(_))));
    assert!(w.take_wakes().is_empty(), "a's unit still has no credit");
}

/// A sample copied from another job's decode keeps the slot while another job waits; the
/// next decoded one hands it on.
#[test]
fn a_unit_keeps_its_slot_over_copies_and_offers_it_at_a_decode() {
    let (mut w, a, now) = one_job();
    let b = open(&mut w, 2, "b", 1, now);
    for (conn, job) in [(a, 1), (b, 2)] {
        let credit = Message::Credit { job, samples: 10 };
        send(&mut w, conn, credit, now);
    }
    let (ua, ub) = (UnitId(1), UnitId(2));
    send(&mut w, a, Message::Assign(assign(1, 10)), now);
    assert!(matches!(w.take_wakes()[..], [Wake::Start(10)]));
    assert_eq!(
        w.next_sample(ua),
        Gate::Go,
        "its grant paid for its first decode"
    );
    // b's unit queues, as charged as a's job: a decode of a's would now hand it the slot.
    send(&mut w, b, Message::Assign(assign(2, 20)), now);
    for _ in 0..3 {
        assert_eq!(w.next_shared(ua), Gate::Go, "b's unit waits, a's copies go");
        assert!(w.take_wakes().is_empty());
    }
    assert_eq!(w.next_sample(ua), Gate::Wait(Waiting::Slot));
    assert!(matches!(w.take_wakes()[..], [Wake::Start(20)]));
    // b's unit, granted the slot, decodes and copies; at its next decode the slot goes back to
    // a's, charged a decode and three copies against b's two decodes and a copy.
    assert_eq!(w.next_sample(ub), Gate::Go);
    assert_eq!(w.next_shared(ub), Gate::Go);
    assert_eq!(w.next_sample(ub), Gate::Wait(Waiting::Slot));
    assert!(matches!(w.take_wakes()[..], [Wake::Resume(10)]));
    assert_eq!(
        w.next_shared(ua),
        Gate::Go,
        "its credit was taken as it queued"
    );
    // Out of credit, a copy waits as a decode does, and the slot goes on.
    for _ in 0..5 {
        assert_eq!(w.next_shared(ua), Gate::Go);
    }
    assert_eq!(w.next_shared(ua), Gate::Wait(Waiting::Credit));
    assert!(matches!(w.take_wakes()[..], [Wake::Resume(20)]));
}

#[test]
fn a_cancelled_job_stops_its_units_and_forgets_those_not_started() {
    let (mut w, a, now) = one_job();
    send(&mut w, a, Message::Assign(assign(1, 10)), now);
    send(&mut w, a, Message::Assign(assign(1, 11)), now);
    assert!(matches!(w.take_wakes()[..], [Wake::Start(10)]));
    send(&mut w, a, Message::Cancel { job: 1 }, now);
    assert!(matches!(w.take_wakes()[..], [Wake::Stop(10)]));
    assert_eq!(effects(&mut w, a), [Effect::Cancelled(1)]);
    assert_eq!(w.next_sample(UnitId(1)), Gate::Stop);
    let failed = UnitEnd::Failed(UnitFailed {
        job: 1,
        unit: 10,
        attempt: 0,
        error: "cancelled".into(),
    });
    assert_eq!(
        w.unit_ended(UnitId(1), failed),
        None,
        "no frame for a cancelled job"
    );
    assert!(
        w.take_wakes().is_empty(),
        "unit 11 was forgotten, not started"
    );
    // The slot is free again for another job.
    let b = open(&mut w, 2, "b", 1, now);
    send(&mut w, b, Message::Assign(assign(2, 20)), now);
    assert!(matches!(w.take_wakes()[..], [Wake::Start(20)]));
}

#[test]
fn a_drain_fails_new_assignments_and_closes_when_the_units_are_done() {
    let (mut w, a, now) = one_job();
    send(&mut w, a, Message::Assign(assign(1, 10)), now);
    w.take_wakes();
    w.drain();
    send(&mut w, a, Message::Assign(assign(1, 11)), now);
    let failed = effects(&mut w, a);
    assert!(matches!(&failed[..], [Effect::Send(Message::UnitFailed(f))] if f.unit == 11));
    w.finished(a);
    assert_eq!(closed(&mut w, a), Some(End::Drained));
}

#[test]
fn heartbeats_go_out_and_a_silent_client_is_closed() {
    let (mut w, a, t0) = one_job();
    let at = w.poll_timeout(a).expect("a deadline");
    assert_eq!(at, t0 + Duration::from_secs(1));
    w.handle_timeout(a, at);
    assert_eq!(
        effects(&mut w, a),
        [Effect::Send(Message::Heartbeat { seq: 1 })]
    );
    w.handle_timeout(a, t0 + Duration::from_secs(10));
    // Unavailable, not a refusal: a client that was paused may come back.
    match closed(&mut w, a) {
        Some(End::Error(ErrorCode::Unavailable, m)) => {
            assert!(m.contains("no frame from the client"), "{m}")
        }
        other => panic!("{other:?}, not closed as unavailable for silence"),
    }
}

/// Jobs on connections of their own share one worker's slots by weight, sample by sample.
#[test]
fn connections_share_the_slots_by_their_jobs_weights() {
    let now = Instant::now();
    let mut w = W::new(rules(), 2);
    let jobs = [(1, "three", 3), (2, "one", 1)];
    let mut conns = Vec::new();
    for (job, name, weight) in jobs {
        let conn = open(&mut w, job, name, weight, now);
        send(&mut w, conn, Message::Credit { job, samples: 100 }, now);
        for u in 0..4 {
            send(
                &mut w,
                conn,
                Message::Assign(assign(job, job * 10 + u)),
                now,
            );
        }
        conns.push(conn);
    }
    // Units are numbered in the order they were assigned; the launch handle is the unit.
    let id = |unit: u64| UnitId(if unit < 20 { unit - 9 } else { unit - 15 });
    let mut runnable: VecDeque<u64> = VecDeque::new();
    let mut got = [0u32; 2];
    for _ in 0..4000 {
        for wake in w.take_wakes() {
            if let Wake::Start(u) | Wake::Resume(u) = wake {
                runnable.push_back(u);
            }
        }
        let u = runnable.pop_front().expect("a unit runs");
        match w.next_sample(id(u)) {
            Gate::Go => {
                got[(u / 10 - 1) as usize] += 1;
                runnable.push_back(u);
            }
            Gate::Wait(Waiting::Slot) => {}
            other => panic!("{other:?}"),
        }
        for (job, conn) in [1, 2].into_iter().zip(&conns) {
            send(&mut w, *conn, Message::Credit { job, samples: 1 }, now);
        }
    }
    let share = f64::from(got[0]) / f64::from(got[0] + got[1]);
    assert!((0.73..=0.77).contains(&share), "weight 3 of 4: {share}");
}

/// A runner that panics on its second sample.
struct Panicking;

impl crate::runner::JobRunner for Panicking {
    fn shape(&self) -> SampleShape {
        SHAPE
    }

    fn run(
        &self,
        a: &Assign,
        emit: &mut dyn FnMut(crate::runner::Output) -> bool,
    ) -> Result<crate::runner::Finished, crate::runner::RunnerError> {
        let header = crate::message::SampleHeader {
            job: a.job,
            unit: a.unit,
            attempt: a.attempt,
            shard: 0,
            index: a.start,
            key: "k".into(),
            label: None,
            tensor_bytes: 1,
            fields: Vec::new(),
            geometry: Default::default(),
            has: Vec::new(),
        };
        emit(crate::runner::Output::Sample(header, vec![0]));
        panic!("a decoder bug");
    }
}

#[test]
fn a_unit_whose_runner_panics_fails_and_gives_its_slot_back() {
    let (w, a, now) = one_job();
    let w = std::sync::Mutex::new(w);
    send(
        &mut w.lock().unwrap(),
        a,
        Message::Credit { job: 1, samples: 5 },
        now,
    );
    starts_at_once(&w, a, 10, now);
    let parker = Parker::new();
    let thread = UnitThread {
        worker: &w,
        id: UnitId(1),
        parker: &parker,
        runner: &Panicking,
        assign: &assign(1, 10),
    };
    let end = thread.run(|_| true, |_| {}, |_, _| {});
    match end {
        Some(Message::UnitFailed(f)) => assert!(f.error.contains("a decoder bug"), "{f:?}"),
        other => panic!("{other:?}"),
    }
    // The slot is free: another unit starts at once.
    starts_at_once(&w, a, 11, now);
}

/// Assigns `unit` of job 1 on `conn` and checks that it is started at once.
fn starts_at_once(w: &std::sync::Mutex<W>, conn: ConnId, unit: u64, now: Instant) {
    let mut w = w.lock().unwrap();
    send(&mut w, conn, Message::Assign(assign(1, unit)), now);
    let wakes = w.take_wakes();
    assert!(
        matches!(wakes[..], [Wake::Start(u)] if u == unit),
        "unit {unit}: {wakes:?}"
    );
}

/// The segments of a same-host job 1: `slots` slots and `places` places of a sample each.
fn layout(slots: u32, places: u32) -> Message {
    Message::ShmAttach(crate::message::ShmAttach {
        job: 1,
        slots,
        slot_bytes: SHAPE.bytes(),
        places,
    })
}

/// The client grants slot `slot` of job 1.
fn grant(w: &mut W, conn: ConnId, slot: u32, now: Instant) {
    let m = Message::SlotCredit {
        job: 1,
        slots: vec![slot],
    };
    send(w, conn, m, now);
}

/// Place `place` of the batch arena for sample `index` of unit `unit`.
fn place(unit: u64, index: u64, place: u32) -> crate::message::Place {
    crate::message::Place {
        unit,
        attempt: 0,
        index,
        place,
    }
}

/// A same-host connection with job 1 open, greeted and opened; its segments not attached.
fn same_host_opened(w: &mut W, now: Instant) -> ConnId {
    let conn = w.connect(Transport::Slots, now);
    send(w, conn, hello("secret"), now);
    send(w, conn, Message::OpenJob(spec(1, "a", 1)), now);
    assert!(matches!(effects(w, conn)[..], [_, Effect::Open(_)]));
    w.opened(conn, &spec(1, "a", 1), Ok(SHAPE));
    effects(w, conn);
    conn
}

/// A same-host connection with job 1's segments attached: 2 slots, 8 places.
fn same_host(w: &mut W, now: Instant) -> ConnId {
    let conn = same_host_opened(w, now);
    assert!(w.handshaking(conn));
    send(w, conn, layout(2, 8), now);
    assert!(matches!(effects(w, conn)[..], [Effect::Attach(_)]));
    w.attached(conn, 1, Ok(()));
    assert!(matches!(
        effects(w, conn)[..],
        [Effect::Send(Message::ShmAttached { job: 1 })]
    ));
    assert!(!w.handshaking(conn));
    conn
}

#[test]
fn the_same_host_handshake_is_checked_in_order_by_the_session() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let c = w.connect(Transport::Slots, now);
    send(&mut w, c, hello("secret"), now);
    send(&mut w, c, layout(2, 0), now);
    assert_closed(&mut w, c, "expected OpenJob, got ShmAttach");
    let c = same_host_opened(&mut w, now);
    send(&mut w, c, Message::Assign(assign(1, 1)), now);
    assert_closed(&mut w, c, "expected ShmAttach, got Assign");
    let c = same_host_opened(&mut w, now);
    send(&mut w, c, layout(0, 0), now);
    assert_closed(&mut w, c, "0 slots");
    let c = same_host_opened(&mut w, now);
    send(&mut w, c, layout(2, 0), now);
    send(&mut w, c, Message::Heartbeat { seq: 1 }, now);
    assert_closed(&mut w, c, "Heartbeat before ShmAttached");
    // The shell could not map what the client sent.
    let c = same_host_opened(&mut w, now);
    send(&mut w, c, layout(2, 0), now);
    w.attached(c, 1, Err("the segment is not sealed".into()));
    assert_closed(&mut w, c, "not sealed");
    // Over QUIC there is no segment to attach.
    let (mut w, a, now) = one_job();
    send(&mut w, a, layout(2, 0), now);
    assert_closed(&mut w, a, "without shared memory");
}

#[test]
fn same_host_samples_take_their_place_or_a_granted_slot_and_placed_ones_spend_no_credit() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let c = same_host(&mut w, now);
    let mut id = None;
    w.handle(c, Message::Assign(assign(1, 5)), now, |i, _| {
        id = Some(i);
        5
    });
    let id = id.expect("accepted");
    assert!(matches!(w.take_wakes()[..], [Wake::Start(5)]));
    let places = vec![place(5, 0, 3), place(5, 1, 4)];
    send(&mut w, c, Message::ShmPlaces { job: 1, places }, now);
    grant(&mut w, c, 0, now);
    assert!(effects(&mut w, c).is_empty());
    // One credit: sample 0 goes to its place and gives it back, so sample 1 may go too.
    assert_eq!(w.next_sample(id), Gate::Go);
    assert_eq!(w.route(id, 0, true), Ok(Some(Route::Place(3))));
    assert_eq!(w.next_sample(id), Gate::Go);
    assert_eq!(
        w.take_place(c, 1, (5, 0), 1),
        Ok(Some(4)),
        "the engine claims it"
    );
    w.placed(id);
    assert_eq!(w.next_sample(id), Gate::Go);
    // A place is used once: sample 0 again takes the slot, and then there is none.
    assert_eq!(w.route(id, 0, true), Ok(Some(Route::Slot(0))));
    assert_eq!(w.next_sample(id), Gate::Wait(Waiting::Credit));
    assert!(w
        .route(id, 2, true)
        .unwrap_err()
        .contains("without a granted slot"));
    grant(&mut w, c, 1, now);
    assert!(matches!(w.take_wakes()[..], [Wake::Resume(5)]));
    grant(&mut w, c, 1, now);
    assert_closed(&mut w, c, "slot 1 granted twice");
}

#[test]
fn a_same_host_job_cancelled_releases_its_places_and_none_is_handed_out_after() {
    let now = Instant::now();
    let mut w = W::new(rules(), 1);
    let mut c = same_host(&mut w, now);
    for (unit, place, closes) in [(5, 9, true), (6, 1, false)] {
        send(&mut w, c, Message::Assign(assign(1, unit)), now);
        let places = vec![self::place(unit, 0, place)];
        send(&mut w, c, Message::ShmPlaces { job: 1, places }, now);
        if closes {
            assert_closed(&mut w, c, "the arena has 8");
            c = same_host(&mut w, now);
        }
    }
    let mut id = None;
    w.handle(c, Message::Assign(assign(1, 7)), now, |i, _| {
        id = Some(i);
        7
    });
    let id = id.expect("accepted");
    send(&mut w, c, Message::Cancel { job: 1 }, now);
    assert!(matches!(
        effects(&mut w, c)[..],
        [
            Effect::Cancelled(1),
            Effect::Send(Message::ShmReleased { job: 1 })
        ]
    ));
    assert!(w.take_place(c, 1, (6, 0), 0).is_err());
    assert_eq!(
        w.route(id, 0, true),
        Ok(None),
        "a stopping unit writes nowhere"
    );
}
