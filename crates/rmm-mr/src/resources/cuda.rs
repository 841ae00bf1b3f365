//! `cuMemAlloc` / `cuMemFree`.

use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DevicePtr, ResultCode};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{check_base_alignment, DeviceMemoryResource};

/// Device memory from `cuMemAlloc`, freed with `cuMemFree` (RMM's `cuda_memory_resource`, the
/// initial per-device resource). The stream is ignored: `cuMemAlloc` is synchronous and
/// `cuMemFree` synchronizes the device. Stateless: all instances are equal.
#[doc(alias = "rmm::mr::cuda_memory_resource")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CudaMemoryResource;

impl CudaMemoryResource {
    /// The resource (it holds no state).
    #[must_use]
    pub const fn new() -> Self {
        Self
    }
}

/// Maps a failed free the way every base resource does: `CUDA_ERROR_INVALID_VALUE` means the
/// driver does not know the address.
pub(crate) fn free_error(e: rmm_sys::CudaError, ptr: DevicePtr, bytes: usize) -> MrError {
    if e.code() == Some(ResultCode::INVALID_VALUE) {
        MrError::InvalidFree {
            ptr,
            bytes,
            kind: InvalidFree::UnknownPointer,
        }
    } else {
        MrError::Cuda(e)
    }
}

/// The allocate path every synchronous base resource shares: check the alignment, answer 0 bytes
/// with null without touching CUDA, map the driver's failure like `RMM_CUDA_TRY_ALLOC`.
pub(crate) fn base_allocate(
    bytes: usize,
    alignment: usize,
    alloc: impl FnOnce(usize) -> rmm_sys::CudaResult<DevicePtr>,
) -> MrResult<DevicePtr> {
    check_base_alignment(alignment)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    alloc(bytes).map_err(|e| MrError::from_allocation(e, bytes))
}

/// The free path every synchronous base resource shares: null is a no-op, an address the
/// driver does not know is [`InvalidFree::UnknownPointer`].
pub(crate) fn base_deallocate(
    ptr: DevicePtr,
    bytes: usize,
    free: impl FnOnce(DevicePtr) -> rmm_sys::CudaResult<()>,
) -> MrResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    free(ptr).map_err(|e| free_error(e, ptr, bytes))
}

// SAFETY: every pointer comes from the driver's allocator, which returns a fresh,
// 256-byte aligned region of at least the bytes asked for, accessible as `properties` says,
// until it is freed here.
unsafe impl DeviceMemoryResource for CudaMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        base_allocate(bytes, alignment, memory::mem_alloc)
            .map_err(|e| super::diagnostics::with_device_report(e, "cuda_memory_resource"))
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract: `ptr` came from `cuMemAlloc` here and is unused.
        base_deallocate(ptr, bytes, |p| unsafe { memory::mem_free(p) })
    }

    crate::resource::resource_tail! {
        is_equal: same_type,
    }
}
