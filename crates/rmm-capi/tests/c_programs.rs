//! The C ABI from C, C++, a loader and Python, on this machine: compiles `tests/c/test_capi.c`
//! against the static and the shared library, `tests/c/test_torch_shim.cpp` (the PyTorch hook
//! must throw through C++), loads the shared library as PyTorch does (by name, every function
//! of the header), and runs `python/tests/test_ctypes.py` over it.
//!
//! The libraries are the ones cargo built beside this test binary (`target/<profile>/`). A
//! trial is ignored, with the reason, when they are not there (a test binary copied into the
//! GPU bundle: `run.sh torch` runs the prebuilt programs there), or when the compiler or
//! python3 is missing. The programs check what needs no GPU and count the GPU checks as
//! skipped when there is none; a trial fails unless the program's last line reports 0 failed.

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};
use rmm_sys::testing::{done, ignored, Outcome};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/`, where cargo puts the crate's libraries (this binary is in its `deps/`).
fn library_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?.to_path_buf();
    dir.join("librmm_capi.a").is_file().then_some(dir)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rmm-capi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    dir
}

fn ensure_program_passed(label: &str, output: &std::process::Output) -> Result<(), Failed> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    let ok = output.status.success()
        && last.starts_with(&format!("{label}: "))
        && last.contains(" passed, 0 failed");
    if ok {
        println!("    {last}");
        Ok(())
    } else {
        Err(format!("{label} ({}):\n{stdout}\n{stderr}", output.status).into())
    }
}

/// Compiles `source` with `compiler` and `args`, or says why it cannot (no compiler).
fn compile(
    compiler: &str,
    source: &Path,
    out: &Path,
    args: &[String],
) -> Result<Option<String>, Failed> {
    let mut cmd = Command::new(compiler);
    cmd.arg(source).arg("-o").arg(out).args(args);
    match cmd.output() {
        Err(e) => Ok(Some(format!("no compiler `{compiler}`: {e}"))),
        Ok(o) if o.status.success() => Ok(None),
        Ok(o) => Err(format!(
            "{cmd:?} failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .into()),
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn include_flag() -> String {
    format!("-I{}", crate_dir().join("include").display())
}

fn c_program(shared: bool) -> Outcome {
    let Some(lib) = library_dir() else {
        return ignored("librmm_capi.a is not beside this test binary (not a cargo build tree)");
    };
    let dir = scratch(if shared { "c-shared" } else { "c-static" });
    let exe = dir.join("test_capi");
    let mut args = vec![
        "-std=c11".to_owned(),
        "-Wall".to_owned(),
        "-Wextra".to_owned(),
        "-Werror".to_owned(),
        "-pedantic".to_owned(),
        include_flag(),
    ];
    if shared {
        args.extend([
            format!("-L{}", lib.display()),
            format!("-Wl,-rpath,{}", lib.display()),
            "-lrmm_capi".to_owned(),
            "-lpthread".to_owned(),
        ]);
    } else {
        // The documented link line of the static library.
        args.extend([
            lib.join("librmm_capi.a").display().to_string(),
            "-lstdc++".into(),
            "-ldl".into(),
            "-lpthread".into(),
            "-lm".into(),
        ]);
    }
    if let Some(why) = compile(
        &env_or("CC", "cc"),
        &crate_dir().join("tests/c/test_capi.c"),
        &exe,
        &args,
    )? {
        return ignored(why);
    }
    let output = Command::new(&exe).arg(&dir).output()?;
    ensure_program_passed("test_capi", &output)?;
    let _ = std::fs::remove_dir_all(&dir);
    done()
}

fn torch_hook_throws_through_cxx() -> Outcome {
    let Some(lib) = library_dir() else {
        return ignored("librmm_capi.a is not beside this test binary (not a cargo build tree)");
    };
    let dir = scratch("cxx");
    let exe = dir.join("test_torch_shim");
    let args = vec![
        "-std=c++17".to_owned(),
        "-Wall".to_owned(),
        "-Wextra".to_owned(),
        "-Werror".to_owned(),
        include_flag(),
        lib.join("librmm_capi.a").display().to_string(),
        "-ldl".to_owned(),
        "-lpthread".to_owned(),
        "-lm".to_owned(),
    ];
    let source = crate_dir().join("tests/c/test_torch_shim.cpp");
    if let Some(why) = compile(&env_or("CXX", "c++"), &source, &exe, &args)? {
        return ignored(why);
    }
    let output = Command::new(&exe).output()?;
    ensure_program_passed("test_torch_shim", &output)?;
    let _ = std::fs::remove_dir_all(&dir);
    done()
}

/// Every function of the header, by name, from the shared library (what PyTorch's
/// `CUDAPluggableAllocator` and ctypes do with `dlsym`).
fn shared_library_exports_the_header() -> Outcome {
    let Some(lib) = library_dir() else {
        return ignored("librmm_capi.so is not beside this test binary (not a cargo build tree)");
    };
    let header = std::fs::read_to_string(crate_dir().join("include/rmm_rs.h"))?;
    let mut names: Vec<&str> = header
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("rmm_rs_") && header.contains(&format!("{w}(")))
        .collect();
    names.sort_unstable();
    names.dedup();
    // SAFETY: loading runs no initializer of ours beyond Rust's (none) and the C++ shim's
    // (none); the library stays loaded for the rest of the process.
    let library = unsafe { libloading::Library::new(lib.join("librmm_capi.so")) }?;
    let mut found = 0;
    for name in &names {
        // SAFETY: the symbol is only looked up, never called.
        let symbol: Result<libloading::Symbol<'_, *const ()>, _> =
            unsafe { library.get(name.as_bytes()) };
        symbol.map_err(|e| format!("{name} is not exported: {e}"))?;
        found += 1;
    }
    if found < 14 || !names.contains(&"rmm_rs_torch_alloc") {
        return Err(format!("found only {names:?} in the header").into());
    }
    std::mem::forget(library);
    done()
}

fn python_ctypes_layer() -> Outcome {
    let Some(lib) = library_dir() else {
        return ignored("librmm_capi.so is not beside this test binary (not a cargo build tree)");
    };
    let script = crate_dir().join("../../python/tests/test_ctypes.py");
    let output = match Command::new(env_or("PYTHON", "python3"))
        .arg(&script)
        .arg(lib.join("librmm_capi.so"))
        .output()
    {
        Ok(o) => o,
        Err(e) => return ignored(format!("no python3: {e}")),
    };
    ensure_program_passed("test_ctypes", &output)?;
    done()
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::ignorable_test("c_program_with_the_static_library", || c_program(false)),
        Trial::ignorable_test("c_program_with_the_shared_library", || c_program(true)),
        Trial::ignorable_test(
            "torch_hook_throws_through_cxx",
            torch_hook_throws_through_cxx,
        ),
        Trial::ignorable_test(
            "shared_library_exports_the_header",
            shared_library_exports_the_header,
        ),
        Trial::ignorable_test("python_ctypes_layer", python_ctypes_layer),
    ];
    libtest_mimic::run(&args, trials).exit();
}
