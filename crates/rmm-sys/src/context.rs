//! Primary contexts: one per device, retained once per process and never released, as the CUDA
//! runtime does. Sharing the primary context is what lets rmm-rs memory interoperate with
//! runtime-API users (PyTorch, CuPy, C++ RMM) and with cudarc on the same device.
//!
//! Every wrapper that needs a context calls [`ensure_current_context`] (or takes the entry
//! points through [`context_api`]) before its first driver call, so that a thread with no
//! current context gets device 0's primary context, as the CUDA runtime does, instead of
//! failing with `CUDA_ERROR_INVALID_CONTEXT`.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::raw;

use crate::driver::api;
use crate::entry::Api;
use crate::error::{check, CudaError, CudaResult, ResultCode};

/// A retained primary context (the raw handle, kept as an address so it is `Send + Sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrimaryContext(usize);

impl PrimaryContext {
    /// The raw `CUcontext`.
    #[must_use]
    pub fn as_raw(self) -> raw::CUcontext {
        self.0 as raw::CUcontext
    }
}

static CONTEXTS: OnceLock<Vec<OnceLock<CudaResult<PrimaryContext>>>> = OnceLock::new();

thread_local! {
    /// Whether this thread is known to have a current context.
    static HAS_CONTEXT: Cell<bool> = const { Cell::new(false) };
}

/// The primary context of `device`, retained on first use and kept for the process.
pub fn primary_context(device: i32) -> CudaResult<PrimaryContext> {
    crate::driver::init()?;
    let slots = match CONTEXTS.get() {
        Some(s) => s,
        None => {
            let n = raw_device_count()?;
            CONTEXTS.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect())
        }
    };
    let slot = usize::try_from(device)
        .ok()
        .and_then(|d| slots.get(d))
        .ok_or_else(|| invalid_device(device))?;
    slot.get_or_init(|| retain(device)).clone()
}

fn retain(device: i32) -> CudaResult<PrimaryContext> {
    let api = api()?;
    let mut dev: raw::CUdevice = 0;
    // SAFETY: the driver is initialized; writes one device handle.
    check("cuDeviceGet", unsafe {
        (api.cuDeviceGet)(&mut dev, device)
    })?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: `dev` is a valid device; writes one context handle. The retain is never released:
    // the context lives as long as the process, like the runtime's.
    check("cuDevicePrimaryCtxRetain", unsafe {
        (api.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
    })?;
    Ok(PrimaryContext(ctx as usize))
}

pub(crate) fn raw_device_count() -> CudaResult<i32> {
    let api = api()?;
    let mut n = 0;
    // SAFETY: the driver is initialized; writes one int.
    check("cuDeviceGetCount", unsafe {
        (api.cuDeviceGetCount)(&mut n)
    })?;
    Ok(n)
}

pub(crate) fn invalid_device(device: i32) -> CudaError {
    CudaError::Call {
        call: "cuDeviceGet",
        code: ResultCode::INVALID_DEVICE,
        name: "CUDA_ERROR_INVALID_DEVICE".into(),
        description: format!("device ordinal {device} is out of range"),
    }
}

/// Makes the primary context of the device with ordinal `device` current on the calling thread
/// (`cudaSetDevice`).
pub(crate) fn make_current(device: i32) -> CudaResult<()> {
    let ctx = primary_context(device)?;
    let api = api()?;
    // SAFETY: `ctx` is a retained primary context that lives for the process.
    check("cuCtxSetCurrent", unsafe {
        (api.cuCtxSetCurrent)(ctx.as_raw())
    })?;
    mark_context_current();
    Ok(())
}

/// The driver's entry points, with a context current on the calling thread
/// ([`ensure_current_context`]).
#[inline]
pub(crate) fn context_api() -> CudaResult<&'static Api> {
    ensure_current_context()?;
    api()
}

/// Makes sure the calling thread has a current context.
///
/// A thread that has none gets device 0's primary context (retained once per process and made
/// current), which is what the CUDA runtime does implicitly. Cheap after the first call on a
/// thread: one thread-local read.
#[inline]
pub fn ensure_current_context() -> CudaResult<()> {
    if HAS_CONTEXT.with(Cell::get) {
        return Ok(());
    }
    ensure_current_context_slow()
}

#[cold]
fn ensure_current_context_slow() -> CudaResult<()> {
    let api = api()?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialized; the call writes one handle.
    check("cuCtxGetCurrent", unsafe {
        (api.cuCtxGetCurrent)(&mut ctx)
    })?;
    if ctx.is_null() {
        let primary = primary_context(0)?;
        // SAFETY: `primary` is a retained primary context of device 0, kept alive for the
        // process by `primary_context`.
        check("cuCtxSetCurrent", unsafe {
            (api.cuCtxSetCurrent)(primary.as_raw())
        })?;
    }
    mark_context_current();
    Ok(())
}

/// Records that the calling thread now has a current context (after `cuCtxSetCurrent`).
fn mark_context_current() {
    HAS_CONTEXT.with(|c| c.set(true));
}
