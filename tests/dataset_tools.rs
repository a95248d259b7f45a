//! The dataset tools end to end through the real binary: `synth`, `shard` (ImageFolder,
//! labelled flat folder, tar on stdin), `index` and `inspect`.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use sluice_shard::{Manifest, ReadOptions, SampleIndex};
use support::{path_str, shard_files, shared_data, sluice, sluice_ok, succeed};

fn read_samples(shards: &[std::path::PathBuf]) -> Vec<sluice_shard::Sample> {
    let mut out = Vec::new();
    for s in shards {
        let reader = sluice_shard::open_shard(s, &Default::default()).unwrap();
        out.extend(reader.map(|r| r.unwrap()));
    }
    out
}

/// `sluice shard` of a flat folder with a labels TSV into `pattern`.
fn shard_labelled(flat: &std::path::Path, labels: &std::path::Path, pattern: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(["shard", "--input", path_str(flat), "--labels"])
        .args([path_str(labels), "--output", pattern]);
    c
}

#[test]
fn image_folder_to_shards_index_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 3, 5);
    // A non-image field beside one image, and a file with no extension (skipped).
    std::fs::write(
        images.join("class_001/img_001_00002.json"),
        br#"{"note": 1}"#,
    )
    .unwrap();
    std::fs::write(images.join("class_001/README"), b"skip me").unwrap();

    let out = dir.path().join("out");
    let pattern = format!("{}/train-%06d.tar", out.display());
    let manifest = out.join("manifest.json");
    support::shard_images(&images, &pattern, 4, Some(&manifest));
    let shards = shard_files(&out);
    assert_eq!(shards.len(), 4, "15 samples at 4 per shard");

    let samples = read_samples(&shards);
    assert_eq!(samples.len(), 15);
    for s in &samples {
        let class: u64 = s.key[6..9].parse().unwrap();
        assert_eq!(
            s.field("cls"),
            Some(class.to_string().as_bytes()),
            "{}",
            s.key
        );
        // Each JPEG was given restart markers (the default); `--no-restart-markers` keeps
        // the bytes (the ImageNet test below).
        let jpg = s.field("jpg").unwrap();
        assert!(sluice_cpu::restart::layout(jpg).is_some(), "{}", s.key);
    }
    let with_json = samples
        .iter()
        .find(|s| s.key == "class_001/img_001_00002")
        .unwrap();
    assert_eq!(with_json.field("json"), Some(&br#"{"note": 1}"#[..]));

    // `sluice index` agrees with what `sluice shard` recorded, and inspect validates.
    let written = Manifest::load(&manifest, 1 << 20).unwrap();
    let indexed_path = dir.path().join("indexed.json");
    let brace = format!("{}/train-{{000000..000003}}.tar", out.display());
    sluice_ok(&["index", &brace, "--output", path_str(&indexed_path)]);
    let indexed = Manifest::load(&indexed_path, 1 << 20).unwrap();
    assert_eq!(written.total_samples(), 15);
    for (a, b) in written.shards.iter().zip(&indexed.shards) {
        assert_eq!(
            (a.size, a.samples, a.checksum),
            (b.size, b.samples, b.checksum)
        );
        assert_eq!(b.url, format!("out/{}", a.url));
    }
    let idx = SampleIndex::read_file(&SampleIndex::sidecar_path(&shards[0]), 1 << 20).unwrap();
    assert_eq!(idx.entries.len(), 4);
    let listing = sluice_ok(&["inspect", path_str(&shards[0])]);
    // Shards hold a seeded random order (not the class-sorted input order).
    let first = sluice_shard::SampleReader::new(
        std::fs::File::open(&shards[0]).unwrap(),
        "s",
        &ReadOptions::default(),
    )
    .next_sample()
    .unwrap()
    .unwrap();
    assert!(
        listing.contains(&format!("0\t{}\tjpg: ", first.key)) && listing.contains(" B, cls: "),
        "{listing}"
    );
    assert!(listing.contains(": ok, 4 samples"), "{listing}");
}

#[test]
fn sharding_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 2, 3);
    let run = |name: &str, extra: &[&str]| {
        let pattern = format!("{}/{name}/s-%03d.tar", dir.path().display());
        let mut args = vec![
            "shard",
            "--input",
            path_str(&images),
            "--output",
            &pattern,
            "--max-size",
            "100000",
        ];
        args.extend(extra);
        sluice_ok(&args);
        shard_files(&dir.path().join(name))
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect::<Vec<_>>()
    };
    let unmarked = ["--no-restart-markers"];
    let (a, b) = (run("a", &unmarked), run("b", &unmarked));
    assert!(a.len() > 1, "--max-size splits the shards");
    assert_eq!(a, b);
    // Restart markers (the default) are added on every core, and the shards still come out
    // the same.
    let (c, d) = (run("c", &[]), run("d", &[]));
    assert_eq!(c, d);
    assert_ne!(a, c);
}

#[test]
fn labelled_flat_folder_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("flat");
    std::fs::create_dir(&flat).unwrap();
    for (name, data) in [
        ("b.JPEG", "bb"),
        ("a.JPEG", "aa"),
        ("c.JPEG", "cc"),
        ("a.txt", "caption"),
    ] {
        std::fs::write(flat.join(name), data).unwrap();
    }
    let labels = dir.path().join("labels.tsv");
    std::fs::write(
        &labels,
        "file\tclass_index\tname\na.JPEG\t5\tx\nb.JPEG\t2\ty\n",
    )
    .unwrap();
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    let out = succeed(shard_labelled(&flat, &labels, &pattern));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 samples"),
        "c.JPEG has no label and is reported"
    );
    let samples = read_samples(&shard_files(&dir.path().join("out")));
    let got: Vec<_> = samples
        .iter()
        .map(|s| {
            (
                s.key.as_str(),
                s.field("jpg").unwrap(),
                s.field("cls").unwrap(),
                s.field("txt"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a", &b"aa"[..], &b"5"[..], Some(&b"caption"[..])),
            ("b", &b"bb"[..], &b"2"[..], None)
        ]
    );

    for (table, expect) in [
        ("file\tlabel\na.JPEG\t1\n", "\"class_index\""),
        ("file\tclass_index\na.JPEG\tseven\n", "labels.tsv:2"),
        ("file\tclass_index\nmissing.JPEG\t1\n", "missing.JPEG"),
    ] {
        std::fs::write(&labels, table).unwrap();
        let out = shard_labelled(&flat, &labels, &pattern).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "expected {expect:?} in: {err}");
    }
}

#[test]
fn reshards_a_tar_stream_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 2, 4);
    let tar = Command::new("tar")
        .arg("-cf")
        .arg("-")
        .arg("-C")
        .arg(&images)
        .arg(".")
        .output();
    let Some(tar) = tar.ok().filter(|o| o.status.success()) else {
        eprintln!("skipping: GNU tar not available");
        return;
    };
    // `sluice shard --input -` of the tar into `dir/name`, with `extra` arguments.
    let shard_stdin = |name: &str, extra: &[&str]| {
        let pattern = format!("{}/{name}/s-%02d.tar", dir.path().display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["shard", "--input", "-", "--output", &pattern])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&tar.stdout).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        read_samples(&shard_files(&dir.path().join(name)))
    };
    let samples = shard_stdin("out", &["--max-count", "3"]);
    assert_eq!(samples.len(), 8);
    let keys: Vec<_> = samples
        .iter()
        .map(|s| s.key.trim_start_matches("./").to_string())
        .collect();
    assert!(
        keys.contains(&"class_001/img_001_00003".to_string()),
        "{keys:?}"
    );

    // Every JPEG of the stream got restart markers (the default); with
    // `--no-restart-markers`, none did.
    for (name, extra, marked) in [
        ("plain", &["--no-restart-markers"][..], false),
        ("marked", &[], true),
    ] {
        let samples = shard_stdin(name, extra);
        assert_eq!(samples.len(), 8);
        for s in &samples {
            let jpg = s.fields.iter().find(|f| f.name == "jpg").unwrap();
            let layout = sluice_cpu::restart::layout(&jpg.data);
            assert_eq!(layout.is_some(), marked, "{name}: {}", s.key);
        }
    }
}

#[test]
fn inspect_fails_on_a_broken_shard_naming_shard_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 1, 3);
    let pattern = format!("{}/s-%02d.tar", dir.path().display());
    sluice_ok(&["shard", "--input", path_str(&images), "--output", &pattern]);
    let shard = dir.path().join("s-00.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    let second = SampleIndex::read_file(&SampleIndex::sidecar_path(&shard), 1 << 20)
        .unwrap()
        .entries[1]
        .offset;
    bytes[second as usize + 10] ^= 0x55; // corrupt the second sample's header
    std::fs::write(&shard, &bytes).unwrap();
    let out = sluice(&["inspect", path_str(&shard)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("s-00.tar") && err.contains(&format!("byte {second}")),
        "{err}"
    );

    // Truncated: also an error, with the entry named.
    std::fs::write(&shard, &bytes[..second as usize + 700]).unwrap();
    let err = String::from_utf8_lossy(&sluice(&["inspect", path_str(&shard)]).stderr).into_owned();
    assert!(
        err.contains("bad tar header checksum") || err.contains("truncated"),
        "{err}"
    );

    // Not a tar at all.
    std::fs::write(&shard, b"<html>not a shard</html>").unwrap();
    assert!(!sluice(&["inspect", path_str(&shard)]).status.success());

    // A zero-byte file (a copy that failed) is no shard for inspect or index, as for GNU tar.
    let zero = dir.path().join("zero.tar");
    std::fs::write(&zero, b"").unwrap();
    let manifest = dir.path().join("m.json");
    for args in [
        vec!["inspect", path_str(&zero)],
        vec!["index", path_str(&zero), "--output", path_str(&manifest)],
    ] {
        let out = sluice(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted an empty file");
        assert!(err.contains("zero.tar") && err.contains("empty"), "{err}");
    }
    assert!(
        !manifest.exists(),
        "no manifest for a dataset with an empty shard"
    );
}

#[test]
fn errors_say_each_cause_once_and_name_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    // A missing config: the OS error once, not twice.
    let missing = dir.path().join("nope.toml");
    let err = String::from_utf8_lossy(&sluice(&["cpu", "--config", path_str(&missing)]).stderr)
        .into_owned();
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // A state directory that is a file: the error says it is the state directory.
    let file = dir.path().join("afile");
    std::fs::write(&file, b"").unwrap();
    let out = sluice(&[
        "cpu",
        "--listen",
        "127.0.0.1:0",
        "--no-auth",
        "--state-dir",
        path_str(&file),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("state directory") && err.contains("afile"),
        "{err}"
    );
    // A labels file inside the folder it labels is not a sample left without a label.
    let images = support::synth_images(dir.path(), 1, 2);
    let flat = dir.path().join("flat");
    std::fs::create_dir_all(&flat).unwrap();
    let mut tsv = String::from("file\tclass_index\n");
    for e in std::fs::read_dir(images.join("class_000")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), flat.join(e.file_name())).unwrap();
        tsv.push_str(&format!("{}\t0\n", e.file_name().to_string_lossy()));
    }
    std::fs::write(flat.join("labels.tsv"), tsv).unwrap();
    let out = sluice(&[
        "shard",
        "--input",
        path_str(&flat),
        "--labels",
        path_str(&flat.join("labels.tsv")),
        "--output",
        path_str(&dir.path().join("out/s-%06d.tar")),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("no row"),
        "the labels file counted as a sample: {err}"
    );
}

#[test]
fn shards_the_real_imagenet_sample_with_its_labels() {
    let Some(dir) = shared_data("imagenet-sample") else {
        eprintln!("skipping: ../shared/data/imagenet-sample is absent");
        return;
    };
    let labels_path = dir.join("labels.tsv");
    let labels: BTreeMap<String, String> = std::fs::read_to_string(&labels_path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (
                cols[0].trim_end_matches(".JPEG").to_string(),
                cols[1].to_string(),
            )
        })
        .collect();
    let out = tempfile::tempdir().unwrap();
    let pattern = format!("{}/imagenet-%04d.tar", out.path().display());
    let manifest = out.path().join("manifest.json");
    sluice_ok(&[
        "shard",
        "--input",
        path_str(&dir),
        "--labels",
        path_str(&labels_path),
        "--output",
        &pattern,
        "--max-size",
        "20000000",
        "--manifest",
        path_str(&manifest),
        "--no-restart-markers",
    ]);
    let samples = read_samples(&shard_files(out.path()));
    assert_eq!(samples.len(), 804);
    for s in &samples {
        assert_eq!(
            std::str::from_utf8(s.field("cls").unwrap()).unwrap(),
            labels[&s.key],
            "{}",
            s.key
        );
        let original = std::fs::read(dir.join(format!("{}.JPEG", s.key))).unwrap();
        assert_eq!(s.field("jpg").unwrap(), original.as_slice());
    }
    let m = Manifest::load(&manifest, 1 << 20).unwrap();
    assert_eq!(m.total_samples(), 804);
    assert!(m.shards.len() >= 4 && m.shards.iter().all(|s| s.size <= 20_000_000));
}

#[test]
fn indexes_shards_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 2, 3);
    let shards = dir.path().join("served");
    let pattern = format!("{}/train-%06d.tar", shards.display());
    support::shard_images(&images, &pattern, 4, None);
    let addr = support::serve_dir(shards.clone());

    let manifest = dir.path().join("m/manifest.json");
    let url = format!("http://{addr}/train-{{000000..000001}}.tar");
    sluice_ok(&["index", &url, "--output", path_str(&manifest)]);
    let m = Manifest::load(&manifest, 1 << 20).unwrap();
    assert_eq!(m.total_samples(), 6);
    assert_eq!(m.shards[1].url, format!("http://{addr}/train-000001.tar"));
    let local = SampleIndex::read_file(
        &SampleIndex::sidecar_path(&shards.join("train-000000.tar")),
        1 << 20,
    )
    .unwrap();
    let fetched =
        SampleIndex::read_file(&dir.path().join("m/train-000000.tar.idx"), 1 << 20).unwrap();
    assert_eq!(local, fetched);

    let out = sluice(&[
        "index",
        &format!("http://{addr}/missing.tar"),
        "--output",
        path_str(&manifest),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.tar") && err.contains("404"), "{err}");
}

/// Restart markers, which `sluice shard` adds by default: every JPEG in the shards can be
/// entered at any MCU row and decodes to the same pixels as the file it came from; a damaged
/// JPEG and other fields are written as they were, and the damaged one is named.
#[test]
fn restart_markers_change_no_pixel_and_keep_what_they_cannot_mark() {
    use sluice_cpu::jpeg::{DecodeLimits, JpegDecoder, Rect};
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 2, 4);
    let broken = images.join("class_000/broken.jpg");
    std::fs::write(&broken, b"\xFF\xD8\xFF\xE0 not a jpeg at all").unwrap();
    let note = images.join("class_001/img_001_00000.json");
    std::fs::write(&note, br#"{"note": 1}"#).unwrap();
    let out = dir.path().join("out");
    let pattern = format!("{}/s-%03d.tar", out.display());
    let run = sluice(&["shard", "--input", path_str(&images), "--output", &pattern]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("restart markers: 8 JPEGs given them, 1 kept as they were"),
        "{stdout}"
    );
    assert!(stderr.contains("class_000/broken"), "{stderr}");

    let mut dec = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let decode = |dec: &mut JpegDecoder, data: &[u8]| {
        let h = dec.header(data).unwrap();
        let mut px = Vec::new();
        let all = Rect {
            x: 0,
            y: 0,
            w: h.width,
            h: h.height,
        };
        dec.decode_region(data, &h, all, 8, &mut px).unwrap();
        px
    };
    let samples = read_samples(&shard_files(&out));
    assert_eq!(samples.len(), 9);
    for s in &samples {
        let (class, stem) = s.key.split_once('/').unwrap();
        for f in &s.fields {
            let source = images.join(class).join(format!("{stem}.{}", f.name));
            match f.name.as_str() {
                "jpg" if stem == "broken" => {
                    assert_eq!(f.data, std::fs::read(&broken).unwrap());
                }
                "jpg" => {
                    assert!(sluice_cpu::restart::layout(&f.data).is_some(), "{}", s.key);
                    let original = std::fs::read(&source).unwrap();
                    assert!(decode(&mut dec, &f.data) == decode(&mut dec, &original));
                }
                "json" => assert_eq!(f.data, std::fs::read(&note).unwrap()),
                "cls" => {}
                other => panic!("unexpected field {other}"),
            }
        }
    }
}
