//! The GPU client: plans epochs, accounts for samples, assembles and uploads batches.
//!
//! Empty on purpose: the client is built by the "running system" issue. Nothing here yet.
