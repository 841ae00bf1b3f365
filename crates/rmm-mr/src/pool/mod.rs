//! The pool resource (RMM's `pool_memory_resource`): [`PoolMemoryResource`].
//!
//! Built on the stream-ordered core it shares with the fixed-size resource (per-stream free
//! lists, stealing, merging, growth, the record of handed-out blocks), with pure bookkeeping of
//! its own, no CUDA calls: `free_list`, the coalescing best-fit free list (O(log n) where RMM's
//! address-ordered list is linear), `boundary_list`, the same list with boundary tags in place
//! of the ordered address index (what the stream lists use), `blocks`, that list with the
//! record of handed-out blocks as the core drives it, and `growth`, the growth policy
//! (`size_to_grow`, the halving retry, the size checks, the out-of-memory messages). `shell` is
//! the resource without its source of chunks, which the VMM pool ([`crate::vmm`]) shares: both
//! have the same free lists, core and hot path. The design: `docs/internals/pool.md`.

pub(crate) mod blocks;
pub(crate) mod boundary_list;
pub(crate) mod diagnostics;
pub(crate) mod free_list;
pub(crate) mod growth;
pub(crate) mod resource;
pub(crate) mod shell;
pub(crate) mod size_index;

pub use resource::{PoolMemoryResource, PoolOptions};
