//! CUDA events.

use std::fmt;

use rmm_sys::raw::CUevent;
use rmm_sys::stream as raw;
use rmm_sys::{CudaResult, DeviceId};

use crate::view::CudaStreamView;

/// An owning CUDA event, destroyed on drop. Timing is disabled unless asked for (cheaper to
/// record and wait on).
pub struct CudaEvent {
    handle: usize,
    device: DeviceId,
}

impl CudaEvent {
    /// An event with timing disabled (`CU_EVENT_DISABLE_TIMING`).
    pub fn new() -> CudaResult<Self> {
        Self::create(raw::CU_EVENT_DISABLE_TIMING)
    }

    /// An event that records timestamps, for [`CudaEvent::elapsed_ms`].
    pub fn with_timing() -> CudaResult<Self> {
        Self::create(0)
    }

    fn create(flags: u32) -> CudaResult<Self> {
        let device = rmm_sys::current_device()?;
        let handle = raw::event_create(flags)?;
        Ok(Self {
            handle: handle as usize,
            device,
        })
    }

    /// The raw handle.
    #[must_use]
    pub fn value(&self) -> CUevent {
        self.handle as CUevent
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: CudaStreamView<'_>) -> CudaResult<()> {
        // SAFETY: the event lives while `self` does; the view's handle is valid (its invariant).
        unsafe { raw::event_record(self.value(), stream.as_raw()) }
    }

    /// Makes future work on `stream` wait until the event's last record completes (device-side,
    /// the host does not block).
    pub fn wait(&self, stream: CudaStreamView<'_>) -> CudaResult<()> {
        // SAFETY: as `record`.
        unsafe { raw::stream_wait_event(stream.as_raw(), self.value()) }
    }

    /// Blocks the host until the event's last record completes.
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the event lives while `self` does.
        unsafe { raw::event_synchronize(self.value()) }
    }

    /// `true` once the work before the event's last record has completed.
    pub fn is_complete(&self) -> CudaResult<bool> {
        // SAFETY: the event lives while `self` does.
        unsafe { raw::event_query(self.value()) }
    }

    /// Milliseconds from `start`'s record to `end`'s (both created [`CudaEvent::with_timing`]).
    pub fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> CudaResult<f32> {
        // SAFETY: both events live for the call.
        unsafe { raw::event_elapsed_time(start.value(), end.value()) }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let guard = rmm_sys::DeviceGuard::new(self.device);
        // SAFETY: the handle came from `event_create` and is not used after this.
        let r = unsafe { raw::event_destroy(self.value()) };
        drop(guard);
        if let Err(e) = r {
            log::error!("rmm: failed to destroy event {:#x}: {e}", self.handle);
        }
    }
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEvent({:#x} on device {})", self.handle, self.device)
    }
}
