//! One module per subcommand.

pub mod bench;
pub mod daemon;
pub mod index;
pub mod inspect;
pub mod progress;
pub mod put;
pub mod shard;
pub mod storage;
pub mod synth;
