//! [`StatisticsResourceAdaptor`]: counts bytes and allocations passing through it.

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use super::{Counter, StatisticsCounters, StatsError};
use crate::error::{MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};

struct Statistics<U> {
    upstream: U,
    counters: StatisticsCounters,
}

/// Counts the bytes and allocations outstanding through it, with their peaks and totals (RMM's
/// `statistics_resource_adaptor`).
///
/// As in RMM: bytes are counted as **requested** (no rounding); a 0-byte allocation still
/// counts as an allocation; counters are updated after the upstream allocated and decremented
/// **before** the upstream frees (RMM #2304: otherwise another thread could get the address
/// back and count it before this free is counted). Freeing memory that was not allocated through
/// this adaptor drives the values negative. [`push_counters`](Self::push_counters) /
/// [`pop_counters`](Self::pop_counters) nest measurement frames.
///
/// Unlike RMM, which takes a lock on every call, allocation and deallocation take no lock in
/// the steady state and scale with threads (each thread counts into a shard of its own), while
/// every reading, the **peak included, stays exact under concurrency**: the counters are
/// linearizable and the peak is exactly the largest value reached (see
/// [`StatisticsCounters`] for the precise guarantee and what it costs). A free the upstream
/// refuses (a wrong free it detects, a driver error) is taken back, so the counters are as
/// before the call (the value dips while the upstream decides, as for any free); memory freed
/// here that was not allocated through the adaptor is still counted. Copies share the counters
/// and are equal.
#[doc(alias = "rmm::mr::statistics_resource_adaptor")]
pub struct StatisticsResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Statistics<U>>,
}

impl<U: DeviceMemoryResource> Clone for StatisticsResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> StatisticsResourceAdaptor<U> {
    /// Counts what goes through to `upstream`, starting from zero.
    pub fn new(upstream: U) -> Self {
        Self {
            inner: Arc::new(Statistics {
                upstream,
                counters: StatisticsCounters::new(),
            }),
        }
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The current frame's byte counter (current, peak and total bytes).
    #[doc(alias = "get_bytes_counter")]
    #[must_use]
    pub fn bytes_counter(&self) -> Counter {
        self.inner.counters.bytes()
    }

    /// The current frame's allocation-count counter.
    #[doc(alias = "get_allocations_counter")]
    #[must_use]
    pub fn allocations_counter(&self) -> Counter {
        self.inner.counters.allocations()
    }

    /// Both counters of the current frame, `(bytes, allocations)`, read together.
    #[must_use]
    pub fn counters(&self) -> (Counter, Counter) {
        self.inner.counters.counters()
    }

    /// Starts a new frame of zero counters that the getters report from now on; returns the
    /// `(bytes, allocations)` counters of the previous frame as they stood.
    pub fn push_counters(&self) -> (Counter, Counter) {
        self.inner.counters.push_counters()
    }

    /// Ends the current frame, merging it into the one below
    /// (`peak = max(peak, value + child.peak)`, `value += child.value`, `total += child.total`);
    /// returns the popped `(bytes, allocations)` counters.
    ///
    /// # Errors
    /// [`MrError::OutOfRange`] when only the base frame is left (RMM throws
    /// `std::out_of_range`).
    pub fn pop_counters(&self) -> MrResult<(Counter, Counter)> {
        self.inner
            .counters
            .pop_counters()
            .map_err(|e: StatsError| MrError::OutOfRange(e.to_string()))
    }

    /// Number of frames (1 when nothing was pushed).
    #[must_use]
    pub fn depth(&self) -> usize {
        self.inner.counters.depth()
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for StatisticsResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatisticsResourceAdaptor")
            .field("counters", &self.inner.counters)
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for StatisticsResourceAdaptor<U> {
    #[inline]
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let ptr = self.inner.upstream.allocate(stream, bytes, alignment)?;
        self.inner.counters.record_allocation(bytes);
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        self.inner.counters.record_deallocation(bytes);
        // SAFETY: forwarded contract.
        let freed = unsafe {
            self.inner
                .upstream
                .deallocate(stream, ptr, bytes, alignment)
        };
        if freed.is_err() {
            // Not freed: the memory is still allocated.
            self.inner.counters.undo_deallocation(bytes);
        }
        freed
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

    // RMM uses 10 MiB; a KiB keeps the mock's host memory small with the same arithmetic.
    const UNIT: usize = 10 << 10;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    fn c(value: i64, peak: i64, total: i64) -> Counter {
        Counter::new(value, peak, total)
    }

    fn units(n: i64) -> i64 {
        n * UNIT as i64
    }

    fn alloc_n<R: DeviceMemoryResource>(mr: &R, n: usize) -> Vec<DevicePtr> {
        (0..n)
            .map(|_| mr.allocate(s(), UNIT, 256).unwrap())
            .collect()
    }

    fn free_all<R: DeviceMemoryResource>(mr: &R, ptrs: impl IntoIterator<Item = DevicePtr>) {
        for p in ptrs {
            // SAFETY: every pointer came from `mr` (or a resource equal to it) with `UNIT`.
            unsafe { mr.deallocate(s(), p, UNIT, 256).unwrap() };
        }
    }

    #[test]
    fn counters_drop_before_the_upstream_frees() {
        // RMM's ABA fix: by the time the upstream frees (and could hand the address to another
        // thread), this free is already counted.
        let up = Arc::new(Hooked::default());
        let mr = StatisticsResourceAdaptor::new(Arc::clone(&up));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (probe, log) = (mr.clone(), Arc::clone(&seen));
        // The hook holds a copy of the adaptor: a reference cycle, leaked with the test.
        up.set_hook(move |_, _| {
            log.lock().unwrap().push(probe.counters());
        });
        let p = mr.allocate(s(), 100, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 100, 256).unwrap() };
        assert_eq!(*seen.lock().unwrap(), vec![(c(0, 100, 100), c(0, 1, 1))]);
    }

    #[test]
    fn empty() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        assert_eq!(mr.bytes_counter(), Counter::default());
        assert_eq!(mr.allocations_counter(), Counter::default());
        assert_eq!(mr.depth(), 1);
    }

    #[test]
    fn all_freed() {
        let up = HostMockResource::new();
        let mr = StatisticsResourceAdaptor::new(up.clone());
        let ptrs = alloc_n(&mr, 10);
        assert_eq!(mr.bytes_counter(), c(units(10), units(10), units(10)));
        free_all(&mr, ptrs);
        assert_eq!(mr.bytes_counter().value, 0);
        assert_eq!(mr.allocations_counter(), c(0, 10, 10));
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn peak_allocations() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        let mut ptrs = alloc_n(&mr, 10);
        let second_half = ptrs.split_off(5);
        free_all(&mr, ptrs);
        let more = alloc_n(&mr, 10);
        assert_eq!(mr.bytes_counter(), c(units(15), units(15), units(20)));
        assert_eq!(mr.allocations_counter(), c(15, 15, 20));
        free_all(&mr, second_half.into_iter().chain(more));
        assert_eq!(mr.bytes_counter(), c(0, units(15), units(20)));
        assert_eq!(mr.allocations_counter(), c(0, 15, 20));
    }

    #[test]
    fn zero_byte_allocation_counts_as_an_allocation() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        let p = mr.allocate(s(), 0, 256).unwrap();
        assert_eq!(mr.allocations_counter(), c(1, 1, 1));
        assert_eq!(mr.bytes_counter(), c(0, 0, 0));
        // SAFETY: a 0-byte allocation from `mr`.
        unsafe { mr.deallocate(s(), p, 0, 256).unwrap() };
        assert_eq!(mr.allocations_counter(), c(0, 1, 1));
    }

    #[test]
    fn bytes_are_counted_as_requested() {
        let up = HostMockResource::new();
        let mr = StatisticsResourceAdaptor::new(up.clone());
        let p = mr.allocate(s(), 1000, 256).unwrap();
        assert_eq!(mr.bytes_counter(), c(1000, 1000, 1000));
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 1000, 256).unwrap() };
    }

    #[test]
    fn multi_tracking() {
        let up = HostMockResource::new();
        let outer = StatisticsResourceAdaptor::new(up.clone());
        let outer_ptrs = alloc_n(&outer, 10);
        let inner = StatisticsResourceAdaptor::new(outer.clone());
        let inner_ptrs = alloc_n(&inner, 5);
        assert_eq!(outer.bytes_counter(), c(units(15), units(15), units(15)));
        assert_eq!(inner.bytes_counter(), c(units(5), units(5), units(5)));
        assert_eq!(inner.allocations_counter(), c(5, 5, 5));
        assert_eq!(outer.allocations_counter(), c(15, 15, 15));
        free_all(&inner, inner_ptrs);
        free_all(&outer, outer_ptrs);
        assert_eq!(outer.bytes_counter(), c(0, units(15), units(15)));
        assert_eq!(inner.bytes_counter(), c(0, units(5), units(5)));
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn negative_inner_tracking() {
        let up = HostMockResource::new();
        let outer = StatisticsResourceAdaptor::new(up.clone());
        let outer_ptrs = alloc_n(&outer, 10);
        let inner = StatisticsResourceAdaptor::new(outer.clone());
        let inner_ptrs = alloc_n(&inner, 5);
        // Free the outer's allocations through the inner adaptor.
        free_all(&inner, outer_ptrs);
        assert_eq!(inner.bytes_counter(), c(units(-5), units(5), units(5)));
        assert_eq!(inner.allocations_counter(), c(-5, 5, 5));
        assert_eq!(outer.bytes_counter(), c(units(5), units(15), units(15)));
        free_all(&inner, inner_ptrs);
        assert_eq!(inner.allocations_counter(), c(-10, 5, 5));
        assert_eq!(outer.allocations_counter(), c(0, 15, 15));
    }

    #[test]
    fn nested_push_pop() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        let a = alloc_n(&mr, 2);
        let (bytes_before, allocs_before) = mr.push_counters();
        assert_eq!(bytes_before, c(units(2), units(2), units(2)));
        assert_eq!(allocs_before, c(2, 2, 2));
        assert_eq!(mr.bytes_counter(), Counter::default());
        assert_eq!(mr.depth(), 2);

        let b = alloc_n(&mr, 3);
        mr.push_counters();
        let d = alloc_n(&mr, 1);
        free_all(&mr, d);
        let (bytes_inner, allocs_inner) = mr.pop_counters().unwrap();
        assert_eq!(bytes_inner, c(0, units(1), units(1)));
        assert_eq!(allocs_inner, c(0, 1, 1));
        // Merged: peak = max(3, 3 + 1) = 4.
        assert_eq!(mr.allocations_counter(), c(3, 4, 4));

        free_all(&mr, b);
        let (bytes_mid, _) = mr.pop_counters().unwrap();
        assert_eq!(bytes_mid, c(0, units(4), units(4)));
        // Base: peak = max(2, 2 + 4) = 6, total = 2 + 4.
        assert_eq!(mr.bytes_counter(), c(units(2), units(6), units(6)));
        free_all(&mr, a);
        assert_eq!(mr.allocations_counter(), c(0, 6, 6));
    }

    #[test]
    fn pop_on_the_last_level_is_out_of_range() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        assert!(matches!(mr.pop_counters(), Err(MrError::OutOfRange(_))));
        mr.push_counters();
        assert!(mr.pop_counters().is_ok());
        assert!(matches!(mr.pop_counters(), Err(MrError::OutOfRange(_))));
    }

    #[test]
    fn failed_allocation_is_not_counted() {
        let up = HostMockResource::new();
        up.fail_next_allocations(1);
        let mr = StatisticsResourceAdaptor::new(up);
        assert!(mr.allocate(s(), 100, 256).unwrap_err().is_out_of_memory());
        assert_eq!(mr.counters(), (Counter::default(), Counter::default()));
    }

    #[test]
    fn a_double_free_over_a_pool_leaves_the_counters_alone() {
        use crate::PoolMemoryResource;
        let mock = HostMockResource::new();
        let pool = PoolMemoryResource::new(mock.clone(), 0).unwrap();
        let mr = StatisticsResourceAdaptor::new(pool);
        let s = CudaStreamView::legacy();
        let p = mr.allocate(s, 1000, 256).unwrap();
        // SAFETY: `p` came from `mr`; the second free is a wrong free the pool detects.
        unsafe {
            mr.deallocate(s, p, 1000, 256).unwrap();
            let e = mr.deallocate(s, p, 1000, 256).unwrap_err();
            assert!(matches!(e, MrError::InvalidFree { .. }), "{e}");
        }
        assert_eq!(mr.counters(), (c(0, 1000, 1000), c(0, 1, 1)));
    }

    #[test]
    fn a_failed_upstream_free_is_undone() {
        use crate::testing::{FaultKind, FaultyResource};
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        let mr = StatisticsResourceAdaptor::new(faulty.clone());
        let a = mr.allocate(s(), 300, 256).unwrap();
        let b = mr.allocate(s(), 200, 256).unwrap();
        let before = mr.counters();
        for kind in FaultKind::ALL {
            faulty.fail_next_deallocation(kind);
            // SAFETY: `a` came from `mr`; the free fails and `a` stays allocated.
            let e = unsafe { mr.deallocate(s(), a, 300, 256) }.unwrap_err();
            assert!(kind.matches(&e), "{e}");
            assert_eq!(mr.counters(), before, "{kind:?}");
        }
        // Also in a frame pushed since, and without disturbing the peak.
        mr.push_counters();
        faulty.fail_next_deallocation(FaultKind::Cuda);
        // SAFETY: as above.
        assert!(unsafe { mr.deallocate(s(), b, 200, 256) }.is_err());
        assert_eq!(mr.counters(), (Counter::default(), Counter::default()));
        mr.pop_counters().unwrap();
        assert_eq!(mr.counters(), before);
        // SAFETY: both came from `mr`, still allocated.
        unsafe {
            mr.deallocate(s(), a, 300, 256).unwrap();
            mr.deallocate(s(), b, 200, 256).unwrap();
        }
        assert_eq!(mr.counters(), (c(0, 500, 500), c(0, 2, 2)));
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = StatisticsResourceAdaptor::new(up.clone());
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&StatisticsResourceAdaptor::new(up.clone())));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        assert_eq!(mr.allocations_counter().value, 1, "copies share counters");
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(mr.allocations_counter(), c(0, 1, 1));
        assert_eq!(up.live_allocations(), 0);
    }

    /// A `Write` into shared memory.
    #[derive(Clone, Default)]
    struct SharedBuf(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn composition_statistics_over_logging_over_limiting() {
        use crate::adaptors::logging::{
            parse_log_str, Action, LoggingOptions, LoggingResourceAdaptor,
        };
        use crate::resource::resource_cast;
        use crate::LimitingResourceAdaptor;

        let mock = HostMockResource::new();
        let limiting = LimitingResourceAdaptor::new(mock.clone(), 4096);
        let buf = SharedBuf::default();
        let logging: SharedResource = Arc::new(
            LoggingResourceAdaptor::with_options(
                limiting.clone(),
                LoggingOptions::new().writer(buf.clone()),
            )
            .unwrap(),
        );
        let stats = StatisticsResourceAdaptor::new(Arc::clone(&logging));

        let a = stats.allocate(s(), 1000, 256).unwrap();
        let b = stats.allocate(s(), 3000, 256).unwrap();
        assert_eq!(limiting.allocated_bytes(), 1024 + 3072);
        // Over the limit: the limiter refuses, the log records the failure, nothing is counted.
        let e = stats.allocate(s(), 1, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        assert_eq!(stats.bytes_counter(), c(4000, 4000, 4000));
        assert_eq!(stats.allocations_counter(), c(2, 2, 2));
        // SAFETY: both came from `stats` with these sizes.
        unsafe {
            stats.deallocate(s(), a, 1000, 256).unwrap();
            stats.deallocate(s(), b, 3000, 256).unwrap();
        }
        assert_eq!(stats.bytes_counter(), c(0, 4000, 4000));
        assert_eq!(limiting.allocated_bytes(), 0);
        assert_eq!(mock.live_allocations(), 0);
        assert_eq!(mock.allocation_calls(), 2);

        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let rows: Vec<_> = parse_log_str(&text)
            .unwrap()
            .into_iter()
            .map(|e| (e.action, e.size, e.pointer))
            .collect();
        assert_eq!(
            rows,
            vec![
                (Action::Allocate, 1000, a.addr()),
                (Action::Allocate, 3000, b.addr()),
                (Action::AllocateFailure, 1, 0),
                (Action::Free, 1000, a.addr()),
                (Action::Free, 3000, b.addr()),
            ]
        );

        // The chain is inspectable through the type-erased handle.
        let logging_again = resource_cast::<
            LoggingResourceAdaptor<LimitingResourceAdaptor<HostMockResource>>,
        >(&**stats.upstream())
        .unwrap();
        assert!(logging_again.upstream().is_equal(&limiting));
        assert!(stats.upstream().is_equal(&*logging));
        assert_eq!(stats.properties(), mock.properties());
    }

    #[test]
    fn multi_threaded_totals_are_exact() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 2000;
        let up = HostMockResource::new();
        let mr = StatisticsResourceAdaptor::new(up.clone());
        let expected_bytes: usize = (0..ROUNDS).map(|i| 1 + i % 700).sum::<usize>() * THREADS;
        std::thread::scope(|sc| {
            for _ in 0..THREADS {
                let mr = &mr;
                sc.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..ROUNDS {
                        let bytes = 1 + i % 700;
                        live.push((mr.allocate(s(), bytes, 256).unwrap(), bytes));
                        if live.len() > 8 {
                            let (p, b) = live.swap_remove(i % live.len());
                            // SAFETY: `p` came from `mr` with `b`.
                            unsafe { mr.deallocate(s(), p, b, 256).unwrap() };
                        }
                    }
                    for (p, b) in live {
                        // SAFETY: as above.
                        unsafe { mr.deallocate(s(), p, b, 256).unwrap() };
                    }
                });
            }
        });
        let (bytes, allocations) = mr.counters();
        assert_eq!(bytes.value, 0);
        assert_eq!(bytes.total, expected_bytes as i64);
        assert_eq!(allocations.value, 0);
        assert_eq!(allocations.total, (THREADS * ROUNDS) as i64);
        assert!(allocations.peak >= 9 && allocations.peak <= (THREADS * 9) as i64);
        assert_eq!(up.live_allocations(), 0);
    }
}
