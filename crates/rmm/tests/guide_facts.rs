//! The user pages state what the code does: every page of the guide is listed where a reader
//! looks for it, dependencies name the package `rmm-rs`, and each default a page quotes is the
//! constant that holds it. A change of a default, or a new page, fails here until the pages
//! that mention it follow.

#![allow(missing_docs)]

use std::path::Path;

/// Every page of `docs/guide/`, in order (read at compile time, so that this runs wherever the
/// test binary does).
const PAGES: [(&str, &str); 15] = [
    (
        "01-introduction.md",
        include_str!("../guide/01-introduction.md"),
    ),
    (
        "02-choosing-a-memory-resource.md",
        include_str!("../guide/02-choosing-a-memory-resource.md"),
    ),
    (
        "03-stream-ordered-allocation.md",
        include_str!("../guide/03-stream-ordered-allocation.md"),
    ),
    (
        "04-pool-allocators.md",
        include_str!("../guide/04-pool-allocators.md"),
    ),
    (
        "05-managed-memory.md",
        include_str!("../guide/05-managed-memory.md"),
    ),
    (
        "06-logging-and-profiling.md",
        include_str!("../guide/06-logging-and-profiling.md"),
    ),
    (
        "07-multiple-devices.md",
        include_str!("../guide/07-multiple-devices.md"),
    ),
    (
        "08-coming-from-rmm.md",
        include_str!("../guide/08-coming-from-rmm.md"),
    ),
    (
        "09-replaying-logs.md",
        include_str!("../guide/09-replaying-logs.md"),
    ),
    (
        "10-fragmentation.md",
        include_str!("../guide/10-fragmentation.md"),
    ),
    (
        "11-pytorch-and-c.md",
        include_str!("../guide/11-pytorch-and-c.md"),
    ),
    (
        "12-cudarc-candle-and-burn.md",
        include_str!("../guide/12-cudarc-candle-and-burn.md"),
    ),
    (
        "13-cuda-graphs.md",
        include_str!("../guide/13-cuda-graphs.md"),
    ),
    (
        "14-ipc-peer-and-pinned.md",
        include_str!("../guide/14-ipc-peer-and-pinned.md"),
    ),
    (
        "15-why-did-my-allocation-fail.md",
        include_str!("../guide/15-why-did-my-allocation-fail.md"),
    ),
];

const GUIDE_RS: &str = include_str!("../src/guide.rs");
const DOCS_README: &str = include_str!("../../../docs/README.md");
const README: &str = include_str!("../../../README.md");
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");
const PERFORMANCE: &str = include_str!("../../../docs/performance.md");
/// The dated run the "Start here" figures quote (docs/perf-log/, a file per run).
const PEER_RUN: &str = include_str!("../../../docs/perf-log/2026-11-29-final-h200.md");

fn page(name: &str) -> &'static str {
    PAGES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
        .unwrap_or_else(|| panic!("no page {name}"))
}

/// The first number after `marker` in `text` that is followed by `unit` (` MiB`, ` blocks`,
/// ...), or `None`.
fn number_after(text: &str, marker: &str, unit: &str) -> Option<u64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let mut from = 0;
    while let Some(at) = rest[from..].find(unit).map(|i| i + from) {
        let digits: String = rest[..at]
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !digits.is_empty() {
            return digits.parse().ok();
        }
        from = at + unit.len();
    }
    None
}

#[test]
fn every_page_is_listed_in_the_index_the_readme_and_the_rustdoc() {
    // In the repository, the list above is the directory (a new page must join it).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("guide");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut on_disk: Vec<String> = entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .collect();
        on_disk.sort();
        let listed: Vec<&str> = PAGES.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, listed, "docs/guide/ and PAGES differ");
    }
    let intro = page("01-introduction.md");
    for (name, _) in PAGES {
        assert!(
            GUIDE_RS.contains(&format!("include_str!(\"../guide/{name}\")")),
            "crates/rmm/src/guide.rs does not include {name}"
        );
        assert!(
            DOCS_README.contains(&format!("(guide/{name})")),
            "docs/README.md does not list {name}"
        );
        if name != "01-introduction.md" {
            assert!(
                intro.contains(&format!("]({name})")),
                "the guide's introduction does not list {name}"
            );
        }
    }
}

#[test]
fn dependencies_name_the_package_rmm_rs() {
    let mut pages: Vec<(&str, &str)> = PAGES.to_vec();
    pages.push(("README.md", README));
    pages.push(("docs/README.md", DOCS_README));
    for (name, text) in pages {
        for wrong in ["\nrmm = ", "`rmm = "] {
            assert!(
                !text.contains(wrong),
                "{name} depends on `rmm`; the package is `rmm-rs` (its library is `rmm`)"
            );
        }
    }
}

#[test]
fn quoted_defaults_are_the_constants() {
    use rmm::mr::{VmmPoolOptions, DEFAULT_MIN_GROWTH_PERCENT};
    use rmm::mr::{DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE};

    // The VMM pool's growth step (guide 10), and the constant is what `new` uses.
    let stated = number_after(
        page("10-fragmentation.md"),
        "`min_growth_percent` (each growth",
        " (`rmm::mr::DEFAULT_MIN_GROWTH_PERCENT`)",
    );
    assert_eq!(stated, Some(DEFAULT_MIN_GROWTH_PERCENT as u64), "guide 10");
    assert_eq!(
        VmmPoolOptions::new(1 << 30).min_growth_percent,
        DEFAULT_MIN_GROWTH_PERCENT
    );

    // The fixed-size resource's block size and count (guide 04).
    let fixed = page("04-pool-allocators.md");
    let marker = "`new(upstream)` uses RMM's";
    assert_eq!(
        number_after(fixed, marker, " MiB").map(|m| m << 20),
        Some(DEFAULT_BLOCK_SIZE as u64),
        "guide 04, block size"
    );
    assert_eq!(
        number_after(fixed, marker, " blocks"),
        Some(DEFAULT_BLOCKS_TO_PREALLOCATE as u64),
        "guide 04, blocks to preallocate"
    );
}

#[test]
fn the_cudarc_page_names_the_pinned_version() {
    // `cudarc = { version = "=0.19.10", ...` in the root manifest.
    let key = "\ncudarc = { version = \"=";
    let at = WORKSPACE_MANIFEST
        .find(key)
        .expect("cudarc is pinned with `=` in the root Cargo.toml");
    let rest = &WORKSPACE_MANIFEST[at + key.len()..];
    let version = &rest[..rest.find('"').unwrap()];
    let page = page("12-cudarc-candle-and-burn.md");
    assert!(
        page.contains(&format!("**cudarc {version}** (`={version}`")),
        "guide 12 does not name cudarc {version}, the version the root Cargo.toml pins"
    );
}

#[test]
fn start_here_names_a_peer_run_that_the_perf_log_has() {
    // The "Start here" figures quote one run by its heading; the run's file must have it, and
    // performance.md's figures must be dated by the same run.
    let heading = "## The peer comparison, full";
    assert!(
        PEER_RUN.contains(heading),
        "docs/perf-log/2026-11-29-final-h200.md lost {heading:?}"
    );
    assert!(
        PEER_RUN.contains("| `a` | 0.084 / 0.012 / 0.006 |")
            && PEER_RUN.contains("| `r64` | 0.42 / 0.030 / 0.015 |"),
        "the perf-log file lost the run's rows"
    );
    assert!(
        PERFORMANCE.contains("**Measured on 2026-11-29**")
            && PERFORMANCE.contains("[perf-log/2026-11-29-final-h200.md]"),
        "performance.md's figures are not dated by the run Start here quotes"
    );
    for (name, text, link) in [
        (
            "README.md",
            README,
            "(docs/perf-log/2026-11-29-final-h200.md)",
        ),
        (
            "guide 01",
            page("01-introduction.md"),
            "(../perf-log/2026-11-29-final-h200.md)",
        ),
    ] {
        assert!(text.contains("## Start here"), "{name} has no Start here");
        assert!(
            text.contains("\"The peer comparison, full\"") && text.contains(link),
            "{name} does not name and link the run its figures come from"
        );
    }
}

#[test]
fn performance_md_stays_a_short_page() {
    // Issue 28: today's figures, method, targets and how to reproduce; dated runs in perf-log/.
    let lines = PERFORMANCE.lines().count();
    assert!(
        lines <= 400,
        "docs/performance.md has {lines} lines (at most 400)"
    );
}

#[test]
fn number_after_reads_the_number_before_its_unit() {
    let text = "a `x` default 12 MiB, then 128 blocks";
    assert_eq!(number_after(text, "`x`", " MiB"), Some(12));
    assert_eq!(number_after(text, "`x`", " blocks"), Some(128));
    assert_eq!(number_after(text, "`y`", " MiB"), None);
    assert_eq!(number_after("`x` no number MiB", "`x`", " MiB"), None);
}
