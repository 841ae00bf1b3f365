//! `cuMemAllocManaged` / `cuMemFree`.

use std::any::Any;

use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DevicePtr};

use crate::error::{MrError, MrResult};
use crate::resource::{check_base_alignment, DeviceMemoryResource, ResourceProperties};
use crate::resources::cuda::free_error;

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

impl DeviceMemoryResource for ManagedMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        check_base_alignment(alignment)?;
        if bytes == 0 {
            // `cuMemAllocManaged` rejects 0 bytes.
            return Ok(DevicePtr::NULL);
        }
        memory::mem_alloc_managed(bytes).map_err(|e| MrError::from_allocation(e, bytes))
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        // SAFETY: the trait's contract: `ptr` came from `cuMemAllocManaged` here and is unused.
        unsafe { memory::mem_free(ptr) }.map_err(|e| free_error(e, ptr, bytes))
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other.as_any().is::<Self>()
    }

    fn properties(&self) -> ResourceProperties {
        ResourceProperties::HOST_DEVICE
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
