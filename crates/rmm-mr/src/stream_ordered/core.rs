//! The stream-ordered core shared by the pool and the fixed-size resource (RMM's
//! `stream_ordered_memory_resource`, the CRTP base of both), generic over the free-list type
//! ([`FreeBlocks`]).
//!
//! `allocate(stream, size)` takes a best fit from the stream's own list, else steals a block from
//! another stream's list (after making this stream wait for that list's event), else merges other
//! lists into this one, else grows (by the request only when another list holds a fitting block
//! that no event covers yet: growth under pressure, `pressure.rs`); when it cannot grow, it
//! reclaims the blocks no event covers (one device synchronization), then gives the wholly free
//! chunks back (another) and grows once more. Every block handed out is recorded in the free-list
//! type's resource-wide record, which `deallocate` checks (unknown pointers, double frees, size
//! mismatches). The lists of threads that exited and of streams that were destroyed are retired
//! (their blocks go to the legacy list or to the orphan list, behind their event or a device
//! synchronization) and their slots reused, so the lists stay as many as the live keys. Lock order:
//! chunk set → registry → one list → the record's inner locks; no thread holds two list locks, and
//! nothing synchronizes the device while holding any of them. A failed call leaves the core as it
//! was (but for the wholly free chunks a failing allocation gave back). The algorithm, the lists,
//! the locks and the failure rules in full: `docs/internals/stream-ordered.md`.
//!
//! This file is the fast path, top to bottom: the core's state, finding the caller's own list,
//! `allocate` from it, and `deallocate` into it. What an allocation that missed its own list
//! does lives beside it, one file each, as more `impl` blocks of [`StreamOrdered`]: `steal.rs`
//! (take from other lists, merge them, reclaim what no event covers), `grow.rs` (the growth
//! lock, new chunks, and giving chunks back) and `retire.rs` (registering keys, retiring the
//! lists of dead owners, the orphan list).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
pub(crate) use crate::stream_ordered::free_blocks::{Expand, FreeBlocks};
use crate::stream_ordered::patience::{InFlight, Patience};
pub(crate) use crate::stream_ordered::pressure::GrowthCause;
pub use crate::stream_ordered::slot_table::StreamLists;
use crate::stream_ordered::slot_table::{deaths, Registry};
use crate::stream_ordered::stream_lists::{
    cached_list, new_list, ListGuard, StreamKey, StreamList,
};
use crate::util::append_only::AppendOnlyVec;
use crate::util::cross_thread::{needs_legacy_order, Origin};

mod grow;
mod retire;
mod steal;

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// The error of a free block that the record says is handed out (`e`): handing it out again
/// would give two owners the same memory, so it stays out of every list, and its recorded
/// owner's free returns it.
#[cold]
#[inline(never)]
fn recorded_twice(addr: u64, e: &str) -> MrError {
    log::error!(
        "rmm: stream-ordered resource: free block {addr:#x} is recorded as handed out: {e}"
    );
    MrError::bad_alloc(format!(
        "inconsistent stream-ordered resource: free block {addr:#x} is recorded as handed out \
         ({e})"
    ))
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
    /// The blocks of retired ordinary-stream lists, behind their events or a device
    /// synchronization.
    orphan: StreamList<L>,
    /// The slots of every other list (a retired list's slot is free until a new key takes it),
    /// in creation order (the order thieves visit them, after the legacy list).
    lists: AppendOnlyVec<StreamList<L>>,
    /// Whether a caller used the legacy stream (the legacy list exists from construction, to
    /// hold the initial chunk, without counting as a user).
    legacy_used: AtomicBool,
    /// Set when a second key first appears: from then on frees on ordinary streams record.
    eager: AtomicBool,
    /// The crate's lock (no poisoning), as the lists'.
    registry: crate::sync::Mutex<Registry>,
    /// [`deaths`] when the lists were last looked at for dead owners.
    swept: AtomicU64,
    /// Upstream chunks by address (the growth lock).
    chunks: Mutex<BTreeMap<u64, usize>>,
    /// Sum of the chunk sizes.
    pool_size: AtomicUsize,
    /// Whether a block was ever handed out (then drop synchronizes the device first).
    used: AtomicBool,
    /// The device current at construction, if there is one (made current for every device
    /// synchronization).
    device: Option<DeviceId>,
    in_flight: InFlight,
    /// What a grower waits for: blocks that land while it searches (see
    /// [`patience`](crate::stream_ordered::patience)).
    patience: Patience,
    /// How long growers held the growth lock (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    holds: crate::testing::growth_lock::HoldRecorder,
    /// Requests of at most this many bytes give the wholly free chunks back before they fail
    /// (and grow once more); `None`: never (see
    /// [`release_before_failing`](Self::release_before_failing)).
    release_limit: Option<usize>,
}

impl<L: FreeBlocks> StreamOrdered<L> {
    /// A core without chunks; `empty` is the list every stream starts with (and the handle of
    /// the record every list shares).
    pub(crate) fn new(empty: L) -> Self {
        Self {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            legacy: new_list(Some(StreamKey::Legacy), empty.clone()),
            orphan: new_list(Some(StreamKey::Orphan), empty.clone()),
            lists: AppendOnlyVec::new(),
            legacy_used: AtomicBool::new(false),
            eager: AtomicBool::new(false),
            registry: crate::sync::Mutex::new(Registry::default()),
            swept: AtomicU64::new(deaths()),
            empty,
            chunks: Mutex::new(BTreeMap::new()),
            pool_size: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            device: rmm_sys::current_device().ok(),
            in_flight: InFlight::default(),
            patience: Patience::new(),
            #[cfg(any(test, feature = "testing"))]
            holds: crate::testing::growth_lock::HoldRecorder::new(),
            release_limit: None,
        }
    }

    /// Before an allocation of at most `limit` bytes fails for want of memory, the core gives
    /// its wholly free chunks back (after a device synchronization) and grows once more: for a
    /// resource whose chunks may hold its free memory apart (the pool, up to its maximum). Off
    /// by default: a failed call then changes nothing.
    pub(crate) fn release_before_failing(mut self, limit: Option<usize>) -> Self {
        self.release_limit = limit;
        self
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

    /// Whether `addr` lies in one of the upstream chunks this resource holds.
    pub(crate) fn owns(&self, addr: u64) -> bool {
        self.lock_chunks()
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, &size)| addr - start < size as u64)
    }

    fn lock_chunks(&self) -> MutexGuard<'_, BTreeMap<u64, usize>> {
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every list, the legacy one first, then the slots in creation order, then the orphan list
    /// (for the slow paths).
    fn lists(&self) -> impl Iterator<Item = &StreamList<L>> + '_ {
        std::iter::once(&self.legacy)
            .chain(self.lists.iter())
            .chain(std::iter::once(&self.orphan))
    }

    /// The list of `stream`, locked, with its key, registering the key on first use. The legacy
    /// list is found inline; other streams go through this thread's cache, and a slot found
    /// there that no longer belongs to the key (retired) is looked up again.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn lock_own(
        &self,
        stream: CudaStreamView<'_>,
    ) -> MrResult<(&StreamList<L>, ListGuard<'_, L>, StreamKey)> {
        if StreamKey::is_legacy(stream) && self.legacy_used.load(Ordering::Acquire) {
            return Ok((&self.legacy, self.legacy.lock(), StreamKey::Legacy));
        }
        let key = StreamKey::of(stream)?;
        if key != StreamKey::Legacy {
            if let Some(list) = cached_list(self.id, key) {
                // SAFETY: this thread's cache holds entries of this core (its `id` is
                // process-unique and never reused) only as `register` wrote them: the address
                // of `self.lists`' element for `key`, of type `StreamList<L>`. The elements of
                // an `AppendOnlyVec` never move and are never dropped while it lives, and
                // `&self` keeps it alive for the returned borrow. Whether that slot still
                // belongs to `key` is checked under its lock below.
                let list: &StreamList<L> = unsafe { &*list.cast::<StreamList<L>>() };
                let st = list.lock();
                if st.key() == Some(key) {
                    return Ok((list, st, key));
                }
            }
        }
        let (list, st) = self.register(key, stream)?;
        Ok((list, st, key))
    }

    /// Allocates a block of `size` bytes (a multiple of 256 the resource accepts) on `stream`;
    /// `expand` obtains a new upstream chunk from `upstream` on `stream` (called with the
    /// growth lock held) and returns it with its size, given the pool size, the
    /// [`FreeBlocks::extendable_tail`] of this stream's list (0 for chunks that never merge) and
    /// the [`GrowthCause`] ([`Expand`]); only for chunks that merge may `expand` be called
    /// again, when the chunk merged with less than the tail said (another thread took part of
    /// it meanwhile).
    #[inline]
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        size: usize,
        upstream: &dyn DeviceMemoryResource,
        expand: impl FnMut(Expand) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<DevicePtr> {
        let (own, mut st, key) = self.lock_own(stream)?;
        st.serve(stream);
        let (addr, tag) = match st.blocks.take(size) {
            Some(block) => block,
            None => {
                drop(st);
                let block = self.allocate_slow(own, key, stream, size, upstream, expand)?;
                st = own.lock();
                block
            }
        };
        // The record is the resource's, shared by every list: any list's handle will do.
        if let Err(e) = st.blocks.hand_out(addr, size, tag, key.origin()) {
            drop(st);
            return Err(recorded_twice(addr, &e));
        }
        drop(st);
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        Ok(DevicePtr::from_raw(addr))
    }

    /// Takes `size` bytes from `own` if it is still `key`'s list.
    fn take_own(&self, own: &StreamList<L>, key: StreamKey, size: usize) -> Option<(u64, L::Tag)> {
        let mut st = own.lock();
        if st.key() == Some(key) {
            st.blocks.take(size)
        } else {
            None
        }
    }

    /// Puts `blocks` (safe for `stream` now, taken out of another list) into `own`, `key`'s
    /// list, as entering on `stream`, takes `size` bytes from it (`None`: takes nothing) and
    /// tells a searching grower whether the list now fits it (see
    /// [`patience`](crate::stream_ordered::patience)). If `own` was retired meanwhile, the
    /// block comes from `blocks` and the rest goes to the orphan list. On error (an
    /// inconsistency) the blocks `own` refused come back.
    #[allow(clippy::type_complexity)]
    fn deposit(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        mut blocks: L,
        size: Option<usize>,
    ) -> Result<Option<(u64, L::Tag)>, (L, String)> {
        let mut st = own.lock();
        if st.key() == Some(key) {
            st.publish(stream, self.is_eager());
            if let Err(e) = st.blocks.absorb(&mut blocks) {
                return Err((blocks, e));
            }
            let block = size.and_then(|size| st.blocks.take(size));
            self.patience.merged(|wanted| st.blocks.fits(wanted));
            return Ok(block);
        }
        drop(st);
        let block = size.and_then(|size| blocks.take(size));
        self.to_orphan(blocks);
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
        let (_, mut st, key) = self.lock_own(stream)?;
        let (tag, origin) = match st.blocks.take_back(addr, size) {
            Ok(taken) => taken,
            Err(kind) => {
                drop(st);
                return Err(self.invalid_free(ptr, bytes, kind));
            }
        };
        if needs_legacy_order(key.per_thread(), origin, false) {
            drop(st);
            return self.free_on_legacy(ptr, size, tag, origin);
        }
        if let Err(e) = st.blocks.put_released(addr, size, tag) {
            return Err(kept_allocated(&mut st.blocks, ptr, size, tag, origin, &e));
        }
        // Under the same lock: no thief sees the block before the event covers it.
        st.publish(stream, self.is_eager());
        self.patience.freed(|wanted| st.blocks.fits(wanted));
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
        let mut st = if self.legacy_used.load(Ordering::Acquire) {
            self.legacy.lock()
        } else {
            // Counts the legacy stream as a user (it may turn the resource eager).
            self.register(StreamKey::Legacy, CudaStreamView::legacy())?
                .1
        };
        if let Err(e) = st.blocks.put(ptr.addr(), size, tag) {
            return Err(kept_allocated(&mut st.blocks, ptr, size, tag, origin, &e));
        }
        st.publish(CudaStreamView::legacy(), self.is_eager());
        self.patience.freed(|wanted| st.blocks.fits(wanted));
        Ok(())
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

    /// The free blocks of every list holding some, by key, legacy list first (the read of
    /// `pool/diagnostics.rs`: snapshots and out-of-memory reports, never on a hot path).
    pub(crate) fn free_lists(&self) -> Vec<(StreamKey, Vec<(u64, usize)>)> {
        self.lists()
            .filter_map(|l| {
                let st = l.lock();
                Some((st.key()?, st.blocks.free_blocks()))
            })
            .filter(|(_, blocks)| !blocks.is_empty())
            .collect()
    }

    /// The upstream chunks, `(address, size)` by address (`pool/diagnostics.rs`).
    pub(crate) fn chunk_list(&self) -> Vec<(u64, usize)> {
        self.lock_chunks().iter().map(|(&a, &s)| (a, s)).collect()
    }

    /// The blocks handed out, `(address, rounded size)`, and their total bytes
    /// (`pool/diagnostics.rs`).
    pub(crate) fn handed_blocks(&self) -> Vec<(u64, usize)> {
        self.empty.handed_blocks()
    }

    /// The bytes handed out and not freed (rounded sizes) (`pool/diagnostics.rs`).
    pub(crate) fn in_use(&self) -> usize {
        self.empty.handed_out().1
    }

    /// The device the core was built on (`pool/diagnostics.rs`).
    pub(crate) fn device(&self) -> Option<DeviceId> {
        self.device
    }
}

impl<L: FreeBlocks> fmt::Debug for StreamOrdered<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrdered")
            .field("pool_size", &self.pool_size())
            .field("outstanding", &self.outstanding())
            .field("lists", &self.list_count())
            .field("slots", &self.lists.len())
            .field("eager", &self.is_eager())
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests;
