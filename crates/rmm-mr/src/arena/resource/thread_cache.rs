//! Per-thread state of the arena resource: which thread this is, a small cache from
//! `(resource, stream key)` to the arena it uses (so the hot path takes no shared lock), and the
//! guards that hand a thread's per-thread arena back to the global arena when the thread exits.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::key::ArenaKey;
use super::ArenaCell;

/// Entries kept per thread; the oldest is evicted beyond this.
const CACHE_CAPACITY: usize = 8;

struct CacheEntry {
    resource: u64,
    key: ArenaKey,
    cell: Arc<ArenaCell>,
}

/// Hands a thread's per-thread arena back when the thread exits (RMM's `arena_cleaner`).
///
/// It holds the resource weakly, so a thread that outlives the resource does nothing at exit,
/// and a thread exit never keeps a dropped resource alive.
struct ThreadArenaGuard {
    owner: Weak<dyn ThreadExit>,
    cell: Arc<ArenaCell>,
}

impl ThreadArenaGuard {
    /// Whether dropping the guard has nothing left to do.
    fn is_spent(&self) -> bool {
        self.cell.is_retired() || self.owner.strong_count() == 0
    }
}

impl Drop for ThreadArenaGuard {
    fn drop(&mut self) {
        if self.cell.is_retired() {
            return;
        }
        if let Some(owner) = self.owner.upgrade() {
            owner.thread_exited(&self.cell);
        }
    }
}

/// What a resource does when a thread that has a per-thread arena in it exits.
pub(super) trait ThreadExit: Send + Sync {
    /// Return the superblocks of `cell` (the exiting thread's arena) to the global arena.
    /// Runs on the exiting thread, which holds no lock of the resource.
    fn thread_exited(&self, cell: &Arc<ArenaCell>);
}

thread_local! {
    static CACHE: RefCell<Vec<CacheEntry>> = const { RefCell::new(Vec::new()) };
    static GUARDS: RefCell<Vec<ThreadArenaGuard>> = const { RefCell::new(Vec::new()) };
}

/// The arena this thread last used for `key` in resource `resource`, if cached.
#[inline]
pub(super) fn cached(resource: u64, key: ArenaKey) -> Option<Arc<ArenaCell>> {
    CACHE
        .try_with(|cache| {
            cache
                .borrow()
                .iter()
                .rev()
                .find(|e| e.resource == resource && e.key == key)
                .map(|e| Arc::clone(&e.cell))
        })
        .ok()
        .flatten()
}

/// Caches `cell` as this thread's arena for `key` in resource `resource`.
pub(super) fn remember(resource: u64, key: ArenaKey, cell: &Arc<ArenaCell>) {
    let evicted = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        let mut evicted = Vec::new();
        if let Some(pos) = cache
            .iter()
            .position(|e| e.resource == resource && e.key == key)
        {
            evicted.push(cache.remove(pos));
        }
        if cache.len() >= CACHE_CAPACITY {
            evicted.push(cache.remove(0));
        }
        cache.push(CacheEntry {
            resource,
            key,
            cell: Arc::clone(cell),
        });
        evicted
    });
    // Dropped outside the borrow.
    drop(evicted);
}

/// Forgets this thread's cached arena for `key` in resource `resource`.
pub(super) fn forget(resource: u64, key: ArenaKey) {
    let removed = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        cache
            .iter()
            .position(|e| e.resource == resource && e.key == key)
            .map(|pos| cache.remove(pos))
    });
    drop(removed);
}

/// Arranges for `owner.thread_exited(cell)` to run when the calling thread exits. Returns
/// `false` when the thread is already tearing down its thread-local storage (the arena is then
/// reclaimed by the next defragmentation instead).
pub(super) fn register_thread_arena(owner: Weak<dyn ThreadExit>, cell: Arc<ArenaCell>) -> bool {
    let spent = GUARDS.try_with(|guards| {
        let mut guards = guards.borrow_mut();
        let (spent, live): (Vec<_>, Vec<_>) =
            guards.drain(..).partition(ThreadArenaGuard::is_spent);
        *guards = live;
        guards.push(ThreadArenaGuard { owner, cell });
        spent
    });
    match spent {
        Ok(spent) => {
            // Dropped outside the borrow (they have nothing left to do).
            drop(spent);
            true
        }
        Err(_) => false,
    }
}
