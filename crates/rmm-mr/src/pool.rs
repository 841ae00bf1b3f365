//! The pool resource (RMM's `pool_memory_resource`): [`PoolMemoryResource`].
//!
//! `engine` is the pool's engine, which the VMM pool ([`crate::vmm`]) shares whole through
//! `engine::{Pool, Growth}`: the stream-ordered core over the pool's per-stream boundary lists
//! (`engine/boundary_list.rs`, with its size classes and address tables), the record of
//! handed-out blocks, and the hot paths. `growth` is the pool's growth policy (`size_to_grow`,
//! the halving retry, the size checks, the out-of-memory messages), pure bookkeeping; `resource`
//! the resource over an upstream. The design: `docs/internals/pool.md`.

pub(crate) mod diagnostics;
pub(crate) mod engine;
pub(crate) mod growth;
pub(crate) mod resource;

pub use resource::{PoolMemoryResource, PoolOptions};
