//! The `extern "C"` entry points of `rmm_rs.h` (but the torch hooks, in [`crate::torch`]).
//!
//! Each one is a thin shell: it turns the C arguments into Rust values, runs the work through
//! `last_error::boundary` (panics caught, the thread's last error set) and turns the result
//! into a status code or a pointer. The work itself is in the `*_in` functions, which take the
//! `Registry` so that the tests can run them over their own tables.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::ptr;

use rmm::{ByteSize, CudaStreamView};

use crate::abi::{RmmRsOptions, RmmRsStatistics, RMM_RS_ABI_VERSION};
use crate::config::Config;
use crate::last_error;
use crate::registry::Registry;
use crate::status::{CResult, Error};

/// The rmm-rs version, NUL-terminated.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

fn null_argument(name: &str) -> Error {
    Error::invalid_argument(format!("{name} is NULL"))
}

/// A byte count from a C `ssize_t`.
#[inline]
pub(crate) fn byte_count(size: isize) -> CResult<usize> {
    usize::try_from(size).map_err(|_| negative_size(size))
}

#[cold]
#[inline(never)]
fn negative_size(size: isize) -> Error {
    Error::invalid_argument(format!("size must not be negative, not {size}"))
}

/// A view of a stream handle from C.
///
/// # Safety
/// `stream` is 0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, or a stream that stays alive
/// for `'a` (the header's stream contract, for the duration of the call).
pub(crate) unsafe fn stream_view<'a>(stream: *mut c_void) -> CudaStreamView<'a> {
    // SAFETY: the caller's contract is `from_raw`'s.
    unsafe { CudaStreamView::from_raw(stream.cast()) }
}

/// Allocates `size` bytes on `device` through `registry` (null for 0 bytes).
#[inline]
pub(crate) fn alloc_in(
    registry: &Registry,
    size: isize,
    device: c_int,
    stream: CudaStreamView<'_>,
) -> CResult<*mut c_void> {
    let bytes = byte_count(size)?;
    if bytes == 0 {
        return Ok(ptr::null_mut());
    }
    registry.with_state(device, true, |s| s.allocate(stream, bytes))?
}

/// Frees `ptr` through `registry` (nothing for null).
///
/// # Safety
/// `rmm_rs_free`'s contract: `ptr` is null or was allocated through `registry` on `device`
/// with `size` bytes and no work still uses it that is not ordered before `stream`.
#[inline]
pub(crate) unsafe fn free_in(
    registry: &Registry,
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: CudaStreamView<'_>,
) -> CResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let bytes = byte_count(size)?;
    registry.with_state(device, false, |s| {
        // SAFETY: the caller's contract.
        unsafe { s.deallocate(stream, ptr, bytes) }
    })?
}

/// The ABI version of this library (`RMM_RS_ABI_VERSION` of the header it was built with).
#[no_mangle]
pub extern "C" fn rmm_rs_abi_version() -> u32 {
    RMM_RS_ABI_VERSION
}

/// The rmm-rs version, a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn rmm_rs_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

/// Writes the default options to `*options`.
///
/// # Safety
/// `options` is null or points to writable memory for an `rmm_rs_options`.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_options_init(options: *mut RmmRsOptions) -> c_int {
    last_error::status(|| {
        if options.is_null() {
            return Err(null_argument("options"));
        }
        // SAFETY: non-null and writable (the caller's contract); `write` reads nothing there.
        unsafe { options.write(RmmRsOptions::default()) };
        Ok(())
    })
}

/// Parses a byte size (`"8GiB"`, `"1.5GB"`, `"1024"`) into `*bytes`.
///
/// # Safety
/// `text` is null or a NUL-terminated string; `bytes` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_parse_byte_size(text: *const c_char, bytes: *mut u64) -> c_int {
    last_error::status(|| {
        if text.is_null() {
            return Err(null_argument("text"));
        }
        if bytes.is_null() {
            return Err(null_argument("bytes"));
        }
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let text = unsafe { CStr::from_ptr(text) };
        let text = text
            .to_str()
            .map_err(|_| Error::invalid_argument("the size is not UTF-8"))?;
        let size: ByteSize = text
            .parse()
            .map_err(|e| Error::invalid_argument(format!("{e}")))?;
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { bytes.write(size.bytes() as u64) };
        Ok(())
    })
}

/// Configures devices as `*options` says (`rmm_rs_configure` in the header).
///
/// # Safety
/// `options` is null or points to an `rmm_rs_options` whose `log_file` is null or
/// NUL-terminated and whose `devices` holds `num_devices` ints, for the call.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_configure(options: *const RmmRsOptions) -> c_int {
    last_error::status(|| {
        // SAFETY: null or a readable `rmm_rs_options` (the caller's contract).
        let options = unsafe { options.as_ref() }.ok_or_else(|| null_argument("options"))?;
        // SAFETY: its pointers are valid for the call (the caller's contract).
        let config = unsafe { Config::from_c(options) }?;
        let logs = config.log_file.is_some();
        Registry::global().configure(config)?;
        if logs {
            crate::exit::flush_logs_at_exit();
        }
        Ok(())
    })
}

/// Allocates `size` bytes on `device`, ordered on `stream`: PyTorch's `alloc` signature. Null
/// for 0 bytes and on failure (see `rmm_rs_last_error`).
///
/// # Safety
/// `stream` follows the header's stream contract (0, a special handle, or a live stream of
/// the device's primary context).
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    last_error::boundary(|| {
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { stream_view(stream) };
        alloc_in(Registry::global(), size, device, stream)
    })
    .unwrap_or(ptr::null_mut())
}

/// Frees `ptr` (`rmm_rs_free` in the header): PyTorch's `free` signature. A refused free sets
/// the last error and counts in `failed_frees`.
///
/// # Safety
/// `ptr` is null or was allocated by `rmm_rs_alloc` (or `rmm_rs_torch_alloc`) on `device` with
/// `size` bytes, is not freed twice and is not used by work not ordered before `stream`;
/// `stream` follows the header's stream contract.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = last_error::boundary(|| {
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { stream_view(stream) };
        // SAFETY: the caller's contract.
        unsafe { free_in(Registry::global(), ptr, size, device, stream) }
    });
}

/// A byte count from a C `size_t` that the ssize_t-based paths take.
fn size_of_request(size: usize) -> CResult<isize> {
    isize::try_from(size)
        .map_err(|_| Error::invalid_argument(format!("size {size} is larger than SSIZE_MAX")))
}

/// Allocates `size` bytes on `device`, ordered on `stream`, into `*ptr`, returning the status
/// (`rmm_rs_allocate` in the header): `*ptr` is null for 0 bytes and on failure.
///
/// # Safety
/// `ptr` is null or writable for a pointer; `stream` follows the header's stream contract.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_allocate(
    ptr: *mut *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    last_error::status(|| {
        if ptr.is_null() {
            return Err(null_argument("ptr"));
        }
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { ptr.write(ptr::null_mut()) };
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { stream_view(stream) };
        let p = alloc_in(Registry::global(), size_of_request(size)?, device, stream)?;
        // SAFETY: as above.
        unsafe { ptr.write(p) };
        Ok(())
    })
}

/// Frees `ptr`, returning the status (`rmm_rs_deallocate` in the header): a refused free is
/// `RMM_RS_ERROR_INVALID_FREE` and counts in `failed_frees`.
///
/// # Safety
/// As [`rmm_rs_free`].
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_deallocate(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    last_error::status(|| {
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { stream_view(stream) };
        // SAFETY: the caller's contract.
        unsafe {
            free_in(
                Registry::global(),
                ptr,
                size_of_request(size)?,
                device,
                stream,
            )
        }
    })
}

/// Writes the statistics of `device` to `*out`.
///
/// # Safety
/// `out` is null or writable for an `rmm_rs_statistics`.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_get_statistics(device: c_int, out: *mut RmmRsStatistics) -> c_int {
    last_error::status(|| {
        if out.is_null() {
            return Err(null_argument("out"));
        }
        let stats = Registry::global().statistics(device)?;
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Resets the peaks of `device` (bytes, allocations, bytes held) to their current values, as
/// `torch.cuda.reset_peak_memory_stats`.
#[no_mangle]
pub extern "C" fn rmm_rs_reset_peak_statistics(device: c_int) -> c_int {
    last_error::status(|| Registry::global().reset_peak_statistics(device))
}

/// Writes the memory snapshot of `device` to `path` in PyTorch's format
/// (`torch.cuda.memory._dump_snapshot`'s pickle).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_dump_snapshot(device: c_int, path: *const c_char) -> c_int {
    last_error::status(|| {
        if path.is_null() {
            return Err(null_argument("path"));
        }
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let path = unsafe { CStr::from_ptr(path) };
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
        Registry::global().dump_snapshot(device, path)
    })
}

/// Writes out the CSV log of `device` (-1: every device).
#[no_mangle]
pub extern "C" fn rmm_rs_flush_log(device: c_int) -> c_int {
    last_error::status(|| Registry::global().flush_log(device))
}

/// The calling thread's last error message ("" if none), valid until its next failing call.
#[no_mangle]
pub extern "C" fn rmm_rs_last_error() -> *const c_char {
    last_error::message_ptr()
}

/// The calling thread's last error code (0 if none).
#[no_mangle]
pub extern "C" fn rmm_rs_last_error_code() -> c_int {
    last_error::code()
}

/// Resets the calling thread's last error.
#[no_mangle]
pub extern "C" fn rmm_rs_clear_last_error() {
    last_error::clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{RMM_RS_RESOURCE_POOL, RMM_RS_SIZE_DEFAULT};
    use crate::status::{
        RMM_RS_ERROR_INVALID_ARGUMENT, RMM_RS_ERROR_NOT_CONFIGURED, RMM_RS_SUCCESS,
    };
    use std::ffi::CString;
    use std::mem::MaybeUninit;

    fn last() -> (c_int, String) {
        // SAFETY: this thread's message, read before its next call.
        let text = unsafe { CStr::from_ptr(rmm_rs_last_error()) };
        (
            rmm_rs_last_error_code(),
            text.to_string_lossy().into_owned(),
        )
    }

    #[test]
    fn versions() {
        assert_eq!(rmm_rs_abi_version(), RMM_RS_ABI_VERSION);
        // SAFETY: a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(rmm_rs_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn options_init_writes_the_defaults() {
        let mut o = MaybeUninit::<RmmRsOptions>::uninit();
        // SAFETY: `o` is writable.
        let code = unsafe { rmm_rs_options_init(o.as_mut_ptr()) };
        assert_eq!(code, RMM_RS_SUCCESS);
        // SAFETY: initialized by the call.
        let o = unsafe { o.assume_init() };
        assert_eq!(o.resource, RMM_RS_RESOURCE_POOL);
        assert_eq!(
            (o.initial_pool_size, o.maximum_pool_size),
            (RMM_RS_SIZE_DEFAULT, RMM_RS_SIZE_DEFAULT)
        );
        assert_eq!((o.statistics, o.num_devices), (1, 0));
        assert!(o.log_file.is_null() && o.devices.is_null());
        // SAFETY: null is allowed and refused.
        let code = unsafe { rmm_rs_options_init(ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            last(),
            (RMM_RS_ERROR_INVALID_ARGUMENT, "options is NULL".into())
        );
    }

    #[test]
    fn byte_sizes_parse_as_rmm_does() {
        let parse = |text: &str| {
            let text = CString::new(text).unwrap();
            let mut bytes = 0u64;
            // SAFETY: both pointers are valid for the call.
            let code = unsafe { rmm_rs_parse_byte_size(text.as_ptr(), &mut bytes) };
            (code, bytes)
        };
        assert_eq!(parse("8GiB"), (RMM_RS_SUCCESS, 8 << 30));
        assert_eq!(parse("1.5GB"), (RMM_RS_SUCCESS, 1_500_000_000));
        assert_eq!(parse("1024"), (RMM_RS_SUCCESS, 1024));
        assert_eq!(parse("lots").0, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert!(last().1.contains("lots"), "{:?}", last());
        // SAFETY: null is allowed and refused.
        let code = unsafe { rmm_rs_parse_byte_size(ptr::null(), ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
    }

    #[test]
    fn bad_calls_fail_with_a_message_and_change_nothing() {
        // SAFETY: null is allowed and refused.
        let code = unsafe { rmm_rs_configure(ptr::null()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        let bad = RmmRsOptions {
            initial_pool_size: 100,
            ..RmmRsOptions::default()
        };
        // SAFETY: a valid options struct with null pointers.
        let code = unsafe { rmm_rs_configure(&bad) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert!(last().1.contains("multiple of 256"), "{:?}", last());
        // No test configures the global table, so device 900 is not configured.
        let mut stats = RmmRsStatistics::default();
        // SAFETY: `stats` is writable.
        let code = unsafe { rmm_rs_get_statistics(900, &mut stats) };
        assert_eq!(code, RMM_RS_ERROR_NOT_CONFIGURED);
        // SAFETY: null is allowed and refused.
        let code = unsafe { rmm_rs_get_statistics(0, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        rmm_rs_clear_last_error();
        // SAFETY: the default stream; nothing is allocated.
        let p = unsafe { rmm_rs_alloc(256, 900, ptr::null_mut()) };
        assert!(p.is_null());
        assert_eq!(last().0, RMM_RS_ERROR_NOT_CONFIGURED);
        rmm_rs_clear_last_error();
        // SAFETY: freeing null does nothing.
        unsafe { rmm_rs_free(ptr::null_mut(), 0, 900, ptr::null_mut()) };
        assert_eq!(last(), (RMM_RS_SUCCESS, String::new()));
        assert_eq!(rmm_rs_flush_log(-1), RMM_RS_SUCCESS);
        assert_eq!(rmm_rs_flush_log(-7), RMM_RS_ERROR_INVALID_ARGUMENT);
    }

    #[test]
    fn status_returning_calls_return_their_status() {
        use crate::status::RMM_RS_ERROR_INVALID_FREE;
        let mut p: *mut c_void = ptr::NonNull::<u8>::dangling().as_ptr().cast();
        // SAFETY: `p` is writable; the default stream; device 901 is never configured.
        let code = unsafe { rmm_rs_allocate(&mut p, 256, 901, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_NOT_CONFIGURED);
        assert!(p.is_null(), "*ptr is NULL on failure");
        // SAFETY: null is allowed and refused.
        let code = unsafe { rmm_rs_allocate(ptr::null_mut(), 256, 0, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        // SAFETY: as above.
        let code = unsafe { rmm_rs_allocate(&mut p, usize::MAX, 0, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert!(last().1.contains("SSIZE_MAX"), "{:?}", last());
        // A success returns SUCCESS and leaves the last error as it was.
        // SAFETY: 0 bytes: nothing is allocated.
        let code = unsafe { rmm_rs_allocate(&mut p, 0, 901, ptr::null_mut()) };
        assert_eq!((code, p), (RMM_RS_SUCCESS, ptr::null_mut()));
        assert_eq!(last().0, RMM_RS_ERROR_INVALID_ARGUMENT);
        // SAFETY: freeing null does nothing.
        let code = unsafe { rmm_rs_deallocate(ptr::null_mut(), 0, 901, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_SUCCESS);
        // Nothing was ever allocated on device 901: refused, not undefined.
        // SAFETY: refused before the pointer is used.
        let code = unsafe { rmm_rs_deallocate(0x1000 as *mut c_void, 256, 901, ptr::null_mut()) };
        assert_eq!(code, RMM_RS_ERROR_INVALID_FREE);
    }
}
