//! The end-to-end replay comparison with RMM C++ (`bash gpu-bundle/run.sh peer-replay`): the
//! same RMM-format CSV log replayed through rmm-rs's pool by `rmm-replay --resource pool` and
//! through RMM 26.10's `pool_memory_resource` by `rmm_peer --replay`, each side in several
//! fresh processes in ABBA order, reduced here to per-log medians of the replay's wall time.
//!
//! Both sides replay one thread: [`flatten_threads`] rewrites every row's `Thread` to `1`
//! first (a log of several threads makes `rmm-replay` hand each step to the thread that logged
//! it, a wake-up of microseconds that RMM's one-thread loop would not pay).
//!
//! What each side prints and this module reads:
//!
//! - `rmm-replay`: its summary rows `allocations replayed N`, `frees replayed N` and `wall time
//!   X s|ms|µs` ([`parse_rmm_rs`]); a `FAILED` row makes the run a failure;
//! - `rmm_peer --replay`: one line `replay<TAB>steps=N<TAB>wall_ns=W<TAB>peak_reserved=R
//!   <TAB>peak_in_use=U<TAB>status=ok` ([`parse_rmm`]).

use std::fmt::Write as _;

use crate::median;
use crate::table::{ratio, Table};

/// The target: rmm-rs's replay at most this fraction of RMM's.
pub const LIMIT: f64 = 0.30;

/// One process's replay of one log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayRun {
    /// Steps replayed (allocations and frees).
    pub steps: u64,
    /// Wall time of the replay, in nanoseconds.
    pub wall_ns: f64,
}

/// `text` (an RMM-format CSV log) with every row's `Thread` field set to `1`; the header and
/// every other field stay as they are, blank lines are dropped.
///
/// # Errors
///
/// When the header has no `Thread` column or a row has fewer fields than the header names it
/// at (the line is named).
pub fn flatten_threads(text: &str) -> Result<String, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("the log is empty (no header line)")?;
    let column = header
        .trim_start_matches('\u{feff}')
        .split(',')
        .position(|name| name.trim() == "Thread")
        .ok_or("the log's header has no Thread column")?;
    let mut out = String::with_capacity(text.len());
    out.push_str(header);
    out.push('\n');
    for (i, line) in lines.enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let mut fields: Vec<&str> = line.split(',').collect();
        if fields.len() <= column {
            return Err(format!(
                "line {}: {} fields, no Thread field",
                i + 2,
                fields.len()
            ));
        }
        fields[column] = "1";
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    Ok(out)
}

/// A duration as `rmm-replay` prints it (`1.234 s`, `12.345 ms`, `56.7 µs`), in nanoseconds.
fn parse_duration_ns(text: &str) -> Option<f64> {
    let (number, unit) = text.trim().split_once(' ')?;
    let value: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "s" => 1e9,
        "ms" => 1e6,
        "µs" | "us" => 1e3,
        "ns" => 1.0,
        _ => return None,
    };
    value.is_finite().then_some(value * scale)
}

/// The first number of a summary value (`30 of 31` is 30).
fn leading_number(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Reads one `rmm-replay` run's output (one log replayed).
///
/// # Errors
///
/// When the output lacks the allocation, free or wall time rows, or the replay failed.
pub fn parse_rmm_rs(output: &str) -> Result<ReplayRun, String> {
    let (mut allocations, mut frees, mut wall) = (None, None, None);
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("allocations replayed") {
            allocations = leading_number(rest);
        } else if let Some(rest) = line.strip_prefix("frees replayed") {
            frees = leading_number(rest);
        } else if let Some(rest) = line.strip_prefix("wall time") {
            wall = parse_duration_ns(rest);
        } else if let Some(rest) = line.strip_prefix("FAILED") {
            return Err(format!("rmm-replay failed: {}", rest.trim()));
        }
    }
    match (allocations, frees, wall) {
        (Some(a), Some(f), Some(wall_ns)) => Ok(ReplayRun {
            steps: a + f,
            wall_ns,
        }),
        _ => Err("no `allocations replayed`, `frees replayed` and `wall time` rows".to_owned()),
    }
}

/// Reads one `rmm_peer --replay` run's output.
///
/// # Errors
///
/// When there is no `replay` line, a field is missing, or its status is not `ok`.
pub fn parse_rmm(output: &str) -> Result<ReplayRun, String> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.starts_with("replay\t"))
        .ok_or("no `replay` line")?;
    let field = |key: &str| {
        line.split('\t')
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    };
    match field("status") {
        Some("ok") => {}
        Some(other) => return Err(format!("rmm_peer --replay: {other}")),
        None => return Err("the replay line has no status".to_owned()),
    }
    let steps = field("steps").and_then(|s| s.parse().ok());
    let wall_ns = field("wall_ns").and_then(|s| s.parse::<f64>().ok());
    match (steps, wall_ns) {
        (Some(steps), Some(wall_ns)) if wall_ns.is_finite() => Ok(ReplayRun { steps, wall_ns }),
        _ => Err(format!("bad replay line `{line}`")),
    }
}

/// One log's runs, both sides, each a run or why it has none (in the order the processes ran).
#[derive(Debug, Clone, Default)]
pub struct LogRuns {
    /// The log's name as the table shows it.
    pub name: String,
    /// rmm-rs's runs.
    pub ours: Vec<Result<ReplayRun, String>>,
    /// RMM's runs.
    pub theirs: Vec<Result<ReplayRun, String>>,
}

/// The reduced comparison.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// The table, one row per log.
    pub table: Table,
    /// Notes on runs that failed or disagree.
    pub notes: Vec<String>,
    /// Logs compared.
    pub logs: usize,
    /// Logs whose ratio is above [`LIMIT`] or that could not be compared.
    pub above: usize,
    /// Whether every run of every log gave a figure and both sides replayed the same steps.
    pub complete: bool,
}

impl ReplayReport {
    /// The last line: `peer-replay: N logs, M above 0.30`.
    #[must_use]
    pub fn summary_line(&self) -> String {
        format!(
            "peer-replay: {} logs, {} above {LIMIT:.2}",
            self.logs, self.above
        )
    }
}

/// A wall time in the unit that suits it.
fn wall(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

/// Median and range of the runs that gave a figure; `None` without any.
fn reduce(runs: &[Result<ReplayRun, String>]) -> Option<(f64, f64, f64, Vec<u64>)> {
    let ok: Vec<ReplayRun> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    if ok.is_empty() {
        return None;
    }
    let mut walls: Vec<f64> = ok.iter().map(|r| r.wall_ns).collect();
    let m = median(&mut walls);
    let mut steps: Vec<u64> = ok.iter().map(|r| r.steps).collect();
    steps.sort_unstable();
    steps.dedup();
    Some((m, walls[0], walls[walls.len() - 1], steps))
}

/// Reduces every log's runs: per log the steps, each side's median wall time and range, and
/// rmm-rs / RMM. A log counts above the limit when its ratio is above [`LIMIT`] or when a side
/// has no figure at all.
#[must_use]
pub fn replay_report(logs: &[LogRuns]) -> ReplayReport {
    let mut table = Table::new(
        &[
            "log",
            "steps",
            "rmm-rs wall (median)",
            "RMM wall (median)",
            "rmm-rs / RMM",
            "rmm-rs min-max",
            "RMM min-max",
        ],
        1,
    );
    let mut notes = Vec::new();
    let mut above = 0;
    let mut complete = true;
    for log in logs {
        for (side, runs) in [("rmm-rs", &log.ours), ("RMM", &log.theirs)] {
            for (i, r) in runs.iter().enumerate() {
                if let Err(e) = r {
                    complete = false;
                    notes.push(format!("{}: {side} process {}: {e}", log.name, i + 1));
                }
            }
        }
        let (ours, theirs) = (reduce(&log.ours), reduce(&log.theirs));
        let mut steps_cell = String::new();
        if let (Some(o), Some(t)) = (&ours, &theirs) {
            if o.3 != t.3 {
                complete = false;
                notes.push(format!(
                    "{}: the sides replayed different step counts (rmm-rs {:?}, RMM {:?})",
                    log.name, o.3, t.3
                ));
            }
        }
        if let Some(s) = ours.as_ref().or(theirs.as_ref()) {
            let _ = write!(steps_cell, "{}", s.3[0]);
        }
        let med = |r: &Option<(f64, f64, f64, Vec<u64>)>| r.as_ref().map(|r| r.0);
        let range = |r: &Option<(f64, f64, f64, Vec<u64>)>| {
            r.as_ref().map_or_else(
                || "failed".to_owned(),
                |r| format!("{}-{}", wall(r.1), wall(r.2)),
            )
        };
        let (o, t) = (med(&ours), med(&theirs));
        match (o, t) {
            (Some(o), Some(t)) if t > 0.0 && o / t <= LIMIT => {}
            _ => above += 1,
        }
        if ours.is_none() || theirs.is_none() {
            complete = false;
        }
        table.row([
            log.name.clone(),
            steps_cell,
            o.map_or_else(|| "failed".to_owned(), wall),
            t.map_or_else(|| "failed".to_owned(), wall),
            ratio(o, t),
            range(&ours),
            range(&theirs),
        ]);
    }
    ReplayReport {
        table,
        notes,
        logs: logs.len(),
        above,
        complete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RMM_RS_OUT: &str = "sample.csv: pool (initial size 0, no maximum) over the GPU\n\
        \x20 log rows                    64 (3 threads, 1 stream)\n\
        \x20 allocations replayed        32\n\
        \x20 frees replayed              31\n\
        \x20 failures in the log         1 (counted, not replayed)\n\
        \x20 peak bytes in use           132.0 MiB (33 allocations) at line 40\n\
        \x20 wall time                   1.234 ms\n";

    #[test]
    fn flattening_sets_every_thread_to_one() {
        let log = "Size,Thread,Action\n5,140210031454016,allocate\r\n\n7,2,free\n";
        assert_eq!(
            flatten_threads(log).unwrap(),
            "Size,Thread,Action\n5,1,allocate\n7,1,free\n"
        );
        assert!(flatten_threads("Time,Action\n1,free\n")
            .unwrap_err()
            .contains("no Thread column"));
        assert!(flatten_threads("Size,Thread\n5\n")
            .unwrap_err()
            .starts_with("line 2:"));
        assert!(flatten_threads("").is_err());
    }

    #[test]
    fn reads_rmm_replay_summaries() {
        assert_eq!(
            parse_rmm_rs(RMM_RS_OUT).unwrap(),
            ReplayRun {
                steps: 63,
                wall_ns: 1_234_000.0
            }
        );
        let partial = RMM_RS_OUT
            .replace("replayed        32", "replayed        30 of 32")
            .replace("1.234 ms", "2.000 s");
        let r = parse_rmm_rs(&partial).unwrap();
        assert_eq!((r.steps, r.wall_ns), (61, 2e9));
        let micro = RMM_RS_OUT.replace("1.234 ms", "56.7 µs");
        assert!((parse_rmm_rs(&micro).unwrap().wall_ns - 56_700.0).abs() < 1e-6);
        let failed = format!("{RMM_RS_OUT}  FAILED                      ran out of memory\n");
        assert!(parse_rmm_rs(&failed)
            .unwrap_err()
            .contains("ran out of memory"));
        assert!(parse_rmm_rs("rmm-replay: no GPU\n").is_err());
        assert!(parse_rmm_rs(&RMM_RS_OUT.replace("1.234 ms", "1.234 h")).is_err());
    }

    #[test]
    fn reads_rmm_peer_replay_lines() {
        let out = "rmm_peer --replay: RMM 26.10\n\
                   replay\tsteps=63\twall_ns=4100.5\tpeak_reserved=1024\tpeak_in_use=512\tstatus=ok\n";
        assert_eq!(
            parse_rmm(out).unwrap(),
            ReplayRun {
                steps: 63,
                wall_ns: 4100.5
            }
        );
        let bad = "replay\tsteps=63\twall_ns=-\tstatus=error: out of memory at line 9\n";
        assert!(parse_rmm(bad)
            .unwrap_err()
            .contains("out of memory at line 9"));
        assert!(parse_rmm("replay\tsteps=63\tstatus=ok\n").is_err());
        assert!(parse_rmm("nothing\n").is_err());
    }

    fn run(steps: u64, wall_ns: f64) -> Result<ReplayRun, String> {
        Ok(ReplayRun { steps, wall_ns })
    }

    #[test]
    fn medians_ranges_ratio_and_the_count_above() {
        let logs = vec![
            LogRuns {
                name: "fast.csv".into(),
                ours: vec![run(10, 1_000.0), run(10, 3_000.0), run(10, 2_000.0)],
                theirs: vec![run(10, 10_000.0), run(10, 9_000.0), run(10, 20_000.0)],
            },
            LogRuns {
                name: "slow.csv".into(),
                ours: vec![run(4, 2e6), run(4, 4e6)],
                theirs: vec![run(4, 5e6), run(4, 5e6)],
            },
        ];
        let r = replay_report(&logs);
        let text = r.table.render();
        // fast: 2.0 µs / 10.0 µs = 0.20; slow: 3 ms / 5 ms = 0.60.
        assert!(
            text.contains(
                "| fast.csv | 10 | 2.0 µs | 10.0 µs | 0.20 | 1.0 µs-3.0 µs | 9.0 µs-20.0 µs |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| slow.csv | 4 | 3.000 ms | 5.000 ms | 0.60 |"),
            "{text}"
        );
        assert_eq!(r.summary_line(), "peer-replay: 2 logs, 1 above 0.30");
        assert!(r.complete && r.notes.is_empty());
    }

    #[test]
    fn failures_and_disagreements_are_named_and_count_above() {
        let logs = vec![
            LogRuns {
                name: "a.csv".into(),
                ours: vec![run(10, 1.0), Err("no wall time".into())],
                theirs: vec![run(12, 10.0)],
            },
            LogRuns {
                name: "b.csv".into(),
                ours: vec![run(3, 1_000.0)],
                theirs: vec![Err("status=error".into())],
            },
        ];
        let r = replay_report(&logs);
        assert!(!r.complete);
        assert_eq!(r.summary_line(), "peer-replay: 2 logs, 1 above 0.30");
        assert!(r
            .notes
            .iter()
            .any(|n| n == "a.csv: rmm-rs process 2: no wall time"));
        assert!(r.notes.iter().any(|n| n.contains("different step counts")));
        let text = r.table.render();
        assert!(
            text.contains("| b.csv | 3 | 1.0 µs | failed | n/a |"),
            "{text}"
        );
    }
}
