//! The limiting adaptor.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::resource::{
    same_shared_state, DeviceMemoryResource, ResourceProperties, SharedResource,
};

struct Limiting<U> {
    upstream: U,
    limit: usize,
    alignment: usize,
    allocated: AtomicUsize,
}

/// Caps the bytes outstanding through it (RMM's `limiting_resource_adaptor`). Each request
/// reserves `align_up(bytes, alignment)` atomically *before* calling the upstream; over the
/// limit it is rolled back and the request fails with out-of-memory (exactly reaching the limit
/// is allowed); an upstream failure is rolled back and passed on. Copies share the counter and
/// are equal.
#[doc(alias = "rmm::mr::limiting_resource_adaptor")]
pub struct LimitingResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Limiting<U>>,
}

impl<U: DeviceMemoryResource> Clone for LimitingResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> LimitingResourceAdaptor<U> {
    /// Limits `upstream` to `allocation_limit` bytes, counting sizes rounded up to 256.
    pub fn new(upstream: U, allocation_limit: usize) -> Self {
        Self::build(upstream, allocation_limit, ALLOCATION_ALIGNMENT)
    }

    /// As [`new`](Self::new), rounding sizes to `alignment` (a power of two) for the count.
    pub fn with_alignment(
        upstream: U,
        allocation_limit: usize,
        alignment: usize,
    ) -> MrResult<Self> {
        if !is_pow2(alignment) {
            return Err(MrError::invalid_argument(format!(
                "limiting_resource_adaptor alignment must be a power of two, not {alignment}"
            )));
        }
        Ok(Self::build(upstream, allocation_limit, alignment))
    }

    fn build(upstream: U, limit: usize, alignment: usize) -> Self {
        Self {
            inner: Arc::new(Limiting {
                upstream,
                limit,
                alignment,
                allocated: AtomicUsize::new(0),
            }),
        }
    }

    /// The upstream resource.
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// Bytes outstanding (rounded as counted).
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.inner.allocated.load(Ordering::Relaxed)
    }

    /// The limit.
    #[must_use]
    pub fn allocation_limit(&self) -> usize {
        self.inner.limit
    }

    fn counted(&self, bytes: usize) -> Option<usize> {
        checked_align_up(bytes, self.inner.alignment)
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for LimitingResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitingResourceAdaptor")
            .field("limit", &self.inner.limit)
            .field("allocated", &self.allocated_bytes())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

impl<U: DeviceMemoryResource> DeviceMemoryResource for LimitingResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let exceeded = || {
            MrError::out_of_memory(
                bytes,
                format!("Exceeded memory limit (failed to allocate {bytes} bytes)"),
            )
        };
        let size = self.counted(bytes).ok_or_else(exceeded)?;
        let counter = &self.inner.allocated;
        // Reserve first, so concurrent requests can never overshoot the limit together.
        let reserved = counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(size).filter(|&n| n <= self.inner.limit)
            })
            .is_ok();
        if !reserved {
            return Err(exceeded());
        }
        match self.inner.upstream.allocate(stream, bytes, alignment) {
            Ok(p) => Ok(p),
            Err(e) => {
                counter.fetch_sub(size, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: forwarded contract.
        unsafe {
            self.inner
                .upstream
                .deallocate(stream, ptr, bytes, alignment)?
        };
        if let Some(size) = self.counted(bytes) {
            self.inner.allocated.fetch_sub(size, Ordering::AcqRel);
        }
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        same_shared_state::<Self, _>(other, &self.inner, |o| &o.inner)
    }

    fn properties(&self) -> ResourceProperties {
        self.inner.upstream.properties()
    }

    fn as_any(&self) -> &dyn Any {
        self
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
    fn exactly_reaching_the_limit_is_allowed() {
        let up = HostMockResource::new();
        let lim = LimitingResourceAdaptor::new(up.clone(), 4096);
        let a = lim.allocate(s(), 2048, 256).unwrap();
        let b = lim.allocate(s(), 2048, 256).unwrap();
        assert_eq!(lim.allocated_bytes(), 4096);
        let e = lim.allocate(s(), 1, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        assert!(e
            .to_string()
            .contains("Exceeded memory limit (failed to allocate 1 bytes)"));
        assert_eq!(
            lim.allocated_bytes(),
            4096,
            "a failed request changed the count"
        );
        // SAFETY: both came from `lim` with these sizes.
        unsafe {
            lim.deallocate(s(), a, 2048, 256).unwrap();
            lim.deallocate(s(), b, 2048, 256).unwrap();
        }
        assert_eq!(lim.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn too_big_and_overflow_are_out_of_memory() {
        let lim = LimitingResourceAdaptor::new(HostMockResource::new(), 1 << 20);
        assert!(lim
            .allocate(s(), (1 << 20) + 1, 256)
            .unwrap_err()
            .is_out_of_memory());
        assert!(lim
            .allocate(s(), usize::MAX, 256)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(lim.allocated_bytes(), 0);
    }

    #[test]
    fn upstream_failure_rolls_back() {
        let up = HostMockResource::new();
        up.fail_next_allocations(1);
        let lim = LimitingResourceAdaptor::new(up.clone(), 1 << 20);
        let e = lim.allocate(s(), 1000, 256).unwrap_err();
        assert!(
            e.is_out_of_memory(),
            "the upstream's error is passed on: {e}"
        );
        assert_eq!(lim.allocated_bytes(), 0);
        let p = lim.allocate(s(), 1000, 256).unwrap();
        assert_eq!(lim.allocated_bytes(), 1024);
        // SAFETY: `p` came from `lim`.
        unsafe { lim.deallocate(s(), p, 1000, 256).unwrap() };
    }

    #[test]
    fn nested_limiters_and_equality() {
        let outer = LimitingResourceAdaptor::new(HostMockResource::new(), 5 << 20);
        let inner = LimitingResourceAdaptor::new(outer.clone(), 2 << 20);
        assert!(inner
            .allocate(s(), 4 << 20, 256)
            .unwrap_err()
            .is_out_of_memory());
        assert!(outer.is_equal(&outer.clone()));
        assert!(!outer.is_equal(&LimitingResourceAdaptor::new(
            HostMockResource::new(),
            5 << 20
        )));
        assert!(inner.upstream().is_equal(&outer));
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let up = HostMockResource::new();
        let lim = LimitingResourceAdaptor::new(up.clone(), 64 * 256);
        std::thread::scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    for _ in 0..2000 {
                        if let Ok(p) = lim.allocate(s(), 256, 256) {
                            assert!(lim.allocated_bytes() <= 64 * 256);
                            // SAFETY: `p` came from `lim`.
                            unsafe { lim.deallocate(s(), p, 256, 256).unwrap() };
                        }
                    }
                });
            }
        });
        assert_eq!(lim.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
    }
}
