//! The driver's stream-ordered allocator over a **host-located** pool (pinned host memory from
//! `cuMemAllocFromPoolAsync`), where the driver has such pools.

use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::host_mempool::{host_mem_pools_supported, mem_pool_create_host};
use rmm_sys::MemPoolHandle;
use rmm_sys::{mempool, DeviceGuard, DeviceId, DevicePtr, HostPoolLocation, MemPoolAttribute};

use crate::error::{MrError, MrResult};
use crate::resource::check_base_alignment;

/// The pool, destroyed with its last owner.
#[derive(Debug)]
struct HostPool {
    pool: MemPoolHandle,
    device: DeviceId,
}

impl Drop for HostPool {
    fn drop(&mut self) {
        let guard = DeviceGuard::new(self.device);
        // SAFETY: the pool was created by this resource, and this is its last owner (every
        // allocation holds no reference, but RMM's contract, kept here, is that all memory is
        // freed before the resource goes; the driver releases what is left once freed).
        let r = unsafe { mempool::mem_pool_destroy(self.pool) };
        drop(guard);
        if let Err(e) = r {
            log::error!("rmm: failed to destroy host memory pool: {e}");
        }
    }
}

/// Stream-ordered pinned **host** memory from a driver pool this resource owns
/// (`cuMemPoolCreate` with location `CU_MEM_LOCATION_TYPE_HOST` or `..._HOST_NUMA`,
/// `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the caller's stream), accessible from the
/// host and from the device current at construction (`cuMemPoolSetAccess`).
///
/// The driver has host pools from CUDA 12.6 (host NUMA) and 13.0 (any host memory) on devices
/// that report `CU_DEVICE_ATTRIBUTE_HOST_{NUMA_,}MEMORY_POOLS_SUPPORTED`; elsewhere
/// construction fails with [`MrError::Unsupported`]. The pool keeps what is freed (release
/// threshold `u64::MAX`, like [`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource)).
///
/// Unlike [`PinnedHostPool`](crate::PinnedHostPool) the driver orders reuse itself (a block
/// freed on one stream is reused on another after the free, through the pool's own events), and
/// allocation and free are stream-ordered: host code must not touch memory whose allocation has
/// not completed on its stream, nor after its free was enqueued.
#[doc(alias = "rmm::mr::cuda_async_pinned_memory_resource")]
#[doc(alias = "cudaMemPoolCreate")]
#[derive(Debug, Clone)]
pub struct CudaAsyncHostMemoryResource {
    inner: Arc<HostPool>,
}

impl CudaAsyncHostMemoryResource {
    /// A pool of any host memory (`CU_MEM_LOCATION_TYPE_HOST`) for the current device.
    pub fn new() -> MrResult<Self> {
        Self::at(HostPoolLocation::Host)
    }

    /// A pool at `location` for the current device; [`MrError::Unsupported`] where the driver or
    /// device lacks such pools.
    pub fn at(location: HostPoolLocation) -> MrResult<Self> {
        let device = DeviceId::current()?;
        if !host_mem_pools_supported(device, location)? {
            return Err(MrError::Unsupported(format!(
                "host-located memory pools ({location:?}) are not supported by this driver or \
                 device {} (CUDA 12.6+ for host NUMA pools, 13.0+ for host pools)",
                device.value()
            )));
        }
        let pool = mem_pool_create_host(location, device, 0)?;
        let inner = Arc::new(HostPool { pool, device });
        // SAFETY: the pool is live (owned by `inner`).
        unsafe {
            mempool::mem_pool_set_attribute(pool, MemPoolAttribute::ReleaseThreshold, u64::MAX)
        }?;
        Ok(Self { inner })
    }

    /// The driver's pool handle (live while this resource or a clone is).
    #[must_use]
    pub fn pool_handle(&self) -> MemPoolHandle {
        self.inner.pool
    }

    /// Bytes the pool holds from the system (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> MrResult<u64> {
        // SAFETY: the pool is live while `self` is.
        Ok(unsafe {
            mempool::mem_pool_get_attribute(self.inner.pool, MemPoolAttribute::ReservedMemCurrent)
        }?)
    }
}

// SAFETY: the pointers come from `cuMemAllocFromPoolAsync` on the pool this resource owns
// (256-byte aligned, at least `bytes`), usable in stream order on `stream`, accessible from the
// host and the device the pool's access was set for, and not handed out again until freed here.
unsafe impl crate::DeviceMemoryResource for CudaAsyncHostMemoryResource {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        check_base_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        // SAFETY: the stream view is a valid handle; the pool is live while `self` is.
        unsafe { mempool::mem_alloc_from_pool_async(bytes, self.inner.pool, stream.as_raw()) }
            .map_err(|e| MrError::from_allocation(e, bytes))
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        // SAFETY: the trait's contract: `ptr` came from this pool, is not freed, and work using
        // it is ordered before this point of `stream`.
        Ok(unsafe { mempool::mem_free_async(ptr, stream.as_raw()) }?)
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: HOST_DEVICE,
    }
}
