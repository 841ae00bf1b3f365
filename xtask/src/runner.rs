//! The runner script that travels in a GPU bundle, and `cargo xtask gpu run`.

use crate::cargo::{self, Error};
use std::path::Path;
use std::process::Command;

/// `run.sh`, copied into every bundle (source: `xtask/runner/run.sh`).
pub(crate) const RUN_SH: &str = include_str!("../runner/run.sh");

/// `README.txt`, copied into every bundle (source: `xtask/runner/README.txt`).
pub(crate) const README_TXT: &str = include_str!("../runner/README.txt");

/// Runs `bash <bundle>/run.sh ARGS` in the foreground, with `envs` added to the environment,
/// and returns its exit code.
pub(crate) fn run(bundle: &Path, args: &[String], envs: &[(&str, &str)]) -> Result<i32, Error> {
    let script = bundle.join("run.sh");
    if !script.is_file() {
        return Err(format!(
            "{} does not exist; build the bundle first with `cargo xtask gpu bundle`",
            script.display()
        ));
    }
    let mut cmd = Command::new("bash");
    cmd.arg(&script).args(args).envs(envs.iter().copied());
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", cargo::describe(&cmd)))?;
    Ok(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `run.sh --self-test` builds fake bundles (passing, failing and crashing
    /// binaries) and checks the runner's arithmetic, exit codes and log export.
    #[test]
    fn runner_self_test_passes() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("runner/run.sh");
        let output = Command::new("bash")
            .arg(&script)
            .arg("--self-test")
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "run.sh --self-test failed:\n{stdout}\n{stderr}"
        );
        let last = stdout.lines().last().unwrap_or_default();
        let checks: u32 = last
            .strip_prefix("run.sh self-test: all ")
            .and_then(|rest| rest.strip_suffix(" checks passed"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected last line: {last:?}\n{stdout}"));
        assert!(checks >= 20, "only {checks} checks ran");
    }

    #[test]
    fn bundled_script_is_the_runner_source() {
        assert!(RUN_SH.starts_with("#!/usr/bin/env bash\n"));
        assert!(RUN_SH.contains("gpu: %d passed, %d failed, %d skipped"));
        assert!(README_TXT.contains("run.sh"));
    }

    /// `run.sh sanitize` runs each tool the issue names, memcheck with leak checking, and makes
    /// errors fail the run (the self-test checks the behaviour on fake binaries).
    #[test]
    fn sanitize_mode_runs_every_tool() {
        assert!(RUN_SH.contains("SANITIZE_TOOLS=(memcheck racecheck synccheck initcheck)"));
        assert!(RUN_SH.contains("[[ $tool == memcheck ]] && opts+=(--leak-check full)"));
        assert!(RUN_SH.contains("--error-exitcode 1"));
        assert!(RUN_SH.contains("  sanitize)\n"));
        for bin in [
            "rmm-mr--gpu_stress",
            "rmm-mr--gpu_conformance",
            "rmm-containers--gpu_containers",
        ] {
            assert!(
                RUN_SH.contains(bin),
                "{bin} is not among the sanitized binaries"
            );
        }
        assert!(README_TXT.contains("run.sh sanitize"));
    }

    /// `run.sh torch` runs the Python tests as a user would: the wheel installed into a fresh
    /// venv that sees the system's torch, then the tests with that venv's python and the
    /// library the module finds (not RMM_RS_LIBRARY).
    #[test]
    fn torch_mode_installs_the_wheel_into_a_venv() {
        for needle in [
            "local -a labels=(test_capi test_torch_shim wheel test_ctypes test_torch)",
            "\"$py\" -m venv --system-site-packages \"$venv\"",
            "\"$venv/bin/pip\" install --no-index \"$dir\"/rmm_rs_torch-*.whl",
            "rmm_rs_torch.enable()",
            "echo \"wheel: 1 passed, 0 failed, 0 skipped\"",
            "test_ctypes) cmd=(env -u RMM_RS_LIBRARY \"$venv/bin/python\"",
            "test_torch) cmd=(env -u RMM_RS_LIBRARY \"$venv/bin/python\"",
        ] {
            assert!(RUN_SH.contains(needle), "{needle}");
        }
    }

    /// `run.sh peer-frag` compiles the driver as `peer` does and runs the fragmentation
    /// scenarios on both sides (the self-test checks the steps on fake programs).
    #[test]
    fn peer_frag_mode_runs_both_sides() {
        assert!(RUN_SH.contains("  peer-frag)\n"));
        // `peer` and `peer-frag` share `peer_steps`; `frag-` names the subcommands and files.
        assert!(RUN_SH.contains("peer_steps peer-frag frag- "));
        assert!(RUN_SH.contains("if [[ $prefix == frag- ]]; then\n    flag=--frag\n"));
        for step in [
            "peer_plan \"$tag\" \"${prefix}plan\" \"$plan\"",
            "\"$build/rmm_peer\" ${flag:+\"$flag\"} \"$plan\" \"$theirs\"",
            "\"$peer\" \"${prefix}run\" \"$plan\" \"$ours\"",
            "\"$peer\" \"${prefix}report\" \"$ours\" \"$theirs\"",
        ] {
            assert!(RUN_SH.contains(step), "{step}");
        }
        assert!(README_TXT.contains("run.sh peer-frag"));
    }

    /// `run.sh peer-latency` compiles the driver as `peer` does and runs the latency cells on
    /// both sides: `latency-` names the subcommands, `--latency` RMM's mode.
    #[test]
    fn peer_latency_mode_runs_both_sides() {
        assert!(RUN_SH.contains("  peer-latency)\n"));
        assert!(RUN_SH.contains("peer_steps peer-latency latency- "));
        assert!(RUN_SH.contains("elif [[ $prefix == latency- ]]; then\n    flag=--latency\n"));
        assert!(README_TXT.contains("run.sh peer-latency"));
    }

    /// `run.sh peer` runs the wrapper cells again after its main comparison, and `run.sh
    /// peer-wrap` alone: a plan with only `async` and `cuda`, fresh processes alternating
    /// sides, reduced by `report-rounds` (the self-test checks the order on fake programs).
    #[test]
    fn peer_wrap_mode_alternates_processes() {
        assert!(RUN_SH.contains("  peer-wrap)\n"));
        assert!(RUN_SH.contains("sed -E '/^resource /{/^resource (async|cuda)$/!d;}'"));
        assert!(RUN_SH.contains("local rounds=${RMM_PEER_WRAP_ROUNDS:-3}"));
        assert!(RUN_SH.contains("peer_rounds \"$BUNDLE/peer/build/plan.txt\" \"$rounds\""));
        assert!(RUN_SH.contains("\"$peer\" report-rounds \"$ours\" \"$theirs\""));
        assert!(README_TXT.contains("run.sh peer-wrap"));
        assert!(README_TXT.contains("RMM_PEER_WRAP_ROUNDS"));
    }

    /// `run.sh peer-ab` measures two builds of rmm-rs on one plan's sub-allocator cells in
    /// alternating processes, without the RMM C++ side (no `peer_build`: no wheels, no nvcc),
    /// reduced by `report-ab` (the self-test checks the order and the files on fake programs).
    #[test]
    fn peer_ab_mode_alternates_two_builds_without_rmm() {
        assert!(RUN_SH.contains("  peer-ab)\n"));
        let body = RUN_SH
            .split("\nrun_peer_ab() {\n")
            .nth(1)
            .and_then(|rest| rest.split("\n}\n").next())
            .expect("run_peer_ab is defined");
        assert!(
            !body.contains("peer_build"),
            "peer-ab must not need RMM C++"
        );
        assert!(body.contains(
            "sed -E '/^resource /{/^resource (pool|arena|binning|fixed_size)( |$)/!d;}'"
        ));
        assert!(body.contains("\"$peer\" report-ab \"$befores\" \"$afters\""));
        assert!(README_TXT.contains("run.sh peer-ab"));
    }

    /// `run.sh peer-replay` replays each log through rmm-rs's pool (`rmm-replay`) and RMM's
    /// (`rmm_peer --replay`) in alternating processes, reduced by `report-replay` (the
    /// self-test checks the order and the files on fake programs).
    #[test]
    fn peer_replay_mode_alternates_both_replays() {
        assert!(RUN_SH.contains("  peer-replay)\n"));
        for step in [
            "peer_build \"$REPLAY_FAILED\" reuse",
            "\"$peer\" replay-prep \"$dir\"",
            "\"$build/rmm_peer\" --replay \"$log\"",
            "\"$tool\" --resource pool \"$log\"",
            "\"$peer\" report-replay \"${triples[@]}\"",
        ] {
            assert!(RUN_SH.contains(step), "{step}");
        }
        assert!(README_TXT.contains("run.sh peer-replay"));
    }

    /// `run.sh torch-alloc` compiles `torch_alloc.cpp` against python's torch and the C API's
    /// library, printing the command on failure (the self-test checks it on fake programs).
    #[test]
    fn torch_alloc_mode_compiles_against_torch_and_the_library() {
        assert!(RUN_SH.contains("  torch-alloc)\n"));
        for needle in [
            "torch.compiled_with_cxx11_abi()",
            "\"-D_GLIBCXX_USE_CXX11_ABI=$abi\"",
            "-lc10_cuda -lc10 -lrmm_capi",
            "echo \"  ${compile[*]}\"",
            "\"$build/torch_alloc\" \"$@\"",
        ] {
            assert!(RUN_SH.contains(needle), "{needle}");
        }
        assert!(README_TXT.contains("run.sh torch-alloc"));
    }

    #[test]
    fn running_a_missing_bundle_is_an_error() {
        let err = run(Path::new("/nonexistent/gpu-bundle"), &[], &[]).unwrap_err();
        assert!(err.contains("cargo xtask gpu bundle"), "{err}");
    }
}
