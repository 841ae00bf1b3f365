//! Memory that explains itself: out-of-memory reports and snapshots.
//!
//! - [`OomReport`]: what a resource knew when it refused a request (bytes requested, reserved,
//!   in use, free, the largest free block, the free bytes in each stream's list, the limit) and
//!   a [`Verdict`]. Carried by [`MrError::OutOfMemory`](crate::MrError) and read with
//!   [`MrError::oom_report`](crate::MrError::oom_report); built only on the failure path.
//! - [`Snapshot`]: a resource's segments (upstream chunks) and their blocks, plus a trace of
//!   events, from [`DeviceMemoryResource::snapshot`](crate::DeviceMemoryResource::snapshot).
//!   [`Snapshot::write_pickle`] writes the file `torch.cuda.memory._dump_snapshot` writes, so
//!   PyTorch's viewer (`python -m torch.cuda._memory_viz trace_plot FILE -o a.html`) opens it;
//!   [`Snapshot::write_json`] writes the same dictionary as JSON.
//!
//! This module makes no CUDA calls.

pub(crate) mod build;
mod report;
mod snapshot;
#[cfg(test)]
mod tests;
mod torch;

pub use report::{OomReport, Verdict};
pub use snapshot::{BlockRecord, Frame, Segment, Snapshot, TraceAction, TraceEvent};
