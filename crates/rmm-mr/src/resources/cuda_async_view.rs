//! The driver's stream-ordered allocator over a pool someone else owns.

use std::any::Any;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, MemPoolHandle};

use crate::error::{MrError, MrResult};
use crate::resource::{resource_cast, DeviceMemoryResource};
use crate::resources::cuda_async::{
    pool_allocate, pool_deallocate, pool_statistics, require_memory_pools, PoolStatistics,
};

/// Stream-ordered allocation from an existing driver pool that this resource does not own
/// (RMM's `cuda_async_view_memory_resource`), e.g. the device's default pool, which cudarc,
/// candle and cubecl allocate from. The pool must outlive the view; the view never destroys
/// it. Views of the same pool are equal.
#[doc(alias = "rmm::mr::cuda_async_view_memory_resource")]
#[derive(Debug, Clone, Copy)]
pub struct CudaAsyncViewMemoryResource {
    pool: MemPoolHandle,
}

impl CudaAsyncViewMemoryResource {
    /// A view of `pool`. A null pool, or a device without memory pools, is an invalid-argument
    /// error.
    pub fn new(pool: MemPoolHandle) -> MrResult<Self> {
        if pool.is_null() {
            return Err(MrError::invalid_argument("Unexpected null pool handle."));
        }
        require_memory_pools(rmm_sys::current_device()?)?;
        Ok(Self { pool })
    }

    /// A view of the current device's current pool (`cuDeviceGetMemPool`).
    pub fn current_device_pool() -> MrResult<Self> {
        let device = rmm_sys::current_device()?;
        Self::new(rmm_sys::mempool::device_current_mem_pool(device)?)
    }

    /// The pool.
    #[must_use]
    pub fn pool_handle(&self) -> MemPoolHandle {
        self.pool
    }

    /// Reserved and used bytes of the pool.
    pub fn statistics(&self) -> MrResult<PoolStatistics> {
        pool_statistics(self.pool)
    }
}

// SAFETY: every pointer comes from the driver's allocator, which returns a fresh,
// 256-byte aligned region of at least the bytes asked for, accessible as `properties` says,
// until it is freed here.
unsafe impl DeviceMemoryResource for CudaAsyncViewMemoryResource {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        pool_allocate(self.pool, stream, bytes, alignment)
    }

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
        resource_cast::<Self>(other).is_some_and(|o| o.pool == self.pool)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
