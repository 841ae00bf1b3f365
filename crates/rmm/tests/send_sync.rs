//! Which public types may cross threads (`Send`) and be shared between them (`Sync`), checked at
//! compile time, positive and negative (as tokio's `async_send_sync` test does). A change that
//! makes a type lose, or wrongly gain, one of these fails to compile here.

#![allow(missing_docs)]

use static_assertions::{assert_impl_all, assert_not_impl_any};

use rmm::containers::{BufferStream, DeviceBuffer, DeviceScalar, DeviceUvector};
use rmm::mr::{
    testing::HostMockResource, Action, AlignedOptions, AlignedResourceAdaptor, ArenaMemoryResource,
    ArenaOptions, BinningMemoryResource, BinningOptions, CallbackMemoryResource, CsvError,
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncOptions,
    CudaAsyncViewMemoryResource, CudaMemoryResource, DebugLogError, EventLine, EventTime,
    FailureCallbackOptions, FailureCallbackResourceAdaptor, FixedSizeMemoryResource,
    FixedSizeOptions, InvalidFree, LimitingOptions, LimitingResourceAdaptor, LoggingOptions,
    LoggingResourceAdaptor, ManagedMemoryResource, MemoryEvent, MrError, OutstandingAllocation,
    PinnedHostMemoryResource, PoolMemoryResource, PoolOptions, PoolStatistics,
    PrefetchResourceAdaptor, PrefetchTarget, ResourceProperties, SamHeadroomMemoryResource,
    SharedResource, SimulatedMemoryResource, StatisticsResourceAdaptor, SystemMemoryResource,
    ThreadSafeResourceAdaptor, TrackingError, TrackingErrorRecord, TrackingOptions,
    TrackingResourceAdaptor, VmmPoolMemoryResource,
};
use rmm::mr::{ExportedChunk, VmmGrowthStatistics, VmmPoolOptions};
use rmm::stream::{
    CudaEvent, CudaStream, CudaStreamPool, CudaStreamView, DefaultStreamMode, StreamError,
    StreamFlags,
};
use rmm::sys::vmm::{AddressRange, Mapping, PhysicalMemory};
use rmm::sys::{
    CudaError, DeviceGuard, DeviceId, DevicePtr, DriverVersion, MemLocation, PrimaryContext,
    ResultCode,
};
use rmm::{ByteSize, ParseByteSizeError, ReinitializeOptions};

// Resources and adaptors: shared across threads by contract (the trait requires both).
assert_impl_all!(SharedResource: Send, Sync);
assert_impl_all!(CudaMemoryResource: Send, Sync, Copy);
assert_impl_all!(ManagedMemoryResource: Send, Sync);
assert_impl_all!(PinnedHostMemoryResource: Send, Sync);
assert_impl_all!(SystemMemoryResource: Send, Sync);
assert_impl_all!(SamHeadroomMemoryResource: Send, Sync);
assert_impl_all!(CudaAsyncMemoryResource: Send, Sync);
assert_impl_all!(CudaAsyncViewMemoryResource: Send, Sync);
assert_impl_all!(CudaAsyncManagedMemoryResource: Send, Sync);
assert_impl_all!(CallbackMemoryResource: Send, Sync);
assert_impl_all!(SimulatedMemoryResource: Send, Sync, Clone);
assert_impl_all!(HostMockResource: Send, Sync);
assert_impl_all!(PoolMemoryResource: Send, Sync);
assert_impl_all!(PoolMemoryResource<CudaMemoryResource>: Send, Sync);
assert_impl_all!(VmmPoolMemoryResource: Send, Sync, Clone);
assert_impl_all!(ArenaMemoryResource: Send, Sync);
assert_impl_all!(ArenaMemoryResource<CudaMemoryResource>: Send, Sync);
assert_impl_all!(FixedSizeMemoryResource: Send, Sync);
assert_impl_all!(FixedSizeMemoryResource<CudaMemoryResource>: Send, Sync);
assert_impl_all!(BinningMemoryResource: Send, Sync);
assert_impl_all!(BinningMemoryResource<CudaMemoryResource>: Send, Sync);
assert_impl_all!(AlignedResourceAdaptor: Send, Sync);
assert_impl_all!(FailureCallbackResourceAdaptor: Send, Sync);
assert_impl_all!(LimitingResourceAdaptor: Send, Sync);
assert_impl_all!(LoggingResourceAdaptor: Send, Sync);
assert_impl_all!(PrefetchResourceAdaptor: Send, Sync);
assert_impl_all!(StatisticsResourceAdaptor: Send, Sync);
assert_impl_all!(ThreadSafeResourceAdaptor: Send, Sync);
assert_impl_all!(TrackingResourceAdaptor: Send, Sync);

// Options, values and errors: plain data.
assert_impl_all!(PoolOptions: Send, Sync);
assert_impl_all!(ArenaOptions: Send, Sync);
assert_impl_all!(FixedSizeOptions: Send, Sync);
assert_impl_all!(BinningOptions: Send, Sync);
assert_impl_all!(AlignedOptions: Send, Sync);
assert_impl_all!(LimitingOptions: Send, Sync);
assert_impl_all!(FailureCallbackOptions: Send, Sync);
// Its sinks are `Write + Send`: the options move to the adaptor, which locks each sink.
assert_impl_all!(LoggingOptions: Send);
assert_not_impl_any!(LoggingOptions: Sync);
assert_impl_all!(CudaAsyncOptions: Send, Sync);
assert_impl_all!(PoolStatistics: Send, Sync);
assert_impl_all!(VmmPoolOptions: Send, Sync);
assert_impl_all!(VmmGrowthStatistics: Send, Sync);
assert_impl_all!(ExportedChunk: Send, Sync);
assert_impl_all!(ResourceProperties: Send, Sync);
assert_impl_all!(PrefetchTarget: Send, Sync);
assert_impl_all!(TrackingOptions: Send, Sync);
assert_impl_all!(OutstandingAllocation: Send, Sync);
assert_impl_all!(MemoryEvent: Send, Sync);
assert_impl_all!(EventLine: Send, Sync);
assert_impl_all!(EventTime: Send, Sync);
assert_impl_all!(Action: Send, Sync);
assert_impl_all!(ReinitializeOptions: Send, Sync);
assert_impl_all!(ByteSize: Send, Sync);
assert_impl_all!(DevicePtr: Send, Sync);
assert_impl_all!(DeviceId: Send, Sync);
assert_impl_all!(DriverVersion: Send, Sync);
assert_impl_all!(ResultCode: Send, Sync);
assert_impl_all!(MemLocation: Send, Sync);
assert_impl_all!(PrimaryContext: Send, Sync);
assert_impl_all!(DefaultStreamMode: Send, Sync);
assert_impl_all!(StreamFlags: Send, Sync);
// Errors go into `Box<dyn Error + Send + Sync>` and across threads.
assert_impl_all!(MrError: Send, Sync, std::error::Error);
assert_impl_all!(InvalidFree: Send, Sync);
assert_impl_all!(CudaError: Send, Sync, std::error::Error);
assert_impl_all!(StreamError: Send, Sync, std::error::Error);
assert_impl_all!(CsvError: Send, Sync);
assert_impl_all!(TrackingError: Send, Sync);
assert_impl_all!(TrackingErrorRecord: Send, Sync);
assert_impl_all!(DebugLogError: Send, Sync);
assert_impl_all!(ParseByteSizeError: Send, Sync, std::error::Error);

// Streams and events: CUDA streams and events may be used from any thread.
assert_impl_all!(CudaStream: Send, Sync);
assert_impl_all!(CudaEvent: Send, Sync);
assert_impl_all!(CudaStreamPool: Send, Sync);
assert_impl_all!(CudaStreamView<'static>: Send, Sync, Copy);

// The virtual memory API's handles: owned driver objects, usable from any thread, never
// copied (a copy would unmap, release or free twice).
assert_impl_all!(AddressRange: Send, Sync);
assert_impl_all!(PhysicalMemory: Send, Sync);
assert_impl_all!(Mapping: Send, Sync);
assert_not_impl_any!(AddressRange: Copy, Clone);
assert_not_impl_any!(PhysicalMemory: Copy, Clone);
assert_not_impl_any!(Mapping: Copy, Clone);

// Containers: owned device memory moves between threads and may be read from several.
assert_impl_all!(DeviceBuffer: Send, Sync);
assert_impl_all!(DeviceUvector<f32>: Send, Sync);
assert_impl_all!(DeviceScalar<u64>: Send, Sync);
assert_impl_all!(BufferStream: Send, Sync);

// Negative: a guard restores the current device of the thread that made it, so it must stay
// on that thread (as `std::sync::MutexGuard` does).
assert_not_impl_any!(DeviceGuard: Send);
// Containers own their memory: a bitwise copy would free it twice.
assert_not_impl_any!(DeviceBuffer: Copy, Clone);
assert_not_impl_any!(DeviceUvector<f32>: Copy, Clone);
assert_not_impl_any!(DeviceScalar<u64>: Copy, Clone);
assert_not_impl_any!(CudaStream: Copy, Clone);
assert_not_impl_any!(CudaEvent: Copy, Clone);

// CUDA graphs: the graph pool is shared between threads; a graph and its executable form move
// between threads but are not shared (the driver forbids using one graph from two threads at
// once); the capture-mode guard belongs to its thread.
assert_impl_all!(rmm::GraphPool: Send, Sync);
assert_impl_all!(rmm::GraphPoolOptions: Send, Sync);
assert_impl_all!(rmm::CaptureScope<'static>: Send, Sync);
assert_impl_all!(rmm::Graph: Send);
assert_not_impl_any!(rmm::Graph: Sync);
assert_impl_all!(rmm::GraphExec: Send);
assert_not_impl_any!(rmm::GraphExec: Sync);
assert_not_impl_any!(rmm::CaptureModeGuard: Send, Sync);
