//! `rmm-replay`: see `rmm-replay --help` and the crate documentation.

fn main() -> std::process::ExitCode {
    rmm_replay::cli::main(std::env::args_os())
}
