//! Primary contexts: one per device, retained once per process and never released, as the CUDA
//! runtime does. Sharing the primary context is what lets rmm-rs memory interoperate with
//! runtime-API users (PyTorch, CuPy, C++ RMM) and with cudarc on the same device.

use std::sync::OnceLock;

use crate::raw;

use crate::device::DeviceId;
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
    let api = crate::driver::api()?;
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
    let api = crate::driver::api()?;
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

/// Makes `device`'s primary context current on the calling thread (`cudaSetDevice`).
pub(crate) fn make_current(device: DeviceId) -> CudaResult<()> {
    let ctx = primary_context(device.0)?;
    let api = crate::driver::api()?;
    // SAFETY: `ctx` is a retained primary context that lives for the process.
    check("cuCtxSetCurrent", unsafe {
        (api.cuCtxSetCurrent)(ctx.as_raw())
    })?;
    crate::driver::mark_context_current();
    Ok(())
}
