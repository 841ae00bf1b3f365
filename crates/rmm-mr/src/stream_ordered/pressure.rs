//! Growth under pressure: when the stream-ordered core must grow although another stream's list
//! holds a block that fits, only because no event covers that block yet (the lazy event rule,
//! [`crate::stream_ordered::event_policy`], asked its owner to record), the memory exists and
//! becomes stealable at the owner's next operation. Such a growth takes only what the request
//! needs ([`GrowthCause::Pressure`]) instead of the resource's own rule (the pool's
//! `size_to_grow` at least doubles it), so one missed steal costs the request, not the
//! reservation.
//!
//! A resource over a stream-ordered resource (a binning resource's fixed-size bins over the
//! pool) grows by allocating from it: while a core's growth under pressure runs
//! ([`PressureScope`]), growths of the cores beneath it on the same thread count as under
//! pressure too ([`GrowthCause::decide`]). Pure bookkeeping: no CUDA calls. Why and the
//! figures: `docs/internals/stream-ordered.md`, "Growth under pressure".

use std::cell::Cell;

/// Why the core asks its resource for a new upstream chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrowthCause {
    /// No other list holds a block that fits: the resource grows by its own rule (the pool's
    /// `size_to_grow`, which at least doubles it without a maximum).
    Ordinary,
    /// Another stream's list holds a fitting block that this allocation could not take only
    /// because no event covers it yet (its owner was asked to record, or only a device
    /// synchronization would make it safe now), or the growth serves such a growth of a
    /// resource above: the resource grows by what this request needs only (rounded to its
    /// granularity).
    Pressure,
}

impl GrowthCause {
    /// The cause of a growth that follows a search of the other lists which took nothing.
    /// `withheld`: the search saw a fitting block it could not take for want of an event;
    /// `inherited`: this allocation serves a growth under pressure of a resource above
    /// ([`PressureScope::is_active`]).
    #[must_use]
    pub(crate) const fn decide(withheld: bool, inherited: bool) -> Self {
        if withheld || inherited {
            Self::Pressure
        } else {
            Self::Ordinary
        }
    }
}

thread_local! {
    /// Growths under pressure in progress on this thread (nested: a bin's over the pool's).
    /// Constant-initialized and without a destructor.
    static UNDER_PRESSURE: Cell<u32> = const { Cell::new(0) };
}

/// A growth under pressure in progress on this thread, from [`enter`](Self::enter) until the
/// scope is dropped: the allocations the growth makes from a stream-ordered upstream grow that
/// upstream under pressure too.
#[derive(Debug)]
pub(crate) struct PressureScope {
    /// Not `Send`: the scope belongs to the thread whose counter it raised.
    _thread: std::marker::PhantomData<*const ()>,
}

impl PressureScope {
    /// Enters a scope for a growth of `cause`: `None` (no scope) for an ordinary growth.
    #[must_use]
    pub(crate) fn enter(cause: GrowthCause) -> Option<Self> {
        (cause == GrowthCause::Pressure).then(|| {
            // Cannot fail (no destructor); if it did, the growth beneath would be ordinary.
            let _ = UNDER_PRESSURE.try_with(|c| c.set(c.get().saturating_add(1)));
            Self {
                _thread: std::marker::PhantomData,
            }
        })
    }

    /// Whether a growth under pressure is in progress on this thread.
    #[must_use]
    pub(crate) fn is_active() -> bool {
        UNDER_PRESSURE.try_with(|c| c.get() > 0).unwrap_or(false)
    }
}

impl Drop for PressureScope {
    fn drop(&mut self) {
        let _ = UNDER_PRESSURE.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withheld_block_or_an_outer_pressure_growth_means_pressure() {
        assert_eq!(GrowthCause::decide(false, false), GrowthCause::Ordinary);
        assert_eq!(GrowthCause::decide(true, false), GrowthCause::Pressure);
        assert_eq!(GrowthCause::decide(false, true), GrowthCause::Pressure);
        assert_eq!(GrowthCause::decide(true, true), GrowthCause::Pressure);
    }

    #[test]
    fn scopes_nest_and_end_on_drop() {
        assert!(!PressureScope::is_active());
        assert!(PressureScope::enter(GrowthCause::Ordinary).is_none());
        assert!(!PressureScope::is_active());
        let outer = PressureScope::enter(GrowthCause::Pressure);
        assert!(outer.is_some() && PressureScope::is_active());
        {
            let _inner = PressureScope::enter(GrowthCause::Pressure);
            assert!(PressureScope::is_active());
        }
        assert!(
            PressureScope::is_active(),
            "the inner scope ended the outer one"
        );
        drop(outer);
        assert!(!PressureScope::is_active());
    }

    #[test]
    fn a_scope_is_this_threads_only() {
        let _scope = PressureScope::enter(GrowthCause::Pressure);
        let elsewhere = std::thread::spawn(PressureScope::is_active).join().unwrap();
        assert!(!elsewhere, "another thread saw this thread's scope");
        assert!(PressureScope::is_active());
    }
}
