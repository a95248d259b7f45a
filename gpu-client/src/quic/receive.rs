//! Datagrams received straight into the buffers quinn-proto keeps them in.
//!
//! `recvmmsg` (with GRO, where the kernel coalesces a sender's segments) writes into slot
//! buffers this module owns; each datagram (or coalesced run of them) is split off its slot as
//! a `BytesMut` and handed to quinn-proto as it is. quinn-proto decrypts a packet in place and
//! a stream's chunks are slices of it, so the only copy left on the client is the
//! coordinator's, into the batch. A slot is received into again once quinn-proto and the
//! loader have dropped the last piece of its packets ([`BytesMut::try_reclaim`]): its pages
//! stay mapped instead of being faulted in for every packet. Each slot comes back on its own,
//! so a sample that waits for its batch holds only the slots its packets are in.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::BytesMut;
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};

/// The most bytes a coalesced run of datagrams takes: the kernel stops coalescing at 64 KiB.
const GRO_SLOT: usize = 64 << 10;

/// Slots kept for reuse, in use or free: 512 MiB of coalescing slots. The loader holds a
/// sample's packets until its turn in the plan comes (hundreds of MiB, a unit ahead, is
/// common), so the slots kept grow to what it held at its peak; past this bound a slot
/// handed out is forgotten, its memory freed with its last packet.
const KEPT_SLOTS: usize = 8192;

/// Whether the warning that a run may have been cut short was given (once a process).
static TRUNCATION_SAID: AtomicBool = AtomicBool::new(false);

/// Where received datagrams land.
pub(super) struct Receiver {
    /// Bytes a slot holds: a datagram, or with GRO a coalesced run of them.
    slot: usize,
    /// Slots ready to receive into (length 0, capacity `slot`).
    free: Vec<BytesMut>,
    /// What is left of slots handed out (length 0): each can be received into again once
    /// the packets split off it are gone.
    out: VecDeque<BytesMut>,
    /// The slots of the last receive, in order, and their datagrams' metadata.
    batch: Vec<BytesMut>,
    metas: [RecvMeta; BATCH_SIZE],
    /// Datagrams of the last receive, and how many were taken.
    received: usize,
    taken: usize,
    /// Slots allocated so far.
    allocated: usize,
}

impl Receiver {
    /// A receiver for a socket whose kernel coalesces up to `gro_segments` datagrams of at
    /// most `max_datagram` bytes.
    pub fn new(gro_segments: usize, max_datagram: usize) -> Self {
        let slot = match gro_segments {
            0 | 1 => max_datagram,
            n => (max_datagram * n).min(GRO_SLOT),
        };
        Receiver {
            slot,
            free: Vec::new(),
            out: VecDeque::new(),
            batch: Vec::with_capacity(BATCH_SIZE),
            metas: [RecvMeta::default(); BATCH_SIZE],
            received: 0,
            taken: 0,
            allocated: 0,
        }
    }

    /// Receives what the socket has, up to a batch: how many datagrams (or coalesced runs)
    /// [`Receiver::next`] then hands out. `WouldBlock` when it has nothing.
    pub fn recv(&mut self, udp: &UdpSocketState, socket: &impl AsFd) -> io::Result<usize> {
        // What the last receive left untaken is dropped, and its unused slots are free.
        while self.next().is_some() {}
        self.file_taken();
        self.free.append(&mut self.batch);
        self.received = 0;
        let mut looks = 0;
        while self.batch.len() < BATCH_SIZE {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => self.reclaimed(&mut looks).unwrap_or_else(|| {
                    self.allocated += 1;
                    metrics::gauge!("sluice_client_quic_receive_bytes").increment(self.slot as f64);
                    let mut s = BytesMut::zeroed(self.slot);
                    s.clear();
                    s
                }),
            };
            self.batch.push(slot);
        }
        let mut iovs: [IoSliceMut<'_>; BATCH_SIZE] = {
            let mut slots = self.batch.iter_mut();
            std::array::from_fn(|_| match slots.next() {
                Some(s) => {
                    let spare = s.spare_capacity_mut();
                    // SAFETY: a slot's capacity past its length (0) is `slot` bytes, all
                    // initialized: zeroed when the slot was allocated, and a slot is only ever
                    // reused as the same allocation (`try_reclaim` from a length of 0 copies
                    // nothing). The kernel writes into them, and only what it says it wrote
                    // is read.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len())
                    };
                    IoSliceMut::new(bytes)
                }
                None => IoSliceMut::new(&mut []),
            })
        };
        let n = udp.recv(socket.into(), &mut iovs, &mut self.metas)?;
        self.received = n;
        Ok(n)
    }

    /// The next datagram (or coalesced run, `meta.stride` bytes each) of the last receive.
    pub fn next(&mut self) -> Option<(RecvMeta, BytesMut)> {
        if self.taken == self.received {
            return None;
        }
        let meta = self.metas[self.taken];
        let slot = &mut self.batch[self.taken];
        self.taken += 1;
        let len = meta.len.min(slot.capacity());
        if len == self.slot
            && self.slot == GRO_SLOT
            && !TRUNCATION_SAID.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                "a coalesced run of QUIC datagrams filled a whole {GRO_SLOT}-byte receive slot: \
                 this kernel may coalesce more (a raised gro_max_size), and what did not fit is \
                 lost and sent again"
            );
        }
        // A run that fills little of a coalescing slot would hold it whole while its chunks
        // wait for their batch: it gets a buffer of its own size, and the slot stays free.
        if len * 4 < self.slot && self.slot == GRO_SLOT {
            // SAFETY: as in `recv`; the kernel wrote `len` bytes at the slot's start.
            let data = unsafe { std::slice::from_raw_parts(slot.as_ptr(), len) };
            return Some((meta, BytesMut::from(data)));
        }
        // SAFETY: as in `recv`; `len` is within the slot's capacity.
        unsafe { slot.set_len(len) };
        let data = slot.split_to(len);
        Some((meta, data))
    }

    /// A slot handed out earlier whose packets are all gone. Slots mostly come back in the
    /// order they went, so the oldest are looked at first; one still held goes to the back,
    /// and a receive looks at each at most once.
    fn reclaimed(&mut self, looks: &mut usize) -> Option<BytesMut> {
        while *looks < self.out.len() {
            *looks += 1;
            let mut s = self.out.pop_front()?;
            if s.try_reclaim(self.slot) {
                return Some(s);
            }
            self.out.push_back(s);
        }
        None
    }

    /// No longer keeps `slots` slots (their memory goes with their last packets).
    fn forget(&self, slots: usize) {
        metrics::gauge!("sluice_client_quic_receive_bytes").decrement((slots * self.slot) as f64);
    }

    /// Files the slots taken from the last receive as handed out.
    fn file_taken(&mut self) {
        let mut forgotten = 0;
        for s in self.batch.drain(..self.taken) {
            if s.capacity() == self.slot {
                // Copied out: never handed out.
                self.free.push(s);
            } else if self.out.len() + self.free.len() < KEPT_SLOTS {
                self.out.push_back(s);
            } else {
                forgotten += 1;
            }
        }
        if forgotten > 0 {
            self.forget(forgotten);
        }
        self.received -= self.taken;
        self.taken = 0;
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.forget(self.free.len() + self.out.len() + self.batch.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket_pair() -> (std::net::UdpSocket, std::net::UdpSocket) {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        a.connect(b.local_addr().expect("addr")).expect("connect");
        b.set_nonblocking(true).expect("nonblocking");
        (a, b)
    }

    /// Receives one datagram's worth (waiting for it), checking it is alone.
    fn receive_one(
        receiver: &mut Receiver,
        udp: &UdpSocketState,
        rx: &std::net::UdpSocket,
    ) -> BytesMut {
        loop {
            match receiver.recv(udp, rx) {
                Ok(1) => break,
                Ok(0) => continue,
                Ok(n) => panic!("{n} datagrams"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("recv: {e}"),
            }
        }
        receiver.next().expect("a datagram").1
    }

    #[test]
    fn datagrams_arrive_whole_and_slots_come_back_once_their_packets_are_gone() {
        let (tx, rx) = socket_pair();
        let udp = UdpSocketState::new((&rx).into()).expect("udp state");
        let mut receiver = Receiver::new(1, 1500);
        // Three batches' worth kept alive, each numbered in its bytes.
        let mut kept = Vec::new();
        for i in 0..3 * BATCH_SIZE {
            tx.send(&[i as u8, 7, 7, 7]).expect("send");
            let data = receive_one(&mut receiver, &udp, &rx);
            assert_eq!(&data[..], &[i as u8, 7, 7, 7]);
            kept.push(data.freeze());
        }
        // Each kept packet holds its slot; one batch of slots more was received into.
        assert_eq!(receiver.allocated, 3 * BATCH_SIZE + BATCH_SIZE - 1);
        // A slot that held a packet still alive is not received into (its bytes stay).
        assert!(kept
            .iter()
            .enumerate()
            .all(|(i, b)| b[..] == [i as u8, 7, 7, 7]));
        drop(kept);
        // Once they are gone, their slots come back instead of new ones.
        for i in 0..4 * BATCH_SIZE {
            tx.send(&[1, 2, i as u8]).expect("send");
            let data = receive_one(&mut receiver, &udp, &rx);
            assert_eq!(&data[..], &[1, 2, i as u8]);
        }
        assert_eq!(receiver.allocated, 4 * BATCH_SIZE - 1);
    }
}
