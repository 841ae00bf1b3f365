//! [`Superblock`]: a span (normally at least 1 MiB) with its own free list, the unit the global
//! arena lends to the local arenas.

use std::fmt;

use super::fit_tree::{FitItem, FitTree, Handle};
use super::size_class::{align_up, ALLOCATION_ALIGNMENT};
use super::{ArenaError, Block, SUPERBLOCK_MIN_SIZE};

/// An empty superblock whose block tree has room for more nodes than this drops it for a new
/// one (the slab of a tree never shrinks by itself).
const SHRINK_ABOVE: usize = 64;

/// One block of a superblock, free or handed out. The pieces of a superblock tile its span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    addr: u64,
    size: usize,
    free: bool,
}

impl Piece {
    fn block(&self) -> Block {
        Block::new(self.addr, self.size)
    }
}

impl FitItem for Piece {
    fn key(&self) -> u64 {
        self.addr
    }

    /// Only free pieces can serve a request.
    fn fit(&self) -> usize {
        if self.free {
            self.size
        } else {
            0
        }
    }
}

/// A span that sub-allocates blocks by address-ordered first fit (RMM's `superblock`): at least
/// [`SUPERBLOCK_MIN_SIZE`] bytes when built with [`new`](Self::new); the global arena lends a
/// smaller one only when no free block of that size is left.
///
/// It keeps its blocks in address order, free and handed out alike (they tile the span); the
/// free ones are always fully coalesced. Tracking live blocks (which RMM does not do) is what
/// lets a free be checked exactly: freeing an address that is not the start of a live block, or
/// with another size, is an error and changes nothing.
///
/// A superblock is deliberately not `Clone`: each span of memory exists in exactly one
/// superblock, which moves between arenas.
///
/// Costs (n = blocks, free and live): [`allocate`](Self::allocate) and
/// [`deallocate`](Self::deallocate) are `O(log n)`, with at most one insertion (allocate) or two
/// removals (deallocate) in the block tree; [`fits`](Self::fits),
/// [`max_free_size`](Self::max_free_size), [`total_free_size`](Self::total_free_size) and
/// [`is_empty`](Self::is_empty) are `O(1)`.
#[doc(alias = "rmm::mr::detail::arena::superblock")]
pub struct Superblock {
    span: Block,
    /// Every block by address but the trailing free one, indexed by the largest free one.
    pieces: FitTree<Piece>,
    /// Size of the free block that ends the span (0: the last block is live). It is kept out of
    /// `pieces`: it has the highest address, so it serves a request only when no free block in
    /// `pieces` fits, and handing out from it or freeing next to it touches no fit in the tree.
    /// A free block that ends the span is always this one, never a piece.
    tail: usize,
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
        Self {
            span,
            pieces: FitTree::new(),
            tail: span.size,
            free_bytes: span.size,
        }
    }

    /// Where the trailing free block starts (the span's end when there is none).
    fn tail_addr(&self) -> u64 {
        self.span.end() - self.tail as u64
    }

    /// The trailing free block, if any.
    fn tail_block(&self) -> Option<Block> {
        (self.tail > 0).then(|| Block::new(self.tail_addr(), self.tail))
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
        self.pieces.fitting_len() + usize::from(self.tail > 0)
    }

    /// Number of live (handed out) blocks.
    pub fn live_block_count(&self) -> usize {
        self.pieces.len() - self.pieces.fitting_len()
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

    /// Whether an empty superblock can be cut into a head of `bytes` bytes and a tail.
    fn can_split(&self, bytes: usize) -> bool {
        self.span.size.checked_sub(bytes).is_some_and(|tail| {
            self.is_empty()
                && bytes >= SUPERBLOCK_MIN_SIZE
                && tail >= SUPERBLOCK_MIN_SIZE
                && bytes % ALLOCATION_ALIGNMENT == 0
        })
    }

    /// Split an empty superblock into a head of `bytes` bytes and the tail, both empty.
    ///
    /// `None` unless the superblock is empty, `bytes` is a multiple of 256 and both parts are at
    /// least [`SUPERBLOCK_MIN_SIZE`]. `self` is left untouched either way.
    pub fn split(&self, bytes: usize) -> Option<(Superblock, Superblock)> {
        if !self.can_split(bytes) {
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
        // Every piece lies below the trailing free block: it serves only when none fits.
        let Some(found) = self.pieces.first_fit_handle(size) else {
            return self.allocate_from_tail(size);
        };
        let (addr, rest) = self.pieces.update_at(found, |piece| {
            let rest = piece.size - size;
            piece.size = size;
            piece.free = false;
            (piece.addr, rest)
        })?;
        if rest > 0 {
            let inserted = self
                .pieces
                .insert_after(
                    found,
                    Piece {
                        addr: addr + size as u64,
                        size: rest,
                        free: true,
                    },
                )
                .is_ok();
            debug_assert!(inserted);
        }
        self.free_bytes -= size;
        Some(Block::new(addr, size))
    }

    /// Hand out the first `size` bytes (rounded, not 0) of the trailing free block.
    fn allocate_from_tail(&mut self, size: usize) -> Option<Block> {
        if self.tail < size {
            return None;
        }
        let addr = self.tail_addr();
        let inserted = self
            .pieces
            .insert(Piece {
                addr,
                size,
                free: false,
            })
            .is_ok();
        debug_assert!(inserted);
        self.tail -= size;
        self.free_bytes -= size;
        Some(Block::new(addr, size))
    }

    /// Check a free without doing it: the rounded size of the live block `block` names.
    /// Errors as [`deallocate`](Self::deallocate).
    pub(crate) fn check_free(&self, block: Block) -> Result<usize, ArenaError> {
        let Block { addr, size: given } = block;
        let not_found = ArenaError::NotFound { addr, size: given };
        let size = align_up(given).ok_or(not_found)?;
        match self.pieces.get(addr) {
            Some(piece) if !piece.free && piece.size == size => Ok(size),
            Some(piece) if !piece.free => Err(ArenaError::SizeMismatch {
                addr,
                size: given,
                allocated: piece.size,
            }),
            _ if self.overlaps_free(addr, size) => {
                Err(ArenaError::DoubleFree { addr, size: given })
            }
            _ => Err(not_found),
        }
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
        let addr = block.addr;
        let this = self.pieces.find_handle(addr);
        let size = match this.and_then(|h| self.pieces.get_at(h)) {
            Some(piece) if !piece.free && align_up(block.size) == Some(piece.size) => piece.size,
            // Not a live block of that size: say what is wrong.
            _ => return self.check_free(block).map(|_| ()),
        };
        let Some(this) = this else {
            return self.check_free(block).map(|_| ());
        };
        // The pieces tile the span: the previous one ends at `addr`, the next starts at its end.
        let free_piece = |h: Option<Handle>| {
            h.and_then(|h| {
                self.pieces
                    .get_at(h)
                    .filter(|p| p.free)
                    .map(|p| (h, p.size))
            })
        };
        let prev = free_piece(self.pieces.prev(this));
        if addr + size as u64 == self.tail_addr() {
            // The block ends where the trailing free block starts (or ends the span): it joins
            // that block, and so does a free block before it.
            self.pieces.remove_at(this);
            let mut joined = size;
            if let Some((prev, prev_size)) = prev {
                self.pieces.remove_at(prev);
                joined += prev_size;
            }
            self.tail += joined;
            self.freed(size);
            return Ok(());
        }
        let next = free_piece(self.pieces.next(this));
        match (prev, next) {
            (None, None) => {
                self.pieces.update_at(this, |piece| piece.free = true);
            }
            (Some((prev, _)), None) => {
                self.pieces.remove_at(this);
                self.pieces.update_at(prev, |piece| piece.size += size);
            }
            (None, Some((next, next_size))) => {
                self.pieces.remove_at(next);
                self.pieces.update_at(this, |piece| {
                    piece.free = true;
                    piece.size += next_size;
                });
            }
            (Some((prev, _)), Some((next, next_size))) => {
                self.pieces.remove_at(this);
                self.pieces.remove_at(next);
                self.pieces
                    .update_at(prev, |piece| piece.size += size + next_size);
            }
        }
        self.freed(size);
        Ok(())
    }

    /// The accounting after `size` bytes were freed.
    fn freed(&mut self, size: usize) {
        self.free_bytes += size;
        if self.is_empty() && self.pieces.capacity() > SHRINK_ABOVE {
            // Once many blocks, now none in the tree: give the slab's memory back.
            *self = Self::fresh(self.span);
        }
    }

    /// Whether `[addr, addr + size)` shares a byte with a free block (a zero-size range counts
    /// when `addr` lies strictly inside a free block).
    fn overlaps_free(&self, addr: u64, size: usize) -> bool {
        let end = addr.saturating_add(size as u64).max(addr.saturating_add(1));
        // Free blocks are disjoint and sorted: only the last one starting before `end` can
        // reach past `addr` (the trailing one if it does, else one of the pieces).
        let last = match self.tail_block() {
            Some(tail) if tail.addr < end => Some(tail),
            _ => self
                .pieces
                .last_fit_at_or_before(end - 1, 1)
                .map(Piece::block),
        };
        last.is_some_and(|blk| blk.end() > addr && (size > 0 || blk.addr < addr))
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
        self.pieces.max_fit().max(self.tail)
    }

    /// The free blocks in address order.
    pub fn free_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.pieces
            .iter()
            .filter(|p| p.free)
            .map(Piece::block)
            .chain(self.tail_block())
    }

    /// The live blocks in address order.
    pub fn live_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.pieces.iter().filter(|p| !p.free).map(Piece::block)
    }

    /// Every block in address order, with whether it is free (they tile the span).
    pub(crate) fn blocks(&self) -> impl Iterator<Item = (Block, bool)> + '_ {
        self.pieces
            .iter()
            .map(|p| (p.block(), p.free))
            .chain(self.tail_block().map(|tail| (tail, true)))
    }

    /// Whether a live block starts at `addr`, and its size.
    pub fn live_block_at(&self, addr: u64) -> Option<usize> {
        self.pieces
            .get(addr)
            .filter(|piece| !piece.free)
            .map(|piece| piece.size)
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
            .field("free_blocks", &self.free_block_count())
            .field("live_blocks", &self.live_block_count())
            .field("max_free", &self.max_free_size())
            .finish()
    }
}

/// A superblock an arena refused, handed back so that it is not lost.
#[derive(Debug)]
pub struct RejectedSuperblock {
    /// Why it was refused (always [`ArenaError::ForeignSuperblock`] today).
    pub error: ArenaError,
    /// The superblock itself, unchanged (boxed: the error stays small on the `Ok` path of
    /// every call that can return it).
    pub superblock: Box<Superblock>,
}

impl fmt::Display for RejectedSuperblock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for RejectedSuperblock {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

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

    #[test]
    fn emptied_superblocks_give_their_block_slab_back() {
        let mut s = sb(A3, MIN);
        let blocks: Vec<Block> = (0..200).map(|_| alloc(&mut s, KIB)).collect();
        assert!(s.pieces.capacity() > SHRINK_ABOVE);
        for blk in blocks {
            assert_eq!(s.deallocate(blk), Ok(()));
        }
        assert!(s.is_empty());
        assert!(s.pieces.capacity() <= SHRINK_ABOVE);
        assert_eq!(
            s.free_blocks().collect::<Vec<_>>(),
            vec![Block::new(A3, MIN)]
        );
        assert_eq!(alloc(&mut s, MIN), Block::new(A3, MIN));
    }

    #[test]
    fn the_trailing_free_block_behaves_like_any_free_block() {
        let mut s = sb(A3, MIN);
        let a = alloc(&mut s, KIB);
        let b = alloc(&mut s, KIB);
        assert_eq!(s.tail, MIN - 2 * KIB);
        // Inside the trailing free block: double frees; past the span: unknown.
        let tail = A3 + 2 * KIB as u64;
        for (addr, size) in [(tail, KIB), (tail + 256, 256), (tail - 256, 512)] {
            assert_eq!(
                s.deallocate(Block::new(addr, size)),
                Err(ArenaError::DoubleFree { addr, size })
            );
        }
        let past = s.end();
        assert_eq!(
            s.deallocate(Block::new(past, KIB)),
            Err(ArenaError::NotFound {
                addr: past,
                size: KIB
            })
        );
        assert_eq!(s.free_block_count(), 1);
        // `a` is freed into a hole; freeing `b` joins the hole and the trailing block.
        assert_eq!(s.deallocate(a), Ok(()));
        assert_eq!(s.free_block_count(), 2);
        assert_eq!(s.max_free_size(), MIN - 2 * KIB);
        assert_eq!(s.deallocate(b), Ok(()));
        assert!(s.is_empty());
        assert_eq!(s.free_block_count(), 1);
        assert_eq!(s.pieces.len(), 0);
        assert_eq!(
            s.blocks().collect::<Vec<_>>(),
            vec![(Block::new(A3, MIN), true)]
        );
        // A full superblock has no trailing block; its last block freed becomes it.
        let all = alloc(&mut s, MIN);
        assert_eq!((s.tail, s.max_free_size(), s.free_block_count()), (0, 0, 0));
        assert_eq!(s.deallocate(all), Ok(()));
        assert_eq!(s.tail, MIN);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
        Wrong(usize, u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..=(MIN / 2)).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
            1 => (any::<usize>(), 0u64..4096, 0usize..4096).prop_map(|(p, o, s)| Op::Wrong(p, o, s)),
        ]
    }

    proptest! {
        /// Against a model of live blocks: placements are address-ordered first fit, free and
        /// live blocks tile the span with the free ones coalesced, the counters match, and a
        /// free that is not exactly a live block fails and changes nothing.
        #[test]
        fn matches_a_first_fit_model(ops in proptest::collection::vec(op(), 0..150)) {
            let mut s = sb(A3, 2 * MIN);
            let mut live: BTreeMap<u64, usize> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Alloc(bytes) => {
                        let size = align_up(bytes).unwrap_or(0);
                        let expected = s.free_blocks().find(|b| b.size >= size).map(|b| b.addr);
                        let got = s.allocate(bytes);
                        prop_assert_eq!(got.map(|b| b.addr), expected);
                        if let Some(b) = got {
                            prop_assert_eq!(b.size, size);
                            live.insert(b.addr, b.size);
                        }
                    }
                    Op::Free(pick) => {
                        if let Some((&addr, &size)) = live.iter().nth(pick % live.len().max(1)) {
                            prop_assert_eq!(s.deallocate(Block::new(addr, size)), Ok(()));
                            live.remove(&addr);
                        }
                    }
                    Op::Wrong(pick, offset, size) => {
                        let addr = A3 + offset * 256 + (pick % 3) as u64 * 128;
                        if live.get(&addr) == align_up(size).as_ref() {
                            continue;
                        }
                        let before: Vec<Block> = s.free_blocks().collect();
                        prop_assert!(s.deallocate(Block::new(addr, size)).is_err());
                        prop_assert_eq!(s.free_blocks().collect::<Vec<_>>(), before);
                    }
                }
                let free: Vec<Block> = s.free_blocks().collect();
                let used: Vec<Block> = s.live_blocks().collect();
                let model: Vec<Block> = live.iter().map(|(&a, &z)| Block::new(a, z)).collect();
                prop_assert_eq!(&used, &model);
                for pair in free.windows(2) {
                    prop_assert!(pair[0].end() < pair[1].addr, "free blocks not coalesced");
                }
                let mut all: Vec<Block> = free.iter().chain(used.iter()).copied().collect();
                all.sort();
                let mut at = A3;
                for b in &all {
                    prop_assert_eq!(b.addr, at);
                    at = b.end();
                }
                prop_assert_eq!(at, s.end());
                prop_assert_eq!(s.free_block_count(), free.len());
                prop_assert_eq!(s.live_block_count(), used.len());
                prop_assert_eq!(s.total_free_size(), free.iter().map(|b| b.size).sum::<usize>());
                prop_assert_eq!(s.max_free_size(), free.iter().map(|b| b.size).max().unwrap_or(0));
                prop_assert_eq!(s.is_empty(), used.is_empty());
                // A free block that ends the span is the trailing one, never a piece.
                prop_assert!(s.pieces.iter().last().is_none_or(|p| !p.free));
                prop_assert_eq!(s.tail_block(), free.last().filter(|b| b.end() == s.end()).copied());
            }
        }
    }
}
