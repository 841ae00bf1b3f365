//! [`DeviceUvector`]: a typed, uninitialized, stream-ordered vector in device memory.

use std::fmt;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};

use bytemuck::Pod;
use rmm_mr::{MrResult, SharedResource};
use rmm_stream::CudaStreamView;
use rmm_sys::{DeviceId, DevicePtr};

use crate::buffer::DeviceBuffer;
use crate::layout::{bytes_for, check_index, OUT_OF_BOUNDS};
use crate::stream::BufferStream;

/// A typed, **uninitialized** vector of `T` in device memory (RMM's `device_uvector`), backed by
/// a [`DeviceBuffer`] aligned to `align_of::<T>()`.
///
/// `T` is [`Pod`] (RMM requires trivially copyable): any bytes are a valid `T`, so reading
/// uninitialized elements is allowed, and elements are copied bytewise (`-0.0` stays `-0.0`).
/// Zero-sized `T` are rejected at compile time.
///
/// Everything [`DeviceBuffer`] says about resources, streams, devices and `Drop` holds here,
/// including its [stream ordering](DeviceBuffer#stream-ordering-which-stream-orders-what): a
/// method given another stream than the vector's (element access, copies, `try_clone_on`,
/// `resize`, `reserve`, `set_stream`, ...) orders its work after the work queued on the
/// vector's stream, and the vector's stream after any of that work still running on return.
///
/// # Errors
/// - `len * size_of::<T>()` overflowing `usize`: [`MrError::InvalidArgument`] (in `new`,
///   `reserve` and `resize`), before any CUDA call.
/// - An index past the end: [`MrError::OutOfRange`] with RMM's message
///   `"Attempt to access out of bounds element."`, before any CUDA call.
/// - `align_of::<T>() > 256` with a base resource: the resource's [`MrError::BadAlloc`].
///
/// [`MrError::InvalidArgument`]: rmm_mr::MrError::InvalidArgument
/// [`MrError::OutOfRange`]: rmm_mr::MrError::OutOfRange
/// [`MrError::BadAlloc`]: rmm_mr::MrError::BadAlloc
#[doc(alias = "rmm::device_uvector")]
pub struct DeviceUvector<T: Pod> {
    buffer: DeviceBuffer,
    _elements: PhantomData<T>,
    /// cudarc's view of the vector's stream, made on first use by cudarc's traits.
    #[cfg(feature = "cudarc")]
    pub(crate) cudarc_stream: std::sync::OnceLock<std::sync::Arc<cudarc::driver::CudaStream>>,
}

impl<T: Pod> DeviceUvector<T> {
    const NOT_ZERO_SIZED: () = assert!(
        size_of::<T>() != 0,
        "DeviceUvector does not support zero-sized element types"
    );

    /// Wraps a buffer whose size is a multiple of `size_of::<T>()`.
    pub(crate) fn from_buffer_unchecked(buffer: DeviceBuffer) -> Self {
        let () = Self::NOT_ZERO_SIZED;
        debug_assert_eq!(buffer.size() % size_of::<T>(), 0);
        Self {
            buffer,
            _elements: PhantomData,
            #[cfg(feature = "cudarc")]
            cudarc_stream: std::sync::OnceLock::new(),
        }
    }

    /// `len` uninitialized elements on `stream`, from the current device's resource.
    pub fn new(len: usize, stream: impl Into<BufferStream>) -> MrResult<Self> {
        Self::with_resource(len, stream, None)
    }

    /// `len` uninitialized elements on `stream`, from `mr`.
    pub fn new_in(
        len: usize,
        stream: impl Into<BufferStream>,
        mr: SharedResource,
    ) -> MrResult<Self> {
        Self::with_resource(len, stream, Some(mr))
    }

    /// `len` uninitialized elements on `stream`, from `mr` (the current device's resource when
    /// `None`).
    pub fn with_resource(
        len: usize,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        let () = Self::NOT_ZERO_SIZED;
        let bytes = bytes_for::<T>(len)?;
        let buffer = DeviceBuffer::with_alignment(bytes, align_of::<T>(), stream, mr)?;
        Ok(Self::from_buffer_unchecked(buffer))
    }

    /// A vector holding a copy of `src`. Waits for the copy, so `src` may be reused at once.
    pub fn from_slice(
        src: &[T],
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        let () = Self::NOT_ZERO_SIZED;
        let buffer = DeviceBuffer::from_host_aligned(
            bytemuck::cast_slice(src),
            align_of::<T>(),
            stream,
            mr,
        )?;
        Ok(Self::from_buffer_unchecked(buffer))
    }

    /// A deep copy on `stream` from `mr` (the current device's resource when `None`); see
    /// [`DeviceBuffer::try_clone_on`].
    pub fn try_clone_on(
        &self,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        Ok(Self::from_buffer_unchecked(
            self.buffer.try_clone_on(stream, mr)?,
        ))
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buffer.size() / size_of::<T>()
    }

    /// The number of elements (RMM's name).
    #[must_use]
    pub fn size(&self) -> usize {
        self.len()
    }

    /// Whether the vector has no elements (it may still hold capacity).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// The number of elements the allocation can hold.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.buffer.capacity() / size_of::<T>()
    }

    /// The address of the first element (null when the capacity is 0).
    #[must_use]
    pub fn data(&self) -> DevicePtr {
        self.buffer.data()
    }

    /// The address of element `index`.
    pub fn element_ptr(&self, index: usize) -> MrResult<DevicePtr> {
        check_index(index, self.len())?;
        Ok(self.buffer.offset_ptr(index * size_of::<T>()))
    }

    /// The address of the first element (RMM's `begin()`).
    #[must_use]
    pub fn begin_ptr(&self) -> DevicePtr {
        self.data()
    }

    /// The address one past the last element (RMM's `end()`).
    #[must_use]
    pub fn end_ptr(&self) -> DevicePtr {
        self.buffer.offset_ptr(self.buffer.size())
    }

    /// The element addresses in order; `.rev()` gives RMM's reverse iterators.
    pub fn element_ptrs(
        &self,
    ) -> impl DoubleEndedIterator<Item = DevicePtr> + ExactSizeIterator + '_ {
        (0..self.len()).map(move |i| self.buffer.offset_ptr(i * size_of::<T>()))
    }

    /// Writes `value` to element `index` on `stream` without waiting for the device. The value
    /// is staged by the driver before the call returns, so `value` may be changed at once. On
    /// another stream than the vector's, the write waits for the vector's stream, and the
    /// vector's stream then waits for the write.
    pub fn set_element_async(
        &mut self,
        index: usize,
        value: &T,
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        check_index(index, self.len())?;
        self.buffer
            .write_value_async(index * size_of::<T>(), value, stream)
    }

    /// Writes `value` to element `index` on `stream` and waits for the stream.
    pub fn set_element(
        &mut self,
        index: usize,
        value: T,
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        self.set_element_async(index, &value, stream)?;
        stream.synchronize()?;
        Ok(())
    }

    /// Zeroes the bytes of element `index` on `stream` (a memset) without waiting.
    pub fn set_element_to_zero_async(
        &mut self,
        index: usize,
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        check_index(index, self.len())?;
        self.buffer
            .zero_range_async(index * size_of::<T>(), size_of::<T>(), stream)
    }

    /// Element `index`, copied to the host on `stream` (waits for the copy).
    pub fn element(&self, index: usize, stream: CudaStreamView<'_>) -> MrResult<T> {
        check_index(index, self.len())?;
        let mut value = T::zeroed();
        self.buffer.read_at(
            index * size_of::<T>(),
            bytemuck::bytes_of_mut(&mut value),
            stream,
        )?;
        Ok(value)
    }

    /// The first element (out of range when empty).
    pub fn front_element(&self, stream: CudaStreamView<'_>) -> MrResult<T> {
        self.element(0, stream)
    }

    /// The last element (out of range when empty).
    pub fn back_element(&self, stream: CudaStreamView<'_>) -> MrResult<T> {
        match self.len().checked_sub(1) {
            Some(last) => self.element(last, stream),
            None => Err(rmm_mr::MrError::OutOfRange(OUT_OF_BOUNDS.to_owned())),
        }
    }

    /// Makes room for at least `new_capacity` elements, keeping the contents. Records
    /// `stream` as [`set_stream`](Self::set_stream) does.
    pub fn reserve(
        &mut self,
        new_capacity: usize,
        stream: impl Into<BufferStream>,
    ) -> MrResult<()> {
        let bytes = bytes_for::<T>(new_capacity)?;
        self.stream_changed();
        self.buffer.reserve(bytes, stream)
    }

    /// Sets the length to `new_len`, keeping the first `min(len, new_len)` elements; new
    /// elements are uninitialized. Within the capacity nothing is allocated (resizing to 0
    /// keeps the capacity until [`shrink_to_fit`](Self::shrink_to_fit)). Records `stream` as
    /// [`set_stream`](Self::set_stream) does.
    pub fn resize(&mut self, new_len: usize, stream: impl Into<BufferStream>) -> MrResult<()> {
        let bytes = bytes_for::<T>(new_len)?;
        self.stream_changed();
        self.buffer.resize(bytes, stream)
    }

    /// Reallocates to exactly the length if the capacity differs. Records `stream` as
    /// [`set_stream`](Self::set_stream) does.
    pub fn shrink_to_fit(&mut self, stream: impl Into<BufferStream>) -> MrResult<()> {
        self.stream_changed();
        self.buffer.shrink_to_fit(stream)
    }

    /// Gives up the elements' type and returns the buffer (RMM's `release()`).
    #[must_use]
    pub fn release(self) -> DeviceBuffer {
        self.buffer
    }

    /// The underlying buffer.
    #[must_use]
    pub fn as_buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// Copies the elements to a new host vector on `stream` (waits for the copy).
    pub fn to_vec(&self, stream: CudaStreamView<'_>) -> MrResult<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }

    /// Copies the first `dst.len()` elements into `dst` on `stream` and waits.
    pub fn copy_to_host(&self, dst: &mut [T], stream: CudaStreamView<'_>) -> MrResult<()> {
        self.buffer
            .copy_to_host(bytemuck::cast_slice_mut(dst), stream)
    }

    /// Copies `src` to the first `src.len()` elements on `stream` and waits.
    pub fn copy_from_host(&mut self, src: &[T], stream: CudaStreamView<'_>) -> MrResult<()> {
        self.buffer
            .copy_from_host(bytemuck::cast_slice(src), stream)
    }

    /// The underlying buffer, mutably (crate-internal: its size stays a multiple of `T`'s).
    pub(crate) fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.buffer
    }

    /// A view of the stream the vector will be freed on.
    #[must_use]
    pub fn stream(&self) -> CudaStreamView<'_> {
        self.buffer.stream()
    }

    /// The owning handle of the vector's stream.
    #[must_use]
    pub fn buffer_stream(&self) -> &BufferStream {
        self.buffer.buffer_stream()
    }

    /// Records `stream` for later frees and reallocations, after making it wait for the work
    /// queued on the old stream; see [`DeviceBuffer::set_stream`].
    pub fn set_stream(&mut self, stream: impl Into<BufferStream>) -> MrResult<()> {
        self.stream_changed();
        self.buffer.set_stream(stream)
    }

    /// The resource the memory came from.
    #[must_use]
    pub fn memory_resource(&self) -> &SharedResource {
        self.buffer.memory_resource()
    }

    /// The device that was current when the vector was created.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.buffer.device()
    }

    /// Forgets cached views of the old stream.
    fn stream_changed(&mut self) {
        #[cfg(feature = "cudarc")]
        {
            self.cudarc_stream = std::sync::OnceLock::new();
        }
    }
}

impl<T: Pod> From<DeviceUvector<T>> for DeviceBuffer {
    fn from(v: DeviceUvector<T>) -> Self {
        v.release()
    }
}

impl<T: Pod> fmt::Debug for DeviceUvector<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceUvector")
            .field("element", &std::any::type_name::<T>())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("buffer", &self.buffer)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::tests::{Call, Recorder, NO_DEVICE};
    use rmm_mr::MrError;

    fn vector<T: Pod>(rec: &Recorder, len: usize) -> DeviceUvector<T> {
        let buffer = DeviceBuffer::allocate_on(
            NO_DEVICE,
            len * size_of::<T>(),
            align_of::<T>(),
            BufferStream::default(),
            rec.shared(),
        )
        .unwrap();
        DeviceUvector::from_buffer_unchecked(buffer)
    }

    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(512))]
    struct OverAligned([u8; 512]);

    #[test]
    fn overflowing_lengths_are_invalid_arguments_before_cuda() {
        let s = CudaStreamView::default();
        assert!(matches!(
            DeviceUvector::<u64>::new(usize::MAX / 4, s),
            Err(MrError::InvalidArgument(_))
        ));
        assert!(matches!(
            DeviceUvector::<[u8; 3]>::with_resource(usize::MAX / 2, s, None),
            Err(MrError::InvalidArgument(_))
        ));
        let rec = Recorder::default();
        let mut v = vector::<u32>(&rec, 0);
        assert!(matches!(
            v.reserve(usize::MAX / 2, s),
            Err(MrError::InvalidArgument(_))
        ));
        assert!(matches!(
            v.resize(usize::MAX / 3, s),
            Err(MrError::InvalidArgument(_))
        ));
        assert!(rec.calls().is_empty());
    }

    #[test]
    fn out_of_range_indices_use_rmms_message() {
        let rec = Recorder::default();
        let mut v = vector::<f64>(&rec, 0);
        let s = CudaStreamView::default();
        let oob = MrError::OutOfRange("Attempt to access out of bounds element.".to_owned());
        assert_eq!(v.element(0, s).unwrap_err(), oob);
        assert_eq!(v.front_element(s).unwrap_err(), oob);
        assert_eq!(v.back_element(s).unwrap_err(), oob);
        assert_eq!(v.element_ptr(0).unwrap_err(), oob);
        assert_eq!(v.set_element_async(0, &1.0, s).unwrap_err(), oob);
        assert_eq!(v.set_element(0, 1.0, s).unwrap_err(), oob);
        assert_eq!(v.set_element_to_zero_async(0, s).unwrap_err(), oob);
        let w = vector::<f64>(&rec, 3);
        assert_eq!(w.element(3, s).unwrap_err(), oob);
    }

    #[test]
    fn pointers_step_by_element_size() {
        let rec = Recorder::default();
        let v = vector::<u64>(&rec, 5);
        assert_eq!(v.len(), 5);
        assert_eq!(v.size(), 5);
        assert_eq!(v.capacity(), 5);
        let base = v.data().addr();
        assert_eq!(v.begin_ptr(), v.data());
        assert_eq!(v.end_ptr().addr(), base + 40);
        let ptrs: Vec<u64> = v.element_ptrs().map(|p| p.addr()).collect();
        assert_eq!(ptrs, (0..5).map(|i| base + 8 * i).collect::<Vec<_>>());
        let rev: Vec<u64> = v.element_ptrs().rev().map(|p| p.addr()).collect();
        assert_eq!(rev, ptrs.iter().rev().copied().collect::<Vec<_>>());
        for i in 0..5 {
            assert_eq!(v.element_ptr(i).unwrap().addr(), base + 8 * i as u64);
        }
    }

    #[test]
    fn resize_to_zero_keeps_capacity_until_shrink() {
        let rec = Recorder::default();
        let mut v = vector::<u16>(&rec, 10);
        v.resize(0, BufferStream::legacy()).unwrap();
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 10);
        v.shrink_to_fit(BufferStream::legacy()).unwrap();
        assert_eq!(v.capacity(), 0);
        assert!(v.data().is_null());
        assert_eq!(rec.live(), 0);
    }

    #[test]
    fn allocations_use_the_element_alignment() {
        let rec = Recorder::default();
        let v = vector::<u32>(&rec, 4);
        assert_eq!(v.as_buffer().alignment(), 4);
        assert_eq!(
            rec.calls()[0],
            Call::Alloc {
                bytes: 16,
                alignment: 4,
                stream: 0
            }
        );
        let buf = v.release();
        assert_eq!(buf.size(), 16);
        drop(buf);
        assert_eq!(rec.live(), 0);
    }

    #[test]
    fn over_aligned_elements_are_the_resources_bad_alloc() {
        let rec = Recorder::default();
        let r = DeviceBuffer::allocate_on(
            NO_DEVICE,
            size_of::<OverAligned>(),
            align_of::<OverAligned>(),
            BufferStream::default(),
            rec.shared(),
        );
        assert!(matches!(r, Err(MrError::BadAlloc { .. })));
        // An empty vector of them is fine (no allocation).
        let v = vector::<OverAligned>(&rec, 0);
        assert_eq!(v.as_buffer().alignment(), 512);
    }
}
