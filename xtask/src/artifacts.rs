//! Picking the executables of a GPU bundle out of cargo's JSON messages.

use crate::cargo::{self, Error};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

/// What an executable in the bundle is for; also its folder in the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// A test binary (unit tests of a lib or bin, or an integration test target).
    Test,
    /// A bench target.
    Bench,
    /// An example.
    Example,
    /// A file of the C API and PyTorch part (`capi/`: the library, test programs, Python).
    Capi,
    /// A tool the runner uses (`tools/`: rmm-replay).
    Tool,
}

impl Kind {
    /// The name written to the manifest.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Test => "test",
            Kind::Bench => "bench",
            Kind::Example => "example",
            Kind::Capi => "capi",
            Kind::Tool => "tool",
        }
    }

    /// The bundle folder that holds executables of this kind.
    pub(crate) fn dir(self) -> &'static str {
        match self {
            Kind::Test => "bin",
            Kind::Bench => "bench",
            Kind::Example => "examples",
            Kind::Capi => "capi",
            Kind::Tool => "tools",
        }
    }
}

/// One executable cargo built for a workspace package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Artifact {
    /// What it is for.
    pub(crate) kind: Kind,
    /// The package name (may contain `-`).
    pub(crate) package: String,
    /// The target name (`rmm_sys` for a lib's unit tests, the file stem for tests).
    pub(crate) target: String,
    /// Cargo's kind of the target (`lib`, `test`, `bench`, `example`, ...).
    pub(crate) target_kind: String,
    /// Where cargo put the executable.
    pub(crate) executable: PathBuf,
}

/// Package id → name of the workspace members whose executables go in a bundle (all but xtask).
pub(crate) fn bundle_packages(metadata: &Value) -> Result<BTreeMap<String, String>, Error> {
    let mut map = BTreeMap::new();
    for package in cargo::workspace_packages(metadata)? {
        let (Some(id), Some(name)) = (
            package.get("id").and_then(Value::as_str),
            package.get("name").and_then(Value::as_str),
        ) else {
            return Err(format!("metadata package without id or name: {package}"));
        };
        if name != "xtask" {
            map.insert(id.to_owned(), name.to_owned());
        }
    }
    Ok(map)
}

/// Names of the workspace packages whose bench targets stay out of the bundle: those that say
/// so in their manifest,
///
/// ```toml
/// [package.metadata.gpu-bundle]
/// benches = false
/// ```
///
/// (criterion benchmarks of host code, which run anywhere with `cargo bench`).
pub(crate) fn benches_left_out(metadata: &Value) -> Result<HashSet<String>, Error> {
    let mut out = HashSet::new();
    for package in cargo::workspace_packages(metadata)? {
        if package["metadata"]["gpu-bundle"]["benches"].as_bool() == Some(false) {
            if let Some(name) = package.get("name").and_then(Value::as_str) {
                out.insert(name.to_owned());
            }
        }
    }
    Ok(out)
}

/// `(package, target)` pairs whose test binaries stay out of the bundle (a `tests/*.rs` target
/// or, by the library's target name, its unit tests): those a package lists in its manifest,
///
/// ```toml
/// [package.metadata.gpu-bundle]
/// tests-left-out = ["header", "c_programs"]
/// ```
///
/// (host-only tests, or tests that read the checkout or a cargo build tree, which the GPU
/// machine lacks).
pub(crate) fn tests_left_out(metadata: &Value) -> Result<HashSet<(String, String)>, Error> {
    let mut out = HashSet::new();
    for package in cargo::workspace_packages(metadata)? {
        let Some(name) = package.get("name").and_then(Value::as_str) else {
            continue;
        };
        let listed = &package["metadata"]["gpu-bundle"]["tests-left-out"];
        for target in listed.as_array().into_iter().flatten() {
            let target = target
                .as_str()
                .ok_or_else(|| format!("{name}: tests-left-out holds a non-string: {target}"))?;
            out.insert((name.to_owned(), target.to_owned()));
        }
    }
    Ok(out)
}

/// Names of the workspace packages (xtask aside) whose bench targets go into the bundle: they
/// have some and do not leave them out ([`benches_left_out`]). The bundle builds them, and
/// their examples, without the test-only features: what they measure is the code users run.
pub(crate) fn measuring_packages(metadata: &Value) -> Result<Vec<String>, Error> {
    let left_out = benches_left_out(metadata)?;
    let mut out = Vec::new();
    for package in cargo::workspace_packages(metadata)? {
        let Some(name) = package.get("name").and_then(Value::as_str) else {
            continue;
        };
        if has_target(package, "bench") && name != "xtask" && !left_out.contains(name) {
            out.push(name.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Whether `package` (an entry of `cargo metadata`'s packages) has a target of `kind`.
fn has_target(package: &Value, kind: &str) -> bool {
    package["targets"].as_array().is_some_and(|targets| {
        targets.iter().any(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
    })
}

/// Those of `among` (package names) that have examples. Building a package's examples builds
/// its dev-dependencies too, whose features would reach every example of the same build.
pub(crate) fn with_examples(metadata: &Value, among: &[String]) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for package in cargo::workspace_packages(metadata)? {
        let Some(name) = package.get("name").and_then(Value::as_str) else {
            continue;
        };
        if among.iter().any(|a| a == name) && has_target(package, "example") {
            out.push(name.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Selects the executables of `kind` among cargo's `compiler-artifact` messages.
///
/// Tests are artifacts built in test mode (`profile.test`); benches are bench
/// targets; examples are example targets. Only packages in `packages`
/// (see [`bundle_packages`]) count. Each executable is listed once.
pub(crate) fn select(
    messages: &[Value],
    kind: Kind,
    packages: &BTreeMap<String, String>,
) -> Vec<Artifact> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for msg in messages {
        if msg.get("reason").and_then(Value::as_str) != Some("compiler-artifact") {
            continue;
        }
        let Some(executable) = msg.get("executable").and_then(Value::as_str) else {
            continue;
        };
        let Some(package) = msg
            .get("package_id")
            .and_then(Value::as_str)
            .and_then(|id| packages.get(id))
        else {
            continue;
        };
        let target = &msg["target"];
        let target_kinds: Vec<&str> = target["kind"]
            .as_array()
            .map(|k| k.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let wanted = match kind {
            Kind::Test => msg["profile"]["test"].as_bool() == Some(true),
            Kind::Bench => target_kinds.contains(&"bench"),
            Kind::Example => target_kinds.contains(&"example"),
            Kind::Capi | Kind::Tool => false,
        };
        let Some(target_name) = target["name"].as_str() else {
            continue;
        };
        if wanted && seen.insert(executable.to_owned()) {
            out.push(Artifact {
                kind,
                package: package.clone(),
                target: target_name.to_owned(),
                target_kind: target_kinds
                    .first()
                    .copied()
                    .unwrap_or("unknown")
                    .to_owned(),
                executable: PathBuf::from(executable),
            });
        }
    }
    out
}

/// The file name of each artifact inside its bundle folder, in the same order.
///
/// Tests and benches are `<package>--<target>` (with `--<target kind>` added
/// when a package has two targets of one name, e.g. a lib and a bin);
/// examples are `<target>` as `run.sh example NAME` expects. A name that is
/// still taken twice is an error.
pub(crate) fn file_names(artifacts: &[Artifact]) -> Result<Vec<String>, Error> {
    let base = |a: &Artifact| match a.kind {
        Kind::Example => a.target.clone(),
        Kind::Test | Kind::Bench | Kind::Capi | Kind::Tool => {
            format!("{}--{}", a.package, a.target)
        }
    };
    let mut names = Vec::with_capacity(artifacts.len());
    let mut taken = HashSet::new();
    for a in artifacts {
        let clashes = artifacts
            .iter()
            .filter(|b| b.kind == a.kind && base(b) == base(a))
            .count()
            > 1;
        let name = if clashes && a.kind != Kind::Example {
            format!("{}--{}", base(a), a.target_kind)
        } else {
            base(a)
        };
        if !taken.insert((a.kind, name.clone())) {
            return Err(format!(
                "two {} executables would both be named `{}/{name}` ({} of package {})",
                a.kind.as_str(),
                a.kind.dir(),
                a.target,
                a.package
            ));
        }
        names.push(name);
    }
    Ok(names)
}

/// The library packages built with a test-only feature among cargo's `compiler-artifact`
/// messages, as `package feature` pairs: rmm-sys's `testing` (its fault-injection hook in every
/// driver call) and rmm-stream's `testing` (which turns it on). The bundle's build of the
/// examples that compare with RMM C++ must have none, or every driver call they time runs the
/// hook.
pub(crate) fn test_features(messages: &[Value]) -> Vec<String> {
    const CHECKED: [(&str, &str); 2] = [("rmm_sys", "testing"), ("rmm_stream", "testing")];
    let mut found = Vec::new();
    for msg in messages {
        if msg.get("reason").and_then(Value::as_str) != Some("compiler-artifact") {
            continue;
        }
        let Some(name) = msg["target"]["name"].as_str() else {
            continue;
        };
        let features: Vec<&str> = msg["features"]
            .as_array()
            .map(|f| f.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (lib, feature) in CHECKED {
            let pair = format!("{lib} {feature}");
            if name == lib && features.contains(&feature) && !found.contains(&pair) {
                found.push(pair);
            }
        }
    }
    found
}

/// One line of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// What the executable is for.
    pub(crate) kind: Kind,
    /// Its package.
    pub(crate) package: String,
    /// Its target.
    pub(crate) target: String,
    /// Its path inside the bundle, `/`-separated.
    pub(crate) path: String,
    /// Its size.
    pub(crate) bytes: u64,
}

impl Entry {
    /// The entry as written to `manifest.json`.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "kind": self.kind.as_str(),
            "package": self.package,
            "target": self.target,
            "path": self.path,
            "bytes": self.bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SYS: &str = "path+file:///ws/crates/rmm-sys#0.1.0";
    const RS: &str = "path+file:///ws/crates/rmm#rmm-rs@0.1.0";
    const XTASK: &str = "path+file:///ws/xtask#0.0.0";

    fn metadata() -> Value {
        json!({
            "packages": [
                { "id": SYS, "name": "rmm-sys" },
                { "id": RS, "name": "rmm-rs" },
                { "id": XTASK, "name": "xtask", "metadata": { "gpu-bundle": { "benches": false } } },
                { "id": "registry+https://x#log@0.4.0", "name": "log" },
            ],
            "workspace_members": [SYS, RS, XTASK],
        })
    }

    fn artifact(id: &str, kind: &str, name: &str, test: bool, exe: Option<&str>) -> Value {
        json!({
            "reason": "compiler-artifact",
            "package_id": id,
            "target": { "kind": [kind], "name": name },
            "profile": { "test": test },
            "executable": exe,
        })
    }

    fn messages() -> Vec<Value> {
        vec![
            json!({ "reason": "compiler-message", "package_id": SYS }),
            artifact(SYS, "lib", "rmm_sys", false, None),
            artifact(SYS, "lib", "rmm_sys", true, Some("/t/gpu/deps/rmm_sys-1")),
            artifact(
                SYS,
                "test",
                "gpu_driver",
                true,
                Some("/t/gpu/deps/gpu_driver-2"),
            ),
            artifact(
                SYS,
                "example",
                "probe",
                false,
                Some("/t/gpu/examples/probe"),
            ),
            artifact(SYS, "custom-build", "build-script-build", false, None),
            artifact(RS, "lib", "rmm", true, Some("/t/gpu/deps/rmm-3")),
            artifact(RS, "bench", "pool", true, Some("/t/gpu/deps/pool-4")),
            artifact(XTASK, "bin", "xtask", true, Some("/t/gpu/deps/xtask-5")),
            artifact(RS, "lib", "rmm", true, Some("/t/gpu/deps/rmm-3")),
            json!({ "reason": "build-finished", "success": true }),
        ]
    }

    fn names(kind: Kind) -> Vec<String> {
        let selected = select(&messages(), kind, &bundle_packages(&metadata()).unwrap());
        file_names(&selected).unwrap()
    }

    #[test]
    fn measuring_packages_have_bundled_benches() {
        let mut m = metadata();
        assert!(measuring_packages(&m).unwrap().is_empty());
        let bench = json!([{ "kind": ["bench"], "name": "pool" }, { "kind": ["lib"] }]);
        m["packages"][1]["targets"] = bench.clone();
        m["packages"][2]["targets"] = bench.clone();
        assert_eq!(measuring_packages(&m).unwrap(), vec!["rmm-rs".to_owned()]);
        m["packages"][1]["metadata"] = json!({ "gpu-bundle": { "benches": false } });
        assert!(measuring_packages(&m).unwrap().is_empty());
    }

    #[test]
    fn only_packages_with_examples_build_theirs() {
        let mut m = metadata();
        let both = vec!["rmm-sys".to_owned(), "rmm-rs".to_owned()];
        assert!(with_examples(&m, &both).unwrap().is_empty());
        m["packages"][0]["targets"] = json!([{ "kind": ["bench"], "name": "b" }]);
        m["packages"][1]["targets"] = json!([{ "kind": ["example"], "name": "peer" }]);
        assert_eq!(with_examples(&m, &both).unwrap(), vec!["rmm-rs".to_owned()]);
        assert!(with_examples(&m, &both[..1]).unwrap().is_empty());
    }

    #[test]
    fn packages_can_leave_their_benches_out() {
        let out = benches_left_out(&metadata()).unwrap();
        assert_eq!(out, HashSet::from(["xtask".to_owned()]));
        let mut m = metadata();
        m["packages"][1]["metadata"] = json!({ "gpu-bundle": { "benches": true } });
        m["packages"][0]["metadata"] = json!({ "gpu-bundle": { "benches": false } });
        assert_eq!(
            benches_left_out(&m).unwrap(),
            HashSet::from(["xtask".to_owned(), "rmm-sys".to_owned()])
        );
    }

    #[test]
    fn packages_can_leave_test_targets_out() {
        let mut m = metadata();
        assert!(tests_left_out(&m).unwrap().is_empty());
        m["packages"][0]["metadata"] =
            json!({ "gpu-bundle": { "tests-left-out": ["header", "c_programs"] } });
        assert_eq!(
            tests_left_out(&m).unwrap(),
            HashSet::from([
                ("rmm-sys".to_owned(), "header".to_owned()),
                ("rmm-sys".to_owned(), "c_programs".to_owned()),
            ])
        );
        m["packages"][0]["metadata"] = json!({ "gpu-bundle": { "tests-left-out": [3] } });
        assert!(tests_left_out(&m).is_err());
    }

    #[test]
    fn bundle_packages_are_members_but_xtask() {
        let map = bundle_packages(&metadata()).unwrap();
        assert_eq!(map.values().collect::<Vec<_>>(), vec!["rmm-rs", "rmm-sys"]);
        assert!(bundle_packages(&json!({ "packages": [] })).is_err());
    }

    #[test]
    fn tests_are_test_mode_executables_of_bundle_packages_once() {
        assert_eq!(
            names(Kind::Test),
            vec![
                "rmm-sys--rmm_sys",
                "rmm-sys--gpu_driver",
                "rmm-rs--rmm",
                "rmm-rs--pool"
            ]
        );
        let tests = select(
            &messages(),
            Kind::Test,
            &bundle_packages(&metadata()).unwrap(),
        );
        assert_eq!(
            tests[1].executable,
            PathBuf::from("/t/gpu/deps/gpu_driver-2")
        );
        assert_eq!(tests[1].target_kind, "test");
    }

    #[test]
    fn benches_and_examples_are_picked_by_target_kind() {
        assert_eq!(names(Kind::Bench), vec!["rmm-rs--pool"]);
        assert_eq!(names(Kind::Example), vec!["probe"]);
    }

    #[test]
    fn same_target_name_twice_in_a_package_gets_the_target_kind() {
        let msgs = vec![
            artifact(SYS, "lib", "tool", true, Some("/a")),
            artifact(SYS, "bin", "tool", true, Some("/b")),
        ];
        let packages = bundle_packages(&metadata()).unwrap();
        let selected = select(&msgs, Kind::Test, &packages);
        assert_eq!(
            file_names(&selected).unwrap(),
            vec!["rmm-sys--tool--lib", "rmm-sys--tool--bin"]
        );
    }

    #[test]
    fn clashing_example_names_are_an_error() {
        let msgs = vec![
            artifact(SYS, "example", "demo", false, Some("/a")),
            artifact(RS, "example", "demo", false, Some("/b")),
        ];
        let packages = bundle_packages(&metadata()).unwrap();
        let err = file_names(&select(&msgs, Kind::Example, &packages)).unwrap_err();
        assert!(err.contains("examples/demo"), "{err}");
    }

    #[test]
    fn test_features_in_a_build_are_named() {
        let lib = |name: &str, features: &[&str]| {
            json!({
                "reason": "compiler-artifact",
                "package_id": SYS,
                "target": { "kind": ["lib"], "name": name },
                "profile": { "test": false },
                "features": features,
                "executable": null,
            })
        };
        let clean = vec![
            lib("rmm_sys", &["default"]),
            lib("rmm_stream", &[]),
            lib("rmm_mr", &["testing"]),
            json!({ "reason": "build-finished", "success": true }),
        ];
        assert!(test_features(&clean).is_empty());
        let mut hooked = clean.clone();
        hooked.push(lib("rmm_stream", &["testing"]));
        hooked.push(lib("rmm_sys", &["testing"]));
        hooked.push(lib("rmm_sys", &["testing"]));
        assert_eq!(
            test_features(&hooked),
            vec![
                "rmm_stream testing".to_owned(),
                "rmm_sys testing".to_owned()
            ]
        );
    }
}
