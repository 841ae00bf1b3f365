//! Running cargo (and other programs) from the xtask, at the workspace root.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The error type of the xtask: a message for the user.
pub(crate) type Error = String;

/// The workspace root (the parent of the xtask package).
pub(crate) fn repo_root() -> PathBuf {
    let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask_dir.parent().unwrap_or(xtask_dir).to_path_buf()
}

/// A `cargo` command (the cargo that runs us, if known) started at the workspace root.
pub(crate) fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(repo_root());
    cmd
}

/// Describes a command the way a user would type it.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut parts = vec![Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Runs `cmd` with inherited stdio; an error if it cannot start or exits non-zero.
pub(crate) fn run_status(cmd: &mut Command) -> Result<(), Error> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", describe(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed ({status})", describe(cmd)))
    }
}

/// Runs `cmd`, passing stderr through, and returns its stdout (an error if it fails).
pub(crate) fn run_stdout(cmd: &mut Command) -> Result<String, Error> {
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", describe(cmd)))?;
    if !output.status.success() {
        return Err(format!("`{}` failed ({})", describe(cmd), output.status));
    }
    String::from_utf8(output.stdout)
        .map_err(|e| format!("`{}`: output is not UTF-8: {e}", describe(cmd)))
}

/// `cargo metadata --format-version 1 --no-deps`, parsed.
pub(crate) fn metadata() -> Result<Value, Error> {
    let out = run_stdout(&mut cargo([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    serde_json::from_str(&out).map_err(|e| format!("cannot parse cargo metadata: {e}"))
}

/// The package objects of the workspace members in `cargo metadata` output.
pub(crate) fn workspace_packages(metadata: &Value) -> Result<Vec<&Value>, Error> {
    let ids = metadata
        .get("workspace_members")
        .and_then(Value::as_array)
        .ok_or("metadata has no `workspace_members` array")?;
    let packages = metadata
        .get("packages")
        .and_then(Value::as_array)
        .ok_or("metadata has no `packages` array")?;
    Ok(packages
        .iter()
        .filter(|p| p.get("id").is_some_and(|id| ids.contains(id)))
        .collect())
}

/// Runs a cargo command with `--message-format=json` and returns its JSON messages.
///
/// Lines that are not JSON (none are expected on stdout) are ignored.
pub(crate) fn json_messages(cmd: &mut Command) -> Result<Vec<Value>, Error> {
    let out = run_stdout(cmd)?;
    Ok(out
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}
