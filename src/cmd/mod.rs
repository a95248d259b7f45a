//! One module per subcommand: argument parsing and calls into the library crates. What several
//! subcommands share lives beside this folder (`daemon`, `progress`, `consumers`), never in a
//! subcommand's module.

pub mod bench;
pub mod cert;
pub mod cpu;
pub mod demo;
pub mod index;
pub mod inspect;
pub mod loadgen;
pub mod put;
pub mod shard;
pub mod storage;
pub mod synth;
