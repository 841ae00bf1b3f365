//! Upstreams that do no work, for benchmarks and tests: [`NullResource`] (fake addresses),
//! [`PanickingResource`] (a stand-in for a bug) and, for this crate's unit tests, `Hooked` (a
//! host mock that runs a hook before each free).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::MrResult;
use crate::resource::DeviceMemoryResource;

/// Allocations every [`NullResource`] of the process has made.
static NULL_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// A resource that does no work: distinct 256-aligned fake addresses from a bump counter
/// (from 2^40 up, never reused, never dereferenced); a 0-byte allocation is the null pointer;
/// `deallocate` is a no-op. For benchmarks that measure what sits above an upstream, and for
/// tests that never touch the memory: the addresses are not memory, so never hand them to a
/// kernel or read through them. An instance is equal only to itself (two instances hand out
/// the same addresses).
#[derive(Debug)]
pub struct NullResource {
    next: AtomicU64,
}

impl NullResource {
    /// A resource whose first address is 2^40.
    #[must_use]
    pub fn new() -> Self {
        Self {
            next: AtomicU64::new(1 << 40),
        }
    }

    /// Non-empty allocations every `NullResource` of the process has made so far (whether a
    /// measured loop called its upstream).
    #[must_use]
    pub fn allocations_in_process() -> u64 {
        NULL_ALLOCATIONS.load(Ordering::Relaxed)
    }
}

impl Default for NullResource {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: a test and benchmark double handing out fake addresses. That breaks the promise of
// valid memory, which is sound only because its users never touch the memory (the type's
// documentation says so).
unsafe impl DeviceMemoryResource for NullResource {
    fn allocate(&self, _: CudaStreamView<'_>, bytes: usize, _: usize) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        NULL_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let step = (bytes as u64).div_ceil(256) * 256;
        Ok(DevicePtr::from_raw(
            self.next.fetch_add(step, Ordering::Relaxed),
        ))
    }

    unsafe fn deallocate(
        &self,
        _: CudaStreamView<'_>,
        _: DevicePtr,
        _: usize,
        _: usize,
    ) -> MrResult<()> {
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        std::ptr::addr_eq(self, other.as_any())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A resource whose allocation panics (a stand-in for a bug in a resource): for tests of what
/// catches panics (the C API turns them into a status). `deallocate` is a no-op; all instances
/// are equal.
#[derive(Debug, Default, Clone, Copy)]
pub struct PanickingResource;

// SAFETY: it never hands out memory.
unsafe impl DeviceMemoryResource for PanickingResource {
    fn allocate(&self, _: CudaStreamView<'_>, bytes: usize, _: usize) -> MrResult<DevicePtr> {
        panic!("allocation of {bytes} bytes reached a bug");
    }

    unsafe fn deallocate(
        &self,
        _: CudaStreamView<'_>,
        _: DevicePtr,
        _: usize,
        _: usize,
    ) -> MrResult<()> {
        Ok(())
    }

    crate::resource::resource_tail! {
        is_equal: same_type,
    }
}

#[cfg(test)]
pub(crate) use hooked::Hooked;

#[cfg(test)]
mod hooked {
    use std::fmt;
    use std::sync::OnceLock;

    use rmm_stream::CudaStreamView;
    use rmm_sys::DevicePtr;

    use crate::error::MrResult;
    use crate::resource::DeviceMemoryResource;
    use crate::testing::HostMockResource;

    /// An upstream that runs a hook, given the pointer and size, at the start of every
    /// deallocation (to see an adaptor's state at the moment its upstream frees), over a
    /// [`HostMockResource`].
    #[derive(Default)]
    pub(crate) struct Hooked {
        mock: HostMockResource,
        hook: OnceLock<Box<dyn Fn(DevicePtr, usize) + Send + Sync>>,
    }

    impl Hooked {
        /// Sets the hook (once; a second hook is ignored).
        pub(crate) fn set_hook(&self, hook: impl Fn(DevicePtr, usize) + Send + Sync + 'static) {
            let _ = self.hook.set(Box::new(hook));
        }
    }

    impl fmt::Debug for Hooked {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Hooked")
        }
    }

    // SAFETY: a test double that forwards to a `HostMockResource`, which keeps the contract.
    unsafe impl DeviceMemoryResource for Hooked {
        fn allocate(
            &self,
            stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            self.mock.allocate(stream, bytes, alignment)
        }

        unsafe fn deallocate(
            &self,
            stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            if let Some(hook) = self.hook.get() {
                hook(ptr, bytes);
            }
            // SAFETY: forwarded contract.
            unsafe { self.mock.deallocate(stream, ptr, bytes, alignment) }
        }

        crate::resource::resource_tail! {
            is_equal: identity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_addresses_are_distinct_aligned_and_counted() {
        let null = NullResource::new();
        let s = CudaStreamView::default();
        let before = NullResource::allocations_in_process();
        let a = null.allocate(s, 1, 256).unwrap();
        let b = null.allocate(s, 300, 256).unwrap();
        let c = null.allocate(s, 0, 256).unwrap();
        assert_eq!((a.addr(), b.addr()), (1 << 40, (1 << 40) + 256));
        assert!(c.is_null());
        assert!(NullResource::allocations_in_process() >= before + 2);
        assert!(null.is_equal(&null));
        assert!(!null.is_equal(&NullResource::new()));
        assert!(PanickingResource.is_equal(&PanickingResource));
    }
}
