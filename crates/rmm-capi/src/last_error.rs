//! The calling thread's last error (`rmm_rs_last_error`) and the boundary every entry point
//! goes through: panics caught, failures recorded. Pure: no CUDA call.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::status::{Error, RMM_RS_ERROR_PANIC, RMM_RS_SUCCESS};

struct LastError {
    code: i32,
    message: CString,
}

thread_local! {
    static LAST: RefCell<LastError> = RefCell::new(LastError {
        code: RMM_RS_SUCCESS,
        message: CString::default(),
    });
}

/// Records `e` as the calling thread's last error. Interior NUL bytes of the message become
/// spaces. During thread teardown (the slot destroyed) the error is not recorded.
pub(crate) fn set(e: &Error) {
    let message = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = LastError {
                code: e.code,
                message,
            };
        }
    });
}

/// Resets the calling thread's last error.
pub(crate) fn clear() {
    set(&Error::new(RMM_RS_SUCCESS, ""));
}

/// The last error's code (`RMM_RS_SUCCESS` if none).
#[must_use]
pub(crate) fn code() -> i32 {
    LAST.try_with(|last| last.borrow().code)
        .unwrap_or(RMM_RS_SUCCESS)
}

/// The last error's message as a C string owned by the calling thread's slot: valid until the
/// next [`set`] on this thread (or the thread's end).
#[must_use]
pub(crate) fn message_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST.try_with(|last| last.borrow().message.as_ptr())
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)");
    format!("rmm-rs panicked (a bug; please report it): {what}")
}

/// Runs `f` at the C boundary: a panic becomes [`RMM_RS_ERROR_PANIC`] and never unwinds into
/// the caller; an error (or caught panic) is recorded as the thread's last error and returned.
/// The success path costs what `f` does (no panic is caught without one, and the failures are
/// handled out of line).
#[inline]
pub(crate) fn boundary<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failed(e)),
        Err(payload) => Err(panicked(payload)),
    }
}

/// Records `e` as the thread's last error and hands it back.
#[cold]
#[inline(never)]
fn failed(e: Error) -> Error {
    set(&e);
    e
}

/// The error of a caught panic, recorded as the thread's last error.
#[cold]
#[inline(never)]
fn panicked(payload: Box<dyn Any + Send>) -> Error {
    failed(Error::new(RMM_RS_ERROR_PANIC, panic_message(&*payload)))
}

/// [`boundary`] for entry points that return a status code.
pub(crate) fn status(f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match boundary(f) {
        Ok(()) => RMM_RS_SUCCESS,
        Err(e) => e.code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RMM_RS_ERROR_INVALID_ARGUMENT;
    use std::ffi::CStr;

    fn current() -> (i32, String) {
        // SAFETY: the pointer is this thread's NUL-terminated message, read before any other
        // call on the thread.
        let text = unsafe { CStr::from_ptr(message_ptr()) };
        (code(), text.to_string_lossy().into_owned())
    }

    #[test]
    fn errors_are_recorded_per_thread_and_kept_by_success() {
        clear();
        assert_eq!(current(), (RMM_RS_SUCCESS, String::new()));
        let code = status(|| Err(Error::invalid_argument("bad\0size")));
        assert_eq!(code, RMM_RS_ERROR_INVALID_ARGUMENT);
        assert_eq!(current(), (code, "bad size".to_owned()));
        assert_eq!(status(|| Ok(())), RMM_RS_SUCCESS);
        assert_eq!(
            current().0,
            RMM_RS_ERROR_INVALID_ARGUMENT,
            "success cleared it"
        );
        std::thread::spawn(|| assert_eq!(current(), (RMM_RS_SUCCESS, String::new())))
            .join()
            .unwrap();
        clear();
        assert_eq!(current(), (RMM_RS_SUCCESS, String::new()));
    }

    #[test]
    fn panics_are_caught_and_reported() {
        let code = status(|| panic!("boom {}", 7));
        assert_eq!(code, RMM_RS_ERROR_PANIC);
        let (c, text) = current();
        assert_eq!(c, RMM_RS_ERROR_PANIC);
        assert!(text.contains("boom 7"), "{text}");
        let r: Result<u8, Error> = boundary(|| std::panic::panic_any(42_u32));
        assert!(r.unwrap_err().message.contains("without a message"));
    }
}
