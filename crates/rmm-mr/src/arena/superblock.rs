//! [`Superblock`]: a span of at least 1 MiB with its own free list, the unit exchanged between
//! the global arena and the local arenas.

use std::collections::BTreeMap;
use std::fmt;

use super::fit_tree::{FitItem, FitTree};
use super::size_class::{align_up, ALLOCATION_ALIGNMENT};
use super::{ArenaError, Block, SUPERBLOCK_MIN_SIZE};

/// A span of at least [`SUPERBLOCK_MIN_SIZE`] bytes that sub-allocates blocks by address-ordered
/// first fit (RMM's `superblock`).
///
/// It keeps its free blocks in address order, always fully coalesced, plus the blocks it has
/// handed out (`addr -> size`). Tracking live blocks (which RMM does not do) is what lets a free
/// be checked exactly: freeing an address that is not the start of a live block, or with another
/// size, is an error and changes nothing.
///
/// A superblock is deliberately not `Clone`: each span of memory exists in exactly one
/// superblock, which moves between arenas.
///
/// Costs (n = free blocks, m = live blocks): [`allocate`](Self::allocate) and
/// [`deallocate`](Self::deallocate) are `O(log n + log m)`; [`fits`](Self::fits),
/// [`max_free_size`](Self::max_free_size), [`total_free_size`](Self::total_free_size) and
/// [`is_empty`](Self::is_empty) are `O(1)`.
#[doc(alias = "rmm::mr::detail::arena::superblock")]
pub struct Superblock {
    span: Block,
    /// Free blocks by address, fully coalesced (no two are contiguous).
    free: FitTree<Block>,
    /// Live (handed out) blocks: address -> rounded size.
    live: BTreeMap<u64, usize>,
    /// Sum of the sizes of the free blocks.
    free_bytes: usize,
}

impl Superblock {
    /// A superblock over `[addr, addr + size)`, entirely free.
    ///
    /// Errors: [`ArenaError::TooSmall`] below [`SUPERBLOCK_MIN_SIZE`];
    /// [`ArenaError::InvalidSpan`] when `addr` or `size` is not a multiple of 256 or the span
    /// wraps around the address space.
    pub fn new(addr: u64, size: usize) -> Result<Self, ArenaError> {
        if size < SUPERBLOCK_MIN_SIZE {
            return Err(ArenaError::TooSmall {
                size,
                minimum: SUPERBLOCK_MIN_SIZE,
            });
        }
        let aligned = addr % ALLOCATION_ALIGNMENT as u64 == 0 && size % ALLOCATION_ALIGNMENT == 0;
        if !aligned || addr.checked_add(size as u64).is_none() {
            return Err(ArenaError::InvalidSpan { addr, size });
        }
        Ok(Self::fresh(Block::new(addr, size)))
    }

    /// An entirely free superblock over an already validated span.
    pub(crate) fn fresh(span: Block) -> Self {
        let mut free = FitTree::new();
        let inserted = free.insert(span).is_ok();
        debug_assert!(inserted);
        Self {
            span,
            free,
            live: BTreeMap::new(),
            free_bytes: span.size,
        }
    }

    /// First address.
    pub fn addr(&self) -> u64 {
        self.span.addr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.span.size
    }

    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.span.end()
    }

    /// The whole span as a block.
    pub fn span(&self) -> Block {
        self.span
    }

    /// Whether nothing is handed out, i.e. one free block covers the whole superblock.
    pub fn is_empty(&self) -> bool {
        self.free_bytes == self.span.size
    }

    /// Number of free blocks (RMM's `free_blocks()`).
    pub fn free_block_count(&self) -> usize {
        self.free.len()
    }

    /// Number of live (handed out) blocks.
    pub fn live_block_count(&self) -> usize {
        self.live.len()
    }

    /// Whether `block` lies entirely inside this superblock.
    pub fn contains(&self, block: &Block) -> bool {
        self.span.contains(block)
    }

    /// Whether `addr` lies inside this superblock.
    pub fn contains_addr(&self, addr: u64) -> bool {
        self.span.contains_addr(addr)
    }

    /// Whether some free block has at least `bytes` bytes (`O(1)`).
    pub fn fits(&self, bytes: usize) -> bool {
        self.max_free_size() >= bytes
    }

    /// Whether both superblocks are empty and this one ends where `other` starts (so they can be
    /// merged).
    pub fn is_contiguous_before(&self, other: &Superblock) -> bool {
        self.is_empty() && other.is_empty() && self.span.is_contiguous_before(&other.span)
    }

    /// Split an empty superblock into a head of `bytes` bytes and the tail, both empty.
    ///
    /// `None` unless the superblock is empty, `bytes` is a multiple of 256 and both parts are at
    /// least [`SUPERBLOCK_MIN_SIZE`]. `self` is left untouched either way.
    pub fn split(&self, bytes: usize) -> Option<(Superblock, Superblock)> {
        let tail_size = self.span.size.checked_sub(bytes)?;
        if !self.is_empty()
            || bytes < SUPERBLOCK_MIN_SIZE
            || tail_size < SUPERBLOCK_MIN_SIZE
            || bytes % ALLOCATION_ALIGNMENT != 0
        {
            return None;
        }
        let (head, tail) = self.span.split(bytes)?;
        Some((Self::fresh(head), Self::fresh(tail)))
    }

    /// The empty superblock covering this one and `other`;
    /// `None` unless [`is_contiguous_before`](Self::is_contiguous_before) holds.
    pub fn merge(&self, other: &Superblock) -> Option<Superblock> {
        if !self.is_contiguous_before(other) {
            return None;
        }
        Some(Self::fresh(self.span.merge(&other.span)?))
    }

    /// Hand out the lowest-addressed free block of at least `bytes` bytes (rounded up to 256),
    /// splitting it and keeping the remainder free (RMM's `first_fit`).
    ///
    /// `None` when nothing fits or `bytes` is 0.
    #[doc(alias = "first_fit")]
    pub fn allocate(&mut self, bytes: usize) -> Option<Block> {
        let size = align_up(bytes)?;
        if size == 0 {
            return None;
        }
        let found = *self.free.first_fit(size)?;
        let taken = self.free.remove(found.addr);
        debug_assert_eq!(taken, Some(found));
        if let Some((_, tail)) = found.split(size) {
            let inserted = self.free.insert(tail).is_ok();
            debug_assert!(inserted);
        }
        self.live.insert(found.addr, size);
        self.free_bytes -= size;
        Some(Block::new(found.addr, size))
    }

    /// Give back a block handed out by [`allocate`](Self::allocate), coalescing it with its free
    /// neighbours (RMM's `coalesce`). `block.size` is rounded up to 256 like the request was.
    ///
    /// Errors leave the superblock unchanged:
    /// [`ArenaError::SizeMismatch`] when a live block starts at `block.addr` with another size;
    /// [`ArenaError::DoubleFree`] when no live block starts there and the range overlaps free
    /// memory; [`ArenaError::NotFound`] otherwise (outside this superblock, or inside a live block
    /// but not at its start).
    #[doc(alias = "coalesce")]
    pub fn deallocate(&mut self, block: Block) -> Result<(), ArenaError> {
        let Block { addr, size: given } = block;
        let not_found = ArenaError::NotFound { addr, size: given };
        let size = align_up(given).ok_or(not_found)?;
        match self.live.get(&addr) {
            Some(&allocated) if allocated == size => {}
            Some(&allocated) => {
                return Err(ArenaError::SizeMismatch {
                    addr,
                    size: given,
                    allocated,
                })
            }
            None if self.overlaps_free(addr, size) => {
                return Err(ArenaError::DoubleFree { addr, size: given })
            }
            None => return Err(not_found),
        }
        self.live.remove(&addr);
        self.free_bytes += size;

        let mut merged = Block::new(addr, size);
        if let Some(prev) = self.free.floor(addr).copied() {
            if prev.is_contiguous_before(&merged) {
                self.free.remove(prev.addr);
                merged = Block::new(prev.addr, prev.size + merged.size);
            }
        }
        if let Some(next) = self.free.get(merged.end()).copied() {
            self.free.remove(next.addr);
            merged.size += next.size;
        }
        let inserted = self.free.insert(merged).is_ok();
        debug_assert!(inserted);
        Ok(())
    }

    /// Whether `[addr, addr + size)` shares a byte with a free block (a zero-size range counts
    /// when `addr` lies strictly inside a free block).
    fn overlaps_free(&self, addr: u64, size: usize) -> bool {
        let end = addr.saturating_add(size as u64).max(addr.saturating_add(1));
        // Free blocks are disjoint and sorted: only the last one starting before `end` can
        // reach past `addr`.
        self.free
            .floor(end - 1)
            .is_some_and(|blk| blk.end() > addr && (size > 0 || blk.addr < addr))
    }

    /// Total free bytes (`O(1)`).
    pub fn total_free_size(&self) -> usize {
        self.free_bytes
    }

    /// Total bytes handed out.
    pub fn live_bytes(&self) -> usize {
        self.span.size - self.free_bytes
    }

    /// Size of the largest free block, 0 when full (`O(1)`).
    pub fn max_free_size(&self) -> usize {
        self.free.max_fit()
    }

    /// The free blocks in address order.
    pub fn free_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.free.iter().copied()
    }

    /// The live blocks in address order.
    pub fn live_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.live
            .iter()
            .map(|(&addr, &size)| Block::new(addr, size))
    }

    /// Whether a live block starts at `addr`, and its size.
    pub fn live_block_at(&self, addr: u64) -> Option<usize> {
        self.live.get(&addr).copied()
    }
}

impl FitItem for Superblock {
    fn key(&self) -> u64 {
        self.span.addr
    }

    fn fit(&self) -> usize {
        self.max_free_size()
    }
}

impl fmt::Debug for Superblock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Superblock")
            .field("span", &self.span)
            .field("free_bytes", &self.free_bytes)
            .field("free_blocks", &self.free.len())
            .field("live_blocks", &self.live.len())
            .field("max_free", &self.max_free_size())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;
    const MIN: usize = SUPERBLOCK_MIN_SIZE;
    /// RMM's `fake_address`, `fake_address3` and `fake_address4`.
    const A1: u64 = 1 << 10;
    const A3: u64 = MIN as u64;
    const A4: u64 = 2 * MIN as u64;

    fn sb(addr: u64, size: usize) -> Superblock {
        Superblock::new(addr, size).unwrap_or_else(|e| panic!("test superblock: {e}"))
    }

    fn alloc(s: &mut Superblock, bytes: usize) -> Block {
        s.allocate(bytes)
            .unwrap_or_else(|| panic!("allocate {bytes}"))
    }

    #[test]
    fn new_validates_the_span() {
        assert_eq!(
            Superblock::new(A3, MIN - 256).map(|_| ()),
            Err(ArenaError::TooSmall {
                size: MIN - 256,
                minimum: MIN
            })
        );
        assert_eq!(
            Superblock::new(A3 + 1, MIN).map(|_| ()),
            Err(ArenaError::InvalidSpan {
                addr: A3 + 1,
                size: MIN
            })
        );
        assert!(Superblock::new(A3, MIN + 1).is_err());
        assert!(Superblock::new(u64::MAX - 255, MIN).is_err());
    }

    /// RMM `ArenaTest.SuperblockEmpty`.
    #[test]
    fn superblock_empty() {
        let mut s = sb(A3, MIN);
        assert!(s.is_empty());
        alloc(&mut s, 256);
        assert!(!s.is_empty());
    }

    /// RMM `ArenaTest.SuperblockContains`.
    #[test]
    fn superblock_contains() {
        let s = sb(A3, MIN);
        assert!(!s.contains(&Block::new(A1, 2 * KIB)));
        assert!(s.contains(&Block::new(A3, KIB)));
        assert!(!s.contains(&Block::new(A3, MIN + 1)));
        assert!(s.contains(&Block::new(A3, MIN)));
        assert!(!s.contains(&Block::new(A4, 256)));
    }

    /// RMM `ArenaTest.SuperblockFits`.
    #[test]
    fn superblock_fits() {
        let mut s = sb(A3, MIN);
        assert!(s.fits(MIN));
        assert!(!s.fits(MIN + 1));
        let blk = alloc(&mut s, MIN / 4);
        alloc(&mut s, MIN / 4);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert!(s.fits(MIN / 2));
        assert!(!s.fits(MIN / 2 + 1));
    }

    /// RMM `ArenaTest.SuperblockIsContiguousBefore`.
    #[test]
    fn superblock_is_contiguous_before() {
        let mut s = sb(A3, MIN);
        let mut s2 = sb(A4, MIN);
        assert!(s.is_contiguous_before(&s2));
        let blk = alloc(&mut s, 256);
        assert!(!s.is_contiguous_before(&s2));
        assert_eq!(s.deallocate(blk), Ok(()));
        assert!(s.is_contiguous_before(&s2));
        let blk2 = alloc(&mut s2, KIB);
        assert!(!s.is_contiguous_before(&s2));
        assert_eq!(s2.deallocate(blk2), Ok(()));
        assert!(s.is_contiguous_before(&s2));
    }

    /// RMM `ArenaTest.SuperblockSplit`.
    #[test]
    fn superblock_split() {
        let s = sb(A3, 2 * MIN);
        let (head, tail) = s.split(MIN).unwrap_or_else(|| panic!("split"));
        assert_eq!((head.addr(), head.size()), (A3, MIN));
        assert!(head.is_empty());
        assert_eq!((tail.addr(), tail.size()), (A4, MIN));
        assert!(tail.is_empty());
        // Preconditions: parts of at least 1 MiB, 256-aligned, empty superblock.
        assert!(s.split(MIN - 256).is_none());
        assert!(s.split(MIN + 256).is_none());
        assert!(sb(A3, 3 * MIN).split(MIN + 1).is_none());
        let mut used = sb(A3, 2 * MIN);
        alloc(&mut used, 256);
        assert!(used.split(MIN).is_none());
    }

    /// RMM `ArenaTest.SuperblockMerge`.
    #[test]
    fn superblock_merge() {
        let merged = sb(A3, MIN)
            .merge(&sb(A4, MIN))
            .unwrap_or_else(|| panic!("merge"));
        assert_eq!((merged.addr(), merged.size()), (A3, 2 * MIN));
        assert!(merged.is_empty());
        assert!(sb(A4, MIN).merge(&sb(A3, MIN)).is_none());
    }

    /// RMM `ArenaTest.SuperblockFirstFit`.
    #[test]
    fn superblock_first_fit() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, KIB);
        assert_eq!(blk, Block::new(A3, KIB));
        let blk2 = alloc(&mut s, 2 * KIB);
        assert_eq!(blk2, Block::new(A3 + KIB as u64, 2 * KIB));
        assert_eq!(s.deallocate(blk), Ok(()));
        assert_eq!(alloc(&mut s, 512), Block::new(A3, 512));
    }

    /// RMM `ArenaTest.SuperblockCoalesceAfterFull`.
    #[test]
    fn superblock_coalesce_after_full() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, MIN / 2);
        alloc(&mut s, MIN / 2);
        assert_eq!(s.max_free_size(), 0);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert!(s.allocate(MIN / 2).is_some());
    }

    /// RMM `ArenaTest.SuperblockCoalesceMergeNext`.
    #[test]
    fn superblock_coalesce_merge_next() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, MIN / 2);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert!(s.allocate(MIN).is_some());
    }

    /// RMM `ArenaTest.SuperblockCoalesceMergePrevious`.
    #[test]
    fn superblock_coalesce_merge_previous() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, KIB);
        let blk2 = alloc(&mut s, KIB);
        alloc(&mut s, KIB);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert_eq!(s.deallocate(blk2), Ok(()));
        assert_eq!(alloc(&mut s, 2 * KIB).addr, A3);
    }

    /// RMM `ArenaTest.SuperblockCoalesceMergePreviousAndNext`.
    #[test]
    fn superblock_coalesce_merge_previous_and_next() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, KIB);
        let blk2 = alloc(&mut s, KIB);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert_eq!(s.deallocate(blk2), Ok(()));
        assert!(s.allocate(MIN).is_some());
        assert_eq!(s.free_block_count(), 0);
    }

    /// RMM `ArenaTest.SuperblockMaxFreeSize`.
    #[test]
    fn superblock_max_free_size() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, MIN / 4);
        alloc(&mut s, MIN / 4);
        assert_eq!(s.deallocate(blk), Ok(()));
        assert_eq!(s.max_free_size(), MIN / 2);
    }

    /// RMM `ArenaTest.SuperblockMaxFreeSizeWhenFull`.
    #[test]
    fn superblock_max_free_size_when_full() {
        let mut s = sb(A3, MIN);
        alloc(&mut s, MIN);
        assert_eq!(s.max_free_size(), 0);
        assert!(!s.fits(1));
    }

    #[test]
    fn sizes_are_rounded_to_256() {
        let mut s = sb(A3, MIN);
        let blk = alloc(&mut s, 1);
        assert_eq!(blk, Block::new(A3, 256));
        assert_eq!(alloc(&mut s, 257), Block::new(A3 + 256, 512));
        // Freeing with any size that rounds to the same value is accepted.
        assert_eq!(s.deallocate(Block::new(A3, 200)), Ok(()));
        assert!(s.allocate(0).is_none());
        assert!(s.allocate(usize::MAX).is_none());
    }

    #[test]
    fn wrong_frees_are_errors_and_change_nothing() {
        let mut s = sb(A3, MIN);
        let a = alloc(&mut s, KIB);
        let b = alloc(&mut s, KIB);
        let free_before = s.total_free_size();

        assert_eq!(
            s.deallocate(Block::new(a.addr, 2 * KIB)),
            Err(ArenaError::SizeMismatch {
                addr: a.addr,
                size: 2 * KIB,
                allocated: KIB
            })
        );
        // Interior pointer of a live block.
        assert_eq!(
            s.deallocate(Block::new(a.addr + 256, 256)),
            Err(ArenaError::NotFound {
                addr: a.addr + 256,
                size: 256
            })
        );
        // Free space after `b`.
        assert_eq!(
            s.deallocate(Block::new(b.end(), 256)),
            Err(ArenaError::DoubleFree {
                addr: b.end(),
                size: 256
            })
        );
        // Outside the superblock.
        assert!(matches!(
            s.deallocate(Block::new(A4, 256)),
            Err(ArenaError::NotFound { .. })
        ));
        assert_eq!(s.total_free_size(), free_before);
        assert_eq!(s.live_block_count(), 2);

        assert_eq!(s.deallocate(a), Ok(()));
        assert_eq!(
            s.deallocate(a),
            Err(ArenaError::DoubleFree {
                addr: a.addr,
                size: KIB
            })
        );
        // A range that starts in live memory (b) but runs into free memory is also caught.
        assert_eq!(s.deallocate(b), Ok(()));
        assert!(s.is_empty());
        assert_eq!(s.free_block_count(), 1);
        assert_eq!(
            s.deallocate(b),
            Err(ArenaError::DoubleFree {
                addr: b.addr,
                size: KIB
            })
        );
        assert!(matches!(
            s.deallocate(Block::new(A3 + 512, 0)),
            Err(ArenaError::DoubleFree { .. })
        ));
    }

    #[test]
    fn zero_size_free_of_live_block_is_a_mismatch() {
        let mut s = sb(A3, MIN);
        let a = alloc(&mut s, KIB);
        assert_eq!(
            s.deallocate(Block::new(a.addr, 0)),
            Err(ArenaError::SizeMismatch {
                addr: a.addr,
                size: 0,
                allocated: KIB
            })
        );
    }
}
