//! The synchronization primitives of the lock-free parts (the statistics shards and their freeze
//! handshake, the limiting adaptor's release totals, the thread slots, the fixed-size block
//! table, the stream lists' locks), in one place: the standard library's in normal builds (the
//! mutex: `parking_lot`'s), [loom](https://docs.rs/loom)'s checked versions under `--cfg loom`,
//! where the models
//! (`loom_tests` modules, run by `cargo xtask loom`) explore their interleavings.
//!
//! Loom checks `SeqCst` *accesses* only as acquire/release (its documented limit), which would
//! make every Dekker-style handshake of this crate fail spuriously; under loom the atomics here
//! therefore put a `fence(SeqCst)` before every `SeqCst` load and after every `SeqCst` store
//! (around every `SeqCst` read-modify-write), which loom does check. See
//! `docs/internals/loom.md`.

// The mutex of the hot paths (the stream lists, the fixed-size ledger, the statistics'
// counters): `parking_lot`'s, whose lock and unlock fast paths are one inlined atomic each and
// which has no poisoning (these locks ignored poisoning anyway: every critical section leaves
// its state consistent before anything in it can panic). `lock()` returns the guard itself.
#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread_local;

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(loom)]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

/// Loom's mutex with `parking_lot`'s interface (`lock()` returns the guard, poisoning
/// ignored), so the code above it is the same in both builds.
#[cfg(loom)]
mod loom_mutex {
    use std::sync::PoisonError;

    pub(crate) use loom::sync::MutexGuard;

    /// [`loom::sync::Mutex`], locked as `parking_lot::Mutex` is.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    #[allow(dead_code)]
    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Self(loom::sync::Mutex::new(v))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }
}

/// Atomics and fences (see the [module docs](self)).
#[cfg(not(loom))]
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering,
    };
}

/// Atomics and fences (see the [module docs](self)): loom's, with `SeqCst` accesses fenced.
#[cfg(loom)]
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::{fence, Ordering};

    /// What loom lacks for `order`: a `SeqCst` fence, where `order` is `SeqCst`.
    #[inline]
    fn seq_cst_fence(order: Ordering) {
        if order == Ordering::SeqCst {
            fence(Ordering::SeqCst);
        }
    }

    /// `SeqCst` if either is.
    #[inline]
    fn strongest(a: Ordering, b: Ordering) -> Ordering {
        if a == Ordering::SeqCst || b == Ordering::SeqCst {
            Ordering::SeqCst
        } else {
            a
        }
    }

    macro_rules! checked_atomic {
        ($name:ident, $t:ty) => {
            /// Loom's atomic of the same name, with `SeqCst` accesses fenced.
            #[derive(Debug, Default)]
            pub(crate) struct $name(loom::sync::atomic::$name);

            #[allow(dead_code)]
            impl $name {
                pub(crate) fn new(v: $t) -> Self {
                    Self(loom::sync::atomic::$name::new(v))
                }

                pub(crate) fn load(&self, order: Ordering) -> $t {
                    seq_cst_fence(order);
                    self.0.load(order)
                }

                pub(crate) fn store(&self, v: $t, order: Ordering) {
                    self.0.store(v, order);
                    seq_cst_fence(order);
                }

                pub(crate) fn swap(&self, v: $t, order: Ordering) -> $t {
                    seq_cst_fence(order);
                    let old = self.0.swap(v, order);
                    seq_cst_fence(order);
                    old
                }

                pub(crate) fn compare_exchange(
                    &self,
                    current: $t,
                    new: $t,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$t, $t> {
                    seq_cst_fence(strongest(success, failure));
                    let r = self.0.compare_exchange(current, new, success, failure);
                    seq_cst_fence(if r.is_ok() { success } else { failure });
                    r
                }

                pub(crate) fn compare_exchange_weak(
                    &self,
                    current: $t,
                    new: $t,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$t, $t> {
                    seq_cst_fence(strongest(success, failure));
                    let r = self.0.compare_exchange_weak(current, new, success, failure);
                    seq_cst_fence(if r.is_ok() { success } else { failure });
                    r
                }

                pub(crate) fn fetch_update<F>(
                    &self,
                    set: Ordering,
                    fetch: Ordering,
                    f: F,
                ) -> Result<$t, $t>
                where
                    F: FnMut($t) -> Option<$t>,
                {
                    seq_cst_fence(strongest(set, fetch));
                    let r = self.0.fetch_update(set, fetch, f);
                    seq_cst_fence(if r.is_ok() { set } else { fetch });
                    r
                }
            }
        };
        ($name:ident, $t:ty, $($op:ident),*) => {
            checked_atomic!($name, $t);

            #[allow(dead_code)]
            impl $name {
                $(
                    pub(crate) fn $op(&self, v: $t, order: Ordering) -> $t {
                        seq_cst_fence(order);
                        let old = self.0.$op(v, order);
                        seq_cst_fence(order);
                        old
                    }
                )*
            }
        };
    }

    checked_atomic!(AtomicBool, bool, fetch_and, fetch_or);
    checked_atomic!(AtomicI64, i64, fetch_add, fetch_sub, fetch_and, fetch_or, fetch_max);
    checked_atomic!(AtomicU64, u64, fetch_add, fetch_sub, fetch_and, fetch_or, fetch_max);
    checked_atomic!(
        AtomicUsize,
        usize,
        fetch_add,
        fetch_sub,
        fetch_and,
        fetch_or,
        fetch_max
    );
}

/// A hint inside a spin loop; under loom a yield, so that the model lets the awaited thread
/// run.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Gives up the rest of the time slice (under loom: lets another thread of the model run).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Runs loom model `name` (a test's closure, run once per interleaving) with the preemption
/// bound `LOOM_MAX_PREEMPTIONS` (2 when unset), and prints how many interleavings it explored
/// (`cargo xtask loom` collects these lines).
#[cfg(all(test, loom))]
pub(crate) fn model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    model_preempting(name, 0, f);
}

/// [`model`] with a preemption bound of at least `at_least`, for a model whose race needs more
/// preemptions than CI's bound (and that is small enough to afford them).
#[cfg(all(test, loom))]
pub(crate) fn model_preempting<F>(name: &str, at_least: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(2).max(at_least));
    let bound = builder.preemption_bound.unwrap_or(0);
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} interleavings explored (preemption bound {bound})",
        runs.load(Ordering::Relaxed)
    );
}

/// What a loom model's interleavings reached: how many reached each of `N` named outcomes
/// (counted outside the model). [`check`](Self::check) fails for an outcome never reached, so
/// a model that stops exploring what it is there for fails too.
#[cfg(all(test, loom))]
pub(crate) struct Seen<const N: usize> {
    names: [&'static str; N],
    counts: [std::sync::atomic::AtomicU64; N],
}

#[cfg(all(test, loom))]
impl<const N: usize> Seen<N> {
    /// No outcome reached yet.
    pub(crate) const fn new(names: [&'static str; N]) -> Self {
        Self {
            names,
            counts: [const { std::sync::atomic::AtomicU64::new(0) }; N],
        }
    }

    /// An interleaving reached outcome `i`.
    pub(crate) fn saw(&self, i: usize) {
        self.counts[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fails unless every outcome was reached.
    pub(crate) fn check(&self) {
        for (name, count) in self.names.iter().zip(&self.counts) {
            let count = count.load(std::sync::atomic::Ordering::Relaxed);
            assert!(count > 0, "no interleaving reached: {name}");
        }
    }
}
