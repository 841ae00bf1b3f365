//! [`LocalArena`]: the superblocks one thread (per-thread default stream) or one stream
//! allocates small blocks from.

use std::fmt;

use super::fit_tree::FitTree;
use super::size_class::align_up;
use super::{ArenaError, ArenaStats, Block, GlobalArena, RejectedSuperblock, Superblock};

/// A per-thread or per-stream arena (RMM's `arena`): superblocks borrowed from the
/// [`GlobalArena`], sub-allocated by address-ordered first fit.
///
/// The global arena is passed to the calls that need it instead of being referenced, so the
/// resource decides the locking: [`allocate_local`](Self::allocate_local) and
/// [`deallocate`](Self::deallocate) touch only this arena (the fast path needs only this arena's
/// lock), and only growing ([`GlobalArena::acquire`] + [`adopt`](Self::adopt), or
/// [`allocate`](Self::allocate) which does all three), [`clean`](Self::clean) and
/// [`defragment`](Self::defragment) need the global arena too.
///
/// Costs (s = superblocks here; each superblock's own work is `O(log)` in its blocks):
/// [`allocate_local`](Self::allocate_local), [`deallocate`](Self::deallocate),
/// [`contains`](Self::contains) and [`adopt`](Self::adopt) are `O(log s)`;
/// [`clean`](Self::clean) is `O(s log n)` and [`defragment`](Self::defragment) `O(s + e log n)`
/// (e = empty superblocks, n = superblocks of the global arena).
///
/// Dropping a local arena that still holds superblocks loses them for the global arena (they
/// stay recorded as lent): call [`clean`](Self::clean) first, as RMM's `arena_cleaner` does when
/// a thread exits. A warning is logged if this is forgotten.
#[doc(alias = "rmm::mr::detail::arena::arena")]
#[derive(Default)]
pub struct LocalArena {
    /// Superblocks by address, indexed by their largest free block.
    superblocks: FitTree<Superblock>,
}

impl LocalArena {
    /// An arena holding no superblocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocate `size` bytes (rounded up to 256), growing from `global` when needed (RMM's
    /// `arena::allocate_sync`).
    ///
    /// [Large](GlobalArena::handles) requests go to [`GlobalArena::allocate_large`]. Small ones
    /// take the first fit over this arena's superblocks; failing that, a superblock is acquired
    /// from `global` and the block is taken from it. `None` when nothing fits anywhere (the
    /// resource then cleans every arena and retries once) or `size` is 0.
    pub fn allocate(&mut self, size: usize, global: &mut GlobalArena) -> Option<u64> {
        if GlobalArena::handles(size) {
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
                let _ = global.release(rejected.superblock);
                None
            }
        }
    }

    /// Allocate `size` bytes (rounded up to 256) from this arena's superblocks only: the first
    /// superblock (address order) whose largest free block fits, then the first fit inside it.
    /// `None` when none fits, when `size` is 0, or when it is [large](GlobalArena::handles).
    pub fn allocate_local(&mut self, size: usize) -> Option<u64> {
        let size = align_up(size).filter(|&s| s > 0 && !GlobalArena::handles(s))?;
        let key = self.superblocks.first_fit(size)?.addr();
        self.superblocks
            .update(key, |sb| sb.allocate(size))
            .flatten()
            .map(|block| block.addr)
    }

    /// Take a superblock (normally just acquired from the global arena) into this arena.
    ///
    /// Refused with [`ArenaError::ForeignSuperblock`] (and handed back) if it overlaps one this
    /// arena already holds.
    pub fn adopt(&mut self, superblock: Superblock) -> Result<(), RejectedSuperblock> {
        let overlaps_prev = self
            .superblocks
            .floor(superblock.addr())
            .is_some_and(|prev| prev.span().overlaps(&superblock.span()));
        let overlaps_next = self
            .superblocks
            .ceiling(superblock.addr())
            .is_some_and(|next| next.span().overlaps(&superblock.span()));
        if overlaps_prev || overlaps_next {
            return Err(RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: superblock.addr(),
                    size: superblock.size(),
                },
                superblock,
            });
        }
        self.superblocks
            .insert(superblock)
            .map_err(|superblock| RejectedSuperblock {
                error: ArenaError::ForeignSuperblock {
                    addr: superblock.addr(),
                    size: superblock.size(),
                },
                superblock,
            })
    }

    /// Free a block if one of this arena's superblocks contains `addr` (RMM's
    /// `arena::deallocate_sync`); works for any size, since a superblock holding a large block
    /// can be lent whole.
    ///
    /// `Ok(true)`: freed here (an emptied superblock stays until [`clean`](Self::clean) or
    /// [`defragment`](Self::defragment)). `Ok(false)`: no superblock here contains `addr`; the
    /// resource searches the other arenas and the global arena. `Err`: the superblock holding
    /// `addr` is here, so no other arena can own it, and the free is wrong
    /// ([`ArenaError::DoubleFree`], [`ArenaError::SizeMismatch`], [`ArenaError::NotFound`]);
    /// nothing changed.
    pub fn deallocate(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let Some(key) = self.key_containing(addr) else {
            return Ok(false);
        };
        match self
            .superblocks
            .update(key, |sb| sb.deallocate(Block::new(addr, size)))
        {
            Some(result) => result.map(|()| true),
            None => Ok(false),
        }
    }

    fn key_containing(&self, addr: u64) -> Option<u64> {
        self.superblocks
            .floor(addr)
            .filter(|sb| sb.contains_addr(addr))
            .map(Superblock::addr)
    }

    /// Whether one of this arena's superblocks contains `addr` (`O(log s)`).
    pub fn contains(&self, addr: u64) -> bool {
        self.key_containing(addr).is_some()
    }

    /// Return every superblock, empty or not, to `global` (RMM's `arena::clean`, used by
    /// defragmentation and at thread exit). Returns how many were returned.
    ///
    /// A superblock `global` refuses (it was not lent by that global arena) stays here and the
    /// first such error is returned after trying all of them.
    pub fn clean(&mut self, global: &mut GlobalArena) -> Result<usize, ArenaError> {
        let all = self.superblocks.take_all();
        self.release_to(global, all)
    }

    /// Return only the empty superblocks to `global` (RMM's `arena::defragment`). Returns how
    /// many were returned; refusals are handled as in [`clean`](Self::clean).
    pub fn defragment(&mut self, global: &mut GlobalArena) -> Result<usize, ArenaError> {
        let empty_keys: Vec<u64> = self
            .superblocks
            .iter()
            .filter(|sb| sb.is_empty())
            .map(Superblock::addr)
            .collect();
        let empties: Vec<Superblock> = empty_keys
            .into_iter()
            .filter_map(|key| self.superblocks.remove(key))
            .collect();
        self.release_to(global, empties)
    }

    fn release_to(
        &mut self,
        global: &mut GlobalArena,
        superblocks: Vec<Superblock>,
    ) -> Result<usize, ArenaError> {
        let mut released = 0;
        let mut first_error = None;
        for sb in superblocks {
            match global.release(sb) {
                Ok(()) => released += 1,
                Err(rejected) => {
                    first_error.get_or_insert(rejected.error);
                    let kept = self.superblocks.insert(rejected.superblock).is_ok();
                    debug_assert!(kept);
                }
            }
        }
        match first_error {
            None => Ok(released),
            Some(error) => Err(error),
        }
    }

    /// Number of superblocks held.
    pub fn superblock_count(&self) -> usize {
        self.superblocks.len()
    }

    /// The superblocks held, in address order.
    pub fn superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        self.superblocks.iter()
    }

    /// Size of the largest free block in this arena (`O(1)`).
    pub fn max_free_size(&self) -> usize {
        self.superblocks.max_fit()
    }

    /// Byte accounting over this arena's superblocks (`O(s)`).
    pub fn stats(&self) -> ArenaStats {
        ArenaStats::from_superblocks(self.superblocks.iter())
    }
}

impl fmt::Debug for LocalArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalArena")
            .field("superblocks", &self.superblocks.len())
            .field("max_free", &self.max_free_size())
            .finish()
    }
}

impl Drop for LocalArena {
    fn drop(&mut self) {
        if !self.superblocks.is_empty() {
            log::warn!(
                "arena: local arena dropped while holding {} superblock(s); call clean() first",
                self.superblocks.len()
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
            Some(SuperblockLocation::Global(Block::new(A3, MIN)))
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
    /// thread arena whose superblock moved thread arena -> global -> stream arena can still be
    /// freed (through the cross-arena search).
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
        let ptr1 = alloc(&mut default_stream, &mut g, MIN);
        assert_eq!(ptr1, A4);
        let ptr2 = alloc(&mut default_stream, &mut g, 32 * KIB);
        // The thread's old superblock now belongs to the default-stream arena.
        assert_eq!(g.superblock_count(), 0);
        assert!(default_stream.contains(thread_ptr));
        assert_eq!(ptr2, thread_ptr + 256);

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
}
