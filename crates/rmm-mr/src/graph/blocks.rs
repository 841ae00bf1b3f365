//! The bookkeeping of a graph-private pool (no CUDA calls): the chunks it reserved, the blocks
//! captured work holds, and the free blocks with the capture order they may be reused in.
//!
//! A block freed outside any capture, or freed in a capture that has ended, is *settled*: any
//! later captured allocation may take it (graphs that share a pool never run concurrently,
//! the pool's contract). A block freed inside a capture that is still going on is tagged with
//! that capture and the stream it was freed on: only a later allocation of the same capture on
//! the same stream, which the capture orders after the free, may take it, until the capture
//! ends ([`GraphBlocks::settle`]). Adjacent free blocks merge when they lie in one chunk and
//! carry the same tag.

use std::collections::BTreeMap;

use rmm_sys::align_up;

/// Where a free happened: inside capture `capture`, on the stream whose id is `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Tag {
    /// The capture's id.
    pub(crate) capture: u64,
    /// The freeing stream's id.
    pub(crate) stream: u64,
}

/// A free block: its size and, while its capture lasts, where it was freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Free {
    size: usize,
    tag: Option<Tag>,
}

/// Why a free was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// No live block starts at the address.
    Unknown,
    /// A live block starts there, with another size.
    SizeMismatch {
        /// Its size as handed out.
        allocated: usize,
    },
}

/// The chunks, live blocks and free blocks of one graph pool. Sizes and addresses handed out
/// are multiples of 256 (chunks must start 256-aligned; [`add_chunk`](Self::add_chunk)).
#[derive(Debug, Default)]
pub(crate) struct GraphBlocks {
    /// Chunk base → size.
    chunks: BTreeMap<u64, usize>,
    /// Free block address → the block.
    free: BTreeMap<u64, Free>,
    /// Live block address → (size handed out, the start of the span it took from the free
    /// list, the span's size): an over-aligned block gives back its padding with it.
    live: BTreeMap<u64, (usize, u64, usize)>,
    reserved: usize,
    in_use: usize,
}

/// The granularity of every block.
const GRANULE: usize = 256;

impl GraphBlocks {
    /// Adds a chunk of `size` bytes at `base` (256-aligned, not overlapping another) as one
    /// settled free block.
    pub(crate) fn add_chunk(&mut self, base: u64, size: usize) {
        debug_assert!(base % GRANULE as u64 == 0);
        self.chunks.insert(base, size);
        self.reserved += size;
        self.free.insert(base, Free { size, tag: None });
        self.merge_around(base);
    }

    /// Bytes reserved (the chunks).
    pub(crate) fn reserved(&self) -> usize {
        self.reserved
    }

    /// Bytes handed out and not freed.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// How many blocks are live.
    pub(crate) fn live_blocks(&self) -> usize {
        self.live.len()
    }

    /// Whether `addr` lies in one of the chunks.
    #[cfg(test)]
    fn owns(&self, addr: u64) -> bool {
        self.chunk_of(addr).is_some()
    }

    /// The chunks, for release.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.chunks.iter().map(|(&b, &s)| (b, s))
    }

    fn chunk_of(&self, addr: u64) -> Option<(u64, usize)> {
        let (&base, &size) = self.chunks.range(..=addr).next_back()?;
        (addr < base + size as u64).then_some((base, size))
    }

    /// The rounded size and the chunk room a request of `bytes` at `alignment` may need at most
    /// (for growth).
    pub(crate) fn room_for(bytes: usize, alignment: usize) -> Option<usize> {
        let size = bytes.checked_add(GRANULE - 1)? & !(GRANULE - 1);
        size.checked_add(alignment.max(GRANULE) - GRANULE)
    }

    /// Takes the lowest free block that fits `bytes` (rounded up to 256) at `alignment` (a
    /// power of two) and that `at` may use: a settled one, or one freed at `at`. The rest of
    /// the block stays free with its tag. `None` when nothing fits (grow, then ask again).
    pub(crate) fn allocate(&mut self, bytes: usize, alignment: usize, at: Tag) -> Option<u64> {
        let size = align_up(bytes.max(1), GRANULE);
        let alignment = alignment.max(GRANULE) as u64;
        let (addr, block, start) = self.free.iter().find_map(|(&addr, &b)| {
            if b.tag.is_some_and(|t| t != at) {
                return None;
            }
            let start = addr.checked_add(alignment - 1)? & !(alignment - 1);
            let end = start.checked_add(size as u64)?;
            (end <= addr + b.size as u64).then_some((addr, b, start))
        })?;
        self.free.remove(&addr);
        let end = start + size as u64;
        let span_end = addr + block.size as u64;
        // Padding before an over-aligned block stays with it (given back with it).
        if span_end > end {
            self.free.insert(
                end,
                Free {
                    size: (span_end - end) as usize,
                    tag: block.tag,
                },
            );
        }
        self.live.insert(start, (size, addr, (end - addr) as usize));
        self.in_use += size;
        Some(start)
    }

    /// Frees the live block at `addr` of `bytes` (as asked at allocation): settled (`at` is
    /// `None`), or reusable only at `at` until [`settle`](Self::settle)`(at.capture)`.
    pub(crate) fn free(
        &mut self,
        addr: u64,
        bytes: usize,
        at: Option<Tag>,
    ) -> Result<(), FreeError> {
        let &(size, span, span_size) = self.live.get(&addr).ok_or(FreeError::Unknown)?;
        if align_up(bytes.max(1), GRANULE) != size {
            return Err(FreeError::SizeMismatch { allocated: size });
        }
        self.live.remove(&addr);
        self.in_use -= size;
        self.free.insert(
            span,
            Free {
                size: span_size,
                tag: at,
            },
        );
        self.merge_around(span);
        Ok(())
    }

    /// The capture `capture` ended: what was freed in it becomes settled.
    pub(crate) fn settle(&mut self, capture: u64) {
        let tagged: Vec<u64> = self
            .free
            .iter()
            .filter(|(_, b)| b.tag.is_some_and(|t| t.capture == capture))
            .map(|(&a, _)| a)
            .collect();
        for a in &tagged {
            if let Some(b) = self.free.get_mut(a) {
                b.tag = None;
            }
        }
        for a in tagged {
            // It may have merged into a neighbour already.
            if self.free.contains_key(&a) {
                self.merge_around(a);
            }
        }
    }

    /// Merges the free block at `addr` with the free neighbours of its chunk and tag, as far
    /// as they reach.
    fn merge_around(&mut self, mut addr: u64) {
        let Some((base, chunk_size)) = self.chunk_of(addr) else {
            return;
        };
        let chunk_end = base + chunk_size as u64;
        let Some(mut me) = self.free.remove(&addr) else {
            return;
        };
        while let Some((&prev, &p)) = self.free.range(base..addr).next_back() {
            if prev + p.size as u64 != addr || p.tag != me.tag {
                break;
            }
            self.free.remove(&prev);
            me.size += p.size;
            addr = prev;
        }
        loop {
            let next = addr + me.size as u64;
            if next >= chunk_end {
                break;
            }
            match self.free.get(&next) {
                Some(&n) if n.tag == me.tag => {
                    self.free.remove(&next);
                    me.size += n.size;
                }
                _ => break,
            }
        }
        self.free.insert(addr, me);
    }

    /// The free blocks, lowest first, with their tags (for tests and checks).
    #[cfg(test)]
    fn free_blocks(&self) -> Vec<(u64, usize, Option<Tag>)> {
        self.free.iter().map(|(&a, b)| (a, b.size, b.tag)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: usize = 1 << 20;
    const S1: Tag = Tag {
        capture: 1,
        stream: 10,
    };
    const S2: Tag = Tag {
        capture: 1,
        stream: 20,
    };
    const LATER: Tag = Tag {
        capture: 2,
        stream: 10,
    };

    fn pool() -> GraphBlocks {
        let mut b = GraphBlocks::default();
        b.add_chunk(1 << 30, MIB);
        b
    }

    #[test]
    fn a_block_freed_in_a_capture_is_reused_on_its_stream_only() {
        let mut b = pool();
        let x = b.allocate(4096, 256, S1).unwrap();
        let y = b.allocate(4096, 256, S1).unwrap();
        b.free(x, 4096, Some(S1)).unwrap();
        // The other stream of the capture is not ordered after the free: it gets fresh memory.
        let z = b.allocate(4096, 256, S2).unwrap();
        assert_ne!(z, x);
        assert!(z > y);
        // The freeing stream is: it gets the block back.
        assert_eq!(b.allocate(4096, 256, S1).unwrap(), x);
    }

    #[test]
    fn a_block_freed_in_a_capture_is_not_taken_by_another_capture_until_it_ends() {
        let mut b = pool();
        let x = b.allocate(MIB, 256, S1).unwrap();
        b.free(x, MIB, Some(S1)).unwrap();
        assert_eq!(b.allocate(4096, 256, LATER), None);
        b.settle(1);
        assert_eq!(b.allocate(4096, 256, LATER), Some(x));
    }

    #[test]
    fn settling_merges_the_pieces_back_into_one_block() {
        let mut b = pool();
        let x = b.allocate(4096, 256, S1).unwrap();
        let y = b.allocate(4096, 256, S2).unwrap();
        b.free(x, 4096, Some(S1)).unwrap();
        b.free(y, 4096, Some(S2)).unwrap();
        assert_eq!(b.free_blocks().len(), 3);
        b.settle(1);
        assert_eq!(b.free_blocks(), vec![(1 << 30, MIB, None)]);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn wrong_frees_change_nothing() {
        let mut b = pool();
        let x = b.allocate(1000, 256, S1).unwrap();
        assert_eq!(b.free(x + 256, 1000, None), Err(FreeError::Unknown));
        assert_eq!(
            b.free(x, 5000, None),
            Err(FreeError::SizeMismatch { allocated: 1024 })
        );
        assert_eq!(b.in_use(), 1024);
        b.free(x, 1000, None).unwrap();
        assert_eq!(b.free(x, 1000, None), Err(FreeError::Unknown));
    }

    #[test]
    fn over_aligned_blocks_give_their_padding_back() {
        let mut b = pool();
        let a = b.allocate(256, 256, S1).unwrap();
        let x = b.allocate(256, 4096, S1).unwrap();
        assert_eq!(x % 4096, 0);
        b.free(x, 256, None).unwrap();
        b.free(a, 256, None).unwrap();
        assert_eq!(b.free_blocks(), vec![(1 << 30, MIB, None)]);
    }

    #[test]
    fn blocks_never_merge_across_chunks() {
        let mut b = GraphBlocks::default();
        b.add_chunk(0x1000_0000, 4096);
        b.add_chunk(0x1000_1000, 4096);
        assert_eq!(b.free_blocks().len(), 2);
        assert_eq!(b.allocate(8192, 256, S1), None);
        assert_eq!(b.reserved(), 8192);
        assert!(b.owns(0x1000_1fff));
        assert!(!b.owns(0x1000_2000));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { bytes: usize, stream: u64 },
        Free { pick: usize, stream: u64 },
        EndCapture,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..70_000, 0u64..3).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
            (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::Free { pick, stream }),
            Just(Op::EndCapture),
        ]
    }

    proptest! {
        /// Against a model: live blocks never overlap and stay inside the chunks; a block freed
        /// in the current capture is handed out again only to the stream that freed it, until
        /// the capture ends; the counters add up; all frees settle back into whole chunks.
        #[test]
        fn reuse_follows_capture_order(ops in proptest::collection::vec(op(), 1..200)) {
            let mut b = GraphBlocks::default();
            b.add_chunk(1 << 30, 256 * 1024);
            b.add_chunk((1 << 30) + 256 * 1024, 256 * 1024);
            let mut capture = 1u64;
            let mut live: Vec<(u64, usize)> = Vec::new();
            // Byte ranges freed in the current capture, and by which stream.
            let mut freed_here: Vec<(u64, u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { bytes, stream } => {
                        let at = Tag { capture, stream };
                        if let Some(a) = b.allocate(bytes, 256, at) {
                            let end = a + align_up(bytes, 256) as u64;
                            for &(s, e, by) in &freed_here {
                                prop_assert!(end <= s || a >= e || by == stream,
                                    "{a:#x} reuses a block stream {by} freed in this capture");
                            }
                            for &(l, n) in &live {
                                prop_assert!(end <= l || a >= l + align_up(n, 256) as u64);
                            }
                            prop_assert!(b.owns(a) && b.owns(end - 1));
                            // The bytes taken are no longer free: keep what is left of each range.
                            freed_here = freed_here
                                .into_iter()
                                .flat_map(|(s, e, by)| {
                                    [(s, e.min(a), by), (s.max(end), e, by)]
                                })
                                .filter(|&(s, e, _)| s < e)
                                .collect();
                            live.push((a, bytes));
                        }
                    }
                    Op::Free { pick, stream } => {
                        if !live.is_empty() {
                            let (a, n) = live.swap_remove(pick % live.len());
                            b.free(a, n, Some(Tag { capture, stream })).unwrap();
                            freed_here.push((a, a + align_up(n, 256) as u64, stream));
                        }
                    }
                    Op::EndCapture => {
                        b.settle(capture);
                        capture += 1;
                        freed_here.clear();
                    }
                }
                let used: usize = live.iter().map(|&(_, n)| align_up(n, 256)).sum();
                prop_assert_eq!(b.in_use(), used);
                prop_assert_eq!(b.live_blocks(), live.len());
            }
            for (a, n) in live {
                b.free(a, n, None).unwrap();
            }
            b.settle(capture);
            prop_assert_eq!(b.free_blocks().len(), 2);
            prop_assert_eq!(b.in_use(), 0);
        }
    }
}
