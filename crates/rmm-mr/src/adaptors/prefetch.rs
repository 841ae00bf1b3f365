//! The prefetch adaptor: migrate managed memory to the device as it is allocated.

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::{MrError, MrResult};
use crate::prefetch::{prefetch, PrefetchTarget};
use crate::resource::{DeviceMemoryResource, SharedResource};

struct Prefetch<U> {
    upstream: U,
}

/// Prefetches every allocation to the current device on the allocation's stream (RMM's
/// `prefetch_resource_adaptor`): after the upstream allocates, calls
/// [`prefetch`](crate::prefetch())`(ptr, bytes, PrefetchTarget::Device(current device), stream)`.
///
/// As with [`prefetch`](crate::prefetch()), this is a no-op for memory that is not managed and
/// on devices without concurrent managed access, so it may wrap any resource (typically a pool
/// over managed memory). Where no GPU or driver is usable at all (say, a host-memory test
/// resource on a machine without a GPU) there is nothing to prefetch and the allocation is
/// returned as is. Any other prefetch failure returns the memory to the upstream and fails the
/// allocation (RMM throws and leaks the block). The stream and alignment are forwarded.
/// Copies share state and are equal.
#[doc(alias = "rmm::mr::prefetch_resource_adaptor")]
pub struct PrefetchResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Prefetch<U>>,
}

impl<U: DeviceMemoryResource> Clone for PrefetchResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> PrefetchResourceAdaptor<U> {
    /// Prefetches what `upstream` allocates.
    pub fn new(upstream: U) -> Self {
        Self {
            inner: Arc::new(Prefetch { upstream }),
        }
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for PrefetchResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetchResourceAdaptor")
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

/// Prefetches `[ptr, ptr + bytes)` to the current device; "no GPU" counts as nothing to do.
fn prefetch_to_current_device(
    ptr: DevicePtr,
    bytes: usize,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if ptr.is_null() || bytes == 0 {
        return Ok(());
    }
    let result = rmm_sys::current_device()
        .map_err(MrError::from)
        .and_then(|device| prefetch(ptr, bytes, PrefetchTarget::Device(device), stream));
    match result {
        Err(e) if e.is_no_device() => Ok(()),
        other => other,
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for PrefetchResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let upstream = &self.inner.upstream;
        let ptr = upstream.allocate(stream, bytes, alignment)?;
        if let Err(e) = prefetch_to_current_device(ptr, bytes, stream) {
            // SAFETY: `ptr` was just allocated from the upstream with these arguments and is
            // not handed out; prefetching does not use it after failing.
            let _ = unsafe { upstream.deallocate(stream, ptr, bytes, alignment) };
            return Err(e);
        }
        Ok(ptr)
    }

    crate::resource::resource_tail! {
        deallocate: forward(inner.upstream),
        is_equal: shared(inner),
        properties: forward(inner.upstream),
        snapshot: forward(inner.upstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    #[test]
    fn allocates_through_the_upstream_and_forwards_alignment() {
        // Host memory is never managed: with or without a GPU the prefetch is a no-op.
        let up = HostMockResource::new();
        let mr = PrefetchResourceAdaptor::new(up.clone());
        let p = mr.allocate(s(), 4096, 128).unwrap();
        assert_eq!(up.last_alignment(), 128);
        assert_eq!(up.live_bytes(), 4096);
        assert_eq!(mr.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 4096, 128).unwrap() };
        assert_eq!(up.live_allocations(), 0);
        assert_eq!(mr.properties(), up.properties());
    }

    #[test]
    fn upstream_errors_pass_through() {
        let up = HostMockResource::new();
        up.fail_next_allocations(1);
        let mr = PrefetchResourceAdaptor::new(up.clone());
        assert!(mr.allocate(s(), 4096, 256).unwrap_err().is_out_of_memory());
        // SAFETY: exercising the upstream's detection of an unknown pointer.
        let e = unsafe { mr.deallocate(s(), DevicePtr::from_raw(0x1000), 8, 256) };
        assert!(matches!(e, Err(MrError::InvalidFree { .. })));
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = PrefetchResourceAdaptor::new(up.clone());
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&PrefetchResourceAdaptor::new(up.clone())));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }
}
