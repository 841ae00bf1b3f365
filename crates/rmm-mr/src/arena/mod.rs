//! Bookkeeping of RMM's arena allocator (`rmm::mr::arena_memory_resource`), without any CUDA.
//!
//! Addresses are `u64`, sizes `usize`; nothing here touches memory. The CUDA-aware resource
//! (owning the upstream allocation, picking per-thread or per-stream arenas, synchronizing
//! streams, locking) is built on these types.
//!
//! # Structure (RMM's `cpp/include/rmm/mr/detail/arena.hpp`)
//!
//! | Rust | RMM | role |
//! |---|---|---|
//! | [`Block`] | `block` | an address range |
//! | [`Superblock`] | `superblock` | >= 1 MiB span, address-ordered free blocks, first fit + coalescing |
//! | [`GlobalArena`] | `global_arena` | the whole upstream span as superblocks; lends superblocks, serves large requests |
//! | [`LocalArena`] | `arena` | one per thread (per-thread default stream) or per stream; small requests |
//! | [`align_to_size_class`] | `align_to_size_class` | optional jemalloc-like rounding |
//!
//! * Small requests (`<= 1 MiB`, see [`GlobalArena::handles`]) are served by a local arena:
//!   address-ordered first fit over its superblocks, else it acquires a superblock from the global
//!   arena (an empty one of 2 MiB or more is split and a 1 MiB head is lent; otherwise the first
//!   fitting superblock is lent whole, possibly a partially used one).
//! * Large requests (`> 1 MiB`) are served by the global arena directly; an empty superblock of at
//!   least `size + 1 MiB` is split so the allocation gets a head superblock of exactly its size.
//!   (An addition to RMM: a local arena can also *keep* superblocks for its large requests,
//!   [`LocalArena::keep`], typically the one a large free on its own stream emptied,
//!   [`GlobalArena::reclaim`]; [`LocalArena::allocate`] tries them first.)
//! * [`LocalArena::clean`] returns all of an arena's superblocks to the global arena (RMM's
//!   defragmentation step, after `cudaDeviceSynchronize`, and at thread exit);
//!   [`LocalArena::defragment`] returns only the empty ones. The global arena coalesces adjacent
//!   empty superblocks, so once everything is freed and every arena cleaned it is again one empty
//!   superblock covering the span ([`GlobalArena::is_fully_coalesced`]).
//!
//! # Sizes
//!
//! Every entry point rounds sizes up to 256 bytes ([`ALLOCATION_ALIGNMENT`](size_class::ALLOCATION_ALIGNMENT)); frees are rounded
//! the same way, so a free must give a size that rounds to the allocation's rounded size. A
//! resource built with RMM's size classes (`RMM_ARENA_USE_SIZE_CLASSES`) rounds with
//! [`align_to_size_class`] before calling in, for both allocation and free (classes are
//! multiples of 256, so the core's rounding keeps them). Zero-byte requests never reach the core:
//! the resource returns a null pointer for `allocate(0)` and ignores `deallocate(_, 0)` as RMM does;
//! if one does arrive, `allocate` answers `None` and a free of size 0 is a
//! [`ArenaError::SizeMismatch`] / error like any other wrong size. The arena size is aligned down
//! to 256 ([`GlobalArena::new`]) and must be at least [`SUPERBLOCK_MIN_SIZE`].
//!
//! # Complexity
//!
//! RMM finds first fits and owning superblocks with linear `std::find_if` scans. Here blocks and
//! superblocks live in address-ordered treaps where every node also knows the largest free size
//! of its subtree, which gives the same address-ordered first fit (identical placements) in
//! `O(log n)`. The treaps keep their nodes in one vector each (no allocation per insertion),
//! items are changed in place and neighbours are reached through handles, so an allocation or a
//! free changes at most a couple of nodes of each tree: a superblock keeps its free and live
//! blocks in one tree (they tile it), the global arena its held and lent superblocks (they tile
//! the span), and superblocks are split, lent and merged in place.
//!
//! | operation | cost |
//! |---|---|
//! | [`LocalArena::allocate_local`], [`LocalArena::allocate_kept`], [`LocalArena::deallocate`], [`LocalArena::contains`] | `O(log s + log b)` |
//! | [`GlobalArena::acquire`], [`GlobalArena::release`], [`GlobalArena::allocate_large`], [`GlobalArena::deallocate`], [`GlobalArena::reclaim`], [`GlobalArena::find`] | `O(log S + log b)` |
//! | [`LocalArena::clean`] / [`LocalArena::defragment`] | `O(s log S)` / `O(s + e log S)` |
//! | `stats()`, [`GlobalArena`]'s `Display` dump | `O(S)` |
//!
//! (s: superblocks of the local arena, S: superblocks of the global arena, b: blocks of the
//! superblock involved, e: empty superblocks; all costs expected.)
//!
//! # Deliberate differences from RMM
//!
//! * **Wrong frees are error values.** RMM calls `RMM_FAIL("allocation not found")` inside a
//!   `noexcept` function, terminating the process, for a pointer no arena knows. Here frees return
//!   [`ArenaError::NotFound`], [`ArenaError::DoubleFree`] or [`ArenaError::SizeMismatch`] and change
//!   nothing.
//! * **Live blocks are tracked** per superblock (address and rounded size), so a double free, a
//!   free of an interior pointer and a free with the wrong size are all detected exactly; RMM would
//!   silently corrupt its free lists for the last two.
//! * **Lent superblocks are recorded** by the global arena, which only takes back superblocks it
//!   lent, once ([`ArenaError::ForeignSuperblock`], with the superblock handed back in
//!   [`RejectedSuperblock`]).
//! * **Logarithmic searches** instead of linear scans (see above).
//! * **Kept superblocks** ([`LocalArena::keep`], [`GlobalArena::reclaim`]): a local arena may hold
//!   superblocks for its large requests; small requests never use them.
//! * Size classes: 56 KiB where RMM's table has the typo 54 KiB; `None` instead of `SIZE_MAX`
//!   above 256 GiB.
//! * RMM's debug-only 1 TiB maximum superblock size is not enforced.
//!
//! # How RMM's `arena_memory_resource` drives it
//!
//! (This is RMM's procedure, which the core supports; [`ArenaMemoryResource`] follows it except
//! where its own documentation says otherwise — notably, large frees leave their superblock to
//! the freeing stream or wait with events instead of blocking the host, and cross-arena frees
//! use an owner table instead of searching.)
//!
//! Allocation of `bytes > 0`: round (256 or size class); [`LocalArena::allocate`] on the calling
//! thread's arena (per-thread default stream) or the stream's arena (under the shared lock; it
//! forwards large requests to [`GlobalArena::allocate_large`]). On `None`: take the exclusive
//! lock, `cuDeviceSynchronize` (on the driver API: `cuCtxSynchronize`), [`LocalArena::clean`]
//! every arena, retry once; still `None`: optionally write [`GlobalArena::dump`] to the dump log,
//! then fail with out-of-memory ("No room in arena.").
//!
//! Free of `(ptr, bytes > 0)`: round the same way. Large: synchronize the stream, then
//! [`GlobalArena::deallocate`] ([`ArenaMemoryResource`] instead first tries the stream's arena,
//! then [`GlobalArena::reclaim`] + [`LocalArena::keep`], and only then an event-ordered pending
//! free); else (or when that answers `Ok(false)`) [`LocalArena::deallocate`]
//! on the stream's/thread's arena. On `Ok(false)`: synchronize the stream, take the exclusive lock
//! and search the other arenas and the global arena ([`GlobalArena::find`] says whether the block
//! is in a lent superblock at all). Every `Err`, and "not found anywhere", is a wrong free to
//! report.
//!
//! Locking: [`LocalArena::allocate_local`] and [`LocalArena::deallocate`] need only that arena;
//! growth needs the global arena too ([`GlobalArena::acquire`] then [`LocalArena::adopt`]).
//! A local arena must be [cleaned](LocalArena::clean) before it is dropped (thread exit), or its
//! superblocks are lost to the global arena.

pub(crate) mod block;
pub(crate) mod error;
mod fit_tree;
pub(crate) mod global_arena;
pub(crate) mod local_arena;
mod resource;
pub(crate) mod size_class;
pub(crate) mod stats;
pub(crate) mod superblock;

#[cfg(test)]
mod model_tests;

pub(crate) use block::Block;
pub(crate) use error::{ArenaError, RejectedSuperblock};
pub(crate) use global_arena::{GlobalArena, SuperblockLocation};
pub(crate) use local_arena::LocalArena;
pub use resource::{ArenaMemoryResource, ArenaOptions, DUMP_LOG_TARGET};
pub(crate) use size_class::{align_down, align_to_size_class, align_up};
pub(crate) use stats::ArenaStats;
pub(crate) use superblock::Superblock;

/// Smallest superblock, and smallest arena: 1 MiB (RMM's `superblock::minimum_size`). Requests
/// above it are "large" ([`GlobalArena::handles`]).
pub const SUPERBLOCK_MIN_SIZE: usize = 1 << 20;
