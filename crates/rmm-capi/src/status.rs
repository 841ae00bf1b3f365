//! Status codes and the error the entry points return: an [`MrError`] (or a C-side mistake)
//! as a code and a message. Pure: no CUDA call.

use std::fmt;

use rmm::MrError;

/// `RMM_RS_SUCCESS`.
pub const RMM_RS_SUCCESS: i32 = 0;
/// `RMM_RS_ERROR_INVALID_ARGUMENT`: a bad argument or option combination.
pub const RMM_RS_ERROR_INVALID_ARGUMENT: i32 = 1;
/// `RMM_RS_ERROR_OUT_OF_MEMORY`: the device, a pool's maximum or the driver's pool is
/// exhausted.
pub const RMM_RS_ERROR_OUT_OF_MEMORY: i32 = 2;
/// `RMM_RS_ERROR_BAD_ALLOC`: an allocation failed for another reason.
pub const RMM_RS_ERROR_BAD_ALLOC: i32 = 3;
/// `RMM_RS_ERROR_INVALID_FREE`: a free the resource detected as wrong.
pub const RMM_RS_ERROR_INVALID_FREE: i32 = 4;
/// `RMM_RS_ERROR_NO_DEVICE`: no CUDA driver, or no such device.
pub const RMM_RS_ERROR_NO_DEVICE: i32 = 5;
/// `RMM_RS_ERROR_CUDA`: another CUDA driver error.
pub const RMM_RS_ERROR_CUDA: i32 = 6;
/// `RMM_RS_ERROR_NOT_CONFIGURED`: the device was never configured.
pub const RMM_RS_ERROR_NOT_CONFIGURED: i32 = 7;
/// `RMM_RS_ERROR_BUSY`: a reconfiguration would replace a resource with allocations
/// outstanding.
pub const RMM_RS_ERROR_BUSY: i32 = 8;
/// `RMM_RS_ERROR_PANIC`: a Rust panic, caught at the boundary.
pub const RMM_RS_ERROR_PANIC: i32 = 9;
/// `RMM_RS_ERROR_UNSUPPORTED`: the device or its driver lacks a capability the configured
/// resource needs ([`MrError::Unsupported`]; the message names it).
pub const RMM_RS_ERROR_UNSUPPORTED: i32 = 10;

/// A failed call: the status code the C caller gets and the message of
/// `rmm_rs_last_error()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// One of the `RMM_RS_ERROR_*` codes.
    pub code: i32,
    /// What went wrong, in words.
    pub message: String,
}

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An invalid-argument error.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(RMM_RS_ERROR_INVALID_ARGUMENT, message)
    }

    /// Whether this is out-of-memory.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        self.code == RMM_RS_ERROR_OUT_OF_MEMORY
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<MrError> for Error {
    /// The code of each kind of [`MrError`]; the message is its `Display` (RMM's `what()`,
    /// `std::bad_alloc: out_of_memory: ...` for out-of-memory).
    fn from(e: MrError) -> Self {
        let code = match &e {
            MrError::OutOfMemory { .. } => RMM_RS_ERROR_OUT_OF_MEMORY,
            _ if e.is_no_device() => RMM_RS_ERROR_NO_DEVICE,
            MrError::BadAlloc { .. } => RMM_RS_ERROR_BAD_ALLOC,
            MrError::InvalidFree { .. } => RMM_RS_ERROR_INVALID_FREE,
            MrError::Cuda(_) => RMM_RS_ERROR_CUDA,
            MrError::Unsupported(_) => RMM_RS_ERROR_UNSUPPORTED,
            _ => RMM_RS_ERROR_INVALID_ARGUMENT,
        };
        Self::new(code, e.to_string())
    }
}

impl From<rmm::CudaError> for Error {
    fn from(e: rmm::CudaError) -> Self {
        MrError::from(e).into()
    }
}

/// What [`MrError`]s and setup failures of a call become.
pub type CResult<T> = Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use rmm::mr::InvalidFree;
    use rmm::{CudaError, DevicePtr};

    #[test]
    fn every_error_kind_has_its_code() {
        let cases = [
            (
                MrError::out_of_memory(10, "Maximum pool size exceeded"),
                RMM_RS_ERROR_OUT_OF_MEMORY,
            ),
            (MrError::bad_alloc("alignment"), RMM_RS_ERROR_BAD_ALLOC),
            (
                MrError::InvalidFree {
                    ptr: DevicePtr::from_raw(0x100),
                    bytes: 8,
                    kind: InvalidFree::DoubleFree,
                },
                RMM_RS_ERROR_INVALID_FREE,
            ),
            (
                MrError::Cuda(CudaError::DriverNotFound),
                RMM_RS_ERROR_NO_DEVICE,
            ),
            (
                MrError::invalid_argument("x"),
                RMM_RS_ERROR_INVALID_ARGUMENT,
            ),
            (
                MrError::OutOfRange("pop".into()),
                RMM_RS_ERROR_INVALID_ARGUMENT,
            ),
            (
                MrError::Unsupported("no memory pools".into()),
                RMM_RS_ERROR_UNSUPPORTED,
            ),
        ];
        for (e, code) in cases {
            let message = e.to_string();
            let c = Error::from(e);
            assert_eq!(c.code, code, "{message}");
            assert_eq!(c.message, message);
        }
        let oom = Error::from(MrError::out_of_memory(1, "r"));
        assert!(oom.is_out_of_memory());
        // The resource's out-of-memory report reaches C (and PyTorch's exception) whole.
        let report = rmm::OomReport {
            resource: "pool",
            reserved: 64 << 20,
            in_use: 30 << 20,
            free: 34 << 20,
            largest_free_block: 20 << 20,
            limit: Some(64 << 20),
            ..rmm::OomReport::new(40 << 20)
        };
        let e = MrError::out_of_memory_with("Maximum pool size exceeded", report);
        let message = e.to_string();
        let c = Error::from(e);
        assert_eq!(c.code, RMM_RS_ERROR_OUT_OF_MEMORY);
        assert_eq!(c.message, message);
        assert!(
            c.message.contains("requested") && c.message.contains("in use"),
            "{}",
            c.message
        );
        assert!(oom.message.starts_with("std::bad_alloc: out_of_memory: "));
        assert_eq!(
            Error::from(CudaError::DriverNotFound).code,
            RMM_RS_ERROR_NO_DEVICE
        );
    }
}
