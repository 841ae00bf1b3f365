//! The `package` step of `cargo xtask ci`: `cargo package` of the published crates, verified
//! against each other.
//!
//! Cargo verifies a workspace's crates against one another through a local overlay registry
//! of the freshly packed `.crate` files, and unpacks each into
//! `$CARGO_HOME/registry/src/-<hash of the target folder>/<name>-<version>/`. It does not unpack
//! again when that folder exists, so a CI machine that keeps `CARGO_HOME` between runs would
//! verify `rmm-stream` against the `rmm-sys` of an earlier run (version numbers do not change
//! between commits). The step therefore removes those unpacked copies of our crates first;
//! crates.io's folders (`index.crates.io-*`) are never touched.

use crate::cargo::{self, Error};
use std::path::{Path, PathBuf};

/// Packs and verifies `crates`, lowest layer first, after clearing stale unpacked copies.
pub(crate) fn run(crates: &[&str]) -> Result<(), Error> {
    if let Some(home) = cargo_home() {
        let removed = clear_overlay_copies(&home.join("registry").join("src"), crates)?;
        if removed > 0 {
            println!("package: removed {removed} unpacked copies of earlier packages");
        }
    }
    // `--allow-dirty`: the step checks what would be published, not whether the work tree is
    // committed.
    let mut cmd = cargo::cargo(["package", "--allow-dirty"]);
    for name in crates {
        cmd.args(["-p", name]);
    }
    cargo::run_status(&mut cmd)
}

fn cargo_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return Some(PathBuf::from(home));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo"))
}

/// Removes `<src>/-*/<name>-<digit>*` for each of `crates`; returns how many folders went.
fn clear_overlay_copies(src: &Path, crates: &[&str]) -> Result<usize, Error> {
    let Ok(registries) = std::fs::read_dir(src) else {
        return Ok(0);
    };
    let mut removed = 0;
    for registry in registries.flatten() {
        // Overlay registries have no name before the hash; crates.io's start with `index.`.
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_copy_of(&name, crates) {
                std::fs::remove_dir_all(entry.path())
                    .map_err(|e| format!("removing {}: {e}", entry.path().display()))?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Whether a folder name is `<one of crates>-<version>`.
fn is_copy_of(folder: &str, crates: &[&str]) -> bool {
    crates.iter().any(|name| {
        folder
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_only_versioned_copies_of_our_crates() {
        let crates = ["rmm-sys", "rmm-mr"];
        assert!(is_copy_of("rmm-sys-0.1.0", &crates));
        assert!(is_copy_of("rmm-mr-12.0.0-rc1", &crates));
        assert!(!is_copy_of("rmm-stream-0.1.0", &crates));
        assert!(!is_copy_of("rmm-sys-extra-0.1.0", &crates));
        assert!(!is_copy_of("rmm-sys", &crates));
    }

    #[test]
    fn clears_overlay_folders_and_leaves_crates_io() {
        let root = std::env::temp_dir().join(format!("xtask-package-{}", std::process::id()));
        let overlay = root.join("-0123abcd");
        let crates_io = root.join("index.crates.io-1949cf8c6b5b557f");
        for dir in [
            overlay.join("rmm-sys-0.1.0/src"),
            overlay.join("serde-1.0.0"),
            crates_io.join("rmm-sys-0.1.0"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        assert_eq!(clear_overlay_copies(&root, &["rmm-sys"]).unwrap(), 1);
        assert!(!overlay.join("rmm-sys-0.1.0").exists());
        assert!(overlay.join("serde-1.0.0").exists());
        assert!(crates_io.join("rmm-sys-0.1.0").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
