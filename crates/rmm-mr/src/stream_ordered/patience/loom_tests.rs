//! Loom models of the grower's patience (`cargo xtask loom`). The first two: a thief merges
//! the free blocks of list `b` into list `a`, out under `b`'s lock and in under `a`'s, as the
//! core's thieves do,
//! while a grower searches `a` and then `b` (the order in which a merge can hide blocks from
//! it) and, after a miss, settles. On every interleaving: a grower that missed a fitting block
//! is sent back and then finds it, and one whose miss was real is told to grow. The last three
//! check the wait after a real miss with the frees that report to it, and the growth's budget
//! that bounds every wait.

use loom::sync::{Arc, Mutex};
use loom::thread;

use super::{Budget, Patience, Settled};
use crate::sync::Seen;

/// Whether `list` holds a block of at least `size` bytes.
fn fits(list: &[usize], size: usize) -> bool {
    list.iter().any(|&b| b >= size)
}

/// One interleaving: one free block of `block` bytes in `b`, merged into `a` by a thief, and a
/// grower asking `wanted` bytes; returns the grower's searches: whether each found a block or
/// what it settled on.
fn merge_while_searching(block: usize, wanted: usize) -> Vec<Result<(), Settled>> {
    let patience = Arc::new(Patience::new());
    let a = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::new(Mutex::new(vec![block]));
    let thief = {
        let (patience, a, b) = (Arc::clone(&patience), Arc::clone(&a), Arc::clone(&b));
        thread::spawn(move || {
            // Out under the victim's lock, in under its own (the core's order).
            let mut moved = std::mem::take(&mut *b.lock().unwrap());
            let mut mine = a.lock().unwrap();
            mine.append(&mut moved);
            patience.merged(|wanted| fits(&mine, wanted));
        })
    };
    let searches = grower(&patience, wanted, &mut Budget::new(ENOUGH, None), 2, || {
        // One list at a time: `a`'s lock is let go before `b`'s is taken.
        let in_a = fits(&a.lock().unwrap(), wanted);
        in_a || fits(&b.lock().unwrap(), wanted)
    });
    thief.join().unwrap();
    searches
}

/// A grower asking `wanted` bytes: announces its size, runs `search` and, after each miss,
/// settles with what is left of `budget` and the idle rule `idle`, searching again at most
/// twice. Returns its searches: whether each found a block or what it settled on.
fn grower(
    patience: &Patience,
    wanted: usize,
    budget: &mut Budget,
    idle: u32,
    search: impl Fn() -> bool,
) -> Vec<Result<(), Settled>> {
    let mut searches = Vec::new();
    for _ in 0..3 {
        let watch = patience.watch(wanted);
        if search() {
            searches.push(Ok(()));
            break;
        }
        let settled = watch.settle_with(budget, idle);
        searches.push(Err(settled));
        if settled != Settled::SearchAgain {
            break;
        }
    }
    searches
}

#[test]
fn loom_a_grower_finds_the_block_a_merge_hid() {
    static SEEN: Seen<2> = Seen::new(["found at once", "missed behind a merge, sent back, found"]);
    crate::sync::model(
        "loom_a_grower_finds_the_block_a_merge_hid",
        || match merge_while_searching(8, 8).as_slice() {
            [Ok(())] => SEEN.saw(0),
            [Err(Settled::SearchAgain), Ok(())] => SEEN.saw(1),
            other => panic!("the grower's searches: {other:?}"),
        },
    );
    SEEN.check();
}

#[test]
fn loom_a_grower_is_not_sent_back_for_blocks_that_do_not_fit() {
    crate::sync::model(
        "loom_a_grower_is_not_sent_back_for_blocks_that_do_not_fit",
        || {
            assert_eq!(
                merge_while_searching(4, 8),
                [Err(Settled::Grow)],
                "the grower's searches"
            );
        },
    );
}

/// The patience protocol with the frees that report to it (`Patience::freed`, `Watch::settle`'s
/// wait for a fit, the growth's [`Budget`]): a grower announces `wanted` bytes, searches list
/// `a` (empty at first) and, after each miss, settles with what is left of one budget of
/// `budget` steps and its idle rule `idle` ([`grower`]); a freeing thread puts `blocks` into
/// `a` one by one, each under `a`'s lock and reported there, as the core's frees are. Returns the grower's searches and the budget it
/// was left with.
fn wait_for_frees(
    blocks: &'static [usize],
    wanted: usize,
    budget: u32,
    idle: u32,
) -> (Vec<Result<(), Settled>>, Budget) {
    let patience = Arc::new(Patience::new());
    let a = Arc::new(Mutex::new(Vec::new()));
    let freer = {
        let (patience, a) = (Arc::clone(&patience), Arc::clone(&a));
        thread::spawn(move || {
            for &block in blocks {
                let mut list = a.lock().unwrap();
                list.push(block);
                patience.freed(|wanted| fits(&list, wanted));
            }
        })
    };
    let grows = thread::spawn(move || {
        let mut left = Budget::new(budget, None);
        let searches = grower(&patience, wanted, &mut left, idle, || {
            fits(&a.lock().unwrap(), wanted)
        });
        (searches, left)
    });
    freer.join().unwrap();
    grows.join().unwrap()
}

/// Enough yields for the freeing thread's few steps (a yielding thread runs again only after
/// another one made a step): the grower never runs out while a fitting free is on its way.
const ENOUGH: u32 = 24;

#[test]
fn loom_a_waiting_grower_sees_a_fitting_free() {
    static SEEN: Seen<2> = Seen::new(["found at once", "missed, waited, sent back, found"]);
    crate::sync::model("loom_a_waiting_grower_sees_a_fitting_free", || {
        // A block too small first (a sign of life, no fit), then one that fits; no idle rule.
        let (searches, left) = wait_for_frees(&[4, 16], 8, ENOUGH, ENOUGH);
        assert!(left.spent() <= ENOUGH);
        match searches.as_slice() {
            [Ok(())] => SEEN.saw(0),
            [Err(Settled::SearchAgain), Ok(())] => SEEN.saw(1),
            other => panic!("a fitting free was missed: {other:?}"),
        }
    });
    SEEN.check();
}

#[test]
fn loom_frees_that_do_not_fit_let_the_grower_grow_early() {
    static SEEN: Seen<2> = Seen::new(["the free came while it waited", "no free while it waited"]);
    crate::sync::model(
        "loom_frees_that_do_not_fit_let_the_grower_grow_early",
        || {
            let (searches, left) = wait_for_frees(&[4], 8, ENOUGH, 2);
            assert_eq!(searches, [Err(Settled::Grow)], "the grower's searches");
            // The idle rule ended the wait, not the budget.
            assert!(!left.ran_out(), "{} yields", left.spent());
            SEEN.saw(usize::from(left.spent() <= 2));
        },
    );
    SEEN.check();
}

#[test]
fn loom_the_budget_ends_the_wait() {
    static SEEN: Seen<3> = Seen::new([
        "found at once",
        "sent back within the budget, found",
        "grew when the budget ran out",
    ]);
    crate::sync::model("loom_the_budget_ends_the_wait", || {
        // One step in all: the grower may grow before the fitting free comes (or before it can
        // search again), never with budget left.
        let (searches, left) = wait_for_frees(&[16], 8, 1, ENOUGH);
        assert!(left.spent() <= 1);
        match searches.as_slice() {
            [Ok(())] => SEEN.saw(0),
            [Err(Settled::SearchAgain), Ok(())] => SEEN.saw(1),
            [Err(Settled::GaveUp)] if left.ran_out() => SEEN.saw(2),
            other => panic!("the grower's searches: {other:?}, {left:?}"),
        }
    });
    SEEN.check();
}
