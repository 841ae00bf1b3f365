//! # rmm: the RAPIDS Memory Manager for Rust
//!
//! One interface for allocating GPU (and pinned or managed host) memory, many implementations
//! of it (pools, arenas, bins, the CUDA driver's own pool), composable adaptors (statistics,
//! logging, limits), and containers that free on the right stream and device. This crate is
//! the facade over the layers of rmm-rs; users write `use rmm::...` (or `use rmm::prelude::*`).
//!
//! **Contract.**
//! - Stream ordering is the caller's: an allocation made on a stream is usable on that stream;
//!   handing memory to another stream needs an event ([`CudaEvent`]). Sub-allocators keep the
//!   promise across their own free lists.
//! - Every resource, adaptor, stream and container type is `Send + Sync` (checked by
//!   `tests/send_sync.rs`).
//! - Resources are shared, reference-counted values: whatever allocates keeps its resource
//!   alive, so nothing can dangle (unlike RMM's non-owning references).
//! - No GPU or driver is an `Err`, never a panic; out-of-memory is a distinct error kind.
//!
//! | layer | module here | what |
//! |---|---|---|
//! | `rmm-sys` | [`sys`] | raw CUDA driver API (through cudarc), errors, devices, contexts |
//! | `rmm-stream` | [`stream`] | streams, events, stream pools, the default-stream mode |
//! | `rmm-mr` | [`mr`] | the memory-resource trait, resources, adaptors, the per-device registry |
//! | `rmm-containers` | [`containers`] | device buffers, vectors, scalars |

pub mod guide;
pub mod reinitialize;
pub mod size;

pub use rmm_containers as containers;
pub use rmm_mr as mr;
pub use rmm_stream as stream;
pub use rmm_sys as sys;

/// The level type of the debug-logging functions (from the `log` facade).
#[cfg(feature = "debug-log")]
pub use log::LevelFilter;
pub use reinitialize::{reinitialize, IntoByteSize, ReinitializeOptions};
pub use rmm_containers::{
    take_drop_errors, BufferStream, DeviceBuffer, DeviceScalar, DeviceUvector,
};
#[cfg(feature = "debug-log")]
pub use rmm_mr::debug_log::{
    debug_log_level, flush_debug_log, init_debug_logging, init_debug_logging_with_level,
    set_debug_log_level,
};
pub use rmm_mr::vmm::VmmGrowthStatistics;
pub use rmm_mr::{
    current_device_resource, per_device_resource, prefetch, reset_current_device_resource,
    reset_per_device_resource, resource_cast, set_current_device_resource, set_per_device_resource,
    shared, AlignedOptions, AlignedResourceAdaptor, ArenaMemoryResource, ArenaOptions,
    BinningMemoryResource, BinningOptions, BlockRecord, CallbackMemoryResource,
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncOptions,
    CudaAsyncViewMemoryResource, CudaMemoryResource, DeviceMemoryResource, FailureCallbackOptions,
    FailureCallbackResourceAdaptor, FixedSizeMemoryResource, FixedSizeOptions, Frame,
    HistoryOptions, HistoryResourceAdaptor, InvalidFree, LimitingOptions, LimitingResourceAdaptor,
    LoggingOptions, LoggingResourceAdaptor, ManagedMemoryResource, MrError, MrResult, OomReport,
    PinnedHostMemoryResource, PoolMemoryResource, PoolOptions, PoolStatistics,
    PrefetchResourceAdaptor, PrefetchTarget, ResourceProperties, SamHeadroomMemoryResource,
    Segment, SharedResource, SimulatedMemoryResource, Snapshot, StatisticsResourceAdaptor,
    SystemMemoryResource, ThreadSafeResourceAdaptor, TraceAction, TraceEvent, TrackingOptions,
    TrackingResourceAdaptor, Verdict, VmmPoolMemoryResource, VmmPoolOptions,
};
pub use rmm_stream::{
    default_stream_mode, set_default_stream_mode, CudaEvent, CudaStream, CudaStreamPool,
    CudaStreamView, DefaultStreamMode, StreamError, StreamFlags,
};
pub use rmm_sys::{
    available_device_memory, current_device, device_count, device_name, device_synchronize,
    driver_version, gpu_unavailable_reason, is_driver_present, percent_of_free_device_memory,
    set_current_device, ComputeCapability, CudaError, DeviceCapabilities, DeviceGuard, DeviceId,
    DevicePtr, DriverVersion, ALLOCATION_ALIGNMENT,
};

/// This crate's version (`CARGO_PKG_VERSION`), e.g. for bug reports next to
/// [`driver_version`].
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub use size::{ByteSize, ParseByteSizeError};
/// The names most programs need.
pub mod prelude {
    pub use crate::{reinitialize, ReinitializeOptions};
    pub use rmm_containers::{DeviceBuffer, DeviceScalar, DeviceUvector};
    pub use rmm_mr::{
        ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
        CudaAsyncMemoryResource, CudaAsyncOptions, CudaMemoryResource, DeviceMemoryResource,
        LimitingOptions, LimitingResourceAdaptor, ManagedMemoryResource, MrError, MrResult,
        OomReport, PoolMemoryResource, PoolOptions, SharedResource, Snapshot,
        StatisticsResourceAdaptor, Verdict, VmmPoolMemoryResource, VmmPoolOptions,
    };
    pub use rmm_stream::{CudaEvent, CudaStream, CudaStreamView};
    pub use rmm_sys::{DeviceId, DevicePtr};
}
