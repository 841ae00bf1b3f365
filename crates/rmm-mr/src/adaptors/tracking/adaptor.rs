//! [`TrackingResourceAdaptor`]: records every outstanding allocation and catches wrong frees.

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use super::{
    OutstandingAllocation, TrackingError, TrackingErrorRecord, TrackingOptions, TrackingRegistry,
};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};

struct Tracking<U> {
    upstream: U,
    registry: TrackingRegistry,
}

/// Tracks every outstanding allocation (address, size and optionally the allocating stack) and
/// detects wrong frees (RMM's `tracking_resource_adaptor`).
///
/// As in RMM: 0-byte allocations are not recorded; the entry is removed **before** the upstream
/// frees (so an address reused by another thread cannot collide with it); an untracked free
/// leaves the byte count alone (no underflow, RMM #2404) and is still forwarded to the upstream
/// (the memory may predate the adaptor, e.g. when it is installed as the current resource after
/// allocations were made); a size mismatch removes the entry and frees the **allocated** size
/// upstream.
///
/// Unlike RMM, which only logs wrong frees, each one is logged with [`log::error!`], kept in
/// a bounded record ([`errors`](Self::errors)) **and** returned to the caller as
/// [`MrError::InvalidFree`] after the upstream was called:
///
/// | detected            | forwarded upstream           | returned                              |
/// |---------------------|------------------------------|---------------------------------------|
/// | size mismatch       | yes, with the allocated size | `InvalidFree::SizeMismatch`           |
/// | untracked free      | yes, as given (as RMM)       | `InvalidFree::UnknownPointer`         |
/// | double free (recent)| **no**                       | `InvalidFree::DoubleFree`             |
///
/// A double free (an address this adaptor freed recently and has not handed out since) is not
/// forwarded: the upstream may have given that address to someone else meanwhile, and freeing it
/// again would release their memory. Older double frees cannot be told from untracked frees
/// and are forwarded.
///
/// An upstream that returns an address that is already tracked (RMM: "pointer is already
/// tracked") gets it back and the allocation fails with [`MrError::BadAlloc`]; the tracked entry
/// is kept.
///
/// When the upstream refuses a free it was given (a driver error, a wrong free it detects), the
/// memory is still allocated: the entry goes back (with its stack) and the upstream's error is
/// returned, so a retried free is tracked and forwarded like the first one. Only the error
/// record keeps a size mismatch it detected.
///
/// The registry is sharded, so threads working on different allocations rarely contend.
/// Copies share the registry and are equal.
#[doc(alias = "rmm::mr::tracking_resource_adaptor")]
pub struct TrackingResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Tracking<U>>,
}

impl<U: DeviceMemoryResource> Clone for TrackingResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> TrackingResourceAdaptor<U> {
    /// Tracks what goes through to `upstream` (RMM's constructor with its defaults: no
    /// stacks).
    pub fn new(upstream: U) -> Self {
        Self::with_options(upstream, TrackingOptions::default())
    }

    /// Tracks what goes through to `upstream`, built with `options` (with
    /// [`capture_stacks`](TrackingOptions::capture_stacks), every allocation also records a
    /// backtrace, shown by [`report`](Self::report); slow).
    pub fn with_options(upstream: U, options: TrackingOptions) -> Self {
        Self {
            inner: Arc::new(Tracking {
                upstream,
                registry: TrackingRegistry::with_options(options),
            }),
        }
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The registry, for the crate's own tests.
    #[cfg(test)]
    pub(crate) fn registry(&self) -> &TrackingRegistry {
        &self.inner.registry
    }

    /// Every outstanding allocation with its stack (if captured), sorted by address: a snapshot
    /// (RMM hands out a reference to its live map, unsafe under concurrent traffic).
    #[doc(alias = "get_outstanding_allocations")]
    #[must_use]
    pub fn outstanding_allocations(&self) -> Vec<OutstandingAllocation> {
        self.inner.registry.outstanding_allocations()
    }

    /// Bytes in outstanding tracked allocations.
    #[doc(alias = "get_allocated_bytes")]
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.inner.registry.allocated_bytes()
    }

    /// One line per outstanding allocation, `0x7f00: 256 B`, followed by ` : callstack:` and the
    /// stack when captured (RMM's `get_outstanding_allocations_str()`).
    #[doc(alias = "get_outstanding_allocations_str")]
    #[must_use]
    pub fn report(&self) -> String {
        self.inner.registry.report()
    }

    /// Logs [`report`](Self::report) at debug level as "Outstanding Allocations: ...".
    pub fn log_outstanding_allocations(&self) {
        self.inner.registry.log_outstanding_allocations();
    }

    /// The kept records of wrong frees (and duplicate allocations), oldest first.
    #[must_use]
    pub fn errors(&self) -> Vec<TrackingErrorRecord> {
        self.inner.registry.errors()
    }

    /// Removes and returns the kept error records.
    pub fn take_errors(&self) -> Vec<TrackingErrorRecord> {
        self.inner.registry.take_errors()
    }

    /// How many errors were ever detected.
    #[must_use]
    pub fn error_count(&self) -> u64 {
        self.inner.registry.error_count()
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for TrackingResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingResourceAdaptor")
            .field("registry", &self.inner.registry)
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for TrackingResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let inner = &*self.inner;
        let ptr = inner.upstream.allocate(stream, bytes, alignment)?;
        match inner.registry.record_allocation(ptr.addr(), bytes) {
            Ok(()) => Ok(ptr),
            Err(e) => {
                // SAFETY: `ptr` was just allocated from the upstream with these arguments and
                // is not handed out.
                let _ = unsafe { inner.upstream.deallocate(stream, ptr, bytes, alignment) };
                Err(MrError::bad_alloc(format!(
                    "tracking_resource_adaptor: {e}"
                )))
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
        let inner = &*self.inner;
        let (untracked, verdict) = inner.registry.untrack(ptr.addr(), bytes);
        let (forward, kind) = match verdict {
            Ok(()) => (Some(bytes), None),
            Err(TrackingError::SizeMismatch { allocated, .. }) => (
                Some(allocated),
                Some(InvalidFree::SizeMismatch { allocated }),
            ),
            Err(TrackingError::UntrackedFree { .. }) => {
                (Some(bytes), Some(InvalidFree::UnknownPointer))
            }
            Err(TrackingError::DoubleFree { .. }) => (None, Some(InvalidFree::DoubleFree)),
            // Not produced by a deallocation; treat as unknown and keep the upstream out of it.
            Err(TrackingError::DuplicateAllocation { .. }) => {
                (None, Some(InvalidFree::UnknownPointer))
            }
        };
        if let Some(size) = forward {
            // SAFETY: forwarded contract; on a size mismatch `size` is the size the upstream
            // actually handed out.
            let upstream = unsafe { inner.upstream.deallocate(stream, ptr, size, alignment) };
            match upstream {
                Err(e) if untracked.is_some() || kind.is_none() => {
                    // Not freed: the allocation is live, and a retried free must find it.
                    if let Some(untracked) = untracked {
                        inner.registry.restore(untracked);
                    }
                    return Err(e);
                }
                Ok(()) if kind.is_none() => return Ok(()),
                _ => {}
            }
        }
        match kind {
            Some(kind) => Err(MrError::InvalidFree { ptr, bytes, kind }),
            None => Ok(()),
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
    use crate::testing::{Hooked, HostMockResource};

    const UNIT: usize = 10 << 10;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    fn alloc_n<R: DeviceMemoryResource>(mr: &R, n: usize) -> Vec<DevicePtr> {
        (0..n)
            .map(|_| mr.allocate(s(), UNIT, 256).unwrap())
            .collect()
    }

    fn free_all<R: DeviceMemoryResource>(mr: &R, ptrs: impl IntoIterator<Item = DevicePtr>) {
        for p in ptrs {
            // SAFETY: every pointer came from `mr` (or its upstream chain) with `UNIT`.
            unsafe { mr.deallocate(s(), p, UNIT, 256).unwrap() };
        }
    }

    #[test]
    fn entry_is_removed_before_the_upstream_frees() {
        let up = Arc::new(Hooked::default());
        let mr = TrackingResourceAdaptor::new(Arc::clone(&up));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (probe, log) = (mr.clone(), Arc::clone(&seen));
        // The hook holds a copy of the adaptor: a reference cycle, leaked with the test.
        up.set_hook(move |_, _| {
            log.lock().unwrap().push((
                probe.allocated_bytes(),
                probe.outstanding_allocations().len(),
            ));
        });
        let p = mr.allocate(s(), 100, 256).unwrap();
        let q = mr.allocate(s(), 300, 256).unwrap();
        // SAFETY: both came from `mr`.
        unsafe {
            mr.deallocate(s(), p, 100, 256).unwrap();
            mr.deallocate(s(), q, 300, 256).unwrap();
        }
        assert_eq!(*seen.lock().unwrap(), vec![(300, 1), (0, 0)]);
    }

    #[test]
    fn empty() {
        let mr = TrackingResourceAdaptor::new(HostMockResource::new());
        assert!(mr.outstanding_allocations().is_empty());
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(mr.report(), "");
    }

    #[test]
    fn all_freed() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        let ptrs = alloc_n(&mr, 10);
        assert_eq!(mr.outstanding_allocations().len(), 10);
        assert_eq!(mr.allocated_bytes(), 10 * UNIT);
        free_all(&mr, ptrs);
        assert!(mr.outstanding_allocations().is_empty());
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
        assert_eq!(mr.error_count(), 0);
    }

    #[test]
    fn allocations_left_with_stacks() {
        let mr = TrackingResourceAdaptor::with_options(
            HostMockResource::new(),
            TrackingOptions::new().capture_stacks(true),
        );
        let mut ptrs = alloc_n(&mr, 10);
        let left = ptrs.split_off(5);
        free_all(&mr, ptrs);
        let outstanding = mr.outstanding_allocations();
        assert_eq!(outstanding.len(), 5);
        assert_eq!(mr.allocated_bytes(), 5 * UNIT);
        assert!(outstanding.iter().all(|a| a.stack.is_some()));
        let report = mr.report();
        assert_eq!(report.matches(" : callstack:\n").count(), 5, "{report}");
        free_all(&mr, left);
    }

    #[test]
    fn allocations_left_without_stacks() {
        let mr = TrackingResourceAdaptor::new(HostMockResource::new());
        let mut ptrs = alloc_n(&mr, 10);
        let left = ptrs.split_off(5);
        free_all(&mr, ptrs);
        let outstanding = mr.outstanding_allocations();
        assert_eq!(outstanding.len(), 5);
        assert!(outstanding.iter().all(|a| a.stack.is_none()));
        let report = mr.report();
        let mut expected: Vec<u64> = left.iter().map(|p| p.addr()).collect();
        expected.sort_unstable();
        let lines: Vec<String> = expected
            .iter()
            .map(|a| format!("{a:#x}: {UNIT} B"))
            .collect();
        assert_eq!(report, lines.join("\n") + "\n");
        free_all(&mr, left);
    }

    #[test]
    fn zero_byte_allocations_are_not_recorded() {
        let mr = TrackingResourceAdaptor::new(HostMockResource::new());
        let p = mr.allocate(s(), 0, 256).unwrap();
        assert!(mr.outstanding_allocations().is_empty());
        // SAFETY: a 0-byte allocation from `mr`.
        unsafe { mr.deallocate(s(), p, 0, 256).unwrap() };
        assert_eq!(mr.error_count(), 0);
    }

    #[test]
    fn multi_tracking() {
        let up = HostMockResource::new();
        let outer = TrackingResourceAdaptor::new(up.clone());
        let outer_ptrs = alloc_n(&outer, 5);
        let inner = TrackingResourceAdaptor::new(outer.clone());
        let inner_ptrs = alloc_n(&inner, 5);
        assert_eq!(outer.outstanding_allocations().len(), 10);
        assert_eq!(inner.outstanding_allocations().len(), 5);
        assert_eq!(outer.allocated_bytes(), 10 * UNIT);
        assert_eq!(inner.allocated_bytes(), 5 * UNIT);
        free_all(&inner, inner_ptrs);
        assert_eq!(inner.allocated_bytes(), 0);
        assert_eq!(outer.allocated_bytes(), 5 * UNIT);
        free_all(&outer, outer_ptrs);
        assert_eq!(outer.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn negative_inner_tracking() {
        // Frees of the outer's allocations through the inner adaptor are untracked there: the
        // inner's count does not underflow, the outer's goes down, and the caller is told.
        let up = HostMockResource::new();
        let outer = TrackingResourceAdaptor::new(up.clone());
        let outer_ptrs = alloc_n(&outer, 5);
        let inner = TrackingResourceAdaptor::new(outer.clone());
        let inner_ptrs = alloc_n(&inner, 5);
        for p in outer_ptrs {
            // SAFETY: `p` came from `outer`, the inner's upstream, with `UNIT`.
            let e = unsafe { inner.deallocate(s(), p, UNIT, 256) }.unwrap_err();
            assert!(matches!(
                e,
                MrError::InvalidFree {
                    kind: InvalidFree::UnknownPointer,
                    ..
                }
            ));
        }
        assert_eq!(inner.allocated_bytes(), 5 * UNIT);
        assert_eq!(inner.outstanding_allocations().len(), 5);
        assert_eq!(outer.allocated_bytes(), 5 * UNIT, "forwarded upstream");
        assert_eq!(inner.errors().len(), 5);
        free_all(&inner, inner_ptrs);
        assert_eq!(outer.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn untracked_deallocation_does_not_underflow_allocated_bytes() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        let foreign = up.allocate(s(), 1024, 256).unwrap();
        let own = mr.allocate(s(), 512, 256).unwrap();
        // SAFETY: `foreign` came from the upstream with 1024 bytes.
        let e = unsafe { mr.deallocate(s(), foreign, 1024, 256) }.unwrap_err();
        assert_eq!(
            e,
            MrError::InvalidFree {
                ptr: foreign,
                bytes: 1024,
                kind: InvalidFree::UnknownPointer
            }
        );
        assert_eq!(mr.allocated_bytes(), 512);
        assert_eq!(up.live_allocations(), 1, "the untracked free was forwarded");
        let errors = mr.errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].error,
            TrackingError::UntrackedFree {
                addr: foreign.addr(),
                size: 1024
            }
        );
        // SAFETY: `own` came from `mr`.
        unsafe { mr.deallocate(s(), own, 512, 256).unwrap() };
        assert_eq!(mr.allocated_bytes(), 0);
    }

    #[test]
    fn dealloc_wrong_bytes_frees_the_allocated_size() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        let p = mr.allocate(s(), 1000, 256).unwrap();
        // SAFETY: `p` came from `mr` (with 1000 bytes: exercising the detection).
        let e = unsafe { mr.deallocate(s(), p, 999, 256) }.unwrap_err();
        assert_eq!(
            e,
            MrError::InvalidFree {
                ptr: p,
                bytes: 999,
                kind: InvalidFree::SizeMismatch { allocated: 1000 }
            }
        );
        assert!(mr.outstanding_allocations().is_empty());
        assert_eq!(mr.allocated_bytes(), 0);
        // The mock checks sizes: this would have failed had 999 been forwarded.
        assert_eq!(up.live_allocations(), 0);
        assert_eq!(up.deallocation_calls(), 1);
    }

    #[test]
    fn double_free_is_detected_and_not_forwarded() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        let p = mr.allocate(s(), 300, 256).unwrap();
        // SAFETY: `p` came from `mr`; the second free exercises the detection.
        unsafe { mr.deallocate(s(), p, 300, 256).unwrap() };
        // SAFETY: as above; the adaptor must not forward this second free.
        let e = unsafe { mr.deallocate(s(), p, 300, 256) }.unwrap_err();
        assert!(matches!(
            e,
            MrError::InvalidFree {
                kind: InvalidFree::DoubleFree,
                ..
            }
        ));
        assert_eq!(up.deallocation_calls(), 1, "not forwarded");
        assert_eq!(mr.error_count(), 1);
        assert_eq!(mr.take_errors().len(), 1);
        assert!(mr.errors().is_empty());
    }

    #[test]
    fn failed_upstream_allocation_is_not_recorded() {
        let up = HostMockResource::new();
        up.fail_next_allocations(1);
        let mr = TrackingResourceAdaptor::new(up);
        assert!(mr.allocate(s(), 10, 256).unwrap_err().is_out_of_memory());
        assert!(mr.outstanding_allocations().is_empty());
    }

    #[test]
    fn a_free_the_upstream_refuses_keeps_its_record() {
        use crate::testing::{FaultKind, FaultyResource};
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        let mr = TrackingResourceAdaptor::with_options(
            faulty.clone(),
            TrackingOptions::new().capture_stacks(true),
        );
        let a = mr.allocate(s(), 1000, 256).unwrap();
        let b = mr.allocate(s(), 300, 256).unwrap();
        let before = (
            mr.registry().outstanding(),
            mr.allocated_bytes(),
            mr.error_count(),
        );
        let stacks = |mr: &TrackingResourceAdaptor<_>| {
            mr.outstanding_allocations()
                .iter()
                .map(|o| o.stack.as_ref().map(Arc::as_ptr))
                .collect::<Vec<_>>()
        };
        let stacks_before = stacks(&mr);
        for kind in FaultKind::ALL {
            faulty.fail_next_deallocation(kind);
            // SAFETY: `a` came from `mr`; the free fails, `a` stays allocated.
            let e = unsafe { mr.deallocate(s(), a, 1000, 256) }.unwrap_err();
            assert!(kind.matches(&e), "{e}");
            let now = (
                mr.registry().outstanding(),
                mr.allocated_bytes(),
                mr.error_count(),
            );
            assert_eq!(now, before, "{kind:?}");
            assert_eq!(
                stacks(&mr),
                stacks_before,
                "{kind:?}: the stack was not kept"
            );
        }
        // A size mismatch the upstream then refuses: the record is back too (the mismatch
        // itself stays in the error record).
        faulty.fail_next_deallocation(FaultKind::Cuda);
        // SAFETY: a wrong size for `b`, whose free then fails.
        let e = unsafe { mr.deallocate(s(), b, 200, 256) }.unwrap_err();
        assert!(FaultKind::Cuda.matches(&e), "{e}");
        assert_eq!(mr.registry().outstanding(), before.0);
        assert_eq!(mr.error_count(), before.2 + 1);
        // The retried frees reach the upstream: nothing leaks.
        // SAFETY: both came from `mr` and are still allocated.
        unsafe {
            mr.deallocate(s(), a, 1000, 256).unwrap();
            mr.deallocate(s(), b, 300, 256).unwrap();
        }
        assert_eq!(mock.live_allocations(), 0);
        assert_eq!(mr.allocated_bytes(), 0);
        // And a real double free is still told apart.
        // SAFETY: a wrong free the adaptor detects and does not forward.
        let e = unsafe { mr.deallocate(s(), a, 1000, 256) }.unwrap_err();
        assert!(
            matches!(
                e,
                MrError::InvalidFree {
                    kind: InvalidFree::DoubleFree,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&TrackingResourceAdaptor::new(up.clone())));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        assert_eq!(mr.allocated_bytes(), 64);
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
        assert_eq!(mr.error_count(), 0);
    }

    #[test]
    fn multi_threaded_alloc_free() {
        let up = HostMockResource::new();
        let mr = TrackingResourceAdaptor::new(up.clone());
        std::thread::scope(|sc| {
            for t in 0..4usize {
                let mr = &mr;
                sc.spawn(move || {
                    for i in 0..500usize {
                        let bytes = [0, 256][(i + t) % 2];
                        let p = mr.allocate(s(), bytes, 256).unwrap();
                        // SAFETY: `p` came from `mr` with `bytes`.
                        unsafe { mr.deallocate(s(), p, bytes, 256).unwrap() };
                    }
                });
            }
        });
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(mr.error_count(), 0);
        assert_eq!(up.live_allocations(), 0);
    }
}
