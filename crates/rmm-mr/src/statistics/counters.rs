//! [`StatisticsCounters`]: the bookkeeping of RMM's `statistics_resource_adaptor`, with a
//! lock-free hot path.
//!
//! # Design
//!
//! RMM keeps a stack of `(bytes, allocations)` counter pairs under one `shared_mutex` that every
//! allocation and deallocation takes for writing. Here the stack never has to be touched by the
//! hot path, because each frame's counters can be derived from **cumulative** atomics plus the
//! values those atomics had when the frame was pushed:
//!
//! * `value` (net, since creation) and `total` (sum of additions, since creation) are plain
//!   atomics that are never reset. A frame pushed when they read `V₀`, `T₀` has
//!   `value = V − V₀` and `total = T − T₀`. That is exactly what RMM's merge rule produces on
//!   pop (`parent.value += child.value`, `parent.total += child.total`), since the parent's
//!   count simply continues through the child's life.
//! * `peak` is the running maximum of `V` over the **top** frame's life, kept in absolute terms
//!   (`fetch_max` after every addition). A push saves it in the parent's stack entry and resets
//!   it to the current `V`; a pop `fetch_max`es the saved value back in. The top frame's peak is
//!   `peak − V₀`. The restored parent peak is `max(saved, max over the child's life)`, which is
//!   RMM's `parent.peak = max(parent.peak, parent.value_at_push + child.peak)`.
//!
//! So [`record_allocation`](StatisticsCounters::record_allocation) is two atomic
//! read-modify-write operations per counter (plus a `fetch_max` only while the peak is rising)
//! and [`record_deallocation`](StatisticsCounters::record_deallocation) one; neither takes a
//! lock. Push, pop and the readers take a mutex that guards only the frame
//! bases.
//!
//! # Races
//!
//! With no concurrent push or pop, every reading is exact once the recording threads are done.
//! `value` and `total` are always conserved: an allocation racing with a push or pop is counted
//! in exactly one of the two frames, and in the parent after the pop, so sums stay exact.
//! Only the peak can be approximate under races: an addition whose `fetch_max` lands just
//! before a push's reset counts toward the parent's peak but not the child's, and a deallocation
//! racing with a push can leave the child a peak slightly above what it saw. Readers report
//! `peak = max(peak, value)` so a peak never reads below its value. The bytes and allocations
//! counters are updated one after the other, so a reading taken mid-update may show one
//! allocation in one counter and not yet in the other. RMM's adaptor has the same attribution
//! ambiguity at the lock level (which side of the push an allocation lands on).
//!
//! Byte counts above `i64::MAX` are counted as `i64::MAX` (RMM converts `size_t` to `int64_t`).

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::counter::Counter;

/// `pop_counters` was called with only the base frame on the stack.
#[doc(alias = "std::out_of_range")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsError {
    /// Only one frame exists; it cannot be popped.
    PopLastFrame,
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // RMM: std::out_of_range("cannot pop the last counter pair").
            StatsError::PopLastFrame => f.write_str("cannot pop the last counter pair"),
        }
    }
}

impl std::error::Error for StatsError {}

/// One statistic's live atomics (absolute, see the module docs).
#[derive(Debug, Default)]
struct LiveCounter {
    /// Net value since creation.
    value: AtomicI64,
    /// Running maximum of `value` over the top frame's life.
    peak: AtomicI64,
    /// Sum of additions since creation.
    total: AtomicI64,
}

impl LiveCounter {
    #[inline]
    fn add(&self, amount: i64) {
        let new = self
            .value
            .fetch_add(amount, Ordering::Relaxed)
            .wrapping_add(amount);
        // A plain load first: in the steady state the peak is not rising, and a load is far
        // cheaper than the compare-and-swap loop behind `fetch_max`.
        if new > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(new, Ordering::Relaxed);
        }
        self.total.fetch_add(amount, Ordering::Relaxed);
    }

    #[inline]
    fn sub(&self, amount: i64) {
        self.value.fetch_sub(amount, Ordering::Relaxed);
    }

    /// The counter of the frame whose base is `base`, as it reads now.
    fn read(&self, base: &FrameBase) -> Counter {
        let value = self.value.load(Ordering::Relaxed).wrapping_sub(base.value);
        let peak = self.peak.load(Ordering::Relaxed).wrapping_sub(base.value);
        let total = self.total.load(Ordering::Relaxed).wrapping_sub(base.total);
        Counter {
            value,
            peak: peak.max(value),
            total,
        }
    }

    /// Starts a frame on top of `parent`: saves the running peak in `parent` and returns the
    /// new frame's base together with the parent's counter as it stood.
    fn push(&self, parent: &mut FrameBase) -> (FrameBase, Counter) {
        let value = self.value.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let saved_peak = self.peak.swap(value, Ordering::Relaxed);
        parent.saved_peak = saved_peak;
        let parent_value = value.wrapping_sub(parent.value);
        let snapshot = Counter {
            value: parent_value,
            peak: saved_peak.wrapping_sub(parent.value).max(parent_value),
            total: total.wrapping_sub(parent.total),
        };
        let base = FrameBase {
            value,
            total,
            saved_peak: value,
        };
        (base, snapshot)
    }

    /// Ends the frame `child`, handing the running peak back to `parent`; returns the child's
    /// final counter.
    fn pop(&self, child: &FrameBase, parent: &FrameBase) -> Counter {
        let snapshot = self.read(child);
        self.peak.fetch_max(parent.saved_peak, Ordering::Relaxed);
        snapshot
    }
}

/// Where one frame started, for one statistic.
#[derive(Debug, Clone, Copy, Default)]
struct FrameBase {
    /// The cumulative value when the frame was pushed.
    value: i64,
    /// The cumulative total when the frame was pushed.
    total: i64,
    /// The frame's running (absolute) peak when its child was pushed; meaningful only while
    /// the frame is not on top.
    saved_peak: i64,
}

/// The frame bases of both statistics.
#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    bytes: FrameBase,
    allocations: FrameBase,
}

/// Current, peak and total counts of bytes and of allocations, with RMM's push/pop frames, as
/// kept by RMM's `statistics_resource_adaptor`.
///
/// Recording is lock-free (see the module docs for the design and the race semantics); pushing,
/// popping and reading take a mutex that recording never touches. Bytes are the **requested**
/// sizes; a 0-byte allocation still counts as an allocation. Freeing more than was allocated
/// drives the values negative, as in RMM.
#[doc(alias = "rmm::mr::statistics_resource_adaptor")]
pub struct StatisticsCounters {
    bytes: LiveCounter,
    allocations: LiveCounter,
    /// Frame bases, bottom first; never empty (the base frame starts at zero).
    frames: Mutex<Vec<Frame>>,
}

impl Default for StatisticsCounters {
    fn default() -> Self {
        StatisticsCounters::new()
    }
}

impl fmt::Debug for StatisticsCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (bytes, allocations) = self.counters();
        f.debug_struct("StatisticsCounters")
            .field("bytes", &bytes)
            .field("allocations", &allocations)
            .field("depth", &self.depth())
            .finish()
    }
}

/// Saturating `usize` to `i64`.
#[inline]
fn to_i64(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl StatisticsCounters {
    /// All counters zero, one frame.
    pub fn new() -> StatisticsCounters {
        StatisticsCounters {
            bytes: LiveCounter::default(),
            allocations: LiveCounter::default(),
            frames: Mutex::new(vec![Frame::default()]),
        }
    }

    fn frames(&self) -> MutexGuard<'_, Vec<Frame>> {
        // Nothing panics while the lock is held, and the bases stay valid regardless.
        self.frames.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a successful allocation of `bytes` bytes (call after the upstream allocated).
    /// Lock-free.
    #[inline]
    pub fn record_allocation(&self, bytes: usize) {
        self.bytes.add(to_i64(bytes));
        self.allocations.add(1);
    }

    /// Counts a deallocation of `bytes` bytes (call before the upstream frees, as RMM does to
    /// avoid an ABA race on reused addresses). Lock-free.
    #[inline]
    pub fn record_deallocation(&self, bytes: usize) {
        self.bytes.sub(to_i64(bytes));
        self.allocations.sub(1);
    }

    /// The top frame's bytes counter.
    #[doc(alias = "get_bytes_counter")]
    pub fn bytes(&self) -> Counter {
        let frames = self.frames();
        let top = frames.last().copied().unwrap_or_default();
        self.bytes.read(&top.bytes)
    }

    /// The top frame's allocation-count counter.
    #[doc(alias = "get_allocations_counter")]
    pub fn allocations(&self) -> Counter {
        let frames = self.frames();
        let top = frames.last().copied().unwrap_or_default();
        self.allocations.read(&top.allocations)
    }

    /// The top frame's `(bytes, allocations)` counters, read under one lock.
    pub fn counters(&self) -> (Counter, Counter) {
        let frames = self.frames();
        let top = frames.last().copied().unwrap_or_default();
        (
            self.bytes.read(&top.bytes),
            self.allocations.read(&top.allocations),
        )
    }

    /// Number of frames on the stack (1 when nothing was pushed).
    pub fn depth(&self) -> usize {
        self.frames().len()
    }

    /// Pushes a fresh pair of zero counters, which the readers report from now on; returns the
    /// `(bytes, allocations)` counters of the previous top frame as they stood.
    pub fn push_counters(&self) -> (Counter, Counter) {
        let mut frames = self.frames();
        let Some(parent) = frames.last_mut() else {
            // Unreachable: the stack is never empty. Re-seed rather than panic.
            frames.push(Frame::default());
            return (Counter::default(), Counter::default());
        };
        let (bytes_base, bytes) = self.bytes.push(&mut parent.bytes);
        let (allocations_base, allocations) = self.allocations.push(&mut parent.allocations);
        frames.push(Frame {
            bytes: bytes_base,
            allocations: allocations_base,
        });
        (bytes, allocations)
    }

    /// Pops the top frame and merges it into the one below with RMM's rule
    /// (`peak = max(peak, value + child.peak)`, `value += child.value`,
    /// `total += child.total`); returns the popped `(bytes, allocations)` counters.
    ///
    /// # Errors
    ///
    /// [`StatsError::PopLastFrame`] when only the base frame is left (RMM throws
    /// `std::out_of_range`).
    pub fn pop_counters(&self) -> Result<(Counter, Counter), StatsError> {
        let mut frames = self.frames();
        if frames.len() < 2 {
            return Err(StatsError::PopLastFrame);
        }
        let child = frames.pop().unwrap_or_default();
        let parent = frames.last().copied().unwrap_or_default();
        let bytes = self.bytes.pop(&child.bytes, &parent.bytes);
        let allocations = self
            .allocations
            .pop(&child.allocations, &parent.allocations);
        Ok((bytes, allocations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const TEN_MIB: usize = 10 << 20;
    const MIB: i64 = 1 << 20;

    #[test]
    fn starts_empty() {
        let s = StatisticsCounters::new();
        assert_eq!(s.bytes(), Counter::default());
        assert_eq!(s.allocations(), Counter::default());
        assert_eq!(s.depth(), 1);
    }

    #[test]
    fn peak_allocations_as_in_rmm() {
        // RMM StatisticsTest.PeakAllocations.
        let s = StatisticsCounters::new();
        for _ in 0..10 {
            s.record_allocation(TEN_MIB);
        }
        for _ in 0..5 {
            s.record_deallocation(TEN_MIB);
        }
        assert_eq!(s.bytes(), Counter::new(50 * MIB, 100 * MIB, 100 * MIB));
        assert_eq!(s.allocations(), Counter::new(5, 10, 10));
        for _ in 0..10 {
            s.record_allocation(TEN_MIB);
        }
        for _ in 0..15 {
            s.record_deallocation(TEN_MIB);
        }
        assert_eq!(s.bytes(), Counter::new(0, 150 * MIB, 200 * MIB));
        assert_eq!(s.allocations(), Counter::new(0, 15, 20));
    }

    #[test]
    fn zero_byte_allocations_count() {
        let s = StatisticsCounters::new();
        s.record_allocation(0);
        assert_eq!(s.bytes(), Counter::new(0, 0, 0));
        assert_eq!(s.allocations(), Counter::new(1, 1, 1));
        s.record_deallocation(0);
        assert_eq!(s.allocations(), Counter::new(0, 1, 1));
    }

    #[test]
    fn freeing_foreign_memory_goes_negative() {
        let s = StatisticsCounters::new();
        s.record_deallocation(TEN_MIB);
        assert_eq!(s.bytes(), Counter::new(-10 * MIB, 0, 0));
        assert_eq!(s.allocations(), Counter::new(-1, 0, 0));
    }

    #[test]
    fn oversized_counts_saturate() {
        let s = StatisticsCounters::new();
        s.record_allocation(usize::MAX);
        assert_eq!(s.bytes().value, i64::MAX);
    }

    #[test]
    fn nested_as_in_rmm() {
        // RMM StatisticsTest.Nested.
        let s = StatisticsCounters::new();
        s.record_allocation(TEN_MIB); // a0
        assert_eq!((s.bytes().value, s.allocations().value), (10 * MIB, 1));
        let (b, a) = s.push_counters();
        assert_eq!((b.value, a.value), (10 * MIB, 1));
        assert_eq!(b, Counter::new(10 * MIB, 10 * MIB, 10 * MIB));
        assert_eq!((s.bytes().value, s.allocations().value), (0, 0));
        s.record_allocation(TEN_MIB); // a1
        s.push_counters();
        assert_eq!(s.depth(), 3);
        assert_eq!((s.bytes().value, s.allocations().value), (0, 0));
        s.record_allocation(TEN_MIB); // a2
        s.record_deallocation(TEN_MIB);
        assert_eq!(s.bytes(), Counter::new(0, 10 * MIB, 10 * MIB));
        assert_eq!(s.allocations(), Counter::new(0, 1, 1));
        let (b, a) = s.pop_counters().unwrap();
        assert_eq!(b, Counter::new(0, 10 * MIB, 10 * MIB));
        assert_eq!(a, Counter::new(0, 1, 1));
        s.record_deallocation(TEN_MIB); // a0, freed in the middle frame
        let (b, a) = s.pop_counters().unwrap();
        assert_eq!(b, Counter::new(0, 20 * MIB, 20 * MIB));
        assert_eq!(a, Counter::new(0, 2, 2));
        s.record_deallocation(TEN_MIB); // a1
        assert_eq!(s.pop_counters(), Err(StatsError::PopLastFrame));
        assert_eq!(
            StatsError::PopLastFrame.to_string(),
            "cannot pop the last counter pair"
        );
        // Base frame: everything merged back; a0, a1 and a2 were live together.
        assert_eq!(s.bytes(), Counter::new(0, 30 * MIB, 30 * MIB));
        assert_eq!(s.allocations(), Counter::new(0, 3, 3));
    }

    #[test]
    fn parent_peak_is_shifted_child_peak() {
        let s = StatisticsCounters::new();
        s.record_allocation(100);
        s.record_allocation(50);
        s.record_deallocation(50); // base: value 100, peak 150
        s.push_counters();
        s.record_allocation(30); // child peak 30 -> parent would see 130 < 150
        s.pop_counters().unwrap();
        assert_eq!(s.bytes(), Counter::new(130, 150, 180));
        s.push_counters();
        s.record_allocation(40);
        s.record_deallocation(40); // child peak 40 -> parent sees 170
        let (child, _) = s.pop_counters().unwrap();
        assert_eq!(child, Counter::new(0, 40, 40));
        assert_eq!(s.bytes(), Counter::new(130, 170, 220));
    }

    /// The sequential model: RMM's algorithm, written out independently of `Counter`'s methods.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Alloc(usize),
        Free(usize),
        Push,
        Pop,
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..1000).prop_map(Op::Alloc),
            3 => (0usize..1000).prop_map(Op::Free),
            1 => Just(Op::Push),
            1 => Just(Op::Pop),
        ]
    }

    type Model = Vec<[[i64; 3]; 2]>; // per frame: [bytes, allocs] x [value, peak, total]

    fn model_add(c: &mut [i64; 3], v: i64) {
        c[0] += v;
        c[2] += v;
        if c[0] > c[1] {
            c[1] = c[0];
        }
    }

    fn as_counter(c: [i64; 3]) -> Counter {
        Counter::new(c[0], c[1], c[2])
    }

    proptest! {
        #[test]
        fn matches_sequential_model(ops in proptest::collection::vec(arb_op(), 0..200)) {
            let s = StatisticsCounters::new();
            let mut model: Model = vec![[[0; 3]; 2]];
            for op in ops {
                match op {
                    Op::Alloc(n) => {
                        s.record_allocation(n);
                        let top = model.last_mut().unwrap();
                        model_add(&mut top[0], n as i64);
                        model_add(&mut top[1], 1);
                    }
                    Op::Free(n) => {
                        s.record_deallocation(n);
                        let top = model.last_mut().unwrap();
                        top[0][0] -= n as i64;
                        top[1][0] -= 1;
                    }
                    Op::Push => {
                        let got = s.push_counters();
                        let top = *model.last().unwrap();
                        prop_assert_eq!(got, (as_counter(top[0]), as_counter(top[1])));
                        model.push([[0; 3]; 2]);
                    }
                    Op::Pop => {
                        let got = s.pop_counters();
                        if model.len() < 2 {
                            prop_assert_eq!(got, Err(StatsError::PopLastFrame));
                        } else {
                            let child = model.pop().unwrap();
                            prop_assert_eq!(got, Ok((as_counter(child[0]), as_counter(child[1]))));
                            let parent = model.last_mut().unwrap();
                            for k in 0..2 {
                                parent[k][1] = parent[k][1].max(parent[k][0] + child[k][1]);
                                parent[k][0] += child[k][0];
                                parent[k][2] += child[k][2];
                            }
                        }
                    }
                }
                let top = *model.last().unwrap();
                prop_assert_eq!(s.bytes(), as_counter(top[0]));
                prop_assert_eq!(s.allocations(), as_counter(top[1]));
                prop_assert_eq!(s.depth(), model.len());
            }
        }
    }

    #[test]
    fn concurrent_recording_is_exact() {
        const THREADS: usize = 8;
        const PAIRS: usize = 20_000;
        let s = Arc::new(StatisticsCounters::new());
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let size = 1 + t; // distinct sizes per thread
                    for _ in 0..PAIRS {
                        s.record_allocation(size);
                        s.record_deallocation(size);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let bytes = s.bytes();
        let allocs = s.allocations();
        let byte_total: i64 = (1..=THREADS as i64).map(|z| z * PAIRS as i64).sum();
        assert_eq!(bytes.value, 0);
        assert_eq!(bytes.total, byte_total);
        assert_eq!(allocs.value, 0);
        assert_eq!(allocs.total, (THREADS * PAIRS) as i64);
        // Each thread holds at most one allocation at a time.
        assert!(
            allocs.peak >= 1 && allocs.peak <= THREADS as i64,
            "{allocs:?}"
        );
        let max_bytes: i64 = (1..=THREADS as i64).sum();
        assert!(bytes.peak >= 1 && bytes.peak <= max_bytes, "{bytes:?}");
    }

    #[test]
    fn concurrent_recording_with_push_pop_conserves_value_and_total() {
        const THREADS: usize = 4;
        const PAIRS: usize = 20_000;
        let s = Arc::new(StatisticsCounters::new());
        s.record_allocation(1000); // held across the whole test
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    for _ in 0..PAIRS {
                        s.record_allocation(64);
                        s.record_deallocation(64);
                    }
                })
            })
            .collect();
        let mut pops = 0;
        while !workers.iter().all(|w| w.is_finished()) {
            s.push_counters();
            s.push_counters();
            let (b, a) = s.pop_counters().unwrap();
            assert!(b.peak >= b.value && a.peak >= a.value);
            s.pop_counters().unwrap();
            pops += 2;
        }
        for w in workers {
            w.join().unwrap();
        }
        assert!(pops > 0);
        assert_eq!(s.depth(), 1);
        let bytes = s.bytes();
        let allocs = s.allocations();
        assert_eq!(bytes.value, 1000);
        assert_eq!(bytes.total, 1000 + (THREADS * PAIRS * 64) as i64);
        assert_eq!(allocs.value, 1);
        assert_eq!(allocs.total, 1 + (THREADS * PAIRS) as i64);
        assert!(bytes.peak >= 1064 && bytes.peak <= 1000 + 64 * THREADS as i64);
        assert!(allocs.peak >= 2 && allocs.peak <= 1 + THREADS as i64);
    }
}
