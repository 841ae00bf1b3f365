//! The `imports` step of `cargo xtask ci`: no two files of a crate import each other, and no
//! module file under a crate's `src/` is named `mod.rs` (the one module-file convention:
//! `name.rs` beside `name/`; shared modules of `tests/` and `benches/` keep Cargo's `mod.rs`).
//!
//! An import is a path through `crate::`, `super::` or `self::` (in a `use`, or written in code:
//! `crate::fault::is_fake(..)`, `L: super::Trait`), outside test code (`#[cfg(test)]` items and modules, files named `*tests*.rs`). It goes to the
//! file that defines the item named: re-exports (`pub use`, and the private `use` a child module
//! may name through its parent) are followed to the defining file, and are not imports
//! themselves. Two files that import each other (`a.rs` uses `b::X`, `b.rs` uses `a::Y`) are a
//! cycle the step reports; a type both need belongs to one of them, or to a third file.
//!
//! Each crate target of the workspace is scanned from its root (`src/lib.rs`, `src/main.rs`),
//! following `mod` declarations as the compiler does ([`crate::proofs::lex`] for the tokens).

use crate::cargo::{self, Error};
use crate::proofs::{child_file, join, lex, Token};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The crate folders scanned, from the workspace root (with every folder of `crates/`).
const FOLDERS: &[&str] = &["xtask", "benches", "checks"];

/// Cycles known and left for now: (crate folder, file, file), the files from the crate folder
/// in sorted order. Each entry says who removes it; an entry that matches no cycle is an error.
pub(crate) const ALLOWED: &[(&str, &str, &str)] = &[];

/// One `use` leaf: the path written (`crate`, `super`, ... included), the name it binds, and
/// whether it is a glob.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Use {
    path: Vec<String>,
    binds: String,
    glob: bool,
    /// Written with a visibility (`pub use`, `pub(crate) use`): a re-export.
    public: bool,
}

/// What the scan knows of one module.
#[derive(Debug, Default)]
struct Module {
    file: String,
    /// Under `#[cfg(test)]`, in a `*tests*.rs` file, or inside such a module.
    test: bool,
    children: BTreeSet<String>,
    /// The names its items define (`struct X`, `fn f`, ...).
    defines: BTreeSet<String>,
    /// Its `use` leaves outside test code.
    uses: Vec<Use>,
}

/// The modules of one crate target, by path (`""` for the root).
type Modules = BTreeMap<String, Module>;

fn parent(module: &str) -> Option<&str> {
    if module.is_empty() {
        None
    } else {
        Some(module.rsplit_once("::").map_or("", |(p, _)| p))
    }
}

fn is_ident(t: Option<&Token>, word: &str) -> bool {
    matches!(t, Some(Token::Ident(w)) if w == word)
}

fn is_punct(t: Option<&Token>, c: char) -> bool {
    matches!(t, Some(Token::Punct(p)) if *p == c)
}

/// Parses the use tree at `tokens[*k]` under `prefix` into `out`, up to (not past) the `,`,
/// `}` or `;` that ends it.
fn use_tree(tokens: &[Token], k: &mut usize, prefix: &[String], out: &mut Vec<Use>) {
    let mut path = prefix.to_vec();
    while *k < tokens.len() {
        match &tokens[*k] {
            Token::Punct(':') => *k += 1,
            Token::Punct('*') => {
                *k += 1;
                out.push(Use {
                    path,
                    binds: String::new(),
                    glob: true,
                    public: false,
                });
                return;
            }
            Token::Punct('{') => {
                *k += 1;
                while *k < tokens.len() && !is_punct(tokens.get(*k), '}') {
                    use_tree(tokens, k, &path, out);
                    if is_punct(tokens.get(*k), ',') {
                        *k += 1;
                    }
                }
                *k += 1;
                return;
            }
            Token::Ident(w) if w == "as" => {
                *k += 1;
                if let Some(Token::Ident(alias)) = tokens.get(*k) {
                    *k += 1;
                    out.push(Use {
                        path,
                        binds: alias.clone(),
                        glob: false,
                        public: false,
                    });
                }
                return;
            }
            Token::Ident(w) => {
                if w == "self" && !path.is_empty() {
                    // `use a::{self, ..}`: the module `a` itself.
                } else {
                    path.push(w.clone());
                }
                *k += 1;
            }
            _ => {
                if let Some(last) = path.last().cloned() {
                    out.push(Use {
                        binds: last,
                        path,
                        glob: false,
                        public: false,
                    });
                }
                return;
            }
        }
    }
}

/// The index after the bracket that closes the one at `tokens[open]`.
fn after_group(tokens: &[Token], open: usize, o: char, c: char) -> usize {
    let mut depth = 0usize;
    let mut k = open;
    while k < tokens.len() {
        if is_punct(tokens.get(k), o) {
            depth += 1;
        } else if is_punct(tokens.get(k), c) {
            depth -= 1;
            if depth == 0 {
                return k + 1;
            }
        }
        k += 1;
    }
    k
}

/// Whether the attribute tokens make their item test-only: `cfg(test)` or `cfg(all(test, ..))`,
/// not `cfg(any(test, ..))` nor `cfg(not(test))`.
fn test_only(attr: &[Token]) -> bool {
    is_ident(attr.first(), "cfg")
        && attr.iter().any(|t| is_ident(Some(t), "test"))
        && !attr
            .iter()
            .any(|t| is_ident(Some(t), "any") || is_ident(Some(t), "not"))
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "trait",
    "type",
    "const",
    "static",
    "union",
    "macro_rules",
];

struct Scan<'a> {
    read: &'a dyn Fn(&str) -> Option<String>,
    modules: Modules,
}

impl Scan<'_> {
    /// Scans `file` as module `module` (test code if `test`); its `mod x;` children are looked
    /// up in `child_dir`, `#[path]` ones beside `file`.
    fn visit(
        &mut self,
        file: &str,
        module: &str,
        child_dir: &str,
        test: bool,
    ) -> Result<(), Error> {
        let text = (self.read)(file).ok_or_else(|| format!("{file}: cannot be read"))?;
        let tokens = lex(&text);
        let file_name = file.rsplit('/').next().unwrap_or(file);
        let test = test || file_name.contains("tests");
        let entry = self.modules.entry(module.to_owned()).or_default();
        entry.file = file.to_owned();
        entry.test = test;
        let file_dir = file.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
        // Inline modules open around the current token: (name, depth outside it, test).
        let mut inline: Vec<(String, usize, bool)> = Vec::new();
        // Test-only items open around the current token: the depth outside each.
        let mut test_items: Vec<usize> = Vec::new();
        let mut depth = 0usize;
        let mut pending_test = false;
        let mut path_attr: Option<String> = None;
        let mut children = Vec::new();
        let mut k = 0;
        while k < tokens.len() {
            let current = inline
                .iter()
                .fold(module.to_owned(), |m, (name, _, _)| join(&m, name));
            let in_test = test || inline.iter().any(|i| i.2) || !test_items.is_empty();
            match &tokens[k] {
                Token::Punct('#') => {
                    let open = if is_punct(tokens.get(k + 1), '!') {
                        k + 2
                    } else {
                        k + 1
                    };
                    if is_punct(tokens.get(open), '[') {
                        let end = after_group(&tokens, open, '[', ']');
                        let attr = &tokens[open + 1..end.saturating_sub(1)];
                        if test_only(attr) && open == k + 1 {
                            pending_test = true;
                        }
                        if let [Token::Ident(p), Token::Punct('='), Token::Str(to)] = attr {
                            if p == "path" {
                                path_attr = Some(to.clone());
                            }
                        }
                        k = end;
                        continue;
                    }
                }
                Token::Punct('{') => {
                    if pending_test {
                        test_items.push(depth);
                        pending_test = false;
                    }
                    depth += 1;
                }
                Token::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|i| i.1 == depth) {
                        inline.pop();
                    }
                    if test_items.last() == Some(&depth) {
                        test_items.pop();
                    }
                }
                Token::Punct(';') => pending_test = false,
                Token::Ident(w) if w == "mod" => {
                    if let Some(Token::Ident(name)) = tokens.get(k + 1) {
                        let path = join(&current, name);
                        let child_test = in_test || pending_test;
                        pending_test = false;
                        match tokens.get(k + 2) {
                            Some(Token::Punct(';')) => {
                                let mut dir = child_dir.to_owned();
                                for (outer, _, _) in &inline {
                                    dir = format!("{dir}/{outer}");
                                }
                                children.push((
                                    path,
                                    name.clone(),
                                    dir,
                                    path_attr.take(),
                                    child_test,
                                ));
                            }
                            Some(Token::Punct('{')) => {
                                path_attr = None;
                                let m = self.modules.entry(path).or_default();
                                m.file = file.to_owned();
                                m.test = child_test;
                                inline.push((name.clone(), depth, child_test));
                                depth += 1;
                                k += 3;
                                self.modules
                                    .entry(current.clone())
                                    .or_default()
                                    .children
                                    .insert(name.clone());
                                continue;
                            }
                            _ => {}
                        }
                        self.modules
                            .entry(current.clone())
                            .or_default()
                            .children
                            .insert(name.clone());
                        k += 2;
                        continue;
                    }
                }
                Token::Ident(w) if w == "use" => {
                    let public = is_ident(k.checked_sub(1).and_then(|j| tokens.get(j)), "pub")
                        || (is_punct(k.checked_sub(1).and_then(|j| tokens.get(j)), ')')
                            && tokens[..k]
                                .iter()
                                .rev()
                                .take(6)
                                .any(|t| is_ident(Some(t), "pub")));
                    let skip = in_test || pending_test;
                    pending_test = false;
                    k += 1;
                    if is_punct(tokens.get(k), '$') {
                        continue;
                    }
                    let mut leaves = Vec::new();
                    use_tree(&tokens, &mut k, &[], &mut leaves);
                    if !skip {
                        let m = self.modules.entry(current.clone()).or_default();
                        for mut leaf in leaves {
                            leaf.public = public;
                            m.uses.push(leaf);
                        }
                    }
                    continue;
                }
                Token::Ident(w)
                    if matches!(w.as_str(), "crate" | "super" | "self")
                        && is_punct(tokens.get(k + 1), ':')
                        && is_punct(tokens.get(k + 2), ':')
                        && !is_punct(k.checked_sub(1).and_then(|j| tokens.get(j)), '$')
                        && !(is_punct(k.checked_sub(1).and_then(|j| tokens.get(j)), ':')
                            && is_punct(k.checked_sub(2).and_then(|j| tokens.get(j)), ':')) =>
                {
                    // A path in code (`crate::fault::is_fake(..)`, `L: super::Trait`).
                    let mut path = vec![w.clone()];
                    let mut j = k + 1;
                    while is_punct(tokens.get(j), ':') && is_punct(tokens.get(j + 1), ':') {
                        match tokens.get(j + 2) {
                            Some(Token::Ident(seg)) => path.push(seg.clone()),
                            _ => break,
                        }
                        j += 3;
                    }
                    if !in_test && !pending_test {
                        self.modules
                            .entry(current.clone())
                            .or_default()
                            .uses
                            .push(Use {
                                path,
                                binds: String::new(),
                                glob: false,
                                public: false,
                            });
                    }
                    k = j;
                    continue;
                }
                Token::Ident(w) if ITEM_KEYWORDS.contains(&w.as_str()) => {
                    let at = if w == "macro_rules" { k + 2 } else { k + 1 };
                    if let Some(Token::Ident(name)) = tokens.get(at) {
                        self.modules
                            .entry(current.clone())
                            .or_default()
                            .defines
                            .insert(name.clone());
                    }
                }
                _ => {}
            }
            k += 1;
        }
        for (path, name, dir, attr, child_test) in children {
            match attr {
                Some(rel) => {
                    let child = format!("{file_dir}/{rel}");
                    let dir = child.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
                    self.visit(&child, &path, &dir, child_test)?;
                }
                None => {
                    let (child, _) = child_file(self.read, file, &dir, &name)?;
                    self.visit(&child, &path, &format!("{dir}/{name}"), child_test)?;
                }
            }
        }
        Ok(())
    }
}

/// The modules of the crate target rooted at `root` (a path from the crate's folder).
fn scan_target(read: &dyn Fn(&str) -> Option<String>, root: &str) -> Result<Modules, Error> {
    let mut scan = Scan {
        read,
        modules: BTreeMap::new(),
    };
    let dir = root.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
    scan.visit(root, "", &dir, false)?;
    Ok(scan.modules)
}

/// Where a path written in `module` leads: the module, and the item named in it (none when
/// the path names the module itself). `None` for paths out of the crate.
fn locate(modules: &Modules, module: &str, path: &[String]) -> Option<(String, Option<String>)> {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" => String::new(),
        "self" => module.to_owned(),
        "super" => parent(module)?.to_owned(),
        name if modules.get(module)?.children.contains(name) => join(module, name),
        _ => return None,
    };
    let mut rest = rest.iter();
    for seg in rest.by_ref() {
        match seg.as_str() {
            "super" => base = parent(&base)?.to_owned(),
            "self" => {}
            name if modules
                .get(&base)
                .is_some_and(|m| m.children.contains(name)) =>
            {
                base = join(&base, name);
            }
            name => return Some((base, Some(name.to_owned()))),
        }
    }
    Some((base, None))
}

/// The module that defines `item` named in `module`, following re-exports (`depth` bounds it).
fn defining(modules: &Modules, module: &str, item: &str, depth: usize) -> String {
    let Some(m) = modules.get(module) else {
        return module.to_owned();
    };
    if depth == 0 || m.defines.contains(item) {
        return module.to_owned();
    }
    for u in m.uses.iter().filter(|u| !u.glob && u.binds == item) {
        if let Some(found) = resolve(modules, module, &u.path, depth - 1) {
            return found;
        }
    }
    for u in m.uses.iter().filter(|u| u.glob) {
        if let Some((g, None)) = locate(modules, module, &u.path) {
            let found = defining(modules, &g, item, depth - 1);
            if found != g || modules.get(&g).is_some_and(|m| m.defines.contains(item)) {
                return found;
            }
        }
    }
    module.to_owned()
}

/// The module whose file a path written in `module` imports from.
fn resolve(modules: &Modules, module: &str, path: &[String], depth: usize) -> Option<String> {
    let (base, item) = locate(modules, module, path)?;
    Some(match item {
        None => base,
        Some(item) => defining(modules, &base, &item, depth),
    })
}

/// The file of a module (an inline module's is its parent file's).
fn file_of(modules: &Modules, module: &str) -> Option<String> {
    modules.get(module).map(|m| m.file.clone())
}

/// The imports between files of one crate target: importing file -> imported files.
fn file_edges(modules: &Modules) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, m) in modules {
        if m.test {
            continue;
        }
        let counted = |u: &&Use| {
            !u.public
                && u.path
                    .first()
                    .is_some_and(|f| matches!(f.as_str(), "crate" | "super" | "self"))
        };
        for u in m.uses.iter().filter(counted) {
            let target = if u.glob {
                locate(modules, path, &u.path).map(|(b, _)| b)
            } else {
                resolve(modules, path, &u.path, 16)
            };
            let Some(to) = target.and_then(|t| file_of(modules, &t)) else {
                continue;
            };
            if to != m.file {
                edges.entry(m.file.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// The pairs of files (sorted) that import each other.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (a, tos) in edges {
        for b in tos {
            if a < b && edges.get(b).is_some_and(|back| back.contains(a)) {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

/// The cycles of the crate in `folder` (files from the folder), all its targets together.
fn crate_cycles(read: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>, Error> {
    let mut found = BTreeSet::new();
    for root in ["src/lib.rs", "src/main.rs"] {
        if read(root).is_none() {
            continue;
        }
        let modules = scan_target(read, root)?;
        found.extend(cycles(&file_edges(&modules)));
    }
    Ok(found.into_iter().collect())
}

/// The crate folders of the workspace at `root`.
fn folders(root: &Path) -> Result<Vec<String>, Error> {
    let mut out: Vec<String> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("crates/: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| format!("crates/{}", e.file_name().to_string_lossy()))
        .collect();
    out.sort();
    out.extend(FOLDERS.iter().map(|f| (*f).to_owned()));
    Ok(out)
}

/// The problems of the workspace at `root`: cycles not in `allowed`, stale allowances, and
/// module files named `mod.rs` under a crate's `src/`.
fn check(root: &Path, allowed: &[(&str, &str, &str)]) -> Result<(Vec<String>, usize), Error> {
    let mut problems = Vec::new();
    let mut matched = BTreeSet::new();
    let mut files = 0;
    for folder in folders(root)? {
        let dir = root.join(&folder);
        let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).ok();
        for (a, b) in crate_cycles(&read).map_err(|e| format!("{folder}/{e}"))? {
            match allowed
                .iter()
                .position(|(f, x, y)| *f == folder && *x == a && *y == b)
            {
                Some(i) => {
                    matched.insert(i);
                }
                None => problems.push(format!(
                    "{folder}: {a} and {b} import each other: move what both need into one \
                     of them, or into a third file"
                )),
            }
        }
        let mut sources = Vec::new();
        if dir.join("src").is_dir() {
            crate::size::files(&dir.join("src"), &mut sources)?;
        }
        for file in sources.iter().filter(|f| f.ends_with("mod.rs")) {
            let shown = file.strip_prefix(root).unwrap_or(file).display();
            problems.push(format!(
                "{shown}: a module file named mod.rs; name it after its folder (`name.rs` beside \
                 `name/`, CONTRIBUTING.md \"Files and modules\")"
            ));
        }
        files += 1;
    }
    for (i, (f, a, b)) in allowed.iter().enumerate() {
        if !matched.contains(&i) {
            problems.push(format!(
                "xtask/src/imports.rs: ALLOWED names {f}: {a} <-> {b}, which no longer import \
                 each other (stale: remove it)"
            ));
        }
    }
    Ok((problems, files))
}

/// The `imports` step.
pub(crate) fn run_ci() -> Result<(), Error> {
    let (problems, crates) = check(&cargo::repo_root(), ALLOWED)?;
    if problems.is_empty() {
        println!(
            "imports: ok ({crates} crates, no two files import each other, no mod.rs under \
             src/; {} pair(s) allowed for now)",
            ALLOWED.len()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("imports: {p}");
    }
    Err(format!("{} import problem(s)", problems.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cycles_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
        let map: HashMap<String, String> = files
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        crate_cycles(&|p: &str| map.get(p).cloned()).unwrap()
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn use_trees_are_flattened() {
        let tokens = lex("crate::a::{self, b::{C as D, E}, f::*};");
        let mut out = Vec::new();
        let mut k = 0;
        use_tree(&tokens, &mut k, &[], &mut out);
        let got: Vec<(String, String, bool)> = out
            .into_iter()
            .map(|u| (u.path.join("::"), u.binds, u.glob))
            .collect();
        let want = [
            ("crate::a", "a", false),
            ("crate::a::b::C", "D", false),
            ("crate::a::b::E", "E", false),
            ("crate::a::f", "", true),
        ];
        let want: Vec<(String, String, bool)> = want
            .iter()
            .map(|(p, b, g)| ((*p).to_owned(), (*b).to_owned(), *g))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_pair_through_super_and_a_reexport_is_found() {
        let found = cycles_of(&[
            ("src/lib.rs", "mod arena;"),
            (
                "src/arena.rs",
                "mod error; mod superblock; pub use superblock::Superblock; pub use error::ArenaError;",
            ),
            ("src/arena/error.rs", "use super::Superblock; pub enum ArenaError {}"),
            ("src/arena/superblock.rs", "use super::ArenaError; pub struct Superblock;"),
        ]);
        assert_eq!(
            found,
            [pair("src/arena/error.rs", "src/arena/superblock.rs")]
        );
    }

    #[test]
    fn crate_paths_self_modules_and_mod_rs_count() {
        let found = cycles_of(&[
            ("src/main.rs", "mod bundle; mod capi; mod util;"),
            ("src/bundle.rs", "use crate::capi; pub struct Entry;"),
            ("src/capi.rs", "use crate::bundle::{self, Entry};"),
            ("src/util/mod.rs", "mod a; mod b;"),
            (
                "src/util/a.rs",
                "use self::inner::X; mod inner { pub use super::super::b::B as X; }",
            ),
            ("src/util/b.rs", "use crate::util::a::*; pub struct B;"),
        ]);
        assert_eq!(
            found,
            [
                pair("src/bundle.rs", "src/capi.rs"),
                pair("src/util/a.rs", "src/util/b.rs")
            ]
        );
    }

    #[test]
    fn paths_in_code_count_and_child_paths_do_not() {
        let found = cycles_of(&[
            (
                "src/lib.rs",
                "mod context; mod device; pub use device::DeviceId;",
            ),
            (
                "src/context.rs",
                "pub fn enter(d: crate::DeviceId) { let _ = $crate::x; }",
            ),
            (
                "src/device.rs",
                "pub struct DeviceId; fn f() { crate::context::enter(DeviceId) }",
            ),
        ]);
        assert_eq!(found, [pair("src/context.rs", "src/device.rs")]);
        // A parent naming its child's items by a relative path (`cell::X`) is not counted.
        let found = cycles_of(&[
            ("src/lib.rs", "mod resource;"),
            (
                "src/resource.rs",
                "mod cell; use cell::Cell; pub(crate) fn lock() {}",
            ),
            ("src/resource/cell.rs", "use super::lock; pub struct Cell;"),
        ]);
        assert_eq!(found, Vec::<(String, String)>::new());
    }

    #[test]
    fn test_code_and_one_way_imports_are_not_cycles() {
        let found = cycles_of(&[
            (
                "src/lib.rs",
                "mod a; mod b; #[cfg(test)] mod c_tests; #[cfg(all(test, loom))] mod d;",
            ),
            (
                "src/a.rs",
                "use crate::b::B; pub struct A;\n#[cfg(test)]\nuse crate::c_tests::T;\n\
                 #[cfg(test)] mod tests { use crate::b::Helper; }",
            ),
            (
                "src/b.rs",
                "pub struct B; pub struct Helper;\n#[cfg(test)]\nfn t() { use crate::a::A; }\n\
                 #[cfg(test)] use crate::a::A as Also;",
            ),
            ("src/c_tests.rs", "use crate::a::A; pub struct T;"),
            ("src/d.rs", "use crate::a::A; use crate::d2::X;"),
        ]);
        assert_eq!(found, Vec::<(String, String)>::new());
        // The same two files, with the import of `b.rs` outside test code.
        let found = cycles_of(&[
            ("src/lib.rs", "mod a; mod b;"),
            ("src/a.rs", "use crate::b::B; pub struct A;"),
            (
                "src/b.rs",
                "pub struct B;\n#[cfg(any(test, feature = \"x\"))]\nuse crate::a::A;",
            ),
        ]);
        assert_eq!(found, [pair("src/a.rs", "src/b.rs")]);
    }

    #[test]
    fn a_reexport_alone_is_no_import() {
        // The parent re-exports its child's type and the child uses one defined in the parent.
        let found = cycles_of(&[
            ("src/lib.rs", "mod pool; pub use pool::Pool;"),
            (
                "src/pool.rs",
                "mod resource; pub use resource::Pool; pub const MIN: usize = 1;",
            ),
            (
                "src/pool/resource.rs",
                "use super::MIN; use crate::Pool as P; pub struct Pool;",
            ),
        ]);
        assert_eq!(found, Vec::<(String, String)>::new());
    }

    #[test]
    fn a_mod_rs_under_src_is_reported() {
        let root =
            std::env::temp_dir().join(format!("xtask-imports-mod-rs-{}", std::process::id()));
        let krate = root.join("crates/x");
        std::fs::create_dir_all(krate.join("src/a")).unwrap();
        std::fs::create_dir_all(krate.join("tests/common")).unwrap();
        for (file, text) in [
            ("Cargo.toml", "[package]\nname = \"x\"\n"),
            ("src/lib.rs", "mod a;"),
            ("src/a/mod.rs", ""),
            ("tests/common/mod.rs", ""),
        ] {
            std::fs::write(krate.join(file), text).unwrap();
        }
        let (problems, _) = check(&root, &[]).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("crates/x/src/a/mod.rs: "),
            "{problems:?}"
        );
    }

    #[test]
    fn the_workspace_passes() {
        // The real tree with the real allowances: what the `imports` step of CI checks.
        let (problems, _) = check(&cargo::repo_root(), ALLOWED).unwrap();
        assert_eq!(problems, Vec::<String>::new());
    }
}
