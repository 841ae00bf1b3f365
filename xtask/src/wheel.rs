//! `cargo xtask wheel [--out DIR]`: the Python wheel `rmm_rs_torch`, the C library and the
//! module together, built with [maturin](https://www.maturin.rs) (`pip install maturin`; it
//! runs `cargo build --release -p rmm-capi` itself). What a user installs:
//!
//! ```text
//! rmm_rs_torch/__init__.py                python/rmm_rs_torch.py
//! rmm_rs_torch/native/libnative.so        librmm_capi.so (release, stripped), which the
//!                                         module finds beside it
//! rmm_rs_torch/native/__init__.py, ffi.py maturin's cffi declarations (unused: the module
//!                                         loads the library with ctypes)
//! ```
//!
//! The package is staged in `target/wheel-src/` (a `pyproject.toml` and the module as the
//! package's `__init__.py`), since the repository keeps the module as one file. maturin reads
//! the library's cffi declarations through cbindgen with `crates/rmm-capi/cbindgen.toml`. The
//! wheel is tagged `linux_x86_64` (it needs glibc and libstdc++ of the machine that built it,
//! as the bundle's other binaries do); the command checks what it holds before it returns.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cargo::{self, Error};

/// The distribution and import name.
pub(crate) const PACKAGE: &str = "rmm_rs_torch";

/// Where maturin puts the library in the wheel (`<module>/lib<name>.so`).
pub(crate) const NATIVE_MODULE: &str = "rmm_rs_torch.native";

/// The staged project's `pyproject.toml`, for the crate's manifest at `manifest`.
pub(crate) fn pyproject(manifest: &Path) -> String {
    format!(
        "[build-system]\n\
         requires = [\"maturin>=1.5,<2\"]\n\
         build-backend = \"maturin\"\n\
         \n\
         [project]\n\
         name = \"{PACKAGE}\"\n\
         description = \"rmm-rs (a Rust rebuild of RAPIDS RMM) as PyTorch's CUDA allocator\"\n\
         requires-python = \">=3.8\"\n\
         license = \"Apache-2.0\"\n\
         dynamic = [\"version\"]\n\
         \n\
         [tool.maturin]\n\
         manifest-path = \"{}\"\n\
         bindings = \"cffi\"\n\
         python-source = \".\"\n\
         module-name = \"{NATIVE_MODULE}\"\n\
         strip = true\n\
         compatibility = \"linux\"\n",
        manifest.display()
    )
}

/// Checks that the wheel's files (`names`, as the zip lists them) hold the module and the
/// library; returns the library's path in the wheel.
pub(crate) fn check_contents(names: &[String]) -> Result<String, Error> {
    let module = format!("{PACKAGE}/__init__.py");
    let native_dir = format!("{}/", NATIVE_MODULE.replace('.', "/"));
    let library = names
        .iter()
        .find(|n| n.starts_with(&native_dir) && n.ends_with(".so"));
    let metadata = names
        .iter()
        .any(|n| n.contains(".dist-info/") && n.ends_with("/METADATA"));
    match (names.contains(&module), library, metadata) {
        (true, Some(library), true) => Ok(library.clone()),
        (has_module, library, metadata) => Err(format!(
            "the wheel lacks {}",
            [
                (!has_module).then(|| module.clone()),
                library
                    .is_none()
                    .then(|| format!("a library {native_dir}*.so")),
                (!metadata).then(|| "its .dist-info/METADATA".to_owned()),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        )),
    }
}

/// The file names in the zip at `path` (read with Python's zipfile, which every machine that
/// builds a wheel has).
fn list_zip(path: &Path) -> Result<Vec<String>, Error> {
    let out = cargo::run_stdout(
        Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
            ])
            .arg(path),
    )?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// Stages and builds the wheel into `out`; returns its path.
pub(crate) fn build(out: &Path) -> Result<PathBuf, Error> {
    let root = cargo::repo_root();
    // maturin runs in the staging folder: a relative `out` would land the wheel there.
    let out = &std::path::absolute(out).map_err(|e| format!("{}: {e}", out.display()))?;
    cargo::run_stdout(Command::new("maturin").arg("--version")).map_err(|e| {
        format!("{e}\nthe wheel is built with maturin: pip install maturin (from PyPI)")
    })?;
    let stage = root.join("target/wheel-src");
    if stage.exists() {
        fs::remove_dir_all(&stage)
            .map_err(|e| format!("cannot remove {}: {e}", stage.display()))?;
    }
    let package = stage.join(PACKAGE);
    fs::create_dir_all(&package)
        .map_err(|e| format!("cannot create {}: {e}", package.display()))?;
    let manifest = root.join("crates/rmm-capi/Cargo.toml");
    fs::write(stage.join("pyproject.toml"), pyproject(&manifest))
        .map_err(|e| format!("cannot write the staged pyproject.toml: {e}"))?;
    fs::copy(
        root.join("python/rmm_rs_torch.py"),
        package.join("__init__.py"),
    )
    .map_err(|e| format!("cannot stage python/rmm_rs_torch.py: {e}"))?;
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    // Wheels of earlier builds would be taken for this one.
    for entry in fs::read_dir(out).map_err(|e| format!("cannot read {}: {e}", out.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if is_our_wheel(&path) {
            fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        }
    }
    println!("==> building the wheel {PACKAGE} with maturin (release)");
    cargo::run_status(
        Command::new("maturin")
            .args(["build", "--release", "--out"])
            .arg(out)
            .current_dir(&stage)
            .env("CARGO_TARGET_DIR", root.join("target")),
    )?;
    let wheel = fs::read_dir(out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| is_our_wheel(p))
        .ok_or_else(|| format!("maturin wrote no {PACKAGE}-*.whl into {}", out.display()))?;
    let library = check_contents(&list_zip(&wheel)?)?;
    println!("wheel: {} (library {library})", wheel.display());
    Ok(wheel)
}

fn is_our_wheel(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(&format!("{PACKAGE}-")) && n.ends_with(".whl"))
}

/// `cargo xtask wheel [--out DIR]` (default `target/wheels`).
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    let out = match args {
        [] => cargo::repo_root().join("target/wheels"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => return Err("usage: cargo xtask wheel [--out DIR]".to_owned()),
    };
    build(&out)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_wheel_must_hold_the_module_and_the_library() {
        let good = names(&[
            "rmm_rs_torch/__init__.py",
            "rmm_rs_torch/native/__init__.py",
            "rmm_rs_torch/native/ffi.py",
            "rmm_rs_torch/native/libnative.so",
            "rmm_rs_torch-0.1.0.dist-info/METADATA",
            "rmm_rs_torch-0.1.0.dist-info/WHEEL",
        ]);
        assert_eq!(
            check_contents(&good).unwrap(),
            "rmm_rs_torch/native/libnative.so"
        );
        let e = check_contents(&good[1..3]).unwrap_err();
        assert_eq!(
            e,
            "the wheel lacks rmm_rs_torch/__init__.py, a library rmm_rs_torch/native/*.so, \
             its .dist-info/METADATA"
        );
    }

    #[test]
    fn the_staged_project_builds_the_c_library_as_the_package_s_native_part() {
        let text = pyproject(Path::new("/r/crates/rmm-capi/Cargo.toml"));
        for line in [
            "name = \"rmm_rs_torch\"",
            "manifest-path = \"/r/crates/rmm-capi/Cargo.toml\"",
            "module-name = \"rmm_rs_torch.native\"",
            "python-source = \".\"",
            "strip = true",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        let root = cargo::repo_root();
        assert!(root.join("python/rmm_rs_torch.py").is_file());
        assert!(root.join("crates/rmm-capi/cbindgen.toml").is_file());
    }

    /// The module finds the library where the wheel puts it.
    #[test]
    fn the_module_looks_for_the_library_where_the_wheel_puts_it() {
        let module = fs::read_to_string(cargo::repo_root().join("python/rmm_rs_torch.py")).unwrap();
        assert!(module.contains("here / \"native\""), "find_library");
    }
}
