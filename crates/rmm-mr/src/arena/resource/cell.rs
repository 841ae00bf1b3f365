//! [`ArenaCell`]: one per-thread or per-stream arena of the resource, behind its own lock, and
//! [`ArenaKey`], what selects it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use rmm_stream::{CudaEvent, CudaStreamView};

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

    pub(super) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Marks the cell retired. Call with its lock held (the guard proves it).
    pub(super) fn retire(&self, _locked: &mut ArenaSlot) {
        self.retired.store(true, Ordering::Release);
    }
}
