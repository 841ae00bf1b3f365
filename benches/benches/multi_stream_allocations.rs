//! RMM's `multi_stream_allocations` benchmark (`MULTI_STREAM_ALLOCATIONS_BENCH`), mirrored:
//! does the allocator serialize independent streams?
//!
//! One iteration: for each of `--kernels` kernels (4), on stream `i % streams` of a stream pool
//! (`CudaStreamPool`, RMM's `cuda_stream_pool`), allocate 8 bytes (RMM: a one-element
//! `device_uvector<int64_t>`), launch a one-thread kernel that spins `--cycles` clock cycles
//! (1,000,000, RMM's) and writes to them, and free them on the same stream; then synchronize
//! the device. If the allocator lets the streams run independently, `s` streams finish an
//! iteration up to `min(s, kernels)` times faster than one; an allocator that synchronizes
//! (`cuMemFree`) or makes a stream wait for another's kernel does not.
//!
//! For each resource (`cuda`, `cuda_async`, `pool` with half the free memory, `arena` with 90 %
//! of it, `binning` 256 KiB..4 MiB over such a pool), each stream count (1, 2, 4) and without
//! and with pre-warming (RMM's `run_prewarm`: one allocation per stream, freed on it, before
//! the first iteration), on a fresh resource and stream pool: the **cold** time (the first
//! iteration) and the **warm** time (median of the next `--iters`, 20), and the warm speed-up
//! over one stream in the same run.
//!
//! Arguments: `--kernels N`, `--streams 1,2,4`, `--iters N`, `--cycles N`, `--only NAME,...`,
//! `--quick` (5 iterations).

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::gpu::{build, Spec, SpinKernel};
use rmm_benches::sizing::DeviceMemory;
use rmm_benches::table::{ratio, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_mr::DeviceMemoryResource;
use rmm_stream::{CudaStreamPool, StreamFlags};

fn main() {
    bench_main("multi_stream_allocations", run);
}

/// One iteration: `kernels` allocate-launch-free rounds over the pool's streams, then a device
/// synchronization. Returns its wall time in microseconds.
fn iteration(
    mr: &dyn DeviceMemoryResource,
    pool: &CudaStreamPool,
    kernel: &SpinKernel,
    kernels: usize,
    cycles: u64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let start = Instant::now();
    for i in 0..kernels {
        let stream = pool.get_stream_by_id(i);
        let p = mr.allocate(stream, 8, 256)?;
        // SAFETY: `p` holds 8 bytes usable on `stream`, a live stream of the current context.
        let launched = unsafe { kernel.launch(stream.as_raw(), p, cycles) };
        // SAFETY: `p` came from `mr` with 8 bytes; freed once, on the stream that uses it.
        unsafe { mr.deallocate(stream, p, 8, 256)? };
        launched?;
    }
    rmm_sys::device_synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e6)
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let kernels = args.usize_or("--kernels", 4)?;
    let streams = args.usizes_or("--streams", &[1, 2, 4])?;
    let iters = args.usize_or("--iters", if quick { 5 } else { 20 })?.max(1);
    let cycles = args.usize_or("--cycles", 1_000_000)? as u64;
    let only = args.names("--only");

    let kernel = SpinKernel::load()?;
    let mem = DeviceMemory::query()?;
    let specs = [
        Spec::Cuda,
        Spec::Async,
        Spec::Pool {
            initial: mem.half_free(),
        },
        Spec::Arena {
            bytes: mem.arena_bytes(),
        },
        Spec::VmmPool {
            initial: mem.half_free(),
            maximum: mem.arena_bytes(),
            min_growth_percent: None,
        },
        Spec::Binning {
            pool_initial: mem.half_free(),
            min_exp: 18,
            max_exp: 22,
        },
    ];
    println!("kernels per iteration: {kernels}; spin: {cycles} cycles; warm iterations: {iters}");
    let mut table = Table::new(
        &[
            "resource",
            "pre-warm",
            "streams",
            "cold: first iteration (us)",
            "warm: median (us)",
            "warm speed-up over 1 stream",
            "ideal",
        ],
        2,
    );
    let mut failures = 0;
    for spec in specs {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == spec.name()))
        {
            continue;
        }
        for prewarm in [false, true] {
            let mut one_stream = None;
            for &s in &streams {
                eprintln!(
                    "[multi_stream_allocations] {} / prewarm {prewarm} / {s} stream(s)",
                    spec.name()
                );
                let measured = (|| -> Result<(f64, f64), Box<dyn std::error::Error>> {
                    let pool = CudaStreamPool::new(s, StreamFlags::SyncDefault)?;
                    let built = build(spec)?;
                    let mr = &*built.mr;
                    if prewarm {
                        let held: Vec<_> = (0..s)
                            .map(|i| {
                                let stream = pool.get_stream_by_id(i);
                                mr.allocate(stream, 8, 256).map(|p| (stream, p))
                            })
                            .collect::<Result<_, _>>()?;
                        for (stream, p) in held {
                            // SAFETY: `p` came from `mr` with 8 bytes on `stream`, freed once.
                            unsafe { mr.deallocate(stream, p, 8, 256)? };
                        }
                        rmm_sys::device_synchronize()?;
                    }
                    let cold = iteration(mr, &pool, &kernel, kernels, cycles)?;
                    let mut warm = (0..iters)
                        .map(|_| iteration(mr, &pool, &kernel, kernels, cycles))
                        .collect::<Result<Vec<f64>, _>>()?;
                    drop(built);
                    Ok((cold, median(&mut warm)))
                })();
                match measured {
                    Ok((cold, warm)) => {
                        if s == 1 {
                            one_stream = Some(warm);
                        }
                        table.row([
                            spec.name().to_owned(),
                            if prewarm { "yes" } else { "no" }.to_owned(),
                            s.to_string(),
                            format!("{cold:.0}"),
                            format!("{warm:.0}"),
                            ratio(one_stream, Some(warm)),
                            format!("{}", s.min(kernels)),
                        ]);
                    }
                    Err(e) => {
                        println!(
                            "({} with {s} stream(s), pre-warm {prewarm}, failed: {e})",
                            spec.name()
                        );
                        failures += 1;
                    }
                }
            }
        }
    }
    println!("\n## Independent streams: iteration time and speed-up over one stream\n");
    print!("{}", table.render());
    if failures > 0 {
        return Err(format!("{failures} configuration(s) failed").into());
    }
    Ok(())
}
