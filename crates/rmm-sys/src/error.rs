//! The driver-level error type.

use std::ffi::CStr;
use std::fmt;

use cudarc::driver::sys;

use crate::entry::RawResult;
use crate::version::DriverVersion;

/// A `CUresult` code as the driver returned it (`CUDA_ERROR_OUT_OF_MEMORY` is 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResultCode(pub u32);

impl ResultCode {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: Self = Self(1);
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: Self = Self(2);
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: Self = Self(3);
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: Self = Self(100);
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: Self = Self(101);
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub const INVALID_CONTEXT: Self = Self(201);
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: Self = Self(400);
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: Self = Self(500);
    /// `CUDA_ERROR_NOT_READY`: an asynchronous operation has not completed yet.
    pub const NOT_READY: Self = Self(600);
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: Self = Self(801);

    /// The name of the codes this type has a constant for (`CUDA_ERROR_OUT_OF_MEMORY` for 2),
    /// `None` for every other value. Only a fallback: with a driver loaded, errors are named by
    /// the driver's `cuGetErrorName`.
    #[must_use]
    pub const fn known_name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "CUDA_SUCCESS",
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            100 => "CUDA_ERROR_NO_DEVICE",
            101 => "CUDA_ERROR_INVALID_DEVICE",
            201 => "CUDA_ERROR_INVALID_CONTEXT",
            400 => "CUDA_ERROR_INVALID_HANDLE",
            500 => "CUDA_ERROR_NOT_FOUND",
            600 => "CUDA_ERROR_NOT_READY",
            801 => "CUDA_ERROR_NOT_SUPPORTED",
            _ => return None,
        })
    }
}

/// Every failure of the driver layer. No driver is an error value, never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// No NVIDIA driver (`libcuda`) could be loaded on this machine.
    DriverNotFound,
    /// The installed driver is older than rmm-rs supports.
    DriverTooOld {
        /// The driver's CUDA version.
        found: DriverVersion,
        /// The oldest supported version.
        required: DriverVersion,
    },
    /// A driver entry point that needs a newer driver than the one installed.
    EntryPointUnavailable {
        /// The entry point's name.
        symbol: &'static str,
        /// The CUDA version that introduced it.
        required: DriverVersion,
        /// The installed driver's CUDA version.
        found: DriverVersion,
    },
    /// A driver call returned an error code.
    Call {
        /// The driver function that failed.
        call: &'static str,
        /// The `CUresult` it returned.
        code: ResultCode,
        /// `cuGetErrorName` of the code (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// `cuGetErrorString` of the code.
        description: String,
    },
}

impl CudaError {
    /// Builds the error for a failed driver call from cudarc's `CUresult` enum, looking up the
    /// code's name and description.
    #[cfg(test)]
    pub(crate) fn from_result(call: &'static str, result: sys::CUresult) -> Self {
        Self::from_code(call, result as u32, Some(result))
    }

    /// Builds the error for a `CUresult` read as the integer the driver returned, which is how
    /// rmm-sys reads every result. The value need not be one cudarc's enum lists: an unknown
    /// code is kept as its number (named `CUresult(<code>)` unless the driver knows it).
    pub fn from_raw_code(call: &'static str, code: u32) -> Self {
        Self::from_code(call, code, None)
    }

    fn from_code(call: &'static str, code: u32, known: Option<sys::CUresult>) -> Self {
        let code = ResultCode(code);
        let (name, description) = describe(code, known);
        Self::Call {
            call,
            code,
            name,
            description,
        }
    }

    /// The `CUresult` of a failed call, if this error came from one.
    #[must_use]
    pub fn code(&self) -> Option<ResultCode> {
        match self {
            Self::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the driver reported `CUDA_ERROR_OUT_OF_MEMORY`: the request may succeed once
    /// memory is freed, so resources map it to their out-of-memory kind.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        self.code() == Some(ResultCode::OUT_OF_MEMORY)
    }

    /// Whether this error means there is no usable driver or device at all (no driver, a driver
    /// that is too old, or `CUDA_ERROR_NO_DEVICE`). GPU tests use it to report themselves
    /// skipped.
    #[must_use]
    pub fn is_no_device(&self) -> bool {
        matches!(self, Self::DriverNotFound | Self::DriverTooOld { .. })
            || self.code() == Some(ResultCode::NO_DEVICE)
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverNotFound => f.write_str(
                "no NVIDIA driver was found (libcuda could not be loaded); rmm-rs needs a CUDA GPU with its driver installed",
            ),
            Self::DriverTooOld { found, required } => write!(
                f,
                "the NVIDIA driver supports CUDA {found}, but rmm-rs needs CUDA {required} or newer"
            ),
            Self::EntryPointUnavailable {
                symbol,
                required,
                found,
            } => write!(
                f,
                "{symbol} needs a driver for CUDA {required} or newer; the installed driver supports CUDA {found}"
            ),
            Self::Call {
                call,
                name,
                description,
                ..
            } => write!(f, "CUDA error in {call}: {name} {description}"),
        }
    }
}

impl std::error::Error for CudaError {}

/// The `Result` of this layer.
pub type CudaResult<T> = Result<T, CudaError>;

/// Name and description of a result code: from the driver when it is loaded (its
/// `cuGetErrorName` / `cuGetErrorString`, which fail for a code they do not know), else the
/// binding's enumerator name, else the name rmm-sys knows, else `CUresult(<code>)`.
fn describe(code: ResultCode, known: Option<sys::CUresult>) -> (String, String) {
    let fallback = match (known, code.known_name()) {
        (Some(r), _) => format!("{r:?}"),
        (None, Some(name)) => name.to_owned(),
        (None, None) => format!("CUresult({})", code.0),
    };
    let Some(driver) = crate::entry::loaded() else {
        return (fallback, String::new());
    };
    let text = |f: unsafe extern "C" fn(u32, *mut *const std::ffi::c_char) -> u32| {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the function takes the code as a plain integer (any value: an unknown one is
        // an error return, not undefined behaviour) and only writes a pointer to a static
        // NUL-terminated string owned by the driver.
        let ok = unsafe { f(code.0, &mut p) };
        if ok == 0 && !p.is_null() {
            // SAFETY: on success the driver returned a pointer to a static NUL-terminated string.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        }
    };
    (
        text(driver.boot.cuGetErrorName).unwrap_or(fallback),
        text(driver.boot.cuGetErrorString).unwrap_or_default(),
    )
}

/// Turns a `CUresult`, read as the integer the driver returned, into a `Result`, naming the
/// call on failure. Any value is accepted: a code newer than the bindings becomes a
/// [`CudaError::Call`] carrying the number.
#[inline]
pub(crate) fn check(call: &'static str, result: RawResult) -> CudaResult<()> {
    if result == ResultCode::SUCCESS.0 {
        Ok(())
    } else {
        Err(CudaError::from_raw_code(call, result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_distinguished() {
        let oom = CudaError::from_result("cuMemAlloc", sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(oom.is_out_of_memory());
        assert_eq!(oom.code(), Some(ResultCode::OUT_OF_MEMORY));
        let other = CudaError::from_result("cuMemAlloc", sys::CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(!other.is_out_of_memory());
        assert!(!CudaError::DriverNotFound.is_out_of_memory());
    }

    #[test]
    fn messages_name_the_call_and_code() {
        let e = CudaError::from_result("cuMemAlloc", sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let s = e.to_string();
        assert!(s.contains("cuMemAlloc"), "{s}");
        assert!(s.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{s}");
        let s = CudaError::DriverNotFound.to_string();
        assert!(s.starts_with("no NVIDIA driver was found"), "{s}");
        assert!(!s.contains('\n'));
        let s = CudaError::EntryPointUnavailable {
            symbol: "cuMemGetDefaultMemPool",
            required: DriverVersion(13000),
            found: DriverVersion(12040),
        }
        .to_string();
        assert!(
            s.contains("cuMemGetDefaultMemPool") && s.contains("13.0") && s.contains("12.4"),
            "{s}"
        );
    }

    #[test]
    fn no_device_classification() {
        assert!(CudaError::DriverNotFound.is_no_device());
        assert!(
            CudaError::from_result("cuInit", sys::CUresult::CUDA_ERROR_NO_DEVICE).is_no_device()
        );
        assert!(
            !CudaError::from_result("cuInit", sys::CUresult::CUDA_ERROR_INVALID_VALUE)
                .is_no_device()
        );
    }

    /// A code no binding lists (a newer driver's) is an error value carrying its number: it
    /// goes through integers only, never through cudarc's `CUresult` enum, where it would be
    /// undefined behaviour.
    #[test]
    fn unknown_codes_are_errors_carrying_the_number() {
        const UNKNOWN: u32 = 987_654;
        let e = CudaError::from_raw_code("cuFuture", UNKNOWN);
        assert_eq!(e.code(), Some(ResultCode(UNKNOWN)));
        assert!(!e.is_out_of_memory() && !e.is_no_device());
        let s = e.to_string();
        assert!(s.contains("cuFuture"), "{s}");
        if crate::entry::loaded().is_none() {
            assert!(s.contains("CUresult(987654)"), "{s}");
        }

        let e = check("cuFuture", UNKNOWN).unwrap_err();
        assert_eq!(e.code(), Some(ResultCode(UNKNOWN)));
        match e {
            CudaError::Call { call, code, .. } => {
                assert_eq!(call, "cuFuture");
                assert_eq!(code.0, UNKNOWN);
            }
            other => panic!("not a call error: {other:?}"),
        }
        // The largest values too (a C enum read as u32 may hold anything).
        assert_eq!(
            check("cuFuture", u32::MAX).unwrap_err().code(),
            Some(ResultCode(u32::MAX))
        );
    }

    #[test]
    fn check_maps_known_codes() {
        assert_eq!(check("cuMemAlloc", 0), Ok(()));
        let oom = check("cuMemAlloc", 2).unwrap_err();
        assert!(oom.is_out_of_memory());
        assert!(
            oom.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{oom}"
        );
        assert!(check("cuInit", 100).unwrap_err().is_no_device());
        assert_eq!(
            check("cuMemAlloc", 1).unwrap_err().code(),
            Some(ResultCode::INVALID_VALUE)
        );
    }

    #[test]
    fn known_names_match_the_bindings() {
        for r in [
            sys::CUresult::CUDA_SUCCESS,
            sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            sys::CUresult::CUDA_ERROR_NOT_INITIALIZED,
            sys::CUresult::CUDA_ERROR_NO_DEVICE,
            sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
            sys::CUresult::CUDA_ERROR_INVALID_CONTEXT,
            sys::CUresult::CUDA_ERROR_INVALID_HANDLE,
            sys::CUresult::CUDA_ERROR_NOT_FOUND,
            sys::CUresult::CUDA_ERROR_NOT_READY,
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        ] {
            assert_eq!(
                ResultCode(r as u32).known_name(),
                Some(format!("{r:?}").as_str())
            );
        }
        assert_eq!(ResultCode(987_654).known_name(), None);
    }
}
