//! Example (guide: "Why did my allocation fail?"): a pool of at most 64 MiB with a history,
//! a workload on two streams, an out-of-memory failure and its report, then a snapshot in
//! PyTorch's format.
//!
//! ```text
//! cargo run -p rmm-rs --example snapshot -- snap.pickle
//! python -m torch.cuda._memory_viz trace_plot snap.pickle -o trace.html
//! python -m torch.cuda._memory_viz segment_plot snap.pickle -o segments.html
//! python python/tests/check_snapshot.py snap.pickle snap.pickle.summary
//! ```
//!
//! It writes `snap.pickle` (the pickle `torch.cuda.memory._dump_snapshot` writes),
//! `snap.pickle.json` (the same as JSON) and `snap.pickle.summary` (one line of counts that
//! `check_snapshot.py` compares with what torch's own tools read). Without a GPU it says so
//! in one line and exits with status 1.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use rmm::prelude::*;
use rmm::{HistoryOptions, HistoryResourceAdaptor, TraceAction};

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example snapshot: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "snap.pickle".to_owned());
    match run(&path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example snapshot failed: {e}");
            ExitCode::FAILURE
        }
    }
}

const MIB: usize = 1 << 20;

fn run(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(32 * MIB).maximum_pool_size(64 * MIB),
    )?;
    let mr = HistoryResourceAdaptor::with_options(pool, HistoryOptions::new().backtraces(true));
    let a = CudaStream::non_blocking()?;
    let b = CudaStream::non_blocking()?;

    // A workload on two streams: some blocks freed, some kept.
    let mut kept = Vec::new();
    for i in 0..12usize {
        let stream = if i % 2 == 0 { a.view() } else { b.view() };
        let bytes = (i + 1) * 256 * 1024;
        let p = mr.allocate(stream, bytes, 256)?;
        if i % 3 == 0 {
            // SAFETY: allocated just above on `stream`, unused.
            unsafe { mr.deallocate(stream, p, bytes, 256)? };
        } else {
            kept.push((stream, p, bytes));
        }
    }
    // Fill to 30 MiB of use, then ask for 40 MiB: over the maximum.
    let used: usize = kept.iter().map(|k| k.2).sum();
    if used < 30 * MIB {
        let bytes = 30 * MIB - used;
        kept.push((a.view(), mr.allocate(a.view(), bytes, 256)?, bytes));
    }
    match mr.allocate(a.view(), 40 * MIB, 256) {
        Ok(_) => return Err("40 MiB should not fit a 64 MiB pool with 30 MiB in use".into()),
        Err(e) => {
            println!("{e}");
            if let Some(report) = e.oom_report() {
                println!("{report}");
            }
        }
    }

    let snapshot = mr.snapshot()?;
    snapshot.write_pickle(BufWriter::new(File::create(path)?))?;
    snapshot.write_json(BufWriter::new(File::create(format!("{path}.json"))?))?;
    let count = |action| snapshot.trace.iter().filter(|e| e.action == action).count();
    let summary = format!(
        "segments={} active_blocks={} reserved={} allocated={} events={} alloc={} \
         free_completed={} oom={}",
        snapshot.segments.len(),
        snapshot.allocated_blocks(),
        snapshot.reserved_bytes(),
        snapshot.allocated_bytes(),
        snapshot.trace.len(),
        count(TraceAction::Alloc),
        count(TraceAction::FreeCompleted),
        count(TraceAction::Oom),
    );
    println!("rmm summary: {summary}");
    writeln!(File::create(format!("{path}.summary"))?, "{summary}")?;

    for (stream, p, bytes) in kept {
        // SAFETY: allocated above on `stream`, unused.
        unsafe { mr.deallocate(stream, p, bytes, 256)? };
    }
    Ok(())
}
