//! The adaptors: each wraps an upstream resource and adds one behaviour (alignment, a limit,
//! a lock, a failure callback, prefetching, statistics, tracking, logging).

mod aligned;
mod failure_callback;
mod history;
mod limiting;
pub mod logging;
mod prefetch;
pub mod statistics;
mod thread_safe;
pub mod tracking;

pub use aligned::{AlignedOptions, AlignedResourceAdaptor};
pub use failure_callback::{
    FailureCallback, FailureCallbackOptions, FailureCallbackResourceAdaptor, FailureFilter,
};
pub use history::{HistoryOptions, HistoryResourceAdaptor};
pub use limiting::{LimitingOptions, LimitingResourceAdaptor};
pub use logging::LoggingResourceAdaptor;
pub use prefetch::PrefetchResourceAdaptor;
pub use statistics::StatisticsResourceAdaptor;
pub use thread_safe::ThreadSafeResourceAdaptor;
pub use tracking::TrackingResourceAdaptor;
