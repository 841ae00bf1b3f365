//! `cargo xtask gpu ...`: building and running the GPU bundle.

use crate::bundle;
use crate::cargo::{self, Error};
use crate::runner;
use std::path::PathBuf;

/// The default bundle folder (git-ignored), at the workspace root.
pub(crate) fn default_bundle_dir() -> PathBuf {
    cargo::repo_root().join("gpu-bundle")
}

/// Usage of `cargo xtask gpu`.
const USAGE: &str = "usage: cargo xtask gpu bundle [--out DIR] [--peer | --torch] | cargo xtask gpu run [ARGS...] | cargo xtask gpu bench [--peer] [ARGS...]";

/// Dispatches `gpu bundle [--out DIR] [--peer]`, `gpu run [ARGS...]` and
/// `gpu bench [--peer] [ARGS...]`; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    match args.split_first() {
        Some((cmd, rest)) if cmd == "bundle" => {
            let (out, peer, torch) = parse_bundle_args(rest)?;
            bundle::build(&out, peer, torch)?;
            Ok(0)
        }
        Some((cmd, rest)) if cmd == "run" => runner::run(&default_bundle_dir(), rest, &[]),
        Some((cmd, rest)) if cmd == "bench" => {
            let (peer, rest) = bench_args(rest);
            let dir = default_bundle_dir();
            bundle::build(&dir, peer, false)?;
            if peer {
                let args: Vec<String> = std::iter::once("peer".to_owned()).chain(rest).collect();
                runner::run(&dir, &args, &[])
            } else {
                let args: Vec<String> = std::iter::once("bench".to_owned()).chain(rest).collect();
                runner::run(&dir, &args, &[])
            }
        }
        _ => Err(USAGE.into()),
    }
}

/// `gpu bench`'s arguments: whether `--peer` is among them, and the others in order.
fn bench_args(args: &[String]) -> (bool, Vec<String>) {
    let peer = args.iter().any(|a| a == "--peer");
    (
        peer,
        args.iter().filter(|a| *a != "--peer").cloned().collect(),
    )
}

/// The bundle folder from `--out DIR` / `--out=DIR` (or the default), and whether `--peer`
/// and `--torch` were given.
fn parse_bundle_args(args: &[String]) -> Result<(PathBuf, bool, bool), Error> {
    let mut out = None;
    let mut peer = false;
    let mut torch = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--peer" {
            peer = true;
        } else if arg == "--torch" {
            torch = true;
        } else if arg == "--out" {
            out = Some(PathBuf::from(it.next().ok_or(
                "--out needs a folder (usage: gpu bundle [--out DIR] [--peer | --torch])",
            )?));
        } else if let Some(dir) = arg.strip_prefix("--out=") {
            out = Some(PathBuf::from(dir));
        } else {
            return Err(format!(
                "unexpected argument to `gpu bundle`: {arg} (usage: gpu bundle [--out DIR] [--peer | --torch])"
            ));
        }
    }
    Ok((out.unwrap_or_else(default_bundle_dir), peer, torch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bundle_args_are_parsed() {
        assert_eq!(
            parse_bundle_args(&[]).unwrap(),
            (default_bundle_dir(), false, false)
        );
        assert_eq!(
            parse_bundle_args(&args(&["--torch", "--out", "t"])).unwrap(),
            (PathBuf::from("t"), false, true)
        );
        assert!(default_bundle_dir().ends_with("gpu-bundle"));
        assert_eq!(
            parse_bundle_args(&args(&["--out", "b"])).unwrap(),
            (PathBuf::from("b"), false, false)
        );
        assert_eq!(
            parse_bundle_args(&args(&["--peer", "--out=/x/y"])).unwrap(),
            (PathBuf::from("/x/y"), true, false)
        );
        assert_eq!(
            parse_bundle_args(&args(&["--out", "b", "--peer"])).unwrap(),
            (PathBuf::from("b"), true, false)
        );
        assert!(parse_bundle_args(&args(&["--out"])).is_err());
        assert!(parse_bundle_args(&args(&["b"])).is_err());
    }

    #[test]
    fn bench_args_take_out_peer() {
        assert_eq!(bench_args(&args(&["--quick"])), (false, args(&["--quick"])));
        assert_eq!(
            bench_args(&args(&["--quick", "--peer", "--ops", "5"])),
            (true, args(&["--quick", "--ops", "5"]))
        );
    }

    #[test]
    fn unknown_gpu_command_is_an_error() {
        assert!(run(&args(&["launch"]))
            .unwrap_err()
            .contains("gpu bench [--peer]"));
        assert!(run(&[]).is_err());
    }
}
