//! Example 05 (guide: "Multiple devices"): `reinitialize` a pool for every device, put a vector
//! on each device, then read, resize and drop them all from the original device: containers
//! remember their device and switch to it. With a single GPU it says so in one line and skips;
//! without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;
use rmm::DeviceGuard;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example 05: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example 05 failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), MrError> {
    let count = rmm::device_count()?;
    if count < 2 {
        println!("rmm example 05: skipped, it needs at least two GPUs and found {count}");
        return Ok(());
    }
    let devices: Vec<DeviceId> = (0..count)
        .map(|i| i32::try_from(i).map(DeviceId))
        .collect::<Result<_, _>>()
        .map_err(|e| MrError::invalid_argument(format!("device count: {e}")))?;

    // A 256 MiB pool on every device, built with that device current.
    let previous = rmm::reinitialize(
        &ReinitializeOptions::new()
            .pool_allocator(true)
            .initial_pool_size("256MiB")?
            .devices(devices.clone()),
    )?;
    println!(
        "configured a pool on {} devices (replacing {} resources)",
        devices.len(),
        previous.len()
    );

    let home = rmm::current_device()?;
    let mut vectors = Vec::with_capacity(devices.len());
    for &device in &devices {
        let _guard = DeviceGuard::new(device)?;
        let stream = Arc::new(CudaStream::non_blocking()?); // a stream of `device`
        let values = vec![device.value(); 1 << 20];
        // From `device`'s resource (the pool), remembered with its device and stream.
        vectors.push(DeviceUvector::from_slice(&values, stream, None)?);
    }
    println!("back on device {home} with one vector per device");

    for v in &mut vectors {
        let s = v.buffer_stream().clone();
        v.resize(2 << 20, &s)?; // reallocates on the vector's own device
        let first = v.element(0, s.view())?;
        let pool = rmm::per_device_resource(v.device());
        let pool_size = rmm::resource_cast::<PoolMemoryResource>(&*pool)
            .map_or(0, PoolMemoryResource::pool_size);
        println!(
            "device {}: {} elements, element 0 = {first}, its pool holds {pool_size} B",
            v.device(),
            v.len()
        );
    }
    drop(vectors); // each frees on its own device and stream

    for &device in &devices {
        rmm::reset_per_device_resource(device);
    }
    let failed = rmm::take_drop_errors();
    println!(
        "all vectors dropped ({} failed frees); devices reset to their initial resource",
        failed.len()
    );
    Ok(())
}
