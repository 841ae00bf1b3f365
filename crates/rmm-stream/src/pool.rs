//! A fixed set of streams handed out round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::StreamError;
use crate::stream::{CudaStream, StreamFlags};
use crate::view::CudaStreamView;

/// A pool of streams handed out round-robin (RMM's `cuda_stream_pool`). Thread-safe.
#[doc(alias = "rmm::cuda_stream_pool")]
#[derive(Debug)]
pub struct CudaStreamPool {
    streams: Vec<CudaStream>,
    next: AtomicUsize,
}

impl CudaStreamPool {
    /// RMM's default pool size.
    pub const DEFAULT_SIZE: usize = 16;

    /// Creates `size` streams with `flags` on the current device. `size == 0` is an error.
    pub fn new(size: usize, flags: StreamFlags) -> Result<Self, StreamError> {
        if size == 0 {
            return Err(StreamError::InvalidArgument(
                "Stream pool size must be greater than zero".to_owned(),
            ));
        }
        let streams = (0..size)
            .map(|_| CudaStream::new(flags))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            streams,
            next: AtomicUsize::new(0),
        })
    }

    /// A pool of [`Self::DEFAULT_SIZE`] streams that synchronize with the legacy stream.
    pub fn with_default_size() -> Result<Self, StreamError> {
        Self::new(Self::DEFAULT_SIZE, StreamFlags::SyncDefault)
    }

    /// The next stream, round-robin (a relaxed atomic counter: successive calls may return the
    /// same stream once the pool wraps).
    #[must_use]
    pub fn get_stream(&self) -> CudaStreamView<'_> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.get_stream_by_id(i)
    }

    /// The stream at `id % pool_size()`.
    #[must_use]
    pub fn get_stream_by_id(&self, id: usize) -> CudaStreamView<'_> {
        self.streams[id % self.streams.len()].view()
    }

    /// Number of streams.
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_zero_is_an_error() {
        let e = CudaStreamPool::new(0, StreamFlags::SyncDefault).unwrap_err();
        assert_eq!(
            e,
            StreamError::InvalidArgument("Stream pool size must be greater than zero".into())
        );
    }

    #[test]
    fn without_a_driver_creation_fails() {
        if !rmm_sys::is_driver_present() {
            let e = CudaStreamPool::new(2, StreamFlags::SyncDefault).unwrap_err();
            assert_eq!(e, StreamError::Cuda(rmm_sys::CudaError::DriverNotFound));
        } else {
            assert!(!matches!(
                CudaStreamPool::new(2, StreamFlags::SyncDefault),
                Err(StreamError::Cuda(rmm_sys::CudaError::DriverNotFound))
            ));
        }
    }
}
