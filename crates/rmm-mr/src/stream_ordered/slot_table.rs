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
use std::hash::Hash;

use rmm_stream::{CudaStreamView, StreamLife};

use crate::stream_ordered::stream_lists::StreamKey;
use crate::util::thread_life::{self, ThreadLife};

/// Where a new key's list goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A retired slot, to be reused.
    Reused(usize),
    /// A new slot at the end of the storage (its index is the number of slots made before).
    New(usize),
}

impl Placement {
    /// The slot.
    pub(crate) fn slot(self) -> usize {
        match self {
            Self::Reused(i) | Self::New(i) => i,
        }
    }
}

/// The key -> slot registry with slot reuse (see the [module documentation](self)). `Life` says
/// whether a key's owner is alive; the table only stores it.
#[derive(Debug)]
pub(crate) struct SlotTable<K, Life> {
    by_key: HashMap<K, (usize, Life)>,
    /// Retired slots, lowest first.
    free: BinaryHeap<Reverse<usize>>,
    /// Slots made so far.
    made: usize,
}

impl<K: Copy + Eq + Hash, Life> Default for SlotTable<K, Life> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            free: BinaryHeap::new(),
            made: 0,
        }
    }
}

impl<K: Copy + Eq + Hash, Life> SlotTable<K, Life> {
    /// The slot of `key`, if it has one.
    pub(crate) fn get(&self, key: &K) -> Option<usize> {
        self.by_key.get(key).map(|&(slot, _)| slot)
    }

    /// Gives `key` (which has no slot) a slot: the lowest retired one, else a new one.
    pub(crate) fn insert(&mut self, key: K, life: Life) -> Placement {
        debug_assert!(!self.by_key.contains_key(&key));
        let placement = match self.free.pop() {
            Some(Reverse(slot)) => Placement::Reused(slot),
            None => {
                self.made += 1;
                Placement::New(self.made - 1)
            }
        };
        self.by_key.insert(key, (placement.slot(), life));
        placement
    }

    /// Undoes the [`insert`](Self::insert) of `key` that gave `placement` (the storage could not
    /// take the list).
    pub(crate) fn undo_insert(&mut self, key: &K, placement: Placement) {
        self.by_key.remove(key);
        match placement {
            Placement::Reused(slot) => self.free.push(Reverse(slot)),
            Placement::New(_) => self.made -= 1,
        }
    }

    /// The keys whose owner is dead by `is_alive`, with their slots, lowest slot first.
    pub(crate) fn dead(&self, is_alive: impl Fn(&Life) -> bool) -> Vec<(K, usize)> {
        let mut dead: Vec<(K, usize)> = self
            .by_key
            .iter()
            .filter(|(_, (_, life))| !is_alive(life))
            .map(|(&key, &(slot, _))| (key, slot))
            .collect();
        dead.sort_unstable_by_key(|&(_, slot)| slot);
        dead
    }

    /// Retires `key`: its slot becomes free for the next new key. Returns the slot.
    pub(crate) fn remove(&mut self, key: &K) -> Option<usize> {
        let (slot, _) = self.by_key.remove(key)?;
        self.free.push(Reverse(slot));
        Some(slot)
    }

    /// Number of keys with a slot.
    pub(crate) fn live(&self) -> usize {
        self.by_key.len()
    }
}

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
    /// The life of `key`'s owner; `stream` is the caller's stream of that key.
    pub(crate) fn of(key: StreamKey, stream: CudaStreamView<'_>) -> Self {
        match key {
            StreamKey::PerThread(_) => Self::Thread(thread_life::current()),
            StreamKey::Stream(_) => stream.life().map_or(Self::Forever, Self::Stream),
            StreamKey::Legacy | StreamKey::Orphan => Self::Forever,
        }
    }

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

/// Which stream keys have lists (in which slot), and who used the resource first.
#[derive(Default)]
pub(crate) struct Registry {
    /// The slot in `StreamOrdered::lists` of every key but the legacy one.
    pub(crate) table: SlotTable<StreamKey, Life>,
    /// The slot of the first key a caller used, while it is the only one, when that list is
    /// not the legacy one.
    pub(crate) first_user: Option<usize>,
    /// Number of keys callers have used.
    pub(crate) users: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// What the tests read of the structure.
    impl<K: Copy + Eq + Hash, Life> SlotTable<K, Life> {
        /// Number of slots ever made (live and free).
        pub(crate) fn made(&self) -> usize {
            self.made
        }
    }

    #[test]
    fn retired_slots_are_reused_lowest_first() {
        let mut t: SlotTable<u32, bool> = SlotTable::default();
        assert_eq!(t.insert(10, true), Placement::New(0));
        assert_eq!(t.insert(11, false), Placement::New(1));
        assert_eq!(t.insert(12, false), Placement::New(2));
        assert_eq!(t.dead(|&alive| alive), vec![(11, 1), (12, 2)]);
        assert_eq!(t.remove(&12), Some(2));
        assert_eq!(t.remove(&11), Some(1));
        assert_eq!(t.remove(&11), None);
        assert_eq!(t.insert(13, true), Placement::Reused(1));
        assert_eq!(t.insert(14, true), Placement::Reused(2));
        assert_eq!(t.insert(15, true), Placement::New(3));
        assert_eq!((t.live(), t.made()), (4, 4));
        assert_eq!(t.get(&13), Some(1));
        assert_eq!(t.get(&11), None);
        let p = t.insert(16, true);
        t.undo_insert(&16, p);
        assert_eq!((t.live(), t.made(), t.get(&16)), (4, 4, None));
        t.remove(&10);
        let p = t.insert(17, true);
        assert_eq!(p, Placement::Reused(0));
        t.undo_insert(&17, p);
        assert_eq!(t.insert(18, true), Placement::Reused(0));
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
            // The life of a key is (key, the owner's generation when it registered); the owner
            // is alive while its generation has not moved on.
            let mut t: SlotTable<u8, (u8, u8)> = SlotTable::default();
            let mut generation = [0u8; 24];
            let mut peak = 0;
            for op in ops {
                match op {
                    Op::Use(k) => {
                        if t.get(&k).is_none() {
                            t.insert(k, (k, generation[k as usize]));
                        }
                    }
                    Op::Kill(k) => generation[k as usize] = generation[k as usize].wrapping_add(1),
                    Op::Sweep => {
                        for (k, slot) in t.dead(|&(k, g)| generation[k as usize] == g) {
                            prop_assert_eq!(t.remove(&k), Some(slot));
                        }
                        prop_assert!(t.dead(|&(k, g)| generation[k as usize] == g).is_empty());
                    }
                }
                peak = peak.max(t.live());
                let used: BTreeSet<usize> = t.by_key.values().map(|&(s, _)| s).collect();
                prop_assert_eq!(used.len(), t.live(), "two keys share a slot");
                let free: BTreeSet<usize> = t.free.iter().map(|&Reverse(s)| s).collect();
                prop_assert_eq!(free.len(), t.free.len(), "a slot is free twice");
                prop_assert!(used.is_disjoint(&free));
                prop_assert_eq!(used.len() + free.len(), t.made());
                prop_assert!(t.made() <= peak, "made {} slots for a peak of {}", t.made(), peak);
            }
        }
    }
}
