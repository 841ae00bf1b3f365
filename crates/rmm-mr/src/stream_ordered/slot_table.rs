//! Which stream key owns which slot of a stream-ordered core's list storage, and which keys died:
//! the registry of the core as pure bookkeeping (no CUDA call; the core moves the blocks).
//!
//! A key gets a slot when it is first used; when its owner dies (a thread that exited, a stream
//! that was destroyed) the core retires the key and its slot goes back to a free set, from which
//! the next new key takes the lowest. So the slots ever made are bounded by the most keys alive
//! at once, not by the keys ever used. [`Registry`] is the core's table, keyed by [`StreamKey`], with
//! each owner's [`Life`] and who used the core first. Why: `docs/internals/stream-ordered.md`, "Retiring lists".

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rmm_stream::StreamLife;

use crate::stream_ordered::stream_lists::StreamKey;
use crate::util::thread_life::{self, ThreadLife};

/// Whether the owner of a key is alive (see [`crate::stream_ordered::slot_table`]).
#[derive(Debug)]
pub(crate) enum Life {
    /// The legacy stream, and streams whose death cannot be known (foreign streams): never
    /// retired.
    Forever,
    /// The host thread whose per-thread default stream the key names.
    Thread(ThreadLife),
    /// An owning stream made by rmm-stream.
    Stream(StreamLife),
}

impl Life {
    pub(crate) fn is_alive(&self) -> bool {
        match self {
            Self::Forever => true,
            Self::Thread(t) => t.is_alive(),
            Self::Stream(s) => s.is_alive(),
        }
    }
}

/// Thread exits and stream destructions so far (it moves when some owner died).
pub(crate) fn deaths() -> u64 {
    thread_life::exits().wrapping_add(rmm_stream::destroyed_streams())
}

/// How many stream lists a stream-ordered resource keeps (for tests and the figures of
/// `docs/reliability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLists {
    /// Lists alive: the legacy list and one per stream key in use (the orphan list, which holds
    /// the blocks of retired lists, is not counted).
    pub alive: usize,
    /// List slots ever made (alive and free), bounded by the most lists alive at once.
    pub slots: usize,
}

/// Which stream keys have lists (in which slot), whether their owners live, and who used the
/// resource first (see the [module documentation](self)).
#[derive(Default)]
pub(crate) struct Registry {
    /// The slot in `StreamOrdered::lists` of every key but the legacy one, with the life of its
    /// owner.
    by_key: HashMap<StreamKey, (usize, Life)>,
    /// Retired slots, lowest first.
    free: BinaryHeap<Reverse<usize>>,
    /// The slot of the first key a caller used, while it is the only one, when that list is
    /// not the legacy one.
    pub(crate) first_user: Option<usize>,
    /// Number of keys callers have used.
    pub(crate) users: usize,
}

impl Registry {
    /// The slot of `key`, if it has one.
    pub(crate) fn get(&self, key: StreamKey) -> Option<usize> {
        self.by_key.get(&key).map(|&(slot, _)| slot)
    }

    /// Gives `key` (which has no slot) a slot: the lowest retired one, else `new_slot()` (which
    /// makes one at the end of the storage and returns its index).
    pub(crate) fn insert(
        &mut self,
        key: StreamKey,
        life: Life,
        new_slot: impl FnOnce() -> usize,
    ) -> usize {
        debug_assert!(!self.by_key.contains_key(&key));
        let slot = self.free.pop().map_or_else(new_slot, |Reverse(slot)| slot);
        self.by_key.insert(key, (slot, life));
        slot
    }

    /// Retires the keys whose owner is dead by `is_alive`: their slots become free for the next
    /// new keys, lowest first (and none is the first user's any more). Returns them with their
    /// slots, lowest slot first.
    pub(crate) fn retire_dead(
        &mut self,
        is_alive: impl Fn(StreamKey, &Life) -> bool,
    ) -> Vec<(StreamKey, usize)> {
        let mut dead = Vec::new();
        self.by_key.retain(|&key, (slot, life)| {
            let alive = is_alive(key, life);
            if !alive {
                dead.push((key, *slot));
            }
            alive
        });
        dead.sort_unstable_by_key(|&(_, slot)| slot);
        for &(_, slot) in &dead {
            self.free.push(Reverse(slot));
            self.first_user = self.first_user.filter(|&first| first != slot);
        }
        dead
    }

    /// Number of keys with a slot.
    pub(crate) fn live(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A key for the tests.
    fn k(n: u8) -> StreamKey {
        StreamKey::Stream(u64::from(n))
    }

    #[test]
    fn retired_slots_are_reused_lowest_first() {
        let mut r = Registry::default();
        let mut made = 0;
        let mut new_slot = || {
            made += 1;
            made - 1
        };
        for n in 10..13 {
            assert_eq!(
                r.insert(k(n), Life::Forever, &mut new_slot),
                usize::from(n - 10)
            );
        }
        r.first_user = Some(1);
        let dead = r.retire_dead(|key, _| key == k(10));
        assert_eq!(dead, vec![(k(11), 1), (k(12), 2)]);
        assert_eq!(
            r.first_user, None,
            "a retired slot is still the first user's"
        );
        assert!(r.retire_dead(|_, _| true).is_empty());
        assert_eq!(r.insert(k(13), Life::Forever, &mut new_slot), 1);
        assert_eq!(r.insert(k(14), Life::Forever, &mut new_slot), 2);
        assert_eq!(r.insert(k(15), Life::Forever, &mut new_slot), 3);
        assert_eq!(r.live(), 4);
        assert_eq!((r.get(k(13)), r.get(k(11))), (Some(1), None));
        r.retire_dead(|key, _| key != k(10));
        assert_eq!(r.insert(k(16), Life::Forever, &mut new_slot), 0);
        assert_eq!(made, 4);
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A key is used (registered if it has no slot).
        Use(u8),
        /// A key's owner dies.
        Kill(u8),
        /// Dead keys are retired.
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..24).prop_map(Op::Use),
            2 => (0u8..24).prop_map(Op::Kill),
            1 => Just(Op::Sweep),
        ]
    }

    proptest! {
        /// Live keys never share a slot; slots in use and free slots partition the slots made;
        /// a sweep leaves no dead key; and the slots made never exceed the most keys that had a
        /// slot at once.
        #[test]
        fn slots_are_bounded_by_the_peak_of_live_keys(ops in proptest::collection::vec(op(), 1..200)) {
            // A key's owner is alive while its generation is the one it registered with.
            let mut r = Registry::default();
            let mut generation = [0u8; 24];
            let mut registered = [0u8; 24];
            let (mut made, mut peak) = (0, 0);
            for op in ops {
                match op {
                    Op::Use(n) => {
                        if r.get(k(n)).is_none() {
                            registered[n as usize] = generation[n as usize];
                            r.insert(k(n), Life::Forever, || {
                                made += 1;
                                made - 1
                            });
                        }
                    }
                    Op::Kill(n) => generation[n as usize] = generation[n as usize].wrapping_add(1),
                    Op::Sweep => {
                        let alive = |key: StreamKey, _: &Life| {
                            let StreamKey::Stream(n) = key else { return true };
                            generation[n as usize] == registered[n as usize]
                        };
                        let slots: Vec<_> = r.by_key.iter().map(|(&key, &(s, _))| (key, s)).collect();
                        for (key, slot) in r.retire_dead(alive) {
                            prop_assert!(slots.contains(&(key, slot)));
                            prop_assert!(!alive(key, &Life::Forever) && r.get(key).is_none());
                        }
                        prop_assert!(r.retire_dead(alive).is_empty());
                    }
                }
                peak = peak.max(r.live());
                let used: BTreeSet<usize> = r.by_key.values().map(|&(s, _)| s).collect();
                prop_assert_eq!(used.len(), r.live(), "two keys share a slot");
                let free: BTreeSet<usize> = r.free.iter().map(|&Reverse(s)| s).collect();
                prop_assert_eq!(free.len(), r.free.len(), "a slot is free twice");
                prop_assert!(used.is_disjoint(&free));
                prop_assert_eq!(used.len() + free.len(), made);
                prop_assert!(made <= peak, "made {} slots for a peak of {}", made, peak);
            }
        }
    }
}
