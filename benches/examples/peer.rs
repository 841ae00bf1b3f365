//! The rmm-rs side of the peer comparison with RMM C++ (`bash gpu-bundle/run.sh peer`; see
//! `rmm_benches::peer` and `docs/performance.md`).
//!
//! ```text
//! peer plan FILE [--quick] [--ops N] [--reps N] [--warmup N] [--threads 1,4,16]
//! peer run FILE OUT.tsv
//! peer report RMM_RS.tsv RMM.tsv
//! peer report-rounds RMM_RS_1.tsv[,RMM_RS_2.tsv...] RMM_1.tsv[,RMM_2.tsv...]
//! peer report-ab BEFORE_1.tsv[,BEFORE_2.tsv...] AFTER_1.tsv[,AFTER_2.tsv...]
//! peer latency-plan FILE [plan options]
//! peer latency-run FILE OUT.tsv
//! peer latency-report RMM_RS.tsv RMM.tsv
//! peer frag-plan FILE [--quick]
//! peer frag-run FILE OUT.tsv
//! peer frag-report RMM_RS.tsv RMM.tsv
//! peer replay-prep DIR [--synthetic OPS] [LOG.csv...]
//! peer report-replay NAME RMM_RS_1.txt[,...] RMM_1.txt[,...] [NAME RMM_RS.txt[,...] RMM.txt[,...]...]
//! peer simulate [--ops N] [--passes N] [--threads 1,4,16] [--free-gib G] [--threaded | --shuffled [--seed S]]
//! ```
//!
//! `plan` generates the workloads, sized from the device's memory, and writes them with the
//! resource configurations to FILE; `run` replays FILE with rmm-rs's resources (and the naive
//! baseline) and writes the results; `report` prints the table of rmm-rs / RMM ratios, every
//! cell with both peaks reserved against the peak live bytes, the table against the naive
//! baseline and, last, the line `peer: N cells compared, M failed` (exit status 1 when a cell
//! failed or none compared). `simulate` needs no GPU: it builds the standard plan for a device
//! with `G` GiB free (default 79, an 80 GB H100) and replays its `pool` and `binning` cells over
//! simulated memory on fake streams (`rmm_benches::reserve`; round robin on one thread, one
//! thread per copy with `--threaded`, or a seeded random copy at each step with `--shuffled
//! [--seed S]`, default seed 1), printing peak reserved against peak live.
//! `rmm_peer FILE OUT.tsv` (`benches/peer/rmm_peer.cpp`) is RMM's `run`. `report-rounds`
//! reduces several processes' results a side (comma-separated lists, each in the order its
//! processes ran) to per-cell medians, with each side's range and the ratio of the medians, and
//! prints last `peer-wrappers: N cells, M above 1.00` (exit status 1 when a cell is missing or
//! failed in some process). `bash gpu-bundle/run.sh peer` runs the `cuda` and `async` cells
//! that way after its main comparison, and `run.sh peer-wrap` alone
//! (`rmm_benches::peer_rounds`). `report-ab` does the same for two builds of rmm-rs, an older
//! `examples/peer` (before) and this one (after), run on the same plan's sub-allocator cells
//! in alternating processes (`run.sh peer-ab BEFORE_PEER_BINARY [ROUNDS]`): per cell the
//! medians of both sides, the ratio after / before, each side's peak reserved memory, and last
//! `peer-ab: N cells, M above 1.10` (exit status 1 when a cell is missing or failed in some
//! process; `rmm_benches::peer_ab`).
//!
//! `latency-plan` is `plan`; `latency-run` replays the plan's sub-allocator cells once more after their warm-up with a clock
//! pair around each call and writes each cell's percentiles; `rmm_peer --latency FILE OUT.tsv`
//! is RMM's; `latency-report` prints both sides' percentiles with issue 32's tail targets and,
//! last, `peer-latency: N cells, M missed, F failed` (exit status 1 when a cell failed or none
//! was measured; `bash gpu-bundle/run.sh peer-latency`, `rmm_benches::peer_latency`).
//!
//! `frag-plan`, `frag-run` and `frag-report` are the same for the fragmentation scenarios
//! (`bash gpu-bundle/run.sh peer-frag`; see `rmm_benches::frag` and
//! `docs/guide/10-fragmentation.md`): the plan holds the maximum `M` (from the device's free
//! memory) and the multi-stream workload with the generator's values it draws; `frag-run`
//! measures rmm-rs's pool, arena, VMM pool and driver pool; `frag-report` prints the tables of
//! RMM issues 1957 and 496 and of the multi-stream workload, RMM's rows beside rmm-rs's, and,
//! last, the line `peer-frag: N rmm-rs rows, M RMM rows, F failed` (exit status 1 when a row
//! failed or a side has none). `rmm_peer --frag FILE OUT.tsv` is RMM's `frag-run`.
//!
//! `replay-prep` and `report-replay` are the end-to-end replay comparison (`bash
//! gpu-bundle/run.sh peer-replay`; `rmm_benches::peer_replay`): `replay-prep` writes into DIR
//! a copy of each RMM-format LOG with every row on thread 1 (`NN-NAME.csv`, both sides replay
//! on one thread) and, with `--synthetic OPS`, two logs of OPS operations of the traces `a`
//! (1 B-4 MiB, about 1,000 live) and `b` (1 B-64 KiB, about 2,000 live) on one thread and
//! one stream; `report-replay` reads, per log, the outputs of `rmm-replay --resource pool`
//! (rmm-rs) and `rmm_peer --replay` (RMM) processes, comma-separated, and prints per log the
//! steps, each side's median wall time and range and rmm-rs / RMM, and last `peer-replay: N
//! logs, M above 0.30` (exit status 1 when a process gave no figure or the sides replayed
//! different step counts).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::process::ExitCode;

use rmm_benches::args::Args;
use rmm_benches::frag::{
    self, frag_report, maximum_for, read_frag_plan, read_frag_results, write_frag_plan, FragPlan,
    Mode, FRAG_RESULTS_HEADER,
};
use rmm_benches::gpu::{describe_device, measure, measure_latency, Spec};
use rmm_benches::peer::{
    read_plan, read_results, report, standard_plan, write_plan, CellResult, PeerPlan, PlanOptions,
    RESULTS_HEADER_LIVE,
};
use rmm_benches::peer_ab::{ab_report, LIMIT};
use rmm_benches::peer_latency::{
    latency_report, read_latency, LatencyRow, LATENCY_HEADER, LATENCY_RESOURCES,
};
use rmm_benches::peer_replay::{
    flatten_threads, parse_rmm, parse_rmm_rs, replay_report, LogRuns, ReplayRun,
    LIMIT as REPLAY_LIMIT,
};
use rmm_benches::peer_rounds::{read_side, rounds_report, SideRuns};
use rmm_benches::sizing::{DeviceMemory, MIB};
use rmm_benches::Trace;
#[cfg(feature = "driver-hooks")]
use rmm_benches::{
    peer::PeerResource,
    reserve::{simulate_reserved, Replay, SimResource},
};
use rmm_stream::{CudaStream, CudaStreamView};

type Error = Box<dyn std::error::Error>;

const USAGE: &str =
    "usage: peer plan FILE [--quick] [--ops N] [--reps N] [--warmup N] [--threads 1,4,16]
       peer run FILE OUT.tsv
       peer report RMM_RS.tsv RMM.tsv
       peer report-rounds RMM_RS_1.tsv[,RMM_RS_2.tsv...] RMM_1.tsv[,RMM_2.tsv...]
       peer report-ab BEFORE_1.tsv[,BEFORE_2.tsv...] AFTER_1.tsv[,AFTER_2.tsv...]
       peer latency-plan FILE [--quick] [--ops N] [--reps N] [--warmup N] [--threads 1,4,16]
       peer latency-run FILE OUT.tsv
       peer latency-report RMM_RS.tsv RMM.tsv
       peer frag-plan FILE [--quick]
       peer frag-run FILE OUT.tsv
       peer frag-report RMM_RS.tsv RMM.tsv
       peer replay-prep DIR [--synthetic OPS] [LOG.csv...]
       peer report-replay NAME RMM_RS_1.txt[,...] RMM_1.txt[,...] [NAME ...]
       peer simulate [--ops N] [--passes N] [--threads 1,4,16] [--free-gib G] [--threaded | --shuffled [--seed S]]";

fn main() -> ExitCode {
    let args = Args::from_env();
    let pos = args.positional(&[
        "--ops",
        "--reps",
        "--warmup",
        "--threads",
        "--passes",
        "--free-gib",
        "--seed",
        "--synthetic",
    ]);
    let result = match pos
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["plan", file] => gpu_only(|| plan(&args, file)),
        ["run", file, out] => gpu_only(|| run(file, out)),
        ["report", ours, theirs] => compare(ours, theirs),
        ["report-rounds", ours, theirs] => compare_rounds(ours, theirs),
        ["report-ab", before, after] => compare_ab(before, after),
        ["latency-plan", file] => gpu_only(|| plan(&args, file)),
        ["latency-run", file, out] => gpu_only(|| latency(file, out)),
        ["latency-report", ours, theirs] => latency_compare(ours, theirs),
        ["frag-plan", file] => gpu_only(|| frag_plan(&args, file)),
        ["frag-run", file, out] => gpu_only(|| frag_run(file, out)),
        ["frag-report", ours, theirs] => frag_compare(ours, theirs),
        ["simulate"] => simulate(&args),
        ["replay-prep", dir, logs @ ..] => replay_prep(&args, dir, logs),
        ["report-replay", rest @ ..] if !rest.is_empty() && rest.len() % 3 == 0 => {
            compare_replay(rest)
        }
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `f` when a GPU is usable; says why not and fails otherwise (the comparison needs one).
fn gpu_only(f: impl FnOnce() -> Result<ExitCode, Error>) -> Result<ExitCode, Error> {
    match rmm_sys::gpu_unavailable_reason() {
        Some(why) => Err(format!("needs a CUDA GPU: {why}").into()),
        None => f(),
    }
}

/// The plan of this run: the standard one, with the command line's options.
fn make_plan(args: &Args, mem: &DeviceMemory) -> Result<PeerPlan, Error> {
    let quick = args.has("--quick");
    let options = PlanOptions {
        ops: args
            .usize_or("--ops", if quick { 5_000 } else { 20_000 })?
            .max(100),
        reps: args.usize_or("--reps", if quick { 1 } else { 3 })?.max(1),
        warmup: args.usize_or("--warmup", 1)?,
        threads: args.usizes_or("--threads", &[1, 4, 16])?,
    };
    Ok(standard_plan(&options, mem))
}

fn plan(args: &Args, file: &str) -> Result<ExitCode, Error> {
    let mem = DeviceMemory::query()?;
    let plan = make_plan(args, &mem)?;
    let mut w =
        BufWriter::new(File::create(file).map_err(|e| format!("cannot create {file}: {e}"))?);
    write_plan(&plan, &mut w)?;
    w.flush()?;
    println!("peer plan: {file}");
    println!("device: {}", describe_device()?);
    println!(
        "reps {}, warmup {}, threads {:?}; resources: {}",
        plan.reps,
        plan.warmup,
        plan.threads,
        plan.resources
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    for w in &plan.workloads {
        println!(
            "workload {}: {} ({} operations, peak {} MiB per thread)",
            w.name,
            w.description,
            w.trace.ops.len(),
            w.trace.peak_bytes() / MIB
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan in `file` and the results file `out`, created with the two lines that say which
/// side and device wrote it (`run` and `latency-run`).
fn open_run(file: &str, out: &str) -> Result<(PeerPlan, BufWriter<File>), Error> {
    let plan = read_plan(BufReader::new(
        File::open(file).map_err(|e| format!("cannot open {file}: {e}"))?,
    ))
    .map_err(|e| format!("{file}: {e}"))?;
    let mut w = BufWriter::new(File::create(out).map_err(|e| format!("cannot create {out}: {e}"))?);
    writeln!(w, "# side: rmm-rs {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(w, "# device: {}", describe_device()?)?;
    Ok((plan, w))
}

fn run(file: &str, out: &str) -> Result<ExitCode, Error> {
    let (plan, mut w) = open_run(file, out)?;
    writeln!(w, "{RESULTS_HEADER_LIVE}")?;
    let mut failed = 0;
    for wl in &plan.workloads {
        for r in &plan.resources {
            for &t in plan.threads.iter().filter(|&&t| r.runs(&wl.trace, t)) {
                let spec = Spec::of_peer(*r, wl.trace.largest());
                let m = measure(spec, &wl.trace, t, plan.warmup, plan.reps);
                let cell = CellResult {
                    side: "rmm-rs".into(),
                    workload: wl.name.clone(),
                    resource: r.name().into(),
                    threads: t,
                    ns_per_op: m.as_ref().ok().map(|c| c.ns_per_op),
                    peak_reserved: m.as_ref().ok().and_then(|c| c.peak_reserved),
                    peak_live: u64::try_from(wl.trace.peak_bytes().saturating_mul(t)).ok(),
                    status: match &m {
                        Ok(_) => "ok".into(),
                        Err(e) => {
                            failed += 1;
                            format!("error: {e}")
                        }
                    },
                };
                println!("{}", cell.to_line());
                writeln!(w, "{}", cell.to_line())?;
                w.flush()?;
            }
        }
    }
    println!("peer run (rmm-rs): {failed} cell(s) failed");
    Ok(ExitCode::SUCCESS)
}

/// `peer latency-run`: each sub-allocator cell of the plan, its calls' latencies
/// ([`rmm_benches::gpu::measure_latency`]).
fn latency(file: &str, out: &str) -> Result<ExitCode, Error> {
    let (plan, mut w) = open_run(file, out)?;
    writeln!(
        w,
        "# an empty clock pair: {:.0} ns",
        rmm_benches::latency::clock_pair_ns(10_000)
    )?;
    writeln!(w, "{LATENCY_HEADER}")?;
    for wl in &plan.workloads {
        for r in plan
            .resources
            .iter()
            .filter(|r| LATENCY_RESOURCES.contains(&r.name()))
        {
            for &t in plan.threads.iter().filter(|&&t| r.runs(&wl.trace, t)) {
                let spec = Spec::of_peer(*r, wl.trace.largest());
                let row = match measure_latency(spec, &wl.trace, t, plan.warmup) {
                    Ok(h) => LatencyRow::from_histogram("rmm-rs", &wl.name, r.name(), t, &h),
                    Err(e) => LatencyRow::failed("rmm-rs", &wl.name, r.name(), t, &e.to_string()),
                };
                println!("{}", row.to_line());
                writeln!(w, "{}", row.to_line())?;
                w.flush()?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `peer latency-report`: both sides' latency files as one table (`rmm_benches::peer_latency`).
fn latency_compare(ours: &str, theirs: &str) -> Result<ExitCode, Error> {
    let read = |path: &str| -> Result<Vec<LatencyRow>, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        for note in text.lines().filter(|l| l.starts_with("# ")) {
            println!("- {}", &note[2..]);
        }
        Ok(read_latency(&text).map_err(|e| format!("{path}: {e}"))?)
    };
    let (a, b) = (read(ours)?, read(theirs)?);
    let r = latency_report(&a, &b);
    println!(
        "\n## Latency per call, ns (allocations and frees of every thread together, one \
         recorded pass after the warm-up; targets for rmm-rs at 16 threads: p99 at most 5x p50, \
         p99.9 at most 20x p50, p99.99 at most 50 us)\n"
    );
    print!("{}", r.table.render());
    println!(
        "peer-latency: {} cells, {} missed, {} failed",
        r.cells, r.missed, r.failed
    );
    Ok(if r.failed == 0 && r.cells > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `peer report-rounds`: each side's results files (comma-separated, one per process, in the
/// order they ran) reduced per cell to medians over the processes (`rmm_benches::peer_rounds`;
/// `run.sh peer` after its main comparison, `run.sh peer-wrap`). Exit status 1 when a cell
/// is missing or failed in some process, or none was reduced.
fn compare_rounds(ours: &str, theirs: &str) -> Result<ExitCode, Error> {
    let (a, b) = (read_all(ours)?, read_all(theirs)?);
    println!(
        "# The wrapper cells (`async`, `cuda`) alone, {} rmm-rs and {} RMM processes in ABBA \
         order (RMM, rmm-rs, rmm-rs, RMM, ...); medians over the processes\n",
        a.runs.len(),
        b.runs.len()
    );
    for note in a.notes.iter().chain(&b.notes) {
        println!("- {note}");
    }
    let r = rounds_report(&a.runs, &b.runs);
    println!(
        "\n## rmm-rs / RMM, medians over the processes (ns per operation; below 1: rmm-rs \
         faster; min-max: the range over one side's processes)\n"
    );
    print!("{}", r.table.render());
    if !r.incomplete.is_empty() {
        println!(
            "\nnot reduced (missing or failed in some process): {}",
            r.incomplete.join(", ")
        );
    }
    println!("\n{}", r.summary_line());
    Ok(if r.complete() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One side's results files, a comma-separated list in the order their processes ran.
fn read_all(list: &str) -> Result<SideRuns, Error> {
    let files = list
        .split(',')
        .filter(|f| !f.is_empty())
        .map(|f| {
            let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
            Ok((f.to_owned(), text))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(read_side(&files)?)
}

/// `peer replay-prep`: the logs both sides of `run.sh peer-replay` replay, written into `dir`:
/// each of `logs` on one thread, and with `--synthetic OPS` the traces `a` and `b` as logs.
fn replay_prep(args: &Args, dir: &str, logs: &[&str]) -> Result<ExitCode, Error> {
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let write = |name: &str, text: &str| -> Result<(), Error> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("{}", path.display());
        Ok(())
    };
    for (i, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log).map_err(|e| format!("cannot read {log}: {e}"))?;
        let flat = flatten_threads(&text).map_err(|e| format!("{log}: {e}"))?;
        let base = std::path::Path::new(log).file_name().map_or_else(
            || "log.csv".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        write(&format!("{:02}-{base}", i + 1), &flat)?;
    }
    if args.has("--synthetic") {
        let ops = args.usize_or("--synthetic", 200_000)?.max(100);
        write(
            "synthetic-a.csv",
            &Trace::random(ops, 1, 4 << 20, 1000, 0x5eeda).to_rmm_log(1),
        )?;
        write(
            "synthetic-b.csv",
            &Trace::random(ops, 1, 64 << 10, 2000, 0x5eedb).to_rmm_log(1),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `peer report-replay`: per log (triples NAME, rmm-rs outputs, RMM outputs) the wall times of
/// both sides' processes reduced to medians (`rmm_benches::peer_replay`). Exit status 1 when
/// some process gave no figure or the sides replayed different step counts.
fn compare_replay(triples: &[&str]) -> Result<ExitCode, Error> {
    let read = |list: &str, parse: fn(&str) -> Result<ReplayRun, String>| {
        list.split(',')
            .filter(|f| !f.is_empty())
            .map(|f| match std::fs::read_to_string(f) {
                Ok(text) => parse(&text),
                Err(e) => Err(format!("cannot read {f}: {e}")),
            })
            .collect::<Vec<_>>()
    };
    let logs: Vec<LogRuns> = triples
        .chunks(3)
        .map(|t| LogRuns {
            name: t[0].to_owned(),
            ours: read(t[1], parse_rmm_rs),
            theirs: read(t[2], parse_rmm),
        })
        .collect();
    let (a, b) = logs
        .first()
        .map_or((0, 0), |l| (l.ours.len(), l.theirs.len()));
    println!(
        "# End to end: each log replayed on one thread through rmm-rs's pool (`rmm-replay \
         --resource pool`) and RMM's pool_memory_resource (`rmm_peer --replay`), {a} rmm-rs and \
         {b} RMM processes a log in ABBA order; wall time of the replay loop, medians over the \
         processes (below {REPLAY_LIMIT:.2}: the target met)\n"
    );
    let r = replay_report(&logs);
    print!("{}", r.table.render());
    if !r.notes.is_empty() {
        println!();
        for note in &r.notes {
            println!("- {note}");
        }
    }
    println!("\n{}", r.summary_line());
    Ok(if r.complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `peer report-ab`: the results files of an older `examples/peer` (before) and of this one
/// (after), one per process, reduced per cell (`rmm_benches::peer_ab`; `run.sh peer-ab`). Exit
/// status 1 when a cell is missing or failed in some process, or none was reduced.
fn compare_ab(before: &str, after: &str) -> Result<ExitCode, Error> {
    let (b, a) = (read_all(before)?, read_all(after)?);
    println!(
        "# Before and after: the sub-allocator cells of one plan, {} processes of the before \
         binary and {} of the after binary in ABBA order (before, after, after, before, ...); \
         medians over the processes\n",
        b.runs.len(),
        a.runs.len()
    );
    for (side, notes) in [("before", &b.notes), ("after", &a.notes)] {
        for note in notes {
            println!("- {side}: {note}");
        }
    }
    let r = ab_report(&b.runs, &a.runs);
    println!(
        "\n## after / before, medians over the processes (ns per operation; above {LIMIT:.2}: \
         flagged `slower`; peak reserved memory of each side, median and highest over its \
         processes, flagged `memory` where the median is higher after)\n"
    );
    print!("{}", r.table.render());
    if !r.incomplete.is_empty() {
        println!(
            "\nnot reduced (missing or failed in some process): {}",
            r.incomplete.join(", ")
        );
    }
    println!("\n{}", r.memory_line());
    println!("{}", r.summary_line());
    Ok(if r.complete() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn compare(ours: &str, theirs: &str) -> Result<ExitCode, Error> {
    let read = |f: &str| -> Result<_, Error> {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
        Ok(read_results(&text).map_err(|e| format!("{f}: {e}"))?)
    };
    let (a, b) = (read(ours)?, read(theirs)?);
    println!("# Peer comparison: rmm-rs against RMM C++ on the same operation sequences\n");
    for note in a.notes.iter().chain(&b.notes) {
        println!("- {note}");
    }
    let r = report(&a.cells, &b.cells);
    println!("\n## rmm-rs / RMM (ns per operation; below 1: rmm-rs faster)\n");
    print!("{}", r.summary.render());
    println!(
        "\n## Every cell (medians; peak reserved memory of each side, and over the peak of the \
         bytes the threads hold live together)\n"
    );
    print!("{}", r.detail.render());
    if let Some(baseline) = &r.baseline {
        println!(
            "\n## rmm-rs against the naive baseline of the same run (ns per operation over the \
             naive best-fit allocator's: one region, one mutex, two B-trees)\n"
        );
        print!("{}", baseline.render());
    }
    println!("\npeer: {} cells compared, {} failed", r.compared, r.failed);
    Ok(if r.failed == 0 && r.compared > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn frag_plan(args: &Args, file: &str) -> Result<ExitCode, Error> {
    let mem = DeviceMemory::query()?;
    let plan = FragPlan::new(maximum_for(mem.free), args.has("--quick"));
    let mut w =
        BufWriter::new(File::create(file).map_err(|e| format!("cannot create {file}: {e}"))?);
    write_frag_plan(&plan, &mut w)?;
    w.flush()?;
    let m = &plan.workload;
    println!("peer-frag plan: {file}");
    println!("device: {}", describe_device()?);
    println!(
        "maximum M: {} MiB (40 % of the free memory, at most 8 GiB); multi-stream workload: {} \
         streams, {} steps, sizes {}-{} B and {}-{} MiB ({} % large), at most {} MiB live; {} \
         draws, {} operations when every allocation succeeds",
        plan.maximum / MIB,
        m.streams,
        m.steps,
        m.small.0,
        m.small.1,
        m.large.0 / MIB,
        m.large.1 / MIB,
        m.large_percent,
        m.budget / MIB,
        plan.draws.len(),
        plan.trace.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn frag_run(file: &str, out: &str) -> Result<ExitCode, Error> {
    let plan = read_frag_plan(BufReader::new(
        File::open(file).map_err(|e| format!("cannot open {file}: {e}"))?,
    ))
    .map_err(|e| format!("{file}: {e}"))?;
    plan.verify().map_err(|e| format!("{file}: {e}"))?;
    let mut w = BufWriter::new(File::create(out).map_err(|e| format!("cannot create {out}: {e}"))?);
    writeln!(w, "# side: rmm-rs {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(w, "# device: {}", describe_device()?)?;
    writeln!(w, "{FRAG_RESULTS_HEADER}")?;
    let max = plan.maximum;
    let mut rows = frag::issue_1957(Mode::Gpu);
    rows.extend(frag::issue_496(Mode::Gpu, max));
    let streams: Vec<CudaStream> = (0..plan.workload.streams)
        .map(|_| CudaStream::non_blocking())
        .collect::<Result<_, _>>()?;
    let views: Vec<CudaStreamView<'_>> = streams.iter().map(CudaStream::view).collect();
    rows.extend(frag::multi_stream(Mode::Gpu, max, &plan.workload, &views));
    let mut failed = 0;
    for r in &rows {
        failed += usize::from(!r.ok());
        println!("{}", r.to_line());
        writeln!(w, "{}", r.to_line())?;
    }
    w.flush()?;
    println!("peer-frag run (rmm-rs): {failed} row(s) failed");
    Ok(ExitCode::SUCCESS)
}

fn frag_compare(ours: &str, theirs: &str) -> Result<ExitCode, Error> {
    let read = |f: &str| -> Result<_, Error> {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
        Ok(read_frag_results(&text).map_err(|e| format!("{f}: {e}"))?)
    };
    let (a, b) = (read(ours)?, read(theirs)?);
    println!("# Fragmentation: rmm-rs and RMM C++ on the same scenarios\n");
    for note in a.notes.iter().chain(&b.notes) {
        println!("- {note}");
    }
    let r = frag_report(&a.rows, &b.rows);
    println!("\n## RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB\n");
    print!("{}", r.issue_1957.render());
    println!(
        "\n## RMM issue 496, scaled: grow with 8 MiB allocations to 75 % of M, free them, then \
         two allocations of 40 % of M\n"
    );
    print!("{}", r.issue_496.render());
    println!(
        "\n## Multi-stream workload (RMM issue 2039's shape), then the largest allocation \
         served on one stream (binary search, 2 MiB resolution) against the free bytes, M\n"
    );
    print!("{}", r.multi_stream.render());
    println!(
        "\npeer-frag: {} rmm-rs rows, {} RMM rows, {} failed",
        r.rows.0, r.rows.1, r.failed
    );
    Ok(if r.failed == 0 && r.rows.0 > 0 && r.rows.1 > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `peer simulate`: the plan's `pool` and `binning` cells over simulated memory (no GPU).
#[cfg(feature = "driver-hooks")]
fn simulate(args: &Args) -> Result<ExitCode, Error> {
    let free = args.usize_or("--free-gib", 79)? << 30;
    let mem = DeviceMemory {
        free,
        total: free + (1 << 30),
    };
    let plan = make_plan(args, &mem)?;
    let passes = args.usize_or("--passes", plan.warmup + plan.reps)?.max(1);
    let replay = if args.has("--threaded") {
        Replay::Threads
    } else if args.has("--shuffled") {
        Replay::Shuffled {
            seed: args.usize_or("--seed", 1)? as u64,
        }
    } else {
        Replay::RoundRobin
    };
    println!(
        "# peer simulate: {} GiB free, {passes} pass(es), {} operations per copy, {}",
        free >> 30,
        plan.workloads.first().map_or(0, |w| w.trace.ops.len()),
        match replay {
            Replay::RoundRobin => "round robin on one thread".to_string(),
            Replay::Threads => "one thread per copy".to_string(),
            Replay::Shuffled { seed } => format!("a random copy at each step, seed {seed}"),
        }
    );
    println!(
        "\n| workload | resource | threads | peak live MiB | peak reserved MiB | reserved / live \
         | device synchronizations |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut failed = 0;
    for wl in &plan.workloads {
        for r in &plan.resources {
            let resource = match *r {
                PeerResource::Pool { .. } => SimResource::Pool,
                PeerResource::Binning { min_exp, max_exp } => {
                    SimResource::Binning { min_exp, max_exp }
                }
                _ => continue,
            };
            for &t in plan.threads.iter().filter(|&&t| r.runs(&wl.trace, t)) {
                match simulate_reserved(resource, &wl.trace, t, passes, replay) {
                    Ok(m) => println!(
                        "| {} | {} | {t} | {} | {} | {:.2} | {} |",
                        wl.name,
                        resource.name(),
                        m.peak_live / MIB,
                        m.peak_reserved / MIB,
                        m.peak_reserved as f64 / m.peak_live.max(1) as f64,
                        m.synchronizations
                    ),
                    Err(e) => {
                        failed += 1;
                        println!(
                            "| {} | {} | {t} | - | - | error: {e} | - |",
                            wl.name,
                            resource.name()
                        );
                    }
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `simulate` replays the plan over simulated memory through rmm-sys's driver hook, which the
/// comparison's build (`--no-default-features`) leaves out on purpose.
#[cfg(not(feature = "driver-hooks"))]
fn simulate(_args: &Args) -> Result<ExitCode, Error> {
    Err(
        "peer simulate needs rmm-benches's feature `driver-hooks` (the default): \
         cargo run --release -p rmm-benches --example peer -- simulate"
            .into(),
    )
}
