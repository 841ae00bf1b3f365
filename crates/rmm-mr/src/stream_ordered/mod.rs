//! The stream-ordered core shared by the pool and the fixed-size resource (RMM's
//! `stream_ordered_memory_resource`): per-stream free lists, the event rule, the record of
//! handed-out blocks, and the append-only storage the lists live in.

pub(crate) mod append_only;
pub(crate) mod core;
pub(crate) mod event_policy;
pub(crate) mod handed;
pub(crate) mod stream_lists;
