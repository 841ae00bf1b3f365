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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rmm_stream::{CudaStreamView, StreamLife};
use rmm_sys::{checked_align_up, DeviceGuard, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::append_only::AppendOnlyVec;
pub(crate) use crate::stream_ordered::free_blocks::{Expand, FreeBlocks};
use crate::stream_ordered::moves::{Budget, MoveGuard, Moves, Settled, SETTLE_TRIES};
pub(crate) use crate::stream_ordered::pressure::GrowthCause;
use crate::stream_ordered::pressure::PressureScope;
use crate::stream_ordered::slot_table::{Placement, SlotTable};
use crate::stream_ordered::stream_lists::{
    cached_list, device_synchronize, remember_list, ListGuard, Retired, Steal, StreamKey,
    StreamList,
};
use crate::util::cross_thread::{needs_legacy_order, Origin};
use crate::util::thread_life::{self, ThreadLife};

/// What a search of the other lists ([`StreamOrdered::take_from_others`]) found.
#[derive(Debug)]
enum Search<T> {
    /// A block, taken.
    Taken((u64, T)),
    /// Nothing taken; `withheld`: some list holds a fitting block that no event covers yet.
    Missed {
        /// See [`GrowthCause::decide`].
        withheld: bool,
    },
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

/// Whether the owner of a key is alive (see [`crate::stream_ordered::slot_table`]).
#[derive(Debug)]
enum Life {
    /// The legacy stream, and streams whose death cannot be known (foreign streams): never
    /// retired.
    Forever,
    /// The host thread whose per-thread default stream the key names.
    Thread(ThreadLife),
    /// An owning stream made by rmm-stream.
    Stream(StreamLife),
}

impl Life {
    /// The life of `key`'s owner; `stream` is the caller's stream of that key.
    fn of(key: StreamKey, stream: CudaStreamView<'_>) -> Self {
        match key {
            StreamKey::PerThread(_) => Self::Thread(thread_life::current()),
            StreamKey::Stream(_) => stream.life().map_or(Self::Forever, Self::Stream),
            StreamKey::Legacy | StreamKey::Orphan => Self::Forever,
        }
    }

    fn is_alive(&self) -> bool {
        match self {
            Self::Forever => true,
            Self::Thread(t) => t.is_alive(),
            Self::Stream(s) => s.is_alive(),
        }
    }
}

/// Thread exits and stream destructions so far (it moves when some owner died).
fn deaths() -> u64 {
    thread_life::exits().wrapping_add(rmm_stream::destroyed_streams())
}

/// How many stream lists a stream-ordered resource keeps (for tests and the figures of
/// `docs/reliability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLists {
    /// Lists alive: the legacy list and one per stream key in use (the orphan list, which holds
    /// the blocks of retired lists, is not counted).
    pub alive: usize,
    /// List slots ever made (alive and free), bounded by the most lists alive at once.
    pub slots: usize,
}

/// Which stream keys have lists (in which slot), and who used the resource first.
#[derive(Default)]
struct Registry {
    /// The slot in `StreamOrdered::lists` of every key but the legacy one.
    table: SlotTable<StreamKey, Life>,
    /// The slot of the first key a caller used, while it is the only one, when that list is
    /// not the legacy one.
    first_user: Option<usize>,
    /// Number of keys callers have used.
    users: usize,
}

/// Device synchronizations in progress with free blocks held out of every list, so that an
/// allocation about to report out-of-memory waits for them instead (it holds no lock then).
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    idle: Condvar,
}

impl InFlight {
    fn begin(&self) -> InFlightGuard<'_> {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        InFlightGuard(self)
    }

    fn is_busy(&self) -> bool {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) > 0
    }

    fn wait_idle(&self) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        while *count > 0 {
            count = self
                .idle
                .wait(count)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Ends an [`InFlight`] synchronization when dropped.
struct InFlightGuard<'a>(&'a InFlight);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count -= 1;
        if *count == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// How often an allocation that found the resource full waits for synchronizations in flight
/// and looks again before it reports out-of-memory.
const FULL_RETRIES: usize = 3;

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// Treats "no driver / no device" as success: without a device no stream work can be pending
/// (this is what lets host-memory tests run the release paths on machines without a GPU).
fn settle(r: MrResult<()>) -> MrResult<()> {
    match r {
        Err(e) if e.is_no_device() => Ok(()),
        other => other,
    }
}

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
    registry: Mutex<Registry>,
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
    /// The merges made outside the growth lock, counted so that a grower does not miss their
    /// blocks in transit (see [`moves`](crate::stream_ordered::moves)).
    moves: Moves,
    /// How long growers held the growth lock (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    holds: crate::testing::growth_lock::HoldRecorder,
    /// Requests of at most this many bytes give the wholly free chunks back before they fail
    /// (and grow once more); `None`: never (see
    /// [`release_before_failing`](Self::release_before_failing)).
    release_limit: Option<usize>,
}

/// The growth lock held by a grower ([`StreamOrdered::lock_growth`]): the chunk set, the
/// budget of the grower's waits for this hold, and (for benchmarks and tests) where its hold
/// time goes when it is released.
struct GrowthHold<'a> {
    chunks: MutexGuard<'a, BTreeMap<u64, usize>>,
    budget: Budget,
    #[cfg(any(test, feature = "testing"))]
    record: (&'a crate::testing::growth_lock::HoldRecorder, Instant),
}

#[cfg(any(test, feature = "testing"))]
impl Drop for GrowthHold<'_> {
    fn drop(&mut self) {
        let (recorder, locked) = self.record;
        recorder.record(locked.elapsed(), self.budget.spent(), self.budget.ran_out());
    }
}

impl<L: FreeBlocks> StreamOrdered<L> {
    /// A core without chunks; `empty` is the list every stream starts with (and the handle of
    /// the record every list shares).
    pub(crate) fn new(empty: L) -> Self {
        Self {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            legacy: StreamList::new(Some(StreamKey::Legacy), empty.clone()),
            orphan: StreamList::new(Some(StreamKey::Orphan), empty.clone()),
            lists: AppendOnlyVec::new(),
            legacy_used: AtomicBool::new(false),
            eager: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            swept: AtomicU64::new(deaths()),
            empty,
            chunks: Mutex::new(BTreeMap::new()),
            pool_size: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            device: rmm_sys::current_device().ok(),
            in_flight: InFlight::default(),
            moves: Moves::new(),
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

    /// The merges in transit (tests set its hooks).
    #[cfg(test)]
    pub(crate) fn moves(&self) -> &Moves {
        &self.moves
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

    /// Number of stream lists alive: the legacy list and one per key with a list (a list whose
    /// owner died counts until it is retired, at the next allocation that misses its own list or
    /// the next new key).
    pub(crate) fn list_count(&self) -> usize {
        1 + self.lock_registry().table.live()
    }

    /// Number of list slots ever made (live and free): bounded by the most lists alive at once.
    pub(crate) fn slot_count(&self) -> usize {
        self.lists.len()
    }

    /// [`list_count`](Self::list_count) and [`slot_count`](Self::slot_count), after retiring the
    /// lists of owners that died since the last look when `retire` (tests, figures).
    pub(crate) fn stream_lists(&self, retire: bool) -> StreamLists {
        if retire {
            self.sweep();
        }
        StreamLists {
            alive: self.list_count(),
            slots: self.slot_count(),
        }
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

    /// Takes the growth lock for a growth: the chunk set, with the budget of the grower's waits
    /// counted from now (see [`moves`](crate::stream_ordered::moves)).
    fn lock_growth(&self) -> GrowthHold<'_> {
        let chunks = self.lock_chunks();
        let locked = Instant::now();
        GrowthHold {
            chunks,
            budget: Budget::growth(locked),
            #[cfg(any(test, feature = "testing"))]
            record: (&self.holds, locked),
        }
    }

    /// How long growers held the growth lock so far (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn growth_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.holds.snapshot()
    }

    fn lock_registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every list, the legacy one first, then the slots in creation order, then the orphan list
    /// (for the slow paths).
    fn lists(&self) -> impl Iterator<Item = &StreamList<L>> + '_ {
        std::iter::once(&self.legacy)
            .chain(self.lists.iter())
            .chain(std::iter::once(&self.orphan))
    }

    /// The list of `stream`, locked, with its key, registering the key on first use. The legacy
    /// list is found inline; other streams go through this thread's cache
    /// ([`lock_cached`](Self::lock_cached)).
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn lock_own(
        &self,
        stream: CudaStreamView<'_>,
    ) -> MrResult<(&StreamList<L>, ListGuard<'_, L>, StreamKey)> {
        if StreamKey::is_legacy(stream) && self.legacy_used.load(Ordering::Acquire) {
            return Ok((&self.legacy, self.legacy.lock(), StreamKey::Legacy));
        }
        self.lock_cached(stream)
    }

    /// [`lock_own`](Self::lock_own) past the legacy list: a slot found through this thread's
    /// cache that no longer belongs to the key (retired) is looked up again.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn lock_cached(
        &self,
        stream: CudaStreamView<'_>,
    ) -> MrResult<(&StreamList<L>, ListGuard<'_, L>, StreamKey)> {
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

    /// Finds or creates the list of `key` (after retiring the lists of dead owners, whose slots
    /// a new key may reuse), counts the key as used (the second key turns the pool eager),
    /// remembers the list in this thread's cache and returns it locked (so no retirement can
    /// come between).
    #[cold]
    #[allow(clippy::type_complexity)]
    fn register(
        &self,
        key: StreamKey,
        stream: CudaStreamView<'_>,
    ) -> MrResult<(&StreamList<L>, ListGuard<'_, L>)> {
        let mut reg = self.lock_registry();
        self.sweep_locked(&mut reg);
        let (index, first_use) = if key == StreamKey::Legacy {
            (None, !self.legacy_used.load(Ordering::Relaxed))
        } else if let Some(i) = reg.table.get(&key) {
            (Some(i), false)
        } else {
            let placement = reg.table.insert(key, Life::of(key, stream));
            if let Placement::New(i) = placement {
                let pushed = self.lists.push(StreamList::new(None, self.empty.clone()));
                if pushed != i {
                    reg.table.undo_insert(&key, placement);
                    return Err(MrError::bad_alloc(format!(
                        "stream list storage out of step: slot {pushed}, expected {i}"
                    )));
                }
            }
            (Some(placement.slot()), true)
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
                    let mut f = first.lock();
                    if f.key().is_some_and(|k| !k.is_special()) {
                        f.mark_unrecorded();
                    }
                }
            }
            if key == StreamKey::Legacy {
                self.legacy_used.store(true, Ordering::Release);
            }
        }
        let mut st = list.lock();
        if st.key().is_none() {
            let owner = match key {
                StreamKey::Stream(_) => stream.life(),
                _ => None,
            };
            st.assign(key, owner);
        }
        drop(reg);
        if index.is_some() {
            // `list` is an element of `self.lists` (see `lock_cached`).
            remember_list(self.id, key, std::ptr::from_ref(list).cast());
        }
        Ok((list, st))
    }

    /// Retires the lists of dead owners if some thread exited or some stream was destroyed since
    /// the last look (one atomic load otherwise).
    fn sweep(&self) {
        if self.swept.load(Ordering::Relaxed) != deaths() {
            let mut reg = self.lock_registry();
            self.sweep_locked(&mut reg);
        }
    }

    /// [`sweep`](Self::sweep) with the registry locked.
    fn sweep_locked(&self, reg: &mut Registry) {
        let now = deaths();
        if self.swept.swap(now, Ordering::Relaxed) == now {
            return;
        }
        for (key, slot) in reg.table.dead(Life::is_alive) {
            self.retire(reg, key, slot);
        }
    }

    /// Retires `key`'s list in `slot` (its owner died): the slot becomes free, and its blocks go
    /// where stream order keeps them safe. A per-thread list's go to the legacy list: the
    /// legacy stream waits for all earlier work of every blocking stream, per-thread default
    /// streams included (as for a cross-thread free). An ordinary stream's go to the orphan list
    /// with the list's event when it covers them all, else marked for a device synchronization
    /// (the stream is gone: nobody can record on it any more).
    fn retire(&self, reg: &mut Registry, key: StreamKey, slot: usize) {
        reg.table.remove(&key);
        if reg.first_user == Some(slot) {
            reg.first_user = None;
        }
        let Some(list) = self.lists.get(slot) else {
            return;
        };
        let retired = {
            let mut st = list.lock();
            if st.key() != Some(key) {
                log::error!("rmm: stream list {slot} is not {key:?}'s; nothing to retire");
                return;
            }
            st.retire(self.empty.clone())
        };
        let Some(Retired {
            mut blocks,
            event,
            covered,
        }) = retired
        else {
            return;
        };
        if blocks.is_empty() {
            return;
        }
        if key.per_thread().is_some() {
            let absorbed = self.legacy.lock().blocks.absorb(&mut blocks);
            if let Err(e) = absorbed {
                log::error!("rmm: the legacy list refused a retired list's blocks: {e}");
                self.to_orphan(blocks);
            }
            return;
        }
        // Before the pool turned eager nothing was recorded at all.
        let covered = covered && self.is_eager();
        if let Err((rest, e)) = self.orphan.lock().adopt(blocks, event, covered) {
            log::error!("rmm: free blocks lost while retiring a stream list: {e}");
            drop(rest);
        }
    }

    /// Puts `blocks` in the orphan list, behind a device synchronization (for blocks whose list
    /// is gone, or whose cover is unknown).
    fn to_orphan(&self, blocks: L) {
        if let Err((_, e)) = self.orphan.lock().adopt(blocks, None, false) {
            log::error!("rmm: free blocks lost while moving them to the orphan list: {e}");
        }
    }

    /// Gives `blocks`, taken out of `victim` (then `key`'s list) for a synchronization that
    /// failed, back: to `victim` if it is still `key`'s (its policy still says what covers
    /// them), else to the orphan list.
    fn give_back(&self, victim: &StreamList<L>, key: Option<StreamKey>, mut blocks: L) {
        let mut st = victim.lock();
        if key.is_some() && st.key() == key && key != Some(StreamKey::Orphan) {
            if let Err(e) = st.blocks.absorb(&mut blocks) {
                drop(st);
                log::error!("rmm: a list refused its own blocks back: {e}");
                self.to_orphan(blocks);
            }
            return;
        }
        drop(st);
        self.to_orphan(blocks);
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

    /// Puts `blocks` (safe for `stream` now) into `own`, `key`'s list, as entering on `stream`,
    /// and takes `size` bytes from it (`None`: takes nothing); a merge in `transit` then says
    /// whether the list fits the searching grower. If `own` was retired meanwhile, the block
    /// comes from `blocks` and the rest goes to the orphan list. On error (an
    /// inconsistency) the blocks `own` refused come back.
    #[allow(clippy::type_complexity)]
    fn deposit(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        mut blocks: L,
        size: Option<usize>,
        transit: Option<&mut MoveGuard<'_>>,
    ) -> Result<Option<(u64, L::Tag)>, (L, String)> {
        let mut st = own.lock();
        if st.key() == Some(key) {
            st.publish(stream, self.is_eager());
            if let Err(e) = st.blocks.absorb(&mut blocks) {
                return Err((blocks, e));
            }
            let block = size.and_then(|size| st.blocks.take(size));
            if let Some(transit) = transit {
                transit.landed(|wanted| st.blocks.fits(wanted));
            }
            return Ok(block);
        }
        drop(st);
        let block = size.and_then(|size| blocks.take(size));
        self.to_orphan(blocks);
        Ok(block)
    }

    /// Synchronizes the device of this resource (made current for the call), with no lock of
    /// the resource held by the caller.
    fn synchronize_device(&self) -> MrResult<()> {
        let _device = match self.device.map(DeviceGuard::new) {
            Some(Err(e)) if !e.is_no_device() => return Err(e.into()),
            guard => guard,
        };
        // Relaxed capture mode: not refused while another thread holds a global capture.
        crate::graph::relaxed(device_synchronize).map_err(MrError::from)
    }

    /// Steals one fitting block from another stream's list (the remainder stays there), else
    /// merges other lists into `own` until one fits; the stream waits on each victim's event.
    /// A victim that needs a device synchronization is skipped unless `may_sync`; then the
    /// blocks are taken out under its lock and the device is synchronized with no lock held.
    /// When nothing is taken, says whether a fitting block was withheld for want of an event
    /// (the growth that follows is then [`GrowthCause::Pressure`]). `may_sync` is true exactly
    /// outside the growth lock, where the merges that need no synchronization are counted in
    /// [`Moves`] while their blocks are in transit.
    fn take_from_others(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
        may_sync: bool,
    ) -> MrResult<Search<L::Tag>> {
        let others: Vec<&StreamList<L>> = self.lists().filter(|l| !std::ptr::eq(*l, own)).collect();
        let mut withheld = false;
        // Steal one block; the remainder stays with its stream.
        for victim in &others {
            let mut st = victim.lock();
            // Nothing is taken before the stream waits, so a failed wait takes nothing.
            if !st.blocks.fits(size) {
                continue;
            }
            match st.prepare_steal(stream, may_sync)? {
                // The block is there, but no event covers it yet (its owner was asked to
                // record, or only a device synchronization would do).
                Steal::NotNow => withheld = true,
                Steal::Now => {
                    let Some(block) = st.blocks.take(size) else {
                        continue;
                    };
                    let mut share = self.empty.clone();
                    st.blocks.share_with_thief(size, &mut share);
                    st.after_take();
                    if share.is_empty() {
                        return Ok(Search::Taken(block));
                    }
                    // As a merge: outside the growth lock a grower must not miss the share
                    // while it is in no list.
                    let mut transit = may_sync.then(|| self.moves.begin());
                    let victim_key = st.key();
                    drop(st);
                    if transit.is_some() {
                        self.moves.in_transit_point();
                    }
                    if let Err((rest, e)) =
                        self.deposit(own, key, stream, share, None, transit.as_mut())
                    {
                        log::error!("rmm: inconsistent free lists after a steal: {e}");
                        self.give_back(victim, victim_key, rest);
                    }
                    drop(transit);
                    return Ok(Search::Taken(block));
                }
                Steal::AfterSync(snapshot) => {
                    let victim_key = st.key();
                    let Some(block) = st.blocks.take(size) else {
                        continue;
                    };
                    st.after_take();
                    drop(st);
                    let _busy = self.in_flight.begin();
                    if let Err(e) = self.synchronize_device() {
                        let mut back = self.empty.clone();
                        match back.put(block.0, size, block.1) {
                            Ok(()) => self.give_back(victim, victim_key, back),
                            Err(put) => log::error!(
                                "rmm: block {:#x} lost after a failed synchronization: {put}",
                                block.0
                            ),
                        }
                        return Err(e);
                    }
                    victim.lock().synchronized_since(snapshot);
                    return Ok(Search::Taken(block));
                }
            }
        }
        // Merge whole lists into this one, retrying after each.
        for victim in &others {
            let (moved, victim_key, sync, mut transit) = {
                let mut st = victim.lock();
                if st.blocks.is_empty() {
                    continue;
                }
                let sync = match st.prepare_steal(stream, may_sync)? {
                    Steal::NotNow => continue,
                    Steal::Now => None,
                    Steal::AfterSync(snapshot) => Some(snapshot),
                };
                // Outside the growth lock, a grower must not miss these blocks while they are
                // in no list (until `deposit` below). A merge behind a synchronization
                // is not counted: no grower waits for another thread's synchronization.
                let transit = (may_sync && sync.is_none()).then(|| self.moves.begin());
                let moved = std::mem::replace(&mut st.blocks, self.empty.clone());
                st.after_take();
                (moved, st.key(), sync, transit)
            };
            // `transit` lives to the end of this iteration, after the deposit.
            if transit.is_some() {
                self.moves.in_transit_point();
            }
            let _busy = sync.map(|_| self.in_flight.begin());
            if let Some(snapshot) = sync {
                if let Err(e) = self.synchronize_device() {
                    self.give_back(victim, victim_key, moved);
                    return Err(e);
                }
                victim.lock().synchronized_since(snapshot);
            }
            match self.deposit(own, key, stream, moved, Some(size), transit.as_mut()) {
                Ok(Some(block)) => return Ok(Search::Taken(block)),
                Ok(None) => {}
                Err((rest, e)) => {
                    self.give_back(victim, victim_key, rest);
                    return Err(MrError::bad_alloc(format!(
                        "inconsistent free lists while merging: {e}"
                    )));
                }
            }
        }
        Ok(Search::Missed { withheld })
    }

    #[cold]
    fn allocate_slow(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
        upstream: &dyn DeviceMemoryResource,
        mut expand: impl FnMut(Expand) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<(u64, L::Tag)> {
        self.sweep();
        if let Search::Taken(block) = self.take_from_others(own, key, stream, size, true)? {
            return Ok(block);
        }
        let (mut reclaimed, mut released) = (false, false);
        loop {
            // Grow, holding the growth lock. Threads that missed together queue here; each looks
            // again once it holds the lock, so memory another one just obtained is used instead
            // of growing the pool once per waiting thread (RMM serializes everything on one mutex
            // and so never races here). Nothing synchronizes the device under this lock.
            let mut chunks = self.lock_growth();
            let mut tries = 0;
            let withheld = loop {
                let watch = self.moves.watch(size);
                if let Some(block) = self.take_own(own, key, size) {
                    return Ok(block);
                }
                match self.take_from_others(own, key, stream, size, false)? {
                    Search::Taken(block) => return Ok(block),
                    // Grow only once no merge outside this lock hid a fitting block from the
                    // search (in transit, or moved behind it), and, after such a real miss, no
                    // free left one within the grower's patience; every wait comes out of
                    // the one budget of this hold of the lock; see `moves`.
                    Search::Missed { withheld } => match watch.settle(&mut chunks.budget) {
                        Settled::SearchAgain if tries < SETTLE_TRIES => tries += 1,
                        Settled::SearchAgain | Settled::Grow | Settled::GaveUp => break withheld,
                    },
                }
            };
            // Chunks that merge grow the free block at the end of the memory by what it lacks.
            // A fitting block withheld for want of an event (its owner will record at its next
            // operation) makes this growth a pressure growth: only what the request needs.
            let tail = self.own_tail(own, key);
            let cause = GrowthCause::decide(withheld, PressureScope::is_active());
            let grown = {
                // What `expand` allocates from a stream-ordered upstream grows it likewise.
                let _pressure = PressureScope::enter(cause);
                expand(Expand {
                    pool_size: self.pool_size(),
                    tail: tail.unwrap_or(0),
                    cause,
                })
            };
            let (ptr, chunk_size) = match grown {
                Ok(chunk) => chunk,
                Err(e) if e.is_out_of_memory() => {
                    drop(chunks);
                    // Rather than report out-of-memory while blocks wait for an owner that may
                    // never record, synchronize once (no lock held) and take them all.
                    match self.reclaim_or_wait(own, key, stream, size)? {
                        Some(block) => return Ok(block),
                        // Chunks that merge: the reclaimed blocks grew the free block at the
                        // end, so a smaller chunk may now do; grow again from it, once.
                        None if !reclaimed && tail.is_some() && self.own_tail(own, key) != tail => {
                            reclaimed = true;
                            continue;
                        }
                        // Free memory split over chunks that never merge (or that the source
                        // still holds): give the wholly free chunks back, after a device
                        // synchronization, and grow once more from the room that made.
                        None if !released
                            && self.release_limit.is_some_and(|limit| size <= limit)
                            && self.release_for_growth(upstream) =>
                        {
                            released = true;
                            continue;
                        }
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            chunks.chunks.insert(ptr.addr(), chunk_size);
            self.pool_size.fetch_add(chunk_size, Ordering::Relaxed);
            // Publish the chunk in this stream's list before letting other growers in.
            let mut st = own.lock();
            let added = if st.key() == Some(key) {
                // The chunk may still be in flight on `stream` (a stream-ordered upstream): its
                // rest must not be stolen before that, so the event is recorded after it.
                st.publish(stream, self.is_eager());
                st.blocks
                    .add_chunk(ptr.addr(), chunk_size)
                    .map(|()| st.blocks.take(size))
            } else {
                // This stream's list was retired meanwhile (its owner died): the block comes
                // from the chunk, the rest goes to the orphan list.
                drop(st);
                let mut fresh = self.empty.clone();
                fresh.add_chunk(ptr.addr(), chunk_size).map(|()| {
                    let block = fresh.take(size);
                    self.to_orphan(fresh);
                    block
                })
            };
            match added {
                Ok(Some(block)) => return Ok(block),
                Ok(None) if tail.is_some() => {
                    // The chunk merged with less than `tail` promised: it stays in this list,
                    // and the resource grows again (each round maps more, until `expand` runs
                    // out of room).
                }
                Ok(None) => {
                    return Err(MrError::bad_alloc(format!(
                        "a new upstream chunk of {chunk_size} bytes cannot serve {size} bytes"
                    )));
                }
                Err(e) => {
                    // Not the pool's: the chunk goes back, and the growth never happened.
                    chunks.chunks.remove(&ptr.addr());
                    self.pool_size.fetch_sub(chunk_size, Ordering::Relaxed);
                    drop(chunks);
                    // SAFETY: the upstream just handed out this chunk on `stream` for
                    // `chunk_size` bytes, and none of it was handed out.
                    let r = unsafe {
                        upstream.deallocate(stream, ptr, chunk_size, ALLOCATION_ALIGNMENT)
                    };
                    if let Err(e) = r {
                        log::error!("rmm: could not give a refused chunk {ptr} back: {e}");
                    }
                    return Err(MrError::bad_alloc(format!(
                        "new upstream chunk rejected: {e}"
                    )));
                }
            }
        }
    }

    /// Before an allocation fails for want of memory: [`release_unused`](Self::release_unused)
    /// (the device is synchronized before any chunk goes), so that growth can take one chunk
    /// where the free memory was split over several. Whether any chunk was released; a failure
    /// is logged (the allocation then reports its own out-of-memory).
    #[cold]
    fn release_for_growth(&self, upstream: &dyn DeviceMemoryResource) -> bool {
        match self.release_unused(upstream) {
            Ok(bytes) => bytes > 0,
            Err(e) => {
                log::warn!("rmm: releasing free chunks before failing an allocation failed: {e}");
                false
            }
        }
    }

    /// [`FreeBlocks::extendable_tail`] of `own` if it is still `key`'s list.
    fn own_tail(&self, own: &StreamList<L>, key: StreamKey) -> Option<usize> {
        let st = own.lock();
        if st.key() == Some(key) {
            st.blocks.extendable_tail()
        } else {
            None
        }
    }

    /// The resource cannot grow: reclaims the blocks no event covers (one device
    /// synchronization, no lock held), and if there are none while other threads'
    /// synchronizations hold blocks out of every list, waits for those and looks again.
    /// `Ok(None)`: nothing to take.
    #[cold]
    fn reclaim_or_wait(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        for _ in 0..FULL_RETRIES {
            let busy = self.in_flight.is_busy();
            if let Some(block) = self.reclaim_unrecorded(own, key, stream, size)? {
                return Ok(Some(block));
            }
            if !busy && !self.in_flight.is_busy() {
                break;
            }
            self.in_flight.wait_idle();
            if let Some(block) = self.take_own(own, key, size) {
                return Ok(Some(block));
            }
            if let Search::Taken(block) = self.take_from_others(own, key, stream, size, false)? {
                return Ok(Some(block));
            }
        }
        Ok(None)
    }

    /// Moves the blocks of every other list that an event does not cover into `own` after one
    /// device synchronization (which covers them all; made with no lock held), then takes
    /// `size` bytes from `own`.
    #[cold]
    fn reclaim_unrecorded(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let mut moved = Vec::new();
        for victim in self.lists().filter(|l| !std::ptr::eq(*l, own)) {
            let mut st = victim.lock();
            if st.is_uncovered() && !st.blocks.is_empty() {
                let snapshot = st.entered();
                let blocks = std::mem::replace(&mut st.blocks, self.empty.clone());
                st.after_take();
                moved.push((victim, st.key(), snapshot, blocks));
            }
        }
        if moved.is_empty() {
            return Ok(None);
        }
        let _busy = self.in_flight.begin();
        // Every moved block entered its list before this point, so once the device has
        // finished the work queued so far no stream uses it.
        if let Err(e) = settle(self.synchronize_device()) {
            // Not proven safe: every block goes back where it came from, still unrecorded.
            for (victim, victim_key, _, blocks) in moved {
                self.give_back(victim, victim_key, blocks);
            }
            return Err(e);
        }
        let mut all = self.empty.clone();
        let mut rejected = Vec::new();
        for (victim, victim_key, snapshot, mut blocks) in moved {
            victim.lock().synchronized_since(snapshot);
            if let Err(e) = all.absorb(&mut blocks) {
                log::error!("rmm: inconsistent free lists while reclaiming: {e}");
                rejected.push((victim, victim_key, blocks));
            }
        }
        let block = match self.deposit(own, key, stream, all, Some(size), None) {
            Ok(block) => block,
            Err((rest, e)) => {
                log::error!("rmm: inconsistent free lists while reclaiming: {e}");
                // Synchronized: safe for any stream, but whose they were is lost.
                self.to_orphan(rest);
                None
            }
        };
        for (victim, victim_key, blocks) in rejected {
            self.give_back(victim, victim_key, blocks);
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
        self.moves.freed(|wanted| st.blocks.fits(wanted));
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
        self.moves.freed(|wanted| st.blocks.fits(wanted));
        Ok(())
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

    /// Everything the core keeps (tests).
    #[cfg(test)]
    pub(crate) fn state(&self) -> CoreState {
        let lists = self
            .lists()
            .filter_map(|l| {
                let st = l.lock();
                Some((st.key()?, st.blocks.free_blocks()))
            })
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
        self.lists().find_map(|l| {
            let st = l.lock();
            if st.blocks.holds(addr) {
                st.key()
            } else {
                None
            }
        })
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

    /// Gives every wholly free upstream chunk back to `upstream` and returns the bytes released.
    /// The chunks are taken out of their lists under the locks; then, with no lock held, the
    /// resource's device is made current and synchronized (so no pending work on any stream can
    /// still use them) and they are freed; a chunk that cannot be released goes back.
    pub(crate) fn release_unused(&self, upstream: &dyn DeviceMemoryResource) -> MrResult<usize> {
        self.sweep();
        let mut taken = Vec::new();
        {
            let chunks = self.lock_chunks();
            for (&addr, &size) in chunks.iter() {
                for list in self.lists() {
                    let mut st = list.lock();
                    if st.blocks.remove_chunk(addr, size) {
                        st.after_take();
                        taken.push((list, st.key(), addr, size));
                        break;
                    }
                }
            }
        }
        if taken.is_empty() {
            return Ok(0);
        }
        let _busy = self.in_flight.begin();
        let put_back = |list: &StreamList<L>, key: Option<StreamKey>, addr: u64, size: usize| {
            let mut chunk = self.empty.clone();
            match chunk.add_chunk(addr, size) {
                Ok(()) => self.give_back(list, key, chunk),
                Err(e) => log::error!("rmm: could not return chunk {addr:#x} to a list: {e}"),
            }
        };
        let _device = match self.device.map(DeviceGuard::new) {
            Some(Err(e)) if !e.is_no_device() => {
                for (list, key, addr, size) in taken {
                    put_back(list, key, addr, size);
                }
                return Err(e.into());
            }
            guard => guard,
        };
        if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
            for (list, key, addr, size) in taken {
                put_back(list, key, addr, size);
            }
            return Err(e);
        }
        let mut released = Vec::new();
        let mut first_error = None;
        let stream = CudaStreamView::default();
        for (list, key, addr, size) in taken {
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
            match r {
                Ok(()) => released.push((addr, size)),
                Err(e) => {
                    // Still the pool's: back where it was.
                    put_back(list, key, addr, size);
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut bytes = 0;
        if !released.is_empty() {
            let mut chunks = self.lock_chunks();
            for (addr, size) in released {
                chunks.remove(&addr);
                self.pool_size.fetch_sub(size, Ordering::Relaxed);
                bytes += size;
            }
            drop(chunks);
            // The chunks are released; waiting for a stream-ordered upstream to finish freeing
            // them can fail without making them the pool's again.
            if let Err(e) = settle(stream.synchronize().map_err(MrError::from)) {
                log::warn!("rmm: synchronizing after releasing {bytes} bytes failed: {e}");
            }
        }
        first_error.map_or(Ok(bytes), Err)
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
            .field("slots", &self.slot_count())
            .field("eager", &self.is_eager())
            .finish()
    }
}

#[cfg(test)]
mod tests;
