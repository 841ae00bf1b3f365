//! Pinned host memory: [`PinnedHostPool`], a caching, stream-ordered pool of `cuMemHostAlloc`
//! chunks (with its `allocator_api2` allocator, [`PinnedVec`] and [`PinnedTransfer`]), and
//! [`CudaAsyncHostMemoryResource`], the driver's host-located stream-ordered pool.
//!
//! The bookkeeping ([`core`]: size classes, free lists, pending events) makes no CUDA call and
//! is tested without a GPU (and under Miri); [`pool`] is the thin CUDA glue.

pub(crate) mod core;
mod host_async;
mod pool;

pub use self::core::{class_size, PinnedPoolStatistics};
pub use host_async::CudaAsyncHostMemoryResource;
pub use pool::{
    PinnedAllocator, PinnedHostPool, PinnedPoolOptions, PinnedTransfer, PinnedVec,
    PINNED_MAX_ALIGNMENT,
};
