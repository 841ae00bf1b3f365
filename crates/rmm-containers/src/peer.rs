//! Copies between devices: [`DeviceBuffer::copy_to_device`] (`cuMemcpyPeerAsync`).

use rmm_mr::{MrResult, SharedResource};
use rmm_sys::{DeviceGuard, DeviceId};

use crate::buffer::DeviceBuffer;
use crate::raw::{self, StreamOn};
use crate::stream::BufferStream;

impl DeviceBuffer {
    /// A copy of this buffer on `device`: a new buffer of the same size and alignment from `mr`
    /// (`device`'s resource when `None`; see [`rmm_mr::per_device_resource`]) on `stream` (a
    /// stream of `device`), filled with `cuMemcpyPeerAsync`. The copy goes directly over
    /// NVLink or PCIe where the devices have peer access and through the host otherwise; it is
    /// ordered on `stream` and not waited for. RMM has no such call.
    ///
    /// The copy first waits for the work queued on this buffer's stream, and this buffer's
    /// stream then waits for the copy, so this buffer's later work and its free come after the
    /// copy has read it (as [`try_clone_on`](Self::try_clone_on)). With `device` equal to this
    /// buffer's it is an ordinary copy.
    ///
    /// # Errors
    /// The allocation's error on `device`, or the driver's error of the copy or of the event
    /// that orders it.
    ///
    /// ```no_run
    /// use rmm_containers::DeviceBuffer;
    /// use rmm_stream::CudaStreamView;
    /// use rmm_sys::DeviceId;
    /// let on_0 = DeviceBuffer::from_host(&[7u8; 1024], CudaStreamView::default(), None)?;
    /// let on_1 = on_0.copy_to_device(DeviceId(1), CudaStreamView::default(), None)?;
    /// assert_eq!(on_1.device(), DeviceId(1));
    /// # Ok::<(), rmm_mr::MrError>(())
    /// ```
    #[doc(alias = "cuMemcpyPeerAsync")]
    pub fn copy_to_device(
        &self,
        device: DeviceId,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<DeviceBuffer> {
        let copy = {
            let _guard = DeviceGuard::new(device)?;
            DeviceBuffer::with_alignment(self.size(), self.alignment(), stream, mr)?
        };
        if self.size() == 0 {
            return Ok(copy);
        }
        let mine = StreamOn::new(self.device(), self.stream());
        let theirs = StreamOn::new(copy.device(), copy.stream());
        // On error `copy` drops and frees its allocation on its own stream.
        raw::order_after(StreamOn::new(copy.device(), copy.stream()), mine)?;
        {
            let _guard = DeviceGuard::new(copy.device())?;
            // SAFETY: `copy.data()` holds `self.size()` fresh bytes of `copy.device()`;
            // `self.data()` holds at least that many of `self.device()` and is borrowed for the
            // call; the work queued on this buffer's stream comes before the copy (above), its
            // later work and free after it (below); the stream handle is alive (the buffer's).
            unsafe {
                rmm_sys::ipc::memcpy_peer_async(
                    copy.data(),
                    copy.device(),
                    self.data(),
                    self.device(),
                    self.size(),
                    copy.stream().as_raw(),
                )
            }?;
        }
        raw::order_after(StreamOn::new(self.device(), self.stream()), theirs)?;
        Ok(copy)
    }
}
