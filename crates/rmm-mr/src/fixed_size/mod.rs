//! The fixed-size resource (RMM's `fixed_size_memory_resource`) and its pure bookkeeping.
//!
//! - [`free_list`] (pure bookkeeping, no CUDA calls): the FIFO free list of equally sized
//!   blocks, with double-free and bad-address detection, and the index of the upstream chunks
//!   the blocks come from. Addresses are plain `u64` and sizes `usize`.
//! - [`FixedSizeMemoryResource`]: the resource, on the stream-ordered core it shares with the
//!   pool.

pub mod free_list;
mod resource;

pub use resource::{FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE};
