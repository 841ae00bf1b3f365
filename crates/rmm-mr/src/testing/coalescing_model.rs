//! A test model of the pool's free list: the coalescing best-fit free list (RMM's
//! `coalescing_free_list`) with an ordered address index, in O(log n), which the pool's boundary
//! list (`BoundaryFreeList`, `pool/engine/boundary_list.rs`) must match operation for
//! operation (its model test). Not used by any resource: the
//! blocks in a slab, indexed twice: by end address (a `BTreeMap`, to find and coalesce
//! neighbours and catch overlapping frees) and by `(size, addr)` in size classes
//! (`SizeIndex`, for best fit with ties to the lowest address, RMM's choice). Always maximally
//! coalesced, except that blocks of different upstream chunks never merge. Design:
//! `docs/internals/pool.md`.
//!
//! Pure bookkeeping: no CUDA calls; addresses are `u64`, sizes `usize`.

use std::collections::BTreeMap;
use std::ops::Bound;

pub use crate::pool::engine::{Block, FreeListError};
use crate::pool::engine::{NodeId, SizeIndex};

/// A free block in the list's slab.
#[derive(Debug, Clone, Copy)]
struct Node {
    addr: u64,
    end: u64,
    is_head: bool,
}

impl Node {
    fn block(&self) -> Block {
        // The list only holds blocks whose size is a `usize`.
        Block::new(self.addr, (self.end - self.addr) as usize, self.is_head)
    }
}

/// Free blocks of the pool, coalesced on insert, handed out best fit; O(log n) per operation,
/// and for the common cases of a pool (a block split from the front of a larger one, a block
/// freed next to a free one) one search of the address index at most.
///
/// See the module documentation for the design.
#[doc(alias = "rmm::mr::detail::coalescing_free_list")]
#[derive(Debug, Clone, Default)]
pub struct CoalescingFreeList {
    /// Free blocks by *end* address (blocks never overlap, so this is also address order), to
    /// their node. Keyed by the end, the two most frequent changes keep their key: the
    /// remainder of a split (allocation takes the front of a block) and a freed block merging
    /// into the free block after it. Both update the node in place.
    by_end: BTreeMap<u64, NodeId>,
    /// The blocks; `spare` lists the unused slots.
    nodes: Vec<Node>,
    spare: Vec<NodeId>,
    /// `(size, addr)` of every free block, for best fit.
    sizes: SizeIndex,
    /// Sum of the sizes of all free blocks.
    total: usize,
}

impl CoalescingFreeList {
    /// An empty list.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of free blocks.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_end.len()
    }

    /// Whether no block is free.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_end.is_empty()
    }

    /// Total free bytes (kept incrementally, O(1)).
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// A largest free block (the one with the highest address among equals), left in the list.
    #[must_use]
    pub fn largest(&self) -> Option<Block> {
        let (_, _, n) = self.sizes.largest()?;
        Some(self.node(n).block())
    }

    /// `(largest block size, total free bytes)`, RMM's `free_list_summary`; O(1).
    #[doc(alias = "free_list_summary")]
    #[must_use]
    pub fn summary(&self) -> (usize, usize) {
        (self.largest().map_or(0, |b| b.size), self.total)
    }

    /// The free blocks in address order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Block> + ExactSizeIterator + '_ {
        self.by_end.values().map(|&n| self.node(n).block())
    }

    /// The free block that starts exactly at `addr`, if any.
    #[must_use]
    pub fn block_at(&self, addr: u64) -> Option<Block> {
        self.ending_after(addr).filter(|b| b.addr == addr)
    }

    /// Whether `[addr, addr + size)` lies entirely inside one free block (for `size == 0`:
    /// whether `addr` lies inside a free block).
    #[must_use]
    pub fn contains_range(&self, addr: u64, size: usize) -> bool {
        let Some(end) = addr.checked_add(size as u64) else {
            return false;
        };
        self.ending_after(addr)
            .is_some_and(|b| b.addr <= addr && end <= b.end())
    }

    /// A free block that shares at least one byte with `[addr, addr + size)`, if any
    /// (`None` for `size == 0`). Use it to detect a double free across several lists.
    #[must_use]
    pub fn overlapping(&self, addr: u64, size: usize) -> Option<Block> {
        if size == 0 {
            return None;
        }
        let end = addr.saturating_add(size as u64);
        // The block containing `addr`, else the first one after it.
        self.ending_after(addr).filter(|b| b.addr < end)
    }

    /// Returns `block` to the list, merging it with the free block before it (if that one ends
    /// at `block.addr` and `block` is not a head) and with the one after it (if it starts at
    /// `block.end()` and is not a head). A merged block keeps the head flag of its first part.
    ///
    /// # Errors
    ///
    /// [`FreeListError::Overlap`] when the block overlaps a free block (a double free),
    /// [`FreeListError::ZeroSize`] and [`FreeListError::AddressOverflow`] for malformed blocks.
    /// The list is unchanged on error.
    #[inline]
    pub fn insert(&mut self, block: Block) -> Result<(), FreeListError> {
        if block.size == 0 {
            return Err(FreeListError::ZeroSize { addr: block.addr });
        }
        let Some(end) = block.checked_end() else {
            return Err(FreeListError::AddressOverflow { block });
        };
        // One descent: the blocks ending at or after `block.addr`. The first one is the block
        // before (when it ends exactly at `block.addr`); the first one ending after
        // `block.addr` either overlaps `block` or is the block after it.
        let mut from = self.by_end.range(block.addr..);
        let mut first = from.next().map(|(&e, &n)| (e, n));
        let prev = match first {
            Some((e, n)) if e == block.addr => {
                first = from.next().map(|(&e, &n)| (e, n));
                Some(n)
            }
            _ => None,
        };
        if let Some((_, n)) = first {
            let next = self.node(n);
            if next.addr < end {
                return Err(FreeListError::Overlap {
                    block,
                    existing: next.block(),
                });
            }
        }
        let merge_prev = prev.filter(|_| !block.is_head);
        let merge_next = first
            .map(|(_, n)| n)
            .filter(|&n| self.node(n).addr == end && !self.node(n).is_head);
        self.total += block.size;
        match (merge_prev, merge_next) {
            (_, Some(next)) => {
                // The block after it absorbs `block` (and the one before), keeping its key.
                let after = self.node(next);
                let head = match merge_prev {
                    Some(p) => {
                        let before = self.node(p);
                        self.by_end.remove(&before.end);
                        self.sizes
                            .remove((before.end - before.addr) as usize, before.addr);
                        self.free_node(p);
                        before.block()
                    }
                    None => block,
                };
                let node = &mut self.nodes[next as usize];
                node.addr = head.addr;
                node.is_head = head.is_head;
                self.sizes.replace(
                    ((after.end - after.addr) as usize, after.addr),
                    ((after.end - head.addr) as usize, head.addr),
                    next,
                );
            }
            (Some(p), None) => {
                // The block before grows to `end`: its key changes.
                let before = self.node(p);
                self.by_end.remove(&before.end);
                self.nodes[p as usize].end = end;
                self.by_end.insert(end, p);
                self.sizes.replace(
                    ((before.end - before.addr) as usize, before.addr),
                    ((end - before.addr) as usize, before.addr),
                    p,
                );
            }
            (None, None) => {
                let n = self.new_node(Node {
                    addr: block.addr,
                    end,
                    is_head: block.is_head,
                });
                self.by_end.insert(end, n);
                self.sizes.insert(block.size, block.addr, n);
            }
        }
        Ok(())
    }

    /// Moves every block of `other` into `self` (coalescing), leaving `other` empty.
    ///
    /// The smaller list is inserted into the larger one, so this costs
    /// O(min(n, m) · log(n + m)); an empty `self` just takes `other`'s blocks in O(1).
    ///
    /// # Errors
    ///
    /// The first [`FreeListError`] met (two lists holding overlapping blocks: a double free
    /// across lists). Nothing is lost: every block is then in exactly one of the two lists
    /// (`self` may have received part of the blocks, possibly with the two lists' roles
    /// swapped).
    pub fn insert_list(&mut self, other: &mut CoalescingFreeList) -> Result<(), FreeListError> {
        if other.len() > self.len() {
            std::mem::swap(self, other);
        }
        loop {
            let Some(block) = other.iter().next() else {
                break;
            };
            other.remove_exact(block);
            if let Err(e) = self.insert(block) {
                other.put(block);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes and returns the best-fitting block: the smallest with `size >= request`, ties
    /// to the lowest address (RMM's choice). `None` when no block is large enough.
    #[doc(alias = "get_block")]
    pub fn best_fit(&mut self, request: usize) -> Option<Block> {
        let (_, (_, _, n)) = self.sizes.best_fit_in_class(request)?;
        let block = self.node(n).block();
        self.remove_exact(block);
        Some(block)
    }

    /// Best fit and split: returns a block of exactly `size` bytes (keeping the head flag of
    /// the block it came from) and keeps the remainder free. `None` for `size == 0` or when no
    /// block is large enough.
    #[inline]
    pub fn allocate(&mut self, size: usize) -> Option<Block> {
        if size == 0 {
            return None;
        }
        let (_, (found, addr, n)) = self.sizes.best_fit_in_class(size)?;
        self.total -= size;
        let node = self.node(n);
        if found == size {
            self.sizes.remove(found, addr);
            self.by_end.remove(&node.end);
            self.free_node(n);
        } else {
            // The remainder keeps the block's end, so its key stays where it is. The list is
            // maximally coalesced, so it cannot touch a free neighbour it could merge with: the
            // block after it (if adjacent) is a head, the part before it was just handed out.
            let rest = addr + size as u64;
            let slot = &mut self.nodes[n as usize];
            slot.addr = rest;
            slot.is_head = false;
            self.sizes.replace((found, addr), (found - size, rest), n);
        }
        Some(Block::new(addr, size, node.is_head))
    }

    /// If one free block is exactly the upstream chunk `[addr, addr + size)` (the chunk is
    /// wholly free), removes it and returns `true`; otherwise changes nothing and returns
    /// `false`. Used to hand fully free chunks back to the upstream.
    pub fn remove_chunk(&mut self, addr: u64, size: usize) -> bool {
        match self.block_at(addr) {
            Some(block) if block.size == size => {
                self.remove_exact(block);
                true
            }
            _ => false,
        }
    }

    /// The free block that ends exactly at `end`, if any.
    #[must_use]
    pub fn block_ending_at(&self, end: u64) -> Option<Block> {
        self.by_end.get(&end).map(|&n| self.node(n).block())
    }

    /// If `[addr, addr + size)` lies inside one free block, cuts it out of that block and
    /// returns `true` (what was before it stays free with the block's head flag, what was after
    /// it stays free as a non-head block); otherwise changes nothing and returns `false`. The
    /// range need not be a whole block: this is how a resource whose chunks coalesce (the VMM
    /// pool) takes back a wholly free chunk from inside a larger free block.
    pub fn remove_range(&mut self, addr: u64, size: usize) -> bool {
        if size == 0 || !self.contains_range(addr, size) {
            return false;
        }
        let Some(block) = self.ending_after(addr) else {
            return false;
        };
        let end = addr + size as u64;
        self.remove_exact(block);
        if block.addr < addr {
            self.put(Block::new(
                block.addr,
                (addr - block.addr) as usize,
                block.is_head,
            ));
        }
        if end < block.end() {
            self.put(Block::new(end, (block.end() - end) as usize, false));
        }
        true
    }

    /// Removes every block.
    pub fn clear(&mut self) {
        self.by_end.clear();
        self.nodes.clear();
        self.spare.clear();
        self.sizes = SizeIndex::default();
        self.total = 0;
    }

    /// The free block with the lowest end above `addr`: the block containing `addr` if there
    /// is one, else the first block after it.
    fn ending_after(&self, addr: u64) -> Option<Block> {
        self.by_end
            .range((Bound::Excluded(addr), Bound::Unbounded))
            .next()
            .map(|(_, &n)| self.node(n).block())
    }

    /// Adds a block known not to overlap or touch a mergeable neighbour.
    fn put(&mut self, block: Block) {
        let n = self.new_node(Node {
            addr: block.addr,
            end: block.end(),
            is_head: block.is_head,
        });
        self.by_end.insert(block.end(), n);
        self.sizes.insert(block.size, block.addr, n);
        self.total += block.size;
    }

    /// Removes a block known to be in the list.
    fn remove_exact(&mut self, block: Block) {
        if let Some(n) = self.by_end.remove(&block.end()) {
            self.free_node(n);
        }
        self.sizes.remove(block.size, block.addr);
        self.total -= block.size;
    }

    #[inline]
    fn node(&self, n: NodeId) -> Node {
        self.nodes[n as usize]
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        match self.spare.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                // More free blocks than `u32::MAX` would need more host memory than a slab of
                // 2^32 nodes: 96 GiB.
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    fn free_node(&mut self, n: NodeId) {
        self.spare.push(n);
    }
}

#[cfg(test)]
impl CoalescingFreeList {
    /// Checks that the address index, the size index, the slab and the total describe the same
    /// blocks.
    fn assert_indexes_agree(&self) {
        let mut by_size: Vec<(usize, u64, NodeId)> = self.sizes.entries();
        by_size.sort_unstable();
        let mut listed: Vec<(usize, u64, NodeId)> = self
            .by_end
            .iter()
            .map(|(&end, &n)| {
                let node = self.node(n);
                assert_eq!(node.end, end, "node {n} is keyed by another end");
                assert!(node.addr < end);
                (node.block().size, node.addr, n)
            })
            .collect();
        listed.sort_unstable();
        assert_eq!(by_size, listed, "size index out of step");
        assert_eq!(self.iter().map(|b| b.size).sum::<usize>(), self.total);
        assert_eq!(
            self.nodes.len(),
            self.by_end.len() + self.spare.len(),
            "slab leak"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blocks(list: &CoalescingFreeList) -> Vec<(u64, usize, bool)> {
        list.iter().map(|b| (b.addr, b.size, b.is_head)).collect()
    }

    #[test]
    fn block_end() {
        let b = Block::new(0x1000, 1024, true);
        assert_eq!((b.end(), b.checked_end()), (0x1400, Some(0x1400)));
        assert_eq!(Block::new(u64::MAX, 2, false).end(), u64::MAX);
        assert_eq!(Block::new(u64::MAX, 2, false).checked_end(), None);
    }

    #[test]
    fn insert_coalesces_all_four_cases() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 256, true)).unwrap();
        // Plain insert (gap).
        l.insert(Block::new(1024, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 256, true), (1024, 256, false)]);
        // Merge with previous only.
        l.insert(Block::new(256, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 512, true), (1024, 256, false)]);
        // Merge with next only.
        l.insert(Block::new(768, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 512, true), (768, 512, false)]);
        // Merge with both.
        l.insert(Block::new(512, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 1280, true)]);
        assert_eq!(l.total_bytes(), 1280);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn heads_never_merge_with_previous() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 512, true)).unwrap();
        l.insert(Block::new(512, 512, true)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 512, true), (512, 512, true)]);
        // A non-head block between merges only with its non-head side.
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 256, true)).unwrap();
        l.insert(Block::new(512, 256, true)).unwrap();
        l.insert(Block::new(256, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 512, true), (512, 256, true)]);
    }

    #[test]
    fn overlap_is_rejected_and_list_unchanged() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(1024, 1024, true)).unwrap();
        l.insert(Block::new(4096, 256, false)).unwrap();
        let before = blocks(&l);
        for bad in [
            Block::new(1024, 1024, true), // exact double free
            Block::new(1280, 256, false), // inside
            Block::new(768, 512, false),  // overlaps the start
            Block::new(1792, 512, false), // overlaps the end
            Block::new(512, 4096, false), // covers both
            Block::new(3840, 512, false), // overlaps the second from before
        ] {
            let err = l.insert(bad).unwrap_err();
            assert!(matches!(err, FreeListError::Overlap { block, .. } if block == bad));
            assert_eq!(blocks(&l), before);
            assert_eq!(l.total_bytes(), 1280);
        }
        assert_eq!(
            l.insert(Block::new(0, 0, false)),
            Err(FreeListError::ZeroSize { addr: 0 })
        );
        let huge = Block::new(u64::MAX - 10, 256, false);
        assert_eq!(
            l.insert(huge),
            Err(FreeListError::AddressOverflow { block: huge })
        );
        assert!(l
            .insert(Block::new(1024, 256, false))
            .unwrap_err()
            .to_string()
            .contains("double free"));
        assert_eq!(blocks(&l), before);
    }

    #[test]
    fn best_fit_picks_smallest_then_lowest_address() {
        let mut l = CoalescingFreeList::new();
        for (addr, size) in [(0u64, 2048usize), (4096, 512), (8192, 1024), (12288, 512)] {
            l.insert(Block::new(addr, size, true)).unwrap();
        }
        assert_eq!(l.best_fit(300), Some(Block::new(4096, 512, true)));
        assert_eq!(l.best_fit(512), Some(Block::new(12288, 512, true)));
        assert_eq!(l.best_fit(513), Some(Block::new(8192, 1024, true)));
        assert_eq!(l.best_fit(4096), None);
        assert_eq!(l.best_fit(2048), Some(Block::new(0, 2048, true)));
        assert!(l.is_empty());
        assert_eq!(l.total_bytes(), 0);
    }

    #[test]
    fn allocate_splits_and_keeps_remainder() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 4096, true)).unwrap();
        let a = l.allocate(1024).unwrap();
        assert_eq!(a, Block::new(0, 1024, true));
        assert_eq!(blocks(&l), vec![(1024, 3072, false)]);
        let b = l.allocate(3072).unwrap();
        assert_eq!(b, Block::new(1024, 3072, false));
        assert!(l.is_empty());
        assert_eq!(l.allocate(256), None);
        assert_eq!(l.allocate(0), None);
        l.insert(b).unwrap();
        l.insert(a).unwrap();
        assert_eq!(blocks(&l), vec![(0, 4096, true)]);
    }

    #[test]
    fn queries() {
        let mut l = CoalescingFreeList::new();
        assert_eq!(l.largest(), None);
        assert_eq!(l.summary(), (0, 0));
        l.insert(Block::new(0, 512, true)).unwrap();
        l.insert(Block::new(1024, 2048, false)).unwrap();
        assert_eq!(l.largest(), Some(Block::new(1024, 2048, false)));
        assert_eq!(l.summary(), (2048, 2560));
        assert!(l.contains_range(1024, 2048));
        assert!(l.contains_range(1280, 256));
        assert!(!l.contains_range(256, 512));
        assert!(!l.contains_range(512, 256));
        assert!(l.contains_range(100, 0));
        assert!(!l.contains_range(u64::MAX, 2));
        assert_eq!(l.overlapping(256, 1024), Some(Block::new(0, 512, true)));
        assert_eq!(
            l.overlapping(512, 1024),
            Some(Block::new(1024, 2048, false))
        );
        assert_eq!(l.overlapping(512, 512), None);
        assert_eq!(l.overlapping(0, 0), None);
        assert_eq!(l.block_at(1024), Some(Block::new(1024, 2048, false)));
        assert_eq!(l.block_at(1025), None);
        l.clear();
        assert!(l.is_empty());
        assert_eq!(l.total_bytes(), 0);
    }

    #[test]
    fn remove_chunk_only_when_wholly_free() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 1024, true)).unwrap();
        l.insert(Block::new(1024, 512, true)).unwrap();
        l.insert(Block::new(1792, 256, false)).unwrap(); // second chunk [1024, 2048) part free
        assert!(!l.remove_chunk(1024, 1024));
        assert!(!l.remove_chunk(0, 2048));
        assert!(!l.remove_chunk(0, 512));
        assert!(l.remove_chunk(0, 1024));
        assert_eq!(blocks(&l), vec![(1024, 512, true), (1792, 256, false)]);
        assert_eq!(l.total_bytes(), 768);
    }

    #[test]
    fn remove_range_cuts_out_of_a_free_block() {
        let mut l = CoalescingFreeList::new();
        l.insert(Block::new(0, 4096, true)).unwrap();
        l.insert(Block::new(8192, 1024, false)).unwrap();
        assert_eq!(l.block_ending_at(4096), Some(Block::new(0, 4096, true)));
        assert_eq!(l.block_ending_at(4095), None);
        // Not wholly inside one free block: nothing changes.
        for (addr, size) in [(3840, 512), (4096, 256), (7936, 512), (0, 0), (u64::MAX, 2)] {
            assert!(!l.remove_range(addr, size), "{addr:#x} +{size}");
        }
        assert_eq!(l.total_bytes(), 5120);
        // The middle: both sides stay free.
        assert!(l.remove_range(1024, 1024));
        assert_eq!(
            blocks(&l),
            vec![(0, 1024, true), (2048, 2048, false), (8192, 1024, false)]
        );
        // The front and the back of a block; a whole block.
        assert!(l.remove_range(2048, 512));
        assert!(l.remove_range(3840, 256));
        assert!(l.remove_range(8192, 1024));
        assert_eq!(blocks(&l), vec![(0, 1024, true), (2560, 1280, false)]);
        assert_eq!(l.total_bytes(), 2304);
        l.assert_indexes_agree();
        // Put back, the ranges coalesce again.
        l.insert(Block::new(1024, 1536, false)).unwrap();
        l.insert(Block::new(3840, 256, false)).unwrap();
        assert_eq!(blocks(&l), vec![(0, 4096, true)]);
    }

    #[test]
    fn insert_list_merges_and_coalesces() {
        let mut a = CoalescingFreeList::new();
        let mut b = CoalescingFreeList::new();
        a.insert(Block::new(0, 256, true)).unwrap();
        a.insert(Block::new(1024, 256, false)).unwrap();
        b.insert(Block::new(256, 768, false)).unwrap();
        b.insert(Block::new(4096, 256, true)).unwrap();
        b.insert(Block::new(8192, 256, true)).unwrap();
        a.insert_list(&mut b).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.total_bytes(), 0);
        assert_eq!(
            blocks(&a),
            vec![(0, 1280, true), (4096, 256, true), (8192, 256, true)]
        );
        assert_eq!(a.total_bytes(), 1792);

        // Overlap across lists: the error is reported and no byte is lost.
        let mut c = CoalescingFreeList::new();
        c.insert(Block::new(4096, 256, true)).unwrap();
        c.insert(Block::new(100_000, 256, true)).unwrap();
        let total = a.total_bytes() + c.total_bytes();
        assert!(matches!(
            a.insert_list(&mut c),
            Err(FreeListError::Overlap { .. })
        ));
        assert_eq!(a.total_bytes() + c.total_bytes(), total);
    }

    // ---------------------------------------------------------------------------------------
    // Model test: a pool made of upstream chunks + several per-stream free lists.
    // ---------------------------------------------------------------------------------------

    const ALIGN: usize = 256;

    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate `units * 256` bytes on stream `s`.
        Alloc { s: usize, units: usize },
        /// Free live block `i % live.len()` on stream `s`.
        Free { s: usize, i: usize },
        /// Free (again) a block that is currently free: must be rejected.
        DoubleFree { i: usize, part: usize },
        /// Merge list `b` into list `a`.
        Merge { a: usize, b: usize },
        /// Give wholly free chunks back to the upstream.
        Release,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize, 1..24usize).prop_map(|(s, units)| Op::Alloc { s, units }),
            4 => (0..3usize, any::<usize>()).prop_map(|(s, i)| Op::Free { s, i }),
            1 => (any::<usize>(), any::<usize>()).prop_map(|(i, part)| Op::DoubleFree { i, part }),
            1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Merge { a, b }),
            1 => Just(Op::Release),
        ]
    }

    struct Model {
        /// Upstream chunks `(addr, size)`.
        chunks: Vec<(u64, usize)>,
        /// One free list per stream.
        lists: Vec<CoalescingFreeList>,
        /// Live (handed out) blocks.
        live: Vec<Block>,
        /// Next upstream address; chunks are sometimes adjacent on purpose.
        next_addr: u64,
    }

    impl Model {
        fn new() -> Self {
            Self {
                chunks: Vec::new(),
                lists: vec![CoalescingFreeList::new(); 3],
                live: Vec::new(),
                next_addr: 1 << 20,
            }
        }

        fn chunk_of(&self, addr: u64) -> Option<(u64, usize)> {
            self.chunks
                .iter()
                .copied()
                .find(|&(a, s)| a <= addr && addr < a + s as u64)
        }

        fn naive_best_fit(list: &CoalescingFreeList, size: usize) -> Option<Block> {
            list.iter()
                .filter(|b| b.size >= size)
                .min_by_key(|b| (b.size, b.addr))
        }

        fn alloc(&mut self, s: usize, size: usize, gap: bool) {
            // Same stream, then steal without merging, then merge everything, then grow.
            let expected = Self::naive_best_fit(&self.lists[s], size);
            let mut got = self.lists[s].allocate(size);
            assert_eq!(got.map(|b| b.addr), expected.map(|b| b.addr));
            if got.is_none() {
                for o in (0..self.lists.len()).filter(|&o| o != s) {
                    let expected = Self::naive_best_fit(&self.lists[o], size);
                    got = self.lists[o].allocate(size);
                    assert_eq!(got.map(|b| b.addr), expected.map(|b| b.addr));
                    if got.is_some() {
                        break;
                    }
                }
            }
            if got.is_none() {
                for o in (0..self.lists.len()).filter(|&o| o != s) {
                    let mut other = std::mem::take(&mut self.lists[o]);
                    self.lists[s].insert_list(&mut other).unwrap();
                    assert!(other.is_empty());
                    got = self.lists[s].allocate(size);
                    if got.is_some() {
                        break;
                    }
                }
            }
            if got.is_none() {
                // Grow: a new chunk at least twice the request, sometimes adjacent to the last.
                let chunk = size * 2;
                if gap {
                    self.next_addr += 4096;
                }
                let addr = self.next_addr;
                self.next_addr += chunk as u64;
                self.chunks.push((addr, chunk));
                self.lists[s].insert(Block::new(addr, chunk, true)).unwrap();
                got = self.lists[s].allocate(size);
            }
            let block = got.expect("a fresh chunk always fits the request");
            assert_eq!(block.size, size);
            self.live.push(block);
        }

        fn check(&self) {
            let chunk_bytes: usize = self.chunks.iter().map(|c| c.1).sum();
            let live_bytes: usize = self.live.iter().map(|b| b.size).sum();
            let free_bytes: usize = self.lists.iter().map(CoalescingFreeList::total_bytes).sum();
            assert_eq!(free_bytes + live_bytes, chunk_bytes);

            let mut all: Vec<(Block, bool)> = self.live.iter().map(|&b| (b, true)).collect();
            for list in &self.lists {
                let listed: Vec<Block> = list.iter().collect();
                assert_eq!(listed.len(), list.len());
                assert_eq!(
                    listed.iter().map(|b| b.size).sum::<usize>(),
                    list.total_bytes()
                );
                assert_eq!(
                    list.largest().map(|b| b.size),
                    listed.iter().map(|b| b.size).max()
                );
                // Maximally coalesced within a list.
                for w in listed.windows(2) {
                    let mergeable = w[0].end() == w[1].addr && !w[1].is_head;
                    assert!(!mergeable, "uncoalesced {w:?}");
                }
                list.assert_indexes_agree();
                all.extend(listed.into_iter().map(|b| (b, false)));
            }
            all.sort_by_key(|(b, _)| b.addr);
            for w in all.windows(2) {
                assert!(w[0].0.end() <= w[1].0.addr, "overlap {w:?}");
            }
            for (b, _) in &all {
                assert!(b.size > 0);
                assert_eq!(b.addr % ALIGN as u64, 0);
                assert_eq!(b.size % ALIGN, 0);
                let (ca, cs) = self.chunk_of(b.addr).expect("block inside a chunk");
                assert!(b.end() <= ca + cs as u64, "block crosses its chunk");
                assert_eq!(b.is_head, b.addr == ca, "head flag of {b:?}");
            }
        }

        fn apply(&mut self, op: Op, gap: bool) {
            match op {
                Op::Alloc { s, units } => self.alloc(s, units * ALIGN, gap),
                Op::Free { s, i } => {
                    if !self.live.is_empty() {
                        let b = self.live.swap_remove(i % self.live.len());
                        // The resource rebuilds the head flag from its chunk set, like RMM.
                        let is_head = self.chunks.iter().any(|c| c.0 == b.addr);
                        assert_eq!(is_head, b.is_head);
                        self.lists[s]
                            .insert(Block::new(b.addr, b.size, is_head))
                            .unwrap();
                    }
                }
                Op::DoubleFree { i, part } => {
                    let free: Vec<(usize, Block)> = self
                        .lists
                        .iter()
                        .enumerate()
                        .flat_map(|(s, l)| l.iter().map(move |b| (s, b)))
                        .collect();
                    if !free.is_empty() {
                        let (s, b) = free[i % free.len()];
                        // Free the whole block or one 256-byte piece of it again.
                        let units = b.size / ALIGN;
                        let k = part % (units + 1);
                        let bad = if k == units {
                            b
                        } else {
                            Block::new(b.addr + (k * ALIGN) as u64, ALIGN, false)
                        };
                        let before: Vec<Block> = self.lists[s].iter().collect();
                        assert!(self.lists[s].overlapping(bad.addr, bad.size).is_some());
                        assert!(self.lists[s].contains_range(bad.addr, bad.size));
                        assert!(matches!(
                            self.lists[s].insert(bad),
                            Err(FreeListError::Overlap { .. })
                        ));
                        assert_eq!(self.lists[s].iter().collect::<Vec<_>>(), before);
                    }
                }
                Op::Merge { a, b } => {
                    if a != b {
                        let mut other = std::mem::take(&mut self.lists[b]);
                        self.lists[a].insert_list(&mut other).unwrap();
                        assert!(other.is_empty());
                    }
                }
                Op::Release => {
                    let chunks = self.chunks.clone();
                    for (addr, size) in chunks {
                        let end = addr + size as u64;
                        let live_inside = self.live.iter().any(|b| b.addr < end && addr < b.end());
                        let mut removed = false;
                        for list in &mut self.lists {
                            let exact = list.block_at(addr) == Some(Block::new(addr, size, true));
                            let r = list.remove_chunk(addr, size);
                            assert_eq!(r, exact);
                            removed |= r;
                            if r {
                                break;
                            }
                        }
                        if live_inside {
                            assert!(!removed);
                        }
                        if removed {
                            self.chunks.retain(|c| c.0 != addr);
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn pool_model(ops in proptest::collection::vec((op(), any::<bool>()), 1..120)) {
            let mut m = Model::new();
            for (op, gap) in ops {
                m.apply(op, gap);
                m.check();
            }
            // Free everything and merge all lists: one block per chunk, exactly the chunk.
            while let Some(b) = m.live.pop() {
                m.lists[0].insert(b).unwrap();
                m.check();
            }
            for o in 1..m.lists.len() {
                let mut other = std::mem::take(&mut m.lists[o]);
                m.lists[0].insert_list(&mut other).unwrap();
            }
            m.check();
            let mut chunks = m.chunks.clone();
            chunks.sort_unstable();
            let free: Vec<(u64, usize)> = m.lists[0].iter().map(|b| (b.addr, b.size)).collect();
            prop_assert_eq!(free, chunks.clone());
            prop_assert!(m.lists[0].iter().all(|b| b.is_head));
            prop_assert_eq!(m.lists[0].total_bytes(), chunks.iter().map(|c| c.1).sum::<usize>());
            // And every chunk can now be released.
            for (addr, size) in chunks {
                prop_assert!(m.lists[0].remove_chunk(addr, size));
            }
            prop_assert!(m.lists[0].is_empty());
            prop_assert_eq!(m.lists[0].total_bytes(), 0);
        }

        #[test]
        fn insert_order_does_not_matter(
            sizes in proptest::collection::vec((1..8usize, any::<bool>()), 1..40),
            seed in any::<u64>(),
        ) {
            // Cut a range into pieces (some marked as chunk heads), insert them in a shuffled
            // order: the result is the same as inserting them in address order.
            let mut pieces = Vec::new();
            let mut addr = 0u64;
            for (i, &(units, head)) in sizes.iter().enumerate() {
                pieces.push(Block::new(addr, units * ALIGN, head || i == 0));
                addr += (units * ALIGN) as u64;
            }
            let mut sorted = CoalescingFreeList::new();
            for &p in &pieces {
                sorted.insert(p).unwrap();
            }
            let mut shuffled = pieces.clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut other = CoalescingFreeList::new();
            for &p in &shuffled {
                other.insert(p).unwrap();
            }
            prop_assert_eq!(sorted.iter().collect::<Vec<_>>(), other.iter().collect::<Vec<_>>());
            let heads = pieces.iter().filter(|p| p.is_head).count();
            prop_assert_eq!(sorted.len(), heads);
            prop_assert_eq!(sorted.total_bytes(), addr as usize);
        }
    }
}
