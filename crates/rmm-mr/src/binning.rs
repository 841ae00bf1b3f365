//! The binning resource (RMM's `binning_memory_resource`): [`BinningMemoryResource`].
//!
//! Its pure bookkeeping, no CUDA calls: `table`, the ordered bin table that routes a request to
//! the smallest bin that fits (used to add bins and on the slow paths), and `routes`, the same
//! routing readable without a lock (bins are only ever added, so each bin count gets an
//! immutable published version; every request reads it). The design:
//! `docs/internals/binning.md`.

mod resource;
pub(crate) mod routes;
pub(crate) mod table;

pub use resource::{BinningMemoryResource, BinningOptions};
