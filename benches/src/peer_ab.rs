//! Before and after: the peer comparison's rmm-rs cells measured by two builds of rmm-rs
//! (`examples/peer report-ab`; `run.sh peer-ab BEFORE_PEER_BINARY [ROUNDS]`).
//!
//! `run.sh peer-ab` makes one plan with the bundle's `examples/peer plan`, keeps its
//! sub-allocator resources (`pool`, `arena`, `binning`, `fixed_size`), and runs it with the
//! *before* binary (an `examples/peer` built from an older tree) and the bundle's own
//! (*after*) in alternating fresh processes, ABBA order (before, after, after, before, ...),
//! ROUNDS a side. Both binaries write the results format of [`crate::peer`] (`examples/peer
//! run`, unchanged since the plan format's first version), so this module reads them with
//! [`read_side`](crate::peer_rounds::read_side) and reduces them per cell: each side's median
//! ns per operation over its processes with its range, the ratio after / before of the
//! medians (a cell above [`LIMIT`], as the table shows it, is flagged `slower`), and each
//! side's peak reserved memory (median and highest over its processes; a cell whose median is
//! higher after is flagged `memory`). The last line is [`AbReport::summary_line`]:
//! `peer-ab: N cells, M above 1.10`.
//!
//! Pure: results files' cells in, a [`Table`] out.

use crate::median;
use crate::peer::CellResult;
use crate::peer_rounds::{keys, samples, Key};
use crate::table::Table;

/// The ratio after / before above which a cell is flagged (issue 28: every sub-allocator cell
/// within 1.10x of before).
pub const LIMIT: f64 = 1.10;

const MIB: f64 = (1u64 << 20) as f64;

/// The reduction of both sides' processes.
#[derive(Debug, Clone)]
pub struct AbReport {
    /// One row per cell both sides measured in every process.
    pub table: Table,
    /// Cells reduced.
    pub cells: usize,
    /// Cells whose ratio after / before, as the table shows it (two decimals), is above
    /// [`LIMIT`].
    pub slower: usize,
    /// Cells whose median peak reserved is higher after than before.
    pub more_memory: usize,
    /// Cells missing or failed in some process of a side (not reduced), as
    /// `workload/resource/threads`.
    pub incomplete: Vec<String>,
}

impl AbReport {
    /// The last line of the report: `peer-ab: N cells, M above 1.10`.
    #[must_use]
    pub fn summary_line(&self) -> String {
        format!(
            "peer-ab: {} cells, {} above {LIMIT:.2}",
            self.cells, self.slower
        )
    }

    /// The line before it: how many cells reserve more memory after.
    #[must_use]
    pub fn memory_line(&self) -> String {
        format!(
            "memory: {} of {} cells with a higher median peak reserved after than before",
            self.more_memory, self.cells
        )
    }

    /// Whether every cell was reduced and there was one: the exit status of `report-ab`.
    #[must_use]
    pub fn complete(&self) -> bool {
        self.cells > 0 && self.incomplete.is_empty()
    }
}

/// The cell's peak reserved bytes in every process of one side, `None` when one lacks it.
fn peaks(runs: &[Vec<CellResult>], key: &Key) -> Option<Vec<f64>> {
    runs.iter()
        .map(|cells| {
            cells
                .iter()
                .find(|c| c.workload == key.0 && c.resource == key.1 && c.threads == key.2)
                .and_then(|c| c.peak_reserved)
                .map(|b| b as f64)
        })
        .collect()
}

/// Reduces `before` (the older binary's results files, one per process) and `after` (the
/// bundle's): see the [module documentation](self).
#[must_use]
pub fn ab_report(before: &[Vec<CellResult>], after: &[Vec<CellResult>]) -> AbReport {
    let mut table = Table::new(
        &[
            "workload",
            "resource",
            "threads",
            "processes (before / after)",
            "before median ns/op",
            "before min-max",
            "after median ns/op",
            "after min-max",
            "after / before",
            "peak reserved MiB before: median (max)",
            "after: median (max)",
            "flag",
        ],
        2,
    )
    .text_columns(&[3, 5, 7, 9, 10, 11]);
    let (mut cells, mut slower, mut more_memory) = (0, 0, 0);
    let mut incomplete = Vec::new();
    let mut all = before.to_vec();
    all.extend_from_slice(after);
    for key in keys(&all) {
        let name = format!("{}/{}/{}", key.0, key.1, key.2);
        let (Some(mut b), Some(mut a)) = (samples(before, &key), samples(after, &key)) else {
            incomplete.push(name);
            continue;
        };
        if a.is_empty() || b.is_empty() {
            incomplete.push(name);
            continue;
        }
        let (mb, ma) = (median(&mut b), median(&mut a));
        // Counted on the figure the table shows, so that a `1.10` row is never flagged.
        let shown = format!("{:.2}", ma / mb);
        cells += 1;
        let mut flags = Vec::new();
        if shown.parse::<f64>().map_or(true, |r| r > LIMIT) {
            slower += 1;
            flags.push("slower");
        }
        let peak_cell = |p: &mut Option<Vec<f64>>| -> (Option<f64>, String) {
            match p.as_deref_mut() {
                Some(v) if !v.is_empty() => {
                    let m = median(v);
                    let max = v[v.len() - 1];
                    (Some(m), format!("{:.0} ({:.0})", m / MIB, max / MIB))
                }
                _ => (None, "n/a".to_owned()),
            }
        };
        let (pb, pb_text) = peak_cell(&mut peaks(before, &key));
        let (pa, pa_text) = peak_cell(&mut peaks(after, &key));
        if let (Some(pb), Some(pa)) = (pb, pa) {
            if pa > pb {
                more_memory += 1;
                flags.push("memory");
            }
        }
        let range = |s: &[f64]| format!("{:.0}-{:.0}", s[0], s[s.len() - 1]);
        table.row([
            key.0.clone(),
            key.1.clone(),
            key.2.to_string(),
            format!("{} / {}", b.len(), a.len()),
            format!("{mb:.0}"),
            range(&b),
            format!("{ma:.0}"),
            range(&a),
            shown,
            pb_text,
            pa_text,
            flags.join(", "),
        ]);
    }
    AbReport {
        table,
        cells,
        slower,
        more_memory,
        incomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer_rounds::read_side;

    fn cell(workload: &str, resource: &str, threads: usize, ns: f64, peak_mib: u64) -> CellResult {
        CellResult {
            side: "rmm-rs".to_owned(),
            workload: workload.to_owned(),
            resource: resource.to_owned(),
            threads,
            ns_per_op: Some(ns),
            peak_reserved: Some(peak_mib << 20),
            status: "ok".to_owned(),
            peak_live: Some(1 << 20),
        }
    }

    #[test]
    fn medians_ratio_and_flags() {
        // Three processes a side; pool/a/16 is 20 % slower after, arena/b/1 the same speed
        // but one doubling more memory, binning/r64/4 faster.
        let before: Vec<Vec<CellResult>> =
            [(100.0, 30.0, 50.0), (120.0, 31.0, 52.0), (90.0, 29.0, 51.0)]
                .iter()
                .map(|&(p, a, b)| {
                    vec![
                        cell("a", "pool", 16, p, 54824),
                        cell("b", "arena", 1, a, 1000),
                        cell("r64", "binning", 4, b, 7936),
                    ]
                })
                .collect();
        let after: Vec<Vec<CellResult>> = [
            (130.0, 30.0, 40.0),
            (115.0, 30.2, 41.0),
            (120.0, 29.8, 39.0),
        ]
        .iter()
        .map(|&(p, a, b)| {
            vec![
                cell("a", "pool", 16, p, 54824),
                cell("b", "arena", 1, a, 2000),
                cell("r64", "binning", 4, b, 7936),
            ]
        })
        .collect();
        let r = ab_report(&before, &after);
        assert_eq!((r.cells, r.slower, r.more_memory), (3, 1, 1));
        assert!(r.complete());
        assert_eq!(r.summary_line(), "peer-ab: 3 cells, 1 above 1.10");
        assert_eq!(
            r.memory_line(),
            "memory: 1 of 3 cells with a higher median peak reserved after than before"
        );
        let text = r.table.render();
        for row in [
            "| a | pool | 16 | 3 / 3 | 100 | 90-120 | 120 | 115-130 | 1.20 | 54824 (54824) | 54824 (54824) | slower |",
            "| b | arena | 1 | 3 / 3 | 30 | 29-31 | 30 | 30-30 | 1.00 | 1000 (1000) | 2000 (2000) | memory |",
            "| r64 | binning | 4 | 3 / 3 | 51 | 50-52 | 40 | 39-41 | 0.78 | 7936 (7936) | 7936 (7936) |  |",
        ] {
            assert!(text.contains(row), "{row} not in\n{text}");
        }
    }

    /// 1.10 as shown is within the limit; 1.11 is above; the peak's median and max differ.
    #[test]
    fn the_limit_is_counted_on_the_shown_ratio() {
        let before = vec![
            vec![
                cell("a", "pool", 1, 1000.0, 100),
                cell("b", "pool", 1, 1000.0, 100),
            ],
            vec![
                cell("a", "pool", 1, 1000.0, 300),
                cell("b", "pool", 1, 1000.0, 100),
            ],
        ];
        let after = vec![
            vec![
                cell("a", "pool", 1, 1104.0, 100),
                cell("b", "pool", 1, 1106.0, 100),
            ],
            vec![
                cell("a", "pool", 1, 1104.0, 100),
                cell("b", "pool", 1, 1106.0, 100),
            ],
        ];
        let r = ab_report(&before, &after);
        assert_eq!((r.cells, r.slower, r.more_memory), (2, 1, 0));
        let text = r.table.render();
        assert!(
            text.contains("| 1.10 | 200 (300) | 100 (100) |  |"),
            "{text}"
        );
        assert!(
            text.contains("| 1.11 | 100 (100) | 100 (100) | slower |"),
            "{text}"
        );
    }

    #[test]
    fn a_cell_missing_or_failed_on_a_side_is_not_reduced() {
        let mut failed = cell("a", "arena", 4, 10.0, 1);
        failed.ns_per_op = None;
        failed.status = "error: out of memory".to_owned();
        let before = vec![vec![
            cell("a", "pool", 1, 10.0, 1),
            cell("a", "arena", 4, 10.0, 1),
        ]];
        let after = vec![vec![failed], vec![cell("a", "arena", 4, 10.0, 1)]];
        let r = ab_report(&before, &after);
        assert_eq!(r.cells, 0);
        // pool/a/1 is missing after; arena/a/4 failed in the first process after.
        assert_eq!(r.incomplete, ["a/pool/1", "a/arena/4"]);
        assert!(!r.complete());
        assert_eq!(r.summary_line(), "peer-ab: 0 cells, 0 above 1.10");
        assert!(
            !ab_report(&[], &[]).complete(),
            "nothing at all is not complete"
        );
    }

    /// A cell without a peak on one side is compared on speed alone.
    #[test]
    fn no_peak_reads_n_a_and_is_not_flagged() {
        let mut no_peak = cell("b", "pool", 1, 10.0, 0);
        no_peak.peak_reserved = None;
        let r = ab_report(&[vec![no_peak]], &[vec![cell("b", "pool", 1, 10.0, 5)]]);
        assert_eq!((r.cells, r.more_memory), (1, 0));
        assert!(r.table.render().contains("| 1.00 | n/a | 5 (5) |  |"));
    }

    /// The files as `examples/peer run` writes them, in both binaries (the format of
    /// `0a426c6` and of today: seven fields and the peak live bytes), read per process.
    #[test]
    fn reads_the_files_both_binaries_write() {
        let file = |ns: &str, peak: u64| {
            format!(
                "# side: rmm-rs 0.1.0\n\
                 # device: NVIDIA H200; driver CUDA 13.0; memory 140 GiB total, 139 GiB free\n\
                 side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\tpeak_live\n\
                 rmm-rs\tr64\tpool\t16\t{ns}\t{peak}\tok\t42049339392\n"
            )
        };
        let before = read_side(&[
            ("ab-before-1.tsv", file("30.0", 40097 << 20)),
            ("ab-before-2.tsv", file("26.0", 40097 << 20)),
        ])
        .unwrap();
        let after = read_side(&[
            ("ab-after-1.tsv", file("27.6", 52448 << 20)),
            ("ab-after-2.tsv", file("28.4", 40096 << 20)),
        ])
        .unwrap();
        let r = ab_report(&before.runs, &after.runs);
        assert_eq!((r.cells, r.slower, r.more_memory), (1, 0, 1));
        assert!(
            r.table.render().contains(
                "| r64 | pool | 16 | 2 / 2 | 28 | 26-30 | 28 | 28-28 | 1.00 | 40097 (40097) | 46272 (52448) | memory |"
            ),
            "{}",
            r.table.render()
        );
    }
}
