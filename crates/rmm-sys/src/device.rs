//! Devices: count, the calling thread's current device, making one current, memory info and the
//! capability probes RMM uses.

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;

use crate::raw;
use cudarc::driver::sys;

use crate::align::{align_down, ALLOCATION_ALIGNMENT};
use crate::capabilities::DeviceCapabilities;
use crate::context::{context_api, PrimaryContextGuard};
use crate::error::{check, CudaResult};

/// A CUDA device ordinal (RMM's `cuda_device_id`).
#[doc(alias = "rmm::cuda_device_id")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub i32);

impl DeviceId {
    /// The ordinal.
    #[must_use]
    pub const fn value(self) -> i32 {
        self.0
    }

    /// The calling thread's current device (RMM's default-constructed `cuda_device_id`).
    pub fn current() -> CudaResult<Self> {
        current_device()
    }

    /// The device's compute capability (9.0 for an H100).
    pub fn compute_capability(self) -> CudaResult<ComputeCapability> {
        use sys::CUdevice_attribute as A;
        let major = device_attribute(self, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = device_attribute(self, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(ComputeCapability {
            major: major.max(0) as u32,
            minor: minor.max(0) as u32,
        })
    }

    /// The name the driver reports for the device ([`device_name`]).
    pub fn name(self) -> CudaResult<String> {
        device_name(self)
    }

    /// The capability probes RMM's resources consult ([`DeviceCapabilities::probe`]).
    pub fn capabilities(self) -> CudaResult<DeviceCapabilities> {
        DeviceCapabilities::probe(self)
    }

    /// The device's total memory in bytes (`cuDeviceTotalMem`, read as the driver's attribute
    /// table does not list it: through [`available_device_memory`] on this device).
    pub fn total_memory(self) -> CudaResult<usize> {
        let _guard = DeviceGuard::new(self)?;
        Ok(available_device_memory()?.1)
    }
}

/// A device's compute capability, `major.minor` (e.g. 9.0 for Hopper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// The major version (the architecture generation).
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why rmm-rs cannot use a GPU here, or `None` when a driver and at least one device are
/// present. GPU tests use it to report themselves skipped; programs can print it as their one
/// line of explanation.
#[must_use]
pub fn gpu_unavailable_reason() -> Option<String> {
    match device_count() {
        Ok(0) => Some("no CUDA device was found".to_owned()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Number of CUDA devices (`cudaGetDeviceCount`).
#[doc(alias = "rmm::get_num_cuda_devices")]
pub fn device_count() -> CudaResult<usize> {
    let n = crate::context::raw_device_count()?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The calling thread's current device (`cudaGetDevice`): the device of its current context,
/// device 0 for a thread that has none yet.
#[doc(alias = "rmm::get_current_cuda_device")]
pub fn current_device() -> CudaResult<DeviceId> {
    fault_point!(CurrentDevice, "cuCtxGetDevice" => Ok(DeviceId(0)));
    let api = context_api()?;
    let mut dev: raw::CUdevice = 0;
    // SAFETY: a context is current on this thread; writes one device handle.
    check("cuCtxGetDevice", unsafe { (api.cuCtxGetDevice)(&mut dev) })?;
    Ok(DeviceId(dev))
}

/// Makes `device` current on the calling thread: retains its primary context and sets it
/// current, as `cudaSetDevice` does.
pub fn set_current_device(device: DeviceId) -> CudaResult<()> {
    crate::context::make_current(device.0)
}

/// Makes a device current for a scope and restores the previous one on drop (RMM's
/// `cuda_set_device_raii`). A negative id, or the device already current, changes nothing. The
/// guard is not `Send`: dropped on another thread it would change that thread's device.
#[doc(alias = "rmm::cuda_set_device_raii")]
#[derive(Debug)]
#[must_use = "the previous device is restored when the guard drops"]
pub struct DeviceGuard {
    previous: Option<DeviceId>,
    /// The guard restores the device of the thread that made it: it must not move to another.
    _not_send: PhantomData<*const ()>,
}

impl DeviceGuard {
    /// Makes `device` current until the guard drops.
    pub fn new(device: DeviceId) -> CudaResult<Self> {
        if device.0 < 0 {
            return Ok(Self {
                previous: None,
                _not_send: PhantomData,
            });
        }
        let previous = current_device()?;
        if previous == device {
            return Ok(Self {
                previous: None,
                _not_send: PhantomData,
            });
        }
        set_current_device(device)?;
        Ok(Self {
            previous: Some(previous),
            _not_send: PhantomData,
        })
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            if let Err(e) = set_current_device(prev) {
                log::error!("rmm: could not restore device {prev}: {e}");
            }
        }
    }
}

/// Blocks until all work of the current context has completed, on every stream (non-blocking
/// ones included): `cuCtxSynchronize`, the driver's `cudaDeviceSynchronize`.
pub fn device_synchronize() -> CudaResult<()> {
    fault_point!(Synchronize, "cuCtxSynchronize" => Ok(()));
    let api = context_api()?;
    // SAFETY: a context is current; the call takes no arguments.
    check("cuCtxSynchronize", unsafe { (api.cuCtxSynchronize)() })
}

/// Free and total memory of the current device in bytes (`cudaMemGetInfo`).
#[doc(alias = "rmm::available_device_memory")]
pub fn available_device_memory() -> CudaResult<(usize, usize)> {
    let api = context_api()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a context is current; writes two sizes.
    check("cuMemGetInfo", unsafe {
        (api.cuMemGetInfo_v2)(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `percent` of the current device's free memory, aligned down to 256 bytes (RMM's
/// `percent_of_free_device_memory`; `percent` above 100 is clamped to 100).
#[doc(alias = "rmm::percent_of_free_device_memory")]
pub fn percent_of_free_device_memory(percent: u32) -> CudaResult<usize> {
    let (free, _) = available_device_memory()?;
    Ok(percent_of(free, percent))
}

/// `percent` of `bytes`, aligned down to 256 (the arithmetic of
/// [`percent_of_free_device_memory`]), without overflow.
#[must_use]
pub fn percent_of(bytes: usize, percent: u32) -> usize {
    let p = u128::from(percent.min(100));
    let v = (bytes as u128 * p / 100) as usize;
    align_down(v, ALLOCATION_ALIGNMENT)
}

/// The name the driver reports for `device` (e.g. `NVIDIA H100 80GB HBM3`).
pub fn device_name(device: DeviceId) -> CudaResult<String> {
    let api = crate::driver::api()?;
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver is initialized; the call writes at most `len` bytes, NUL-terminated.
    check("cuDeviceGetName", unsafe {
        (api.cuDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, device.0)
    })?;
    // SAFETY: the buffer is NUL-terminated by the driver (and zero-initialized).
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// Reads an integer device attribute.
pub(crate) fn device_attribute(
    device: DeviceId,
    attribute: sys::CUdevice_attribute,
) -> CudaResult<i32> {
    let api = crate::driver::api()?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialized; writes one int. An invalid device is reported as an
    // error code.
    check("cuDeviceGetAttribute", unsafe {
        (api.cuDeviceGetAttribute)(&mut v, attribute, device.0)
    })?;
    Ok(v)
}

impl DeviceCapabilities {
    /// Probes `device`.
    pub fn probe(device: DeviceId) -> CudaResult<Self> {
        use sys::CUdevice_attribute as A;
        #[cfg(feature = "testing")]
        if let Some(caps) = crate::fault::pretended_capabilities() {
            return Ok(caps);
        }
        Ok(Self {
            memory_pools_supported: device_attribute(
                device,
                A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            )? != 0,
            supported_handle_types: device_attribute(
                device,
                A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
            )? as u32,
            concurrent_managed_access: device_attribute(
                device,
                A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            )? != 0,
            pageable_memory_access: device_attribute(
                device,
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
            )? != 0,
        })
    }
}

impl PrimaryContextGuard {
    /// Makes the primary context of `device` current until the guard drops.
    ///
    /// # Errors
    /// No driver or an invalid device (nothing changed), or a failed `cuCtxSetCurrent`.
    pub fn enter(device: DeviceId) -> CudaResult<Self> {
        Self::enter_ordinal(device.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AllocationHandleType;

    #[test]
    fn compute_capability_orders_and_prints() {
        let hopper = ComputeCapability { major: 9, minor: 0 };
        let ampere = ComputeCapability { major: 8, minor: 6 };
        assert!(ampere < hopper);
        assert_eq!(hopper.to_string(), "9.0");
        assert_eq!(ampere.to_string(), "8.6");
    }

    #[test]
    fn percent_is_aligned_and_clamped() {
        assert_eq!(percent_of(1000, 50), 256);
        assert_eq!(percent_of(1 << 30, 50), 1 << 29);
        assert_eq!(percent_of(1 << 30, 150), 1 << 30);
        assert_eq!(percent_of(usize::MAX, 100), usize::MAX - 255);
        assert_eq!(percent_of(255, 100), 0);
    }

    #[test]
    fn handle_types_from_bitmask() {
        let caps = DeviceCapabilities {
            memory_pools_supported: true,
            supported_handle_types: 0x9,
            concurrent_managed_access: true,
            pageable_memory_access: false,
        };
        assert!(caps.supports_handle_type(AllocationHandleType::None));
        assert!(caps.supports_handle_type(AllocationHandleType::PosixFileDescriptor));
        assert!(caps.supports_handle_type(AllocationHandleType::Fabric));
        assert!(!caps.supports_handle_type(AllocationHandleType::Win32));
    }

    #[test]
    fn without_a_driver_device_calls_are_errors() {
        let not_found = |e: Option<crate::CudaError>| e == Some(crate::CudaError::DriverNotFound);
        let present = crate::driver::is_driver_present();
        assert_eq!(not_found(device_count().err()), !present);
        assert_eq!(not_found(current_device().err()), !present);
        assert_eq!(not_found(available_device_memory().err()), !present);
        assert_eq!(not_found(DeviceGuard::new(DeviceId(0)).err()), !present);
    }
}
