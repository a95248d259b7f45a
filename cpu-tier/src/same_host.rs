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
use std::sync::Arc;
use std::time::Duration;

use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::shm::{self, socket_path, Segment};
use sluice_wire::{ErrorCode, ErrorMessage, Message, ShmAttach};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::config::SameHost;
use crate::connection::{Connection, Ended, Outbound, SendError, State};
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
    #[error("same-host directory {dir}: {why}")]
    UnsafePlace { dir: String, why: String },
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
    let dir = &config.socket_dir;
    // Never make the directory under a folder others can write without the sticky bit:
    // they could replace it, and the socket with it.
    if let Some(existing) = dir.ancestors().find(|a| a.exists()) {
        if let shm::SocketDir::Unsafe { mode } = shm::socket_dir(existing).map_err(err)? {
            return Err(SameHostError::UnsafeDir {
                dir: existing.display().to_string(),
                mode,
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(err)?;
    check_dir(dir).map_err(err)??;
    check_place(dir)?;
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

/// Whether the directory is this worker's to serve from: no folder above it lets another
/// user replace it, and, in a folder every user can make folders in (`/tmp`), this worker's
/// user (or root) made it, not someone who got there first.
fn check_place(dir: &Path) -> Result<(), SameHostError> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_place = |why: String| SameHostError::UnsafePlace {
        dir: dir.display().to_string(),
        why,
    };
    let own = shm::current_user().0;
    let shared = shm::check_parents(dir, &[own]).map_err(unsafe_place)?;
    let owner = std::fs::metadata(dir)
        .map_err(|e| unsafe_place(e.to_string()))?
        .uid();
    match shared {
        Some(parent) if owner != own && owner != 0 => Err(unsafe_place(format!(
            "it is owned by uid {owner}, not this worker's user, and lies in {}, where every \
             user can make folders: someone else made it first; remove it, or use a directory \
             only root makes, such as /run/sluice",
            parent.display()
        ))),
        _ => Ok(()),
    }
}

/// Frames over the Unix socket, buffered: they are small (the fields only), and the session
/// flushes when no more are queued, so a burst of samples costs one write. The socket is
/// registered for reading only ([`sluice_wire::unix`]): the client's reads of these frames
/// do not wake this worker's reactor.
struct UnixOut(FrameWriter<tokio::io::BufWriter<sluice_wire::unix::WriteHalf>>);

impl Outbound for UnixOut {
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError> {
        Ok(self.0.send(message, &[&payload]).await?)
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        Ok(self.0.flush().await?)
    }

    fn flush_delay(&self) -> std::time::Duration {
        SAME_HOST_FLUSH_DELAY
    }
}

/// How long a sample's frame waits for the next ones over the Unix socket: longer than over
/// QUIC ([`crate::connection`]'s 1 ms), because these frames carry no tensor (it is in the
/// client's memory already) and each write is a wake-up of the client. Beside a separate
/// `sluice cpu --threads 2` at about 2,000 samples/s, loadgen after its first epoch went
/// from 0.44 to 0.25 context switches and from 14.3–14.4 to 11.6–12.9 µs of CPU a sample,
/// its rate unchanged (8 ms: 0.20 switches, within noise in CPU). A batch's last sample
/// waits at most this long more; the credit window (far more than 4 ms of samples) keeps
/// the worker going meanwhile.
const SAME_HOST_FLUSH_DELAY: std::time::Duration = std::time::Duration::from_millis(4);

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
    // Between frames: the reader has buffered nothing.
    let (rd, wr) = match sluice_wire::unix::split_halves(reader.into_inner(), writer.into_inner()) {
        Ok(halves) => halves,
        Err(e) => {
            warn!(client = %client, "same-host client: its socket: {e}");
            return;
        }
    };
    let reader = FrameReader::new(rd, state.limits);
    info!(client = %client, pid = peer.pid, uid = peer.uid, "same-host client connected");
    metrics::gauge!("sluice_cpu_connections").increment(1.0);
    let mut out = UnixOut(FrameWriter::new(
        tokio::io::BufWriter::new(wr),
        state.limits,
    ));
    let end = connection.run(reader, &mut out).await;
    drop(connection);
    // A client that has exited takes its segments with it now, not after `KEEP_IDLE`.
    (state.mappings).sweep(std::time::Instant::now(), crate::mappings::KEEP_IDLE);
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

/// The handshake up to `ShmAttached`: each frame goes to the worker's session, which checks
/// its order and what it asks; this carries out what the session says (frames to send, the
/// segments to receive and map). Why the client was refused, if it was.
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
    let refused = |end: End| match end {
        End::Error(code, why) => (code, why),
        End::Drained => (ErrorCode::Unavailable, "worker is draining".into()),
    };
    while connection.handshaking() {
        let m = reader.next().await.map_err(|e| bad(e.to_string()))?;
        let m = m.ok_or_else(|| bad("closed during the handshake".into()))?;
        let mut send = connection.handshake(Some(m)).map_err(refused)?;
        if let Some(attach) = connection.take_attach() {
            let segments = map(state, peer, reader, &attach).await;
            send.extend(connection.attached(attach.job, segments).map_err(refused)?);
        }
        for m in send {
            let sent = writer.send(&m, &[]).await;
            sent.map_err(|e| (ErrorCode::Internal, e.to_string()))?;
        }
    }
    Ok(())
}

/// The client's segments for `attach` (its slots, then its batch arena if it has places):
/// their descriptors received over the socket, checked and mapped.
async fn map(
    state: &State,
    peer: &shm::Peer,
    reader: &FrameReader<tokio::net::unix::OwnedReadHalf>,
    attach: &ShmAttach,
) -> Result<(Arc<Segment>, Option<Arc<Segment>>), String> {
    let socket = reader.get_ref().as_ref();
    let fd = shm::recv_fd(socket).await.map_err(|e| e.to_string())?;
    let layout = (attach.slots, attach.slot_bytes);
    let segment = (state.mappings)
        .open(fd, layout, peer.pid, |fd| Segment::open(fd, attach))
        .map_err(|e| e.to_string())?;
    if attach.places == 0 {
        return Ok((segment, None));
    }
    let fd = shm::recv_fd(socket).await.map_err(|e| e.to_string())?;
    let layout = (attach.places, attach.slot_bytes);
    let arena = (state.mappings)
        .open(fd, layout, peer.pid, |fd| Segment::open_arena(fd, attach))
        .map_err(|e| e.to_string())?;
    Ok((segment, Some(arena)))
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
}
