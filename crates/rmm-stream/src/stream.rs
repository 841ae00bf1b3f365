//! Owning streams.

use std::fmt;

use rmm_sys::raw::CUstream;
use rmm_sys::stream as raw;
use rmm_sys::{CudaResult, DeviceId};

use crate::life::LiveStream;
use crate::view::CudaStreamView;

/// How a new stream synchronizes with the legacy default stream (RMM's
/// `cuda_stream::flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StreamFlags {
    /// Synchronizes with the legacy default stream (`cudaStreamDefault`).
    #[default]
    SyncDefault,
    /// Does not synchronize with the legacy default stream (`cudaStreamNonBlocking`).
    NonBlocking,
}

impl StreamFlags {
    fn raw(self) -> u32 {
        match self {
            Self::SyncDefault => 0,
            Self::NonBlocking => raw::CU_STREAM_NON_BLOCKING,
        }
    }
}

/// An owning CUDA stream (RMM's `cuda_stream`): created on the current device, destroyed when
/// dropped, move-only. Never the default or per-thread stream.
///
/// Views of it ([`CudaStream::view`]) borrow it, so none outlives it.
#[doc(alias = "rmm::cuda_stream")]
pub struct CudaStream {
    handle: usize,
    device: DeviceId,
    /// Registered as live until the stream is destroyed ([`StreamLife`](crate::StreamLife)).
    live: Option<LiveStream>,
    /// `cuStreamGetId`, read once at creation (0 if that failed: views then ask the driver),
    /// so that views answer [`CudaStreamView::id`] without a driver call.
    id: u64,
}

impl CudaStream {
    /// Creates a stream on the current device.
    pub fn new(flags: StreamFlags) -> CudaResult<Self> {
        let device = rmm_sys::current_device()?;
        let raw_handle = raw::stream_create(flags.raw())?;
        // SAFETY: the stream was just created and is alive. A failure only costs the views
        // their shortcut.
        let id = unsafe { raw::stream_get_id(raw_handle) }.unwrap_or(0);
        let handle = raw_handle as usize;
        Ok(Self {
            handle,
            device,
            live: Some(LiveStream::register(handle, id, device, true)),
            id,
        })
    }

    /// An owning stream over rmm-sys's fake stream number `n` (feature `testing`; see
    /// [`CudaStreamView::simulated`]): no driver call ever receives it, and dropping it destroys
    /// nothing but counts as a destroyed stream ([`StreamLife`](crate::StreamLife)). For tests without a GPU of
    /// what happens when a stream dies; two live simulated streams must not share `n`.
    #[cfg(feature = "testing")]
    #[must_use]
    pub fn simulated(n: u32) -> Self {
        let fake = rmm_sys::fault::fake_stream(n);
        // SAFETY: a fake handle never reaches a driver: the simulation answers its id.
        let id = unsafe { raw::stream_get_id(fake) }.unwrap_or(0);
        let handle = fake as usize;
        Self {
            handle,
            device: DeviceId(0),
            live: Some(LiveStream::register(handle, id, DeviceId(0), false)),
            id,
        }
    }

    /// Creates a stream that synchronizes with the legacy default stream.
    pub fn with_default_flags() -> CudaResult<Self> {
        Self::new(StreamFlags::SyncDefault)
    }

    /// Creates a non-blocking stream.
    pub fn non_blocking() -> CudaResult<Self> {
        Self::new(StreamFlags::NonBlocking)
    }

    /// A view of this stream, valid while the stream lives.
    #[must_use]
    pub fn view(&self) -> CudaStreamView<'_> {
        // SAFETY: the handle is a live stream for as long as `self` is borrowed, and `id` is
        // its id (or 0).
        unsafe { CudaStreamView::with_id(self.value(), self.id) }
    }

    /// The raw handle.
    #[must_use]
    pub fn value(&self) -> CUstream {
        self.handle as CUstream
    }

    /// The device the stream was created on.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Blocks until all work queued on the stream has completed.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.view().synchronize()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // Dead at once: per-stream state of its users is never used after this. The stream is
        // destroyed now, or by the last pin that a thief of a stream-ordered resource holds
        // for an event record ([`StreamLife`](crate::StreamLife)); views borrow `self`, so none is left.
        drop(self.live.take());
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaStream({:#x} on device {})",
            self.handle, self.device
        )
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_stream_dies_when_dropped() {
        let before = crate::destroyed_streams();
        let s = CudaStream::simulated(0x5157);
        let life = s.view().life().expect("an owning stream has a life");
        assert!(life.is_alive());
        assert!(CudaStreamView::legacy().life().is_none());
        assert!(CudaStreamView::per_thread().life().is_none());
        drop(s);
        assert!(!life.is_alive());
        assert!(crate::destroyed_streams() > before);
    }

    #[test]
    fn views_of_an_owning_stream_know_its_id() {
        use rmm_sys::fault::{self, DriverCall, FaultScope};
        let s = CudaStream::simulated(0x5158);
        let _scope = FaultScope::new();
        // SAFETY: the fake handle is the stream's; a raw view knows no id and asks.
        let asked = unsafe { CudaStreamView::from_raw(s.value()) }.id().unwrap();
        assert_eq!(fault::calls(DriverCall::StreamId), 1);
        assert_eq!(s.view().id(), Ok(asked));
        assert_eq!(s.view().id(), Ok(asked));
        assert_eq!(
            fault::calls(DriverCall::StreamId),
            1,
            "the view asked the driver"
        );
    }
}
