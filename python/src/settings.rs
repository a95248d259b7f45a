//! The loader's settings as `sluice.Loader` passes them: a [`LoaderConfig`] as JSON, read
//! with the path of any mistake, so the error names the argument.

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;
use sluice_client::LoaderConfig;

/// `text` as a [`LoaderConfig`]; a mistake is a `ValueError` that starts with the key.
pub fn parse(text: &str) -> PyResult<LoaderConfig> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.inner().to_string();
        // serde's "at line 1 column 40" means nothing to whoever passed the argument.
        let inner = inner
            .rsplit_once(" at line ")
            .map_or(inner.as_str(), |(w, _)| w);
        let message = match inner.starts_with(&format!("{key}:")) || key == "." {
            true => inner.to_string(),
            false => format!("{key}: {inner}"),
        };
        PyValueError::new_err(message)
    })
}
