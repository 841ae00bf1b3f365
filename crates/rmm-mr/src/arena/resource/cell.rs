//! [`ArenaCell`]: one per-thread or per-stream arena of the resource, behind its own lock, and
//! [`ArenaKey`], what selects it.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use rmm_stream::{CudaEvent, CudaStreamView, StreamLife};

use super::thread_cache::thread_serial;
use super::{lock, EventPool};
use crate::arena::LocalArena;
use crate::error::MrResult;
use crate::util::cross_thread::Origin;

/// Which local arena a stream uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ArenaKey {
    /// The per-thread default stream of the thread with this serial
    /// ([`thread_serial`](super::thread_cache::thread_serial)).
    Thread(u64),
    /// The legacy default stream (one arena for the whole process).
    Legacy,
    /// Another stream, by its driver id (unique per stream object, never reused).
    Stream(u64),
    /// The superblocks of the arenas of destroyed streams, or of every arena at a
    /// defragmentation, until a reclaim gives them back to the global arena (never in the map,
    /// never allocates: only frees land here).
    Retired,
}

impl ArenaKey {
    /// The key of `stream`. The per-thread default stream and the legacy default stream are
    /// recognised from the view alone, without any CUDA call; only other streams ask the driver
    /// for their id.
    #[inline]
    pub(super) fn of(stream: CudaStreamView<'_>) -> MrResult<Self> {
        if stream.is_per_thread_default() {
            Ok(Self::Thread(thread_serial()))
        } else if stream.is_default() {
            Ok(Self::Legacy)
        } else {
            Ok(Self::Stream(stream.id()?))
        }
    }

    /// The thread whose per-thread default stream this is, if it is one.
    #[inline]
    pub(super) fn thread(self) -> Option<u64> {
        match self {
            Self::Thread(serial) => Some(serial),
            Self::Legacy | Self::Stream(_) | Self::Retired => None,
        }
    }

    /// The [`Origin`] of a block allocated by this key's arena (or by the global arena for
    /// this key's stream).
    #[inline]
    pub(super) fn origin(self) -> Origin {
        match self {
            Self::Thread(serial) => Origin::Thread(serial),
            Self::Legacy | Self::Stream(_) | Self::Retired => Origin::Shared,
        }
    }
}

impl fmt::Display for ArenaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Thread(serial) => write!(f, "per-thread arena (thread #{serial})"),
            Self::Legacy => f.write_str("legacy default stream arena"),
            Self::Stream(id) => write!(f, "stream arena (stream id {id})"),
            Self::Retired => f.write_str("held superblocks (destroyed streams, defragmentation)"),
        }
    }
}

/// What an arena's lock protects.
///
/// Every block in the arena was allocated on the arena's own stream: the global arena lends
/// only fresh superblocks, so a superblock never arrives with blocks another stream allocated
/// or whose free is still pending.
#[derive(Debug, Default)]
pub(super) struct ArenaSlot {
    /// The superblocks and their blocks.
    pub(super) arena: LocalArena,
    /// Events recorded on other streams that freed blocks into this arena. The arena's own
    /// stream waits on all of them (device side) before this arena hands out any block.
    pub(super) fences: Vec<CudaEvent>,
}

impl ArenaSlot {
    /// Makes `stream` (this arena's stream) wait on every fence, then recycles them.
    #[inline]
    pub(super) fn wait_fences(
        &mut self,
        stream: CudaStreamView<'_>,
        events: &EventPool,
    ) -> MrResult<()> {
        if self.fences.is_empty() {
            return Ok(());
        }
        self.wait_fences_slow(stream, events)
    }

    /// [`wait_fences`](Self::wait_fences) when there are fences.
    #[cold]
    #[inline(never)]
    fn wait_fences_slow(&mut self, stream: CudaStreamView<'_>, events: &EventPool) -> MrResult<()> {
        while let Some(event) = self.fences.pop() {
            if let Err(e) = event.wait(stream) {
                self.fences.push(event);
                return Err(e.into());
            }
            events.give(event);
        }
        Ok(())
    }
}

/// A cell in use: in the map (or about to be), the arena of its key.
const CURRENT: u8 = 0;
/// A cell of [`ArenaKey::Retired`]: out of the map, its superblocks reachable through the
/// owner table until a reclaim takes them back.
const HOLDING: u8 = 1;
/// A cell whose superblocks are gone, for good.
const RETIRED: u8 = 2;

/// One local arena: a key, a lock, its owner's life and a state.
///
/// A cell is retired (for good) when its superblocks go back to the global arena at
/// defragmentation, at thread exit or when the resource is dropped, or move to the resource's
/// holding arena when its stream was destroyed; it is then out of the resource's map, and a
/// thread that still holds it (from its cache) looks the key up again. The state is only
/// changed while the cell's lock is held, so a holder of the lock sees a stable value.
#[derive(Debug)]
pub(super) struct ArenaCell {
    key: ArenaKey,
    /// The life of the stream of an [`ArenaKey::Stream`] made by rmm-stream (`None` for the
    /// other keys and for foreign streams, whose arenas live as long as the resource).
    life: Option<StreamLife>,
    state: AtomicU8,
    slot: Mutex<ArenaSlot>,
}

impl ArenaCell {
    /// The arena of `key`, whose stream is `stream`.
    pub(super) fn new(key: ArenaKey, stream: CudaStreamView<'_>) -> Self {
        let life = match key {
            ArenaKey::Stream(_) => stream.life(),
            ArenaKey::Thread(_) | ArenaKey::Legacy | ArenaKey::Retired => None,
        };
        Self {
            key,
            life,
            state: AtomicU8::new(CURRENT),
            slot: Mutex::default(),
        }
    }

    /// A holding arena ([`ArenaKey::Retired`]) for the superblocks of destroyed streams, or of
    /// every arena at a defragmentation.
    pub(super) fn holding() -> Self {
        Self {
            key: ArenaKey::Retired,
            life: None,
            state: AtomicU8::new(HOLDING),
            slot: Mutex::default(),
        }
    }

    pub(super) fn key(&self) -> ArenaKey {
        self.key
    }

    /// Whether the stream of this arena is known to be destroyed (one atomic load).
    pub(super) fn owner_is_dead(&self) -> bool {
        self.life.as_ref().is_some_and(|life| !life.is_alive())
    }

    /// Locks the arena.
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, ArenaSlot> {
        lock(&self.slot)
    }

    /// Whether the arena's lock is held now, by any thread (tests).
    #[cfg(test)]
    pub(super) fn is_locked(&self) -> bool {
        self.slot.try_lock().is_err()
    }

    /// Whether the cell's superblocks are gone for good (frees look their owner up again).
    pub(super) fn is_retired(&self) -> bool {
        self.state.load(Ordering::Acquire) == RETIRED
    }

    /// Whether the cell is its key's arena (not retired, not a holding arena): only then may
    /// a stream allocate from it or find it as its own.
    #[inline]
    pub(super) fn is_current(&self) -> bool {
        self.state.load(Ordering::Acquire) == CURRENT
    }

    /// Marks the cell retired. Call with its lock held (the guard proves it).
    pub(super) fn retire(&self, _locked: &mut ArenaSlot) {
        self.state.store(RETIRED, Ordering::Release);
    }
}
