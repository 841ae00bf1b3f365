//! The binning resource (RMM's `binning_memory_resource`) and its pure bookkeeping.
//!
//! - [`table`] (pure bookkeeping, no CUDA calls): the ordered bin table that routes a request
//!   to the smallest bin that fits. It is generic over its payload.
//! - [`routes`] (pure bookkeeping, no CUDA calls): the same routing, readable without a lock
//!   (bins are only ever added, so each bin count gets an immutable published version).
//! - [`BinningMemoryResource`]: the resource, storing resource handles in both (the table for
//!   adding bins and the slow paths, the routes for every request).

mod resource;
pub mod routes;
pub mod table;

pub use resource::BinningMemoryResource;
