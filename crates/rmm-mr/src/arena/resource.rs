//! [`ArenaMemoryResource`]: RMM's arena allocator as a memory resource, driving the pure
//! bookkeeping of this module ([`GlobalArena`](super::GlobalArena),
//! [`LocalArena`](super::LocalArena)) with streams, events and locks.

mod cell;
mod fence;
mod global;
mod key;
mod state;
mod thread_cache;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::MrResult;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::util::alignment::{self, OverAligned, MAX_OVER_ALIGNMENT};
use cell::{ArenaCell, ArenaSlot};
use fence::EventPool;
use key::ArenaKey;
use state::State;

/// The alignment of the upstream allocation (and of every block; larger alignments are served
/// from larger blocks).
const UPSTREAM_ALIGNMENT: usize = rmm_sys::ALLOCATION_ALIGNMENT;

/// The name in messages.
const NAME: &str = "arena_memory_resource";

/// The `log` target of the memory dump written on allocation failure when
/// [`ArenaOptions::dump_log_on_failure`] is set (RMM writes it to a logger named
/// `arena_memory_dump`, file `rmm_arena_memory_dump.log`). Route this target to a file with your
/// logger to get RMM's file.
pub const DUMP_LOG_TARGET: &str = "rmm::arena_memory_dump";

/// How to build an [`ArenaMemoryResource`] (RMM's constructor parameters, and its
/// compile-time size-class switch).
///
/// Built with [`new`](Self::new) or `default()` (RMM's defaults) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ArenaOptions {
    /// Size of the arena, allocated from the upstream resource at construction and aligned down
    /// to 256 bytes; at least 1 MiB. `None` (RMM's default): half of the current device's free
    /// memory (`rmm_sys::percent_of_free_device_memory(50)`), which needs a GPU.
    pub arena_size: Option<usize>,
    /// Log a memory dump (target [`DUMP_LOG_TARGET`], level error) when an allocation fails
    /// (default `false`).
    pub dump_log_on_failure: bool,
    /// Round sizes to RMM's jemalloc-like size classes (RMM's compile-time switch
    /// `RMM_ARENA_USE_SIZE_CLASSES`) instead of 256-byte multiples (default `false`). Trades
    /// internal fragmentation for fewer distinct block sizes.
    pub use_size_classes: bool,
}

impl ArenaOptions {
    /// RMM's defaults: half of the device's free memory, no dump, 256-byte rounding.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the field `arena_size` to `Some(bytes)`.
    #[must_use]
    pub fn arena_size(mut self, bytes: usize) -> Self {
        self.arena_size = Some(bytes);
        self
    }

    /// Sets the field `dump_log_on_failure`.
    #[must_use]
    pub fn dump_log_on_failure(mut self, on: bool) -> Self {
        self.dump_log_on_failure = on;
        self
    }

    /// Sets the field `use_size_classes`.
    #[must_use]
    pub fn use_size_classes(mut self, on: bool) -> Self {
        self.use_size_classes = on;
        self
    }
}

/// RMM's arena allocator (`rmm::mr::arena_memory_resource`): one upstream allocation, cut into
/// superblocks (normally >= 1 MiB) that are lent to per-thread and per-stream arenas, which
/// serve small requests by address-ordered first fit.
///
/// # Semantics (as RMM)
/// - **One upstream allocation** of [`ArenaOptions::arena_size`] bytes (default: half of the
///   device's free memory), obtained with `allocate_sync` at construction and returned with
///   `deallocate_sync` when the last clone is dropped. A size below 1 MiB (after aligning down
///   to 256) is [`MrError::InvalidArgument`](crate::MrError::InvalidArgument)
///   ("Arena size smaller than minimum superblock size.").
/// - **Arenas**: the per-thread default stream uses the calling thread's arena; the legacy
///   default stream has one arena; every other stream has its own arena (keyed by the driver's
///   stream id, which unlike a handle is never reused).
/// - **Small** requests (<= 1 MiB after rounding) are served by the stream's (thread's) arena,
///   which borrows superblocks from the global arena as needed; **large** ones (> 1 MiB) by the
///   global arena directly (after the superblocks the stream's arena kept from its own large
///   frees, see below).
/// - **Defragmentation**: when a request cannot be met, the device is synchronized, every local
///   arena's superblocks go back to the global arena, and the request is retried; if it still
///   fails: [`MrError::OutOfMemory`](crate::MrError)
///   ("Maximum pool size exceeded (failed to allocate N bytes): No room in arena."), after
///   logging a memory dump when [`ArenaOptions::dump_log_on_failure`] is set (see
///   [`DUMP_LOG_TARGET`], [`memory_dump`](Self::memory_dump)). Before that, unlike RMM, the
///   empty superblocks of every local arena are reclaimed (see below).
/// - `allocate(_, 0, _)` is the null pointer; `deallocate` of the null pointer or of 0 bytes
///   is a no-op. Sizes are rounded up to 256 bytes (or to size classes); every block is
///   256-aligned.
/// - Clones share the arena and compare equal; separately built arenas are unequal.
///
/// # Differences from RMM
///
/// - **Fuller before it fails.** The global arena keeps free memory coalesced across
///   superblock boundaries (a superblock that comes back dissolves into it), places requests
///   by best fit, and lends only fresh superblocks; and before defragmenting, a failed request
///   reclaims the empty superblocks of every local arena (taken out, then handed over after a
///   device synchronization made without holding any lock). 16 threads of `gpu_alloc`'s trace
///   (a) complete at 90 % occupancy, where RMM's design stops at 80 % (simulated;
///   `docs/reliability.md`).
/// - **Wrong frees are errors.** An unknown pointer, a double free or a wrong size is
///   [`MrError::InvalidFree`](crate::MrError::InvalidFree) and changes nothing (RMM terminates
///   the process for an unknown pointer and corrupts its lists for the others). A size is wrong
///   when it rounds to another size than the allocation's.
/// - **No host blocking on frees.** A large free that empties its superblock leaves it to the
///   freeing stream's arena; other large frees and frees into another stream's arena wait on
///   events (device side) instead of synchronizing the stream on the host, and blocks found
///   through an owner table instead of a search of every arena.
/// - **Scales with threads**: a lock per local arena and a per-thread cache, where RMM takes two
///   process-wide `shared_mutex`es on every call.
/// - **Safe thread exit**: a thread's superblocks go back to the global arena only after its
///   per-thread default stream's work completed.
/// - **Alignment is honoured or refused.** RMM ignores the alignment argument. Here an
///   alignment above 256 is honoured up to [`MAX_OVER_ALIGNMENT`] by taking a block
///   `alignment - 256` bytes larger, and refused above it (see the trait's "Alignment").
/// - **Frees from another thread** on the per-thread default stream are ordered behind both
///   threads' work (RMM lets the freeing thread reuse the block at once in some cases).
/// - **No unbounded growth with short-lived streams**: making room retires the local arenas
///   it leaves empty, and a failed request leaves no empty arena behind.
///
/// Each point in full: `docs/internals/arena.md`.
/// Without a GPU (no driver or no device) there is no queued work to order against, so nothing
/// is recorded, waited on or synchronized: the resource then works over a host-memory upstream
/// such as [`HostMockResource`](crate::testing::HostMockResource) on the legacy or per-thread
/// default stream, whose arenas are found without any CUDA call.
#[doc(alias = "rmm::mr::arena_memory_resource")]
pub struct ArenaMemoryResource<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<State<U>>,
    /// Allocations made with an alignment above 256 (shared by the clones).
    over_aligned: Arc<OverAligned>,
}

impl<U: DeviceMemoryResource> Clone for ArenaMemoryResource<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            over_aligned: Arc::clone(&self.over_aligned),
        }
    }
}

impl<U: DeviceMemoryResource> ArenaMemoryResource<U> {
    /// An arena of half the current device's free memory over `upstream` (RMM's constructor
    /// with its defaults; needs a GPU). See [`with_options`](Self::with_options) for a given
    /// size.
    ///
    /// # Errors
    ///
    /// As [`with_options`](Self::with_options).
    pub fn new(upstream: U) -> MrResult<Self> {
        Self::with_options(upstream, ArenaOptions::default())
    }

    /// An arena over `upstream` built with `options` (see [`ArenaOptions`]).
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`](crate::MrError::InvalidArgument) for an arena below 1 MiB;
    /// the upstream's error when it refuses the arena; without an `arena_size` and without a
    /// GPU, the error of reading the free memory.
    pub fn with_options(upstream: U, options: ArenaOptions) -> MrResult<Self> {
        Ok(Self {
            inner: Arc::new(State::new(upstream, options)?),
            over_aligned: Arc::default(),
        })
    }

    /// The upstream resource the arena was allocated from.
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The size of the arena in bytes (the upstream allocation).
    #[must_use]
    pub fn arena_size(&self) -> usize {
        self.inner.arena_size()
    }

    /// Whether sizes are rounded to size classes.
    #[must_use]
    pub fn uses_size_classes(&self) -> bool {
        self.inner.uses_size_classes()
    }

    /// Whether a memory dump is logged when an allocation fails.
    #[must_use]
    pub fn dumps_log_on_failure(&self) -> bool {
        self.inner.dumps_log_on_failure()
    }

    /// The memory dump RMM writes on failure (RMM's `dump_memory_log`): arena size, superblock
    /// counts, free memory, largest free block, fragmentation, one line per superblock of the
    /// global arena, the pending frees and one summary line per local arena.
    #[must_use]
    pub fn memory_dump(&self) -> String {
        self.inner.memory_dump(None)
    }

    /// How long the global arena's lock was held so far, one record per acquisition (the
    /// large requests it served, the superblocks it lent or took back, the frees it queued
    /// or released). With the `testing` feature only; `gpu_alloc` prints it with the growth
    /// locks of the other resources.
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn global_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.inner.global_lock_holds()
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for ArenaMemoryResource<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaMemoryResource")
            .field("arena_size", &self.arena_size())
            .field("use_size_classes", &self.uses_size_classes())
            .field("dump_log_on_failure", &self.dumps_log_on_failure())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: blocks are disjoint, 256-byte aligned sub-ranges of chunks the upstream (bound by
// this trait's contract) handed out and this resource holds until it is dropped; a block is
// handed out again only after it was freed, ordered after the freeing stream's work.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for ArenaMemoryResource<U> {
    /// Allocates `bytes` for `stream`, aligned to `alignment` (see the type's documentation).
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if let Some(routed) = crate::graph::route_allocate(stream, bytes, alignment) {
            return routed;
        }
        let alignment = alignment::check(alignment, MAX_OVER_ALIGNMENT)?;
        if alignment > UPSTREAM_ALIGNMENT {
            return self.allocate_over_aligned(stream, bytes, alignment);
        }
        self.inner.allocate(stream, bytes)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        let routed = unsafe { crate::graph::route_deallocate(stream, ptr, bytes, alignment) };
        if let Some(routed) = routed {
            return routed;
        }
        if let Some(alignment) = alignment::over_aligned(alignment, MAX_OVER_ALIGNMENT) {
            return self
                .over_aligned
                .deallocate(ptr, bytes, alignment, |block, size| {
                    self.inner.deallocate(stream, block, size)
                });
        }
        self.inner.deallocate(stream, ptr, bytes)
    }

    fn snapshot(&self) -> MrResult<crate::Snapshot> {
        Ok(self.inner.memory_snapshot())
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
    }
}

impl<U: DeviceMemoryResource> ArenaMemoryResource<U> {
    /// `bytes` aligned to `alignment` (above 256), from a larger block.
    #[cold]
    fn allocate_over_aligned(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let give_back = |block, size| {
            if let Err(e) = self.inner.deallocate(stream, block, size) {
                log::error!("rmm: {NAME} could not take back block {block}: {e}");
            }
        };
        self.over_aligned.allocate(
            bytes,
            alignment,
            NAME,
            |size| self.inner.allocate(stream, size),
            give_back,
        )
    }
}

/// Locks a mutex, ignoring poisoning (the bookkeeping stays consistent: no operation panics
/// half-way through an update).
#[inline]
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
