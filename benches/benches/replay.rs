//! RMM's `replay` benchmark (`REPLAY_BENCH`), mirrored: recorded memory-event logs (RMM's CSV
//! format, as `LoggingResourceAdaptor` writes it) replayed against every resource, with one
//! thread per thread of the log and the log's global order kept across them (RMM's rules; the
//! replay is `rmm-replay`'s: `rmm_replay::replay_log`).
//!
//! Logs: `rmm-replay`'s sample log (`crates/rmm-replay/samples/sample.csv`), a synthetic log of
//! 4 threads each replaying `gpu_alloc`'s trace (b) (1 B-64 KiB, ~2,000 live; 20,000
//! operations per thread, interleaved round robin, one stream per thread), and any
//! `--log FILE[,FILE]`. Resources: RMM's replay set, `pool`, `arena`, `binning`, `cuda`,
//! `managed`, plus `async`. Each figure: the median wall time of `--reps` (3) replays, each on
//! a fresh resource, as nanoseconds per replayed event; its ratio to `pool` (RMM's default) in
//! the same run; and the peak memory the resource reserved.
//!
//! Arguments: `--log FILE[,FILE]`, `--reps N`, `--only NAME[,NAME]`, `--ops N` (per thread of
//! the synthetic log), `--quick` (one replay, 5,000 operations per thread).

use std::sync::atomic::AtomicUsize;

use rmm_benches::args::Args;
use rmm_benches::table::{mib, ratio, Table};
use rmm_benches::{bench_main, median, BenchResult, Trace};
use rmm_replay::{load, replay_log, Memory, ResourceKind, Workload};

/// `rmm-replay`'s sample log.
const SAMPLE: &str = include_str!("../../crates/rmm-replay/samples/sample.csv");

fn main() {
    bench_main("replay", run);
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let reps = args.usize_or("--reps", if quick { 1 } else { 3 })?.max(1);
    let ops = args
        .usize_or("--ops", if quick { 5_000 } else { 20_000 })?
        .max(100);
    let only = args.names("--only");
    let mut logs: Vec<(String, Workload)> = vec![
        (
            "sample.csv (rmm-replay's)".to_owned(),
            load(SAMPLE.as_bytes())?,
        ),
        (
            format!("synthetic: 4 threads x {ops} operations, 1 B-64 KiB"),
            load(
                Trace::random(ops, 1, 64 << 10, 2000, 0xbe_2c5)
                    .to_rmm_log(4)
                    .as_bytes(),
            )?,
        ),
    ];
    for file in args.names("--log").unwrap_or_default() {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
        logs.push((
            file.clone(),
            load(text.as_bytes()).map_err(|e| format!("{file}: {e}"))?,
        ));
    }
    let kinds = [
        ResourceKind::Pool,
        ResourceKind::Arena,
        ResourceKind::Binning,
        ResourceKind::Cuda,
        ResourceKind::Managed,
        ResourceKind::Async,
    ];
    let mut failures = 0;
    for (name, workload) in &logs {
        let events = workload.steps.len().max(1);
        println!(
            "\n## {name}: {} events, {} thread(s), {} stream(s) (median of {reps})\n",
            workload.steps.len(),
            workload.threads.len(),
            workload.streams.len()
        );
        let mut table = Table::new(
            &[
                "resource",
                "ms per replay",
                "ns per event",
                "ratio to pool",
                "peak reserved",
            ],
            1,
        );
        let mut base = None;
        for kind in kinds {
            if only
                .as_ref()
                .is_some_and(|o| !o.iter().any(|n| n == kind.name()))
            {
                continue;
            }
            eprintln!("[replay] {name} / {}", kind.name());
            let mut walls = Vec::with_capacity(reps);
            let mut peak = 0u64;
            let mut error = None;
            for _ in 0..reps {
                match replay_log(name, workload, kind, Memory::Device, &AtomicUsize::new(0)) {
                    Ok(report) if report.succeeded() => {
                        walls.push(report.summary.wall.as_secs_f64());
                        peak = peak.max(report.summary.peaks.reserved);
                    }
                    Ok(report) => {
                        error = Some(report.summary.failure_message().unwrap_or_else(|| {
                            "allocations could not all be given back".to_owned()
                        }));
                        break;
                    }
                    Err(e) => {
                        error = Some(e.to_string());
                        break;
                    }
                }
            }
            if let Some(e) = error {
                println!("({} failed: {e})", kind.name());
                failures += 1;
                continue;
            }
            let secs = median(&mut walls);
            let ns = secs * 1e9 / events as f64;
            if kind == ResourceKind::Pool {
                base = Some(ns);
            }
            table.row([
                kind.name().to_owned(),
                format!("{:.2}", secs * 1e3),
                format!("{ns:.0}"),
                ratio(Some(ns), base),
                mib(Some(peak)),
            ]);
        }
        print!("{}", table.render());
    }
    if failures > 0 {
        return Err(format!("{failures} replay(s) failed").into());
    }
    Ok(())
}
