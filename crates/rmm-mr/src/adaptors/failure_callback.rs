//! The failure-callback adaptor: let the application react to out-of-memory and retry.

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::{MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};

/// The callback: given the size of the failed request, returns `true` to retry the allocation
/// or `false` to give up and return the error (RMM's `failure_callback_t`; the `void*` argument
/// is whatever the closure captures).
#[doc(alias = "rmm::mr::failure_callback_t")]
pub type FailureCallback = dyn Fn(usize) -> bool + Send + Sync;

/// Which errors the callback is consulted on (RMM's `ExceptionType` template parameter).
pub type FailureFilter = dyn Fn(&MrError) -> bool + Send + Sync;

struct FailureCallbackState<U> {
    upstream: U,
    callback: Box<FailureCallback>,
    filter: Box<FailureFilter>,
}
/// How to build a [`FailureCallbackResourceAdaptor`] (RMM's constructor parameters and its
/// `ExceptionType` template parameter).
///
/// Built with [`new`](Self::new) (the callback is required) and the chained setters; the
/// fields are public. `#[non_exhaustive]`: later options do not break callers.
#[non_exhaustive]
pub struct FailureCallbackOptions {
    /// Called with the size of the failed request; `true` retries.
    pub callback: Box<FailureCallback>,
    /// Which errors reach the callback (default: [`MrError::is_out_of_memory`], RMM's
    /// `out_of_memory`).
    pub filter: Box<FailureFilter>,
}

impl FailureCallbackOptions {
    /// RMM's defaults for `callback`: consulted on out-of-memory only.
    #[must_use]
    pub fn new(callback: impl Fn(usize) -> bool + Send + Sync + 'static) -> Self {
        Self {
            callback: Box::new(callback),
            filter: Box::new(MrError::is_out_of_memory),
        }
    }

    /// Sets the field `callback`.
    #[must_use]
    pub fn callback(mut self, callback: impl Fn(usize) -> bool + Send + Sync + 'static) -> Self {
        self.callback = Box::new(callback);
        self
    }

    /// Sets the field `filter`: the callback is consulted on the errors it accepts (e.g.
    /// `|e| matches!(e, MrError::OutOfMemory { .. } | MrError::BadAlloc { .. })` for RMM's
    /// `failure_callback_resource_adaptor<bad_alloc>`).
    #[must_use]
    pub fn filter(mut self, filter: impl Fn(&MrError) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Box::new(filter);
        self
    }
}

impl fmt::Debug for FailureCallbackOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallbackOptions")
            .finish_non_exhaustive()
    }
}

/// Calls a callback when the upstream runs out of memory, and retries while the callback says
/// so (RMM's `failure_callback_resource_adaptor<out_of_memory>`).
///
/// Only [`MrError::OutOfMemory`] reaches the callback (use
/// [`FailureCallbackOptions::filter`] for another choice, as RMM's `ExceptionType`); every other
/// error passes through untouched. The loop ends when the upstream succeeds or the callback
/// returns `false`, which returns the last error. A callback that always returns `true` retries
/// forever: count attempts in the closure to bound it. The stream and alignment are forwarded
/// (RMM #2402). Copies share the callback and are equal; two adaptors built separately are not.
#[doc(alias = "rmm::mr::failure_callback_resource_adaptor")]
pub struct FailureCallbackResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<FailureCallbackState<U>>,
}

impl<U: DeviceMemoryResource> Clone for FailureCallbackResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> FailureCallbackResourceAdaptor<U> {
    /// Calls `callback(bytes)` whenever `upstream` fails with out-of-memory; retries while it
    /// returns `true`.
    pub fn new(upstream: U, callback: impl Fn(usize) -> bool + Send + Sync + 'static) -> Self {
        Self::with_options(upstream, FailureCallbackOptions::new(callback))
    }

    /// Built with `options`: consults the callback on the errors its
    /// [`filter`](FailureCallbackOptions::filter) accepts.
    pub fn with_options(upstream: U, options: FailureCallbackOptions) -> Self {
        let FailureCallbackOptions { callback, filter } = options;
        Self {
            inner: Arc::new(FailureCallbackState {
                upstream,
                callback,
                filter,
            }),
        }
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for FailureCallbackResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallbackResourceAdaptor")
            .field("upstream", &self.inner.upstream)
            .finish_non_exhaustive()
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for FailureCallbackResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let inner = &*self.inner;
        loop {
            match inner.upstream.allocate(stream, bytes, alignment) {
                Err(e) if (inner.filter)(&e) => {
                    if !(inner.callback)(bytes) {
                        return Err(e);
                    }
                }
                result => return result,
            }
        }
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    /// A callback that retries once, then gives up, recording the sizes it saw.
    fn retry_once() -> (
        Arc<Mutex<Vec<usize>>>,
        impl Fn(usize) -> bool + Send + Sync + 'static,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let cb = move |bytes| {
            let mut log = log.lock().unwrap();
            log.push(bytes);
            log.len() == 1
        };
        (seen, cb)
    }

    #[test]
    fn retry_allocation_once() {
        let up = HostMockResource::new();
        up.fail_next_allocations(2);
        let (seen, cb) = retry_once();
        let mr = FailureCallbackResourceAdaptor::new(up.clone(), cb);
        let e = mr.allocate(s(), 1 << 10, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        assert_eq!(*seen.lock().unwrap(), vec![1 << 10, 1 << 10]);
        assert_eq!(up.allocation_calls(), 0);
    }

    #[test]
    fn retry_succeeds_after_the_callback_frees_memory() {
        let up = HostMockResource::new();
        up.fail_next_allocations(3);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let mr = FailureCallbackResourceAdaptor::new(up.clone(), move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            true
        });
        let p = mr.allocate(s(), 4096, 256).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(up.allocation_calls(), 1);
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 4096, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn forwards_alignment() {
        let up = HostMockResource::new();
        let mr = FailureCallbackResourceAdaptor::new(up.clone(), |_| false);
        let p = mr.allocate(s(), 1000, 512).unwrap();
        assert_eq!(up.last_alignment(), 512);
        assert!(p.is_aligned(512));
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 1000, 512).unwrap() };
    }

    #[test]
    fn different_error_types_are_not_retried() {
        // The mock answers a non-power-of-two alignment with a bad_alloc, not out-of-memory.
        let up = HostMockResource::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let mr = FailureCallbackResourceAdaptor::new(up.clone(), move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            true
        });
        let e = mr.allocate(s(), 1000, 3).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        // A bad_alloc filter does react to it (RMM's adaptor<bad_alloc>).
        let (seen, cb) = retry_once();
        let mr = FailureCallbackResourceAdaptor::with_options(
            up,
            FailureCallbackOptions::new(cb)
                .filter(|e| matches!(e, MrError::BadAlloc { .. } | MrError::OutOfMemory { .. })),
        );
        assert!(mr.allocate(s(), 1000, 3).is_err());
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = FailureCallbackResourceAdaptor::new(up.clone(), |_| false);
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&FailureCallbackResourceAdaptor::new(up.clone(), |_| false)));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }
}
