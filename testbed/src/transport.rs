//! Transport probes: tensor throughput of one connection through the real CPU-tier server
//! and client `Loader` (QUIC, or the same-host shared-memory transport), beside a plain TCP
//! stream carrying the same frames and a single-thread memcpy of the same bytes.
//!
//! The QUIC and same-host sides are the real system minus decoding: a CPU-tier server (in
//! this process) whose worker emits ready-made tensors ([`Synthetic`]), and a client that
//! grants credits, accounts for every sample and assembles batches in plan order with the
//! default mixing and unit size, as training runs (so most samples wait for their turn in
//! the reorder area, as they do there). The TCP side writes the
//! same frames with the same codec into a socket and reads each payload into a buffer. The
//! memcpy copies each tensor once, from a pool as large as the client's slots into a batch
//! buffer: what moving the bytes costs at all on this machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::{Checksum, Compression, Manifest, ShardInfo};
use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::{
    Assign, Finished, JobRunner, JobSpec, Limits, Message, Output, RunnerError, SampleHeader,
    SampleShape, UnitRunner,
};

use crate::error::{Result, TestbedError};

/// What a probe sends.
#[derive(Clone, Copy, Debug)]
pub struct TransportProbe {
    /// Samples to send.
    pub samples: u64,
    /// Tensor side (side × side × 3 bytes per sample).
    pub side: u32,
    /// Credits (samples in flight) the client grants.
    pub credits: u32,
    /// QUIC connections from the client to the worker (the loader's
    /// `connections_per_worker`); the worker's runtime gets a thread per connection, up
    /// to the cores. Same-host always uses one.
    pub connections: u32,
    /// The client's runtime threads (the loader's `io_threads`).
    pub io_threads: usize,
}

/// A worker that sends a copy of one prepared tensor for every sample, written where the
/// engine writes its output: straight into the sample's place in the client's batch when
/// the client shares its batches and gave the sample one (as the engine resizes into it),
/// else into a buffer from its pool, taken back when the transport is done with it.
pub struct Synthetic {
    shape: SampleShape,
    pub tensor: Arc<Vec<u8>>,
    outputs: Arc<sluice_wire::BufferPool>,
    places: std::sync::OnceLock<Arc<dyn sluice_wire::Places>>,
}

impl Synthetic {
    pub fn new(shape: SampleShape, tensor: Arc<Vec<u8>>) -> Self {
        Synthetic {
            shape,
            tensor,
            outputs: Arc::new(sluice_wire::BufferPool::new(512)),
            places: std::sync::OnceLock::new(),
        }
    }

    /// A worker of side×side×3 uint8 tensors (what `center_crop side` makes), and the shape.
    pub fn rgb(side: u32) -> (Arc<Self>, SampleShape) {
        let shape = SampleShape::image_u8(side, side, 3);
        let tensor = Arc::new(vec![0x5au8; shape.bytes() as usize]);
        (Arc::new(Synthetic::new(shape, tensor)), shape)
    }
}

impl UnitRunner for Synthetic {
    fn open_job(&self, _spec: &JobSpec) -> Result<Box<dyn JobRunner>, RunnerError> {
        Ok(Box::new(Synthetic::new(self.shape, self.tensor.clone())))
    }
    fn threads(&self) -> u32 {
        1
    }
}

impl JobRunner for Synthetic {
    fn share_places(&self, places: Arc<dyn sluice_wire::Places>) {
        let _ = self.places.set(places);
    }

    fn shape(&self) -> SampleShape {
        self.shape
    }
    fn run(
        &self,
        a: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
    ) -> Result<Finished, RunnerError> {
        sluice_wire::synthetic_unit(a, emit, |mut header| {
            header.tensor_bytes = self.shape.bytes();
            let claim = self
                .places
                .get()
                .and_then(|p| p.claim(a.unit, a.attempt, header.index, self.tensor.len()));
            match claim {
                Some(mut claim) => {
                    claim.memory().copy_from_slice(&self.tensor);
                    Output::Placed(header, claim.place(), Vec::new())
                }
                None => {
                    let mut payload = self.outputs.take(self.tensor.len());
                    payload.copy_from_slice(&self.tensor);
                    Output::Sample(header, payload)
                }
            }
        })
    }

    fn recycle(&self, payload: Vec<u8>) {
        self.outputs.give_back(payload);
    }
}

/// A CPU-tier server serving [`Synthetic`] tensors on loopback (QUIC, and the same-host
/// socket when asked), with its certificate (and socket) in `dir`; it stops when dropped.
pub struct SyntheticWorker {
    pub addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl SyntheticWorker {
    /// Starts the worker on `threads` runtime threads (one per client connection serves
    /// best, up to the cores).
    pub fn start(
        runner: Arc<Synthetic>,
        dir: &std::path::Path,
        same_host: bool,
        threads: u32,
    ) -> Result<SyntheticWorker> {
        let loopback = ([127, 0, 0, 1], 0).into();
        SyntheticWorker::start_on(loopback, runner, dir, same_host, threads)
    }

    /// [`SyntheticWorker::start`] listening on `listen` (an IPv6 loopback, say).
    pub fn start_on(
        listen: std::net::SocketAddr,
        runner: Arc<Synthetic>,
        dir: &std::path::Path,
        same_host: bool,
        threads: u32,
    ) -> Result<SyntheticWorker> {
        let mut config = sluice_cpu::config::CpuConfig {
            listen,
            state_dir: dir.to_path_buf(),
            threads: 1,
            ..Default::default()
        };
        config.same_host = match same_host {
            true => config.same_host_in(dir),
            false => sluice_cpu::config::SameHost {
                enabled: false,
                ..config.same_host.clone()
            },
        };
        let udp = TestbedError::io("binding a loopback UDP port");
        let socket = std::net::UdpSocket::bind(config.listen).map_err(udp)?;
        let addr = socket
            .local_addr()
            .map_err(TestbedError::io("binding a loopback UDP port"))?;
        let stop = tokio_util::sync::CancellationToken::new();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads((threads.max(1) as usize).min(cores))
            .enable_all()
            .build()
            .map_err(TestbedError::io("starting a runtime"))?;
        // The worker as its config sets it up, decoding with the synthetic runner.
        let setup = sluice_cpu::server::Setup::with_runner(
            config,
            Some(TOKEN.into()),
            addr.port(),
            runtime.handle(),
            runner,
        )
        .map_err(|e| TestbedError::Setup(format!("the worker: {e}")))?;
        if same_host && setup.same_host.is_none() {
            return Err(TestbedError::Setup("no same-host socket".into()));
        }
        runtime.spawn(sluice_cpu::server::run(socket, None, setup, stop.clone()));
        Ok(SyntheticWorker {
            addr,
            stop,
            runtime: Some(runtime),
        })
    }
}

impl Drop for SyntheticWorker {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// The cluster token the synthetic worker takes.
pub const TOKEN: &str = "bench-token";

/// Runs one epoch of `args.samples` synthetic samples from the worker at `addr` (its
/// certificate and same-host socket in `dir`) through a client `Loader`, calling `batch`
/// with the samples delivered so far after each batch; the samples delivered.
pub fn consume(
    args: &TransportProbe,
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    same_host: bool,
    mut batch: impl FnMut(u64),
) -> Result<u64> {
    consume_epochs(args, addr, dir, same_host, 1, |_, n| batch(n))
}

/// [`consume`] for `epochs` epochs of one loader, one after the other (none started early
/// behind another, so each epoch's work falls inside it), calling `batch` with the epoch and
/// the samples it delivered so far.
pub fn consume_epochs(
    args: &TransportProbe,
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    same_host: bool,
    epochs: u64,
    mut batch: impl FnMut(u64, u64),
) -> Result<u64> {
    let manifest = Manifest::new(vec![ShardInfo {
        url: "synthetic://bench".into(),
        // Synthetic samples have no bytes; a size that holds the count keeps the manifest valid.
        size: args.samples.saturating_mul(1 << 20),
        samples: args.samples,
        checksum: Checksum(0),
        compression: Compression::None,
        replicas: Vec::new(),
    }]);
    let loader = sluice_client::Loader::builder()
        .dataset(manifest)
        .workers([addr.to_string()])
        .token(TOKEN)
        .trust_cert(dir.join("cert.pem"))
        .pipeline(format!("decode | center_crop {}", args.side))
        .epochs(epochs.max(1))
        .prefetch_next_epoch(false)
        .batch_size(256)
        .credits_per_worker(args.credits)
        .connections_per_worker(args.connections.max(1))
        .io_threads(args.io_threads.max(1))
        .same_host(if same_host {
            sluice_client::SameHost::Require
        } else {
            sluice_client::SameHost::Off
        })
        .same_host_dir(dir.to_path_buf())
        .build()?;
    let mut total = 0u64;
    for epoch in 0..epochs.max(1) {
        let mut n = 0u64;
        for b in loader.epoch(epoch)? {
            n += b?.len() as u64;
            batch(epoch, n);
        }
        total += n;
    }
    Ok(total)
}

/// [`consume_epochs`] for `epochs` epochs, timed by `now` (a clock, or a clock and the
/// process's CPU time): with more than one, the first warms up what a loader keeps across
/// epochs (its tensor buffers, its same-host segments, whose pages are made as they are first
/// touched) and the rest are timed, from the first epoch's last batch to the last one's, as a
/// training run's steady state; with one, the epoch is timed from the loader's start. Returns
/// `now` at the start and at the end, and the samples delivered in between; an error if none.
pub fn timed_epochs<T: Copy>(
    args: &TransportProbe,
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    same_host: bool,
    epochs: u64,
    now: impl Fn() -> T,
) -> Result<(T, T, u64)> {
    let epochs = epochs.max(1);
    let warmup = usize::from(epochs > 1);
    let mut start = now();
    let mut end = start;
    let mut delivered = vec![0u64; epochs as usize];
    consume_epochs(args, addr, dir, same_host, epochs, |epoch, n| {
        let at = now();
        if (epoch as usize) < warmup {
            start = at;
        }
        if let Some(d) = delivered.get_mut(epoch as usize) {
            *d = n;
        }
        end = at;
    })?;
    let samples: u64 = delivered[warmup..].iter().sum();
    if samples == 0 {
        return Err(TestbedError::Setup("the epochs delivered no batch".into()));
    }
    Ok((start, end, samples))
}

/// Bytes/s through the real server and `Loader`, over QUIC or the same-host socket, over
/// `epochs` epochs of one loader, one after the other, timed as [`timed_epochs`] says.
pub fn loader_once(
    args: &TransportProbe,
    runner: Arc<Synthetic>,
    same_host: bool,
    epochs: u64,
) -> Result<f64> {
    let dir = tempfile::tempdir().map_err(TestbedError::io("making a temporary folder"))?;
    let worker = SyntheticWorker::start(runner, dir.path(), same_host, args.connections)?;
    let timed = timed_epochs(
        args,
        worker.addr,
        dir.path(),
        same_host,
        epochs,
        Instant::now,
    );
    // The client goes first (it is gone when `timed_epochs` returns), so the server's
    // shutdown is not reported as a lost worker.
    drop(worker);
    let (start, end, samples) = timed?;
    let secs = (end - start).as_secs_f64().max(1e-9);
    Ok(samples as f64 * args.side as f64 * args.side as f64 * 3.0 / secs)
}

pub fn tcp_once(args: &TransportProbe, tensor: Arc<Vec<u8>>) -> Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(TestbedError::io("starting a runtime"))?;
    let samples = args.samples;
    let tcp = |e: std::io::Error| TestbedError::Io {
        what: "TCP probe".into(),
        source: e,
    };
    let wire = |e: sluice_wire::io::IoError| TestbedError::Setup(format!("TCP probe: {e}"));
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(tcp)?;
        let addr = listener.local_addr().map_err(tcp)?;
        let sender = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.map_err(tcp)?;
            stream.set_nodelay(true).map_err(tcp)?;
            let mut w = FrameWriter::new(tokio::io::BufWriter::new(stream), Limits::default());
            for index in 0..samples {
                let header = Message::Sample(SampleHeader {
                    job: 1,
                    unit: 0,
                    attempt: 0,
                    shard: 0,
                    index,
                    key: format!("{index:08}"),
                    label: Some(0),
                    tensor_bytes: tensor.len() as u64,
                    fields: Vec::new(),
                    geometry: Default::default(),
                    has: Vec::new(),
                });
                w.send(&header, &[&tensor]).await.map_err(wire)?;
            }
            w.flush().await.map_err(wire)?;
            Ok::<(), TestbedError>(())
        });
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(tcp)?;
        let started = Instant::now();
        let mut r = FrameReader::new(stream, Limits::default());
        let mut buf = Vec::new();
        let mut bytes = 0u64;
        while let Some(m) = r.next().await.map_err(wire)? {
            buf.resize(m.payload_len() as usize, 0);
            r.payload_into(&mut buf).await.map_err(wire)?;
            bytes += buf.len() as u64;
        }
        sender
            .await
            .map_err(|e| TestbedError::Setup(format!("TCP probe sender: {e}")))??;
        Ok(bytes as f64 / started.elapsed().as_secs_f64())
    })
}

/// Bytes/s of one thread copying each tensor once, from a pool of `credits` tensors into
/// 256-sample batch buffers.
pub fn memcpy_once(args: &TransportProbe, bytes: usize) -> f64 {
    let pool = vec![0x5au8; bytes * args.credits.max(1) as usize];
    let mut batch = vec![0u8; bytes * 256];
    let started = Instant::now();
    for i in 0..args.samples as usize {
        let src = (i % args.credits.max(1) as usize) * bytes;
        let dst = (i % 256) * bytes;
        batch[dst..dst + bytes].copy_from_slice(&pool[src..src + bytes]);
    }
    let secs = started.elapsed().as_secs_f64();
    std::hint::black_box(&batch);
    (args.samples as usize * bytes) as f64 / secs
}

/// QUIC tensor throughput (bytes/s) through the real server and client, `samples` tensors of
/// side×side×3 bytes.
pub fn quic_probe(samples: u64, side: u32) -> Result<f64> {
    let args = TransportProbe {
        samples,
        side,
        credits: 256,
        connections: 1,
        io_threads: 2,
    };
    let (runner, _) = Synthetic::rgb(side);
    loader_once(&args, runner, false, 1)
}

/// One connection's tensor throughput on each path, bytes/s, the best of some runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportFigures {
    pub quic: f64,
    pub same_host: f64,
    pub tcp: f64,
    pub memcpy: f64,
}

/// One of the paths [`compare`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportPath {
    Quic,
    SameHost,
    Tcp,
    Memcpy,
}

impl std::str::FromStr for TransportPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "quic" => Ok(TransportPath::Quic),
            "same-host" => Ok(TransportPath::SameHost),
            "tcp" => Ok(TransportPath::Tcp),
            "memcpy" => Ok(TransportPath::Memcpy),
            _ => Err(format!("{s:?} is not quic, same-host, tcp or memcpy")),
        }
    }
}

/// QUIC, same-host, TCP and memcpy side by side (or `only` one of them, for a profiler),
/// each the best of `repeat` runs, the loader's over `epochs` epochs ([`loader_once`]); a
/// path not run reads 0.
pub fn compare(
    probe: &TransportProbe,
    repeat: u32,
    epochs: u64,
    only: Option<TransportPath>,
) -> Result<TransportFigures> {
    let (runner, _) = Synthetic::rgb(probe.side);
    let tensor = runner.tensor.clone();
    let run = |p: TransportPath| only.is_none_or(|o| o == p);
    let mut f = TransportFigures::default();
    for _ in 0..repeat.max(1) {
        if run(TransportPath::Quic) {
            f.quic = f
                .quic
                .max(loader_once(probe, runner.clone(), false, epochs)?);
        }
        if run(TransportPath::SameHost) {
            f.same_host = f
                .same_host
                .max(loader_once(probe, runner.clone(), true, epochs)?);
        }
        if run(TransportPath::Tcp) {
            f.tcp = f.tcp.max(tcp_once(probe, tensor.clone())?);
        }
        if run(TransportPath::Memcpy) {
            f.memcpy = f.memcpy.max(memcpy_once(probe, tensor.len()));
        }
    }
    Ok(f)
}
