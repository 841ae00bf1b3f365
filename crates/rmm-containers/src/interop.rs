//! Interoperation with the rest of the Rust GPU ecosystem.
//!
//! - [`configure_device_default_pool`] (always available): cudarc, candle and cubecl allocate
//!   with `cuMemAllocAsync` from a device's *current* memory pool, whose release threshold is 0
//!   by default (memory goes back to the driver at every synchronization). Raising the
//!   threshold, and trimming on demand, changes their behaviour without touching their code.
//! - With the `cudarc` feature: cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and
//!   `PushKernelArg` for [`DeviceUvector`](crate::DeviceUvector), cudarc streams as
//!   [`BufferStream`](crate::BufferStream)s, and stream conversions both ways.

#[cfg(feature = "cudarc")]
mod cudarc;
mod pool;

#[cfg(feature = "cudarc")]
pub use self::cudarc::{cudarc_context, static_stream_for_cudarc, wrap_stream_for_cudarc};
#[cfg(feature = "cudarc")]
pub use crate::stream::cudarc_stream_view;
pub use pool::{configure_device_default_pool, device_pool_state, DevicePoolState};
