//! [`StatisticsCounters`]: the bookkeeping of RMM's `statistics_resource_adaptor`, sharded per
//! thread so that recording scales with threads while every reading, the peak included, stays
//! exact.
//!
//! Each thread records into its own cache-line-padded shard, lock-free; frames (push/pop) are
//! differences of the summed shards; the peak stays exact because each shard may raise its value
//! lock-free only up to a limit, and the limits add up to at most the peak (an allocation beyond
//! its limit takes the lock, freezes increases, takes a consistent snapshot and shares the room
//! below the peak out again). The design and the proof that the readings are exact:
//! `docs/internals/statistics.md`.
//!
//! Byte counts above `i64::MAX` are counted as `i64::MAX` (RMM converts `size_t` to `int64_t`);
//! counts wrap rather than panic.

use std::fmt;

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Mutex, MutexGuard};

use crossbeam_utils::CachePadded;

use super::budget::share_slack;
use super::counter::Counter;
use super::shard::{backoff, Reading, Shard, ShardStat};
use crate::util::slots::{self, SLOTS};

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

/// What the lock guards.
#[derive(Debug)]
struct State {
    /// Frame bases, bottom first; never empty (the base frame starts at zero).
    frames: Vec<Frame>,
    /// Running maximum of the summed byte value over the top frame's life (absolute).
    bytes_peak: i64,
    /// Running maximum of the summed allocation count over the top frame's life (absolute).
    allocations_peak: i64,
}

/// Value and total of one statistic, summed over the shards.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    value: i64,
    total: i64,
}

/// A consistent reading of every shard that may have been written: the `in_use` shards of
/// the slots claimed so far, then the overflow shard.
struct Snapshot {
    readings: [Reading; SLOTS + 1],
    in_use: usize,
}

impl Snapshot {
    fn readings(&self) -> &[Reading] {
        &self.readings[..=self.in_use]
    }

    /// Sums of `(value, total)` for bytes and allocations.
    fn sums(&self) -> (Sums, Sums) {
        let add = |acc: Sums, (value, total): (i64, i64)| Sums {
            value: acc.value.wrapping_add(value),
            total: acc.total.wrapping_add(total),
        };
        self.readings()
            .iter()
            .fold((Sums::default(), Sums::default()), |(b, a), r| {
                (add(b, r.bytes), add(a, r.allocations))
            })
    }
}

/// Which statistic.
#[derive(Debug, Clone, Copy)]
enum Stat {
    Bytes,
    Allocations,
}

impl Stat {
    fn of(self, shard: &Shard) -> &ShardStat {
        match self {
            Stat::Bytes => &shard.bytes,
            Stat::Allocations => &shard.allocations,
        }
    }

    fn reading(self, reading: &Reading) -> (i64, i64) {
        match self {
            Stat::Bytes => reading.bytes,
            Stat::Allocations => reading.allocations,
        }
    }
}

/// The freeze flag, alone on its cache line: every allocation reads it, only scans write it.
type FreezeFlag = CachePadded<AtomicBool>;

/// Increases are frozen while this lives (its holder also holds the lock).
struct Frozen<'a> {
    flag: &'a AtomicBool,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // Owners that read the lowered flag synchronize with this store and see the limits
        // written during the freeze.
        self.flag.store(false, Ordering::SeqCst);
    }
}

/// Current, peak and total counts of bytes and of allocations, with RMM's push/pop frames, as
/// kept by RMM's `statistics_resource_adaptor`.
///
/// Bytes are the **requested** sizes; a 0-byte allocation still counts as an allocation.
/// Freeing more than was allocated drives the values negative, as in RMM.
///
/// # Concurrency
///
/// Each thread records into a cache-line-padded shard of its own, so recording threads do not
/// contend: an allocation costs one uncontended atomic exchange on the thread's own cache line
/// (plus a read of a flag that only changes during scans), a deallocation plain stores, and
/// neither takes a lock in the steady state. Every reading is nevertheless **exact at an
/// instant**, under any concurrency and not only once the recording threads are done: the
/// counters are linearizable, each recording taking effect at one point inside its call, in an
/// order consistent with each thread's program order and with the synchronization between
/// threads, and each reading (and push and pop) returning the counters at one such point:
///
/// * `value` and `total` are the sums of everything recorded before that point;
/// * `peak` is **exactly** the largest value the frame's counter took at any point of its life:
///   it is never below any value reached (the lock-free path can only raise a thread's share
///   within a budget, and the budgets add up to at most the peak) and never above (the peak is
///   only raised to sums read from consistent snapshots, states that really existed);
/// * the bytes and the allocation count of one recording take effect together and are read
///   together.
///
/// What exactness costs: an allocation that would take its thread's share above its budget
/// (the peak rises, or the room below the peak sits with other threads) takes an internal lock
/// and snapshots the shards in use; an allocation arriving during such a snapshot, or during a
/// reading, push or pop (which take the same lock), waits for it. Deallocations never wait.
/// Steadily growing use (every allocation a new peak) takes the lock on each allocation, as
/// RMM's adaptor does on every call. Threads beyond the 64 that can hold a shard at once
/// record under the lock.
#[doc(alias = "rmm::mr::statistics_resource_adaptor")]
pub struct StatisticsCounters {
    /// One shard per thread slot.
    shards: Box<[CachePadded<Shard>; SLOTS]>,
    /// Shared by threads without a slot; written only under the lock.
    overflow: CachePadded<Shard>,
    freeze: FreezeFlag,
    state: Mutex<State>,
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

/// The counter of the frame whose base is `base`, given the current sums and running peak.
fn frame_counter(sums: Sums, peak: i64, base: &FrameBase) -> Counter {
    let value = sums.value.wrapping_sub(base.value);
    Counter {
        value,
        peak: peak.wrapping_sub(base.value).max(value),
        total: sums.total.wrapping_sub(base.total),
    }
}

impl StatisticsCounters {
    /// All counters zero, one frame.
    pub fn new() -> StatisticsCounters {
        StatisticsCounters {
            shards: Box::new(std::array::from_fn(|_| CachePadded::default())),
            overflow: CachePadded::default(),
            freeze: FreezeFlag::default(),
            state: Mutex::new(State {
                frames: vec![Frame::default()],
                bytes_peak: 0,
                allocations_peak: 0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held, and the state stays valid regardless.
        self.state.lock()
    }

    /// The shard of `slot`, or the overflow shard (lock holders only) for `None`.
    #[inline]
    fn shard(&self, slot: Option<usize>) -> &Shard {
        match slot {
            Some(i) => &self.shards[i % SLOTS],
            None => &self.overflow,
        }
    }

    /// Stops lock-free increases until the returned guard is dropped; the lock (`_state`)
    /// must be held. Decreases go on.
    fn freeze<'a>(&'a self, _state: &MutexGuard<'_, State>) -> Frozen<'a> {
        self.freeze.store(true, Ordering::SeqCst);
        Frozen { flag: &self.freeze }
    }

    /// The shards of the first `in_use` slots, then the overflow shard.
    fn shards_in_use(&self, in_use: usize) -> impl Iterator<Item = &Shard> {
        self.shards[..in_use]
            .iter()
            .map(|s| &**s)
            .chain(std::iter::once(&*self.overflow))
    }

    /// A consistent snapshot, increases frozen: every shard read stably, then found unchanged
    /// by a second pass, so all the readings held together at an instant between the passes.
    ///
    /// Increases in flight are waited out and later ones are frozen, so only deallocations can
    /// make the passes disagree: each disagreement means one more deallocation completed, and
    /// with allocations held back there are only as many of those as live allocations (plus
    /// frees of memory that was not counted), so this ends. The slot bound is read after the
    /// freeze and again after the second pass: a thread that claimed a slot in between (and may
    /// have freed through it, unseen) forces another round.
    fn snapshot(&self, _frozen: &Frozen<'_>) -> Snapshot {
        let mut snapshot = Snapshot {
            readings: [Reading::default(); SLOTS + 1],
            in_use: 0,
        };
        let mut spins = 0u32;
        loop {
            // After the freeze: a thread whose first increase could slip past the freeze raised
            // the bound before it (see `slots`).
            let in_use = slots::bound();
            for (slot, shard) in snapshot.readings.iter_mut().zip(self.shards_in_use(in_use)) {
                *slot = shard.read();
            }
            snapshot.in_use = in_use;
            let agree = self
                .shards_in_use(in_use)
                .zip(snapshot.readings())
                .all(|(shard, r)| shard.unchanged_since(r.seq));
            if agree && slots::bound() == in_use {
                return snapshot;
            }
            backoff(&mut spins);
        }
    }

    /// Counts a successful allocation of `bytes` bytes (call after the upstream allocated).
    /// Lock-free unless it may raise the peak (see the module docs).
    #[inline]
    pub fn record_allocation(&self, bytes: usize) {
        let bytes = to_i64(bytes);
        let slot = slots::current();
        if let Some(i) = slot {
            if self.shard(Some(i)).try_add(&self.freeze, bytes) {
                return;
            }
        }
        self.record_allocation_locked(slot, bytes);
    }

    /// Counts a deallocation of `bytes` bytes (call before the upstream frees, as RMM does to
    /// avoid an ABA race on reused addresses). Lock-free and wait-free (no read-modify-write
    /// instruction) for threads holding a slot.
    #[inline]
    pub fn record_deallocation(&self, bytes: usize) {
        let bytes = to_i64(bytes);
        match slots::current() {
            Some(i) => self.shard(Some(i)).sub(bytes),
            None => self.record_deallocation_locked(bytes),
        }
    }

    /// Takes back a deallocation of `bytes` bytes recorded by
    /// [`record_deallocation`](Self::record_deallocation) that the upstream then refused (the
    /// memory is still allocated): the values go back up, the totals do not. It is an increase
    /// like an allocation's (lock-free unless it may raise the peak), so the peak stays exact.
    #[inline]
    pub fn undo_deallocation(&self, bytes: usize) {
        let bytes = to_i64(bytes);
        let slot = slots::current();
        if let Some(i) = slot {
            if self.shard(Some(i)).try_raise(&self.freeze, bytes, false) {
                return;
            }
        }
        self.record_increase_locked(slot, bytes, false);
    }

    #[cold]
    #[inline(never)]
    fn record_allocation_locked(&self, slot: Option<usize>, bytes: i64) {
        self.record_increase_locked(slot, bytes, true);
    }

    /// An increase of the values by `bytes` and one allocation (and of the totals when
    /// `total`) that may raise the peak.
    fn record_increase_locked(&self, slot: Option<usize>, bytes: i64, total: bool) {
        let mut state = self.state();
        // Under the lock no scan runs and nobody else writes this shard.
        let shard = self.shard(slot);
        if shard.bytes.fits(bytes) && shard.allocations.fits(1) {
            shard.bytes.raise(bytes, total);
            shard.allocations.raise(1, total);
            return;
        }
        let frozen = self.freeze(&state);
        // Applied now but, for everyone else, taking effect at the snapshot's instant: nobody
        // reads this shard before the snapshot, and this call has not returned.
        shard.bytes.raise(bytes, total);
        shard.allocations.raise(1, total);
        let snapshot = self.snapshot(&frozen);
        // Index of the requester among the snapshot's shards (the overflow shard comes last).
        // This thread claimed its slot before, so the slot is below the bound.
        let requester = slot.map_or(snapshot.in_use, |i| i % SLOTS);
        let state = &mut *state;
        self.raise_and_share(
            &frozen,
            &snapshot,
            requester,
            Stat::Bytes,
            &mut state.bytes_peak,
        );
        self.raise_and_share(
            &frozen,
            &snapshot,
            requester,
            Stat::Allocations,
            &mut state.allocations_peak,
        );
    }

    #[cold]
    #[inline(never)]
    fn record_deallocation_locked(&self, bytes: i64) {
        let _state = self.state();
        self.overflow.bytes.sub(bytes);
        self.overflow.allocations.sub(1);
    }

    /// With increases frozen: raises `peak` to the snapshot's sum of one statistic if above,
    /// then shares the room below it out as new limits. The values can only have dropped since
    /// the snapshot, so limits at or above the snapshot's values still cover them.
    fn raise_and_share(
        &self,
        _frozen: &Frozen<'_>,
        snapshot: &Snapshot,
        requester: usize,
        stat: Stat,
        peak: &mut i64,
    ) {
        let mut values = [0i64; SLOTS + 1];
        let mut limits = [0i64; SLOTS + 1];
        let n = snapshot.readings().len();
        let mut sum = 0i64;
        for ((value, limit), (shard, reading)) in values
            .iter_mut()
            .zip(limits.iter_mut())
            .zip(self.shards_in_use(snapshot.in_use).zip(snapshot.readings()))
        {
            *value = stat.reading(reading).0;
            *limit = stat.of(shard).limit.load(Ordering::Relaxed);
            sum = sum.wrapping_add(*value);
        }
        *peak = (*peak).max(sum);
        share_slack(&values[..n], &mut limits[..n], requester, *peak);
        for (shard, &limit) in self.shards_in_use(snapshot.in_use).zip(&limits[..n]) {
            stat.of(shard).limit.store(limit, Ordering::Relaxed);
        }
    }

    /// A consistent snapshot's sums, taken under the lock.
    fn sums(&self, state: &MutexGuard<'_, State>) -> (Sums, Sums) {
        let frozen = self.freeze(state);
        self.snapshot(&frozen).sums()
    }

    /// Test only: checks, on a consistent snapshot, what keeps the peak exact: every shard's
    /// value is within its limit, and the limits (so the values) add up to at most the running
    /// peak, for both statistics. Returns the snapshot's `(bytes, allocations)` values.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) -> Result<(i64, i64), String> {
        let state = self.state();
        let frozen = self.freeze(&state);
        let snapshot = self.snapshot(&frozen);
        let mut values = (0, 0);
        for (stat, peak, value) in [
            (Stat::Bytes, state.bytes_peak, &mut values.0),
            (Stat::Allocations, state.allocations_peak, &mut values.1),
        ] {
            let (mut sum, mut limits) = (0i128, 0i128);
            for (shard, reading) in self.shards_in_use(snapshot.in_use).zip(snapshot.readings()) {
                let (v, limit) = (
                    stat.reading(reading).0,
                    stat.of(shard).limit.load(Ordering::Relaxed),
                );
                if v > limit {
                    return Err(format!(
                        "{stat:?}: a shard's value {v} is above its limit {limit}"
                    ));
                }
                sum += i128::from(v);
                limits += i128::from(limit);
            }
            if limits > i128::from(peak) {
                return Err(format!(
                    "{stat:?}: the limits add up to {limits}, above the peak {peak}"
                ));
            }
            *value = i64::try_from(sum).map_err(|e| e.to_string())?;
        }
        Ok(values)
    }

    /// The top frame's counters, from one consistent snapshot.
    fn read(&self) -> (Counter, Counter) {
        let state = self.state();
        let (bytes, allocations) = self.sums(&state);
        let top = state.frames.last().copied().unwrap_or_default();
        (
            frame_counter(bytes, state.bytes_peak, &top.bytes),
            frame_counter(allocations, state.allocations_peak, &top.allocations),
        )
    }

    /// The top frame's bytes counter.
    #[doc(alias = "get_bytes_counter")]
    pub fn bytes(&self) -> Counter {
        self.read().0
    }

    /// The top frame's allocation-count counter.
    #[doc(alias = "get_allocations_counter")]
    pub fn allocations(&self) -> Counter {
        self.read().1
    }

    /// The top frame's `(bytes, allocations)` counters, read together (one consistent
    /// snapshot).
    pub fn counters(&self) -> (Counter, Counter) {
        self.read()
    }

    /// Number of frames on the stack (1 when nothing was pushed).
    pub fn depth(&self) -> usize {
        self.state().frames.len()
    }

    /// Pushes a fresh pair of zero counters, which the readers report from now on; returns the
    /// `(bytes, allocations)` counters of the previous top frame as they stood.
    pub fn push_counters(&self) -> (Counter, Counter) {
        let mut state = self.state();
        let (bytes, allocations) = {
            let frozen = self.freeze(&state);
            let snapshot = self.snapshot(&frozen);
            // The new frame's peak starts at the current value, so no room is left below it:
            // every shard's limit drops to its value in the snapshot (at or above its value
            // now, as only decreases went on).
            for (shard, reading) in self.shards_in_use(snapshot.in_use).zip(snapshot.readings()) {
                for stat in [Stat::Bytes, Stat::Allocations] {
                    let value = stat.reading(reading).0;
                    stat.of(shard).limit.store(value, Ordering::Relaxed);
                }
            }
            snapshot.sums()
        };
        let state = &mut *state;
        let Some(parent) = state.frames.last_mut() else {
            // Unreachable: the stack is never empty. Re-seed rather than panic.
            state.frames.push(Frame::default());
            return (Counter::default(), Counter::default());
        };
        let snapshot = (
            frame_counter(bytes, state.bytes_peak, &parent.bytes),
            frame_counter(allocations, state.allocations_peak, &parent.allocations),
        );
        parent.bytes.saved_peak = state.bytes_peak;
        parent.allocations.saved_peak = state.allocations_peak;
        state.bytes_peak = bytes.value;
        state.allocations_peak = allocations.value;
        state.frames.push(Frame {
            bytes: FrameBase {
                value: bytes.value,
                total: bytes.total,
                saved_peak: bytes.value,
            },
            allocations: FrameBase {
                value: allocations.value,
                total: allocations.total,
                saved_peak: allocations.value,
            },
        });
        snapshot
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
        let mut state = self.state();
        if state.frames.len() < 2 {
            return Err(StatsError::PopLastFrame);
        }
        let (bytes, allocations) = self.sums(&state);
        let state = &mut *state;
        let child = state.frames.pop().unwrap_or_default();
        let parent = state.frames.last().copied().unwrap_or_default();
        let popped = (
            frame_counter(bytes, state.bytes_peak, &child.bytes),
            frame_counter(allocations, state.allocations_peak, &child.allocations),
        );
        // The parent's running peak continues through the child's life. It only rises, so the
        // limits stay within it.
        state.bytes_peak = state.bytes_peak.max(parent.bytes.saved_peak);
        state.allocations_peak = state.allocations_peak.max(parent.allocations.saved_peak);
        Ok(popped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicBool;
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
    fn an_undone_deallocation_restores_values_and_keeps_totals() {
        let s = StatisticsCounters::new();
        s.record_allocation(100);
        s.record_deallocation(100);
        s.record_allocation(50);
        // The free of the 100 bytes is refused: they were live all along, so the peak the
        // counters report must include them (150), and the totals must not count them twice.
        s.undo_deallocation(100);
        assert_eq!(s.bytes(), Counter::new(150, 150, 150));
        assert_eq!(s.allocations(), Counter::new(2, 2, 2));
        // From another thread (another shard) as well.
        std::thread::scope(|sc| {
            sc.spawn(|| {
                s.record_deallocation(150);
                s.undo_deallocation(150);
            });
        });
        assert_eq!(s.bytes(), Counter::new(150, 150, 150));
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
                let invariants = s.check_invariants();
                prop_assert!(invariants.is_ok(), "{:?}", invariants);
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

    #[test]
    fn threads_taking_turns_keep_the_peak_exact() {
        // Every thread has its own shard: A's room from its first allocation must not hide the
        // second thread's allocation when A allocates again.
        use std::sync::mpsc::channel;
        let s = Arc::new(StatisticsCounters::new());
        let (to_b, b_inbox) = channel::<()>();
        let (to_a, a_inbox) = channel::<()>();
        let b = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                b_inbox.recv().unwrap();
                s.record_allocation(10); // held while A allocates again
                to_a.send(()).unwrap();
                b_inbox.recv().unwrap();
                s.record_deallocation(10);
            })
        };
        s.record_allocation(10);
        s.record_deallocation(10);
        to_b.send(()).unwrap();
        a_inbox.recv().unwrap();
        s.record_allocation(10);
        assert_eq!(s.bytes(), Counter::new(20, 20, 30));
        to_b.send(()).unwrap();
        b.join().unwrap();
        s.record_deallocation(10);
        assert_eq!(s.bytes(), Counter::new(0, 20, 30));
        assert_eq!(s.allocations(), Counter::new(0, 2, 3));
    }

    #[test]
    fn concurrent_peak_is_exact() {
        // Each thread churns below its share, then holds exactly `HOLD` allocations while all
        // the others do too, then churns again: the largest value ever reached is
        // THREADS * HOLD, at the barrier, and nothing may be reported above or below it.
        const THREADS: usize = 4;
        const HOLD: usize = 5;
        let s = Arc::new(StatisticsCounters::new());
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (s, barrier) = (Arc::clone(&s), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let churn = |s: &StatisticsCounters| {
                        for i in 0..5000 {
                            let n = 1 + i % HOLD;
                            for _ in 0..n {
                                s.record_allocation(100);
                            }
                            for _ in 0..n {
                                s.record_deallocation(100);
                            }
                        }
                    };
                    // At most HOLD each before and after, so never more than THREADS * HOLD.
                    churn(&s);
                    for _ in 0..HOLD {
                        s.record_allocation(100);
                    }
                    barrier.wait();
                    barrier.wait();
                    for _ in 0..HOLD {
                        s.record_deallocation(100);
                    }
                    churn(&s);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(s.check_invariants(), Ok((0, 0)));
        let (bytes, allocations) = s.counters();
        let n = (THREADS * HOLD) as i64;
        assert_eq!(allocations.value, 0);
        assert_eq!(allocations.peak, n);
        assert_eq!(bytes.peak, 100 * n);
        assert_eq!(bytes.value, 0);
        let per_thread: i64 = (0..5000).map(|i| 1 + i % HOLD as i64).sum::<i64>() * 2 + HOLD as i64;
        assert_eq!(allocations.total, per_thread * THREADS as i64);
    }

    #[test]
    fn more_threads_than_slots_are_counted_exactly() {
        const THREADS: usize = slots::SLOTS + 8;
        let s = Arc::new(StatisticsCounters::new());
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (s, barrier) = (Arc::clone(&s), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        s.record_allocation(t);
                        s.record_deallocation(t);
                    }
                    s.record_allocation(t);
                    // All alive and holding one at once: some found every slot taken.
                    barrier.wait();
                    barrier.wait();
                    s.record_deallocation(t);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let (bytes, allocations) = s.counters();
        let sizes: i64 = (0..THREADS as i64).sum();
        assert_eq!(
            allocations,
            Counter::new(0, THREADS as i64, 101 * THREADS as i64)
        );
        assert_eq!(bytes, Counter::new(0, sizes, 101 * sizes));
    }

    #[test]
    fn concurrent_readings_are_consistent_snapshots() {
        // Snapshots are linearizable: totals and (within a frame) peaks never go back, every
        // peak covers its value, and with each worker holding at most two allocations of
        // 8 bytes, bytes are always 8 times the count.
        const THREADS: usize = 3;
        let s = Arc::new(StatisticsCounters::new());
        let done = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        s.record_allocation(8);
                        s.record_allocation(8);
                        s.record_deallocation(8);
                        s.record_deallocation(8);
                    }
                })
            })
            .collect();
        let reader = {
            let (s, done) = (Arc::clone(&s), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut last = (Counter::default(), Counter::default());
                let mut readings = 0;
                while !done.load(Ordering::Acquire) || readings == 0 {
                    let (b, a) = s.counters();
                    assert_eq!(b.value, 8 * a.value, "{b:?} {a:?}");
                    assert_eq!(b.total, 8 * a.total, "{b:?} {a:?}");
                    assert!(a.value >= 0 && a.value <= 2 * THREADS as i64, "{a:?}");
                    assert!(a.peak >= a.value && a.peak <= 2 * THREADS as i64, "{a:?}");
                    assert!(
                        a.total >= last.1.total && a.peak >= last.1.peak,
                        "{a:?} {last:?}"
                    );
                    assert!(b.peak >= last.0.peak);
                    last = (b, a);
                    readings += 1;
                }
            })
        };
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        reader.join().unwrap();
        let (b, a) = s.counters();
        assert_eq!((b.value, a.value), (0, 0));
        assert_eq!(a.total, (THREADS * 40_000) as i64);
        assert!(a.peak >= 2);
    }

    #[test]
    fn frees_on_another_thread_are_counted() {
        // A producer allocates, a consumer frees what it is handed: the shards go apart (one
        // positive, one negative) while the sums stay right.
        use std::sync::mpsc::sync_channel;
        let s = Arc::new(StatisticsCounters::new());
        let (tx, rx) = sync_channel::<usize>(4);
        let consumer = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                while let Ok(size) = rx.recv() {
                    s.record_deallocation(size);
                }
            })
        };
        for i in 0..10_000usize {
            s.record_allocation(1 + i % 3);
            tx.send(1 + i % 3).unwrap();
        }
        drop(tx);
        consumer.join().unwrap();
        let (b, a) = s.counters();
        assert_eq!(a.value, 0);
        assert_eq!(b.value, 0);
        assert_eq!(a.total, 10_000);
        // At most the channel's 4, one being received and one just sent are live.
        assert!(a.peak >= 1 && a.peak <= 6, "{a:?}");
        assert!(b.peak >= 1 && b.peak <= 18, "{b:?}");
    }
}
