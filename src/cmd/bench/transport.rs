//! `sluice bench transport`: tensor throughput of the transports, one connection, in one run:
//! QUIC on loopback, the same-host shared-memory transport, a plain TCP stream carrying the
//! same frames, and a single-thread memcpy of the same bytes.
//!
//! The QUIC and same-host sides are the real system minus decoding: a `sluice cpu` server (in
//! this process) whose worker emits ready-made 224×224×3 tensors, and a client `Loader` that
//! grants credits, accounts for every sample and assembles batches. The TCP side writes the
//! same frames with the same codec into a socket and reads each payload into a buffer. The
//! memcpy copies each tensor once, from a pool as large as the client's slots into a batch
//! buffer: what moving the bytes costs at all on this machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_shard::{Checksum, Compression, Manifest, ShardInfo};
use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::{
    Assign, Finished, JobRunner, JobSpec, Limits, Message, Output, SampleHeader, SampleShape,
    UnitRunner,
};

#[derive(clap::Args)]
pub struct TransportArgs {
    /// Samples to send each way.
    #[arg(long, default_value_t = 8192)]
    samples: u64,
    /// Tensor side (side × side × 3 bytes per sample).
    #[arg(long, default_value_t = 224)]
    side: u32,
    /// Credits (samples in flight) the client grants.
    #[arg(long, default_value_t = 256)]
    credits: u32,
    /// Repeat each measurement this many times and keep the best.
    #[arg(long, default_value_t = 3)]
    repeat: u32,
}

/// A worker that sends a copy of one prepared tensor for every sample: a fresh buffer per
/// sample, as the decoder makes one (the copy comes from cache, so it costs little).
pub(crate) struct Synthetic {
    shape: SampleShape,
    tensor: Arc<Vec<u8>>,
}

impl Synthetic {
    pub(crate) fn new(shape: SampleShape, tensor: Arc<Vec<u8>>) -> Self {
        Synthetic { shape, tensor }
    }

    /// A worker of side×side×3 uint8 tensors (what `center_crop side` makes), and the shape.
    pub(crate) fn rgb(side: u32) -> (Arc<Self>, SampleShape) {
        let shape = SampleShape {
            height: side,
            width: side,
            channels: 3,
            elem_bytes: 1,
            chw: false,
        };
        let tensor = Arc::new(vec![0x5au8; shape.bytes() as usize]);
        (Arc::new(Synthetic::new(shape, tensor)), shape)
    }
}

impl UnitRunner for Synthetic {
    fn open_job(&self, _spec: &JobSpec) -> Result<Box<dyn JobRunner>, String> {
        Ok(Box::new(Synthetic {
            shape: self.shape,
            tensor: self.tensor.clone(),
        }))
    }
    fn threads(&self) -> u32 {
        1
    }
}

impl JobRunner for Synthetic {
    fn shape(&self) -> SampleShape {
        self.shape
    }
    fn run(&self, a: &Assign, emit: &mut dyn FnMut(Output) -> bool) -> Result<Finished, String> {
        for index in a.start..a.end {
            let header = SampleHeader {
                job: a.job,
                unit: a.unit,
                attempt: a.attempt,
                shard: a.shard.index,
                index,
                key: format!("{index:08}"),
                label: Some(0),
                tensor_bytes: self.shape.bytes(),
                fields: Vec::new(),
            };
            if !emit(Output::Sample(header, self.tensor.to_vec())) {
                return Err("cancelled".into());
            }
        }
        Ok(Finished {
            sent: a.end - a.start,
            skipped: 0,
        })
    }
}

/// Bytes/s through the real server and `Loader`, over QUIC or the same-host socket.
fn loader_once(args: &TransportArgs, runner: Arc<Synthetic>, same_host: bool) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let identity = sluice_cpu::tls::self_signed(dir.path(), &["localhost".into()])?;
    let config = sluice_cpu::config::CpuConfig {
        state_dir: dir.path().to_path_buf(),
        threads: 1,
        ..Default::default()
    };
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let addr = socket.local_addr()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = match same_host {
        false => None,
        true => {
            let _in_runtime = runtime.enter();
            Some(sluice_cpu::same_host::bind(
                &config.same_host_in(dir.path()),
                addr.port(),
            )?)
        }
    };
    let setup = sluice_cpu::server::Setup {
        config,
        identity,
        token: Some("bench-token".into()),
        runner: runner.clone(),
        same_host: listener,
    };
    runtime.spawn(sluice_cpu::server::run(socket, None, setup, stop.clone()));
    let manifest = Manifest::new(vec![ShardInfo {
        url: "synthetic://bench".into(),
        // Synthetic samples have no bytes; a size that holds the count keeps the manifest valid.
        size: args.samples.saturating_mul(1 << 20),
        samples: args.samples,
        checksum: Checksum(0),
        compression: Compression::None,
    }]);
    let loader = sluice_client::Loader::builder()
        .dataset(manifest)
        .workers([addr.to_string()])
        .token("bench-token")
        .trust_cert(dir.path().join("cert.pem"))
        .pipeline(format!("decode | center_crop {}", args.side))
        .batch_size(256)
        .credits_per_worker(args.credits)
        .max_unit_samples(1024)
        .same_host(if same_host {
            sluice_client::SameHost::Require
        } else {
            sluice_client::SameHost::Off
        })
        .same_host_dir(dir.path().to_path_buf())
        .build()?;
    let started = Instant::now();
    let mut n = 0u64;
    for batch in loader.epoch(0)? {
        n += batch?.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.cancel();
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(n as f64 * args.side as f64 * args.side as f64 * 3.0 / secs)
}

fn tcp_once(args: &TransportArgs, tensor: Arc<Vec<u8>>) -> Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let samples = args.samples;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sender = tokio::spawn(async move {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
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
                });
                w.send(&header, &[&tensor]).await?;
            }
            w.flush().await?;
            anyhow::Ok(())
        });
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let started = Instant::now();
        let mut r = FrameReader::new(stream, Limits::default());
        let mut buf = Vec::new();
        let mut bytes = 0u64;
        while let Some(m) = r.next().await? {
            buf.resize(m.payload_len() as usize, 0);
            r.payload_into(&mut buf).await?;
            bytes += buf.len() as u64;
        }
        sender.await??;
        Ok(bytes as f64 / started.elapsed().as_secs_f64())
    })
}

/// Bytes/s of one thread copying each tensor once, from a pool of `credits` tensors into
/// 256-sample batch buffers.
fn memcpy_once(args: &TransportArgs, bytes: usize) -> f64 {
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

pub fn run(args: TransportArgs) -> Result<()> {
    let (runner, shape) = Synthetic::rgb(args.side);
    let tensor = runner.tensor.clone();
    println!(
        "sluice bench transport: {} samples of {} bytes, one connection, loopback, best of {}",
        args.samples,
        shape.bytes(),
        args.repeat
    );
    let (mut quic, mut shm, mut tcp, mut copy) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..args.repeat.max(1) {
        quic = quic.max(loader_once(&args, runner.clone(), false).context("QUIC run")?);
        shm = shm.max(loader_once(&args, runner.clone(), true).context("same-host run")?);
        tcp = tcp.max(tcp_once(&args, tensor.clone()).context("TCP run")?);
        copy = copy.max(memcpy_once(&args, tensor.len()));
    }
    let line = |what: &str, v: f64| println!("transport\t{what}\t{:.2} GB/s", v / 1e9);
    line("quic (server → Loader, credits, batches)", quic);
    line("same-host (server → shared memory → Loader)", shm);
    line("tcp (same frames, read into a buffer)", tcp);
    line("memcpy (one thread, each tensor once)", copy);
    println!("transport\tquic/tcp\t{:.2}", quic / tcp);
    println!("transport\tsame-host/memcpy\t{:.2}", shm / copy);
    println!("transport\tsame-host/quic\t{:.2}", shm / quic);
    Ok(())
}

/// QUIC tensor throughput (bytes/s) through the real server and client, `samples` tensors of
/// side×side×3 bytes.
pub fn quic_probe(samples: u64, side: u32) -> Result<f64> {
    let args = TransportArgs {
        samples,
        side,
        credits: 256,
        repeat: 1,
    };
    let (runner, _) = Synthetic::rgb(side);
    loader_once(&args, runner, false)
}
