//! The driver's stream-ordered allocator over the device's default managed pool (CUDA 13).

use rmm_sys::{DeviceCapabilities, DriverVersion, MemPoolHandle};

use crate::error::{MrError, MrResult};
use crate::resource::ResourceProperties;
use crate::resources::driver_pool::DriverPool;
use crate::resources::pool_statistics::{pool_statistics, PoolStatistics};

/// Stream-ordered managed memory from the device's default managed pool
/// (`cuMemGetDefaultMemPool`, CUDA 13; RMM's `cuda_async_managed_memory_resource`). The pool's
/// attributes are left as they are. Instances on one device share the pool and are equal.
///
/// A block allocated on one thread's per-thread default stream and freed on another thread's is
/// freed on the legacy default stream, after both threads' work, as with
/// [`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource) (see its section on such frees).
#[doc(alias = "rmm::mr::cuda_async_managed_memory_resource")]
#[derive(Debug, Clone, Copy)]
pub struct CudaAsyncManagedMemoryResource {
    /// The device's default managed pool, which the driver never destroys.
    pool: MemPoolHandle,
}

impl CudaAsyncManagedMemoryResource {
    /// The current device's default managed pool. [`MrError::Unsupported`] unless the driver is
    /// CUDA 13 or newer and the device has concurrent managed access.
    pub fn new() -> MrResult<Self> {
        let version = rmm_sys::driver_version()?;
        if version < DriverVersion::CUDA_13_0 {
            return Err(MrError::Unsupported(format!(
                "cuda_async_managed_memory_resource requires CUDA 13.0 or newer (driver supports {version})"
            )));
        }
        let device = rmm_sys::current_device()?;
        if !DeviceCapabilities::probe(device)?.concurrent_managed_access {
            return Err(MrError::Unsupported(format!(
                "cuda_async_managed_memory_resource requires concurrent managed access (device {device} lacks it)"
            )));
        }
        let pool = rmm_sys::mempool::default_managed_mem_pool(device)?;
        Ok(Self { pool })
    }

    /// The default managed pool.
    #[must_use]
    pub fn pool_handle(&self) -> MemPoolHandle {
        self.pool
    }

    /// Reserved and used bytes of the pool.
    pub fn statistics(&self) -> MrResult<PoolStatistics> {
        // SAFETY: a default pool is never destroyed, so it is live.
        unsafe { pool_statistics(self.pool) }
    }
}

// SAFETY: a default pool is never destroyed, so it is live.
unsafe impl DriverPool for CudaAsyncManagedMemoryResource {
    const PROPERTIES: ResourceProperties = ResourceProperties::HOST_DEVICE;

    #[inline]
    fn pool(&self) -> MemPoolHandle {
        self.pool
    }

    fn same_pool(&self, other: &Self) -> bool {
        self.pool == other.pool
    }
}
