//! One module per subcommand.

pub mod bench;
pub mod bench_chain;
pub mod bench_transport;
pub mod bench_upload;
pub mod cluster;
pub mod cpu;
pub mod daemon;
pub mod demo;
pub mod index;
pub mod inspect;
pub mod loadgen;
pub mod progress;
pub mod put;
pub mod shard;
pub mod sizing;
pub mod storage;
pub mod synth;
