//! Primary contexts: one per device, retained once per process and never released, as the CUDA
//! runtime does. Sharing the primary context is what lets rmm-rs memory interoperate with
//! runtime-API users (PyTorch, CuPy, C++ RMM) and with cudarc on the same device.
//!
//! Every wrapper that needs a context calls [`ensure_current_context`] (or takes the entry
//! points through [`context_api`]) before its first driver call, so that a thread with no
//! current context gets device 0's primary context, as the CUDA runtime does, instead of
//! failing with `CUDA_ERROR_INVALID_CONTEXT`.

use std::cell::Cell;
use std::marker::PhantomData;
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

/// The calling thread's current context as the driver reports it (`cuCtxGetCurrent`): null
/// when the thread has none. Unlike every other call of this crate it does not give a thread
/// without a context device 0's primary context, so it shows what a foreign caller arrived with.
pub fn raw_current_context() -> CudaResult<raw::CUcontext> {
    let api = api()?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialized; the call writes one handle.
    check("cuCtxGetCurrent", unsafe {
        (api.cuCtxGetCurrent)(&mut ctx)
    })?;
    Ok(ctx)
}

/// Makes a device's primary context current on the calling thread for a scope: what an entry
/// point called from foreign code (a C API, a PyTorch allocator hook) does before it touches
/// the device, since such a thread may arrive with no current context, with the device's
/// primary context, or with another device's.
///
/// [`enter`](Self::enter) costs one `cuCtxGetCurrent` when the primary context is already
/// current and changes nothing then. A thread that had **no** context keeps the primary
/// context after the guard drops (what the CUDA runtime does on a thread's first call, and what
/// makes its next call the cheap case); a thread that had **another** context gets it back on
/// drop. Unlike [`DeviceGuard`](crate::DeviceGuard), which compares device ordinals, the guard
/// compares contexts, so a thread with a context of its own on the same device is switched to
/// the primary one too. The guard is not `Send`: it restores the thread that made it.
#[derive(Debug)]
#[must_use = "the previous context is restored when the guard drops"]
pub struct PrimaryContextGuard {
    /// The context to put back on drop (an address, null for none to restore).
    previous: usize,
    _not_send: PhantomData<*const ()>,
}

impl PrimaryContextGuard {
    /// Makes the primary context of `device` current until the guard drops.
    ///
    /// # Errors
    /// No driver or an invalid device (nothing changed), or a failed `cuCtxSetCurrent`.
    pub fn enter(device: crate::DeviceId) -> CudaResult<Self> {
        let primary = primary_context(device.0)?.as_raw();
        let current = raw_current_context()?;
        if current == primary {
            mark_context_current();
            return Ok(Self {
                previous: 0,
                _not_send: PhantomData,
            });
        }
        let api = api()?;
        // SAFETY: `primary` is a retained primary context that lives for the process.
        check("cuCtxSetCurrent", unsafe { (api.cuCtxSetCurrent)(primary) })?;
        mark_context_current();
        Ok(Self {
            previous: current as usize,
            _not_send: PhantomData,
        })
    }
}

impl Drop for PrimaryContextGuard {
    fn drop(&mut self) {
        if self.previous == 0 {
            return;
        }
        let restore = || -> CudaResult<()> {
            let api = api()?;
            // SAFETY: the handle was this thread's current context when the guard was made; a
            // context destroyed since is reported by the driver as an error code.
            check("cuCtxSetCurrent", unsafe {
                (api.cuCtxSetCurrent)(self.previous as raw::CUcontext)
            })
        };
        if let Err(e) = restore() {
            log::error!("rmm: could not restore the previous context: {e}");
        }
    }
}

/// Records that the calling thread now has a current context (after `cuCtxSetCurrent`).
fn mark_context_current() {
    HAS_CONTEXT.with(|c| c.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_needs_a_driver_and_a_valid_device() {
        if crate::gpu_unavailable_reason().is_some() {
            let e = PrimaryContextGuard::enter(crate::DeviceId(0)).unwrap_err();
            assert!(e.is_no_device(), "{e}");
            assert!(raw_current_context().unwrap_err().is_no_device());
        } else {
            let e = PrimaryContextGuard::enter(crate::DeviceId(i32::MAX)).unwrap_err();
            assert!(e.to_string().contains("out of range"), "{e}");
        }
    }
}
