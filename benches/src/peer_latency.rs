//! Per-operation latency on both sides of the peer comparison (`run.sh peer-latency`): each
//! sub-allocator cell of the plan (pool, arena, binning, fixed-size; workload, thread count)
//! replayed with one clock pair around each `allocate` and `deallocate` call, by rmm-rs
//! (`examples/peer latency`) and by RMM C++ (`rmm_peer --latency`), the latencies of every
//! thread's calls together reduced to percentiles, and the table of both sides with issue 32's
//! targets for rmm-rs.
//!
//! Both sides measure a cell the same way: build the resource as `run` does, replay the
//! workload `warmup` times untimed, then once more with the clock pairs (threads started
//! together at a barrier, each on its own stream), all calls of all threads together. rmm-rs
//! records into `hdrhistogram` histograms (three significant digits, [`crate::latency`]); RMM's
//! side keeps every value and sorts them (exact). A percentile `q` is the smallest recorded
//! value at or above which lies no more than `1 - q` of the values (nearest rank).
//!
//! # The latency file
//!
//! Text, one cell a line, fields separated by tabs, `#` lines and the header ignored:
//!
//! ```text
//! side workload resource threads ops p50 p99 p99.9 p99.99 max status
//! rmm-rs a pool 16 320000 380 948 3301 55425 633495 ok
//! ```
//!
//! Latencies in ns; a failed cell has `-` in every figure and `error: ...` as its status.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::latency::PERCENTILES;
use crate::table::Table;

/// The header line of a latency file.
pub const LATENCY_HEADER: &str =
    "side\tworkload\tresource\tthreads\tops\tp50\tp99\tp99.9\tp99.99\tmax\tstatus";

/// The resources a latency run measures: the sub-allocators (the wrappers are one driver call).
pub const LATENCY_RESOURCES: [&str; 4] = ["pool", "arena", "binning", "fixed_size"];

/// Issue 32's tail targets for rmm-rs at this many threads.
pub const TARGET_THREADS: usize = 16;
/// p99 at most this many times p50.
pub const P99_OVER_P50: u64 = 5;
/// p99.9 at most this many times p50.
pub const P999_OVER_P50: u64 = 20;
/// p99.99 at most this many ns.
pub const P9999_NS: u64 = 50_000;

/// One cell's latencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyRow {
    /// `rmm-rs` or `rmm`.
    pub side: String,
    /// Workload name.
    pub workload: String,
    /// Resource name.
    pub resource: String,
    /// Thread count.
    pub threads: usize,
    /// Calls recorded (allocations and frees, all threads).
    pub ops: u64,
    /// p50, p99, p99.9, p99.99 and max in ns; `None` when the cell failed.
    pub figures: Option<[u64; 5]>,
    /// `ok`, or `error: ...`.
    pub status: String,
}

impl LatencyRow {
    /// The row of a cell whose calls `h` recorded (ns).
    #[must_use]
    pub fn from_histogram(
        side: &str,
        workload: &str,
        resource: &str,
        threads: usize,
        h: &Histogram<u64>,
    ) -> Self {
        let figures = (!h.is_empty()).then(|| {
            let q = |i: usize| h.value_at_quantile(PERCENTILES[i].0);
            [q(0), q(1), q(2), q(3), h.max()]
        });
        Self {
            side: side.into(),
            workload: workload.into(),
            resource: resource.into(),
            threads,
            ops: h.len(),
            figures,
            status: "ok".into(),
        }
    }

    /// The row of a cell that failed with `why`.
    #[must_use]
    pub fn failed(side: &str, workload: &str, resource: &str, threads: usize, why: &str) -> Self {
        Self {
            side: side.into(),
            workload: workload.into(),
            resource: resource.into(),
            threads,
            ops: 0,
            figures: None,
            status: format!("error: {}", why.replace(['\t', '\n', '\r'], " ")),
        }
    }

    /// The row as one line of a latency file (no newline).
    #[must_use]
    pub fn to_line(&self) -> String {
        let figures = match self.figures {
            Some(f) => f.map(|v| v.to_string()).join("\t"),
            None => ["-"; 5].join("\t"),
        };
        format!(
            "{}\t{}\t{}\t{}\t{}\t{figures}\t{}",
            self.side, self.workload, self.resource, self.threads, self.ops, self.status
        )
    }

    /// The targets this row misses (empty when it meets them or they do not apply: another
    /// side, another thread count, a failed cell).
    #[must_use]
    pub fn misses(&self) -> Vec<String> {
        let Some([p50, p99, p999, p9999, _]) = self.figures else {
            return Vec::new();
        };
        if self.side != "rmm-rs" || self.threads != TARGET_THREADS {
            return Vec::new();
        }
        let mut out = Vec::new();
        if p99 > P99_OVER_P50 * p50 {
            out.push(format!("p99 {p99} > {P99_OVER_P50}x p50 {p50}"));
        }
        if p999 > P999_OVER_P50 * p50 {
            out.push(format!("p99.9 {p999} > {P999_OVER_P50}x p50 {p50}"));
        }
        if p9999 > P9999_NS {
            out.push(format!("p99.99 {p9999} > {P9999_NS} ns"));
        }
        out
    }
}

/// Reads the rows of a latency file; `Err` names the first line it cannot read.
pub fn read_latency(text: &str) -> Result<Vec<LatencyRow>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') || line == LATENCY_HEADER {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |why: &str| format!("line {}: {why}: `{line}`", n + 1);
        if f.len() != 11 {
            return Err(bad("expected 11 tab-separated fields"));
        }
        let threads = f[3].parse().map_err(|_| bad("bad thread count"))?;
        let ops = f[4].parse().map_err(|_| bad("bad operation count"))?;
        let figures = if f[5..10].iter().all(|v| *v == "-") {
            None
        } else {
            let mut v = [0u64; 5];
            for (slot, s) in v.iter_mut().zip(&f[5..10]) {
                *slot = s.parse().map_err(|_| bad("bad latency"))?;
            }
            Some(v)
        };
        rows.push(LatencyRow {
            side: f[0].into(),
            workload: f[1].into(),
            resource: f[2].into(),
            threads,
            ops,
            figures,
            status: f[10].into(),
        });
    }
    Ok(rows)
}

/// The table of both sides' latencies and the targets rmm-rs misses.
#[derive(Debug)]
pub struct LatencyReport {
    /// One row per cell: workload, resource, threads, then each side's p50 / p99 / p99.9 /
    /// p99.99 / max, then the misses.
    pub table: Table,
    /// Cells with rmm-rs figures.
    pub cells: usize,
    /// Those of them that miss a target.
    pub missed: usize,
    /// Cells that failed on either side.
    pub failed: usize,
}

/// Joins `ours` (rmm-rs) and `theirs` (RMM) by cell, in `ours`' order (then cells only RMM has).
#[must_use]
pub fn latency_report(ours: &[LatencyRow], theirs: &[LatencyRow]) -> LatencyReport {
    type Key = (String, String, usize);
    let key = |r: &LatencyRow| (r.workload.clone(), r.resource.clone(), r.threads);
    let mut order: Vec<Key> = Vec::new();
    let mut by: BTreeMap<Key, [Option<&LatencyRow>; 2]> = BTreeMap::new();
    for (side, rows) in [(0, ours), (1, theirs)] {
        for r in rows {
            let slot = by.entry(key(r)).or_insert_with(|| {
                order.push(key(r));
                [None, None]
            });
            slot[side] = Some(r);
        }
    }
    let show = |r: Option<&LatencyRow>| match r.and_then(|r| r.figures) {
        Some(f) => f
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        None => r.map_or("-".to_owned(), |r| r.status.clone()),
    };
    let mut table = Table::new(
        &[
            "workload",
            "resource",
            "threads",
            "rmm-rs p50 / p99 / p99.9 / p99.99 / max",
            "RMM p50 / p99 / p99.9 / p99.99 / max",
            "rmm-rs misses (16 threads)",
        ],
        3,
    )
    .text_columns(&[0, 1, 3, 4, 5]);
    let (mut cells, mut missed, mut failed) = (0, 0, 0);
    for k in &order {
        let [a, b] = by[k];
        if [a, b].iter().flatten().any(|r| r.figures.is_none()) {
            failed += 1;
        }
        let misses = a.map(LatencyRow::misses).unwrap_or_default();
        if a.is_some_and(|r| r.figures.is_some()) {
            cells += 1;
            missed += usize::from(!misses.is_empty());
        }
        table.row([
            k.0.clone(),
            k.1.clone(),
            k.2.to_string(),
            show(a),
            show(b),
            if misses.is_empty() {
                String::new()
            } else {
                misses.join("; ")
            },
        ]);
    }
    LatencyReport {
        table,
        cells,
        missed,
        failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(side: &str, threads: usize, figures: Option<[u64; 5]>) -> LatencyRow {
        LatencyRow {
            side: side.into(),
            workload: "a".into(),
            resource: "pool".into(),
            threads,
            ops: 10,
            figures,
            status: if figures.is_some() { "ok" } else { "error: x" }.into(),
        }
    }

    #[test]
    fn lines_read_back_as_written() {
        let rows = vec![
            row("rmm-rs", 16, Some([380, 948, 3301, 55425, 633495])),
            row("rmm", 4, None),
            LatencyRow::failed("rmm-rs", "b", "arena", 1, "out of\tmemory"),
        ];
        let text = format!(
            "# side: rmm-rs\n{LATENCY_HEADER}\n{}\n",
            rows.iter()
                .map(LatencyRow::to_line)
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert_eq!(read_latency(&text).unwrap(), rows);
        assert_eq!(rows[2].status, "error: out of memory");
        assert!(read_latency("rmm-rs\ta\tpool\t1\t10\t1\t2\t3\t4\n").is_err());
        assert!(read_latency("rmm-rs\ta\tpool\tx\t10\t1\t2\t3\t4\t5\tok\n").is_err());
    }

    #[test]
    fn histogram_rows_take_the_quantiles_and_the_max() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let r = LatencyRow::from_histogram("rmm-rs", "a", "pool", 4, &h);
        let [p50, p99, p999, p9999, max] = r.figures.unwrap();
        assert_eq!(r.ops, 10_000);
        assert!((4_995..=5_005).contains(&p50), "{p50}");
        assert!((9_890..=9_910).contains(&p99), "{p99}");
        assert!((9_980..=10_000).contains(&p999), "{p999}");
        assert!((9_990..=10_010).contains(&p9999), "{p9999}");
        assert!((10_000..=10_010).contains(&max), "{max}");
        let empty = Histogram::<u64>::new(3).unwrap();
        assert_eq!(
            LatencyRow::from_histogram("rmm", "a", "pool", 1, &empty).figures,
            None
        );
    }

    #[test]
    fn targets_apply_to_rmm_rs_at_sixteen_threads() {
        // p99 5x and p99.9 20x p50 exactly, p99.99 50 us exactly: met.
        assert!(
            row("rmm-rs", 16, Some([100, 500, 2_000, 50_000, 1_000_000]))
                .misses()
                .is_empty()
        );
        let m = row("rmm-rs", 16, Some([100, 501, 2_001, 50_001, 1])).misses();
        assert_eq!(m.len(), 3, "{m:?}");
        // Other thread counts, RMM's side and failed cells are not judged.
        assert!(row("rmm-rs", 4, Some([1, 1_000, 1_000, 1_000_000, 1]))
            .misses()
            .is_empty());
        assert!(row("rmm", 16, Some([1, 1_000, 1_000, 1_000_000, 1]))
            .misses()
            .is_empty());
        assert!(row("rmm-rs", 16, None).misses().is_empty());
    }

    #[test]
    fn the_report_joins_sides_and_counts_misses_and_failures() {
        let ours = vec![
            row("rmm-rs", 1, Some([100, 200, 300, 400, 500])),
            row("rmm-rs", 16, Some([100, 600, 700, 800, 900])),
        ];
        let mut theirs = vec![row("rmm", 16, None), row("rmm", 1, Some([1, 2, 3, 4, 5]))];
        theirs[0].status = "error: boom".into();
        let r = latency_report(&ours, &theirs);
        assert_eq!((r.cells, r.missed, r.failed), (2, 1, 1));
        assert_eq!(r.table.len(), 2);
        let text = r.table.render();
        assert!(text.contains("100 / 200 / 300 / 400 / 500"), "{text}");
        assert!(text.contains("1 / 2 / 3 / 4 / 5"), "{text}");
        assert!(text.contains("error: boom"), "{text}");
        assert!(text.contains("p99 600 > 5x p50 100"), "{text}");
    }
}
