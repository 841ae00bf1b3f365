//! The rmm-rs workspace's task runner: `cargo xtask ci`, `cargo xtask gpu bundle`,
//! `cargo xtask gpu run`, `cargo xtask gpu bench`, `cargo xtask miri`, `cargo xtask fuzz`,
//! `cargo xtask loom`, `cargo xtask api-count`. See CONTRIBUTING.md and docs/gpu-testing.md.

mod api_count;
mod artifacts;
mod bundle;
mod capi;
mod cargo;
mod ci;
#[cfg(test)]
mod cudarc_calls;
mod fuzz;
mod gpu;
mod imports;
mod layers;
mod loom;
mod miri;
mod package;
mod peer;
mod proofs;
mod runner;
mod size;
mod wheel;

use std::process::ExitCode;

/// What `cargo xtask help` prints.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci [--skip STEP]...       what CI runs: fmt, layers, proofs, imports, size, clippy,
                            comparisons, test, release, loom, doc, package (stops at the
                            first failure)
  gpu bundle [--out DIR] [--peer | --torch]
                            build GPU test/bench/example binaries into DIR (default gpu-bundle/);
                            --peer adds the RMM C++ driver and the librmm wheels (run.sh peer);
                            --torch builds the C API and PyTorch bundle (run.sh torch) instead
  gpu run [ARGS...]         run gpu-bundle/run.sh ARGS on this (GPU) machine
  gpu bench [--peer] [ARGS...]
                            bundle, then run the GPU benchmarks (run.sh bench ARGS) or, with
                            --peer, the comparison with RMM C++ (run.sh peer ARGS) here
  miri [--cases N] [--no-doc]
                            pure cores' unit tests under Miri, compile-fail doctests (nightly)
  fuzz [TARGET] [--time SECS]
                            cargo-fuzz targets, SECS (60) each, from fuzz/corpus (nightly)
  loom [--preemptions N] [FILTER]
                            rmm-mr's loom models (--cfg loom, target/loom), preemption bound N
                            (3; CI runs 2), one table row per model
  api-count [--list] [--no-build] [PACKAGE]...
                            public items of rmm-rs and rmm-mr (or PACKAGEs), by kind (nightly)
  size [--files]            code lines of rmm-mr's stream_ordered/ and pool/ (not tests,
                            comments or blanks) against the limit of issue 28
  wheel [--out DIR]         the Python wheel rmm_rs_torch (the C library and the module), built
                            with maturin (pip install maturin) into DIR (target/wheels)
  help                      this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((cmd, rest)) if cmd == "ci" => ci::run(rest).map(|()| 0),
        Some((cmd, rest)) if cmd == "gpu" => gpu::run(rest),
        Some((cmd, rest)) if cmd == "miri" => miri::run(rest),
        Some((cmd, rest)) if cmd == "fuzz" => fuzz::run(rest),
        Some((cmd, rest)) if cmd == "loom" => loom::run(rest),
        Some((cmd, rest)) if cmd == "api-count" => api_count::run(rest),
        Some((cmd, [])) if cmd == "size" => size::run(false).map(|()| 0),
        Some((cmd, [flag])) if cmd == "size" && flag == "--files" => size::run(true).map(|()| 0),
        Some((cmd, rest)) if cmd == "wheel" => wheel::run(rest),
        Some((cmd, _)) if matches!(cmd.as_str(), "help" | "-h" | "--help") => {
            println!("{USAGE}");
            Ok(0)
        }
        _ => Err(format!("unknown or missing command\n{USAGE}")),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}
