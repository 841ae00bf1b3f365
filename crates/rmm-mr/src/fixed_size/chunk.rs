//! A checked fixed-size free list (RMM's `fixed_size_free_list`), the index of the upstream
//! chunks its blocks come from, and the chunk and error types of the fixed-size bookkeeping.
//!
//! RMM keeps a `std::list` of bare pointers: `push_back` on free, `pop_front` on allocate
//! (FIFO, O(1)), a splice to merge two lists, and no checks at all. Here:
//!
//! - [`FixedSizeFreeList`] is a FIFO (`VecDeque`) plus a membership set, so freeing an address
//!   that is already free is reported as [`FixedSizeError::DoubleFree`] in O(1).
//! - [`ChunkIndex`] maps chunk start addresses to [`Chunk`]s (`BTreeMap`), so a freed address
//!   that is not the start of a block of a known chunk is reported in O(log chunks).
//!
//! Every list indexes the chunks added through it. Blocks that move between lists can be
//! checked against one shared [`ChunkIndex`] with [`FixedSizeFreeList::push_in`]. Membership is
//! per list: a block freed on two different lists is caught when the lists are merged
//! ([`FixedSizeFreeList::append`]), or earlier by checking [`FixedSizeFreeList::contains`] on
//! every list.
//!
//! [`FixedSizeMemoryResource`](crate::FixedSizeMemoryResource), with one list per stream, does
//! not pay for per-list membership: its lists are plain FIFOs of addresses, and one
//! [`BlockLedger`](crate::fixed_size::block_table::BlockLedger) shared by all of them records
//! which blocks are handed out (a slot per block, no hashing), which catches a block freed on
//! two streams at the second free.
//!
//! Pure bookkeeping: no CUDA calls; addresses are `u64`, sizes `usize`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;

use rmm_sys::align::{checked_align_up, ALLOCATION_ALIGNMENT};

/// Errors of the fixed-size bookkeeping. The structures are unchanged when one is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedSizeError {
    /// A block size of 0 was requested.
    ZeroBlockSize,
    /// The block size cannot be rounded up to 256 without overflowing.
    BlockSizeOverflow {
        /// The requested block size.
        block_size: usize,
    },
    /// A chunk of zero blocks.
    EmptyChunk {
        /// Its address.
        addr: u64,
    },
    /// `block_size * count` overflows, or the chunk extends past the end of the address space.
    ChunkOverflow {
        /// Chunk address.
        addr: u64,
        /// Block size.
        block_size: usize,
        /// Number of blocks.
        count: usize,
    },
    /// A new chunk overlaps a chunk that is already indexed.
    ChunkOverlap {
        /// The chunk being added.
        chunk: Chunk,
        /// The indexed chunk it overlaps.
        existing: Chunk,
    },
    /// The freed address lies in no known chunk.
    UnknownAddress {
        /// The freed address.
        addr: u64,
    },
    /// The freed address lies inside a chunk but is not the start of one of its blocks.
    Misaligned {
        /// The freed address.
        addr: u64,
        /// The chunk it lies in.
        chunk: Chunk,
    },
    /// The freed address is already free.
    DoubleFree {
        /// The freed address.
        addr: u64,
    },
    /// The block is handed out with another size than the one it is freed with.
    SizeMismatch {
        /// The freed address.
        addr: u64,
        /// The size it was handed out with (rounded up to 256).
        allocated: usize,
        /// The size it is freed with (rounded up to 256).
        freed: usize,
    },
    /// A block already handed out was handed out again (an internal inconsistency).
    HandedOutTwice {
        /// The block's address.
        addr: u64,
    },
}

impl fmt::Display for FixedSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBlockSize => f.write_str("fixed-size block size must not be 0"),
            Self::BlockSizeOverflow { block_size } => {
                write!(
                    f,
                    "block size {block_size} cannot be rounded up to 256 bytes"
                )
            }
            Self::EmptyChunk { addr } => write!(f, "chunk at {addr:#x} holds no blocks"),
            Self::ChunkOverflow {
                addr,
                block_size,
                count,
            } => write!(
                f,
                "chunk of {count} blocks of {block_size} bytes at {addr:#x} overflows"
            ),
            Self::ChunkOverlap { chunk, existing } => write!(
                f,
                "chunk [{:#x}, {:#x}) overlaps known chunk [{:#x}, {:#x})",
                chunk.addr,
                chunk.end(),
                existing.addr,
                existing.end()
            ),
            Self::UnknownAddress { addr } => {
                write!(
                    f,
                    "freed address {addr:#x} belongs to no chunk of this resource"
                )
            }
            Self::Misaligned { addr, chunk } => write!(
                f,
                "freed address {addr:#x} is not the start of a {}-byte block of chunk {:#x}",
                chunk.block_size, chunk.addr
            ),
            Self::DoubleFree { addr } => write!(f, "double free of block {addr:#x}"),
            Self::SizeMismatch {
                addr,
                allocated,
                freed,
            } => write!(
                f,
                "block {addr:#x} of {allocated} bytes freed with {freed} bytes"
            ),
            Self::HandedOutTwice { addr } => {
                write!(f, "block {addr:#x} is already handed out")
            }
        }
    }
}

impl std::error::Error for FixedSizeError {}

/// RMM's block size rule: `align_up(block_size, 256)`.
///
/// # Errors
///
/// [`FixedSizeError::ZeroBlockSize`] for 0, [`FixedSizeError::BlockSizeOverflow`] when the
/// rounded size does not fit in `usize`.
pub fn rounded_block_size(block_size: usize) -> Result<usize, FixedSizeError> {
    if block_size == 0 {
        return Err(FixedSizeError::ZeroBlockSize);
    }
    checked_align_up(block_size, ALLOCATION_ALIGNMENT)
        .ok_or(FixedSizeError::BlockSizeOverflow { block_size })
}

/// One upstream chunk cut into `count` blocks of `block_size` bytes starting at `addr`.
///
/// Always valid (non-zero block size and count, no overflow): built only by [`Chunk::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    addr: u64,
    block_size: usize,
    count: usize,
}

impl Chunk {
    /// First address.
    #[must_use]
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// Size of every block.
    #[must_use]
    pub const fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    #[must_use]
    pub const fn count(&self) -> usize {
        self.count
    }

    /// Validates and builds a chunk.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::ZeroBlockSize`], [`FixedSizeError::EmptyChunk`], or
    /// [`FixedSizeError::ChunkOverflow`] when its size or end overflows.
    pub fn new(addr: u64, block_size: usize, count: usize) -> Result<Self, FixedSizeError> {
        if block_size == 0 {
            return Err(FixedSizeError::ZeroBlockSize);
        }
        if count == 0 {
            return Err(FixedSizeError::EmptyChunk { addr });
        }
        let overflow = FixedSizeError::ChunkOverflow {
            addr,
            block_size,
            count,
        };
        let size = block_size.checked_mul(count).ok_or(overflow)?;
        addr.checked_add(size as u64).ok_or(overflow)?;
        Ok(Self {
            addr,
            block_size,
            count,
        })
    }

    /// Size of the chunk in bytes (`block_size * count`).
    #[must_use]
    pub const fn size(&self) -> usize {
        self.block_size * self.count
    }

    /// One past the last address of the chunk.
    #[must_use]
    pub const fn end(&self) -> u64 {
        self.addr + self.size() as u64
    }

    /// Whether `addr` lies inside the chunk.
    #[must_use]
    pub const fn contains(&self, addr: u64) -> bool {
        self.addr <= addr && addr < self.end()
    }

    /// The index of the block that starts at `addr`, or `None` when `addr` is outside the
    /// chunk or not the start of a block.
    #[must_use]
    pub fn block_index(&self, addr: u64) -> Option<usize> {
        if !self.contains(addr) {
            return None;
        }
        let offset = usize::try_from(addr - self.addr).ok()?;
        (offset % self.block_size == 0).then_some(offset / self.block_size)
    }

    /// The start addresses of the chunk's blocks, in address order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        let step = self.block_size as u64;
        (0..self.count).map(move |i| self.addr + i as u64 * step)
    }
}

/// Known chunks by start address, to check freed addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkIndex {
    chunks: BTreeMap<u64, Chunk>,
}

impl ChunkIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of chunks.
    #[must_use]
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Whether no chunk is indexed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Total bytes of all chunks.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.chunks.values().map(Chunk::size).sum()
    }

    /// The chunks in address order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Chunk> + '_ {
        self.chunks.values()
    }

    /// The chunk that contains `addr`, if any.
    #[must_use]
    pub fn chunk_of(&self, addr: u64) -> Option<&Chunk> {
        self.chunks
            .range(..=addr)
            .next_back()
            .map(|(_, c)| c)
            .filter(|c| c.contains(addr))
    }

    /// Checks that `addr` is the start of a block of an indexed chunk and returns that chunk.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::UnknownAddress`] or [`FixedSizeError::Misaligned`].
    pub fn locate(&self, addr: u64) -> Result<&Chunk, FixedSizeError> {
        let chunk = self
            .chunk_of(addr)
            .ok_or(FixedSizeError::UnknownAddress { addr })?;
        match chunk.block_index(addr) {
            Some(_) => Ok(chunk),
            None => Err(FixedSizeError::Misaligned {
                addr,
                chunk: *chunk,
            }),
        }
    }

    /// Adds a chunk. Adding the very same chunk again is a no-op returning `Ok(false)`.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::ChunkOverlap`] when it overlaps a different indexed chunk.
    pub fn insert(&mut self, chunk: Chunk) -> Result<bool, FixedSizeError> {
        match self.overlapping(&chunk) {
            Some(existing) if existing == chunk => Ok(false),
            Some(existing) => Err(FixedSizeError::ChunkOverlap { chunk, existing }),
            None => {
                self.chunks.insert(chunk.addr, chunk);
                Ok(true)
            }
        }
    }

    /// Removes and returns the chunk starting at `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<Chunk> {
        self.chunks.remove(&addr)
    }

    /// Adds every chunk of `other` (identical chunks are shared, not duplicated).
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::ChunkOverlap`] when a chunk of `other` overlaps a different chunk of
    /// `self`; `self` is then unchanged.
    pub fn merge(&mut self, other: &ChunkIndex) -> Result<(), FixedSizeError> {
        for chunk in other.iter() {
            if let Some(existing) = self.overlapping(chunk).filter(|e| e != chunk) {
                return Err(FixedSizeError::ChunkOverlap {
                    chunk: *chunk,
                    existing,
                });
            }
        }
        for chunk in other.iter() {
            self.chunks.insert(chunk.addr, *chunk);
        }
        Ok(())
    }

    /// An indexed chunk that shares at least one byte with `chunk` (possibly `chunk` itself).
    fn overlapping(&self, chunk: &Chunk) -> Option<Chunk> {
        let before = self
            .chunks
            .range(..=chunk.addr)
            .next_back()
            .map(|(_, c)| *c);
        if let Some(c) = before.filter(|c| c.end() > chunk.addr) {
            return Some(c);
        }
        // A valid chunk has `end() > addr`, so this range is well formed.
        self.chunks
            .range(chunk.addr + 1..chunk.end())
            .next()
            .map(|(_, c)| *c)
    }
}

/// FIFO free list of fixed-size blocks with double-free and bad-address detection; O(1)
/// allocate and free.
#[doc(alias = "rmm::mr::detail::fixed_size_free_list")]
#[derive(Debug, Clone, Default)]
pub struct FixedSizeFreeList {
    /// Free block addresses, oldest free first.
    blocks: VecDeque<u64>,
    /// The same addresses, for double-free detection.
    members: HashSet<u64>,
    /// Chunks added through this list (or merged in by `append`).
    chunks: ChunkIndex,
}

impl FixedSizeFreeList {
    /// An empty list.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of free blocks.
    #[must_use]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is free.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether `addr` is free in this list.
    #[must_use]
    pub fn contains(&self, addr: u64) -> bool {
        self.members.contains(&addr)
    }

    /// The free blocks in the order they will be handed out.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.blocks.iter().copied()
    }

    /// The chunks added through this list.
    #[must_use]
    pub fn chunks(&self) -> &ChunkIndex {
        &self.chunks
    }

    /// Indexes a new chunk of `count` blocks of `block_size` bytes at `addr` and appends all
    /// its blocks (in address order) to the back of the list.
    ///
    /// # Errors
    ///
    /// Those of [`Chunk::new`], [`FixedSizeError::ChunkOverlap`] when it overlaps an indexed
    /// chunk, [`FixedSizeError::DoubleFree`] when one of its blocks is already in the list.
    pub fn add_chunk(
        &mut self,
        addr: u64,
        block_size: usize,
        count: usize,
    ) -> Result<Chunk, FixedSizeError> {
        let chunk = Chunk::new(addr, block_size, count)?;
        if let Some(existing) = self.chunks.overlapping(&chunk) {
            return Err(FixedSizeError::ChunkOverlap { chunk, existing });
        }
        if let Some(addr) = chunk.blocks().find(|a| self.members.contains(a)) {
            return Err(FixedSizeError::DoubleFree { addr });
        }
        self.chunks.chunks.insert(addr, chunk);
        self.blocks.reserve(count);
        self.members.reserve(count);
        for block in chunk.blocks() {
            self.blocks.push_back(block);
            self.members.insert(block);
        }
        Ok(chunk)
    }

    /// Hands out the oldest free block (RMM's `get_block`: `pop_front`).
    #[doc(alias = "get_block")]
    pub fn pop(&mut self) -> Option<u64> {
        let addr = self.blocks.pop_front()?;
        self.members.remove(&addr);
        Some(addr)
    }

    /// Frees `addr` into this list (`push_back`), checking it against this list's chunks.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::UnknownAddress`], [`FixedSizeError::Misaligned`] or
    /// [`FixedSizeError::DoubleFree`]; the list is unchanged.
    pub fn push(&mut self, addr: u64) -> Result<(), FixedSizeError> {
        self.chunks.locate(addr)?;
        self.push_member(addr)
    }

    /// Frees `addr` into this list, checking it against `index` (a resource-wide index, for
    /// blocks that may come from chunks added to other lists).
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push).
    pub fn push_in(&mut self, addr: u64, index: &ChunkIndex) -> Result<(), FixedSizeError> {
        index.locate(addr)?;
        self.push_member(addr)
    }

    /// Moves all blocks of `other` to the back of `self` (RMM's splice), keeping their order,
    /// and merges the chunk indexes; `other` is left empty.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::DoubleFree`] when a block is free in both lists,
    /// [`FixedSizeError::ChunkOverlap`] when the chunk indexes conflict; both lists are then
    /// unchanged.
    pub fn append(&mut self, other: &mut FixedSizeFreeList) -> Result<(), FixedSizeError> {
        let (small, large) = if self.members.len() <= other.members.len() {
            (&self.members, &other.members)
        } else {
            (&other.members, &self.members)
        };
        if let Some(&addr) = small.iter().find(|a| large.contains(a)) {
            return Err(FixedSizeError::DoubleFree { addr });
        }
        self.chunks.merge(&other.chunks)?;
        other.chunks = ChunkIndex::new();
        if self.blocks.is_empty() {
            std::mem::swap(&mut self.blocks, &mut other.blocks);
            std::mem::swap(&mut self.members, &mut other.members);
        } else {
            self.blocks.append(&mut other.blocks);
            self.members.extend(other.members.drain());
        }
        Ok(())
    }

    /// Removes every block and forgets every chunk.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.members.clear();
        self.chunks = ChunkIndex::new();
    }

    fn push_member(&mut self, addr: u64) -> Result<(), FixedSizeError> {
        if !self.members.insert(addr) {
            return Err(FixedSizeError::DoubleFree { addr });
        }
        self.blocks.push_back(addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn block_size_rounding() {
        assert_eq!(rounded_block_size(0), Err(FixedSizeError::ZeroBlockSize));
        assert_eq!(rounded_block_size(1), Ok(256));
        assert_eq!(rounded_block_size(256), Ok(256));
        assert_eq!(rounded_block_size(1 << 20), Ok(1 << 20));
        assert_eq!(rounded_block_size(1000), Ok(1024));
        assert_eq!(
            rounded_block_size(usize::MAX),
            Err(FixedSizeError::BlockSizeOverflow {
                block_size: usize::MAX
            })
        );
    }

    #[test]
    fn chunk_validation_and_lookup() {
        assert_eq!(Chunk::new(0, 0, 1), Err(FixedSizeError::ZeroBlockSize));
        assert_eq!(
            Chunk::new(8, 256, 0),
            Err(FixedSizeError::EmptyChunk { addr: 8 })
        );
        assert!(matches!(
            Chunk::new(0, usize::MAX, 2),
            Err(FixedSizeError::ChunkOverflow { .. })
        ));
        assert!(matches!(
            Chunk::new(u64::MAX - 100, 256, 1),
            Err(FixedSizeError::ChunkOverflow { .. })
        ));
        let c = Chunk::new(4096, 512, 4).unwrap();
        assert_eq!((c.size(), c.end()), (2048, 6144));
        assert_eq!(c.blocks().collect::<Vec<_>>(), [4096, 4608, 5120, 5632]);
        assert_eq!(c.block_index(5120), Some(2));
        assert_eq!(c.block_index(5121), None);
        assert_eq!(c.block_index(6144), None);
        assert_eq!(c.block_index(4095), None);

        let mut idx = ChunkIndex::new();
        assert_eq!(idx.insert(c), Ok(true));
        assert_eq!(idx.insert(c), Ok(false));
        let overlapping = Chunk::new(5632, 256, 4).unwrap();
        assert_eq!(
            idx.insert(overlapping),
            Err(FixedSizeError::ChunkOverlap {
                chunk: overlapping,
                existing: c
            })
        );
        let covering = Chunk::new(0, 8192, 1).unwrap();
        assert!(idx.insert(covering).is_err());
        assert_eq!(idx.insert(Chunk::new(6144, 256, 1).unwrap()), Ok(true));
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.total_bytes(), 2048 + 256);
        assert_eq!(idx.locate(4608), Ok(&c));
        assert_eq!(
            idx.locate(4609),
            Err(FixedSizeError::Misaligned {
                addr: 4609,
                chunk: c
            })
        );
        assert_eq!(
            idx.locate(100),
            Err(FixedSizeError::UnknownAddress { addr: 100 })
        );
        assert_eq!(
            idx.locate(6400),
            Err(FixedSizeError::UnknownAddress { addr: 6400 })
        );
        assert_eq!(idx.remove(6144).map(|c| c.count()), Some(1));
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn fifo_order_and_checks() {
        let mut l = FixedSizeFreeList::new();
        l.add_chunk(1 << 20, 256, 3).unwrap();
        assert_eq!(l.len(), 3);
        let a = l.pop().unwrap();
        let b = l.pop().unwrap();
        assert_eq!((a, b), (1 << 20, (1 << 20) + 256));
        l.push(a).unwrap();
        assert_eq!(l.iter().collect::<Vec<_>>(), [(1 << 20) + 512, 1 << 20]);
        assert_eq!(l.push(a), Err(FixedSizeError::DoubleFree { addr: a }));
        assert!(matches!(
            l.push(b + 1),
            Err(FixedSizeError::Misaligned { .. })
        ));
        assert_eq!(l.push(0), Err(FixedSizeError::UnknownAddress { addr: 0 }));
        assert_eq!(l.len(), 2);
        assert!(l.contains(a) && !l.contains(b));
        assert_eq!(l.pop(), Some((1 << 20) + 512));
        assert_eq!(l.pop(), Some(1 << 20));
        assert_eq!(l.pop(), None);
        assert!(l.is_empty());
        l.push(b).unwrap();
        assert_eq!(l.pop(), Some(b));
        // Re-adding a known chunk or an overlapping one is refused.
        assert!(matches!(
            l.add_chunk(1 << 20, 256, 3),
            Err(FixedSizeError::ChunkOverlap { .. })
        ));
        assert!(matches!(
            l.add_chunk((1 << 20) + 512, 256, 3),
            Err(FixedSizeError::ChunkOverlap { .. })
        ));
        assert!(l.is_empty());
        l.clear();
        assert!(l.chunks().is_empty());
    }

    #[test]
    fn append_splices_in_order_and_detects_double_free() {
        let mut a = FixedSizeFreeList::new();
        let mut b = FixedSizeFreeList::new();
        a.add_chunk(0, 256, 2).unwrap();
        b.add_chunk(4096, 256, 2).unwrap();
        a.append(&mut b).unwrap();
        assert!(b.is_empty() && b.chunks().is_empty());
        assert_eq!(a.iter().collect::<Vec<_>>(), [0, 256, 4096, 4352]);
        assert_eq!(a.chunks().len(), 2);
        // A block freed on two lists is caught by the merge; both lists stay as they were.
        let x = a.pop().unwrap();
        let mut c = FixedSizeFreeList::new();
        c.push_in(x, a.chunks()).unwrap();
        a.push(x).unwrap();
        let before = a.iter().collect::<Vec<_>>();
        assert_eq!(
            a.append(&mut c),
            Err(FixedSizeError::DoubleFree { addr: x })
        );
        assert_eq!(a.iter().collect::<Vec<_>>(), before);
        assert_eq!(c.len(), 1);
        // Conflicting chunk indexes are refused too.
        let mut d = FixedSizeFreeList::new();
        d.add_chunk(128, 512, 1).unwrap();
        assert!(matches!(
            a.append(&mut d),
            Err(FixedSizeError::ChunkOverlap { .. })
        ));
        assert_eq!(d.len(), 1);
        // Appending into an empty list keeps the order.
        let mut e = FixedSizeFreeList::new();
        e.append(&mut a).unwrap();
        assert_eq!(e.iter().collect::<Vec<_>>(), before);
        assert!(a.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { l: usize, count: usize, gap: bool },
        Free { l: usize, i: usize },
        DoubleFree { i: usize },
        BadFree { i: usize, offset: u64 },
        Append { a: usize, b: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..2usize, 1..5usize, any::<bool>())
                .prop_map(|(l, count, gap)| Op::Alloc { l, count, gap }),
            4 => (0..2usize, any::<usize>()).prop_map(|(l, i)| Op::Free { l, i }),
            1 => any::<usize>().prop_map(|i| Op::DoubleFree { i }),
            1 => (any::<usize>(), 1..512u64).prop_map(|(i, offset)| Op::BadFree { i, offset }),
            1 => (0..2usize, 0..2usize).prop_map(|(a, b)| Op::Append { a, b }),
        ]
    }

    const BLOCK: usize = 512;

    proptest! {
        #[test]
        fn fixed_size_model(ops in proptest::collection::vec(op(), 1..150)) {
            let mut lists = [FixedSizeFreeList::new(), FixedSizeFreeList::new()];
            let mut model: [VecDeque<u64>; 2] = [VecDeque::new(), VecDeque::new()];
            let mut global = ChunkIndex::new();
            let mut live: Vec<u64> = Vec::new();
            let mut next_addr = 1u64 << 20;
            for op in ops {
                match op {
                    Op::Alloc { l, count, gap } => {
                        if lists[l].is_empty() {
                            if gap {
                                next_addr += 4096;
                            }
                            let chunk = lists[l].add_chunk(next_addr, BLOCK, count).unwrap();
                            global.insert(chunk).unwrap();
                            model[l].extend(chunk.blocks());
                            next_addr = chunk.end();
                        }
                        let got = lists[l].pop();
                        prop_assert_eq!(got, model[l].pop_front());
                        let got = got.unwrap();
                        prop_assert!(!live.contains(&got), "handed out twice");
                        live.push(got);
                    }
                    Op::Free { l, i } => {
                        if !live.is_empty() {
                            let addr = live.swap_remove(i % live.len());
                            if lists[l].chunks().locate(addr).is_ok() {
                                lists[l].push(addr).unwrap();
                            } else {
                                prop_assert_eq!(
                                    lists[l].push(addr),
                                    Err(FixedSizeError::UnknownAddress { addr })
                                );
                                lists[l].push_in(addr, &global).unwrap();
                            }
                            model[l].push_back(addr);
                        }
                    }
                    Op::DoubleFree { i } => {
                        let free: Vec<(usize, u64)> = (0..2)
                            .flat_map(|l| model[l].iter().map(move |&a| (l, a)))
                            .collect();
                        if !free.is_empty() {
                            let (l, addr) = free[i % free.len()];
                            prop_assert_eq!(
                                lists[l].push_in(addr, &global),
                                Err(FixedSizeError::DoubleFree { addr })
                            );
                        }
                    }
                    Op::BadFree { i, offset } => {
                        if !live.is_empty() {
                            let addr = live[i % live.len()] + offset;
                            let l = i % 2;
                            let err = lists[l].push_in(addr, &global).unwrap_err();
                            let bad_address = matches!(
                                err,
                                FixedSizeError::Misaligned { .. } | FixedSizeError::UnknownAddress { .. }
                            );
                            prop_assert!(bad_address, "unexpected error {:?}", err);
                        }
                    }
                    Op::Append { a, b } => {
                        if a != b {
                            let mut other = std::mem::take(&mut lists[b]);
                            lists[a].append(&mut other).unwrap();
                            prop_assert!(other.is_empty());
                            let moved = std::mem::take(&mut model[b]);
                            model[a].extend(moved);
                        }
                    }
                }
                for l in 0..2 {
                    prop_assert_eq!(lists[l].iter().collect::<Vec<_>>(), model[l].iter().copied().collect::<Vec<_>>());
                    prop_assert_eq!(lists[l].len(), model[l].len());
                }
                let free = lists[0].len() + lists[1].len();
                prop_assert_eq!(free + live.len(), global.total_bytes() / BLOCK);
            }
            // Free everything: every block of every chunk is free exactly once.
            for addr in live.drain(..) {
                lists[0].push_in(addr, &global).unwrap();
            }
            let mut other = std::mem::take(&mut lists[1]);
            lists[0].append(&mut other).unwrap();
            let mut all: Vec<u64> = lists[0].iter().collect();
            all.sort_unstable();
            let mut expected: Vec<u64> = global.iter().flat_map(|c| c.blocks().collect::<Vec<_>>()).collect();
            expected.sort_unstable();
            prop_assert_eq!(all, expected);
            prop_assert_eq!(lists[0].chunks(), &global);
        }
    }
}
