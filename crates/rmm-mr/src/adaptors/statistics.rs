//! The pure half of RMM's `statistics_resource_adaptor`: byte and allocation counters with
//! nested push/pop frames, sharded per thread with a lock-free recording path and an exact
//! peak. See [`StatisticsCounters`].

mod adaptor;
mod budget;
mod counter;
pub(crate) mod counters;
#[cfg(all(test, loom))]
mod loom_tests;
mod profiler;
mod shard;

pub use adaptor::StatisticsResourceAdaptor;
pub use counter::Counter;
pub(crate) use counters::{StatisticsCounters, StatsError};
pub use profiler::{MemoryProfiler, RegionGuard, RegionRecord};
