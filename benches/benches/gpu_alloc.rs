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
//!    run, with the resource's peak reserved bytes and their ratio to the peak live bytes; then,
//!    per trace, a second table of what growing cost (growth events and their wall time in the
//!    warm-up and the timed pass, chunks given back in the timed pass) and of the timed pass's
//!    slow-path driver calls (events recorded, stream waits, synchronizations, per 1,000
//!    operations), and a third of how long growers held the growth lock of each stream-ordered
//!    resource (holds, p50, p99.9, longest, the most yields in one hold and the holds whose
//!    wait its budget ended; rmm-mr's `testing` record; for the arena, every hold of its
//!    global arena's lock). `vmm_pool` grows as the pool does (its default: each growth at least doubles
//!    what is mapped); `vmm_pool_12` adds 12 % of what is mapped (`min_growth_percent(12)`,
//!    the frugal step, the default until 2026-11-26).
//!
//! Arguments: `--ops N` (default 100000), `--reps N` (default 3), `--threads 1,4,16`,
//! `--only NAME[,NAME]` (resources; `vmm_pool_gP` adds the VMM pool growing by at least `P` %
//! of what is mapped, for sweeps of the growth step), `--no-baselines` (leave out
//! `driver_pool` and `naive` unless `--only` names them; their ratio columns then read n/a),
//! `--traces a,b,r64` (default `a,b`; `r64`: the peer comparison's RMM `random_allocations`
//! up to 64 MiB, seed `0x5eed_0040`, `max_usage` the live budget over the largest thread
//! count; fixed-size is left out on it),
//! `--quick` (10,000 ops, 1 rep), `--latency` (a fourth table per trace: each operation's
//! latency, one clock pair around each `allocate` and each `deallocate` call, p50, p99, p99.9,
//! p99.99 and max per resource, thread count and operation, from per-thread histograms merged
//! over the threads and repetitions; recorded in a pass of its own after the timed pass, so the
//! ns/op medians are unchanged, see `rmm_benches::latency`). Without a GPU it prints one
//! line and exits successfully (a benchmark, not a test). `--simulated`: no GPU needed; the
//! pool and the VMM pools replay the traces over simulated memory on fake streams, round robin
//! on one thread, and the second table is printed with counts only (see [`simulated`]).

use std::collections::BTreeMap;
use std::time::Instant;

use rmm_benches::capacity::replay_round_robin;
use rmm_benches::gpu::{build, Growth, GrowthMeter, Spec};
use rmm_benches::latency::{self, clock_pair_ns, replay_threads_latency, OpLatency};
use rmm_benches::sizing::{live_count_within, DeviceMemory};
use rmm_benches::table::mib;
use rmm_benches::{median, replay_threads, replay_threads_counted, DriverCalls, Trace};
use rmm_mr::testing::GrowthLockHolds;
use rmm_mr::{
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, MrResult,
    PoolMemoryResource, SimulatedMemoryResource, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::mempool;

const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;
/// `vmm_pool_12`'s growth step (the VMM pool's default until 2026-11-26).
const FRUGAL_PERCENT: usize = 12;

struct Args {
    ops: usize,
    reps: usize,
    threads: Vec<usize>,
    only: Option<Vec<String>>,
    no_baselines: bool,
    simulated: bool,
    traces: Vec<String>,
    latency: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        ops: 100_000,
        reps: 3,
        threads: vec![1, 4, 16],
        only: None,
        no_baselines: false,
        simulated: false,
        traces: vec!["a".to_owned(), "b".to_owned()],
        latency: false,
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
            "--no-baselines" => a.no_baselines = true,
            "--traces" => {
                if let Some(v) = it.next() {
                    a.traces = v.split(',').map(str::to_owned).collect();
                }
            }
            "--simulated" => a.simulated = true,
            "--latency" => a.latency = true,
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
    /// What `--traces` names it by.
    key: &'static str,
    name: &'static str,
    max_size: usize,
    /// Allocations live at once ([`Trace::random`]); `None`: RMM's `random_allocations`
    /// ([`Trace::rmm_random`]).
    live: Option<usize>,
    seed: u64,
}

impl TraceSpec {
    /// The trace for `ops` operations a thread and `max_threads` threads at most on a device
    /// with `mem`, and its live count where that had to be cut to fit (`Trace::random`, within
    /// the trace budget) or its `max_usage` per thread (`Trace::rmm_random`: the live budget
    /// over `max_threads`, as the peer comparison sizes it), for the header.
    fn trace(&self, ops: usize, max_threads: usize, mem: &DeviceMemory) -> (Trace, String) {
        match self.live {
            Some(live) => {
                let budget = mem.trace_budget();
                let fitted = live_count_within(live, self.max_size, max_threads, budget);
                let note = if fitted == live {
                    String::new()
                } else {
                    format!(
                        "(trace {}: {fitted} live allocations instead of {live}, to fit \
                         {max_threads} threads)",
                        self.name
                    )
                };
                (
                    Trace::random(ops, 1, self.max_size, fitted, self.seed),
                    note,
                )
            }
            None => {
                let usage = mem.live_budget() / max_threads.max(1);
                (
                    Trace::rmm_random(ops / 2, self.max_size, usage, self.seed),
                    format!(
                        "(trace {}: {} allocations, max_usage {} MiB per thread)",
                        self.name,
                        ops / 2,
                        usage / MIB
                    ),
                )
            }
        }
    }
}

/// The resources under test, by name, and whether they run multi-threaded. `driver_pool`
/// (the driver's pool with release threshold `u64::MAX`, through `CudaAsyncMemoryResource`,
/// whose overhead the first table measures) and `naive` are the baselines. Each is built by
/// `rmm_benches::gpu::build`, the sub-allocators over a statistics adaptor over the CUDA
/// resource (it reads their peak; they call it only to grow).
///
/// `--only vmm_pool_gP` (any `P`) adds the VMM pool growing by at least `P` % of what is
/// mapped (`min_growth_percent(P)`), for sweeps of the growth step.
fn factories(only: Option<&[String]>) -> Vec<(&'static str, Factory, bool)> {
    let mut list: Vec<(&'static str, Factory, bool)> = vec![
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
        // The arena's share of the free memory as the maximum (the address range); nothing
        // mapped up front: the warm-up pass grows it, as it grows the pool. `vmm_pool_12`
        // grows by 12 % of what is mapped rather than doubling: less memory, more thefts
        // between streams.
        ("vmm_pool", vmm_pool(None), true),
        ("vmm_pool_12", vmm_pool(Some(FRUGAL_PERCENT)), true),
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
    ];
    for name in only.unwrap_or_default() {
        let Some(percent) = name
            .strip_prefix("vmm_pool_g")
            .and_then(|p| p.parse::<usize>().ok())
        else {
            continue;
        };
        // A bench binary's names live as long as the run.
        let name: &'static str = Box::leak(name.clone().into_boxed_str());
        list.push((name, vmm_pool(Some(percent)), true));
    }
    list
}

/// The VMM pool with nothing mapped up front, the arena's share of the free memory as its
/// maximum, growing by at least `min_growth_percent` % of what is mapped (`None`: the default).
fn vmm_pool(min_growth_percent: Option<usize>) -> Factory {
    Box::new(move |_: &TraceSpec| {
        Ok(Spec::VmmPool {
            initial: 0,
            maximum: DeviceMemory::query()?.arena_bytes(),
            min_growth_percent,
        })
    })
}

/// The traces: `a` and `b` (the default), and `r64` (`--traces`), the peer comparison's
/// RMM `random_allocations` up to 64 MiB (the trace on which the pool grows most under 16
/// threads).
fn trace_specs() -> [TraceSpec; 3] {
    [
        TraceSpec {
            key: "a",
            name: "a: 1 B-4 MiB, ~1000 live",
            max_size: 4 * MIB,
            live: Some(1000),
            seed: 0xbe_2c4,
        },
        TraceSpec {
            key: "b",
            name: "b: 1 B-64 KiB, ~2000 live",
            max_size: 64 * KIB,
            live: Some(2000),
            seed: 0xbe_2c4,
        },
        TraceSpec {
            key: "r64",
            name: "r64: RMM random_allocations, 1 B-64 MiB",
            max_size: 64 * MIB,
            live: None,
            seed: 0x5eed_0040,
        },
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
    if args.simulated {
        if let Err(e) = simulated(&args) {
            eprintln!("gpu bench (simulated) failed: {e}");
            std::process::exit(1);
        }
        return;
    }
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
    let specs = trace_specs();
    let mut failures = 0;
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    for spec in specs
        .iter()
        .filter(|s| args.traces.iter().any(|t| t == s.key))
    {
        // The documented live counts fit every thread count on 80 GB GPUs and up; on smaller
        // ones the trace keeps fewer allocations live so that the largest thread count fits,
        // in the arena too (`DeviceMemory::trace_budget`).
        let (trace, note) = spec.trace(args.ops, max_threads, &DeviceMemory::query()?);
        if !note.is_empty() {
            println!("{note}");
        }
        let peak = trace.peak_bytes();
        println!(
            "\n## Trace {} (peak {:.2} GiB per thread)\n",
            spec.name,
            peak as f64 / (1u64 << 30) as f64
        );
        let mut table: BTreeMap<usize, Vec<Row>> = BTreeMap::new();
        for (rname, factory, mt) in factories(args.only.as_deref()) {
            let baseline = rname == "driver_pool" || rname == "naive";
            let named = args
                .only
                .as_ref()
                .is_some_and(|o| o.iter().any(|n| n == rname));
            if baseline && args.no_baselines && !named {
                continue;
            }
            if !baseline && args.only.is_some() && !named {
                continue;
            }
            if rname == "fixed_size" && spec.max_size > 4 * MIB {
                // A whole 64 MiB block per allocation: as in the peer comparison, left out.
                println!(
                    "(skipped fixed_size: blocks of {} MiB)",
                    spec.max_size / MIB
                );
                continue;
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
                let measure = || -> MrResult<Row> {
                    let mut samples = Vec::new();
                    let mut row = Row {
                        name: rname.to_owned(),
                        ns_per_op: 0.0,
                        peak_reserved: None,
                        warm_up: None,
                        timed: None,
                        calls: DriverCalls::default(),
                        ops: 0,
                        reps: 0,
                        holds: None,
                        timed_holds: 0,
                        latency: None,
                    };
                    for _ in 0..args.reps {
                        let built = build(factory(spec)?)?;
                        let streams = rmm_benches::streams(threads)?;
                        let start = built.growth();
                        // One untimed warm-up pass so pools have grown, as in steady state.
                        replay_threads(&*built.mr, &trace, &streams)?;
                        let warm = built.growth();
                        let warm_holds = built.growth_lock_holds();
                        let (wall, calls) = replay_threads_counted(&*built.mr, &trace, &streams)?;
                        let timed = built.growth();
                        samples.push(wall.as_nanos() as f64 / (trace.ops.len() * threads) as f64);
                        row.peak_reserved = row.peak_reserved.max(built.peak_reserved());
                        if let (Some(start), Some(warm), Some(timed)) = (start, warm, timed) {
                            let sum = |total: Option<Growth>, g: Growth| {
                                Some(total.unwrap_or_default().plus(g))
                            };
                            row.warm_up = sum(row.warm_up, warm.since(start));
                            row.timed = sum(row.timed, timed.since(warm));
                        }
                        row.calls = row.calls.plus(calls);
                        if let Some(h) = built.growth_lock_holds() {
                            if let Some(w) = &warm_holds {
                                row.timed_holds += h.since(w).count();
                            }
                            row.holds = Some(row.holds.unwrap_or_default().plus(&h));
                        }
                        row.ops += trace.ops.len() * threads;
                        row.reps += 1;
                        if args.latency {
                            // A pass of its own, after every figure above was read: its clocks
                            // cost about as much as an operation.
                            let (_, lat) = replay_threads_latency(&*built.mr, &trace, &streams)?;
                            match &mut row.latency {
                                Some(all) => all.merge(&lat)?,
                                None => row.latency = Some(lat),
                            }
                        }
                        // The resource goes before its streams.
                        drop(built);
                    }
                    row.ns_per_op = median(&mut samples);
                    Ok(row)
                };
                eprintln!(
                    "[bench] trace {} / {rname} / {threads} thread(s)",
                    spec.name
                );
                match measure() {
                    Ok(row) => table.entry(threads).or_default().push(row),
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
                    .find(|r| r.name == name)
                    .map_or("n/a".to_owned(), |b| format!("{:.2}", v / b.ns_per_op))
            };
            let live = u64::try_from(peak.saturating_mul(*threads)).ok();
            for row in rows {
                let (n, v, reserved) = (&row.name, row.ns_per_op, &row.peak_reserved);
                let per_live = match (reserved, live) {
                    (Some(r), Some(l)) if l > 0 => format!("{:.2}", *r as f64 / l as f64),
                    _ => "n/a".to_owned(),
                };
                println!(
                    "| {threads} | {n} | {v:.0} | {} | {} | {} | {} | {per_live} |",
                    ratio_to("driver_pool", v),
                    ratio_to("naive", v),
                    mib(*reserved),
                    mib(live),
                );
            }
        }
        growth_table(&table);
        holds_table(&table);
        if args.latency {
            latency_table(&table);
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

/// One row of a trace's tables: a resource at one thread count.
struct Row {
    name: String,
    /// Median over the repetitions.
    ns_per_op: f64,
    peak_reserved: Option<u64>,
    /// Growth in the warm-up and the timed passes, summed over the repetitions (`None`: the
    /// resource does not report it).
    warm_up: Option<Growth>,
    timed: Option<Growth>,
    /// Driver calls of the timed passes, summed over the repetitions.
    calls: DriverCalls,
    /// Operations of the timed passes, summed over the repetitions.
    ops: usize,
    reps: usize,
    /// The growth lock's holds over the whole run (warm-up and timed passes, every
    /// repetition; `None`: the resource has no growth lock).
    holds: Option<GrowthLockHolds>,
    /// The holds of the timed passes alone, summed over the repetitions.
    timed_holds: u64,
    /// Each call's latency in the latency passes, every thread and repetition (`--latency`).
    latency: Option<OpLatency>,
}

/// Per repetition: growths and the time they took, releases and theirs.
fn growth_cells(g: Option<Growth>, reps: usize) -> [String; 3] {
    match g {
        Some(g) if reps > 0 => {
            let reps = reps as f64;
            [
                format!("{:.1}", g.events as f64 / reps),
                format!("{:.2}", g.time.as_secs_f64() * 1e3 / reps),
                format!(
                    "{:.1} ({:.2} ms)",
                    g.releases as f64 / reps,
                    g.release_time.as_secs_f64() * 1e3 / reps
                ),
            ]
        }
        _ => ["n/a".to_owned(), "n/a".to_owned(), "n/a".to_owned()],
    }
}

/// Per 1,000 operations, one decimal.
fn per_kilo_op(count: u64, ops: usize) -> String {
    if ops == 0 {
        return "n/a".to_owned();
    }
    format!("{:.1}", count as f64 * 1000.0 / ops as f64)
}

/// The second table of a trace: what growing cost each resource, and the slow-path driver calls
/// of its timed pass.
fn growth_table(table: &BTreeMap<usize, Vec<Row>>) {
    println!(
        "\nGrowth and slow paths, per repetition: growth events (upstream allocations of the \
         sub-allocators, chunks mapped by the VMM pool) and the wall time spent in them, summed \
         over threads, in the warm-up and in the timed pass; chunks given back in the timed pass \
         (a resource with a maximum gives its wholly free chunks back before it fails) and their \
         time; and in the timed pass, per 1,000 operations, the events recorded, the waits of one stream on another's event and the \
         synchronizations (device, stream or event; each thread's final stream synchronization \
         included).\n"
    );
    println!(
        "| threads | resource | growths (warm-up) | ms growing (warm-up) | growths (timed) \
         | ms growing (timed) | releases (timed) | records / 1k ops | waits / 1k ops \
         | syncs / 1k ops |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (threads, rows) in table {
        for row in rows {
            let [warm_n, warm_t, _] = growth_cells(row.warm_up, row.reps);
            let [timed_n, timed_t, released] = growth_cells(row.timed, row.reps);
            println!(
                "| {threads} | {} | {warm_n} | {warm_t} | {timed_n} | {timed_t} | {released} \
                 | {} | {} | {} |",
                row.name,
                per_kilo_op(row.calls.event_records, row.ops),
                per_kilo_op(row.calls.stream_waits, row.ops),
                per_kilo_op(row.calls.synchronizations, row.ops),
            );
        }
    }
}

/// The third table of a trace: how long growers held each stream-ordered resource's growth
/// lock (the search, the waits for blocks in transit and for frees, the upstream call).
fn holds_table(table: &BTreeMap<usize, Vec<Row>>) {
    println!(
        "\nThe growth lock (pool, fixed-size, VMM pool; binning: its pool), over the whole run \
         (warm-up and timed passes, every repetition): holds, their p50, p99.9 and longest \
         (a hold: the grower's search, its waits for blocks in transit and for frees, at most \
         {} yields or {} ms in all, and the upstream call), the most yields one grower made in \
         one hold, and the holds whose wait the budget ended. The arena's row is its global \
         arena's lock, every acquisition (the large requests it served, loans, kept and queued \
         frees; no waits, no upstream call). \"in the timed passes\": the holds of the timed \
         passes alone, per 1,000 of their operations. \"beyond upstream\": the longest hold less \
         its upstream allocation calls (issue 32: at most 100 µs).\n",
        GrowthLockHolds::BUDGET_YIELDS,
        GrowthLockHolds::BUDGET_TIME.as_millis(),
    );
    println!(
        "| threads | resource | holds | in the timed passes, per 1k ops | p50 µs | p99.9 µs \
         | max µs | max beyond upstream µs | most yields | budget ran out |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let us = |d: std::time::Duration| format!("{:.1}", d.as_secs_f64() * 1e6);
    for (threads, rows) in table {
        for row in rows {
            let Some(h) = &row.holds else { continue };
            println!(
                "| {threads} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.name,
                h.count(),
                per_kilo_op(row.timed_holds, row.ops),
                us(h.quantile(0.5)),
                us(h.quantile(0.999)),
                us(h.max()),
                us(h.max_beyond_upstream()),
                h.max_yields(),
                h.budget_ran_out(),
            );
        }
    }
}

/// The fourth table of a trace (`--latency`): each operation's latency, per resource and
/// thread count.
fn latency_table(table: &BTreeMap<usize, Vec<Row>>) {
    println!(
        "\nLatency per operation, ns (`--latency`): one clock pair around each allocate and each \
         deallocate call, in a pass of its own after the timed pass of each repetition (its \
         ns/op is not in the tables above), every thread's calls of every repetition together; \
         percentiles from histograms of three significant digits. Each figure includes what an \
         empty clock pair measures: {:.0} ns (median) here.\n",
        clock_pair_ns(100_000)
    );
    let rows = table.iter().flat_map(|(threads, rows)| {
        rows.iter()
            .filter_map(move |r| r.latency.as_ref().map(|l| (*threads, r.name.as_str(), l)))
    });
    print!("{}", latency::table(rows).render());
}

/// A resource of the simulation, with readers of its growth and of the bytes it holds.
struct SimSubject {
    mr: Box<dyn DeviceMemoryResource>,
    growth: Box<dyn Fn() -> Growth>,
    reserved: Box<dyn Fn() -> usize>,
}

/// `--simulated`: no GPU, no CUDA call. The pool (over [`SimulatedMemoryResource`] of a notional
/// 80 GB GPU's free memory, counted by a [`GrowthMeter`]) and the VMM pool (simulated, the
/// arena's 90 % of that as its maximum; `vmm_pool_12` growing by 12 %) replay the traces as the GPU run sizes them, each copy
/// on its own fake stream of the simulated driver, round robin on one thread
/// (`rmm_benches::capacity::replay_round_robin`: operation `i` of every copy before operation
/// `i + 1` of any, the lockstep that threads started together approach): one warm-up pass, one
/// counted pass. Prints the growth events of both passes and the slow-path driver calls of the
/// counted one; no timing (the host is not the GPU machine).
fn simulated(args: &Args) -> MrResult<()> {
    const GIB: usize = 1 << 30;
    let _sim = rmm_sys::fault::FaultScope::simulated();
    let mem = DeviceMemory {
        free: 79 * GIB,
        total: 80 * GIB,
    };
    println!(
        "# rmm-rs GPU allocation benchmark, simulated (no GPU: simulated memory and fake \
         streams, round robin)\n\nnotional device: {} GiB free; ops per trace: {}",
        mem.free / GIB,
        args.ops
    );
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    for spec in trace_specs()
        .iter()
        .filter(|s| args.traces.iter().any(|t| t == s.key))
    {
        let (trace, note) = spec.trace(args.ops, max_threads, &mem);
        let peak = trace.peak_bytes();
        println!(
            "\n## Trace {} (peak {:.2} GiB per thread)\n",
            spec.name,
            peak as f64 / GIB as f64
        );
        if !note.is_empty() {
            println!("{note}\n");
        }
        println!(
            "| threads | resource | growths (warm-up) | growths (counted) | releases (counted) \
             | records / 1k ops | waits / 1k ops | syncs / 1k ops | peak reserved \
             | reserved / live |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for &threads in &args.threads {
            // Owning streams, as on the GPU: a thief can pin one and record on it.
            let owned: Vec<CudaStream> = (0..threads)
                .map(|t| CudaStream::simulated(u32::try_from(t + 1).unwrap_or(u32::MAX)))
                .collect();
            let streams: Vec<CudaStreamView<'_>> = owned.iter().map(CudaStream::view).collect();
            for name in ["pool", "vmm_pool", "vmm_pool_12"] {
                let subject = if name == "pool" {
                    let memory = SimulatedMemoryResource::new(mem.free)?;
                    let meter = GrowthMeter::new(memory.clone());
                    let m = meter.clone();
                    SimSubject {
                        mr: Box::new(PoolMemoryResource::new(meter, 0)?),
                        growth: Box::new(move || m.growth()),
                        // The pool never gives memory back here: what it holds is its peak.
                        reserved: Box::new(move || memory.used()),
                    }
                } else {
                    let mut options = VmmPoolOptions::new(mem.arena_bytes());
                    if name == "vmm_pool_12" {
                        options = options.min_growth_percent(FRUGAL_PERCENT);
                    }
                    let vmm = VmmPoolMemoryResource::simulated(options)?;
                    let (g, r) = (vmm.clone(), vmm.clone());
                    SimSubject {
                        mr: Box::new(vmm),
                        growth: Box::new(move || {
                            let s = g.growth_statistics();
                            Growth {
                                events: s.mappings,
                                time: s.time_mapping,
                                releases: s.unmappings,
                                release_time: s.time_unmapping,
                            }
                        }),
                        reserved: Box::new(move || r.growth_statistics().peak_mapped),
                    }
                };
                let SimSubject {
                    mr,
                    growth,
                    reserved,
                } = subject;
                let start = growth();
                replay_round_robin(&*mr, &trace, &streams, 1)?;
                let warm = growth();
                let calls = DriverCalls::now();
                replay_round_robin(&*mr, &trace, &streams, 1)?;
                let calls = DriverCalls::now().since(calls);
                let counted = growth();
                let ops = trace.ops.len() * threads;
                let live = peak * threads;
                println!(
                    "| {threads} | {name} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                    warm.since(start).events,
                    counted.since(warm).events,
                    counted.since(warm).releases,
                    per_kilo_op(calls.event_records, ops),
                    per_kilo_op(calls.stream_waits, ops),
                    per_kilo_op(calls.synchronizations, ops),
                    mib(u64::try_from(reserved()).ok()),
                    reserved() as f64 / live.max(1) as f64,
                );
            }
        }
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
