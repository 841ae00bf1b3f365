//! RMM's `async_priming` benchmark (`ASYNC_PRIMING_BENCH`), mirrored: what priming the driver
//! pool (`CudaAsyncMemoryResource` with an initial pool size) buys.
//!
//! Per repetition, for an unprimed resource and one primed with half the device's memory
//! (RMM's `initial_pool_size = total / 2`; less if that much is not free): construct it
//! (timed: RMM's `BM_AsyncConstructionTime`), then allocate 100 blocks of 0.9 % of the
//! device's memory each, synchronously (allocate on the default stream, synchronize: RMM's
//! `allocate_sync`) — the latency of the first and the throughput of the round —, free them
//! all, and allocate them again (the second round, from a pool that has grown). Figures are
//! medians of `--reps` (3) repetitions; the ratio compares the primed resource with the
//! unprimed one in the same run.
//!
//! Arguments: `--reps N`, `--allocations N` (100), `--quick` (one repetition).

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::sizing::{round_down, DeviceMemory, MIB};
use rmm_benches::table::{ratio, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_mr::{CudaAsyncMemoryResource, CudaAsyncOptions, DeviceMemoryResource};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

fn main() {
    bench_main("async_priming", run);
}

#[derive(Default)]
struct Samples {
    construct_ms: Vec<f64>,
    first_us: Vec<f64>,
    round1_gbs: Vec<f64>,
    round2_gbs: Vec<f64>,
}

fn free_all(mr: &CudaAsyncMemoryResource, held: &mut Vec<DevicePtr>, size: usize) -> BenchResult {
    let stream = CudaStreamView::legacy();
    for p in held.drain(..) {
        // SAFETY: `p` came from `mr` with `size` bytes; freed once.
        unsafe { mr.deallocate(stream, p, size, 256)? };
    }
    stream.synchronize()?;
    Ok(())
}

/// One round: `n` synchronous allocations of `size`; returns (first latency in us, GB/s).
fn round(
    mr: &CudaAsyncMemoryResource,
    n: usize,
    size: usize,
    held: &mut Vec<DevicePtr>,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let stream = CudaStreamView::legacy();
    let start = Instant::now();
    let mut first = 0.0;
    for i in 0..n {
        held.push(mr.allocate(stream, size, 256)?);
        stream.synchronize()?;
        if i == 0 {
            first = start.elapsed().as_secs_f64() * 1e6;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((first, (n * size) as f64 / secs / 1e9))
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let reps = args.usize_or("--reps", if quick { 1 } else { 3 })?.max(1);
    let n = args.usize_or("--allocations", 100)?.max(1);
    let mem = DeviceMemory::query()?;
    // RMM: 0.9 % of the total memory each; never more than 90 % of what is free in all.
    let size = round_down((mem.total / 1000 * 9).min(mem.free / 10 * 9 / n), MIB).max(MIB);
    let primed_bytes = round_down((mem.total / 2).min(mem.free / 10 * 9), 2 * MIB);
    println!(
        "{n} allocations of {} MiB per round; primed pool: {} MiB; reps {reps}",
        size / MIB,
        primed_bytes / MIB
    );
    let mut results = Vec::new();
    for (name, initial) in [("unprimed", None), ("primed", Some(primed_bytes))] {
        let mut s = Samples::default();
        for _ in 0..reps {
            eprintln!("[async_priming] {name}");
            let start = Instant::now();
            let mr = CudaAsyncMemoryResource::with_options({
                let mut options = CudaAsyncOptions::new();
                options.initial_pool_size = initial;
                options
            })?;
            s.construct_ms.push(start.elapsed().as_secs_f64() * 1e3);
            let mut held = Vec::with_capacity(n);
            let r1 = round(&mr, n, size, &mut held);
            free_all(&mr, &mut held, size)?;
            let (first, gbs1) = r1?;
            let r2 = round(&mr, n, size, &mut held);
            free_all(&mr, &mut held, size)?;
            let (_, gbs2) = r2?;
            s.first_us.push(first);
            s.round1_gbs.push(gbs1);
            s.round2_gbs.push(gbs2);
        }
        results.push((name, s));
    }
    let mut table = Table::new(
        &[
            "resource",
            "construction (ms)",
            "latency to first (us)",
            "first round (GB/s)",
            "second round (GB/s)",
            "first round: ratio to unprimed",
        ],
        1,
    );
    let base = median(&mut results[0].1.round1_gbs.clone());
    for (name, mut s) in results {
        let r1 = median(&mut s.round1_gbs);
        table.row([
            name.to_owned(),
            format!("{:.2}", median(&mut s.construct_ms)),
            format!("{:.0}", median(&mut s.first_us)),
            format!("{r1:.0}"),
            format!("{:.0}", median(&mut s.round2_gbs)),
            ratio(Some(r1), Some(base)),
        ]);
    }
    println!("\n## Driver pool priming (medians of {reps})\n");
    print!("{}", table.render());
    Ok(())
}
