//! The arena resource (RMM's `arena_memory_resource`): [`ArenaMemoryResource`], and the pure
//! bookkeeping it drives, without any CUDA (addresses `u64`, sizes `usize`).
//!
//! One upstream allocation, the `GlobalArena`, serves large requests (above 1 MiB) by best fit
//! and lends superblocks (at least [`SUPERBLOCK_MIN_SIZE`] while there is room) to a
//! `LocalArena` per thread (per-thread default stream) or per stream, which serves small
//! requests by address-ordered first fit, in `O(log n)` where RMM scans linearly. Unlike RMM's,
//! the global arena keeps its free memory coalesced across superblock boundaries. Sizes are
//! rounded to 256 bytes (or RMM's size classes). Wrong frees are error values, where RMM
//! terminates the process or corrupts its lists. The structure, the costs, the differences from
//! RMM and how the resource drives the core: `docs/internals/arena.md`.

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
mod tests;

pub(crate) use block::Block;
pub(crate) use error::ArenaError;
pub(crate) use global_arena::{GlobalArena, SuperblockLocation};
pub(crate) use local_arena::LocalArena;
pub use resource::{ArenaMemoryResource, ArenaOptions, DUMP_LOG_TARGET};
pub(crate) use size_class::{align_down, align_to_size_class, align_up};
pub(crate) use stats::ArenaStats;
pub(crate) use superblock::{RejectedSuperblock, Superblock};

/// Smallest superblock (but for a free block lent whole when nothing larger is free), and
/// smallest arena: 1 MiB (RMM's `superblock::minimum_size`). Requests above it are "large"
/// ([`GlobalArena::handles`]).
pub const SUPERBLOCK_MIN_SIZE: usize = 1 << 20;
