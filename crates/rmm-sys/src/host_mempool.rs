//! Host-located memory pools of the stream-ordered allocator: `cuMemPoolCreate` with a
//! `CU_MEM_LOCATION_TYPE_HOST` or `..._HOST_NUMA` location (pinned host memory handed out by
//! `cuMemAllocFromPoolAsync`), the device attributes that say whether the driver has them, and
//! `cuMemPoolSetAccess` to let a device use such a pool's memory.
//!
//! The attributes and location types are newer than CUDA 12.0, so they are passed as the
//! integers of `cuda.h` (cudarc's enums list them only in its newer bindings), and the entry
//! points are resolved with `cuGetProcAddress` with integer parameters.

use std::ffi::c_int;
use std::sync::OnceLock;

use crate::context::ensure_current_context;
use crate::device::DeviceId;
use crate::driver::resolve;
use crate::entry::{RawAccessDesc, RawMemLocation, RawPoolProps};
use crate::error::{check, CudaResult};
use crate::mempool::MemPoolHandle;
use crate::raw;
use crate::version::DriverVersion;

/// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED` (CUDA 12.6 bindings).
const ATTR_HOST_NUMA_MEMORY_POOLS_SUPPORTED: c_int = 142;
/// `CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED` (CUDA 12.9/13.0 bindings).
const ATTR_HOST_MEMORY_POOLS_SUPPORTED: c_int = 144;
/// `CU_MEM_LOCATION_TYPE_HOST`.
const LOCATION_HOST: u32 = 2;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
const LOCATION_HOST_NUMA: u32 = 3;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: u32 = 3;

/// Where a host-located pool takes its memory from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostPoolLocation {
    /// Any host memory (`CU_MEM_LOCATION_TYPE_HOST`; the driver's
    /// `CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED`).
    Host,
    /// Memory of one host NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`; the driver's
    /// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED`).
    HostNuma(i32),
}

impl HostPoolLocation {
    fn raw(self) -> RawMemLocation {
        match self {
            Self::Host => RawMemLocation {
                kind: LOCATION_HOST,
                id: 0,
            },
            Self::HostNuma(node) => RawMemLocation {
                kind: LOCATION_HOST_NUMA,
                id: node,
            },
        }
    }

    fn attribute(self) -> c_int {
        match self {
            Self::Host => ATTR_HOST_MEMORY_POOLS_SUPPORTED,
            Self::HostNuma(_) => ATTR_HOST_NUMA_MEMORY_POOLS_SUPPORTED,
        }
    }
}

type GetAttribute = unsafe extern "C" fn(*mut c_int, c_int, raw::CUdevice) -> u32;
type PoolCreate = unsafe extern "C" fn(*mut raw::CUmemoryPool, *const RawPoolProps) -> u32;
type PoolSetAccess = unsafe extern "C" fn(raw::CUmemoryPool, *const RawAccessDesc, usize) -> u32;

/// `cuDeviceGetAttribute` with the attribute as an integer (a value cudarc's bindings may not
/// list).
fn attribute(device: DeviceId, attribute: c_int) -> CudaResult<i32> {
    static F: OnceLock<CudaResult<GetAttribute>> = OnceLock::new();
    let f = F
        .get_or_init(|| {
            // SAFETY: `GetAttribute` is the ABI of `cuDeviceGetAttribute` since CUDA 2.0, the
            // enum parameter being a C `int`.
            unsafe {
                resolve(
                    "cuDeviceGetAttribute",
                    c"cuDeviceGetAttribute",
                    DriverVersion::MINIMUM,
                )
            }
        })
        .clone()?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialized (resolve succeeded); writes one int; an attribute or
    // device the driver does not know is an error code.
    check("cuDeviceGetAttribute", unsafe {
        f(&mut v, attribute, device.0)
    })?;
    Ok(v)
}

/// Whether the driver can create pools at `location` for `device`'s use: the device attribute,
/// `false` where the driver does not know it (older than the attribute).
pub fn host_mem_pools_supported(device: DeviceId, location: HostPoolLocation) -> CudaResult<bool> {
    #[cfg(feature = "testing")]
    if let Some(caps) = crate::fault::pretended_capabilities() {
        if !caps.memory_pools_supported {
            return Ok(false);
        }
    }
    crate::driver::init()?;
    Ok(attribute(device, location.attribute()).is_ok_and(|v| v != 0))
}

/// `cuMemPoolCreate` for a pool of pinned host memory at `location`, then `cuMemPoolSetAccess`
/// so that `device` may read and write it (a host pool is accessible from the host only by
/// default). `max_size` 0: no limit. The caller owns the pool ([`crate::mempool::mem_pool_destroy`]).
pub fn mem_pool_create_host(
    location: HostPoolLocation,
    device: DeviceId,
    max_size: usize,
) -> CudaResult<MemPoolHandle> {
    ensure_current_context()?;
    static CREATE: OnceLock<CudaResult<PoolCreate>> = OnceLock::new();
    static ACCESS: OnceLock<CudaResult<PoolSetAccess>> = OnceLock::new();
    let create = CREATE
        .get_or_init(|| {
            // SAFETY: `PoolCreate` is the ABI of `cuMemPoolCreate` (CUDA 11.2 on).
            unsafe {
                resolve(
                    "cuMemPoolCreate",
                    c"cuMemPoolCreate",
                    DriverVersion::MINIMUM,
                )
            }
        })
        .clone()?;
    let set_access = ACCESS
        .get_or_init(|| {
            // SAFETY: `PoolSetAccess` is the ABI of `cuMemPoolSetAccess` (CUDA 11.2 on).
            unsafe {
                resolve(
                    "cuMemPoolSetAccess",
                    c"cuMemPoolSetAccess",
                    DriverVersion::MINIMUM,
                )
            }
        })
        .clone()?;
    let props = RawPoolProps {
        alloc_type: ALLOCATION_TYPE_PINNED,
        handle_types: 0,
        location: location.raw(),
        win32_security_attributes: std::ptr::null_mut(),
        max_size,
        usage: 0,
        reserved: [0; 54],
    };
    let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `RawPoolProps` has the ABI of `CUmemPoolProps`; the call reads it and writes one
    // handle.
    check("cuMemPoolCreate", unsafe { create(&mut pool, &props) })?;
    let handle = MemPoolHandle::from_raw(pool);
    let desc = RawAccessDesc {
        location: RawMemLocation {
            kind: LOCATION_DEVICE,
            id: device.0,
        },
        flags: ACCESS_READWRITE,
    };
    // SAFETY: the pool was just created; the call reads one descriptor.
    let r = check("cuMemPoolSetAccess", unsafe { set_access(pool, &desc, 1) });
    if let Err(e) = r {
        // SAFETY: the pool was just created, nothing was allocated from it.
        let _ = unsafe { crate::mempool::mem_pool_destroy(handle) };
        return Err(e);
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_have_the_header_values() {
        let h = HostPoolLocation::Host.raw();
        assert_eq!((h.kind, h.id), (2, 0));
        let n = HostPoolLocation::HostNuma(1).raw();
        assert_eq!((n.kind, n.id), (3, 1));
        assert_eq!(HostPoolLocation::Host.attribute(), 144);
        assert_eq!(HostPoolLocation::HostNuma(0).attribute(), 142);
    }

    #[test]
    fn without_a_driver_it_is_an_error_not_a_panic() {
        if crate::driver::is_driver_present() {
            return;
        }
        assert!(host_mem_pools_supported(DeviceId(0), HostPoolLocation::Host).is_err());
        assert!(mem_pool_create_host(HostPoolLocation::Host, DeviceId(0), 0).is_err());
    }
}
