//! Prefetching managed memory (RMM's `rmm::prefetch`).

use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DeviceCapabilities, DevicePtr, MemLocation, ResultCode};

use crate::error::MrResult;

/// Where to prefetch to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefetchTarget {
    /// A device.
    Device(rmm_sys::DeviceId),
    /// Host memory (RMM's `cudaCpuDeviceId`).
    Host,
}

/// Migrates `[ptr, ptr + bytes)` of managed memory to `target`, ordered on `stream`
/// (`cuMemPrefetchAsync`, with CUDA 13's location-based ABI where the driver has it).
///
/// As in RMM it is a no-op for memory that is not managed (`CUDA_ERROR_INVALID_VALUE` is
/// swallowed) and on devices without concurrent managed access; other errors are returned.
#[doc(alias = "rmm::prefetch")]
pub fn prefetch(
    ptr: DevicePtr,
    bytes: usize,
    target: PrefetchTarget,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if ptr.is_null() || bytes == 0 {
        return Ok(());
    }
    let device = rmm_sys::current_device()?;
    if !DeviceCapabilities::probe(device)?.concurrent_managed_access {
        return Ok(());
    }
    let location = match target {
        PrefetchTarget::Device(d) => MemLocation::Device(d.0),
        PrefetchTarget::Host => MemLocation::Host,
    };
    // SAFETY: the view's handle is valid (its invariant); prefetching never changes contents,
    // and the driver validates the range.
    match unsafe { memory::mem_prefetch_async(ptr, bytes, location, stream.as_raw()) } {
        Err(e) if e.code() == Some(ResultCode::INVALID_VALUE) => Ok(()),
        r => Ok(r?),
    }
}
