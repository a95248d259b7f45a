//! Each tier measured alone, and the sizing rule: the chain runs at the speed of its slowest
//! tier, so the report names that tier, why, and how many more of its units (storage nodes,
//! CPU cores, connections) would move the bottleneck elsewhere.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use sluice_cpu::{Engine, EngineConfig, Outcome, PipelineSpec, SampleContext};
use sluice_shard::Manifest;

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
    let client = reqwest::blocking::Client::builder().timeout(None).build()?;
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
                        let mut resp = client.get(&shard.url).send()?.error_for_status()?;
                        loop {
                            let n = resp.read(&mut buf)?;
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
            .map(|h| h.join().unwrap_or_else(|_| bail!("a reader panicked")))
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
            urls: vec![shard.url.clone()],
            info: shard.clone(),
        };
        for s in source.open_unit(&loc, 0, shard.samples)? {
            samples.push(s?);
        }
        if samples.len() >= 256 {
            break;
        }
    }
    let spec: PipelineSpec = pipeline.parse()?;
    let engine = Engine::new(
        spec,
        EngineConfig {
            threads,
            ..Default::default()
        },
    )?;
    let ctx = |epoch| SampleContext {
        seed: 0,
        epoch,
        shard: 0,
    };
    engine.process_all(&samples, &ctx(0));
    let started = Instant::now();
    let (mut n, mut epoch) = (0u64, 1);
    while started.elapsed().as_secs_f64() < secs {
        n += engine
            .process_all(&samples, &ctx(epoch))
            .iter()
            .filter(|o| matches!(o, Outcome::Done(_)))
            .count() as u64;
        epoch += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
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

/// Storage reads, the CPU engine and the QUIC transport, each measured alone, as capacities
/// of the deployment described by `p`.
pub fn measure(p: &Probe<'_>) -> Result<Vec<Capacity>> {
    let per_sample_stored = stored_bytes_per_sample(p.manifest);
    let storage_bps = storage_bytes_per_s(p.manifest, p.seconds / 2.0)?;
    let engine = engine_samples_per_s(p.manifest, p.pipeline, p.cores, p.seconds)?;
    let quic_bps = super::bench_transport::quic_probe(1024, p.side)?;
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
    consumers: &super::loadgen::Consumers,
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
