//! Arena capacity: the highest occupancy (live bytes / arena size) at which 16 copies of
//! `gpu_alloc`'s trace (a) (sizes 1 B-4 MiB, about 1,000 live, 100,000 operations), each on its
//! own stream, all complete against one `ArenaMemoryResource`, twice in a row on the same
//! arena (the benchmark's warm-up and timed passes). See `rmm_benches::capacity`.
//!
//! - **On a GPU** (the default): the arena is allocated from the CUDA resource; one host thread
//!   per copy, each on its own non-blocking stream, as `gpu_alloc` replays. The trace keeps
//!   fewer allocations live on a GPU too small for 16 copies at the lowest level (the arena
//!   then gets at most `DeviceMemory::arena_bytes`, 90 % of the free memory). Without a GPU it
//!   prints one line and exits successfully.
//! - **`--simulated`**: no GPU, no CUDA call: the arena's upstream is
//!   `SimulatedMemoryResource` (addresses only) and the copies are replayed on the calling
//!   thread, round robin, on the simulated driver's fake streams (deterministic).
//!
//! Occupancy = 16 x the trace's peak live bytes / the arena size (the copies run in step, so
//! their peaks coincide). Levels (`--levels`, percent): 80, 82, ..., 98, 99, tried in order; the
//! figure is the highest level that completed with every level before it. Each level gets a
//! fresh arena. Other arguments: `--threads N` (16),
//! `--ops N` (100000), `--live N` (1000), `--passes N` (2), `--round-robin` (on a GPU: replay
//! round robin on the calling thread instead of one thread per copy).

use rmm_benches::args::Args;
use rmm_benches::capacity::{
    highest_complete, occupancy, replay_round_robin, scan, simulate, Level,
};
use rmm_benches::sizing::{gib, live_count_within, DeviceMemory, MIB};
use rmm_benches::{bench_main, replay_threads, BenchResult, Trace};
use rmm_mr::{ArenaMemoryResource, ArenaOptions, CudaMemoryResource};
use rmm_stream::CudaStreamView;

/// `gpu_alloc`'s trace (a).
const MAX_SIZE: usize = 4 * MIB;
const SEED: u64 = 0xbe_2c4;
const LEVELS: &[usize] = &[80, 82, 84, 86, 88, 90, 92, 94, 96, 98, 99];

struct Setup {
    threads: usize,
    ops: usize,
    live: usize,
    passes: usize,
    levels: Vec<usize>,
}

impl Setup {
    fn from(args: &Args) -> Result<Self, String> {
        Ok(Self {
            threads: args.usize_or("--threads", 16)?,
            ops: args.usize_or("--ops", 100_000)?,
            live: args.usize_or("--live", 1000)?,
            passes: args.usize_or("--passes", 2)?,
            levels: args.usizes_or("--levels", LEVELS)?,
        })
    }
}

fn main() {
    let args = Args::from_env();
    if args.has("--simulated") {
        if let Err(e) = simulated(&args) {
            eprintln!("arena_capacity failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    bench_main("arena_capacity", on_gpu);
}

fn report(setup: &Setup, trace: &Trace, levels: &[Level]) {
    let peak = trace.peak_bytes();
    println!(
        "\ntrace (a): {} operations, ~{} live, peak {} per copy; {} copies, {} pass(es)\n",
        trace.ops.len(),
        setup.live,
        gib(peak as u64),
        setup.threads,
        setup.passes
    );
    println!("| occupancy | arena | live at peak | outcome |");
    println!("|---:|---:|---:|---|");
    for l in levels {
        println!(
            "| {:.1} % | {} | {} | {} |",
            occupancy(peak, setup.threads, l.arena_bytes),
            gib(l.arena_bytes as u64),
            gib((peak * setup.threads) as u64),
            l.failure.as_deref().unwrap_or("all copies completed")
        );
    }
    match highest_complete(levels) {
        Some(p) => println!(
            "\nhighest occupancy at which all {} copies complete: {p} %",
            setup.threads
        ),
        None => println!(
            "\nno level completed (lowest tried: {} %)",
            setup.levels.first().copied().unwrap_or(0)
        ),
    }
}

fn simulated(args: &Args) -> BenchResult {
    let setup = Setup::from(args)?;
    println!(
        "# rmm-rs arena_capacity (simulated: SimulatedMemoryResource, fake streams, round robin)"
    );
    let trace = Trace::random(setup.ops, 1, MAX_SIZE, setup.live, SEED);
    let levels = scan(&setup.levels, trace.peak_bytes(), setup.threads, |bytes| {
        simulate(&trace, setup.threads, setup.passes, bytes)
    });
    report(&setup, &trace, &levels);
    Ok(())
}

fn on_gpu(args: &Args) -> BenchResult {
    let mut setup = Setup::from(args)?;
    let mem = DeviceMemory::query()?;
    let lowest = setup.levels.iter().copied().min().unwrap_or(80);
    // The largest arena tried (at the lowest level) must fit in 90 % of the free memory.
    let room = mem.arena_bytes() / 100 * lowest;
    let mut live = live_count_within(setup.live, MAX_SIZE, setup.threads, room);
    let mut trace = Trace::random(setup.ops, 1, MAX_SIZE, live, SEED);
    while live > 1 && trace.peak_bytes() * setup.threads > room {
        live = live * 19 / 20;
        trace = Trace::random(setup.ops, 1, MAX_SIZE, live, SEED);
    }
    if live != setup.live {
        println!(
            "({live} live allocations per copy instead of {}, to fit {} copies)",
            setup.live, setup.threads
        );
        setup.live = live;
    }
    let streams = rmm_benches::streams(setup.threads)?;
    let views: Vec<CudaStreamView<'_>> = streams.iter().map(|s| s.view()).collect();
    let round_robin = args.has("--round-robin");
    let levels = scan(&setup.levels, trace.peak_bytes(), setup.threads, |bytes| {
        let arena = ArenaMemoryResource::with_options(
            CudaMemoryResource::new(),
            ArenaOptions::new().arena_size(bytes),
        )?;
        if round_robin {
            replay_round_robin(&arena, &trace, &views, setup.passes)?;
        } else {
            for _ in 0..setup.passes {
                replay_threads(&arena, &trace, &streams)?;
            }
        }
        Ok(())
    });
    report(&setup, &trace, &levels);
    Ok(())
}
