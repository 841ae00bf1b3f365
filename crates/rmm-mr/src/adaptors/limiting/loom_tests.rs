//! Loom models of the limiting adaptor's counting (`cargo xtask loom`): the reservation
//! counter with its roll-back, the per-slot release totals written with plain stores, their
//! collection under the lock, and slots given back and claimed again (two slots under loom).
//! Each checks, on every interleaving: the successful reservations never hold more than the
//! limit together; a free that completed before a request is collected before it fails; and
//! at the end every byte reserved was released (the count is back to zero).
//!
//! Threads that free are spawned with [`slots::spawn`] (see there); the main thread only spawns
//! and joins.

use loom::sync::Arc;
use loom::thread;

use super::Limiting;
use crate::sync::Seen;
use crate::util::slots;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The counting core of an adaptor with `limit`, and a ghost of the bytes the successful
/// reservations hold: raised after a reservation succeeded, lowered before its release, so
/// always at most what they hold. A plain atomic: it follows the order loom runs the threads
/// in and adds no synchronization to the code checked.
struct Model {
    limiting: Limiting<()>,
    held: AtomicUsize,
}

impl Model {
    fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limiting: Limiting::new((), limit, 256),
            held: AtomicUsize::new(0),
        })
    }

    /// Reserves `size`; on success checks that the holders stay within the limit.
    fn reserve(&self, size: usize) -> bool {
        if !self.limiting.try_reserve(size) {
            return false;
        }
        let held = self.held.fetch_add(size, Ordering::SeqCst) + size;
        assert!(
            held <= self.limiting.limit,
            "{held} bytes held, over the limit {}",
            self.limiting.limit
        );
        true
    }

    fn release(&self, size: usize) {
        self.held.fetch_sub(size, Ordering::SeqCst);
        self.limiting.release(size);
    }
}

#[test]
fn loom_reservations_never_overshoot() {
    static SEEN: Seen<2> = Seen::new(["a request refused", "both requests served"]);
    crate::sync::model("limiting::reserve", || {
        // Two requests of 600 against 1000: never both held; each either succeeds, or fails
        // while the other holds its bytes (or is being rolled back).
        let m = Model::new(1000);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let m = Arc::clone(&m);
                slots::spawn(move || {
                    let ok = m.reserve(600);
                    if ok {
                        m.release(600);
                    }
                    ok
                })
            })
            .collect();
        let served: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(served.iter().any(|&ok| ok), "both refused: {served:?}");
        assert_eq!(m.limiting.outstanding(), 0, "{served:?}");
        SEEN.saw(usize::from(served.iter().all(|&ok| ok)));
    });
    SEEN.check();
}

#[test]
fn loom_a_free_on_another_thread_is_collected() {
    static SEEN: Seen<2> = Seen::new(["the racing request refused", "it was served"]);
    crate::sync::model("limiting::collect", || {
        // A asks for the whole limit and hands what it got to B, which frees it (a plain store
        // to its own total); C, after B, asks for what the racing request R may leave: B's free
        // must be found.
        let m = Model::new(1024);
        let a = {
            let m = Arc::clone(&m);
            slots::spawn(move || m.reserve(1024))
        };
        let r = {
            let m = Arc::clone(&m);
            slots::spawn(move || {
                let ok = m.reserve(256);
                if ok {
                    m.held.fetch_sub(256, Ordering::SeqCst);
                }
                ok
            })
        };
        let b = {
            let m = Arc::clone(&m);
            slots::spawn(move || {
                if a.join().unwrap() {
                    m.release(1024);
                }
            })
        };
        let c = {
            let m = Arc::clone(&m);
            thread::spawn(move || {
                b.join().unwrap();
                assert!(m.reserve(768), "a completed free was not collected");
                m.held.fetch_sub(768, Ordering::SeqCst);
                m.limiting.unreserve(768);
            })
        };
        c.join().unwrap();
        let raced = r.join().unwrap();
        // R's bytes stay reserved: its allocation is still live.
        assert_eq!(m.limiting.outstanding(), if raced { 256 } else { 0 });
        SEEN.saw(usize::from(raced));
    });
    SEEN.check();
}

#[test]
fn loom_slots_given_back_keep_their_totals() {
    static SEEN: Seen<2> = Seen::new(["a thread without a slot", "a slot claimed again"]);
    crate::sync::model("limiting::slots", || {
        // Three threads, two slots: the third frees without a slot (straight off the
        // counter) or on a slot an exited thread gave back, whose total it carries on.
        let m = Model::new(512);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let m = Arc::clone(&m);
                slots::spawn(move || {
                    if m.reserve(256) {
                        m.release(256);
                    }
                    slots::current()
                })
            })
            .collect();
        let slots: Vec<Option<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(m.limiting.outstanding(), 0, "{slots:?}");
        SEEN.saw(usize::from(slots.iter().all(Option::is_some)));
    });
    SEEN.check();
}
