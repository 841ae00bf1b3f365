//! `cargo xtask miri`: the pure cores' unit tests under Miri, and the compile-fail doctests with
//! their error codes checked, both on the nightly toolchain. CI stays on stable and does not run
//! this; it is for developers where `rustup toolchain list` shows a nightly.

use crate::cargo::{self, Error};
use std::process::Command;

/// The unit tests that run under Miri: (package, test-name filters). Only modules that make no
/// CUDA call belong here (Miri cannot load the driver); a filter matches a module path prefix.
pub(crate) const SUITES: &[(&str, &[&str])] = &[
    ("rmm-sys", &["align::", "ptr::", "version::"]),
    (
        "rmm-mr",
        &[
            "util::alignment::tests::",
            "pool::free_list::",
            "pool::size_index::",
            "stream_ordered::event_policy::",
            "stream_ordered::append_only::",
            "stream_ordered::handed::",
            "stream_ordered::addr_table::",
            "pool::growth::",
            "fixed_size::block_table::",
            "util::cross_thread::",
            "binning::table::",
            "binning::routes::",
            "vmm::range::",
            "vmm::blocks::",
            "vmm::options::",
            "arena::block::",
            "arena::fit_tree::",
            "arena::size_class::",
            "arena::superblock::",
            "arena::global_arena::",
            "arena::local_arena::",
            "adaptors::statistics::counter::",
            "adaptors::statistics::counters::",
            "adaptors::statistics::budget::",
            "adaptors::statistics::shard::",
            "adaptors::tracking::registry::",
            "adaptors::tracking::shard::",
            "adaptors::logging::csv::",
            "adaptors::logging::parser::",
            "adaptors::logging::event::",
            "adaptors::logging::event_time::",
        ],
    ),
    ("rmm-rs", &["size::"]),
    ("rmm-replay", &["plan::", "summary::"]),
];

/// Tests left out under Miri (substrings of their own names, the last segment of their path, so
/// that a module such as `util::cross_thread` is not left out whole): the multi-threaded stress
/// tests, which take hours when interpreted and whose interleavings belong to a model checker,
/// not to Miri.
pub(crate) const SKIPS: &[&str] = &["concurrent", "thread", "churning"];

/// Whether the test at `path` (`module::tests::name`) is left out under Miri ([`SKIPS`]).
fn is_skipped(path: &str) -> bool {
    let name = path.rsplit("::").next().unwrap_or(path);
    SKIPS.iter().any(|s| name.contains(s))
}

/// The unit tests of `package` that `filters` select and [`is_skipped`] leaves out, from the
/// test list of a native build (libtest's `--skip` matches the whole path, module included).
fn skipped_tests(package: &str, filters: &[&str]) -> Result<Vec<String>, Error> {
    let list = cargo::run_stdout(&mut cargo::cargo([
        "test", "-q", "-p", package, "--lib", "--", "--list", "--format", "terse",
    ]))?;
    Ok(list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .filter(|t| filters.iter().any(|f| t.contains(f)) && is_skipped(t))
        .map(str::to_owned)
        .collect())
}

/// The packages whose doctests hold `compile_fail` proofs; nightly rustdoc checks that each
/// fails with the error code it names (stable only checks that it fails).
const COMPILE_FAIL_PACKAGES: &[&str] = &["rmm-stream", "rmm-mr", "rmm-sys", "rmm-containers"];

const USAGE: &str = "usage: cargo xtask miri [--cases N] [--no-doc]";

/// Options of `miri`.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    /// `PROPTEST_CASES` for the property tests (Miri is about 1,000x slower than native).
    cases: u32,
    /// Run the nightly compile-fail doctests too.
    doc: bool,
}

fn parse(args: &[String]) -> Result<Options, Error> {
    let mut options = Options {
        cases: 4,
        doc: true,
    };
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--cases" => {
                let n = iter.next().ok_or(USAGE)?;
                options.cases = n
                    .parse()
                    .map_err(|_| format!("--cases needs a number, not `{n}`"))?;
            }
            "--no-doc" => options.doc = false,
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(options)
}

/// Whether `rustup toolchain list` shows a nightly toolchain.
pub(crate) fn has_nightly() -> Result<bool, Error> {
    let out = cargo::run_stdout(Command::new("rustup").args(["toolchain", "list"]))?;
    Ok(out.lines().any(|l| l.starts_with("nightly")))
}

/// A command run with the nightly toolchain at the workspace root.
pub(crate) fn nightly<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"])
        .args(args)
        .current_dir(cargo::repo_root())
        // The xtask runs under stable cargo, whose variables would pin the toolchain.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTUP_TOOLCHAIN");
    cmd
}

/// Runs the Miri suites and the nightly doctests; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    let options = parse(args)?;
    if !has_nightly()? {
        eprintln!(
            "xtask miri: no nightly toolchain (`rustup toolchain list` shows none); install one \
             with `rustup toolchain install nightly --component miri rust-src`"
        );
        return Ok(2);
    }
    let installed = cargo::run_stdout(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))?;
    if !installed.lines().any(|l| l.starts_with("miri")) {
        println!("==> installing miri and rust-src on nightly");
        cargo::run_status(Command::new("rustup").args([
            "component",
            "add",
            "--toolchain",
            "nightly",
            "miri",
            "rust-src",
        ]))?;
    }
    for (package, filters) in SUITES {
        println!("==> [miri] {package}: {}", filters.join(" "));
        let skipped = skipped_tests(package, filters)?;
        let mut cmd = nightly(["miri", "test", "-p", package, "--lib", "--"]);
        cmd.args(*filters);
        for skip in &skipped {
            cmd.args(["--skip", skip]);
        }
        cmd
            // proptest persists failures next to the sources, which Miri's isolation forbids.
            .env("MIRIFLAGS", "-Zmiri-disable-isolation")
            .env("PROPTEST_CASES", options.cases.to_string());
        cargo::run_status(&mut cmd)?;
    }
    if options.doc {
        println!("==> [doc] compile-fail doctests with their error codes (nightly rustdoc)");
        let mut cmd = nightly(["test", "--doc", "--all-features"]);
        for package in COMPILE_FAIL_PACKAGES {
            cmd.args(["-p", package]);
        }
        cargo::run_status(&mut cmd)?;
    }
    println!("xtask miri: all suites passed");
    Ok(0)
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
                cases: 4,
                doc: true
            }
        );
        assert_eq!(
            parse(&args(&["--cases", "16", "--no-doc"])).unwrap(),
            Options {
                cases: 16,
                doc: false
            }
        );
        assert!(parse(&args(&["--cases"])).is_err());
        assert!(parse(&args(&["--cases", "x"])).is_err());
        assert!(parse(&args(&["--fast"])).is_err());
    }

    #[test]
    fn stress_tests_are_skipped_by_their_name_not_their_module() {
        assert!(is_skipped(
            "adaptors::statistics::counters::tests::concurrent_peak_is_exact"
        ));
        assert!(is_skipped(
            "adaptors::statistics::budget::tests::two_churning_threads_settle"
        ));
        assert!(!is_skipped("util::cross_thread::tests::words_round_trip"));
        assert!(!is_skipped("pool::free_list::tests::coalesces"));
    }

    #[test]
    fn suites_name_workspace_packages_and_module_prefixes() {
        for (package, filters) in SUITES {
            assert!(package.starts_with("rmm"), "{package}");
            assert!(!filters.is_empty());
            assert!(filters.iter().all(|f| f.ends_with("::")), "{filters:?}");
        }
    }
}
