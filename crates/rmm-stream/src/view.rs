//! Non-owning stream views.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

use rmm_sys::raw::CUstream;
use rmm_sys::stream as raw;
use rmm_sys::{CudaResult, CU_STREAM_PER_THREAD};

use crate::mode::{default_stream_mode, DefaultStreamMode};

/// `CU_STREAM_LEGACY` as an integer.
const LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD` as an integer.
const PER_THREAD: usize = 0x2;

/// A copyable, non-owning view of a CUDA stream (RMM's `cuda_stream_view`).
///
/// Unlike RMM's, a view borrows what it views: [`CudaStream::view`](crate::CudaStream::view)
/// returns a `CudaStreamView<'_>` tied to the stream, so a view cannot outlive the stream it
/// names (in C++ a dangling view is undefined behaviour). The default, legacy and per-thread
/// default streams are `CudaStreamView<'static>`. Views of foreign streams (cudarc's, say) come
/// from the `unsafe` [`CudaStreamView::from_raw`].
///
/// Handle 0 means "the default stream", whose meaning is the process's
/// [`DefaultStreamMode`]; [`CudaStreamView::as_raw`] resolves it to the handle the driver
/// needs.
///
/// A view that would outlive its stream does not compile:
///
/// ```compile_fail,E0597
/// use rmm_stream::{CudaStream, CudaStreamView};
///
/// let view: CudaStreamView<'static>;
/// {
///     let stream = CudaStream::non_blocking().unwrap();
///     view = stream.view(); // `stream` does not live long enough
/// }
/// let _ = view.synchronize();
/// ```
///
/// Nor does one kept after its stream was dropped:
///
/// ```compile_fail,E0505
/// use rmm_stream::CudaStream;
///
/// let stream = CudaStream::non_blocking().unwrap();
/// let view = stream.view();
/// drop(stream); // cannot move out of `stream` while it is borrowed
/// let _ = view.synchronize();
/// ```
#[doc(alias = "rmm::cuda_stream_view")]
#[derive(Clone, Copy)]
pub struct CudaStreamView<'a> {
    handle: usize,
    /// The stream's `cuStreamGetId` when the view knows it (views of a
    /// [`CudaStream`](crate::CudaStream), which reads it once at creation), else 0: then
    /// [`id`](Self::id) asks the driver. The view borrows the stream, so the id is that of the
    /// stream the handle names for as long as the view exists.
    id: u64,
    _stream: PhantomData<&'a ()>,
}

impl CudaStreamView<'static> {
    /// The default stream (handle 0, RMM's `cuda_stream_default`).
    #[doc(alias = "rmm::cuda_stream_default")]
    #[must_use]
    pub const fn default_stream() -> Self {
        Self::special(0)
    }

    /// The legacy default stream (`CU_STREAM_LEGACY`, RMM's `cuda_stream_legacy`).
    #[doc(alias = "rmm::cuda_stream_legacy")]
    #[must_use]
    pub const fn legacy() -> Self {
        Self::special(LEGACY)
    }

    /// The calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`, RMM's
    /// `cuda_stream_per_thread`).
    #[doc(alias = "rmm::cuda_stream_per_thread")]
    #[must_use]
    pub const fn per_thread() -> Self {
        Self::special(PER_THREAD)
    }

    const fn special(handle: usize) -> Self {
        Self {
            handle,
            id: 0,
            _stream: PhantomData,
        }
    }
}

impl Default for CudaStreamView<'static> {
    fn default() -> Self {
        Self::default_stream()
    }
}

impl<'a> CudaStreamView<'a> {
    /// A view of a raw stream handle.
    ///
    /// # Safety
    /// `stream` is 0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, or a stream that stays alive
    /// (not destroyed) for `'a`.
    #[must_use]
    pub unsafe fn from_raw(stream: CUstream) -> Self {
        Self {
            handle: stream as usize,
            id: 0,
            _stream: PhantomData,
        }
    }

    /// A view of a stream whose `cuStreamGetId` is `id` (0: not known).
    ///
    /// # Safety
    /// As [`from_raw`](Self::from_raw), and `id` is 0 or the id of the stream `stream` names.
    pub(crate) unsafe fn with_id(stream: CUstream, id: u64) -> Self {
        Self {
            handle: stream as usize,
            id,
            _stream: PhantomData,
        }
    }

    /// The handle as given (0 for the default stream; RMM's `value()`).
    #[must_use]
    pub fn value(&self) -> CUstream {
        self.handle as CUstream
    }

    /// The handle to pass to the driver: the default stream (0) becomes `CU_STREAM_PER_THREAD`
    /// in per-thread mode (the driver's non-`_ptsz` entry points read 0 as the legacy stream).
    #[inline]
    #[must_use]
    pub fn as_raw(&self) -> CUstream {
        if self.handle == 0 && default_stream_mode() == DefaultStreamMode::PerThread {
            CU_STREAM_PER_THREAD
        } else {
            self.handle as CUstream
        }
    }

    /// Whether this is the per-thread default stream: `CU_STREAM_PER_THREAD`, or the default
    /// stream in per-thread mode.
    #[must_use]
    #[inline]
    pub fn is_per_thread_default(&self) -> bool {
        self.handle == PER_THREAD
            || (self.handle == 0 && default_stream_mode() == DefaultStreamMode::PerThread)
    }

    /// Whether this is the legacy default stream: `CU_STREAM_LEGACY`, or the default stream in
    /// legacy mode.
    #[must_use]
    #[inline]
    pub fn is_default(&self) -> bool {
        self.handle == LEGACY
            || (self.handle == 0 && default_stream_mode() == DefaultStreamMode::Legacy)
    }

    /// Blocks until all work queued on the stream has completed.
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the handle is special or alive for `'a` (the view's invariant).
        unsafe { raw::stream_synchronize(self.as_raw()) }
    }

    /// `true` when all work queued on the stream has completed.
    pub fn is_idle(&self) -> CudaResult<bool> {
        // SAFETY: as `synchronize`.
        unsafe { raw::stream_query(self.as_raw()) }
    }

    /// The driver's process-unique id of the stream (`cuStreamGetId`). Unlike the handle, an id
    /// is never reused by a later stream, so it is a safe key for per-stream state.
    ///
    /// A view of a [`CudaStream`](crate::CudaStream) knows the id (the stream read it once
    /// when it was created) and answers without a driver call; other views ask the driver
    /// each time (a handle alone may name a later stream once its stream is destroyed, so no
    /// answer is cached by handle).
    #[inline]
    pub fn id(&self) -> CudaResult<u64> {
        if self.id != 0 {
            return Ok(self.id);
        }
        // SAFETY: as `synchronize`.
        unsafe { raw::stream_get_id(self.as_raw()) }
    }
}

#[cfg(feature = "testing")]
impl CudaStreamView<'static> {
    /// Fake stream number `n` of rmm-sys's simulated driver ([`rmm_sys::fault`], feature
    /// `testing`): an ordinary stream for the code above (it has an id, events record on it and
    /// streams wait on it) that no driver call ever receives. For tests without a GPU; never
    /// for real device work.
    #[must_use]
    pub fn simulated(n: u32) -> Self {
        // SAFETY: a fake handle is never passed to the driver (every rmm-sys wrapper answers it
        // itself), so there is nothing that could be destroyed under the view.
        unsafe { Self::from_raw(rmm_sys::fault::fake_stream(n)) }
    }
}

impl PartialEq for CudaStreamView<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.handle == other.handle
    }
}

impl Eq for CudaStreamView<'_> {}

impl Hash for CudaStreamView<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.handle.hash(state);
    }
}

impl fmt::Debug for CudaStreamView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaStreamView({self})")
    }
}

impl fmt::Display for CudaStreamView<'_> {
    /// The handle as RMM prints it (an `ostream` of a pointer: `0` for null, else hex).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.handle == 0 {
            f.write_str("0")
        } else {
            write!(f, "{:#x}", self.handle)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_streams() {
        let d = CudaStreamView::default();
        assert_eq!(d.value() as usize, 0);
        assert!(CudaStreamView::legacy().is_default());
        assert!(!CudaStreamView::legacy().is_per_thread_default());
        assert!(CudaStreamView::per_thread().is_per_thread_default());
        assert!(!CudaStreamView::per_thread().is_default());
        // Handle 0 is exactly one of the two, by mode.
        assert_ne!(d.is_default(), d.is_per_thread_default());
        match default_stream_mode() {
            DefaultStreamMode::Legacy => assert_eq!(d.as_raw() as usize, 0),
            DefaultStreamMode::PerThread => assert_eq!(d.as_raw(), CU_STREAM_PER_THREAD),
        }
    }

    #[test]
    fn display_like_rmm() {
        assert_eq!(CudaStreamView::default().to_string(), "0");
        assert_eq!(CudaStreamView::legacy().to_string(), "0x1");
        assert_eq!(CudaStreamView::per_thread().to_string(), "0x2");
        assert_ne!(CudaStreamView::legacy(), CudaStreamView::per_thread());
    }

    #[test]
    fn a_known_id_needs_no_driver_call() {
        use rmm_sys::fault::{self, DriverCall, FaultScope};
        let _scope = FaultScope::new();
        let fake = rmm_sys::fault::fake_stream(7);
        // SAFETY: a fake handle never reaches a driver; 42 stands for its id.
        let known = unsafe { CudaStreamView::with_id(fake, 42) };
        assert_eq!(known.id(), Ok(42));
        assert_eq!(fault::calls(DriverCall::StreamId), 0);
        // SAFETY: as above.
        let unknown = unsafe { CudaStreamView::from_raw(fake) };
        assert!(unknown.id().is_ok());
        assert_eq!(fault::calls(DriverCall::StreamId), 1);
        assert_eq!(known, unknown, "views compare by handle");
    }

    #[test]
    fn no_driver_is_an_error() {
        if rmm_sys::is_driver_present() {
            assert_ne!(
                CudaStreamView::legacy().synchronize(),
                Err(rmm_sys::CudaError::DriverNotFound)
            );
        } else {
            assert_eq!(
                CudaStreamView::legacy().synchronize(),
                Err(rmm_sys::CudaError::DriverNotFound)
            );
            assert_eq!(
                CudaStreamView::default().id(),
                Err(rmm_sys::CudaError::DriverNotFound)
            );
        }
    }
}
