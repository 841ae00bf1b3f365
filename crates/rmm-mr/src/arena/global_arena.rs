//! [`GlobalArena`]: the single upstream span, cut into superblocks that are lent to local arenas
//! or serve large allocations directly.

use std::collections::BTreeMap;
use std::fmt;

use super::fit_tree::FitTree;
use super::size_class::{align_down, align_up, ALLOCATION_ALIGNMENT};
use super::stats::format_bytes;
use super::{ArenaError, ArenaStats, Block, RejectedSuperblock, Superblock, SUPERBLOCK_MIN_SIZE};

/// Where [`GlobalArena::find`] located an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuperblockLocation {
    /// In a superblock the global arena holds (its span).
    Global(Block),
    /// In a superblock lent to some local arena (its span); the caller knows which arena.
    Lent(Block),
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
/// Costs (n = superblocks held, l = superblocks lent): [`acquire`](Self::acquire),
/// [`release`](Self::release), [`allocate_large`](Self::allocate_large),
/// [`deallocate`](Self::deallocate), [`find`](Self::find) are `O(log n + log l)` plus the
/// superblock's own `O(log)` work; [`stats`](Self::stats) and the `Display` dump are `O(n)`.
#[doc(alias = "rmm::mr::detail::arena::global_arena")]
pub struct GlobalArena {
    span: Block,
    /// Superblocks held here, by address, indexed by their largest free block.
    held: FitTree<Superblock>,
    /// Superblocks lent to local arenas: address -> size.
    lent: BTreeMap<u64, usize>,
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
        let mut held = FitTree::new();
        let inserted = held.insert(Superblock::fresh(span)).is_ok();
        debug_assert!(inserted);
        Ok(Self {
            span,
            held,
            lent: BTreeMap::new(),
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

    /// Take out the first superblock (address order) whose largest free block fits `size`;
    /// an empty one at least `max(size, 1 MiB) + 1 MiB` long is split and only its head of
    /// `max(size, 1 MiB)` bytes is taken.
    fn take_first_fit(&mut self, size: usize) -> Option<Superblock> {
        let key = self.held.first_fit(size)?.addr();
        let sb = self.held.remove(key)?;
        let head_size = size.max(SUPERBLOCK_MIN_SIZE);
        let splittable = head_size
            .checked_add(SUPERBLOCK_MIN_SIZE)
            .is_some_and(|needed| sb.is_empty() && sb.size() >= needed);
        if splittable {
            if let Some((head, tail)) = sb.split(head_size) {
                let inserted = self.held.insert(tail).is_ok();
                debug_assert!(inserted);
                return Some(head);
            }
        }
        Some(sb)
    }

    /// Lend a local arena a superblock that can serve `size` bytes (rounded up to 256).
    ///
    /// First superblock in address order that fits; if it is empty and at least 2 MiB (more
    /// generally `max(size, 1 MiB) + 1 MiB`), a 1 MiB head (`size` bytes for larger requests) is
    /// split off and lent, else the superblock is lent whole, which may be a partially used one.
    /// `None` when nothing fits (or `size` is 0).
    pub fn acquire(&mut self, size: usize) -> Option<Superblock> {
        let size = align_up(size).filter(|&s| s > 0)?;
        let sb = self.take_first_fit(size)?;
        self.lent.insert(sb.addr(), sb.size());
        self.lent_bytes += sb.size();
        Some(sb)
    }

    /// Take back a superblock lent by [`acquire`](Self::acquire), coalescing it with adjacent
    /// empty superblocks when it is empty.
    ///
    /// A superblock that this arena did not lend (or already got back) is refused with
    /// [`ArenaError::ForeignSuperblock`] and handed back.
    pub fn release(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        if self.lent.get(&superblock.addr()) != Some(&superblock.size()) {
            return Err(RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: superblock.addr(),
                    size: superblock.size(),
                },
                superblock,
            });
        }
        self.lent.remove(&superblock.addr());
        self.lent_bytes -= superblock.size();
        self.insert_coalescing(superblock);
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

    /// Insert a held superblock, merging it with empty neighbours when it is empty.
    fn insert_coalescing(&mut self, superblock: Superblock) {
        let mut merged = superblock;
        if merged.is_empty() {
            let prev_key = self
                .held
                .before(merged.addr())
                .filter(|prev| prev.is_contiguous_before(&merged))
                .map(Superblock::addr);
            if let Some(prev) = prev_key.and_then(|key| self.held.remove(key)) {
                match prev.merge(&merged) {
                    Some(joined) => merged = joined,
                    None => self.reinsert(prev),
                }
            }
            let next_key = self
                .held
                .get(merged.end())
                .filter(|next| merged.is_contiguous_before(next))
                .map(Superblock::addr);
            if let Some(next) = next_key.and_then(|key| self.held.remove(key)) {
                match merged.merge(&next) {
                    Some(joined) => merged = joined,
                    None => self.reinsert(next),
                }
            }
        }
        self.reinsert(merged);
    }

    fn reinsert(&mut self, superblock: Superblock) {
        let inserted = self.held.insert(superblock).is_ok();
        debug_assert!(inserted, "superblocks held by the global arena overlap");
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
        let mut sb = self.take_first_fit(size)?;
        let block = sb.allocate(size);
        self.insert_coalescing(sb);
        block.map(|b| b.addr)
    }

    /// Free a block that lies in a superblock held by the global arena (any size; RMM's
    /// `global_arena::deallocate_sync`). A superblock that becomes empty is coalesced with its
    /// empty neighbours.
    ///
    /// `Ok(true)`: freed. `Ok(false)`: no superblock held here contains `addr` (it may be in a
    /// local arena; keep searching). `Err`: a superblock held here contains `addr` but the free
    /// is wrong (see [`Superblock::deallocate`]); nothing changed.
    pub fn deallocate(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let Some(key) = self.held_key_containing(addr) else {
            return Ok(false);
        };
        let outcome = self.held.update(key, |sb| {
            sb.deallocate(Block::new(addr, size))
                .map(|()| sb.is_empty())
        });
        match outcome {
            None => Ok(false),
            Some(Err(error)) => Err(error),
            Some(Ok(now_empty)) => {
                if now_empty {
                    if let Some(sb) = self.held.remove(key) {
                        self.insert_coalescing(sb);
                    }
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

    fn held_key_containing(&self, addr: u64) -> Option<u64> {
        self.held
            .floor(addr)
            .filter(|sb| sb.contains_addr(addr))
            .map(Superblock::addr)
    }

    /// Whether a superblock held by the global arena contains `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        self.held_key_containing(addr).is_some()
    }

    /// Which superblock contains `addr`: one held here, one lent to a local arena, or none
    /// (outside the span). Lets the resource route a free without trying every arena.
    pub fn find(&self, addr: u64) -> Option<SuperblockLocation> {
        if let Some(sb) = self.held.floor(addr).filter(|sb| sb.contains_addr(addr)) {
            return Some(SuperblockLocation::Global(sb.span()));
        }
        self.lent
            .range(..=addr)
            .next_back()
            .map(|(&start, &size)| Block::new(start, size))
            .filter(|span| span.contains_addr(addr))
            .map(SuperblockLocation::Lent)
    }

    /// Number of superblocks held by the global arena.
    pub fn superblock_count(&self) -> usize {
        self.held.len()
    }

    /// The superblocks held by the global arena, in address order.
    pub fn superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        self.held.iter()
    }

    /// Number of superblocks lent to local arenas.
    pub fn lent_superblock_count(&self) -> usize {
        self.lent.len()
    }

    /// Spans of the superblocks lent to local arenas, in address order.
    pub fn lent_superblocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.lent
            .iter()
            .map(|(&addr, &size)| Block::new(addr, size))
    }

    /// Total size of the superblocks lent to local arenas.
    pub fn lent_bytes(&self) -> usize {
        self.lent_bytes
    }

    /// Size of the largest free block held by the global arena (`O(1)`): the largest large
    /// allocation that can succeed now.
    pub fn max_free_size(&self) -> usize {
        self.held.max_fit()
    }

    /// Whether the arena is back in its initial state: nothing lent and one empty superblock
    /// covering the whole span.
    pub fn is_fully_coalesced(&self) -> bool {
        self.lent.is_empty()
            && self.held.len() == 1
            && self
                .held
                .iter()
                .next()
                .is_some_and(|sb| sb.is_empty() && sb.span() == self.span)
    }

    /// Byte accounting over the superblocks held here (not the lent ones).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats::from_superblocks(self.held.iter())
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
            self.lent.len(),
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
        for (index, sb) in self.held.iter().enumerate() {
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
            .field("held", &self.held.len())
            .field("lent", &self.lent.len())
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
        assert!(dump.starts_with("Failed to allocate 8.00 MiB\n"), "{dump}");
        assert!(dump.contains("Arena size: 4.00 MiB at 0x100000"), "{dump}");
        assert!(
            dump.contains("# superblocks: 2 held (1 empty), 1 lent (1.00 MiB)"),
            "{dump}"
        );
        assert!(dump.contains("Total free memory: 1.50 MiB"), "{dump}");
        assert!(
            dump.contains("Largest block of free memory: 1.50 MiB"),
            "{dump}"
        );
        assert!(dump.contains("Fragmentation: 0.00%"), "{dump}");
        assert!(
            dump.contains(
                "  Superblock 0: start=0x200000, end=0x380000, size=1.50 MiB, empty=F, \
                 # free blocks=0, max free=0 B, gap=0 B"
            ),
            "{dump}"
        );
        assert!(dump.contains("  Superblock 1: start=0x380000"), "{dump}");
        assert_eq!(dump.lines().count(), 9);
        assert!(g.release(s).is_ok());
        let stats = g.stats();
        assert_eq!(stats.total_bytes + g.lent_bytes(), ARENA_SIZE);
    }
}
