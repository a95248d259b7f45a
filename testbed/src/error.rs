//! The test bed's error type: the tiers' own errors, passed through, and what the test bed
//! itself checks (settings, files, the exactly-once contract).

/// An error starting tiers, running consumers or probing a tier.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error(transparent)]
    Dataset(#[from] sluice_dataset::DatasetError),
    #[error(transparent)]
    Shard(#[from] sluice_shard::ShardError),
    #[error(transparent)]
    Client(#[from] sluice_client::ClientError),
    #[error(transparent)]
    Engine(#[from] sluice_cpu::EngineError),
    #[error(transparent)]
    Source(#[from] sluice_cpu::SourceError),
    #[error(transparent)]
    Pipeline(#[from] sluice_wire::spec::SpecError),
    #[error(transparent)]
    CpuTls(#[from] sluice_cpu::tls::TlsError),
    #[error(transparent)]
    StorageConfig(#[from] sluice_storage::ConfigError),
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] sluice_client::cuda::CudaError),

    /// A file, socket or runtime could not be made, read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A tier probe's HTTP read failed.
    #[error("reading {url}: {detail}")]
    Http { url: String, detail: String },

    /// Settings that cannot run (each names the setting).
    #[error("{0}")]
    Setup(String),
}

impl TestbedError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| TestbedError::Io { what, source }
    }
}

pub type Result<T, E = TestbedError> = std::result::Result<T, E>;
