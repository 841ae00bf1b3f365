//! The grower's patience. A thread that searched every list under the growth lock and found
//! nothing grows, and growing at least doubles a pool without a maximum; at 16 threads another
//! thread's free often leaves a fitting block a moment later. So a grower announces its size
//! ([`Patience::watch`]) before its search; every block that enters a list while it watches (a
//! free, [`Patience::freed`], or a thief's merge or share, [`Patience::merged`], each under
//! the receiving list's lock) says whether that list now fits the grower's size. After a miss,
//! [`Watch::settle`] searches again at once if a fitting block landed since the watch, else
//! waits for one, stopping after [`IDLE_WINDOW`] yields without any free at all.
//!
//! A thief's blocks (a merge, a share) are taken out under the victim's lock and put in under
//! its own; in between they are in no list, and a merge can also move them from a list the
//! search has not reached into one it has passed. Either way they land after the grower's
//! watch and report then, so the grower that missed them waits for them as for a free (the
//! wait ends when they land, or after the idle window with no free at all: a thief stalled
//! between its two locks costs a growth, never a block).
//!
//! Every wait of a growth (per hold of the growth lock) comes out of one [`Budget`]:
//! [`PATIENCE`] steps (a yield, or a search again after a fitting block landed) and
//! [`WAIT_TIME`] of wall time, whichever runs out first; past it the grower grows. So the lock
//! is held for at most `PATIENCE` + 1 searches, the waits within the budget (one step past the
//! deadline at worst), and the upstream call.
//!
//! A thief that must synchronize the device takes its blocks out first and synchronizes with
//! no lock held. [`InFlight`] counts those synchronizations, so that an allocation about to
//! report out-of-memory waits for them and looks again instead.
//!
//! Pure bookkeeping: no CUDA calls. Why and the figures: `docs/internals/stream-ordered.md`,
//! "The grower's patience" and "Tuning knobs"; the protocol's loom models:
//! `patience/loom_tests.rs`.

use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::yield_now;
use crossbeam_utils::CachePadded;
use std::time::Instant;

use crate::stream_ordered::tuning::{IDLE_WINDOW, PATIENCE, WAIT_TIME};

/// The grower's size while no grower is searching ([`Patience::wanted`]).
const NOBODY: usize = usize::MAX;

/// What a searching grower waits for (see the [module documentation](self)).
pub(crate) struct Patience {
    /// The size the searching grower wants ([`NOBODY`]: none searches). Read by every free,
    /// written only by growers: on a cache line of its own.
    wanted: CachePadded<AtomicUsize>,
    /// Since the grower's [`Patience::watch`], blocks landed in a list that then fitted the
    /// grower's size.
    fit_landed: AtomicBool,
    /// Frees made while a grower watched (fitting or not): the grower's sign of life.
    frees: AtomicU64,
    /// Run at every yield of a waiting grower, on its thread, before it yields (tests).
    #[cfg(test)]
    pub(crate) yielding: std::sync::Mutex<Option<Box<dyn FnMut() + Send>>>,
}

/// What a grower may still wait for one growth (one hold of the growth lock), shared by all
/// its settles: steps (yields and searches again), and a deadline on the wall clock (see the
/// [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Budget {
    /// Steps left.
    left: u32,
    /// Yields made (read by the growth-lock record of benchmarks and tests only).
    #[cfg(any(test, feature = "testing"))]
    spent: u32,
    /// When the waits stop, yields left or not (`None`: only yields count, for the models).
    deadline: Option<Instant>,
}

impl Budget {
    /// A growth's budget: [`PATIENCE`] steps and [`WAIT_TIME`] from `locked`, when the growth
    /// lock was taken (steps only on a test's thread that set [`UNTIMED_GROWTH`]).
    pub(crate) fn growth(locked: Instant) -> Self {
        #[cfg(test)]
        if UNTIMED_GROWTH.get() {
            return Self::new(1 << 22, None);
        }
        Self::new(PATIENCE, locked.checked_add(WAIT_TIME))
    }

    /// `left` steps until `deadline` (`None`: only steps count, for the models).
    pub(crate) fn new(left: u32, deadline: Option<Instant>) -> Self {
        Self {
            left,
            #[cfg(any(test, feature = "testing"))]
            spent: 0,
            deadline,
        }
    }

    /// The yields made so far.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn spent(&self) -> u32 {
        self.spent
    }

    /// Whether the budget ran out (no step left, or past the deadline).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn ran_out(&self) -> bool {
        self.left == 0
    }

    /// Takes one step from the budget: false, for good, once it ran out. Reads the clock (only
    /// here: on a waiting grower's path).
    fn take(&mut self) -> bool {
        if self.left == 0 || self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.left = 0;
            return false;
        }
        self.left -= 1;
        true
    }
}

#[cfg(test)]
thread_local! {
    /// Set by a test on its grower's thread: that thread's growth budgets count steps only
    /// (enough for any test on a loaded machine, still finite), so the test's outcome does not
    /// depend on the wall clock.
    pub(crate) static UNTIMED_GROWTH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A grower's search, from [`Patience::watch`] to [`Watch::settle`] or the drop.
#[must_use = "a search the grower announced; `settle` it after a miss"]
pub(crate) struct Watch<'a> {
    patience: &'a Patience,
}

/// What [`Watch::settle`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Nothing fitting landed, and nothing at all for [`IDLE_WINDOW`] yields: grow.
    Grow,
    /// A fitting block landed: search again.
    SearchAgain,
    /// The growth's [`Budget`] ran out (waiting, or before a search again): grow.
    GaveUp,
}

impl Patience {
    /// No grower searching.
    pub(crate) fn new() -> Self {
        Self {
            wanted: CachePadded::new(AtomicUsize::new(NOBODY)),
            fit_landed: AtomicBool::new(false),
            frees: AtomicU64::new(0),
            #[cfg(test)]
            yielding: std::sync::Mutex::new(None),
        }
    }

    /// A block was freed into a list: called under its lock, after the block went in, with the
    /// list's `fits`; while a grower searches, counts as its sign of life, and raises the flag
    /// if the list now fits its size.
    #[inline]
    pub(crate) fn freed(&self, fits: impl FnOnce(usize) -> bool) {
        if self.wanted.load(Ordering::SeqCst) != NOBODY {
            self.frees.fetch_add(1, Ordering::Relaxed);
            self.merged(fits);
        }
    }

    /// A thief's blocks (a merge, a share) entered its list: called under its lock, after
    /// they went in, with the list's `fits`; raises the flag if the list now fits the
    /// searching grower's size (they are no sign of life: they only move free memory).
    #[inline]
    pub(crate) fn merged(&self, fits: impl FnOnce(usize) -> bool) {
        let wanted = self.wanted.load(Ordering::SeqCst);
        if wanted != NOBODY && fits(wanted) {
            self.fit_landed.store(true, Ordering::SeqCst);
        }
    }

    /// Before a search under the growth lock for `size` bytes (one grower at a time): blocks
    /// that land from now on say whether they leave a block of `size` bytes.
    pub(crate) fn watch(&self, size: usize) -> Watch<'_> {
        self.fit_landed.store(false, Ordering::SeqCst);
        self.wanted.store(size, Ordering::SeqCst);
        Watch { patience: self }
    }

    /// A waiting grower yields once, if its budget allows: false (and no yield) when it ran
    /// out.
    fn pause(&self, budget: &mut Budget) -> bool {
        if !budget.take() {
            return false;
        }
        #[cfg(any(test, feature = "testing"))]
        {
            budget.spent += 1;
        }
        #[cfg(test)]
        if let Some(f) = self
            .yielding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            f();
        }
        yield_now();
        true
    }
}

impl Watch<'_> {
    /// After a search that missed: search again if a fitting block landed since the
    /// [`Patience::watch`], else wait for one. Every yield, and the search again it may send
    /// the grower to, comes out of `budget`, the growth's: once it ran out, no wait yields and
    /// the grower grows.
    pub(crate) fn settle(self, budget: &mut Budget) -> Settled {
        self.settle_with(budget, IDLE_WINDOW)
    }

    /// [`Watch::settle`] with its idle rule as a parameter (the models set it small).
    fn settle_with(&self, budget: &mut Budget, idle: u32) -> Settled {
        let p = self.patience;
        let mut seen = p.frees.load(Ordering::Relaxed);
        let mut settled = Settled::GaveUp;
        for spins in 1u32.. {
            if p.fit_landed.load(Ordering::SeqCst) {
                settled = Settled::SearchAgain;
                break;
            }
            if !p.pause(budget) {
                break;
            }
            if spins % idle == 0 {
                let now = p.frees.load(Ordering::Relaxed);
                if now == seen {
                    // A last look: a block may have landed during the last yield.
                    if p.fit_landed.load(Ordering::SeqCst) {
                        settled = Settled::SearchAgain;
                    } else {
                        return Settled::Grow;
                    }
                    break;
                }
                seen = now;
            }
        }
        // A search again is a step of the budget too.
        if settled == Settled::SearchAgain && !budget.take() {
            return Settled::GaveUp;
        }
        settled
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.patience.wanted.store(NOBODY, Ordering::SeqCst);
    }
}

/// Device synchronizations in progress with free blocks held out of every list, so that an
/// allocation about to report out-of-memory waits for them instead (it holds no lock then).
#[derive(Default)]
pub(crate) struct InFlight {
    count: std::sync::Mutex<usize>,
    idle: std::sync::Condvar,
}

impl InFlight {
    fn count(&self) -> std::sync::MutexGuard<'_, usize> {
        self.count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn begin(&self) -> InFlightGuard<'_> {
        *self.count() += 1;
        InFlightGuard(self)
    }

    pub(crate) fn is_busy(&self) -> bool {
        *self.count() > 0
    }

    pub(crate) fn wait_idle(&self) {
        let idle = self.idle.wait_while(self.count(), |count| *count > 0);
        drop(idle.unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

/// Ends an [`InFlight`] synchronization when dropped.
pub(crate) struct InFlightGuard<'a>(&'a InFlight);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let mut count = self.0.count();
        *count -= 1;
        if *count == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// What tests read of the protocol.
#[cfg(test)]
mod test_access {
    impl super::Patience {
        /// Whether a fitting block landed since the grower's watch.
        pub(crate) fn fit_landed(&self) -> bool {
            self.fit_landed.load(super::Ordering::SeqCst)
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A budget that never runs out (the tests of the protocol without it).
    fn free() -> Budget {
        Budget::new(u32::MAX, None)
    }

    #[test]
    fn a_search_without_landings_grows() {
        let p = Patience::new();
        let w = p.watch(4);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
    }

    #[test]
    fn a_landing_that_left_a_fitting_block_sends_the_grower_back() {
        let p = Patience::new();
        let w = p.watch(4);
        p.freed(|wanted| wanted <= 2);
        assert!(!p.fit_landed.load(Ordering::SeqCst), "2 bytes do not fit 4");
        p.freed(|wanted| wanted <= 8);
        assert_eq!(w.settle(&mut free()), Settled::SearchAgain);
        // The next search starts afresh.
        let w = p.watch(4);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
        // Without a grower a landing asks nothing.
        p.freed(|_| panic!("nobody searches"));
    }

    #[test]
    fn a_merge_raises_the_flag_but_is_no_sign_of_life() {
        let p = Patience::new();
        let w = p.watch(4);
        p.merged(|wanted| wanted <= 2);
        let mut budget = free();
        // Only frees keep a grower waiting: with the idle rule at 4 yields it grows.
        assert_eq!(w.settle_with(&mut budget, 4), Settled::Grow);
        let w = p.watch(4);
        p.merged(|wanted| wanted <= 8);
        assert_eq!(w.settle(&mut free()), Settled::SearchAgain);
        p.merged(|_| panic!("nobody searches"));
    }

    #[test]
    fn a_grower_waits_for_a_fitting_landing_on_another_thread() {
        let p = Patience::new();
        let w = p.watch(4);
        std::thread::scope(|s| {
            // No limit and no idle rule: it returns only once the block landed.
            let grower = s.spawn(|| w.settle_with(&mut free(), u32::MAX));
            for _ in 0..3 {
                p.freed(|_| false);
            }
            p.freed(|wanted| wanted == 4);
            assert_eq!(grower.join().unwrap(), Settled::SearchAgain);
        });
    }

    #[test]
    fn a_grower_stops_waiting_when_nothing_lands() {
        let p = Patience::new();
        let w = p.watch(4);
        let mut budget = free();
        // Without the idle rule this would yield u32::MAX times.
        assert_eq!(w.settle_with(&mut budget, 4), Settled::Grow);
        assert_eq!(budget.spent(), 4);
    }

    /// One budget for all the settles of a growth, searches again included: a grower whose
    /// searches keep missing a fitting block that frees report (another thread takes each
    /// first) takes `PATIENCE` steps in all, yields and searches again together, not per
    /// settle, and then grows.
    #[test]
    fn the_budget_spans_every_settle_of_a_growth() {
        // A static of its own (the yield hook it holds needs one), not a leaked box: Miri
        // reports leaks, and memory a static reaches is none.
        static P: std::sync::OnceLock<Patience> = std::sync::OnceLock::new();
        let p: &'static Patience = P.get_or_init(Patience::new);
        let yields = std::sync::Arc::new(AtomicU64::new(0));
        let y = std::sync::Arc::clone(&yields);
        // Frees all along, every 100th fitting.
        *p.yielding.lock().unwrap() = Some(Box::new(move || {
            let n = y.fetch_add(1, Ordering::Relaxed) + 1;
            p.freed(|_| n % 100 == 0);
        }));
        let mut budget = Budget::new(PATIENCE, None);
        let mut again = 0;
        loop {
            let w = p.watch(4);
            // The search misses.
            match w.settle(&mut budget) {
                Settled::SearchAgain => again += 1,
                other => break assert_eq!(other, Settled::GaveUp),
            }
        }
        // Without the shared budget this never ends (each settle is sent back after 100
        // yields); with a search again free of charge, 1024 yields and 10 searches.
        let yields = yields.load(Ordering::Relaxed);
        assert_eq!((yields, again), (1014, 10));
        assert_eq!(yields + again, u64::from(PATIENCE));
        assert!(budget.ran_out());
        // Past the budget a settle yields no more, and a fitting block no longer sends the
        // grower back.
        let w = p.watch(4);
        p.freed(|_| true);
        assert_eq!(w.settle(&mut budget), Settled::GaveUp);
        assert_eq!(u64::from(budget.spent()), yields);
    }

    /// The wall-clock side of the budget: yields that take a millisecond each (an
    /// oversubscribed host) stop the wait after about `time`, frees or not.
    #[test]
    fn the_clock_ends_the_wait() {
        // A static of its own (the yield hook it holds needs one), not a leaked box: Miri
        // reports leaks, and memory a static reaches is none.
        static P: std::sync::OnceLock<Patience> = std::sync::OnceLock::new();
        let p: &'static Patience = P.get_or_init(Patience::new);
        *p.yielding.lock().unwrap() = Some(Box::new(move || {
            std::thread::sleep(Duration::from_millis(1));
            p.freed(|_| false);
        }));
        let mut budget = Budget::new(1000, Instant::now().checked_add(Duration::from_millis(5)));
        let w = p.watch(4);
        // No idle rule, and 1,000 steps: only the clock stops it sooner.
        assert_eq!(w.settle_with(&mut budget, u32::MAX), Settled::GaveUp);
        assert!(budget.ran_out());
        assert!(budget.spent() <= 5, "{} yields", budget.spent());
    }
}
