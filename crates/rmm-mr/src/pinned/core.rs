//! The pinned host pool's bookkeeping: size classes, chunks, free lists keyed by class, blocks
//! in use with the events recorded on them, and the queue of freed blocks whose events have not
//! completed yet. No CUDA calls: the event type `E` is a parameter (a `CudaEvent` in the pool, a
//! plain value in the tests), and the caller says which events have completed.
//!
//! **Size classes.** A request of `bytes` is served by a block of [`class_size`]`(bytes)`: the
//! next power of two, at least [`MIN_BLOCK`] (256 B). Classes below [`CHUNK_BYTES`] (2 MiB) are
//! carved from 2 MiB chunks (one chunk holds `2 MiB / class` blocks of one class); larger
//! classes get a chunk of exactly their size. A block's address is a multiple of its size
//! within its chunk, so with page-aligned chunks every block is aligned to
//! `min(class, page)`. At most half of a block is waste (a 1 MiB + 1 B request takes 2 MiB),
//! the price PyTorch's `CachingHostAllocator` also pays for reuse by class.
//!
//! **Reuse.** A block freed with no recorded events goes straight back to its class's free
//! list; one with events waits in the pending queue until [`PinnedLedger::reclaim`] finds all of
//! them complete. A chunk is given back ([`PinnedLedger::release`]) only when none of its blocks
//! is in use or pending.

use std::collections::{BTreeMap, HashMap};

/// The smallest block (and the alignment every block has at least).
pub const MIN_BLOCK: usize = 256;
/// The size of the chunks small classes are carved from.
pub const CHUNK_BYTES: usize = 2 << 20;
/// The largest class (requests above it are refused before any driver call).
pub const MAX_CLASS: usize = 1 << 62;

/// A size class: the log2 of the block size.
pub(crate) type Class = u32;

/// The class of a request of `bytes`, or `None` when it is larger than [`MAX_CLASS`].
/// `bytes == 0` is the smallest class (the pool itself never asks for 0).
#[must_use]
pub fn class_of(bytes: usize) -> Option<Class> {
    if bytes > MAX_CLASS {
        return None;
    }
    Some(bytes.max(MIN_BLOCK).next_power_of_two().trailing_zeros())
}

/// The block size of class `class`.
#[must_use]
pub(crate) const fn class_bytes(class: Class) -> usize {
    1usize << class
}

/// The block size a request of `bytes` is served with, or `None` above [`MAX_CLASS`].
#[must_use]
pub fn class_size(bytes: usize) -> Option<usize> {
    class_of(bytes).map(class_bytes)
}

/// The size of the chunk that holds blocks of `class`: [`CHUNK_BYTES`], or the class itself
/// when larger.
#[must_use]
pub const fn chunk_bytes_for(class: Class) -> usize {
    let b = class_bytes(class);
    if b < CHUNK_BYTES {
        CHUNK_BYTES
    } else {
        b
    }
}

/// What the ledger rejects (the pool turns these into `MrError`s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// The address is not a block in use here.
    UnknownBlock(usize),
    /// The request is larger than [`MAX_CLASS`].
    TooLarge(usize),
    /// A chunk that overlaps one the ledger already has, or is misaligned or too small.
    BadChunk {
        /// Its address.
        base: usize,
        /// Its size.
        bytes: usize,
    },
}

/// One block: where it is, its class and the chunk it was carved from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    addr: usize,
    class: Class,
    chunk: usize,
}

#[derive(Debug)]
struct Chunk {
    base: usize,
    bytes: usize,
    /// The class of all its blocks.
    class: Class,
    /// Blocks of this chunk in use or pending.
    outstanding: usize,
}

#[derive(Debug)]
struct InUse<E> {
    block: Block,
    requested: usize,
    events: Vec<E>,
}

#[derive(Debug)]
struct Pending<E> {
    block: Block,
    events: Vec<E>,
}

/// The pool's counters.
#[doc(alias = "HostStats")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinnedPoolStatistics {
    /// Bytes held from the driver (the chunks).
    pub reserved_bytes: usize,
    /// Bytes of blocks handed out and not freed (class sizes).
    pub in_use_bytes: usize,
    /// Bytes asked for by the blocks in use (before rounding).
    pub requested_bytes: usize,
    /// The largest `in_use_bytes` seen since creation or [`reset_peak`](crate::PinnedHostPool::reset_peak).
    pub peak_in_use_bytes: usize,
    /// Bytes of freed blocks waiting for their events.
    pub pending_bytes: usize,
    /// Bytes of blocks free for reuse now.
    pub cached_bytes: usize,
    /// Chunks held.
    pub chunks: usize,
    /// Requests served from a free list (no driver allocation).
    pub hits: u64,
    /// Requests that needed a new chunk.
    pub misses: u64,
}

/// The bookkeeping of one pool; `E` is the event type.
#[derive(Debug)]
pub struct PinnedLedger<E> {
    /// Chunks by their base address.
    chunks: BTreeMap<usize, Chunk>,
    /// Blocks free for reuse, per class (LIFO: the most recently freed is warmest).
    free: BTreeMap<Class, Vec<Block>>,
    /// Freed blocks waiting for events, oldest first.
    pending: Vec<Pending<E>>,
    in_use: HashMap<usize, InUse<E>>,
    stats: PinnedPoolStatistics,
}

impl<E> Default for PinnedLedger<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> PinnedLedger<E> {
    /// An empty ledger.
    #[must_use]
    pub fn new() -> Self {
        Self {
            chunks: BTreeMap::new(),
            free: BTreeMap::new(),
            pending: Vec::new(),
            in_use: HashMap::new(),
            stats: PinnedPoolStatistics::default(),
        }
    }

    /// The counters.
    #[must_use]
    pub fn statistics(&self) -> PinnedPoolStatistics {
        self.stats
    }

    /// Sets the peak to the bytes in use now.
    pub fn reset_peak(&mut self) {
        self.stats.peak_in_use_bytes = self.stats.in_use_bytes;
    }

    /// Hands out a free block for `bytes` if one of its class is free: its address. `Ok(None)`
    /// when the class's free list is empty (the caller reclaims, then adds a chunk).
    pub fn take(&mut self, bytes: usize) -> Result<Option<usize>, LedgerError> {
        let class = class_of(bytes).ok_or(LedgerError::TooLarge(bytes))?;
        let Some(block) = self.free.get_mut(&class).and_then(Vec::pop) else {
            return Ok(None);
        };
        let size = class_bytes(class);
        self.stats.cached_bytes -= size;
        self.chunk_mut(block.chunk).outstanding += 1;
        self.hand_out(block, bytes);
        self.stats.hits += 1;
        Ok(Some(block.addr))
    }

    /// Adds a chunk of `bytes` at `base` for requests of `request` bytes: carves it into blocks
    /// of that class, hands the first one out for the request and frees the rest. The chunk
    /// must be [`chunk_bytes_for`] the class, at least [`MIN_BLOCK`]-aligned and not overlap
    /// another.
    pub fn add_chunk(
        &mut self,
        base: usize,
        bytes: usize,
        request: usize,
    ) -> Result<usize, LedgerError> {
        let class = class_of(request).ok_or(LedgerError::TooLarge(request))?;
        let size = class_bytes(class);
        let bad = LedgerError::BadChunk { base, bytes };
        if bytes != chunk_bytes_for(class) || base % MIN_BLOCK != 0 || base == 0 {
            return Err(bad);
        }
        let end = base.checked_add(bytes).ok_or(bad.clone())?;
        let before = self.chunks.range(..end).next_back();
        if before.is_some_and(|(_, c)| c.base + c.bytes > base) {
            return Err(bad);
        }
        self.chunks.insert(
            base,
            Chunk {
                base,
                bytes,
                class,
                outstanding: 1,
            },
        );
        self.stats.reserved_bytes += bytes;
        self.stats.chunks += 1;
        self.stats.misses += 1;
        let free = self.free.entry(class).or_default();
        // The last block first, so that the free list pops them in address order.
        for i in (1..bytes / size).rev() {
            free.push(Block {
                addr: base + i * size,
                class,
                chunk: base,
            });
        }
        self.stats.cached_bytes += bytes - size;
        self.hand_out(
            Block {
                addr: base,
                class,
                chunk: base,
            },
            request,
        );
        Ok(base)
    }

    fn hand_out(&mut self, block: Block, requested: usize) {
        let size = class_bytes(block.class);
        self.in_use.insert(
            block.addr,
            InUse {
                block,
                requested,
                events: Vec::new(),
            },
        );
        self.stats.in_use_bytes += size;
        self.stats.requested_bytes += requested;
        self.stats.peak_in_use_bytes = self.stats.peak_in_use_bytes.max(self.stats.in_use_bytes);
    }

    fn chunk_mut(&mut self, base: usize) -> &mut Chunk {
        self.chunks
            .get_mut(&base)
            .expect("a block's chunk is in the ledger while the block is")
    }

    /// The size of the block in use at `addr` (its class) and the bytes asked for.
    pub fn block_size(&self, addr: usize) -> Result<(usize, usize), LedgerError> {
        self.in_use
            .get(&addr)
            .map(|b| (class_bytes(b.block.class), b.requested))
            .ok_or(LedgerError::UnknownBlock(addr))
    }

    /// The block in use that contains `addr` (any address inside it): its start.
    #[must_use]
    pub fn containing(&self, addr: usize) -> Option<usize> {
        let (_, chunk) = self.chunks.range(..=addr).next_back()?;
        if addr >= chunk.base + chunk.bytes {
            return None;
        }
        let size = class_bytes(chunk.class);
        let start = chunk.base + (addr - chunk.base) / size * size;
        self.in_use.contains_key(&start).then_some(start)
    }

    /// Records `event` on the block in use at `addr`: the block is not reused until it has
    /// completed. The event comes back when `addr` is not a block in use.
    pub fn record(&mut self, addr: usize, event: E) -> Result<(), (LedgerError, E)> {
        match self.in_use.get_mut(&addr) {
            Some(b) => {
                b.events.push(event);
                Ok(())
            }
            None => Err((LedgerError::UnknownBlock(addr), event)),
        }
    }

    /// Takes the events recorded on the block in use at `addr` (the caller waits for them, then
    /// recycles them or, if waiting failed, records them again).
    pub fn take_events(&mut self, addr: usize) -> Result<Vec<E>, LedgerError> {
        self.in_use
            .get_mut(&addr)
            .map(|b| std::mem::take(&mut b.events))
            .ok_or(LedgerError::UnknownBlock(addr))
    }

    /// Frees the block at `addr`: straight to its free list without events, to the pending
    /// queue with them. Returns the bytes asked for when it was taken.
    pub fn free(&mut self, addr: usize) -> Result<usize, LedgerError> {
        let b = self
            .in_use
            .remove(&addr)
            .ok_or(LedgerError::UnknownBlock(addr))?;
        let size = class_bytes(b.block.class);
        self.stats.in_use_bytes -= size;
        self.stats.requested_bytes -= b.requested;
        if b.events.is_empty() {
            self.push_free(b.block);
        } else {
            self.stats.pending_bytes += size;
            self.pending.push(Pending {
                block: b.block,
                events: b.events,
            });
        }
        Ok(b.requested)
    }

    fn push_free(&mut self, block: Block) {
        self.chunk_mut(block.chunk).outstanding -= 1;
        self.stats.cached_bytes += class_bytes(block.class);
        self.free.entry(block.class).or_default().push(block);
    }

    /// Moves every pending block whose events have all completed (`done(e)` for each) to its
    /// free list; returns the completed events (for reuse). An event found complete is removed
    /// even when others of its block are not.
    pub fn reclaim(&mut self, mut done: impl FnMut(&E) -> bool) -> Vec<E> {
        let mut completed = Vec::new();
        let mut ready = Vec::new();
        self.pending.retain_mut(|p| {
            let mut i = 0;
            while i < p.events.len() {
                if done(&p.events[i]) {
                    completed.push(p.events.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            if p.events.is_empty() {
                ready.push(p.block);
                false
            } else {
                true
            }
        });
        for block in ready {
            self.stats.pending_bytes -= class_bytes(block.class);
            self.push_free(block);
        }
        completed
    }

    /// Whether any freed block still waits for events.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes every pending block's events and frees the blocks (the caller has waited for all
    /// of them, or is about to: used before the chunks are given back).
    pub fn drain_pending(&mut self) -> Vec<E> {
        let mut events = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            events.extend(p.events);
            self.stats.pending_bytes -= class_bytes(p.block.class);
            self.push_free(p.block);
        }
        events
    }

    /// Removes every chunk none of whose blocks is in use or pending, and returns them
    /// (`(base, bytes)`) for the caller to give back to the driver.
    pub fn release(&mut self) -> Vec<(usize, usize)> {
        let idle: Vec<(usize, usize)> = self
            .chunks
            .values()
            .filter(|c| c.outstanding == 0)
            .map(|c| (c.base, c.bytes))
            .collect();
        if idle.is_empty() {
            return idle;
        }
        for list in self.free.values_mut() {
            list.retain(|b| self.chunks[&b.chunk].outstanding != 0);
        }
        for &(base, bytes) in &idle {
            self.chunks.remove(&base);
            self.stats.reserved_bytes -= bytes;
            self.stats.cached_bytes -= bytes;
            self.stats.chunks -= 1;
        }
        self.free.retain(|_, l| !l.is_empty());
        idle
    }

    /// Every chunk, whatever its state (`(base, bytes)`): what the pool gives back when it is
    /// dropped.
    #[must_use]
    pub fn all_chunks(&self) -> Vec<(usize, usize)> {
        self.chunks.values().map(|c| (c.base, c.bytes)).collect()
    }

    /// Blocks in use.
    #[must_use]
    pub fn blocks_in_use(&self) -> usize {
        self.in_use.len()
    }
}

#[cfg(test)]
mod tests;
