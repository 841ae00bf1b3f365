//! Writing the CSV logs out when the process exits: the logs are buffered and the C API's
//! table is never dropped, so without this the last rows of a program that never calls
//! `rmm_rs_flush_log` (a PyTorch script) would be lost.

use std::ffi::c_int;
use std::panic::catch_unwind;
use std::sync::Once;

use crate::registry::Registry;

extern "C" {
    /// The C library's `atexit`.
    fn atexit(function: extern "C" fn()) -> c_int;
}

extern "C" fn flush_all() {
    // Never unwind into the C library's exit path; an error here has nobody to go to.
    let _ = catch_unwind(|| Registry::global().flush_logs_if_idle());
}

/// Registers the flush at exit, once per process.
pub(crate) fn flush_logs_at_exit() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `flush_all` is a plain `extern "C" fn()` that never unwinds; it stays valid
        // for the life of the process (the library is never unloaded by its users: PyTorch
        // keeps its allocator library loaded).
        if unsafe { atexit(flush_all) } != 0 {
            log::error!(
                "rmm-capi: atexit refused the log flush; call rmm_rs_flush_log before exit"
            );
        }
    });
}
