//! # rmm-containers: stream-ordered device containers for rmm-rs
//!
//! RMM's containers in Rust: [`DeviceBuffer`] (untyped bytes, `rmm::device_buffer`),
//! [`DeviceUvector<T>`] (typed, uninitialized, `rmm::device_uvector`) and [`DeviceScalar<T>`]
//! (one value, `rmm::device_scalar`), plus [`interop`] with cudarc and the driver's pools.
//!
//! **Contract.**
//! - **Memory** comes from a memory resource ([`rmm_mr::DeviceMemoryResource`]) that the
//!   container keeps alive ([`rmm_mr::SharedResource`]); without an explicit one, the current
//!   device's resource at construction. Replacing the device's resource later does not affect
//!   live containers: they free into their own.
//! - **Streams** are owned, not borrowed: a container stores a [`BufferStream`] that shares
//!   ownership of its stream (or is a `'static` special stream), so, unlike RMM's stored
//!   `cuda_stream_view`, it can never free on a destroyed stream. Pass
//!   `CudaStreamView::default()`, an `Arc<CudaStream>`, or (feature `cudarc`) a cudarc stream.
//! - **Stream ordering: which stream orders what.** Memory is usable on the container's stream
//!   at once. A method given another stream orders itself: its work on that stream waits for
//!   the work queued on the container's stream (an event, no host wait), and, where that work
//!   may still run on return while the container stays on its stream, the container's stream
//!   waits for it, so no stream reads or reuses bytes another is still writing, and the free
//!   comes last. `set_stream`, `resize`, `reserve` and `shrink_to_fit` make the new stream wait
//!   for the old one before recording it. The container's own stream costs nothing extra. RMM
//!   leaves this ordering to the caller; rmm-rs does it because these methods are safe (see
//!   [`DeviceBuffer`]'s "Stream ordering"). Work the caller enqueues on raw pointers (kernels)
//!   is still the caller's to order.
//! - **Devices**: each container records the device current at its construction and makes it
//!   current around every allocation, copy and free (also in `Drop`).
//! - **Errors** are [`rmm_mr::MrError`] values; argument errors (alignment, length overflow,
//!   index out of range) are reported before any CUDA call, so they behave the same with and
//!   without a GPU. A free that fails where nobody can be told (`Drop`) is logged and kept for
//!   [`take_drop_errors`].
//! - **No implicit copies**: deep copies take a stream and a resource (`try_clone_on`).
//! - **Threads**: all public types are `Send + Sync` (for `Send + Sync` element types).
//!
//! ```no_run
//! use rmm_containers::{DeviceBuffer, DeviceUvector};
//! use rmm_stream::CudaStreamView;
//!
//! let stream = CudaStreamView::default();
//! let buf = DeviceBuffer::new(1024, stream)?;
//! assert_eq!(buf.capacity(), 1024);
//!
//! let v = DeviceUvector::from_slice(&[1.0f32, -0.0, 3.5], stream, None)?;
//! assert_eq!(v.element(1, stream)?.to_bits(), (-0.0f32).to_bits());
//! # Ok::<(), rmm_mr::MrError>(())
//! ```

mod buffer;
mod drop_errors;
pub mod interop;
mod layout;
mod peer;
mod raw;
mod scalar;
mod stream;
mod uvector;

pub use buffer::DeviceBuffer;
pub use drop_errors::{drop_errors_discarded, take_drop_errors, DROP_ERROR_CAPACITY};
pub use scalar::DeviceScalar;
pub use stream::BufferStream;
pub use uvector::DeviceUvector;

#[cfg(test)]
mod send_sync {
    //! Compile-time `Send`/`Sync` assertions for the public types.
    use super::*;

    const fn assert_send_sync<T: Send + Sync>() {}

    const _: () = {
        assert_send_sync::<DeviceBuffer>();
        assert_send_sync::<DeviceUvector<f32>>();
        assert_send_sync::<DeviceUvector<u8>>();
        assert_send_sync::<DeviceScalar<i64>>();
        assert_send_sync::<BufferStream>();
        assert_send_sync::<interop::DevicePoolState>();
    };
}
