//! Shards written by `sluice shard` read the same in the Python `webdataset` package: same
//! keys, same field bytes, every sample, in order. Skips (with a message) when no Python with
//! webdataset is found, unless `SLUICE_REQUIRE_PYTHON` is set (CI sets it).

mod support;

use std::process::Command;

use sha2::{Digest, Sha256};
use support::{path_str, shared_data, sluice_ok, webdataset_python};

const READ_PY: &str = r#"
import hashlib, sys, webdataset as wds
ds = wds.WebDataset(sys.argv[1:], shardshuffle=False, empty_check=False)
for s in ds:
    fields = sorted((k, hashlib.sha256(v).hexdigest()) for k, v in s.items() if not k.startswith("__"))
    print(s["__key__"] + "\t" + " ".join(k + "=" + h for k, h in fields))
"#;

fn ours(shards: &[std::path::PathBuf]) -> Vec<String> {
    let mut lines = Vec::new();
    for s in shards {
        for sample in sluice_shard::open_shard(s, &Default::default()).unwrap() {
            let sample = sample.unwrap();
            let mut fields: Vec<String> = sample
                .fields
                .iter()
                .map(|f| format!("{}={:x}", f.name, Sha256::digest(&f.data)))
                .collect();
            fields.sort();
            lines.push(format!("{}\t{}", sample.key, fields.join(" ")));
        }
    }
    lines
}

fn compare(input: &[&str], extra: &[&str]) {
    let Some(python) = webdataset_python() else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let pattern = format!("{}/wds-%03d.tar", out.path().display());
    let mut args = vec!["shard"];
    args.extend_from_slice(input);
    args.extend_from_slice(&["--output", &pattern]);
    args.extend_from_slice(extra);
    sluice_ok(&args);
    let shards = support::shard_files(out.path());
    let py = support::succeed(Command::new(python).arg("-c").arg(READ_PY).args(&shards));
    let theirs: Vec<String> = String::from_utf8(py.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let ours = ours(&shards);
    assert!(!ours.is_empty());
    assert_eq!(ours.len(), theirs.len(), "sample counts differ");
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b);
    }
}

#[test]
fn webdataset_reads_generated_shards_identically() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 3, 7);
    std::fs::write(
        images.join("class_002/img_002_00001.seg.png"),
        b"not really a png",
    )
    .unwrap();
    compare(&["--input", path_str(&images)], &["--max-count", "5"]);
}

#[test]
fn webdataset_reads_imagenet_sample_shards_identically() {
    let Some(dir) = shared_data("imagenet-sample") else {
        eprintln!("skipping: ../shared/data/imagenet-sample is absent");
        return;
    };
    let labels = dir.join("labels.tsv");
    compare(
        &["--input", path_str(&dir), "--labels", path_str(&labels)],
        &["--max-size", "30000000"],
    );
}
