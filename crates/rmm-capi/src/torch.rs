//! The hooks PyTorch's `CUDAPluggableAllocator` loads: `rmm_rs_torch_alloc` and
//! `rmm_rs_torch_free`.
//!
//! PyTorch 2.11 does not check the pointer `alloc` returns: a null one becomes a tensor whose
//! data pointer is 0. So a failed allocation must throw a C++ exception, as RMM's
//! `rmm_torch_allocator` does. The throw happens in the C++ shim (`shim/torch_shim.cpp`,
//! compiled by the build script), which the hook calls with the error's code and message; the
//! hook is `extern "C-unwind"`, so the exception may pass through it back to PyTorch. It is a
//! Rust function rather than a C++ one because a `cdylib` exports only the symbols Rust defines.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};

use rmm::CudaStreamView;

use crate::ffi::{alloc_in, free_in, stream_view};
use crate::last_error;
use crate::registry::Registry;

extern "C-unwind" {
    /// Throws `rmm_rs::out_of_memory` (code `RMM_RS_ERROR_OUT_OF_MEMORY`) or
    /// `rmm_rs::bad_alloc` (any other code), both derived from `std::bad_alloc`, whose `what()`
    /// is a copy of `what`.
    fn rmm_rs_cxx_throw(code: c_int, what: *const c_char) -> !;
}

/// PyTorch's streams: 0 is the legacy default stream (PyTorch is not built for per-thread
/// default streams), whatever `RMM_DEFAULT_STREAM` says.
///
/// # Safety
/// As `stream_view`.
unsafe fn torch_stream<'a>(stream: *mut c_void) -> CudaStreamView<'a> {
    if stream.is_null() {
        CudaStreamView::legacy()
    } else {
        // SAFETY: the caller's contract.
        unsafe { stream_view(stream) }
    }
}

/// PyTorch's allocation hook: as `rmm_rs_alloc`, but stream 0 is the legacy stream and a
/// failure throws a C++ exception derived from `std::bad_alloc` carrying the message.
///
/// # Safety
/// `stream` follows the header's stream contract. The caller is C++ code that catches (an
/// exception unwinds out of this function).
#[no_mangle]
pub unsafe extern "C-unwind" fn rmm_rs_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let result = last_error::boundary(|| {
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { torch_stream(stream) };
        alloc_in(Registry::global(), size, device, stream)
    });
    match result {
        Ok(p) => p,
        Err(e) => {
            let what = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
            // SAFETY: `what` is NUL-terminated and outlives the call, which copies it before
            // throwing; the exception unwinds through this `C-unwind` frame, which holds
            // nothing but `what` and `e` (dropped on the way).
            unsafe { rmm_rs_cxx_throw(e.code, what.as_ptr()) }
        }
    }
}

/// How many refused frees the free hook writes to stderr before it only counts them.
const FREE_ERRORS_PRINTED: u32 = 8;

/// PyTorch's free hook: as `rmm_rs_free` (stream 0 is the legacy stream); PyTorch cannot take
/// an error from a free, so a refused one is also written to stderr (the first few).
///
/// # Safety
/// As `rmm_rs_free`.
#[no_mangle]
pub unsafe extern "C" fn rmm_rs_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    static PRINTED: AtomicU32 = AtomicU32::new(0);
    let result = last_error::boundary(|| {
        // SAFETY: the stream contract, for this call.
        let stream = unsafe { torch_stream(stream) };
        // SAFETY: the caller's contract.
        unsafe { free_in(Registry::global(), ptr, size, device, stream) }
    });
    if let Err(e) = result {
        let n = PRINTED.fetch_add(1, Ordering::Relaxed);
        // Written with `writeln!`, whose error is dropped: `eprintln!` panics when stderr is
        // closed, and this function must not unwind.
        let mut stderr = std::io::stderr();
        if n < FREE_ERRORS_PRINTED {
            let _ = writeln!(
                stderr,
                "rmm-rs: rmm_rs_torch_free({ptr:?}, {size}, {device}): {e}"
            );
        }
        if n + 1 == FREE_ERRORS_PRINTED {
            let _ = writeln!(
                stderr,
                "rmm-rs: further refused frees are counted (rmm_rs_statistics.failed_frees), not printed"
            );
        }
    }
}
