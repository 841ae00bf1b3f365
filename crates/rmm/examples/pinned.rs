//! Example `pinned` (guide: "IPC, peer access and pinned memory", the pinned-memory section):
//! a caching pool of pinned host memory, a `PinnedVec` copied to a `DeviceUvector` and back
//! without blocking the host until the result is needed, a block recorded on a second stream,
//! the counters and `release`, and the driver's host-located pool where the driver has one.
//! Without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;

use rmm::prelude::*;
use rmm::{CudaAsyncHostMemoryResource, PinnedHostPool, PinnedVec};

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example pinned: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example pinned failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), MrError> {
    let pool = PinnedHostPool::new();
    let stream = CudaStream::non_blocking()?;

    // A pinned vector: an allocator_api2 Vec whose memory comes from the pool.
    let mut host: PinnedVec<f32> = pool.vec();
    host.extend((0..1 << 20).map(|i| i as f32));

    // Host to device: the vector travels with the copy and comes back when it is done.
    let mut device = DeviceUvector::<f32>::new(host.len(), CudaStreamView::default())?;
    let in_flight = device.copy_from_pinned_async(host, stream.view())?;
    // ... the host is free to do other work here ...
    let host = in_flight.wait()?;

    // Device to host into a new pinned vector.
    let back = device.to_pinned_async(&pool, stream.view())?.wait()?;
    assert_eq!(back[..], host[..]);
    println!(
        "round trip of {} floats through pinned memory: ok",
        back.len()
    );

    // Work of your own on a block: record the stream after enqueuing it; the block is not
    // reused before that work completes, even if the vector is dropped at once.
    let other = CudaStream::non_blocking()?;
    pool.record_stream(back.as_ptr().cast(), other.view())?;
    drop(back);
    drop(host);

    let s = pool.statistics();
    println!(
        "pool: {} chunks, {} bytes reserved, {} in use, peak {}, {} hits, {} misses",
        s.chunks, s.reserved_bytes, s.in_use_bytes, s.peak_in_use_bytes, s.hits, s.misses
    );
    other.synchronize()?;
    println!("release gave back {} bytes", pool.release()?);

    // The driver's own pool of pinned host memory (CUDA 13 drivers), where it exists.
    match CudaAsyncHostMemoryResource::new() {
        Ok(mr) => {
            let p = mr.allocate(stream.view(), 1 << 20, 256)?;
            // SAFETY: allocated just above on `stream`, unused.
            unsafe { mr.deallocate(stream.view(), p, 1 << 20, 256) }?;
            stream.synchronize()?;
            println!("host-located driver pool: allocated and freed 1 MiB");
        }
        Err(MrError::Unsupported(why)) => println!("host-located driver pool: {why}"),
        Err(e) => return Err(e),
    }
    Ok(())
}
