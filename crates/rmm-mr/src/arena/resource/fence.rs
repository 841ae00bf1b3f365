//! Stream-ordering tools of the arena resource: a pool of reusable events (fences recorded on the
//! stream of a free) and the device-wide synchronization of defragmentation.

use std::sync::Mutex;

use rmm_stream::{CudaEvent, CudaStreamView};
use rmm_sys::CudaResult;

use super::key::ArenaKey;
use super::lock;

/// Events kept for reuse; beyond this many, returned events are destroyed.
const MAX_POOLED_EVENTS: usize = 1024;

/// Reusable events (creating one costs a driver call and some memory, recording one is cheap).
///
/// The pool's mutex is a leaf lock: nothing else is acquired while it is held.
#[derive(Debug, Default)]
pub(super) struct EventPool {
    events: Mutex<Vec<CudaEvent>>,
}

impl EventPool {
    /// A pooled event, or a new one (timing disabled).
    pub(super) fn take(&self) -> CudaResult<CudaEvent> {
        match lock(&self.events).pop() {
            Some(event) => Ok(event),
            None => CudaEvent::new(),
        }
    }

    /// Whether the pool's lock is held now, by any thread (tests).
    #[cfg(test)]
    pub(super) fn is_locked(&self) -> bool {
        self.events.try_lock().is_err()
    }

    /// Returns an event for reuse. Re-recording an event is allowed at any time: a stream that
    /// waited on it, or a query made earlier, refers to the record it saw.
    pub(super) fn give(&self, event: CudaEvent) {
        let mut events = lock(&self.events);
        if events.len() < MAX_POOLED_EVENTS {
            events.push(event);
        }
    }

    /// Returns an optional event for reuse.
    pub(super) fn give_opt(&self, event: Option<CudaEvent>) {
        if let Some(event) = event {
            self.give(event);
        }
    }

    /// A fence: a pooled event recorded at the current end of `stream`. It completes once all
    /// work queued on `stream` so far has completed; it never refers to the stream again, so the
    /// stream may be destroyed right after.
    pub(super) fn record(&self, stream: CudaStreamView<'_>) -> CudaResult<CudaEvent> {
        let event = self.take()?;
        match event.record(stream) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.give(event);
                Err(e)
            }
        }
    }
}

/// How one free is ordered: the key of the freeing stream and the event the block's next user
/// must wait for, recorded on the freeing stream, or on the legacy default stream for a free
/// across threads ([`crate::util::cross_thread`]). Without a device there is never an event.
#[derive(Debug)]
pub(super) struct FreeFence {
    /// The freeing stream's key.
    pub(super) freeing: ArenaKey,
    /// The event, once recorded.
    pub(super) event: Option<CudaEvent>,
    /// Whether `event` is (or, without a device, would be) recorded on the legacy stream.
    pub(super) on_legacy: bool,
}

impl FreeFence {
    /// No event yet, for a free on the stream with key `freeing`.
    pub(super) fn new(freeing: ArenaKey) -> Self {
        Self {
            freeing,
            event: None,
            on_legacy: false,
        }
    }
}

/// Blocks until all work on the current device has completed (`cuCtxSynchronize`, the driver
/// API's `cudaDeviceSynchronize`).
pub(super) fn device_synchronize() -> CudaResult<()> {
    // rmm-sys's wrapper reads the result as an integer (cudarc's `CUresult` enum would be
    // undefined behaviour for a code newer than its bindings).
    rmm_sys::device_synchronize()
}
