//! The pool's map of handed-out blocks (address → rounded size and tag), shared by every stream
//! list of one pool: a sharded concurrent map, one short shard lock per operation.

use std::hash::{BuildHasherDefault, Hasher};

use dashmap::DashMap;

/// A hasher for 256-aligned addresses (splitmix64's finalizer: every output bit depends on
/// every input bit, so both dashmap's shard bits and hashbrown's bucket bits are mixed).
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// What the map remembers of a block.
#[derive(Debug, Clone, Copy)]
struct Handed<T> {
    /// The request rounded up to 256.
    size: usize,
    tag: T,
}

/// Handed-out blocks by address.
#[derive(Debug)]
pub(crate) struct HandedMap<T> {
    map: DashMap<u64, Handed<T>, BuildHasherDefault<AddrHasher>>,
}

impl<T> Default for HandedMap<T> {
    fn default() -> Self {
        Self {
            map: DashMap::default(),
        }
    }
}

impl<T: Copy> HandedMap<T> {
    /// Records `addr` as handed out with `size` and `tag`; `false` when it already was (the
    /// record is kept as it was).
    pub(crate) fn record(&self, addr: u64, size: usize, tag: T) -> bool {
        match self.map.entry(addr) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(slot) => {
                slot.insert(Handed { size, tag });
                true
            }
        }
    }

    /// Forgets `addr` if it is handed out with `size` and returns its tag; otherwise
    /// `Err(Some(allocated))` when it is handed out with another size, `Err(None)` when it is not
    /// handed out. Of two concurrent calls for one block, at most one succeeds.
    pub(crate) fn release(&self, addr: u64, size: usize) -> Result<T, Option<usize>> {
        match self.map.remove_if(&addr, |_, h| h.size == size) {
            Some((_, h)) => Ok(h.tag),
            None => Err(self.map.get(&addr).map(|h| h.size)),
        }
    }

    /// Number of blocks handed out and the sum of their sizes.
    pub(crate) fn totals(&self) -> (usize, usize) {
        self.map
            .iter()
            .fold((0, 0), |(n, bytes), h| (n + 1, bytes + h.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn record_release_and_mismatch() {
        let m = HandedMap::default();
        assert!(m.record(0x1000, 512, true));
        assert!(m.record(0x2000, 256, false));
        assert_eq!(m.totals(), (2, 768));
        assert_eq!(m.release(0x1000, 256), Err(Some(512)));
        assert_eq!(m.release(0x3000, 256), Err(None));
        assert_eq!(m.release(0x1000, 512), Ok(true));
        assert_eq!(m.release(0x1000, 512), Err(None));
        assert!(!m.record(0x2000, 1024, true), "a second record is reported");
        assert_eq!(m.totals(), (1, 256), "and the first one kept");
        assert_eq!(m.release(0x2000, 256), Ok(false));
    }

    #[test]
    fn addresses_spread_over_hash_bits() {
        let b = BuildHasherDefault::<AddrHasher>::default();
        let hashes: Vec<u64> = (0..64u64).map(|i| b.hash_one(i * 256)).collect();
        // Low bits (hashbrown buckets) and high bits (dashmap shards) both vary.
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 63).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 58).collect();
        assert!(
            low.len() > 30 && high.len() > 30,
            "{} {}",
            low.len(),
            high.len()
        );
    }
}
