//! `cargo xtask loom [--preemptions N] [FILTER]`: runs the loom models of rmm-mr's lock-free
//! parts (the `loom_tests` modules: statistics shards and their freeze handshake, limiting's
//! release totals, thread slots, the fixed-size block table, the lazy event rule) under
//! `RUSTFLAGS="--cfg loom"`, in a target folder of their own (`target/loom`) so that the normal
//! build is not invalidated, with the preemption bound `LOOM_MAX_PREEMPTIONS=N`, and prints one
//! table row per model (interleavings explored) for `docs/reliability.md`.
//!
//! CI runs the same models with the smaller bound [`CI_PREEMPTIONS`] (the `loom` step of
//! `cargo xtask ci`); the default bound, [`FULL_PREEMPTIONS`], explores more interleavings and
//! takes longer.

use crate::cargo::{self, Error};
use crate::fuzz::group_thousands;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The preemption bound of a full run.
pub(crate) const FULL_PREEMPTIONS: u32 = 3;

/// The preemption bound of CI's slice.
pub(crate) const CI_PREEMPTIONS: u32 = 2;

const _: () = assert!(
    CI_PREEMPTIONS < FULL_PREEMPTIONS,
    "CI runs a slice of the full run"
);

/// What every model's test name contains (and only theirs).
const ALL_MODELS: &str = "loom_";

const USAGE: &str = "usage: cargo xtask loom [--preemptions N] [FILTER]   (N: 3 by default, CI \
                     runs 2; FILTER: a test-name filter, `loom_` by default)";

/// Options of `loom`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Options {
    /// `LOOM_MAX_PREEMPTIONS`.
    pub(crate) preemptions: u32,
    /// The test-name filter.
    pub(crate) filter: String,
}

fn parse(args: &[String]) -> Result<Options, Error> {
    let mut options = Options {
        preemptions: FULL_PREEMPTIONS,
        filter: ALL_MODELS.to_owned(),
    };
    let mut filtered = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--preemptions" => {
                let n = iter.next().ok_or(USAGE)?;
                options.preemptions = n
                    .parse()
                    .map_err(|_| format!("--preemptions needs a number, not `{n}`"))?;
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown argument `{other}`\n{USAGE}"))
            }
            other => {
                if filtered {
                    return Err(format!("one filter at most\n{USAGE}"));
                }
                options.filter = other.to_owned();
                filtered = true;
            }
        }
    }
    Ok(options)
}

/// The target folder of loom builds: `loom/` inside the usual one.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cargo::repo_root().join("target"))
        .join("loom")
}

/// The command that runs the models `options` select.
pub(crate) fn command(options: &Options) -> Command {
    let mut cmd = cargo::cargo([
        "test",
        "-p",
        "rmm-mr",
        "--release",
        "--lib",
        options.filter.as_str(),
        "--",
        "--nocapture",
    ]);
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} --cfg loom -D warnings"),
        _ => "--cfg loom -D warnings".to_owned(),
    };
    cmd.env("RUSTFLAGS", rustflags)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("LOOM_MAX_PREEMPTIONS", options.preemptions.to_string());
    cmd
}

/// One model's line: `loom model NAME: N interleavings explored (preemption bound B)`.
#[derive(Debug, PartialEq, Eq)]
struct Explored {
    model: String,
    interleavings: u64,
    /// The bound the model ran with, when the line says (a model may raise it).
    bound: Option<u32>,
}

/// The model a test's output line reports on, if it is such a line.
fn explored_in(line: &str) -> Option<Explored> {
    let rest = line.trim().strip_prefix("loom model ")?;
    let (model, rest) = rest.split_once(": ")?;
    let (n, rest) = rest.split_once(" interleavings explored")?;
    let bound = rest
        .trim()
        .strip_prefix("(preemption bound ")
        .and_then(|b| b.strip_suffix(')'))
        .and_then(|b| b.parse().ok());
    Some(Explored {
        model: model.to_owned(),
        interleavings: n.parse().ok()?,
        bound,
    })
}

/// Runs the models; returns their lines and whether the tests passed.
fn run_models(options: &Options) -> Result<(Vec<Explored>, bool), Error> {
    let mut cmd = command(options);
    println!(
        "==> [loom] RUSTFLAGS=\"--cfg loom\" LOOM_MAX_PREEMPTIONS={} CARGO_TARGET_DIR={} {}",
        options.preemptions,
        target_dir().display(),
        cargo::describe(&cmd)
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", cargo::describe(&cmd)))?;
    let mut models = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let mut reader = BufReader::new(stdout);
        let mut raw = Vec::new();
        while reader.read_until(b'\n', &mut raw).unwrap_or(0) > 0 {
            let line = String::from_utf8_lossy(&raw);
            print!("{line}");
            models.extend(explored_in(&line));
            raw.clear();
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("`{}`: {e}", cargo::describe(&cmd)))?;
    models.sort_by(|a, b| a.model.cmp(&b.model));
    Ok((models, status.success()))
}

/// Runs the models `options` select and prints the table; an error when one fails or none ran.
pub(crate) fn run_with(options: &Options) -> Result<(), Error> {
    let start = Instant::now();
    let (models, passed) = run_models(options)?;
    let secs = start.elapsed().as_secs();
    let command = if options.filter == ALL_MODELS {
        format!("cargo xtask loom --preemptions {}", options.preemptions)
    } else {
        format!(
            "cargo xtask loom --preemptions {} {}",
            options.preemptions, options.filter
        )
    };
    println!("\n| model | interleavings | preemption bound | command |");
    println!("| --- | --- | --- | --- |");
    for m in &models {
        println!(
            "| `{}` | {} | {} | `{command}` |",
            m.model,
            group_thousands(m.interleavings),
            m.bound.unwrap_or(options.preemptions)
        );
    }
    let total: u64 = models.iter().map(|m| m.interleavings).sum();
    println!(
        "xtask loom: {} model(s), {} interleavings, preemption bound {}, {secs} s with the build",
        models.len(),
        group_thousands(total),
        options.preemptions
    );
    if !passed {
        return Err("a loom model failed (see above)".to_owned());
    }
    if models.is_empty() {
        return Err(format!("no loom model matched `{}`", options.filter));
    }
    Ok(())
}

/// `cargo xtask loom ARGS`; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    run_with(&parse(args)?).map(|()| 0)
}

/// CI's slice: every model with the bound [`CI_PREEMPTIONS`].
pub(crate) fn run_ci() -> Result<(), Error> {
    run_with(&Options {
        preemptions: CI_PREEMPTIONS,
        filter: ALL_MODELS.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_are_parsed() {
        assert_eq!(
            parse(&[]).unwrap(),
            Options {
                preemptions: FULL_PREEMPTIONS,
                filter: "loom_".into()
            }
        );
        assert_eq!(
            parse(&args(&["--preemptions", "1", "statistics"])).unwrap(),
            Options {
                preemptions: 1,
                filter: "statistics".into()
            }
        );
        for bad in [
            &["--preemptions"][..],
            &["--preemptions", "x"],
            &["a", "b"],
            &["--fast"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ci_names_its_bound() {
        let (_, title) = crate::ci::STEPS
            .iter()
            .find(|(name, _)| *name == "loom")
            .expect("a loom step in CI");
        assert!(
            title.contains(&format!("--preemptions {CI_PREEMPTIONS}")),
            "{title}"
        );
    }

    #[test]
    fn model_lines_are_read() {
        assert_eq!(
            explored_in(
                "loom model statistics::freeze: 75 interleavings explored (preemption bound 2)\n"
            ),
            Some(Explored {
                model: "statistics::freeze".into(),
                interleavings: 75,
                bound: Some(2),
            })
        );
        assert_eq!(
            explored_in("loom model m: 811 interleavings explored (preemption bound 4)")
                .and_then(|m| m.bound),
            Some(4),
            "a model that raised its bound says so"
        );
        assert_eq!(explored_in("test a::loom_x ... ok"), None);
        assert_eq!(
            explored_in("loom model x: many interleavings explored"),
            None
        );
    }

    #[test]
    fn the_command_builds_with_loom_apart() {
        let cmd = command(&Options {
            preemptions: 2,
            filter: "loom_".into(),
        });
        let env: Vec<(String, String)> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        let get = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert!(get("RUSTFLAGS").is_some_and(|f| f.contains("--cfg loom")));
        assert_eq!(get("LOOM_MAX_PREEMPTIONS"), Some("2"));
        assert!(get("CARGO_TARGET_DIR").is_some_and(|d| d.ends_with("loom")));
        let described = cargo::describe(&cmd);
        assert!(
            described.contains("test -p rmm-mr --release --lib loom_"),
            "{described}"
        );
    }
}
