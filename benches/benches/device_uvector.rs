//! RMM's `device_uvector` benchmark (`UVECTOR_BENCH`), construction part, mirrored.
//!
//! `BM_UvectorSizeConstruction`: construct an uninitialized `DeviceUvector<i32>` of `n`
//! elements on the default stream, synchronize, drop it; `BM_ThrustVectorSizeConstruction`:
//! the same zero-initialized (RMM: `rmm::device_vector`, here the vector plus
//! `cuMemsetD32Async`), for `n` = 10^4 .. 10^9 (x10). RMM measures with a pool (half the free
//! memory) as the current resource; this adds the driver pool (`cuda_async`) for comparison.
//! Each figure: microseconds per construction (median of up to `--iters` iterations, 100,
//! at most half a second per cell, after one untimed); the ratio of zeroed to uninitialized in
//! the same run; and the rate at which zeroing writes memory.
//!
//! RMM's third part (`BM_VectorWorkflow`, a kernel on four streams) is not mirrored: it
//! measures kernels and Thrust more than allocation.
//!
//! Arguments: `--iters N`, `--max-exp E` (9: up to 10^9 elements), `--quick` (10 iterations,
//! up to 10^8).

use std::time::{Duration, Instant};

use rmm_benches::args::Args;
use rmm_benches::gpu::{build, Spec};
use rmm_benches::sizing::DeviceMemory;
use rmm_benches::table::{ratio, size_name, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_containers::DeviceUvector;
use rmm_mr::SharedResource;
use rmm_stream::CudaStreamView;

fn main() {
    bench_main("device_uvector", run);
}

/// Microseconds to construct (and, if `zero`, zero-fill) a vector of `n` `i32`s, synchronize
/// and drop it: the median over up to `iters` iterations within half a second, after one.
fn construct(
    mr: &SharedResource,
    n: usize,
    zero: bool,
    iters: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let stream = CudaStreamView::legacy();
    let once = || -> Result<f64, Box<dyn std::error::Error>> {
        let start = Instant::now();
        let v = DeviceUvector::<i32>::new_in(n, stream, mr.clone())?;
        if zero {
            // SAFETY: the vector holds `n` 32-bit elements usable on its stream.
            unsafe { rmm_sys::memory::memset_d32_async(v.data(), 0, n, v.stream().as_raw())? };
        }
        v.stream().synchronize()?;
        drop(v);
        Ok(start.elapsed().as_secs_f64() * 1e6)
    };
    once()?;
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut samples = Vec::with_capacity(iters);
    while samples.len() < iters && (samples.len() < 3 || Instant::now() < deadline) {
        samples.push(once()?);
    }
    Ok(median(&mut samples))
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let iters = args
        .usize_or("--iters", if quick { 10 } else { 100 })?
        .max(1);
    let max_exp = args.usize_or("--max-exp", if quick { 8 } else { 9 })?;
    let mem = DeviceMemory::query()?;
    let mut failures = 0;
    for spec in [
        Spec::Pool {
            initial: mem.half_free(),
        },
        Spec::Async,
    ] {
        let built = build(spec)?;
        let mut table = Table::new(
            &[
                "elements",
                "bytes",
                "uninitialized (us)",
                "zeroed (us)",
                "zeroed / uninitialized",
                "zeroing (GB/s)",
            ],
            2,
        );
        for exp in 4..=max_exp {
            let n = 10usize.pow(exp as u32);
            let bytes = n * 4;
            if bytes > mem.half_free() / 2 {
                println!(
                    "(skipped 10^{exp} elements: {} does not fit comfortably)",
                    size_name(bytes)
                );
                continue;
            }
            eprintln!("[device_uvector] {} / 10^{exp}", spec.name());
            match construct(&built.mr, n, false, iters)
                .and_then(|u| construct(&built.mr, n, true, iters).map(|z| (u, z)))
            {
                Ok((u, z)) => table.row([
                    format!("10^{exp}"),
                    format!("{} MB", bytes as f64 / 1e6),
                    format!("{u:.1}"),
                    format!("{z:.1}"),
                    ratio(Some(z), Some(u)),
                    format!("{:.0}", bytes as f64 / ((z - u).max(0.01) * 1e3)),
                ]),
                Err(e) => {
                    println!("({} at 10^{exp} elements failed: {e})", spec.name());
                    failures += 1;
                }
            }
        }
        println!("\n## Construction with {} as the resource\n", spec.name());
        print!("{}", table.render());
    }
    if failures > 0 {
        return Err(format!("{failures} cell(s) failed").into());
    }
    Ok(())
}
