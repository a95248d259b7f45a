//! Mixture files: several datasets and their weights in one small TOML (or JSON) file that
//! `sluice loadgen --mixture` and Python's `sluice.Loader("mix.toml")` read.
//!
//! ```toml
//! epoch_samples = 100000          # optional: samples per epoch (default: all sources')
//!
//! [[sources]]
//! dataset = "web/manifest.json"   # a manifest, a served manifest's URL, or shards
//! weight = 0.7
//!
//! [[sources]]
//! dataset = "curated/manifest.json"
//! weight = 0.3
//! ```
//!
//! A relative `dataset` is resolved against the mixture file's folder. A `[schedule]` gives the
//! weights by training step instead (see `sluice_plan::schedule`), piecewise constant or, with
//! `interpolate = "linear"`, on a line from each point to the next:
//!
//! ```toml
//! [schedule]
//! interpolate = "linear"
//! points = [{ step = 0, weights = [0.8, 0.2] }, { step = 1000, weights = [0.5, 0.5] }]
//! ```

use std::path::Path;

use serde::Deserialize;
use sluice_shard::Manifest;

use crate::error::{DatasetError, Result};

/// One source of a mixture file.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    pub dataset: String,
    pub weight: f64,
}

/// A mixture file, as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSpec {
    #[serde(default)]
    pub epoch_samples: Option<u64>,
    pub sources: Vec<SourceSpec>,
    /// Weights by training step, in place of the sources' `weight` from the first point on.
    #[serde(default)]
    pub schedule: Option<sluice_plan::ScheduleSpec>,
}

/// A mixture's sources loaded: (name, manifest) each, their weights, the epoch length.
#[derive(Clone, Debug)]
pub struct LoadedMixture {
    pub sources: Vec<(String, Manifest)>,
    pub weights: Vec<f64>,
    pub epoch_samples: Option<u64>,
    pub schedule: Option<sluice_plan::ScheduleSpec>,
}

impl LoadedMixture {
    /// Fills a loader's mixture settings from this mixture, taking its sources: its weights;
    /// its epoch length and weight schedule unless the loader set its own. The manifests,
    /// by name, are returned for the loader's sources. The one place a mixture meets a
    /// loader's settings (the binding and loadgen both fill theirs here).
    pub fn fill(
        self,
        weights: &mut Vec<f64>,
        epoch_samples: &mut Option<u64>,
        schedule: &mut Option<sluice_plan::ScheduleSpec>,
    ) -> Vec<(String, Manifest)> {
        *weights = self.weights;
        *epoch_samples = epoch_samples.or(self.epoch_samples);
        if schedule.is_none() {
            *schedule = self.schedule;
        }
        self.sources
    }
}

/// Whether `spec` names a mixture file (`.toml`, or `.json` that is not a manifest is told
/// apart when read: see [`read_spec`]).
/// The largest mixture file read (a few sources' names and weights).
const MAX_SPEC_BYTES: u64 = 1 << 20;

pub fn is_mixture_file(spec: &str) -> bool {
    spec.ends_with(".toml")
}

/// Reads a mixture file (TOML, or JSON when it ends in `.json`), naming the file and the key
/// of any mistake.
pub fn read_spec(path: &Path) -> Result<MixtureSpec> {
    crate::locate::regular_file(path, "a mixture file")?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(
            std::fs::File::open(path).map_err(DatasetError::io("reading", path))?,
            MAX_SPEC_BYTES + 1,
        ),
        &mut text,
    )
    .map_err(DatasetError::io("reading", path))?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(DatasetError::Input(format!(
            "mixture file {}: larger than {MAX_SPEC_BYTES} bytes",
            path.display()
        )));
    }
    let bad = |e: String| DatasetError::Input(format!("mixture file {}: {e}", path.display()));
    let spec: MixtureSpec = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?,
        _ => toml::from_str(&text).map_err(|e| bad(e.to_string()))?,
    };
    if spec.sources.is_empty() {
        return Err(bad("it lists no [[sources]]".into()));
    }
    if let Some((i, s)) = spec
        .sources
        .iter()
        .enumerate()
        .find(|(_, s)| !s.weight.is_finite() || s.weight < 0.0)
    {
        return Err(bad(format!(
            "sources[{i}] ({}): weight {} is not a finite number ≥ 0",
            s.dataset, s.weight
        )));
    }
    if spec.sources.iter().all(|s| s.weight == 0.0) {
        return Err(bad("every weight is 0".into()));
    }
    if let Some(schedule) = &spec.schedule {
        schedule
            .build(spec.sources.len())
            .map_err(|e| bad(e.to_string()))?;
    }
    if spec.epoch_samples == Some(0) {
        return Err(bad("epoch_samples must be at least 1".into()));
    }
    Ok(spec)
}

/// Loads a mixture file and each of its sources (see [`crate::locate::dataset`]).
pub fn load(path: &Path) -> Result<LoadedMixture> {
    let spec = read_spec(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let sources = spec
        .sources
        .into_iter()
        .map(|s| {
            let at = match s.dataset.contains("://") || Path::new(&s.dataset).is_absolute() {
                true => s.dataset.clone(),
                false => dir.join(&s.dataset).display().to_string(),
            };
            (s.dataset, at, s.weight)
        })
        .collect();
    let mut loaded = weighted(sources, spec.epoch_samples)?;
    loaded.schedule = spec.schedule;
    Ok(loaded)
}

/// Loads each `(name, dataset, weight)` (see [`crate::locate::dataset`]).
pub fn weighted(
    sources: Vec<(String, String, f64)>,
    epoch_samples: Option<u64>,
) -> Result<LoadedMixture> {
    let mut out = LoadedMixture {
        sources: Vec::with_capacity(sources.len()),
        weights: Vec::with_capacity(sources.len()),
        epoch_samples,
        schedule: None,
    };
    for (name, at, weight) in sources {
        let manifest = crate::locate::dataset(&at)?;
        out.sources.push((name, manifest));
        out.weights.push(weight);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_that_is_no_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let e = crate::locate::dataset("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("a device"), "{e}");
        let e = crate::locate::dataset("/dev/null.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/null.json"), "{e}");
        let fifo = dir.path().join("fifo.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = crate::locate::dataset(fifo.to_str().unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains("a FIFO") && e.contains("manifest"), "{e}");
        }
        let mix = dir.path().join("mix.toml");
        std::fs::write(&mix, "[[sources]]\ndataset = \"/dev/zero\"\nweight = 1\n").unwrap();
        let e = load(&mix).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("a device"), "{e}");
    }

    #[test]
    fn mixture_files_are_read_and_mistakes_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mix.toml");
        std::fs::write(
            &p,
            "epoch_samples = 10\n[[sources]]\ndataset = \"a.json\"\nweight = 0.7\n\
             [[sources]]\ndataset = \"b.json\"\nweight = 0.3\n",
        )
        .unwrap();
        let spec = read_spec(&p).unwrap();
        assert_eq!(spec.epoch_samples, Some(10));
        assert_eq!(spec.sources[1].dataset, "b.json");
        std::fs::write(&p, "[[sources]]\ndataset = \"a.json\"\nweight = -1\n").unwrap();
        let e = read_spec(&p).unwrap_err().to_string();
        assert!(e.contains("sources[0] (a.json): weight -1"), "{e}");
        std::fs::write(&p, "[[sources]]\ndataset = \"a.json\"\nwieght = 1\n").unwrap();
        let e = read_spec(&p).unwrap_err().to_string();
        assert!(e.contains("mix.toml") && e.contains("wieght"), "{e}");
        let j = dir.path().join("mix.json");
        std::fs::write(&j, r#"{"sources": [{"dataset": "a.json", "weight": 1}]}"#).unwrap();
        assert_eq!(read_spec(&j).unwrap().sources.len(), 1);
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("mix.toml"), "{e}");
    }
}
