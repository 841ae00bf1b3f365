//! CUDA graphs: allocation under stream capture, and graph-private pools whose replays stay
//! valid.
//!
//! A [`GraphPool`] is memory private to the graphs captured with it (PyTorch's
//! `graph_pool_handle`). [`GraphPool::capture`] begins a capture on a stream and returns a
//! [`CaptureScope`]; while it lasts, every allocation the sub-allocators of this crate (pool,
//! arena, binning, fixed-size, VMM pool, and what wraps them) receive on a stream of that capture
//! (the stream itself or one it forked to through an event) is served by the graph pool instead,
//! and so is every later free of such a block. [`CaptureScope::end`] returns the
//! [`Graph`](rmm_stream::Graph), which keeps the pool's memory alive: the memory goes back to the
//! pool's upstream when the pool's handle, every graph and executable graph captured with it,
//! and every block still held are gone.
//!
//! **Routing costs one relaxed atomic load per allocation and per free while no capture scope
//! is active and no graph pool holds memory**: a process-wide count of active scopes gates the
//! allocation path, and a count of scopes and reserved chunks gates the free path. Only while a
//! scope is active does an allocation ask the driver for its stream's capture status
//! (`cuStreamGetCaptureInfo`), and only while a graph pool holds memory does a free look its
//! address up among the pools' chunks.
//!
//! The driver's pool ([`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource) and its
//! relatives) is not routed: `cuMemAllocAsync` and `cuMemFreeAsync` are legal under capture and
//! make graph memory nodes, which the driver keeps for the graph
//! ([`rmm_sys::graph::device_graph_mem_trim`] and
//! [`rmm_sys::graph::device_graph_mem_attribute`] manage that memory).
//!
//! Captures begun outside rmm-rs (not through a `CaptureScope`) are not routed. The growth
//! paths of the pool, fixed-size and VMM resources check the stream's capture status and
//! refuse with [`MrError::Capture`](crate::MrError::Capture) instead of calling `cuMemAlloc`
//! into the capture (which would invalidate it); growth on streams that are not capturing runs
//! with the calling thread in the relaxed capture mode, so that it does not break a global
//! capture another thread holds. The design, the rules and what is not detected:
//! `docs/guide/13-cuda-graphs.md`.

mod blocks;
mod pool;

pub use pool::{CaptureScope, GraphPool, GraphPoolOptions, DEFAULT_GRAPH_POOL_CHUNK_SIZE};

use rmm_stream::{CaptureModeGuard, CudaStreamView};
use rmm_sys::{CaptureMode, DevicePtr};

use crate::error::{MrError, MrResult};
// Plain std atomics: the counts are gates, not a protocol (loom has no `const` atomics).
use std::sync::atomic::{AtomicUsize, Ordering};

/// Capture scopes active in the process: the allocation path's gate.
static ACTIVE_SCOPES: AtomicUsize = AtomicUsize::new(0);
/// Capture scopes active plus chunks reserved by graph pools: the free path's gate.
static FREE_GATE: AtomicUsize = AtomicUsize::new(0);

/// How many capture scopes are active in the process now.
#[must_use]
pub fn active_capture_scopes() -> usize {
    ACTIVE_SCOPES.load(Ordering::Relaxed)
}

/// Serves `bytes` from a graph pool when `stream` is in the capture of an active
/// [`CaptureScope`]; `None` (the caller allocates as ever) otherwise. One relaxed load while no
/// scope is active.
#[inline]
pub(crate) fn route_allocate(
    stream: CudaStreamView<'_>,
    bytes: usize,
    alignment: usize,
) -> Option<MrResult<DevicePtr>> {
    if ACTIVE_SCOPES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    pool::allocate_in_capture(stream, bytes, alignment)
}

/// Returns `ptr` to its graph pool when a graph pool owns it; refuses a block of the caller's
/// freed inside an rmm-rs capture (the graph's replays would still use it after the caller
/// handed it out again); `None` (the caller frees as ever) otherwise. One relaxed load while
/// no scope is active and no graph pool holds memory.
///
/// # Safety
/// The [`DeviceMemoryResource::deallocate`](crate::DeviceMemoryResource::deallocate) contract
/// for `ptr`.
#[inline]
pub(crate) unsafe fn route_deallocate(
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
    alignment: usize,
) -> Option<MrResult<()>> {
    if FREE_GATE.load(Ordering::Relaxed) == 0 || ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe { pool::deallocate_routed(stream, ptr, bytes, alignment) }
}

/// Runs `grow` (a growth of a sub-allocator for a request of `bytes` on `stream`, which calls
/// its upstream) if capture allows it: a stream in a capture (one not begun through a
/// [`CaptureScope`], whose allocations never get here) is refused with
/// [`MrError::Capture`] and nothing is called; otherwise `grow` runs with the thread in the
/// relaxed capture mode, so that its `cuMemAlloc` does not break another thread's global
/// capture. Without a driver (host mocks) `grow` just runs.
pub(crate) fn growth<T>(
    stream: CudaStreamView<'_>,
    bytes: usize,
    grow: impl FnOnce() -> MrResult<T>,
) -> MrResult<T> {
    if let Ok(status) = stream.capture_status() {
        if let Some(id) = status.id() {
            return Err(MrError::Capture(format!(
                "growing the pool for {bytes} bytes on {stream}, which is in stream capture \
                 {id} not begun through a GraphPool: cuMemAlloc would invalidate the capture \
                 (capture with GraphPool::capture, or reserve the memory before capturing)"
            )));
        }
    } else {
        return grow();
    }
    relaxed(grow)
}

/// Runs `f` with the calling thread in the relaxed capture mode (restored after), so that a
/// potentially unsafe call in it (`cuMemAlloc`, `cuCtxSynchronize`) does not fail and
/// invalidate a global capture of another thread. Without a driver, `f` just runs.
pub(crate) fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let _guard = CaptureModeGuard::new(CaptureMode::Relaxed).ok();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver no scope can begin: the failed begin counts itself out again, so the
    /// hot paths stay on their one load.
    #[test]
    fn a_scope_that_cannot_begin_leaves_the_gates_closed() {
        if rmm_sys::is_driver_present() {
            return;
        }
        assert_eq!(active_capture_scopes(), 0);
        assert!(GraphPool::new(crate::resource::shared(
            crate::testing::HostMockResource::new()
        ))
        .is_err());
        assert_eq!(active_capture_scopes(), 0);
        assert_eq!(FREE_GATE.load(Ordering::Relaxed), 0);
        let s = CudaStreamView::default();
        assert!(route_allocate(s, 256, 256).is_none());
        // SAFETY: the gate is closed, so nothing is freed.
        assert!(unsafe { route_deallocate(s, DevicePtr::from_raw(4096), 256, 256) }.is_none());
    }
}
