//! The same-host transport, worker side: a Unix socket beside the QUIC endpoint where a
//! training process on this machine attaches a shared-memory segment of sample slots, so a
//! tensor is written once, by the decoding thread, straight into memory the client reads.
//!
//! A connection speaks the same frames as QUIC and carries one job:
//!
//! ```text
//! client                              worker
//! Hello (token)                 →     checks SO_PEERCRED and the token
//!                               ←     Welcome
//! OpenJob                       →
//!                               ←     JobOpened (shape)
//! ShmAttach + memfd (SCM_RIGHTS) →    checks seals and size, maps it
//!                               ←     ShmAttached
//! Assign, SlotCredit [slots]    →
//!                               ←     ShmSample {slot, header}, Skipped, UnitDone…
//! ```
//!
//! A slot the client granted is the worker's until the `ShmSample` naming it is sent; the
//! sample counts only when that frame arrives, after the tensor is in place, so a worker
//! killed mid-write leaves at most a slot the client never reads.
//!
//! Who may attach: the socket file's mode (`same_host.socket_mode`) lets the kernel refuse
//! strangers, and the peer's credentials must be root, the worker's own user, or listed in
//! `same_host.allowed_uids`/`allowed_gids`; the cluster token is checked as over QUIC.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::shm::{self, socket_path, Segment};
use sluice_wire::{
    ErrorCode, ErrorMessage, Message, Place, PlaceClaim, Places, SampleHeader, SamplePayload,
    ShmAttach,
};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::config::SameHost;
use crate::connection::{Connection, Ended, Outbound, SendError};
use crate::server::State;
use sluice_wire::session::{End, Transport};

#[derive(Debug, thiserror::Error)]
pub enum SameHostError {
    #[error("same-host socket {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("same-host socket {path} is in use by a running worker")]
    InUse { path: String },
    #[error(
        "same-host directory {dir} (mode {mode:o}) is writable by other users and not \
             sticky: anyone could replace the socket; make it 0755 (or 1777)"
    )]
    UnsafeDir { dir: String, mode: u32 },
}

/// The bound socket; its file is removed when this is dropped.
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next client (accept errors, such as running out of descriptors, are logged and
    /// waited out).
    pub(crate) async fn accept(&self) -> Option<UnixStream> {
        match self.listener.accept().await {
            Ok((stream, _)) => Some(stream),
            Err(e) => {
                warn!("same-host accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                None
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the same-host socket for a worker on QUIC port `port` (in a tokio runtime).
/// A socket file left by a dead worker is replaced; one a live worker answers on is not.
pub fn bind(config: &SameHost, port: u16) -> Result<Listener, SameHostError> {
    let path = socket_path(&config.socket_dir, port);
    let shown = path.display().to_string();
    let err = |source| SameHostError::Bind {
        path: shown.clone(),
        source,
    };
    std::fs::create_dir_all(&config.socket_dir).map_err(err)?;
    check_dir(&config.socket_dir).map_err(err)??;
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(SameHostError::InUse { path: shown });
        }
        std::fs::remove_file(&path).map_err(err)?;
    }
    let listener = UnixListener::bind(&path).map_err(err)?;
    let listener = Listener { listener, path };
    std::fs::set_permissions(
        &listener.path,
        std::fs::Permissions::from_mode(config.socket_mode),
    )
    .map_err(err)?;
    Ok(listener)
}

/// Whether others could replace the socket in `dir`: refused when the directory is writable
/// by others and not sticky; warned about when it is writable by everyone but sticky (a
/// client checks the socket's owner then, `sluice_client`'s same-host peer check).
fn check_dir(dir: &Path) -> std::io::Result<Result<(), SameHostError>> {
    match shm::socket_dir(dir)? {
        shm::SocketDir::Unsafe { mode } => {
            return Ok(Err(SameHostError::UnsafeDir {
                dir: dir.display().to_string(),
                mode,
            }))
        }
        shm::SocketDir::Sticky { mode } if mode & 0o002 != 0 => {
            tracing::warn!(dir = %dir.display(), mode = format!("{mode:o}"),
                "the same-host directory is writable by every user (sticky, so the socket \
                 cannot be replaced, but a dedicated 0755 directory such as /run/sluice is \
                 safer)");
        }
        _ => {}
    }
    Ok(Ok(()))
}

/// A same-host job's segment and which of its slots the worker may write; with the client's
/// batch arena, the places it gave for samples of the units running here.
pub(crate) struct Slots {
    segment: Segment,
    /// Slots granted and not yet filled, in grant order; `held[i]` says whether `i` is one.
    state: Mutex<(std::collections::VecDeque<u32>, Vec<bool>)>,
    /// The client's batches, when it shares them.
    arena: Option<Segment>,
    places: Mutex<PlaceTable>,
    /// Set once the client cancelled the job: no write into the arena starts after, and
    /// setting it waits for those under way (they hold it shared).
    released: std::sync::RwLock<bool>,
}

/// The places a client gave, kept only while their unit runs here: a place that arrives
/// after its unit ended is dropped, so the table never outgrows the units in flight.
#[derive(Default)]
struct PlaceTable {
    /// By (unit, attempt), then sample index.
    running: std::collections::HashMap<(u64, u32), std::collections::HashMap<u64, u32>>,
}

impl Slots {
    fn new(segment: Segment, arena: Option<Segment>) -> Self {
        let n = segment.slots() as usize;
        Slots {
            segment,
            state: Mutex::new((std::collections::VecDeque::with_capacity(n), vec![false; n])),
            arena,
            places: Mutex::default(),
            released: std::sync::RwLock::new(false),
        }
    }

    /// The client cancelled the job: returns once no sample is being written into its batch
    /// arena, and none will be (the client may then use every place it gave again).
    pub(crate) fn release(&self) {
        if let Ok(mut r) = self.released.write() {
            *r = true;
        }
    }

    /// Whether the client shares its batches (and so waits to hear they are released).
    pub(crate) fn has_arena(&self) -> bool {
        self.arena.is_some()
    }

    /// Takes the client's grant; the number of new credits, or what is wrong with it.
    pub(crate) fn grant(&self, slots: &[u32]) -> Result<usize, String> {
        let mut guard = self.state.lock().map_err(|_| "slot state poisoned")?;
        let (free, held) = &mut *guard;
        for &slot in slots {
            match held.get_mut(slot as usize) {
                None => {
                    return Err(format!(
                        "slot {slot} granted, the segment has {}",
                        self.segment.slots()
                    ))
                }
                Some(true) => return Err(format!("slot {slot} granted twice")),
                Some(h) => {
                    *h = true;
                    free.push_back(slot);
                }
            }
        }
        Ok(slots.len())
    }

    /// Unit `(unit, attempt)` starts here: places may come for its samples.
    pub(crate) fn unit_started(&self, unit: u64, attempt: u32) {
        if let Ok(mut p) = self.places.lock() {
            p.running.entry((unit, attempt)).or_default();
        }
    }

    /// Unit `(unit, attempt)` ended: its places that were not used are forgotten.
    pub(crate) fn unit_ended(&self, unit: u64, attempt: u32) {
        if let Ok(mut p) = self.places.lock() {
            p.running.remove(&(unit, attempt));
        }
    }

    /// Takes the client's places, or says what is wrong with them.
    pub(crate) fn add_places(&self, places: &[Place]) -> Result<(), String> {
        let arena = self
            .arena
            .as_ref()
            .ok_or("sample places, but the client attached no batch arena")?;
        let mut p = self.places.lock().map_err(|_| "place table poisoned")?;
        for place in places {
            if place.place >= arena.slots() {
                return Err(format!(
                    "place {} for sample {} of unit {}, the arena has {}",
                    place.place,
                    place.index,
                    place.unit,
                    arena.slots()
                ));
            }
            if let Some(unit) = p.running.get_mut(&(place.unit, place.attempt)) {
                unit.insert(place.index, place.place);
            }
        }
        Ok(())
    }

    /// The next granted slot, which the sample about to go out takes (with its credit).
    fn next_slot(&self) -> Result<u32, String> {
        let mut guard = self.state.lock().map_err(|_| "slot state poisoned")?;
        let (free, held) = &mut *guard;
        let slot = free.pop_front().ok_or("a credit without a granted slot")?;
        held[slot as usize] = false;
        Ok(slot)
    }

    /// A sample the runner wrote into its claimed place: the frame to send (the credit's slot
    /// comes back unused) and its payload (the fields).
    pub(crate) fn placed(
        &self,
        header: SampleHeader,
        place: u32,
        fields: Vec<u8>,
    ) -> Result<(Message, Vec<u8>), String> {
        let slot = self.next_slot()?;
        let frame = Message::ShmPlaced {
            slot,
            place,
            header,
        };
        Ok((frame, fields))
    }

    /// Writes a sample's tensor into its place in the client's batch, if it has one, else into
    /// the next granted slot: the frame to send and its payload (the fields only). A placed
    /// sample still takes a credit, and gives its slot back in the frame unused.
    pub(crate) fn place(
        &self,
        header: SampleHeader,
        payload: &[u8],
    ) -> Result<(Message, Vec<u8>), String> {
        if header.tensor_bytes != self.segment.slot_bytes() {
            return Err(format!(
                "sample {:?}: {} tensor bytes for slots of {}",
                header.key,
                header.tensor_bytes,
                self.segment.slot_bytes()
            ));
        }
        let (tensor, fields) = SamplePayload::parts(&header, payload)?;
        let slot = self.next_slot()?;
        let sample = (header.unit, header.attempt, header.index);
        if let Some(mut claim) = self.take_place(sample, tensor.len())? {
            claim.memory().copy_from_slice(tensor);
            let frame = Message::ShmPlaced {
                slot,
                place: claim.place(),
                header,
            };
            return Ok((frame, fields.to_vec()));
        }
        self.segment
            .write(slot, tensor)
            .map_err(|e| e.to_string())?;
        Ok((Message::ShmSample { slot, header }, fields.to_vec()))
    }
}

impl Slots {
    /// The place the client gave for sample `index` of `(unit, attempt)`, taken out of the
    /// table (used once) and writable until the claim drops; `None` without one (or for a
    /// tensor of another size), an error once the job was released. The engine resizes into
    /// it ([`Places`]), or `place` copies a finished tensor there.
    fn take_place(
        &self,
        (unit, attempt, index): (u64, u32, u64),
        len: usize,
    ) -> Result<Option<PlaceClaim<'_>>, String> {
        let Some(arena) = self.arena.as_ref().filter(|a| len as u64 == a.slot_bytes()) else {
            return Ok(None);
        };
        let place = self
            .places
            .lock()
            .ok()
            .and_then(|mut p| p.running.get_mut(&(unit, attempt))?.remove(&index));
        let Some(place) = place else { return Ok(None) };
        let released = self.released.read().map_err(|_| "arena state poisoned")?;
        if *released {
            return Err("the job was cancelled".into());
        }
        let ptr = arena.slot_raw(place).map_err(|e| e.to_string())?;
        // SAFETY: the place lies in the mapping (checked when it was given) and is this
        // sample's alone: the client gave it once, for this sample, and this took it out of
        // the table. The client reads it only after the frame that names it.
        let memory = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        Ok(Some(PlaceClaim::new(place, memory, Box::new(released))))
    }
}

/// The engine resizes a sample straight into its place when the client gave one before the
/// sample was decoded: no tensor is copied on either side.
impl Places for Slots {
    fn claim(&self, unit: u64, attempt: u32, index: u64, len: usize) -> Option<PlaceClaim<'_>> {
        self.take_place((unit, attempt, index), len).ok().flatten()
    }
}

/// Frames over the Unix socket, buffered: they are small (the fields only), and the session
/// flushes when no more are queued, so a burst of samples costs one write.
struct UnixOut(FrameWriter<tokio::io::BufWriter<OwnedWriteHalf>>);

impl Outbound for UnixOut {
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError> {
        Ok(self.0.send(message, &[&payload]).await?)
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        Ok(self.0.flush().await?)
    }
}

/// Whether `peer` may attach under `config`, run by `me` (uid, gid).
fn may_attach(config: &SameHost, me: (u32, u32), peer: &shm::Peer) -> bool {
    peer.uid == 0
        || peer.uid == me.0
        || config.allowed_uids.contains(&peer.uid)
        || config.allowed_gids.contains(&peer.gid)
}

/// Serves one same-host client.
pub(crate) async fn serve(stream: UnixStream, state: Arc<State>) {
    let peer = match shm::peer(&stream) {
        Ok(p) => p,
        Err(e) => {
            warn!("same-host client: {e}");
            return;
        }
    };
    let (rd, wr) = stream.into_split();
    let mut reader = FrameReader::new(rd, state.limits);
    let mut writer = FrameWriter::new(wr, state.limits);
    let handshake = state.config.timeouts.handshake();
    let mut connection = Connection::new(state.clone(), Transport::Slots);
    let opened = tokio::time::timeout(
        handshake,
        open(&state, &peer, &mut connection, &mut reader, &mut writer),
    )
    .await
    .unwrap_or_else(|_| Err((ErrorCode::BadRequest, "no handshake in time".into())));
    if let Err((code, message)) = opened {
        warn!(
            pid = peer.pid,
            uid = peer.uid,
            "same-host client refused: {message}"
        );
        if code == ErrorCode::Unauthorized {
            metrics::counter!("sluice_cpu_auth_failures_total").increment(1);
        }
        let _ = writer
            .send(&Message::Error(ErrorMessage { code, message }), &[])
            .await;
        return;
    }
    let client = connection.client().to_string();
    info!(client = %client, pid = peer.pid, uid = peer.uid, "same-host client connected");
    metrics::gauge!("sluice_cpu_connections").increment(1.0);
    let mut out = UnixOut(FrameWriter::new(
        tokio::io::BufWriter::new(writer.into_inner()),
        state.limits,
    ));
    let end = connection.run(reader, &mut out).await;
    drop(connection);
    metrics::gauge!("sluice_cpu_connections").decrement(1.0);
    match end {
        Ended::ClientClosed => info!(client = %client, "same-host client left"),
        Ended::Worker(End::Drained) => info!(client = %client, "closed for shutdown"),
        Ended::Worker(End::Error(code, message)) => {
            warn!(client = %client, "closing: {message}");
            let _ = out
                .frame(
                    &Message::Error(ErrorMessage { code, message }),
                    bytes::Bytes::new(),
                )
                .await;
            let _ = out.flush().await;
        }
    }
}

type Refusal = (ErrorCode, String);

/// The handshake up to `ShmAttached`, each step checked by the worker's session; why the
/// client was refused, if it was.
async fn open(
    state: &State,
    peer: &shm::Peer,
    connection: &mut Connection,
    reader: &mut FrameReader<tokio::net::unix::OwnedReadHalf>,
    writer: &mut FrameWriter<OwnedWriteHalf>,
) -> Result<(), Refusal> {
    let config = &state.config.same_host;
    if !may_attach(config, shm::current_user(), peer) {
        return Err((
            ErrorCode::Unauthorized,
            format!(
                "uid {} (gid {}) may not attach to this worker (same_host.allowed_uids/allowed_gids)",
                peer.uid, peer.gid
            ),
        ));
    }
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let io = |e: sluice_wire::io::IoError| bad(e.to_string());
    let send = |e: sluice_wire::io::IoError| (ErrorCode::Internal, e.to_string());
    let refused = |end: End| match end {
        End::Error(code, why) => (code, why),
        End::Drained => (ErrorCode::Unavailable, "worker is draining".into()),
    };
    let hello = reader.next().await.map_err(io)?;
    let hello = hello.ok_or_else(|| bad("closed before Hello".into()))?;
    for m in connection.handshake(hello).map_err(refused)? {
        writer.send(&m, &[]).await.map_err(send)?;
    }
    let spec = match reader.next().await.map_err(io)? {
        Some(Message::OpenJob(spec)) => spec,
        Some(other) => return Err(bad(format!("expected OpenJob, got {}", other.kind()))),
        None => return Err(bad("closed before OpenJob".into())),
    };
    let job = spec.job;
    let mut shape = None;
    for m in connection
        .handshake(Message::OpenJob(spec))
        .map_err(refused)?
    {
        if let Message::JobOpened { shape: s, .. } = &m {
            shape = Some(*s);
        }
        writer.send(&m, &[]).await.map_err(send)?;
    }
    let shape = shape.ok_or_else(|| (ErrorCode::Internal, "the job did not open".into()))?;
    let attach = match reader.next().await.map_err(io)? {
        Some(Message::ShmAttach(a)) => a,
        Some(other) => return Err(bad(format!("expected ShmAttach, got {}", other.kind()))),
        None => return Err(bad("closed before ShmAttach".into())),
    };
    check_attach(
        config,
        state.config.limits.max_credits,
        &attach,
        job,
        shape.bytes(),
    )?;
    let socket = reader.get_ref().as_ref();
    let fd = shm::recv_fd(socket).await.map_err(|e| bad(e.to_string()))?;
    let segment = Segment::open(fd, &attach).map_err(|e| bad(e.to_string()))?;
    let arena = match attach.places {
        0 => None,
        _ => {
            let fd = shm::recv_fd(socket).await.map_err(|e| bad(e.to_string()))?;
            let arena = Segment::open_arena(fd, &attach).map_err(|e| bad(e.to_string()))?;
            Some(arena)
        }
    };
    connection.attach(job, Arc::new(Slots::new(segment, arena)));
    writer
        .send(&Message::ShmAttached { job }, &[])
        .await
        .map_err(send)?;
    Ok(())
}

/// Slots a segment may have beyond `limits.max_credits`: the client keeps samples that
/// arrived before their turn in them (its default bound on those is 2,560).
const MAX_SPARE_SLOTS: u32 = 1 << 16;

/// Samples a client's batch arena may hold (its batches, back to back).
const MAX_PLACES: u32 = 1 << 16;

fn check_attach(
    config: &SameHost,
    max_credits: u32,
    attach: &ShmAttach,
    job: u64,
    sample_bytes: u64,
) -> Result<(), Refusal> {
    let bad = |m: String| Err((ErrorCode::BadRequest, m));
    if attach.job != job {
        return bad(format!(
            "segment for job {}, the open job is {job}",
            attach.job
        ));
    }
    if attach.slot_bytes != sample_bytes {
        return bad(format!(
            "slots of {} bytes, the job's samples have {sample_bytes}",
            attach.slot_bytes
        ));
    }
    // Slots beyond the credits hold samples the client keeps until their turn.
    if attach.slots == 0 || attach.slots > max_credits.saturating_add(MAX_SPARE_SLOTS) {
        return bad(format!(
            "{} slots (limits.max_credits = {max_credits}, plus {MAX_SPARE_SLOTS} spare)",
            attach.slots
        ));
    }
    if attach.places > MAX_PLACES {
        return bad(format!(
            "a batch arena of {} samples (at most {MAX_PLACES})",
            attach.places
        ));
    }
    for (what, n) in [("segment", attach.slots), ("batch arena", attach.places)] {
        let bytes = u64::from(n).saturating_mul(attach.slot_bytes);
        if bytes > config.max_segment_bytes {
            return bad(format!(
                "a {what} of {bytes} bytes exceeds same_host.max_segment_bytes = {}",
                config.max_segment_bytes
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_may_not_attach_unless_listed() {
        let mut c = SameHost::default();
        let peer = |uid, gid| shm::Peer { pid: 1, uid, gid };
        let me = (1000, 1000);
        assert!(may_attach(&c, me, &peer(1000, 5)));
        assert!(may_attach(&c, me, &peer(0, 0)));
        assert!(!may_attach(&c, me, &peer(1001, 1001)));
        c.allowed_uids = vec![1001];
        assert!(may_attach(&c, me, &peer(1001, 1001)));
        c.allowed_gids = vec![2000];
        assert!(may_attach(&c, me, &peer(1002, 2000)));
        assert!(!may_attach(&c, me, &peer(1002, 2001)));
    }

    #[test]
    fn attach_sizes_are_checked() {
        let c = SameHost::default();
        let a = |slots, slot_bytes| ShmAttach {
            job: 1,
            slots,
            slot_bytes,
            places: 0,
        };
        assert!(check_attach(&c, 64, &a(8, 100), 1, 100).is_ok());
        let e = |r: Result<(), Refusal>| r.unwrap_err().1;
        assert!(e(check_attach(&c, 64, &a(8, 99), 1, 100)).contains("samples have 100"));
        assert!(
            check_attach(&c, 64, &a(65, 100), 1, 100).is_ok(),
            "spare slots"
        );
        let over = 64 + MAX_SPARE_SLOTS + 1;
        assert!(e(check_attach(&c, 64, &a(over, 100), 1, 100)).contains("max_credits"));
        assert!(e(check_attach(&c, 64, &a(8, 100), 2, 100)).contains("open job is 2"));
        let huge = c.max_segment_bytes / 4 + 1;
        assert!(e(check_attach(&c, 64, &a(4, huge), 1, huge)).contains("max_segment_bytes"));
    }

    #[test]
    fn slots_are_written_only_when_granted() {
        let slots = Slots::new(Segment::create("sluice-test", 2, 4).unwrap(), None);
        let header = |key: &str| SampleHeader {
            job: 1,
            unit: 0,
            attempt: 0,
            shard: 0,
            index: 0,
            key: key.into(),
            label: None,
            tensor_bytes: 4,
            fields: vec![("txt".into(), 2)],
            geometry: Default::default(),
        };
        assert!(slots.place(header("a"), &[1, 2, 3, 4, 9, 9]).is_err());
        assert_eq!(slots.grant(&[1]), Ok(1));
        assert!(slots.grant(&[1]).unwrap_err().contains("twice"));
        assert!(slots.grant(&[2]).unwrap_err().contains("has 2"));
        let (m, fields) = slots.place(header("a"), &[1, 2, 3, 4, 9, 9]).unwrap();
        assert!(matches!(m, Message::ShmSample { slot: 1, .. }));
        assert_eq!(fields, [9, 9]);
        let mut got = [0u8; 4];
        slots.segment.read(1, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        assert!(slots.place(header("b"), &[0; 6]).is_err(), "no slot left");
        assert_eq!(
            slots.grant(&[1]),
            Ok(1),
            "filled slots may be granted again"
        );
    }

    #[test]
    fn a_placed_sample_goes_into_the_clients_batch_and_gives_its_slot_back() {
        let arena = Segment::create("sluice-test", 4, 4).unwrap();
        let view = Segment::open_arena(
            arena.fd().try_clone_to_owned().unwrap(),
            &ShmAttach {
                job: 1,
                slots: 2,
                slot_bytes: 4,
                places: 4,
            },
        )
        .unwrap();
        let slots = Slots::new(Segment::create("sluice-test", 2, 4).unwrap(), Some(view));
        let header = |unit, index| SampleHeader {
            job: 1,
            unit,
            attempt: 0,
            shard: 0,
            index,
            key: format!("{unit}/{index}"),
            label: None,
            tensor_bytes: 4,
            fields: vec![("txt".into(), 1)],
            geometry: Default::default(),
        };
        let place = |unit, index, place| Place {
            unit,
            attempt: 0,
            index,
            place,
        };
        slots.unit_started(7, 0);
        assert!(
            slots
                .add_places(&[place(7, 0, 4)])
                .unwrap_err()
                .contains("arena has 4"),
            "outside the arena"
        );
        // Unit 8 is not running here: its place is dropped, and its sample takes a slot.
        slots.add_places(&[place(7, 0, 3), place(8, 0, 2)]).unwrap();
        slots.grant(&[0, 1]).unwrap();
        let (m, fields) = slots.place(header(7, 0), &[1, 2, 3, 4, 9]).unwrap();
        assert!(
            matches!(
                m,
                Message::ShmPlaced {
                    slot: 0,
                    place: 3,
                    ..
                }
            ),
            "{m:?}"
        );
        assert_eq!(fields, [9]);
        let mut got = [0u8; 4];
        arena.read(3, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4], "written into the client's batch");
        let (m, _) = slots.place(header(8, 0), &[5, 6, 7, 8, 9]).unwrap();
        assert!(matches!(m, Message::ShmSample { slot: 1, .. }), "{m:?}");
        arena.read(2, &mut got).unwrap();
        assert_eq!(
            got, [0; 4],
            "a place for a unit not running here is never written"
        );
        // A place is used once; after its unit ends, none is kept.
        slots.grant(&[0]).unwrap();
        let (m, _) = slots.place(header(7, 0), &[0; 5]).unwrap();
        assert!(matches!(m, Message::ShmSample { .. }), "{m:?}");
        slots.unit_ended(7, 0);
        slots.add_places(&[place(7, 0, 1)]).unwrap();
        assert!(slots.places.lock().unwrap().running.is_empty());
        // The engine claims a place and resizes into it; the frame then names it.
        slots.unit_started(10, 0);
        slots.add_places(&[place(10, 0, 2)]).unwrap();
        assert!(slots.claim(10, 0, 0, 3).is_none(), "the wrong size");
        assert!(
            slots.claim(10, 0, 1, 4).is_none(),
            "no place for that sample"
        );
        {
            let mut claim = slots.claim(10, 0, 0, 4).expect("its place");
            assert_eq!(claim.place(), 2);
            claim.memory().copy_from_slice(&[4, 3, 2, 1]);
        }
        assert!(slots.claim(10, 0, 0, 4).is_none(), "claimed once");
        arena.read(2, &mut got).unwrap();
        assert_eq!(got, [4, 3, 2, 1]);
        slots.grant(&[1]).unwrap();
        let (m, fields) = slots.placed(header(10, 0), 2, vec![5]).unwrap();
        assert!(
            matches!(
                m,
                Message::ShmPlaced {
                    slot: 1,
                    place: 2,
                    ..
                }
            ),
            "{m:?}"
        );
        assert_eq!(fields, [5]);
        // Released: a place is never written again.
        slots.unit_started(9, 0);
        slots.add_places(&[place(9, 0, 0)]).unwrap();
        slots.release();
        slots.grant(&[1]).unwrap();
        assert!(slots.place(header(9, 0), &[7; 5]).is_err());
        arena.read(0, &mut got).unwrap();
        assert_eq!(got, [0; 4]);
        let no_arena = Slots::new(Segment::create("sluice-test", 1, 4).unwrap(), None);
        assert!(no_arena.add_places(&[place(7, 0, 0)]).is_err());
    }
}
