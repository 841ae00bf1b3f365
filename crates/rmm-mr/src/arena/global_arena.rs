//! [`GlobalArena`]: the single upstream span, as one address-ordered map of blocks (free ones,
//! live ones and superblocks lent to local arenas) that serves large requests and lends
//! superblocks.

use std::collections::BTreeSet;
use std::fmt;

use super::fit_tree::{FitItem, FitTree, Handle};
use super::size_class::{align_down, align_up, ALLOCATION_ALIGNMENT};
use super::{ArenaError, ArenaStats, Block, RejectedSuperblock, Superblock, SUPERBLOCK_MIN_SIZE};
use crate::util::format::format_bytes;

/// Where [`GlobalArena::find`] located an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuperblockLocation {
    /// In memory the global arena holds: the free or live block containing it.
    Global(Block),
    /// In a superblock lent to some local arena (its span); the caller knows which arena.
    Lent(Block),
}

/// What a block of the span is, for the global arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Free: serves large requests and loans.
    Free,
    /// Handed out: a large allocation, or a block a superblock held when it came back.
    Live,
    /// A superblock lent to a local arena.
    Lent,
}

/// One block of the span. The blocks tile the span; no two free ones are adjacent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    addr: u64,
    size: usize,
    kind: Kind,
}

impl Piece {
    fn block(&self) -> Block {
        Block::new(self.addr, self.size)
    }

    fn end(&self) -> u64 {
        self.addr.saturating_add(self.size as u64)
    }
}

impl FitItem for Piece {
    fn key(&self) -> u64 {
        self.addr
    }

    /// Only free blocks serve anything.
    fn fit(&self) -> usize {
        match self.kind {
            Kind::Free => self.size,
            Kind::Live | Kind::Lent => 0,
        }
    }
}

/// The global arena (RMM's `global_arena`): the whole upstream allocation, lent to local
/// arenas a superblock at a time and serving large requests directly.
///
/// Unlike RMM's, which keeps a set of superblocks and merges two only when both are empty, it
/// keeps the span as one address-ordered map of blocks: free blocks, live blocks (large
/// allocations, and the blocks a superblock still held when it came back) and lent
/// superblocks. Free memory is therefore always coalesced across what used to be superblock
/// boundaries: a superblock that comes back ([`release`](Self::release)) dissolves into the
/// map, its free blocks merging with free neighbours, its live blocks staying where they are
/// until they are freed here. Requests are placed by **best fit** (the smallest free block
/// that fits, the lowest address among equals), where RMM uses address-ordered first fit:
/// with the arena nearly full, best fit leaves the large free blocks whole for the large
/// requests (`docs/internals/arena.md` has the figures). Loans are always fresh (empty)
/// superblocks carved out of a free block (of at least [`SUPERBLOCK_MIN_SIZE`] while there is
/// room), never blocks some other stream still uses.
///
/// Lent superblocks are recorded (address and size) so that only they can be released back,
/// once each.
///
/// The type owns no memory: the resource allocates the span from upstream, builds the arena over
/// `(addr, size)`, and frees the span (see [`span`](Self::span)) when the resource is dropped.
///
/// Costs (n = blocks of the map): [`acquire`](Self::acquire),
/// [`allocate_large`](Self::allocate_large), [`deallocate`](Self::deallocate),
/// [`reclaim`](Self::reclaim) and [`find`](Self::find) are `O(log n)`;
/// [`release`](Self::release) is `O(log n)` for an empty superblock and `O(b log n)` for one
/// that still holds `b` live blocks; [`stats`](Self::stats) and the `Display` dump are `O(n)`.
#[doc(alias = "rmm::mr::detail::arena::global_arena")]
pub struct GlobalArena {
    span: Block,
    /// Every block of the span by address, indexed by the largest free one.
    pieces: FitTree<Piece>,
    /// The free blocks as `(size, address)`: the best fit is the first at or above a size.
    free_by_size: BTreeSet<(usize, u64)>,
    free_bytes: usize,
    live_count: usize,
    live_bytes: usize,
    lent_count: usize,
    lent_bytes: usize,
}

impl GlobalArena {
    /// A global arena over the upstream allocation `[addr, addr + size)`.
    ///
    /// As in RMM the size is aligned down to 256 bytes first (the tail is never used).
    /// Errors: [`ArenaError::TooSmall`] when that is below [`SUPERBLOCK_MIN_SIZE`]
    /// (RMM: "Arena size smaller than minimum superblock size."); [`ArenaError::InvalidSpan`] when
    /// `addr` is not 256-aligned or the span wraps around the address space.
    pub fn new(addr: u64, size: usize) -> Result<Self, ArenaError> {
        let aligned = align_down(size);
        if aligned < SUPERBLOCK_MIN_SIZE {
            return Err(ArenaError::TooSmall {
                size,
                minimum: SUPERBLOCK_MIN_SIZE,
            });
        }
        if addr % ALLOCATION_ALIGNMENT as u64 != 0 || addr.checked_add(aligned as u64).is_none() {
            return Err(ArenaError::InvalidSpan { addr, size });
        }
        let span = Block::new(addr, aligned);
        let mut arena = Self {
            span,
            pieces: FitTree::new(),
            free_by_size: BTreeSet::new(),
            free_bytes: 0,
            live_count: 0,
            live_bytes: 0,
            lent_count: 0,
            lent_bytes: 0,
        };
        arena.insert_piece(Piece {
            addr,
            size: aligned,
            kind: Kind::Free,
        });
        Ok(arena)
    }

    /// The span the arena manages (RMM's `upstream_block_`): the size is the one given to
    /// [`new`](Self::new), aligned down to 256.
    #[doc(alias = "upstream_block")]
    pub fn span(&self) -> Block {
        self.span
    }

    /// Whether a request of `size` bytes is "large" and served by the global arena directly
    /// (`size > 1 MiB`, RMM's `global_arena::handles`).
    pub fn handles(size: usize) -> bool {
        size > SUPERBLOCK_MIN_SIZE
    }

    // --- the map ------------------------------------------------------------------------

    fn piece_at(&self, h: Handle) -> Option<Piece> {
        self.pieces.get_at(h).copied()
    }

    /// The block containing `addr`, if `addr` is in the span.
    fn containing(&self, addr: u64) -> Option<(Handle, Piece)> {
        let h = self.pieces.floor_handle(addr)?;
        let piece = self.piece_at(h)?;
        (addr < piece.end()).then_some((h, piece))
    }

    /// Counts a block that joins the map (its own bookkeeping: index, byte and block counts).
    fn count_in(&mut self, piece: &Piece) {
        match piece.kind {
            Kind::Free => {
                self.free_by_size.insert((piece.size, piece.addr));
                self.free_bytes += piece.size;
            }
            Kind::Live => {
                self.live_count += 1;
                self.live_bytes += piece.size;
            }
            Kind::Lent => {
                self.lent_count += 1;
                self.lent_bytes += piece.size;
            }
        }
    }

    /// Uncounts a block that leaves the map (or changes kind).
    fn count_out(&mut self, piece: &Piece) {
        match piece.kind {
            Kind::Free => {
                self.free_by_size.remove(&(piece.size, piece.addr));
                self.free_bytes -= piece.size;
            }
            Kind::Live => {
                self.live_count -= 1;
                self.live_bytes -= piece.size;
            }
            Kind::Lent => {
                self.lent_count -= 1;
                self.lent_bytes -= piece.size;
            }
        }
    }

    fn insert_piece(&mut self, piece: Piece) {
        let inserted = self.pieces.insert(piece).is_ok();
        debug_assert!(inserted, "blocks of the global arena overlap");
        if inserted {
            self.count_in(&piece);
        }
    }

    /// Changes the block at `h` (same address) to `new`.
    fn replace_at(&mut self, h: Handle, old: Piece, new: Piece) {
        debug_assert_eq!(old.addr, new.addr);
        self.count_out(&old);
        self.pieces.update_at(h, |p| *p = new);
        self.count_in(&new);
    }

    /// The free block a request of `size` bytes goes to: the smallest that fits, the lowest
    /// address among equals.
    fn best_fit(&self, size: usize) -> Option<(Handle, Piece)> {
        let &(_, addr) = self.free_by_size.range((size, 0)..).next()?;
        let h = self.pieces.find_handle(addr)?;
        Some((h, self.piece_at(h)?))
    }

    /// Turns the head of `size` bytes of the free block `(h, free)` into a block of `kind`;
    /// the rest stays free.
    fn carve(&mut self, h: Handle, free: Piece, size: usize, kind: Kind) -> Block {
        debug_assert!(free.kind == Kind::Free && size > 0 && size <= free.size);
        self.replace_at(
            h,
            free,
            Piece {
                addr: free.addr,
                size,
                kind,
            },
        );
        if free.size > size {
            let rest = Piece {
                addr: free.addr + size as u64,
                size: free.size - size,
                kind: Kind::Free,
            };
            let inserted = self.pieces.insert_after(h, rest).is_ok();
            debug_assert!(inserted);
            if inserted {
                self.count_in(&rest);
            }
        }
        Block::new(free.addr, size)
    }

    /// Makes the block at `h` free (if it is not) and merges it with its free neighbours.
    fn free_and_merge(&mut self, h: Handle) {
        let Some(piece) = self.piece_at(h) else {
            return;
        };
        let free_at = |this: &Self, n: Option<Handle>| {
            n.and_then(|n| {
                this.piece_at(n)
                    .filter(|p| p.kind == Kind::Free)
                    .map(|p| (n, p))
            })
        };
        let prev = free_at(self, self.pieces.prev(h));
        let next = free_at(self, self.pieces.next(h));
        self.count_out(&piece);
        let mut merged = Piece {
            kind: Kind::Free,
            ..piece
        };
        if let Some((nh, next)) = next {
            self.count_out(&next);
            self.pieces.remove_at(nh);
            merged.size += next.size;
        }
        let mut at = h;
        if let Some((ph, prev)) = prev {
            self.count_out(&prev);
            self.pieces.remove_at(h);
            merged.addr = prev.addr;
            merged.size += prev.size;
            at = ph;
        }
        self.pieces.update_at(at, |p| *p = merged);
        self.count_in(&merged);
    }

    // --- loans ------------------------------------------------------------------------------

    /// Lend a local arena a superblock that can serve `size` bytes (rounded up to 256).
    ///
    /// The superblock is carved out of the best-fitting free block of at least
    /// `max(size, 1 MiB)` bytes: a head of that size, or the whole free block when what would
    /// be left is smaller than a superblock (RMM's rule for splitting). When no free block is
    /// that large, the best-fitting free block of at least `size` bytes is lent whole, however
    /// small: a superblock below [`SUPERBLOCK_MIN_SIZE`] (memory beside blocks still in use,
    /// which RMM would lend inside a partly used superblock). It is always empty.
    /// `None` when no free block fits `size` (or `size` is 0).
    pub fn acquire(&mut self, size: usize) -> Option<Superblock> {
        let size = align_up(size).filter(|&s| s > 0)?;
        let head = size.max(SUPERBLOCK_MIN_SIZE);
        let (h, free, take) = match self.best_fit(head) {
            Some((h, free)) if free.size - head >= SUPERBLOCK_MIN_SIZE => (h, free, head),
            Some((h, free)) => (h, free, free.size),
            None => {
                let (h, free) = self.best_fit(size)?;
                (h, free, free.size)
            }
        };
        Some(Superblock::fresh(self.carve(h, free, take, Kind::Lent)))
    }

    /// Take back a superblock lent by [`acquire`](Self::acquire) (or [`reclaim`](Self::reclaim)),
    /// in whatever state: it dissolves into the map, its free blocks merging with the free
    /// memory around them and its live blocks staying live here (free them with
    /// [`deallocate`](Self::deallocate)).
    ///
    /// A superblock that this arena did not lend (or already got back) is refused with
    /// [`ArenaError::ForeignSuperblock`] and handed back.
    pub fn release(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        let span = superblock.span();
        let lent = self.pieces.find_handle(span.addr).and_then(|h| {
            self.piece_at(h)
                .filter(|p| p.kind == Kind::Lent && p.size == span.size)
                .map(|p| (h, p))
        });
        let Some((h, loan)) = lent else {
            return Err(RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: span.addr,
                    size: span.size,
                },
                superblock: Box::new(superblock),
            });
        };
        if superblock.is_empty() {
            self.free_and_merge(h);
            return Ok(());
        }
        let blocks: Vec<(Block, bool)> = superblock.blocks().collect();
        drop(superblock);
        self.count_out(&loan);
        self.pieces.remove_at(h);
        let (first, last) = (blocks.first().copied(), blocks.last().copied());
        for (block, free) in blocks {
            self.insert_piece(Piece {
                addr: block.addr,
                size: block.size,
                kind: if free { Kind::Free } else { Kind::Live },
            });
        }
        // Inside the superblock free blocks were already coalesced; merge its ends with the
        // free memory around it.
        for (block, free) in [first, last].into_iter().flatten() {
            if free {
                if let Some(h) = self.pieces.find_handle(block.addr) {
                    self.free_and_merge(h);
                }
            }
        }
        Ok(())
    }

    /// Release every superblock of `superblocks` (RMM's `release(std::set<superblock>&)`); stops
    /// at the first refused one, which is returned with the error (the rest stay in the iterator).
    pub fn release_all(
        &mut self,
        superblocks: impl IntoIterator<Item = Superblock>,
    ) -> Result<(), RejectedSuperblock> {
        superblocks.into_iter().try_for_each(|sb| self.release(sb))
    }

    // --- large requests -----------------------------------------------------------------

    /// Allocate a block of `size` bytes (rounded up to 256) straight from the global arena
    /// (RMM's `global_arena::allocate_sync`, used for [large](Self::handles) requests): the
    /// head of the best-fitting free block. `None` when nothing fits.
    #[doc(alias = "allocate_sync")]
    pub fn allocate_large(&mut self, size: usize) -> Option<u64> {
        let size = align_up(size).filter(|&s| s > 0)?;
        let (h, free) = self.best_fit(size)?;
        Some(self.carve(h, free, size, Kind::Live).addr)
    }

    /// Free a live block the global arena holds (any size; RMM's
    /// `global_arena::deallocate_sync`), merging it with the free memory around it.
    ///
    /// `Ok(true)`: freed. `Ok(false)`: `addr` is outside the span or in a lent superblock (it
    /// may be in a local arena; keep searching). `Err`: the global arena holds `addr` but the
    /// free is wrong: [`ArenaError::SizeMismatch`] when a live block starts at `addr` with
    /// another size, [`ArenaError::DoubleFree`] when no live block starts there and the range
    /// overlaps free memory, [`ArenaError::NotFound`] otherwise; nothing changed.
    pub fn deallocate(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let Some((h, piece)) = self.containing(addr) else {
            return Ok(false);
        };
        match piece.kind {
            Kind::Lent => Ok(false),
            Kind::Live if piece.addr == addr && align_up(size) == Some(piece.size) => {
                self.free_and_merge(h);
                Ok(true)
            }
            Kind::Live | Kind::Free => Err(self.wrong_free(addr, size)),
        }
    }

    /// What is wrong with a free of `(addr, size)` that does not name a live block here.
    fn wrong_free(&self, addr: u64, size: usize) -> ArenaError {
        let not_found = ArenaError::NotFound { addr, size };
        let Some(rounded) = align_up(size) else {
            return not_found;
        };
        match self.pieces.get(addr) {
            Some(p) if p.kind == Kind::Live => ArenaError::SizeMismatch {
                addr,
                size,
                allocated: p.size,
            },
            _ if self.overlaps_free(addr, rounded) => ArenaError::DoubleFree { addr, size },
            _ => not_found,
        }
    }

    /// Whether `[addr, addr + size)` shares a byte with a free block (a zero-size range counts
    /// when `addr` lies strictly inside a free block).
    fn overlaps_free(&self, addr: u64, size: usize) -> bool {
        let end = addr.saturating_add(size as u64).max(addr.saturating_add(1));
        self.pieces
            .last_fit_at_or_before(end - 1, 1)
            .is_some_and(|p| p.end() > addr && (size > 0 || p.addr < addr))
    }

    /// Free a large allocation made by [`allocate_large`](Self::allocate_large): like
    /// [`deallocate`](Self::deallocate), but "not held here" is [`ArenaError::NotFound`].
    pub fn deallocate_large(&mut self, addr: u64, size: usize) -> Result<(), ArenaError> {
        match self.deallocate(addr, size)? {
            true => Ok(()),
            false => Err(ArenaError::NotFound { addr, size }),
        }
    }

    /// Check a free like [`deallocate`](Self::deallocate) would, without doing it: `Ok(true)`
    /// when `(addr, size)` is a live block held here, `Ok(false)` when the global arena does
    /// not hold `addr`, the error `deallocate` would give otherwise.
    pub fn check_deallocate(&self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        match self.containing(addr) {
            None => Ok(false),
            Some((_, piece)) => match piece.kind {
                Kind::Lent => Ok(false),
                Kind::Live if piece.addr == addr && align_up(size) == Some(piece.size) => Ok(true),
                Kind::Live | Kind::Free => Err(self.wrong_free(addr, size)),
            },
        }
    }

    /// Free the live block `(addr, size)` held here if it is at least a superblock
    /// ([`SUPERBLOCK_MIN_SIZE`]) and at most `max_size` bytes, and lend its span, now an empty
    /// superblock, instead of keeping it (RMM has no such operation).
    ///
    /// This is for a resource that lets the stream that freed a large block keep its memory
    /// for its next large requests ([`LocalArena::keep`](super::LocalArena::keep)): memory that
    /// stream may reuse at once, without first waiting for its work. `None`, with nothing
    /// changed, in every other case, wrong frees included (use [`deallocate`](Self::deallocate)
    /// to free and learn what is wrong).
    pub fn reclaim(&mut self, addr: u64, size: usize, max_size: usize) -> Option<Superblock> {
        let size = align_up(size)?;
        let h = self.pieces.find_handle(addr)?;
        let piece = self.piece_at(h).filter(|p| {
            p.kind == Kind::Live
                && p.size == size
                && size >= SUPERBLOCK_MIN_SIZE
                && size <= max_size
        })?;
        self.replace_at(
            h,
            piece,
            Piece {
                kind: Kind::Lent,
                ..piece
            },
        );
        Some(Superblock::fresh(piece.block()))
    }

    // --- queries ------------------------------------------------------------------------

    /// Whether the global arena holds `addr` (it is in the span and not in a lent superblock).
    pub fn contains(&self, addr: u64) -> bool {
        self.containing(addr)
            .is_some_and(|(_, piece)| piece.kind != Kind::Lent)
    }

    /// Where `addr` is: in a block the global arena holds, in a lent superblock, or nowhere
    /// (outside the span). Lets the resource route a free without trying every arena.
    pub fn find(&self, addr: u64) -> Option<SuperblockLocation> {
        let (_, piece) = self.containing(addr)?;
        Some(match piece.kind {
            Kind::Lent => SuperblockLocation::Lent(piece.block()),
            Kind::Free | Kind::Live => SuperblockLocation::Global(piece.block()),
        })
    }

    /// Number of free blocks.
    pub fn free_block_count(&self) -> usize {
        self.free_by_size.len()
    }

    /// Number of live blocks the global arena holds (not those of lent superblocks).
    pub fn live_block_count(&self) -> usize {
        self.live_count
    }

    /// Free bytes (`O(1)`).
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// The free blocks, in address order.
    pub fn free_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.blocks_of(Kind::Free)
    }

    /// The live blocks the global arena holds, in address order.
    pub fn live_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.blocks_of(Kind::Live)
    }

    fn blocks_of(&self, kind: Kind) -> impl Iterator<Item = Block> + '_ {
        self.pieces
            .iter()
            .filter(move |p| p.kind == kind)
            .map(Piece::block)
    }

    /// Number of superblocks lent to local arenas.
    pub fn lent_superblock_count(&self) -> usize {
        self.lent_count
    }

    /// Spans of the superblocks lent to local arenas, in address order.
    pub fn lent_superblocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.blocks_of(Kind::Lent)
    }

    /// Total size of the superblocks lent to local arenas.
    pub fn lent_bytes(&self) -> usize {
        self.lent_bytes
    }

    /// Size of the largest free block (`O(1)`): the largest large allocation that can
    /// succeed now.
    pub fn max_free_size(&self) -> usize {
        self.pieces.max_fit()
    }

    /// Whether the arena is back in its initial state: nothing lent, nothing live, one free
    /// block covering the whole span.
    pub fn is_fully_coalesced(&self) -> bool {
        self.lent_count == 0 && self.live_count == 0 && self.free_bytes == self.span.size
    }

    /// Byte accounting over the memory the global arena holds (not the lent superblocks;
    /// `superblocks` counts the lent ones).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            superblocks: self.lent_count,
            empty_superblocks: 0,
            total_bytes: self.span.size - self.lent_bytes,
            free_bytes: self.free_bytes,
            live_bytes: self.live_bytes,
            free_blocks: self.free_block_count(),
            live_blocks: self.live_count,
            max_free_block: self.max_free_size(),
        }
    }

    /// The memory dump RMM writes on allocation failure with `dump_log_on_failure` (same as the
    /// `Display` output), headed by the failed request.
    pub fn dump(&self, failed_request: Option<usize>) -> String {
        match failed_request {
            Some(bytes) => format!("Failed to allocate {}\n{self}", format_bytes(bytes)),
            None => self.to_string(),
        }
    }
}

/// A multi-line dump: arena size, what is held and lent, total and largest free memory,
/// fragmentation, then one line per free block (start, end, size, gap since the previous
/// one), in the spirit of RMM's `dump_memory_log` (which has a line per superblock).
impl fmt::Display for GlobalArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = self.stats();
        writeln!(
            f,
            "Arena size: {} at {:#x}",
            format_bytes(self.span.size),
            self.span.addr
        )?;
        writeln!(
            f,
            "# superblocks lent: {} ({}); held: {} in {} free and {} live block(s)",
            self.lent_count,
            format_bytes(self.lent_bytes),
            format_bytes(stats.total_bytes),
            stats.free_blocks,
            stats.live_blocks
        )?;
        writeln!(f, "Total free memory: {}", format_bytes(stats.free_bytes))?;
        writeln!(
            f,
            "Largest block of free memory: {}",
            format_bytes(stats.max_free_block)
        )?;
        writeln!(f, "Fragmentation: {:.2}%", stats.fragmentation_percent())?;
        let mut prev_end = None;
        for (index, block) in self.free_blocks().enumerate() {
            let gap = block.addr.saturating_sub(prev_end.unwrap_or(block.addr));
            writeln!(
                f,
                "  Free block {index}: start={:#x}, end={:#x}, size={}, gap={}",
                block.addr,
                block.end(),
                format_bytes(block.size),
                format_bytes(usize::try_from(gap).unwrap_or(usize::MAX))
            )?;
            prev_end = Some(block.end());
        }
        Ok(())
    }
}

impl fmt::Debug for GlobalArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalArena")
            .field("span", &self.span)
            .field("free_blocks", &self.free_block_count())
            .field("free_bytes", &self.free_bytes)
            .field("live_blocks", &self.live_count)
            .field("lent", &self.lent_count)
            .field("lent_bytes", &self.lent_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: usize = SUPERBLOCK_MIN_SIZE;
    const KIB: usize = 1 << 10;
    /// RMM's `fake_address3` / `fake_address4`; the fixture's arena is 4 superblocks long.
    const A3: u64 = MIN as u64;
    const A4: u64 = 2 * MIN as u64;
    const ARENA_SIZE: usize = 4 * MIN;

    fn global() -> GlobalArena {
        GlobalArena::new(A3, ARENA_SIZE).unwrap_or_else(|e| panic!("{e}"))
    }

    fn acquire(g: &mut GlobalArena, size: usize) -> Superblock {
        g.acquire(size).unwrap_or_else(|| panic!("acquire {size}"))
    }

    fn at(offset: usize) -> u64 {
        A3 + offset as u64
    }

    /// The blocks tile the span, no two free ones touch, the counters match the blocks.
    fn check_map(g: &GlobalArena) {
        let mut all: Vec<(Block, Kind)> = g.pieces.iter().map(|p| (p.block(), p.kind)).collect();
        all.sort_by_key(|(b, _)| b.addr);
        let mut cursor = g.span().addr;
        for pair in all.windows(2) {
            assert!(
                !(pair[0].1 == Kind::Free && pair[1].1 == Kind::Free),
                "free blocks not coalesced: {all:?}"
            );
        }
        for (block, _) in &all {
            assert_eq!(block.addr, cursor, "blocks do not tile the span: {all:?}");
            cursor = block.end();
        }
        assert_eq!(cursor, g.span().end());
        let sum = |kind| -> (usize, usize) {
            let of: Vec<&(Block, Kind)> = all.iter().filter(|(_, k)| *k == kind).collect();
            (of.len(), of.iter().map(|(b, _)| b.size).sum())
        };
        assert_eq!(sum(Kind::Free), (g.free_block_count(), g.free_bytes()));
        assert_eq!(sum(Kind::Live), (g.live_count, g.live_bytes));
        assert_eq!(sum(Kind::Lent), (g.lent_count, g.lent_bytes));
        let by_size: Vec<(usize, u64)> = g.free_by_size.iter().copied().collect();
        let mut expected: Vec<(usize, u64)> = g.free_blocks().map(|b| (b.size, b.addr)).collect();
        expected.sort_unstable();
        assert_eq!(by_size, expected, "best-fit index");
        assert_eq!(
            g.max_free_size(),
            g.free_blocks().map(|b| b.size).max().unwrap_or(0)
        );
    }

    #[test]
    fn new_validates_and_aligns_down() {
        assert!(matches!(
            GlobalArena::new(A3, 256),
            Err(ArenaError::TooSmall { size: 256, .. })
        ));
        assert!(matches!(
            GlobalArena::new(A3, MIN - 1),
            Err(ArenaError::TooSmall { .. })
        ));
        assert!(matches!(
            GlobalArena::new(A3 + 128, MIN),
            Err(ArenaError::InvalidSpan { .. })
        ));
        assert!(matches!(
            GlobalArena::new(u64::MAX - 1023, MIN),
            Err(ArenaError::InvalidSpan { .. })
        ));
        let g = GlobalArena::new(A3, MIN + 300).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.span(), Block::new(A3, MIN + 256));
        assert!(g.is_fully_coalesced());
        check_map(&g);
        let msg = ArenaError::TooSmall {
            size: 256,
            minimum: MIN,
        }
        .to_string();
        assert!(msg.contains("Arena size smaller than minimum superblock size."));
    }

    #[test]
    fn handles_is_strictly_above_one_mib() {
        assert!(!GlobalArena::handles(MIN));
        assert!(GlobalArena::handles(MIN + 1));
        assert!(!GlobalArena::handles(256));
    }

    /// RMM `ArenaTest.GlobalArenaAcquire`.
    #[test]
    fn global_arena_acquire() {
        let mut g = global();
        let s = acquire(&mut g, 256);
        assert_eq!((s.addr(), s.size()), (A3, MIN));
        assert!(s.is_empty());
        let s2 = acquire(&mut g, KIB);
        assert_eq!((s2.addr(), s2.size()), (A4, MIN));
        assert!(s2.is_empty());
        acquire(&mut g, 512);
        acquire(&mut g, 512);
        assert!(g.acquire(512).is_none());
        assert_eq!(g.lent_superblock_count(), 4);
        assert_eq!(g.free_block_count(), 0);
        check_map(&g);
    }

    /// RMM `ArenaTest.GlobalArenaReleaseMergeNext`.
    #[test]
    fn global_arena_release_merge_next() {
        let mut g = global();
        let s = acquire(&mut g, 256);
        assert!(g.release(s).is_ok());
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaReleaseMergePrevious`.
    #[test]
    fn global_arena_release_merge_previous() {
        let mut g = global();
        let s = acquire(&mut g, 256);
        let s2 = acquire(&mut g, KIB);
        let _s3 = acquire(&mut g, 512);
        assert!(g.release(s).is_ok());
        assert!(g.release(s2).is_ok());
        assert_eq!(g.allocate_large(2 * MIN), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaReleaseMergePreviousAndNext`.
    #[test]
    fn global_arena_release_merge_previous_and_next() {
        let mut g = global();
        let s = acquire(&mut g, 256);
        let s2 = acquire(&mut g, KIB);
        let s3 = acquire(&mut g, 512);
        assert!(g.release(s).is_ok());
        assert!(g.release(s3).is_ok());
        assert_eq!(g.free_block_count(), 2);
        assert!(g.release(s2).is_ok());
        assert!(g.is_fully_coalesced());
        check_map(&g);
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaReleaseMultiple`.
    #[test]
    fn global_arena_release_multiple() {
        let mut g = global();
        let superblocks = vec![
            acquire(&mut g, 256),
            acquire(&mut g, KIB),
            acquire(&mut g, 512),
        ];
        assert!(g.release_all(superblocks).is_ok());
        assert!(g.is_fully_coalesced());
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaAllocate`.
    #[test]
    fn global_arena_allocate() {
        let mut g = global();
        assert_eq!(g.allocate_large(2 * MIN), Some(A3));
        // The allocation is the head of the free memory; the tail stays free.
        assert_eq!(
            g.live_blocks().collect::<Vec<_>>(),
            vec![Block::new(A3, 2 * MIN)]
        );
        assert_eq!(
            g.free_blocks().collect::<Vec<_>>(),
            vec![Block::new(at(2 * MIN), 2 * MIN)]
        );
        check_map(&g);
    }

    /// RMM `ArenaTest.GlobalArenaAllocateExtraLarge`.
    #[test]
    fn global_arena_allocate_extra_large() {
        let mut g = global();
        assert_eq!(g.allocate_large(1 << 50), None);
        assert_eq!(g.allocate_large(1 << 50), None);
        assert_eq!(g.allocate_large(usize::MAX), None);
        assert_eq!(g.allocate_large(0), None);
        assert!(g.is_fully_coalesced());
    }

    /// RMM `ArenaTest.GlobalArenaDeallocate`.
    #[test]
    fn global_arena_deallocate() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN);
        assert_eq!(ptr, Some(A3));
        assert_eq!(g.deallocate_large(A3, 2 * MIN), Ok(()));
        assert!(g.is_fully_coalesced());
        assert_eq!(g.allocate_large(2 * MIN), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaDeallocateAlignUp`.
    #[test]
    fn global_arena_deallocate_align_up() {
        let mut g = global();
        let ptr = g.allocate_large(MIN + 256).unwrap_or_default();
        let ptr2 = g.allocate_large(MIN + 512).unwrap_or_default();
        assert_eq!(g.deallocate_large(ptr, MIN + 256), Ok(()));
        assert_eq!(g.deallocate_large(ptr2, MIN + 512), Ok(()));
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    /// RMM `ArenaTest.GlobalArenaDeallocateFromOtherArena`.
    #[test]
    fn global_arena_deallocate_from_other_arena() {
        let mut g = global();
        let mut s = acquire(&mut g, 512);
        let blk = s.allocate(512).unwrap_or_default();
        let blk2 = s.allocate(1024).unwrap_or_default();
        assert!(g.release(s).is_ok());
        check_map(&g);
        assert_eq!(g.deallocate(blk.addr, blk.size), Ok(true));
        assert_eq!(g.deallocate(blk2.addr, blk2.size), Ok(true));
        assert!(g.is_fully_coalesced());
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    #[test]
    fn acquire_splits_only_free_blocks_of_two_mib_or_more() {
        let mut g = GlobalArena::new(A3, 2 * MIN - 256).unwrap_or_else(|e| panic!("{e}"));
        // Less than 2 MiB: the only free block is lent whole.
        let s = acquire(&mut g, 256);
        assert_eq!(s.size(), 2 * MIN - 256);
        assert!(g.release(s).is_ok());
        // A large request on a 4 MiB arena gets a head of exactly its size...
        let mut g = global();
        let s = acquire(&mut g, MIN + 256);
        assert_eq!(s.size(), MIN + 256);
        // ...unless the remainder would be smaller than a superblock.
        let s2 = acquire(&mut g, 2 * MIN);
        assert_eq!((s2.addr(), s2.size()), (s.end(), 3 * MIN - 256));
        check_map(&g);
    }

    /// Loans are fresh superblocks carved out of free memory: a block another stream still uses
    /// is never lent (RMM lends a partially used superblock whole).
    #[test]
    fn loans_never_hold_live_blocks() {
        let mut g = global();
        let big = g.allocate_large(MIN + MIN / 2).unwrap_or_default();
        assert_eq!(big, A3);
        assert_eq!(g.allocate_large(3 * MIN), None, "2.5 MiB free");
        let second = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(second, at(MIN + MIN / 2));
        // 0.5 MiB is left: lent whole to a small request that fits, as a small superblock.
        assert!(g.acquire(MIN / 2 + 256).is_none());
        let fragment = acquire(&mut g, 256);
        assert_eq!(fragment.span(), Block::new(at(3 * MIN + MIN / 2), MIN / 2));
        assert!(fragment.is_empty());
        assert!(g.release(fragment).is_ok());
        assert_eq!(g.deallocate(second, 2 * MIN), Ok(true));
        let s = acquire(&mut g, 256);
        assert_eq!((s.addr(), s.size()), (second, MIN));
        assert!(s.is_empty());
        assert_eq!(
            g.find(second + 256),
            Some(SuperblockLocation::Lent(s.span()))
        );
        // Not held here: the free must be searched elsewhere.
        assert_eq!(g.deallocate(second, 256), Ok(false));
        assert!(g.release(s).is_ok());
        assert_eq!(g.deallocate(big, MIN + MIN / 2), Ok(true));
        assert!(g.is_fully_coalesced());
    }

    /// Best fit: the smallest free block that fits, the lowest address among equals.
    #[test]
    fn requests_go_to_the_best_fitting_free_block() {
        let mut g = GlobalArena::new(A3, 16 * MIN).unwrap_or_else(|e| panic!("{e}"));
        // Holes of 3, 2 and 2 MiB (in that address order) between live blocks.
        let blocks: Vec<u64> = [3, 1, 2, 1, 2, 1]
            .iter()
            .map(|&mib| g.allocate_large(mib * MIN).unwrap_or_default())
            .collect();
        for i in [0, 2, 4] {
            let size = [3, 1, 2, 1, 2, 1][i] * MIN;
            assert_eq!(g.deallocate(blocks[i], size), Ok(true));
        }
        check_map(&g);
        // 1.5 MiB: the first 2 MiB hole (not the 3 MiB one, which comes first in address order).
        assert_eq!(g.allocate_large(MIN + MIN / 2), Some(blocks[2]));
        // 2 MiB: the other 2 MiB hole.
        assert_eq!(g.allocate_large(2 * MIN), Some(blocks[4]));
        // A superblock: the best fit of at least 1 MiB is the 3 MiB hole now.
        let s = acquire(&mut g, 256);
        assert_eq!((s.addr(), s.size()), (blocks[0], MIN));
        assert!(g.release(s).is_ok());
        check_map(&g);
    }

    /// What makes the arena hold more: superblocks that come back partly used dissolve into
    /// the map, so the free memory on both sides of their old boundaries is one block (RMM only
    /// merges superblocks that are both empty).
    #[test]
    fn released_superblocks_merge_free_memory_across_their_boundaries() {
        let mut g = global();
        let mut first = acquire(&mut g, 256);
        let mut second = acquire(&mut g, 256);
        assert_eq!((first.addr(), second.addr()), (A3, A4));
        // Each keeps one small block: at the start of the first, at the end of the second.
        let a = first.allocate(MIN / 4).unwrap_or_else(|| panic!("a"));
        let filler = second
            .allocate(MIN / 4 * 3)
            .unwrap_or_else(|| panic!("filler"));
        let b = second.allocate(MIN / 4).unwrap_or_else(|| panic!("b"));
        assert!(second.deallocate(filler).is_ok());
        assert!(g.release(first).is_ok());
        assert!(g.release(second).is_ok());
        check_map(&g);
        assert_eq!(g.live_block_count(), 2);
        // 1.5 MiB of free memory straddles the old boundary: one block.
        assert_eq!(
            g.free_blocks().collect::<Vec<_>>(),
            vec![
                Block::new(at(MIN / 4), MIN / 4 * 3 + MIN / 4 * 3),
                Block::new(at(2 * MIN), 2 * MIN)
            ]
        );
        assert_eq!(g.allocate_large(MIN + MIN / 2), Some(at(MIN / 4)));
        assert_eq!(g.deallocate(at(MIN / 4), MIN + MIN / 2), Ok(true));
        assert_eq!(g.deallocate(a.addr, a.size), Ok(true));
        assert_eq!(g.deallocate(b.addr, b.size), Ok(true));
        assert!(g.is_fully_coalesced());
        check_map(&g);
    }

    #[test]
    fn release_refuses_foreign_and_returned_superblocks() {
        let mut g = global();
        let forged = Superblock::new(A3, MIN).unwrap_or_else(|e| panic!("{e}"));
        let rejected = g.release(forged).err();
        assert!(matches!(
            rejected.as_ref().map(|r| r.error),
            Some(ArenaError::ForeignSuperblock {
                addr: A3,
                size: MIN
            })
        ));
        assert_eq!(
            rejected.map(|r| r.superblock.span()),
            Some(Block::new(A3, MIN))
        );

        let s = acquire(&mut g, 256);
        // A different superblock with the same address but another size is refused too.
        let wrong = Superblock::new(A3, 2 * MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(g.release(wrong).is_err());
        assert!(g.release(s).is_ok());
        let again = Superblock::new(A3, MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(g.release(again).is_err());
        // A live block is not a loan either.
        let live = g.allocate_large(2 * MIN).unwrap_or_default();
        let posing = Superblock::new(live, 2 * MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(g.release(posing).is_err());
        assert_eq!(g.deallocate(live, 2 * MIN), Ok(true));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn wrong_frees_are_reported() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(g.deallocate(0, 256), Ok(false));
        assert_eq!(g.deallocate(at(ARENA_SIZE), 256), Ok(false));
        assert_eq!(
            g.deallocate_large(0, 256),
            Err(ArenaError::NotFound { addr: 0, size: 256 })
        );
        assert!(matches!(
            g.deallocate(ptr, 3 * MIN),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            g.deallocate(ptr, 0),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            g.deallocate(ptr + 256, 256),
            Err(ArenaError::NotFound { .. })
        ));
        assert!(matches!(
            g.deallocate(ptr, usize::MAX),
            Err(ArenaError::NotFound { .. })
        ));
        assert!(matches!(
            g.deallocate(ptr + 2 * MIN as u64, 256),
            Err(ArenaError::DoubleFree { .. })
        ));
        assert_eq!(g.deallocate_large(ptr, 2 * MIN), Ok(()));
        assert_eq!(
            g.deallocate_large(ptr, 2 * MIN),
            Err(ArenaError::DoubleFree {
                addr: ptr,
                size: 2 * MIN
            })
        );
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn find_and_contains() {
        let mut g = global();
        assert!(g.contains(A3));
        assert!(!g.contains(A3 - 1));
        assert_eq!(g.find(A3 - 1), None);
        assert_eq!(g.find(at(ARENA_SIZE)), None);
        let s = acquire(&mut g, 256);
        assert!(!g.contains(A3));
        assert_eq!(g.find(A3 + 5), Some(SuperblockLocation::Lent(s.span())));
        assert_eq!(
            g.find(A4),
            Some(SuperblockLocation::Global(Block::new(A4, 3 * MIN)))
        );
        assert!(g.release(s).is_ok());
    }

    #[test]
    fn dump_summarises_the_arena() {
        let mut g = global();
        let s = acquire(&mut g, 256);
        let large = g.allocate_large(MIN + MIN / 2).unwrap_or_default();
        let dump = g.dump(Some(8 << 20));
        assert!(
            dump.starts_with("Failed to allocate 8.000000 MiB\n"),
            "{dump}"
        );
        assert!(
            dump.contains("Arena size: 4.000000 MiB at 0x100000"),
            "{dump}"
        );
        assert!(
            dump.contains(
                "# superblocks lent: 1 (1024.000000 KiB); held: 3.000000 MiB in 1 free and 1 \
                 live block(s)"
            ),
            "{dump}"
        );
        assert!(dump.contains("Total free memory: 1.500000 MiB"), "{dump}");
        assert!(
            dump.contains("Largest block of free memory: 1.500000 MiB"),
            "{dump}"
        );
        assert!(dump.contains("Fragmentation: 0.00%"), "{dump}");
        assert!(
            dump.contains(
                "  Free block 0: start=0x380000, end=0x500000, size=1.500000 MiB, gap=0.000000 B"
            ),
            "{dump}"
        );
        assert_eq!(dump.lines().count(), 7);
        assert!(g.release(s).is_ok());
        assert_eq!(g.deallocate(large, MIN + MIN / 2), Ok(true));
        let stats = g.stats();
        assert_eq!(stats.total_bytes + g.lent_bytes(), ARENA_SIZE);
        assert_eq!(
            (stats.free_bytes, stats.max_free_block),
            (ARENA_SIZE, ARENA_SIZE)
        );
    }

    #[test]
    fn reclaim_frees_a_large_block_and_lends_its_span() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(ptr, A3);
        // Refused, nothing changed: block too big for the room, wrong size, not a block.
        assert!(g.reclaim(ptr, 2 * MIN, 2 * MIN - 256).is_none());
        assert!(g.reclaim(ptr, MIN + 256, usize::MAX).is_none());
        assert!(g.reclaim(ptr + 256, 256, usize::MAX).is_none());
        assert!(g.reclaim(0, 2 * MIN, usize::MAX).is_none());
        assert!(g.reclaim(ptr, usize::MAX, usize::MAX).is_none());
        assert_eq!(g.lent_superblock_count(), 0);
        assert_eq!(
            g.find(ptr),
            Some(SuperblockLocation::Global(Block::new(A3, 2 * MIN)))
        );

        let sb = g
            .reclaim(ptr, 2 * MIN - 100, 2 * MIN)
            .unwrap_or_else(|| panic!("reclaim"));
        assert_eq!(sb.span(), Block::new(A3, 2 * MIN));
        assert!(sb.is_empty());
        assert_eq!(g.find(ptr), Some(SuperblockLocation::Lent(sb.span())));
        assert_eq!((g.lent_superblock_count(), g.lent_bytes()), (1, 2 * MIN));
        assert_eq!((g.free_block_count(), g.live_block_count()), (1, 0));
        check_map(&g);
        // The block is gone for the global arena.
        assert_eq!(g.deallocate(ptr, 2 * MIN), Ok(false));
        assert!(g.release(sb).is_ok());
        assert!(g.is_fully_coalesced());
    }

    /// The span lent is the block's own, whatever its neighbours; a block smaller than a
    /// superblock is not reclaimed.
    #[test]
    fn reclaim_lends_only_the_block() {
        let mut g = GlobalArena::new(A3, 2 * MIN + MIN / 4).unwrap_or_else(|e| panic!("{e}"));
        let big = g.allocate_large(MIN + MIN / 2).unwrap_or_default();
        let small = g.allocate_large(256).unwrap_or_default();
        assert_eq!(small, big + (MIN + MIN / 2) as u64);
        assert!(g.reclaim(small, 256, usize::MAX).is_none());
        let sb = g.reclaim(big, MIN + MIN / 2, usize::MAX);
        assert_eq!(
            sb.as_ref().map(Superblock::span),
            Some(Block::new(big, MIN + MIN / 2))
        );
        assert_eq!(g.deallocate(small, 256), Ok(true));
        assert!(sb.is_some_and(|sb| g.release(sb).is_ok()));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn check_deallocate_validates_without_freeing() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(g.check_deallocate(ptr, 2 * MIN - 1), Ok(true));
        assert_eq!(g.check_deallocate(0, 256), Ok(false));
        assert!(matches!(
            g.check_deallocate(ptr, MIN),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            g.check_deallocate(ptr + 2 * MIN as u64, 256),
            Err(ArenaError::DoubleFree { .. })
        ));
        let s = acquire(&mut g, 256);
        assert_eq!(
            g.check_deallocate(s.addr(), 256),
            Ok(false),
            "lent, not held"
        );
        assert!(g.release(s).is_ok());
        assert_eq!(g.deallocate_large(ptr, 2 * MIN), Ok(()));
        assert!(g.is_fully_coalesced());
    }

    /// Carving, loans, dissolving and merging keep the blocks tiling the span, in any order.
    #[test]
    fn blocks_and_loans_tile_the_span() {
        let mut g = GlobalArena::new(A3, 16 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut large = vec![];
        let mut lent = vec![];
        for i in 0..6usize {
            large.push((
                g.allocate_large(MIN + 256 * (i + 1)).unwrap_or_default(),
                MIN + 256 * (i + 1),
            ));
            let mut sb = acquire(&mut g, 256);
            if i % 3 == 0 {
                let _ = sb.allocate(4 * KIB);
            }
            lent.push(sb);
            check_map(&g);
        }
        for (i, (ptr, size)) in large.into_iter().enumerate() {
            assert_eq!(g.deallocate_large(ptr, size), Ok(()));
            check_map(&g);
            if i % 2 == 0 {
                assert!(g.release(lent.remove(0)).is_ok());
                check_map(&g);
            }
        }
        for sb in lent {
            assert!(g.release(sb).is_ok());
            check_map(&g);
        }
        let live: Vec<Block> = g.live_blocks().collect();
        assert_eq!(live.len(), 2, "the blocks left in the loans");
        for b in live {
            assert_eq!(g.deallocate(b.addr, b.size), Ok(true));
            check_map(&g);
        }
        assert!(g.is_fully_coalesced());
    }
}
