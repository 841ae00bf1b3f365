//! [`ArenaMemoryResource`]: RMM's arena allocator as a memory resource, driving the pure
//! bookkeeping of this module ([`GlobalArena`](super::GlobalArena),
//! [`LocalArena`](super::LocalArena)) with streams, events and locks.

mod cell;
mod fence;
mod global;
mod state;
mod thread_cache;

#[cfg(test)]
mod tests;

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::MrResult;
use crate::resource::{
    same_shared_state, DeviceMemoryResource, ResourceProperties, SharedResource,
};
use crate::util::alignment::{self, OverAligned, MAX_OVER_ALIGNMENT};
use cell::{ArenaCell, ArenaKey, ArenaSlot};
use fence::EventPool;
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

/// How to build an [`ArenaMemoryResource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaOptions {
    /// Size of the arena, allocated from the upstream resource at construction and aligned down
    /// to 256 bytes; at least 1 MiB. `None`: half of the current device's free memory
    /// (`rmm_sys::percent_of_free_device_memory(50)`), which needs a GPU.
    pub arena_size: Option<usize>,
    /// Log a memory dump (target [`DUMP_LOG_TARGET`], level error) when an allocation fails.
    pub dump_log_on_failure: bool,
    /// Round sizes to RMM's jemalloc-like size classes
    /// ([`align_to_size_class`](super::align_to_size_class); RMM's compile-time switch
    /// `RMM_ARENA_USE_SIZE_CLASSES`) instead of 256-byte multiples. Trades internal
    /// fragmentation for fewer distinct block sizes.
    pub use_size_classes: bool,
}

/// RMM's arena allocator (`rmm::mr::arena_memory_resource`): one upstream allocation, cut into
/// superblocks (>= 1 MiB) that are lent to per-thread and per-stream arenas, which serve small
/// requests by address-ordered first fit.
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
///   arena's superblocks go back to the global arena (adjacent empty ones coalesce), and the
///   request is retried once; if it still fails: [`MrError::OutOfMemory`](crate::MrError)
///   ("Maximum pool size exceeded (failed to allocate N bytes): No room in arena."), after
///   logging a memory dump when [`ArenaOptions::dump_log_on_failure`] is set (see
///   [`DUMP_LOG_TARGET`], [`memory_dump`](Self::memory_dump)).
/// - `allocate(_, 0, _)` is the null pointer; `deallocate` of the null pointer or of 0 bytes
///   is a no-op. Sizes are rounded up to 256 bytes (or to size classes); every block is
///   256-aligned.
/// - Clones share the arena and compare equal; separately built arenas are unequal.
///
/// # Better than RMM
/// - **Wrong frees are errors.** An unknown pointer, a double free or a wrong size is
///   [`MrError::InvalidFree`](crate::MrError::InvalidFree) and changes nothing (RMM terminates
///   the process for an unknown pointer and corrupts its lists for the others). A size is wrong
///   when it rounds to another size than the allocation's; `SizeMismatch::allocated` is the
///   rounded size.
/// - **No host blocking on large frees.** RMM synchronizes the freeing stream on the host for
///   every free of a large block. Here a large free that empties its superblock gives that
///   superblock to the freeing stream's arena, which reuses it for the stream's next large
///   requests at once, like RMM's small blocks: work queued later on the same stream runs after
///   the work that used the block, so no event is needed and the global arena is not touched
///   (its lock, its tree). Kept superblocks serve only large requests; an arena keeps at most
///   1/64 of the arena free in them (up to 64 MiB, at most a quarter, in small arenas), and
///   they go back to the global arena with the arena's other superblocks (defragmentation,
///   thread exit). Every other large free records an event on the stream and the block stays
///   *pending* (still allocated in the bookkeeping) until the event has completed; large frees
///   and the allocation paths that reach the global arena poll the oldest pending frees
///   (`cuEventQuery`, outside the global lock; all of them when memory is short), and before
///   reporting out-of-memory, defragmentation's device synchronization completes them all. The
///   stream is never used after the free, so it may be destroyed right away.
/// - **Cheap cross-arena frees.** A block freed on another stream than the one whose arena
///   holds it is found through an owner table (RMM synchronizes the stream and searches every
///   arena under an exclusive lock). It is freed into its arena at once, together with an event
///   recorded on the freeing stream; that arena's stream waits on the event (device side,
///   `cuStreamWaitEvent`) before the arena hands out any block again. A block whose superblock
///   sits in the global arena becomes a pending free like a large one. No host blocking.
/// - **Scales with threads.** Each local arena has its own lock, the key -> arena map is a
///   read-mostly `RwLock`, the global arena has its own lock, and each thread caches the arenas
///   it uses, so a small allocation or free on a thread's own stream, and a large one served by
///   or freed into its kept superblocks, takes exactly one lock (its arena's) and touches no
///   shared cache line. RMM takes two process-wide
///   `shared_mutex`es on every call, which collapses with 16 threads. Events are recorded and
///   queried outside the global lock (only defragmentation synchronizes under it, as in RMM).
/// - **Safe thread exit.** When a thread with a per-thread arena exits, its superblocks go back
///   to the global arena as in RMM, but only after the thread's per-thread default stream (and
///   any event other streams left in its arena) completed, so their new owner cannot overwrite
///   memory the thread's last work still reads. The guard holds the resource weakly: a thread
///   outliving the resource does nothing.
/// - **Alignment is honoured or refused.** RMM ignores the alignment argument. Here an
///   alignment above 256 is honoured up to [`MAX_OVER_ALIGNMENT`]
///   by taking a block `alignment - 256` bytes larger, and refused above it (see the trait's
///   "Alignment"); an upstream allocation that is not 256-aligned is given back and refused.
/// - **Frees from another thread.** The per-thread default stream is a different stream on
///   every host thread, and buffers are `Send`. A block one thread allocated on its per-thread
///   stream and another thread frees on its own is never made reusable by the freeing thread's
///   stream alone: a small block goes back to the allocating thread's arena with a fence (as
///   any cross-arena free), and where the block would otherwise become reusable at once or
///   after the freeing stream only — a large block (which the freeing thread's arena would
///   keep), a block whose superblock moved to the freeing thread's arena or back to the global
///   arena after a defragmentation — the free waits for an event recorded on the legacy
///   stream, which completes after the earlier work of every blocking stream, every thread's
///   per-thread stream included. For this, large allocations remember who made them, and an
///   arena remembers the blocks that were already live when a superblock joined it (none in
///   the common case: the hot path checks that the set is empty). RMM synchronizes only the
///   freeing thread's stream before freeing a large block to the global arena, and frees a
///   block of a moved superblock where it is, so the block can be reused while the allocating
///   thread's work still runs.
/// - **No unbounded growth with short-lived streams**: defragmentation retires every local
///   arena (a stream's arena is recreated on its next use), so arenas of destroyed streams do
///   not pile up.
///
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
    /// An arena of `arena_size` bytes (`None`: half of the current device's free memory) over
    /// `upstream` (RMM's constructor). See [`ArenaOptions`].
    pub fn new(
        upstream: U,
        arena_size: Option<usize>,
        dump_log_on_failure: bool,
    ) -> MrResult<Self> {
        Self::with_options(
            upstream,
            ArenaOptions {
                arena_size,
                dump_log_on_failure,
                use_size_classes: false,
            },
        )
    }

    /// An arena over `upstream` built with `options`.
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
        if let Some(alignment) = alignment::over_aligned(alignment, MAX_OVER_ALIGNMENT) {
            return self
                .over_aligned
                .deallocate(ptr, bytes, alignment, |block, size| {
                    self.inner.deallocate(stream, block, size)
                });
        }
        self.inner.deallocate(stream, ptr, bytes)
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        same_shared_state::<Self, _>(other, &self.inner, |o| &o.inner)
    }

    fn properties(&self) -> ResourceProperties {
        self.inner.upstream.properties()
    }

    fn as_any(&self) -> &dyn Any {
        self
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
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
