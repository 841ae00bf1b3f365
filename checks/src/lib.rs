//! # rmm-checks: the invariants the fuzz targets and the CI property tests share
//!
//! One checker per fuzz target, written once and driven two ways:
//!
//! - by the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer, `cargo xtask fuzz`), which feed
//!   them raw bytes for as long as they are asked to run;
//! - by this crate's property tests (`cargo test -p rmm-checks`, part of `cargo xtask ci` on
//!   stable), which feed them a few dozen random inputs each and replay every seed of the
//!   committed corpora under `fuzz/corpus/<target>/`.
//!
//! Every checker takes bytes (the fuzzer's input format, so a corpus file or a crash artifact
//! replays here unchanged) and returns `Err` with a description of the first broken invariant;
//! the fuzz targets panic with it, the property tests report it.
//!
//! | module | fuzz target(s) | what is checked |
//! | --- | --- | --- |
//! | [`ops`] | `pool_ops`, `arena_ops`, `fixed_size_ops`, `binning_ops` | operation sequences over a sub-allocator on the host mock: no two live blocks overlap, every free of a live block succeeds, every wrong free is an error and changes nothing, out-of-memory only as the typed error, nothing left at the end |
//! | [`csv_log`] | `csv_parser` | the memory-event CSV parser never panics; what parses re-serialises and re-parses to the same events |
//! | [`byte_size`] | `byte_size` | `ByteSize::from_str` never panics and agrees with an exact reference parser |
//!
//! This crate is not published and no layer depends on it; it depends on the layers (with
//! `rmm-mr`'s `testing` feature for [`HostMockResource`](rmm_mr::testing::HostMockResource)).

pub mod byte_size;
pub mod csv_log;
pub mod input;
pub mod ops;

/// The fuzz targets, each with the checker that drives it (the names of `fuzz/Cargo.toml`'s
/// `[[bin]]` targets and of the corpus folders `fuzz/corpus/<target>/`).
pub const TARGETS: &[&str] = &[
    "csv_parser",
    "byte_size",
    "pool_ops",
    "arena_ops",
    "fixed_size_ops",
    "binning_ops",
];

/// Runs the checker of the fuzz target `target` on `data`; `Err` for an unknown target too.
///
/// # Errors
///
/// The first invariant `data` breaks, as a message.
pub fn check_target(target: &str, data: &[u8]) -> Result<(), String> {
    match target {
        "csv_parser" => csv_log::check(data),
        "byte_size" => byte_size::check_bytes(data),
        "pool_ops" => ops::check(ops::Kind::Pool, data).map(drop),
        "arena_ops" => ops::check(ops::Kind::Arena, data).map(drop),
        "fixed_size_ops" => ops::check(ops::Kind::FixedSize, data).map(drop),
        "binning_ops" => ops::check(ops::Kind::Binning, data).map(drop),
        other => Err(format!("no fuzz target named `{other}`")),
    }
}
