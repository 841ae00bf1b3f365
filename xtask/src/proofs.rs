//! The `proofs` step of `cargo xtask ci`: what the proofs cover, held to the source without
//! running them (CI stays on stable; `cargo xtask miri` and `cargo xtask loom` run them).
//!
//! - **Miri.** Every module of a library crate ([`LIBRARY_CRATES`]) whose source holds the
//!   `unsafe` keyword (a block, a function, an impl, a trait) is run by a suite of
//!   [`miri::SUITES`] or left out in [`miri::EXCLUDED`] with its reason. A suite filter or an
//!   exclusion that names no module, an exclusion of a module without `unsafe` and a module both
//!   run and excluded are errors too, so the lists cannot go stale.
//! - **Loom.** The table of docs/internals/loom.md ([`LOOM_TABLE_HEADER`]) names every
//!   `loom_tests` module of rmm-mr, and only those, and each model it lists is a string literal
//!   of that module's source (the name the model prints).
//!
//! The modules are found as the compiler finds them: from `src/lib.rs`, following every `mod`
//! declaration (`#[path]` included) whatever its `cfg`; comments, strings and character literals
//! are skipped, so a comment that says "unsafe" is not code.

use crate::cargo::{self, Error};
use crate::miri;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose modules the Miri rule covers: (package, folder). Every folder of `crates/`
/// must be here, so that a new crate is not left out silently.
pub(crate) const LIBRARY_CRATES: &[(&str, &str)] = &[
    ("rmm-sys", "crates/rmm-sys"),
    ("rmm-stream", "crates/rmm-stream"),
    ("rmm-mr", "crates/rmm-mr"),
    ("rmm-containers", "crates/rmm-containers"),
    ("rmm-rs", "crates/rmm"),
    ("rmm-replay", "crates/rmm-replay"),
    ("rmm-capi", "crates/rmm-capi"),
];

/// The page that lists the loom models, from the workspace root.
pub(crate) const LOOM_DOC: &str = "docs/internals/loom.md";

/// The header row of its checked table.
pub(crate) const LOOM_TABLE_HEADER: &str = "| protocol | code | `loom_tests` module | models |";

/// The package whose `loom_tests` modules the table lists.
const LOOM_PACKAGE: &str = "rmm-mr";

/// A token of Rust source, as much as the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// An identifier or keyword.
    Ident(String),
    /// The text between the quotes of a string literal (escapes left as written).
    Str(String),
    /// Any other character outside comments and literals.
    Punct(char),
}

/// The string literal starting at `s[i]` (`"..."`, `b"..."`, `c"..."`, `r#"..."#`, `br"..."`),
/// as its text and the index after it.
fn string_at(s: &[char], i: usize) -> Option<(String, usize)> {
    let mut j = i;
    if matches!(s.get(j), Some('b' | 'c')) {
        j += 1;
    }
    let raw = s.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && s.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if s.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    let start = j;
    while j < s.len() {
        if raw {
            if s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')) {
                return Some((s[start..j].iter().collect(), j + 1 + hashes));
            }
        } else if s[j] == '\\' {
            j += 1;
        } else if s[j] == '"' {
            return Some((s[start..j].iter().collect(), j + 1));
        }
        j += 1;
    }
    Some((s[start..].iter().collect(), s.len()))
}

/// The tokens of `src`, without comments (doc comments included), whitespace, numbers and
/// character literals.
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let s: Vec<char> = src.chars().collect();
    let at = |j: usize| s.get(j).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 1;
            i += 2;
            while i < s.len() && depth > 0 {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                } else {
                    i += 1;
                }
            }
        } else if let Some((text, next)) = string_at(&s, i) {
            out.push(Token::Str(text));
            i = next;
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped character literal: up to its closing quote.
                i += 3;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or a label: its name lexes as an identifier.
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(s[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// What the scan knows of one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Module {
    /// The file that holds it, from the crate's folder (`src/pool/resource.rs`).
    pub(crate) file: String,
    /// Whether it is an inline module (`mod tests { ... }`) of that file.
    pub(crate) inline: bool,
    /// Uses of the `unsafe` keyword in the file, inline modules included (0 for an inline
    /// module: they count for the file's module).
    pub(crate) unsafe_uses: usize,
    /// The string literals of the file (for a file module).
    pub(crate) strings: BTreeSet<String>,
}

/// The modules of one crate by path (`""` for the crate root, `pool::resource`).
pub(crate) type Modules = BTreeMap<String, Module>;

pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}::{name}")
    }
}

/// The file of the module `name` declared by `mod name;` in `file`, looked up in `dir`:
/// `dir/name.rs`, else `dir/name/mod.rs` (then `true`).
pub(crate) fn child_file(
    read: &dyn Fn(&str) -> Option<String>,
    file: &str,
    dir: &str,
    name: &str,
) -> Result<(String, bool), Error> {
    let flat = format!("{dir}/{name}.rs");
    let nested = format!("{dir}/{name}/mod.rs");
    if read(&flat).is_some() {
        Ok((flat, false))
    } else if read(&nested).is_some() {
        Ok((nested, true))
    } else {
        Err(format!(
            "{file}: `mod {name};` has neither {flat} nor {nested}"
        ))
    }
}

/// The files of a crate, read through `read` (a path from the crate's folder to its text).
struct Scan<'a> {
    read: &'a dyn Fn(&str) -> Option<String>,
    modules: Modules,
}

impl Scan<'_> {
    /// Scans `file` as module `module`, whose `mod x;` children are looked up in `child_dir`
    /// and whose `#[path]` attributes are relative to `file_dir`.
    fn visit(
        &mut self,
        file: &str,
        module: &str,
        child_dir: &str,
        file_dir: &str,
    ) -> Result<(), Error> {
        let text = (self.read)(file).ok_or_else(|| format!("{file}: cannot be read"))?;
        let tokens = lex(&text);
        let mut unsafe_uses = 0;
        let mut strings = BTreeSet::new();
        // The inline modules open around the current token: (name, brace depth outside it).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut path_attr: Option<String> = None;
        let mut children = Vec::new();
        let mut k = 0;
        while k < tokens.len() {
            match &tokens[k] {
                Token::Ident(w) if w == "unsafe" => unsafe_uses += 1,
                Token::Str(s) => {
                    strings.insert(s.clone());
                }
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|&(_, d)| d == depth) {
                        inline.pop();
                    }
                }
                Token::Punct('#') => {
                    if let [Token::Punct('['), Token::Ident(p), Token::Punct('='), Token::Str(to), Token::Punct(']'), ..] =
                        &tokens[k + 1..]
                    {
                        if p == "path" {
                            path_attr = Some(to.clone());
                            k += 6;
                            continue;
                        }
                    }
                }
                Token::Ident(w) if w == "mod" => {
                    if let Some(Token::Ident(name)) = tokens.get(k + 1) {
                        let mut parent = module.to_owned();
                        let mut dir = child_dir.to_owned();
                        for (outer, _) in &inline {
                            parent = join(&parent, outer);
                            dir = format!("{dir}/{outer}");
                        }
                        let path = join(&parent, name);
                        match tokens.get(k + 2) {
                            Some(Token::Punct(';')) => {
                                let attr = path_attr.take();
                                children.push((path, name.clone(), dir, attr));
                            }
                            Some(Token::Punct('{')) => {
                                path_attr = None;
                                self.modules.insert(
                                    path,
                                    Module {
                                        file: file.to_owned(),
                                        inline: true,
                                        unsafe_uses: 0,
                                        strings: BTreeSet::new(),
                                    },
                                );
                                inline.push((name.clone(), depth));
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            k += 1;
        }
        self.modules.insert(
            module.to_owned(),
            Module {
                file: file.to_owned(),
                inline: false,
                unsafe_uses,
                strings,
            },
        );
        for (path, name, dir, attr) in children {
            match attr {
                // A `#[path]` file: its own children are looked up beside it (mod-rs style).
                Some(rel) => {
                    let child = format!("{file_dir}/{rel}");
                    let child_dir = child.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
                    self.visit(&child, &path, &child_dir, &child_dir)?;
                }
                None => {
                    let (child, nested) = child_file(self.read, file, &dir, &name)?;
                    let sub = format!("{dir}/{name}");
                    let file_dir = if nested { &sub } else { &dir };
                    self.visit(&child, &path, &sub, file_dir)?;
                }
            }
        }
        Ok(())
    }
}

/// The modules of the crate whose files `read` gives (paths from the crate's folder), from
/// `src/lib.rs`.
pub(crate) fn scan_crate(read: &dyn Fn(&str) -> Option<String>) -> Result<Modules, Error> {
    let mut scan = Scan {
        read,
        modules: BTreeMap::new(),
    };
    scan.visit("src/lib.rs", "", "src", "src")?;
    Ok(scan.modules)
}

/// Whether the module named by filter `filter` (`pool::free_list::`) runs the tests of the file
/// module `module`: it is the module, an ancestor, or an inline module of its file.
fn filter_covers(modules: &Modules, filter: &str, module: &str) -> bool {
    let named = filter.trim_end_matches("::");
    if named == module || module.starts_with(&format!("{named}::")) {
        return true;
    }
    let inside = module.is_empty() || named.starts_with(&format!("{module}::"));
    inside
        && match (modules.get(named), modules.get(module)) {
            (Some(n), Some(m)) => n.inline && n.file == m.file,
            _ => false,
        }
}

/// The problems of the Miri lists against the scanned crates (package -> modules): modules with
/// `unsafe` that no suite runs and no exclusion names, and stale entries.
pub(crate) fn check_miri(
    crates: &BTreeMap<String, Modules>,
    suites: &[(&str, &[&str])],
    excluded: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut problems = Vec::new();
    const LISTS: &str = "xtask/src/miri.rs";
    for (package, filters) in suites {
        let Some(modules) = crates.get(*package) else {
            problems.push(format!(
                "{LISTS}: SUITES names the package `{package}`, which is not a library crate"
            ));
            continue;
        };
        for filter in *filters {
            let named = filter.trim_end_matches("::");
            if !filter.ends_with("::") || named.is_empty() {
                problems.push(format!(
                    "{LISTS}: the {package} suite filter `{filter}` is not a module path \
                     ending in `::`"
                ));
            } else if !modules.contains_key(named) {
                problems.push(format!(
                    "{LISTS}: the {package} suite filter `{filter}` names no module (stale: \
                     remove or rename it)"
                ));
            }
        }
    }
    let covered = |package: &str, module: &str| {
        let modules = &crates[package];
        suites
            .iter()
            .filter(|(p, _)| *p == package)
            .flat_map(|(_, filters)| filters.iter())
            .any(|f| filter_covers(modules, f, module))
    };
    let mut seen = BTreeSet::new();
    for (package, module, reason) in excluded {
        let shown = if module.is_empty() { "(root)" } else { module };
        if !seen.insert((*package, *module)) {
            problems.push(format!("{LISTS}: EXCLUDED names {package} `{shown}` twice"));
        }
        match crates.get(*package).and_then(|m| m.get(*module)) {
            None => problems.push(format!(
                "{LISTS}: EXCLUDED names {package} `{shown}`, which is no module (stale: remove \
                 or rename it)"
            )),
            Some(m) if m.inline => problems.push(format!(
                "{LISTS}: EXCLUDED names {package} `{shown}`, an inline module: exclude the \
                 module of its file"
            )),
            Some(m) if m.unsafe_uses == 0 => problems.push(format!(
                "{LISTS}: EXCLUDED names {package} `{shown}`, which has no unsafe code (stale: \
                 remove it)"
            )),
            Some(_) if covered(package, module) => problems.push(format!(
                "{LISTS}: {package} `{shown}` is both run by a Miri suite and in EXCLUDED"
            )),
            Some(_) if reason.trim().is_empty() => problems.push(format!(
                "{LISTS}: EXCLUDED gives no reason for {package} `{shown}`"
            )),
            Some(_) => {}
        }
    }
    for (package, modules) in crates {
        for (path, m) in modules {
            if m.inline || m.unsafe_uses == 0 || covered(package, path) {
                continue;
            }
            if excluded.iter().any(|(p, e, _)| p == package && e == path) {
                continue;
            }
            let shown = if path.is_empty() { "(root)" } else { path };
            problems.push(format!(
                "{package}: module `{shown}` ({}) has unsafe code ({} use(s)) that no Miri \
                 suite runs: add `{shown}::` to SUITES in {LISTS} (its tests make no driver \
                 call), or add it to EXCLUDED there with the reason Miri cannot run it",
                m.file, m.unsafe_uses
            ));
        }
    }
    problems
}

/// One row of the loom table: the `loom_tests` module and the models named.
#[derive(Debug, PartialEq, Eq)]
struct LoomRow {
    line: usize,
    module: String,
    models: Vec<String>,
}

/// The backticked words of a table cell.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of the table headed by [`LOOM_TABLE_HEADER`] in `doc`.
fn loom_rows(doc: &str) -> Result<Vec<LoomRow>, Error> {
    let mut lines = doc.lines().enumerate();
    lines
        .find(|(_, l)| l.trim() == LOOM_TABLE_HEADER)
        .ok_or_else(|| format!("{LOOM_DOC}: no table headed `{LOOM_TABLE_HEADER}`"))?;
    let mut rows = Vec::new();
    for (i, line) in lines.skip(1) {
        let line = line.trim();
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let (module, models) = match cells.as_slice() {
            [_, _, module, models] => (backticked(module), backticked(models)),
            _ => return Err(format!("{LOOM_DOC}:{}: a row needs 4 cells", i + 1)),
        };
        let [module] = module.as_slice() else {
            return Err(format!(
                "{LOOM_DOC}:{}: the `loom_tests` module cell names one module in backticks",
                i + 1
            ));
        };
        if models.is_empty() {
            return Err(format!("{LOOM_DOC}:{}: a row names no model", i + 1));
        }
        rows.push(LoomRow {
            line: i + 1,
            module: module.clone(),
            models,
        });
    }
    Ok(rows)
}

/// The problems of the loom table (`doc`) against rmm-mr's modules.
pub(crate) fn check_loom(doc: &str, modules: &Modules) -> Vec<String> {
    let rows = match loom_rows(doc) {
        Ok(rows) => rows,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    for row in &rows {
        let at = format!("{LOOM_DOC}:{}", row.line);
        let Some(m) = modules.get(&row.module) else {
            problems.push(format!(
                "{at}: `{}` is no module of {LOOM_PACKAGE} (stale: remove or rename the row)",
                row.module
            ));
            continue;
        };
        if !row.module.ends_with("loom_tests") {
            problems.push(format!(
                "{at}: `{}` is not a `loom_tests` module",
                row.module
            ));
        }
        let strings = modules
            .values()
            .find(|f| !f.inline && f.file == m.file)
            .map(|f| &f.strings);
        for model in &row.models {
            if !strings.is_some_and(|s| s.contains(model)) {
                problems.push(format!(
                    "{at}: the model `{model}` is named nowhere in {} (a model's name is the \
                     string it runs under)",
                    m.file
                ));
            }
        }
    }
    for (path, m) in modules {
        if path.rsplit("::").next() == Some("loom_tests") && !rows.iter().any(|r| &r.module == path)
        {
            problems.push(format!(
                "{LOOM_PACKAGE}: the loom models of `{path}` ({}) have no row in the table of \
                 {LOOM_DOC}",
                m.file
            ));
        }
    }
    problems
}

/// Scans the library crates of the workspace at `root`.
fn scan_workspace(root: &Path) -> Result<BTreeMap<String, Modules>, Error> {
    let mut folders: Vec<String> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("crates/: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| format!("crates/{}", e.file_name().to_string_lossy()))
        .collect();
    folders.sort();
    let mut crates = BTreeMap::new();
    for folder in folders {
        let Some((package, _)) = LIBRARY_CRATES.iter().find(|(_, f)| *f == folder) else {
            return Err(format!(
                "{folder} is not in LIBRARY_CRATES of xtask/src/proofs.rs: add it, so that \
                 the Miri rule covers it"
            ));
        };
        let dir: PathBuf = root.join(&folder);
        let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).ok();
        let modules = scan_crate(&read).map_err(|e| format!("{folder}/{e}"))?;
        crates.insert((*package).to_owned(), modules);
    }
    Ok(crates)
}

/// The `proofs` step: both checks on the workspace, every problem printed.
pub(crate) fn run_ci() -> Result<(), Error> {
    let root = cargo::repo_root();
    let crates = scan_workspace(&root)?;
    let mut problems = check_miri(&crates, miri::SUITES, miri::EXCLUDED);
    let doc =
        std::fs::read_to_string(root.join(LOOM_DOC)).map_err(|e| format!("{LOOM_DOC}: {e}"))?;
    let loom = crates
        .get(LOOM_PACKAGE)
        .ok_or_else(|| format!("no package {LOOM_PACKAGE}"))?;
    problems.extend(check_loom(&doc, loom));
    if problems.is_empty() {
        let with_unsafe: usize = crates
            .values()
            .map(|m| m.values().filter(|m| m.unsafe_uses > 0).count())
            .sum();
        let models = loom.keys().filter(|p| p.ends_with("::loom_tests")).count();
        println!(
            "proofs: ok ({with_unsafe} modules with unsafe code: {} excluded with a reason, the \
             others run under Miri; {models} loom_tests modules, each in {LOOM_DOC})",
            miri::EXCLUDED.len()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("proof coverage: {p}");
    }
    Err(format!("{} proof coverage problem(s)", problems.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .filter_map(|t| match t {
                Token::Ident(w) => Some(w),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_and_chars_hide_their_words() {
        let src = r####"
            // unsafe in a line comment
            /// unsafe in a doc comment
            /* unsafe /* nested unsafe */ still a comment */
            let a = "unsafe \" unsafe";
            let b = r#"unsafe "quoted" unsafe"#;
            let c = b"unsafe";
            let d = '"'; let e = '\''; let f = '\u{1F600}';
            fn g<'a>(x: &'a u8) -> &'a u8 { x }
            unsafe { ok() }
        "####;
        let words = idents(src);
        assert_eq!(
            words.iter().filter(|w| *w == "unsafe").count(),
            1,
            "{words:?}"
        );
        assert!(words.contains(&"g".to_owned()));
        let strings: Vec<Token> = lex(src)
            .into_iter()
            .filter(|t| matches!(t, Token::Str(_)))
            .collect();
        assert_eq!(
            strings,
            [
                Token::Str(r#"unsafe \" unsafe"#.into()),
                Token::Str(r#"unsafe "quoted" unsafe"#.into()),
                Token::Str("unsafe".into()),
            ]
        );
    }

    /// A crate from (path, text) pairs.
    fn crate_of(files: &[(&str, &str)]) -> Result<Modules, Error> {
        let map: HashMap<String, String> = files
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        scan_crate(&|p: &str| map.get(p).cloned())
    }

    fn example() -> Modules {
        crate_of(&[
            (
                "src/lib.rs",
                "pub mod pool; mod util; #[cfg(loom)] mod sync { fn f() {} }",
            ),
            (
                "src/pool/mod.rs",
                "mod free_list; pub mod resource;\n#[cfg(test)]\n#[path = \"extra_tests.rs\"]\nmod extra;",
            ),
            ("src/pool/free_list.rs", "fn f() {} #[cfg(test)] mod tests { fn t() {} }"),
            (
                "src/pool/resource.rs",
                "unsafe impl Send for R {} #[cfg(test)] mod tests { mod deep { } unsafe fn t() {} }",
            ),
            ("src/pool/extra_tests.rs", "fn t() { unsafe { g() } }"),
            ("src/util.rs", "mod slots; // unsafe"),
            ("src/util/slots.rs", "#[cfg(all(test, loom))] mod loom_tests;"),
            (
                "src/util/slots/loom_tests.rs",
                "fn m() { crate::sync::model(\"slots::distinct\", || {}); }",
            ),
        ])
        .unwrap()
    }

    #[test]
    fn modules_are_found_as_the_compiler_finds_them() {
        let m = example();
        let paths: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "",
                "pool",
                "pool::extra",
                "pool::free_list",
                "pool::free_list::tests",
                "pool::resource",
                "pool::resource::tests",
                "pool::resource::tests::deep",
                "sync",
                "util",
                "util::slots",
                "util::slots::loom_tests",
            ]
        );
        assert_eq!(m["pool::resource"].unsafe_uses, 2);
        assert_eq!(m["pool::resource::tests"].unsafe_uses, 0);
        assert!(m["pool::resource::tests"].inline);
        assert_eq!(m["pool::extra"].file, "src/pool/extra_tests.rs");
        assert_eq!(m["pool::extra"].unsafe_uses, 1);
        assert_eq!(m["util"].unsafe_uses, 0);
        assert_eq!(
            m["util::slots::loom_tests"].file,
            "src/util/slots/loom_tests.rs"
        );
        assert!(crate_of(&[("src/lib.rs", "mod gone;")])
            .unwrap_err()
            .contains("mod gone;"));
    }

    fn crates() -> BTreeMap<String, Modules> {
        BTreeMap::from([("rmm-mr".to_owned(), example())])
    }

    #[test]
    fn covered_and_excluded_modules_pass() {
        let suites: &[(&str, &[&str])] = &[("rmm-mr", &["pool::resource::", "pool::free_list::"])];
        let excluded = &[("rmm-mr", "pool::extra", "calls the driver")];
        assert_eq!(
            check_miri(&crates(), suites, excluded),
            Vec::<String>::new()
        );
        // An ancestor's filter and an inline test module's filter cover the module too.
        let suites: &[(&str, &[&str])] = &[("rmm-mr", &["pool::"])];
        assert_eq!(check_miri(&crates(), suites, &[]), Vec::<String>::new());
        let suites: &[(&str, &[&str])] =
            &[("rmm-mr", &["pool::resource::tests::", "pool::extra::"])];
        assert_eq!(check_miri(&crates(), suites, &[]), Vec::<String>::new());
    }

    #[test]
    fn a_module_with_unsafe_and_no_suite_fails_by_name() {
        let suites: &[(&str, &[&str])] = &[("rmm-mr", &["pool::free_list::"])];
        let excluded = &[("rmm-mr", "pool::extra", "calls the driver")];
        let problems = check_miri(&crates(), suites, excluded);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("rmm-mr: module `pool::resource` (src/pool/resource.rs)"),
            "{problems:?}"
        );
        // A child's filter does not cover its parent's file.
        let suites: &[(&str, &[&str])] = &[(
            "rmm-mr",
            &["pool::resource::tests::deep::", "pool::extra::"],
        )];
        assert_eq!(check_miri(&crates(), suites, &[]), Vec::<String>::new());
        let suites: &[(&str, &[&str])] =
            &[("rmm-mr", &["pool::free_list::tests::", "pool::extra::"])];
        assert_eq!(check_miri(&crates(), suites, &[]).len(), 1);
    }

    #[test]
    fn stale_entries_fail() {
        let suites: &[(&str, &[&str])] = &[
            ("rmm-mr", &["pool::", "vmm::blocks::", "pool::free_list"]),
            ("rmm-gone", &["x::"]),
        ];
        let excluded = &[
            ("rmm-mr", "pool::shell", "moved"),
            ("rmm-mr", "util", "no unsafe left"),
            ("rmm-mr", "pool::resource", "both"),
            ("rmm-mr", "pool::resource::tests", "inline"),
        ];
        let problems = check_miri(&crates(), suites, excluded);
        let expect = [
            "the rmm-mr suite filter `vmm::blocks::` names no module",
            "the rmm-mr suite filter `pool::free_list` is not a module path",
            "SUITES names the package `rmm-gone`",
            "EXCLUDED names rmm-mr `pool::shell`, which is no module",
            "EXCLUDED names rmm-mr `util`, which has no unsafe code",
            "rmm-mr `pool::resource` is both run by a Miri suite and in EXCLUDED",
            "EXCLUDED names rmm-mr `pool::resource::tests`, an inline module",
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
        for e in expect {
            assert!(problems.iter().any(|p| p.contains(e)), "{e}: {problems:#?}");
        }
    }

    const DOC: &str = "# Loom\n\n| protocol | code | `loom_tests` module | models |\n| --- | --- | --- | --- |\n| thread slots | `util/slots.rs` | `util::slots::loom_tests` | `slots::distinct` |\n\nAfter.\n";

    #[test]
    fn the_loom_table_matches_the_modules() {
        assert_eq!(check_loom(DOC, &example()), Vec::<String>::new());
        // A model the module does not run.
        let doc = DOC.replace("`slots::distinct`", "`slots::distinct`, `slots::gone`");
        let p = check_loom(&doc, &example());
        assert!(
            p.len() == 1 && p[0].contains("`slots::gone` is named nowhere"),
            "{p:?}"
        );
        // A stale row, and the module it should name left out.
        let doc = DOC.replace("util::slots::loom_tests", "util::slot::loom_tests");
        let p = check_loom(&doc, &example());
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains("`util::slot::loom_tests` is no module"),
            "{p:?}"
        );
        assert!(
            p[1].contains("`util::slots::loom_tests` (src/util/slots/loom_tests.rs) have no row"),
            "{p:?}"
        );
        // No table at all.
        assert!(check_loom("# Loom\n", &example())[0].contains("no table"));
    }

    #[test]
    fn the_workspace_passes() {
        // The real lists against the real tree: what the `proofs` step of CI checks.
        let crates = scan_workspace(&cargo::repo_root()).unwrap();
        let problems = check_miri(&crates, miri::SUITES, miri::EXCLUDED);
        assert_eq!(problems, Vec::<String>::new());
        let doc = std::fs::read_to_string(cargo::repo_root().join(LOOM_DOC)).unwrap();
        assert_eq!(
            check_loom(&doc, &crates[LOOM_PACKAGE]),
            Vec::<String>::new()
        );
    }
}
