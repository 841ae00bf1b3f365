//! The arena on the host, by thread count: `gpu_alloc`'s traces replayed by
//! `ArenaMemoryResource` over simulated memory (`SimulatedMemoryResource`: addresses only),
//! each thread on its own fake stream of the simulated driver, without any GPU (so without
//! events: a large free the stream cannot keep goes to the global arena at once, where a GPU
//! would queue it behind an event, through the same lock). What it measures is the
//! arena's own work and its locks: per operation (wall time / (operations x threads), the
//! median over the repetitions, and its ratio to one thread), the global arena's lock (its
//! acquisitions per operation and how long each was held: p50, p99.9, longest; rmm-mr's
//! `testing` record; in the warm-up too) and each call's latency (a pass of its own after the timed pass, as in
//! `gpu_alloc --latency`).
//!
//! Arguments: `--threads 1,2,4` (the default), `--ops N` (100000 per thread), `--reps N` (3),
//! `--traces a,b` (`gpu_alloc`'s (a) 1 B-4 MiB, ~1,000 live, and (b) 1 B-64 KiB, ~2,000
//! live, the default; `r64`: RMM's `random_allocations` up to 64 MiB with 1,000 MiB live per
//! thread, as `gpu_alloc` sizes it for 16 threads on an H200), `--arena-gib N` (125: `gpu_alloc`'s arena on an H200, 90 % of the free
//! memory), `--no-latency`. The machine's cores bound what more threads can show: on two cores
//! four threads measure the locks' cost under preemption, not parallel speed.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use rmm_benches::args::Args;
use rmm_benches::latency::{self, replay_latency, OpLatency};
use rmm_benches::{median, replay, Trace};
use rmm_mr::testing::GrowthLockHolds;
use rmm_mr::{ArenaMemoryResource, ArenaOptions, MrResult, SimulatedMemoryResource};
use rmm_stream::CudaStream;
use rmm_sys::fault::FaultScope;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const SEED: u64 = 0xbe_2c4;

/// One table row: a trace at one thread count.
struct Row {
    threads: usize,
    ns_per_op: f64,
    /// Global-lock holds of the warm-up passes, all repetitions.
    warm_up_holds: u64,
    /// Global-lock holds of the timed passes, all repetitions.
    holds: GrowthLockHolds,
    /// Operations of the timed passes, all repetitions.
    ops: usize,
    latency: Option<OpLatency>,
}

/// Runs `f(thread index, stream)` on one thread per stream, started together (each thread
/// on the simulated driver); returns the slowest thread's wall time and the results.
fn on_threads<T: Send>(
    streams: &[CudaStream],
    f: impl Fn(usize, &CudaStream) -> MrResult<T> + Sync,
) -> MrResult<(Duration, Vec<T>)> {
    let barrier = Barrier::new(streams.len());
    let results: Vec<MrResult<(Duration, T)>> = std::thread::scope(|s| {
        let joins: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, stream)| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    let _sim = FaultScope::simulated();
                    barrier.wait();
                    let start = Instant::now();
                    let out = f(i, stream)?;
                    Ok((start.elapsed(), out))
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(rmm_mr::MrError::bad_alloc("thread panicked")))
            })
            .collect()
    });
    let mut worst = Duration::ZERO;
    let mut outs = Vec::with_capacity(results.len());
    for r in results {
        let (wall, out) = r?;
        worst = worst.max(wall);
        outs.push(out);
    }
    Ok((worst, outs))
}

fn measure(
    trace: &Trace,
    threads: usize,
    reps: usize,
    arena_bytes: usize,
    with_latency: bool,
) -> MrResult<Row> {
    let mut samples = Vec::new();
    let mut holds = GrowthLockHolds::default();
    let mut warm_up_holds = 0;
    let mut latency: Option<OpLatency> = None;
    for _ in 0..reps {
        let memory = SimulatedMemoryResource::new(arena_bytes)?;
        let arena =
            ArenaMemoryResource::with_options(memory, ArenaOptions::new().arena_size(arena_bytes))?;
        let streams: Vec<CudaStream> = (0..threads)
            .map(|t| CudaStream::simulated(u32::try_from(t + 1).unwrap_or(u32::MAX)))
            .collect();
        // Warm-up: the arenas take their superblocks, as in steady state.
        on_threads(&streams, |_, s| replay(&arena, s, trace))?;
        let before = arena.global_lock_holds();
        warm_up_holds += before.count();
        let (wall, _) = on_threads(&streams, |_, s| replay(&arena, s, trace))?;
        let after = arena.global_lock_holds();
        holds = holds.plus(&after.since(&before));
        samples.push(wall.as_nanos() as f64 / (trace.ops.len() * threads) as f64);
        if with_latency {
            let (_, lats) = on_threads(&streams, |_, s| {
                let mut lat = OpLatency::new()?;
                replay_latency(&arena, s.view(), trace, &mut lat)?;
                Ok(lat)
            })?;
            for lat in lats {
                match &mut latency {
                    Some(all) => all.merge(&lat)?,
                    None => latency = Some(lat),
                }
            }
        }
        drop(arena);
    }
    Ok(Row {
        threads,
        ns_per_op: median(&mut samples),
        warm_up_holds: warm_up_holds / reps as u64,
        holds,
        ops: trace.ops.len() * threads * reps,
        latency,
    })
}

fn main() {
    if let Err(e) = run(&Args::from_env()) {
        eprintln!("arena_threads failed: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let threads = args.usizes_or("--threads", &[1, 2, 4])?;
    let ops = args.usize_or("--ops", 100_000)?;
    let reps = args.usize_or("--reps", 3)?.max(1);
    let arena_bytes = args.usize_or("--arena-gib", 125)? * GIB;
    let traces = args
        .names("--traces")
        .unwrap_or_else(|| vec!["a".to_owned(), "b".to_owned()]);
    let with_latency = !args.has("--no-latency");
    let _sim = FaultScope::simulated();
    println!(
        "# rmm-rs arena_threads (host: simulated memory, fake streams)\n\n\
         arena: {} GiB; ops per thread: {ops}; reps: {reps}; cores: {}",
        arena_bytes / GIB,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    for key in &traces {
        let (name, trace) = match key.as_str() {
            "a" => (
                "a: 1 B-4 MiB, ~1000 live",
                Trace::random(ops, 1, 4 * MIB, 1000, SEED),
            ),
            "b" => (
                "b: 1 B-64 KiB, ~2000 live",
                Trace::random(ops, 1, 64 * KIB, 2000, SEED),
            ),
            // As `gpu_alloc` sizes it on an H200 for 16 threads: RMM's 16,000 MiB of live
            // bytes over 16 threads each.
            "r64" => (
                "r64: RMM random_allocations, 1 B-64 MiB",
                Trace::rmm_random(ops / 2, 64 * MIB, 1000 * MIB, 0x5eed_0040),
            ),
            other => return Err(format!("unknown trace {other:?} (a, b, r64)").into()),
        };
        println!("\n## Trace {name}\n");
        let mut rows = Vec::new();
        for &t in &threads {
            eprintln!("[arena_threads] trace {key} / {t} thread(s)");
            rows.push(measure(&trace, t, reps, arena_bytes, with_latency)?);
        }
        let one = rows.iter().find(|r| r.threads == 1).map(|r| r.ns_per_op);
        println!(
            "| threads | ns per op (median) | ratio to 1 thread | global-lock holds per 1k ops \
             | hold p50 ns | hold p99.9 ns | longest hold ns (warm-up included) \
             | holds in the warm-up, per repetition |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            let ratio = one.map_or("n/a".to_owned(), |o| format!("{:.2}", r.ns_per_op / o));
            println!(
                "| {} | {:.0} | {ratio} | {:.1} | {} | {} | {} | {} |",
                r.threads,
                r.ns_per_op,
                r.holds.count() as f64 * 1000.0 / r.ops.max(1) as f64,
                r.holds.quantile(0.5).as_nanos(),
                r.holds.quantile(0.999).as_nanos(),
                r.holds.max().as_nanos(),
                r.warm_up_holds,
            );
        }
        if with_latency {
            println!(
                "\nLatency per call, ns (a pass of its own after each timed pass; every thread \
                 and repetition):\n"
            );
            let table = latency::table(
                rows.iter()
                    .filter_map(|r| r.latency.as_ref().map(|l| (r.threads, "arena", l))),
            );
            print!("{}", table.render());
        }
    }
    Ok(())
}
