//! Fuzzing on stable Rust for every pure function the controllers feed with cluster data.
//!
//! `cargo fuzz` needs a nightly toolchain and `libfuzzer-sys`, neither of which CI has, so this
//! crate is the equivalent the project can run everywhere: a black-box, structure-aware
//! mutation runner. Each [`Target`] takes bytes (most read them as a JSON case: a Workload, a
//! ProvisioningRequest, a config...) and asserts properties with `assert!`; the runner starts
//! from the target's corpus (`fuzz/corpus/<target>/`), mutates the JSON tree (edge numbers,
//! tricky strings, removed keys, copied subtrees) or the raw bytes, and reports the first input
//! that panics, with the seed that found it. Every such input is saved and, once committed to
//! the corpus, replayed by `cargo test` (`tests/corpus.rs`) as a regression test.
//!
//! Layers: [`rng`] (a seeded generator), [`mutate`] (what an input becomes), [`runner`] (time
//! box, panics, crash files), [`targets`] (what is fuzzed and which properties must hold).

pub mod mutate;
pub mod rng;
pub mod runner;
pub mod targets;

pub use runner::{Crash, Stats, run_target};
pub use targets::{Target, all};
