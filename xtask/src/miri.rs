//! `cargo xtask miri`: the pure cores' unit tests under Miri, and the compile-fail doctests with
//! their error codes checked, both on the nightly toolchain. CI stays on stable and does not run
//! this; it is for developers where `rustup toolchain list` shows a nightly.

use crate::cargo::{self, Error};
use std::process::Command;

/// The unit tests that run under Miri: (package, test-name filters). A filter is a module path
/// ending in `::` and runs that module's tests and its children's; the `proofs` step of
/// `cargo xtask ci` checks that each names a module and that every module with `unsafe` code is
/// run by one (a module without tests of its own, such as `pool::engine`, is run through its
/// parent's filter) or is in [`EXCLUDED`]. Under Miri rmm-sys finds no driver library (Miri
/// cannot load one), as on a machine without a GPU: what the tests do there, host mocks and
/// rmm-sys's simulated driver, runs; what needs a GPU reports so and is checked no further.
pub(crate) const SUITES: &[(&str, &[&str])] = &[
    ("rmm-sys", &["align::", "ptr::", "version::", "fault::"]),
    ("rmm-stream", &["life::", "stream::", "view::"]),
    (
        "rmm-mr",
        &[
            // The sub-allocators, their cores and their resources, over the host mock and the
            // simulated driver.
            "pool::",
            "fixed_size::",
            "binning::",
            "arena::",
            "stream_ordered::",
            "vmm::",
            "util::",
            "adaptors::",
            // Graph pools: the block bookkeeping, and the gates without a driver.
            "graph::",
            // The trait and its forwarding impls (run by every resource's tests), the registry,
            // the test resources and the fault sweeps, host resources.
            "resource::",
            "registry::",
            "testing::",
            "resources::callback::",
            "resources::simulated::",
            "resources::system::",
            "resources::tests::",
            // The pinned host pool's bookkeeping (no unsafe, no driver).
            "pinned::core::",
            // Snapshots and out-of-memory reports over the host mock, and the pickle writer.
            "diagnostics::",
        ],
    ),
    (
        "rmm-containers",
        &["buffer::", "raw::", "stream::", "interop::pool::"],
    ),
    ("rmm-rs", &["size::"]),
    ("rmm-replay", &["plan::", "summary::", "replay::"]),
    (
        "rmm-capi",
        // `stack`, `test_support` and `testing` have no tests of their own: their unsafe code
        // runs under `registry`'s and `ffi`'s.
        &[
            "config::",
            "ffi::",
            "last_error::",
            "registry::",
            "stack::",
            "test_support::",
            "testing::",
        ],
    ),
];

/// Why a module is in [`EXCLUDED`]: its `unsafe` code is calls into the CUDA driver.
const DRIVER_CALLS: &str = "its unsafe code is calls into the CUDA driver (function pointers \
                            from libcuda), which Miri cannot load; the simulated driver answers \
                            before the call";

/// Why a resource is in [`EXCLUDED`]: it allocates from the driver.
const DRIVER_MEMORY: &str = "a resource over the driver's allocation calls: its unsafe code \
                             frees driver memory, which needs a GPU (its tests run on the GPU \
                             machine)";

/// Modules with `unsafe` code that no suite runs under Miri: (package, module, why). The
/// `proofs` step of `cargo xtask ci` fails when a module with `unsafe` is in neither list, and
/// when an entry here names a module that is gone, has no `unsafe` left or is run by a suite.
pub(crate) const EXCLUDED: &[(&str, &str, &str)] = &[
    ("rmm-sys", "context", DRIVER_CALLS),
    ("rmm-sys", "device", DRIVER_CALLS),
    ("rmm-sys", "driver", DRIVER_CALLS),
    (
        "rmm-sys",
        "entry",
        "opens libcuda and looks up its symbols (dlopen, dlsym): Miri \
                          cannot call into a shared library, and under it `open` finds none",
    ),
    ("rmm-sys", "error", DRIVER_CALLS),
    ("rmm-sys", "host_mempool", DRIVER_CALLS),
    ("rmm-sys", "ipc", DRIVER_CALLS),
    ("rmm-sys", "kernel", DRIVER_CALLS),
    ("rmm-sys", "memory", DRIVER_CALLS),
    ("rmm-sys", "mempool", DRIVER_CALLS),
    ("rmm-sys", "stream", DRIVER_CALLS),
    ("rmm-sys", "vmm", DRIVER_CALLS),
    ("rmm-sys", "graph", DRIVER_CALLS),
    ("rmm-stream", "graph", DRIVER_CALLS),
    (
        "rmm-stream",
        "",
        "`unsafe impl Send`/`Sync` of the stream and event handles: no code \
                        to run, a promise about the driver's handles",
    ),
    ("rmm-stream", "event", DRIVER_CALLS),
    (
        "rmm-stream",
        "stall",
        "a host function the driver runs on a stream (`cuLaunchHostFunc`) \
                             and its boxed argument: only the driver calls it",
    ),
    (
        "rmm-mr",
        "ipc::channel",
        "takes ownership of descriptors the kernel installs (`SCM_RIGHTS` through \
         `recvmsg`), a system call Miri does not run",
    ),
    ("rmm-mr", "ipc::export", DRIVER_MEMORY),
    ("rmm-mr", "ipc::import", DRIVER_CALLS),
    ("rmm-mr", "resources::peer_access", DRIVER_CALLS),
    ("rmm-mr", "resources::cuda", DRIVER_MEMORY),
    ("rmm-mr", "resources::cuda_async", DRIVER_MEMORY),
    ("rmm-mr", "resources::driver_pool", DRIVER_MEMORY),
    ("rmm-mr", "resources::diagnostics", DRIVER_CALLS),
    ("rmm-mr", "resources::cuda_async_managed", DRIVER_MEMORY),
    ("rmm-mr", "resources::cuda_async_view", DRIVER_MEMORY),
    ("rmm-mr", "resources::pool_statistics", DRIVER_MEMORY),
    ("rmm-mr", "resources::managed", DRIVER_MEMORY),
    ("rmm-mr", "resources::pinned_host", DRIVER_MEMORY),
    ("rmm-mr", "pinned::pool", DRIVER_MEMORY),
    ("rmm-mr", "pinned::host_async", DRIVER_MEMORY),
    ("rmm-containers", "peer", DRIVER_CALLS),
    (
        "rmm-containers",
        "interop::cudarc",
        "cudarc's driver calls on cudarc's own handles, \
                                           which need a GPU",
    ),
    (
        "rmm-capi",
        "exit",
        "registers an exit handler with the C library (`atexit`), a foreign \
                          call Miri does not run",
    ),
    (
        "rmm-capi",
        "torch",
        "PyTorch's allocator hooks, which throw C++ exceptions through \
                           `rmm_rs_cxx_throw` (a C++ shim): tested from C and on the GPU \
                           machine",
    ),
];

/// Tests left out under Miri (substrings of their own names, the last segment of their path, so
/// that a module such as `util::cross_thread` is not left out whole): the multi-threaded stress
/// tests, which take hours when interpreted and whose interleavings belong to a model checker,
/// not to Miri (`binning`'s three allocating threads and one adding bins did not finish in 15
/// minutes); and the tests of the lazy event rule (the core's, fixed-size's, the pool's, the
/// VMM pool's) that expect a thief's looks at a list to come within the core's `WAIT_TIME`
/// (5 ms) of its request to the owner, which interpreted code never does: there the thief
/// synchronizes and takes instead of growing, and the tests fail on their timing assertions,
/// with no undefined behaviour found.
pub(crate) const SKIPS: &[&str] = &[
    "concurrent",
    "thread",
    "churning",
    "adding_bins_while_allocating",
    "a_thief_that_finds_an_unrecorded_fitting_block_grows_by_the_request",
    "a_foreign_streams_unrecorded_list_makes_a_thief_ask_and_grow",
    "a_thief_past_the_grace_period_waits_with_no_lock_held",
    "a_bins_growth_under_pressure_grows_the_pool_beneath_by_one_chunk",
    "a_withheld_block_makes_the_pool_grow_by_the_request_only",
    "a_withheld_block_maps_only_what_the_request_lacks",
    "before_failing_the_pool_gives_free_chunks_back_and_grows_one",
];

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
        // That each names an existing module, and that together with EXCLUDED they cover
        // every module with unsafe code, is `proofs::tests::the_workspace_passes`.
        for (package, filters) in SUITES {
            assert!(package.starts_with("rmm"), "{package}");
            assert!(!filters.is_empty());
            assert!(filters.iter().all(|f| f.ends_with("::")), "{filters:?}");
        }
    }
}
