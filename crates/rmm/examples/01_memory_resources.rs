//! Example 01 (guide: "Choosing a memory resource"): allocate through the cuda, managed and
//! cuda_async resources on a stream, print their properties, and meet the typed errors:
//! out-of-memory, an unsupported alignment, a resource the device cannot provide and a wrong
//! free. Without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;
use rmm::{InvalidFree, TrackingResourceAdaptor};

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example 01: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example 01 failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Allocates `bytes` from `mr` on `stream`, checks the alignment, and frees it on the same
/// stream.
fn round_trip(
    name: &str,
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    bytes: usize,
) -> Result<(), MrError> {
    let p = mr.allocate(stream, bytes, rmm::ALLOCATION_ALIGNMENT)?;
    let props = mr.properties();
    println!(
        "{name:>10}: {bytes} B at {p} (256-aligned: {}), device-accessible: {}, host-accessible: {}",
        p.is_aligned(rmm::ALLOCATION_ALIGNMENT),
        props.device_accessible,
        props.host_accessible
    );
    // ... work on `stream` would use `p` here ...
    // SAFETY: `p` was allocated from `mr` just above with these arguments, and only work on
    // `stream` (none) could use it.
    unsafe { mr.deallocate(stream, p, bytes, rmm::ALLOCATION_ALIGNMENT)? };
    Ok(())
}

fn run() -> Result<(), MrError> {
    let device = rmm::current_device()?;
    let (free, total) = rmm::available_device_memory()?;
    println!(
        "device {device}: {}, {free} B free of {total} B",
        rmm::sys::device_name(device)?
    );
    let stream = CudaStream::non_blocking()?;
    let bytes = 4 << 20;

    // 1. The three everyday resources.
    round_trip("cuda", &CudaMemoryResource::new(), stream.view(), bytes)?;
    round_trip(
        "managed",
        &ManagedMemoryResource::new(),
        stream.view(),
        bytes,
    )?;
    match CudaAsyncMemoryResource::new() {
        Ok(pool) => {
            round_trip("cuda_async", &pool, stream.view(), bytes)?;
            stream.synchronize()?;
            let stats = pool.statistics()?;
            println!(
                "{:>10}: the driver pool keeps {} B reserved, {} B in use",
                "", stats.reserved_current, stats.used_current
            );
        }
        // A device or driver without memory pools: a typed error, not a crash.
        Err(MrError::Unsupported(why)) => println!("cuda_async: not available here: {why}"),
        Err(e) => return Err(e),
    }

    // 2. Equality: stateless resources are all equal, two driver pools are not.
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new());
    println!(
        "cuda == cuda: {}, cuda == managed: {}",
        cuda.is_equal(&CudaMemoryResource::new()),
        cuda.is_equal(&ManagedMemoryResource::new())
    );

    // 3. Typed errors.
    let cuda = CudaMemoryResource::new();
    match cuda.allocate(stream.view(), total.saturating_mul(2), 256) {
        Err(e) if e.is_out_of_memory() => println!("twice the device memory: {e}"),
        Err(e) => println!("twice the device memory failed otherwise: {e}"),
        Ok(p) => {
            println!("twice the device memory was granted (oversubscription?)");
            // SAFETY: `p` was just allocated from `cuda` with these arguments and is unused.
            unsafe { cuda.deallocate(stream.view(), p, total.saturating_mul(2), 256)? };
        }
    }
    match cuda.allocate(stream.view(), 1024, 4096) {
        Err(e @ MrError::BadAlloc { .. }) => println!("alignment 4096 from a base resource: {e}"),
        Err(e) => println!("alignment 4096 failed otherwise: {e}"),
        Ok(p) => {
            println!("alignment 4096 was unexpectedly granted");
            // SAFETY: `p` was just allocated from `cuda` with these arguments and is unused.
            unsafe { cuda.deallocate(stream.view(), p, 1024, 4096)? };
        }
    }

    // A double free through a tracking adaptor is detected and not passed on.
    let tracked = TrackingResourceAdaptor::new(CudaMemoryResource::new());
    let p = tracked.allocate(stream.view(), 1024, 256)?;
    // SAFETY: `p` was just allocated from `tracked` with these arguments and is unused.
    unsafe { tracked.deallocate(stream.view(), p, 1024, 256)? };
    // SAFETY: deliberately a double free: the adaptor remembers the recent free, reports it and
    // does not forward it, so no memory is touched.
    match unsafe { tracked.deallocate(stream.view(), p, 1024, 256) } {
        Err(
            e @ MrError::InvalidFree {
                kind: InvalidFree::DoubleFree,
                ..
            },
        ) => println!("a double free: {e}"),
        Err(e) => println!("a double free was reported otherwise: {e}"),
        Ok(()) => println!("a double free went unnoticed"),
    }
    stream.synchronize()?;
    Ok(())
}
