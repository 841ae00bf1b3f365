//! An allocation-heavy step launched as a CUDA graph against the same step run eagerly.
//!
//! The step allocates `--buffers` (16) buffers of 64 KiB to 1 MiB on one non-blocking stream,
//! fills each with a memset, and frees them all. Eagerly, every step makes those calls; as a
//! graph, the step is captured once (its allocations served by a `GraphPool` over the same
//! resource, or, for the driver's pool, as graph memory nodes) and each step is one
//! `cuGraphLaunch`. Figures: microseconds per step (wall time from the first enqueue to the
//! end of the stream's work) and host CPU microseconds per step of the thread that enqueues
//! (`/proc/thread-self/schedstat`), the median of `--reps` (5) runs of `--steps` (2,000) steps.
//!
//! Arguments: `--steps N`, `--reps N`, `--buffers N`, `--quick` (200 steps, 3 runs).

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::table::{ratio, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_mr::{
    shared, CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, GraphPool,
    GraphPoolOptions, PoolMemoryResource, PoolOptions, SharedResource,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::{memory, DevicePtr};

fn main() {
    bench_main("graph_step", run);
}

/// CPU time of the calling thread in nanoseconds (Linux), or 0 where unknown.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The step's buffer sizes: 64 KiB to 1 MiB.
fn sizes(buffers: usize) -> Vec<usize> {
    (0..buffers).map(|i| (64 << 10) << (i % 5)).collect()
}

/// One step on `s`: allocate every buffer, fill it, free them all.
fn step(mr: &dyn DeviceMemoryResource, s: CudaStreamView<'_>, sizes: &[usize]) -> BenchResult {
    let mut held: Vec<(DevicePtr, usize)> = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let p = mr.allocate(s, bytes, 256)?;
        // SAFETY: `p` holds `bytes` bytes usable on `s`.
        unsafe { memory::memset_d8_async(p, 0x5a, bytes, s.as_raw())? };
        held.push((p, bytes));
    }
    for (p, bytes) in held {
        // SAFETY: allocated above with these arguments; its memset is ordered before on `s`.
        unsafe { mr.deallocate(s, p, bytes, 256)? };
    }
    Ok(())
}

/// (wall µs per step, CPU µs per step) of `steps` runs of `body`, then a synchronize.
fn measure(
    steps: usize,
    s: CudaStreamView<'_>,
    mut body: impl FnMut() -> BenchResult,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    s.synchronize()?;
    let (t0, c0) = (Instant::now(), thread_cpu_ns());
    for _ in 0..steps {
        body()?;
    }
    s.synchronize()?;
    let wall = t0.elapsed().as_nanos() as f64 / steps as f64 / 1e3;
    let cpu = (thread_cpu_ns() - c0) as f64 / steps as f64 / 1e3;
    Ok((wall, cpu))
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let steps = args
        .usize_or("--steps", if quick { 200 } else { 2000 })?
        .max(1);
    let reps = args.usize_or("--reps", if quick { 3 } else { 5 })?.max(1);
    let buffers = args.usize_or("--buffers", 16)?.max(1);
    let sizes = sizes(buffers);
    let stream = CudaStream::non_blocking()?;
    let s = stream.view();
    let resources: Vec<(&str, SharedResource)> = vec![
        (
            "pool",
            shared(PoolMemoryResource::with_options(
                CudaMemoryResource::new(),
                PoolOptions::new(256 << 20),
            )?),
        ),
        ("cuda_async", shared(CudaAsyncMemoryResource::new()?)),
    ];
    println!(
        "\n## A step of {buffers} allocations, memsets and frees: eager against one graph launch \
         (median of {reps} runs of {steps} steps)\n"
    );
    let mut table = Table::new(
        &[
            "resource",
            "mode",
            "us per step",
            "host CPU us per step",
            "CPU ratio to eager",
        ],
        2,
    );
    for (name, mr) in resources {
        // Warm up: the resource reaches its steady size.
        step(&*mr, s, &sizes)?;
        let graphs = GraphPool::with_options(mr.clone(), GraphPoolOptions::new())?;
        let scope = graphs.capture(s)?;
        step(&*mr, s, &sizes)?;
        let graph = scope.end()?;
        let exec = graph.instantiate(0)?;
        exec.launch(s)?;
        let (mut ew, mut ec, mut gw, mut gc) = (vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let (w, c) = measure(steps, s, || step(&*mr, s, &sizes))?;
            ew.push(w);
            ec.push(c);
            let (w, c) = measure(steps, s, || Ok(exec.launch(s)?))?;
            gw.push(w);
            gc.push(c);
        }
        let (ew, ec, gw, gc) = (
            median(&mut ew),
            median(&mut ec),
            median(&mut gw),
            median(&mut gc),
        );
        table.row([
            name.to_owned(),
            "eager".to_owned(),
            format!("{ew:.1}"),
            format!("{ec:.1}"),
            "1.00".to_owned(),
        ]);
        table.row([
            name.to_owned(),
            "graph".to_owned(),
            format!("{gw:.1}"),
            format!("{gc:.1}"),
            ratio(Some(gc), Some(ec)),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}
