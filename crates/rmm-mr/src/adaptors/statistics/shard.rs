//! [`Shard`]: one thread's share of the statistics counters, and the owner's half of the
//! freeze handshake: a seqlock written only by its owner, whose increases check the scanners'
//! `freeze` flag (Dekker's pattern), so that while a scan runs the shards can only decrease.
//! See `docs/internals/statistics.md`.

use crate::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU64, Ordering};

/// One statistic's share in a shard.
#[derive(Debug, Default)]
pub(super) struct ShardStat {
    /// Net value recorded on this shard since creation.
    pub(super) value: AtomicI64,
    /// Sum of the additions recorded on this shard since creation.
    pub(super) total: AtomicI64,
    /// The owner may raise `value` up to this without the lock; `value <= limit` always holds
    /// outside a scan. Only a scanner changes it, while increases are frozen.
    pub(super) limit: AtomicI64,
}

impl ShardStat {
    #[inline]
    fn value(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    /// Adds `amount` to the value, and to the total when `total` (the shard's only writer).
    #[inline]
    pub(super) fn raise(&self, amount: i64, total: bool) {
        self.value
            .store(self.value().wrapping_add(amount), Ordering::Relaxed);
        if total {
            let total = self.total.load(Ordering::Relaxed);
            self.total
                .store(total.wrapping_add(amount), Ordering::Relaxed);
        }
    }

    /// Subtracts `amount` from the value (the shard's only writer).
    #[inline]
    pub(super) fn sub(&self, amount: i64) {
        self.value
            .store(self.value().wrapping_sub(amount), Ordering::Relaxed);
    }

    /// Whether adding `amount` stays within the limit.
    #[inline]
    pub(super) fn fits(&self, amount: i64) -> bool {
        match self.value().checked_add(amount) {
            Some(v) => v <= self.limit.load(Ordering::Relaxed),
            None => false,
        }
    }
}

/// A stable reading of one shard.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reading {
    /// The (even) sequence number the reading was taken at.
    pub(super) seq: u64,
    /// Byte value and total.
    pub(super) bytes: (i64, i64),
    /// Allocation-count value and total.
    pub(super) allocations: (i64, i64),
}

/// A share of the counters, written only by its owner (or, for the shared overflow shard, by
/// the lock holder); the counters keep each in a `CachePadded` (two cache lines on x86-64, as
/// the adjacent-line prefetcher pulls lines in pairs).
#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Odd while the owner is updating; advances by 2 per update.
    seq: AtomicU64,
    /// Bytes, as requested.
    pub(super) bytes: ShardStat,
    /// Allocation count.
    pub(super) allocations: ShardStat,
}

impl Shard {
    /// Owner only: records an allocation of `bytes` bytes if no scan is in progress and both
    /// counters stay within their limits; returns whether it did.
    #[inline]
    pub(super) fn try_add(&self, freeze: &AtomicBool, bytes: i64) -> bool {
        self.try_raise(freeze, bytes, true)
    }

    /// Owner only: as [`try_add`](Self::try_add), counting the totals too only when `total`
    /// (without: the undoing of a deallocation).
    #[inline]
    pub(super) fn try_raise(&self, freeze: &AtomicBool, bytes: i64, total: bool) -> bool {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::SeqCst);
        // A freeze read as lowered is either one before any scan that could miss this update,
        // or the release that ended such a scan (whose new limits are then visible).
        if freeze.load(Ordering::SeqCst) || !self.bytes.fits(bytes) || !self.allocations.fits(1) {
            // Nothing was written: the old sequence number stays valid.
            self.seq.store(seq, Ordering::Release);
            return false;
        }
        fence(Ordering::Release);
        self.bytes.raise(bytes, total);
        self.allocations.raise(1, total);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
        true
    }

    /// Owner only: records a deallocation of `bytes` bytes. Never waits.
    #[inline]
    pub(super) fn sub(&self, bytes: i64) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.bytes.sub(bytes);
        self.allocations.sub(1);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// A stable reading (the sequence number even and the same before and after), waiting
    /// out an update in flight.
    pub(super) fn read(&self) -> Reading {
        let mut spins = 0u32;
        loop {
            let seq = self.seq.load(Ordering::SeqCst);
            if seq & 1 == 0 {
                let reading = Reading {
                    seq,
                    bytes: (
                        self.bytes.value.load(Ordering::Relaxed),
                        self.bytes.total.load(Ordering::Relaxed),
                    ),
                    allocations: (
                        self.allocations.value.load(Ordering::Relaxed),
                        self.allocations.total.load(Ordering::Relaxed),
                    ),
                };
                if self.unchanged_since(seq) {
                    return reading;
                }
            }
            backoff(&mut spins);
        }
    }

    /// Whether no update started since the reading taken at `seq`.
    pub(super) fn unchanged_since(&self, seq: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }
}

/// Spins a little, then yields (the thread being waited for may have been preempted).
pub(super) fn backoff(spins: &mut u32) {
    if *spins < 64 {
        crate::sync::spin_loop();
        *spins += 1;
    } else {
        crate::sync::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_respect_limits_and_freeze() {
        let freeze = AtomicBool::new(false);
        let s = Shard::default();
        // Limits start at zero: only a 0-byte allocation would fit the bytes, and no
        // allocation fits the count.
        assert!(!s.try_add(&freeze, 0));
        assert_eq!(
            s.read().seq,
            0,
            "a refused update leaves the sequence number"
        );
        s.bytes.limit.store(100, Ordering::Relaxed);
        s.allocations.limit.store(2, Ordering::Relaxed);
        assert!(s.try_add(&freeze, 60));
        assert!(!s.try_add(&freeze, 41), "bytes over the limit");
        assert!(s.try_add(&freeze, 40));
        assert!(!s.try_add(&freeze, 0), "count over the limit");
        s.sub(60);
        let r = s.read();
        assert_eq!(r.seq, 6);
        assert_eq!((r.bytes, r.allocations), ((40, 100), (1, 2)));
        freeze.store(true, Ordering::SeqCst);
        assert!(!s.try_add(&freeze, 1));
        s.sub(40);
        let r = s.read();
        assert_eq!((r.bytes, r.allocations), ((0, 100), (0, 2)));
        assert!(s.unchanged_since(r.seq));
        s.sub(0);
        assert!(!s.unchanged_since(r.seq));
    }

    #[test]
    fn overflowing_addition_never_fits() {
        let s = ShardStat::default();
        s.limit.store(i64::MAX, Ordering::Relaxed);
        s.raise(i64::MAX, true);
        assert!(!s.fits(1));
        assert!(s.fits(0));
    }

    #[test]
    fn readings_are_never_torn() {
        // The owner keeps bytes = 8 * allocations; a reader must never see them apart.
        let s = Shard::default();
        s.bytes.limit.store(i64::MAX, Ordering::Relaxed);
        s.allocations.limit.store(i64::MAX, Ordering::Relaxed);
        let freeze = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for i in 0..200_000 {
                    if i % 3 == 2 {
                        s.sub(8);
                    } else {
                        assert!(s.try_add(&freeze, 8));
                    }
                }
                done.store(true, Ordering::Release);
            });
            let mut reads = 0;
            while !done.load(Ordering::Acquire) || reads == 0 {
                let r = s.read();
                assert_eq!(r.bytes.0, 8 * r.allocations.0, "{r:?}");
                assert_eq!(r.bytes.1, 8 * r.allocations.1, "{r:?}");
                reads += 1;
            }
        });
    }

    #[test]
    fn a_shard_fits_its_padding() {
        use crossbeam_utils::CachePadded;
        let padding = std::mem::align_of::<CachePadded<Shard>>();
        assert!(std::mem::size_of::<Shard>() <= padding);
        assert_eq!(std::mem::size_of::<CachePadded<Shard>>(), padding);
    }
}
