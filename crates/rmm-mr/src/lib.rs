//! # rmm-mr: memory resources for rmm-rs
//!
//! **Contract.** The [`DeviceMemoryResource`] trait is RMM's central idea: one interface, many
//! implementations chosen at run time, composed by wrapping.
//!
//! - **Stream ordering belongs to the caller.** `allocate(stream, ..)` returns memory usable on
//!   `stream` at once; `deallocate(stream, ..)` must name a stream on which the memory may be
//!   reused immediately. Resources that sub-allocate (pool, arena, ...) keep the promise across
//!   streams themselves (events), never by blocking the host unless documented.
//! - **Thread safety**: every resource and adaptor is `Send + Sync`; allocate and deallocate may
//!   be called concurrently from any thread. Construction and drop are ordinary Rust values.
//! - **Ownership**: resources are cheap to clone and clones share state (and compare equal);
//!   adaptors and sub-allocators own their upstream (a concrete type, or a type-erased
//!   [`SharedResource`]); anything that allocates keeps its resource alive. RMM's dangling
//!   non-owning references cannot happen here.
//! - **Errors are values**: out-of-memory is [`MrError::OutOfMemory`], distinct from every other
//!   failure; bad alignments and absurd sizes are typed errors; a wrong free the resource can
//!   detect is [`MrError::InvalidFree`] instead of RMM's abort. No driver: `Err`, never a panic.
//! - **Devices**: a resource is used with the device that was current at its construction
//!   (containers switch for you); [`set_per_device_resource`] and [`current_device_resource`]
//!   hold one resource per device.
//!
//! Pure bookkeeping (free lists, bins, arenas, counters, the CSV log) lives in modules that make
//! no CUDA calls and are tested on machines without a GPU. The tree of this crate and design
//! notes on its cores: `docs/internals/` in the repository.

pub mod adaptors;
pub mod arena;
pub mod binning;
#[cfg(feature = "debug-log")]
pub mod debug_log;
mod diagnostics;
mod error;
#[cfg(test)]
mod fault_tests;
pub mod fixed_size;
pub mod pool;
mod prefetch;
mod registry;
mod resource;
pub mod resources;
mod stream_ordered;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod util;
pub mod vmm;

pub use adaptors::logging::LoggingOptions;
pub use adaptors::tracking::TrackingOptions;
pub use adaptors::{
    AlignedOptions, AlignedResourceAdaptor, FailureCallbackOptions, FailureCallbackResourceAdaptor,
    HistoryOptions, HistoryResourceAdaptor, LimitingOptions, LimitingResourceAdaptor,
    LoggingResourceAdaptor, PrefetchResourceAdaptor, StatisticsResourceAdaptor,
    ThreadSafeResourceAdaptor, TrackingResourceAdaptor,
};
pub use arena::{ArenaMemoryResource, ArenaOptions};
pub use binning::{BinningMemoryResource, BinningOptions};
#[cfg(feature = "debug-log")]
pub use debug_log::{init_debug_logging, set_debug_log_level};
pub use diagnostics::{
    BlockRecord, Frame, OomReport, Segment, Snapshot, TraceAction, TraceEvent, Verdict,
};
pub use error::{InvalidFree, MrError, MrResult};
pub use fixed_size::{FixedSizeMemoryResource, FixedSizeOptions};
pub use pool::{PoolMemoryResource, PoolOptions};
pub use prefetch::{prefetch, PrefetchTarget};
pub use registry::{
    current_device_resource, per_device_resource, reset_current_device_resource,
    reset_per_device_resource, set_current_device_resource, set_per_device_resource,
};
pub use resource::{
    resource_cast, shared, DeviceMemoryResource, ResourceProperties, SharedResource,
};
pub use resources::{
    CallbackMemoryResource, CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource,
    CudaAsyncOptions, CudaAsyncViewMemoryResource, CudaMemoryResource, ManagedMemoryResource,
    PinnedHostMemoryResource, PoolStatistics, SamHeadroomMemoryResource, SimulatedMemoryResource,
    SystemMemoryResource,
};
pub use util::alignment::MAX_OVER_ALIGNMENT;
pub use util::format::format_bytes;
pub use vmm::{VmmPoolMemoryResource, VmmPoolOptions};

/// The pure bookkeeping cores, for this workspace's benchmarks, fuzz targets and property
/// checks only: **not** part of the API (no semver promise, hidden from the docs). The
/// resources above are the API; these are the parts they are built from. See CONTRIBUTING.md,
/// "Internals for benchmarks".
#[doc(hidden)]
pub mod __internals {
    /// The arena's bookkeeping (superblocks, the global and local arenas, size classes).
    pub mod arena {
        pub use crate::arena::block::Block;
        pub use crate::arena::error::{ArenaError, RejectedSuperblock};
        pub use crate::arena::global_arena::{GlobalArena, SuperblockLocation};
        pub use crate::arena::local_arena::LocalArena;
        pub use crate::arena::size_class::{
            align_down, align_to_size_class, align_up, ALLOCATION_ALIGNMENT, MAX_SIZE_CLASS,
        };
        pub use crate::arena::stats::ArenaStats;
        pub use crate::arena::superblock::Superblock;
    }

    /// The pool's coalescing free list and growth policy, and how many stream lists a pool
    /// keeps.
    pub mod pool {
        pub use crate::pool::free_list::{Block, CoalescingFreeList, FreeListError};
        pub use crate::pool::growth::{
            size_to_grow, size_under_pressure, try_to_expand, Grown, GrowthError, GrowthFailure,
            GrowthPlan, PoolOutOfMemory, PoolSizes,
        };
        pub use crate::pool::resource::stream_lists;
        pub use crate::stream_ordered::core::StreamLists;
    }

    /// The fixed-size resource's chunks and block table, and how many stream lists it keeps.
    pub mod fixed_size {
        pub use crate::fixed_size::block_table::{BlockId, BlockLedger, BlockTable, ChunkBlocks};
        pub use crate::fixed_size::chunk::{rounded_block_size, Chunk, FixedSizeError};
        pub use crate::fixed_size::resource::stream_lists;
    }

    /// The binning resource's bin table and lock-free routes.
    pub mod binning {
        pub use crate::binning::routes::{BinRoutes, InsertError, Version};
        pub use crate::binning::table::{exponent_sizes, rounded_bin_size, BinningError};
    }

    /// The statistics adaptor's sharded counters.
    pub mod statistics {
        pub use crate::adaptors::statistics::counters::{StatisticsCounters, StatsError};
    }

    /// The tracking adaptor's registry of outstanding allocations.
    pub mod tracking {
        pub use crate::adaptors::tracking::registry::TrackingRegistry;
    }
}

#[cfg(test)]
mod send_sync {
    //! Compile-time `Send`/`Sync` assertions for the public types.
    use super::*;

    const fn assert_send_sync<T: Send + Sync>() {}

    const _: () = {
        assert_send_sync::<MrError>();
        assert_send_sync::<SharedResource>();
        assert_send_sync::<CudaMemoryResource>();
        assert_send_sync::<ManagedMemoryResource>();
        assert_send_sync::<PinnedHostMemoryResource>();
        assert_send_sync::<SystemMemoryResource>();
        assert_send_sync::<SamHeadroomMemoryResource>();
        assert_send_sync::<CudaAsyncMemoryResource>();
        assert_send_sync::<CudaAsyncViewMemoryResource>();
        assert_send_sync::<CudaAsyncManagedMemoryResource>();
        assert_send_sync::<CallbackMemoryResource>();
        assert_send_sync::<SimulatedMemoryResource>();
        assert_send_sync::<LimitingResourceAdaptor>();
        assert_send_sync::<LimitingResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<ArenaMemoryResource>();
        assert_send_sync::<ArenaMemoryResource<testing::HostMockResource>>();
        assert_send_sync::<testing::HostMockResource>();
        assert_send_sync::<PoolMemoryResource>();
        assert_send_sync::<PoolMemoryResource<CudaMemoryResource>>();
        assert_send_sync::<VmmPoolMemoryResource>();
        assert_send_sync::<FixedSizeMemoryResource>();
        assert_send_sync::<FixedSizeMemoryResource<CudaMemoryResource>>();
        assert_send_sync::<BinningMemoryResource>();
        assert_send_sync::<BinningMemoryResource<CudaMemoryResource>>();
        assert_send_sync::<AlignedResourceAdaptor>();
        assert_send_sync::<AlignedResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<LoggingResourceAdaptor>();
        assert_send_sync::<LoggingResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<StatisticsResourceAdaptor>();
        assert_send_sync::<StatisticsResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<TrackingResourceAdaptor>();
        assert_send_sync::<TrackingResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<ThreadSafeResourceAdaptor>();
        assert_send_sync::<ThreadSafeResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<FailureCallbackResourceAdaptor>();
        assert_send_sync::<FailureCallbackResourceAdaptor<CudaMemoryResource>>();
        assert_send_sync::<PrefetchResourceAdaptor>();
        assert_send_sync::<HistoryResourceAdaptor>();
        assert_send_sync::<PrefetchResourceAdaptor<CudaMemoryResource>>();
        #[cfg(feature = "debug-log")]
        assert_send_sync::<debug_log::DebugLogError>();
    };
}
