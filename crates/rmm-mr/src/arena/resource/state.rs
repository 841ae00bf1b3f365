//! [`State`]: the shared state of one arena resource (and all its clones) and its algorithms.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, Weak};

use rmm_stream::{CudaEvent, CudaStreamView};
use rmm_sys::DevicePtr;

use super::fence::FreeFence;
use super::global::{GlobalState, PendingFree, PendingQueue};
use super::thread_cache::{self, ThreadExit};
use super::{fence, lock, read, write, ArenaCell, ArenaKey, ArenaOptions, ArenaSlot, EventPool};
use super::{DUMP_LOG_TARGET, UPSTREAM_ALIGNMENT};
use crate::arena::{
    align_down, align_to_size_class, align_up, ArenaError, Block, GlobalArena, Superblock,
    SuperblockLocation, SUPERBLOCK_MIN_SIZE,
};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
#[cfg(any(test, feature = "testing"))]
use crate::testing::growth_lock::HoldRecorder;
use crate::util::cross_thread::{needs_legacy_order, Origin};
use crate::util::format::format_bytes;

mod diagnostics;

/// Pending frees looked at by every allocation that touches the global arena.
const REAP_BATCH: usize = 2;

/// Superblocks (or pending frees) a reclaim gives back to the global arena per hold of its
/// lock.
const RECLAIM_BATCH: usize = 64;

/// A way to make room when an allocation fails, in the order they are tried.
#[derive(Debug, Clone, Copy)]
enum Relief {
    /// Take the empty superblocks of every arena back ([`State::reclaim`]).
    Reclaim,
    /// RMM's defragmentation: take every superblock back ([`State::defragment`]).
    Defragment,
}

static NEXT_RESOURCE_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The state all clones of one arena resource share.
///
/// Locks, always taken in this order (a lock is never acquired while a later one is held,
/// except with `try_lock`):
/// 1. `arenas` (the key -> arena map; read-mostly, written when an arena is created or retired);
/// 2. `holding` (the holding arenas: destroyed streams' superblocks, and those a
///    defragmentation took, until a reclaim gives them back);
/// 3. a local arena's lock ([`ArenaCell`]); only defragmentation and the sweep of destroyed
///    streams' arenas hold several (both hold the map's write lock, so no two threads ever do);
/// 4. `global` (the global arena and what goes with it);
/// 5. the pending-free queue and the event pool (leaves). Events are queried, recorded and
///    waited on outside the global lock.
///
/// No lock is held while the host waits for the device (a device synchronization, an event's
/// or a stream's): what must wait is taken out under the locks, the locks are released, and
/// the results go back under them afterwards ([`reclaim`](Self::reclaim),
/// [`defragment`](Self::defragment), [`return_held`](Self::return_held), thread exit). The
/// flag that lets one thread at a time make room is not held either ([`relieve`](Self::relieve)).
pub(super) struct State<U: DeviceMemoryResource> {
    pub(super) upstream: U,
    /// Identifies this resource in the per-thread caches (never reused).
    serial: u64,
    /// The upstream allocation.
    base: DevicePtr,
    size: usize,
    /// `[base, base + size)`.
    span: Block,
    /// Whether a CUDA driver and device are usable. Without one no stream can have queued work,
    /// so nothing is recorded, waited for or synchronized (this is what lets the resource run
    /// over a host-memory upstream in tests on machines without a GPU).
    gpu: bool,
    dump_log_on_failure: bool,
    use_size_classes: bool,
    /// Local arenas in the map (for the kept-memory limit, [`keep_limit`]); set under the map's
    /// write lock, read without it.
    arena_count: AtomicUsize,
    /// The global arena's free bytes as of the last release of the global lock (written by
    /// [`GlobalGuard`] as it lets the lock go, read without it): a large free decides from it
    /// whether its arena may keep the block's span before it takes the global lock.
    global_free: AtomicUsize,
    /// Whether a thread is making room ([`relieve`](Self::relieve)); not held while it does.
    relieving: Mutex<bool>,
    /// Signalled when a thread has made room.
    relieved: Condvar,
    /// How many times room was made (a thread that waited for another's just retries).
    reliefs: AtomicU64,
    global: Mutex<GlobalState>,
    pending: PendingQueue,
    arenas: RwLock<HashMap<ArenaKey, Arc<ArenaCell>>>,
    /// [`rmm_stream::destroyed_streams`] when the map was last swept for the arenas of
    /// destroyed streams ([`sweep`](Self::sweep)).
    swept: AtomicU64,
    /// Holding arenas ([`ArenaKey::Retired`]): the superblocks of the arenas of destroyed
    /// streams, until a reclaim has synchronized the device and gives them back to the global
    /// arena. The sweep moves superblocks into the last one only; a reclaim takes them all out
    /// (normally there is one, or none).
    holding: Mutex<Vec<Arc<ArenaCell>>>,
    events: EventPool,
    /// How long the global lock was held, each acquisition (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    holds: HoldRecorder,
}

/// The global lock, held. Letting it go publishes the global arena's free bytes
/// ([`State::global_free`]); in benchmarks and tests it also records how long it was held.
pub(super) struct GlobalGuard<'a> {
    guard: MutexGuard<'a, GlobalState>,
    free: &'a AtomicUsize,
    #[cfg(any(test, feature = "testing"))]
    record: (&'a HoldRecorder, std::time::Instant),
}

impl std::ops::Deref for GlobalGuard<'_> {
    type Target = GlobalState;

    #[inline]
    fn deref(&self) -> &GlobalState {
        &self.guard
    }
}

impl std::ops::DerefMut for GlobalGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut GlobalState {
        &mut self.guard
    }
}

impl Drop for GlobalGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.free
            .store(self.guard.arena.free_bytes(), Ordering::Relaxed);
        #[cfg(any(test, feature = "testing"))]
        {
            let (recorder, locked) = self.record;
            recorder.record(locked.elapsed(), std::time::Duration::ZERO, 0, false);
        }
    }
}

/// Whether the calling thread runs on rmm-sys's simulated driver (tests only): an arena built
/// there then makes its stream calls (events, waits, synchronizations) as with a GPU, so tests
/// can make them fail.
fn simulated_driver() -> bool {
    #[cfg(test)]
    return rmm_sys::fault::is_simulating();
    #[cfg(not(test))]
    false
}

/// How many free bytes each of `arenas` local arenas may keep in superblocks its own large
/// frees emptied (see [`GlobalState::keep`]), while the global arena has `global_free` bytes
/// free: a share of what is free, `global_free / (KEEP_SHARE * arenas)`, but at least 1/64 of
/// the arena for all of them together (1/1024 each for 16 streams) and, in small arenas, up to
/// 16 MiB each (at most a quarter of the arena). Beyond that, large frees go back to the global
/// arena after an event on the freeing stream, as without keeping. Memory kept is lost to the
/// other streams until a reclaim or a defragmentation, and its layout is the stream's: a fixed
/// 1/64 for each of 16 streams cost 8 points of capacity, nothing kept at all would make 16
/// threads take the global lock and an event for most large frees (`docs/internals/arena.md`).
/// The share of the free memory gives streams room while the arena has it and shrinks to the
/// fixed floor as it fills.
fn keep_limit(arena_size: usize, arenas: usize, global_free: usize) -> usize {
    let arenas = arenas.max(1);
    let floor = (arena_size / 64 / arenas).max((arena_size / 4).min(16 << 20));
    floor.max(global_free / KEEP_SHARE / arenas)
}

/// Whether an arena that may still keep `room` free bytes keeps the span of a large block of
/// `size` bytes (rounded) its stream frees ([`GlobalState::keep`] checks the rest).
fn may_keep(room: usize, size: usize) -> bool {
    room > SUPERBLOCK_MIN_SIZE && size <= room
}

/// Together the arenas may keep up to `1 / KEEP_SHARE` of the global arena's free memory
/// (measured with 16 threads on `gpu_alloc`'s trace (a): 2 keeps all their large frees
/// local but costs capacity, 4 keeps 92 % of them local and 90 % occupancy on an H100;
/// `docs/internals/arena.md`).
const KEEP_SHARE: usize = 4;

fn wrong_free(ptr: DevicePtr, bytes: usize, error: ArenaError) -> MrError {
    let kind = match error {
        ArenaError::DoubleFree { .. } => InvalidFree::DoubleFree,
        ArenaError::SizeMismatch { allocated, .. } => InvalidFree::SizeMismatch { allocated },
        _ => InvalidFree::UnknownPointer,
    };
    MrError::InvalidFree { ptr, bytes, kind }
}

impl<U: DeviceMemoryResource> State<U> {
    /// Allocates the arena from `upstream` and sets up the bookkeeping.
    pub(super) fn new(upstream: U, options: ArenaOptions) -> MrResult<Self> {
        let gpu = rmm_sys::init().is_ok() || simulated_driver();
        let requested = match options.arena_size {
            Some(size) => size,
            None => rmm_sys::percent_of_free_device_memory(50)?,
        };
        let size = align_down(requested);
        if size < SUPERBLOCK_MIN_SIZE {
            return Err(MrError::invalid_argument(format!(
                "Arena size smaller than minimum superblock size. ({requested} bytes < \
                 {SUPERBLOCK_MIN_SIZE} bytes)"
            )));
        }
        let base = if gpu {
            upstream.allocate_sync(size, UPSTREAM_ALIGNMENT)?
        } else {
            // No device: nothing to synchronize with (a host-memory upstream in tests).
            upstream.allocate(CudaStreamView::default(), size, UPSTREAM_ALIGNMENT)?
        };
        let arena = match crate::util::alignment::check_chunk(base, super::NAME).and_then(|()| {
            GlobalArena::new(base.addr(), size).map_err(|e| {
                MrError::invalid_argument(format!(
                    "the upstream allocation cannot hold an arena: {e}"
                ))
            })
        }) {
            Ok(arena) => arena,
            Err(e) => {
                // SAFETY: `base` was just allocated from `upstream` with these arguments and
                // never handed out.
                let freed = unsafe { Self::free_upstream(&upstream, gpu, base, size) };
                if let Err(free_error) = freed {
                    log::error!("arena: returning the upstream allocation failed: {free_error}");
                }
                return Err(e);
            }
        };
        Ok(Self {
            upstream,
            serial: NEXT_RESOURCE_SERIAL.fetch_add(1, Ordering::Relaxed),
            base,
            size,
            span: arena.span(),
            gpu,
            dump_log_on_failure: options.dump_log_on_failure,
            use_size_classes: options.use_size_classes,
            arena_count: AtomicUsize::new(0),
            global_free: AtomicUsize::new(arena.free_bytes()),
            relieving: Mutex::new(false),
            relieved: Condvar::new(),
            reliefs: AtomicU64::new(0),
            global: Mutex::new(GlobalState::new(arena)),
            pending: PendingQueue::default(),
            arenas: RwLock::default(),
            swept: AtomicU64::new(rmm_stream::destroyed_streams()),
            holding: Mutex::default(),
            events: EventPool::default(),
            #[cfg(any(test, feature = "testing"))]
            holds: HoldRecorder::new(),
        })
    }

    /// # Safety
    /// `base` is the arena's upstream allocation of `size` bytes, not used any more.
    unsafe fn free_upstream(upstream: &U, gpu: bool, base: DevicePtr, size: usize) -> MrResult<()> {
        if gpu {
            // SAFETY: the caller's contract.
            unsafe { upstream.deallocate_sync(base, size, UPSTREAM_ALIGNMENT) }
        } else {
            // SAFETY: the caller's contract; without a device there is nothing to synchronize.
            unsafe {
                upstream.deallocate(CudaStreamView::default(), base, size, UPSTREAM_ALIGNMENT)
            }
        }
    }

    /// The size of the arena (the upstream allocation).
    pub(super) fn arena_size(&self) -> usize {
        self.size
    }

    pub(super) fn uses_size_classes(&self) -> bool {
        self.use_size_classes
    }

    pub(super) fn dumps_log_on_failure(&self) -> bool {
        self.dump_log_on_failure
    }

    /// The size the bookkeeping uses for a request: 256-byte multiples, or RMM's size classes.
    fn round(&self, bytes: usize) -> Option<usize> {
        if self.use_size_classes {
            align_to_size_class(bytes)
        } else {
            align_up(bytes)
        }
    }

    fn lock_global(&self) -> GlobalGuard<'_> {
        let guard = lock(&self.global);
        GlobalGuard {
            guard,
            free: &self.global_free,
            #[cfg(any(test, feature = "testing"))]
            record: (&self.holds, std::time::Instant::now()),
        }
    }

    /// How long the global lock was held so far, each acquisition (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn global_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.holds.snapshot()
    }

    // --- arenas -----------------------------------------------------------------------------

    /// The arena for `key` if it exists: from this thread's cache (no shared lock), else from
    /// the map (its read lock).
    #[inline]
    fn existing_arena(&self, key: ArenaKey) -> Option<Arc<ArenaCell>> {
        if let Some(cell) = thread_cache::cached(self.serial, key) {
            if cell.is_current() {
                return Some(cell);
            }
            thread_cache::forget(self.serial, key);
        }
        self.mapped_arena(key)
    }

    /// The arena for `key` from the map (its read lock), then cached for this thread.
    #[inline(never)]
    fn mapped_arena(&self, key: ArenaKey) -> Option<Arc<ArenaCell>> {
        let cell = read(&self.arenas).get(&key).cloned()?;
        thread_cache::remember(self.serial, key, &cell);
        Some(cell)
    }

    /// The arena for `key` (whose stream is `stream`), created on first use. A new per-thread
    /// arena gets a thread-exit guard. Creating one first moves the arenas of destroyed
    /// streams out of the map ([`sweep`](Self::sweep)).
    #[inline]
    fn arena(self: &Arc<Self>, key: ArenaKey, stream: CudaStreamView<'_>) -> Arc<ArenaCell> {
        if let Some(cell) = self.existing_arena(key) {
            return cell;
        }
        self.new_arena(key, stream)
    }

    /// [`arena`](Self::arena) when no arena for `key` exists yet (or it was just retired).
    #[cold]
    #[inline(never)]
    fn new_arena(self: &Arc<Self>, key: ArenaKey, stream: CudaStreamView<'_>) -> Arc<ArenaCell> {
        let (cell, created) = {
            let mut map = write(&self.arenas);
            match map.get(&key) {
                Some(cell) => (Arc::clone(cell), false),
                None => {
                    self.sweep(&mut map);
                    let cell = Arc::new(ArenaCell::new(key, stream));
                    map.insert(key, Arc::clone(&cell));
                    self.arena_count.store(map.len(), Ordering::Relaxed);
                    (cell, true)
                }
            }
        };
        if created && matches!(key, ArenaKey::Thread(_)) {
            let owner: Weak<dyn ThreadExit> = Arc::downgrade(self) as Weak<dyn ThreadExit>;
            if !thread_cache::register_thread_arena(owner, Arc::clone(&cell)) {
                log::debug!("arena: thread exiting; its arena waits for defragmentation");
            }
        }
        thread_cache::remember(self.serial, key, &cell);
        cell
    }

    /// Moves the arenas of destroyed streams out of `map` (the map, write-locked) if a stream
    /// was destroyed since the last look (one atomic load otherwise): their superblocks, used
    /// or not, and their fences go to the last holding arena, where frees of their blocks still
    /// find them through the owner table (and wrong frees are still detected), and the cells
    /// retire. Nothing there is handed out again before a reclaim has synchronized the device
    /// ([`reclaim`](Self::reclaim)): the destroyed stream may still have work queued, and no
    /// event can be recorded on it any more. So the map holds only the arenas of live streams,
    /// and the holding arenas are one (or a few after failed synchronizations), however many
    /// streams come and go. No device call here.
    fn sweep(&self, map: &mut HashMap<ArenaKey, Arc<ArenaCell>>) {
        let now = rmm_stream::destroyed_streams();
        if self.swept.swap(now, Ordering::Relaxed) == now {
            return;
        }
        let dead: Vec<ArenaKey> = map
            .iter()
            .filter(|(_, cell)| cell.owner_is_dead())
            .map(|(key, _)| *key)
            .collect();
        if dead.is_empty() {
            return;
        }
        let mut holding = lock(&self.holding);
        let target = if let Some(last) = holding.last() {
            Arc::clone(last)
        } else {
            let cell = Arc::new(ArenaCell::holding());
            holding.push(Arc::clone(&cell));
            cell
        };
        let mut into = target.lock();
        for key in dead {
            let Some(cell) = map.remove(&key) else {
                continue;
            };
            self.hold(&cell, &target, &mut into, &mut holding);
        }
        self.arena_count.store(map.len(), Ordering::Relaxed);
    }

    /// Moves every superblock of `cell` (out of the map, whose write lock the caller holds,
    /// as it holds `holding`'s lock), used or not, and its fences into `into`, the locked
    /// holding arena `target`, and retires the cell; frees of its blocks find them there
    /// through the owner table. A superblock the holding arena refuses (cannot happen:
    /// superblocks never overlap) stays in the cell, which is then held as it is.
    fn hold(
        &self,
        cell: &Arc<ArenaCell>,
        target: &Arc<ArenaCell>,
        into: &mut ArenaSlot,
        holding: &mut Vec<Arc<ArenaCell>>,
    ) {
        let mut slot = cell.lock();
        if cell.is_retired() {
            return;
        }
        let mut refused = false;
        let superblocks = slot.arena.take_all();
        if !superblocks.is_empty() {
            let mut global = self.lock_global();
            for sb in superblocks {
                let addr = sb.addr();
                match into.arena.adopt(sb) {
                    Ok(()) => {
                        global.owners.insert(addr, Arc::clone(target));
                    }
                    Err(rejected) => {
                        log::error!("arena: moving superblocks to a holding arena: {rejected}");
                        if let Err(lost) = slot.arena.adopt(*rejected.superblock) {
                            log::error!("arena: superblock lost: {lost}");
                        }
                        refused = true;
                    }
                }
            }
        }
        if refused {
            // Held as it is, until a reclaim takes its superblocks back.
            drop(slot);
            holding.insert(0, Arc::clone(cell));
            return;
        }
        into.fences.append(&mut slot.fences);
        cell.retire(&mut slot);
    }

    // --- allocation -------------------------------------------------------------------------

    /// `allocate(stream, bytes)`: RMM's algorithm (local arena or global arena), and when that
    /// fails two ways to make room, each followed by a retry: first a reclaim of the empty
    /// superblocks of every local arena ([`reclaim`](Self::reclaim)), then RMM's
    /// defragmentation ([`defragment`](Self::defragment)); then out-of-memory.
    pub(super) fn allocate(
        self: &Arc<Self>,
        stream: CudaStreamView<'_>,
        bytes: usize,
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let size = match self.round(bytes) {
            Some(size) if size <= self.span.size => size,
            // Larger than the whole arena: no defragmentation can help.
            _ => return Err(self.out_of_memory(bytes)),
        };
        let key = ArenaKey::of(stream)?;
        let mut seen = self.reliefs.load(Ordering::Acquire);
        if let Some(addr) = self.try_allocate(stream, key, size)? {
            return Ok(DevicePtr::from_raw(addr));
        }
        for relief in [Relief::Reclaim, Relief::Defragment] {
            // One thread at a time makes room; one that waited for another's just retries.
            self.relieve(relief, Some(seen))?;
            seen = self.reliefs.load(Ordering::Acquire);
            if let Some(addr) = self.try_allocate(stream, key, size)? {
                return Ok(DevicePtr::from_raw(addr));
            }
        }
        self.retire_if_empty(key);
        Err(self.out_of_memory(bytes))
    }

    /// Retires the arena of `key` if it holds nothing: a failed allocation on a new stream
    /// leaves no empty arena behind.
    fn retire_if_empty(&self, key: ArenaKey) {
        let cell = read(&self.arenas).get(&key).cloned();
        if let Some(cell) = cell {
            self.retire_empty([cell]);
            thread_cache::forget(self.serial, key);
        }
    }

    /// Retires those of `cells` that hold no superblock (their thread or stream gets a new
    /// arena on its next call), so that arenas of streams that no longer exist do not pile up.
    /// Their fences guard nothing any more (a fence orders the reuse of blocks freed into the
    /// arena) and go back to the pool.
    fn retire_empty(&self, cells: impl IntoIterator<Item = Arc<ArenaCell>>) {
        let mut map = write(&self.arenas);
        for cell in cells {
            let mut slot = cell.lock();
            if cell.is_retired() || slot.arena.superblock_count() > 0 {
                continue;
            }
            for event in slot.fences.drain(..) {
                self.events.give(event);
            }
            cell.retire(&mut slot);
            if map.get(&cell.key()).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                map.remove(&cell.key());
            }
        }
        self.arena_count.store(map.len(), Ordering::Relaxed);
    }

    #[cold]
    fn out_of_memory(&self, bytes: usize) -> MrError {
        if self.dump_log_on_failure {
            log::error!(target: DUMP_LOG_TARGET, "{}", self.memory_dump(Some(bytes)));
        }
        MrError::out_of_memory_with(
            format!(
                "Maximum pool size exceeded (failed to allocate {bytes} bytes): No room in arena."
            ),
            self.oom_report(bytes),
        )
    }

    /// One attempt, without defragmenting. `Ok(None)`: no room.
    fn try_allocate(
        self: &Arc<Self>,
        stream: CudaStreamView<'_>,
        key: ArenaKey,
        size: usize,
    ) -> MrResult<Option<u64>> {
        if GlobalArena::handles(size) {
            if let Some(addr) = self.allocate_kept(stream, key, size)? {
                return Ok(Some(addr));
            }
            return Ok(self.allocate_large(size, key.origin()));
        }
        self.with_own_arena(key, stream, |cell, slot| {
            // Blocks freed here from other streams are reusable once this stream waited.
            slot.wait_fences(stream, &self.events)?;
            // The hot path: only this arena's lock.
            if let Some(addr) = slot.arena.allocate_local(size) {
                return Ok(Some(addr));
            }
            let done = self.pending.take_completed(REAP_BATCH);
            let mut global = self.lock_global();
            self.release(&mut global, done);
            if global.lend(size, cell, slot) {
                return Ok(slot.arena.allocate_local(size));
            }
            drop(global);
            // Memory may sit in frees whose streams have since moved on.
            let done = self.pending.take_completed(usize::MAX);
            if done.is_empty() {
                return Ok(None);
            }
            let mut global = self.lock_global();
            self.release(&mut global, done);
            if global.lend(size, cell, slot) {
                return Ok(slot.arena.allocate_local(size));
            }
            Ok(None)
        })
    }

    /// Runs `f` on the calling stream's (or thread's) arena, locked (created if need be); an
    /// arena retired before the lock was taken is forgotten and looked up again.
    fn with_own_arena<R>(
        self: &Arc<Self>,
        key: ArenaKey,
        stream: CudaStreamView<'_>,
        f: impl FnOnce(&Arc<ArenaCell>, &mut ArenaSlot) -> R,
    ) -> R {
        loop {
            let cell = self.arena(key, stream);
            let mut slot = cell.lock();
            if !cell.is_current() {
                drop(slot);
                thread_cache::forget(self.serial, key);
                continue;
            }
            return f(&cell, &mut slot);
        }
    }

    /// Releases completed pending frees (see [`GlobalState::release_completed`]).
    fn release(&self, global: &mut GlobalState, done: Vec<PendingFree>) -> usize {
        if done.is_empty() {
            return 0;
        }
        global.release_completed(done, &self.events)
    }

    /// A large request served by the superblocks the stream's arena kept from its own large
    /// frees (only that arena's lock). `Ok(None)`: nothing kept fits.
    fn allocate_kept(
        &self,
        stream: CudaStreamView<'_>,
        key: ArenaKey,
        size: usize,
    ) -> MrResult<Option<u64>> {
        let Some(cell) = self.existing_arena(key) else {
            return Ok(None);
        };
        let mut slot = cell.lock();
        if !cell.is_current() || slot.arena.kept_free_bytes() < size {
            return Ok(None);
        }
        // Blocks other streams freed into this arena are reusable once this stream waited.
        slot.wait_fences(stream, &self.events)?;
        Ok(slot.arena.allocate_kept(size))
    }

    /// A large (> 1 MiB) request, served by the global arena, for a stream whose blocks have
    /// this `origin`.
    fn allocate_large(&self, size: usize, origin: Origin) -> Option<u64> {
        let done = self.pending.take_completed(REAP_BATCH);
        let mut global = self.lock_global();
        self.release(&mut global, done);
        let mut addr = global.arena.allocate_large(size);
        if addr.is_none() {
            drop(global);
            let done = self.pending.take_completed(usize::MAX);
            global = self.lock_global();
            if self.release(&mut global, done) > 0 {
                addr = global.arena.allocate_large(size);
            }
        }
        if let Some(addr) = addr {
            global.large_live.insert(addr, (size, origin));
        }
        addr
    }

    /// Makes room without disturbing the arenas' partly used superblocks: takes the empty
    /// superblocks (kept ones included) out of every local arena, waits, holding no lock, until
    /// the device has finished all the work queued so far, then gives them to the global arena,
    /// where they merge with the free memory around them, together with every pending free.
    ///
    /// Why that is enough: a superblock is empty once every block of it was freed, and a block
    /// is freed only after the work that uses it was queued (on the arena's stream, or on
    /// another stream that recorded a fence before the free), so all of that work was queued
    /// before the superblock was taken out, and the synchronization waits for it; the same holds
    /// for the pending frees taken before it. No other arena can touch the superblocks in
    /// between: they are out of their arena, still recorded as lent, with no owner.
    ///
    /// The holding arenas of destroyed streams' superblocks ([`sweep`](Self::sweep)) are taken
    /// out too, with their fences, before the synchronization: then everything they hold was
    /// queued before it (their streams were destroyed before the sweep), and every superblock
    /// of theirs, used or not, goes back to the global arena (as at defragmentation: live blocks
    /// stay live there), unless a free from another stream left a new fence meanwhile, which is
    /// waited for first ([`return_held`](Self::return_held)).
    ///
    /// RMM has no such step (its defragmentation moves every superblock back, used or not,
    /// after a device synchronization under an exclusive lock).
    fn reclaim(&self) -> MrResult<()> {
        let cells: Vec<Arc<ArenaCell>> = read(&self.arenas).values().cloned().collect();
        let mut taken: Vec<(Arc<ArenaCell>, Vec<Superblock>)> = Vec::new();
        for cell in cells {
            let mut slot = cell.lock();
            if cell.is_retired() || !slot.arena.has_empty() {
                continue;
            }
            let empty = slot.arena.take_empty();
            for batch in empty.chunks(RECLAIM_BATCH) {
                let mut global = self.lock_global();
                for sb in batch {
                    global.owners.remove(&sb.addr());
                    global.in_transit.insert(sb.span());
                }
            }
            drop(slot);
            taken.push((cell, empty));
        }
        let holding = std::mem::take(&mut *lock(&self.holding));
        let held: Vec<(Arc<ArenaCell>, Vec<CudaEvent>)> = holding
            .into_iter()
            .map(|cell| {
                let fences = std::mem::take(&mut cell.lock().fences);
                (cell, fences)
            })
            .collect();
        let pending = self.pending.take_all();
        if taken.is_empty() && pending.is_empty() && held.is_empty() {
            return Ok(());
        }
        if self.gpu {
            if let Err(e) = fence::device_synchronize() {
                self.undo_reclaim(taken, pending, held);
                return Err(e.into());
            }
        }
        let mut still_held = Vec::new();
        for (cell, fences) in held {
            // Recorded before the synchronization: complete.
            for event in fences {
                self.events.give(event);
            }
            if !self.return_held(&cell) {
                still_held.push(cell);
            }
        }
        if !still_held.is_empty() {
            lock(&self.holding).splice(0..0, still_held);
        }
        let mut emptied = Vec::with_capacity(taken.len());
        let mut superblocks = Vec::new();
        for (cell, taken) in taken {
            superblocks.extend(taken);
            emptied.push(cell);
        }
        // A batch at a time, so that the streams' large requests and loans wait for one batch
        // at most (each superblock is in transit until its batch: lent, with no owner).
        let mut superblocks = superblocks.into_iter().peekable();
        while superblocks.peek().is_some() {
            let mut global = self.lock_global();
            for sb in superblocks.by_ref().take(RECLAIM_BATCH) {
                let span = sb.span();
                global.in_transit.remove(span);
                if let Err(rejected) = global.arena.release(sb) {
                    log::error!("arena: reclaiming a superblock: {rejected}");
                }
            }
        }
        let mut pending = pending.into_iter().peekable();
        while pending.peek().is_some() {
            let batch: Vec<PendingFree> = pending.by_ref().take(RECLAIM_BATCH).collect();
            let mut global = self.lock_global();
            self.release(&mut global, batch);
        }
        self.retire_empty(emptied);
        Ok(())
    }

    /// A reclaim whose synchronization failed: the superblocks go back to their arenas (as
    /// superblocks for small requests: they are empty) and the pending frees to the queue,
    /// so nothing is handed to another stream. Those of an arena retired meanwhile stay in
    /// transit (lost to the allocator until it is dropped), as nothing says their stream is
    /// done with them.
    #[cold]
    fn undo_reclaim(
        &self,
        taken: Vec<(Arc<ArenaCell>, Vec<Superblock>)>,
        pending: Vec<PendingFree>,
        held: Vec<(Arc<ArenaCell>, Vec<CudaEvent>)>,
    ) {
        let mut back = Vec::with_capacity(held.len());
        for (cell, mut fences) in held {
            cell.lock().fences.append(&mut fences);
            back.push(cell);
        }
        if !back.is_empty() {
            lock(&self.holding).splice(0..0, back);
        }
        for (cell, superblocks) in taken {
            let mut slot = cell.lock();
            if cell.is_retired() {
                log::error!(
                    "arena: {} superblock(s) of a retired arena stay unused after a failed \
                     synchronization",
                    superblocks.len()
                );
                continue;
            }
            let mut global = self.lock_global();
            for sb in superblocks {
                let span = sb.span();
                match slot.arena.adopt(sb) {
                    Ok(()) => {
                        global.in_transit.remove(span);
                        global.owners.insert(span.addr, Arc::clone(&cell));
                    }
                    Err(rejected) => log::error!("arena: {rejected}"),
                }
            }
        }
        for entry in pending {
            self.pending.push(entry);
        }
    }

    /// Gives every superblock of `cell`, a holding arena taken out before a device
    /// synchronization, back to the global arena, after waiting (with no lock held) for the
    /// fences frees from other streams left there since; the cell then retires. `false`: a
    /// fence could not be waited for, or the global arena refused a superblock (a bug); the
    /// cell stays held.
    fn return_held(&self, cell: &Arc<ArenaCell>) -> bool {
        loop {
            let mut slot = cell.lock();
            if cell.is_retired() {
                return true;
            }
            let mut fences = std::mem::take(&mut slot.fences);
            if fences.is_empty() {
                let mut global = self.lock_global();
                global.take_back(&mut slot);
                drop(global);
                if slot.arena.superblock_count() > 0 {
                    return false;
                }
                cell.retire(&mut slot);
                return true;
            }
            drop(slot);
            while let Some(event) = fences.pop() {
                if let Err(e) = event.synchronize() {
                    log::warn!("arena: waiting for a fence of a destroyed stream's blocks: {e}");
                    fences.push(event);
                    cell.lock().fences.append(&mut fences);
                    return false;
                }
                self.events.give(event);
            }
        }
    }

    /// RMM's defragmentation: every local arena's superblocks, used or not, go back to the
    /// global arena (which coalesces the free memory around them) once the device has finished
    /// the work queued so far. Every local arena is retired (threads look their key up again
    /// and get a fresh one), so arenas of streams that no longer exist do not accumulate.
    ///
    /// Unlike RMM, which synchronizes the device while it holds every lock, no lock is held
    /// across the synchronization: under the locks, every local arena's superblocks and fences
    /// move into a new holding arena (as a destroyed stream's do at [`sweep`](Self::sweep));
    /// then a [`reclaim`](Self::reclaim) synchronizes, with no lock held, and gives every
    /// holding arena back to the global arena. Meanwhile the streams allocate from fresh
    /// arenas, and a free of a block in a held superblock lands in the holding arena behind a
    /// fence the reclaim waits for before the superblock goes back. If the synchronization
    /// fails, the superblocks stay held (their blocks can still be freed) until a later reclaim
    /// succeeds.
    fn defragment(&self) -> MrResult<()> {
        {
            let mut map = write(&self.arenas);
            let mut holding = lock(&self.holding);
            let target = Arc::new(ArenaCell::holding());
            let mut into = target.lock();
            let cells: Vec<Arc<ArenaCell>> = map.drain().map(|(_, cell)| cell).collect();
            for cell in &cells {
                self.hold(cell, &target, &mut into, &mut holding);
            }
            drop(into);
            holding.push(target);
            self.arena_count.store(map.len(), Ordering::Relaxed);
        }
        self.reclaim()
    }

    /// Makes room with `relief` unless another thread made room since `seen` (the count of
    /// [`reliefs`](Self::reliefs) the caller read before it found no room; `None`: in any
    /// case). One thread at a time: a thread that finds another making room waits for it to end
    /// (on a condition variable, so that no lock is held while the maker synchronizes the
    /// device), then looks at the count again.
    fn relieve(&self, relief: Relief, seen: Option<u64>) -> MrResult<()> {
        let mut running = lock(&self.relieving);
        while *running {
            running = self
                .relieved
                .wait(running)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if seen.is_some_and(|seen| self.reliefs.load(Ordering::Acquire) != seen) {
            return Ok(());
        }
        *running = true;
        drop(running);
        /// Ends the relief (also on an error or a panic) and wakes the threads waiting for it.
        struct Ending<'a>(&'a Mutex<bool>, &'a Condvar);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                *lock(self.0) = false;
                self.1.notify_all();
            }
        }
        let _ending = Ending(&self.relieving, &self.relieved);
        match relief {
            Relief::Reclaim => self.reclaim()?,
            Relief::Defragment => self.defragment()?,
        }
        self.reliefs.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    // --- deallocation -----------------------------------------------------------------------

    /// `deallocate(stream, ptr, bytes)`.
    pub(super) fn deallocate(
        self: &Arc<Self>,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let addr = ptr.addr();
        let unknown = ArenaError::NotFound { addr, size: bytes };
        let Some(size) = self.round(bytes) else {
            return Err(wrong_free(ptr, bytes, unknown));
        };
        if !self.span.contains_addr(addr) {
            return Err(wrong_free(ptr, bytes, unknown));
        }
        let key = ArenaKey::of(stream)?;
        if GlobalArena::handles(size) {
            return self.free_large(stream, key, ptr, bytes, size);
        }
        let mut fence = FreeFence::new(key);
        // The hot path: the block is in this stream's (or thread's) own arena.
        if let Some(cell) = self.existing_arena(key) {
            let mut slot = cell.lock();
            if cell.is_current() && self.free_into(key, &mut slot, ptr, bytes, size, &mut fence)? {
                return Ok(());
            }
        }
        self.fence_on_freeing_stream(stream, &mut fence)?;
        self.free_elsewhere(ptr, bytes, size, fence)
    }

    /// An event recorded on `stream` now, or `None` without a device.
    fn fence(&self, stream: CudaStreamView<'_>) -> MrResult<Option<CudaEvent>> {
        if !self.gpu {
            return Ok(None);
        }
        Ok(Some(self.events.record(stream)?))
    }

    /// Records `fence` on the freeing `stream`, unless it is already on the legacy stream
    /// (which covers the freeing stream too).
    fn fence_on_freeing_stream(
        &self,
        stream: CudaStreamView<'_>,
        fence: &mut FreeFence,
    ) -> MrResult<()> {
        if !fence.on_legacy && fence.event.is_none() {
            fence.event = self.fence(stream)?;
        }
        Ok(())
    }

    /// Makes `fence` an event recorded on the legacy default stream (once): it completes when
    /// all work queued so far on every blocking stream has completed, every thread's
    /// per-thread default stream included, so it covers both the freeing thread's work and
    /// the allocating thread's (see [`crate::util::cross_thread`]).
    #[cold]
    #[inline(never)]
    fn order_behind_legacy(&self, fence: &mut FreeFence) -> MrResult<()> {
        if !fence.on_legacy {
            let event = self.fence(CudaStreamView::legacy())?;
            self.events
                .give_opt(std::mem::replace(&mut fence.event, event));
            fence.on_legacy = true;
        }
        Ok(())
    }

    /// Frees the block at `ptr` (`bytes` as the caller gave them, `size` rounded) into `slot`,
    /// the locked arena of `holder`, for a free ordered behind `fence` (the freeing stream's
    /// key, and an event on that stream if the caller recorded one). `Ok(false)`: the block is
    /// not in this arena; nothing changed but, possibly, `fence`, which stays the caller's.
    ///
    /// The block becomes reusable by `holder`'s stream once that stream has waited on the
    /// fence (pushed to the arena's fences), or at once when `holder` is the freeing stream
    /// itself. Every block of an arena was allocated on the arena's own stream (loans are fresh
    /// superblocks), so a block freed here goes back to its allocating stream, whose own work
    /// that stream orders: no legacy-stream ordering is needed even for a free from another
    /// thread's per-thread default stream ([`crate::util::cross_thread`]).
    #[inline]
    fn free_into(
        &self,
        holder: ArenaKey,
        slot: &mut ArenaSlot,
        ptr: DevicePtr,
        bytes: usize,
        size: usize,
        fence: &mut FreeFence,
    ) -> MrResult<bool> {
        match slot.arena.deallocate(ptr.addr(), size) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(wrong_free(ptr, bytes, e)),
        }
        if let Some(event) = fence.event.take() {
            if holder == fence.freeing && !fence.on_legacy {
                // The freeing stream's own arena: its later work follows the free already.
                self.events.give(event);
            } else {
                slot.fences.push(event);
            }
        }
        Ok(true)
    }

    /// A large free, without blocking the host: first the stream's own part
    /// ([`free_large_here`](Self::free_large_here): its arena frees or keeps the block at once);
    /// otherwise the block becomes reusable once the work queued on `stream` so far has
    /// completed (a pending free, with an event recorded outside the global lock). A block
    /// another thread allocated on its per-thread default stream, freed on this thread's, waits
    /// for an event on the legacy stream instead ([`crate::util::cross_thread`]).
    fn free_large(
        self: &Arc<Self>,
        stream: CudaStreamView<'_>,
        key: ArenaKey,
        ptr: DevicePtr,
        bytes: usize,
        size: usize,
    ) -> MrResult<()> {
        let addr = ptr.addr();
        let mut fence = FreeFence::new(key);
        if self.free_large_here(stream, ptr, bytes, size, &mut fence)? {
            return Ok(());
        }
        self.fence_on_freeing_stream(stream, &mut fence)?;
        loop {
            // This free may queue one: look at the oldest ones too, so that the queue stays
            // short even when allocations are served by kept superblocks and never reap it.
            let done = self.pending.take_completed(REAP_BATCH);
            let mut global = self.lock_global();
            self.release(&mut global, done);
            return match global.large_live.get(&addr).copied() {
                Some((live, origin)) if live == size => {
                    if !fence.on_legacy && needs_legacy_order(key.thread(), origin, false) {
                        // Recorded outside the global lock; then look again.
                        drop(global);
                        self.order_behind_legacy(&mut fence)?;
                        continue;
                    }
                    global.large_live.remove(&addr);
                    match fence.event.take() {
                        Some(event) => {
                            global.push_pending(&self.pending, addr, size, event);
                            Ok(())
                        }
                        None => match global.arena.deallocate(addr, size) {
                            Ok(true) => Ok(()),
                            Ok(false) => {
                                drop(global);
                                self.free_elsewhere(ptr, bytes, size, fence)
                            }
                            Err(e) => {
                                // Cannot happen (the block is live); keep the records
                                // consistent.
                                global.large_live.insert(addr, (live, origin));
                                Err(wrong_free(ptr, bytes, e))
                            }
                        },
                    }
                }
                Some((allocated, _)) => {
                    drop(global);
                    self.events.give_opt(fence.event.take());
                    Err(wrong_free(
                        ptr,
                        bytes,
                        ArenaError::SizeMismatch {
                            addr,
                            size: bytes,
                            allocated,
                        },
                    ))
                }
                // Not a live large allocation: a double free, or a wrong size for a small one.
                None => {
                    drop(global);
                    self.free_elsewhere(ptr, bytes, size, fence)
                }
            };
        }
    }

    /// The freeing stream's own part of a large free, without any event of the freeing stream:
    /// the block is in one of its arena's superblocks (freed there at once, as small frees
    /// are, see [`free_into`](Self::free_into)), or it is the only block of a superblock the
    /// global arena holds and the arena may keep that superblock for its stream
    /// ([`GlobalState::keep`]). `Ok(false)`: neither.
    fn free_large_here(
        self: &Arc<Self>,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        size: usize,
        fence: &mut FreeFence,
    ) -> MrResult<bool> {
        let key = fence.freeing;
        self.with_own_arena(key, stream, |cell, slot| {
            if self.free_into(key, slot, ptr, bytes, size, fence)? {
                return Ok(true);
            }
            let arenas = self.arena_count.load(Ordering::Relaxed);
            let kept = slot.arena.kept_free_bytes();
            let room = |free| keep_limit(self.size, arenas, free).saturating_sub(kept);
            // Decided first from the free bytes the global lock's last holder left: a free
            // the arena may not keep takes the global lock once (to queue it), not twice.
            if !may_keep(room(self.global_free.load(Ordering::Relaxed)), size) {
                return Ok(false);
            }
            let mut global = self.lock_global();
            let room = room(global.arena.free_bytes());
            if !may_keep(room, size) {
                return Ok(false);
            }
            Ok(global.keep(ptr.addr(), size, room, cell, slot))
        })
    }

    /// A free of a block that is not in the freeing stream's own arena: find its superblock
    /// through the global arena and the owner table (no scan of the arenas), then
    /// * in a local arena: free it there ([`free_into`](Self::free_into)); if that arena
    ///   belongs to another stream, it gets the fence and its stream waits on it before
    ///   reusing anything;
    /// * in the global arena: queue it as a pending free until the fence completes. Such a
    ///   block was allocated by a stream whose arena has since given its superblock back, so
    ///   on a per-thread default stream the fence is recorded on the legacy stream
    ///   ([`crate::util::cross_thread`]).
    ///
    /// Without a device (no event) the block is freed at once.
    fn free_elsewhere(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        size: usize,
        mut fence: FreeFence,
    ) -> MrResult<()> {
        let addr = ptr.addr();
        let fail = |fence: &mut FreeFence, error: ArenaError| {
            self.events.give_opt(fence.event.take());
            Err(wrong_free(ptr, bytes, error))
        };
        loop {
            let mut global = self.lock_global();
            if global.pending_addrs.contains(&addr) {
                drop(global);
                return fail(&mut fence, ArenaError::DoubleFree { addr, size: bytes });
            }
            let owner = match global.arena.find(addr) {
                None => {
                    drop(global);
                    return fail(&mut fence, ArenaError::NotFound { addr, size: bytes });
                }
                Some(SuperblockLocation::Global(_)) => {
                    if let Err(e) = global.check_live_in_global(addr, size) {
                        drop(global);
                        return fail(&mut fence, e);
                    }
                    if !fence.on_legacy
                        && needs_legacy_order(fence.freeing.thread(), Origin::Unknown, false)
                    {
                        // Recorded outside the global lock; then look again.
                        drop(global);
                        if let Err(e) = self.order_behind_legacy(&mut fence) {
                            self.events.give_opt(fence.event.take());
                            return Err(e);
                        }
                        continue;
                    }
                    match fence.event.take() {
                        Some(event) => global.push_pending(&self.pending, addr, size, event),
                        None => {
                            if let Err(e) = global.arena.deallocate(addr, size) {
                                return Err(wrong_free(ptr, bytes, e));
                            }
                        }
                    }
                    return Ok(());
                }
                Some(SuperblockLocation::Lent(span)) => match global.owners.get(&span.addr) {
                    Some(owner)
                        if owner.key() == ArenaKey::Retired
                            && !fence.on_legacy
                            && needs_legacy_order(
                                fence.freeing.thread(),
                                Origin::Unknown,
                                false,
                            ) =>
                    {
                        // A holding arena's superblocks go back to the global arena, where
                        // any stream may take the block, and whose stream allocated it is not
                        // known there: as for a block of the global arena, recorded outside
                        // the global lock; then look again.
                        drop(global);
                        if let Err(e) = self.order_behind_legacy(&mut fence) {
                            self.events.give_opt(fence.event.take());
                            return Err(e);
                        }
                        continue;
                    }
                    Some(owner) => Arc::clone(owner),
                    // An empty superblock on its way back to the global arena: all free.
                    None if global.in_transit.contains(span) => {
                        drop(global);
                        return fail(&mut fence, ArenaError::DoubleFree { addr, size: bytes });
                    }
                    None => {
                        drop(global);
                        log::error!("arena: lent superblock {span} has no recorded owner");
                        return fail(&mut fence, ArenaError::NotFound { addr, size: bytes });
                    }
                },
            };
            drop(global);
            let mut slot = owner.lock();
            if owner.is_retired() {
                // Cleaned meanwhile: look again.
                continue;
            }
            match self.free_into(owner.key(), &mut slot, ptr, bytes, size, &mut fence) {
                Ok(true) => return Ok(()),
                // Moved meanwhile: look again.
                Ok(false) => continue,
                Err(e) => {
                    drop(slot);
                    self.events.give_opt(fence.event.take());
                    return Err(e);
                }
            }
        }
    }

    // --- introspection ----------------------------------------------------------------------

    /// RMM's memory dump: the global arena (free memory, fragmentation, loans), the frees
    /// waiting for their streams, and a summary line per local arena.
    pub(super) fn memory_dump(&self, failed_request: Option<usize>) -> String {
        let mut cells: Vec<Arc<ArenaCell>> = read(&self.arenas).values().cloned().collect();
        cells.extend(lock(&self.holding).iter().cloned());
        let locals: Vec<(ArenaKey, String, usize, usize, usize)> = cells
            .iter()
            .map(|cell| {
                let slot = cell.lock();
                (
                    cell.key(),
                    slot.arena.stats().to_string(),
                    slot.arena.kept_superblock_count(),
                    slot.arena.kept_free_bytes(),
                    slot.fences.len(),
                )
            })
            .collect();
        let global = self.lock_global();
        let mut out = global.arena.dump(failed_request);
        let (pending, pending_bytes) = self.pending.stats();
        let _ = writeln!(
            out,
            "Large allocations live: {}; frees waiting for their stream: {pending} ({})",
            global.large_live.len(),
            format_bytes(pending_bytes)
        );
        let _ = writeln!(out, "Local arenas: {}", locals.len());
        if !global.in_transit.is_empty() {
            let _ = writeln!(
                out,
                "Superblocks on their way back to the global arena: {}",
                global.in_transit.len()
            );
        }
        for (key, stats, kept, kept_free, fences) in locals {
            let _ = writeln!(
                out,
                "  {key}: {stats}, {kept} kept for large requests ({} free), {fences} fence(s) \
                 to wait for",
                format_bytes(kept_free)
            );
        }
        out
    }

    /// Blocks until every pending free's stream has reached it, then releases them all.
    #[cfg(test)]
    pub(super) fn settle(&self) {
        let all = self.pending.take_all();
        for pending in &all {
            if let Err(e) = pending.event.synchronize() {
                log::error!("arena: {e}");
            }
        }
        let mut global = self.lock_global();
        self.release(&mut global, all);
        drop(global);
        // Kept superblocks are frees their stream may reuse at once: make them visible too.
        let cells: Vec<Arc<ArenaCell>> = read(&self.arenas).values().cloned().collect();
        // (Holding arenas wait for a reclaim: their streams are gone, nobody reuses them.)
        for cell in cells {
            let mut slot = cell.lock();
            self.lock_global().take_back_kept(&mut slot);
        }
    }

    /// The blocks handed out and not freed, `(address, size)` by address: the live blocks of
    /// every superblock, but those whose free is pending (tests).
    #[cfg(test)]
    pub(super) fn live_blocks(&self) -> Vec<(u64, usize)> {
        let mut cells: Vec<Arc<ArenaCell>> = read(&self.arenas).values().cloned().collect();
        cells.extend(lock(&self.holding).iter().cloned());
        let mut live = Vec::new();
        for cell in &cells {
            let slot = cell.lock();
            for sb in slot.arena.superblocks() {
                live.extend(sb.live_blocks().map(|b| (b.addr, b.size)));
            }
        }
        let global = self.lock_global();
        live.extend(global.arena.live_blocks().map(|b| (b.addr, b.size)));
        live.retain(|(addr, _)| !global.pending_addrs.contains(addr));
        live.sort_unstable();
        live
    }

    /// A reclaim ([`reclaim`](Self::reclaim)), as an allocation that found no room makes one
    /// (tests).
    #[cfg(test)]
    pub(super) fn reclaim_now(&self) -> MrResult<()> {
        self.relieve(Relief::Reclaim, None)
    }

    /// A defragmentation ([`defragment`](Self::defragment)), as an allocation that found no
    /// room after a reclaim makes one (tests).
    #[cfg(test)]
    pub(super) fn defragment_now(&self) -> MrResult<()> {
        self.relieve(Relief::Defragment, None)
    }

    /// The locks of this resource that are held now (by any thread, this one included): what
    /// tests check while the device is synchronized, when none may be.
    #[cfg(test)]
    pub(super) fn locks_held(&self) -> Vec<String> {
        let mut held = Vec::new();
        let mut cells = Vec::new();
        match self.arenas.try_write() {
            Ok(map) => cells.extend(map.values().cloned()),
            Err(_) => held.push("the map of arenas".to_owned()),
        }
        match self.holding.try_lock() {
            Ok(holding) => cells.extend(holding.iter().cloned()),
            Err(_) => held.push("the holding arenas".to_owned()),
        }
        for cell in cells {
            if cell.is_locked() {
                held.push(format!("the arena of {}", cell.key()));
            }
        }
        if self.global.try_lock().is_err() {
            held.push("the global arena".to_owned());
        }
        if self.relieving.try_lock().is_err() {
            held.push("the relief flag".to_owned());
        }
        if self.pending.is_locked() {
            held.push("the pending frees".to_owned());
        }
        if self.events.is_locked() {
            held.push("the event pool".to_owned());
        }
        held
    }

    /// The arena's first address.
    #[cfg(test)]
    pub(super) fn base_addr(&self) -> u64 {
        self.span.addr
    }

    /// Counters for tests.
    #[cfg(test)]
    pub(super) fn snapshot(&self) -> Snapshot {
        let arenas = read(&self.arenas).len();
        let holding = lock(&self.holding).len();
        let global = self.lock_global();
        Snapshot {
            holding,
            free_blocks: global.arena.free_block_count(),
            lent_superblocks: global.arena.lent_superblock_count(),
            fully_coalesced: global.arena.is_fully_coalesced(),
            arenas,
            pending: self.pending.stats().0,
            large_live: global.large_live.len(),
        }
    }
}

/// What tests look at.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot {
    /// Free blocks of the global arena.
    pub(super) free_blocks: usize,
    pub(super) lent_superblocks: usize,
    pub(super) fully_coalesced: bool,
    pub(super) arenas: usize,
    /// Holding arenas of destroyed streams' superblocks.
    pub(super) holding: usize,
    pub(super) pending: usize,
    pub(super) large_live: usize,
}

impl<U: DeviceMemoryResource> ThreadExit for State<U> {
    /// RMM's `arena_cleaner`: the exiting thread's arena goes back to the global arena. Unlike
    /// RMM, the thread first waits for its per-thread default stream and for the fences other
    /// streams left in its arena, so that another stream acquiring these superblocks cannot
    /// overwrite memory the thread's last work still uses. It waits with no lock held.
    fn thread_exited(&self, cell: &Arc<ArenaCell>) {
        if self.gpu {
            if let Err(e) = CudaStreamView::per_thread().synchronize() {
                log::warn!(
                    "arena: an exiting thread could not synchronize its per-thread stream \
                     ({e}); its superblocks wait for the next defragmentation"
                );
                return;
            }
        }
        {
            let mut map = write(&self.arenas);
            if map.get(&cell.key()).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                map.remove(&cell.key());
            }
            self.arena_count.store(map.len(), Ordering::Relaxed);
        }
        // Wait for the fences other streams left here with the arena unlocked (a cross-arena
        // free into it must not wait for that), until none is left under the lock.
        let mut slot = loop {
            let mut slot = cell.lock();
            if cell.is_retired() {
                return;
            }
            let fences = std::mem::take(&mut slot.fences);
            if fences.is_empty() {
                break slot;
            }
            drop(slot);
            for event in fences {
                if let Err(e) = event.synchronize() {
                    log::warn!("arena: waiting for a fence at thread exit: {e}");
                }
                self.events.give(event);
            }
        };
        let mut global = self.lock_global();
        global.take_back(&mut slot);
        drop(global);
        if slot.arena.superblock_count() == 0 {
            cell.retire(&mut slot);
        } else {
            // Refused superblocks (a bug): leave them to defragmentation.
            drop(slot);
            let mut map = write(&self.arenas);
            map.insert(cell.key(), Arc::clone(cell));
            self.arena_count.store(map.len(), Ordering::Relaxed);
        }
    }
}

impl<U: DeviceMemoryResource> Drop for State<U> {
    fn drop(&mut self) {
        let gpu = self.gpu;
        let arenas = std::mem::take(
            self.arenas
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let holding = std::mem::take(
            self.holding
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let global = self
            .global
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for cell in arenas.values().chain(holding.iter()) {
            let mut slot = cell.lock();
            for event in std::mem::take(&mut slot.fences) {
                if gpu {
                    if let Err(e) = event.synchronize() {
                        log::warn!("arena: {e}");
                    }
                }
            }
            global.take_back(&mut slot);
            cell.retire(&mut slot);
        }
        for pending in self.pending.take_all() {
            if gpu {
                if let Err(e) = pending.event.synchronize() {
                    log::warn!("arena: {e}");
                }
            }
            if let Err(e) = global.arena.deallocate(pending.addr, pending.size) {
                log::warn!("arena: {e}");
            }
        }
        global.pending_addrs.clear();
        if !global.arena.is_fully_coalesced() {
            let stats = global.arena.stats();
            log::warn!(
                "arena_memory_resource dropped with {} still allocated in {} block(s)",
                format_bytes(stats.live_bytes),
                stats.live_blocks
            );
        }
        // SAFETY: the arena is gone; nothing will hand out or use its memory through this
        // resource again (outstanding allocations are the caller's bug, as in RMM, which frees
        // the arena regardless).
        let freed = unsafe { Self::free_upstream(&self.upstream, gpu, self.base, self.size) };
        if let Err(e) = freed {
            log::error!("arena: returning the arena to the upstream resource failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::keep_limit;

    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    /// The arenas share 1/64 of a large arena at least; small arenas keep up to 16 MiB each
    /// (at most a quarter of the arena).
    #[test]
    fn kept_memory_has_a_shared_floor() {
        assert_eq!(keep_limit(64 * GIB, 1, 0), GIB);
        assert_eq!(keep_limit(64 * GIB, 0, 0), GIB);
        assert_eq!(keep_limit(64 * GIB, 16, 0), 64 * MIB);
        assert_eq!(keep_limit(36 * GIB, 16, 0), 36 * MIB);
        assert_eq!(keep_limit(GIB, 16, 0), 16 * MIB);
        assert_eq!(keep_limit(16 * MIB, 1, 0), 4 * MIB);
        assert_eq!(keep_limit(256 * MIB, 3, 0), 16 * MIB);
    }

    /// Above the floor, the arenas share a quarter of the global arena's free memory: much
    /// while the arena is mostly free, the floor as it fills.
    #[test]
    fn kept_memory_follows_the_free_memory() {
        assert_eq!(keep_limit(64 * GIB, 16, 32 * GIB), 512 * MIB);
        assert_eq!(keep_limit(64 * GIB, 1, 32 * GIB), 8 * GIB);
        assert_eq!(keep_limit(64 * GIB, 16, 4 * GIB), 64 * MIB);
        assert_eq!(keep_limit(64 * GIB, 16, 2 * GIB), 64 * MIB);
        assert_eq!(keep_limit(64 * GIB, 0, 64 * GIB), 16 * GIB);
    }
}
