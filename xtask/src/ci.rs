//! `cargo xtask ci`: everything CI runs, in order, stopping at the first failure.

use crate::cargo::{self, Error};
use crate::imports;
use crate::layers;
use crate::loom;
use crate::package;
use crate::proofs;
use crate::size;
use std::process::Command;

/// The steps, in the order they run: (name, what it does).
pub(crate) const STEPS: &[(&str, &str)] = &[
    ("fmt", "cargo fmt --all -- --check"),
    ("layers", "layering check on cargo metadata"),
    (
        "proofs",
        "proof coverage: every module with unsafe code in a Miri suite or excluded with a \
         reason, the loom table of docs/internals/loom.md against the loom_tests modules",
    ),
    (
        "imports",
        "no two files of a crate import each other (use paths through crate::, super::, \
         self::, re-exports followed, test code left out), and no mod.rs under a crate's src/",
    ),
    (
        "size",
        "code lines of rmm-mr's stream_ordered/ and pool/ (cargo xtask size) against the limit",
    ),
    (
        "clippy",
        "cargo clippy --workspace --all-targets --all-features -- -D warnings",
    ),
    (
        "comparisons",
        "cargo clippy -p rmm-benches --examples --no-default-features -- -D warnings (the peer \
         comparison's build, without rmm-sys's driver hook)",
    ),
    ("test", "cargo test --workspace --all-features"),
    (
        "release",
        "cargo test -p rmm-checks --release (the fuzz checkers' property tests in a release \
         build: no debug assertions, no overflow checks)",
    ),
    (
        "loom",
        "cargo xtask loom --preemptions 2 (rmm-mr's loom models, --cfg loom, target/loom)",
    ),
    (
        "doc",
        "RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps --all-features",
    ),
    (
        "package",
        "cargo package (with verification) of the five library crates",
    ),
];

/// The crates published to crates.io, lowest layer first: what the `package` step packages.
pub(crate) const PUBLISHED: &[&str] = &[
    "rmm-sys",
    "rmm-stream",
    "rmm-mr",
    "rmm-containers",
    "rmm-rs",
];

/// Parses `ci` arguments (`--skip STEP`, repeatable) and runs the steps.
pub(crate) fn run(args: &[String]) -> Result<(), Error> {
    let skipped = parse_skips(args)?;
    for (name, title) in STEPS {
        if skipped.iter().any(|s| s == name) {
            println!("==> [{name}] skipped");
            continue;
        }
        println!("==> [{name}] {title}");
        run_step(name).map_err(|e| format!("step `{name}` failed: {e}"))?;
    }
    println!("xtask ci: all steps passed");
    Ok(())
}

/// The step names given with `--skip`, each checked against [`STEPS`].
fn parse_skips(args: &[String]) -> Result<Vec<String>, Error> {
    let mut skipped = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let step = match arg.as_str() {
            "--skip" => iter.next().ok_or("--skip needs a step name")?.as_str(),
            other => other
                .strip_prefix("--skip=")
                .ok_or_else(|| format!("unknown argument to `ci`: {other}"))?,
        };
        if !STEPS.iter().any(|(name, _)| *name == step) {
            let names: Vec<&str> = STEPS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown step `{step}` (steps: {})",
                names.join(", ")
            ));
        }
        skipped.push(step.to_owned());
    }
    Ok(skipped)
}

/// Runs one step by name.
fn run_step(name: &str) -> Result<(), Error> {
    match name {
        "fmt" => cargo::run_status(&mut cargo::cargo(["fmt", "--all", "--", "--check"])),
        "layers" => check_layers(),
        "proofs" => proofs::run_ci(),
        "imports" => imports::run_ci(),
        "size" => size::run_ci(),
        "clippy" => cargo::run_status(&mut cargo::cargo([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ])),
        "comparisons" => cargo::run_status(&mut cargo::cargo([
            "clippy",
            "-p",
            "rmm-benches",
            "--examples",
            "--no-default-features",
            "--",
            "-D",
            "warnings",
        ])),
        "test" => cargo::run_status(&mut cargo::cargo(["test", "--workspace", "--all-features"])),
        "release" => {
            cargo::run_status(&mut cargo::cargo(["test", "-p", "rmm-checks", "--release"]))
        }
        "loom" => loom::run_ci(),
        "doc" => {
            let mut cmd: Command =
                cargo::cargo(["doc", "--workspace", "--no-deps", "--all-features"]);
            cmd.env("RUSTDOCFLAGS", "-D warnings");
            cargo::run_status(&mut cmd)
        }
        "package" => package::run(PUBLISHED),
        other => Err(format!("no such step `{other}`")),
    }
}

/// The layering step: reads the metadata and reports every violation.
fn check_layers() -> Result<(), Error> {
    let report = layers::check(&cargo::metadata()?)?;
    if report.violations.is_empty() {
        println!(
            "layers: ok ({} layers, {} workspace dependency edges checked): {}",
            layers::LAYERS.len(),
            report.edges_checked,
            layers::LAYERS.join(" < ")
        );
        return Ok(());
    }
    for violation in &report.violations {
        eprintln!("layering violation: {violation}");
    }
    Err(format!(
        "{} layering violation(s); the order is {}",
        report.violations.len(),
        layers::LAYERS.join(" < ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn skips_are_parsed_and_checked() {
        assert_eq!(parse_skips(&[]).unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_skips(&args(&["--skip", "doc", "--skip=fmt"])).unwrap(),
            args(&["doc", "fmt"])
        );
        assert!(parse_skips(&args(&["--skip"])).is_err());
        assert!(parse_skips(&args(&["--skip", "lint"]))
            .unwrap_err()
            .contains("unknown step `lint`"));
        assert!(parse_skips(&args(&["--fast"])).is_err());
    }
}
