//! The fixed-size resource (RMM's `fixed_size_memory_resource`): [`FixedSizeMemoryResource`].
//!
//! Built on the stream-ordered core it shares with the pool: per stream a plain FIFO of free
//! blocks (RMM's `fixed_size_free_list`; `ring`, a ring buffer of addresses with their slots'
//! ids), plus pure bookkeeping of its own, no CUDA calls: `chunk` (the chunk and error types,
//! RMM's block-size rule) and `block_table`, the resource-wide ledger of handed-out blocks (a
//! slot per block, shared by every stream's list) that detects unknown pointers, double frees —
//! on one stream or two — and size mismatches without hashing or locking. The design: `docs/internals/fixed-size.md`.

pub(crate) mod block_table;
pub(crate) mod chunk;
mod diagnostics;
pub(crate) mod resource;
pub(crate) mod ring;

pub use resource::{
    FixedSizeMemoryResource, FixedSizeOptions, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
