//! Errors of the stream layer.

use std::fmt;

use rmm_sys::CudaError;

/// A failure of a stream, stream-pool or event operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// The driver failed (or is missing).
    Cuda(CudaError),
    /// A bad argument (RMM's `logic_error`), e.g. a stream pool of size 0.
    InvalidArgument(String),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cuda(e) => e.fmt(f),
            Self::InvalidArgument(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Cuda(e) => Some(e),
            Self::InvalidArgument(_) => None,
        }
    }
}

impl From<CudaError> for StreamError {
    fn from(e: CudaError) -> Self {
        Self::Cuda(e)
    }
}
