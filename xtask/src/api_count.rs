//! `cargo xtask api-count`: how large the public API of a library crate is.
//!
//! Builds the rustdoc JSON of the layer crates on nightly (`cargo +nightly rustdoc -p P
//! --all-features -- -Z unstable-options --output-format json`), then walks each named crate
//! from its root: public modules, public items and public re-exports (`pub use`), following
//! re-exports into the other layer crates (the facade re-exports the layers whole, as `rmm::mr`
//! and so on). It prints
//!
//! - the distinct items reachable, by kind (an item reachable by two paths counts once; a
//!   re-export of a crate outside the workspace counts as `foreign`),
//! - the public associated items of their inherent impls (methods, constants),
//! - the number of distinct public paths (`rmm::PoolMemoryResource` and
//!   `rmm::mr::PoolMemoryResource` are two paths to one item).
//!
//! `#[doc(hidden)]` items are not in the JSON, so `__internals`-style modules do not count.
//! `--list` also prints every path, for diffs between two measurements.

use crate::cargo::{self, Error};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

const USAGE: &str = "usage: cargo xtask api-count [--list] [--no-build] [PACKAGE]...";

/// The crates measured when none is named: the facade and the memory resources.
const DEFAULT_PACKAGES: &[&str] = &["rmm-rs", "rmm-mr"];

/// Modules nested deeper than this are not walked (a guard against re-export cycles).
const MAX_DEPTH: usize = 16;

/// The rustdoc JSON of the crates, by library name (`rmm_mr`).
pub(crate) type Crates = HashMap<String, Value>;

/// What one walk found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Count {
    /// Distinct items by kind (`struct`, `function`, ...).
    pub(crate) by_kind: BTreeMap<String, usize>,
    /// Distinct public associated items of inherent impls of the items found.
    pub(crate) inherent_assoc: usize,
    /// Every public path, as `path (kind)`.
    pub(crate) paths: BTreeSet<String>,
}

impl Count {
    /// Distinct items of every kind together.
    pub(crate) fn items(&self) -> usize {
        self.by_kind.values().sum()
    }
}

/// The item kind of a rustdoc JSON item: the single key of its `inner` object.
fn kind(item: &Value) -> &str {
    item.get("inner")
        .and_then(Value::as_object)
        .and_then(|o| o.keys().next())
        .map_or("?", String::as_str)
}

fn is_public(item: &Value) -> bool {
    item.get("visibility").and_then(Value::as_str) == Some("public")
}

/// An id as the key of `index` and `paths` (a number in format 57, a string before).
fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

struct Walker<'a> {
    crates: &'a Crates,
    /// Per crate: (path, kind) -> id of its local items.
    by_path: HashMap<&'a str, HashMap<(Vec<String>, String), String>>,
    seen: HashSet<(String, String)>,
    count: Count,
}

impl<'a> Walker<'a> {
    fn new(crates: &'a Crates) -> Self {
        let mut by_path = HashMap::new();
        for (name, json) in crates {
            let mut map = HashMap::new();
            if let Some(paths) = json.get("paths").and_then(Value::as_object) {
                for (id, entry) in paths {
                    if entry.get("crate_id").and_then(Value::as_u64) != Some(0) {
                        continue;
                    }
                    let path: Vec<String> = entry
                        .get("path")
                        .and_then(Value::as_array)
                        .map(|p| {
                            p.iter()
                                .filter_map(|s| s.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    let kind = entry
                        .get("kind")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_owned();
                    map.insert((path, kind), id.clone());
                }
            }
            by_path.insert(name.as_str(), map);
        }
        Walker {
            crates,
            by_path,
            seen: HashSet::new(),
            count: Count::default(),
        }
    }

    fn item(&self, krate: &str, id: &str) -> Option<&'a Value> {
        self.crates.get(krate)?.get("index")?.get(id)
    }

    /// Where the item `id`, as named inside `krate`'s JSON, is defined: (crate, id) among the
    /// loaded crates, or `None` for an item of a crate that was not loaded.
    fn resolve(&self, krate: &str, id: &str) -> Option<(String, String)> {
        let json = self.crates.get(krate)?;
        if json.get("index").and_then(|i| i.get(id)).is_some() {
            return Some((krate.to_owned(), id.to_owned()));
        }
        let entry = json.get("paths")?.get(id)?;
        let crate_id = entry.get("crate_id")?.as_u64()?.to_string();
        let other = json
            .get("external_crates")?
            .get(&crate_id)?
            .get("name")?
            .as_str()?;
        let other_json = self.crates.get(other)?;
        let path: Vec<String> = entry
            .get("path")?
            .as_array()?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
        let kind = entry.get("kind")?.as_str()?.to_owned();
        if path.len() == 1 && kind == "module" {
            return Some((other.to_owned(), id_key(other_json.get("root")?)?));
        }
        let local = self.by_path.get(other)?.get(&(path, kind))?;
        Some((other.to_owned(), local.clone()))
    }

    /// Records the item `id` of `krate`, reached at `path`, and walks into it if a module.
    fn visit(&mut self, krate: &str, id: &str, path: &str, depth: usize) {
        let Some(item) = self.item(krate, id) else {
            return;
        };
        let kind = kind(item).to_owned();
        self.count.paths.insert(format!("{path} ({kind})"));
        if self.seen.insert((krate.to_owned(), id.to_owned())) {
            *self.count.by_kind.entry(kind.clone()).or_default() += 1;
            self.count_inherent(krate, item, &kind);
        }
        if kind == "module" && depth < MAX_DEPTH {
            self.walk_children(krate, item, path, depth + 1);
        }
    }

    /// Counts the public associated items of the inherent impls of a type.
    fn count_inherent(&mut self, krate: &str, item: &Value, kind: &str) {
        if !matches!(kind, "struct" | "enum" | "union") {
            return;
        }
        let impls = item
            .get("inner")
            .and_then(|i| i.get(kind))
            .and_then(|t| t.get("impls"))
            .and_then(Value::as_array);
        for impl_id in impls.into_iter().flatten().filter_map(id_key) {
            let Some(imp) = self.item(krate, &impl_id) else {
                continue;
            };
            let Some(inner) = imp.get("inner").and_then(|i| i.get("impl")) else {
                continue;
            };
            if !inner.get("trait").is_none_or(Value::is_null) {
                continue;
            }
            let items = inner.get("items").and_then(Value::as_array);
            for assoc in items.into_iter().flatten().filter_map(id_key) {
                let public = self.item(krate, &assoc).is_some_and(is_public);
                if public && self.seen.insert((krate.to_owned(), assoc)) {
                    self.count.inherent_assoc += 1;
                }
            }
        }
    }

    fn walk_children(&mut self, krate: &str, module: &Value, path: &str, depth: usize) {
        let children = module
            .get("inner")
            .and_then(|i| i.get("module"))
            .and_then(|m| m.get("items"))
            .and_then(Value::as_array);
        for child_id in children.into_iter().flatten().filter_map(id_key) {
            let Some(child) = self.item(krate, &child_id) else {
                continue;
            };
            if !is_public(child) {
                continue;
            }
            if kind(child) != "use" {
                let name = child.get("name").and_then(Value::as_str).unwrap_or("?");
                self.visit(krate, &child_id, &format!("{path}::{name}"), depth);
                continue;
            }
            let Some(u) = child.get("inner").and_then(|i| i.get("use")) else {
                continue;
            };
            let name = u.get("name").and_then(Value::as_str).unwrap_or("?");
            let glob = u.get("is_glob").and_then(Value::as_bool).unwrap_or(false);
            let Some(target) = u.get("id").and_then(id_key) else {
                continue;
            };
            match self.resolve(krate, &target) {
                Some((k, id)) if glob => {
                    if let Some(m) = self.item(&k, &id) {
                        if kind(m) == "module" && depth < MAX_DEPTH {
                            self.walk_children(&k, m, path, depth + 1);
                        }
                    }
                }
                Some((k, id)) => self.visit(&k, &id, &format!("{path}::{name}"), depth),
                None => {
                    let source = u.get("source").and_then(Value::as_str).unwrap_or(name);
                    let p = format!("{path}::{name} (foreign: {source})");
                    if self.count.paths.insert(p) && self.seen.insert(("".into(), source.into())) {
                        *self.count.by_kind.entry("foreign".into()).or_default() += 1;
                    }
                }
            }
        }
    }
}

/// Walks the public API of the crate `root` (a library name such as `rmm`).
pub(crate) fn count(crates: &Crates, root: &str) -> Result<Count, Error> {
    let json = crates
        .get(root)
        .ok_or_else(|| format!("no rustdoc JSON for `{root}`"))?;
    let root_id = json
        .get("root")
        .and_then(id_key)
        .ok_or_else(|| format!("`{root}`: rustdoc JSON without a root"))?;
    let mut walker = Walker::new(crates);
    walker.visit(root, &root_id, root, 0);
    Ok(walker.count)
}

/// (package, library name) of the layer crates, from `cargo metadata`.
fn layer_libraries() -> Result<Vec<(String, String)>, Error> {
    let metadata = cargo::metadata()?;
    let mut out = Vec::new();
    for package in cargo::workspace_packages(&metadata)? {
        let name = package.get("name").and_then(Value::as_str).unwrap_or("");
        if !crate::layers::LAYERS.contains(&name) {
            continue;
        }
        let targets = package.get("targets").and_then(Value::as_array);
        let lib = targets.into_iter().flatten().find(|t| {
            t.get("kind")
                .and_then(Value::as_array)
                .is_some_and(|k| k.iter().any(|k| k == "lib"))
        });
        if let Some(lib) = lib.and_then(|t| t.get("name")).and_then(Value::as_str) {
            out.push((name.to_owned(), lib.replace('-', "_")));
        }
    }
    Ok(out)
}

/// Runs `api-count`; returns the exit code.
pub(crate) fn run(args: &[String]) -> Result<i32, Error> {
    let mut list = false;
    let mut build = true;
    let mut packages = Vec::new();
    for arg in args {
        match arg.as_str() {
            "--list" => list = true,
            "--no-build" => build = false,
            a if a.starts_with('-') => return Err(format!("unknown argument `{a}`\n{USAGE}")),
            a => packages.push(a.to_owned()),
        }
    }
    if packages.is_empty() {
        packages = DEFAULT_PACKAGES.iter().map(|s| s.to_string()).collect();
    }
    let libraries = layer_libraries()?;
    let doc_dir = cargo::repo_root().join("target").join("doc");
    let mut crates = Crates::new();
    for (package, lib) in &libraries {
        if build {
            println!("==> rustdoc JSON of {package} (nightly)");
            let mut cmd = crate::miri::nightly([
                "rustdoc",
                "-q",
                "-p",
                package,
                "--all-features",
                "--",
                "-Z",
                "unstable-options",
                "--output-format",
                "json",
            ]);
            cargo::run_status(&mut cmd)?;
        }
        crates.insert(
            lib.clone(),
            read_json(&doc_dir.join(format!("{lib}.json")))?,
        );
    }
    for package in &packages {
        let (_, lib) = libraries
            .iter()
            .find(|(p, _)| p == package)
            .ok_or_else(|| format!("`{package}` is not a layer crate\n{USAGE}"))?;
        let c = count(&crates, lib)?;
        println!(
            "{package}: {} items, {} inherent associated items, {} paths",
            c.items(),
            c.inherent_assoc,
            c.paths.len()
        );
        for (kind, n) in &c.by_kind {
            println!("  {kind:<12} {n}");
        }
        if list {
            for p in &c.paths {
                println!("    {p}");
            }
        }
    }
    Ok(0)
}

fn read_json(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Two crates: `a` re-exports `b` whole and one of its structs, and has a private module
    /// whose public struct it re-exports at the root.
    fn crates() -> Crates {
        let a = json!({
            "root": 0,
            "index": {
                "0": {"name": "a", "visibility": "public", "inner": {"module": {"items": [1, 2, 3, 4, 6]}}},
                "1": {"name": "hidden", "visibility": "default", "inner": {"module": {"items": [5]}}},
                "5": {"name": "S", "visibility": "public", "inner": {"struct": {"impls": [7, 8]}}},
                "7": {"visibility": "default", "inner": {"impl": {"trait": null, "items": [9, 10]}}},
                "8": {"visibility": "default", "inner": {"impl": {"trait": {"path": "Clone"}, "items": [11]}}},
                "9": {"name": "new", "visibility": "public", "inner": {"function": {}}},
                "10": {"name": "secret", "visibility": "default", "inner": {"function": {}}},
                "11": {"name": "clone", "visibility": "default", "inner": {"function": {}}},
                "2": {"visibility": "public", "inner": {"use": {"source": "hidden::S", "name": "S", "id": 5, "is_glob": false}}},
                "3": {"visibility": "public", "inner": {"use": {"source": "b", "name": "b", "id": 100, "is_glob": false}}},
                "4": {"visibility": "public", "inner": {"use": {"source": "b::T", "name": "T", "id": 101, "is_glob": false}}},
                "6": {"visibility": "public", "inner": {"use": {"source": "log::Level", "name": "Level", "id": 102, "is_glob": false}}}
            },
            "paths": {
                "100": {"crate_id": 1, "path": ["b"], "kind": "module"},
                "101": {"crate_id": 1, "path": ["b", "inner", "T"], "kind": "struct"},
                "102": {"crate_id": 2, "path": ["log", "Level"], "kind": "enum"}
            },
            "external_crates": {"1": {"name": "b"}, "2": {"name": "log"}}
        });
        let b = json!({
            "root": 0,
            "index": {
                "0": {"name": "b", "visibility": "public", "inner": {"module": {"items": [1, 3]}}},
                "1": {"name": "inner", "visibility": "public", "inner": {"module": {"items": [2]}}},
                "2": {"name": "T", "visibility": "public", "inner": {"struct": {"impls": []}}},
                "3": {"name": "f", "visibility": "public", "inner": {"function": {}}}
            },
            "paths": {
                "2": {"crate_id": 0, "path": ["b", "inner", "T"], "kind": "struct"}
            },
            "external_crates": {}
        });
        Crates::from([("a".to_owned(), a), ("b".to_owned(), b)])
    }

    #[test]
    fn counts_distinct_items_through_reexports() {
        let c = count(&crates(), "a").unwrap();
        // a, b, b::inner (modules); S and T (structs, T once though reached twice); b::f; log::Level.
        assert_eq!(c.by_kind.get("module"), Some(&3));
        assert_eq!(c.by_kind.get("struct"), Some(&2));
        assert_eq!(c.by_kind.get("function"), Some(&1));
        assert_eq!(c.by_kind.get("foreign"), Some(&1));
        assert_eq!(c.items(), 7);
        // `new` is public and inherent; `secret` is private; `clone` is a trait impl.
        assert_eq!(c.inherent_assoc, 1);
        assert!(c.paths.contains("a::T (struct)"));
        assert!(c.paths.contains("a::b::inner::T (struct)"));
        assert!(!c.paths.iter().any(|p| p.contains("hidden")));
    }

    #[test]
    fn a_crate_alone_does_not_see_its_dependents() {
        let c = count(&crates(), "b").unwrap();
        assert_eq!(c.items(), 4);
        assert_eq!(c.paths.len(), 4);
        assert!(count(&crates(), "c").is_err());
    }
}
