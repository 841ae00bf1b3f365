//! `cargo xtask gpu ...`: building and running the GPU bundle.

use crate::bundle;
use crate::cargo::{self, Error};
use crate::runner;
use std::path::PathBuf;

/// The default bundle folder (git-ignored), at the workspace root.
pub(crate) fn default_bundle_dir() -> PathBuf {
    cargo::repo_root().join("gpu-bundle")
}

/// Dispatches `gpu bundle [--out DIR]` and `gpu run [ARGS...]`; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    match args.split_first() {
        Some((cmd, rest)) if cmd == "bundle" => {
            bundle::build(&parse_out(rest)?)?;
            Ok(0)
        }
        Some((cmd, rest)) if cmd == "run" => runner::run(&default_bundle_dir(), rest),
        _ => {
            Err("usage: cargo xtask gpu bundle [--out DIR] | cargo xtask gpu run [ARGS...]".into())
        }
    }
}

/// The bundle folder from `--out DIR` / `--out=DIR`, or the default.
fn parse_out(args: &[String]) -> Result<PathBuf, Error> {
    match args {
        [] => Ok(default_bundle_dir()),
        [flag, dir] if flag == "--out" => Ok(PathBuf::from(dir)),
        [one] if one.starts_with("--out=") => Ok(PathBuf::from(&one["--out=".len()..])),
        _ => Err(format!(
            "unexpected arguments to `gpu bundle`: {} (usage: gpu bundle [--out DIR])",
            args.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn out_dir_is_parsed() {
        assert_eq!(parse_out(&[]).unwrap(), default_bundle_dir());
        assert!(default_bundle_dir().ends_with("gpu-bundle"));
        assert_eq!(
            parse_out(&args(&["--out", "b"])).unwrap(),
            PathBuf::from("b")
        );
        assert_eq!(
            parse_out(&args(&["--out=/x/y"])).unwrap(),
            PathBuf::from("/x/y")
        );
        assert!(parse_out(&args(&["--out"])).is_err());
        assert!(parse_out(&args(&["b"])).is_err());
    }

    #[test]
    fn unknown_gpu_command_is_an_error() {
        assert!(run(&args(&["launch"])).unwrap_err().contains("usage"));
        assert!(run(&[]).is_err());
    }
}
