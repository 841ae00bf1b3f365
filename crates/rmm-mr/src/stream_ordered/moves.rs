//! Blocks in transit between free lists: a thief that merges another stream's whole list into
//! its own takes the blocks out under the victim's lock and puts them into its own list under
//! that list's lock, so between the two they are in no list. A thread that searched every list
//! under the growth lock and found nothing may have missed them there, or missed blocks that
//! moved from a list it had not visited yet to one it had, and then grows: without a maximum
//! the pool at least doubles, for memory that was free all along. RMM makes every move under
//! its one mutex and never races so.
//!
//! [`Moves`] counts the merges made outside the growth lock, by epoch: [`Moves::begin`] before
//! the blocks leave the victim's list (counted in the current epoch), the guard's drop after
//! they are in the thief's. The thief, under its own list's lock once the blocks are in, says
//! whether that list now fits the request of the grower that is searching
//! ([`MoveGuard::landed`]). The grower (one at a time: it holds
//! the growth lock) announces its size with [`Moves::watch`] before its search, and when the
//! search missed, [`Watch::settle`] ends the epoch, waits for the merges counted in it to land
//! (a merge begun after that could not hide a block from the search: its victim had been
//! searched before), and says to search again only if one of them left a fitting block behind.
//! So a grower never re-searches for merges that cannot serve it, and never waits for merges
//! that began after its search.
//!
//! A miss no merge caused is real, and growing doubles the pool; at 16 threads another
//! thread's free often leaves a fitting block a moment later. So frees made while a grower
//! watches say so too ([`Moves::freed`]), and after a real miss the grower waits for one,
//! stopping after [`IDLE_WINDOW`] yields without any free.
//!
//! Every wait of a growth (per hold of the growth lock) comes out of one [`Budget`]:
//! [`PATIENCE`] steps (a yield, or a search again after a fitting block landed) and
//! [`WAIT_TIME`] of wall time, whichever runs out first; past it the grower grows. So the lock
//! is held for at most `PATIENCE` + 1 searches, the waits within the budget (one step past the
//! deadline at worst), and the upstream call.
//!
//! Merges are not the only way blocks leave every list: a thief that must synchronize the
//! device takes its blocks out first and synchronizes with no lock held. [`InFlight`] counts
//! those synchronizations, so that an allocation about to report out-of-memory waits for them
//! and looks again instead.
//!
//! Pure bookkeeping: no CUDA calls. Why and the figures: `docs/internals/stream-ordered.md`,
//! "Blocks in transit" and "Tuning knobs"; the protocol's loom models: `moves/loom_tests.rs`.

use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::yield_now;
use crossbeam_utils::CachePadded;
use std::time::Instant;

use crate::stream_ordered::tuning::{IDLE_WINDOW, PATIENCE, WAIT_TIME};

/// The grower's size while no grower is searching ([`Moves::wanted`]).
const NOBODY: usize = usize::MAX;

/// The merges in transit (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Moves {
    /// The epoch: a grower's [`Watch::settle`] ends one.
    epoch: AtomicU64,
    /// Merges begun and not ended, by the parity of the epoch they were counted in.
    in_transit: [AtomicUsize; 2],
    /// The size the searching grower wants ([`NOBODY`]: none searches). Read by every free,
    /// written only by growers: on a cache line of its own.
    wanted: CachePadded<AtomicUsize>,
    /// Since the grower's [`Moves::watch`], a merge or a free landed where its list then fitted
    /// the grower's size (or could not say).
    fit_landed: AtomicBool,
    /// Frees made while a grower watched (fitting or not): the grower's sign of life.
    frees_seen: AtomicU64,
    /// Tests' hooks at the points where threads race (see [`hooks::TestHooks`]).
    #[cfg(test)]
    pub(crate) hooks: hooks::TestHooks,
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
    /// lock was taken.
    pub(crate) fn growth(locked: Instant) -> Self {
        #[cfg(test)]
        if hooks::UNTIMED_GROWTH.get() {
            return Self::new(hooks::UNTIMED_YIELDS, None);
        }
        Self::new(PATIENCE, locked.checked_add(WAIT_TIME))
    }

    /// `left` steps until `deadline` (`None`: only steps count, for the models).
    fn new(left: u32, deadline: Option<Instant>) -> Self {
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
        if self.left == 0 {
            return false;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.left = 0;
            return false;
        }
        self.left -= 1;
        true
    }
}

/// A grower's search, from [`Moves::watch`] to [`Watch::settle`] or the drop.
#[derive(Debug)]
#[must_use = "a search the grower announced; `settle` it after a miss"]
pub(crate) struct Watch<'a> {
    moves: &'a Moves,
}

/// What [`Watch::settle`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// No merge that could have hidden blocks from the search left a fitting block: grow.
    Grow,
    /// A merge left a fitting block (or could not say): search again.
    SearchAgain,
    /// The growth's [`Budget`] ran out (waiting, or before a search again): grow.
    GaveUp,
}

/// A merge in transit, from [`Moves::begin`] until dropped (after the blocks are in a list).
#[derive(Debug)]
#[must_use = "the move ends when the guard is dropped"]
pub(crate) struct MoveGuard<'a> {
    moves: &'a Moves,
    /// The parity of the epoch the merge is counted in.
    slot: usize,
    /// Whether the thief's list may fit the grower's size once the blocks are in: true until
    /// [`MoveGuard::landed`] says otherwise (a merge that ends on an error path could not say).
    fits: bool,
}

impl Moves {
    /// No merge in transit, no grower searching.
    pub(crate) fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            in_transit: [AtomicUsize::new(0), AtomicUsize::new(0)],
            wanted: CachePadded::new(AtomicUsize::new(NOBODY)),
            fit_landed: AtomicBool::new(false),
            frees_seen: AtomicU64::new(0),
            #[cfg(test)]
            hooks: hooks::TestHooks::default(),
        }
    }

    /// A merger's blocks are in transit, no lock held (a test's hook point; nothing otherwise).
    #[inline]
    pub(crate) fn in_transit_point(&self) {
        #[cfg(test)]
        hooks::run(&self.hooks.in_transit);
    }

    /// A merge begins: called before its blocks leave the victim's list. It is counted in the
    /// epoch that is current once the count is up, so a grower that ends an epoch and finds
    /// its count at zero has seen every merge that had begun by then.
    pub(crate) fn begin(&self) -> MoveGuard<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::SeqCst);
            let slot = (epoch & 1) as usize;
            self.in_transit[slot].fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == epoch {
                return MoveGuard {
                    moves: self,
                    slot,
                    fits: true,
                };
            }
            // A grower ended the epoch meanwhile and may have found its count at zero: count
            // the merge in the new one.
            self.in_transit[slot].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A block was freed into a list: called under its lock, after the block went in, with
    /// the list's `fits`; asks it about the searching grower's size, if one searches.
    #[inline]
    pub(crate) fn freed(&self, fits: impl FnOnce(usize) -> bool) {
        if let Some(wanted) = self.wanted() {
            self.frees_seen.fetch_add(1, Ordering::Relaxed);
            if fits(wanted) {
                self.fit_landed.store(true, Ordering::SeqCst);
            }
        }
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
        self.hooks.yielding_point();
        yield_now();
        true
    }

    /// The size the searching grower wants, if one searches.
    #[inline]
    fn wanted(&self) -> Option<usize> {
        let wanted = self.wanted.load(Ordering::SeqCst);
        (wanted != NOBODY).then_some(wanted)
    }

    /// What a grower does once the merges it waits for have landed: search again if a merge or
    /// a free left a fitting block since its watch, else grow.
    fn verdict(&self) -> Settled {
        if self.fit_landed.load(Ordering::SeqCst) {
            Settled::SearchAgain
        } else {
            Settled::Grow
        }
    }

    /// Before a search under the growth lock for `size` bytes (one grower at a time): merges
    /// that land from now on say whether they leave a block of `size` bytes.
    pub(crate) fn watch(&self, size: usize) -> Watch<'_> {
        self.fit_landed.store(false, Ordering::SeqCst);
        self.wanted.store(size, Ordering::SeqCst);
        Watch { moves: self }
    }
}

impl Watch<'_> {
    /// After a search that missed: ends the epoch, waits for the merges counted in it to land
    /// and says whether one of them left a fitting block since the [`Moves::watch`]; after a
    /// real miss, waits for a fitting free (the patience). Every yield, and the search again
    /// it may send the grower to, comes out of `budget`, the growth's: once it ran out, no wait
    /// yields and the grower grows.
    pub(crate) fn settle(self, budget: &mut Budget) -> Settled {
        self.settle_with(budget, IDLE_WINDOW)
    }

    /// [`Watch::settle`] with its idle rule as a parameter (the models set it small).
    fn settle_with(&self, budget: &mut Budget, idle: u32) -> Settled {
        let settled = match self.settle_within(budget) {
            Settled::Grow => self.wait_for_fit(idle, budget),
            other => other,
        };
        // A search again is a step of the budget too.
        if settled == Settled::SearchAgain && !budget.take() {
            return Settled::GaveUp;
        }
        settled
    }

    /// After a real miss: waits (within `budget`) for a free or a merge to leave a fitting
    /// block, and gives up early after `idle` yields with no free at all.
    fn wait_for_fit(&self, idle: u32, budget: &mut Budget) -> Settled {
        let m = self.moves;
        let mut seen = m.frees_seen.load(Ordering::Relaxed);
        for spins in 1u32.. {
            if m.fit_landed.load(Ordering::SeqCst) {
                return Settled::SearchAgain;
            }
            if !m.pause(budget) {
                break;
            }
            if spins % idle == 0 {
                let now = m.frees_seen.load(Ordering::Relaxed);
                if now == seen {
                    // A last look: a free may have landed during the last yield.
                    return m.verdict();
                }
                seen = now;
            }
        }
        Settled::GaveUp
    }

    /// Ends the epoch and waits for its merges to land, giving up when `budget` runs out.
    fn settle_within(&self, budget: &mut Budget) -> Settled {
        let m = self.moves;
        let slot = (m.epoch.fetch_add(1, Ordering::SeqCst) & 1) as usize;
        while m.in_transit[slot].load(Ordering::SeqCst) != 0 {
            #[cfg(test)]
            hooks::run(&m.hooks.unsettled);
            if !m.pause(budget) {
                return Settled::GaveUp;
            }
        }
        // After the wait: a merge sets the flag before its count goes down.
        m.verdict()
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.moves.wanted.store(NOBODY, Ordering::SeqCst);
    }
}

impl MoveGuard<'_> {
    /// The blocks are in the thief's list: called under that list's lock, after they went in,
    /// with the list's `fits`; asks it about the searching grower's size, if one searches.
    pub(crate) fn landed(&mut self, fits: impl FnOnce(usize) -> bool) {
        self.fits = self.moves.wanted().is_some_and(fits);
    }
}

impl Drop for MoveGuard<'_> {
    fn drop(&mut self) {
        // The flag first: a grower that sees the merge out of transit sees it.
        if self.fits {
            self.moves.fit_landed.store(true, Ordering::SeqCst);
        }
        self.moves.in_transit[self.slot].fetch_sub(1, Ordering::SeqCst);
        #[cfg(test)]
        hooks::run(&self.moves.hooks.ended);
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

/// The tests' hooks, and what they read (test code only; the loom models' too).
#[cfg(test)]
pub(crate) mod hooks {
    use std::sync::{Mutex, PoisonError};

    use super::{Budget, Moves};
    use crate::sync::atomic::Ordering;

    /// Steps of a growth budget on a thread that set [`UNTIMED_GROWTH`]: enough for any hook of
    /// a test to run on a loaded machine, still finite so that a broken protocol fails the test.
    pub(super) const UNTIMED_YIELDS: u32 = 1 << 22;

    thread_local! {
        /// Set by a test on its grower's thread: that thread's growth budgets count steps only,
        /// so the test's outcome does not depend on the wall clock (the machine's load).
        pub(crate) static UNTIMED_GROWTH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    impl Budget {
        /// `steps` steps, and no clock (tests and the loom models).
        pub(crate) fn yields(steps: u32) -> Self {
            Self::new(steps, None)
        }

        /// `steps` steps and `time` of wall time from now (tests).
        #[cfg(not(loom))]
        pub(crate) fn with_time(steps: u32, time: std::time::Duration) -> Self {
            Self::new(steps, std::time::Instant::now().checked_add(time))
        }
    }

    impl Moves {
        /// Whether a merge or a free left a fitting block since the grower's watch.
        pub(crate) fn fit_landed(&self) -> bool {
            self.fit_landed.load(Ordering::SeqCst)
        }
    }

    /// A hook a test sets, run once by the next thread that passes its point.
    pub(crate) type Hook = Box<dyn FnOnce() + Send>;

    /// Points where a test can hold a thread to build an interleaving: each hook runs once, on the
    /// thread that passes the point next, with no lock of the core held.
    #[derive(Default)]
    pub(crate) struct TestHooks {
        /// A merger whose blocks are in transit ([`Moves::in_transit_point`]).
        pub(crate) in_transit: Mutex<Option<Hook>>,
        /// A grower whose search missed while merges of its epoch are in transit, before it waits
        /// for them ([`Watch::settle`]); it holds the growth lock.
        pub(crate) unsettled: Mutex<Option<Hook>>,
        /// A merge that just ended.
        pub(crate) ended: Mutex<Option<Hook>>,
        /// Run at every yield of a waiting grower, on its thread, before it yields (not once: it
        /// stays until a test takes it away).
        pub(crate) yielding: Mutex<Option<Box<dyn FnMut() + Send>>>,
    }

    impl std::fmt::Debug for TestHooks {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("TestHooks")
        }
    }

    pub(crate) fn run(hook: &Mutex<Option<Hook>>) {
        let taken = hook.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(f) = taken {
            f();
        }
    }

    impl TestHooks {
        /// A waiting grower is about to yield: runs the `yielding` hook, if set.
        pub(crate) fn yielding_point(&self) {
            if let Some(f) = self
                .yielding
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            {
                f();
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// A budget that never runs out (the tests of the protocol without it).
    fn free() -> Budget {
        Budget::yields(u32::MAX)
    }

    #[test]
    fn a_search_without_merges_grows() {
        let m = Moves::new();
        let w = m.watch(4);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
    }

    #[test]
    fn a_merge_that_left_a_fitting_block_sends_the_grower_back() {
        let m = Moves::new();
        let w = m.watch(4);
        let mut g = m.begin();
        g.landed(|wanted| wanted <= 8);
        drop(g);
        assert_eq!(w.settle(&mut free()), Settled::SearchAgain);
        // The next search starts afresh.
        let w = m.watch(4);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
    }

    #[test]
    fn a_merge_that_left_nothing_fitting_does_not() {
        let m = Moves::new();
        let w = m.watch(16);
        let mut g = m.begin();
        g.landed(|wanted| wanted <= 8);
        drop(g);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
    }

    #[test]
    fn a_merge_that_could_not_say_sends_the_grower_back() {
        let m = Moves::new();
        let w = m.watch(16);
        drop(m.begin());
        assert_eq!(w.settle(&mut free()), Settled::SearchAgain);
    }

    #[test]
    fn without_a_grower_a_merge_asks_nothing() {
        let m = Moves::new();
        let mut g = m.begin();
        g.landed(|_| panic!("nobody searches"));
        drop(g);
        let w = m.watch(16);
        assert_eq!(w.settle(&mut free()), Settled::Grow);
    }

    #[test]
    fn the_grower_waits_for_the_merges_of_its_epoch_only() {
        let m: &'static Moves = Box::leak(Box::new(Moves::new()));
        let early = m.begin();
        let w = m.watch(4);
        // Still in transit: the wait runs out.
        assert_eq!(w.settle_within(&mut Budget::yields(3)), Settled::GaveUp);
        drop(early);
        // While the grower waits, `early2` ends and `late` begins: the grower does not wait
        // for `late` (its victim was searched before it began).
        let early2 = m.begin();
        let late = std::sync::Arc::new(std::sync::Mutex::new(None));
        let keep = std::sync::Arc::clone(&late);
        *m.hooks.unsettled.lock().unwrap() = Some(Box::new(move || {
            *keep.lock().unwrap() = Some(m.begin());
            let mut early2 = early2;
            early2.landed(|_| false);
        }));
        let w = m.watch(4);
        assert_eq!(w.settle_within(&mut Budget::yields(3)), Settled::Grow);
        assert!(late.lock().unwrap().is_some(), "the hook ran");
        // `late` is of the next epoch.
        let w = m.watch(4);
        assert_eq!(w.settle_within(&mut Budget::yields(3)), Settled::GaveUp);
        drop(late.lock().unwrap().take());
        let w = m.watch(4);
        assert_eq!(w.settle_within(&mut Budget::yields(3)), Settled::Grow);
    }

    #[test]
    fn a_grower_waits_for_a_merger_on_another_thread() {
        use std::sync::mpsc;
        let m: &'static Moves = Box::leak(Box::new(Moves::new()));
        let mut g = m.begin();
        let (waiting, grower_waits) = mpsc::channel();
        let (go, wait_go) = mpsc::channel::<()>();
        // The grower, finding the merge in transit, says so and waits until it landed.
        *m.hooks.unsettled.lock().unwrap() = Some(Box::new(move || {
            waiting.send(()).unwrap();
            wait_go.recv().unwrap();
        }));
        let w = m.watch(4);
        std::thread::scope(|s| {
            let grower = s.spawn(move || w.settle(&mut free()));
            grower_waits.recv().unwrap();
            g.landed(|wanted| wanted == 4);
            drop(g);
            go.send(()).unwrap();
            assert_eq!(grower.join().unwrap(), Settled::SearchAgain);
        });
    }

    #[test]
    fn a_free_that_leaves_a_fitting_block_sends_the_grower_back() {
        let m = Moves::new();
        let w = m.watch(4);
        m.freed(|wanted| wanted <= 2);
        assert!(!m.fit_landed.load(Ordering::SeqCst), "2 bytes do not fit 4");
        m.freed(|wanted| wanted <= 8);
        assert_eq!(w.settle(&mut free()), Settled::SearchAgain);
        // Without a grower a free asks nothing.
        m.freed(|_| panic!("nobody searches"));
    }

    #[test]
    fn a_grower_waits_for_a_fitting_free_on_another_thread() {
        let m = Moves::new();
        let w = m.watch(4);
        std::thread::scope(|s| {
            // No limit and no idle rule: it returns only once the free landed.
            let grower = s.spawn(|| w.wait_for_fit(u32::MAX, &mut free()));
            for _ in 0..3 {
                m.freed(|_| false);
            }
            m.freed(|wanted| wanted == 4);
            assert_eq!(grower.join().unwrap(), Settled::SearchAgain);
        });
    }

    #[test]
    fn a_grower_stops_waiting_when_nothing_is_freed() {
        let m = Moves::new();
        let w = m.watch(4);
        // Without the idle rule this would yield u32::MAX times.
        assert_eq!(w.wait_for_fit(4, &mut free()), Settled::Grow);
    }

    /// One budget for all the settles of a growth, searches again included: a grower whose
    /// searches keep missing a fitting block that frees report (another thread takes each
    /// first) takes `PATIENCE` steps in all, yields and searches again together, not per
    /// settle, and then grows.
    #[test]
    fn the_budget_spans_every_settle_of_a_growth() {
        let m: &'static Moves = Box::leak(Box::new(Moves::new()));
        let yields = std::sync::Arc::new(AtomicU64::new(0));
        let y = std::sync::Arc::clone(&yields);
        // Frees all along, every 100th fitting.
        *m.hooks.yielding.lock().unwrap() = Some(Box::new(move || {
            let n = y.fetch_add(1, Ordering::Relaxed) + 1;
            m.freed(|_| n % 100 == 0);
        }));
        let mut budget = Budget::yields(PATIENCE);
        let mut again = 0;
        loop {
            let w = m.watch(4);
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
        let w = m.watch(4);
        m.freed(|_| true);
        assert_eq!(w.settle(&mut budget), Settled::GaveUp);
        assert_eq!(u64::from(budget.spent()), yields);
    }

    /// The wall-clock side of the budget: yields that take a millisecond each (an
    /// oversubscribed host) stop the wait after about `time`, frees or not.
    #[test]
    fn the_clock_ends_the_wait() {
        let m: &'static Moves = Box::leak(Box::new(Moves::new()));
        *m.hooks.yielding.lock().unwrap() = Some(Box::new(move || {
            std::thread::sleep(Duration::from_millis(1));
            m.freed(|_| false);
        }));
        let mut budget = Budget::with_time(1000, Duration::from_millis(5));
        let w = m.watch(4);
        // No idle rule, and 1,000 steps: only the clock stops it sooner.
        assert_eq!(w.wait_for_fit(u32::MAX, &mut budget), Settled::GaveUp);
        assert!(budget.ran_out());
        assert!(budget.spent() <= 5, "{} yields", budget.spent());
    }

    #[test]
    fn concurrent_moves_all_end() {
        let m = Moves::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        let mut g = m.begin();
                        g.landed(|_| false);
                    }
                });
            }
            for _ in 0..100 {
                let w = m.watch(1);
                let _ = w.settle(&mut free());
            }
        });
        assert_eq!(m.in_transit[0].load(Ordering::SeqCst), 0);
        assert_eq!(m.in_transit[1].load(Ordering::SeqCst), 0);
    }

    /// An operation of the model: begin a move, land the oldest move in transit (fitting the
    /// grower's size or not), end it, watch, or settle (with a wait that runs out at once).
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Begin,
        Land(bool),
        End,
        Watch,
        Settle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Begin),
            any::<bool>().prop_map(Op::Land),
            Just(Op::End),
            Just(Op::Watch),
            Just(Op::Settle),
        ]
    }

    proptest! {
        /// Against a model that keeps each move's epoch and whether it said it fits: a settle
        /// gives up while a move counted in an epoch of the ended one's parity is in transit,
        /// else sends the grower back exactly when a move that fitted (or never said) ended
        /// since the watch.
        #[test]
        fn settle_matches_the_model(ops in proptest::collection::vec(op(), 0..64)) {
            let m = Moves::new();
            // (guard, epoch, fits)
            let mut guards = std::collections::VecDeque::new();
            let mut epoch = 0u64;
            let mut watch: Option<(Watch<'_>, bool)> = None;
            for op in ops {
                match op {
                    Op::Begin => guards.push_back((m.begin(), epoch, true)),
                    Op::Land(fits) => {
                        if let Some((g, _, f)) = guards.front_mut() {
                            let watching = watch.is_some();
                            g.landed(|_| fits);
                            *f = watching && fits;
                        }
                    }
                    Op::End => {
                        if let Some((g, _, fits)) = guards.pop_front() {
                            drop(g);
                            if let Some((_, fit)) = &mut watch {
                                *fit |= fits;
                            }
                        }
                    }
                    Op::Watch => {
                        drop(watch.take());
                        watch = Some((m.watch(1), false));
                    }
                    Op::Settle => {
                        if let Some((w, fit)) = watch.take() {
                            let busy = guards.iter().any(|(_, e, _)| e % 2 == epoch % 2);
                            let want = if busy {
                                Settled::GaveUp
                            } else if fit {
                                Settled::SearchAgain
                            } else {
                                Settled::Grow
                            };
                            epoch += 1;
                            prop_assert_eq!(w.settle_within(&mut Budget::yields(0)), want);
                        }
                    }
                }
            }
        }
    }
}
