//! `cargo xtask gpu bundle`: builds the GPU test, bench and example executables
//! and lays them out with the runner in a folder that travels to a GPU machine.

use crate::artifacts::{self, Artifact, Entry, Kind};
use crate::capi;
use crate::cargo::{self, Error};
use crate::peer;
use crate::runner;
use serde_json::Value;
use std::fs;
use std::path::Path;

/// The most a bundle may weigh: the GPU machine takes 64 MiB of working tree in all.
pub(crate) const MAX_BUNDLE_BYTES: u64 = 60 * 1024 * 1024;

/// Bundle paths this command owns; they are removed before a new bundle is written.
const OWNED: &[&str] = &[
    "bin",
    "bench",
    "examples",
    "logs",
    "manifest.json",
    "run.sh",
    "README.txt",
    "peer",
    "capi",
    "tools",
];

/// Builds everything and writes the bundle to `out`; with `with_peer`, also `out/peer/` (the
/// RMM C++ driver, the librmm wheels and the sample log, see [`peer`]) and `out/tools/rmm-replay`. With `torch`, the bundle is the C API
/// and PyTorch one instead (see [`capi`]): the test binaries of [`capi::TORCH_PACKAGES`] only,
/// no benches or examples, and `capi/` and `tools/`. The default bundle leaves rmm-capi's
/// tests to that one.
pub(crate) fn build(out: &Path, with_peer: bool, torch: bool) -> Result<(), Error> {
    if with_peer && torch {
        return Err("--peer and --torch make different bundles: build them one at a time".into());
    }
    let metadata = cargo::metadata()?;
    let mut packages = artifacts::bundle_packages(&metadata)?;
    packages.retain(|_, name| {
        if torch {
            capi::TORCH_PACKAGES.contains(&name.as_str())
        } else {
            name != capi::PACKAGE
        }
    });
    let benches_left_out = artifacts::benches_left_out(&metadata)?;
    let tests_left_out = artifacts::tests_left_out(&metadata)?;
    let mut common: Vec<&str> = vec!["--all-features", "--profile", "gpu"];
    if torch {
        for name in capi::TORCH_PACKAGES {
            common.extend(["-p", name]);
        }
    } else {
        common.push("--workspace");
    }
    let json = "--message-format=json";
    // The packages whose benchmarks go in are built apart, without `--all-features`: in one
    // build with the tests, rmm-sys's `testing` feature would put its fault-injection hook into
    // every driver call the benchmarks time (and their examples, the peer comparison, are built
    // without even their default features, below).
    let measuring = artifacts::measuring_packages(&metadata)?;
    let selected: Vec<String> = measuring
        .iter()
        .flat_map(|p| ["-p".to_owned(), p.clone()])
        .collect();
    let excluded: Vec<String> = measuring
        .iter()
        .flat_map(|p| ["--exclude".to_owned(), p.clone()])
        .collect();

    println!("==> building test binaries (profile gpu)");
    let tests = cargo::json_messages(&mut cargo::cargo(
        ["test"].iter().chain(&common).chain(&["--no-run", json]),
    ))?;
    let (benches, examples) = if torch {
        (Vec::new(), Vec::new())
    } else {
        let mut benches = Vec::new();
        if !measuring.is_empty() {
            // The benchmarks with their packages' default features (rmm-benches's
            // `driver-hooks`: `gpu_alloc`'s counts of slow-path driver calls and the
            // `--simulated` modes need rmm-sys's hook)...
            println!(
                "==> building bench binaries (profile gpu, default features): {}",
                measuring.join(", ")
            );
            benches = cargo::json_messages(&mut cargo::cargo(
                ["build", "--profile", "gpu", "--benches", json]
                    .into_iter()
                    .chain(selected.iter().map(String::as_str)),
            ))?;
            // ...and their examples (the peer comparison with RMM C++, `wrap_ab`) without any:
            // what they time must have no hook RMM's side lacks. Only packages that have
            // examples: building another's (rmm-capi's) would bring its dev-dependencies' test
            // features into the same build.
            let comparing = artifacts::with_examples(&metadata, &measuring)?;
            if !comparing.is_empty() {
                println!(
                    "==> building their packages' examples (profile gpu, no default features, \
                     no test features): {}",
                    comparing.join(", ")
                );
                let comparing_args: Vec<String> = comparing
                    .iter()
                    .flat_map(|p| ["-p".to_owned(), p.clone()])
                    .collect();
                let comparisons = cargo::json_messages(&mut cargo::cargo(
                    [
                        "build",
                        "--profile",
                        "gpu",
                        "--examples",
                        "--no-default-features",
                        json,
                    ]
                    .into_iter()
                    .chain(comparing_args.iter().map(String::as_str)),
                ))?;
                let hooked = artifacts::test_features(&comparisons);
                if !hooked.is_empty() {
                    return Err(format!(
                        "the examples' build has test-only features ({}): a dependency of {} \
                         turns them on, and the peer comparison would time rmm-sys's fault hook \
                         in every driver call (`cargo tree -e features -i rmm-sys` shows which)",
                        hooked.join(", "),
                        comparing.join(", ")
                    ));
                }
                benches.extend(comparisons);
            }
        }
        println!("==> building the other examples (profile gpu)");
        let examples = cargo::json_messages(&mut cargo::cargo(
            ["build"]
                .into_iter()
                .chain(common.iter().copied())
                .chain(["--examples", json])
                .chain(excluded.iter().map(String::as_str)),
        ))?;
        (benches, examples)
    };

    prepare(out)?;
    let mut entries = Vec::new();
    for (messages, kind) in [
        (&tests, Kind::Test),
        (&benches, Kind::Bench),
        (&benches, Kind::Example),
        (&examples, Kind::Example),
    ] {
        let mut selected = artifacts::select(messages, kind, &packages);
        selected.retain(|a| a.kind != Kind::Bench || !benches_left_out.contains(&a.package));
        selected.retain(|a| {
            a.kind != Kind::Test || !tests_left_out.contains(&(a.package.clone(), a.target.clone()))
        });
        entries.extend(copy_all(out, &selected)?);
    }
    if torch {
        entries.extend(capi::add_to_bundle(out)?);
    }
    if with_peer {
        entries.push(peer::add_replay_tool(out)?);
    }
    entries.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));

    let manifest = Value::Array(entries.iter().map(Entry::to_json).collect());
    let manifest = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())? + "\n";
    write(&out.join("manifest.json"), manifest.as_bytes())?;
    write(&out.join("run.sh"), runner::RUN_SH.as_bytes())?;
    make_executable(&out.join("run.sh"))?;
    write(&out.join("README.txt"), runner::README_TXT.as_bytes())?;

    let peer_bytes = if with_peer {
        peer::add_to_bundle(out)?
    } else {
        0
    };
    let total = entries.iter().map(|e| e.bytes).sum::<u64>()
        + (manifest.len() + runner::RUN_SH.len() + runner::README_TXT.len()) as u64
        + peer_bytes;
    for kind in [
        Kind::Test,
        Kind::Bench,
        Kind::Example,
        Kind::Capi,
        Kind::Tool,
    ] {
        let of_kind: Vec<&Entry> = entries.iter().filter(|e| e.kind == kind).collect();
        let bytes: u64 = of_kind.iter().map(|e| e.bytes).sum();
        println!(
            "{:<8} {:>3} file(s) in {}/, {}",
            kind.as_str(),
            of_kind.len(),
            kind.dir(),
            mib(bytes)
        );
    }
    println!("bundle: {} in {}", mib(total), out.display());
    // What travels is the archive: compressed, the bundle keeps well under the limit.
    let archive = archive(out)?;
    let packed = fs::metadata(&archive)
        .map_err(|e| format!("{}: {e}", archive.display()))?
        .len();
    println!(
        "archive: {} in {} (carry it; on the GPU machine: tar xzf {} first)",
        mib(packed),
        archive.display(),
        archive.display()
    );
    check_size(packed)?;
    if torch {
        println!(
            "run it on a GPU machine with: bash {}/run.sh torch (and run.sh torch-bench, run.sh torch-alloc, run.sh for the tests of {})",
            out.display(),
            capi::TORCH_PACKAGES.join(", ")
        );
    } else {
        println!(
            "run it on a GPU machine with: bash {}/run.sh",
            out.display()
        );
    }
    if with_peer {
        println!(
            "the peer comparison with RMM C++, then its wrapper cells over several \
             processes a side: bash {0}/run.sh peer (RMM_PEER_WRAP_ROUNDS=0: the comparison \
             alone; run.sh peer-wrap: the wrapper cells alone); the fragmentation scenarios \
             beside RMM's: bash {0}/run.sh peer-frag; real logs replayed through both \
             pools: bash {0}/run.sh peer-replay [LOG...]",
            out.display()
        );
    }
    Ok(())
}

/// Writes `out` as `<out>.tar.gz` beside it (with `tar`, so that it unpacks to the same folder
/// name) and returns the archive's path.
fn archive(out: &Path) -> Result<std::path::PathBuf, Error> {
    let name = out
        .file_name()
        .ok_or_else(|| format!("{}: not a folder name", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let mut file = name.to_os_string();
    file.push(".tar.gz");
    let archive = parent.join(file);
    let status = std::process::Command::new("tar")
        .arg("czf")
        .arg(&archive)
        .arg("-C")
        .arg(&parent)
        .arg(name)
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar czf {} failed ({status})", archive.display()));
    }
    Ok(archive)
}

/// An error when a bundle archive of `total` bytes is too large to travel.
pub(crate) fn check_size(total: u64) -> Result<(), Error> {
    if total > MAX_BUNDLE_BYTES {
        return Err(format!(
            "the bundle archive is {}, over the {} limit (the GPU machine accepts 64 MiB of working tree in all)",
            mib(total),
            mib(MAX_BUNDLE_BYTES)
        ));
    }
    Ok(())
}

/// Bytes as MiB with one decimal.
pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Creates `out` and removes what an earlier bundle left in it (only the paths we own).
fn prepare(out: &Path) -> Result<(), Error> {
    for name in OWNED {
        let path = out.join(name);
        let result = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else if path.exists() {
            fs::remove_file(&path)
        } else {
            Ok(())
        };
        result.map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
    }
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))
}

/// Copies the artifacts into their bundle folder and returns their manifest entries.
fn copy_all(out: &Path, selected: &[Artifact]) -> Result<Vec<Entry>, Error> {
    let names = artifacts::file_names(selected)?;
    let mut entries = Vec::new();
    for (artifact, name) in selected.iter().zip(names) {
        let dir = out.join(artifact.kind.dir());
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let dest = dir.join(&name);
        let bytes = fs::copy(&artifact.executable, &dest).map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                artifact.executable.display(),
                dest.display()
            )
        })?;
        make_executable(&dest)?;
        entries.push(Entry {
            kind: artifact.kind,
            package: artifact.package.clone(),
            target: artifact.target.clone(),
            path: format!("{}/{name}", artifact.kind.dir()),
            bytes,
        });
    }
    Ok(entries)
}

/// Writes a file, naming it in the error.
fn write(path: &Path, contents: &[u8]) -> Result<(), Error> {
    fs::write(path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Sets mode 0755 where the platform has modes.
fn make_executable(path: &Path) -> Result<(), Error> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot make {} executable: {e}", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn size_limit_is_60_mib() {
        assert!(check_size(MAX_BUNDLE_BYTES).is_ok());
        let err = check_size(MAX_BUNDLE_BYTES + 1).unwrap_err();
        assert!(err.contains("over the 60.0 MiB limit"), "{err}");
        assert_eq!(mib(3 * 1024 * 1024 / 2), "1.5 MiB");
    }

    #[test]
    fn manifest_entry_has_the_documented_fields() {
        let entry = Entry {
            kind: Kind::Bench,
            package: "rmm-mr".into(),
            target: "pool".into(),
            path: "bench/rmm-mr--pool".into(),
            bytes: 42,
        };
        assert_eq!(
            entry.to_json(),
            json!({
                "kind": "bench",
                "package": "rmm-mr",
                "target": "pool",
                "path": "bench/rmm-mr--pool",
                "bytes": 42,
            })
        );
    }

    #[test]
    fn prepare_removes_only_owned_paths_and_copy_all_lays_out_files() {
        let dir = std::env::temp_dir().join(format!("xtask-bundle-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("bin/stale"), b"old").unwrap();
        fs::write(dir.join("keep.txt"), b"mine").unwrap();
        prepare(&dir).unwrap();
        assert!(!dir.join("bin").exists());
        assert!(dir.join("keep.txt").exists());

        let exe = dir.join("built-exe");
        fs::write(&exe, b"#!/bin/sh\n").unwrap();
        let artifact = Artifact {
            kind: Kind::Test,
            package: "rmm-sys".into(),
            target: "rmm_sys".into(),
            target_kind: "lib".into(),
            executable: exe,
        };
        let entries = copy_all(&dir, &[artifact]).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].path, "bin/rmm-sys--rmm_sys");
        assert_eq!(entries[0].bytes, 10);
        assert_eq!(
            fs::read(dir.join("bin/rmm-sys--rmm_sys")).unwrap(),
            b"#!/bin/sh\n"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
