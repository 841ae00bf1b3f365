//! # rmm-stream: CUDA streams and events for rmm-rs
//!
//! **Contract.** This layer owns stream *objects*, not stream *ordering*: it creates, views,
//! synchronizes and destroys streams and events, and enqueues nothing else. Which work goes on
//! which stream is the caller's business; memory resources above take a [`CudaStreamView`] and
//! order their allocations on it.
//!
//! - [`CudaStreamView`] is `Copy` and non-owning, like RMM's `cuda_stream_view`, but it borrows
//!   the [`CudaStream`] it views, so a view cannot dangle. The default, legacy and per-thread
//!   default streams are `'static`.
//! - What handle 0 ("the default stream") means is chosen once per process at run time
//!   ([`DefaultStreamMode`], from `RMM_DEFAULT_STREAM`), where RMM needs a second build.
//! - **Threads**: every type here is `Send + Sync`; streams, pools and events may be shared
//!   between threads (the driver serializes what it must). [`CudaStreamPool::get_stream`] is
//!   lock-free.
//! - A [`CudaStream`] is destroyed by the last of itself and its [`StreamPin`]s: another thread
//!   (rmm-mr's thief recording an event after the owner's work) can pin a live stream for a
//!   few calls without racing its destruction; dropping the `CudaStream` still ends its life
//!   at once ([`StreamLife`]).
//! - No driver: every constructor and operation returns an error, nothing panics.

mod error;
mod event;
mod graph;
mod life;
mod mode;
mod pool;
#[cfg(feature = "testing")]
mod stall;
mod stream;
mod view;

pub use error::StreamError;
pub use event::CudaEvent;
pub use graph::{CaptureModeGuard, Graph, GraphExec, StreamCapture};
pub use life::{destroyed_streams, StreamLife, StreamPin};
pub use mode::{
    default_stream_mode, set_default_stream_mode, DefaultStreamMode, DEFAULT_STREAM_ENV,
};
pub use pool::CudaStreamPool;
#[cfg(feature = "testing")]
pub use stall::stall;
pub use stream::{CudaStream, StreamFlags};
pub use view::CudaStreamView;

// SAFETY: these types hold plain integer handles of driver objects; the CUDA driver API may be
// called on any stream or event handle from any thread.
unsafe impl Send for CudaStream {}
// SAFETY: as above; all methods take `&self` and the driver synchronizes concurrent calls.
unsafe impl Sync for CudaStream {}
// SAFETY: as above.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

#[cfg(test)]
mod send_sync {
    //! Compile-time `Send`/`Sync` assertions for the public types.
    use super::*;

    const fn assert_send_sync<T: Send + Sync>() {}
    const fn assert_send<T: Send>() {}

    const _: () = {
        assert_send_sync::<CudaStreamView<'static>>();
        assert_send_sync::<CudaStream>();
        assert_send_sync::<CudaStreamPool>();
        assert_send_sync::<CudaEvent>();
        assert_send_sync::<StreamLife>();
        assert_send_sync::<StreamPin>();
        assert_send_sync::<StreamError>();
        assert_send_sync::<DefaultStreamMode>();
        assert_send::<Graph>();
        assert_send::<GraphExec>();
    };
}
