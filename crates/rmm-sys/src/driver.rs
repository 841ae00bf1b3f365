//! The driver gate: loading `libcuda`, `cuInit`, the version check, and entry points resolved
//! by version.
//!
//! Every wrapper in this crate calls [`init`] (directly or through
//! [`ensure_current_context`](crate::ensure_current_context)) before its first driver call, so
//! that without a driver the result is `Err(CudaError::DriverNotFound)` and nothing panics
//! (cudarc's own functions panic when `libcuda` is missing; rmm-sys never calls them, it loads
//! the library and its entry points itself, see `entry.rs`). The calling thread's context is
//! the business of the (private) `context` module, one layer up.

use std::sync::OnceLock;

use crate::entry::{self, Api};
use crate::error::{check, CudaError, CudaResult};
use crate::version::DriverVersion;

/// The initialized driver: its version and the entry points rmm-sys calls.
struct State {
    version: DriverVersion,
    api: Api,
}

static STATE: OnceLock<CudaResult<State>> = OnceLock::new();

/// Whether `libcuda` can be loaded on this machine. Does not initialize the driver.
#[must_use]
pub fn is_driver_present() -> bool {
    entry::driver().is_some()
}

/// Loads and initializes the driver once per process and returns its CUDA version.
///
/// Fails with [`CudaError::DriverNotFound`] when no driver is installed, with the `cuInit`
/// error when the driver cannot initialize (for example `CUDA_ERROR_NO_DEVICE`), and with
/// [`CudaError::DriverTooOld`] below CUDA 12.0. Every later call returns the same result.
pub fn init() -> CudaResult<DriverVersion> {
    state().map(|s| s.version)
}

fn state() -> CudaResult<&'static State> {
    match STATE.get_or_init(initialize) {
        Ok(state) => Ok(state),
        Err(e) => Err(e.clone()),
    }
}

/// The driver's entry points, after [`init`] succeeded (which it runs on first use).
#[inline]
pub(crate) fn api() -> CudaResult<&'static Api> {
    state().map(|s| &s.api)
}

fn initialize() -> CudaResult<State> {
    let driver = entry::driver().ok_or(CudaError::DriverNotFound)?;
    // SAFETY: `cuInit` of the loaded driver; flags must be 0.
    check("cuInit", unsafe { (driver.boot.cuInit)(0) })?;
    let mut version = 0;
    // SAFETY: the driver is initialized; the call writes one int.
    check("cuDriverGetVersion", unsafe {
        (driver.boot.cuDriverGetVersion)(&mut version)
    })?;
    let found = DriverVersion(version);
    if found < DriverVersion::MINIMUM {
        return Err(CudaError::DriverTooOld {
            found,
            required: DriverVersion::MINIMUM,
        });
    }
    // Every symbol of the table exists from CUDA 12.0 on, so a missing one is a driver that
    // claims a version it does not implement.
    let api = driver
        .load_api()
        .map_err(|symbol| CudaError::EntryPointUnavailable {
            symbol,
            required: DriverVersion::MINIMUM,
            found,
        })?;
    Ok(State {
        version: found,
        api,
    })
}

/// The installed driver's CUDA version.
pub fn driver_version() -> CudaResult<DriverVersion> {
    #[cfg(feature = "testing")]
    if let Some(version) = crate::fault::pretended_driver_version() {
        return Ok(version);
    }
    init()
}

/// `CU_GET_PROC_ADDRESS_DEFAULT`.
const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;

/// Resolves a driver entry point newer than CUDA 12.0 through `cuGetProcAddress`, after checking
/// the driver version. A missing one is an error naming the version it needs, never a panic.
///
/// # Safety
/// `F` must be the `extern "C"` function-pointer type of `symbol` as of CUDA `required`.
pub(crate) unsafe fn resolve<F: Copy>(
    symbol: &'static str,
    c_symbol: &'static std::ffi::CStr,
    required: DriverVersion,
) -> CudaResult<F> {
    let State {
        version: found,
        api,
    } = state()?;
    let found = *found;
    if found < required {
        return Err(CudaError::EntryPointUnavailable {
            symbol,
            required,
            found,
        });
    }
    assert_eq!(
        std::mem::size_of::<F>(),
        std::mem::size_of::<*mut std::ffi::c_void>(),
        "resolve() needs a function-pointer type"
    );
    let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
    // `CUdriverProcAddressQueryResult`, read as an integer (0 is `CU_GET_PROC_ADDRESS_SUCCESS`).
    let mut status: u32 = 0;
    // SAFETY: the driver is initialized; `c_symbol` is NUL-terminated; the call writes a function
    // pointer and a status. `cuGetProcAddress_v2` exists in every driver from CUDA 12.0.
    let r = unsafe {
        (api.cuGetProcAddress_v2)(
            c_symbol.as_ptr(),
            &mut pfn,
            required.0,
            CU_GET_PROC_ADDRESS_DEFAULT,
            &mut status,
        )
    };
    if r != 0 || status != 0 || pfn.is_null() {
        return Err(CudaError::EntryPointUnavailable {
            symbol,
            required,
            found,
        });
    }
    // SAFETY: `pfn` is a non-null function pointer of the entry point's ABI at version
    // `required` (the caller's contract on `F`); function and data pointers have the same size
    // on every platform CUDA supports (checked above).
    Ok(unsafe { std::mem::transmute_copy::<*mut std::ffi::c_void, F>(&pfn) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver the gate must answer `DriverNotFound`; with one it must not.
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        let r = init();
        if is_driver_present() {
            assert_ne!(r, Err(CudaError::DriverNotFound));
        } else {
            assert_eq!(r, Err(CudaError::DriverNotFound));
            assert_eq!(
                crate::ensure_current_context(),
                Err(CudaError::DriverNotFound)
            );
            assert_eq!(driver_version(), Err(CudaError::DriverNotFound));
        }
    }
}
