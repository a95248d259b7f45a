//! The wire protocol between GPU clients and CPU workers: versioned message headers
//! ([`message`]), a sans-IO length-prefixed frame codec ([`codec`]), the worker's job interface
//! shared by the daemon and the in-process mode ([`runner`]), the tensor buffers both ends
//! reuse ([`buffers`]), the one copy a client makes of each tensor, into its batch ([`copy`]),
//! the worker's rules as a state machine ([`session`]), the QUIC
//! datagram and socket-buffer sizes both ends use ([`quic`];
//! behind `udp`, the call that grows a socket's buffer), and, behind the `io` feature, a
//! thin async shell over any byte stream ([`io`]); behind `shm`, the same-host transport's
//! shared-memory segments and descriptor passing ([`shm`]) and its socket once open, read
//! through a buffer and registered for reading only ([`unix`]).
//!
//! Pure by design: no sockets, runtime, clock or metrics outside the optional features
//! (`io`: tokio's IO traits only; `shm` and `udp`: system calls on descriptors the caller
//! owns). The one exception is `session::UnitThread`, the blocking loop a unit's thread
//! runs: it waits on a condition variable and times its own waits for the shell's metrics;
//! `session::Worker` itself takes the time as an argument. bincode serializes the small headers and nothing else; it stays
//! behind [`codec`] so it can be swapped without touching the tiers.

pub mod buffers;
pub mod codec;
pub mod copy;
pub mod fields;
#[cfg(feature = "io")]
pub mod io;
pub mod message;
pub mod payload;
pub mod quic;
pub mod runner;
pub mod session;
#[cfg(feature = "shm")]
pub mod shm;
pub mod spec;
pub mod token;
#[cfg(feature = "shm")]
pub mod unix;

pub use buffers::BufferPool;
pub use codec::{decode_frame, encode_frame, Frame, Limits, WireError, VERSION};
pub use fields::{ClipFrames, FieldSelection, LabelSource, SampleFields, SampleGeometry};
pub use message::*;
pub use payload::SamplePayload;
pub use runner::{
    drive_unit, error_chain, synthetic_unit, Cause, Charge, Finished, JobRunner, Output,
    PlaceClaim, Places, RunnerError, Turn, UnitEnd, UnitRunner,
};

#[cfg(test)]
mod tests;
