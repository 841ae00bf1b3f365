//! Example 03 (guide: "Logging and profiling"): statistics over logging over a limit over a
//! pool. Allocates through the stack (one request over the limit), measures one phase with
//! pushed counters, writes RMM's CSV event log to a temporary file and prints its first lines.
//! Without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;
use std::sync::Arc;

use rmm::mr::{parse_log_str, Action};
use rmm::prelude::*;
use rmm::LoggingResourceAdaptor;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example 03: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example 03 failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// An I/O failure of the example itself, as an error of the example's type.
fn io_error(what: &str, e: std::io::Error) -> MrError {
    MrError::invalid_argument(format!("{what}: {e}"))
}

fn run() -> Result<(), MrError> {
    let log_path = std::env::temp_dir().join(format!("rmm_example_03_{}.csv", std::process::id()));

    // From the bottom up: a pool, a 64 MiB limit, the CSV log, statistics.
    let pool = PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(32 << 20).maximum_pool_size(128 << 20),
    )?;
    let limited = LimitingResourceAdaptor::new(pool.clone(), 64 << 20);
    let logged = LoggingResourceAdaptor::new(limited.clone(), &log_path)?;
    let stats = StatisticsResourceAdaptor::new(logged.clone());
    let mr: SharedResource = Arc::new(stats.clone());
    let stream = Arc::new(CudaStream::non_blocking()?);

    // Two buffers through the stack.
    let a = DeviceBuffer::new_in(16 << 20, Arc::clone(&stream), Arc::clone(&mr))?;
    let mut b = DeviceBuffer::new_in(8 << 20, Arc::clone(&stream), Arc::clone(&mr))?;

    // One phase, measured on its own: grow `b` and make a temporary.
    stats.push_counters();
    b.resize(24 << 20, &stream)?;
    let temporary = DeviceBuffer::new_in(4 << 20, Arc::clone(&stream), Arc::clone(&mr))?;
    drop(temporary);
    let (phase, phase_allocations) = stats.pop_counters()?;
    println!(
        "phase: peak {} B, {} B allocated in {} allocation(s)",
        phase.peak, phase.total, phase_allocations.total
    );

    // Over the limit: refused by the limiting adaptor, logged as `allocate failure`.
    match DeviceBuffer::new_in(48 << 20, Arc::clone(&stream), Arc::clone(&mr)) {
        Err(e) if e.is_out_of_memory() => println!("48 MiB more: {e}"),
        Err(e) => return Err(e),
        Ok(_) => println!("48 MiB more unexpectedly fit under the limit"),
    }

    let bytes = stats.bytes_counter();
    println!(
        "statistics: {} B in use, peak {} B, {} B in total; limit: {} of {} B; pool: {} B",
        bytes.value,
        bytes.peak,
        bytes.total,
        limited.allocated_bytes(),
        limited.allocation_limit(),
        pool.pool_size()
    );
    drop(a);
    drop(b);
    stream.synchronize()?;

    // Read the log back.
    logged
        .flush()
        .map_err(|e| io_error("flushing the log", e))?;
    let text = std::fs::read_to_string(&log_path).map_err(|e| io_error("reading the log", e))?;
    println!("{} (first lines):", log_path.display());
    for line in text.lines().take(6) {
        println!("  {line}");
    }
    let events = parse_log_str(&text).map_err(|e| MrError::invalid_argument(e.to_string()))?;
    let count = |action| events.iter().filter(|e| e.action == action).count();
    println!(
        "{} events: {} allocate, {} allocate failure, {} free",
        events.len(),
        count(Action::Allocate),
        count(Action::AllocateFailure),
        count(Action::Free)
    );
    std::fs::remove_file(&log_path).map_err(|e| io_error("removing the log", e))?;
    Ok(())
}
