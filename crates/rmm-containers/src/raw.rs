//! The few raw calls the containers make: allocation and free through a resource, and copies and
//! memsets through rmm-sys. Each `unsafe` call lives here, behind a contract stated once.
//!
//! Callers (the containers) guarantee what the contracts below require by construction: a
//! container's `(data, capacity, alignment)` is exactly what its resource handed out, no range
//! they pass exceeds the container's `size()`, and the stream is the container's own (owned by
//! a [`BufferStream`](crate::BufferStream), so it is alive) or one the caller passed in for
//! the duration of the call.

use rmm_mr::{DeviceMemoryResource, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DevicePtr};

use crate::drop_errors::record_drop_error;

/// Allocates through `mr`; zero bytes never reach the resource (RMM: a zero-size buffer holds
/// `nullptr` and does not call its resource).
pub(crate) fn allocate(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    bytes: usize,
    alignment: usize,
) -> MrResult<DevicePtr> {
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    mr.allocate(stream, bytes, alignment)
}

/// Frees an allocation and records (instead of returning) a failure: this runs where no caller
/// can act on an error (drop, or the old allocation of a reallocation).
///
/// # Safety
/// `(ptr, bytes, alignment)` came from `mr.allocate` (or is `(NULL, 0, _)`), is freed once, and
/// no work that uses it is ordered after this point of `stream`.
pub(crate) unsafe fn free_recorded(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
    alignment: usize,
    what: &str,
) {
    if ptr.is_null() && bytes == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    if let Err(e) = unsafe { mr.deallocate(stream, ptr, bytes, alignment) } {
        record_drop_error(
            &format!("{what}: freeing {ptr} ({bytes} bytes) on stream {stream}"),
            e,
        );
    }
}

/// Copies `bytes` between two device (or host-accessible) ranges on `stream`, without waiting.
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes` bytes, on `stream`, until the stream
/// reaches the copy (both are allocations kept alive by their owners for that long, or the
/// caller vouches for them).
pub(crate) unsafe fn copy_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract; the view's handle is alive (its invariant).
    unsafe { memory::memcpy_async(dst, src, bytes, stream.as_raw()) }?;
    Ok(())
}

/// Copies a host slice to device memory and waits for the copy, so the slice may be reused or
/// freed on return (it may be pinned memory, which the driver reads asynchronously).
///
/// # Safety
/// `dst` is writable for `src.len()` bytes on `stream`.
pub(crate) unsafe fn copy_from_host_sync(
    dst: DevicePtr,
    src: &[u8],
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    // SAFETY: the caller's contract; the view's handle is alive.
    unsafe { memory::copy_to_device_sync(dst, src, stream.as_raw()) }?;
    Ok(())
}

/// Copies one host value to device memory on `stream` without waiting for the device.
///
/// The value is first copied into a local on this function's stack, and the copy is issued
/// from there: stack memory is pageable, and for pageable sources the driver stages the bytes
/// before `cuMemcpyAsync` returns (CUDA's "API synchronization behavior": "the function will
/// return once the pageable buffer has been copied to the staging memory"). So neither the
/// local nor `value` is read after return, whatever memory `value` lives in (RMM forbids
/// temporaries here for the same reason; this makes any reference fine).
///
/// # Safety
/// `dst` is writable for `size_of::<T>()` bytes on `stream`.
pub(crate) unsafe fn copy_value_async<T: bytemuck::Pod>(
    dst: DevicePtr,
    value: &T,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    let staged: T = *value;
    let bytes = bytemuck::bytes_of(&staged);
    // SAFETY: `dst`: the caller's contract; the source is `staged`, pageable stack memory that
    // is alive for the call, and staged by the driver before it returns (see above).
    unsafe {
        copy_async(
            dst,
            DevicePtr::from_host_ptr(bytes.as_ptr().cast_mut()),
            bytes.len(),
            stream,
        )
    }
}

/// Copies device memory into a host slice and waits for the copy.
///
/// # Safety
/// `src` is readable for `dst.len()` bytes on `stream`.
pub(crate) unsafe fn copy_to_host_sync(
    dst: &mut [u8],
    src: DevicePtr,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    // SAFETY: the caller's contract; `dst` is an exclusive host slice alive until the copy
    // completed (the function synchronizes).
    unsafe { memory::copy_to_host_sync(dst, src, stream.as_raw()) }?;
    Ok(())
}

/// Writes `bytes` zero bytes at `dst` on `stream`.
///
/// # Safety
/// `dst` is writable for `bytes` bytes on `stream`.
pub(crate) unsafe fn zero_async(
    dst: DevicePtr,
    bytes: usize,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    unsafe { memory::memset_d8_async(dst, 0, bytes, stream.as_raw()) }?;
    Ok(())
}
