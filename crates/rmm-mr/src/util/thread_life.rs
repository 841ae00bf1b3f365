//! Whether a host thread is still alive, for state the resources keep per thread (the
//! per-thread free lists of the stream-ordered core): a [`ThreadLife`] taken on a thread answers
//! later, from any thread, whether that thread has exited, and [`exits`] counts exits, so a
//! holder of many lives rechecks them only after the count moved.
//!
//! [`thread_number`] numbers threads (the stream-ordered core's per-thread default stream keys,
//! the driver pool's cross-thread rule, the logging adaptor's `Thread` column).
//!
//! A thread-local guard makes the thread's life on first use and ends it in its destructor
//! (during thread-local teardown, before the thread is gone). Nothing here panics during
//! teardown: a thread that asks after its guard was destroyed gets a life that is already over.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Threads whose guard was destroyed so far.
static EXITS: AtomicU64 = AtomicU64::new(0);

/// The liveness of one host thread. Cheap to clone; holding it keeps nothing alive.
#[derive(Debug, Clone)]
pub(crate) struct ThreadLife(Weak<()>);

impl ThreadLife {
    /// `false` once the thread has begun its thread-local teardown.
    pub(crate) fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// The thread-local half: alive while the thread is.
struct Guard(Option<Arc<()>>);

impl Drop for Guard {
    fn drop(&mut self) {
        // Dead first, then counted: whoever sees the new count sees the life gone.
        drop(self.0.take());
        EXITS.fetch_add(1, Ordering::Release);
    }
}

thread_local! {
    static GUARD: Guard = Guard(Some(Arc::new(())));
}

/// The calling thread's life (made on first use). During thread-local teardown, a life that is
/// already over.
pub(crate) fn current() -> ThreadLife {
    GUARD
        .try_with(|g| g.0.as_ref().map_or_else(Weak::new, Arc::downgrade))
        .map_or_else(|_| ThreadLife(Weak::new()), ThreadLife)
}

/// How many threads that took a life have exited so far.
pub(crate) fn exits() -> u64 {
    EXITS.load(Ordering::Acquire)
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number, 0 until assigned. Constant-initialized and without a destructor:
    /// reading it is one thread-local load, and it stays readable during thread-local teardown.
    static THREAD_NUMBER: Cell<u64> = const { Cell::new(0) };
}

/// A process-unique number of the calling thread (never reused, never 0), assigned on first
/// use: 1, 2, 3, ... in order of first call.
#[inline]
pub(crate) fn thread_number() -> u64 {
    match THREAD_NUMBER.try_with(Cell::get) {
        Ok(n) if n != 0 => n,
        _ => assign_thread_number(),
    }
}

#[cold]
#[inline(never)]
fn assign_thread_number() -> u64 {
    let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    // Cannot fail (no destructor); if it did, the caller would get a fresh number each time:
    // for the core, lists of its own, correct (per-thread lists record at steal time) but
    // unshared.
    let _ = THREAD_NUMBER.try_with(|c| c.set(n));
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_life_ends_with_its_thread() {
        let here = current();
        assert!(here.is_alive());
        let before = exits();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(current()).unwrap();
            go_rx.recv().unwrap();
        });
        let there = rx.recv().unwrap();
        assert!(there.is_alive(), "ended before its thread");
        go_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(!there.is_alive(), "outlived its thread");
        assert!(exits() > before);
        assert!(here.is_alive());
    }

    #[test]
    fn a_life_asked_for_during_teardown_is_over() {
        struct Late(std::sync::mpsc::Sender<bool>);
        impl Drop for Late {
            fn drop(&mut self) {
                let _ = self.0.send(current().is_alive());
            }
        }
        thread_local! {
            static LATE: std::cell::RefCell<Option<Late>> = const { std::cell::RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Registered before the guard, so destroyed after it (destructors run in reverse).
            LATE.with(|l| *l.borrow_mut() = Some(Late(tx)));
            assert!(current().is_alive());
        })
        .join()
        .unwrap();
        assert!(
            !rx.recv().unwrap(),
            "a life handed out during teardown was alive"
        );
    }
}
