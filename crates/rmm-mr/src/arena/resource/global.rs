//! [`GlobalState`]: what the resource's global lock protects: the global arena, which local arena
//! each lent superblock went to, the live large allocations and the addresses of the frees
//! still waiting for their stream; and [`PendingQueue`], those frees themselves (behind their
//! own lock, so that their events are queried outside the global lock).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use rmm_stream::CudaEvent;

use super::{lock, ArenaCell, ArenaSlot, EventPool};
use crate::arena::{ArenaError, Block, GlobalArena, Superblock};
use crate::util::cross_thread::{needs_legacy_order, Origin};

/// Hashing for maps keyed by device address (SipHash, the default, costs more than the lookup
/// itself here; addresses are not attacker-chosen keys): the SplitMix64 finaliser.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AddrHash;

impl BuildHasher for AddrHash {
    type Hasher = AddrHasher;

    fn build_hasher(&self) -> AddrHasher {
        AddrHasher(0)
    }
}

/// The hasher of [`AddrHash`].
#[derive(Debug, Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x100_0000_01B3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(32) ^ n;
    }
}

/// A map keyed by device address.
pub(super) type AddrMap<V> = HashMap<u64, V, AddrHash>;

/// A free that is not yet visible to the allocator: the block stays allocated in the
/// bookkeeping until `event` (recorded on the freeing stream) completes.
#[derive(Debug)]
pub(super) struct PendingFree {
    pub(super) addr: u64,
    pub(super) size: usize,
    pub(super) event: CudaEvent,
}

/// Frees waiting for their stream, oldest first, behind a lock of their own (a leaf: nothing is
/// acquired while it is held; it may be taken while the global lock is held). Entries are taken
/// out to query their events without any lock, and put back when not complete yet.
#[derive(Debug, Default)]
pub(super) struct PendingQueue {
    queue: Mutex<VecDeque<PendingFree>>,
}

impl PendingQueue {
    pub(super) fn push(&self, entry: PendingFree) {
        lock(&self.queue).push_back(entry);
    }

    /// Takes out the completed frees among the oldest `limit` (querying the events without
    /// holding any lock); the others go back at the end of the queue.
    pub(super) fn take_completed(&self, limit: usize) -> Vec<PendingFree> {
        let taken: Vec<PendingFree> = {
            let mut queue = lock(&self.queue);
            let n = queue.len().min(limit);
            queue.drain(..n).collect()
        };
        if taken.is_empty() {
            return taken;
        }
        let (done, not_yet): (Vec<_>, Vec<_>) = taken
            .into_iter()
            .partition(|p| matches!(p.event.is_complete(), Ok(true)));
        if !not_yet.is_empty() {
            lock(&self.queue).extend(not_yet);
        }
        done
    }

    /// Takes out every entry, complete or not.
    pub(super) fn take_all(&self) -> Vec<PendingFree> {
        lock(&self.queue).drain(..).collect()
    }

    /// Whether the queue's lock is held now, by any thread (tests).
    #[cfg(test)]
    pub(super) fn is_locked(&self) -> bool {
        self.queue.try_lock().is_err()
    }

    /// Number of entries and their bytes.
    pub(super) fn stats(&self) -> (usize, usize) {
        let queue = lock(&self.queue);
        (queue.len(), queue.iter().map(|p| p.size).sum())
    }
}

/// Everything behind the global lock.
#[derive(Debug)]
pub(super) struct GlobalState {
    pub(super) arena: GlobalArena,
    /// Lent superblock address -> the arena holding it (RMM searches every arena instead).
    pub(super) owners: AddrMap<Arc<ArenaCell>>,
    /// Live large (> 1 MiB) allocations made by the global arena whose superblock it still
    /// holds: address -> rounded size (O(1) checks of large frees) and who allocated it (for
    /// frees from another thread's per-thread default stream).
    pub(super) large_live: AddrMap<(usize, Origin)>,
    /// Addresses of the frees waiting for their stream (a second free of one is a double free).
    pub(super) pending_addrs: HashSet<u64, AddrHash>,
    /// Empty superblocks a reclaim took out of their arenas and holds until every stream has
    /// finished with them (their spans; still recorded as lent, with no owner).
    pub(super) in_transit: InTransit,
}

/// The spans of the empty superblocks on their way back to the global arena
/// ([`GlobalState::in_transit`]), by address: each is added, looked up and removed in `O(1)`
/// under the global lock (a reclaim gives back thousands at once).
#[derive(Debug, Default)]
pub(super) struct InTransit(AddrMap<usize>);

impl InTransit {
    pub(super) fn insert(&mut self, span: Block) {
        self.0.insert(span.addr, span.size);
    }

    /// Removes `span` if it is in transit.
    pub(super) fn remove(&mut self, span: Block) {
        if self.contains(span) {
            self.0.remove(&span.addr);
        }
    }

    pub(super) fn contains(&self, span: Block) -> bool {
        self.0.get(&span.addr) == Some(&span.size)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl GlobalState {
    pub(super) fn new(arena: GlobalArena) -> Self {
        Self {
            arena,
            owners: AddrMap::default(),
            large_live: AddrMap::default(),
            pending_addrs: HashSet::default(),
            in_transit: InTransit::default(),
        }
    }

    /// Queues a free until `event` completes.
    pub(super) fn push_pending(
        &mut self,
        queue: &PendingQueue,
        addr: u64,
        size: usize,
        event: CudaEvent,
    ) {
        self.pending_addrs.insert(addr);
        queue.push(PendingFree { addr, size, event });
    }

    /// Releases completed pending frees (from [`PendingQueue::take_completed`], or any after a
    /// device synchronization) into the global arena, which holds every block whose free is
    /// pending (loans are fresh superblocks, and a pending block is no longer a live large
    /// allocation a stream could keep). Returns how many were released.
    pub(super) fn release_completed(
        &mut self,
        entries: Vec<PendingFree>,
        events: &EventPool,
    ) -> usize {
        let released = entries.len();
        for entry in entries {
            match self.arena.deallocate(entry.addr, entry.size) {
                Ok(true) => {}
                Ok(false) => log::error!(
                    "arena: pending free of {:#x} ({} B) is not in the global arena",
                    entry.addr,
                    entry.size
                ),
                Err(e) => log::error!("arena: pending free failed: {e}"),
            }
            self.pending_addrs.remove(&entry.addr);
            events.give(entry.event);
        }
        released
    }

    /// Lends `arena` a fresh superblock for `size` bytes and records where it went.
    pub(super) fn lend(
        &mut self,
        size: usize,
        cell: &Arc<ArenaCell>,
        slot: &mut ArenaSlot,
    ) -> bool {
        let Some(superblock) = self.arena.acquire(size) else {
            return false;
        };
        debug_assert!(superblock.is_empty(), "loans are fresh superblocks");
        let addr = superblock.addr();
        match slot.arena.adopt(superblock) {
            Ok(()) => {
                self.owners.insert(addr, Arc::clone(cell));
                true
            }
            Err(rejected) => {
                log::error!("arena: {rejected}");
                if let Err(lost) = self.arena.release(*rejected.superblock) {
                    log::error!("arena: superblock lost: {lost}");
                }
                false
            }
        }
    }

    /// Moves every superblock of `slot` back to the global arena (RMM's `arena::clean`).
    pub(super) fn take_back(&mut self, slot: &mut ArenaSlot) {
        let lent: Vec<u64> = slot.arena.superblocks().map(Superblock::addr).collect();
        if let Err(e) = slot.arena.clean(&mut self.arena) {
            log::error!("arena: cleaning a local arena: {e}");
        }
        self.forget_owners(slot, lent);
    }

    /// Moves the empty superblocks `slot` kept for large requests back to the global arena.
    #[cfg(test)]
    pub(super) fn take_back_kept(&mut self, slot: &mut ArenaSlot) {
        let lent: Vec<u64> = slot.arena.superblocks().map(Superblock::addr).collect();
        if let Err(e) = slot.arena.release_empty_kept(&mut self.arena) {
            log::error!("arena: returning kept superblocks: {e}");
        }
        self.forget_owners(slot, lent);
    }

    fn forget_owners(&mut self, slot: &ArenaSlot, lent: Vec<u64>) {
        for addr in lent {
            if !slot.arena.contains(addr) {
                self.owners.remove(&addr);
            }
        }
    }

    /// A large free on the stream of `slot`: when `(addr, size)` is a live large allocation,
    /// the only block of its superblock, and that superblock fits in the `room` the arena may
    /// still keep, the block is freed and the superblock, now empty, goes to the arena (which
    /// reuses it for its stream's large requests at once: work queued later on the freeing
    /// stream runs after the work that used the block). Returns whether it did. A block
    /// another thread allocated on its per-thread default stream, freed on this thread's, is
    /// not kept: the freeing stream does not wait for the allocating thread's work.
    pub(super) fn keep(
        &mut self,
        addr: u64,
        size: usize,
        room: usize,
        cell: &Arc<ArenaCell>,
        slot: &mut ArenaSlot,
    ) -> bool {
        match self.large_live.get(&addr) {
            Some(&(live, origin))
                if live == size && !needs_legacy_order(cell.key().thread(), origin, false) => {}
            _ => return false,
        }
        let Some(superblock) = self.arena.reclaim(addr, size, room) else {
            return false;
        };
        self.large_live.remove(&addr);
        let span = superblock.addr();
        match slot.arena.keep(superblock) {
            Ok(()) => {
                self.owners.insert(span, Arc::clone(cell));
            }
            Err(rejected) => {
                // Cannot happen (the arena held nothing there): the block is free, the
                // superblock empty; give it back.
                log::error!("arena: {rejected}");
                if let Err(lost) = self.arena.release(*rejected.superblock) {
                    log::error!("arena: superblock lost: {lost}");
                }
            }
        }
        true
    }

    /// Checks that `[addr, addr + size)` is a live block of a superblock held by the global
    /// arena, without freeing it.
    pub(super) fn check_live_in_global(&self, addr: u64, size: usize) -> Result<(), ArenaError> {
        match self.arena.check_deallocate(addr, size)? {
            true => Ok(()),
            false => Err(ArenaError::NotFound { addr, size }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ArenaKey;
    use super::*;
    use rmm_stream::CudaStreamView;

    const MIB: usize = 1 << 20;
    const BASE: u64 = 1 << 40;

    /// A superblock returned partly used by a cleaned arena, with a live block whose free is
    /// queued: the blocks stay in the global arena, and a loan to another arena is a fresh
    /// superblock beside them, so that arena can never take a second free of the pending block
    /// for the first (what a GPU run of the resource's model test found when loans were
    /// partly used superblocks).
    #[test]
    fn a_block_whose_free_is_pending_is_never_lent() {
        let mut global = GlobalState::new(GlobalArena::new(BASE, 4 * MIB).unwrap());
        let first = Arc::new(ArenaCell::new(ArenaKey::Legacy, CudaStreamView::legacy()));
        let (block, other) = {
            let mut slot = first.lock();
            assert!(global.lend(256, &first, &mut slot));
            let block = slot.arena.allocate_local(256).unwrap();
            let other = slot.arena.allocate_local(512).unwrap();
            global.take_back(&mut slot);
            assert!(global.owners.is_empty());
            (block, other)
        };
        // The block was freed on another stream: its free waits in the queue.
        global.pending_addrs.insert(block);

        let second = Arc::new(ArenaCell::new(
            ArenaKey::Stream(7),
            CudaStreamView::legacy(),
        ));
        let mut slot = second.lock();
        for _ in 0..3 {
            assert!(global.lend(256, &second, &mut slot));
        }
        assert!(
            !global.lend(256, &second, &mut slot),
            "the third loan took the rest"
        );
        assert!(!slot.arena.contains(block) && !slot.arena.contains(other));
        assert_eq!(slot.arena.deallocate(block, 256), Ok(false));
        assert_eq!(global.arena.check_deallocate(block, 256), Ok(true));
        assert_eq!(global.owners.len(), 3);
        // The queue's release frees it where it is.
        assert_eq!(global.arena.deallocate(block, 256), Ok(true));
        assert_eq!(global.arena.deallocate(other, 512), Ok(true));
        global.take_back(&mut slot);
        assert!(global.owners.is_empty());
        assert!(global.arena.is_fully_coalesced());
    }
}
