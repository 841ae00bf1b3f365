//! Host side of the A/B comparison of the CUDA wrappers (`examples/wrap_ab`): the order in
//! which each round visits the variants, the summary of a variant's samples and the table of
//! medians and ratios. No CUDA call here.
//!
//! `wrap_ab` times, in one process and in alternating rounds, the same trace through
//! `CudaMemoryResource` and `CudaAsyncMemoryResource`, through the driver calls they make
//! (called directly) and through the CUDA runtime calls RMM C++ makes, so that a difference
//! between rmm-rs and RMM in the peer comparison can be told apart from the driver's variance
//! between processes and runs (`docs/perf-log/2026-11-26-wrap-ab.md`,
//! `docs/perf-log/2026-11-26-wrapper-differences.md`).

use std::fmt::Write as _;

/// The order in which round `round` visits `n` variants: rotated by one every second round,
/// and reversed on odd rounds, so that over `2 n` rounds every variant runs in every position
/// and both before and after every other, which spreads drift (clocks, the driver's caches)
/// evenly over the variants.
#[must_use]
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let shift = (round / 2) % n;
    let mut order: Vec<usize> = (0..n).map(|i| (i + shift) % n).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// A variant's samples, summarized (nanoseconds per operation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The fastest sample.
    pub min: f64,
    /// The slowest sample.
    pub max: f64,
    /// How many samples.
    pub count: usize,
}

/// Summarizes `samples`; `None` for none.
#[must_use]
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    let median = crate::median(&mut sorted);
    Some(Summary {
        median,
        min: sorted[0],
        max: sorted[sorted.len() - 1],
        count: sorted.len(),
    })
}

/// One variant's row: its name, what it calls, and its samples (ns per operation).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Short name (`mr-cuda`, `rt-malloc`, ...).
    pub name: String,
    /// What each allocation and free calls.
    pub calls: String,
    /// ns per operation of each timed pass.
    pub samples: Vec<f64>,
}

/// The markdown table of `rows`: median, min and max ns per operation, and the ratio of each
/// median to the median of the row named `baseline` (and to the row named `second`, when
/// given), with the number of passes. Rows without samples show `-`.
#[must_use]
pub fn table(rows: &[Row], baseline: &str, second: Option<&str>) -> String {
    let median_of = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| summarize(&r.samples))
            .map(|s| s.median)
    };
    let base = median_of(baseline);
    let other = second.and_then(median_of);
    let mut out = String::new();
    let _ = write!(
        out,
        "| variant | calls | median ns/op | min | max | / {baseline}"
    );
    if let Some(s) = second {
        let _ = write!(out, " | / {s}");
    }
    out.push_str(" | passes |\n|---|---|---:|---:|---:|---:|");
    if second.is_some() {
        out.push_str("---:|");
    }
    out.push_str("---:|\n");
    let ratio = |m: f64, b: Option<f64>| match b {
        Some(b) if b > 0.0 => format!("{:.3}", m / b),
        _ => "-".to_owned(),
    };
    for r in rows {
        match summarize(&r.samples) {
            Some(s) => {
                let _ = write!(
                    out,
                    "| {} | {} | {:.0} | {:.0} | {:.0} | {}",
                    r.name,
                    r.calls,
                    s.median,
                    s.min,
                    s.max,
                    ratio(s.median, base)
                );
                if second.is_some() {
                    let _ = write!(out, " | {}", ratio(s.median, other));
                }
                let _ = writeln!(out, " | {} |", s.count);
            }
            None => {
                let _ = write!(out, "| {} | {} | - | - | - | -", r.name, r.calls);
                if second.is_some() {
                    out.push_str(" | -");
                }
                out.push_str(" | 0 |\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_visits_every_variant_once() {
        for n in 0..7 {
            for round in 0..20 {
                let mut o = round_order(n, round);
                assert_eq!(o.len(), n);
                o.sort_unstable();
                assert_eq!(o, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn over_two_n_rounds_every_variant_takes_every_position() {
        for n in 1..7 {
            // counts[v][p]: rounds in which variant v ran at position p.
            let mut counts = vec![vec![0usize; n]; n];
            for round in 0..2 * n {
                for (p, v) in round_order(n, round).into_iter().enumerate() {
                    counts[v][p] += 1;
                }
            }
            for row in &counts {
                assert!(row.iter().all(|&c| c >= 1), "n = {n}: {counts:?}");
                assert_eq!(row.iter().sum::<usize>(), 2 * n);
            }
        }
    }

    #[test]
    fn consecutive_rounds_change_the_order() {
        assert_eq!(round_order(3, 0), vec![0, 1, 2]);
        assert_eq!(round_order(3, 1), vec![2, 1, 0]);
        assert_eq!(round_order(3, 2), vec![1, 2, 0]);
        assert_eq!(round_order(3, 3), vec![0, 2, 1]);
        assert_eq!(round_order(2, 2), vec![1, 0]);
    }

    #[test]
    fn summaries() {
        assert_eq!(summarize(&[]), None);
        let s = summarize(&[5.0, 1.0, 3.0, 9.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.count), (4.0, 1.0, 9.0, 4));
        let s = summarize(&[2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.count), (2.0, 2.0, 2.0, 1));
    }

    #[test]
    fn the_table_gives_ratios_to_the_baselines() {
        let row = |name: &str, samples: &[f64]| Row {
            name: name.into(),
            calls: format!("{name} calls"),
            samples: samples.to_vec(),
        };
        let rows = [
            row("rt", &[100.0, 100.0, 100.0]),
            row("drv", &[90.0, 110.0, 95.0]),
            row("mr", &[120.0, 130.0, 125.0]),
            row("missing", &[]),
        ];
        let t = table(&rows, "rt", Some("drv"));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        assert!(lines[0].contains("/ rt") && lines[0].contains("/ drv"));
        assert_eq!(
            lines[2],
            "| rt | rt calls | 100 | 100 | 100 | 1.000 | 1.053 | 3 |"
        );
        assert_eq!(
            lines[3],
            "| drv | drv calls | 95 | 90 | 110 | 0.950 | 1.000 | 3 |"
        );
        assert_eq!(
            lines[4],
            "| mr | mr calls | 125 | 120 | 130 | 1.250 | 1.316 | 3 |"
        );
        assert_eq!(
            lines[5],
            "| missing | missing calls | - | - | - | - | - | 0 |"
        );
        // Without a second baseline, or with a baseline that has no samples.
        let t = table(&rows, "missing", None);
        assert!(
            t.lines()
                .nth(2)
                .unwrap()
                .ends_with("| 100 | 100 | 100 | - | 3 |"),
            "{t}"
        );
    }
}
