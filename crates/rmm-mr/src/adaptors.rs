//! The adaptors: each wraps an upstream resource and adds one behaviour (alignment, a limit,
//! a lock, a failure callback, prefetching, statistics, tracking, logging).

mod aligned;
mod failure_callback;
mod history;
mod limiting;
pub(crate) mod logging;
mod prefetch;
pub(crate) mod statistics;
mod thread_safe;
pub(crate) mod tracking;

pub use aligned::{AlignedOptions, AlignedResourceAdaptor};
pub use failure_callback::{
    FailureCallback, FailureCallbackOptions, FailureCallbackResourceAdaptor, FailureFilter,
};
pub use history::{HistoryOptions, HistoryResourceAdaptor};
pub use limiting::{LimitingOptions, LimitingResourceAdaptor};
pub use logging::LoggingResourceAdaptor;
pub use prefetch::{prefetch, PrefetchResourceAdaptor, PrefetchTarget};
pub use statistics::{MemoryProfiler, RegionGuard, RegionRecord, StatisticsResourceAdaptor};
pub use thread_safe::ThreadSafeResourceAdaptor;
pub use tracking::TrackingResourceAdaptor;
