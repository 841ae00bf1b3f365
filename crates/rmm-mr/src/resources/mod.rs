//! The base resources: each allocates from one CUDA (or host) allocator.

pub mod callback;
pub mod cuda;
pub mod cuda_async;
pub mod cuda_async_managed;
pub mod cuda_async_view;
pub mod managed;
pub mod pinned_host;
pub mod simulated;
pub mod system;

pub use callback::CallbackMemoryResource;
pub use cuda::CudaMemoryResource;
pub use cuda_async::{CudaAsyncMemoryResource, CudaAsyncOptions, PoolStatistics};
pub use cuda_async_managed::CudaAsyncManagedMemoryResource;
pub use cuda_async_view::CudaAsyncViewMemoryResource;
pub use managed::ManagedMemoryResource;
pub use pinned_host::PinnedHostMemoryResource;
pub use simulated::SimulatedMemoryResource;
pub use system::{SamHeadroomMemoryResource, SystemMemoryResource};
