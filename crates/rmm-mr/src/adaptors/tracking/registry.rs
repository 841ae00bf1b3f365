//! [`TrackingRegistry`]: the bookkeeping of RMM's `tracking_resource_adaptor`.

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crossbeam_utils::CachePadded;

use super::error::{Addr, TrackingError, TrackingErrorRecord};
use super::shard::{Entry, RingUndo, Shard};

/// How to build a [`TrackingResourceAdaptor`](crate::TrackingResourceAdaptor): RMM's
/// `capture_stacks` and the tuning of its registry.
///
/// Built with [`new`](Self::new) or `default()` (RMM's defaults) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrackingOptions {
    /// Capture a [`Backtrace`] for every tracked allocation (slow; RMM's `capture_stacks`,
    /// default `false`).
    pub capture_stacks: bool,
    /// Number of independently locked shards; rounded up to a power of two, at least 1 and at
    /// most 1024.
    pub shards: usize,
    /// How many recent frees each shard remembers to tell a double free from an untracked free.
    pub recent_frees_per_shard: usize,
    /// How many error records are kept (the newest); older ones are dropped.
    pub error_capacity: usize,
}

impl TrackingOptions {
    /// RMM's defaults: no stacks, and the default tuning.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the field `capture_stacks`.
    #[must_use]
    pub fn capture_stacks(mut self, on: bool) -> Self {
        self.capture_stacks = on;
        self
    }

    /// Sets the field `shards`.
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// Sets the field `recent_frees_per_shard`.
    #[must_use]
    pub fn recent_frees_per_shard(mut self, frees: usize) -> Self {
        self.recent_frees_per_shard = frees;
        self
    }

    /// Sets the field `error_capacity`.
    #[must_use]
    pub fn error_capacity(mut self, records: usize) -> Self {
        self.error_capacity = records;
        self
    }

    /// Default shard count.
    pub const DEFAULT_SHARDS: usize = 64;
    /// Default recent-free memory per shard (8192 frees across the default 64 shards).
    pub const DEFAULT_RECENT_FREES_PER_SHARD: usize = 128;
    /// Default number of kept error records.
    pub const DEFAULT_ERROR_CAPACITY: usize = 1024;
}

impl Default for TrackingOptions {
    fn default() -> Self {
        TrackingOptions {
            capture_stacks: false,
            shards: TrackingOptions::DEFAULT_SHARDS,
            recent_frees_per_shard: TrackingOptions::DEFAULT_RECENT_FREES_PER_SHARD,
            error_capacity: TrackingOptions::DEFAULT_ERROR_CAPACITY,
        }
    }
}

/// A snapshot of one outstanding allocation.
#[derive(Debug, Clone)]
pub struct OutstandingAllocation {
    /// Its address.
    pub addr: u64,
    /// Its size in bytes.
    pub size: usize,
    /// Where it was allocated, when stacks are captured.
    pub stack: Option<Arc<Backtrace>>,
}

/// An entry [`TrackingRegistry::untrack`] removed, to [restore](TrackingRegistry::restore).
#[derive(Debug)]
pub(crate) struct Untracked {
    addr: u64,
    entry: Entry,
    ring: Option<RingUndo>,
}

/// A shard padded to its own cache lines so neighbouring locks do not false-share.
type Padded = CachePadded<Mutex<Shard>>;

/// The outstanding allocations of a tracking adaptor: address → size (and optionally the
/// allocation's stack), their byte sum, and detection of wrong frees.
///
/// Differences from RMM's `tracking_resource_adaptor` bookkeeping:
///
/// * **Sharded locks** instead of one `shared_mutex`: an address's shard is picked by hashing,
///   so threads working on different allocations rarely contend.
/// * **Wrong frees are errors**, not just log lines: [`record_deallocation`] returns a
///   [`TrackingError`] for an untracked free, a double free (an address freed recently and
///   not allocated since) or a size mismatch, logs it with [`log::error!`] as RMM does, and
///   appends it to a bounded record read with [`errors`](Self::errors).
/// * **Snapshots** instead of references: [`outstanding`](Self::outstanding) returns a copy,
///   where RMM's `get_outstanding_allocations()` hands out a reference to the live map that is
///   only safe while no other thread allocates or frees. Snapshots and the byte count lock the
///   shards one at a time, so under concurrent traffic they are consistent per shard, not
///   across shards.
/// * A **0-byte free of a live address** is a size mismatch; RMM skips every 0-byte free.
///
/// As in RMM, 0-byte allocations are not tracked, an untracked free leaves the byte count
/// alone (it cannot underflow), and a size mismatch removes the entry and subtracts the
/// allocated size.
///
/// [`record_deallocation`]: Self::record_deallocation
#[doc(alias = "rmm::mr::tracking_resource_adaptor")]
pub struct TrackingRegistry {
    shards: Box<[Padded]>,
    /// `64 - log2(shards)`; shifting the mixed address by it yields the shard index.
    shard_shift: u32,
    capture_stacks: bool,
    errors: Mutex<VecDeque<TrackingErrorRecord>>,
    error_capacity: usize,
    error_count: AtomicU64,
}

impl Default for TrackingRegistry {
    fn default() -> Self {
        TrackingRegistry::with_options(TrackingOptions::default())
    }
}

impl fmt::Debug for TrackingRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingRegistry")
            .field("shards", &self.shards.len())
            .field("capture_stacks", &self.capture_stacks)
            .field("outstanding", &self.outstanding_count())
            .field("allocated_bytes", &self.allocated_bytes())
            .field("error_count", &self.error_count())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; a poisoned one still holds valid data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TrackingRegistry {
    /// A registry with RMM's defaults (no stacks) and the default tuning.
    pub fn new() -> TrackingRegistry {
        TrackingRegistry::with_options(TrackingOptions::default())
    }

    /// A registry built with `options`.
    pub fn with_options(options: TrackingOptions) -> TrackingRegistry {
        let config = options;
        let shards = config.shards.clamp(1, 1024).next_power_of_two();
        let shard_shift = 64 - shards.trailing_zeros();
        TrackingRegistry {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(Shard::new(config.recent_frees_per_shard))))
                .collect(),
            shard_shift,
            capture_stacks: config.capture_stacks,
            errors: Mutex::new(VecDeque::new()),
            error_capacity: config.error_capacity,
            error_count: AtomicU64::new(0),
        }
    }

    /// Whether allocation stacks are captured.
    pub fn capture_stacks(&self) -> bool {
        self.capture_stacks
    }

    #[inline]
    fn shard(&self, addr: u64) -> &Mutex<Shard> {
        // Fibonacci hashing on the top bits; a distinct function from the in-shard map's hash.
        let index = addr
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .checked_shr(self.shard_shift)
            .unwrap_or(0) as usize;
        &self.shards[index]
    }

    /// Tracks an allocation of `size` bytes at `addr` (call after the upstream allocated).
    /// 0-byte allocations are not tracked.
    ///
    /// # Errors
    ///
    /// [`TrackingError::DuplicateAllocation`] if `addr` is already live; the existing entry
    /// stays (RMM throws `logic_error` "pointer is already tracked").
    pub fn record_allocation(&self, addr: u64, size: usize) -> Result<(), TrackingError> {
        if size == 0 {
            return Ok(());
        }
        let stack = self
            .capture_stacks
            .then(|| Arc::new(Backtrace::force_capture()));
        let result = lock(self.shard(addr)).insert(addr, Entry { size, stack });
        result.map_err(|e| self.report_error(e))
    }

    /// Untracks the allocation at `addr` freed with `size` bytes (call before the upstream
    /// frees, so a reused address cannot race with its own entry).
    ///
    /// # Errors
    ///
    /// * [`TrackingError::SizeMismatch`]: `addr` was live with another size; the entry is
    ///   removed and the allocated size subtracted, so the caller should free that size.
    /// * [`TrackingError::DoubleFree`]: `addr` is not live but its shard remembers freeing it.
    /// * [`TrackingError::UntrackedFree`]: `addr` is not live and not remembered (and `size`
    ///   is not 0: a 0-byte free of an unknown address is a free of an untracked 0-byte
    ///   allocation and succeeds).
    ///
    /// The byte count is left alone in the last two cases.
    pub fn record_deallocation(&self, addr: u64, size: usize) -> Result<(), TrackingError> {
        let (removed, result) = self.untrack(addr, size);
        drop(removed); // outside the lock: may free a backtrace
        result
    }

    /// [`record_deallocation`](Self::record_deallocation), returning what was removed so that
    /// [`restore`](Self::restore) can put it back if the upstream refuses the free.
    pub(crate) fn untrack(
        &self,
        addr: u64,
        size: usize,
    ) -> (Option<Untracked>, Result<(), TrackingError>) {
        let (removed, result) = lock(self.shard(addr)).remove(addr, size);
        let removed = removed.map(|(entry, ring)| Untracked { addr, entry, ring });
        (removed, result.map_err(|e| self.report_error(e)))
    }

    /// Tracks an allocation again whose free the upstream refused (it is still allocated): the
    /// registry is as before [`untrack`](Self::untrack), but for the errors it reported.
    pub(crate) fn restore(&self, untracked: Untracked) {
        let Untracked { addr, entry, ring } = untracked;
        let result = lock(self.shard(addr)).restore(addr, entry, ring);
        if let Err(e) = result {
            self.report_error(e);
        }
    }

    /// Logs `error`, appends it to the record and hands it back.
    #[cold]
    fn report_error(&self, error: TrackingError) -> TrackingError {
        log::error!("{error}");
        let sequence = self.error_count.fetch_add(1, Ordering::Relaxed);
        if self.error_capacity > 0 {
            let mut errors = lock(&self.errors);
            if errors.len() == self.error_capacity {
                errors.pop_front();
            }
            errors.push_back(TrackingErrorRecord {
                sequence,
                thread: std::thread::current().id(),
                error,
            });
        }
        error
    }

    /// The kept error records, oldest first (at most `error_capacity`, the newest).
    pub fn errors(&self) -> Vec<TrackingErrorRecord> {
        lock(&self.errors).iter().cloned().collect()
    }

    /// Removes and returns the kept error records; [`error_count`](Self::error_count) keeps
    /// counting.
    pub fn take_errors(&self) -> Vec<TrackingErrorRecord> {
        lock(&self.errors).drain(..).collect()
    }

    /// How many errors were ever detected, including dropped and taken records.
    pub fn error_count(&self) -> u64 {
        self.error_count.load(Ordering::Relaxed)
    }

    /// Bytes in live tracked allocations (RMM's `get_allocated_bytes()`).
    #[doc(alias = "get_allocated_bytes")]
    pub fn allocated_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| lock(s).bytes())
            .fold(0usize, usize::wrapping_add)
    }

    /// Number of live tracked allocations.
    pub fn outstanding_count(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// `(address, size)` of every live allocation, sorted by address. A copy: see the type docs
    /// for its consistency under concurrent traffic.
    #[doc(alias = "get_outstanding_allocations")]
    pub fn outstanding(&self) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(lock(shard).entries().map(|(a, e)| (a, e.size)));
        }
        out.sort_unstable_by_key(|&(addr, _)| addr);
        out
    }

    /// Every live allocation with its captured stack, sorted by address.
    pub fn outstanding_allocations(&self) -> Vec<OutstandingAllocation> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(
                lock(shard)
                    .entries()
                    .map(|(addr, e)| OutstandingAllocation {
                        addr,
                        size: e.size,
                        stack: e.stack.clone(),
                    }),
            );
        }
        out.sort_unstable_by_key(|a| a.addr);
        out
    }

    /// One line per live allocation, sorted by address, as RMM's
    /// `get_outstanding_allocations_str()`: `0x7f00: 256 B`, followed by
    /// ` : callstack:\n<stack>` when a stack was captured.
    #[doc(alias = "get_outstanding_allocations_str")]
    pub fn report(&self) -> String {
        let mut out = String::new();
        for a in self.outstanding_allocations() {
            // Writing to a String cannot fail.
            let _ = write!(out, "{}: {} B", Addr(a.addr), a.size);
            if let Some(stack) = &a.stack {
                let _ = write!(out, " : callstack:\n{stack}");
            }
            out.push('\n');
        }
        out
    }

    /// Logs [`report`](Self::report) at debug level as "Outstanding Allocations: …" (RMM's
    /// `log_outstanding_allocations()`).
    pub fn log_outstanding_allocations(&self) {
        if log::log_enabled!(log::Level::Debug) {
            log::debug!("Outstanding Allocations: {}", self.report());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn empty() {
        let r = TrackingRegistry::new();
        assert_eq!(r.allocated_bytes(), 0);
        assert_eq!(r.outstanding_count(), 0);
        assert!(r.outstanding().is_empty());
        assert_eq!(r.report(), "");
        assert!(r.errors().is_empty());
    }

    #[test]
    fn tracks_and_frees() {
        let r = TrackingRegistry::new();
        for i in 1..=10u64 {
            r.record_allocation(i << 8, i as usize * 100).unwrap();
        }
        assert_eq!(r.allocated_bytes(), 5500);
        assert_eq!(r.outstanding_count(), 10);
        assert_eq!(r.outstanding()[0], (0x100, 100));
        assert_eq!(r.outstanding()[9], (0xa00, 1000));
        for i in (1..=10u64).step_by(2) {
            r.record_deallocation(i << 8, i as usize * 100).unwrap();
        }
        assert_eq!(r.allocated_bytes(), 200 + 400 + 600 + 800 + 1000);
        assert_eq!(
            r.outstanding(),
            vec![
                (0x200, 200),
                (0x400, 400),
                (0x600, 600),
                (0x800, 800),
                (0xa00, 1000)
            ]
        );
        for i in (2..=10u64).step_by(2) {
            r.record_deallocation(i << 8, i as usize * 100).unwrap();
        }
        assert_eq!(r.allocated_bytes(), 0);
        assert!(r.errors().is_empty());
    }

    #[test]
    fn zero_byte_allocations_are_not_tracked() {
        let r = TrackingRegistry::new();
        r.record_allocation(0x100, 0).unwrap();
        assert_eq!(r.outstanding_count(), 0);
        r.record_deallocation(0x100, 0).unwrap();
        r.record_deallocation(0x100, 0).unwrap();
        assert!(r.errors().is_empty());
    }

    #[test]
    fn duplicate_allocation_keeps_the_first_entry() {
        let r = TrackingRegistry::new();
        r.record_allocation(0x100, 64).unwrap();
        assert_eq!(
            r.record_allocation(0x100, 32),
            Err(TrackingError::DuplicateAllocation {
                addr: 0x100,
                size: 32,
                tracked_size: 64
            })
        );
        assert_eq!(r.outstanding(), vec![(0x100, 64)]);
        assert_eq!(r.allocated_bytes(), 64);
        assert_eq!(r.error_count(), 1);
    }

    #[test]
    fn untracked_free_does_not_underflow() {
        // RMM TrackingTest.UntrackedDeallocationDoesNotUnderflowAllocatedBytes.
        let r = TrackingRegistry::new();
        r.record_allocation(0x100, 64).unwrap();
        let err = r.record_deallocation(0x900, 128).unwrap_err();
        assert_eq!(
            err,
            TrackingError::UntrackedFree {
                addr: 0x900,
                size: 128
            }
        );
        assert_eq!(r.allocated_bytes(), 64);
        assert_eq!(r.outstanding(), vec![(0x100, 64)]);
    }

    #[test]
    fn double_free_is_told_from_untracked() {
        let r = TrackingRegistry::new();
        r.record_allocation(0x100, 64).unwrap();
        r.record_deallocation(0x100, 64).unwrap();
        assert_eq!(
            r.record_deallocation(0x100, 64),
            Err(TrackingError::DoubleFree {
                addr: 0x100,
                size: 64,
                freed_size: 64
            })
        );
        assert_eq!(r.allocated_bytes(), 0);
        // Re-allocated and freed once more: fine again.
        r.record_allocation(0x100, 8).unwrap();
        r.record_deallocation(0x100, 8).unwrap();
        assert_eq!(r.error_count(), 1);
    }

    #[test]
    fn size_mismatch_removes_entry_and_uses_tracked_size() {
        // RMM TrackingTest.DeallocWrongBytes.
        let r = TrackingRegistry::new();
        r.record_allocation(0x100, 64).unwrap();
        r.record_allocation(0x200, 32).unwrap();
        assert_eq!(
            r.record_deallocation(0x100, 60),
            Err(TrackingError::SizeMismatch {
                addr: 0x100,
                allocated: 64,
                deallocated: 60
            })
        );
        assert_eq!(r.allocated_bytes(), 32);
        assert_eq!(r.outstanding(), vec![(0x200, 32)]);
        // A 0-byte free of a live address is a mismatch too.
        assert_eq!(
            r.record_deallocation(0x200, 0),
            Err(TrackingError::SizeMismatch {
                addr: 0x200,
                allocated: 32,
                deallocated: 0
            })
        );
        assert_eq!(r.allocated_bytes(), 0);
    }

    #[test]
    fn error_record_is_bounded_and_sequenced() {
        let r = TrackingRegistry::with_options(TrackingOptions {
            error_capacity: 3,
            ..TrackingOptions::default()
        });
        for i in 0..5u64 {
            let _ = r.record_deallocation(0x1000 + i, 1);
        }
        let errors = r.errors();
        assert_eq!(errors.len(), 3);
        assert_eq!(
            errors.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(errors[0].error.addr(), 0x1002);
        assert_eq!(errors[0].thread, std::thread::current().id());
        assert_eq!(r.error_count(), 5);
        assert_eq!(r.take_errors().len(), 3);
        assert!(r.errors().is_empty());
        assert_eq!(r.error_count(), 5);

        let r = TrackingRegistry::with_options(TrackingOptions {
            error_capacity: 0,
            ..TrackingOptions::default()
        });
        assert!(r.record_deallocation(0x10, 1).is_err());
        assert!(r.errors().is_empty());
        assert_eq!(r.error_count(), 1);
    }

    #[test]
    fn report_without_stacks_matches_rmm_lines() {
        let r = TrackingRegistry::new();
        r.record_allocation(0x7f00_0000_0200, 512).unwrap();
        r.record_allocation(0x7f00_0000_0100, 256).unwrap();
        assert_eq!(r.report(), "0x7f0000000100: 256 B\n0x7f0000000200: 512 B\n");
        assert!(r
            .outstanding_allocations()
            .iter()
            .all(|a| a.stack.is_none()));
    }

    #[test]
    fn stacks_only_when_requested() {
        // RMM TrackingTest.AllocationsLeftWithStacks / WithoutStacks.
        let r = TrackingRegistry::with_options(TrackingOptions::new().capture_stacks(true));
        assert!(r.capture_stacks());
        r.record_allocation(0x100, 10).unwrap();
        let all = r.outstanding_allocations();
        assert_eq!(all.len(), 1);
        assert!(all[0].stack.is_some());
        let report = r.report();
        assert!(report.starts_with("0x100: 10 B : callstack:\n"), "{report}");
        assert!(report.ends_with('\n'));
        r.record_deallocation(0x100, 10).unwrap();
        assert_eq!(r.report(), "");
    }

    #[test]
    fn single_shard_config_works() {
        let r = TrackingRegistry::with_options(TrackingOptions {
            shards: 0, // clamped to 1
            ..TrackingOptions::default()
        });
        for a in 1..100u64 {
            r.record_allocation(a * 256, 1).unwrap();
        }
        assert_eq!(r.allocated_bytes(), 99);
        assert!(format!("{r:?}").contains("shards: 1"));
    }

    #[test]
    fn concurrent_alloc_free_is_exact() {
        const THREADS: u64 = 8;
        const N: u64 = 5_000;
        let r = Arc::new(TrackingRegistry::default());
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    let base = (t + 1) << 40;
                    for i in 0..N {
                        r.record_allocation(base + i * 256, 256).unwrap();
                    }
                    // Free every other one, then keep the rest.
                    for i in (0..N).step_by(2) {
                        r.record_deallocation(base + i * 256, 256).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(r.outstanding_count() as u64, THREADS * N / 2);
        assert_eq!(r.allocated_bytes() as u64, THREADS * N / 2 * 256);
        assert_eq!(r.error_count(), 0);
        let outstanding = r.outstanding();
        assert!(outstanding.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn concurrent_double_frees_are_all_caught() {
        // Two threads race to free the same addresses: each address is freed successfully
        // exactly once and reported as a double free exactly once.
        const N: u64 = 2_000;
        let r = Arc::new(TrackingRegistry::with_options(TrackingOptions {
            error_capacity: 2 * N as usize,
            ..TrackingOptions::default()
        }));
        for i in 0..N {
            r.record_allocation(0x1000 + i * 256, 64).unwrap();
        }
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    (0..N)
                        .filter(|i| r.record_deallocation(0x1000 + i * 256, 64).is_ok())
                        .count()
                })
            })
            .collect();
        let ok: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(ok as u64, N);
        assert_eq!(r.error_count(), N);
        assert!(r
            .errors()
            .iter()
            .all(|e| matches!(e.error, TrackingError::DoubleFree { freed_size: 64, .. })));
        assert_eq!(r.allocated_bytes(), 0);
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Alloc(u64, usize),
        Free(u64, usize),
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        let addr = (1u64..12).prop_map(|a| a << 8);
        let size = prop_oneof![Just(0usize), Just(64usize), Just(128usize), 1usize..1000];
        prop_oneof![
            (addr.clone(), size.clone()).prop_map(|(a, s)| Op::Alloc(a, s)),
            (addr, size).prop_map(|(a, s)| Op::Free(a, s)),
        ]
    }

    proptest! {
        #[test]
        fn matches_model(ops in proptest::collection::vec(arb_op(), 0..150), shards in 0usize..5) {
            // Recent-free memory larger than the op count: the verdicts are then exact.
            let r = TrackingRegistry::with_options(TrackingOptions {
                shards,
                recent_frees_per_shard: 256,
                error_capacity: 8,
                capture_stacks: false,
            });
            let mut live: HashMap<u64, usize> = HashMap::new();
            let mut freed: HashMap<u64, usize> = HashMap::new();
            let mut errors: Vec<TrackingError> = Vec::new();
            for op in ops {
                let (got, want) = match op {
                    Op::Alloc(a, s) => {
                        let want = if s == 0 {
                            Ok(())
                        } else if let Some(&t) = live.get(&a) {
                            Err(TrackingError::DuplicateAllocation { addr: a, size: s, tracked_size: t })
                        } else {
                            live.insert(a, s);
                            Ok(())
                        };
                        (r.record_allocation(a, s), want)
                    }
                    Op::Free(a, s) => {
                        let want = if let Some(t) = live.remove(&a) {
                            freed.insert(a, t);
                            if t == s { Ok(()) } else {
                                Err(TrackingError::SizeMismatch { addr: a, allocated: t, deallocated: s })
                            }
                        } else if s == 0 {
                            Ok(())
                        } else if let Some(&f) = freed.get(&a) {
                            Err(TrackingError::DoubleFree { addr: a, size: s, freed_size: f })
                        } else {
                            Err(TrackingError::UntrackedFree { addr: a, size: s })
                        };
                        (r.record_deallocation(a, s), want)
                    }
                };
                prop_assert_eq!(got, want);
                if let Err(e) = want {
                    errors.push(e);
                }
                let mut expect: Vec<(u64, usize)> = live.iter().map(|(&a, &s)| (a, s)).collect();
                expect.sort_unstable();
                prop_assert_eq!(r.outstanding(), expect);
                prop_assert_eq!(r.allocated_bytes(), live.values().sum::<usize>());
            }
            prop_assert_eq!(r.error_count(), errors.len() as u64);
            let kept: Vec<TrackingError> = r.errors().into_iter().map(|e| e.error).collect();
            let tail = &errors[errors.len().saturating_sub(8)..];
            prop_assert_eq!(kept.as_slice(), tail);
        }
    }
}
