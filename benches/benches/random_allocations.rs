//! RMM's `random_allocations` benchmark (`RANDOM_ALLOCATIONS_BENCH`), mirrored.
//!
//! 1. **RMM's grid, one thread**: every (number of allocations, maximum size) pair of RMM's
//!    grid, {1,000, 10,000, 100,000} x {1, 4, 64, 256, 1,024, 4,096} MiB, replayed by every
//!    resource: RMM's sequence ([`Trace::rmm_random`]: `2 N` steps, allocate with probability
//!    73 % while the live bytes stay under `max_usage`, else free a random live allocation),
//!    `max_usage` = RMM's 16,000 MiB, or less on a smaller GPU ([`DeviceMemory::live_budget`]).
//! 2. **Thread sweep**: the same sequences with `--sweep-allocs` allocations (10,000) in all,
//!    split over 1, 4 and 16 threads (each thread `N / T` allocations and `max_usage / T`
//!    bytes, on its own stream), so every row does the same work.
//!
//! Resources as RMM's benchmark builds them: `pool` (initial size half the free memory),
//! `binning` (fixed-size bins 256 KiB..4 MiB over such a pool), `arena` (90 % of the free
//! memory), `cuda_async` (the driver's pool, RMM's defaults; the baseline of the ratios) and
//! `cuda` (`cuMemAlloc`; one thread, the 1,000-allocation column only, one pass: it is slow).
//! Each figure: nanoseconds per operation, the median of `--reps` timed passes after one
//! untimed pass on the same resource; in parentheses its ratio to `cuda_async` in the same run.
//!
//! Arguments: `--reps N` (3), `--allocs 1000,10000,100000`, `--sizes 1,4,64,256,1024,4096`
//! (MiB), `--threads 1,4,16`, `--sweep-allocs N` (10000), `--only NAME[,NAME]`, `--quick`
//! (allocations {1,000, 10,000}, sizes {1, 64, 1,024} MiB, threads {1, 16}, one pass).

use std::collections::BTreeMap;

use rmm_benches::args::Args;
use rmm_benches::gpu::{measure, Spec};
use rmm_benches::sizing::{DeviceMemory, MIB};
use rmm_benches::table::{size_name, with_ratio, Table};
use rmm_benches::{bench_main, BenchResult, Trace};

fn main() {
    bench_main("random_allocations", run);
}

/// Resources in table order, the baseline first.
fn resources(mem: &DeviceMemory) -> Vec<Spec> {
    vec![
        Spec::Async,
        Spec::Pool {
            initial: mem.half_free(),
        },
        Spec::Binning {
            pool_initial: mem.half_free(),
            min_exp: 18,
            max_exp: 22,
        },
        Spec::Arena {
            bytes: mem.arena_bytes(),
        },
        Spec::VmmPool {
            initial: mem.half_free(),
            maximum: mem.arena_bytes(),
            min_growth_percent: None,
        },
        Spec::Cuda,
    ]
}

fn seed(allocs: usize, max_mib: usize) -> u64 {
    0x5eed_0000 ^ ((allocs as u64) << 16) ^ max_mib as u64
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let reps = args.usize_or("--reps", if quick { 1 } else { 3 })?;
    let allocs = args.usizes_or(
        "--allocs",
        if quick {
            &[1000, 10_000]
        } else {
            &[1000, 10_000, 100_000]
        },
    )?;
    let sizes = args.usizes_or(
        "--sizes",
        if quick {
            &[1, 64, 1024]
        } else {
            &[1, 4, 64, 256, 1024, 4096]
        },
    )?;
    let threads = args.usizes_or("--threads", if quick { &[1, 16] } else { &[1, 4, 16] })?;
    let sweep_allocs = args.usize_or("--sweep-allocs", 10_000)?;
    let only = args.names("--only");
    let wanted = |s: &Spec| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|n| n == s.name()))
    };

    let mem = DeviceMemory::query()?;
    let budget = mem.live_budget();
    println!(
        "max_usage (live bytes, all threads): {} MiB; pool initial {} MiB; arena {} MiB; reps {reps}",
        budget / MIB,
        mem.half_free() / MIB,
        mem.arena_bytes() / MIB
    );
    let specs: Vec<Spec> = resources(&mem).into_iter().filter(|s| wanted(s)).collect();
    let mut failures = 0usize;

    // 1. RMM's grid at one thread. A cell whose time, predicted from the same resource and size
    // in the previous column, would pass CELL_BUDGET_S is skipped (the driver's pool at 4 GiB
    // takes ~300 us per operation: 100,000 allocations would take minutes).
    const CELL_BUDGET_S: f64 = 20.0;
    let mut last_ns: std::collections::HashMap<(&'static str, usize), f64> =
        std::collections::HashMap::new();
    for &n in &allocs {
        println!("\n## {n} allocations, one thread (ns per operation; ratio to cuda_async)\n");
        let mut headers = vec!["max size".to_owned(), "operations".to_owned()];
        headers.extend(specs.iter().map(|s| s.name().to_owned()));
        let mut table = Table::new(&headers, 1);
        for &max_mib in &sizes {
            let trace = Trace::rmm_random(n, max_mib * MIB, budget, seed(n, max_mib));
            let mut row = vec![size_name(max_mib * MIB), trace.ops.len().to_string()];
            let mut base = None;
            for spec in &specs {
                let (warmup, reps) = match spec {
                    Spec::Cuda if n > 1000 => {
                        row.push("(skipped)".to_owned());
                        continue;
                    }
                    Spec::Cuda => (0, 1),
                    _ => (1, reps),
                };
                if let Some(ns) = last_ns.get(&(spec.name(), max_mib)) {
                    let predicted_s = ns * trace.ops.len() as f64 * (warmup + reps) as f64 / 1e9;
                    if predicted_s > CELL_BUDGET_S {
                        row.push(format!("(skipped: ~{predicted_s:.0} s)"));
                        continue;
                    }
                }
                eprintln!(
                    "[random_allocations] {n} x {max_mib} MiB / {} / 1 thread",
                    spec.name()
                );
                let v = match measure(*spec, &trace, 1, warmup, reps) {
                    Ok(cell) => {
                        last_ns.insert((spec.name(), max_mib), cell.ns_per_op);
                        Some(cell.ns_per_op)
                    }
                    Err(e) => {
                        println!("({} at {n} x {max_mib} MiB failed: {e})", spec.name());
                        failures += 1;
                        None
                    }
                };
                if matches!(spec, Spec::Async) {
                    base = v;
                }
                row.push(with_ratio(v, base));
            }
            table.row(row);
        }
        print!("{}", table.render());
    }

    // 2. Thread sweep: the same work split over 1, 4, 16 threads.
    let sweep_specs: Vec<Spec> = specs
        .iter()
        .copied()
        .filter(|s| !matches!(s, Spec::Cuda))
        .collect();
    let mut sweep: BTreeMap<usize, Table> = BTreeMap::new();
    for &max_mib in &sizes {
        let mut headers = vec!["threads".to_owned(), "ops per thread".to_owned()];
        headers.extend(sweep_specs.iter().map(|s| s.name().to_owned()));
        let mut table = Table::new(&headers, 1);
        for &t in &threads {
            let trace = Trace::rmm_random(
                (sweep_allocs / t).max(1),
                max_mib * MIB,
                budget / t,
                seed(sweep_allocs, max_mib) ^ t as u64,
            );
            let mut row = vec![t.to_string(), trace.ops.len().to_string()];
            let mut base = None;
            for spec in &sweep_specs {
                eprintln!(
                    "[random_allocations] sweep {max_mib} MiB / {} / {t} thread(s)",
                    spec.name()
                );
                let v = match measure(*spec, &trace, t, 1, reps) {
                    Ok(cell) => Some(cell.ns_per_op),
                    Err(e) => {
                        println!("({} x{t} at {max_mib} MiB failed: {e})", spec.name());
                        failures += 1;
                        None
                    }
                };
                if matches!(spec, Spec::Async) {
                    base = v;
                }
                row.push(with_ratio(v, base));
            }
            table.row(row);
        }
        sweep.insert(max_mib, table);
    }
    for (max_mib, table) in &sweep {
        println!(
            "\n## Thread sweep: {sweep_allocs} allocations in all, up to {} each, capped at the thread's share of max_usage (ns per operation, all threads; ratio to cuda_async)\n",
            size_name(max_mib * MIB)
        );
        print!("{}", table.render());
    }
    if failures > 0 {
        return Err(format!("{failures} cell(s) failed").into());
    }
    Ok(())
}
