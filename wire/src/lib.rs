//! The wire protocol between the CPU tier and the GPU client (frames, versioned headers).
//!
//! Empty on purpose: the protocol is built by the "running system" issue. Nothing here yet.
