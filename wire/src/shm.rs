//! The same-host transport's primitives, shared by the client and the worker: a segment of
//! sample slots in sealed anonymous shared memory (memfd), passing its descriptor over a Unix
//! socket (SCM_RIGHTS), and the socket peer's credentials.
//!
//! The client creates the segment and is the only process that can hand it out: a memfd has
//! no name in any file system, so only a process given the descriptor maps it, and it
//! disappears when the last descriptor and mapping are gone (a killed client leaves nothing
//! behind). The size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before the
//! descriptor leaves the client, and the worker refuses a segment without those seals: a
//! client that could shrink the file under the worker's mapping would crash it with SIGBUS.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::message::ShmAttach;

/// The same-host socket of the worker whose QUIC endpoint is on `port`: clients find it from
/// the worker's address alone.
pub fn socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("cpu-{port}.sock"))
}

/// The seals a segment must carry before a worker maps it.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("a segment of {slots} slots of {slot_bytes} bytes is {detail}")]
    Size {
        slots: u32,
        slot_bytes: u64,
        detail: String,
    },
    #[error("the segment is not sealed against resizing (seals {0:?}); refusing to map it")]
    Unsealed(SealFlags),
    #[error("slot {slot} is outside the segment's {slots} slots")]
    Slot { slot: u32, slots: u32 },
    #[error("{len} bytes do not fit a slot of {slot_bytes}")]
    Length { len: usize, slot_bytes: u64 },
    #[error("no descriptor came with the segment's attach frame")]
    NoDescriptor,
    #[error("the peer closed the socket before sending the segment")]
    Closed,
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Os {
        what,
        source: e.into(),
    }
}

/// A mapped segment of `slots` sample slots of `slot_bytes` bytes each.
///
/// Both processes map it; the protocol decides who may touch which slot when (a slot the
/// client granted is the worker's until its `ShmSample` frame arrives, then the client's
/// until it grants it again), so the segment offers only raw copies in and out, never a
/// reference that could outlive that turn.
pub struct Segment {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    slots: u32,
    slot_bytes: u64,
}

// The mapping is plain shared memory; every access is a bounded raw copy.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a sealed segment (the client's side).
    pub fn create(name: &str, slots: u32, slot_bytes: u64) -> Result<Segment, ShmError> {
        let len = segment_len(slots, slot_bytes)?;
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        // Owner only: a memfd is made 0777, and only /proc's ptrace check would stand
        // between another user and its pages.
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))
            .map_err(os("making the segment owner-only"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("sizing the segment"))?;
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS | SealFlags::SEAL)
            .map_err(os("sealing the segment"))?;
        Self::map(fd, len, slots, slot_bytes)
    }

    /// Maps a segment received from a client (the worker's side), after checking that it is
    /// sealed and exactly as large as `attach` says.
    pub fn open(fd: OwnedFd, attach: &ShmAttach) -> Result<Segment, ShmError> {
        Self::open_sized(fd, attach.slots, attach.slot_bytes)
    }

    /// Maps a client's batch arena, the segment that follows the slots' when
    /// `attach.places` is above 0: `places` tensors of `slot_bytes`, checked as [`Segment::open`].
    pub fn open_arena(fd: OwnedFd, attach: &ShmAttach) -> Result<Segment, ShmError> {
        Self::open_sized(fd, attach.places, attach.slot_bytes)
    }

    fn open_sized(fd: OwnedFd, slots: u32, slot_bytes: u64) -> Result<Segment, ShmError> {
        let len = segment_len(slots, slot_bytes)?;
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(os("reading the segment's seals"))?;
        if !seals.contains(REQUIRED_SEALS) {
            return Err(ShmError::Unsealed(seals));
        }
        let stat = rustix::fs::fstat(&fd).map_err(os("fstat of the segment"))?;
        if stat.st_size as u64 != len as u64 {
            return Err(ShmError::Size {
                slots,
                slot_bytes,
                detail: format!("{len} bytes, but the descriptor has {}", stat.st_size),
            });
        }
        Self::map(fd, len, slots, slot_bytes)
    }

    fn map(fd: OwnedFd, len: usize, slots: u32, slot_bytes: u64) -> Result<Segment, ShmError> {
        // SAFETY: a fresh shared mapping of a sealed file of exactly `len` bytes; it is
        // unmapped once, in Drop.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap of the segment"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(ShmError::Os {
            what: "mmap of the segment",
            source: std::io::Error::other("null mapping"),
        })?;
        Ok(Segment {
            fd,
            ptr,
            len,
            slots,
            slot_bytes,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// What announces this segment to a worker; `arena`, the batch arena sent after it.
    pub fn attach(&self, job: u64, arena: Option<&Segment>) -> ShmAttach {
        ShmAttach {
            job,
            slots: self.slots,
            slot_bytes: self.slot_bytes,
            places: arena.map_or(0, |a| a.slots),
        }
    }

    /// The address of `slot` (for a view of several slots, such as a batch in an arena,
    /// whose accesses the protocol orders).
    pub fn slot_raw(&self, slot: u32) -> Result<*mut u8, ShmError> {
        self.slot_ptr(slot, 0)
    }

    fn slot_ptr(&self, slot: u32, len: usize) -> Result<*mut u8, ShmError> {
        if slot >= self.slots {
            return Err(ShmError::Slot {
                slot,
                slots: self.slots,
            });
        }
        if len as u64 > self.slot_bytes {
            return Err(ShmError::Length {
                len,
                slot_bytes: self.slot_bytes,
            });
        }
        let at = slot as usize * self.slot_bytes as usize;
        debug_assert!(at + len <= self.len);
        // SAFETY: in bounds, checked above.
        Ok(unsafe { self.ptr.as_ptr().add(at) })
    }

    /// Copies `bytes` into the start of `slot`.
    pub fn write(&self, slot: u32, bytes: &[u8]) -> Result<(), ShmError> {
        let dst = self.slot_ptr(slot, bytes.len())?;
        // SAFETY: `dst..dst+len` lies in the mapping; `bytes` is process memory, so the two
        // cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Copies the start of `slot` into `dst`, a batch ([`crate::copy::copy_tensor_raw`]).
    pub fn read(&self, slot: u32, dst: &mut [u8]) -> Result<(), ShmError> {
        let src = self.slot_ptr(slot, dst.len())?;
        // SAFETY: as in `write`.
        unsafe { crate::copy::copy_tensor_raw(dst.as_mut_ptr(), src, dst.len()) };
        Ok(())
    }

    /// Gives `slot` its pages now, from the calling process, so the memory is charged to the
    /// process that made the segment (the client, whose samples wait in it) rather than to
    /// the first to write it (the worker). Call it only for a slot this process holds; it
    /// does not change the slot's bytes.
    pub fn populate(&self, slot: u32) -> Result<(), ShmError> {
        let len = self.slot_bytes as usize;
        let start = self.slot_ptr(slot, len)?;
        let page = rustix::param::page_size();
        // Whole pages inside the slot: MADV_POPULATE_WRITE faults them in writable without
        // touching their contents (Linux 5.14).
        let first = (start as usize).next_multiple_of(page);
        let end = (start as usize + len) / page * page;
        // The slot's pages made in the file first: shmem allocates them in one pass, and
        // the mapping then only maps them (2.0-2.2 µs a page in all against 2.4-2.6 for the
        // mapping's faults alone, a memfd on these VMs). Only an optimization: without it
        // (an error), the advice below makes them.
        let offset = u64::from(slot) * self.slot_bytes;
        let _ = rustix::fs::fallocate(
            &self.fd,
            rustix::fs::FallocateFlags::empty(),
            offset,
            self.slot_bytes,
        );
        if end > first {
            // SAFETY: the range lies inside the mapping; the advice changes no bytes.
            let advised = unsafe {
                rustix::mm::madvise(
                    first as *mut std::ffi::c_void,
                    end - first,
                    rustix::mm::Advice::LinuxPopulateWrite,
                )
            };
            if advised.is_ok() {
                return Ok(());
            }
        }
        // Older kernels: write a byte of each page, only bytes of this slot (its neighbours'
        // may be another process's to write).
        let mut at = 0;
        while at < len {
            // SAFETY: in the slot, which the caller holds.
            unsafe { std::ptr::write_volatile(start.add(at), 0) };
            at = (start as usize + at + 1).next_multiple_of(page) - start as usize;
        }
        Ok(())
    }

    /// The mapping's address and length (for registering it with a driver).
    pub fn as_raw(&self) -> (*mut u8, usize) {
        (self.ptr.as_ptr(), self.len)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this address and length, unmapped only here.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("slots", &self.slots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

fn segment_len(slots: u32, slot_bytes: u64) -> Result<usize, ShmError> {
    let size = |detail: &str| ShmError::Size {
        slots,
        slot_bytes,
        detail: detail.to_string(),
    };
    if slots == 0 || slot_bytes == 0 {
        return Err(size("empty"));
    }
    u64::from(slots)
        .checked_mul(slot_bytes)
        .filter(|n| *n <= isize::MAX as u64)
        .map(|n| n as usize)
        .ok_or_else(|| size("too large to map"))
}

/// Sends `fd` over the socket with one byte of data (the descriptor travels as ancillary
/// data; the byte carries it).
pub async fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<(), ShmError> {
    loop {
        stream.writable().await.map_err(|source| ShmError::Os {
            what: "waiting to send the segment",
            source,
        })?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            let fds = [fd];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            rustix::net::sendmsg(
                stream,
                &[IoSlice::new(&[0xfd])],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(ShmError::Closed),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(source) => {
                return Err(ShmError::Os {
                    what: "sending the segment",
                    source,
                })
            }
        }
    }
}

/// Receives the descriptor [`send_fd`] sent (with its one byte).
pub async fn recv_fd(stream: &UnixStream) -> Result<OwnedFd, ShmError> {
    loop {
        stream.readable().await.map_err(|source| ShmError::Os {
            what: "waiting for the segment",
            source,
        })?;
        let got = stream.try_io(Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                stream,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            )
            .map_err(std::io::Error::from)?;
            let mut fd = None;
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = message {
                    // Any descriptor beyond the first is closed as the iterator drops it.
                    for received in fds {
                        fd.get_or_insert(received);
                    }
                }
            }
            Ok((msg.bytes, fd))
        });
        match got {
            Ok((0, _)) => return Err(ShmError::Closed),
            Ok((_, Some(fd))) => return Ok(fd),
            Ok((_, None)) => return Err(ShmError::NoDescriptor),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(source) => {
                return Err(ShmError::Os {
                    what: "receiving the segment",
                    source,
                })
            }
        }
    }
}

/// Who is at the other end of a Unix socket, as the kernel saw it connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer(stream: &UnixStream) -> Result<Peer, ShmError> {
    let c = rustix::net::sockopt::socket_peercred(stream).map_err(os("SO_PEERCRED"))?;
    Ok(Peer {
        pid: c.pid.as_raw_nonzero().get(),
        uid: c.uid.as_raw(),
        gid: c.gid.as_raw(),
    })
}

/// A process watched through a pidfd: whether it has exited, asked without waiting.
///
/// A segment a worker mapped may be written by that worker for as long as its process
/// lives, whatever became of its connection; once the process has exited, nothing can write
/// it but the client. The pidfd is opened from the socket's peer pid right after connecting,
/// so it names that process or, if it had already died and its pid was taken again, a
/// process that outlives it: either way "exited" is never said early.
#[derive(Debug)]
pub struct ProcessWatch {
    pidfd: OwnedFd,
}

impl ProcessWatch {
    /// Watches process `pid` (as this process's pid namespace numbers it).
    pub fn of_pid(pid: i32) -> Result<ProcessWatch, ShmError> {
        let pid = rustix::process::Pid::from_raw(pid).ok_or(ShmError::Os {
            what: "pidfd_open",
            source: std::io::Error::other(format!("pid {pid} names no process")),
        })?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(os("pidfd_open"))?;
        Ok(ProcessWatch { pidfd })
    }

    /// Watches the process at the other end of a connected Unix socket.
    pub fn of_peer(stream: &UnixStream) -> Result<ProcessWatch, ShmError> {
        Self::of_pid(peer(stream)?.pid)
    }

    /// Whether the process has exited (a pidfd polls readable from then on).
    pub fn exited(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
    }
}

/// Who could put a socket in a same-host directory: what the worker checks before it binds
/// there and the client before it trusts what it finds there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketDir {
    /// Only its owner (and root) can write it: nobody else could have put a socket there.
    Private { owner: u32 },
    /// Others can make files in it, but it is sticky: none can replace another's.
    Sticky { mode: u32 },
    /// Others can write it and it is not sticky: anyone could replace a socket there.
    Unsafe { mode: u32 },
}

/// What [`SocketDir`] `dir` is (its permission bits and owner, following links).
pub fn socket_dir(dir: &Path) -> std::io::Result<SocketDir> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.mode() & 0o7777;
    Ok(match (mode & 0o022 != 0, mode & 0o1000 != 0) {
        (false, _) => SocketDir::Private { owner: meta.uid() },
        (true, true) => SocketDir::Sticky { mode },
        (true, false) => SocketDir::Unsafe { mode },
    })
}

/// Checks the folders above the socket directory `dir` (its real path): each must be owned by
/// root or one of `trusted`, and not writable by other users unless sticky, or whoever could
/// write it could replace `dir` and every socket in it. Returns `dir`'s parent when other
/// users can make folders in it (sticky and writable by others, like `/tmp`): then whoever
/// made `dir` first owns it, and its owner vouches for nothing. Else why not, in words.
pub fn check_parents(dir: &Path, trusted: &[u32]) -> Result<Option<PathBuf>, String> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut shared = None;
    for (i, folder) in real.ancestors().skip(1).enumerate() {
        let meta = std::fs::metadata(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        let mode = meta.mode() & 0o7777;
        let writable = mode & 0o022 != 0;
        if writable && mode & 0o1000 == 0 {
            return Err(format!(
                "{} above it is writable by other users (mode {mode:o}) and not sticky: \
                 anyone could replace what lies below it",
                folder.display()
            ));
        }
        if meta.uid() != 0 && !trusted.contains(&meta.uid()) {
            return Err(format!(
                "{} above it is owned by uid {}, who could replace what lies below it",
                folder.display(),
                meta.uid()
            ));
        }
        if i == 0 && writable {
            shared = Some(folder.to_path_buf());
        }
    }
    Ok(shared)
}

/// This process's effective user and group.
pub fn current_user() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_segment_crosses_a_socket_and_both_sides_see_the_same_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let seg = Segment::create("sluice-test", 4, 16).unwrap();
        send_fd(&a, seg.fd()).await.unwrap();
        let fd = recv_fd(&b).await.unwrap();
        let theirs = Segment::open(fd, &seg.attach(1, None)).unwrap();
        theirs.write(2, &[7; 16]).unwrap();
        let mut got = [0u8; 16];
        seg.read(2, &mut got).unwrap();
        assert_eq!(got, [7; 16]);
        assert!(matches!(
            theirs.write(4, &[0]),
            Err(ShmError::Slot { slot: 4, .. })
        ));
        assert!(matches!(
            theirs.write(0, &[0; 17]),
            Err(ShmError::Length { .. })
        ));
        let me = peer(&b).unwrap();
        assert_eq!((me.uid, me.gid), current_user());
        assert_eq!(me.pid as u32, std::process::id());
    }

    #[tokio::test]
    async fn a_wrong_size_or_an_unsealed_segment_is_refused() {
        let seg = Segment::create("sluice-test", 4, 16).unwrap();
        let dup = seg.fd().try_clone_to_owned().unwrap();
        let lie = ShmAttach {
            job: 1,
            slots: 8,
            slot_bytes: 16,
            places: 0,
        };
        let e = Segment::open(dup, &lie).unwrap_err();
        assert!(e.to_string().contains("the descriptor has 64"), "{e}");

        let plain = rustix::fs::memfd_create("sluice-test", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 64).unwrap();
        let e = Segment::open(plain, &seg.attach(1, None)).unwrap_err();
        assert!(matches!(e, ShmError::Unsealed(_)), "{e}");
        assert!(Segment::create("sluice-test", 0, 16).is_err());
        assert!(Segment::create("sluice-test", u32::MAX, u64::MAX / 2).is_err());
    }

    #[test]
    fn populating_a_slot_gives_it_pages_and_changes_no_byte() {
        let page = rustix::param::page_size() as u64;
        // Slots that do not start or end on a page boundary.
        let slot_bytes = 3 * page + 100;
        let seg = Segment::create("sluice-test", 3, slot_bytes).unwrap();
        let blocks = |s: &Segment| rustix::fs::fstat(s.fd()).unwrap().st_blocks as u64 * 512;
        assert_eq!(blocks(&seg), 0, "a fresh segment has no pages yet");
        seg.write(0, &vec![1; slot_bytes as usize]).unwrap();
        seg.write(2, &vec![3; slot_bytes as usize]).unwrap();
        let before = blocks(&seg);
        seg.populate(1).unwrap();
        assert!(
            blocks(&seg) >= before + 2 * page,
            "slot 1's own pages exist now"
        );
        for (slot, byte) in [(0, 1u8), (1, 0), (2, 3)] {
            let mut got = vec![9u8; slot_bytes as usize];
            seg.read(slot, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == byte), "slot {slot} changed");
        }
        assert!(seg.populate(3).is_err(), "outside the segment");
    }

    #[test]
    fn a_watched_process_is_seen_to_exit_and_not_before() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watch = ProcessWatch::of_pid(child.id() as i32).unwrap();
        assert!(!watch.exited(), "it sleeps");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(watch.exited());
        let me = ProcessWatch::of_pid(std::process::id() as i32).unwrap();
        assert!(!me.exited());
        assert!(ProcessWatch::of_pid(0).is_err());
    }

    #[tokio::test]
    async fn no_descriptor_or_a_closed_peer_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        a.try_write(&[1]).unwrap();
        assert!(matches!(recv_fd(&b).await, Err(ShmError::NoDescriptor)));
        drop(a);
        assert!(matches!(recv_fd(&b).await, Err(ShmError::Closed)));
    }
}
