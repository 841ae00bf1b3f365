//! The pool's per-stream free list: RMM's coalescing best-fit free list with boundary tags
//! instead of an ordered address index. The free blocks live in a slab; two open-addressing
//! tables ([`AddrTable`]) map the start and the end address of every free block to its slot,
//! so a freed block finds the free block that ends where it starts and the one that starts
//! where it ends with two O(1) lookups, with no ordered search; best fit goes through the size
//! classes of [`SizeIndex`] (ties to the lowest address, RMM's choice). Always maximally
//! coalesced, except that blocks of different upstream chunks never merge: the same blocks,
//! the same answers as [`CoalescingFreeList`] for the same operations (the model test below
//! checks it).
//!
//! What it gives up is the ordered index's check that a freed block overlaps no free block
//! anywhere: it refuses a block that starts or ends where a free block starts or ends (the
//! same block freed twice, or one sharing an edge with a free one), and trusts its caller for
//! the rest. The pool frees into it only blocks its record of handed-out blocks has just
//! confirmed and forgotten (`crate::pool::engine::handed`): a wrong free (unknown pointer,
//! double free, wrong size, a pointer inside a block) is refused there, before the list sees
//! it, so the list's check is a second line of defence against an internal inconsistency.
//! Queries by position (`holds`, iteration in address order, merging two lists) scan the slab:
//! they are the cold paths (a rejected free's classification, stealing, release, tests).
//!
//! Pure bookkeeping: no CUDA calls; addresses are `u64`, sizes `usize`.
//!
//! [`CoalescingFreeList`]: crate::testing::coalescing_model::CoalescingFreeList

use std::fmt;

use super::size_index::{NodeId, SizeIndex};
use crate::util::addr_table::AddrTable;

/// A contiguous range of pool memory: `[addr, addr + size)`.
///
/// `is_head` marks the first byte of an upstream chunk; a block that starts a chunk never
/// coalesces with the block before it.
#[doc(alias = "rmm::mr::detail::block")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    /// First address of the block.
    pub addr: u64,
    /// Size of the block in bytes.
    pub size: usize,
    /// Whether `addr` is the first byte of an upstream chunk.
    pub is_head: bool,
}

impl Block {
    /// A block of `size` bytes at `addr`.
    #[must_use]
    pub const fn new(addr: u64, size: usize, is_head: bool) -> Self {
        Self {
            addr,
            size,
            is_head,
        }
    }

    /// One past the last address of the block (saturating at `u64::MAX`; a
    /// free list never holds a block whose end would overflow).
    #[must_use]
    pub const fn end(&self) -> u64 {
        self.addr.saturating_add(self.size as u64)
    }

    /// One past the last address, or `None` when `addr + size` overflows `u64`.
    #[must_use]
    pub const fn checked_end(&self) -> Option<u64> {
        self.addr.checked_add(self.size as u64)
    }
}

/// Why a block could not be put into a free list. The list is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FreeListError {
    /// The block overlaps a block that is already free: a double free (or a free of a range
    /// that was never handed out).
    Overlap {
        /// The block that was being inserted.
        block: Block,
        /// A free block it overlaps.
        existing: Block,
    },
    /// The block has size 0 (nothing to free; a caller bug).
    ZeroSize {
        /// Its address.
        addr: u64,
    },
    /// `addr + size` overflows the address space.
    AddressOverflow {
        /// The block that was being inserted.
        block: Block,
    },
}

impl fmt::Display for FreeListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overlap { block, existing } => write!(
                f,
                "freed block [{:#x}, +{}) overlaps free block [{:#x}, +{}) (double free?)",
                block.addr, block.size, existing.addr, existing.size
            ),
            Self::ZeroSize { addr } => write!(f, "freed block at {addr:#x} has size 0"),
            Self::AddressOverflow { block } => write!(
                f,
                "freed block [{:#x}, +{}) extends past the end of the address space",
                block.addr, block.size
            ),
        }
    }
}

impl std::error::Error for FreeListError {}

/// A free block in the list's slab.
#[derive(Debug, Clone, Copy, Default)]
struct Node {
    addr: u64,
    end: u64,
    is_head: bool,
}

impl Node {
    #[inline]
    fn block(&self) -> Block {
        // The list only holds blocks whose size is a `usize`.
        Block::new(self.addr, (self.end - self.addr) as usize, self.is_head)
    }
}

/// Free blocks by start address: a table from start address to slot, in which at most one
/// block, the last one whose start moved (a split takes the front of a block, a merge extends
/// one backwards), may still be filed under its former start (`moved`): a pool's most frequent
/// pattern, a block split off and freed again, then moves a start and moves it back without
/// touching the table. Every lookup checks the slot's current start, so a former start never
/// answers.
#[derive(Debug, Clone, Default)]
struct StartIndex {
    table: AddrTable<NodeId>,
    /// `(key, slot)`: the block in `slot` is filed under `key`, which may not be its start.
    moved: Option<(u64, NodeId)>,
}

impl StartIndex {
    /// The block that starts at `addr`.
    #[inline(always)]
    fn get(&self, addr: u64, nodes: &[Node]) -> Option<NodeId> {
        if let Some((_, m)) = self.moved {
            if nodes[m as usize].addr == addr {
                return Some(m);
            }
        }
        self.table
            .get(addr)
            .filter(|&n| nodes[n as usize].addr == addr)
    }

    /// Files the new block `n` (starting at `addr`).
    #[inline(always)]
    fn insert(&mut self, addr: u64, n: NodeId, nodes: &[Node]) {
        if self.moved.is_some_and(|(k, _)| k == addr) {
            self.flush(nodes);
        }
        self.table.insert(addr, n);
    }

    /// Forgets block `n` (before its slot is reused).
    #[inline(always)]
    fn remove(&mut self, n: NodeId, nodes: &[Node]) {
        let key = match self.moved {
            Some((k, m)) if m == n => {
                self.moved = None;
                k
            }
            _ => nodes[n as usize].addr,
        };
        self.table.remove_if(key, |_| true).ok();
    }

    /// Block `n`'s start changed from `old` to its current one.
    #[inline(always)]
    fn moved(&mut self, n: NodeId, old: u64, nodes: &[Node]) {
        match self.moved {
            Some((k, m)) if m == n => {
                if nodes[n as usize].addr == k {
                    self.moved = None;
                }
            }
            _ => {
                self.flush(nodes);
                self.moved = Some((old, n));
            }
        }
    }

    /// Files the moved block under its current start.
    fn flush(&mut self, nodes: &[Node]) {
        if let Some((k, m)) = self.moved.take() {
            let addr = nodes[m as usize].addr;
            if addr != k {
                self.table.remove_if(k, |_| true).ok();
                self.table.insert(addr, m);
            }
        }
    }
}

/// Free blocks of one pool stream list, coalesced on insert, handed out best fit; O(1)
/// expected per insertion (two table lookups) plus the size index's work. See the [module
/// documentation](self).
#[derive(Debug, Clone, Default)]
pub(crate) struct BoundaryFreeList {
    /// Start address of every free block → its slot.
    by_start: StartIndex,
    /// End address (one past the last byte) of every free block → its slot.
    by_end: AddrTable<NodeId>,
    /// The blocks; `spare` lists the unused slots.
    nodes: Vec<Node>,
    spare: Vec<NodeId>,
    /// `(size, addr)` of every free block, for best fit.
    sizes: SizeIndex,
}

impl BoundaryFreeList {
    /// Number of free blocks.
    pub(crate) fn len(&self) -> usize {
        self.by_end.len()
    }

    /// Whether no block is free.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A largest free block (the one with the highest address among equals), left in the list.
    pub(crate) fn largest(&self) -> Option<Block> {
        let (_, _, n) = self.sizes.largest()?;
        Some(self.node(n).block())
    }

    /// The free blocks in address order (a scan and a sort: tests and cold paths).
    pub(crate) fn blocks(&self) -> Vec<Block> {
        let mut out: Vec<Block> = self
            .by_start
            .table
            .values()
            .map(|n| self.node(n).block())
            .collect();
        out.sort_unstable_by_key(|b| b.addr);
        out
    }

    /// Whether `addr` lies inside a free block (a scan: the classification of a rejected free).
    pub(crate) fn holds(&self, addr: u64) -> bool {
        addr.checked_add(1)
            .is_some_and(|end| self.holding(addr, end).is_some())
    }

    /// The free block that holds all of `[addr, end)`, if any (a scan: cold paths).
    fn holding(&self, addr: u64, end: u64) -> Option<Block> {
        self.by_start
            .table
            .values()
            .map(|n| self.node(n).block())
            .find(|b| b.addr <= addr && end <= b.end())
    }

    /// Returns `block` to the list, merging it with the free block that ends at `block.addr`
    /// (unless `block` is a head) and with the one that starts at `block.end()` (unless that
    /// one is a head). A merged block keeps the head flag of its first part.
    ///
    /// # Errors
    ///
    /// [`FreeListError::Overlap`] when a free block starts where `block` starts or ends where
    /// it ends (other overlaps are the caller's to prevent: see the module documentation),
    /// [`FreeListError::ZeroSize`] and [`FreeListError::AddressOverflow`] for malformed blocks.
    /// The list is unchanged on error.
    #[inline(always)]
    pub(crate) fn insert(&mut self, block: Block) -> Result<(), FreeListError> {
        let end = end_of(block)?;
        if let Some(existing) = self.same_edge(block.addr, end) {
            return Err(FreeListError::Overlap { block, existing });
        }
        self.insert_released(block)
    }

    /// [`insert`](Self::insert) of a block its caller knows overlaps no free block (the pool's
    /// free of a block its record of handed-out blocks has just confirmed and forgotten:
    /// handed-out and free blocks never overlap): the same-edge check is skipped, saving two
    /// table lookups on every free. Debug builds (every test) still make the check and panic
    /// if it fails.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert), but never [`FreeListError::Overlap`].
    #[inline(always)]
    pub(crate) fn insert_released(&mut self, block: Block) -> Result<(), FreeListError> {
        let end = end_of(block)?;
        let prev = self.by_end.get(block.addr);
        let next = self.by_start.get(end, &self.nodes);
        debug_assert_eq!(
            self.same_edge(block.addr, end),
            None,
            "released block {block:?} shares an edge with free block"
        );
        let merge_prev = prev.filter(|_| !block.is_head);
        let merge_next = next.filter(|&n| !self.node(n).is_head);
        match (merge_prev, merge_next) {
            (_, Some(n)) => {
                // The block after it absorbs `block` (and the one before), keeping its end.
                let after = self.node(n);
                let head = match merge_prev {
                    Some(p) => {
                        let before = self.node(p);
                        self.by_end.remove_if(before.end, |_| true).ok();
                        self.by_start.remove(p, &self.nodes);
                        self.sizes
                            .remove((before.end - before.addr) as usize, before.addr);
                        self.spare.push(p);
                        before.block()
                    }
                    None => block,
                };
                let node = &mut self.nodes[n as usize];
                node.addr = head.addr;
                node.is_head = head.is_head;
                self.by_start.moved(n, after.addr, &self.nodes);
                self.sizes.replace(
                    ((after.end - after.addr) as usize, after.addr),
                    ((after.end - head.addr) as usize, head.addr),
                    n,
                );
            }
            (Some(p), None) => {
                // The block before grows to `end`.
                let before = self.node(p);
                self.by_end.remove_if(before.end, |_| true).ok();
                self.by_end.insert(end, p);
                self.nodes[p as usize].end = end;
                self.sizes.replace(
                    ((before.end - before.addr) as usize, before.addr),
                    ((end - before.addr) as usize, before.addr),
                    p,
                );
            }
            (None, None) => self.put_new(block.addr, end, block.is_head),
        }
        Ok(())
    }

    /// A free block that starts at `addr` or ends at `end`, if any.
    #[inline(always)]
    fn same_edge(&self, addr: u64, end: u64) -> Option<Block> {
        self.by_start
            .get(addr, &self.nodes)
            .or_else(|| self.by_end.get(end))
            .map(|n| self.node(n).block())
    }

    /// Best fit and split: a block of exactly `size` bytes (keeping the head flag of the block
    /// it came from), the remainder kept free. `None` for `size == 0` or when no block is large
    /// enough.
    #[inline(always)]
    pub(crate) fn allocate(&mut self, size: usize) -> Option<Block> {
        if size == 0 {
            return None;
        }
        let (class, (found, addr, n)) = self.sizes.best_fit_in_class(size)?;
        let node = self.node(n);
        if found == size {
            self.by_start.remove(n, &self.nodes);
            self.sizes.remove(found, addr);
            self.by_end.remove_if(node.end, |_| true).ok();
            self.spare.push(n);
        } else {
            // The remainder keeps the block's end. The list is maximally coalesced, so it
            // touches no free neighbour it could merge with.
            let rest = addr + size as u64;
            let slot = &mut self.nodes[n as usize];
            slot.addr = rest;
            slot.is_head = false;
            self.by_start.moved(n, addr, &self.nodes);
            self.sizes
                .replace_from(class, (found, addr), (found - size, rest), n);
        }
        Some(Block::new(addr, size, node.is_head))
    }

    /// The free block that ends exactly at `end`, if any (the VMM pool's free tail).
    pub(crate) fn block_ending_at(&self, end: u64) -> Option<Block> {
        self.by_end.get(end).map(|n| self.node(n).block())
    }

    /// If `[addr, addr + size)` lies wholly inside one free block, removes that range (the
    /// parts of the block before and after it stay free; the part before keeps the head flag)
    /// and returns `true`; otherwise changes nothing and returns `false`. With `exact`, only a
    /// free block that is exactly the range counts (one lookup: the pool's chunks start with a
    /// head, so a wholly free chunk is one block); without, the list is scanned (the VMM pool's
    /// release of a chunk that may be part of a larger free block, a cold path).
    pub(crate) fn remove_range(&mut self, addr: u64, size: usize, exact: bool) -> bool {
        let Some(end) = addr.checked_add(size as u64).filter(|_| size > 0) else {
            return false;
        };
        let found = if exact {
            self.by_start
                .get(addr, &self.nodes)
                .map(|n| self.node(n).block())
                .filter(|b| b.end() == end)
        } else {
            self.holding(addr, end)
        };
        let Some(block) = found else {
            return false;
        };
        self.remove_exact(block);
        if block.addr < addr {
            self.put_new(block.addr, addr, block.is_head);
        }
        if end < block.end() {
            self.put_new(end, block.end(), false);
        }
        true
    }

    /// Moves every block of `other` into `self` (coalescing), leaving `other` empty; the
    /// smaller list goes into the larger one.
    ///
    /// # Errors
    ///
    /// The first [`FreeListError`] met. Nothing is lost: every block is then in exactly one of
    /// the two lists (possibly with the two lists' roles swapped).
    pub(crate) fn insert_list(
        &mut self,
        other: &mut BoundaryFreeList,
    ) -> Result<(), FreeListError> {
        if other.len() > self.len() {
            std::mem::swap(self, other);
        }
        for block in other.blocks() {
            other.remove_exact(block);
            if let Err(e) = self.insert(block) {
                other.put_new(block.addr, block.end(), block.is_head);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Adds a block known not to touch a free block it could merge with.
    fn put_new(&mut self, addr: u64, end: u64, is_head: bool) {
        let n = match self.spare.pop() {
            Some(n) => {
                self.nodes[n as usize] = Node { addr, end, is_head };
                n
            }
            None => {
                self.nodes.push(Node { addr, end, is_head });
                // More free blocks than `u32::MAX` would need more host memory than a slab of
                // 2^32 nodes: 96 GiB.
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.by_start.insert(addr, n, &self.nodes);
        self.by_end.insert(end, n);
        self.sizes.insert((end - addr) as usize, addr, n);
    }

    /// Removes a block known to be in the list (its start, end and size as listed).
    fn remove_exact(&mut self, block: Block) {
        if let Some(n) = self.by_start.get(block.addr, &self.nodes) {
            self.by_start.remove(n, &self.nodes);
            self.by_end.remove_if(block.end(), |_| true).ok();
            self.sizes.remove(block.size, block.addr);
            self.spare.push(n);
        }
    }

    #[inline]
    fn node(&self, n: NodeId) -> Node {
        self.nodes[n as usize]
    }
}

/// `block`'s end, or why a list refuses it whatever it holds.
#[inline(always)]
fn end_of(block: Block) -> Result<u64, FreeListError> {
    if block.size == 0 {
        return Err(FreeListError::ZeroSize { addr: block.addr });
    }
    block
        .checked_end()
        .ok_or(FreeListError::AddressOverflow { block })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::coalescing_model::CoalescingFreeList;
    use proptest::prelude::*;

    /// What the tests read of the structure.
    impl BoundaryFreeList {
        /// Total free bytes.
        pub(crate) fn total_bytes(&self) -> usize {
            self.blocks().iter().map(|b| b.size).sum()
        }

        /// The free block that starts exactly at `addr`, if any.
        fn block_at(&self, addr: u64) -> Option<Block> {
            self.by_start
                .get(addr, &self.nodes)
                .map(|n| self.node(n).block())
        }

        /// Checks that the two tables, the size index and the slab (less its spare slots) describe
        /// the same blocks.
        fn assert_consistent(&self) {
            let blocks = self.blocks();
            assert_eq!(blocks.len(), self.len());
            assert_eq!(self.nodes.len() - self.spare.len(), self.len());
            let mut by_size: Vec<(usize, u64)> = self
                .sizes
                .entries()
                .into_iter()
                .map(|(s, a, n)| {
                    assert_eq!(self.node(n).block().size, s);
                    assert_eq!(self.node(n).addr, a);
                    (s, a)
                })
                .collect();
            by_size.sort_unstable();
            let mut listed: Vec<(usize, u64)> = blocks.iter().map(|b| (b.size, b.addr)).collect();
            listed.sort_unstable();
            assert_eq!(by_size, listed);
            assert_eq!(self.by_start.table.len(), self.len());
            for b in &blocks {
                assert_eq!(
                    self.by_start
                        .get(b.addr, &self.nodes)
                        .map(|n| self.node(n).block()),
                    Some(*b)
                );
                let n = self.by_end.get(b.end()).expect("every end is indexed");
                assert_eq!(self.node(n).block(), *b);
            }
            for w in blocks.windows(2) {
                assert!(w[0].end() <= w[1].addr, "overlap {w:?}");
                let mergeable = w[0].end() == w[1].addr && !w[1].is_head;
                assert!(!mergeable, "uncoalesced {w:?}");
            }
        }
    }

    fn blocks(l: &BoundaryFreeList) -> Vec<(u64, usize, bool)> {
        l.blocks()
            .into_iter()
            .map(|b| (b.addr, b.size, b.is_head))
            .collect()
    }

    #[test]
    fn coalesces_both_sides_but_not_across_heads() {
        let mut l = BoundaryFreeList::default();
        l.insert(Block::new(0, 256, true)).unwrap();
        l.insert(Block::new(512, 256, false)).unwrap();
        l.insert(Block::new(1024, 256, true)).unwrap();
        assert_eq!(l.len(), 3);
        // Fills the gap: merges with both neighbours.
        l.insert(Block::new(256, 256, false)).unwrap();
        // Ends at a head: stays apart from it.
        l.insert(Block::new(768, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 1024, true), (1024, 256, true)]);
        assert_eq!(l.total_bytes(), 1280);
        l.assert_consistent();
    }

    #[test]
    fn a_range_is_cut_out_of_the_free_block_holding_it() {
        let mut l = BoundaryFreeList::default();
        l.insert(Block::new(0, 4096, true)).unwrap();
        l.insert(Block::new(8192, 1024, false)).unwrap();
        assert_eq!(l.block_ending_at(4096), Some(Block::new(0, 4096, true)));
        assert_eq!(l.block_ending_at(4095), None);
        // Not wholly inside one free block: nothing changes.
        assert!(!l.remove_range(3072, 2048, false));
        assert!(!l.remove_range(5000, 256, false));
        assert!(!l.remove_range(0, 0, false));
        assert!(l.remove_range(1024, 2048, false));
        assert_eq!(
            blocks(&l),
            vec![(0, 1024, true), (3072, 1024, false), (8192, 1024, false)]
        );
        assert!(l.remove_range(8192, 1024, false));
        assert_eq!(l.total_bytes(), 2048);
        l.assert_consistent();
    }

    /// A released block coalesces exactly as an inserted one does.
    #[test]
    fn a_released_block_merges_as_an_inserted_one() {
        let mut a = BoundaryFreeList::default();
        let mut b = BoundaryFreeList::default();
        for l in [&mut a, &mut b] {
            l.insert(Block::new(0, 1024, true)).unwrap();
            l.insert(Block::new(2048, 1024, false)).unwrap();
        }
        a.insert(Block::new(1024, 1024, false)).unwrap();
        b.insert_released(Block::new(1024, 1024, false)).unwrap();
        assert_eq!(blocks(&a), vec![(0, 3072, true)]);
        assert_eq!(blocks(&a), blocks(&b));
        b.assert_consistent();
    }

    /// Debug builds still make the check a released block skips, and panic when it fails.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "shares an edge with free block")]
    fn a_released_block_sharing_an_edge_panics_in_debug_builds() {
        let mut l = BoundaryFreeList::default();
        l.insert(Block::new(4096, 1024, true)).unwrap();
        let _ = l.insert_released(Block::new(4096, 256, true));
    }

    #[test]
    fn refuses_blocks_sharing_an_edge_with_a_free_block() {
        let mut l = BoundaryFreeList::default();
        l.insert(Block::new(4096, 1024, true)).unwrap();
        let before = blocks(&l);
        for bad in [
            Block::new(4096, 1024, true),
            Block::new(4096, 256, true),
            Block::new(4864, 256, false),
        ] {
            assert!(
                matches!(l.insert(bad), Err(FreeListError::Overlap { .. })),
                "{bad:?}"
            );
            assert_eq!(blocks(&l), before);
        }
        assert!(matches!(
            l.insert(Block::new(0, 0, false)),
            Err(FreeListError::ZeroSize { .. })
        ));
        assert!(matches!(
            l.insert(Block::new(u64::MAX - 255, 512, false)),
            Err(FreeListError::AddressOverflow { .. })
        ));
        assert_eq!(blocks(&l), before);
        l.assert_consistent();
    }

    #[test]
    fn allocate_is_best_fit_with_ties_to_the_lowest_address() {
        let mut l = BoundaryFreeList::default();
        for (a, s) in [(8192, 512), (0, 1024), (4096, 512), (12288, 2048)] {
            l.insert(Block::new(a, s, true)).unwrap();
        }
        assert_eq!(l.allocate(512), Some(Block::new(4096, 512, true)));
        assert_eq!(l.allocate(256), Some(Block::new(8192, 256, true)));
        assert_eq!(l.block_at(8448), Some(Block::new(8448, 256, false)));
        assert_eq!(l.allocate(4096), None);
        assert_eq!(l.allocate(0), None);
        assert_eq!(l.largest(), Some(Block::new(12288, 2048, true)));
        assert!(l.holds(12288 + 2047) && !l.holds(12288 + 2048) && !l.holds(4096));
        assert!(!l.remove_range(0, 512, true));
        assert!(l.remove_range(0, 1024, true));
        assert_eq!(l.total_bytes(), 256 + 2048);
        l.assert_consistent();
    }

    #[test]
    fn insert_list_merges_and_keeps_every_block_on_error() {
        let mut a = BoundaryFreeList::default();
        let mut b = BoundaryFreeList::default();
        a.insert(Block::new(0, 256, true)).unwrap();
        a.insert(Block::new(1024, 256, false)).unwrap();
        b.insert(Block::new(256, 768, false)).unwrap();
        b.insert(Block::new(4096, 256, true)).unwrap();
        b.insert(Block::new(8192, 256, true)).unwrap();
        a.insert_list(&mut b).unwrap();
        assert!(b.is_empty());
        assert_eq!(
            blocks(&a),
            vec![(0, 1280, true), (4096, 256, true), (8192, 256, true)]
        );
        let mut c = BoundaryFreeList::default();
        c.insert(Block::new(4096, 256, true)).unwrap();
        c.insert(Block::new(100_000, 256, true)).unwrap();
        let total = a.total_bytes() + c.total_bytes();
        assert!(matches!(
            a.insert_list(&mut c),
            Err(FreeListError::Overlap { .. })
        ));
        assert_eq!(a.total_bytes() + c.total_bytes(), total);
        a.assert_consistent();
        c.assert_consistent();
    }

    // ---------------------------------------------------------------------------------------
    // Model test: the same valid operations on this list and on the ordered
    // `CoalescingFreeList` give the same blocks and the same answers.
    // ---------------------------------------------------------------------------------------

    const ALIGN: usize = 256;

    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate `units * 256` bytes from list `s`, growing by a chunk when nothing fits.
        Alloc { s: usize, units: usize, gap: bool },
        /// Free live block `i % live.len()` into list `s`.
        Free { s: usize, i: usize },
        /// Merge list `b` into list `a`.
        Merge { a: usize, b: usize },
        /// Remove wholly free chunks.
        Release,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..2usize, 1..40usize, any::<bool>())
                .prop_map(|(s, units, gap)| Op::Alloc { s, units, gap }),
            4 => (0..2usize, any::<usize>()).prop_map(|(s, i)| Op::Free { s, i }),
            1 => (0..2usize, 0..2usize).prop_map(|(a, b)| Op::Merge { a, b }),
            1 => Just(Op::Release),
        ]
    }

    fn same(fast: &BoundaryFreeList, model: &CoalescingFreeList) {
        assert_eq!(fast.blocks(), model.iter().collect::<Vec<_>>());
        assert_eq!(fast.total_bytes(), model.total_bytes());
        assert_eq!(fast.len(), model.len());
        assert_eq!(fast.largest(), model.largest());
        fast.assert_consistent();
    }

    proptest! {
        #[test]
        fn agrees_with_the_ordered_list(ops in proptest::collection::vec(op(), 1..200)) {
            let mut fast = [BoundaryFreeList::default(), BoundaryFreeList::default()];
            let mut model = [CoalescingFreeList::new(), CoalescingFreeList::new()];
            let mut chunks: Vec<(u64, usize)> = Vec::new();
            let mut live: Vec<Block> = Vec::new();
            let mut next = 1u64 << 20;
            for op in ops {
                match op {
                    Op::Alloc { s, units, gap } => {
                        let size = units * ALIGN;
                        let got = fast[s].allocate(size);
                        prop_assert_eq!(got, model[s].allocate(size));
                        let block = match got {
                            Some(b) => b,
                            None => {
                                if gap {
                                    next += 4096;
                                }
                                let chunk = size * 2;
                                chunks.push((next, chunk));
                                fast[s].insert(Block::new(next, chunk, true)).unwrap();
                                model[s].insert(Block::new(next, chunk, true)).unwrap();
                                next += chunk as u64;
                                let b = fast[s].allocate(size);
                                prop_assert_eq!(b, model[s].allocate(size));
                                b.unwrap()
                            }
                        };
                        live.push(block);
                    }
                    Op::Free { s, i } => {
                        if !live.is_empty() {
                            let b = live.swap_remove(i % live.len());
                            fast[s].insert(b).unwrap();
                            model[s].insert(b).unwrap();
                            // The same block again is refused while an edge of it is an edge
                            // of a free block (merged on both sides, only the record of
                            // handed-out blocks can tell).
                            if fast[s].block_at(b.addr).is_some()
                                || fast[s].by_end.get(b.end()).is_some()
                            {
                                prop_assert!(fast[s].insert(b).is_err());
                            }
                        }
                    }
                    Op::Merge { a, b } => {
                        if a != b {
                            let mut other = std::mem::take(&mut fast[b]);
                            fast[a].insert_list(&mut other).unwrap();
                            prop_assert!(other.is_empty());
                            let mut other = std::mem::take(&mut model[b]);
                            model[a].insert_list(&mut other).unwrap();
                        }
                    }
                    Op::Release => {
                        let mut kept = Vec::new();
                        for (addr, size) in chunks.drain(..) {
                            let mut removed = false;
                            for s in 0..2 {
                                let r = fast[s].remove_range(addr, size, true);
                                prop_assert_eq!(r, model[s].remove_chunk(addr, size));
                                removed |= r;
                            }
                            if !removed {
                                kept.push((addr, size));
                            }
                        }
                        chunks = kept;
                    }
                }
                for s in 0..2 {
                    same(&fast[s], &model[s]);
                    for addr in (0..8).map(|k| (1u64 << 20) + k * 1536) {
                        prop_assert_eq!(fast[s].holds(addr), model[s].contains_range(addr, 0));
                    }
                }
            }
        }
    }
}
