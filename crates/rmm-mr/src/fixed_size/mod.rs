//! Pure bookkeeping of the fixed-size resource (RMM's `fixed_size_memory_resource`), no CUDA
//! calls.
//!
//! - [`free_list`]: the FIFO free list of equally sized blocks, with double-free and bad-address
//!   detection, and the index of the upstream chunks the blocks come from.
//!
//! Addresses are plain `u64` and sizes `usize`; the CUDA-aware resource wraps these types.

pub mod free_list;
