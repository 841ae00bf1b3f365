//! `cuMemAllocManaged` / `cuMemFree`.

use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DevicePtr};

use crate::error::MrResult;
use crate::resource::DeviceMemoryResource;
use crate::resources::cuda::{base_allocate, base_deallocate};

/// Managed (unified) memory from `cuMemAllocManaged`, accessible from the host and every
/// device (RMM's `managed_memory_resource`). The stream is ignored. Stateless: all instances
/// are equal.
#[doc(alias = "rmm::mr::managed_memory_resource")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ManagedMemoryResource;

impl ManagedMemoryResource {
    /// The resource (it holds no state).
    #[must_use]
    pub const fn new() -> Self {
        Self
    }
}

// SAFETY: every pointer comes from the driver's allocator, which returns a fresh,
// 256-byte aligned region of at least the bytes asked for, accessible as `properties` says,
// until it is freed here.
unsafe impl DeviceMemoryResource for ManagedMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        // `cuMemAllocManaged` rejects 0 bytes; the shared path answers them with null.
        base_allocate(bytes, alignment, memory::mem_alloc_managed)
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract: `ptr` came from `cuMemAllocManaged` here and is unused.
        base_deallocate(ptr, bytes, |p| unsafe { memory::mem_free(p) })
    }

    crate::resource::resource_tail! {
        is_equal: same_type,
        properties: HOST_DEVICE,
    }
}
