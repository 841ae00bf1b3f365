//! Loom models of the thread slots (`cargo xtask loom`): live threads hold distinct slots (three
//! threads for two slots, so one may find them all taken), the bound covers every claimed slot,
//! and exited threads' slots are given back. Under loom there are two slots.
//!
//! Only threads spawned with [`spawn`] claim slots (see there).

use loom::sync::Arc;
use loom::thread;

use std::sync::atomic::AtomicBool;

use crate::sync::Seen;

use super::*;

/// A ghost record of who holds each slot: a claimer marks its slot held and checks that nobody
/// held it; it clears the mark before exiting (so before its slot is given back). Plain
/// atomics: they follow the order loom runs the threads in and add no synchronization.
struct Holders([AtomicBool; SLOTS]);

impl Holders {
    fn new() -> Self {
        Self(std::array::from_fn(|_| AtomicBool::new(false)))
    }

    /// Claims (or finds) this thread's slot, checks it, and runs `work` while holding it.
    fn hold(&self, work: impl FnOnce()) -> Option<usize> {
        let slot = current();
        assert_eq!(current(), slot, "a thread's slot changed");
        if let Some(i) = slot {
            assert!(i < SLOTS && i < bound(), "slot {i} above the bound");
            let was = self.0[i].swap(true, Ordering::AcqRel);
            assert!(!was, "slot {i} held by two live threads");
        }
        work();
        if let Some(i) = slot {
            self.0[i].store(false, Ordering::Release);
        }
        slot
    }
}

#[test]
fn loom_live_threads_hold_distinct_slots() {
    static SEEN: Seen<2> = Seen::new(["a thread found both slots taken", "every thread got one"]);
    crate::sync::model("slots::distinct", || {
        let holders = Arc::new(Holders::new());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let holders = Arc::clone(&holders);
                spawn(move || holders.hold(thread::yield_now))
            })
            .collect();
        let slots: Vec<Option<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(slots.iter().any(Option::is_some), "{slots:?}");
        SEEN.saw(usize::from(slots.iter().all(Option::is_some)));
        assert!(bound() <= SLOTS);
        // Every slot was given back: a new thread gets one.
        let holders = Arc::clone(&holders);
        let again = spawn(move || holders.hold(|| ())).join().unwrap();
        assert!(
            again.is_some(),
            "slots of exited threads were not given back"
        );
        assert_eq!(CLAIMED.load(Ordering::Relaxed), 0);
    });
    SEEN.check();
}
