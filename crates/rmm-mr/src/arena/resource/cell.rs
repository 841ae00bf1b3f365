//! [`ArenaCell`]: one per-thread or per-stream arena of the resource, behind its own lock.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use rmm_stream::{CudaEvent, CudaStreamView, StreamLife};

use super::key::ArenaKey;
use super::{lock, EventPool};
use crate::arena::LocalArena;
use crate::error::MrResult;

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
