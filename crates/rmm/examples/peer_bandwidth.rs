//! Example `peer_bandwidth` (guide: "Peer access"): the bandwidth of copies from device 0 to
//! device 1 for 1 MiB to 256 MiB, two ways: `cuMemcpyPeerAsync` between ordinary buffers (what
//! `DeviceBuffer::copy_to_device` does), and device 1 pulling with `cuMemcpyAsync` from a
//! driver pool of device 0 that granted it access (`set_peer_access`). Prints one line per
//! size, in GB/s (10^9 bytes per second). With one GPU it says so in one line and exits with
//! status 0; without a GPU it exits with status 1.

use std::process::ExitCode;
use std::time::Instant;

use rmm::containers::DeviceBuffer;
use rmm::mr::{CudaAsyncMemoryResource, DeviceMemoryResource, MrError};
use rmm::stream::CudaStreamView;
use rmm::sys::{memory, DeviceGuard, DeviceId};

const MIB: usize = 1 << 20;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example peer_bandwidth: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example peer_bandwidth failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `copy` `reps` times after two warm-up runs, synchronizing `device` at the end, and
/// returns GB/s.
fn measure(
    bytes: usize,
    device: DeviceId,
    mut copy: impl FnMut() -> Result<(), MrError>,
) -> Result<f64, MrError> {
    let reps = ((1usize << 30) / bytes).clamp(5, 100);
    let sync = || -> Result<(), MrError> {
        let _g = DeviceGuard::new(device)?;
        rmm::sys::device_synchronize()?;
        Ok(())
    };
    copy()?;
    copy()?;
    sync()?;
    let t = Instant::now();
    for _ in 0..reps {
        copy()?;
    }
    sync()?;
    Ok((bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

fn run() -> Result<(), MrError> {
    let count = rmm::sys::device_count()?;
    if count < 2 {
        println!("rmm example peer_bandwidth: skipped, it needs two GPUs and found {count}");
        return Ok(());
    }
    let (d0, d1) = (DeviceId(0), DeviceId(1));
    let access = rmm::sys::ipc::can_access_peer(d1, d0)?;
    println!(
        "rmm example peer_bandwidth: {} -> {}, peer access {}",
        d0.name()?,
        d1.name()?,
        if access { "yes" } else { "no" }
    );
    let pool = {
        let _g = DeviceGuard::new(d0)?;
        CudaAsyncMemoryResource::new()?
    };
    if access {
        pool.set_peer_access(&[d1])?;
    }
    println!(
        "{:>9}  {:>22}  {:>26}",
        "size", "cuMemcpyPeerAsync GB/s", "pool access, pull GB/s"
    );
    let mut size = MIB;
    while size <= 256 * MIB {
        let s = CudaStreamView::default();
        let src = {
            let _g = DeviceGuard::new(d0)?;
            DeviceBuffer::new(size, s)?
        };
        let dst = {
            let _g = DeviceGuard::new(d1)?;
            DeviceBuffer::new(size, s)?
        };
        let peer = measure(size, d1, || {
            let _g = DeviceGuard::new(d1)?;
            // SAFETY: both buffers hold `size` bytes and outlive the copies, which `measure`
            // synchronizes before returning.
            unsafe {
                rmm::sys::ipc::memcpy_peer_async(dst.data(), d1, src.data(), d0, size, s.as_raw())
            }?;
            Ok(())
        })?;
        let pulled = if access {
            let p = {
                let _g = DeviceGuard::new(d0)?;
                pool.allocate(s, size, 256)?
            };
            let r = measure(size, d1, || {
                let _g = DeviceGuard::new(d1)?;
                // SAFETY: `p` (device 0, accessible from device 1) and `dst` hold `size` bytes
                // and outlive the copies, which `measure` synchronizes.
                unsafe { memory::memcpy_async(dst.data(), p, size, s.as_raw()) }?;
                Ok(())
            });
            {
                let _g = DeviceGuard::new(d0)?;
                // SAFETY: allocated above with this size; the copies were synchronized.
                unsafe { pool.deallocate(s, p, size, 256) }?;
            }
            format!("{:.1}", r?)
        } else {
            "-".to_owned()
        };
        println!("{:>5} MiB  {:>22.1}  {:>26}", size / MIB, peer, pulled);
        size *= 4;
    }
    Ok(())
}
