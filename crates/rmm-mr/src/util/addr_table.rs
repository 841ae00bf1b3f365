//! A hash table from block addresses to small values, for the pools' record of handed-out
//! blocks (`pool/engine/handed.rs`) and boundary tags (`pool/engine/boundary_list.rs`) and the
//! driver pools' record of who allocated a block (`resources/pool_origins.rs`): open addressing
//! with linear probing, at most a quarter full ([`MAX_LOAD`]), deletion by backward shift (no
//! tombstones, so probes stay short however many blocks come and go), and a multiplicative hash
//! of the address's 256-byte unit whose top bits pick the home slot. One insertion or removal is
//! a multiply, a shift and, at that load, usually the home slot alone: a fraction of a
//! general-purpose map's work, which is what the record costs on every allocation and free.
//! [`Sharded`] puts a fixed set of tables behind locks of their own, for the records that every
//! thread of a resource (or of the process) updates.
//!
//! Pure bookkeeping: no CUDA calls.

use crossbeam_utils::CachePadded;

use crate::sync::{Mutex, MutexGuard};

/// The multiplier of the hash (2^64 over the golden ratio, odd).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// The hash of an address: its 256-byte unit times [`MULTIPLIER`]. The table uses the top
/// bits; callers that shard tables may use middle bits ([`shard_bits`]).
#[inline]
pub(crate) fn hash(addr: u64) -> u64 {
    (addr >> 8).wrapping_mul(MULTIPLIER)
}

/// Bits 20.. of [`hash`], independent of the top bits a table of fewer than 2^44 slots uses.
#[inline]
fn shard_bits(addr: u64) -> usize {
    (hash(addr) >> 20) as usize
}

/// The key that marks an empty slot. Block addresses are 256-aligned and never equal it; the
/// table still accepts it, in a slot of its own.
const EMPTY: u64 = u64::MAX;

/// A table grows (doubles) before more than `1 / MAX_LOAD` of its slots would be used. Filled
/// to between a quarter and a half (the former limit), a key's home slot is taken by another
/// key that often, and whether a probe stops there is a coin toss the processor's branch
/// predictor loses: on the pool's `r64` trace about 1.5 of 5.1 mispredicted branches an
/// operation went away at a quarter (`docs/internals/stream-ordered.md`, "Tuning knobs"), for
/// twice the slots: 4 to 8 a key instead of 2 to 4 (slots of 16 bytes in the boundary tables,
/// 32 in the record). A parameter of this table, not a knob of the core's protocols.
const MAX_LOAD: usize = 4;

/// Slots of a new table (a power of two).
const INITIAL: usize = 16;

/// Addresses to values of type `V` (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub(crate) struct AddrTable<V> {
    /// `(key, value)`; key [`EMPTY`] marks an empty slot. A power of two long.
    slots: Box<[(u64, V)]>,
    /// `64 - log2(slots.len())`: the home slot of a key is `hash(key) >> shift`.
    shift: u32,
    len: usize,
    /// The value of the key [`EMPTY`], which no slot can hold.
    empty_key: Option<V>,
}

impl<V: Copy + Default> Default for AddrTable<V> {
    fn default() -> Self {
        Self::with_slots(INITIAL)
    }
}

impl<V: Copy + Default> AddrTable<V> {
    fn with_slots(n: usize) -> Self {
        debug_assert!(n.is_power_of_two() && n >= 2);
        Self {
            slots: vec![(EMPTY, V::default()); n].into_boxed_slice(),
            shift: 64 - n.trailing_zeros(),
            len: 0,
            empty_key: None,
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (hash(key) >> self.shift) as usize
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.empty_key.is_some())
    }

    /// The slot holding `key`, if any.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The value of `key`.
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.empty_key;
        }
        self.find(key).map(|i| self.slots[i].1)
    }

    /// Adds `key` with `value`; `false` (and nothing changed) when the key is present.
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: u64, value: V) -> bool {
        if key == EMPTY {
            if self.empty_key.is_some() {
                return false;
            }
            self.empty_key = Some(value);
            return true;
        }
        if (self.len + 1) * MAX_LOAD > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return false;
            }
            if k == EMPTY {
                self.slots[i] = (key, value);
                self.len += 1;
                return true;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Removes `key` when `remove` says so of its value: returns `Ok(value)` when removed,
    /// `Err(Some(value))` when kept, `Err(None)` when absent.
    #[inline(always)]
    pub(crate) fn remove_if(
        &mut self,
        key: u64,
        remove: impl FnOnce(&V) -> bool,
    ) -> Result<V, Option<V>> {
        if key == EMPTY {
            return match self.empty_key {
                Some(v) if remove(&v) => {
                    self.empty_key = None;
                    Ok(v)
                }
                other => Err(other),
            };
        }
        let Some(mut hole) = self.find(key) else {
            return Err(None);
        };
        let value = self.slots[hole].1;
        if !remove(&value) {
            return Err(Some(value));
        }
        // Backward shift: move later keys of the run into the hole when the hole lies on the
        // way from their home slot to where they are.
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            // Whether `home` is cyclically outside (hole, j]: then the key may move to `hole`.
            let outside = if hole <= j {
                home <= hole || home > j
            } else {
                home <= hole && home > j
            };
            if outside {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].0 = EMPTY;
        self.len -= 1;
        Ok(value)
    }

    /// Every key with its value.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.0 != EMPTY)
            .copied()
            .chain(self.empty_key.map(|v| (EMPTY, v)))
    }

    /// Every value.
    pub(crate) fn values(&self) -> impl Iterator<Item = V> + '_ {
        self.slots
            .iter()
            .filter(|s| s.0 != EMPTY)
            .map(|s| s.1)
            .chain(self.empty_key)
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = Self::with_slots(self.slots.len() * 2);
        for &(k, v) in self.slots.iter().filter(|s| s.0 != EMPTY) {
            bigger.insert(k, v);
        }
        bigger.empty_key = self.empty_key;
        *self = bigger;
    }
}

/// Number of shards of a [`Sharded`] table (a power of two): enough that 16 threads rarely
/// meet on one.
const SHARDS: usize = 64;

/// [`AddrTable`]s behind [`SHARDS`] short locks, each on its own cache line, the shard chosen
/// from middle bits of the same multiplicative hash the table takes its home slot from
/// ([`shard_bits`]): one operation hashes once, locks one shard and looks at a slot or two.
#[derive(Debug)]
pub(crate) struct Sharded<V> {
    /// A fixed-size array, so that picking a shard needs no bounds check.
    shards: Box<[CachePadded<Mutex<AddrTable<V>>>; SHARDS]>,
}

impl<V: Copy + Default> Default for Sharded<V> {
    fn default() -> Self {
        Self {
            shards: Box::new(std::array::from_fn(|_| {
                CachePadded::new(Mutex::new(AddrTable::default()))
            })),
        }
    }
}

impl<V: Copy + Default> Sharded<V> {
    /// The shard of `addr`, locked. Every operation of a table leaves it consistent (a panic
    /// inside one would come before any change), so the lock needs no poisoning
    /// (`crate::sync`'s has none).
    #[inline(always)]
    pub(crate) fn shard(&self, addr: u64) -> MutexGuard<'_, AddrTable<V>> {
        self.shards[shard_bits(addr) & (SHARDS - 1)].lock()
    }

    /// Every shard, each locked in turn (snapshots: exact when nothing runs concurrently).
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, AddrTable<V>>> {
        self.shards.iter().map(|shard| shard.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// What the tests read of the structure.
    impl<V: Copy + Default> AddrTable<V> {
        /// Checks that every key sits in the run that starts at its home slot (tests).
        fn assert_reachable(&self) {
            let mut count = 0;
            for (i, &(k, _)) in self.slots.iter().enumerate() {
                if k == EMPTY {
                    continue;
                }
                count += 1;
                let mut j = self.home(k);
                while j != i {
                    assert_ne!(self.slots[j].0, EMPTY, "key {k:#x} cut off from its home");
                    j = (j + 1) & self.mask();
                }
            }
            assert_eq!(count, self.len);
        }
    }

    #[test]
    fn insert_get_remove() {
        let mut t: AddrTable<u32> = AddrTable::default();
        assert!(t.insert(0x1000, 1));
        assert!(!t.insert(0x1000, 2), "a second insert is refused");
        assert_eq!(t.get(0x1000), Some(1));
        assert_eq!(t.remove_if(0x1000, |&v| v == 9), Err(Some(1)));
        assert_eq!(t.remove_if(0x1000, |_| true), Ok(1));
        assert_eq!(t.remove_if(0x1000, |_| true), Err(None));
        // The marker key works too.
        assert!(t.insert(EMPTY, 7) && !t.insert(EMPTY, 8));
        assert_eq!((t.get(EMPTY), t.len()), (Some(7), 1));
        assert_eq!(t.remove_if(EMPTY, |_| true), Ok(7));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn grows_and_keeps_everything() {
        let mut t: AddrTable<u64> = AddrTable::default();
        for i in 0..10_000u64 {
            assert!(t.insert((1 << 40) + i * 256, i));
        }
        t.assert_reachable();
        assert!(t.slots.len() >= 20_000);
        for i in (0..10_000u64).step_by(2) {
            assert_eq!(t.remove_if((1 << 40) + i * 256, |_| true), Ok(i));
        }
        t.assert_reachable();
        for i in 0..10_000u64 {
            let expected = (i % 2 == 1).then_some(i);
            assert_eq!(t.get((1 << 40) + i * 256), expected);
        }
        assert_eq!(t.values().count(), 5_000);
    }

    #[test]
    fn shard_bits_and_home_bits_vary() {
        let addrs: Vec<u64> = (0..256u64).map(|i| (1 << 40) + i * (1 << 20)).collect();
        let shards: std::collections::HashSet<usize> =
            addrs.iter().map(|&a| shard_bits(a) & 63).collect();
        let homes: std::collections::HashSet<u64> = addrs.iter().map(|&a| hash(a) >> 58).collect();
        assert!(
            shards.len() > 40 && homes.len() > 40,
            "{} {}",
            shards.len(),
            homes.len()
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        RemoveIf(u64, u32),
    }

    fn key() -> impl Strategy<Value = u64> {
        // Few distinct keys, so that runs collide and removals shift; the marker too.
        prop_oneof![
            (0..48u64).prop_map(|k| k * 256),
            (0..48u64).prop_map(|k| (k << 32) | 0x100),
            Just(EMPTY),
        ]
    }

    proptest! {
        /// Against `HashMap`: the same answers, and every key reachable from its home slot.
        #[test]
        fn matches_a_hash_map(ops in proptest::collection::vec(
            prop_oneof![
                3 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
                2 => key().prop_map(Op::Remove),
                1 => (key(), 0..4u32).prop_map(|(k, v)| Op::RemoveIf(k, v)),
            ],
            1..300,
        )) {
            let mut t: AddrTable<u32> = AddrTable::default();
            let mut m: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let fresh = !m.contains_key(&k);
                        if fresh {
                            m.insert(k, v);
                        }
                        prop_assert_eq!(t.insert(k, v), fresh);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(t.remove_if(k, |_| true).ok(), m.remove(&k));
                    }
                    Op::RemoveIf(k, v) => {
                        let expected = match m.get(&k).copied() {
                            Some(x) if x % 4 == v => {
                                m.remove(&k);
                                Ok(x)
                            }
                            other => Err(other),
                        };
                        prop_assert_eq!(t.remove_if(k, |&x| x % 4 == v), expected);
                    }
                }
                t.assert_reachable();
                prop_assert_eq!(t.len(), m.len());
                for (&k, &v) in &m {
                    prop_assert_eq!(t.get(k), Some(v));
                }
            }
        }
    }
}
