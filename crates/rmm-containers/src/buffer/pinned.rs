//! Asynchronous copies between device containers and pinned host vectors
//! ([`PinnedVec`], from a [`PinnedHostPool`](rmm_mr::PinnedHostPool)).
//!
//! A copy takes the vector by value and returns it inside a [`PinnedTransfer`], which gives it
//! back only once the copy has completed: safe code cannot read or write the host memory while
//! the device does. The vector's block also carries an event recorded after the copy, so a
//! transfer dropped unfinished frees the vector into its pool, which reuses the block only once
//! the copy has completed.

use bytemuck::Pod;
use rmm_mr::{MrResult, PinnedHostPool, PinnedTransfer, PinnedVec};
use rmm_stream::CudaStreamView;

use super::DeviceBuffer;
use crate::layout::check_fits;
use crate::raw;
use crate::uvector::DeviceUvector;

/// Records the copy just enqueued on `stream` on the vector's block. If that fails, the copy is
/// already in flight with nothing to keep the block from reuse, so the host waits for the
/// stream before the error is returned (and the vector dropped).
fn record_copy<T>(vec: &PinnedVec<T>, stream: CudaStreamView<'_>) -> MrResult<()> {
    if let Err(e) = vec.allocator().record_stream(vec.as_ptr().cast(), stream) {
        let _ = stream.synchronize();
        return Err(e);
    }
    Ok(())
}

impl DeviceBuffer {
    /// Copies the bytes of `src` to the start of the buffer on `stream` without waiting; the
    /// vector comes back from the transfer once the copy has completed. On another stream than
    /// the buffer's, the copy waits for the buffer's stream, and the buffer's stream then waits
    /// for the copy.
    ///
    /// # Errors
    /// `src` longer than [`size`](Self::size): [`MrError::OutOfRange`](rmm_mr::MrError::OutOfRange)
    /// (the vector is dropped).
    #[doc(alias = "cudaMemcpyAsync")]
    pub fn copy_from_pinned_async(
        &mut self,
        src: PinnedVec<u8>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<u8>> {
        self.copy_from_pinned_bytes(src, stream)
    }

    /// Copies the first `dst.len()` bytes of the buffer into `dst` on `stream` without waiting;
    /// the vector comes back from the transfer once the copy has completed. On another stream
    /// than the buffer's, the copy waits for the buffer's stream.
    ///
    /// # Errors
    /// `dst` longer than [`size`](Self::size): [`MrError::OutOfRange`](rmm_mr::MrError::OutOfRange).
    #[doc(alias = "cudaMemcpyAsync")]
    pub fn copy_to_pinned_async(
        &self,
        dst: PinnedVec<u8>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<u8>> {
        self.copy_to_pinned_bytes(dst, stream)
    }

    pub(crate) fn copy_from_pinned_bytes<T: Pod>(
        &mut self,
        src: PinnedVec<T>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<T>> {
        let bytes = std::mem::size_of_val::<[T]>(&src);
        check_fits(bytes, self.size, "a pinned source")?;
        if bytes == 0 {
            return Ok(PinnedTransfer::new(src));
        }
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the buffer holds at least `bytes` bytes and is borrowed exclusively for
            // the enqueue; the source is a pinned block of at least `bytes` bytes that the
            // transfer (or, dropped, the pool's event) keeps from reuse until the copy is done.
            unsafe {
                raw::copy_async(
                    b.data(),
                    rmm_sys::DevicePtr::from_host_ptr(src.as_ptr().cast_mut()),
                    bytes,
                    stream,
                )
            }?;
            record_copy(&src, stream)?;
            b.order_own_after(stream)
        })?;
        Ok(PinnedTransfer::new(src))
    }

    pub(crate) fn copy_to_pinned_bytes<T: Pod>(
        &self,
        mut dst: PinnedVec<T>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<T>> {
        let bytes = std::mem::size_of_val::<[T]>(&dst);
        check_fits(bytes, self.size, "a pinned destination")?;
        if bytes == 0 {
            return Ok(PinnedTransfer::new(dst));
        }
        let dst_ptr = rmm_sys::DevicePtr::from_host_ptr(dst.as_mut_ptr());
        self.with_device(|b| {
            b.order_use_on(stream)?;
            // SAFETY: the buffer holds at least `bytes` bytes, its stream's pending work is
            // ordered before the copy; the destination is a pinned block of at least `bytes`
            // bytes, moved into the transfer so no host code touches it until the copy is done
            // (and, dropped, kept from reuse by the pool's event). Any bytes are a valid `T`.
            unsafe { raw::copy_async(dst_ptr, b.data(), bytes, stream) }?;
            record_copy(&dst, stream)?;
            // A later free of the buffer on its own stream must not overtake the read.
            b.order_own_after(stream)
        })?;
        Ok(PinnedTransfer::new(dst))
    }
}

impl<T: Pod> DeviceUvector<T> {
    /// Copies `src` to the first `src.len()` elements on `stream` without waiting; the vector
    /// comes back from the transfer once the copy has completed (ordered as
    /// [`DeviceBuffer::copy_from_pinned_async`]).
    #[doc(alias = "cudaMemcpyAsync")]
    pub fn copy_from_pinned_async(
        &mut self,
        src: PinnedVec<T>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<T>> {
        self.buffer_mut().copy_from_pinned_bytes(src, stream)
    }

    /// Copies the first `dst.len()` elements into `dst` on `stream` without waiting; the vector
    /// comes back from the transfer once the copy has completed.
    #[doc(alias = "cudaMemcpyAsync")]
    pub fn copy_to_pinned_async(
        &self,
        dst: PinnedVec<T>,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<T>> {
        self.as_buffer().copy_to_pinned_bytes(dst, stream)
    }

    /// All the elements, copied on `stream` into a new vector from `pool` without waiting.
    pub fn to_pinned_async(
        &self,
        pool: &PinnedHostPool,
        stream: CudaStreamView<'_>,
    ) -> MrResult<PinnedTransfer<T>> {
        let mut v = pool.vec();
        v.try_reserve_exact(self.len()).map_err(|_| {
            rmm_mr::MrError::out_of_memory(
                self.len().saturating_mul(std::mem::size_of::<T>()),
                "the pinned pool could not hold the copy",
            )
        })?;
        v.resize(self.len(), T::zeroed());
        self.copy_to_pinned_async(v, stream)
    }
}
