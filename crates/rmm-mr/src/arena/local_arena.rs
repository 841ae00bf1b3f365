//! [`LocalArena`]: the superblocks one thread (per-thread default stream) or one stream
//! allocates small blocks from.

use std::fmt;

use super::fit_tree::{FitTree, Handle};
use super::size_class::align_up;
use super::{ArenaError, ArenaStats, Block, GlobalArena, RejectedSuperblock, Superblock};

/// A per-thread or per-stream arena (RMM's `arena`): superblocks borrowed from the
/// [`GlobalArena`], sub-allocated by address-ordered first fit.
///
/// The global arena is passed to the calls that need it instead of being referenced, so the
/// resource decides the locking: [`allocate_local`](Self::allocate_local),
/// [`allocate_kept`](Self::allocate_kept) and [`deallocate`](Self::deallocate) touch only this
/// arena (the fast path needs only this arena's lock), and only growing
/// ([`GlobalArena::acquire`] + [`adopt`](Self::adopt), or [`allocate`](Self::allocate) which
/// does all three), [`clean`](Self::clean) and [`defragment`](Self::defragment) need the global
/// arena too.
///
/// Besides RMM's superblocks for small requests, an arena can keep superblocks for its large
/// requests ([`keep`](Self::keep), an addition to RMM): the resource gives a stream the
/// superblock its own large free emptied ([`GlobalArena::reclaim`]), so that the stream's next
/// large requests reuse it without the global arena. Kept superblocks serve only large requests
/// ([`allocate_kept`](Self::allocate_kept)), so small requests see exactly RMM's superblocks;
/// they go back to the global arena with the others ([`clean`](Self::clean),
/// [`defragment`](Self::defragment)) or on their own ([`release_empty_kept`](Self::release_empty_kept)).
///
/// Costs (s = superblocks here; each superblock's own work is `O(log)` in its blocks):
/// [`allocate_local`](Self::allocate_local), [`allocate_kept`](Self::allocate_kept),
/// [`deallocate`](Self::deallocate), [`contains`](Self::contains), [`adopt`](Self::adopt) and
/// [`keep`](Self::keep) are `O(log s)`; [`clean`](Self::clean) is `O(s log n)` and
/// [`defragment`](Self::defragment) `O(s + e log n)` (e = empty superblocks, n = superblocks of
/// the global arena).
///
/// Dropping a local arena that still holds superblocks loses them for the global arena (they
/// stay recorded as lent): call [`clean`](Self::clean) first, as RMM's `arena_cleaner` does when
/// a thread exits. A warning is logged if this is forgotten.
#[doc(alias = "rmm::mr::detail::arena::arena")]
#[derive(Default)]
pub struct LocalArena {
    /// Superblocks for small requests by address, indexed by their largest free block.
    superblocks: FitTree<Superblock>,
    /// Superblocks kept for large requests, the same way.
    kept: FitTree<Superblock>,
    /// Free bytes in `kept`.
    kept_free: usize,
}

/// The superblock of `tree` that contains `addr`.
fn containing(tree: &FitTree<Superblock>, addr: u64) -> Option<Handle> {
    tree.floor_handle(addr)
        .filter(|&h| tree.get_at(h).is_some_and(|sb| sb.contains_addr(addr)))
}

fn overlaps_any(tree: &FitTree<Superblock>, span: Block) -> bool {
    tree.floor(span.addr)
        .is_some_and(|prev| prev.span().overlaps(&span))
        || tree
            .ceiling(span.addr)
            .is_some_and(|next| next.span().overlaps(&span))
}

impl LocalArena {
    /// An arena holding no superblocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocate `size` bytes (rounded up to 256), growing from `global` when needed (RMM's
    /// `arena::allocate_sync`).
    ///
    /// [Large](GlobalArena::handles) requests are served by the superblocks kept for them
    /// ([`allocate_kept`](Self::allocate_kept); there are none unless [`keep`](Self::keep) was
    /// used), else by [`GlobalArena::allocate_large`]. Small ones take the first fit over this
    /// arena's superblocks; failing that, a superblock is acquired from `global` and the block
    /// is taken from it. `None` when nothing fits anywhere (the resource then cleans every arena
    /// and retries once) or `size` is 0.
    pub fn allocate(&mut self, size: usize, global: &mut GlobalArena) -> Option<u64> {
        if GlobalArena::handles(size) {
            if let Some(addr) = self.allocate_kept(size) {
                return Some(addr);
            }
            return global.allocate_large(size);
        }
        if let Some(addr) = self.allocate_local(size) {
            return Some(addr);
        }
        let superblock = global.acquire(size)?;
        match self.adopt(superblock) {
            Ok(()) => self.allocate_local(size),
            Err(rejected) => {
                // Only possible if `global` lent a superblock overlapping one held here, i.e.
                // this arena was fed from another global arena. Give it straight back.
                let _ = global.release(*rejected.superblock);
                None
            }
        }
    }

    /// Allocate `size` bytes (rounded up to 256) from this arena's superblocks only: the first
    /// superblock (address order) whose largest free block fits, then the first fit inside it.
    /// `None` when none fits, when `size` is 0, or when it is [large](GlobalArena::handles).
    pub fn allocate_local(&mut self, size: usize) -> Option<u64> {
        let size = align_up(size).filter(|&s| s > 0 && !GlobalArena::handles(s))?;
        let found = self.superblocks.first_fit_handle(size)?;
        self.superblocks
            .update_at(found, |sb| sb.allocate(size))
            .flatten()
            .map(|block| block.addr)
    }

    /// Allocate a [large](GlobalArena::handles) request of `size` bytes (rounded up to 256)
    /// from the superblocks kept for large requests ([`keep`](Self::keep)): address-ordered
    /// first fit, as everywhere. `None` when none fits or the request is not large.
    pub fn allocate_kept(&mut self, size: usize) -> Option<u64> {
        let size = align_up(size).filter(|&s| GlobalArena::handles(s))?;
        let found = self.kept.first_fit_handle(size)?;
        let block = self
            .kept
            .update_at(found, |sb| sb.allocate(size))
            .flatten()?;
        self.kept_free -= block.size;
        Some(block.addr)
    }

    /// The refusal of a superblock that overlaps one held here.
    fn check_disjoint(&self, superblock: Superblock) -> Result<Superblock, RejectedSuperblock> {
        let span = superblock.span();
        if overlaps_any(&self.superblocks, span) || overlaps_any(&self.kept, span) {
            return Err(RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: span.addr,
                    size: span.size,
                },
                superblock: Box::new(superblock),
            });
        }
        Ok(superblock)
    }

    fn insert_into(
        tree: &mut FitTree<Superblock>,
        superblock: Superblock,
    ) -> Result<(), RejectedSuperblock> {
        tree.insert(superblock)
            .map_err(|superblock| RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: superblock.addr(),
                    size: superblock.size(),
                },
                superblock: Box::new(superblock),
            })
    }

    /// Take a superblock (normally just acquired from the global arena) into this arena.
    ///
    /// Refused with [`ArenaError::ForeignSuperblock`] (and handed back) if it overlaps one this
    /// arena already holds.
    pub fn adopt(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        let superblock = self.check_disjoint(superblock)?;
        Self::insert_into(&mut self.superblocks, superblock)
    }

    /// Keep a superblock (normally from [`GlobalArena::reclaim`]) to serve this arena's large
    /// requests ([`allocate_kept`](Self::allocate_kept)); small requests never use it.
    ///
    /// Refused like [`adopt`](Self::adopt).
    pub fn keep(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        let superblock = self.check_disjoint(superblock)?;
        let free = superblock.total_free_size();
        Self::insert_into(&mut self.kept, superblock)?;
        self.kept_free += free;
        Ok(())
    }

    /// Free a block if one of this arena's superblocks contains `addr` (RMM's
    /// `arena::deallocate_sync`); works for any size (large blocks are served by the kept
    /// superblocks).
    ///
    /// `Ok(true)`: freed here (an emptied superblock stays until [`clean`](Self::clean) or
    /// [`defragment`](Self::defragment)). `Ok(false)`: no superblock here contains `addr`; the
    /// resource searches the other arenas and the global arena. `Err`: the superblock holding
    /// `addr` is here, so no other arena can own it, and the free is wrong
    /// ([`ArenaError::DoubleFree`], [`ArenaError::SizeMismatch`], [`ArenaError::NotFound`]);
    /// nothing changed.
    pub fn deallocate(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let block = Block::new(addr, size);
        // Large blocks are usually in kept superblocks, small ones never are.
        let large = align_up(size).is_some_and(GlobalArena::handles);
        if large {
            if let Some(freed) = self.deallocate_kept(block) {
                return freed;
            }
        }
        if let Some(found) = containing(&self.superblocks, addr) {
            return match self.superblocks.update_at(found, |sb| sb.deallocate(block)) {
                Some(result) => result.map(|()| true),
                None => Ok(false),
            };
        }
        if large {
            return Ok(false);
        }
        self.deallocate_kept(block).unwrap_or(Ok(false))
    }

    /// [`deallocate`](Self::deallocate) in the kept superblocks; `None` when none contains the
    /// block.
    fn deallocate_kept(&mut self, block: Block) -> Option<Result<bool, ArenaError>> {
        let found = containing(&self.kept, block.addr)?;
        let freed = self.kept.update_at(found, |sb| {
            let before = sb.total_free_size();
            sb.deallocate(block).map(|()| sb.total_free_size() - before)
        })?;
        Some(freed.map(|bytes| {
            self.kept_free += bytes;
            true
        }))
    }

    /// Whether one of this arena's superblocks contains `addr` (`O(log s)`).
    pub fn contains(&self, addr: u64) -> bool {
        containing(&self.superblocks, addr).is_some() || containing(&self.kept, addr).is_some()
    }

    /// Return every superblock, empty or not, kept for large requests or not, to `global`
    /// (RMM's `arena::clean`, used by defragmentation and at thread exit). Returns how many were
    /// returned.
    ///
    /// A superblock `global` refuses (it was not lent by that global arena) stays here and the
    /// first such error is returned after trying all of them.
    pub fn clean(&mut self, global: &mut GlobalArena) -> Result<usize, ArenaError> {
        let small = self.superblocks.take_all();
        let kept = self.kept.take_all();
        self.kept_free = 0;
        let first = self.release_to(global, small, false);
        let second = self.release_to(global, kept, true);
        Ok(first? + second?)
    }

    /// Take out every superblock, empty or not, kept for large requests or not, without giving
    /// them to the global arena (the resource moves the superblocks of a destroyed stream's
    /// arena into its arena of retired superblocks, where their live blocks can still be
    /// freed).
    pub fn take_all(&mut self) -> Vec<Superblock> {
        let mut all = self.superblocks.take_all();
        all.extend(self.kept.take_all());
        self.kept_free = 0;
        all
    }

    /// Return only the empty superblocks to `global` (RMM's `arena::defragment`). Returns how
    /// many were returned; refusals are handled as in [`clean`](Self::clean).
    pub fn defragment(&mut self, global: &mut GlobalArena) -> Result<usize, ArenaError> {
        let small = Self::take_empty_from(&mut self.superblocks);
        let first = self.release_to(global, small, false);
        let second = self.release_empty_kept(global);
        Ok(first? + second?)
    }

    /// Return the empty superblocks kept for large requests to `global` (the others stay).
    /// Returns how many were returned; refusals are handled as in [`clean`](Self::clean).
    pub fn release_empty_kept(&mut self, global: &mut GlobalArena) -> Result<usize, ArenaError> {
        let kept = Self::take_empty_from(&mut self.kept);
        self.kept_free -= kept.iter().map(Superblock::size).sum::<usize>();
        self.release_to(global, kept, true)
    }

    /// Take out the empty superblocks, kept ones included, without giving them to the global
    /// arena: the resource first makes sure that no stream still uses their memory, then
    /// [releases](GlobalArena::release) them. Superblocks still in use stay. `O(s + e log s)`.
    pub fn take_empty(&mut self) -> Vec<Superblock> {
        let mut empty = Self::take_empty_from(&mut self.superblocks);
        let kept = Self::take_empty_from(&mut self.kept);
        self.kept_free -= kept.iter().map(Superblock::size).sum::<usize>();
        empty.extend(kept);
        empty
    }

    /// Whether any superblock here is empty (`O(s)`).
    pub fn has_empty(&self) -> bool {
        self.superblocks().any(Superblock::is_empty)
    }

    fn take_empty_from(tree: &mut FitTree<Superblock>) -> Vec<Superblock> {
        let empty_keys: Vec<u64> = tree
            .iter()
            .filter(|sb| sb.is_empty())
            .map(Superblock::addr)
            .collect();
        empty_keys
            .into_iter()
            .filter_map(|key| tree.remove(key))
            .collect()
    }

    fn release_to(
        &mut self,
        global: &mut GlobalArena,
        superblocks: Vec<Superblock>,
        kept: bool,
    ) -> Result<usize, ArenaError> {
        let mut released = 0;
        let mut first_error = None;
        for sb in superblocks {
            match global.release(sb) {
                Ok(()) => released += 1,
                Err(rejected) => {
                    first_error.get_or_insert(rejected.error);
                    let sb = rejected.superblock;
                    let free = sb.total_free_size();
                    let tree = if kept {
                        self.kept_free += free;
                        &mut self.kept
                    } else {
                        &mut self.superblocks
                    };
                    let back = tree.insert(*sb).is_ok();
                    debug_assert!(back);
                }
            }
        }
        match first_error {
            None => Ok(released),
            Some(error) => Err(error),
        }
    }

    /// Number of superblocks held, kept for large requests included.
    pub fn superblock_count(&self) -> usize {
        self.superblocks.len() + self.kept.len()
    }

    /// Number of superblocks kept for large requests.
    pub fn kept_superblock_count(&self) -> usize {
        self.kept.len()
    }

    /// The superblocks kept for large requests, in address order.
    pub fn kept_superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        self.kept.iter()
    }

    /// Free bytes in the superblocks kept for large requests (`O(1)`).
    pub fn kept_free_bytes(&self) -> usize {
        self.kept_free
    }

    /// The superblocks held, kept for large requests included, in address order.
    pub fn superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        let mut small = self.superblocks.iter().peekable();
        let mut kept = self.kept.iter().peekable();
        std::iter::from_fn(move || match (small.peek(), kept.peek()) {
            (Some(a), Some(b)) if b.addr() < a.addr() => kept.next(),
            (Some(_), _) => small.next(),
            (None, _) => kept.next(),
        })
    }

    /// Size of the largest free block in this arena (`O(1)`).
    pub fn max_free_size(&self) -> usize {
        self.superblocks.max_fit().max(self.kept.max_fit())
    }

    /// Byte accounting over this arena's superblocks (`O(s)`).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats::from_superblocks(self.superblocks())
    }
}

impl fmt::Debug for LocalArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalArena")
            .field("superblocks", &self.superblocks.len())
            .field("kept", &self.kept.len())
            .field("kept_free", &self.kept_free)
            .field("max_free", &self.max_free_size())
            .finish()
    }
}

impl Drop for LocalArena {
    fn drop(&mut self) {
        if self.superblock_count() > 0 {
            log::warn!(
                "arena: local arena dropped while holding {} superblock(s); call clean() first",
                self.superblock_count()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::{SuperblockLocation, SUPERBLOCK_MIN_SIZE};

    const MIN: usize = SUPERBLOCK_MIN_SIZE;
    const KIB: usize = 1 << 10;
    const A3: u64 = MIN as u64;
    const A4: u64 = 2 * MIN as u64;
    const ARENA_SIZE: usize = 4 * MIN;

    /// RMM's `ArenaTest` fixture: a 4-superblock global arena at `fake_address3` and one
    /// per-thread arena.
    fn fixture() -> (GlobalArena, LocalArena) {
        let global = GlobalArena::new(A3, ARENA_SIZE).unwrap_or_else(|e| panic!("{e}"));
        (global, LocalArena::new())
    }

    fn alloc(arena: &mut LocalArena, global: &mut GlobalArena, size: usize) -> u64 {
        arena
            .allocate(size, global)
            .unwrap_or_else(|| panic!("allocate {size}"))
    }

    fn free(arena: &mut LocalArena, addr: u64, size: usize) {
        assert_eq!(arena.deallocate(addr, size), Ok(true));
    }

    /// The resource shares arenas between threads behind locks.
    #[test]
    fn arena_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<GlobalArena>();
        check::<LocalArena>();
        check::<Superblock>();
        check::<RejectedSuperblock>();
    }

    /// RMM `ArenaTest.ArenaAllocate`.
    #[test]
    fn arena_allocate() {
        let (mut g, mut a) = fixture();
        assert_eq!(a.allocate(MIN, &mut g), Some(A3));
        assert_eq!(a.allocate(256, &mut g), Some(A4));
        assert!(a.clean(&mut g).is_ok());
    }

    /// RMM `ArenaTest.ArenaDeallocate`.
    #[test]
    fn arena_deallocate() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, MIN);
        free(&mut a, ptr, MIN);
        let ptr2 = alloc(&mut a, &mut g, 256);
        free(&mut a, ptr2, 256);
        assert_eq!(a.allocate(MIN, &mut g), Some(A3));
        assert!(a.clean(&mut g).is_ok());
    }

    /// RMM `ArenaTest.ArenaDeallocateMergePrevious`.
    #[test]
    fn arena_deallocate_merge_previous() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, 256);
        let ptr2 = alloc(&mut a, &mut g, 256);
        let _ = alloc(&mut a, &mut g, 256);
        free(&mut a, ptr, 256);
        free(&mut a, ptr2, 256);
        assert_eq!(a.allocate(512, &mut g), Some(A3));
        assert!(a.clean(&mut g).is_ok());
    }

    /// RMM `ArenaTest.ArenaDeallocateMergeNext`.
    #[test]
    fn arena_deallocate_merge_next() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, 256);
        let ptr2 = alloc(&mut a, &mut g, 256);
        let _ = alloc(&mut a, &mut g, 256);
        free(&mut a, ptr2, 256);
        free(&mut a, ptr, 256);
        assert_eq!(a.allocate(512, &mut g), Some(A3));
        assert!(a.clean(&mut g).is_ok());
    }

    /// RMM `ArenaTest.ArenaDeallocateMergePreviousAndNext`.
    #[test]
    fn arena_deallocate_merge_previous_and_next() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, 256);
        let ptr2 = alloc(&mut a, &mut g, 256);
        free(&mut a, ptr, 256);
        free(&mut a, ptr2, 256);
        assert_eq!(a.allocate(2 * KIB, &mut g), Some(A3));
        assert!(a.clean(&mut g).is_ok());
    }

    /// RMM `ArenaTest.ArenaDefragment`.
    #[test]
    fn arena_defragment() {
        let (mut g, mut a) = fixture();
        let pointers: Vec<u64> = (0..4).map(|_| alloc(&mut a, &mut g, MIN)).collect();
        assert_eq!(a.superblock_count(), 4);
        for ptr in pointers {
            free(&mut a, ptr, MIN);
        }
        assert_eq!(g.allocate_large(ARENA_SIZE), None);
        assert_eq!(a.defragment(&mut g), Ok(4));
        assert_eq!(a.superblock_count(), 0);
        assert_eq!(g.allocate_large(ARENA_SIZE), Some(A3));
    }

    #[test]
    fn defragment_keeps_used_superblocks_and_clean_returns_all() {
        let (mut g, mut a) = fixture();
        let kept = alloc(&mut a, &mut g, MIN / 2);
        let big = alloc(&mut a, &mut g, MIN);
        free(&mut a, big, MIN);
        assert_eq!(a.superblock_count(), 2);
        assert_eq!(a.defragment(&mut g), Ok(1));
        assert_eq!(a.superblock_count(), 1);
        assert!(a.contains(kept));
        assert_eq!(a.clean(&mut g), Ok(1));
        assert_eq!(a.superblock_count(), 0);
        // The used superblock now lives in the global arena, which can free the block.
        assert_eq!(
            g.find(kept),
            Some(SuperblockLocation::Global(Block::new(A3, MIN / 2)))
        );
        assert_eq!(g.deallocate(kept, MIN / 2), Ok(true));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn large_requests_bypass_the_local_arena() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, 2 * MIN);
        assert_eq!(a.superblock_count(), 0);
        assert_eq!(a.allocate_local(2 * MIN), None);
        assert_eq!(a.deallocate(ptr, 2 * MIN), Ok(false));
        assert_eq!(g.deallocate_large(ptr, 2 * MIN), Ok(()));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn allocate_local_never_touches_the_global_arena() {
        let (mut g, mut a) = fixture();
        assert_eq!(a.allocate_local(256), None);
        assert_eq!(a.allocate_local(0), None);
        let sb = g.acquire(256).unwrap_or_else(|| panic!("acquire"));
        assert!(a.adopt(sb).is_ok());
        assert_eq!(a.allocate_local(256), Some(A3));
        assert_eq!(a.allocate_local(MIN), None);
        assert_eq!(a.allocate(0, &mut g), None);
        assert_eq!(a.clean(&mut g), Ok(1));
    }

    #[test]
    fn wrong_frees_are_errors() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, KIB);
        // Outside every superblock of this arena: not ours, search on.
        assert_eq!(a.deallocate(A4, 256), Ok(false));
        assert_eq!(a.deallocate(0, 256), Ok(false));
        assert!(matches!(
            a.deallocate(ptr, 2 * KIB),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            a.deallocate(ptr + 256, 256),
            Err(ArenaError::NotFound { .. })
        ));
        free(&mut a, ptr, KIB);
        assert_eq!(
            a.deallocate(ptr, KIB),
            Err(ArenaError::DoubleFree {
                addr: ptr,
                size: KIB
            })
        );
        assert_eq!(a.clean(&mut g), Ok(1));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn adopt_refuses_overlaps_and_clean_keeps_refused_superblocks() {
        let (mut g, mut a) = fixture();
        let ptr = alloc(&mut a, &mut g, 256);
        let forged = Superblock::new(A3, MIN).unwrap_or_else(|e| panic!("{e}"));
        let rejected = a.adopt(forged).err();
        assert!(matches!(
            rejected.map(|r| r.error),
            Some(ArenaError::ForeignSuperblock { .. })
        ));
        let straddling = Superblock::new(A3 - 256, MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.adopt(straddling).is_err());
        // A superblock the global arena never lent: clean() keeps it and reports the error.
        let stray = Superblock::new(0, MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.adopt(stray).is_ok());
        free(&mut a, ptr, 256);
        assert_eq!(
            a.clean(&mut g),
            Err(ArenaError::ForeignSuperblock { addr: 0, size: MIN })
        );
        assert_eq!(a.superblock_count(), 1);
        assert!(a.contains(0));
        assert!(!a.contains(A3));
        assert!(g.is_fully_coalesced());
        // Leave `a` empty so the drop warning stays quiet.
        drop(a.superblocks.take_all());
    }

    /// The wrapper's free search, as RMM does it: this arena, the other arenas, then the global
    /// arena.
    fn free_anywhere(
        arenas: &mut [&mut LocalArena],
        first: usize,
        global: &mut GlobalArena,
        addr: u64,
        size: usize,
    ) -> Result<(), ArenaError> {
        let order = std::iter::once(first).chain((0..arenas.len()).filter(|&i| i != first));
        for i in order {
            if arenas[i].deallocate(addr, size)? {
                return Ok(());
            }
        }
        global.deallocate_large(addr, size)
    }

    /// RMM `ArenaTest.Defragment` (resource test) at the bookkeeping level: four stream arenas
    /// each take a superblock, then an arena-sized request only succeeds after cleaning them.
    #[test]
    fn arena_sized_request_after_cleaning_all_arenas() {
        let (mut g, _) = fixture();
        let mut arenas: Vec<LocalArena> = (0..4).map(|_| LocalArena::new()).collect();
        for arena in &mut arenas {
            let ptr = alloc(arena, &mut g, 32 * KIB);
            free(arena, ptr, 32 * KIB);
        }
        assert_eq!(g.allocate_large(ARENA_SIZE), None);
        for arena in &mut arenas {
            assert_eq!(arena.clean(&mut g), Ok(1));
        }
        let ptr = g.allocate_large(ARENA_SIZE);
        assert_eq!(ptr, Some(A3));
        assert_eq!(g.deallocate_large(A3, ARENA_SIZE), Ok(()));
        assert!(g.is_fully_coalesced());
    }

    /// RMM `ArenaTest.PerThreadToStreamDealloc` at the bookkeeping level: a block allocated in a
    /// thread arena whose superblock went back to the global arena can still be freed after
    /// another arena took the memory around it. (In RMM the partly used superblock is lent whole
    /// to the stream arena and the block is found there; here the superblock dissolves in the
    /// global arena, the stream arena gets the free memory around the block, and the global
    /// arena frees the block.)
    #[test]
    fn per_thread_to_stream_dealloc() {
        let mut g = GlobalArena::new(A3, 2 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut thread = LocalArena::new();
        let mut stream = LocalArena::new();
        let mut default_stream = LocalArena::new();

        let thread_ptr = alloc(&mut thread, &mut g, 256);
        let ptr = alloc(&mut stream, &mut g, 32 * KIB);
        free(&mut stream, ptr, 32 * KIB);
        // The global arena is empty now: the resource would defragment (clean all) and retry.
        assert_eq!(default_stream.allocate(MIN, &mut g), None);
        for arena in [&mut thread, &mut stream, &mut default_stream] {
            assert!(arena.clean(&mut g).is_ok());
        }
        // All of the span but the thread's block is one free block again, lent whole.
        let ptr1 = alloc(&mut default_stream, &mut g, MIN);
        assert_eq!(ptr1, thread_ptr + 256);
        let ptr2 = alloc(&mut default_stream, &mut g, 32 * KIB);
        assert_eq!(ptr2, ptr1 + MIN as u64);
        assert_eq!(
            g.lent_superblocks().collect::<Vec<_>>(),
            vec![Block::new(A3 + 256, 2 * MIN - 256)]
        );
        assert!(!default_stream.contains(thread_ptr) && g.contains(thread_ptr));

        let mut arenas = [&mut thread, &mut stream, &mut default_stream];
        assert_eq!(
            free_anywhere(&mut arenas, 0, &mut g, thread_ptr, 256),
            Ok(())
        );
        assert_eq!(free_anywhere(&mut arenas, 2, &mut g, ptr1, MIN), Ok(()));
        assert_eq!(
            free_anywhere(&mut arenas, 2, &mut g, ptr2, 32 * KIB),
            Ok(())
        );
        assert_eq!(
            free_anywhere(&mut arenas, 0, &mut g, thread_ptr, 256),
            Err(ArenaError::DoubleFree {
                addr: thread_ptr,
                size: 256
            })
        );
        assert_eq!(
            free_anywhere(&mut arenas, 1, &mut g, 0x10, 256),
            Err(ArenaError::NotFound {
                addr: 0x10,
                size: 256
            })
        );
        for arena in arenas {
            assert!(arena.clean(&mut g).is_ok());
        }
        assert!(g.is_fully_coalesced());
    }

    /// `take_empty` takes out exactly the empty superblocks, kept ones included.
    #[test]
    fn take_empty_leaves_used_superblocks() {
        let mut g = GlobalArena::new(A3, 8 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut a = LocalArena::new();
        let used = alloc(&mut a, &mut g, MIN / 2);
        let emptied = alloc(&mut a, &mut g, MIN);
        free(&mut a, emptied, MIN);
        let big = alloc(&mut a, &mut g, 2 * MIN);
        let sb = g
            .reclaim(big, 2 * MIN, usize::MAX)
            .unwrap_or_else(|| panic!("reclaim"));
        assert!(a.keep(sb).is_ok());
        assert!(a.has_empty());
        let empty = a.take_empty();
        assert_eq!(
            empty.iter().map(Superblock::addr).collect::<Vec<_>>(),
            vec![emptied, big]
        );
        assert_eq!((a.superblock_count(), a.kept_free_bytes()), (1, 0));
        assert!(a.contains(used) && !a.has_empty());
        assert!(g.release_all(empty).is_ok());
        free(&mut a, used, MIN / 2);
        let last = a.take_empty();
        assert_eq!((last.len(), a.superblock_count()), (1, 0));
        assert_eq!(g.lent_superblock_count(), 1, "taken out, not released");
        assert!(g.release_all(last).is_ok());
        assert!(g.is_fully_coalesced());
    }

    /// A superblock emptied by a large free, kept by the arena: it serves the arena's large
    /// requests first (address-ordered first fit over the kept superblocks), never small ones,
    /// and goes back with `clean`, `defragment` or `release_empty_kept`.
    #[test]
    fn kept_superblocks_serve_only_large_requests() {
        let mut g = GlobalArena::new(A3, 8 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut a = LocalArena::new();
        let big = alloc(&mut a, &mut g, 3 * MIN);
        assert_eq!(big, A3);
        let sb = g
            .reclaim(big, 3 * MIN, usize::MAX)
            .unwrap_or_else(|| panic!("reclaim"));
        assert!(a.keep(sb).is_ok());
        assert_eq!((a.superblock_count(), a.kept_superblock_count()), (1, 1));
        assert_eq!(a.kept_free_bytes(), 3 * MIN);
        assert!(a.contains(big));
        assert_eq!(
            g.find(big),
            Some(SuperblockLocation::Lent(Block::new(A3, 3 * MIN)))
        );

        // Small requests do not see it.
        assert_eq!(a.allocate_local(256), None);
        assert_eq!(a.allocate_kept(MIN), None, "1 MiB is small");
        let small = alloc(&mut a, &mut g, 256);
        assert_eq!(small, A3 + 3 * MIN as u64, "acquired from the global arena");
        // Large ones use it first: first fit, then the rest of it.
        let x = alloc(&mut a, &mut g, MIN + 256);
        assert_eq!(x, A3);
        assert_eq!(a.kept_free_bytes(), 2 * MIN - 256);
        let y = alloc(&mut a, &mut g, MIN + 512);
        assert_eq!(y, A3 + (MIN + 256) as u64);
        assert_eq!(a.kept_free_bytes(), MIN - 768);
        let z = alloc(&mut a, &mut g, 2 * MIN);
        assert!(
            !a.contains(z),
            "no room left in the kept superblock: the global arena"
        );
        assert_eq!(g.deallocate_large(z, 2 * MIN), Ok(()));

        // Frees come back into it; wrong ones are errors.
        assert!(matches!(
            a.deallocate(x, MIN),
            Err(ArenaError::SizeMismatch { .. })
        ));
        assert!(matches!(
            a.deallocate(x, 256),
            Err(ArenaError::SizeMismatch { .. })
        ));
        free(&mut a, x, MIN + 256);
        assert_eq!(
            a.deallocate(x, MIN + 256),
            Err(ArenaError::DoubleFree {
                addr: x,
                size: MIN + 256
            })
        );
        assert_eq!(a.kept_free_bytes(), 2 * MIN - 512);
        // Not empty: stays.
        assert_eq!(a.release_empty_kept(&mut g), Ok(0));
        assert_eq!(a.defragment(&mut g), Ok(0));
        free(&mut a, y, MIN + 512);
        assert_eq!(a.kept_free_bytes(), 3 * MIN);
        assert_eq!(
            a.kept_superblocks()
                .map(Superblock::span)
                .collect::<Vec<_>>(),
            vec![Block::new(A3, 3 * MIN)]
        );
        assert_eq!(a.release_empty_kept(&mut g), Ok(1));
        assert_eq!((a.kept_superblock_count(), a.kept_free_bytes()), (0, 0));
        free(&mut a, small, 256);
        assert_eq!(a.clean(&mut g), Ok(1));
        assert!(g.is_fully_coalesced());
    }

    #[test]
    fn clean_and_defragment_return_kept_superblocks() {
        let mut g = GlobalArena::new(A3, 8 * MIN).unwrap_or_else(|e| panic!("{e}"));
        let mut a = LocalArena::new();
        let p = alloc(&mut a, &mut g, 2 * MIN);
        let q = alloc(&mut a, &mut g, 2 * MIN);
        for ptr in [p, q] {
            let sb = g
                .reclaim(ptr, 2 * MIN, usize::MAX)
                .unwrap_or_else(|| panic!("reclaim"));
            assert!(a.keep(sb).is_ok());
        }
        // Overlapping superblocks are refused, kept or adopted.
        let forged = Superblock::new(p, MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.keep(forged).is_err());
        let forged = Superblock::new(q + 256, MIN).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.adopt(forged).is_err());
        let used = alloc(&mut a, &mut g, 2 * MIN);
        assert_eq!(used, p);
        assert_eq!(
            a.superblocks().map(Superblock::addr).collect::<Vec<_>>(),
            vec![p, q]
        );
        assert_eq!(a.defragment(&mut g), Ok(1), "only the empty one");
        assert_eq!(a.kept_superblock_count(), 1);
        assert_eq!(a.clean(&mut g), Ok(1));
        assert_eq!((a.superblock_count(), a.kept_free_bytes()), (0, 0));
        // The used one is in the global arena now, which frees its block.
        assert_eq!(g.deallocate(used, 2 * MIN), Ok(true));
        assert!(g.is_fully_coalesced());
    }
}
