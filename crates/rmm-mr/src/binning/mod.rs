//! The binning resource (RMM's `binning_memory_resource`) and its pure bookkeeping.
//!
//! - [`table`] (pure bookkeeping, no CUDA calls): the ordered bin table that routes a request
//!   to the smallest bin that fits. It is generic over its payload.
//! - [`BinningMemoryResource`]: the resource, storing resource handles in the table.

mod resource;
pub mod table;

pub use resource::BinningMemoryResource;
