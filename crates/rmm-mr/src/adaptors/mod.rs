//! The adaptors: each wraps an upstream resource and adds one behaviour (alignment, a limit,
//! a lock, a failure callback, prefetching, statistics, tracking, logging).

pub mod aligned;
pub mod failure_callback;
pub mod limiting;
pub mod logging;
pub mod prefetch;
pub mod statistics;
pub mod thread_safe;
pub mod tracking;

pub use aligned::AlignedResourceAdaptor;
pub use failure_callback::FailureCallbackResourceAdaptor;
pub use limiting::LimitingResourceAdaptor;
pub use logging::LoggingResourceAdaptor;
pub use prefetch::PrefetchResourceAdaptor;
pub use statistics::StatisticsResourceAdaptor;
pub use thread_safe::ThreadSafeResourceAdaptor;
pub use tracking::TrackingResourceAdaptor;
