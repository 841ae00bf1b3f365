//! The README's main job: configure a pool for the GPU, allocate containers on a stream, copy
//! data both ways, and print statistics. Without a GPU it says so in one line and exits with
//! status 1.

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

fn gib(bytes: impl Into<u128>) -> f64 {
    bytes.into() as f64 / f64::from(1u32 << 30)
}

fn run() -> Result<(), MrError> {
    let device = rmm::current_device()?;
    let (free, total) = rmm::available_device_memory()?;
    println!(
        "device {device}: {} (driver CUDA {}), {:.1} GiB free of {:.1} GiB",
        rmm::sys::device_name(device)?,
        rmm::sys::driver_version()?,
        gib(free as u64),
        gib(total as u64)
    );

    // 1. A 1 GiB pool (growing up to 4 GiB) as the device's resource, as Python's
    //    rmm.reinitialize(pool_allocator=True, initial_pool_size="1GiB", ...) does.
    rmm::reinitialize(
        &ReinitializeOptions::new()
            .pool_allocator(true)
            .initial_pool_size("1GiB")?
            .maximum_pool_size("4GiB")?,
    )?;
    // 2. Count what goes through it.
    let stats = StatisticsResourceAdaptor::new(rmm::current_device_resource()?);
    let mr: SharedResource = Arc::new(stats.clone());

    // 3. Containers on a stream of our own.
    let stream = Arc::new(CudaStream::non_blocking()?);
    let input: Vec<f32> = (0..1_000_000).map(|i| i as f32 * 0.5).collect();
    let vector = DeviceUvector::from_slice(&input, Arc::clone(&stream), Some(Arc::clone(&mr)))?;
    let mut scratch = DeviceBuffer::new_in(64 << 20, Arc::clone(&stream), Arc::clone(&mr))?;
    scratch.resize(128 << 20, Arc::clone(&stream))?;
    let back = vector.to_vec(stream.view())?;
    println!(
        "copied {} floats to the GPU and back: {}",
        back.len(),
        if back == input {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    println!(
        "element 123456 read from the device: {}",
        vector.element(123_456, stream.view())?
    );

    let bytes = stats.bytes_counter();
    let allocs = stats.allocations_counter();
    println!(
        "statistics: {} B in use (peak {} B, {} B in total) over {} live allocation(s), {} in total",
        bytes.value, bytes.peak, bytes.total, allocs.value, allocs.total
    );
    drop(vector);
    drop(scratch);
    stream.synchronize()?;
    println!(
        "after dropping the containers: {} B in use",
        stats.bytes_counter().value
    );
    if let Some(pool) = rmm::resource_cast::<PoolMemoryResource>(&*rmm::current_device_resource()?)
    {
        println!("pool size {:.2} GiB", gib(pool.pool_size() as u64));
    }

    // 4. Exhaustion is a typed error, not a panic.
    match DeviceBuffer::new_in(8 << 30, Arc::clone(&stream), Arc::clone(&mr)) {
        Err(e) if e.is_out_of_memory() => println!("8 GiB from a 4 GiB pool: {e}"),
        Err(e) => println!("8 GiB from a 4 GiB pool failed otherwise: {e}"),
        Ok(_) => println!("8 GiB from a 4 GiB pool unexpectedly succeeded"),
    }
    rmm::reset_current_device_resource()?;
    Ok(())
}
