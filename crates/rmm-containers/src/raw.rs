//! The few raw calls the containers make: allocation and free through a resource, copies and
//! memsets through rmm-sys, and the event that orders one stream after another. Each `unsafe`
//! call lives here, behind a contract stated once.
//!
//! Callers (the containers) guarantee what the contracts below require by construction: a
//! container's `(data, capacity, alignment)` is exactly what its resource handed out, no range
//! they pass exceeds the container's `size()`, and the stream is the container's own (owned by
//! a [`BufferStream`](crate::BufferStream), so it is alive) or one the caller passed in for
//! the duration of the call.

use rmm_mr::{DeviceMemoryResource, MrError, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::{memory, DeviceId, DevicePtr, CU_STREAM_LEGACY};

use crate::drop_errors::record_drop_error;

/// Allocates through `mr`; zero bytes never reach the resource (RMM: a zero-size buffer holds
/// `nullptr` and does not call its resource).
///
/// A resource whose memory the device cannot access (its
/// [`properties`](DeviceMemoryResource::properties) say so: a host-only test resource, or
/// simulated memory with addresses that may never be touched) is refused with
/// [`MrError::InvalidArgument`]: the containers copy into their memory on the device, and the
/// resource's contract promises access only where its properties say.
pub(crate) fn allocate(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    bytes: usize,
    alignment: usize,
) -> MrResult<DevicePtr> {
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    if !mr.properties().device_accessible {
        return Err(MrError::invalid_argument(format!(
            "containers need device-accessible memory, and {mr:?} says its memory is not"
        )));
    }
    mr.allocate(stream, bytes, alignment)
}

/// Frees an allocation and records (instead of returning) a failure: this runs where no caller
/// can act on an error (drop, or the old allocation of a reallocation).
///
/// # Safety
/// `(ptr, bytes, alignment)` came from `mr.allocate` (or is `(NULL, 0, _)`), is freed once, and
/// no work that uses it is ordered after this point of `stream`.
pub(crate) unsafe fn free_recorded(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
    alignment: usize,
    what: &str,
) {
    if ptr.is_null() && bytes == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    if let Err(e) = unsafe { mr.deallocate(stream, ptr, bytes, alignment) } {
        record_drop_error(
            &format!("{what}: freeing {ptr} ({bytes} bytes) on stream {stream}"),
            e,
        );
    }
}

/// Copies `bytes` between two device (or host-accessible) ranges on `stream`, without waiting.
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes` bytes, on `stream`, until the stream
/// reaches the copy (both are allocations kept alive by their owners for that long, or the
/// caller vouches for them).
pub(crate) unsafe fn copy_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract; the view's handle is alive (its invariant).
    unsafe { memory::memcpy_async(dst, src, bytes, stream.as_raw()) }?;
    Ok(())
}

/// Copies a host slice to device memory and waits for the copy, so the slice may be reused or
/// freed on return (it may be pinned memory, which the driver reads asynchronously).
///
/// # Safety
/// `dst` is writable for `src.len()` bytes on `stream`.
pub(crate) unsafe fn copy_from_host_sync(
    dst: DevicePtr,
    src: &[u8],
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    // SAFETY: the caller's contract; the view's handle is alive.
    unsafe { memory::copy_to_device_sync(dst, src, stream.as_raw()) }?;
    Ok(())
}

/// Copies one host value to device memory on `stream` without waiting for the device.
///
/// The value is first copied into a local on this function's stack, and the copy is issued
/// from there: stack memory is pageable, and for pageable sources the driver stages the bytes
/// before `cuMemcpyAsync` returns (CUDA's "API synchronization behavior": "the function will
/// return once the pageable buffer has been copied to the staging memory"). So neither the
/// local nor `value` is read after return, whatever memory `value` lives in (RMM forbids
/// temporaries here for the same reason; this makes any reference fine).
///
/// # Safety
/// `dst` is writable for `size_of::<T>()` bytes on `stream`.
pub(crate) unsafe fn copy_value_async<T: bytemuck::Pod>(
    dst: DevicePtr,
    value: &T,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    let staged: T = *value;
    let bytes = bytemuck::bytes_of(&staged);
    // SAFETY: `dst`: the caller's contract; the source is `staged`, pageable stack memory that
    // is alive for the call, and staged by the driver before it returns (see above).
    unsafe {
        copy_async(
            dst,
            DevicePtr::from_host_ptr(bytes.as_ptr().cast_mut()),
            bytes.len(),
            stream,
        )
    }
}

/// Copies device memory into a host slice and waits for the copy.
///
/// # Safety
/// `src` is readable for `dst.len()` bytes on `stream`.
pub(crate) unsafe fn copy_to_host_sync(
    dst: &mut [u8],
    src: DevicePtr,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    // SAFETY: the caller's contract; `dst` is an exclusive host slice alive until the copy
    // completed (the function synchronizes).
    unsafe { memory::copy_to_host_sync(dst, src, stream.as_raw()) }?;
    Ok(())
}

/// Writes `bytes` zero bytes at `dst` on `stream`.
///
/// # Safety
/// `dst` is writable for `bytes` bytes on `stream`.
pub(crate) unsafe fn zero_async(
    dst: DevicePtr,
    bytes: usize,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    unsafe { memory::memset_d8_async(dst, 0, bytes, stream.as_raw()) }?;
    Ok(())
}

/// A stream together with the device whose context resolves its handle: the special handles
/// (default, legacy, per-thread) name a different stream in each device's context.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamOn<'a> {
    pub(crate) device: DeviceId,
    pub(crate) view: CudaStreamView<'a>,
}

impl<'a> StreamOn<'a> {
    pub(crate) fn new(device: DeviceId, view: CudaStreamView<'a>) -> Self {
        Self { device, view }
    }

    /// Whether both name the same stream. Equal handles on one device are (the hot path: no
    /// driver call, no mode lookup); otherwise the handles are compared as the driver reads
    /// them, so the default stream is the legacy stream in legacy mode and the per-thread
    /// stream in per-thread mode.
    ///
    /// The per-thread default stream is the calling thread's: its handle counts as one stream
    /// here, so ordering two threads' per-thread streams stays the caller's business.
    pub(crate) fn is_same(&self, other: &StreamOn<'_>) -> bool {
        self.device == other.device
            && (self.view == other.view
                || canonical(self.view.as_raw()) == canonical(other.view.as_raw()))
    }
}

/// The handle the driver sees, with the legacy stream's two spellings (0 and
/// `CU_STREAM_LEGACY`) made one.
pub(crate) fn canonical(raw: rmm_sys::raw::CUstream) -> usize {
    if raw.is_null() {
        CU_STREAM_LEGACY as usize
    } else {
        raw as usize
    }
}

/// Makes the work enqueued on `waiter` from now on wait for the work queued so far on
/// `signaller`: an event recorded on `signaller` (with its device current) and waited on by
/// `waiter` (with its device current). The host does not block. When both name the same
/// stream nothing happens, without a driver call.
///
/// If the event cannot be created, recorded or waited on, the host synchronizes `signaller`
/// instead (which orders everything queued on it before anything enqueued later anywhere);
/// only when that fails too is the event's error returned.
pub(crate) fn order_after(waiter: StreamOn<'_>, signaller: StreamOn<'_>) -> MrResult<()> {
    if waiter.is_same(&signaller) {
        return Ok(());
    }
    wait_for_event(waiter, signaller)
}

#[cfg(not(test))]
fn wait_for_event(waiter: StreamOn<'_>, signaller: StreamOn<'_>) -> MrResult<()> {
    let waited = (|| -> MrResult<()> {
        let event = {
            let _guard = rmm_sys::DeviceGuard::new(signaller.device)?;
            let event = rmm_stream::CudaEvent::new()?;
            event.record(signaller.view)?;
            event
        };
        let _guard = rmm_sys::DeviceGuard::new(waiter.device)?;
        event.wait(waiter.view)?;
        // The event may be destroyed at once: a wait already enqueued keeps its record.
        Ok(())
    })();
    if let Err(e) = waited {
        log::warn!(
            "rmm: ordering stream {} after stream {} with an event failed ({e}); \
             synchronizing stream {} instead",
            waiter.view,
            signaller.view,
            signaller.view
        );
        let synced = rmm_sys::DeviceGuard::new(signaller.device)
            .and_then(|_guard| signaller.view.synchronize());
        if synced.is_err() {
            return Err(e);
        }
    }
    Ok(())
}

/// Unit tests have no GPU: they record the orderings the containers ask for instead.
#[cfg(test)]
fn wait_for_event(waiter: StreamOn<'_>, signaller: StreamOn<'_>) -> MrResult<()> {
    orderings::record(
        waiter.view.value() as usize,
        signaller.view.value() as usize,
    );
    Ok(())
}

#[cfg(test)]
pub(crate) mod orderings {
    //! The orderings the current test thread asked for, as `(waiter, signaller)` handles.

    use std::cell::RefCell;

    thread_local! {
        static SEEN: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn record(waiter: usize, signaller: usize) {
        SEEN.with(|s| s.borrow_mut().push((waiter, signaller)));
    }

    /// Returns and forgets what this thread recorded.
    pub(crate) fn take() -> Vec<(usize, usize)> {
        SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm_stream::{default_stream_mode, DefaultStreamMode};
    use rmm_sys::CU_STREAM_PER_THREAD;

    fn on(device: i32, handle: usize) -> StreamOn<'static> {
        // SAFETY: the handles are only compared, never given to the driver.
        StreamOn::new(DeviceId(device), unsafe {
            CudaStreamView::from_raw(handle as _)
        })
    }

    #[test]
    fn memory_the_device_cannot_access_is_refused() {
        let host_only = rmm_mr::testing::HostMockResource::new();
        let r = allocate(&host_only, CudaStreamView::default(), 64, 256);
        assert!(
            matches!(r, Err(MrError::InvalidArgument(_))),
            "a host-only resource must be refused: {r:?}"
        );
        assert_eq!(
            host_only.allocation_calls(),
            0,
            "the resource was not asked"
        );
        // Zero bytes never reach any resource.
        assert_eq!(
            allocate(&host_only, CudaStreamView::default(), 0, 256).unwrap(),
            DevicePtr::NULL
        );
    }

    #[test]
    fn simulated_memory_is_refused_even_under_a_pool() {
        let simulated = rmm_mr::SimulatedMemoryResource::new(1 << 20).unwrap();
        let pool = rmm_mr::PoolMemoryResource::new(simulated.clone(), 0).unwrap();
        for mr in [&simulated as &dyn DeviceMemoryResource, &pool] {
            let r = allocate(mr, CudaStreamView::default(), 64, 256);
            assert!(
                matches!(r, Err(MrError::InvalidArgument(_))),
                "simulated memory must be refused: {r:?}"
            );
        }
        assert_eq!(simulated.used(), 0, "nothing was allocated");
    }

    #[test]
    fn both_spellings_of_the_legacy_stream_are_one() {
        assert_eq!(canonical(std::ptr::null_mut()), 1);
        assert_eq!(canonical(CU_STREAM_LEGACY), 1);
        assert_eq!(canonical(CU_STREAM_PER_THREAD), 2);
        assert_eq!(canonical(0x1234 as _), 0x1234);
    }

    #[test]
    fn the_default_stream_is_the_stream_its_mode_names() {
        let legacy_mode = default_stream_mode() == DefaultStreamMode::Legacy;
        assert_eq!(on(0, 0).is_same(&on(0, 1)), legacy_mode);
        assert_eq!(on(0, 0).is_same(&on(0, 2)), !legacy_mode);
        assert!(!on(0, 1).is_same(&on(0, 2)));
        assert!(on(0, 0x1234).is_same(&on(0, 0x1234)));
        assert!(!on(0, 0x1234).is_same(&on(0, 0x1235)));
    }

    #[test]
    fn special_handles_on_two_devices_are_two_streams() {
        assert!(!on(0, 1).is_same(&on(1, 1)));
        assert!(!on(0, 0).is_same(&on(1, 0)));
    }

    #[test]
    fn the_same_stream_records_no_ordering() {
        let _ = orderings::take();
        order_after(on(0, 7), on(0, 7)).unwrap();
        order_after(on(0, 1), on(0, 1)).unwrap();
        assert_eq!(orderings::take(), vec![]);
        order_after(on(0, 7), on(0, 8)).unwrap();
        order_after(on(1, 1), on(0, 1)).unwrap();
        assert_eq!(orderings::take(), vec![(7, 8), (1, 1)]);
    }
}
