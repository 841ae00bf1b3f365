//! [`ArenaCell`]: one per-thread or per-stream arena of the resource, behind its own lock, and
//! [`ArenaKey`], what selects it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use rmm_stream::{CudaEvent, CudaStreamView};

use super::global::AddrHash;
use super::thread_cache::thread_serial;
use super::{lock, EventPool};
use crate::arena::{ArenaError, LocalArena};
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
}

impl ArenaKey {
    /// The key of `stream`. The per-thread default stream and the legacy default stream are
    /// recognised from the view alone, without any CUDA call; only other streams ask the driver
    /// for their id.
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
            Self::Legacy | Self::Stream(_) => None,
        }
    }

    /// The [`Origin`] of a block allocated by this key's arena (or by the global arena for
    /// this key's stream).
    #[inline]
    pub(super) fn origin(self) -> Origin {
        match self {
            Self::Thread(serial) => Origin::Thread(serial),
            Self::Legacy | Self::Stream(_) => Origin::Shared,
        }
    }
}

impl fmt::Display for ArenaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Thread(serial) => write!(f, "per-thread arena (thread #{serial})"),
            Self::Legacy => f.write_str("legacy default stream arena"),
            Self::Stream(id) => write!(f, "stream arena (stream id {id})"),
        }
    }
}

/// What an arena's lock protects.
#[derive(Debug, Default)]
pub(super) struct ArenaSlot {
    /// The superblocks and their blocks.
    pub(super) arena: LocalArena,
    /// Events recorded on other streams that freed blocks into this arena (or on the legacy
    /// stream, for a block another thread allocated). The arena's own stream waits on all of
    /// them (device side) before this arena hands out any block.
    pub(super) fences: Vec<CudaEvent>,
    /// Blocks that were already handed out when their superblock joined this arena (a
    /// partially used superblock lent after defragmentation or a thread exit): another arena's
    /// stream allocated them, so their [`Origin`] is unknown here, and some may have a free
    /// still queued in the resource's pending queue. An entry may outlive its block, which only
    /// makes a later free of that address more careful; empty in the common case, so the hot
    /// path only checks `is_empty`.
    inherited: HashMap<u64, Inherited, AddrHash>,
}

/// What this arena knows of a block that was live when its superblock arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inherited {
    /// Allocated by another arena's stream, still live.
    Live,
    /// Its free is queued until its stream reaches it (freed on another stream while the
    /// superblock was in the global arena): it stays allocated in the superblock until the queue
    /// releases it, and a caller's free of it is a double free.
    FreePending,
}

impl ArenaSlot {
    /// A caller's free of `(addr, size)` in this arena ([`LocalArena::deallocate`]), refusing a
    /// block whose earlier free is still pending.
    pub(super) fn free(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        if !self.inherited.is_empty() && self.inherited.get(&addr) == Some(&Inherited::FreePending)
        {
            return Err(ArenaError::DoubleFree { addr, size });
        }
        self.arena.deallocate(addr, size)
    }

    /// Records the blocks live in a superblock that just joined this arena, and which of them
    /// have a free queued.
    pub(super) fn inherit(&mut self, blocks: impl IntoIterator<Item = (u64, Inherited)>) {
        self.inherited.extend(blocks);
    }

    /// The pending queue's release of `(addr, size)`: the free the caller made earlier now takes
    /// effect.
    pub(super) fn release_pending(&mut self, addr: u64, size: usize) -> Result<bool, ArenaError> {
        let freed = self.arena.deallocate(addr, size);
        if matches!(freed, Ok(true)) {
            self.forget_inherited(addr);
        }
        freed
    }

    /// How many blocks here wait for their pending free.
    pub(super) fn pending_len(&self) -> usize {
        self.inherited
            .values()
            .filter(|&&state| state == Inherited::FreePending)
            .count()
    }

    /// The [`Origin`] of the live block at `addr` of this arena, whose key is `key`: the key's
    /// own, unless the block was live when its superblock arrived.
    #[inline]
    pub(super) fn origin(&self, key: ArenaKey, addr: u64) -> Origin {
        if !self.inherited.is_empty() && self.inherited.contains_key(&addr) {
            Origin::Unknown
        } else {
            key.origin()
        }
    }

    /// The block at `addr` was freed into this arena (or its superblock left it).
    #[inline]
    pub(super) fn forget_inherited(&mut self, addr: u64) {
        if !self.inherited.is_empty() {
            self.inherited.remove(&addr);
        }
    }

    /// Forgets the inherited blocks whose superblock is no longer in this arena (the global
    /// arena's own records cover those it holds).
    pub(super) fn prune_inherited(&mut self) {
        let arena = &self.arena;
        self.inherited.retain(|&addr, _| arena.contains(addr));
    }

    /// Number of blocks recorded as allocated elsewhere.
    #[cfg(test)]
    pub(super) fn foreign_count(&self) -> usize {
        self.inherited.len()
    }

    /// Makes `stream` (this arena's stream) wait on every fence, then recycles them.
    pub(super) fn wait_fences(
        &mut self,
        stream: CudaStreamView<'_>,
        events: &EventPool,
    ) -> MrResult<()> {
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

/// One local arena: a key, a lock, and a retired flag.
///
/// A cell is retired (for good) when its superblocks go back to the global arena at
/// defragmentation, at thread exit or when the resource is dropped; it is then out of the
/// resource's map, and a thread that still holds it (from its cache) looks the key up again.
/// The flag is only set while the cell's lock is held, so a holder of the lock sees a stable
/// value.
#[derive(Debug)]
pub(super) struct ArenaCell {
    key: ArenaKey,
    retired: AtomicBool,
    slot: Mutex<ArenaSlot>,
}

impl ArenaCell {
    pub(super) fn new(key: ArenaKey) -> Self {
        Self {
            key,
            retired: AtomicBool::new(false),
            slot: Mutex::default(),
        }
    }

    pub(super) fn key(&self) -> ArenaKey {
        self.key
    }

    /// Locks the arena.
    pub(super) fn lock(&self) -> MutexGuard<'_, ArenaSlot> {
        lock(&self.slot)
    }

    /// Locks the arena if that does not block.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, ArenaSlot>> {
        match self.slot.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub(super) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Marks the cell retired. Call with its lock held (the guard proves it).
    pub(super) fn retire(&self, _locked: &mut ArenaSlot) {
        self.retired.store(true, Ordering::Release);
    }
}
