//! Fragmentation, measured (`RMM_BENCH_FILTER='*--fragmentation' run.sh bench`): for the pool,
//! the arena, the VMM pool and the driver's pool (`cuda_async`), each bounded by the same
//! maximum `M` (40 % of the free memory, at most 8 GiB, in whole 64 MiB):
//!
//! 1. RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB.
//! 2. RMM issue 496, scaled: grow with 8 MiB allocations to 75 % of `M`, free them, then two
//!    allocations of 40 % of `M`.
//! 3. A multi-stream workload in the manner of RMM issue 2039
//!    (`rmm_mr::testing::fragmentation::MultiStream::scaled(M)`: 4 streams, 4,000 steps, mixed
//!    sizes, each block freed on another stream than its own, at most 60 % of `M` live): the
//!    peak bytes live and reserved, and afterwards (everything freed) the largest allocation
//!    that still succeeds (binary search to 2 MiB), against the free bytes, `M`.
//! 4. Growth costs: from an empty resource, allocations of 1 MiB up to 1 GiB and of 64 MiB up
//!    to `M / 2` (every one kept, so the resource grows), timed; and the VMM pool's own count of
//!    chunks mapped and time spent mapping.
//!
//! Where a resource has no maximum of its own (the driver's pool), `M` bounds the requests
//! only. No work runs on the device: the figures are the allocators' alone. The same workload
//! runs on a host simulation in the VMM pool's unit tests
//! (`vmm::tests::multi_stream_workload_leaves_one_block`).
//!
//! Arguments: `--quick` (1,000 workload steps).
//!
//! **`--simulated`**: no GPU, no CUDA call: tables 1-3 for the pool and the arena over
//! `SimulatedMemoryResource` and for `VmmPoolMemoryResource::simulated`, on the simulated
//! driver's fake streams (deterministic), with `M` = `--max-mib N` (1024). The driver's pool
//! and the growth costs need a GPU.

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::frag::{
    self, maximum_for, subject, table_1957, table_496, table_multi_stream, Mode, Row, NAMES,
};
use rmm_benches::sizing::{DeviceMemory, GIB, MIB};
use rmm_benches::table::Table;
use rmm_benches::{bench_main, BenchResult};
use rmm_mr::testing::fragmentation::MultiStream;
use rmm_mr::DeviceMemoryResource;
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::DevicePtr;

fn main() {
    let args = Args::from_env();
    if args.has("--simulated") {
        if let Err(e) = simulated(&args) {
            eprintln!("fragmentation failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    bench_main("fragmentation", run);
}

fn simulated(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let max = args.usize_or("--max-mib", 1024)? * MIB;
    // Ordinary streams' ids and events are answered by the simulated driver.
    let _sim = rmm_sys::fault::FaultScope::simulated();
    println!(
        "# rmm-rs fragmentation (simulated: SimulatedMemoryResource, fake streams)\n\nmaximum M: \
         {} MiB",
        max / MIB
    );
    let mut rows = issue_1957(Mode::Simulated);
    rows.extend(issue_496(Mode::Simulated, max));
    let views: Vec<CudaStreamView<'static>> = (1..=4).map(CudaStreamView::simulated).collect();
    rows.extend(multi_stream(Mode::Simulated, max, quick, &views));
    all_measured(&rows)
}

/// Fails when a row holds an error (each was printed in its table).
fn all_measured(rows: &[Row]) -> BenchResult {
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} / {}: {}", r.scenario.name(), r.resource, r.status))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; ").into())
    }
}

fn legacy() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

fn free(mr: &dyn DeviceMemoryResource, p: DevicePtr, bytes: usize) -> BenchResult {
    // SAFETY: every caller frees what it allocated from `mr` on the legacy stream with this
    // size; no work used it.
    unsafe { mr.deallocate(legacy(), p, bytes, 256)? };
    Ok(())
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let mem = DeviceMemory::query()?;
    let max = maximum_for(mem.free);
    println!(
        "maximum M: {} MiB (40 % of the free memory, at most 8 GiB)",
        max / MIB
    );
    let mut rows = issue_1957(Mode::Gpu);
    rows.extend(issue_496(Mode::Gpu, max));
    let streams: Vec<CudaStream> = (0..4)
        .map(|_| CudaStream::non_blocking())
        .collect::<Result<_, _>>()?;
    let views: Vec<CudaStreamView<'_>> = streams.iter().map(CudaStream::view).collect();
    rows.extend(multi_stream(Mode::Gpu, max, quick, &views));
    growth(max)?;
    all_measured(&rows)
}

fn issue_1957(mode: Mode) -> Vec<Row> {
    println!("\n## RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB\n");
    let rows = frag::issue_1957(mode);
    print!(
        "{}",
        table_1957(&rows.iter().collect::<Vec<_>>(), false).render()
    );
    rows
}

fn issue_496(mode: Mode, max: usize) -> Vec<Row> {
    println!(
        "\n## RMM issue 496, scaled: grow with 8 MiB allocations to 75 % of M, free them, then \
         two allocations of 40 % of M\n"
    );
    let rows = frag::issue_496(mode, max);
    print!(
        "{}",
        table_496(&rows.iter().collect::<Vec<_>>(), false).render()
    );
    rows
}

fn multi_stream(mode: Mode, max: usize, quick: bool, views: &[CudaStreamView<'_>]) -> Vec<Row> {
    let mut workload = MultiStream::scaled(max);
    if quick {
        workload.steps = 1000;
    }
    println!(
        "\n## Multi-stream workload (RMM issue 2039's shape): {} streams, {} steps, sizes \
         {}-{} B and {}-{} MiB ({} % large), at most {} MiB live; then everything freed\n",
        workload.streams,
        workload.steps,
        workload.small.0,
        workload.small.1,
        workload.large.0 / MIB,
        workload.large.1 / MIB,
        workload.large_percent,
        workload.budget / MIB
    );
    let rows = frag::multi_stream(mode, max, &workload, views);
    print!(
        "{}",
        table_multi_stream(&rows.iter().collect::<Vec<_>>(), false).render()
    );
    println!(
        "\nfree after: M minus the bytes live (none); largest after: the largest allocation \
         served on one stream once everything was freed (binary search, 2 MiB resolution)."
    );
    rows
}

fn growth(max: usize) -> BenchResult {
    println!("\n## Growth costs: allocations kept from an empty resource, timed\n");
    let mut table = Table::new(
        &[
            "resource",
            "allocations",
            "total (ms)",
            "us per allocation",
            "chunks mapped",
            "us per chunk mapped",
        ],
        2,
    );
    for (size, total) in [(MIB, GIB.min(max)), (64 * MIB, max / 2)] {
        for name in NAMES {
            let s = subject(name, max)?;
            let mr = &*s.mr;
            let n = total / size;
            let mut held = Vec::with_capacity(n);
            let start = Instant::now();
            for _ in 0..n {
                held.push(mr.allocate(legacy(), size, 256)?);
            }
            legacy().synchronize()?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let (chunks, per_chunk) = match &s.vmm {
                Some(v) => {
                    let g = v.growth_statistics();
                    let us = g.time_mapping.as_secs_f64() * 1e6 / g.mappings.max(1) as f64;
                    (g.mappings.to_string(), format!("{us:.0}"))
                }
                None => ("n/a".to_owned(), "n/a".to_owned()),
            };
            table.row([
                s.name.to_owned(),
                format!("{n} x {} MiB", size / MIB),
                format!("{ms:.1}"),
                format!("{:.1}", ms * 1e3 / n as f64),
                chunks,
                per_chunk,
            ]);
            for p in held {
                free(mr, p, size)?;
            }
            legacy().synchronize()?;
        }
    }
    print!("{}", table.render());
    Ok(())
}
