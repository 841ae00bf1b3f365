//! The C API and PyTorch bundle, `cargo xtask gpu bundle --torch` (`run.sh torch`,
//! `run.sh torch-bench`, `run.sh torch-alloc`, and `run.sh` for the GPU tests of
//! [`TORCH_PACKAGES`]): the shared
//! library, the C and C++ test programs compiled here against it (the GPU machine has no Rust),
//! the Python files, and the `rmm-replay` tool that replays the log the PyTorch run writes. It
//! is a bundle of its own because the default bundle is close to the 60 MiB a bundle may weigh.
//!
//! ```text
//! capi/librmm_capi.so            the library PyTorch loads (built without test features)
//! capi/rmm_rs.h                  its header
//! capi/test_capi                 crates/rmm-capi/tests/c/test_capi.c, linked with librmm_capi.a
//!                                as the header says
//! capi/test_torch_shim           crates/rmm-capi/tests/c/test_torch_shim.cpp, linked with
//!                                librmm_capi.so beside it, as PyTorch uses the library
//! capi/python/...                python/rmm_rs_torch.py, bench_torch.py, tests/test_*.py,
//!                                tools/torch_alloc.cpp (compiled on the GPU machine against
//!                                torch by `run.sh torch-alloc`)
//! capi/rmm_rs_torch-*.whl        the wheel (`cargo xtask wheel`): what `run.sh torch` installs
//!                                into a venv and runs the Python tests with
//! tools/rmm-replay               the log replay (crates/rmm-replay)
//! ```

use crate::artifacts::{Entry, Kind};
use crate::cargo::{self, Error};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C API's package, whose tests travel only in the torch bundle.
pub(crate) const PACKAGE: &str = "rmm-capi";

/// The packages whose test binaries the torch bundle carries: the C API's and rmm-sys's (the
/// primary-context guard the C API relies on).
pub(crate) const TORCH_PACKAGES: &[&str] = &[PACKAGE, "rmm-sys"];

/// The Python files that travel (and `torch_alloc.cpp`, which `run.sh torch-alloc` compiles
/// against torch on the GPU machine), relative to the repository root, and their place under
/// `capi/`.
pub(crate) const PYTHON_FILES: &[(&str, &str)] = &[
    ("python/rmm_rs_torch.py", "python/rmm_rs_torch.py"),
    ("python/bench_torch.py", "python/bench_torch.py"),
    ("python/tests/test_torch.py", "python/tests/test_torch.py"),
    ("python/tests/test_ctypes.py", "python/tests/test_ctypes.py"),
    (
        "python/tools/make_torch_snapshots.py",
        "python/tools/make_torch_snapshots.py",
    ),
    (
        "python/tools/torch_alloc.cpp",
        "python/tools/torch_alloc.cpp",
    ),
];

/// The header, relative to the repository root.
pub(crate) const HEADER: &str = "crates/rmm-capi/include/rmm_rs.h";

/// What the gpu-profile build of rmm-capi and rmm-replay produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Built {
    pub(crate) shared: PathBuf,
    pub(crate) static_lib: PathBuf,
    pub(crate) replay: PathBuf,
}

/// Picks the libraries of rmm-capi and the `rmm-replay` executable out of cargo's messages.
pub(crate) fn find_built(messages: &[Value]) -> Result<Built, Error> {
    let (mut shared, mut static_lib) = (None, None);
    let replay = crate::peer::replay_executable(messages);
    for msg in messages {
        if msg.get("reason").and_then(Value::as_str) != Some("compiler-artifact") {
            continue;
        }
        if msg["target"]["name"].as_str() != Some("rmm_capi") {
            continue;
        }
        for f in msg["filenames"].as_array().into_iter().flatten() {
            let Some(f) = f.as_str() else { continue };
            if f.ends_with("librmm_capi.so") {
                shared = Some(PathBuf::from(f));
            } else if f.ends_with("librmm_capi.a") {
                static_lib = Some(PathBuf::from(f));
            }
        }
    }
    match (shared, static_lib, replay) {
        (Some(shared), Some(static_lib), Some(replay)) => Ok(Built {
            shared,
            static_lib,
            replay,
        }),
        (s, a, r) => Err(format!(
            "cargo built no {}",
            [
                s.is_none().then_some("librmm_capi.so"),
                a.is_none().then_some("librmm_capi.a"),
                r.is_none().then_some("rmm-replay executable"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        )),
    }
}

/// The compiler commands of the two test programs: the C one with the static library and the
/// header's link line (plus `--gc-sections`, which halves it), the C++ one with the shared
/// library found beside it (`$ORIGIN`), so that its exceptions cross the library's boundary as
/// they do into PyTorch. `out` holds the shared library when the second one runs.
pub(crate) fn compile_commands(root: &Path, static_lib: &Path, out: &Path) -> Vec<Command> {
    let include = format!("-I{}", root.join("crates/rmm-capi/include").display());
    let tests = root.join("crates/rmm-capi/tests/c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let mut c = Command::new(cc);
    // `-s`: stripped, as the rest of the bundle (the static library carries std's symbols).
    c.args([
        "-std=c11",
        "-O2",
        "-s",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
    ])
    .arg(&include)
    .arg(tests.join("test_capi.c"))
    .arg(static_lib)
    .args([
        "-Wl,--gc-sections",
        "-lstdc++",
        "-ldl",
        "-lpthread",
        "-lm",
        "-o",
    ])
    .arg(out.join("test_capi"));
    let mut cpp = Command::new(cxx);
    cpp.args(["-std=c++17", "-O2", "-s", "-Wall", "-Wextra", "-Werror"])
        .arg(&include)
        .arg(tests.join("test_torch_shim.cpp"))
        .arg(format!("-L{}", out.display()))
        .args(["-Wl,-rpath,$ORIGIN", "-lrmm_capi", "-o"])
        .arg(out.join("test_torch_shim"));
    vec![c, cpp]
}

fn copy(from: &Path, to: &Path) -> Result<u64, Error> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    fs::copy(from, to)
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

fn entry(kind: Kind, package: &str, target: &str, path: &str, bytes: u64) -> Entry {
    Entry {
        kind,
        package: package.to_owned(),
        target: target.to_owned(),
        path: path.to_owned(),
        bytes,
    }
}

/// Builds and writes `out/capi/` and `out/tools/`; returns their manifest entries.
pub(crate) fn add_to_bundle(out: &Path) -> Result<Vec<Entry>, Error> {
    println!("==> building rmm-capi and rmm-replay (profile gpu, default features)");
    let messages = cargo::json_messages(&mut cargo::cargo([
        "build",
        "--profile",
        "gpu",
        "-p",
        "rmm-capi",
        "-p",
        "rmm-replay",
        "--lib",
        "--bin",
        "rmm-replay",
        "--message-format=json",
    ]))?;
    let built = find_built(&messages)?;
    let root = cargo::repo_root();
    let capi = out.join("capi");
    fs::create_dir_all(&capi).map_err(|e| format!("cannot create {}: {e}", capi.display()))?;
    let mut entries = Vec::new();
    let bytes = copy(&built.shared, &capi.join("librmm_capi.so"))?;
    entries.push(entry(
        Kind::Capi,
        "rmm-capi",
        "rmm_capi",
        "capi/librmm_capi.so",
        bytes,
    ));
    println!("==> compiling the C and C++ test programs against librmm_capi.a and .so");
    for mut cmd in compile_commands(&root, &built.static_lib, &capi) {
        cargo::run_status(&mut cmd)?;
    }
    for name in ["test_capi", "test_torch_shim"] {
        let bytes = fs::metadata(capi.join(name))
            .map_err(|e| format!("{name} was not built: {e}"))?
            .len();
        entries.push(entry(
            Kind::Capi,
            "rmm-capi",
            name,
            &format!("capi/{name}"),
            bytes,
        ));
    }
    let bytes = copy(&root.join(HEADER), &capi.join("rmm_rs.h"))?;
    entries.push(entry(
        Kind::Capi,
        "rmm-capi",
        "header",
        "capi/rmm_rs.h",
        bytes,
    ));
    for (from, to) in PYTHON_FILES {
        let bytes = copy(&root.join(from), &capi.join(to))?;
        let name = Path::new(to)
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        entries.push(entry(
            Kind::Capi,
            "python",
            &name,
            &format!("capi/{to}"),
            bytes,
        ));
    }
    let wheel = crate::wheel::build(&capi)?;
    let name = wheel
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let bytes = fs::metadata(&wheel)
        .map_err(|e| format!("{}: {e}", wheel.display()))?
        .len();
    entries.push(entry(
        Kind::Capi,
        "python",
        "wheel",
        &format!("capi/{name}"),
        bytes,
    ));
    let bytes = copy(&built.replay, &out.join("tools/rmm-replay"))?;
    entries.push(entry(
        Kind::Tool,
        "rmm-replay",
        "rmm-replay",
        "tools/rmm-replay",
        bytes,
    ));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_libraries_and_the_replay_tool() {
        let messages = vec![
            json!({"reason": "compiler-artifact", "target": {"name": "rmm_capi"},
                   "filenames": ["/t/gpu/librmm_capi.so", "/t/gpu/librmm_capi.a", "/t/gpu/librmm_capi.rlib"],
                   "executable": null}),
            json!({"reason": "compiler-artifact", "target": {"name": "rmm_replay"},
                   "filenames": ["/t/gpu/librmm_replay.rlib"], "executable": null}),
            json!({"reason": "compiler-artifact", "target": {"name": "rmm-replay"},
                   "filenames": ["/t/gpu/rmm-replay"], "executable": "/t/gpu/rmm-replay"}),
            json!({"reason": "build-finished", "success": true}),
        ];
        assert_eq!(
            find_built(&messages).unwrap(),
            Built {
                shared: "/t/gpu/librmm_capi.so".into(),
                static_lib: "/t/gpu/librmm_capi.a".into(),
                replay: "/t/gpu/rmm-replay".into(),
            }
        );
        let err = find_built(&messages[1..]).unwrap_err();
        assert_eq!(err, "cargo built no librmm_capi.so, librmm_capi.a");
    }

    #[test]
    fn test_programs_use_the_documented_link_lines() {
        let cmds = compile_commands(
            Path::new("/r"),
            Path::new("/t/librmm_capi.a"),
            Path::new("/o"),
        );
        let line = |c: &Command| {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let c = line(&cmds[0]);
        assert!(
            c.ends_with("/r/crates/rmm-capi/tests/c/test_capi.c /t/librmm_capi.a -Wl,--gc-sections -lstdc++ -ldl -lpthread -lm -o /o/test_capi"),
            "{c}"
        );
        assert!(c.contains("-I/r/crates/rmm-capi/include"), "{c}");
        let cpp = line(&cmds[1]);
        assert!(
            cpp.contains("-std=c++17") && cpp.ends_with("-o /o/test_torch_shim"),
            "{cpp}"
        );
    }

    #[test]
    fn the_files_that_travel_exist() {
        let root = cargo::repo_root();
        for (from, _) in PYTHON_FILES {
            assert!(root.join(from).is_file(), "{from}");
        }
        assert!(root.join(HEADER).is_file());
        for c in ["test_capi.c", "test_torch_shim.cpp"] {
            assert!(
                root.join("crates/rmm-capi/tests/c").join(c).is_file(),
                "{c}"
            );
        }
    }
}
