//! `sluice shard`: writes WebDataset shards (and their `.idx` sidecars) from
//! - an ImageFolder tree (one subfolder per class; `.cls` = the class's index in sorted
//!   class-name order; keys are `class/stem`),
//! - a flat folder plus a labels TSV (header row naming `file` and `class_index`), or
//! - a tar stream on stdin (`--input -`), whose samples are re-sharded as they are.
//!
//! Files sharing a stem become one sample (`a.jpg` + `a.json` → fields `jpg`, `json`); field
//! names are lower-cased and `jpeg` is written `jpg`, as WebDataset readers expect.
//!
//! Samples are written in a seeded random order (`--seed`), since datasets usually arrive
//! sorted by class and a shard of one class makes batches of one class: a folder is shuffled
//! whole, a tar stream through a bounded shuffle buffer (`--shuffle-buffer` samples held in
//! memory). The same input and seed give byte-identical shards; `--no-shuffle` keeps the
//! input order.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sluice_shard::{
    read::decompressed, Manifest, ReadOptions, SampleReader, ShardWriter, WriterConfig,
};

use super::index::manifest_url;
use super::progress::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Input: a folder, or `-` for a tar stream on stdin.
    #[arg(long)]
    input: String,
    /// Output pattern with a shard number, e.g. 'out/train-%06d.tar'.
    #[arg(long)]
    output: String,
    /// Samples per shard at most.
    #[arg(long)]
    max_count: Option<u64>,
    /// Bytes per shard at most (a larger single sample gets a shard of its own).
    #[arg(long)]
    max_size: Option<u64>,
    /// Labels for a flat folder: a TSV with a header row naming `file` and `class_index`.
    #[arg(long)]
    labels: Option<PathBuf>,
    /// Also write a manifest of the new shards here.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Seed of the sample order (the same input and seed give byte-identical shards).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep the input order (sorted keys for a folder, stream order for stdin).
    #[arg(long)]
    no_shuffle: bool,
    /// With `--input -`: samples held in memory to shuffle the stream (memory: this many
    /// whole samples, e.g. about 1.1 GB for 10,000 ImageNet JPEGs).
    #[arg(long, default_value_t = 10_000)]
    shuffle_buffer: usize,
}

/// The seeded random stream of a shard-writing run.
fn order_stream(seed: u64) -> sluice_plan::rng::Stream {
    sluice_plan::rng::stream(seed, sluice_plan::rng::Domain::ShardWrite, 0, 0)
}

/// One sample to write: its key, its files (field name → path) and its label.
struct Planned {
    key: String,
    files: Vec<(String, PathBuf)>,
    label: Option<u64>,
}

pub fn run(args: Args) -> Result<()> {
    let config = WriterConfig {
        max_count: args.max_count,
        max_bytes: args.max_size,
        ..WriterConfig::new(args.output.clone())
    };
    if args.max_count == Some(0) || args.max_size == Some(0) {
        bail!("--max-count and --max-size must be at least 1");
    }
    let mut writer = ShardWriter::new(config).context("--output")?;
    let (samples, bytes, secs) = if args.input == "-" {
        if args.labels.is_some() {
            bail!("--labels applies to a folder input, not to a tar stream on stdin");
        }
        let buffer = (!args.no_shuffle).then_some(args.shuffle_buffer.max(1));
        from_tar_stream(&mut writer, buffer, args.seed)?
    } else {
        let input = Path::new(&args.input);
        let mut planned = match &args.labels {
            Some(labels) => labelled_folder(input, labels)?,
            None => image_folder(input)?,
        };
        if !args.no_shuffle {
            order_stream(args.seed).shuffle(&mut planned);
        }
        write_planned(&mut writer, &planned)?
    };
    let shards = writer.finish().context("closing the last shard")?;
    println!(
        "wrote {} shards, {samples} samples, {:.1} MB in {secs:.1}s ({:.0} samples/s, {:.1} MB/s), pattern {}",
        shards.len(),
        bytes as f64 / 1e6,
        samples as f64 / secs.max(1e-9),
        bytes as f64 / secs.max(1e-9) / 1e6,
        args.output
    );
    if let Some(path) = &args.manifest {
        let infos = shards
            .iter()
            .map(|s| {
                let mut info = s.info.clone();
                info.url = manifest_url(path, &s.path)?;
                Ok(info)
            })
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(infos)
            .save(path)
            .with_context(|| format!("writing manifest {}", path.display()))?;
        println!("manifest: {}", path.display());
    }
    Ok(())
}

fn write_planned(writer: &mut ShardWriter, planned: &[Planned]) -> Result<(u64, u64, f64)> {
    let mut progress = Progress::new(Some(planned.len() as u64), "shard");
    let mut bytes = 0;
    for p in planned {
        let mut data = Vec::with_capacity(p.files.len() + 1);
        for (field, path) in &p.files {
            let d = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            data.push((field.as_str(), d));
        }
        let label = p.label.map(|l| l.to_string());
        let mut fields: Vec<(&str, &[u8])> = data.iter().map(|(f, d)| (*f, d.as_slice())).collect();
        if let Some(l) = &label {
            fields.push(("cls", l.as_bytes()));
        }
        let n: u64 = fields.iter().map(|(_, d)| d.len() as u64).sum();
        writer
            .write(&p.key, &fields)
            .with_context(|| format!("writing sample {:?}", p.key))?;
        bytes += n;
        progress.add(1, n);
    }
    progress.finish();
    Ok((planned.len() as u64, bytes, progress.elapsed()))
}

fn from_tar_stream(
    writer: &mut ShardWriter,
    shuffle_buffer: Option<usize>,
    seed: u64,
) -> Result<(u64, u64, f64)> {
    let stdin = BufReader::with_capacity(1 << 20, std::io::stdin());
    let stream = decompressed(stdin).context("reading stdin")?;
    let mut reader = SampleReader::new(stream, "<stdin>", &ReadOptions::default());
    let mut progress = Progress::new(None, "shard");
    let mut buffer =
        shuffle_buffer.map(|n| sluice_plan::ShuffleBuffer::from_stream(n, order_stream(seed)));
    let (mut samples, mut bytes) = (0, 0);
    let mut write = |sample: sluice_shard::Sample| -> Result<()> {
        let fields: Vec<(&str, &[u8])> = sample
            .fields
            .iter()
            .map(|f| (f.name.as_str(), f.data.as_slice()))
            .collect();
        writer.write(&sample.key, &fields).with_context(|| {
            format!(
                "writing sample {:?} from byte {} of stdin",
                sample.key, sample.start
            )
        })?;
        samples += 1;
        bytes += sample.payload_bytes();
        progress.add(1, sample.payload_bytes());
        Ok(())
    };
    while let Some(sample) = reader.next_sample()? {
        match buffer.as_mut() {
            Some(b) => {
                if let Some(out) = b.push(sample) {
                    write(out)?;
                }
            }
            None => write(sample)?,
        }
    }
    if let Some(b) = buffer.as_mut() {
        while let Some(out) = b.pop() {
            write(out)?;
        }
    }
    progress.finish();
    Ok((samples, bytes, progress.elapsed()))
}

/// Field name for a file extension, as WebDataset readers expect it.
fn field_name(ext: &str) -> String {
    let ext = ext.to_lowercase();
    match ext.as_str() {
        "jpeg" => "jpg".to_string(),
        _ => ext,
    }
}

/// The files of one folder (recursively), grouped by key: `prefix` + path up to the first
/// dot of the file name (dots in the key become `_`). Files with no extension are skipped.
fn group_files(
    dir: &Path,
    prefix: &str,
    out: &mut BTreeMap<String, Vec<(String, PathBuf)>>,
    skipped: &mut Vec<PathBuf>,
) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            group_files(&path, &format!("{prefix}{name}/"), out, skipped)?;
            continue;
        }
        let Some((stem, ext)) = name.split_once('.') else {
            skipped.push(path);
            continue;
        };
        let key = format!("{prefix}{}", stem.replace('.', "_"));
        let field = field_name(ext);
        let files = out.entry(key.clone()).or_default();
        if let Some((_, other)) = files.iter().find(|(f, _)| *f == field) {
            bail!(
                "{} and {} would both be field {field:?} of sample {key:?}",
                other.display(),
                path.display()
            );
        }
        files.push((field, path));
    }
    Ok(())
}

fn report_skipped(skipped: &[PathBuf]) {
    if let Some(first) = skipped.first() {
        eprintln!(
            "note: skipped {} files without an extension (e.g. {})",
            skipped.len(),
            first.display()
        );
    }
}

/// An ImageFolder tree: subfolders are classes, indexed in sorted name order.
fn image_folder(root: &Path) -> Result<Vec<Planned>> {
    let mut classes: Vec<String> = Vec::new();
    let mut top_files = 0;
    for entry in std::fs::read_dir(root)
        .with_context(|| format!("reading input folder {}", root.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if entry.file_type()?.is_dir() {
            classes.push(name);
        } else {
            top_files += 1;
        }
    }
    if classes.is_empty() {
        bail!(
            "{} has no class subfolders; for a flat folder of images pass --labels FILE.tsv",
            root.display()
        );
    }
    if top_files > 0 {
        eprintln!(
            "note: ignoring {top_files} files at the top of {} (not in a class folder)",
            root.display()
        );
    }
    classes.sort();
    let mut planned = Vec::new();
    let mut skipped = Vec::new();
    for (index, class) in classes.iter().enumerate() {
        let mut groups = BTreeMap::new();
        group_files(
            &root.join(class),
            &format!("{class}/"),
            &mut groups,
            &mut skipped,
        )?;
        planned.extend(groups.into_iter().map(|(key, files)| Planned {
            key,
            files,
            label: Some(index as u64),
        }));
    }
    report_skipped(&skipped);
    Ok(planned)
}

/// A flat folder and a labels TSV.
fn labelled_folder(root: &Path, labels: &Path) -> Result<Vec<Planned>> {
    let table = read_labels(labels)?;
    let mut groups = BTreeMap::new();
    let mut skipped = Vec::new();
    group_files(root, "", &mut groups, &mut skipped)?;
    // The labels file may sit in the folder it describes: it is not a sample.
    if let Ok(labels_path) = labels.canonicalize() {
        groups.retain(|_, files: &mut Vec<(String, PathBuf)>| {
            !files
                .iter()
                .any(|(_, p)| p.canonicalize().is_ok_and(|p| p == labels_path))
        });
    }
    report_skipped(&skipped);
    let mut planned = Vec::with_capacity(table.len());
    for (line, file, label) in table {
        let key = file
            .split_once('.')
            .map_or(file.as_str(), |(s, _)| s)
            .replace('.', "_");
        let Some(files) = groups.remove(&key) else {
            bail!(
                "{}:{line}: file {file:?} is not in {}",
                labels.display(),
                root.display()
            );
        };
        planned.push(Planned {
            key,
            files,
            label: Some(label),
        });
    }
    if !groups.is_empty() {
        eprintln!(
            "note: {} samples in {} have no row in {} and were skipped",
            groups.len(),
            root.display(),
            labels.display()
        );
    }
    planned.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(planned)
}

/// Rows of a labels TSV as (line number, file, class index).
fn read_labels(path: &Path) -> Result<Vec<(usize, String, u64)>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("opening labels {}", path.display()))?;
    let mut lines = BufReader::new(file).lines();
    let header = lines
        .next()
        .transpose()?
        .with_context(|| format!("{} is empty: it needs a header row", path.display()))?;
    let columns: Vec<&str> = header.split('\t').collect();
    let col = |name: &str| {
        columns
            .iter()
            .position(|c| c.trim() == name)
            .with_context(|| {
                format!(
                    "{}: the header row has no {name:?} column (it has {columns:?})",
                    path.display()
                )
            })
    };
    let (file_col, class_col) = (col("file")?, col("class_index")?);
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let line_no = i + 2;
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        let cell = |c: usize, name: &str| {
            cells.get(c).map(|s| s.trim()).with_context(|| {
                format!("{}:{line_no}: missing the {name:?} column", path.display())
            })
        };
        let file = cell(file_col, "file")?.to_string();
        let class = cell(class_col, "class_index")?;
        let class: u64 = class.parse().with_context(|| {
            format!(
                "{}:{line_no}: class_index {class:?} is not a non-negative integer",
                path.display()
            )
        })?;
        rows.push((line_no, file, class));
    }
    Ok(rows)
}
