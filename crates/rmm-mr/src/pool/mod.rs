//! The pool resource (RMM's `pool_memory_resource`): [`PoolMemoryResource`].
//!
//! Built on the stream-ordered core it shares with the fixed-size resource (per-stream free
//! lists, stealing, merging, growth, the record of handed-out blocks), with two pieces of pure
//! bookkeeping of its own, no CUDA calls: `free_list`, the coalescing best-fit free list
//! (O(log n) where RMM's address-ordered list is linear), `boundary_list`, the same list with
//! boundary tags in place of the ordered address index (what the pool's stream lists use),
//! and `growth`, the growth policy
//! (`size_to_grow`, the halving retry, the size checks, the out-of-memory messages). The
//! design: `docs/internals/pool.md`.

pub(crate) mod boundary_list;
pub(crate) mod free_list;
pub(crate) mod growth;
pub(crate) mod resource;
pub(crate) mod size_index;

pub use resource::{PoolMemoryResource, PoolOptions};
