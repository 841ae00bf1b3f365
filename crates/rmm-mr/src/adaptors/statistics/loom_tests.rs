//! Loom models of the statistics counters (`cargo xtask loom`): the shard's seqlock, the freeze
//! handshake, and [`StatisticsCounters`] recording on two slot holders and a thread without a
//! slot (two slots under loom) while readings, pushes and pops run. Each checks, on every
//! interleaving: readings are never torn; no increase slips past a freeze; the shards' values
//! stay within their limits and the limits within the peak; values and totals are conserved;
//! the peak is a sum that was live at once in some order of the calls the threads' own order
//! and their joins allow, and covers what the joins prove was live together. Each also checks
//! that the interleavings that matter were reached (see `crate::sync::Seen`).
//!
//! Threads that record are spawned with [`slots::spawn`] (see there); the main thread only
//! spawns and joins (see `docs/internals/loom.md` on loom's blind spot).

use loom::sync::Arc;
use loom::thread;

use super::counter::Counter;
use super::counters::StatisticsCounters;
use super::shard::Shard;
use crate::sync::atomic::{AtomicBool, Ordering};
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

/// Runs `work` on a thread holding a slot (or not, when both are taken).
fn recorder(
    s: &Arc<StatisticsCounters>,
    work: impl FnOnce(&StatisticsCounters) + 'static,
) -> loom::thread::JoinHandle<()> {
    let s = Arc::clone(s);
    slots::spawn(move || work(&s))
}

#[test]
fn loom_counters_stay_exact_while_two_threads_record() {
    static SEEN: Seen<2> = Seen::new(["peak 15 (both live at once)", "peak 10"]);
    crate::sync::model("statistics::counters", || {
        let s = Arc::new(StatisticsCounters::new());
        let a = recorder(&s, |s| {
            s.record_allocation(10);
            s.record_deallocation(10);
            s.record_allocation(10);
        });
        let b = recorder(&s, |s| {
            s.record_allocation(5);
            // A free the upstream refused: recorded, then undone.
            s.record_deallocation(5);
            s.undo_deallocation(5);
            s.record_deallocation(5);
        });
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(s.check_invariants(), Ok((10, 1)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (10, 25));
        assert_eq!((allocations.value, allocations.total), (1, 3));
        // Without synchronization between the threads, any order of their calls is a possible
        // history: the peak is one of the sums that can be live at once.
        assert!([10, 15].contains(&bytes.peak), "{bytes:?}");
        assert!([1, 2].contains(&allocations.peak), "{allocations:?}");
        SEEN.saw(usize::from(bytes.peak != 15));
    });
    SEEN.check();
}

#[test]
fn loom_the_peak_covers_what_was_live_together() {
    static SEEN: Seen<2> = Seen::new(["peak 18 (the free after the allocation)", "peak 15"]);
    crate::sync::model("statistics::peak", || {
        // 10 and 5 are both live once their threads are joined: the peak reaches 15 whatever
        // the interleaving, and 18 only if the 3 comes before the 10 goes.
        let s = Arc::new(StatisticsCounters::new());
        let a = recorder(&s, |s| s.record_allocation(10));
        let b = recorder(&s, |s| s.record_allocation(5));
        a.join().unwrap();
        b.join().unwrap();
        // Their slots are given back: these threads claim them again, with their values.
        let c = recorder(&s, |s| s.record_deallocation(10));
        let d = recorder(&s, |s| s.record_allocation(3));
        c.join().unwrap();
        d.join().unwrap();
        assert_eq!(s.check_invariants(), Ok((8, 2)));
        let (bytes, allocations) = s.counters();
        assert_eq!((bytes.value, bytes.total), (8, 18));
        assert!([15, 18].contains(&bytes.peak), "{bytes:?}");
        assert_eq!(allocations.peak, if bytes.peak == 18 { 3 } else { 2 });
        SEEN.saw(usize::from(bytes.peak != 18));
    });
    SEEN.check();
}

#[test]
fn loom_readings_are_consistent_while_threads_record() {
    static SEEN: Seen<2> = Seen::new(["a reading with both live", "a reading with fewer"]);
    crate::sync::model("statistics::readings", || {
        // Both hold 8 bytes per allocation: every reading has bytes = 8 x allocations.
        let s = Arc::new(StatisticsCounters::new());
        let a = recorder(&s, |s| s.record_allocation(8));
        let b = recorder(&s, |s| {
            s.record_allocation(8);
            s.record_deallocation(8);
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
                assert!(
                    (allocations.value..=2).contains(&allocations.peak),
                    "{allocations:?}"
                );
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
        assert!([8, 16].contains(&bytes.peak), "{bytes:?}");
    });
    SEEN.check();
}

#[test]
fn loom_a_thread_without_a_slot_is_counted_exactly() {
    static SEEN: Seen<2> = Seen::new(["a thread without a slot", "a slot claimed again"]);
    crate::sync::model("statistics::overflow", || {
        // Three threads, two slots: the third records into the overflow shard under the lock,
        // or into a slot an exited thread gave back.
        let s = Arc::new(StatisticsCounters::new());
        let threads: Vec<_> = [4usize, 2, 1]
            .into_iter()
            .map(|bytes| {
                let s = Arc::clone(&s);
                slots::spawn(move || {
                    s.record_allocation(bytes);
                    slots::current()
                })
            })
            .collect();
        let slots: Vec<Option<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(s.check_invariants(), Ok((7, 3)));
        let (bytes, allocations) = s.counters();
        assert_eq!(bytes, Counter::new(7, 7, 7), "{slots:?}");
        assert_eq!(allocations, Counter::new(3, 3, 3), "{slots:?}");
        SEEN.saw(usize::from(slots.iter().all(Option::is_some)));
    });
    SEEN.check();
}

#[test]
fn loom_push_and_pop_while_a_thread_records() {
    static SEEN: Seen<2> = Seen::new(["a child frame that saw a change", "an unchanged child"]);
    crate::sync::model("statistics::frames", || {
        let s = Arc::new(StatisticsCounters::new());
        let worker = recorder(&s, |s| {
            s.record_allocation(8);
            s.record_allocation(8);
            s.record_deallocation(8);
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
        // The worker's two allocations were live together, frames or not.
        assert_eq!((bytes.peak, allocations.peak), (16, 2));
    });
    SEEN.check();
}
