//! The driver-level error type.

use std::ffi::CStr;
use std::fmt;

use cudarc::driver::sys;

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
    /// Builds the error for a failed driver call, looking up the code's name and description.
    pub fn from_result(call: &'static str, result: sys::CUresult) -> Self {
        Self::from_code(call, result as u32, Some(result))
    }

    /// Builds the error for a raw `CUresult` value returned through a function pointer that
    /// rmm-sys resolved itself (the value need not be one cudarc's enum knows).
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

type ErrorText = unsafe extern "C" fn(u32, *mut *const std::ffi::c_char) -> u32;

/// Name and description of a result code: from the driver when it is loaded, else the
/// binding's enumerator name.
fn describe(code: ResultCode, known: Option<sys::CUresult>) -> (String, String) {
    let fallback = match known {
        Some(r) => format!("{r:?}"),
        None => format!("CUresult({})", code.0),
    };
    if !crate::driver::is_loaded() {
        return (fallback, String::new());
    }
    // SAFETY: the library is loaded (checked above), so `culib` does not panic; the two symbols
    // have the signature `CUresult f(CUresult, const char**)` in every CUDA version, and taking
    // the code as a plain u32 accepts values cudarc's enum does not list.
    let lib = unsafe { sys::culib() };
    // SAFETY: as above.
    let name_fn = unsafe { lib.get::<ErrorText>(b"cuGetErrorName\0") }
        .ok()
        .map(|s| *s);
    // SAFETY: as above.
    let desc_fn = unsafe { lib.get::<ErrorText>(b"cuGetErrorString\0") }
        .ok()
        .map(|s| *s);
    let call = |f: Option<ErrorText>| {
        let f = f?;
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the call only writes a pointer to a static NUL-terminated string owned by the
        // driver, or returns an error code for an unknown value.
        let ok = unsafe { f(code.0, &mut p) };
        if ok == 0 && !p.is_null() {
            // SAFETY: on success the driver returned a pointer to a static NUL-terminated string.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        }
    };
    (
        call(name_fn).unwrap_or(fallback),
        call(desc_fn).unwrap_or_default(),
    )
}

/// Turns a `CUresult` into a `Result`, naming the call on failure.
#[inline]
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> CudaResult<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::from_result(call, result))
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
}
