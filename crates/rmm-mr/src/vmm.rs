//! The VMM pool (no RMM equivalent; PyTorch's "expandable segments"):
//! [`VmmPoolMemoryResource`], a pool that grows by mapping physical memory at the end of one
//! reserved range of device addresses, so that its free memory coalesces across growth.
//!
//! The pool's own resource without its source of chunks (`crate::pool::engine`: the same
//! stream-ordered core, free lists and hot path; the lists in their contiguous mode, where
//! chunks coalesce), with pure bookkeeping of its own and no CUDA call: `range`, the map of the
//! reserved range (which chunks are mapped, where the next one goes). `mapper` is the CUDA glue
//! (or the simulation) that maps and unmaps chunks, the pool's source of chunks. The design:
//! `docs/internals/vmm-pool.md`.

mod export;
mod mapper;
mod options;
pub(crate) mod range;
mod resource;
#[cfg(test)]
mod tests;

#[cfg(unix)]
pub(crate) use export::ChunkExports;
#[cfg(unix)]
pub use export::ExportedChunk;
pub use mapper::VmmGrowthStatistics;
pub use options::{VmmPoolOptions, DEFAULT_MIN_GROWTH_PERCENT};
pub use resource::VmmPoolMemoryResource;
