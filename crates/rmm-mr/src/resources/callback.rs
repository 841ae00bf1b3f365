//! A resource made of two closures.

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::MrResult;
use crate::resource::DeviceMemoryResource;
use crate::util::alignment;

/// The allocation closure: `(bytes, stream) -> pointer`.
pub type AllocateCallback = dyn Fn(usize, CudaStreamView<'_>) -> MrResult<DevicePtr> + Send + Sync;
/// The deallocation closure: `(pointer, bytes, stream)`.
pub type DeallocateCallback =
    dyn Fn(DevicePtr, usize, CudaStreamView<'_>) -> MrResult<()> + Send + Sync;

struct Callbacks {
    allocate: Box<AllocateCallback>,
    deallocate: Box<DeallocateCallback>,
}

/// A resource that delegates to user closures (RMM's `callback_memory_resource`, with closures
/// in place of C function pointers plus `void*` arguments, so captured state lives exactly as
/// long as the resource). The alignment argument is not passed on: the closures promise 256
/// bytes, so 0 and powers of two up to 256 are accepted and anything else is
/// [`MrError::BadAlloc`](crate::MrError::BadAlloc) before the closure is called (RMM ignores
/// the argument). A non-null pointer the allocation closure returns that is not 256-byte
/// aligned goes back to the deallocation closure at once and the allocation fails with
/// [`MrError::BadAlloc`](crate::MrError::BadAlloc). Copies share the closures and are equal;
/// separately built resources are not.
#[doc(alias = "rmm::mr::callback_memory_resource")]
#[derive(Clone)]
pub struct CallbackMemoryResource {
    inner: Arc<Callbacks>,
}

impl CallbackMemoryResource {
    /// A resource calling `allocate` and `deallocate`.
    ///
    /// # Safety
    /// Containers and sub-allocators trust the pointers `allocate` returns, so the closures
    /// must keep the [`DeviceMemoryResource`] contract (its "Safety" section): `allocate(bytes,
    /// stream)` returns null or a 256-byte aligned region of at least `bytes` bytes, accessible
    /// on the device, usable on `stream`, overlapping no other live allocation, and valid until
    /// `deallocate` is called with it (or the resource is dropped). A closure that returns, for
    /// example, the address of a small host object lets safe code write past it.
    ///
    /// ```compile_fail,E0133
    /// use rmm_mr::CallbackMemoryResource;
    /// use rmm_sys::DevicePtr;
    /// // Building it is a promise about the closures, so it needs `unsafe`.
    /// let mr = CallbackMemoryResource::new(|_, _| Ok(DevicePtr::NULL), |_, _, _| Ok(()));
    /// ```
    pub unsafe fn new<A, D>(allocate: A, deallocate: D) -> Self
    where
        A: Fn(usize, CudaStreamView<'_>) -> MrResult<DevicePtr> + Send + Sync + 'static,
        D: Fn(DevicePtr, usize, CudaStreamView<'_>) -> MrResult<()> + Send + Sync + 'static,
    {
        Self {
            inner: Arc::new(Callbacks {
                allocate: Box::new(allocate),
                deallocate: Box::new(deallocate),
            }),
        }
    }
}

impl fmt::Debug for CallbackMemoryResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallbackMemoryResource({:p})", Arc::as_ptr(&self.inner))
    }
}

// SAFETY: `CallbackMemoryResource::new` is `unsafe`: its caller promised that the closures keep
// this trait's contract.
unsafe impl DeviceMemoryResource for CallbackMemoryResource {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        alignment::check(alignment, ALLOCATION_ALIGNMENT)?;
        let ptr = (self.inner.allocate)(bytes, stream)?;
        if ptr.is_aligned(ALLOCATION_ALIGNMENT) {
            return Ok(ptr);
        }
        if let Err(e) = (self.inner.deallocate)(ptr, bytes, stream) {
            log::error!("rmm: callback_memory_resource could not give {ptr} back: {e}");
        }
        Err(alignment::misaligned_upstream(
            ptr,
            ALLOCATION_ALIGNMENT,
            "callback_memory_resource",
        ))
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        (self.inner.deallocate)(ptr, bytes, stream)
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
    }
}
