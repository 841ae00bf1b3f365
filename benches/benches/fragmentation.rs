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
use rmm_benches::sizing::{round_down, DeviceMemory, MIB};
use rmm_benches::table::Table;
use rmm_benches::{bench_main, BenchResult};
use rmm_mr::testing::fragmentation::{largest_allocation, run as run_workload, MultiStream};
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, MrResult, PoolMemoryResource, PoolOptions, SimulatedMemoryResource,
    StatisticsResourceAdaptor, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::DevicePtr;

const GIB: usize = 1 << 30;

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

/// On a GPU, or over simulated memory and streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Gpu,
    Simulated,
}

impl Mode {
    /// The resources measured, in table order.
    fn names(self) -> &'static [&'static str] {
        match self {
            Mode::Gpu => &NAMES,
            Mode::Simulated => &NAMES[..3],
        }
    }

    /// Waits for `stream` (nothing to wait for over simulated streams).
    fn synchronize(self, stream: CudaStreamView<'_>) -> BenchResult {
        if self == Mode::Gpu {
            stream.synchronize()?;
        }
        Ok(())
    }
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
    issue_1957(Mode::Simulated)?;
    issue_496(Mode::Simulated, max)?;
    let views: Vec<CudaStreamView<'static>> = (1..=4).map(CudaStreamView::simulated).collect();
    multi_stream(Mode::Simulated, max, quick, &views)?;
    Ok(())
}

/// A resource under test, with how to read the bytes it holds from the device now.
struct Subject {
    name: &'static str,
    mr: Box<dyn DeviceMemoryResource>,
    reserved: Box<dyn Fn() -> usize>,
    vmm: Option<VmmPoolMemoryResource>,
}

/// The resources, in table order.
const NAMES: [&str; 4] = ["pool", "arena", "vmm_pool", "cuda_async"];

/// The resource `name` over simulated memory of `max` bytes (the pool and the arena; the
/// reserved bytes are the simulated memory's bytes in use) or a simulated VMM pool.
fn simulated_subject(name: &'static str, max: usize) -> MrResult<Subject> {
    let memory = SimulatedMemoryResource::new(max)?;
    let probe = memory.clone();
    let held = Box::new(move || probe.used()) as Box<dyn Fn() -> usize>;
    Ok(match name {
        "pool" => Subject {
            name,
            mr: Box::new(PoolMemoryResource::with_options(
                memory,
                PoolOptions::new(0).maximum_pool_size(max),
            )?),
            reserved: held,
            vmm: None,
        },
        "arena" => Subject {
            name,
            mr: Box::new(ArenaMemoryResource::with_options(
                memory,
                ArenaOptions::new().arena_size(max),
            )?),
            reserved: held,
            vmm: None,
        },
        _ => {
            let vmm = VmmPoolMemoryResource::simulated(VmmPoolOptions::new(max))?;
            let probe = vmm.clone();
            Subject {
                name,
                mr: Box::new(vmm.clone()),
                reserved: Box::new(move || probe.pool_size()),
                vmm: Some(vmm),
            }
        }
    })
}

/// The resource `name` for `mode`, bounded by `max` where it can be.
fn subject_for(mode: Mode, name: &'static str, max: usize) -> MrResult<Subject> {
    match mode {
        Mode::Gpu => subject(name, max),
        Mode::Simulated => simulated_subject(name, max),
    }
}

/// The resource `name`, bounded by `max` where it can be. One at a time: the arena takes its
/// whole size up front.
fn subject(name: &'static str, max: usize) -> MrResult<Subject> {
    let held = |s: StatisticsResourceAdaptor<CudaMemoryResource>| {
        Box::new(move || usize::try_from(s.bytes_counter().value).unwrap_or(0))
            as Box<dyn Fn() -> usize>
    };
    let stats = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    Ok(match name {
        "pool" => Subject {
            name,
            mr: Box::new(PoolMemoryResource::with_options(
                stats.clone(),
                PoolOptions::new(0).maximum_pool_size(max),
            )?),
            reserved: held(stats),
            vmm: None,
        },
        "arena" => Subject {
            name,
            mr: Box::new(ArenaMemoryResource::with_options(
                stats.clone(),
                ArenaOptions::new().arena_size(max),
            )?),
            reserved: held(stats),
            vmm: None,
        },
        "vmm_pool" => {
            let vmm = VmmPoolMemoryResource::new(max)?;
            let probe = vmm.clone();
            Subject {
                name,
                mr: Box::new(vmm.clone()),
                reserved: Box::new(move || probe.pool_size()),
                vmm: Some(vmm),
            }
        }
        _ => {
            let driver = CudaAsyncMemoryResource::new()?;
            let probe = driver.clone();
            Subject {
                name,
                mr: Box::new(driver),
                reserved: Box::new(move || {
                    probe
                        .statistics()
                        .map_or(0, |s| usize::try_from(s.reserved_current).unwrap_or(0))
                }),
                vmm: None,
            }
        }
    })
}

fn mib(bytes: usize) -> String {
    format!("{}", bytes / MIB)
}

fn legacy() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

fn outcome<T>(r: MrResult<T>) -> Result<Option<T>, Box<dyn std::error::Error>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_out_of_memory() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn served(r: &Option<DevicePtr>) -> &'static str {
    if r.is_some() {
        "served"
    } else {
        "out of memory"
    }
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
    let max = round_down((8 * GIB).min(mem.free / 10 * 4), 64 * MIB);
    println!(
        "maximum M: {} MiB (40 % of the free memory, at most 8 GiB)",
        max / MIB
    );
    issue_1957(Mode::Gpu)?;
    issue_496(Mode::Gpu, max)?;
    let streams: Vec<CudaStream> = (0..4)
        .map(|_| CudaStream::non_blocking())
        .collect::<Result<_, _>>()?;
    let views: Vec<CudaStreamView<'_>> = streams.iter().map(CudaStream::view).collect();
    multi_stream(Mode::Gpu, max, quick, &views)?;
    growth(max)?;
    Ok(())
}

fn issue_1957(mode: Mode) -> BenchResult {
    println!("\n## RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB\n");
    let mut table = Table::new(&["resource", "64 MiB"], 2);
    let pool_options = PoolOptions::new(2 * MIB).maximum_pool_size(64 * MIB);
    let pool: Box<dyn DeviceMemoryResource> = match mode {
        Mode::Gpu => Box::new(PoolMemoryResource::with_options(
            CudaMemoryResource::new(),
            pool_options,
        )?),
        Mode::Simulated => Box::new(PoolMemoryResource::with_options(
            SimulatedMemoryResource::new(GIB)?,
            pool_options,
        )?),
    };
    let options = VmmPoolOptions::new(64 * MIB).initial_pool_size(2 * MIB);
    let vmm = match mode {
        Mode::Gpu => VmmPoolMemoryResource::with_options(options)?,
        Mode::Simulated => VmmPoolMemoryResource::simulated(options)?,
    };
    for (name, mr) in [
        ("pool", &*pool as &dyn DeviceMemoryResource),
        ("vmm_pool", &vmm),
    ] {
        let p = outcome(mr.allocate(legacy(), 64 * MIB, 256))?;
        table.row([name, served(&p)]);
        if let Some(p) = p {
            free(mr, p, 64 * MIB)?;
        }
    }
    print!("{}", table.render());
    Ok(())
}

fn issue_496(mode: Mode, max: usize) -> BenchResult {
    println!(
        "\n## RMM issue 496, scaled: grow with 8 MiB allocations to 75 % of M, free them, then \
         two allocations of 40 % of M\n"
    );
    let large = max / 5 * 2 / 256 * 256;
    let mut table = Table::new(&["resource", "first", "second", "reserved (MiB)"], 3);
    for &name in mode.names() {
        let s = subject_for(mode, name, max)?;
        let mr = &*s.mr;
        let mut small = Vec::new();
        while small.len() * 8 * MIB < max / 4 * 3 {
            small.push(mr.allocate(legacy(), 8 * MIB, 256)?);
        }
        for p in small {
            free(mr, p, 8 * MIB)?;
        }
        let a = outcome(mr.allocate(legacy(), large, 256))?;
        let b = outcome(mr.allocate(legacy(), large, 256))?;
        table.row([
            s.name.to_owned(),
            served(&a).to_owned(),
            served(&b).to_owned(),
            mib((s.reserved)()),
        ]);
        for p in [a, b].into_iter().flatten() {
            free(mr, p, large)?;
        }
        mode.synchronize(legacy())?;
    }
    print!("{}", table.render());
    Ok(())
}

fn multi_stream(mode: Mode, max: usize, quick: bool, views: &[CudaStreamView<'_>]) -> BenchResult {
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
    let mut table = Table::new(
        &[
            "resource",
            "peak live (MiB)",
            "peak reserved (MiB)",
            "reserved / live",
            "free after (MiB)",
            "largest after (MiB)",
            "largest / free",
            "failed allocations",
            "seconds",
        ],
        1,
    );
    for &name in mode.names() {
        let s = subject_for(mode, name, max)?;
        let start = Instant::now();
        let out = run_workload(&*s.mr, views, &workload, &*s.reserved)?;
        let largest = largest_allocation(&*s.mr, views[0], max, 2 * MIB)?;
        let seconds = start.elapsed().as_secs_f64();
        table.row([
            s.name.to_owned(),
            mib(out.peak_live),
            mib(out.peak_reserved),
            format!(
                "{:.2}",
                out.peak_reserved as f64 / out.peak_live.max(1) as f64
            ),
            mib(max),
            mib(largest),
            format!("{:.3}", largest as f64 / max as f64),
            out.failed.to_string(),
            format!("{seconds:.2}"),
        ]);
        for &v in views {
            mode.synchronize(v)?;
        }
    }
    print!("{}", table.render());
    println!(
        "\nfree after: M minus the bytes live (none); largest after: the largest allocation \
         served on one stream once everything was freed (binary search, 2 MiB resolution)."
    );
    Ok(())
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
