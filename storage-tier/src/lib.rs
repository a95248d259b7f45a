//! The storage tier (`sluice storage`): serves shards over HTTP and S3 from local disks.
//!
//! Empty on purpose: the server is built by the storage-tier issue. Nothing here yet.
