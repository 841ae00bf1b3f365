//! The error type of every memory resource and adaptor (RMM's exception taxonomy as values).

use std::fmt;

use rmm_sys::{CudaError, DevicePtr};

use crate::diagnostics::OomReport;

/// What a resource detected wrong with a deallocation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidFree {
    /// The address was never handed out by this resource (or not at this size).
    UnknownPointer,
    /// The address was already freed.
    DoubleFree,
    /// The size differs from the one it was allocated with.
    SizeMismatch {
        /// The size recorded at allocation.
        allocated: usize,
    },
}

/// A memory-resource failure. [`MrError::OutOfMemory`] is distinct from every other kind, so
/// callers can retry, spill or shrink exactly when memory ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MrError {
    /// Definitely out of memory (RMM's `rmm::out_of_memory`): the device, a pool's maximum, a
    /// limit or an arena is exhausted. The request may succeed once memory is freed.
    #[doc(alias = "rmm::out_of_memory")]
    OutOfMemory {
        /// The number of bytes requested.
        requested: usize,
        /// Why, in RMM's words (e.g. `Exceeded memory limit (failed to allocate 1024 bytes)`).
        reason: String,
        /// What the refusing resource knew: reserved, in use, free, the largest free block, a
        /// verdict ([`MrError::oom_report`]). Boxed and built only on the failure path; `None`
        /// where the resource had nothing to add.
        report: Option<Box<OomReport>>,
    },
    /// An allocation failed for another reason (RMM's `rmm::bad_alloc`), e.g. an alignment the
    /// resource cannot honour.
    #[doc(alias = "rmm::bad_alloc")]
    BadAlloc {
        /// What failed.
        message: String,
        /// The driver error behind it, if any.
        source: Option<CudaError>,
    },
    /// A CUDA call that is not an allocation failed (RMM's `rmm::cuda_error`), or there is no
    /// driver at all.
    #[doc(alias = "rmm::cuda_error")]
    Cuda(CudaError),
    /// A bad argument or a precondition violation (RMM's `rmm::logic_error` and
    /// `rmm::invalid_argument`).
    #[doc(alias = "rmm::logic_error")]
    #[doc(alias = "rmm::invalid_argument")]
    InvalidArgument(String),
    /// An index out of range (RMM's `rmm::out_of_range`).
    #[doc(alias = "rmm::out_of_range")]
    OutOfRange(String),
    /// The device or its driver lacks a capability the resource needs, named in the message:
    /// memory pools ([`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource) and its
    /// views), an export handle type, CUDA 13 and concurrent managed access
    /// ([`CudaAsyncManagedMemoryResource`](crate::CudaAsyncManagedMemoryResource)), pageable
    /// memory access (HMM or ATS: [`SystemMemoryResource`](crate::SystemMemoryResource),
    /// [`SamHeadroomMemoryResource`](crate::SamHeadroomMemoryResource)), virtual memory
    /// management ([`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource)). No request to
    /// this resource can succeed here, so choose another resource. RMM throws
    /// `rmm::logic_error` for these.
    Unsupported(String),
    /// What stream capture forbids was asked for on a capturing stream, and the resource
    /// refused before making any driver call into the capture, so the capture stays valid: a
    /// sub-allocator's growth on a stream in a capture not begun through
    /// [`GraphPool::capture`](crate::GraphPool::capture), a free inside an rmm-rs capture of
    /// memory allocated outside it, a free of a graph pool's block inside another pool's
    /// capture. RMM has no such error (it has no notion of capture). See
    /// `docs/guide/13-cuda-graphs.md`.
    Capture(String),
    /// A deallocation the resource detected as wrong. RMM's deallocation is `noexcept` and such
    /// misuse aborts the process or is silently absorbed; here it is a value the caller sees.
    InvalidFree {
        /// The address passed to `deallocate`.
        ptr: DevicePtr,
        /// The size passed to `deallocate`.
        bytes: usize,
        /// What was wrong.
        kind: InvalidFree,
    },
}

impl MrError {
    /// An out-of-memory error.
    pub fn out_of_memory(requested: usize, reason: impl Into<String>) -> Self {
        Self::OutOfMemory {
            requested,
            reason: reason.into(),
            report: None,
        }
    }

    /// RMM's out-of-memory error for a request no block can hold (a pool's request that
    /// overflows when rounded up to 256, a fixed-size resource's request above its block size):
    /// `"Maximum allocation size exceeded (failed to allocate <bytes>)"`.
    #[cold]
    pub(crate) fn max_allocation_exceeded(bytes: usize) -> Self {
        let bytes_text = crate::util::format::format_bytes(bytes);
        Self::out_of_memory(
            bytes,
            format!("Maximum allocation size exceeded (failed to allocate {bytes_text})"),
        )
    }

    /// An out-of-memory error carrying `report` (its `requested` is the report's).
    #[cold]
    #[inline(never)]
    #[must_use]
    pub fn out_of_memory_with(reason: impl Into<String>, report: OomReport) -> Self {
        Self::OutOfMemory {
            requested: report.requested,
            reason: reason.into(),
            report: Some(Box::new(report)),
        }
    }

    /// The out-of-memory report this error carries, if it is [`MrError::OutOfMemory`] from a
    /// resource that builds one.
    #[must_use]
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            Self::OutOfMemory {
                report: Some(r), ..
            } => Some(r),
            _ => None,
        }
    }

    /// Attaches `report` to an out-of-memory error that carries none yet (an adaptor adding
    /// what it knows to its upstream's refusal); other errors are returned unchanged.
    #[cold]
    #[inline(never)]
    #[must_use]
    pub fn with_oom_report(self, report: impl FnOnce(usize) -> OomReport) -> Self {
        match self {
            Self::OutOfMemory {
                requested,
                reason,
                report: None,
            } => Self::OutOfMemory {
                requested,
                reason,
                report: Some(Box::new(report(requested))),
            },
            other => other,
        }
    }

    /// A `bad_alloc` without a driver error.
    pub fn bad_alloc(message: impl Into<String>) -> Self {
        Self::BadAlloc {
            message: message.into(),
            source: None,
        }
    }

    /// An invalid argument / logic error.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::InvalidArgument(message.into())
    }

    /// Maps a failed driver allocation the way RMM's `RMM_CUDA_TRY_ALLOC` does:
    /// `CUDA_ERROR_OUT_OF_MEMORY` becomes [`MrError::OutOfMemory`], a missing driver stays a
    /// [`MrError::Cuda`], anything else becomes [`MrError::BadAlloc`].
    pub fn from_allocation(e: CudaError, bytes: usize) -> Self {
        if e.is_out_of_memory() {
            Self::out_of_memory(
                bytes,
                format!("CUDA error (failed to allocate {bytes} bytes): {e}"),
            )
        } else if e.code().is_none() {
            Self::Cuda(e)
        } else {
            Self::BadAlloc {
                message: format!("CUDA error (failed to allocate {bytes} bytes): {e}"),
                source: Some(e),
            }
        }
    }

    /// Whether this is [`MrError::OutOfMemory`].
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::OutOfMemory { .. })
    }

    /// Whether this error means no GPU or driver is usable here.
    #[must_use]
    pub fn is_no_device(&self) -> bool {
        match self {
            Self::Cuda(e) => e.is_no_device(),
            Self::BadAlloc {
                source: Some(e), ..
            } => e.is_no_device(),
            _ => false,
        }
    }
}

impl fmt::Display for MrError {
    /// Messages follow RMM's `what()`: `std::bad_alloc: out_of_memory: <reason>` for
    /// out-of-memory (followed by `; <report>` where the error carries an [`OomReport`]),
    /// `std::bad_alloc: <message>` for other allocation failures.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfMemory { reason, report, .. } => {
                write!(f, "std::bad_alloc: out_of_memory: {reason}")?;
                if let Some(r) = report {
                    write!(f, "; {r:#}")?;
                }
                Ok(())
            }
            Self::BadAlloc { message, .. } => write!(f, "std::bad_alloc: {message}"),
            Self::Cuda(e) => write!(f, "CUDA error: {e}"),
            Self::InvalidArgument(m) => write!(f, "RMM failure: {m}"),
            Self::OutOfRange(m) => write!(f, "out of range: {m}"),
            Self::Unsupported(m) => write!(f, "not supported here: {m}"),
            Self::Capture(m) => write!(f, "refused under stream capture: {m}"),
            Self::InvalidFree { ptr, bytes, kind } => {
                let what = match kind {
                    InvalidFree::UnknownPointer => {
                        "the pointer was not allocated by this resource".to_owned()
                    }
                    InvalidFree::DoubleFree => "the pointer was already freed".to_owned(),
                    InvalidFree::SizeMismatch { allocated } => {
                        format!("it was allocated with {allocated} bytes")
                    }
                };
                write!(f, "invalid deallocation of {ptr} ({bytes} bytes): {what}")
            }
        }
    }
}

impl std::error::Error for MrError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Cuda(e)
            | Self::BadAlloc {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

impl From<CudaError> for MrError {
    fn from(e: CudaError) -> Self {
        Self::Cuda(e)
    }
}

impl From<rmm_stream::StreamError> for MrError {
    fn from(e: rmm_stream::StreamError) -> Self {
        match e {
            rmm_stream::StreamError::Cuda(c) => Self::Cuda(c),
            rmm_stream::StreamError::InvalidArgument(m) => Self::InvalidArgument(m),
            other => Self::InvalidArgument(other.to_string()),
        }
    }
}

/// The `Result` of this layer.
pub type MrResult<T> = Result<T, MrError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_message_has_rmm_shape() {
        let e = MrError::out_of_memory(
            1024,
            "Exceeded memory limit (failed to allocate 1024 bytes)",
        );
        assert!(e.is_out_of_memory());
        let s = e.to_string();
        assert!(s.starts_with("std::bad_alloc: out_of_memory: "), "{s}");
        assert!(s.contains("1024"), "{s}");
    }

    #[test]
    fn allocation_failures_map_like_rmm_cuda_try_alloc() {
        let oom = CudaError::from_raw_code("cuMemAlloc", 2);
        let e = MrError::from_allocation(oom, 1 << 50);
        assert!(matches!(e, MrError::OutOfMemory { requested, .. } if requested == 1 << 50));
        assert!(e.to_string().contains("out_of_memory"));
        let other = CudaError::from_raw_code("cuMemAlloc", 1);
        let e = MrError::from_allocation(other, 8);
        assert!(matches!(
            e,
            MrError::BadAlloc {
                source: Some(_),
                ..
            }
        ));
        assert!(!e.is_out_of_memory());
        assert!(e
            .to_string()
            .starts_with("std::bad_alloc: CUDA error (failed to allocate 8 bytes)"));
        let e = MrError::from_allocation(CudaError::DriverNotFound, 8);
        assert_eq!(e, MrError::Cuda(CudaError::DriverNotFound));
        assert!(e.is_no_device());
    }

    #[test]
    fn out_of_memory_carries_its_report() {
        let plain = MrError::out_of_memory(64, "full");
        assert_eq!(plain.oom_report(), None);
        let report = OomReport {
            resource: "pool",
            in_use: 1 << 20,
            ..OomReport::new(64)
        };
        let e = plain.with_oom_report(|requested| OomReport {
            requested,
            ..report.clone()
        });
        assert_eq!(e.oom_report(), Some(&report));
        let s = e.to_string();
        assert!(
            s.starts_with(
                "std::bad_alloc: out_of_memory: full; pool requested 64 B; in use 1.0 MiB"
            ),
            "{s}"
        );
        // A report already there is kept; other errors pass unchanged.
        let again = e.clone().with_oom_report(|_| OomReport::new(1));
        assert_eq!(again.oom_report(), Some(&report));
        let bad = MrError::bad_alloc("x").with_oom_report(|_| OomReport::new(1));
        assert_eq!(bad.oom_report(), None);
        let built = MrError::out_of_memory_with("r", report.clone());
        assert!(matches!(built, MrError::OutOfMemory { requested: 64, .. }));
        // Boxed: one pointer in the error, however large the report grows.
        assert_eq!(
            std::mem::size_of::<Option<Box<OomReport>>>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn invalid_free_is_described() {
        let e = MrError::InvalidFree {
            ptr: DevicePtr::from_raw(0x1000),
            bytes: 256,
            kind: InvalidFree::SizeMismatch { allocated: 512 },
        };
        let s = e.to_string();
        assert!(s.contains("0x1000") && s.contains("512"), "{s}");
    }
}
