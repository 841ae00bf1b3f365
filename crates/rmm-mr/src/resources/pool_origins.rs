//! Who allocated a block of a driver pool, for the cross-thread rule of the per-thread default
//! stream ([`crate::util::cross_thread`]), shared by the three driver-pool resources
//! (`CudaAsyncMemoryResource`, `CudaAsyncViewMemoryResource`,
//! `CudaAsyncManagedMemoryResource`). Pure bookkeeping: no CUDA calls.
//!
//! The driver orders `cuMemFreeAsync` after the freeing stream only. A block allocated on one
//! thread's per-thread default stream and freed on another thread's would be reusable behind the
//! freeing thread's stream at once, while the allocating thread's work on it may still run. So
//! an allocation made on a per-thread default stream is recorded here (address → the
//! allocating thread's number), and a free made on a per-thread default stream takes the record
//! back: when [`needs_legacy_order`] says so, the resource frees on the **legacy** default
//! stream instead, which waits for the work queued so far on every blocking stream, both
//! threads' per-thread default streams included (`docs/internals/cross-thread.md`).
//!
//! One record serves every driver pool of the process: while a block is live its address is
//! unique in the process (unified addressing), whichever pool or device it came from. A record
//! is made after the driver handed the block out and taken back before the block goes back to
//! the driver, so no other allocation of the same address can come in between.
//!
//! A record left behind (a free on a shared stream that ran before this thread could see that
//! records exist, a record put back after a failed free) never makes a free less ordered: the
//! next per-thread allocation of the address overwrites it, and an allocation on a shared stream
//! (whose free needs no order) at worst sends its free to the legacy stream, or leaves it where
//! the caller put it when the stale thread is the freeing one.

use std::sync::LazyLock;

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::util::addr_table::Sharded;
use crate::util::cross_thread::{needs_legacy_order, Origin};

/// Where a free goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FreeOn {
    /// The caller's stream.
    Caller,
    /// The legacy default stream: another thread's per-thread default stream allocated the
    /// block.
    Legacy,
}

/// A free's verdict and the record it took back (to put back if the driver refuses the free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) struct Taken {
    pub(crate) on: FreeOn,
    /// The allocating thread's number, when the block had a record.
    record: Option<u64>,
}

/// The verdict for a free on `freeing` (the freeing thread's number when the free is made on
/// its per-thread default stream) of a block whose record says `recorded` (the allocating
/// thread's number; `None`: allocated on a stream every thread shares).
#[inline]
pub(crate) fn free_on(freeing: Option<u64>, recorded: Option<u64>) -> FreeOn {
    let origin = recorded.map_or(Origin::Shared, Origin::Thread);
    // `false`: the driver has no arena of the allocating thread to send the block back to.
    if needs_legacy_order(freeing, origin, false) {
        FreeOn::Legacy
    } else {
        FreeOn::Caller
    }
}

/// The record: addresses of blocks allocated on a per-thread default stream, to the allocating
/// thread's number (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Origins {
    shards: Sharded<u64>,
    /// Set, once, by the first record: until then a free on a shared stream has nothing to
    /// take back. A hint only (see the module documentation): a free that misses it leaves a
    /// stale record, which never weakens the rule.
    recorded_any: AtomicBool,
}

impl Default for Origins {
    fn default() -> Self {
        Self {
            shards: Sharded::default(),
            recorded_any: AtomicBool::new(false),
        }
    }
}

impl Origins {
    /// Notes that the block at `addr` was just allocated; `allocating` is the allocating
    /// thread's number when the allocation was made on its per-thread default stream (else
    /// nothing is recorded).
    #[inline]
    pub(crate) fn allocated(&self, addr: u64, allocating: Option<u64>) {
        let Some(thread) = allocating else {
            return;
        };
        if !self.recorded_any.load(Ordering::Relaxed) {
            self.recorded_any.store(true, Ordering::Relaxed);
        }
        let mut shard = self.shards.shard(addr);
        if !shard.insert(addr, thread) {
            // A stale record of the address: this allocation's is the true one.
            let _ = shard.remove_if(addr, |_| true);
            let _ = shard.insert(addr, thread);
        }
    }

    /// Takes back the record of the block at `addr`, about to be freed; `freeing` is the
    /// freeing thread's number when the free is made on its per-thread default stream. Says
    /// where the free goes.
    #[inline]
    pub(crate) fn take(&self, addr: u64, freeing: Option<u64>) -> Taken {
        let record = if freeing.is_some() || self.recorded_any.load(Ordering::Relaxed) {
            self.shards.shard(addr).remove_if(addr, |_| true).ok()
        } else {
            None
        };
        Taken {
            on: free_on(freeing, record),
            record,
        }
    }

    /// Puts back what [`take`](Self::take) took for `addr`, when the free did not happen.
    #[cold]
    pub(crate) fn put_back(&self, addr: u64, taken: Taken) {
        if taken.record.is_some() {
            self.allocated(addr, taken.record);
        }
    }

    /// Number of records (each shard read under its lock in turn).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.each().map(|s| s.len()).sum()
    }
}

/// The process's record (see the [module documentation](self)).
pub(crate) static ORIGINS: LazyLock<Origins> = LazyLock::new(Origins::default);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f00_0000_0100;

    #[test]
    fn another_threads_block_is_freed_on_the_legacy_stream() {
        let o = Origins::default();
        o.allocated(A, Some(1));
        let t = o.take(A, Some(2));
        assert_eq!(t.on, FreeOn::Legacy);
        assert_eq!(o.len(), 0, "the record was taken back");
    }

    #[test]
    fn same_thread_and_shared_streams_stay_on_the_callers_stream() {
        let o = Origins::default();
        // Freed on the allocating thread's per-thread stream.
        o.allocated(A, Some(1));
        assert_eq!(o.take(A, Some(1)).on, FreeOn::Caller);
        // Allocated on a shared stream (no record), freed on a per-thread stream.
        o.allocated(B, None);
        assert_eq!(o.len(), 0, "a shared stream's allocation is not recorded");
        assert_eq!(o.take(B, Some(2)).on, FreeOn::Caller);
        // Allocated on a per-thread stream, freed on a shared stream (the caller vouches):
        // where the caller said, and the record goes.
        o.allocated(A, Some(1));
        assert_eq!(o.take(A, None).on, FreeOn::Caller);
        assert_eq!(o.len(), 0);
    }

    #[test]
    fn a_new_allocation_overwrites_a_stale_record() {
        let o = Origins::default();
        // A record left behind (its free never took it back), then thread 3 gets the address.
        o.allocated(A, Some(1));
        o.allocated(A, Some(3));
        assert_eq!(o.len(), 1);
        // Thread 1's free of thread 3's block is ordered.
        assert_eq!(o.take(A, Some(1)).on, FreeOn::Legacy);
    }

    #[test]
    fn a_refused_free_puts_the_record_back() {
        let o = Origins::default();
        o.allocated(A, Some(1));
        let t = o.take(A, Some(2));
        o.put_back(A, t);
        assert_eq!(
            o.take(A, Some(2)).on,
            FreeOn::Legacy,
            "a retry is still ordered"
        );
        // Nothing to put back for a block without a record.
        let t = o.take(B, Some(2));
        o.put_back(B, t);
        assert_eq!(o.len(), 0);
    }

    #[test]
    fn threads_recording_and_taking_concurrently() {
        let o = Origins::default();
        std::thread::scope(|s| {
            for t in 1..=4u64 {
                let o = &o;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let addr = (t << 32) + i * 256;
                        o.allocated(addr, Some(t));
                        let other = if i % 2 == 0 { t } else { t + 10 };
                        let want = if other == t {
                            FreeOn::Caller
                        } else {
                            FreeOn::Legacy
                        };
                        assert_eq!(o.take(addr, Some(other)).on, want);
                    }
                });
            }
        });
        assert_eq!(o.len(), 0);
    }

    /// A stream as the record sees it: `None` shared, `Some(t)` thread `t`'s per-thread one.
    fn stream() -> impl Strategy<Value = Option<u64>> {
        proptest::option::of(1..4u64)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate { slot: usize, on: Option<u64> },
        Free { slot: usize, on: Option<u64> },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize, stream()).prop_map(|(slot, on)| Op::Allocate { slot, on }),
            (0..6usize, stream()).prop_map(|(slot, on)| Op::Free { slot, on }),
        ]
    }

    proptest! {
        /// Against a model that knows every block's true origin: a free goes to the legacy
        /// stream whenever the cross-thread rule says so, and otherwise where the caller said.
        #[test]
        fn frees_follow_the_true_origin(ops in proptest::collection::vec(op(), 1..80)) {
            let o = Origins::default();
            let mut live: HashMap<usize, Option<u64>> = HashMap::new();
            for op in ops {
                match op {
                    Op::Allocate { slot, on } => {
                        if live.contains_key(&slot) {
                            continue;
                        }
                        o.allocated(A + slot as u64 * 256, on);
                        live.insert(slot, on);
                    }
                    Op::Free { slot, on } => {
                        let Some(allocating) = live.remove(&slot) else {
                            continue;
                        };
                        let origin = allocating.map_or(Origin::Shared, Origin::Thread);
                        let want = if needs_legacy_order(on, origin, false) {
                            FreeOn::Legacy
                        } else {
                            FreeOn::Caller
                        };
                        prop_assert_eq!(o.take(A + slot as u64 * 256, on).on, want);
                    }
                }
            }
            for (slot, _) in live {
                let _ = o.take(A + slot as u64 * 256, None);
            }
            prop_assert_eq!(o.len(), 0, "no record outlives its block");
        }
    }
}
