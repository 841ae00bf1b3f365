//! The driver's stream-ordered allocator over a pool someone else owns.

use std::sync::Arc;

use rmm_sys::MemPoolHandle;

use crate::error::{MrError, MrResult};
use crate::resource::ResourceProperties;
use crate::resources::cuda_async::{require_memory_pools, CudaAsyncMemoryResource, OwnedPool};
use crate::resources::driver_pool::DriverPool;
use crate::resources::pool_statistics::{pool_statistics, PoolStatistics};

/// Stream-ordered allocation from an existing driver pool that this resource does not own
/// (RMM's `cuda_async_view_memory_resource`), e.g. the device's default pool, which cudarc,
/// candle and cubecl allocate from. The view never destroys the pool. Views of the same pool
/// are equal.
///
/// **The pool outlives the view.** The safe constructors guarantee it:
/// [`of`](Self::of) (or [`CudaAsyncMemoryResource::view`]) shares ownership of a
/// [`CudaAsyncMemoryResource`]'s pool, so the pool lives until the last view and the resource
/// are gone; [`default_device_pool`](Self::default_device_pool) views a pool the driver never
/// destroys. [`new`](Self::new), from a raw handle, and
/// [`current_device_pool`](Self::current_device_pool) are `unsafe`: their caller vouches for
/// the pool's lifetime. (Departure from RMM, whose constructor takes any `cudaMemPool_t`: in
/// Rust a safe constructor must not let a destroyed pool be used.)
///
/// A block allocated on one thread's per-thread default stream and freed on another thread's is
/// freed on the legacy default stream, after both threads' work, as with
/// [`CudaAsyncMemoryResource`] (see its section on such frees).
#[doc(alias = "rmm::mr::cuda_async_view_memory_resource")]
#[derive(Debug, Clone)]
pub struct CudaAsyncViewMemoryResource {
    /// Invariant: live (not destroyed) as long as this value exists.
    pool: MemPoolHandle,
    /// The owner of the pool, shared, when the view was made with [`of`](Self::of).
    _owner: Option<Arc<OwnedPool>>,
}

impl CudaAsyncViewMemoryResource {
    /// A view of `pool`. A null pool is an invalid-argument error, a device without memory
    /// pools [`MrError::Unsupported`].
    ///
    /// Prefer [`of`](Self::of) for a pool a [`CudaAsyncMemoryResource`] owns, and
    /// [`default_device_pool`](Self::default_device_pool) for the device's default pool.
    ///
    /// # Safety
    /// `pool` is a live driver pool (created with `cuMemPoolCreate` and not destroyed, or a
    /// device's default pool), and it is not destroyed while the view or any clone of it
    /// exists: every allocation and statistics call of the view hands the handle to the
    /// driver. (Memory allocated through the view may still be freed through it after the
    /// pool was destroyed: the driver releases a destroyed pool's memory once it is all
    /// freed, and a free does not use the handle.)
    ///
    /// It cannot be called from safe code:
    ///
    /// ```compile_fail,E0133
    /// use rmm_mr::CudaAsyncViewMemoryResource;
    /// use rmm_sys::MemPoolHandle;
    /// let dangling = MemPoolHandle::from_raw(8 as rmm_sys::raw::CUmemoryPool);
    /// let _view = CudaAsyncViewMemoryResource::new(dangling);
    /// ```
    pub unsafe fn new(pool: MemPoolHandle) -> MrResult<Self> {
        if pool.is_null() {
            return Err(MrError::invalid_argument("Unexpected null pool handle."));
        }
        require_memory_pools(rmm_sys::current_device()?)?;
        Ok(Self { pool, _owner: None })
    }

    /// A view of the pool `resource` owns, sharing its ownership: the pool stays alive until
    /// this view, its clones, `resource` and its clones are all dropped, so the view may
    /// outlive the `resource` value it was made from.
    #[must_use]
    pub fn of(resource: &CudaAsyncMemoryResource) -> Self {
        Self {
            pool: resource.pool_handle(),
            _owner: Some(Arc::clone(resource.owned_pool())),
        }
    }

    /// A view of the current device's **default** pool (`cuDeviceGetDefaultMemPool`), which
    /// the driver never destroys. It is the pool cudarc, candle and cubecl allocate from
    /// (`cuMemAllocAsync`) unless some code replaced the device's current pool with
    /// `cuDeviceSetMemPool`.
    pub fn default_device_pool() -> MrResult<Self> {
        let device = rmm_sys::current_device()?;
        require_memory_pools(device)?;
        let pool = rmm_sys::mempool::device_default_mem_pool(device)?;
        if pool.is_null() {
            return Err(MrError::invalid_argument("Unexpected null pool handle."));
        }
        // The default pool cannot be destroyed (`cuMemPoolDestroy` refuses it), so it is live
        // for the process: the invariant holds without an owner.
        Ok(Self { pool, _owner: None })
    }

    /// A view of the current device's **current** pool (`cuDeviceGetMemPool`), whatever
    /// `cuMemAllocAsync` allocates from now.
    ///
    /// # Safety
    /// As [`new`](Self::new): the pool current now is not destroyed while the view or a clone
    /// exists. That holds when it is the device's default pool (then prefer the safe
    /// [`default_device_pool`](Self::default_device_pool)); a pool that other code made current
    /// with `cuDeviceSetMemPool` may be destroyed by that code at any time (the default one
    /// then becomes current again), so its owner must keep it alive for the view.
    pub unsafe fn current_device_pool() -> MrResult<Self> {
        let device = rmm_sys::current_device()?;
        // SAFETY: the caller's contract.
        unsafe { Self::new(rmm_sys::mempool::device_current_mem_pool(device)?) }
    }

    /// The pool. The handle does not keep it alive: use it only while this view exists.
    #[must_use]
    pub fn pool_handle(&self) -> MemPoolHandle {
        self.pool
    }

    /// Reserved and used bytes of the pool.
    pub fn statistics(&self) -> MrResult<PoolStatistics> {
        // SAFETY: the pool is live while the view exists (the type's invariant).
        unsafe { pool_statistics(self.pool) }
    }
}

impl CudaAsyncMemoryResource {
    /// A [`CudaAsyncViewMemoryResource`] of this resource's pool that shares its ownership, so
    /// the view keeps the pool alive after this resource is dropped
    /// ([`CudaAsyncViewMemoryResource::of`]).
    #[must_use]
    pub fn view(&self) -> CudaAsyncViewMemoryResource {
        CudaAsyncViewMemoryResource::of(self)
    }
}

// SAFETY: the pool is live while the view exists (the type's invariant).
unsafe impl DriverPool for CudaAsyncViewMemoryResource {
    const PROPERTIES: ResourceProperties = ResourceProperties::DEVICE;

    #[inline]
    fn pool(&self) -> MemPoolHandle {
        self.pool
    }

    /// Views of the same pool are equal.
    fn same_pool(&self, other: &Self) -> bool {
        self.pool == other.pool
    }
}
