//! `cargo xtask fuzz [TARGET] [--time SECS]`: runs the cargo-fuzz targets of `fuzz/` (libFuzzer,
//! AddressSanitizer) on the nightly toolchain, each for a short time, and prints a table of
//! executions per target (the rows of `docs/reliability.md`). CI stays on stable and runs the
//! same checkers as property tests (`cargo test -p rmm-checks`).
//!
//! Each target starts from its committed seeds in `fuzz/corpus/<target>/`; new inputs go to
//! `fuzz/scratch/<target>/` (git-ignored), so the committed corpus stays small. A failing input
//! is saved by libFuzzer under `fuzz/artifacts/<target>/`; copy it into the corpus folder to make
//! it a regression test of CI.

use crate::cargo::{self, Error};
use crate::miri::{has_nightly, nightly};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The fuzz targets: the `[[bin]]` names of `fuzz/Cargo.toml` and the folders of `fuzz/corpus/`.
pub(crate) const TARGETS: &[&str] = &[
    "csv_parser",
    "byte_size",
    "pool_ops",
    "arena_ops",
    "fixed_size_ops",
    "binning_ops",
];

const USAGE: &str = "usage: cargo xtask fuzz [TARGET] [--time SECS]   (targets: csv_parser, \
                     byte_size, pool_ops, arena_ops, fixed_size_ops, binning_ops)";

/// The longest input libFuzzer tries (the operation targets read at most 512 operations of at
/// most 7 bytes each).
const MAX_LEN: u32 = 4096;

/// Options of `fuzz`.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    /// The targets to run, in order.
    targets: Vec<&'static str>,
    /// Seconds per target.
    time: u64,
}

fn parse(args: &[String]) -> Result<Options, Error> {
    let mut options = Options {
        targets: TARGETS.to_vec(),
        time: 60,
    };
    let mut chosen = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--time" => {
                let n = iter.next().ok_or(USAGE)?;
                options.time = n
                    .parse()
                    .ok()
                    .filter(|&t| t > 0)
                    .ok_or_else(|| format!("--time needs a number of seconds, not `{n}`"))?;
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown argument `{other}`\n{USAGE}"))
            }
            other => {
                if chosen.is_some() {
                    return Err(format!("one target at most\n{USAGE}"));
                }
                let target = TARGETS
                    .iter()
                    .find(|t| **t == other)
                    .ok_or_else(|| format!("no fuzz target `{other}`\n{USAGE}"))?;
                chosen = Some(*target);
            }
        }
    }
    if let Some(target) = chosen {
        options.targets = vec![target];
    }
    Ok(options)
}

/// What one target's run gave.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    /// Executions (libFuzzer's `stat::number_of_executed_units`, else its `Done N runs`).
    executions: Option<u64>,
    /// Whether libFuzzer exited successfully (no crash, leak, timeout or out-of-memory).
    passed: bool,
}

/// The executions a libFuzzer output line reports, if it reports them.
fn executions_in(line: &str) -> Option<u64> {
    if let Some(rest) = line.strip_prefix("stat::number_of_executed_units:") {
        return rest.trim().parse().ok();
    }
    let rest = line.strip_prefix("Done ")?;
    rest.strip_suffix(" second(s)")?;
    rest.split(' ').next()?.parse().ok()
}

/// Whether `cargo +nightly fuzz` runs.
fn has_cargo_fuzz() -> bool {
    nightly(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The command that fuzzes `target` for `time` seconds.
fn fuzz_command(target: &str, time: u64) -> Command {
    let scratch = format!("fuzz/scratch/{target}");
    let corpus = format!("fuzz/corpus/{target}");
    let mut cmd = nightly(["fuzz", "run", target, &scratch, &corpus, "--"]);
    cmd.arg(format!("-max_total_time={time}"))
        .arg(format!("-max_len={MAX_LEN}"))
        .arg("-print_final_stats=1");
    cmd
}

/// Runs one target, passing its output through, and reads the executions from it.
fn run_target(target: &str, time: u64) -> Result<Outcome, Error> {
    std::fs::create_dir_all(cargo::repo_root().join("fuzz/scratch").join(target))
        .map_err(|e| format!("cannot create fuzz/scratch/{target}: {e}"))?;
    let mut cmd = fuzz_command(target, time);
    println!("==> [fuzz] {target}: {}", cargo::describe(&cmd));
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", cargo::describe(&cmd)))?;
    let mut outcome = Outcome::default();
    if let Some(stderr) = child.stderr.take() {
        let mut reader = BufReader::new(stderr);
        let mut raw = Vec::new();
        while reader.read_until(b'\n', &mut raw).unwrap_or(0) > 0 {
            let line = String::from_utf8_lossy(&raw);
            eprint!("{line}");
            if let Some(n) = executions_in(line.trim_end()) {
                outcome.executions = Some(n);
            }
            raw.clear();
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("`{}`: {e}", cargo::describe(&cmd)))?;
    outcome.passed = status.success();
    Ok(outcome)
}

/// Runs the targets; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    let options = parse(args)?;
    if !has_nightly()? {
        eprintln!(
            "xtask fuzz: no nightly toolchain (`rustup toolchain list` shows none); cargo-fuzz \
             needs one: `rustup toolchain install nightly`. The same checks run on stable as \
             property tests: `cargo test -p rmm-checks`."
        );
        return Ok(2);
    }
    if !has_cargo_fuzz() {
        println!("==> installing cargo-fuzz (cargo install cargo-fuzz --locked)");
        cargo::run_status(
            cargo::cargo(["install", "cargo-fuzz", "--locked"]).env_remove("RUSTUP_TOOLCHAIN"),
        )?;
    }
    let mut rows = Vec::new();
    for target in &options.targets {
        let start = Instant::now();
        let outcome = run_target(target, options.time)?;
        rows.push((*target, outcome, start.elapsed().as_secs()));
    }
    println!("\n| target | executions | time | result | command |");
    println!("| --- | --- | --- | --- | --- |");
    for (target, outcome, secs) in &rows {
        let executions = outcome
            .executions
            .map_or_else(|| "?".to_owned(), group_thousands);
        let result = if outcome.passed {
            "no failure"
        } else {
            "FAILED (see fuzz/artifacts)"
        };
        println!(
            "| `{target}` | {executions} | {} s fuzzing ({secs} s with the build) | {result} | \
             `cargo xtask fuzz {target} --time {}` |",
            options.time, options.time
        );
    }
    let failed = rows.iter().filter(|(_, o, _)| !o.passed).count();
    if failed == 0 {
        println!("xtask fuzz: {} target(s), no failure", rows.len());
        Ok(0)
    } else {
        println!("xtask fuzz: {failed} of {} target(s) failed", rows.len());
        Ok(1)
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
                targets: TARGETS.to_vec(),
                time: 60
            }
        );
        assert_eq!(
            parse(&args(&["pool_ops", "--time", "5"])).unwrap(),
            Options {
                targets: vec!["pool_ops"],
                time: 5
            }
        );
        for bad in [
            &["--time"][..],
            &["--time", "0"],
            &["--time", "x"],
            &["no_such"],
            &["pool_ops", "arena_ops"],
            &["--fast"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn executions_are_read_from_libfuzzer_output() {
        assert_eq!(
            executions_in("stat::number_of_executed_units: 123456"),
            Some(123_456)
        );
        assert_eq!(
            executions_in("Done 98765 runs in 61 second(s)"),
            Some(98_765)
        );
        assert_eq!(
            executions_in("#4096\tpulse  cov: 1234 ft: 2345 corp: 12/345b exec/s: 1024"),
            None
        );
        assert_eq!(executions_in("Done"), None);
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1_234_567), "1,234,567");
    }

    /// Every target is a `[[bin]]` of fuzz/Cargo.toml with seeds in fuzz/corpus/, and every
    /// `[[bin]]` is a target.
    #[test]
    fn targets_match_the_fuzz_crate_and_its_corpora() {
        let root = cargo::repo_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|name| *name != "rmm-fuzz")
            .collect();
        assert_eq!(bins, TARGETS);
        assert!(manifest.contains("cargo-fuzz = true"));
        for target in TARGETS {
            let seeds = std::fs::read_dir(root.join("fuzz/corpus").join(target))
                .unwrap()
                .count();
            assert!(seeds > 0, "{target} has no seeds");
        }
    }
}
