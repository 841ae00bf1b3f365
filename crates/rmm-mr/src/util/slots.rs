//! Thread slots, shared by the statistics and limiting adaptors: each live thread that records
//! statistics (or frees through a limiting adaptor) owns one of [`SLOTS`] indices, and with it
//! the shard of that index in every
//! [`StatisticsCounters`](crate::adaptors::statistics::StatisticsCounters) (and the release
//! total of that index in every [`LimitingResourceAdaptor`](crate::LimitingResourceAdaptor)).
//!
//! A thread claims the lowest free slot the first time it needs one and gives it back when it
//! exits (a thread-local destructor). Slots are global, not per counter set, so one claim
//! serves every adaptor in the process. A thread that finds all slots taken, or that records
//! from a thread-local destructor after its slot was given back, gets `None` and takes the
//! shared (locked or atomic) path instead.
//!
//! Ownership is exclusive: while a thread holds slot `i`, no other thread writes shard `i` on
//! the lock-free path, so the owner may update its shard with plain loads and stores. A slot
//! handed back and claimed again carries its shard's values over (they are cumulative); the
//! release store of the exiting owner and the acquiring claim make the new owner see them.

use std::cell::Cell;

use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Number of thread slots (and of lock-free shards per counter set).
#[cfg(not(loom))]
pub(crate) const SLOTS: usize = 64;

/// Number of thread slots: two under loom, so that a model's third thread finds them all taken.
#[cfg(loom)]
pub(crate) const SLOTS: usize = 2;

/// The bits of `CLAIMED` that stand for slots.
const ALL_SLOTS: u64 = u64::MAX >> (64 - SLOTS);
const _: () = assert!(SLOTS >= 1 && SLOTS <= 64, "one bit of `CLAIMED` per slot");

/// Bit `i` set: slot `i` is owned by a live thread.
#[cfg(not(loom))]
static CLAIMED: AtomicU64 = AtomicU64::new(0);

/// One more than the highest slot ever claimed: shards at or above it were never written.
#[cfg(not(loom))]
static BOUND: AtomicUsize = AtomicUsize::new(0);

// Loom's atomics are made at run time, anew for each interleaving a model explores.
#[cfg(loom)]
loom::lazy_static! {
    static ref CLAIMED: AtomicU64 = AtomicU64::new(0);
    static ref BOUND: AtomicUsize = AtomicUsize::new(0);
}

/// A thread's claim on a slot, given back when the thread exits.
struct SlotGuard(Cell<Option<usize>>);

impl SlotGuard {
    fn claim() -> SlotGuard {
        let mut claimed = CLAIMED.load(Ordering::Relaxed);
        loop {
            let free = !claimed & ALL_SLOTS;
            if free == 0 {
                return SlotGuard(Cell::new(None));
            }
            let slot = free.trailing_zeros() as usize;
            match CLAIMED.compare_exchange_weak(
                claimed,
                claimed | (1u64 << slot),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // SeqCst: a scan that starts after this thread's first update sees the
                    // bound raised (see `StatisticsCounters`' freeze protocol).
                    BOUND.fetch_max(slot + 1, Ordering::SeqCst);
                    return SlotGuard(Cell::new(Some(slot)));
                }
                Err(now) => claimed = now,
            }
        }
    }

    /// Gives the slot back (the thread is exiting); from now on the thread has none.
    fn give_back(&self) {
        if let Some(slot) = self.0.take() {
            // Release: the next owner of the slot sees this thread's last shard updates.
            CLAIMED.fetch_and(!(1u64 << slot), Ordering::Release);
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.give_back();
    }
}

crate::sync::thread_local! {
    static SLOT: SlotGuard = SlotGuard::claim();
}

/// This thread's slot, claiming one on first use; `None` when every slot is taken or the
/// thread's slot was already given back (thread-local destructors running).
#[inline]
pub(crate) fn current() -> Option<usize> {
    SLOT.try_with(|s| s.0.get()).ok().flatten()
}

/// Loom models: spawns a model thread that gives its slot back when `f` returns, as a thread's
/// exit does. Loom runs a thread's thread-local destructors only after its `join` returned (and
/// possibly after the model ended, when the slot statics are gone), so a model thread that
/// records must be spawned with this.
#[cfg(all(test, loom))]
pub(crate) fn spawn<F, T>(f: F) -> loom::thread::JoinHandle<T>
where
    F: FnOnce() -> T + 'static,
    T: 'static,
{
    loom::thread::spawn(move || {
        let result = f();
        let _ = SLOT.try_with(SlotGuard::give_back);
        result
    })
}

/// Shards at or above this index have never been written (read it after raising the freeze).
#[inline]
pub(crate) fn bound() -> usize {
    BOUND.load(Ordering::SeqCst).min(SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_thread_keeps_its_slot() {
        let a = current();
        assert!(a.is_some());
        assert_eq!(current(), a);
        assert!(a.unwrap() < bound());
    }

    #[test]
    fn live_threads_hold_distinct_slots() {
        const THREADS: usize = 8;
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let slot = current();
                    // Everyone holds its slot until all have claimed one.
                    barrier.wait();
                    let slot = slot.expect("fewer than SLOTS threads are alive");
                    assert_ne!(CLAIMED.load(Ordering::Relaxed) & (1 << slot), 0);
                    slot
                })
            })
            .collect();
        let mut slots: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), THREADS);
    }

    #[test]
    fn exiting_threads_give_their_slots_back() {
        // Without the release, the slots would run out after SLOTS threads.
        for _ in 0..3 * SLOTS {
            let slot = std::thread::spawn(current).join().unwrap();
            assert!(slot.is_some());
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
