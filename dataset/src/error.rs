//! The dataset tools' error type: each variant names the file, URL or input line it is about.

use std::path::PathBuf;

/// An error making, sharding or indexing a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A file or folder could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A shard, index or manifest problem (each names its shard and offset or file).
    #[error(transparent)]
    Shard(#[from] sluice_shard::ShardError),

    /// A shard or manifest URL could not be fetched.
    #[error("fetching {url}: {detail}")]
    Http { url: String, detail: String },

    /// The input describes no dataset this tool can write (what is wrong, and where).
    #[error("{0}")]
    Input(String),

    /// A generated image could not be encoded.
    #[error("encoding a JPEG: {0}")]
    Encode(#[from] image::ImageError),
}

impl DatasetError {
    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| DatasetError::Io { what, path, source }
    }
}

pub type Result<T, E = DatasetError> = std::result::Result<T, E>;
