//! The driver's stream-ordered allocator over a pool this resource owns.

use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::mempool::{self};
use rmm_sys::{
    AllocationHandleType, DeviceCapabilities, DeviceGuard, DeviceId, MemPoolAttribute,
    MemPoolHandle, MemPoolUsage,
};

use crate::error::{MrError, MrResult};
use crate::resource::ResourceProperties;
use crate::resources::driver_pool::{pool_allocate, pool_deallocate, DriverPool};
use crate::resources::pool_statistics::{pool_statistics, PoolStatistics};

/// How to build a [`CudaAsyncMemoryResource`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) or `default()` (RMM's defaults) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CudaAsyncOptions {
    /// If set, the pool is primed by allocating and freeing this many bytes at construction.
    pub initial_pool_size: Option<usize>,
    /// Bytes the pool keeps reserved across synchronizations; `None` means `u64::MAX` (never
    /// release on synchronize), RMM's default since 26.06.
    pub release_threshold: Option<u64>,
    /// The export handle type the pool's memory supports (IPC, fabric).
    pub export_handle_type: Option<AllocationHandleType>,
}

impl CudaAsyncOptions {
    /// RMM's defaults: no priming, release threshold `u64::MAX`, no export handle.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the field `initial_pool_size` to `Some(bytes)`.
    #[must_use]
    pub fn initial_pool_size(mut self, bytes: usize) -> Self {
        self.initial_pool_size = Some(bytes);
        self
    }

    /// Sets the field `release_threshold` to `Some(bytes)`.
    #[must_use]
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = Some(bytes);
        self
    }

    /// Sets the field `export_handle_type` to `Some(handle_type)`.
    #[must_use]
    pub fn export_handle_type(mut self, handle_type: AllocationHandleType) -> Self {
        self.export_handle_type = Some(handle_type);
        self
    }
}

pub(crate) fn require_memory_pools(device: DeviceId) -> MrResult<DeviceCapabilities> {
    let caps = DeviceCapabilities::probe(device)?;
    if !caps.memory_pools_supported {
        return Err(MrError::Unsupported(format!(
            "cudaMallocAsync not supported with this CUDA driver/runtime version: device \
             {device} lacks memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)"
        )));
    }
    Ok(caps)
}

/// A pool this crate created, destroyed when the last owner drops it: shared by the clones of a
/// [`CudaAsyncMemoryResource`] and the views made from them
/// ([`CudaAsyncViewMemoryResource::of`](crate::CudaAsyncViewMemoryResource::of)).
#[derive(Debug)]
pub(crate) struct OwnedPool {
    /// Invariant: live until this value drops.
    pool: MemPoolHandle,
    device: DeviceId,
}

impl Drop for OwnedPool {
    fn drop(&mut self) {
        let guard = DeviceGuard::new(self.device);
        // SAFETY: the pool was created by this resource, and this is its last owner.
        let r = unsafe { mempool::mem_pool_destroy(self.pool) };
        drop(guard);
        if let Err(e) = r {
            log::error!("rmm: failed to destroy memory pool: {e}");
        }
    }
}

/// Stream-ordered allocation from a driver memory pool this resource creates and owns (RMM's
/// `cuda_async_memory_resource`): `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the
/// caller's stream. The pool is RMM's: pinned device memory of the current device, with the
/// hardware-decompression usage on drivers for CUDA 12.8 and later
/// ([`MemPoolUsage::rmm_default`]), so its memory may serve the decompression engine as
/// `cuMemAlloc`'s may. Cross-stream reuse and release are the driver's. Copies share the pool and
/// compare equal; two resources own two pools and are unequal.
///
/// Beyond RMM: [`trim_to`](Self::trim_to), live [`statistics`](Self::statistics), and
/// [`view`](Self::view), a [`CudaAsyncViewMemoryResource`](crate::CudaAsyncViewMemoryResource) sharing ownership of the pool.
///
/// # Frees from another thread on the per-thread default stream
///
/// The driver orders a free only after the freeing stream. A block allocated on one thread's
/// per-thread default stream and freed on another thread's (a `Send` buffer on
/// [`CudaStreamView::per_thread()`], or on the default stream in per-thread mode, dropped on
/// another thread) would be reusable by the freeing thread's stream at once, while the
/// allocating thread's work on it may still run. Unlike RMM, this resource orders such a free as
/// the sub-allocators do ([`PoolMemoryResource`](crate::PoolMemoryResource) and the others): it
/// remembers which thread's per-thread stream allocated each block and frees a block another
/// thread's per-thread stream allocated on the **legacy** default stream, which waits for the
/// work queued so far on both threads' streams. A free on the allocating thread, on the legacy
/// stream or on an ordinary stream is made where the caller says. The record costs an insertion
/// into a sharded table on each allocation made on a per-thread default stream and a removal on
/// each free made on one; allocations and frees on other streams add a comparison (and, once any
/// block was recorded, a removal on free). The same holds for
/// [`CudaAsyncViewMemoryResource`](crate::CudaAsyncViewMemoryResource) and
/// [`CudaAsyncManagedMemoryResource`](crate::CudaAsyncManagedMemoryResource). The rule's limit
/// (work of a third thread): `docs/internals/cross-thread.md`.
#[doc(alias = "rmm::mr::cuda_async_memory_resource")]
#[derive(Debug, Clone)]
pub struct CudaAsyncMemoryResource {
    inner: Arc<OwnedPool>,
}

impl CudaAsyncMemoryResource {
    /// A pool on the current device with RMM's defaults (no priming, release threshold
    /// `u64::MAX`, no export handle).
    pub fn new() -> MrResult<Self> {
        Self::with_options(CudaAsyncOptions::default())
    }

    /// A pool on the current device with `options`. Fails with [`MrError::Unsupported`] where
    /// the device lacks memory pools or the export handle type.
    pub fn with_options(options: CudaAsyncOptions) -> MrResult<Self> {
        let device = rmm_sys::current_device()?;
        let caps = require_memory_pools(device)?;
        let handle = options
            .export_handle_type
            .unwrap_or(AllocationHandleType::None);
        if !caps.supports_handle_type(handle) {
            return Err(MrError::Unsupported(format!(
                "Requested IPC memory handle type not supported: {handle:?} (device supports {:#x})",
                caps.supported_handle_types
            )));
        }
        // RMM's pool: hardware-decompression usage where the driver knows it (12.8+), so that
        // the pool's memory may serve the decompression engine as `cuMemAlloc`'s may.
        let usage = MemPoolUsage::rmm_default(rmm_sys::driver_version()?);
        let pool = mempool::mem_pool_create_with_usage(device, handle, usage)?;
        let this = Self {
            inner: Arc::new(OwnedPool { pool, device }),
        };
        this.set_release_threshold(options.release_threshold.unwrap_or(u64::MAX))?;
        if let Some(initial) = options.initial_pool_size.filter(|&n| n > 0) {
            let stream = CudaStreamView::legacy();
            // SAFETY: `this` owns the pool, so it is live.
            let p = unsafe { pool_allocate(pool, stream, initial, 256)? };
            // SAFETY: `p` was just allocated on this stream and never used.
            unsafe { pool_deallocate(stream, p, initial)? };
            stream.synchronize()?;
        }
        Ok(this)
    }

    /// The driver pool (`cudaMemPool_t`). The handle does not keep the pool alive: it is
    /// live while this resource, a clone of it or a [`view`](Self::view) of it exists.
    #[must_use]
    pub fn pool_handle(&self) -> MemPoolHandle {
        self.inner.pool
    }

    /// The shared owner of the pool, for views.
    pub(crate) fn owned_pool(&self) -> &Arc<OwnedPool> {
        &self.inner
    }

    /// The device the pool lives on.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.inner.device
    }

    /// The pool's release threshold.
    pub fn release_threshold(&self) -> MrResult<u64> {
        // SAFETY: `self` owns the pool, so it is live.
        Ok(unsafe {
            mempool::mem_pool_get_attribute(self.inner.pool, MemPoolAttribute::ReleaseThreshold)
        }?)
    }

    /// Sets the pool's release threshold.
    pub fn set_release_threshold(&self, bytes: u64) -> MrResult<()> {
        // SAFETY: `self` owns the pool, so it is live.
        Ok(unsafe {
            mempool::mem_pool_set_attribute(
                self.inner.pool,
                MemPoolAttribute::ReleaseThreshold,
                bytes,
            )
        }?)
    }

    /// Releases unused pool memory to the driver until at most `min_bytes_to_keep` stay
    /// reserved (`cuMemPoolTrimTo`); memory freed on streams with pending work stays.
    pub fn trim_to(&self, min_bytes_to_keep: usize) -> MrResult<()> {
        // SAFETY: `self` owns the pool, so it is live.
        Ok(unsafe { mempool::mem_pool_trim_to(self.inner.pool, min_bytes_to_keep) }?)
    }

    /// Reserved and used bytes of the pool, current and high watermarks.
    pub fn statistics(&self) -> MrResult<PoolStatistics> {
        // SAFETY: `self` owns the pool, so it is live.
        unsafe { pool_statistics(self.inner.pool) }
    }
}

// SAFETY: `self` owns the pool (shared with its clones and views), so it is live while `self`
// exists.
unsafe impl DriverPool for CudaAsyncMemoryResource {
    const PROPERTIES: ResourceProperties = ResourceProperties::DEVICE;

    #[inline]
    fn pool(&self) -> MemPoolHandle {
        self.inner.pool
    }

    /// Copies share the pool; two resources own two pools.
    fn same_pool(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
