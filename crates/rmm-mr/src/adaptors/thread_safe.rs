//! The thread-safe adaptor: one lock around the upstream.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::MrResult;
use crate::resource::{DeviceMemoryResource, SharedResource};

struct ThreadSafe<U> {
    upstream: U,
    lock: Mutex<()>,
}

impl<U> ThreadSafe<U> {
    fn lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic in the upstream leaves nothing inconsistent here.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Serializes every allocation and deallocation of its upstream under one mutex (RMM's
/// `thread_safe_resource_adaptor`).
///
/// Every resource of this crate is already thread-safe; this is for user resources that are
/// `Send + Sync` in type but not safe to call concurrently in practice (e.g. a callback resource
/// over a single-threaded allocator). The synchronous entry points hold the lock only for the
/// upstream call, not while the stream synchronizes. Copies share the lock and are equal.
#[doc(alias = "rmm::mr::thread_safe_resource_adaptor")]
pub struct ThreadSafeResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<ThreadSafe<U>>,
}

impl<U: DeviceMemoryResource> Clone for ThreadSafeResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> ThreadSafeResourceAdaptor<U> {
    /// Serializes calls to `upstream`.
    pub fn new(upstream: U) -> Self {
        Self {
            inner: Arc::new(ThreadSafe {
                upstream,
                lock: Mutex::new(()),
            }),
        }
    }

    /// The upstream resource. Calling it directly bypasses the lock.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for ThreadSafeResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadSafeResourceAdaptor")
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for ThreadSafeResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let _guard = self.inner.lock();
        self.inner.upstream.allocate(stream, bytes, alignment)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let _guard = self.inner.lock();
        // SAFETY: forwarded contract.
        unsafe {
            self.inner
                .upstream
                .deallocate(stream, ptr, bytes, alignment)
        }
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
        snapshot: forward(inner.upstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    /// An upstream that notices when two calls overlap.
    #[derive(Debug, Default)]
    struct OverlapDetector {
        mock: HostMockResource,
        inside: AtomicUsize,
        overlaps: AtomicUsize,
    }

    impl OverlapDetector {
        fn enter(&self) {
            if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            // Widen the window so an unserialized caller would overlap.
            std::thread::yield_now();
        }

        fn leave(&self) {
            self.inside.fetch_sub(1, Ordering::SeqCst);
        }
    }

    // SAFETY: a test double that forwards to a `HostMockResource`, which keeps the contract.
    unsafe impl DeviceMemoryResource for OverlapDetector {
        fn allocate(
            &self,
            stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            self.enter();
            let r = self.mock.allocate(stream, bytes, alignment);
            self.leave();
            r
        }

        unsafe fn deallocate(
            &self,
            stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            self.enter();
            // SAFETY: forwarded contract.
            let r = unsafe { self.mock.deallocate(stream, ptr, bytes, alignment) };
            self.leave();
            r
        }

        crate::resource::resource_tail! {
            is_equal: identity,
        }
    }

    fn hammer<R: DeviceMemoryResource>(mr: &R) {
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for i in 0..300usize {
                        let bytes = 1 + i;
                        let p = mr.allocate(s(), bytes, 256).unwrap();
                        // SAFETY: `p` came from `mr` with `bytes`.
                        unsafe { mr.deallocate(s(), p, bytes, 256).unwrap() };
                    }
                });
            }
        });
    }

    #[test]
    fn serializes_upstream_calls() {
        let mr = ThreadSafeResourceAdaptor::new(OverlapDetector::default());
        hammer(&mr);
        assert_eq!(mr.upstream().overlaps.load(Ordering::SeqCst), 0);
        assert_eq!(mr.upstream().mock.allocation_calls(), 1200);
        assert_eq!(mr.upstream().mock.live_allocations(), 0);
    }

    #[test]
    fn the_detector_sees_overlaps_without_the_adaptor() {
        // Shows the test above can fail: the same load straight on the detector overlaps.
        let detector = OverlapDetector::default();
        for _ in 0..20 {
            hammer(&detector);
            if detector.overlaps.load(Ordering::SeqCst) > 0 {
                return;
            }
        }
        panic!("no overlap observed without serialization");
    }

    #[test]
    fn forwards_arguments_and_errors() {
        let up = HostMockResource::new();
        let mr = ThreadSafeResourceAdaptor::new(up.clone());
        let p = mr.allocate(s(), 100, 128).unwrap();
        assert_eq!(up.last_alignment(), 128);
        // SAFETY: exercising the upstream's size check; then the right free.
        unsafe {
            assert!(mr.deallocate(s(), p, 99, 128).is_err());
            mr.deallocate(s(), p, 100, 128).unwrap();
        }
        up.fail_next_allocations(1);
        assert!(mr.allocate(s(), 1, 256).unwrap_err().is_out_of_memory());
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = ThreadSafeResourceAdaptor::new(up.clone());
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&ThreadSafeResourceAdaptor::new(up.clone())));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }
}
