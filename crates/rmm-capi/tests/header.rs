//! The C header is hand-written; this test holds it to the library: every function it
//! declares is a `#[no_mangle] extern "C"` function of `src/` with the same signature (and the
//! other way round), every `#define` constant has a Rust `const` of the same value, and the
//! structs have the same fields in the same order with the same types.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The files compared, embedded at compile time so that the test binary also runs where the
/// sources are not (the GPU bundle).
const HEADER: &str = include_str!("../include/rmm_rs.h");
const SHIM: &str = include_str!("../shim/torch_shim.cpp");
const SOURCES: &[(&str, &str)] = &[
    ("abi.rs", include_str!("../src/abi.rs")),
    ("config.rs", include_str!("../src/config.rs")),
    ("exit.rs", include_str!("../src/exit.rs")),
    ("ffi.rs", include_str!("../src/ffi.rs")),
    ("last_error.rs", include_str!("../src/last_error.rs")),
    ("lib.rs", include_str!("../src/lib.rs")),
    ("registry.rs", include_str!("../src/registry.rs")),
    ("stack.rs", include_str!("../src/stack.rs")),
    ("status.rs", include_str!("../src/status.rs")),
    ("test_support.rs", include_str!("../src/test_support.rs")),
    ("testing.rs", include_str!("../src/testing.rs")),
    ("torch.rs", include_str!("../src/torch.rs")),
];

/// The Rust sources of the crate, concatenated.
fn rust_sources() -> String {
    SOURCES
        .iter()
        .map(|(_, text)| *text)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_source_file_is_compared() {
    // Where the sources are (a checkout), a new file of src/ must join SOURCES.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let Ok(entries) = fs::read_dir(&dir) else {
        return;
    };
    let mut on_disk: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    on_disk.sort();
    let listed: Vec<String> = SOURCES.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(on_disk, listed, "add the new file of src/ to SOURCES");
}

/// The header without comments and preprocessor lines (but `#define`s, returned apart).
fn header_parts() -> (String, Vec<(String, String)>) {
    let mut code = String::new();
    let mut rest = HEADER;
    while let Some(start) = rest.find("/*") {
        code.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("unterminated comment") + start + 2;
        rest = &rest[end..];
    }
    code.push_str(rest);
    let mut defines = Vec::new();
    let mut body = String::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default().trim();
        if let Some(define) = line.strip_prefix("#define ") {
            let mut words = define.split_whitespace();
            let name = words.next().unwrap().to_owned();
            let value: Vec<&str> = words.collect();
            if !value.is_empty() {
                defines.push((name, value.join(" ")));
            }
        } else if !line.starts_with('#') {
            body.push_str(line);
            body.push('\n');
        }
    }
    (body, defines)
}

/// `const char *x` → ("const char*", "x"); spacing normalized.
fn c_decl(decl: &str) -> (String, String) {
    let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
    let split = decl
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .expect("a declaration has a type");
    let name = decl[split + 1..].to_owned();
    let ty = decl[..=split].replace(" *", "*").replace("* ", "*");
    (ty.trim().to_owned(), name)
}

/// Name → "ret(param types)" of every `rmm_rs_*` function the header declares.
fn header_functions(body: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in body.split(';') {
        let s = statement.trim();
        if s.contains("typedef") || s.contains('{') || s.contains('}') || !s.contains('(') {
            continue;
        }
        let s = s.trim_start_matches("extern \"C\"").trim();
        let open = s.find('(').unwrap();
        let (ret, name) = c_decl(&s[..open]);
        let params = s[open + 1..s.rfind(')').unwrap()].trim();
        let types: Vec<String> = if params == "void" {
            Vec::new()
        } else {
            params.split(',').map(|p| c_decl(p).0).collect()
        };
        out.insert(name, format!("{ret}({})", types.join(", ")));
    }
    out
}

/// The C spelling of a Rust FFI type.
fn c_type(rust: &str) -> String {
    let rust = rust.split_whitespace().collect::<Vec<_>>().join(" ");
    let pointee = |p: &str| c_type(p);
    if let Some(p) = rust.strip_prefix("*mut ") {
        return format!("{}*", pointee(p));
    }
    if let Some(p) = rust.strip_prefix("*const ") {
        return format!("const {}*", pointee(p));
    }
    match rust.as_str() {
        "" | "()" => "void",
        "c_void" => "void",
        "c_char" => "char",
        "c_int" => "int",
        "isize" => "ssize_t",
        "usize" => "size_t",
        "u32" => "uint32_t",
        "i32" => "int32_t",
        "u64" => "uint64_t",
        "i64" => "int64_t",
        "RmmRsOptions" => "rmm_rs_options",
        "RmmRsStatistics" => "rmm_rs_statistics",
        other => panic!("no C spelling for the Rust type `{other}`: add it to c_type"),
    }
    .to_owned()
}

/// Name → "ret(param types)" of every `#[no_mangle]` function of the Rust sources.
fn rust_exports(src: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(at) = rest.find("#[no_mangle]") {
        rest = &rest[at + "#[no_mangle]".len()..];
        let sig_end = rest.find('{').unwrap();
        let sig = &rest[..sig_end];
        assert!(
            sig.contains("extern \"C\"") || sig.contains("extern \"C-unwind\""),
            "#[no_mangle] fn without a C ABI: {sig}"
        );
        let fn_at = sig.find("fn ").unwrap() + 3;
        let open = sig[fn_at..].find('(').unwrap() + fn_at;
        let close = sig.rfind(')').unwrap();
        let name = sig[fn_at..open].trim().to_owned();
        let params: Vec<String> = sig[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| c_type(p.split_once(':').unwrap().1.trim()))
            .collect();
        let ret = sig[close + 1..]
            .trim()
            .strip_prefix("->")
            .map_or_else(|| "void".to_owned(), |r| c_type(r.trim()));
        out.insert(name, format!("{ret}({})", params.join(", ")));
    }
    out
}

#[test]
fn every_function_matches_its_export() {
    let (body, _) = header_parts();
    let header = header_functions(&body);
    let rust = rust_exports(&rust_sources());
    assert!(header.len() >= 10, "found only {header:?}");
    for (name, sig) in &header {
        assert_eq!(
            rust.get(name),
            Some(sig),
            "{name}: the header says {sig}, src/ says {:?}",
            rust.get(name)
        );
    }
    for name in rust.keys() {
        assert!(
            header.contains_key(name),
            "{name} is exported but not in the header"
        );
    }
}

#[test]
fn every_constant_has_the_same_value() {
    let (_, defines) = header_parts();
    let src = rust_sources();
    let mut checked = 0;
    for (name, value) in &defines {
        let decl = format!("pub const {name}: ");
        let at = src
            .find(&decl)
            .unwrap_or_else(|| panic!("{name} has no `pub const` in src/"));
        let rust_value = src[at + decl.len()..].split(';').next().unwrap();
        let rust_value = rust_value.split_once('=').unwrap().1.trim();
        let c_value = match value.as_str() {
            "UINT64_MAX" => "u64::MAX",
            // A stream handle: `((void *)0x1)` is the `usize` 0x1.
            v => v
                .strip_prefix("((void *)")
                .and_then(|v| v.strip_suffix(')'))
                .unwrap_or(v),
        };
        assert_eq!(rust_value, c_value, "{name}");
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} constants");
}

#[test]
fn structs_have_the_same_fields() {
    let (body, _) = header_parts();
    let src = rust_sources();
    for (c_name, rust_name) in [
        ("rmm_rs_options", "RmmRsOptions"),
        ("rmm_rs_statistics", "RmmRsStatistics"),
    ] {
        let open = body
            .find(&format!("typedef struct {c_name} {{"))
            .unwrap_or_else(|| panic!("no struct {c_name} in the header"));
        let fields_c: Vec<(String, String)> = body[open..]
            .split_once('{')
            .unwrap()
            .1
            .split('}')
            .next()
            .unwrap()
            .split(';')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (ty, name) = c_decl(f);
                (name, ty)
            })
            .collect();
        let at = src
            .find(&format!("pub struct {rust_name} {{"))
            .unwrap_or_else(|| panic!("no struct {rust_name} in src/"));
        let block = src[at..]
            .split_once('{')
            .unwrap()
            .1
            .split('}')
            .next()
            .unwrap();
        let fields_rust: Vec<(String, String)> = block
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("pub "))
            .map(|l| {
                let (name, ty) = l.trim_end_matches(',').split_once(':').unwrap();
                (name.trim().to_owned(), c_type(ty.trim()))
            })
            .collect();
        assert_eq!(fields_c, fields_rust, "{c_name} vs {rust_name}");
        let before = &src[..at];
        assert!(
            before
                .trim_end()
                .lines()
                .rev()
                .take(3)
                .any(|l| l.contains("#[repr(C)]")),
            "{rust_name} is not #[repr(C)]"
        );
    }
}

#[test]
fn the_shim_throws_out_of_memory_for_the_headers_code() {
    let (_, defines) = header_parts();
    let oom = &defines
        .iter()
        .find(|(n, _)| n == "RMM_RS_ERROR_OUT_OF_MEMORY")
        .unwrap()
        .1;
    let shim = SHIM;
    assert!(
        shim.contains(&format!("static const int out_of_memory_code = {oom};")),
        "shim/torch_shim.cpp's out_of_memory_code is not {oom}"
    );
    assert!(shim
        .contains("extern \"C\" [[noreturn]] void rmm_rs_cxx_throw(int code, const char *what)"));
    assert!(rust_sources().contains("fn rmm_rs_cxx_throw(code: c_int, what: *const c_char) -> !;"));
}
