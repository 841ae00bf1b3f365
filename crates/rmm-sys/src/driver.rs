//! The driver gate: loading `libcuda`, `cuInit`, the version check, and the calling thread's
//! context.
//!
//! Every wrapper in this crate calls [`ensure_current_context`] (directly or through
//! [`init`]) before its first driver call, so that:
//! - without a driver, the result is `Err(CudaError::DriverNotFound)` and nothing panics
//!   (cudarc's own functions panic when `libcuda` is missing; rmm-sys never calls them, it
//!   loads the library and its entry points itself, see `entry.rs`);
//! - a thread with no current context gets device 0's primary context, as the CUDA runtime
//!   does, instead of failing with `CUDA_ERROR_INVALID_CONTEXT`.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::raw;

use crate::entry::{self, Api};
use crate::error::{check, CudaError, CudaResult};
use crate::version::DriverVersion;

/// The initialized driver: its version and the entry points rmm-sys calls.
struct State {
    version: DriverVersion,
    api: Api,
}

static STATE: OnceLock<CudaResult<State>> = OnceLock::new();

thread_local! {
    /// Whether this thread is known to have a current context.
    static HAS_CONTEXT: Cell<bool> = const { Cell::new(false) };
}

/// Whether `libcuda` can be loaded on this machine. Does not initialize the driver.
#[must_use]
pub fn is_driver_present() -> bool {
    entry::driver().is_some()
}

/// Why rmm-rs cannot use a GPU here, or `None` when a driver and at least one device are
/// present. GPU tests use it to report themselves skipped; programs can print it as their one
/// line of explanation.
#[must_use]
pub fn gpu_unavailable_reason() -> Option<String> {
    match crate::device::device_count() {
        Ok(0) => Some("no CUDA device was found".to_owned()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
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

/// The driver's entry points, with a context current on the calling thread
/// ([`ensure_current_context`]).
#[inline]
pub(crate) fn context_api() -> CudaResult<&'static Api> {
    ensure_current_context()?;
    api()
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
    init()
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
        let primary = crate::context::primary_context(0)?;
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
pub(crate) fn mark_context_current() {
    HAS_CONTEXT.with(|c| c.set(true));
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
            assert_eq!(ensure_current_context(), Err(CudaError::DriverNotFound));
            assert_eq!(driver_version(), Err(CudaError::DriverNotFound));
        }
    }
}
