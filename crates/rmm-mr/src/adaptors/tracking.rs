//! The pure half of RMM's `tracking_resource_adaptor`: which allocations are outstanding,
//! their byte sum and optional allocation stacks, and detection of wrong frees (untracked,
//! double, wrong size). See [`TrackingRegistry`].

mod adaptor;
mod error;
pub(crate) mod registry;
mod shard;

pub use adaptor::TrackingResourceAdaptor;
pub use error::{TrackingError, TrackingErrorRecord};
pub(crate) use registry::TrackingRegistry;
pub use registry::{OutstandingAllocation, TrackingOptions};
