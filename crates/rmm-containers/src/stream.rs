//! The stream a container remembers: [`BufferStream`].

use std::fmt;
use std::sync::Arc;

use rmm_stream::{CudaStream, CudaStreamView};

/// The stream a container stores and frees on: an owning stream handle.
///
/// # Why not a `CudaStreamView`
/// RMM's `device_buffer` stores a `cuda_stream_view`, a plain handle: if the stream is
/// destroyed while the buffer lives, the buffer later frees on a dangling handle (undefined
/// behaviour). rmm-rs's [`CudaStreamView<'a>`] borrows its stream, so storing one would force a
/// lifetime on every container (`DeviceBuffer<'s>`), which then could not be returned from the
/// scope that owns the stream, stored in structs without a lifetime, or sent to a thread.
///
/// A `BufferStream` instead *shares ownership* of the stream, so it cannot dangle:
/// - the default, legacy and per-thread default streams are `'static` views;
/// - an owned [`CudaStream`] is held through an `Arc`, kept alive as long as any container (or
///   clone of the handle) names it;
/// - with the `cudarc` feature, a cudarc stream (`Arc<cudarc::driver::CudaStream>`) is held
///   the same way.
///
/// Cloning is cheap (an `Arc` clone at most). Constructors of containers take
/// `impl Into<BufferStream>`, so `CudaStreamView::default()`, `CudaStreamView::legacy()`,
/// `Arc<CudaStream>`, `&Arc<CudaStream>` or a `CudaStream` (moved into a new `Arc`) can all be
/// passed directly. A non-special `CudaStreamView<'static>` can only come from the `unsafe`
/// [`CudaStreamView::from_raw`], whose caller already promised the stream lives forever.
#[derive(Clone)]
pub struct BufferStream {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Static(CudaStreamView<'static>),
    Shared(Arc<CudaStream>),
    #[cfg(feature = "cudarc")]
    Cudarc(Arc<cudarc::driver::CudaStream>),
}

impl BufferStream {
    /// The default stream (handle 0, whose meaning is the process's default-stream mode).
    #[must_use]
    pub const fn default_stream() -> Self {
        Self::from_static(CudaStreamView::default_stream())
    }

    /// The legacy default stream.
    #[must_use]
    pub const fn legacy() -> Self {
        Self::from_static(CudaStreamView::legacy())
    }

    /// The per-thread default stream of whichever thread uses it.
    #[must_use]
    pub const fn per_thread() -> Self {
        Self::from_static(CudaStreamView::per_thread())
    }

    /// A `'static` view (a special stream, or a foreign stream its creator promised never to
    /// destroy).
    #[must_use]
    pub const fn from_static(view: CudaStreamView<'static>) -> Self {
        Self {
            inner: Inner::Static(view),
        }
    }

    /// A stream whose ownership is shared with the caller.
    #[must_use]
    pub fn shared(stream: Arc<CudaStream>) -> Self {
        Self {
            inner: Inner::Shared(stream),
        }
    }

    /// A view of the stream, valid while this handle lives.
    #[must_use]
    pub fn view(&self) -> CudaStreamView<'_> {
        match &self.inner {
            Inner::Static(v) => *v,
            Inner::Shared(s) => s.view(),
            #[cfg(feature = "cudarc")]
            Inner::Cudarc(s) => cudarc_stream_view(s),
        }
    }

    /// The shared owned stream, if this handle holds one.
    #[must_use]
    pub fn as_shared(&self) -> Option<&Arc<CudaStream>> {
        match &self.inner {
            Inner::Shared(s) => Some(s),
            _ => None,
        }
    }

    /// The cudarc stream, if this handle holds one.
    #[cfg(feature = "cudarc")]
    #[must_use]
    pub fn as_cudarc(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.inner {
            Inner::Cudarc(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is a `'static` view (a special stream), as opposed to a shared owned one.
    #[must_use]
    pub fn is_static(&self) -> bool {
        matches!(self.inner, Inner::Static(_))
    }

    /// The `'static` view, if this handle is one.
    #[must_use]
    pub fn as_static(&self) -> Option<CudaStreamView<'static>> {
        match self.inner {
            Inner::Static(v) => Some(v),
            _ => None,
        }
    }

    #[cfg(feature = "cudarc")]
    pub(crate) fn cudarc(stream: Arc<cudarc::driver::CudaStream>) -> Self {
        Self {
            inner: Inner::Cudarc(stream),
        }
    }
}

impl Default for BufferStream {
    fn default() -> Self {
        Self::default_stream()
    }
}

impl From<CudaStreamView<'static>> for BufferStream {
    fn from(view: CudaStreamView<'static>) -> Self {
        Self::from_static(view)
    }
}

impl From<Arc<CudaStream>> for BufferStream {
    fn from(stream: Arc<CudaStream>) -> Self {
        Self::shared(stream)
    }
}

impl From<&Arc<CudaStream>> for BufferStream {
    fn from(stream: &Arc<CudaStream>) -> Self {
        Self::shared(Arc::clone(stream))
    }
}

impl From<CudaStream> for BufferStream {
    fn from(stream: CudaStream) -> Self {
        Self::shared(Arc::new(stream))
    }
}

impl From<&BufferStream> for BufferStream {
    fn from(stream: &BufferStream) -> Self {
        stream.clone()
    }
}

impl PartialEq for BufferStream {
    /// Equal when both name the same stream handle.
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for BufferStream {}

impl PartialEq<CudaStreamView<'_>> for BufferStream {
    fn eq(&self, other: &CudaStreamView<'_>) -> bool {
        self.view() == *other
    }
}

impl fmt::Debug for BufferStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::Static(_) => "static",
            Inner::Shared(_) => "shared",
            #[cfg(feature = "cudarc")]
            Inner::Cudarc(_) => "cudarc",
        };
        write!(f, "BufferStream({kind} {})", self.view())
    }
}

impl fmt::Display for BufferStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.view(), f)
    }
}

/// A view of a cudarc stream, borrowing it (so it cannot outlive it). cudarc's null stream
/// becomes the legacy default stream. (Lives here, beside [`BufferStream`], which uses it;
/// re-exported from [`interop`](crate::interop).)
#[cfg(feature = "cudarc")]
#[must_use]
pub fn cudarc_stream_view(stream: &cudarc::driver::CudaStream) -> CudaStreamView<'_> {
    let raw = stream.cu_stream();
    if raw.is_null() {
        CudaStreamView::legacy()
    } else {
        // SAFETY: the handle names a stream that lives at least as long as `stream` is
        // borrowed (cudarc destroys owned streams on drop; borrowed wrappers carry their
        // creator's promise that the stream outlives them). The cast only renames the pointee
        // type: both bindings declare the same opaque driver handle.
        unsafe { CudaStreamView::from_raw(raw.cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_streams_convert_and_compare() {
        let d: BufferStream = CudaStreamView::default().into();
        assert_eq!(d, BufferStream::default());
        assert_eq!(d, BufferStream::default_stream());
        assert!(d.is_static());
        assert_eq!(d.as_static(), Some(CudaStreamView::default()));
        assert!(d.as_shared().is_none());
        assert_eq!(d.view(), CudaStreamView::default());
        assert_eq!(d, CudaStreamView::default());

        let l = BufferStream::from(CudaStreamView::legacy());
        assert_eq!(l, BufferStream::legacy());
        assert_ne!(l, d);
        assert_eq!(l.view(), CudaStreamView::legacy());
        let p = BufferStream::per_thread();
        assert_eq!(p.view(), CudaStreamView::per_thread());
        assert_ne!(p, l);
        assert_eq!(BufferStream::from(&p), p);
        assert_eq!(p.clone(), p);
    }

    #[test]
    fn formatting_names_the_handle() {
        assert_eq!(BufferStream::default().to_string(), "0");
        assert_eq!(BufferStream::legacy().to_string(), "0x1");
        assert_eq!(
            format!("{:?}", BufferStream::per_thread()),
            "BufferStream(static 0x2)"
        );
    }

    #[test]
    fn foreign_static_views_are_kept_verbatim() {
        // SAFETY: the handle is never used with the driver in this test.
        let v: CudaStreamView<'static> = unsafe { CudaStreamView::from_raw(0x1234 as _) };
        let s = BufferStream::from(v);
        assert_eq!(s.view().value() as usize, 0x1234);
        assert_eq!(s, v);
    }

    fn takes_into(s: impl Into<BufferStream>) -> BufferStream {
        s.into()
    }

    #[test]
    fn constructors_accept_views_directly() {
        assert_eq!(
            takes_into(CudaStreamView::default()),
            BufferStream::default()
        );
        assert_eq!(takes_into(BufferStream::legacy()), BufferStream::legacy());
        let b = BufferStream::per_thread();
        assert_eq!(takes_into(&b), b);
    }
}
