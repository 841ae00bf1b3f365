//! Stream capture and CUDA graphs: the capture status of a stream, the calling thread's capture
//! mode, beginning and ending a capture, instantiating and launching the graph, and the device's
//! graph-memory pool (what `cuMemAllocAsync` under capture allocates from).
//!
//! Every entry point here is resolved with `cuGetProcAddress` at the CUDA 12.0 ABI (the
//! version this crate needs at least), so a driver whose newest symbol has another signature
//! (CUDA 13's `cuStreamGetCaptureInfo` with edge data) still answers with the 12.0 one. Results
//! and enum out-parameters are read as integers, as everywhere in this crate.
//!
//! What capture forbids (the CUDA programming guide, "Prohibited and Unhandled Operations"):
//! synchronizing or querying a capturing stream or an event recorded in the capture, and, in
//! the global capture mode, "potentially unsafe" calls such as `cuMemAlloc` from any thread
//! while the capture lasts, unless that thread switched itself to the relaxed mode
//! ([`exchange_capture_mode`]). A forbidden call fails and invalidates the capture.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys::{CUgraphMem_attribute, CUstreamCaptureMode};

use crate::context::context_api;
use crate::device::DeviceId;
use crate::driver::resolve;
use crate::error::{check, CudaResult};
use crate::raw;
use crate::version::DriverVersion;

/// The ABI every entry point of this module is resolved at.
const ABI: DriverVersion = DriverVersion(12000);

/// A stream-capture mode (`CUstreamCaptureMode`): which other calls a capture forbids while it
/// lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "CUstreamCaptureMode")]
pub enum CaptureMode {
    /// Potentially unsafe calls are forbidden in every thread that is not itself in the
    /// relaxed mode, while the capture lasts (`CU_STREAM_CAPTURE_MODE_GLOBAL`).
    Global,
    /// Potentially unsafe calls are forbidden in the capturing thread only
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`).
    ThreadLocal,
    /// Nothing is forbidden beyond the capturing stream itself
    /// (`CU_STREAM_CAPTURE_MODE_RELAXED`).
    Relaxed,
}

impl CaptureMode {
    fn to_raw(self) -> u32 {
        match self {
            Self::Global => 0,
            Self::ThreadLocal => 1,
            Self::Relaxed => 2,
        }
    }

    fn from_raw(v: u32) -> Self {
        match v {
            0 => Self::Global,
            1 => Self::ThreadLocal,
            _ => Self::Relaxed,
        }
    }

    fn to_sys(self) -> CUstreamCaptureMode {
        match self {
            Self::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            Self::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            Self::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Whether a stream is being captured (`CUstreamCaptureStatus` with the capture's id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "CUstreamCaptureStatus")]
pub enum CaptureStatus {
    /// Not capturing: work runs when it is enqueued.
    None,
    /// Capturing into the capture `id` (unique in the process; the streams a capture forked
    /// to share it).
    Active {
        /// The capture's id.
        id: u64,
    },
    /// Was capturing, and a forbidden call invalidated the capture; ending it fails.
    Invalidated {
        /// The capture's id.
        id: u64,
    },
}

impl CaptureStatus {
    /// Whether the stream is in a capture sequence (active or invalidated): work enqueued on
    /// it does not run now.
    #[must_use]
    pub fn is_capturing(self) -> bool {
        !matches!(self, Self::None)
    }

    /// The capture's id, if the stream is in one.
    #[must_use]
    pub fn id(self) -> Option<u64> {
        match self {
            Self::None => None,
            Self::Active { id } | Self::Invalidated { id } => Some(id),
        }
    }
}

/// A graph-memory attribute of a device (`CUgraphMem_attribute`): memory that graph
/// memory nodes (`cuMemAllocAsync` under capture) use or reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "CUgraphMem_attribute")]
pub enum GraphMemAttribute {
    /// Bytes allocated by graph memory nodes now (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`).
    UsedMemCurrent,
    /// The most bytes used since the last reset (`CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`).
    UsedMemHigh,
    /// Bytes reserved for graph memory now (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
    ReservedMemCurrent,
    /// The most bytes reserved since the last reset (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`).
    ReservedMemHigh,
}

impl GraphMemAttribute {
    fn to_sys(self) -> CUgraphMem_attribute {
        match self {
            Self::UsedMemCurrent => CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
            Self::UsedMemHigh => CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            Self::ReservedMemCurrent => {
                CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT
            }
            Self::ReservedMemHigh => CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        }
    }
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: graph memory a launch left allocated is
/// freed before the next launch of the same graph.
pub const GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH: u64 = 1;

/// Resolves `$name` once (per call site) at the 12.0 ABI, with the function-pointer type `$ty`.
macro_rules! entry {
    ($name:literal, $c_name:literal, $ty:ty) => {{
        static F: OnceLock<CudaResult<$ty>> = OnceLock::new();
        // SAFETY: `$ty` is the signature of `$name` in CUDA 12.0's `cuda.h` (written beside
        // each use), and `resolve` asks the driver for that ABI.
        F.get_or_init(|| unsafe { resolve($name, $c_name, ABI) })
            .clone()
    }};
}

/// `cuStreamGetCaptureInfo` (12.0 ABI: stream, status, id, graph, dependencies, count).
type GetCaptureInfo = unsafe extern "C" fn(
    raw::CUstream,
    *mut u32,
    *mut u64,
    *mut raw::CUgraph,
    *mut *const raw::CUgraphNode,
    *mut usize,
) -> u32;
/// `cuStreamIsCapturing`.
type IsCapturing = unsafe extern "C" fn(raw::CUstream, *mut u32) -> u32;
/// `cuThreadExchangeStreamCaptureMode`.
type ExchangeMode = unsafe extern "C" fn(*mut u32) -> u32;
/// `cuStreamBeginCapture` (12.0: `_v2`, with the mode).
type BeginCapture = unsafe extern "C" fn(raw::CUstream, CUstreamCaptureMode) -> u32;
/// `cuStreamEndCapture`.
type EndCapture = unsafe extern "C" fn(raw::CUstream, *mut raw::CUgraph) -> u32;
/// `cuGraphInstantiateWithFlags`.
type Instantiate = unsafe extern "C" fn(*mut raw::CUgraphExec, raw::CUgraph, u64) -> u32;
/// `cuGraphLaunch`.
type Launch = unsafe extern "C" fn(raw::CUgraphExec, raw::CUstream) -> u32;
/// `cuGraphDestroy`.
type GraphDestroy = unsafe extern "C" fn(raw::CUgraph) -> u32;
/// `cuGraphExecDestroy`.
type ExecDestroy = unsafe extern "C" fn(raw::CUgraphExec) -> u32;
/// `cuGraphGetNodes`.
type GetNodes = unsafe extern "C" fn(raw::CUgraph, *mut raw::CUgraphNode, *mut usize) -> u32;
/// `cuDeviceGraphMemTrim`.
type MemTrim = unsafe extern "C" fn(raw::CUdevice) -> u32;
/// `cuDeviceGetGraphMemAttribute` and `cuDeviceSetGraphMemAttribute`.
type MemAttribute = unsafe extern "C" fn(raw::CUdevice, CUgraphMem_attribute, *mut c_void) -> u32;

/// `cuStreamGetCaptureInfo`: whether `stream` is capturing, and into which capture.
///
/// Legal during any capture (it is how code finds out). The legacy default stream is never
/// capturing. With the `testing` feature, a simulated stream handle is never capturing.
///
/// # Safety
/// `stream` is a live stream handle or one of the special handles (0,
/// [`CU_STREAM_LEGACY`](crate::CU_STREAM_LEGACY),
/// [`CU_STREAM_PER_THREAD`](crate::CU_STREAM_PER_THREAD)).
#[doc(alias = "cuStreamGetCaptureInfo")]
pub unsafe fn stream_capture_info(stream: raw::CUstream) -> CudaResult<CaptureStatus> {
    #[cfg(feature = "testing")]
    if crate::fault::is_fake(stream as usize) {
        return Ok(CaptureStatus::None);
    }
    let f = entry!(
        "cuStreamGetCaptureInfo",
        c"cuStreamGetCaptureInfo",
        GetCaptureInfo
    )?;
    context_api()?;
    let mut status = 0u32;
    let mut id = 0u64;
    // SAFETY: a context is current; the handle is valid (caller); the call writes the status
    // and the id; the other out-parameters are optional (null).
    check("cuStreamGetCaptureInfo", unsafe {
        f(
            stream,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(match status {
        0 => CaptureStatus::None,
        1 => CaptureStatus::Active { id },
        _ => CaptureStatus::Invalidated { id },
    })
}

/// `cuStreamIsCapturing`: whether `stream` is in a capture sequence (active or invalidated).
///
/// # Safety
/// As [`stream_capture_info`].
#[doc(alias = "cuStreamIsCapturing")]
pub unsafe fn stream_is_capturing(stream: raw::CUstream) -> CudaResult<bool> {
    #[cfg(feature = "testing")]
    if crate::fault::is_fake(stream as usize) {
        return Ok(false);
    }
    let f = entry!("cuStreamIsCapturing", c"cuStreamIsCapturing", IsCapturing)?;
    context_api()?;
    let mut status = 0u32;
    // SAFETY: a context is current; the handle is valid (caller); writes one integer.
    check("cuStreamIsCapturing", unsafe { f(stream, &mut status) })?;
    Ok(status != 0)
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to `mode` and
/// returns the one it had (restore it with a second call). A thread in the relaxed mode may
/// make potentially unsafe calls (`cuMemAlloc`) while another thread's global capture lasts.
#[doc(alias = "cuThreadExchangeStreamCaptureMode")]
pub fn exchange_capture_mode(mode: CaptureMode) -> CudaResult<CaptureMode> {
    let f = entry!(
        "cuThreadExchangeStreamCaptureMode",
        c"cuThreadExchangeStreamCaptureMode",
        ExchangeMode
    )?;
    context_api()?;
    let mut v = mode.to_raw();
    // SAFETY: the driver is initialized; reads and writes one integer.
    check("cuThreadExchangeStreamCaptureMode", unsafe { f(&mut v) })?;
    Ok(CaptureMode::from_raw(v))
}

/// `cuStreamBeginCapture`: work enqueued on `stream` from now on is recorded into a graph, not
/// run, until [`stream_end_capture`].
///
/// # Safety
/// `stream` is a live stream handle (not the legacy default stream, which cannot be captured).
#[doc(alias = "cuStreamBeginCapture")]
pub unsafe fn stream_begin_capture(stream: raw::CUstream, mode: CaptureMode) -> CudaResult<()> {
    let f = entry!(
        "cuStreamBeginCapture",
        c"cuStreamBeginCapture",
        BeginCapture
    )?;
    context_api()?;
    // SAFETY: a context is current; the handle is valid (caller).
    check("cuStreamBeginCapture", unsafe { f(stream, mode.to_sys()) })
}

/// `cuStreamEndCapture`: ends the capture begun on `stream` and returns its graph (the caller
/// destroys it with [`graph_destroy`]). An invalidated capture ends with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph; either way the stream is no longer
/// capturing.
///
/// # Safety
/// `stream` is the live stream the capture was begun on.
#[doc(alias = "cuStreamEndCapture")]
pub unsafe fn stream_end_capture(stream: raw::CUstream) -> CudaResult<raw::CUgraph> {
    let f = entry!("cuStreamEndCapture", c"cuStreamEndCapture", EndCapture)?;
    context_api()?;
    let mut graph: raw::CUgraph = std::ptr::null_mut();
    // SAFETY: a context is current; the handle is valid (caller); writes one handle.
    check("cuStreamEndCapture", unsafe { f(stream, &mut graph) })?;
    Ok(graph)
}

/// `cuGraphInstantiateWithFlags`: an executable graph of `graph` (flags such as
/// [`GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH`]); the caller destroys it with
/// [`graph_exec_destroy`].
///
/// # Safety
/// `graph` is a live graph handle.
#[doc(alias = "cuGraphInstantiate")]
pub unsafe fn graph_instantiate(graph: raw::CUgraph, flags: u64) -> CudaResult<raw::CUgraphExec> {
    let f = entry!(
        "cuGraphInstantiateWithFlags",
        c"cuGraphInstantiateWithFlags",
        Instantiate
    )?;
    context_api()?;
    let mut exec: raw::CUgraphExec = std::ptr::null_mut();
    // SAFETY: a context is current; the graph is live (caller); writes one handle.
    check("cuGraphInstantiateWithFlags", unsafe {
        f(&mut exec, graph, flags)
    })?;
    Ok(exec)
}

/// `cuGraphLaunch`: enqueues one run of `exec` on `stream`.
///
/// # Safety
/// `exec` is a live executable graph and `stream` a live or special stream handle; every
/// memory the graph's nodes use is valid for the run.
#[doc(alias = "cuGraphLaunch")]
pub unsafe fn graph_launch(exec: raw::CUgraphExec, stream: raw::CUstream) -> CudaResult<()> {
    let f = entry!("cuGraphLaunch", c"cuGraphLaunch", Launch)?;
    context_api()?;
    // SAFETY: a context is current; the handles are valid (caller).
    check("cuGraphLaunch", unsafe { f(exec, stream) })
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` came from [`stream_end_capture`] and is not used afterwards.
#[doc(alias = "cuGraphDestroy")]
pub unsafe fn graph_destroy(graph: raw::CUgraph) -> CudaResult<()> {
    let f = entry!("cuGraphDestroy", c"cuGraphDestroy", GraphDestroy)?;
    context_api()?;
    // SAFETY: the caller's contract.
    check("cuGraphDestroy", unsafe { f(graph) })
}

/// `cuGraphExecDestroy`. Launches already enqueued still complete.
///
/// # Safety
/// `exec` came from [`graph_instantiate`] and is not used afterwards.
#[doc(alias = "cuGraphExecDestroy")]
pub unsafe fn graph_exec_destroy(exec: raw::CUgraphExec) -> CudaResult<()> {
    let f = entry!("cuGraphExecDestroy", c"cuGraphExecDestroy", ExecDestroy)?;
    context_api()?;
    // SAFETY: the caller's contract.
    check("cuGraphExecDestroy", unsafe { f(exec) })
}

/// `cuGraphGetNodes` (the count only): how many nodes `graph` has.
///
/// # Safety
/// `graph` is a live graph handle.
#[doc(alias = "cuGraphGetNodes")]
pub unsafe fn graph_node_count(graph: raw::CUgraph) -> CudaResult<usize> {
    let f = entry!("cuGraphGetNodes", c"cuGraphGetNodes", GetNodes)?;
    context_api()?;
    let mut n = 0usize;
    // SAFETY: the graph is live (caller); a null node array asks for the count only.
    check("cuGraphGetNodes", unsafe {
        f(graph, std::ptr::null_mut(), &mut n)
    })?;
    Ok(n)
}

/// The driver's handle of `device` (`cuDeviceGet`).
fn device_handle(device: DeviceId) -> CudaResult<raw::CUdevice> {
    let api = crate::driver::api()?;
    let mut dev: raw::CUdevice = 0;
    // SAFETY: the driver is initialized; writes one handle.
    check("cuDeviceGet", unsafe {
        (api.cuDeviceGet)(&mut dev, device.0)
    })?;
    Ok(dev)
}

/// `cuDeviceGraphMemTrim`: returns to the device the memory reserved for graph memory nodes
/// that no graph is using (memory of a live graph's allocations stays).
#[doc(alias = "cuDeviceGraphMemTrim")]
#[doc(alias = "cudaDeviceGraphMemTrim")]
pub fn device_graph_mem_trim(device: DeviceId) -> CudaResult<()> {
    let f = entry!("cuDeviceGraphMemTrim", c"cuDeviceGraphMemTrim", MemTrim)?;
    let dev = device_handle(device)?;
    // SAFETY: the driver is initialized; `dev` is a valid device.
    check("cuDeviceGraphMemTrim", unsafe { f(dev) })
}

/// `cuDeviceGetGraphMemAttribute`: one of the device's graph-memory figures, in bytes.
#[doc(alias = "cuDeviceGetGraphMemAttribute")]
pub fn device_graph_mem_attribute(device: DeviceId, attr: GraphMemAttribute) -> CudaResult<u64> {
    let f = entry!(
        "cuDeviceGetGraphMemAttribute",
        c"cuDeviceGetGraphMemAttribute",
        MemAttribute
    )?;
    let dev = device_handle(device)?;
    let mut v = 0u64;
    // SAFETY: the driver is initialized; every graph-memory attribute is a `cuuint64_t`.
    check("cuDeviceGetGraphMemAttribute", unsafe {
        f(dev, attr.to_sys(), (&raw mut v).cast())
    })?;
    Ok(v)
}

/// `cuDeviceSetGraphMemAttribute` with 0: resets a high-water mark
/// ([`GraphMemAttribute::UsedMemHigh`] or [`GraphMemAttribute::ReservedMemHigh`]; the driver
/// refuses the others with `CUDA_ERROR_INVALID_VALUE`).
#[doc(alias = "cuDeviceSetGraphMemAttribute")]
pub fn device_reset_graph_mem_high(device: DeviceId, attr: GraphMemAttribute) -> CudaResult<()> {
    let f = entry!(
        "cuDeviceSetGraphMemAttribute",
        c"cuDeviceSetGraphMemAttribute",
        MemAttribute
    )?;
    let dev = device_handle(device)?;
    let mut v = 0u64;
    // SAFETY: the driver is initialized; the attribute's value is a `cuuint64_t` the call reads.
    check("cuDeviceSetGraphMemAttribute", unsafe {
        f(dev, attr.to_sys(), (&raw mut v).cast())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_modes_round_trip_through_their_driver_values() {
        for m in [
            CaptureMode::Global,
            CaptureMode::ThreadLocal,
            CaptureMode::Relaxed,
        ] {
            assert_eq!(CaptureMode::from_raw(m.to_raw()), m);
            assert_eq!(m.to_sys() as u32, m.to_raw());
        }
    }

    #[test]
    fn a_status_says_whether_and_where_a_stream_captures() {
        assert!(!CaptureStatus::None.is_capturing());
        assert_eq!(CaptureStatus::None.id(), None);
        assert!(CaptureStatus::Active { id: 7 }.is_capturing());
        assert_eq!(CaptureStatus::Invalidated { id: 9 }.id(), Some(9));
    }

    #[test]
    fn without_a_driver_every_call_is_an_error_not_a_panic() {
        if crate::is_driver_present() {
            return;
        }
        assert!(exchange_capture_mode(CaptureMode::Relaxed).is_err());
        assert!(device_graph_mem_trim(DeviceId(0)).is_err());
        // SAFETY: the legacy default stream is a special handle.
        assert!(unsafe { stream_capture_info(crate::CU_STREAM_LEGACY) }.is_err());
    }
}
