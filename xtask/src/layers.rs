//! The layering rule of the workspace, checked on `cargo metadata` output.
//!
//! The layer crates form a strict order. A layer may depend (normal, build and
//! dev dependencies alike) only on layers strictly below it, plus external
//! crates; it may never depend on a workspace package that is not a layer
//! (xtask, bench crates, ...).

use crate::cargo::workspace_packages;
use serde_json::Value;
use std::fmt;

/// The layer packages, lowest first.
pub(crate) const LAYERS: &[&str] = &[
    "rmm-sys",
    "rmm-stream",
    "rmm-mr",
    "rmm-containers",
    "rmm-rs",
];

/// One dependency edge that breaks the layering rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The layer package that declares the dependency.
    pub(crate) from: String,
    /// The workspace package it depends on.
    pub(crate) to: String,
    /// `normal`, `build` or `dev`.
    pub(crate) kind: String,
    /// Why the edge is not allowed.
    pub(crate) reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} depends on {} ({} dependency): {}",
            self.from, self.to, self.kind, self.reason
        )
    }
}

/// What a successful check looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    /// Edges from a layer to another workspace package that were checked.
    pub(crate) edges_checked: usize,
    /// Edges that break the rule; empty when the layering holds.
    pub(crate) violations: Vec<Violation>,
}

/// Checks `cargo metadata --format-version 1 --no-deps` output against [`LAYERS`].
///
/// Returns an error when the metadata is malformed or a layer package is
/// missing from the workspace (the check would otherwise pass vacuously).
pub(crate) fn check(metadata: &Value) -> Result<Report, String> {
    let members = workspace_packages(metadata)?;
    for layer in LAYERS {
        if !members
            .iter()
            .any(|p| p.get("name").and_then(Value::as_str) == Some(layer))
        {
            return Err(format!(
                "layer package `{layer}` is not a workspace member; update LAYERS in xtask/src/layers.rs"
            ));
        }
    }
    let member_names: Vec<&str> = members
        .iter()
        .filter_map(|p| p.get("name").and_then(Value::as_str))
        .collect();

    let mut report = Report {
        edges_checked: 0,
        violations: Vec::new(),
    };
    for package in &members {
        let name = str_field(package, "name")?;
        let Some(level) = layer_index(name) else {
            continue;
        };
        let deps = package
            .get("dependencies")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("package `{name}` has no `dependencies` array"))?;
        for dep in deps {
            let dep_name = str_field(dep, "name")?;
            if !member_names.contains(&dep_name) {
                continue; // an external crate
            }
            report.edges_checked += 1;
            let kind = dep.get("kind").and_then(Value::as_str).unwrap_or("normal");
            let reason = match layer_index(dep_name) {
                Some(dep_level) if dep_level < level => continue,
                Some(_) => format!("`{dep_name}` is not below `{name}` in the layer order"),
                None => format!("`{dep_name}` is a workspace package outside the layers"),
            };
            report.violations.push(Violation {
                from: name.to_owned(),
                to: dep_name.to_owned(),
                kind: kind.to_owned(),
                reason,
            });
        }
    }
    Ok(report)
}

/// The position of `name` in [`LAYERS`], if it is a layer.
fn layer_index(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == name)
}

/// A string field of a JSON object, or an error naming it.
fn str_field<'a>(value: &'a Value, field: &str) -> Result<&'a str, String> {
    value
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("metadata entry without string field `{field}`: {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A dependency entry as `cargo metadata` writes it (path deps have `path`).
    fn dep(name: &str, kind: Option<&str>) -> Value {
        json!({ "name": name, "source": null, "kind": kind, "path": format!("/ws/{name}") })
    }

    fn external(name: &str) -> Value {
        json!({
            "name": name,
            "source": "registry+https://github.com/rust-lang/crates.io-index",
            "kind": null,
        })
    }

    fn package(name: &str, deps: Vec<Value>) -> Value {
        json!({ "name": name, "id": format!("path+file:///ws/{name}#0.1.0"), "dependencies": deps })
    }

    fn metadata(packages: Vec<Value>) -> Value {
        let ids: Vec<Value> = packages.iter().map(|p| p["id"].clone()).collect();
        json!({ "packages": packages, "workspace_members": ids })
    }

    /// A workspace that follows the rule, with the given extra dependencies of `rmm-stream`.
    fn workspace(stream_extra: Vec<Value>) -> Value {
        let mut stream_deps = vec![dep("rmm-sys", None), external("log")];
        stream_deps.extend(stream_extra);
        metadata(vec![
            package("rmm-sys", vec![external("cudarc"), external("proptest")]),
            package("rmm-stream", stream_deps),
            package(
                "rmm-mr",
                vec![dep("rmm-sys", None), dep("rmm-stream", Some("dev"))],
            ),
            package("rmm-containers", vec![dep("rmm-mr", Some("build"))]),
            package(
                "rmm-rs",
                vec![dep("rmm-containers", None), dep("rmm-sys", None)],
            ),
            package("xtask", vec![external("serde_json"), dep("rmm-rs", None)]),
        ])
    }

    #[test]
    fn layered_workspace_passes() {
        let report = check(&workspace(vec![])).unwrap();
        assert_eq!(report.violations, vec![]);
        // rmm-stream→sys, mr→sys, mr→stream, containers→mr, rs→containers, rs→sys;
        // xtask is not a layer, so its edge is not a layer edge.
        assert_eq!(report.edges_checked, 6);
    }

    #[test]
    fn upward_dependency_is_reported() {
        let report = check(&workspace(vec![dep("rmm-mr", None)])).unwrap();
        assert_eq!(
            report.violations,
            vec![Violation {
                from: "rmm-stream".into(),
                to: "rmm-mr".into(),
                kind: "normal".into(),
                reason: "`rmm-mr` is not below `rmm-stream` in the layer order".into(),
            }]
        );
        assert_eq!(
            report.violations[0].to_string(),
            "rmm-stream depends on rmm-mr (normal dependency): \
             `rmm-mr` is not below `rmm-stream` in the layer order"
        );
    }

    #[test]
    fn upward_dev_and_build_dependencies_are_reported() {
        let report = check(&workspace(vec![
            dep("rmm-rs", Some("dev")),
            dep("rmm-containers", Some("build")),
        ]))
        .unwrap();
        let kinds: Vec<(&str, &str)> = report
            .violations
            .iter()
            .map(|v| (v.to.as_str(), v.kind.as_str()))
            .collect();
        assert_eq!(kinds, vec![("rmm-rs", "dev"), ("rmm-containers", "build")]);
    }

    #[test]
    fn dependency_on_a_non_layer_workspace_package_is_reported() {
        let report = check(&workspace(vec![dep("xtask", Some("dev"))])).unwrap();
        assert_eq!(report.violations.len(), 1);
        assert_eq!(report.violations[0].from, "rmm-stream");
        assert_eq!(report.violations[0].to, "xtask");
        assert!(report.violations[0].reason.contains("outside the layers"));
    }

    #[test]
    fn missing_layer_is_an_error() {
        let mut meta = workspace(vec![]);
        meta["packages"][2]["name"] = json!("rmm-memory");
        let err = check(&meta).unwrap_err();
        assert!(err.contains("`rmm-mr` is not a workspace member"), "{err}");
    }

    #[test]
    fn non_member_packages_are_not_layers() {
        // A package listed in `packages` but not in `workspace_members` does not count.
        let mut meta = workspace(vec![]);
        meta["workspace_members"]
            .as_array_mut()
            .unwrap()
            .retain(|id| id.as_str() != Some("path+file:///ws/rmm-sys#0.1.0"));
        assert!(check(&meta).unwrap_err().contains("`rmm-sys`"));
    }

    #[test]
    fn malformed_metadata_is_an_error() {
        assert!(check(&json!({})).is_err());
        assert!(check(&json!({ "packages": [], "workspace_members": 3 })).is_err());
    }
}
