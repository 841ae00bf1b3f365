//! The free lists of the pools for the stream-ordered core: the coalescing best-fit list
//! ([`BoundaryFreeList`]) with the resource-wide record of handed-out blocks, for both the
//! pool ([`PoolMemoryResource`](crate::PoolMemoryResource)) and the VMM pool
//! ([`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource)). They differ in one thing only:
//!
//! - **separate chunks** (the pool's upstream chunks lie anywhere): a chunk starts with a head
//!   block that never merges with the block before it, so no block spans two chunks;
//! - **contiguous chunks** (the VMM pool maps chunks one after the other into one reserved
//!   range): chunks merge with the free blocks on either side, a wholly free chunk is cut out of
//!   whatever free block holds it, and a list tells the core how much of the free memory at the
//!   end of the mapped range it holds, so that growth maps only what that block lacks.
//!
//! Pure bookkeeping: no CUDA calls.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::boundary_list::{Block, BoundaryFreeList};
use super::handed::HandedMap;
use crate::error::InvalidFree;
use crate::stream_ordered::core::FreeBlocks;
use crate::util::cross_thread::Origin;

/// How a pool's chunks lie: the one thing in which the pool's and the VMM pool's free lists
/// differ (a type, so that each pool's hot path is compiled for its own).
pub(crate) trait ChunkLayout: Clone + Default + Send + fmt::Debug + 'static {
    /// Whether a chunk starts with a head block, which never merges with the block before it
    /// (then a wholly free chunk is one free block; otherwise it may be part of a larger one).
    const HEADS: bool;

    /// [`FreeBlocks::extendable_tail`] of `free`.
    fn extendable_tail(&self, free: &BoundaryFreeList) -> Option<usize>;
}

/// Separate chunks (the pool's upstream chunks lie anywhere): a wholly free chunk is one block.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Separate;

impl ChunkLayout for Separate {
    const HEADS: bool = true;

    fn extendable_tail(&self, _free: &BoundaryFreeList) -> Option<usize> {
        None
    }
}

/// Contiguous chunks (mapped one after the other into one range): a wholly free chunk may be
/// part of a larger free block and is cut out of it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Contiguous {
    /// The address one past the last mapped byte, kept by the resource as it maps and unmaps.
    end: Arc<AtomicU64>,
}

impl Contiguous {
    /// Chunks that end at `end`, which the resource keeps.
    pub(crate) fn new(end: Arc<AtomicU64>) -> Self {
        Self { end }
    }
}

impl ChunkLayout for Contiguous {
    const HEADS: bool = false;

    fn extendable_tail(&self, free: &BoundaryFreeList) -> Option<usize> {
        let end = self.end.load(Ordering::Acquire);
        Some(free.block_ending_at(end).map_or(0, |b| b.size))
    }
}

/// One stream's free blocks, with the pool-wide record of handed-out blocks (shared by every
/// list of the pool) and how its chunks lie.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolBlocks<C: ChunkLayout = Separate> {
    free: BoundaryFreeList,
    /// Tagged with whether the block starts a chunk and who allocated it (an [`Origin`] as a
    /// word).
    handed: Arc<HandedMap>,
    chunks: C,
}

impl<C: ChunkLayout> PoolBlocks<C> {
    /// An empty list whose chunks lie as `chunks` says.
    pub(crate) fn new(chunks: C) -> Self {
        Self {
            free: BoundaryFreeList::default(),
            handed: Arc::default(),
            chunks,
        }
    }
}

impl<C: ChunkLayout> FreeBlocks for PoolBlocks<C> {
    /// Whether the block starts a chunk (always `false` for contiguous chunks).
    type Tag = bool;

    #[inline]
    fn take(&mut self, size: usize) -> Option<(u64, bool)> {
        self.free.allocate(size).map(|b| (b.addr, b.is_head))
    }

    fn fits(&self, size: usize) -> bool {
        self.free.largest().is_some_and(|b| b.size >= size)
    }

    #[inline]
    fn put(&mut self, addr: u64, size: usize, is_head: bool) -> Result<(), String> {
        self.free
            .insert(Block::new(addr, size, is_head))
            .map_err(|e| e.to_string())
    }

    /// Skips the list's same-edge check: the record has just confirmed the block was handed
    /// out with this size, and handed-out blocks overlap no free block.
    #[inline]
    fn put_released(&mut self, addr: u64, size: usize, is_head: bool) -> Result<(), String> {
        self.free
            .insert_released(Block::new(addr, size, is_head))
            .map_err(|e| e.to_string())
    }

    /// Separate chunks start with a head; contiguous ones merge with the blocks on either side.
    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String> {
        self.put(addr, size, C::HEADS)
    }

    fn absorb(&mut self, other: &mut Self) -> Result<(), String> {
        self.free
            .insert_list(&mut other.free)
            .map_err(|e| e.to_string())
    }

    fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    fn holds(&self, addr: u64) -> bool {
        self.free.holds(addr)
    }

    fn remove_chunk(&mut self, addr: u64, size: usize) -> bool {
        self.free.remove_range(addr, size, C::HEADS)
    }

    fn extendable_tail(&self) -> Option<usize> {
        self.chunks.extendable_tail(&self.free)
    }

    #[inline]
    fn hand_out(
        &mut self,
        addr: u64,
        size: usize,
        is_head: bool,
        origin: Origin,
    ) -> Result<(), String> {
        if self.handed.record(addr, size, (is_head, origin.to_word())) {
            Ok(())
        } else {
            Err(already_handed_out(addr))
        }
    }

    #[inline]
    fn take_back(&mut self, addr: u64, size: usize) -> Result<(bool, Origin), Option<InvalidFree>> {
        self.handed
            .release(addr, size)
            .map(|(is_head, origin)| (is_head, Origin::from_word(origin)))
            .map_err(|allocated| allocated.map(|allocated| InvalidFree::SizeMismatch { allocated }))
    }

    fn handed_out(&self) -> (usize, usize) {
        self.handed.totals()
    }

    fn handed_blocks(&self) -> Vec<(u64, usize)> {
        self.handed.blocks()
    }

    fn free_blocks(&self) -> Vec<(u64, usize)> {
        self.free
            .blocks()
            .iter()
            .map(|b| (b.addr, b.size))
            .collect()
    }
}

/// The error of a second record of one block (an internal inconsistency).
#[cold]
fn already_handed_out(addr: u64) -> String {
    format!("block {addr:#x} was already handed out")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CHUNK: usize = 4096;

    fn list() -> (PoolBlocks<Contiguous>, Arc<AtomicU64>) {
        let end = Arc::new(AtomicU64::new(0));
        (PoolBlocks::new(Contiguous::new(Arc::clone(&end))), end)
    }

    #[test]
    fn chunks_merge_and_the_tail_is_the_block_at_the_end() {
        let (mut l, end) = list();
        assert_eq!(l.extendable_tail(), Some(0));
        l.add_chunk(0x10000, CHUNK).unwrap();
        end.store(0x10000 + CHUNK as u64, Ordering::Release);
        assert_eq!(l.extendable_tail(), Some(CHUNK));
        let (a, head) = l.take(1024).unwrap();
        assert!(!head, "contiguous chunks have no heads");
        assert_eq!(a, 0x10000);
        assert_eq!(l.extendable_tail(), Some(CHUNK - 1024));
        // The next chunk merges with the free tail: one block spans both chunks.
        l.add_chunk(0x10000 + CHUNK as u64, CHUNK).unwrap();
        end.store(0x10000 + 2 * CHUNK as u64, Ordering::Release);
        assert_eq!(l.free_blocks(), vec![(0x10400, 2 * CHUNK - 1024)]);
        assert_eq!(l.extendable_tail(), Some(2 * CHUNK - 1024));
        assert!(l.fits(2 * CHUNK - 1024) && !l.fits(2 * CHUNK));
        // The second chunk is wholly free: it is cut out of the block.
        assert!(l.remove_chunk(0x10000 + CHUNK as u64, CHUNK));
        end.store(0x10000 + CHUNK as u64, Ordering::Release);
        assert_eq!(l.free_blocks(), vec![(0x10400, CHUNK - 1024)]);
        // The first one is not (1 KiB is handed out).
        assert!(!l.remove_chunk(0x10000, CHUNK));
        l.put(a, 1024, false).unwrap();
        assert!(l.remove_chunk(0x10000, CHUNK));
        assert!(l.is_empty());
    }

    #[test]
    fn the_record_checks_frees() {
        let (mut l, _) = list();
        l.add_chunk(0, CHUNK).unwrap();
        let (a, _) = l.take(512).unwrap();
        l.hand_out(a, 512, false, Origin::Shared).unwrap();
        assert!(l.hand_out(a, 512, false, Origin::Shared).is_err());
        assert_eq!(l.handed_out(), (1, 512));
        assert_eq!(
            l.take_back(a, 256).unwrap_err(),
            Some(InvalidFree::SizeMismatch { allocated: 512 })
        );
        assert_eq!(l.take_back(a + 256, 256).unwrap_err(), None);
        let (_, origin) = l.take_back(a, 512).unwrap();
        assert_eq!(origin, Origin::Shared);
        assert_eq!(l.handed_out(), (0, 0));
        l.put(a, 512, false).unwrap();
        assert!(l.holds(a) && l.put(a, 256, false).is_err());
        // Clones share the record.
        let mut other = l.clone();
        let (b, _) = other.take(256).unwrap();
        other.hand_out(b, 256, false, Origin::Shared).unwrap();
        assert_eq!(l.handed_out(), (1, 256));
    }

    #[test]
    fn separate_chunks_never_merge_and_have_no_tail() {
        let mut l = PoolBlocks::new(Separate);
        assert_eq!(l.extendable_tail(), None);
        l.add_chunk(0x10000, CHUNK).unwrap();
        l.add_chunk(0x10000 + CHUNK as u64, CHUNK).unwrap();
        // Two blocks: the second chunk's head does not merge with the first chunk.
        assert_eq!(
            l.free_blocks(),
            vec![(0x10000, CHUNK), (0x10000 + CHUNK as u64, CHUNK)]
        );
        assert!(!l.fits(CHUNK + 256));
        let (a, head) = l.take(CHUNK).unwrap();
        assert!(head, "a whole chunk starts with its head");
        // A chunk is removed only when it is one wholly free block.
        assert!(!l.remove_chunk(a, CHUNK));
        l.put(a, CHUNK, head).unwrap();
        assert!(l.remove_chunk(a, CHUNK));
        assert_eq!(l.free_blocks().len(), 1);
    }

    proptest! {
        /// Chunks mapped one after another, blocks taken and freed in any order on two lists,
        /// lists merged, wholly free chunks cut out: the free bytes always balance, the lists
        /// never overlap, and a merged list holds the whole free range as one block.
        #[test]
        fn chunks_coalesce_across_lists(
            ops in prop::collection::vec((0..4u8, 1..16usize, any::<usize>()), 1..120),
        ) {
            let end = Arc::new(AtomicU64::new(0));
            let mut lists = [
                PoolBlocks::new(Contiguous::new(Arc::clone(&end))),
                PoolBlocks::new(Contiguous::new(Arc::clone(&end))),
            ];
            let mut mapped: Vec<u64> = Vec::new();
            let mut live: Vec<(u64, usize)> = Vec::new();
            for (kind, units, pick) in ops {
                let s = pick % 2;
                match kind {
                    0 => {
                        let size = units * 256;
                        let got = lists[s].take(size).or_else(|| {
                            let (a, b) = lists.split_at_mut(1);
                            let (own, other) = if s == 0 { (&mut a[0], &mut b[0]) } else { (&mut b[0], &mut a[0]) };
                            own.absorb(other).unwrap();
                            own.take(size)
                        });
                        match got {
                            Some((addr, _)) => live.push((addr, size)),
                            None => {
                                // Grow by what the tail lacks, as the resource does.
                                let tail = lists[s].extendable_tail().unwrap();
                                let grow = (size - tail).div_ceil(CHUNK) * CHUNK;
                                let at = end.load(Ordering::Acquire);
                                for i in 0..grow / CHUNK {
                                    let chunk = at + (i * CHUNK) as u64;
                                    lists[s].add_chunk(chunk, CHUNK).unwrap();
                                    mapped.push(chunk);
                                }
                                end.store(at + grow as u64, Ordering::Release);
                                let (addr, _) = lists[s].take(size).expect("the tail was extended");
                                live.push((addr, size));
                            }
                        }
                    }
                    1 | 2 if !live.is_empty() => {
                        let (addr, size) = live.swap_remove(pick % live.len());
                        lists[s].put(addr, size, false).unwrap();
                    }
                    _ => {
                        // Cut out the wholly free chunks, wherever they are.
                        mapped.retain(|&c| !lists.iter_mut().any(|l| l.remove_chunk(c, CHUNK)));
                    }
                }
                let free: usize = lists.iter().map(|l| l.free.total_bytes()).sum();
                let used: usize = live.iter().map(|b| b.1).sum();
                prop_assert_eq!(free + used, mapped.len() * CHUNK);
                let mut ranges: Vec<(u64, u64)> = lists
                    .iter()
                    .flat_map(|l| l.free.blocks().into_iter().map(|b| (b.addr, b.end())))
                    .chain(live.iter().map(|&(a, s)| (a, a + s as u64)))
                    .collect();
                ranges.sort_unstable();
                prop_assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlap: {:?}", ranges);
            }
            // Everything freed and merged into one list: the mapped chunks that are contiguous
            // form single blocks.
            for (addr, size) in live.drain(..) {
                lists[0].put(addr, size, false).unwrap();
            }
            let (a, b) = lists.split_at_mut(1);
            a[0].absorb(&mut b[0]).unwrap();
            mapped.sort_unstable();
            let runs = 1 + mapped.windows(2).filter(|w| w[1] != w[0] + CHUNK as u64).count();
            prop_assert_eq!(a[0].free.len(), if mapped.is_empty() { 0 } else { runs });
        }
    }
}
