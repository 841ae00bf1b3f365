//! Frees across host threads on the per-thread default stream: the rule the sub-allocators
//! (pool, fixed-size, binning through them, arena) apply, as pure logic without CUDA calls.
//!
//! A block allocated on one thread's per-thread default stream and freed on another thread's
//! must not become reusable behind the freeing thread's stream alone. Each sub-allocator remembers
//! who allocated a block ([`Origin`]); when [`needs_legacy_order`] says so, the free is ordered
//! behind the legacy default stream, which waits for every blocking stream. The hazard, the rule
//! and its limit: `docs/internals/cross-thread.md`.

/// Who allocated a block, as far as the cross-thread rule needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Origin {
    /// Allocated on a stream that is the same stream on every thread: the legacy default
    /// stream or an ordinary stream.
    Shared,
    /// Allocated on the per-thread default stream of the host thread with this number.
    Thread(u64),
    /// Not known: for example a block that was already handed out when the memory around it
    /// moved to where it is now.
    Unknown,
}

/// [`Origin::Shared`] as one word.
const SHARED_WORD: u64 = 0;
/// [`Origin::Unknown`] as one word.
const UNKNOWN_WORD: u64 = u64::MAX;

impl Origin {
    /// The origin as one word, for records that keep a word per block: 0 for
    /// [`Shared`](Self::Shared), `u64::MAX` for [`Unknown`](Self::Unknown), else the thread
    /// number. Thread numbers start at 1 and never reach `u64::MAX`; a thread numbered 0 or
    /// `u64::MAX` (which cannot be) is written as unknown, so a round trip never turns a
    /// cross-thread free into a same-thread one.
    #[inline]
    pub(crate) fn to_word(self) -> u64 {
        match self {
            Self::Shared => SHARED_WORD,
            Self::Thread(t) if t != SHARED_WORD && t != UNKNOWN_WORD => t,
            Self::Thread(_) | Self::Unknown => UNKNOWN_WORD,
        }
    }

    /// The origin [`to_word`](Self::to_word) wrote as `word`.
    #[inline]
    pub(crate) fn from_word(word: u64) -> Self {
        match word {
            SHARED_WORD => Self::Shared,
            UNKNOWN_WORD => Self::Unknown,
            t => Self::Thread(t),
        }
    }
}

/// Whether a free must be ordered behind the legacy default stream (see the
/// [module documentation](self)).
///
/// - `freeing`: the number of the freeing thread when the free is made on its per-thread
///   default stream; `None` for a free on the legacy or an ordinary stream (a stream that is
///   the same on every thread, which the caller vouches orders every use of the block).
/// - `origin`: who allocated the block.
/// - `back_to_origin`: whether the block goes back to where only its allocating stream reuses
///   it next, behind an event recorded on the freeing stream (the arena's per-thread arena of
///   the allocating thread): the allocating thread's own work is then ordered by its stream.
#[inline]
pub(crate) fn needs_legacy_order(
    freeing: Option<u64>,
    origin: Origin,
    back_to_origin: bool,
) -> bool {
    let Some(freeing) = freeing else {
        return false;
    };
    match origin {
        Origin::Shared => false,
        Origin::Thread(allocating) => allocating != freeing && !back_to_origin,
        Origin::Unknown => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn same_thread_and_shared_streams_need_nothing() {
        // Freed on the allocating thread's per-thread stream.
        assert!(!needs_legacy_order(Some(3), Origin::Thread(3), false));
        // Allocated on a stream every thread shares, freed on a per-thread stream: the caller
        // chose the free's stream.
        assert!(!needs_legacy_order(Some(3), Origin::Shared, false));
        // Freed on the legacy or an ordinary stream: whatever the origin.
        for origin in [Origin::Shared, Origin::Thread(3), Origin::Unknown] {
            assert!(!needs_legacy_order(None, origin, false), "{origin:?}");
            assert!(!needs_legacy_order(None, origin, true), "{origin:?}");
        }
    }

    #[test]
    fn another_threads_block_is_ordered_behind_the_legacy_stream() {
        assert!(needs_legacy_order(Some(4), Origin::Thread(3), false));
        // ... unless it goes back to its allocating thread's own arena.
        assert!(!needs_legacy_order(Some(4), Origin::Thread(3), true));
        // Unknown origin on a per-thread free: always.
        assert!(needs_legacy_order(Some(4), Origin::Unknown, false));
        assert!(needs_legacy_order(Some(4), Origin::Unknown, true));
    }

    #[test]
    fn words_round_trip() {
        for origin in [
            Origin::Shared,
            Origin::Unknown,
            Origin::Thread(1),
            Origin::Thread(u64::MAX - 1),
        ] {
            assert_eq!(Origin::from_word(origin.to_word()), origin);
        }
        // Impossible thread numbers become unknown, never shared.
        assert_eq!(
            Origin::from_word(Origin::Thread(0).to_word()),
            Origin::Unknown
        );
        assert_eq!(
            Origin::from_word(Origin::Thread(u64::MAX).to_word()),
            Origin::Unknown
        );
    }

    fn origin() -> impl Strategy<Value = Origin> {
        prop_oneof![
            Just(Origin::Shared),
            Just(Origin::Unknown),
            any::<u64>().prop_map(Origin::Thread),
        ]
    }

    proptest! {
        /// Storing an origin as a word never relaxes the rule.
        #[test]
        fn a_stored_origin_is_never_weaker(
            o in origin(),
            freeing in proptest::option::of(any::<u64>()),
            back in any::<bool>(),
        ) {
            let stored = Origin::from_word(o.to_word());
            if needs_legacy_order(freeing, o, back) {
                prop_assert!(needs_legacy_order(freeing, stored, back));
            }
        }

        /// A per-thread free of a block another thread allocated is ordered behind the legacy
        /// stream exactly when it does not go back to the allocating thread.
        #[test]
        fn cross_thread_model(a in 1..u64::MAX, f in 1..u64::MAX, back in any::<bool>()) {
            prop_assert_eq!(
                needs_legacy_order(Some(f), Origin::Thread(a), back),
                a != f && !back
            );
        }
    }
}
