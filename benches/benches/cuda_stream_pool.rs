//! RMM's `cuda_stream_pool` benchmark (`CUDA_STREAM_POOL_BENCH`), mirrored.
//!
//! `BM_StreamPoolGetStream`: take a stream from a default stream pool (`CudaStreamPool`, 16
//! streams, round robin) and query it (`cuStreamQuery`); `BM_CudaStreamClass`: create a stream
//! (`CudaStream`), query it and destroy it. Each figure: nanoseconds per item, the median of
//! `--reps` (5) runs of `--items` (100,000; creation: a tenth of it); the ratio of creating to
//! taking from the pool in the same run.
//!
//! Arguments: `--items N`, `--reps N`, `--quick` (10,000 items, 3 runs).

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::table::{ratio, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_stream::{CudaStream, CudaStreamPool};

fn main() {
    bench_main("cuda_stream_pool", run);
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let items = args
        .usize_or("--items", if quick { 10_000 } else { 100_000 })?
        .max(10);
    let reps = args.usize_or("--reps", if quick { 3 } else { 5 })?.max(1);
    let pool = CudaStreamPool::with_default_size()?;
    let mut get = Vec::with_capacity(reps);
    let mut create = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..items {
            std::hint::black_box(pool.get_stream().is_idle()?);
        }
        get.push(start.elapsed().as_nanos() as f64 / items as f64);
        let n = items / 10;
        let start = Instant::now();
        for _ in 0..n {
            let s = CudaStream::with_default_flags()?;
            std::hint::black_box(s.view().is_idle()?);
            drop(s);
        }
        create.push(start.elapsed().as_nanos() as f64 / n as f64);
    }
    let (g, c) = (median(&mut get), median(&mut create));
    println!("\n## Stream pool against stream creation (ns per item, median of {reps} runs)\n");
    let mut table = Table::new(&["benchmark", "ns per item", "ratio to get_stream"], 1);
    table.row([
        format!("get_stream from a pool of {} + query", pool.pool_size()),
        format!("{g:.0}"),
        "1.00".to_owned(),
    ]);
    table.row([
        "create + query + destroy a stream".to_owned(),
        format!("{c:.0}"),
        ratio(Some(c), Some(g)),
    ]);
    print!("{}", table.render());
    Ok(())
}
