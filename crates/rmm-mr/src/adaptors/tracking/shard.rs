//! One shard of the tracking registry: live allocations keyed by address, their byte sum, and
//! a ring of the most recent frees (to tell a double free from an untracked free).

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::error::TrackingError;

/// A live allocation.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) size: usize,
    pub(super) stack: Option<Arc<Backtrace>>,
}

/// An address freed recently, with the size it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Freed {
    addr: u64,
    size: usize,
}

/// A removed entry and what its removal did to the ring of recent frees.
pub(super) type Removed = (Entry, Option<RingUndo>);

/// What a removal did to the ring of recent frees, to undo it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RingUndo {
    /// Where the free was remembered.
    index: usize,
    /// What that place held before (`None`: the ring grew).
    previous: Option<Freed>,
}

/// A shard's state, guarded by the shard's mutex.
#[derive(Debug)]
pub(super) struct Shard {
    live: HashMap<u64, Entry, BuildHasherDefault<AddrHasher>>,
    /// Sum of the live sizes.
    bytes: usize,
    /// Ring of the last `recent_capacity` frees, allocated on first use.
    recent: Vec<Freed>,
    recent_capacity: usize,
    /// Where the next free goes once `recent` is full.
    recent_next: usize,
}

impl Shard {
    pub(super) fn new(recent_capacity: usize) -> Shard {
        Shard {
            live: HashMap::default(),
            bytes: 0,
            recent: Vec::new(),
            recent_capacity,
            recent_next: 0,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = (u64, &Entry)> {
        self.live.iter().map(|(&addr, entry)| (addr, entry))
    }

    /// Tracks `addr`; on a duplicate keeps the old entry and reports its size.
    pub(super) fn insert(&mut self, addr: u64, entry: Entry) -> Result<(), TrackingError> {
        match self.live.entry(addr) {
            std::collections::hash_map::Entry::Occupied(old) => {
                Err(TrackingError::DuplicateAllocation {
                    addr,
                    size: entry.size,
                    tracked_size: old.get().size,
                })
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                self.bytes = self.bytes.wrapping_add(entry.size);
                slot.insert(entry);
                Ok(())
            }
        }
    }

    /// Untracks `addr`. Returns the removed entry (to be dropped outside the lock, or given to
    /// [`restore`](Self::restore)) with what its removal did to the ring, and the verdict.
    pub(super) fn remove(
        &mut self,
        addr: u64,
        size: usize,
    ) -> (Option<Removed>, Result<(), TrackingError>) {
        match self.live.remove(&addr) {
            Some(entry) => {
                // The entry was added to `bytes` on insert, so this cannot underflow.
                self.bytes = self.bytes.wrapping_sub(entry.size);
                let undo = self.remember_free(addr, entry.size);
                let verdict = if entry.size == size {
                    Ok(())
                } else {
                    Err(TrackingError::SizeMismatch {
                        addr,
                        allocated: entry.size,
                        deallocated: size,
                    })
                };
                (Some((entry, undo)), verdict)
            }
            // 0-byte allocations are never tracked, so their frees are fine.
            None if size == 0 => (None, Ok(())),
            None => {
                let verdict = match self.recently_freed(addr) {
                    Some(freed_size) => TrackingError::DoubleFree {
                        addr,
                        size,
                        freed_size,
                    },
                    None => TrackingError::UntrackedFree { addr, size },
                };
                (None, Err(verdict))
            }
        }
    }

    fn remember_free(&mut self, addr: u64, size: usize) -> Option<RingUndo> {
        if self.recent_capacity == 0 {
            return None;
        }
        let freed = Freed { addr, size };
        if self.recent.len() < self.recent_capacity {
            if self.recent.capacity() == 0 {
                self.recent.reserve_exact(self.recent_capacity);
            }
            self.recent.push(freed);
            Some(RingUndo {
                index: self.recent.len() - 1,
                previous: None,
            })
        } else {
            let index = self.recent_next;
            let previous = std::mem::replace(&mut self.recent[index], freed);
            self.recent_next = (index + 1) % self.recent_capacity;
            Some(RingUndo {
                index,
                previous: Some(previous),
            })
        }
    }

    /// Tracks `addr` again after its free failed upstream: the entry goes back, and so does the
    /// ring of recent frees when nothing was remembered since (otherwise the ring keeps a
    /// harmless record of a live address, consulted only once it is not live). An address
    /// tracked meanwhile keeps its entry (it cannot be: the memory was never freed) and is
    /// reported.
    pub(super) fn restore(
        &mut self,
        addr: u64,
        entry: Entry,
        undo: Option<RingUndo>,
    ) -> Result<(), TrackingError> {
        if let Some(undo) = undo {
            let ours = Freed {
                addr,
                size: entry.size,
            };
            let last = match undo.previous {
                None => self.recent.len().checked_sub(1),
                Some(_) => {
                    Some((self.recent_next + self.recent_capacity - 1) % self.recent_capacity)
                }
            };
            if last == Some(undo.index) && self.recent.get(undo.index) == Some(&ours) {
                match undo.previous {
                    None => {
                        self.recent.pop();
                    }
                    Some(previous) => {
                        self.recent[undo.index] = previous;
                        self.recent_next = undo.index;
                    }
                }
            }
        }
        self.insert(addr, entry)
    }

    /// The size of the most recent remembered free of `addr`, if any. Only runs on the error
    /// path, so a linear scan is fine.
    fn recently_freed(&self, addr: u64) -> Option<usize> {
        // `recent_next` stays 0 until the ring is full, then points at the oldest entry, so
        // newest first is [..recent_next] reversed, then [recent_next..] reversed.
        let (newer, older) = self.recent.split_at(self.recent_next);
        newer
            .iter()
            .rev()
            .chain(older.iter().rev())
            .find(|f| f.addr == addr)
            .map(|f| f.size)
    }
}

/// Hasher for `u64` addresses: the splitmix64 finalizer (device addresses share their low
/// 8 bits and many high bits, so they need mixing, but not SipHash's DoS resistance).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used for u64 keys; fold bytes in for completeness.
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = mix(self.0 ^ value);
    }
}

/// splitmix64's output function.
#[inline]
pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: usize) -> Entry {
        Entry { size, stack: None }
    }

    #[test]
    fn ring_remembers_exactly_the_last_frees() {
        let mut s = Shard::new(3);
        for a in 1..=5u64 {
            s.insert(a, entry(a as usize * 10)).unwrap();
        }
        for a in 1..=5u64 {
            assert!(s.remove(a, a as usize * 10).1.is_ok());
        }
        // Remembered: 3, 4, 5. Forgotten: 1, 2.
        assert_eq!(s.recently_freed(1), None);
        assert_eq!(s.recently_freed(2), None);
        assert_eq!(s.recently_freed(3), Some(30));
        assert_eq!(s.recently_freed(5), Some(50));
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn ring_reports_the_newest_free_of_an_address() {
        let mut s = Shard::new(4);
        s.insert(7, entry(1)).unwrap();
        s.remove(7, 1).1.unwrap();
        s.insert(7, entry(2)).unwrap();
        s.remove(7, 2).1.unwrap();
        assert_eq!(s.recently_freed(7), Some(2));
        // Wrap the ring, then free 7 again with another size.
        for a in 100..103u64 {
            s.insert(a, entry(1)).unwrap();
            s.remove(a, 1).1.unwrap();
        }
        s.insert(7, entry(3)).unwrap();
        s.remove(7, 3).1.unwrap();
        assert_eq!(s.recently_freed(7), Some(3));
    }

    #[test]
    fn restoring_undoes_the_ring_when_nothing_came_after() {
        let ring = |s: &Shard| (s.recent.clone(), s.recent_next);
        // Growing ring.
        let mut s = Shard::new(2);
        s.insert(0x100, entry(64)).unwrap();
        s.insert(0x200, entry(32)).unwrap();
        let before = ring(&s);
        let (removed, verdict) = s.remove(0x100, 64);
        assert!(verdict.is_ok());
        let (e, undo) = removed.unwrap();
        s.restore(0x100, e, undo).unwrap();
        assert_eq!(ring(&s), before);
        assert_eq!((s.len(), s.bytes()), (2, 96));
        // Full ring: the overwritten record comes back.
        for _ in 0..2 {
            let (removed, _) = s.remove(0x200, 32);
            let (e, _) = removed.unwrap();
            s.insert(0x200, e).unwrap();
        }
        let before = ring(&s);
        assert_eq!(before.0.len(), 2);
        let (removed, _) = s.remove(0x100, 64);
        let (e, undo) = removed.unwrap();
        s.restore(0x100, e, undo).unwrap();
        assert_eq!(ring(&s), before);
        // A free remembered since: the stale record stays, and it is harmless.
        let (removed, _) = s.remove(0x100, 64);
        let (e, undo) = removed.unwrap();
        s.remove(0x200, 32).0.unwrap();
        s.restore(0x100, e, undo).unwrap();
        assert_eq!(s.recently_freed(0x200), Some(32));
        assert_eq!(s.live.get(&0x100).map(|e| e.size), Some(64));
        // Restoring over a live entry keeps it and reports the duplicate.
        s.insert(0x300, entry(8)).unwrap();
        let (removed, _) = s.remove(0x300, 8);
        let (e, undo) = removed.unwrap();
        s.insert(0x300, entry(16)).unwrap();
        assert!(matches!(
            s.restore(0x300, e, undo),
            Err(TrackingError::DuplicateAllocation {
                tracked_size: 16,
                ..
            })
        ));
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut s = Shard::new(0);
        s.insert(1, entry(8)).unwrap();
        s.remove(1, 8).1.unwrap();
        assert_eq!(
            s.remove(1, 8).1,
            Err(TrackingError::UntrackedFree { addr: 1, size: 8 })
        );
    }

    #[test]
    fn mix_spreads_aligned_addresses() {
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..256u64 {
            low_bits.insert(mix(0x7f00_0000_0000 + i * 256) & 0xff);
        }
        assert!(low_bits.len() > 128, "{}", low_bits.len());
    }
}
