//! Loom models of the statistics counters (`cargo xtask loom`): the shard's seqlock, the freeze
//! handshake, and [`StatisticsCounters`] recording on two slot holders and a thread without a
//! slot (two slots under loom) while readings, pushes and pops run. Each checks, on every
//! interleaving: readings are never torn; no increase slips past a freeze; the shards' values
//! stay within their limits and the limits within the peak; values and totals are conserved;
//! the peak lies between what was surely and what was possibly live at once. Each also checks
//! that the interleavings that matter were reached (see `crate::sync::Seen`).
//!
//! Threads that record are spawned with [`slots::spawn`] (see there); the main thread only
//! spawns and joins (see `docs/internals/loom.md` on loom's blind spot).

use loom::sync::Arc;
use loom::thread;

use super::counters::StatisticsCounters;
use super::shard::Shard;
use crate::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use crate::sync::Seen;
use crate::util::slots;

/// A shard whose limits let everything through.
fn open_shard() -> Shard {
    let shard = Shard::default();
    shard.bytes.limit.store(i64::MAX, Ordering::Relaxed);
    shard.allocations.limit.store(i64::MAX, Ordering::Relaxed);
    shard
}

#[test]
fn loom_shard_readings_are_never_torn() {
    static SEEN: Seen<2> = Seen::new(["a reading with the allocation", "a reading without"]);
    crate::sync::model("statistics::seqlock", || {
        // The owner keeps bytes = 8 x allocations; the reader must never see them apart.
        let shard = Arc::new(open_shard());
        let freeze = Arc::new(AtomicBool::new(false));
        let owner = {
            let (shard, freeze) = (Arc::clone(&shard), Arc::clone(&freeze));
            thread::spawn(move || {
                assert!(shard.try_add(&freeze, 8));
                shard.sub(8);
                assert!(shard.try_add(&freeze, 8));
            })
        };
        let reader = {
            let shard = Arc::clone(&shard);
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..2 {
                    let r = shard.read();
                    assert_eq!(r.bytes.0, 8 * r.allocations.0, "torn value: {r:?}");
                    assert_eq!(r.bytes.1, 8 * r.allocations.1, "torn total: {r:?}");
                    assert!(r.seq % 2 == 0 && r.seq >= last, "{r:?} after seq {last}");
                    assert!((0..=1).contains(&r.allocations.0), "{r:?}");
                    SEEN.saw(usize::from(r.allocations.0 == 0));
                    last = r.seq;
                }
            })
        };
        owner.join().unwrap();
        reader.join().unwrap();
        let r = shard.read();
        assert_eq!((r.seq, r.bytes, r.allocations), (6, (8, 16), (1, 2)));
    });
    SEEN.check();
}

#[test]
fn loom_no_increase_slips_past_a_freeze() {
    static SEEN: Seen<2> = Seen::new(["an increase refused", "an increase in the reading"]);
    crate::sync::model("statistics::freeze", || {
        // Dekker's pattern: the owner raises its sequence number and then reads the flag, the
        // scanner raises the flag and then reads the sequence number. Either the owner backs
        // off, or the scanner's stable reading includes the increase.
        let shard = Arc::new(open_shard());
        let freeze = Arc::new(AtomicBool::new(false));
        let owner = {
            let (shard, freeze) = (Arc::clone(&shard), Arc::clone(&freeze));
            thread::spawn(move || shard.try_add(&freeze, 8))
        };
        let scanner = {
            let (shard, freeze) = (Arc::clone(&shard), Arc::clone(&freeze));
            thread::spawn(move || {
                freeze.store(true, Ordering::SeqCst);
                shard.read()
            })
        };
        // The owner never waits: it is done before the freeze is lowered. A refused increase
        // may have moved the sequence number for a while, but nothing was written after the
        // stable reading.
        let added = owner.join().unwrap();
        let r = scanner.join().unwrap();
        let after = shard.read();
        assert_eq!(
            (after.bytes, after.allocations),
            (r.bytes, r.allocations),
            "an increase went past the freeze after a stable reading"
        );
        assert_eq!(r.allocations.0 == 1, added, "{r:?}, owner added: {added}");
        SEEN.saw(usize::from(added));
    });
    SEEN.check();
}

/// Ghost bounds of what is live: `lo` rises after an allocation is recorded and drops before a
/// deallocation is, `hi` rises before and drops after; the counters' value lies between them at
/// every instant, so their peak between the largest `lo` and the largest `hi`.
#[derive(Default)]
struct Live {
    lo: AtomicI64,
    hi: AtomicI64,
    max_lo: AtomicI64,
    max_hi: AtomicI64,
}

impl Live {
    fn raise(counter: &AtomicI64, max: &AtomicI64, by: i64) {
        let now = counter.fetch_add(by, Ordering::SeqCst) + by;
        max.fetch_max(now, Ordering::SeqCst);
    }

    fn allocate(&self, s: &StatisticsCounters, bytes: i64) {
        Self::raise(&self.hi, &self.max_hi, bytes);
        s.record_allocation(bytes as usize);
        Self::raise(&self.lo, &self.max_lo, bytes);
    }

    fn deallocate(&self, s: &StatisticsCounters, bytes: i64) {
        self.lo.fetch_sub(bytes, Ordering::SeqCst);
        s.record_deallocation(bytes as usize);
        self.hi.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// A free the upstream refused: recorded, then undone.
    fn refused_free(&self, s: &StatisticsCounters, bytes: i64) {
        self.lo.fetch_sub(bytes, Ordering::SeqCst);
        s.record_deallocation(bytes as usize);
        s.undo_deallocation(bytes as usize);
        Self::raise(&self.lo, &self.max_lo, bytes);
    }

    /// The peak lies within the ghost bounds.
    fn check_peak(&self, peak: i64) {
        let (lo, hi) = (
            self.max_lo.load(Ordering::SeqCst),
            self.max_hi.load(Ordering::SeqCst),
        );
        assert!(lo <= peak && peak <= hi, "peak {peak} outside [{lo}, {hi}]");
    }
}

/// Runs `work` on a thread holding a slot (or not, when both are taken) with the shared
/// counters and ghost.
fn recorder(
    s: &Arc<StatisticsCounters>,
    live: &Arc<Live>,
    work: impl FnOnce(&Live, &StatisticsCounters) + 'static,
) -> loom::thread::JoinHandle<()> {
    let (s, live) = (Arc::clone(s), Arc::clone(live));
    slots::spawn(move || work(&live, &s))
}

#[test]
fn loom_counters_stay_exact_while_two_threads_record() {
    static SEEN: Seen<2> = Seen::new(["peak 15 (both live at once)", "peak 10"]);
    crate::sync::model("statistics::counters", || {
        let s = Arc::new(StatisticsCounters::new());
        let live = Arc::new(Live::default());
        let a = recorder(&s, &live, |live, s| {
            live.allocate(s, 10);
            live.deallocate(s, 10);
            live.allocate(s, 10);
        });
        let b = recorder(&s, &live, |live, s| {
            live.allocate(s, 5);
            live.refused_free(s, 5);
            live.deallocate(s, 5);
        });
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(s.check_invariants(), Ok((10, 1)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (10, 25));
        assert_eq!((allocations.value, allocations.total), (1, 3));
        live.check_peak(bytes.peak);
        SEEN.saw(usize::from(bytes.peak != 15));
    });
    SEEN.check();
}

#[test]
fn loom_readings_are_consistent_while_threads_record() {
    static SEEN: Seen<2> = Seen::new(["a reading with both live", "a reading with fewer"]);
    crate::sync::model("statistics::readings", || {
        // Both hold 8 bytes per allocation: every reading has bytes = 8 x allocations.
        let s = Arc::new(StatisticsCounters::new());
        let live = Arc::new(Live::default());
        let a = recorder(&s, &live, |live, s| live.allocate(s, 8));
        let b = recorder(&s, &live, |live, s| {
            live.allocate(s, 8);
            live.deallocate(s, 8);
        });
        let reader = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let (bytes, allocations) = s.counters();
                assert_eq!(
                    bytes.value,
                    8 * allocations.value,
                    "{bytes:?} {allocations:?}"
                );
                assert_eq!(
                    bytes.total,
                    8 * allocations.total,
                    "{bytes:?} {allocations:?}"
                );
                assert_eq!(
                    bytes.peak,
                    8 * allocations.peak,
                    "{bytes:?} {allocations:?}"
                );
                assert!((0..=2).contains(&allocations.value), "{allocations:?}");
                assert!(allocations.peak >= allocations.value, "{allocations:?}");
                SEEN.saw(usize::from(allocations.value < 2));
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        reader.join().unwrap();
        assert_eq!(s.check_invariants(), Ok((8, 1)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (8, 16));
        assert_eq!((allocations.value, allocations.total), (1, 2));
        live.check_peak(bytes.peak);
    });
    SEEN.check();
}

#[test]
fn loom_a_thread_without_a_slot_is_counted_exactly() {
    static SEEN: Seen<2> = Seen::new(["peak 7 (all live at once)", "a smaller peak"]);
    crate::sync::model("statistics::overflow", || {
        // Three threads, two slots: one records into the overflow shard under the lock.
        let s = Arc::new(StatisticsCounters::new());
        let live = Arc::new(Live::default());
        let threads: Vec<_> = [4, 2, 1]
            .into_iter()
            .map(|bytes| {
                recorder(&s, &live, move |live, s| {
                    live.allocate(s, bytes);
                    live.deallocate(s, bytes);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.check_invariants(), Ok((0, 0)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (0, 7));
        assert_eq!((allocations.value, allocations.total), (0, 3));
        assert!((1..=3).contains(&allocations.peak), "{allocations:?}");
        live.check_peak(bytes.peak);
        SEEN.saw(usize::from(bytes.peak != 7));
    });
    SEEN.check();
}

#[test]
fn loom_push_and_pop_while_a_thread_records() {
    static SEEN: Seen<2> = Seen::new(["a child frame that saw a change", "an unchanged child"]);
    crate::sync::model("statistics::frames", || {
        let s = Arc::new(StatisticsCounters::new());
        let live = Arc::new(Live::default());
        let worker = recorder(&s, &live, |live, s| {
            live.allocate(s, 8);
            live.allocate(s, 8);
            live.deallocate(s, 8);
        });
        let frames = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let (parent, _) = s.push_counters();
                assert!((0..=16).contains(&parent.value), "{parent:?}");
                let (child, child_allocations) = s.pop_counters().unwrap();
                assert!(child.peak >= child.value && child.peak >= 0, "{child:?}");
                assert!((0..=16).contains(&child.total), "{child:?}");
                assert!(parent.total + child.total <= 16, "{parent:?} {child:?}");
                assert_eq!(child.total, 8 * child_allocations.total);
                assert!(child_allocations.peak >= child_allocations.value);
                SEEN.saw(usize::from(child.total == 0 && child.value == 0));
            })
        };
        worker.join().unwrap();
        frames.join().unwrap();
        assert_eq!(s.check_invariants(), Ok((8, 1)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (8, 16));
        assert_eq!((allocations.value, allocations.total), (1, 2));
        assert_eq!(s.depth(), 1);
        live.check_peak(bytes.peak);
    });
    SEEN.check();
}
