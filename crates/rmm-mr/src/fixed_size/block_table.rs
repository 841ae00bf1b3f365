//! The record of which fixed-size blocks are handed out, shared by every stream list of one
//! resource: one slot per block (the rounded size it was handed out with, 0 when free, and the
//! word recorded with it), found by a binary search over the chunk starts for a freed address,
//! and directly by its [`BlockId`] (chunk number and index) for a block a free list hands out.
//! It detects unknown pointers, double frees — on one stream or two, even at the same time — and
//! size mismatches, with atomics and no lock; lists read immutable [`BlockTable`] snapshots and
//! refresh them from the [`BlockLedger`] only when a chunk is missing. Design:
//! `docs/internals/fixed-size.md`.
//!
//! Pure bookkeeping: no CUDA calls; addresses are `u64`, sizes `usize`.

use std::fmt;
use std::sync::Arc;

use crate::fixed_size::chunk::{Chunk, FixedSizeError};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Mutex, MutexGuard};

/// One block's slot: the size it was handed out with (0: not handed out) and the word the
/// hand-out recorded with it (one cache line holds both).
#[derive(Default)]
struct Slot {
    size: AtomicUsize,
    tag: AtomicU64,
}

/// Where a block's slot is: the number of its chunk in the ledger (chunks are numbered in the
/// order they were added, from 0) and the block's index in the chunk. What a free list keeps
/// with each free block, so that handing it out needs no search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockId {
    chunk: u32,
    index: u32,
}

impl BlockId {
    /// An id no block has (for a block whose chunk number or index does not fit in `u32`:
    /// found by its address instead).
    pub const NONE: Self = Self {
        chunk: u32::MAX,
        index: u32::MAX,
    };
}

/// Blocks of at least this many bytes get a cache line of slots each (see [`ChunkBlocks`]).
pub(crate) const SPREAD_FROM: usize = 4096;

/// log2 of the slots per block when blocks are spread: four 16-byte slots, one per 64-byte line.
const SPREAD_SHIFT: u32 = 2;

/// One chunk's slots: for each block, the size it was handed out with, or 0, and a tag.
///
/// Every operation writes its block's slot, and neighbouring blocks often sit in different
/// streams' free lists (a block moves to the list of the stream that frees it, and a thief
/// takes single blocks), so threads allocating on their own streams wrote one cache line
/// whenever their blocks' slots shared it. For blocks of `SPREAD_FROM` bytes or more, each
/// block's slot is therefore alone in its 64-byte line (block `i` uses slot `i << 2`; the three
/// slots after it stay unused), which costs at most 64 bytes of host memory per 4 KiB block
/// (1.6 %); smaller blocks keep packed slots (16 bytes each).
pub struct ChunkBlocks {
    chunk: Chunk,
    /// The chunk's number in its ledger (the order it was added in), or `u32::MAX` when its
    /// blocks have no id (its number or its block count does not fit in `u32`).
    number: u32,
    /// log2 of the slots per block: 0, or [`SPREAD_SHIFT`] for spread blocks.
    spread: u32,
    slots: Box<[Slot]>,
}

impl ChunkBlocks {
    fn new(chunk: Chunk, number: usize) -> Self {
        let number = match (u32::try_from(number), u32::try_from(chunk.count())) {
            (Ok(n), Ok(_)) => n,
            _ => u32::MAX,
        };
        let spread = if chunk.block_size() >= SPREAD_FROM {
            SPREAD_SHIFT
        } else {
            0
        };
        Self {
            chunk,
            number,
            spread,
            slots: (0..chunk.count() << spread)
                .map(|_| Slot::default())
                .collect(),
        }
    }

    /// The slot of block `index` (`None` past the chunk's blocks).
    #[inline]
    fn slot(&self, index: usize) -> Option<&Slot> {
        if index >= self.chunk.count() {
            return None;
        }
        self.slots.get(index << self.spread)
    }

    /// [`slot`](Self::slot) of a [`BlockId`]'s index, on the hand-out path: shifted by at most
    /// 2 it cannot wrap a `u64`, so the slice's own bound (`count << spread` slots) is the
    /// chunk's, with no second comparison.
    #[inline]
    fn slot_of(&self, index: u32) -> Option<&Slot> {
        let at = usize::try_from(u64::from(index) << self.spread).ok()?;
        self.slots.get(at)
    }

    /// [`slot`](Self::slot) of an index [`BlockTable::locate`] found (below the count, whose
    /// shifted value was computed without overflow at construction, so this shift cannot
    /// overflow either), with no second comparison. Any other index still only reaches a slot
    /// of this chunk, or `None`.
    #[inline]
    fn located_slot(&self, index: usize) -> Option<&Slot> {
        self.slots.get(index << self.spread)
    }

    /// The id of block `index` of this chunk ([`BlockId::NONE`] when its blocks have none).
    #[inline]
    #[must_use]
    pub fn id(&self, index: usize) -> BlockId {
        if self.number == u32::MAX {
            return BlockId::NONE;
        }
        BlockId {
            chunk: self.number,
            // The count fits in `u32` (else the number would be `u32::MAX`); a larger index is
            // no block of the chunk and only cut to an id that names another block, which
            // `hand_out_id` checks against the address.
            index: index as u32,
        }
    }

    /// The blocks of the chunk with their ids, in address order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = (u64, BlockId)> + '_ {
        self.chunk
            .blocks()
            .enumerate()
            .map(|(i, addr)| (addr, self.id(i)))
    }

    /// The chunk.
    #[must_use]
    pub fn chunk(&self) -> Chunk {
        self.chunk
    }

    /// The size block `index` is handed out with, or `None` when it is not handed out (or the
    /// index is out of range).
    #[must_use]
    pub fn handed_size(&self, index: usize) -> Option<usize> {
        let size = self.slot(index)?.size.load(Ordering::Acquire);
        (size != 0).then_some(size)
    }

    /// Number of blocks handed out and the sum of their sizes.
    #[must_use]
    pub fn handed_out(&self) -> (usize, usize) {
        self.slots
            .iter()
            .map(|s| s.size.load(Ordering::Acquire))
            .filter(|&s| s != 0)
            .fold((0, 0), |(n, bytes), s| (n + 1, bytes + s))
    }
}

impl fmt::Debug for ChunkBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (handed, bytes) = self.handed_out();
        f.debug_struct("ChunkBlocks")
            .field("chunk", &self.chunk)
            .field("handed_out", &handed)
            .field("handed_out_bytes", &bytes)
            .finish()
    }
}

/// A chunk in a table: its bounds inline (the binary search reads only these), its slots
/// shared.
#[derive(Debug, Clone)]
struct Entry {
    addr: u64,
    /// The chunk's size in bytes.
    bytes: u64,
    /// log2 of the block size when it is a power of two (an index is then a shift, not a
    /// division), else `u32::MAX`.
    shift: u32,
    /// The block size less one when it is a power of two (the offset bits inside a block).
    mask: u64,
    blocks: Arc<ChunkBlocks>,
}

impl Entry {
    /// The index of the block starting at `addr` (inside the chunk), if one does.
    #[inline]
    fn block_index(&self, addr: u64) -> Option<usize> {
        let offset = addr - self.addr;
        if self.shift != u32::MAX {
            return (offset & self.mask == 0).then(|| (offset >> self.shift) as usize);
        }
        self.blocks.chunk.block_index(addr)
    }
}

/// An immutable, address-ordered snapshot of the chunks of a [`BlockLedger`]; cloning it is two
/// reference counts. The slots it reaches are the ledger's own (shared, atomic).
#[derive(Debug, Clone, Default)]
pub struct BlockTable {
    /// By address.
    entries: Arc<[Entry]>,
    /// The same chunks by number ([`BlockId`]).
    numbered: Arc<[Arc<ChunkBlocks>]>,
}

impl BlockTable {
    /// Number of chunks.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no chunk.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The chunks by number (the order they were added in).
    pub fn numbered_chunks(&self) -> impl ExactSizeIterator<Item = &ChunkBlocks> + '_ {
        self.numbered.iter().map(|c| &**c)
    }

    /// The chunks in address order.
    pub fn chunks(&self) -> impl ExactSizeIterator<Item = &ChunkBlocks> + '_ {
        self.entries.iter().map(|e| &*e.blocks)
    }

    /// The chunk of the block that starts at `addr` and the block's index in it.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::UnknownAddress`] when no chunk of the table contains `addr`,
    /// [`FixedSizeError::Misaligned`] when it is not the start of a block.
    #[inline]
    pub fn locate(&self, addr: u64) -> Result<(&ChunkBlocks, usize), FixedSizeError> {
        // The last chunk starting at or below `addr` (the first chunk when none does, which
        // the bounds check below then refuses): a binary search written out on a shrinking
        // slice, so that it inlines and needs no bounds check (`half < len`; the chunks are few
        // and the loop short; none for one chunk).
        let mut entries = &*self.entries;
        while entries.len() > 1 {
            let half = entries.len() / 2;
            entries = if entries[half].addr <= addr {
                &entries[half..]
            } else {
                &entries[..half]
            };
        }
        let entry = entries
            .first()
            // Below the chunk, the offset wraps around to a large number.
            .filter(|e| addr.wrapping_sub(e.addr) < e.bytes)
            .ok_or(FixedSizeError::UnknownAddress { addr })?;
        match entry.block_index(addr) {
            Some(index) => Ok((&entry.blocks, index)),
            None => Err(FixedSizeError::Misaligned {
                addr,
                chunk: entry.blocks.chunk,
            }),
        }
    }

    /// Records the block at `addr` as handed out for `size` bytes (non-zero).
    ///
    /// The caller owns the block: it just took it from a free list, so no other call can
    /// write its slot now (a take-back only ever clears a slot holding a size). That is why
    /// this is a plain store, not a read-modify-write.
    ///
    /// # Errors
    ///
    /// Those of [`locate`](Self::locate), [`FixedSizeError::HandedOutTwice`] when the block is
    /// already handed out (an inconsistency; the slot keeps its size). 0 is refused as
    /// [`FixedSizeError::SizeMismatch`] (it means "not handed out").
    #[inline]
    pub fn hand_out(&self, addr: u64, size: usize) -> Result<(), FixedSizeError> {
        self.hand_out_tagged(addr, size, 0)
    }

    /// As [`hand_out`](Self::hand_out), and records `tag` with the block, for
    /// [`take_back_tagged`](Self::take_back_tagged) to return (the resource records who
    /// allocated the block). A plain store too.
    ///
    /// # Errors
    ///
    /// As [`hand_out`](Self::hand_out); the slot and its tag are unchanged on error.
    #[inline]
    pub fn hand_out_tagged(&self, addr: u64, size: usize, tag: u64) -> Result<(), FixedSizeError> {
        let (blocks, index) = self.locate(addr)?;
        if size == 0 {
            return Err(FixedSizeError::SizeMismatch {
                addr,
                allocated: 0,
                freed: 0,
            });
        }
        let Some(slot) = blocks.located_slot(index) else {
            return Err(FixedSizeError::UnknownAddress { addr });
        };
        if slot.size.load(Ordering::Acquire) != 0 {
            return Err(FixedSizeError::HandedOutTwice { addr });
        }
        // Published by the size's release store below.
        slot.tag.store(tag, Ordering::Relaxed);
        slot.size.store(size, Ordering::Release);
        Ok(())
    }

    /// As [`hand_out_tagged`](Self::hand_out_tagged) for the block `id` at `addr`, found by its
    /// id without a search (the id a free list kept with the block). An id that this table
    /// does not know, or that names another address, is looked up by `addr` instead.
    ///
    /// # Errors
    ///
    /// As [`hand_out_tagged`](Self::hand_out_tagged).
    #[inline]
    pub fn hand_out_id(
        &self,
        id: BlockId,
        addr: u64,
        size: usize,
        tag: u64,
    ) -> Result<(), FixedSizeError> {
        let found = self.numbered.get(id.chunk as usize).and_then(|c| {
            let slot = c.slot_of(id.index)?;
            // Inside the chunk (the index is below its count), so this cannot overflow.
            let at = c.chunk.addr() + u64::from(id.index) * c.chunk.block_size() as u64;
            (at == addr).then_some(slot)
        });
        match found {
            Some(slot) if size != 0 => {
                if slot.size.load(Ordering::Acquire) != 0 {
                    return Err(FixedSizeError::HandedOutTwice { addr });
                }
                // Published by the size's release store below.
                slot.tag.store(tag, Ordering::Relaxed);
                slot.size.store(size, Ordering::Release);
                Ok(())
            }
            _ => self.hand_out_by_addr(addr, size, tag),
        }
    }

    /// [`hand_out_tagged`](Self::hand_out_tagged), out of line: the rare case of
    /// [`hand_out_id`](Self::hand_out_id).
    #[cold]
    #[inline(never)]
    fn hand_out_by_addr(&self, addr: u64, size: usize, tag: u64) -> Result<(), FixedSizeError> {
        self.hand_out_tagged(addr, size, tag)
    }

    /// As [`take_back_tagged`](Self::take_back_tagged), and also returns the block's id.
    ///
    /// # Errors
    ///
    /// As [`take_back_tagged`](Self::take_back_tagged).
    #[inline]
    pub fn take_back_id(&self, addr: u64, size: usize) -> Result<(BlockId, u64), FixedSizeError> {
        let (blocks, index) = self.locate(addr)?;
        let tag = Self::take_back_slot(blocks, index, addr, size)?;
        Ok((blocks.id(index), tag))
    }

    /// Checks that the block at `addr` is handed out with `size` bytes and records it as not
    /// handed out. Of two concurrent calls for one block, exactly one succeeds.
    ///
    /// # Errors
    ///
    /// Those of [`locate`](Self::locate); [`FixedSizeError::DoubleFree`] when the block is
    /// not handed out; [`FixedSizeError::SizeMismatch`] when it is, with another size. The
    /// slot is unchanged on error.
    #[inline]
    pub fn take_back(&self, addr: u64, size: usize) -> Result<(), FixedSizeError> {
        self.take_back_tagged(addr, size).map(|_| ())
    }

    /// As [`take_back`](Self::take_back), and returns the tag the block was handed out with
    /// ([`hand_out_tagged`](Self::hand_out_tagged); 0 after [`hand_out`](Self::hand_out)).
    ///
    /// The tag is read after the slot is cleared: it is the one of the hand-out taken back as
    /// long as nobody hands the block out again before this returns, which holds when, as in
    /// the resource, a block is handed out only from a free list and the caller puts it there
    /// only afterwards.
    ///
    /// # Errors
    ///
    /// As [`take_back`](Self::take_back).
    #[inline]
    pub fn take_back_tagged(&self, addr: u64, size: usize) -> Result<u64, FixedSizeError> {
        let (blocks, index) = self.locate(addr)?;
        Self::take_back_slot(blocks, index, addr, size)
    }

    /// [`take_back_tagged`](Self::take_back_tagged) of block `index` of `blocks`, at `addr`.
    #[inline]
    fn take_back_slot(
        blocks: &ChunkBlocks,
        index: usize,
        addr: u64,
        size: usize,
    ) -> Result<u64, FixedSizeError> {
        let Some(slot) = blocks.located_slot(index) else {
            return Err(FixedSizeError::UnknownAddress { addr });
        };
        match slot
            .size
            .compare_exchange(size, 0, Ordering::AcqRel, Ordering::Acquire)
        {
            // The acquire half of the exchange saw the hand-out's release store of the size,
            // which came after its store of the tag.
            Ok(_) if size != 0 => Ok(slot.tag.load(Ordering::Relaxed)),
            Ok(_) | Err(0) => Err(FixedSizeError::DoubleFree { addr }),
            Err(allocated) => Err(FixedSizeError::SizeMismatch {
                addr,
                allocated,
                freed: size,
            }),
        }
    }

    /// Number of blocks handed out and the sum of their sizes, over every chunk.
    #[must_use]
    pub fn handed_out(&self) -> (usize, usize) {
        self.chunks()
            .map(ChunkBlocks::handed_out)
            .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2))
    }

    /// This table with `chunk` added as chunk number `self.numbered.len()`, or the overlapping
    /// chunk.
    fn with(&self, chunk: Chunk) -> Result<Self, Chunk> {
        let at = self.entries.partition_point(|e| e.addr < chunk.addr());
        let before = at.checked_sub(1).and_then(|i| self.entries.get(i));
        let clash = before
            .filter(|e| e.addr + e.bytes > chunk.addr())
            .or_else(|| self.entries.get(at).filter(|e| e.addr < chunk.end()));
        if let Some(e) = clash {
            return Err(e.blocks.chunk);
        }
        let block_size = chunk.block_size();
        let blocks = Arc::new(ChunkBlocks::new(chunk, self.numbered.len()));
        let entry = Entry {
            addr: chunk.addr(),
            bytes: chunk.end() - chunk.addr(),
            shift: if block_size.is_power_of_two() {
                block_size.trailing_zeros()
            } else {
                u32::MAX
            },
            mask: (block_size as u64).wrapping_sub(1),
            blocks: Arc::clone(&blocks),
        };
        let entries = self.entries[..at]
            .iter()
            .cloned()
            .chain(std::iter::once(entry))
            .chain(self.entries[at..].iter().cloned())
            .collect();
        let numbered = self
            .numbered
            .iter()
            .cloned()
            .chain(std::iter::once(blocks))
            .collect();
        Ok(Self { entries, numbered })
    }
}

/// The shared record of a fixed-size resource: its chunks and, through them, the slot of every
/// block. Adding a chunk publishes a new [`BlockTable`]; earlier tables stay valid (they lack
/// only the new chunk).
#[derive(Debug)]
pub struct BlockLedger {
    block_size: usize,
    latest: Mutex<BlockTable>,
}

impl BlockLedger {
    /// A ledger of blocks of `block_size` bytes, without chunks.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::ZeroBlockSize`].
    pub fn new(block_size: usize) -> Result<Self, FixedSizeError> {
        if block_size == 0 {
            return Err(FixedSizeError::ZeroBlockSize);
        }
        Ok(Self {
            block_size,
            latest: Mutex::new(BlockTable::default()),
        })
    }

    /// The size of every block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The latest table.
    #[must_use]
    pub fn table(&self) -> BlockTable {
        self.lock().clone()
    }

    /// Adds a chunk of `count` blocks at `addr`, none handed out, and returns it.
    ///
    /// # Errors
    ///
    /// Those of [`Chunk::new`]; [`FixedSizeError::ChunkOverlap`] when it shares a byte with a
    /// known chunk (the very same chunk included). The ledger is unchanged on error.
    pub fn add_chunk(&self, addr: u64, count: usize) -> Result<Chunk, FixedSizeError> {
        self.add_numbered_chunk(addr, count).map(|(chunk, _)| chunk)
    }

    /// As [`add_chunk`](Self::add_chunk), and returns the latest table (which holds the new
    /// chunk: the blocks' ids are [`ChunkBlocks::blocks`] of its last-numbered chunk).
    ///
    /// # Errors
    ///
    /// As [`add_chunk`](Self::add_chunk).
    pub fn add_numbered_chunk(
        &self,
        addr: u64,
        count: usize,
    ) -> Result<(Chunk, BlockTable), FixedSizeError> {
        let chunk = Chunk::new(addr, self.block_size, count)?;
        let mut latest = self.lock();
        *latest = latest
            .with(chunk)
            .map_err(|existing| FixedSizeError::ChunkOverlap { chunk, existing })?;
        Ok((chunk, latest.clone()))
    }

    /// Number of blocks handed out and the sum of their sizes.
    #[must_use]
    pub fn handed_out(&self) -> (usize, usize) {
        self.table().handed_out()
    }

    fn lock(&self) -> MutexGuard<'_, BlockTable> {
        self.latest.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn chunks_are_ordered_and_never_overlap() {
        assert_eq!(
            BlockLedger::new(0).unwrap_err(),
            FixedSizeError::ZeroBlockSize
        );
        let ledger = BlockLedger::new(512).unwrap();
        let empty = ledger.table();
        assert!(empty.is_empty());
        let b = ledger.add_chunk(8192, 4).unwrap();
        let a = ledger.add_chunk(0, 2).unwrap();
        let c = ledger.add_chunk(1 << 20, 1).unwrap();
        for (addr, count) in [
            (8192, 4),
            (8192 + 1536, 4),
            (7680, 2),
            (0, 64),
            (1024 - 256, 1),
        ] {
            assert!(
                matches!(
                    ledger.add_chunk(addr, count),
                    Err(FixedSizeError::ChunkOverlap { .. })
                ),
                "{addr:#x} x {count} accepted"
            );
        }
        assert!(matches!(
            ledger.add_chunk(0, 0),
            Err(FixedSizeError::EmptyChunk { .. })
        ));
        let t = ledger.table();
        assert_eq!(
            t.chunks().map(ChunkBlocks::chunk).collect::<Vec<_>>(),
            [a, b, c]
        );
        // An older snapshot still works for what it has.
        assert!(empty.is_empty());
        assert_eq!(
            empty.locate(0).unwrap_err(),
            FixedSizeError::UnknownAddress { addr: 0 }
        );
        assert_eq!(
            t.locate(8192 + 1024).map(|(ch, i)| (ch.chunk(), i)),
            Ok((b, 2))
        );
        assert_eq!(t.locate(512).map(|(ch, i)| (ch.chunk(), i)), Ok((a, 1)));
        assert_eq!(
            t.locate(1024).unwrap_err(),
            FixedSizeError::UnknownAddress { addr: 1024 }
        );
        assert_eq!(
            t.locate(8192 + 100).unwrap_err(),
            FixedSizeError::Misaligned {
                addr: 8192 + 100,
                chunk: b
            }
        );
        assert!(t.locate(u64::MAX).is_err());
    }

    #[test]
    fn blocks_of_any_size_are_located() {
        for block in [256usize, 768, 1280, 4096] {
            let ledger = BlockLedger::new(block).unwrap();
            let chunk = ledger.add_chunk(1 << 20, 5).unwrap();
            let t = ledger.table();
            for (i, addr) in chunk.blocks().enumerate() {
                assert_eq!(t.locate(addr).map(|(_, at)| at), Ok(i), "{block}");
                for off in [1u64, 255, 256, block as u64 - 256] {
                    if off != 0 && off < block as u64 {
                        assert!(
                            matches!(t.locate(addr + off), Err(FixedSizeError::Misaligned { .. })),
                            "{block}: {addr:#x} + {off}"
                        );
                    }
                }
            }
            assert!(matches!(
                t.locate(chunk.end()),
                Err(FixedSizeError::UnknownAddress { .. })
            ));
        }
    }

    /// Blocks of 4 KiB and more have a 64-byte line of slots each (threads on different
    /// streams never write one line for two blocks); smaller blocks keep packed slots.
    #[test]
    fn large_blocks_have_a_cache_line_of_slots_each() {
        for (block, apart) in [(256usize, 16usize), (2048, 16), (4096, 64), (1 << 20, 64)] {
            let ledger = BlockLedger::new(block).unwrap();
            let base = 1u64 << 40;
            ledger.add_chunk(base, 8).unwrap();
            let t = ledger.table();
            let (c, _) = t.locate(base).unwrap();
            let at = |i: usize| std::ptr::from_ref(c.slot(i).unwrap()) as usize;
            for i in 0..7 {
                assert_eq!(at(i + 1) - at(i), apart, "blocks of {block} bytes");
            }
            assert!(c.slot(8).is_none() && c.handed_size(8).is_none());
            let second = base + block as u64;
            t.hand_out(second, 256).unwrap();
            assert_eq!((c.handed_size(0), c.handed_size(1)), (None, Some(256)));
            assert_eq!(t.handed_out(), (1, 256));
            assert_eq!(
                t.take_back(second, 512),
                Err(FixedSizeError::SizeMismatch {
                    addr: second,
                    allocated: 256,
                    freed: 512
                })
            );
            t.take_back(second, 256).unwrap();
            assert_eq!(
                t.take_back(second, 256),
                Err(FixedSizeError::DoubleFree { addr: second })
            );
            assert_eq!(t.handed_out(), (0, 0));
        }
    }

    #[test]
    fn slots_detect_every_wrong_free() {
        let ledger = BlockLedger::new(1024).unwrap();
        ledger.add_chunk(1 << 20, 4).unwrap();
        let t = ledger.table();
        let a = 1 << 20;
        let b = a + 1024;
        t.hand_out(a, 256).unwrap();
        t.hand_out(b, 1024).unwrap();
        assert_eq!(
            t.hand_out(a, 512),
            Err(FixedSizeError::HandedOutTwice { addr: a })
        );
        assert!(matches!(
            t.hand_out(a + 2048, 0),
            Err(FixedSizeError::SizeMismatch { .. })
        ));
        assert_eq!(ledger.handed_out(), (2, 1280));
        assert_eq!(
            t.take_back(a, 512),
            Err(FixedSizeError::SizeMismatch {
                addr: a,
                allocated: 256,
                freed: 512
            })
        );
        assert!(matches!(
            t.take_back(a + 256, 256),
            Err(FixedSizeError::Misaligned { .. })
        ));
        assert_eq!(
            t.take_back(a + 4096, 256),
            Err(FixedSizeError::UnknownAddress { addr: a + 4096 })
        );
        assert_eq!(
            t.take_back(a + 2048, 256),
            Err(FixedSizeError::DoubleFree { addr: a + 2048 }),
            "a block never handed out is free"
        );
        assert_eq!(
            t.take_back(a + 2048, 0),
            Err(FixedSizeError::DoubleFree { addr: a + 2048 })
        );
        t.take_back(a, 256).unwrap();
        assert_eq!(
            t.take_back(a, 256),
            Err(FixedSizeError::DoubleFree { addr: a })
        );
        assert_eq!(t.chunks().next().unwrap().handed_size(1), Some(1024));
        assert_eq!(t.chunks().next().unwrap().handed_size(0), None);
        assert!(format!("{t:?}").contains("handed_out: 1"));
    }

    #[test]
    fn tags_come_back_with_the_block() {
        let ledger = BlockLedger::new(512).unwrap();
        ledger.add_chunk(0, 4).unwrap();
        let t = ledger.table();
        t.hand_out_tagged(0, 256, 7).unwrap();
        t.hand_out_tagged(512, 512, u64::MAX).unwrap();
        // A refused hand-out leaves the first tag.
        assert_eq!(
            t.hand_out_tagged(0, 256, 9),
            Err(FixedSizeError::HandedOutTwice { addr: 0 })
        );
        // A refused take-back leaves the block and its tag.
        assert!(matches!(
            t.take_back_tagged(0, 512),
            Err(FixedSizeError::SizeMismatch { .. })
        ));
        assert_eq!(t.take_back_tagged(0, 256), Ok(7));
        assert_eq!(t.take_back_tagged(512, 512), Ok(u64::MAX));
        assert_eq!(
            t.take_back_tagged(0, 256),
            Err(FixedSizeError::DoubleFree { addr: 0 })
        );
        // An untagged hand-out overwrites an old tag with 0.
        t.hand_out(0, 256).unwrap();
        assert_eq!(t.take_back_tagged(0, 256), Ok(0));
        t.hand_out_tagged(1024, 256, 3).unwrap();
        t.take_back(1024, 256).unwrap();
        assert_eq!(ledger.handed_out(), (0, 0));
    }

    #[test]
    fn ids_find_blocks_without_a_search_and_never_another_block() {
        let ledger = BlockLedger::new(768).unwrap();
        let (b, _) = ledger.add_numbered_chunk(1 << 20, 3).unwrap();
        let (a, t) = ledger.add_numbered_chunk(0, 2).unwrap();
        // Numbered in the order added, whatever the addresses.
        let numbered: Vec<Chunk> = t.numbered_chunks().map(ChunkBlocks::chunk).collect();
        assert_eq!(numbered, [b, a]);
        let all: Vec<(u64, BlockId)> = t.numbered_chunks().flat_map(|c| c.blocks()).collect();
        assert_eq!(all.len(), 5);
        for (n, &(addr, id)) in all.iter().enumerate() {
            t.hand_out_id(id, addr, 256, n as u64).unwrap();
            assert_eq!(t.locate(addr).map(|(c, i)| c.id(i)), Ok(id));
        }
        assert_eq!(t.handed_out(), (5, 5 * 256));
        for (n, &(addr, id)) in all.iter().enumerate() {
            assert_eq!(t.take_back_id(addr, 256), Ok((id, n as u64)));
        }
        // Another block's id, or none: the address decides which slot is written.
        let (addr, _) = all[1];
        let (_, other) = all[3];
        t.hand_out_id(other, addr, 512, 9).unwrap();
        t.hand_out_id(BlockId::NONE, all[4].0, 256, 1).unwrap();
        assert_eq!(
            t.chunks().map(|c| c.handed_out()).collect::<Vec<_>>(),
            [(1, 256), (1, 512)]
        );
        assert_eq!(t.take_back_id(addr, 512), Ok((all[1].1, 9)));
        assert_eq!(t.take_back_tagged(all[4].0, 256), Ok(1));
        // Errors are those of the address.
        assert_eq!(
            t.hand_out_id(all[0].1, all[0].0, 0, 0),
            Err(FixedSizeError::SizeMismatch {
                addr: all[0].0,
                allocated: 0,
                freed: 0
            })
        );
        t.hand_out_id(all[0].1, all[0].0, 256, 0).unwrap();
        assert_eq!(
            t.hand_out_id(all[0].1, all[0].0, 256, 0),
            Err(FixedSizeError::HandedOutTwice { addr: all[0].0 })
        );
        assert_eq!(
            t.hand_out_id(all[0].1, 1 << 30, 256, 0),
            Err(FixedSizeError::UnknownAddress { addr: 1 << 30 })
        );
        // A table that lacks the chunk refuses its ids as unknown addresses.
        let stale = BlockTable::default();
        assert_eq!(
            stale.hand_out_id(all[2].1, all[2].0, 256, 0),
            Err(FixedSizeError::UnknownAddress { addr: all[2].0 })
        );
        t.take_back(all[0].0, 256).unwrap();
        assert_eq!(ledger.handed_out(), (0, 0));
    }

    #[test]
    fn concurrent_frees_of_one_block_succeed_once() {
        let ledger = BlockLedger::new(256).unwrap();
        ledger.add_chunk(0, 64).unwrap();
        for round in 0..200u64 {
            let addr = (round % 64) * 256;
            let t = ledger.table();
            t.hand_out(addr, 256).unwrap();
            let wins: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..3)
                    .map(|_| {
                        let t = t.clone();
                        s.spawn(move || usize::from(t.take_back(addr, 256).is_ok()))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(wins, 1, "round {round}");
        }
        assert_eq!(ledger.handed_out(), (0, 0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Grow(usize, bool),
        HandOut(usize, usize),
        TakeBack(usize, usize),
        Stray(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (1..6usize, any::<bool>()).prop_map(|(n, gap)| Op::Grow(n, gap)),
            4 => (any::<usize>(), 1..5usize).prop_map(|(i, s)| Op::HandOut(i, s * 256)),
            4 => (any::<usize>(), 1..5usize).prop_map(|(i, s)| Op::TakeBack(i, s * 256)),
            1 => (any::<usize>(), 1..2048u64).prop_map(|(i, off)| Op::Stray(i, off)),
        ]
    }

    const BLOCK: usize = 1024;

    proptest! {
        #[test]
        fn ledger_model(ops in proptest::collection::vec(op(), 1..200)) {
            let ledger = BlockLedger::new(BLOCK).unwrap();
            // A reader whose snapshot lags: refreshed only on an unknown address.
            let mut stale = ledger.table();
            let mut blocks: Vec<u64> = Vec::new();
            // Each block's id, as a free list keeps it.
            let mut ids: Vec<BlockId> = Vec::new();
            let mut model: HashMap<u64, (usize, u64)> = HashMap::new();
            let mut next = 1u64 << 30;
            for op in ops {
                match op {
                    Op::Grow(count, gap) => {
                        if gap {
                            next += 4096;
                        }
                        let (chunk, latest) = ledger.add_numbered_chunk(next, count).unwrap();
                        let numbered = latest.numbered_chunks().last().unwrap();
                        prop_assert_eq!(numbered.chunk(), chunk);
                        blocks.extend(chunk.blocks());
                        ids.extend(numbered.blocks().map(|(_, id)| id));
                        next = chunk.end();
                    }
                    Op::HandOut(i, size) if !blocks.is_empty() => {
                        let addr = blocks[i % blocks.len()];
                        // A tag that differs between hand-outs of one block.
                        let tag = i as u64;
                        // Mostly by the block's own id; at times by another block's id or by
                        // none (both found by the address instead).
                        let id = match i % 5 {
                            0 => BlockId::NONE,
                            1 => ids[(i / 5) % ids.len()],
                            _ => ids[i % blocks.len()],
                        };
                        let mut r = stale.hand_out_id(id, addr, size, tag);
                        if matches!(r, Err(FixedSizeError::UnknownAddress { .. })) {
                            stale = ledger.table();
                            r = stale.hand_out_id(id, addr, size, tag);
                        }
                        match model.get(&addr) {
                            Some(_) => prop_assert_eq!(r, Err(FixedSizeError::HandedOutTwice { addr })),
                            None => {
                                prop_assert_eq!(r, Ok(()));
                                model.insert(addr, (size, tag));
                            }
                        }
                    }
                    Op::TakeBack(i, size) if !blocks.is_empty() => {
                        let addr = blocks[i % blocks.len()];
                        let r = ledger.table().take_back_id(addr, size).map(|(id, tag)| {
                            assert_eq!(id, ids[i % blocks.len()], "the id of {addr:#x}");
                            tag
                        });
                        match model.get(&addr).copied() {
                            None => prop_assert_eq!(r, Err(FixedSizeError::DoubleFree { addr })),
                            Some((allocated, _)) if allocated != size => prop_assert_eq!(
                                r,
                                Err(FixedSizeError::SizeMismatch { addr, allocated, freed: size })
                            ),
                            Some((_, tag)) => {
                                prop_assert_eq!(r, Ok(tag));
                                model.remove(&addr);
                            }
                        }
                    }
                    Op::Stray(i, off) => {
                        let base = blocks.get(i % blocks.len().max(1)).copied().unwrap_or(next);
                        let addr = base + off;
                        let r = ledger.table().take_back(addr, 256);
                        let is_block = blocks.contains(&addr);
                        if !is_block {
                            let bad = matches!(
                                r,
                                Err(FixedSizeError::UnknownAddress { .. } | FixedSizeError::Misaligned { .. })
                            );
                            prop_assert!(bad, "{:?} for a stray address", r);
                        } else if model.get(&addr).map(|&(size, _)| size) == Some(256) {
                            prop_assert_eq!(r, Ok(()));
                            model.remove(&addr);
                        } else {
                            prop_assert!(r.is_err());
                        }
                    }
                    _ => {}
                }
                let bytes: usize = model.values().map(|&(size, _)| size).sum();
                prop_assert_eq!(ledger.handed_out(), (model.len(), bytes));
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
