//! The stream-ordered core shared by the pool and the fixed-size resource (RMM's
//! `stream_ordered_memory_resource`, the CRTP base of both), generic over the free-list type
//! ([`FreeBlocks`]).
//!
//! `allocate(stream, size)` takes a best fit from the stream's own list, else steals a block from
//! another stream's list (after making this stream wait for that list's event), else merges other
//! lists into this one, else grows; every block handed out is recorded in the free-list type's
//! resource-wide record, which `deallocate` checks (unknown pointers, double frees, size
//! mismatches). Lock order: chunk set → registry → one list → the record's inner locks; no thread
//! holds two list locks. A failed call leaves the core as it was. The algorithm, the lists, the
//! locks and the failure rules in full: `docs/internals/stream-ordered.md`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DeviceGuard, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::append_only::AppendOnlyVec;
use crate::stream_ordered::stream_lists::{
    cached_list_index, device_synchronize, remember_list_index, StreamKey, StreamList,
};
use crate::util::cross_thread::{needs_legacy_order, Origin};

/// A free-list type the stream-ordered core can drive (RMM's `free_list` / the derived
/// resource's `allocate_from_block` and `free_block`). Implementations are pure bookkeeping.
pub(crate) trait FreeBlocks: Clone + Send + 'static {
    /// What a handed-out block must remember to be freed again (the pool: whether it starts an
    /// upstream chunk).
    type Tag: Copy + Send + Sync + fmt::Debug + 'static;

    /// Removes a block for a request of `size` bytes (a multiple of 256 the resource accepts)
    /// and returns its address; any remainder stays in the list. `None` when nothing fits.
    fn take(&mut self, size: usize) -> Option<(u64, Self::Tag)>;

    /// Whether [`take`](Self::take) would find a block for `size` bytes (the list is left as
    /// it is).
    fn fits(&self, size: usize) -> bool;

    /// Returns a block handed out by [`take`](Self::take) with this `size` and `tag`. On error
    /// the list is unchanged.
    fn put(&mut self, addr: u64, size: usize, tag: Self::Tag) -> Result<(), String>;

    /// Adds a whole, fresh upstream chunk. On error the list is unchanged.
    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String>;

    /// Moves every block of `other` into `self`. On error nothing is lost: every block is in
    /// one of the two lists.
    fn absorb(&mut self, other: &mut Self) -> Result<(), String>;

    /// Whether the list holds no block.
    fn is_empty(&self) -> bool;

    /// Whether `addr` lies in a free block of this list (to tell a double free from an unknown
    /// pointer).
    fn holds(&self, addr: u64) -> bool;

    /// If the chunk `[addr, addr + size)` is one wholly free block here, removes it.
    fn remove_chunk(&mut self, addr: u64, size: usize) -> bool;

    /// For a free-list type whose chunks coalesce with one another (the VMM pool's, whose
    /// chunks are mapped one after the other into one address range): the bytes of this list's
    /// free block that ends where the resource's memory ends (0 if it holds none), which a chunk
    /// added right after merges with. `None` (the default): chunks never merge, so every new
    /// chunk must serve the request alone.
    fn extendable_tail(&self) -> Option<usize> {
        None
    }

    /// Records in the resource-wide record (shared by every list of the resource) that the
    /// block at `addr`, just taken from one of its lists for a request of `size` bytes, is
    /// handed out, allocated by `origin` (the cross-thread rule, [`crate::util::cross_thread`]).
    /// An error means it already was (an internal inconsistency); the record is then unchanged.
    /// Also puts back what [`take_back`](Self::take_back) removed when the block cannot return
    /// to a list.
    fn hand_out(
        &mut self,
        addr: u64,
        size: usize,
        tag: Self::Tag,
        origin: Origin,
    ) -> Result<(), String>;

    /// Checks in the resource-wide record that the block at `addr` is handed out with `size`
    /// bytes (rounded), forgets it and returns its tag and origin. Of two concurrent calls for
    /// one block, at most one succeeds. On error nothing changes, and the error says why the
    /// free is wrong, or is `None` for "not handed out" (the core then asks the lists whether
    /// `addr` is free: a double free, or else an unknown pointer). A `size` of `usize::MAX`
    /// (never a recorded size) only classifies.
    fn take_back(
        &mut self,
        addr: u64,
        size: usize,
    ) -> Result<(Self::Tag, Origin), Option<InvalidFree>>;

    /// Number of blocks handed out by the resource and the sum of their sizes.
    fn handed_out(&self) -> (usize, usize);

    /// The free blocks of this list, `(address, size)`, in the list's order (tests).
    #[cfg(test)]
    fn free_blocks(&self) -> Vec<(u64, usize)>;
}

/// Everything a core keeps, for tests that check a failed call changed nothing.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CoreState {
    /// The free blocks of every list that holds some, by stream key, legacy list first.
    pub(crate) lists: Vec<(StreamKey, Vec<(u64, usize)>)>,
    /// The upstream chunks, by address.
    pub(crate) chunks: Vec<(u64, usize)>,
    /// The sum of the chunks.
    pub(crate) pool_size: usize,
    /// Blocks handed out and their bytes.
    pub(crate) handed_out: (usize, usize),
}

#[cfg(test)]
impl CoreState {
    /// The free memory as merged address ranges `[start, end)`, whichever lists hold it.
    pub(crate) fn free_ranges(&self) -> Vec<(u64, u64)> {
        let mut blocks: Vec<(u64, u64)> = self
            .lists
            .iter()
            .flat_map(|(_, blocks)| blocks.iter().map(|&(a, s)| (a, a + s as u64)))
            .collect();
        blocks.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (start, end) in blocks {
            match merged.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// What a failed call must leave as it was: the free memory (a failed allocation may have
    /// merged stream lists, as RMM's does, so not which list holds it), the chunks, the pool
    /// size and the handed-out blocks.
    pub(crate) fn memory(&self) -> CoreMemory {
        CoreMemory {
            free: self.free_ranges(),
            chunks: self.chunks.clone(),
            pool_size: self.pool_size,
            handed_out: self.handed_out,
        }
    }
}

/// [`CoreState::memory`].
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CoreMemory {
    /// [`CoreState::free_ranges`].
    pub(crate) free: Vec<(u64, u64)>,
    /// The upstream chunks, by address.
    pub(crate) chunks: Vec<(u64, usize)>,
    /// The sum of the chunks.
    pub(crate) pool_size: usize,
    /// Blocks handed out and their bytes.
    pub(crate) handed_out: (usize, usize),
}

/// Which stream keys have lists, and who used the resource first.
#[derive(Default)]
struct Registry {
    /// Index in `StreamOrdered::lists` of every key but the legacy one.
    by_key: HashMap<StreamKey, usize>,
    /// The list of the first key a caller used, while it is the only one, when that list is
    /// not the legacy one.
    first_user: Option<usize>,
    /// Number of keys callers have used.
    users: usize,
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// Treats "no driver / no device" as success: without a device no stream work can be pending
/// (this is what lets host-memory tests run the release paths on machines without a GPU).
fn settle(r: MrResult<()>) -> MrResult<()> {
    match r {
        Err(e) if e.is_no_device() => Ok(()),
        other => other,
    }
}

/// Puts blocks moved out of `list` (for a merge or a reclaim that did not happen) back in it.
fn restore<L: FreeBlocks>(list: &StreamList<L>, mut blocks: L) {
    if let Err(e) = list.lock().blocks.absorb(&mut blocks) {
        log::error!("rmm: free blocks lost while moving them between stream lists: {e}");
    }
}

/// The error of a free whose block cannot return to a free list (it overlaps a free block:
/// an inconsistency), after recording the block as handed out again: it is still allocated, and
/// neither lost nor free twice.
#[cold]
fn kept_allocated<L: FreeBlocks>(
    blocks: &mut L,
    ptr: DevicePtr,
    size: usize,
    tag: L::Tag,
    origin: Origin,
    why: &str,
) -> MrError {
    let addr = ptr.addr();
    if let Err(e) = blocks.hand_out(addr, size, tag, origin) {
        log::error!("rmm: block {addr:#x} is in no free list and not recorded: {e}");
    }
    log::error!("rmm: block {addr:#x} cannot return to its free list: {why}");
    MrError::invalid_argument(format!(
        "inconsistent stream-ordered resource: block {addr:#x} ({size} bytes) cannot return to \
         its free list ({why}); it stays allocated"
    ))
}

/// The stream-ordered core: per-stream free lists, the lazy event rule, the record of
/// handed-out blocks (inside the lists' type) and the set of upstream chunks. See the
/// [module documentation](self).
pub(crate) struct StreamOrdered<L: FreeBlocks> {
    /// Process-unique number of this core (keys the per-thread list cache).
    id: u64,
    /// An empty list (cloned for every new stream; it shares the record).
    empty: L,
    legacy: StreamList<L>,
    /// Every list but the legacy one, in creation order (the order thieves visit them, after
    /// the legacy list).
    lists: AppendOnlyVec<StreamList<L>>,
    /// Whether a caller used the legacy stream (the legacy list exists from construction, to
    /// hold the initial chunk, without counting as a user).
    legacy_used: AtomicBool,
    /// Set when a second key first appears: from then on frees on ordinary streams record.
    eager: AtomicBool,
    registry: Mutex<Registry>,
    /// Upstream chunks by address (the growth lock).
    chunks: Mutex<BTreeMap<u64, usize>>,
    /// Sum of the chunk sizes.
    pool_size: AtomicUsize,
    /// Whether a block was ever handed out (then drop synchronizes the device first).
    used: AtomicBool,
    /// The device current at construction, if there is one.
    device: Option<DeviceId>,
}

impl<L: FreeBlocks> StreamOrdered<L> {
    /// A core without chunks; `empty` is the list every stream starts with (and the handle of
    /// the record every list shares).
    pub(crate) fn new(empty: L) -> Self {
        Self {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            legacy: StreamList::new(StreamKey::Legacy, empty.clone()),
            lists: AppendOnlyVec::new(),
            legacy_used: AtomicBool::new(false),
            eager: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            empty,
            chunks: Mutex::new(BTreeMap::new()),
            pool_size: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            device: rmm_sys::current_device().ok(),
        }
    }

    /// Adds the constructor's chunk to the legacy list (RMM obtains it on the legacy stream).
    pub(crate) fn add_initial_chunk(&self, ptr: DevicePtr, size: usize) -> MrResult<()> {
        self.lock_chunks().insert(ptr.addr(), size);
        self.pool_size.fetch_add(size, Ordering::Relaxed);
        self.legacy
            .lock()
            .blocks
            .add_chunk(ptr.addr(), size)
            .map_err(|e| MrError::bad_alloc(format!("initial chunk rejected: {e}")))
    }

    /// Bytes obtained from the upstream and not given back.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool_size.load(Ordering::Relaxed)
    }

    /// Number of blocks handed out and not freed.
    pub(crate) fn outstanding(&self) -> usize {
        self.empty.handed_out().0
    }

    /// Whether frees on ordinary streams record events (a second stream key was seen).
    pub(crate) fn is_eager(&self) -> bool {
        self.eager.load(Ordering::Acquire)
    }

    /// Number of stream lists (the legacy list included).
    pub(crate) fn list_count(&self) -> usize {
        1 + self.lists.len()
    }

    fn lock_chunks(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every list, the legacy one first, in creation order (for the slow paths).
    fn lists(&self) -> impl Iterator<Item = &StreamList<L>> + '_ {
        std::iter::once(&self.legacy).chain(self.lists.iter())
    }

    /// The list of `stream`, registering its key on first use.
    #[inline]
    fn list_for(&self, stream: CudaStreamView<'_>) -> MrResult<&StreamList<L>> {
        let key = StreamKey::of(stream)?;
        if key == StreamKey::Legacy {
            if !self.legacy_used.load(Ordering::Acquire) {
                self.register(key)?;
            }
            return Ok(&self.legacy);
        }
        if let Some(list) = cached_list_index(self.id, key).and_then(|i| self.lists.get(i)) {
            return Ok(list);
        }
        self.register(key)
    }

    /// Finds or creates the list of `key`, counts the key as used (the second key turns the
    /// pool eager) and remembers the list in this thread's cache.
    #[cold]
    fn register(&self, key: StreamKey) -> MrResult<&StreamList<L>> {
        let mut reg = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let (index, first_use) = if key == StreamKey::Legacy {
            (None, !self.legacy_used.load(Ordering::Relaxed))
        } else if let Some(&i) = reg.by_key.get(&key) {
            (Some(i), false)
        } else {
            let i = self.lists.push(StreamList::new(key, self.empty.clone()));
            reg.by_key.insert(key, i);
            (Some(i), true)
        };
        let list = match index {
            None => &self.legacy,
            Some(i) => self
                .lists
                .get(i)
                .ok_or_else(|| MrError::bad_alloc(format!("stream list {i} is missing")))?,
        };
        if first_use {
            reg.users += 1;
            if reg.users == 1 {
                reg.first_user = index;
            } else if reg.users == 2 {
                // From now on blocks can change streams. Frees on ordinary streams record
                // (checked under each list's lock, so a free that already holds the first
                // list's lock finishes before the mark below, and one that comes later sees
                // `eager`). Blocks the first list got without an event count as unrecorded:
                // a thief asks its owner to record, or synchronizes the device.
                self.eager.store(true, Ordering::SeqCst);
                if let Some(first) = reg.first_user.take().and_then(|i| self.lists.get(i)) {
                    if !first.key().is_special() {
                        first.lock().mark_unrecorded();
                    }
                }
            }
            if key == StreamKey::Legacy {
                self.legacy_used.store(true, Ordering::Release);
            }
        }
        drop(reg);
        if let Some(i) = index {
            remember_list_index(self.id, key, i);
        }
        Ok(list)
    }

    /// Allocates a block of `size` bytes (a multiple of 256 the resource accepts) on `stream`;
    /// `expand(pool_size, tail)` obtains a new upstream chunk from `upstream` on `stream`
    /// (called with the growth lock held) and returns it with its size. `tail` is
    /// [`FreeBlocks::extendable_tail`] of this stream's list (0 for chunks that never merge);
    /// only for chunks that merge may `expand` be called again, when the chunk merged with less
    /// than `tail` said (another thread took part of it meanwhile).
    #[inline]
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        size: usize,
        upstream: &dyn DeviceMemoryResource,
        expand: impl FnMut(usize, usize) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<DevicePtr> {
        let own = self.list_for(stream)?;
        let mut st = own.lock();
        st.serve(own.key(), stream);
        let (addr, tag) = match st.blocks.take(size) {
            Some(block) => block,
            None => {
                drop(st);
                let block = self.allocate_slow(own, stream, size, upstream, expand)?;
                st = own.lock();
                block
            }
        };
        let recorded = st.blocks.hand_out(addr, size, tag, own.key().origin());
        drop(st);
        if let Err(e) = recorded {
            // Handing it out again would give two owners the same memory. It stays out of
            // every list; its recorded owner's free returns it.
            log::error!(
                "rmm: stream-ordered resource: free block {addr:#x} is recorded as handed out: {e}"
            );
            return Err(MrError::bad_alloc(format!(
                "inconsistent stream-ordered resource: free block {addr:#x} is recorded as \
                 handed out ({e})"
            )));
        }
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        Ok(DevicePtr::from_raw(addr))
    }

    /// Steals one fitting block from another stream's list (the remainder stays there), else
    /// merges other lists into `own` until one fits; the stream waits on each victim's event.
    fn take_from_others(
        &self,
        own: &StreamList<L>,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let others: Vec<&StreamList<L>> = self.lists().filter(|l| !std::ptr::eq(*l, own)).collect();
        // Steal one block; the remainder stays with its stream.
        for victim in &others {
            let mut st = victim.lock();
            // Nothing is taken before the stream waits, so a failed wait takes nothing.
            if !st.blocks.fits(size) {
                continue;
            }
            // `Ok(false)`: not covered yet (its owner has been asked to record), look elsewhere.
            if !st.prepare_steal(victim.key(), stream)? {
                continue;
            }
            if let Some(block) = st.blocks.take(size) {
                return Ok(Some(block));
            }
        }
        // Merge whole lists into this one, retrying after each.
        for victim in &others {
            let mut moved = {
                let mut st = victim.lock();
                if st.blocks.is_empty() || !st.prepare_steal(victim.key(), stream)? {
                    continue;
                }
                std::mem::replace(&mut st.blocks, self.empty.clone())
            };
            let mut st = own.lock();
            st.publish(own.key(), stream, self.is_eager());
            if let Err(e) = st.blocks.absorb(&mut moved) {
                drop(st);
                restore(victim, moved);
                return Err(MrError::bad_alloc(format!(
                    "inconsistent free lists while merging: {e}"
                )));
            }
            if let Some(block) = st.blocks.take(size) {
                return Ok(Some(block));
            }
        }
        Ok(None)
    }

    #[cold]
    fn allocate_slow(
        &self,
        own: &StreamList<L>,
        stream: CudaStreamView<'_>,
        size: usize,
        upstream: &dyn DeviceMemoryResource,
        mut expand: impl FnMut(usize, usize) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<(u64, L::Tag)> {
        if let Some(block) = self.take_from_others(own, stream, size)? {
            return Ok(block);
        }
        // Grow, holding the growth lock. Threads that missed together queue here; each looks
        // again once it holds the lock, so memory another one just obtained is used instead of
        // growing the pool once per waiting thread (RMM serializes everything on one mutex and
        // so never races here).
        let mut chunks = self.lock_chunks();
        if let Some(block) = own.lock().blocks.take(size) {
            return Ok(block);
        }
        if let Some(block) = self.take_from_others(own, stream, size)? {
            return Ok(block);
        }
        let mut reclaimed = false;
        loop {
            // Chunks that merge grow the free block at the end of the memory by what it lacks.
            let tail = own.lock().blocks.extendable_tail();
            let (ptr, chunk_size) = match expand(self.pool_size(), tail.unwrap_or(0)) {
                Ok(chunk) => chunk,
                Err(e) if e.is_out_of_memory() => {
                    // Rather than report out-of-memory while blocks wait for an owner that may
                    // never record, synchronize once and take them all.
                    match self.reclaim_unrecorded(own, stream, size)? {
                        Some(block) => return Ok(block),
                        // Chunks that merge: the reclaimed blocks grew the free block at the
                        // end, so a smaller chunk may now do; grow again from it, once.
                        None if !reclaimed
                            && tail.is_some()
                            && own.lock().blocks.extendable_tail() != tail =>
                        {
                            reclaimed = true;
                            continue;
                        }
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            chunks.insert(ptr.addr(), chunk_size);
            self.pool_size.fetch_add(chunk_size, Ordering::Relaxed);
            // Publish the chunk in this stream's list before letting other growers in.
            let mut st = own.lock();
            // The chunk may still be in flight on `stream` (a stream-ordered upstream): its rest
            // must not be stolen before that, so the event is recorded after it.
            st.publish(own.key(), stream, self.is_eager());
            if let Err(e) = st.blocks.add_chunk(ptr.addr(), chunk_size) {
                // Not the pool's: the chunk goes back, and the growth never happened.
                drop(st);
                chunks.remove(&ptr.addr());
                self.pool_size.fetch_sub(chunk_size, Ordering::Relaxed);
                drop(chunks);
                // SAFETY: the upstream just handed out this chunk on `stream` for `chunk_size`
                // bytes, and none of it was handed out.
                let r =
                    unsafe { upstream.deallocate(stream, ptr, chunk_size, ALLOCATION_ALIGNMENT) };
                if let Err(e) = r {
                    log::error!("rmm: could not give a refused chunk {ptr} back: {e}");
                }
                return Err(MrError::bad_alloc(format!(
                    "new upstream chunk rejected: {e}"
                )));
            }
            if let Some(block) = st.blocks.take(size) {
                return Ok(block);
            }
            if tail.is_none() {
                return Err(MrError::bad_alloc(format!(
                    "a new upstream chunk of {chunk_size} bytes cannot serve {size} bytes"
                )));
            }
            // The chunk merged with less than `tail` promised: it stays in this list, and the
            // resource grows again (each round maps more, until `expand` runs out of room).
        }
    }

    /// Moves the blocks of every other list that an event does not cover into `own` after one
    /// device synchronization (which covers them all), then takes `size` bytes from `own`.
    /// Called with the growth lock held, when the resource cannot grow.
    #[cold]
    fn reclaim_unrecorded(
        &self,
        own: &StreamList<L>,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let mut moved = Vec::new();
        for victim in self.lists().filter(|l| !std::ptr::eq(*l, own)) {
            let mut st = victim.lock();
            if st.is_uncovered() && !st.blocks.is_empty() {
                moved.push((
                    victim,
                    std::mem::replace(&mut st.blocks, self.empty.clone()),
                ));
            }
        }
        if moved.is_empty() {
            return Ok(None);
        }
        // Every moved block entered its list before this point, so once the device has
        // finished the work queued so far no stream uses it.
        if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
            // Not proven safe: every block goes back where it came from, still unrecorded.
            for (victim, blocks) in moved {
                restore(victim, blocks);
            }
            return Err(e);
        }
        let mut rejected = Vec::new();
        let mut st = own.lock();
        st.publish(own.key(), stream, self.is_eager());
        for (victim, mut blocks) in moved {
            if let Err(e) = st.blocks.absorb(&mut blocks) {
                log::error!("rmm: inconsistent free lists while reclaiming: {e}");
                rejected.push((victim, blocks));
            }
        }
        let block = st.blocks.take(size);
        drop(st);
        for (victim, blocks) in rejected {
            restore(victim, blocks);
        }
        Ok(block)
    }

    /// Returns a block on `stream`.
    ///
    /// # Safety
    /// As [`DeviceMemoryResource::deallocate`].
    #[inline]
    pub(crate) unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let addr = ptr.addr();
        // A size that cannot be rounded matches no record: it is only classified.
        let size = checked_align_up(bytes, ALLOCATION_ALIGNMENT).unwrap_or(usize::MAX);
        let own = self.list_for(stream)?;
        let mut st = own.lock();
        let (tag, origin) = match st.blocks.take_back(addr, size) {
            Ok(taken) => taken,
            Err(kind) => {
                drop(st);
                return Err(self.invalid_free(ptr, bytes, kind));
            }
        };
        if needs_legacy_order(own.key().per_thread(), origin, false) {
            drop(st);
            return self.free_on_legacy(ptr, size, tag, origin);
        }
        if let Err(e) = st.blocks.put(addr, size, tag) {
            return Err(kept_allocated(&mut st.blocks, ptr, size, tag, origin, &e));
        }
        // Under the same lock: no thief sees the block before the event covers it.
        st.publish(own.key(), stream, self.is_eager());
        Ok(())
    }

    /// A free on this thread's per-thread default stream of a block another thread allocated on
    /// its own (see [`crate::util::cross_thread`]): the block goes to the legacy stream's list, not to
    /// this thread's, so no stream reuses it before the work of both threads is done. The
    /// legacy stream's own allocations are ordered after every blocking stream's earlier work
    /// (per-thread default streams included), and a thief of the legacy list waits on an event
    /// recorded on the legacy stream at steal time.
    ///
    /// The block is in no list between the record's take-back and this put (as during a
    /// merge): a concurrent second free of it is then reported as an unknown pointer rather
    /// than a double free, and [`release_unused`](Self::release_unused) sees its chunk as in
    /// use. Both are errors or conservative.
    #[cold]
    #[inline(never)]
    fn free_on_legacy(
        &self,
        ptr: DevicePtr,
        size: usize,
        tag: L::Tag,
        origin: Origin,
    ) -> MrResult<()> {
        if !self.legacy_used.load(Ordering::Acquire) {
            // Counts the legacy stream as a user (it may turn the resource eager); cannot fail
            // for the legacy key.
            if let Err(e) = self.register(StreamKey::Legacy) {
                log::warn!("rmm: registering the legacy stream list failed: {e}");
            }
        }
        let mut st = self.legacy.lock();
        if let Err(e) = st.blocks.put(ptr.addr(), size, tag) {
            return Err(kept_allocated(&mut st.blocks, ptr, size, tag, origin, &e));
        }
        st.publish(StreamKey::Legacy, CudaStreamView::legacy(), self.is_eager());
        Ok(())
    }

    /// Everything the core keeps (tests).
    #[cfg(test)]
    pub(crate) fn state(&self) -> CoreState {
        let lists = self
            .lists()
            .map(|l| (l.key(), l.lock().blocks.free_blocks()))
            .filter(|(_, blocks)| !blocks.is_empty())
            .collect();
        CoreState {
            lists,
            chunks: self.lock_chunks().iter().map(|(&a, &s)| (a, s)).collect(),
            pool_size: self.pool_size(),
            handed_out: self.empty.handed_out(),
        }
    }

    /// The free list holding `addr` as a free block, by key (tests).
    #[cfg(test)]
    pub(crate) fn list_holding(&self, addr: u64) -> Option<StreamKey> {
        self.lists()
            .find(|l| l.lock().blocks.holds(addr))
            .map(StreamList::key)
    }

    /// The error for a free the record rejected; `kind` is the record's verdict, or `None` for
    /// "not handed out" (a double free when a list holds `addr`, else an unknown pointer).
    #[cold]
    fn invalid_free(&self, ptr: DevicePtr, bytes: usize, kind: Option<InvalidFree>) -> MrError {
        let addr = ptr.addr();
        let kind = kind.unwrap_or_else(|| {
            if self.lists().any(|l| l.lock().blocks.holds(addr)) {
                InvalidFree::DoubleFree
            } else {
                InvalidFree::UnknownPointer
            }
        });
        MrError::InvalidFree { ptr, bytes, kind }
    }

    /// Gives every wholly free upstream chunk back to `upstream` (after synchronizing the
    /// device, so no pending work can still use it) and returns the bytes released.
    pub(crate) fn release_unused(&self, upstream: &dyn DeviceMemoryResource) -> MrResult<usize> {
        let mut chunks = self.lock_chunks();
        let mut taken = Vec::new();
        for (&addr, &size) in chunks.iter() {
            if let Some(list) = self
                .lists()
                .find(|l| l.lock().blocks.remove_chunk(addr, size))
            {
                taken.push((list, addr, size));
            }
        }
        if taken.is_empty() {
            return Ok(0);
        }
        if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
            for (list, addr, size) in taken {
                if let Err(e) = list.lock().blocks.add_chunk(addr, size) {
                    log::error!("rmm: could not return chunk {addr:#x} to its list: {e}");
                }
            }
            return Err(e);
        }
        let mut released = 0;
        let mut first_error = None;
        let stream = CudaStreamView::default();
        for (list, addr, size) in taken {
            // SAFETY: the chunk came from `upstream` with this size, is wholly free (no block of
            // it is handed out) and the device was synchronized, so no work uses it.
            let r = unsafe {
                upstream.deallocate(
                    stream,
                    DevicePtr::from_raw(addr),
                    size,
                    ALLOCATION_ALIGNMENT,
                )
            };
            if let Err(e) = r {
                // Still the pool's: back where it was.
                if let Err(e) = list.lock().blocks.add_chunk(addr, size) {
                    log::error!("rmm: could not return chunk {addr:#x} to its list: {e}");
                }
                first_error.get_or_insert(e);
                continue;
            }
            chunks.remove(&addr);
            self.pool_size.fetch_sub(size, Ordering::Relaxed);
            released += size;
        }
        if released > 0 {
            // The chunks are released; waiting for a stream-ordered upstream to finish freeing
            // them can fail without making them the pool's again.
            if let Err(e) = settle(stream.synchronize().map_err(MrError::from)) {
                log::warn!("rmm: synchronizing after releasing {released} bytes failed: {e}");
            }
        }
        first_error.map_or(Ok(released), Err)
    }

    /// Returns every upstream chunk to `upstream`, outstanding allocations or not (called when
    /// the resource is dropped). Synchronizes the device first when a block was ever handed
    /// out, so no pending work uses the memory.
    pub(crate) fn release_all(&self, upstream: &dyn DeviceMemoryResource, name: &str) {
        let (outstanding, bytes) = self.empty.handed_out();
        if outstanding > 0 {
            log::warn!(
                "rmm: {name} dropped with {outstanding} allocations ({bytes} bytes) outstanding; \
                 their memory goes back to the upstream"
            );
        }
        let chunks = std::mem::take(&mut *self.lock_chunks());
        if chunks.is_empty() {
            return;
        }
        let _guard = self.device.and_then(|d| DeviceGuard::new(d).ok());
        if self.used.load(Ordering::Relaxed) {
            if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
                log::error!("rmm: {name} could not synchronize the device before release: {e}");
            }
        }
        for (addr, size) in chunks {
            // SAFETY: the chunk came from `upstream` with this size; the resource is being
            // dropped, and outstanding allocations in it are the caller's documented loss.
            let r = unsafe {
                upstream.deallocate_sync(DevicePtr::from_raw(addr), size, ALLOCATION_ALIGNMENT)
            };
            if let Err(e) = settle(r) {
                log::error!("rmm: {name} could not return chunk {addr:#x} ({size} bytes): {e}");
            }
        }
        self.pool_size.store(0, Ordering::Relaxed);
    }
}

impl<L: FreeBlocks> fmt::Debug for StreamOrdered<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrdered")
            .field("pool_size", &self.pool_size())
            .field("outstanding", &self.outstanding())
            .field("lists", &self.list_count())
            .field("eager", &self.is_eager())
            .finish()
    }
}

#[cfg(test)]
mod fault_tests {
    //! The core's rollback, driven through a model free list whose operations can be made to
    //! fail, and through rmm-sys's simulated driver for the stream calls.

    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use rmm_stream::CudaStreamView;
    use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
    use rmm_sys::DevicePtr;

    use super::{FreeBlocks, Origin, StreamKey, StreamOrdered};
    use crate::error::{InvalidFree, MrError, MrResult};
    use crate::resource::DeviceMemoryResource;
    use crate::testing::HostMockResource;

    /// Every block has this size; requests are at most this.
    const BLOCK: usize = 256;
    /// Chunks hold this many blocks.
    const CHUNK: usize = 4 * BLOCK;

    /// Failures to inject, shared by every list of a core.
    #[derive(Debug, Default)]
    struct Switches {
        puts: AtomicUsize,
        add_chunks: AtomicUsize,
    }

    fn fires(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    }

    /// A FIFO of equal blocks with a shared record, as simple as can be.
    #[derive(Debug, Clone, Default)]
    struct ModelBlocks {
        free: Vec<u64>,
        record: Arc<Mutex<BTreeMap<u64, (usize, u64)>>>,
        switches: Arc<Switches>,
    }

    impl FreeBlocks for ModelBlocks {
        type Tag = ();

        fn take(&mut self, size: usize) -> Option<(u64, ())> {
            (size <= BLOCK && !self.free.is_empty()).then(|| (self.free.remove(0), ()))
        }

        fn fits(&self, size: usize) -> bool {
            size <= BLOCK && !self.free.is_empty()
        }

        fn put(&mut self, addr: u64, _size: usize, _tag: ()) -> Result<(), String> {
            if fires(&self.switches.puts) || self.free.contains(&addr) {
                return Err(format!("{addr:#x} overlaps a free block"));
            }
            self.free.push(addr);
            Ok(())
        }

        fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String> {
            if fires(&self.switches.add_chunks) {
                return Err(format!("chunk {addr:#x} overlaps another"));
            }
            self.free
                .extend((0..size / BLOCK).map(|i| addr + (i * BLOCK) as u64));
            Ok(())
        }

        fn absorb(&mut self, other: &mut Self) -> Result<(), String> {
            self.free.append(&mut other.free);
            Ok(())
        }

        fn is_empty(&self) -> bool {
            self.free.is_empty()
        }

        fn holds(&self, addr: u64) -> bool {
            self.free.contains(&addr)
        }

        fn remove_chunk(&mut self, _addr: u64, _size: usize) -> bool {
            false
        }

        fn hand_out(
            &mut self,
            addr: u64,
            size: usize,
            _: (),
            origin: Origin,
        ) -> Result<(), String> {
            let mut record = self.record.lock().unwrap();
            if record.contains_key(&addr) {
                return Err(format!("{addr:#x} is handed out already"));
            }
            record.insert(addr, (size, origin.to_word()));
            Ok(())
        }

        fn take_back(
            &mut self,
            addr: u64,
            size: usize,
        ) -> Result<((), Origin), Option<InvalidFree>> {
            let mut record = self.record.lock().unwrap();
            match record.get(&addr).copied() {
                Some((s, origin)) if s == size => {
                    record.remove(&addr);
                    Ok(((), Origin::from_word(origin)))
                }
                Some((allocated, _)) => Err(Some(InvalidFree::SizeMismatch { allocated })),
                None => Err(None),
            }
        }

        fn handed_out(&self) -> (usize, usize) {
            let record = self.record.lock().unwrap();
            (record.len(), record.values().map(|&(s, _)| s).sum())
        }

        fn free_blocks(&self) -> Vec<(u64, usize)> {
            self.free.iter().map(|&a| (a, BLOCK)).collect()
        }
    }

    /// A core over a host mock with one chunk in the legacy list.
    fn core() -> (StreamOrdered<ModelBlocks>, HostMockResource, Arc<Switches>) {
        let blocks = ModelBlocks::default();
        let switches = Arc::clone(&blocks.switches);
        let core = StreamOrdered::new(blocks);
        let mock = HostMockResource::new();
        let chunk = mock.allocate(CudaStreamView::legacy(), CHUNK, 256).unwrap();
        core.add_initial_chunk(chunk, CHUNK).unwrap();
        (core, mock, switches)
    }

    fn allocate(
        core: &StreamOrdered<ModelBlocks>,
        mock: &HostMockResource,
        stream: CudaStreamView<'_>,
    ) -> MrResult<DevicePtr> {
        core.allocate(stream, BLOCK, mock, |_, _| {
            mock.allocate(stream, CHUNK, 256).map(|p| (p, CHUNK))
        })
    }

    fn drop_core(core: StreamOrdered<ModelBlocks>, mock: &HostMockResource) {
        core.release_all(mock, "model");
        assert_eq!(mock.live_allocations(), 0, "a chunk leaked");
    }

    #[test]
    fn a_free_whose_block_cannot_return_stays_allocated() {
        let (core, mock, switches) = core();
        let s = CudaStreamView::legacy();
        let a = allocate(&core, &mock, s).unwrap();
        let before = core.state();
        switches.puts.store(1, Ordering::SeqCst);
        // SAFETY: `a` came from `core`; the free fails and `a` stays allocated.
        let e = unsafe { core.deallocate(s, a, BLOCK) }.unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
        assert_eq!(core.state(), before, "the block was lost");
        // SAFETY: `a` is still allocated.
        unsafe { core.deallocate(s, a, BLOCK).unwrap() };
        assert_eq!(core.list_holding(a.addr()), Some(StreamKey::Legacy));
        assert_eq!(core.outstanding(), 0);
        drop_core(core, &mock);
    }

    #[test]
    fn a_cross_thread_free_whose_block_cannot_return_stays_allocated() {
        let (core, mock, switches) = core();
        let pt = CudaStreamView::per_thread();
        // Blocks handed out on this thread's per-thread stream come from its own chunk.
        let a = allocate(&core, &mock, pt).unwrap_or_else(|e| {
            // Stealing from the legacy list records an event: needs a GPU or the simulation.
            let _sim = FaultScope::simulated();
            allocate(&core, &mock, pt).unwrap_or_else(|_| panic!("{e}"))
        });
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let before = core.state();
                switches.puts.store(1, Ordering::SeqCst);
                // SAFETY: `a` came from `core`; freed on another thread's per-thread stream,
                // it goes to the legacy list, which refuses it once.
                let e = unsafe { core.deallocate(pt, a, BLOCK) }.unwrap_err();
                assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
                assert_eq!(core.state(), before);
                // SAFETY: `a` is still allocated.
                unsafe { core.deallocate(pt, a, BLOCK).unwrap() };
            });
        });
        assert_eq!(core.list_holding(a.addr()), Some(StreamKey::Legacy));
        drop_core(core, &mock);
    }

    #[test]
    fn a_block_recorded_as_handed_out_is_not_handed_out_again() {
        let (core, mock, _) = core();
        let s = CudaStreamView::legacy();
        let a = allocate(&core, &mock, s).unwrap();
        // An inconsistency: `a` is free in the list while the record holds it.
        core.legacy.lock().blocks.free.insert(0, a.addr());
        let record_before = core.state().handed_out;
        let e = allocate(&core, &mock, s).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(core.state().handed_out, record_before, "the record changed");
        assert_eq!(core.list_holding(a.addr()), None);
        // Its owner's free returns it, and it is handed out again normally.
        // SAFETY: `a` came from `core`.
        unsafe { core.deallocate(s, a, BLOCK).unwrap() };
        let b = allocate(&core, &mock, s).unwrap();
        assert_ne!(b, a, "FIFO order: the other blocks come first");
        // SAFETY: `b` came from `core`.
        unsafe { core.deallocate(s, b, BLOCK).unwrap() };
        drop_core(core, &mock);
    }

    #[test]
    fn a_chunk_the_list_refuses_goes_back_upstream() {
        let (core, mock, switches) = core();
        let s = CudaStreamView::legacy();
        let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, s).unwrap())
            .collect();
        let before = core.state();
        switches.add_chunks.store(1, Ordering::SeqCst);
        let e = allocate(&core, &mock, s).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(core.state(), before, "the growth stayed");
        assert_eq!(mock.live_allocations(), 1, "the refused chunk leaked");
        let grown = allocate(&core, &mock, s).unwrap();
        assert_eq!(core.pool_size(), 2 * CHUNK);
        for p in held.into_iter().chain([grown]) {
            // SAFETY: every block came from `core`.
            unsafe { core.deallocate(s, p, BLOCK).unwrap() };
        }
        drop_core(core, &mock);
    }

    #[test]
    fn a_steal_whose_wait_fails_takes_nothing() {
        let _sim = FaultScope::simulated();
        let (core, mock, switches) = core();
        let pt = CudaStreamView::per_thread();
        for call in [
            DriverCall::EventCreate,
            DriverCall::EventRecord,
            DriverCall::StreamWait,
        ] {
            let before = core.state();
            fault::inject(Fault::next(call));
            // And the list would refuse a block put back: nothing may be taken at all.
            switches.puts.store(1, Ordering::SeqCst);
            let e = allocate(&core, &mock, pt).unwrap_err();
            assert!(matches!(e, MrError::Cuda(_)), "{call:?}: {e}");
            assert_eq!(fault::injected(call), 1, "{call:?}");
            assert_eq!(core.state(), before, "{call:?}");
            switches.puts.store(0, Ordering::SeqCst);
        }
        // Without faults the steal works, from the legacy list.
        let a = allocate(&core, &mock, pt).unwrap();
        assert_eq!(core.pool_size(), CHUNK, "grew instead of stealing");
        // SAFETY: `a` came from `core`.
        unsafe { core.deallocate(pt, a, BLOCK).unwrap() };
        drop_core(core, &mock);
    }
}
