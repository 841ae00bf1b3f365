//! The fixed-size resource (RMM's `fixed_size_memory_resource`) and its pure bookkeeping.
//!
//! Pure bookkeeping, no CUDA calls (addresses are plain `u64`, sizes `usize`):
//!
//! - [`chunk`]: the chunk and error types and RMM's block-size rule.
//! - [`block_table`]: the resource-wide ledger of which blocks are handed out (a slot per
//!   block, shared by every stream's list), which detects unknown pointers, double frees — on
//!   one stream or two — and size mismatches without hashing or locking.
//!
//! [`FixedSizeMemoryResource`] is the resource, on the stream-ordered core it shares with the
//! pool: per stream a plain FIFO of free addresses (RMM's `fixed_size_free_list`, without
//! checks of its own), plus the shared ledger.

pub mod block_table;
pub mod chunk;
mod resource;

pub use resource::{FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE};
