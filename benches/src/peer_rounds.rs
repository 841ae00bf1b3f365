//! The wrapper cells of the peer comparison over several processes a side
//! (`examples/peer report-rounds`; `run.sh peer` after its main comparison, `run.sh
//! peer-wrap` alone).
//!
//! The `cuda` and `async` cells time one driver call per operation on both sides, so what
//! differs between the two sides' figures in one run is mostly the process: each side runs
//! once, RMM's first, after different earlier cells (row 8 of
//! docs/perf-log/2026-11-26-wrapper-differences.md). `run.sh` therefore runs these cells again, alone (a plan with only
//! the `async` and `cuda` resources), each side in several fresh processes in ABBA order (RMM,
//! rmm-rs, rmm-rs, RMM, RMM, rmm-rs, ...), and this module reduces the results files: per
//! cell, each side's median over its processes with its range, and the ratio of the medians.
//! The summary line is [`RoundsReport::summary_line`]: `peer-wrappers: N cells, M above 1.00`.
//!
//! Pure: reads the results files' text ([`read_side`]) into [`CellResult`]s, writes a
//! [`Table`].

use crate::median;
use crate::peer::{read_results, CellResult};
use crate::table::Table;

/// One side's results files, one per process, in the order they ran: the cells of each
/// process and the files' `#` notes (device, versions), each note once, in first-seen order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SideRuns {
    /// The cells of each process.
    pub runs: Vec<Vec<CellResult>>,
    /// The distinct `#` lines of the files.
    pub notes: Vec<String>,
}

/// Reads one side's results files, given as `(name, text)` pairs in process order (the format
/// of `examples/peer run` and `rmm_peer`, [`read_results`]). An error names the file and the
/// line.
pub fn read_side<N: AsRef<str>, T: AsRef<str>>(files: &[(N, T)]) -> Result<SideRuns, String> {
    let mut out = SideRuns::default();
    for (name, text) in files {
        let r = read_results(text.as_ref()).map_err(|e| format!("{}: {e}", name.as_ref()))?;
        for note in r.notes {
            if !out.notes.contains(&note) {
                out.notes.push(note);
            }
        }
        out.runs.push(r.cells);
    }
    Ok(out)
}

/// The reduction of several processes' results per side.
#[derive(Debug, Clone)]
pub struct RoundsReport {
    /// One row per cell both sides measured in every process.
    pub table: Table,
    /// Cells reduced.
    pub cells: usize,
    /// Cells whose ratio of medians, as the table shows it (two decimals), is above 1.00
    /// (rmm-rs slower).
    pub above: usize,
    /// Cells missing or failed in some process of a side (not reduced), as
    /// `workload/resource/threads`.
    pub incomplete: Vec<String>,
}

impl RoundsReport {
    /// The last line of the report: `peer-wrappers: N cells, M above 1.00` (a cell counts
    /// above when its ratio of medians, rmm-rs / RMM, is above 1.00 before rounding).
    #[must_use]
    pub fn summary_line(&self) -> String {
        format!(
            "peer-wrappers: {} cells, {} above 1.00",
            self.cells, self.above
        )
    }

    /// Whether every cell was reduced and there was one: the exit status of `report-rounds`.
    #[must_use]
    pub fn complete(&self) -> bool {
        self.cells > 0 && self.incomplete.is_empty()
    }
}

/// A cell's key: workload, resource, threads.
pub(crate) type Key = (String, String, usize);

/// Every `(workload, resource, threads)` in first-seen order.
pub(crate) fn keys(runs: &[Vec<CellResult>]) -> Vec<Key> {
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
pub(crate) fn samples(runs: &[Vec<CellResult>], key: &Key) -> Option<Vec<f64>> {
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
    let (mut cells, mut above, mut incomplete) = (0, 0, Vec::new());
    let mut all = ours.to_vec();
    all.extend_from_slice(theirs);
    for key in keys(&all) {
        let name = format!("{}/{}/{}", key.0, key.1, key.2);
        let (Some(mut a), Some(mut b)) = (samples(ours, &key), samples(theirs, &key)) else {
            incomplete.push(name);
            continue;
        };
        if a.is_empty() || b.is_empty() {
            incomplete.push(name);
            continue;
        }
        let (ma, mb) = (median(&mut a), median(&mut b));
        // Counted on the figure the table shows, so that a `1.00` row is never counted above.
        let shown = format!("{:.2}", ma / mb);
        cells += 1;
        if shown.parse::<f64>().map_or(true, |r| r > 1.0) {
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
            shown,
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
        assert_eq!((r.cells, r.above), (2, 1));
        assert!(r.incomplete.is_empty() && r.complete());
        assert_eq!(r.summary_line(), "peer-wrappers: 2 cells, 1 above 1.00");
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
        assert_eq!((r.cells, r.above), (0, 0));
        // a/cuda failed in rmm-rs's second process; r1/cuda is missing from RMM's second.
        assert_eq!(r.incomplete, ["a/cuda/1", "r1/cuda/1"]);
        assert!(r.table.is_empty());
        assert!(!r.complete());
        assert_eq!(r.summary_line(), "peer-wrappers: 0 cells, 0 above 1.00");
    }

    #[test]
    fn no_processes_on_a_side_reduces_nothing() {
        let ours = vec![vec![cell("rmm-rs", "a", "cuda", Some(90.0))]];
        let r = rounds_report(&ours, &[]);
        assert_eq!((r.cells, r.incomplete.len()), (0, 1));
        assert!(!r.complete());
        let r = rounds_report(&[], &[]);
        assert_eq!((r.cells, r.incomplete.len()), (0, 0));
        assert!(!r.complete(), "no cell at all is not a complete report");
    }

    /// Six processes in ABBA order (RMM, rmm-rs, rmm-rs, RMM, RMM, rmm-rs) as `run.sh` gives
    /// them: each side's list is its own processes in the order they ran; the order within a
    /// list does not change the median, the range or the ratio.
    #[test]
    fn abba_order_and_an_even_number_of_processes() {
        let ours: Vec<Vec<CellResult>> = [1000.0, 1100.0, 1300.0, 1200.0]
            .iter()
            .map(|&v| vec![cell("rmm-rs", "r64", "async", Some(v))])
            .collect();
        let theirs: Vec<Vec<CellResult>> = [1250.0, 1150.0, 1050.0, 1350.0]
            .iter()
            .map(|&v| vec![cell("rmm", "r64", "async", Some(v))])
            .collect();
        let r = rounds_report(&ours, &theirs);
        // Even counts: the median is the mean of the middle two (1150 and 1200).
        let row = "| r64 | async | 1 | 4 / 4 | 1150 | 1000-1300 | 1200 | 1050-1350 | 0.96 |";
        assert!(r.table.render().contains(row), "{}", r.table.render());
        assert_eq!(r.above, 0);
        let mut reversed = ours.clone();
        reversed.reverse();
        let mut rotated = theirs.clone();
        rotated.rotate_left(1);
        let again = rounds_report(&reversed, &rotated);
        assert_eq!(again.table.render(), r.table.render());
    }

    /// A cell counts above 1.00 by the figure shown: 1004 / 1000 is `1.00`, not above; 1006 /
    /// 1000 is `1.01`, above; equal medians are not above.
    #[test]
    fn above_is_counted_on_the_shown_ratio() {
        let process = |side: &str, values: [f64; 3]| -> Vec<CellResult> {
            ["a", "b", "c"]
                .iter()
                .zip(values)
                .map(|(w, v)| cell(side, w, "cuda", Some(v)))
                .collect()
        };
        let ours = vec![process("rmm-rs", [1004.0, 1006.0, 7.0]); 2];
        let theirs = vec![process("rmm", [1000.0, 1000.0, 7.0]); 2];
        let r = rounds_report(&ours, &theirs);
        assert_eq!((r.cells, r.above), (3, 1));
        let text = r.table.render();
        for row in [
            "| a | cuda | 1 | 2 / 2 | 1004 | 1004-1004 | 1000 | 1000-1000 | 1.00 |",
            "| b | cuda | 1 | 2 / 2 | 1006 | 1006-1006 | 1000 | 1000-1000 | 1.01 |",
            "| c | cuda | 1 | 2 / 2 | 7 | 7-7 | 7 | 7-7 | 1.00 |",
        ] {
            assert!(text.contains(row), "{row} not in\n{text}");
        }
    }

    /// The files as the two sides write them: RMM's (`rmm_peer`: seven fields) and rmm-rs's
    /// (`examples/peer run`: an eighth, the peak live bytes), with their `#` lines.
    #[test]
    fn reads_the_files_both_sides_write() {
        let rmm = |ns_cuda: &str| {
            format!(
                "# side: rmm 26.10.0 (librmm-cu13 wheel, C++ 202002)\n\
                 # device: NVIDIA H100 80GB HBM3; driver CUDA 13.0\n\
                 side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\n\
                 rmm\ta\tasync\t1\t1364.0\t2147483648\tok\n\
                 rmm\ta\tcuda\t1\t{ns_cuda}\t4194304\tok\n"
            )
        };
        let rs = |ns_cuda: &str| {
            format!(
                "# side: rmm-rs 0.1.0\n\
                 # device: NVIDIA H100 80GB HBM3; driver CUDA 13.0; memory 79 GiB total\n\
                 side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\tpeak_live\n\
                 rmm-rs\ta\tasync\t1\t1200.5\t2147483648\tok\t1048576\n\
                 rmm-rs\ta\tcuda\t1\t{ns_cuda}\t4194304\tok\t1048576\n"
            )
        };
        let theirs = read_side(&[
            ("wrap-rmm-1.tsv", rmm("40000.0")),
            ("wrap-rmm-2.tsv", rmm("38000.0")),
            ("wrap-rmm-3.tsv", rmm("39000.0")),
        ])
        .unwrap();
        let ours = read_side(&[
            ("wrap-rmm-rs-1.tsv", rs("36000.0")),
            ("wrap-rmm-rs-2.tsv", rs("-")),
            ("wrap-rmm-rs-3.tsv", rs("37000.0")),
        ])
        .unwrap();
        assert_eq!(theirs.runs.len(), 3);
        assert_eq!(
            theirs.notes,
            [
                "side: rmm 26.10.0 (librmm-cu13 wheel, C++ 202002)",
                "device: NVIDIA H100 80GB HBM3; driver CUDA 13.0"
            ],
            "each note once"
        );
        assert_eq!(ours.runs[1][1].ns_per_op, None);
        let r = rounds_report(&ours.runs, &theirs.runs);
        // a/async: 1200.5 against 1364 in every process; a/cuda has no figure in rmm-rs's
        // second process (its line says `-` although `ok`), so it is not reduced.
        assert_eq!((r.cells, r.above), (1, 0));
        assert_eq!(r.incomplete, ["a/cuda/1"]);
        let text = r.table.render();
        assert!(
            text.contains("| a | async | 1 | 3 / 3 | 1200 | 1200-1200 | 1364 | 1364-1364 | 0.88 |"),
            "{text}"
        );
    }

    #[test]
    fn a_malformed_file_is_named() {
        let err = read_side(&[
            ("good.tsv", "rmm\ta\tcuda\t1\t5.0\t-\tok\n"),
            ("bad.tsv", "rmm\ta\tcuda\t1\n"),
        ])
        .unwrap_err();
        assert!(err.starts_with("bad.tsv: line 1: "), "{err}");
        assert_eq!(read_side::<&str, &str>(&[]).unwrap(), SideRuns::default());
    }
}
