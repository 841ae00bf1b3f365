//! The per-stream free lists of the stream-ordered sub-allocators (pool and fixed-size): how a
//! stream is keyed ([`StreamKey`]: the legacy stream, one per-thread default stream per host
//! thread, `cuStreamGetId` for the others), the event each list carries, and the lazy rule that
//! decides when an event must be recorded and what a thief waits on ([`ListState`], driving the
//! pure [`EventPolicy`]), and the orphan list that takes the blocks of retired lists. Why and
//! how: `docs/internals/stream-ordered.md`, "Stream keys and events" and "Retiring lists".

use std::cell::Cell;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use rmm_stream::{CudaEvent, CudaStreamView, StreamLife};
use rmm_sys::{CudaResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

pub(crate) use crate::stream_ordered::event_policy::{EventPolicy, Steal};
use crate::stream_ordered::free_blocks::FreeBlocks;
use crate::sync::{Mutex, MutexGuard};
use crate::util::cross_thread::Origin;
pub(crate) use crate::util::thread_life::thread_number;

/// Which free list a stream's blocks go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StreamKey {
    /// The legacy default stream (`CU_STREAM_LEGACY`, or handle 0 in legacy mode).
    Legacy,
    /// The per-thread default stream of the host thread with this number.
    PerThread(u64),
    /// An ordinary stream, by `cuStreamGetId`.
    Stream(u64),
    /// Not a stream: the orphan list, which holds the blocks of retired lists (never a caller's
    /// key).
    Orphan,
}

impl StreamKey {
    /// Whether `stream` is the legacy default stream (no CUDA call).
    #[inline]
    pub(crate) fn is_legacy(stream: CudaStreamView<'_>) -> bool {
        let raw = stream.as_raw();
        raw.is_null() || raw == CU_STREAM_LEGACY
    }

    /// The key of `stream`. Makes a CUDA call (`cuStreamGetId`) only for ordinary streams.
    #[inline]
    pub(crate) fn of(stream: CudaStreamView<'_>) -> CudaResult<Self> {
        // `as_raw` resolves handle 0 by the default-stream mode, so this is exactly
        // `is_default()` / `is_per_thread_default()`, in inlined comparisons.
        if Self::is_legacy(stream) {
            Ok(Self::Legacy)
        } else if stream.as_raw() == CU_STREAM_PER_THREAD {
            Ok(Self::PerThread(thread_number()))
        } else {
            stream.id().map(Self::Stream)
        }
    }

    /// The thread whose per-thread default stream this is, if it is one.
    #[inline]
    pub(crate) fn per_thread(self) -> Option<u64> {
        match self {
            Self::PerThread(t) => Some(t),
            Self::Legacy | Self::Stream(_) | Self::Orphan => None,
        }
    }

    /// The [`Origin`] of a block allocated on this stream.
    #[inline]
    pub(crate) fn origin(self) -> Origin {
        self.per_thread().map_or(Origin::Shared, Origin::Thread)
    }
}

/// `cuCtxSynchronize`: blocks until all work of the current context, on every stream
/// (non-blocking ones included), has completed. (Tests watch it with
/// `rmm_sys::fault::watch(DriverCall::Synchronize, ..)` to check what is locked meanwhile.)
pub(crate) use rmm_sys::device_synchronize;

/// One slot of a resource's list storage: a stream's free list with its event, or a free slot
/// (a retired list's, until a new key takes it). The key lives under the lock, so a caller that
/// found the slot through a cache checks, at no extra cost, that it is still its list.
///
/// Cache-padded: the lists of a resource lie next to one another (in its `AppendOnlyVec`), and
/// each is written at every operation by the thread whose stream it serves (its lock, its free
/// list, its event policy). Unpadded, the last bytes of one list and the lock of the next share
/// a cache line, which then moves between the two threads' cores at every operation of either.
///
/// Its lock (from `crate::sync`, loom's under `--cfg loom`) is never held together with another
/// list's.
pub(crate) type StreamList<L> = CachePadded<Mutex<ListState<L>>>;

/// A locked [`StreamList`].
pub(crate) type ListGuard<'a, L> = MutexGuard<'a, ListState<L>>;

/// A list for `key` (`None`: a free slot).
pub(crate) fn new_list<L>(key: Option<StreamKey>, blocks: L) -> StreamList<L> {
    CachePadded::new(Mutex::new(ListState {
        key,
        blocks,
        event: None,
        policy: EventPolicy::default(),
        waits: Vec::new(),
        owner: None,
    }))
}

/// The locked part of a [`StreamList`].
#[derive(Debug)]
pub(crate) struct ListState<L> {
    /// Whose list this is; `None` for a free slot.
    key: Option<StreamKey>,
    /// The free blocks.
    pub(crate) blocks: L,
    /// Created on the first record; `Some` means it was recorded at least once.
    event: Option<CudaEvent>,
    /// When an ordinary stream's list records, and what a thief must do first (see
    /// [`EventPolicy`]); for the orphan list, whether its thief waits on `waits` or synchronizes.
    /// The core reads it, and marks a list unrecorded when the pool turns eager.
    pub(crate) policy: EventPolicy,
    /// The orphan list only: the events of the retired lists whose blocks it holds (each
    /// recorded after its list's last block entered), at most [`ORPHAN_EVENTS`]; a thief waits
    /// on all of them.
    waits: Vec<CudaEvent>,
    /// An ordinary stream's list whose stream is an rmm-stream `CudaStream`: its life, which a
    /// thief pins to record the list's event on that stream itself
    /// ([`EventPolicy::on_steal_pinned`]).
    owner: Option<StreamLife>,
}

/// The capacity of the orphan list's `waits`: a thief makes one stream wait per event, and
/// one device synchronization covers any number, so the list keeps a few (blocks of retired
/// lists are rare) and past them counts its blocks as uncovered.
const ORPHAN_EVENTS: usize = 8;

impl<L> ListState<L> {
    /// Whose list this is (`None`: a free slot).
    #[inline]
    pub(crate) fn key(&self) -> Option<StreamKey> {
        self.key
    }

    /// Gives the free slot to `key`; `owner`: the life of its stream when that is an owning
    /// rmm-stream stream (ordinary keys only).
    pub(crate) fn assign(&mut self, key: StreamKey, owner: Option<StreamLife>) {
        // A free slot is as `new_list` made it: `retire` left no event, policy or waits.
        debug_assert!(self.key.is_none() && self.event.is_none() && self.waits.is_empty());
        self.key = Some(key);
        self.owner = owner.filter(|_| matches!(key, StreamKey::Stream(_)));
    }

    /// Retires the list if it is still `key`'s: its blocks (replaced by `empty`), its event
    /// (recorded after every block when covered) and whether the event, or nothing when there
    /// is none, covers every block (no block entered unrecorded, no record failed) go to the
    /// caller, and the slot becomes free as a new list's.
    pub(crate) fn retire(
        &mut self,
        key: StreamKey,
        empty: L,
    ) -> Option<(L, Option<CudaEvent>, bool)> {
        if self.key != Some(key) {
            return None;
        }
        self.key = None;
        self.waits.clear();
        self.owner = None;
        let blocks = std::mem::replace(&mut self.blocks, empty);
        Some((
            blocks,
            self.event.take(),
            !std::mem::take(&mut self.policy).is_uncovered(),
        ))
    }

    /// The list's event, created on first use.
    fn event(&mut self) -> CudaResult<&CudaEvent> {
        match &mut self.event {
            Some(event) => Ok(event),
            none => Ok(none.insert(CudaEvent::new()?)),
        }
    }

    /// Blocks entered the list on `stream` (a free, a merge, a new chunk): records the list's
    /// event when the rule asks for it (an ordinary stream of an eager pool whose
    /// [`EventPolicy`] says so), else marks the list unrecorded.
    #[inline]
    pub(crate) fn publish(&mut self, stream: CudaStreamView<'_>, eager: bool) {
        let ordinary = matches!(self.key, Some(StreamKey::Stream(_)));
        if ordinary && eager && self.policy.on_enter() {
            self.record(stream);
        }
    }

    /// The owner allocates from the list on `stream`: answers a thief's request to record.
    #[inline]
    pub(crate) fn serve(&mut self, stream: CudaStreamView<'_>) {
        if matches!(self.key, Some(StreamKey::Stream(_))) && self.policy.on_owner_allocate() {
            self.record(stream);
        }
    }

    /// A thief synchronized the device after taking `snapshot` (see [`Steal::AfterSync`]); the
    /// orphan list forgets the events it no longer needs (only it has `waits`).
    pub(crate) fn synchronized_since(&mut self, snapshot: u64) {
        if self.policy.synchronized_since(snapshot) {
            self.waits.clear();
        }
    }

    /// Records the event on `stream`; when that fails (`false`) the policy makes the next thief
    /// synchronize the device instead of waiting on the event.
    #[cold]
    fn record(&mut self, stream: CudaStreamView<'_>) -> bool {
        let Err(e) = self.event().and_then(|ev| ev.record(stream)) else {
            return true;
        };
        log::warn!(
            "rmm: could not record a pool event on stream {stream} ({e}); the next thief of its \
             blocks will synchronize the device instead"
        );
        self.policy.record_failed();
        false
    }

    /// Makes `thief` wait for all work that may still use this list's free blocks (see the
    /// [module documentation](self)), or says what else to do ([`Steal`]). A list that needs a
    /// device synchronization answers [`Steal::NotNow`] unless `may_sync`. The calls made here
    /// (event records, stream waits) do not block the host.
    pub(crate) fn prepare_steal(
        &mut self,
        thief: CudaStreamView<'_>,
        may_sync: bool,
    ) -> CudaResult<Steal> {
        let on = match self.key {
            None => return Ok(Steal::NotNow),
            Some(StreamKey::Legacy) => CudaStreamView::legacy(),
            Some(StreamKey::PerThread(owner)) if owner == thread_number() => {
                CudaStreamView::per_thread()
            }
            Some(StreamKey::PerThread(_)) => CudaStreamView::legacy(),
            Some(StreamKey::Stream(_) | StreamKey::Orphan) => {
                // An owning stream that is still alive stays so while pinned: the thief may
                // record on it itself. Other lists follow the ask / synchronize rule.
                let answer = match self.owner.as_ref().and_then(StreamLife::pin) {
                    // The pin goes once the record is made.
                    Some(pin) => {
                        if self.policy.on_steal_pinned() && !self.record(pin.view()) {
                            return Ok(Steal::NotNow);
                        }
                        Steal::Now
                    }
                    None => self.policy.on_steal(Instant::now(), may_sync),
                };
                if answer == Steal::Now {
                    // Covered: recorded after every block that entered, or never needed (only
                    // the orphan list has `waits`; it is never pinned).
                    for ev in self.event.iter().chain(&self.waits) {
                        ev.wait(thief)?;
                    }
                }
                return Ok(answer);
            }
        };
        let ev = self.event()?;
        ev.record(on)?;
        ev.wait(thief)?;
        Ok(Steal::Now)
    }
}

/// What the orphan list does with its blocks (it needs to know whether it has any).
impl<L: FreeBlocks> ListState<L> {
    /// Blocks left the list: the orphan list forgets its events once it is empty.
    pub(crate) fn after_take(&mut self) {
        if self.key == Some(StreamKey::Orphan) && self.blocks.is_empty() {
            self.policy.covered_all();
            self.waits.clear();
        }
    }

    /// The orphan list takes `blocks`: `covered` when `event` (if any) was recorded after every
    /// one of them. On error (an inconsistency) the blocks not taken are dropped (lost).
    pub(crate) fn adopt(
        &mut self,
        mut blocks: L,
        event: Option<CudaEvent>,
        covered: bool,
    ) -> Result<(), String> {
        debug_assert_eq!(self.key, Some(StreamKey::Orphan));
        if blocks.is_empty() {
            return Ok(());
        }
        let absorbed = self.blocks.absorb(&mut blocks);
        // Even a partial absorb brought blocks in: count them (uncovered if it failed).
        let room = self.waits.len() < ORPHAN_EVENTS;
        if self.policy.on_orphaned(covered && absorbed.is_ok() && room) {
            self.waits.extend(event);
        } else {
            // The next thief synchronizes the device, which covers what the events would.
            self.waits.clear();
        }
        absorbed
    }
}

/// A slot of the per-thread list cache: in the resource numbered `pool`, `key`'s list is at
/// address `list` (in the resource's append-only list storage, where it never moves while the
/// resource lives).
#[derive(Debug, Clone, Copy)]
struct CacheSlot {
    pool: u64,
    key: StreamKey,
    list: *const (),
}

/// Number of slots of the per-thread list cache (a binning resource's bins are several pools,
/// and a thread may use several streams).
const CACHE_SLOTS: usize = 16;

/// Per-thread cache of `(pool, key) -> list index`, so the same-stream path takes no shared
/// lock to find its list. Pools have process-unique numbers, so an entry never matches another
/// pool; a slot whose list was retired (and maybe given to another key) is caught by the key
/// check under the list's lock, and the entry is then replaced; entries hold plain numbers, so
/// a dropped pool leaves nothing alive behind (its entries are merely overwritten later).
struct ListCache {
    slots: [Cell<Option<CacheSlot>>; CACHE_SLOTS],
    /// The slot of the last hit or insertion (looked at first).
    last: Cell<usize>,
    /// The next slot to overwrite.
    next: Cell<usize>,
}

thread_local! {
    // Cells, not a `RefCell`: every access copies a slot in or out and calls nothing while it
    // holds one, so no borrow needs tracking.
    static LIST_CACHE: ListCache = const {
        ListCache {
            slots: [const { Cell::new(None) }; CACHE_SLOTS],
            last: Cell::new(0),
            next: Cell::new(0),
        }
    };
}

/// The slot of the list cache where `(pool, key)` goes when it is free or holds the same pair
/// (looked at first): pools have consecutive numbers, so a thread's lists of one stream in up
/// to [`CACHE_SLOTS`] pools (a binning resource's bins) have distinct home slots.
#[inline]
fn home_slot(pool: u64, key: StreamKey) -> usize {
    let k = match key {
        StreamKey::Legacy => 0,
        StreamKey::PerThread(t) => t,
        StreamKey::Stream(id) => !id,
        StreamKey::Orphan => 1,
    };
    (pool.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize) % CACHE_SLOTS
}

/// The address of `key`'s list in pool `pool` as [`remember_list`] was given it, if this
/// thread has seen it.
#[inline]
pub(crate) fn cached_list(pool: u64, key: StreamKey) -> Option<*const ()> {
    LIST_CACHE
        .try_with(
            |c| match c.slots.get(home_slot(pool, key)).and_then(Cell::get) {
                Some(s) if s.pool == pool && s.key == key => Some(s),
                _ => scan_list_cache(c, pool, key),
            },
        )
        .ok()
        .flatten()
        .map(|s| s.list)
}

/// [`cached_list`] past the home slot: the slot of the last hit, then every slot.
#[inline(never)]
fn scan_list_cache(c: &ListCache, pool: u64, key: StreamKey) -> Option<CacheSlot> {
    let hit = |s: Option<CacheSlot>| s.filter(|s| s.pool == pool && s.key == key);
    if let Some(s) = c.slots.get(c.last.get()).and_then(|s| hit(s.get())) {
        return Some(s);
    }
    let (i, s) = c
        .slots
        .iter()
        .enumerate()
        .find_map(|(i, s)| hit(s.get()).map(|s| (i, s)))?;
    c.last.set(i);
    Some(s)
}

/// Remembers in this thread's cache that `key`'s list in pool `pool` is at address `list`. The
/// address is only stored and handed back by [`cached_list`]: whoever
/// dereferences it vouches that pool `pool` is alive and keeps its lists in place (pool
/// numbers are process-unique and never reused, so an entry of a dropped pool is never asked
/// for).
pub(crate) fn remember_list(pool: u64, key: StreamKey, list: *const ()) {
    let _ = LIST_CACHE.try_with(|c| {
        // Replace the entry of the same key, else take the home slot if it is free, else
        // round robin.
        let home = home_slot(pool, key);
        let i = c
            .slots
            .iter()
            .position(|s| s.get().is_some_and(|s| s.pool == pool && s.key == key))
            .or_else(|| c.slots[home].get().is_none().then_some(home))
            .unwrap_or_else(|| {
                let next = c.next.get();
                c.next.set((next + 1) % CACHE_SLOTS);
                next
            });
        c.slots[i].set(Some(CacheSlot { pool, key, list }));
        c.last.set(i);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake list address (the cache only stores and returns it).
    fn at(n: usize) -> *const () {
        std::ptr::without_provenance(n)
    }

    /// The cached list address of `(pool, key)` as a number.
    fn cached(pool: u64, key: StreamKey) -> Option<usize> {
        cached_list(pool, key).map(|p| p.addr())
    }

    #[test]
    fn neighbouring_lists_share_no_cache_line() {
        let lists = crate::util::append_only::AppendOnlyVec::new();
        for _ in 0..3 {
            lists.push(new_list(None, [0u8; 100]));
        }
        for i in 0..3 {
            let list = lists.get(i).unwrap();
            let start = std::ptr::from_ref(list) as usize;
            assert_eq!(start % 64, 0, "list {i} starts inside a cache line");
            assert_eq!(
                std::mem::size_of_val(list) % 64,
                0,
                "list {i} ends inside one"
            );
        }
    }

    #[test]
    fn special_keys_need_no_cuda() {
        assert_eq!(
            StreamKey::of(CudaStreamView::legacy()).unwrap(),
            StreamKey::Legacy
        );
        let here = StreamKey::of(CudaStreamView::per_thread()).unwrap();
        assert_eq!(here, StreamKey::PerThread(thread_number()));
        let there = std::thread::spawn(|| StreamKey::of(CudaStreamView::per_thread()).unwrap())
            .join()
            .unwrap();
        assert_ne!(here, there, "two threads share a per-thread list");
    }

    #[test]
    fn cache_is_per_pool_and_per_key() {
        remember_list(1, StreamKey::Legacy, at(7));
        assert_eq!(cached(1, StreamKey::Legacy), Some(7));
        assert_eq!(cached(2, StreamKey::Legacy), None);
        assert_eq!(cached(1, StreamKey::Stream(1)), None);
        remember_list(1, StreamKey::Legacy, at(8));
        assert_eq!(cached(1, StreamKey::Legacy), Some(8), "stale entry");
        // More pools than slots: the oldest entries are replaced, nothing breaks.
        for p in 10..10 + 2 * CACHE_SLOTS as u64 {
            remember_list(p, StreamKey::Stream(p), at(p as usize));
        }
        let last = 9 + 2 * CACHE_SLOTS as u64;
        assert_eq!(cached(last, StreamKey::Stream(last)), Some(last as usize));
        assert_eq!(cached(10, StreamKey::Stream(10)), None);
        assert_eq!(cached(1, StreamKey::Legacy), None);
        // Another thread has its own cache.
        let there = std::thread::spawn(move || cached(last, StreamKey::Stream(last)))
            .join()
            .unwrap();
        assert_eq!(there, None);
    }

    #[test]
    fn one_key_in_consecutive_pools_is_found_in_its_home_slots() {
        std::thread::spawn(|| {
            // A fresh thread: an empty cache.
            let key = StreamKey::PerThread(thread_number());
            let pools = 1000..1000 + CACHE_SLOTS as u64;
            let homes: std::collections::HashSet<usize> =
                pools.clone().map(|p| home_slot(p, key)).collect();
            assert_eq!(homes.len(), CACHE_SLOTS, "home slots collide");
            for p in pools.clone() {
                remember_list(p, key, at(p as usize));
            }
            for p in pools {
                assert_eq!(cached(p, key), Some(p as usize));
                let home = LIST_CACHE.with(|c| c.slots[home_slot(p, key)].get());
                assert_eq!(
                    home.map(|s| s.pool),
                    Some(p),
                    "pool {p} is not in its home slot"
                );
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn publish_is_lazy() {
        let list = new_list(Some(StreamKey::Stream(3)), ());
        let mut g = list.lock();
        // Not eager: nothing recorded, no CUDA call, nothing marked.
        g.publish(CudaStreamView::legacy(), false);
        assert!(g.event.is_none() && !g.policy.is_record_failed() && !g.policy.is_uncovered());
        // Special keys never record at publish time.
        for key in [
            StreamKey::Legacy,
            StreamKey::PerThread(1),
            StreamKey::Orphan,
        ] {
            let special = new_list(Some(key), ());
            let mut s = special.lock();
            s.publish(CudaStreamView::legacy(), true);
            assert!(s.event.is_none() && !s.policy.is_record_failed() && !s.policy.is_uncovered());
        }
        // Eager and ordinary, no thief yet: nothing recorded, the list is unrecorded.
        g.publish(CudaStreamView::legacy(), true);
        assert!(g.event.is_none() && !g.policy.is_record_failed() && g.policy.is_uncovered());
        // A thief asks (no CUDA call), and cannot take yet.
        assert_eq!(
            g.prepare_steal(CudaStreamView::legacy(), true).unwrap(),
            Steal::NotNow
        );
        assert!(g.event.is_none() && g.policy.is_wanted());
        if !rmm_sys::is_driver_present() {
            // The owner's next free answers; the record fails without a driver, and the list
            // falls back to a device synchronization by its next thief, with the lock released.
            g.publish(CudaStreamView::legacy(), true);
            assert!(g.event.is_none() && g.policy.is_record_failed() && !g.policy.is_wanted());
            let snapshot = g.policy.entered();
            assert_eq!(
                g.prepare_steal(CudaStreamView::legacy(), false).unwrap(),
                Steal::NotNow,
                "synchronized where it may not"
            );
            assert_eq!(
                g.prepare_steal(CudaStreamView::legacy(), true).unwrap(),
                Steal::AfterSync(snapshot)
            );
            g.synchronized_since(snapshot);
            assert!(!g.policy.is_uncovered());
        }
    }

    #[test]
    fn a_free_slot_is_never_stolen_from_and_a_retired_list_keeps_its_coverage() {
        let list = new_list(None, ());
        let mut g = list.lock();
        assert_eq!(g.key(), None);
        assert_eq!(
            g.prepare_steal(CudaStreamView::legacy(), true).unwrap(),
            Steal::NotNow
        );
        assert!(g.retire(StreamKey::Stream(9), ()).is_none());
        g.assign(StreamKey::Stream(9), None);
        assert_eq!(g.key(), Some(StreamKey::Stream(9)));
        assert!(
            g.retire(StreamKey::Stream(8), ()).is_none(),
            "retired another key's list"
        );
        let ((), event, covered) = g.retire(StreamKey::Stream(9), ()).unwrap();
        assert!(covered && event.is_none());
        assert_eq!(g.key(), None);
        g.assign(StreamKey::Stream(10), None);
        g.publish(CudaStreamView::legacy(), true);
        let ((), _, covered) = g.retire(StreamKey::Stream(10), ()).unwrap();
        assert!(!covered, "an unrecorded list retired as covered");
        // Given to a new key, the slot starts afresh.
        g.assign(StreamKey::Stream(11), None);
        assert!(!g.policy.is_uncovered());
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
