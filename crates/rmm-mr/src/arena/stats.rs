//! [`ArenaStats`]: free/used byte summary of a set of superblocks, and byte formatting.

use std::fmt;

use super::Superblock;
use crate::util::format::format_bytes;

/// Byte accounting over a set of superblocks (what an arena holds).
///
/// Computed in `O(superblocks)`; meant for logs and dumps, not the hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Number of superblocks.
    pub superblocks: usize,
    /// How many of them are empty.
    pub empty_superblocks: usize,
    /// Total size of the superblocks.
    pub total_bytes: usize,
    /// Free bytes in them.
    pub free_bytes: usize,
    /// Bytes handed out from them.
    pub live_bytes: usize,
    /// Number of free blocks.
    pub free_blocks: usize,
    /// Number of live blocks.
    pub live_blocks: usize,
    /// Size of the largest free block.
    pub max_free_block: usize,
}

impl ArenaStats {
    /// Sum up `superblocks`.
    pub fn from_superblocks<'a>(superblocks: impl IntoIterator<Item = &'a Superblock>) -> Self {
        superblocks
            .into_iter()
            .fold(Self::default(), |mut stats, sb| {
                stats.superblocks += 1;
                stats.empty_superblocks += usize::from(sb.is_empty());
                stats.total_bytes += sb.size();
                stats.free_bytes += sb.total_free_size();
                stats.live_bytes += sb.live_bytes();
                stats.free_blocks += sb.free_block_count();
                stats.live_blocks += sb.live_block_count();
                stats.max_free_block = stats.max_free_block.max(sb.max_free_size());
                stats
            })
    }

    /// RMM's fragmentation measure, `(1 - largest free block / total free) * 100`; 0 when nothing
    /// is free (RMM divides by zero there).
    pub fn fragmentation_percent(&self) -> f64 {
        if self.free_bytes == 0 {
            return 0.0;
        }
        (1.0 - self.max_free_block as f64 / self.free_bytes as f64) * 100.0
    }
}

impl fmt::Display for ArenaStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} superblocks ({} empty), total {}, free {} in {} blocks, used {} in {} blocks, \
             largest free block {}, fragmentation {:.2}%",
            self.superblocks,
            self.empty_superblocks,
            format_bytes(self.total_bytes),
            format_bytes(self.free_bytes),
            self.free_blocks,
            format_bytes(self.live_bytes),
            self.live_blocks,
            format_bytes(self.max_free_block),
            self.fragmentation_percent()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::SUPERBLOCK_MIN_SIZE;

    #[test]
    fn sums_superblocks_and_fragmentation() {
        let min = SUPERBLOCK_MIN_SIZE;
        let mut a = Superblock::new(0, min).unwrap_or_else(|e| panic!("{e}"));
        let b = Superblock::new(min as u64, min).unwrap_or_else(|e| panic!("{e}"));
        let first = a.allocate(min / 4);
        let _second = a.allocate(min / 4);
        assert!(first.is_some_and(|blk| a.deallocate(blk).is_ok()));
        let stats = ArenaStats::from_superblocks([&a, &b]);
        assert_eq!(stats.superblocks, 2);
        assert_eq!(stats.empty_superblocks, 1);
        assert_eq!(stats.total_bytes, 2 * min);
        assert_eq!(stats.live_bytes, min / 4);
        assert_eq!(stats.free_bytes + stats.live_bytes, stats.total_bytes);
        assert_eq!(stats.free_blocks, 3);
        assert_eq!(stats.live_blocks, 1);
        assert_eq!(stats.max_free_block, min);
        // Free: 1/4 + 1/2 + 1 MiB = 1.75 MiB, largest 1 MiB -> 42.857 %.
        assert!((stats.fragmentation_percent() - 300.0 / 7.0).abs() < 1e-9);
        assert!(stats.to_string().contains("fragmentation 42.86%"));
        assert_eq!(ArenaStats::default().fragmentation_percent(), 0.0);
    }
}
