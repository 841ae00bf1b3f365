//! The pure half of RMM's `statistics_resource_adaptor`: byte and allocation counters with
//! nested push/pop frames and a lock-free recording path. See [`StatisticsCounters`].

pub mod adaptor;
mod counter;
mod counters;

pub use adaptor::StatisticsResourceAdaptor;
pub use counter::Counter;
pub use counters::{StatisticsCounters, StatsError};
