//! The same-host transport, client side: which workers it applies to, and the slots of the
//! shared-memory segment a connection's samples are written into.
//!
//! A slot is in one of three hands: free (the client's, empty), granted (the worker's, to
//! write one tensor into), or filled (the client's again: a `ShmSample` named it, and a
//! [`SlotRef`] holds it until the tensor is copied into its batch). Dropping the `SlotRef`
//! frees the slot, and the link grants free slots as the coordinator returns credits.
//!
//! A sample that arrived before its turn is copied out into one of the loader's reused
//! buffers and its slot freed, so a waiting sample never holds a credit's slot. (Keeping it
//! in a spare slot instead saved that copy within one epoch but cost more over several: a
//! segment is made per connection, so its pages are new every epoch, while the loader's
//! buffers are kept across epochs; measured with `sluice bench chain`.)

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_wire::shm::{Segment, ShmError};
use sluice_wire::BufferPool;
use tokio::sync::Notify;

use crate::buffers::TensorBuf;

/// Whether a worker on this machine is reached through shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SameHost {
    /// Shared memory for a worker on this machine whose socket is found, QUIC otherwise
    /// (and when the socket refuses this process).
    #[default]
    Auto,
    /// QUIC always.
    Off,
    /// Shared memory for every worker: one that is not on this machine, or that refuses,
    /// is an error.
    Require,
}

/// Where workers put their same-host sockets unless told otherwise: `$SLUICE_SAME_HOST_DIR`,
/// else `/run/sluice` (the systemd unit's runtime directory).
pub fn default_socket_dir() -> PathBuf {
    std::env::var_os("SLUICE_SAME_HOST_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/run/sluice"), PathBuf::from)
}

/// The socket of the worker at `addr`, when that worker runs on this machine and serves one;
/// else why not, in words for a log line.
pub(crate) fn socket_for(dir: &Path, addr: SocketAddr) -> Result<PathBuf, String> {
    if !is_local(addr.ip()) {
        return Err("it runs on another machine".into());
    }
    let path = sluice_wire::shm::socket_path(dir, addr.port());
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "it runs on this machine but serves no socket at {} (start it with \
             --same-host-dir DIR and give the client the same DIR: same_host_dir= in Python, \
             --same-host-dir on loadgen, or SLUICE_SAME_HOST_DIR)",
            path.display()
        ))
    }
}

/// An address of this machine: loopback, or one a socket can be bound to here.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

struct PoolState {
    free: Vec<u32>,
    /// Whether each slot is granted to the worker.
    granted: Vec<bool>,
    /// Credits the coordinator returned that no free slot has carried yet.
    owed: u32,
}

/// A connection's segment and who holds which slot.
pub(crate) struct SlotPool {
    segment: Segment,
    state: Mutex<PoolState>,
    released: Notify,
    /// Where a sample that must wait for its turn is copied to, freeing its slot.
    buffers: Arc<BufferPool>,
}

impl SlotPool {
    pub(crate) fn create(
        slots: u32,
        slot_bytes: u64,
        buffers: Arc<BufferPool>,
    ) -> Result<Self, ShmError> {
        let segment = Segment::create("sluice-slots", slots, slot_bytes)?;
        Ok(SlotPool {
            segment,
            buffers,
            state: Mutex::new(PoolState {
                free: (0..slots).rev().collect(),
                granted: vec![false; slots as usize],
                owed: 0,
            }),
            released: Notify::new(),
        })
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Adds `credits` to what is owed and grants as many free slots as it can, once at
    /// least `at_least` (or all that is owed) can go in one frame: the slots to send, or
    /// `None` for now.
    pub(crate) fn grant(&self, credits: u32, at_least: u32) -> Option<Vec<u32>> {
        let mut s = self.state.lock().ok()?;
        s.owed = s.owed.saturating_add(credits);
        let n = (s.owed as usize).min(s.free.len());
        if n == 0 || n < (at_least.min(s.owed)) as usize {
            return None;
        }
        let at = s.free.len() - n;
        let slots: Vec<u32> = s.free.split_off(at);
        for &slot in &slots {
            s.granted[slot as usize] = true;
        }
        s.owed -= n as u32;
        Some(slots)
    }

    /// The worker says `slot` holds a sample: it becomes the client's until the returned
    /// reference is dropped. A slot that was not granted is a protocol error.
    pub(crate) fn filled(self: &Arc<Self>, slot: u32) -> Result<SlotRef, String> {
        let mut s = self.state.lock().map_err(|_| "slot state poisoned")?;
        match s.granted.get_mut(slot as usize) {
            Some(g @ true) => *g = false,
            Some(false) => return Err(format!("sample in slot {slot}, which was not granted")),
            None => {
                return Err(format!(
                    "sample in slot {slot}; the segment has {}",
                    self.segment.slots()
                ))
            }
        }
        Ok(SlotRef {
            pool: self.clone(),
            slot,
        })
    }

    /// Grants slots freed by the consumer once an eighth of the segment (or all that is owed)
    /// can go in one frame, rather than a frame per slot.
    pub(crate) fn regrant(&self) -> Option<Vec<u32>> {
        self.grant(0, (self.segment.slots() / 8).max(1))
    }

    /// Waits until a slot is freed.
    pub(crate) async fn released(&self) {
        self.released.notified().await;
    }

    fn free(&self, slot: u32) {
        if let Ok(mut s) = self.state.lock() {
            s.free.push(slot);
        }
        self.released.notify_one();
    }
}

/// A filled slot, the client's until dropped.
pub(crate) struct SlotRef {
    pool: Arc<SlotPool>,
    slot: u32,
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        self.pool.free(self.slot);
    }
}

/// Where a sample's tensor is.
pub(crate) enum Payload {
    /// Handed over in process: the tensor, then the fields.
    Bytes(TensorBuf),
    /// Read off a QUIC stream: the tensor as the stream's own chunks (its decrypted packets,
    /// not copied again before the batch).
    Chunks(Vec<bytes::Bytes>),
    /// In a same-host slot.
    Slot(SlotRef),
}

impl Payload {
    /// The payload of a sample that must wait for its turn: its tensor (`tensor_bytes` of
    /// it) alone, a same-host one copied out into a reused buffer and its slot freed (a
    /// waiting sample may not hold a credit's slot).
    pub(crate) fn detach(self, tensor_bytes: usize) -> Payload {
        match self {
            Payload::Bytes(mut b) => {
                b.truncate(tensor_bytes);
                Payload::Bytes(b)
            }
            // The chunks hold the tensor alone, in their own buffers.
            Payload::Chunks(c) => Payload::Chunks(c),
            Payload::Slot(ref s) => {
                let mut b = crate::buffers::take(&s.pool.buffers, tensor_bytes);
                self.copy_tensor(&mut b);
                Payload::Bytes(b)
            }
        }
    }

    /// Copies the sample's tensor (`dst.len()` bytes) into `dst`.
    pub(crate) fn copy_tensor(&self, dst: &mut [u8]) {
        match self {
            Payload::Bytes(b) => dst.copy_from_slice(&b[..dst.len()]),
            Payload::Chunks(chunks) => {
                let mut at = 0;
                for c in chunks {
                    let n = c.len().min(dst.len() - at);
                    dst[at..at + n].copy_from_slice(&c[..n]);
                    at += n;
                }
            }
            Payload::Slot(s) => {
                // Bounded by the slot size, which the link checked against the shape.
                if let Err(e) = s.pool.segment.read(s.slot, dst) {
                    tracing::error!("same-host slot {}: {e}", s.slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_move_between_client_and_worker() {
        let pool = Arc::new(SlotPool::create(3, 8, Arc::new(BufferPool::new(4))).unwrap());
        let mut granted = pool.grant(2, 1).unwrap();
        assert_eq!(granted.len(), 2);
        assert!(
            pool.grant(5, 2).is_none(),
            "one slot free, two wanted in a frame"
        );
        assert_eq!(pool.grant(0, 1).unwrap().len(), 1, "only one slot left");
        assert!(
            pool.grant(0, 1).is_none(),
            "four credits owed, no free slot"
        );
        granted.sort();
        let a = pool.filled(granted[0]).unwrap();
        assert!(pool.filled(granted[0]).is_err(), "filled twice");
        assert!(pool.filled(9).is_err(), "outside the segment");
        let mut dst = [1u8; 8];
        Payload::Slot(a).copy_tensor(&mut dst);
        assert_eq!(dst, [0; 8]);
        // Dropping the payload freed its slot: it carries one owed credit.
        assert_eq!(pool.grant(0, 1), Some(vec![granted[0]]));
    }

    #[test]
    fn a_waiting_sample_is_copied_out_and_frees_its_slot() {
        let buffers = Arc::new(BufferPool::new(4));
        let pool = Arc::new(SlotPool::create(1, 4, buffers.clone()).unwrap());
        let slot = pool.grant(1, 1).unwrap()[0];
        pool.segment.write(slot, &[1, 2, 3, 4]).unwrap();
        let waiting = Payload::Slot(pool.filled(slot).unwrap()).detach(4);
        let Payload::Bytes(b) = &waiting else {
            panic!("still in its slot")
        };
        assert_eq!(&b[..], [1, 2, 3, 4]);
        assert_eq!(pool.grant(1, 1), Some(vec![slot]), "the slot is free again");
        drop(waiting);
        assert_eq!(
            buffers.spares(4),
            1,
            "the copy's buffer goes back to the loader"
        );
    }

    #[test]
    fn a_tensor_in_a_streams_chunks_is_copied_whole_and_waits_as_it_is() {
        let chunks = vec![
            bytes::Bytes::from_static(&[1, 2, 3]),
            bytes::Bytes::from_static(&[4]),
            bytes::Bytes::from_static(&[5, 6]),
        ];
        let waiting = Payload::Chunks(chunks).detach(6);
        assert!(
            matches!(&waiting, Payload::Chunks(c) if c.len() == 3),
            "not copied"
        );
        let mut dst = [0u8; 6];
        waiting.copy_tensor(&mut dst);
        assert_eq!(dst, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn slots_follow_the_credit_window() {
        use crate::coordinator::credit_window;
        assert_eq!(credit_window(128, 64 << 20, 150_528), 128);
        assert_eq!(credit_window(128, 1 << 20, 150_528), 6);
        assert_eq!(credit_window(128, 10, 150_528), 1);
    }

    #[test]
    fn only_local_addresses_with_a_socket_are_same_host() {
        let dir = std::env::temp_dir().join(format!("sluice-sh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addr: SocketAddr = "127.0.0.1:7345".parse().unwrap();
        let why = socket_for(&dir, addr).unwrap_err();
        assert!(
            why.contains("cpu-7345.sock") && why.contains("same_host_dir="),
            "no socket file: {why}"
        );
        std::fs::write(dir.join("cpu-7345.sock"), b"").unwrap();
        assert_eq!(socket_for(&dir, addr), Ok(dir.join("cpu-7345.sock")));
        let remote: SocketAddr = "192.0.2.1:7345".parse().unwrap();
        assert_eq!(
            socket_for(&dir, remote),
            Err("it runs on another machine".into()),
            "TEST-NET is not this machine"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
