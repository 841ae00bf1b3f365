//! Blocks in transit between free lists: a thief that merges another stream's whole list into
//! its own takes the blocks out under the victim's lock and puts them into its own list under
//! that list's lock, so between the two they are in no list. A thread that searched every list
//! under the growth lock and found nothing may have missed them there, or missed blocks that
//! moved from a list it had not visited yet to one it had, and then grows: without a maximum
//! the pool at least doubles, for memory that was free all along. RMM makes every move under
//! its one mutex and never races so.
//!
//! [`Moves`] counts the merges made outside the growth lock: [`Moves::begin`] before the blocks
//! leave the victim's list, the guard's drop after they are in the thief's. The grower takes a
//! [`MovesSnapshot`] before its search and, when the search missed, grows only if
//! [`Moves::settled_since`] says that no merge was in transit and none ended meanwhile; else it
//! searches again (a bounded number of times, [`SETTLE_TRIES`]; then it grows, as before).
//! Pure bookkeeping: no CUDA calls. Why and the figures: `docs/performance.md`, "Memory:
//! blocks in transit".

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(test)]
use std::sync::Mutex;

/// How many times a grower searches again for blocks in transit before it grows anyway (a
/// merging thread the scheduler preempted between its two locks could hold it back longer).
pub(crate) const SETTLE_TRIES: u32 = 64;

/// The merges in transit and ended (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Moves {
    /// Merges begun and not ended.
    in_transit: AtomicUsize,
    /// Merges ended, ever.
    ended: AtomicU64,
    /// Tests' hooks at the points where threads race (see [`TestHooks`]).
    #[cfg(test)]
    pub(crate) hooks: TestHooks,
}

/// A hook a test sets, run once by the next thread that passes its point.
#[cfg(test)]
pub(crate) type Hook = Box<dyn FnOnce() + Send>;

/// Points where a test can hold a thread to build an interleaving: each hook runs once, on the
/// thread that passes the point next, with no lock of the core held.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct TestHooks {
    /// A merger whose blocks are in transit ([`Moves::in_transit_point`]).
    pub(crate) in_transit: Mutex<Option<Hook>>,
    /// A grower whose search missed while moves were unsettled, before it searches again
    /// ([`Moves::unsettled_point`]); it holds the growth lock.
    pub(crate) unsettled: Mutex<Option<Hook>>,
    /// A merge that just ended.
    pub(crate) ended: Mutex<Option<Hook>>,
}

#[cfg(test)]
impl std::fmt::Debug for TestHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestHooks")
    }
}

#[cfg(test)]
fn run(hook: &Mutex<Option<Hook>>) {
    let taken = hook
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(f) = taken {
        f();
    }
}

/// What [`Moves`] had seen end when a search began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MovesSnapshot {
    ended: u64,
}

/// A merge in transit, from [`Moves::begin`] until dropped (after the blocks are in a list).
#[derive(Debug)]
#[must_use = "the move ends when the guard is dropped"]
pub(crate) struct MoveGuard<'a> {
    moves: &'a Moves,
}

impl Moves {
    /// No merge in transit, none ended.
    pub(crate) const fn new() -> Self {
        Self {
            in_transit: AtomicUsize::new(0),
            ended: AtomicU64::new(0),
            #[cfg(test)]
            hooks: TestHooks {
                in_transit: Mutex::new(None),
                unsettled: Mutex::new(None),
                ended: Mutex::new(None),
            },
        }
    }

    /// A merger's blocks are in transit, no lock held (a test's hook point; nothing otherwise).
    #[inline]
    pub(crate) fn in_transit_point(&self) {
        #[cfg(test)]
        run(&self.hooks.in_transit);
    }

    /// A grower's search missed while moves were unsettled (a test's hook point; nothing
    /// otherwise).
    #[inline]
    pub(crate) fn unsettled_point(&self) {
        #[cfg(test)]
        run(&self.hooks.unsettled);
    }

    /// A merge begins: called before its blocks leave the victim's list.
    pub(crate) fn begin(&self) -> MoveGuard<'_> {
        self.in_transit.fetch_add(1, Ordering::SeqCst);
        MoveGuard { moves: self }
    }

    /// Taken before a search of the lists.
    pub(crate) fn snapshot(&self) -> MovesSnapshot {
        MovesSnapshot {
            ended: self.ended.load(Ordering::SeqCst),
        }
    }

    /// Whether no merge is in transit now and none ended since `since`: then a search made
    /// after `since` saw every block that was in a list at its start and stayed free.
    pub(crate) fn settled_since(&self, since: MovesSnapshot) -> bool {
        // In this order: a merge that ended after the first load raised `ended` before it
        // left `in_transit` (see `drop`), so the second load sees it.
        self.in_transit.load(Ordering::SeqCst) == 0
            && self.ended.load(Ordering::SeqCst) == since.ended
    }
}

impl Drop for MoveGuard<'_> {
    fn drop(&mut self) {
        // `ended` first: a grower that sees the merge out of transit sees it ended.
        self.moves.ended.fetch_add(1, Ordering::SeqCst);
        self.moves.in_transit.fetch_sub(1, Ordering::SeqCst);
        #[cfg(test)]
        run(&self.moves.hooks.ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn settled_without_moves() {
        let m = Moves::new();
        let s = m.snapshot();
        assert!(m.settled_since(s));
    }

    #[test]
    fn a_move_in_transit_unsettles() {
        let m = Moves::new();
        let s = m.snapshot();
        let g = m.begin();
        assert!(!m.settled_since(s));
        drop(g);
        // It ended after the snapshot: the search may have missed its blocks.
        assert!(!m.settled_since(s));
        // A search begun after it sees them.
        assert!(m.settled_since(m.snapshot()));
    }

    #[test]
    fn a_move_begun_before_the_snapshot_unsettles_until_it_ends() {
        let m = Moves::new();
        let g = m.begin();
        let s = m.snapshot();
        assert!(!m.settled_since(s));
        drop(g);
        assert!(!m.settled_since(s));
        assert!(m.settled_since(m.snapshot()));
    }

    #[test]
    fn concurrent_moves_all_end() {
        let m = Moves::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        let _g = m.begin();
                    }
                });
            }
        });
        let snap = m.snapshot();
        assert_eq!(snap.ended, 4000);
        assert!(m.settled_since(snap));
    }

    /// An operation of the model: begin a move, end the oldest move in transit, take a
    /// snapshot, or check the last snapshot.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Begin,
        End,
        Snapshot,
        Check,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Begin),
            Just(Op::End),
            Just(Op::Snapshot),
            Just(Op::Check)
        ]
    }

    proptest! {
        /// Against a model that remembers, for the last snapshot, whether a move was in
        /// transit at it or began after it: settled exactly when none was, and none is now.
        #[test]
        fn settled_matches_the_model(ops in proptest::collection::vec(op(), 0..64)) {
            let m = Moves::new();
            let mut guards = std::collections::VecDeque::new();
            // (snapshot, a move was in transit at it or began after it)
            let mut snap: Option<(MovesSnapshot, bool)> = None;
            for op in ops {
                match op {
                    Op::Begin => {
                        guards.push_back(m.begin());
                        if let Some((_, touched)) = &mut snap {
                            *touched = true;
                        }
                    }
                    Op::End => drop(guards.pop_front()),
                    Op::Snapshot => snap = Some((m.snapshot(), !guards.is_empty())),
                    Op::Check => {
                        if let Some((s, touched)) = snap {
                            prop_assert_eq!(m.settled_since(s), !touched && guards.is_empty());
                        }
                    }
                }
            }
        }
    }
}
