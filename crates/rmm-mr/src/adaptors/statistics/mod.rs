//! The pure half of RMM's `statistics_resource_adaptor`: byte and allocation counters with
//! nested push/pop frames, sharded per thread with a lock-free recording path and an exact
//! peak. See [`StatisticsCounters`].

pub mod adaptor;
mod budget;
mod counter;
mod counters;
mod shard;

pub use adaptor::StatisticsResourceAdaptor;
pub use counter::Counter;
pub use counters::{StatisticsCounters, StatsError};
