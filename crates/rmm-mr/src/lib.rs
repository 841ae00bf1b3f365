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

mod adaptors;
mod arena;
mod binning;
#[cfg(feature = "debug-log")]
mod debug_log;
mod diagnostics;
mod error;
mod fixed_size;
mod graph;
#[cfg(unix)]
mod ipc;
mod pinned;
mod pool;
mod registry;
mod resource;
mod resources;
mod stream_ordered;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod util;
mod vmm;

pub use adaptors::logging::{
    current_thread_number, default_log_filename, format_header, parse_log, parse_log_lines,
    parse_log_str, push_event, write_event, write_header, Action, Column, CsvError, EventLine,
    EventTime, InvalidEventTime, LoggingOptions, MemoryEvent, HEADER, LOG_FILE_ENV,
};
pub use adaptors::statistics::Counter;
pub use adaptors::tracking::{
    OutstandingAllocation, TrackingError, TrackingErrorRecord, TrackingOptions,
};
pub use adaptors::{
    prefetch, AlignedOptions, AlignedResourceAdaptor, FailureCallback, FailureCallbackOptions,
    FailureCallbackResourceAdaptor, FailureFilter, LimitingOptions, LimitingResourceAdaptor,
    LoggingResourceAdaptor, PrefetchResourceAdaptor, PrefetchTarget, StatisticsResourceAdaptor,
    ThreadSafeResourceAdaptor, TrackingResourceAdaptor,
};
pub use adaptors::{
    HistoryOptions, HistoryResourceAdaptor, MemoryProfiler, RegionGuard, RegionRecord,
};
pub use arena::{ArenaMemoryResource, ArenaOptions, DUMP_LOG_TARGET, SUPERBLOCK_MIN_SIZE};
pub use binning::{BinningMemoryResource, BinningOptions};
#[cfg(feature = "debug-log")]
pub use debug_log::{
    debug_log_level, flush_debug_log, init_debug_logging, init_debug_logging_with_level,
    set_debug_log_level, DebugLogError, DEBUG_LOG_FILE_ENV,
};
pub use diagnostics::{
    BlockRecord, Frame, OomReport, Segment, Snapshot, TraceAction, TraceEvent, Verdict,
};
pub use error::{InvalidFree, MrError, MrResult};
pub use fixed_size::{
    FixedSizeMemoryResource, FixedSizeOptions, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
pub use graph::{
    active_capture_scopes, CaptureScope, GraphPool, GraphPoolOptions, DEFAULT_GRAPH_POOL_CHUNK_SIZE,
};
#[cfg(unix)]
pub use ipc::{
    ExportId, ImportedAllocation, IpcAllocation, IpcChannel, IpcError, IpcExporter, IpcImporter,
    Released,
};
pub use pinned::{
    class_size as pinned_class_size, CudaAsyncHostMemoryResource, PinnedAllocator, PinnedHostPool,
    PinnedPoolOptions, PinnedPoolStatistics, PinnedTransfer, PinnedVec, PINNED_MAX_ALIGNMENT,
};
pub use pool::{PoolMemoryResource, PoolOptions};
pub use registry::{
    current_device_resource, per_device_resource, reset_current_device_resource,
    reset_per_device_resource, set_current_device_resource, set_per_device_resource,
};
pub use resource::{
    resource_cast, shared, DeviceMemoryResource, ResourceProperties, SharedResource,
};
pub use resources::{
    AllocateCallback, CallbackMemoryResource, CudaAsyncManagedMemoryResource,
    CudaAsyncMemoryResource, CudaAsyncOptions, CudaAsyncViewMemoryResource, CudaMemoryResource,
    DeallocateCallback, ManagedMemoryResource, PinnedHostMemoryResource, PoolStatistics,
    SamHeadroomMemoryResource, SimulatedMemoryResource, SystemMemoryResource,
};
pub use util::alignment::MAX_OVER_ALIGNMENT;
pub use util::format::{format_bytes, HumanBytes};
pub use vmm::{
    ExportedChunk, VmmGrowthStatistics, VmmPoolMemoryResource, VmmPoolOptions,
    DEFAULT_MIN_GROWTH_PERCENT,
};

/// The pure bookkeeping cores, for this workspace's benchmarks, fuzz targets and property
/// checks only: **not** part of the API (no semver promise, hidden from the docs). The
/// resources above are the API; these are the parts they are built from. See CONTRIBUTING.md,
/// "Internals for benchmarks".
#[doc(hidden)]
pub mod __internals {
    /// The arena's global and local arenas and its size classes (the arena benchmark, the
    /// arena checker of `rmm-checks`), with the types their methods return.
    pub mod arena {
        pub use crate::arena::block::Block;
        pub use crate::arena::error::ArenaError;
        pub use crate::arena::global_arena::{GlobalArena, SuperblockLocation};
        pub use crate::arena::local_arena::LocalArena;
        pub use crate::arena::size_class::{align_to_size_class, align_up};
        pub use crate::arena::stats::ArenaStats;
        pub use crate::arena::superblock::{RejectedSuperblock, Superblock};
    }

    /// How many stream lists a pool keeps (`tests/retire`); the block and error types of the
    /// pool's free lists, and the coalescing free list that is their test model (its only users
    /// are tests).
    pub mod pool {
        pub use crate::pool::engine::{Block, FreeListError};
        pub use crate::pool::resource::stream_lists;
        pub use crate::stream_ordered::core::StreamLists;
        #[cfg(feature = "testing")]
        pub use crate::testing::coalescing_model::CoalescingFreeList;
    }

    /// How many stream lists a fixed-size resource keeps (`tests/retire`); the block table
    /// (methods only its tests call).
    pub mod fixed_size {
        pub use crate::fixed_size::block_table::{BlockId, BlockLedger, BlockTable, ChunkBlocks};
        pub use crate::fixed_size::chunk::{rounded_block_size, Chunk, FixedSizeError};
        pub use crate::fixed_size::resource::stream_lists;
    }

    /// The binning resource's bin table and lock-free routes (methods only their tests call).
    pub mod binning {
        pub use crate::binning::routes::{BinRoutes, InsertError, Version};
        pub use crate::binning::table::{exponent_sizes, rounded_bin_size, BinningError};
    }

    /// The pinned host pool's bookkeeping (size classes, free lists, pending events).
    pub mod pinned {
        pub use crate::pinned::core::{
            chunk_bytes_for, class_of, class_size, LedgerError, PinnedLedger, CHUNK_BYTES,
            MAX_CLASS, MIN_BLOCK,
        };
    }

    /// The statistics adaptor's sharded counters (the adaptor-core benchmark).
    pub mod statistics {
        pub use crate::adaptors::statistics::counters::{StatisticsCounters, StatsError};
    }

    /// The tracking adaptor's registry of outstanding allocations (the adaptor-core benchmark).
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
        assert_send_sync::<GraphPool>();
        assert_send_sync::<GraphPoolOptions>();
        assert_send_sync::<CaptureScope<'static>>();
        assert_send_sync::<SharedResource>();
        assert_send_sync::<CudaMemoryResource>();
        assert_send_sync::<ManagedMemoryResource>();
        assert_send_sync::<PinnedHostMemoryResource>();
        assert_send_sync::<PinnedHostPool>();
        assert_send_sync::<PinnedAllocator>();
        assert_send_sync::<PinnedTransfer<u64>>();
        assert_send_sync::<CudaAsyncHostMemoryResource>();
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
