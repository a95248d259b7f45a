//! Every field travels: an ImageFolder whose images have a caption (`.txt`) and a JSON file
//! side by side goes through `sluice shard` and `sluice index`, and a Rust consumer receives,
//! for every sample, exactly the bytes of the files beside its image (absent where there were
//! none) in process, over QUIC from a real `sluice cpu`, and over same-host shared memory;
//! `loadgen --fields` says what they add per sample.

mod support;
mod system;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{FieldSelection, Loader, SameHost};
use support::{local_job, path_str, sluice_ok};
use system::{start_worker, start_worker_with, trust_file, Worker, TOKEN};

const PIPELINE: &str = "decode | random_resized_crop 48 | hflip 0.5";

/// The fields a sample should carry: (txt, json) by image stem.
type Expected = HashMap<String, (Option<Vec<u8>>, Option<Vec<u8>>)>;

/// A class-folder dataset with captions and JSON beside most images, sharded and indexed
/// with the real binary; the manifest and what each stem's fields hold.
fn dataset(dir: &Path) -> (sluice_shard::Manifest, Expected) {
    let images = support::synth_images(dir, 3, 12);
    let mut expected = Expected::new();
    for class in std::fs::read_dir(&images).unwrap() {
        for (i, img) in std::fs::read_dir(class.unwrap().path())
            .unwrap()
            .enumerate()
        {
            let img = img.unwrap().path();
            let stem = img.file_stem().unwrap().to_str().unwrap().to_string();
            let txt = (i % 4 != 1).then(|| format!("a photo of {stem}, ünïcode").into_bytes());
            let json =
                (i % 3 != 2).then(|| format!("{{\"stem\": \"{stem}\", \"i\": {i}}}").into_bytes());
            if let Some(t) = &txt {
                std::fs::write(img.with_extension("txt"), t).unwrap();
            }
            if let Some(j) = &json {
                std::fs::write(img.with_extension("json"), j).unwrap();
            }
            expected.insert(stem, (txt, json));
        }
    }
    let manifest = dir.join("shards").join("manifest.json");
    let pattern = dir.join("shards").join("s-%06d.tar");
    support::shard_images(&images, path_str(&pattern), 10, Some(&manifest));
    let mut m = sluice_shard::Manifest::load(&manifest, 1 << 20).unwrap();
    for s in &mut m.shards {
        s.url = sluice_shard::resolve_url(&manifest.display().to_string(), &s.url);
    }
    (m, expected)
}

/// Reads one epoch; checks every delivered sample's fields against the files beside its
/// image, and that each sample came once.
fn check_epoch(loader: &Loader, expected: &Expected, how: &str) {
    let mut seen = HashMap::new();
    for batch in loader.epoch(0).unwrap() {
        let batch = batch.unwrap();
        assert_eq!(batch.fields().len(), batch.len());
        for (i, key) in batch.keys().iter().enumerate() {
            let stem = key.rsplit('/').next().unwrap();
            let (txt, json) = &expected[stem];
            assert_eq!(batch.field(i, "txt"), txt.as_deref(), "{how}: txt of {key}");
            assert_eq!(
                batch.field(i, "json"),
                json.as_deref(),
                "{how}: json of {key}"
            );
            assert_eq!(
                batch.field(i, "jpg"),
                None,
                "{how}: the image is not a field"
            );
            assert_eq!(batch.field(i, "cls"), None, "{how}: cls was not asked for");
            let g = batch.geometry()[i];
            assert_eq!(g.size, (48, 48), "{how}: {g:?}");
            assert!(g.crop.2 > g.crop.0 && g.crop.3 > g.crop.1, "{how}: {g:?}");
            *seen.entry(key.clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), expected.len(), "{how}: every sample");
    assert!(seen.values().all(|n| *n == 1), "{how}: each once");
}

fn builder(manifest: &sluice_shard::Manifest) -> sluice_client::LoaderBuilder {
    Loader::builder()
        .dataset(manifest.clone())
        .pipeline(PIPELINE.into())
        .batch_size(8)
        .seed(2)
        .fields(FieldSelection::Named(vec!["txt".into(), "json".into()]))
        .worker_wait(Duration::from_secs(20))
}

/// `builder` reading from `worker` alone, with the cluster token and its certificate.
fn on_worker(
    builder: sluice_client::LoaderBuilder,
    dir: &Path,
    worker: &Worker,
) -> sluice_client::LoaderBuilder {
    let trust = trust_file(dir, &[worker]);
    builder
        .workers([worker.addr.clone()])
        .token(TOKEN)
        .trust_cert(&trust)
}

#[test]
fn fields_beside_images_reach_a_rust_consumer_over_every_transport() {
    let dir = tempfile::tempdir().unwrap();
    let (manifest, expected) = dataset(dir.path());

    let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default()).unwrap();
    let engine = sluice_cpu::EngineConfig {
        threads: 2,
        ..Default::default()
    };
    let worker = Arc::new(sluice_cpu::CpuWorker::new(engine, source).unwrap());
    let local = builder(&manifest).in_process(worker).build().unwrap();
    check_epoch(&local, &expected, "in process");

    let quic = start_worker(dir.path(), "quic");
    let remote = on_worker(builder(&manifest), dir.path(), &quic)
        .same_host(SameHost::Off)
        .build()
        .unwrap();
    check_epoch(&remote, &expected, "QUIC");
    drop(quic);

    let sockets = dir.path().join("sockets");
    let shm = start_worker_with(dir.path(), "shm", &["--same-host-dir", path_str(&sockets)]);
    let same_host = on_worker(builder(&manifest), dir.path(), &shm)
        .same_host(SameHost::Require)
        .same_host_dir(sockets.clone())
        .build()
        .unwrap();
    check_epoch(&same_host, &expected, "same host");
}

#[test]
fn loadgen_reports_the_bytes_fields_add_per_sample() {
    let dir = tempfile::tempdir().unwrap();
    let (_, expected) = dataset(dir.path());
    let manifest = dir.path().join("shards").join("manifest.json");
    let run = |fields: Option<&str>| {
        let mut args = local_job(&manifest, &["--batch-size", "8", "--pipeline", PIPELINE]);
        if let Some(f) = fields {
            args.extend(["--fields", f]);
        }
        sluice_ok(&args)
    };
    let with = run(Some("txt,json"));
    let bytes: usize = expected
        .values()
        .map(|(t, j)| t.as_ref().map_or(0, Vec::len) + j.as_ref().map_or(0, Vec::len))
        .sum();
    let per_sample = bytes as f64 / expected.len() as f64;
    let printed: f64 = with
        .lines()
        .find_map(|l| l.strip_prefix("fields (txt,json): "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fields line:\n{with}"));
    assert!(
        (printed - per_sample).abs() <= 1.0,
        "{printed} vs {per_sample}:\n{with}"
    );
    assert!(!run(None).contains("bytes per sample"));
}

/// A sample whose fields would make its frame larger than a worker sends is skipped by name
/// (it was a frame the transport refused, and a client that reconnected forever); the rest of
/// the epoch is delivered.
#[test]
fn a_sample_too_large_for_a_frame_is_skipped_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (manifest, expected) = dataset(dir.path());
    let tensor = 48 * 48 * 3;
    let limit = tensor + 40;
    let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default()).unwrap();
    let worker = sluice_cpu::CpuWorker::new(sluice_cpu::EngineConfig::default(), source)
        .unwrap()
        .with_max_sample_bytes(limit as u64);
    let loader = builder(&manifest)
        .in_process(Arc::new(worker))
        .build()
        .unwrap();
    let (mut delivered, mut skipped) = (0, Vec::new());
    for batch in loader.epoch(0).unwrap() {
        let batch = batch.unwrap();
        for i in 0..batch.len() {
            let bytes: usize = ["txt", "json"]
                .iter()
                .filter_map(|f| batch.field(i, f))
                .map(<[u8]>::len)
                .sum();
            assert!(tensor + bytes <= limit, "{} delivered", batch.keys()[i]);
            delivered += 1;
        }
        skipped.extend(batch.skipped().iter().map(|(_, why)| why.clone()));
    }
    let too_large = expected
        .values()
        .filter(|(t, j)| {
            t.as_ref().map_or(0, Vec::len) + j.as_ref().map_or(0, Vec::len) > limit - tensor
        })
        .count();
    assert!(too_large > 0 && too_large < expected.len());
    assert_eq!(skipped.len(), too_large, "{skipped:?}");
    assert_eq!(delivered + too_large, expected.len());
    assert!(
        skipped.iter().all(|w| w.contains("over the largest frame")),
        "{skipped:?}"
    );
}
