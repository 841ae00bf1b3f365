//! [`DeviceScalar`]: one value in device memory.

use std::fmt;

use bytemuck::Pod;
use rmm_mr::{MrResult, SharedResource};
use rmm_stream::CudaStreamView;
use rmm_sys::{DeviceId, DevicePtr};

use crate::stream::BufferStream;
use crate::uvector::DeviceUvector;

/// One `T` in device memory (RMM's `device_scalar`): a [`DeviceUvector`] of length 1.
///
/// Over-aligned `T` (alignment above 256) fail with the base resource's
/// [`MrError::BadAlloc`](rmm_mr::MrError::BadAlloc). Methods given another stream than the
/// scalar's are ordered against it as
/// [`DeviceBuffer`'s are](crate::DeviceBuffer#stream-ordering-which-stream-orders-what).
#[doc(alias = "rmm::device_scalar")]
pub struct DeviceScalar<T: Pod> {
    vector: DeviceUvector<T>,
}

impl<T: Pod> DeviceScalar<T> {
    /// An uninitialized scalar on `stream`, from `mr` (the current device's resource when
    /// `None`).
    pub fn new(stream: impl Into<BufferStream>, mr: Option<SharedResource>) -> MrResult<Self> {
        Ok(Self {
            vector: DeviceUvector::with_resource(1, stream, mr)?,
        })
    }

    /// A scalar set to `value` on `stream` (the copy is ordered on the stream; not waited
    /// for, and `value` is staged by the driver before the call returns).
    pub fn with_value(
        value: T,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        let mut s = Self::new(stream, mr)?;
        let stream = s.buffer_stream().clone();
        s.set_value_async(&value, stream.view())?;
        Ok(s)
    }

    /// A deep copy on `stream` from `mr` (the current device's resource when `None`): distinct
    /// storage holding the same value once `stream` reaches the copy.
    pub fn try_clone_on(
        &self,
        stream: impl Into<BufferStream>,
        mr: Option<SharedResource>,
    ) -> MrResult<Self> {
        Ok(Self {
            vector: self.vector.try_clone_on(stream, mr)?,
        })
    }

    /// The value, copied to the host on `stream` (waits).
    pub fn value(&self, stream: CudaStreamView<'_>) -> MrResult<T> {
        self.vector.element(0, stream)
    }

    /// Sets the value on `stream` without waiting for the device.
    pub fn set_value_async(&mut self, value: &T, stream: CudaStreamView<'_>) -> MrResult<()> {
        self.vector.set_element_async(0, value, stream)
    }

    /// Zeroes the value's bytes on `stream` without waiting.
    pub fn set_value_to_zero_async(&mut self, stream: CudaStreamView<'_>) -> MrResult<()> {
        self.vector.set_element_to_zero_async(0, stream)
    }

    /// The value's device address.
    #[must_use]
    pub fn data(&self) -> DevicePtr {
        self.vector.data()
    }

    /// Always 1.
    #[must_use]
    pub fn size(&self) -> usize {
        1
    }

    /// A view of the stream the scalar will be freed on.
    #[must_use]
    pub fn stream(&self) -> CudaStreamView<'_> {
        self.vector.stream()
    }

    /// The owning handle of the scalar's stream.
    #[must_use]
    pub fn buffer_stream(&self) -> &BufferStream {
        self.vector.buffer_stream()
    }

    /// Records `stream` for the later free, after making it wait for the work queued on the
    /// old stream; see [`DeviceBuffer::set_stream`](crate::DeviceBuffer::set_stream).
    pub fn set_stream(&mut self, stream: impl Into<BufferStream>) -> MrResult<()> {
        self.vector.set_stream(stream)
    }

    /// The resource the memory came from.
    #[must_use]
    pub fn memory_resource(&self) -> &SharedResource {
        self.vector.memory_resource()
    }

    /// The device that was current when the scalar was created.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.vector.device()
    }

    /// The one-element vector behind the scalar.
    #[must_use]
    pub fn as_uvector(&self) -> &DeviceUvector<T> {
        &self.vector
    }

    /// Gives up the scalar and returns its one-element vector.
    #[must_use]
    pub fn into_uvector(self) -> DeviceUvector<T> {
        self.vector
    }
}

impl<T: Pod> fmt::Debug for DeviceScalar<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalar")
            .field("vector", &self.vector)
            .finish()
    }
}
