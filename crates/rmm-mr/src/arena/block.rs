//! [`Block`]: a contiguous range of device addresses.

use std::fmt;

use super::fit_tree::FitItem;

/// A contiguous range `[addr, addr + size)` of device memory, handed out or free.
///
/// Blocks are plain values (RMM's `block`, a `byte_span`); ordering is by address. Arithmetic
/// never panics: [`end`](Self::end) saturates, the combinators return `None` when their
/// precondition does not hold.
#[doc(alias = "rmm::mr::detail::arena::block")]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block {
    /// First address of the block.
    pub addr: u64,
    /// Size in bytes.
    pub size: usize,
}

impl Block {
    /// The block `[addr, addr + size)`.
    pub const fn new(addr: u64, size: usize) -> Self {
        Self { addr, size }
    }

    /// One past the last address (saturating at `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size as u64)
    }

    /// Whether the block has at least `bytes` bytes.
    pub fn fits(&self, bytes: usize) -> bool {
        self.size >= bytes
    }

    /// Whether this block ends exactly where `other` starts.
    pub fn is_contiguous_before(&self, other: &Block) -> bool {
        self.addr.checked_add(self.size as u64) == Some(other.addr)
    }

    /// Split into a head of `bytes` bytes and the tail; `None` unless `0 < bytes < size`.
    pub fn split(&self, bytes: usize) -> Option<(Block, Block)> {
        if bytes == 0 || bytes >= self.size {
            return None;
        }
        let tail = Block::new(self.addr.checked_add(bytes as u64)?, self.size - bytes);
        Some((Block::new(self.addr, bytes), tail))
    }

    /// The union of this block and `other`, which must start where this one ends.
    pub fn merge(&self, other: &Block) -> Option<Block> {
        if !self.is_contiguous_before(other) {
            return None;
        }
        Some(Block::new(self.addr, self.size.checked_add(other.size)?))
    }

    /// Whether `addr` lies inside this block.
    pub fn contains_addr(&self, addr: u64) -> bool {
        self.addr <= addr && addr < self.end()
    }

    /// Whether `other` lies entirely inside this block.
    pub fn contains(&self, other: &Block) -> bool {
        self.addr <= other.addr
            && other
                .addr
                .checked_add(other.size as u64)
                .is_some_and(|end| end <= self.end())
    }

    /// Whether the two blocks share at least one byte.
    pub fn overlaps(&self, other: &Block) -> bool {
        self.addr < other.end() && other.addr < self.end()
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, {:#x}) {} B", self.addr, self.end(), self.size)
    }
}

impl FitItem for Block {
    fn key(&self) -> u64 {
        self.addr
    }

    fn fit(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;
    /// RMM's `fake_address` and `fake_address2`.
    const A1: u64 = 1 << 10;
    const A2: u64 = 2 << 10;

    /// RMM `ArenaTest.BlockFits`.
    #[test]
    fn block_fits() {
        let blk = Block::new(A1, KIB);
        assert!(blk.fits(KIB));
        assert!(!blk.fits(KIB + 1));
    }

    /// RMM `ArenaTest.BlockIsContiguousBefore`.
    #[test]
    fn block_is_contiguous_before() {
        assert!(Block::new(A1, KIB).is_contiguous_before(&Block::new(A2, 256)));
        assert!(!Block::new(A1, 512).is_contiguous_before(&Block::new(A2, KIB)));
        assert!(!Block::new(u64::MAX, 1).is_contiguous_before(&Block::new(0, 1)));
    }

    /// RMM `ArenaTest.BlockSplit`.
    #[test]
    fn block_split() {
        let (head, tail) = Block::new(A1, 2 * KIB).split(KIB).unwrap_or_default();
        assert_eq!(head, Block::new(A1, KIB));
        assert_eq!(tail, Block::new(A2, KIB));
        assert_eq!(Block::new(A1, KIB).split(KIB), None);
        assert_eq!(Block::new(A1, KIB).split(0), None);
    }

    /// RMM `ArenaTest.BlockMerge`.
    #[test]
    fn block_merge() {
        let merged = Block::new(A1, KIB).merge(&Block::new(A2, KIB));
        assert_eq!(merged, Some(Block::new(A1, 2 * KIB)));
        assert_eq!(Block::new(A2, KIB).merge(&Block::new(A1, KIB)), None);
    }

    /// RMM `ArenaTest.ByteSpan`, adapted: there is no "invalid" default span in Rust (absence is an
    /// `Option`), so this checks the span accessors instead.
    #[test]
    fn span_accessors() {
        let blk = Block::new(A1, 256);
        assert_eq!(blk.end(), A1 + 256);
        assert!(blk.contains_addr(A1) && blk.contains_addr(A1 + 255));
        assert!(!blk.contains_addr(A1 + 256) && !blk.contains_addr(A1 - 1));
        assert!(blk.contains(&Block::new(A1 + 128, 128)));
        assert!(!blk.contains(&Block::new(A1 + 128, 129)));
        assert!(!blk.contains(&Block::new(u64::MAX, 2)));
        assert!(blk.overlaps(&Block::new(A1 + 255, 1)));
        assert!(!blk.overlaps(&Block::new(A1 + 256, 1)));
        assert_eq!(Block::new(u64::MAX - 1, 10).end(), u64::MAX);
        assert_eq!(blk.to_string(), "[0x400, 0x500) 256 B");
    }
}
