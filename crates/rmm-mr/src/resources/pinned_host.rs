//! `cuMemHostAlloc` / `cuMemFreeHost`.

use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::resource::{check_base_alignment, DeviceMemoryResource};
use crate::resources::cuda::base_deallocate;

/// Page-locked host memory from `cuMemHostAlloc`, accessible from the device (RMM's
/// `pinned_host_memory_resource`). The stream is ignored. Stateless: all instances are equal.
///
/// `cuMemHostAlloc` returns page-aligned memory, so unlike RMM no over-allocation is needed to
/// reach 256-byte alignment.
#[doc(alias = "rmm::mr::pinned_host_memory_resource")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PinnedHostMemoryResource;

impl PinnedHostMemoryResource {
    /// The resource (it holds no state).
    #[must_use]
    pub const fn new() -> Self {
        Self
    }
}

// SAFETY: every pointer comes from the driver's allocator, which returns a fresh,
// 256-byte aligned region of at least the bytes asked for, accessible as `properties` says,
// until it is freed here.
unsafe impl DeviceMemoryResource for PinnedHostMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        check_base_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let p = memory::mem_host_alloc(bytes).map_err(|e| MrError::from_allocation(e, bytes))?;
        if !p.is_aligned(ALLOCATION_ALIGNMENT) {
            // SAFETY: `p` was just allocated and never handed out.
            let _ = unsafe { memory::mem_free_host(p) };
            return Err(MrError::bad_alloc(
                "cuMemHostAlloc returned memory not 256-byte aligned",
            ));
        }
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract: `ptr` came from `cuMemHostAlloc` here and is unused.
        base_deallocate(ptr, bytes, |p| unsafe { memory::mem_free_host(p) })
    }

    crate::resource::resource_tail! {
        is_equal: same_type,
        properties: HOST_DEVICE,
    }
}
