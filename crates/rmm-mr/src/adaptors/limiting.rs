//! The limiting adaptor.

use std::fmt;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::Mutex;
use crate::util::slots::{self, SLOTS};

/// A counter alone on its cache line (two lines on x86-64, for the adjacent-line prefetcher):
/// the reservation counter is written by every allocation, a release total by every free of
/// one thread, and neither should invalidate what is only read (the limit, the upstream) or
/// another thread's counter.
type Padded = CachePadded<AtomicUsize>;

struct Limiting<U> {
    upstream: U,
    limit: usize,
    alignment: usize,
    /// Requests up to this size reserve with one `fetch_add` (see [`Limiting::reserve`]).
    fast_max: usize,
    /// Bytes reserved by successful requests (and, for an instant, by over-limit ones being
    /// rolled back), less the releases collected so far: never below the bytes outstanding.
    reserved: Padded,
    /// Per thread slot: bytes released by frees on the thread holding the slot, cumulative
    /// (wrapping). Written only by that thread, with plain stores.
    released: Box<[Padded; SLOTS]>,
    /// Per thread slot: how much of `released` has been taken off `reserved`.
    collected: Mutex<[usize; SLOTS]>,
}

/// Linux caps threads at 2^22 (`PID_MAX_LIMIT`); 2^24 leaves room for any platform.
const MAX_THREADS_LOG2: u32 = 24;

impl<U> Limiting<U> {
    fn new(upstream: U, limit: usize, alignment: usize) -> Self {
        Limiting {
            upstream,
            limit,
            alignment,
            fast_max: (usize::MAX - limit) >> MAX_THREADS_LOG2,
            reserved: Padded::default(),
            released: Box::new(std::array::from_fn(|_| Padded::default())),
            collected: Mutex::new([0; SLOTS]),
        }
    }

    /// Reserves `size` bytes against the limit; false (with nothing reserved) when they do not
    /// fit even after collecting the releases of every thread.
    #[inline]
    fn try_reserve(&self, size: usize) -> bool {
        size <= self.limit && (self.reserve(size) || self.reserve_after_collecting(size))
    }

    #[cold]
    #[inline(never)]
    fn reserve_after_collecting(&self, size: usize) -> bool {
        self.collect();
        self.reserve(size)
    }

    /// One attempt against the counter as it stands.
    ///
    /// As RMM: one `fetch_add`, and a `fetch_sub` to roll back when the sum went over the
    /// limit. Successful reservations never overshoot the limit together: each one saw a sum
    /// that includes every reservation made before it and stayed within the limit. The price
    /// is RMM's too: while an over-limit request is between its add and its roll-back, the
    /// counter reads high, so a concurrent request that would fit can fail spuriously.
    ///
    /// The counter must not wrap while over-limit requests are in flight: each thread has at
    /// most one in flight, so the `fetch_add` is only used for sizes up to
    /// `(usize::MAX - limit) / 2^24` (with fewer than 2^24 threads their excess cannot reach
    /// `usize::MAX - limit`); larger requests (terabytes for any realistic limit) reserve with
    /// a compare-and-swap loop that never goes over.
    #[inline]
    fn reserve(&self, size: usize) -> bool {
        let counter = &*self.reserved;
        if size <= self.fast_max {
            // Acquire: a free counted before this reservation completed its upstream free first.
            let before = counter.fetch_add(size, Ordering::Acquire);
            // `before + size` cannot wrap: see above.
            if before.wrapping_add(size) <= self.limit {
                return true;
            }
            counter.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        counter
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |cur| {
                cur.checked_add(size).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// Gives back a reservation whose allocation failed upstream.
    fn unreserve(&self, size: usize) {
        self.reserved.fetch_sub(size, Ordering::Release);
    }

    /// Counts a free of `size` bytes (after the upstream freed them): a plain store to this
    /// thread's release total, taken off the reservations when a request would not fit or the
    /// count is read. Threads without a slot take it off at once.
    #[inline]
    fn release(&self, size: usize) {
        match slots::current() {
            Some(slot) => {
                let total = &*self.released[slot % SLOTS];
                // Release: the collector sees the upstream free before it counts this one.
                total.store(
                    total.load(Ordering::Relaxed).wrapping_add(size),
                    Ordering::Release,
                );
            }
            None => self.unreserve(size),
        }
    }

    /// Takes every release made so far off the reservations.
    fn collect(&self) {
        let mut collected = self.collected.lock();
        let mut freed = 0usize;
        for (seen, total) in collected.iter_mut().zip(&self.released[..slots::bound()]) {
            let now = total.load(Ordering::Acquire);
            freed = freed.wrapping_add(now.wrapping_sub(*seen));
            *seen = now;
        }
        if freed != 0 {
            self.reserved.fetch_sub(freed, Ordering::Release);
        }
    }

    /// Bytes outstanding: the reservations less every release made so far.
    fn outstanding(&self) -> usize {
        self.collect();
        self.reserved.load(Ordering::Relaxed)
    }
}
/// How to build a [`LimitingResourceAdaptor`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) (the required arguments) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitingOptions {
    /// The most bytes outstanding at once (as counted).
    pub allocation_limit: usize,
    /// Sizes are rounded up to this power of two for the count (RMM's default 256).
    pub alignment: usize,
}

impl LimitingOptions {
    /// RMM's defaults for `allocation_limit`: sizes counted in multiples of 256.
    #[must_use]
    pub fn new(allocation_limit: usize) -> Self {
        Self {
            allocation_limit,
            alignment: ALLOCATION_ALIGNMENT,
        }
    }

    /// Sets the field `allocation_limit`.
    #[must_use]
    pub fn allocation_limit(mut self, bytes: usize) -> Self {
        self.allocation_limit = bytes;
        self
    }

    /// Sets the field `alignment`.
    #[must_use]
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }
}

/// Caps the bytes outstanding through it (RMM's `limiting_resource_adaptor`). Each request
/// reserves `align_up(bytes, alignment)` atomically *before* calling the upstream; over the
/// limit it is rolled back and the request fails with out-of-memory (exactly reaching the limit
/// is allowed); an upstream failure is rolled back and passed on. Copies share the counter and
/// are equal.
///
/// The reservation is RMM's single `fetch_add` (rolled back with a `fetch_sub` when over), so
/// the allocations that succeed never exceed the limit together, but a request racing with
/// another's over-limit attempt can fail although it would fit, as in RMM. Frees are cheaper
/// than RMM's: a thread adds what it frees to a total of its own with a plain store (no
/// atomic read-modify-write, no shared cache line), and a request that does not fit first
/// takes every thread's frees off the reservations (under a lock) and tries once more. So a
/// request only fails when, after all frees that completed before it, the bytes outstanding
/// plus its own exceed the limit (or it raced, as above); near the limit, requests pay for
/// that collection.
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
    /// Limits `upstream` to `allocation_limit` bytes, counting sizes rounded up to 256 (RMM's
    /// default).
    pub fn new(upstream: U, allocation_limit: usize) -> Self {
        Self::build(upstream, allocation_limit, ALLOCATION_ALIGNMENT)
    }

    /// Built with `options`: limits `upstream` to
    /// [`allocation_limit`](LimitingOptions::allocation_limit) bytes, rounding sizes to
    /// [`alignment`](LimitingOptions::alignment) for the count.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] when the alignment is not a power of two.
    pub fn with_options(upstream: U, options: LimitingOptions) -> MrResult<Self> {
        let LimitingOptions {
            allocation_limit,
            alignment,
        } = options;
        if !is_pow2(alignment) {
            return Err(MrError::invalid_argument(format!(
                "limiting_resource_adaptor alignment must be a power of two, not {alignment}"
            )));
        }
        Ok(Self::build(upstream, allocation_limit, alignment))
    }

    fn build(upstream: U, limit: usize, alignment: usize) -> Self {
        Self {
            inner: Arc::new(Limiting::new(upstream, limit, alignment)),
        }
    }

    /// The upstream resource.
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// Bytes outstanding (rounded as counted). While another thread's over-limit request is
    /// being rolled back it includes that request (see the type's docs). Takes a short lock
    /// to gather the threads' frees.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.inner.outstanding()
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

impl<U: DeviceMemoryResource> LimitingResourceAdaptor<U> {
    /// What the adaptor knew when a request of `bytes` failed: the limit it hit
    /// (`limit_hit`), or its upstream's refusal. It sees no blocks: the free bytes are what
    /// the limit leaves.
    #[cold]
    #[inline(never)]
    fn oom_report(&self, bytes: usize, limit_hit: bool) -> crate::OomReport {
        let in_use = self.allocated_bytes();
        let free = self.inner.limit.saturating_sub(in_use);
        crate::OomReport {
            resource: "limiting_resource_adaptor",
            reserved: in_use,
            in_use,
            free,
            largest_free_block: free,
            limit: Some(self.inner.limit),
            ..crate::OomReport::new(bytes)
        }
        .classified(limit_hit, !limit_hit)
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for LimitingResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let exceeded = || {
            MrError::out_of_memory_with(
                format!("Exceeded memory limit (failed to allocate {bytes} bytes)"),
                self.oom_report(bytes, true),
            )
        };
        let size = self.counted(bytes).ok_or_else(exceeded)?;
        // Reserve first, so concurrent requests can never overshoot the limit together.
        if !self.inner.try_reserve(size) {
            return Err(exceeded());
        }
        match self.inner.upstream.allocate(stream, bytes, alignment) {
            Ok(p) => Ok(p),
            Err(e) => {
                self.inner.unreserve(size);
                Err(if e.is_out_of_memory() {
                    e.with_oom_report(|requested| self.oom_report(requested, false))
                } else {
                    e
                })
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
            // After the upstream freed, as RMM: the upstream never holds more than the limit.
            self.inner.release(size);
        }
        Ok(())
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

    fn bare(limit: usize) -> Limiting<()> {
        Limiting::new((), limit, 256)
    }

    fn reserved(l: &Limiting<()>) -> usize {
        l.reserved.load(Ordering::Relaxed)
    }

    #[test]
    fn reserve_rolls_back_what_does_not_fit() {
        let l = bare(1000);
        assert!(l.fast_max >= 1000, "small requests take the fetch_add path");
        assert!(l.reserve(600));
        assert!(!l.reserve(600));
        assert_eq!(reserved(&l), 600);
        assert!(l.reserve(400));
        assert!(!l.reserve(1));
        assert_eq!(reserved(&l), 1000);
    }

    #[test]
    fn reservations_near_usize_max_never_wrap() {
        // No room above the limit: everything takes the compare-and-swap path.
        let l = bare(usize::MAX);
        assert_eq!(l.fast_max, 0);
        assert!(l.reserve(usize::MAX - 255));
        assert!(!l.reserve(512), "would wrap");
        assert!(l.reserve(255));
        assert_eq!(reserved(&l), usize::MAX);
        // A limit with little room above it: only small requests use fetch_add.
        let l = bare(usize::MAX - (1 << 30));
        assert_eq!(l.fast_max, 64);
        assert!(l.reserve(usize::MAX - (1 << 30)));
        for _ in 0..4 {
            assert!(!l.reserve(1 << 20));
            assert!(!l.reserve(64));
        }
        assert_eq!(reserved(&l), usize::MAX - (1 << 30));
    }

    #[test]
    fn successful_reservations_never_overshoot_under_contention() {
        // Requests of mixed sizes, many of them over the limit, on 4 threads; a second counter,
        // raised only after a successful reservation and lowered before its release, is the
        // sum of what the successful reservations hold.
        const LIMIT: usize = 10_000;
        let l = bare(LIMIT);
        let held = AtomicUsize::new(0);
        let (successes, failures) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|sc| {
            for t in 0..4usize {
                let (l, held, successes, failures) = (&l, &held, &successes, &failures);
                sc.spawn(move || {
                    // Each thread holds up to two reservations, so some requests fail even
                    // without the others.
                    let mut mine: Vec<usize> = Vec::new();
                    for i in 0..20_000usize {
                        let size = 1 + (i * 7919 + t * 104_729) % 6000;
                        if l.try_reserve(size) {
                            let now = held.fetch_add(size, Ordering::SeqCst) + size;
                            assert!(now <= LIMIT, "{now} held over the limit");
                            mine.push(size);
                            successes.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        if mine.len() == 2 || (i % 3 == 0 && !mine.is_empty()) {
                            let size = mine.remove(0);
                            held.fetch_sub(size, Ordering::SeqCst);
                            l.release(size);
                        }
                    }
                    for size in mine {
                        held.fetch_sub(size, Ordering::SeqCst);
                        l.release(size);
                    }
                });
            }
        });
        assert_eq!(l.outstanding(), 0);
        assert!(successes.load(Ordering::Relaxed) > 0 && failures.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn frees_are_collected_before_a_request_fails() {
        let l = bare(1000);
        assert!(l.try_reserve(600));
        l.release(600);
        // The free is only recorded on this thread's total so far.
        assert_eq!(reserved(&l), 600);
        assert!(l.try_reserve(1000), "the free counts once collected");
        assert_eq!(reserved(&l), 1000);
        assert!(!l.try_reserve(1));
        assert!(!l.try_reserve(1001), "larger than the limit");
        l.release(1000);
        assert_eq!(l.outstanding(), 0);
        assert_eq!(l.outstanding(), 0, "collected once only");
    }

    #[test]
    fn frees_on_other_threads_are_collected() {
        // A producer reserves, consumers free: the producer only keeps going if the consumers'
        // frees are found.
        const LIMIT: usize = 4096;
        let l = bare(LIMIT);
        let (tx, rx) = std::sync::mpsc::sync_channel::<usize>(64);
        let rx = Mutex::new(rx);
        std::thread::scope(|sc| {
            for _ in 0..2 {
                let (l, rx) = (&l, &rx);
                sc.spawn(move || loop {
                    let next = rx.lock().recv();
                    match next {
                        Ok(size) => l.release(size),
                        Err(_) => break,
                    }
                });
            }
            let mut sent = 0usize;
            while sent < 50 * LIMIT {
                if l.try_reserve(256) {
                    tx.send(256).unwrap();
                    sent += 256;
                } else {
                    std::thread::yield_now();
                }
            }
            drop(tx);
        });
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn more_threads_than_slots_keep_exact_counts() {
        const THREADS: usize = SLOTS + 8;
        let up = HostMockResource::new();
        let lim = LimitingResourceAdaptor::new(up.clone(), 1 << 30);
        let barrier = std::sync::Barrier::new(THREADS);
        std::thread::scope(|sc| {
            for _ in 0..THREADS {
                let (lim, barrier) = (&lim, &barrier);
                sc.spawn(move || {
                    let p = lim.allocate(s(), 1000, 256).unwrap();
                    // All alive at once: some find every slot taken.
                    barrier.wait();
                    // SAFETY: `p` came from `lim`.
                    unsafe { lim.deallocate(s(), p, 1000, 256).unwrap() };
                    let q = lim.allocate(s(), 10, 256).unwrap();
                    // SAFETY: `q` came from `lim`.
                    unsafe { lim.deallocate(s(), q, 10, 256).unwrap() };
                });
            }
        });
        assert_eq!(lim.allocated_bytes(), 0);
        assert_eq!(up.live_allocations(), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
