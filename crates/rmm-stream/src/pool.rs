//! A fixed set of streams handed out round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::StreamError;
use crate::stream::{CudaStream, StreamFlags};
use crate::view::CudaStreamView;

/// A pool of streams handed out round-robin (RMM's `cuda_stream_pool`). Thread-safe.
///
/// [`get_stream`](Self::get_stream) lends a view that borrows the pool, as RMM's does (there it
/// can dangle once the pool is gone; here the borrow checker forbids that).
/// [`get_shared_stream`](Self::get_shared_stream) hands out shared ownership of the same
/// stream instead, for holders that must outlive the borrow, such as containers
/// (`DeviceBuffer::new(n, pool.get_shared_stream())`): the stream is destroyed when the pool
/// and the last such handle are gone.
#[doc(alias = "rmm::cuda_stream_pool")]
#[derive(Debug)]
pub struct CudaStreamPool {
    streams: Vec<Arc<CudaStream>>,
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
            .map(|_| CudaStream::new(flags).map(Arc::new))
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
        self.get_stream_by_id(self.next_id())
    }

    /// The stream at `id % pool_size()`.
    #[must_use]
    pub fn get_stream_by_id(&self, id: usize) -> CudaStreamView<'_> {
        self.streams[id % self.streams.len()].view()
    }

    /// The next stream, round-robin, as shared ownership (the same stream
    /// [`get_stream`](Self::get_stream) would have lent; both draw from one counter).
    #[must_use]
    pub fn get_shared_stream(&self) -> Arc<CudaStream> {
        self.get_shared_stream_by_id(self.next_id())
    }

    /// The stream at `id % pool_size()`, as shared ownership.
    #[must_use]
    pub fn get_shared_stream_by_id(&self, id: usize) -> Arc<CudaStream> {
        Arc::clone(&self.streams[id % self.streams.len()])
    }

    /// The round-robin counter's next value (shared by both kinds of hand-out).
    fn next_id(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
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
