//! Differential tests: our tar reader must list the same regular files, with the same bytes,
//! as Python's `tarfile` and GNU tar, on archives those tools and Python webdataset wrote.
//! Each comparison skips with a message when its tool (python3, tar) or `../shared` is absent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_shard::read::decompressed;
use sluice_shard::{ReadOptions, TarReader};

fn ours(path: &Path) -> Vec<(String, Vec<u8>)> {
    let file = std::fs::File::open(path).unwrap();
    let stream = decompressed(std::io::BufReader::new(file)).unwrap();
    let mut reader = TarReader::new(stream, path.display().to_string(), &ReadOptions::default());
    let mut out = Vec::new();
    while let Some(e) = reader
        .next_entry()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        out.push((e.header.path, e.data));
    }
    out
}

const LIST_PY: &str = r#"
import sys, tarfile
with tarfile.open(sys.argv[1], "r:*") as t:
    for m in t:
        if m.isreg():
            data = t.extractfile(m).read()
            sys.stdout.write(m.name + "\t" + data.hex() + "\n")
"#;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn tarfile_listing(path: &Path) -> Vec<(String, Vec<u8>)> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(LIST_PY)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tarfile failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, hex) = l.rsplit_once('\t').unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (name.to_string(), bytes)
        })
        .collect()
}

/// Regular files GNU tar extracts (symlinks excluded), by relative path.
fn gnu_extraction(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("tar")
        .arg("-xf")
        .arg(path)
        .arg("-C")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "GNU tar failed on {}", path.display());
    let mut files = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                walk(root, &e.path(), files);
            } else if meta.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                files.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    walk(dir.path(), dir.path(), &mut files);
    files
}

fn check(path: &Path, hardlinks: usize) {
    let ours = ours(path);
    if have("python3") {
        assert_eq!(
            ours,
            tarfile_listing(path),
            "tarfile disagrees on {}",
            path.display()
        );
    } else {
        eprintln!("skipping the tarfile comparison: python3 not found");
    }
    if have("tar") {
        let gnu = gnu_extraction(path);
        for (name, data) in &ours {
            let name = name.trim_start_matches("./");
            assert_eq!(
                gnu.get(name),
                Some(data),
                "GNU tar disagrees on {name} in {}",
                path.display()
            );
        }
        assert_eq!(
            gnu.len(),
            ours.len() + hardlinks,
            "GNU tar extracted other files from {}",
            path.display()
        );
    } else {
        eprintln!("skipping the GNU tar comparison: tar not found");
    }
}

fn shared_testdata() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/webdataset-testdata");
    dir.is_dir().then_some(dir)
}

#[test]
fn reads_webdataset_testdata_like_tarfile_and_gnu_tar() {
    let Some(dir) = shared_testdata() else {
        eprintln!("skipping: ../shared/data/webdataset-testdata is absent");
        return;
    };
    let mut seen = 0;
    for name in [
        "tendata.tar",
        "mpdata.tar",
        "compressed.tar",
        "testgz.tar",
        "sample.tgz",
    ] {
        let path = dir.join(name);
        if path.exists() {
            check(&path, 0);
            seen += 1;
        }
    }
    assert!(seen > 0, "no test shards in {}", dir.display());
}

/// A tree with long names, a deep ustar-prefix path, links, an empty file and block-sized
/// files, archived by GNU tar in each of its formats.
fn make_tree(root: &Path) -> usize {
    let long_dir = root.join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&long_dir).unwrap();
    std::fs::write(
        long_dir.join(format!("{}.txt", "k".repeat(90))),
        b"long name",
    )
    .unwrap();
    std::fs::write(root.join("empty.bin"), b"").unwrap();
    std::fs::write(root.join("block.bin"), vec![7u8; 512]).unwrap();
    std::fs::write(root.join("odd.bin"), vec![9u8; 1025]).unwrap();
    std::fs::write(root.join("ünïcode.txt"), "snow ☃".as_bytes()).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link.txt")).unwrap();
    std::fs::hard_link(root.join("odd.bin"), root.join("hard.bin")).unwrap();
    1
}

#[test]
fn reads_gnu_tar_archives_in_every_format() {
    if !have("tar") {
        eprintln!("skipping: GNU tar not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let hardlinks = make_tree(&src);
    for (format, extra) in [
        ("gnu", None),
        ("pax", None),
        ("ustar", None),
        ("pax", Some("-z")),
    ] {
        let out = dir
            .path()
            .join(format!("{format}{}.tar", extra.unwrap_or("")));
        let mut cmd = Command::new("tar");
        cmd.arg(format!("--format={format}")).arg("-cf").arg(&out);
        if let Some(x) = extra {
            cmd.arg(x);
        }
        let st = cmd.arg("-C").arg(&src).arg(".").output().unwrap();
        if format == "ustar" && !st.status.success() {
            // ustar cannot hold some names; GNU tar says so. Nothing to compare.
            continue;
        }
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
        check(&out, hardlinks);
        assert!(ours(&out)
            .iter()
            .any(|(n, _)| n.ends_with(&format!("{}.txt", "k".repeat(90)))));
    }
}

#[test]
fn reads_python_tarfile_pax_archives() {
    if !have("python3") {
        eprintln!("skipping: python3 not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("py.tar");
    let script = r#"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as t:
    for name, data in [("a" * 150 + "/x.jpg", b"1" * 700), ("sample1.jpg", b"jpeg"), ("sample1.cls", b"3"), ("ü/ñ.txt", "☃".encode())]:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.pax_headers = {"mtime": "1.5"}
        t.addfile(info, io.BytesIO(data))
"#;
    let st = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    check(&out, 0);
}
