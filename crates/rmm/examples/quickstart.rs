//! The README's main job: report the GPU, allocate through a few resources, print what happened.
//! Without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm quickstart: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm quickstart failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), MrError> {
    let device = rmm::sys::current_device()?;
    let (free, total) = rmm::sys::available_device_memory()?;
    println!(
        "device {device}: {} (driver CUDA {}), {:.1} GiB free of {:.1} GiB",
        rmm::sys::device_name(device)?,
        rmm::sys::driver_version()?,
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );

    // The driver's stream-ordered pool, capped at 1 GiB, installed as the device's resource.
    let pool = CudaAsyncMemoryResource::new()?;
    let capped = LimitingResourceAdaptor::new(pool.clone(), 1 << 30);
    rmm::set_current_device_resource(Arc::new(capped.clone()))?;

    let stream = CudaStream::non_blocking()?;
    let mr = rmm::current_device_resource()?;
    let sizes = [4usize << 10, 1 << 20, 64 << 20];
    let mut held = Vec::new();
    for &bytes in &sizes {
        let p = mr.allocate(stream.view(), bytes, 256)?;
        println!("allocated {bytes:>9} B at {p} on stream {}", stream.view());
        held.push((p, bytes));
    }
    println!(
        "limit {} B, outstanding {} B; pool reserved {} B, used {} B",
        capped.allocation_limit(),
        capped.allocated_bytes(),
        pool.statistics()?.reserved_current,
        pool.statistics()?.used_current
    );
    match mr.allocate(stream.view(), 2 << 30, 256) {
        Err(e) if e.is_out_of_memory() => println!("2 GiB over the 1 GiB limit: {e}"),
        other => println!("unexpected: {other:?}"),
    }
    for (p, bytes) in held {
        // SAFETY: each pointer came from `mr` on this stream with this size and is unused.
        unsafe { mr.deallocate(stream.view(), p, bytes, 256)? };
    }
    stream.synchronize()?;
    println!(
        "freed everything; outstanding {} B",
        capped.allocated_bytes()
    );
    rmm::reset_current_device_resource()?;
    Ok(())
}
