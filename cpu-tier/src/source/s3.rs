//! `s3://bucket/key` through `object_store` (AWS S3 or any S3-compatible store), read as a
//! blocking byte stream.

use std::io::{self, Read};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::{ShardSource, SourceError};

impl ShardSource {
    fn runtime(&self) -> Result<&tokio::runtime::Runtime, SourceError> {
        if let Some(rt) = self.runtime.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-s3")
            .enable_all()
            .build()
            .map_err(|e| SourceError::Request {
                url: "s3://".into(),
                detail: format!("starting the S3 runtime: {e}"),
            })?;
        Ok(self.runtime.get_or_init(|| rt))
    }

    fn bucket(&self, name: &str) -> Result<Arc<dyn ObjectStore>, SourceError> {
        let mut buckets = self.buckets.lock().map_err(|_| SourceError::Request {
            url: format!("s3://{name}"),
            detail: "bucket cache poisoned".into(),
        })?;
        if let Some(b) = buckets.get(name) {
            return Ok(b.clone());
        }
        let c = &self.config.s3;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(name)
            .with_allow_http(c.allow_http);
        if let Some(e) = &c.endpoint {
            builder = builder.with_endpoint(e);
        }
        if let Some(r) = &c.region {
            builder = builder.with_region(r);
        }
        if let Some(k) = &c.access_key_id {
            builder = builder.with_access_key_id(k);
        }
        if let Some(k) = &c.secret_access_key {
            builder = builder.with_secret_access_key(k);
        }
        let store: Arc<dyn ObjectStore> =
            Arc::new(builder.build().map_err(|e| SourceError::Request {
                url: format!("s3://{name}"),
                detail: e.to_string(),
            })?);
        buckets.insert(name.to_string(), store.clone());
        Ok(store)
    }

    pub(super) fn fetch_s3(
        &self,
        url: &str,
        bucket_key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        let (bucket, key) = bucket_key
            .split_once('/')
            .filter(|(b, k)| !b.is_empty() && !k.is_empty())
            .ok_or_else(|| SourceError::Request {
                url: url.into(),
                detail: "expected s3://bucket/key".into(),
            })?;
        let store = self.bucket(bucket)?;
        let rt = self.runtime()?;
        let options = GetOptions {
            range: range.map(|(o, l)| GetRange::Bounded(o..o + l)),
            ..GetOptions::default()
        };
        let path = ObjectPath::from(key);
        let result =
            rt.block_on(store.get_opts(&path, options))
                .map_err(|e| SourceError::Request {
                    url: url.into(),
                    detail: e.to_string(),
                })?;
        Ok(Box::new(S3Body {
            runtime: rt.handle().clone(),
            stream: result.into_stream(),
            chunk: bytes::Bytes::new(),
        }))
    }
}

/// An object_store byte stream read as a blocking `Read`.
struct S3Body {
    runtime: tokio::runtime::Handle,
    stream: futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
}

impl Read for S3Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use futures_util::StreamExt;
        while self.chunk.is_empty() {
            match self.runtime.block_on(self.stream.next()) {
                Some(Ok(b)) => self.chunk = b,
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}
