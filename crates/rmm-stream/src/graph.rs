//! Stream capture and CUDA graphs as owned values: a capture begun on a stream view
//! ([`StreamCapture`], ended into a [`Graph`] or abandoned on drop), the graph and its
//! executable form ([`GraphExec`], launched on any stream), and a scope that sets the calling
//! thread's capture mode ([`CaptureModeGuard`]).
//!
//! A graph and its executable form can keep other values alive ([`Graph::keep_alive`]): memory
//! the graph's nodes use, such as rmm-mr's graph-private pools, stays reserved until the last
//! of them is dropped. Both are `Send` but not `Sync`: the driver does not allow one graph to
//! be used from two threads at once.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use rmm_sys::graph as raw;
use rmm_sys::raw::{CUgraph, CUgraphExec};
use rmm_sys::{CaptureMode, CaptureStatus, CudaResult};

use crate::CudaStreamView;

impl CudaStreamView<'_> {
    /// Whether the stream is being captured, and into which capture
    /// (`cuStreamGetCaptureInfo`). Legal during any capture.
    #[doc(alias = "cudaStreamGetCaptureInfo")]
    pub fn capture_status(&self) -> CudaResult<CaptureStatus> {
        // SAFETY: the handle is special or alive for the view's lifetime (its invariant).
        unsafe { raw::stream_capture_info(self.as_raw()) }
    }

    /// Whether the stream is in a capture sequence (`cuStreamIsCapturing`).
    #[doc(alias = "cudaStreamIsCapturing")]
    pub fn is_capturing(&self) -> CudaResult<bool> {
        // SAFETY: as `capture_status`.
        unsafe { raw::stream_is_capturing(self.as_raw()) }
    }
}

/// Sets the calling thread's capture mode for its lifetime and restores the previous mode when
/// dropped (`cuThreadExchangeStreamCaptureMode` twice). With [`CaptureMode::Relaxed`], the
/// thread may make potentially unsafe calls (`cuMemAlloc`) while another thread's global
/// capture lasts. Neither `Send` nor `Sync`: the mode belongs to the thread.
#[must_use = "the mode is restored when the guard is dropped"]
pub struct CaptureModeGuard {
    previous: CaptureMode,
    _thread: PhantomData<*const ()>,
}

impl CaptureModeGuard {
    /// Sets the calling thread's capture mode to `mode`.
    pub fn new(mode: CaptureMode) -> CudaResult<Self> {
        let previous = raw::exchange_capture_mode(mode)?;
        Ok(Self {
            previous,
            _thread: PhantomData,
        })
    }

    /// The mode the thread had before.
    #[must_use]
    pub fn previous(&self) -> CaptureMode {
        self.previous
    }
}

impl Drop for CaptureModeGuard {
    fn drop(&mut self) {
        if let Err(e) = raw::exchange_capture_mode(self.previous) {
            log::error!("rmm: restoring the thread's capture mode failed: {e}");
        }
    }
}

impl fmt::Debug for CaptureModeGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureModeGuard")
            .field("previous", &self.previous)
            .finish()
    }
}

/// What a graph keeps alive: shared values dropped with the last graph or executable graph
/// that holds them.
type KeepAlive = Vec<Arc<dyn Any + Send + Sync>>;

/// A capture in progress on a stream (`cuStreamBeginCapture`): work enqueued on the stream (and
/// on streams it forks to through events) is recorded, not run. [`end`](Self::end) returns the
/// [`Graph`]; dropping the value instead ends the capture and destroys what it recorded.
#[must_use = "a capture is ended (and its graph discarded) when dropped"]
pub struct StreamCapture<'a> {
    stream: CudaStreamView<'a>,
    id: u64,
    ended: bool,
}

impl<'a> StreamCapture<'a> {
    /// Begins capturing `stream` in `mode`. The legacy default stream cannot be captured (the
    /// driver's error); use a stream of your own, preferably non-blocking.
    #[doc(alias = "cudaStreamBeginCapture")]
    pub fn begin(stream: CudaStreamView<'a>, mode: CaptureMode) -> CudaResult<Self> {
        // SAFETY: the view's handle is special or alive for `'a`.
        unsafe { raw::stream_begin_capture(stream.as_raw(), mode) }?;
        let id = match stream.capture_status() {
            Ok(status) => status.id().unwrap_or(0),
            Err(e) => {
                // SAFETY: as above; the capture was begun on this stream.
                if let Ok(g) = unsafe { raw::stream_end_capture(stream.as_raw()) } {
                    // SAFETY: the graph was just returned and is used nowhere else.
                    let _ = unsafe { raw::graph_destroy(g) };
                }
                return Err(e);
            }
        };
        Ok(Self {
            stream,
            id,
            ended: false,
        })
    }

    /// The capture's id (what [`CudaStreamView::capture_status`] reports for every stream in
    /// this capture).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The stream the capture was begun on.
    #[must_use]
    pub fn stream(&self) -> CudaStreamView<'a> {
        self.stream
    }

    /// Ends the capture (`cuStreamEndCapture`) and returns its graph. An invalidated capture
    /// (a forbidden call happened during it) is the driver's error
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`); either way the stream is no longer capturing.
    #[doc(alias = "cudaStreamEndCapture")]
    pub fn end(mut self) -> CudaResult<Graph> {
        self.ended = true;
        // SAFETY: the capture was begun on this stream, alive for `'a`.
        let handle = unsafe { raw::stream_end_capture(self.stream.as_raw()) }?;
        Ok(Graph {
            handle,
            keep_alive: Vec::new(),
        })
    }
}

impl Drop for StreamCapture<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // SAFETY: the capture was begun on this stream, alive for `'a`.
        match unsafe { raw::stream_end_capture(self.stream.as_raw()) } {
            Ok(g) => {
                // SAFETY: the graph was just returned and is used nowhere else.
                if let Err(e) = unsafe { raw::graph_destroy(g) } {
                    log::error!("rmm: destroying an abandoned capture's graph failed: {e}");
                }
            }
            Err(e) => log::debug!("rmm: ending an abandoned capture: {e}"),
        }
    }
}

impl fmt::Debug for StreamCapture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamCapture")
            .field("stream", &self.stream)
            .field("id", &self.id)
            .finish()
    }
}

/// A graph (`CUgraph`) recorded by a capture, destroyed when dropped. Instantiate it to launch
/// it.
pub struct Graph {
    /// Invariant: a live graph, destroyed once, in `drop`.
    handle: CUgraph,
    keep_alive: KeepAlive,
}

impl Graph {
    /// Keeps `value` alive as long as this graph or any executable graph instantiated from it
    /// afterwards lives.
    pub fn keep_alive(&mut self, value: Arc<dyn Any + Send + Sync>) {
        self.keep_alive.push(value);
    }

    /// How many nodes the graph has (`cuGraphGetNodes`).
    pub fn node_count(&self) -> CudaResult<usize> {
        // SAFETY: the handle is live (the invariant).
        unsafe { raw::graph_node_count(self.handle) }
    }

    /// Instantiates the graph (`cuGraphInstantiateWithFlags` with `flags`, 0 for none, e.g.
    /// [`rmm_sys::graph::GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH`]). The executable graph keeps
    /// what this graph keeps alive.
    #[doc(alias = "cudaGraphInstantiate")]
    pub fn instantiate(&self, flags: u64) -> CudaResult<GraphExec> {
        // SAFETY: the handle is live (the invariant).
        let handle = unsafe { raw::graph_instantiate(self.handle, flags) }?;
        Ok(GraphExec {
            handle,
            keep_alive: self.keep_alive.clone(),
        })
    }

    /// The graph's handle, valid while this value lives.
    #[must_use]
    pub fn as_raw(&self) -> CUgraph {
        self.handle
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once, here.
        if let Err(e) = unsafe { raw::graph_destroy(self.handle) } {
            log::error!("rmm: destroying a graph failed: {e}");
        }
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("handle", &self.handle)
            .field("keep_alive", &self.keep_alive.len())
            .finish()
    }
}

/// An executable graph (`CUgraphExec`), destroyed when dropped (launches already enqueued still
/// complete; what it keeps alive is dropped then, so a value it keeps must not free memory that
/// pending launches use without waiting for them, as rmm-mr's graph pools do).
pub struct GraphExec {
    /// Invariant: a live executable graph, destroyed once, in `drop`.
    handle: CUgraphExec,
    keep_alive: KeepAlive,
}

impl GraphExec {
    /// Enqueues one run of the graph on `stream` (`cuGraphLaunch`). Runs of one executable
    /// graph are ordered among themselves by the driver even on different streams.
    #[doc(alias = "cudaGraphLaunch")]
    pub fn launch(&self, stream: CudaStreamView<'_>) -> CudaResult<()> {
        // SAFETY: the handle is live (the invariant); the view's handle is special or alive;
        // the memory the graph's nodes use is kept alive with this value (`keep_alive`) or is
        // the caller's, as with any enqueued work.
        unsafe { raw::graph_launch(self.handle, stream.as_raw()) }
    }

    /// Keeps `value` alive as long as this executable graph lives.
    pub fn keep_alive(&mut self, value: Arc<dyn Any + Send + Sync>) {
        self.keep_alive.push(value);
    }

    /// The executable graph's handle, valid while this value lives.
    #[must_use]
    pub fn as_raw(&self) -> CUgraphExec {
        self.handle
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once, here.
        if let Err(e) = unsafe { raw::graph_exec_destroy(self.handle) } {
            log::error!("rmm: destroying an executable graph failed: {e}");
        }
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphExec")
            .field("handle", &self.handle)
            .field("keep_alive", &self.keep_alive.len())
            .finish()
    }
}

// SAFETY: a graph handle may be used from any thread (with a context current, which rmm-sys
// ensures); `Graph` is not `Sync`, so one graph is never used by two threads at once, as the
// driver requires. The kept values are `Send + Sync`.
unsafe impl Send for Graph {}
// SAFETY: as above, for executable graphs.
unsafe impl Send for GraphExec {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_capture_is_an_error_not_a_panic() {
        if rmm_sys::is_driver_present() {
            return;
        }
        let s = CudaStreamView::default();
        assert!(s.capture_status().is_err());
        assert!(StreamCapture::begin(s, CaptureMode::Global).is_err());
        assert!(CaptureModeGuard::new(CaptureMode::Relaxed).is_err());
    }
}
