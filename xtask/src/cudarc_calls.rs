//! The workspace check `cudarc_calls` (a test, so it runs in CI's `test` step): every cudarc
//! item the workspace's Rust code names, against a list of the allowed ones with the reason
//! each is allowed.
//!
//! cudarc declares every driver entry point as returning its `CUresult` Rust enum; a code the
//! enum lacks (a driver newer than the bindings) is undefined behaviour as the call returns.
//! rmm-sys therefore calls the driver through its own entry points with integer results, and
//! every other crate goes through rmm-sys. This check finds, in every `.rs` file of the
//! workspace (comments left out):
//!
//! - each path that starts with `cudarc::` (the groups of `use` statements expanded);
//! - each call of a driver function by path, `<module>::cu<Name>(`, whatever the module is
//!   called locally (cudarc's `sys` functions; rmm-sys calls its own table as
//!   `(api.cu<Name>)(`, which is no path);
//! - each call of an associated function of a type imported from cudarc, `<Type>::<fn>(`
//!   (`CudaContext::new`).
//!
//! Types and enum *inputs* of `cudarc::driver::sys` (handles, attribute enums: never a
//! result) need no entry. Everything else must be listed in [`ALLOWED`] for its file with a
//! reason, and every entry must still be found (no stale entries). The check sees names, not
//! method calls: an entry for a type vouches for the methods its file calls on it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The folders scanned, from the workspace root (`fuzz/` is a workspace of its own and names
/// no cudarc item).
const ROOTS: &[&str] = &["crates", "benches", "checks", "xtask"];

/// This file, which names cudarc items in its list: not scanned.
const SELF: &str = "xtask/src/cudarc_calls.rs";

/// `(file, item, reason)`: the cudarc items a file may name.
const ALLOWED: &[(&str, &str, &str)] = &[
    // The interop itself (feature `cudarc`).
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::CudaContext",
        "the context every cudarc stream holds; its methods called here (`wrap_borrowed_stream`, \
         `default_stream`, `ordinal`) make no driver call",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "CudaContext::new",
        "isolated: cudarc's only constructor of the context; every driver call it makes is made \
         first through rmm-sys (`preflight`), and cudarc is called only when all succeeded",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::DriverError",
        "the error type of `CudaContext::new` (above), mapped to its integer code",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::CudaStream",
        "a type; its methods called here (`cu_stream`, `context`) read fields",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::SyncOnDrop",
        "isolated: the guard cudarc's `DevicePtr` traits must return; cudarc synchronizes at its \
         drop, inside cudarc's own copy or launch that has just called the driver the same way",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::DevicePtr",
        "a trait implemented here; no driver call",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::DevicePtrMut",
        "a trait implemented here; no driver call",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::DeviceSlice",
        "a trait implemented here; no driver call",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::PushKernelArg",
        "a trait implemented here; `LaunchArgs::arg` only stores a pointer",
    ),
    (
        "crates/rmm-containers/src/interop/cudarc.rs",
        "cudarc::driver::LaunchArgs",
        "the launch builder the kernel-argument trait is implemented for; no driver call here",
    ),
    (
        "crates/rmm-containers/src/stream.rs",
        "cudarc::driver::CudaStream",
        "a type held by a buffer stream; `cu_stream` reads a field",
    ),
    (
        "crates/rmm-containers/src/uvector.rs",
        "cudarc::driver::CudaStream",
        "the type of the vector's cached cudarc stream; no call",
    ),
    // Tests and the example of the interop: cudarc's own API used on rmm-rs types, which is
    // what they exist to show; their results are cudarc's by design.
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "cudarc::driver::DeviceSlice",
        "a test of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "cudarc::driver::LaunchConfig",
        "a test of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "cudarc::driver::PushKernelArg",
        "a test of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "cudarc::nvrtc::Ptx::from_src",
        "a test of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "DeviceSlice::stream",
        "a test of cudarc's own API on rmm-rs types (rmm-rs's implementation of the trait)",
    ),
    (
        "crates/rmm-containers/tests/gpu_containers.rs",
        "LaunchConfig::for_num_elems",
        "a test of cudarc's own API on rmm-rs types (a computation, no driver call)",
    ),
    (
        "crates/rmm-containers/examples/cudarc_kernel.rs",
        "cudarc::driver::LaunchConfig",
        "an example of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/examples/cudarc_kernel.rs",
        "cudarc::driver::PushKernelArg",
        "an example of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/examples/cudarc_kernel.rs",
        "cudarc::nvrtc::Ptx",
        "an example of cudarc's own API on rmm-rs types",
    ),
    (
        "crates/rmm-containers/examples/cudarc_kernel.rs",
        "Ptx::from_src",
        "an example of cudarc's own API on rmm-rs types (wraps a string, no driver call)",
    ),
    (
        "crates/rmm-containers/examples/cudarc_kernel.rs",
        "LaunchConfig::for_num_elems",
        "an example of cudarc's own API on rmm-rs types (a computation, no driver call)",
    ),
];

/// Whether `item` needs no entry: `cudarc::driver::sys` itself, or a type or enum of it (not a
/// function, `cu<Upper>...`).
fn needs_no_entry(item: &str) -> bool {
    if item == "cudarc::driver::sys" {
        return true;
    }
    match item.strip_prefix("cudarc::driver::sys::") {
        Some(rest) => !rest.split("::").any(is_driver_function),
        None => false,
    }
}

/// `cu` followed by an upper-case letter: a driver entry point's name.
fn is_driver_function(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 2 && b[0] == b'c' && b[1] == b'u' && b[2].is_ascii_uppercase()
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `src` without its comments (`//` to the end of the line, `/* ... */`) and with its string
/// literals emptied (`"..."`, `r"..."`, `r#"..."#`; a trial named `interop::cudarc::Copies`
/// names no item). Character literals are kept: `'"'` would open a string, which no file
/// scanned writes.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        let prev = out.bytes().last().unwrap_or(b' ');
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else if let (false, Some(after)) = (is_ident_byte(prev), rest.strip_prefix('r')) {
            let hashes = after.len() - after.trim_start_matches('#').len();
            match after[hashes..].strip_prefix('"') {
                Some(body) => {
                    let close = format!("\"{}", "#".repeat(hashes));
                    rest = body.find(&close).map_or("", |i| &body[i + close.len()..]);
                    out.push_str("\"\"");
                }
                None => {
                    out.push('r');
                    rest = after;
                }
            }
        } else if let Some(body) = rest.strip_prefix('"') {
            let mut end = body.len();
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = i;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            rest = body.get(end + 1..).unwrap_or("");
            out.push_str("\"\"");
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Expands a `use` tree (`a::b::{c, d::{e as f}}`) into `(path, local name)` pairs.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<(String, String)>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim())),
        None => (tree, None),
    };
    let full = if path == "self" {
        prefix.to_owned()
    } else {
        join(prefix, path)
    };
    let local = alias
        .map(str::to_owned)
        .unwrap_or_else(|| full.rsplit("::").next().unwrap_or("").to_owned());
    out.push((full, local));
}

fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}::{path}"),
    }
}

/// The identifier starting at byte `at` of `s`.
fn ident_at(s: &str, at: usize) -> &str {
    let end = s[at..]
        .bytes()
        .position(|b| !is_ident_byte(b))
        .map_or(s.len(), |n| at + n);
    &s[at..end]
}

/// Whether the first non-blank character at or after byte `at` of `s` is `(`.
fn called_at(s: &str, at: usize) -> bool {
    s[at..].trim_start().starts_with('(')
}

/// The cudarc items `src` names (see the [module documentation](self)).
fn items(src: &str) -> BTreeSet<String> {
    let code = strip_comments(src);
    let mut found = BTreeSet::new();
    let mut imported: Vec<String> = Vec::new();
    // `use` statements of cudarc paths, expanded; the rest of the code, for inline paths.
    let mut rest_of_code = String::with_capacity(code.len());
    let mut pos = 0;
    while let Some(i) = code[pos..].find("use cudarc::") {
        let start = pos + i;
        let preceded_by_ident = start > 0 && is_ident_byte(code.as_bytes()[start - 1]);
        let end = code[start..].find(';').map_or(code.len(), |n| start + n);
        rest_of_code.push_str(&code[pos..start]);
        if preceded_by_ident {
            rest_of_code.push_str(&code[start..end]);
        } else {
            let mut pairs = Vec::new();
            expand_use(&code[start + "use ".len()..end], "", &mut pairs);
            for (path, local) in pairs {
                found.insert(path);
                imported.push(local);
            }
        }
        pos = end;
    }
    rest_of_code.push_str(&code[pos..]);
    let code = rest_of_code;
    let bytes = code.as_bytes();
    // Inline `cudarc::...` paths.
    let mut pos = 0;
    while let Some(i) = code[pos..].find("cudarc::") {
        let start = pos + i;
        pos = start + "cudarc::".len();
        // Not a part of a longer name or path (`self::cudarc::`: a local module).
        if start > 0 && (is_ident_byte(bytes[start - 1]) || bytes[start - 1] == b':') {
            continue;
        }
        let mut end = pos;
        while end < bytes.len() && (is_ident_byte(bytes[end]) || bytes[end] == b':') {
            end += 1;
        }
        let path = code[start..end].trim_end_matches(':');
        found.insert(path.to_owned());
        pos = end;
    }
    // Driver functions called by path, and associated functions of cudarc types.
    let mut pos = 0;
    while let Some(i) = code[pos..].find("::") {
        let sep = pos + i;
        pos = sep + 2;
        let name = ident_at(&code, pos);
        if name.is_empty() || !called_at(&code, pos + name.len()) {
            continue;
        }
        if is_driver_function(name) {
            found.insert(format!("call {name}"));
            continue;
        }
        let mut start = sep;
        while start > 0 && is_ident_byte(bytes[start - 1]) {
            start -= 1;
        }
        let owner = &code[start..sep];
        let first = owner.bytes().next().unwrap_or(b'a');
        // `Type::function(`, not `Enum::Variant(`.
        let is_function = name.bytes().next().is_some_and(|b| !b.is_ascii_uppercase());
        if first.is_ascii_uppercase() && is_function && imported.iter().any(|l| l == owner) {
            found.insert(format!("{owner}::{name}"));
        }
    }
    found
}

/// The `.rs` files under `dir`, `target` folders left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(file, item)` for every cudarc item the workspace names that needs an entry, files
/// relative to `root` with `/` separators.
fn workspace_items(root: &Path) -> BTreeSet<(String, String)> {
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    let mut all = BTreeSet::new();
    for file in files {
        let rel = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        if rel == SELF {
            continue;
        }
        let Ok(src) = std::fs::read_to_string(&file) else {
            continue;
        };
        for item in items(&src) {
            if !needs_no_entry(&item) {
                all.insert((rel.clone(), item));
            }
        }
    }
    all
}

/// The findings against [`ALLOWED`]: items without an entry, and entries not found.
fn check(found: &BTreeSet<(String, String)>) -> Vec<String> {
    let allowed: BTreeSet<(String, String)> = ALLOWED
        .iter()
        .map(|(f, i, _)| ((*f).to_owned(), (*i).to_owned()))
        .collect();
    let mut problems = Vec::new();
    for (file, item) in found.difference(&allowed) {
        problems.push(format!(
            "{file}: names `{item}`, whose driver calls return cudarc's `CUresult` enum: go \
             through rmm-sys's entry points (integer results), or list it in ALLOWED in {SELF} \
             with the reason it cannot"
        ));
    }
    for (file, item) in allowed.difference(found) {
        problems.push(format!(
            "{file}: `{item}` is listed in ALLOWED in {SELF} but no longer named there: remove the entry"
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cargo::repo_root;

    #[test]
    fn the_workspace_names_only_the_allowed_cudarc_items() {
        let found = workspace_items(&repo_root());
        for (file, item) in &found {
            println!("{file}: {item}");
        }
        let problems = check(&found);
        assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    }

    #[test]
    fn use_groups_inline_paths_and_calls_are_found() {
        let src = r#"
            use cudarc::driver::{sys::{self, CUdeviceptr}, CudaContext, result as r};
            // use cudarc::driver::result::ignored_in_a_comment;
            use cudarc::driver::sys as ffi;
            fn f() {
                let _ = cudarc::driver::result::module::load_data(p);
                let _ = ffi::cuMemRangeGetAttribute(a, b);
                let _ = unsafe { (api.cuMemAlloc_v2)(&mut p, 1) };
                let _ = CudaContext::new(0);
                let _ = Vec::new();
                let t: cudarc::driver::sys::CUstream = x;
            }
        "#;
        let found: Vec<String> = items(src).into_iter().collect();
        assert_eq!(
            found,
            [
                "CudaContext::new",
                "call cuMemRangeGetAttribute",
                "cudarc::driver::CudaContext",
                "cudarc::driver::result",
                "cudarc::driver::result::module::load_data",
                "cudarc::driver::sys",
                "cudarc::driver::sys::CUdeviceptr",
                "cudarc::driver::sys::CUstream",
            ]
        );
        let needing: Vec<&String> = found.iter().filter(|i| !needs_no_entry(i)).collect();
        assert_eq!(
            needing,
            [
                "CudaContext::new",
                "call cuMemRangeGetAttribute",
                "cudarc::driver::CudaContext",
                "cudarc::driver::result",
                "cudarc::driver::result::module::load_data",
            ]
        );
    }

    #[test]
    fn unlisted_items_and_stale_entries_are_reported() {
        let mut found = BTreeSet::new();
        found.insert((
            "benches/src/gpu.rs".to_owned(),
            "call cuLaunchKernel".to_owned(),
        ));
        let problems = check(&found);
        assert!(problems[0].contains("benches/src/gpu.rs: names `call cuLaunchKernel`"));
        // Every entry of ALLOWED is missing from this set: each is reported stale.
        assert_eq!(problems.len(), 1 + ALLOWED.len());
    }
}
