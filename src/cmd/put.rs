//! `sluice put`: uploads shards (and their `.idx` sidecars) to a storage node with a bearer
//! token, showing progress. Each object is written there to a temporary file, fsynced and
//! renamed into place, so readers never see half an object.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_shard::{expand, SampleIndex};

#[derive(clap::Args)]
pub struct Args {
    /// Shard files (brace patterns allowed).
    #[arg(required = true)]
    shards: Vec<String>,
    /// Destination bucket URL, e.g. http://node:7000/v1/train/
    #[arg(long)]
    to: String,
    /// File holding the upload token (else the SLUICE_TOKEN environment variable).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Also write a manifest of the uploaded shards here: each shard's URL on its first owner
    /// and its other owners as replicas, so workers read from the next owner when one fails.
    #[arg(long)]
    manifest: Option<PathBuf>,
}

/// Counts bytes read into a progress bar.
struct Counted<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

pub fn run(args: Args) -> Result<()> {
    let token = sluice_wire::token::from_file_or_env(args.token_file.as_deref())?
        .context("no --token-file and no SLUICE_TOKEN in the environment")?;
    if !args.to.starts_with("http://") && !args.to.starts_with("https://") {
        bail!("--to must be an http(s):// bucket URL");
    }
    let base = if args.to.ends_with('/') {
        args.to.clone()
    } else {
        format!("{}/", args.to)
    };
    let (node, bucket) = base
        .split_once("/v1/")
        .map(|(n, b)| (n.to_string(), b.trim_end_matches('/').to_string()))
        .filter(|(_, b)| !b.is_empty() && !b.contains('/'))
        .context("--to must look like http://node:7000/v1/BUCKET/")?;
    let mut files = Vec::new();
    for pattern in &args.shards {
        for name in expand(pattern)? {
            let path = PathBuf::from(&name);
            let idx = SampleIndex::sidecar_path(&path);
            files.push(path);
            if idx.exists() {
                files.push(idx);
            }
        }
    }
    let total: u64 = files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .map(|m| m.len())
                .with_context(|| format!("reading {}", f.display()))
        })
        .sum::<Result<u64>>()?;
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "put [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
    ) {
        bar.set_style(style);
    }
    let client = reqwest::blocking::Client::builder().timeout(None).build()?;
    // Check the token first: a refused upload is cut off mid-body, which hides the reason.
    let auth = client
        .get(format!("{node}/auth"))
        .bearer_auth(&token)
        .send()
        .with_context(|| format!("contacting {node}"))?;
    succeeded(auth, format_args!("{node} refuses uploads with this token"))?;
    // A cluster places each object on its rendezvous owners; a single node takes everything.
    let cluster: serde_json::Value = client
        .get(format!("{node}/cluster"))
        .send()
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("asking {node} for its cluster"))?
        .json()
        .with_context(|| format!("{node}/cluster is not JSON"))?;
    let peers: Vec<String> = cluster["peers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let replicas = cluster["replicas"].as_u64().unwrap_or(1) as usize;
    let targets = |name: &str| -> Vec<String> {
        if peers.is_empty() {
            vec![format!("{base}{name}")]
        } else {
            sluice_storage::placement::owners(&format!("{bucket}/{name}"), &peers, replicas)
                .into_iter()
                .map(|p| format!("{}/v1/{bucket}/{name}", p.trim_end_matches('/')))
                .collect()
        }
    };
    bar.set_length(total * if peers.is_empty() { 1 } else { replicas as u64 });
    let started = std::time::Instant::now();
    for path in &files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .context("a shard path has no file name")?;
        bar.set_message(name.clone());
        for url in targets(&name) {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let len = file.metadata()?.len();
            let body = reqwest::blocking::Body::sized(
                Counted {
                    inner: file,
                    bar: bar.clone(),
                },
                len,
            );
            let resp = client
                .put(&url)
                .bearer_auth(&token)
                .body(body)
                .send()
                .with_context(|| format!("uploading to {url}"))?;
            succeeded(resp, format_args!("uploading {} to {url}", path.display()))?;
        }
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    if let Some(path) = &args.manifest {
        let mut infos = Vec::new();
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e != "idx"))
        {
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let reader =
                std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
            let (mut info, _) = sluice_shard::scan_shard(
                std::io::BufReader::with_capacity(1 << 20, reader),
                &file.display().to_string(),
                &sluice_shard::ReadOptions::default(),
                |_| {},
            )?;
            let mut urls = targets(&name).into_iter();
            info.url = urls.next().unwrap_or_default();
            info.replicas = urls.collect();
            infos.push(info);
        }
        let manifest = sluice_shard::Manifest::new(infos);
        manifest.validate(&path.display().to_string())?;
        manifest
            .save(path)
            .with_context(|| format!("writing manifest {}", path.display()))?;
        println!(
            "manifest: {} ({} shards, each on {} owners)",
            path.display(),
            manifest.shards.len(),
            if peers.is_empty() { 1 } else { replicas }
        );
    }
    let copies = if peers.is_empty() { 1 } else { replicas };
    println!(
        "uploaded {} objects ({copies} copies each), {:.1} MB in {secs:.1}s ({:.1} MB/s) to {base}",
        files.len(),
        total as f64 / 1e6,
        (total * copies as u64) as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(())
}

/// Fails with `what`, the HTTP status and the body's text unless `resp` succeeded.
fn succeeded(resp: reqwest::blocking::Response, what: std::fmt::Arguments<'_>) -> Result<()> {
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "{what}: HTTP {status}: {}",
            resp.text().unwrap_or_default().trim()
        );
    }
    Ok(())
}
