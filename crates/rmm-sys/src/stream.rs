//! Thin wrappers over the driver's stream, event and host-function calls, plus the special
//! stream handles.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::raw;

use crate::context::{context_api, ensure_current_context};
use crate::driver::resolve;
use crate::error::{check, CudaResult, ResultCode};
use crate::version::DriverVersion;

/// `CU_STREAM_LEGACY`: the legacy default stream, which synchronizes with every blocking stream.
/// (cudarc's bindings lack the macro.)
pub const CU_STREAM_LEGACY: raw::CUstream = 0x1 as raw::CUstream;

/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub const CU_STREAM_PER_THREAD: raw::CUstream = 0x2 as raw::CUstream;

/// `CU_STREAM_NON_BLOCKING`: a stream that does not synchronize with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// `cuStreamCreate`.
pub fn stream_create(flags: u32) -> CudaResult<raw::CUstream> {
    let api = context_api()?;
    let mut s: raw::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; writes one handle.
    check("cuStreamCreate", unsafe {
        (api.cuStreamCreate)(&mut s, flags)
    })?;
    Ok(s)
}

/// `cuStreamDestroy`. Work already queued on the stream still completes.
///
/// # Safety
/// `stream` came from [`stream_create`] and is not used afterwards.
pub unsafe fn stream_destroy(stream: raw::CUstream) -> CudaResult<()> {
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuStreamDestroy", unsafe {
        (api.cuStreamDestroy_v2)(stream)
    })
}

/// `cuStreamSynchronize`: blocks until all work queued on `stream` has completed.
///
/// # Safety
/// `stream` is a live stream handle or one of the special handles (0, [`CU_STREAM_LEGACY`],
/// [`CU_STREAM_PER_THREAD`]).
pub unsafe fn stream_synchronize(stream: raw::CUstream) -> CudaResult<()> {
    fault_point!(Synchronize, "cuStreamSynchronize", stream => Ok(()));
    let api = context_api()?;
    // SAFETY: a context is current; the handle is valid (caller).
    check("cuStreamSynchronize", unsafe {
        (api.cuStreamSynchronize)(stream)
    })
}

/// `cuStreamQuery`: `Ok(true)` when all work on `stream` has completed, `Ok(false)` while some
/// is pending.
///
/// # Safety
/// `stream` is a live stream handle or one of the special handles (0, [`CU_STREAM_LEGACY`],
/// [`CU_STREAM_PER_THREAD`]).
pub unsafe fn stream_query(stream: raw::CUstream) -> CudaResult<bool> {
    fault_point!(Query, "cuStreamQuery", stream => Ok(true));
    let api = context_api()?;
    // SAFETY: a context is current; the handle is valid (caller).
    let r = unsafe { (api.cuStreamQuery)(stream) };
    if r == ResultCode::NOT_READY.0 {
        return Ok(false);
    }
    check("cuStreamQuery", r)?;
    Ok(true)
}

/// `cuStreamGetId`: a process-unique id of the stream (the special handles resolve to the
/// calling thread's stream they stand for).
///
/// # Safety
/// `stream` is a live stream handle or one of the special handles (0, [`CU_STREAM_LEGACY`],
/// [`CU_STREAM_PER_THREAD`]).
pub unsafe fn stream_get_id(stream: raw::CUstream) -> CudaResult<u64> {
    fault_point!(
        StreamId, "cuStreamGetId", stream
        => Ok(crate::fault::fake_stream_id(stream as usize))
    );
    let special = stream.is_null() || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
    if !special {
        // An ordinary stream names its context itself: its id needs no current context, so the
        // context check (a `cuCtxGetCurrent` in a `DeferredPrimaryContext` scope) is skipped,
        // unless the driver asks for a context after all.
        let api = crate::driver::api()?;
        let mut id: std::ffi::c_ulonglong = 0;
        // SAFETY: the handle is a live stream (caller); writes one integer.
        let code = unsafe { (api.cuStreamGetId)(stream, &mut id) };
        if code != ResultCode::INVALID_CONTEXT.0 {
            check("cuStreamGetId", code)?;
            return Ok(id);
        }
    }
    let api = context_api()?;
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: a context is current; the handle is valid (caller); writes one integer.
    check("cuStreamGetId", unsafe {
        (api.cuStreamGetId)(stream, &mut id)
    })?;
    Ok(id)
}

/// `cuStreamWaitEvent`: future work on `stream` waits for `event`'s last record.
///
/// # Safety
/// `stream` is a live or special stream handle and `event` a live event handle.
pub unsafe fn stream_wait_event(stream: raw::CUstream, event: raw::CUevent) -> CudaResult<()> {
    fault_point!(StreamWait, "cuStreamWaitEvent", stream, event => Ok(()));
    let api = context_api()?;
    // SAFETY: a context is current; the handles are valid (caller).
    check("cuStreamWaitEvent", unsafe {
        (api.cuStreamWaitEvent)(stream, event, 0)
    })
}

/// `cuLaunchHostFunc`: runs `f(data)` on a driver thread once the stream reaches it.
///
/// # Safety
/// `f` may be called with `data` from another thread, once; `data` must stay valid until then.
/// `f` must not call CUDA.
pub unsafe fn launch_host_func(
    stream: raw::CUstream,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> CudaResult<()> {
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuLaunchHostFunc", unsafe {
        (api.cuLaunchHostFunc)(stream, Some(f), data)
    })
}

/// `cuEventCreate`.
pub fn event_create(flags: u32) -> CudaResult<raw::CUevent> {
    fault_point!(EventCreate, "cuEventCreate" => Ok(crate::fault::fake_event()));
    let api = context_api()?;
    let mut e: raw::CUevent = std::ptr::null_mut();
    // SAFETY: a context is current; writes one handle.
    check("cuEventCreate", unsafe {
        (api.cuEventCreate)(&mut e, flags)
    })?;
    Ok(e)
}

/// `cuEventDestroy`.
///
/// # Safety
/// `event` came from [`event_create`] and is not used afterwards.
pub unsafe fn event_destroy(event: raw::CUevent) -> CudaResult<()> {
    #[cfg(feature = "testing")]
    if crate::fault::is_fake(event as usize) {
        return Ok(());
    }
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuEventDestroy", unsafe { (api.cuEventDestroy_v2)(event) })
}

/// `cuEventRecord`.
///
/// # Safety
/// `event` is a live event handle and `stream` a live or special stream handle.
pub unsafe fn event_record(event: raw::CUevent, stream: raw::CUstream) -> CudaResult<()> {
    fault_point!(EventRecord, "cuEventRecord", event, stream => Ok(()));
    let api = context_api()?;
    // SAFETY: a context is current; the handles are valid (caller).
    check("cuEventRecord", unsafe {
        (api.cuEventRecord)(event, stream)
    })
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `event` is a live event handle (from [`event_create`], not destroyed).
pub unsafe fn event_synchronize(event: raw::CUevent) -> CudaResult<()> {
    fault_point!(Synchronize, "cuEventSynchronize", event => Ok(()));
    let api = context_api()?;
    // SAFETY: a context is current; the handle is valid (caller).
    check("cuEventSynchronize", unsafe {
        (api.cuEventSynchronize)(event)
    })
}

/// `cuEventQuery`: `Ok(true)` once the work before the event's last record has completed.
///
/// # Safety
/// `event` is a live event handle (from [`event_create`], not destroyed).
pub unsafe fn event_query(event: raw::CUevent) -> CudaResult<bool> {
    fault_point!(Query, "cuEventQuery", event => Ok(true));
    let api = context_api()?;
    // SAFETY: a context is current; the handle is valid (caller).
    let r = unsafe { (api.cuEventQuery)(event) };
    if r == ResultCode::NOT_READY.0 {
        return Ok(false);
    }
    check("cuEventQuery", r)?;
    Ok(true)
}

type ElapsedTime = unsafe extern "C" fn(*mut f32, raw::CUevent, raw::CUevent) -> u32;

/// `cuEventElapsedTime`: milliseconds between two recorded events (both created with timing).
///
/// # Safety
/// `start` and `end` are live event handles.
pub unsafe fn event_elapsed_time(start: raw::CUevent, end: raw::CUevent) -> CudaResult<f32> {
    ensure_current_context()?;
    static F: OnceLock<CudaResult<ElapsedTime>> = OnceLock::new();
    // SAFETY: `ElapsedTime` is the ABI of `cuEventElapsedTime` since CUDA 2.0; 13.x exports it
    // under the same name as `_v2` with the same signature.
    let f = F
        .get_or_init(|| unsafe {
            resolve(
                "cuEventElapsedTime",
                c"cuEventElapsedTime",
                DriverVersion(12000),
            )
        })
        .clone()?;
    let mut ms = 0f32;
    // SAFETY: a context is current; the handles are valid (caller); writes one float.
    check("cuEventElapsedTime", unsafe { f(&mut ms, start, end) })?;
    Ok(ms)
}
