//! The per-stream free lists of the stream-ordered sub-allocators (pool and fixed-size): how a
//! stream is keyed ([`StreamKey`]: the legacy stream, one per-thread default stream per host
//! thread, `cuStreamGetId` for the others), the event each list carries, and the lazy rule that
//! decides when an event must be recorded and what a thief waits on ([`ListState`], driving the
//! pure [`EventPolicy`]). Why and how:
//! `docs/internals/stream-ordered.md`, "Stream keys and events".

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rmm_stream::{CudaEvent, CudaStreamView};
use rmm_sys::{CudaResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

use crate::stream_ordered::event_policy::{EventPolicy, StealAction};
use crate::util::cross_thread::Origin;

/// Which free list a stream's blocks go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StreamKey {
    /// The legacy default stream (`CU_STREAM_LEGACY`, or handle 0 in legacy mode).
    Legacy,
    /// The per-thread default stream of the host thread with this number.
    PerThread(u64),
    /// An ordinary stream, by `cuStreamGetId`.
    Stream(u64),
}

impl StreamKey {
    /// The key of `stream`. Makes a CUDA call (`cuStreamGetId`) only for ordinary streams.
    #[inline]
    pub(crate) fn of(stream: CudaStreamView<'_>) -> CudaResult<Self> {
        // `as_raw` resolves handle 0 by the default-stream mode, so this is exactly
        // `is_default()` / `is_per_thread_default()`, in one inlined comparison.
        let raw = stream.as_raw();
        if raw.is_null() || raw == CU_STREAM_LEGACY {
            Ok(Self::Legacy)
        } else if raw == CU_STREAM_PER_THREAD {
            Ok(Self::PerThread(thread_number()))
        } else {
            stream.id().map(Self::Stream)
        }
    }

    /// Whether this is the legacy or a per-thread default stream (streams that never die, whose
    /// event recording is deferred to steal time).
    pub(crate) fn is_special(self) -> bool {
        !matches!(self, Self::Stream(_))
    }

    /// The thread whose per-thread default stream this is, if it is one.
    #[inline]
    pub(crate) fn per_thread(self) -> Option<u64> {
        match self {
            Self::PerThread(t) => Some(t),
            Self::Legacy | Self::Stream(_) => None,
        }
    }

    /// The [`Origin`] of a block allocated on this stream.
    #[inline]
    pub(crate) fn origin(self) -> Origin {
        match self {
            Self::PerThread(t) => Origin::Thread(t),
            Self::Legacy | Self::Stream(_) => Origin::Shared,
        }
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_NUMBER: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// A process-unique number of the calling thread (never reused). During thread-local
/// destruction a fresh number is returned: such a late caller gets a list of its own, which is
/// correct (per-thread lists record at steal time), merely unshared.
pub(crate) fn thread_number() -> u64 {
    THREAD_NUMBER
        .try_with(|n| *n)
        .unwrap_or_else(|_| NEXT_THREAD.fetch_add(1, Ordering::Relaxed))
}

/// `cuCtxSynchronize`: blocks until all work of the current context, on every stream
/// (non-blocking ones included), has completed.
pub(crate) fn device_synchronize() -> CudaResult<()> {
    rmm_sys::device_synchronize()
}

/// One stream's free list with its event.
#[derive(Debug)]
pub(crate) struct StreamList<L> {
    key: StreamKey,
    state: Mutex<ListState<L>>,
}

impl<L> StreamList<L> {
    /// An empty list for `key`.
    pub(crate) fn new(key: StreamKey, blocks: L) -> Self {
        Self {
            key,
            state: Mutex::new(ListState {
                blocks,
                event: None,
                policy: EventPolicy::default(),
            }),
        }
    }

    /// The key.
    pub(crate) fn key(&self) -> StreamKey {
        self.key
    }

    /// Locks the list. Never held together with another list's lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ListState<L>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The locked part of a [`StreamList`].
#[derive(Debug)]
pub(crate) struct ListState<L> {
    /// The free blocks.
    pub(crate) blocks: L,
    /// Created on the first record; `Some` means it was recorded at least once.
    event: Option<CudaEvent>,
    /// When an ordinary stream's list records, and what a thief must do first (see
    /// [`EventPolicy`]).
    policy: EventPolicy,
}

impl<L> ListState<L> {
    fn event(&mut self) -> CudaResult<&CudaEvent> {
        if self.event.is_none() {
            self.event = Some(CudaEvent::new()?);
        }
        // Just set when it was `None`.
        self.event
            .as_ref()
            .ok_or(rmm_sys::CudaError::DriverNotFound)
    }

    /// Blocks entered the list on `stream` (a free, a merge, a new chunk): records the list's
    /// event when the rule asks for it (an ordinary stream of an eager pool whose
    /// [`EventPolicy`] says so), else marks the list unrecorded.
    #[inline]
    pub(crate) fn publish(&mut self, key: StreamKey, stream: CudaStreamView<'_>, eager: bool) {
        if key.is_special() || !eager {
            return;
        }
        if self.policy.on_enter() {
            self.record(stream);
        }
    }

    /// The owner allocates from the list on `stream`: answers a thief's request to record.
    #[inline]
    pub(crate) fn serve(&mut self, key: StreamKey, stream: CudaStreamView<'_>) {
        if !key.is_special() && self.policy.on_owner_allocate() {
            self.record(stream);
        }
    }

    /// The pool turned eager: this list's blocks were freed without an event.
    pub(crate) fn mark_unrecorded(&mut self) {
        self.policy.mark_unrecorded();
    }

    /// Whether some blocks of an ordinary stream's list are covered by no event (a thief would
    /// have to ask for them or synchronize the device).
    pub(crate) fn is_uncovered(&self) -> bool {
        self.policy.is_uncovered()
    }

    /// Records the event on `stream`; when that fails the policy makes the next thief
    /// synchronize the device instead of waiting on the event.
    #[cold]
    fn record(&mut self, stream: CudaStreamView<'_>) {
        if let Err(e) = self.event().and_then(|ev| ev.record(stream)) {
            log::warn!(
                "rmm: could not record a pool event on stream {stream} ({e}); the next thief \
                 of its blocks will synchronize the device instead"
            );
            self.policy.record_failed();
        }
    }

    /// Makes `thief` wait for all work that may still use this list's free blocks (see the
    /// [module documentation](self)). `Ok(false)`: not now (an ordinary stream's list with
    /// blocks no event covers; its owner has been asked to record), look elsewhere.
    pub(crate) fn prepare_steal(
        &mut self,
        key: StreamKey,
        thief: CudaStreamView<'_>,
    ) -> CudaResult<bool> {
        let on = match key {
            StreamKey::Legacy => CudaStreamView::legacy(),
            StreamKey::PerThread(owner) if owner == thread_number() => CudaStreamView::per_thread(),
            StreamKey::PerThread(_) => CudaStreamView::legacy(),
            StreamKey::Stream(_) => {
                return match self.policy.on_steal(Instant::now()) {
                    StealAction::Ask => Ok(false),
                    StealAction::SyncDevice => {
                        device_synchronize()?;
                        self.policy.synchronized();
                        Ok(true)
                    }
                    // Covered: recorded after every block that entered, or never needed.
                    StealAction::WaitEvent => match &self.event {
                        Some(ev) => ev.wait(thief).map(|()| true),
                        None => Ok(true),
                    },
                };
            }
        };
        let ev = self.event()?;
        ev.record(on)?;
        ev.wait(thief)?;
        Ok(true)
    }
}

/// A slot of the per-thread list cache: in the resource numbered `pool`, `key`'s list is list
/// number `index`.
#[derive(Debug, Clone, Copy)]
struct CacheSlot {
    pool: u64,
    key: StreamKey,
    index: usize,
}

/// Number of slots of the per-thread list cache (a binning resource's bins are several pools,
/// and a thread may use several streams).
const CACHE_SLOTS: usize = 16;

/// Per-thread cache of `(pool, key) -> list index`, so the same-stream path takes no shared
/// lock to find its list. Pools have process-unique numbers, so an entry never matches another
/// pool; a pool never removes a list, so an entry of a live pool stays right; entries hold plain
/// numbers, so a dropped pool leaves nothing alive behind (its entries are merely overwritten
/// later).
struct ListCache {
    slots: [Option<CacheSlot>; CACHE_SLOTS],
    /// The slot of the last hit or insertion (looked at first).
    last: usize,
    /// The next slot to overwrite.
    next: usize,
}

thread_local! {
    static LIST_CACHE: RefCell<ListCache> = const {
        RefCell::new(ListCache {
            slots: [None; CACHE_SLOTS],
            last: 0,
            next: 0,
        })
    };
}

/// The index of `key`'s list in pool `pool`, if this thread has seen it.
#[inline]
pub(crate) fn cached_list_index(pool: u64, key: StreamKey) -> Option<usize> {
    LIST_CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let hit = |s: &Option<CacheSlot>| s.is_some_and(|s| s.pool == pool && s.key == key);
            if hit(&c.slots[c.last]) {
                return c.slots[c.last].map(|s| s.index);
            }
            let i = c.slots.iter().position(hit)?;
            c.last = i;
            c.slots[i].map(|s| s.index)
        })
        .ok()
        .flatten()
}

/// Remembers in this thread's cache that `key`'s list in pool `pool` is list number `index`.
pub(crate) fn remember_list_index(pool: u64, key: StreamKey, index: usize) {
    let _ = LIST_CACHE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return;
        };
        let slot = Some(CacheSlot { pool, key, index });
        // Replace the entry of the same key, else round robin.
        let same = c
            .slots
            .iter()
            .position(|s| s.is_some_and(|s| s.pool == pool && s.key == key));
        let i = same.unwrap_or(c.next);
        if same.is_none() {
            c.next = (i + 1) % CACHE_SLOTS;
        }
        c.slots[i] = slot;
        c.last = i;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_keys_need_no_cuda() {
        assert_eq!(
            StreamKey::of(CudaStreamView::legacy()).unwrap(),
            StreamKey::Legacy
        );
        let here = StreamKey::of(CudaStreamView::per_thread()).unwrap();
        assert_eq!(here, StreamKey::PerThread(thread_number()));
        assert!(here.is_special() && StreamKey::Legacy.is_special());
        assert!(!StreamKey::Stream(7).is_special());
        let there = std::thread::spawn(|| StreamKey::of(CudaStreamView::per_thread()).unwrap())
            .join()
            .unwrap();
        assert_ne!(here, there, "two threads share a per-thread list");
    }

    #[test]
    fn cache_is_per_pool_and_per_key() {
        remember_list_index(1, StreamKey::Legacy, 7);
        assert_eq!(cached_list_index(1, StreamKey::Legacy), Some(7));
        assert_eq!(cached_list_index(2, StreamKey::Legacy), None);
        assert_eq!(cached_list_index(1, StreamKey::Stream(1)), None);
        remember_list_index(1, StreamKey::Legacy, 8);
        assert_eq!(
            cached_list_index(1, StreamKey::Legacy),
            Some(8),
            "stale entry"
        );
        // More pools than slots: the oldest entries are replaced, nothing breaks.
        for p in 10..10 + 2 * CACHE_SLOTS as u64 {
            remember_list_index(p, StreamKey::Stream(p), p as usize);
        }
        let last = 9 + 2 * CACHE_SLOTS as u64;
        assert_eq!(
            cached_list_index(last, StreamKey::Stream(last)),
            Some(last as usize)
        );
        assert_eq!(cached_list_index(10, StreamKey::Stream(10)), None);
        assert_eq!(cached_list_index(1, StreamKey::Legacy), None);
        // Another thread has its own cache.
        let there = std::thread::spawn(move || cached_list_index(last, StreamKey::Stream(last)))
            .join()
            .unwrap();
        assert_eq!(there, None);
    }

    #[test]
    fn publish_is_lazy() {
        let list = StreamList::new(StreamKey::Stream(3), ());
        let mut g = list.lock();
        // Not eager: nothing recorded, no CUDA call, nothing marked.
        g.publish(list.key(), CudaStreamView::legacy(), false);
        assert!(g.event.is_none() && !g.policy.is_record_failed() && !g.is_uncovered());
        // Special keys never record at publish time.
        g.publish(StreamKey::Legacy, CudaStreamView::legacy(), true);
        g.publish(StreamKey::PerThread(1), CudaStreamView::legacy(), true);
        assert!(g.event.is_none() && !g.policy.is_record_failed() && !g.is_uncovered());
        // Eager and ordinary, no thief yet: nothing recorded, the list is unrecorded.
        g.publish(list.key(), CudaStreamView::legacy(), true);
        assert!(g.event.is_none() && !g.policy.is_record_failed() && g.is_uncovered());
        // A thief asks (no CUDA call), and cannot take yet.
        assert!(!g
            .prepare_steal(list.key(), CudaStreamView::legacy())
            .unwrap());
        assert!(g.event.is_none() && g.policy.is_wanted());
        if !rmm_sys::is_driver_present() {
            // The owner's next free answers; the record fails without a driver, and the list
            // falls back to a device synchronization by its next thief.
            g.publish(list.key(), CudaStreamView::legacy(), true);
            assert!(g.event.is_none() && g.policy.is_record_failed() && !g.policy.is_wanted());
        }
    }
}
