//! The VMM pool (no RMM equivalent; PyTorch's "expandable segments"):
//! [`VmmPoolMemoryResource`], a pool that grows by mapping physical memory at the end of one
//! reserved range of device addresses, so that its free memory coalesces across growth.
//!
//! Built on the stream-ordered core the pool uses, with pure bookkeeping of its own and no CUDA
//! call: `range`, the map of the reserved range (which chunks are mapped, where the next one
//! goes), and `blocks`, the free lists whose chunks coalesce. `mapper` is the CUDA glue (or the
//! simulation) that maps and unmaps chunks. The design: `docs/internals/vmm-pool.md`.

pub(crate) mod blocks;
mod export;
mod mapper;
mod options;
pub(crate) mod range;
mod resource;
#[cfg(test)]
mod tests;

#[cfg(unix)]
pub use export::ExportedChunk;
pub use mapper::VmmGrowthStatistics;
pub use options::VmmPoolOptions;
pub use resource::VmmPoolMemoryResource;
