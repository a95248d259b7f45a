//! Host-cost probes: what the client costs the trainer's host, in CPU time per delivered
//! sample, on each transport, beside the floor of what its bytes need, measured in the same
//! run.
//!
//! The worker runs in another process ([`SyntheticWorker`] serving ready-made tensors; the
//! caller starts it, `sluice bench host-cost` runs itself for it), so this process's CPU
//! time (user + sys, `getrusage`) is the client's alone: its runtime, the transport, the
//! ledger, the reorder area and the batches. It is counted over the epochs after the first
//! (which warms up the buffers and same-host segments a loader keeps across epochs), from
//! the first epoch's last batch to the last epoch's, with no epoch started early behind
//! another (so none of a measured epoch's work falls outside the count): each epoch's
//! connecting and TLS handshake are in it (a few milliseconds of the seconds an 8,192-sample
//! epoch takes), the loader's shutdown is not.
//!
//! The floors, per sample of the same bytes on one thread: over QUIC, the kernel's copy of
//! its datagrams out of a UDP socket as the client receives them ([`kernel_copy_us`]), plus
//! AES-256-GCM over the tensor in datagram-sized packets, by the implementation this
//! process's QUIC packet protection chose ([`sluice_tls::chosen`]; sealing stands in for
//! opening, which costs the same), plus one copy into a batch; over same-host,
//! the copy alone (the client copies each tensor once, from its slot into the batch). The
//! copy is the cheaper, on this machine, of a plain one and the client's own streaming one
//! (`sluice_wire::copy`).

use std::path::Path;
use std::time::Instant;

use sluice_wire::copy::Streaming;

use crate::error::{Result, TestbedError};
pub use crate::transport::SyntheticWorker;
use crate::transport::{timed_epochs, TransportProbe};

/// What the client spent on the samples of the epochs measured.
#[derive(Clone, Copy, Debug)]
pub struct HostCost {
    pub samples: u64,
    /// User + system CPU seconds of this process.
    pub cpu_secs: f64,
    pub wall_secs: f64,
}

impl HostCost {
    pub fn micros_per_sample(&self) -> f64 {
        self.cpu_secs * 1e6 / self.samples.max(1) as f64
    }

    pub fn samples_per_sec(&self) -> f64 {
        self.samples as f64 / self.wall_secs.max(1e-9)
    }
}

/// What this process has used so far (`getrusage`, every thread).
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessUsage {
    pub user_secs: f64,
    pub sys_secs: f64,
    /// Page faults served without IO (a page's first touch, mostly).
    pub minor_faults: u64,
    pub major_faults: u64,
    /// Context switches: waits (voluntary) and preemptions.
    pub switches: u64,
}

impl ProcessUsage {
    /// Now; all zero if the kernel will not say.
    pub fn now() -> ProcessUsage {
        // SAFETY: getrusage writes the struct it is given, which lives on this stack.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF is always valid.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
            return ProcessUsage::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let count = |n: libc::c_long| u64::try_from(n).unwrap_or(0);
        ProcessUsage {
            user_secs: secs(u.ru_utime),
            sys_secs: secs(u.ru_stime),
            minor_faults: count(u.ru_minflt),
            major_faults: count(u.ru_majflt),
            switches: count(u.ru_nvcsw) + count(u.ru_nivcsw),
        }
    }

    /// What was used between `earlier` and this reading.
    pub fn since(&self, earlier: &ProcessUsage) -> ProcessUsage {
        ProcessUsage {
            user_secs: self.user_secs - earlier.user_secs,
            sys_secs: self.sys_secs - earlier.sys_secs,
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
            major_faults: self.major_faults.saturating_sub(earlier.major_faults),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }

    pub fn cpu_secs(&self) -> f64 {
        self.user_secs + self.sys_secs
    }

    /// "23.4 µs CPU per sample (user 5.1, system 18.3), 0.05 page faults and 0.48 context
    /// switches a sample" for `samples`.
    pub fn per_sample(&self, samples: u64) -> String {
        let n = samples.max(1) as f64;
        format!(
            "{:.1} µs CPU per sample (user {:.1}, system {:.1}), {:.2} page faults and {:.2} \
             context switches a sample",
            self.cpu_secs() * 1e6 / n,
            self.user_secs * 1e6 / n,
            self.sys_secs * 1e6 / n,
            (self.minor_faults + self.major_faults) as f64 / n,
            self.switches as f64 / n
        )
    }
}

/// User + system CPU seconds this process has used.
pub fn process_cpu_secs() -> f64 {
    ProcessUsage::now().cpu_secs()
}

/// Runs `epochs` epochs of one loader from the worker at `addr` (its certificate and socket
/// in `dir`), one after the other, and measures this process's CPU over the epochs after the
/// first, until the last batch is delivered: the first warms up what a loader keeps across
/// epochs (its tensor buffers, its same-host segments), as the first minutes of a training
/// run do. With one epoch, that epoch is measured from the loader's start.
pub fn client_cost(
    args: &TransportProbe,
    addr: std::net::SocketAddr,
    dir: &Path,
    same_host: bool,
    epochs: u64,
) -> Result<HostCost> {
    let now = || (process_cpu_secs(), Instant::now());
    let (start, end, samples) = timed_epochs(args, addr, dir, same_host, epochs, now)?;
    Ok(HostCost {
        samples,
        cpu_secs: end.0 - start.0,
        wall_secs: (end.1 - start.1).as_secs_f64(),
    })
}

/// What a sample's bytes need at least, in µs of one thread.
#[derive(Clone, Copy, Debug)]
pub struct Floor {
    /// The kernel's copy of the tensor's datagrams out of a UDP socket, received as the
    /// client receives them ([`kernel_copy_us`]).
    pub kernel_us: f64,
    /// AES-256-GCM over the tensor in `packet`-byte packets, by `aes_gcm`.
    pub decrypt_us: f64,
    pub aes_gcm: sluice_tls::AesGcm,
    /// One copy of the tensor into a batch buffer: the cheaper of a plain copy and the
    /// client's streaming one ([`sluice_wire::copy`]).
    pub copy_us: f64,
    pub packet: usize,
}

/// The floors for `samples` tensors of `bytes`, copied from a pool of `pool` tensors (as
/// many as the client's credits) so that they come from memory, not cache.
pub fn floor(bytes: usize, samples: u64, pool: usize) -> Result<Floor> {
    let packet = sluice_tls::packet_bytes();
    let aes_gcm = sluice_tls::chosen()
        .map_err(|e| TestbedError::Setup(e.to_string()))?
        .aes_gcm;
    let key = aes_gcm.probe_key();
    let pool = pool.max(1);
    let mut tensors = vec![0x5au8; bytes * pool];
    let header = [0x40u8, 0, 0, 0, 1];
    let started = Instant::now();
    let mut packet_number = 0u64;
    for i in 0..samples as usize {
        let tensor = &mut tensors[(i % pool) * bytes..][..bytes];
        for chunk in tensor.chunks_mut(packet) {
            packet_number += 1;
            let tag = key
                .encrypt_in_place(packet_number, &header, chunk)
                .map_err(|e| TestbedError::Setup(format!("AES-256-GCM: {e}")))?;
            let _ = std::hint::black_box(tag);
        }
    }
    let decrypt_us = started.elapsed().as_secs_f64() * 1e6 / samples.max(1) as f64;
    // The cheaper of a plain copy and the client's streaming one: which wins depends on the
    // machine's caches (sluice_wire::copy), and the floor is what the bytes need at least.
    let mut batch = vec![0u8; bytes * 256];
    batch.fill(1); // its pages made before the clock starts, as a loader's warm ring has them
    let mut copy_us = f64::INFINITY;
    for streaming in [false, true] {
        let started = Instant::now();
        for i in 0..samples as usize {
            let dst = &mut batch[(i % 256) * bytes..][..bytes];
            let src = &tensors[(i % pool) * bytes..][..bytes];
            if streaming {
                Streaming::new().copy(dst, src);
            } else {
                dst.copy_from_slice(src);
            }
        }
        copy_us = copy_us.min(started.elapsed().as_secs_f64() * 1e6 / samples.max(1) as f64);
    }
    std::hint::black_box(&batch);
    Ok(Floor {
        kernel_us: kernel_copy_us(bytes, samples)?,
        decrypt_us,
        aes_gcm,
        copy_us,
        packet,
    })
}

/// The kernel's part of receiving a `bytes` tensor over QUIC, in µs of the receiving
/// thread's CPU: its datagrams (Sluice's size, sent as the worker sends them: GSO runs of
/// [`sluice_wire::quic::GSO_SEGMENTS`]) received on loopback as the client receives them
/// (quinn-udp's `recvmmsg`, GRO where the kernel coalesces), into buffers that are reused.
/// Sending is not counted: each burst is sent first, then received with the clock running
/// (a burst fits the socket's default receive buffer). Averaged over `samples` tensors.
pub fn kernel_copy_us(bytes: usize, samples: u64) -> Result<f64> {
    use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};
    use std::io::IoSliceMut;
    let io = |what: &'static str| TestbedError::io(format!("the kernel-copy floor: {what}"));
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").map_err(io("binding a socket"))?;
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").map_err(io("binding a socket"))?;
    let to = rx.local_addr().map_err(io("its address"))?;
    let rx_state = UdpSocketState::new((&rx).into()).map_err(io("setting the socket up"))?;
    let tx_state = UdpSocketState::new((&tx).into()).map_err(io("setting the socket up"))?;
    rx.set_nonblocking(true)
        .map_err(io("setting the socket up"))?;
    let datagram = usize::from(sluice_wire::quic::MAX_UDP_PAYLOAD);
    let segments = sluice_wire::quic::GSO_SEGMENTS
        .min(tx_state.max_gso_segments())
        .max(1);
    let run = vec![0x5au8; datagram * segments];
    // A burst: two GSO runs (20 datagrams of 6,500 bytes at most), under the 208 KiB a
    // socket's receive buffer holds by default, accounting included.
    let burst_runs = 2;
    let slot = datagram * rx_state.gro_segments().max(1);
    let mut slots = vec![vec![0u8; slot]; BATCH_SIZE];
    // Made once, outside the clock: the slots' bytes are never read, only received into.
    let mut iovs: Vec<IoSliceMut<'_>> = slots.iter_mut().map(|s| IoSliceMut::new(s)).collect();
    let mut metas = [RecvMeta::default(); BATCH_SIZE];
    let wanted = bytes as u64 * samples.max(1);
    let (mut received, mut cpu) = (0u64, 0f64);
    let mut idle = 0;
    while received < wanted {
        for _ in 0..burst_runs {
            let transmit = Transmit {
                destination: to,
                ecn: None,
                contents: &run,
                segment_size: (segments > 1).then_some(datagram),
                src_ip: None,
            };
            tx_state
                .send((&tx).into(), &transmit)
                .map_err(io("sending a burst"))?;
        }
        let before = thread_cpu_secs();
        let mut got = 0u64;
        loop {
            match rx_state.recv((&rx).into(), &mut iovs, &mut metas) {
                Ok(n) => got += metas[..n].iter().map(|m| m.len as u64).sum::<u64>(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(io("receiving")(e)),
            }
        }
        cpu += thread_cpu_secs() - before;
        received += got;
        // Loopback drops nothing it accepted; a kernel that queues none of it is a setup
        // this floor cannot be measured on.
        idle = if got == 0 { idle + 1 } else { 0 };
        if idle > 100 {
            return Err(TestbedError::Setup(
                "the kernel-copy floor: loopback delivered no datagram".into(),
            ));
        }
    }
    Ok(cpu * 1e6 * bytes as f64 / received as f64)
}

/// This thread's CPU seconds (user + system) so far.
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives on this stack.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
