//! What the resources over a driver pool share ([`CudaAsyncMemoryResource`],
//! [`CudaAsyncViewMemoryResource`], [`CudaAsyncManagedMemoryResource`]): allocation from the
//! pool and the free with the cross-thread rule ([`pool_allocate`], [`pool_deallocate`]), and
//! their [`DeviceMemoryResource`] impl, written once for every [`DriverPool`].
//!
//! [`CudaAsyncMemoryResource`]: crate::CudaAsyncMemoryResource
//! [`CudaAsyncViewMemoryResource`]: crate::CudaAsyncViewMemoryResource
//! [`CudaAsyncManagedMemoryResource`]: crate::CudaAsyncManagedMemoryResource

use std::any::Any;
use std::fmt;

use rmm_stream::CudaStreamView;
use rmm_sys::mempool;
use rmm_sys::{DevicePtr, MemPoolHandle, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

use crate::error::{MrError, MrResult};
use crate::resource::{
    check_base_alignment, resource_cast, DeviceMemoryResource, ResourceProperties,
};
use crate::resources::cuda::free_error;
use crate::resources::pool_origins::{FreeOn, ORIGINS};
use crate::util::thread_life::thread_number;

/// A resource that allocates from one driver pool with [`pool_allocate`] and frees with
/// [`pool_deallocate`]: it implements [`DeviceMemoryResource`] through the impl below, and
/// says only what differs between such resources (which pool, when two are equal, where the
/// memory may be accessed).
///
/// # Safety
/// [`pool`](Self::pool) returns a pool that is live (not destroyed) while `self` exists.
pub(crate) unsafe trait DriverPool: Any + Send + Sync + fmt::Debug {
    /// Where the pool's memory may be accessed ([`DeviceMemoryResource::properties`]).
    const PROPERTIES: ResourceProperties;

    /// The pool every allocation comes from.
    fn pool(&self) -> MemPoolHandle;

    /// Whether memory allocated by `self` may be freed by `other` and vice versa
    /// ([`DeviceMemoryResource::is_equal`] for two resources of this type).
    fn same_pool(&self, other: &Self) -> bool;
}

// SAFETY: every pointer comes from the driver's allocator, which returns a fresh,
// 256-byte aligned region of at least the bytes asked for, accessible as `properties` says,
// until it is freed here.
unsafe impl<T: DriverPool> DeviceMemoryResource for T {
    #[inline]
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        // SAFETY: the pool is live while `self` exists (`DriverPool`'s contract).
        unsafe { pool_allocate(self.pool(), stream, bytes, alignment) }
    }

    #[inline]
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        unsafe { pool_deallocate(stream, ptr, bytes) }
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        resource_cast::<T>(other).is_some_and(|o| self.same_pool(o))
    }

    fn properties(&self) -> ResourceProperties {
        T::PROPERTIES
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `cuMemAllocFromPoolAsync` on `pool` (on the caller's stream).
///
/// # Safety
/// `pool` is a live pool (see [`MemPoolHandle`]).
pub(crate) unsafe fn pool_allocate(
    pool: MemPoolHandle,
    stream: CudaStreamView<'_>,
    bytes: usize,
    alignment: usize,
) -> MrResult<DevicePtr> {
    check_base_alignment(alignment)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    let raw = stream.as_raw();
    // Under an rmm-rs capture scope a capturing stream cannot allocate from an explicit pool
    // (the driver refuses `cuMemAllocFromPoolAsync` and the capture is lost): the allocation
    // becomes a graph memory node from the device's graph memory (`cuMemAllocAsync`), which
    // `cuMemFreeAsync` frees as any other. A stream outside the capture allocates in the relaxed
    // capture mode while a scope is active: the pool's growth is a potentially unsafe call, which
    // the driver refuses (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) on any thread while another
    // thread captures in the global mode. One relaxed load while no scope is active.
    let p = if crate::graph::active_capture_scopes() == 0 {
        // SAFETY: the view's handle is valid (its invariant) and the pool is live (the
        // caller's contract).
        unsafe { mempool::mem_alloc_from_pool_async(bytes, pool, raw) }
    } else if stream.capture_status().is_ok_and(|s| s.is_capturing()) {
        // SAFETY: the view's handle is valid (its invariant).
        unsafe { mempool::mem_alloc_async(bytes, raw) }
    } else {
        crate::graph::relaxed(|| {
            // SAFETY: as in the first branch.
            unsafe { mempool::mem_alloc_from_pool_async(bytes, pool, raw) }
        })
    }
    .map_err(|e| {
        // SAFETY: the pool is live (the caller's contract).
        unsafe {
            crate::resources::diagnostics::with_pool_report(
                MrError::from_allocation(e, bytes),
                pool,
                "cuda_async_memory_resource",
            )
        }
    })?;
    ORIGINS.allocated(p.addr(), per_thread(raw));
    Ok(p)
}

/// The calling thread's number when `raw` (a view's resolved handle) is its per-thread default
/// stream; `None` for a stream every thread shares.
#[inline]
fn per_thread(raw: rmm_sys::raw::CUstream) -> Option<u64> {
    (raw == CU_STREAM_PER_THREAD).then(thread_number)
}

/// `cuMemFreeAsync` on the caller's stream (the pool's handle is not needed, so this works
/// after the pool was destroyed, which the driver allows), or on the legacy default stream when
/// the free is made on a per-thread default stream and another thread's per-thread default
/// stream allocated the block (the cross-thread rule,
/// [`pool_origins`](crate::resources::pool_origins)).
///
/// # Safety
/// As [`DeviceMemoryResource::deallocate`].
pub(crate) unsafe fn pool_deallocate(
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
) -> MrResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let raw = stream.as_raw();
    let taken = ORIGINS.take(ptr.addr(), per_thread(raw));
    let on = match taken.on {
        FreeOn::Caller => raw,
        // The legacy stream waits for the work queued so far on every blocking stream: the
        // allocating thread's per-thread stream and this thread's.
        FreeOn::Legacy => CU_STREAM_LEGACY,
    };
    let free = || {
        // SAFETY: the caller's contract; the view's handle is valid, and the legacy stream's
        // is valid in every context.
        unsafe { mempool::mem_free_async(ptr, on) }
    };
    // While a scope is active, in the relaxed capture mode: the driver refuses the free (the
    // pool may give memory back) on any thread while another thread captures in the global
    // mode, as it refuses the pool's growth. One relaxed load while no scope is active.
    let freed = if crate::graph::active_capture_scopes() == 0 {
        free()
    } else {
        crate::graph::relaxed(free)
    };
    freed.map_err(|e| {
        ORIGINS.put_back(ptr.addr(), taken);
        free_error(e, ptr, bytes)
    })
}

#[cfg(test)]
mod tests {
    use rmm_sys::fault::{self, DriverCall, FaultScope};

    use super::*;

    /// A driver refusing a cross-thread free (the fault hook fails `cuMemFreeAsync` before any
    /// driver is looked for) leaves the block's record as it was, so a retry is still ordered.
    #[test]
    fn a_refused_cross_thread_free_keeps_its_record() {
        let _scope = FaultScope::new();
        // An address no other test records, allocated by a thread that is not this one.
        let addr = 0x7e00_0000_4200;
        let other = thread_number() + 1_000_000;
        ORIGINS.allocated(addr, Some(other));
        fault::fail_next(DriverCall::Free, 1);
        // SAFETY: the fault fails the free before any driver call.
        let r = unsafe {
            pool_deallocate(CudaStreamView::per_thread(), DevicePtr::from_raw(addr), 256)
        };
        assert!(r.is_err(), "the fault was not injected: {r:?}");
        assert_eq!(fault::injected(DriverCall::Free), 1);
        let again = ORIGINS.take(addr, Some(thread_number()));
        assert_eq!(again.on, FreeOn::Legacy, "the record was lost");
    }
}
