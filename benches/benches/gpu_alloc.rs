//! GPU allocation benchmarks (`cargo xtask gpu bundle`, then `run.sh bench` on the GPU machine).
//!
//! 1. Wrapper overhead: `CudaAsyncMemoryResource` against raw `cuMemAllocFromPoolAsync` /
//!    `cuMemFreeAsync` on the same pool.
//! 2. Random traces replayed by every resource with 1, 4 and 16 threads, each thread on its own
//!    stream replaying its own copy: (a) sizes 1 B-4 MiB, about 1,000 live; (b) 1 B-64 KiB,
//!    about 2,000 live (fewer on GPUs too small for 16 copies: the live bytes of all threads
//!    stay within 60 % of the free memory and 75 % of the arena, which gets 90 % of the free
//!    memory; see `rmm_benches::sizing`). Per-operation cost = wall time / (operations x
//!    threads); every figure is also given as a ratio to the driver pool and to the naive
//!    baseline (`rmm_benches::naive`: one region, one mutex, two B-trees) measured in the same
//!    run, with the resource's peak reserved bytes and their ratio to the peak live bytes.
//!
//! Arguments: `--ops N` (default 100000), `--reps N` (default 3), `--threads 1,4,16`,
//! `--only NAME[,NAME]` (resources), `--quick` (10,000 ops, 1 rep). Without a GPU it prints one
//! line and exits successfully (a benchmark, not a test).

use std::collections::BTreeMap;
use std::time::Instant;

use rmm_benches::gpu::{build, Spec};
use rmm_benches::sizing::{live_count_within, DeviceMemory};
use rmm_benches::table::mib;
use rmm_benches::{median, replay_threads, Trace};
use rmm_mr::{
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, MrResult, PoolMemoryResource,
};
use rmm_stream::CudaStream;
use rmm_sys::mempool;

const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;

struct Args {
    ops: usize,
    reps: usize,
    threads: Vec<usize>,
    only: Option<Vec<String>>,
}

fn parse_args() -> Args {
    let mut a = Args {
        ops: 100_000,
        reps: 3,
        threads: vec![1, 4, 16],
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--ops" => a.ops = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.ops),
            "--reps" => a.reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.reps),
            "--threads" => {
                if let Some(v) = it.next() {
                    a.threads = v.split(',').filter_map(|t| t.parse().ok()).collect();
                }
            }
            "--only" => a.only = it.next().map(|v| v.split(',').map(str::to_owned).collect()),
            "--quick" => {
                a.ops = 10_000;
                a.reps = 1;
            }
            _ => {} // `--bench` and cargo's other flags
        }
    }
    a
}

type Factory = Box<dyn Fn(&TraceSpec) -> MrResult<Spec>>;

struct TraceSpec {
    name: &'static str,
    max_size: usize,
    live: usize,
}

/// The resources under test, by name, and whether they run multi-threaded. `driver_pool`
/// (the driver's pool with release threshold `u64::MAX`, through `CudaAsyncMemoryResource`,
/// whose overhead the first table measures) and `naive` are the baselines. Each is built by
/// `rmm_benches::gpu::build`, the sub-allocators over a statistics adaptor over the CUDA
/// resource (it reads their peak; they call it only to grow).
fn factories() -> Vec<(&'static str, Factory, bool)> {
    vec![
        (
            "driver_pool",
            Box::new(|_: &TraceSpec| Ok(Spec::Async)),
            true,
        ),
        ("cuda", Box::new(|_: &TraceSpec| Ok(Spec::Cuda)), false),
        (
            "naive",
            Box::new(|_: &TraceSpec| {
                Ok(Spec::Naive {
                    bytes: DeviceMemory::query()?.arena_bytes(),
                })
            }),
            true,
        ),
        (
            "pool",
            Box::new(|_: &TraceSpec| Ok(Spec::Pool { initial: 0 })),
            true,
        ),
        (
            "fixed_size",
            Box::new(|spec: &TraceSpec| {
                Ok(Spec::FixedSize {
                    block: spec.max_size,
                })
            }),
            true,
        ),
        (
            "arena",
            Box::new(|_: &TraceSpec| {
                // 90 % of the free memory: the default (half of it) is too small for 16
                // threads of trace (a) on an 80 GB GPU.
                Ok(Spec::Arena {
                    bytes: DeviceMemory::query()?.arena_bytes(),
                })
            }),
            true,
        ),
        (
            "vmm_pool",
            Box::new(|_: &TraceSpec| {
                // The arena's share of the free memory as the maximum (the address range);
                // nothing mapped up front: the warm-up pass grows it, as it grows the pool.
                Ok(Spec::VmmPool {
                    initial: 0,
                    maximum: DeviceMemory::query()?.arena_bytes(),
                })
            }),
            true,
        ),
        (
            "binning",
            Box::new(|_: &TraceSpec| {
                Ok(Spec::Binning {
                    pool_initial: 0,
                    min_exp: 18,
                    max_exp: 22,
                })
            }),
            true,
        ),
    ]
}

fn overhead(reps: usize) -> MrResult<()> {
    let mr = CudaAsyncMemoryResource::new()?;
    let pool = mr.pool_handle();
    let stream = CudaStream::non_blocking()?;
    let raw_stream = stream.value();
    let view = stream.view();
    let n = 100_000;
    let size = MIB;
    // Warm the pool.
    let p = mr.allocate(view, size, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate(view, p, size, 256)? };
    view.synchronize()?;
    let mut raw = Vec::new();
    let mut wrapped = Vec::new();
    for _ in 0..reps.max(5) {
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: the stream and the pool are live; each pointer is freed once, at once.
            unsafe {
                let p = mempool::mem_alloc_from_pool_async(size, pool, raw_stream)?;
                mempool::mem_free_async(p, raw_stream)?;
            }
        }
        view.synchronize()?;
        raw.push(t.elapsed().as_nanos() as f64 / n as f64);
        let t = Instant::now();
        for _ in 0..n {
            let p = mr.allocate(view, size, 256)?;
            // SAFETY: `p` came from `mr`, freed once.
            unsafe { mr.deallocate(view, p, size, 256)? };
        }
        view.synchronize()?;
        wrapped.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    let (r, w) = (median(&mut raw), median(&mut wrapped));
    println!("\n## Wrapper overhead: allocate+free pairs of 1 MiB on one stream (median of {} runs of {n})\n", raw.len());
    println!("| path | ns per pair | ratio |");
    println!("|---|---:|---:|");
    println!("| raw cuMemAllocFromPoolAsync + cuMemFreeAsync | {r:.0} | 1.000 |");
    println!("| CudaAsyncMemoryResource | {w:.0} | {:.3} |", w / r);
    // What the sub-allocators' stream bookkeeping costs per call.
    let event = rmm_stream::CudaEvent::new()?;
    let time = |f: &dyn Fn() -> MrResult<()>| -> MrResult<f64> {
        let t = Instant::now();
        for _ in 0..n {
            f()?;
        }
        Ok(t.elapsed().as_nanos() as f64 / n as f64)
    };
    let id = time(&|| view.id().map(drop).map_err(Into::into))?;
    let record = time(&|| event.record(view).map_err(Into::into))?;
    view.synchronize()?;
    println!("\n| driver call | ns per call |\n|---|---:|");
    println!("| cuStreamGetId | {id:.0} |");
    println!("| cuEventRecord | {record:.0} |");
    Ok(())
}

fn main() {
    let args = parse_args();
    if let Some(why) = rmm_sys::gpu_unavailable_reason() {
        println!("gpu bench: skipped ({why})");
        return;
    }
    if let Err(e) = run(&args) {
        eprintln!("gpu bench failed: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> MrResult<()> {
    let dev = rmm_sys::current_device()?;
    let name = rmm_sys::device_name(dev)?;
    let version = rmm_sys::driver_version()?;
    println!("# rmm-rs GPU allocation benchmark\n\ndevice: {name}; driver CUDA {version}; ops per trace: {}; reps: {}", args.ops, args.reps);
    overhead(args.reps)?;
    let specs = [
        TraceSpec {
            name: "a: 1 B-4 MiB, ~1000 live",
            max_size: 4 * MIB,
            live: 1000,
        },
        TraceSpec {
            name: "b: 1 B-64 KiB, ~2000 live",
            max_size: 64 * KIB,
            live: 2000,
        },
    ];
    let mut failures = 0;
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    for spec in &specs {
        // The documented live counts fit every thread count on 80 GB GPUs and up; on smaller
        // ones the trace keeps fewer allocations live so that the largest thread count fits,
        // in the arena too (`DeviceMemory::trace_budget`).
        let budget = DeviceMemory::query()?.trace_budget();
        let live = live_count_within(spec.live, spec.max_size, max_threads, budget);
        if live != spec.live {
            println!(
                "(trace {}: {live} live allocations instead of {}, to fit {max_threads} threads)",
                spec.name, spec.live
            );
        }
        let trace = Trace::random(args.ops, 1, spec.max_size, live, 0xbe_2c4);
        let peak = trace.peak_bytes();
        println!(
            "\n## Trace {} (peak {:.2} GiB per thread)\n",
            spec.name,
            peak as f64 / (1u64 << 30) as f64
        );
        let mut table: BTreeMap<usize, Vec<(String, f64, Option<u64>)>> = BTreeMap::new();
        for (rname, factory, mt) in factories() {
            if let Some(only) = &args.only {
                let baseline = rname == "driver_pool" || rname == "naive";
                if !baseline && !only.iter().any(|o| o == rname) {
                    continue;
                }
            }
            for &threads in &args.threads {
                if threads > 1 && !mt {
                    continue;
                }
                let mem = DeviceMemory::query()?;
                if peak.saturating_mul(threads) > mem.trace_budget() {
                    println!(
                        "(skipped {rname} x{threads}: needs {} MiB, {} MiB free)",
                        peak * threads / MIB,
                        mem.free / MIB
                    );
                    continue;
                }
                let measure = || -> MrResult<(f64, Option<u64>)> {
                    let mut samples = Vec::new();
                    let mut peak_reserved = None;
                    for _ in 0..args.reps {
                        let built = build(factory(spec)?)?;
                        let streams = rmm_benches::streams(threads)?;
                        // One untimed warm-up pass so pools have grown, as in steady state.
                        replay_threads(&*built.mr, &trace, &streams)?;
                        let wall = replay_threads(&*built.mr, &trace, &streams)?;
                        samples.push(wall.as_nanos() as f64 / (trace.ops.len() * threads) as f64);
                        peak_reserved = peak_reserved.max(built.peak_reserved());
                        // The resource goes before its streams.
                        drop(built);
                    }
                    Ok((median(&mut samples), peak_reserved))
                };
                eprintln!(
                    "[bench] trace {} / {rname} / {threads} thread(s)",
                    spec.name
                );
                match measure() {
                    Ok((v, reserved)) => {
                        table
                            .entry(threads)
                            .or_default()
                            .push((rname.to_owned(), v, reserved))
                    }
                    Err(e) => {
                        println!("({rname} x{threads} failed: {e})");
                        failures += 1;
                    }
                }
            }
        }
        println!(
            "Peak live: the trace's peak bytes times the thread count (threads start together). \
             Peak reserved: what the resource took from the CUDA resource at most (the arena \
             and the naive baseline: their region), the driver pool's `ReservedMemHigh`, the \
             most the VMM pool mapped.\n"
        );
        println!(
            "| threads | resource | ns per op (median) | ratio to driver_pool | ratio to naive \
             | peak reserved | peak live | reserved / live |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|");
        for (threads, rows) in &table {
            let ratio_to = |name: &str, v: f64| {
                rows.iter()
                    .find(|r| r.0 == name)
                    .map_or("n/a".to_owned(), |b| format!("{:.2}", v / b.1))
            };
            let live = u64::try_from(peak.saturating_mul(*threads)).ok();
            for (n, v, reserved) in rows {
                let per_live = match (reserved, live) {
                    (Some(r), Some(l)) if l > 0 => format!("{:.2}", *r as f64 / l as f64),
                    _ => "n/a".to_owned(),
                };
                println!(
                    "| {threads} | {n} | {v:.0} | {} | {} | {} | {} | {per_live} |",
                    ratio_to("driver_pool", *v),
                    ratio_to("naive", *v),
                    mib(*reserved),
                    mib(live),
                );
            }
        }
    }
    fragmented_pool(args.reps)?;
    if failures > 0 {
        return Err(rmm_mr::MrError::bad_alloc(format!(
            "{failures} benchmark row(s) failed"
        )));
    }
    Ok(())
}

/// The pool's best fit with 100,000 free blocks: allocate 200,000 blocks of 256 B, free every
/// other one (no two free blocks are adjacent, so none coalesce), then time 100,000
/// allocate+free pairs of 256-512 B.
fn fragmented_pool(reps: usize) -> MrResult<()> {
    let pool = PoolMemoryResource::new(CudaMemoryResource::new(), 256 << 20)?;
    let stream = CudaStream::non_blocking()?;
    let v = stream.view();
    let mut blocks = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        blocks.push(pool.allocate(v, 256, 256)?);
    }
    let mut kept = Vec::with_capacity(100_000);
    for (i, p) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            // SAFETY: `p` came from `pool` with 256 bytes.
            unsafe { pool.deallocate(v, p, 256, 256)? };
        } else {
            kept.push(p);
        }
    }
    let mut rng = rmm_benches::Rng::new(42);
    let mut samples = Vec::new();
    for _ in 0..reps.max(3) {
        let t = Instant::now();
        for _ in 0..100_000 {
            let size = rng.range(256, 512);
            let p = pool.allocate(v, size, 256)?;
            // SAFETY: `p` came from `pool` with `size`.
            unsafe { pool.deallocate(v, p, size, 256)? };
        }
        samples.push(t.elapsed().as_nanos() as f64 / 200_000.0);
    }
    println!("\n## Pool with 100,000 free blocks (256 B, none adjacent)\n");
    println!("| scenario | ns per op (median) |");
    println!("|---|---:|");
    println!(
        "| allocate+free of 256-512 B, per operation | {:.0} |",
        median(&mut samples)
    );
    for p in kept {
        // SAFETY: each came from `pool` with 256 bytes.
        unsafe { pool.deallocate(v, p, 256, 256)? };
    }
    v.synchronize()?;
    Ok(())
}
