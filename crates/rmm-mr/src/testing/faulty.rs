//! [`FaultyResource`]: an upstream that fails chosen allocations and deallocations.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::{CudaError, DevicePtr, ResultCode};

use crate::error::{MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};

/// The error an injected failure returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// [`MrError::OutOfMemory`]: the upstream is full.
    OutOfMemory,
    /// [`MrError::BadAlloc`] with a driver error behind it: an allocation failing for another
    /// reason than memory.
    BadAlloc,
    /// [`MrError::Cuda`]: a driver call failing (what a CUDA resource's failed free returns).
    Cuda,
    /// [`MrError::InvalidArgument`].
    InvalidArgument,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 4] = [
        FaultKind::OutOfMemory,
        FaultKind::BadAlloc,
        FaultKind::Cuda,
        FaultKind::InvalidArgument,
    ];

    /// The error of this kind for a request of `bytes` bytes (every injected error's message
    /// contains "injected").
    #[must_use]
    pub fn error(self, bytes: usize) -> MrError {
        let driver = || CudaError::from_raw_code("injected", ResultCode::INVALID_VALUE.0);
        match self {
            FaultKind::OutOfMemory => {
                MrError::out_of_memory(bytes, format!("injected: no room for {bytes} bytes"))
            }
            FaultKind::BadAlloc => MrError::BadAlloc {
                message: format!("injected: failed to allocate {bytes} bytes"),
                source: Some(driver()),
            },
            FaultKind::Cuda => MrError::Cuda(driver()),
            FaultKind::InvalidArgument => {
                MrError::invalid_argument(format!("injected: refused {bytes} bytes"))
            }
        }
    }

    /// Whether `e` is an error this kind produces.
    #[must_use]
    pub fn matches(self, e: &MrError) -> bool {
        match (self, e) {
            (FaultKind::OutOfMemory, MrError::OutOfMemory { reason, .. }) => {
                reason.contains("injected")
            }
            (FaultKind::BadAlloc, MrError::BadAlloc { message, .. }) => {
                message.contains("injected")
            }
            (FaultKind::Cuda, MrError::Cuda(c)) => c.to_string().contains("injected"),
            (FaultKind::InvalidArgument, MrError::InvalidArgument(m)) => m.contains("injected"),
            _ => false,
        }
    }
}

/// Which calls of one kind fail: skip `skip`, then fail `times`.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    skip: usize,
    times: usize,
    kind: FaultKind,
}

impl Schedule {
    const NONE: Self = Self {
        skip: 0,
        times: 0,
        kind: FaultKind::OutOfMemory,
    };

    /// Counts one call; the kind to fail it with, if it fails.
    fn next(&mut self) -> Option<FaultKind> {
        if self.times == 0 {
            return None;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.times -= 1;
        Some(self.kind)
    }
}

struct Faulty<U> {
    upstream: U,
    allocations: Mutex<Schedule>,
    deallocations: Mutex<Schedule>,
    allocate_calls: AtomicUsize,
    deallocate_calls: AtomicUsize,
    injected: AtomicUsize,
}

impl<U> Faulty<U> {
    fn fires(&self, schedule: &Mutex<Schedule>, calls: &AtomicUsize) -> Option<FaultKind> {
        calls.fetch_add(1, Ordering::SeqCst);
        let kind = schedule
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next();
        if kind.is_some() {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        kind
    }
}

/// An adaptor that makes chosen calls to its upstream fail, for testing how the resources and
/// adaptors above it recover (feature `testing`; not for production).
///
/// Counting only non-empty allocations and non-null deallocations (the others are forwarded
/// untouched), it skips a number of calls and then fails a number of them with an error of a
/// chosen [`FaultKind`], allocations and deallocations each on their own schedule. A failed
/// call never reaches the upstream: a failed allocation allocated nothing, and the memory of a
/// failed deallocation is still allocated (the caller may free it again). So with a
/// [`HostMockResource`](super::HostMockResource) below, the mock's live set says exactly what
/// leaked. Copies share the schedules and counters and are equal.
pub struct FaultyResource<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Faulty<U>>,
}

impl<U: DeviceMemoryResource> Clone for FaultyResource<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> FaultyResource<U> {
    /// Forwards everything to `upstream` until told to fail.
    pub fn new(upstream: U) -> Self {
        Self {
            inner: Arc::new(Faulty {
                upstream,
                allocations: Mutex::new(Schedule::NONE),
                deallocations: Mutex::new(Schedule::NONE),
                allocate_calls: AtomicUsize::new(0),
                deallocate_calls: AtomicUsize::new(0),
                injected: AtomicUsize::new(0),
            }),
        }
    }

    /// The upstream resource.
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// Of the allocations from now on, lets `skip` through, then fails `times` with `kind`
    /// (replacing the allocation schedule).
    pub fn fail_allocations(&self, skip: usize, times: usize, kind: FaultKind) {
        *self
            .inner
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Schedule { skip, times, kind };
    }

    /// Fails the next allocation with `kind`.
    pub fn fail_next_allocation(&self, kind: FaultKind) {
        self.fail_allocations(0, 1, kind);
    }

    /// Of the deallocations from now on, lets `skip` through, then fails `times` with `kind`
    /// (replacing the deallocation schedule). A failed deallocation leaves the memory allocated.
    pub fn fail_deallocations(&self, skip: usize, times: usize, kind: FaultKind) {
        *self
            .inner
            .deallocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Schedule { skip, times, kind };
    }

    /// Fails the next deallocation with `kind`.
    pub fn fail_next_deallocation(&self, kind: FaultKind) {
        self.fail_deallocations(0, 1, kind);
    }

    /// Cancels both schedules.
    pub fn disarm(&self) {
        self.fail_allocations(0, 0, FaultKind::OutOfMemory);
        self.fail_deallocations(0, 0, FaultKind::OutOfMemory);
    }

    /// Whether a failure is still scheduled.
    #[must_use]
    pub fn is_armed(&self) -> bool {
        let pending = |m: &Mutex<Schedule>| m.lock().unwrap_or_else(PoisonError::into_inner).times;
        pending(&self.inner.allocations) + pending(&self.inner.deallocations) > 0
    }

    /// Non-empty allocations asked for so far, failed ones included.
    #[must_use]
    pub fn allocate_calls(&self) -> usize {
        self.inner.allocate_calls.load(Ordering::SeqCst)
    }

    /// Non-null deallocations asked for so far, failed ones included.
    #[must_use]
    pub fn deallocate_calls(&self) -> usize {
        self.inner.deallocate_calls.load(Ordering::SeqCst)
    }

    /// Failures injected so far.
    #[must_use]
    pub fn injected(&self) -> usize {
        self.inner.injected.load(Ordering::SeqCst)
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for FaultyResource<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyResource")
            .field("injected", &self.injected())
            .field("upstream", &self.inner.upstream)
            .finish_non_exhaustive()
    }
}

// SAFETY: every pointer handed out is one the upstream (bound by this trait's contract) handed
// out with the same arguments, and it goes back to the upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for FaultyResource<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let inner = &*self.inner;
        if bytes > 0 {
            if let Some(kind) = inner.fires(&inner.allocations, &inner.allocate_calls) {
                return Err(kind.error(bytes));
            }
        }
        inner.upstream.allocate(stream, bytes, alignment)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let inner = &*self.inner;
        if !ptr.is_null() {
            if let Some(kind) = inner.fires(&inner.deallocations, &inner.deallocate_calls) {
                return Err(kind.error(bytes));
            }
        }
        // SAFETY: forwarded contract.
        unsafe { inner.upstream.deallocate(stream, ptr, bytes, alignment) }
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;

    #[test]
    fn schedules_skip_fail_and_forward() {
        let s = CudaStreamView::legacy();
        let mock = HostMockResource::new();
        let f = FaultyResource::new(mock.clone());
        f.fail_allocations(1, 2, FaultKind::BadAlloc);
        assert!(f.is_armed());
        let a = f.allocate(s, 100, 256).unwrap();
        assert_eq!(
            f.allocate(s, 0, 256).unwrap(),
            DevicePtr::NULL,
            "0 bytes count"
        );
        for _ in 0..2 {
            let e = f.allocate(s, 100, 256).unwrap_err();
            assert!(
                FaultKind::BadAlloc.matches(&e) && !e.is_out_of_memory(),
                "{e}"
            );
        }
        assert!(!f.is_armed());
        let b = f.allocate(s, 100, 256).unwrap();
        assert_eq!((f.allocate_calls(), f.injected()), (4, 2));
        assert_eq!(mock.live_allocations(), 2);

        f.fail_next_deallocation(FaultKind::Cuda);
        // SAFETY: `a` and `b` came from `f` with these arguments.
        unsafe {
            let e = f.deallocate(s, a, 100, 256).unwrap_err();
            assert!(FaultKind::Cuda.matches(&e), "{e}");
            assert_eq!(mock.live_allocations(), 2, "a failed free freed");
            f.deallocate(s, DevicePtr::NULL, 0, 256).unwrap();
            f.deallocate(s, a, 100, 256).unwrap();
            f.deallocate(s, b, 100, 256).unwrap();
        }
        assert_eq!((f.deallocate_calls(), f.injected()), (3, 3));
        assert_eq!(mock.live_allocations(), 0);
        f.fail_allocations(0, 5, FaultKind::OutOfMemory);
        f.disarm();
        assert!(!f.is_armed());
        assert!(f.is_equal(&f.clone()) && !f.is_equal(&mock));
    }

    #[test]
    fn kinds_make_their_own_errors() {
        for kind in FaultKind::ALL {
            let e = kind.error(64);
            assert!(kind.matches(&e), "{kind:?}: {e}");
            assert_eq!(e.is_out_of_memory(), kind == FaultKind::OutOfMemory);
            assert!(!e.is_no_device(), "{kind:?}");
            for other in FaultKind::ALL.into_iter().filter(|&o| o != kind) {
                assert!(!other.matches(&e), "{other:?} matches {kind:?}");
            }
        }
        assert!(!FaultKind::OutOfMemory.matches(&MrError::out_of_memory(1, "real")));
    }
}
