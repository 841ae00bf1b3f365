//! [`GlobalArena`]: the single upstream span, cut into superblocks that are lent to local arenas
//! or serve large allocations directly.

use std::fmt;

use super::fit_tree::{FitItem, FitTree, Handle};
use super::size_class::{align_down, align_up, ALLOCATION_ALIGNMENT};
use super::{ArenaError, ArenaStats, Block, RejectedSuperblock, Superblock, SUPERBLOCK_MIN_SIZE};
use crate::util::format::format_bytes;

/// Where [`GlobalArena::find`] located an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuperblockLocation {
    /// In a superblock the global arena holds (its span).
    Global(Block),
    /// In a superblock lent to some local arena (its span); the caller knows which arena.
    Lent(Block),
}

/// One superblock of the span, as the global arena sees it.
enum Slot {
    /// Held here.
    Held(Superblock),
    /// Lent to a local arena (its span).
    Lent(Block),
}

impl Slot {
    fn span(&self) -> Block {
        match self {
            Slot::Held(sb) => sb.span(),
            Slot::Lent(span) => *span,
        }
    }

    fn held(&self) -> Option<&Superblock> {
        match self {
            Slot::Held(sb) => Some(sb),
            Slot::Lent(_) => None,
        }
    }
}

impl FitItem for Slot {
    fn key(&self) -> u64 {
        self.span().addr
    }

    /// Lent superblocks serve nothing here.
    fn fit(&self) -> usize {
        self.held().map_or(0, Superblock::max_free_size)
    }
}

/// The global arena (RMM's `global_arena`): the whole upstream allocation, as an address-ordered
/// set of superblocks.
///
/// It holds empty superblocks and partially used ones (those serving large allocations, or
/// returned by [`LocalArena::clean`](super::LocalArena::clean)); adjacent empty superblocks are
/// always coalesced. Superblocks lent to local arenas are recorded (address and size) so that
/// only they can be released back, once each.
///
/// The type owns no memory: the resource allocates the span from upstream, builds the arena over
/// `(addr, size)`, and frees the span (see [`span`](Self::span)) when the resource is dropped.
///
/// Held and lent superblocks (which together tile the span) are kept in one address-ordered
/// tree, indexed by the largest free block of the held ones; superblocks are split, lent, taken
/// back and merged in place, so an allocation or a free changes at most two entries of it.
///
/// Costs (n = superblocks, held or lent): [`acquire`](Self::acquire),
/// [`release`](Self::release), [`allocate_large`](Self::allocate_large),
/// [`deallocate`](Self::deallocate), [`find`](Self::find) are `O(log n)` plus the
/// superblock's own `O(log)` work; [`stats`](Self::stats) and the `Display` dump are `O(n)`.
#[doc(alias = "rmm::mr::detail::arena::global_arena")]
pub struct GlobalArena {
    span: Block,
    /// Every superblock by address, held or lent.
    slots: FitTree<Slot>,
    held_count: usize,
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
        let mut slots = FitTree::new();
        let inserted = slots.insert(Slot::Held(Superblock::fresh(span))).is_ok();
        debug_assert!(inserted);
        Ok(Self {
            span,
            slots,
            held_count: 1,
            lent_count: 0,
            lent_bytes: 0,
        })
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

    /// Run `f` on the first held superblock (address order) whose largest free block fits
    /// `size`; an empty one at least `max(size, 1 MiB) + 1 MiB` long is first split in place, so
    /// that `f` sees only its head of `max(size, 1 MiB)` bytes (the tail stays held).
    fn with_first_fit<R>(&mut self, size: usize, f: impl FnOnce(&mut Slot) -> R) -> Option<R> {
        let found = self.slots.first_fit_handle(size)?;
        let head_size = size.max(SUPERBLOCK_MIN_SIZE);
        let (tail, result) = self.slots.update_at(found, |slot| {
            let tail = match slot {
                Slot::Held(sb) => sb.split_off(head_size),
                Slot::Lent(_) => None,
            };
            (tail, f(slot))
        })?;
        if let Some(tail) = tail {
            self.insert_held(tail);
        }
        Some(result)
    }

    fn insert_held(&mut self, superblock: Superblock) {
        let inserted = self.slots.insert(Slot::Held(superblock)).is_ok();
        debug_assert!(inserted, "superblocks of the global arena overlap");
        self.held_count += 1;
    }

    /// Replace the held superblock in `slot` by a record of its loan and return it.
    fn take_to_lend(slot: &mut Slot) -> Option<Superblock> {
        let span = slot.span();
        match std::mem::replace(slot, Slot::Lent(span)) {
            Slot::Held(sb) => Some(sb),
            lent => {
                *slot = lent;
                None
            }
        }
    }

    fn count_lent(&mut self, superblock: &Superblock) {
        self.held_count -= 1;
        self.lent_count += 1;
        self.lent_bytes += superblock.size();
    }

    /// Lend a local arena a superblock that can serve `size` bytes (rounded up to 256).
    ///
    /// First superblock in address order that fits; if it is empty and at least 2 MiB (more
    /// generally `max(size, 1 MiB) + 1 MiB`), a 1 MiB head (`size` bytes for larger requests) is
    /// split off and lent, else the superblock is lent whole, which may be a partially used one.
    /// `None` when nothing fits (or `size` is 0).
    pub fn acquire(&mut self, size: usize) -> Option<Superblock> {
        let size = align_up(size).filter(|&s| s > 0)?;
        let sb = self.with_first_fit(size, Self::take_to_lend).flatten()?;
        self.count_lent(&sb);
        Some(sb)
    }

    /// Take back a superblock lent by [`acquire`](Self::acquire), coalescing it with adjacent
    /// empty superblocks when it is empty.
    ///
    /// A superblock that this arena did not lend (or already got back) is refused with
    /// [`ArenaError::ForeignSuperblock`] and handed back.
    pub fn release(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        let span = superblock.span();
        let lent_here = self
            .slots
            .find_handle(span.addr)
            .filter(|&h| matches!(self.slots.get_at(h), Some(Slot::Lent(lent)) if *lent == span));
        let mut carry = Some(superblock);
        if let Some(found) = lent_here {
            self.slots.update_at(found, |slot| {
                if let Some(sb) = carry.take() {
                    *slot = Slot::Held(sb);
                }
            });
        }
        if let Some(superblock) = carry {
            return Err(RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: span.addr,
                    size: span.size,
                },
                superblock,
            });
        }
        self.held_count += 1;
        self.lent_count -= 1;
        self.lent_bytes -= span.size;
        if let Some(found) = lent_here {
            self.coalesce(found);
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

    /// Grow the held superblock `into` over `next` (both empty and contiguous); `next` is
    /// handed back otherwise.
    fn absorb_into(&mut self, into: Handle, next: Superblock) -> Result<(), Superblock> {
        let mut carry = Some(next);
        self.slots.update_at(into, |slot| {
            if let Slot::Held(sb) = slot {
                if let Some(next) = carry.take() {
                    if let Err(next) = sb.absorb(next) {
                        carry = Some(next);
                    }
                }
            }
        });
        match carry {
            None => Ok(()),
            Some(next) => Err(next),
        }
    }

    /// `h` if it names an empty held superblock.
    fn empty_held(&self, h: Option<Handle>) -> Option<Handle> {
        h.filter(|&h| matches!(self.slots.get_at(h), Some(Slot::Held(sb)) if sb.is_empty()))
    }

    /// Merge `next` (removed from the tree) into `into`; put it back if that fails.
    fn merge_or_restore(&mut self, into: Handle, next: Slot) -> bool {
        let restore = match next {
            Slot::Held(sb) => match self.absorb_into(into, sb) {
                Ok(()) => {
                    self.held_count -= 1;
                    return true;
                }
                Err(sb) => Slot::Held(sb),
            },
            lent => lent,
        };
        let reinserted = self.slots.insert(restore).is_ok();
        debug_assert!(reinserted);
        false
    }

    /// Merge the held superblock `this`, if empty, with its empty held neighbours (they are
    /// contiguous: the superblocks tile the span).
    fn coalesce(&mut self, this: Handle) {
        let Some(mut this) = self.empty_held(Some(this)) else {
            return;
        };
        if let Some(prev) = self.empty_held(self.slots.prev(this)) {
            if let Some(cur) = self.slots.remove_at(this) {
                let key = cur.key();
                if self.merge_or_restore(prev, cur) {
                    this = prev;
                } else {
                    // Put back (cannot happen: both are empty and contiguous).
                    let Some(restored) = self.slots.find_handle(key) else {
                        return;
                    };
                    this = restored;
                }
            }
        }
        if let Some(next) = self.empty_held(self.slots.next(this)) {
            if let Some(next) = self.slots.remove_at(next) {
                self.merge_or_restore(this, next);
            }
        }
    }

    /// Allocate a block of `size` bytes (rounded up to 256) straight from the global arena
    /// (RMM's `global_arena::allocate_sync`, used for [large](Self::handles) requests).
    ///
    /// Takes the first superblock (address order) that fits; an empty one at least
    /// `size + 1 MiB` long is split so that the allocation gets a head superblock of exactly
    /// `size` bytes. The superblock stays in the global arena. `None` when nothing fits.
    #[doc(alias = "allocate_sync")]
    pub fn allocate_large(&mut self, size: usize) -> Option<u64> {
        let size = align_up(size).filter(|&s| s > 0)?;
        self.with_first_fit(size, |slot| match slot {
            Slot::Held(sb) => sb.allocate(size).map(|block| block.addr),
            Slot::Lent(_) => None,
        })
        .flatten()
    }

    /// Free a block that lies in a superblock held by the global arena (any size; RMM's
    /// `global_arena::deallocate_sync`). A superblock that becomes empty is coalesced with its
    /// empty neighbours.
    ///
    /// `Ok(true)`: freed. `Ok(false)`: no superblock held here contains `addr` (it may be in a
    /// local arena; keep searching). `Err`: a superblock held here contains `addr` but the free
    /// is wrong (see [`Superblock::deallocate`]); nothing changed.
    pub fn deallocate(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let Some((found, _)) = self.held_containing(addr) else {
            return Ok(false);
        };
        let outcome = self.slots.update_at(found, |slot| match slot {
            Slot::Held(sb) => Some(
                sb.deallocate(Block::new(addr, size))
                    .map(|()| sb.is_empty()),
            ),
            Slot::Lent(_) => None,
        });
        match outcome.flatten() {
            None => Ok(false),
            Some(Err(error)) => Err(error),
            Some(Ok(now_empty)) => {
                if now_empty {
                    self.coalesce(found);
                }
                Ok(true)
            }
        }
    }

    /// Free a large allocation made by [`allocate_large`](Self::allocate_large): like
    /// [`deallocate`](Self::deallocate), but "not held here" is [`ArenaError::NotFound`].
    ///
    /// Note that a large block can end up in a local arena (a partially used superblock is lent
    /// whole by [`acquire`](Self::acquire)); the resource must then keep searching the local
    /// arenas, so it should call [`deallocate`](Self::deallocate) and treat `Ok(false)` as
    /// "search on".
    pub fn deallocate_large(&mut self, addr: u64, size: usize) -> Result<(), ArenaError> {
        match self.deallocate(addr, size)? {
            true => Ok(()),
            false => Err(ArenaError::NotFound { addr, size }),
        }
    }

    /// Check a free like [`deallocate`](Self::deallocate) would, without doing it: `Ok(true)`
    /// when `(addr, size)` is a live block of a superblock held here, `Ok(false)` when no held
    /// superblock contains `addr`, the error `deallocate` would give otherwise.
    pub fn check_deallocate(&self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        match self.held_containing(addr) {
            None => Ok(false),
            Some((_, sb)) => sb.check_free(Block::new(addr, size)).map(|_| true),
        }
    }

    /// Free `(addr, size)` if it is the only live block of a superblock held here of at most
    /// `max_size` bytes, and lend that superblock, now empty, instead of keeping it: the
    /// superblock is recorded as lent and returned (RMM has no such operation).
    ///
    /// This is for a resource that lets the stream that freed a large block keep its superblock
    /// for its next large requests ([`LocalArena::keep`](super::LocalArena::keep)): memory that
    /// stream may reuse at once, without first waiting for its work. `None`, with nothing
    /// changed, in every other case, wrong frees included (use [`deallocate`](Self::deallocate)
    /// to free and learn what is wrong).
    pub fn reclaim(&mut self, addr: u64, size: usize, max_size: usize) -> Option<Superblock> {
        let (found, sb) = self.held_containing(addr)?;
        let block = Block::new(addr, size);
        if sb.size() > max_size || sb.live_block_count() != 1 || sb.check_free(block).is_err() {
            return None;
        }
        let taken = self
            .slots
            .update_at(found, |slot| {
                let emptied = match slot {
                    Slot::Held(sb) => sb.deallocate(block).is_ok() && sb.is_empty(),
                    Slot::Lent(_) => false,
                };
                if emptied {
                    Self::take_to_lend(slot)
                } else {
                    None
                }
            })
            .flatten()?;
        self.count_lent(&taken);
        Some(taken)
    }

    fn held_containing(&self, addr: u64) -> Option<(Handle, &Superblock)> {
        let found = self.slots.floor_handle(addr)?;
        let sb = self
            .slots
            .get_at(found)
            .and_then(Slot::held)
            .filter(|sb| sb.contains_addr(addr))?;
        Some((found, sb))
    }

    /// Whether a superblock held by the global arena contains `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        self.held_containing(addr).is_some()
    }

    /// Which superblock contains `addr`: one held here, one lent to a local arena, or none
    /// (outside the span). Lets the resource route a free without trying every arena.
    pub fn find(&self, addr: u64) -> Option<SuperblockLocation> {
        let slot = self.slots.floor(addr)?;
        let span = slot.span();
        if !span.contains_addr(addr) {
            return None;
        }
        Some(match slot {
            Slot::Held(_) => SuperblockLocation::Global(span),
            Slot::Lent(_) => SuperblockLocation::Lent(span),
        })
    }

    /// Number of superblocks held by the global arena.
    pub fn superblock_count(&self) -> usize {
        self.held_count
    }

    /// The superblocks held by the global arena, in address order.
    pub fn superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        self.slots.iter().filter_map(Slot::held)
    }

    /// Number of superblocks lent to local arenas.
    pub fn lent_superblock_count(&self) -> usize {
        self.lent_count
    }

    /// Spans of the superblocks lent to local arenas, in address order.
    pub fn lent_superblocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.slots.iter().filter_map(|slot| match slot {
            Slot::Lent(span) => Some(*span),
            Slot::Held(_) => None,
        })
    }

    /// Total size of the superblocks lent to local arenas.
    pub fn lent_bytes(&self) -> usize {
        self.lent_bytes
    }

    /// Size of the largest free block held by the global arena (`O(1)`): the largest large
    /// allocation that can succeed now.
    pub fn max_free_size(&self) -> usize {
        self.slots.max_fit()
    }

    /// Whether the arena is back in its initial state: nothing lent and one empty superblock
    /// covering the whole span.
    pub fn is_fully_coalesced(&self) -> bool {
        self.lent_count == 0
            && self.held_count == 1
            && self
                .superblocks()
                .next()
                .is_some_and(|sb| sb.is_empty() && sb.span() == self.span)
    }

    /// Byte accounting over the superblocks held here (not the lent ones).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats::from_superblocks(self.superblocks())
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

/// A multi-line dump: arena size, superblock counts, total and largest free memory,
/// fragmentation, then one line per held superblock (start, end, size, empty, free blocks,
/// largest free block, gap to the previous one) like RMM's `dump_memory_log`.
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
            "# superblocks: {} held ({} empty), {} lent ({})",
            stats.superblocks,
            stats.empty_superblocks,
            self.lent_count,
            format_bytes(self.lent_bytes)
        )?;
        writeln!(
            f,
            "Total size of superblocks: {}",
            format_bytes(stats.total_bytes)
        )?;
        writeln!(f, "Total free memory: {}", format_bytes(stats.free_bytes))?;
        writeln!(
            f,
            "Largest block of free memory: {}",
            format_bytes(stats.max_free_block)
        )?;
        writeln!(f, "Fragmentation: {:.2}%", stats.fragmentation_percent())?;
        let mut prev_end = None;
        for (index, sb) in self.superblocks().enumerate() {
            let gap = sb.addr().saturating_sub(prev_end.unwrap_or(sb.addr()));
            writeln!(
                f,
                "  Superblock {index}: start={:#x}, end={:#x}, size={}, empty={}, \
                 # free blocks={}, max free={}, gap={}",
                sb.addr(),
                sb.end(),
                format_bytes(sb.size()),
                if sb.is_empty() { "T" } else { "F" },
                sb.free_block_count(),
                format_bytes(sb.max_free_size()),
                format_bytes(usize::try_from(gap).unwrap_or(usize::MAX))
            )?;
            prev_end = Some(sb.end());
        }
        Ok(())
    }
}

impl fmt::Debug for GlobalArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalArena")
            .field("span", &self.span)
            .field("held", &self.held_count)
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
        assert_eq!(g.superblock_count(), 0);
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
        assert_eq!(g.superblock_count(), 2);
        assert!(g.release(s2).is_ok());
        assert!(g.is_fully_coalesced());
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
        // The head superblock is exactly the allocation; the tail stays free.
        let spans: Vec<Block> = g.superblocks().map(Superblock::span).collect();
        assert_eq!(
            spans,
            vec![
                Block::new(A3, 2 * MIN),
                Block::new(A3 + 2 * MIN as u64, 2 * MIN)
            ]
        );
    }

    /// RMM `ArenaTest.GlobalArenaAllocateExtraLarge`.
    #[test]
    fn global_arena_allocate_extra_large() {
        let mut g = global();
        assert_eq!(g.allocate_large(1 << 50), None);
        assert_eq!(g.allocate_large(1 << 50), None);
        assert_eq!(g.allocate_large(usize::MAX), None);
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
        assert_eq!(g.deallocate(blk.addr, blk.size), Ok(true));
        assert_eq!(g.deallocate(blk2.addr, blk2.size), Ok(true));
        assert!(g.is_fully_coalesced());
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    #[test]
    fn acquire_splits_only_empty_superblocks_of_two_mib_or_more() {
        let mut g = GlobalArena::new(A3, 2 * MIN - 256).unwrap_or_else(|e| panic!("{e}"));
        // Less than 2 MiB: the only superblock is lent whole.
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
    }

    #[test]
    fn partially_used_superblocks_are_lent_whole() {
        let mut g = global();
        // 1.5 MiB large allocation on an empty 4 MiB arena: head of 1.5 MiB.
        let big = g.allocate_large(MIN + MIN / 2).unwrap_or_default();
        assert_eq!(big, A3);
        // The empty 2.5 MiB tail cannot hold 3 MiB.
        assert_eq!(g.allocate_large(3 * MIN), None);
        // 2 MiB fits the 2.5 MiB tail, too short to split: the tail is used whole.
        let second = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(second, A3 + (MIN + MIN / 2) as u64);
        // The only room left is 0.5 MiB at the end of that partially used superblock; a small
        // acquire lends it whole, large block included.
        let s = acquire(&mut g, 256);
        assert_eq!(s.addr(), second);
        assert_eq!(s.live_block_at(second), Some(2 * MIN));
        assert_eq!(
            g.find(second + 256),
            Some(SuperblockLocation::Lent(s.span()))
        );
        // Not held here any more: the free must be searched elsewhere.
        assert_eq!(g.deallocate(second, 2 * MIN), Ok(false));
        assert_eq!(
            g.deallocate_large(second, 2 * MIN),
            Err(ArenaError::NotFound {
                addr: second,
                size: 2 * MIN
            })
        );
        assert!(g.release(s).is_ok());
        assert_eq!(g.deallocate(second, 2 * MIN), Ok(true));
        assert_eq!(g.deallocate(big, MIN + MIN / 2), Ok(true));
        assert!(g.is_fully_coalesced());
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
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn wrong_frees_are_reported() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(g.deallocate(0, 256), Ok(false));
        assert_eq!(g.deallocate(A3 + ARENA_SIZE as u64, 256), Ok(false));
        assert_eq!(
            g.deallocate_large(0, 256),
            Err(ArenaError::NotFound { addr: 0, size: 256 })
        );
        assert!(matches!(
            g.deallocate(ptr, 3 * MIN),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            g.deallocate(ptr + 256, 256),
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
        assert_eq!(g.find(A3 + ARENA_SIZE as u64), None);
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
        let _large = g.allocate_large(MIN + MIN / 2);
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
            dump.contains("# superblocks: 2 held (1 empty), 1 lent (1024.000000 KiB)"),
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
                "  Superblock 0: start=0x200000, end=0x380000, size=1.500000 MiB, empty=F, \
                 # free blocks=0, max free=0.000000 B, gap=0.000000 B"
            ),
            "{dump}"
        );
        assert!(dump.contains("  Superblock 1: start=0x380000"), "{dump}");
        assert_eq!(dump.lines().count(), 9);
        assert!(g.release(s).is_ok());
        let stats = g.stats();
        assert_eq!(stats.total_bytes + g.lent_bytes(), ARENA_SIZE);
    }

    #[test]
    fn reclaim_frees_the_only_block_and_lends_its_superblock() {
        let mut g = global();
        let ptr = g.allocate_large(2 * MIN).unwrap_or_default();
        assert_eq!(ptr, A3);
        // Refused, nothing changed: superblock too big for the room, wrong size, not held.
        assert!(g.reclaim(ptr, 2 * MIN, 2 * MIN - 256).is_none());
        assert!(g.reclaim(ptr, MIN + 256, usize::MAX).is_none());
        assert!(g.reclaim(ptr + 256, 256, usize::MAX).is_none());
        assert!(g.reclaim(0, 2 * MIN, usize::MAX).is_none());
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
        assert_eq!(g.superblock_count(), 1);
        // The block is gone for the global arena.
        assert_eq!(g.deallocate(ptr, 2 * MIN), Ok(false));
        assert!(g.release(sb).is_ok());
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn reclaim_refuses_shared_superblocks() {
        // 1.5 MiB on a 2.25 MiB arena: too short to split, the superblock keeps a 0.75 MiB free
        // tail, where a 256 B block then goes.
        let mut g = GlobalArena::new(A3, 2 * MIN + MIN / 4).unwrap_or_else(|e| panic!("{e}"));
        let big = g.allocate_large(MIN + MIN / 2).unwrap_or_default();
        let small = g.allocate_large(256).unwrap_or_default();
        assert_eq!(small, big + (MIN + MIN / 2) as u64);
        assert!(g.reclaim(big, MIN + MIN / 2, usize::MAX).is_none());
        assert_eq!(g.deallocate(small, 256), Ok(true));
        let sb = g.reclaim(big, MIN + MIN / 2, usize::MAX);
        assert_eq!(sb.as_ref().map(Superblock::size), Some(2 * MIN + MIN / 4));
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

    /// Splits, merges and loans in place keep the superblocks tiling the span, in any order.
    #[test]
    fn superblocks_and_loans_tile_the_span() {
        let mut g = GlobalArena::new(A3, 16 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut large = vec![];
        let mut lent = vec![];
        for i in 0..6usize {
            large.push((
                g.allocate_large(MIN + 256 * (i + 1)).unwrap_or_default(),
                MIN + 256 * (i + 1),
            ));
            lent.push(acquire(&mut g, 256));
        }
        let tiles = |g: &GlobalArena| {
            let mut spans: Vec<Block> = g.superblocks().map(Superblock::span).collect();
            spans.extend(g.lent_superblocks());
            spans.sort();
            let mut at = A3;
            for span in &spans {
                assert_eq!(span.addr, at, "{spans:?}");
                at = span.end();
            }
            assert_eq!(at, A3 + 16 * MIN as u64);
            let held: Vec<&Superblock> = g.superblocks().collect();
            for pair in held.windows(2) {
                assert!(!pair[0].is_contiguous_before(pair[1]), "not coalesced");
            }
        };
        tiles(&g);
        for (i, (ptr, size)) in large.into_iter().enumerate() {
            assert_eq!(g.deallocate_large(ptr, size), Ok(()));
            tiles(&g);
            if i % 2 == 0 {
                assert!(g.release(lent.remove(0)).is_ok());
                tiles(&g);
            }
        }
        for sb in lent {
            assert!(g.release(sb).is_ok());
            tiles(&g);
        }
        assert!(g.is_fully_coalesced());
    }
}
