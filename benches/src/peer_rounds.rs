//! The wrapper cells of the peer comparison over several processes a side
//! (`examples/peer report-rounds`, `run.sh peer-wrap`).
//!
//! The `cuda` and `async` cells time one driver call per operation on both sides, so what
//! differs between the two sides' figures in one run is mostly the process: each side runs
//! once, RMM's first, after different earlier cells (docs/performance.md, "Every difference
//! between the two sides"). `run.sh peer-wrap` runs only these cells, each side in several
//! fresh processes in ABBA order (RMM, rmm-rs, rmm-rs, RMM, ...), and this module reduces the
//! results files: per cell, each side's median over its processes with its range, and the
//! ratio of the medians.
//!
//! Pure: reads [`CellResult`]s, writes a [`Table`].

use crate::median;
use crate::peer::CellResult;
use crate::table::Table;

/// The reduction of several processes' results per side.
#[derive(Debug, Clone)]
pub struct RoundsReport {
    /// One row per cell both sides measured in every process.
    pub table: Table,
    /// Cells reduced.
    pub cells: usize,
    /// Cells whose ratio of medians is above 1.00 (rmm-rs slower).
    pub above: usize,
    /// Cells missing or failed in some process of a side (not reduced).
    pub incomplete: usize,
}

/// A cell's key: workload, resource, threads.
type Key = (String, String, usize);

/// Every `(workload, resource, threads)` in first-seen order.
fn keys(runs: &[Vec<CellResult>]) -> Vec<Key> {
    let mut out: Vec<Key> = Vec::new();
    for cell in runs.iter().flatten() {
        let key = (cell.workload.clone(), cell.resource.clone(), cell.threads);
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// The cell's ns per operation in every process of one side, `None` when one process lacks it
/// or failed it.
fn samples(runs: &[Vec<CellResult>], key: &Key) -> Option<Vec<f64>> {
    runs.iter()
        .map(|cells| {
            cells
                .iter()
                .find(|c| c.workload == key.0 && c.resource == key.1 && c.threads == key.2)
                .and_then(|c| c.ns_per_op.filter(|_| c.status == "ok"))
        })
        .collect()
}

/// Reduces `ours` (rmm-rs's results files, one per process) and `theirs` (RMM's): see the
/// [module documentation](self).
#[must_use]
pub fn rounds_report(ours: &[Vec<CellResult>], theirs: &[Vec<CellResult>]) -> RoundsReport {
    let mut table = Table::new(
        &[
            "workload",
            "resource",
            "threads",
            "processes",
            "rmm-rs median ns/op",
            "rmm-rs min-max",
            "RMM median ns/op",
            "RMM min-max",
            "rmm-rs / RMM (medians)",
        ],
        2,
    )
    .text_columns(&[3, 5, 7]);
    let (mut cells, mut above, mut incomplete) = (0, 0, 0);
    let mut all = ours.to_vec();
    all.extend_from_slice(theirs);
    for key in keys(&all) {
        let (Some(mut a), Some(mut b)) = (samples(ours, &key), samples(theirs, &key)) else {
            incomplete += 1;
            continue;
        };
        if a.is_empty() || b.is_empty() {
            incomplete += 1;
            continue;
        }
        let (ma, mb) = (median(&mut a), median(&mut b));
        let ratio = ma / mb;
        cells += 1;
        if ratio > 1.0 {
            above += 1;
        }
        let range = |s: &[f64]| format!("{:.0}-{:.0}", s[0], s[s.len() - 1]);
        table.row([
            key.0.clone(),
            key.1.clone(),
            key.2.to_string(),
            format!("{} / {}", a.len(), b.len()),
            format!("{ma:.0}"),
            range(&a),
            format!("{mb:.0}"),
            range(&b),
            format!("{ratio:.2}"),
        ]);
    }
    RoundsReport {
        table,
        cells,
        above,
        incomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(side: &str, workload: &str, resource: &str, ns: Option<f64>) -> CellResult {
        CellResult {
            side: side.to_owned(),
            workload: workload.to_owned(),
            resource: resource.to_owned(),
            threads: 1,
            ns_per_op: ns,
            peak_reserved: None,
            status: if ns.is_some() { "ok" } else { "error: x" }.to_owned(),
            peak_live: None,
        }
    }

    #[test]
    fn medians_over_processes_and_their_ratio() {
        let ours = vec![
            vec![
                cell("rmm-rs", "a", "cuda", Some(90.0)),
                cell("rmm-rs", "b", "async", Some(10.0)),
            ],
            vec![
                cell("rmm-rs", "a", "cuda", Some(300.0)),
                cell("rmm-rs", "b", "async", Some(12.0)),
            ],
            vec![
                cell("rmm-rs", "a", "cuda", Some(100.0)),
                cell("rmm-rs", "b", "async", Some(11.0)),
            ],
        ];
        let theirs = vec![
            vec![
                cell("rmm", "a", "cuda", Some(110.0)),
                cell("rmm", "b", "async", Some(10.0)),
            ],
            vec![
                cell("rmm", "a", "cuda", Some(95.0)),
                cell("rmm", "b", "async", Some(9.0)),
            ],
            vec![
                cell("rmm", "a", "cuda", Some(120.0)),
                cell("rmm", "b", "async", Some(10.0)),
            ],
        ];
        let r = rounds_report(&ours, &theirs);
        assert_eq!((r.cells, r.above, r.incomplete), (2, 1, 0));
        let text = r.table.render();
        // a/cuda: medians 100 and 110 (one outlying process of 300 does not move it): 0.91.
        assert!(
            text.contains("| a | cuda | 1 | 3 / 3 | 100 | 90-300 | 110 | 95-120 | 0.91 |"),
            "{text}"
        );
        // b/async: 11 against 10: 1.10, counted above.
        assert!(
            text.contains("| b | async | 1 | 3 / 3 | 11 | 10-12 | 10 | 9-10 | 1.10 |"),
            "{text}"
        );
    }

    #[test]
    fn a_cell_missing_or_failed_in_one_process_is_not_reduced() {
        let ours = vec![
            vec![
                cell("rmm-rs", "a", "cuda", Some(90.0)),
                cell("rmm-rs", "r1", "cuda", Some(5.0)),
            ],
            vec![
                cell("rmm-rs", "a", "cuda", None),
                cell("rmm-rs", "r1", "cuda", Some(5.0)),
            ],
        ];
        let theirs = vec![
            vec![
                cell("rmm", "a", "cuda", Some(110.0)),
                cell("rmm", "r1", "cuda", Some(6.0)),
            ],
            vec![cell("rmm", "a", "cuda", Some(100.0))],
        ];
        let r = rounds_report(&ours, &theirs);
        assert_eq!((r.cells, r.above, r.incomplete), (0, 0, 2));
        assert!(r.table.is_empty());
    }
}
