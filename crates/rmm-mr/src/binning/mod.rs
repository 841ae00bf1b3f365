//! Pure bookkeeping of the binning resource (RMM's `binning_memory_resource`), no CUDA calls.
//!
//! - [`table`]: the ordered bin table that routes a request to the smallest bin that fits.
//!
//! The table is generic over its payload; the CUDA-aware resource stores resource handles in it.

pub mod table;
