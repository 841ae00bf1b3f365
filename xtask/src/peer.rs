//! What `cargo xtask gpu bundle --peer` adds to a bundle for the peer comparison with RMM C++
//! (`run.sh peer`): the C++ driver `benches/peer/rmm_peer.cpp` and the `librmm-cu13` and
//! `rapids-logger` wheels it is compiled against on the GPU machine; for the end-to-end
//! replay (`run.sh peer-replay`) also `tools/rmm-replay` (the rmm-rs side) and
//! `peer/logs/sample.csv` (rmm-replay's sample log).
//!
//! The wheels are looked for in `$RMM_PEER_WHEELS` (a folder) or `target/peer-wheels/`, and
//! downloaded there with pip when missing:
//!
//! ```text
//! python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
//!     --python-version 3.12 -d target/peer-wheels "librmm-cu13==26.10.*" "rapids-logger==0.2.*"
//! ```

use crate::artifacts::{Entry, Kind};
use crate::cargo::{self, Error};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The RMM release compared against, as pip names it.
pub(crate) const LIBRMM_REQUIREMENT: &str = "librmm-cu13==26.10.*";
/// The logger librmm links, as pip names it.
pub(crate) const LOGGER_REQUIREMENT: &str = "rapids-logger==0.2.*";
/// File name prefixes of the wheels the requirements select.
const LIBRMM_PREFIX: &str = "librmm_cu13-26.10.";
const LOGGER_PREFIX: &str = "rapids_logger-0.2.";
/// The driver's source, relative to the repository root.
pub(crate) const DRIVER_SOURCE: &str = "benches/peer/rmm_peer.cpp";
/// The log `run.sh peer-replay` replays by default (with two synthetic ones), relative to the
/// repository root; it travels as `peer/logs/sample.csv`.
pub(crate) const SAMPLE_LOG: &str = "crates/rmm-replay/samples/sample.csv";

/// The `rmm-replay` executable among cargo's messages.
pub(crate) fn replay_executable(messages: &[Value]) -> Option<PathBuf> {
    messages.iter().find_map(|msg| {
        (msg.get("reason").and_then(Value::as_str) == Some("compiler-artifact")
            && msg["target"]["name"].as_str() == Some("rmm-replay"))
        .then(|| msg["executable"].as_str().map(PathBuf::from))
        .flatten()
    })
}

/// Builds `rmm-replay` (profile gpu, default features: no test hook in what it times) and
/// copies it to `out/tools/rmm-replay`, the rmm-rs side of `run.sh peer-replay`; returns its
/// manifest entry.
pub(crate) fn add_replay_tool(out: &Path) -> Result<Entry, Error> {
    println!("==> building rmm-replay (profile gpu, default features) for run.sh peer-replay");
    let messages = cargo::json_messages(&mut cargo::cargo([
        "build",
        "--profile",
        "gpu",
        "-p",
        "rmm-replay",
        "--bin",
        "rmm-replay",
        "--message-format=json",
    ]))?;
    let exe = replay_executable(&messages).ok_or("cargo built no rmm-replay executable")?;
    let to = out.join("tools").join("rmm-replay");
    let dir = out.join("tools");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let bytes = fs::copy(&exe, &to)
        .map_err(|e| format!("cannot copy {} to {}: {e}", exe.display(), to.display()))?;
    Ok(Entry {
        kind: Kind::Tool,
        package: "rmm-replay".to_owned(),
        target: "rmm-replay".to_owned(),
        path: "tools/rmm-replay".to_owned(),
        bytes,
    })
}

/// Where the wheels are looked for and downloaded to.
pub(crate) fn wheel_dir() -> PathBuf {
    match std::env::var_os("RMM_PEER_WHEELS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => cargo::repo_root().join("target").join("peer-wheels"),
    }
}

/// The librmm and rapids-logger wheels among `names` (file names), the greatest version of
/// each where there are several; `None` unless both are there.
pub(crate) fn pick_wheels(names: &[String]) -> Option<(String, String)> {
    let best = |prefix: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(prefix) && n.ends_with(".whl"))
            .max()
            .cloned()
    };
    Some((best(LIBRMM_PREFIX)?, best(LOGGER_PREFIX)?))
}

/// The pip command that downloads the wheels into `dir`.
pub(crate) fn download_command(dir: &Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_28_x86_64",
        "--python-version",
        "3.12",
        "-d",
    ])
    .arg(dir)
    .args([LIBRMM_REQUIREMENT, LOGGER_REQUIREMENT]);
    cmd
}

fn listed(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let names: Vec<String> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let (a, b) = pick_wheels(&names)?;
    Some((dir.join(a), dir.join(b)))
}

/// The two wheels, downloaded first when missing.
pub(crate) fn wheels() -> Result<(PathBuf, PathBuf), Error> {
    let dir = wheel_dir();
    if let Some(found) = listed(&dir) {
        return Ok(found);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut cmd = download_command(&dir);
    println!("==> downloading the RMM wheels: {}", cargo::describe(&cmd));
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", cargo::describe(&cmd)))?;
    if !status.success() {
        return Err(format!(
            "`{}` failed ({status}); download the wheels by hand into {} or set RMM_PEER_WHEELS to a folder that holds them",
            cargo::describe(&cmd),
            dir.display()
        ));
    }
    listed(&dir).ok_or_else(|| {
        format!(
            "pip succeeded but {} holds no {LIBRMM_PREFIX}*.whl and {LOGGER_PREFIX}*.whl",
            dir.display()
        )
    })
}

/// Writes `out/peer/` (the driver's source and the wheels) and returns its size in bytes.
pub(crate) fn add_to_bundle(out: &Path) -> Result<u64, Error> {
    let (librmm, logger) = wheels()?;
    let dir = out.join("peer");
    let wheel_dir = dir.join("wheels");
    fs::create_dir_all(&wheel_dir)
        .map_err(|e| format!("cannot create {}: {e}", wheel_dir.display()))?;
    let logs = dir.join("logs");
    fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let source = cargo::repo_root().join(DRIVER_SOURCE);
    let mut total = 0;
    for (from, to) in [
        (source, dir.join("rmm_peer.cpp")),
        (cargo::repo_root().join(SAMPLE_LOG), logs.join("sample.csv")),
        (librmm.clone(), wheel_dir.join(file_name(&librmm)?)),
        (logger.clone(), wheel_dir.join(file_name(&logger)?)),
    ] {
        total += fs::copy(&from, &to)
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    }
    println!(
        "peer     driver and wheels in peer/ ({}, {})",
        file_name(&librmm)?,
        file_name(&logger)?
    );
    Ok(total)
}

fn file_name(path: &Path) -> Result<String, Error> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("{} has no file name", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn picks_both_wheels_or_none() {
        let both = names(&[
            "librmm_cu13-26.10.0-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
            "librmm_cu13-26.10.1-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
            "librmm_cu13-26.12.0-py3-none-manylinux_2_28_x86_64.whl",
            "rapids_logger-0.2.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
            "README.txt",
        ]);
        let (rmm, log) = pick_wheels(&both).unwrap();
        assert!(rmm.starts_with("librmm_cu13-26.10.1-"), "{rmm}");
        assert!(log.starts_with("rapids_logger-0.2.3-"), "{log}");
        assert_eq!(pick_wheels(&both[..3]), None);
        assert_eq!(pick_wheels(&names(&["librmm_cu13-26.10.0.tar.gz"])), None);
    }

    #[test]
    fn the_download_is_the_documented_pip_command() {
        let cmd = download_command(Path::new("/w"));
        assert_eq!(cmd.get_program(), "python3");
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "-m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
             --python-version 3.12 -d /w librmm-cu13==26.10.* rapids-logger==0.2.*"
        );
    }

    #[test]
    fn the_driver_source_and_the_sample_log_exist() {
        assert!(cargo::repo_root().join(DRIVER_SOURCE).is_file());
        assert!(cargo::repo_root().join(SAMPLE_LOG).is_file());
    }

    #[test]
    fn finds_the_replay_executable() {
        use serde_json::json;
        let messages = vec![
            json!({"reason": "compiler-artifact", "target": {"name": "rmm_replay"},
                   "filenames": ["/t/gpu/librmm_replay.rlib"], "executable": null}),
            json!({"reason": "compiler-artifact", "target": {"name": "rmm-replay"},
                   "filenames": ["/t/gpu/rmm-replay"], "executable": "/t/gpu/rmm-replay"}),
            json!({"reason": "build-finished", "success": true}),
        ];
        assert_eq!(
            replay_executable(&messages),
            Some(PathBuf::from("/t/gpu/rmm-replay"))
        );
        assert_eq!(replay_executable(&messages[..1]), None);
    }
}
