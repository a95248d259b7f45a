//! Writes WebDataset shards (and their `.idx` sidecars) from
//! - an ImageFolder tree (one subfolder per class; `.cls` = the class's index in sorted
//!   class-name order; keys are `class/stem`),
//! - a flat folder plus a labels TSV (header row naming `file` and `class_index`), or
//! - a tar stream on stdin (`--input -`), whose samples are re-sharded as they are.
//!
//! Files sharing a stem become one sample (`a.jpg` + `a.json` → fields `jpg`, `json`); field
//! names are lower-cased and `jpeg` is written `jpg`, as WebDataset readers expect.
//!
//! Samples are written in a seeded random order (a seed), since datasets usually arrive
//! sorted by class and a shard of one class makes batches of one class: a folder is shuffled
//! whole, a tar stream through a bounded shuffle buffer (that many samples held in memory). The same input and seed give byte-identical shards; shuffling can be turned off to
//! keep the input order.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use sluice_shard::{
    read::decompressed, Manifest, ReadOptions, SampleReader, ShardWriter, WriterConfig,
    WrittenShard,
};

use crate::error::{DatasetError, Result};
use crate::locate::manifest_url;
use crate::Progress;

/// The order samples are written in.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    /// Seeded random order (false: sorted keys for a folder, stream order for a stream).
    pub shuffle: bool,
    /// The same input and seed give byte-identical shards.
    pub seed: u64,
    /// A stream is shuffled through this many whole samples held in memory.
    pub stream_buffer: usize,
}

impl Default for Order {
    fn default() -> Self {
        Order {
            shuffle: true,
            seed: 0,
            stream_buffer: 10_000,
        }
    }
}

/// A change to a sample's field before it is written: called with the sample's key, the
/// field's name and its bytes; `Some` replaces the bytes. (`sluice shard --restart-markers`
/// gives JPEGs restart markers with one; the dataset tools depend on no tier, so the decoder
/// comes from the caller.)
pub type Rewrite<'a> = &'a (dyn Fn(&str, &str, &[u8]) -> Option<Vec<u8>> + Sync);

/// Samples read (and rewritten, on every core) at once before they are written in order: a
/// lossless JPEG transform costs about 3 ms a sample, over ten times the rest of sharding.
const CHUNK: usize = 256;

/// `sample`'s fields through `rewrite`.
fn rewrite_fields(rewrite: Rewrite, sample: &mut sluice_shard::Sample) {
    for f in &mut sample.fields {
        if let Some(d) = rewrite(&sample.key, &f.name, &f.data) {
            f.data = d;
        }
    }
}

/// What a run wrote.
pub struct Written {
    pub shards: Vec<WrittenShard>,
    pub samples: u64,
    /// Payload bytes (the samples' fields, without tar headers).
    pub bytes: u64,
}

/// The seeded random stream of a shard-writing run.
fn order_stream(seed: u64) -> sluice_plan::rng::Stream {
    sluice_plan::rng::stream(seed, sluice_plan::rng::Domain::ShardWrite, 0, 0)
}

/// One sample to write: its key, its files (field name → path) and its label.
struct Planned {
    key: String,
    files: Vec<(String, PathBuf)>,
    /// A clip's frames, in order: written as one `mjpeg` field.
    frames: Vec<PathBuf>,
    label: Option<u64>,
}

fn writer(config: WriterConfig) -> Result<ShardWriter> {
    if config.max_count == Some(0) || config.max_bytes == Some(0) {
        return Err(DatasetError::Input(
            "shards must hold at least 1 sample and 1 byte (max count and max size)".into(),
        ));
    }
    Ok(ShardWriter::new(config)?)
}

/// What a folder to shard holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Folder {
    /// Images: an ImageFolder tree (subfolders are classes), or with labels a flat folder.
    Images,
    /// Clips: each a folder of JPEG frames (sorted by name), written as one sample whose
    /// `mjpeg` field is the frames back to back. Clip folders sit in class folders
    /// (`root/<class>/<clip>/`, the class's index in sorted name order as `.cls`), or, with
    /// labels (a TSV naming each clip folder in its `file` column), in `root` itself.
    Clips,
}

/// Writes a folder of images or clips as shards, with `labels` (a labels TSV) where the
/// folder is flat.
pub fn write_folder(
    root: &Path,
    (folder, labels): (Folder, Option<&Path>),
    config: WriterConfig,
    order: Order,
    rewrite: Option<Rewrite>,
    progress: &mut dyn Progress,
) -> Result<Written> {
    let writer = writer(config)?;
    let planned = match (folder, labels) {
        (Folder::Clips, labels) => clip_folder(root, labels, progress)?,
        (Folder::Images, Some(labels)) => labelled_folder(root, labels, progress)?,
        (Folder::Images, None) => image_folder(root, progress)?,
    };
    write_all(writer, planned, order, rewrite, progress)
}

/// The samples of a folder of clips ([`Folder::Clips`]).
fn clip_folder(
    root: &Path,
    labels: Option<&Path>,
    progress: &mut dyn Progress,
) -> Result<Vec<Planned>> {
    let mut planned = Vec::new();
    let mut ignored = Vec::new();
    match labels {
        Some(labels) => {
            for (line, name, label) in read_labels(labels)? {
                let dir = root.join(&name);
                if !dir.is_dir() {
                    return Err(DatasetError::Input(format!(
                        "{}:{line}: clip folder {name:?} is not in {}",
                        labels.display(),
                        root.display()
                    )));
                }
                let frames = clip_frames(&dir, &mut ignored)?;
                planned.push(clip(name.replace('.', "_"), frames, label));
            }
        }
        None => {
            let classes = subfolders(root)?;
            if classes.is_empty() {
                return Err(DatasetError::Input(format!(
                    "{} has no class folders of clip folders; for a flat folder of clips pass \
                     --labels FILE.tsv",
                    root.display()
                )));
            }
            for (index, class) in classes.iter().enumerate() {
                for name in subfolders(&root.join(class))? {
                    let frames = clip_frames(&root.join(class).join(&name), &mut ignored)?;
                    let key = format!("{class}/{}", name.replace('.', "_"));
                    planned.push(clip(key, frames, index as u64));
                }
            }
        }
    }
    if let Some(first) = ignored.first() {
        progress.note(&format!(
            "ignored {} files in clip folders that are not JPEG frames (e.g. {})",
            ignored.len(),
            first.display()
        ));
    }
    Ok(planned)
}

/// Writes `planned` in `order` (shuffled by its seed unless it keeps the input's).
fn write_all(
    mut writer: ShardWriter,
    mut planned: Vec<Planned>,
    order: Order,
    rewrite: Option<Rewrite>,
    progress: &mut dyn Progress,
) -> Result<Written> {
    if order.shuffle {
        order_stream(order.seed).shuffle(&mut planned);
    }
    let (samples, bytes) = write_planned(&mut writer, &planned, rewrite, progress)?;
    Ok(Written {
        shards: writer.finish()?,
        samples,
        bytes,
    })
}

fn clip(key: String, frames: Vec<PathBuf>, label: u64) -> Planned {
    Planned {
        key,
        files: Vec::new(),
        frames,
        label: Some(label),
    }
}

/// The folders in `dir`, sorted by name (hidden ones left out).
fn subfolders(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(DatasetError::io("listing", dir))?;
    for entry in entries {
        let entry = entry.map_err(DatasetError::io("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !name.starts_with('.') {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// A clip folder's JPEG frames in name order; other files go to `ignored`.
fn clip_frames(dir: &Path, ignored: &mut Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    let mut frames = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(DatasetError::io("listing", dir))?;
    for entry in entries {
        let path = entry.map_err(DatasetError::io("listing", dir))?.path();
        let ext = path.extension().map(|e| e.to_string_lossy().to_lowercase());
        match ext.as_deref() {
            Some("jpg" | "jpeg") if path.is_file() => frames.push(path),
            _ => ignored.push(path),
        }
    }
    frames.sort();
    if frames.is_empty() {
        return Err(DatasetError::Input(format!(
            "clip folder {} holds no JPEG frames (.jpg, .jpeg)",
            dir.display()
        )));
    }
    Ok(frames)
}

/// Re-shards a tar stream (gzip or plain) named `name` in errors, shuffled through a bounded
/// buffer unless `order.shuffle` is off.
pub fn write_stream(
    input: impl BufRead + Send + 'static,
    name: &str,
    config: WriterConfig,
    order: Order,
    rewrite: Option<Rewrite>,
    progress: &mut dyn Progress,
) -> Result<Written> {
    let mut writer = writer(config)?;
    let stream = decompressed(input).map_err(DatasetError::io("reading", name))?;
    let mut reader = SampleReader::new(stream, name, &ReadOptions::default());
    let mut buffer = order.shuffle.then(|| {
        sluice_plan::ShuffleBuffer::from_stream(
            order.stream_buffer.max(1),
            order_stream(order.seed),
        )
    });
    let (mut samples, mut bytes) = (0, 0);
    // Samples leave the shuffle buffer into `pending`; a full chunk is rewritten and written.
    let mut pending = Vec::with_capacity(CHUNK);
    let mut flush = |pending: &mut Vec<sluice_shard::Sample>| -> Result<()> {
        if let Some(rewrite) = rewrite {
            pending
                .par_iter_mut()
                .for_each(|sample| rewrite_fields(rewrite, sample));
        }
        for sample in pending.drain(..) {
            let fields: Vec<(&str, &[u8])> = sample
                .fields
                .iter()
                .map(|f| (f.name.as_str(), f.data.as_slice()))
                .collect();
            writer.write(&sample.key, &fields).map_err(|e| {
                DatasetError::Input(format!(
                    "writing sample {:?} from byte {} of {name}: {e}",
                    sample.key, sample.start
                ))
            })?;
            samples += 1;
            bytes += sample.payload_bytes();
            progress.add(1, sample.payload_bytes());
        }
        Ok(())
    };
    while let Some(sample) = reader.next_sample()? {
        let out = match buffer.as_mut() {
            Some(b) => b.push(sample),
            None => Some(sample),
        };
        pending.extend(out);
        if pending.len() == CHUNK {
            flush(&mut pending)?;
        }
    }
    if let Some(b) = buffer.as_mut() {
        while let Some(out) = b.pop() {
            pending.push(out);
            if pending.len() == CHUNK {
                flush(&mut pending)?;
            }
        }
    }
    flush(&mut pending)?;
    Ok(Written {
        shards: writer.finish()?,
        samples,
        bytes,
    })
}

/// Reads a tar stream from stdin (see [`write_stream`]).
pub fn write_stdin(
    config: WriterConfig,
    order: Order,
    rewrite: Option<Rewrite>,
    progress: &mut dyn Progress,
) -> Result<Written> {
    let stdin = BufReader::with_capacity(1 << 20, std::io::stdin());
    write_stream(stdin, "<stdin>", config, order, rewrite, progress)
}

/// Saves the manifest of `shards` at `path`, with URLs relative to it where they can be.
pub fn write_manifest(shards: &[WrittenShard], path: &Path) -> Result<Manifest> {
    let infos = shards
        .iter()
        .map(|s| {
            let mut info = s.info.clone();
            info.url = manifest_url(path, &s.path)?;
            Ok(info)
        })
        .collect::<Result<Vec<_>>>()?;
    let manifest = Manifest::new(infos);
    manifest.save(path)?;
    Ok(manifest)
}

fn write_planned(
    writer: &mut ShardWriter,
    planned: &[Planned],
    rewrite: Option<Rewrite>,
    progress: &mut dyn Progress,
) -> Result<(u64, u64)> {
    let mut bytes = 0;
    for chunk in planned.chunks(CHUNK) {
        let read: Vec<Result<_>> = match rewrite {
            Some(_) => chunk.par_iter().map(|p| read(p, rewrite)).collect(),
            None => chunk.iter().map(|p| read(p, rewrite)).collect(),
        };
        for (p, data) in chunk.iter().zip(read) {
            write_one(writer, p, data?, &mut bytes, progress)?;
        }
    }
    Ok((planned.len() as u64, bytes))
}

/// A planned sample's files, each through `rewrite`.
fn read<'p>(p: &'p Planned, rewrite: Option<Rewrite>) -> Result<Vec<(&'p str, Vec<u8>)>> {
    let mut data = Vec::with_capacity(p.files.len() + 2);
    for (field, path) in &p.files {
        let mut d = std::fs::read(path).map_err(DatasetError::io("reading", path))?;
        if let Some(new) = rewrite.and_then(|r| r(&p.key, field, &d)) {
            d = new;
        }
        data.push((field.as_str(), d));
    }
    if !p.frames.is_empty() {
        // Each frame as the JPEG it is (rewritten as one), back to back.
        let mut clip = Vec::new();
        for path in &p.frames {
            let mut d = std::fs::read(path).map_err(DatasetError::io("reading", path))?;
            if let Some(new) = rewrite.and_then(|r| r(&p.key, "jpg", &d)) {
                d = new;
            }
            if !d.starts_with(&[0xFF, 0xD8]) {
                return Err(DatasetError::Input(format!(
                    "{}: a clip's frame must be a JPEG",
                    path.display()
                )));
            }
            clip.extend_from_slice(&d);
        }
        data.push(("mjpeg", clip));
    }
    Ok(data)
}

/// Writes one planned sample whose files were read as `data`.
fn write_one(
    writer: &mut ShardWriter,
    p: &Planned,
    data: Vec<(&str, Vec<u8>)>,
    bytes: &mut u64,
    progress: &mut dyn Progress,
) -> Result<()> {
    let label = p.label.map(|l| l.to_string());
    let mut fields: Vec<(&str, &[u8])> = data.iter().map(|(f, d)| (*f, d.as_slice())).collect();
    if let Some(l) = &label {
        fields.push(("cls", l.as_bytes()));
    }
    let n: u64 = fields.iter().map(|(_, d)| d.len() as u64).sum();
    writer.write(&p.key, &fields)?;
    *bytes += n;
    progress.add(1, n);
    Ok(())
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
        .and_then(|entries| entries.collect::<std::io::Result<_>>())
        .map_err(DatasetError::io("listing", dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let file_type = entry
            .file_type()
            .map_err(DatasetError::io("reading", &path))?;
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
            return Err(DatasetError::Input(format!(
                "{} and {} would both be field {field:?} of sample {key:?}",
                other.display(),
                path.display()
            )));
        }
        files.push((field, path));
    }
    Ok(())
}

fn report_skipped(skipped: &[PathBuf], progress: &mut dyn Progress) {
    if let Some(first) = skipped.first() {
        progress.note(&format!(
            "skipped {} files without an extension (e.g. {})",
            skipped.len(),
            first.display()
        ));
    }
}

/// An ImageFolder tree: subfolders are classes, indexed in sorted name order.
fn image_folder(root: &Path, progress: &mut dyn Progress) -> Result<Vec<Planned>> {
    let mut classes: Vec<String> = Vec::new();
    let mut top_files = 0;
    let io = DatasetError::io("reading input folder", root);
    let entries = std::fs::read_dir(root)
        .and_then(|entries| entries.collect::<std::io::Result<Vec<_>>>())
        .map_err(io)?;
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let file_type = entry
            .file_type()
            .map_err(DatasetError::io("reading", entry.path()))?;
        if file_type.is_dir() {
            classes.push(name);
        } else {
            top_files += 1;
        }
    }
    if classes.is_empty() {
        return Err(DatasetError::Input(format!(
            "{} has no class subfolders; for a flat folder of images pass --labels FILE.tsv",
            root.display()
        )));
    }
    if top_files > 0 {
        progress.note(&format!(
            "ignoring {top_files} files at the top of {} (not in a class folder)",
            root.display()
        ));
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
            frames: Vec::new(),
            label: Some(index as u64),
        }));
    }
    report_skipped(&skipped, progress);
    Ok(planned)
}

/// A flat folder and a labels TSV.
fn labelled_folder(
    root: &Path,
    labels: &Path,
    progress: &mut dyn Progress,
) -> Result<Vec<Planned>> {
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
    report_skipped(&skipped, progress);
    let mut planned = Vec::with_capacity(table.len());
    for (line, file, label) in table {
        let key = file
            .split_once('.')
            .map_or(file.as_str(), |(s, _)| s)
            .replace('.', "_");
        let Some(files) = groups.remove(&key) else {
            return Err(DatasetError::Input(format!(
                "{}:{line}: file {file:?} is not in {}",
                labels.display(),
                root.display()
            )));
        };
        planned.push(Planned {
            key,
            files,
            frames: Vec::new(),
            label: Some(label),
        });
    }
    if !groups.is_empty() {
        progress.note(&format!(
            "{} samples in {} have no row in {} and were skipped",
            groups.len(),
            root.display(),
            labels.display()
        ));
    }
    planned.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(planned)
}

/// Rows of a labels TSV as (line number, file, class index).
fn read_labels(path: &Path) -> Result<Vec<(usize, String, u64)>> {
    let io = || DatasetError::io("reading labels", path);
    let file = std::fs::File::open(path).map_err(io())?;
    let mut lines = BufReader::new(file).lines();
    let header = lines.next().transpose().map_err(io())?.ok_or_else(|| {
        DatasetError::Input(format!(
            "{} is empty: it needs a header row",
            path.display()
        ))
    })?;
    let columns: Vec<&str> = header.split('\t').collect();
    let col = |name: &str| {
        columns
            .iter()
            .position(|c| c.trim() == name)
            .ok_or_else(|| {
                DatasetError::Input(format!(
                    "{}: the header row has no {name:?} column (it has {columns:?})",
                    path.display()
                ))
            })
    };
    let (file_col, class_col) = (col("file")?, col("class_index")?);
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let line_no = i + 2;
        let line = line.map_err(io())?;
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        let cell = |c: usize, name: &str| {
            cells.get(c).map(|s| s.trim()).ok_or_else(|| {
                DatasetError::Input(format!(
                    "{}:{line_no}: missing the {name:?} column",
                    path.display()
                ))
            })
        };
        let file = cell(file_col, "file")?.to_string();
        let class = cell(class_col, "class_index")?;
        let class: u64 = class.parse().map_err(|_| {
            DatasetError::Input(format!(
                "{}:{line_no}: class_index {class:?} is not a non-negative integer",
                path.display()
            ))
        })?;
        rows.push((line_no, file, class));
    }
    Ok(rows)
}
