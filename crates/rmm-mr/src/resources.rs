//! The base resources: each allocates from one CUDA (or host) allocator.

mod callback;
mod cuda;
mod cuda_async;
mod cuda_async_managed;
mod cuda_async_view;
mod diagnostics;
mod driver_pool;
mod managed;
mod peer_access;
mod pinned_host;
mod pool_origins;
mod pool_statistics;
mod simulated;
mod system;
#[cfg(test)]
mod tests;

pub use callback::{AllocateCallback, CallbackMemoryResource, DeallocateCallback};
pub use cuda::CudaMemoryResource;
pub use cuda_async::{CudaAsyncMemoryResource, CudaAsyncOptions};
pub use cuda_async_managed::CudaAsyncManagedMemoryResource;
pub use cuda_async_view::CudaAsyncViewMemoryResource;
pub use managed::ManagedMemoryResource;
pub use pinned_host::PinnedHostMemoryResource;
pub use pool_statistics::PoolStatistics;
pub use simulated::SimulatedMemoryResource;
pub use system::{SamHeadroomMemoryResource, SystemMemoryResource};
