//! [`DeviceBuffer`]: untyped, uninitialized, stream-ordered device memory.

use std::fmt;
use std::mem;

use rmm_mr::{MrError, MrResult, SharedResource};
use rmm_stream::CudaStreamView;
use rmm_sys::{DeviceGuard, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::drop_errors::record_drop_error;
use crate::layout::{check_alignment, check_fits};
use crate::raw::{self, StreamOn};
use crate::stream::BufferStream;

// Asynchronous copies to and from pinned host vectors (`rmm_mr::PinnedVec`).
mod pinned;

/// An untyped, **uninitialized**, stream-ordered allocation of device memory (RMM's
/// `device_buffer`).
///
/// A buffer holds `{data, size, capacity, alignment, stream, resource, device}`:
/// - **Resource**: it keeps its resource alive (it holds a [`SharedResource`]) and frees into
///   that resource, even if the device's current resource is replaced meanwhile. Constructors
///   without a resource use [`rmm_mr::current_device_resource`] at construction.
/// - **Stream**: it remembers a [`BufferStream`], which shares ownership of the stream so the
///   stream outlives the buffer (RMM stores a plain view, which can dangle; see
///   [`BufferStream`]). Every size-changing call and [`set_stream`](Self::set_stream) records
///   the stream it was given; the buffer is freed on the last recorded stream, with
///   [`capacity`](Self::capacity) bytes.
/// - **Device**: it records the device current at construction and makes it current around
///   every allocation, copy and free, including in `Drop`, so a buffer can be resized or
///   dropped while another device is current.
/// - **Size 0** never calls the resource; [`data`](Self::data) is then null.
/// - **No implicit `Clone`**: a deep copy needs a stream and a resource,
///   [`try_clone_on`](Self::try_clone_on).
///
/// # Stream ordering: which stream orders what
/// The memory may be used on the buffer's stream at once. A method given another stream `B`
/// (a copy, an element access, [`try_clone_on`](Self::try_clone_on), or a call that records `B`
/// as the buffer's stream) orders that for you, with an event and no host wait:
/// - work it enqueues on `B` that touches the buffer's bytes waits for the work queued so far
///   on the buffer's stream `A`, so `B` never reads bytes `A` is still writing, nor writes
///   bytes `A` still reads;
/// - when the buffer stays on `A` and the work on `B` may still be running on return (an
///   asynchronous write, the read of a deep copy), `A` waits for it, so the buffer's later work
///   on `A`, its free included, cannot reuse bytes `B` still uses. Calls that wait on the host
///   ([`copy_to_host`](Self::copy_to_host), [`copy_from_host`](Self::copy_from_host), ...)
///   need no such wait;
/// - [`set_stream`](Self::set_stream), [`resize`](Self::resize), [`reserve`](Self::reserve) and
///   [`shrink_to_fit`](Self::shrink_to_fit) make `B` wait for `A` before recording it, so a
///   reallocation (which copies and frees on `B`), later work and the final free on `B` come
///   after `A`'s work.
///
/// On the buffer's own stream (the same handle, or the default stream and the stream it means
/// in the process's mode) nothing extra happens, and an empty range touches no stream. If an
/// event cannot be made, the host synchronizes the stream that was to be waited for instead.
///
/// RMM leaves all of this to the caller (its `device_buffer` copies, resizes and frees on
/// whatever stream it is given). rmm-rs does it because these methods are safe: without it, a
/// safe call could read bytes another stream is still writing, or let the buffer's free hand
/// its bytes to a new allocation while another stream still uses them. Work the caller
/// enqueues itself on raw [`data`](Self::data) pointers (kernels) is still the caller's to
/// order, as in RMM, and so is work across threads on the per-thread default stream (its
/// handle names the calling thread's stream, so it counts as one stream here).
///
/// Calls that take `&mut self` and a `CudaStreamView` cannot borrow the view from the buffer
/// itself; to use the buffer's own stream there, clone its handle first:
/// `let s = buf.buffer_stream().clone(); buf.copy_from_host(&bytes, s.view())?;`.
///
/// # Errors
/// Argument errors (alignment not a power of two) are reported before any CUDA call.
/// A free that fails in `Drop` (or of the allocation a resize replaced) is logged and kept
/// for [`take_drop_errors`](crate::take_drop_errors).
#[doc(alias = "rmm::device_buffer")]
pub struct DeviceBuffer {
    /// The address as a plain `u64` (`CUdeviceptr`), so kernel-argument interop can hand out a
    /// reference to it.
    addr: u64,
    size: usize,
    capacity: usize,
    alignment: usize,
    stream: BufferStream,
    mr: SharedResource,
    device: DeviceId,
}

/// The current device and the resource to use there (the given one, else its current one).
fn resolve(mr: Option<SharedResource>) -> MrResult<(DeviceId, SharedResource)> {
    let device = rmm_sys::current_device()?;
    let mr = mr.unwrap_or_else(|| rmm_mr::per_device_resource(device));
    Ok((device, mr))
}

impl DeviceBuffer {
    /// `size` uninitialized bytes on `stream` from the current device's resource, 256-byte
    /// aligned.
    ///
    /// ```no_run
    /// use rmm_containers::DeviceBuffer;
    /// use rmm_stream::CudaStreamView;
    /// let buf = DeviceBuffer::new(1024, CudaStreamView::default())?;
    /// assert_eq!(buf.size(), 1024);
    /// # Ok::<(), rmm_mr::MrError>(())
    /// ```
    pub fn new(size: usize, stream: impl Into<BufferStream>) -> MrResult<Self> {
        Self::with_alignment(size, ALLOCATION_ALIGNMENT, stream, None)
    }

    /// `size` uninitialized bytes on `stream` from `mr`, 256-byte aligned.
    pub fn new_in(
        size: usize,
        stream: impl Into<BufferStream>,
        mr: SharedResource,
    ) -> MrResult<Self> {
        Self::with_alignment(size, ALLOCATION_ALIGNMENT, stream, Some(mr))
    }

    /// `size` uninitialized bytes aligned to `alignment`, from `mr` (or the current device's
    /// resource when `None`).
    ///
    /// # Errors
    /// `alignment` not a power of two: [`MrError::InvalidArgument`], before any CUDA call.
    /// An alignment the resource cannot honour (more than 256 bytes for a base resource) is the
    /// resource's error ([`MrError::BadAlloc`]), except for `size == 0`, which never calls the
    /// resource.
    pub fn with_alignment(
        size: usize,
        alignment: usize,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        check_alignment(alignment)?;
        let stream = stream.into();
        let (device, mr) = resolve(mr)?;
        Self::allocate_on(device, size, alignment, stream, mr)
    }

    /// A buffer holding a copy of `src`, 256-byte aligned. Waits for the copy, so `src` may be
    /// reused at once.
    pub fn from_host(
        src: &[u8],
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        Self::from_host_aligned(src, ALLOCATION_ALIGNMENT, stream, mr)
    }

    /// [`from_host`](Self::from_host) with an explicit alignment.
    pub fn from_host_aligned(
        src: &[u8],
        alignment: usize,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        let buf = Self::with_alignment(src.len(), alignment, stream, mr)?;
        // On error `buf` drops and frees its allocation.
        buf.with_device(|b| {
            // SAFETY: `b.data()` holds `src.len()` bytes, writable on the buffer's stream.
            unsafe { raw::copy_from_host_sync(b.data(), src, b.stream.view()) }
        })?;
        Ok(buf)
    }

    /// A buffer holding a copy of `size` bytes at `src` (device, managed or host memory; the
    /// direction is inferred), 256-byte aligned. The copy is ordered on `stream`; the call does
    /// not wait for it (RMM's `device_buffer(src, size, stream, mr)`).
    ///
    /// # Errors
    /// A null `src` with `size > 0` is [`MrError::InvalidArgument`], reported before anything
    /// is allocated.
    ///
    /// # Safety
    /// `src` is readable for `size` bytes on `stream` until the stream reaches the copy.
    pub unsafe fn from_device(
        src: DevicePtr,
        size: usize,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        // SAFETY: forwarded contract.
        unsafe { Self::from_device_aligned(src, size, ALLOCATION_ALIGNMENT, stream, mr) }
    }

    /// [`from_device`](Self::from_device) with an explicit alignment.
    ///
    /// # Safety
    /// As [`from_device`](Self::from_device).
    pub unsafe fn from_device_aligned(
        src: DevicePtr,
        size: usize,
        alignment: usize,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        check_alignment(alignment)?;
        if src.is_null() && size > 0 {
            return Err(MrError::invalid_argument(
                "Invalid copy from nullptr: a null source with a non-zero size.",
            ));
        }
        let buf = Self::with_alignment(size, alignment, stream, mr)?;
        buf.with_device(|b| {
            // SAFETY: `b.data()` holds `size` fresh bytes; `src` is the caller's contract.
            unsafe { raw::copy_async(b.data(), src, size, b.stream.view()) }
        })?;
        Ok(buf)
    }

    /// A deep copy on `stream`, from `mr` (or the current device's resource when `None`; RMM's
    /// copy constructor `device_buffer(other, stream, mr)`): capacity equals this buffer's
    /// [`size`](Self::size), the alignment is kept, the resource is the given one (not this
    /// buffer's), and the new buffer belongs to the current device. The copy is ordered on
    /// `stream` and not waited for.
    ///
    /// On another stream than this buffer's, the copy first waits for the work queued on this
    /// buffer's stream, and this buffer's stream then waits for the copy, so this buffer's
    /// later work and its free come after the copy has read it (see "Stream ordering").
    pub fn try_clone_on(
        &self,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        let copy = Self::with_alignment(self.size, self.alignment, stream, mr)?;
        if self.size == 0 {
            return Ok(copy);
        }
        // On error `copy` drops and frees its allocation on its own stream, after anything
        // enqueued there.
        raw::order_after(copy.own_stream(), self.own_stream())?;
        copy.with_device(|c| {
            // SAFETY: `c.data()` holds `self.size` fresh bytes; `self.data` holds at least
            // `self.size` bytes and is borrowed for the call; its pending work on its own
            // stream is ordered before the copy (above), its later work and free after it
            // (below).
            unsafe { raw::copy_async(c.data(), self.data(), self.size, c.stream.view()) }
        })?;
        raw::order_after(self.own_stream(), copy.own_stream())?;
        Ok(copy)
    }

    /// Allocates with `device` current. Crate-internal so unit tests can use a device id of -1
    /// (no device switch) with a host-side test resource.
    pub(crate) fn allocate_on(
        device: DeviceId,
        size: usize,
        alignment: usize,
        stream: BufferStream,
        mr: SharedResource,
    ) -> MrResult<Self> {
        let data = {
            let _guard = DeviceGuard::new(device)?;
            raw::allocate(&*mr, stream.view(), size, alignment)?
        };
        Ok(Self {
            addr: data.addr(),
            size,
            capacity: size,
            alignment,
            stream,
            mr,
            device,
        })
    }

    /// Runs `f` with this buffer's device current.
    fn with_device<R>(&self, f: impl FnOnce(&Self) -> MrResult<R>) -> MrResult<R> {
        let _guard = DeviceGuard::new(self.device)?;
        f(self)
    }

    /// The buffer's stream, on the buffer's device.
    fn own_stream(&self) -> StreamOn<'_> {
        StreamOn::new(self.device, self.stream.view())
    }

    /// Makes work about to be enqueued on `stream` (on this buffer's device) wait for the work
    /// queued so far on the buffer's stream. Nothing happens on the buffer's own stream.
    fn order_use_on(&self, stream: CudaStreamView<'_>) -> MrResult<()> {
        raw::order_after(StreamOn::new(self.device, stream), self.own_stream())
    }

    /// Makes the work enqueued from now on on the buffer's stream (its free included) wait for
    /// the work queued so far on `stream`. Nothing happens on the buffer's own stream.
    fn order_own_after(&self, stream: CudaStreamView<'_>) -> MrResult<()> {
        raw::order_after(self.own_stream(), StreamOn::new(self.device, stream))
    }

    /// The address of the first byte (null when the capacity is 0).
    #[must_use]
    pub fn data(&self) -> DevicePtr {
        DevicePtr::from_raw(self.addr)
    }

    /// The number of bytes in use.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of bytes in use (same as [`size`](Self::size)).
    #[must_use]
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether [`size`](Self::size) is 0 (the buffer may still hold capacity).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The number of bytes allocated.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The alignment the memory was requested with.
    #[must_use]
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// A view of the stream the buffer will be freed on.
    #[must_use]
    pub fn stream(&self) -> CudaStreamView<'_> {
        self.stream.view()
    }

    /// The owning handle of the buffer's stream (clone it to pass the stream on).
    #[must_use]
    pub fn buffer_stream(&self) -> &BufferStream {
        &self.stream
    }

    /// Records `stream` as the stream later frees (and reallocations) use.
    ///
    /// The new stream first waits (an event, no host wait) for the work queued so far on the
    /// old one, so the buffer's later work and its free on the new stream come after it. Work
    /// the caller enqueues on the old stream afterwards is the caller's to order. (RMM's
    /// `set_stream` only stores the stream and leaves this to the caller.)
    ///
    /// # Errors
    /// A failed event and fallback synchronization (see "Stream ordering"); the stream is then
    /// unchanged.
    pub fn set_stream(&mut self, stream: impl Into<BufferStream>) -> MrResult<()> {
        let stream = stream.into();
        if self.capacity > 0 {
            self.order_use_on(stream.view())?;
        }
        self.stream = stream;
        Ok(())
    }

    /// The resource the memory came from (and will be freed into).
    #[must_use]
    pub fn memory_resource(&self) -> &SharedResource {
        &self.mr
    }

    /// The device that was current when the buffer was created.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Makes the capacity at least `new_capacity` bytes, keeping the contents. Smaller is a
    /// no-op. Records `stream` as [`set_stream`](Self::set_stream) does (ordered after the old
    /// stream's work); a reallocation is ordered on it.
    pub fn reserve(
        &mut self,
        new_capacity: usize,
        stream: impl Into<BufferStream>,
    ) -> MrResult<()> {
        self.set_stream(stream)?;
        if new_capacity > self.capacity {
            self.reallocate(new_capacity)?;
        }
        Ok(())
    }

    /// Sets the size to `new_size` bytes. Within the capacity only the size changes (no
    /// allocation; new bytes are uninitialized). Beyond it, a new allocation of exactly
    /// `new_size` bytes receives the contents and the old one is freed, both on `stream`.
    /// Records `stream` as [`set_stream`](Self::set_stream) does (ordered after the old
    /// stream's work).
    pub fn resize(&mut self, new_size: usize, stream: impl Into<BufferStream>) -> MrResult<()> {
        self.set_stream(stream)?;
        if new_size > self.capacity {
            self.reallocate(new_size)?;
        }
        self.size = new_size;
        Ok(())
    }

    /// Reallocates to exactly [`size`](Self::size) bytes if the capacity differs (a size of 0
    /// frees the memory). Records `stream` as [`set_stream`](Self::set_stream) does.
    pub fn shrink_to_fit(&mut self, stream: impl Into<BufferStream>) -> MrResult<()> {
        self.set_stream(stream)?;
        if self.size != self.capacity {
            self.reallocate(self.size)?;
        }
        Ok(())
    }

    /// Moves the contents into a new allocation of `new_capacity` bytes on the buffer's stream
    /// and frees the old one there. On error the buffer is unchanged.
    fn reallocate(&mut self, new_capacity: usize) -> MrResult<()> {
        let _guard = DeviceGuard::new(self.device)?;
        let stream = self.stream.view();
        let fresh = raw::allocate(&*self.mr, stream, new_capacity, self.alignment)?;
        let keep = self.size.min(new_capacity);
        // SAFETY: `fresh` holds `new_capacity >= keep` bytes; `self.data` holds `size >= keep`
        // bytes; both are ordered on the buffer's stream.
        if let Err(e) = unsafe { raw::copy_async(fresh, self.data(), keep, stream) } {
            // SAFETY: `fresh` was just allocated with these arguments and never used.
            unsafe {
                raw::free_recorded(
                    &*self.mr,
                    stream,
                    fresh,
                    new_capacity,
                    self.alignment,
                    "reallocation cleanup",
                )
            };
            return Err(e);
        }
        let old = DevicePtr::from_raw(mem::replace(&mut self.addr, fresh.addr()));
        let old_capacity = mem::replace(&mut self.capacity, new_capacity);
        self.size = keep;
        // SAFETY: `(old, old_capacity, alignment)` is the allocation this buffer held; its
        // last use (the copy above) is ordered on `stream` before the free.
        unsafe {
            raw::free_recorded(
                &*self.mr,
                stream,
                old,
                old_capacity,
                self.alignment,
                "reallocation",
            )
        };
        Ok(())
    }

    /// Copies `src` to the start of the buffer on `stream` and waits for the copy. On another
    /// stream than the buffer's, the copy comes after the work queued on the buffer's stream.
    ///
    /// # Errors
    /// `src` longer than [`size`](Self::size): [`MrError::OutOfRange`].
    pub fn copy_from_host(&mut self, src: &[u8], stream: CudaStreamView<'_>) -> MrResult<()> {
        check_fits(src.len(), self.size, "a host source")?;
        if src.is_empty() {
            return Ok(());
        }
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the buffer holds at least `src.len()` bytes and is borrowed exclusively;
            // its stream's pending work is ordered before the copy, which is waited for.
            unsafe { raw::copy_from_host_sync(b.data(), src, stream) }
        })
    }

    /// Copies the first `dst.len()` bytes of the buffer into `dst` on `stream` and waits. On
    /// another stream than the buffer's, the copy comes after the work queued on the buffer's
    /// stream.
    ///
    /// # Errors
    /// `dst` longer than [`size`](Self::size): [`MrError::OutOfRange`].
    pub fn copy_to_host(&self, dst: &mut [u8], stream: CudaStreamView<'_>) -> MrResult<()> {
        check_fits(dst.len(), self.size, "a host destination")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the buffer holds at least `dst.len()` bytes; its stream's pending work is
            // ordered before the copy, which is waited for.
            unsafe { raw::copy_to_host_sync(dst, b.data(), stream) }
        })
    }

    /// The contents, copied to the host on `stream` (waits for the copy; ordered as
    /// [`copy_to_host`](Self::copy_to_host)).
    pub fn to_vec(&self, stream: CudaStreamView<'_>) -> MrResult<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }

    /// Zeroes `bytes` bytes at byte `offset` on `stream` without waiting (crate-internal, for
    /// typed containers). On another stream, the memset waits for the buffer's stream, and the
    /// buffer's stream then waits for the memset.
    pub(crate) fn zero_range_async(
        &mut self,
        offset: usize,
        bytes: usize,
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        debug_assert!(offset
            .checked_add(bytes)
            .is_some_and(|end| end <= self.size));
        if bytes == 0 {
            return Ok(());
        }
        let dst = self.offset_ptr(offset);
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: `[offset, offset + bytes)` lies within the buffer (callers check
            // indices); the buffer's stream is ordered around the memset.
            unsafe { raw::zero_async(dst, bytes, stream) }?;
            b.order_own_after(stream)
        })
    }

    /// Writes one value at byte `offset` on `stream` without waiting (crate-internal). Ordered
    /// as [`zero_range_async`](Self::zero_range_async).
    pub(crate) fn write_value_async<T: bytemuck::Pod>(
        &mut self,
        offset: usize,
        value: &T,
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        debug_assert!(offset
            .checked_add(mem::size_of::<T>())
            .is_some_and(|end| end <= self.size));
        let dst = self.offset_ptr(offset);
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the value's bytes lie within the buffer (callers check indices); the
            // buffer's stream is ordered around the copy.
            unsafe { raw::copy_value_async(dst, value, stream) }?;
            b.order_own_after(stream)
        })
    }

    /// Reads `dst.len()` bytes at byte `offset` into `dst` on `stream` and waits
    /// (crate-internal). On another stream, the copy waits for the buffer's stream.
    pub(crate) fn read_at(
        &self,
        offset: usize,
        dst: &mut [u8],
        stream: CudaStreamView<'_>,
    ) -> MrResult<()> {
        debug_assert!(offset
            .checked_add(dst.len())
            .is_some_and(|end| end <= self.size));
        if dst.is_empty() {
            return Ok(());
        }
        let src = self.offset_ptr(offset);
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the range lies within the buffer (callers check indices); the buffer's
            // stream's pending work is ordered before the copy, which is waited for.
            unsafe { raw::copy_to_host_sync(dst, src, stream) }
        })
    }

    /// The address `offset` bytes in (callers keep `offset <= capacity`).
    pub(crate) fn offset_ptr(&self, offset: usize) -> DevicePtr {
        DevicePtr::from_raw(self.addr.wrapping_add(offset as u64))
    }

    /// A reference to the address field, for kernel-argument interop (the driver reads the
    /// address through a pointer to it).
    #[cfg(feature = "cudarc")]
    pub(crate) fn address_field(&self) -> &u64 {
        &self.addr
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.addr == 0 && self.capacity == 0 {
            return;
        }
        let guard = match DeviceGuard::new(self.device) {
            Ok(g) => g,
            Err(e) => {
                record_drop_error(
                    &format!(
                        "dropping a device buffer (making device {} current; {} bytes at {} leaked)",
                        self.device,
                        self.capacity,
                        self.data()
                    ),
                    MrError::Cuda(e),
                );
                return;
            }
        };
        // SAFETY: `(data, capacity, alignment)` is this buffer's allocation from `mr`, freed
        // once here, on the last stream recorded for it.
        unsafe {
            raw::free_recorded(
                &*self.mr,
                self.stream.view(),
                self.data(),
                self.capacity,
                self.alignment,
                "dropping a device buffer",
            )
        };
        drop(guard);
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("data", &self.data())
            .field("size", &self.size)
            .field("capacity", &self.capacity)
            .field("alignment", &self.alignment)
            .field("stream", &self.stream)
            .field("memory_resource", &self.mr)
            .field("device", &self.device)
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Bookkeeping without a GPU: buffers on a recording host-side resource with device id -1
    //! (no device switch), exercising only paths that copy no bytes.

    use super::*;
    use crate::drop_errors::take_drop_errors;
    use crate::raw::orderings;
    use rmm_mr::{DeviceMemoryResource, MrError, SharedResource};
    use std::any::Any;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// One call a [`Recorder`] saw.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Call {
        Alloc {
            bytes: usize,
            alignment: usize,
            stream: usize,
        },
        Free {
            ptr: u64,
            bytes: usize,
            alignment: usize,
            stream: usize,
        },
    }

    #[derive(Debug, Default)]
    struct State {
        next: u64,
        live: HashMap<u64, (usize, usize)>,
        calls: Vec<Call>,
        fail_frees: Option<String>,
    }

    /// Hands out fake (never dereferenced) addresses and checks every free against them.
    #[derive(Debug, Default, Clone)]
    pub(crate) struct Recorder(Arc<Mutex<State>>);

    impl Recorder {
        pub(crate) fn calls(&self) -> Vec<Call> {
            self.0.lock().unwrap().calls.clone()
        }
        pub(crate) fn live(&self) -> usize {
            self.0.lock().unwrap().live.len()
        }
        pub(crate) fn fail_frees_with(&self, msg: &str) {
            self.0.lock().unwrap().fail_frees = Some(msg.to_owned());
        }
        pub(crate) fn shared(&self) -> SharedResource {
            Arc::new(self.clone())
        }
    }

    // SAFETY: a test double handing out fake addresses. That breaks the promise of valid
    // memory, which is sound only because these tests never copy to or from a buffer.
    unsafe impl DeviceMemoryResource for Recorder {
        fn allocate(
            &self,
            stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            let mut s = self.0.lock().unwrap();
            s.calls.push(Call::Alloc {
                bytes,
                alignment,
                stream: stream.value() as usize,
            });
            if alignment > 256 {
                return Err(MrError::bad_alloc("alignment too large"));
            }
            s.next += 1;
            let addr = s.next << 12;
            s.live.insert(addr, (bytes, alignment));
            Ok(DevicePtr::from_raw(addr))
        }

        unsafe fn deallocate(
            &self,
            stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            let mut s = self.0.lock().unwrap();
            s.calls.push(Call::Free {
                ptr: ptr.addr(),
                bytes,
                alignment,
                stream: stream.value() as usize,
            });
            if let Some(msg) = &s.fail_frees {
                return Err(MrError::invalid_argument(msg.clone()));
            }
            match s.live.remove(&ptr.addr()) {
                Some(got) if got == (bytes, alignment) => Ok(()),
                other => Err(MrError::invalid_argument(format!(
                    "bad free of {ptr} ({bytes}, {alignment}): {other:?}"
                ))),
            }
        }

        fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
            rmm_mr::resource_cast::<Self>(other).is_some_and(|o| Arc::ptr_eq(&o.0, &self.0))
        }

        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    pub(crate) const NO_DEVICE: DeviceId = DeviceId(-1);

    fn buffer(rec: &Recorder, size: usize, alignment: usize) -> DeviceBuffer {
        DeviceBuffer::allocate_on(
            NO_DEVICE,
            size,
            alignment,
            BufferStream::default(),
            rec.shared(),
        )
        .unwrap()
    }

    fn allocs(rec: &Recorder) -> usize {
        rec.calls()
            .iter()
            .filter(|c| matches!(c, Call::Alloc { .. }))
            .count()
    }

    #[test]
    fn invalid_alignment_is_reported_before_any_cuda_call() {
        for a in [0, 3, 100] {
            assert!(matches!(
                DeviceBuffer::with_alignment(16, a, CudaStreamView::default(), None),
                Err(MrError::InvalidArgument(_))
            ));
            // SAFETY: rejected before any copy.
            let r = unsafe {
                DeviceBuffer::from_device_aligned(
                    DevicePtr::NULL,
                    0,
                    a,
                    BufferStream::legacy(),
                    None,
                )
            };
            assert!(matches!(r, Err(MrError::InvalidArgument(_))));
        }
    }

    #[test]
    fn null_source_with_size_is_rejected_before_allocating() {
        let rec = Recorder::default();
        // SAFETY: rejected before any copy.
        let r = unsafe {
            DeviceBuffer::from_device(
                DevicePtr::NULL,
                10,
                CudaStreamView::default(),
                Some(rec.shared()),
            )
        };
        assert!(matches!(r, Err(MrError::InvalidArgument(_))));
        assert!(rec.calls().is_empty());
    }

    #[test]
    fn allocation_and_drop_use_size_alignment_and_capacity() {
        let rec = Recorder::default();
        let b = buffer(&rec, 1000, 64);
        assert_eq!((b.size(), b.capacity(), b.alignment()), (1000, 1000, 64));
        assert!(!b.data().is_null());
        assert!(b.memory_resource().is_equal(&rec));
        assert_eq!(
            rec.calls(),
            vec![Call::Alloc {
                bytes: 1000,
                alignment: 64,
                stream: 0
            }]
        );
        drop(b);
        assert_eq!(rec.live(), 0);
        assert_eq!(rec.calls().len(), 2);
    }

    #[test]
    fn size_zero_never_calls_the_resource() {
        let rec = Recorder::default();
        let b = buffer(&rec, 0, 512);
        assert!(b.data().is_null());
        assert!(b.is_empty());
        drop(b);
        assert!(rec.calls().is_empty());
    }

    #[test]
    fn too_large_alignment_is_the_resources_error() {
        let rec = Recorder::default();
        let r = DeviceBuffer::allocate_on(NO_DEVICE, 8, 512, BufferStream::default(), rec.shared());
        assert!(matches!(r, Err(MrError::BadAlloc { .. })));
    }

    #[test]
    fn resize_within_capacity_only_changes_size_and_records_the_stream() {
        let rec = Recorder::default();
        let mut b = buffer(&rec, 1000, 256);
        b.resize(10, BufferStream::legacy()).unwrap();
        assert_eq!((b.size(), b.capacity()), (10, 1000));
        assert_eq!(b.stream(), CudaStreamView::legacy());
        b.resize(0, BufferStream::per_thread()).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 1000);
        assert_eq!(allocs(&rec), 1);
        drop(b);
        // Freed with the capacity, on the last recorded stream.
        assert_eq!(
            rec.calls().last(),
            Some(&Call::Free {
                ptr: 1 << 12,
                bytes: 1000,
                alignment: 256,
                stream: 2
            })
        );
        assert_eq!(rec.live(), 0);
    }

    #[test]
    fn reserve_and_shrink_reallocate_only_when_needed() {
        let rec = Recorder::default();
        let mut b = buffer(&rec, 0, 128);
        b.reserve(0, BufferStream::default()).unwrap();
        assert_eq!(allocs(&rec), 0);
        b.reserve(4096, BufferStream::legacy()).unwrap();
        assert_eq!((b.size(), b.capacity()), (0, 4096));
        assert_eq!(allocs(&rec), 1);
        b.reserve(100, BufferStream::legacy()).unwrap();
        assert_eq!(b.capacity(), 4096);
        assert_eq!(allocs(&rec), 1);
        // Shrinking an empty buffer frees everything.
        b.shrink_to_fit(BufferStream::legacy()).unwrap();
        assert_eq!((b.size(), b.capacity()), (0, 0));
        assert!(b.data().is_null());
        assert_eq!(rec.live(), 0);
        assert_eq!(
            rec.calls().last(),
            Some(&Call::Free {
                ptr: 1 << 12,
                bytes: 4096,
                alignment: 128,
                stream: 1
            })
        );
        // A second shrink is a no-op.
        let n = rec.calls().len();
        b.shrink_to_fit(BufferStream::legacy()).unwrap();
        assert_eq!(rec.calls().len(), n);
        // Growing an empty buffer allocates exactly the new size (nothing to copy).
        b.resize(300, BufferStream::default()).unwrap();
        assert_eq!((b.size(), b.capacity()), (300, 300));
        drop(b);
        assert_eq!(rec.live(), 0);
    }

    #[test]
    fn a_failed_reallocation_leaves_the_buffer_unchanged() {
        let rec = Recorder::default();
        let mut b =
            DeviceBuffer::allocate_on(NO_DEVICE, 0, 512, BufferStream::default(), rec.shared())
                .unwrap();
        assert!(matches!(
            b.reserve(10, BufferStream::legacy()),
            Err(MrError::BadAlloc { .. })
        ));
        assert_eq!((b.size(), b.capacity()), (0, 0));
        assert!(b.data().is_null());
    }

    #[test]
    fn host_copies_check_lengths_first() {
        let rec = Recorder::default();
        let mut b = buffer(&rec, 4, 256);
        let s = CudaStreamView::default();
        assert!(matches!(
            b.copy_from_host(&[0; 5], s),
            Err(MrError::OutOfRange(_))
        ));
        assert!(matches!(
            b.copy_to_host(&mut [0; 5], s),
            Err(MrError::OutOfRange(_))
        ));
        // Empty copies need no device at all.
        b.copy_from_host(&[], s).unwrap();
        b.copy_to_host(&mut [], s).unwrap();
    }

    #[test]
    fn failed_frees_in_drop_are_recorded() {
        let rec = Recorder::default();
        let b = buffer(&rec, 64, 256);
        rec.fail_frees_with("recorder refuses this free (unit test)");
        drop(b);
        let errors = take_drop_errors();
        assert!(
            errors
                .iter()
                .any(|e| e.to_string().contains("recorder refuses this free")),
            "{errors:?}"
        );
    }

    /// A foreign stream handle: the unit tests' orderings are recorded, never given to the
    /// driver (see `raw::orderings`).
    fn foreign(handle: usize) -> BufferStream {
        // SAFETY: the handle is never used with the driver in these tests.
        BufferStream::from(unsafe { CudaStreamView::from_raw(handle as _) })
    }

    #[test]
    fn recording_another_stream_orders_it_after_the_old_one() {
        let _ = orderings::take();
        let rec = Recorder::default();
        let mut b = buffer(&rec, 1000, 256);
        // The buffer's own stream: no ordering at all.
        b.set_stream(BufferStream::default()).unwrap();
        b.resize(500, BufferStream::default()).unwrap();
        b.reserve(10, BufferStream::default()).unwrap();
        assert_eq!(orderings::take(), vec![]);
        // Another stream waits for the old one before it is recorded.
        b.set_stream(foreign(0x1000)).unwrap();
        assert_eq!(orderings::take(), vec![(0x1000, 0)]);
        assert_eq!(b.stream(), foreign(0x1000).view());
        b.set_stream(foreign(0x1000)).unwrap();
        assert_eq!(orderings::take(), vec![]);
        b.resize(0, foreign(0x2000)).unwrap();
        assert_eq!(orderings::take(), vec![(0x2000, 0x1000)]);
        // A reallocation (of nothing to copy) on a third stream: ordered first, then all of it
        // (allocation, copy, free of the old block) on that stream.
        b.reserve(4096, foreign(0x3000)).unwrap();
        assert_eq!(orderings::take(), vec![(0x3000, 0x2000)]);
        assert_eq!(
            rec.calls()[1..],
            [
                Call::Alloc {
                    bytes: 4096,
                    alignment: 256,
                    stream: 0x3000
                },
                Call::Free {
                    ptr: 1 << 12,
                    bytes: 1000,
                    alignment: 256,
                    stream: 0x3000
                }
            ]
        );
        b.shrink_to_fit(foreign(0x4000)).unwrap();
        assert_eq!(orderings::take(), vec![(0x4000, 0x3000)]);
        assert_eq!(b.capacity(), 0);
        // Without memory there is nothing to order.
        b.set_stream(foreign(0x5000)).unwrap();
        b.resize(0, BufferStream::legacy()).unwrap();
        assert_eq!(orderings::take(), vec![]);
        drop(b);
        assert_eq!(rec.live(), 0);
    }

    #[test]
    fn empty_ranges_order_nothing() {
        let _ = orderings::take();
        let rec = Recorder::default();
        let mut b = buffer(&rec, 64, 256);
        let other = foreign(0x1000);
        b.copy_from_host(&[], other.view()).unwrap();
        b.copy_to_host(&mut [], other.view()).unwrap();
        b.zero_range_async(0, 0, other.view()).unwrap();
        b.read_at(8, &mut [], other.view()).unwrap();
        assert_eq!(orderings::take(), vec![]);
    }

    #[test]
    fn debug_names_the_fields() {
        let rec = Recorder::default();
        let b = buffer(&rec, 8, 256);
        let s = format!("{b:?}");
        assert!(s.contains("size: 8") && s.contains("capacity: 8"), "{s}");
    }
}
