//! The map of handed-out blocks of a pool (and of the VMM pool): address → rounded size and
//! tag, shared by every stream list of one resource, in a [`Sharded`] table.

use crate::util::addr_table::Sharded;

/// The tag the pools keep with a handed-out block: whether it starts a chunk and who allocated
/// it (an `Origin` as a word).
type Tag = (bool, u64);

/// What the map remembers of a block.
#[derive(Debug, Clone, Copy, Default)]
struct Handed {
    /// The request rounded up to 256.
    size: usize,
    tag: Tag,
}

/// Handed-out blocks by address.
#[derive(Debug, Default)]
pub(crate) struct HandedMap(Sharded<Handed>);

impl HandedMap {
    /// Records `addr` as handed out with `size` and `tag`; `false` when it already was (the
    /// record is kept as it was).
    #[inline(always)]
    pub(crate) fn record(&self, addr: u64, size: usize, tag: Tag) -> bool {
        self.0.shard(addr).insert(addr, Handed { size, tag })
    }

    /// Forgets `addr` if it is handed out with `size` and returns its tag; otherwise
    /// `Err(Some(allocated))` when it is handed out with another size, `Err(None)` when it is not
    /// handed out. Of two concurrent calls for one block, at most one succeeds.
    #[inline(always)]
    pub(crate) fn release(&self, addr: u64, size: usize) -> Result<Tag, Option<usize>> {
        self.0
            .shard(addr)
            .remove_if(addr, |h| h.size == size)
            .map(|h| h.tag)
            .map_err(|kept| kept.map(|h| h.size))
    }

    /// Every block handed out, `(address, size)`, each shard read under its lock in turn
    /// (snapshots: exact when nothing runs concurrently).
    pub(crate) fn blocks(&self) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for shard in self.0.each() {
            out.extend(shard.entries().map(|(a, h)| (a, h.size)));
        }
        out
    }

    /// Number of blocks handed out and the sum of their sizes (each shard read under its lock
    /// in turn: exact when nothing runs concurrently).
    pub(crate) fn totals(&self) -> (usize, usize) {
        self.0.each().fold((0, 0), |(n, bytes), shard| {
            (
                n + shard.len(),
                bytes + shard.values().map(|h| h.size).sum::<usize>(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_release_and_mismatch() {
        let m = HandedMap::default();
        assert!(m.record(0x1000, 512, (true, 0)));
        assert!(m.record(0x2000, 256, (false, 1)));
        assert_eq!(m.totals(), (2, 768));
        assert_eq!(m.release(0x1000, 256), Err(Some(512)));
        assert_eq!(m.release(0x3000, 256), Err(None));
        assert_eq!(m.release(0x1000, 512), Ok((true, 0)));
        assert_eq!(m.release(0x1000, 512), Err(None));
        assert!(
            !m.record(0x2000, 1024, (true, 2)),
            "a second record is reported"
        );
        assert_eq!(m.totals(), (1, 256), "and the first one kept");
        assert_eq!(m.release(0x2000, 256), Ok((false, 1)));
        assert_eq!(m.totals(), (0, 0));
    }

    #[test]
    fn concurrent_releases_of_one_block_succeed_once() {
        let m = HandedMap::default();
        let rounds = if cfg!(miri) { 4 } else { 200 };
        for round in 0..rounds {
            let addr = (1 << 40) + round * 256;
            assert!(m.record(addr, 256, (false, round)));
            let wins: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| usize::from(m.release(addr, 256).is_ok())))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(wins, 1, "round {round}");
        }
        assert_eq!(m.totals(), (0, 0));
    }
}
