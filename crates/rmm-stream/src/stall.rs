//! Stalling a stream on purpose, for tests and benchmarks of stream ordering.

use std::ffi::c_void;
use std::time::Duration;

use rmm_sys::stream as raw;
use rmm_sys::CudaResult;

use crate::view::CudaStreamView;

unsafe extern "C" fn sleep_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Duration>` leaked by `stall`, handed to this function once.
    let d = unsafe { Box::from_raw(data.cast::<Duration>()) };
    std::thread::sleep(*d);
}

/// Enqueues a host function that sleeps for `duration` on `stream`: work queued on the stream
/// after it starts only once the sleep ends (`cuLaunchHostFunc`). Tests use it to make a race
/// between streams certain to show.
pub fn stall(stream: CudaStreamView<'_>, duration: Duration) -> CudaResult<()> {
    let data = Box::into_raw(Box::new(duration)).cast::<c_void>();
    // SAFETY: the function runs once with `data`, which it frees; it makes no CUDA calls; the
    // view's handle is valid (its invariant).
    let r = unsafe { raw::launch_host_func(stream.as_raw(), sleep_host_fn, data) };
    if r.is_err() {
        // SAFETY: the launch failed, so the host function will never run and free `data`.
        drop(unsafe { Box::from_raw(data.cast::<Duration>()) });
    }
    r
}
