//! Each tier measured alone, and the sizing rule: the chain runs at the speed of its slowest
//! tier, so the report names that tier, why, and how many more of its units (storage nodes,
//! CPU cores, connections) would move the bottleneck elsewhere.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_cpu::{Engine, EngineConfig, Outcome, PipelineSpec, SampleContext};
use sluice_shard::{Field, Manifest, Sample};
use std::sync::atomic::Ordering;

use crate::consumers::ConsumerConfig;
use crate::error::{Result, TestbedError};

/// One tier's capacity in the deployment measured.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub tier: &'static str,
    /// Samples per second the tier can deliver as deployed.
    pub samples_per_s: f64,
    /// How many units it has (nodes, cores, connections) and what a unit is.
    pub units: f64,
    pub unit: &'static str,
    pub detail: String,
}

impl Capacity {
    pub fn per_unit(&self) -> f64 {
        self.samples_per_s / self.units.max(1e-9)
    }
    pub fn to_json(&self) -> serde_json::Value {
        json!({"tier": self.tier, "samples_per_s": self.samples_per_s, "units": self.units,
               "unit": self.unit, "per_unit": self.per_unit(), "detail": self.detail})
    }
}

/// Reads the dataset's shards over HTTP (two streams) for `secs`: bytes/s.
pub fn storage_bytes_per_s(manifest: &Manifest, secs: f64) -> Result<f64> {
    use std::io::Read;
    let http = |url: &str| {
        let url = url.to_string();
        move |e: reqwest::Error| TestbedError::Http {
            url,
            detail: e.to_string(),
        }
    };
    let client = reqwest::blocking::Client::builder()
        .timeout(None)
        .build()
        .map_err(http("the storage probe's client"))?;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let client = &client;
                s.spawn(move || -> Result<u64> {
                    let mut bytes = 0u64;
                    let mut buf = vec![0u8; 1 << 20];
                    for shard in manifest.shards.iter().skip(t).step_by(2).cycle() {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let mut resp = client
                            .get(&shard.url)
                            .send()
                            .and_then(|r| r.error_for_status())
                            .map_err(http(&shard.url))?;
                        loop {
                            let n = resp.read(&mut buf).map_err(|e| TestbedError::Http {
                                url: shard.url.clone(),
                                detail: e.to_string(),
                            })?;
                            if n == 0 {
                                break;
                            }
                            bytes += n as u64;
                        }
                    }
                    Ok(bytes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(TestbedError::Setup("a reader panicked".into())))
            })
            .sum::<Result<u64>>()
    })?;
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// The CPU engine alone on up to 256 of the dataset's samples, held in memory: samples/s.
pub fn engine_samples_per_s(
    manifest: &Manifest,
    pipeline: &str,
    threads: usize,
    secs: f64,
) -> Result<f64> {
    let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default())?;
    let mut samples = Vec::new();
    for shard in &manifest.shards {
        let loc = sluice_cpu::ShardLocation {
            tally: Default::default(),
            urls: shard.urls(),
            info: shard.clone(),
        };
        for s in source.open_unit(&loc, 0, shard.samples)? {
            samples.push(s?);
        }
        if samples.len() >= 256 {
            break;
        }
    }
    let config = EngineConfig {
        threads,
        ..Default::default()
    };
    let run = engine_run(&samples, pipeline.parse()?, config, secs)?;
    Ok(run.done as f64 / run.seconds.max(1e-9))
}

/// "1 core", "2 cores".
pub fn count(n: f64, unit: &str) -> String {
    if n == 1.0 {
        format!("1 {unit}")
    } else {
        format!("{n:.0} {unit}s")
    }
}

/// The slowest tier, and why, and how to move it.
pub fn verdict(caps: &[Capacity], consumer: Option<f64>) -> (String, Vec<String>) {
    let mut sorted: Vec<&Capacity> = caps.iter().collect();
    sorted.sort_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
    let Some(slowest) = sorted.first() else {
        return ("none".into(), Vec::new());
    };
    let mut lines = Vec::new();
    if let Some(gpu) = consumer.filter(|g| *g < slowest.samples_per_s) {
        lines.push(format!(
            "bottleneck: the consumers ({gpu:.0} samples/s asked); every tier has room: {} \
             could serve {:.0}/s",
            slowest.tier, slowest.samples_per_s
        ));
        return ("consumer".into(), lines);
    }
    let next = sorted.get(1).map(|c| c.samples_per_s);
    let target = match (consumer, next) {
        (Some(g), Some(n)) => g.min(n),
        (Some(g), None) => g,
        (None, Some(n)) => n,
        (None, None) => slowest.samples_per_s,
    };
    let need = (target / slowest.per_unit()).ceil();
    let more = (need - slowest.units).max(0.0);
    lines.push(format!(
        "bottleneck: {} at {:.0} samples/s ({} × {:.0}/s each; {})",
        slowest.tier,
        slowest.samples_per_s,
        count(slowest.units, slowest.unit),
        slowest.per_unit(),
        slowest.detail
    ));
    if more > 0.0 {
        lines.push(format!(
            "to move it: {} ({more:.0} more) would carry {target:.0} samples/s, where {} takes over",
            count(need, slowest.unit),
            match (consumer, next) {
                (Some(g), Some(n)) if g <= n => "the consumers' demand".to_string(),
                _ => sorted.get(1).map_or("nothing".into(), |c| c.tier.to_string()),
            }
        ));
    }
    (slowest.tier.to_string(), lines)
}

/// The design's sizing rule for one GPU that consumes `per_gpu` samples/s: CPU cores from the
/// engine's per-core rate, storage read bandwidth (spindles at ~180 MB/s sequential), and the
/// network each side of the CPU tier.
pub fn per_gpu(per_gpu: f64, caps: &[Capacity], stored_bytes: f64, tensor_bytes: f64) -> String {
    let cores = caps
        .iter()
        .find(|c| c.tier == "cpu")
        .map_or(f64::NAN, |c| per_gpu / c.per_unit());
    let read = per_gpu * stored_bytes;
    format!(
        "sizing per GPU at {per_gpu:.0} samples/s: {cores:.1} CPU cores, {:.0} MB/s of shard reads \
         ({:.1} spindles at 180 MB/s sequential, {:.1} Gb/s storage→CPU), {:.1} Gb/s of tensors CPU→GPU",
        read / 1e6,
        read / 180e6,
        read * 8.0 / 1e9,
        per_gpu * tensor_bytes * 8.0 / 1e9
    )
}

/// Mean bytes of a stored sample (what storage reads per sample).
pub fn stored_bytes_per_sample(manifest: &Manifest) -> f64 {
    manifest.total_bytes() as f64 / manifest.total_samples().max(1) as f64
}

/// What the tier probes run on.
pub struct Probe<'a> {
    pub manifest: &'a Manifest,
    pub pipeline: &'a str,
    /// The pipeline's output side and bytes per output sample.
    pub side: u32,
    pub sample_bytes: f64,
    /// Decode threads the CPU tier has.
    pub cores: usize,
    /// QUIC connections the chain uses (workers × ranks).
    pub connections: f64,
    pub seconds: f64,
}

impl<'a> Probe<'a> {
    /// Probes for a chain of `workers` × `ranks` connections whose workers have `cores` decode
    /// threads in all, each tier measured for about `seconds`.
    pub fn chain(
        manifest: &'a Manifest,
        pipeline: &'a str,
        cores: usize,
        workers: usize,
        ranks: u32,
        seconds: f64,
    ) -> Result<Probe<'a>> {
        let (side, sample_bytes) = tensor_size(pipeline)?;
        Ok(Probe {
            manifest,
            pipeline,
            side,
            sample_bytes,
            cores,
            connections: (workers as u32 * ranks) as f64,
            seconds,
        })
    }
}

/// A pipeline's output tensor: its larger side and its bytes per sample. The pipeline must
/// fix its output size (the chain batches its samples).
pub fn tensor_size(pipeline: &str) -> Result<(u32, f64)> {
    let spec: PipelineSpec = pipeline.parse()?;
    let Some((h, w)) = spec.output_size() else {
        return Err(TestbedError::Setup(format!(
            "--pipeline {pipeline:?} must fix the output size"
        )));
    };
    Ok((h.max(w), (h * w * 3) as f64 * spec.dtype().size() as f64))
}

/// Storage reads, the CPU engine and the QUIC transport, each measured alone, as capacities
/// of the deployment described by `p`.
pub fn measure(p: &Probe<'_>) -> Result<Vec<Capacity>> {
    let per_sample_stored = stored_bytes_per_sample(p.manifest);
    let storage_bps = storage_bytes_per_s(p.manifest, p.seconds / 2.0)?;
    let engine = engine_samples_per_s(p.manifest, p.pipeline, p.cores, p.seconds)?;
    let quic_bps = crate::transport::quic_probe(1024, p.side)?;
    Ok(vec![
        Capacity {
            tier: "storage",
            samples_per_s: storage_bps / per_sample_stored,
            units: 1.0,
            unit: "node",
            detail: format!(
                "{:.0} MB/s of {:.0} KB samples",
                storage_bps / 1e6,
                per_sample_stored / 1e3
            ),
        },
        Capacity {
            tier: "cpu",
            samples_per_s: engine,
            units: p.cores as f64,
            unit: "core",
            detail: p.pipeline.to_string(),
        },
        Capacity {
            tier: "transport",
            samples_per_s: quic_bps / p.sample_bytes * p.connections,
            units: p.connections,
            unit: "connection",
            detail: format!("QUIC {:.2} GB/s per connection", quic_bps / 1e9),
        },
    ])
}

/// The bottleneck and the report's lines about it, with the per-GPU sizing when the consumers
/// have a step time.
pub fn conclude(
    caps: &[Capacity],
    consumers: &ConsumerConfig,
    stored_bytes: f64,
    tensor_bytes: f64,
) -> (String, Vec<String>) {
    let demand = consumers.demand();
    let (bottleneck, mut lines) = verdict(caps, demand);
    if let Some(d) = demand {
        let per_rank = d / f64::from(consumers.ranks.max(1));
        lines.push(per_gpu(per_rank, caps, stored_bytes, tensor_bytes));
    }
    (bottleneck, lines)
}

/// The chain's counters read at one instant: from this process's recorder (where in-process
/// tiers and the client record) plus the `/metrics` pages of running daemons.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    /// Seconds since the run started.
    pub t: f64,
    pub storage_bytes: f64,
    pub worker_samples: f64,
    pub client_samples: f64,
    pub client_wait: f64,
}

impl Reading {
    /// Reads the counters now; a daemon that does not answer counts as zero.
    pub fn take(metrics: &[String], started: Instant) -> Reading {
        let mut text = sluice_daemon::metrics_handle().render();
        for url in metrics {
            if let Ok(body) = reqwest::blocking::get(url).and_then(|r| r.text()) {
                text.push_str(&body);
            }
        }
        Reading {
            t: started.elapsed().as_secs_f64(),
            storage_bytes: counter_in(&text, "sluice_storage_bytes_sent_total"),
            // Over QUIC and over same-host memory: the workers count each apart.
            worker_samples: counter_in(&text, "sluice_cpu_samples_sent_total")
                + counter_in(&text, "sluice_cpu_same_host_samples_total"),
            client_samples: counter_in(&text, "sluice_client_samples_total"),
            client_wait: counter_in(&text, "sluice_client_wait_seconds_sum"),
        }
    }
}

/// The sum of a counter's series in Prometheus text.
pub fn counter_in(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each interval between readings: every tier's samples/s, and the consumers' starved
/// fraction when they have a step time (with none they always wait, so it is null).
pub fn timeline(
    readings: &[Reading],
    stored_bytes_per_sample: f64,
    consumers: &ConsumerConfig,
) -> Vec<serde_json::Value> {
    readings
        .windows(2)
        .map(|p| {
            let dt = (p[1].t - p[0].t).max(1e-9);
            let starved = (consumers.step_ms > 0.0).then(|| {
                ((p[1].client_wait - p[0].client_wait) / dt / f64::from(consumers.ranks.max(1)))
                    .clamp(0.0, 1.0)
            });
            json!({
                "t": p[1].t,
                "storage_samples_per_s":
                    (p[1].storage_bytes - p[0].storage_bytes) / stored_bytes_per_sample / dt,
                "cpu_samples_per_s": (p[1].worker_samples - p[0].worker_samples) / dt,
                "consumer_samples_per_s": (p[1].client_samples - p[0].client_samples) / dt,
                "starved_fraction": starved,
            })
        })
        .collect()
}

/// JPEGs for `sluice bench cpu`, as in-memory samples: every `.jpg`/`.jpeg` under `dir`
/// (recursively, sorted), or 300 generated images without one. Also says what they are.
/// Gives each sample's JPEG restart markers as `sluice shard` does (those it helps; the rest stay
/// as they are); returns the total JPEG bytes before and after.
pub fn add_restart_markers(samples: &mut [Sample]) -> Result<(u64, u64)> {
    let (mut before, mut after) = (0u64, 0u64);
    for s in samples.iter_mut() {
        for f in &mut s.fields {
            before += f.data.len() as u64;
            let marked = sluice_cpu::jpeg::with_restart_markers(&f.data, Default::default())
                .map_err(|e| TestbedError::Setup(format!("restart markers for {}: {e}", s.key)))?;
            if let Some(m) = marked {
                f.data = m;
            }
            after += f.data.len() as u64;
        }
    }
    Ok((before, after))
}

pub fn bench_images(dir: Option<&std::path::Path>) -> Result<(Vec<Sample>, String)> {
    let sample = |index: u64, jpeg: Vec<u8>| Sample {
        shard: "bench".into(),
        key: format!("{index:06}"),
        index,
        start: 0,
        end: 0,
        fields: vec![Field {
            name: "jpg".into(),
            data: jpeg,
        }],
        checksum: None,
    };
    let Some(dir) = dir else {
        let samples = (0..300u32)
            .map(|i| {
                let (w, h, px) = sluice_dataset::synth::render(u64::from(i) * 7919, i % 10, 10);
                let jpeg = sluice_dataset::synth::encode_jpeg(w, h, &px, 90)?;
                Ok(sample(u64::from(i), jpeg))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok((samples, "300 generated JPEGs".into()));
    };
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let listing = TestbedError::io(format!("reading {}", d.display()));
        let entries = std::fs::read_dir(&d)
            .and_then(|entries| entries.collect::<std::io::Result<Vec<_>>>())
            .map_err(listing)?;
        for e in entries {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| {
                matches!(x.to_string_lossy().to_lowercase().as_str(), "jpg" | "jpeg")
            }) {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(TestbedError::Setup(format!(
            "no JPEGs under {}",
            dir.display()
        )));
    }
    let samples = files
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let jpeg =
                std::fs::read(p).map_err(TestbedError::io(format!("reading {}", p.display())))?;
            Ok(sample(i as u64, jpeg))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((
        samples,
        format!("{} JPEGs from {}", files.len(), dir.display()),
    ))
}

/// What the CPU engine did with in-memory samples over a measured time.
#[derive(Clone, Debug)]
pub struct EngineRun {
    /// Images the engine processed in the measured passes, skipped ones included.
    pub images: u64,
    /// Of those, the ones it turned into tensors.
    pub done: u64,
    pub seconds: f64,
    /// The decoder's share of the engine's time (the rest: resize, flip, layout).
    pub decode_share: f64,
    /// Samples the decoder refused in the warm-up pass (named).
    pub skipped: Vec<String>,
    /// CPU seconds (user + system) the process used over the measured passes: what the
    /// images cost whatever else shared the cores.
    pub cpu_secs: f64,
}

impl EngineRun {
    /// Images turned into tensors per second: a skipped image is no work done, so a run that
    /// skipped them all never reports a rate ([`engine_run`] fails instead).
    pub fn images_per_s(&self) -> f64 {
        self.done as f64 / self.seconds.max(1e-9)
    }
}

/// Samples [`engine_run`] hands the engine at a time: fewer than the output tensors it keeps
/// spare (512), more than its threads can leave idle at a part's end.
const ENGINE_RUN_CHUNK: usize = 256;

/// Runs the engine over `samples` again and again for `seconds` after one warm-up pass, each
/// pass a new epoch (new crops): the engine alone, as `sluice bench cpu` measures it. The
/// images are read unlabeled (a folder of JPEGs has no `.cls`); a corpus of which the
/// warm-up pass decodes nothing is an error naming the first reason, never a rate.
pub fn engine_run(
    samples: &[Sample],
    pipeline: PipelineSpec,
    config: EngineConfig,
    seconds: f64,
) -> Result<EngineRun> {
    let unlabeled = sluice_cpu::FieldSpec {
        label: sluice_wire::LabelSource::None,
        ..Default::default()
    };
    let engine = Engine::new(pipeline, config)?.with_fields(unlabeled);
    let ctx = |epoch| SampleContext {
        seed: 0,
        epoch,
        shard: 0,
    };
    let mut epoch = 0;
    let skipped = engine
        .process_all(samples, &ctx(epoch))
        .into_iter()
        .filter_map(|o| match o {
            Outcome::Skipped(e) => Some(e.to_string()),
            Outcome::Done(_) => None,
        })
        .collect::<Vec<String>>();
    if skipped.len() == samples.len() {
        return Err(TestbedError::Setup(format!(
            "every one of the {} images was skipped, so there is no rate to report; the first: {}",
            samples.len(),
            skipped.first().map_or("(none)", String::as_str)
        )));
    }
    let t0 = engine.times();
    let (d0, x0) = (
        t0.decode_ns.load(Ordering::Relaxed),
        t0.transform_ns.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let usage = crate::host_cost::ProcessUsage::now();
    let (mut images, mut done) = (0u64, 0u64);
    while started.elapsed().as_secs_f64() < seconds {
        epoch += 1;
        // A few hundred at a time, as a worker's units keep about that many in flight: every
        // tensor goes back to the engine before the next ones are made, as a worker's do once
        // they are sent. (The whole corpus at once held more tensors than the engine keeps
        // spare, so each pass allocated, faulted in and freed hundreds of fresh ones: 3-4% of
        // the rate, a cost no worker pays.)
        for part in samples.chunks(ENGINE_RUN_CHUNK) {
            let outcomes = engine.process_all(part, &ctx(epoch));
            images += outcomes.len() as u64;
            for outcome in outcomes {
                if let Outcome::Done(p) = outcome {
                    done += 1;
                    engine.recycle(p.tensor.data);
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu_secs = crate::host_cost::ProcessUsage::now()
        .since(&usage)
        .cpu_secs();
    let t = engine.times();
    let decode = (t.decode_ns.load(Ordering::Relaxed) - d0) as f64;
    let transform = (t.transform_ns.load(Ordering::Relaxed) - x0) as f64;
    Ok(EngineRun {
        images,
        done,
        seconds: secs,
        decode_share: decode / (decode + transform).max(1.0),
        skipped,
        cpu_secs,
    })
}

/// Images per second whose coefficients `threads` threads entropy-decode, each reading every
/// sample's `jpg` again and again for `seconds` after one pass (no IDCT, colour conversion or
/// resize: the floor of any decoder of whole images, see [`sluice_cpu::jpeg::EntropyReader`]).
/// Images it cannot read are left out of the rate.
/// JPEGs with restart markers are read with libjpeg-turbo's fast Huffman path kept across
/// their intervals (the vendored decoder's patch, as the engine runs it) when `fast`, else as
/// upstream reads them ([`sluice_cpu::jpeg::restart_fast_path`]).
pub fn entropy_rate(samples: &[Sample], threads: usize, seconds: f64, fast: bool) -> Result<f64> {
    let jpegs: Vec<&[u8]> = samples
        .iter()
        .filter_map(|s| s.fields.iter().find(|f| f.name == "jpg"))
        .map(|f| f.data.as_slice())
        .collect();
    let readable = |reader: &mut sluice_cpu::jpeg::EntropyReader| {
        jpegs
            .iter()
            .filter(|j| reader.read(j).is_ok())
            .copied()
            .collect::<Vec<&[u8]>>()
    };
    let reader = || {
        sluice_cpu::jpeg::EntropyReader::new()
            .map_err(|e| TestbedError::Setup(format!("the entropy decoder: {e}")))
    };
    let good = readable(&mut reader()?);
    if good.is_empty() {
        return Err(TestbedError::Setup(
            "no image's coefficients could be read, so there is no entropy-decode rate".into(),
        ));
    }
    let started = Instant::now();
    let counts = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let good = &good;
                scope.spawn(move || -> Result<u64> {
                    sluice_cpu::jpeg::restart_fast_path(fast);
                    let mut reader = reader()?;
                    let mut n = 0u64;
                    // Each thread starts at its own place in the corpus.
                    let mut i = t * good.len() / threads.max(1);
                    while started.elapsed().as_secs_f64() < seconds {
                        let _ = reader.read(good[i % good.len()]);
                        n += 1;
                        i += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(TestbedError::Setup("a thread panicked".into())))
            })
            .collect::<Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// One run of the whole chain: what each rank got, how long it took, and the counters read
/// every 250 ms while it ran.
pub struct ChainRun {
    pub results: Vec<crate::consumers::RankResult>,
    pub seconds: f64,
    pub readings: Vec<Reading>,
    /// CPU seconds this process's threads spent on the run, by tier
    /// ([`crate::tier_cpu::TIERS`]): the tiers' own only when they run in this process.
    pub cpu: std::collections::BTreeMap<&'static str, f64>,
}

impl ChainRun {
    /// Samples delivered (or skipped) per second, over every rank.
    pub fn samples_per_s(&self) -> f64 {
        let n: u64 = self.results.iter().map(|r| r.delivered + r.skipped).sum();
        n as f64 / self.seconds.max(1e-9)
    }

    /// Shard bytes the workers read for the run's units: (from storage, from their caches).
    pub fn shard_bytes(&self) -> (u64, u64) {
        self.results.iter().fold((0, 0), |(s, c), r| {
            (s + r.storage_bytes, c + r.cached_bytes)
        })
    }

    /// Each broken rank-epoch of the exactly-once contract, described.
    pub fn broken(&self) -> Vec<&String> {
        self.results.iter().flat_map(|r| &r.broken).collect()
    }
}

/// Runs `consumers` over the chain once, reading this process's counters and `metrics` URLs
/// every 250 ms for the timeline.
pub fn run_chain(
    consumers: &ConsumerConfig,
    manifest: &Manifest,
    metrics: &[String],
    observer: &dyn crate::consumers::Observer,
) -> Result<ChainRun> {
    let started = Instant::now();
    let readings = std::sync::Mutex::new(vec![Reading::take(metrics, started)]);
    let cpu = std::sync::Mutex::new(crate::tier_cpu::ThreadCpu::start());
    // The sampler stops as soon as the consumers are done (the sender dropped), so it adds
    // nothing to the time measured. Threads' CPU is read more often than the counters: a
    // loader's threads end with it, and what they did since their last reading is lost.
    let (done, stop) = std::sync::mpsc::sync_channel::<()>(1);
    let (shared, threads) = (&readings, &cpu);
    let (results, seconds) = std::thread::scope(|s| {
        s.spawn(move || {
            let mut tick = 0u32;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stop.recv_timeout(Duration::from_millis(50))
            {
                if let Ok(mut t) = threads.lock() {
                    t.sample();
                }
                tick += 1;
                if tick % 5 == 0 {
                    if let Ok(mut r) = shared.lock() {
                        r.push(Reading::take(metrics, started));
                    }
                }
            }
        });
        let r = crate::consumers::run_ranks(consumers, manifest, observer);
        let seconds = started.elapsed().as_secs_f64();
        drop(done);
        r.map(|r| (r, seconds))
    })?;
    let mut cpu = cpu.into_inner().unwrap_or_default();
    cpu.sample();
    Ok(ChainRun {
        results,
        seconds,
        readings: readings.into_inner().unwrap_or_default(),
        cpu: cpu.by_tier(),
    })
}

/// The anchor benchmarks' results (`../shared/bench/anchors/run_all.sh`): lines of
/// `name<TAB>images_per_s<TAB>notes`; `#` lines and `NA` values are skipped, and a name
/// measured more than once gets the median.
pub fn read_anchor_results(
    path: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(path).map_err(TestbedError::io(format!(
        "reading anchor results {}",
        path.display()
    )))?;
    let mut all: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut cells = line.split('\t');
        let (Some(name), Some(value)) = (cells.next(), cells.next()) else {
            continue;
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            all.entry(name.trim().to_string()).or_default().push(v);
        }
    }
    Ok(all
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            (name, v[v.len() / 2])
        })
        .collect())
}

/// A clip corpus from an image corpus, for `sluice bench cpu --clip-frames`: from each of
/// (at most) `clips` images, `frames` JPEG frames (quality 90) of a window of three quarters
/// of the image moving across it, as one clip sample (`mjpeg`); and the same frames as
/// images of their own (`jpg`), to measure a frame beside an image of its size.
pub fn bench_clips(
    images: &[Sample],
    clips: usize,
    frames: u32,
) -> Result<(Vec<Sample>, Vec<Sample>)> {
    let mut decoder = sluice_cpu::jpeg::JpegDecoder::new(Default::default())
        .map_err(|e| TestbedError::Setup(format!("the JPEG decoder: {e}")))?;
    let (mut out, mut singles) = (Vec::new(), Vec::new());
    for s in images {
        if out.len() >= clips {
            break;
        }
        let Some(jpg) = s.fields.iter().find(|f| f.name == "jpg") else {
            continue;
        };
        let Ok(header) = decoder.header(&jpg.data) else {
            continue;
        };
        let (w, h) = (header.width, header.height);
        let whole = sluice_cpu::jpeg::Rect { x: 0, y: 0, w, h };
        let mut rgb = Vec::new();
        if decoder
            .decode_region(&jpg.data, &header, whole, 8, &mut rgb)
            .is_err()
        {
            continue;
        }
        let (fw, fh) = ((w * 3 / 4).max(1), (h * 3 / 4).max(1));
        let mut mjpeg = Vec::new();
        for k in 0..frames {
            let x0 = ((w - fw) as u64 * u64::from(k) / u64::from(frames.max(2) - 1)) as u32;
            let mut px = Vec::with_capacity(fw as usize * fh as usize * 3);
            for y in 0..fh as usize {
                let row = (y * w as usize + x0 as usize) * 3;
                px.extend_from_slice(&rgb[row..row + fw as usize * 3]);
            }
            let frame = sluice_dataset::synth::encode_jpeg(fw, fh, &px, 90)?;
            let index = singles.len() as u64;
            singles.push(one_field(
                s,
                (format!("{index:06}"), index),
                "jpg",
                frame.clone(),
            ));
            mjpeg.extend(frame);
        }
        let index = out.len() as u64;
        out.push(one_field(
            s,
            (format!("clip{index:04}"), index),
            "mjpeg",
            mjpeg,
        ));
    }
    if out.is_empty() {
        return Err(TestbedError::Setup(
            "no image of the corpus decodes: no clips".into(),
        ));
    }
    Ok((out, singles))
}

/// `like`, as sample `index` named `key`, with one field `name` holding `data`.
fn one_field(like: &Sample, (key, index): (String, u64), name: &str, data: Vec<u8>) -> Sample {
    Sample {
        key,
        index,
        fields: vec![Field {
            name: name.into(),
            data,
        }],
        ..like.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_decoding_reads_jpegs_and_refuses_garbage() {
        let (samples, _) = bench_images(None).unwrap();
        let rate = entropy_rate(&samples[..20], 1, 0.05, true).unwrap();
        assert!(rate > 0.0);
        let mut reader = sluice_cpu::jpeg::EntropyReader::new().unwrap();
        assert!(reader.read(b"not a jpeg").is_err());
        // A fresh handle after the error: the next image reads.
        assert!(reader.read(&samples[0].fields[0].data).is_ok());
    }

    #[test]
    fn anchor_results_take_the_median_and_skip_what_failed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("anchors.tsv");
        std::fs::write(
            &path,
            "# anchors 2026-11-23 host=x nproc=2\n\
             dali_cpu_roi_decode_t1\t410.5\tmedian of 3\n\
             dali_cpu_roi_decode_t1\t472\t\n\
             dali_cpu_roi_decode_t1\t400\t\n\
             spdl_ffmpeg\tNA\tnot available\n\
             garbage line\n",
        )
        .unwrap();
        let got = read_anchor_results(&path).unwrap();
        assert_eq!(got.get("dali_cpu_roi_decode_t1"), Some(&410.5));
        assert!(!got.contains_key("spdl_ffmpeg"));
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn a_pipeline_without_a_fixed_size_has_no_tensor_size() {
        assert_eq!(
            tensor_size("decode | random_resized_crop 224").unwrap(),
            (224, 224.0 * 224.0 * 3.0)
        );
        let e = tensor_size("decode | hflip 0.5").unwrap_err().to_string();
        assert!(e.contains("output size"), "{e}");
    }
}
